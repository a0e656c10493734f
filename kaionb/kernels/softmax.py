"""Numerically stable softmax over any axis, and its backward.

    y_i = exp(x_i − m) / Σ_j exp(x_j − m),   m = max_j x_j
    dx_i = y_i · (g_i − Σ_j g_j·y_j)          (g = dL/dy; the backward reads y, not x)

Exponentials are ``ex2.approx`` of (x − m)·log2(e) (~2 ulp), in float32; subtracting
first keeps the argument exact near the maximum (x·log2(e) − m·log2(e) would be fused
into an fma whose rounding residual, ~1e-3 at logits of 1e4, lands in every output).
Softmax along a line too long for registers uses the online form (Milakov & Gimelshein
2018, https://arxiv.org/abs/1805.02867): a running maximum m and a sum s rescaled by
exp(m_old − m_new) whenever the maximum grows; partial (m, s) pairs merge the same way.
A line of all −inf has no maximum to subtract: (−inf) − (−inf) is NaN and the whole line
comes out NaN, as torch.softmax gives.

**Layouts.** The arrays of one call (x and out; y, g and dx) are planned together
(:func:`_plan`): the softmax axis is L, the other axes must fall into two groups, O and I,
that each walk with one stride in every array (axes sorted by x's strides, so transposed
and negative-stride views qualify). Anything else is copied first (x to C order, and a
result for an ``out`` of such a layout computed C-contiguous and copied in). A new output
takes x's axis order (NumPy's ``order="K"``): C-contiguous for C-ordered x.

- **Row kernel** (L has unit stride in every array, the other axes one stride): one block
  per line, as :mod:`kaionb.kernels.norms`. Aligned lines of up to 32768 elements
  (forward) or 16384 (backward: y and g both held) stay in registers: one pass over HBM;
  on sm_90 the forward holds aligned float32 lines of up to 262144 elements in the
  registers of a thread-block cluster (8 or 16 CTAs, each CTA's (max, Σexp) pair merged
  across it in one cluster reduction).
  Wider or misaligned lines stream twice; the forward parks the first 96 KiB of the line
  in shared memory, the backward re-reads (from L2 when recent).
- **Column kernel** (everything else): x viewed as [O, L, I]; a block of (TX, TY)
  threads, thread x owning VEC consecutive columns of I (one 16-byte load per row when I
  is contiguous and aligned in every array, else one column and element-wise loads), the
  TY threads splitting L. Each thread folds its part of its columns — the online (m, s)
  forward, Σ g·y backward —, the block merges the partials (``block_column_reducer``:
  the maxima, then the sums rescaled to them), and a second sweep writes. Lines of up to
  TY × 32 elements (TY × 16 backward; TX as small as a 32-byte sector allows) stay in
  registers: one pass; longer ones re-read x. Streaming grids stay within one wave of
  resident blocks, and L is never split across blocks: a handful of long columns
  (O × I / VEC small) runs on few SMs.

**Bytes moved** (N elements, s = x's itemsize, s_g = the gradient's itemsize):

    forward, one pass (registers):            2·N·s
    forward, streaming column / wide rows:    3·N·s (x read twice; rows: less the
                                              96 KiB of each row kept in shared memory)
    backward, one pass:                       N·(s + 2·s_g)
    backward, streaming:                      N·(2·s + 3·s_g)
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, int64, uint32

from .._device import multiprocessor_count
from ..array import DeviceArray, empty
from ..ptx_patches import (
    cluster_arrive,
    cluster_wait,
    device_function,
    ex2_approx_f32,
    global_addr,
    ld_global_nc_v4_u32,
    ld_shared_v4_u32,
    rcp_approx_f32,
    shared_addr,
    st_global_v4_u32,
    st_shared_v4_u32,
)
from ..validation import (
    as_array,
    check_ndim,
    check_same_device,
    check_shape,
    fail,
)
from .elementwise import _collapse, _needs_copy, copy_convert
from .helpers import block_max, block_sum
from .helpers.reduce import block_column_reducer, cluster_fold
from .helpers.rowwise import (
    CLUSTER_DTYPES,
    CODECS,
    FLOAT_DTYPES,
    MAX_CLUSTER,
    MAX_THREADS,
    NEG_INF_BITS,
    ROW_CLUSTER_SIZES,
    WIDE_CACHE_BYTES,
    chunk_io,
    row_cluster_plan,
    row_plan,
    row_slice,
)
from .helpers.vector import vector_group
from .launch import kernel
from .op import ANY_LAYOUT, Plan, fast_path, output, record, run

LOG2E = 1.4426950408889634
F32 = np.dtype(np.float32)
_INT32_MAX = 2**31 - 1

# Column kernel: 256 threads per block (the reducer's shared partials: 8 KiB at 8 columns
# a thread), 3 resident per SM (its launch bound): the planner splits L over more y
# threads while the grid stays within one such wave, down to 32 bytes of a row per warp.
COL_THREADS = 256
BLOCKS_PER_SM = 3
# Elements of a column a thread holds on the element-wise (non-vector) register path.
SCALAR_REG_ELEMS = 16


# -- device helpers ----------------------------------------------------------------------

@device_function
def _max(v, w):
    return max(v, w)


@device_function
def _add(v, w):
    return v + w


@device_function
def _online_step(m, s, v):
    """(m, s) after one more element v, with one ex2: the smaller of (m, v) is scaled by
    the larger; an element of −inf adds nothing (and never makes a −inf − −inf)."""
    if v == float32(-np.inf):
        return m, s
    hi = max(m, v)
    t = ex2_approx_f32((min(m, v) - hi) * float32(LOG2E))
    return hi, (s * t + float32(1.0) if v > m else s + t)


@device_function
def _merge_max_sum(acc, other):
    """Fold the (maximum, Σ exp(x − maximum)) pair ``other`` into ``acc``: both sums
    rescaled to the larger maximum (a pair of maximum −inf has sum 0 and adds nothing)."""
    hi = max(acc[0], other[0])
    if hi != float32(-np.inf):
        acc[1] = (acc[1] * ex2_approx_f32((acc[0] - hi) * float32(LOG2E))
                  + other[1] * ex2_approx_f32((other[0] - hi) * float32(LOG2E)))
    acc[0] = hi


# -- the row kernel (one block per line) -------------------------------------------------

def _make_softmax_kernel(codec, name, grad_codec=None, cluster=1):
    """One block per row; ``cache_vecs < 0`` selects the register path (see norms).
    ``cluster`` > 1 (sm_90, the forward's register path only): one thread-block cluster
    per row, each CTA holding a run of it, each CTA's (maximum, sum) pair merged across
    the cluster (``cluster_fold``).

    ``grad_codec`` None: the forward, ``out = softmax(x)``. Otherwise the backward: ``x``
    is y (the forward's output), ``g`` and ``out`` (dy, dx) are arrays of grad_codec's
    dtype, moved in chunks of x's VEC elements (``chunk_io``: two words4 of float32 under
    a half y's eight elements), and ``out = y·(g − Σ g·y)``; its streaming path re-reads
    the row instead of parking it (``cache_vecs`` 0)."""
    VEC = codec.vec
    S = codec.storage
    load, store, head_of, unpack, pack = (codec.load, codec.store, codec.head, codec.unpack,
                                         codec.pack)
    NEG_INF = NEG_INF_BITS[codec.dtype]
    BACKWARD = grad_codec is not None
    gio = chunk_io(grad_codec if BACKWARD else codec, VEC)
    g_load_aligned, g_load, g_unpack, g_store_aligned, g_store = (
        gio.load_aligned, gio.load, gio.unpack, gio.store_aligned, gio.store)
    GW = gio.words
    GS = grad_codec.storage if BACKWARD else S
    # The backward holds y and g: half the forward's elements of each per thread (rows up
    # to 16384 in registers), which keeps 1024-thread blocks under their 64 registers.
    REG_VECS = codec.reg_vecs // 2 if BACKWARD else codec.reg_vecs
    RAW = 4 * REG_VECS
    # words4 loads (of each array) in flight per streaming step. Backward: one — two spilled
    # 8 bytes on sm_89 (half y and g under the 64 registers of 1024 threads); two 512-thread
    # streaming blocks per SM still keep 32-48 KiB of y and g in flight.
    U = 1 if BACKWARD else 4
    RAWG = GW * max(REG_VECS, U) if BACKWARD else 1
    CLUSTER = cluster
    cta_row_slice = row_slice(CLUSTER)
    cluster_max_sum = cluster_fold(2, CLUSTER, _merge_max_sum)

    @kernel([f"void({S}[:, :], {GS}[:, :], {GS}[:, :], int32, int32)"], name=name,
            max_dynamic_shared_bytes=0 if BACKWARD or CLUSTER > 1 else WIDE_CACHE_BYTES,
            launch_bounds=MAX_THREADS, min_cc=(9, 0) if CLUSTER > 1 else (8, 0),
            non_portable_cluster=CLUSTER > MAX_CLUSTER)
    def _softmax_kernel(x, g, out, n, cache_vecs):
        scratch = cuda.shared.array(32, float32)
        slots = cuda.shared.array(2, float32)  # this CTA's row maximum and sum, for the cluster
        cache = cuda.shared.array(0, uint32)
        raw = cuda.local.array(RAW, uint32)
        rawg = cuda.local.array(RAWG, uint32)
        f = cuda.local.array(VEC, float32)
        d = cuda.local.array(VEC, float32)
        t = int32(cuda.threadIdx.x)
        T = int32(cuda.blockDim.x)
        L = float32(LOG2E)
        neg_inf = float32(-np.inf)
        if CLUSTER > 1 or cache_vecs < 0:
            # This CTA holds words4 [c0, c1) of row r (the whole row without a cluster).
            r, c0, c1 = cta_row_slice(n // VEC)
            if BACKWARD:
                acc = float32(0.0)
                for k in range(REG_VECS):
                    v = c0 + t + k * T
                    if v < c1:
                        words = ld_global_nc_v4_u32(global_addr(x, (int64(r), int64(v * VEC))))
                        for i in range(4):
                            raw[4 * k + i] = words[i]
                        g_load_aligned(g, r, v * VEC, rawg, GW * k)
                        unpack(words, f, 0)
                        g_unpack(rawg, GW * k, d)
                        for j in range(VEC):
                            acc += f[j] * d[j]
                dot = block_sum(acc, scratch)
                for k in range(REG_VECS):
                    v = c0 + t + k * T
                    if v < c1:
                        unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]), f, 0)
                        g_unpack(rawg, GW * k, d)
                        for j in range(VEC):
                            f[j] = f[j] * (d[j] - dot)
                        g_store_aligned(out, r, v * VEC, f)
                return
            m = neg_inf
            for k in range(REG_VECS):
                v = c0 + t + k * T
                words = (uint32(NEG_INF), uint32(NEG_INF), uint32(NEG_INF), uint32(NEG_INF))
                if v < c1:
                    words = ld_global_nc_v4_u32(global_addr(x, (int64(r), int64(v * VEC))))
                for i in range(4):
                    raw[4 * k + i] = words[i]
                unpack(words, f, 0)
                for j in range(VEC):
                    m = max(m, f[j])
            m = block_max(m, scratch)
            s = float32(0.0)
            if CLUSTER == 1 or m != neg_inf:  # a CTA of −inf only adds 0 to a cluster's sum
                for k in range(REG_VECS):
                    if c0 + t + k * T < c1:
                        unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]),
                               f, 0)
                        for j in range(VEC):
                            s += ex2_approx_f32((f[j] - m) * L)
            s = block_sum(s, scratch)
            if CLUSTER > 1:
                # Each CTA's (maximum, sum) merged over the cluster: one cluster barrier.
                stats = cuda.local.array(2, float32)
                stats[0] = m
                stats[1] = s
                cluster_max_sum(stats, scratch, slots, 0)
                m = stats[0]
                s = stats[1]
                # This CTA has read the others' slots: it arrives at the exit barrier now
                # and waits on it last (no CTA leaves while another may read its slots).
                cluster_arrive()
            inv = rcp_approx_f32(s)
            for k in range(REG_VECS):
                v = c0 + t + k * T
                if v < c1:
                    unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]), f, 0)
                    for j in range(VEC):
                        f[j] = ex2_approx_f32((f[j] - m) * L) * inv
                    st_global_v4_u32(global_addr(out, (int64(r), int64(v * VEC))), pack(f, 0))
            if CLUSTER > 1:
                cluster_wait()
            return
        r = int32(cuda.blockIdx.x)
        head = head_of(x, r)
        nv = (head + n + VEC - 1) // VEC
        if BACKWARD:
            # Pass 1: Σ g·y (masked elements read as 0); pass 2 re-reads both.
            acc = float32(0.0)
            for v0 in range(t, nv, U * T):
                for u in range(U):
                    v = v0 + u * T
                    if v < nv:
                        words = load(x, r, v * VEC - head, n, 0)
                        for i in range(4):
                            raw[4 * u + i] = words[i]
                        g_load(g, r, v * VEC - head, n, 0, rawg, GW * u)
                for u in range(U):
                    if v0 + u * T < nv:
                        unpack((raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3]), f, 0)
                        g_unpack(rawg, GW * u, d)
                        for j in range(VEC):
                            acc += f[j] * d[j]
            dot = block_sum(acc, scratch)
            for v0 in range(t, nv, U * T):
                for u in range(U):
                    v = v0 + u * T
                    if v < nv:
                        words = load(x, r, v * VEC - head, n, 0)
                        for i in range(4):
                            raw[4 * u + i] = words[i]
                        g_load(g, r, v * VEC - head, n, 0, rawg, GW * u)
                for u in range(U):
                    v = v0 + u * T
                    if v < nv:
                        unpack((raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3]), f, 0)
                        g_unpack(rawg, GW * u, d)
                        for j in range(VEC):
                            f[j] = f[j] * (d[j] - dot)
                        g_store(out, r, v * VEC - head, n, f)
            return
        # Online pass: masked elements read as −inf and add exp(−inf) = 0.
        m = neg_inf
        s = float32(0.0)
        for v0 in range(t, nv, U * T):
            for u in range(U):
                v = v0 + u * T
                if v < nv:
                    words = load(x, r, v * VEC - head, n, NEG_INF)
                    for i in range(4):
                        raw[4 * u + i] = words[i]
            for u in range(U):
                v = v0 + u * T
                if v < nv:
                    words = (raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3])
                    if v < cache_vecs:
                        st_shared_v4_u32(shared_addr(cache, 4 * v), words)
                    unpack(words, f, 0)
                    new_m = m
                    for j in range(VEC):
                        new_m = max(new_m, f[j])
                    if new_m != neg_inf:
                        s *= ex2_approx_f32((m - new_m) * L)
                        for j in range(VEC):
                            s += ex2_approx_f32((f[j] - new_m) * L)
                        m = new_m
        row_m = block_max(m, scratch)
        s = s * ex2_approx_f32((m - row_m) * L) if m != neg_inf else float32(0.0)
        inv = rcp_approx_f32(block_sum(s, scratch))
        # Pass 2 with U words4 in flight per thread, as pass 1.
        for v0 in range(t, nv, U * T):
            for u in range(U):
                v = v0 + u * T
                if v < nv:
                    if v < cache_vecs:
                        words = ld_shared_v4_u32(shared_addr(cache, 4 * v))
                    else:
                        words = load(x, r, v * VEC - head, n, NEG_INF)
                    for i in range(4):
                        raw[4 * u + i] = words[i]
            for u in range(U):
                v = v0 + u * T
                if v < nv:
                    unpack((raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3]), f, 0)
                    for j in range(VEC):
                        f[j] = ex2_approx_f32((f[j] - row_m) * L) * inv
                    store(out, r, v * VEC - head, n, pack(f, 0))

    return _softmax_kernel


# -- the column kernel ([O, L, I], threads across I) -------------------------------------

def _column_io(codec, cols, vector):
    """(ld, unpack, st, words): one thread's ``cols`` columns at (o, l, i..) of an
    [O, L, I] array. ``vector``: a 16-byte aligned group of cols // VEC words4
    (``vector_group``); else one element (cols = 1). ``words``: the uint32 a step takes
    in a raw buffer."""
    if vector:
        g_ld, g_unpack, g_st, words = vector_group(codec, cols)

        @device_function
        def ld(a, o, l, i, raw, at):
            g_ld(global_addr(a, (int64(o), int64(l), int64(i))), raw, at)

        @device_function
        def st(a, o, l, i, f):
            g_st(global_addr(a, (int64(o), int64(l), int64(i))), f)

        return ld, g_unpack, st, words
    decode, encode = codec.decode, codec.encode

    @device_function
    def ld1(a, o, l, i, raw, at):
        raw[at] = uint32(a[o, l, i])

    @device_function
    def unpack1(raw, at, f):
        f[0] = decode(raw[at])

    @device_function
    def st1(a, o, l, i, f):
        a[o, l, i] = encode(f[0])

    return ld1, unpack1, st1, 1


def _column_regs(codec, vector, backward):
    """Steps (rows of L) a column-kernel thread holds in registers: 32 elements forward
    (as the row kernel), half of them backward (y and g both held)."""
    regs = codec.reg_vecs if vector else SCALAR_REG_ELEMS
    return regs // 2 if backward else regs


def _make_softmax_col_kernel(codec, vector, name, grad_codec=None):
    """Softmax (or, with ``grad_codec``, its backward) along axis 1 of [O, L, I] views of
    any strides (module doc). Block b covers o = b // cblocks and column groups
    ((b % cblocks)·TX + x); ``in_registers``: L <= TY × regs, the one-pass path."""
    BACKWARD = grad_codec is not None
    CPT = codec.vec if vector else 1  # columns per thread
    x_ld, x_unpack, x_st, XW = _column_io(codec, CPT, vector)
    g_ld, g_unpack, g_st, GW = _column_io(grad_codec if BACKWARD else codec, CPT, vector)
    REGS = _column_regs(codec, vector, BACKWARD)
    # Loads in flight per thread per streaming step: 4 words4 (vector) or 8 elements (the
    # reductions' COL_LOADS), halved backward where each step also loads g.
    U = (4 if vector else 8) // (2 if BACKWARD else 1)
    SLOTS = max(REGS, U)
    RAW, RAWG = XW * SLOTS, GW * SLOTS if BACKWARD else 1
    PARTIALS = COL_THREADS * CPT
    S = codec.storage
    GS = grad_codec.storage if BACKWARD else S
    # The block's maxima, then its sums: the (max, sum) pairs merged in one butterfly
    # would cost two ex2 per column and step, more than a short column's own elements.
    reduce_max = block_column_reducer(_max, CPT)
    reduce_sum = block_column_reducer(_add, CPT)

    # Three blocks per SM: at most 80 registers (uncapped, the float32 forward took 90, two
    # blocks); none spill on sm_80/89/90a.
    @kernel([f"void({S}[:, :, :], {GS}[:, :, :], {GS}[:, :, :], int32, int32)"], name=name,
            launch_bounds=(COL_THREADS, 3))
    def _softmax_col_kernel(x, g, out, cblocks, in_registers):
        scratch = cuda.shared.array(PARTIALS, float32)
        raw = cuda.local.array(RAW, uint32)
        rawg = cuda.local.array(RAWG, uint32)
        f = cuda.local.array(CPT, float32)
        d = cuda.local.array(CPT, float32)
        a = cuda.local.array(CPT, float32)  # forward: the max; backward: Σ g·y
        b = cuda.local.array(CPT, float32)  # forward: Σ exp(x − max)
        m = cuda.local.array(CPT, float32)  # forward, streaming: the thread's own max
        TX = int32(cuda.blockDim.x)
        TY = int32(cuda.blockDim.y)
        ty = int32(cuda.threadIdx.y)
        blk = int32(cuda.blockIdx.x)
        o = blk // cblocks
        i = ((blk - o * cblocks) * TX + int32(cuda.threadIdx.x)) * CPT
        n = int32(x.shape[1])
        live = i < int32(x.shape[2])
        Lg = float32(LOG2E)
        neg_inf = float32(-np.inf)
        for k in range(CPT):
            a[k] = float32(0.0) if BACKWARD else neg_inf
            b[k] = float32(0.0)
        if in_registers:
            for k in range(REGS):
                l = ty + k * TY
                if live and l < n:
                    x_ld(x, o, l, i, raw, XW * k)
                    if BACKWARD:
                        g_ld(g, o, l, i, rawg, GW * k)
            for k in range(REGS):
                if live and ty + k * TY < n:
                    x_unpack(raw, XW * k, f)
                    if BACKWARD:
                        g_unpack(rawg, GW * k, d)
                        for j in range(CPT):
                            a[j] += f[j] * d[j]
                    else:
                        for j in range(CPT):
                            a[j] = max(a[j], f[j])
            if not BACKWARD:  # the block's maxima first: the sums need no rescaling
                if TY > 1:
                    reduce_max(a, TX, scratch)
                for k in range(REGS):
                    if live and ty + k * TY < n:
                        x_unpack(raw, XW * k, f)
                        for j in range(CPT):
                            if a[j] != neg_inf:
                                b[j] += ex2_approx_f32((f[j] - a[j]) * Lg)
        else:
            for l0 in range(ty, n, U * TY):
                for u in range(U):
                    l = l0 + u * TY
                    if live and l < n:
                        x_ld(x, o, l, i, raw, XW * u)
                        if BACKWARD:
                            g_ld(g, o, l, i, rawg, GW * u)
                for u in range(U):
                    if live and l0 + u * TY < n:
                        x_unpack(raw, XW * u, f)
                        if BACKWARD:
                            g_unpack(rawg, GW * u, d)
                            for j in range(CPT):
                                a[j] += f[j] * d[j]
                        else:
                            for j in range(CPT):
                                a[j], b[j] = _online_step(a[j], b[j], f[j])
            if not BACKWARD and TY > 1:  # each thread's sum rescaled to the block's max
                for j in range(CPT):
                    m[j] = a[j]
                reduce_max(a, TX, scratch)
                for j in range(CPT):
                    b[j] = (b[j] * ex2_approx_f32((m[j] - a[j]) * Lg) if m[j] != neg_inf
                            else float32(0.0))
        if TY > 1:
            reduce_sum(a if BACKWARD else b, TX, scratch)
        if not BACKWARD:
            for j in range(CPT):
                b[j] = rcp_approx_f32(b[j])
        # Second sweep: from registers, or re-read with U steps in flight.
        if in_registers:
            for k in range(REGS):
                l = ty + k * TY
                if live and l < n:
                    x_unpack(raw, XW * k, f)
                    if BACKWARD:
                        g_unpack(rawg, GW * k, d)
                        for j in range(CPT):
                            f[j] = f[j] * (d[j] - a[j])
                        g_st(out, o, l, i, f)
                    else:
                        for j in range(CPT):
                            f[j] = ex2_approx_f32((f[j] - a[j]) * Lg) * b[j]
                        x_st(out, o, l, i, f)
            return
        for l0 in range(ty, n, U * TY):
            for u in range(U):
                l = l0 + u * TY
                if live and l < n:
                    x_ld(x, o, l, i, raw, XW * u)
                    if BACKWARD:
                        g_ld(g, o, l, i, rawg, GW * u)
            for u in range(U):
                l = l0 + u * TY
                if live and l < n:
                    x_unpack(raw, XW * u, f)
                    if BACKWARD:
                        g_unpack(rawg, GW * u, d)
                        for j in range(CPT):
                            f[j] = f[j] * (d[j] - a[j])
                        g_st(out, o, l, i, f)
                    else:
                        for j in range(CPT):
                            f[j] = ex2_approx_f32((f[j] - a[j]) * Lg) * b[j]
                        x_st(out, o, l, i, f)

    return _softmax_col_kernel


def _grad_dtypes(dt):
    """The gradient dtypes a backward kernel exists for: float32, and y's own."""
    return tuple(dict.fromkeys((F32, dt)))


_ROW_KERNELS = {dt: _make_softmax_kernel(codec, f"_softmax_fwd_kernel_{dt.name}")
                for dt, codec in CODECS.items()}
# The forward's register path over a cluster of each size (rows too wide for one CTA).
_ROW_CLUSTER_KERNELS = {
    dt: {size: _make_softmax_kernel(codec, f"_softmax_fwd_kernel_c{size}_{dt.name}",
                                    cluster=size)
         for size in ROW_CLUSTER_SIZES}
    for dt, codec in CODECS.items() if dt in CLUSTER_DTYPES}
_ROW_BWD_KERNELS = {
    (dt, gdt): _make_softmax_kernel(codec, f"_softmax_bwd_kernel_{dt.name}_grad_{gdt.name}",
                                    CODECS[gdt])
    for dt, codec in CODECS.items() for gdt in _grad_dtypes(dt)}
_COL_KERNELS = {
    (dt, vector): _make_softmax_col_kernel(
        codec, vector, f"_softmax_col_fwd_kernel_{'vec' if vector else 'elem'}_{dt.name}")
    for dt, codec in CODECS.items() for vector in (True, False)}
_COL_BWD_KERNELS = {
    (dt, gdt, vector): _make_softmax_col_kernel(
        codec, vector,
        f"_softmax_col_bwd_kernel_{'vec' if vector else 'elem'}_{dt.name}_grad_{gdt.name}",
        CODECS[gdt])
    for dt, codec in CODECS.items() for gdt in _grad_dtypes(dt) for vector in (True, False)}


# -- host: layout ------------------------------------------------------------------------

class _Layout(NamedTuple):
    kind: str  # "row" ([rows, n] views) or "col" ([O, L, I] views)
    views: tuple  # one per array, in the order given


def _plan(axis, arrays):
    """The row or column form of same-shape ``arrays`` along ``axis`` (module doc), or
    None when the other axes do not fall into two groups that each walk with one stride
    in every array."""
    x = arrays[0]
    shape = x.shape
    n = shape[axis]
    # Largest stride first: a suffix of this order is what threads walk side by side.
    kept = sorted((a for a in range(x.ndim) if a != axis and shape[a] != 1),
                  key=lambda a: -abs(x.strides[a]))

    def group(axes):  # (extent, stride per array) when the axes merge into one walk
        dims, strides = _collapse([shape[a] for a in axes],
                                  *([arr.strides[a] for a in axes] for arr in arrays))
        if len(dims) > 1:
            return None
        return (dims[0], [st[0] for st in strides]) if dims else (1, [0] * len(arrays))

    if n == 1 or all(a.strides[axis] == a.itemsize for a in arrays):
        rows = group(kept)
        if rows is not None:
            count, strides = rows
            return _Layout("row", tuple(
                a._view((count, n), (st if count > 1 else n * a.itemsize, a.itemsize))
                for a, st in zip(arrays, strides)))
    for cut in range(len(kept) + 1):  # the widest inner group that leaves a valid outer
        outer, inner = group(kept[:cut]), group(kept[cut:])
        if outer is not None and inner is not None:
            (o, so), (i, si) = outer, inner
            return _Layout("col", tuple(a._view((o, n, i), (so_a, a.strides[axis], si_a))
                                        for a, so_a, si_a in zip(arrays, so, si)))
    return None


def _pow2(n):
    return 1 << max(0, n - 1).bit_length()


def _column_block(o, n, c, regs, cols, itemsize, sms):
    """(TX, TY) for the column kernel over ``c`` column groups of ``cols`` and lines of
    ``n``: TX no wider than the columns, and no narrower than a 32-byte sector of a row
    allows; TY (threads splitting L) raised until the line fits their registers, and
    further while the grid stays within one wave of resident blocks; never more y
    threads than rows (a smaller block, at least a warp)."""
    tx = min(COL_THREADS, _pow2(c))
    ty_max = COL_THREADS // min(tx, _pow2(max(1, 32 // (cols * itemsize))))
    ty = COL_THREADS // tx
    fit = _pow2(-(-n // regs))
    if fit <= ty_max:
        ty = max(ty, fit)
    wave = sms * BLOCKS_PER_SM
    # Split L further while the grid still fits one wave: it ends in (½, 1] wave, every
    # block resident at once (each walks all of L: a second, partial wave is a tail).
    while ty < ty_max and ty < n and o * -(-c // (COL_THREADS // (2 * ty))) <= wave:
        ty *= 2
    tx = COL_THREADS // ty
    return tx, min(ty, max(_pow2(n), 32 // tx))


def _aligned(views, cols):
    """Whether the column kernel's 16-byte loads fit: I contiguous in every array, a
    multiple of ``cols``, every (o, l) row start 16-byte aligned."""
    o, n, i = views[0].shape
    return i % cols == 0 and all(
        a.strides[2] == a.itemsize and a.ptr % 16 == 0 and (o == 1 or a.strides[0] % 16 == 0)
        and (n == 1 or a.strides[1] % 16 == 0) for a in views)


def _too_large(backward, x):
    fail(ValueError, "softmax_bwd" if backward else "softmax", "y" if backward else "x",
         f"at most {_INT32_MAX} elements along each axis and {_INT32_MAX} lines of blocks",
         f"shape {x.shape}")


def _launch(axis, backward, x, g, out):
    """Plan x (y), g (x again forward) and out together and launch; copies where the
    layout cannot be planned (module doc)."""
    layout = _plan(axis, (x, g, out))
    if layout is None:
        xc = x.copy()
        g = xc if g is x else g.copy()
        x = xc
        layout = _plan(axis, (x, g, out))
    if layout is None:  # out's layout: compute C-contiguous, copy in
        tmp = empty(out.shape, out.dtype)
        _launch(axis, backward, x, g, tmp)
        copy_convert(tmp, out)
        return
    xv, gv, ov = layout.views
    codec = CODECS[x.dtype]
    if layout.kind == "row":
        rows, n = xv.shape
        if backward:
            threads, cache_vecs, smem = row_plan(codec, xv, gv, ov,
                                                 per_thread=codec.reg_vecs // 2)
            kdef = _ROW_BWD_KERNELS[x.dtype, g.dtype]
            if cache_vecs >= 0:  # the backward streams without a shared cache
                cache_vecs, smem = 0, 0
        else:
            clustered = row_cluster_plan(_ROW_CLUSTER_KERNELS.get(x.dtype), codec, xv, ov)
            if clustered is not None:
                clustered.launch(xv, gv, ov, n, -1)
                return
            threads, cache_vecs, smem = row_plan(codec, xv, ov)
            kdef = _ROW_KERNELS[x.dtype]
        if n > _INT32_MAX:
            _too_large(backward, x)
        Plan.of(kdef, (rows,), (threads,), smem).launch(xv, gv, ov, n, cache_vecs)
        return
    o, n, i = xv.shape
    vector = _aligned((xv, gv, ov), codec.vec)
    cols = codec.vec if vector else 1
    c = i // cols
    regs = _column_regs(codec, vector, backward)
    tx, ty = _column_block(o, n, c, regs, cols, x.itemsize, multiprocessor_count(x.device_id))
    cblocks = -(-c // tx)
    if max(o * cblocks, n, i) > _INT32_MAX:
        _too_large(backward, x)
    kdef = (_COL_BWD_KERNELS[x.dtype, g.dtype, vector] if backward
            else _COL_KERNELS[x.dtype, vector])
    Plan.of(kdef, (o * cblocks,), (tx, ty)).launch(xv, gv, ov, cblocks, int(n <= ty * regs))


# -- host: entries ----------------------------------------------------------------------

def _axis(op, axis, ndim):
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (numbers.Integral,
                                                                   np.integer)):
        fail(TypeError, op, "axis", "an int", type(axis).__name__)
    if not -ndim <= axis < ndim:
        fail(ValueError, op, "axis", f"an axis in [-{ndim}, {ndim})", axis)
    return int(axis) % ndim


def _axis_order(x):
    """x's axes from the largest stride to the smallest (NumPy's order="K"), or None where
    that is C order (or x broadcasts an axis: C order then too)."""
    order = sorted(range(x.ndim), key=lambda a: -abs(x.strides[a]))
    if x.is_c_contiguous or order == list(range(x.ndim)) or any(
            st == 0 for d, st in zip(x.shape, x.strides) if d > 1):
        return None
    return order


def _new_like(x, dtype):
    """A new array of x's shape in x's axis order, so that x and it plan as one layout."""
    order = _axis_order(x)
    if order is None:
        return empty(x.shape, dtype)
    base = empty(tuple(x.shape[a] for a in order), dtype)
    return base.transpose(tuple(int(k) for k in np.argsort(order)))


def _output(op, out, like, dtype):
    if out is None:
        return _new_like(like, dtype)
    return output(op, out, like.shape, dtype, device=like.device_id, layout=ANY_LAYOUT)


@fast_path
def softmax_fwd(x, axis=-1, *, out=None):
    """Validate and resolve ``out``; launch unless x is empty. Returns ``out``."""
    op = "softmax"
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    check_ndim(op, "x", x, (1, None))
    axis = _axis(op, axis, x.ndim)
    out = _output(op, out, x, x.dtype)
    if _needs_copy(x, out):  # out overlaps x other than element for element
        x = x.copy()
    return run(_launch, axis, False, x, x, out=out)


@fast_path
def softmax_bwd(grad, y, axis=-1, *, out=None):
    """Backward of :func:`softmax`: ``dx = y·(grad − Σ_axis grad·y)``.

    From the forward's output ``y`` and the output gradient ``grad``; float32
    arithmetic, one pass over y and grad for lines that fit in registers.

    Parameters
    ----------
    grad : DeviceArray or array_like
        The gradient of the output: y's shape, y's dtype or float32, any layout.
    y : DeviceArray or array_like
        The forward's output: float32, float16 or bfloat16, at least 1-D.
    axis : int, optional
        The forward's axis.
    out : DeviceArray, optional
        An array of y's shape in grad's dtype to write (any layout).

    Returns
    -------
    DeviceArray
        The gradient of x, in grad's dtype.

    Raises
    ------
    TypeError
        ``y`` that is not a float32 / float16 / bfloat16 array, a ``grad`` of another
        dtype than y's or float32, an ``axis`` that is not an int, or an ``out`` that is
        not device memory or has another dtype.
    ValueError
        A 0-d ``y``, a ``grad`` of another shape, an axis out of range, arrays on two
        devices, or an ``out`` of another shape.

    Examples
    --------
    >>> y = kaionb.softmax(kaionb.asarray([[1.0, 2.0, 3.0]], dtype=np.float32))
    >>> grad = kaionb.asarray([[1.0, 0.0, 0.0]], dtype=np.float32)
    >>> kaionb.softmax_bwd(grad, y).get().round(4)
    array([[ 0.0819, -0.022 , -0.0599]], dtype=float32)
    """
    op = "softmax_bwd"
    y = as_array(op, "y", y, dtypes=FLOAT_DTYPES)
    check_ndim(op, "y", y, (1, None))
    grad = as_array(op, "grad", grad, dtypes=_grad_dtypes(y.dtype))
    check_shape(op, "grad", grad, y.shape)
    check_same_device(op, y=y, grad=grad)
    axis = _axis(op, axis, y.ndim)
    out = _output(op, out, y, grad.dtype)
    if _needs_copy(y, out):
        y = y.copy()
    if _needs_copy(grad, out):
        grad = grad.copy()
    return run(_launch, axis, True, y, grad, out=out)


# -- references --------------------------------------------------------------------------

def softmax_ref(x, axis=-1):
    """float64 NumPy reference; an all −inf line gives NaN (as torch.softmax)."""
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def softmax_bwd_ref(grad, y, axis=-1):
    """float64 NumPy reference of :func:`softmax_bwd`."""
    g = np.asarray(grad, np.float64)
    y = np.asarray(y, np.float64)
    return y * (g - (g * y).sum(axis=axis, keepdims=True))


# -- the public function -----------------------------------------------------------------

def softmax(x, axis=-1, *, out=None):
    """Softmax along ``axis`` (any axis, negative counts from the end), float32 arithmetic.

    Any shape (ndim >= 1) and any strides — transposed and negative-stride views run
    without a copy when the axes other than ``axis`` fall into two groups of one stride
    each; other layouts are copied to C order first. A new result has x's axis order. A
    line of all −inf gives NaN, as torch.softmax does. On the tape (the backward reads
    the output: :func:`softmax_bwd`).

    Parameters
    ----------
    x : DeviceArray or array_like
        An array of float32, float16 or bfloat16, at least 1-D, any strides.
    axis : int, optional
        The axis to normalize along.
    out : DeviceArray, optional
        An array of x's shape and dtype to write (any layout).

    Returns
    -------
    DeviceArray
        The probabilities, x's shape and dtype (``out`` itself when given).

    Raises
    ------
    TypeError
        ``x`` that is not a float32 / float16 / bfloat16 array, an ``axis`` that is not
        an int, or an ``out`` that is not device memory or has another dtype.
    ValueError
        A 0-d ``x``, an axis out of range, or an ``out`` of another shape.

    Examples
    --------
    >>> x = kaionb.asarray([[1.0, 2.0, 3.0]], dtype=np.float32)
    >>> kaionb.softmax(x).get().round(4)
    array([[0.09  , 0.2447, 0.6652]], dtype=float32)
    """
    y = softmax_fwd(x, axis, out=out)
    if type(x) is DeviceArray and x.requires_grad:
        record(lambda g: (softmax_bwd(g, y, axis),), (x,), (y,))
    return y
