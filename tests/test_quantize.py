"""quantize_int8 / dequantize_int8: bad input refused before launch (CPU); on a GPU every
shape, dtype and axis against float64 NumPy with poisoned outputs."""

import numpy as np
import pytest

import kaionb
from kaionb.kernels.quantize import (
    dequantize_int8,
    dequantize_int8_ref,
    quantize_int8,
    quantize_int8_exact,
    quantize_int8_ref,
)
from kaionb.testing import assert_close, poisoned, random_array
from kaionb.testing import metadata_array as fake
from row_cases import CASES, DTYPES

gpu = pytest.mark.gpu


def test_integer_input_refused():
    with pytest.raises(TypeError, match="quantize_int8: argument 'x' expected dtype"):
        quantize_int8(fake((4, 8), np.int32))


def test_unsupported_axis():
    with pytest.raises(ValueError, match="quantize_int8: argument 'axis' expected None"):
        quantize_int8(fake((2, 4, 8)), axis=1)


@pytest.mark.parametrize("axis,scale_shape", [(None, (4,)), (0, (8,)), (-1, (4,)), (0, (4, 1))])
def test_wrong_scale_shape(axis, scale_shape):
    with pytest.raises(ValueError, match="dequantize_int8: argument 'scale' expected shape"):
        dequantize_int8(fake((4, 8), np.int8), fake(scale_shape), axis=axis)


def test_dequantize_dtypes():
    with pytest.raises(TypeError, match="argument 'q' expected dtype int8"):
        dequantize_int8(fake((4, 8), np.float32), fake(()))
    with pytest.raises(TypeError, match="argument 'scale' expected dtype float32"):
        dequantize_int8(fake((4, 8), np.int8), fake((), np.float16))
    with pytest.raises(TypeError, match="argument 'dtype' expected float32"):
        dequantize_int8(fake((4, 8), np.int8), fake(()), dtype=np.int32)


def check_q(q, x, axis):
    """q against the float64 reference: equal, except one step off where the exact x / scale
    lies within float32 rounding (8 ulp) of a .5 tie — the kernel rounds rint(x · (127 /
    max)) computed in float32, and bf16 / f16 inputs (8 / 11 significant bits) hit exact
    ties often (0.11% of bf16 values on the H100)."""
    exact, _ = quantize_int8_exact(x, axis)
    ref_q = np.clip(np.rint(exact), -127, 127).astype(np.int32)
    near_tie = np.abs(np.abs(exact) % 1.0 - 0.5) <= 8 * 2.0**-24 * np.abs(exact)
    diff = np.abs(q.get().astype(np.int32) - ref_q)
    assert diff.max(initial=0) <= 1, f"max |Δq| {diff.max()}"
    off = np.flatnonzero((diff > 0) & ~near_tie)
    assert off.size == 0, (f"{off.size} of {diff.size} values off by one away from a tie, "
                           f"first at flat index {off[:8]}: exact {exact.ravel()[off[:8]]}")


@gpu
@pytest.mark.parametrize("axis", [None, 0, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_quantize_roundtrip(axis, dtype, rows, n):
    _check_roundtrip(axis, dtype, (rows, n))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape, axis", [
    ((70000, 16), -1), ((70000, 24), -1), ((1001, 4100), -1), ((4099, 8200), None),
    ((1, 2**22 + 40), None), ((65536, 16), 0), ((4, 33, 64), -1)], ids=str)
def test_quantize_many_blocks(dtype, shape, axis):
    """Per column over many row blocks of the absmax pass (256 rows each, a partial last
    one) and rows end to end (K % 16 == 0, also of a 3-D x); per tensor over more blocks
    than one wave holds (and one long row); dequantize of many short rows end to end."""
    _check_roundtrip(axis, dtype, shape)


def _check_roundtrip(axis, dtype, shape):
    x = random_array(shape, dtype, rng=np.random.default_rng(shape[0] * 23 + shape[-1]),
                     scale=2.0)
    ref_q, ref_s = quantize_int8_ref(x, axis)
    q = poisoned(x.shape, np.int8)
    s = poisoned(ref_s.shape, np.float32)
    got_q, got_s = quantize_int8(kaionb.asarray(x), axis, out=(q, s))
    assert got_q is q and got_s is s
    assert_close(s, ref_s, dtype=np.float32, tol=1e-6)
    check_q(q, x, axis)
    out = poisoned(x.shape, dtype)
    dequantize_int8(q, s, axis, dtype, out=out)
    assert_close(out, dequantize_int8_ref(q.get(), s.get(), axis), dtype=dtype)


@gpu
@pytest.mark.parametrize("axis", [None, 0, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dequantize_misaligned_rows(axis, dtype):
    """Rows of q starting at every offset from an 8-byte boundary (a strided view at an
    odd column) and an output view one element off 16-byte alignment: the runs at each
    row's edges go byte by byte, the stores element by element."""
    rng = np.random.default_rng(11)
    base = rng.integers(-128, 128, size=(9, 1003), dtype=np.int8)
    host = base[1::2, 3:]  # rows 2006 bytes apart: 4 rows at 4 different offsets
    rows, n = host.shape
    scale_shape = {None: (), 0: (rows,), -1: (n,)}[axis]
    s = rng.uniform(0.5, 2.0, size=scale_shape).astype(np.float32)
    q = kaionb.asarray(base)[1::2, 3:]
    ref = dequantize_int8_ref(host, s, axis)
    got = dequantize_int8(q, kaionb.asarray(s), axis, dtype)
    assert_close(got, ref, dtype=dtype)
    wide = poisoned((rows, n + 1), dtype)
    out = wide[:, 1:]
    assert dequantize_int8(q, kaionb.asarray(s), axis, dtype, out=out) is out
    assert_close(out, ref, dtype=dtype)
    assert np.isnan(np.asarray(wide.get()[:, 0], np.float32)).all()  # left untouched


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape, axis", [((65536, 8), 0), ((65536, 8), -1), ((257, 1000), 0),
                                         ((257, 1000), -1), ((3, 4096), 0),
                                         ((4, 33, 64), -1), ((65536, 16), 0),
                                         ((65536, 16), -1)], ids=str)
def test_dequantize_short_rows_and_channels(dtype, shape, axis):
    """Per-row and per-column scales where each block loops over many rows of one or two
    runs (65536 rows of 8; of 16, walked end to end), over rows shorter than a block's step
    (1000, 4096), and a 3-D q with per-channel scales."""
    rng = np.random.default_rng(sum(shape))
    host = rng.integers(-128, 128, size=shape, dtype=np.int8)
    s = rng.uniform(0.5, 2.0, size=shape[axis]).astype(np.float32)
    out = poisoned(shape, dtype)
    dequantize_int8(kaionb.asarray(host), kaionb.asarray(s), axis, dtype, out=out)
    assert_close(out, dequantize_int8_ref(host, s, axis), dtype=dtype)


@gpu
def test_zero_rows_and_strided():
    x = random_array((6, 300), np.float32, rng=np.random.default_rng(2))
    x[2] = 0.0
    q, s = quantize_int8(kaionb.asarray(x), axis=0)
    assert s.get()[2] == 0 and (q.get()[2] == 0).all()
    check_q(q, x, 0)
    view = kaionb.asarray(x)[::2, 3:]
    q, s = quantize_int8(view, axis=-1)
    ref_q, ref_s = quantize_int8_ref(x[::2, 3:], -1)
    assert_close(s, ref_s, dtype=np.float32, tol=1e-6)
    check_q(q, x[::2, 3:], -1)
    q, s = quantize_int8(kaionb.asarray(x.reshape(2, 3, 300)))
    assert s.shape == () and q.shape == (2, 3, 300)


@gpu
@pytest.mark.parametrize("axis,scale_shape", [(None, ()), (0, (0,)), (-1, (8,))])
def test_empty_roundtrip(axis, scale_shape):
    q, s = quantize_int8(kaionb.empty((0, 8), np.float16), axis)
    assert q.shape == (0, 8) and q.dtype == np.int8 and s.shape == scale_shape
    assert dequantize_int8(q, s, axis, np.float16).shape == (0, 8)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", [(5, 16), (3, 4112), (2, 32768), (2, 32784), (4, 1024),
                                    (2, 65536), (1, 262144), (1, 262160)])
def test_per_row_one_pass_and_fallback(dtype, rows, n):
    """Per-row scales: aligned rows of n % 16 == 0 take the one-pass register kernel (one
    block up to 32768, a cluster of up to 8 CTAs up to 262144 on sm_90), wider or
    misaligned rows (a view starting one element in) the two-launch path; all must agree
    with the reference."""
    rng = np.random.default_rng(rows * 7 + n)
    x = random_array((rows, n + 16), dtype, rng=rng, scale=3.0)
    dev = kaionb.asarray(x)
    for view, host in ((dev[:, :n], x[:, :n]), (dev[:, 1:n + 1], x[:, 1:n + 1])):
        ref_q, ref_s = quantize_int8_ref(host, 0)
        q = poisoned(host.shape, np.int8)
        s = poisoned(ref_s.shape, np.float32)
        quantize_int8(view, 0, out=(q, s))
        assert_close(s, ref_s, dtype=np.float32, tol=1e-6)
        check_q(q, host, 0)
