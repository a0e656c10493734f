"""Fused INT8 QKV projection: ``kaionb.qkv_project_int8`` against three ``matmul_int8`` calls
and torch's f16 GEMMs (three, and one over the concatenated weight), same GPU, same run.

    python benchmarks/qkv_int8_table.py [--json out.json]

Shape: Llama-3-8B attention inputs, hidden 4096 -> 4096 + 1024 + 1024 (GQA), f16 x,
per-channel weight scales, f16 outputs; the weights' 25.2 MB of int8 set the floor at
decode sizes (a device-to-device copy of as many bytes is timed too). Columns: "eager" is
back-to-back calls with ``out=`` (host time included, as a decode loop sees it), "graph"
the same call captured 20 times with ``kaionb.graph()`` and replayed (GPU time; torch's
f16 GEMMs are timed eagerly). CUDA events, median of 15 batches after a warm-up.
"""

import argparse
import json

import numpy as np

import kaionb
from matmul_table import bench_ms  # benchmarks/ is on sys.path when run as a script

HIDDEN, WIDTHS = 4096, (4096, 1024, 1024)
MS = (1, 16, 64, 512)
GRAPH_CALLS = 20


def bench_us(torch, fn):
    return bench_ms(torch, fn) * 1e3


def graph_us(torch, fn):
    """GPU µs per call: GRAPH_CALLS calls of ``fn`` captured once, the graph replayed."""
    with kaionb.graph() as g:
        for _ in range(GRAPH_CALLS):
            fn()
    return bench_us(torch, g.replay) / GRAPH_CALLS


def run():
    import torch

    ws = [torch.randint(-128, 128, (n, HIDDEN), dtype=torch.int8, device="cuda") for n in WIDTHS]
    kw = [kaionb.asarray(w).T for w in ws]  # K-major [hidden, N] views
    scales = [kaionb.asarray(np.full(n, 1e-3, np.float32)) for n in WIDTHS]
    wf = [torch.randn(n, HIDDEN, dtype=torch.float16, device="cuda") for n in WIDTHS]
    w_cat = torch.cat(wf)
    nbytes = HIDDEN * sum(WIDTHS)
    src = torch.empty(nbytes, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    copy = bench_us(torch, lambda: dst.copy_(src))
    rows = []
    for m in MS:
        xt = torch.randn(m, HIDDEN, dtype=torch.float16, device="cuda")
        x = kaionb.asarray(xt)
        qx, sx = kaionb.quantize_int8(x, axis=0)
        outs = tuple(kaionb.empty((m, n), np.float16) for n in WIDTHS)

        def fused():
            kaionb.qkv_project_int8(x, *kw, *scales, out=outs)

        def three_int8():
            for w, s, o in zip(kw, scales, outs):
                kaionb.matmul_int8(qx, w, (sx, s), out=o)

        row = dict(m=m, fused_us=bench_us(torch, fused), fused_graph_us=graph_us(torch, fused),
                   three_int8_us=bench_us(torch, three_int8),
                   three_int8_graph_us=graph_us(torch, three_int8),
                   f16_three_us=bench_us(torch, lambda: [xt @ w.T for w in wf]),
                   f16_cat_us=bench_us(torch, lambda: xt @ w_cat.T), copy_us=copy)
        row["weight_gbps_graph"] = nbytes / row["fused_graph_us"] / 1e3
        row["copy_read_gbps"] = nbytes / (copy / 2) / 1e3
        row["f16_three_over_fused"] = row["f16_three_us"] / row["fused_us"]
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return
    rows = run()
    print("| M | qkv eager µs | qkv graph µs | 3× matmul_int8 eager / graph µs | torch f16 3 GEMMs "
          "µs | f16 concat µs | f16 3 / qkv eager | weight GB/s (graph; copy) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['m']} | {r['fused_us']:.1f} | {r['fused_graph_us']:.1f} | "
              f"{r['three_int8_us']:.1f} / {r['three_int8_graph_us']:.1f} | "
              f"{r['f16_three_us']:.1f} | {r['f16_cat_us']:.1f} | "
              f"{r['f16_three_over_fused']:.2f} | {r['weight_gbps_graph']:.0f} "
              f"({r['copy_read_gbps']:.0f}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
