"""Host cost of one kaionb launch and one small op, against numba's dispatcher."""

import time

import numpy as np
from numba import cuda

from .common import require_gpu

N = 4096
LAUNCHES = 2000


def _double_kernel(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2.0 * x[i]


class LaunchOverhead:
    def setup(self):
        require_gpu()
        import kaionb
        from kaionb.kernels.launch import KernelDef

        host = np.random.default_rng(0).standard_normal(N).astype(np.float32)
        self.compiled = KernelDef(_double_kernel, ["void(float32[::1], float32[::1])"],
                                  name="_asv_double_kernel")[0]
        self.x, self.out = kaionb.asarray(host), kaionb.empty(N)
        self.dispatcher = cuda.jit(_double_kernel)
        self.nx, self.nout = cuda.to_device(host), cuda.device_array(N, np.float32)
        self.sync = cuda.synchronize
        self.time_kaionb_launch()
        self.time_numba_dispatcher_launch()

    def _per_call_us(self, fn):
        t0 = time.perf_counter()
        for _ in range(LAUNCHES):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / LAUNCHES * 1e6

    def time_kaionb_launch(self):
        for _ in range(LAUNCHES):
            self.compiled((16,), (256,), (self.x, self.out))
        self.sync()

    def time_numba_dispatcher_launch(self):
        for _ in range(LAUNCHES):
            self.dispatcher[16, 256](self.nx, self.nout)
        self.sync()

    def track_kaionb_us_per_launch(self):
        return self._per_call_us(lambda: self.compiled((16,), (256,), (self.x, self.out)))

    def track_speedup_over_numba_dispatcher(self):
        ours = self._per_call_us(lambda: self.compiled((16,), (256,), (self.x, self.out)))
        theirs = self._per_call_us(lambda: self.dispatcher[16, 256](self.nx, self.nout))
        return theirs / ours

    track_kaionb_us_per_launch.unit = "us"
    track_speedup_over_numba_dispatcher.unit = "x"
