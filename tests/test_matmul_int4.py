"""kaionb.matmul_int4 / qkv_project_int4 / dequantize_int4 (W4A16, GPTQ): the packed layout
and the checkpoint reader against loop-built models and bad input refused before any
launch (CPU); on the GPU every group size, symmetric and asymmetric weights, act order,
f16 / bf16 activations, odd shapes and both kernels (streaming and dequantize + dense)
against float64 on the dequantized weights, outputs poisoned."""

import ml_dtypes
import numpy as np
import pytest

import kaionb
from kaionb._device import STATE
from kaionb.array import DeviceArray, bfloat16
from kaionb.kernels import matmul_int4 as mi
from kaionb.kernels.helpers.int4 import UNIT_K, WORDS_PER_UNIT
from kaionb.testing import poisoned, relative_error

gpu = pytest.mark.gpu
F16, F32, U32 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.uint32)
# ‖out − ref‖ / ‖ref‖ against float64 on the same dequantized weights: the output's own
# rounding plus float32 accumulation.
TOL = {F32: 1e-5, F16: 2e-3, bfloat16: 1e-2}
RNG = np.random.default_rng(20261124)


def _codes(k, n, groups, rng, asym):
    q = rng.integers(0, 16, (k, n)).astype(np.uint8)
    scales = rng.uniform(0.5, 2.0, (groups, n)).astype(np.float16) * np.float16(1e-2)
    zeros = rng.integers(0, 17, (groups, n)).astype(np.uint8) if asym else None
    return q, scales, zeros


def _dequantized(q, scales, zeros, group_size, g_idx=None):
    """float64 W = s · (q − z) with the group of each row, in float16 (one rounding)."""
    k = q.shape[0]
    rows = g_idx if g_idx is not None else np.arange(k) // (k if group_size == -1 else group_size)
    z = 8 if zeros is None else zeros[rows].astype(np.float64)
    w = scales[rows].astype(np.float64) * (q.astype(np.float64) - z)
    return w.astype(np.float16)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("k, n, group_size, asym", [
    (128, 16, 128, False), (192, 40, 64, True), (96, 7, 32, True), (100, 33, -1, False),
    (4096, 72, 128, True)])
def test_pack_round_trip(k, n, group_size, asym):
    groups = 1 if group_size == -1 else k // group_size
    q, scales, zeros = _codes(k, n, groups, RNG, asym)
    words, s_words, z_words = mi.pack_host(q, scales, zeros, group_size)
    assert words.shape == (-(-n // 16), -(-k // UNIT_K) * WORDS_PER_UNIT)
    q2, s2, z2 = mi.unpack_host(words, s_words, z_words, (k, n), group_size)
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(s2.view(np.uint16), scales.view(np.uint16))
    if asym:
        np.testing.assert_array_equal(z2, zeros)
    else:
        assert z_words is None and z2 is None


def test_packed_words_follow_the_fragment_layout():
    """Word 4·lane + i of unit u of strip s, nibble j: W[64u + 16i + 2t + j%2 + 8·(j//2 %
    2), 16s + g + 8·(j//4)] as q − 8 (g = lane // 4, t = lane % 4) — loops, no reshapes."""
    k, n = 128, 32
    q, scales, _ = _codes(k, n, 1, RNG, False)
    words, s_words, _ = mi.pack_host(q, scales, None, -1)
    for s in range(n // 16):
        for u in range(k // 64):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for i in range(4):
                    word = int(words[s, u * 128 + 4 * lane + i])
                    for j in range(8):
                        row = 64 * u + 16 * i + 2 * t + j % 2 + 8 * ((j // 2) % 2)
                        col = 16 * s + g + 8 * (j // 4)
                        assert (word >> (4 * j)) & 0xF == (int(q[row, col]) - 8) & 0xF
            for g in range(8):
                pair = int(s_words[0, 8 * s + g])
                assert pair & 0xFFFF == int(scales[0, 16 * s + g].view(np.uint16))
                assert pair >> 16 == int(scales[0, 16 * s + 8 + g].view(np.uint16))


def _gptq_tensors(q, zeros, format="gptq"):
    """A checkpoint's qweight / qzeros built bit by bit (AutoGPTQ's order)."""
    k, n = q.shape
    qweight = np.zeros((k // 8, n), np.uint32)
    for r in range(k):
        for c in range(n):
            qweight[r // 8, c] |= np.uint32(int(q[r, c]) << (4 * (r % 8)))
    stored = zeros.astype(np.int64) - (1 if format == "gptq" else 0)
    qzeros = np.zeros((zeros.shape[0], -(-n // 8)), np.uint32)
    for g in range(zeros.shape[0]):
        for c in range(n):
            qzeros[g, c // 8] |= np.uint32(int(stored[g, c]) << (4 * (c % 8)))
    return qweight.view(np.int32), qzeros.view(np.int32)


@pytest.mark.parametrize("format", ["gptq", "gptq_v2"])
def test_gptq_bit_order(format):
    k, n, g = 64, 24, 32
    q = RNG.integers(0, 16, (k, n)).astype(np.uint8)
    zeros = RNG.integers(1, 16, (k // g, n)).astype(np.uint8)
    qweight, qzeros = _gptq_tensors(q, zeros, format)
    q2, z2 = mi.gptq_codes(qweight, qzeros, k // g, n, format)
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(z2, zeros)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group_size", [32, 128, -1])
def test_quantize_error_is_half_a_step(symmetric, group_size):
    k, n = 256, 48
    w = (RNG.standard_normal((k, n)) * RNG.uniform(0.1, 3, n)).astype(np.float32)
    w[:, 0] = 0.0  # an all-zero column: scale 0, exact zeros
    q, s16, zeros = mi.quantize_int4_host("quantize_int4", w, group_size, symmetric)
    assert q.max() <= 15 and (zeros is None) == symmetric
    rows = np.arange(k) // (k if group_size == -1 else group_size)
    s = s16.astype(np.float64)[rows]
    z = 8 if symmetric else zeros.astype(np.float64)[rows]
    err = np.abs(w - s * (q.astype(np.float64) - z))
    # Round to nearest; asymmetric: the rounded zero shifts the grid by up to half a step,
    # so the group's extreme may be clipped by that much more.
    bound = s / 2 if symmetric else s
    assert np.all(err <= bound * (1 + 1e-3) + 1e-12)
    assert np.all(s16[:, 0] == 0) and np.all(err[:, 0] == 0)


def _fake(shape, dtype, device=0):
    """A DeviceArray header with no memory: validation never touches the data."""
    dt = np.dtype(dtype)
    strides = tuple(int(s) for s in np.empty(shape, dt).strides)
    return DeviceArray(tuple(shape), dt, strides, 256, None, device)


def _fake_weight(k=128, n=32, group_size=128):
    groups = 1 if group_size == -1 else -(-k // group_size)
    return mi.Int4Weight(_fake((-(-n // 16), -(-k // 64) * 128), U32),
                         _fake((groups, -(-n // 16) * 8), U32), None, None, (k, n), group_size)


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(a=_fake((4, 128), F32)), TypeError, r"argument 'a' expected float16 or bfloat16"),
    (dict(a=_fake((4, 100), F16)), ValueError, r"argument 'a' expected last dimension 128"),
    (dict(w=np.zeros((128, 32), np.int8)), TypeError, r"argument 'w' expected an Int4Weight"),
    (dict(dtype=np.int32), TypeError, r"argument 'dtype' expected float32, float16"),
    (dict(out=_fake((4, 33), F16)), ValueError, r"argument 'out'"),
    (dict(w=_fake_weight(), a=_fake((4, 128), F16, device=1)), ValueError,
     r"argument 'w' expected device 1 \(where 'a' is\), got device 0"),
])
def test_matmul_bad_input_is_refused_before_launch(kwargs, exc, pattern):
    args = dict(a=_fake((4, 128), F16), w=_fake_weight())
    args.update(kwargs)
    a, w = args.pop("a"), args.pop("w")
    with pytest.raises(exc, match="matmul_int4: " + pattern):
        kaionb.matmul_int4(a, w, **args)


@pytest.mark.parametrize("weights, pattern", [
    ((_fake_weight(), _fake_weight(n=16), _fake_weight(n=8)), r"argument 'w_v' expected N = 16"),
    ((_fake_weight(), _fake_weight(k=256), _fake_weight()), r"argument 'w_k' expected K = 128"),
    ((_fake_weight(), None, _fake_weight()), r"argument 'w_k' expected an Int4Weight"),
])
def test_qkv_bad_input_is_refused_before_launch(weights, pattern):
    with pytest.raises((TypeError, ValueError), match="qkv_project_int4: " + pattern):
        kaionb.qkv_project_int4(_fake((2, 128), F16), *weights)


@pytest.mark.parametrize("call, exc, pattern", [
    (lambda: kaionb.pack_int4(np.full((64, 8), 16), np.ones((1, 8)), group_size=64),
     ValueError, r"pack_int4: argument 'q' expected codes in 0 \.\. 15"),
    (lambda: kaionb.pack_int4(np.zeros((64, 8), np.uint8), np.ones((2, 8)), group_size=64),
     ValueError, r"argument 'scales' expected shape \(1, 8\)"),
    (lambda: kaionb.pack_int4(np.zeros((64, 8), np.uint8), np.ones((2, 8)), group_size=48),
     ValueError, r"argument 'group_size' expected -1 \(per channel\) or a power of two"),
    (lambda: kaionb.pack_int4(np.zeros((96, 8), np.uint8), np.ones((1, 8)), group_size=64),
     ValueError, r"argument 'group_size' expected a divisor of K = 96"),
    (lambda: kaionb.pack_int4(np.zeros((64, 8), np.float32), np.ones((1, 8)), group_size=64),
     TypeError, r"argument 'q' expected integer codes"),
    (lambda: kaionb.pack_int4(np.zeros((64, 8), np.uint8), np.ones((1, 8)),
                              np.full((1, 8), 17), group_size=64),
     ValueError, r"argument 'zeros' expected zero points in 0 \.\. 16"),
    (lambda: kaionb.pack_int4(np.zeros((64, 8), np.uint8), np.ones((2, 8)), group_size=32,
                              g_idx=np.zeros(64, np.int32)),
     ValueError, r"argument 'g_idx' expected each group 0 \.\. 1 on exactly 32 rows"),
    (lambda: kaionb.pack_int4.from_gptq(np.zeros((8, 16), np.int32), np.zeros((1, 3), np.int32),
                                        np.ones((1, 16), np.float16), group_size=64),
     ValueError, r"from_gptq: argument 'qzeros' expected shape \(1, 2\)"),
    (lambda: kaionb.pack_int4.from_gptq(np.zeros((8, 16), np.int64), np.zeros((1, 2), np.int32),
                                        np.ones((1, 16), np.float16), group_size=64),
     TypeError, r"from_gptq: argument 'qweight' expected int32"),
    (lambda: kaionb.pack_int4.from_gptq(np.zeros((8, 16), np.int32), np.zeros((1, 2), np.int32),
                                        np.ones((1, 16), np.float16), format="awq"),
     ValueError, r"from_gptq: argument 'format' expected 'gptq' or 'gptq_v2'"),
    (lambda: kaionb.quantize_int4(np.ones((64, 8), np.int8)), TypeError,
     r"quantize_int4: argument 'w' expected float16, bfloat16 or float32"),
    (lambda: kaionb.quantize_int4(np.full((128, 8), np.inf, np.float32)), ValueError,
     r"quantize_int4: argument 'w' expected finite values"),
])
def test_packing_bad_input(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# ----------------------------------------------------------------------------- GPU


def _weight(k, n, group_size, asym, rng, act_order=False):
    """(Int4Weight, float16 W [K, N] as float64-rounded once) from random codes."""
    groups = 1 if group_size == -1 else k // group_size
    q, scales, zeros = _codes(k, n, groups, rng, asym)
    g_idx = None
    if act_order:
        g_idx = (np.arange(k) // (k if group_size == -1 else group_size))[rng.permutation(k)]
        g_idx = g_idx.astype(np.int32)
    w = kaionb.pack_int4(q, scales, zeros, group_size=group_size, g_idx=g_idx)
    return w, _dequantized(q, scales, zeros, group_size, g_idx)


def _activations(shape, dtype, rng):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _check(out, x, w16, tol_dtype):
    ref = np.matmul(np.asarray(x, np.float64), np.asarray(w16, np.float64))
    err = relative_error(out, ref)
    assert err < TOL[tol_dtype], err


@gpu
@pytest.mark.parametrize("m, n, k, group_size", [
    (1, 37, 128, 128), (3, 200, 384, 128), (16, 264, 1024, 64), (17, 130, 512, 32),
    (33, 48, 256, 128), (64, 520, 640, 128), (100, 72, 96, 32), (1, 24, 100, -1),
    (130, 200, 256, 128), (300, 40, 512, -1)])
@pytest.mark.parametrize("asym", [False, True])
@pytest.mark.parametrize("dtype", [F16, bfloat16])
def test_matmul_against_float64(m, n, k, group_size, asym, dtype):
    w, w16 = _weight(k, n, group_size, asym, RNG)
    x = _activations((m, k), dtype, RNG)
    out = poisoned((m, n), dtype)
    kaionb.matmul_int4(kaionb.asarray(x), w, out=out)
    w_ref = w16 if dtype == F16 else mi.dequantize_int4_ref(w, bfloat16)
    _check(out.get(), x, w_ref, dtype)


@gpu
@pytest.mark.parametrize("m", [1, 9, 40, 200])
def test_act_order_checkpoint(m):
    """A GPTQ checkpoint with act order, read from its packed tensors: matches W built
    from the checkpoint's own formula, float32 output."""
    k, n, g = 512, 96, 128
    rng = np.random.default_rng(m)
    q = rng.integers(0, 16, (k, n)).astype(np.uint8)
    zeros = rng.integers(1, 16, (k // g, n)).astype(np.uint8)
    scales = (rng.uniform(0.5, 2, (k // g, n)) * 1e-2).astype(np.float16)
    g_idx = (np.arange(k) // g)[rng.permutation(k)].astype(np.int32)
    qweight, qzeros = _gptq_tensors(q, zeros)
    w = kaionb.pack_int4.from_gptq(qweight, qzeros, scales, g_idx, group_size=g)
    assert w.act_order and not w.symmetric
    w16 = _dequantized(q, scales, zeros, g, g_idx)
    np.testing.assert_array_equal(kaionb.dequantize_int4(w).get().view(np.uint16),
                                  w16.view(np.uint16))
    x = _activations((m, k), F16, rng)
    out = poisoned((m, n), F32)
    kaionb.matmul_int4(kaionb.asarray(x), w, out=out)
    _check(out.get(), x, w16, F32)


@gpu
@pytest.mark.parametrize("group_size, asym, act_order", [
    (32, True, False), (128, False, True), (-1, True, False)])
@pytest.mark.parametrize("dtype", [F16, bfloat16])
def test_dequantize_is_bit_exact(group_size, asym, act_order, dtype):
    w, w16 = _weight(256, 56, group_size, asym, RNG, act_order)
    got = kaionb.dequantize_int4(w, dtype).get()
    ref = w16 if dtype == F16 else mi.dequantize_int4_ref(w, bfloat16)
    np.testing.assert_array_equal(got.view(np.uint16), np.asarray(ref).view(np.uint16))


@gpu
def test_split_k_repeats_are_bit_identical(monkeypatch):
    """Split-K (forced deep) folds in split order: the same bits every call, equal to
    the unsplit result within rounding."""
    w, w16 = _weight(2048, 136, 128, True, RNG)
    x = kaionb.asarray(_activations((5, 2048), F16, RNG))
    STATE.calls = None  # replays would keep the old plan
    monkeypatch.setattr(mi, "TARGET_BLOCKS_PER_SM", {mt: 64.0 for mt in (1, 2, 4)})
    first = kaionb.matmul_int4(x, w, dtype=F32).get()
    for _ in range(3):
        np.testing.assert_array_equal(kaionb.matmul_int4(x, w, dtype=F32).get(), first)
    STATE.calls = None
    _check(first, x.get(), w16, F32)


@gpu
def test_batched_and_strided_activations():
    w, w16 = _weight(256, 40, 64, False, RNG)
    x = _activations((2, 3, 260), F16, RNG)
    out = kaionb.matmul_int4(kaionb.asarray(x)[..., 3:259], w)  # batched: copied rows
    assert out.shape == (2, 3, 40) and out.dtype == F16
    _check(out.get(), x[..., 3:259], w16, F16)
    x2 = _activations((5, 264), bfloat16, RNG)
    for cols in (slice(3, 259), slice(8, 264)):  # rows read in place: element / cp.async
        out = poisoned((5, 40), F32)
        kaionb.matmul_int4(kaionb.asarray(x2)[:, cols], w, out=out)
        _check(out.get(), x2[:, cols], mi.dequantize_int4_ref(w, bfloat16), F32)


@gpu
@pytest.mark.parametrize("m", [1, 2, 16, 150])
@pytest.mark.parametrize("dtype", [F16, bfloat16])
def test_qkv_projection(m, dtype):
    """GQA widths, per-weight group sizes / zero points / act order, one launch (≤
    STREAM_MAX_M rows) or three GEMMs; outputs poisoned."""
    k = 512
    weights = [_weight(k, 256, 128, False, RNG), _weight(k, 72, 64, True, RNG, act_order=True),
               _weight(k, 72, -1, True, RNG)]
    x = _activations((m, k), dtype, RNG)
    outs = tuple(poisoned((m, n), dtype) for n in (256, 72, 72))
    got = kaionb.qkv_project_int4(kaionb.asarray(x), *(w for w, _ in weights), out=outs)
    assert all(g is o for g, o in zip(got, outs))
    for o, (w, w16) in zip(outs, weights):
        _check(o.get(), x, w16 if dtype == F16 else mi.dequantize_int4_ref(w, bfloat16), dtype)


@gpu
def test_qkv_new_outputs_and_dtype():
    k = 256
    weights = [_weight(k, n, 128, False, RNG) for n in (64, 32, 32)]
    x = _activations((3, k), F16, RNG)
    q, kk, v = kaionb.qkv_project_int4(kaionb.asarray(x), *(w for w, _ in weights), dtype=F32)
    for o, (_, w16) in zip((q, kk, v), weights):
        assert o.dtype == F32
        _check(o.get(), x, w16, F32)


@gpu
def test_quantize_then_matmul_tracks_the_float_matmul():
    """quantize_int4 of a float weight: the int4 matmul is the float matmul on the
    dequantized weight, and within 4-bit error of the original."""
    k, n = 1024, 96
    wf = RNG.standard_normal((k, n)).astype(np.float32)
    x = _activations((4, k), F16, RNG)
    for symmetric in (True, False):
        w = kaionb.quantize_int4(wf, 128, symmetric)
        assert w.symmetric == symmetric and w.shape == (k, n)
        out = kaionb.matmul_int4(kaionb.asarray(x), w, dtype=F32).get()
        _check(out, x, kaionb.dequantize_int4(w).get(), F32)
        assert relative_error(out, np.asarray(x, np.float64) @ wf) < 0.2  # 4-bit RTN: ~0.12


@gpu
def test_context_usable_after_bad_input():
    w, w16 = _weight(128, 16, 128, False, RNG)
    with pytest.raises(ValueError):
        kaionb.matmul_int4(kaionb.asarray(_activations((2, 64), F16, RNG)), w)
    x = _activations((2, 128), F16, RNG)
    _check(kaionb.matmul_int4(kaionb.asarray(x), w).get(), x, w16, F16)
