"""The ``mma.sync`` GEMM mainloop as parts: every tensor-core kernel below Hopper's wgmma
(matmul, quantized matmul, attention) is built from :func:`mma_pipeline`.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-mma
(``mma.sync``, ``ldmatrix``, ``cp.async``); design as CUTLASS's sm80 GEMM.

A block computes a BM×BN tile of C = A·B; its warps each a WM×WN sub-tile as (WM/16)×(WN/8)
m16n8 mmas per *k-step*. A k-step is 32 bytes of K whatever the operand — k16 of f16/bf16,
k8 of tf32, k32 of s8 — so one ldmatrix.x4 address pattern serves every element size:

    global -> shared    16-byte chunks: cp.async into a STAGES-deep ring ("async"), or
                        128-bit loads held in registers for one tile, then st.shared into
                        two buffers ("sync"); chunks past the matrix edge are zero-filled
    shared -> registers ldmatrix.x4 (``.trans`` for 16-bit M/N-major tiles; 32-bit loads
                        for 4-byte N-major B), double-buffered across k-steps
    registers           the operand's mma.sync into f32 (s32 for s8) accumulators

Operands are read from their *storage* matrices: A (M×K) K-major (row-major A) or
M-major (``x.T`` of a row-major K×M); B (K×N) N-major (row-major B) or K-major (``y.T``).
Storage arrays are 3-D ``[batch, rows, cols]`` views whose batch stride may be 0
(broadcast), unit stride on the last axis, rows ``ld`` elements apart. Shared tiles keep
the storage orientation, swizzled with the 128-byte pattern (``swizzle_128b``) and cut
into 128-byte-wide panels, so every ldmatrix phase and every 16-byte store hits 8
different bank groups. Offsets inside a tile are in bytes.

Supported: 2-byte operands (f16, bf16) in all four layouts; tf32 with K-major A (B either
way); s8 with K-major A and B (no transposing ldmatrix for 8-bit). ``tf32x3`` runs three
tf32 mmas per step on the split A = A_hi + A_lo, B = B_hi + B_lo (A_hi·B_hi + A_hi·B_lo +
A_lo·B_hi; the dropped A_lo·B_lo is ~2^-22 relative): float32 accuracy on tensor cores.

The kernel composes the parts: ``mainloop`` fills the accumulators, ``stage_accumulators``
writes them into an f32 C tile in shared memory (rows padded: conflict-free), and the
kernel's own epilogue reads that tile (e.g. ``helpers.epilogue.store_row_chunk8``).
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, float32, int32, int64, uint32, uint64

from kaionb.ptx_patches import (
    cp_async_cg_16,
    cp_async_commit_group,
    cp_async_wait_group,
    device_function,
    global_addr,
    ld_global_nc_v4_u32,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_m16n8k8_f32_tf32,
    mma_m16n8k16_f32_bf16,
    mma_m16n8k16_f32_f16,
    mma_m16n8k32_s32_s8,
    shared_addr,
    st_shared_v4_u32,
)

from .fragments import ldmatrix_x4_b_row_col, ldmatrix_x4_row_col
from .tiles import swizzle_128b

KSTEP_BYTES = 32  # bytes of K one mma consumes, every operand type
LINE = 128  # bytes of a swizzled line: a panel's width
CHUNK = 16  # bytes a loader moves at once
SWIZZLE_PERIOD = 1024  # bytes after which the 128-byte swizzle repeats (8 lines)


class Operand(NamedTuple):
    """An operand type of the mma.sync pipeline."""

    size: int  # bytes per element
    storage: str  # numba type of the storage arrays in kernel signatures
    mma: object  # the m16n8 mma instruction of one k-step
    accumulator: object  # numba type of the accumulators
    passes: int  # tf32 split passes: 1 (plain), 3 (tf32x3)


OPERANDS = {
    "f16": Operand(2, "uint16", mma_m16n8k16_f32_f16, float32, 1),
    "bf16": Operand(2, "uint16", mma_m16n8k16_f32_bf16, float32, 1),
    "tf32": Operand(4, "uint32", mma_m16n8k8_f32_tf32, float32, 1),
    "tf32x3": Operand(4, "uint32", mma_m16n8k8_f32_tf32, float32, 3),
    "s8": Operand(1, "int8", mma_m16n8k32_s32_s8, int32, 1),
}


class Tile(NamedTuple):
    """A block tile: BM×BN of C per block, BK elements of K per stage, a WARPS_M×WARPS_N
    grid of warps, STAGES buffers in the cp.async ring."""

    BM: int
    BN: int
    BK: int
    WARPS_M: int
    WARPS_N: int
    STAGES: int


@device_function
def tile_offset(r, cb, ROWS, ROW_BYTES):
    """Byte offset of (row ``r``, byte ``cb`` of the row) in a swizzled ROWS-row tile with
    ROW_BYTES per row; wider than one line it is a row of 128-byte panels."""
    if ROW_BYTES <= LINE:
        return swizzle_128b(r * ROW_BYTES + cb)
    return (cb // LINE) * (ROWS * LINE) + swizzle_128b(r * LINE + cb % LINE)


@device_function
def tf32_round(bits):
    """float32 bits rounded to tf32 (10 mantissa bits), to nearest, ties away: the mma
    ignores the low 13 bits, which would truncate."""
    return (bits + uint32(0x1000)) & uint32(0xFFFFE000)


@device_function
def tf32_split(bits):
    """(hi, lo) tf32 bits with hi + lo = x to ~2^-22 relative: hi = x rounded to tf32,
    lo = x − hi (exact in float32) rounded again."""
    hi = tf32_round(bits)
    x = cuda.libdevice.int_as_float(int32(bits))
    lo = x - cuda.libdevice.int_as_float(int32(hi))
    return hi, tf32_round(uint32(cuda.libdevice.float_as_int(lo)))


class MmaPipeline:
    """Compile-time geometry and device functions of one pipeline variant (module doc).

    ``mainloop(smem, a, b, bz, lda, ldb, m0, n0, k_begin, k_end, M, N, vec_ok, acc)``
    accumulates block tile (m0, n0) over K ∈ [k_begin, k_end) of batch ``bz`` into ``acc``
    (a local [MT, NT, 4] array of ``operand.accumulator``, zeroed by the caller); ``smem``
    is the kernel's dynamic shared uint8 array (``RING_BYTES`` of it); ``vec_ok``: the
    storage rows are 16-byte aligned (always for "async"). ``stage_accumulators(cs, acc)``
    writes them to ``cs`` (the shared array as f32/s32) as a BM×CS tile, CS = BN + 8.
    """

    def __init__(self, operand: str, a_kmajor: bool, b_kmajor: bool, loads: str, tile: Tile):
        op = OPERANDS[operand]
        E = op.size
        if E != 2 and not a_kmajor:
            raise ValueError(f"mma_pipeline: {operand} needs a K-major A")
        if E == 1 and not b_kmajor:
            raise ValueError("mma_pipeline: s8 needs a K-major B")
        if loads not in ("async", "sync"):
            raise ValueError(f"mma_pipeline: loads must be 'async' or 'sync', got {loads!r}")
        BM, BN, BK, WARPS_M, WARPS_N, STAGES = tile
        ASYNC = loads == "async"
        NBUF = STAGES if ASYNC else 2
        PENDING = STAGES - 2  # cp.async groups left in flight when a stage is consumed
        THREADS = 32 * WARPS_M * WARPS_N
        WM, WN = BM // WARPS_M, BN // WARPS_N
        MT, NT = WM // 16, WN // 8  # m16 and n8 mma tiles per warp
        NP = NT // 2  # ldmatrix.x4 loads of B per k-step (two n8 tiles each)
        KSTEPS = BK * E // KSTEP_BYTES
        EPC = CHUNK // E  # elements per 16-byte chunk
        # Storage tiles: rows × bytes per row.
        A_ROWS, A_ROW_BYTES = (BM, BK * E) if a_kmajor else (BK, BM * E)
        B_ROWS, B_ROW_BYTES = (BN, BK * E) if b_kmajor else (BK, BN * E)
        A_BYTES, B_BYTES = BM * BK * E, BN * BK * E
        A_CHUNKS, B_CHUNKS = A_BYTES // CHUNK // THREADS, B_BYTES // CHUNK // THREADS
        B_BASE = NBUF * A_BYTES  # B's ring follows A's
        # A thread's loader chunks are RSTEP storage rows apart: a multiple of the swizzle's
        # period (1024 bytes of a panel), so chunk i sits S_STEP bytes after chunk 0.
        A_RSTEP, B_RSTEP = THREADS // (A_ROW_BYTES // CHUNK), THREADS // (B_ROW_BYTES // CHUNK)
        A_S_STEP, B_S_STEP = A_RSTEP * min(A_ROW_BYTES, LINE), B_RSTEP * min(B_ROW_BYTES, LINE)
        for chunks, nbytes, rstep, s_step in ((A_CHUNKS, A_BYTES, A_RSTEP, A_S_STEP),
                                              (B_CHUNKS, B_BYTES, B_RSTEP, B_S_STEP)):
            if (chunks < 1 or chunks * CHUNK * THREADS != nbytes or rstep < 1
                    or (chunks > 1 and s_step % SWIZZLE_PERIOD)):
                raise ValueError(f"mma_pipeline: tile {tile} does not fit the loaders "
                                 f"({THREADS} threads, {nbytes} bytes of a stage)")
        # A k-step inside a K-major tile flips byte bits 5-6 (below the swizzled line bits);
        # in an M/N-major tile it moves 32/E whole rows, which the swizzle leaves in place
        # only if they span whole 1024-byte periods: rows of at least 64 bytes.
        KSTEP_ROWS = KSTEP_BYTES // E
        A_MN_KSTEP = KSTEP_ROWS * min(A_ROW_BYTES, LINE)
        B_MN_KSTEP = KSTEP_ROWS * min(B_ROW_BYTES, LINE)
        if ((not a_kmajor and A_MN_KSTEP % SWIZZLE_PERIOD)
                or (not b_kmajor and B_MN_KSTEP % SWIZZLE_PERIOD)):
            raise ValueError(f"mma_pipeline: tile {tile} is too narrow for an M/N-major "
                             f"{operand} operand: its tile rows (BM or BN elements) need at "
                             f"least {SWIZZLE_PERIOD // KSTEP_ROWS} bytes")
        CS = BN + 8  # row stride of the staged C tile
        RING_BYTES = NBUF * (A_BYTES + B_BYTES)
        STAGED_BYTES = BM * CS * 4
        PASSES = op.passes
        TF32 = operand.startswith("tf32")
        mma = op.mma
        ACC = op.accumulator
        B_SCALAR = E == 4 and not b_kmajor  # tf32 N-major B: 32-bit loads, no ldmatrix
        B_OFFSETS = 2 * NT if B_SCALAR else NP  # per-lane fragment offsets of B
        # Warp tiles of whole m16 rows (MT = 1 is a 16-row warp tile) and, for ldmatrix.x4
        # B loads, pairs of n8 tiles.
        if (BM % (16 * WARPS_M) or BN % (WARPS_N * (8 if B_SCALAR else 16))
                or (BK * E) % KSTEP_BYTES):
            raise ValueError(f"mma_pipeline: tile {tile} does not split into m16 x n16 warp "
                             f"tiles and {KSTEP_BYTES}-byte k-steps")
        ALO_SHAPE, BLO_SHAPE = ((MT, 4), (NT, 2)) if PASSES == 3 else ((1, 1), (1, 1))
        a_lane_rc = ldmatrix_x4_row_col if a_kmajor else ldmatrix_x4_b_row_col
        b_lane_rc = ldmatrix_x4_row_col if not b_kmajor else ldmatrix_x4_b_row_col
        a_ldmatrix = ldmatrix_x4 if a_kmajor else ldmatrix_x4_trans
        b_ldmatrix = ldmatrix_x4_trans if not b_kmajor else ldmatrix_x4
        BITS = 8 * E
        MASK = (1 << BITS) - 1
        PER_WORD = 4 // E

        @device_function
        def element_bits(src, bz, r, c, rows_lim, cols_lim):
            if r < rows_lim and c < cols_lim:
                return uint32(src[bz, r, c]) & uint32(MASK)
            return uint32(0)

        @device_function
        def load_chunk(src, bz, ld, gr, gc, rows_lim, cols_lim, vec_ok):
            """Elements ``src[bz, gr, gc:gc+EPC]`` as 4 packed uint32, zeros past the edge:
            one 128-bit load where the chunk is whole and aligned, else element loads."""
            if vec_ok != 0 and gr < rows_lim and gc + EPC <= cols_lim:
                return ld_global_nc_v4_u32(global_addr(src, (bz, 0, 0))
                                           + uint64((int64(gr) * ld + gc) * E))
            w = cuda.local.array(4, uint32)
            for q in range(4):
                w[q] = uint32(0)
            for j in range(EPC):
                w[j // PER_WORD] |= element_bits(src, bz, gr, gc + j, rows_lim,
                                                 cols_lim) << uint32((j % PER_WORD) * BITS)
            return (w[0], w[1], w[2], w[3])

        @device_function
        def cp_async_plan(src, bz, ld, mn0, k_begin, mn_lim, tid, KMAJOR, ROWS, ROW_BYTES):
            """This thread's first chunk of an operand tile: (global address at k-tile 0,
            byte offset in a stage, its k within the tile, its M/N coordinate, its bytes
            inside M/N (M/N-major; CHUNK for K-major)). Its other chunks lie RSTEP rows on."""
            cpr = ROW_BYTES // CHUNK
            r = tid // cpr
            c = (tid % cpr) * EPC
            base = global_addr(src, (bz, 0, 0))
            s0 = int32(tile_offset(r, c * E, ROWS, ROW_BYTES))
            if KMAJOR:
                g0 = base + uint64((int64(mn0 + r) * ld + k_begin + c) * E)
                return g0, s0, int32(c), int32(mn0 + r), int32(CHUNK)
            g0 = base + uint64((int64(k_begin + r) * ld + mn0 + c) * E)
            mn_bytes = int32(max(0, min(EPC, mn_lim - (mn0 + c))) * E)
            return g0, s0, int32(r), int32(mn0 + c), mn_bytes

        @device_function
        def cp_async_issue(s_addr, g, base, row_step_bytes, k_tile, kc, k_end, mn, mn_lim,
                           mn_bytes, KMAJOR, CHUNKS, RSTEP, S_STEP):
            """cp.async this thread's CHUNKS chunks of one tile: chunk i to ``s_addr +
            i·S_STEP`` from ``g + i·row_step_bytes``; chunks past K or M/N are zero-filled
            (a partial chunk at the K edge copies the bytes that exist)."""
            for i in range(CHUNKS):
                if KMAJOR:
                    k = k_tile + kc
                    ok = mn + i * RSTEP < mn_lim and k < k_end
                    nbytes = min(CHUNK, (k_end - k) * E)
                else:
                    k = k_tile + kc + i * RSTEP
                    ok = k < k_end and mn_bytes > 0
                    nbytes = mn_bytes
                # A zero-byte copy still needs a valid source address: the matrix's start.
                src = g + uint64(i) * row_step_bytes if ok else base
                cp_async_cg_16(s_addr + i * S_STEP, src, nbytes if ok else 0)

        @device_function
        def sync_load(src, bz, ld, row0, col0, rows_lim, cols_lim, vec_ok, tid, regs, CHUNKS,
                      ROW_BYTES):
            """The sync pipeline's global loads of one tile into registers ``regs``."""
            cpr = ROW_BYTES // CHUNK
            for i in range(CHUNKS):
                q = tid + i * THREADS
                v = load_chunk(src, bz, ld, row0 + q // cpr, col0 + (q % cpr) * EPC,
                               rows_lim, cols_lim, vec_ok)
                for e in range(4):
                    regs[i, e] = v[e]

        @device_function
        def sync_store(smem, stage_base, tid, regs, CHUNKS, ROWS, ROW_BYTES):
            cpr = ROW_BYTES // CHUNK
            for i in range(CHUNKS):
                q = tid + i * THREADS
                off = tile_offset(q // cpr, (q % cpr) * CHUNK, ROWS, ROW_BYTES)
                st_shared_v4_u32(shared_addr(smem, stage_base + off),
                                 (regs[i, 0], regs[i, 1], regs[i, 2], regs[i, 3]))

        @device_function
        def load_fragments(smem, words, a_stage, b_stage, a_off, b_off, ks, afrag, bfrag):
            """This warp's A and B fragments of k-step ``ks`` of the stages at byte offsets
            ``a_stage`` and ``b_stage`` (``a_off``/``b_off``: the lane's offsets at ks 0)."""
            for i in range(MT):
                off = a_off[i] ^ (KSTEP_BYTES * ks) if a_kmajor else a_off[i] + A_MN_KSTEP * ks
                fa = a_ldmatrix(shared_addr(smem, a_stage + off))
                for e in range(4):
                    afrag[i, e] = fa[e]
            if B_SCALAR:
                # tf32 from a [K][N] tile: b0 = B[t][g], b1 = B[t + 4][g] of each n8 tile;
                # b_off[j] holds the lane's row-t offset of tile j, b_off[NT + j] row t + 4;
                # ``words`` is the same shared memory as uint32.
                for j in range(NT):
                    bfrag[j, 0] = words[(b_stage + b_off[j] + B_MN_KSTEP * ks) >> 2]
                    bfrag[j, 1] = words[(b_stage + b_off[NT + j] + B_MN_KSTEP * ks) >> 2]
                return
            for p in range(NP):
                # One x4 gives the B fragments of two n8 tiles: (r0, r1) and (r2, r3).
                off = b_off[p] ^ (KSTEP_BYTES * ks) if b_kmajor else b_off[p] + B_MN_KSTEP * ks
                fb = b_ldmatrix(shared_addr(smem, b_stage + off))
                bfrag[2 * p, 0] = fb[0]
                bfrag[2 * p, 1] = fb[1]
                bfrag[2 * p + 1, 0] = fb[2]
                bfrag[2 * p + 1, 1] = fb[3]

        @device_function
        def prepare(afrag, bfrag, acur, bcur, alo, blo):
            """This k-step's operands from the loaded fragments: as they are (16-bit, s8),
            rounded to tf32, or split into tf32 hi (acur, bcur) and lo (alo, blo) parts."""
            for i in range(MT):
                for e in range(4):
                    if PASSES == 3:
                        acur[i, e], alo[i, e] = tf32_split(afrag[i, e])
                    elif TF32:
                        acur[i, e] = tf32_round(afrag[i, e])
                    else:
                        acur[i, e] = afrag[i, e]
            for j in range(NT):
                for e in range(2):
                    if PASSES == 3:
                        bcur[j, e], blo[j, e] = tf32_split(bfrag[j, e])
                    elif TF32:
                        bcur[j, e] = tf32_round(bfrag[j, e])
                    else:
                        bcur[j, e] = bfrag[j, e]

        @device_function
        def mma_step(acur, bcur, alo, blo, acc):
            """acc += A·B of one k-step for every (m16, n8) tile of the warp (tf32x3: the
            small cross terms first, then hi·hi)."""
            for i in range(MT):
                for j in range(NT):
                    a = (acur[i, 0], acur[i, 1], acur[i, 2], acur[i, 3])
                    b = (bcur[j, 0], bcur[j, 1])
                    c = (acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
                    if PASSES == 3:
                        c = mma((alo[i, 0], alo[i, 1], alo[i, 2], alo[i, 3]), b, c)
                        c = mma(a, (blo[j, 0], blo[j, 1]), c)
                    d = mma(a, b, c)
                    for e in range(4):
                        acc[i, j, e] = d[e]

        @device_function
        def mainloop(smem, a, b, bz, lda, ldb, m0, n0, k_begin, k_end, M, N, vec_ok, acc):
            words = cuda.shared.array(0, uint32)  # the dynamic shared memory, as words
            afrag = cuda.local.array((MT, 4), uint32)  # the next k-step's fragments
            bfrag = cuda.local.array((NT, 2), uint32)
            acur = cuda.local.array((MT, 4), uint32)  # this k-step's
            bcur = cuda.local.array((NT, 2), uint32)
            alo = cuda.local.array(ALO_SHAPE, uint32)  # tf32x3's lo parts
            blo = cuda.local.array(BLO_SHAPE, uint32)
            ra = cuda.local.array((A_CHUNKS, 4), uint32)  # sync: the next tile, in registers
            rb = cuda.local.array((B_CHUNKS, 4), uint32)
            tid = int32(cuda.threadIdx.x)
            lane, warp = tid % 32, tid // 32
            wm = (warp // WARPS_N) * WM
            wn = (warp % WARPS_N) * WN
            n_ktiles = (k_end - k_begin + BK - 1) // BK
            # This lane's fragment addresses (byte offsets in a stage) at ks = 0.
            a_off = cuda.local.array(MT, int32)
            b_off = cuda.local.array(B_OFFSETS, int32)
            a_r, a_c = a_lane_rc(lane)
            for i in range(MT):
                if a_kmajor:
                    a_off[i] = tile_offset(wm + 16 * i + a_r, a_c * 2, A_ROWS, A_ROW_BYTES)
                else:
                    a_off[i] = tile_offset(a_r, (wm + 16 * i + a_c) * 2, A_ROWS, A_ROW_BYTES)
            if B_SCALAR:
                g, t = lane // 4, lane % 4
                for j in range(NT):
                    b_off[j] = tile_offset(t, (wn + 8 * j + g) * 4, B_ROWS, B_ROW_BYTES)
                    b_off[NT + j] = tile_offset(t + 4, (wn + 8 * j + g) * 4, B_ROWS,
                                                B_ROW_BYTES)
            else:
                b_r, b_c = b_lane_rc(lane)
                for p in range(NP):
                    if b_kmajor:
                        b_off[p] = tile_offset(wn + 16 * p + b_r, b_c * 2, B_ROWS, B_ROW_BYTES)
                    else:
                        b_off[p] = tile_offset(b_r, (wn + 16 * p + b_c) * 2, B_ROWS,
                                               B_ROW_BYTES)

            # Storage coordinates of tile kt: (row0, col0) and the limits past which it is 0.
            a_row0 = m0 if a_kmajor else k_begin
            a_col0 = k_begin if a_kmajor else m0
            a_rows_lim = M if a_kmajor else k_end
            a_cols_lim = k_end if a_kmajor else M
            b_row0 = n0 if b_kmajor else k_begin
            b_col0 = k_begin if b_kmajor else n0
            b_rows_lim = N if b_kmajor else k_end
            b_cols_lim = k_end if b_kmajor else N
            a_step_r = 0 if a_kmajor else BK
            a_step_c = BK if a_kmajor else 0
            b_step_r = 0 if b_kmajor else BK
            b_step_c = BK if b_kmajor else 0

            if ASYNC:
                a_base = global_addr(a, (bz, 0, 0))
                b_base = global_addr(b, (bz, 0, 0))
                a_g0, a_s0, a_kc, a_mn, a_mnb = cp_async_plan(a, bz, lda, m0, k_begin, M, tid,
                                                              a_kmajor, A_ROWS, A_ROW_BYTES)
                b_g0, b_s0, b_kc, b_mn, b_mnb = cp_async_plan(b, bz, ldb, n0, k_begin, N, tid,
                                                              b_kmajor, B_ROWS, B_ROW_BYTES)
                a_kstep = uint64(BK * E) if a_kmajor else uint64(int64(BK) * lda * E)
                b_kstep = uint64(BK * E) if b_kmajor else uint64(int64(BK) * ldb * E)
                a_rstep = uint64(int64(A_RSTEP) * lda * E)
                b_rstep = uint64(int64(B_RSTEP) * ldb * E)
                a_sbase = shared_addr(smem, a_s0)
                b_sbase = shared_addr(smem, B_BASE + b_s0)
                # Prologue: STAGES-1 tiles in flight (one commit group each, empty past the
                # end, so wait_group's count stays exact); wait for tile 0.
                for s in range(STAGES - 1):
                    if s < n_ktiles:
                        cp_async_issue(a_sbase + s * A_BYTES, a_g0 + uint64(s) * a_kstep, a_base,
                                       a_rstep, k_begin + s * BK, a_kc, k_end, a_mn, M, a_mnb,
                                       a_kmajor, A_CHUNKS, A_RSTEP, A_S_STEP)
                        cp_async_issue(b_sbase + s * B_BYTES, b_g0 + uint64(s) * b_kstep, b_base,
                                       b_rstep, k_begin + s * BK, b_kc, k_end, b_mn, N, b_mnb,
                                       b_kmajor, B_CHUNKS, B_RSTEP, B_S_STEP)
                    cp_async_commit_group()
                cp_async_wait_group(PENDING)
            else:
                sync_load(a, bz, lda, a_row0, a_col0, a_rows_lim, a_cols_lim, vec_ok, tid, ra,
                          A_CHUNKS, A_ROW_BYTES)
                sync_load(b, bz, ldb, b_row0, b_col0, b_rows_lim, b_cols_lim, vec_ok, tid, rb,
                          B_CHUNKS, B_ROW_BYTES)
                sync_store(smem, 0, tid, ra, A_CHUNKS, A_ROWS, A_ROW_BYTES)
                sync_store(smem, B_BASE, tid, rb, B_CHUNKS, B_ROWS, B_ROW_BYTES)
            cuda.syncthreads()
            load_fragments(smem, words, int32(0), int32(B_BASE), a_off, b_off, int32(0), afrag, bfrag)

            # Fragments are double-buffered: each k-step ldmatrix-es the next step's fragments
            # (across the tile boundary too) before its own mmas issue, so the shared-memory
            # latency hides behind the warp's mmas.
            for kt in range(n_ktiles):
                stage = int32(kt % NBUF)
                if ASYNC:
                    # Every warp passed the barrier after its last read of tile kt-1 (at its
                    # last k-step it loaded tile kt's first fragments after that barrier):
                    # its stage is free for tile kt+STAGES-1.
                    nxt = kt + STAGES - 1
                    if nxt < n_ktiles:
                        ns = nxt % STAGES
                        cp_async_issue(a_sbase + ns * A_BYTES, a_g0 + uint64(nxt) * a_kstep,
                                       a_base, a_rstep, k_begin + nxt * BK, a_kc, k_end, a_mn, M,
                                       a_mnb, a_kmajor, A_CHUNKS, A_RSTEP, A_S_STEP)
                        cp_async_issue(b_sbase + ns * B_BYTES, b_g0 + uint64(nxt) * b_kstep,
                                       b_base, b_rstep, k_begin + nxt * BK, b_kc, k_end, b_mn, N,
                                       b_mnb, b_kmajor, B_CHUNKS, B_RSTEP, B_S_STEP)
                    cp_async_commit_group()
                elif kt + 1 < n_ktiles:
                    # The next tile's global loads are in flight while this one computes.
                    sync_load(a, bz, lda, a_row0 + (kt + 1) * a_step_r,
                              a_col0 + (kt + 1) * a_step_c, a_rows_lim, a_cols_lim, vec_ok, tid,
                              ra, A_CHUNKS, A_ROW_BYTES)
                    sync_load(b, bz, ldb, b_row0 + (kt + 1) * b_step_r,
                              b_col0 + (kt + 1) * b_step_c, b_rows_lim, b_cols_lim, vec_ok, tid,
                              rb, B_CHUNKS, B_ROW_BYTES)

                for ks in range(KSTEPS):
                    prepare(afrag, bfrag, acur, bcur, alo, blo)
                    next_stage, next_ks = stage, int32(ks + 1)
                    if ks == KSTEPS - 1:
                        next_stage, next_ks = int32((kt + 1) % NBUF), int32(0)
                        if ASYNC:
                            cp_async_wait_group(PENDING)  # tile kt+1 has landed
                        elif kt + 1 < n_ktiles:
                            # Its buffer was last read before the previous tile's barrier.
                            sync_store(smem, next_stage * A_BYTES, tid, ra, A_CHUNKS, A_ROWS,
                                       A_ROW_BYTES)
                            sync_store(smem, B_BASE + next_stage * B_BYTES, tid, rb, B_CHUNKS,
                                       B_ROWS, B_ROW_BYTES)
                        cuda.syncthreads()
                    # Past the last tile this reads a stale stage: in bounds, and never used.
                    load_fragments(smem, words, next_stage * A_BYTES, B_BASE + next_stage * B_BYTES,
                                   a_off, b_off, next_ks, afrag, bfrag)
                    mma_step(acur, bcur, alo, blo, acc)
            if ASYNC:
                cp_async_wait_group(0)

        @device_function
        def stage_accumulators(cs, acc):
            """The warp's accumulators into the BM×CS tile ``cs`` (rows padded by 8: each
            half-warp's 8-byte fragment stores hit 32 different banks). The caller
            synchronizes before (the ring is being reused) and after."""
            lane = int32(cuda.threadIdx.x) % 32
            warp = int32(cuda.threadIdx.x) // 32
            wm = (warp // WARPS_N) * WM
            wn = (warp % WARPS_N) * WN
            g, t = lane // 4, lane % 4
            for i in range(MT):
                for j in range(NT):
                    r = wm + 16 * i + g
                    c = wn + 8 * j + 2 * t
                    cs[r * CS + c] = acc[i, j, 0]
                    cs[r * CS + c + 1] = acc[i, j, 1]
                    cs[(r + 8) * CS + c] = acc[i, j, 2]
                    cs[(r + 8) * CS + c + 1] = acc[i, j, 3]

        self.operand = op
        self.tile = tile
        self.THREADS, self.MT, self.NT, self.CS = THREADS, MT, NT, CS
        self.RING_BYTES, self.SHARED_BYTES = RING_BYTES, max(RING_BYTES, STAGED_BYTES)
        self.mainloop = mainloop
        self.stage_accumulators = stage_accumulators
        self.accumulator = ACC


def mma_pipeline(operand: str, a_kmajor: bool, b_kmajor: bool, loads: str,
                 tile: Tile) -> MmaPipeline:
    """The pipeline parts for ``operand`` ("f16", "bf16", "tf32", "tf32x3", "s8"), the
    operands' layouts, ``loads`` ("async": cp.async ring; "sync": register-staged loads)
    and ``tile``."""
    return MmaPipeline(operand, a_kmajor, b_kmajor, loads, Tile(*tile))


__all__ = ["KSTEP_BYTES", "OPERANDS", "MmaPipeline", "Tile", "mma_pipeline", "tf32_round",
           "tf32_split", "tile_offset"]
