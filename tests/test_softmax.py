"""softmax: bad input refused before launch (CPU); on a GPU every row width / row count /
dtype against float64 NumPy with poisoned outputs, rows sum to 1, −inf handling."""

import numpy as np
import pytest

import kaionb
from kaionb.kernels.softmax import softmax, softmax_ref
from kaionb.testing import assert_close, poisoned, random_array
from kaionb.testing import metadata_array as fake
from row_cases import CASES, DTYPES

gpu = pytest.mark.gpu


def test_integer_input_refused():
    with pytest.raises(TypeError, match="softmax: argument 'x' expected dtype"):
        softmax(fake((4, 8), np.int8))


def test_only_last_axis():
    with pytest.raises(ValueError, match="softmax: argument 'axis' expected -1"):
        softmax(fake((4, 8)), axis=0)


def test_out_shape_checked():
    with pytest.raises(ValueError, match="argument 'out' expected shape"):
        softmax(fake((4, 8)), out=fake((4, 9)))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_softmax(dtype, rows, n):
    x = random_array((rows, n), dtype, rng=np.random.default_rng(rows * 13 + n), scale=3.0)
    out = poisoned(x.shape, dtype)
    assert softmax(kaionb.asarray(x), out=out) is out
    ref = softmax_ref(x)
    assert_close(out, ref, dtype=dtype)
    if dtype == np.float32:
        np.testing.assert_allclose(out.get().astype(np.float64).sum(-1), 1.0, rtol=1e-5)


@gpu
@pytest.mark.parametrize("n", [8192, 100000])  # register path and streaming path
def test_softmax_minus_inf(n):
    x = random_array((4, n), np.float32, rng=np.random.default_rng(n))
    x[0, :] = -np.inf                # all −inf: NaN row, as torch.softmax
    x[1, ::3] = -np.inf              # some −inf: those are exactly 0
    x[2, :] = 0.0
    x[2, 5] = 1e4                    # one dominant value: one-hot
    got = softmax(kaionb.asarray(x)).get()
    assert np.isnan(got[0]).all()
    assert (got[1, ::3] == 0).all()
    np.testing.assert_allclose(got[1].sum(), 1.0, rtol=1e-5)
    assert got[2, 5] == 1.0 and np.count_nonzero(got[2]) == 1
    assert_close(got[1:], softmax_ref(x[1:]), dtype=np.float32)


@gpu
def test_softmax_shift_invariant_and_strided():
    x = random_array((8, 3001), np.float32, rng=np.random.default_rng(4))
    a = softmax(kaionb.asarray(x)).get()
    b = softmax(kaionb.asarray(x + 50.0)).get()
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-9)
    view = kaionb.asarray(x)[1::2, 1:]
    assert_close(softmax(view), softmax_ref(x[1::2, 1:]), dtype=np.float32)
