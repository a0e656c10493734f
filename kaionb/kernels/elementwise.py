"""Elementwise ops — arithmetic, comparisons, math functions, ``where``, ``clip``, and the
converting copies behind ``astype`` / ``copy`` / ``fill`` — from one kernel factory.

Host side, once per call signature (then :func:`~kaionb.kernels.op.fast_path` replays it):

1. Types as NumPy: ``ufunc.resolve_dtypes`` gives the loop's dtype and the result's, with
   NEP 50's weak Python scalars and NumPy's own TypeError for combinations it refuses.
   One deliberate difference: a Python scalar keeps a bfloat16 array bfloat16 (NumPy,
   through ml_dtypes, makes ``bf16 + 2.0`` float32).
2. Shapes broadcast as NumPy; each array operand becomes a view of the output's shape
   with stride 0 along broadcast axes, and :func:`_collapse` merges the axes that are
   contiguous in every operand.
3. A kernel is picked by (op, operand dtypes and kinds, loop dtype, output dtype,
   layout) and made on first use (:func:`_elementwise_kernel`):

   - ``vector``: ``flat`` where every array (operands and output) has the same itemsize
     and a 16-byte aligned start: each thread moves ``VECTORS`` 16-byte words4 per
     operand per step (``ld.global.v4`` / ``st.global.v4``: 8 halves a load where the
     flat kernel moves one), decoded through :func:`.helpers.dtypes.word_codec`; the
     last ``n % (16 // itemsize)`` elements go element by element. Arrays that all
     start the same distance past a 16-byte boundary (``a[1:] + b[1:]`` into
     ``out=o[1:]``, at least ``SPLIT_BYTES`` of output) run the elements before the
     output's next 128-byte line on the flat kernel first.
   - ``rows``: two collapsed axes, every array of one itemsize, contiguous along the
     rows, rows whole words4 long, a multiple of 16 bytes apart (or 0: a broadcast row)
     and 16-byte aligned: the vector kernel's words4 on a 2-D grid (x along the row, y
     over rows).
   - ``flat``: every array operand contiguous along one collapsed axis. Each thread
     issues ``UNROLL`` coalesced loads per operand before it computes and stores, so a
     warp keeps several memory requests in flight; the grid covers the array (a
     grid-stride loop only past ``MAX_GRID_X`` blocks).
   - ``tiled``: an operand walks the output's rows across its own (a transposed view,
     ``a + b.T``). A block stages a tile of ``TILE`` columns by ``TILE`` x depth rows
     (:func:`_tile_depth`) of each such operand in shared memory, read along that
     operand's contiguous axis, and writes the output's tile along its rows; the other
     operands are read directly. Up to four collapsed axes, the last two the tile's.
   - ``strided``: up to four collapsed axes with any byte strides (broadcasts, transposes,
     slices, negative steps). A 2-D grid: x runs along the last axis, y over the rows
     formed by the others, whose indices are divided out once per row, not per element.

Operands are arrays or scalars (passed as kernel arguments in the loop's compute type,
rounded to the loop dtype first); every kernel has three operand slots, unused ones an
``int32`` 0 that no code reads. Elements are decoded to the loop's compute type
(:mod:`.helpers.dtypes`: halves in float32), computed by :mod:`.helpers.scalar_math` with
NumPy's semantics, and encoded to the output's storage.

An output that overlaps an input other than element for element (``a[1:] += a[:-1]``)
gets a copy of that input first, as NumPy does.
"""

from __future__ import annotations

import builtins
import math
from typing import NamedTuple

import numpy as np
from numba import cuda, from_dtype, int32, int64, uint32

from .._device import multiprocessor_count
from ..array import DeviceArray, bfloat16, empty, register_kernel
from ..grad.record import active_tape
from ..ptx_patches import device_function, global_addr, ld_global_v4_u32, st_global_v4_u32
from ..validation import as_array, fail
from .helpers.dtypes import (BOOL, HALF_DTYPES, compute_type, converter, encode, host_scalar,
                             scalar_type_name, storage, word_codec)
from .helpers.scalar_math import scalar_op
from .launch import KernelDef, kernel_family
from .op import Plan, _span, fast_path, record, run

THREADS = 256
UNROLL = 4  # loads in flight per operand per thread in the flat kernel
# Flat operands that share a misalignment, from this many output bytes on, run their
# leading elements apart and the rest on the vector kernel, the output's stores from a
# 128-byte line boundary (LINE_BYTES): a + b on 2^28 - 1 elements one in (out= one in,
# H100) read 45% (f32) / 53% (f16) of copy bandwidth on the flat kernel, 80% / 86% with
# the vector kernel from the next 16-byte boundary.
SPLIT_BYTES = 4 << 20
LINE_BYTES = 128
VECTORS = 2  # words4 in flight per operand per thread in the vector kernel (its loop: two)
VECTOR_BYTES = 16
# Enough resident blocks to cover an H100 (132 SMs) in one wave; a grid-stride loop
# takes the rest.
BLOCKS_PER_SM = 8
# The flat and vector kernels' grids cover the whole array (one step of their grid-stride
# loops below MAX_GRID_X blocks): with one resident wave a block's steps lie 4 MiB apart
# and the flat kernel's misaligned loads read 1.39x their bytes from DRAM (ncu: 2.98 GB
# for 2.15). H100, 2^28 elements, µs at 8 / 64 / 512 blocks per SM / covering: a[1:] +
# b[1:] into an aligned out f32 1512 / 1234 / 1108 / 1061 (CuPy 1278); f16 -> f32 copy
# 693 / 598 / 582 / 570; the vector kernel's f32 add 1112 / 1089 / – / 1075 (256 per SM).
MAX_GRID_X = 2**31 - 1
MAX_DIMS = 4
MAX_GRID_Y = 65535
COLUMNS_PER_THREAD = 8  # strided kernel: columns of one row per thread (at least)
TILE = 32  # tiled kernel: a block writes TILE columns of TILE * depth rows...
TILE_ROWS = 8  # ...with TILE x TILE_ROWS threads, each depth * TILE / TILE_ROWS rows.
# depth: TILE_DEPTH_BYTES over the arrays' smallest itemsize, at most MAX_TILE_DEPTH, so
# that a thread keeps about as many bytes in flight for any dtype. H100, [8192, 8192] + a
# transposed operand, µs at depth 1 / 2 / 4 / 8: f64 536 / 539 / 542 / –, f32 322 / 276 /
# 276 / –, f16 – / 241 / 199 / 213, int8 (a transposed copy) – / – / 138 / 158 (96
# registers at depth 8).
TILE_DEPTH_BYTES = 8
MAX_TILE_DEPTH = 4
MAX_GRID_Z = 65535


class Ufunc(NamedTuple):
    """A public elementwise op: its NumPy ufunc (the type rules), the scalar_math function
    name, and the number of inputs."""

    numpy: object
    scalar: str
    nin: int


UFUNCS = {
    "add": Ufunc(np.add, "add", 2),
    "subtract": Ufunc(np.subtract, "subtract", 2),
    "multiply": Ufunc(np.multiply, "multiply", 2),
    "divide": Ufunc(np.true_divide, "true_divide", 2),
    "floor_divide": Ufunc(np.floor_divide, "floor_divide", 2),
    "remainder": Ufunc(np.remainder, "remainder", 2),
    "pow": Ufunc(np.power, "power", 2),
    "maximum": Ufunc(np.maximum, "maximum", 2),
    "minimum": Ufunc(np.minimum, "minimum", 2),
    "equal": Ufunc(np.equal, "equal", 2),
    "not_equal": Ufunc(np.not_equal, "not_equal", 2),
    "less": Ufunc(np.less, "less", 2),
    "less_equal": Ufunc(np.less_equal, "less_equal", 2),
    "greater": Ufunc(np.greater, "greater", 2),
    "greater_equal": Ufunc(np.greater_equal, "greater_equal", 2),
    "bitwise_and": Ufunc(np.bitwise_and, "bitwise_and", 2),
    "bitwise_or": Ufunc(np.bitwise_or, "bitwise_or", 2),
    "bitwise_xor": Ufunc(np.bitwise_xor, "bitwise_xor", 2),
    "logical_and": Ufunc(np.logical_and, "logical_and", 2),
    "logical_or": Ufunc(np.logical_or, "logical_or", 2),
    "logical_xor": Ufunc(np.logical_xor, "logical_xor", 2),
    "negative": Ufunc(np.negative, "negative", 1),
    "positive": Ufunc(np.positive, "positive", 1),
    "abs": Ufunc(np.absolute, "absolute", 1),
    "square": Ufunc(np.square, "square", 1),
    "sign": Ufunc(np.sign, "sign", 1),
    "bitwise_invert": Ufunc(np.invert, "invert", 1),
    "logical_not": Ufunc(np.logical_not, "logical_not", 1),
    "exp": Ufunc(np.exp, "exp", 1),
    "log": Ufunc(np.log, "log", 1),
    "sqrt": Ufunc(np.sqrt, "sqrt", 1),
    "rsqrt": Ufunc(np.sqrt, "rsqrt", 1),  # not a NumPy ufunc: sqrt's type rules
    "sin": Ufunc(np.sin, "sin", 1),
    "cos": Ufunc(np.cos, "cos", 1),
    "tanh": Ufunc(np.tanh, "tanh", 1),
    "sigmoid": Ufunc(np.tanh, "sigmoid", 1),  # tanh's type rules (ints -> floats)
    "floor": Ufunc(np.floor, "floor", 1),
    "ceil": Ufunc(np.ceil, "ceil", 1),
    "isnan": Ufunc(np.isnan, "isnan", 1),
    "isinf": Ufunc(np.isinf, "isinf", 1),
    "isfinite": Ufunc(np.isfinite, "isfinite", 1),
    "clip": Ufunc(np._core.umath.clip, "clip", 3),
    "where": Ufunc(None, "where", 3),  # types: bool condition, result_type of the others
    "copy": Ufunc(None, "copy", 1),  # astype / copy: the loop is the output's dtype
}


# -- device side -----------------------------------------------------------------------------

def _kind(dt: np.dtype) -> str:
    return "f" if dt.kind == "f" or dt in HALF_DTYPES else dt.kind


def _compute_fn(name: str, loop: np.dtype):
    """The three-slot device function computing op ``name`` on loop dtype ``loop``."""
    kind, T = _kind(loop), compute_type(loop)
    if name == "copy":
        @device_function
        def fn(a, b, c):
            return a
    elif name == "where":
        @device_function
        def fn(c, a, b):
            return a if c else b
    elif name == "clip":
        hi_fn, lo_fn = scalar_op("minimum", kind, T), scalar_op("maximum", kind, T)

        @device_function
        def fn(x, lo, hi):
            return hi_fn(lo_fn(x, lo), hi)
    elif UFUNCS[name].nin == 1:
        op = scalar_op(UFUNCS[name].scalar, kind, T)

        @device_function
        def fn(a, b, c):
            return op(a)
    else:
        op = scalar_op(UFUNCS[name].scalar, kind, T)

        @device_function
        def fn(a, b, c):
            return op(a, b)
    return fn


@device_function
def _unused_flat(x, i):
    return x


@device_function
def _unused_strided(x, i0, i1, i2, i3):
    return x


def _flat_loader(src: np.dtype | None, loop: np.dtype):
    """x[i] decoded to ``loop``'s compute type; a scalar (``src`` None) is itself."""
    if src is None:
        return _unused_flat
    conv = converter(src, loop)

    @device_function
    def load(x, i):
        return conv(x[i])
    return load


def _strided_loader(src: np.dtype | None, loop: np.dtype):
    if src is None:
        return _unused_strided
    conv = converter(src, loop)

    @device_function
    def load(x, i0, i1, i2, i3):
        return conv(x[i0, i1, i2, i3])
    return load


def _make_flat(fn, loads, enc):
    ld0, ld1, ld2 = loads
    span = THREADS * UNROLL

    def _elementwise_flat_kernel(x0, x1, x2, out, n):
        i = cuda.blockIdx.x * span + cuda.threadIdx.x
        step = cuda.gridDim.x * span
        while i < n:
            j1 = i + THREADS
            j2 = i + 2 * THREADS
            j3 = i + 3 * THREADS
            if j3 < n:  # the whole unrolled group: every load issued before any store
                a0, a1, a2, a3 = ld0(x0, i), ld0(x0, j1), ld0(x0, j2), ld0(x0, j3)
                b0, b1, b2, b3 = ld1(x1, i), ld1(x1, j1), ld1(x1, j2), ld1(x1, j3)
                c0, c1, c2, c3 = ld2(x2, i), ld2(x2, j1), ld2(x2, j2), ld2(x2, j3)
                out[i] = enc(fn(a0, b0, c0))
                out[j1] = enc(fn(a1, b1, c1))
                out[j2] = enc(fn(a2, b2, c2))
                out[j3] = enc(fn(a3, b3, c3))
            else:
                j = i
                while j < n:
                    out[j] = enc(fn(ld0(x0, j), ld1(x1, j), ld2(x2, j)))
                    j += THREADS
            i += step

    return _elementwise_flat_kernel


def _vector_slot(src: np.dtype | None, loop: np.dtype | None, rows: bool):
    """``(load, element)`` of one operand slot of the vector kernels: ``load(x, r, v)``
    words4 v of the operand (of its row r in the ``rows`` layout), ``element(words, x,
    k)`` element k of them in ``loop``'s compute type. A scalar (or unused) slot loads
    nothing and is its own every element."""
    if src is None:
        @device_function
        def load_none(x, r, v):
            return (uint32(0), uint32(0), uint32(0), uint32(0))

        @device_function
        def scalar(words, x, k):
            return x

        return load_none, scalar
    per = VECTOR_BYTES // src.itemsize
    get = word_codec(src)[0]
    conv = converter(src, loop)

    # Coherent loads (not .nc): the output may be an input, element for element.
    if rows:
        @device_function
        def load(x, r, v):
            return ld_global_v4_u32(global_addr(x, (int64(r), int64(v) * per)))
    else:
        @device_function
        def load(x, r, v):
            return ld_global_v4_u32(global_addr(x, int64(v) * per))

    @device_function
    def element(words, x, k):
        return conv(get(words, k))

    return load, element


def _vector_store(fn, slots, enc, out_dt, rows):
    """Device function ``(a, b, c, x0, x1, x2, out, r, v)``: the words4 v of the output (of
    its row r in the ``rows`` layout) computed from the operands' words4 ``a, b, c``."""
    (_, el0), (_, el1), (_, el2) = slots
    put = word_codec(out_dt)[1]
    PER = VECTOR_BYTES // out_dt.itemsize

    @device_function
    def compute(a, b, c, x0, x1, x2):
        w = cuda.local.array(4, uint32)
        for i in range(4):
            w[i] = uint32(0)
        for k in range(PER):
            put(w, k, enc(fn(el0(a, x0, k), el1(b, x1, k), el2(c, x2, k))))
        return (w[0], w[1], w[2], w[3])

    if rows:
        @device_function
        def compute_store(a, b, c, x0, x1, x2, out, r, v):
            st_global_v4_u32(global_addr(out, (int64(r), int64(v) * PER)),
                             compute(a, b, c, x0, x1, x2))
    else:
        @device_function
        def compute_store(a, b, c, x0, x1, x2, out, r, v):
            st_global_v4_u32(global_addr(out, int64(v) * PER), compute(a, b, c, x0, x1, x2))
    return compute_store


def _vector_step(fn, slots, enc, out_dt, rows):
    """Device function ``(x0, x1, x2, out, r, v, nvec)``: one step of a vector kernel's
    thread — words4 v and v + THREADS of every operand (VECTORS: two; those below
    ``nvec``) loaded before either is computed and stored."""
    (vl0, _), (vl1, _), (vl2, _) = slots
    compute_store = _vector_store(fn, slots, enc, out_dt, rows)

    @device_function
    def step(x0, x1, x2, out, r, v, nvec):
        v1 = v + THREADS
        a0, b0, c0 = vl0(x0, r, v), vl1(x1, r, v), vl2(x2, r, v)
        a1, b1, c1 = a0, b0, c0
        if v1 < nvec:  # every load issued before any store
            a1, b1, c1 = vl0(x0, r, v1), vl1(x1, r, v1), vl2(x2, r, v1)
        compute_store(a0, b0, c0, x0, x1, x2, out, r, v)
        if v1 < nvec:
            compute_store(a1, b1, c1, x0, x1, x2, out, r, v1)

    return step


def _make_vector(fn, loads, slots, enc, out_dt):
    """The vector layout's kernel (module doc); ``slots`` the operands' (load, element)."""
    ld0, ld1, ld2 = loads
    step = _vector_step(fn, slots, enc, out_dt, False)
    PER = VECTOR_BYTES // out_dt.itemsize
    span = THREADS * VECTORS

    def _elementwise_vector_kernel(x0, x1, x2, out, n):
        nvec = n // PER
        tail = nvec * PER + cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        if tail < n:  # the elements past the last whole words4: one a thread
            out[tail] = enc(fn(ld0(x0, tail), ld1(x1, tail), ld2(x2, tail)))
        v = cuda.blockIdx.x * span + cuda.threadIdx.x
        while v < nvec:
            step(x0, x1, x2, out, 0, v, nvec)
            v += cuda.gridDim.x * span

    return _elementwise_vector_kernel


def _make_vector_rows(fn, slots, enc, out_dt):
    """The rows layout's kernel (module doc): a 2-D grid, x over the words4 of a row (two
    a thread, VECTORS), y over the rows (a grid-stride loop)."""
    step = _vector_step(fn, slots, enc, out_dt, True)
    PER = VECTOR_BYTES // out_dt.itemsize

    def _elementwise_rows_kernel(x0, x1, x2, out, rows):
        nvec = out.shape[1] // PER
        v = cuda.blockIdx.x * (THREADS * VECTORS) + cuda.threadIdx.x
        r = cuda.blockIdx.y
        while r < rows:
            if v < nvec:
                step(x0, x1, x2, out, r, v, nvec)
            r += cuda.gridDim.y

    return _elementwise_rows_kernel


def _make_strided(fn, loads, enc):
    ld0, ld1, ld2 = loads

    def _elementwise_strided_kernel(x0, x1, x2, out, rows, d1, d2):
        inner = out.shape[3]
        col0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        col_step = cuda.gridDim.x * cuda.blockDim.x
        r = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        while r < rows:
            i2 = r % d2
            rest = r // d2
            i1 = rest % d1
            i0 = rest // d1
            j = col0
            while j < inner:
                out[i0, i1, i2, j] = enc(fn(ld0(x0, i0, i1, i2, j), ld1(x1, i0, i1, i2, j),
                                            ld2(x2, i0, i1, i2, j)))
                j += col_step
            r += cuda.gridDim.y * cuda.blockDim.y

    return _elementwise_strided_kernel


def _tile_depth(itemsize: int) -> int:
    """The tiled kernel's rows per tile, in TILEs, for arrays of smallest ``itemsize``."""
    return builtins.max(1, builtins.min(MAX_TILE_DEPTH, TILE_DEPTH_BYTES // itemsize))


def _tile_slot(src: np.dtype | None, loop: np.dtype | None, staged: bool, depth: int):
    """``(stage, early, value, tile_shape, tile_type, early_type)`` of one operand slot of
    the tiled kernel of ``depth``, for the tile at row r0, column c0 of plane (i0, i1):

    - ``stage(tile, x, i0, i1, r0, c0)`` copies a staged operand's tile into shared
      memory (``tile[column, row]``), thread x walking the operand's contiguous rows;
    - ``early(vals, x, i0, i1, r0, c0)`` loads a direct operand's elements of the thread
      (column threadIdx.x, rows threadIdx.y + TILE_ROWS·j) before the barrier;
    - ``value(tile, vals, x, j)`` is element j of the thread in ``loop``'s compute type
      (a scalar slot: x).

    Indices are clamped into the array, so every load is issued before any is used; the
    clamped ones fill entries no thread keeps."""
    per_row = TILE * depth
    steps = per_row // TILE_ROWS
    loads = TILE // TILE_ROWS  # per TILE rows of the tile (depth of them)
    raw_shape = (depth, loads)

    @device_function
    def stage_nothing(tile, x, i0, i1, r0, c0):
        return

    @device_function
    def early_nothing(vals, x, i0, i1, r0, c0):
        return

    if src is None:  # a scalar (or unused) slot is its own every element
        @device_function
        def itself(tile, vals, x, j):
            return x

        return stage_nothing, early_nothing, itself, (1, 1), uint32, int32
    load = _strided_loader(src, loop)
    if not staged:
        @device_function
        def early(vals, x, i0, i1, r0, c0):
            c = min(c0 + cuda.threadIdx.x, x.shape[3] - 1)
            for j in range(steps):
                vals[j] = load(x, i0, i1, min(r0 + cuda.threadIdx.y + j * TILE_ROWS,
                                              x.shape[2] - 1), c)

        @device_function
        def direct(tile, vals, x, j):
            return vals[j]

        return stage_nothing, early, direct, (1, 1), uint32, compute_type(loop)
    conv = converter(src, loop)
    stored = from_dtype(np.dtype(storage(src)))

    @device_function
    def stage(tile, x, i0, i1, r0, c0):
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        last_r, last_c = x.shape[2] - 1, x.shape[3] - 1
        raw = cuda.local.array(raw_shape, stored)
        for h in range(depth):
            r = min(r0 + tx + h * TILE, last_r)
            for j in range(loads):
                raw[h, j] = x[i0, i1, r, min(c0 + ty + j * TILE_ROWS, last_c)]
        for h in range(depth):
            for j in range(loads):
                tile[ty + j * TILE_ROWS, tx + h * TILE] = raw[h, j]  # a warp: consecutive

    @device_function
    def from_tile(tile, vals, x, j):
        # Row stride per_row + 1 elements: a warp's reads of one row land in distinct banks.
        return conv(tile[cuda.threadIdx.x, cuda.threadIdx.y + j * TILE_ROWS])

    return stage, early_nothing, from_tile, (TILE, per_row + 1), stored, int32


def _make_tiled(fn, slots, enc, depth):
    """The tiled layout's kernel (module doc): block (x, y) writes the output's tile of
    TILE columns and TILE·depth rows at row TILE·depth·y, column TILE·x of plane z =
    i0·d1 + i1."""
    (st0, ea0, va0, S0, T0, E0), (st1, ea1, va1, S1, T1, E1), (st2, ea2, va2, S2, T2, E2) = slots
    per_row = TILE * depth
    steps = per_row // TILE_ROWS

    def _elementwise_tiled_kernel(x0, x1, x2, out, d1):
        t0 = cuda.shared.array(S0, T0)
        t1 = cuda.shared.array(S1, T1)
        t2 = cuda.shared.array(S2, T2)
        e0 = cuda.local.array(steps, E0)
        e1 = cuda.local.array(steps, E1)
        e2 = cuda.local.array(steps, E2)
        i0 = cuda.blockIdx.z // d1
        i1 = cuda.blockIdx.z - i0 * d1
        r0 = cuda.blockIdx.y * per_row
        c0 = cuda.blockIdx.x * TILE
        st0(t0, x0, i0, i1, r0, c0)
        st1(t1, x1, i0, i1, r0, c0)
        st2(t2, x2, i0, i1, r0, c0)
        ea0(e0, x0, i0, i1, r0, c0)  # the direct operands' loads, in flight across the barrier
        ea1(e1, x1, i0, i1, r0, c0)
        ea2(e2, x2, i0, i1, r0, c0)
        cuda.syncthreads()
        c = c0 + cuda.threadIdx.x
        if c < out.shape[3]:
            for j in range(steps):
                r = r0 + cuda.threadIdx.y + j * TILE_ROWS
                if r < out.shape[2]:
                    out[i0, i1, r, c] = enc(fn(va0(t0, e0, x0, j), va1(t1, e1, x1, j),
                                               va2(t2, e2, x2, j)))

    return _elementwise_tiled_kernel


class KernelKey(NamedTuple):
    """What one elementwise kernel is specialized on. ``operands``: per slot, the array's
    dtype or None for a scalar (or an unused slot)."""

    op: str
    operands: tuple
    loops: tuple  # per slot, the dtype its value is computed as (None: unused slot)
    out: np.dtype
    layout: str  # "vector", "flat", "rows", "tiled" or "strided"
    staged: tuple = ()  # tiled: per slot, whether it is read through a shared tile


def _key_tile_depth(key: KernelKey) -> int:
    return _tile_depth(builtins.min(dt.itemsize for dt in (key.out,) + key.operands
                                   if dt is not None))


_KERNELS: dict = {}
# libdevice's sinf/cosf (and sin/cos) reduce |x| > ~1e5 with Payne-Hanek, which keeps its
# partial products in a 28-byte local array: a stack frame only those arguments touch.
_TRIG_LOCAL_MEMORY = "libdevice sin/cos range reduction for huge arguments"


def _elementwise_kernel(key: KernelKey) -> KernelDef:
    kdef = _KERNELS.get(key)
    if kdef is not None:
        return kdef
    flat = key.layout in ("flat", "vector")
    make_load = _flat_loader if flat else _strided_loader
    result_loop = key.loops[1] if key.op == "where" else key.loops[0]
    fn = _compute_fn(key.op, result_loop)
    loads = ()
    if key.layout not in ("rows", "tiled"):  # element loaders (rows: whole words4)
        loads = tuple(make_load(src, loop) if loop is not None else
                      (_unused_flat if flat else _unused_strided)
                      for src, loop in zip(key.operands, key.loops))
    dims = {"vector": "[::1]", "flat": "[::1]", "rows": "[:, :]"}.get(key.layout,
                                                                     "[:, :, :, :]")
    args = []
    for src, loop in zip(key.operands, key.loops):
        if src is not None:
            args.append(storage(src) + dims)
        else:
            args.append("int32" if loop is None else scalar_type_name(loop))
    args.append(storage(key.out) + dims)
    args += ["int64", "int64", "int64"] if key.layout == "strided" else ["int64"]
    tag = "_".join("s" if s is None else s.name for s in key.operands)
    loops = "_".join("x" if lp is None else lp.name for lp in key.loops)
    staged = "".join(f"_staging_x{i}" for i, st in enumerate(key.staged) if st)
    name = (f"_elementwise_{key.op}_{tag}_as_{loops}_to_{key.out.name}{staged}_{key.layout}"
            "_kernel")
    enc = encode(key.out)
    if key.layout == "tiled":
        depth = _key_tile_depth(key)
        pyfunc = _make_tiled(fn, tuple(_tile_slot(src, loop, st, depth) for src, loop, st in
                                       zip(key.operands, key.loops, key.staged)), enc, depth)
    elif key.layout in ("vector", "rows"):
        rows = key.layout == "rows"
        slots = tuple(_vector_slot(src, loop, rows)
                      for src, loop in zip(key.operands, key.loops))
        pyfunc = (_make_vector_rows(fn, slots, enc, key.out) if rows else
                  _make_vector(fn, loads, slots, enc, key.out))
    else:
        pyfunc = (_make_flat if flat else _make_strided)(fn, loads, enc)
    kdef = KernelDef(pyfunc, [f"void({', '.join(args)})"],
                     name=name, registered=False,
                     local_memory=_TRIG_LOCAL_MEMORY if key.op in ("sin", "cos") else None)
    _KERNELS[key] = kdef
    return kdef


# -- host side: types ------------------------------------------------------------------------

_PY_SCALARS = (bool, int, float)
_RESOLVED: dict = {}


def _operand_type(x):
    """What NumPy's type resolution gets for an operand: a dtype, or the Python type of a
    weak scalar."""
    if isinstance(x, DeviceArray):
        return x.dtype
    if type(x) is bool:
        return BOOL
    if type(x) in (int, float):
        return type(x)
    return np.asarray(x).dtype  # NumPy scalars are typed (strong)


def resolve(name: str, types: tuple, op: str | None = None) -> tuple:
    """(loop dtype per input, output dtype) for op ``name`` on operand ``types``, as NumPy
    resolves them; NumPy's TypeError, prefixed with ``op`` (the function called, default
    ``name``), when it refuses."""
    key = (name, types)
    hit = _RESOLVED.get(key)
    if hit is not None:
        return hit
    # ml_dtypes' bfloat16 has no weak-scalar rule: a Python number joins it as bfloat16.
    values = types[1:] if name == "where" else types  # a condition does not join
    if any(t == bfloat16 for t in values if isinstance(t, np.dtype)):
        types_np = tuple(bfloat16 if t is int or t is float else t for t in types)
    else:
        types_np = types
    try:
        if name == "where":
            result = np.result_type(*(_weak_value(t) for t in types_np[1:]))
            loops, out = (BOOL, result, result), result
        elif name == "copy":
            raise AssertionError("copy has no type resolution")  # its loop is the output's
        else:
            dts = UFUNCS[name].numpy.resolve_dtypes(types_np + (None,))
            loops, out = tuple(dts[:-1]), dts[-1]
    except TypeError as exc:
        raise TypeError(f"{op or name}: {exc}") from None
    _RESOLVED[key] = loops, out
    return loops, out


def _weak_value(t):
    """An argument np.result_type treats as ``t``: a dtype, or a Python scalar of the type."""
    return t(0) if t is int or t is float else t  # (np.dtype("f8") == float is True)


def _check_scalar(name: str, value, loop: np.dtype):
    """A Python int must fit an integer loop (NumPy's OverflowError otherwise)."""
    if type(value) is int and loop.kind in "iu":
        info = np.iinfo(loop)
        if not info.min <= value <= info.max:
            raise OverflowError(f"{name}: Python integer {value} out of bounds for {loop}")


# -- host side: shapes and layouts -----------------------------------------------------------

def broadcast_shape(name: str, shapes) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _broadcast_view(x: DeviceArray, shape: tuple) -> DeviceArray:
    """``x`` seen with ``shape`` (already checked to broadcast): stride 0 on new and
    stretched axes."""
    pad = len(shape) - x.ndim
    strides = [0] * pad + [0 if d == 1 and n != 1 else s
                           for d, n, s in zip(x.shape, shape[pad:], x.strides)]
    return x._view(shape, strides)


def _collapse(shape, *stride_sets):
    """Merge adjacent axes that are contiguous with each other in every array, drop size-1
    axes: the fewest dimensions that describe the same walk (row-major order kept)."""
    dims = [(d, [s[i] for s in stride_sets]) for i, d in enumerate(shape) if d != 1]
    merged = []
    for d, strides in dims:
        if merged and all(ps == d * s for ps, s in zip(merged[-1][1], strides)):
            merged[-1] = (merged[-1][0] * d, strides)
        else:
            merged.append((d, strides))
    return [d for d, _ in merged], [[st[k] for _, st in merged] for k in range(len(stride_sets))]


def _needs_copy(x: DeviceArray, out: DeviceArray) -> bool:
    """Whether reading ``x`` while writing ``out`` could read an element already written:
    shared memory that is not the very same element walk (the same start, strides,
    dtype and shape: ``add(a[:1], b, out=a)`` broadcasts a row the call overwrites)."""
    if not x.size or not out.size:
        return False
    (lo, hi), (olo, ohi) = _span(x), _span(out)
    if hi <= olo or ohi <= lo:
        return False
    return not (x.ptr == out.ptr and x.strides == out.strides and x.dtype == out.dtype
                and x.shape == out.shape)


# -- host side: the op -----------------------------------------------------------------------

def _grid_stride_blocks(size: int, per_thread: int = 1) -> int:
    """Blocks of THREADS for a grid-stride loop over ``size`` elements, ``per_thread`` each:
    at most one resident wave."""
    return max(1, min(math.ceil(size / (THREADS * per_thread)),
                      multiprocessor_count() * BLOCKS_PER_SM))


def _covering_blocks(size: int, per_thread: int) -> int:
    """Blocks of THREADS covering ``size`` elements, ``per_thread`` each (see MAX_GRID_X)."""
    return max(1, min(math.ceil(size / (THREADS * per_thread)), MAX_GRID_X))


@fast_path
def elementwise_fwd(name, x1, x2=None, x3=None, *, out=None, dtype=None):
    """Validate, resolve types, shapes and ``out``; launch unless empty. ``dtype``: the
    output dtype of a ``copy`` (astype). ``clip`` with one bound None runs maximum (x,
    min) or minimum (x, max); its refusals name clip and its arguments."""
    spec = UFUNCS.get(name)
    if spec is None:
        raise ValueError(f"elementwise: unknown op {name!r}")
    given = [(_operand_name(name, i), x) for i, x in enumerate((x1, x2, x3)[:spec.nin])]
    ufunc = name
    if name == "clip" and (x2 is None or x3 is None):
        ufunc = "maximum" if x3 is None else "minimum"
        given = [given[0], given[1] if x3 is None else given[2]]
    operands = [x for _, x in given]
    for i, (operand_name, x) in enumerate(given):
        # Python numbers are weak scalars, NumPy scalars typed ones (NEP 50); anything
        # else becomes an array (zero-copy for GPU memory).
        if not isinstance(x, DeviceArray) and not (
                type(x) in _PY_SCALARS or isinstance(x, np.generic)):
            operands[i] = as_array(name, operand_name, x)
    arrays = [x for x in operands if isinstance(x, DeviceArray)]
    if name == "copy":
        loops, out_dt = (np.dtype(dtype),), np.dtype(dtype)
    else:
        loops, out_dt = resolve(ufunc, tuple(_operand_type(x) for x in operands), name)
    for x, loop in zip(operands, loops):
        _check_scalar(name, x, loop)
    if name == "pow" and type(operands[1]) is int and operands[1] < 0 and loops[1].kind in "iu":
        raise ValueError("pow: Integers to negative integer powers are not allowed.")
    shape = broadcast_shape(name, [x.shape for x in arrays])
    device = arrays[0].device_id if arrays else 0  # (fast_path refused several devices)
    if out is None:
        out = empty(shape, out_dt)
    else:
        out = _check_out(name, ufunc, out, shape, out_dt, device)
    operands = [x.copy() if isinstance(x, DeviceArray) and _needs_copy(x, out) else x
                for x in operands]
    return run(_elementwise_launch, ufunc, tuple(operands), loops, out=out)


# The array API's names of the operands where they are not x1, x2 (errors name them).
elementwise_fwd.uncached.public_names = {
    "where": {"x1": "condition", "x2": "x1", "x3": "x2"},
    "clip": {"x1": "x", "x2": "min", "x3": "max"},
    **{name: {"x1": "x"} for name, spec in UFUNCS.items() if spec.nin == 1},
}


def _operand_name(op: str, i: int) -> str:
    """The public name of operand ``i`` (from 0) of elementwise op ``op``."""
    internal = f"x{i + 1}"
    return elementwise_fwd.uncached.public_names.get(op, {}).get(internal, internal)


def _check_out(name, ufunc, out, shape, result_dt, device):
    """``out=`` of op ``name``, which runs ``ufunc`` (NumPy's cast refusal names it)."""
    if type(out) is not DeviceArray:
        fail(TypeError, name, "out", "a DeviceArray", type(out).__name__)
    if len(out.shape) < len(shape) or broadcast_shape(name, [shape, out.shape]) != out.shape:
        raise ValueError(f"{name}: non-broadcastable output operand with shape {out.shape} "
                         f"doesn't match the broadcast shape {shape}")
    if out.dtype != result_dt and not np.can_cast(result_dt, out.dtype, "same_kind"):
        raise TypeError(f"{name}: Cannot cast ufunc '{ufunc}' output from {result_dt!r} to "
                        f"{out.dtype!r} with casting rule 'same_kind'")
    if out.device_id != device and shape:
        fail(ValueError, name, "out", f"device {device} (where the inputs are)",
             f"device {out.device_id}")
    return out


def _elementwise_launch(name, operands, loops, out):
    """Collapse the layout; one launch (one per leading index past MAX_DIMS axes)."""
    views = [_broadcast_view(x, out.shape) if isinstance(x, DeviceArray) else x
             for x in operands]
    arrays = [v for v in views if isinstance(v, DeviceArray)]
    # Axes in the output's memory order (as NumPy's iterator): a transposed output is
    # written along its own rows.
    order = sorted(range(out.ndim), key=lambda i: -builtins.abs(out.strides[i]))
    shape, strides = _collapse([out.shape[i] for i in order],
                               *([st[i] for i in order] for st in
                                 [out.strides] + [v.strides for v in arrays]))
    out_strides, strides = strides[0], strides[1:]
    flat = len(shape) <= 1 and all(
        not st or st[0] == a.itemsize for a, st in zip([out] + arrays, [out_strides] + strides))
    if flat:
        n = shape[0] if shape else 1

        def part(a, start, stop):  # elements [start, stop) of a flattened array
            return a._view((stop - start,), (a.itemsize,), start * a.itemsize)

        head = _aligned_head([out] + arrays, n)
        if head:  # the elements before the output's next line, then the vector kernel
            pieces = ((0, head, "flat"), (head, n, "vector"))
        else:
            pieces = ((0, n, "vector" if _words_aligned([out] + arrays) else "flat"),)
        for start, stop, layout in pieces:
            parts = iter(part(a, start, stop) for a in arrays)
            args = [next(parts) if isinstance(v, DeviceArray) else v for v in views]
            _launch(name, args, loops, part(out, start, stop), layout)
        return
    if len(shape) == 2 and _rows_layout(shape, [out] + arrays, [out_strides] + strides):
        row_views = iter(a._view(tuple(shape), tuple(st)) for a, st in zip(arrays, strides))
        args = [next(row_views) if isinstance(v, DeviceArray) else v for v in views]
        _launch(name, args, loops, out._view(tuple(shape), tuple(out_strides)), "rows")
        return
    staged = _staged_operands(shape, out, out_strides, arrays, strides)
    layout = "tiled" if staged is not None else "strided"
    if staged is not None:  # per slot (views), a scalar slot never staged
        flags = iter(staged)
        staged = tuple(next(flags) if isinstance(v, DeviceArray) else False for v in views)
    lead = len(shape) - MAX_DIMS
    for index in np.ndindex(*shape[:lead]) if lead > 0 else [()]:
        sub_shape = shape[lead:] if lead > 0 else shape
        pad = MAX_DIMS - len(sub_shape)
        shape4 = (1,) * pad + tuple(sub_shape)

        def view4(a, st):
            offset = sum(i * s for i, s in zip(index, st[:lead])) if lead > 0 else 0
            tail = st[lead:] if lead > 0 else st
            return a._view(shape4, (0,) * pad + tuple(tail), offset)

        strided = iter(view4(a, st) for a, st in zip(arrays, strides))
        args = [next(strided) if isinstance(v, DeviceArray) else v for v in views]
        _launch(name, args, loops, view4(out, out_strides), layout, staged)


def _staged_operands(shape, out, out_strides, arrays, strides) -> tuple | None:
    """Per array operand, whether the tiled layout reads it through a shared tile: its
    walk along the output's rows crosses its own (it is closer packed along the axis
    before). None where no operand is, or the output is not contiguous along its rows,
    or the tiles' plane is narrower than a tile or past the grid's reach."""
    if len(shape) < 2 or min(shape[-2:]) < TILE or out_strides[-1] != out.itemsize:
        return None
    planes = math.prod(shape[-MAX_DIMS:-2])
    if planes > MAX_GRID_Z or math.ceil(shape[-2] / TILE) > MAX_GRID_Y:
        return None
    staged = tuple(st[-1] not in (0, a.itemsize)
                   and builtins.abs(st[-2]) < builtins.abs(st[-1])
                   for a, st in zip(arrays, strides))
    return staged if any(staged) else None


def _words_aligned(arrays) -> bool:
    """Whether the arrays (the output first) share one itemsize and start 16-byte aligned:
    the vector kernels' words4 hold the same elements of each."""
    itemsize = arrays[0].itemsize
    return all(a.itemsize == itemsize and a.ptr % VECTOR_BYTES == 0 for a in arrays)


def _aligned_head(arrays, n: int) -> int:
    """How many leading elements to run apart so that the vector kernel takes the rest
    with the output on a 128-byte line boundary: nonzero when every array (the output
    first) has one itemsize and starts the same number of bytes past a 16-byte boundary
    (``a[1:] + b[1:]``, ``out=o[1:]``), the output is not line-aligned already, and it is
    at least SPLIT_BYTES (a second launch would cost more than it saves on less)."""
    itemsize = arrays[0].itemsize
    off = arrays[0].ptr % VECTOR_BYTES
    line_off = arrays[0].ptr % LINE_BYTES
    if not line_off or off % itemsize or n * itemsize < SPLIT_BYTES or any(
            a.itemsize != itemsize or a.ptr % VECTOR_BYTES != off for a in arrays):
        return 0
    return (LINE_BYTES - line_off) // itemsize


def _rows_layout(shape, arrays, strides) -> bool:
    """Whether a collapsed 2-D walk can take the rows layout: the arrays words4 aligned,
    contiguous along the row, rows whole words4 apart (0 for a broadcast row), and the
    row whole words4 long."""
    itemsize = arrays[0].itemsize
    return shape[1] % (VECTOR_BYTES // itemsize) == 0 and _words_aligned(arrays) and all(
        st[1] == itemsize and st[0] % VECTOR_BYTES == 0 for st in strides)


def _launch(name, args, loops, out, layout, staged=None):
    """One launch of ``layout``'s kernel; ``staged``: the tiled layout's per-slot tiles."""
    slots = list(args) + [None] * (3 - len(args))
    loop_slots = tuple(loops) + (None,) * (3 - len(loops))
    key = KernelKey(name, tuple(a.dtype if isinstance(a, DeviceArray) else None for a in slots),
                    loop_slots, out.dtype, layout,
                    tuple(staged) + (False,) * (3 - len(staged)) if staged else ())
    kdef = _elementwise_kernel(key)
    values = [a if isinstance(a, DeviceArray) else
              (0 if lp is None else host_scalar(a, lp)) for a, lp in zip(slots, loop_slots)]
    if layout == "vector":
        n = out.size
        per = VECTOR_BYTES // out.itemsize
        grid = (_covering_blocks(n // per, VECTORS),)
        Plan.of(kdef, grid, (THREADS,)).launch(*values, out, n)
        return
    if layout == "flat":
        n = out.size
        grid = (_covering_blocks(n, UNROLL),)
        Plan.of(kdef, grid, (THREADS,)).launch(*values, out, n)
        return
    if layout == "rows":
        rows, inner = out.shape
        gx = math.ceil(inner // (VECTOR_BYTES // out.itemsize) / (THREADS * VECTORS))
        waves = multiprocessor_count() * BLOCKS_PER_SM * 4  # as the strided grid below
        gy = max(1, min(rows, MAX_GRID_Y, waves // gx))
        Plan.of(kdef, (gx, gy), (THREADS,)).launch(*values, out, rows)
        return
    if layout == "tiled":
        d0, d1, rows, cols = out.shape
        grid = (math.ceil(cols / TILE), math.ceil(rows / (TILE * _key_tile_depth(key))),
                d0 * d1)
        Plan.of(kdef, grid, (TILE, TILE_ROWS)).launch(*values, out, d1)
        return
    d0, d1, d2, inner = out.shape
    rows = d0 * d1 * d2
    bx = min(THREADS, max(32, 1 << (inner - 1).bit_length()))
    by = THREADS // bx
    # Each thread walks COLUMNS_PER_THREAD columns of a row and then further rows, so
    # the row's index arithmetic (divisions) is paid once per several elements; the grid
    # stops at a few resident waves (measured: one element per thread was 4x slower).
    gx = max(1, math.ceil(inner / (bx * COLUMNS_PER_THREAD)))
    waves = multiprocessor_count() * BLOCKS_PER_SM * 4
    gy = max(1, min(math.ceil(rows / by), MAX_GRID_Y, waves // gx))
    Plan.of(kdef, (gx, gy), (bx, by)).launch(*values, out, rows, d1, d2)


@kernel_family
def _samples():
    """Every op once (float32, flat and vector), every dtype through add in every layout
    (tiled: its second operand staged) and through copy to float32 (in vector and rows for
    the 4-byte dtypes only: one itemsize), every scalar slot kind, the mixed-dtype
    conversions, and tiles of both operands, of a copy and of a ``where``'s condition."""
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    keys = []
    for name, spec in UFUNCS.items():
        if name in ("copy", "where"):
            continue
        dt = np.dtype(np.int32) if name.startswith("bitwise") else f32
        loops, out = resolve(name, (dt,) * spec.nin)
        for layout in ("flat", "vector") if out.itemsize == dt.itemsize else ("flat",):
            keys.append(KernelKey(name, (dt,) * spec.nin + (None,) * (3 - spec.nin),
                                  loops + (None,) * (3 - spec.nin), out, layout))
    ints = [np.dtype(t) for t in (np.int64, np.uint64, np.int32, np.uint32, np.int16,
                                  np.uint16, np.int8, np.uint8)]
    for dt in [np.dtype(np.float64), f32, f16, bfloat16, BOOL] + ints:
        keys.append(KernelKey("add", (dt, dt, None), (dt, dt, None), dt, "tiled",
                              (False, True, False)))
        for layout in ("vector", "flat", "rows", "strided"):
            keys.append(KernelKey("add", (dt, dt, None), (dt, dt, None), dt, layout))
            if layout not in ("vector", "rows") or dt.itemsize == f32.itemsize:
                keys.append(KernelKey("copy", (dt, None, None), (f32, None, None), f32,
                                      layout))
    for dt in [f32, f16, np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int64)]:
        for name in ("floor_divide", "remainder", "pow", "maximum", "less"):
            loops, out = resolve(name, (dt, dt))
            keys.append(KernelKey(name, (dt, dt, None), loops + (None,), out, "flat"))
    keys.append(KernelKey("add", (f32, f32, None), (f32, f32, None), f32, "tiled",
                          (True, True, False)))
    keys.append(KernelKey("copy", (f16, None, None), (f32, None, None), f32, "tiled",
                          (True, False, False)))
    keys.append(KernelKey("where", (BOOL, f32, None), (BOOL, f32, f32), f32, "tiled",
                          (True, False, False)))
    keys.append(KernelKey("where", (BOOL, f32, None), (BOOL, f32, f32), f32, "strided"))
    keys.append(KernelKey("clip", (f16, None, None), (f16, f16, f16), f16, "flat"))
    keys.append(KernelKey("add", (bfloat16, np.dtype(np.int8), None),
                          (bfloat16, bfloat16, None), bfloat16, "strided"))
    keys.append(KernelKey("copy", (f32, None, None), (f16, None, None), f16, "strided"))
    return [_elementwise_kernel(k) for k in dict.fromkeys(keys)]


# -- public API ------------------------------------------------------------------------------

def _unbroadcast(g, shape):
    """The gradient of a broadcast input: ``g`` summed over the axes it was stretched on."""
    from .reductions import sum as reduce_sum

    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and g.shape[lead + i] != 1)
    if axes:
        g = reduce_sum(g, axis=axes, keepdims=True)
        g = g.reshape(shape) if g.shape != shape else g
    return g.astype(np.float32) if g.dtype != np.float32 else g


def _grads(name, operands, y):
    """The backward rule of a recorded op: g -> one gradient (or None) per operand."""
    a, b = operands[0], operands[1] if len(operands) > 1 else None

    def shape_of(x):
        return x.shape if isinstance(x, DeviceArray) else ()

    def rule(g):
        if name == "add":
            gs = (g, g)
        elif name == "subtract":
            gs = (g, negative(g))
        elif name == "multiply":
            gs = (multiply(g, b), multiply(g, a))
        elif name == "divide":
            ga = divide(g, b)
            gs = (ga, negative(multiply(ga, divide(a, b))))
        elif name == "exp":
            gs = (multiply(g, y),)
        elif name == "where":
            c = operands[0]
            gs = (None, where(c, g, 0.0), where(c, 0.0, g))
        return tuple(None if gi is None or not isinstance(x, DeviceArray)
                     else _unbroadcast(gi, shape_of(x)) for gi, x in zip(gs, operands))

    return rule


_DIFFERENTIABLE = frozenset(("add", "subtract", "multiply", "divide", "exp", "where"))


def apply(name, *operands, out=None):
    """Op ``name`` (a key of UFUNCS) on arrays or scalars, NumPy-style; records a backward
    rule on the active tape for the differentiable ones."""
    if out is None:  # passing out=None on would lengthen the call's signature (0.3 µs)
        y = elementwise_fwd(name, *operands)
    else:
        y = elementwise_fwd(name, *operands, out=out)
    if name in _DIFFERENTIABLE and active_tape() is not None:  # no rule built per call
        record(_grads(name, operands, y), operands, (y,))
    return y


# The generated docstrings' first line and example, per op: (summary, set-up line, call,
# the call's ``.get()`` as NumPy prints it).
_DOCS = {
    "add": (
        "Add ``x1`` and ``x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.add(x, 2)",
        "array([3., 4., 6.])"),
    "subtract": (
        "Subtract ``x2`` from ``x1`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.subtract(x, 1.5)",
        "array([-0.5,  0.5,  2.5])"),
    "multiply": (
        "Multiply ``x1`` by ``x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.multiply(x, x)",
        "array([ 1.,  4., 16.])"),
    "divide": (
        "Divide ``x1`` by ``x2`` elementwise (true division).",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.divide(x, 4)",
        "array([0.25, 0.5 , 1.  ])"),
    "floor_divide": (
        "Divide ``x1`` by ``x2`` elementwise, rounding toward negative infinity.",
        "x = kaionb.asarray([7, -7])", "kaionb.floor_divide(x, 2)",
        "array([ 3, -4])"),
    "remainder": (
        "Return the remainder of ``x1 / x2`` elementwise, with the sign of ``x2``.",
        "x = kaionb.asarray([7, -7])", "kaionb.remainder(x, 3)",
        "array([1, 2])"),
    "pow": (
        "Raise ``x1`` to the power ``x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.pow(x, 2)",
        "array([ 1.,  4., 16.])"),
    "maximum": (
        "Return the larger of ``x1`` and ``x2`` elementwise (NaN if either is NaN).",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.maximum(x, 2.5)",
        "array([2.5, 2.5, 4. ])"),
    "minimum": (
        "Return the smaller of ``x1`` and ``x2`` elementwise (NaN if either is NaN).",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.minimum(x, 2.5)",
        "array([1. , 2. , 2.5])"),
    "equal": (
        "Test ``x1 == x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.equal(x, 2)",
        "array([False,  True, False])"),
    "not_equal": (
        "Test ``x1 != x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.not_equal(x, 2)",
        "array([ True, False,  True])"),
    "less": (
        "Test ``x1 < x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.less(x, 2)",
        "array([ True, False, False])"),
    "less_equal": (
        "Test ``x1 <= x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.less_equal(x, 2)",
        "array([ True,  True, False])"),
    "greater": (
        "Test ``x1 > x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.greater(x, 2)",
        "array([False, False,  True])"),
    "greater_equal": (
        "Test ``x1 >= x2`` elementwise.",
        "x = kaionb.asarray([1.0, 2.0, 4.0])", "kaionb.greater_equal(x, 2)",
        "array([False,  True,  True])"),
    "bitwise_and": (
        "Compute the bitwise AND of integer or bool ``x1`` and ``x2`` elementwise.",
        "x = kaionb.asarray([12, 10])", "kaionb.bitwise_and(x, 6)",
        "array([4, 2])"),
    "bitwise_or": (
        "Compute the bitwise OR of integer or bool ``x1`` and ``x2`` elementwise.",
        "x = kaionb.asarray([12, 10])", "kaionb.bitwise_or(x, 6)",
        "array([14, 14])"),
    "bitwise_xor": (
        "Compute the bitwise XOR of integer or bool ``x1`` and ``x2`` elementwise.",
        "x = kaionb.asarray([12, 10])", "kaionb.bitwise_xor(x, 6)",
        "array([10, 12])"),
    "logical_and": (
        "Compute the truth value of ``x1 AND x2`` elementwise (a bool result).",
        "x = kaionb.asarray([True, True, False])", "kaionb.logical_and(x, [True, False, False])",
        "array([ True, False, False])"),
    "logical_or": (
        "Compute the truth value of ``x1 OR x2`` elementwise (a bool result).",
        "x = kaionb.asarray([True, True, False])", "kaionb.logical_or(x, [True, False, False])",
        "array([ True,  True, False])"),
    "logical_xor": (
        "Compute the truth value of ``x1 XOR x2`` elementwise (a bool result).",
        "x = kaionb.asarray([True, True, False])", "kaionb.logical_xor(x, [True, False, False])",
        "array([False,  True, False])"),
    "negative": (
        "Negate ``x`` elementwise.",
        "x = kaionb.asarray([-1.5, 0.0, 2.5])", "kaionb.negative(x)",
        "array([ 1.5, -0. , -2.5])"),
    "positive": (
        "Return ``+x`` elementwise (a copy of ``x``).",
        "x = kaionb.asarray([-1.5, 0.0, 2.5])", "kaionb.positive(x)",
        "array([-1.5,  0. ,  2.5])"),
    "abs": (
        "Return the absolute value of ``x`` elementwise.",
        "x = kaionb.asarray([-1.5, 0.0, 2.5])", "kaionb.abs(x)",
        "array([1.5, 0. , 2.5])"),
    "square": (
        "Square ``x`` elementwise.",
        "x = kaionb.asarray([-1.5, 0.0, 2.5])", "kaionb.square(x)",
        "array([2.25, 0.  , 6.25])"),
    "sign": (
        "Return the sign of ``x`` elementwise: -1, 0 or 1 (NaN for NaN).",
        "x = kaionb.asarray([-1.5, 0.0, 2.5])", "kaionb.sign(x)",
        "array([-1.,  0.,  1.])"),
    "bitwise_invert": (
        "Invert the bits of integer or bool ``x`` elementwise (``~x``).",
        "x = kaionb.asarray([0, 5], dtype=np.uint8)", "kaionb.bitwise_invert(x)",
        "array([255, 250], dtype=uint8)"),
    "logical_not": (
        "Compute the truth value of ``NOT x`` elementwise (a bool result).",
        "x = kaionb.asarray([True, False])", "kaionb.logical_not(x)",
        "array([False,  True])"),
    "exp": (
        "Compute the exponential of ``x`` elementwise.",
        "x = kaionb.asarray([0.0, 1.0])", "kaionb.exp(x)",
        "array([1.        , 2.71828183])"),
    "log": (
        "Compute the natural logarithm of ``x`` elementwise.",
        "x = kaionb.asarray([1.0, np.e])", "kaionb.log(x)",
        "array([0., 1.])"),
    "sqrt": (
        "Compute the square root of ``x`` elementwise.",
        "x = kaionb.asarray([1.0, 4.0, 9.0])", "kaionb.sqrt(x)",
        "array([1., 2., 3.])"),
    "rsqrt": (
        "Compute the reciprocal square root ``1 / sqrt(x)`` elementwise.",
        "x = kaionb.asarray([1.0, 4.0, 16.0])", "kaionb.rsqrt(x)",
        "array([1.  , 0.5 , 0.25])"),
    "sin": (
        "Compute the sine of ``x`` (radians) elementwise.",
        "x = kaionb.asarray([0.0, np.pi / 2])", "kaionb.sin(x)",
        "array([0., 1.])"),
    "cos": (
        "Compute the cosine of ``x`` (radians) elementwise.",
        "x = kaionb.asarray([0.0, np.pi])", "kaionb.cos(x)",
        "array([ 1., -1.])"),
    "tanh": (
        "Compute the hyperbolic tangent of ``x`` elementwise.",
        "x = kaionb.asarray([0.0, 1.0])", "kaionb.tanh(x)",
        "array([0.        , 0.76159416])"),
    "sigmoid": (
        "Compute the logistic sigmoid ``1 / (1 + exp(-x))`` elementwise.",
        "x = kaionb.asarray([0.0, 2.0])", "kaionb.sigmoid(x)",
        "array([0.5       , 0.88079708])"),
    "floor": (
        "Round ``x`` down to an integer value elementwise.",
        "x = kaionb.asarray([-1.5, 0.0, 2.5])", "kaionb.floor(x)",
        "array([-2.,  0.,  2.])"),
    "ceil": (
        "Round ``x`` up to an integer value elementwise.",
        "x = kaionb.asarray([-1.5, 0.0, 2.5])", "kaionb.ceil(x)",
        "array([-1.,  0.,  3.])"),
    "isnan": (
        "Test ``x`` for NaN elementwise (a bool result).",
        "x = kaionb.asarray([1.0, np.nan, np.inf])", "kaionb.isnan(x)",
        "array([False,  True, False])"),
    "isinf": (
        "Test ``x`` for positive or negative infinity elementwise (a bool result).",
        "x = kaionb.asarray([1.0, np.nan, np.inf])", "kaionb.isinf(x)",
        "array([False, False,  True])"),
    "isfinite": (
        "Test ``x`` for finite values elementwise (a bool result).",
        "x = kaionb.asarray([1.0, np.nan, np.inf])", "kaionb.isfinite(x)",
        "array([ True, False, False])"),
}


_DOC_NOTES = {
    "rsqrt": " ``rsqrt`` is not a NumPy ufunc: it takes ``np.sqrt``'s type rules.",
    "sigmoid": " ``sigmoid`` is not a NumPy ufunc: it takes ``np.tanh``'s type rules "
               "(integers and bool give floats).",
    "pow": " An integer raised to a negative Python int is refused, as NumPy does.",
}


def _docstring(name: str) -> str:
    """The numpydoc docstring of the public elementwise op ``name`` (``_binary`` /
    ``_unary``): its ``_DOCS`` line and example, and the contract they share."""
    summary, setup, call, result = _DOCS[name]
    ufunc = UFUNCS[name].numpy.__name__
    if UFUNCS[name].nin == 2:
        kind = (f"NumPy's broadcasting and type promotion: the result dtype is ``np.{ufunc}``'s\n"
                "for the operands (Python numbers are weak scalars, NEP 50; one difference: "
                "a Python\nnumber keeps a bfloat16 array bfloat16).")
        params = ("x1, x2 : DeviceArray, array_like or scalar\n"
                  "    The operands; they broadcast together. GPU arrays of other libraries "
                  "are used\n    zero-copy, NumPy arrays and lists are copied to the device, "
                  "Python and NumPy\n    scalars go to the kernel as arguments.\n")
        shapes = "Operands (or ``out``) whose shapes do not broadcast, or arrays on two devices."
    else:
        kind = f"The result dtype is ``np.{ufunc}``'s for ``x``'s dtype."
        params = ("x : DeviceArray or array_like\n"
                  "    The input. GPU arrays of other libraries are used zero-copy, NumPy "
                  "arrays and\n    lists are copied to the device.\n")
        shapes = "An ``out`` whose shape ``x`` does not broadcast to."
    taped = (" Recorded on the active :class:`kaionb.grad.Tape` when an operand requires a "
             "gradient." if name in _DIFFERENTIABLE else "")
    pow_raise = "\n    An integer array raised to a negative Python int." if name == "pow" else ""
    overflow = ("\nOverflowError\n    A Python int outside the range of the integer dtype it is "
                "computed in." if UFUNCS[name].nin == 2 else "")
    notes = (_DOC_NOTES.get(name, "") + taped).strip()
    notes = f"\n\n{notes}" if notes else ""
    return f"""{summary}

{kind} float16 and bfloat16 compute in float32.
Any strides: broadcast, transposed, sliced, negative steps; an ``out`` that overlaps
an input other than element for element gets a copy of that input first, as NumPy does.{notes}

Parameters
----------
{params}out : DeviceArray, optional
    The array to write in place: the result's shape (or one it broadcasts to), any layout,
    a dtype the result casts to under ``same_kind`` casting.

Returns
-------
DeviceArray
    The result (``out`` itself when given), on the inputs' device.

Raises
------
TypeError
    Dtypes ``np.{ufunc}`` has no loop for (NumPy's message), an argument that is not an
    array or a number, or an ``out`` that is not a DeviceArray or cannot take the result
    dtype under ``same_kind`` casting.
ValueError
    {shapes}{pow_raise}{overflow}

Examples
--------
>>> {setup}
>>> {call}.get()
{result}
"""


def _binary(name):
    def op(x1, x2, /, *, out=None):
        return apply(name, x1, x2, out=out)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = _docstring(name)
    return op


def _unary(name):
    def op(x, /, *, out=None):
        return apply(name, x, out=out)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = _docstring(name)
    return op


add = _binary("add")
subtract = _binary("subtract")
multiply = _binary("multiply")
divide = _binary("divide")
floor_divide = _binary("floor_divide")
remainder = _binary("remainder")
pow = _binary("pow")  # noqa: A001  (the array API's name)
maximum = _binary("maximum")
minimum = _binary("minimum")
equal = _binary("equal")
not_equal = _binary("not_equal")
less = _binary("less")
less_equal = _binary("less_equal")
greater = _binary("greater")
greater_equal = _binary("greater_equal")
bitwise_and = _binary("bitwise_and")
bitwise_or = _binary("bitwise_or")
bitwise_xor = _binary("bitwise_xor")
logical_and = _binary("logical_and")
logical_or = _binary("logical_or")
logical_xor = _binary("logical_xor")
negative = _unary("negative")
positive = _unary("positive")
abs = _unary("abs")  # noqa: A001
square = _unary("square")
sign = _unary("sign")
bitwise_invert = _unary("bitwise_invert")
logical_not = _unary("logical_not")
exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
sin = _unary("sin")
cos = _unary("cos")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
floor = _unary("floor")
ceil = _unary("ceil")
isnan = _unary("isnan")
isinf = _unary("isinf")
isfinite = _unary("isfinite")


def where(condition, x1, x2, /, *, out=None):
    """Choose ``x1`` where ``condition`` is true, else ``x2``, elementwise.

    ``condition`` is cast to bool; the three broadcast together, and the result dtype is
    NumPy's ``result_type(x1, x2)`` (Python numbers are weak scalars). Recorded on the
    active :class:`kaionb.grad.Tape` when ``x1`` or ``x2`` requires a gradient.

    Parameters
    ----------
    condition : DeviceArray or array_like
        Where to take ``x1``.
    x1, x2 : DeviceArray, array_like or scalar
        The values where ``condition`` is true and where it is false.
    out : DeviceArray, optional
        The array to write in place: the result's shape (or one it broadcasts to), any
        layout, a dtype the result casts to under ``same_kind`` casting.

    Returns
    -------
    DeviceArray
        The result (``out`` itself when given), on the inputs' device.

    Raises
    ------
    TypeError
        An argument that is not an array or a number (``condition`` None included), or an
        ``out`` that is not a DeviceArray or cannot take the result dtype.
    ValueError
        Shapes that do not broadcast, or arrays on two devices.

    Examples
    --------
    >>> x = kaionb.asarray([-1.0, 2.0, -3.0])
    >>> kaionb.where(x > 0, x, 0.0).get()
    array([0., 2., 0.])
    """
    return apply("where", condition, x1, x2, out=out)


def clip(x, /, min=None, max=None, *, out=None):  # noqa: A002  (the array API's names)
    """Limit ``x`` to ``[min, max]`` elementwise: ``minimum(maximum(x, min), max)``.

    NumPy's ``np.clip`` type rules; a NaN in ``x`` stays NaN. ``min`` or ``max`` None
    leaves that side open (both None: a copy of ``x``).

    Parameters
    ----------
    x : DeviceArray or array_like
        The values.
    min, max : DeviceArray, array_like, scalar or None, optional
        The bounds, broadcast with ``x``; None leaves that side open.
    out : DeviceArray, optional
        The array to write in place: the result's shape (or one it broadcasts to), any
        layout, a dtype the result casts to under ``same_kind`` casting.

    Returns
    -------
    DeviceArray
        The clipped values (``out`` itself when given).

    Raises
    ------
    TypeError
        ``x`` or a bound that is not an array or a number (``x`` None included), dtypes
        ``np.clip`` refuses, or an ``out`` that is not a DeviceArray.
    ValueError
        Shapes that do not broadcast, or arrays on two devices.

    Examples
    --------
    >>> x = kaionb.asarray([-2.0, 0.5, 3.0])
    >>> kaionb.clip(x, 0.0, 1.0).get()
    array([0. , 0.5, 1. ])
    """
    if min is None and max is None:
        x = as_array("clip", "x", x)
        return elementwise_fwd("copy", x, out=out, dtype=x.dtype)
    return apply("clip", x, min, max, out=out)


def copy_convert(src, dst) -> None:
    """``dst[...] = src`` converted to dst's dtype (same shape; any strides): the kernel
    behind DeviceArray.copy / astype / fill, which reach it through ``register_kernel``."""
    src = as_array("copy", "src", src)
    if src.shape != dst.shape:
        fail(ValueError, "copy", "dst", f"shape {src.shape}", dst.shape)
    elementwise_fwd("copy", src, out=dst, dtype=dst.dtype)


register_kernel("copy_convert", copy_convert)
register_kernel("elementwise", apply)
