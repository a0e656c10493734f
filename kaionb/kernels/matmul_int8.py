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
- M ≤ 16, K-major 16-byte aligned operands, K % 16 == 0 (decode): the weight stream
  (``helpers.weight_stream``: the weights' int8 loaded straight into mma fragments, no
  split-K).
- otherwise the ``mma.sync m16n8k32`` kernels of :mod:`.matmul` (decode tiles with
  split-K for M ≤ 64), which scale the staged sums per chunk
  (``helpers.epilogue.dequantize_row_chunk8``).

Both read A and B K-major: A row-major [M, K], B as the ``w.T`` view of a row-major
[N, K] weight — how checkpoints store linear layers. A row-major [K, N] B is copied
into that layout first (one extra pass over the weight per call).

``qkv_project_int8`` runs three such GEMMs over one activation in one launch (the grid's
N tiles cover w_q, w_k, w_v in turn); a f16 / bf16 activation of few rows is quantized per
token in the same launch, in each block's prologue (``helpers.int8.make_quantize_rows``).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from numba import cuda, float32, int32, int64

from .._device import compute_capability, multiprocessor_count
from .._tensor_map import tma_compatible
from ..array import DeviceArray, _contiguous_strides, bfloat16, empty
from ..ptx_patches import device_function
from ..validation import (
    as_array,
    check_contiguous,
    check_same_device,
    fail,
    output_dtype,
)
from . import matmul_hopper
from .helpers.epilogue import SCALE_NONE, SCALE_TENSOR, SCALE_VECTOR
from .helpers.gemm_block import make_gemm_block
from .helpers.int8 import make_quantize_rows
from .helpers.weight_stream import BM as STREAM_BM
from .helpers.weight_stream import QUANTIZE_MAX_M, make_stream_block
from .launch import kernel
from .matmul import (
    _OUT_DTYPE_NAMES,
    _OUT_KIND,
    FOLD_GROUP,
    TILES,
    Operands,
    _aligned,
    _choose,
    _stream_rows,
    _streams,
    _copy_transposed,
    _launch_mma,
    _output,
    launch_stream,
    output_pair,
    plan_operands,
)
from .op import C_CONTIGUOUS, Plan, arrival_workspace, fast_path, outputs, workspace
from .quantize import quantize_int8, quantize_int8_ref

_INT8, _F32 = (np.dtype(np.int8),), np.dtype(np.float32)
_U16, _U32 = np.dtype(np.uint16), np.dtype(np.uint32)
_BIAS_DTYPES = tuple(_OUT_KIND)
# M up to this runs the mma.sync decode tiles (weight streaming, split-K) on every GPU:
# at K = 8192, N = 28672 on the H100 they take 95-108 µs for M = 1-64, the wgmma kernel's
# 128-row tiles 139-184 µs (docs/performance.md).
DECODE_MAX_M = 64
# The QKV kernel's variants (tile and loads) on helpers.weight_stream, by the rows served
# (M ≤ 16 with K-major aligned operands: matmul._streams decides).
STREAM_TILES = {8: "stream8", 16: "stream16"}
# A float x quantized inside the streaming kernel lives in its shared memory: M · K bytes,
# within the 48 KB a launch gets without opting in.
STREAM_QUANTIZE_MAX_BYTES = 48 * 1024
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
        return _finite(op, name, float(value)), None, SCALE_NONE
    expected = "a float or a float32 array of shape () (per tensor)" + (
        f" or {vector_shape}" if vector_shape else "")
    if isinstance(value, np.ndarray) and value.size == 1 and value.ndim <= 1:
        if value.dtype != _F32:
            fail(TypeError, op, name, "float32", value.dtype)
        # a host value: no device copy
        return _finite(op, name, float(value.reshape(()))), None, SCALE_NONE
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


def _finite(op: str, name: str, value: float) -> float:
    """A host scale, refused when NaN or infinite (every output would be). Device scales
    are not read back: that would cost a synchronization per call."""
    if not math.isfinite(value):
        fail(ValueError, op, name, "a finite scale", value)
    return value


def _bias(op: str, name: str, bias, n: int, a: DeviceArray) -> DeviceArray:
    """A bias [n] (f32, f16 or bf16, on ``a``'s device) as the contiguous float32 the
    epilogue reads."""
    bias = as_array(op, name, bias, dtypes=_BIAS_DTYPES)
    check_same_device(op, a=a, **{name: bias})
    if bias.shape != (n,):
        fail(ValueError, op, name, f"shape ({n},)", bias.shape)
    if bias.dtype != _F32 or not bias.is_c_contiguous:
        bias = bias.astype(np.float32)
    return bias


def _kmajor_operands(op: str, a2: DeviceArray, b: DeviceArray) -> Operands:
    """The storage operands of a2 [M, K] @ b [K, N], both K-major as the s8 tensor-core
    tiles read them (the other layout is copied)."""
    p = plan_operands(op, a2, b, ())
    if not (p.a_kmajor and p.b_kmajor):
        a3, lda, _ = (p.a, p.lda, True) if p.a_kmajor else _copy_transposed(p.a, False)
        b3, ldb, _ = (p.b, p.ldb, True) if p.b_kmajor else _copy_transposed(p.b, False)
        p = p._replace(a=a3, lda=lda, a_kmajor=True, b=b3, ldb=ldb, b_kmajor=True)
    return p


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
        bias = _bias(op, "bias", bias, n, a)
    out = _output(op, out, dtype, rows_shape + (n,), a, np.float32)
    if out.size == 0:
        return out
    p = _kmajor_operands(op, a.reshape(m, k), b)  # a batch of rows is one matrix
    if max(p.lda * m, p.ldb * n) >= 2**31:
        fail(ValueError, op, "a", "matrices of fewer than 2**31 elements", (a.shape, b.shape))
    alpha = sa[0] * sb[0]
    kind = _OUT_KIND[out.dtype]
    out_vec = out.ptr % 16 == 0 and n % 8 == 0
    sms = multiprocessor_count()
    out3 = out._view((1, m, n), (m * n * out.itemsize, n * out.itemsize, out.itemsize))
    if _streams(m, k, _aligned(p.a, p.lda) and _aligned(p.b, p.ldb), n, sms):
        launch_stream("s8", p, out3, kind, out_vec,
                      (alpha, sa[1], sa[2], sb[1], sb[2], bias, int(bias is not None)))
        return out
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
    """Multiply int8 activations by int8 weights with scales and a bias (W8A8).

    ``a`` int8 [..., M, K] (activations) times ``b`` int8 [K, N] (weights; fastest as the
    ``w.T`` view of a row-major [N, K] weight, the checkpoint layout), exact int32
    accumulation, then ``sum · scale_a[m] · scale_b[n] + bias[n]`` in float32. Any M, N,
    K; on compute capability 9.0 wgmma s8 + TMA, decode shapes on mma.sync split-K.

    ``scale``: per tensor — a float or a 0-d float32 array — or a pair ``(scale_a,
    scale_b)``: ``scale_a`` a float, a 0-d array or float32 of shape ``a.shape[:-1]`` (one
    per row: per token), ``scale_b`` a float, a 0-d array or float32 [N] (per output
    channel), as :func:`kaionb.quantize_int8` returns them. ``bias``: [N] float32, float16
    or bfloat16. The result [..., M, N] is float32 (default), float16 or bfloat16
    (``dtype``, or ``out``'s dtype).

    Parameters
    ----------
    a : DeviceArray or array_like
        The int8 activations [..., M, K].
    b : DeviceArray or array_like
        The int8 weights [K, N].
    scale : float, DeviceArray or tuple
        Per tensor (a float or a 0-d float32 array), or ``(scale_a, scale_b)``: per row
        of ``a`` (float32 ``a.shape[:-1]``) or per tensor, and per output channel
        (float32 [N]) or per tensor. Finite values.
    bias : DeviceArray, optional
        [N] float32, float16 or bfloat16, added after scaling.
    out : DeviceArray, optional
        A C-contiguous [..., M, N] array to write (float32, float16 or bfloat16).
    dtype : dtype, optional
        The result dtype: float32 (default), float16 or bfloat16.

    Returns
    -------
    DeviceArray
        The scaled product [..., M, N] (``out`` itself when given).

    Raises
    ------
    TypeError
        ``a`` or ``b`` that is not int8, a ``scale`` that is not a float, an array or a
        pair (None included), a scale array that is not float32, a ``bias`` dtype other
        than float32 / float16 / bfloat16, or a result dtype other than float32 / float16
        / bfloat16 (an ``out`` that is not device memory included).
    ValueError
        A 0-d ``a``, a ``b`` that is not 2-D, inner dimensions that differ or are 0, a
        scale array of the wrong shape, a ``scale`` tuple that is not a pair, a NaN or
        inf scale, a ``bias`` that is not [N], or an ``out`` of another shape.

    Examples
    --------
    >>> a = kaionb.full((2, 32), 2, np.int8)
    >>> w = kaionb.full((16, 32), 3, np.int8)          # checkpoint layout [N, K]
    >>> kaionb.matmul_int8(a, w.T, (0.5, 0.25)).get()[0, :4]
    array([24., 24., 24., 24.], dtype=float32)
    """
    return matmul_int8_fwd("matmul_int8", a, b, scale, bias=bias, out=out, dtype=dtype)


# -- the fused QKV projection ----------------------------------------------------------------

# Rows up to this (f16 / bf16 x) are quantized per token inside the QKV kernel: each block
# finds its rows' max |x| over all of K (M·K·2 bytes read per block, from L2) and writes
# its rows' share of K quantized. Above it quantize_int8 runs first (its own launches).
# H100, hidden 4096 -> 4096+1024+1024, µs per call eager / in a graph (fused vs first):
# M = 1 20.7/19.0 vs 62.2/20.8, M = 2 21.8/22.5 vs 57.0/21.0, M = 4 30.4/28.4 vs
# 40.0/20.6, M = 16 59.3/57.1 vs 56.7/24.9: the prologue (~1 µs of L2 round trips per row)
# delays every block's weight stream (docs/perf-log-matmul.md #15).
FUSED_QUANTIZE_MAX_M = 2
_X_DTYPES = (np.dtype(np.int8), np.dtype(np.float16), bfloat16)
_X_KIND = {np.dtype(np.int8): "s8", np.dtype(np.float16): "f16", bfloat16: "bf16"}


_QKV_SIGNATURE = ("void(uint16[:, :], int8[:, :, :], float32[::1], int8[:, :, :], "
                  "int8[:, :, :], int8[:, :, :], float32[:, :, ::1], float32[:, :, ::1], "
                  "float32[:, :, ::1], uint16[:, :, ::1], uint16[:, :, ::1], uint16[:, :, ::1], "
                  "float32[::1], uint32[::1], " + ", ".join(["int32"] * 15) + ", float32, "
                  "float32, float32, int32, float32[::1], float32[::1], float32[::1], int32, "
                  "int32, int32, float32[::1], float32[::1], float32[::1], int32)")


def _make_qkv_kernel(x_kind: str, loads: str, tile: str):
    """Q, K and V of one activation in one launch: the grid's x covers the N tiles of w_q,
    then w_k, then w_v, and each block runs :func:`helpers.gemm_block.make_gemm_block` on its
    weight, output, scales and bias (the three share A, K and the split-K workspace;
    the split-K tile numbers, from the grid, are unique across them). Arguments:

    xf         f16 / bf16 x [M, K] for x_kind "f16"/"bf16" (quantized here), else unused
    xq, sa     the int8 x as storage [1, M, lda] and its row scales (sa_mode); for a float
               x both are scratch this kernel writes first: each block quantizes its rows'
               share of K (helpers.int8.make_quantize_rows) — blocks sharing rows write the
               same bytes — and its barrier orders the stores before the mainloop's
               cp.async reads (cp.async.cg reads L2; the read-only ld.global.nc path of the
               sync loads could not read them, so these variants are async only)
    w_*        weights, K-major storage [1, N, ldb_*]; o32_* / o16_* outputs [1, M, N]
    ws, counters, M, K, lda, ldb_q, ldb_k, ldb_v, n_q, n_kv (w_k and w_v), tiles_q,
    tiles_kv (N tiles of each), k_chunk, splits, kind, vec_ok, out_vec: as the matmul
               kernel's
    alpha_*    per-tensor factors; sb_*, sb_mode_* per-channel scales; bias_*, has_bias
               (bit g: weight g has a bias)

    Grid: (tiles_q + 2·tiles_kv, M tiles, splits)."""
    block_tile = TILES[("s8", loads)][tile]
    gemm_block = make_gemm_block("s8", True, True, loads, block_tile, FOLD_GROUP.get(tile, 4))
    BM, BN = block_tile[:2]
    QUANTIZE = x_kind != "s8"
    quantize_rows = make_quantize_rows(bfloat16 if x_kind == "bf16" else np.dtype(np.float16))

    @kernel([_QKV_SIGNATURE], name=f"_qkv_project_int8_fwd_kernel_{x_kind}_{loads}_{tile}",
            max_dynamic_shared_bytes=gemm_block.SHARED_BYTES, launch_bounds=gemm_block.THREADS)
    def _qkv_project_int8_fwd_kernel(xf, xq, sa, w_q, w_k, w_v, o32_q, o32_k, o32_v, o16_q,
                                     o16_k, o16_v, ws, counters, M, K, lda, ldb_q, ldb_k,
                                     ldb_v, n_q, n_kv, tiles_q, tiles_kv, k_chunk, splits,
                                     kind, vec_ok, out_vec, alpha_q, alpha_k, alpha_v,
                                     sa_mode, sb_q, sb_k, sb_v, sb_mode_q, sb_mode_k,
                                     sb_mode_v, bias_q, bias_k, bias_v, has_bias):
        bx = int32(cuda.blockIdx.x)
        m0 = int32(cuda.blockIdx.y) * BM
        split = int32(cuda.blockIdx.z)
        if QUANTIZE:
            k_begin = split * k_chunk
            quantize_rows(xf, xq, sa, m0, min(M, m0 + BM), k_begin, min(K, k_begin + k_chunk),
                          K)
            cuda.syncthreads()
        w, ldb, n, o32, o16 = w_q, ldb_q, n_q, o32_q, o16_q
        alpha, sb, sb_mode, bias, g, n0 = alpha_q, sb_q, sb_mode_q, bias_q, int32(0), bx * BN
        if bx >= tiles_q:
            g = int32(1) + (bx - tiles_q) // tiles_kv
            n0 = ((bx - tiles_q) % tiles_kv) * BN
            n = n_kv
            if g == 1:
                w, ldb, o32, o16, alpha, sb, sb_mode, bias = (w_k, ldb_k, o32_k, o16_k, alpha_k,
                                                              sb_k, sb_mode_k, bias_k)
            else:
                w, ldb, o32, o16, alpha, sb, sb_mode, bias = (w_v, ldb_v, o32_v, o16_v, alpha_v,
                                                              sb_v, sb_mode_v, bias_v)
        gemm_block(xq, w, o32, o16, ws, counters, M, n, K, lda, ldb, k_chunk, splits, kind,
                   vec_ok, out_vec, alpha, sa, sa_mode, sb, sb_mode, bias, (has_bias >> g) & 1,
                   m0, n0, int64(0), split)

    _qkv_project_int8_fwd_kernel.threads = gemm_block.THREADS
    _qkv_project_int8_fwd_kernel.shared_bytes = gemm_block.SHARED_BYTES
    _qkv_project_int8_fwd_kernel.block_tile = gemm_block.BLOCK_TILE
    return _qkv_project_int8_fwd_kernel


@device_function
def _pick(g, q, k, v):
    """``q``, ``k`` or ``v`` by the weight index ``g`` (0, 1, 2)."""
    if g == 0:
        return q
    if g == 1:
        return k
    return v


def _make_qkv_stream_kernel(x_kind: str, rows: int):
    """The QKV launch on :mod:`helpers.weight_stream` (M ≤ ``rows``): the arguments and grid
    of :func:`_make_qkv_kernel`'s kernel (one split, one row tile; ws, counters, k_chunk,
    splits, vec_ok unused; a float x is quantized into the block's shared memory, ``xq``
    and ``sa`` unused). Each block picks its weight before the mainloop and its output,
    scales and bias after it: picked before, they held ~20 registers through it."""
    QUANTIZE = x_kind != "s8"
    block = make_stream_block(
        "s8", rows, (bfloat16 if x_kind == "bf16" else np.dtype(np.float16)) if QUANTIZE else None)
    mainloop, store, BN, TILE = block.mainloop, block.store, block.BN, block.TILE
    ROW_SCALES = QUANTIZE_MAX_M

    @kernel([_QKV_SIGNATURE], name=f"_qkv_project_int8_fwd_kernel_{x_kind}_stream{rows}",
            max_dynamic_shared_bytes=STREAM_QUANTIZE_MAX_BYTES if QUANTIZE else 0,
            launch_bounds=block.LAUNCH_BOUNDS)
    def _qkv_project_int8_stream_fwd_kernel(
            xf, xq, sa, w_q, w_k, w_v, o32_q, o32_k, o32_v, o16_q, o16_k, o16_v, ws, counters, M,
            K, lda, ldb_q, ldb_k, ldb_v, n_q, n_kv, tiles_q, tiles_kv, k_chunk, splits, kind,
            vec_ok, out_vec, alpha_q, alpha_k, alpha_v, sa_mode, sb_q, sb_k, sb_v, sb_mode_q,
            sb_mode_k, sb_mode_v, bias_q, bias_k, bias_v, has_bias):
        bx = int32(cuda.blockIdx.x)
        g, n0, n = int32(0), bx * BN, n_q
        if bx >= tiles_q:
            g = int32(1) + (bx - tiles_q) // tiles_kv
            n0, n = ((bx - tiles_q) % tiles_kv) * BN, n_kv
        cs = cuda.shared.array(TILE, float32)
        row_scales = cuda.shared.array(ROW_SCALES, float32)
        mainloop(xf, xq, _pick(g, w_q, w_k, w_v), M, n, K, n0, cs, row_scales)
        store(cs, _pick(g, o32_q, o32_k, o32_v), _pick(g, o16_q, o16_k, o16_v), M, n, kind,
              out_vec, _pick(g, alpha_q, alpha_k, alpha_v), row_scales if QUANTIZE else sa,
              sa_mode, _pick(g, sb_q, sb_k, sb_v), _pick(g, sb_mode_q, sb_mode_k, sb_mode_v),
              _pick(g, bias_q, bias_k, bias_v), (has_bias >> g) & 1, n0)

    _qkv_project_int8_stream_fwd_kernel.threads = block.THREADS
    _qkv_project_int8_stream_fwd_kernel.shared_bytes = 0  # the launch passes x's bytes
    _qkv_project_int8_stream_fwd_kernel.block_tile = (STREAM_BM, BN, 0)
    return _qkv_project_int8_stream_fwd_kernel


def _qkv_variants():
    """int8 x: every s8 tile of both load pipelines; f16 / bf16 x (quantized in the
    kernel, M ≤ FUSED_QUANTIZE_MAX_M): the cp.async decode16 tile."""
    for loads in ("async", "sync"):
        for tile in TILES[("s8", loads)]:
            yield "s8", loads, tile
    for x_kind in ("f16", "bf16"):
        yield x_kind, "async", "decode16"


_QKV_KERNELS = {v: _make_qkv_kernel(*v) for v in _qkv_variants()}
# The stream variants: int8 x for every row count, a float x (quantized in the kernel, M ≤
# FUSED_QUANTIZE_MAX_M) on the 8-row block.
_QKV_KERNELS.update({(x_kind, tile, tile): _make_qkv_stream_kernel(x_kind, rows)
                     for rows, tile in STREAM_TILES.items()
                     for x_kind in ("s8", "f16", "bf16") if x_kind == "s8" or rows == 8})


def _qkv_outputs(op: str, out, rows_shape: tuple, widths: tuple, dtype, x: DeviceArray):
    """(q, k, v): ``out`` checked, or three C-contiguous arrays carved from one allocation
    (one allocator call per QKV call; each starts 16-byte aligned)."""
    dtype = output_dtype(op, dtype, out, _OUT_KIND, _OUT_DTYPE_NAMES,
                         x.dtype if x.dtype != np.int8 else _F32)
    shapes = [rows_shape + (n,) for n in widths]
    if out is not None:
        return outputs(op, out, [(s, dtype, C_CONTIGUOUS) for s in shapes],
                       device=x.device_id)
    sizes = [math.prod(s) * dtype.itemsize for s in shapes]
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + -(-size // 16) * 16)
    buffer = empty((-(-(offsets[-1] + sizes[-1]) // dtype.itemsize),), dtype)
    return tuple(buffer._view(s, _contiguous_strides(s, dtype.itemsize), at)
                 for s, at in zip(shapes, offsets))


@fast_path
def qkv_project_int8_fwd(op: str, x, w_q, w_k, w_v, scale_q, scale_k, scale_v, *,
                         x_scale=None, bias=None, out=None, dtype=None) -> tuple:
    """Validate every argument (before any launch) and run the three projections."""
    x = as_array(op, "x", x, dtypes=_X_DTYPES)
    if x.ndim < 1:
        fail(ValueError, op, "x", "an array [..., hidden]", "a 0-d array")
    hidden, rows_shape = x.shape[-1], x.shape[:-1]
    m = math.prod(rows_shape)
    weights = []
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        w = as_array(op, name, w, dtypes=_INT8)
        check_same_device(op, x=x, **{name: w})
        if w.ndim != 2 or w.shape[0] != hidden:
            fail(ValueError, op, name, f"shape ({hidden}, N) (x is {x.shape}: its last "
                 "dimension is the hidden size)", f"shape {w.shape}")
        weights.append(w)
    n_q, n_kv = weights[0].shape[1], weights[1].shape[1]
    if weights[2].shape[1] != n_kv:
        fail(ValueError, op, "w_v", f"shape ({hidden}, {n_kv}) (as w_k: K and V have one "
             "width)", f"shape {weights[2].shape}")
    if hidden == 0:
        fail(ValueError, op, "x", "a hidden size ≥ 1", f"shape {x.shape}")
    widths = (n_q, n_kv, n_kv)
    scales = [_scale(op, name, s, (n,)) for name, s, n in
              (("scale_q", scale_q, n_q), ("scale_k", scale_k, n_kv), ("scale_v", scale_v, n_kv))]
    if x.dtype == np.int8:
        if x_scale is None:
            fail(TypeError, op, "x_scale", "the int8 x's scale: a float, a 0-d float32 array "
                 f"or float32 of shape {rows_shape}", "None")
        sx = _scale(op, "x_scale", x_scale, rows_shape)
    elif x_scale is not None:
        fail(ValueError, op, "x_scale", "None for a float16 / bfloat16 x (it is quantized "
             "per token here)", type(x_scale).__name__)
    for (_, arr, _), name in zip(scales, ("scale_q", "scale_k", "scale_v")):
        if arr is not None:
            check_same_device(op, x=x, **{name: arr})
    if bias is None:
        biases = [None] * 3
    elif isinstance(bias, (tuple, list)) and len(bias) == 3:
        biases = [None if b is None else _bias(op, f"bias[{g}]", b, widths[g], x)
                  for g, b in enumerate(bias)]
    else:
        fail(TypeError, op, "bias", "None or a tuple of three (each None or [N])",
             type(bias).__name__)
    outs = _qkv_outputs(op, out, rows_shape, widths, dtype, x)
    if m == 0 or n_q + n_kv == 0:
        return outs
    x2 = x.reshape(m, hidden)
    sms = multiprocessor_count()
    if x.dtype != np.int8:
        fused = m <= FUSED_QUANTIZE_MAX_M
        if not fused:
            x2, x_scale = quantize_int8(x2, axis=0)  # per token, its own launches
            sx = (1.0, x_scale, SCALE_VECTOR)
    else:
        fused = False
    if not fused and m > DECODE_MAX_M and compute_capability() == (9, 0):
        # Prefill on Hopper: three wgmma GEMMs (2-4× the mma.sync kernel's rate at these
        # sizes) beat one mma.sync launch; matmul_int8 picks mma.sync where TMA cannot.
        scale_a = sx[0] if sx[1] is None else sx[1]
        for w, s, b, o in zip(weights, (scale_q, scale_k, scale_v), biases, outs):
            matmul_int8_fwd(op, x2, w, (scale_a, s), bias=b, out=o.reshape(m, o.shape[-1]))
        return outs
    _qkv_launch(op, x2, fused, sx if not fused else None, weights, widths, scales, biases,
                outs, sms)
    return outs


def _qkv_launch(op, x2, fused, sx, weights, widths, scales, biases, outs, sms) -> None:
    """Plan and launch the QKV kernel: ``x2`` [M, K] int8 with its scale ``sx`` (as
    :func:`_scale` returns it), or f16 / bf16 quantized in the kernel (``fused``)."""
    m, hidden = x2.shape
    n_q, n_kv = widths[0], widths[1]
    parts = [_kmajor_operands(op, x2, w) for w in weights]
    # The kernels' 16-byte loads read x and the weights alike (the fused split-K variant
    # reads x from padded scratch; the fused stream checks x itself, x_ok): vectors only
    # where both are aligned — weights of one column get a padded row stride, so aligned
    # weights do not make an aligned x (K = 141).
    vec_ok = all(_aligned(p.b, p.ldb) for p in parts) and (
        fused or _aligned(parts[0].a, parts[0].lda))
    loads = "async" if vec_ok else "sync"
    if fused and loads != "async":  # the fused split-K variant reads x by cp.async only
        xq, x_scale = quantize_int8(x2, axis=0)
        return _qkv_launch(op, xq, False, (1.0, x_scale, SCALE_VECTOR), weights, widths,
                           scales, biases, outs, sms)
    x_kind = _X_KIND[x2.dtype]
    # The stream's fused quantization reads x in aligned 16-byte runs into shared memory.
    x_ok = not fused or (x2.ptr % 16 == 0 and x2.strides[0] % 16 == 0 and x2.strides[1] == 2
                         and m * hidden <= STREAM_QUANTIZE_MAX_BYTES)
    shared_bytes = None
    if _streams(m, hidden, vec_ok and x_ok, n_q + 2 * n_kv, sms):
        tile = STREAM_TILES[_stream_rows(m)]
        splits, k_chunk = 1, hidden
        kdef = _QKV_KERNELS[(x_kind, tile, tile)]
        shared_bytes = m * hidden if fused else 0
    else:
        tiles = ({"decode16": TILES[("s8", "async")]["decode16"]} if fused
                 else TILES[("s8", loads)])
        tile, splits, k_chunk = _choose(m, n_q + 2 * n_kv, hidden, sms, tiles)
        kdef = _QKV_KERNELS[(x_kind, loads, tile)]
    bm, bn, _ = kdef.block_tile
    tiles_q, tiles_kv = -(-n_q // bn), -(-n_kv // bn)
    grid = (tiles_q + 2 * tiles_kv, -(-m // bm), splits)
    kind = _OUT_KIND[outs[0].dtype]
    out_vec = all(o.ptr % 16 == 0 for o in outs) and n_q % 8 == 0 and n_kv % 8 == 0
    nothing = outs[0]._view((0,), (4,), dtype=_F32)  # an argument no launch reads
    ws_bytes = grid[0] * grid[1] * splits * bm * bn * 4 if splits > 1 else 0
    n_counters = grid[0] * grid[1] if splits > 1 else 0
    if fused and shared_bytes is not None:
        # The weight stream quantizes x into its own shared memory: no scratch to read.
        partials, counters = nothing, outs[0]._view((0,), (4,), dtype=_U32)
        xq, lda, xf = outs[0]._view((1, 0, 0), (1, 1, 1), dtype=_INT8[0]), 0, x2
        sa, sa_mode, alpha_x = nothing, SCALE_VECTOR, 1.0
    elif fused:
        # Scratch after the split-K partials in the stream's workspace: the quantized x
        # (rows padded to 16 bytes for cp.async) and its row scales.
        ldq = -(-hidden // 16) * 16
        xq_at = -(-ws_bytes // 256) * 256
        sa_at = xq_at + -(-(m * ldq) // 256) * 256
        partials, counters = workspace(arrival_workspace, sa_at + 4 * m, n_counters)
        xq = partials._view((1, m, hidden), (m * ldq, ldq, 1), xq_at, _INT8[0])
        sa, sa_mode, lda, xf = partials._view((m,), (4,), sa_at), SCALE_VECTOR, ldq, x2
        alpha_x = 1.0
    else:
        if ws_bytes:
            partials, counters = workspace(arrival_workspace, ws_bytes, n_counters)
        else:
            partials, counters = nothing, outs[0]._view((0,), (4,), dtype=_U32)
        xq, lda = parts[0].a, parts[0].lda
        alpha_x, sa, sa_mode = sx[0], sx[1] if sx[1] is not None else nothing, sx[2]
        xf = outs[0]._view((0, 0), (2, 2), dtype=_U16)
    pairs = [output_pair(o._view((1, m, n), (m * n * o.itemsize, n * o.itemsize, o.itemsize)),
                         kind) for o, n in zip(outs, widths)]
    args = ((xf, xq, sa) + tuple(p.b for p in parts) + tuple(p[0] for p in pairs)
            + tuple(p[1] for p in pairs)
            + (partials if ws_bytes else nothing, counters, m, hidden, lda)
            + tuple(p.ldb for p in parts)
            + (n_q, n_kv, tiles_q, tiles_kv, k_chunk, splits, kind, int(vec_ok), int(out_vec))
            + tuple(alpha_x * s[0] for s in scales) + (sa_mode,)
            + tuple(nothing if s[1] is None else s[1] for s in scales)
            + tuple(s[2] for s in scales)
            + tuple(nothing if b is None else b for b in biases)
            + (sum(1 << g for g, b in enumerate(biases) if b is not None),))
    Plan.of(kdef, grid, (kdef.threads,),
            kdef.shared_bytes if shared_bytes is None else shared_bytes).launch(*args)


def qkv_project_int8_ref(x, w_q, w_k, w_v, scale_q, scale_k, scale_v, x_scale=None,
                         bias=None) -> tuple:
    """float64 NumPy reference: an int8 ``x`` with ``x_scale``, or a float x quantized per
    token by :func:`kaionb.kernels.quantize.quantize_int8_ref` (float64: it can round a
    tie one step from the kernels' float32), then :func:`matmul_int8_ref` per weight."""
    x = np.asarray(x)
    rows_shape = x.shape[:-1]
    if x.dtype != np.int8:
        q, s = quantize_int8_ref(x.reshape(-1, x.shape[-1]), axis=0)
        x, x_scale = q.reshape(x.shape), s.reshape(rows_shape)
    biases = bias if bias is not None else (None,) * 3
    return tuple(matmul_int8_ref(x, w, (x_scale, s), b)
                 for w, s, b in zip((w_q, w_k, w_v), (scale_q, scale_k, scale_v), biases))


def qkv_project_int8(x, w_q, w_k, w_v, scale_q, scale_k, scale_v, *, x_scale=None, bias=None,
                     out=None, dtype=None) -> tuple:
    """Project activations to Q, K and V through three int8 weights in one launch (W8A8).

    The attention input projections of a W8A8 model, ``(x @ w_q, x @ w_k, x @ w_v)``
    scaled: ``q [..., N_q], k [..., N_kv], v [..., N_kv]``.

    ``x`` [..., hidden]: float16 / bfloat16 (quantized per token inside the kernel for up
    to FUSED_QUANTIZE_MAX_M rows, by :func:`kaionb.quantize_int8` first above that), or
    int8 with ``x_scale`` (a float, a 0-d float32 array or float32 of shape
    ``x.shape[:-1]``). ``w_q`` int8 [hidden, N_q], ``w_k`` and ``w_v`` int8 [hidden, N_kv]
    (GQA: N_kv may differ from N_q); fastest as the ``w.T`` views of row-major [N, hidden]
    checkpoint weights. ``scale_q/k/v``: each weight's scale, per tensor (a float or 0-d
    float32 array) or per output channel (float32 [N]). ``bias``: None or a tuple of three,
    each None or [N] (f32, f16 or bf16). The results are float16 / bfloat16 as a float x,
    float32 for an int8 x, or ``dtype``; ``out``: a tuple of three C-contiguous arrays.
    New results share one allocation.

    On compute capability 9.0 more than DECODE_MAX_M (64) rows run three wgmma GEMMs
    instead (:func:`matmul_int8`), faster there than one mma.sync launch.
    (FUSED_QUANTIZE_MAX_M is 2.)

    Parameters
    ----------
    x : DeviceArray or array_like
        [..., hidden]: float16 / bfloat16, or int8 with ``x_scale``.
    w_q : DeviceArray or array_like
        The int8 weight [hidden, N_q].
    w_k, w_v : DeviceArray or array_like
        The int8 weights [hidden, N_kv] (N_kv may differ from N_q: GQA).
    scale_q, scale_k, scale_v : float or DeviceArray
        Each weight's scale: per tensor (a float or a 0-d float32 array) or per output
        channel (float32 [N]); finite.
    x_scale : float or DeviceArray, optional
        For an int8 ``x`` only: a float, a 0-d float32 array or float32
        ``x.shape[:-1]``.
    bias : tuple, optional
        Three biases, each None or [N] (float32, float16 or bfloat16).
    out : tuple of DeviceArray, optional
        Three C-contiguous arrays [..., N_q], [..., N_kv], [..., N_kv] of one dtype.
    dtype : dtype, optional
        The results' dtype: float32, float16 or bfloat16.

    Returns
    -------
    tuple of DeviceArray
        ``(q, k, v)`` (``out``'s arrays when given).

    Raises
    ------
    TypeError
        ``x`` that is not float16 / bfloat16 / int8, weights that are not int8, an int8
        ``x`` without ``x_scale``, a ``bias`` that is not a tuple of three, an ``out``
        that is not a tuple of three device arrays, or a result dtype other than float32
        / float16 / bfloat16.
    ValueError
        Weights whose hidden size is not x's last dimension, ``w_k`` and ``w_v`` of
        different widths, an ``x_scale`` for a float ``x``, scale or bias arrays of the
        wrong shape, a NaN or inf scale, or ``out`` arrays of other shapes.

    Examples
    --------
    >>> x = kaionb.ones((1, 64), dtype=np.float16)
    >>> w_q = kaionb.ones((64, 32), dtype=np.int8)
    >>> w_kv = kaionb.ones((64, 16), dtype=np.int8)
    >>> q, k, v = kaionb.qkv_project_int8(x, w_q, w_kv, w_kv, 0.01, 0.01, 0.01)
    >>> q.shape, k.shape, v.dtype
    ((1, 32), (1, 16), dtype('float16'))
    """
    return qkv_project_int8_fwd("qkv_project_int8", x, w_q, w_k, w_v, scale_q, scale_k,
                                scale_v, x_scale=x_scale, bias=bias, out=out, dtype=dtype)
