"""Decode ``x @ w.T`` (16-bit, M ≤ 16, K-major weight): the weight stream against the
path it replaced and cuBLAS (torch.matmul), same tensors, same run.

    python benchmarks/decode_stream_table.py [--dtypes f16,bf16]

The weight comes from HBM, as in a model's decode step: calls rotate over enough copies
of it to exceed 3× the L2. GPU time: ``REPS`` calls queued behind ``torch.cuda._sleep``
(the host's cost hidden), median of 15 samples. "previous" forces the choice made before
the weight stream (``STREAM_MIN_BLOCKS_PER_SM`` out of reach): the split-K decode tiles, or
the Hopper kernel where its tiles fill the GPU. Ratios are cuBLAS time / ours.
"""

import argparse
import statistics

import numpy as np

import kaionb
from kaionb.kernels import matmul as mm

REPS = 20
SHAPES = ((4096, 4096), (8192, 28672), (4096, 14336))  # (K, N)
L2_COPIES_BYTES = 160_000_000


def gpu_us(torch, fn):
    """Median GPU µs per call of ``fn(i)`` (i: the call's index)."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(15):
        torch.cuda._sleep(3_000_000)
        start.record()
        for i in range(REPS):
            fn(i)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / REPS)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="f16", help="f16, bf16 or both (comma-separated)")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return
    import torch

    for name in args.dtypes.split(","):
        dt = {"f16": torch.float16, "bf16": torch.bfloat16}[name]
        out_dtype = np.float16 if name == "f16" else kaionb.bfloat16
        for kk, n in SHAPES:
            copies = max(2, -(-L2_COPIES_BYTES // (2 * n * kk)))
            wts = [torch.randn(n, kk, dtype=dt, device="cuda") for _ in range(copies)]
            ws = [kaionb.asarray(w).T for w in wts]
            for m in (1, 16):
                xt = torch.randn(m, kk, dtype=dt, device="cuda")
                x = kaionb.asarray(xt)
                out = kaionb.empty((m, n), out_dtype)
                ot = torch.empty(m, n, dtype=dt, device="cuda")
                res = []
                for threshold in (float("inf"), mm.STREAM_MIN_BLOCKS_PER_SM):
                    saved, mm.STREAM_MIN_BLOCKS_PER_SM = mm.STREAM_MIN_BLOCKS_PER_SM, threshold
                    mm._HOPPER_PLANS.clear()  # a cached Hopper plan would skip the choice
                    kaionb._device.STATE.calls = None
                    res.append(gpu_us(torch, lambda i: kaionb.matmul(x, ws[i % copies], out=out)))
                    mm.STREAM_MIN_BLOCKS_PER_SM = saved
                kaionb._device.STATE.calls = None
                t = gpu_us(torch, lambda i: torch.matmul(xt, wts[i % copies].T, out=ot))
                print(f"{name:4s} M={m:2d} K={kk} N={n} (x{copies}): cuBLAS {t:6.1f} us | "
                      f"previous {res[0]:6.1f} ({t / res[0]:.2f}) | stream {res[1]:6.1f} "
                      f"({t / res[1]:.2f}) {2 * n * kk / res[1] / 1e3:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
