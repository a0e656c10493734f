"""Backward passes of rms_norm, layer_norm and add_rms_norm: bad input refused before any
launch and the float64 references checked against finite differences (CPU); on a GPU the
kernels against those references over every row width / row count / dtype, against torch
autograd in float64 where torch is installed, through the tape (gradcheck), and the
weight gradients bit-identical from run to run."""

import numpy as np
import pytest

import kaionb
from kaionb._device import STATE
from kaionb.array import bfloat16
from kaionb.grad import Tape, gradcheck
from kaionb.kernels import launch, norms, op
from kaionb.kernels.elementwise import add
from kaionb.kernels.norms import (
    add_rms_norm,
    add_rms_norm_bwd,
    add_rms_norm_bwd_ref,
    add_rms_norm_ref,
    layer_norm,
    layer_norm_bwd,
    layer_norm_bwd_ref,
    layer_norm_ref,
    rms_norm,
    rms_norm_bwd,
    rms_norm_bwd_ref,
    rms_norm_ref,
)
from kaionb.testing import poisoned, random_array, relative_error
from kaionb.testing import metadata_array as fake
from row_cases import CASES, DTYPES

gpu = pytest.mark.gpu
F32 = np.dtype(np.float32)

# Relative error of dx against float64, measured against the size of the terms the
# backward subtracts (‖rstd·dy‖ + ‖ref‖): a row whose dx nearly cancels (RMSNorm of one
# element: dx = rstd·dy·eps/(x² + eps)) is held to rounding of its terms, not of its
# tiny result. Inputs are exact in every dtype, so the error is float32 arithmetic and
# the rounding of dx to its dtype. Weight gradients are float32 sums of exact products.
DX_TOLERANCE = {F32: 5e-5, np.dtype(np.float16): 3e-3, bfloat16: 2e-2}
DW_TOLERANCE = 5e-5

# (x dtype, gradient dtype): the gradient in x's dtype (as torch's autograd passes it) or
# float32 (the tape's).
GRAD_DTYPES = [(np.dtype(d), np.dtype(g)) for d in DTYPES for g in dict.fromkeys((d, F32))]


def _ids(pair):
    return f"{pair[0].name}-grad_{pair[1].name}"


# ----------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("fn", [rms_norm_bwd, layer_norm_bwd])
def test_grad_dtype(fn):
    # float16 x: the gradient comes in float16 or float32, nothing else.
    with pytest.raises(TypeError, match=rf"{fn.__name__}: argument 'grad' expected dtype "
                       r"float16 or float32, got bfloat16"):
        fn(fake((4, 8), bfloat16), fake((4, 8), np.float16), fake((8,), np.float16))
    with pytest.raises(TypeError, match=rf"{fn.__name__}: argument 'grad' expected dtype "
                       r"float32, got float16"):
        fn(fake((4, 8), np.float16), fake((4, 8)), fake((8,)))


@pytest.mark.parametrize("fn", [rms_norm_bwd, layer_norm_bwd])
def test_bwd_shapes(fn):
    name = fn.__name__
    with pytest.raises(ValueError, match=rf"{name}: argument 'grad' expected shape \(4, 8\), "
                       r"got \(4, 9\)"):
        fn(fake((4, 9)), fake((4, 8)), fake((8,)))
    with pytest.raises(ValueError, match=rf"{name}: argument 'weight' expected shape \(8,\), "
                       r"got \(7,\)"):
        fn(fake((4, 8)), fake((4, 8)), fake((7,)))
    with pytest.raises(TypeError, match=rf"{name}: argument 'x' expected dtype"):
        fn(fake((4, 8), np.int32), fake((4, 8), np.int32), fake((8,), np.int32))
    with pytest.raises(TypeError, match=rf"{name}: argument 'weight' expected the dtype of "
                       r"'x' \(float16\), got float32"):
        fn(fake((4, 8)), fake((4, 8), np.float16), fake((8,)))


@pytest.mark.parametrize("fn", [rms_norm_bwd, layer_norm_bwd])
def test_bwd_layouts_eps_and_out(fn):
    name = fn.__name__
    strided = fake((4, 16))._view((4, 8), (64, 8))
    with pytest.raises(ValueError, match=rf"{name}: argument 'grad' expected a contiguous "
                       "last axis"):
        fn(strided, fake((4, 8)), fake((8,)))
    with pytest.raises(ValueError, match=rf"{name}: argument 'eps' expected a finite value"):
        fn(fake((4, 8)), fake((4, 8)), fake((8,)), eps=-1.0)
    with pytest.raises(TypeError, match=rf"{name}: argument 'out' expected a tuple of 2 "
                       "arrays, got a tuple of 1"):
        fn(fake((4, 8)), fake((4, 8)), fake((8,)), out=(fake((4, 8)),))
    with pytest.raises(TypeError, match=rf"{name}: argument 'out\[1\]' expected dtype "
                       "float32, got float16"):
        fn(fake((4, 8), np.float16), fake((4, 8), np.float16), fake((8,), np.float16),
           out=(fake((4, 8), np.float16), fake((8,), np.float16)))


def test_layer_norm_bwd_bias():
    with pytest.raises(ValueError, match=r"layer_norm_bwd: argument 'bias' expected shape "
                       r"\(8,\), got \(9,\)"):
        layer_norm_bwd(fake((4, 8)), fake((4, 8)), fake((8,)), fake((9,)))
    with pytest.raises(TypeError, match=r"layer_norm_bwd: argument 'out' expected a tuple of "
                       "3 arrays"):
        layer_norm_bwd(fake((4, 8)), fake((4, 8)), fake((8,)), fake((8,)),
                       out=(fake((4, 8)), fake((8,))))


def test_add_rms_norm_bwd_inputs():
    with pytest.raises(ValueError, match=r"add_rms_norm_bwd: argument 's' expected 1 or more "
                       "dimensions"):
        add_rms_norm_bwd(fake(()), None, fake(()), fake((1,)))
    with pytest.raises(ValueError, match=r"add_rms_norm_bwd: argument 'grad_residual' "
                       r"expected shape \(4, 8\), got \(8, 4\)"):
        add_rms_norm_bwd(fake((4, 8)), fake((8, 4)), fake((4, 8)), fake((8,)))
    with pytest.raises(TypeError, match=r"add_rms_norm_bwd: argument 'grad_residual' "
                       r"expected the dtype of 'grad' \(float32\), got float16"):
        add_rms_norm_bwd(fake((4, 8)), fake((4, 8), np.float16), fake((4, 8), np.float16),
                         fake((8,), np.float16))
    with pytest.raises(TypeError, match=r"add_rms_norm_bwd: argument 'grad' expected dtype "
                       r"bfloat16 or float32, got float16"):
        add_rms_norm_bwd(fake((4, 8), np.float16), None, fake((4, 8), bfloat16),
                         fake((8,), bfloat16))


@pytest.fixture
def planned(monkeypatch):
    """The backward's launches and partial-sum reductions, recorded instead of run: a GPU of
    132 SMs with 2 resident blocks each (a wave of 264), sm_90 (``calls.cc``) with its
    227 KiB of shared memory a block (``calls.shared_limit``). The fast path's replays of these calls (which
    launched nothing) are dropped after."""

    class Calls(list):
        shared_limit = 227 * 1024
        cc = (9, 0)

    calls = Calls()

    class Compiled:
        def __init__(self, kdef):
            self.kdef = kdef
            self.max_dynamic_shared = min(max(kdef.max_dynamic_shared_bytes, 48 * 1024),
                                          calls.shared_limit)

        def __call__(self, grid, block, args, shared_mem=0, cluster=None):
            calls.append((self.kdef.name, grid, block, shared_mem, args))

        def max_active_clusters(self, cluster, block, shared_mem):
            return 264 // cluster[0]

    monkeypatch.setattr(launch.KernelDef, "__getitem__", lambda kdef, sig: Compiled(kdef))

    monkeypatch.setattr(norms, "multiprocessor_count", lambda device=0: 132)
    monkeypatch.setattr(norms, "compute_capability", lambda device=None: calls.cc)
    monkeypatch.setattr(norms, "_resident_blocks", lambda kernel, threads, shared: 2)
    monkeypatch.setattr(norms, "empty", lambda shape, dtype: fake(shape, dtype))
    monkeypatch.setattr(op, "empty", lambda shape, dtype: fake(shape, dtype))
    monkeypatch.setattr(norms, "reduce_fwd", lambda op, part, axis, *, out: calls.append(
        ("reduce", part, out)))
    saved, STATE.calls = STATE.calls, None
    yield calls
    STATE.calls = saved


@pytest.mark.parametrize("x_dt,g_dt,n,kernel,threads,cache,stages,shared", [
    # The staged path: x and g of one row in shared memory (two for LayerNorm and in
    # clusters), chunks of 8 bf16 (16 + 16 bytes), or 8 with a float32 g (16 + 32), or 4
    # float32 (16 + 16).
    (bfloat16, bfloat16, 2048, "_rms_norm_bwd_kernel_bfloat16_bfloat16", 256, -1, 1,
     256 * 32),
    (bfloat16, F32, 8192, "_rms_norm_bwd_kernel_bfloat16_float32", 1024, -1, 1, 1024 * 48),
    # Half rows from SHARED_ONE_CTA_MIN elements (and any row too wide for one CTA's
    # registers): x, g and 16 dw accumulators a thread in one CTA's shared memory, one stage.
    (bfloat16, bfloat16, 4096, "_rms_norm_bwd_kernel_shared_bfloat16_bfloat16", 256, -1, 1,
     512 * 32 + 256 * 16 * 4),
    (bfloat16, bfloat16, 16384, "_rms_norm_bwd_kernel_shared_bfloat16_bfloat16", 1024, -1,
     1, 2048 * 32 + 1024 * 16 * 4),
    (F32, F32, 16384, "_rms_norm_bwd_kernel_shared_float32_float32", 1024, -1, 1,
     4096 * 32 + 1024 * 16 * 4),
    # Rows wider than one CTA holds: a cluster of 8 CTAs (sm_90), 1024 chunks of 8 each.
    # (2048 chunks of 48 bytes and 16384 accumulators would not fit one CTA's 227 KiB.)
    (bfloat16, F32, 65536, "_rms_norm_bwd_kernel_cluster8_bfloat16_float32", 1024, -1, 2,
     2 * 1024 * 48),
    (bfloat16, bfloat16, 65536, "_rms_norm_bwd_kernel_cluster8_bfloat16_bfloat16", 1024, -1,
     2, 2 * 1024 * 32),
    # Wider rows: a cluster of 16 CTAs holding x, g and the dw accumulators (16 a thread)
    # in shared memory: 1024 chunks of 48 bytes a stage and 512 × 16 accumulators, two
    # stages; at 262144 2048 chunks and 1024 threads, and one stage.
    (bfloat16, F32, 131072, "_rms_norm_bwd_kernel_cluster16_bfloat16_float32", 512, -1, 2,
     2 * 1024 * 48 + 512 * 16 * 4),
    (bfloat16, F32, 262144, "_rms_norm_bwd_kernel_cluster16_bfloat16_float32", 1024, -1, 1,
     2048 * 48 + 1024 * 16 * 4),
    # Streaming: a misaligned row (251 chunks of 4 float32 and one for the ragged ends) and
    # a row wider than 16 CTAs (chunks of 8: 16 bytes of x, 32 of g, cached up to 96 KiB).
    (F32, F32, 4096, "_rms_norm_bwd_kernel_float32_float32", 512, -1, 1, 1024 * 32),
    (F32, F32, 1001, "_rms_norm_bwd_kernel_wide_float32_float32", 256, 252, 1, 252 * 32),
    (bfloat16, F32, 524288, "_rms_norm_bwd_kernel_wide_bfloat16_float32", 512, 2048, 1,
     98304),
])
def test_rms_norm_bwd_plan(planned, x_dt, g_dt, n, kernel, threads, cache, stages, shared):
    # Register rows up to 16 (halves) or 8 elements per thread; a wave of blocks, each
    # writing a row of float32 partials that one column reduction sums.
    rows = 1000
    dx, dw = fake((rows, n), g_dt), fake((n,))
    got = rms_norm_bwd(fake((rows, n), g_dt), fake((rows, n), x_dt), fake((n,), x_dt),
                       out=(dx, dw))
    assert got[0] is dx and got[1] is dw
    (name, grid, block, shared_mem, args), (_, part, final) = planned
    # A wave of 264 blocks; with a cluster, 33 clusters of 8 or 16 of 16 (partials per
    # cluster).
    size = 16 if "cluster16" in kernel else 8 if "cluster" in kernel else 1
    parts = 264 // size
    assert (name, grid, block, shared_mem, args[-2:]) == (
        kernel, (parts * size,), (threads,), shared, (cache, stages))
    assert args[5] is part and part.shape == (parts, n) and part.dtype == F32 and final is dw
    assert args[7:11] == (n, 1e-6, 0, 0)  # n, eps, has_bias, has_gs


def test_norm_bwd_one_stage_where_two_do_not_fit(planned):
    # LayerNorm stages two rows where they fit: 2 × 64 KiB of float32 x and g at n = 8192
    # on sm_90, one on sm_89, which lets a block opt in to 99 KiB.
    n = 8192
    for limit, stages in ((227 * 1024, 2), (99 * 1024, 1)):
        planned.shared_limit = limit
        layer_norm_bwd(fake((1000, n)), fake((1000, n)), fake((n,)))
        (name, _, _, shared_mem, args), *_ = planned
        assert (name, shared_mem, args[-1]) == ("_layer_norm_bwd_kernel_float32_float32",
                                                 stages * 2048 * 32, stages)
        planned.clear()


def test_layer_norm_bwd_cluster_of_512_thread_ctas(planned):
    # LayerNorm's cluster CTAs hold 16 elements a thread in up to 512 threads.
    n = 65536
    layer_norm_bwd(fake((1000, n), np.float16), fake((1000, n), np.float16),
                   fake((n,), np.float16))
    (name, grid, block, shared_mem, args), *_ = planned
    assert (name, block, shared_mem, args[-2:]) == (
        "_layer_norm_bwd_kernel_cluster8_float16_float16", (512,), 2 * 1024 * 32, (-1, 2))


def test_layer_norm_bwd_shared_rows_where_they_fit(planned):
    # At 262144 elements a CTA of the 16 holds 16384 dw and db accumulators (128 KiB): one
    # stage of float16 x and g (64 KiB) fits beside them, float32 (128 KiB) does not.
    n = 262144
    for dt, name, shared, stages in (
            (np.float16, "_layer_norm_bwd_kernel_cluster16_float16_float16", 65536 + 131072, 1),
            (F32, "_layer_norm_bwd_kernel_wide_float32_float32", 98304, 1)):
        layer_norm_bwd(fake((100, n), dt), fake((100, n), dt), fake((n,), dt))
        (got, grid, block, shared_mem, args), *_ = planned
        assert (got, shared_mem, args[-1]) == (name, shared, stages)
        planned.clear()


def test_norm_bwd_no_cluster_before_sm_90(planned):
    # A row a cluster would hold streams on sm_89: 96 KiB of x and g parked, 3072 chunks.
    planned.cc = (8, 9)
    n = 65536
    layer_norm_bwd(fake((1000, n), np.float16), fake((1000, n), np.float16),
                   fake((n,), np.float16))
    (name, grid, block, shared_mem, args), *_ = planned
    assert name == "_layer_norm_bwd_kernel_wide_float16_float16" and args[-2:] == (3072, 1)


def test_layer_norm_and_add_bwd_flags(planned):
    x, g, w = fake((3, 4096), np.float16), fake((3, 4096)), fake((4096,), np.float16)
    dx, dw, db = layer_norm_bwd(g, x, w, w, 1e-5)
    (name, grid, *_, args), *reductions = planned
    # Three rows: three blocks, partials (3, n) for dw and db, bias flag set.
    assert name == "_layer_norm_bwd_kernel_shared_float16_float32" and grid == (3,)
    assert args[9:11] == (1, 0) and args[5].shape == args[6].shape == (3, 4096)
    assert [(r[1], r[2]) for r in reductions] == [(args[5], dw), (args[6], db)]
    planned.clear()
    ds, dw = add_rms_norm_bwd(g, g, x, w)
    (name, grid, *_, args), _ = planned
    assert name == "_rms_norm_bwd_kernel_float16_float32" and args[9:11] == (0, 1)
    planned.clear()
    # One row: the kernel writes dweight itself, nothing to sum.
    dx, dw = rms_norm_bwd(fake((1, 4096)), fake((1, 4096), np.float16), w)
    (name, grid, *_, args), = planned
    assert grid == (1,) and args[5].ptr == dw.ptr and args[5].shape == (1, 4096)


def _numeric_grad(f, a, h=1e-6):
    out = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        up, down = a.copy(), a.copy()
        up[i] += h
        down[i] -= h
        out[i] = (f(up) - f(down)) / (2 * h)
    return out


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 1), (1, 17)])
def test_references_match_finite_differences(shape):
    # The float64 references every GPU test trusts, against central differences of the
    # forward references.
    rng = np.random.default_rng(sum(shape))
    x, g, r, gs = (rng.standard_normal(shape) for _ in range(4))
    w, b = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    close = dict(rtol=1e-6, atol=1e-7)

    dx, dw = rms_norm_bwd_ref(g, x, w)
    np.testing.assert_allclose(dx, _numeric_grad(lambda a: np.sum(rms_norm_ref(a, w) * g), x),
                               **close)
    np.testing.assert_allclose(dw, _numeric_grad(lambda a: np.sum(rms_norm_ref(x, a) * g), w),
                               **close)

    dx, dw, db = layer_norm_bwd_ref(g, x, w, b)
    np.testing.assert_allclose(
        dx, _numeric_grad(lambda a: np.sum(layer_norm_ref(a, w, b) * g), x), **close)
    np.testing.assert_allclose(
        dw, _numeric_grad(lambda a: np.sum(layer_norm_ref(x, a, b) * g), w), **close)
    np.testing.assert_allclose(
        db, _numeric_grad(lambda a: np.sum(layer_norm_ref(x, w, a) * g), b), **close)
    assert layer_norm_bwd_ref(g, x, w)[2] is None

    def loss(xx, rr, ww):  # L = Σ normed·g + Σ s·gs
        normed, s = add_rms_norm_ref(xx, rr, ww)
        return np.sum(normed * g) + np.sum(s * gs)

    ds, dw = add_rms_norm_bwd_ref(g, gs, x + r, w)
    np.testing.assert_allclose(ds, _numeric_grad(lambda a: loss(a, r, w), x), **close)
    np.testing.assert_allclose(ds, _numeric_grad(lambda a: loss(x, a, w), r), **close)
    np.testing.assert_allclose(dw, _numeric_grad(lambda a: loss(x, r, a), w), **close)


def test_references_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, g, r, gs = (rng.standard_normal((4, 33)) for _ in range(4))
    w, b = rng.standard_normal(33), rng.standard_normal(33)
    for got, want in zip(rms_norm_bwd_ref(g, x, w), _torch_grads(torch, "rms_norm", g, x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for got, want in zip(layer_norm_bwd_ref(g, x, w, b),
                         _torch_grads(torch, "layer_norm", g, x, w, b)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    ds, dw = add_rms_norm_bwd_ref(g, gs, x + r, w)
    t_dx, t_dw, t_dr = _torch_grads(torch, "add_rms_norm", g, x, w, r, gs)
    for got, want in ((ds, t_dx), (ds, t_dr), (dw, t_dw)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def _torch_grads(torch, op, g, x, w, extra=None, g_extra=None, eps=None):
    """torch autograd in float64 on the CPU: the gradients of Σ op(...)·g (+ Σ s·g_extra)
    with respect to x, weight (and bias or residual)."""
    t = [torch.tensor(np.asarray(a, np.float64), requires_grad=True)
         for a in ((x, w) if extra is None else (x, w, extra))]
    tg = torch.tensor(np.asarray(g, np.float64))
    if op == "rms_norm":
        xx, ww = t
        y = xx * torch.rsqrt(xx.pow(2).mean(-1, keepdim=True) + (eps or 1e-6)) * ww
        loss = (y * tg).sum()
    elif op == "layer_norm":
        y = torch.nn.functional.layer_norm(t[0], t[0].shape[-1:], t[1],
                                           None if extra is None else t[2], eps or 1e-5)
        loss = (y * tg).sum()
    else:
        xx, ww, rr = t
        s = xx + rr
        y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + (eps or 1e-6)) * ww
        loss = (y * tg).sum() + (s * torch.tensor(np.asarray(g_extra, np.float64))).sum()
    loss.backward()
    grads = [a.grad.numpy() for a in t]
    return (grads[0], grads[1], grads[2]) if extra is not None else (grads[0], grads[1])


# ----------------------------------------------------------------------------- GPU

def assert_dx(got, ref, scale, dtype, what="dx"):
    """‖got − ref‖ ≤ tol · (‖ref‖ + ‖scale‖); the worst elements printed otherwise."""
    host = got.get().astype(np.float64) if hasattr(got, "get") else np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert host.shape == ref.shape, (host.shape, ref.shape)
    assert np.all(np.isfinite(host)), f"{what}: non-finite values (unwritten output?)"
    bound = DX_TOLERANCE[np.dtype(dtype)] * (np.linalg.norm(ref) + np.linalg.norm(scale))
    err = np.linalg.norm(host - ref)
    if not err <= bound:
        bad = np.argsort(-np.abs(host - ref).ravel())[:5]
        shown = ", ".join(f"[{np.unravel_index(i, ref.shape)}] {host.ravel()[i]!r} vs "
                          f"{ref.ravel()[i]!r}" for i in bad)
        raise AssertionError(f"{what}: error {err:.3e} > bound {bound:.3e}; worst: {shown}")


def assert_dw(got, ref, what="dweight"):
    host = got.get()
    assert host.dtype == np.float32 and host.shape == np.shape(ref)
    err = relative_error(host, ref)
    assert err <= DW_TOLERANCE, f"{what}: relative error {err:.3e} > {DW_TOLERANCE:.0e}"


def _dy_scale(g, x, w, eps, layer=False):
    """rstd·g·w in float64: the size of dx's terms."""
    x = np.asarray(x, np.float64)
    if layer:
        x = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return rstd * np.asarray(g, np.float64) * np.asarray(w, np.float64)


def _inputs(rows, n, x_dt, g_dt, seed, *, x_scale=1.0, x_offset=0.0):
    rng = np.random.default_rng(seed)
    x = random_array((rows, n), x_dt, rng=rng, scale=x_scale, offset=x_offset)
    g = random_array((rows, n), g_dt, rng=rng)
    w = random_array((n,), x_dt, rng=rng, scale=0.5, offset=1.0)
    return x, g, w


def _outs(shape, g_dt, n, with_bias=False):
    outs = [poisoned(shape, g_dt), poisoned((n,), np.float32)]
    if with_bias:
        outs.append(poisoned((n,), np.float32))
    return tuple(outs)


@gpu
@pytest.mark.parametrize("dtypes", GRAD_DTYPES, ids=_ids)
@pytest.mark.parametrize("rows,n", CASES)
def test_rms_norm_bwd(dtypes, rows, n):
    x_dt, g_dt = dtypes
    x, g, w = _inputs(rows, n, x_dt, g_dt, rows * 17 + n)
    out = _outs(x.shape, g_dt, n)
    got = rms_norm_bwd(kaionb.asarray(g), kaionb.asarray(x), kaionb.asarray(w), 1e-6, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    dx, dw = rms_norm_bwd_ref(g, x, w, 1e-6)
    assert_dx(out[0], dx, _dy_scale(g, x, w, 1e-6), g_dt)
    assert_dw(out[1], dw)


@gpu
@pytest.mark.parametrize("dtypes", GRAD_DTYPES, ids=_ids)
@pytest.mark.parametrize("rows,n", CASES)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_layer_norm_bwd(dtypes, rows, n, with_bias):
    x_dt, g_dt = dtypes
    # An offset mean: the statistics must be taken around it.
    x, g, w = _inputs(rows, n, x_dt, g_dt, rows * 19 + n, x_scale=2.0, x_offset=3.0)
    b = random_array((n,), x_dt, rng=np.random.default_rng(n)) if with_bias else None
    out = _outs(x.shape, g_dt, n, with_bias)
    got = layer_norm_bwd(kaionb.asarray(g), kaionb.asarray(x), kaionb.asarray(w),
                         None if b is None else kaionb.asarray(b), 1e-5, out=out)
    dx, dw, db = layer_norm_bwd_ref(g, x, w, b, 1e-5)
    assert_dx(got[0], dx, _dy_scale(g, x, w, 1e-5, layer=True), g_dt)
    assert_dw(got[1], dw)
    if with_bias:
        assert got[2] is out[2]
        assert_dw(got[2], db, "dbias")
    else:
        assert got[2] is None


@gpu
@pytest.mark.parametrize("dtypes", GRAD_DTYPES, ids=_ids)
@pytest.mark.parametrize("rows,n", CASES)
@pytest.mark.parametrize("with_grad_residual", [True, False], ids=["g_s", "no_g_s"])
def test_add_rms_norm_bwd(dtypes, rows, n, with_grad_residual):
    x_dt, g_dt = dtypes
    s, g, w = _inputs(rows, n, x_dt, g_dt, rows * 23 + n, x_scale=2.0)
    gs = random_array(s.shape, g_dt, rng=np.random.default_rng(n)) if with_grad_residual \
        else None
    out = _outs(s.shape, g_dt, n)
    add_rms_norm_bwd(kaionb.asarray(g), None if gs is None else kaionb.asarray(gs),
                     kaionb.asarray(s), kaionb.asarray(w), 1e-6, out=out)
    ds, dw = add_rms_norm_bwd_ref(g, gs, s, w, 1e-6)
    scale = _dy_scale(g, s, w, 1e-6)
    if gs is not None:
        scale = np.abs(scale) + np.abs(np.asarray(gs, np.float64))
    assert_dx(out[0], ds, scale, g_dt)
    assert_dw(out[1], dw)


@gpu
@pytest.mark.parametrize("dtypes", GRAD_DTYPES, ids=_ids)
@pytest.mark.parametrize("n", [4096, 8192, 8200, 16384, 16392, 40000, 65536, 65544])
def test_bwd_paths_and_large_magnitudes(dtypes, n):
    # Both sides of every split: one CTA / a cluster of 8 (8192 and 16384 elements), the
    # cluster / streaming (65536), x of large magnitude (statistics in float32 must not
    # lose it), many rows per block or cluster.
    x_dt, g_dt = dtypes
    scale = 1e4 if x_dt == F32 else 1e2
    rows = min(300, 2_000_000 // n)
    x, g, w = _inputs(rows, n, x_dt, g_dt, n, x_scale=scale, x_offset=scale / 2)
    dx, dw = rms_norm_bwd(kaionb.asarray(g), kaionb.asarray(x), kaionb.asarray(w))
    rdx, rdw = rms_norm_bwd_ref(g, x, w)
    assert_dx(dx, rdx, _dy_scale(g, x, w, 1e-6), g_dt)
    assert_dw(dw, rdw)
    b = random_array((n,), x_dt, rng=np.random.default_rng(2))
    dx, dw, db = layer_norm_bwd(kaionb.asarray(g), kaionb.asarray(x), kaionb.asarray(w),
                                kaionb.asarray(b))
    rdx, rdw, rdb = layer_norm_bwd_ref(g, x, w, b)
    assert_dx(dx, rdx, _dy_scale(g, x, w, 1e-5, layer=True), g_dt)
    assert_dw(dw, rdw)
    assert_dw(db, rdb, "dbias")


@gpu
@pytest.mark.parametrize("dtypes", GRAD_DTYPES, ids=_ids)
@pytest.mark.parametrize("rows, n", [(40, 131072), (20, 262144), (3, 262152)])
def test_bwd_wide_rows_in_a_cluster_of_16(dtypes, rows, n, kernels_run):
    # Rows too wide for 8 CTAs' registers: x, g and the dw (db) accumulators in the shared
    # memory of 16 CTAs (sm_90; two stages at 131072, one at 262144; several rows per
    # cluster), streaming where they do not fit (float32 LayerNorm at 262144, 262152).
    # Against float64 with NaN-poisoned outputs; dw bit-identical on a repeat.
    x_dt, g_dt = dtypes
    x, g, w = _inputs(rows, n, x_dt, g_dt, n + rows, x_scale=3.0, x_offset=1.0)
    b = random_array((n,), x_dt, rng=np.random.default_rng(4))
    args = [kaionb.asarray(a) for a in (g, x, w, b)]
    sm90 = norms.compute_capability() >= (9, 0)
    for layer, ref in ((False, rms_norm_bwd_ref(g, x, w)),
                       (True, layer_norm_bwd_ref(g, x, w, b))):
        out = (kaionb.full((rows, n), np.nan, g_dt), kaionb.full((n,), np.nan, F32)) + (
            (kaionb.full((n,), np.nan, F32),) if layer else ())
        call = (lambda: layer_norm_bwd(*args, out=out)) if layer else (
            lambda: rms_norm_bwd(*args[:3], out=out))
        kernels_run.clear()
        got = call()
        fits = n <= 262144 and not (layer and x_dt == F32 and g_dt == F32 and n == 262144)
        want = "_cluster16_" if sm90 and fits else "_wide_"
        assert want in kernels_run[0], kernels_run
        assert_dx(got[0], ref[0], _dy_scale(g, x, w, 1e-5 if layer else 1e-6, layer), g_dt)
        for a, r, what in zip(got[1:], ref[1:], ("dweight", "dbias")):
            assert_dw(a, r, what)
        first = [a.get() for a in got[1:]]
        again = [a.get() for a in call()[1:]]
        assert all(np.array_equal(a.view(np.uint32), b_.view(np.uint32))
                   for a, b_ in zip(first, again))


@gpu
@pytest.mark.parametrize("n", [1024, 1000, 40000])
def test_bwd_row_slices_and_leading_dims(n):
    # Rows at a stride and off 16-byte alignment, each array its own misalignment (the
    # streaming kernel's gathers), and a 3-D batch.
    base_x = random_array((6, n + 1), np.float16, rng=np.random.default_rng(n))
    base_g = random_array((6, n + 3), np.float32, rng=np.random.default_rng(n + 1))
    base_e = random_array((6, n + 2), np.float32, rng=np.random.default_rng(n + 2))
    w = random_array((n,), np.float16, rng=np.random.default_rng(3), offset=1.0)
    x, g, e = base_x[::2, 1:], base_g[::2, 3:], base_e[::2, 2:]
    ds, dw = add_rms_norm_bwd(kaionb.asarray(base_g)[::2, 3:], kaionb.asarray(base_e)[::2, 2:],
                              kaionb.asarray(base_x)[::2, 1:], kaionb.asarray(w))
    rds, rdw = add_rms_norm_bwd_ref(g, e, x, w)
    assert_dx(ds, rds, np.abs(_dy_scale(g, x, w, 1e-6)) + np.abs(e), F32)
    assert_dw(dw, rdw)
    x3 = random_array((2, 3, n), bfloat16, rng=np.random.default_rng(7))
    g3 = random_array((2, 3, n), bfloat16, rng=np.random.default_rng(8))
    wb = w.astype(bfloat16)
    dx, dw = rms_norm_bwd(kaionb.asarray(g3), kaionb.asarray(x3), kaionb.asarray(wb))
    assert dx.shape == x3.shape and dx.dtype == bfloat16 and dw.shape == (n,)
    rdx, rdw = rms_norm_bwd_ref(g3, x3, wb)
    assert_dx(dx, rdx, _dy_scale(g3, x3, wb, 1e-6), bfloat16)
    assert_dw(dw, rdw)


@gpu
def test_bwd_empty():
    w = kaionb.asarray(np.ones(64, np.float32))
    e = kaionb.empty((0, 64), np.float32)
    dx, dw = rms_norm_bwd(e, e, w)
    assert dx.shape == (0, 64) and np.array_equal(dw.get(), np.zeros(64, np.float32))
    dx, dw, db = layer_norm_bwd(e, e, w, w)
    assert np.array_equal(db.get(), np.zeros(64, np.float32))


@gpu
@pytest.mark.parametrize("rows,n", [(16384, 4096), (4000, 1000), (64, 70000), (3, 40000),
                                    (600, 32768)])
def test_weight_gradients_deterministic(rows, n):
    # Staged (one CTA, a cluster) and streaming kernels, many rows per block: dw and db
    # bit-identical run to run (no float atomics; the partials are summed in a fixed order).
    x, g, w = _inputs(rows, n, bfloat16, F32, rows + n)
    b = random_array((n,), bfloat16, rng=np.random.default_rng(1))
    args = [kaionb.asarray(a) for a in (g, x, w, b)]
    first = [a.get() for a in layer_norm_bwd(*args)]
    for _ in range(3):
        again = [a.get() for a in layer_norm_bwd(*args)]
        for a, b_ in zip(first, again):
            assert np.array_equal(a.view(np.uint32), b_.view(np.uint32))
    first = [a.get() for a in rms_norm_bwd(*args[:3])]
    again = [a.get() for a in rms_norm_bwd(*args[:3])]
    assert all(np.array_equal(a.view(np.uint32), b_.view(np.uint32))
               for a, b_ in zip(first, again))


@gpu
@pytest.mark.parametrize("dtypes", GRAD_DTYPES, ids=_ids)
def test_bwd_against_torch_autograd(dtypes):
    torch = pytest.importorskip("torch")
    x_dt, g_dt = dtypes
    x, g, w = _inputs(37, 1000, x_dt, g_dt, 5)
    r = random_array(x.shape, x_dt, rng=np.random.default_rng(6))
    gs = random_array(x.shape, g_dt, rng=np.random.default_rng(7))
    b = random_array((1000,), x_dt, rng=np.random.default_rng(8))
    dev = [kaionb.asarray(a) for a in (g, x, w, b, r, gs)]
    got = rms_norm_bwd(*dev[:3])
    want = _torch_grads(torch, "rms_norm", g, x, w)
    assert_dx(got[0], want[0], _dy_scale(g, x, w, 1e-6), g_dt)
    assert_dw(got[1], want[1])
    got = layer_norm_bwd(*dev[:4])
    want = _torch_grads(torch, "layer_norm", g, x, w, b)
    assert_dx(got[0], want[0], _dy_scale(g, x, w, 1e-5, layer=True), g_dt)
    assert_dw(got[1], want[1])
    assert_dw(got[2], want[2], "dbias")
    s = (x.astype(np.float32) + r.astype(np.float32)).astype(x_dt)  # what the forward stores
    # torch differentiates x + r in float64: s rounded to x's dtype is the point it sees
    # when x, r are (s, 0).
    got = add_rms_norm_bwd(dev[0], dev[5], kaionb.asarray(s), dev[2])
    want = _torch_grads(torch, "add_rms_norm", g, s, w, np.zeros_like(r), gs)
    scale = np.abs(_dy_scale(g, s, w, 1e-6)) + np.abs(np.asarray(gs, np.float64))
    assert_dx(got[0], want[0], scale, g_dt)
    assert_dx(got[0], want[2], scale, g_dt, "dresidual")
    assert_dw(got[1], want[1])


# -- the tape ---------------------------------------------------------------------------------

def _leaf(a):
    d = kaionb.asarray(a)
    d.requires_grad = True
    return d


@gpu
def test_gradcheck_rms_norm_and_layer_norm():
    rng = np.random.default_rng(0)
    x = _leaf(random_array((5, 33), np.float32, rng=rng))
    w = _leaf(random_array((33,), np.float32, rng=rng, offset=1.0))
    b = _leaf(random_array((33,), np.float32, rng=rng))
    gradcheck(lambda a, c: rms_norm(a, c), (x, w), rng=rng, reference=rms_norm_ref)
    gradcheck(lambda a, c, d: layer_norm(a, c, d), (x, w, b), rng=rng,
              reference=layer_norm_ref)
    gradcheck(lambda a, c: layer_norm(a, c), (x, w), rng=rng, reference=layer_norm_ref)


@gpu
def test_gradcheck_add_rms_norm():
    # L = Σ (normed + s)·weights: both outputs carry a gradient (the tape's add records).
    rng = np.random.default_rng(1)
    x = _leaf(random_array((4, 40), np.float32, rng=rng))
    r = _leaf(random_array((4, 40), np.float32, rng=rng))
    w = _leaf(random_array((40,), np.float32, rng=rng, offset=1.0))

    def both(a, b_, c):
        return add(*add_rms_norm(a, b_, c))

    def reference(a, b_, c):
        normed, s = add_rms_norm_ref(a, b_, c)
        return normed + s

    gradcheck(both, (x, r, w), rng=rng, reference=reference)
    gradcheck(lambda a, b_, c: add_rms_norm(a, b_, c)[0], (x, r, w), rng=rng,
              reference=lambda a, b_, c: add_rms_norm_ref(a, b_, c)[0])


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_tape_gradients_match_references(dtype):
    # Half inputs: the tape's float32 gradient reaches the (half x, float32 g) kernels.
    rng = np.random.default_rng(2)
    xh = random_array((9, 4096), dtype, rng=rng)
    rh = random_array((9, 4096), dtype, rng=rng)
    wh = random_array((4096,), dtype, rng=rng, offset=1.0)
    gh = random_array((9, 4096), np.float32, rng=rng)
    x, r, w = _leaf(xh), _leaf(rh), _leaf(wh)
    with Tape() as tape:
        y = rms_norm(x, w)
    tape.backward(y, kaionb.asarray(gh))
    dx, dw = rms_norm_bwd_ref(gh, xh, wh)
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float32
    assert_dx(x.grad, dx, _dy_scale(gh, xh, wh, 1e-6), F32)
    assert_dw(w.grad, dw)

    x, r, w = _leaf(xh), _leaf(rh), _leaf(wh)
    with Tape() as tape:
        normed, s = add_rms_norm(x, r, w)
    tape.backward(normed, kaionb.asarray(gh))
    s_host = (xh.astype(np.float32) + rh.astype(np.float32)).astype(dtype)
    ds, dw = add_rms_norm_bwd_ref(gh, None, s_host, wh)
    for grad in (x.grad, r.grad):
        assert_dx(grad, ds, _dy_scale(gh, s_host, wh, 1e-6), F32)
    assert_dw(w.grad, dw)


@gpu
def test_tape_refuses_outputs_over_inputs():
    x = _leaf(random_array((4, 64), np.float32, rng=np.random.default_rng(3)))
    r = kaionb.asarray(random_array((4, 64), np.float32, rng=np.random.default_rng(4)))
    w = kaionb.asarray(np.ones(64, np.float32))
    before = x.get()
    with Tape():
        with pytest.raises(ValueError, match="rms_norm: argument 'out' expected memory apart "
                           "from 'x' while a tape records"):
            rms_norm(x, w, out=x)
        with pytest.raises(ValueError, match="add_rms_norm: argument 'residual_out' expected "
                           "memory apart from 'residual' while a tape records"):
            add_rms_norm(x, r, w, residual_out=r)
    assert np.array_equal(x.get(), before)  # refused before the forward ran
    # Without a tape, in place is fine.
    add_rms_norm(x, r, w, residual_out=r)


@gpu
def test_no_tape_no_record():
    x = _leaf(random_array((4, 64), np.float32, rng=np.random.default_rng(5)))
    w = kaionb.asarray(np.ones(64, np.float32))
    y = rms_norm(x, w)
    assert not y.requires_grad
    with Tape() as tape:
        y = rms_norm(kaionb.asarray(x.get()), w)  # no input needs a gradient
    assert not tape.entries and not y.requires_grad
