"""DeviceArray arithmetic and reductions against CuPy and a device-to-device copy, in one
run on one GPU.

    python benchmarks/array_api_table.py [--reps 50]

Bytes counted: every input read once plus the output written once (a broadcast row
once). GPU times: CUDA events around 10 back-to-back calls after a warm-up, median of
--reps bursts, out= preallocated where the library has it (back to back, the host's
per-call time overlaps the previous call's kernels: the rows time the GPU; the column
"1 call" brackets a single call, host time before the launch included). "copy" is cuMemcpyDtoD of the same number of
bytes (read + write), so ``% copy`` is achieved bandwidth over the copy's. The small row
is host wall time per call of 2000 back-to-back allocating calls, then synchronized.
"""

import argparse
import statistics
import time

import numpy as np

import kaionb


def bench_gpu(fn, reps, burst=10):
    """Median µs per call over ``reps`` bursts of ``burst`` back-to-back calls, each burst
    bracketed by CUDA events; ``burst=1`` also counts the host's time before the kernel
    starts."""
    import cupy as cp

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(burst):
            fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / burst)
    return statistics.median(times)


def bench_host(fn, calls=2000):
    import cupy as cp

    fn()
    cp.cuda.runtime.deviceSynchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        cp.cuda.runtime.deviceSynchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def copy_time(nbytes, reps):
    """µs for a device-to-device copy moving ``nbytes`` in total (half read, half written)."""
    import cupy as cp

    src = cp.empty(nbytes // 2, cp.uint8)
    dst = cp.empty_like(src)
    return bench_gpu(lambda: dst.data.copy_from_device_async(src.data, src.nbytes), reps)


def cases():
    """(name, kaionb call, CuPy call, bytes moved)."""
    import cupy as cp

    rng = cp.random.default_rng(0)
    rows = []
    for dt in (np.float32, np.float16):
        n = 1 << 28
        a, b = rng.standard_normal(n, dtype=np.float32).astype(dt), \
            rng.standard_normal(n, dtype=np.float32).astype(dt)
        o = cp.empty_like(a)
        ka, kb, ko = kaionb.asarray(a), kaionb.asarray(b), kaionb.asarray(o)
        rows.append((f"a + b, 2^28 {np.dtype(dt).name}", lambda ka=ka, kb=kb, ko=ko:
                     kaionb.add(ka, kb, out=ko), lambda a=a, b=b, o=o: cp.add(a, b, out=o),
                     3 * a.nbytes))
        # One element in: no operand 16-byte aligned, so kaionb's element-wise flat kernel
        # (the vector kernel's fallback).
        rows.append((f"a + b, 2^28 - 1 {np.dtype(dt).name}, unaligned",
                     lambda ka=ka, kb=kb, ko=ko: kaionb.add(ka[1:], kb[1:], out=ko[1:]),
                     lambda a=a, b=b, o=o: cp.add(a[1:], b[1:], out=o[1:]), 3 * a[1:].nbytes))
    m = rng.standard_normal((8192, 8192), dtype=np.float32)
    r = rng.standard_normal(8192, dtype=np.float32)
    t = rng.standard_normal((8192, 8192), dtype=np.float32)
    o = cp.empty_like(m)
    km, kr, kt, ko = (kaionb.asarray(x) for x in (m, r, t, o))
    rows.append(("[8192,8192] + [8192] f32", lambda: kaionb.add(km, kr, out=ko),
                 lambda: cp.add(m, r, out=o), 2 * m.nbytes + r.nbytes))
    rows.append(("[8192,8192] + transposed f32", lambda: kaionb.add(km, kt.T, out=ko),
                 lambda: cp.add(m, t.T, out=o), 3 * m.nbytes))

    def copy_transposed():
        ko[...] = kt.T

    def cupy_copy_transposed():
        o[...] = t.T

    rows.append(("out[...] = transposed f32", copy_transposed, cupy_copy_transposed,
                 2 * m.nbytes))
    h, ht, ho = (x.astype(np.float16) for x in (m, t, o))
    kh, kht, kho = (kaionb.asarray(x) for x in (h, ht, ho))
    rows.append(("[8192,8192] + transposed f16", lambda: kaionb.add(kh, kht.T, out=kho),
                 lambda: cp.add(h, ht.T, out=ho), 3 * h.nbytes))
    h16 = rng.standard_normal((8192, 8192), dtype=np.float32).astype(np.float16)
    k16 = kaionb.asarray(h16)
    rows.append(("sum [8192,8192] f16 axis 0", lambda: kaionb.sum(k16, axis=0),
                 lambda: cp.sum(h16, axis=0), h16.nbytes))
    if hasattr(kaionb, "sum"):
        big = rng.standard_normal(1 << 28, dtype=np.float32)
        kbig = kaionb.asarray(big)
        for name, fn, cfn in (("sum", kaionb.sum, cp.sum), ("max", kaionb.max, cp.max)):
            rows.append((f"{name} 2^28 f32", lambda fn=fn: fn(kbig), lambda cfn=cfn: cfn(big),
                         big.nbytes))
            for axis in (0, 1):
                rows.append((f"{name} [8192,8192] axis {axis}",
                             lambda fn=fn, axis=axis: fn(km, axis=axis),
                             lambda cfn=cfn, axis=axis: cfn(m, axis=axis), m.nbytes))
    return rows


def small_case():
    import cupy as cp

    a = cp.random.default_rng(0).standard_normal((4, 4096), dtype=np.float32)
    b = cp.random.default_rng(1).standard_normal(4096, dtype=np.float32)
    ka, kb = kaionb.asarray(a), kaionb.asarray(b)
    return bench_host(lambda: ka + kb), bench_host(lambda: a + b)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args(argv)
    import cupy as cp

    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"CuPy {cp.__version__}")
    print("| case | kaionb µs | CuPy µs | kaionb / CuPy speed | kaionb % copy BW "
          "| 1 call: kaionb / CuPy µs |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, kfn, cfn, nbytes in cases():
        tk, tc = bench_gpu(kfn, args.reps), bench_gpu(cfn, args.reps)
        tk1, tc1 = bench_gpu(kfn, args.reps, burst=1), bench_gpu(cfn, args.reps, burst=1)
        tcopy = copy_time(nbytes if "sum" not in name and "max" not in name else 2 * nbytes,
                          args.reps)
        # A reduction reads nbytes: the copy that reads as much moves twice that.
        ref = tcopy / 2 if ("sum" in name or "max" in name) else tcopy
        print(f"| {name} | {tk:.1f} | {tc:.1f} | {tc / tk:.2f} | {100 * ref / tk:.0f}% "
              f"| {tk1:.1f} / {tc1:.1f} |")
    tk, tc = small_case()
    print(f"| [4,4096] + [4096] per call (host) | {tk:.1f} | {tc:.1f} | {tc / tk:.2f} | – |")


if __name__ == "__main__":
    main()
