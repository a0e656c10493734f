"""softmax and softmax_bwd: bad input refused before launch and the layout planner (CPU);
on a GPU every row width / row count / dtype, every axis of 2-D/3-D/4-D inputs and their
transposed, sliced and negative-stride views, against float64 NumPy with poisoned
outputs; −inf handling; the backward against float64 NumPy, finite differences
(kaionb.grad.gradcheck) and torch autograd in float64 where torch is importable."""

import numpy as np
import pytest

import kaionb
from kaionb import grad
from kaionb._device import compute_capability
from kaionb.kernels.helpers.rowwise import CODECS
from kaionb.kernels.softmax import (
    _ROW_CLUSTER_KERNELS,
    COL_THREADS,
    _axis_order,
    _column_block,
    _column_regs,
    _plan,
    softmax,
    softmax_bwd,
    softmax_bwd_ref,
    softmax_ref,
)
from kaionb.testing import assert_close, poisoned, random_array, tolerance
from kaionb.testing import metadata_array as fake
from row_cases import CASES, DTYPES, cluster_width

gpu = pytest.mark.gpu
DTYPE_IDS = {"ids": lambda d: np.dtype(d).name}


# -- CPU: validation -------------------------------------------------------------------------

def test_integer_input_refused():
    with pytest.raises(TypeError, match="softmax: argument 'x' expected dtype"):
        softmax(fake((4, 8), np.int8))


@pytest.mark.parametrize("axis", [2, -3, 5])
def test_axis_out_of_range(axis):
    with pytest.raises(ValueError, match=r"softmax: argument 'axis' expected an axis in "
                                         rf"\[-2, 2\), got {axis}"):
        softmax(fake((4, 8)), axis=axis)


@pytest.mark.parametrize("axis", [1.0, True, None, (0,)])
def test_axis_not_an_int(axis):
    with pytest.raises(TypeError, match="softmax: argument 'axis' expected an int"):
        softmax(fake((4, 8)), axis=axis)


def test_out_shape_and_dtype_checked():
    with pytest.raises(ValueError, match="softmax: argument 'out' expected shape"):
        softmax(fake((4, 8)), out=fake((4, 9)))
    with pytest.raises(TypeError, match="softmax: argument 'out' expected dtype float32"):
        softmax(fake((4, 8)), out=fake((4, 8), np.float16))


def test_scalar_refused():
    with pytest.raises(ValueError, match="softmax: argument 'x' expected 1 or more dimensions"):
        softmax(fake(()))


def test_backward_bad_input():
    y = fake((4, 8), np.float16)
    with pytest.raises(ValueError, match=r"softmax_bwd: argument 'grad' expected shape "
                                         r"\(4, 8\), got \(8, 4\)"):
        softmax_bwd(fake((8, 4)), y)
    with pytest.raises(TypeError, match="softmax_bwd: argument 'grad' expected dtype "
                                        "float32 or float16, got bfloat16"):
        softmax_bwd(fake((4, 8), kaionb.bfloat16), y)
    with pytest.raises(TypeError, match="softmax_bwd: argument 'y' expected dtype"):
        softmax_bwd(fake((4, 8)), fake((4, 8), np.int32))
    with pytest.raises(ValueError, match=r"softmax_bwd: argument 'axis' expected an axis in "
                                         r"\[-2, 2\), got -3"):
        softmax_bwd(fake((4, 8)), y, axis=-3)
    with pytest.raises(TypeError, match="softmax_bwd: argument 'out' expected dtype float32"):
        softmax_bwd(fake((4, 8)), y, out=fake((4, 8), np.float16))


# -- CPU: the layout planner -----------------------------------------------------------------
#
# Memory is modelled by element ids (byte offset / itemsize from the lowest address an
# array touches): a plan is right when every line of x along the axis is one row (row
# kind) or one [o, :, i] column (column kind) of its view, in order, and the output's
# view puts the same line at the same (o, i).

def _lowest(a):
    return a.ptr + sum((d - 1) * s for d, s in zip(a.shape, a.strides) if s < 0 and d > 1)


def _ids(a, lo):
    """Element ids of every element of the header ``a``, counted from address ``lo``."""
    idx = np.zeros(a.shape, np.int64)
    for pos in np.ndindex(*a.shape):
        idx[pos] = (a.ptr - lo + sum(p * s for p, s in zip(pos, a.strides))) // a.itemsize
    return idx


def _like(x):
    """A header laid out as softmax allocates its output for x."""
    order = _axis_order(x)
    if order is None:
        return fake(x.shape, x.dtype)
    return fake(tuple(x.shape[a] for a in order), x.dtype).transpose(
        tuple(int(k) for k in np.argsort(order)))


def _check_plan(x, out, axis):
    """The plan's kind after checking its views line by line; None: no plan (copy)."""
    layout = _plan(axis, (x, x, out))
    if layout is None:
        return None
    n = x.shape[axis]
    x_lo, o_lo = _lowest(x), _lowest(out)
    x_lines = np.moveaxis(_ids(x, x_lo), axis, -1).reshape(-1, n)
    o_lines = np.moveaxis(_ids(out, o_lo), axis, -1).reshape(-1, n)
    line_of = {tuple(r): k for k, r in enumerate(x_lines)}
    xv, gv, ov = layout.views
    assert gv.shape == xv.shape == ov.shape
    vx, vo = _ids(xv, x_lo), _ids(ov, o_lo)
    if layout.kind == "col":  # lines are [o, :, i]
        vx, vo = (v.transpose(0, 2, 1).reshape(-1, n) for v in (vx, vo))
    assert len(vx) == len(x_lines)
    seen = set()
    for rx, ro in zip(vx, vo):
        k = line_of[tuple(rx)]  # a KeyError: a view line that is no line of x
        np.testing.assert_array_equal(ro, o_lines[k])
        seen.add(k)
    assert len(seen) == len(x_lines)
    return layout.kind


def _views(shape, dtype):
    base = fake(shape, dtype)
    nd = len(shape)
    views = {"C": base, "T": base.T, "flip0": base[::-1],
             "flip_all": base[(slice(None, None, -1),) * nd], "slice_last": base[..., 1:],
             "flip_last": base[..., ::-1]}
    if nd >= 2:
        views["step0"] = base[::2]
    if nd >= 3:
        views["perm"] = base.transpose(1, 0, *range(2, nd))
        views["mid_step"] = base[:, ::2]
    return views


PLAN_SHAPES = [((5,), np.float32), ((3, 7), np.float16), ((3, 70), np.float16),
               ((2, 3, 64), np.float32), ((2, 70, 3), np.float32), ((2, 3, 4, 5), np.float16),
               ((1, 4, 1, 80), kaionb.bfloat16), ((3, 64, 5), np.float16)]


@pytest.mark.parametrize("shape, dtype", PLAN_SHAPES, ids=lambda v: str(v))
def test_plan_maps_every_line(shape, dtype):
    kinds = set()
    for x in _views(shape, dtype).values():
        for axis in range(len(shape)):
            # None where x's other axes need three stride groups (copied to C order).
            kinds.add(_check_plan(x, _like(x), axis))
            _check_plan(x, fake(x.shape, x.dtype), axis)  # a C-order out=
            c = fake(x.shape, x.dtype)  # what the copy makes: always planned
            assert _check_plan(c, fake(x.shape, x.dtype), axis) is not None
    assert "col" in kinds


def test_plan_row_kind_for_unit_stride_lines():
    x = fake((6, 300), np.float16)
    assert _check_plan(x, _like(x), 1) == "row"
    assert _check_plan(x.T, _like(x.T), 0) == "row"  # the unit-stride axis of a transpose
    assert _check_plan(x[::-1], _like(x[::-1]), 1) == "row"  # negative row stride
    assert _check_plan(x, _like(x), 0) == "col"
    assert _check_plan(x[:, ::2], _like(x[:, ::2]), 1) == "col"  # strided lines
    assert _plan(0, (fake((9,)),) * 3).kind == "row"
    y = fake((4, 5, 6))  # x and out disagree on the unit stride: columns
    assert _check_plan(y, fake((6, 5, 4)).T, 2) == "col"


def test_new_output_follows_x_axis_order():
    x = fake((2, 3, 4))
    assert _axis_order(x) is None
    assert _axis_order(x.transpose(2, 0, 1)) == [1, 2, 0]
    assert _axis_order(x[::-1]) is None  # C order, a flipped axis
    out = _like(x.transpose(2, 0, 1))
    assert out.shape == (4, 2, 3) and sorted(out.strides, reverse=True) == [48, 16, 4]


@pytest.mark.parametrize("shape", [(1, 16384, 8192), (32, 1024, 4096), (64, 64, 4096),
                                   (1, 2, 10**6), (1, 10**5, 3), (1, 7, 16384),
                                   (8, 512, 1024), (5000, 3, 7), (1, 1, 1)])
@pytest.mark.parametrize("dtype", DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("backward", [False, True])
def test_column_block(shape, dtype, vector, backward):
    o, n, i = shape
    codec = CODECS[np.dtype(dtype)]
    cols = codec.vec if vector else 1
    c = max(1, i // cols)
    regs = _column_regs(codec, vector, backward)
    tx, ty = _column_block(o, n, c, regs, cols, np.dtype(dtype).itemsize, 132)
    threads = tx * ty
    assert threads & (threads - 1) == 0 and 32 <= threads <= COL_THREADS
    assert tx <= max(1, 1 << (c - 1).bit_length())
    if n > 1 and ty > 1:
        assert ty <= 2 * n or threads == 32  # no more y threads than lines need
    # The reducer's shared partials (a row per warp, or per y thread when TX >= 32) fit
    # the kernel's COL_THREADS × cols floats.
    assert threads // max(32, tx) * tx * cols <= COL_THREADS * cols


# -- CPU: the launches the host path makes ---------------------------------------------------

@pytest.fixture
def launches(monkeypatch):
    """Launches recorded instead of run: (kernel name, grid, block, shared, args). The
    fast path's replays of these calls (which launched nothing) are dropped after."""
    from kaionb._device import STATE
    from kaionb.kernels import launch
    from kaionb.kernels import softmax as module

    calls = []

    def compiled(kdef, signature):
        def launch_it(grid, block, args, shared_mem=0):
            calls.append((kdef.name, grid, block, shared_mem, args))
        return launch_it

    monkeypatch.setattr(launch.KernelDef, "__getitem__", compiled)
    monkeypatch.setattr(module, "multiprocessor_count", lambda device=0: 132)
    saved, STATE.calls = STATE.calls, None
    yield calls
    STATE.calls = saved


def test_launch_column_kernel(launches):
    x = fake((64, 4096), np.float16)
    out = fake((64, 4096), np.float16)
    assert softmax(x, axis=0, out=out) is out
    (name, grid, block, shared, args), = launches
    assert name == "_softmax_col_fwd_kernel_vec_float16"
    xv, gv, ov, cblocks, in_registers = args
    assert xv.shape == ov.shape == (1, 64, 4096) and xv.strides == (0, 8192, 2)
    tx, ty = block
    assert grid == (512 // tx,) and cblocks == 512 // tx and in_registers == 1
    assert 64 <= ty * 4  # the 64-element column fits the y threads' registers


def test_launch_element_columns_and_rows(launches):
    softmax(fake((300, 257)), axis=0, out=fake((300, 257)))  # 257 columns: element-wise
    softmax(fake((300, 257)), axis=1, out=fake((300, 257)))  # rows (misaligned: stream)
    softmax(fake((6, 4096), np.float16), out=fake((6, 4096), np.float16))  # rows, registers
    names = [c[0] for c in launches]
    assert names == ["_softmax_col_fwd_kernel_elem_float32", "_softmax_fwd_kernel_float32",
                     "_softmax_fwd_kernel_float16"]
    (_, grid_c, block_c, _, col), (_, grid_r, _, smem, row), (_, grid_h, block_h, _, reg) = (
        launches)
    # 32 y threads × 16 elements hold the 300-long columns: 8 columns per block.
    assert col[0].shape == (1, 300, 257) and block_c == (8, 32) and col[4] == 1
    assert grid_c == (33,) and col[3] == 33
    assert grid_r == (300,) and row[3] == 257 and row[4] > 0 and smem == row[4] * 16
    assert grid_h == (6,) and block_h == (256,) and reg[4] == -1


def test_launch_backward(launches):
    y = fake((8, 4096), np.float16)
    softmax_bwd(fake((8, 4096)), y, out=fake((8, 4096)))
    softmax_bwd(fake((8, 4096), np.float16), y, out=fake((8, 4096), np.float16))
    softmax_bwd(fake((8, 4096)), y, axis=0, out=fake((8, 4096)))
    names = [c[0] for c in launches]
    assert names == ["_softmax_bwd_kernel_float16_grad_float32",
                     "_softmax_bwd_kernel_float16_grad_float16",
                     "_softmax_col_bwd_kernel_vec_float16_grad_float32"]
    row = launches[0]
    # 4096 halves: 512 words4, two per thread on the backward's register path.
    assert row[1] == (8,) and row[2] == (256,) and row[3] == 0 and row[4][4] == -1
    col = launches[2][4]
    assert col[0].dtype == np.float16 and col[1].dtype == col[2].dtype == np.float32


# -- GPU: forward ----------------------------------------------------------------------------

def _check_softmax(x_host, view, axis, dtype, out=None):
    """softmax of the device view ``view`` (of x_host's copy) against float64 NumPy on
    the same view of the host array; ``out``: None or a poisoned array to write."""
    x_dev = view(kaionb.asarray(x_host))
    got = softmax(x_dev, axis=axis, out=out)
    if out is not None:
        assert got is out
    ref = softmax_ref(view(x_host), axis=axis)
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    assert_close(got, ref, dtype=dtype, what=f"softmax axis {axis}")
    return got.get().astype(np.float64)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("rows,n", CASES)
def test_softmax(dtype, rows, n):
    x = random_array((rows, n), dtype, rng=np.random.default_rng(rows * 13 + n), scale=3.0)
    out = poisoned(x.shape, dtype)
    assert softmax(kaionb.asarray(x), out=out) is out
    ref = softmax_ref(x)
    assert_close(out, ref, dtype=dtype)
    if dtype == np.float32:
        np.testing.assert_allclose(out.get().astype(np.float64).sum(-1), 1.0, rtol=1e-5)


VIEWS = {
    "C": lambda a: a,
    "T": lambda a: a.T,
    "flip0": lambda a: a[::-1],
    "flip_all": lambda a: a[(slice(None, None, -1),) * a.ndim],
    "slice": lambda a: a[..., 1:],
    "step0": lambda a: a[::2],
}
AXIS_SHAPES = [(3, 8191), (8191, 3), (37, 1000), (33, 5, 130), (5, 130, 33), (3, 4, 5, 67),
               (2, 2048, 16), (4, 3, 40, 24)]


@gpu
@pytest.mark.parametrize("dtype", DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("shape", AXIS_SHAPES, ids=str)
@pytest.mark.parametrize("view", list(VIEWS), ids=str)
def test_softmax_every_axis(dtype, shape, view):
    """Every axis of 2-D/3-D/4-D inputs and of their views: row and column kernels, both
    column modes (16-byte and element-wise), register and streaming paths (lines of
    8191 and 2048 stream in the column kernel)."""
    rng = np.random.default_rng(sum(shape) + len(view))
    x = random_array(shape, dtype, rng=rng, scale=3.0)
    fn = VIEWS[view]
    for axis in range(-len(shape), len(shape)):
        got = _check_softmax(x, fn, axis, dtype)
        if dtype == np.float32:
            np.testing.assert_allclose(got.sum(axis=axis), 1.0, rtol=1e-5)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_out_any_layout(dtype, axis):
    """out= of another layout than x (transposed, a strided slice of a larger buffer):
    planned together, or computed C-contiguous and copied in; every element written."""
    rng = np.random.default_rng(axis)
    x = random_array((6, 50, 24), dtype, rng=rng)
    out_t = poisoned((24, 50, 6), dtype).T
    _check_softmax(x, VIEWS["C"], axis, dtype, out=out_t)
    big = poisoned((6, 50, 48), dtype)
    out_s = big[:, :, ::2]
    _check_softmax(x, VIEWS["C"], axis, dtype, out=out_s)
    assert np.isnan(big.get()[:, :, 1::2].astype(np.float32)).all()  # untouched
    # A view whose other axes need three stride groups for axes 0 and 1: copied first.
    y = random_array((4, 6, 8, 10), dtype, rng=rng)
    _check_softmax(y, lambda a: a[:, ::2, :, 1:], axis, dtype,
                   out=poisoned((4, 3, 8, 9), dtype))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, **DTYPE_IDS)
def test_softmax_in_place(dtype):
    x = random_array((40, 300), dtype, rng=np.random.default_rng(1))
    for axis in (0, 1):
        d = kaionb.asarray(x)
        assert softmax(d, axis=axis, out=d) is d
        assert_close(d, softmax_ref(x, axis=axis), dtype=dtype)


@gpu
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("n", [1000, 8192, 100000])  # register and streaming paths
def test_softmax_minus_inf(axis, n):
    x = random_array((4, n), np.float32, rng=np.random.default_rng(n))
    x[0, :] = -np.inf                # all −inf: NaN line, as torch.softmax
    x[1, ::3] = -np.inf              # some −inf: those are exactly 0
    x[2, :] = 0.0
    x[2, 5] = 1e4                    # one dominant value: one-hot
    if axis == 0:                    # the same lines as columns
        x = np.ascontiguousarray(x.T)
    got = softmax(kaionb.asarray(x), axis=axis).get()
    lines = got if axis == 1 else got.T
    assert np.isnan(lines[0]).all()
    assert (lines[1, ::3] == 0).all()
    np.testing.assert_allclose(lines[1].sum(), 1.0, rtol=1e-5)
    assert lines[2, 5] == 1.0 and np.count_nonzero(lines[2]) == 1
    keep = [1, 2, 3]
    ref = softmax_ref(x, axis=axis)
    assert_close(lines[keep], (ref if axis == 1 else ref.T)[keep], dtype=np.float32)


@gpu
@pytest.mark.parametrize("dtype,size", [(dt, size) for dt, sizes in _ROW_CLUSTER_KERNELS.items()
                                        for size in sizes], ids=str)
def test_softmax_over_a_cluster(kernels_run, dtype, size):
    # Aligned rows too wide for one CTA's registers: one cluster of CTAs per row.
    if compute_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    n = cluster_width(dtype, size, "softmax")
    x = random_array((4, n), dtype, rng=np.random.default_rng(n), scale=3.0)
    x[1, : n // 2] = -np.inf  # the first CTAs of the cluster hold only −inf
    x[2, :] = 0.0
    x[2, n - 3] = 1e4 if dtype == np.float32 else 1e3  # in the last CTA: one-hot
    out = poisoned(x.shape, dtype)
    assert softmax(kaionb.asarray(x), out=out) is out
    got = out.get().astype(np.float64)
    assert (got[1, : n // 2] == 0).all()
    assert got[2, n - 3] == 1.0 and np.count_nonzero(got[2]) == 1
    assert_close(got[[0, 1, 3]], softmax_ref(x, axis=-1)[[0, 1, 3]], dtype=dtype)
    x[0, :] = -np.inf  # all −inf: NaN, as torch.softmax
    assert np.isnan(softmax(kaionb.asarray(x)).get()[0].astype(np.float64)).all()
    assert [k for k in kernels_run if "softmax" in k] == [
        f"_softmax_fwd_kernel_c{size}_{np.dtype(dtype).name}"] * 2


@gpu
@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_shift_invariant_and_large(axis):
    x = random_array((300, 257), np.float32, rng=np.random.default_rng(4))
    a = softmax(kaionb.asarray(x), axis=axis).get()
    b = softmax(kaionb.asarray(x + 50.0), axis=axis).get()
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-9)
    # Large logits: the reference takes the same float32-rounded inputs.
    big = (x * 1e3 + 1e4).astype(np.float32)
    assert_close(softmax(kaionb.asarray(big), axis=axis), softmax_ref(big, axis=axis),
                 dtype=np.float32)
    view = kaionb.asarray(x)[1::2, 1:]
    assert_close(softmax(view, axis=axis), softmax_ref(x[1::2, 1:], axis=axis),
                 dtype=np.float32)


# -- GPU: backward ---------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("dtype", DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("grad_f32", [True, False], ids=["grad_f32", "grad_same"])
@pytest.mark.parametrize("shape", [(3, 8191), (8191, 3), (37, 1000), (16384, 33),
                                   (3, 40000), (33, 5, 130), (3, 4, 5, 67)], ids=str)
def test_softmax_bwd(dtype, grad_f32, shape):
    """dx = y·(g − Σ g·y) against float64 NumPy on every axis: row (register and
    streaming: 40000 > 16384) and column kernels."""
    rng = np.random.default_rng(sum(shape))
    gdt = np.float32 if grad_f32 else dtype
    for axis in range(len(shape)):
        y = softmax_ref(random_array(shape, np.float32, rng=rng, scale=2.0), axis).astype(dtype)
        g = random_array(shape, gdt, rng=rng)
        out = poisoned(shape, gdt)
        assert softmax_bwd(kaionb.asarray(g), kaionb.asarray(y), axis, out=out) is out
        assert_close(out, softmax_bwd_ref(g, y, axis), tol=tolerance(gdt),
                     what=f"softmax_bwd axis {axis}")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("view", list(VIEWS), ids=str)
def test_softmax_bwd_views(dtype, view):
    """y as views, grad in the transposed memory order (mixed layouts: the element-wise
    column kernel, where y alone would take the row kernel), dx in y's order."""
    rng = np.random.default_rng(7)
    fn = VIEWS[view]
    for shape in [(37, 1001), (5, 130, 33)]:
        for axis in range(len(shape)):
            y_full = softmax_ref(random_array(shape, np.float32, rng=rng), axis).astype(dtype)
            g_full = random_array(shape, np.float32, rng=rng)
            y_dev = fn(kaionb.asarray(y_full))
            g_host = fn(g_full)
            # grad in the transposed memory order of the view
            g_dev = kaionb.asarray(np.ascontiguousarray(g_host.T)).T
            got = softmax_bwd(g_dev, y_dev, axis)
            assert got.dtype == np.float32 and got.shape == y_dev.shape
            assert_close(got, softmax_bwd_ref(g_host, fn(y_full), axis),
                         tol=tolerance(np.float32), what=f"softmax_bwd {view} axis {axis}")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("shape, axis", [((16, 300), -1), ((300, 16), 0), ((4, 9, 70), 1),
                                         ((3, 4, 5, 6), 2)])
def test_softmax_on_the_tape(dtype, shape, axis):
    """The tape's dx (float32) equals softmax_bwd_ref of the forward's own output; the
    forward with no tape records nothing."""
    rng = np.random.default_rng(len(shape) + axis)
    x_h = random_array(shape, dtype, rng=rng, scale=2.0)
    g_h = random_array(shape, np.float32, rng=rng)
    x = kaionb.asarray(x_h)
    x.requires_grad = True
    y0 = softmax(x, axis=axis)  # no tape: nothing recorded, y0 needs no gradient
    assert not y0.requires_grad
    with grad.Tape() as tape:
        y = softmax(x, axis=axis)
    tape.backward(y, kaionb.asarray(g_h))
    assert x.grad.dtype == np.float32 and x.grad.shape == shape
    assert_close(x.grad, softmax_bwd_ref(g_h, y.get(), axis), tol=tolerance(np.float32))
    # ... and the float64 derivative of softmax at x itself, to the forward's precision.
    assert_close(x.grad, softmax_bwd_ref(g_h, softmax_ref(x_h, axis), axis),
                 tol=4 * tolerance(dtype))


@gpu
@pytest.mark.parametrize("shape, axis", [((6, 50), 1), ((50, 6), 0), ((3, 7, 20), 1)])
def test_softmax_gradcheck(shape, axis):
    x = kaionb.asarray(random_array(shape, np.float32, rng=np.random.default_rng(3)))
    x.requires_grad = True
    assert grad.gradcheck(lambda a: softmax(a, axis=axis), [x], probes=8) < 2e-2


@gpu
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_bwd_against_torch(axis):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    x_h = random_array((5, 33, 70), np.float32, rng=rng)
    g_h = random_array((5, 33, 70), np.float32, rng=rng)
    xt = torch.tensor(x_h.astype(np.float64), requires_grad=True)
    torch.softmax(xt, dim=axis).backward(torch.tensor(g_h.astype(np.float64)))
    x = kaionb.asarray(x_h)
    x.requires_grad = True
    with grad.Tape() as tape:
        y = softmax(x, axis=axis)
    tape.backward(y, kaionb.asarray(g_h))
    assert_close(x.grad, xt.grad.numpy(), tol=tolerance(np.float32))
