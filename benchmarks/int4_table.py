"""W4A16 INT4 matmul: ``kaionb.matmul_int4`` and ``qkv_project_int4`` against torch's f16
GEMMs (cuBLAS) on the same dequantized-size weights, same GPU, same run.

    python benchmarks/int4_table.py [--json out.json] [--sweep]

Shapes: K = 8192, N = 28672 (a Llama-70B-sized MLP projection) for M = 1 .. 4096, group
size 128, symmetric; the QKV projection of Llama-3-8B (hidden 4096 -> 4096 + 1024 +
1024). The packed weights are random words (the speed does not depend on the values).
Columns: "eager" back-to-back calls with ``out=`` (host time included), "graph" 20 calls
captured with ``kaionb.graph()`` and replayed (GPU time); torch eagerly. Bandwidth: the
packed weight + scale bytes over the graph time. CUDA events, median of batches after a
warm-up. ``--sweep`` also times the streaming grid's TARGET_BLOCKS_PER_SM choices and
the streaming kernel against dequantize + dense matmul around STREAM_MAX_M.
"""

import argparse
import json

import numpy as np

import kaionb
from kaionb._device import STATE
from kaionb.kernels import matmul_int4 as mi
from qkv_int8_table import bench_us, graph_us  # benchmarks/ is on sys.path as a script

K, N = 8192, 28672
MS = (1, 16, 64, 128, 4096)
HIDDEN, WIDTHS = 4096, (4096, 1024, 1024)
QKV_MS = (1, 16)
GROUP = 128


def random_weight(torch, k, n, group_size=GROUP):
    """An Int4Weight of random packed words and f16 scales near 0.01 (no host packing)."""
    words = torch.randint(-2**31, 2**31 - 1, (n // 16, k // 64 * 128), dtype=torch.int32,
                          device="cuda")
    scale_bits = int(np.float16(0.01).view(np.uint16))
    scales = torch.full((k // group_size, n // 2), scale_bits | (scale_bits << 16),
                        dtype=torch.int64, device="cuda").to(torch.int32)
    return mi.Int4Weight(_as_u32(words), _as_u32(scales), None, None, (k, n), group_size)


def _as_u32(t):
    a = kaionb.asarray(t)
    return a._view(a.shape, a.strides, dtype=np.dtype(np.uint32))


def _fresh():
    STATE.calls = None  # the fast path's replays keep the plan of the first call


def run(sweep: bool):
    import torch

    w = random_weight(torch, K, N)
    w16 = torch.randn(N, K, dtype=torch.float16, device="cuda")
    rows = []
    for m in MS:
        xt = torch.randn(m, K, dtype=torch.float16, device="cuda")
        x = kaionb.asarray(xt)
        out = kaionb.empty((m, N), np.float16)
        ot = torch.empty(m, N, dtype=torch.float16, device="cuda")

        def int4():
            kaionb.matmul_int4(x, w, out=out)

        row = dict(m=m, int4_us=bench_us(torch, int4),
                   f16_us=bench_us(torch, lambda: torch.matmul(xt, w16.T, out=ot)))
        if m <= mi.STREAM_MAX_M:
            row["int4_graph_us"] = graph_us(torch, int4)
        best = row.get("int4_graph_us", row["int4_us"])
        row["speedup_vs_f16"] = row["f16_us"] / best
        row["weight_gbps"] = w.nbytes / best / 1e3
        if sweep and m <= 128:
            saved_target = dict(mi.TARGET_BLOCKS_PER_SM)
            for target in (0.5, 1.0, 2.0, 4.0):
                mi.TARGET_BLOCKS_PER_SM.update({mt: target for mt in saved_target})
                _fresh()
                row[f"graph_us_target_{target}"] = graph_us(torch, int4)
            mi.TARGET_BLOCKS_PER_SM.update(saved_target)
            saved, mi.STREAM_MAX_M = mi.STREAM_MAX_M, 0
            _fresh()
            row["dequant_dense_us"] = bench_us(torch, int4)
            mi.STREAM_MAX_M = saved
            _fresh()
        rows.append(row)

    ws = [random_weight(torch, HIDDEN, n) for n in WIDTHS]
    wf = [torch.randn(n, HIDDEN, dtype=torch.float16, device="cuda") for n in WIDTHS]
    nbytes = sum(x.nbytes for x in ws)
    for m in QKV_MS:
        xt = torch.randn(m, HIDDEN, dtype=torch.float16, device="cuda")
        x = kaionb.asarray(xt)
        outs = tuple(kaionb.empty((m, n), np.float16) for n in WIDTHS)

        def qkv():
            kaionb.qkv_project_int4(x, *ws, out=outs)

        row = dict(qkv_m=m, qkv_us=bench_us(torch, qkv), qkv_graph_us=graph_us(torch, qkv),
                   f16_three_us=bench_us(torch, lambda: [xt @ t.T for t in wf]))
        row["weight_gbps"] = nbytes / row["qkv_graph_us"] / 1e3
        if sweep:
            saved_target = dict(mi.TARGET_BLOCKS_PER_SM)
            for target in (0.5, 1.0, 2.0, 4.0):
                mi.TARGET_BLOCKS_PER_SM.update({mt: target for mt in saved_target})
                _fresh()
                row[f"graph_us_target_{target}"] = graph_us(torch, qkv)
            mi.TARGET_BLOCKS_PER_SM.update(saved_target)
            _fresh()
        rows.append(row)
    src = torch.empty(w.nbytes, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    rows.append(dict(copy_us=bench_us(torch, lambda: dst.copy_(src)), copy_bytes=w.nbytes))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--sweep", action="store_true", help="grid and path sweeps")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return
    rows = run(args.sweep)
    copy = rows[-1]
    print(f"device-to-device copy of the packed weight ({copy['copy_bytes'] / 1e6:.0f} MB): "
          f"{copy['copy_us']:.1f} µs ({2 * copy['copy_bytes'] / copy['copy_us'] / 1e3:.0f} GB/s "
          "read + write)")
    print(f"| M (K={K}, N={N}) | int4 eager µs | int4 graph µs | torch f16 µs | f16 / int4 | "
          "weight GB/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "m" in r:
            print(f"| {r['m']} | {r['int4_us']:.1f} | {r.get('int4_graph_us', float('nan')):.1f} "
                  f"| {r['f16_us']:.1f} | {r['speedup_vs_f16']:.2f} | {r['weight_gbps']:.0f} |")
    print("| QKV M | eager µs | graph µs | torch f16 3 GEMMs µs | weight GB/s |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        if "qkv_m" in r:
            print(f"| {r['qkv_m']} | {r['qkv_us']:.1f} | {r['qkv_graph_us']:.1f} | "
                  f"{r['f16_three_us']:.1f} | {r['weight_gbps']:.0f} |")
    if args.sweep:
        for r in rows:
            extra = {k: round(v, 1) for k, v in r.items() if "target" in k or "dequant" in k}
            if extra:
                print(r.get("m", r.get("qkv_m")), extra)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
