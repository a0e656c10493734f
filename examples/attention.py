"""Attention as a model calls it: a GQA prefill (32 query heads over 8 K/V heads, causal,
[B, S, H, D] memory passed as transposed views), its row log-sum-exp, and one decode step
against the KV cache — each checked against a float64 reference and timed, beside torch's
scaled_dot_product_attention when torch is installed.

    python examples/attention.py
"""

import statistics
import time

import numpy as np

from _primitive_demo import no_gpu_exit

no_gpu_exit()

import kaionb  # noqa: E402
from kaionb.kernels.attention import attention_ref  # noqa: E402
from kaionb.testing import relative_error  # noqa: E402


def ms(fn, reps=20):
    """Median wall time of one synchronized call, in ms (after one warm-up call)."""
    fn()
    kaionb.current_stream().synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        kaionb.current_stream().synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


rng = np.random.default_rng(0)
B, S, HQ, HKV, D = 2, 2048, 32, 8, 128
bf16 = kaionb.bfloat16
# [B, S, H, D]: the layout of a fused QKV projection's output.
q_bshd = rng.standard_normal((B, S, HQ, D)).astype(bf16)
k_bshd = rng.standard_normal((B, S, HKV, D)).astype(bf16)
v_bshd = rng.standard_normal((B, S, HKV, D)).astype(bf16)
q, k, v = (kaionb.asarray(x).transpose(0, 2, 1, 3) for x in (q_bshd, k_bshd, v_bshd))

out, lse = kaionb.attention(q, k, v, causal=True, return_lse=True)
ref, ref_lse = attention_ref(q.get(), k.get(), v.get(), causal=True)
print(f"prefill B{B} S{S} GQA {HQ}/{HKV} D{D} causal: out {out.shape} {out.dtype}, "
      f"rel. error {relative_error(out.get(), ref):.1e}, lse {relative_error(lse.get(), ref_lse):.1e}")
flops = 4 * B * HQ * S * S * D / 2
t = ms(lambda: kaionb.attention(q, k, v, causal=True))
print(f"  kaionb {t * 1e3:8.1f} µs  {flops / t / 1e9:6.0f} TFLOP/s")

# One decode step: the next token's query against the S cached keys.
q1 = kaionb.asarray(rng.standard_normal((B, HQ, 1, D)).astype(bf16))
out1 = kaionb.attention(q1, k, v)
print(f"decode B{B} 1 × {S} keys: rel. error "
      f"{relative_error(out1.get(), attention_ref(q1.get(), k.get(), v.get())[0]):.1e}")
t1 = ms(lambda: kaionb.attention(q1, k, v))
print(f"  kaionb {t1 * 1e3:8.1f} µs  {2 * B * HKV * S * D * 2 / t1 / 1e6:6.0f} GB/s of K and V")

try:
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa
except ImportError:
    torch = None
if torch is not None:
    tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))
    tt = ms(lambda: sdpa(tq, tk, tv, is_causal=True, enable_gqa=True))
    print(f"  torch SDPA prefill {tt * 1e3:8.1f} µs: kaionb {tt / t:.2f}× its speed")
