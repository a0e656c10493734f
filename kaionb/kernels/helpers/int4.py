"""W4A16 on the tensor cores: the packed INT4 weight layout, its dequantization into mma
fragments, and one block's weight-streaming GEMM over it (``kernels.matmul_int4``).

The layout (made once on the host by ``kernels.matmul_int4``; K_pad is K rounded up to
UNIT_K = 64, N_pad is N rounded up to 16):

qweight  uint32 [N_pad / 16, K_pad / 64 · 128]. Row s is the *strip* of columns
         16s .. 16s + 15; each 128-word *unit* covers 64 rows of K. In unit u, lane l of a
         warp reads words 4l .. 4l + 3 in one 16-byte load; word i holds the lane's share of
         the m16n8k16 B fragments (helpers.fragments) of k16 step 4u + i for both 8-column
         halves of the strip. With g = l // 4, t = l % 4, k = 64u + 16i + 2t, nibble j is
             j = 0, 1: W[k + j, 16s + g]          j = 2, 3: W[k + 8 + j - 2, 16s + g]
             j = 4 .. 7: the same four rows of column 16s + 8 + g
         stored as the signed 4-bit n = q - 8 (q the unsigned GPTQ code, 0 .. 15), so one
         ``int4x8_to_*_offset`` turns a word into the four B registers of two mma.
scales   uint32 [groups_pad, N_pad / 2]: word 8s + g holds the f16 scales of columns
         16s + g (low half) and 16s + 8 + g (high half) — the two columns of the lane's
         words.
zeros    uint32, same shape (asymmetric weights only): bytes 0 and 1 of word 8s + g are
         the zero points z (0 .. 16) of the same two columns.

Weight (k, c) = scale · (q - z) = scale · (n - (z - 8)): the conversion's fma adds
-(1024 + z) to the low and -(64 + z) to the high nibble's magic number (f16; bf16: -(128 +
z) to both), which yields the exact n - (z - 8) (|.| ≤ 16); those addends are integers in
one binade, so their bits are a constant plus z — one integer multiply-add per column
(:func:`_make_word_dequantizer`). One multiply by the scale in f16 / bf16 then rounds once:
the same bits :func:`kaionb.dequantize_int4` writes. Groups run along K (GPTQ): a group
of 32 or more rows covers half a unit or more, so a unit needs the scales of at most two
groups (rows 64u and 64u + 32).
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int32, int64, uint16, uint32, uint64

from kaionb.ptx_patches import (
    cp_async_ca_4,
    cp_async_cg_16,
    cp_async_commit_group,
    cp_async_wait_all,
    cp_async_wait_group,
    cvt_rn_bf16x2_f32,
    device_function,
    f16x2_to_f32x2,
    fma_rn_bf16x2,
    fma_rn_f16x2,
    global_addr,
    int4x8_to_bf16x2x4_offset,
    int4x8_to_f16x2x4_offset,
    ld_shared_v4_u32,
    ldmatrix_x4,
    mma_m16n8k16_f32_bf16,
    mma_m16n8k16_f32_f16,
    prmt_b32,
    shared_addr,
    st_shared_v4_u32,
)

from .epilogue import make_splitk_fold, store_row_chunk8
from .tiles import chunk_coords

UNIT_K = 64  # rows of K per unit (one 16-byte load per lane)
STRIP_N = 16  # columns per strip (one warp's share of a block)
WORDS_PER_UNIT = 128
UNIT_BYTES = 4 * WORDS_PER_UNIT  # a strip's bytes per unit: one 16-byte load per lane
RING_HALF = 32 * 16  # a slot's second 16 bytes per lane sit one warp-width further on
MIN_GROUP = 32  # a unit reads at most two groups' scales
WARPS = 8
THREADS = 32 * WARPS
# Strips per warp, by m16 tiles per block: two strips share each x fragment and the
# per-unit overhead (waits, loop, the stage's x), which is about half of a unit's
# instructions (H100, M = 1: 260 warp-instructions per strip and unit with one strip;
# 104.6 -> 84.9 µs with two). Four strips with a 2-unit ring: 99.5 µs. Four m16 tiles with
# two strips need ~200 registers: one block per SM (kernels.matmul_int4.BLOCKS_PER_SM),
# 177 -> 163 µs at M = 64.
STRIPS_PER_WARP = {1: 2, 2: 2, 4: 2}
# Columns of x staged in shared memory per step, by m16 tiles per block: 16-34 KB a stage
# (two in flight), so the k-chunk of a block is not bounded by shared memory.
STAGE_K = {1: 512, 2: 256, 4: 256}
# Units each lane has in flight ahead of the one it computes, copied by cp.async into its
# own ring of shared memory (32 bytes per strip and unit: weights, scales, zeros): 4
# units × 2 strips × 16 bytes × 256 threads = 32 KB of weights in flight per block. Held
# in registers instead (4 units, one strip, 32 registers), the kernel ran at 1.1 TB/s
# (long-scoreboard stalls, ncu). The next stage of x rides in the group of the unit DEPTH
# after the stage's first, hence DEPTH ≤ STAGE_K / 64.
DEPTH = {1: 4, 2: 4, 4: 4}
SLOT_BYTES = 32  # per lane, strip and unit: 16 bytes of weights, 2 scale and 2 zeros words
NEG_ZERO_X2 = 0x80008000  # -0.0 in both halves (f16 and bf16): a·b + (-0) = a·b, rounded once


# The zeros word of a symmetric weight: z = 8 for both columns.
SYMMETRIC_ZEROS = 0x0808
# f16 bits of the conversion addends for z = 0 — {-(1024 + z), -(64 + z)} — and their step
# per unit of z: 1 in the low half (ulp of 1024), 16 in the high (ulp of 64 is 1/16).
F16_OFFSET, F16_OFFSET_STEP = 0xD400E400, 0x00100001
BF16_OFFSET, BF16_OFFSET_STEP = 0xC300C300, 0x00010001  # {-(128 + z)} ×2, ulp of 128 is 1


def _make_word_dequantizer(act: str):
    """(column_setup, dequantize_word) for f16 or bf16 fragments."""
    BF16 = act == "bf16"
    convert = int4x8_to_bf16x2x4_offset if BF16 else int4x8_to_f16x2x4_offset
    fma2 = fma_rn_bf16x2 if BF16 else fma_rn_f16x2
    OFFSET, STEP = (BF16_OFFSET, BF16_OFFSET_STEP) if BF16 else (F16_OFFSET, F16_OFFSET_STEP)

    @device_function
    def column_setup(sword, zword):
        """(off_a, off_b, scale_a2, scale_b2) of a lane's two columns for one group: the
        conversion addends of their zero points and each scale in both halves."""
        off_a = uint32(OFFSET + (zword & uint32(0xFF)) * STEP)
        off_b = uint32(OFFSET + ((zword >> uint32(8)) & uint32(0xFF)) * STEP)
        if BF16:
            sa, sb = f16x2_to_f32x2(sword)  # f16 scales, exactly
            return off_a, off_b, cvt_rn_bf16x2_f32(sa, sa), cvt_rn_bf16x2_f32(sb, sb)
        return off_a, off_b, prmt_b32(sword, uint32(0), uint32(0x1010)), prmt_b32(
            sword, uint32(0), uint32(0x3232))

    @device_function
    def dequantize_word(word, off_a, off_b, scale_a2, scale_b2):
        """One packed word -> (b0, b1) for column a's n8 half, (b2, b3) for column b's:
        scale · (n - z) as f16x2 / bf16x2."""
        v = convert(word, off_a, off_b)
        neg0 = uint32(NEG_ZERO_X2)
        return (fma2(v[0], scale_a2, neg0), fma2(v[1], scale_a2, neg0),
                fma2(v[2], scale_b2, neg0), fma2(v[3], scale_b2, neg0))

    return column_setup, dequantize_word


@functools.lru_cache(maxsize=None)
def word_dequantizer(act: str):
    """The (column_setup, dequantize_word) pair of :func:`_make_word_dequantizer`."""
    return _make_word_dequantizer(act)


@device_function
def issue_unit(slot, w_addr, s_addr, z_addr, pitch, kk, gshift, has_zero, ok):
    """Start copying a lane's share of the unit starting at row ``kk`` into its ring slot
    (shared address ``slot``: weights there, the scale and zeros words of the groups of
    rows kk and kk + 32 at slot + RING_HALF): 16 bytes from ``w_addr``, 4 from ``s_addr``
    / ``z_addr`` (the lane's word in group 0) plus ``pitch`` bytes per group. Nothing is
    read where not ``ok`` (past the chunk). Addresses are precomputed: numba's array
    indexing costs 64-bit multiplies and a negative-index fix-up per load."""
    lo = uint64(0)
    hi = uint64(0)
    size = uint32(0)
    if ok:  # int32 products (numba widens int32 arithmetic to 64 bits)
        lo = uint64(int32(int32(kk >> gshift) * pitch))
        hi = uint64(int32(int32((kk + MIN_GROUP) >> gshift) * pitch))
        size = uint32(4)
    cp_async_cg_16(slot, w_addr, size * uint32(4))
    cp_async_ca_4(slot + uint32(RING_HALF), s_addr + lo, size)
    cp_async_ca_4(slot + uint32(RING_HALF + 4), s_addr + hi, size)
    if has_zero != 0:
        cp_async_ca_4(slot + uint32(RING_HALF + 8), z_addr + lo, size)
        cp_async_ca_4(slot + uint32(RING_HALF + 12), z_addr + hi, size)


@functools.lru_cache(maxsize=None)
def make_int4_block(act: str, MT: int):
    """``int4_block(x, perm, w, scales, zeros, out32, out16, ws, counters, M, N, K, K_pad,
    k_chunk, splits, kind, out_vec, x_vec, has_perm, has_zero, gshift, m0, strip0,
    split)``: one block's share of ``out = x @ W`` for W in the packed layout (module
    doc), called by every thread of a THREADS-thread block; ``act`` "f16" or "bf16" (x's
    type, and the fragments'), MT m16 tiles of rows (BM = 16·MT).

    The block owns rows m0 .. m0 + BM and BLOCK_N = 16·WARPS·STRIPS_PER_WARP[MT] columns
    from strip strip0 (STRIPS_PER_WARP consecutive strips a warp), over K rows
    split·k_chunk .. + k_chunk (a multiple of STAGE_K[MT]; K_pad at most).

    x, perm      x [M, K] as uint16 bits (rows at any stride); with ``has_perm`` its
                 columns are read in the order ``perm`` (act-order weights, stored sorted
                 by group), else straight (16-byte cp.async where ``x_vec``: 16-byte
                 aligned rows, K % 8 == 0)
    w, scales, zeros   the packed weight; ``gshift`` log2 of the group size (31: one group)
    out32, out16 [M, N] output for kind OUT_F32 / OUT_F16 / OUT_BF16 (``out_vec``: rows
                 16-byte aligned and N % 8 == 0)
    ws, counters split-K partials and arrival counters (helpers.epilogue.make_splitk_fold),
                 one tile per (blockIdx.y, blockIdx.x)

    x moves through shared memory in double-buffered stages of STAGE_K columns (zero
    outside M and K); each lane's weights, scales and zeros through its own ring of
    DEPTH[MT] units. THREADS, BLOCK_N, BLOCK_M, STAGE_K and SHARED_BYTES are attributes."""
    BM = 16 * MT
    SKC = STAGE_K[MT]  # a constant for the device code (numba does not type the dict)
    SK = SKC + 8  # halves per staged row: +16 bytes, so ldmatrix rows miss banks
    STAGE_UNITS = SKC // UNIT_K
    STAGE_CHUNKS = BM * (SKC // 8)
    STAGE_BYTES = BM * SK * 2
    D = DEPTH[MT]
    PENDING = D - 1  # groups younger than the unit about to be computed
    SPW = STRIPS_PER_WARP[MT]
    HALVES = 2 * SPW  # n8 halves per warp (a constant for cuda.local.array)
    BLOCK_N = STRIP_N * WARPS * SPW
    SLOT = SPW * 2 * RING_HALF  # a lane's ring slot stride: per strip, words then groups
    RING_BYTES = WARPS * D * 32 * SLOT_BYTES * SPW
    CS = BLOCK_N + 4  # staged f32 C tile row stride
    CHUNKS = BM * BLOCK_N // 8
    SHARED_BYTES = max(2 * STAGE_BYTES + RING_BYTES, BM * CS * 4)
    mma = mma_m16n8k16_f32_bf16 if act == "bf16" else mma_m16n8k16_f32_f16
    column_setup, dequantize_word = word_dequantizer(act)
    fold = make_splitk_fold(4)
    assert STAGE_UNITS % D == 0

    @device_function
    def load_stage(stage_addr, smem16, x, perm, has_perm, x_vec, M, K, m0, k0, tid):
        """Start copying x[m0:m0+BM, k0:k0+STAGE_K] (permuted columns with has_perm) into
        the stage at ``stage_addr``; zeros outside x."""
        for c in range(tid, STAGE_CHUNKS, THREADS):
            r = c // (SKC // 8)
            col = (c % (SKC // 8)) * 8
            gr, gk = m0 + r, k0 + col
            dst = stage_addr + uint32((r * SK + col) * 2)
            if x_vec != 0 and has_perm == 0:
                inside = gr < M and gk < K
                src = global_addr(x, (gr, gk)) if inside else global_addr(x, (0, 0))
                cp_async_cg_16(dst, src, uint32(16) if inside else uint32(0))
            else:
                h = cuda.local.array(8, uint32)
                for e in range(8):
                    h[e] = uint32(0)
                    if gr < M and gk + e < K:
                        src_col = perm[gk + e] if has_perm != 0 else gk + e
                        h[e] = uint32(x[gr, src_col])
                st_shared_v4_u32(dst, (h[0] | (h[1] << 16), h[2] | (h[3] << 16),
                                       h[4] | (h[5] << 16), h[6] | (h[7] << 16)))

    @device_function
    def unit_mma(acc, a_addr, slot, live, has_zero):
        """acc += one unit of each of the warp's strips (in the lane's ring slot at
        ``slot``: per strip 4 words, then the scale and zeros words (s_lo, s_hi, z_lo,
        z_hi)) times the staged x at ``a_addr`` (this lane's ldmatrix address at the
        unit's first column); strips past N (``live`` bit t clear) are skipped."""
        for t in range(SPW):
            if (live >> t) & 1:
                words = ld_shared_v4_u32(slot + uint32(t * 2 * RING_HALF))
                groups = ld_shared_v4_u32(slot + uint32((t * 2 + 1) * RING_HALF))
                z_lo, z_hi = groups[2], groups[3]
                if has_zero == 0:
                    z_lo = z_hi = uint32(SYMMETRIC_ZEROS)
                for half in range(2):
                    off_a, off_b, sa2, sb2 = column_setup(groups[half], z_hi if half else z_lo)
                    for i2 in range(2):
                        i = 2 * half + i2
                        b = dequantize_word(words[i], off_a, off_b, sa2, sb2)
                        for mt in range(MT):
                            a = ldmatrix_x4(a_addr + uint32((mt * 16 * SK + 16 * i) * 2))
                            h0, h1 = 2 * t, 2 * t + 1
                            d = mma(a, (b[0], b[1]), (acc[mt, h0, 0], acc[mt, h0, 1],
                                                      acc[mt, h0, 2], acc[mt, h0, 3]))
                            acc[mt, h0, 0], acc[mt, h0, 1], acc[mt, h0, 2], acc[mt, h0, 3] = d
                            d = mma(a, (b[2], b[3]), (acc[mt, h1, 0], acc[mt, h1, 1],
                                                      acc[mt, h1, 2], acc[mt, h1, 3]))
                            acc[mt, h1, 0], acc[mt, h1, 1], acc[mt, h1, 2], acc[mt, h1, 3] = d

    @device_function
    def int4_block(x, perm, w, scales, zeros, out32, out16, ws, counters, M, N, K, K_pad,
                   k_chunk, splits, kind, out_vec, x_vec, has_perm, has_zero, gshift, m0,
                   strip0, split):
        smem16 = cuda.shared.array(0, uint16)
        base = shared_addr(smem16, 0)
        tid = int32(cuda.threadIdx.x)
        warp, lane = tid // 32, tid % 32
        n_strips = (N + STRIP_N - 1) // STRIP_N
        first = strip0 + warp * SPW  # the warp's first strip
        live = int32(0)  # bit t: strip first + t has columns (the rest only join barriers)
        for t in range(SPW):
            if first + t < n_strips:
                live |= int32(1 << t)
        k_begin = split * k_chunk
        k_end = min(K_pad, k_begin + k_chunk)
        units = int32((k_end - k_begin) // UNIT_K)
        stages = (k_end - k_begin + SKC - 1) // SKC
        row = min(first, n_strips - 1)  # in bounds for every warp; strip t at + t rows
        w_addr = global_addr(w, (int64(row), int64((k_begin // UNIT_K) * WORDS_PER_UNIT
                                                    + lane * 4)))
        w_pitch = int32(w.shape[1]) * 4
        s_addr = global_addr(scales, (int64(0), int64(row * 8 + lane // 4)))
        z_addr = s_addr
        if has_zero != 0:
            z_addr = global_addr(zeros, (int64(0), int64(row * 8 + lane // 4)))
        pitch = int32(scales.shape[1]) * 4
        lane_off = uint32(((lane % 16) * SK + 8 * (lane // 16)) * 2)

        acc = cuda.local.array((MT, HALVES, 4), float32)  # [m16 tile][n8 half][C fragment]
        for i in range(MT):
            for h in range(HALVES):
                for e in range(4):
                    acc[i, h, e] = float32(0.0)
        # The lane's ring: slot j at ring + j·SLOT, strip t's weights at + 2t·RING_HALF and
        # its scales / zeros one RING_HALF on; 16-byte accesses 16 bytes apart across the
        # warp, no bank conflicts.
        ring = base + uint32(2 * STAGE_BYTES + warp * D * SLOT + lane * 16)
        load_stage(base, smem16, x, perm, has_perm, x_vec, M, K, m0, k_begin, tid)
        for j in range(D):
            for t in range(SPW):
                ok = (live >> t) & 1 != 0 and j < units
                issue_unit(ring + uint32(j * SLOT + t * 2 * RING_HALF),
                           w_addr + uint64(t * w_pitch + j * UNIT_BYTES if ok else 0),
                           s_addr + uint64(t * 32), z_addr + uint64(t * 32), pitch,
                           k_begin + j * UNIT_K, gshift, has_zero, ok)
            cp_async_commit_group()  # group j: unit j (and stage 0 of x in group 0)
        for st in range(stages):
            st = int32(st)
            a_stage = base + uint32((st % 2) * STAGE_BYTES) + lane_off
            # x's stage st (in group (st - 1)·STAGE_UNITS + D, the latest one at the stage's
            # first unit) is in place for every thread; every warp is done with stage
            # st - 1, whose buffer the next stage takes (in the first unit's group).
            cp_async_wait_group(PENDING)
            cuda.syncthreads()
            if st + 1 < stages:
                load_stage(base + uint32(((st + 1) % 2) * STAGE_BYTES), smem16, x, perm,
                           has_perm, x_vec, M, K, m0, k_begin + (st + 1) * SKC, tid)
            for v0 in range(0, STAGE_UNITS, D):
                for j in range(D):
                    u = st * STAGE_UNITS + int32(v0 + j)
                    cp_async_wait_group(PENDING)  # groups up to u have landed
                    slot = ring + uint32(j * SLOT)
                    if u < units:
                        unit_mma(acc, a_stage + uint32((v0 + j) * UNIT_K * 2), slot, live,
                                 has_zero)
                    # Refill the slot (its words are in registers, used by the mma above):
                    # unit u + D, one group per unit whether or not it exists.
                    for t in range(SPW):
                        ok = (live >> t) & 1 != 0 and u + D < units
                        issue_unit(slot + uint32(t * 2 * RING_HALF),
                                   w_addr + uint64(int32(t * w_pitch + (u + D) * UNIT_BYTES)
                                                   if ok else 0),
                                   s_addr + uint64(t * 32), z_addr + uint64(t * 32), pitch,
                                   int32(k_begin + (u + D) * UNIT_K), gshift, has_zero, ok)
                    cp_async_commit_group()
        cp_async_wait_all()

        # Epilogue: fragments -> the f32 C tile in shared memory (over the stages), the
        # split-K fold, then 16-byte stores of whole 8-column chunks.
        cuda.syncthreads()
        cs = cuda.shared.array(0, float32)
        for mt in range(MT):
            for h in range(HALVES):
                for e in range(4):
                    r = mt * 16 + lane // 4 + 8 * (e // 2)
                    c = (warp * SPW + h // 2) * STRIP_N + (h % 2) * 8 + 2 * (lane % 4) + e % 2
                    cs[r * CS + c] = acc[mt, h, e]  # (past N: never stored)
        cuda.syncthreads()
        n0 = strip0 * STRIP_N
        if splits > 1:
            tile_id = int32(cuda.blockIdx.y) * int32(cuda.gridDim.x) + int32(cuda.blockIdx.x)
            if not fold(ws, counters, cs, tile_id, split, splits, M - m0, N - n0, BM, BLOCK_N,
                        CS, THREADS):
                return
        for q in range((CHUNKS + THREADS - 1) // THREADS):
            if tid + q * THREADS < CHUNKS:
                r, c = chunk_coords(tid + q * THREADS, BLOCK_N)
                store_row_chunk8(out32, out16, kind, m0 + r, n0 + c, M, N, out_vec, cs,
                                 r * CS + c)

    int4_block.THREADS = THREADS
    int4_block.BLOCK_N = BLOCK_N
    int4_block.SHARED_BYTES = SHARED_BYTES
    int4_block.BLOCK_M = BM
    int4_block.STAGE_K = STAGE_K[MT]
    return int4_block


__all__ = ["MIN_GROUP", "STAGE_K", "STRIP_N", "STRIPS_PER_WARP", "SYMMETRIC_ZEROS", "THREADS", "UNIT_K",
           "WARPS", "WORDS_PER_UNIT", "issue_unit", "make_int4_block", "word_dequantizer"]
