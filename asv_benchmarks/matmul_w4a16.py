"""asv: INT4 W4A16 matmul (``kaionb.matmul_int4``, GPTQ group 128) and the fused QKV
projection against torch's f16 GEMM (cuBLAS) on weights of the same shape: K = 8192,
N = 28672 for M = 1 .. 4096; Llama-3-8B attention inputs (4096 -> 4096 + 1024 + 1024)."""

import sys
from pathlib import Path

import numpy as np

from .common import batched_ms


def _random_weight(torch, k, n):
    """benchmarks/int4_table.py's packed weight of random words (no host packing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from int4_table import random_weight

    return random_weight(torch, k, n)


class TimeMatmulInt4:
    params = (["1", "16", "64", "128", "4096"],)
    param_names = ["m"]
    timeout = 300
    K, N = 8192, 28672

    def setup(self, m):
        import kaionb

        if not kaionb.gpu_available():
            raise NotImplementedError("no CUDA GPU")
        import torch  # the baselines: only once there is a GPU to run them on

        m = int(m)
        self.torch, self.kaionb = torch, kaionb
        self.w = _random_weight(torch, self.K, self.N)
        self.wf = torch.randn(self.N, self.K, dtype=torch.float16, device="cuda")
        self.x = torch.randn(m, self.K, dtype=torch.float16, device="cuda")
        self.kx = kaionb.asarray(self.x)
        self.out = kaionb.empty((m, self.N), np.float16)
        for _ in range(3):  # compile, load, warm up
            self._ours()
            self._baseline()
        torch.cuda.synchronize()

    def _ours(self):
        return self.kaionb.matmul_int4(self.kx, self.w, out=self.out)

    def _baseline(self):
        return self.x @ self.wf.T

    def time_kaionb(self, m):
        self._ours()
        self.torch.cuda.synchronize()

    def track_weight_gbps(self, m):
        """Packed weight + scale bytes per second."""
        return self.w.nbytes / batched_ms(self._ours) / 1e6

    track_weight_gbps.unit = "GB/s"

    def track_ratio_to_baseline(self, m):
        """torch f16 GEMM time / ours."""
        return batched_ms(self._baseline) / batched_ms(self._ours)

    track_ratio_to_baseline.unit = "ratio"


class TimeQkvProjectInt4:
    params = (["1", "16"],)
    param_names = ["m"]
    timeout = 300
    HIDDEN, WIDTHS = 4096, (4096, 1024, 1024)

    def setup(self, m):
        import kaionb

        if not kaionb.gpu_available():
            raise NotImplementedError("no CUDA GPU")
        import torch  # the baselines: only once there is a GPU to run them on

        m = int(m)
        self.torch, self.kaionb = torch, kaionb
        self.ws = [_random_weight(torch, self.HIDDEN, n) for n in self.WIDTHS]
        self.wf = [torch.randn(n, self.HIDDEN, dtype=torch.float16, device="cuda")
                   for n in self.WIDTHS]
        self.x = torch.randn(m, self.HIDDEN, dtype=torch.float16, device="cuda")
        self.kx = kaionb.asarray(self.x)
        self.outs = tuple(kaionb.empty((m, n), np.float16) for n in self.WIDTHS)
        for _ in range(3):
            self._ours()
            self._baseline()
        torch.cuda.synchronize()

    def _ours(self):
        return self.kaionb.qkv_project_int4(self.kx, *self.ws, out=self.outs)

    def _baseline(self):
        return [self.x @ w.T for w in self.wf]

    def time_kaionb(self, m):
        self._ours()
        self.torch.cuda.synchronize()

    def track_ratio_to_baseline(self, m):
        """torch's three f16 GEMMs time / ours."""
        return batched_ms(self._baseline) / batched_ms(self._ours)

    track_ratio_to_baseline.unit = "ratio"
