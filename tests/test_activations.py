"""fused_silu_gate / gelu: bad input refused before launch (CPU); on a GPU every shape and
dtype against float64 NumPy with poisoned outputs, contiguous and strided."""

import numpy as np
import pytest

import kaionb
from kaionb.array import bfloat16
from kaionb.kernels.activations import fused_silu_gate, fused_silu_gate_ref, gelu, gelu_ref
from kaionb.testing import assert_close, poisoned, random_array
from kaionb.testing import metadata_array as fake
from row_cases import CASES, DTYPES

gpu = pytest.mark.gpu


def test_gate_shape_and_dtype():
    with pytest.raises(ValueError, match="fused_silu_gate: argument 'gate' expected shape"):
        fused_silu_gate(fake((4, 8)), fake((4, 9)))
    with pytest.raises(TypeError, match="argument 'gate' expected the dtype of 'x'"):
        fused_silu_gate(fake((4, 8), np.float16), fake((4, 8), bfloat16))


def test_integer_inputs_refused():
    with pytest.raises(TypeError, match="gelu: argument 'x' expected dtype"):
        gelu(fake((4, 8), np.int32))
    with pytest.raises(TypeError, match="fused_silu_gate: argument 'x' expected dtype"):
        fused_silu_gate(fake((4, 8), np.int8), fake((4, 8), np.int8))


def test_gelu_approximate_name():
    with pytest.raises(ValueError, match="argument 'approximate' expected 'none' or 'tanh'"):
        gelu(fake((4, 8)), approximate="fast")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_fused_silu_gate(dtype, rows, n):
    rng = np.random.default_rng(rows * 17 + n)
    x = random_array((rows, n), dtype, rng=rng, scale=3.0)
    g = random_array((rows, n), dtype, rng=rng)
    out = poisoned(x.shape, dtype)
    assert fused_silu_gate(kaionb.asarray(x), kaionb.asarray(g), out=out) is out
    assert_close(out, fused_silu_gate_ref(x, g), dtype=dtype)


@gpu
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_gelu(approximate, dtype, rows, n):
    x = random_array((rows, n), dtype, rng=np.random.default_rng(rows * 19 + n), scale=3.0)
    out = poisoned(x.shape, dtype)
    assert gelu(kaionb.asarray(x), approximate, out=out) is out
    assert_close(out, gelu_ref(x, approximate), dtype=dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_strided_rows(dtype):
    # Every other row, one element in: rows at a stride, off 16-byte alignment.
    rng = np.random.default_rng(9)
    x = random_array((10, 1001), dtype, rng=rng)
    g = random_array((10, 1001), dtype, rng=rng)
    xv, gv = kaionb.asarray(x)[::2, 1:], kaionb.asarray(g)[1::2, :-1]
    assert_close(fused_silu_gate(xv, gv), fused_silu_gate_ref(x[::2, 1:], g[1::2, :-1]),
                 dtype=dtype)
    assert_close(gelu(xv, "tanh"), gelu_ref(x[::2, 1:], "tanh"), dtype=dtype)


@gpu
def test_extreme_values():
    x = np.array([-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4, 3e38], np.float32)
    # Finite everywhere; tails below float32's normal range (GELU(−20) ≈ −6e−88) are 0.
    got = gelu(kaionb.asarray(x)).get()
    np.testing.assert_allclose(got, gelu_ref(x), rtol=1e-6, atol=1e-37)
    with np.errstate(over="ignore"):
        ref = fused_silu_gate_ref(x[:7], np.ones(7))
    got = fused_silu_gate(kaionb.asarray(x[:7]), kaionb.asarray(np.ones(7, np.float32))).get()
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-37)
