"""The pre-norm residual step of a Llama block, s = x + residual and rms_norm(s), in one
pass on a [4096, 8192] bfloat16 batch (the residual stream updated in place); then its
backward through the tape. Checked against float64 NumPy, then timed.

    python examples/add_rms_norm.py
"""

import numpy as np

from _primitive_demo import check_and_time, no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.array import bfloat16  # noqa: E402
from kaionb.grad import Tape  # noqa: E402
from kaionb.kernels.norms import (  # noqa: E402
    add_rms_norm,
    add_rms_norm_bwd,
    add_rms_norm_bwd_ref,
    add_rms_norm_ref,
)
from kaionb.testing import assert_close  # noqa: E402

rng = np.random.default_rng(0)
shape = (4096, 8192)
x = rng.standard_normal(shape).astype(bfloat16)
r = rng.standard_normal(shape).astype(bfloat16)
w = (1 + 0.1 * rng.standard_normal(shape[-1])).astype(bfloat16)
dx, dr, dw = kaionb.asarray(x), kaionb.asarray(r), kaionb.asarray(w)
normed_ref, s_ref = add_rms_norm_ref(x, r, w)

# Out of place first (checked), then timed in place: s over the residual stream.
normed, s = add_rms_norm(dx, dr, dw)
assert_close(s, s_ref, dtype=bfloat16, what="s")
out, res = kaionb.empty(shape, bfloat16), kaionb.empty(shape, bfloat16)
check_and_time("add_rms_norm bf16 [4096, 8192]",
               lambda: add_rms_norm(dx, dr, dw, out=out, residual_out=res)[0],
               normed_ref, bfloat16, 4 * x.nbytes)  # reads x, residual; writes normed, s
add_rms_norm(dx, dr, dw, residual_out=dr)  # in place, as vLLM's fused_add_rms_norm
assert_close(dr, s_ref, dtype=bfloat16, what="in-place s")

# Backward: gradients of the normed output and of s (bfloat16, as torch's autograd passes
# them); dx = dresidual = ds, dweight in float32.
g = rng.standard_normal(shape).astype(bfloat16)
g_s = rng.standard_normal(shape).astype(bfloat16)
dg, dgs, ds = kaionb.asarray(g), kaionb.asarray(g_s), kaionb.asarray(s.get())
ref_ds, ref_dw = add_rms_norm_bwd_ref(g, g_s, s.get(), w)
check_and_time("add_rms_norm_bwd bf16 [4096, 8192]",
               lambda: add_rms_norm_bwd(dg, dgs, ds, dw)[0], ref_ds, bfloat16,
               4 * x.nbytes)  # reads s, g, g_s; writes ds (dweight: 8192 floats)
assert_close(add_rms_norm_bwd(dg, dgs, ds, dw)[1], ref_dw, dtype=np.float32, tol=5e-5,
             what="dweight")

# The same through the tape: float32 gradients for x, residual and weight.
xs, rs, ws = (kaionb.asarray(a) for a in (x[:64], r[:64], w))
for a in (xs, rs, ws):
    a.requires_grad = True
with Tape() as tape:
    normed, s = add_rms_norm(xs, rs, ws)
tape.backward(normed)  # L = sum(normed)
print("tape: x.grad", xs.grad.dtype, xs.grad.shape, "weight.grad", ws.grad.dtype, ws.grad.shape)
