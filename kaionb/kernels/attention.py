"""Scaled dot-product attention on tensor cores (FlashAttention forward): multi-head,
batched, GQA/MQA, causal, and flash-decoding for short queries against a long KV cache.

    O = softmax(scale · Q·Kᵀ + mask) · V,    lse = log Σ_j exp(scale · q·k_j)   per row

Q [B, Hq, Sq, D], K and V [B, Hkv, Sk, D] with Hq a multiple of Hkv: query head h reads
K/V head h // (Hq / Hkv). Causal masks align bottom-right (FlashAttention-2's convention):
query i sees keys j ≤ i + Sk − Sq, so the last query sees every key; with Sq > Sk the
first Sq − Sk queries see none, and a row with no key is defined as O = 0, lse = −inf.

Kernels: :mod:`.helpers.attention` (mma.sync m16n8k16, cp.async, online softmax; every
GPU) and, on an H100 for D ∈ {64, 128, 256} prefill, :mod:`.helpers.attention_wgmma`
(wgmma, P from registers, softmax overlapped with P·V); one block per (query tile, head or
GQA group, batch × key split). The grid and tile:

- prefill: mma.sync 4 warps × 16 rows (BM 64) per block, K/V tiles of ``keys_per_tile``
  keys; wgmma 1 or 2 warpgroups × 64 rows (``WGMMA_TILES``); one block per head; the key
  range is split when the grid would not fill the GPU.
- decode (the GQA group's queries fit one m16 tile: Hq/Hkv · Sq ≤ 16): one warp per block
  holding the whole group, so K/V are read once per KV head; the keys are split over
  enough blocks to fill the GPU (flash-decoding) and a second kernel merges the splits'
  (O_s, lse_s): O = Σ_s e^(lse_s − lse) O_s, lse = log Σ_s e^lse_s.

Heads are compiled for DP ∈ {32, 64, 96, 128, 192, 256} (D rounded up; D any multiple of
8 up to 256): the columns past D are zero-filled loads and unstored outputs.

float32 inputs run the bf16 kernel on bf16 copies (tensor cores, f32 accumulation and
softmax) and return float32: relative error ~3e-3 (bf16's rounding of the inputs), not
float32 accuracy.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, int64

from .._device import compute_capability, multiprocessor_count
from ..array import DeviceArray, _contiguous_strides, bfloat16, empty
from ..grad.record import record
from ..ptx_patches import (
    bf16x2_to_f32x2,
    ex2_approx_f32,
    f16x2_to_f32x2,
    global_addr,
    ld_global_nc_v4_u32,
    st_global_b32,
)
from ..validation import (
    as_array,
    check_contiguous,
    check_same_dtype,
    check_shape,
    fail,
    output_dtype,
)
from .helpers.attention import LOG2E, attention_block
from .helpers.attention_bwd import STAT_ROWS, KeyBlock, QueryBlock
from .helpers.attention_wgmma import WgmmaAttentionBlock, wgmma_attention_block
from .helpers.epilogue import OUT_BF16, OUT_F16, OUT_F32, pack_pair
from .launch import kernel
from .op import ANY_LAYOUT, LAST_AXIS, Plan, fast_path, output, outputs, run

# Head dimensions compiled (D is rounded up to one of these).
HEAD_DIMS = (32, 64, 96, 128, 192, 256)
MAX_HEAD_DIM = HEAD_DIMS[-1]
# Tiles: warps (of 16 query rows) per block.
TILES = {"prefill": 4, "decode": 1}


def keys_per_tile(DP: int, tile: str) -> int:
    """BN of the mma.sync kernels, measured (docs/perf-log-attention.md #3): 128 keys up to
    DP = 64 for prefill (0.74 of FA2 at D = 64 against 0.64 with 64; the one-warp decode
    tile spilled with 128 at DP = 32, and 32 or 64 timed the same), 64 up to DP = 128
    (0.71 against 0.61 with 32); fewer for wider heads, whose O fragments (DP/2 registers
    per lane) leave less room for S (BN/2): at DP = 256, BN = 32 spilled on sm_90a
    (ptxas -v: 12 stores, 32 loads), BN = 16 does not."""
    if DP <= 64 and tile == "prefill":
        return 128
    return 64 if DP <= 128 else 32 if DP <= 192 else 16


# Hopper (sm_90a) prefill: the wgmma block for these head dimensions, (keys per tile,
# K/V stages, consumer warpgroups), measured (docs/perf-log-attention.md #7): at D = 128
# two warpgroups sharing 128-key tiles run 1.14× FA2 where one with 64-key tiles ran
# 0.99×; at D = 64 one warpgroup (0.99×; two: 0.93×). D = 256 is not tuned.
WGMMA_TILES = {64: (128, 2, 1), 128: (128, 2, 2), 256: (64, 2, 1)}
DECODE_MAX_ROWS = 16  # a GQA group's packed queries that fit the decode tile
# Split the keys until the grid has this many blocks per SM (decode: one warp each).
TARGET_BLOCKS_PER_SM = {"prefill": 2, "decode": 8}
MIN_TILES_PER_SPLIT = 2  # a split streams at least this many K/V tiles
COMBINE_WARPS = 4

_F32 = np.dtype(np.float32)
_U16 = np.dtype(np.uint16)
_INPUT_DTYPES = (np.dtype(np.float16), bfloat16, _F32)
_DTYPE_NAMES = "float16, bfloat16 or float32"
_OPERAND = {np.dtype(np.float16): "f16", bfloat16: "bf16"}
_KIND = {_F32: OUT_F32, np.dtype(np.float16): OUT_F16, bfloat16: OUT_BF16}


# -- kernels ---------------------------------------------------------------------------------

def make_attention_kernel(blk, name: str):
    """One variant: the grid mapped onto ``blk`` (an ``AttentionBlock`` or, compiled for
    sm_90a only, a ``WgmmaAttentionBlock``). Arguments: q, k, v (uint16 bits,
    4-D, any strides); out32 / out16 (the output [Z, Hq, Sq, D] for kind OUT_F32, or the
    f16/bf16 bits) and lse [Z, Hq, Sq] — Z = B, or splits·B partials; then kind, Sq, Sk,
    D, G (= Hq/Hkv), P (heads packed per block: 1 or G), causal, scale·log2(e), keys per
    split, B. Grid: (row tiles, Hq / P, splits · B)."""
    block = blk.block
    BM = blk.BM
    hopper = isinstance(blk, WgmmaAttentionBlock)
    signature = ("void(uint16[:, :, :, :], uint16[:, :, :, :], uint16[:, :, :, :], "
                 "float32[:, :, :, :], uint16[:, :, :, :], float32[:, :, ::1], int32, int32, "
                 "int32, int32, int32, int32, int32, float32, int32, int32)")

    @kernel([signature], name=name, max_dynamic_shared_bytes=blk.SHARED_BYTES,
            launch_bounds=blk.THREADS, arch_specific=hopper, min_cc=(9, 0) if hopper else (8, 0))
    def _attention_fwd_kernel(q, k, v, out32, out16, lse, kind, Sq, Sk, D, G, P, causal,
                              scale_log2, keys_per_split, B):
        smem = cuda.shared.array(0, np.uint8)
        z = int32(cuda.blockIdx.z)
        split = z // B
        n_begin = split * keys_per_split
        block(smem, q, k, v, out32, out16, lse, kind, Sq, Sk, D, G, P, causal, scale_log2,
              z - split * B, z, int32(cuda.blockIdx.y), int32(cuda.blockIdx.x) * BM, n_begin,
              min(Sk, n_begin + keys_per_split))

    _attention_fwd_kernel.block = blk
    return _attention_fwd_kernel


_KERNELS = {(operand, DP, tile): make_attention_kernel(
    attention_block(operand, DP, keys_per_tile(DP, tile), TILES[tile]),
    f"_attention_fwd_kernel_{operand}_d{DP}_{tile}")
    for operand in ("f16", "bf16") for DP in HEAD_DIMS for tile in TILES}
_WGMMA_KERNELS = {(operand, DP): make_attention_kernel(
    wgmma_attention_block(operand, DP, *WGMMA_TILES[DP]),
    f"_attention_fwd_kernel_{operand}_d{DP}_wgmma")
    for operand in ("f16", "bf16") for DP in WGMMA_TILES}


@kernel(["void(float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, :, :], "
         "uint16[:, :, :, :], float32[:, :, ::1], int32, int32, int32, int32)"],
        name="_attention_combine_kernel", launch_bounds=32 * COMBINE_WARPS)
def _attention_combine_kernel(ws, ws_lse, out32, out16, lse, kind, splits, B, D):
    """Merge the key splits of each row (module doc), one warp per row: ws [splits·B, Hq,
    Sq, D] holds each split's normalized O_s, ws_lse its lse_s (−inf: no key)."""
    _, H, S = lse.shape
    row = int32(cuda.blockIdx.x) * COMBINE_WARPS + int32(cuda.threadIdx.x) // 32
    lane = int32(cuda.threadIdx.x) % 32
    if row >= B * H * S:
        return
    b = row // (H * S)
    h = (row // S) % H
    i = row % S
    neg_inf = float32(-math.inf)
    top = neg_inf
    for s in range(splits):
        top = max(top, ws_lse[s * B + b, h, i])
    total = float32(0.0)
    if top != neg_inf:
        for s in range(splits):
            total += ex2_approx_f32((ws_lse[s * B + b, h, i] - top) * float32(LOG2E))
    inv = float32(1.0) / total if total > float32(0.0) else float32(0.0)
    for d in range(2 * lane, D, 64):  # column pairs: D is even
        x0 = float32(0.0)
        x1 = float32(0.0)
        if top != neg_inf:
            for s in range(splits):
                w = ex2_approx_f32((ws_lse[s * B + b, h, i] - top) * float32(LOG2E))
                x0 += w * ws[s * B + b, h, i, d]
                x1 += w * ws[s * B + b, h, i, d + 1]
        if kind == OUT_F32:
            out32[b, h, i, d] = x0 * inv
            out32[b, h, i, d + 1] = x1 * inv
        else:
            st_global_b32(global_addr(out16, (int64(b), int64(h), int64(i), int64(d))),
                          pack_pair(kind, x0 * inv, x1 * inv))
    if lane == 0:
        lse[b, h, i] = top + math.log(total) if total > float32(0.0) else neg_inf


# Backward (FlashAttention-2 with saved statistics, deterministic; .helpers.attention_bwd).
# Per head dimension: the dK/dV block's (query rows per streamed tile, key warps, warps
# sharing 16 keys, K/V fragments in registers) and the dQ block's (keys per tile, warps);
# none spills (ptxas -v, sm_80 … sm_90a) and each fits sm_89's 99 KB of shared memory.
# Measured on the H100 (benchmarks/attention_bwd_sweep.py, docs/perf-log-attention.md
# #11): at D = 128 every other candidate was slower (up to 1.5×); at D = 64 the dQ block
# with 128-key tiles took the backward from 10.1 to 9.3 ms. Wider and narrower heads are
# not tuned.
BWD_KEY_TILES = {32: (64, 4, 1, True), 64: (64, 4, 1, True), 96: (32, 4, 1, False),
                 128: (32, 4, 1, False), 192: (32, 2, 3, False), 256: (32, 2, 2, False)}
BWD_QUERY_TILES = {32: (64, 4), 64: (128, 4), 96: (64, 4), 128: (64, 4), 192: (32, 4),
                   256: (16, 4)}
PREPROCESS_WARPS = 4
_BWD_ARRAYS = ("uint16[:, :, :, :], uint16[:, :, :, :], uint16[:, :, :, :], "
               "uint16[:, :, :, :], float32[:, ::1], float32[:, ::1], ")
_BWD_SCALARS = "int32, int32, int32, int32, int32, int32, float32, float32)"


def make_attention_bwd_kernels(operand: str, DP: int, key_tiles=None, query_tiles=None):
    """The backward's two main kernels for one operand type and head dimension: (dK/dV
    over grid (key tiles, Hkv, B), dQ over grid (query tiles, Hq, B)); the geometries
    default to ``BWD_KEY_TILES[DP]`` and ``BWD_QUERY_TILES[DP]``. Arguments: q, k, v, dO
    (uint16 bits, 4-D, any strides), ℓ2 and Δ ([B·Hq, SQ_PAD] float32, from
    :func:`_attention_bwd_preprocess_kernel`), the outputs as (f32, uint16) pairs, then
    kind, Sq, Sk, D, G, causal, scale·log2(e), scale.

    The names carry the geometry: the kernel cache keys a kernel by its name and its own
    closure's constants, which do not see the blocks' (a sweep's variants of one name
    would load each other's cubins)."""
    key_tiles = BWD_KEY_TILES[DP] if key_tiles is None else key_tiles
    query_tiles = BWD_QUERY_TILES[DP] if query_tiles is None else query_tiles
    key_blk = KeyBlock(operand, DP, *key_tiles)
    query_blk = QueryBlock(operand, DP, *query_tiles)
    key_geometry = "q{}k{}c{}{}".format(*key_tiles[:3], "r" if key_tiles[3] else "")
    query_geometry = "n{}w{}".format(*query_tiles)
    key_block, query_block = key_blk.block, query_blk.block
    BN, BM = key_blk.BN, query_blk.BM
    pair = "float32[:, :, :, :], uint16[:, :, :, :], "

    @kernel(["void(" + _BWD_ARRAYS + pair + pair + _BWD_SCALARS],
            name=f"_attention_bwd_dkdv_kernel_{operand}_d{DP}_{key_geometry}",
            max_dynamic_shared_bytes=key_blk.SHARED_BYTES, launch_bounds=key_blk.THREADS)
    def _attention_bwd_dkdv_kernel(q, k, v, do, lse2, delta, dk32, dk16, dv32, dv16, kind,
                                   Sq, Sk, D, G, causal, scale_log2, scale):
        smem = cuda.shared.array(0, np.uint8)
        key_block(smem, q, k, v, do, lse2, delta, dk32, dk16, dv32, dv16, kind, Sq, Sk, D, G,
                  causal, scale_log2, scale, int32(cuda.blockIdx.z), int32(cuda.blockIdx.y),
                  int32(cuda.blockIdx.x) * BN)

    @kernel(["void(" + _BWD_ARRAYS + pair + _BWD_SCALARS],
            name=f"_attention_bwd_dq_kernel_{operand}_d{DP}_{query_geometry}",
            max_dynamic_shared_bytes=query_blk.SHARED_BYTES, launch_bounds=query_blk.THREADS)
    def _attention_bwd_dq_kernel(q, k, v, do, lse2, delta, dq32, dq16, kind, Sq, Sk, D, G,
                                 causal, scale_log2, scale):
        smem = cuda.shared.array(0, np.uint8)
        query_block(smem, q, k, v, do, lse2, delta, dq32, dq16, kind, Sq, Sk, D, G, causal,
                    scale_log2, scale, int32(cuda.blockIdx.z), int32(cuda.blockIdx.y),
                    int32(cuda.blockIdx.x) * BM)

    _attention_bwd_dkdv_kernel.block = key_blk
    _attention_bwd_dq_kernel.block = query_blk
    return _attention_bwd_dkdv_kernel, _attention_bwd_dq_kernel


_BWD_KERNELS = {(operand, DP): make_attention_bwd_kernels(operand, DP)
                for operand in ("f16", "bf16") for DP in HEAD_DIMS}


@kernel(["void(uint16[:, :, :, :], uint16[:, :, :, :], float32[:, :, :], int32, "
         "float32[:, ::1], float32[:, ::1], int32, int32)"],
        name="_attention_bwd_preprocess_kernel", launch_bounds=32 * PREPROCESS_WARPS)
def _attention_bwd_preprocess_kernel(o, do, lse, kind, lse2, delta, Sq, D):
    """One warp per row of the padded statistics [B·Hq, SQ_PAD], 8 columns (one 16-byte
    load of O and of dO; rows are 16-byte aligned) a lane: Δ = Σ_d dO·O (f32 sums of the
    f16/bf16 values, ``kind``) and ℓ2 = lse·log2(e); rows past Sq and rows with no key
    (lse −inf) get ℓ2 = +inf, so the main kernels' P = 2^(s − ℓ2) is 0 there."""
    _, H, _, _ = o.shape
    row = int32(cuda.blockIdx.x) * PREPROCESS_WARPS + int32(cuda.threadIdx.x) // 32
    lane = int32(cuda.threadIdx.x) % 32
    if row >= lse2.shape[0] * lse2.shape[1]:
        return
    z = row // lse2.shape[1]
    i = row % lse2.shape[1]
    total = float32(0.0)
    if i < Sq and 8 * lane < D:
        at = (int64(z // H), int64(z % H), int64(i), int64(8 * lane))
        wo = ld_global_nc_v4_u32(global_addr(o, at))
        wd = ld_global_nc_v4_u32(global_addr(do, at))
        for w in range(4):
            if kind == OUT_F16:
                o0, o1 = f16x2_to_f32x2(wo[w])
                d0, d1 = f16x2_to_f32x2(wd[w])
            else:
                o0, o1 = bf16x2_to_f32x2(wo[w])
                d0, d1 = bf16x2_to_f32x2(wd[w])
            total += o0 * d0 + o1 * d1
    for width in (16, 8, 4, 2, 1):
        total += cuda.shfl_xor_sync(0xFFFFFFFF, total, width)
    if lane == 0:
        delta[z, i] = total
        ell = float32(math.inf)
        if i < Sq:
            x = lse[z // H, z % H, i]
            if x != float32(-math.inf):
                ell = x * float32(LOG2E)
        lse2[z, i] = ell

# -- host entries ----------------------------------------------------------------------------

def _as_4d(x: DeviceArray, rank: int = 4) -> DeviceArray:
    """[S, D] and [H, S, D] as [1, 1, S, D] / [1, H, S, D] views (``rank`` 3: the same
    for an lse of [S] or [H, S])."""
    lead = rank - x.ndim
    return x._view((1,) * lead + x.shape, (0,) * lead + x.strides)


def _aligned(x: DeviceArray) -> bool:
    """Base pointer and every row stride 16-byte aligned: cp.async reads and the output
    stores move 16-byte chunks."""
    return x.ptr % 16 == 0 and all(s % 16 == 0 for d, s in zip(x.shape[:-1], x.strides[:-1])
                                   if d > 1)


def _operand_dtype(dtype) -> np.dtype:
    """The kernels' operand type for inputs of ``dtype``: f16 or bf16 (float32 runs on
    bf16 copies)."""
    return dtype if dtype in _OPERAND else bfloat16


def _operand(x4: DeviceArray, dtype) -> DeviceArray:
    """The kernel's view of an input as uint16 bits of ``dtype`` (f16/bf16): a converted
    copy of another dtype, a contiguous copy of misaligned data."""
    if x4.dtype != dtype:
        x4 = x4.astype(dtype)
    elif not _aligned(x4):
        x4 = x4.copy()
    return x4._view(x4.shape, x4.strides, dtype=_U16)


def _head_dim_class(D: int) -> int:
    return next(dp for dp in HEAD_DIMS if dp >= D)


def _check_inputs(op, q, k, v):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not 2 <= x.ndim <= 4:
            fail(ValueError, op, name, "2 to 4 dimensions ([S, D], [H, S, D] or "
                 "[B, H, S, D])", f"{x.ndim} (shape {x.shape})")
        check_contiguous(op, name, x, last_axis_only=True)
    check_same_dtype(op, q=q, k=k, v=v)
    for name, x in (("k", k), ("v", v)):
        if x.ndim != q.ndim:
            fail(ValueError, op, name, f"{q.ndim} dimensions (as q, shape {q.shape})",
                 f"{x.ndim} (shape {x.shape})")
        if x.device_id != q.device_id:
            fail(ValueError, op, name, f"device {q.device_id} (where 'q' is)",
                 f"device {x.device_id}")
    if v.shape != k.shape:
        fail(ValueError, op, "v", f"the shape of 'k' {k.shape}", v.shape)
    D = q.shape[-1]
    if k.shape[-1] != D:
        fail(ValueError, op, "k", f"head dimension {D} (q's last axis)", k.shape[-1])
    if D % 8 or not 8 <= D <= MAX_HEAD_DIM:
        fail(ValueError, op, "q", f"a head dimension (last axis) that is a multiple of 8 "
             f"from 8 to {MAX_HEAD_DIM}", D)
    if q.ndim == 4 and k.shape[0] != q.shape[0]:
        fail(ValueError, op, "k", f"batch {q.shape[0]} (q's first axis)", k.shape[0])
    if q.ndim >= 3:
        hq, hkv = q.shape[-3], k.shape[-3]
        if hkv == 0 or hq % hkv:
            fail(ValueError, op, "k", f"a number of heads that divides q's {hq} (GQA)", hkv)


def _check_scale(op, scale, D: int) -> float:
    """The softmax scale: 1/sqrt(D) by default, else a finite float > 0."""
    if scale is None:
        return 1.0 / math.sqrt(D)
    if not isinstance(scale, (int, float, np.floating, np.integer)) or isinstance(scale, bool):
        fail(TypeError, op, "scale", "a float", type(scale).__name__)
    if not (math.isfinite(scale) and scale > 0):
        fail(ValueError, op, "scale", "a finite value > 0", scale)
    return float(scale)


def _splits(blocks: int, key_tiles: int, blocks_per_sm: int) -> int:
    """Key splits: enough blocks for ``blocks_per_sm``, each split ≥ MIN_TILES_PER_SPLIT
    tiles of keys."""
    target = blocks_per_sm * multiprocessor_count()
    if blocks >= target:
        return 1
    return max(1, min(-(-target // blocks), key_tiles // MIN_TILES_PER_SPLIT))


@fast_path
def attention_fwd(q, k, v, causal=False, scale=None, return_lse=False, *, out=None,
                  dtype=None, op="attention", prefer_wgmma=True):
    """Validate, resolve the output(s) and launch. Returns ``out`` or ``(out, lse)``.
    ``prefer_wgmma=False`` runs the mma.sync kernel on a Hopper GPU too (tests, tables)."""
    q = as_array(op, "q", q, dtypes=_INPUT_DTYPES)
    k = as_array(op, "k", k, dtypes=_INPUT_DTYPES)
    v = as_array(op, "v", v, dtypes=_INPUT_DTYPES)
    _check_inputs(op, q, k, v)
    scale = _check_scale(op, scale, q.shape[-1])
    out_dtype = q.dtype if dtype is None else np.dtype(dtype)
    out = output(op, out, q.shape, out_dtype, device=q.device_id)
    if not _aligned(out):  # the kernels store 16 bytes at a time (new outputs always are)
        fail(ValueError, op, "out", "16-byte aligned data and row strides",
             f"pointer 0x{out.ptr:x}, strides {out.strides}")
    if return_lse:
        lse = output(op, None, q.shape[:-1], _F32, device=q.device_id, layout=ANY_LAYOUT)
        return run(_attention_launch, q, k, v, bool(causal), scale, prefer_wgmma,
                   out=(out, lse))
    return run(_attention_launch, q, k, v, bool(causal), scale, prefer_wgmma, out=out)


def _attention_launch(q, k, v, causal, scale, prefer_wgmma, out, lse=None):
    """Pick the kernel: the decode tile when a GQA group's queries fit it; on Hopper the
    wgmma block for prefill where it has the head dimension."""
    DP = _head_dim_class(q.shape[-1])
    G = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    tile = "decode" if G * q.shape[-2] <= DECODE_MAX_ROWS else "prefill"
    operand = _OPERAND[_operand_dtype(q.dtype)]
    kdef = _KERNELS[(operand, DP, tile)]
    if (prefer_wgmma and tile == "prefill" and (operand, DP) in _WGMMA_KERNELS
            and compute_capability() == (9, 0)):
        kdef = _WGMMA_KERNELS[(operand, DP)]
    launch_attention(kdef, TARGET_BLOCKS_PER_SM[tile], q, k, v, causal, scale, out, lse)


def launch_attention(kdef, blocks_per_sm, q, k, v, causal, scale, out, lse=None):
    """Launch ``kdef`` (a :func:`make_attention_kernel` variant for q's operand type and
    head dimension) on validated inputs, splitting the keys until the grid has
    ``blocks_per_sm`` blocks per SM, and the combine kernel after a split."""
    q4, k4, v4, o4 = _as_4d(q), _as_4d(k), _as_4d(v), _as_4d(out)
    B, Hq, Sq, D = q4.shape
    Hkv, Sk = k4.shape[1], k4.shape[2]
    G = Hq // Hkv
    if lse is None:
        lse = empty((B, Hq, Sq), _F32)
    lse3 = lse._view((B, Hq, Sq), _contiguous_strides((B, Hq, Sq), 4))
    q4, k4, v4 = (_operand(x, _operand_dtype(q.dtype)) for x in (q4, k4, v4))
    BM, BN = kdef.block.BM, kdef.block.BN
    # Pack the GQA group's queries into one block's rows when a head's queries alone
    # would leave most of the tile empty.
    P = G if Sq < BM else 1
    rows = P * Sq
    grid_xy = (-(-rows // BM), Hq // P)
    key_tiles = -(-Sk // BN)
    splits = _splits(grid_xy[0] * grid_xy[1] * B, key_tiles, blocks_per_sm) if Sk else 1
    keys_per_split = -(-key_tiles // splits) * BN if Sk else BN
    splits = max(1, -(-Sk // keys_per_split))
    scale_log2 = scale * LOG2E
    plan = Plan.of(kdef, (*grid_xy, splits * B), (kdef.block.THREADS,), kdef.block.SHARED_BYTES)
    if splits == 1:
        plan.launch(q4, k4, v4, *_output_pair(o4), lse3, _KIND[out.dtype], Sq, Sk, D, G, P,
                    int(causal), scale_log2, keys_per_split, B)
        return
    ws = empty((splits * B, Hq, Sq, D), _F32)
    ws_lse = empty((splits * B, Hq, Sq), _F32)
    plan.launch(q4, k4, v4, *_output_pair(ws), ws_lse, OUT_F32, Sq, Sk, D, G, P, int(causal),
                scale_log2, keys_per_split, B)
    rows_total = B * Hq * Sq
    Plan.of(_attention_combine_kernel, (-(-rows_total // COMBINE_WARPS),),
            (32 * COMBINE_WARPS,)).launch(ws, ws_lse, *_output_pair(o4), lse3, _KIND[out.dtype],
                                          splits, B, D)


def _output_pair(o4: DeviceArray) -> tuple:
    """(out32, out16) kernel arguments: the output as f32, or as uint16 bits, beside an
    empty view of the other kind (never written)."""
    if o4.dtype == _F32:
        return o4, o4._view((0, 0, 0, 0), (2, 2, 2, 2), dtype=_U16)
    return o4._view((0, 0, 0, 0), (4, 4, 4, 4), dtype=_F32), o4._view(o4.shape, o4.strides,
                                                                       dtype=_U16)


def attention_ref(q, k, v, causal=False, scale=None):
    """float64 NumPy reference: (out, lse) with GQA, causal bottom-right; rows with no key
    give out 0 and lse −inf."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lead = 4 - q.ndim
    q4, k4, v4 = (x.reshape((1,) * lead + x.shape) for x in (q, k, v))
    G = q4.shape[1] // k4.shape[1]
    k4, v4 = np.repeat(k4, G, axis=1), np.repeat(v4, G, axis=1)
    Sq, Sk = q4.shape[2], k4.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q4, k4) * scale
    if causal:
        allowed = np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq)
        s = np.where(allowed, s, -np.inf)
    top = s.max(axis=-1, keepdims=True) if Sk else np.full(s.shape[:-1] + (1,), -np.inf)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(total > 0, np.einsum("bhqk,bhkd->bhqd", e, v4) / total, 0.0)
        lse = np.where(total[..., 0] > 0, top[..., 0] + np.log(total[..., 0]), -np.inf)
    return out.reshape(q.shape), lse.reshape(q.shape[:-1])


def attention_bwd_ref(dout, q, k, v, causal=False, scale=None):
    """float64 NumPy reference of the gradients: (dq, dk, dv) for the loss gradient
    ``dout`` of :func:`attention_ref`'s output; GQA's dk, dv summed over each group."""
    dout, q, k, v = (np.asarray(x, np.float64) for x in (dout, q, k, v))
    lead = 4 - q.ndim
    do4, q4, k4, v4 = (x.reshape((1,) * lead + x.shape) for x in (dout, q, k, v))
    B, Hkv, Sk, D = k4.shape
    G = q4.shape[1] // Hkv
    kr, vr = np.repeat(k4, G, axis=1), np.repeat(v4, G, axis=1)
    Sq = q4.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q4, kr) * scale
    if causal:
        allowed = np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq)
        s = np.where(allowed, s, -np.inf)
    top = s.max(axis=-1, keepdims=True) if Sk else np.zeros(s.shape[:-1] + (1,))
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    dp = np.einsum("bhqd,bhkd->bhqk", do4, vr)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bhqk,bhkd->bhqd", ds, kr)
    dk = scale * np.einsum("bhqk,bhqd->bhkd", ds, q4).reshape(B, Hkv, G, Sk, D).sum(axis=2)
    dv = np.einsum("bhqk,bhqd->bhkd", p, do4).reshape(B, Hkv, G, Sk, D).sum(axis=2)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def attention(q, k, v, *, causal=False, scale=None, return_lse=False, out=None):
    """Scaled dot-product attention: FlashAttention on tensor cores.

    ``softmax(scale · Q·Kᵀ) · V`` per head, in one pass over the keys (module doc of
    ``kaionb.kernels.attention``): wgmma on compute capability 9.0, mma.sync on every GPU
    from sm_80; float32 inputs run through bfloat16. Decode shapes split the keys
    (flash-decoding). Recorded on the active :class:`kaionb.grad.Tape` when q, k or v
    requires a gradient (backward: :func:`attention_bwd`). Every check runs before any
    launch.

    Parameters
    ----------
    q : DeviceArray or array_like
        [B, Hq, Sq, D], [Hq, Sq, D] or [Sq, D]; float16, bfloat16 or float32. Any strides
        with a contiguous last axis ([B, S, H, D] memory as a ``transpose(0, 2, 1, 3)``
        view, no copy). D a multiple of 8 in [8, 256].
    k, v : DeviceArray or array_like
        [B, Hkv, Sk, D] (same rank and dtype as q); Hq a multiple of Hkv (GQA/MQA).
    causal : bool, optional
        Mask keys j > i + Sk − Sq (bottom-right aligned).
    scale : float, optional
        Multiplies Q·Kᵀ (finite, > 0); default 1/sqrt(D).
    return_lse : bool, optional
        Also return the rows' log-sum-exp (float32, q.shape[:-1]), what the backward
        needs.
    out : DeviceArray, optional
        An array of q's shape and dtype to write (contiguous last axis, 16-byte aligned
        rows).

    Returns
    -------
    out : DeviceArray
        In q's shape and dtype. A row that sees no key (causal, Sq > Sk) gets zeros.
    lse : DeviceArray
        Only with ``return_lse``: float32, q.shape[:-1] (−inf for a row with no key).

    Raises
    ------
    TypeError
        An argument that is not an array, a dtype other than float16 / bfloat16 /
        float32 or mixed dtypes, a ``scale`` that is not a number, or an ``out`` that is
        not device memory or has another dtype.
    ValueError
        Shapes that do not match (rank, batch, heads, D, k vs v), D not a multiple of 8
        in [8, 256], a non-contiguous last axis, a ``scale`` that is not finite and > 0,
        arrays on two devices, or an ``out`` of the wrong shape or misaligned.

    Examples
    --------
    >>> q = kaionb.asarray(np.ones((1, 8, 128, 64), np.float16))   # [B, H, S, D]
    >>> kv = kaionb.asarray(np.ones((1, 2, 128, 64), np.float16))  # GQA: 2 KV heads
    >>> o, lse = kaionb.attention(q, kv, kv, causal=True, return_lse=True)
    >>> o.shape, o.dtype, lse.shape
    ((1, 8, 128, 64), dtype('float16'), (1, 8, 128))
    >>> o.get()[0, 0, 0, :3]
    array([1., 1., 1.], dtype=float16)
    """
    if not any(getattr(x, "requires_grad", False) for x in (q, k, v)):
        return attention_fwd(q, k, v, causal, scale, return_lse, out=out)
    result, lse = attention_fwd(q, k, v, causal, scale, True, out=out)
    record(lambda grad: attention_bwd(grad, q, k, v, result, lse, causal=causal, scale=scale,
                                      dtype=np.float32), (q, k, v), (result,))
    return (result, lse) if return_lse else result


@fast_path
def attention_bwd_fwd(dout, q, k, v, out, lse, causal=False, scale=None, dtype=None, *,
                      grads=None, op="attention_bwd"):
    """Validate, resolve the gradients and launch (:func:`attention_bwd`)."""
    q = as_array(op, "q", q, dtypes=_INPUT_DTYPES)
    k = as_array(op, "k", k, dtypes=_INPUT_DTYPES)
    v = as_array(op, "v", v, dtypes=_INPUT_DTYPES)
    _check_inputs(op, q, k, v)
    dout = as_array(op, "dout", dout, dtypes=_INPUT_DTYPES)
    out = as_array(op, "out", out, dtypes=_INPUT_DTYPES)
    lse = as_array(op, "lse", lse, dtypes=(_F32,))
    check_shape(op, "dout", dout, q.shape)
    check_shape(op, "out", out, q.shape)
    check_shape(op, "lse", lse, q.shape[:-1])
    for name, x in (("dout", dout), ("out", out), ("lse", lse)):
        if name != "lse":
            check_contiguous(op, name, x, last_axis_only=True)
        if x.device_id != q.device_id:
            fail(ValueError, op, name, f"device {q.device_id} (where 'q' is)",
                 f"device {x.device_id}")
    scale = _check_scale(op, scale, q.shape[-1])
    grad_dtype = output_dtype(op, dtype, grads, _INPUT_DTYPES, _DTYPE_NAMES, q.dtype, "grads")
    grads = outputs(op, grads, [(x.shape, grad_dtype, LAST_AXIS) for x in (q, k, v)],
                    device=q.device_id, name="grads")
    for i, g in enumerate(grads):
        if not _aligned(g):  # the kernels store 16 bytes at a time
            fail(ValueError, op, f"grads[{i}]", "16-byte aligned data and row strides",
                 f"pointer 0x{g.ptr:x}, strides {g.strides}")
    if q.size == 0 or k.size == 0:  # no query or no key: every gradient is 0
        for g in grads:
            g.fill(0)
        return grads
    return run(_attention_bwd_launch, dout, q, k, v, out, lse, bool(causal), scale,
               out=grads)


def _attention_bwd_launch(dout, q, k, v, out, lse, causal, scale, dq, dk, dv):
    """The preprocess (ℓ2, Δ), then the dK/dV and dQ kernels (helpers.attention_bwd)."""
    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    B, Hq, Sq, D = q4.shape
    Hkv, Sk = k4.shape[1], k4.shape[2]
    operand_dtype = _operand_dtype(q.dtype)
    operand = _OPERAND[operand_dtype]
    q4, k4, v4, do4, o4 = (_operand(x, operand_dtype)
                           for x in (q4, k4, v4, _as_4d(dout), _as_4d(out)))
    sq_pad = -(-Sq // STAT_ROWS) * STAT_ROWS
    lse2 = empty((B * Hq, sq_pad), _F32)
    delta = empty((B * Hq, sq_pad), _F32)
    lse3 = _as_4d(lse, rank=3)
    Plan.of(_attention_bwd_preprocess_kernel,
            (-(-(B * Hq * sq_pad) // PREPROCESS_WARPS),), (32 * PREPROCESS_WARPS,)).launch(
        o4, do4, lse3, _KIND[operand_dtype], lse2, delta, Sq, D)
    dkdv, dq_kernel = _BWD_KERNELS[(operand, _head_dim_class(D))]
    kind = _KIND[dq.dtype]
    scalars = (kind, Sq, Sk, D, Hq // Hkv, int(causal), scale * LOG2E, scale)
    blk = dkdv.block
    Plan.of(dkdv, (-(-Sk // blk.BN), Hkv, B), (blk.THREADS,), blk.SHARED_BYTES).launch(
        q4, k4, v4, do4, lse2, delta, *_output_pair(_as_4d(dk)), *_output_pair(_as_4d(dv)),
        *scalars)
    blk = dq_kernel.block
    Plan.of(dq_kernel, (-(-Sq // blk.BM), Hq, B), (blk.THREADS,), blk.SHARED_BYTES).launch(
        q4, k4, v4, do4, lse2, delta, *_output_pair(_as_4d(dq)), *scalars)


def attention_bwd(dout, q, k, v, out, lse, *, causal=False, scale=None, dtype=None,
                  grads=None):
    """Gradients of :func:`attention`: ``(dq, dk, dv)`` for the loss gradient ``dout``.

    From the forward's output ``out`` and ``lse`` (``attention(..., return_lse=True)``) —
    the softmax statistics are not recomputed. FlashAttention-2's backward on tensor
    cores (mma.sync), deterministic: bit-identical results run to run (no atomics; dQ has
    its own pass over the keys). GQA (dk, dv summed over the group), causal with
    Sq ≠ Sk.

    Parameters
    ----------
    dout : DeviceArray or array_like
        The gradient of the loss with respect to ``out``: q's shape, float16, bfloat16
        or float32 (rounded to the kernels' f16/bf16 operand type).
    q, k, v : DeviceArray or array_like
        As given to the forward.
    out : DeviceArray or array_like
        The forward's output (q's shape).
    lse : DeviceArray or array_like
        The forward's log-sum-exp (float32, q.shape[:-1]).
    causal : bool, optional
        As given to the forward.
    scale : float, optional
        As given to the forward (the same ``scale``; default 1/sqrt(D)).
    dtype : dtype, optional
        The gradients' dtype: q's by default; float32 keeps the f32 accumulators
        unrounded (the tape asks for it).
    grads : tuple of DeviceArray, optional
        (dq, dk, dv) arrays to write (shapes of q, k, v, one dtype — which sets ``dtype``
        when it is not given —, contiguous 16-byte aligned rows).

    Returns
    -------
    dq : DeviceArray
        In q's shape. Accumulation is float32 on tensor cores with P and dS rounded to
        the operand type (as FlashAttention-2); rows with no key contribute nothing.
    dk : DeviceArray
        In k's shape; GQA heads' dk is summed over each group of query heads.
    dv : DeviceArray
        In v's shape, summed as dk.

    Raises
    ------
    TypeError
        The forward's type checks for q, k, v; ``dout``, ``out`` or ``lse`` of another
        dtype; a ``dtype`` other than float16 / bfloat16 / float32; ``grads`` that is
        not three device arrays of one of those dtypes.
    ValueError
        The forward's shape checks for q, k, v; ``dout``, ``out`` or ``lse`` of another
        shape (an lse from another call) or device; a ``scale`` that is not finite and
        > 0; ``grads`` of other shapes or misaligned. All before any launch.

    Examples
    --------
    >>> q = kaionb.asarray(np.random.default_rng(0).standard_normal((2, 64, 64)),
    ...                    dtype=np.float16)                              # [H, S, D]
    >>> o, lse = kaionb.attention(q, q, q, return_lse=True)
    >>> dq, dk, dv = kaionb.attention_bwd(kaionb.ones_like(o), q, q, q, o, lse)
    >>> dq.shape, dv.dtype
    ((2, 64, 64), dtype('float16'))
    """
    return attention_bwd_fwd(dout, q, k, v, out, lse, causal, scale, dtype, grads=grads)


def _kaio_entry(name, causal, out_dtype, doc):
    def entry(q, k, v, *, scale=None, with_stats=False, out=None):
        for arg, x in (("q", q), ("k", k), ("v", v)):
            ndim = getattr(x, "ndim", None)
            if ndim is None:  # not an array: a TypeError, as as_array's, not a rank
                fail(TypeError, name, arg, "an array [S, D]", type(x).__name__)
            if ndim != 2:
                fail(ValueError, name, arg, "2 dimensions [S, D] (one head; "
                     "kaionb.attention takes batches and heads)", ndim)
        return attention_fwd(q, k, v, causal, scale, with_stats, out=out, dtype=out_dtype,
                             op=name)
    entry.__name__ = entry.__qualname__ = name
    result = "float32" if out_dtype is not None else "float16"
    mask = ("\n    Causal: query i sees the keys j <= i + Sk − Sq (bottom-right aligned)."
            if causal else "")
    entry.__doc__ = doc + f"""

    q [Sq, D], k and v [Sk, D]: one head. ``with_stats=True`` also returns the rows'
    log-sum-exp (float32 [Sq]) for a backward pass. The same kernels as
    :func:`attention` (no cap on Sk); ``scale`` defaults to 1/sqrt(D).{mask}

    Parameters
    ----------
    q : DeviceArray
        The queries [Sq, D] (float16; bfloat16 and float32 are taken too, as by
        :func:`attention`), contiguous last axis; D a multiple of 8 in [8, 256].
    k, v : DeviceArray
        The keys and values [Sk, D], q's dtype.
    scale : float, optional
        Multiplies Q·Kᵀ (finite, > 0); default 1/sqrt(D).
    with_stats : bool, optional
        Also return the rows' log-sum-exp (float32 [Sq]).
    out : DeviceArray, optional
        An [Sq, D] array of the output dtype to write (16-byte aligned rows).

    Returns
    -------
    DeviceArray or tuple of DeviceArray
        The output [Sq, D], or ``(out, lse)`` with ``with_stats``.

    Raises
    ------
    TypeError
        An argument that is not an array, a dtype other than float16 / bfloat16 /
        float32 or mixed dtypes, a ``scale`` that is not a number, or an ``out`` of
        another dtype.
    ValueError
        Arrays that are not 2-D [S, D], shapes that do not match, D not a multiple of 8
        in [8, 256], a non-contiguous last axis, a ``scale`` that is not finite and > 0,
        or an ``out`` of another shape or misaligned.

    Examples
    --------
    >>> q = kaionb.asarray(np.ones((128, 64), np.float16))
    >>> o = kaionb.{name}(q, q, q)
    >>> o.shape, o.dtype
    ((128, 64), dtype('{result}'))
    """
    return entry


attention_tc = _kaio_entry("attention_tc", False, _F32,
                           "KAIO's tensor-core attention: float16 inputs, float32 output.")
attention_tc_causal = _kaio_entry("attention_tc_causal", True, _F32,
                                  "KAIO's causal tensor-core attention: float16 inputs, "
                                  "float32 output.")
attention_flash = _kaio_entry("attention_flash", False, None,
                              "KAIO's FlashAttention: one head, output in the input dtype.")
attention_flash_causal = _kaio_entry("attention_flash_causal", True, None,
                                     "KAIO's causal FlashAttention: one head, output in the "
                                     "input dtype.")
