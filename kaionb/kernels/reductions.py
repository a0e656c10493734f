"""NumPy reductions on DeviceArray: sum, prod, mean, max, min, argmax, argmin, var, std,
any, all (Python array API 2023.12 names, NumPy's result dtypes and NaN rules).

    sum = Σ x        prod = Π x        mean = Σ x / N
    var = Σ (x − mean)² / (N − correction)   (two passes: the mean, then the squares)
    std = √var       max / min: NaN anywhere gives NaN
    argmax / argmin: the first NaN, else the first extreme (ties: the smallest index)
    any / all: max / min of (x != 0)

**Layout.** Every reduction runs on a 3-D strided view (O, R, I) of the input: R the
reduced axes merged into one, O and I the kept axes before and after it, each merged into
one (``plan_layout``). The kernel writes out[o, i] = reduce_r x[o, r, i]; which kept
group is "O" and which "I" is free (both views are transposed together), so the planner
puts the smallest stride where the kernel wants it. Order-free reductions walk a flipped
reduced axis forwards. Axes that cannot merge into one stride are copied first
(``x.transpose(...).copy()``, reduced axes last). ``out=`` must be C-contiguous.

**Kernels.** One factory, ``_make_reduce_kernel(op, in, acc, out, variant)``, two
layouts:

- ``row`` (R has the smallest stride): a row of R elements per warp (rows up to 8 KB, 8
  per block) or per 256-thread block. Unit-stride rows read 16 bytes per load
  (``ld.global.nc.v4``) between a scalar head (up to the first 16-byte boundary) and a
  scalar tail, 4 loads in flight per thread (2 for argmax/argmin of 1-byte types), each
  into its own accumulator, whole groups of them without bounds checks; other strides
  read one element per load, 4 in flight. Warp butterfly, then across warps
  through shared memory.
- ``col`` (a kept axis has the smallest stride): blockDim (TX, 256 / TX), TX = the I
  extent rounded up to a power of two, at most 32; thread x owns column i, the y threads
  split R and walk it 8 rows at a time into 8 accumulators, then merge through shuffles
  (lanes of one warp with the same x) and shared memory (across warps).
- ``colv`` (the ``col`` case when every run of I is whole 16-byte words from a 16-byte
  boundary, e.g. a C-contiguous axis 0): thread x owns the 16 / itemsize columns of one
  word, TX = the words of I rounded up to a power of two, at most 32; the y threads
  split R and keep 8 rows' words in flight, each column with its own accumulator; the
  block merges one column at a time. A warp reads 512 contiguous bytes of a row per load
  where ``col`` reads 128 (sum over axis 0 of [8192, 8192] float32: 70% → see
  docs/performance.md).

When the outputs alone give fewer than half a wave of blocks, R is cut into S chunks
(grid.y), each a block's (or, for short rows, a warp's) share, sized by the driver's
occupancy of the stage-1 kernel. Each chunk's accumulator (and, for argmax/argmin, the
winner's index) goes to partials in the accumulator type:

- ``row_fold`` (rows): ``ROW_SPLIT_WAVES`` waves of chunks of whole tiles (argmax and
  argmin, bound by their compares: one wave). A chunk writes its partial to an arrival
  workspace (``op.arrival_workspace``, cached per stream), fences, and counts itself in
  at its row's counter; the last chunk of the row to arrive merges the row's S partials
  — the same threads the same partials whichever chunk is last, so the result is the
  same bits every run — writes the output and resets the counter to 0. One launch.
- ``flat_fold``: ``row_fold`` for one contiguous row from a 16-byte boundary (``sum(x)``
  of a contiguous array; not argmax/argmin): no head, no per-row index arithmetic, chunks
  of whole groups of FLAT_LOADS loads (float types: 8 in flight per thread, at 4 blocks/SM
  for float32), the scalar tail in the last chunk.
- columns (``*_partial``, one wave): the partials laid out (S, O, I) in a fresh array, and
  a second launch (``*_merge``) reduces them with the same kernels, S taking R's place.

var/std run the mean (into a workspace in the accumulator type) and then the sum of
squared deviations, which reads the mean of its output element as an extra input.

Accumulators: float32 for float16/bfloat16/float32 (halves decode to float32, encode back
to nearest even at the end), float64 for float64 and for int/bool means and variances,
int64/uint64 for integer sums and products (NumPy's wrap-around: sums and products mod
2^64 agree with a narrower ``dtype=`` after truncation; ``dtype=bool`` sums and products
of 0/1 are NumPy's logical or / and), the input type for max/min. A float32 sum adds
each element into one of 4 (rows) or 8 (columns) accumulators per thread, then merges
them in a tree: an accumulator takes about R / (4 · 256 · S) terms in sequence — about
400 for 2^28 elements on an H100 — not R, so the error stays near NumPy's pairwise sum.

Deliberate differences from NumPy: a 0-d array accepts ``axis=None`` or ``()`` only (NumPy
also takes 0 and -1 for some reductions), and a repeated axis raises AxisError (a
ValueError, like NumPy's plain ValueError).
"""

from __future__ import annotations

import builtins
import functools
import inspect
import math
import numbers
import textwrap
import warnings
from typing import NamedTuple

import numpy as np
from numba import cuda, int32, int64, uint8, uint32, uint64
from numba.cuda import libdevice
from numpy.exceptions import AxisError

from .._device import check_driver, multiprocessor_count
from ..array import SUPPORTED_DTYPES, DeviceArray, bfloat16, empty, register_kernel
from ..ptx_patches import device_function, global_addr, ld_global_nc_v4_u32
from ..validation import as_array, fail
from .elementwise import _collapse
from .helpers.dtypes import (
    BOOL,
    HALF_DTYPES,
    compute_type,
    converter,
    decode,
    encode,
    f32_from_bits,
    storage,
    word_codec,
)
from .helpers.reduce import FULL_MASK, block_pair_reducer, warp_pair_reducer
from .launch import kernel, kernel_family
from .op import C_CONTIGUOUS, Plan, arrival_workspace, fast_path, output, record, run, workspace

THREADS = 256
WARPS = THREADS // 32
# Loads in flight per thread, each into its own accumulator: rows read 16 bytes a load (4
# loads: 64 bytes per thread in flight; argmax/argmin of 1-byte types 2, VECTOR_LOADS in
# _make_reduce_kernel), columns one element (8 loads: 32 bytes for
# float32, at 4 resident blocks of 256 threads ~4 MB over 132 SMs, above what HBM3 needs).
ROW_LOADS = 4
# Rows of 16-byte words in flight per thread of the colv kernel (sum over axis 0, H100,
# in one run: 8 → 110.7–114.2 µs, 4 → 114.5–122.1, 2 → 113.4–125.6 on [8192, 8192] f32,
# [16384, 8192] f16, [65536, 1024] f32; two or four words of columns per thread instead
# of one gained nothing).
COLV_LOADS = 8
COL_LOADS = 8
# Rows up to this many bytes get one warp each (8 rows per block), longer rows a block.
WARP_ROW_BYTES = 8192
# Rows shorter than this (bytes) do not fill a warp's 16-byte loads: one thread per row
# (the column kernel over the rows) reads them better.
MIN_ROW_BYTES = 128
# Blocks of 256 threads resident per SM at full occupancy (2048 threads): the wave that
# decides whether R is split.
BLOCKS_PER_SM = 8
# A split row reduction runs this many waves of chunks (2^28 float32, H100, chunks of whole
# 16 KB tiles folded in one launch, 1 / 2 / 4 / 6 waves: sum 360.9 / 359.9 / 355.0 / 355.5
# µs, max 362.9 / 361.5 / 355.2 / 356.9). argmax/argmin, bound by their index compares
# rather than by memory, run one wave (400 / 404 / 411 / 417 µs).
ROW_SPLIT_WAVES = 4
# One contiguous row split in chunks ("flat", full reductions of a contiguous array): 8
# 16-byte loads of float types in flight per thread (float32 sum: 64 registers, 4
# blocks/SM; 2^28 float32 on the H100, same process: sum 349.2–349.5 µs against row_fold's
# 349.1–355.0 and CuPy's 349.9–356.3; 4 loads × 6 blocks and 6 × 5 were no faster, 4 × 8
# spills; no min-blocks bound: at 64 registers it made the 8-byte types and any/all spill).
FLAT_LOADS = 8
FLOAT_DTYPES = (*HALF_DTYPES, np.dtype(np.float32), np.dtype(np.float64))
INDEX_NONE = int(np.iinfo(np.int64).max)  # an accumulator that has seen no element yet

_ARG_OPS = ("argmax", "argmin")
# op -> how elements combine (see _combine), and the error of an empty max/min/argmax.
_COMBINE = {"sum": "add", "prod": "mul", "mean": "add", "var": "add", "std": "add",
            "max": "max", "min": "min", "argmax": "max", "argmin": "min", "any": "max",
            "all": "min"}
_EMPTY_ERRORS = {
    "max": "zero-size array to reduction operation maximum which has no identity",
    "min": "zero-size array to reduction operation minimum which has no identity",
    "argmax": "attempt to get argmax of an empty sequence",
    "argmin": "attempt to get argmin of an empty sequence",
}
VARIANTS = ("row", "row_fold", "flat_fold", "col", "colv", "col_partial", "colv_partial",
            "col_merge", "colv_merge")


# -- dtypes ----------------------------------------------------------------------------------

@functools.cache
def result_dtype(op: str, dt: np.dtype, requested: np.dtype | None = None) -> np.dtype:
    """NumPy's result dtype for ``op`` on ``dt`` (``requested``: sum/prod's ``dtype=``),
    asked of NumPy itself on a one-element array."""
    kwargs = {} if requested is None else {"dtype": requested}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.dtype(getattr(np, op)(np.zeros(1, dt), **kwargs).dtype)


def acc_dtype(op: str, in_dt: np.dtype, out_dt: np.dtype) -> np.dtype:
    """The dtype a reduction accumulates (and keeps partials) in (module doc)."""
    if op in ("any", "all"):
        return np.dtype(np.uint8)  # 0 / 1, merged by max / min
    if op in ("max", "min", "argmax", "argmin"):
        if in_dt in HALF_DTYPES:
            return np.dtype(np.float32)
        return np.dtype(np.uint8) if in_dt == BOOL else in_dt
    if out_dt.kind == "f" or out_dt in HALF_DTYPES:
        return np.dtype(np.float64 if out_dt == np.float64 else np.float32)
    return np.dtype(np.uint64 if out_dt.kind == "u" else np.int64)  # sum/prod of ints, bool


def _loop_dtype(op: str, in_dt: np.dtype, acc_dt: np.dtype, out_dt: np.dtype) -> np.dtype:
    """The dtype NumPy casts each input element to before reducing."""
    if op in ("sum", "prod"):
        return out_dt
    if op in ("any", "all"):
        return BOOL
    return acc_dt if op in ("mean", "var", "std") else in_dt


# -- device functions, per op -------------------------------------------------------------------

def _identity(kind: str, acc_dt: np.dtype):
    """The value every accumulator starts from: combine(identity, x) == x."""
    if kind in ("add", "mul"):
        return 0 if kind == "add" else 1
    if acc_dt.kind == "f":
        return -math.inf if kind == "max" else math.inf
    info = np.iinfo(acc_dt)
    return int(info.min if kind == "max" else info.max)


def _combine(kind: str):
    """Device function (v, w) -> v ⊕ w; max and min propagate NaN from either side."""
    if kind == "add":
        @device_function
        def combine(v, w):
            return v + w
    elif kind == "mul":
        @device_function
        def combine(v, w):
            return v * w
    elif kind == "max":
        @device_function
        def combine(v, w):
            return w if (w > v or w != w) else v
    else:
        @device_function
        def combine(v, w):
            return w if (w < v or w != w) else v
    return combine


def _merge(op: str, combine, acc_type):
    """Device function (v, i, w, j) -> (v, i): two (value, index) accumulators into one.
    argmax/argmin: the first NaN wins, else the larger (smaller) value, ties to the smaller
    index — commutative, so any merge order gives NumPy's answer. Other ops keep v's index."""
    if op not in _ARG_OPS:
        @device_function
        def merge(v, i, w, j):
            return acc_type(combine(v, w)), i

        return merge
    larger = op == "argmax"

    @device_function
    def merge_arg(v, i, w, j):
        if w != w:
            take = v == v or j < i
        elif larger:
            take = v == v and (w > v or (w == v and j < i))
        else:
            take = v == v and (w < v or (w == v and j < i))
        return (w, j) if take else (v, i)

    return merge_arg


def _element(op: str, in_dt, acc_dt, loop_dt, merging: bool):
    """Device function (stored element, mean) -> accumulator value: the cast NumPy makes
    (to the loop dtype), or the op's own map (x != 0; (x − mean)²); a merge stage's
    partials are accumulator values already."""
    acc_type = compute_type(acc_dt)
    if merging:
        dec = decode(acc_dt)

        @device_function
        def element(s, m):
            return dec(s)
    elif op in ("any", "all"):
        truth = converter(in_dt, BOOL)

        @device_function
        def element(s, m):
            return uint8(1) if truth(s) else uint8(0)
    elif op in ("var", "std"):
        to_acc = converter(in_dt, acc_dt)

        @device_function
        def element(s, m):
            d = acc_type(to_acc(s)) - m
            return d * d
    else:
        to_loop = converter(in_dt, loop_dt)

        @device_function
        def element(s, m):
            return acc_type(to_loop(s))
    return element


def _finish(op: str, acc_dt, out_dt):
    """Device function (accumulator, divisor) -> the output's stored value."""
    acc_type, enc = compute_type(acc_dt), encode(out_dt)
    if op in ("mean", "var"):
        @device_function
        def finish(v, divisor):
            return enc(acc_type(v / divisor))
    elif op == "std":
        @device_function
        def finish(v, divisor):
            return enc(math.sqrt(acc_type(v / divisor)))
    else:
        @device_function
        def finish(v, divisor):
            return enc(v)
    return finish


def _from_bits(in_dt):
    """Device function: a stored element from its bits (uint32; uint64 for 8-byte types)."""
    if in_dt == np.float32:
        return f32_from_bits
    if in_dt == np.float64:
        @device_function
        def f64(bits):
            return libdevice.longlong_as_double(int64(bits))

        return f64
    cast = compute_type(np.dtype(storage(in_dt)))  # integer storage: truncate the bits

    @device_function
    def from_bits(bits):
        return cast(bits)

    return from_bits


def _fold_vector(in_dt, element, merge):
    """Device function (v, i, words, e0, m) -> (v, i): the 16 / itemsize elements of one
    16-byte load (four uint32 words, first element index e0) merged in order."""
    size = in_dt.itemsize
    from_bits = _from_bits(in_dt)
    if size == 8:
        @device_function
        def fold8(v, i, words, e0, m):
            w0, w1, w2, w3 = words
            lo = from_bits((uint64(w1) << uint64(32)) | uint64(w0))
            hi = from_bits((uint64(w3) << uint64(32)) | uint64(w2))
            v, i = merge(v, i, element(lo, m), e0)
            return merge(v, i, element(hi, m), e0 + 1)

        return fold8
    per_word = 4 // size
    bits = 8 * size

    @device_function
    def fold_word(v, i, w, e0, m):
        for k in range(per_word):
            v, i = merge(v, i, element(from_bits(uint32(w >> uint32(k * bits))), m), e0 + k)
        return v, i

    @device_function
    def fold(v, i, words, e0, m):
        w0, w1, w2, w3 = words
        v, i = fold_word(v, i, w0, e0, m)
        v, i = fold_word(v, i, w1, e0 + per_word, m)
        v, i = fold_word(v, i, w2, e0 + 2 * per_word, m)
        return fold_word(v, i, w3, e0 + 3 * per_word, m)

    return fold


# -- the kernels -------------------------------------------------------------------------------

def _make_reduce_kernel(op: str, in_dt, acc_dt, out_dt, variant: str):
    """The kernel of one reduction stage (module doc).

    Arguments (one order for every variant; an argument a variant does not read is an
    empty array): ``x`` [O, R, I] elements (a merge: partials), ``xi`` [O, R, I] int64 the
    partials' indices (argmax/argmin merge), ``mean`` [O, I] in the accumulator type
    (var/std), ``out`` [O, S, I] (final: S = 1, the output — argmax's int64 indices;
    partial: accumulators), ``out_i`` [O, S, I] int64 (argmax/argmin partial), ``chunk``
    (the R-span of one blockIdx.y), ``divisor`` (mean: N, var/std: N − correction). The
    row kernels take, in out_i's place, a fold's ``parts`` [O·I, S, 1] accumulators,
    ``parts_i`` [O·I, S, 1] int64 (argmax/argmin) and ``counters`` [O·I] uint32."""
    layout, _, stage = variant.partition("_")
    in_dt, acc_dt, out_dt = np.dtype(in_dt), np.dtype(acc_dt), np.dtype(out_dt)
    kind = _COMBINE[op]
    merging = stage == "merge"
    is_arg = op in _ARG_OPS
    CENTERED = op in ("var", "std") and not merging
    PARTIAL = stage == "partial"
    FOLD = stage == "fold"  # rows in chunks, the last block of a row merging its partials
    ARG_FINAL = is_arg and not PARTIAL
    ARG_INDICES = is_arg and merging  # indices come from xi, not the position along R
    ITEMSIZE = in_dt.itemsize
    VEC = 16 // ITEMSIZE
    acc_type = compute_type(acc_dt)
    IDENTITY = _identity(kind, acc_dt)
    combine = _combine(kind)
    merge = _merge(op, combine, acc_type)
    element = _element(op, in_dt, acc_dt, _loop_dtype(op, in_dt, acc_dt, out_dt), merging)
    finish = _finish(op, acc_dt, out_dt)
    fold = _fold_vector(in_dt, element, merge)
    warp_reduce = warp_pair_reducer(merge, acc_type, is_arg)
    block_reduce = block_pair_reducer(merge, acc_type, is_arg)
    stored_type = compute_type(np.dtype(storage(in_dt)))
    # A merge of argmax partials reads an index per element, which 16-byte loads of the
    # values alone cannot give: it takes the element-wise path.
    VECTORS = not ARG_INDICES
    # 16-byte loads a thread has in flight in a row: argmax/argmin of 1-byte types (16
    # index compares a load) take 2 (4 made ptxas spill in row_fold on sm_90a).
    VECTOR_LOADS = ROW_LOADS // 2 if is_arg and ITEMSIZE == 1 else ROW_LOADS

    def element_walker(LOADS, element=element, raw_type=stored_type, INDEXED=ARG_INDICES):
        """walk_elements over elements stored as ``raw_type``, mapped by ``element``;
        ``INDEXED``: each element's index comes from xi (partials), not its position r."""
        @device_function
        def walk_elements(x, xi, o, i, first, end, step, m, av, ai):
            """Merge x[o, r, i] for r = first, first + step, ... < end into the LOADS
            accumulators, the LOADS loads of a step issued before any is used."""
            raw = cuda.local.array(LOADS, raw_type)
            for r in range(first, end, LOADS * step):
                for u in range(LOADS):
                    if r + u * step < end:
                        raw[u] = x[o, r + u * step, i]
                for u in range(LOADS):
                    ru = r + u * step
                    if ru < end:
                        v, j = merge(av[u], ai[u], element(raw[u], m),
                                     xi[o, ru, i] if INDEXED else ru)
                        av[u] = v
                        ai[u] = j

        return walk_elements

    def vector_walker(LOADS):
        """walk_vectors with LOADS 16-byte loads in flight per thread, and its group."""
        @device_function
        def vector_group(raw, body, k, step, count, e0, m, av, ai):
            """The vectors k + u·step (u < count ≤ LOADS) into accumulator u, every load
            issued before any is used."""
            for u in range(LOADS):
                if u < count:
                    w = ld_global_nc_v4_u32(body + uint64(16 * (k + u * step)))
                    for q in range(4):
                        raw[u, q] = w[q]
            for u in range(LOADS):
                if u < count:
                    v, j = fold(av[u], ai[u], (raw[u, 0], raw[u, 1], raw[u, 2], raw[u, 3]),
                                e0 + (k + u * step) * VEC, m)
                    av[u] = v
                    ai[u] = j

        @device_function
        def walk_vectors(body, first, end, step, e0, m, av, ai):
            """Merge the 16-byte vectors k = first, first + step, ... < end at ``body`` (the
            elements e0 + k·VEC onwards) into the LOADS accumulators: whole groups with
            no bounds checks, then one group of the rest (against a check on every load,
            argmax over 2^28 float32 on the H100 400 → 370 µs). A counted loop: with a while
            on k, ptxas spilled in more kernels (docs/perf-log-primitives.md, tenth session)."""
            raw = cuda.local.array((LOADS, 4), uint32)
            mine = (end - first + step - 1) // step if first < end else 0
            k = first
            for _ in range(mine // LOADS):
                vector_group(raw, body, k, step, LOADS, e0, m, av, ai)
                k += LOADS * step
            vector_group(raw, body, k, step, mine % LOADS, e0, m, av, ai)

        return walk_vectors

    walk_vectors = vector_walker(VECTOR_LOADS)

    def accumulators(LOADS):
        @device_function
        def start(av, ai):
            for u in range(LOADS):
                av[u] = acc_type(IDENTITY)
                ai[u] = int64(INDEX_NONE)

        @device_function
        def merged(av, ai):
            v, idx = av[0], ai[0]
            for u in range(1, LOADS):
                v, idx = merge(v, idx, av[u], ai[u])
            return v, idx

        return start, merged

    @device_function
    def store(out, out_i, o, s, i, v, idx, divisor):
        if ARG_FINAL:
            out[o, s, i] = idx
        elif PARTIAL:
            out[o, s, i] = v
            if is_arg:
                out_i[o, s, i] = idx
        else:
            out[o, s, i] = finish(v, divisor)

    signature = (f"void({storage(in_dt)}[:, :, :], int64[:, :, :], {storage(acc_dt)}[:, :], "
                 f"{storage(out_dt)}[:, :, :], int64[:, :, :], int64, float64)")
    # Rows: the partials, their indices (argmax/argmin) and the arrival counters of a fold
    # instead of out_i (empty arrays when R is not split).
    row_signature = (f"void({storage(in_dt)}[:, :, :], int64[:, :, :], "
                     f"{storage(acc_dt)}[:, :], {storage(out_dt)}[:, :, :], "
                     f"{storage(acc_dt)}[:, :, :], int64[:, :, :], uint32[:], int64, float64)")
    name = f"_reduce_{op}_fwd_kernel_{variant}_{in_dt.name}_{acc_dt.name}_{out_dt.name}"

    if layout in ("row", "flat"):
        walk_elements = element_walker(ROW_LOADS)
        start, merged = accumulators(ROW_LOADS)

        @device_function
        def row_part(x, xi, mean, o, i, r0, n, t, T, av, ai):
            """This thread's (value, index) over its share of x[o, r0 : r0 + n, i], which
            T threads (t = 0 .. T − 1) read together."""
            m = mean[o, i] if CENTERED else acc_type(0)
            start(av, ai)
            p0 = global_addr(x, (o, r0, i))
            if VECTORS and x.strides[1] == ITEMSIZE and p0 % uint64(ITEMSIZE) == uint64(0):
                # A scalar head up to the 16-byte boundary, the vectors, a scalar tail.
                head = int64((uint64(16) - (p0 & uint64(15))) & uint64(15)) // ITEMSIZE
                if head > n:
                    head = n
                vectors = (n - head) // VEC
                tail = head + vectors * VEC
                if t < head:
                    v, j = merge(av[0], ai[0], element(x[o, r0 + t, i], m), r0 + t)
                    av[0] = v
                    ai[0] = j
                if t < n - tail:
                    r = r0 + tail + t
                    v, j = merge(av[1], ai[1], element(x[o, r, i], m), r)
                    av[1] = v
                    ai[1] = j
                walk_vectors(p0 + uint64(head * ITEMSIZE), t, vectors, T, r0 + head, m, av, ai)
            else:
                walk_elements(x, xi, o, i, r0 + t, r0 + n, T, m, av, ai)
            return merged(av, ai)

        @device_function
        def group_reduce(v, idx, T, sv, si):
            """Merge the T threads of a row: its warp, or (T > 32) the whole block."""
            if T > 32:  # one row per block (blockDim.y == 1): every thread gets here
                return block_reduce(v, idx, 1, sv, si)
            return warp_reduce(v, idx, 1)

        walk_partials = element_walker(ROW_LOADS, _element(op, acc_dt, acc_dt, acc_dt, True),
                                       compute_type(np.dtype(storage(acc_dt))), is_arg)

        @device_function
        def fold_arrival(parts, parts_i, counters, out, row, o, i, s, chunks, t, T, v, idx,
                         divisor, sv, si, av, ai):
            """Chunk s's (v, idx) of ``row`` into the partials; the last chunk of the row to
            arrive merges them all and stores the row's output."""
            last = int32(0)
            if t == 0:
                parts[row, s, 0] = v
                if is_arg:
                    parts_i[row, s, 0] = idx
                # Release: the partial is visible GPU-wide before its arrival is counted.
                cuda.threadfence()
                arrived = cuda.atomic.add(counters, row, uint32(1))
                last = int32(arrived == uint32(chunks - 1))
                if last != 0:
                    counters[row] = uint32(0)  # every chunk is in: ready for the next launch
            if T > 32:
                last = cuda.syncthreads_or(last)
            else:
                last = cuda.shfl_sync(FULL_MASK, last, 0)
                # A shuffle carries the value but orders no memory; bar.warp.sync does.
                cuda.syncwarp()
            if last == 0:
                return
            cuda.threadfence()  # acquire: the other chunks' partials, not stale copies
            # The same threads merge the same partials, whichever block is last: the same bits.
            start(av, ai)
            walk_partials(parts, parts_i, row, 0, t, chunks, T, acc_type(0), av, ai)
            v, idx = merged(av, ai)
            v, idx = group_reduce(v, idx, T, sv, si)
            if t == 0:
                store(out, parts_i, o, 0, i, v, idx, divisor)

        # Integer and bool elements (several to a word, each converted) take ROW_LOADS:
        # with FLAT_LOADS ptxas spilled 8-24 bytes in 22 of their kernels (sm_80, sm_90a).
        LOADS = FLAT_LOADS if in_dt in FLOAT_DTYPES else ROW_LOADS
        walk_flat = vector_walker(LOADS)
        start_flat, merged_flat = accumulators(LOADS)

        @kernel([row_signature], name=name, registered=False, launch_bounds=THREADS)
        def _reduce_flat_fwd_kernel(x, xi, mean, out, parts, parts_i, counters, chunk,
                                    divisor):
            """x [1, R, 1] contiguous from a 16-byte boundary, chunk s of R (whole groups of
            LOADS 16-byte loads) per blockIdx.y: no index arithmetic, no head (module doc,
            "flat")."""
            sv = cuda.shared.array(WARPS, acc_type)
            si = cuda.shared.array(WARPS, int64)
            av = cuda.local.array(LOADS, acc_type)
            ai = cuda.local.array(LOADS, int64)
            t = int32(cuda.threadIdx.x)
            s = int64(cuda.blockIdx.y)
            chunks = int64(cuda.gridDim.y)
            m = mean[0, 0] if CENTERED else acc_type(0)
            start_flat(av, ai)
            n = x.shape[1]
            vectors = n // VEC
            first = s * (chunk // VEC)
            end = first + chunk // VEC
            if end > vectors:
                end = vectors
            walk_flat(global_addr(x, (0, 0, 0)), first + t, end, THREADS, 0, m, av, ai)
            if s == chunks - 1 and t < n - vectors * VEC:  # the last chunk: the scalar tail
                r = vectors * VEC + t
                v, j = merge(av[0], ai[0], element(x[0, r, 0], m), r)
                av[0] = v
                ai[0] = j
            v, idx = merged_flat(av, ai)
            v, idx = block_reduce(v, idx, 1, sv, si)
            fold_arrival(parts, parts_i, counters, out, 0, 0, 0, s, chunks, t, THREADS, v, idx,
                         divisor, sv, si, av, ai)

        if layout == "flat":
            return _reduce_flat_fwd_kernel

        @kernel([row_signature], name=name, registered=False, launch_bounds=THREADS)
        def _reduce_rows_fwd_kernel(x, xi, mean, out, parts, parts_i, counters, chunk,
                                    divisor):
            sv = cuda.shared.array(WARPS, acc_type)
            si = cuda.shared.array(WARPS, int64)
            av = cuda.local.array(ROW_LOADS, acc_type)
            ai = cuda.local.array(ROW_LOADS, int64)
            t = int32(cuda.threadIdx.x)
            T = int32(cuda.blockDim.x)  # threads per row: 32, or the whole block
            row = int64(cuda.blockIdx.x) * cuda.blockDim.y + cuda.threadIdx.y
            if row >= x.shape[0] * x.shape[2]:  # whole warps (a warp per row), no barrier
                return
            o = row // x.shape[2]
            i = row - o * x.shape[2]
            if not FOLD:
                v, idx = row_part(x, xi, mean, o, i, 0, x.shape[1], t, T, av, ai)
                v, idx = group_reduce(v, idx, T, sv, si)
                if t == 0:
                    store(out, parts_i, o, 0, i, v, idx, divisor)
                return
            s = int64(cuda.blockIdx.y)
            chunks = int64(cuda.gridDim.y)
            r0 = s * chunk
            n = x.shape[1] - r0
            if n > chunk:
                n = chunk
            v, idx = row_part(x, xi, mean, o, i, r0, n, t, T, av, ai)
            v, idx = group_reduce(v, idx, T, sv, si)
            fold_arrival(parts, parts_i, counters, out, row, o, i, s, chunks, t, T, v, idx,
                         divisor, sv, si, av, ai)

        return _reduce_rows_fwd_kernel

    if layout == "colv":
        get = word_codec(in_dt)[0]

        @kernel([signature], name=name, registered=False, launch_bounds=THREADS)
        def _reduce_col_words_fwd_kernel(x, xi, mean, out, out_i, chunk, divisor):
            sv = cuda.shared.array(THREADS, acc_type)
            si = cuda.shared.array(THREADS, int64)
            av = cuda.local.array(VEC, acc_type)
            ai = cuda.local.array(VEC, int64)
            mv = cuda.local.array(VEC, acc_type)
            raw = cuda.local.array((COLV_LOADS, 4), uint32)
            tx = int32(cuda.threadIdx.x)
            ty = int32(cuda.threadIdx.y)
            TX = int32(cuda.blockDim.x)  # words of columns per block: a power of two <= 32
            TY = int32(cuda.blockDim.y)
            tiles = (x.shape[2] // VEC + TX - 1) // TX
            o = int64(cuda.blockIdx.x) // tiles
            i = ((int64(cuda.blockIdx.x) - o * tiles) * TX + tx) * VEC  # first of VEC columns
            s = int64(cuda.blockIdx.y)
            r0 = s * chunk + ty
            r1 = (s + 1) * chunk
            if r1 > x.shape[1]:
                r1 = x.shape[1]
            inside = i < x.shape[2]  # threads past the last column still take part in the merge
            for k in range(VEC):
                av[k] = acc_type(IDENTITY)
                ai[k] = int64(INDEX_NONE)
                mv[k] = mean[o, i + k] if CENTERED and inside else acc_type(0)
            if inside and r0 < r1:
                p = global_addr(x, (o, r0, i))
                row_step = uint64(TY) * uint64(x.strides[1])
                for r in range(r0, r1, COLV_LOADS * TY):
                    for u in range(COLV_LOADS):  # every load of the step before any is used
                        if r + u * TY < r1:
                            w = ld_global_nc_v4_u32(p + uint64(u) * row_step)
                            for q in range(4):
                                raw[u, q] = w[q]
                    for u in range(COLV_LOADS):
                        ru = r + u * TY
                        if ru < r1:
                            words = (raw[u, 0], raw[u, 1], raw[u, 2], raw[u, 3])
                            for k in range(VEC):
                                v, j = merge(av[k], ai[k], element(get(words, k), mv[k]), ru)
                                av[k] = v
                                ai[k] = j
                    p += uint64(COLV_LOADS) * row_step
            for k in range(VEC):
                v, idx = block_reduce(av[k], ai[k], TX, sv, si)
                if ty == 0 and inside:
                    store(out, out_i, o, s, i + k, v, idx, divisor)

        return _reduce_col_words_fwd_kernel

    walk_elements = element_walker(COL_LOADS)
    start, merged = accumulators(COL_LOADS)

    @kernel([signature], name=name, registered=False, launch_bounds=THREADS)
    def _reduce_cols_fwd_kernel(x, xi, mean, out, out_i, chunk, divisor):
        sv = cuda.shared.array(THREADS, acc_type)
        si = cuda.shared.array(THREADS, int64)
        av = cuda.local.array(COL_LOADS, acc_type)
        ai = cuda.local.array(COL_LOADS, int64)
        tx = int32(cuda.threadIdx.x)
        ty = int32(cuda.threadIdx.y)
        TX = int32(cuda.blockDim.x)  # columns per block: a power of two <= 32
        tiles = (x.shape[2] + TX - 1) // TX
        o = int64(cuda.blockIdx.x) // tiles
        i = (int64(cuda.blockIdx.x) - o * tiles) * TX + tx
        s = int64(cuda.blockIdx.y)
        r0 = s * chunk
        r1 = r0 + chunk
        if r1 > x.shape[1]:
            r1 = x.shape[1]
        start(av, ai)
        if i < x.shape[2]:  # threads past the last column still take part in the merge
            m = mean[o, i] if CENTERED else acc_type(0)
            walk_elements(x, xi, o, i, r0 + ty, r1, int32(cuda.blockDim.y), m, av, ai)
        v, idx = merged(av, ai)
        v, idx = block_reduce(v, idx, TX, sv, si)
        if ty == 0 and i < x.shape[2]:
            store(out, out_i, o, s, i, v, idx, divisor)

    return _reduce_cols_fwd_kernel


_KERNELS: dict = {}


def reduce_kernel(op: str, in_dt, acc_dt, out_dt, variant: str):
    """The kernel for one stage, made on first use and kept (a kernel family: launch.py)."""
    key = (op, np.dtype(in_dt), np.dtype(acc_dt), np.dtype(out_dt), variant)
    kdef = _KERNELS.get(key)
    if kdef is None:
        kdef = _KERNELS.setdefault(key, _make_reduce_kernel(*key))
    return kdef


def _stage_kernel(op: str, in_dt, variant: str, requested=None):
    """The kernel of ``variant`` for ``op`` on ``in_dt`` input, with the dtypes a call
    would give it (a merge reads accumulators, a partial writes them)."""
    in_dt = np.dtype(in_dt)
    out_dt = result_dtype(op, in_dt, requested)
    acc_dt = acc_dtype(op, in_dt, out_dt)
    if variant.endswith("_merge"):
        in_dt = acc_dt
    if variant.endswith("_partial"):
        out_dt = acc_dt
    return reduce_kernel(op, in_dt, acc_dt, out_dt, variant)


# (op, input dtype, variant): every op, every input dtype and every variant at least once,
# each accumulator kind and the 16-byte unpacking of each element size (row variants).
_SAMPLES = (
    ("sum", "float32", "row"), ("sum", "float32", "row_fold"), ("sum", "float32", "flat_fold"),
    ("var", "int8", "flat_fold"), ("max", "bfloat16", "flat_fold"), ("all", "bool", "flat_fold"),
    ("sum", "float32", "col_merge"), ("sum", "float16", "col"), ("sum", "bfloat16", "row"),
    ("sum", "int8", "row"), ("sum", "uint16", "row"), ("sum", "bool", "col_partial"),
    ("prod", "int32", "row"), ("prod", "float64", "col"),
    ("mean", "float64", "row_fold"), ("mean", "int16", "col_merge"),
    ("max", "float32", "row"), ("max", "uint64", "row"), ("max", "bool", "col"),
    ("min", "int64", "col"), ("min", "uint32", "row_fold"),
    ("argmax", "float32", "row"), ("argmax", "float16", "row_fold"),
    ("argmax", "float16", "col_merge"), ("argmax", "int16", "col"),
    ("argmin", "float64", "row"), ("argmin", "uint8", "row_fold"),
    ("argmin", "uint8", "col_merge"),
    ("var", "float32", "row"), ("var", "bfloat16", "col_partial"), ("var", "int8", "row_fold"),
    ("std", "float16", "row"), ("std", "uint64", "col"),
    ("any", "float16", "row_fold"), ("any", "uint16", "col"),
    ("all", "bool", "row"), ("all", "int32", "col_merge"),
    ("sum", "float32", "colv"), ("sum", "int8", "colv_partial"), ("mean", "float16", "colv"),
    ("max", "bfloat16", "colv_partial"), ("max", "float32", "colv_merge"),
    ("argmax", "float32", "colv_partial"), ("var", "float64", "colv"),
)


@kernel_family
def samples() -> list:
    """The reduction kernels the ptxas test compiles (launch.py: kernel families)."""
    return [_stage_kernel(op, bfloat16 if name == "bfloat16" else np.dtype(name), variant)
            for op, name, variant in _SAMPLES]


# -- host: arguments -------------------------------------------------------------------------

def normalize_axes(op: str, axis, ndim: int, *, single: bool = False) -> tuple:
    """``axis`` as a sorted tuple of axes in [0, ndim): None means all of them. ``single``
    (argmax/argmin): None or one int. AxisError (a ValueError and an IndexError, as NumPy)
    for an axis out of range or repeated; TypeError for something that is not an int."""
    if axis is None:
        return tuple(range(ndim))
    if single and isinstance(axis, tuple):
        fail(TypeError, op, "axis", "None or an int", f"a tuple {axis!r}")
    items = axis if isinstance(axis, tuple) else (axis,)
    axes = []
    for a in items:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (numbers.Integral, np.integer)):
            fail(TypeError, op, "axis", "None, an int or a tuple of ints", repr(axis))
        a = int(a)
        if not -ndim <= a < ndim:
            raise AxisError(f"{op}: axis {a} is out of bounds for array of dimension {ndim}")
        a %= ndim
        if a in axes:
            raise AxisError(f"{op}: axis {a} is repeated in axis={axis!r}")
        axes.append(a)
    return tuple(sorted(axes))


def _requested_dtype(op: str, dtype):
    """sum/prod's ``dtype=`` as a NumPy dtype kaionb stores, else a TypeError."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        fail(TypeError, op, "dtype", f"None or one of {names}", repr(dtype))
    return dt


def _check_correction(op: str, correction, ddof):
    """var/std: ``ddof`` is NumPy's name for ``correction``; not both."""
    if ddof is not None:
        if correction != 0:
            fail(ValueError, op, "ddof", "None when 'correction' is given", repr(ddof))
        correction = ddof
    if isinstance(correction, (bool, np.bool_)) or not isinstance(correction, numbers.Real):
        fail(TypeError, op, "correction", "a real number", repr(correction))
    return float(correction)


# -- host: the plan ----------------------------------------------------------------------------

class ReduceLayout(NamedTuple):
    """How a reduction walks its input (module doc). ``copy_axes``: when not None, the
    input must first be copied contiguous in this axis order (the plan then follows from
    the copy); else the [O, R, I] view of the input — ``shape``, byte ``strides``, and the
    byte ``offset`` of its first element (a flipped reduced axis is walked forwards) — the
    (O, I) strides of the C-contiguous output in elements, and the kernel layout."""

    copy_axes: tuple | None
    kind: str = "row"
    shape: tuple = ()
    strides: tuple = ()
    offset: int = 0
    out_strides: tuple = ()


def plan_layout(shape: tuple, strides: tuple, itemsize: int, axes: tuple, *,
                ordered: bool) -> ReduceLayout:
    """The [O, R, I] view of an input of ``shape`` / byte ``strides`` reduced over ``axes``
    (sorted). ``ordered``: R must walk the reduced axes in C order (argmax/argmin count
    indices that way); otherwise each is walked forwards in memory (a negative stride
    flipped) and they merge in the order their strides allow."""
    ndim = len(shape)
    reduced = [a for a in axes if shape[a] != 1]
    kept = [a for a in range(ndim) if a not in axes and shape[a] != 1]
    r_size = math.prod(shape[a] for a in axes)
    if r_size == 0:  # nothing to read: every output is the identity
        return ReduceLayout(None, "col", (1, 0, math.prod(shape[a] for a in kept)), (0, 0, 0),
                            0, (0, 1))
    r_walk, offset = {a: strides[a] for a in reduced}, 0
    if not ordered:
        for a in reduced:
            if strides[a] < 0:
                offset += (shape[a] - 1) * strides[a]
                r_walk[a] = -strides[a]
        reduced.sort(key=lambda a: -r_walk[a])
    r_dims, (r_strides,) = _collapse([shape[a] for a in reduced], [r_walk[a] for a in reduced])
    out_strides, step = {}, 1
    for a in reversed(kept):
        out_strides[a] = step
        step *= shape[a]
    groups = []  # (O group, I group) pairs, each (size, input stride, output stride)
    for cut in range(len(kept) + 1):
        parts = []
        for part in (kept[:cut], kept[cut:]):
            dims, (st,) = _collapse([shape[a] for a in part], [strides[a] for a in part])
            if len(dims) > 1:
                break
            parts.append((math.prod(dims), st[0] if dims else 0,
                          out_strides[part[-1]] if part else 0))
        if len(parts) == 2:
            groups += [(parts[0], parts[1]), (parts[1], parts[0])]
    if len(r_dims) > 1 or not groups:
        rest = [a for a in range(ndim) if a not in axes]
        return ReduceLayout(tuple(rest) + tuple(axes))
    r_stride = r_strides[0] if r_dims else 0

    def reach(size, stride):  # how far apart neighbours along a dimension lie
        return abs(stride) if size > 1 else math.inf

    smallest_kept = builtins.min((abs(strides[a]) for a in kept), default=math.inf)
    if reach(r_size, r_stride) <= smallest_kept and (
            r_size * itemsize >= MIN_ROW_BYTES or not kept):
        kind = "row"
        (o_size, o_stride, o_out), (i_size, i_stride, i_out) = builtins.min(
            groups, key=lambda g: g[1][0])  # fewest I: one index per row
    else:
        kind = "col"
        (o_size, o_stride, o_out), (i_size, i_stride, i_out) = builtins.min(
            groups, key=lambda g: (reach(g[1][0], g[1][1]), -g[1][0]))
    return ReduceLayout(None, kind, (o_size, r_size, i_size), (o_stride, r_stride, i_stride),
                        offset, (o_out, i_out))


class GridPlan(NamedTuple):
    """One stage's launch: ``block``, ``grid`` (grid.y = S chunks of R) and ``chunk``."""

    block: tuple
    grid: tuple
    chunk: int


def plan_grid(kind: str, shape: tuple, itemsize: int, sms: int,
              resident: int = BLOCKS_PER_SM, *, split=True,
              row_waves: int = ROW_SPLIT_WAVES) -> GridPlan:
    """Block shape, grid and R-chunk for a [O, R, I] reduction (module doc). R is split
    only when the outputs give fewer than half a wave of blocks (``sms`` SMs, ``resident``
    blocks each), each chunk still several loads per thread: columns into at most one wave
    — every block resident at once, so none is left to run alone at the end — rows into
    ``row_waves`` waves of chunks of whole tiles (a tile: one load of every thread)."""
    o_size, r_size, i_size = shape
    if kind in ("row", "flat"):
        rows = o_size * i_size
        warp_rows = r_size * itemsize <= WARP_ROW_BYTES and rows >= 4 * sms
        block = (32, THREADS // 32) if warp_rows else (THREADS, 1)
        blocks = -(-rows // block[1])
        align = block[0] * (16 // itemsize) * ROW_LOADS
        min_chunk = 2 * align
        if kind == "flat":  # chunks of whole groups of FLAT_LOADS: no bounds checks
            align = block[0] * (16 // itemsize) * FLAT_LOADS
        waves = row_waves
    elif kind == "colv":
        words = i_size * itemsize // 16
        tx = 32 if words >= 32 else 1 << (words - 1).bit_length()
        block = (tx, THREADS // tx)
        blocks = o_size * -(-words // tx)
        min_chunk, align, waves = block[1] * COLV_LOADS * 2, 16, 1
    else:
        tx = 32 if i_size >= 32 else 1 << (i_size - 1).bit_length()
        block = (tx, THREADS // tx)
        blocks = o_size * -(-i_size // tx)
        min_chunk, align, waves = block[1] * COL_LOADS * 2, 16, 1
    wave = sms * resident
    chunks = 1
    if split and 2 * blocks <= wave:
        chunks = builtins.max(1, builtins.min(waves * wave // blocks, r_size // min_chunk))
    chunk = r_size
    if chunks > 1:
        chunk = -(-r_size // chunks)
        chunk += -chunk % align  # chunks start 16-byte aligned (rows: a tile) when R does
        chunks = -(-r_size // chunk)
    return GridPlan(block, (blocks, chunks), chunk)


# -- host: launches ----------------------------------------------------------------------------

@functools.cache
def _nothing(dt: np.dtype, ndim: int, device: int) -> DeviceArray:
    """An empty array standing in for an argument a kernel variant does not read."""
    return DeviceArray((0,) * ndim, np.dtype(dt), (0,) * ndim, 0, None, device)


@functools.cache
def _resident_blocks(compiled, threads: int) -> int:
    """How many ``threads``-thread blocks of a loaded kernel fit on one SM (its registers
    decide: 48 → 5 blocks of 256), as the driver computes it."""
    from cuda.bindings import driver

    err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(compiled._function,
                                                                     threads, 0)
    check_driver(err, f"cuOccupancyMaxActiveBlocksPerMultiprocessor({compiled.kdef.name})")
    return blocks


def _column_words(x3: DeviceArray) -> bool:
    """Whether the column kernel can read x3 [O, R, I] in words4 ("colv"): I contiguous and
    whole words4 long, every (o, r) run of I starting 16-byte aligned."""
    o_size, r_size, _ = x3.shape
    so, sr, si = x3.strides
    return (x3.shape[2] % (16 // x3.itemsize) == 0 and si == x3.itemsize and x3.ptr % 16 == 0
            and (sr % 16 == 0 or r_size == 1) and (so % 16 == 0 or o_size == 1))


def _reduce_stages(op, x3, out3, kind, acc_dt, divisor, mean=None):
    """out3[o, 0, i] = the reduction of x3[o, :, i]: one launch; for R split in chunks,
    rows fold their partials in the same launch, columns write them for a second."""
    if kind == "col" and _column_words(x3):
        kind = "colv"
    device = x3.device_id
    sms = multiprocessor_count(device)
    no_index = _nothing(np.dtype(np.int64), 3, device)
    mean = _nothing(acc_dt, 2, device) if mean is None else mean
    row_waves = 1 if op in _ARG_OPS else ROW_SPLIT_WAVES
    o_size, r_size, i_size = x3.shape
    if (kind == "row" and o_size * i_size == 1 and op not in _ARG_OPS
            and x3.strides[1] == x3.itemsize and x3.ptr % 16 == 0):
        kind = "flat"
    plan = plan_grid(kind, x3.shape, x3.itemsize, sms, row_waves=row_waves)
    if plan.grid[1] > 1:  # worth a split at full occupancy: size it to the real one
        stage1 = (reduce_kernel(op, x3.dtype, acc_dt, out3.dtype, kind + "_fold")
                  if kind in ("row", "flat")
                  else reduce_kernel(op, x3.dtype, acc_dt, acc_dt, kind + "_partial"))
        stage1 = Plan.of(stage1, plan.grid, plan.block)
        plan = plan_grid(kind, x3.shape, x3.itemsize, sms,
                         _resident_blocks(stage1.kernel, THREADS), row_waves=row_waves)
    if plan.grid[1] == 1:
        kind = "row" if kind == "flat" else kind  # one chunk: the row kernel, no partials
        one = Plan.of(reduce_kernel(op, x3.dtype, acc_dt, out3.dtype, kind), plan.grid,
                      plan.block)
        if kind == "row":  # no partials, no counters
            one.launch(x3, no_index, mean, out3, _nothing(acc_dt, 3, device), no_index,
                       _nothing(np.dtype(np.uint32), 1, device), plan.chunk, divisor)
        else:
            one.launch(x3, no_index, mean, out3, no_index, plan.chunk, divisor)
        return
    chunks = plan.grid[1]
    if kind in ("row", "flat"):  # one launch: a row's last chunk to finish merges them
        rows, a = o_size * i_size, acc_dt.itemsize
        at = -(-rows * chunks * a // 256) * 256  # argmax/argmin: the indices from here
        partials, counters = workspace(arrival_workspace,
                                       at + (8 * rows * chunks if op in _ARG_OPS else 0), rows)
        parts = partials._view((rows, chunks, 1), (chunks * a, a, a), 0, acc_dt)
        parts_i = (partials._view((rows, chunks, 1), (8 * chunks, 8, 8), at, np.dtype(np.int64))
                   if op in _ARG_OPS else no_index)
        stage1._replace(grid=plan.grid).launch(x3, no_index, mean, out3, parts, parts_i,
                                               counters, plan.chunk, divisor)
        return
    # Stage 1 writes partials [S, O, I]; stage 2 reads them along I, its fast axis.
    parts = [empty((chunks, o_size, i_size), dt)
             for dt in ((acc_dt, np.int64) if op in _ARG_OPS else (acc_dt,))]
    views = [p._view((o_size, chunks, i_size),
                     (i_size * p.itemsize, o_size * i_size * p.itemsize, p.itemsize))
             for p in parts]
    part_i = views[1] if len(views) > 1 else no_index
    stage1._replace(grid=plan.grid).launch(x3, no_index, mean, views[0], part_i, plan.chunk,
                                           divisor)
    # argmax's partial indices are read one by one: the scalar kernel.
    kind = "colv" if op not in _ARG_OPS and _column_words(views[0]) else "col"
    merge = plan_grid(kind, views[0].shape, views[0].itemsize, sms, split=False)
    kdef = reduce_kernel(op, acc_dt, acc_dt, out3.dtype, kind + "_merge")
    Plan.of(kdef, merge.grid, merge.block).launch(views[0], part_i, _nothing(acc_dt, 2, device),
                                                  out3, no_index, merge.chunk, divisor)


def _reduce_launch(op, x, axes, correction, out):
    """Plan the [O, R, I] view (copying x when its axes cannot merge) and launch."""
    ordered = op in _ARG_OPS
    layout = plan_layout(x.shape, x.strides, x.itemsize, axes, ordered=ordered)
    if layout.copy_axes is not None:
        x = x.transpose(layout.copy_axes).copy()
        axes = tuple(range(x.ndim - len(axes), x.ndim))
        layout = plan_layout(x.shape, x.strides, x.itemsize, axes, ordered=ordered)
    o_size, r_size, i_size = layout.shape
    x3 = x._view(layout.shape, layout.strides, layout.offset)
    oo, oi = layout.out_strides
    out3 = out._view((o_size, 1, i_size), (oo * out.itemsize, 0, oi * out.itemsize))
    acc_dt = acc_dtype(op, x.dtype, out.dtype)
    n = float(r_size)
    if op in ("var", "std"):
        mean = empty((o_size, i_size), acc_dt)
        a = mean.itemsize
        _reduce_stages("mean", x3, mean._view((o_size, 1, i_size), (i_size * a, 0, a)),
                       layout.kind, acc_dt, n)
        _reduce_stages(op, x3, out3, layout.kind, acc_dt, builtins.max(n - correction, 0.0),
                       mean)
    else:
        _reduce_stages(op, x3, out3, layout.kind, acc_dt, n)


@fast_path
def reduce_fwd(op, x, axis=None, dtype=None, keepdims=False, correction=0.0, *, out=None):
    """Validate every argument and resolve ``out``; launch unless the output is empty.
    ``op``: one of the public reductions. Returns ``out``."""
    x = as_array(op, "x", x)
    axes = normalize_axes(op, axis, x.ndim, single=op in _ARG_OPS)
    out_dt = result_dtype(op, x.dtype, _requested_dtype(op, dtype))
    if op in _EMPTY_ERRORS and math.prod(x.shape[a] for a in axes) == 0:
        raise ValueError(f"{op}: {_EMPTY_ERRORS[op]}")
    shape = tuple(1 if a in axes else d for a, d in enumerate(x.shape) if keepdims or a not in axes)
    out = output(op, out, shape, out_dt, device=x.device_id, layout=C_CONTIGUOUS)
    return run(_reduce_launch, op, x, axes, correction, out=out)


# -- the public functions ----------------------------------------------------------------------

def _spread(g, x, axis, keepdims, scale):
    """The backward of a sum (``scale`` 1) or mean (1/N) over ``axis``: ``g`` put back
    along the reduced axes and stretched to x's shape, as a float32 array."""
    from ..array import broadcast_to
    from .elementwise import multiply

    axes = normalize_axes("sum", axis, x.ndim)
    if not keepdims:
        g = g.reshape(tuple(1 if a in axes else d for a, d in enumerate(x.shape)))
    g = broadcast_to(g, x.shape)
    return multiply(g, scale).astype(np.float32) if scale != 1 else g.astype(np.float32)


# The docstrings of these functions and of the DeviceArray methods that call them, from one
# template (_docstring), per op: the summary (the method's adds "as kaionb.<op>"), what the
# function's summary line adds, the function's extended summary, what Returns names, the
# function's examples (calls on ``x`` and their output, alternating) and the method's
# (a call on ``kaionb.asarray(_DATA)`` and its output).
_DATA = "[[1.0, 2.0], [3.0, 4.0]]"


class _Doc(NamedTuple):
    summary: str
    more: str
    notes: str
    result: str
    examples: tuple
    method: tuple
    data: str = _DATA  # x in the function's examples


_TAPED = (" Recorded on the active :class:`kaionb.grad.Tape` when ``x`` requires a "
          "gradient.")
_DOCS = {
    "sum": _Doc(
        "Sum of the elements over ``axis``", "",
        "The result dtype is NumPy's: integers and bool give int64 (unsigned: uint64), float "
        "types keep theirs (float16 and bfloat16 accumulate in float32); ``dtype=`` casts the "
        "input first." + _TAPED, "sums",
        ("kaionb.sum(x).item()", "10.0", "kaionb.sum(x, axis=0).get()", "array([4., 6.])"),
        ("sum(axis=1).get()", "array([3., 7.])")),
    "prod": _Doc(
        "Product of the elements over ``axis``", "",
        "Result dtypes as :func:`sum`'s; integer products wrap around, as NumPy's do. A "
        "product over no elements is 1.", "products",
        ("kaionb.prod(x, axis=1).get()", "array([ 2., 12.])"),
        ("prod(axis=0).get()", "array([3., 8.])")),
    "mean": _Doc(
        "Arithmetic mean of the elements over ``axis``", "",
        "Integers and bool give float64; float types keep theirs (float16 and bfloat16 "
        "accumulate in float32). The mean of no elements is NaN." + _TAPED, "means",
        ("kaionb.mean(x, axis=1).get()", "array([1.5, 3.5])"),
        ("mean().item()", "2.5")),
    "max": _Doc(
        "Largest element over ``axis``", "",
        "NaN if any reduced element is NaN (as NumPy's ``max``); the result has ``x``'s "
        "dtype.", "largest values",
        ("kaionb.max(x, axis=0).get()", "array([3., 4.])"),
        ("max(axis=1).get()", "array([2., 4.])")),
    "min": _Doc(
        "Smallest element over ``axis``", "",
        "NaN if any reduced element is NaN (as NumPy's ``min``); the result has ``x``'s "
        "dtype.", "smallest values",
        ("kaionb.min(x, axis=0).get()", "array([1., 2.])"),
        ("min(axis=0).get()", "array([1., 2.])")),
    "argmax": _Doc(
        "Index of the largest element along ``axis``", "",
        "An int64 index: of the first NaN if there is one, else of the first occurrence of "
        "the largest value. With ``axis=None`` it indexes the flattened array (C order).",
        "int64 indices",
        ("kaionb.argmax(x).item()", "3", "kaionb.argmax(x, axis=1).get()", "array([1, 1])"),
        ("argmax(axis=0).get()", "array([1, 1])")),
    "argmin": _Doc(
        "Index of the smallest element along ``axis``", "",
        "As :func:`argmax`: an int64 index of the first NaN if there is one, else of the "
        "first occurrence of the smallest value; ``axis=None`` indexes the flattened array.",
        "int64 indices",
        ("kaionb.argmin(x, axis=0).get()", "array([0, 0])"),
        ("argmin(axis=1).get()", "array([0, 0])")),
    "var": _Doc(
        "Variance of the elements over ``axis``", ": Σ(x − mean)² / (N − correction)",
        "Two passes (the mean, then the squared deviations). Integers and bool give float64; "
        "float types keep theirs. N − correction <= 0 gives inf or NaN.", "variances",
        ("kaionb.var(x, axis=0).get()", "array([1., 1.])",
         "kaionb.var(x, axis=0, correction=1).get()", "array([2., 2.])"),
        ("var(axis=1).get()", "array([0.25, 0.25])")),
    "std": _Doc(
        "Standard deviation of the elements over ``axis``", ": the square root of :func:`var`",
        "Dtypes and the divisor N − correction as :func:`var`'s.", "standard deviations",
        ("kaionb.std(x, axis=1).get()", "array([0.5, 0.5])"),
        ("std(axis=0).get()", "array([1., 1.])")),
    "any": _Doc(
        "Test whether any element along ``axis`` is nonzero", "",
        "NaN counts as nonzero; over no elements the result is False. The result is bool.",
        "bool results",
        ("kaionb.any(x, axis=1).get()", "array([False,  True])"),
        ("any(axis=0).get()", "array([ True,  True])"), "[[0, 0], [0, 3]]"),
    "all": _Doc(
        "Test whether every element along ``axis`` is nonzero", "",
        "NaN counts as nonzero; over no elements the result is True. The result is bool.",
        "bool results",
        ("kaionb.all(x, axis=1).get()", "array([ True, False])"),
        ("all().item()", "True"), "[[1, 2], [0, 3]]"),
}

# The parameters (type, description), by name; ``{x}``: what the method is called on.
_PARAMS = {
    "x": ("DeviceArray or array_like",
          "The input, any strides (GPU arrays of other libraries are used zero-copy, NumPy "
          "arrays are copied to the device)."),
    "axis": ("int, tuple of int or None, optional",
             "The axes to reduce (negative ones count from the end); None reduces them all."),
    "dtype": ("dtype, optional", "The result dtype; the input is cast to it first."),
    "correction": ("float, optional",
                   "Subtracted from N in the divisor (0: the population variance, 1: the "
                   "sample variance)."),
    "ddof": ("float, optional", "NumPy's name for ``correction``; give one of the two."),
    "keepdims": ("bool, optional",
                 "Keep the reduced axes with size 1, so that the result broadcasts against "
                 "{x}."),
    "out": ("DeviceArray, optional",
            "A C-contiguous array of the result's shape and dtype to write."),
}
_SEARCH_AXIS = ("int or None, optional",  # argmax / argmin: one axis
                "The axis to search (negative counts from the end); None searches the "
                "flattened array (C order).")


def _wrap(text: str) -> str:
    """A description under its numpydoc heading: indented 4, lines of at most 88."""
    return textwrap.fill(text, 88, initial_indent="    ", subsequent_indent="    ")


def _docstring(fn) -> str:
    """The numpydoc docstring of the reduction ``fn``: a function here, or the DeviceArray
    method of that name (no ``x``; its errors are the function's)."""
    name = fn.__name__
    doc = _DOCS[name]
    method = fn.__qualname__ != name
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    entries = {**_PARAMS, "axis": _SEARCH_AXIS} if name in _ARG_OPS else _PARAMS
    parameters = "\n".join(
        f"{p} : {entries[p][0]}\n"
        + _wrap(entries[p][1].format(x="the array" if method else "``x``"))
        for p in params)
    if method:
        summary = f"{doc.summary}, as :func:`kaionb.{name}`."
        raises = f"TypeError, ValueError\n    As :func:`kaionb.{name}`."
        call, result = doc.method
        examples = f">>> kaionb.asarray({_DATA}).{call}\n{result}"
    else:
        summary = f"{doc.summary}{doc.more}.\n\n" + textwrap.fill(doc.notes, 88)
        type_errors = "".join((
            "``x`` that is not an array (None included), an ``axis`` that is not an int or a "
            "tuple of ints", " (a tuple included)" if name in _ARG_OPS else "",
            ", a ``dtype`` kaionb does not store" if "dtype" in params else "",
            ", a ``correction`` that is not a real number" if "correction" in params else "",
            ", or an ``out`` that is not a DeviceArray or has another dtype."))
        empty = ("" if name not in _EMPTY_ERRORS else
                 ", or a search over no elements" if name in _ARG_OPS else
                 ", or a reduction over no elements (zero-size axes)")
        value_errors = "".join((
            "An ``out`` of another shape or not C-contiguous", empty,
            ", or both ``correction`` and ``ddof`` given" if "ddof" in params else "", "."))
        raises = (f"TypeError\n{_wrap(type_errors)}\nValueError\n{_wrap(value_errors)}\n"
                  "numpy.exceptions.AxisError\n    An axis out of range or repeated (a "
                  "ValueError and an IndexError, as NumPy's).")
        examples = "\n".join([f">>> x = kaionb.asarray({doc.data})"] + [
            f">>> {line}" if i % 2 == 0 else line for i, line in enumerate(doc.examples)])
    sections = {"Parameters": parameters,
                "Returns": f"DeviceArray\n    The {doc.result} (``out`` itself when given).",
                "Raises": raises, "Examples": examples}
    return summary + "".join(f"\n\n{title}\n{'-' * len(title)}\n{body}"
                             for title, body in sections.items()) + "\n"


def _documented(fn):
    """``fn`` with its docstring from the template (_docstring)."""
    fn.__doc__ = _docstring(fn)
    return fn


@_documented
def sum(x, axis=None, *, dtype=None, keepdims=False, out=None):  # noqa: A001
    y = reduce_fwd("sum", x, axis, dtype, keepdims, out=out)
    record(lambda g: (_spread(g, x, axis, keepdims, 1.0),), (x,), (y,))
    return y


@_documented
def prod(x, axis=None, *, dtype=None, keepdims=False, out=None):
    return reduce_fwd("prod", x, axis, dtype, keepdims, out=out)


@_documented
def mean(x, axis=None, *, keepdims=False, out=None):
    y = reduce_fwd("mean", x, axis, None, keepdims, out=out)
    count = x.size // builtins.max(y.size, 1) if isinstance(x, DeviceArray) else 1
    record(lambda g: (_spread(g, x, axis, keepdims, 1.0 / builtins.max(count, 1)),), (x,),
           (y,))
    return y


@_documented
def max(x, axis=None, *, keepdims=False, out=None):  # noqa: A001
    return reduce_fwd("max", x, axis, None, keepdims, out=out)


@_documented
def min(x, axis=None, *, keepdims=False, out=None):  # noqa: A001
    return reduce_fwd("min", x, axis, None, keepdims, out=out)


@_documented
def argmax(x, axis=None, *, keepdims=False, out=None):
    return reduce_fwd("argmax", x, axis, None, keepdims, out=out)


@_documented
def argmin(x, axis=None, *, keepdims=False, out=None):
    return reduce_fwd("argmin", x, axis, None, keepdims, out=out)


@_documented
def var(x, axis=None, *, correction=0, ddof=None, keepdims=False, out=None):
    correction = _check_correction("var", correction, ddof)
    return reduce_fwd("var", x, axis, None, keepdims, correction, out=out)


@_documented
def std(x, axis=None, *, correction=0, ddof=None, keepdims=False, out=None):
    correction = _check_correction("std", correction, ddof)
    return reduce_fwd("std", x, axis, None, keepdims, correction, out=out)


@_documented
def any(x, axis=None, *, keepdims=False, out=None):  # noqa: A001
    return reduce_fwd("any", x, axis, None, keepdims, out=out)


@_documented
def all(x, axis=None, *, keepdims=False, out=None):  # noqa: A001
    return reduce_fwd("all", x, axis, None, keepdims, out=out)


for _fn in (sum, prod, mean, max, min, argmax, argmin, var, std, any, all):
    register_kernel(_fn.__name__, _fn)
    _method = getattr(DeviceArray, _fn.__name__)
    _method.__doc__ = _docstring(_method)
