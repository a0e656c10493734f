"""Symmetric INT8 quantization and dequantization.

    scale = max|x| / 127 over the group (the whole tensor, a row, or a column)
    q     = clip(rint(x / scale), −127, 127)  (int8; a group of zeros gives scale 0, q 0)
    x̂     = q · scale

(as in LLM.int8(), Dettmers et al. 2022, https://arxiv.org/abs/2208.07339, absmax form).
``axis`` follows torch.quantize_per_channel: the axis whose every index gets its own
scale. None: one scale for the tensor; for x of shape [..., K], ``axis=-1`` (the last)
gives K per-column scales (per-channel activations / [in, out] weights); for 2-D x,
``axis=0`` gives per-row scales (per-token activations, [out, in] weights). Other axes
are refused.

Per-row scales over 16-byte aligned rows (n % 16 == 0) take one pass over HBM: the row
stays in registers between its absmax and the quantization — one block per row up to
32768 elements, one thread-block cluster of up to 8 CTAs per row beyond (sm_90; the CTAs
combine their maxima through distributed shared memory). Every other case takes two
passes over x: an absmax reduction (block maxima merged with an atomic max on the float
bits, which order like the floats for values ≥ 0) into a zeroed buffer, then the
element-wise pass, which also writes the scales — per column, a small kernel between the
two writes them and turns each column's absmax into 127 / absmax. Per tensor over a
contiguous x, both passes walk it as one long row, grid-stride on a capped grid; per
column, the element-wise pass does so too where x and q are contiguous, 16-byte aligned
and K % 16 == 0 (the rows end to end, a column found as e mod K), as does dequantize for
rows narrower than a block step. x is read twice, so per-tensor and per-column
quantization move 2·|x| + |q| bytes, not the |x| + |q| of the one-pass form (a scale
must be known before its first q). Rounding is half-to-even through the 2^23 + 2^22
trick (exact for |v| ≤ 2^22; v is clipped to ±127 first).
q = rint(x · (127 / max)) in float32 can differ by one step from the float64 reference at
exact ties.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32, int64, uint8, uint32, uint64

from .._device import compute_capability, multiprocessor_count
from ..array import zeros
from ..ptx_patches import (
    cluster_arrive,
    cluster_wait,
    device_function,
    global_addr,
    ld_global_nc_u32,
    ld_global_nc_v2_u32,
    ld_global_nc_v4_f32,
    ld_global_nc_v4_u32,
    st_global_v4_u32,
)
from ..validation import as_array, as_dtype, check_contiguous, check_same_device, fail
from .helpers.reduce import block_max, row_reducers
from .helpers.dtypes import f32_from_bits, f32_to_bits
from .helpers.int8 import QMAX, inverse_scale, quantize_words16
from .helpers.rowwise import (
    CLUSTER_SIZES,
    CODECS,
    FLOAT_DTYPES,
    INT8,
    MAP_THREADS,
    MAP_UNROLL,
    MAX_CLUSTER,
    MAX_GRID_Y,
    MAX_THREADS,
    REG_ELEMS,
    flat_view,
    cluster_row_plan,
    map_plan,
    row_plan,
    round_up,
    row_slice,
    rows_view,
)
from .launch import kernel
from .op import C_CONTIGUOUS, LAST_AXIS, Plan, fast_path, output, outputs, run

TENSOR, ROW, COL = 0, 1, 2
# Rows each block of the column absmax kernel folds before its atomic updates: enough for
# about COL_BLOCKS_PER_SM blocks per SM, at most COL_MAX_ROWS_PER_BLOCK. The atomics bound
# the kernel: H100 f16 [16384, 8192], 16 / 32 / 64 / 128 / 256 rows a block → 227 / 155 /
# 125 / 115 / 101 µs (40 → 89% of copy); 256 was the best at every shape measured.
COL_BLOCKS_PER_SM = 2
COL_MAX_ROWS_PER_BLOCK = 256
# Passes over one long row (a contiguous x per tensor, or per column with the rows end to
# end: the _flat kernels) walk it grid-stride on a capped grid instead of one block per 16 KB. H100
# (docs/perf-log-primitives.md, 2026-11-27 twelfth session), µs: per tensor [16384, 8192]
# absmax f16 96.4 -> 89.9, f32 182.9 -> 175.4 at 32 blocks per SM (fewer block maxima, each
# an atomic on one word); the quantize pass per tensor f16 163.6 -> 150.9 at 4 per SM (f32:
# 222.9 uncapped, 225-228 capped); per column f16 204.0 -> 178.2 at 4, f32 242.3 -> 231.5
# at 8 ([2048, 65536] 247.1 -> 237.7).
LONG_ROW_ABSMAX_BLOCKS_PER_SM = 32
LONG_ROW_QUANTIZE_BLOCKS_PER_SM = {(TENSOR, 2): 4, (COL, 2): 4, (COL, 4): 8}
# Dequantize per row / per column runs rows narrower than one block step (256 threads × 32
# elements) end to end: a row's block left most threads idle (H100, f16 [65536, 1024]: 35%
# of copy). Wider rows keep one block per row: finding each run's row by a division ran
# [16384, 8192] f16 per row at 89% of copy against 95% (tenth session).
DEQUANTIZE_FLAT_BELOW = 8192


def _make_absmax_kernel(codec, name):
    """amax[r if per_row else 0] = max |x[r, :]| (blocks over rows × chunks of a row),
    MAP_UNROLL words4 loads in flight per thread."""
    VEC = codec.vec
    S = codec.storage
    U = MAP_UNROLL
    RAW = 4 * U
    load, head_of, unpack = codec.load, codec.head, codec.unpack

    @kernel([f"void({S}[:, :], uint32[:], int64, int32)"], name=name)
    def _absmax_fwd_kernel(x, amax, n, per_row):
        scratch = cuda.shared.array(32, float32)
        raw = cuda.local.array(RAW, uint32)
        f = cuda.local.array(VEC, float32)
        T = int64(cuda.blockDim.x)
        first = int64(cuda.blockIdx.x) * T * U + int64(cuda.threadIdx.x)
        stride = int64(cuda.gridDim.x) * T * U
        for r in range(int64(cuda.blockIdx.y), int64(x.shape[0]), int64(cuda.gridDim.y)):
            head = int64(head_of(x, r))
            nv = (head + n + VEC - 1) // VEC
            m = float32(0.0)
            for v0 in range(first, nv, stride):
                for u in range(U):
                    v = v0 + u * T
                    words = load(x, r, v * VEC - head, n, 0) if v < nv else (
                        uint32(0), uint32(0), uint32(0), uint32(0))
                    for i in range(4):
                        raw[4 * u + i] = words[i]
                for u in range(U):
                    unpack((raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3]), f, 0)
                    for j in range(VEC):
                        m = max(m, abs(f[j]))
            m = block_max(m, scratch)
            if cuda.threadIdx.x == 0:
                cuda.atomic.max(amax, r if per_row else 0, f32_to_bits(m))

    return _absmax_fwd_kernel


def _make_absmax_cols_kernel(codec, name):
    """amax[e] = max_r |x[r, e]|: each thread folds rows of one words4, MAP_UNROLL rows'
    loads in flight. A block's threads form groups of ``row_threads`` (a power of two, so
    a narrow row does not leave most of them idle); group g folds rows r0 + g, r0 + g +
    groups, ... of the block's ``rows_per_block``, and the groups' maxima meet in shared
    memory before the first group's atomics (one atomic a column a block, as with one
    group)."""
    VEC = codec.vec
    S = codec.storage
    U = MAP_UNROLL
    RAW = 4 * U
    load, head_of, unpack = codec.load, codec.head, codec.unpack

    @kernel([f"void({S}[:, :], uint32[:], int32, int32, int32)"], name=name)
    def _absmax_cols_fwd_kernel(x, amax, n, rows_per_block, row_threads):
        part = cuda.shared.array((MAP_THREADS, VEC), float32)  # each thread's maxima
        raw = cuda.local.array(RAW, uint32)
        f = cuda.local.array(VEC, float32)
        m = cuda.local.array(VEC, float32)
        tid = int32(cuda.threadIdx.x)
        groups = int32(cuda.blockDim.x) // row_threads
        v = int32(cuda.blockIdx.x) * row_threads + tid % row_threads
        r0 = int32(cuda.blockIdx.y) * rows_per_block
        r_end = min(r0 + rows_per_block, int32(x.shape[0]))
        head = head_of(x, r0)
        e0 = v * VEC - head
        for j in range(VEC):
            m[j] = float32(0.0)
        # Threads past the row fold nothing (no early exit: the groups meet at a barrier).
        for rb in range(r0 + tid // row_threads, r_end if e0 < n else r0, U * groups):
            for u in range(U):  # rows past the end read as 0 and change no maximum
                r = rb + u * groups
                words = load(x, r, e0, n, 0) if r < r_end else (
                    uint32(0), uint32(0), uint32(0), uint32(0))
                for i in range(4):
                    raw[4 * u + i] = words[i]
            for u in range(U):
                unpack((raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3]), f, 0)
                for j in range(VEC):
                    m[j] = max(m[j], abs(f[j]))
        if groups > 1:
            for j in range(VEC):
                part[tid, j] = m[j]
            cuda.syncthreads()
            for g in range(1, groups if tid < row_threads else 1):
                for j in range(VEC):
                    m[j] = max(m[j], part[tid + g * row_threads, j])
        if tid < row_threads:
            for j in range(VEC):
                if 0 <= e0 + j < n:
                    cuda.atomic.max(amax, e0 + j, f32_to_bits(m[j]))

    return _absmax_cols_fwd_kernel


def _make_quantize_int8_kernel(codec, name, flat=False):
    """q = rint(x · 127 / amax[group]), 16 elements (one int8 words4) per step, U (2)
    steps per thread with their loads issued first; also writes scale = amax / 127 (each
    group's scale by the thread that owns its first element), except per column, where
    _column_inverses_fwd_kernel wrote the scales and left 127 / amax in ``amax``.

    ``flat``: x and q are rows of ``ncols`` laid end to end as one row (contiguous, 16-byte
    aligned, ncols % 16 == 0: no 16-element run crosses a row), an element's column e mod
    ncols — a kernel of its own, since the 64-bit remainder costs ~10 registers."""
    VEC = codec.vec
    S = codec.storage
    SUB = 16 // VEC  # input words4 per int8 words4
    U = 2  # steps per thread (MAP_UNROLL = 4 left the loops rolled: raw in local memory)
    RAW = 4 * SUB * U
    load, unpack = codec.load, codec.unpack
    q_head, q_store = INT8.head, INT8.store

    @kernel([f"void({S}[:, :], uint32[:], int8[:, :], float32[:], int64, int32, int64)"],
            name=name)
    def _quantize_int8_fwd_kernel(x, amax, q, scale, n, mode, ncols):
        raw = cuda.local.array(RAW, uint32)
        f = cuda.local.array(16, float32)
        T = int64(cuda.blockDim.x)
        first = int64(cuda.blockIdx.x) * T * U + int64(cuda.threadIdx.x)
        stride = int64(cuda.gridDim.x) * T * U
        for r in range(int64(cuda.blockIdx.y), int64(q.shape[0]), int64(cuda.gridDim.y)):
            head = int64(q_head(q, r))
            nv = (head + n + 15) // 16
            g = r if mode == ROW else int64(0)
            # Per-column mode scales the values column by column (_scale_columns).
            inv_g = float32(1.0) if mode == COL else inverse_scale(f32_from_bits(amax[g]))
            for v0 in range(first, nv, stride):
                for u in range(U):
                    v = v0 + u * T
                    for k in range(SUB):
                        words = load(x, r, v * 16 - head + k * VEC, n, 0) if v < nv else (
                            uint32(0), uint32(0), uint32(0), uint32(0))
                        for i in range(4):
                            raw[4 * (u * SUB + k) + i] = words[i]
                for u in range(U):
                    v = v0 + u * T
                    if v < nv:
                        e0 = v * 16 - head
                        for k in range(SUB):
                            b = 4 * (u * SUB + k)
                            unpack((raw[b], raw[b + 1], raw[b + 2], raw[b + 3]), f, k * VEC)
                        if mode == COL:
                            _scale_columns(f, amax, e0 % ncols if flat else e0, ncols)
                        q_store(q, r, e0, n, quantize_words16(f, inv_g))
                        # The thread holding element 0 of the group's first row writes its
                        # scale.
                        if mode != COL and e0 <= 0 and (mode == ROW or r == 0):
                            scale[g] = f32_from_bits(amax[g]) * float32(1.0 / QMAX)

    return _quantize_int8_fwd_kernel


@device_function
def _scale_columns(f, inv, e0, n):
    """Per-column mode: f[j] *= inv[e0 + j] for the 16 values of ``f`` (elements e0..),
    ``inv`` holding each column's 127 / amax as float32 bits (the amax buffer after
    _column_inverses_fwd_kernel), so that quantize_words16 with inv = 1 rounds them; four
    16-byte loads where the run is whole and aligned."""
    if e0 >= 0 and e0 + 16 <= n and global_addr(inv, e0) & 15 == 0:
        for i in range(4):
            w = ld_global_nc_v4_u32(global_addr(inv, e0 + 4 * i))
            for k in range(4):
                f[4 * i + k] *= f32_from_bits(w[k])
    else:
        for j in range(16):
            e = e0 + j
            f[j] *= f32_from_bits(inv[e]) if 0 <= e < n else float32(0.0)


@kernel(["void(uint32[:], float32[:])"])
def _column_inverses_fwd_kernel(amax, scale):
    """Per-column mode, between the absmax and the quantize passes: scale[e] = amax / 127,
    and amax[e] becomes 127 / amax (float32 bits): one division a column, not one an
    element."""
    e = cuda.grid(1)
    if e < amax.shape[0]:
        a = f32_from_bits(amax[e])
        scale[e] = a * float32(1.0 / QMAX)
        amax[e] = f32_to_bits(inverse_scale(a))


def _make_dequantize_int8_kernel(codec, name, flat=False):
    """out = q · scale[group]: a thread converts U runs of OV elements — one words4 of out
    (8 halves or 4 float32) from 8 or 4 bytes of q — with every load issued first. The
    runs of consecutive threads are adjacent, so each load and store instruction of a warp
    covers one contiguous span: with 16 elements a thread (one words4 of q), a warp's
    stores each filled half of every 32-byte sector they touched, and the kernel ran at
    75-79% of copy bandwidth (H100, docs/perf-log-primitives.md).

    ``flat``: q and out are rows of ``ncols`` laid end to end as one row (as the quantize
    kernel's), a run's row e0 // ncols and column e0 mod ncols."""
    OV = codec.vec
    U = 32 // OV  # runs per thread: 32 elements, as many q bytes in flight as before
    # Halves out: 4 blocks of MAP_THREADS per SM, 64 registers, which they fit only
    # reading a row's scale at each run (an L1 hit) rather than holding it: per row / per
    # column scales on [16384, 8192] f16, H100, 86 → 95% / 86 → 92% of copy (72 registers,
    # 3 blocks). float32 out runs at 95% on 64 registers as it is, and spills when bound.
    BLOCKS_PER_SM = 4 if OV == 8 else None
    HOLD_SCALE = BLOCKS_PER_SM is None  # a row's scale in a register for the row's runs
    RAW = 2 * U
    store, pack = codec.store, codec.pack
    column_scales = _column_scales(OV)

    @device_function
    def load_run(q, r, e0, n):
        """Bytes e0 .. e0 + OV of row r of q as two words (the second unused when OV is
        4), zero outside [0, n); one 8- or 4-byte load where the run is whole and aligned."""
        if e0 >= 0 and e0 + OV <= n:
            a = global_addr(q, (int64(r), int64(e0)))
            if a % uint64(OV) == uint64(0):
                if OV == 8:
                    return ld_global_nc_v2_u32(a)
                return ld_global_nc_u32(a), uint32(0)
        w0 = uint32(0)
        w1 = uint32(0)
        for j in range(OV):
            e = e0 + j
            if 0 <= e < n:
                b = uint32(uint8(q[r, e]))
                if j < 4:
                    w0 |= b << uint32(8 * j)
                else:
                    w1 |= b << uint32(8 * (j - 4))
        return w0, w1

    @kernel([f"void(int8[:, :], float32[:], {codec.storage}[:, :], int64, int32, int64)"],
            name=name, launch_bounds=(MAP_THREADS, BLOCKS_PER_SM) if BLOCKS_PER_SM else None)
    def _dequantize_int8_fwd_kernel(q, scale, out, n, mode, ncols):
        raw = cuda.local.array(RAW, uint32)
        f = cuda.local.array(OV, float32)
        T = int64(cuda.blockDim.x)
        first = int64(cuda.blockIdx.x) * T * U + int64(cuda.threadIdx.x)
        stride = int64(cuda.gridDim.x) * T * U
        for r in range(int64(cuda.blockIdx.y), int64(q.shape[0]), int64(cuda.gridDim.y)):
            head = int64(global_addr(q, (r, int64(0))) % uint64(OV))  # elements before an
            runs = (head + n + OV - 1) // OV  # OV-byte boundary of q
            row_scale = scale[r if mode == ROW else 0] if HOLD_SCALE else float32(0)
            for u0 in range(first, runs, stride):
                for k in range(U):
                    u = u0 + k * T
                    w0, w1 = load_run(q, r, u * OV - head, n) if u < runs else (
                        uint32(0), uint32(0))
                    raw[2 * k] = w0
                    raw[2 * k + 1] = w1
                for k in range(U):
                    u = u0 + k * T
                    if u < runs:
                        e0 = u * OV - head
                        if mode == COL:
                            column_scales(scale, e0 % ncols if flat else e0, ncols, f)
                        else:
                            if flat and mode == ROW:
                                s = scale[e0 // ncols]
                            else:
                                s = row_scale if HOLD_SCALE else scale[r if mode == ROW else 0]
                            for j in range(OV):
                                f[j] = s
                        for j in range(OV):
                            b = int32(raw[2 * k + j // 4] << uint32(24 - 8 * (j % 4))) >> 24
                            f[j] *= float32(b)
                        store(out, r, e0, n, pack(f, 0))

    return _dequantize_int8_fwd_kernel


def _column_scales(count):
    """Device function ``(scale, e0, n, f)``: f[0:count] = scale[e0:e0+count] (clamped into
    [0, n) at the edges), by 16-byte loads where the run is whole and aligned."""

    @device_function
    def column_scales(scale, e0, n, f):
        if e0 >= 0 and e0 + count <= n and global_addr(scale, e0) & 15 == 0:
            for i in range(count // 4):
                a, b, c, d = ld_global_nc_v4_f32(global_addr(scale, e0 + 4 * i))
                f[4 * i], f[4 * i + 1], f[4 * i + 2], f[4 * i + 3] = a, b, c, d
        else:
            for j in range(count):
                f[j] = scale[min(max(e0 + j, 0), n - 1)]

    return column_scales


def _make_quantize_rows_kernel(codec, name, cluster=1):
    """Per-row scales in one pass over HBM: the row held in registers (Q_VECS int8 words4 —
    16 elements each — per thread) between its absmax and the quantization. One block per
    row, or (``cluster`` > 1, sm_90) one thread-block cluster per row, each CTA holding a
    contiguous chunk and the absmax combined through distributed shared memory. Needs
    16-byte aligned rows of x and q and n % 16 == 0; other layouts take the two-launch
    path."""
    VEC = codec.vec
    S = codec.storage
    SUB = 16 // VEC
    Q_VECS = REG_ELEMS // 16
    RAW = 4 * SUB * Q_VECS
    unpack = codec.unpack
    CLUSTER = cluster
    cta_row_slice = row_slice(CLUSTER)
    row_max = row_reducers(CLUSTER)[1]

    @kernel([f"void({S}[:, :], int8[:, :], float32[:], int32)"], name=name,
            launch_bounds=MAX_THREADS, min_cc=(9, 0) if CLUSTER > 1 else (8, 0))
    def _quantize_int8_rows_fwd_kernel(x, q, scale, n):
        scratch = cuda.shared.array(32, float32)
        slots = cuda.shared.array(1, float32)
        raw = cuda.local.array(RAW, uint32)
        f = cuda.local.array(16, float32)
        t = int32(cuda.threadIdx.x)
        T = int32(cuda.blockDim.x)
        # This CTA's q-vectors: [c0, c1) of row r (all of it without a cluster).
        r32, c0, c1 = cta_row_slice(n // 16)
        r = int64(r32)
        for k in range(Q_VECS):
            v = c0 + t + k * T
            for s in range(SUB):
                words = (uint32(0), uint32(0), uint32(0), uint32(0))
                if v < c1:
                    words = ld_global_nc_v4_u32(global_addr(x, (r, int64(v * 16 + s * VEC))))
                for i in range(4):
                    raw[4 * (k * SUB + s) + i] = words[i]
        m = float32(0.0)
        for k in range(Q_VECS):
            for s in range(SUB):
                b = 4 * (k * SUB + s)
                unpack((raw[b], raw[b + 1], raw[b + 2], raw[b + 3]), f, s * VEC)
            for j in range(16):
                m = max(m, abs(f[j]))
        m = row_max(m, scratch, slots, 0)
        inv = inverse_scale(m)
        if t == 0 and c0 == 0:
            scale[r] = m * float32(1.0 / QMAX)
        for k in range(Q_VECS):
            v = c0 + t + k * T
            if v < c1:
                for s in range(SUB):
                    b = 4 * (k * SUB + s)
                    unpack((raw[b], raw[b + 1], raw[b + 2], raw[b + 3]), f, s * VEC)
                st_global_v4_u32(global_addr(q, (r, int64(v * 16))), quantize_words16(f, inv))
        if CLUSTER > 1:  # no CTA leaves while another may read its slot
            cluster_arrive()
            cluster_wait()

    return _quantize_int8_rows_fwd_kernel


_FACTORIES = {
    "absmax": _make_absmax_kernel,
    "absmax_cols": _make_absmax_cols_kernel,
    "quantize_int8": _make_quantize_int8_kernel,
    "quantize_int8_flat": functools.partial(_make_quantize_int8_kernel, flat=True),
    "dequantize_int8": _make_dequantize_int8_kernel,
    "dequantize_int8_flat": functools.partial(_make_dequantize_int8_kernel, flat=True),
    "quantize_int8_rows": _make_quantize_rows_kernel,
}
_KERNELS = {(name, dt): make(c, f"_{name}_fwd_kernel_{dt.name}")
            for name, make in _FACTORIES.items() for dt, c in CODECS.items()}
# Per-row quantization of rows too wide for one block: one cluster of CTAs per row.
_CLUSTER_KERNELS = {
    (size, dt): _make_quantize_rows_kernel(c, f"_quantize_int8_rows_fwd_kernel_c{size}_{dt.name}",
                                           size)
    for size in CLUSTER_SIZES for dt, c in CODECS.items()}


def _mode(op, x_shape, axis):
    """(mode, scale shape) for ``axis`` (module doc), or a ValueError."""
    ndim = len(x_shape)
    if axis is None:
        return TENSOR, ()
    if isinstance(axis, (int, np.integer)) and ndim >= 1:
        a = int(axis) + ndim if axis < 0 else int(axis)
        if a == ndim - 1:
            return COL, (x_shape[-1],)
        if a == 0 and ndim == 2:
            return ROW, (x_shape[0],)
    fail(ValueError, op, "axis", "None, -1 (per last-axis channel) or 0 for a 2-D array "
         "(per row)", f"{axis!r} for shape {tuple(x_shape)}")


def _views(op, mode, **arrays):
    """[rows, n] views: rows of the last axis for ROW/COL, one long row for TENSOR when
    everything is contiguous."""
    if mode == TENSOR and all(a.is_c_contiguous for a in arrays.values()):
        return [flat_view(a) for a in arrays.values()]
    return [rows_view(op, name, a if a.ndim else a.reshape(1)) for name, a in arrays.items()]


@fast_path
def quantize_int8_fwd(x, axis=None, *, out=None):
    """Validate and resolve ``out`` = (q, scale); launch unless x is empty. Returns
    (q, scale)."""
    op = "quantize_int8"
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    mode, scale_shape = _mode(op, x.shape, axis)
    check_contiguous(op, "x", x, last_axis_only=True)
    q_and_scale = outputs(op, out, [(x.shape, np.int8, LAST_AXIS),
                                    (scale_shape, np.float32, C_CONTIGUOUS)],
                          device=x.device_id)
    return run(_quantize_int8_launch, op, mode, x, out=q_and_scale)


def _quantize_int8_launch(op, mode, x, q, scale):
    """The absmax reduction into a zeroed buffer, then the element-wise pass."""
    codec = CODECS[x.dtype]
    xv, qv = _views(op, mode, x=x, out=q)
    rows, n = xv.shape
    if mode == ROW:
        threads, cache_vecs, _ = row_plan(INT8, qv, xv)
        if cache_vecs < 0:  # the whole row fits in one block's registers: one pass
            Plan.of(_KERNELS["quantize_int8_rows", x.dtype], (rows,), (threads,)).launch(
                xv, qv, scale, n)
            return
        if row_plan(INT8, qv, xv, per_thread=INT8.reg_vecs * MAX_CLUSTER)[1] < 0 and (
                compute_capability() >= (9, 0)):
            # ... in the registers of a cluster's CTAs: one pass
            size, threads = cluster_row_plan(n // INT8.vec, INT8.reg_vecs)
            Plan.of(_CLUSTER_KERNELS[size, x.dtype], (rows * size,), (threads,),
                    cluster=(size, 1, 1)).launch(xv, qv, scale, n)
            return
    amax = zeros(scale.size, np.uint32)
    if mode == COL:
        # Threads per row: the row's words4 (+2 for a misaligned head and tail), rounded up
        # to a power of two, at most a block; the other threads of a block fold other rows.
        vectors = n // codec.vec + 2
        row_threads = min(MAP_THREADS, 1 << (vectors - 1).bit_length())
        groups = MAP_THREADS // row_threads
        blocks_x = -(-vectors // row_threads)
        per_block = -(-rows * blocks_x // (COL_BLOCKS_PER_SM * multiprocessor_count()))
        per_block = min(COL_MAX_ROWS_PER_BLOCK * groups,
                        round_up(max(per_block, 1), MAP_UNROLL * groups))
        # ... and no more than MAX_GRID_Y row blocks (a block folds any number of rows).
        per_block = max(per_block, round_up(-(-rows // MAX_GRID_Y), MAP_UNROLL * groups))
        Plan.of(_KERNELS["absmax_cols", x.dtype], (blocks_x, -(-rows // per_block)),
                (MAP_THREADS,)).launch(xv, amax, n, per_block, row_threads)
        Plan.of(_column_inverses_fwd_kernel, (-(-n // MAP_THREADS),), (MAP_THREADS,)).launch(
            amax, scale)
    else:
        grid, _ = map_plan(codec, xv)
        if rows == 1:
            grid = (min(grid[0], LONG_ROW_ABSMAX_BLOCKS_PER_SM * multiprocessor_count()), 1)
        Plan.of(_KERNELS["absmax", x.dtype], grid, (MAP_THREADS,)).launch(
            xv, amax, n, int(mode == ROW))
    ncols, name = n, "quantize_int8"
    if mode == COL and rows > 1 and _end_to_end(n, x, q):
        # Rows end to end: short rows no longer leave most of a block idle.
        xv, qv, name = flat_view(x), flat_view(q), "quantize_int8_flat"
        rows, n = xv.shape
    grid, _ = map_plan(INT8, qv)
    cap = LONG_ROW_QUANTIZE_BLOCKS_PER_SM.get((mode, x.itemsize))  # by (mode, input itemsize)
    if rows == 1 and cap:
        grid = (min(grid[0], cap * multiprocessor_count()), 1)
    Plan.of(_KERNELS[name, x.dtype], grid, (MAP_THREADS,)).launch(
        xv, amax, qv, scale.reshape(-1), n, mode, ncols)


@fast_path
def dequantize_int8_fwd(q, scale, axis=None, dtype=np.float32, *, out=None):
    """Validate and resolve ``out``; launch unless q is empty. Returns ``out``."""
    op = "dequantize_int8"
    q = as_array(op, "q", q, dtypes=(np.int8,))
    scale = as_array(op, "scale", scale, dtypes=(np.float32,))
    check_same_device(op, q=q, scale=scale)
    mode, scale_shape = _mode(op, q.shape, axis)
    # One scale per group; a per-tensor scale may come in any shape of one element.
    if scale.size != math.prod(scale_shape) or (scale_shape and scale.shape != scale_shape):
        fail(ValueError, op, "scale", f"shape {scale_shape} for axis={axis!r} and q of "
             f"shape {q.shape}", scale.shape)
    check_contiguous(op, "q", q, last_axis_only=True)
    check_contiguous(op, "scale", scale)
    out_dt = as_dtype(op, "dtype", dtype, FLOAT_DTYPES, "float32, float16 or bfloat16")
    out = output(op, out, q.shape, out_dt, device=q.device_id)
    return run(_dequantize_int8_launch, op, mode, q, scale, out=out)


def _dequantize_int8_launch(op, mode, q, scale, out):
    qv, ov = _views(op, mode, q=q, out=out)
    rows, n = qv.shape
    ncols, name = n, "dequantize_int8"
    if mode != TENSOR and rows > 1 and n < DEQUANTIZE_FLAT_BELOW and _end_to_end(n, q, out):
        qv, ov, name = flat_view(q), flat_view(out), "dequantize_int8_flat"
    grid, _ = map_plan(INT8, qv)
    Plan.of(_KERNELS[name, out.dtype], grid, (MAP_THREADS,)).launch(
        qv, scale.reshape(-1), ov, qv.shape[1], mode, ncols)


def _end_to_end(n, *arrays):
    """Whether rows of ``n`` elements can be walked end to end as one row: every array
    C-contiguous and 16-byte aligned, and n % 16 == 0 (no 16-element run crosses a row)."""
    return n % 16 == 0 and all(a.is_c_contiguous and a.ptr % 16 == 0 for a in arrays)


def quantize_int8_exact(x, axis=None):
    """float64 NumPy reference before rounding: (x / scale, scale), scale = max|x| / 127 over
    each group (keepdims), x / scale 0 in a group of zeros."""
    x = np.asarray(x, np.float64)
    mode, _ = _mode("quantize_int8_ref", x.shape, axis)
    reduce_axes = None if mode == TENSOR else (1 if mode == ROW else tuple(range(x.ndim - 1)))
    scale = np.abs(x).max(axis=reduce_axes, keepdims=True) / QMAX
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, x / scale, 0.0), scale


def quantize_int8_ref(x, axis=None):
    """float64 NumPy reference: (q int8, scale float32)."""
    exact, scale = quantize_int8_exact(x, axis)
    _, scale_shape = _mode("quantize_int8_ref", np.shape(x), axis)
    return (np.clip(np.rint(exact), -QMAX, QMAX).astype(np.int8),
            scale.reshape(scale_shape).astype(np.float32))


def dequantize_int8_ref(q, scale, axis=None):
    """float64 NumPy reference."""
    q = np.asarray(q, np.float64)
    s = np.asarray(scale, np.float64)
    if axis is not None and s.ndim and (int(axis) % q.ndim) == 0 and q.ndim == 2:
        s = s[:, None]
    return q * s


def quantize_int8(x, axis=None, *, out=None):
    """Quantize to int8 symmetrically (absmax): ``x ≈ q * scale``.

    ``scale = max|x| / 127`` over the group, ``q = clip(rint(x / scale), −127, 127)``
    (a group of zeros gives scale 0, q 0); rounding half to even, in float32, so q can
    differ by one step from a float64 reference at exact ties. ``axis`` follows
    torch.quantize_per_channel: the axis whose every index gets its own scale. None: one
    scale for the tensor; ``axis=-1`` gives per-column scales (per-channel activations,
    [in, out] weights); ``axis=0`` on a 2-D x gives per-row scales (per-token
    activations, [out, in] weights). Per-row scales over 16-byte aligned rows take one
    pass over memory; the other cases two (module doc of ``kaionb.kernels.quantize``).

    Parameters
    ----------
    x : DeviceArray or array_like
        The values: float32, float16 or bfloat16, last axis contiguous.
    axis : {None, -1, 0}, optional
        Which scales: per tensor, per column (the last axis), or per row (2-D x only).
    out : tuple of DeviceArray, optional
        ``(q, scale)`` to write: int8 of x's shape (contiguous last axis) and a
        C-contiguous float32 scale array of the scales' shape.

    Returns
    -------
    q : DeviceArray
        The int8 codes, x's shape.
    scale : DeviceArray
        The float32 scales: shape () for axis=None, (x.shape[-1],) for axis=-1, (x.shape[0],)
        for axis=0.

    Raises
    ------
    TypeError
        ``x`` that is not float32 / float16 / bfloat16, or an ``out`` that is not a pair
        of device arrays of the right dtypes.
    ValueError
        An axis other than None, -1 or 0 (0 on a 2-D x only), a non-contiguous last axis,
        or ``out`` arrays of other shapes or layouts.

    Examples
    --------
    >>> x = kaionb.asarray([[0.5, -1.0], [2.0, 0.25]], dtype=np.float32)
    >>> q, scale = kaionb.quantize_int8(x, axis=0)
    >>> q.get()
    array([[  64, -127],
           [ 127,   16]], dtype=int8)
    >>> scale.get()
    array([0.00787402, 0.01574803], dtype=float32)
    """
    return quantize_int8_fwd(x, axis, out=out)


def dequantize_int8(q, scale, axis=None, dtype=np.float32, *, out=None):
    """Dequantize int8 values: ``q * scale`` as ``dtype``.

    ``scale`` and ``axis`` as returned by / given to :func:`quantize_int8` (a per-tensor
    scale may come in any shape of one element).

    Parameters
    ----------
    q : DeviceArray or array_like
        The int8 codes, last axis contiguous.
    scale : DeviceArray or array_like
        The float32 scales, C-contiguous: one element (axis None), (q.shape[-1],) (axis -1) or
        (q.shape[0],) (axis 0).
    axis : {None, -1, 0}, optional
        The axis the scales run along, as given to :func:`quantize_int8`.
    dtype : dtype, optional
        The result dtype: float32 (default), float16 or bfloat16.
    out : DeviceArray, optional
        An array of q's shape and ``dtype`` to write.

    Returns
    -------
    DeviceArray
        The dequantized values (``out`` itself when given).

    Raises
    ------
    TypeError
        ``q`` that is not int8, ``scale`` that is not float32, a dtype other than float32 /
        float16 / bfloat16, or an ``out`` that is not device memory or has another dtype.
    ValueError
        A ``scale`` of the wrong shape or not contiguous, a non-contiguous last axis of
        ``q``, an unsupported axis, arrays on two devices, or an ``out`` of another shape.

    Examples
    --------
    >>> q, scale = kaionb.quantize_int8(kaionb.asarray([127.0, -32.0], dtype=np.float32))
    >>> scale.item()
    1.0
    >>> kaionb.dequantize_int8(q, scale, dtype=np.float16).get()
    array([127., -32.], dtype=float16)
    """
    return dequantize_int8_fwd(q, scale, axis, dtype, out=out)
