"""One attention_bwd call at the issue's first shape (B4 H16 S4096 D128 bf16) for a
profiler: ``ncu --kernel-name regex:attention_bwd python benchmarks/attention_bwd_profile.py``
(docs/perf-log-attention.md)."""

import sys

import kaionb
from kaionb.testing import random_array

if __name__ == "__main__":
    if not kaionb.gpu_available():
        print("no CUDA GPU")
        sys.exit(0)
    causal = "--causal" in sys.argv
    q, k, v, do = (kaionb.asarray(random_array((4, 16, 4096, 128), kaionb.bfloat16))
                   for _ in range(4))
    out, lse = kaionb.attention(q, k, v, causal=causal, return_lse=True)
    kaionb.attention_bwd(do, q, k, v, out, lse, causal=causal)
    print(float(abs(kaionb.attention_bwd(do, q, k, v, out, lse)[0].get()).max()))
