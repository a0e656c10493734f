"""Numerically stable softmax over the last axis.

    y_i = exp(x_i − m) / Σ_j exp(x_j − m),   m = max_j x_j

Exponentials are ``ex2.approx`` of (x − m)·log2(e) (~2 ulp), in float32; subtracting
first keeps the argument exact near the maximum (x·log2(e) − m·log2(e) would be fused
into an fma whose rounding residual, ~1e-3 at logits of 1e4, lands in every output). Rows too wide for
registers use the online form (Milakov & Gimelshein 2018, https://arxiv.org/abs/1805.02867):
each thread keeps a running maximum m and a sum s rescaled by exp(m_old − m_new) whenever
the maximum grows, and the block merges the (m, s) pairs.

A row of all −inf has no maximum to subtract: (−inf) − (−inf) is NaN and the whole row
comes out NaN, as torch.softmax gives.

Same layout and paths as :mod:`kaionb.kernels.norms`: one block per row, rows of up to
32768 aligned elements held in registers (one pass over HBM), wider or misaligned rows
streamed twice with the first 96 KiB of the row parked in shared memory.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, int64, uint32

from ..ptx_patches import (
    ex2_approx_f32,
    global_addr,
    ld_global_nc_v4_u32,
    ld_shared_v4_u32,
    rcp_approx_f32,
    shared_addr,
    st_global_v4_u32,
    st_shared_v4_u32,
)
from ..validation import as_array, check_contiguous, check_ndim, fail
from .helpers import block_max, block_sum
from .helpers.rowwise import (
    CODECS,
    FLOAT_DTYPES,
    MAX_THREADS,
    NEG_INF_BITS,
    WIDE_CACHE_BYTES,
    row_plan,
    rows_view,
)
from .launch import kernel
from .op import Plan, fast_path, output, run

LOG2E = 1.4426950408889634


def _make_softmax_kernel(codec, name):
    """One block per row; ``cache_vecs < 0`` selects the register path (see norms)."""
    VEC = codec.vec
    S = codec.storage
    load, store, head_of, unpack, pack = (codec.load, codec.store, codec.head, codec.unpack,
                                         codec.pack)
    NEG_INF = NEG_INF_BITS[codec.dtype]
    REG_VECS = codec.reg_vecs
    RAW = 4 * REG_VECS
    U = 4  # words4 loads in flight per thread per streaming step

    @kernel([f"void({S}[:, :], {S}[:, :], int32, int32)"], name=name,
            max_dynamic_shared_bytes=WIDE_CACHE_BYTES, launch_bounds=MAX_THREADS)
    def _softmax_fwd_kernel(x, out, n, cache_vecs):
        scratch = cuda.shared.array(32, float32)
        cache = cuda.shared.array(0, uint32)
        raw = cuda.local.array(RAW, uint32)
        f = cuda.local.array(VEC, float32)
        r = int32(cuda.blockIdx.x)
        t = int32(cuda.threadIdx.x)
        T = int32(cuda.blockDim.x)
        L = float32(LOG2E)
        neg_inf = float32(-np.inf)
        if cache_vecs < 0:
            nv = n // VEC
            m = neg_inf
            for k in range(REG_VECS):
                v = t + k * T
                words = (uint32(NEG_INF), uint32(NEG_INF), uint32(NEG_INF), uint32(NEG_INF))
                if v < nv:
                    words = ld_global_nc_v4_u32(global_addr(x, (int64(r), int64(v * VEC))))
                for i in range(4):
                    raw[4 * k + i] = words[i]
                unpack(words, f, 0)
                for j in range(VEC):
                    m = max(m, f[j])
            m = block_max(m, scratch)
            s = float32(0.0)
            for k in range(REG_VECS):
                if t + k * T < nv:
                    unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]), f, 0)
                    for j in range(VEC):
                        s += ex2_approx_f32((f[j] - m) * L)
            inv = rcp_approx_f32(block_sum(s, scratch))
            for k in range(REG_VECS):
                v = t + k * T
                if v < nv:
                    unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]), f, 0)
                    for j in range(VEC):
                        f[j] = ex2_approx_f32((f[j] - m) * L) * inv
                    st_global_v4_u32(global_addr(out, (int64(r), int64(v * VEC))), pack(f, 0))
            return
        head = head_of(x, r)
        nv = (head + n + VEC - 1) // VEC
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

    return _softmax_fwd_kernel


_KERNELS = {dt: _make_softmax_kernel(codec, f"_softmax_fwd_kernel_{dt.name}")
            for dt, codec in CODECS.items()}


@fast_path
def softmax_fwd(x, axis=-1, *, out=None):
    """Validate and resolve ``out``; launch unless x is empty. Returns ``out``."""
    op = "softmax"
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    check_ndim(op, "x", x, (1, None))
    if axis not in (-1, x.ndim - 1):
        fail(ValueError, op, "axis", "-1 (the last axis; move the axis last first)", axis)
    check_contiguous(op, "x", x, last_axis_only=True)
    out = output(op, out, x.shape, x.dtype, device=x.device_id)
    return run(_softmax_launch, x, out=out)


def _softmax_launch(x, out):
    """The register or the streaming path (module doc), as ``row_plan`` chooses."""
    x2 = rows_view("softmax", "x", x)
    out2 = rows_view("softmax", "out", out)
    rows, n = x2.shape
    threads, cache_vecs, smem = row_plan(CODECS[x.dtype], x2, out2)
    Plan.of(_KERNELS[x.dtype], (rows,), (threads,), smem).launch(x2, out2, n, cache_vecs)


def softmax_ref(x, axis=-1):
    """float64 NumPy reference; an all −inf row gives NaN (as torch.softmax)."""
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def softmax(x, axis=-1, *, out=None):
    """Softmax over the last axis (``axis`` must name it), float32 arithmetic.

    x: float32/float16/bfloat16, any leading shape, last axis contiguous. A row of all
    −inf gives a row of NaN, as torch.softmax does.
    """
    return softmax_fwd(x, axis, out=out)
