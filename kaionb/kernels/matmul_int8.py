"""INT8 W8A8 matmul: int8 activations times int8 weights, exact int32 sums, scaled into
float in the epilogue (SmoothQuant / LLM.int8()-style inference GEMM).

    C[m, n] = alpha · scale_a[m] · scale_b[n] · Σ_k A[m, k] · B[k, n]  +  bias[n]

``scale_a`` is one value or one per row of A (per token), ``scale_b`` one value or one
per column of B (per output channel); ``quantize_int8`` makes both (``axis=0`` of an
[M, K] activation and of an [N, K] weight). Any M, N, K ≥ 1.

The kernels are the matmul family's, with s8 operands (no copied mainloop):

- compute capability 9.0, shapes that fill the GPU: the wgmma kernel of
  :mod:`.matmul_hopper` (``wgmma ... k32.s32.s8.s8``, TMA, s32 accumulators scaled in
  registers by ``ptx_patches.dequantize_accumulator_s32``); needs 16-byte aligned rows
  (K % 16 == 0) and output rows (N % 8 == 0).
- otherwise the ``mma.sync m16n8k32`` kernels of :mod:`.matmul` (decode tiles with
  split-K for M ≤ 64), which scale the staged sums per chunk
  (``helpers.epilogue.dequantize_row_chunk8``).

Both read A and B K-major: A row-major [M, K], B as the ``w.T`` view of a row-major
[N, K] weight — how checkpoints store linear layers. A row-major [K, N] B is copied
into that layout first (one extra pass over the weight per call).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._device import compute_capability, multiprocessor_count
from .._tensor_map import tma_compatible
from ..array import DeviceArray
from ..validation import as_array, check_contiguous, check_same_device, fail
from . import matmul_hopper
from .helpers.epilogue import SCALE_NONE, SCALE_TENSOR, SCALE_VECTOR
from .matmul import _OUT_KIND, _copy_transposed, _launch_mma, _output, plan_operands
from .op import fast_path

_INT8, _F32 = (np.dtype(np.int8),), np.dtype(np.float32)
_BIAS_DTYPES = tuple(_OUT_KIND)
# M up to this runs the mma.sync decode tiles (weight streaming, split-K) on every GPU:
# at K = 8192, N = 28672 on the H100 they take 95-108 µs for M = 1-64, the wgmma kernel's
# 128-row tiles 139-184 µs (docs/performance.md).
DECODE_MAX_M = 64
# Hopper launch plans by the identity of every argument (address, shape, strides, dtype of
# each array; the scale values): a repeated call skips validation and planning (~90 µs of
# host time, more than the GPU time of a 2048³ int8 GEMM). Cluster launches cannot be
# replayed by the op fast path (kernels.op), hence this cache.
_HOPPER_PLANS: dict = {}
HOPPER_PLAN_CACHE = 256


def _identity(x):
    """The hashable identity of one argument, or None where it has none here."""
    if type(x) is DeviceArray:
        return (x.ptr, x.shape, x.strides, x.dtype, x.device)
    if type(x) in (float, int) or x is None:
        return (type(x), x)
    if type(x) is tuple:
        parts = tuple(_identity(v) for v in x)
        return None if None in parts else parts
    return None


def _scale(op: str, name: str, value, vector_shape: tuple | None):
    """(host factor, device array or None, SCALE_* mode) of one scale argument: a Python
    or NumPy number, a 0-d / 1-element float32 array (per tensor), or, where
    ``vector_shape`` is given, a float32 array of that shape (one per row / column)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value), None, SCALE_NONE
    expected = "a float or a float32 array of shape () (per tensor)" + (
        f" or {vector_shape}" if vector_shape else "")
    if isinstance(value, np.ndarray) and value.size == 1 and value.ndim <= 1:
        if value.dtype != _F32:
            fail(TypeError, op, name, "float32", value.dtype)
        return float(value.reshape(())), None, SCALE_NONE  # a host value: no device copy
    try:
        x = as_array(op, name, value)
    except TypeError:
        fail(TypeError, op, name, expected, type(value).__name__)
    if x.dtype != _F32:
        fail(TypeError, op, name, "dtype float32", x.dtype)
    if x.size == 1 and x.ndim <= 1:
        return 1.0, x.reshape(1), SCALE_TENSOR
    if vector_shape is None or x.shape != vector_shape:
        fail(ValueError, op, name, expected, f"shape {x.shape}")
    check_contiguous(op, name, x)
    return 1.0, x.reshape(-1), SCALE_VECTOR


@fast_path
def matmul_int8_fwd(op: str, a, b, scale, *, bias=None, out=None, dtype=None) -> DeviceArray:
    """Validate every argument (before any launch) and run ``a @ b`` scaled."""
    key = _identity((a, b, scale, bias))
    hit = None if key is None else _HOPPER_PLANS.get(key)
    if hit is not None:
        plan, dequant = hit
        result = _output(op, out, dtype, plan.shape, a, np.float32)
        if result.ptr % 16 == 0:  # else the long way: mma.sync takes any output
            matmul_hopper.run(plan, result, _OUT_KIND[result.dtype], dequant)
            return result
    a = as_array(op, "a", a, dtypes=_INT8)
    b = as_array(op, "b", b, dtypes=_INT8)
    check_same_device(op, a=a, b=b)
    if a.ndim < 1:
        fail(ValueError, op, "a", "an array [..., M, K]", "a 0-d array")
    if b.ndim != 2:
        fail(ValueError, op, "b", "a 2-D array [K, N]", f"shape {b.shape}")
    k, n = b.shape
    if a.shape[-1] != k:
        fail(ValueError, op, "b", f"{a.shape[-1]} rows (a is {a.shape}: inner dimensions "
             "must match)", f"shape {b.shape}")
    if k == 0:
        fail(ValueError, op, "a", "K ≥ 1", f"shape {a.shape}")
    rows_shape = a.shape[:-1]
    m = math.prod(rows_shape)
    if isinstance(scale, (tuple, list)):
        if len(scale) != 2:
            fail(ValueError, op, "scale", "a float, a 0-d array or a pair (scale_a, scale_b)",
                 f"a sequence of {len(scale)}")
        sa = _scale(op, "scale_a", scale[0], rows_shape)
        sb = _scale(op, "scale_b", scale[1], (n,))
    else:
        sa, sb = _scale(op, "scale", scale, None), (1.0, None, SCALE_NONE)
    for x in (sa[1], sb[1]):
        if x is not None:
            check_same_device(op, a=a, scale=x)
    if bias is not None:
        bias = as_array(op, "bias", bias, dtypes=_BIAS_DTYPES)
        check_same_device(op, a=a, bias=bias)
        if bias.shape != (n,):
            fail(ValueError, op, "bias", f"shape ({n},)", bias.shape)
        if bias.dtype != _F32 or not bias.is_c_contiguous:
            bias = bias.astype(np.float32)
    out = _output(op, out, dtype, rows_shape + (n,), a, np.float32)
    if out.size == 0:
        return out
    a2 = a.reshape(m, k)  # a batch of rows is one matrix (a view when contiguous)
    p = plan_operands(op, a2, b, ())
    if not (p.a_kmajor and p.b_kmajor):  # s8 tensor cores read K-major tiles only
        a3, lda, _ = (p.a, p.lda, True) if p.a_kmajor else _copy_transposed(p.a, False)
        b3, ldb, _ = (p.b, p.ldb, True) if p.b_kmajor else _copy_transposed(p.b, False)
        p = p._replace(a=a3, lda=lda, a_kmajor=True, b=b3, ldb=ldb, b_kmajor=True)
    if max(p.lda * m, p.ldb * n) >= 2**31:
        fail(ValueError, op, "a", "matrices of fewer than 2**31 elements", (a.shape, b.shape))
    alpha = sa[0] * sb[0]
    kind = _OUT_KIND[out.dtype]
    out_vec = out.ptr % 16 == 0 and n % 8 == 0
    sms = multiprocessor_count()
    tile = None
    if (m > DECODE_MAX_M and out_vec and compute_capability() == (9, 0)
            and tma_compatible(p.a[0], p.lda) and tma_compatible(p.b[0], p.ldb)):
        tile = matmul_hopper.choose_tile(m, n, sms)
    if tile is not None:
        def address(x):
            return 0 if x is None else x.ptr

        dequant = (alpha, address(sa[1]), sa[2], address(sb[1]), sb[2], address(bias),
                   int(bias is not None))
        plan = matmul_hopper.launch("s8", tile, p.a[0], p.lda, True, p.b[0], p.ldb, True, out,
                                    m, n, k, kind, rows_shape + (n,), dequant)
        # Only plans over the arguments' own memory (a copied operand or bias dies now).
        if (key is not None and p.a.ptr == a.ptr and p.b.ptr == b.ptr
                and (bias is None or bias.ptr == key[3][0])):
            if len(_HOPPER_PLANS) >= HOPPER_PLAN_CACHE:
                _HOPPER_PLANS.pop(next(iter(_HOPPER_PLANS)))  # the oldest
            _HOPPER_PLANS[key] = (plan, dequant)
        return out
    out3 = out._view((1, m, n), (m * n * out.itemsize, n * out.itemsize, out.itemsize))
    dequant = (alpha, sa[1], sa[2], sb[1], sb[2], bias, int(bias is not None))
    _launch_mma(op, p, "s8", out3, kind, out_vec, "async", None, None, sms, dequant)
    return out


def matmul_int8_ref(a, b, scale, bias=None) -> np.ndarray:
    """The exact reference (NumPy): the integer sums in float64 — exact, |sum| ≤ K·2^14 is
    far below 2^53, and BLAS-fast where an int64 matmul is not — then the scales and the
    bias in float64."""
    acc = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    sa, sb = scale if isinstance(scale, (tuple, list)) else (scale, 1.0)
    sa = np.asarray(sa, np.float64)
    result = acc * (sa[..., None] if sa.ndim else sa) * np.asarray(sb, np.float64)
    return result if bias is None else result + np.asarray(bias, np.float64)


def matmul_int8(a, b, scale, *, bias=None, out=None, dtype=None) -> DeviceArray:
    """W8A8 matmul: ``a`` int8 [..., M, K] (activations) times ``b`` int8 [K, N] (weights;
    fastest as the ``w.T`` view of a row-major [N, K] weight, the checkpoint layout),
    exact int32 accumulation, then ``sum · scale_a[m] · scale_b[n] + bias[n]`` in float32.

    ``scale``: per tensor — a float or a 0-d float32 array — or a pair ``(scale_a,
    scale_b)``: ``scale_a`` a float, a 0-d array or float32 of shape ``a.shape[:-1]`` (one
    per row: per token), ``scale_b`` a float, a 0-d array or float32 [N] (per output
    channel), as :func:`kaionb.quantize_int8` returns them. ``bias``: [N] float32, float16
    or bfloat16. The result [..., M, N] is float32 (default), float16 or bfloat16
    (``dtype``, or ``out``'s dtype)."""
    return matmul_int8_fwd("matmul_int8", a, b, scale, bias=bias, out=out, dtype=dtype)
