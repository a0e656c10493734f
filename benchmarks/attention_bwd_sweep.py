"""Attention backward tile sweep: candidate geometries of the dK/dV block and the dQ block
(helpers.attention_bwd) on one shape, each checked against the shipped geometry's
gradients and timed (the whole attention_bwd; one block varied at a time). Candidates
get their own kernel names (make_attention_bwd_kernels), so the kernel cache keeps them
apart.

    python benchmarks/attention_bwd_sweep.py [--shape b4h16s4096d128] [--json out.json]

A dK/dV candidate is (query rows per tile, key warps, warps sharing 16 keys, K/V in
registers) — ``attention.BWD_KEY_TILES``'s form; a dQ candidate (keys per tile, warps).
Results go to docs/perf-log-attention.md.
"""

import argparse
import json
import sys

import numpy as np

import kaionb
from kaionb._device import STATE
from kaionb.kernels import attention as at

from attention_bwd_table import SHAPES
from matmul_table import bench_ms

KEY_CANDIDATES = {128: [(32, 8, 1, False), (16, 4, 1, True), (32, 4, 2, False)],
                  64: [(32, 4, 1, True), (64, 8, 1, True)]}
QUERY_CANDIDATES = {128: [(32, 4), (64, 2)], 64: [(32, 4), (128, 4), (64, 2)]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="b4h16s4096d128")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return 0
    import torch

    B, Hq, Hkv, Sq, Sk, D, causal = SHAPES[args.shape]
    DP = at._head_dim_class(D)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
             for _ in range(2))
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    kq, kk, kv, kdo = (kaionb.asarray(t) for t in (q, k, v, do))
    out, lse = kaionb.attention(kq, kk, kv, causal=causal, return_lse=True)
    flops = 2.5 * 4 * B * Hq * Sq * Sk * D * (0.5 if causal else 1.0)  # backward alone
    shipped = at._BWD_KERNELS[("bf16", DP)]
    reference = [g.get().astype(np.float64) for g in
                 kaionb.attention_bwd(kdo, kq, kk, kv, out, lse, causal=causal)]

    def measure(label, key_tiles, query_tiles):
        at._BWD_KERNELS[("bf16", DP)] = at.make_attention_bwd_kernels("bf16", DP, key_tiles,
                                                                      query_tiles)
        STATE.calls = None  # the fast path replays the kernels of its first call
        try:
            grads = kaionb.attention_bwd(kdo, kq, kk, kv, out, lse, causal=causal)
            err = max(float(np.linalg.norm(g.get().astype(np.float64) - r)
                            / np.linalg.norm(r)) for g, r in zip(grads, reference))
            ms = bench_ms(torch, lambda: kaionb.attention_bwd(kdo, kq, kk, kv, out, lse,
                                                              causal=causal, grads=grads))
        finally:
            at._BWD_KERNELS[("bf16", DP)] = shipped
            STATE.calls = None
        print(f"{label:44s} {ms * 1e3:8.0f} µs {flops / ms / 1e9:6.0f} TFLOP/s  "
              f"vs shipped {err:.1e}", flush=True)
        return dict(label=label, ms=ms, diff=err)

    base_key, base_query = at.BWD_KEY_TILES[DP], at.BWD_QUERY_TILES[DP]
    rows = [measure(f"shipped {base_key} {base_query}", base_key, base_query)]
    for cand in KEY_CANDIDATES.get(DP, []):
        rows.append(measure(f"dK/dV {cand}", cand, base_query))
    for cand in QUERY_CANDIDATES.get(DP, []):
        rows.append(measure(f"dQ {cand}", base_key, cand))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(shape=args.shape, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
