"""The tape: recording only while active, reverse replay, accumulation for reused inputs,
and gradcheck against finite differences."""

import numpy as np
import pytest

import kaionb
from kaionb import grad
from kaionb.kernels.elementwise import elementwise_fwd


def add(a, b):
    """a + b without the op's own tape rule (these tests record their own)."""
    return elementwise_fwd("add", a, b)
from kaionb.testing import assert_close, random_array, tolerance


def traced_add(a, b):
    """a + b, recorded on the tape: d/da = d/db = the incoming gradient."""
    out = add(a, b)
    grad.record(lambda g: (g, g), (a, b), (out,))
    return out


def test_nothing_is_recorded_without_a_tape():
    assert grad.active_tape() is None
    grad.record(lambda g: (g,), (), ())  # no tape: a no-op
    with grad.Tape() as outer:
        with grad.Tape() as inner:
            assert grad.active_tape() is inner
        assert grad.active_tape() is outer
    assert grad.active_tape() is None


@pytest.mark.gpu
def test_reused_input_accumulates_and_gradcheck_passes():
    rng = np.random.default_rng()
    a = kaionb.asarray(rng.standard_normal((5, 7)).astype(np.float32))
    b = kaionb.asarray(rng.standard_normal((5, 7)).astype(np.float32))
    a.requires_grad = True
    with grad.Tape() as tape:
        y = traced_add(traced_add(a, b), a)  # y = 2a + b
    tape.backward(y)
    np.testing.assert_array_equal(a.grad.get(), np.full((5, 7), 2.0, np.float32))
    assert b.grad is None  # b does not require a gradient
    a.grad = None
    b.requires_grad = True
    assert grad.gradcheck(lambda x, z: traced_add(traced_add(x, z), x), [a, b]) < 2e-2


@pytest.mark.gpu
def test_gradcheck_catches_a_wrong_rule():
    a = kaionb.asarray(np.random.default_rng().standard_normal((4, 4)).astype(np.float32))
    a.requires_grad = True

    def wrong(x):
        out = add(x, x)  # d/dx = 2g, but the rule below says g
        grad.record(lambda g: (g,), (x,), (out,))
        return out

    with pytest.raises(AssertionError, match="gradcheck"):
        grad.gradcheck(wrong, [a])


# -- matmul ------------------------------------------------------------------------------
#
# Gradients are compared as a whole: the norm-wise relative error ‖g − g_ref‖ / ‖g_ref‖
# (kaionb.testing.relative_error) of dA and dB, never element by element — a gradient
# element near zero (cancellation in a dot product) turns a small absolute error into any
# relative one. Tolerance: kaionb.testing.tolerance(dtype) = 2e-3 (f16) / 1.6e-2 (bf16),
# about 4u with u = 2^-11 / 2^-8 the dtype's unit roundoff. Why that bounds the error:
# _matmul_backward rounds dC to the input dtype, as the reference does, and multiplies
# exactly representable operands with float32 accumulation (error ≲ length·2^-24 for a
# contraction of that length: under 1e-5 here), so the float64 product of the same
# operands is the exact answer. Where matmul returns the input dtype (f16 @ f16 → f16),
# each gradient element is rounded once more: ≤ u element-wise, so ≤ u norm-wise. The
# tape keeps gradients as float32 and the comparisons run in float64, so the tests hold
# whatever output dtype matmul returns.

MATMUL_DTYPES = pytest.mark.parametrize("dtype", [np.float16, kaionb.bfloat16],
                                        ids=["f16", "bf16"])


def _matmul_gradients(in_dtype, m, k, n, rng, **options):
    """Fresh A [m, k], B [k, n] of ``in_dtype`` and a float32 dC; the tape's dA and dB of
    C = matmul(A, B, **options), as float64 host arrays."""
    from kaionb.kernels.matmul import matmul

    a_h, b_h = random_array((m, k), in_dtype, rng=rng), random_array((k, n), in_dtype, rng=rng)
    g_h = random_array((m, n), np.float32, rng=rng)
    a, b = kaionb.asarray(a_h), kaionb.asarray(b_h)
    a.requires_grad = b.requires_grad = True
    with grad.Tape() as tape:
        c = matmul(a, b, **options)
    tape.backward(c, kaionb.asarray(g_h))
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float32
    return a_h, b_h, g_h, a.grad.get().astype(np.float64), b.grad.get().astype(np.float64)


@pytest.mark.gpu
@MATMUL_DTYPES
@pytest.mark.parametrize("m, k, n", [(17, 9, 13), (33, 70, 21), (6, 123, 42)])
def test_matmul_backward_is_the_transposed_products(dtype, m, k, n):
    """dA = dC·Bᵀ and dB = Aᵀ·dC against float64 NumPy, dC rounded to the input dtype as
    the backward rounds it."""
    a_h, b_h, g_h, grad_a, grad_b = _matmul_gradients(dtype, m, k, n, np.random.default_rng())
    g = g_h.astype(dtype).astype(np.float64)
    a64, b64 = a_h.astype(np.float64), b_h.astype(np.float64)
    assert_close(grad_a, g @ b64.T, tol=tolerance(dtype), what="dA")
    assert_close(grad_b, a64.T @ g, tol=tolerance(dtype), what="dB")


@pytest.mark.gpu
@MATMUL_DTYPES
def test_matmul_backward_matches_finite_differences(dtype):
    """The tape's rule against the forward kernel itself, by central differences of
    L = Σ dC ∘ matmul(A, B) at 16 random elements of A and of B (norm-wise over them).

    L is linear in each element, so a central difference has no truncation error, and it
    divides by the perturbed points as they are after rounding to the dtype. The forward
    runs with a float32 output, so L carries only float32 rounding (~2^-24 relative to
    |C|): divided by 2h = 0.5 that is ~1e-6 of the gradient. What remains is the tape
    rounding dC to the dtype: ≤ u per element of dC, ≈ u/√3 norm-wise over the probes —
    well inside the same tolerance(dtype) ≈ 4u (an element-wise check is not, see above)."""
    from kaionb.kernels.matmul import matmul

    rng = np.random.default_rng()
    a_h, b_h, g_h, grad_a, grad_b = _matmul_gradients(dtype, 17, 9, 13, rng,
                                                      dtype=np.float32)

    def loss(x, y):
        c = matmul(kaionb.asarray(x), kaionb.asarray(y), dtype=np.float32)
        return float(np.sum(c.get().astype(np.float64) * g_h))

    step = 0.25  # x ± step stays distinct after rounding to bf16 for |x| < 64
    for which, analytic in ((0, grad_a), (1, grad_b)):
        host = (a_h, b_h)[which]
        flats = rng.choice(host.size, size=16, replace=False)
        numeric = np.empty(flats.size)
        for i, flat in enumerate(flats):
            pos = np.unravel_index(flat, host.shape)
            values, points = [], []
            for sign in (1, -1):
                moved = [a_h.copy(), b_h.copy()]
                moved[which][pos] = moved[which][pos] + sign * step  # rounded to the dtype
                points.append(float(moved[which][pos]))
                values.append(loss(*moved))
            numeric[i] = (values[0] - values[1]) / (points[0] - points[1])
        assert_close(analytic.ravel()[flats], numeric, tol=tolerance(dtype),
                     what=f"{'dA' if which == 0 else 'dB'} vs finite differences")
