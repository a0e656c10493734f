"""asv: INT8 W8A8 matmul (``kaionb.matmul_int8``, scaling included) against cuBLASLt int8
(``torch._int_mm``, int32 output, no scaling) at square shapes, and against the f16 GEMM
at decode shapes (K = 8192, N = 28672; ``torch._int_mm`` needs M > 16)."""

import numpy as np

from .common import batched_ms


class TimeMatmulInt8:
    params = (["2048", "4096", "8192", "decode1", "decode16", "decode32"],)
    param_names = ["shape"]
    timeout = 300

    SHAPES = {"2048": (2048, 2048, 2048), "4096": (4096, 4096, 4096),
              "8192": (8192, 8192, 8192), "decode1": (1, 28672, 8192),
              "decode16": (16, 28672, 8192), "decode32": (32, 28672, 8192)}

    def setup(self, shape):
        import kaionb

        if not kaionb.gpu_available():
            raise NotImplementedError("no CUDA GPU")
        import torch  # the baselines: only once there is a GPU to run them on

        m, n, k = self.SHAPES[shape]
        self.torch, self.m = torch, m
        self.ops = 2.0 * m * n * k
        self.a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
        self.w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
        self.x = torch.randn(m, k, dtype=torch.float16, device="cuda")
        self.wf = torch.randn(n, k, dtype=torch.float16, device="cuda")
        self.ka, self.kw = kaionb.asarray(self.a), kaionb.asarray(self.w)
        self.scale = (kaionb.asarray(np.full(m, 1e-3, np.float32)),
                      kaionb.asarray(np.full(n, 1e-3, np.float32)))
        self.out = kaionb.empty((m, n), np.float16)
        self.kaionb = kaionb
        for _ in range(3):  # compile, load, warm up
            self._ours()
            self._baseline()
        torch.cuda.synchronize()

    def _ours(self):
        return self.kaionb.matmul_int8(self.ka, self.kw.T, self.scale, out=self.out)

    def _baseline(self):
        if self.m > 16:
            return self.torch._int_mm(self.a, self.w.T)
        return self.x @ self.wf.T

    def time_kaionb(self, shape):
        self._ours()
        self.torch.cuda.synchronize()

    def track_tops(self, shape):
        return self.ops / batched_ms(self._ours) / 1e9

    track_tops.unit = "TOPS"

    def track_ratio_to_baseline(self, shape):
        """torch._int_mm (M > 16) or the f16 GEMM (M ≤ 16) time / ours."""
        return batched_ms(self._baseline) / batched_ms(self._ours)

    track_ratio_to_baseline.unit = "ratio"


class TimeQkvProjectInt8:
    """``kaionb.qkv_project_int8`` (f16 x quantized per token, Llama-3-8B attention inputs:
    hidden 4096 -> 4096 + 1024 + 1024) against torch's three f16 GEMMs, M = 1 and 16."""

    params = (["1", "16"],)
    param_names = ["m"]
    timeout = 300
    WIDTHS = (4096, 1024, 1024)

    def setup(self, m):
        import kaionb

        if not kaionb.gpu_available():
            raise NotImplementedError("no CUDA GPU")
        import torch  # the baselines: only once there is a GPU to run them on

        m = int(m)
        self.torch, self.kaionb = torch, kaionb
        self.x = torch.randn(m, 4096, dtype=torch.float16, device="cuda")
        self.kx = kaionb.asarray(self.x)
        self.wf = [torch.randn(n, 4096, dtype=torch.float16, device="cuda") for n in self.WIDTHS]
        self.kw = [kaionb.asarray(torch.randint(-128, 128, (n, 4096), dtype=torch.int8,
                                                device="cuda")).T for n in self.WIDTHS]
        self.scales = [kaionb.asarray(np.full(n, 1e-3, np.float32)) for n in self.WIDTHS]
        self.out = tuple(kaionb.empty((m, n), np.float16) for n in self.WIDTHS)
        for _ in range(3):
            self._ours()
            self._baseline()
        torch.cuda.synchronize()

    def _ours(self):
        return self.kaionb.qkv_project_int8(self.kx, *self.kw, *self.scales, out=self.out)

    def _baseline(self):
        return [self.x @ w.T for w in self.wf]

    def time_kaionb(self, m):
        self._ours()
        self.torch.cuda.synchronize()

    def track_ratio_to_baseline(self, m):
        """Three f16 GEMMs' time / ours (eager calls, host time included)."""
        return batched_ms(self._baseline) / batched_ms(self._ours)

    track_ratio_to_baseline.unit = "ratio"
