"""Full reductions over 2^28 elements (float32, float16): kaionb vs CuPy and torch in one
process, CUDA-event timed bursts of 10 calls, median of ``--reps`` bursts, ``--rounds``
rounds (CuPy's own time moves by ~2% between rounds: compare within a row).

    source .gpu/prelude.sh && python3 benchmarks/full_reductions.py
"""
import argparse

import numpy as np

import kaionb
from array_api_table import bench_gpu, copy_time

OPS = ("sum", "max", "argmax", "mean")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    import cupy as cp
    import torch

    rng = cp.random.default_rng(0)
    inputs = {dt: rng.standard_normal(1 << 28, dtype=np.float32).astype(dt)
              for dt in (np.float32, np.float16)}
    print(f"copy 2 GiB (1 GiB read + 1 GiB written): {copy_time(2 << 30, args.reps):.1f} µs")
    for rnd in range(args.rounds):
        for dt, x in inputs.items():
            kx, tx = kaionb.asarray(x), torch.as_tensor(x, device="cuda")
            cells = []
            for op in OPS:
                tk = bench_gpu(lambda: getattr(kx, op)(), args.reps)
                tc = bench_gpu(lambda: getattr(x, op)(), args.reps)
                tt = bench_gpu(lambda: getattr(tx, op)(), args.reps)
                cells.append(f"{op} {tk:.1f} (CuPy {tc:.1f}, {tc / tk:.3f}x; torch {tt:.1f}; "
                             f"{x.nbytes / tk / 1e3:.0f} GB/s)")
            print(f"round {rnd}, 2^28 {np.dtype(dt).name}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
