"""Host time per launch of a small kernel: kaionb's launch path against numba's dispatcher
(with numba and with CuPy arrays) and CuPy's RawKernel, all in one run on the same GPU.

    python benchmarks/launch_overhead.py [--launches 10000]

Each row: N back-to-back launches of out[i] = 2 * x[i] on 4096 float32 elements, host
wall time / N (the GPU runs each in ~2 µs, so the host is the limit), median of 7 repeats.
"""

import argparse
import statistics
import time

import numpy as np
from numba import cuda

import kaionb
from kaionb.kernels.launch import KernelDef

N = 4096


def _double_kernel(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2.0 * x[i]


def per_call_us(fn, launches, sync):
    fn()
    sync()
    samples = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / launches * 1e6)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=10_000)
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return
    import cupy as cp

    host = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    grid, block = (N + 255) // 256, 256
    sync = cuda.synchronize

    kdef = KernelDef(_double_kernel, ["void(float32[::1], float32[::1])"],
                     name="_bench_double_kernel")
    compiled = kdef[0]
    kx, kout = kaionb.asarray(host), kaionb.empty(N, np.float32)

    dispatcher = cuda.jit(_double_kernel)
    nx, nout = cuda.to_device(host), cuda.device_array(N, np.float32)
    cx, cout = cp.asarray(host), cp.empty(N, cp.float32)

    raw = cp.RawKernel(r'''
    extern "C" __global__ void double_kernel(const float* x, float* out, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = 2.0f * x[i];
    }''', "double_kernel")
    n32 = np.int32(N)

    rows = [
        ("kaionb compiled kernel (DeviceArray)", lambda: compiled((grid,), (block,), (kx, kout))),
        ("kaionb op end-to-end: x.astype(float16)", lambda: kx.astype(np.float16)),
        ("numba dispatcher, numba arrays", lambda: dispatcher[grid, block](nx, nout)),
        ("numba dispatcher, CuPy arrays", lambda: dispatcher[grid, block](cx, cout)),
        ("CuPy RawKernel", lambda: raw((grid,), (block,), (cx, cout, n32))),
    ]
    results = [(name, per_call_us(fn, args.launches, sync)) for name, fn in rows]
    np.testing.assert_array_equal(kout.get(), 2 * host)
    np.testing.assert_array_equal(cout.get(), 2 * host)
    print(f"\nhost time per launch, {args.launches} launches, median of 7 "
          f"({cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes) else cuda.get_current_device().name})")
    print(f"{'path':45s} {'µs/call':>8s} {'vs RawKernel':>12s}")
    raw_us = results[-1][1]
    for name, us in results:
        print(f"{name:45s} {us:8.2f} {us / raw_us:11.2f}x")


if __name__ == "__main__":
    main()
