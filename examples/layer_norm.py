"""LayerNorm (with bias) on a [4096, 8192] bfloat16 batch: checked against float64 NumPy,
then timed.

    python examples/layer_norm.py
"""

import numpy as np

from _primitive_demo import check_and_time, no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.kernels.norms import layer_norm, layer_norm_ref  # noqa: E402

rng = np.random.default_rng(0)
x = (3 + 2 * rng.standard_normal((4096, 8192))).astype(kaionb.bfloat16)
w = (1 + 0.1 * rng.standard_normal(8192)).astype(kaionb.bfloat16)
b = rng.standard_normal(8192).astype(kaionb.bfloat16)
dx, dw, db = kaionb.asarray(x), kaionb.asarray(w), kaionb.asarray(b)
out = kaionb.empty(x.shape, x.dtype)
check_and_time("layer_norm bf16 [4096, 8192]", lambda: layer_norm(dx, dw, db, out=out),
               layer_norm_ref(x, w, b), kaionb.bfloat16, 2 * x.nbytes)
