"""rms_norm / layer_norm: bad input refused before launch (CPU, fake device arrays), and on
a GPU every row width / row count / dtype against float64 NumPy with poisoned outputs."""

import numpy as np
import pytest

import kaionb
from kaionb.kernels.norms import layer_norm, layer_norm_ref, rms_norm, rms_norm_ref
from kaionb.testing import assert_close, poisoned, random_array
from kaionb.testing import metadata_array as fake
from row_cases import CASES, DTYPES

gpu = pytest.mark.gpu


# ----------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("fn", [rms_norm, layer_norm])
def test_wrong_weight_length(fn):
    with pytest.raises(ValueError, match=r"argument 'weight' expected shape \(8,\), got \(7,\)"):
        fn(fake((4, 8)), fake((7,)))


@pytest.mark.parametrize("fn", [rms_norm, layer_norm])
def test_mismatched_dtypes(fn):
    with pytest.raises(TypeError, match="argument 'weight' expected the dtype of 'x'"):
        fn(fake((4, 8), np.float16), fake((8,), np.float32))


@pytest.mark.parametrize("fn", [rms_norm, layer_norm])
def test_integer_input(fn):
    with pytest.raises(TypeError, match="argument 'x' expected dtype"):
        fn(fake((4, 8), np.int32), fake((8,), np.int32))


@pytest.mark.parametrize("fn", [rms_norm, layer_norm])
@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan")])
def test_eps_must_be_positive(fn, eps):
    with pytest.raises(ValueError, match="argument 'eps' expected a finite value > 0"):
        fn(fake((4, 8)), fake((8,)), eps=eps)


def test_layer_norm_bias_length():
    with pytest.raises(ValueError, match="argument 'bias' expected shape"):
        layer_norm(fake((4, 8)), fake((8,)), fake((9,)))


def test_out_dtype_checked():
    with pytest.raises(TypeError, match="argument 'out' expected dtype float32"):
        rms_norm(fake((4, 8)), fake((8,)), out=fake((4, 8), np.float16))


def test_strided_last_axis_refused():
    x = fake((8, 8))._view((8, 4), (32, 8))
    with pytest.raises(ValueError, match="contiguous last axis"):
        rms_norm(x, fake((4,)))


# ----------------------------------------------------------------------------- GPU

def check(fn, ref, x_host, *params, dtype, **kw):
    out = poisoned(x_host.shape, dtype)
    got = fn(kaionb.asarray(x_host), *[kaionb.asarray(p) for p in params], out=out, **kw)
    assert got is out
    assert_close(out, ref(x_host, *params, **kw), dtype=dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_rms_norm(dtype, rows, n):
    rng = np.random.default_rng(rows * 7 + n)
    x = random_array((rows, n), dtype, rng=rng)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    check(rms_norm, rms_norm_ref, x, w, dtype=dtype, eps=1e-6)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_layer_norm(dtype, rows, n):
    rng = np.random.default_rng(rows * 11 + n)
    # An offset mean checks the variance is taken around the mean.
    x = random_array((rows, n), dtype, rng=rng, scale=2.0, offset=3.0)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    b = random_array((n,), dtype, rng=rng)
    check(layer_norm, layer_norm_ref, x, w, b, dtype=dtype, eps=1e-5)


@gpu
def test_layer_norm_without_bias_and_leading_dims():
    x = random_array((2, 5, 768), np.float16, rng=np.random.default_rng(1))
    w = random_array((768,), np.float16, rng=np.random.default_rng(2))
    out = layer_norm(kaionb.asarray(x), kaionb.asarray(w))
    assert out.shape == x.shape
    assert_close(out, layer_norm_ref(x, w), dtype=np.float16)


@gpu
@pytest.mark.parametrize("n", [1024, 1000, 40000])
def test_rms_norm_row_slice(n):
    # Every other row, starting one element in: rows at a stride and off 16-byte alignment.
    base = random_array((6, n + 1), np.float16, rng=np.random.default_rng(n))
    w = random_array((n,), np.float16, rng=np.random.default_rng(3))
    view = kaionb.asarray(base)[::2, 1:]
    out = rms_norm(view, kaionb.asarray(w))
    assert_close(out, rms_norm_ref(base[::2, 1:], w), dtype=np.float16)


@gpu
def test_rms_norm_empty_and_deterministic():
    assert rms_norm(kaionb.empty((0, 64), np.float32), kaionb.asarray(np.ones(64, np.float32))).shape == (0, 64)
    x = kaionb.asarray(random_array((64, 70000), np.float32, rng=np.random.default_rng(5)))
    w = kaionb.asarray(np.ones(70000, np.float32))
    assert np.array_equal(rms_norm(x, w).get(), rms_norm(x, w).get())
