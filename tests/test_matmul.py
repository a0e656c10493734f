"""kaionb.kernels.matmul: bad input is refused before any launch (CPU); on a GPU every
variant (f16/bf16 × sync/async × NN/NT/TN/TT × tile class × split-K, and on an H100 the
wgmma kernel of kernels.matmul_hopper in every layout and tile class) matches float64
NumPy on odd shapes, writes every output element, and repeats bit for bit."""

import itertools
import math

import numpy as np
import pytest

import kaionb
from kaionb._device import STATE, compute_capability, gpu_available
from kaionb.array import DeviceArray, bfloat16
from kaionb.kernels import matmul as mm
from kaionb.kernels import matmul_hopper as mh
from kaionb.kernels import op as opmod
from kaionb.testing import poisoned, random_array, relative_error

gpu = pytest.mark.gpu
F16 = np.dtype(np.float16)
# Relative error ‖C − C64‖ / ‖C64‖ with f32 accumulation of f16/bf16-rounded inputs (the
# issue's bounds); a 16-bit output adds one rounding (2^-11 f16, 2^-8 bf16, ~1/3 RMS).
TOL = {F16: 1e-3, bfloat16: 5e-3}
OUT_TOL = {np.dtype(np.float32): 0.0, F16: 1e-3, bfloat16: 4e-3}
FUNCS = {
    (F16, "sync"): mm.matmul_tc,
    (F16, "async"): mm.matmul_tc_async,
    (bfloat16, "sync"): mm.matmul_tc_bf16,
    (bfloat16, "async"): mm.matmul_tc_bf16_async,
}
SHAPES = [  # (M, N, K)
    (1, 1, 1),
    (17, 9, 31),
    (1023, 1025, 1027),
    (4096, 1, 4096),
    (1, 4096, 4096),
    (3000, 24, 200),  # tall-skinny
    (24, 3000, 136),  # wide
    (256, 512, 64),
]
LAYOUTS = ["nn", "nt", "tn", "tt"]
# The wgmma kernel reads operands through TMA, which needs 16-byte row strides: every
# storage row length (K, N, and M for transposed A) a multiple of 8, none of a tile's.
WGMMA_SHAPES = [
    (8, 8, 8),
    (45, 1032, 520),  # M % 8 != 0: A's K-major box holds 48 rows (wgmma_pipeline.a_box_rows)
    (136, 264, 520),
    (1000, 1032, 1048),
    (256, 512, 64),
    (3000, 24, 200),  # B's boxes past N = 24 are entirely outside the matrix
    (24, 3000, 136),
    (8, 4096, 4096),
    (4096, 8, 4096),
]


def wgmma_cases(shapes):
    """(m, n, k, layout) of each shape in every layout TMA can read: a transposed A (its
    storage rows M elements long) only where M % 8 == 0."""
    return [(m, n, k, layout) for m, n, k in shapes for layout in LAYOUTS
            if layout[0] == "n" or m % 8 == 0]


HOPPER = gpu_available() and compute_capability() == (9, 0)
hopper = pytest.mark.skipif(not HOPPER, reason="the wgmma kernel needs a compute capability "
                            "9.0 GPU (H100/H200)")


def _fake(shape, dtype=F16, device=0):
    """A DeviceArray header with no memory: validation never touches the data."""
    dt = np.dtype(dtype)
    strides = tuple(int(s) for s in np.empty(shape, dt).strides)
    return DeviceArray(tuple(shape), dt, strides, 256, None, device)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("fn", [mm.matmul_tc, mm.matmul_tc_async, mm.matmul])
def test_mismatched_inner_dimensions(fn):
    with pytest.raises(ValueError, match=r"argument 'b' expected 64 rows"):
        fn(_fake((32, 64)), _fake((63, 16)))


@pytest.mark.parametrize("fn", [mm.matmul_tc, mm.matmul_tc_async])
def test_float32_into_f16_kernel(fn):
    with pytest.raises(TypeError, match=r"argument 'a' expected dtype float16, got float32"):
        fn(_fake((8, 8), np.float32), _fake((8, 8)))


def test_bf16_kernel_refuses_f16():
    with pytest.raises(TypeError, match=r"matmul_tc_bf16: argument 'b' expected dtype bfloat16"):
        mm.matmul_tc_bf16(_fake((8, 8), bfloat16), _fake((8, 8)))


def test_matmul_refuses_float64_and_mixed_dtypes():
    with pytest.raises(TypeError, match=r"matmul: argument 'a' expected dtype float16 or "
                       r"bfloat16 or float32, got float64"):
        mm.matmul(_fake((8, 8), np.float64), _fake((8, 8), np.float64))
    with pytest.raises(TypeError, match=r"matmul: argument 'b' expected the dtype of 'a'"):
        mm.matmul(_fake((8, 8)), _fake((8, 8), bfloat16))


def test_zero_dimensional_operands_are_refused():
    with pytest.raises(ValueError, match=r"matmul: argument 'b' expected an array of at "
                       r"least 1 dimension"):
        mm.matmul(_fake((8, 8)), _fake(()))


@pytest.mark.parametrize("fn", [mm.matmul, mm.matmul_tc])
def test_batch_dimensions_must_broadcast(fn):
    with pytest.raises(ValueError, match=rf"{fn.__name__}: argument 'b' expected batch "
                       r"dimensions that broadcast"):
        fn(_fake((3, 8, 16)), _fake((2, 16, 4)))


def test_bad_precision():
    with pytest.raises(ValueError, match=r"matmul: argument 'precision' expected 'highest' "
                       r"or 'tf32', got 'fast'"):
        mm.matmul(_fake((8, 8), np.float32), _fake((8, 8), np.float32), precision="fast")


@pytest.mark.parametrize("shape_a, shape_b, shape", [
    ((8,), (8, 5), (5,)), ((3, 8), (8,), (3,)), ((8,), (8,), ()),
    ((2, 3, 4, 8), (8, 5), (2, 3, 4, 5)), ((7, 1, 4, 8), (3, 8, 5), (7, 3, 4, 5)),
    ((4, 8), (6, 8, 5), (6, 4, 5)), ((8,), (6, 8, 5), (6, 5)),
])
def test_result_shapes_follow_numpy(shape_a, shape_b, shape):
    assert mm._result_shape("matmul", _fake(shape_a), _fake(shape_b))[3] == shape
    assert np.matmul(np.empty(shape_a), np.empty(shape_b)).shape == shape


def test_batch_folding_and_broadcast_strides():
    """A row-major batch of A over a 2-D B folds into one matrix; a broadcast B is read
    with batch stride 0."""
    p = mm.plan_operands("matmul", _fake((6, 4, 8)), _fake((8, 5)), (6,))
    assert (p.batch, p.m, p.n, p.k) == (1, 24, 5, 8) and p.a.shape == (1, 24, 8)
    p = mm.plan_operands("matmul", _fake((6, 4, 8)), _fake((6, 8, 5)), (6,))
    assert p.batch == 6 and p.a.strides[0] == 4 * 8 * 2 and p.b.strides[0] == 8 * 5 * 2
    p = mm.plan_operands("matmul", _fake((6, 8, 4)).transpose(0, 2, 1), _fake((8, 5)), (6,))
    assert p.batch == 6 and not p.a_kmajor and p.b.strides[0] == 0


def test_different_devices():
    with pytest.raises(ValueError, match=r"argument 'b' expected device 0"):
        mm.matmul_tc(_fake((8, 8)), _fake((8, 8), device=1))


def test_bad_out_shape_and_dtype():
    with pytest.raises(ValueError, match=r"argument 'out' expected shape \(8, 4\)"):
        mm.matmul_tc(_fake((8, 16)), _fake((16, 4)), out=_fake((4, 8), np.float32))
    with pytest.raises(TypeError, match=r"argument 'out' expected dtype float32"):
        mm.matmul_tc(_fake((8, 16)), _fake((16, 4)), out=_fake((8, 4), F16),
                     dtype=np.float32)
    with pytest.raises(TypeError, match=r"argument 'out' expected device memory"):
        mm.matmul_tc(_fake((8, 16)), _fake((16, 4)), out=np.zeros((8, 4), np.float32))


def test_bad_out_dtype():
    with pytest.raises(TypeError, match=r"matmul_tc: argument 'dtype' expected float32, "
                       r"float16"):
        mm.matmul_tc(_fake((8, 16)), _fake((16, 4)), dtype=np.int32)


def test_out_must_be_contiguous():
    out = _fake((16, 8), np.float32).T
    with pytest.raises(ValueError, match=r"argument 'out' expected a C-contiguous"):
        mm.matmul_tc(_fake((8, 16)), _fake((16, 16)), out=out)


def test_every_variant_is_registered():
    names = {k.name for k in mm._KERNELS.values()}
    # 16-bit, per dtype: sync 3 layouts × 2 tiles; async 3 layouts × (large, small,
    # decode64) + 2 K-major-A layouts × decode16. tf32(x3): 2 × 2 layouts × 2 loads × 2.
    # s8: the K-major pair only, sync × 2 tiles + async × 4.
    assert len(names) == len(mm._KERNELS) == 2 * (3 * 2 + 3 * 3 + 2) + 2 * 2 * 2 * 2 + 6
    assert set(mm._TILE_CHOICES[("s8", True, True, "async")]) == {"large", "small", "decode16",
                                                                  "decode64"}
    # 16-row tiles only where A is K-major (an M-major A tile needs 64-byte rows).
    assert "decode16" in mm._TILE_CHOICES[("f16", True, True, "async")]
    assert "decode16" not in mm._TILE_CHOICES[("f16", False, False, "async")]
    assert "decode64" in mm._TILE_CHOICES[("bf16", False, False, "async")]


def test_shape_classes():
    # 4096² fills the GPU with large tiles; M=128 runs 64×64 tiles with split K.
    tiles = mm.TILES[("16bit", "async")]
    assert mm._choose(4096, 4096, 4096, 132, tiles)[0] == "large"
    tile, splits, k_chunk = mm._choose(128, 4096, 4096, 132, tiles)
    assert tile == "small" and splits > 1 and k_chunk % tiles["small"][2] == 0
    assert splits * k_chunk >= 4096 > (splits - 1) * k_chunk
    # A batch of small problems fills the GPU without splitting K.
    assert mm._choose(64, 64, 4096, 132, tiles, batch=512)[1] == 1
    # Without decode tiles (sync loads, tf32) a decode shape splits the small tile.
    assert mm._choose(1, 4096, 4096, 132, mm.TILES[("16bit", "sync")])[:2] == ("small", 5)


@pytest.mark.parametrize("sms", [132, 108, 78])
@pytest.mark.parametrize("m, tile", [(1, "decode16"), (16, "decode16"), (17, "decode64"),
                                     (33, "decode64"), (64, "decode64")])
def test_decode_tile_and_splits(m, tile, sms):
    """M ≤ 64 runs the decode tile whose M covers it, split so that the blocks make one
    wave of about DECODE_BLOCKS_PER_SM per SM, every split a whole number of k-tiles."""
    tiles = mm.TILES[("16bit", "async")]
    n = k = 4096
    got, splits, k_chunk = mm._choose(m, n, k, sms, tiles)
    bm, bn, bk = tiles[got][:3]
    assert got == tile and bm >= m
    blocks = math.ceil(n / bn) * splits
    target = mm.DECODE_BLOCKS_PER_SM[tile] * sms
    assert target / 2 < blocks <= target, (splits, blocks, target)
    assert k_chunk % bk == 0 and k_chunk >= mm.MIN_SPLIT_K
    assert splits * k_chunk >= k > (splits - 1) * k_chunk


def test_decode_splits_edge_cases():
    tiles = mm.TILES[("16bit", "async")]
    # Short K is not split below MIN_SPLIT_K; a wide N fills the GPU without splits.
    assert mm._choose(1, 4096, 300, 132, tiles)[1] == 1
    assert mm._choose(16, 65536, 4096, 132, tiles)[:2] == ("decode16", 1)
    # K not a multiple of the tile: the last split is shorter, none is empty.
    tile, splits, k_chunk = mm._choose(16, 1000, 3000, 132, tiles)
    assert tile == "decode16" and splits > 1 and (splits - 1) * k_chunk < 3000
    # Forced tile and splits (benchmarks, tests).
    assert mm._choose(1, 4096, 4096, 132, tiles, tile="small")[0] == "small"
    assert mm._choose(1, 4096, 4096, 132, tiles, tile="decode16", splits=16)[1:] == (16, 256)
    assert mm._choose(1, 4096, 4096, 132, tiles, tile="large")[1] == 1
    assert mm._choose(1, 100, 40, 132, tiles, splits=7)[1:] == (1, 64)


def test_arrival_workspace_is_cached_per_stream_and_grows(monkeypatch):
    """One workspace per (device, stream), reused while it is big enough, replaced by a
    larger one (counters zeroed once, on its stream) when a launch needs more."""
    from kaionb._device import Stream

    zeroed, allocated = [], []
    streams = {"s": Stream(_handle=0)}

    def fake_empty(shape, dtype):
        allocated.append(shape[0])
        return _fake(shape, dtype)

    monkeypatch.setattr(opmod, "_WORKSPACES", {})
    monkeypatch.setattr(opmod, "empty", fake_empty)
    monkeypatch.setattr(opmod, "current_allocator", lambda: (None, 0))
    monkeypatch.setattr(opmod, "current_stream", lambda: streams["s"])
    monkeypatch.setattr(opmod, "_zero_u32", lambda ptr, n, h: zeroed.append((n, h)))
    capturing = {"on": False}
    monkeypatch.setattr(opmod, "is_capturing", lambda handle: capturing["on"])
    p1, c1 = opmod.arrival_workspace(1000, 10)
    assert p1.dtype == np.float32 and c1.dtype == np.uint32
    assert p1.nbytes >= 1000 and c1.size >= 10 and zeroed == [(c1.size, 0)]
    assert (p1.ptr - c1.ptr) == 4 * c1.size and p1.ptr % 256 == 0
    p2, c2 = opmod.arrival_workspace(500, 3)  # smaller: the same memory, no memset
    assert (p2.ptr, c2.ptr) == (p1.ptr, c1.ptr) and len(zeroed) == 1
    p3, c3 = opmod.arrival_workspace(500, 100)  # more counters: a new buffer, never smaller
    assert c3.size >= 100 and p3.nbytes >= 1000 and len(zeroed) == 2
    streams["s"] = Stream(_handle=7)  # another stream: its own workspace
    opmod.arrival_workspace(8, 1)
    assert zeroed[-1][1] == 7 and len(opmod._WORKSPACES) == 2
    # Capturing a graph: a fresh zeroed workspace for the graph alone, never cached.
    capturing["on"] = True
    before = dict(opmod._WORKSPACES)
    p4, c4 = opmod.arrival_workspace(8, 1)
    assert zeroed[-1][1] == 7 and len(zeroed) == 4 and opmod._WORKSPACES == before
    assert allocated[-1] == allocated[-2] and p4 is not before[(0, 7)].partials
    # A stream per step: only the newest MAX_WORKSPACES streams keep theirs.
    capturing["on"] = False
    for handle in range(100, 100 + opmod.MAX_WORKSPACES):
        streams["s"] = Stream(_handle=handle)
        opmod.arrival_workspace(8, 1)
    assert len(opmod._WORKSPACES) == opmod.MAX_WORKSPACES and (0, 0) not in opmod._WORKSPACES
    assert (0, 99 + opmod.MAX_WORKSPACES) in opmod._WORKSPACES


def test_forced_tile_must_have_a_kernel(monkeypatch):
    monkeypatch.setattr(mm, "compute_capability", lambda: (8, 0))
    monkeypatch.setattr(mm, "multiprocessor_count", lambda: 108)
    monkeypatch.setattr(mm, "empty", lambda shape, dtype: _fake(shape, dtype))
    with pytest.raises(ValueError, match=r"t: argument 'tile' expected one of \['large', "
                       r"'small'\] .*got 'decode16'"):
        mm.matmul_fwd("t", _fake((16, 64)), _fake((64, 64)), loads="sync", tile="decode16")
    with pytest.raises(ValueError, match=r"argument 'tile' expected one of \['decode64', "):
        mm.matmul_fwd("t", _fake((64, 16)).T, _fake((64, 64)), tile="decode16")


def test_wgmma_tile_choice():
    assert mh.choose_tile(4096, 4096, 132) == "wide"
    assert mh.choose_tile(2048, 2048, 132) == "wide"  # 128 tiles: 0.97 of a wave
    assert mh.choose_tile(1024, 1024, 132) == "narrow"  # 64 narrow tiles
    assert mh.choose_tile(1, 4096, 132) is None  # decode: mma.sync with split-K
    assert mh.choose_tile(128, 4096, 132) is None  # no K given (s8): no split tile
    # 16-bit: few narrow tiles and M > 16 split K, up to MAX_SPLITS work items a tile:
    # 128×64 tiles while two splits of each fit one wave, else 128×128.
    assert mh.choose_tile(128, 4096, 132, 4096) == "split64"
    assert mh.split_count(128, 4096, 4096, 132, tile="split64") == (2, 32)  # 64 tiles × 2
    assert mh.split_count(128, 4096, 4096, 132) == (2, 32)  # 32 tiles × MAX_SPLITS
    assert mh.choose_tile(256, 4096, 132, 4096) == "split"  # 128 tiles of 128×64: 1 wave
    assert mh.split_count(256, 4096, 4096, 132) == (2, 32)
    assert mh.choose_tile(512, 4096, 132, 4096) == "narrow"
    assert mh.choose_tile(16, 4096, 132, 4096) is None  # M ≤ 16: stream or decode tiles
    assert mh.choose_tile(17, 4096, 132, 4096) == "split64"
    assert mh.choose_tile(128, 4096, 132, 3072) == "split64"
    assert mh.choose_tile(128, 4288, 132, 4096) == "split"  # 67 tiles of 128×64
    # From K = 1024 split; shorter K: mma.sync's split-K tiles.
    assert mh.choose_tile(128, 4096, 132, 2048) == "split64"
    assert mh.choose_tile(32, 4096, 132, 1024) == "split64"
    assert mh.choose_tile(128, 4096, 132, 960) is None  # 15 k-tiles
    assert mh.choose_tile(64, 64, 132, 64) is None
    # Fewer than a fifth of a wave of narrow tiles (not measured): mma.sync.
    assert mh.choose_tile(64, 2048, 132, 8192) is None  # 16 narrow tiles
    assert mh.choose_tile(64, 3456, 132, 8192) == "split64"  # 27 narrow tiles
    # Forced splits (a cluster): at most MAX_SPLITS (the exchange's pair), at most one per
    # k-tile, at least 1.
    assert mh.MAX_SPLITS == 2
    assert mh.split_count(64, 4096, 4096, 132, splits=1000) == (2, 32)
    assert mh.split_count(64, 4096, 4096, 132, splits=3) == (2, 32)
    assert mh.split_count(64, 4096, 4096, 132, splits=0) == (1, 64)
    assert mh.split_count(64, 4096, 192, 132, splits=8) == (2, 2)  # 3 k-tiles: 2 + 1
    assert mh.split_count(64, 4096, 64, 132, splits=2) == (1, 1)  # 1 k-tile
    # Splits of at least MIN_SPLIT_KTILES k-tiles, the last one possibly shorter.
    assert mh.split_count(64, 4096, 448, 132) == (1, 7)  # 7 k-tiles
    assert mh.split_count(64, 128, 520, 132) == (2, 5)  # 9 k-tiles: 5 + 4
    for m, n, k, splits in itertools.product((1, 64, 300), (128, 4096), (64, 1000, 3000, 9000),
                                             (None, 1, 2, 3, 5, 8, 64)):
        got, kps = mh.split_count(m, n, k, 132, splits=splits)
        n_ktiles = -(-k // 64)
        assert got in (1, 2) and -(-n_ktiles // kps) == got, (m, n, k, splits)


def test_wgmma_plan_cache_host_logic(monkeypatch):
    """The dispatcher's Hopper plan cache, with the GPU calls replaced: a repeated call
    runs the cached plan on a fresh output, a given ``out`` is still checked, and other
    operands (another address or layout) get plans of their own."""
    launched, ran = [], []

    def launch(dtype, tile, sa, lda, a_kmajor, sb, ldb, b_kmajor, out, m, n, k, kind, shape,
               splits):
        launched.append((tile, a_kmajor, b_kmajor, kind))
        return mh.LaunchPlan(None, 0, 2, None, None, m, n, k, shape)

    monkeypatch.setattr(mm, "compute_capability", lambda: (9, 0))
    monkeypatch.setattr(mm, "multiprocessor_count", lambda: 132)
    monkeypatch.setattr(mm, "empty", lambda shape, dtype: _fake(shape, dtype))
    monkeypatch.setattr(mh, "launch", launch)
    monkeypatch.setattr(mh, "run", lambda plan, out, kind: ran.append((plan.m, out, kind)))
    monkeypatch.setattr(mm, "_HOPPER_PLANS", {})
    a, b = _fake((2048, 512)), _fake((512, 2048))
    first = mm.matmul(a, b)  # f16 @ f16 -> f16
    assert launched == [("wide", True, False, mm.OUT_F16)] and not ran
    second = mm.matmul(a, b, dtype=np.float32)
    assert len(launched) == 1 and ran == [(2048, second, mm.OUT_F32)]
    assert second is not first and second.dtype == np.float32 and second.shape == (2048, 2048)
    out = _fake((2048, 2048), bfloat16)
    # Another entry (another allowed input dtype) plans for itself, then reuses its plan.
    assert mm.matmul_tc(a, b, out=out) is out and launched[-1] == ("wide", True, False,
                                                                     mm.OUT_BF16)
    assert mm.matmul_tc(a, b, out=out) is out and ran[-1] == (2048, out, mm.OUT_BF16)
    with pytest.raises(ValueError, match="out"):
        mm.matmul(a, b, out=_fake((2048, 2040), np.float32))
    with pytest.raises((ValueError, TypeError), match="out"):
        mm.matmul(a, b, out=_fake((2048, 2048), np.float32, device=1))
    mm.matmul(a.T.T, b)  # the same operands: the plan
    mm.matmul(_fake((512, 2048)).T, b)  # A transposed: a plan of its own
    assert len(launched) == 3 and launched[-1][1] is False
    assert len(mm._HOPPER_PLANS) == 3


def test_wgmma_kernels_registered():
    # f16 and bf16 in all four layouts; s8 K-major only.
    assert len(mh._KERNELS) == (2 * 4 + 1) * len(mh.TILES) - len(mh.SPLIT_TILES)
    assert not any(key[0] == "s8" and key[3] in mh.SPLIT_TILES for key in mh._KERNELS)
    assert {key[1:3] for key in mh._KERNELS if key[0] == "s8"} == {(True, True)}
    assert mh.geometry("s8", "wide")[2] == 2 * mh.geometry("f16", "wide")[2]
    assert all(k.arch_specific and k.check_archs() == {(9, 0, "a"): "sm_90a"}
               for k in mh._KERNELS.values())
    # Every variant's shared memory fits sm_90's 227 KiB a block (split: 1.9 KB to spare).
    sizes = {key: k.max_dynamic_shared_bytes for key, k in mh._KERNELS.items()}
    assert max(sizes.values()) <= 227 * 1024, sizes
    assert sizes[("f16", True, True, "split")] == 230512


def test_reference_is_float64():
    a = np.arange(6, dtype=np.float16).reshape(2, 3)
    assert mm.matmul_ref(a, a.T).dtype == np.float64


# ----------------------------------------------------------------------------- GPU


def _operands(m, n, k, dtype, layout, rng):
    """Host A (M×K), B (K×N) and device operands in the layout: 't' = a transposed view
    of a row-major array of the other orientation (no copy)."""
    a = random_array((m, k), dtype, rng=rng)
    b = random_array((k, n), dtype, rng=rng)
    da = kaionb.asarray(np.ascontiguousarray(a.T)).T if layout[0] == "t" else kaionb.asarray(a)
    db = kaionb.asarray(np.ascontiguousarray(b.T)).T if layout[1] == "t" else kaionb.asarray(b)
    return a, b, da, db


def check_matmul(fn, m, n, k, dtype, layout="nn", out_dtype=np.float32, rng=None, **kw):
    rng = np.random.default_rng() if rng is None else rng
    a, b, da, db = _operands(m, n, k, dtype, layout, rng)
    out = poisoned((m, n), out_dtype)
    result = fn(da, db, out=out, **kw)
    assert result is out
    got = out.get()
    assert np.isfinite(np.asarray(got, np.float64)).all(), "unwritten (NaN-poisoned) outputs"
    err = relative_error(got, mm.matmul_ref(a, b))
    tol = TOL[np.dtype(dtype)] + OUT_TOL[np.dtype(out_dtype)]
    assert err < tol, f"{fn.__name__} {layout} {m}x{n}x{k}: rel err {err:.2e} >= {tol:.0e}"
    return da, db, got


@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("pipeline", ["sync", "async"])
@pytest.mark.parametrize("dtype", [F16, bfloat16], ids=["f16", "bf16"])
def test_matches_float64(dtype, pipeline, m, n, k, layout):
    check_matmul(FUNCS[(dtype, pipeline)], m, n, k, dtype, layout)


@gpu
@pytest.mark.parametrize("out_dtype", [F16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(17, 9, 31), (300, 264, 520), (1, 4096, 4096)])
@pytest.mark.parametrize("dtype", [F16, bfloat16], ids=["f16", "bf16"])
def test_half_outputs(dtype, m, n, k, out_dtype):
    check_matmul(mm.matmul, m, n, k, dtype, "nn", out_dtype=out_dtype)


@gpu
@pytest.mark.parametrize("tile", ["large", "small", "decode16", "decode64"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_tile_classes_and_split_k(pipeline, splits, tile):
    if pipeline == "sync" and tile.startswith("decode"):
        pytest.skip("decode tiles run on the cp.async pipeline only")
    fwd = lambda a, b, out: mm.matmul_fwd("t", a, b, dtypes=(F16,), loads=pipeline, out=out,
                                           tile=tile, splits=splits)
    fwd.__name__ = f"matmul_fwd[{pipeline},{tile},{splits}]"
    for layout in ("nn", "nt", "tn"):
        if (pipeline, layout, tile) != ("async", "tn", "decode16"):
            check_matmul(fwd, 200, 136, 1000, F16, layout)


@pytest.fixture
def mma_launches(monkeypatch):
    """The _MmaLaunch of every mma.sync launch, in order."""
    launches = []
    real = mm._run_mma
    monkeypatch.setattr(mm, "_run_mma", lambda plan: launches.append(plan) or real(plan))
    return launches


def _mma_fwd(**kw):
    fwd = lambda a, b, out: mm.matmul_fwd("t", a, b, out=out, prefer_wgmma=False, **kw)
    fwd.__name__ = f"matmul_fwd[mma.sync, {kw}]"
    return fwd


# Decode shapes: M ≤ 64 runs a decode tile, M = 128 the small one, all with split K folded
# into the launch; N and K not multiples of the tiles; the last is unaligned (sync loads).
DECODE_CASES = [(1, 4096, 4096), (16, 1000, 3000), (33, 520, 2056), (64, 4096, 1032),
                (128, 1000, 3000), (16, 999, 1001)]


@gpu
@pytest.mark.parametrize("out_dtype", [F16, bfloat16, np.float32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("m, n, k", DECODE_CASES)
@pytest.mark.parametrize("dtype", [F16, bfloat16], ids=["f16", "bf16"])
def test_decode_split_k_in_one_launch(dtype, m, n, k, out_dtype, mma_launches):
    check_matmul(_mma_fwd(), m, n, k, dtype, "nn", out_dtype=out_dtype)
    (plan,) = mma_launches  # one kernel, no reduction launch
    splits = plan.grid[2]
    assert splits > 1 and plan.ws_bytes > 0 and plan.n_counters == plan.grid[0] * plan.grid[1]
    if m <= 64 and k % 8 == 0:
        assert "decode" in plan.kernel.kdef.name


@gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
@pytest.mark.parametrize("tile, splits", [("decode16", 5), ("decode64", 3), ("small", 4),
                                          ("large", 2)])
def test_forced_tiles_and_splits_fold(tile, splits, layout, mma_launches):
    """Any tile class with any split count, in every layout it has a kernel for: edges in
    M, N and K, partial last split."""
    for m in (1, 16, 37):
        if tile == "decode16" and (layout == "tn" or m > 16):
            continue
        if tile.startswith("decode") and layout == "tn" and m % 8:
            continue  # an M-major A of unaligned rows runs the sync pipeline: no decode tiles
        check_matmul(_mma_fwd(tile=tile, splits=splits), m, 1000, 2056, bfloat16, layout,
                     out_dtype=F16)
        assert mma_launches[-1].grid[2] == splits


@gpu
@pytest.mark.parametrize("shape_a, shape_b", [((3, 16, 2056), (3, 2056, 1000)),
                                              ((2, 1, 5, 1032), (3, 1032, 520)),
                                              ((4, 64, 1024), (1024, 4096))])
def test_batched_split_k(shape_a, shape_b, mma_launches):
    """Batches that do not fold into one matrix (batch against batch, broadcast B) split K
    per batch entry: one counter per tile of every entry; a batch over a shared B folds."""
    rng = np.random.default_rng(8)
    a, b = random_array(shape_a, F16, rng=rng), random_array(shape_b, F16, rng=rng)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = poisoned(ref.shape, F16)
    mm.matmul_fwd("t", kaionb.asarray(a), kaionb.asarray(b), out=out, prefer_wgmma=False)
    got = out.get()
    assert np.isfinite(got.astype(np.float64)).all()
    assert relative_error(got, ref) < TOL[F16] + OUT_TOL[F16]
    plan = mma_launches[-1]
    batch = plan.grid[2] // plan.args[12]  # grid z = batch × splits
    assert plan.args[12] > 1 and plan.n_counters == batch * plan.grid[0] * plan.grid[1]


@gpu
@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_decode_bit_identical_repeats(m):
    """The last split to arrive differs run to run; the sum's order does not."""
    rng = np.random.default_rng(9)
    da, db, first = check_matmul(_mma_fwd(), m, 4096, 4096, bfloat16, "nn", rng=rng)
    for _ in range(3):
        again = mm.matmul_fwd("t", da, db, dtype=np.float32, prefer_wgmma=False).get()
        assert np.array_equal(first.view(np.uint32), again.view(np.uint32))


@gpu
def test_workspace_reuse_across_shapes_and_streams():
    """Back-to-back split-K calls of different shapes share one workspace per stream (no
    synchronization between them): each call finds its counters at zero, the workspace
    grows when a shape needs more, and a second stream gets its own."""
    rng = np.random.default_rng(10)
    shapes = [(16, 4096, 4096), (1, 520, 1032), (64, 4096, 4096), (33, 1000, 3000),
              (16, 4096, 4096), (128, 2048, 4096), (1, 520, 1032)]
    cases = []
    for m, n, k in shapes:
        a, b = random_array((m, k), F16, rng=rng), random_array((k, n), F16, rng=rng)
        cases.append((kaionb.asarray(a), kaionb.asarray(b), mm.matmul_ref(a, b),
                      poisoned((m, n), np.float32)))
    opmod._WORKSPACES.clear()
    for da, db, _, out in cases:  # queued back to back, checked after
        mm.matmul_fwd("t", da, db, out=out, prefer_wgmma=False)
    kaionb.current_stream().synchronize()  # the side stream does not wait for this one
    side = kaionb.Stream()
    with kaionb.stream(side):
        side_out = poisoned(cases[0][3].shape, np.float32)
        mm.matmul_fwd("t", cases[0][0], cases[0][1], out=side_out, prefer_wgmma=False)
    side.synchronize()
    assert len(opmod._WORKSPACES) == 2
    for (m, n, k), (_, _, ref, out) in zip(shapes, cases):
        got = out.get()
        assert np.isfinite(got).all(), (m, n, k)
        assert relative_error(got, ref) < TOL[F16], (m, n, k)
    assert np.array_equal(side_out.get(), cases[0][3].get())
    # Every counter is back at zero.
    for ws in opmod._WORKSPACES.values():
        assert not ws.counters.get().any()


@gpu
@pytest.mark.parametrize("m, n, k", [(1023, 1025, 1027), (1, 4096, 4096), (2048, 2048, 256)])
def test_bit_identical_repeats(m, n, k):
    rng = np.random.default_rng(3)
    da, db, first = check_matmul(mm.matmul, m, n, k, bfloat16, "nn", rng=rng)
    for _ in range(3):
        again = mm.matmul(da, db, dtype=np.float32).get()
        assert np.array_equal(first.view(np.uint8), again.view(np.uint8))


@gpu
def test_operator_and_views_share_memory():
    rng = np.random.default_rng(5)
    a = random_array((64, 48), F16, rng=rng)
    b = random_array((64, 40), F16, rng=rng)
    da, db = kaionb.asarray(a), kaionb.asarray(b)
    got = (da.T @ db).get()  # TN straight from the stored arrays
    assert relative_error(got, mm.matmul_ref(a.T, b)) < TOL[F16]


@gpu
def test_strided_inputs_without_unit_stride_are_copied():
    rng = np.random.default_rng(6)
    a = random_array((40, 64), F16, rng=rng)
    b = random_array((32, 24), F16, rng=rng)
    da = kaionb.asarray(a)[:, ::2]  # 40×32, stride 2 elements along K
    got = mm.matmul_tc_async(da, kaionb.asarray(b)).get()
    assert relative_error(got, mm.matmul_ref(a[:, ::2], b)) < TOL[F16]


@gpu
def test_torch_and_cupy_inputs():
    torch = pytest.importorskip("torch")
    a = torch.randn(96, 80, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(80, 72, device="cuda", dtype=torch.bfloat16)
    got = kaionb.asarray(mm.matmul(a, b)).get()
    ref = mm.matmul_ref(a.float().cpu().numpy(), b.float().cpu().numpy())
    assert relative_error(got, ref) < TOL[bfloat16]


# ----------------------------------------------------------------------------- Hopper


def _wgmma_fwd(dtype, tile):
    fwd = lambda a, b, out: mm.matmul_fwd("t", a, b, dtypes=(dtype,), loads="wgmma", out=out,
                                           tile=tile)
    fwd.__name__ = f"matmul_fwd[wgmma,{tile}]"
    return fwd


@gpu
@hopper
@pytest.mark.parametrize("tile", list(mh.TILES))
@pytest.mark.parametrize("m, n, k, layout", wgmma_cases(WGMMA_SHAPES))
@pytest.mark.parametrize("dtype", [F16, bfloat16], ids=["f16", "bf16"])
def test_wgmma_matches_float64(dtype, m, n, k, layout, tile):
    check_matmul(_wgmma_fwd(dtype, tile), m, n, k, dtype, layout)


@gpu
@hopper
@pytest.mark.parametrize("out_dtype", [F16, bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("dtype", [F16, bfloat16], ids=["f16", "bf16"])
def test_wgmma_half_outputs(dtype, out_dtype):
    for m, n, k in [(136, 264, 520), (1000, 1032, 1048)]:
        check_matmul(_wgmma_fwd(dtype, None), m, n, k, dtype, "nn", out_dtype=out_dtype)


@gpu
@hopper
def test_wgmma_bit_identical_repeats():
    rng = np.random.default_rng(4)
    da, db, first = check_matmul(mm.matmul, 2048, 2056, 1032, F16, "nn", rng=rng)
    for _ in range(3):
        again = mm.matmul(da, db, dtype=np.float32).get()
        assert np.array_equal(first.view(np.uint8), again.view(np.uint8))


@gpu
@hopper
@pytest.mark.parametrize("tile", mh.SPLIT_TILES)
@pytest.mark.parametrize("splits", [None, 1, 2, 1000])
@pytest.mark.parametrize("m, n, k, layout", wgmma_cases([(8, 264, 4040), (75, 1032, 1000),
                                                         (160, 520, 8200), (100, 72, 136)]))
def test_wgmma_split_k(m, n, k, layout, splits, tile):
    """Each split tile with one split and two (1000: capped at MAX_SPLITS = 2), K not a
    multiple of the k-tile, M inside one tile (M % 8 != 0: A's box cut at 80 / 104 rows)
    or across two, a consumer's rows all past M (8; 160: in the second tile), N not a
    multiple of the tile's and with its last tile's second half past N (72): float32 and
    16-bit outputs match float64, and a repeat after a call on other operands (which
    leaves other partials in the exchange buffers) gives the same bits."""
    fwd = lambda a, b, out: mm.matmul_fwd("t", a, b, dtypes=(F16,), loads="wgmma", out=out,
                                           tile=tile, splits=splits)
    fwd.__name__ = f"matmul_fwd[wgmma,{tile},{splits}]"
    rng = np.random.default_rng(m + k)
    da, db, first = check_matmul(fwd, m, n, k, F16, layout, rng=rng)
    check_matmul(fwd, m, n, k, F16, layout, out_dtype=F16, rng=rng)  # other operands
    again = poisoned((m, n), np.float32)
    fwd(da, db, again)
    assert np.array_equal(first.view(np.uint8), again.get().view(np.uint8))


@gpu
@hopper
def test_dispatcher_picks_wgmma_on_hopper(monkeypatch):
    """The public entries launch the Hopper kernel for a GPU-filling aligned shape, for
    M > 16 on a fifth to half a wave of narrow tiles: the split tile from K = 1024; the
    mma.sync kernels otherwise (unaligned rows, M ≤ 16, shorter K)."""
    launched = []
    real = mh.launch
    monkeypatch.setattr(mh, "launch",
                        lambda *args, **kw: launched.append(args[1]) or real(*args, **kw))
    for fn in (mm.matmul_tc, mm.matmul_tc_bf16_async, mm.matmul):
        dtype = bfloat16 if fn is mm.matmul_tc_bf16_async else F16
        mm._HOPPER_PLANS.clear()  # a recycled address would reuse a plan: no launch() call
        check_matmul(fn, 2048, 2048, 264, dtype, "tt")
    assert launched == ["wide"] * 3
    check_matmul(mm.matmul, 2047, 2048, 264, F16, "tn")  # A's rows: 2047 elements
    check_matmul(mm.matmul, 16, 4096, 512, F16, "nn")  # M ≤ 16: mma.sync with split-K
    assert launched == ["wide"] * 3
    check_matmul(mm.matmul, 64, 4096, 520, F16, "nn")  # 32 narrow tiles, short K: mma.sync
    check_matmul(mm.matmul, 64, 4096, 1032, F16, "nn")  # from K = 1024: split
    check_matmul(mm.matmul, 64, 4096, 3080, F16, "nn")
    check_matmul(mm.matmul, 256, 4096, 1032, F16, "nn")  # 128×64 tiles: 1 wave unsplit
    assert launched == ["wide"] * 3 + ["split64", "split64", "split"]


@gpu
@hopper
def test_wgmma_refuses_unaligned_rows():
    a = kaionb.asarray(random_array((64, 60), F16))
    b = kaionb.asarray(random_array((60, 64), F16))
    with pytest.raises(ValueError, match=r"argument 'a, b' expected .*16-byte aligned"):
        mm.matmul_fwd("t", a, b, dtypes=(F16,), loads="wgmma")
    check_matmul(mm.matmul, 64, 64, 64, F16)  # the context is still usable


@gpu
@hopper
def test_wgmma_plan_cache_repeats_and_checks_out():
    """A repeated call reuses the launch plan (no re-validation of the operands), still
    checks and honours ``out``/``out_dtype``, and a misaligned ``out`` goes the long way."""
    rng = np.random.default_rng(7)
    m, n, k = 2048, 2048, 520
    a = random_array((m, k), F16, rng=rng)
    b = random_array((k, n), F16, rng=rng)
    da, db = kaionb.asarray(a), kaionb.asarray(b)
    ref = mm.matmul_ref(a, b)
    mm._HOPPER_PLANS.clear()
    first = mm.matmul(da, db).get()
    assert len(mm._HOPPER_PLANS) == 1
    assert relative_error(first, ref) < TOL[F16]
    for out_dtype in (F16, bfloat16, np.float32):
        out = poisoned((m, n), out_dtype)
        assert mm.matmul(da, db, out=out) is out
        assert relative_error(out.get(), ref) < TOL[F16] + OUT_TOL[np.dtype(out_dtype)]
    assert np.array_equal(mm.matmul(da, db).get().view(np.uint32), first.view(np.uint32))
    assert len(mm._HOPPER_PLANS) == 1
    with pytest.raises(ValueError, match="out"):
        mm.matmul(da, db, out=kaionb.empty((m, n + 8), np.float32))
    flat = kaionb.empty((m * n + 1,), np.float32)
    shifted = flat[1:].reshape(m, n)  # 4 bytes past a 16-byte boundary
    assert mm.matmul(da, db, out=shifted) is shifted
    assert relative_error(shifted.get(), ref) < TOL[F16]
    strided = kaionb.asarray(np.ascontiguousarray(np.repeat(a, 2, axis=1)))[:, ::2]
    for _ in range(2):  # copied operands (no unit stride) are never planned
        assert relative_error(mm.matmul(strided, db).get(), ref) < TOL[F16]
    assert len(mm._HOPPER_PLANS) == 1


# ----------------------------------------------------------------------------- NumPy semantics

# float32 inputs: tf32x3 keeps float32 accuracy (norm-wise ~1e-6 at these K), one tf32
# pass has 10-bit mantissas (2^-11 relative rounding per operand: ~5e-4 norm-wise).
F32_TOL = {"highest": 1e-5, "tf32": 2e-3}


@gpu
@pytest.mark.parametrize("precision", ["highest", "tf32"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (17, 9, 31), (300, 264, 2050), (1, 4096, 1000),
                                     (1023, 1025, 257), (2048, 2048, 64)])
def test_float32_on_tensor_cores(m, n, k, layout, precision):
    """float32 inputs through tf32 (x3), every layout, any shape; result float32."""
    rng = np.random.default_rng()
    a, b, da, db = _operands(m, n, k, np.float32, layout, rng)
    result = mm.matmul(da, db, precision=precision)
    assert result.dtype == np.float32
    err = relative_error(result.get(), mm.matmul_ref(a, b))
    assert err < F32_TOL[precision], f"{precision} {layout} {m}x{n}x{k}: {err:.2e}"


@gpu
@pytest.mark.parametrize("dtype", [F16, bfloat16, np.float32], ids=["f16", "bf16", "f32"])
def test_result_dtype_is_the_inputs(dtype):
    rng = np.random.default_rng()
    a, b = random_array((37, 70), dtype, rng=rng), random_array((70, 29), dtype, rng=rng)
    da, db = kaionb.asarray(a), kaionb.asarray(b)
    for result in (mm.matmul(da, db), da @ db):
        assert result.dtype == np.dtype(dtype)
        tol = TOL.get(np.dtype(dtype), 1e-5) + OUT_TOL.get(np.dtype(dtype), 0.0)
        assert relative_error(result.get(), mm.matmul_ref(a, b)) < tol
    wide = mm.matmul(da, db, dtype=np.float32)
    assert wide.dtype == np.float32
    assert relative_error(wide.get(), mm.matmul_ref(a, b)) < TOL.get(np.dtype(dtype), 1e-5)


def _device_view(host, transpose_last):
    """A device array of ``host``'s values; ``transpose_last``: stored with its last two
    axes swapped (a transposed view, no unit stride on the last axis)."""
    if not transpose_last:
        return kaionb.asarray(host)
    stored = np.ascontiguousarray(np.swapaxes(host, -1, -2))
    axes = tuple(range(host.ndim - 2)) + (host.ndim - 1, host.ndim - 2)
    return kaionb.asarray(stored).transpose(*axes)


BATCH_CASES = [  # (shape of a, shape of b)
    ((5, 33, 70), (70, 29)),  # a batch over a shared B: folds into one matrix
    ((5, 33, 70), (5, 70, 29)),  # batch against batch
    ((2, 3, 17, 24), (3, 24, 40)),  # B broadcast over the outer batch
    ((4, 1, 9, 16), (3, 16, 8)),  # both broadcast: A's batch has no one stride (copied)
    ((70,), (70, 29)),  # 1-D a: a row, dropped from the result
    ((33, 70), (70,)),  # 1-D b: a column, dropped
    ((70,), (4, 70, 29)),  # 1-D a against a batch
    ((70,), (70,)),  # inner product: a 0-d result
    ((3, 33, 0), (0, 29)),  # K = 0: zeros
    ((0, 33, 70), (70, 29)),  # an empty batch
]


@gpu
@pytest.mark.parametrize("transpose", ["nn", "tn", "nt"])
@pytest.mark.parametrize("shape_a, shape_b", BATCH_CASES)
@pytest.mark.parametrize("dtype", [F16, bfloat16, np.float32], ids=["f16", "bf16", "f32"])
def test_batched_and_vector_operands_follow_numpy(dtype, shape_a, shape_b, transpose):
    rng = np.random.default_rng()
    a = random_array(shape_a, dtype, rng=rng)
    b = random_array(shape_b, dtype, rng=rng)
    da = _device_view(a, transpose[0] == "t" and a.ndim > 1)
    db = _device_view(b, transpose[1] == "t" and b.ndim > 1)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = poisoned(ref.shape, np.float32)
    assert mm.matmul(da, db, out=out, dtype=np.float32) is out
    got = out.get()
    assert got.shape == ref.shape
    tol = TOL.get(np.dtype(dtype), F32_TOL["highest"])
    if ref.ndim == 0:
        # An inner product of random vectors may cancel to near 0: its rounding error is
        # bounded relative to Σ|a_i·b_i|, not to the result (a fresh draw failed at 5e-2).
        scale = float(np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
        assert abs(float(got) - float(ref)) / scale < tol
    else:
        assert relative_error(got, ref) < tol if ref.size else True
    assert mm.matmul(da, db).dtype == np.dtype(dtype)


@gpu
def test_batched_large_problem_runs_on_the_batch_grid():
    """A batch that does not fold (batch against batch) of GPU-filling size: one launch
    over the batch on the mma.sync kernels, split-K where the grid is small."""
    rng = np.random.default_rng()
    for shape_a, shape_b in (((8, 512, 256), (8, 256, 384)), ((3, 16, 4096), (3, 4096, 64))):
        a, b = random_array(shape_a, F16, rng=rng), random_array(shape_b, F16, rng=rng)
        got = mm.matmul(kaionb.asarray(a), kaionb.asarray(b), dtype=np.float32).get()
        assert relative_error(got, np.matmul(a.astype(np.float64), b.astype(np.float64))) < \
            TOL[F16]


@gpu
@pytest.mark.parametrize("shape_a, shape_b", [((5, 33, 70), (70, 29)), ((70,), (70, 29)),
                                              ((33, 70), (70,)), ((4, 9, 16), (4, 16, 8))])
@pytest.mark.parametrize("dtype", [bfloat16, np.float32], ids=["bf16", "f32"])
def test_batched_backward(dtype, shape_a, shape_b):
    """The tape's dA = dC·Bᵀ and dB = Aᵀ·dC (summed over a batch sharing B) against float64,
    norm-wise, for dC rounded to the inputs' dtype as the rule does."""
    from kaionb import grad

    rng = np.random.default_rng()
    a = random_array(shape_a, dtype, rng=rng)
    b = random_array(shape_b, dtype, rng=rng)
    da, db = kaionb.asarray(a), kaionb.asarray(b)
    da.requires_grad = db.requires_grad = True
    with grad.Tape() as tape:
        c = mm.matmul(da, db)
    g = rng.standard_normal(c.shape).astype(np.float32)
    tape.backward(c, kaionb.asarray(g))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    g64 = g.astype(dtype).astype(np.float64)
    a2 = a64[None] if a.ndim == 1 else a64
    b2 = b64[:, None] if b.ndim == 1 else b64
    g2 = g64.reshape(np.matmul(a2, b2).shape)
    ref_a = np.matmul(g2, np.swapaxes(b2, -1, -2))
    ref_b = np.matmul(np.swapaxes(a2, -1, -2), g2)
    ref_a = ref_a.reshape(a.shape) if a.ndim > 1 else ref_a.reshape(a.shape)
    ref_b = ref_b.sum(axis=tuple(range(ref_b.ndim - b2.ndim))).reshape(b.shape)
    tol = TOL.get(np.dtype(dtype), F32_TOL["highest"])
    assert da.grad.shape == a.shape and db.grad.shape == b.shape
    assert relative_error(da.grad.get(), ref_a) < tol
    assert relative_error(db.grad.get(), ref_b) < tol


@gpu
def test_kernel_built_from_the_pipeline_helpers_example():
    """examples/matmul_from_helpers.py: a kernel written from helpers.mma_pipeline."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "matmul_from_helpers.py"
    spec = importlib.util.spec_from_file_location("matmul_from_helpers", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rng = np.random.default_rng()
    a, b = random_array((130, 72), F16, rng=rng), random_array((72, 200), F16, rng=rng)
    got = example.example_matmul(kaionb.asarray(a), kaionb.asarray(b)).get()
    assert relative_error(got, mm.matmul_ref(a, b)) < TOL[F16]


@pytest.fixture(params=[False, True], ids=["plain", "prefetch"])
def forced_stream(monkeypatch, request):
    """Every eligible shape on the weight-streaming kernel (whatever its grid), the variant
    with the L2 prefetch for every K or for none, with a spy that records each decision; no
    replay of plans recorded before or after."""
    decisions = []
    real = mm._streams
    STATE.calls = None
    monkeypatch.setattr(mm, "STREAM_MIN_BLOCKS_PER_SM", 0.0)
    monkeypatch.setattr(mm, "STREAM_PREFETCH_MIN_K_BYTES", 0 if request.param else 2**62)
    monkeypatch.setattr(mm, "_streams", lambda *a: decisions.append(real(*a)) or decisions[-1])
    yield decisions
    STATE.calls = None


@gpu
@pytest.mark.parametrize("out_dtype", [np.float32, F16, bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(1, 1000, 4104), (5, 24, 40), (8, 4100, 8), (9, 3, 1032),
                                     (16, 1000, 4104)])
@pytest.mark.parametrize("dtype", [F16, bfloat16], ids=["f16", "bf16"])
def test_weight_stream_16bit(dtype, m, n, k, out_dtype, forced_stream):
    """16-bit ``x @ w.T`` (K-major B) with M ≤ 16 on the weight-streaming kernel: K slices
    with partial 64-byte steps and warps with no K, N past the last block, rows past M in
    the 16-row mma; repeats give the same bits (the warps' f32 sums add in warp order)."""
    rng = np.random.default_rng(hash((m, n, k)) % 2**32)
    da, db, first = check_matmul(mm.matmul, m, n, k, dtype, "nt", out_dtype=out_dtype,
                                 rng=rng)
    assert forced_stream == [True]
    again = poisoned((m, n), out_dtype)
    mm.matmul(da, db, out=again)
    np.testing.assert_array_equal(again.get().view(np.uint8), first.view(np.uint8))
