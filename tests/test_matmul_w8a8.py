"""kaionb.matmul_int8 (W8A8): bad input refused before any launch (CPU), and on the GPU
every scale mode, bias, output dtype and operand layout against the exact reference
(integer sums, then the scales in float64), at shapes that are multiples of no tile."""

import numpy as np
import pytest

import kaionb
from kaionb._device import STATE
from kaionb.array import DeviceArray, bfloat16
from kaionb.kernels import matmul as mm
from kaionb.kernels import matmul_int8 as mi
from kaionb.kernels.helpers import weight_stream as ws
from kaionb.testing import poisoned, relative_error

gpu = pytest.mark.gpu
I8, F32 = np.dtype(np.int8), np.dtype(np.float32)
TOL = {np.dtype(np.float32): 1e-6, np.dtype(np.float16): 2e-3, bfloat16: 1e-2}


def _fake(shape, dtype=I8, device=0):
    """A DeviceArray header with no memory: validation never touches the data."""
    dt = np.dtype(dtype)
    strides = tuple(int(s) for s in np.empty(shape, dt).strides)
    return DeviceArray(tuple(shape), dt, strides, 256, None, device)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(a=_fake((8, 16), np.float16)), TypeError, r"argument 'a' expected dtype int8"),
    (dict(b=_fake((16, 4), np.float16)), TypeError, r"argument 'b' expected dtype int8"),
    (dict(b=_fake((2, 16, 4))), ValueError, r"argument 'b' expected a 2-D array"),
    (dict(b=_fake((15, 4))), ValueError, r"argument 'b' expected 16 rows"),
    (dict(scale=(1.0,)), ValueError, r"argument 'scale' expected a float, a 0-d array or a pair"),
    (dict(scale=_fake((8,), F32)), ValueError, r"argument 'scale' expected a float"),
    (dict(scale=_fake((), np.float64)), TypeError, r"argument 'scale' expected dtype float32"),
    (dict(scale=(_fake((7,), F32), 1.0)), ValueError, r"argument 'scale_a' expected .*\(8,\)"),
    (dict(scale=(1.0, _fake((5,), F32))), ValueError, r"argument 'scale_b' expected .*\(4,\)"),
    (dict(scale=(1.0, _fake((4,), np.int32))), TypeError, r"argument 'scale_b' expected dtype float32"),
    (dict(scale=(np.float64(1.0), np.ones(1, np.float16))), TypeError, r"argument 'scale_b' expected float32"),
    (dict(scale=("x", 1.0)), TypeError, r"argument 'scale_a'"),
    (dict(bias=_fake((5,), F32)), ValueError, r"argument 'bias' expected shape \(4,\)"),
    (dict(bias=_fake((4,), np.int32)), TypeError, r"argument 'bias' expected dtype"),
    (dict(dtype=np.int32), TypeError, r"argument 'dtype' expected float32, float16"),
    (dict(out=_fake((8, 5), F32)), ValueError, r"argument 'out'"),
    (dict(a=_fake((8, 0)), b=_fake((0, 4))), ValueError, r"argument 'a' expected K ≥ 1"),
])
def test_bad_input_is_refused_before_launch(kwargs, exc, pattern):
    args = dict(a=_fake((8, 16)), b=_fake((16, 4)), scale=0.5)
    args.update(kwargs)
    a, b, scale = args.pop("a"), args.pop("b"), args.pop("scale")
    with pytest.raises(exc, match="matmul_int8: " + pattern):
        kaionb.matmul_int8(a, b, scale, **args)


def test_reference_is_exact_at_saturation():
    k = 4100
    a = np.full((3, k), -128, np.int8)
    b = np.full((k, 2), -128, np.int8)
    assert np.all(mi.matmul_int8_ref(a, b, 1.0) == k * 16384)
    assert np.all(mi.matmul_int8_ref(a, -b - 1, 1.0) == -k * 128 * 127)


def test_weight_stream_is_chosen_for_few_rows_that_fill_the_gpu():
    """The streaming kernel takes M ≤ 16, K % 16 == 0, aligned rows, ≥ 1 block per SM."""
    assert mm._streams(1, 8192, True, 28672, 132)
    assert mm._streams(16, 16, True, 16 * 132, 132)
    assert not mm._streams(17, 8192, True, 28672, 132)  # M past the mma's 16 rows
    assert not mm._streams(1, 8200, True, 28672, 132)  # K not whole 16-byte pieces
    assert not mm._streams(1, 8192, False, 28672, 132)  # unaligned rows
    bn8, bn16 = (ws.stream_shape(rows)[0] for rows in (8, 16))
    assert mm._streams(8, 64, True, bn8 * 132, 132)
    assert not mm._streams(8, 64, True, bn8 * 131, 132)  # under one block per SM: split-K
    assert not mm._streams(9, 64, True, bn16 * 131, 132)


def test_weight_stream_prefetches_from_8_kib_of_k():
    """The kernel whose weight loads prefetch 256-byte blocks into L2 runs from
    STREAM_PREFETCH_MIN_K_BYTES of K (8192 int8, 4096 16-bit), for either row count."""
    assert mm.STREAM_PREFETCH_MIN_K_BYTES == 8192
    for operand, k_elements in (("s8", 8192), ("f16", 4096), ("bf16", 4096)):
        for m, rows in ((1, 8), (8, 8), (9, 16), (16, 16)):
            long, short = (mm._stream_kernel(operand, m, k) for k in (k_elements, k_elements - 8))
            assert long.name == f"_matmul_stream{rows}_fwd_kernel_{operand}_prefetch"
            assert short.name == f"_matmul_stream{rows}_fwd_kernel_{operand}"


# ----------------------------------------------------------------------------- GPU


@pytest.fixture(params=[False, True], ids=["plain", "prefetch"])
def forced_stream(monkeypatch, request):
    """Every eligible shape on the weight-streaming kernel (whatever its grid), the variant
    with the L2 prefetch for every K or for none, with a spy that records each decision; no
    replay of plans recorded before or after."""
    decisions = []
    real = mi._streams

    def spy(*args):
        decisions.append(real(*args))
        return decisions[-1]

    STATE.calls = None
    monkeypatch.setattr(mm, "STREAM_MIN_BLOCKS_PER_SM", 0.0)
    monkeypatch.setattr(mm, "STREAM_PREFETCH_MIN_K_BYTES", 0 if request.param else 2**62)
    monkeypatch.setattr(mi, "_streams", spy)
    yield decisions
    STATE.calls = None


def _case(m, n, k, rng, b_kmajor=True, batch=()):
    a = rng.integers(-128, 128, batch + (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)  # [N, K]: the checkpoint layout
    da = kaionb.asarray(a)
    if b_kmajor:
        db = kaionb.asarray(w).T  # a K-major view: no copy
    else:
        db = kaionb.asarray(np.ascontiguousarray(w.T))
    return a, w.T, da, db


def _scales(mode, rows_shape, n, rng):
    """(host scale argument, device scale argument) for one scale mode."""
    sa = (rng.uniform(0.5, 2.0, rows_shape) * 1e-3).astype(np.float32)
    sb = (rng.uniform(0.5, 2.0, n) * 1e-3).astype(np.float32)
    if mode == "float":
        return 3e-6, 3e-6
    if mode == "0-d":
        s = np.float32(3e-6)
        return s, kaionb.asarray(np.array(s))
    if mode == "pair floats":
        return (1e-3, 3e-3), (1e-3, 3e-3)
    if mode == "row, col":
        return (sa, sb), (kaionb.asarray(sa), kaionb.asarray(sb))
    if mode == "0-d, col":
        return (np.float32(2e-3), sb), (kaionb.asarray(np.array(np.float32(2e-3))),
                                        kaionb.asarray(sb))
    if mode == "row, float":
        return (sa, 2e-3), (kaionb.asarray(sa), 2e-3)
    raise AssertionError(mode)


MODES = ["float", "0-d", "pair floats", "row, col", "0-d, col", "row, float"]


@gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 33, 65), (64, 4096, 4096), (300, 2000, 512)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16], ids=str)
def test_scale_modes(shape, mode, dtype):
    rng = np.random.default_rng(hash((shape, mode)) % 2**32)
    m, n, k = shape
    a, b, da, db = _case(m, n, k, rng)
    host_scale, dev_scale = _scales(mode, (m,), n, rng)
    out = poisoned((m, n), dtype)
    result = kaionb.matmul_int8(da, db, dev_scale, out=out)
    assert result is out
    ref = mi.matmul_int8_ref(a, b, host_scale)
    assert relative_error(out.get(), ref) < TOL[np.dtype(dtype)]


@gpu
@pytest.mark.parametrize("shape", [(1000, 24, 4100), (8, 4096, 11008), (1, 4096, 4096),
                                   (16, 4096, 4096), (1024, 1024, 1024), (2048, 2048, 2048),
                                   (5, 1000, 8192)])
@pytest.mark.parametrize("bias_dtype", [None, np.float32, np.float16])
def test_shapes_with_bias(shape, bias_dtype):
    rng = np.random.default_rng(sum(shape))
    m, n, k = shape
    a, b, da, db = _case(m, n, k, rng)
    host_scale, dev_scale = _scales("row, col", (m,), n, rng)
    bias = None if bias_dtype is None else rng.standard_normal(n).astype(bias_dtype)
    out = kaionb.matmul_int8(da, db, dev_scale, bias=None if bias is None else
                             kaionb.asarray(bias), dtype=np.float32)
    assert out.shape == (m, n) and out.dtype == np.float32
    ref = mi.matmul_int8_ref(a, b, host_scale, bias)
    assert relative_error(out.get(), ref) < 1e-6


@gpu
@pytest.mark.parametrize("m", [72, 100])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=str)
def test_hopper_kernel_on_rows_short_of_a_tile(monkeypatch, m, dtype):
    """64 < M < 128 on an N of 64 narrow tiles runs the Hopper s8 kernel with A's TMA box
    cut at M rounded up to 8 rows (72 / 104: ``wgmma_pipeline.a_box_rows``, the stage's
    byte count matching; a mismatch would hang): rows past M hold stale bytes and are
    never stored."""
    if kaionb._device.compute_capability() != (9, 0):
        pytest.skip("the wgmma + TMA kernel runs on compute capability 9.0 only")
    launched = []
    real = mm.matmul_hopper.launch
    monkeypatch.setattr(mm.matmul_hopper, "launch",
                        lambda *args, **kw: launched.append(args[1]) or real(*args, **kw))
    mi._HOPPER_PLANS.clear()
    rng = np.random.default_rng(m)
    n, k = 8192, 1040
    a, b, da, db = _case(m, n, k, rng)
    host_scale, dev_scale = _scales("row, col", (m,), n, rng)
    out = poisoned((m, n), dtype)
    kaionb.matmul_int8(da, db, dev_scale, out=out)
    assert launched == ["narrow"]
    ref = mi.matmul_int8_ref(a, b, host_scale)
    assert relative_error(out.get(), ref) < TOL[np.dtype(dtype)]


@gpu
@pytest.mark.parametrize("shape", [(33, 70, 100), (256, 512, 1024)])
def test_row_major_b_and_batched_a(shape):
    rng = np.random.default_rng(7)
    m, n, k = shape
    a, b, da, db = _case(m, n, k, rng, b_kmajor=False, batch=(2,))
    sa = (rng.uniform(0.5, 2.0, (2, m)) * 1e-3).astype(np.float32)
    out = kaionb.matmul_int8(da, db, (kaionb.asarray(sa), 0.5), dtype=np.float16)
    assert out.shape == (2, m, n)
    ref = mi.matmul_int8_ref(a, b, (sa, 0.5))
    assert relative_error(out.get(), ref) < 2e-3


@gpu
@pytest.mark.parametrize("m", [5, 2048])
@pytest.mark.parametrize("values", [(-128, -128), (-128, 127), (127, 127)])
def test_saturated_inputs_are_exact(m, values):
    k, n = 4096, 256
    a = np.full((m, k), values[0], np.int8)
    b = np.full((n, k), values[1], np.int8)
    out = kaionb.matmul_int8(kaionb.asarray(a), kaionb.asarray(b).T, 1.0)
    assert np.all(out.get() == float(k * values[0] * values[1]))


@gpu
@pytest.mark.parametrize("shape", [(16, 4096, 4096), (2048, 2048, 2048)])
def test_repeats_are_bit_identical(shape):
    rng = np.random.default_rng(3)
    m, n, k = shape
    _, _, da, db = _case(m, n, k, rng)
    first = kaionb.matmul_int8(da, db, 1e-4, dtype=np.float32).get()
    for _ in range(3):
        again = kaionb.matmul_int8(da, db, 1e-4, dtype=np.float32).get()
        assert again.tobytes() == first.tobytes()


@gpu
def test_context_usable_after_bad_input():
    rng = np.random.default_rng(5)
    a, b, da, db = _case(40, 48, 64, rng)
    with pytest.raises(ValueError, match="matmul_int8: argument 'bias'"):
        kaionb.matmul_int8(da, db, 1.0, bias=kaionb.zeros((47,), np.float32))
    out = kaionb.matmul_int8(da, db, 1.0)
    assert relative_error(out.get(), mi.matmul_int8_ref(a, b, 1.0)) < 1e-6


@gpu
def test_quantized_linear_layer_tracks_the_float_matmul():
    rng = np.random.default_rng(11)
    m, n, k = 77, 1000, 2048
    x = rng.standard_normal((m, k)).astype(np.float16)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float16)
    qx, sx = kaionb.quantize_int8(kaionb.asarray(x), axis=0)  # per token
    qw, sw = kaionb.quantize_int8(kaionb.asarray(w), axis=0)  # per output channel
    y = kaionb.matmul_int8(qx, qw.T, (sx, sw), dtype=np.float16)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert relative_error(y.get(), ref) < 2e-2


@gpu
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
@pytest.mark.parametrize("n, k", [(1000, 4112), (24, 80), (4100, 16), (3, 1040)])
@pytest.mark.parametrize("mode", ["row, col", "float", "0-d, col"])
def test_weight_stream_kernel(m, n, k, mode, forced_stream):
    """The weight-streaming kernel at shapes that are multiples of none of its steps: K
    slices with partial 64-byte steps (4112 = 64·64 + 16), warps with no K at all (K =
    16, 80), a last block past N (N = 1000, 3), rows past M in the 16-row mma; f16 output
    with a bias, and f32 within the exact reference's rounding."""
    rng = np.random.default_rng(hash((m, n, k, mode)) % 2**32)
    a, b, da, db = _case(m, n, k, rng)
    host_scale, dev_scale = _scales(mode, (m,), n, rng)
    bias = rng.standard_normal(n).astype(np.float32)
    out = poisoned((m, n), np.float32)
    kaionb.matmul_int8(da, db, dev_scale, out=out)
    assert forced_stream == [True]
    assert relative_error(out.get(), mi.matmul_int8_ref(a, b, host_scale)) < 1e-6
    out16 = poisoned((m, n), np.float16)
    kaionb.matmul_int8(da, db, dev_scale, bias=kaionb.asarray(bias), out=out16)
    ref = mi.matmul_int8_ref(a, b, host_scale, bias)
    assert relative_error(out16.get(), ref) < TOL[np.dtype(np.float16)]


@gpu
@pytest.mark.parametrize("values", [(-128, -128), (-128, 127), (127, 127)])
def test_weight_stream_saturated_and_repeatable(values, forced_stream):
    """Extreme operands sum exactly through the streaming kernel's cross-warp integer
    sums, and repeats give the same bits."""
    m, n, k = 16, 40, 8192
    a = kaionb.asarray(np.full((m, k), values[0], np.int8))
    b = kaionb.asarray(np.full((n, k), values[1], np.int8)).T
    out = kaionb.matmul_int8(a, b, 1.0)
    assert np.all(out.get() == float(k * values[0] * values[1]))
    rng = np.random.default_rng(5)
    _, _, da, db = _case(7, 4096, 4096, rng)
    first = kaionb.matmul_int8(da, db, (1e-3, 2e-3), dtype=np.float16).get()
    for _ in range(3):
        again = kaionb.matmul_int8(da, db, (1e-3, 2e-3), dtype=np.float16).get()
        np.testing.assert_array_equal(again.view(np.uint16), first.view(np.uint16))
    assert set(forced_stream) == {True}
