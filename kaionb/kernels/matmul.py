"""Matmul with NumPy's semantics on tensor cores: ``a @ b`` for float16, bfloat16 and
float32 inputs, batched, f32 accumulation.

    C[..., m, n] = Σ_k A[..., m, k] · B[..., k, n]   any M, N, K ≥ 1, batch dims broadcast

Two kernel families serve it. On compute capability 9.0, 16-bit operands of one matrix
each (a batch over a shared B folds into one) run the wgmma kernel of
:mod:`.matmul_hopper` wherever its TMA loads can (16-byte aligned rows) and the output
fills at least ~half the GPU with 128×128 tiles — or, for M > 16 and a fifth to half of
that, from K = 1024 with K split in two over a cluster (its "split" tiles, 128×64 or
128×128; ``matmul_hopper.choose_tile``). Everything else runs the ``mma.sync``
kernels below, built from :mod:`.helpers.mma_pipeline` (PTX ISA:
https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-mma;
design as CUTLASS's sm80 GEMM): f16/bf16 m16n8k16 or, for float32 inputs, tf32 m16n8k8 —
one pass ("tf32") or three on split operands ("tf32x3", float32 accuracy). Each block
computes a BM×BN tile of one batch entry (grid z = batch × K splits); the epilogue stages
the accumulators in shared memory and writes whole 16-byte chunks in the output's dtype.
Split-K in the same launch: each split writes its f32 partial to a cached workspace and the
last split of a tile to arrive sums them in split order (deterministic) and writes the
output (``helpers.epilogue.make_splitk_fold``).

Layouts without copies: an operand is read from its *storage* matrix, the row-major array
its memory is. A (M×K) is K-major (row-major A) or M-major (``x.T`` of a row-major K×M);
B (K×N) is N-major (row-major B) or K-major (``y.T`` of a row-major N×K). Copies are made
only where no kernel reads the layout: 16-bit A·B with both transposed (TT: B once),
float32 M-major A, batch dimensions that do not collapse into one stride, and matrices
with no unit stride.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import cuda, int32

from .._device import compute_capability, multiprocessor_count
from .._tensor_map import tma_compatible
from ..array import DeviceArray, bfloat16, empty, register_kernel
from ..grad import record
from ..validation import (
    as_array,
    as_out,
    check_contiguous,
    check_out,
    check_same_device,
    check_same_dtype,
    fail,
    output_dtype,
)
from . import matmul_hopper
from .helpers import OUT_BF16, OUT_F16, OUT_F32
from .helpers.epilogue import SCALE_NONE
from .helpers.gemm_block import make_gemm_block
from .helpers.mma_pipeline import OPERANDS
from .helpers.weight_stream import BM as STREAM_BM
from .helpers.weight_stream import make_stream_block, stream_shape
from .launch import kernel
from .op import Plan, arrival_workspace, fast_path, workspace

# -- tuning constants ------------------------------------------------------------------------

# Tile classes, helpers.mma_pipeline.Tile (BM, BN, BK, WARPS_M, WARPS_N, STAGES), per
# operand size and load pipeline.
# 16-bit large: 128×256×64 per block, 8 warps of 64×64 (32 mmas per 8 ldmatrix.x4 per
#   k-step: half the shared-memory reads per mma of 64×32 warps), 4 cp.async stages of
#   48 KB; 255 registers, one block per SM. With the fragment double buffer: 260 -> 310
#   TFLOP/s f16 at 4096³ on the H100 (docs/perf-log-matmul.md #5). The sync pipeline keeps
#   128×128: its next tile in registers (48) on top of a 64×64 warp tile's 192 spills.
# small: 64×64, 4 warps of 32×32, for grids that large tiles leave under one wave and
#   for the split-K decode shapes.
# s8 (int8 W8A8, :mod:`.matmul_int8`): the 16-bit tiles' bytes, BK doubled in elements;
#   decode16 128 wide (16 KB of B per stage): 92.5 vs 94.5 µs for 64 wide at M = 1,
#   K = 8192, N = 28672 on the H100; 6 stages or BK = 256 were slower (perf-log-matmul #14).
# tf32 (4-byte operands): the same warp tiles with BK halved (128-byte K-major rows); the
#   small tile keeps 2 stages (3 spilled 4-16 bytes on sm_89 / sm_90a, ptxas -v);
#   tf32x3's split fragments double the operand registers, so its large tile is 128×128.
# decode16 / decode64 (M ≤ 16 / ≤ 64, e.g. 16×4096×4096): B's K×N×2 bytes set the time
#   (32 MiB at 4096²: ~10 µs at 3.35 TB/s), so the tile's M is the problem's (no mma or
#   shared memory for rows that do not exist) and the ring keeps B in flight: decode16
#   has 3 × 8 KB of B in flight per block in a 40 KB ring (5 blocks fit an SM), decode64
#   3 × 16 KB in 96 KB (2 per SM). Little's law wants ~30-40 KB per SM at ~1.5 µs of
#   loaded latency. 16-row tiles need a K-major A (the k-step swizzle, helpers).
TILES = {
    ("s8", "async"): {"large": (128, 256, 128, 2, 4, 4), "small": (64, 64, 64, 2, 2, 4),
                      "decode16": (16, 128, 128, 1, 4, 4),
                      "decode64": (64, 128, 128, 2, 4, 4)},
    ("s8", "sync"): {"large": (128, 128, 128, 2, 4, 3), "small": (64, 64, 64, 2, 2, 4)},
    ("16bit", "async"): {"large": (128, 256, 64, 2, 4, 4), "small": (64, 64, 32, 2, 2, 4),
                         "decode16": (16, 64, 64, 1, 4, 4), "decode64": (64, 128, 64, 2, 4, 4)},
    ("16bit", "sync"): {"large": (128, 128, 64, 2, 4, 3), "small": (64, 64, 32, 2, 2, 4)},
    ("tf32", "async"): {"large": (128, 128, 32, 2, 4, 3), "small": (64, 64, 16, 2, 2, 2)},
    ("tf32", "sync"): {"large": (128, 128, 32, 2, 4, 3), "small": (64, 64, 32, 2, 2, 3)},
}
# The large tile pays once it (nearly) fills the GPU: below that, 64×64 tiles win.
LARGE_MIN_BLOCKS_PER_SM = 0.9
# Split-K: below this many blocks per SM the K loop is split (deterministic: partials to an
# f32 workspace, summed in split order); each split keeps at least MIN_SPLIT_K of K.
SPLIT_TARGET_BLOCKS_PER_SM = 2
MIN_SPLIT_K = 256
# Decode tiles, smallest first: the first whose BM covers M runs it. Splits fill about
# this many blocks per SM (one wave of resident blocks: no tail wave, and each split's
# partial costs BM×BN×4 bytes of L2 traffic twice).
DECODE_TILES = ("decode16", "decode64")
# Measured on the H100 at 4096² (benchmarks/decode_matmul_sweep.py, B from HBM): 4
# splits beat 8 for M = 1, 16 (0.86-0.89 vs 0.83-0.85 of cuBLAS) and 64 (0.54 vs 0.46).
DECODE_BLOCKS_PER_SM = {"decode16": 2, "decode64": 1}
# Split-K fold: partials each thread loads at once (helpers.epilogue.make_splitk_fold). The
# decode tiles' registers leave room for 8 (one round trip for 8 splits); 4 or more spilled
# the 255-register large sync tile on sm_80 (4 bytes), 8 the small TN-sync / tf32 tiles on
# sm_89 / sm_90a; other classes take 4.
FOLD_GROUP = {"decode16": 8, "decode64": 8, "large": 2}
# M up to STREAM_BM (16) with both operands K-major (B: the w.T view of a row-major [N, K]
# weight), 16-byte aligned rows and whole 16-byte pieces of K streams the weights into mma
# fragments (helpers.weight_stream: no split-K, no shared-memory ring) where that makes at
# least this many blocks per SM; fewer blocks keep the split-K decode tiles. int8 W8A8
# (kernels.matmul_int8) and 16-bit operands (H100, K = 8192, N = 28672, int8: 92.3 -> 81.3 µs
# at M = 1; docs/perf-log-matmul.md #16).
STREAM_MIN_BLOCKS_PER_SM = 1.0
# From this many bytes of K the weight stream asks L2 for whole 256-byte blocks of the
# weights (helpers.weight_stream's ``prefetch``), for both block shapes. H100, weights from
# HBM (docs/perf-log-matmul.md #17), the 16-row block (M > 8): K = 8192 90.1 -> 86.9 µs (N =
# 28672), 49.4 -> 48.4 (N = 14336); K = 4096 equal (N = 14336) or worse (N = 6144: 12.0 ->
# 13.3); K = 2048 51.6 -> 54.9. The 8-row block (half the warps: twice the run per warp)
# gains below it too (K = 2048: 43.3 -> 41.9; K = 4096: 23.3 -> 22.8) but loses on weights
# that stay in L2 (K = 4096, N = 6144 replayed: 7.0 -> 7.4): one threshold for both. The
# QKV stream kernels (K = hidden) keep the plain loads.
STREAM_PREFETCH_MIN_K_BYTES = 8192
# Output kinds (helpers.epilogue): a runtime flag, one kernel serves every out dtype.
_OUT_KIND = {np.dtype(np.float32): OUT_F32, np.dtype(np.float16): OUT_F16, bfloat16: OUT_BF16}
_OUT_DTYPE_NAMES = "float32, float16 or bfloat16"
# The tile group of each mma.sync operand type.
_GROUP = {"f16": "16bit", "bf16": "16bit", "tf32": "tf32", "tf32x3": "tf32", "s8": "s8"}
# float32 inputs: "highest" runs tf32x3 (float32 accuracy), "tf32" one tf32 pass.
PRECISIONS = {"highest": "tf32x3", "tf32": "tf32"}
DEFAULT_PRECISION = "highest"

# -- kernels ---------------------------------------------------------------------------------


def _make_matmul_kernel(operand: str, a_kmajor: bool, b_kmajor: bool, loads: str, tile: str):
    """One variant, built from :func:`helpers.gemm_block.make_gemm_block`. Arguments
    (outputs after inputs, sizes last):

    a, b     storage matrices ``[batch, rows, cols]`` (bits as unsigned integers; batch
             stride 0 broadcasts): A as M×K (``a_kmajor``) or K×M; B as N×K (``b_kmajor``)
             or K×N
    out32, out16   the output [batch, M, N] for kind OUT_F32, or OUT_F16/OUT_BF16
    ws, counters   split-K workspace (splits > 1): f32 partials, BM×BN per block, and one
             uint32 arrival counter per output tile, zero at launch (and left zero)
    M, N, K, lda, ldb, k_chunk (K per split, a multiple of BK), splits, kind
    vec_ok   the storage rows are 16-byte aligned: whole chunks load as 128 bits (sync)
    out_vec  the output rows are 16-byte aligned: 128-bit stores
    alpha, scale_a, sa_mode, scale_b, sb_mode, bias, has_bias   s8 only (else
             :data:`NO_DEQUANT`-like empty arguments): the integer sums become
             ``alpha · scale_a[row] · scale_b[col] · acc + bias[col]``
             (``helpers.epilogue.dequantize_row_chunk8``; f32 arrays, SCALE_* modes)

    Grid: (N tiles, M tiles, batch × splits).
    """
    block_tile = TILES[(_GROUP[operand], loads)][tile]
    gemm_block = make_gemm_block(operand, a_kmajor, b_kmajor, loads, block_tile,
                                 FOLD_GROUP.get(tile, 4))
    storage = OPERANDS[operand].storage
    signature = (f"void({storage}[:, :, :], {storage}[:, :, :], float32[:, :, ::1], "
                 "uint16[:, :, ::1], float32[::1], uint32[::1], int32, int32, int32, int32, "
                 "int32, int32, int32, int32, int32, int32, float32, float32[::1], int32, "
                 "float32[::1], int32, float32[::1], int32)")
    layout = ("n" if a_kmajor else "t") + ("t" if b_kmajor else "n")

    @kernel([signature], name=f"_matmul_fwd_kernel_{operand}_{layout}_{loads}_{tile}",
            max_dynamic_shared_bytes=gemm_block.SHARED_BYTES, launch_bounds=gemm_block.THREADS)
    def _matmul_fwd_kernel(a, b, out32, out16, ws, counters, M, N, K, lda, ldb, k_chunk, splits,
                           kind, vec_ok, out_vec, alpha, scale_a, sa_mode, scale_b, sb_mode,
                           bias, has_bias):
        bz = int32(cuda.blockIdx.z) // splits
        gemm_block(a, b, out32, out16, ws, counters, M, N, K, lda, ldb, k_chunk, splits, kind,
                   vec_ok, out_vec, alpha, scale_a, sa_mode, scale_b, sb_mode, bias, has_bias,
                   int32(cuda.blockIdx.y) * block_tile[0], int32(cuda.blockIdx.x) * block_tile[1],
                   bz, int32(cuda.blockIdx.z) - bz * splits)  # z % splits, no signed rem

    _matmul_fwd_kernel.threads = gemm_block.THREADS
    _matmul_fwd_kernel.shared_bytes = gemm_block.SHARED_BYTES
    _matmul_fwd_kernel.block_tile = gemm_block.BLOCK_TILE
    return _matmul_fwd_kernel


def _variants():
    """Every (operand, a_kmajor, b_kmajor, loads, tile) with a kernel: 16-bit operands ×
    layout (NN, NT, TN; TT copies B) × loads × tile class (16-row tiles only with a K-major
    A: helpers.mma_pipeline), tf32 / tf32x3 with a K-major A (a transposed f32 A is
    copied) × B either way, and s8 with both K-major (others are copied)."""
    for operand in ("f16", "bf16", "tf32", "tf32x3", "s8"):
        group = _GROUP[operand]
        layouts = {"tf32": ((True, False), (True, True)), "s8": ((True, True),),
                   "16bit": ((True, False), (True, True), (False, False))}[group]
        for a_k, b_k in layouts:
            for loads in ("sync", "async"):
                for tile, geometry in TILES[(group, loads)].items():
                    if a_k or geometry[0] >= 32:  # an M-major A tile: 64-byte rows
                        yield operand, a_k, b_k, loads, tile


_KERNELS = {v: _make_matmul_kernel(*v) for v in _variants()}
# The tile classes each (operand, a_kmajor, b_kmajor, loads) can run, for _choose.
_TILE_CHOICES: dict[tuple, dict] = {}
for _v in _KERNELS:
    _TILE_CHOICES.setdefault(_v[:4], {})[_v[4]] = TILES[(_GROUP[_v[0]], _v[3])][_v[4]]
del _v

# -- host entries ----------------------------------------------------------------------------

_F32, _U16, _U32 = np.dtype(np.float32), np.dtype(np.uint16), np.dtype(np.uint32)
_INPUT_DTYPES = (np.dtype(np.float16), bfloat16, _F32)
_16BIT_OPERAND = {np.dtype(np.float16): "f16", bfloat16: "bf16"}


class Operands(NamedTuple):
    """A matmul problem in the kernels' terms (:func:`plan_operands`)."""

    a: DeviceArray  # storage [batch, rows, cols] (A as M×K when a_kmajor, else K×M)
    lda: int
    a_kmajor: bool
    b: DeviceArray  # storage [batch, rows, cols] (B as N×K when b_kmajor, else K×N)
    ldb: int
    b_kmajor: bool
    batch: int
    m: int
    n: int
    k: int


def _storage(op: str, name: str, x: DeviceArray, k_axis: int):
    """(storage view, ld, k_major) of the 2-D operand ``x``, without copying when one axis
    has unit stride: the storage is row-major with rows of ``ld`` elements, ``x`` itself
    when its last axis is contiguous, ``x.T`` when its first is (a vector is stored along
    its length). Returns None when neither axis has unit stride."""
    rows, cols = x.shape
    isz = x.itemsize
    if rows > 1 and x.strides[0] == isz and (cols == 1 or x.strides[1] != isz):
        storage, ld, kmajor = x._view((cols, rows), (x.strides[1], isz)), x.strides[1], k_axis == 0
    elif cols == 1 or x.strides[1] == isz:
        storage, ld, kmajor = x._view((rows, cols), (x.strides[0], isz)), x.strides[0], k_axis == 1
    else:
        return None
    if ld % isz:
        fail(ValueError, op, name, "strides in whole elements", x.strides)
    ld //= isz
    if storage.shape[0] == 1 or ld < storage.shape[1]:
        ld = -(-storage.shape[1] // 8) * 8  # one row: ld never steps, keep it aligned
    return storage, ld, kmajor


def _batch_stride(x: DeviceArray, batch_shape: tuple):
    """The one stride (bytes) that walks ``x``'s batch dimensions broadcast to
    ``batch_shape`` (0 when broadcast), or None when they do not collapse into one."""
    lead = x.ndim - 2
    dims = []
    for i, d in enumerate(batch_shape):
        j = i - (len(batch_shape) - lead)
        own = x.shape[j] if j >= 0 else 1
        stride = x.strides[j] if j >= 0 and own > 1 else 0
        if d > 1:
            dims.append((d, stride))
    stride = dims[-1][1] if dims else 0
    for (_, outer), (d, inner) in zip(dims, dims[1:]):
        if outer != inner * d:
            return None
    return stride


def plan_operands(op: str, a: DeviceArray, b: DeviceArray, batch_shape: tuple) -> Operands:
    """The storage views of ``a`` [..., M, K] and ``b`` [..., K, N] (batch dimensions
    broadcast to ``batch_shape``) and their layouts, copying an operand only where no view
    serves: batch dimensions that do not collapse into one stride, or a matrix with no unit
    stride. A batched A over a shared B whose rows continue across the batch (any
    row-major A) folds into one (batch·M)×K matrix: the kernels see one large problem."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = math.prod(batch_shape)
    parts = []
    for name, x, k_axis in (("a", a, 1), ("b", b, 0)):
        x_batch = _batch_stride(x, batch_shape) if batch_shape else 0
        storage = _storage(op, name, _first_matrix(x), k_axis)
        if x_batch is None or storage is None:
            x = _broadcast(x, batch_shape).copy()
            x_batch = x.strides[-3] if batch > 1 else 0
            storage = _storage(op, name, _first_matrix(x), k_axis)
        parts.append((storage, x_batch))
    ((sa, lda, a_kmajor), a_batch), ((sb, ldb, b_kmajor), b_batch) = parts
    if batch > 1 and b_batch == 0 and a_kmajor and a_batch == m * lda * a.itemsize:
        sa, m, batch, a_batch = sa._view((batch * m, k), sa.strides), batch * m, 1, 0
    a3 = sa._view((batch,) + sa.shape, (a_batch,) + sa.strides)
    b3 = sb._view((batch,) + sb.shape, (b_batch,) + sb.strides)
    return Operands(a3, lda, a_kmajor, b3, ldb, b_kmajor, batch, m, n, k)


def _first_matrix(x: DeviceArray) -> DeviceArray:
    """The 2-D matrix at batch index 0 of ``x`` [..., R, C] (a view)."""
    return x[(0,) * (x.ndim - 2)] if x.ndim > 2 else x


def _broadcast(x: DeviceArray, batch_shape: tuple) -> DeviceArray:
    """``x`` [..., R, C] as a view of shape batch_shape + (R, C) (stride 0 where broadcast)."""
    lead = len(batch_shape) - (x.ndim - 2)
    strides = (0,) * lead + tuple(s if d > 1 else 0 for d, s in zip(x.shape[:-2], x.strides))
    return x._view(tuple(batch_shape) + x.shape[-2:], strides + x.strides[-2:])


def _aligned(x3: DeviceArray, ld: int) -> bool:
    """16-byte aligned rows in every batch: cp.async / 128-bit loads move whole chunks."""
    return x3.ptr % 16 == 0 and (ld * x3.itemsize) % 16 == 0 and x3.strides[0] % 16 == 0


def _choose(m: int, n: int, k: int, sms: int, tiles: dict, batch: int = 1,
            tile: str | None = None, splits: int | None = None):
    """(tile class, splits, k per split) for ``batch`` M×N×K problems on ``sms`` SMs: the
    first decode tile of ``tiles`` whose BM covers M, else the large tile where it fills the
    GPU, else the small one. ``tile``/``splits`` force either (tests, benchmarks)."""
    if tile is None:
        tile = next((t for t in DECODE_TILES if t in tiles and m <= tiles[t][0]), None)
    if tile is None:
        bm, bn = tiles["large"][:2]
        large = batch * math.ceil(m / bm) * math.ceil(n / bn) >= LARGE_MIN_BLOCKS_PER_SM * sms
        tile = "large" if large else "small"
    bm, bn, bk = tiles[tile][:3]
    if splits is None:
        blocks = batch * math.ceil(m / bm) * math.ceil(n / bn)
        if tile in DECODE_BLOCKS_PER_SM:  # rounded down: one wave of resident blocks
            splits = DECODE_BLOCKS_PER_SM[tile] * sms // blocks
        elif tile == "small":
            splits = math.ceil(SPLIT_TARGET_BLOCKS_PER_SM * sms / blocks)
        else:
            splits = 1
        splits = min(splits, k // MIN_SPLIT_K)
    k_chunk = math.ceil(math.ceil(k / max(1, splits)) / bk) * bk
    return tile, math.ceil(k / k_chunk), k_chunk


def _stream_rows(m: int) -> int:
    """The rows the streaming kernel for ``m`` (≤ 16) rows is built for: 8 or 16."""
    return 8 if m <= 8 else STREAM_BM


def _streams(m: int, k_bytes: int, aligned: bool, n_total: int, sms: int) -> bool:
    """Whether the weight-streaming kernel runs: few rows, whole 16-byte pieces of K
    (``k_bytes``) in 16-byte aligned rows (``aligned``: of both operands), and enough
    blocks over the ``n_total`` columns to fill the GPU."""
    if m > STREAM_BM or k_bytes % 16 or not aligned:
        return False
    bn = stream_shape(_stream_rows(m))[0]
    return -(-n_total // bn) >= STREAM_MIN_BLOCKS_PER_SM * sms


def _make_stream_kernel(operand: str, rows: int, prefetch: bool):
    """``a @ b`` for K-major operands and M ≤ ``rows``: one
    :func:`helpers.weight_stream.make_stream_block` per BN columns (grid: ceil(N / BN)).
    Arguments: a, b (storage [1, M, lda], [1, N, ldb]: int8 for "s8", 16-bit bits else),
    out32, out16 (kind's output [1, M, N]), M, N, K, kind, out_vec, then the W8A8
    dequantization (alpha, scale_a, sa_mode, scale_b, sb_mode, bias, has_bias; 16-bit
    operands pass empty arrays and SCALE_NONE, and the kernel reads none of them)."""
    stream_block = make_stream_block(operand, rows, prefetch=prefetch)
    BN = stream_block.BN
    element = "int8" if operand == "s8" else "uint16"
    signature = (f"void({element}[:, :, :], {element}[:, :, :], float32[:, :, ::1], "
                 "uint16[:, :, ::1], int32, int32, int32, int32, int32, float32, float32[::1], "
                 "int32, float32[::1], int32, float32[::1], int32)")

    @kernel([signature], launch_bounds=stream_block.LAUNCH_BOUNDS,
            name=f"_matmul_stream{rows}_fwd_kernel_{operand}{'_prefetch' if prefetch else ''}")
    def _matmul_stream_fwd_kernel(a, b, out32, out16, M, N, K, kind, out_vec, alpha, sa,
                                  sa_mode, sb, sb_mode, bias, has_bias):
        stream_block(a, a, b, out32, out16, M, N, K, kind, out_vec, alpha, sa, sa_mode, sb,
                     sb_mode, bias, has_bias, int32(cuda.blockIdx.x) * BN)

    _matmul_stream_fwd_kernel.bn = BN
    _matmul_stream_fwd_kernel.threads = stream_block.THREADS
    return _matmul_stream_fwd_kernel


_STREAM_KERNELS = {(operand, rows, prefetch): _make_stream_kernel(operand, rows, prefetch)
                   for operand in ("s8", "f16", "bf16") for rows in (8, STREAM_BM)
                   for prefetch in (False, True)}


def _stream_kernel(operand: str, m: int, k: int):
    """The weight-streaming kernel for ``m`` rows and ``k`` elements of K."""
    prefetch = k * OPERANDS[operand].size >= STREAM_PREFETCH_MIN_K_BYTES
    return _STREAM_KERNELS[(operand, _stream_rows(m), prefetch)]


def launch_stream(operand: str, p: Operands, out3: DeviceArray, kind: int, out_vec: bool,
                  dequant: tuple = (1.0, None, SCALE_NONE, None, SCALE_NONE, None, 0)) -> None:
    """Launch the weight-streaming kernel for ``p`` (one matrix, M ≤ STREAM_BM, K-major
    aligned operands: :func:`_streams` said yes) into ``out3`` [1, M, N]; ``dequant`` as
    :func:`_launch_mma`'s (W8A8: alpha, scale_a, sa_mode, scale_b, sb_mode, bias, has_bias),
    an absent array passed as an empty one."""
    kdef = _stream_kernel(operand, p.m, p.k)
    nothing = out3._view((0,), (4,), dtype=_F32)  # an argument no launch reads
    Plan.of(kdef, (-(-p.n // kdef.bn), 1, 1), (kdef.threads,)).launch(
        p.a, p.b, *output_pair(out3, kind), p.m, p.n, p.k, kind, int(out_vec), dequant[0],
        *(nothing if x is None else x for x in dequant[1:6]), dequant[6])


def _result_shape(op: str, a: DeviceArray, b: DeviceArray):
    """NumPy's matmul shapes: (a as [..., M, K], b as [..., K, N], batch shape, result
    shape). A 1-D a is a row [1, K] and a 1-D b a column [K, 1], their dimension dropped
    from the result; batch dimensions broadcast."""
    if a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0]:  # the common case, fast
        return a, b, (), (a.shape[0], b.shape[1])
    for name, x in (("a", a), ("b", b)):
        if x.ndim == 0:
            fail(ValueError, op, name, "an array of at least 1 dimension (0-d: use *)",
                 "a 0-d array")
    a2 = a._view((1,) + a.shape, (0,) + a.strides) if a.ndim == 1 else a
    b2 = b._view(b.shape + (1,), b.strides + (0,)) if b.ndim == 1 else b
    if b2.shape[-2] != a2.shape[-1]:
        fail(ValueError, op, "b", f"{a2.shape[-1]} rows (a is {a.shape}: inner dimensions "
             "must match)", f"shape {b.shape}")
    try:
        batch_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        fail(ValueError, op, "b", f"batch dimensions that broadcast with a's {a.shape[:-2]}",
             f"shape {b.shape}")
    shape = batch_shape + ((a2.shape[-2],) if a.ndim > 1 else ()) + (
        (b2.shape[-1],) if b.ndim > 1 else ())
    return a2, b2, tuple(batch_shape), shape


def _output(op: str, out, dtype, shape: tuple, a: DeviceArray, default=None) -> DeviceArray:
    """The output: ``out`` checked (shape, dtype, ``a``'s device, C-contiguous), or a new
    array of ``dtype`` (default: ``out``'s dtype, else ``default``, else ``a``'s)."""
    if out is not None:
        out = as_out(op, out)  # one array (a tuple is no out here)
    dtype = output_dtype(op, dtype, out, _OUT_KIND, _OUT_DTYPE_NAMES,
                         a.dtype if default is None else default)
    if out is None:
        return empty(shape, dtype)
    out = check_out(op, out, shape, dtype)
    check_same_device(op, a=a, out=out)
    check_contiguous(op, "out", out)
    return out


# Hopper launch plans of the public entries, keyed by both operands' (address, shape,
# strides, dtype, device): a repeated call skips validation, the layout analysis and the
# tile choice (the key pins all of them) and costs an allocation and a launch. Plans hold
# scalars and tensor maps, never the operands themselves.
_HOPPER_PLANS: dict[tuple, "matmul_hopper.LaunchPlan"] = {}
HOPPER_PLAN_CACHE = 256


@fast_path
def matmul_fwd(op: str, a, b, *, dtypes=_INPUT_DTYPES, loads: str = "async", out=None,
               dtype=None, default_dtype=None, precision: str = DEFAULT_PRECISION,
               tile: str | None = None, splits: int | None = None,
               prefer_wgmma: bool = True) -> DeviceArray:
    """Validate and launch ``a @ b`` with NumPy's matmul semantics (1-D operands,
    broadcast batch dimensions) for inputs of one of ``dtypes``; the result in ``dtype``
    (default: ``out``'s, else ``default_dtype``, else the inputs').

    ``loads``: the mma.sync pipeline, "sync" or "async" ("async" falls back to "sync"
    where a storage row is not 16-byte aligned: cp.async moves whole 16-byte chunks), or
    "wgmma" (the Hopper kernel of :mod:`.matmul_hopper`; ValueError where the GPU or the
    operands cannot run it). ``prefer_wgmma``: run the Hopper kernel instead wherever it
    can and the shape fills the GPU, and the weight stream (helpers.weight_stream) for M ≤
    16 with K-major operands; False keeps the mma.sync tiles. ``precision``: float32
    inputs, "highest" (tf32x3) or "tf32". ``tile``/``splits`` override the shape-class
    choice (tests, benchmarks).
    """
    if prefer_wgmma and tile is None and splits is None and type(a) is type(b) is DeviceArray:
        key = (a.ptr, a.shape, a.strides, a.dtype, a.device, b.ptr, b.shape, b.strides,
               b.dtype, b.device, dtypes)
        plan = _HOPPER_PLANS.get(key)
        if plan is not None:
            result = _output(op, out, dtype, plan.shape, a, default_dtype)
            if result.ptr % 16 == 0:  # else the long way: mma.sync takes any output
                matmul_hopper.run(plan, result, _OUT_KIND[result.dtype])
                return result
    else:
        key = None
    a = as_array(op, "a", a, dtypes=dtypes)
    b = as_array(op, "b", b, dtypes=dtypes)
    check_same_dtype(op, a=a, b=b)
    check_same_device(op, a=a, b=b)
    if precision not in PRECISIONS:
        fail(ValueError, op, "precision", " or ".join(map(repr, PRECISIONS)), repr(precision))
    a2, b2, batch_shape, shape = _result_shape(op, a, b)
    out = _output(op, out, dtype, shape, a, default_dtype)
    if out.size == 0:
        return out
    if a2.shape[-1] == 0:
        return out.fill(0)
    p = plan_operands(op, a2, b2, batch_shape)
    if max(p.lda * p.a.shape[1], p.ldb * p.b.shape[1]) >= 2**31:
        fail(ValueError, op, "a", "matrices of fewer than 2**31 elements", (a.shape, b.shape))
    kind = _OUT_KIND[out.dtype]
    out3 = out._view((p.batch, p.m, p.n), (p.m * p.n * out.itemsize, p.n * out.itemsize,
                                           out.itemsize))
    out_vec = out.ptr % 16 == 0 and p.n % 8 == 0
    operand = _16BIT_OPERAND.get(a.dtype) or PRECISIONS[precision]

    sms = multiprocessor_count()
    # Decode: the weight stream before the Hopper kernel (whose 128-row tiles run M = 1 at
    # about half the weights' read rate: 297 against 162 µs for cuBLAS at K = 8192, N =
    # 28672 f16 on the H100).
    if (prefer_wgmma and operand in ("f16", "bf16") and loads == "async" and tile is None
            and splits is None and p.batch == 1 and p.a_kmajor and p.b_kmajor
            and _streams(p.m, p.k * 2, _aligned(p.a, p.lda) and _aligned(p.b, p.ldb), p.n, sms)):
        launch_stream(operand, p, out3, kind, out_vec)
        return out
    hopper_ok = (operand in ("f16", "bf16") and p.batch == 1 and out_vec
                 and compute_capability() == (9, 0) and tma_compatible(p.a[0], p.lda)
                 and tma_compatible(p.b[0], p.ldb))
    if loads == "wgmma":
        if not hopper_ok:
            fail(ValueError, op, "a, b", "16-bit operands of one matrix each on a compute "
                 "capability 9.0 GPU, 16-byte aligned operand and output rows for the wgmma "
                 "kernel", f"{a.dtype}, cc {compute_capability()}, batch {p.batch}, row "
                 f"strides {p.lda}, {p.ldb}, {p.n} elements")
        hopper_tile = tile or matmul_hopper.choose_tile(p.m, p.n, sms, p.k) or "narrow"
    else:
        hopper_tile = (matmul_hopper.choose_tile(p.m, p.n, sms, p.k)
                       if prefer_wgmma and hopper_ok and tile is None and splits is None
                       else None)
    if hopper_tile is not None:
        plan = matmul_hopper.launch(operand, hopper_tile, p.a[0], p.lda, p.a_kmajor, p.b[0],
                                    p.ldb, p.b_kmajor, out, p.m, p.n, p.k, kind, shape,
                                    splits=splits)
        # Only plans over the operands' own memory: a copied operand dies with this call.
        if key is not None and p.a.ptr == a.ptr and p.b.ptr == b.ptr:
            if len(_HOPPER_PLANS) >= HOPPER_PLAN_CACHE:
                _HOPPER_PLANS.pop(next(iter(_HOPPER_PLANS)))  # the oldest
            _HOPPER_PLANS[key] = plan
        return out
    _launch_mma(op, p, operand, out3, kind, out_vec, loads, tile, splits, sms)
    return out


def _launch_mma(op, p: Operands, operand, out3, kind, out_vec, loads, tile, splits, sms,
                dequant=None):
    """The mma.sync kernels: the variant for the layouts, load pipeline and tile class."""
    _run_mma(_plan_mma(op, p, operand, out3, kind, out_vec, loads, tile, splits, sms, dequant))


class _MmaLaunch(NamedTuple):
    """One mma.sync launch, all but the split-K workspace (:func:`_run_mma` gets it)."""

    kernel: object  # the CompiledKernel
    grid: tuple
    threads: int
    shared_bytes: int
    args: tuple  # the kernel's arguments, ws and counters empty (_run_mma fills them in)
    ws_bytes: int  # split-K partials (0: one split)
    n_counters: int


def _plan_mma(op, p: Operands, operand, out3, kind, out_vec, loads, tile, splits, sms,
              dequant=None) -> _MmaLaunch:
    """Pick the variant, tile class and splits for ``p`` and lay out the arguments.
    ``dequant``: the s8 kernels' (alpha, scale_a, sa_mode, scale_b, sb_mode, bias,
    has_bias) (kernel doc), None for an absent array."""
    a, lda, a_kmajor, b, ldb, b_kmajor = p.a, p.lda, p.a_kmajor, p.b, p.ldb, p.b_kmajor
    if operand == "s8":  # both K-major: no transposing ldmatrix for 8-bit tiles
        if not a_kmajor:
            a, lda, a_kmajor = _copy_transposed(a, a_kmajor)
        if not b_kmajor:
            b, ldb, b_kmajor = _copy_transposed(b, b_kmajor)
    elif not a_kmajor and (b_kmajor or operand.startswith("tf32")):
        # No kernel reads this pair: TT (16-bit) makes B N-major, tf32 needs a K-major A.
        if operand.startswith("tf32"):
            a, lda, a_kmajor = _copy_transposed(a, a_kmajor)
        else:
            b, ldb, b_kmajor = _copy_transposed(b, b_kmajor)
    vec_ok = _aligned(a, lda) and _aligned(b, ldb)
    if loads != "sync" and not vec_ok:
        loads = "sync"
    tiles = _TILE_CHOICES[(operand, a_kmajor, b_kmajor, loads)]
    if tile is not None and tile not in tiles:
        fail(ValueError, op, "tile", f"one of {sorted(tiles)} for this layout and pipeline",
             repr(tile))
    tile, n_splits, k_chunk = _choose(p.m, p.n, p.k, sms, tiles, p.batch, tile, splits)
    kdef = _KERNELS[(operand, a_kmajor, b_kmajor, loads, tile)]
    bm, bn, _ = kdef.block_tile
    out32, out16 = output_pair(out3, kind)
    grid = (math.ceil(p.n / bn), math.ceil(p.m / bm), p.batch * n_splits)
    nothing = out3._view((0,), (4,), dtype=_F32)  # an argument no launch reads
    no_ws = (nothing, out3._view((0,), (4,), dtype=_U32))
    if dequant is None:
        dequant = (1.0, None, SCALE_NONE, None, SCALE_NONE, None, 0)
    dequant = tuple(nothing if x is None else x for x in dequant)  # absent arrays
    args = (a, b, out32, out16) + no_ws + (p.m, p.n, p.k, lda, ldb, k_chunk, n_splits, kind,
                                           int(vec_ok), int(out_vec)) + tuple(dequant)
    tiles_out = grid[0] * grid[1] * p.batch
    ws_bytes = tiles_out * n_splits * bm * bn * 4 if n_splits > 1 else 0
    return _MmaLaunch(kdef[0], grid, kdef.threads, kdef.shared_bytes, args, ws_bytes,
                      tiles_out if n_splits > 1 else 0)


def output_pair(out3: DeviceArray, kind: int) -> tuple:
    """The kernels' (out32, out16) arguments for the output ``out3`` [batch, M, N] of
    ``kind``: the array itself as the one its kind writes, an empty view as the other."""
    if kind == OUT_F32:
        return out3, out3._view((1, 0, 0), (2, 2, 2), dtype=_U16)
    return out3._view((1, 0, 0), (4, 4, 4), dtype=_F32), out3._view(out3.shape, out3.strides,
                                                                    dtype=_U16)


def _run_mma(plan: _MmaLaunch) -> None:
    """Launch a planned mma.sync kernel on the current stream (with its workspace)."""
    args = plan.args
    if plan.ws_bytes:
        args = args[:4] + workspace(arrival_workspace, plan.ws_bytes, plan.n_counters) + \
            args[6:]
    plan.kernel(plan.grid, (plan.threads,), args, shared_mem=plan.shared_bytes)


def _copy_transposed(x3: DeviceArray, kmajor: bool):
    """(storage, ld, k_major) of a storage operand [batch, rows, cols] copied into the
    other orientation (the transposed matrices, contiguous; a broadcast batch once)."""
    batch = x3.shape[0]
    shared = x3.strides[0] == 0 or batch == 1
    t = (x3[:1] if shared else x3).transpose(0, 2, 1).copy()
    t3 = t._view((batch,) + t.shape[1:], (0 if shared else t.strides[0],) + t.strides[1:])
    return t3, t.shape[2], not kmajor


def matmul_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 NumPy reference: the inputs as given (already f16/bf16-rounded), upcast."""
    return np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))


# -- public functions ------------------------------------------------------------------------

_F16, _BF16 = (np.dtype(np.float16),), (bfloat16,)


def matmul_tc(a, b, *, out=None, dtype=None) -> DeviceArray:
    """Multiply float16 matrices on tensor cores, float32 result: KAIO's ``matmul_tc``.

    ``a @ b`` for float16 a (M×K) and b (K×N) with f32 accumulation; the result is
    float32 by default (``dtype``, or ``out``'s dtype: float16 or bfloat16 too). The
    mma.sync kernel with register-staged loads, or on compute capability 9.0 the wgmma
    kernel where the operand rows are 16-byte aligned and the output fills the GPU. Any
    M, N, K; ``a.T`` / ``b.T`` views without copies. See :func:`matmul` for batches.

    Parameters
    ----------
    a : DeviceArray
        The float16 [M, K] matrix (NumPy's matmul rules: 1-D and batched ones too).
    b : DeviceArray
        The float16 [K, N] matrix.
    out : DeviceArray, optional
        A C-contiguous [M, N] array to write (float32, float16 or bfloat16).
    dtype : dtype, optional
        The result dtype: float32 (default), float16 or bfloat16.

    Returns
    -------
    DeviceArray
        ``a @ b`` [M, N] (``out`` itself when given).

    Raises
    ------
    TypeError
        Inputs that are not float16 (or not arrays), or an output dtype other than
        float32, float16 or bfloat16.
    ValueError
        Inner dimensions that differ, an ``out`` of another shape, not C-contiguous or on
        another device, or inputs on two devices.

    Examples
    --------
    >>> a = kaionb.asarray(np.ones((2, 3), np.float16))
    >>> b = kaionb.asarray(np.ones((3, 4), np.float16))
    >>> kaionb.matmul_tc(a, b).get()
    array([[3., 3., 3., 3.],
           [3., 3., 3., 3.]], dtype=float32)
    """
    return matmul_fwd("matmul_tc", a, b, dtypes=_F16, loads="sync", out=out, dtype=dtype,
                      default_dtype=np.float32)


def matmul_tc_bf16(a, b, *, out=None, dtype=None) -> DeviceArray:
    """Multiply bfloat16 matrices on tensor cores, float32 result: :func:`matmul_tc` for bfloat16.

    Parameters
    ----------
    a : DeviceArray
        The bfloat16 [M, K] matrix.
    b : DeviceArray
        The bfloat16 [K, N] matrix.
    out : DeviceArray, optional
        A C-contiguous [M, N] array to write (float32, float16 or bfloat16).
    dtype : dtype, optional
        The result dtype: float32 (default), float16 or bfloat16.

    Returns
    -------
    DeviceArray
        ``a @ b`` [M, N] (``out`` itself when given).

    Raises
    ------
    TypeError
        Inputs that are not bfloat16 (or not arrays), or an output dtype other than
        float32, float16 or bfloat16.
    ValueError
        Inner dimensions that differ, an ``out`` of another shape, not C-contiguous or on
        another device, or inputs on two devices.

    Examples
    --------
    >>> a = kaionb.ones((2, 3), dtype=kaionb.bfloat16)
    >>> kaionb.matmul_tc_bf16(a, a.T).get()
    array([[3., 3.],
           [3., 3.]], dtype=float32)
    """
    return matmul_fwd("matmul_tc_bf16", a, b, dtypes=_BF16, loads="sync", out=out, dtype=dtype,
                      default_dtype=np.float32)


def matmul_tc_async(a, b, *, out=None, dtype=None) -> DeviceArray:
    """Multiply float16 matrices with the cp.async pipeline: :func:`matmul_tc`, async loads.

    As :func:`matmul_tc` with the 4-stage cp.async pipeline on the mma.sync path
    (16-byte-aligned rows; other inputs run the register-staged kernel).

    Parameters
    ----------
    a : DeviceArray
        The float16 [M, K] matrix.
    b : DeviceArray
        The float16 [K, N] matrix.
    out : DeviceArray, optional
        A C-contiguous [M, N] array to write (float32, float16 or bfloat16).
    dtype : dtype, optional
        The result dtype: float32 (default), float16 or bfloat16.

    Returns
    -------
    DeviceArray
        ``a @ b`` [M, N] (``out`` itself when given).

    Raises
    ------
    TypeError
        Inputs that are not float16 (or not arrays), or an output dtype other than
        float32, float16 or bfloat16.
    ValueError
        Inner dimensions that differ, an ``out`` of another shape, not C-contiguous or on
        another device, or inputs on two devices.

    Examples
    --------
    >>> a = kaionb.ones((2, 3), dtype=np.float16)
    >>> kaionb.matmul_tc_async(a, a.T, dtype=np.float16).get()
    array([[3., 3.],
           [3., 3.]], dtype=float16)
    """
    return matmul_fwd("matmul_tc_async", a, b, dtypes=_F16, out=out, dtype=dtype,
                      default_dtype=np.float32)


def matmul_tc_bf16_async(a, b, *, out=None, dtype=None) -> DeviceArray:
    """Multiply bfloat16 matrices with the cp.async pipeline: :func:`matmul_tc_async` for bfloat16.

    Parameters
    ----------
    a : DeviceArray
        The bfloat16 [M, K] matrix.
    b : DeviceArray
        The bfloat16 [K, N] matrix.
    out : DeviceArray, optional
        A C-contiguous [M, N] array to write (float32, float16 or bfloat16).
    dtype : dtype, optional
        The result dtype: float32 (default), float16 or bfloat16.

    Returns
    -------
    DeviceArray
        ``a @ b`` [M, N] (``out`` itself when given).

    Raises
    ------
    TypeError
        Inputs that are not bfloat16 (or not arrays), or an output dtype other than
        float32, float16 or bfloat16.
    ValueError
        Inner dimensions that differ, an ``out`` of another shape, not C-contiguous or on
        another device, or inputs on two devices.

    Examples
    --------
    >>> a = kaionb.ones((2, 3), dtype=kaionb.bfloat16)
    >>> kaionb.matmul_tc_bf16_async(a, a.T).shape
    (2, 2)
    """
    return matmul_fwd("matmul_tc_bf16_async", a, b, dtypes=_BF16, out=out, dtype=dtype,
                      default_dtype=np.float32)


def matmul(a, b, *, out=None, dtype=None, precision: str = DEFAULT_PRECISION) -> DeviceArray:
    """Matrix product ``a @ b`` on tensor cores, as ``numpy.matmul``.

    a [..., M, K] @ b [..., K, N] → [..., M, N], batch dimensions broadcast (one launch
    for the batch), a 1-D a (K,) is a row and a 1-D b (K,) a column whose dimension
    leaves the result. Any M, N, K; transposed views (``x.T``) are read without copies.

    Inputs: float16, bfloat16 or float32, both the same. Accumulation is float32 on
    tensor cores; the result has the inputs' dtype, or ``dtype`` (float32, float16 or
    bfloat16; e.g. float32 results of float16 inputs). float32 inputs run on tf32 tensor
    cores: ``precision="highest"`` (the default) splits each operand into two tf32 parts
    and keeps float32 accuracy (relative error ~1e-6, 3 mmas per step), ``"tf32"`` runs
    one pass (10-bit mantissas: relative error ~1e-3, about 3× faster). On compute
    capability 9.0, 16-bit operands with 16-byte aligned rows run a wgmma + TMA kernel
    when the output fills the GPU, and for M > 16 with K ≥ 1024 on smaller grids of at
    least a fifth of the GPU (K split in two); elsewhere mma.sync. Results are the same
    bits from run to run.

    Recorded on the active ``kaionb.grad.Tape`` when an input requires a gradient
    (dA = dC·Bᵀ, dB = Aᵀ·dC, float32 gradients).

    Parameters
    ----------
    a : DeviceArray or array_like
        [..., M, K] or (K,); float16, bfloat16 or float32.
    b : DeviceArray or array_like
        [..., K, N] or (K,); a's dtype.
    out : DeviceArray, optional
        A C-contiguous array of the result's shape to write; its dtype is the result's
        unless ``dtype`` is given.
    dtype : dtype, optional
        The result dtype: float32, float16 or bfloat16 (default: the inputs').
    precision : {"highest", "tf32"}, optional
        For float32 inputs: tf32x3 (float32 accuracy) or one tf32 pass.

    Returns
    -------
    DeviceArray
        The product [..., M, N] (``out`` itself when given).

    Raises
    ------
    TypeError
        Inputs that are not arrays or not float16 / bfloat16 / float32, inputs of two
        dtypes, or an output dtype other than float32, float16 or bfloat16 (an ``out``
        that is not device memory included).
    ValueError
        Inner dimensions that differ, batch dimensions that do not broadcast, a 0-d
        operand, an unknown ``precision``, an ``out`` of another shape, not C-contiguous
        or on another device, operand rows not a whole number of elements apart, or
        inputs on two devices.

    Examples
    --------
    >>> a = kaionb.asarray(np.ones((2, 3), np.float16))
    >>> b = kaionb.asarray(np.ones((3, 4), np.float16))
    >>> c = a @ b
    >>> c.shape, c.dtype
    ((2, 4), dtype('float16'))
    >>> kaionb.matmul(a, b, dtype=np.float32).get()[0]
    array([3., 3., 3., 3.], dtype=float32)
    """
    a = as_array("matmul", "a", a)
    b = as_array("matmul", "b", b)
    result = matmul_fwd("matmul", a, b, out=out, dtype=dtype, precision=precision)
    if a.requires_grad or b.requires_grad:
        record(lambda g: _matmul_backward(a, b, g, precision), (a, b), (result,))
    return result


def _matmul_backward(a, b, grad, precision):
    """For C = A @ B: dA = dC·Bᵀ, dB = Aᵀ·dC on transposed views (no copies); dC is
    rounded to the inputs' dtype for the tensor cores; results are float32. 1-D operands
    run as their row/column matrices; a B shared by a batch of A gets the batch's sum
    (one matmul over the folded batch)."""
    a2, b2, batch_shape, _ = _result_shape("matmul", a, b)
    g = grad.astype(a.dtype).reshape(batch_shape + (a2.shape[-2], b2.shape[-1]))
    kw = dict(dtype=np.float32, precision=precision)
    grad_a = grad_b = None
    if a.requires_grad:
        if a2.shape[:-2] != batch_shape:
            _unsupported_broadcast("a", a)
        grad_a = matmul_fwd("matmul", g, _swap(b2), **kw).reshape(a.shape)
    if b.requires_grad:
        if b2.shape[:-2] == batch_shape:
            grad_b = matmul_fwd("matmul", _swap(a2), g, **kw)
        elif b2.ndim == 2 and a2.is_c_contiguous:
            k, m = a2.shape[-1], math.prod(a2.shape[:-1])
            grad_b = matmul_fwd("matmul", a2.reshape(m, k).T, g.reshape(m, g.shape[-1]), **kw)
        else:
            _unsupported_broadcast("b", b)
        grad_b = grad_b.reshape(b.shape)
    return grad_a, grad_b


def _swap(x: DeviceArray) -> DeviceArray:
    """x with its last two axes swapped (a view)."""
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return x.transpose(*axes)


def _unsupported_broadcast(name, x):
    raise NotImplementedError(
        f"matmul backward: the gradient of '{name}' (shape {x.shape}) would need a sum over "
        "broadcast batch dimensions; supported: matching batches, or a 2-D b shared by a "
        "C-contiguous batch of a")


register_kernel("matmul", matmul)  # DeviceArray.__matmul__ (``a @ b``)
