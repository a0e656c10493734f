"""One block's GEMM for few rows (M ≤ 16, decode), weights streamed from global memory
straight into ``mma.sync`` fragments (``m16n8k32 s8`` for W8A8, ``m16n8k16`` for f16 /
bf16): no shared-memory ring, no cp.async, no ldmatrix — the weight bytes set the time,
so the kernel is a copy loop with tensor-core math on the side.

    acc[16, BN] = A[:, K] · B[K, n0:n0+BN]      each warp a slice of K
    out[:M, n0:] = alpha · scale_a[row] · scale_b[col] · Σ_warps acc + bias[col]

Both operands K-major (A [1, M, lda], B the [1, N, ldb] storage of a ``w.T`` view), rows
16-byte aligned and K % 16 == 0 (whole 16-byte pieces; the caller checks).

The K permutation. Lane (g, t) (g = lane // 4, t = lane % 4) loads bytes 16t .. 16t + 15 of
a 64-byte k step of column g: its four words are the B fragments of two mmas — (w0, w1) and
(w2, w3) — which the hardware reads as logical k 4t..4t+3 and 16+4t..16+4t+3 (s8 k32; k16
halves: 2t, 2t + 1 and 2t + 8, 2t + 9; helpers.fragments). A dot product does not depend on
the order of k, so A takes the same permutation: the same lane loads the same 16 bytes of
rows g and g + 8 of A, and word j of them is a0/a2 (row g) or a1/a3 (row g + 8) of the mma
that reads word j of B. Each load instruction of a warp then covers 64 contiguous bytes of 8
weight rows (whole sectors).

The warps of a block split K in contiguous slices (each a whole number of 64-byte steps) and
add their sums through shared memory: integers exactly, f32 in warp order, so the bits do
not change between runs. Two shapes (``CONFIGS``, by the rows the block serves), measured on
the H100 (docs/perf-log-matmul.md #16): M ≤ 8 takes 8 columns per block, 4 warps, 4 steps in
flight (50 registers: ~12 blocks per SM); M ≤ 16 holds A rows g + 8 too and amortizes them
over 16 columns, 8 warps, 2 steps.

``x_dtype`` (f16 / bf16, aligned rows) makes the block quantize a float x per token
first (helpers.int8's arithmetic: the bits of ``quantize_int8``) into shared memory —
after issuing its first weight loads, so the quantization's L2 round trips overlap the
weight stream instead of delaying it. (Quantizing into global scratch instead, every
block writing the same bytes, took 67 µs for the QKV shape at M = 1: the stores of
hundreds of blocks to one line serialize.)
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int32, uint32, uint64

from kaionb.ptx_patches import (
    device_function,
    global_addr,
    ld_global_nc_stream_v4_u32,
    ld_global_nc_v4_u32,
    ld_shared_v4_u32,
    shared_addr,
    st_shared_v2_u32,
)

from .epilogue import dequantize_row_chunk8, store_row_chunk8
from .int8 import QMAX, inverse_scale, quantize_word
from .mma_pipeline import OPERANDS
from .reduce import block_max
from .rowwise import CODECS

BM = 16  # the mma's rows: M ≤ BM
STEP_K = 64  # bytes of K per load instruction of a warp (4 lanes × 16 per column)
# rows served -> (8-column groups per warp, 64-byte k steps per iteration). A block has
# 16·8·groups / 32 warps (one output element per thread in the cross-warp sum), each with
# groups · steps 16-byte weight loads in flight per lane.
CONFIGS = {8: (1, 4), 16: (2, 2)}
QUANTIZE_MAX_M = 8  # rows a fused quantization serves (the M ≤ 8 shape)
# Blocks per SM the fused quantization's variant is built for (its launch bound): ptxas
# takes 96 registers without it (5 blocks per SM: 660 on an H100, under the 768 of the
# QKV shape at hidden 4096), 80 with it, no spills; 8 per SM spilled.
QUANTIZE_BLOCKS_PER_SM = 6


def stream_shape(rows: int) -> tuple:
    """(BN, THREADS) of the block serving ``rows`` (8 or 16)."""
    groups = CONFIGS[rows][0]
    return 8 * groups, BM * 8 * groups


@functools.lru_cache(maxsize=None)
def make_stream_block(operand: str, rows: int, x_dtype=None, prefetch: bool = False):
    """``stream_block(xf, a, b, out32, out16, M, N, K, kind, out_vec, alpha, scale_a,
    sa_mode, scale_b, sb_mode, bias, has_bias, n0)``, called by every thread of a block of
    THREADS: columns n0 .. n0 + BN − 1 of the M×N result, M ≤ ``rows`` (8 or 16).

    ``operand`` "s8" (m16n8k32, exact int32 sums, then the W8A8 dequantization) or
    "f16" / "bf16" (m16n8k16, f32 sums; the dequantization arguments unused). The lane
    layout of a 16-byte piece is the same for both: words 2h, 2h + 1 feed one mma, as B's
    (b0, b1) and as A's (a0, a2) of row g / (a1, a3) of row g + 8 — 8 int8 or 4 halves
    each, the k16 mma's pairs at logical 2t, 2t + 1 and 2t + 8, 2t + 9.

    a, b          storage [1, M, lda] and [1, N, ldb] (int8, or 16-bit bits), K-major,
                  16-byte aligned rows (the strides give the row addresses); K in
                  elements, a whole number of 16-byte pieces
    xf            ``x_dtype`` given: the float x [M, K] (aligned rows, M ≤ QUANTIZE_MAX_M),
                  quantized per row into dynamic shared memory (M · K bytes); ``a`` and
                  ``scale_a`` are then unused (the row scales are the block's own)
    out32, out16  the output [1, M, N] (f32 for kind OUT_F32, else f16 / bf16 bits)
    alpha … has_bias  the dequantization (helpers.epilogue.dequantize_row_chunk8)

    ``prefetch`` loads the weights with ``ld_global_nc_stream_v4_u32`` (no L1 line, L2
    fetches whole 256-byte blocks): on the H100 (docs/perf-log-matmul.md #17) it pays for
    long K slices — K = 8192 int8, M = 16: 90.1 -> 86.9 µs — and costs for short ones
    (K = 2048: 51.6 -> 54.9 µs); the caller picks by K.

    The function carries BN, THREADS, TILE, LAUNCH_BOUNDS (the kernel's) and its two
    halves as attributes: ``mainloop`` (the sums into shared memory) and ``store``."""
    GROUPS, STEPS = CONFIGS[rows]
    BN, THREADS = stream_shape(rows)
    WARPS = THREADS // 32
    CHUNKS = BM * BN // 8  # 8-column chunks of the output tile (the epilogue's stores)
    TILE = BM * BN
    ITER_K = STEP_K * STEPS
    B_WORDS = 4 * GROUPS * STEPS
    HI = rows > 8  # A rows g + 8 exist
    A_STEP = 8 if HI else 4  # a lane's A words per k step (rows g and g + 8, or g)
    A_WORDS = A_STEP * STEPS
    ACC_WORDS = 4 * GROUPS
    assert operand in ("s8", "f16", "bf16")
    INTEGER = operand == "s8"
    ELEM, mma, ACC = OPERANDS[operand].size, OPERANDS[operand].mma, OPERANDS[operand].accumulator
    QUANTIZE = x_dtype is not None
    assert not (QUANTIZE and (HI or not INTEGER))
    codec = CODECS[x_dtype] if QUANTIZE else None
    load_x, unpack = (codec.load, codec.unpack) if QUANTIZE else (None, None)
    load_piece = ld_global_nc_stream_v4_u32 if prefetch else ld_global_nc_v4_u32

    @device_function
    def load_weights(bw, b_addr, k, k_hi, t):
        """The iteration at ``k`` of the warp's slice: GROUPS · STEPS words4 of B into
        ``bw`` (zeros past ``k_hi``)."""
        for u in range(STEPS):
            at = k + u * STEP_K + t * 16
            for j in range(GROUPS):
                i = 4 * (u * GROUPS + j)
                w = (uint32(0), uint32(0), uint32(0), uint32(0))
                if at < k_hi:
                    w = load_piece(b_addr[j] + uint64(at))
                for e in range(4):
                    bw[i + e] = w[e]

    @device_function
    def quantize_to_shared(xf, xs, scales, M, K, tid):
        """Rows of ``xf`` quantized per row into ``xs`` (words, row r at r · K / 4) and
        their scales into ``scales``; visible after the caller's barrier. One 16-byte run
        of x per step (8 values: 16 at a time took 126 registers, with the weights'
        words in flight)."""
        scratch = cuda.shared.array(32, float32)
        f = cuda.local.array(8, float32)
        for r in range(M):
            m = float32(0.0)
            for c in range(tid, K // 8, THREADS):
                unpack(load_x(xf, r, 8 * c, K, 0), f, 0)
                for j in range(8):
                    m = max(m, abs(f[j]))
            m = block_max(m, scratch)
            inv = inverse_scale(m)
            if tid == 0:
                scales[r] = m * float32(1.0 / QMAX)
            for c in range(tid, K // 8, THREADS):
                unpack(load_x(xf, r, 8 * c, K, 0), f, 0)
                st_shared_v2_u32(shared_addr(xs, r * (K // 4) + 2 * c),
                                 (quantize_word(f, 0, inv), quantize_word(f, 4, inv)))

    @device_function
    def mainloop(xf, a, b, M, N, K, n0, cs, row_scales):
        """The integer sums of columns n0 .. n0 + BN − 1 as f32 into ``cs`` (shared, TILE,
        row-major [BM, BN]) and, for a fused quantization, x's row scales into
        ``row_scales`` (shared, QUANTIZE_MAX_M); both visible on return."""
        tid = int32(cuda.threadIdx.x)
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        KB = K * ELEM  # the walk is in bytes
        per_warp = (KB + WARPS * STEP_K - 1) // (WARPS * STEP_K) * STEP_K
        k_lo = warp * per_warp
        k_hi = min(KB, k_lo + per_warp)
        b_addr = cuda.local.array(GROUPS, uint64)
        for j in range(GROUPS):  # columns past N re-read the last one (never stored)
            b_addr[j] = global_addr(b, (0, min(n0 + j * 8 + g, N - 1), 0))
        bw = cuda.local.array(B_WORDS, uint32)
        load_weights(bw, b_addr, k_lo, k_hi, t)  # in flight through the quantization
        xs = cuda.shared.array(0, uint32)
        if QUANTIZE:
            quantize_to_shared(xf, xs, row_scales, M, K, tid)
            cuda.syncthreads()
        # Rows g and g + 8 of A (rows past M read as zeros, no load).
        has_lo, has_hi = g < M, g + 8 < M
        a_lo = global_addr(a, (0, min(g, M - 1), 0))
        a_hi = global_addr(a, (0, min(g + 8, M - 1), 0))
        acc = cuda.local.array(ACC_WORDS, ACC)
        for i in range(ACC_WORDS):
            acc[i] = ACC(0)
        aw = cuda.local.array(A_WORDS, uint32)
        k = k_lo
        while k < k_hi:
            for u in range(STEPS):
                at = k + u * STEP_K + t * 16
                lo = (uint32(0), uint32(0), uint32(0), uint32(0))
                hi = (uint32(0), uint32(0), uint32(0), uint32(0))
                if at < k_hi:
                    if QUANTIZE:
                        if has_lo:
                            lo = ld_shared_v4_u32(shared_addr(xs, g * (K // 4) + at // 4))
                    else:
                        if has_lo:
                            lo = ld_global_nc_v4_u32(a_lo + uint64(at))
                        if HI and has_hi:
                            hi = ld_global_nc_v4_u32(a_hi + uint64(at))
                for e in range(4):
                    aw[A_STEP * u + e] = lo[e]
                    if HI:
                        aw[A_STEP * u + 4 + e] = hi[e]
            for u in range(STEPS):
                for j in range(GROUPS):
                    i = 4 * (u * GROUPS + j)
                    for h in range(2):  # words 2h, 2h + 1: one k32 mma
                        a_lo0, a_lo1 = aw[A_STEP * u + 2 * h], aw[A_STEP * u + 2 * h + 1]
                        a_hi0, a_hi1 = uint32(0), uint32(0)
                        if HI:
                            a_hi0 = aw[A_STEP * u + 4 + 2 * h]
                            a_hi1 = aw[A_STEP * u + 4 + 2 * h + 1]
                        d = mma((a_lo0, a_hi0, a_lo1, a_hi1), (bw[i + 2 * h], bw[i + 2 * h + 1]),
                                (acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]))
                        for e in range(4):
                            acc[4 * j + e] = d[e]
            k += ITER_K
            if k < k_hi:
                load_weights(bw, b_addr, k, k_hi, t)

        # The warps' integer partials -> one f32 tile of sums (exact: any order).
        sums = cuda.shared.array((WARPS, BM, BN), ACC)
        for j in range(GROUPS):
            for e in range(4):  # the C fragment: rows g, g + 8; columns 2t, 2t + 1
                sums[warp, g + 8 * (e // 2), 8 * j + 2 * t + e % 2] = acc[4 * j + e]
        cuda.syncthreads()
        total = ACC(0)  # in warp order: the same f32 bits every run
        for w in range(WARPS):
            total += sums[w, tid // BN, tid % BN]
        cs[tid] = float32(total)
        cuda.syncthreads()

    @device_function
    def store(cs, out32, out16, M, N, kind, out_vec, alpha, scale_a, sa_mode, scale_b, sb_mode,
              bias, has_bias, n0):
        """``cs`` (the mainloop's sums) scaled into columns n0 .. of the output."""
        tid = int32(cuda.threadIdx.x)
        if tid < CHUNKS:
            r, c = tid // (BN // 8), 8 * (tid % (BN // 8))
            if INTEGER:
                dequantize_row_chunk8(cs, r * BN + c, r, n0 + c, M, N, alpha, scale_a, sa_mode,
                                      scale_b, sb_mode, bias, has_bias)
            store_row_chunk8(out32[0], out16[0], kind, r, n0 + c, M, N, out_vec, cs, r * BN + c)

    @device_function
    def stream_block(xf, a, b, out32, out16, M, N, K, kind, out_vec, alpha, scale_a, sa_mode,
                     scale_b, sb_mode, bias, has_bias, n0):
        cs = cuda.shared.array(TILE, float32)
        row_scales = cuda.shared.array(QUANTIZE_MAX_M, float32)
        mainloop(xf, a, b, M, N, K, n0, cs, row_scales)
        store(cs, out32, out16, M, N, kind, out_vec, alpha, row_scales if QUANTIZE else scale_a,
              sa_mode, scale_b, sb_mode, bias, has_bias, n0)

    stream_block.BN, stream_block.THREADS, stream_block.TILE = BN, THREADS, TILE
    stream_block.mainloop, stream_block.store = mainloop, store
    stream_block.LAUNCH_BOUNDS = (THREADS, QUANTIZE_BLOCKS_PER_SM) if QUANTIZE else THREADS
    return stream_block


__all__ = ["BM", "CONFIGS", "QUANTIZE_MAX_M", "make_stream_block", "stream_shape"]
