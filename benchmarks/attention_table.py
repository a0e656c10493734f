"""Attention forward: kaionb against torch SDPA's FlashAttention-2 and cuDNN backends,
same GPU, same run, same inputs (bf16 unless --dtype f16).

    python benchmarks/attention_table.py [--dtype bf16] [--shapes NAME,...] [--json out.json]

Shapes are the issue's: B4 H16 S4096 D128 (full and causal), B4 H32 S4096 D64,
B16 H16 S1024 D128, GQA 32/8 S4096 D128 causal, and decode B16 Hq32 Hkv8 Sk8192 D128.
FLOPs = 4·B·Hq·Sq·Sk·D, halved for causal (Sq = Sk); decode reports GB/s of K and V
(2·B·Hkv·Sk·D·2 bytes). "mma.sync" is the mma.sync kernel forced where the dispatcher
would pick wgmma (``attention_fwd(prefer_wgmma=False)``). Timing: ``matmul_table.bench_ms``
(CUDA events around batches of calls after a warm-up, median of 15 batches); inputs random
normals. kaionb writes into a preallocated ``out``.
"""

import argparse
import json
import sys

import kaionb
from kaionb.kernels.attention import attention_fwd

from matmul_table import bench_ms

SHAPES = {
    # name: (B, Hq, Hkv, Sq, Sk, D, causal)
    "b4h16s4096d128": (4, 16, 16, 4096, 4096, 128, False),
    "b4h16s4096d128-causal": (4, 16, 16, 4096, 4096, 128, True),
    "b4h32s4096d64": (4, 32, 32, 4096, 4096, 64, False),
    "b16h16s1024d128": (16, 16, 16, 1024, 1024, 128, False),
    "gqa32/8-s4096d128-causal": (4, 32, 8, 4096, 4096, 128, True),
    "decode-b16hq32hkv8-sk8192d128": (16, 32, 8, 1, 8192, 128, False),
}


def sdpa(torch, backend, q, k, v, causal):
    """torch SDPA on one backend; GQA through enable_gqa (K/V not repeated). None when
    the backend refuses the case."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as attn

    gqa = q.shape[1] != k.shape[1]

    def run():
        with sdpa_kernel([backend]):
            return attn(q, k, v, is_causal=causal, enable_gqa=gqa)
    try:
        run()
        torch.cuda.synchronize()
    except RuntimeError as exc:
        return None, str(exc).splitlines()[0][:80]
    return run, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--json")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return 0
    import torch
    from torch.nn.attention import SDPBackend

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    rows = []
    print(f"{'shape':32s} {'kaionb':>16s} {'mma.sync':>16s} {'FA2':>16s} {'cuDNN':>16s} "
          f"{'÷FA2':>6s} {'÷cuDNN':>6s} {'mma÷FA2':>7s}")
    for name in args.shapes.split(","):
        B, Hq, Hkv, Sq, Sk, D, causal = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dtype, generator=gen)
        out = torch.empty_like(q)
        kq, kk, kv, ko = (kaionb.asarray(t) for t in (q, k, v, out))
        decode = Sq <= 16
        work = (2 * B * Hkv * Sk * D * 2) if decode else 4 * B * Hq * Sq * Sk * D * (
            0.5 if causal else 1.0)
        unit = "GB/s" if decode else "TFLOP/s"

        def rate(ms):
            return work / (ms * 1e-3) / (1e9 if decode else 1e12)

        times = {"kaionb": bench_ms(torch, lambda: kaionb.attention(kq, kk, kv, causal=causal,
                                                                     out=ko)),
                 "mma.sync": bench_ms(torch, lambda: attention_fwd(kq, kk, kv, causal,
                                                                   out=ko, prefer_wgmma=False))}
        notes = {}
        for label, backend in (("FA2", SDPBackend.FLASH_ATTENTION),
                               ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            fn, why = sdpa(torch, backend, q, k, v, causal)
            times[label] = bench_ms(torch, fn) if fn else None
            if why:
                notes[label] = why
        cells = [f"{times[x] * 1e3:7.1f}µs {rate(times[x]):6.0f}" if times[x] else f"{'n/a':>16s}"
                 for x in ("kaionb", "mma.sync", "FA2", "cuDNN")]
        ratios = [f"{times[x] / times['kaionb']:6.2f}" if times[x] else "   n/a"
                  for x in ("FA2", "cuDNN")]
        mma_ratio = f"{times['FA2'] / times['mma.sync']:7.2f}" if times["FA2"] else "    n/a"
        print(f"{name:32s} {' '.join(cells)} {ratios[0]} {ratios[1]} {mma_ratio}  ({unit})",
              flush=True)
        rows.append(dict(shape=name, unit=unit, ms=times, rate={x: rate(t) for x, t in
                                                                times.items() if t},
                         notes=notes))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), dtype=args.dtype, rows=rows),
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
