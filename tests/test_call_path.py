"""The fast call path (kernels.op.fast_path): a call's first run is recorded, later calls
with the same signature replay it. CPU tests check the signature and the recorder's
pointer bookkeeping on metadata-only arrays; GPU tests check that replays compute what
the full host path computes, on fresh inputs every time."""

from types import SimpleNamespace

import numpy as np
import pytest

import kaionb
from kaionb._device import STATE
from kaionb.array import DeviceArray
from kaionb.kernels import activations, matmul, norms, quantize, softmax
from kaionb.kernels.op import (_NOT_RECORDED, _overlapping, _Recording, _Replay, _signature,
                              _span, _View)
from kaionb.testing import assert_close, metadata_array, poisoned, random_array

# -- CPU: signatures and the recorder -----------------------------------------------------------


def _fwd():
    pass


def test_signature_separates_layouts_alignment_and_values():
    x = metadata_array((4, 64), np.float16)
    arrays = []
    key = _signature(_fwd, (x, 1e-6), {"out": None}, arrays)
    assert arrays == [x] and hash(key) is not None
    assert key == _signature(_fwd, (metadata_array((4, 64), np.float16), 1e-6), {"out": None},
                             [])
    for other in ((x.T, 1e-6), (x[:, 1:], 1e-6), (x, 1e-5), (x, 1),
                  (metadata_array((4, 64), np.float32), 1e-6)):
        assert _signature(_fwd, other, {"out": None}, []) != key
    misaligned = x._view(x.shape, x.strides, offset_bytes=2)  # same layout, other alignment
    assert _signature(_fwd, (misaligned, 1e-6), {"out": None}, []) != key


def test_signature_declines_foreign_objects_and_walks_tuples():
    x = metadata_array((8,), np.float32)
    assert _signature(_fwd, (np.zeros(8),), {}, []) is None  # a host array: no fast path
    assert _signature(_fwd, ([1, 2],), {}, []) is None
    arrays = []
    assert _signature(_fwd, (x,), {"out": (x, x), "dtype": np.float16}, arrays) is not None
    assert arrays == [x, x, x]


def test_span_and_overlap():
    x = metadata_array((4, 64), np.float16)
    assert _span(x) == (x.ptr, x.ptr + 4 * 64 * 2)
    assert _span(x[::-1]) == _span(x)  # a negative stride reaches back
    assert _overlapping([x, x[1:]]) and not _overlapping([x[:2], x[2:]])
    assert not _overlapping([x, metadata_array((0,), np.float16)])


def _compiled(name, n_arrays_then_scalars):
    """A stand-in for a CompiledKernel: what the recorder reads of one."""
    import struct

    flags = tuple(kind == "array" for kind in n_arrays_then_scalars)
    fmt = "<" + "".join("q" * 9 if f else "i4x" for f in flags)  # 2-D arrays, int32 scalars
    return SimpleNamespace(_array_flags=flags, _packer=struct.Struct(fmt), _function=0,
                           kdef=SimpleNamespace(name=name, address_scalars=False))


def _flat(args, flags):
    flat = []
    for is_array, a in zip(flags, args):
        flat += a._numba_abi if is_array else [a]
    return flat


def test_recorder_maps_views_to_their_arrays_and_allocations():
    x = metadata_array((4, 64), np.float16)
    w = metadata_array((4, 64), np.float16)._view((4, 64), (128, 2), offset_bytes=1 << 20)
    rec = _Recording([x, w])
    out = metadata_array((4, 64), np.float16)._view((4, 64), (128, 2), offset_bytes=1 << 22)
    rec.allocated(out)
    k = _compiled("k", ("array", "array", "array", "scalar"))
    args = (x[1:], w[:, 8:], out, 7)
    rec.launched(k, (1, 1, 1), (32, 1, 1), args, _flat(args, k._array_flags), 0, True)
    replay = rec.replay(out)
    assert replay is not None and replay.result == 2
    (alloc, launch) = replay.steps
    assert alloc.shape == (4, 64) and alloc.dtype == np.float16
    # pointer slots: (slot of the data pointer, base index, byte offset into the base)
    assert launch.slots == ((4, 0, 128), (9 + 4, 1, 16), (18 + 4, 2, 0))


def test_recorder_keeps_cluster_launches():
    x = metadata_array((4, 64), np.float16)
    k = _compiled("k", ("array",))
    rec = _Recording([x])
    rec.launched(k, (16, 1, 1), (256, 1, 1), (x,), _flat((x,), (True,)), 1024, True, (8, 1, 1))
    (launch,) = rec.replay(x).steps
    assert launch.cluster == (8, 1, 1) and launch.dims == (16, 1, 1, 256, 1, 1, 1024)


def test_recorder_refuses_what_a_replay_cannot_redo():
    x = metadata_array((4, 64), np.float16)
    k = _compiled("k", ("array",))
    stranger = metadata_array((4, 64), np.float16)._view((4, 64), (128, 2), offset_bytes=1 << 24)
    rec = _Recording([x])
    rec.launched(k, (1, 1, 1), (32, 1, 1), (stranger,), _flat((stranger,), (True,)), 0, True)
    assert rec.replay(x) is None and "neither got nor allocated" in rec.reason
    rec = _Recording([x])
    rec.launched(k, (1, 1, 1), (32, 1, 1), (x,), _flat((x,), (True,)), 0, False)
    assert rec.replay(x) is None and "explicit stream" in rec.reason
    addresses = _compiled("k", ("array",))
    addresses.kdef.address_scalars = True  # a tensor map's address among its scalars
    rec = _Recording([x])
    rec.launched(addresses, (1, 1, 1), (32, 1, 1), (x,), _flat((x,), (True,)), 0, True)
    assert rec.replay(x) is None and "raw addresses" in rec.reason
    rec = _Recording([x, x[1:]])  # aliased arguments: not cached, no reason recorded
    assert rec.replay(x) is None and rec.reason is None


# -- GPU: replays compute what the full path computes -------------------------------------------

gpu = pytest.mark.gpu
F16 = np.float16


def _fresh(shape, dtype=F16, rng=np.random.default_rng(7)):
    host = random_array(shape, dtype, rng=rng)
    return host, kaionb.asarray(host)


def _replays(fwd):
    return [v for k, v in (STATE.calls or {}).items() if k[0] is fwd]


@gpu
@pytest.mark.parametrize("shape", [(4, 4096), (3, 1000), (5, 33)])
def test_replayed_row_ops_match_references(shape):
    """Three calls per op, each on new inputs: the first records, the others replay."""
    cases = [
        ("rms_norm", lambda x, g, w: kaionb.rms_norm(x, w),
         lambda x, g, w: norms.rms_norm_ref(x, w)),
        ("layer_norm", lambda x, g, w: kaionb.layer_norm(x, w, g[0]),
         lambda x, g, w: norms.layer_norm_ref(x, w, g[0])),
        ("softmax", lambda x, g, w: kaionb.softmax(x), lambda x, g, w: softmax.softmax_ref(x)),
        ("gelu", lambda x, g, w: kaionb.gelu(x, approximate="tanh"),
         lambda x, g, w: activations.gelu_ref(x, approximate="tanh")),
        ("silu_gate", lambda x, g, w: kaionb.fused_silu_gate(x, g),
         lambda x, g, w: activations.fused_silu_gate_ref(x, g)),
    ]
    for name, ours, ref in cases:
        for _ in range(3):
            (xh, x), (gh, g), (wh, w) = _fresh(shape), _fresh(shape), _fresh(shape[-1:])
            assert_close(ours(x, g, w), ref(xh, gh, wh), dtype=F16, what=name)
    assert _replays(norms._norm_fwd.uncached) and _replays(softmax.softmax_fwd.uncached)


@gpu
def test_cluster_launches_replay(kernels_run):
    """Ops whose kernels run in thread-block clusters (sm_90: a float32 row of 65536 in the
    forward, half rows of 65536 and 131072 in the backward) record their first call and
    replay the others, on new inputs each time."""
    if kaionb._device.compute_capability() < (9, 0):
        pytest.skip("thread-block clusters need compute capability 9.0")
    rng = np.random.default_rng(11)
    for n in (65536, 131072):
        wh, w = _fresh((n,), rng=rng)
        for _ in range(3):
            (xh, x), (gh, g) = _fresh((3, n), rng=rng), _fresh((3, n), rng=rng)
            dx, dw = norms.rms_norm_bwd(g, x, w)
            rdx, rdw = norms.rms_norm_bwd_ref(gh, xh, wh)
            assert_close(dx, rdx, dtype=F16, what="dx")
            assert_close(dw, rdw, tol=1e-4, what="dweight")
    xh = random_array((3, 65536), np.float32, rng=rng)
    wh = random_array((65536,), np.float32, rng=rng)
    for _ in range(3):
        xh = random_array((3, 65536), np.float32, rng=rng)
        assert_close(kaionb.rms_norm(kaionb.asarray(xh), kaionb.asarray(wh)),
                     norms.rms_norm_ref(xh, wh), dtype=np.float32)
    assert any("_cluster8_" in k for k in kernels_run)
    assert any("_cluster16_" in k for k in kernels_run)
    assert any("_c8_" in k or "_c16_" in k for k in kernels_run)
    for fwd in (norms._norm_bwd.uncached, norms._norm_fwd.uncached):
        assert any(r is not _NOT_RECORDED for r in _replays(fwd)), fwd


@gpu
def test_hopper_matmul_repeats_write_their_own_outputs():
    """The wgmma kernels take tensor maps by address (launched in clusters, but never
    replayed): repeated calls, every output kept alive so each lands elsewhere, each hold
    their own product."""
    if kaionb._device.compute_capability() != (9, 0):
        pytest.skip("the wgmma + TMA kernel runs on compute capability 9.0 only")
    (ah, a), (bh, b) = _fresh((2048, 512)), _fresh((512, 2048))
    outs = [matmul.matmul(a, b) for _ in range(3)]
    for c in outs:
        assert_close(c, matmul.matmul_ref(ah, bh), dtype=F16)
    (ah, a), (bh, b) = _fresh((128, 4096)), _fresh((4096, 4096))  # the split tile
    outs = [matmul.matmul(a, b) for _ in range(3)]
    for c in outs:
        assert_close(c, matmul.matmul_ref(ah, bh), dtype=F16)


@gpu
def test_replay_writes_out_and_keeps_validating_new_signatures():
    (xh, x), (wh, w) = _fresh((4, 256)), _fresh((256,))
    out = poisoned((4, 256), F16)
    assert kaionb.rms_norm(x, w, out=out) is out
    (xh, x) = _fresh((4, 256))
    out = poisoned((4, 256), F16)
    assert kaionb.rms_norm(x, w, out=out) is out  # a replay
    assert_close(out, norms.rms_norm_ref(xh, wh), dtype=F16)
    with pytest.raises(ValueError, match="rms_norm: argument 'weight'"):
        kaionb.rms_norm(x, kaionb.asarray(wh[:-1]))  # another signature: validated
    with pytest.raises(TypeError, match="rms_norm: argument 'out'"):
        kaionb.rms_norm(x, w, out=poisoned((4, 256), np.float32))


@gpu
def test_aliased_calls_are_never_replayed_onto_separate_arrays():
    (xh, x), (gh, g) = _fresh((4, 512)), _fresh((4, 512))
    assert_close(kaionb.fused_silu_gate(x, x), activations.fused_silu_gate_ref(xh, xh),
                 dtype=F16)
    assert_close(kaionb.fused_silu_gate(x, g), activations.fused_silu_gate_ref(xh, gh),
                 dtype=F16)
    assert_close(kaionb.fused_silu_gate(g, g), activations.fused_silu_gate_ref(gh, gh),
                 dtype=F16)
    y = x.copy()
    kaionb.gelu(y, out=y)  # in place, twice: the second on new values
    assert_close(y, activations.gelu_ref(xh), dtype=F16)


@gpu
def test_replayed_quantize_zeroes_its_workspace_each_call():
    for axis in (0, -1, None, 0):
        xh, x = _fresh((6, 1000))
        q, s = kaionb.quantize_int8(x, axis=axis)
        qr, sr = quantize.quantize_int8_ref(xh, axis=axis)
        assert_close(s, sr, tol=1e-6)  # f32 amax / 127 against the float64 one
        assert np.abs(q.get().astype(np.int32) - qr).max() <= 1
    assert any(r is not _NOT_RECORDED for r in _replays(quantize.quantize_int8_fwd.uncached))


@gpu
@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (16, 1024, 4096), (1, 300, 77)])
def test_replayed_matmul_matches_reference(m, n, k):
    for _ in range(3):
        (ah, a), (bh, b) = _fresh((m, k)), _fresh((k, n))
        assert_close(kaionb.matmul(a, b), matmul.matmul_ref(ah, bh), tol=2e-3)
        out = poisoned((m, n), np.float32)
        kaionb.matmul(a, b, out=out)
        assert_close(out, matmul.matmul_ref(ah, bh), tol=1e-3)


@gpu
def test_replays_follow_the_current_stream():
    (xh, x), (wh, w) = _fresh((4, 128)), _fresh((128,))
    kaionb.rms_norm(x, w)
    s = kaionb.Stream()
    with kaionb.stream(s):
        (xh, x) = _fresh((4, 128))
        y = kaionb.rms_norm(x, w)
        assert_close(y, norms.rms_norm_ref(xh, wh), dtype=F16)
    assert isinstance(y, DeviceArray)


def test_a_replay_returns_a_single_view_result():
    """A result that is a view into what the call allocated is described by a tuple: a
    replay once read that description as a tuple of results (found by fuzzing: softmax
    of a transposed x, called twice)."""
    base = metadata_array((8,), np.float32)
    replay = _Replay((), _View(0, 4, (2, 3), (4, 8), np.dtype(np.float32)), 0)
    view = replay([base])
    assert type(view) is DeviceArray and view.shape == (2, 3) and view.strides == (4, 8)
    assert view.ptr == base.ptr + 4
    pair = _Replay((), (0, _View(0, 4, (2,), (4,), np.dtype(np.float32))), 0)([base])
    assert pair[0] is base and pair[1].shape == (2,) and pair[1].ptr == base.ptr + 4


@gpu
def test_softmax_of_a_transposed_x_replays():
    """softmax of a transposed x returns a view of its own allocation: the second (replayed)
    call must return it as the first did."""
    rng = np.random.default_rng(41)
    for _ in range(3):
        h = random_array((5, 3), np.float32, rng=rng)
        got = softmax.softmax(kaionb.asarray(h).T, 0)
        e = np.exp(h.T - h.T.max(axis=0))
        assert_close(got.get(), e / e.sum(axis=0), dtype=np.float32)
