"""rms_norm / layer_norm / add_rms_norm: bad input refused before launch (CPU, fake device
arrays), and on a GPU every row width / row count / dtype against float64 NumPy with
poisoned outputs. The backward passes: tests/test_norms_bwd.py."""

import numpy as np
import pytest

import kaionb
from kaionb.array import bfloat16
from kaionb.kernels.helpers import rowwise
from kaionb.kernels.norms import (
    _CLUSTER_KERNELS,
    add_rms_norm,
    add_rms_norm_ref,
    layer_norm,
    layer_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from kaionb._device import compute_capability
from kaionb.testing import assert_close, poisoned, random_array
from kaionb.testing import metadata_array as fake
from row_cases import CASES, DTYPES, cluster_width

gpu = pytest.mark.gpu


# ----------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("fn", [rms_norm, layer_norm])
def test_wrong_weight_length(fn):
    with pytest.raises(ValueError, match=r"argument 'weight' expected shape \(8,\), got \(7,\)"):
        fn(fake((4, 8)), fake((7,)))


@pytest.mark.parametrize("fn", [rms_norm, layer_norm])
def test_mismatched_dtypes(fn):
    with pytest.raises(TypeError, match="argument 'weight' expected the dtype of 'x'"):
        fn(fake((4, 8), np.float16), fake((8,), np.float32))


@pytest.mark.parametrize("fn", [rms_norm, layer_norm])
def test_integer_input(fn):
    with pytest.raises(TypeError, match="argument 'x' expected dtype"):
        fn(fake((4, 8), np.int32), fake((8,), np.int32))


@pytest.mark.parametrize("fn", [rms_norm, layer_norm])
@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan")])
def test_eps_must_be_positive(fn, eps):
    with pytest.raises(ValueError, match="argument 'eps' expected a finite value > 0"):
        fn(fake((4, 8)), fake((8,)), eps=eps)


def test_layer_norm_bias_length():
    with pytest.raises(ValueError, match="argument 'bias' expected shape"):
        layer_norm(fake((4, 8)), fake((8,)), fake((9,)))


def test_out_dtype_checked():
    with pytest.raises(TypeError, match="argument 'out' expected dtype float32"):
        rms_norm(fake((4, 8)), fake((8,)), out=fake((4, 8), np.float16))


def test_strided_last_axis_refused():
    x = fake((8, 8))._view((8, 4), (32, 8))
    with pytest.raises(ValueError, match="contiguous last axis"):
        rms_norm(x, fake((4,)))


def test_add_rms_norm_residual_shape():
    with pytest.raises(ValueError, match=r"add_rms_norm: argument 'residual' expected shape "
                       r"\(4, 8\), got \(4, 7\)"):
        add_rms_norm(fake((4, 8)), fake((4, 7)), fake((8,)))


def test_add_rms_norm_weight_length():
    with pytest.raises(ValueError, match=r"add_rms_norm: argument 'weight' expected shape "
                       r"\(8,\), got \(9,\)"):
        add_rms_norm(fake((4, 8)), fake((4, 8)), fake((9,)))


def test_add_rms_norm_dtypes():
    with pytest.raises(TypeError, match="add_rms_norm: argument 'residual' expected the dtype "
                       "of 'x' \\(float16\\), got float32"):
        add_rms_norm(fake((4, 8), np.float16), fake((4, 8)), fake((8,), np.float16))
    with pytest.raises(TypeError, match="add_rms_norm: argument 'x' expected dtype"):
        add_rms_norm(fake((4, 8), np.int32), fake((4, 8), np.int32), fake((8,), np.int32))


def test_add_rms_norm_strided_last_axis():
    r = fake((8, 8))._view((8, 4), (32, 8))
    with pytest.raises(ValueError, match="add_rms_norm: argument 'residual' expected a "
                       "contiguous last axis"):
        add_rms_norm(fake((8, 4)), r, fake((4,)))


def test_add_rms_norm_eps_and_out_dtype():
    with pytest.raises(ValueError, match="add_rms_norm: argument 'eps' expected a finite"):
        add_rms_norm(fake((4, 8)), fake((4, 8)), fake((8,)), eps=0.0)
    with pytest.raises(TypeError, match="add_rms_norm: argument 'residual_out' expected dtype "
                       "float32, got float16"):
        add_rms_norm(fake((4, 8)), fake((4, 8)), fake((8,)), out=fake((4, 8)),
                     residual_out=fake((4, 8), np.float16))


def test_add_rms_norm_overlapping_outputs_refused():
    x, r, w = fake((4, 8)), fake((4, 8)), fake((8,))
    o = fake((4, 8))
    with pytest.raises(ValueError, match="argument 'residual_out' expected memory apart "
                       "from 'out'"):
        add_rms_norm(x, r, w, out=o, residual_out=o)
    # One row along: a partial overlap with residual would read elements already written.
    shifted = r._view((3, 8), r.strides, 32)
    with pytest.raises(ValueError, match="argument 'residual_out' expected 'residual' itself"):
        add_rms_norm(x[:3], r[:3], w, out=fake((3, 8)), residual_out=shifted)
    with pytest.raises(ValueError, match="argument 'out' expected memory apart from "
                       "'weight', got a partial overlap"):
        add_rms_norm(fake((1, 8)), fake((1, 8)), w, out=w._view((1, 8), (32, 4)),
                     residual_out=fake((1, 8)))


class _Launches(list):
    """The launches fixture's list, with the cluster dimensions of each launch beside it
    (``clusters``)."""


@pytest.fixture
def launches(monkeypatch):
    """Launches recorded instead of run; the fast path's replays of these calls (which
    launched nothing) are dropped after."""
    from kaionb._device import STATE
    from kaionb.kernels import launch

    calls = _Launches()
    calls.clusters = []

    def compiled(kdef, signature):
        def launch_it(grid, block, args, shared_mem=0, cluster=None):
            calls.append((kdef.name, grid, block, shared_mem, args))
            calls.clusters.append(cluster)
        return launch_it

    monkeypatch.setattr(launch.KernelDef, "__getitem__", compiled)
    monkeypatch.setattr(rowwise, "compute_capability", lambda: (8, 9))  # no clusters
    saved, STATE.calls = STATE.calls, None
    yield calls
    STATE.calls = saved


@pytest.mark.parametrize("dtype,n,threads,cache,cluster", [
    (np.float16, 4096, 256, -1, 1),
    (np.float16, 16384, 1024, -1, 1),  # registers: 16 elements of x and of residual a thread
    (np.float16, 16392, 512, 2050, 1),  # streaming, 2050 words4 parked in shared memory
    (np.float32, 16384, 1024, -1, 1),
    (np.float32, 16388, 256, -1, 8),  # sm_90: registers over a cluster of 8 CTAs a row
])
@pytest.mark.parametrize("sm90", [False, True])
def test_add_rms_norm_plan(launches, monkeypatch, dtype, n, threads, cache, cluster, sm90):
    if sm90:  # clusters for float32 rows that one CTA cannot hold
        monkeypatch.setattr(rowwise, "compute_capability", lambda: (9, 0))
    elif cluster > 1:
        threads, cache, cluster = 512, 4098, 1  # the streaming path, 4098 words4 cached
    x, r, w, o, s = (fake((6, n), dtype), fake((6, n), dtype), fake((n,), dtype),
                     fake((6, n), dtype), fake((6, n), dtype))
    normed, s_out = add_rms_norm(x, r, w, out=o, residual_out=s)
    assert normed is o and s_out is s
    (name, grid, block, shared, args), = launches
    variant = f"c{cluster}_" if cluster > 1 else ""
    assert (name, grid, block, shared) == (
        f"_add_rms_norm_fwd_kernel_{variant}{np.dtype(dtype).name}", (6 * cluster,),
        (threads,), max(cache, 0) * 16)
    assert launches.clusters == [(cluster, 1, 1) if cluster > 1 else None]
    assert [a.ptr for a in args[:5]] == [x.ptr, r.ptr, w.ptr, s.ptr, o.ptr]
    assert args[5:] == (n, 1e-6, cache)
    # In place (vLLM): residual_out is residual, out is x.
    launches.clear()
    normed, s_out = add_rms_norm(x, r, w, out=x, residual_out=r)
    assert normed is x and s_out is r
    assert [a.ptr for a in launches[0][4][:5]] == [x.ptr, r.ptr, w.ptr, r.ptr, x.ptr]


# ----------------------------------------------------------------------------- GPU

def check(fn, ref, x_host, *params, dtype, **kw):
    out = poisoned(x_host.shape, dtype)
    got = fn(kaionb.asarray(x_host), *[kaionb.asarray(p) for p in params], out=out, **kw)
    assert got is out
    assert_close(out, ref(x_host, *params, **kw), dtype=dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_rms_norm(dtype, rows, n):
    rng = np.random.default_rng(rows * 7 + n)
    x = random_array((rows, n), dtype, rng=rng)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    check(rms_norm, rms_norm_ref, x, w, dtype=dtype, eps=1e-6)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_layer_norm(dtype, rows, n):
    rng = np.random.default_rng(rows * 11 + n)
    # An offset mean checks the variance is taken around the mean.
    x = random_array((rows, n), dtype, rng=rng, scale=2.0, offset=3.0)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    b = random_array((n,), dtype, rng=rng)
    check(layer_norm, layer_norm_ref, x, w, b, dtype=dtype, eps=1e-5)


def _needs_clusters():
    if compute_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")


def _cluster_cases(op):
    return [(dt, size) for (kernel_op, dt), sizes in _CLUSTER_KERNELS.items()
            if kernel_op == op for size in sizes]


@gpu
@pytest.mark.parametrize("dtype,size", _cluster_cases("rms_norm"), ids=str)
def test_norms_over_a_cluster(kernels_run, dtype, size):
    # Aligned rows too wide for one CTA's registers: one cluster of CTAs per row, the last
    # CTA's run shorter than the others'.
    _needs_clusters()
    n = cluster_width(dtype, size)
    assert cluster_width(dtype, size, "layer_norm") == n
    rng = np.random.default_rng(n)
    x = random_array((3, n), dtype, rng=rng, scale=2.0, offset=3.0)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    b = random_array((n,), dtype, rng=rng)
    check(rms_norm, rms_norm_ref, x, w, dtype=dtype, eps=1e-6)
    check(layer_norm, layer_norm_ref, x, w, b, dtype=dtype, eps=1e-5)
    name = np.dtype(dtype).name
    assert [k for k in kernels_run if "norm" in k] == [
        f"_rms_norm_fwd_kernel_c{size}_{name}",
        f"_layer_norm_fwd_kernel_c{size}_{name}"]


@gpu
@pytest.mark.parametrize("dtype,size", _cluster_cases("add_rms_norm"), ids=str)
def test_add_rms_norm_over_a_cluster(kernels_run, dtype, size):
    _needs_clusters()
    n = cluster_width(dtype, size, "add_rms_norm")
    rng = np.random.default_rng(n)
    x = random_array((3, n), dtype, rng=rng)
    r = random_array((3, n), dtype, rng=rng, scale=3.0)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    check_add(x, r, w)
    # In place, as vLLM calls it (out is x, residual_out is residual): s is stored after
    # the cluster barrier, once every CTA has read its run of x and residual.
    dx, dr, dw = kaionb.asarray(x), kaionb.asarray(r), kaionb.asarray(w)
    add_rms_norm(dx, dr, dw, out=dx, residual_out=dr)
    s = _sum_rounded(x, r)
    assert np.array_equal(dr.get().view(np.uint8), s.view(np.uint8))
    assert_close(dx, rms_norm_ref(s, w, 1e-6), dtype=dtype, what="normed in place")
    assert [k for k in kernels_run if "norm" in k] == [
        f"_add_rms_norm_fwd_kernel_c{size}_{np.dtype(dtype).name}"] * 2


@gpu
def test_layer_norm_without_bias_and_leading_dims():
    x = random_array((2, 5, 768), np.float16, rng=np.random.default_rng(1))
    w = random_array((768,), np.float16, rng=np.random.default_rng(2))
    out = layer_norm(kaionb.asarray(x), kaionb.asarray(w))
    assert out.shape == x.shape
    assert_close(out, layer_norm_ref(x, w), dtype=np.float16)


@gpu
@pytest.mark.parametrize("n", [1024, 1000, 40000])
def test_rms_norm_row_slice(n):
    # Every other row, starting one element in: rows at a stride and off 16-byte alignment.
    base = random_array((6, n + 1), np.float16, rng=np.random.default_rng(n))
    w = random_array((n,), np.float16, rng=np.random.default_rng(3))
    view = kaionb.asarray(base)[::2, 1:]
    out = rms_norm(view, kaionb.asarray(w))
    assert_close(out, rms_norm_ref(base[::2, 1:], w), dtype=np.float16)


@gpu
def test_rms_norm_empty_and_deterministic():
    assert rms_norm(kaionb.empty((0, 64), np.float32), kaionb.asarray(np.ones(64, np.float32))).shape == (0, 64)
    x = kaionb.asarray(random_array((64, 70000), np.float32, rng=np.random.default_rng(5)))
    w = kaionb.asarray(np.ones(70000, np.float32))
    assert np.array_equal(rms_norm(x, w).get(), rms_norm(x, w).get())


# -- add_rms_norm ---------------------------------------------------------------------------

def _sum_rounded(x, r):
    """s as the kernel stores it: the float32 sum rounded once to the storage dtype."""
    return (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)


def check_add(x, r, w, eps=1e-6):
    dtype = x.dtype
    out, res_out = poisoned(x.shape, dtype), poisoned(x.shape, dtype)
    got = add_rms_norm(kaionb.asarray(x), kaionb.asarray(r), kaionb.asarray(w), eps,
                       out=out, residual_out=res_out)
    assert got[0] is out and got[1] is res_out
    s = _sum_rounded(x, r)
    # s bit for bit (one float32 add, one rounding); normed from the rounded s.
    assert np.array_equal(res_out.get().view(np.uint8), s.view(np.uint8))
    assert_close(out, rms_norm_ref(s, w, eps), dtype=dtype, what="normed")
    ref_normed, ref_s = add_rms_norm_ref(x, r, w, eps)
    assert_close(out, ref_normed, dtype=dtype, what="normed vs add_rms_norm_ref")
    assert_close(res_out, ref_s, dtype=dtype, what="s vs add_rms_norm_ref")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rows,n", CASES)
def test_add_rms_norm(dtype, rows, n):
    rng = np.random.default_rng(rows * 13 + n)
    x = random_array((rows, n), dtype, rng=rng)
    r = random_array((rows, n), dtype, rng=rng, scale=3.0)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    check_add(x, r, w)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [4096, 16384, 16392, 40000])
def test_add_rms_norm_large_magnitudes(dtype, n):
    # Residual streams grow: values of 1e2 (halves) and 1e4 (float32); both sides of the
    # register/streaming split (16384 elements).
    scale = 1e4 if dtype == np.float32 else 1e2
    rng = np.random.default_rng(n)
    x = random_array((5, n), dtype, rng=rng, scale=scale)
    r = random_array((5, n), dtype, rng=rng, scale=scale, offset=scale / 3)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    check_add(x, r, w, eps=1e-5)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [4096, 1000, 40000])
def test_add_rms_norm_in_place(dtype, n):
    # vLLM's convention: the residual stream updated in place, normed written over x.
    rng = np.random.default_rng(n + 1)
    x = random_array((7, n), dtype, rng=rng)
    r = random_array((7, n), dtype, rng=rng)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    dx, dr = kaionb.asarray(x), kaionb.asarray(r)
    normed, s = add_rms_norm(dx, dr, kaionb.asarray(w), out=dx, residual_out=dr)
    assert normed is dx and s is dr
    ref_s = _sum_rounded(x, r)
    assert np.array_equal(dr.get().view(np.uint8), ref_s.view(np.uint8))
    assert_close(dx, rms_norm_ref(ref_s, w), dtype=dtype)
    # Swapped: s over x, normed over the residual.
    dx, dr = kaionb.asarray(x), kaionb.asarray(r)
    add_rms_norm(dx, dr, kaionb.asarray(w), out=dr, residual_out=dx)
    assert np.array_equal(dx.get().view(np.uint8), ref_s.view(np.uint8))
    assert_close(dr, rms_norm_ref(ref_s, w), dtype=dtype)


@gpu
@pytest.mark.parametrize("n", [1024, 1000, 40000])
def test_add_rms_norm_row_slices_and_leading_dims(n):
    # Rows at a stride and off 16-byte alignment (the streaming path), and a 3-D batch.
    base_x = random_array((6, n + 1), bfloat16, rng=np.random.default_rng(n))
    base_r = random_array((6, n + 3), bfloat16, rng=np.random.default_rng(n + 1))
    w = random_array((n,), bfloat16, rng=np.random.default_rng(3), offset=1.0)
    normed, s = add_rms_norm(kaionb.asarray(base_x)[::2, 1:], kaionb.asarray(base_r)[::2, 3:],
                             kaionb.asarray(w))
    x, r = base_x[::2, 1:], base_r[::2, 3:]
    assert np.array_equal(s.get().view(np.uint8), _sum_rounded(x, r).view(np.uint8))
    assert_close(normed, rms_norm_ref(_sum_rounded(x, r), w), dtype=bfloat16)
    x3 = random_array((2, 3, n), np.float16, rng=np.random.default_rng(7))
    r3 = random_array((2, 3, n), np.float16, rng=np.random.default_rng(8))
    w16 = w.astype(np.float16)
    normed, s = add_rms_norm(kaionb.asarray(x3), kaionb.asarray(r3), kaionb.asarray(w16))
    assert normed.shape == s.shape == x3.shape
    assert_close(normed, rms_norm_ref(_sum_rounded(x3, r3), w16), dtype=np.float16)


@gpu
def test_add_rms_norm_empty_and_deterministic():
    w = kaionb.asarray(np.ones(64, np.float32))
    e = kaionb.empty((0, 64), np.float32)
    normed, s = add_rms_norm(e, e, w)
    assert normed.shape == s.shape == (0, 64)
    rng = np.random.default_rng(5)
    x = kaionb.asarray(random_array((64, 70000), np.float32, rng=rng))
    r = kaionb.asarray(random_array((64, 70000), np.float32, rng=rng))
    w = kaionb.asarray(np.ones(70000, np.float32))
    a, b = add_rms_norm(x, r, w), add_rms_norm(x, r, w)
    assert np.array_equal(a[0].get(), b[0].get()) and np.array_equal(a[1].get(), b[1].get())


@gpu
def test_add_rms_norm_matches_unfused():
    # The fused op is rms_norm(x + residual) computed in the storage dtype, bit for bit
    # up to the statistics' summation order (same kernels, same rounding of s).
    rng = np.random.default_rng(11)
    x = random_array((33, 4096), bfloat16, rng=rng)
    r = random_array((33, 4096), bfloat16, rng=rng)
    w = kaionb.asarray(random_array((4096,), bfloat16, rng=rng, offset=1.0))
    normed, s = add_rms_norm(kaionb.asarray(x), kaionb.asarray(r), w)
    unfused = rms_norm(kaionb.asarray(_sum_rounded(x, r)), w)
    assert_close(normed, unfused.get().astype(np.float64), dtype=bfloat16)
