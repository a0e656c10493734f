"""Attention forward + backward: kaionb (deterministic) against torch SDPA's
FlashAttention-2 and cuDNN backends, same GPU, same run, same inputs (bf16 unless
--dtype f16).

    python benchmarks/attention_bwd_table.py [--dtype bf16] [--shapes NAME,...] [--json out.json]

Shapes are the issue's: B4 H16 S4096 D128 (full and causal), B4 H32 S4096 D64,
B16 H16 S1024 D128. FLOPs of forward + backward are counted as 3.5× the forward's
4·B·Hq·Sq·Sk·D (halved for causal), the issue's convention. kaionb's call: attention with
the lse into a preallocated out, then attention_bwd into preallocated gradients; torch's:
SDPA on one backend and ``torch.autograd.grad`` for dq, dk, dv. "bwd" columns time the
backward alone (kaionb: attention_bwd; torch: the autograd call on a saved graph is not
repeatable, so backward = (fwd+bwd) − fwd). Timing: ``matmul_table.bench_ms``.
"""

import argparse
import json
import sys

import kaionb
from attention_table import SHAPES as FORWARD_SHAPES
from attention_table import sdpa
from matmul_table import bench_ms

# The forward table's prefill shapes (B, Hq, Hkv, Sq, Sk, D, causal).
SHAPES = {name: FORWARD_SHAPES[name] for name in
          ("b4h16s4096d128", "b4h16s4096d128-causal", "b4h32s4096d64", "b16h16s1024d128")}
FWD_BWD_FACTOR = 3.5


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
    print(f"{'shape':24s} {'kaionb fwd+bwd':>17s} {'FA2':>17s} {'cuDNN':>17s} {'÷FA2':>6s} "
          f"{'÷cuDNN':>6s}   bwd µs: kaionb / FA2 / cuDNN")
    for name in args.shapes.split(","):
        B, Hq, Hkv, Sq, Sk, D, causal = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dtype, generator=gen)
        dout = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dtype, generator=gen)
        out = torch.empty_like(q)
        grads = tuple(torch.empty_like(x) for x in (q, k, v))
        kq, kk, kv, kdo, ko = (kaionb.asarray(t) for t in (q, k, v, dout, out))
        kgrads = tuple(kaionb.asarray(g) for g in grads)
        flops = FWD_BWD_FACTOR * 4 * B * Hq * Sq * Sk * D * (0.5 if causal else 1.0)

        def kaionb_fwd_bwd():
            o, l_ = kaionb.attention(kq, kk, kv, causal=causal, return_lse=True, out=ko)
            kaionb.attention_bwd(kdo, kq, kk, kv, o, l_, causal=causal, grads=kgrads)

        o_saved, lse_saved = kaionb.attention(kq, kk, kv, causal=causal, return_lse=True)
        times = {"kaionb": bench_ms(torch, kaionb_fwd_bwd)}
        bwd = {"kaionb": bench_ms(torch, lambda: kaionb.attention_bwd(
            kdo, kq, kk, kv, o_saved, lse_saved, causal=causal, grads=kgrads))}
        notes = {}
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        for label, backend in (("FA2", SDPBackend.FLASH_ATTENTION),
                               ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            fn, why = sdpa(torch, backend, qg, kg, vg, causal)
            if fn is None:
                times[label] = bwd[label] = None
                notes[label] = why
                continue

            def fwd_bwd(fn=fn):
                torch.autograd.grad(fn(), (qg, kg, vg), dout)

            times[label] = bench_ms(torch, fwd_bwd)
            with torch.no_grad():
                fwd_ms = bench_ms(torch, fn)
            bwd[label] = times[label] - fwd_ms
        cells = [f"{times[x] * 1e3:8.0f}µs {flops / (times[x] * 1e-3) / 1e12:5.0f}"
                 if times[x] else f"{'n/a':>17s}" for x in ("kaionb", "FA2", "cuDNN")]
        ratios = [f"{times[x] / times['kaionb']:6.2f}" if times[x] else "   n/a"
                  for x in ("FA2", "cuDNN")]
        bwds = " / ".join(f"{bwd[x] * 1e3:.0f}" if bwd[x] else "n/a"
                          for x in ("kaionb", "FA2", "cuDNN"))
        print(f"{name:24s} {' '.join(cells)} {ratios[0]} {ratios[1]}   {bwds}  (TFLOP/s)",
              flush=True)
        rows.append(dict(shape=name, ms=times, bwd_ms=bwd, notes=notes,
                         tflops={x: flops / (t * 1e-3) / 1e12 for x, t in times.items() if t}))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), dtype=args.dtype, rows=rows),
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
