"""Softmax over rows of a [4096, 8192] float16 batch (attention-score sized): checked
against float64 NumPy, then timed. An all −inf row comes out NaN, as in PyTorch.

    python examples/softmax.py
"""

import numpy as np

from _primitive_demo import check_and_time, no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.kernels.softmax import softmax, softmax_ref  # noqa: E402

rng = np.random.default_rng(0)
x = (4 * rng.standard_normal((4096, 8192))).astype(np.float16)
dx = kaionb.asarray(x)
out = kaionb.empty(x.shape, x.dtype)
check_and_time("softmax f16 [4096, 8192]", lambda: softmax(dx, out=out), softmax_ref(x),
               np.float16, 2 * x.nbytes)
