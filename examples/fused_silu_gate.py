"""The SwiGLU feed-forward gate silu(x) * gate on [4096, 14336] float16 (LLaMA-3-8B's
hidden width): checked against float64 NumPy, then timed.

    python examples/fused_silu_gate.py
"""

import numpy as np

from _primitive_demo import check_and_time, no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.kernels.activations import fused_silu_gate, fused_silu_gate_ref  # noqa: E402

rng = np.random.default_rng(0)
x = rng.standard_normal((4096, 14336)).astype(np.float16)
g = rng.standard_normal((4096, 14336)).astype(np.float16)
dx, dg = kaionb.asarray(x), kaionb.asarray(g)
out = kaionb.empty(x.shape, x.dtype)
check_and_time("fused_silu_gate f16 [4096, 14336]", lambda: fused_silu_gate(dx, dg, out=out),
               fused_silu_gate_ref(x, g), np.float16, 3 * x.nbytes)
