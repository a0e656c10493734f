"""GELU, exact (erf) and tanh forms, on [4096, 8192] float32: checked against float64
NumPy, then timed.

    python examples/gelu.py
"""

import numpy as np

from _primitive_demo import check_and_time, no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.kernels.activations import gelu, gelu_ref  # noqa: E402

rng = np.random.default_rng(0)
x = (3 * rng.standard_normal((4096, 8192))).astype(np.float32)
dx = kaionb.asarray(x)
out = kaionb.empty(x.shape, x.dtype)
for form in ("none", "tanh"):
    check_and_time(f"gelu approximate={form!r} f32 [4096, 8192]",
                   lambda: gelu(dx, form, out=out), gelu_ref(x, form), np.float32, 2 * x.nbytes)
