"""INT8 W8A8 matmul: ``kaionb.matmul_int8`` against cuBLASLt int8 (``torch._int_mm``: int32
output, no scaling) and the f16 GEMM (torch.matmul), same GPU, same run.

    python benchmarks/matmul_w8a8_table.py [--json out.json]

Rows: 2048³, 4096³, 8192³ (per-tensor float scale, f32 output: the scaling is inside our
time, not torch's) and decode K = 8192, N = 28672 at M = 1, 16, 32, 64 (per-token and
per-channel scales, f16 output), where the weight's N·K bytes set the floor: a
device-to-device copy of as many bytes is timed too (read + write, so its read rate is an
upper bound for a kernel that only reads). ``torch._int_mm`` needs M > 16. Timing: CUDA
events around batches of back-to-back calls after a warm-up, median of 15 batches.
"""

import argparse
import json

import numpy as np

import kaionb
from matmul_table import bench_ms  # benchmarks/ is on sys.path when run as a script

BIG = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)]
DECODE_N, DECODE_K = 28672, 8192
DECODE_MS = (1, 16, 32, 64)


def bench_us(torch, fn):
    """Median µs per call (matmul_table's batches of back-to-back calls)."""
    return bench_ms(torch, fn) * 1e3


def int8(torch, *shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8, device="cuda")


def run():
    import torch

    rows = []
    for m, n, k in BIG:
        a, w = int8(torch, m, k), int8(torch, n, k)
        ka, kw = kaionb.asarray(a), kaionb.asarray(w)
        out = kaionb.empty((m, n), np.float32)
        ours = bench_us(torch, lambda: kaionb.matmul_int8(ka, kw.T, 0.5, out=out))
        int_mm = bench_us(torch, lambda: torch._int_mm(a, w.T))
        ops = 2.0 * m * n * k
        rows.append(dict(shape=f"{m}x{n}x{k}", kaionb_us=ours, int_mm_us=int_mm,
                         kaionb_tops=ops / ours / 1e6, int_mm_tops=ops / int_mm / 1e6,
                         ratio=int_mm / ours))
    n, k = DECODE_N, DECODE_K
    w = int8(torch, n, k)
    kw = kaionb.asarray(w)
    src = torch.empty(n * k, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    copy = bench_us(torch, lambda: dst.copy_(src))
    for m in DECODE_MS:
        a = int8(torch, m, k)
        ka = kaionb.asarray(a)
        sa = kaionb.asarray(np.full(m, 1e-3, np.float32))
        sb = kaionb.asarray(np.full(n, 1e-3, np.float32))
        out = kaionb.empty((m, n), np.float16)
        ours = bench_us(torch, lambda: kaionb.matmul_int8(ka, kw.T, (sa, sb), out=out))
        x = torch.randn(m, k, dtype=torch.float16, device="cuda")
        wf = torch.randn(n, k, dtype=torch.float16, device="cuda")
        f16 = bench_us(torch, lambda: x @ wf.T)
        int_mm = bench_us(torch, lambda: torch._int_mm(a, w.T)) if m > 16 else None
        rows.append(dict(shape=f"{m}x{n}x{k}", kaionb_us=ours, f16_us=f16, int_mm_us=int_mm,
                         copy_us=copy, weight_gbps=n * k / ours / 1e3,
                         copy_read_gbps=n * k / (copy / 2) / 1e3, ratio_f16=f16 / ours,
                         ratio=None if int_mm is None else int_mm / ours))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return
    rows = run()
    print("| shape M×N×K | kaionb µs | int_mm µs | f16 µs | ratio int_mm/ours | TOPS or GB/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        rate = (f"{r['kaionb_tops']:.0f} TOPS (int_mm {r['int_mm_tops']:.0f})"
                if "kaionb_tops" in r else
                f"{r['weight_gbps']:.0f} GB/s (copy {r['copy_read_gbps']:.0f})")
        int_mm = "–" if r["int_mm_us"] is None else f"{r['int_mm_us']:.1f}"
        f16 = f"{r['f16_us']:.1f}" if "f16_us" in r else "–"
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"| {r['shape']} | {r['kaionb_us']:.1f} | {int_mm} | {f16} | {ratio} | {rate} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
