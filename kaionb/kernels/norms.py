"""RMSNorm, LayerNorm and the pre-norm residual add, over the last axis, with their
backward passes.

    rms_norm:     y = x / sqrt(mean(x²) + eps) · w                (Zhang & Sennrich 2019,
                  https://arxiv.org/abs/1910.07467)
    layer_norm:   y = (x − mean(x)) / sqrt(var(x) + eps) · w + b  (Ba et al. 2016,
                  https://arxiv.org/abs/1607.06450; biased variance, as PyTorch)
    add_rms_norm: s = x + residual (rounded to the storage dtype), y = rms_norm(s, w, eps):
                  the residual stream of every Llama-style block, one pass.

Memory-bound: the floor is one read of each input and one write of each output (w and b
stay in L2). One block per row. Aligned rows of up to 32768 elements (16384 for
add_rms_norm, which holds x and residual at once) stay in registers between the
statistics and the output: one pass over HBM. On sm_90, wider aligned float32 rows
(up to 262144 elements; 131072 for add_rms_norm) take the same register path over a
thread-block cluster of 8 or 16 CTAs, one cluster reduction a row (rowwise's
CLUSTER_DTYPES says why halves do not). Other wider or misaligned rows stream
twice, the first 96 KiB of the row parked in shared memory and the rest re-read (from L2
when the row is recent). Statistics accumulate in float32: the register path takes the
variance around the mean in a second sweep over registers; the streaming path from sums
shifted by the row's first element (exact up to rounding unless that element lies many
standard deviations from the mean).

add_rms_norm normalizes the *rounded* sum: s is rounded to the storage dtype, written,
and its rounded values feed the statistics — so the result equals ``rms_norm(x +
residual)`` computed unfused in that dtype, the backward (which reads s) differentiates
exactly the function the forward computed, and it is what vLLM's fused_add_rms_norm does
(the sum is a scalar_t). flash-attn's Triton layer_norm differs: it normalizes the
unrounded float32 sum and stores the rounded one for its backward.

**Backward.** With x̂ = (x − mean)·rstd (mean = 0 for RMSNorm) and dy = g·w:

    dx = rstd · (dy − mean(dy) − x̂ · mean(dy · x̂))    (mean(dy): LayerNorm only)
    dw = Σ_rows g · x̂         db = Σ_rows g
    add_rms_norm, grads (g_y, g_s): ds = g_s + rms_norm's dx(s, g_y); dx = dresidual = ds

The statistics are recomputed from x, not saved by the forward: the backward holds the row
in registers anyway, so mean and rstd cost one more block reduction and no memory
traffic, and the forward stays the same kernel whether a tape records or not. Kernels
per (x dtype, gradient dtype) — the gradient in x's dtype or float32 (the tape's), dx in
the gradient's — walk the row in chunks of the wider vector (8 elements for a float16 x
with a float32 gradient: one 16-byte load of x, two of g). On the staged path a thread
owns 8 or 16 elements of the row and their dw (db) accumulators (``_bwd_reg_elems``):
x and g come into shared memory by cp.async, the next row's while this one is reduced
and written (two rows staged where shared memory allows), so one pass over HBM for rows
up to 8192 or 16384 elements in one CTA's registers. A CTA may instead keep the row's x
and g and its dw (db) accumulators in shared memory, registers holding one chunk at a
time (16 elements a thread): in one CTA (rows up to 16384 where they fit, and for the
dtype pairs of SHARED_ONE_CTA, where two CTAs a SM measured faster than registers) or
over a thread-block cluster of 16 on sm_90 (rows up to 262144). Between them, up to 65536
over a cluster of 8 CTAs' registers (the row sums reduced across a cluster through
distributed shared memory). Other rows (and float32 LayerNorm at 262144, whose stage and
accumulators exceed a CTA's 227 KiB) take the streaming kernel (the row read twice, the
first 96 KiB of x and g parked in shared memory).

Weight gradients are deterministic: the grid is one wave of P blocks (or clusters),
block p takes rows p, p + P, ... in order and keeps its partial dw in float32
(registers or shared memory; on the streaming path a row of a [P, n] workspace that the
block alone updates, barrier-separated); the P partials are then summed by the column
reduction of kernels/reductions.py, whose order depends on the shape and the GPU only.
No atomics: bit-identical run to run.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, int64, uint32

from .._device import check_driver, compute_capability, multiprocessor_count
from ..array import DeviceArray, empty
from ..grad.record import active_tape
from ..ptx_patches import (
    cluster_arrive,
    cluster_wait,
    cp_async_commit_group,
    cp_async_wait_group,
    device_function,
    global_addr,
    ld_global_nc_v4_u32,
    ld_shared_v4_u32,
    rsqrt_approx_f32,
    shared_addr,
    st_global_v4_u32,
    st_shared_v4_u32,
)
from ..validation import (
    as_array,
    check_contiguous,
    check_ndim,
    check_positive,
    check_same_device,
    check_same_dtype,
    check_shape,
    fail,
)
from .helpers import block_sum
from .helpers.reduce import block_sums, cluster_sums, row_reducers
from .helpers.rowwise import (
    CLUSTER_DTYPES,
    CODECS,
    FLOAT_DTYPES,
    MAX_CLUSTER,
    MAX_THREADS,
    PREFERRED_THREADS,
    ROW_CLUSTER_SIZES,
    WIDE_CACHE_BYTES,
    WIDE_THREADS,
    chunk_io,
    round_up,
    row_cluster_plan,
    row_plan,
    row_slice,
    rows_aligned,
    rows_view,
)
from .launch import kernel
from .op import C_CONTIGUOUS, LAST_AXIS, Plan, _span, fast_path, output, outputs, record, run
from .reductions import reduce_fwd

F32 = np.dtype(np.float32)
# The backward's cluster for rows too wide for MAX_CLUSTER CTAs' registers: x, g and the dw
# accumulators held in its shared memory (non-portable: the H100 allows 16), as much as a
# CTA may have (227 KiB on sm_90, less the static arrays: the kernel's max_dynamic_shared).
SHARED_ROWS_CLUSTER = 16
# Elements per thread where x and g sit in shared memory (and the dw (db) accumulators
# too): 16 assemble without spills at 1024 threads on sm_80, sm_89 and sm_90a.
SHARED_ROWS_ELEMS = 16
# One CTA keeping its row in shared memory instead of registers: where the registers
# cannot hold the row (before a cluster), and for the pairs (op, float32 gradient) of a
# half x below where it measured faster from SHARED_ONE_CTA_MIN elements. H100, µs,
# registers → shared memory: [16384, 8192] / [16384, 4096] rms_norm f16 325 → 309 / 182 →
# 172, layer_norm f16 with a float32 gradient 651 → 526 / 335 → 289; elsewhere the registers
# were as fast or faster (rms_norm f16 with a float32 gradient 475 → 524, layer_norm f16
# 393 → 397). Rows of 16384 (a cluster before): layer_norm f16 434 → 236, rms_norm f32
# 331 → 308, rms_norm f16 with a float32 gradient 312 → 270 ([4096, 16384]).
SHARED_ONE_CTA = {("rms_norm", False), ("layer_norm", True)}
SHARED_ONE_CTA_MIN = 4096


def _bwd_reg_elems(op, x_dtype, g_dtype, cluster=1):
    """Elements per thread (of x, g and the dw accumulators) on the backward's staged
    path: the most that assemble without spills under the register cap of
    :func:`_bwd_threads` threads. In one CTA of up to 1024 threads (64 registers) on
    sm_80, sm_89 and sm_90a: 16 (rows up to 16384) for RMSNorm with x and g both half
    types; 8 (rows up to 8192) for a float32 x or g (16 spilled 20 bytes on sm_90a with a
    float32 g, 72-80 with a float32 x) and for LayerNorm, which also keeps db (16 spilled
    56-236 bytes). In a cluster, where the cluster's offsets take registers: 8 for RMSNorm
    (16 spilled 4 bytes), 16 for LayerNorm in CTAs of up to 512 threads (8 at 1024
    threads spilled 4 bytes for float32): rows up to 65536. (Where x and g stay in shared
    memory: SHARED_ROWS_ELEMS.)"""
    if cluster > 1:
        return 16 if op == "layer_norm" else 8
    halves = x_dtype != F32 and g_dtype != F32
    return 16 if op == "rms_norm" and halves else 8


def _bwd_threads(op, cluster=1):
    """The most threads a CTA of the staged path has (its launch bound)."""
    return 512 if op == "layer_norm" and cluster == MAX_CLUSTER else MAX_THREADS


# -- forward ---------------------------------------------------------------------------------

def _reg_vecs(op, codec):
    """words4 of x per thread on the forward's register path. add_rms_norm holds x's and
    the residual's words at once (every load issued before the first store of s): half
    as many, rows up to 16384 elements — the full count spilled 112-144 bytes (float32)
    and 8 (float16 on sm_89) under the 64-register cap."""
    return codec.reg_vecs // 2 if op == "add_rms_norm" else codec.reg_vecs


def _make_norm_kernel(op, codec, name, cluster=1):
    """One block per row. ``cache_vecs < 0``: the row is 16-byte aligned and fits in
    registers (REG_VECS words4 per thread): one pass over HBM — in one CTA, or (``cluster``
    > 1, sm_90, the register path only) in the ``cluster`` CTAs of a thread-block cluster,
    each holding a run of the row and the row sums reduced across the cluster through
    distributed shared memory (``row_reducers``; LayerNorm's shifted Σd, Σd² in one
    ``cluster_sums``). Otherwise the streaming
    path: pass 1 takes the statistics and parks the first ``cache_vecs`` words4 in shared
    memory, pass 2 normalizes from there or re-reads (an L2 hit when the row is recent).
    ``op`` "add_rms_norm": the row is s = x + residual, rounded, written to ``s_out`` as it
    is formed; pass 2 re-reads s from ``s_out`` (coherently: this kernel wrote it)."""
    VEC = codec.vec
    S = codec.storage
    load, store, head_of, unpack, pack, decode = (codec.load, codec.store, codec.head,
                                                  codec.unpack, codec.pack, codec.decode)
    load_fresh = codec.load_fresh
    LAYER_NORM = op == "layer_norm"
    ADD = op == "add_rms_norm"
    REG_VECS = _reg_vecs(op, codec)
    RAW = 4 * REG_VECS
    RAW_ADD = RAW if ADD else 1
    # words4 loads of x in flight per thread in streaming pass 1 (4 spilled 8 bytes on
    # sm_89); add_rms_norm loads x and residual: 2 of each.
    U = 2 if ADD else 3
    U2 = 2  # ... of x, w and b in pass 2 (4 spilled under the 64-register cap)
    RAW2 = 4 * U2
    RAW1_ADD = 4 * U if ADD else 1
    CLUSTER = cluster
    SHIFTED = LAYER_NORM and CLUSTER > 1
    cta_row_slice = row_slice(CLUSTER)
    row_sum = row_reducers(CLUSTER)[0]
    shifted_sums = cluster_sums(2, CLUSTER)

    @device_function
    def norm_row(x, res, w, b, s_out, out, n, eps, has_bias, cache_vecs):
        scratch = cuda.shared.array(64, float32)
        slots = cuda.shared.array(2, float32)  # the cluster's row sums
        cache = cuda.shared.array(0, uint32)
        raw = cuda.local.array(RAW, uint32)
        f = cuda.local.array(VEC, float32)
        g = cuda.local.array(VEC, float32)
        rw = cuda.local.array(RAW2, uint32)
        rb = cuda.local.array(RAW2, uint32)
        t = int32(cuda.threadIdx.x)
        T = int32(cuda.blockDim.x)
        inv_n = float32(1.0) / float32(n)
        mean = float32(0.0)
        if CLUSTER > 1 or cache_vecs < 0:
            # Registers: every words4 is whole and aligned; no masks but v < c1. This CTA
            # holds words4 [c0, c1) of row r (the whole row without a cluster).
            r, c0, c1 = cta_row_slice(n // VEC)
            # LayerNorm over a cluster takes Σd and Σd² (d = x − x[r, 0]) in one cluster
            # reduction, as the streaming path; in one CTA the exact mean, then Σ(x − mean)².
            shift = decode(x[r, 0]) if SHIFTED else float32(0.0)
            acc = float32(0.0)
            acc2 = float32(0.0)
            rr = cuda.local.array(RAW_ADD, uint32)
            for k in range(REG_VECS):
                v = c0 + t + k * T
                words = (uint32(0), uint32(0), uint32(0), uint32(0))
                if v < c1:
                    words = ld_global_nc_v4_u32(global_addr(x, (int64(r), int64(v * VEC))))
                for i in range(4):
                    raw[4 * k + i] = words[i]
                if ADD:
                    # Every load of x and residual is issued before the first store of s
                    # (a store may alias an input: nothing can move past it).
                    words = (uint32(0), uint32(0), uint32(0), uint32(0))
                    if v < c1:
                        words = ld_global_nc_v4_u32(global_addr(res, (int64(r),
                                                                      int64(v * VEC))))
                    for i in range(4):
                        rr[4 * k + i] = words[i]
                elif v < c1:
                    unpack(words, f, 0)
                    for j in range(VEC):
                        if SHIFTED:
                            d = f[j] - shift
                            acc += d
                            acc2 += d * d
                        else:
                            acc += f[j] if LAYER_NORM else f[j] * f[j]
            if ADD:
                # s = x + residual rounded to storage: its bits replace x's in registers.
                # Over a cluster s is stored with the output, after the cluster barrier
                # (whose release would otherwise wait for these stores).
                for k in range(REG_VECS):
                    v = c0 + t + k * T
                    unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]), f, 0)
                    unpack((rr[4 * k], rr[4 * k + 1], rr[4 * k + 2], rr[4 * k + 3]), g, 0)
                    for j in range(VEC):
                        f[j] += g[j]
                    words = pack(f, 0)
                    for i in range(4):
                        raw[4 * k + i] = words[i]
                    if v < c1 and CLUSTER == 1:
                        st_global_v4_u32(global_addr(s_out, (int64(r), int64(v * VEC))), words)
                    unpack(words, f, 0)
                    for j in range(VEC):
                        acc += f[j] * f[j]
            if SHIFTED:
                sums = cuda.local.array(2, float32)
                sums[0] = acc
                sums[1] = acc2
                shifted_sums(sums, scratch, slots, 0)
                dm = sums[0] * inv_n
                mean = shift + dm
                var = max(sums[1] * inv_n - dm * dm, float32(0.0))
            elif LAYER_NORM:
                # Second sweep over registers: var = mean((x − mean)²); padding excluded.
                mean = block_sum(acc, scratch) * inv_n
                acc = float32(0.0)
                for k in range(REG_VECS):
                    if c0 + t + k * T < c1:
                        unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]),
                               f, 0)
                        for j in range(VEC):
                            d = f[j] - mean
                            acc += d * d
                var = block_sum(acc, scratch) * inv_n
            else:
                var = row_sum(acc, scratch, slots, 0) * inv_n
            if CLUSTER > 1:
                # This CTA has read the others' slots: it arrives at the exit barrier now
                # and waits on it last (no CTA leaves while another may read its slots).
                cluster_arrive()
            rstd = rsqrt_approx_f32(var + eps)
            for k in range(REG_VECS):
                v = c0 + t + k * T
                if v < c1:
                    if ADD and CLUSTER > 1:
                        st_global_v4_u32(global_addr(s_out, (int64(r), int64(v * VEC))),
                                         (raw[4 * k], raw[4 * k + 1], raw[4 * k + 2],
                                          raw[4 * k + 3]))
                    unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]), f, 0)
                    unpack(ld_global_nc_v4_u32(global_addr(w, (int64(0), int64(v * VEC)))), g, 0)
                    for j in range(VEC):
                        f[j] = (f[j] - mean) * rstd * g[j]
                    if LAYER_NORM and has_bias:
                        unpack(ld_global_nc_v4_u32(global_addr(b, (int64(0), int64(v * VEC)))),
                               g, 0)
                        for j in range(VEC):
                            f[j] += g[j]
                    st_global_v4_u32(global_addr(out, (int64(r), int64(v * VEC))), pack(f, 0))
            if CLUSTER > 1:
                cluster_wait()
            return
        r = int32(cuda.blockIdx.x)
        head = head_of(x, r)
        nv = (head + n + VEC - 1) // VEC
        # LayerNorm sums are shifted by the first element; masked elements read as it
        # (LayerNorm) or 0 (RMSNorm) and add nothing.
        first = x[r, 0]
        shift = decode(first) if LAYER_NORM else float32(0.0)
        fill = first if LAYER_NORM else 0
        s1 = float32(0.0)
        s2 = float32(0.0)
        r1 = cuda.local.array(RAW1_ADD, uint32)
        for v0 in range(t, nv, U * T):
            for u in range(U):
                v = v0 + u * T
                if v < nv:
                    words = load(x, r, v * VEC - head, n, fill)
                    for i in range(4):
                        raw[4 * u + i] = words[i]
                    if ADD:
                        words = load(res, r, v * VEC - head, n, 0)
                        for i in range(4):
                            r1[4 * u + i] = words[i]
            for u in range(U):
                v = v0 + u * T
                if v < nv:
                    words = (raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3])
                    if ADD:
                        unpack(words, f, 0)
                        unpack((r1[4 * u], r1[4 * u + 1], r1[4 * u + 2], r1[4 * u + 3]), g, 0)
                        for j in range(VEC):
                            f[j] += g[j]
                        words = pack(f, 0)
                        store(s_out, r, v * VEC - head, n, words)
                    if v < cache_vecs:
                        st_shared_v4_u32(shared_addr(cache, 4 * v), words)
                    unpack(words, f, 0)
                    for j in range(VEC):
                        d = f[j] - shift
                        s1 += d
                        s2 += d * d
        var = block_sum(s2, scratch) * inv_n
        if LAYER_NORM:
            dm = block_sum(s1, scratch) * inv_n
            mean = shift + dm
            var = max(var - dm * dm, float32(0.0))
        rstd = rsqrt_approx_f32(var + eps)
        # Pass 2, U2 words4 of x, w (and b) in flight per thread: one at a time, the
        # L2 latency of w and b capped the [2048, 65536] rows at 57% of copy.
        for v0 in range(t, nv, U2 * T):
            for u in range(U2):
                v = v0 + u * T
                if v < nv:
                    e0 = v * VEC - head
                    if v < cache_vecs:
                        words = ld_shared_v4_u32(shared_addr(cache, 4 * v))
                    elif ADD:
                        words = load_fresh(s_out, r, e0, n, 0)
                    else:
                        words = load(x, r, e0, n, 0)
                    wv = load(w, 0, e0, n, 0)
                    for i in range(4):
                        raw[4 * u + i] = words[i]
                        rw[4 * u + i] = wv[i]
                    if LAYER_NORM and has_bias:
                        bv = load(b, 0, e0, n, 0)
                        for i in range(4):
                            rb[4 * u + i] = bv[i]
            for u in range(U2):
                v = v0 + u * T
                if v < nv:
                    e0 = v * VEC - head
                    unpack((raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3]), f, 0)
                    unpack((rw[4 * u], rw[4 * u + 1], rw[4 * u + 2], rw[4 * u + 3]), g, 0)
                    for j in range(VEC):
                        f[j] = (f[j] - mean) * rstd * g[j]
                    if LAYER_NORM and has_bias:
                        unpack((rb[4 * u], rb[4 * u + 1], rb[4 * u + 2], rb[4 * u + 3]), g, 0)
                        for j in range(VEC):
                            f[j] += g[j]
                    store(out, r, e0, n, pack(f, 0))

    options = dict(name=name, max_dynamic_shared_bytes=0 if CLUSTER > 1 else WIDE_CACHE_BYTES,
                   launch_bounds=MAX_THREADS, min_cc=(9, 0) if CLUSTER > 1 else (8, 0),
                   non_portable_cluster=CLUSTER > MAX_CLUSTER)
    if ADD:
        @kernel([f"void({S}[:, :], {S}[:, :], {S}[:, :], {S}[:, :], {S}[:, :], int32, float32, "
                 "int32)"], **options)
        def _add_rms_norm_fwd_kernel(x, res, w, s_out, out, n, eps, cache_vecs):
            norm_row(x, res, w, w, s_out, out, n, eps, 0, cache_vecs)

        return _add_rms_norm_fwd_kernel

    @kernel([f"void({S}[:, :], {S}[:, :], {S}[:, :], {S}[:, :], int32, float32, int32, int32)"],
            **options)
    def _norm_fwd_kernel(x, w, b, out, n, eps, has_bias, cache_vecs):
        norm_row(x, x, w, b, out, out, n, eps, has_bias, cache_vecs)

    return _norm_fwd_kernel


_FWD_OPS = ("rms_norm", "layer_norm", "add_rms_norm")
_KERNELS = {(op, dt): _make_norm_kernel(op, codec, f"_{op}_fwd_kernel_{dt.name}")
            for op in _FWD_OPS for dt, codec in CODECS.items()}
# The register path over a cluster of each size (rows too wide for one CTA).
_CLUSTER_KERNELS = {
    (op, dt): {size: _make_norm_kernel(op, codec, f"_{op}_fwd_kernel_c{size}_{dt.name}", size)
               for size in ROW_CLUSTER_SIZES}
    for op in _FWD_OPS for dt, codec in CODECS.items() if dt in CLUSTER_DTYPES}


# -- backward --------------------------------------------------------------------------------

def _make_norm_bwd_kernel(op, x_codec, g_codec, name, streaming, cluster=1,
                          shared_rows=False):
    """Rows p, p + P, ... of block p (P = gridDim.x). Arrays: x and w in x's dtype; the
    gradient g, the extra gradient ``gs`` added to dx (``has_gs``: add_rms_norm's g_s) and
    dx in g's dtype; ``dw_part`` / ``db_part`` [P, n] float32, row p this block's partial
    sums (db only for LayerNorm with ``has_bias``). Two kernels, each with its own
    register budget: the staged path (rows aligned, n % CH == 0, KC chunks per thread,
    up to 1024 threads: 64 registers; x and g come by cp.async into shared memory,
    ``stages`` rows at a time (1 or 2), and from there into registers, where each row is
    reduced and differentiated beside the dw accumulators), and
    the streaming path (``streaming``, up to WIDE_THREADS = 512 threads: 128 registers —
    in one kernel with the staged path it spilled 100-400 bytes on the half types): pass
    1 takes the four shifted sums and parks the first ``cache_chunks`` chunks of x and g
    in shared memory, pass 2 writes dx and read-modify-writes the block's dw row.

    ``cluster`` > 1 (sm_90, staged path): a row too wide for one block is split over the
    ``cluster`` CTAs of a thread-block cluster, rank k taking the k-th run of chunks; p
    and P count clusters, and the row sums are reduced over the cluster (cluster_sums).
    LayerNorm's cluster CTAs have up to 512 threads (128 registers; :func:`_bwd_threads`).
    ``shared_rows`` (one CTA, or a cluster of SHARED_ROWS_CLUSTER CTAs, non-portable, rows
    up to 262144): the row's chunks are read from shared memory in each of the two sweeps
    instead of being held in registers, and the dw (db) accumulators live in shared memory
    after the stages; with one stage, each chunk of the next row is copied as soon as this
    row's is in registers."""
    LAYER_NORM = op == "layer_norm"
    CLUSTER = cluster
    SHARED_ROWS = shared_rows
    CH = max(x_codec.vec, g_codec.vec)  # elements per chunk: one words4 of the narrower
    xio, gio = chunk_io(x_codec, CH), chunk_io(g_codec, CH)
    XW, GW = xio.words, gio.words
    # numba reads device functions from plain names, not attributes.
    x_load_aligned, x_load, x_unpack = xio.load_aligned, xio.load, xio.unpack
    x_to_shared, x_from_shared = xio.to_shared, xio.from_shared
    x_load_async, g_load_async = xio.load_async, gio.load_async
    g_load, g_unpack = gio.load, gio.unpack
    g_to_shared, g_from_shared = gio.to_shared, gio.from_shared
    g_store_aligned, g_store = gio.store_aligned, gio.store
    g_add_aligned, g_add = gio.add_aligned, gio.add
    CW = XW + GW  # shared-memory words of one cached chunk (x, then g)
    KC = (SHARED_ROWS_ELEMS if SHARED_ROWS
          else _bwd_reg_elems(op, x_codec.dtype, g_codec.dtype, cluster)) // CH
    E = KC * CH
    # Local-array sizes must be plain constants: the thread's chunks, or one at a time.
    REG_X, REG_G = (XW, GW) if SHARED_ROWS else (KC * XW, KC * GW)
    # The dw (db) accumulators: E (each) per thread in registers, or in SHARED_ROWS after
    # the stages in shared memory, accumulator i of thread t at word i·T + t (db from
    # E·T on): conflict-free, and 16 per thread at 1024 threads without spills.
    AW = 1 if SHARED_ROWS else E
    EB = E if LAYER_NORM and not SHARED_ROWS else 1
    head_of, decode = x_codec.head, x_codec.decode
    row_sums = cluster_sums(4 if LAYER_NORM else 2, CLUSTER)
    row_mean = block_sums(1)
    stream_sums = block_sums(4 if LAYER_NORM else 2)
    XS, GS = x_codec.storage, g_codec.storage

    @device_function
    def accumulate(sums, fx, fg, fw, shift):
        """One chunk into the row sums Σ d², Σ dy·d (and for LayerNorm Σ dy, Σ d), with
        d = x − shift and dy = g·w."""
        for j in range(CH):
            d = fx[j] - shift
            dy = fg[j] * fw[j]
            sums[0] += d * d
            sums[1] += dy * d
            if LAYER_NORM:
                sums[2] += dy
                sums[3] += d

    @device_function
    def row_stats(sums, shift, inv_n, eps):
        """(mean, rstd, c1 = mean(dy·x̂), c2 = mean(dy)) from the reduced row sums."""
        var = sums[0] * inv_n
        dyd = sums[1] * inv_n  # mean(dy · (x − shift))
        mean = float32(0.0)
        c2 = float32(0.0)
        if LAYER_NORM:
            dm = sums[3] * inv_n
            mean = shift + dm
            var = max(var - dm * dm, float32(0.0))
            c2 = sums[2] * inv_n
            dyd -= dm * c2  # mean(dy · (x − mean))
        rstd = rsqrt_approx_f32(var + eps)
        return mean, rstd, dyd * rstd, c2

    @device_function
    def stage_row(x, g, r, c0, nc, cache, at, g_at):
        """cp.async this thread's chunks of row r (chunks c0 + v, v < nc) to the stage at
        word ``at``: x chunk v at ``at + v·XW``, g chunk v at ``at + g_at + v·GW``."""
        t = int32(cuda.threadIdx.x)
        T = int32(cuda.blockDim.x)
        for k in range(KC):
            v = t + k * T
            if v < nc:
                e0 = (c0 + v) * CH
                x_load_async(x, r, e0, cache, at + v * XW)
                g_load_async(g, r, e0, cache, at + g_at + v * GW)

    @device_function
    def chunk_regs(cache, base, g_at, v, rx, rg):
        """SHARED_ROWS: chunk v of the stage at ``base`` into rx / rg (else they hold the
        thread's chunks already)."""
        if SHARED_ROWS:
            x_from_shared(cache, base + v * XW, rx, 0)
            g_from_shared(cache, base + g_at + v * GW, rg, 0)

    @kernel([f"void({XS}[:, :], {GS}[:, :], {XS}[:, :], {GS}[:, :], {GS}[:, :], "
             "float32[:, :], float32[:, :], int32, float32, int32, int32, int32, int32)"],
            name=name, max_dynamic_shared_bytes=WIDE_CACHE_BYTES if streaming else
            227 * 1024 if SHARED_ROWS else 2 * _bwd_threads(op, CLUSTER) * KC * CW * 4,
            launch_bounds=(WIDE_THREADS, 1) if streaming else (_bwd_threads(op, CLUSTER), 1),
            min_cc=(9, 0) if CLUSTER > 1 else (8, 0),
            non_portable_cluster=CLUSTER > MAX_CLUSTER)
    def _norm_bwd_kernel(x, g, w, gs, dx, dw_part, db_part, n, eps, has_bias, has_gs,
                         cache_chunks, stages):
        scratch = cuda.shared.array(128, float32)
        slots = cuda.shared.array(8, float32)  # two sets of cluster_sums slots
        cache = cuda.shared.array(0, uint32)
        sums = cuda.local.array(4, float32)
        fx = cuda.local.array(CH, float32)
        fg = cuda.local.array(CH, float32)
        fw = cuda.local.array(CH, float32)
        rwt = cuda.local.array(XW, uint32)
        p = int32(cuda.blockIdx.x)
        P = int32(cuda.gridDim.x)
        t = int32(cuda.threadIdx.x)
        T = int32(cuda.blockDim.x)
        rows = int32(x.shape[0])
        inv_n = float32(1.0) / float32(n)
        if not streaming:
            rx = cuda.local.array(REG_X, uint32)
            rg = cuda.local.array(REG_G, uint32)
            aw = cuda.local.array(AW, float32)
            ab = cuda.local.array(EB, float32)
            for j in range(AW):
                aw[j] = float32(0.0)
            for j in range(EB):
                ab[j] = float32(0.0)
            # This CTA's chunks of each row: [c0, c0 + nc) (the whole row without a
            # cluster); p and P count clusters.
            nc = n // CH
            per_cta = int32((nc + CLUSTER - 1) // CLUSTER)
            c0 = int32(p % CLUSTER) * per_cta
            nc = min(per_cta, nc - c0)
            p = int32(p // CLUSTER)
            P = int32(P // CLUSTER)
            # A stage: the CTA's x chunks, then its g chunks (each thread's 16-byte words
            # side by side: no bank conflicts).
            g_at = per_cta * XW
            stage_words = per_cta * (XW + GW)
            red_at = int32(0)  # cluster_sums' slots: sets 0 and 4 by turns, row by row
            acc = cuda.shared.array(0, float32)  # the same dynamic shared memory as cache
            acc_at = stages * stage_words
            if SHARED_ROWS:
                for j in range(E * (2 if LAYER_NORM else 1)):
                    acc[acc_at + j * T + t] = float32(0.0)
            # Rows reach shared memory by cp.async, each thread copying, then reading into
            # its registers, only its own chunks; the next row's copies are in flight while
            # this row is reduced and written (one 1024-thread block per SM has nothing
            # else to overlap them with). Two stages: issued as the row starts; one: once
            # the row's first barrier has ordered this thread's reads of the stage.
            if p < rows:
                stage_row(x, g, p, c0, nc, cache, 0, g_at)
            cp_async_commit_group()
            slot = int32(0)
            for r in range(p, rows, P):
                nxt = r + P
                if stages == 2 and nxt < rows:
                    stage_row(x, g, nxt, c0, nc, cache, (slot ^ 1) * stage_words, g_at)
                cp_async_commit_group()  # possibly empty: row r's group is the older one
                # LayerNorm in a cluster shifts by the row's first element (below), loaded
                # while the row's copies land.
                shift = (decode(x[r, 0]) if LAYER_NORM and (CLUSTER > 1 or SHARED_ROWS)
                         else float32(0.0))
                cp_async_wait_group(1)
                base = slot * stage_words
                if not SHARED_ROWS:
                    for k in range(KC):
                        v = t + k * T
                        if v < nc:
                            x_from_shared(cache, base + v * XW, rx, k * XW)
                            g_from_shared(cache, base + g_at + v * GW, rg, k * GW)
                if stages == 2:
                    slot ^= 1
                # Σ d², Σ dy·d, Σ dy, Σ d with d = x − shift, one barrier round. LayerNorm
                # in one CTA shifts by the mean, a reduction of its own; in a cluster by
                # the row's first element (as the streaming path), a cluster barrier less.
                # H100 runs, % of copy, mean / first element: [16384, 8192] f16 79.5 and
                # 66 / 65 and 65 (runs on different machines differ by up to 10%);
                # clusters at [2048, 65536] f16 37 / 43, f32 48 / 68 (the latter with
                # 512-thread CTAs). docs/perf-log-primitives.md has the runs.
                if LAYER_NORM and CLUSTER == 1 and not SHARED_ROWS:
                    sums[0] = float32(0.0)
                    for k in range(KC):
                        if t + k * T < nc:
                            x_unpack(rx, k * XW, fx)
                            for j in range(CH):
                                sums[0] += fx[j]
                    row_mean(sums, scratch)
                    shift = sums[0] * inv_n
                for i in range(4):
                    sums[i] = float32(0.0)
                for k in range(KC):
                    v = t + k * T
                    if v < nc:
                        chunk_regs(cache, base, g_at, v, rx, rg)
                        x_unpack(rx, 0 if SHARED_ROWS else k * XW, fx)
                        g_unpack(rg, 0 if SHARED_ROWS else k * GW, fg)
                        x_load_aligned(w, 0, (c0 + v) * CH, rwt, 0)
                        x_unpack(rwt, 0, fw)
                        accumulate(sums, fx, fg, fw, shift)
                row_sums(sums, scratch, slots, red_at)
                red_at ^= 4
                if stages == 1 and nxt < rows and not SHARED_ROWS:
                    stage_row(x, g, nxt, c0, nc, cache, 0, g_at)
                    cp_async_commit_group()
                mean, rstd, c1, c2 = row_stats(sums, shift, inv_n, eps)
                for k in range(KC):
                    v = t + k * T
                    if v < nc:
                        e0 = (c0 + v) * CH
                        chunk_regs(cache, base, g_at, v, rx, rg)
                        x_unpack(rx, 0 if SHARED_ROWS else k * XW, fx)
                        g_unpack(rg, 0 if SHARED_ROWS else k * GW, fg)
                        if SHARED_ROWS and stages == 1 and nxt < rows:
                            # One stage: the next row's copy of this chunk as soon as the
                            # chunk is in registers (this thread alone reads it: no barrier).
                            x_load_async(x, nxt, e0, cache, v * XW)
                            g_load_async(g, nxt, e0, cache, g_at + v * GW)
                        x_load_aligned(w, 0, e0, rwt, 0)
                        x_unpack(rwt, 0, fw)
                        # dw (db) first: then g is dead and its buffer takes dx (four
                        # chunk buffers live spilled 12 bytes on sm_90a).
                        for j in range(CH):
                            xh = (fx[j] - mean) * rstd
                            if SHARED_ROWS:
                                acc[acc_at + (k * CH + j) * T + t] += fg[j] * xh
                                if LAYER_NORM:
                                    acc[acc_at + (E + k * CH + j) * T + t] += fg[j]
                            else:
                                aw[k * CH + j] += fg[j] * xh
                                if LAYER_NORM:
                                    ab[k * CH + j] += fg[j]
                            fx[j] = xh
                            fw[j] *= fg[j]  # dy
                        for j in range(CH):
                            fg[j] = rstd * (fw[j] - c2 - fx[j] * c1)
                        if has_gs:
                            g_add_aligned(gs, r, e0, fg)
                        g_store_aligned(dx, r, e0, fg)
                if stages == 1 and nxt < rows and SHARED_ROWS:
                    cp_async_commit_group()
            for k in range(KC):
                v = t + k * T
                if v < nc:
                    for j in range(CH):
                        e = (c0 + v) * CH + j
                        if SHARED_ROWS:
                            dw_part[p, e] = acc[acc_at + (k * CH + j) * T + t]
                            if LAYER_NORM and has_bias:
                                db_part[p, e] = acc[acc_at + (E + k * CH + j) * T + t]
                        else:
                            dw_part[p, e] = aw[k * CH + j]
                            if LAYER_NORM and has_bias:
                                db_part[p, e] = ab[k * CH + j]
            if CLUSTER > 1:  # no CTA leaves while another may read its slots
                cluster_arrive()
                cluster_wait()
            return
        rx = cuda.local.array(XW, uint32)
        rg = cuda.local.array(GW, uint32)
        for r in range(p, rows, P):
            head = head_of(x, r)
            nc = (head + n + CH - 1) // CH
            # Sums shifted by the row's first element (LayerNorm); masked elements read as
            # it (x) and 0 (g) and add nothing.
            first = x[r, 0]
            shift = decode(first) if LAYER_NORM else float32(0.0)
            fill = first if LAYER_NORM else 0
            for i in range(4):
                sums[i] = float32(0.0)
            for v in range(t, nc, T):
                e0 = v * CH - head
                x_load(x, r, e0, n, fill, rx, 0)
                g_load(g, r, e0, n, 0, rg, 0)
                if v < cache_chunks:
                    x_to_shared(rx, 0, cache, v * CW)
                    g_to_shared(rg, 0, cache, v * CW + XW)
                x_unpack(rx, 0, fx)
                g_unpack(rg, 0, fg)
                x_load(w, 0, e0, n, 0, rwt, 0)
                x_unpack(rwt, 0, fw)
                accumulate(sums, fx, fg, fw, shift)
            stream_sums(sums, scratch)
            mean, rstd, c1, c2 = row_stats(sums, shift, inv_n, eps)
            fresh = r == p  # the block's first row writes its dw row, later rows add to it
            for v in range(t, nc, T):
                e0 = v * CH - head
                if v < cache_chunks:
                    x_from_shared(cache, v * CW, rx, 0)
                    g_from_shared(cache, v * CW + XW, rg, 0)
                else:
                    x_load(x, r, e0, n, 0, rx, 0)
                    g_load(g, r, e0, n, 0, rg, 0)
                x_unpack(rx, 0, fx)
                g_unpack(rg, 0, fg)
                x_load(w, 0, e0, n, 0, rwt, 0)
                x_unpack(rwt, 0, fw)
                # dw (db) first: then g is dead and its buffer takes dx.
                for j in range(CH):
                    xh = (fx[j] - mean) * rstd
                    e = e0 + j
                    if 0 <= e < n:
                        pw = fg[j] * xh
                        pb = fg[j]
                        if not fresh:
                            pw += dw_part[p, e]
                            if LAYER_NORM and has_bias:
                                pb += db_part[p, e]
                        dw_part[p, e] = pw
                        if LAYER_NORM and has_bias:
                            db_part[p, e] = pb
                    fx[j] = xh
                    fw[j] *= fg[j]  # dy
                for j in range(CH):
                    fg[j] = rstd * (fw[j] - c2 - fx[j] * c1)
                if has_gs:
                    g_add(gs, r, e0, n, fg)
                g_store(dx, r, e0, n, fg)

    return _norm_bwd_kernel


class _BwdKernels(NamedTuple):
    staged: dict  # cluster size (1: no cluster) -> the staged kernel
    streaming: object
    ch: int  # elements per chunk
    per_thread: int  # chunks a thread holds on the staged path
    cluster_per_thread: int  # ... and in a cluster of MAX_CLUSTER
    chunk_bytes: int  # shared bytes of one staged chunk (x and g)


def _bwd_variants():
    """(op, x dtype, gradient dtype) -> :class:`_BwdKernels`. Gradients come in x's dtype
    or float32 (what the tape passes)."""
    variants = {}
    for op in ("rms_norm", "layer_norm"):
        for x_dt, x_codec in CODECS.items():
            for g_dt in dict.fromkeys((x_dt, F32)):
                g_codec = CODECS[g_dt]
                ch = max(x_codec.vec, g_codec.vec)
                suffix = f"{x_dt.name}_{g_dt.name}"
                staged = {size: _make_norm_bwd_kernel(
                    op, x_codec, g_codec, f"_{op}_bwd_kernel{f'_cluster{size}' * (size > 1)}"
                    f"_{suffix}", False, size, size == SHARED_ROWS_CLUSTER)
                    for size in (1, MAX_CLUSTER, SHARED_ROWS_CLUSTER)}
                staged["shared"] = _make_norm_bwd_kernel(
                    op, x_codec, g_codec, f"_{op}_bwd_kernel_shared_{suffix}", False, 1, True)
                streaming = _make_norm_bwd_kernel(op, x_codec, g_codec,
                                                  f"_{op}_bwd_kernel_wide_{suffix}", True)
                words = chunk_io(x_codec, ch).words + chunk_io(g_codec, ch).words
                variants[op, x_dt, g_dt] = _BwdKernels(
                    staged, streaming, ch, _bwd_reg_elems(op, x_dt, g_dt) // ch,
                    _bwd_reg_elems(op, x_dt, g_dt, MAX_CLUSTER) // ch, 4 * words)
    return variants


_BWD_KERNELS = _bwd_variants()


# -- host: forward ---------------------------------------------------------------------------

def _weight_row(a, n):
    """A [1, n] view of a 1-D parameter (weight, bias): row 0 for every row of x."""
    return a._view((1, n), (0, a.itemsize))


@fast_path
def _norm_fwd(op, x, weight, bias, eps, out):
    """Validate and resolve ``out``; launch unless x is empty. Returns ``out``."""
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    weight = as_array(op, "weight", weight, dtypes=FLOAT_DTYPES)
    check_ndim(op, "x", x, (1, None))
    check_shape(op, "weight", weight, x.shape[-1:])
    if bias is not None:
        bias = as_array(op, "bias", bias, dtypes=FLOAT_DTYPES)
        check_shape(op, "bias", bias, x.shape[-1:])
    check_same_dtype(op, x=x, weight=weight, bias=bias)
    check_same_device(op, x=x, weight=weight, bias=bias)
    check_contiguous(op, "x", x, last_axis_only=True)
    check_contiguous(op, "weight", weight, last_axis_only=True)
    if bias is not None:
        check_contiguous(op, "bias", bias, last_axis_only=True)
    check_positive(op, "eps", eps)
    out = output(op, out, x.shape, x.dtype, device=x.device_id)
    return run(_norm_launch, op, x, weight, bias, eps, out=out)


def _norm_launch(op, x, weight, bias, eps, out):
    """The register or the streaming path (module doc), as ``row_plan`` chooses."""
    x2 = rows_view(op, "x", x)
    out2 = rows_view(op, "out", out)
    rows, n = x2.shape
    w2 = _weight_row(weight, n)
    b2 = w2 if bias is None else _weight_row(bias, n)
    codec = CODECS[x.dtype]
    plan = _fwd_plan(op, codec, rows, x2, out2, w2, b2)
    plan.launch(x2, w2, b2, out2, n, eps, int(bias is not None), plan.cache_vecs)


class _FwdPlan(NamedTuple):
    plan: Plan
    cache_vecs: int

    def launch(self, *args):
        self.plan.launch(*args)


def _fwd_plan(op, codec, rows, x2, *others):
    """The forward's launch (module doc): one CTA per row (register or streaming path, as
    ``row_plan`` chooses), or a cluster per row (sm_90) for aligned rows too wide for one
    CTA's registers."""
    per_thread = _reg_vecs(op, codec)
    clustered = row_cluster_plan(_CLUSTER_KERNELS.get((op, codec.dtype)), codec, x2, *others,
                                 per_thread=per_thread)
    if clustered is not None:
        return _FwdPlan(clustered, -1)
    threads, cache_vecs, smem = row_plan(codec, x2, *others, per_thread=per_thread)
    return _FwdPlan(Plan.of(_KERNELS[op, codec.dtype], (rows,), (threads,), smem), cache_vecs)


def _overlap(a, b) -> bool:
    if not (a.size and b.size):
        return False
    (a_lo, a_hi), (b_lo, b_hi) = _span(a), _span(b)
    return a_lo < b_hi and b_lo < a_hi


def _same_layout(a, b) -> bool:
    return (a.ptr, a.shape, a.strides) == (b.ptr, b.shape, b.strides)


@fast_path
def add_rms_norm_fwd(x, residual, weight, eps=1e-6, *, out=None, residual_out=None):
    """Validate, resolve both outputs and launch. Returns ``(out, residual_out)``."""
    op = "add_rms_norm"
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    residual = as_array(op, "residual", residual, dtypes=FLOAT_DTYPES)
    weight = as_array(op, "weight", weight, dtypes=FLOAT_DTYPES)
    check_ndim(op, "x", x, (1, None))
    check_shape(op, "residual", residual, x.shape)
    check_shape(op, "weight", weight, x.shape[-1:])
    check_same_dtype(op, x=x, residual=residual, weight=weight)
    check_same_device(op, x=x, residual=residual, weight=weight)
    for name, a in (("x", x), ("residual", residual), ("weight", weight)):
        check_contiguous(op, name, a, last_axis_only=True)
    check_positive(op, "eps", eps)
    out = output(op, out, x.shape, x.dtype, device=x.device_id)
    residual_out = output(op, residual_out, x.shape, x.dtype, device=x.device_id,
                          name="residual_out")
    # In place is fine (each element is read before it is written, by the thread that
    # writes it); any other overlap would read elements already overwritten.
    if _overlap(out, residual_out):
        fail(ValueError, op, "residual_out", "memory apart from 'out'",
             f"arrays that overlap (out at 0x{out.ptr:x}, residual_out at "
             f"0x{residual_out.ptr:x})")
    for oname, o in (("out", out), ("residual_out", residual_out)):
        for iname, a in (("x", x), ("residual", residual), ("weight", weight)):
            in_place = iname != "weight" and _same_layout(o, a)
            if _overlap(o, a) and not in_place:
                fail(ValueError, op, oname, f"memory apart from '{iname}'" if iname == "weight"
                     else f"'{iname}' itself (in place) or memory apart from it",
                     f"a partial overlap (shape {o.shape} strides {o.strides} at "
                     f"0x{o.ptr:x})")
    return run(_add_rms_norm_launch, x, residual, weight, eps, out=(out, residual_out))


def _add_rms_norm_launch(x, residual, weight, eps, out, residual_out):
    op = "add_rms_norm"
    x2 = rows_view(op, "x", x)
    r2 = rows_view(op, "residual", residual)
    out2 = rows_view(op, "out", out)
    s2 = rows_view(op, "residual_out", residual_out)
    rows, n = x2.shape
    w2 = _weight_row(weight, n)
    plan = _fwd_plan(op, CODECS[x.dtype], rows, x2, r2, out2, s2, w2)
    plan.launch(x2, r2, w2, s2, out2, n, eps, plan.cache_vecs)


def rms_norm_fwd(x, weight, eps=1e-6, *, out=None):
    return _norm_fwd("rms_norm", x, weight, None, eps, out)


def layer_norm_fwd(x, weight, bias=None, eps=1e-5, *, out=None):
    return _norm_fwd("layer_norm", x, weight, bias, eps, out)


# -- host: backward --------------------------------------------------------------------------

@functools.cache
def _resident_blocks(compiled, threads: int, shared: int) -> int:
    """How many blocks of ``threads`` with ``shared`` dynamic bytes fit on one SM, as the
    driver computes it (registers and shared memory decide)."""
    from cuda.bindings import driver

    err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(compiled._function,
                                                                     threads, shared)
    check_driver(err, f"cuOccupancyMaxActiveBlocksPerMultiprocessor({compiled.kdef.name})")
    return max(1, blocks)


@fast_path
def _norm_bwd(op, kernel_op, names, grad, x, weight, bias, grad_extra, eps, out):
    """Validate and resolve (dx, dweight[, dbias]); launch. ``names``: what the user's
    function calls grad, x and grad_extra (add_rms_norm_bwd: s, grad_residual)."""
    g_name, x_name, extra_name = names
    x = as_array(op, x_name, x, dtypes=FLOAT_DTYPES)
    grad = as_array(op, g_name, grad, dtypes=tuple(dict.fromkeys((x.dtype, F32))))
    weight = as_array(op, "weight", weight, dtypes=FLOAT_DTYPES)
    check_ndim(op, x_name, x, (1, None))
    check_shape(op, g_name, grad, x.shape)
    check_shape(op, "weight", weight, x.shape[-1:])
    if bias is not None:
        bias = as_array(op, "bias", bias, dtypes=FLOAT_DTYPES)
        check_shape(op, "bias", bias, x.shape[-1:])
    check_same_dtype(op, **{x_name: x, "weight": weight, "bias": bias})
    if grad_extra is not None:
        grad_extra = as_array(op, extra_name, grad_extra, dtypes=FLOAT_DTYPES)
        check_shape(op, extra_name, grad_extra, x.shape)
        check_same_dtype(op, **{g_name: grad, extra_name: grad_extra})
    check_same_device(op, **{x_name: x, g_name: grad, "weight": weight, "bias": bias,
                             extra_name: grad_extra})
    for name, a in ((x_name, x), (g_name, grad), ("weight", weight), (extra_name, grad_extra)):
        if a is not None:
            check_contiguous(op, name, a, last_axis_only=True)
    check_positive(op, "eps", eps)
    n = x.shape[-1]
    specs = [(x.shape, grad.dtype, LAST_AXIS), ((n,), F32, C_CONTIGUOUS)]
    if bias is not None:
        specs.append(((n,), F32, C_CONTIGUOUS))
    result = outputs(op, out, specs, device=x.device_id)
    if result[0].size == 0:  # no rows: the weight gradients are sums of nothing
        for d in result[1:]:
            d.fill(0.0)
        return result
    return run(_norm_bwd_launch, op, kernel_op, names, grad, x, weight, grad_extra, eps,
               out=result)


def _cluster_threads(op, nc, per_thread, size=MAX_CLUSTER):
    """Threads of each of the ``size`` CTAs of a cluster (1: one CTA) that hold a row of
    ``nc`` chunks, ``per_thread`` each (at least PREFERRED_THREADS where there are that
    many chunks, as row_plan), or None if _bwd_threads cannot. A row too wide for one CTA
    always takes the full cluster: more CTAs keep more loads in flight, and one kernel per
    dtype pair."""
    per_cta = -(-nc // size)
    if per_cta > per_thread * _bwd_threads(op, size):
        return None
    return round_up(max(-(-per_cta // per_thread), min(per_cta, PREFERRED_THREADS)), 32)


def _shared_rows_plan(ks, op, n, size):
    """(plan, the bytes of its accumulators) of the staged kernel that keeps x, g and the
    dw (db) accumulators in shared memory, in one CTA (``size`` 1) or a cluster of
    SHARED_ROWS_CLUSTER CTAs, for a row of n elements; None where one stage and the
    accumulators do not fit a CTA's shared memory, or no such cluster can be resident."""
    nc = n // ks.ch
    threads = _cluster_threads(op, nc, SHARED_ROWS_ELEMS // ks.ch, size)
    if threads is None:
        return None
    acc_bytes = SHARED_ROWS_ELEMS * threads * 4 * (2 if op == "layer_norm" else 1)
    shared = -(-nc // size) * ks.chunk_bytes + acc_bytes
    plan = Plan.of(ks.staged["shared" if size == 1 else size], (1,), (threads,),
                   cluster=(size, 1, 1) if size > 1 else None)
    if shared > plan.kernel.max_dynamic_shared or size > 1 and not (
            plan.kernel.max_active_clusters(plan.cluster, plan.block, shared)):
        return None
    return plan, acc_bytes


def _norm_bwd_plan(ks, op, x_dtype, rows, n, views):
    """(plan without its grid, cluster size, stages): the staged kernel where the row's
    chunks fit the registers of one CTA (or, for SHARED_ONE_CTA, its shared memory), else
    the shared memory of one CTA, or on sm_90 the registers of a cluster of MAX_CLUSTER
    CTAs, or the shared memory of a cluster of SHARED_ROWS_CLUSTER; else the streaming
    kernel."""
    codec = CODECS[x_dtype]
    threads, cache_chunks, smem = row_plan(codec, *views, vec=ks.ch, per_thread=ks.per_thread,
                                           vec_bytes=ks.chunk_bytes)
    size, shared = 1, None
    if cache_chunks < 0:  # one CTA's registers hold the row
        if (n >= SHARED_ONE_CTA_MIN and x_dtype != F32
                and (op, views[1].dtype == F32) in SHARED_ONE_CTA):
            shared = _shared_rows_plan(ks, op, n, 1)
    elif n % ks.ch == 0 and rows_aligned(*views):
        shared = _shared_rows_plan(ks, op, n, 1)
        if shared is None and compute_capability() >= (9, 0):
            cluster = _cluster_threads(op, n // ks.ch, ks.cluster_per_thread)
            if cluster is not None:
                size, threads = MAX_CLUSTER, cluster
            else:
                shared = _shared_rows_plan(ks, op, n, SHARED_ROWS_CLUSTER)
                size = 1 if shared is None else SHARED_ROWS_CLUSTER
    if shared is None and size == 1 and cache_chunks >= 0:
        return Plan.of(ks.streaming, (1,), (threads,), smem), 1, 1
    plan, acc_bytes = shared or (Plan.of(ks.staged[size], (1,), (threads,),
                                         cluster=(size, 1, 1) if size > 1 else None), 0)
    stage_bytes = -(-(n // ks.ch) // size) * ks.chunk_bytes
    # Two stages where they fit, but one for RMSNorm in one CTA. H100, [16384, 8192], µs
    # with one / two: rms_norm f16 343 / 360, f32 601 / 654; layer_norm f16 392 / 361,
    # f32 676 / 662; at [2048, 65536] (clusters) two won everywhere (rms_norm f32 914 / 795).
    # One CTA keeping its row in shared memory takes one stage, the next row's chunks
    # copied one by one as they are read (rms_norm f16 309 / 320, layer_norm f16 with a
    # float32 gradient 526 / 612).
    stages = 2 if 2 * stage_bytes + acc_bytes <= plan.kernel.max_dynamic_shared and (
        op == "layer_norm" or size > 1) and not (shared and size == 1) else 1
    if stages == 2 and shared and not plan.kernel.max_active_clusters(
            plan.cluster, plan.block, 2 * stage_bytes + acc_bytes):
        stages = 1  # (_shared_rows_plan checked that a cluster fits with one stage)
    return plan._replace(shared_mem=stages * stage_bytes + acc_bytes), size, stages


def _norm_bwd_launch(op, kernel_op, names, grad, x, weight, grad_extra, eps, dx, dw, db=None):
    """One wave of blocks, each over a fixed set of rows with its partial dw (db) in a row
    of a [P, n] workspace (the outputs themselves when P = 1); then the P partials summed
    by the column reduction (module doc)."""
    g_name, x_name, extra_name = names
    x2 = rows_view(op, x_name, x)
    g2 = rows_view(op, g_name, grad)
    dx2 = rows_view(op, "out[0]", dx)
    e2 = g2 if grad_extra is None else rows_view(op, extra_name, grad_extra)
    rows, n = x2.shape
    w2 = _weight_row(weight, n)
    ks = _BWD_KERNELS[kernel_op, x.dtype, grad.dtype]
    plan, size, stages = _norm_bwd_plan(ks, kernel_op, x.dtype, rows, n,
                                        (x2, g2, e2, dx2, w2))
    if size > 1:
        blocks = min(rows, plan.kernel.max_active_clusters(plan.cluster, plan.block,
                                                           plan.shared_mem))
    else:
        blocks = min(rows, multiprocessor_count(x.device_id)
                     * _resident_blocks(plan.kernel, plan.block[0], plan.shared_mem))
    finals = (dw,) if db is None else (dw, db)
    if blocks == 1:
        parts = [d._view((1, n), (n * 4, 4)) for d in finals]
    else:
        parts = [empty((blocks, n), F32) for _ in finals]
    cache_chunks = plan.shared_mem // ks.chunk_bytes if plan.kernel.kdef is ks.streaming else -1
    plan._replace(grid=(blocks * size,)).launch(
        x2, g2, w2, e2, dx2, parts[0], parts[-1], n, eps, int(db is not None),
        int(grad_extra is not None), cache_chunks, stages)
    if blocks > 1:
        for part, final in zip(parts, finals):
            reduce_fwd("sum", part, 0, out=final)


def rms_norm_bwd(grad, x, weight, eps=1e-6, *, out=None):
    """Backward of :func:`rms_norm`: ``(dx, dweight)`` for the output gradient ``grad``.

    dx = rstd·(dy − x̂·mean(dy·x̂)) with x̂ = x·rstd, dy = grad·weight; dweight =
    Σ_rows grad·x̂ (float32, deterministic). Statistics recomputed from x.

    Parameters
    ----------
    grad : DeviceArray or array_like
        The gradient of the output: x's shape, x's dtype or float32.
    x, weight : DeviceArray or array_like
        The forward's inputs.
    eps : float, optional
        The forward's ``eps``.
    out : tuple of DeviceArray, optional
        (dx, dweight) to write: dx of x's shape in grad's dtype, dweight float32.

    Returns
    -------
    dx : DeviceArray
        In x's shape and grad's dtype.
    dweight : DeviceArray
        In float32, shape (x.shape[-1],).

    Raises
    ------
    TypeError
        The forward's type checks; a ``grad`` dtype other than x's or float32; an ``out``
        that is not a pair of device arrays of those dtypes.
    ValueError
        The forward's shape and layout checks; a ``grad`` of another shape; ``out``
        arrays of other shapes.

    Examples
    --------
    >>> x = kaionb.asarray([[3.0, 4.0]], dtype=np.float32)
    >>> w = kaionb.ones(2, dtype=np.float32)
    >>> dx, dw = kaionb.rms_norm_bwd(kaionb.ones_like(x), x, w)
    >>> dx.shape, dw.shape, dw.dtype
    ((1, 2), (2,), dtype('float32'))
    """
    return _norm_bwd("rms_norm_bwd", "rms_norm", ("grad", "x", "grad_residual"), grad, x,
                     weight, None, None, eps, out)


def layer_norm_bwd(grad, x, weight, bias=None, eps=1e-5, *, out=None):
    """Backward of :func:`layer_norm`: ``(dx, dweight, dbias)`` for the output gradient.

    dx = rstd·(dy − mean(dy) − x̂·mean(dy·x̂)); dweight = Σ_rows grad·x̂, dbias =
    Σ_rows grad (float32, deterministic). dtypes as :func:`rms_norm_bwd`.

    Parameters
    ----------
    grad : DeviceArray or array_like
        The gradient of the output: x's shape, x's dtype or float32.
    x, weight : DeviceArray or array_like
        The forward's inputs.
    bias : DeviceArray, optional
        The forward's bias, or None (only its presence and shape are read).
    eps : float, optional
        The forward's ``eps``.
    out : tuple of DeviceArray, optional
        (dx, dweight[, dbias]) to write.

    Returns
    -------
    dx : DeviceArray
        In x's shape and grad's dtype.
    dweight : DeviceArray
        In float32, shape (x.shape[-1],).
    dbias : DeviceArray or None
        In float32, shape (x.shape[-1],); None when ``bias`` is None.

    Raises
    ------
    TypeError
        The forward's type checks; a ``grad`` dtype other than x's or float32; an ``out``
        that is not a tuple of device arrays of those dtypes.
    ValueError
        The forward's shape and layout checks; a ``grad`` of another shape; ``out``
        arrays of other shapes.

    Examples
    --------
    >>> x = kaionb.asarray([[3.0, 4.0]], dtype=np.float32)
    >>> w = kaionb.ones(2, dtype=np.float32)
    >>> dx, dw, db = kaionb.layer_norm_bwd(kaionb.ones_like(x), x, w)
    >>> dx.shape, db is None
    ((1, 2), True)
    """
    result = _norm_bwd("layer_norm_bwd", "layer_norm", ("grad", "x", "grad_residual"), grad,
                       x, weight, bias, None, eps, out)
    return result if bias is not None else (*result, None)


def add_rms_norm_bwd(grad, grad_residual, s, weight, eps=1e-6, *, out=None):
    """Backward of :func:`add_rms_norm`: ``(ds, dweight)`` from its saved sum ``s``.

    ds = grad_residual + rms_norm's dx(s, grad) is the gradient of both x and residual;
    ``s`` is the forward's second result (the residual_out).

    Parameters
    ----------
    grad : DeviceArray or array_like
        The gradient of the normed output: s's shape, s's dtype or float32.
    grad_residual : DeviceArray or None
        The gradient of s (None: zero); grad's dtype and shape.
    s : DeviceArray or array_like
        The forward's sum ``x + residual``.
    weight : DeviceArray or array_like
        The forward's weight.
    eps : float, optional
        The forward's ``eps``.
    out : tuple of DeviceArray, optional
        (ds, dweight) to write.

    Returns
    -------
    ds : DeviceArray
        In s's shape and grad's dtype: the gradient of x and of residual.
    dweight : DeviceArray
        In float32, shape (s.shape[-1],).

    Raises
    ------
    TypeError
        :func:`rms_norm_bwd`'s type checks, and a ``grad_residual`` of another dtype.
    ValueError
        :func:`rms_norm_bwd`'s shape checks, a ``grad_residual`` of another shape, or an
        ``eps`` that is not finite and > 0.

    Examples
    --------
    >>> x = kaionb.asarray([[1.0, 2.0]], dtype=np.float32)
    >>> w = kaionb.ones(2, dtype=np.float32)
    >>> normed, s = kaionb.add_rms_norm(x, x, w)
    >>> ds, dw = kaionb.add_rms_norm_bwd(kaionb.ones_like(s), None, s, w)
    >>> ds.shape, dw.shape
    ((1, 2), (2,))
    """
    return _norm_bwd("add_rms_norm_bwd", "rms_norm", ("grad", "s", "grad_residual"), grad, s,
                     weight, None, grad_residual, eps, out)


# -- references ------------------------------------------------------------------------------

def _f64(*arrays):
    return [None if a is None else np.asarray(a, np.float64) for a in arrays]


def _rows_sum(a, n):
    return a.reshape(-1, n).sum(axis=0)


def rms_norm_ref(x, weight, eps=1e-6):
    """float64 NumPy reference."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(weight,
                                                                                  np.float64)


def layer_norm_ref(x, weight, bias=None, eps=1e-5):
    """float64 NumPy reference (biased variance)."""
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps) * np.asarray(weight, np.float64)
    return y if bias is None else y + np.asarray(bias, np.float64)


def add_rms_norm_ref(x, residual, weight, eps=1e-6):
    """float64 NumPy reference: (normed, s), s = x + residual rounded once to the inputs'
    dtype (as the kernel stores it) and normed computed from that rounded s."""
    dtype = np.asarray(x).dtype
    s = (np.asarray(x, np.float64) + np.asarray(residual, np.float64)).astype(dtype)
    return rms_norm_ref(s, weight, eps), s.astype(np.float64)


def rms_norm_bwd_ref(grad, x, weight, eps=1e-6):
    """float64 NumPy reference: (dx, dweight)."""
    g, x, w = _f64(grad, x, weight)
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xh = x * rstd
    dy = g * w
    dx = rstd * (dy - xh * np.mean(dy * xh, axis=-1, keepdims=True))
    return dx, _rows_sum(g * xh, x.shape[-1])


def layer_norm_bwd_ref(grad, x, weight, bias=None, eps=1e-5):
    """float64 NumPy reference: (dx, dweight, dbias); dbias None without a bias."""
    g, x, w = _f64(grad, x, weight)
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xh = (x - mean) * rstd
    dy = g * w
    dx = rstd * (dy - dy.mean(axis=-1, keepdims=True)
                 - xh * np.mean(dy * xh, axis=-1, keepdims=True))
    n = x.shape[-1]
    return dx, _rows_sum(g * xh, n), None if bias is None else _rows_sum(g, n)


def add_rms_norm_bwd_ref(grad, grad_residual, s, weight, eps=1e-6):
    """float64 NumPy reference: (ds, dweight) — ds is the gradient of x and of residual."""
    ds, dw = rms_norm_bwd_ref(grad, s, weight, eps)
    return (ds if grad_residual is None else ds + np.asarray(grad_residual, np.float64)), dw


# -- public ----------------------------------------------------------------------------------

def _recording(*inputs) -> bool:
    """Whether this call goes on a tape: a DeviceArray input needs a gradient and a tape
    is active (in that order: a call without gradients pays a type test per input)."""
    for a in inputs:
        if type(a) is DeviceArray and a.requires_grad:
            return active_tape() is not None
    return False


def _check_recordable(op, outputs, **inputs):
    """Before a recorded call: an ``out`` written over an input would leave the backward
    (and the tape, which tells arrays apart by identity) reading the result instead."""
    for oname, o in outputs.items():
        if o is None:
            continue
        o = as_array(op, oname, o)
        for iname, a in inputs.items():
            if type(a) is DeviceArray and _overlap(o, a):
                fail(ValueError, op, oname, f"memory apart from '{iname}' while a tape "
                     "records (the backward reads it)", "an output written over it")


def rms_norm(x, weight, eps=1e-6, *, out=None):
    """RMSNorm over the last axis: ``x / sqrt(mean(x²) + eps) * weight``.

    Statistics in float32. Recorded on the active ``kaionb.grad.Tape`` when x or weight
    requires a gradient (:func:`rms_norm_bwd`); ``out`` must not overwrite the inputs
    then.

    Parameters
    ----------
    x : DeviceArray or array_like
        An array of float32, float16 or bfloat16, any leading shape, last axis contiguous
        (leading axes must collapse into one row stride).
    weight : DeviceArray or array_like
        Shape (x.shape[-1],), x's dtype.
    eps : float, optional
        Added to the mean square (finite, > 0).
    out : DeviceArray, optional
        An array of x's shape and dtype to write (may be ``x``).

    Returns
    -------
    DeviceArray
        A new array, or ``out``.

    Raises
    ------
    TypeError
        ``x`` that is not a float32 / float16 / bfloat16 array, a ``weight`` of another
        dtype, an ``eps`` that is not a number, or an ``out`` that is not device memory
        or has another dtype.
    ValueError
        A non-contiguous last axis, leading axes that do not collapse into one row
        stride, a ``weight`` of another shape, an ``eps`` that is not finite and > 0, or
        an ``out`` of another shape.

    Examples
    --------
    >>> x = kaionb.asarray([[3.0, 4.0]], dtype=np.float32)
    >>> w = kaionb.ones(2, dtype=np.float32)
    >>> kaionb.rms_norm(x, w).get().round(4)
    array([[0.8485, 1.1314]], dtype=float32)
    """
    recording = _recording(x, weight)
    if recording:
        _check_recordable("rms_norm", {"out": out}, x=x, weight=weight)
    y = rms_norm_fwd(x, weight, eps, out=out)
    if recording:
        record(lambda g: rms_norm_bwd(g, x, weight, eps), (x, weight), (y,))
    return y


def layer_norm(x, weight, bias=None, eps=1e-5, *, out=None):
    """LayerNorm over the last axis: ``(x − mean) / sqrt(var + eps) * weight + bias``.

    Biased variance, as torch.nn.functional.layer_norm; statistics in float32. Same
    layouts as :func:`rms_norm`. On the tape (:func:`layer_norm_bwd`).

    Parameters
    ----------
    x : DeviceArray or array_like
        An array of float32, float16 or bfloat16, any leading shape, last axis contiguous.
    weight : DeviceArray or array_like
        Shape (x.shape[-1],), x's dtype.
    bias : DeviceArray or array_like, optional
        Shape (x.shape[-1],), x's dtype; None for no bias.
    eps : float, optional
        Added to the variance (finite, > 0).
    out : DeviceArray, optional
        An array of x's shape and dtype to write.

    Returns
    -------
    DeviceArray
        A new array, or ``out``.

    Raises
    ------
    TypeError
        ``x`` that is not a float32 / float16 / bfloat16 array, a ``weight`` or ``bias``
        of another dtype, an ``eps`` that is not a number, or an ``out`` that is not
        device memory or has another dtype.
    ValueError
        A non-contiguous last axis, leading axes that do not collapse into one row
        stride, a ``weight`` or ``bias`` of another shape, an ``eps`` that is not finite
        and > 0, or an ``out`` of another shape.

    Examples
    --------
    >>> x = kaionb.asarray([[3.0, 4.0]], dtype=np.float32)
    >>> w = kaionb.ones(2, dtype=np.float32)
    >>> kaionb.layer_norm(x, w).get().round(4)
    array([[-1.,  1.]], dtype=float32)
    """
    recording = _recording(x, weight, bias)
    if recording:
        _check_recordable("layer_norm", {"out": out}, x=x, weight=weight, bias=bias)
    y = layer_norm_fwd(x, weight, bias, eps, out=out)
    if recording:
        inputs = (x, weight) if bias is None else (x, weight, bias)
        record(lambda g: layer_norm_bwd(g, x, weight, bias, eps), inputs, (y,))
    return y


def add_rms_norm(x, residual, weight, eps=1e-6, *, out=None, residual_out=None):
    """Add the residual and RMS-normalize in one pass: ``s = x + residual``, ``rms_norm(s)``.

    The pre-norm residual step: ``s = x + residual`` and ``rms_norm(s, weight, eps)``;
    returns ``(normed, s)``.

    x, residual: the same shape and dtype (float32/float16/bfloat16, last axis
    contiguous); weight: (x.shape[-1],), that dtype. s is rounded to the dtype, and normed
    is computed from the rounded s (as ``rms_norm(x + residual)`` unfused; vLLM's
    fused_add_rms_norm does the same). ``residual_out`` may be ``residual`` itself (the
    residual stream updated in place, as vLLM does) and ``out`` may be ``x``. Reads x,
    residual and weight, writes s and normed: 4 passes over the row's bytes.

    On the tape (:func:`add_rms_norm_bwd`; the gradient of x and of residual is the same
    ds); there the outputs must not overwrite the inputs, and the backward reads s as it
    is when the backward runs.

    Parameters
    ----------
    x, residual : DeviceArray or array_like
        The same shape and dtype (float32, float16 or bfloat16), last axis contiguous.
    weight : DeviceArray or array_like
        Shape (x.shape[-1],), x's dtype.
    eps : float, optional
        Added to the mean square (finite, > 0).
    out : DeviceArray, optional
        Where to write ``normed`` (may be ``x``).
    residual_out : DeviceArray, optional
        Where to write ``s`` (may be ``residual``: the residual stream updated in place);
        not the same memory as ``out``.

    Returns
    -------
    normed : DeviceArray
        ``rms_norm(s, weight, eps)``.
    s : DeviceArray
        ``x + residual`` rounded to the dtype.

    Raises
    ------
    TypeError
        ``x`` that is not a float32 / float16 / bfloat16 array, a ``residual`` or
        ``weight`` of another dtype, or an ``out`` / ``residual_out`` that is not device
        memory or has another dtype.
    ValueError
        ``residual`` or ``weight`` of another shape, a non-contiguous last axis, an
        ``eps`` that is not finite and > 0, ``residual_out`` sharing memory with ``out``,
        or (on the tape) outputs that overwrite the inputs.

    Examples
    --------
    >>> x = kaionb.asarray([[1.0, 2.0]], dtype=np.float32)
    >>> r = kaionb.asarray([[2.0, 2.0]], dtype=np.float32)
    >>> normed, s = kaionb.add_rms_norm(x, r, kaionb.ones(2, dtype=np.float32))
    >>> s.get(), normed.get().round(4)
    (array([[3., 4.]], dtype=float32), array([[0.8485, 1.1314]], dtype=float32))
    """
    recording = _recording(x, residual, weight)
    if recording:
        _check_recordable("add_rms_norm", {"out": out, "residual_out": residual_out}, x=x,
                          residual=residual, weight=weight)
    normed, s = add_rms_norm_fwd(x, residual, weight, eps, out=out, residual_out=residual_out)
    if recording:
        def backward(g_normed, g_s):
            ds, dw = add_rms_norm_bwd(g_normed, g_s, s, weight, eps)
            return ds, ds, dw

        record(backward, (x, residual, weight), (normed, s))
    return normed, s
