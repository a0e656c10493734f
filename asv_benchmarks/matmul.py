"""asv: tensor-core matmul against cuBLAS (torch.matmul) at the same dtype, f32
accumulation, output in the input dtype: ``kaionb.matmul`` (on an H100 the wgmma kernel
where the shape fills the GPU, else mma.sync) and the mma.sync cp.async kernel on the
same shape, so both paths have a history. The ``_wT`` decode shapes multiply by the
``w.T`` view of a row-major [N, K] weight (a linear layer's), which M ≤ 16 runs on the
weight stream (helpers.weight_stream); M = 64 to 256 at 4096² run the wgmma kernel with
K split in two over a thread-block cluster (matmul_hopper's "split64" / "split" tiles),
for either layout of B."""

import numpy as np

from .common import batched_ms


class TimeMatmul:
    params = (["f16", "bf16"],
              ["1024", "2048", "4096", "8192", "decode1", "decode16", "decode64", "decode128",
               "decode256", "decode1_wT", "decode16_wT", "decode64_wT", "decode128_wT"])
    param_names = ["dtype", "shape"]
    timeout = 300

    SHAPES = {"1024": (1024, 1024, 1024), "2048": (2048, 2048, 2048),
              "4096": (4096, 4096, 4096),
              "8192": (8192, 8192, 8192), "decode1": (1, 4096, 4096),
              "decode16": (16, 4096, 4096), "decode64": (64, 4096, 4096),
              "decode128": (128, 4096, 4096), "decode256": (256, 4096, 4096),
              "decode1_wT": (1, 4096, 4096), "decode16_wT": (16, 4096, 4096),
              "decode64_wT": (64, 4096, 4096), "decode128_wT": (128, 4096, 4096)}

    def setup(self, dtype, shape):
        import kaionb
        from kaionb.kernels import matmul as mm

        if not kaionb.gpu_available():
            raise NotImplementedError("no CUDA GPU")
        import torch  # the baselines: only once there is a GPU to run them on
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        tdt = torch.float16 if dtype == "f16" else torch.bfloat16
        self.out_dtype = np.float16 if dtype == "f16" else kaionb.bfloat16
        m, n, k = self.SHAPES[shape]
        self.flops = 2.0 * m * n * k
        self.torch = torch
        self.a = torch.randn(m, k, device="cuda", dtype=tdt)
        if shape.endswith("_wT"):
            w = torch.randn(n, k, device="cuda", dtype=tdt)
            self.b, self.kb = w.T, kaionb.asarray(w).T
        else:
            self.b = torch.randn(k, n, device="cuda", dtype=tdt)
            self.kb = kaionb.asarray(self.b)
        self.ka = kaionb.asarray(self.a)
        self.mm = mm
        for _ in range(3):  # compile, load, warm up
            self._kaionb()
            self._mma_sync()
            self._cublas()
        torch.cuda.synchronize()

    def _kaionb(self):
        return self.mm.matmul(self.ka, self.kb, dtype=self.out_dtype)

    def _mma_sync(self):
        return self.mm.matmul_fwd("asv", self.ka, self.kb, dtype=self.out_dtype,
                                  prefer_wgmma=False)

    def _cublas(self):
        return self.torch.matmul(self.a, self.b)

    def time_kaionb(self, dtype, shape):
        self._kaionb()
        self.torch.cuda.synchronize()

    def track_tflops(self, dtype, shape):
        return self.flops / batched_ms(self._kaionb) / 1e9

    track_tflops.unit = "TFLOP/s"

    def track_ratio_to_cublas(self, dtype, shape):
        return batched_ms(self._cublas) / batched_ms(self._kaionb)

    track_ratio_to_cublas.unit = "ratio"

    def track_mma_sync_ratio_to_cublas(self, dtype, shape):
        return batched_ms(self._cublas) / batched_ms(self._mma_sync)

    track_mma_sync_ratio_to_cublas.unit = "ratio"
