"""Tensor-core matmul: kaionb against cuBLAS (torch.matmul), same GPU, same run.

    python benchmarks/matmul_table.py [--dtypes f16,bf16,f32,tf32] [--shapes 4096,1x4096x4096]
                                      [--json out.json]

For each shape (256³ … 8192³, and decode shapes M ∈ {1, 16, 128} with K = N = 4096) and
input dtype: TFLOP/s of ``kaionb.matmul`` (the kernel the dispatcher picks: on an H100 the
wgmma kernel where the shape fills the GPU), of that wgmma kernel launched alone (no
validation or allocation: what the host path costs shows as the difference), of the
mma.sync cp.async kernel on the same shape (``matmul_fwd(prefer_wgmma=False)``), and of
torch.matmul (cuBLAS) with f32 accumulation (reduced-precision reductions off); all write
the input dtype. float32 inputs: "f32" is ``precision="highest"`` (tf32x3) against cuBLAS
in full float32, "tf32" is ``precision="tf32"`` against cuBLAS with TF32 allowed.
``--shapes`` times a subset: N for N³ or MxNxK, comma-separated. Timing: CUDA events
around batches of calls after a warm-up, median of the batches; inputs are random normals
(never zeros).
"""

import argparse
import json
import statistics
import sys

import numpy as np

import kaionb
from kaionb._device import compute_capability
from kaionb.kernels import matmul as mm
from kaionb.kernels import matmul_hopper as mh

SHAPES = [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)] + [
    (1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096)]


def bench_ms(torch, fn):
    """Median ms per call: batches sized to ~20 ms, 15 batches after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    batch = int(min(200, max(1, 20.0 / max(start.elapsed_time(stop), 1e-3))))
    samples = []
    for _ in range(15):
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / batch)
    return statistics.median(samples)


def kernel_name(m, n, k, sms, name):
    """What kaionb.matmul launches for this shape on this GPU (aligned operands)."""
    if compute_capability() == (9, 0) and name in ("f16", "bf16"):
        tile = mh.choose_tile(m, n, sms, k)
        if tile is not None:
            return f"wgmma {tile}"
    group = "16bit" if name in ("f16", "bf16") else "tf32"
    tile, splits, _ = mm._choose(m, n, k, sms, mm.TILES[(group, "async")])
    kind = {"f32": "tf32x3 ", "tf32": "tf32 "}.get(name, "")
    return f"mma.sync {kind}{tile}" + (f" split {splits}" if splits > 1 else "")


def run(dtypes, shapes=SHAPES):
    import torch

    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
           "tf32": torch.float32}
    kdt = {"f16": np.float16, "bf16": kaionb.bfloat16, "f32": np.float32, "tf32": np.float32}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name in dtypes:
        for m, n, k in shapes:
            gen = torch.Generator(device="cuda").manual_seed(m + n + k)
            a = torch.randn(m, k, device="cuda", dtype=tdt[name], generator=gen)
            b = torch.randn(k, n, device="cuda", dtype=tdt[name], generator=gen)
            ka, kb = kaionb.asarray(a), kaionb.asarray(b)
            flops = 2.0 * m * n * k
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            precision = "tf32" if name == "tf32" else "highest"
            t_cublas = bench_ms(torch, lambda: torch.matmul(a, b))
            t_kaionb = bench_ms(torch, lambda: mm.matmul(ka, kb, precision=precision))
            t_mma = bench_ms(torch, lambda: mm.matmul_fwd(
                "bench", ka, kb, precision=precision, prefer_wgmma=False))
            kernel = kernel_name(m, n, k, sms, name)
            t_launch = None
            if kernel.startswith("wgmma"):  # the kernel alone: no validation, no allocation
                out = kaionb.empty((m, n), kdt[name])
                sa, lda, a_kmajor = mm._storage("bench", "a", ka, k_axis=1)
                sb, ldb, b_kmajor = mm._storage("bench", "b", kb, k_axis=0)  # row-major: views
                launch = lambda: mh.launch(name, kernel.split()[1], sa, lda, a_kmajor, sb, ldb,
                                           b_kmajor, out, m, n, k, mm._OUT_KIND[out.dtype])
                t_launch = bench_ms(torch, launch)
            row = dict(dtype=name, m=m, n=n, k=k, kernel=kernel,
                       cublas_tflops=flops / t_cublas / 1e9,
                       kaionb_tflops=flops / t_kaionb / 1e9,
                       mma_sync_tflops=flops / t_mma / 1e9,
                       cublas_us=t_cublas * 1e3, kaionb_us=t_kaionb * 1e3,
                       mma_sync_us=t_mma * 1e3,
                       launch_tflops=flops / t_launch / 1e9 if t_launch else None)
            row["ratio"] = row["kaionb_tflops"] / row["cublas_tflops"]
            row["mma_sync_ratio"] = row["mma_sync_tflops"] / row["cublas_tflops"]
            row["launch_ratio"] = (row["launch_tflops"] / row["cublas_tflops"]
                                   if t_launch else None)
            rows.append(row)
            print(f"{name:4} {m:5}x{n:5}x{k:5} {row['kernel']:22} cuBLAS "
                  f"{row['cublas_tflops']:6.1f}  kaionb {row['kaionb_tflops']:6.1f} "
                  f"({row['ratio']:.2f})  mma.sync {row['mma_sync_tflops']:6.1f} "
                  f"({row['mma_sync_ratio']:.2f})  kernel alone "
                  f"{row['launch_ratio'] or 0:.2f}  [{row['kaionb_us']:.1f} vs "
                  f"{row['cublas_us']:.1f} us]", flush=True)
    return rows


def table(rows, gpu):
    lines = [f"GPU: {gpu}. TFLOP/s (ratio to cuBLAS). Output dtype = input dtype.", "",
             "| dtype | M×N×K | kaionb.matmul runs | cuBLAS | kaionb.matmul | "
             "wgmma kernel alone | mma.sync async | µs/call kaionb, cuBLAS |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        alone = (f"{r['launch_tflops']:.1f} ({r['launch_ratio']:.2f})" if r["launch_ratio"]
                 else "–")
        lines.append(f"| {r['dtype']} | {r['m']}×{r['n']}×{r['k']} | {r['kernel']} | "
                     f"{r['cublas_tflops']:.1f} | {r['kaionb_tflops']:.1f} "
                     f"({r['ratio']:.2f}) | {alone} | {r['mma_sync_tflops']:.1f} "
                     f"({r['mma_sync_ratio']:.2f}) | {r['kaionb_us']:.1f}, "
                     f"{r['cublas_us']:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--shapes", help="N (for N³) or MxNxK, comma-separated")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("matmul_table: no CUDA GPU here; nothing to time.")
        return 0
    import torch

    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) * (3 if "x" not in s else 1)
                  for s in args.shapes.split(",")]
    rows = run(args.dtypes.split(","), shapes)
    gpu = torch.cuda.get_device_name(0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=gpu, rows=rows), f, indent=1)
    print(table(rows, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
