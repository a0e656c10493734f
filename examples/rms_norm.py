"""RMSNorm on a [4096, 8192] float16 batch: checked against float64 NumPy, then timed.

    python examples/rms_norm.py
"""

import numpy as np

from _primitive_demo import check_and_time, no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.kernels.norms import rms_norm, rms_norm_ref  # noqa: E402

rng = np.random.default_rng(0)
x = rng.standard_normal((4096, 8192)).astype(np.float16)
w = (1 + 0.1 * rng.standard_normal(8192)).astype(np.float16)
dx, dw = kaionb.asarray(x), kaionb.asarray(w)
out = kaionb.empty(x.shape, x.dtype)
check_and_time("rms_norm f16 [4096, 8192]", lambda: rms_norm(dx, dw, out=out),
               rms_norm_ref(x, w), np.float16, 2 * x.nbytes)
