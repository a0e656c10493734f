"""Attention tile sweep: candidate block geometries of the mma.sync FlashAttention kernel
(helpers.attention) on the issue's shapes, each checked against torch SDPA (math backend,
float32) and timed beside FlashAttention-2 (torch SDPA flash backend) in the same run.

    python benchmarks/attention_sweep.py [--json out.json]

A candidate is (BN keys per tile, warps, m16 tiles per warp, blocks per SM the key split
aims for). Results go to docs/perf-log-attention.md.
"""

import argparse
import json
import sys

import kaionb
from kaionb.kernels import attention as at

from attention_table import SHAPES, bench_ms, sdpa

CANDIDATES = {
    128: [(64, 4, 1, 2), (64, 8, 1, 2), (32, 4, 1, 2), (32, 8, 1, 2)],
    64: [(64, 4, 1, 2), (64, 4, 2, 2), (128, 4, 1, 2), (64, 8, 1, 2)],
}
DECODE_CANDIDATES = [(64, 1, 1, 8), (64, 1, 1, 16), (32, 1, 1, 8), (32, 1, 1, 16)]
SWEPT = ["b4h16s4096d128", "b4h16s4096d128-causal", "b4h32s4096d64",
         "decode-b16hq32hkv8-sk8192d128"]


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
        for cand in DECODE_CANDIDATES if decode else CANDIDATES[D]:
            BN, warps, mt, per_sm = cand
            key = (D, BN, warps, mt)
            if key not in kernels:
                kernels[key] = at.make_attention_kernel(
                    "bf16", D, BN, warps, mt, f"_attention_sweep_d{D}_bn{BN}_w{warps}_mt{mt}")
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
            print(f"{name:32s} BN{BN:<4d} warps {warps} MT {mt} per-SM {per_sm:<3d} "
                  f"{ms * 1e3:8.1f} µs  FA2 {fa2_ms * 1e3:8.1f} µs  ×FA2 {fa2_ms / ms:5.2f}  "
                  f"err {err:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
