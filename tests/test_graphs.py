"""CUDA graph capture of kaionb ops: kaionb.graph(), torch.cuda.graph and CuPy's stream
capture. A decode step (rms_norm → matmul → fused_silu_gate → matmul) is captured once
and replayed on new input values, checked against float64 NumPy each time."""

import numpy as np
import pytest

import kaionb
from kaionb.kernels import activations, matmul, norms
from kaionb.kernels.elementwise import copy_convert
from kaionb.testing import assert_close, random_array

pytestmark = pytest.mark.gpu

F16 = np.float16
TOL = 5e-3  # three f16 roundings of intermediates between f32-accumulated steps
HIDDEN, FFN = 512, 1024


def _weights(rng):
    host = {"norm": random_array((HIDDEN,), F16, rng=rng),
            "gate": random_array((HIDDEN, FFN), F16, rng=rng, scale=HIDDEN ** -0.5),
            "up": random_array((HIDDEN, FFN), F16, rng=rng, scale=HIDDEN ** -0.5),
            "down": random_array((FFN, HIDDEN), F16, rng=rng, scale=FFN ** -0.5)}
    return host, {k: kaionb.asarray(v) for k, v in host.items()}


def _decode_step(x, w, out=None):
    h = kaionb.rms_norm(x, w["norm"])
    act = kaionb.fused_silu_gate(kaionb.matmul(h, w["gate"]), kaionb.matmul(h, w["up"]))
    return kaionb.matmul(act, w["down"], out=out)


def _decode_ref(x, w):
    r16 = lambda v: np.asarray(v, F16).astype(np.float64)  # noqa: E731  (f16 storage)
    h = r16(norms.rms_norm_ref(x, w["norm"]))
    gate, up = r16(matmul.matmul_ref(h, w["gate"])), r16(matmul.matmul_ref(h, w["up"]))
    act = r16(activations.fused_silu_gate_ref(gate, up))
    return matmul.matmul_ref(act, w["down"])


def _step_inputs(seed):
    """(host weights, device weights, input x, f32 output y) for one decode step."""
    rng = np.random.default_rng(seed)
    wh, w = _weights(rng)
    x = kaionb.asarray(random_array((4, HIDDEN), F16, rng=rng))
    return rng, wh, w, x, kaionb.empty((4, HIDDEN), np.float32)


def _write(dst, host):
    copy_convert(kaionb.asarray(host), dst)


def _check_replays(replay, x, y, wh, rng, times=3):
    # Memory the graph allocated (y, when the capture allocated it) exists from the first
    # replay on: poison it only after one.
    replay()
    for _ in range(times):
        xh = random_array(x.shape, F16, rng=rng)
        _write(x, xh)
        y.fill(np.nan)
        # The graph may replay on another stream (CuPy's non-blocking one): the new input
        # and the poison must be in memory first.
        kaionb.current_stream().synchronize()
        replay()
        assert_close(y, _decode_ref(xh, wh), tol=TOL, what="replayed decode step")


def test_kaionb_graph_captures_a_decode_step_and_replays_on_new_inputs():
    rng = np.random.default_rng(0)
    wh, w = _weights(rng)
    x = kaionb.asarray(random_array((4, HIDDEN), F16, rng=rng))
    with kaionb.graph() as g:
        y = _decode_step(x, w)  # y is allocated by the graph
    assert g.kept_buffers >= 5  # x and the four weights
    _check_replays(g.replay, x, y, wh, rng)
    g.close()
    with pytest.raises(RuntimeError, match="not complete"):
        g.replay()


def test_kaionb_graph_keeps_its_inputs_alive():
    rng = np.random.default_rng(1)
    wh, w = _weights(rng)
    xh = random_array((4, HIDDEN), F16, rng=rng)
    x = kaionb.asarray(xh)
    y = kaionb.empty((4, HIDDEN), np.float32)
    with kaionb.graph() as g:
        _decode_step(x, w, out=y)
    del x, w  # the graph holds their memory
    for _ in range(2):
        junk = [kaionb.asarray(random_array((4, HIDDEN), F16, rng=rng)) for _ in range(8)]
        y.fill(np.nan)
        g.replay()
        assert_close(y, _decode_ref(xh, wh), tol=TOL)
        del junk


def test_torch_cuda_graph_captures_kaionb_ops():
    torch = pytest.importorskip("torch")
    rng, wh, w, x, y = _step_inputs(2)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), kaionb.stream(side):  # warm-up, as torch asks
        _decode_step(x, w, out=y)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with kaionb.stream(torch.cuda.current_stream()):
            _decode_step(x, w, out=y)
            extra = kaionb.gelu(x)  # an output allocated inside torch's capture
    _check_replays(lambda: (g.replay(), torch.cuda.synchronize()), x, y, wh, rng)
    assert_close(extra, activations.gelu_ref(x.get()), dtype=F16)


def test_cupy_stream_capture_captures_kaionb_ops():
    cp = pytest.importorskip("cupy")
    rng, wh, w, x, y = _step_inputs(3)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        with kaionb.stream(s):
            _decode_step(x, w, out=y)
        cg = s.end_capture()
    _check_replays(lambda: (cg.launch(s), s.synchronize()), x, y, wh, rng)


def test_split_k_matmul_and_its_workspace_in_a_graph():
    rng = np.random.default_rng(4)
    ah, bh = random_array((16, 4096), F16, rng=rng), random_array((4096, 1024), F16, rng=rng)
    a, b = kaionb.asarray(ah), kaionb.asarray(bh)
    with kaionb.graph() as g:
        c = kaionb.matmul(a, b)
    g.replay()  # c is the graph's memory: it exists from the first replay on
    for _ in range(3):
        ah = random_array((16, 4096), F16, rng=rng)
        _write(a, ah)
        c.fill(np.nan)
        g.replay()
        assert_close(c, matmul.matmul_ref(ah, bh), tol=2e-3)
    eager = kaionb.matmul(a, b)  # the same shapes outside the graph still work
    assert_close(eager, matmul.matmul_ref(ah, bh), tol=2e-3)


def test_long_reductions_fold_in_a_graph():
    """A sum and an argmax split in chunks (the last chunk of the row merges the partials
    through an arrival workspace): captured, replayed on new values, with eager calls of
    the same shapes (the stream's cached workspace) in between."""
    rng = np.random.default_rng(6)
    n = (1 << 20) + 3
    x = kaionb.asarray(random_array((n,), np.float32, rng=rng))
    with kaionb.graph() as g:
        total, where = kaionb.sum(x), kaionb.argmax(x)
    g.replay()
    for _ in range(3):
        xh = random_array((n,), np.float32, rng=rng)
        _write(x, xh)
        total.fill(np.nan)
        where.fill(-1)
        g.replay()
        eager = kaionb.sum(x)
        assert_close(total, np.sum(xh.astype(np.float64)), tol=1e-5)
        assert int(where.get()) == int(np.argmax(xh))
        assert eager.get().tobytes() == total.get().tobytes()  # the same kernel, same bits


def test_hopper_matmul_tensor_maps_in_a_graph():
    if kaionb._device.compute_capability() != (9, 0):
        pytest.skip("the wgmma + TMA kernel runs on compute capability 9.0 only")
    rng = np.random.default_rng(5)
    ah, bh = random_array((2048, 512), F16, rng=rng), random_array((512, 2048), F16, rng=rng)
    a, b = kaionb.asarray(ah), kaionb.asarray(bh)
    out = kaionb.empty((2048, 2048), F16)
    with kaionb.graph() as g:
        matmul.matmul_fwd("matmul", a, b, loads="wgmma", out=out)
    for _ in range(2):
        ah = random_array((2048, 512), F16, rng=rng)
        _write(a, ah)
        out.fill(np.nan)
        g.replay()
        assert_close(out, matmul.matmul_ref(ah, bh), tol=2e-3)


@pytest.mark.parametrize("m, tile", [(100, "split64"), (128, "split64"), (256, "split")])
def test_hopper_split_k_matmul_in_a_graph(monkeypatch, m, tile):
    """The public matmul on shapes the split tiles take (M = 100 / 128 / 256 on 32 / 32 /
    64 narrow tiles, K = 4096: a fifth to half a wave, K split over a cluster per tile,
    partials exchanged in distributed shared memory — a cluster launch in the graph; M = 100:
    A's TMA box cut at 104 rows): captured,
    replayed on new values, with eager calls of the same shape through the plan cache in
    between — the same bits."""
    if kaionb._device.compute_capability() != (9, 0):
        pytest.skip("the wgmma + TMA kernel runs on compute capability 9.0 only")
    from kaionb.kernels import matmul_hopper as mh

    launched = []
    real = mh.launch
    monkeypatch.setattr(mh, "launch",
                        lambda *args, **kw: launched.append(args[1]) or real(*args, **kw))
    matmul._HOPPER_PLANS.clear()
    rng = np.random.default_rng(8)
    ah, bh = random_array((m, 4096), F16, rng=rng), random_array((4096, 4096), F16, rng=rng)
    a, b = kaionb.asarray(ah), kaionb.asarray(bh)
    with kaionb.graph() as g:
        c = kaionb.matmul(a, b)
    assert launched == [tile]
    g.replay()
    for _ in range(3):
        ah = random_array((m, 4096), F16, rng=rng)
        _write(a, ah)
        c.fill(np.nan)
        g.replay()
        eager = kaionb.matmul(a, b)
        assert_close(c, matmul.matmul_ref(ah, bh), tol=2e-3)
        assert eager.get().tobytes() == c.get().tobytes()
    assert launched == [tile] and len(matmul._HOPPER_PLANS) == 1  # eager: the cached plan


# -- what cannot be captured, and bad streams ---------------------------------------------------


def test_host_transfers_in_a_capture_raise_and_leave_the_context_usable():
    xh = random_array((4, 256), F16)
    x = kaionb.asarray(xh)
    with pytest.raises(RuntimeError, match="capturing a CUDA graph"):
        with kaionb.graph():
            kaionb.gelu(x).get()
    with pytest.raises(RuntimeError, match="capturing a CUDA graph"):
        with kaionb.graph():
            kaionb.asarray(xh)
    assert_close(kaionb.gelu(x), activations.gelu_ref(xh), dtype=F16)  # still usable


def test_graph_misuse_is_a_clear_error():
    with pytest.raises(ValueError, match="default stream"):
        with kaionb.graph(stream=0):
            pass
    with kaionb.graph():
        with pytest.raises(RuntimeError, match="do not nest"):
            with kaionb.graph():
                pass


def test_a_stream_of_another_context_is_refused():
    from cuda.bindings import driver

    kaionb._device.current_device()
    err, dev = driver.cuDeviceGet(0)
    try:
        err, ctx = driver.cuCtxCreate(None, 0, dev)  # cuda-bindings 13: (params, flags, dev)
    except TypeError:
        err, ctx = driver.cuCtxCreate(0, dev)  # 12.x: (flags, dev)
    assert int(err) == 0  # the new context is current now
    err, handle = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
    driver.cuCtxPopCurrent()  # back to the primary context
    assert int(err) == 0
    try:
        with pytest.raises(ValueError, match="got a stream of another context"):
            with kaionb.stream(int(handle)):
                pass
        xh = random_array((4, 64), F16)
        assert_close(kaionb.gelu(kaionb.asarray(xh)), activations.gelu_ref(xh), dtype=F16)
    finally:
        driver.cuCtxPushCurrent(ctx)
        driver.cuStreamDestroy(handle)
        driver.cuCtxPopCurrent()
        driver.cuCtxDestroy(ctx)
