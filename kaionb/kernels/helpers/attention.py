"""One block's FlashAttention forward on ``mma.sync`` (every GPU from sm_80): a tile of
query rows against a range of keys, with the online softmax (FlashAttention-2, Dao 2023,
https://arxiv.org/abs/2307.08691).

For each key tile K_j, V_j (BN keys) a warp holding 16 query rows computes

    S   = Q·K_jᵀ                              mma m16n8k16, Q from registers or shared
    m'  = max(m, rowmax S)                     quad shuffles (a row lives in 4 lanes)
    P   = 2^(S·c − m'·c),  c = scale·log2(e)   ex2.approx, one fma per element
    ℓ   = ℓ·2^((m − m')·c) + rowsum P          lane-partial sums, quad-reduced at the end
    O   = O·2^((m − m')·c) + P·V_j             P's C fragments repacked as A fragments

and at the end O/ℓ and lse = (m·c + log2 ℓ)·ln 2 (natural log). The S accumulator of two
adjacent n8 tiles is exactly the A fragment of one k16 step of P·V (FlashAttention-2's
register reuse): no shared-memory round trip for P.

Memory: Q (BM rows), two K and two V stages (BN rows each) in dynamic shared memory, every
tile stored with rows of DT = DP rounded up to 64 elements, in 128-byte panels with the
128-byte swizzle (``mma_pipeline.tile_offset``), so every ldmatrix phase hits 8 bank
groups. cp.async moves 16-byte chunks; chunks past the key / query range or past the head
dimension D are zero-filled (zero columns add nothing to Q·Kᵀ, zero V columns are never
stored). Pipeline, per key tile j (two groups in flight):

    wait K_j · barrier · S = Q·K_jᵀ · issue K_j+1 · softmax · wait V_j · barrier ·
    issue V_j+1 · O += P·V_j

:class:`AttentionTiles` holds what every attention block shares — the tiles, their
loaders, the key range and masks, the staged output store — and :class:`AttentionBlock`
is the mma.sync block; :mod:`.attention_wgmma` builds Hopper's wgmma block on the same
tiles.

Rows: a block's rows are *packed* query rows r = head_in_group·Sq + i over P heads that
share one K/V head (P = 1: one head, rows are queries; P = the GQA group: decode, where
Sq is small and the group's queries fill the m16 tiles, reading K/V once per group).
Masks: keys at or past ``n_hi`` (the key range's end) and, causal, keys past
i + Sk − Sq (bottom-right alignment, FlashAttention-2's) read as −inf; only the tiles that
reach a row's limit pay for the mask. A row with no key gets O = 0 and lse = −inf.
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32, int64, uint32, uint64

from kaionb.ptx_patches import (
    cp_async_cg_16,
    cp_async_commit_group,
    cp_async_wait_group,
    device_function,
    ex2_approx_f32,
    global_addr,
    shared_addr,
    st_global_v4_f32,
    st_global_v4_u32,
)

from .epilogue import OUT_F32, pack_pair
from .mma_pipeline import LINE, tile_offset
from .reduce import FULL_MASK
from .warp_mma import load_a_fragments, strip_abt, strip_lane_offsets, strip_pb

LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634
NEG_INF = float32(-math.inf)


class AttentionTiles:
    """Shared memory and the global ↔ shared traffic of one attention block: Q_TILES
    tiles of BM rows (Q; the backward adds dO) and STAGES stages each of K and V (BN rows),
    rows of DT elements in 128-byte panels (module doc), THREADS threads loading; the
    output staged as f32 rows of CS.
    Offsets are bytes from the dynamic shared memory's start (``base`` arguments shift
    them: the wgmma block aligns its tiles to 1024 bytes). ``UNROLL_FULL``: whole tiles
    load through a straight-line copy (one 64-bit add a chunk) where the geometry allows.
    """

    def __init__(self, DP: int, BN: int, BM: int, THREADS: int, STAGES: int = 2,
                 UNROLL_FULL: bool = False, Q_TILES: int = 1):
        DT = -(-DP // 64) * 64  # stored row: whole 128-byte panels
        Q_BYTES, KV_BYTES = BM * DT * 2, BN * DT * 2
        CS = DP + 8  # row stride (f32) of the staged output: conflict-free 8-byte stores
        CPR = DP // 8  # 16-byte chunks of a row that hold data
        # K/V loads: where the stored row's chunks divide the block, each thread keeps one
        # chunk column and steps RSTEP rows; else each chunk's row and column are divided
        # out of its index.
        LCPR = DT // 8
        FIXED_COLUMN = THREADS % LCPR == 0
        RSTEP = THREADS // LCPR if FIXED_COLUMN else 0
        # The straight-line copy of a whole tile: a thread's chunks RSTEP rows apart are
        # whole swizzle periods apart in shared memory (RSTEP ≥ 8) and its column exists
        # in every row. Unrolled in the mma.sync block it spilled (its registers hold O, S
        # and Q's fragments), so the blocks choose.
        FULL_CHUNKS = BN // RSTEP if UNROLL_FULL and FIXED_COLUMN and RSTEP % 8 == 0 else 0

        @device_function
        def chunk_offset(r, c, ROWS):
            """Byte offset of 16-byte chunk c of row r in a tile of ROWS rows."""
            return tile_offset(r, c * 16, ROWS, DT * 2)

        @device_function
        def load_kv_tile(smem, stage, src, b, hkv, n0, n_hi, D, tid):
            """cp.async keys n0 … n0+BN−1 of ``src[b, hkv]`` into the tile at ``stage``."""
            rows = int32(n_hi - n0)
            base = global_addr(src, (int64(b), int64(hkv), int64(n0), int64(0)))
            row_bytes = int64(src.strides[2])
            if FIXED_COLUMN:
                # 32-bit indices (numba widens ints to 64 bits: the loader was ~25 SASS
                # instructions a chunk) and a loop whose trip count is not a constant, so it
                # stays rolled (unrolled, the chunks' addresses cost the prefill tile 24
                # bytes of spills and the decode tile 164, ptxas -v on sm_90a).
                c = int32(tid % LCPR)
                col_bytes = int32(16) if c * 8 < D else int32(0)
                panel = int32((c // 8) * (BN * LINE))
                cc = int32((c % 8) * 16)
                s_stage = shared_addr(smem, stage) + uint32(panel)
                r = int32(tid // LCPR)
                addr = base + uint64(int64(r) * row_bytes + c * 16)
                step = uint64(int64(RSTEP) * row_bytes)
                if FULL_CHUNKS and rows >= BN and col_bytes != 0:
                    x = int32(r * LINE + cc)
                    s_first = s_stage + uint32(x ^ ((x >> 3) & 0x70))
                    for i in range(FULL_CHUNKS):
                        cp_async_cg_16(s_first + uint32(i * RSTEP * LINE), addr, 16)
                        addr += step
                    return
                while r < BN:
                    nbytes = col_bytes if r < rows else int32(0)
                    x = int32(r * LINE + cc)
                    cp_async_cg_16(s_stage + uint32(x ^ ((x >> 3) & 0x70)),
                                   addr if nbytes != 0 else base, nbytes)
                    addr += step
                    r = int32(r + RSTEP)
                return
            for ch in range(tid, BN * CPR, THREADS):
                r = ch // CPR
                c = ch - r * CPR
                ok = r < rows and c * 8 < D
                addr = base + uint64(int64(r) * row_bytes + c * 16) if ok else base
                cp_async_cg_16(shared_addr(smem, stage + chunk_offset(r, c, BN)), addr,
                               16 if ok else 0)

        @device_function
        def row_head(row, hg, P, Sq):
            """(query head, query index) of packed row ``row``."""
            hi = row // Sq
            return hg * P + hi, row - hi * Sq

        @device_function
        def load_q_tile(smem, q_base, q, b, hg, m0, rows_total, Sq, P, D, tid):
            """cp.async packed rows m0 … m0+BM−1 of head group hg into the Q tile."""
            base = global_addr(q, (int64(b), int64(0), int64(0), int64(0)))
            for ch in range(tid, BM * CPR, THREADS):
                r = ch // CPR
                c = ch - r * CPR
                ok = m0 + r < rows_total and c * 8 < D
                addr = base
                if ok:
                    hq, qi = row_head(m0 + r, hg, P, Sq)
                    addr = global_addr(q, (int64(b), int64(hq), int64(qi), int64(c * 8)))
                cp_async_cg_16(shared_addr(smem, q_base + chunk_offset(r, c, BM)), addr,
                               16 if ok else 0)

        @device_function
        def key_range(m0, rows_total, Sq, Sk, causal, n_begin, n_hi):
            """(n_stop, mask_from, n_tiles): the block's keys end at n_stop (causal: its
            last row's limit); tiles reaching mask_from (its first row's limit, or the
            range's end) need the mask."""
            last = min(m0 + BM, rows_total) - 1
            if m0 // Sq == last // Sq:
                i_lo, i_hi = m0 % Sq, last % Sq
            else:
                i_lo, i_hi = int32(0), Sq - 1
            n_stop = n_hi
            mask_from = n_hi
            if causal != 0:
                n_stop = max(n_begin, min(n_hi, i_hi + 1 + Sk - Sq))
                mask_from = max(n_begin, min(n_hi, i_lo + 1 + Sk - Sq))
            return n_stop, mask_from, (n_stop - n_begin + BN - 1) // BN

        @device_function
        def row_limit(row, n_hi, causal, Sk, Sq):
            """Keys of packed row ``row`` end here (causal: i + 1 + Sk − Sq)."""
            if causal != 0:
                return min(n_hi, row % Sq + 1 + Sk - Sq)
            return n_hi

        @device_function
        def block_plan(Sq, Sk, G, P, causal, hg, m0, n_begin, n_hi, r_lo):
            """What every block works out first: (rows_total, its K/V head, n_stop,
            mask_from, n_tiles — :func:`key_range`) and the key limits of the lane's rows
            r_lo and r_lo + 8."""
            rows_total = P * Sq
            n_stop, mask_from, n_tiles = key_range(m0, rows_total, Sq, Sk, causal, n_begin,
                                                   n_hi)
            return (rows_total, (hg * P) // G, n_stop, mask_from, n_tiles,
                    row_limit(m0 + r_lo, n_hi, causal, Sk, Sq),
                    row_limit(m0 + r_lo + 8, n_hi, causal, Sk, Sq))

        @device_function
        def store_rows(out32, out16, kind, zo, hg, P, Sq, m0, rows_total, D, tid):
            """The staged tile (f32 rows of CS from shared offset 0) to the output, 8
            columns (16 or 32 bytes) per store."""
            cs = cuda.shared.array(0, float32)
            for ch in range(tid, BM * CPR, THREADS):
                r = ch // CPR
                c = (ch - r * CPR) * 8
                if m0 + r < rows_total and c < D:
                    hq, qi = row_head(m0 + r, hg, P, Sq)
                    ci = r * CS + c
                    at = (int64(zo), int64(hq), int64(qi), int64(c))
                    if kind == OUT_F32:
                        st_global_v4_f32(global_addr(out32, at),
                                         (cs[ci], cs[ci + 1], cs[ci + 2], cs[ci + 3]))
                        st_global_v4_f32(global_addr(out32, at) + uint64(16),
                                         (cs[ci + 4], cs[ci + 5], cs[ci + 6], cs[ci + 7]))
                    else:
                        st_global_v4_u32(global_addr(out16, at),
                                         (pack_pair(kind, cs[ci], cs[ci + 1]),
                                          pack_pair(kind, cs[ci + 2], cs[ci + 3]),
                                          pack_pair(kind, cs[ci + 4], cs[ci + 5]),
                                          pack_pair(kind, cs[ci + 6], cs[ci + 7])))

        @device_function
        def store_lse(lse, zo, hg, P, Sq, m0, rows_total, tid):
            """The BM row lse values staged after the tile to ``lse``."""
            cs = cuda.shared.array(0, float32)
            for r in range(tid, BM, THREADS):
                if m0 + r < rows_total:
                    hq, qi = row_head(m0 + r, hg, P, Sq)
                    lse[zo, hq, qi] = cs[BM * CS + r]

        self.DT, self.CS = DT, CS
        self.Q_BYTES, self.KV_BYTES = Q_BYTES, KV_BYTES
        self.K_BASE = Q_TILES * Q_BYTES
        self.V_BASE = self.K_BASE + STAGES * KV_BYTES
        self.TILE_BYTES = self.V_BASE + STAGES * KV_BYTES
        self.SHARED_BYTES = max(self.TILE_BYTES, (BM * CS + BM) * 4)
        self.load_kv_tile, self.load_q_tile = load_kv_tile, load_q_tile
        self.block_plan, self.store_rows, self.store_lse = block_plan, store_rows, store_lse


@device_function
def online_max(m_old, mx, scale_log2):
    """The online softmax's step for one row: ``mx`` (this lane's maximum, folded with
    m_old) reduced over the row's quad; returns (new maximum, its scaled value to
    subtract, the factor 2^((m_old − new)·c) that rescales ℓ and O)."""
    mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 1))
    mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 2))
    # A row with no key so far subtracts 0: −inf − (−inf) would be NaN.
    ms = float32(0.0) if mx == NEG_INF else mx * scale_log2
    return mx, ms, ex2_approx_f32(m_old * scale_log2 - ms)


@device_function
def row_sum_lse(ell, m, scale_log2):
    """(1/ℓ or 0, lse) of a row from this lane's partial ℓ (summed over the quad) and its
    maximum: a row with no key gets 0 and −inf."""
    ell += cuda.shfl_xor_sync(FULL_MASK, ell, 1)
    ell += cuda.shfl_xor_sync(FULL_MASK, ell, 2)
    if ell > float32(0.0):
        return float32(1.0) / ell, (m * scale_log2 + math.log2(ell)) * float32(LN2)
    return float32(0.0), NEG_INF


class AttentionBlock:
    """Compile-time geometry and the device function of the mma.sync variant.

    ``operand``: "f16" or "bf16"; ``DP``: head dimension the tiles compute (a multiple of
    16; D ≤ DP, the rest zero); ``BN``: keys per tile; ``WARPS`` warps of 16 rows (two
    m16 tiles per warp, as FlashAttention-2, spilled at D = 128 and gained less than
    BN = 128 at D = 64: docs/perf-log-attention.md #2-#3).

    ``block(smem, q, k, v, out32, out16, lse, kind, Sq, Sk, D, G, P, causal, scale_log2,
    b, zo, hg, m0, n_begin, n_hi)``: rows m0… of head group ``hg`` (heads hg·P …, packed
    as in the module doc) of batch ``b`` against keys [n_begin, n_hi); the output goes to
    ``out32`` (``kind`` OUT_F32) or ``out16`` (f16/bf16 bits) at batch index ``zo``, the
    log-sum-exp to ``lse[zo]``. q [B, Hq, Sq, D], k and v [B, Hkv, Sk, D] are uint16
    arrays with any strides (16-byte aligned rows), outputs too; G = Hq / Hkv.
    """

    def __init__(self, operand: str, DP: int, BN: int, WARPS: int):
        if operand not in ("f16", "bf16"):
            raise ValueError(f"attention block: operand must be f16 or bf16, got {operand!r}")
        if DP % 16 or not 16 <= DP <= 256 or BN % 16:
            raise ValueError(f"attention block: DP {DP} and BN {BN} must be multiples of 16")
        BM = 16 * WARPS
        THREADS = 32 * WARPS
        tiles = AttentionTiles(DP, BN, BM, THREADS)
        KV_BYTES, K_BASE, V_BASE, CS = tiles.KV_BYTES, tiles.K_BASE, tiles.V_BASE, tiles.CS
        load_kv_tile, load_q_tile = tiles.load_kv_tile, tiles.load_q_tile
        block_plan, store_rows, store_lse = tiles.block_plan, tiles.store_rows, tiles.store_lse
        KS = DP // 16  # k16 steps of Q·Kᵀ; n16 pairs of P·V's output
        NS = BN // 8  # n8 tiles of S
        KK = BN // 16  # k16 steps of P·V
        ND = DP // 8  # n8 tiles of O
        # Q's fragments stay in registers (4·KS) up to DP = 128; wider heads read them from
        # shared memory at every k-step (the register file holds O).
        Q_IN_REGS = DP <= 128
        QF_SIZE = KS if Q_IN_REGS else 1
        q_kt = strip_abt(operand, NS, KS, BM, BN, A_IN_REGS=Q_IN_REGS)
        p_v = strip_pb(operand, KK, KS, BN)
        load_q_fragments = load_a_fragments(KS, BM)

        def make_row(H):
            """The per-row steps for row g + 8·H of the warp's m16 tile (H fixed at compile
            time, so every fragment index is a constant and stays in registers)."""

            @device_function
            def softmax_update(s, o, m, ell, lim, masked, n0, t, scale_log2):
                """Mask, new maximum, P = 2^(S·c − m·c) in place, ℓ and O rescaled."""
                if masked:
                    keys = int32(lim - n0 - 2 * t)  # this lane's columns 8j + e below it
                    for j in range(NS):
                        for e in range(2):
                            if 8 * j + e >= keys:
                                s[j, 2 * H + e] = NEG_INF
                mx = m[H]
                for j in range(NS):
                    mx = max(mx, max(s[j, 2 * H], s[j, 2 * H + 1]))
                mx, ms, alpha = online_max(m[H], mx, scale_log2)
                m[H] = mx
                rs = float32(0.0)
                for j in range(NS):
                    for e in range(2):
                        pe = ex2_approx_f32(s[j, 2 * H + e] * scale_log2 - ms)
                        s[j, 2 * H + e] = pe
                        rs += pe
                ell[H] = ell[H] * alpha + rs
                for j in range(ND):
                    o[j, 2 * H] *= alpha
                    o[j, 2 * H + 1] *= alpha

            @device_function
            def finish(o, m, ell, cs, r, t, scale_log2):
                """O/ℓ of block row r into the staged tile ``cs``, its lse after the tile."""
                inv, row_lse = row_sum_lse(ell[H], m[H], scale_log2)
                for j in range(ND):
                    cs[r * CS + 8 * j + 2 * t] = o[j, 2 * H] * inv
                    cs[r * CS + 8 * j + 2 * t + 1] = o[j, 2 * H + 1] * inv
                if t == 0:
                    cs[BM * CS + r] = row_lse

            return softmax_update, finish

        softmax_lo, finish_lo = make_row(0)
        softmax_hi, finish_hi = make_row(1)

        @device_function
        def block(smem, q, k, v, out32, out16, lse, kind, Sq, Sk, D, G, P, causal,
                  scale_log2, b, zo, hg, m0, n_begin, n_hi):
            tid = int32(cuda.threadIdx.x)
            lane, warp = tid % 32, tid // 32
            g, t = lane // 4, lane % 4
            r_lo = warp * 16 + g  # this lane's rows: g and g + 8 of the warp's m16 tile
            rows_total, hkv, n_stop, mask_from, n_tiles, lim_lo, lim_hi = block_plan(
                Sq, Sk, G, P, causal, hg, m0, n_begin, n_hi, r_lo)

            # Prologue: Q and K_0 in one group, V_0 in the next.
            load_q_tile(smem, 0, q, b, hg, m0, rows_total, Sq, P, D, tid)
            if n_tiles > 0:
                load_kv_tile(smem, K_BASE, k, b, hkv, n_begin, n_stop, D, tid)
            cp_async_commit_group()
            if n_tiles > 0:
                load_kv_tile(smem, V_BASE, v, b, hkv, n_begin, n_stop, D, tid)
            cp_async_commit_group()

            q_off, k_off, v_off = strip_lane_offsets(lane, warp * 16)

            o = cuda.local.array((ND, 4), float32)
            s = cuda.local.array((NS, 4), float32)
            qf = cuda.local.array((QF_SIZE, 4), uint32)
            m = cuda.local.array(2, float32)  # rows g, g + 8
            ell = cuda.local.array(2, float32)
            for h in range(2):
                m[h] = NEG_INF
                ell[h] = float32(0.0)
            for j in range(ND):
                for e in range(4):
                    o[j, e] = float32(0.0)

            cp_async_wait_group(1)
            cuda.syncthreads()
            if Q_IN_REGS:
                load_q_fragments(qf, smem, 0, q_off)

            for jt in range(n_tiles):
                n0 = n_begin + jt * BN
                stage = int32(jt % 2)
                if jt > 0:
                    cp_async_wait_group(1)  # K_j has landed
                    cuda.syncthreads()
                # S = Q·K_jᵀ
                for j in range(NS):
                    for e in range(4):
                        s[j, e] = float32(0.0)
                q_kt(s, qf, smem, 0, q_off, K_BASE + stage * KV_BYTES, k_off)
                # K_j+1 streams in while this tile's softmax and P·V run.
                if jt + 1 < n_tiles:
                    load_kv_tile(smem, K_BASE + (1 - stage) * KV_BYTES, k, b, hkv, n0 + BN,
                                 n_stop, D, tid)
                cp_async_commit_group()

                masked = n0 + BN > mask_from
                softmax_lo(s, o, m, ell, lim_lo, masked, n0, t, scale_log2)
                softmax_hi(s, o, m, ell, lim_hi, masked, n0, t, scale_log2)

                cp_async_wait_group(1)  # V_j has landed
                cuda.syncthreads()
                if jt + 1 < n_tiles:
                    load_kv_tile(smem, V_BASE + (1 - stage) * KV_BYTES, v, b, hkv, n0 + BN,
                                 n_stop, D, tid)
                cp_async_commit_group()
                # O += P·V_j (S's n8 tile pairs are P's A fragments)
                p_v(o, s, smem, V_BASE + stage * KV_BYTES, v_off)
            cp_async_wait_group(0)
            cuda.syncthreads()  # every warp is done with the tiles: stage O over them

            cs = cuda.shared.array(0, float32)
            finish_lo(o, m, ell, cs, r_lo, t, scale_log2)
            finish_hi(o, m, ell, cs, r_lo + 8, t, scale_log2)
            cuda.syncthreads()
            store_rows(out32, out16, kind, zo, hg, P, Sq, m0, rows_total, D, tid)
            store_lse(lse, zo, hg, P, Sq, m0, rows_total, tid)

        self.operand = operand
        self.DP, self.BN, self.WARPS = DP, BN, WARPS
        self.BM, self.THREADS, self.SHARED_BYTES = BM, THREADS, tiles.SHARED_BYTES
        self.block = block


def attention_block(operand: str, DP: int, BN: int, WARPS: int) -> AttentionBlock:
    """The FlashAttention forward block for one variant (see :class:`AttentionBlock`)."""
    return AttentionBlock(operand, DP, BN, WARPS)


__all__ = ["LN2", "LOG2E", "NEG_INF", "AttentionBlock", "AttentionTiles", "attention_block",
           "online_max", "row_sum_lse"]
