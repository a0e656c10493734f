"""FlashAttention backward blocks on mma.sync (every GPU from sm_80), from the forward's
saved statistics and deterministic (no atomics: every output element is written by one
block, its sum taken in a fixed order).

With c = scale·log2(e), ℓ2_i = lse_i·log2(e) (+inf for a row with no key, so P = 0 there
and for padding rows) and Δ_i = Σ_d dO_id·O_id (both from the preprocess kernel), for query
row i and key j:

    P_ij  = 2^(S_ij·c − ℓ2_i)     S = Q·Kᵀ, recomputed
    dP_ij = dO_i·V_jᵀ
    dS_ij = P_ij·(dP_ij − Δ_i)
    dV_j  = Σ_i P_ij·dO_i     dK_j = scale·Σ_i dS_ij·Q_i     dQ_i = scale·Σ_j dS_ij·K_j

(FlashAttention-2, Dao 2023, §3.2: https://arxiv.org/abs/2307.08691.) Two blocks on the
forward's tiles (:class:`.attention.AttentionTiles`) and warp GEMMs (:mod:`.warp_mma`):

- :class:`KeyBlock` (dK, dV): BN keys of one K/V head, 16 keys a warp (wide heads: COL_SPLIT
  warps share 16 keys, each holding a 64-column share of dK and dV), against every query
  tile of the GQA group's heads in order, so dK and dV are summed over the group on chip.
  Q, dO and the tile's (ℓ2, Δ) stream through two cp.async stages. Per query tile, with the
  warp's keys as rows: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ and dSᵀ (column = query: ℓ2 and Δ read
  from shared memory), dV += Pᵀ·dO, dK += dSᵀ·Q.
- :class:`QueryBlock` (dQ): 16·WARPS query rows against every key tile (K, V streamed):
  S = Q·Kᵀ, dP = dO·Vᵀ, dS, dQ += dS·K. Recomputing S and dP here costs two of the
  backward's seven GEMMs (FlashAttention-2 adds dQ with atomics instead, whose order — and
  so whose rounding — changes run to run).

Masks: causal keys j > i + Sk − Sq (bottom-right, as the forward) and keys past Sk in the
dQ pass give P = 0. Padding rows past Sq read zero Q and dO and ℓ2 = +inf; padding keys
past Sk read zero K and V, and their dK/dV rows are never stored. ℓ2 and Δ are kept as
[B·Hq, SQ_PAD] float32 with SQ_PAD a multiple of STAT_ROWS, so a tile's statistics are
whole 16-byte chunks.
"""

from __future__ import annotations

from numba import cuda, float32, int32, int64, uint32

from kaionb.ptx_patches import (
    cp_async_cg_16,
    cp_async_commit_group,
    cp_async_wait_group,
    device_function,
    ex2_approx_f32,
    global_addr,
    shared_addr,
)

from .attention import AttentionTiles
from .mma_pipeline import LINE
from .warp_mma import load_a_fragments, strip_abt, strip_lane_offsets, strip_pb

STAT_ROWS = 64  # SQ_PAD is a multiple of this: every block's row count divides it


def _check(name, operand, DP):
    if operand not in ("f16", "bf16"):
        raise ValueError(f"{name}: operand must be f16 or bf16, got {operand!r}")
    if DP % 16 or not 16 <= DP <= 256:
        raise ValueError(f"{name}: DP {DP} must be a multiple of 16 up to 256")


class KeyBlock:
    """dK and dV of BN = 16·KEY_WARPS keys (module doc). ``operand``: "f16" or "bf16";
    ``DP``: the head dimension computed; ``BMQ``: query rows per streamed tile;
    ``COL_SPLIT``: warps sharing 16 keys (DP / COL_SPLIT a multiple of 64 when > 1);
    ``KV_IN_REGS``: keep the warp's K and V fragments in registers.

    ``block(smem, q, k, v, do, lse2, delta, dk32, dk16, dv32, dv16, kind, Sq, Sk, D, G,
    causal, scale_log2, scale, b, hkv, n0)``: keys n0 … n0+BN−1 of K/V head ``hkv`` of
    batch ``b`` against query heads hkv·G … hkv·G+G−1; dK, dV go to ``dk32``/``dv32``
    (``kind`` OUT_F32) or ``dk16``/``dv16`` (f16/bf16 bits) at [b, hkv]. q, do [B, Hq, Sq, D]
    and k, v [B, Hkv, Sk, D] are uint16 arrays with any strides (16-byte aligned rows);
    lse2, delta [B·Hq, SQ_PAD] float32.
    """

    def __init__(self, operand: str, DP: int, BMQ: int, KEY_WARPS: int, COL_SPLIT: int = 1,
                 KV_IN_REGS: bool = False):
        _check("attention backward key block", operand, DP)
        DC = DP // COL_SPLIT  # dK/dV columns a warp accumulates
        if COL_SPLIT > 1 and DC % 64:
            raise ValueError(f"attention backward key block: DP {DP} / COL_SPLIT "
                             f"{COL_SPLIT} must be a multiple of 64")
        if STAT_ROWS % BMQ or BMQ % 16:
            raise ValueError(f"attention backward key block: BMQ {BMQ} must divide "
                             f"{STAT_ROWS} in multiples of 16")
        BN = 16 * KEY_WARPS
        WARPS = KEY_WARPS * COL_SPLIT
        THREADS = 32 * WARPS
        # Streamed: Q (as the tiles' K stages) and dO (V stages), BMQ rows; fixed: K and V
        # (the tiles' two BN-row "Q" tiles).
        tiles = AttentionTiles(DP, BMQ, BN, THREADS, STAGES=2, Q_TILES=2)
        KV_TILE, Q_STAGE, DO_STAGE = tiles.Q_BYTES, tiles.K_BASE, tiles.V_BASE
        STAGE_BYTES, CS = tiles.KV_BYTES, tiles.CS
        STATS = tiles.TILE_BYTES  # per stage: ℓ2 then Δ, BMQ f32 each
        STATS_STAGE = 2 * BMQ * 4
        load_rows, load_stage = tiles.load_q_tile, tiles.load_kv_tile
        store_rows = tiles.store_rows
        KS = DP // 16  # k16 steps of Sᵀ and dPᵀ
        NTQ = BMQ // 8  # n8 tiles (query columns) of Sᵀ
        KKQ = BMQ // 16  # k16 steps of dV, dK
        NDC = DC // 16  # n16 pairs of the warp's dK/dV columns
        NTC = 2 * NDC  # their n8 tiles
        PANEL_COLS = DC // 64  # panels before a warp's column share (COL_SPLIT > 1)
        AF = KS if KV_IN_REGS else 1
        k_qt = strip_abt(operand, NTQ, KS, BN, BMQ, A_IN_REGS=KV_IN_REGS)
        p_b = strip_pb(operand, KKQ, NDC, BMQ)
        load_fragments = load_a_fragments(KS, BN)

        @device_function
        def load_query_tile(smem, stage, q, do, lse2, delta, b, hq, i0, Sq, D, Hq, tid):
            """cp.async Q, dO rows i0 … i0+BMQ−1 of head hq and their ℓ2, Δ into ``stage``."""
            load_stage(smem, Q_STAGE + stage * STAGE_BYTES, q, b, hq, i0, Sq, D, tid)
            load_stage(smem, DO_STAGE + stage * STAGE_BYTES, do, b, hq, i0, Sq, D, tid)
            if tid < BMQ // 2:  # 16-byte chunks: BMQ/4 of ℓ2, then BMQ/4 of Δ
                src = lse2 if tid < BMQ // 4 else delta
                c = tid % (BMQ // 4)
                cp_async_cg_16(
                    shared_addr(smem, STATS + stage * STATS_STAGE + (tid // (BMQ // 4))
                                * (BMQ * 4) + c * 16),
                    global_addr(src, (int64(b * Hq + hq), int64(i0 + 4 * c))), 16)

        @device_function
        def stage_out(cs, acc, row, col0, t, factor):
            """The warp's accumulator (rows row, row + 8; columns col0 …) times ``factor``
            into the staged f32 tile."""
            for j in range(NTC):
                for h in range(2):
                    for e in range(2):
                        cs[(row + 8 * h) * CS + col0 + 8 * j + 2 * t + e] = (
                            acc[j, 2 * h + e] * factor)

        @device_function
        def block(smem, q, k, v, do, lse2, delta, dk32, dk16, dv32, dv16, kind, Sq, Sk, D,
                  G, causal, scale_log2, scale, b, hkv, n0):
            tid = int32(cuda.threadIdx.x)
            lane, warp = tid % 32, tid // 32
            g, t = lane // 4, lane % 4
            kw = warp % KEY_WARPS  # the warp's 16 keys
            part = warp // KEY_WARPS  # its column share
            Hq = G * int32(k.shape[1])
            off = Sk - Sq  # query i sees keys j <= i + off
            # Query tiles: causal, from the first row that sees key n0; those whose rows do
            # not all see the block's last key need the mask.
            n_last = min(n0 + BN, Sk) - 1
            it_first = int32(0)
            if causal != 0:
                it_first = max(int32(0), n0 - off) // BMQ
            q_tiles = (Sq + BMQ - 1) // BMQ
            per_head = q_tiles - it_first
            n_iters = G * per_head

            load_rows(smem, 0, k, b, hkv, n0, Sk, Sk, 1, D, tid)
            load_rows(smem, KV_TILE, v, b, hkv, n0, Sk, Sk, 1, D, tid)
            if n_iters > 0:
                load_query_tile(smem, 0, q, do, lse2, delta, b, hkv * G, it_first * BMQ, Sq,
                                D, Hq, tid)
            cp_async_commit_group()

            a_off, b_off, bt_off = strip_lane_offsets(lane, kw * 16)
            col_panel = part * PANEL_COLS * (BMQ * LINE)
            kf = cuda.local.array((AF, 4), uint32)
            vf = cuda.local.array((AF, 4), uint32)
            s = cuda.local.array((NTQ, 4), float32)
            dp = cuda.local.array((NTQ, 4), float32)
            dk = cuda.local.array((NTC, 4), float32)
            dv = cuda.local.array((NTC, 4), float32)
            for j in range(NTC):
                for e in range(4):
                    dk[j, e] = float32(0.0)
                    dv[j, e] = float32(0.0)
            stats = cuda.shared.array(0, float32)
            key_lo = n0 + kw * 16 + g  # this lane's keys: key_lo, key_lo + 8

            for it in range(n_iters):
                stage = int32(it % 2)
                i0 = (it_first + it % per_head) * BMQ
                cp_async_wait_group(0)  # this tile has landed ...
                cuda.syncthreads()  # ... for every thread, and the other stage is free
                if KV_IN_REGS and it == 0:
                    load_fragments(kf, smem, 0, a_off)
                    load_fragments(vf, smem, KV_TILE, a_off)
                if it + 1 < n_iters:
                    nxt = it + 1
                    load_query_tile(smem, 1 - stage, q, do, lse2, delta, b,
                                    hkv * G + nxt // per_head,
                                    (it_first + nxt % per_head) * BMQ, Sq, D, Hq, tid)
                cp_async_commit_group()

                for j in range(NTQ):
                    for e in range(4):
                        s[j, e] = float32(0.0)
                        dp[j, e] = float32(0.0)
                q_stage = Q_STAGE + stage * STAGE_BYTES
                do_stage = DO_STAGE + stage * STAGE_BYTES
                k_qt(s, kf, smem, 0, a_off, q_stage, b_off)  # Sᵀ = K·Qᵀ
                k_qt(dp, vf, smem, KV_TILE, a_off, do_stage, b_off)  # dPᵀ = V·dOᵀ

                masked = causal != 0 and i0 + off < n_last
                st = (STATS + stage * STATS_STAGE) // 4
                for j in range(NTQ):
                    for e in range(2):
                        col = 8 * j + 2 * t + e
                        l2 = stats[st + col]
                        dl = stats[st + BMQ + col]
                        for h in range(2):
                            x = ex2_approx_f32(s[j, 2 * h + e] * scale_log2 - l2)
                            if masked and key_lo + 8 * h > i0 + col + off:
                                x = float32(0.0)
                            s[j, 2 * h + e] = x  # Pᵀ
                            dp[j, 2 * h + e] = x * (dp[j, 2 * h + e] - dl)  # dSᵀ
                p_b(dv, s, smem, do_stage + col_panel, bt_off)  # dV += Pᵀ·dO
                p_b(dk, dp, smem, q_stage + col_panel, bt_off)  # dK += dSᵀ·Q

            cp_async_wait_group(0)
            cuda.syncthreads()  # every warp is done with the tiles: stage dK over them
            cs = cuda.shared.array(0, float32)
            stage_out(cs, dk, kw * 16 + g, part * DC, t, scale)
            cuda.syncthreads()
            store_rows(dk32, dk16, kind, b, hkv, 1, Sk, n0, Sk, D, tid)
            cuda.syncthreads()
            stage_out(cs, dv, kw * 16 + g, part * DC, t, float32(1.0))
            cuda.syncthreads()
            store_rows(dv32, dv16, kind, b, hkv, 1, Sk, n0, Sk, D, tid)

        self.operand, self.DP, self.BMQ = operand, DP, BMQ
        self.BN, self.WARPS, self.THREADS = BN, WARPS, THREADS
        self.SHARED_BYTES = max(tiles.SHARED_BYTES, STATS + 2 * STATS_STAGE)
        self.block = block


class QueryBlock:
    """dQ of BM = 16·WARPS query rows (module doc): ``operand`` "f16" or "bf16", ``DP`` the
    head dimension computed, ``BN`` keys per streamed K/V tile.

    ``block(smem, q, k, v, do, lse2, delta, dq32, dq16, kind, Sq, Sk, D, G, causal,
    scale_log2, scale, b, hq, m0)``: rows m0 … of query head ``hq`` of batch ``b``; dQ to
    ``dq32`` (``kind`` OUT_F32) or ``dq16`` at [b, hq]. Arrays as :class:`KeyBlock`'s.
    """

    def __init__(self, operand: str, DP: int, BN: int, WARPS: int):
        _check("attention backward query block", operand, DP)
        BM = 16 * WARPS
        if STAT_ROWS % BM or BN % 16:
            raise ValueError(f"attention backward query block: 16·WARPS {BM} must divide "
                             f"{STAT_ROWS}, BN {BN} a multiple of 16")
        THREADS = 32 * WARPS
        tiles = AttentionTiles(DP, BN, BM, THREADS, STAGES=2, Q_TILES=2)
        DO_TILE, K_BASE, V_BASE = tiles.Q_BYTES, tiles.K_BASE, tiles.V_BASE
        KV_BYTES, CS = tiles.KV_BYTES, tiles.CS
        load_rows, load_kv_tile = tiles.load_q_tile, tiles.load_kv_tile
        block_plan, store_rows = tiles.block_plan, tiles.store_rows
        KS = DP // 16
        NS = BN // 8  # n8 tiles (keys) of S
        KK = BN // 16  # k16 steps of dS·K
        ND = DP // 8  # n8 tiles of dQ
        q_kt = strip_abt(operand, NS, KS, BM, BN)
        ds_k = strip_pb(operand, KK, KS, BN)

        def make_row(H):
            """dS for row g + 8·H of the warp's strip (H fixed: constant indices)."""

            @device_function
            def ds_row(s, dp, l2, dl, lim, masked, n0, t, scale_log2):
                keys = int32(lim - n0 - 2 * t)  # this lane's columns 8j + e below it
                for j in range(NS):
                    for e in range(2):
                        x = ex2_approx_f32(s[j, 2 * H + e] * scale_log2 - l2)
                        if masked and 8 * j + e >= keys:
                            x = float32(0.0)
                        s[j, 2 * H + e] = x * (dp[j, 2 * H + e] - dl)

            return ds_row

        ds_lo, ds_hi = make_row(0), make_row(1)

        @device_function
        def block(smem, q, k, v, do, lse2, delta, dq32, dq16, kind, Sq, Sk, D, G, causal,
                  scale_log2, scale, b, hq, m0):
            tid = int32(cuda.threadIdx.x)
            lane, warp = tid % 32, tid // 32
            g, t = lane // 4, lane % 4
            r_lo = warp * 16 + g
            _, hkv, n_stop, mask_from, n_tiles, lim_lo, lim_hi = block_plan(
                Sq, Sk, G, 1, causal, hq, m0, int32(0), Sk, r_lo)
            Hq = int32(q.shape[1])
            z = int64(b * Hq + hq)
            l2_lo, l2_hi = lse2[z, m0 + r_lo], lse2[z, m0 + r_lo + 8]
            dl_lo, dl_hi = delta[z, m0 + r_lo], delta[z, m0 + r_lo + 8]

            load_rows(smem, 0, q, b, hq, m0, Sq, Sq, 1, D, tid)
            load_rows(smem, DO_TILE, do, b, hq, m0, Sq, Sq, 1, D, tid)
            if n_tiles > 0:
                load_kv_tile(smem, K_BASE, k, b, hkv, 0, n_stop, D, tid)
                load_kv_tile(smem, V_BASE, v, b, hkv, 0, n_stop, D, tid)
            cp_async_commit_group()

            a_off, b_off, bt_off = strip_lane_offsets(lane, warp * 16)
            none = cuda.local.array((1, 4), uint32)  # strip_abt's unused A fragments
            s = cuda.local.array((NS, 4), float32)
            dp = cuda.local.array((NS, 4), float32)
            dq = cuda.local.array((ND, 4), float32)
            for j in range(ND):
                for e in range(4):
                    dq[j, e] = float32(0.0)

            for jt in range(n_tiles):
                n0 = jt * BN
                stage = int32(jt % 2)
                cp_async_wait_group(0)
                cuda.syncthreads()
                if jt + 1 < n_tiles:
                    load_kv_tile(smem, K_BASE + (1 - stage) * KV_BYTES, k, b, hkv, n0 + BN,
                                 n_stop, D, tid)
                    load_kv_tile(smem, V_BASE + (1 - stage) * KV_BYTES, v, b, hkv, n0 + BN,
                                 n_stop, D, tid)
                cp_async_commit_group()
                for j in range(NS):
                    for e in range(4):
                        s[j, e] = float32(0.0)
                        dp[j, e] = float32(0.0)
                k_stage = K_BASE + stage * KV_BYTES
                q_kt(s, none, smem, 0, a_off, k_stage, b_off)  # S = Q·Kᵀ
                q_kt(dp, none, smem, DO_TILE, a_off, V_BASE + stage * KV_BYTES, b_off)
                masked = n0 + BN > mask_from
                ds_lo(s, dp, l2_lo, dl_lo, lim_lo, masked, n0, t, scale_log2)
                ds_hi(s, dp, l2_hi, dl_hi, lim_hi, masked, n0, t, scale_log2)
                ds_k(dq, s, smem, k_stage, bt_off)  # dQ += dS·K

            cp_async_wait_group(0)
            cuda.syncthreads()
            cs = cuda.shared.array(0, float32)
            for j in range(ND):
                for h in range(2):
                    for e in range(2):
                        cs[(r_lo + 8 * h) * CS + 8 * j + 2 * t + e] = dq[j, 2 * h + e] * scale
            cuda.syncthreads()
            store_rows(dq32, dq16, kind, b, hq, 1, Sq, m0, Sq, D, tid)

        self.operand, self.DP, self.BN = operand, DP, BN
        self.BM, self.WARPS, self.THREADS = BM, WARPS, THREADS
        self.SHARED_BYTES = tiles.SHARED_BYTES
        self.block = block


__all__ = ["STAT_ROWS", "KeyBlock", "QueryBlock"]
