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

Two launches: an absmax reduction (block maxima merged with an atomic max on the float
bits, which order like the floats for values ≥ 0) into a zeroed buffer, then the
element-wise pass, which also writes the scales. Rounding is half-to-even through the
2^23 + 2^22 trick (exact for |v| ≤ 2^22; v is clipped to ±127 first). q = rint(x · (127 /
max)) in float32 can differ by one step from the float64 reference at exact ties.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, int64, uint32

from ..array import normalize_dtype, zeros
from ..validation import as_array, check_contiguous, check_same_device, fail
from .helpers import block_max
from .helpers.int8 import QMAX, inverse_scale, quantize_value
from .helpers.rowwise import (
    CODECS,
    FLOAT_DTYPES,
    INT8,
    MAP_THREADS,
    f32_from_bits,
    f32_to_bits,
    flat_view,
    map_plan,
    rows_view,
)
from .launch import kernel
from .op import C_CONTIGUOUS, LAST_AXIS, Plan, fast_path, output, outputs, run

TENSOR, ROW, COL = 0, 1, 2
# Rows each block of the column absmax kernel folds before its atomic update.
COL_ROWS_PER_BLOCK = 64


def _make_absmax_kernel(codec, name):
    """amax[r if per_row else 0] = max |x[r, :]| (blocks over rows × chunks of a row)."""
    VEC = codec.vec
    S = codec.storage
    load, head_of, unpack = codec.load, codec.head, codec.unpack

    @kernel([f"void({S}[:, :], uint32[:], int64, int32)"], name=name)
    def _absmax_fwd_kernel(x, amax, n, per_row):
        scratch = cuda.shared.array(32, float32)
        f = cuda.local.array(VEC, float32)
        T = int64(cuda.blockDim.x)
        first = int64(cuda.blockIdx.x) * T + int64(cuda.threadIdx.x)
        stride = int64(cuda.gridDim.x) * T
        for r in range(int64(cuda.blockIdx.y), int64(x.shape[0]), int64(cuda.gridDim.y)):
            head = int64(head_of(x, r))
            nv = (head + n + VEC - 1) // VEC
            m = float32(0.0)
            for v in range(first, nv, stride):
                unpack(load(x, r, v * VEC - head, n, 0), f, 0)
                for j in range(VEC):
                    m = max(m, abs(f[j]))
            m = block_max(m, scratch)
            if cuda.threadIdx.x == 0:
                cuda.atomic.max(amax, r if per_row else 0, f32_to_bits(m))

    return _absmax_fwd_kernel


def _make_absmax_cols_kernel(codec, name):
    """amax[e] = max_r |x[r, e]|: each thread folds COL_ROWS_PER_BLOCK rows of one words4."""
    VEC = codec.vec
    S = codec.storage
    load, head_of, unpack = codec.load, codec.head, codec.unpack

    @kernel([f"void({S}[:, :], uint32[:], int32)"], name=name)
    def _absmax_cols_fwd_kernel(x, amax, n):
        f = cuda.local.array(VEC, float32)
        m = cuda.local.array(VEC, float32)
        v = int32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        rows = int32(x.shape[0])
        r0 = int32(cuda.blockIdx.y) * COL_ROWS_PER_BLOCK
        head = head_of(x, r0)
        e0 = v * VEC - head
        if e0 >= n:
            return
        for j in range(VEC):
            m[j] = float32(0.0)
        for r in range(r0, min(r0 + COL_ROWS_PER_BLOCK, rows)):
            unpack(load(x, r, e0, n, 0), f, 0)
            for j in range(VEC):
                m[j] = max(m[j], abs(f[j]))
        for j in range(VEC):
            if 0 <= e0 + j < n:
                cuda.atomic.max(amax, e0 + j, f32_to_bits(m[j]))

    return _absmax_cols_fwd_kernel


def _make_quantize_int8_kernel(codec, name):
    """q = rint(x · 127 / amax[group]), 16 elements (one int8 words4) per step; also
    writes scale = amax / 127 (each group's scale by the thread that owns its first
    element)."""
    VEC = codec.vec
    S = codec.storage
    SUB = 16 // VEC  # input words4 per int8 words4
    load, unpack = codec.load, codec.unpack
    q_head, q_store = INT8.head, INT8.store

    @kernel([f"void({S}[:, :], uint32[:], int8[:, :], float32[:], int64, int32)"], name=name)
    def _quantize_int8_fwd_kernel(x, amax, q, scale, n, mode):
        f = cuda.local.array(16, float32)
        w = cuda.local.array(4, uint32)
        T = int64(cuda.blockDim.x)
        first = int64(cuda.blockIdx.x) * T + int64(cuda.threadIdx.x)
        stride = int64(cuda.gridDim.x) * T
        for r in range(int64(cuda.blockIdx.y), int64(q.shape[0]), int64(cuda.gridDim.y)):
            head = int64(q_head(q, r))
            nv = (head + n + 15) // 16
            g = r if mode == ROW else int64(0)
            inv_g = inverse_scale(f32_from_bits(amax[g]))
            for v in range(first, nv, stride):
                e0 = v * 16 - head
                for s in range(SUB):
                    unpack(load(x, r, e0 + s * VEC, n, 0), f, s * VEC)
                for k in range(4):
                    w[k] = uint32(0)
                for j in range(16):
                    e = e0 + j
                    inv = inv_g
                    if mode == COL and 0 <= e < n:
                        inv = inverse_scale(f32_from_bits(amax[e]))
                        if r == 0:
                            scale[e] = f32_from_bits(amax[e]) * float32(1.0 / QMAX)
                    t = quantize_value(f[j], inv)
                    w[j // 4] |= (uint32(t) & uint32(0xFF)) << uint32(8 * (j % 4))
                q_store(q, r, e0, n, (w[0], w[1], w[2], w[3]))
                # The thread holding element 0 of the group's first row writes its scale.
                if mode != COL and e0 <= 0 and (mode == ROW or r == 0):
                    scale[g] = f32_from_bits(amax[g]) * float32(1.0 / QMAX)

    return _quantize_int8_fwd_kernel


def _make_dequantize_int8_kernel(codec, name):
    """out = q · scale[group], 16 elements (one int8 words4) per step."""
    VEC = codec.vec
    S = codec.storage
    SUB = 16 // VEC
    store, pack = codec.store, codec.pack
    q_head, q_load = INT8.head, INT8.load

    @kernel([f"void(int8[:, :], float32[:], {S}[:, :], int64, int32)"], name=name)
    def _dequantize_int8_fwd_kernel(q, scale, out, n, mode):
        f = cuda.local.array(16, float32)
        T = int64(cuda.blockDim.x)
        first = int64(cuda.blockIdx.x) * T + int64(cuda.threadIdx.x)
        stride = int64(cuda.gridDim.x) * T
        for r in range(int64(cuda.blockIdx.y), int64(q.shape[0]), int64(cuda.gridDim.y)):
            head = int64(q_head(q, r))
            nv = (head + n + 15) // 16
            sr = scale[r if mode == ROW else 0]
            for v in range(first, nv, stride):
                e0 = v * 16 - head
                words = q_load(q, r, e0, n, 0)
                for j in range(16):
                    b = int32(words[j // 4] << uint32(24 - 8 * (j % 4))) >> 24
                    s = sr
                    if mode == COL:
                        e = e0 + j
                        s = scale[min(max(e, 0), n - 1)]
                    f[j] = float32(b) * s
                for s in range(SUB):
                    store(out, r, e0 + s * VEC, n, pack(f, s * VEC))

    return _dequantize_int8_fwd_kernel


_FACTORIES = {
    "absmax": _make_absmax_kernel,
    "absmax_cols": _make_absmax_cols_kernel,
    "quantize_int8": _make_quantize_int8_kernel,
    "dequantize_int8": _make_dequantize_int8_kernel,
}
_KERNELS = {(name, dt): make(c, f"_{name}_fwd_kernel_{dt.name}")
            for name, make in _FACTORIES.items() for dt, c in CODECS.items()}


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
    amax = zeros(scale.size, np.uint32)
    if mode == COL:
        grid = (-(-(n // codec.vec + 2) // MAP_THREADS), -(-rows // COL_ROWS_PER_BLOCK))
        Plan.of(_KERNELS["absmax_cols", x.dtype], grid, (MAP_THREADS,)).launch(xv, amax, n)
    else:
        grid, _ = map_plan(codec, xv)
        Plan.of(_KERNELS["absmax", x.dtype], grid, (MAP_THREADS,)).launch(
            xv, amax, n, int(mode == ROW))
    grid, _ = map_plan(INT8, qv)
    Plan.of(_KERNELS["quantize_int8", x.dtype], grid, (MAP_THREADS,)).launch(
        xv, amax, qv, scale.reshape(-1), n, mode)


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
    out_dt = normalize_dtype(dtype, op)
    if out_dt not in FLOAT_DTYPES:
        fail(TypeError, op, "dtype", "float32, float16 or bfloat16", out_dt)
    out = output(op, out, q.shape, out_dt, device=q.device_id)
    return run(_dequantize_int8_launch, op, mode, q, scale, out=out)


def _dequantize_int8_launch(op, mode, q, scale, out):
    qv, ov = _views(op, mode, q=q, out=out)
    grid, _ = map_plan(INT8, qv)
    Plan.of(_KERNELS["dequantize_int8", out.dtype], grid, (MAP_THREADS,)).launch(
        qv, scale.reshape(-1), ov, qv.shape[1], mode)


def quantize_int8_ref(x, axis=None):
    """float64 NumPy reference: (q int8, scale float32)."""
    x = np.asarray(x, np.float64)
    mode, scale_shape = _mode("quantize_int8_ref", x.shape, axis)
    reduce_axes = None if mode == TENSOR else (1 if mode == ROW else tuple(range(x.ndim - 1)))
    amax = np.abs(x).max(axis=reduce_axes, keepdims=True)
    scale = amax / QMAX
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale > 0, np.rint(x / scale), 0.0)
    return np.clip(q, -QMAX, QMAX).astype(np.int8), scale.reshape(scale_shape).astype(np.float32)


def dequantize_int8_ref(q, scale, axis=None):
    """float64 NumPy reference."""
    q = np.asarray(q, np.float64)
    s = np.asarray(scale, np.float64)
    if axis is not None and s.ndim and (int(axis) % q.ndim) == 0 and q.ndim == 2:
        s = s[:, None]
    return q * s


def quantize_int8(x, axis=None, *, out=None):
    """Symmetric INT8 quantization: returns ``(q, scale)`` with q int8 of x's shape and
    scale float32 (shape () for axis=None, (x.shape[-1],) for axis=-1, (x.shape[0],) for
    axis=0 on 2-D x). ``x ≈ q * scale``. See the module doc for the axis convention."""
    return quantize_int8_fwd(x, axis, out=out)


def dequantize_int8(q, scale, axis=None, dtype=np.float32, *, out=None):
    """``q * scale`` as ``dtype`` (float32/float16/bfloat16); ``scale`` and ``axis`` as
    returned by / given to :func:`quantize_int8`."""
    return dequantize_int8_fwd(q, scale, axis, dtype, out=out)
