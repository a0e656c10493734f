"""rope / rope_bwd / rope_cache: bad input refused before launch and the reference and
frequency tables checked (CPU, fake device arrays); on a GPU every dtype, layout, pair
layout, partial rotary width, strided view, positions form and in place against float64
NumPy with poisoned outputs, the backward on the tape, and torch where it is installed."""

import math

import numpy as np
import pytest

import kaionb
from kaionb import grad
from kaionb.array import bfloat16
from kaionb.kernels.rope import (
    rope,
    rope_bwd,
    rope_cache,
    rope_frequencies,
    rope_ref,
)
from kaionb.testing import assert_close, poisoned, random_array
from kaionb.testing import metadata_array as fake

gpu = pytest.mark.gpu
DTYPES = [np.float32, np.float16, bfloat16]
LAYOUTS = ["bshd", "bhsd"]


def _name(dt):
    return np.dtype(dt).name


def _host_cache(max_seq, half, base=10000.0):
    """float32 cos/sin tables [max_seq, half], as rope_cache makes them (host side)."""
    angles = np.outer(np.arange(max_seq, dtype=np.float64), rope_frequencies(2 * half, base))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _shape(layout, B, S, H, D):
    return (B, S, H, D) if layout == "bshd" else (B, H, S, D)


# ----------------------------------------------------------------------------- CPU: input

def test_integer_x_refused():
    with pytest.raises(TypeError, match="rope: argument 'x' expected dtype"):
        rope(fake((2, 4, 3, 8), np.int32), fake((4, 4)), fake((4, 4)))


def test_integer_cache_refused():
    with pytest.raises(TypeError, match="argument 'cos' expected dtype"):
        rope(fake((2, 4, 3, 8)), fake((4, 4), np.int32), fake((4, 4)))


def test_one_dimensional_x_refused():
    with pytest.raises(ValueError, match=r"argument 'x' expected \[\.\.\., S, H, D\]"):
        rope(fake((8,)), fake((4, 4)), fake((4, 4)))


@pytest.mark.parametrize("table", [(4, 5), (4,), (4, 0)])
def test_cache_shape_checked(table):
    # R = 2 · cos.shape[1] must lie in [2, D].
    with pytest.raises(ValueError, match=r"argument 'cos' expected shape \[max_seq, R/2\] "
                                         r"with 2 <= R <= D = 8"):
        rope(fake((2, 4, 3, 8)), fake(table), fake(table))


def test_sin_must_match_cos():
    with pytest.raises(ValueError, match=r"argument 'sin' expected the shape of 'cos' "
                                         r"\(4, 4\), got \(4, 3\)"):
        rope(fake((2, 4, 3, 8)), fake((4, 4)), fake((4, 3)))


@pytest.mark.parametrize("layout,shape", [("bshd", (2, 9, 3, 8)), ("bhsd", (2, 3, 9, 8))])
def test_cache_shorter_than_sequence(layout, shape):
    with pytest.raises(ValueError, match=r"argument 'cos' expected at least S = 9 rows "
                                         r".*got 8 rows"):
        rope(fake(shape), fake((8, 4)), fake((8, 4)), layout=layout)


def test_unknown_layout():
    with pytest.raises(ValueError, match="argument 'layout' expected 'bshd'"):
        rope(fake((2, 4, 3, 8)), fake((4, 4)), fake((4, 4)), layout="sbhd")


def test_interleaved_must_be_bool():
    with pytest.raises(TypeError, match="argument 'interleaved' expected a bool"):
        rope(fake((2, 4, 3, 8)), fake((4, 4)), fake((4, 4)), interleaved="gptj")


def test_strided_last_axis_refused():
    x = fake((2, 4, 3, 16))._view((2, 4, 3, 8), (768, 192, 64, 8))
    with pytest.raises(ValueError, match="argument 'x' expected a contiguous last axis"):
        rope(x, fake((4, 4)), fake((4, 4)))


def test_batch_axes_must_merge():
    # The first 3 of 6 along the second batch axis: the batch axes have no one stride.
    x = fake((2, 6, 4, 3, 8))[:, :3]
    with pytest.raises(ValueError, match="argument 'x' expected batch axes"):
        rope(x, fake((4, 4)), fake((4, 4)))


@pytest.mark.parametrize("positions,got", [
    ([0, 1, 2, 8], r"values in \[0, 8\]"),
    (np.array([3, -1, 0, 2]), r"values in \[-1, 3\]"),
])
def test_host_positions_outside_the_cache(positions, got):
    with pytest.raises(ValueError, match=r"argument 'positions' expected values in \[0, 8\) "
                                         r".*got " + got):
        rope(fake((2, 4, 3, 8)), fake((8, 4)), fake((8, 4)), positions=positions)


def test_float_positions_refused():
    with pytest.raises(TypeError, match="argument 'positions' expected an integer array"):
        rope(fake((2, 4, 3, 8)), fake((8, 4)), fake((8, 4)), positions=np.arange(4.0))


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 1, 4), ()])
def test_positions_shape_checked(shape):
    with pytest.raises(ValueError, match=r"argument 'positions' expected shape \(S,\) or "
                                         r"batch \+ \(S,\) = \(2, 4\)"):
        rope(fake((2, 4, 3, 8)), fake((8, 4)), fake((8, 4)),
             positions=np.zeros(shape, np.int64))


def test_device_positions_dtype_checked():
    with pytest.raises(TypeError, match="argument 'positions' expected dtype int32 or int64"):
        rope(fake((2, 4, 3, 8)), fake((8, 4)), fake((8, 4)), positions=fake((4,), np.int16))


def test_device_positions_shape_checked_before_any_launch():
    with pytest.raises(ValueError, match="argument 'positions' expected shape"):
        rope(fake((2, 4, 3, 8)), fake((8, 4)), fake((8, 4)), positions=fake((2, 5), np.int32))


def test_partially_overlapping_out_refused():
    x = fake((2, 4, 3, 8))
    shifted = x._view(x.shape, x.strides, offset_bytes=4 * x.itemsize)
    with pytest.raises(ValueError, match="argument 'out' expected x itself"):
        rope(x, fake((4, 4)), fake((4, 4)), out=shifted)


def test_broadcast_out_refused():
    x = fake((2, 4, 3, 8))
    out = fake((2, 4, 1, 8))._view((2, 4, 3, 8), (128, 32, 0, 4))
    with pytest.raises(ValueError, match="argument 'out' expected an array whose elements "
                                         "do not overlap"):
        rope(x, fake((4, 4)), fake((4, 4)), out=out)


def test_out_dtype_checked():
    with pytest.raises(TypeError, match="argument 'out' expected dtype float32"):
        rope(fake((2, 4, 3, 8)), fake((4, 4)), fake((4, 4)),
             out=fake((2, 4, 3, 8), np.float16))


def test_bwd_names_its_gradient():
    with pytest.raises(TypeError, match="rope_bwd: argument 'grad' expected dtype"):
        rope_bwd(fake((2, 4, 3, 8), np.int32), fake((4, 4)), fake((4, 4)))


def test_in_place_refused_while_the_tape_needs_x():
    x = fake((2, 4, 3, 8))
    x.requires_grad = True
    with grad.Tape(), pytest.raises(ValueError, match="argument 'out' expected memory "
                                                      "apart from x"):
        rope(x, fake((4, 4)), fake((4, 4)), out=x)


# ----------------------------------------------------------------------------- CPU: cache

@pytest.mark.parametrize("dim, exc", [(0, ValueError), (7, ValueError), (-2, ValueError),
                                      (4.0, TypeError), (True, TypeError)])
def test_cache_dim_must_be_even(dim, exc):
    # a value that is no int is the wrong kind of thing: TypeError
    with pytest.raises(exc, match="rope_cache: argument 'dim' expected an even integer"):
        rope_cache(16, dim)


def test_cache_seq_len_and_base_checked():
    with pytest.raises(ValueError, match="argument 'seq_len' expected an integer >= 0"):
        rope_cache(-1, 8)
    with pytest.raises(ValueError, match="argument 'base' expected a finite number > 0"):
        rope_cache(4, 8, base=0.0)


@pytest.mark.parametrize("scaling", [
    {"type": "yarn", "factor": 4.0},
    {"factor": 2.0},
    "linear",
    {"type": "linear", "factor": 0},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
])
def test_cache_scaling_checked(scaling):
    with pytest.raises(ValueError, match="rope_cache: argument 'scaling' expected"):
        rope_cache(4, 8, scaling=scaling)


def test_frequencies_are_base_powers():
    dim = 128
    expected = np.array([500000.0 ** (-2 * i / dim) for i in range(dim // 2)])
    np.testing.assert_allclose(rope_frequencies(dim, 500000.0), expected, rtol=1e-15)
    np.testing.assert_allclose(rope_frequencies(dim, 500000.0, {"type": "linear", "factor": 4}),
                               expected / 4, rtol=1e-15)


LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_llama3_frequencies_match_the_published_rule():
    # Meta's apply_scaling (llama-models, Llama 3.1), one frequency at a time.
    def apply_scaling(freq, factor, low, high, old_len):
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            return freq
        if wavelen > old_len / low:
            return freq / factor
        smooth = (old_len / wavelen - low) / (high - low)
        return (1 - smooth) * freq / factor + smooth * freq

    plain = rope_frequencies(128, 500000.0)
    scaled = rope_frequencies(128, 500000.0, LLAMA31)
    expected = [apply_scaling(f, 8.0, 1.0, 4.0, 8192) for f in plain]
    np.testing.assert_allclose(scaled, expected, rtol=1e-15)
    # All three bands occur at Llama 3.1's settings.
    assert (scaled == plain).any() and np.isclose(scaled, plain / 8).any()
    assert ((scaled < plain) & ~np.isclose(scaled, plain / 8)).any()


# ----------------------------------------------------------------------------- CPU: reference

def _complex_rotation(x, cos, sin, positions, interleaved):
    """Another model of RoPE: each pair is a complex number multiplied by e^(i·angle)."""
    half = cos.shape[1]
    angle = np.arctan2(sin, cos)[positions][:, None, :]  # [S, 1, half]
    if interleaved:
        z = x[..., 0:2 * half:2] + 1j * x[..., 1:2 * half:2]
    else:
        z = x[..., :half] + 1j * x[..., half:2 * half]
    z = z * np.exp(1j * angle)
    y = x.astype(np.float64).copy()
    if interleaved:
        y[..., 0:2 * half:2], y[..., 1:2 * half:2] = z.real, z.imag
    else:
        y[..., :half], y[..., half:2 * half] = z.real, z.imag
    return y


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("D,half", [(8, 4), (10, 3)])
def test_reference_is_a_rotation(interleaved, D, half):
    rng = np.random.default_rng(D)
    x = rng.standard_normal((2, 5, 3, D))
    cos, sin = _host_cache(9, half)
    positions = np.array([8, 0, 3, 3, 1])
    y = rope_ref(x, cos, sin, positions, interleaved)
    np.testing.assert_allclose(y, _complex_rotation(x, cos.astype(np.float64),
                                                    sin.astype(np.float64), positions,
                                                    interleaved), atol=1e-6)
    # The inverse undoes it; the pass-through features are x's.
    np.testing.assert_allclose(rope_ref(y, cos, sin, positions, interleaved, inverse=True), x,
                               atol=1e-6)
    np.testing.assert_array_equal(y[..., 2 * half:], x[..., 2 * half:])
    # bhsd is the same rotation on the transposed array.
    yt = rope_ref(x.transpose(0, 2, 1, 3), cos, sin, positions, interleaved, layout="bhsd")
    np.testing.assert_allclose(yt, y.transpose(0, 2, 1, 3), atol=1e-12)


# ----------------------------------------------------------------------------- GPU

def check(x, cos, sin, ref_x=None, *, dtype, out=None, **kw):
    """rope(x, ...) into a poisoned out (unless given) against rope_ref of the host data
    (``ref_x``: the host array x views); returns the result on the host."""
    out = poisoned(x.shape, dtype) if out is None else out
    got = rope(x, kaionb.asarray(cos), kaionb.asarray(sin), out=out, **kw)
    assert got is out
    positions = kw.get("positions")
    if positions is not None and not isinstance(positions, (np.ndarray, list)):
        positions = positions.get()
    ref = rope_ref(ref_x, cos, sin, positions, kw.get("interleaved", False),
                   kw.get("layout", "bshd"))
    assert_close(out, ref, dtype=dtype)
    return out.get()


# (D, R): R = D, partial R (GPT-NeoX rotary_pct 0.25, Phi's 32 of 80), and widths that are
# no multiple of a 16-byte word.
WIDTHS = [(64, 64), (128, 128), (80, 80), (96, 96), (128, 32), (80, 32), (20, 14), (12, 6)]


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("D,R", WIDTHS)
@pytest.mark.parametrize("S", [1, 37])
def test_rope(dtype, layout, interleaved, D, R, S):
    rng = np.random.default_rng(D * 1000 + R * 10 + S)
    x = random_array(_shape(layout, 2, S, 3, D), dtype, rng=rng)
    cos, sin = _host_cache(S + 5, R // 2)
    got = check(kaionb.asarray(x), cos, sin, x, dtype=dtype, layout=layout,
                interleaved=interleaved)
    # The pass-through features are copied bit for bit.
    assert np.array_equal(_bits(got[..., R:]), _bits(x[..., R:]))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_q_and_k_from_a_fused_qkv_buffer(dtype, interleaved):
    B, S, H, D = 2, 37, 3, 128
    rng = np.random.default_rng(7)
    qkv = random_array((B, S, 3 * H, D), dtype, rng=rng)
    cos, sin = _host_cache(64, D // 2)
    d_qkv = kaionb.asarray(qkv)
    # q out of place from a strided view...
    check(d_qkv[:, :, :H], cos, sin, qkv[:, :, :H], dtype=dtype, interleaved=interleaved)
    # ... and k rotated in place inside the buffer: q and v untouched.
    k = d_qkv[:, :, H:2 * H]
    assert rope(k, kaionb.asarray(cos), kaionb.asarray(sin), interleaved=interleaved,
                out=k) is k
    after = d_qkv.get()
    assert_close(after[:, :, H:2 * H], rope_ref(qkv[:, :, H:2 * H], cos, sin,
                                                interleaved=interleaved), dtype=dtype)
    for part in (slice(0, H), slice(2 * H, 3 * H)):
        assert np.array_equal(_bits(after[:, :, part]), _bits(qkv[:, :, part]))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_in_place_partial_rotary(dtype, layout):
    rng = np.random.default_rng(3)
    x = random_array(_shape(layout, 2, 37, 3, 80), dtype, rng=rng)
    cos, sin = _host_cache(40, 16)  # R = 32 of D = 80
    d = kaionb.asarray(x)
    assert rope(d, kaionb.asarray(cos), kaionb.asarray(sin), layout=layout, out=d) is d
    got = d.get()
    assert_close(got, rope_ref(x, cos, sin, layout=layout), dtype=dtype)
    assert np.array_equal(_bits(got[..., 32:]), _bits(x[..., 32:]))


@gpu
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_bhsd_view_of_bshd_memory_and_reversed_sequence(interleaved):
    rng = np.random.default_rng(4)
    x = random_array((2, 37, 3, 64), np.float16, rng=rng)
    cos, sin = _host_cache(37, 32)
    d = kaionb.asarray(x)
    check(d.transpose(0, 2, 1, 3), cos, sin, x.transpose(0, 2, 1, 3), dtype=np.float16,
          layout="bhsd", interleaved=interleaved)
    check(d[:, ::-1], cos, sin, x[:, ::-1], dtype=np.float16, interleaved=interleaved)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_rows_off_16_byte_alignment(dtype, interleaved):
    # The last axis starts one element into its buffer: every row is misaligned.
    rng = np.random.default_rng(5)
    base = random_array((2, 9, 3, 65), dtype, rng=rng)
    cos, sin = _host_cache(9, 32)
    check(kaionb.asarray(base)[..., 1:], cos, sin, base[..., 1:], dtype=dtype,
          interleaved=interleaved)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", ["host [S]", "host [B, S]", "host [1, S]", "int32 [B, S]",
                                  "int64 [S]", "int64 strided [B, S]"])
def test_positions(dtype, layout, form):
    B, S, H, D = 3, 37, 3, 96
    rng = np.random.default_rng(6)
    x = random_array(_shape(layout, B, S, H, D), dtype, rng=rng)
    cos, sin = _host_cache(200, D // 2)
    where, shape = form.split(" ", 1)
    host = {"[S]": rng.integers(0, 200, S), "[B, S]": rng.integers(0, 200, (B, S)),
            "[1, S]": rng.integers(0, 200, (1, S)),
            "strided [B, S]": rng.integers(0, 200, (B, 2 * S))}[shape]
    if where == "host":
        positions = host
    else:
        positions = kaionb.asarray(host.astype(np.int32 if where == "int32" else np.int64))
        if shape == "strided [B, S]":
            positions = positions[:, ::2]  # every other column: a strided device array
    check(kaionb.asarray(x), cos, sin, x, dtype=dtype, layout=layout, positions=positions)


@gpu
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_decode_step_positions_offset(interleaved):
    # One new token per sequence at its own offset (a KV-cache decode step), batch of 4.
    B, H, D = 4, 8, 128
    rng = np.random.default_rng(8)
    x = random_array((B, 1, H, D), bfloat16, rng=rng)
    cos, sin = _host_cache(4096, D // 2)
    offsets = np.array([[17], [4095], [0], [1000]], np.int64)
    check(kaionb.asarray(x), cos, sin, x, dtype=bfloat16, interleaved=interleaved,
          positions=kaionb.asarray(offsets))


@gpu
def test_batch_axes_and_single_head_shapes():
    rng = np.random.default_rng(9)
    cos, sin = _host_cache(37, 8)
    x5 = random_array((2, 2, 37, 3, 16), np.float32, rng=rng)
    positions = rng.integers(0, 37, (2, 1, 37))
    check(kaionb.asarray(x5), cos, sin, x5, dtype=np.float32, positions=positions)
    x2 = random_array((37, 16), np.float16, rng=rng)  # [S, D]: one head
    check(kaionb.asarray(x2), cos, sin, x2, dtype=np.float16, interleaved=True)


@gpu
@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=_name)
def test_cache_in_the_half_type(dtype):
    rng = np.random.default_rng(10)
    x = random_array((2, 37, 3, 64), dtype, rng=rng)
    cos, sin = _host_cache(37, 32)
    c16, s16 = cos.astype(dtype), sin.astype(dtype)
    out = rope(kaionb.asarray(x), kaionb.asarray(c16), kaionb.asarray(s16))
    assert_close(out, rope_ref(x, c16.astype(np.float32), s16.astype(np.float32)), dtype=dtype)


@gpu
def test_device_positions_outside_the_cache_refused():
    x = kaionb.asarray(random_array((2, 4, 3, 16), np.float32))
    cos, sin = (kaionb.asarray(t) for t in _host_cache(8, 8))
    good = kaionb.asarray(np.array([0, 1, 2, 7], np.int32))
    rope(x, cos, sin, positions=good)  # records the fast path for this signature
    for bad, got in (([0, 1, 8, 2], r"\[0, 8\]"), ([0, -3, 1, 2], r"\[-3, 2\]")):
        for dt in (np.int32, np.int64):
            with pytest.raises(ValueError, match=r"argument 'positions' expected values in "
                                                 r"\[0, 8\) .*got values in " + got):
                rope(x, cos, sin, positions=kaionb.asarray(np.array(bad, dt)))
    # Unchecked, an out-of-range token comes out NaN and its neighbours are right.
    bad = np.array([0, 1, 99, 2], np.int32)
    out = rope(x, cos, sin, positions=kaionb.asarray(bad), check_positions=False).get()
    assert np.isnan(out[:, 2]).all() and np.isfinite(np.delete(out, 2, axis=1)).all()
    ok = rope_ref(x.get(), *_host_cache(8, 8), np.array([0, 1, 0, 2]))
    assert_close(np.delete(out, 2, axis=1), np.delete(ok, 2, axis=1), dtype=np.float32)
    rope(x, cos, sin, positions=good)  # the context is still usable


@gpu
def test_repeated_calls_follow_new_positions_and_are_deterministic():
    rng = np.random.default_rng(12)
    x_host = random_array((2, 37, 3, 128), np.float16, rng=rng)
    x = kaionb.asarray(x_host)
    cos_h, sin_h = _host_cache(300, 64)
    cos, sin = kaionb.asarray(cos_h), kaionb.asarray(sin_h)
    for offset in (0, 5, 250):  # one signature: later calls replay the first
        positions = kaionb.asarray(np.arange(37, dtype=np.int32) + offset)
        out = rope(x, cos, sin, positions=positions)
        assert_close(out, rope_ref(x_host, cos_h, sin_h, np.arange(37) + offset),
                     dtype=np.float16)
        assert np.array_equal(out.get(), rope(x, cos, sin, positions=positions).get())


@gpu
def test_empty_input():
    cos, sin = (kaionb.asarray(t) for t in _host_cache(8, 8))
    out = rope(kaionb.empty((2, 0, 3, 16), np.float16), cos, sin)
    assert out.shape == (2, 0, 3, 16)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_bwd_is_the_inverse_rotation(dtype, interleaved):
    rng = np.random.default_rng(13)
    g = random_array((2, 3, 37, 80), dtype, rng=rng)
    cos, sin = _host_cache(37, 24)
    positions = rng.integers(0, 37, 37)
    out = poisoned(g.shape, dtype)
    rope_bwd(kaionb.asarray(g), kaionb.asarray(cos), kaionb.asarray(sin), positions=positions,
             interleaved=interleaved, layout="bhsd", out=out)
    assert_close(out, rope_ref(g, cos, sin, positions, interleaved, "bhsd", inverse=True),
                 dtype=dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_tape_gradient(dtype, interleaved):
    rng = np.random.default_rng(14)
    x_host = random_array((2, 37, 3, 80), dtype, rng=rng)
    cos_h, sin_h = _host_cache(64, 16)
    positions = rng.integers(0, 64, (2, 37))
    x = kaionb.asarray(x_host)
    x.requires_grad = True
    cos, sin = kaionb.asarray(cos_h), kaionb.asarray(sin_h)
    weights = rng.standard_normal(x_host.shape).astype(np.float32)
    with grad.Tape() as tape:
        y = rope(x, cos, sin, positions=positions, interleaved=interleaved)
    tape.backward(y, kaionb.asarray(weights))
    assert x.grad.dtype == np.float32 and x.grad.shape == x.shape
    # dL/dx for L = Σ w·rope(x): w rotated back, float32 all the way.
    assert_close(x.grad, rope_ref(weights, cos_h, sin_h, positions, interleaved, inverse=True),
                 dtype=np.float32)
    if dtype == np.float32:
        x.grad = None
        assert grad.gradcheck(lambda v: rope(v, cos, sin, positions=positions,
                                             interleaved=interleaved), [x]) < 2e-2


@gpu
@pytest.mark.parametrize("scaling", [None, {"type": "linear", "factor": 4.0}, LLAMA31],
                         ids=["plain", "linear", "llama3"])
def test_cache_values(scaling):
    cos, sin = rope_cache(9000, 128, 500000.0, scaling)
    assert cos.dtype == sin.dtype == np.float32 and cos.shape == sin.shape == (9000, 64)
    angles = np.outer(np.arange(9000.0), rope_frequencies(128, 500000.0, scaling))
    np.testing.assert_allclose(cos.get(), np.cos(angles), atol=6e-8)
    np.testing.assert_allclose(sin.get(), np.sin(angles), atol=6e-8)
    if scaling is not None and scaling.get("type") == "linear":
        plain = np.outer(np.arange(9000.0) / 4.0, rope_frequencies(128, 500000.0))
        np.testing.assert_allclose(cos.get(), np.cos(plain), atol=6e-8)


def _torch_rope(torch, x, cos, sin, positions, interleaved):
    """Hugging Face's rotate_half form (NeoX) and GPT-J's rotate_every_two, float64,
    for [B, S, H, D] with cos/sin duplicated to R as those implementations store them."""
    x = torch.from_numpy(np.asarray(x, np.float64))
    c = torch.from_numpy(cos.astype(np.float64))[positions][:, :, None, :]
    s = torch.from_numpy(sin.astype(np.float64))[positions][:, :, None, :]
    R = 2 * cos.shape[1]
    rot, rest = x[..., :R], x[..., R:]
    if interleaved:
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
        pairs = torch.stack((-rot[..., 1::2], rot[..., ::2]), dim=-1).flatten(-2)
    else:
        c, s = torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)
        pairs = torch.cat((-rot[..., R // 2:], rot[..., :R // 2]), dim=-1)
    return torch.cat((rot * c + pairs * s, rest), dim=-1).numpy()


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_matches_torch(dtype, interleaved):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(15)
    B, S, H, D, R = 2, 37, 3, 96, 64
    x = random_array((B, S, H, D), dtype, rng=rng)
    cos, sin = _host_cache(128, R // 2)
    positions = rng.integers(0, 128, (B, S))
    out = rope(kaionb.asarray(x), kaionb.asarray(cos), kaionb.asarray(sin),
               positions=positions, interleaved=interleaved)
    assert_close(out, _torch_rope(torch, x, cos, sin, torch.from_numpy(positions), interleaved),
                 dtype=dtype)
