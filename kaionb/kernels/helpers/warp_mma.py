"""Warp GEMMs on a strip of 16 rows (mma.sync m16n8k16, f32 accumulators), reading the
128-byte-swizzled panel tiles of the attention blocks (:class:`.attention.AttentionTiles`:
rows of 64-element panels, each panel ROWS × 128 bytes, ``mma_pipeline.tile_offset``).

Two shapes cover FlashAttention forward and backward:

    acc[16 × 8·NT]  += A · Bᵀ   A: 16 rows of an [m][k] tile, B: NT·8 rows of an [n][k]
                                tile (Q·Kᵀ, dO·Vᵀ, K·Qᵀ ...), k = 16·KSTEPS
    acc[16 × 16·ND] += P · B    P: the C fragments of an earlier strip GEMM (16 × 16·KK,
                                rounded to f16/bf16 in registers: an m16n8 C tile pair is
                                exactly one k16 A fragment), B: an [k][n] tile read with
                                ldmatrix .trans (P·V, dSᵀ·Q ...)

Accumulators are ``cuda.local.array((tiles, 4), float32)`` (C fragment: rows g, g + 8;
columns 2t, 2t + 1 of n8 tile j, see :mod:`.fragments`); every loop bound is a compile-time
constant, so they stay in registers. Lane offsets come from :func:`strip_lane_offsets`
once; a k-step or panel moves by whole 128-byte lines and panels, which keeps the swizzle.
"""

from __future__ import annotations

from numba import int32

from kaionb.ptx_patches import device_function, ldmatrix_x4, ldmatrix_x4_trans, shared_addr

from .epilogue import OUT_BF16, OUT_F16, pack_pair
from .fragments import ldmatrix_x4_b_row_col, ldmatrix_x4_row_col
from .mma_pipeline import LINE, OPERANDS
from .tiles import swizzle_128b

PANEL_ROW_STEP = 16 * LINE  # 16 rows of a panel: two swizzle periods, offsets add
PACK_KIND = {"f16": OUT_F16, "bf16": OUT_BF16}


@device_function
def strip_lane_offsets(lane, row0):
    """The lane's byte offsets at k-step 0 within a panel: (A rows row0 … row0+15 of an
    [m][k] tile — row0 a multiple of 8; B of an [n][k] tile, rows from 0; B of a [k][n]
    tile read .trans, rows from 0)."""
    qr, qc = ldmatrix_x4_row_col(lane)
    kn, kc = ldmatrix_x4_b_row_col(lane)
    return (int32(swizzle_128b((row0 + qr) * LINE + qc * 2)),
            int32(swizzle_128b(kn * LINE + kc * 2)),
            int32(swizzle_128b(qr * LINE + qc * 2)))


def strip_abt(operand: str, NT: int, KSTEPS: int, A_ROWS: int, B_ROWS: int,
              A_IN_REGS: bool = False):
    """``strip(acc, af, smem, a_base, a_off, b_base, b_off)``: acc[NT, 4] += A·Bᵀ.
    A: the tile of A_ROWS rows at byte ``a_base`` (lane offset ``a_off``), or, with
    A_IN_REGS, its fragments af[KSTEPS, 4] (:func:`load_a_fragments`); B: the tile of B_ROWS
    rows at ``b_base``, its rows 0 … 8·NT−1 (lane offset ``b_off``)."""
    mma = OPERANDS[operand].mma
    if NT % 2:
        raise ValueError(f"strip_abt: NT {NT} must be even (B loads come in n16 pairs)")

    @device_function
    def strip(acc, af, smem, a_base, a_off, b_base, b_off):
        for ks in range(KSTEPS):
            if A_IN_REGS:
                a = (af[ks, 0], af[ks, 1], af[ks, 2], af[ks, 3])
            else:
                a = ldmatrix_x4(shared_addr(
                    smem, a_base + (ks // 4) * (A_ROWS * LINE) + (a_off ^ ((ks % 4) * 32))))
            for p in range(NT // 2):
                fb = ldmatrix_x4(shared_addr(
                    smem, b_base + (ks // 4) * (B_ROWS * LINE)
                    + ((b_off + p * PANEL_ROW_STEP) ^ ((ks % 4) * 32))))
                c0 = mma(a, (fb[0], fb[1]),
                         (acc[2 * p, 0], acc[2 * p, 1], acc[2 * p, 2], acc[2 * p, 3]))
                c1 = mma(a, (fb[2], fb[3]), (acc[2 * p + 1, 0], acc[2 * p + 1, 1],
                                             acc[2 * p + 1, 2], acc[2 * p + 1, 3]))
                for e in range(4):
                    acc[2 * p, e] = c0[e]
                    acc[2 * p + 1, e] = c1[e]

    return strip


def load_a_fragments(KSTEPS: int, A_ROWS: int):
    """``load(af, smem, a_base, a_off)``: the A fragments of every k-step of a strip into
    af[KSTEPS, 4] (operands reused across tiles, kept in registers)."""

    @device_function
    def load(af, smem, a_base, a_off):
        for ks in range(KSTEPS):
            fa = ldmatrix_x4(shared_addr(
                smem, a_base + (ks // 4) * (A_ROWS * LINE) + (a_off ^ ((ks % 4) * 32))))
            for e in range(4):
                af[ks, e] = fa[e]

    return load


def strip_pb(operand: str, KK: int, ND: int, B_ROWS: int):
    """``strip(acc, p, smem, b_base, bt_off)``: acc[2·ND, 4] += P·B. P: C fragments
    p[2·KK, 4] (16 × 16·KK), rounded to ``operand``; B: rows 0 … 16·KK−1 and columns
    0 … 16·ND−1 of the [k][n] tile of B_ROWS rows at ``b_base`` (lane offset ``bt_off``;
    ``b_base`` may point at any 64-column panel)."""
    mma = OPERANDS[operand].mma
    KIND = PACK_KIND[operand]

    @device_function
    def strip(acc, p, smem, b_base, bt_off):
        for kk in range(KK):
            a = (pack_pair(KIND, p[2 * kk, 0], p[2 * kk, 1]),
                 pack_pair(KIND, p[2 * kk, 2], p[2 * kk, 3]),
                 pack_pair(KIND, p[2 * kk + 1, 0], p[2 * kk + 1, 1]),
                 pack_pair(KIND, p[2 * kk + 1, 2], p[2 * kk + 1, 3]))
            for dp in range(ND):
                fb = ldmatrix_x4_trans(shared_addr(
                    smem, b_base + (dp // 4) * (B_ROWS * LINE)
                    + ((bt_off + kk * PANEL_ROW_STEP) ^ ((dp % 4) * 32))))
                c0 = mma(a, (fb[0], fb[1]),
                         (acc[2 * dp, 0], acc[2 * dp, 1], acc[2 * dp, 2], acc[2 * dp, 3]))
                c1 = mma(a, (fb[2], fb[3]), (acc[2 * dp + 1, 0], acc[2 * dp + 1, 1],
                                             acc[2 * dp + 1, 2], acc[2 * dp + 1, 3]))
                for e in range(4):
                    acc[2 * dp, e] = c0[e]
                    acc[2 * dp + 1, e] = c1[e]

    return strip


__all__ = ["PACK_KIND", "PANEL_ROW_STEP", "load_a_fragments", "strip_abt",
           "strip_lane_offsets", "strip_pb"]
