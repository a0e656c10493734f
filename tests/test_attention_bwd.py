"""attention backward: the float64 reference against finite differences (CPU); bad input
refused before any launch (CPU, metadata arrays); on a GPU the preprocess + dK/dV + dQ
kernels against float64 (odd shapes, every head dimension class, GQA, causal with
Sq ≠ Sk, rows with no key, f32 inputs, poisoned gradients), bit-identical repeats, the
tape (recording only when asked, float32 gradients) and gradcheck."""

import numpy as np
import pytest

import kaionb
from kaionb import grad
from kaionb.kernels import attention as at
from kaionb.testing import assert_close, poisoned, random_array
from kaionb.testing import metadata_array as fake

gpu = pytest.mark.gpu
F16, BF16, F32 = np.dtype(np.float16), kaionb.bfloat16, np.dtype(np.float32)
# Norm-wise relative error ‖g − g_ref‖/‖g_ref‖ of each gradient against float64 on the
# rounded inputs (the bounds): P and dS are rounded to the operand type before
# their GEMMs, Δ comes from the rounded O, and a 16-bit gradient is rounded once more.
TOL = {F16: 3e-3, BF16: 1e-2, F32: 1e-2}


# -- the reference (CPU) -----------------------------------------------------------------------

@pytest.mark.parametrize("causal, sq, sk", [(False, 5, 7), (True, 6, 4), (True, 4, 6)])
def test_reference_against_finite_differences(causal, sq, sk):
    rng = np.random.default_rng(sq * 10 + sk)
    q = rng.standard_normal((1, 4, sq, 8))
    k = rng.standard_normal((1, 2, sk, 8))  # GQA: 2 query heads per K/V head
    v = rng.standard_normal((1, 2, sk, 8))
    dout = rng.standard_normal(q.shape)
    grads = at.attention_bwd_ref(dout, q, k, v, causal=causal, scale=0.6)

    def loss(q_, k_, v_):
        return float(np.sum(at.attention_ref(q_, k_, v_, causal=causal, scale=0.6)[0] * dout))

    h = 1e-6
    for index, (x, g) in enumerate(zip((q, k, v), grads)):
        assert g.shape == x.shape
        for flat in range(0, x.size, 7):
            pos = np.unravel_index(flat, x.shape)
            args = [q.copy(), k.copy(), v.copy()]
            args[index][pos] += h
            up = loss(*args)
            args[index][pos] -= 2 * h
            numeric = (up - loss(*args)) / (2 * h)
            assert abs(numeric - g[pos]) <= 1e-6 * max(1.0, abs(numeric)), (index, pos)


# -- bad input (CPU) ---------------------------------------------------------------------------

def _bwd_args(q=(2, 8, 33, 64), k=(2, 2, 40, 64), dtype=F16):
    qa, ka, va = fake(q, dtype), fake(k, dtype), fake(k, dtype)
    return dict(dout=fake(q, dtype), q=qa, k=ka, v=va, out=fake(q, dtype),
                lse=fake(q[:-1], F32))


BAD = [
    # (description, argument replaced, value, extra kwargs, exception, message fragment)
    ("dout shape", "dout", fake((2, 8, 34, 64), F16), {}, ValueError,
     "argument 'dout' expected shape (2, 8, 33, 64), got (2, 8, 34, 64)"),
    ("dout dtype", "dout", fake((2, 8, 33, 64), np.int16), {}, TypeError,
     "argument 'dout' expected dtype"),
    ("dout None", "dout", None, {}, TypeError, "argument 'dout' expected an array, got None"),
    ("out shape", "out", fake((2, 8, 33, 32), F16), {}, ValueError,
     "argument 'out' expected shape (2, 8, 33, 64)"),
    ("lse of another call", "lse", fake((2, 8, 40), F32), {}, ValueError,
     "argument 'lse' expected shape (2, 8, 33), got (2, 8, 40)"),
    ("lse dtype", "lse", fake((2, 8, 33), F16), {}, TypeError,
     "argument 'lse' expected dtype float32"),
    ("v shape", "v", fake((2, 2, 41, 64), F16), {}, ValueError,
     "argument 'v' expected the shape of 'k' (2, 2, 40, 64), got (2, 2, 41, 64)"),
    ("scale", None, None, dict(scale=0.0), ValueError,
     "argument 'scale' expected a finite value > 0"),
    ("grad dtype", None, None, dict(dtype=np.int32), TypeError,
     "argument 'dtype' expected float16, bfloat16 or float32"),
    ("grads not a tuple", None, None, dict(grads=fake((2, 8, 33, 64), F16)), TypeError,
     "argument 'grads' expected a tuple of 3 arrays"),
    ("grads shape", None, None,
     dict(grads=(fake((2, 8, 33, 64), F16), fake((2, 2, 41, 64), F16),
                 fake((2, 2, 40, 64), F16))), ValueError,
     "argument 'grads[1]' expected shape (2, 2, 40, 64)"),
]


@pytest.mark.parametrize("what, name, value, kwargs, exc, message", BAD,
                         ids=[b[0] for b in BAD])
def test_bad_input_refused(what, name, value, kwargs, exc, message):
    args = _bwd_args()
    if name is not None:
        args[name] = value
    with pytest.raises(exc, match="attention_bwd: " + _escape(message)):
        kaionb.attention_bwd(args.pop("dout"), args.pop("q"), args.pop("k"), args.pop("v"),
                             args.pop("out"), args.pop("lse"), **kwargs)


def test_tape_backward_needs_a_recorded_output():
    y = fake((4, 4), F32)
    with grad.Tape() as tape:
        pass
    with pytest.raises(ValueError, match="Tape.backward: argument 'output' expected an array "
                                         "an op recorded on this tape produced"):
        tape.backward(y)


def _escape(text):
    import re
    return re.escape(text)


# -- GPU ---------------------------------------------------------------------------------------

def check_backward(B, Hq, Hkv, Sq, Sk, D, dtype, *, causal=False, scale=None, seed=0,
                   grad_dtype=None):
    """Forward (kaionb, with lse) then attention_bwd into poisoned gradients, against the
    float64 reference on the same (rounded) inputs and dO. Returns the gradients."""
    rng = np.random.default_rng(seed)
    q = random_array((B, Hq, Sq, D), dtype, rng=rng)
    k = random_array((B, Hkv, Sk, D), dtype, rng=rng)
    v = random_array((B, Hkv, Sk, D), dtype, rng=rng)
    dout = random_array((B, Hq, Sq, D), dtype, rng=rng)
    qd, kd, vd = kaionb.asarray(q), kaionb.asarray(k), kaionb.asarray(v)
    out, lse = kaionb.attention(qd, kd, vd, causal=causal, scale=scale, return_lse=True)
    gdt = np.dtype(dtype if grad_dtype is None else grad_dtype)
    grads = tuple(poisoned(x.shape, gdt) for x in (q, k, v))
    got = kaionb.attention_bwd(kaionb.asarray(dout), qd, kd, vd, out, lse, causal=causal,
                               scale=scale, grads=grads)
    assert all(a is b for a, b in zip(got, grads))
    refs = at.attention_bwd_ref(dout, q, k, v, causal=causal, scale=scale)
    tol = TOL[np.dtype(dtype)]
    for name, g, ref in zip(("dq", "dk", "dv"), grads, refs):
        assert g.dtype == gdt
        assert_close(g, ref, tol=tol, what=name)
    return grads


SHAPES = [
    # B, Hq, Hkv, Sq, Sk, D
    (1, 1, 1, 1, 1, 64),
    (2, 4, 4, 17, 17, 64),
    (1, 2, 2, 127, 127, 128),
    (1, 2, 1, 300, 300, 128),        # GQA 2
    (1, 1, 1, 1030, 1030, 64),       # past every tile multiple
    (2, 8, 2, 100, 333, 80),         # GQA 4, Sq < Sk, D not a power of two
    (1, 8, 1, 333, 100, 8),          # MQA 8, Sq > Sk (causal: rows with no key), D = 8
    (1, 2, 2, 130, 257, 256),        # widest head: column-split dK/dV warps
    (1, 4, 2, 65, 200, 192),
    (1, 2, 2, 40, 50, 32),
    (1, 2, 2, 40, 50, 96),
]


@gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_backward(shape, causal, dtype):
    check_backward(*shape, dtype, causal=causal, seed=sum(shape))


@gpu
def test_float32_gradients_and_inputs():
    check_backward(1, 4, 2, 70, 90, 64, BF16, causal=True, grad_dtype=F32, seed=1)
    check_backward(1, 2, 2, 50, 60, 64, F32, causal=False, scale=0.3, seed=2)


@gpu
@pytest.mark.parametrize("shape", [(2, 8, 2, 500, 700, 128), (1, 4, 4, 300, 300, 64)])
def test_bit_identical_repeats(shape):
    B, Hq, Hkv, Sq, Sk, D = shape
    rng = np.random.default_rng(8)
    q, dout = (kaionb.asarray(random_array((B, Hq, Sq, D), BF16, rng=rng)) for _ in range(2))
    k, v = (kaionb.asarray(random_array((B, Hkv, Sk, D), BF16, rng=rng)) for _ in range(2))
    out, lse = kaionb.attention(q, k, v, causal=True, return_lse=True)

    def bits():
        return [g.get().view(np.uint16) for g in
                kaionb.attention_bwd(dout, q, k, v, out, lse, causal=True)]

    first = bits()
    for _ in range(5):
        assert all(np.array_equal(a, b) for a, b in zip(bits(), first))


@gpu
def test_tape_records_attention():
    rng = np.random.default_rng(3)
    shape_q, shape_kv = (2, 4, 45, 64), (2, 2, 60, 64)
    q = random_array(shape_q, F16, rng=rng)
    k, v = (random_array(shape_kv, F16, rng=rng) for _ in range(2))
    dout = random_array(shape_q, F32, rng=rng)
    qd, kd, vd = kaionb.asarray(q), kaionb.asarray(k), kaionb.asarray(v)
    with grad.Tape() as tape:
        out = kaionb.attention(qd, kd, vd, causal=True)
    assert not tape.entries  # nothing required a gradient
    for x in (qd, kd, vd):
        x.requires_grad = True
    with grad.Tape() as tape:
        out = kaionb.attention(qd, kd, vd, causal=True)
    assert len(tape.entries) == 1 and out.requires_grad
    tape.backward(out, kaionb.asarray(dout))
    # dO reaches the kernels rounded to the inputs' dtype.
    refs = at.attention_bwd_ref(dout.astype(F16), q, k, v, causal=True)
    for x, ref in zip((qd, kd, vd), refs):
        assert x.grad.dtype == F32
        assert_close(x.grad, ref, tol=TOL[F16])


@gpu
def test_gradcheck_float32():
    # f32 inputs run on bf16 tensor cores: differences of the float64 forward model.
    rng = np.random.default_rng(4)
    inputs = []
    for shape in ((1, 2, 12, 16), (1, 1, 9, 16), (1, 1, 9, 16)):
        x = kaionb.asarray(rng.standard_normal(shape).astype(np.float32))
        x.requires_grad = True
        inputs.append(x)

    def reference(q, k, v):
        return at.attention_ref(q, k, v, causal=True)[0]

    worst = grad.gradcheck(lambda q, k, v: kaionb.attention(q, k, v, causal=True), inputs,
                           eps=1e-3, rtol=5e-2, probes=8, rng=rng, reference=reference)
    assert worst < 5e-2


@gpu
def test_no_queries_or_no_keys_give_zero_gradients():
    q = kaionb.asarray(random_array((1, 2, 5, 64), F16))
    kv = kaionb.empty((1, 2, 0, 64), F16)
    out, lse = kaionb.attention(q, kv, kv, return_lse=True)
    dq, dk, dv = kaionb.attention_bwd(q, q, kv, kv, out, lse)
    assert (dq.get().astype(np.float64) == 0).all() and dk.shape == (1, 2, 0, 64)


@gpu
def test_context_usable_after_bad_input():
    args = dict(dtype=F16)
    q = kaionb.asarray(random_array((1, 2, 20, 64), **args))
    out, lse = kaionb.attention(q, q, q, return_lse=True)
    with pytest.raises(ValueError):
        kaionb.attention_bwd(q, q, q, q, out, lse[:, :, :10])
    check_backward(1, 2, 2, 20, 30, 64, F16, seed=5)
