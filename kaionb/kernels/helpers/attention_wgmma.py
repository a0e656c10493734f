"""One block's FlashAttention forward on Hopper's ``wgmma`` (sm_90a): the algorithm of
:mod:`.attention` with each GEMM issued by a whole warpgroup (FlashAttention-3, Shah et
al. 2024, https://arxiv.org/abs/2407.08608, without its warp specialization).

CONSUMERS warpgroups (4 warps, 64 query rows each) per block, sharing each K/V tile, on
:class:`.attention.AttentionTiles` (cp.async into 128-byte-swizzled panels — the layout
wgmma's 128-byte-swizzle descriptors read — with the tiles 1024-byte aligned). Per key
tile:

    S  = Q·K_jᵀ      wgmma m64n{BN}k16, Q and K from shared memory (both K-major)
    softmax on S in registers (ptx_patches.accumulator_softmax: the accumulator tuple is
       never indexed from numba), row maxima reduced over each quad with shuffles
    O  = O·α + P·V_j  wgmma m64n{DP}k16, P from registers (the S accumulator repacked:
       words 4kk … 4kk+3 are the A fragment of k-step kk), V from shared memory N-major
       (transposed B: 64-column panels BN·128 bytes apart, 16 keys = 2048 bytes a step)

Overlap (FlashAttention-3's intra-warpgroup pipelining): S_j and P_j−1·V_j−1 are issued
together and S_j's softmax runs while the P·V wgmma does; the SM's other blocks (two or
three fit) fill the rest. The k-steps are written out (:func:`_straight_line`): numba keeps a
range loop rolled, and ptxas then waits on every wgmma of the loop.
"""

from __future__ import annotations

from numba import cuda, float32, int32, uint32, uint64

from kaionb.ptx_patches import (
    accumulator_exp2,
    accumulator_mask_columns,
    accumulator_pack,
    accumulator_row_max,
    accumulator_scale_rows,
    accumulator_zeros,
    cp_async_commit_group,
    cp_async_wait_group,
    device_function,
    fence_proxy_async_shared,
    make_smem_desc,
    shared_addr,
    st_shared_accumulator_f32,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_m64n64k16_f32_bf16,
    wgmma_m64n64k16_f32_bf16_rs,
    wgmma_m64n64k16_f32_f16,
    wgmma_m64n64k16_f32_f16_rs,
    wgmma_m64n128k16_f32_bf16,
    wgmma_m64n128k16_f32_bf16_rs,
    wgmma_m64n128k16_f32_f16,
    wgmma_m64n128k16_f32_f16_rs,
    wgmma_m64n256k16_f32_bf16,
    wgmma_m64n256k16_f32_bf16_rs,
    wgmma_m64n256k16_f32_f16,
    wgmma_m64n256k16_f32_f16_rs,
    wgmma_wait_group,
    wgmma_wait_group_holding,
)

from .attention import NEG_INF, AttentionTiles, online_max, row_sum_lse
from .reduce import FULL_MASK
from .mma_pipeline import LINE

ATOM = 1024  # a 128-byte swizzle atom: 8 rows of 128 bytes; tiles start on one
WG_ROWS = 64  # one warpgroup's rows
# wgmma with both operands in shared memory (S = Q·Kᵀ), and with A in registers (P·V).
WGMMA_SS = {("f16", 64): wgmma_m64n64k16_f32_f16, ("f16", 128): wgmma_m64n128k16_f32_f16,
            ("f16", 256): wgmma_m64n256k16_f32_f16, ("bf16", 64): wgmma_m64n64k16_f32_bf16,
            ("bf16", 128): wgmma_m64n128k16_f32_bf16,
            ("bf16", 256): wgmma_m64n256k16_f32_bf16}
WGMMA_RS = {("f16", 64): wgmma_m64n64k16_f32_f16_rs,
            ("f16", 128): wgmma_m64n128k16_f32_f16_rs,
            ("f16", 256): wgmma_m64n256k16_f32_f16_rs,
            ("bf16", 64): wgmma_m64n64k16_f32_bf16_rs,
            ("bf16", 128): wgmma_m64n128k16_f32_bf16_rs,
            ("bf16", 256): wgmma_m64n256k16_f32_bf16_rs}


def _straight_line(make_step, count):
    """One device function ``f(x, y, acc)`` running ``make_step(i)(x, y, acc)`` for
    i = 0 … count−1 in order, as straight-line code (each step is inlined)."""
    fn = make_step(count - 1)
    for i in reversed(range(count - 1)):
        fn = _then(make_step(i), fn)
    return fn


def _then(first, rest):
    @device_function
    def both(x, y, acc):
        return rest(x, y, first(x, y, acc))
    return both


class WgmmaAttentionBlock:
    """The Hopper variant: ``operand`` "f16"/"bf16", ``DP`` ∈ {64, 128, 256} (the P·V
    wgmma's N), ``BN`` ∈ {64, 128, 256} keys per tile (the Q·Kᵀ wgmma's N), STAGES ≥ 2
    buffers each of K and V (the loads run STAGES − 1 tiles ahead), CONSUMERS warpgroups
    of 64 rows. ``block`` has the signature of :class:`.attention.AttentionBlock`'s."""

    def __init__(self, operand: str, DP: int, BN: int, STAGES: int = 2, CONSUMERS: int = 1):
        if (operand, DP) not in WGMMA_RS or (operand, BN) not in WGMMA_SS:
            raise ValueError(f"wgmma attention block: DP and BN must be 64, 128 or 256 and "
                             f"the operand f16 or bf16, got {operand}, DP {DP}, BN {BN}")
        kind = operand
        if STAGES < 2:
            raise ValueError(f"wgmma attention block: STAGES must be at least 2, got {STAGES}")
        BM, THREADS = WG_ROWS * CONSUMERS, 128 * CONSUMERS
        tiles = AttentionTiles(DP, BN, BM, THREADS, STAGES, UNROLL_FULL=True)
        PENDING = STAGES - 2  # load groups left in flight when a tile is consumed
        AHEAD = STAGES - 1  # load groups behind Q and K_0 at the first tile
        KV_BYTES, CS, K_BASE, V_BASE = tiles.KV_BYTES, tiles.CS, tiles.K_BASE, tiles.V_BASE
        # Tiles from the first 1024-byte boundary of the dynamic shared memory (the staged
        # output and its lse are read from offset 0 by tiles.store_rows).
        SHARED_BYTES = tiles.SHARED_BYTES + ATOM
        load_kv_tile, load_q_tile = tiles.load_kv_tile, tiles.load_q_tile
        block_plan, store_rows, store_lse = tiles.block_plan, tiles.store_rows, tiles.store_lse
        KS = DP // 16  # k-steps of Q·Kᵀ
        KK = BN // 16  # k-steps of P·V
        wgmma_s = WGMMA_SS[(operand, BN)]
        wgmma_o = WGMMA_RS[(operand, DP)]
        row_max = accumulator_row_max(BN)
        mask_columns = accumulator_mask_columns(BN)
        exp2 = accumulator_exp2(BN)
        pack = accumulator_pack(BN, kind)
        scale_o = accumulator_scale_rows(DP)
        stage_o = st_shared_accumulator_f32(DP)
        wait_holding_p = wgmma_wait_group_holding(BN // 4)
        S_REGS, O_REGS = BN // 2, DP // 2  # accumulator registers per thread

        def qk_step(ks):
            # K-major Q and K: a k-step is 32 bytes inside a 128-byte line; four fill a
            # panel, the next panel lies ROWS·128 bytes on (descriptor units: 16 bytes).
            q_step = ((ks // 4) * BM * LINE + (ks % 4) * 32) >> 4
            k_step = ((ks // 4) * BN * LINE + (ks % 4) * 32) >> 4
            first = 0 if ks == 0 else 1  # scale-d 0: the first k-step overwrites S

            @device_function
            def step(q_desc, k_desc, acc):
                return wgmma_s(q_desc + uint64(q_step), k_desc + uint64(k_step), first, 0, 0,
                               acc)
            return step

        def pv_step(kk):
            v_step = (kk * 16 * LINE) >> 4  # 16 keys of the N-major V panels
            w0, w1, w2, w3 = 4 * kk, 4 * kk + 1, 4 * kk + 2, 4 * kk + 3

            @device_function
            def step(p, v_desc, acc):
                return wgmma_o((p[w0], p[w1], p[w2], p[w3]), v_desc + uint64(v_step), 1, 1,
                               acc)
            return step

        qk = _straight_line(qk_step, KS)
        pv = _straight_line(pv_step, KK)

        @device_function
        def tiles_landed():
            """The loads issued before the last PENDING groups have landed and are visible
            to wgmma (the async proxy) in every thread's view, after the barrier."""
            cp_async_wait_group(PENDING)
            fence_proxy_async_shared()
            cuda.syncthreads()

        @device_function
        def load_group(smem, k_base, v_base, k, v, b, hkv, i, n_begin, n_tiles, n_stop, D,
                       tid):
            """Load group i: K of tile i + 1 and V of tile i (those that exist), one
            commit group whether or not (the wait counts stay exact)."""
            if i + 1 < n_tiles:
                load_kv_tile(smem, k_base + ((i + 1) % STAGES) * KV_BYTES, k, b, hkv,
                             n_begin + (i + 1) * BN, n_stop, D, tid)
            if i < n_tiles:
                load_kv_tile(smem, v_base + (i % STAGES) * KV_BYTES, v, b, hkv,
                             n_begin + i * BN, n_stop, D, tid)
            cp_async_commit_group()

        @device_function
        def softmax_tile(s, m_lo, m_hi, l_lo, l_hi, keys_lo, keys_hi, masked, scale_log2):
            """The online softmax on one S tile: (P packed, m_lo, m_hi, ℓ_lo, ℓ_hi, α_lo,
            α_hi), α the factor that rescales O."""
            if masked:
                s = mask_columns(keys_lo, keys_hi, s)
            mx_lo, mx_hi = row_max(s, m_lo, m_hi)
            m_lo, ms_lo, alpha_lo = online_max(m_lo, mx_lo, scale_log2)
            m_hi, ms_hi, alpha_hi = online_max(m_hi, mx_hi, scale_log2)
            e = exp2(scale_log2, -ms_lo, -ms_hi, s)
            return (pack(e[:S_REGS]), m_lo, m_hi, l_lo * alpha_lo + e[S_REGS],
                    l_hi * alpha_hi + e[S_REGS + 1], alpha_lo, alpha_hi)

        @device_function
        def block(smem, q, k, v, out32, out16, lse, kind_out, Sq, Sk, D, G, P, causal,
                  scale_log2, b, zo, hg, m0, n_begin, n_hi):
            tid = int32(cuda.threadIdx.x)
            lane, warp = tid % 32, tid // 32
            g, t = lane // 4, lane % 4
            r_lo = warp * 16 + g  # this lane's rows: g and g + 8 of the warp's m16 tile
            rows_total, hkv, n_stop, mask_from, n_tiles, lim_lo, lim_hi = block_plan(
                Sq, Sk, G, P, causal, hg, m0, n_begin, n_hi, r_lo)
            # The mask's limits relative to column 2t of the tile at n_begin.
            keys_lo = int32(lim_lo - n_begin - 2 * t)
            keys_hi = int32(lim_hi - n_begin - 2 * t)

            smem0 = shared_addr(smem, 0)
            pad = int32((ATOM - smem0 % ATOM) % ATOM)
            k_base = pad + K_BASE
            v_base = pad + V_BASE
            # This warpgroup's 64 rows of Q: whole swizzle atoms into each panel.
            q_desc = make_smem_desc(smem0 + uint32(pad + (warp // 4) * (WG_ROWS * LINE)), 16,
                                    ATOM, 128)
            k_desc = make_smem_desc(smem0 + uint32(k_base), 16, ATOM, 128)
            v_desc = make_smem_desc(smem0 + uint32(v_base), BN * LINE, ATOM, 128)
            stage_desc = uint64(KV_BYTES >> 4)

            o = accumulator_zeros(O_REGS)
            s = accumulator_zeros(S_REGS)
            m_lo = NEG_INF
            m_hi = NEG_INF
            l_lo = float32(0.0)
            l_hi = float32(0.0)
            load_q_tile(smem, pad, q, b, hg, m0, rows_total, Sq, P, D, tid)
            if n_tiles > 0:
                load_kv_tile(smem, k_base, k, b, hkv, n_begin, n_stop, D, tid)
            cp_async_commit_group()
            # Load groups 0 … STAGES−2 (K_i+1, V_i) in flight behind Q and K_0.
            for i in range(AHEAD):
                load_group(smem, k_base, v_base, k, v, b, hkv, i, n_begin, n_tiles, n_stop,
                           D, tid)
            if n_tiles > 0:
                # Tile 0: S_0 and its softmax.
                cp_async_wait_group(AHEAD)  # Q and K_0
                fence_proxy_async_shared()
                cuda.syncthreads()
                wgmma_fence()
                s = qk(q_desc, k_desc, s)
                wgmma_commit_group()
                wgmma_wait_group(0)
                p, m_lo, m_hi, l_lo, l_hi, alpha_lo, alpha_hi = softmax_tile(
                    s, m_lo, m_hi, l_lo, l_hi, keys_lo, keys_hi, BN > mask_from - n_begin,
                    scale_log2)
            # Tile j (FlashAttention-3's intra-warpgroup overlap): S_j = Q·K_jᵀ and
            # O += P_j−1·V_j−1 issued together; S_j's softmax runs while the P·V wgmma
            # does; O is rescaled once that has retired. Load group j + STAGES − 2 streams
            # in meanwhile.
            for jt in range(1, n_tiles):
                n0 = n_begin + jt * BN
                tiles_landed()  # group j − 1: K_j, V_j−1; every warp is past tile j − 1
                load_group(smem, k_base, v_base, k, v, b, hkv, jt + STAGES - 2, n_begin,
                           n_tiles, n_stop, D, tid)
                wgmma_fence()
                s = qk(q_desc, k_desc + uint64(jt % STAGES) * stage_desc, s)
                wgmma_commit_group()
                o = pv(p, v_desc + uint64((jt - 1) % STAGES) * stage_desc, o)
                wgmma_commit_group()
                wgmma_wait_group(1)  # S_j
                p_next, m_lo, m_hi, l_lo, l_hi, alpha_lo, alpha_hi = softmax_tile(
                    s, m_lo, m_hi, l_lo, l_hi, int32(keys_lo - jt * BN),
                    int32(keys_hi - jt * BN), n0 + BN > mask_from, scale_log2)
                wait_holding_p(0, p)  # P_j−1·V_j−1 has retired: P_j−1's registers are free
                # Once the row maxima settle, α = 1 in every row: skip the DP/2 multiplies.
                if cuda.any_sync(FULL_MASK, alpha_lo != float32(1.0) or alpha_hi != float32(1.0)):
                    o = scale_o(alpha_lo, alpha_hi, o)
                p = p_next
            if n_tiles > 0:
                cp_async_wait_group(0)  # V of the last tile
                fence_proxy_async_shared()
                cuda.syncthreads()
                wgmma_fence()
                o = pv(p, v_desc + uint64((n_tiles - 1) % STAGES) * stage_desc, o)
                wgmma_commit_group()
                wgmma_wait_group(0)

            inv_lo, lse_lo = row_sum_lse(l_lo, m_lo, scale_log2)
            inv_hi, lse_hi = row_sum_lse(l_hi, m_hi, scale_log2)
            o = scale_o(inv_lo, inv_hi, o)
            cp_async_wait_group(0)
            cuda.syncthreads()  # every warp is done with the tiles: stage O over them
            cs = cuda.shared.array(0, float32)
            stage_o(shared_addr(cs, r_lo * CS + 2 * t), shared_addr(cs, (r_lo + 8) * CS + 2 * t),
                    o)
            if t == 0:
                cs[BM * CS + r_lo] = lse_lo
                cs[BM * CS + r_lo + 8] = lse_hi
            cuda.syncthreads()
            store_rows(out32, out16, kind_out, zo, hg, P, Sq, m0, rows_total, D, tid)
            store_lse(lse, zo, hg, P, Sq, m0, rows_total, tid)

        self.operand = operand
        self.DP, self.BN, self.STAGES, self.CONSUMERS = DP, BN, STAGES, CONSUMERS
        self.BM, self.THREADS = BM, THREADS
        self.SHARED_BYTES = SHARED_BYTES
        self.block = block


def wgmma_attention_block(operand: str, DP: int, BN: int, STAGES: int = 2,
                          CONSUMERS: int = 1) -> WgmmaAttentionBlock:
    """The Hopper FlashAttention forward block for one variant."""
    return WgmmaAttentionBlock(operand, DP, BN, STAGES, CONSUMERS)


__all__ = ["WgmmaAttentionBlock", "wgmma_attention_block"]
