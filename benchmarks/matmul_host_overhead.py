"""Where a small matmul's time goes: host time per ``kaionb.matmul`` call against the GPU
time of the same calls, and a cProfile of the host side.

    python benchmarks/matmul_host_overhead.py [M N K]

Decode shapes (M = 1, K = N = 4096) run ~10 µs on the GPU: if the host needs longer per
call, the call path, not the kernel, sets the speed.
"""

import cProfile
import pstats
import sys
import time

import numpy as np

import kaionb
from kaionb.kernels import matmul as mm


def main(m=1, n=4096, k=4096, calls=300):
    if not kaionb.gpu_available():
        print("matmul_host_overhead: no CUDA GPU here; nothing to time.")
        return 0
    import torch

    a = kaionb.asarray(np.random.default_rng(0).standard_normal((m, k)).astype(np.float16))
    b = kaionb.asarray(np.random.default_rng(1).standard_normal((k, n)).astype(np.float16))
    call = lambda: mm.matmul(a, b, dtype=np.float16)
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        call()
    stop.record()
    host_us = (time.perf_counter() - t0) / calls * 1e6
    stop.synchronize()
    gpu_us = start.elapsed_time(stop) / calls * 1e3
    print(f"{m}x{n}x{k}: host {host_us:.1f} us/call to enqueue, GPU {gpu_us:.1f} us/call "
          f"(back to back); tile/splits {mm._choose(m, n, k, 132, mm.TILES[('16bit', 'async')])[:2]}")
    profile = cProfile.Profile()
    profile.runcall(lambda: [call() for _ in range(calls)])
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    sys.exit(main(*[int(x) for x in sys.argv[1:4]]))
