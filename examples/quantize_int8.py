"""Per-row symmetric INT8 quantization of a [4096, 8192] float16 weight, and back:
q and scales checked against float64 NumPy, the round trip's error shown, both timed.

    python examples/quantize_int8.py
"""

import numpy as np

from _primitive_demo import check_and_time, no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.kernels.quantize import (  # noqa: E402
    dequantize_int8,
    dequantize_int8_ref,
    quantize_int8,
    quantize_int8_ref,
)

rng = np.random.default_rng(0)
x = rng.standard_normal((4096, 8192)).astype(np.float16)
dx = kaionb.asarray(x)
q, s = quantize_int8(dx, axis=0)
ref_q, ref_s = quantize_int8_ref(x, axis=0)
off = np.count_nonzero(q.get() != ref_q)
print(f"quantize_int8: {off} of {q.size} values one step from the float64 reference (ties)")
check_and_time("quantize_int8 scales f16 [4096, 8192] axis=0",
               lambda: quantize_int8(dx, axis=0, out=(q, s))[1], ref_s, np.float32,
               x.nbytes + q.size)
out = kaionb.empty(x.shape, x.dtype)
check_and_time("dequantize_int8 -> f16", lambda: dequantize_int8(q, s, 0, np.float16, out=out),
               dequantize_int8_ref(q.get(), s.get(), 0), np.float16, x.nbytes + q.size)
err = np.linalg.norm(out.get().astype(np.float64) - x) / np.linalg.norm(x.astype(np.float64))
print(f"round trip x -> int8 -> f16: relative error {err:.2e}")
