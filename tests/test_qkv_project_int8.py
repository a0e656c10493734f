"""kaionb.qkv_project_int8: bad input refused before any launch (CPU); on the GPU the three
projections against the exact reference — int8 x with its scales, float x quantized per
token (in the kernel for few rows, by quantize_int8 for many), GQA widths, biases, output
dtypes, ``out=``, unaligned hidden sizes, bit-identical repeats (the replayed fast path)."""

import numpy as np
import pytest

import kaionb
from kaionb._device import STATE
from kaionb.array import DeviceArray, bfloat16
from kaionb.kernels import matmul as mm
from kaionb.kernels import matmul_int8 as mi
from kaionb.testing import poisoned, relative_error

gpu = pytest.mark.gpu
I8, F16, F32 = np.dtype(np.int8), np.dtype(np.float16), np.dtype(np.float32)
TOL = {F32: 1e-6, F16: 2e-3, bfloat16: 1e-2}


def _fake(shape, dtype=I8, device=0):
    """A DeviceArray header with no memory: validation never touches the data."""
    dt = np.dtype(dtype)
    strides = tuple(int(s) for s in np.empty(shape, dt).strides)
    return DeviceArray(tuple(shape), dt, strides, 256, None, device)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(x=_fake((4, 64), F32)), TypeError, r"argument 'x' expected dtype int8 or float16 or bfloat16, got float32"),
    (dict(w_q=_fake((64, 32), F16)), TypeError, r"argument 'w_q' expected dtype int8"),
    (dict(w_k=_fake((63, 16))), ValueError, r"argument 'w_k' expected shape \(64, N\)"),
    (dict(w_v=_fake((64, 17))), ValueError, r"argument 'w_v' expected shape \(64, 16\)"),
    (dict(w_q=_fake((2, 64, 32))), ValueError, r"argument 'w_q' expected shape \(64, N\)"),
    (dict(scale_q=_fake((31,), F32)), ValueError, r"argument 'scale_q' expected .*\(32,\)"),
    (dict(scale_k=_fake((16,), np.float64)), TypeError, r"argument 'scale_k' expected dtype float32"),
    (dict(x_scale=0.5), ValueError, r"argument 'x_scale' expected None for a float16"),
    (dict(x=_fake((4, 64))), TypeError, r"argument 'x_scale' expected the int8 x's scale"),
    (dict(x=_fake((4, 64)), x_scale=_fake((3,), F32)), ValueError, r"argument 'x_scale' expected .*\(4,\)"),
    (dict(bias=_fake((32,), F32)), TypeError, r"argument 'bias' expected None or a tuple of three"),
    (dict(bias=(None, _fake((15,), F32), None)), ValueError, r"argument 'bias\[1\]' expected shape \(16,\)"),
    (dict(dtype=np.int32), TypeError, r"argument 'dtype' expected float32, float16"),
    (dict(out=(_fake((4, 32), F16),)), TypeError, r"argument 'out' expected a tuple of 3"),
    (dict(out=(_fake((4, 32), F16), _fake((4, 16), F16), _fake((4, 15), F16))), ValueError,
     r"argument 'out\[2\]'"),
    (dict(x=_fake((4, 0), F16), w_q=_fake((0, 32)), w_k=_fake((0, 16)), w_v=_fake((0, 16))),
     ValueError, r"argument 'x' expected a hidden size ≥ 1"),
])
def test_bad_input_is_refused_before_launch(kwargs, exc, pattern):
    args = dict(x=_fake((4, 64), F16), w_q=_fake((64, 32)), w_k=_fake((64, 16)),
                w_v=_fake((64, 16)), scale_q=0.5, scale_k=0.5, scale_v=0.5)
    args.update(kwargs)
    pos = [args.pop(k) for k in ("x", "w_q", "w_k", "w_v", "scale_q", "scale_k", "scale_v")]
    with pytest.raises(exc, match="qkv_project_int8: " + pattern):
        kaionb.qkv_project_int8(*pos, **args)


def test_reference_is_three_int8_matmuls():
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (3, 40), dtype=np.int8)
    ws = [rng.integers(-128, 128, (40, n), dtype=np.int8) for n in (24, 8, 8)]
    sx = rng.uniform(0.5, 2, 3).astype(np.float32)
    q, k, v = mi.qkv_project_int8_ref(x, *ws, 0.5, 0.25, 2.0, x_scale=sx)
    for got, w, s in zip((q, k, v), ws, (0.5, 0.25, 2.0)):
        exact = (x.astype(np.int64) @ w.astype(np.int64)) * sx[:, None].astype(np.float64) * s
        assert np.array_equal(got, exact)


# ----------------------------------------------------------------------------- GPU


def _weights(hidden, widths, rng):
    """(host [hidden, N] int8 weights, device K-major views of [N, hidden] checkpoints)."""
    host = [rng.integers(-128, 128, (n, hidden), dtype=np.int8) for n in widths]
    return [w.T for w in host], [kaionb.asarray(w).T for w in host]


def _activation(m, hidden, x_dtype, rng):
    """(x, x_scale, host int8 x, host row scales): an int8 x with random per-row scales,
    or a float x (x_scale None) and what quantize_int8 makes of it per row."""
    if np.dtype(x_dtype) == I8:
        x_host = rng.integers(-128, 128, (m, hidden), dtype=np.int8)
        sx = (rng.uniform(0.5, 2.0, m) * 1e-2).astype(np.float32)
        return kaionb.asarray(x_host), kaionb.asarray(sx), x_host, sx
    x = kaionb.asarray((rng.standard_normal((m, hidden)) * 3).astype(x_dtype))
    q, s = kaionb.quantize_int8(x, axis=0)
    return x, None, q.get(), s.get()


def _weight_scales(widths, rng, per_channel=True):
    if not per_channel:
        return [3e-3, np.float32(2e-3), 1e-3], [3e-3, kaionb.asarray(np.array(np.float32(2e-3))),
                                               1e-3]
    host = [(rng.uniform(0.5, 2.0, n) * 1e-3).astype(np.float32) for n in widths]
    return host, [kaionb.asarray(s) for s in host]


@gpu
@pytest.mark.parametrize("m", [1, 7, 64, 65, 300])
@pytest.mark.parametrize("shape", [(4096, 512, 128), (100, 40, 24), (520, 136, 136)])
@pytest.mark.parametrize("per_channel", [True, False])
def test_int8_x_against_exact_reference(m, shape, per_channel):
    hidden, n_q, n_kv = shape
    rng = np.random.default_rng(hash((m, shape, per_channel)) % 2**32)
    widths = (n_q, n_kv, n_kv)
    x = rng.integers(-128, 128, (m, hidden), dtype=np.int8)
    sx = (rng.uniform(0.5, 2.0, m) * 1e-2).astype(np.float32)
    w_host, w_dev = _weights(hidden, widths, rng)
    s_host, s_dev = _weight_scales(widths, rng, per_channel)
    bias = (rng.standard_normal(n_q).astype(np.float32), None,
            rng.standard_normal(n_kv).astype(np.float16))
    out = tuple(poisoned((m, n), np.float32) for n in widths)
    got = kaionb.qkv_project_int8(kaionb.asarray(x), *w_dev, *s_dev, x_scale=kaionb.asarray(sx),
                                  bias=tuple(None if b is None else kaionb.asarray(b)
                                             for b in bias), out=out)
    assert all(g is o for g, o in zip(got, out))
    refs = mi.qkv_project_int8_ref(x, *w_host, *s_host, x_scale=sx, bias=bias)
    for g, ref in zip(got, refs):
        assert relative_error(g.get(), ref) < 1e-6


@gpu
@pytest.mark.parametrize("x_dtype", [np.int8, bfloat16], ids=str)
def test_one_column_weights_with_an_unaligned_x(x_dtype):
    """Weights of one column get a padded (aligned) row stride; x with K = 141 is not
    aligned: the kernel must not read x with 16-byte loads (it did: a misaligned-address
    fault that ended the context; found by the fuzz, tests/test_fuzz_ops.py)."""
    rng = np.random.default_rng(141)
    m, hidden, widths = 15, 141, (1, 1, 1)
    w_host = [rng.integers(-128, 128, (hidden, n), dtype=np.int8) for n in widths]
    w_dev = [kaionb.asarray(np.ascontiguousarray(w.T)).T for w in w_host]
    x, x_scale, x_host, sx = _activation(m, hidden, x_dtype, rng)
    got = kaionb.qkv_project_int8(x, *w_dev, 3e-3, 2e-3, 1e-3, x_scale=x_scale,
                                  dtype=np.float32)
    refs = mi.qkv_project_int8_ref(x_host, *w_host, 3e-3, 2e-3, 1e-3, x_scale=sx)
    for g, ref in zip(got, refs):
        assert relative_error(g.get(), ref) < 1e-6


@gpu
@pytest.mark.parametrize("m", [1, 3, 16, 17, 200])
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=str)
@pytest.mark.parametrize("hidden", [4096, 1000, 77])
def test_float_x_is_quantized_per_token(m, dtype, hidden):
    """The float path gives what quantize_int8 (per row) + the exact int8 reference give."""
    rng = np.random.default_rng(hash((m, hidden)) % 2**32)
    widths = (256, 64, 64)  # GQA: 4 query heads per key/value head of 64
    x = kaionb.asarray((rng.standard_normal((m, hidden)) * 3).astype(dtype))
    w_host, w_dev = _weights(hidden, widths, rng)
    s_host, s_dev = _weight_scales(widths, rng)
    qx, sx = kaionb.quantize_int8(x, axis=0)
    got = kaionb.qkv_project_int8(x, *w_dev, *s_dev, dtype=np.float32)
    refs = mi.qkv_project_int8_ref(qx.get(), *w_host, *s_host, x_scale=sx.get())
    for g, ref, n in zip(got, refs, widths):
        assert g.shape == (m, n) and g.dtype == F32
        assert relative_error(g.get(), ref) < 1e-6
    # Default output dtype: x's; the same values rounded.
    q16, _, _ = kaionb.qkv_project_int8(x, *w_dev, *s_dev)
    assert q16.dtype == np.dtype(dtype)
    assert relative_error(q16.get(), refs[0]) < TOL[np.dtype(dtype)]


@gpu
def test_batched_x_and_three_matmul_int8_calls_agree():
    rng = np.random.default_rng(9)
    hidden, widths = 512, (128, 32, 32)
    x = kaionb.asarray(rng.standard_normal((2, 5, hidden)).astype(np.float16))
    w_host, w_dev = _weights(hidden, widths, rng)
    q, k, v = kaionb.qkv_project_int8(x, *w_dev, 1e-3, 2e-3, 3e-3, dtype=np.float32)
    assert (q.shape, k.shape, v.shape) == ((2, 5, 128), (2, 5, 32), (2, 5, 32))
    qx, sx = kaionb.quantize_int8(x.reshape(10, hidden), axis=0)
    for got, w, s in zip((q, k, v), w_dev, (1e-3, 2e-3, 3e-3)):
        alone = kaionb.matmul_int8(qx, w, (sx, s))
        assert relative_error(got.get().reshape(10, -1), alone.get()) < 1e-6


@gpu
@pytest.mark.parametrize("m", [1, 16, 128])
def test_repeats_are_bit_identical(m):
    rng = np.random.default_rng(4)
    hidden, widths = 4096, (4096, 1024, 1024)
    x = kaionb.asarray(rng.standard_normal((m, hidden)).astype(np.float16))
    _, w_dev = _weights(hidden, widths, rng)
    first = [t.get() for t in kaionb.qkv_project_int8(x, *w_dev, 1e-3, 1e-3, 1e-3)]
    for _ in range(3):  # replays of the recorded call
        again = kaionb.qkv_project_int8(x, *w_dev, 1e-3, 1e-3, 1e-3)
        assert [t.get().tobytes() for t in again] == [t.tobytes() for t in first]


@gpu
def test_context_usable_after_bad_input():
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (3, 64), dtype=np.int8)
    w_host, w_dev = _weights(64, (32, 16, 16), rng)
    with pytest.raises(ValueError, match="qkv_project_int8: argument 'w_v'"):
        kaionb.qkv_project_int8(kaionb.asarray(x), w_dev[0], w_dev[1], w_dev[0], 1.0, 1.0, 1.0,
                                x_scale=1.0)
    got = kaionb.qkv_project_int8(kaionb.asarray(x), *w_dev, 1.0, 1.0, 1.0, x_scale=0.5)
    for g, ref in zip(got, mi.qkv_project_int8_ref(x, *w_host, 1.0, 1.0, 1.0, x_scale=0.5)):
        assert relative_error(g.get(), ref) < 1e-6


@gpu
@pytest.mark.parametrize("m, x_dtype", [(1, F16), (2, bfloat16), (1, I8), (9, I8), (16, I8)],
                         ids=str)
@pytest.mark.parametrize("hidden, widths", [(4096, (512, 128, 128)), (1040, (1000, 40, 40)),
                                            (80, (24, 8, 8))])
def test_weight_stream_kernel(m, x_dtype, hidden, widths, monkeypatch):
    """The QKV launch on the weight-streaming kernel (forced for every grid size): three
    weights of odd widths, a float x quantized in the kernel per token (M ≤ 2) or an int8
    x with per-row scales, biases on two of the three."""
    rng = np.random.default_rng(hash((m, hidden, widths)) % 2**32)
    decisions = []
    real = mi._streams
    monkeypatch.setattr(mm, "STREAM_MIN_BLOCKS_PER_SM", 0.0)
    monkeypatch.setattr(mi, "_streams", lambda *a: decisions.append(real(*a)) or decisions[-1])
    STATE.calls = None
    w_host, w_dev = _weights(hidden, widths, rng)
    s_host, s_dev = _weight_scales(widths, rng)
    bias = (rng.standard_normal(widths[0]).astype(np.float32), None,
            rng.standard_normal(widths[2]).astype(np.float16))
    bias_dev = tuple(None if b is None else kaionb.asarray(b) for b in bias)
    x, x_scale, x_host, sx = _activation(m, hidden, x_dtype, rng)
    out = tuple(poisoned((m, n), np.float32) for n in widths)
    kaionb.qkv_project_int8(x, *w_dev, *s_dev, x_scale=x_scale, bias=bias_dev, out=out)
    STATE.calls = None
    assert decisions == [True]
    refs = mi.qkv_project_int8_ref(x_host, *w_host, *s_host, x_scale=sx, bias=bias)
    for g, ref in zip(out, refs):
        assert relative_error(g.get(), ref) < 1e-6
