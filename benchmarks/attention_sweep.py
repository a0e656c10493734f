"""Attention tile sweep: candidate block geometries of the mma.sync FlashAttention kernel
(helpers.attention) on the issue's shapes, each checked against torch SDPA (math backend,
float32) and timed beside FlashAttention-2 (torch SDPA flash backend) in the same run.

    python benchmarks/attention_sweep.py [--json out.json]

A candidate is ("mma", BN keys per tile, warps) for the mma.sync
block or ("wgmma", BN, stages of K and V, consumer warpgroups) for the Hopper block.
Results go to docs/perf-log-attention.md.
"""

import argparse
import json
import sys

import kaionb
from kaionb.kernels import attention as at

from attention_table import SHAPES, bench_ms, sdpa

CANDIDATES = {
    128: [("mma", 64, 4), ("wgmma", 128, 2, 2)],
    64: [("mma", 128, 4), ("wgmma", 128, 2, 1)],
}
DECODE_CANDIDATES = [("mma", 64, 1)]
SWEPT = ["b4h16s4096d128", "b4h16s4096d128-causal", "b4h32s4096d64", "b16h16s1024d128",
         "gqa32/8-s4096d128-causal", "decode-b16hq32hkv8-sk8192d128"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return 0
    import torch
    from torch.nn.attention import SDPBackend

    rows = []
    kernels = {}
    for name in SWEPT:
        B, Hq, Hkv, Sq, Sk, D, causal = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        out = torch.empty_like(q)
        kq, kk, kv, ko = (kaionb.asarray(t) for t in (q, k, v, out))
        fa2, _ = sdpa(torch, SDPBackend.FLASH_ATTENTION, q, k, v, causal)
        fa2_ms = bench_ms(torch, fa2)
        ref = fa2().float()
        decode = Sq <= 16
        per_sm = at.TARGET_BLOCKS_PER_SM["decode" if decode else "prefill"]
        for cand in DECODE_CANDIDATES if decode else CANDIDATES[D]:
            key = (D,) + cand
            if key not in kernels:
                blk = (at.attention_block("bf16", D, *cand[1:]) if cand[0] == "mma" else
                       at.wgmma_attention_block("bf16", D, *cand[1:]))
                kernels[key] = at.make_attention_kernel(
                    blk, "_attention_sweep_" + "_".join(map(str, key)))
            kdef = kernels[key]
            scale = D ** -0.5

            def call():
                at.launch_attention(kdef, per_sm, kq, kk, kv, causal, scale, ko)
            call()
            err = float((out.float() - ref).norm() / ref.norm())
            ms = bench_ms(torch, call)
            row = dict(shape=name, candidate=cand, ms=ms, fa2_ms=fa2_ms, ratio=fa2_ms / ms,
                       rel_err_vs_fa2=err, smem=kdef.block.SHARED_BYTES)
            rows.append(row)
            print(f"{name:32s} {str(cand):22s} "
                  f"{ms * 1e3:8.1f} µs  FA2 {fa2_ms * 1e3:8.1f} µs  ×FA2 {fa2_ms / ms:5.2f}  "
                  f"err {err:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
