"""One block's share of an ``mma.sync`` GEMM, mainloop to global stores: the body every
mma.sync matmul kernel runs once it knows which output tile is its own (``kernels.matmul``
maps the grid onto one matrix; ``kernels.matmul_int8``'s QKV projection onto three).

    acc = A[m0:m0+BM, k_begin:k_end] · B[k_begin:k_end, n0:n0+BN]    (helpers.mma_pipeline)
    split-K: partials folded in split order by the tile's last block   (helpers.epilogue)
    s8: alpha · scale_a[row] · scale_b[col] · acc + bias[col]          (helpers.epilogue)
    out[m0:, n0:] = the staged tile as f32 / f16 / bf16, 16-byte chunks
"""

from __future__ import annotations

import functools

from numba import cuda, int32, uint8, float32

from kaionb.ptx_patches import device_function

from .epilogue import dequantize_row_chunk8, make_splitk_fold, store_row_chunk8
from .mma_pipeline import mma_pipeline
from .tiles import chunk_coords


@functools.lru_cache(maxsize=None)
def make_gemm_block(operand: str, a_kmajor: bool, b_kmajor: bool, loads: str, tile: tuple,
                    fold_group: int):
    """``gemm_block(a, b, out32, out16, ws, counters, M, N, K, lda, ldb, k_chunk, splits,
    kind, vec_ok, out_vec, alpha, scale_a, sa_mode, scale_b, sb_mode, bias, has_bias, m0,
    n0, bz, split)`` for the pipeline ``mma_pipeline(operand, a_kmajor, b_kmajor,
    loads, tile)``, called by every thread of the block:

    a, b         storage matrices [batch, rows, cols] of the pipeline; ``bz`` the batch entry
    out32, out16 the output [batch, M, N] (f32 for kind OUT_F32, else f16/bf16 bits; indexed
                 here, not by the caller: a 2-D view made before the mainloop would hold
                 its registers through it — 80 -> 96 for the s8 decode16 tile on sm_90a)
    ws, counters split-K workspace and arrival counters (``splits`` > 1), one per output
                 tile, numbered (bz · gridDim.y + blockIdx.y) · gridDim.x + blockIdx.x: the
                 grid's x and y must name each output tile of a batch entry once (computed
                 after the mainloop: passed in, it held registers through it and spilled
                 the sync tiles, 4-8 bytes)
    m0, n0       the tile's first row and column; ``split`` covers K from split·k_chunk
    alpha … has_bias   s8 only: the dequantization (helpers.epilogue.dequantize_row_chunk8)

    The function carries THREADS, SHARED_BYTES (dynamic shared memory) and BLOCK_TILE
    (BM, BN, BK) as attributes."""
    pipe = mma_pipeline(operand, a_kmajor, b_kmajor, loads, tile)
    ACC = pipe.accumulator
    INTEGER = operand == "s8"
    BM, BN = tile[0], tile[1]
    THREADS, MT, NT, CS = pipe.THREADS, pipe.MT, pipe.NT, pipe.CS
    CHUNKS = BM * BN // 8  # 8-column chunks of the output tile
    mainloop, stage_accumulators = pipe.mainloop, pipe.stage_accumulators
    fold = make_splitk_fold(fold_group)

    @device_function
    def gemm_block(a, b, out32, out16, ws, counters, M, N, K, lda, ldb, k_chunk, splits, kind,
                   vec_ok, out_vec, alpha, scale_a, sa_mode, scale_b, sb_mode, bias, has_bias,
                   m0, n0, bz, split):
        smem = cuda.shared.array(0, uint8)
        acc = cuda.local.array((MT, NT, 4), ACC)  # [m16 tile][n8 tile][C fragment]
        for i in range(MT):
            for j in range(NT):
                for e in range(4):
                    acc[i, j, e] = ACC(0)
        k_begin = split * k_chunk
        mainloop(smem, a, b, bz, lda, ldb, m0, n0, k_begin, min(K, k_begin + k_chunk), M,
                 N, vec_ok, acc)

        # Epilogue through shared memory: accumulators -> an f32 C tile (s8: the integer
        # sums as f32, scaled per chunk below), then each thread writes whole 8-column
        # chunks: coalesced 16-byte global stores.
        cuda.syncthreads()
        cs = cuda.shared.array(0, float32)
        stage_accumulators(cs, acc)
        cuda.syncthreads()
        if splits > 1:
            tile_id = ((bz * int32(cuda.gridDim.y) + int32(cuda.blockIdx.y))
                       * int32(cuda.gridDim.x) + int32(cuda.blockIdx.x))
            if not fold(ws, counters, cs, tile_id, split, splits, M - m0, N - n0, BM, BN, CS,
                        THREADS):
                return  # not the last split of this tile: the last one writes it
        tid = int32(cuda.threadIdx.x)
        for q in range((CHUNKS + THREADS - 1) // THREADS):
            if tid + q * THREADS < CHUNKS:
                r, c = chunk_coords(tid + q * THREADS, BN)
                if INTEGER:
                    dequantize_row_chunk8(cs, r * CS + c, m0 + r, n0 + c, M, N, alpha, scale_a,
                                          sa_mode, scale_b, sb_mode, bias, has_bias)
                store_row_chunk8(out32[bz], out16[bz], kind, m0 + r, n0 + c, M, N, out_vec,
                                 cs, r * CS + c)

    gemm_block.THREADS = THREADS
    gemm_block.SHARED_BYTES = pipe.SHARED_BYTES
    gemm_block.BLOCK_TILE = tuple(tile[:3])
    return gemm_block


__all__ = ["make_gemm_block"]
