"""Rotary embedding with LLaMA 3.1's frequencies (NeoX pairs) on a [4, 2048, 32, 128]
float16 query: checked against float64 NumPy, then timed; then a decode step in place.

    python examples/rope.py
"""

import numpy as np

from _primitive_demo import check_and_time, no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.kernels.rope import rope, rope_cache, rope_ref  # noqa: E402
from kaionb.testing import assert_close  # noqa: E402

LLAMA31 = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
B, S, H, D = 4, 2048, 32, 128
rng = np.random.default_rng(0)
cos, sin = rope_cache(S, D, base=500000.0, scaling=LLAMA31)  # float32 [S, D/2]
cos_h, sin_h = cos.get(), sin.get()

q = rng.standard_normal((B, S, H, D)).astype(np.float16)
dq = kaionb.asarray(q)
out = kaionb.empty(q.shape, q.dtype)
check_and_time(f"rope f16 [{B}, {S}, {H}, {D}]", lambda: rope(dq, cos, sin, out=out),
               rope_ref(q, cos_h, sin_h), np.float16, 2 * q.nbytes)

# A decode step with a KV cache: one new key per sequence, each at its own position,
# rotated in place.
k = rng.standard_normal((B, 1, 8, D)).astype(np.float16)
dk = kaionb.asarray(k)
positions = np.array([[5], [100], [S - 1], [0]])
rope(dk, cos, sin, positions=positions, out=dk)
err = assert_close(dk, rope_ref(k, cos_h, sin_h, positions), dtype=np.float16)
print(f"decode step, in place at positions {positions.ravel().tolist()}: relative error "
      f"{err:.1e} vs float64 NumPy")
