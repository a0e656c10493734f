"""asv: DeviceArray arithmetic and reductions against CuPy on the same GPU — time per
call, achieved GB/s (inputs read once, output written once) and the ratio to CuPy's op.
benchmarks/array_api_table.py prints the same cases with a copy's bandwidth beside them."""

import numpy as np

import kaionb

from .common import batched_ms, median_ms, require_gpu

CASES = ["add_f32_2^28", "add_f16_2^28", "add_row_broadcast", "add_transposed",
         "add_transposed_f16", "copy_transposed", "sum_2^28", "max_2^28", "sum_axis0",
         "sum_axis1", "max_axis0", "small_add"]


class ArrayApi:
    params = (CASES,)
    param_names = ["case"]
    timeout = 300

    def setup(self, case):
        require_gpu()
        import cupy as cp

        rng = cp.random.default_rng(0)
        n = 1 << 28
        m = rng.standard_normal((8192, 8192), dtype=np.float32)
        r = rng.standard_normal(8192, dtype=np.float32)
        o = cp.empty_like(m)
        km, kr, ko = kaionb.asarray(m), kaionb.asarray(r), kaionb.asarray(o)
        if case.startswith("add_f"):
            dt = np.float32 if "f32" in case else np.float16
            a = rng.standard_normal(n, dtype=np.float32).astype(dt)
            b, c = a.copy(), cp.empty_like(a)
            ka, kb, kc = kaionb.asarray(a), kaionb.asarray(b), kaionb.asarray(c)
            self.ours = lambda: kaionb.add(ka, kb, out=kc)
            self.theirs = lambda: cp.add(a, b, out=c)
            self.nbytes = 3 * a.nbytes
        elif case == "add_row_broadcast":
            self.ours = lambda: kaionb.add(km, kr, out=ko)
            self.theirs = lambda: cp.add(m, r, out=o)
            self.nbytes = 2 * m.nbytes + r.nbytes
        elif case == "add_transposed":
            self.ours = lambda: kaionb.add(km, km.T, out=ko)
            self.theirs = lambda: cp.add(m, m.T, out=o)
            self.nbytes = 3 * m.nbytes
        elif case == "add_transposed_f16":
            h, ho = m.astype(np.float16), cp.empty(m.shape, np.float16)
            kh, kho = kaionb.asarray(h), kaionb.asarray(ho)
            self.ours = lambda: kaionb.add(kh, kh.T, out=kho)
            self.theirs = lambda: cp.add(h, h.T, out=ho)
            self.nbytes = 3 * h.nbytes
        elif case == "copy_transposed":
            def ours():
                ko[...] = km.T

            def theirs():
                o[...] = m.T

            self.ours, self.theirs = ours, theirs
            self.nbytes = 2 * m.nbytes
        elif case in ("sum_2^28", "max_2^28"):
            big = rng.standard_normal(n, dtype=np.float32)
            kbig = kaionb.asarray(big)
            fn, cfn = (kaionb.sum, cp.sum) if case.startswith("sum") else (kaionb.max, cp.max)
            self.ours, self.theirs = (lambda: fn(kbig)), (lambda: cfn(big))
            self.nbytes = big.nbytes
        elif case[4:].startswith("axis"):
            axis = int(case[-1])
            fn, cfn = (kaionb.sum, cp.sum) if case.startswith("sum") else (kaionb.max, cp.max)
            self.ours = lambda: fn(km, axis=axis)
            self.theirs = lambda: cfn(m, axis=axis)
            self.nbytes = m.nbytes
        else:  # small_add: host-bound, measured back to back
            x = rng.standard_normal((4, 4096), dtype=np.float32)
            y = rng.standard_normal(4096, dtype=np.float32)
            kx, ky = kaionb.asarray(x), kaionb.asarray(y)
            self.ours, self.theirs = (lambda: kx + ky), (lambda: x + y)
            self.nbytes = 2 * x.nbytes + y.nbytes
        # Back-to-back calls for every case: the host's per-call time overlaps the previous
        # call's kernels, so the large cases time the GPU's work and small_add the host's.
        # (not self.timer: asv takes a benchmark's `timer` attribute as its clock)
        self.ms_per_call = batched_ms
        for _ in range(3):
            self.ours()
            self.theirs()
        cp.cuda.runtime.deviceSynchronize()

    def time_kaionb(self, case):
        import cupy as cp

        self.ours()
        cp.cuda.runtime.deviceSynchronize()

    def track_gbps(self, case):
        return self.nbytes / self.ms_per_call(self.ours) / 1e6

    track_gbps.unit = "GB/s"

    def track_speedup_vs_cupy(self, case):
        return self.ms_per_call(self.theirs) / self.ms_per_call(self.ours)

    track_speedup_vs_cupy.unit = "x"


RANDOM_CASES = ["standard_normal_f32", "random_f32", "integers_i64"]
RANDOM_NUMEL = 1 << 27


class Random:
    """kaionb.random's Generator (Philox) against CuPy's Generator, 2^27 values: GB/s of
    the values written and the ratio to CuPy (both write into a given array where CuPy
    takes ``out=``; integers allocates on both sides)."""

    params = (RANDOM_CASES,)
    param_names = ["case"]
    timeout = 300

    def setup(self, case):
        require_gpu()
        import cupy as cp

        ours, theirs = kaionb.random.default_rng(0), cp.random.default_rng(0)
        n = RANDOM_NUMEL
        if case == "integers_i64":
            self.ours = lambda: ours.integers(0, 1000, n, np.int64)
            self.theirs = lambda: theirs.integers(0, 1000, n, dtype=np.int64)
            self.nbytes = 8 * n
        else:
            method = case.rsplit("_", 1)[0]
            o = cp.empty(n, np.float32)
            ko = kaionb.asarray(o)
            self.ours = lambda: getattr(ours, method)(n, np.float32, out=ko)
            self.theirs = lambda: getattr(theirs, method)(n, dtype=np.float32, out=o)
            self.nbytes = 4 * n
        for _ in range(3):
            self.ours()
            self.theirs()
        cp.cuda.runtime.deviceSynchronize()

    def track_gbps(self, case):
        return self.nbytes / median_ms(self.ours) / 1e6

    track_gbps.unit = "GB/s"

    def track_speedup_vs_cupy(self, case):
        return median_ms(self.theirs) / median_ms(self.ours)

    track_speedup_vs_cupy.unit = "x"
