"""The tape: recording only while active, reverse replay, accumulation for reused inputs,
and gradcheck against finite differences."""

import numpy as np
import pytest

import kaionb
from kaionb import grad
from kaionb.kernels.elementwise import add


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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, kaionb.bfloat16], ids=["f16", "bf16"])
def test_matmul_backward_matches_finite_differences(dtype):
    from kaionb.kernels.matmul import matmul

    rng = np.random.default_rng()
    a = kaionb.asarray(rng.standard_normal((17, 9)).astype(dtype))
    b = kaionb.asarray(rng.standard_normal((9, 13)).astype(dtype))
    a.requires_grad = b.requires_grad = True
    assert grad.gradcheck(matmul, [a, b], eps=5e-2, rtol=3e-2, rng=rng) < 3e-2


@pytest.mark.gpu
def test_matmul_backward_is_the_transposed_products():
    rng = np.random.default_rng()
    a_h = rng.standard_normal((33, 70)).astype(np.float16)
    b_h = rng.standard_normal((70, 21)).astype(np.float16)
    g_h = rng.standard_normal((33, 21)).astype(np.float32)
    a, b = kaionb.asarray(a_h), kaionb.asarray(b_h)
    a.requires_grad = b.requires_grad = True
    with grad.Tape() as tape:
        c = a @ b
    tape.backward(c, kaionb.asarray(g_h))
    g16 = g_h.astype(np.float16).astype(np.float64)
    from kaionb.testing import assert_close

    assert_close(a.grad, g16 @ b_h.astype(np.float64).T, tol=1e-3, what="dA")
    assert_close(b.grad, a_h.astype(np.float64).T @ g16, tol=1e-3, what="dB")
