"""Epilogues: write f32 accumulators to a 2-D f32 / f16 / bf16 output, scale integer
sums into f32 (:func:`dequantize_row_chunk8`), and fold split-K partials into one tile
(:func:`make_splitk_fold`).

Two ways out. From a staged f32 C tile in shared memory (:func:`store_row_chunk8`):
8 consecutive columns of one row per call, 16-byte coalesced stores, the output kind a
run-time flag (``OUT_F32``, ``OUT_F16``, ``OUT_BF16``) so one kernel serves every dtype.
Straight from an m16n8 fragment (``store_c_frag_*``):

The C fragment (see :mod:`.fragments`) gives each lane two adjacent columns in two rows,
so a lane stores one packed pair per row: two halves in one 32-bit ``st.global.b32``
when both columns exist and the pair is 4-byte aligned (N even), otherwise element by
element. Rows and columns past (M, N) are skipped, so edge tiles need no other path.
f16/bf16 outputs are uint16 arrays holding the bit patterns (round to nearest even).

Split-K in one launch (:func:`make_splitk_fold`): every split of an output tile writes
its f32 partial to a workspace, fences, and counts itself in at a per-tile arrival
counter; the last to arrive sums all partials in split order (bit-identical run to run,
whichever block comes last) into the staged tile, and resets the counter to 0 for the
next launch.
"""

import functools

from numba import cuda, float32, int32, int64, uint16, uint32

from kaionb.ptx_patches import (
    cvt_rn_bf16x2_f32,
    cvt_rn_f16x2_f32,
    device_function,
    global_addr,
    ld_global_v4_f32,
    st_global_b32,
    st_global_v4_f32,
    st_global_v4_u32,
)

# The output kind of a staged-tile epilogue.
OUT_F32, OUT_F16, OUT_BF16 = 0, 1, 2
# How a quantized matmul's row or column scale is given: none (1), one value for the
# tensor (element 0), or one per row / column.
SCALE_NONE, SCALE_TENSOR, SCALE_VECTOR = 0, 1, 2


@device_function
def dequantize_row_chunk8(cs, ci, row, col, M, N, alpha, scale_a, sa_mode, scale_b, sb_mode,
                          bias, has_bias):
    """In place: ``cs[ci:ci+8]`` (row ``row``, columns col..col+7 of an M×N result, f32
    integer sums staged in shared memory) times ``alpha · scale_a[row] · scale_b[col]``,
    plus ``bias[col]`` where ``has_bias`` (the W8A8 epilogue; scales by mode,
    ``SCALE_*``, f32 arrays). Columns past N and rows past M are left alone (never
    stored). Call it on the chunk the same thread stores next: no barrier between."""
    if row >= M:
        return
    s = float32(alpha)
    if sa_mode == SCALE_TENSOR:
        s *= scale_a[0]
    elif sa_mode == SCALE_VECTOR:
        s *= scale_a[row]
    for e in range(8):
        c = col + e
        if c < N:
            v = cs[ci + e] * s
            if sb_mode == SCALE_TENSOR:
                v *= scale_b[0]
            elif sb_mode == SCALE_VECTOR:
                v *= scale_b[c]
            if has_bias != 0:
                v += bias[c]
            cs[ci + e] = v


@device_function
def pack_pair(kind, lo, hi):
    """Two f32 as packed f16x2 (``OUT_F16``) or bf16x2 (otherwise), round to nearest even."""
    if kind == OUT_F16:
        return cvt_rn_f16x2_f32(lo, hi)
    return cvt_rn_bf16x2_f32(lo, hi)


@device_function
def store_row_chunk8(out32, out16, kind, row, col, M, N, vec, cs, ci):
    """Write ``cs[ci:ci+8]`` (f32, a staged C tile in shared memory) to row ``row``,
    columns col..col+7 of the M×N output in its kind (``out32`` for OUT_F32, else the
    uint16 bits ``out16``): 16-byte stores where all 8 columns exist and rows are 16-byte
    aligned (``vec``), element stores at the right edge; nothing past M or N."""
    if row >= M or col >= N:
        return
    if vec != 0 and col + 8 <= N:
        if kind == OUT_F32:
            st_global_v4_f32(global_addr(out32, (row, col)),
                             (cs[ci], cs[ci + 1], cs[ci + 2], cs[ci + 3]))
            st_global_v4_f32(global_addr(out32, (row, col + 4)),
                             (cs[ci + 4], cs[ci + 5], cs[ci + 6], cs[ci + 7]))
        else:
            st_global_v4_u32(global_addr(out16, (row, col)),
                             (pack_pair(kind, cs[ci], cs[ci + 1]),
                              pack_pair(kind, cs[ci + 2], cs[ci + 3]),
                              pack_pair(kind, cs[ci + 4], cs[ci + 5]),
                              pack_pair(kind, cs[ci + 6], cs[ci + 7])))
        return
    for e in range(min(8, N - col)):
        if kind == OUT_F32:
            out32[row, col + e] = cs[ci + e]
        else:
            out16[row, col + e] = uint16(pack_pair(kind, cs[ci + e], cs[ci + e]) & 0xFFFF)


@device_function
def _store_pair_u16(out, row, col, packed):
    m, n = out.shape
    if row >= m or col >= n:
        return
    if col + 1 < n and n % 2 == 0:
        st_global_b32(global_addr(out, (row, col)), packed)
    else:
        out[row, col] = packed & 0xFFFF
        if col + 1 < n:
            out[row, col + 1] = packed >> 16


@device_function
def store_c_frag_f16(out, row0, col0, lane, d):
    """Store fragment ``d`` (4×f32, m16n8 C layout) of the 16×8 block at (row0, col0)
    into the uint16 (f16 bits) array ``out``, bounds-checked."""
    g, t = lane // 4, lane % 4
    _store_pair_u16(out, row0 + g, col0 + 2 * t, cvt_rn_f16x2_f32(d[0], d[1]))
    _store_pair_u16(out, row0 + g + 8, col0 + 2 * t, cvt_rn_f16x2_f32(d[2], d[3]))


@device_function
def store_c_frag_bf16(out, row0, col0, lane, d):
    """As :func:`store_c_frag_f16` with bf16 output."""
    g, t = lane // 4, lane % 4
    _store_pair_u16(out, row0 + g, col0 + 2 * t, cvt_rn_bf16x2_f32(d[0], d[1]))
    _store_pair_u16(out, row0 + g + 8, col0 + 2 * t, cvt_rn_bf16x2_f32(d[2], d[3]))


@device_function
def store_c_frag_f32(out, row0, col0, lane, d):
    """Store fragment ``d`` into the float32 array ``out``, bounds-checked."""
    g, t = lane // 4, lane % 4
    m, n = out.shape
    for i in range(4):
        r = row0 + g + 8 * (i // 2)
        c = col0 + 2 * t + i % 2
        if r < m and c < n:
            out[r, c] = d[i]


@functools.lru_cache(maxsize=None)
def make_splitk_fold(GROUP: int = 4):
    """The split-K fold (module doc) loading GROUP partials before it adds any: GROUP L2
    round trips in flight instead of one after another (the fold is on the kernel's
    critical path, after the last k-tile). Each GROUP costs 4·GROUP registers: the kernel
    picks what its register budget leaves room for (``kernels.matmul.FOLD_GROUP``)."""

    @device_function
    def splitk_fold(ws, counters, cs, tile, split, splits, rows, cols, BM, BN, CS, THREADS):
        """Fold split ``split`` of ``splits`` of output tile ``tile`` (a BM×BN f32 tile
        staged in shared memory ``cs``, row stride CS; ``rows``×``cols`` of it inside the
        output) into the sum of all splits. Returns True in the block that arrived last,
        with the sum in ``cs``; False in the others, which are done. Every thread calls it.

        ``ws``: f32 workspace, the tile's partials at ``tile·splits·BM·BN``, split-major,
        rows of BN; ``counters``: uint32, 0 at launch, one per tile (the last block resets
        its tile's).
        """
        tid = int32(cuda.threadIdx.x)
        base = int64(tile) * splits * (BM * BN)
        # Units of 4 columns, only in rows the output has (M = 1: one row of the tile).
        # The run-time bound keeps the loop rolled: unrolled, it cost the small tiles spills.
        units = min(rows, BM) * (BN // 4)
        for u in range(tid, units, THREADS):
            r, c = u // (BN // 4), (u % (BN // 4)) * 4
            if c < cols:
                ci = r * CS + c
                st_global_v4_f32(global_addr(ws, base + split * (BM * BN) + r * BN + c),
                                 (cs[ci], cs[ci + 1], cs[ci + 2], cs[ci + 3]))
        # Release: this block's partial is visible GPU-wide before its arrival is counted.
        cuda.threadfence()
        cuda.syncthreads()
        last = int32(0)
        if tid == 0:
            arrived = cuda.atomic.add(counters, tile, uint32(1))
            last = int32(arrived == uint32(splits - 1))
            if last != 0:
                counters[tile] = uint32(0)  # all splits are in: ready for the next launch
        if cuda.syncthreads_or(last) == 0:
            return False
        cuda.threadfence()  # acquire: the other splits' partials, not stale copies
        for u in range(tid, units, THREADS):
            r, c = u // (BN // 4), (u % (BN // 4)) * 4
            if c < cols:
                at = base + r * BN + c
                t0 = t1 = t2 = t3 = float32(0.0)
                # Fixed split order, whichever block is last: the sum is the same bits.
                for s0 in range(0, splits, GROUP):
                    v = cuda.local.array((GROUP, 4), float32)
                    for j in range(GROUP):
                        if s0 + j < splits:
                            x = ld_global_v4_f32(global_addr(ws, at + (s0 + j) * (BM * BN)))
                            v[j, 0], v[j, 1], v[j, 2], v[j, 3] = x[0], x[1], x[2], x[3]
                    for j in range(GROUP):
                        if s0 + j < splits:
                            t0 += v[j, 0]
                            t1 += v[j, 1]
                            t2 += v[j, 2]
                            t3 += v[j, 3]
                ci = r * CS + c
                cs[ci], cs[ci + 1], cs[ci + 2], cs[ci + 3] = t0, t1, t2, t3
        cuda.syncthreads()
        return True

    return splitk_fold
