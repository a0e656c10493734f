"""RMSNorm and LayerNorm over the last axis.

    rms_norm:   y = x / sqrt(mean(x²) + eps) · w                  (Zhang & Sennrich 2019,
                https://arxiv.org/abs/1910.07467)
    layer_norm: y = (x − mean(x)) / sqrt(var(x) + eps) · w + b    (Ba et al. 2016,
                https://arxiv.org/abs/1607.06450; biased variance, as PyTorch)

Memory-bound: the floor is one read of x and one write of y (w and b stay in L2). One
block per row. Aligned rows of up to 32768 elements stay in registers between the
statistics and the output: one pass over HBM. Wider or misaligned rows stream twice, the
first 96 KiB of the row parked in shared memory and the rest re-read (from L2 when the
row is recent). Statistics accumulate in float32: the register path takes the variance
around the mean in a second sweep over registers; the streaming path from sums shifted by
the row's first element (exact up to rounding unless that element lies many standard
deviations from the mean).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, int64, uint32

from ..ptx_patches import (
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
)
from .helpers import block_sum
from .helpers.rowwise import (
    CODECS,
    FLOAT_DTYPES,
    MAX_THREADS,
    WIDE_CACHE_BYTES,
    row_plan,
    rows_view,
)
from .launch import kernel
from .op import Plan, fast_path, output, run


def _make_norm_kernel(op, codec, name):
    """One block per row. ``cache_vecs < 0``: the row is 16-byte aligned and fits in
    registers (REG_VECS words4 per thread): one pass over HBM. Otherwise the streaming
    path: pass 1 takes the statistics and parks the first ``cache_vecs`` words4 in shared
    memory, pass 2 normalizes from there or re-reads (an L2 hit when the row is recent)."""
    VEC = codec.vec
    S = codec.storage
    load, store, head_of, unpack, pack, decode = (codec.load, codec.store, codec.head,
                                                  codec.unpack, codec.pack, codec.decode)
    LAYER_NORM = op == "layer_norm"
    REG_VECS = codec.reg_vecs
    RAW = 4 * REG_VECS
    U = 3  # words4 loads of x in flight per thread in streaming pass 1 (4 spilled 8 bytes on sm_89)
    U2 = 2  # ... of x, w and b in pass 2 (4 spilled under the 64-register cap)
    RAW2 = 4 * U2

    @kernel([f"void({S}[:, :], {S}[:, :], {S}[:, :], {S}[:, :], int32, float32, int32, int32)"],
            name=name, max_dynamic_shared_bytes=WIDE_CACHE_BYTES, launch_bounds=MAX_THREADS)
    def _norm_fwd_kernel(x, w, b, out, n, eps, has_bias, cache_vecs):
        scratch = cuda.shared.array(32, float32)
        cache = cuda.shared.array(0, uint32)
        raw = cuda.local.array(RAW, uint32)
        f = cuda.local.array(VEC, float32)
        g = cuda.local.array(VEC, float32)
        rw = cuda.local.array(RAW2, uint32)
        rb = cuda.local.array(RAW2, uint32)
        r = int32(cuda.blockIdx.x)
        t = int32(cuda.threadIdx.x)
        T = int32(cuda.blockDim.x)
        inv_n = float32(1.0) / float32(n)
        mean = float32(0.0)
        if cache_vecs < 0:
            # Registers: every words4 is whole and aligned; no masks but v < nv.
            nv = n // VEC
            acc = float32(0.0)
            for k in range(REG_VECS):
                v = t + k * T
                words = (uint32(0), uint32(0), uint32(0), uint32(0))
                if v < nv:
                    words = ld_global_nc_v4_u32(global_addr(x, (int64(r), int64(v * VEC))))
                for i in range(4):
                    raw[4 * k + i] = words[i]
                unpack(words, f, 0)
                for j in range(VEC):
                    acc += f[j] if LAYER_NORM else f[j] * f[j]
            if LAYER_NORM:
                # Second sweep over registers: var = mean((x − mean)²); padding excluded.
                mean = block_sum(acc, scratch) * inv_n
                acc = float32(0.0)
                for k in range(REG_VECS):
                    if t + k * T < nv:
                        unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]),
                               f, 0)
                        for j in range(VEC):
                            d = f[j] - mean
                            acc += d * d
            rstd = rsqrt_approx_f32(block_sum(acc, scratch) * inv_n + eps)
            for k in range(REG_VECS):
                v = t + k * T
                if v < nv:
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
            return
        head = head_of(x, r)
        nv = (head + n + VEC - 1) // VEC
        # LayerNorm sums are shifted by the first element; masked elements read as it
        # (LayerNorm) or 0 (RMSNorm) and add nothing.
        first = x[r, 0]
        shift = decode(first) if LAYER_NORM else float32(0.0)
        fill = first if LAYER_NORM else 0
        s1 = float32(0.0)
        s2 = float32(0.0)
        for v0 in range(t, nv, U * T):
            for u in range(U):
                v = v0 + u * T
                if v < nv:
                    words = load(x, r, v * VEC - head, n, fill)
                    for i in range(4):
                        raw[4 * u + i] = words[i]
            for u in range(U):
                v = v0 + u * T
                if v < nv:
                    words = (raw[4 * u], raw[4 * u + 1], raw[4 * u + 2], raw[4 * u + 3])
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

    return _norm_fwd_kernel


_KERNELS = {(op, dt): _make_norm_kernel(op, codec, f"_{op}_fwd_kernel_{dt.name}")
            for op in ("rms_norm", "layer_norm") for dt, codec in CODECS.items()}


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
    w2 = weight._view((1, n), (0, weight.itemsize))
    b2 = w2 if bias is None else bias._view((1, n), (0, bias.itemsize))
    threads, cache_vecs, smem = row_plan(CODECS[x.dtype], x2, out2, w2, b2)
    Plan.of(_KERNELS[op, x.dtype], (rows,), (threads,), smem).launch(
        x2, w2, b2, out2, n, eps, int(bias is not None), cache_vecs)


def rms_norm_fwd(x, weight, eps=1e-6, *, out=None):
    return _norm_fwd("rms_norm", x, weight, None, eps, out)


def layer_norm_fwd(x, weight, bias=None, eps=1e-5, *, out=None):
    return _norm_fwd("layer_norm", x, weight, bias, eps, out)


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


def rms_norm(x, weight, eps=1e-6, *, out=None):
    """RMSNorm over the last axis: ``x / sqrt(mean(x²) + eps) * weight``.

    x: float32/float16/bfloat16, any leading shape, last axis contiguous (leading axes
    must collapse into one row stride). weight: shape (x.shape[-1],), x's dtype.
    Statistics in float32. Returns a new array, or writes ``out``.
    """
    return rms_norm_fwd(x, weight, eps, out=out)


def layer_norm(x, weight, bias=None, eps=1e-5, *, out=None):
    """LayerNorm over the last axis: ``(x − mean) / sqrt(var + eps) * weight + bias``
    (biased variance, as torch.nn.functional.layer_norm). Same layouts as :func:`rms_norm`;
    ``bias`` is optional."""
    return layer_norm_fwd(x, weight, bias, eps, out=out)
