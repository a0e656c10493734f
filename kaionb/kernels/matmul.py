"""Tensor-core matmul on ``mma.sync``: C = A · B for f16 / bf16 inputs, f32 accumulation.

    C[m, n] = Σ_k A[m, k] · B[k, n],   A: M×K, B: K×N, any M, N, K ≥ 1

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-mma
(``mma.sync.m16n8k16``, ``ldmatrix``, ``cp.async``). Design follows CUTLASS's sm80 GEMM:
https://github.com/NVIDIA/cutlass/blob/main/media/docs/efficient_gemm.md

Each block computes a BM×BN tile of C; its warps each a WM×WN sub-tile as (WM/16)×(WN/8)
m16n8k16 mmas per 16 of K. Per K-step of BK:

    global -> shared    cp.async 16-byte chunks into a STAGES-deep ring (``async``), or
                        128-bit loads into registers and st.shared into two buffers (``sync``);
                        chunks past the matrix edge are zero-filled, so any M, N, K works
    shared -> registers ldmatrix.x4 (``.trans`` for operands stored M- or N-major)
    registers           mma.sync, f32 accumulators
    epilogue            f32 or packed f16/bf16 stores, bounds-checked; split-K partials go
                        to an f32 workspace summed in split order by a second kernel

Layouts without copies: an operand is read from its *storage* matrix, the row-major array
its memory is. A (M×K) is K-major (row-major A) or M-major (``x.T`` of a row-major K×M);
B (K×N) is N-major (row-major B) or K-major (``y.T`` of a row-major N×K). The shared tile
keeps the storage orientation, and ldmatrix's ``.trans`` turns it into the mma fragment.
Leading dimensions travel as int32 scalars. A·B with both operands transposed (TT) copies
B once; arrays with no unit stride are copied.

On compute capability 9.0 the public entries run the wgmma kernel of :mod:`.matmul_hopper`
instead wherever it can (16-byte aligned rows) and the output fills at least ~half the GPU
with 128×128 tiles; the kernels below serve every other GPU, shape and layout.

Shared tiles are swizzled (``helpers.tiles``: 16-byte chunk ^= line bits), tiles wider
than 64 elements are stored as 64-column panels so every ldmatrix phase (8 rows × 16 B)
and every 16-byte store hits 8 different bank groups.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, int64, uint16, uint32, uint64

from .._device import compute_capability, multiprocessor_count
from .._tensor_map import tma_compatible
from ..array import DeviceArray, bfloat16, empty
from ..kernels.helpers import (
    OUT_BF16,
    OUT_F16,
    OUT_F32,
    chunk_coords,
    ldmatrix_x4_b_row_col,
    ldmatrix_x4_row_col,
    store_row_chunk8,
    swizzled_index,
)
from ..ptx_patches import (
    cp_async_cg_16,
    cp_async_commit_group,
    cp_async_wait_group,
    cvt_rn_bf16x2_f32,
    cvt_rn_f16x2_f32,
    device_function,
    global_addr,
    ld_global_nc_v4_u32,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_m16n8k16_f32_bf16,
    mma_m16n8k16_f32_f16,
    shared_addr,
    st_global_v4_f32,
    st_global_v4_u32,
    st_shared_v4_u32,
)
from ..validation import (
    as_array,
    check_contiguous,
    check_dtype,
    check_ndim,
    check_out,
    check_same_device,
    fail,
)
from ..grad import record
from . import matmul_hopper
from .launch import kernel

# -- tuning constants ------------------------------------------------------------------------

# Tile classes: (BM, BN, BK, WARPS_M, WARPS_N, STAGES).
# large: 128×256×64 per block, 8 warps of 64×64 (32 mmas per 8 ldmatrix.x4 per k16: half the
#   shared-memory reads per mma of 64×32 warps), 4 cp.async stages of 48 KB; 255 registers,
#   one block per SM. With the fragment double buffer: 260 -> 310 TFLOP/s f16 at 4096³ on
#   the H100 (docs/perf-log-matmul.md #5). The sync pipeline keeps 128×128: its next tile in
#   registers (48) on top of a 64×64 warp tile's 192 spills (226 registers, 1 block/SM).
# small: 64×64, 4 warps of 32×32, for grids that large tiles leave under one wave and
#   for the split-K decode shapes.
TILES = {
    "large": (128, 256, 64, 2, 4, 4),
    "small": (64, 64, 32, 2, 2, 4),
}
SYNC_TILES = dict(TILES, large=(128, 128, 64, 2, 4, 3))
# The large tile pays once it (nearly) fills the GPU: below that, 64×64 tiles win.
LARGE_MIN_BLOCKS_PER_SM = 0.9
# Split-K: below this many blocks per SM the K loop is split (deterministic: partials to an
# f32 workspace, summed in split order); each split keeps at least MIN_SPLIT_K of K.
SPLIT_TARGET_BLOCKS_PER_SM = 2
MIN_SPLIT_K = 256
REDUCE_THREADS = 256
# Output kinds (helpers.epilogue): a runtime flag, one kernel serves every out dtype.
_OUT_KIND = {np.dtype(np.float32): OUT_F32, np.dtype(np.float16): OUT_F16, bfloat16: OUT_BF16}

# -- device helpers --------------------------------------------------------------------------


@device_function
def _tile_index(r, c, ROWS, COLS):
    """Element index of (r, c) in a swizzled ROWS×COLS shared tile; wider than 64 columns
    it is a row of 64-column panels (128-byte lines: the swizzle's conflict-free width)."""
    if COLS <= 64:
        return swizzled_index(r, c, COLS)
    return (c // 64) * (ROWS * 64) + swizzled_index(r, c % 64, 64)


@device_function
def _cp_async_plan(src, ld, mn0, k_begin, mn_lim, tid, KMAJOR, ROWS, COLS):
    """This thread's first 16-byte chunk of an operand tile, computed once per block:
    (global address at k-tile 0, element index in a stage, its k within the tile, its
    M/N coordinate, its bytes inside M/N (MN-major tiles; 16 for K-major)). The thread's
    other chunks lie RSTEP storage rows further each (see :func:`_cp_async_issue`)."""
    r, c = chunk_coords(tid, COLS)
    base = global_addr(src, (0, 0))
    s0 = int32(_tile_index(r, c, ROWS, COLS))
    if KMAJOR:
        g0 = base + uint64((int64(mn0 + r) * ld + k_begin + c) * 2)
        return g0, s0, int32(c), int32(mn0 + r), int32(16)
    g0 = base + uint64((int64(k_begin + r) * ld + mn0 + c) * 2)
    mn_bytes = int32(max(0, min(8, mn_lim - (mn0 + c))) * 2)
    return g0, s0, int32(r), int32(mn0 + c), mn_bytes


@device_function
def _cp_async_issue(s_addr, g, base, row_step_bytes, k_tile, kc, k_end, mn, mn_lim, mn_bytes,
                    KMAJOR, CHUNKS, RSTEP, S_STEP_BYTES):
    """cp.async this thread's CHUNKS chunks of one tile: chunk i at shared address
    ``s_addr + i·S_STEP_BYTES`` from global ``g + i·row_step_bytes``; chunks past K or M/N
    are zero-filled (partial chunks at the K edge copy the bytes that exist)."""
    for i in range(CHUNKS):
        if KMAJOR:
            k = k_tile + kc
            ok = mn + i * RSTEP < mn_lim and k < k_end
            nbytes = min(16, (k_end - k) * 2)
        else:
            k = k_tile + kc + i * RSTEP
            ok = k < k_end and mn_bytes > 0
            nbytes = mn_bytes
        # A zero-byte copy still needs a valid source address: the matrix's first element.
        src = g + uint64(i) * row_step_bytes if ok else base
        cp_async_cg_16(s_addr + i * S_STEP_BYTES, src, nbytes if ok else 0)


@device_function
def _element(src, r, c, rows_lim, cols_lim):
    if r < rows_lim and c < cols_lim:
        return uint32(src[r, c])
    return uint32(0)


@device_function
def _load_chunk(src, ld, gr, gc, rows_lim, cols_lim, vec_ok):
    """8 elements ``src[gr, gc:gc+8]`` as 4 packed uint32, zeros past the edge: one
    128-bit load where the chunk is whole and 16-byte aligned, else element loads."""
    if vec_ok != 0 and gr < rows_lim and gc + 8 <= cols_lim:
        return ld_global_nc_v4_u32(global_addr(src, (0, 0)) + uint64((int64(gr) * ld + gc) * 2))
    return (_element(src, gr, gc, rows_lim, cols_lim)
            | (_element(src, gr, gc + 1, rows_lim, cols_lim) << 16),
            _element(src, gr, gc + 2, rows_lim, cols_lim)
            | (_element(src, gr, gc + 3, rows_lim, cols_lim) << 16),
            _element(src, gr, gc + 4, rows_lim, cols_lim)
            | (_element(src, gr, gc + 5, rows_lim, cols_lim) << 16),
            _element(src, gr, gc + 6, rows_lim, cols_lim)
            | (_element(src, gr, gc + 7, rows_lim, cols_lim) << 16))


# -- kernels ---------------------------------------------------------------------------------

_SIGNATURE = ("void(uint16[:, :], uint16[:, :], float32[:, ::1], uint16[:, ::1], "
              "float32[:, :, ::1], int32, int32, int32, int32, int32, int32, int32, int32, "
              "int32)")


def _make_matmul_kernel(dtype: str, a_kmajor: bool, b_kmajor: bool, pipeline: str,
                        tile: str):
    """One kernel variant. Arguments (outputs after inputs, sizes last):

    a, b     storage matrices (uint16 bits): A as M×K (``a_kmajor``) or K×M; B as N×K
             (``b_kmajor``) or K×N; the unit stride on the last axis
    out32, out16   the output for kind OUT_F32, or OUT_F16/OUT_BF16 (the other is unused)
    ws       split-K workspace [splits, M, N] f32 (used when gridDim.z > 1)
    M, N, K, lda, ldb, k_chunk (K per split, a multiple of BK), kind
    vec_ok   the storage rows are 16-byte aligned: whole chunks load as 128 bits (sync)
    out_vec  the output rows (and the workspace's) are 16-byte aligned: 128-bit stores
    """
    BM, BN, BK, WARPS_M, WARPS_N, STAGES = (TILES if pipeline == "async" else SYNC_TILES)[tile]
    ASYNC = pipeline == "async"
    NBUF = STAGES if ASYNC else 2
    PENDING = STAGES - 2  # cp.async groups left in flight when a stage is consumed
    THREADS = 32 * WARPS_M * WARPS_N
    WM, WN = BM // WARPS_M, BN // WARPS_N
    MT, NT = WM // 16, WN // 8  # m16 and n8 mma tiles per warp
    NP = NT // 2  # ldmatrix.x4 loads of B per k16 (two n8 tiles each)
    KSTEPS = BK // 16
    A_ROWS, A_COLS = (BM, BK) if a_kmajor else (BK, BM)
    B_ROWS, B_COLS = (BN, BK) if b_kmajor else (BK, BN)
    A_ELEMS, B_ELEMS = BM * BK, BN * BK
    A_CHUNKS, B_CHUNKS = A_ELEMS // 8 // THREADS, B_ELEMS // 8 // THREADS
    B_BASE = NBUF * A_ELEMS  # B's ring follows A's in the dynamic shared array
    A_STAGE_BYTES, B_STAGE_BYTES = A_ELEMS * 2, B_ELEMS * 2
    # A thread's loader chunks are RSTEP storage rows apart: a multiple of the swizzle's
    # period (8 lines of 128 B), so each is chunk 0's shared address plus S_STEP bytes.
    A_RSTEP, B_RSTEP = THREADS // (A_COLS // 8), THREADS // (B_COLS // 8)
    A_S_STEP = A_RSTEP * min(A_COLS, 64) * 2
    B_S_STEP = B_RSTEP * min(B_COLS, 64) * 2
    CS = BN + 8  # row stride of the f32 C tile the epilogue stages in shared memory
    SHARED_BYTES = max(NBUF * (A_ELEMS + B_ELEMS) * 2, BM * CS * 4)
    mma = mma_m16n8k16_f32_f16 if dtype == "f16" else mma_m16n8k16_f32_bf16
    # ldmatrix lane pattern: row_col when the tile's rows are the fragment's rows (A
    # K-major, B N-major with .trans), b_row_col otherwise.
    a_lane_rc = ldmatrix_x4_row_col if a_kmajor else ldmatrix_x4_b_row_col
    b_lane_rc = ldmatrix_x4_row_col if not b_kmajor else ldmatrix_x4_b_row_col
    a_ldmatrix = ldmatrix_x4 if a_kmajor else ldmatrix_x4_trans
    b_ldmatrix = ldmatrix_x4_trans if not b_kmajor else ldmatrix_x4

    @device_function
    def load_fragments(smem, a_stage, b_stage, a_idx, b_idx, ks, afrag, bfrag):
        """ldmatrix this warp's A and B fragments of k16 step ``ks`` of the stages at element
        offsets ``a_stage`` and ``b_stage``. Step ks of a K-major tile flips bit 4 of the
        swizzled column (16 elements, below the line bits the swizzle XORs in); of an
        M/N-major tile it moves 16 rows = whole 128-byte lines, which the swizzle leaves."""
        for i in range(MT):
            idx = a_idx[i] ^ (16 * ks) if a_kmajor else a_idx[i] + 16 * 64 * ks
            fa = a_ldmatrix(shared_addr(smem, a_stage + idx))
            for e in range(4):
                afrag[i, e] = fa[e]
        for p in range(NP):
            # One x4 gives the B fragments of two n8 tiles: (r0, r1) and (r2, r3).
            idx = b_idx[p] ^ (16 * ks) if b_kmajor else b_idx[p] + 16 * 64 * ks
            fb = b_ldmatrix(shared_addr(smem, b_stage + idx))
            bfrag[2 * p, 0] = fb[0]
            bfrag[2 * p, 1] = fb[1]
            bfrag[2 * p + 1, 0] = fb[2]
            bfrag[2 * p + 1, 1] = fb[3]

    layout = ("n" if a_kmajor else "t") + ("t" if b_kmajor else "n")
    name = f"_matmul_tc_{dtype}_{layout}_{pipeline}_{tile}_fwd_kernel"

    @kernel([_SIGNATURE], name=name, max_dynamic_shared_bytes=SHARED_BYTES,
            launch_bounds=THREADS)
    def _matmul_fwd_kernel(a, b, out32, out16, ws, M, N, K, lda, ldb, k_chunk, kind, vec_ok,
                           out_vec):
        smem = cuda.shared.array(0, uint16)
        acc = cuda.local.array((MT, NT, 4), float32)  # [m16 tile][n8 tile][C fragment]
        afrag = cuda.local.array((MT, 4), uint32)  # the next k16 step's fragments
        bfrag = cuda.local.array((NT, 2), uint32)
        acur = cuda.local.array((MT, 4), uint32)  # this step's
        bcur = cuda.local.array((NT, 2), uint32)
        ra = cuda.local.array((A_CHUNKS, 4), uint32)  # sync: the next tile, in registers
        rb = cuda.local.array((B_CHUNKS, 4), uint32)
        for i in range(MT):
            for j in range(NT):
                for e in range(4):
                    acc[i, j, e] = float32(0.0)

        tid = int32(cuda.threadIdx.x)
        lane, warp = tid % 32, tid // 32
        wm = (warp // WARPS_N) * WM
        wn = (warp % WARPS_N) * WN
        m0 = int32(cuda.blockIdx.y) * BM
        n0 = int32(cuda.blockIdx.x) * BN
        split = int32(cuda.blockIdx.z)
        k_begin = split * k_chunk
        k_end = min(K, k_begin + k_chunk)
        n_ktiles = (k_end - k_begin + BK - 1) // BK
        # This lane's ldmatrix addresses (element offsets in a stage) at ks = 0.
        a_idx = cuda.local.array(MT, int32)
        b_idx = cuda.local.array(NP, int32)
        a_r, a_c = a_lane_rc(lane)
        b_r, b_c = b_lane_rc(lane)
        for i in range(MT):
            if a_kmajor:
                a_idx[i] = _tile_index(wm + 16 * i + a_r, a_c, A_ROWS, A_COLS)
            else:
                a_idx[i] = _tile_index(a_r, wm + 16 * i + a_c, A_ROWS, A_COLS)
        for p in range(NP):
            if b_kmajor:
                b_idx[p] = _tile_index(wn + 16 * p + b_r, b_c, B_ROWS, B_COLS)
            else:
                b_idx[p] = _tile_index(b_r, wn + 16 * p + b_c, B_ROWS, B_COLS)

        # Storage coordinates of tile kt: (row0, col0) and the limits past which it is zero.
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
            a_base = global_addr(a, (0, 0))
            b_base = global_addr(b, (0, 0))
            a_g0, a_s0, a_kc, a_mn, a_mnb = _cp_async_plan(a, lda, m0, k_begin, M, tid,
                                                           a_kmajor, A_ROWS, A_COLS)
            b_g0, b_s0, b_kc, b_mn, b_mnb = _cp_async_plan(b, ldb, n0, k_begin, N, tid,
                                                           b_kmajor, B_ROWS, B_COLS)
            a_kstep = uint64(BK * 2) if a_kmajor else uint64(int64(BK) * lda * 2)
            b_kstep = uint64(BK * 2) if b_kmajor else uint64(int64(BK) * ldb * 2)
            a_rstep = uint64(int64(A_RSTEP) * lda * 2)
            b_rstep = uint64(int64(B_RSTEP) * ldb * 2)
            a_sbase = shared_addr(smem, a_s0)
            b_sbase = shared_addr(smem, B_BASE + b_s0)
            # Prologue: STAGES-1 tiles in flight (one commit group each, empty past the end,
            # so wait_group's count stays exact); wait for tile 0.
            for s in range(STAGES - 1):
                if s < n_ktiles:
                    _cp_async_issue(a_sbase + s * A_STAGE_BYTES, a_g0 + uint64(s) * a_kstep,
                                    a_base, a_rstep, k_begin + s * BK, a_kc, k_end, a_mn, M,
                                    a_mnb, a_kmajor, A_CHUNKS, A_RSTEP, A_S_STEP)
                    _cp_async_issue(b_sbase + s * B_STAGE_BYTES, b_g0 + uint64(s) * b_kstep,
                                    b_base, b_rstep, k_begin + s * BK, b_kc, k_end, b_mn, N,
                                    b_mnb, b_kmajor, B_CHUNKS, B_RSTEP, B_S_STEP)
                cp_async_commit_group()
            cp_async_wait_group(PENDING)
        else:
            for i in range(A_CHUNKS):
                r, c = chunk_coords(tid + i * THREADS, A_COLS)
                v = _load_chunk(a, lda, a_row0 + r, a_col0 + c, a_rows_lim,
                                a_cols_lim, vec_ok)
                st_shared_v4_u32(shared_addr(smem, _tile_index(r, c, A_ROWS, A_COLS)), v)
            for i in range(B_CHUNKS):
                r, c = chunk_coords(tid + i * THREADS, B_COLS)
                v = _load_chunk(b, ldb, b_row0 + r, b_col0 + c, b_rows_lim,
                                b_cols_lim, vec_ok)
                st_shared_v4_u32(shared_addr(smem, B_BASE + _tile_index(r, c, B_ROWS, B_COLS)),
                                 v)
        cuda.syncthreads()
        load_fragments(smem, int32(0), int32(B_BASE), a_idx, b_idx, int32(0), afrag, bfrag)

        # Fragments are double-buffered: each k16 step ldmatrix-es the next step's fragments
        # (across the tile boundary too) before its own mmas issue, so the shared-memory
        # latency hides behind 32 mmas of the same warp.
        for kt in range(n_ktiles):
            stage = int32(kt % NBUF)
            if ASYNC:
                # Every warp passed the barrier that followed its last read of tile kt-1 (at
                # its last k16 step it loaded tile kt's first fragments after that barrier):
                # its stage is free for tile kt+STAGES-1.
                nxt = kt + STAGES - 1
                if nxt < n_ktiles:
                    ns = nxt % STAGES
                    _cp_async_issue(a_sbase + ns * A_STAGE_BYTES, a_g0 + uint64(nxt) * a_kstep,
                                    a_base, a_rstep, k_begin + nxt * BK, a_kc, k_end, a_mn, M,
                                    a_mnb, a_kmajor, A_CHUNKS, A_RSTEP, A_S_STEP)
                    _cp_async_issue(b_sbase + ns * B_STAGE_BYTES, b_g0 + uint64(nxt) * b_kstep,
                                    b_base, b_rstep, k_begin + nxt * BK, b_kc, k_end, b_mn, N,
                                    b_mnb, b_kmajor, B_CHUNKS, B_RSTEP, B_S_STEP)
                cp_async_commit_group()
            elif kt + 1 < n_ktiles:
                # Next tile's global loads are in flight while this one computes.
                for i in range(A_CHUNKS):
                    r, c = chunk_coords(tid + i * THREADS, A_COLS)
                    v = _load_chunk(a, lda, a_row0 + (kt + 1) * a_step_r + r,
                                    a_col0 + (kt + 1) * a_step_c + c, a_rows_lim,
                                    a_cols_lim, vec_ok)
                    for e in range(4):
                        ra[i, e] = v[e]
                for i in range(B_CHUNKS):
                    r, c = chunk_coords(tid + i * THREADS, B_COLS)
                    v = _load_chunk(b, ldb, b_row0 + (kt + 1) * b_step_r + r,
                                    b_col0 + (kt + 1) * b_step_c + c, b_rows_lim,
                                    b_cols_lim, vec_ok)
                    for e in range(4):
                        rb[i, e] = v[e]

            for ks in range(KSTEPS):
                for i in range(MT):
                    for e in range(4):
                        acur[i, e] = afrag[i, e]
                for j in range(NT):
                    for e in range(2):
                        bcur[j, e] = bfrag[j, e]
                next_stage, next_ks = stage, int32(ks + 1)
                if ks == KSTEPS - 1:
                    next_stage, next_ks = int32((kt + 1) % NBUF), int32(0)
                    if ASYNC:
                        cp_async_wait_group(PENDING)  # tile kt+1 has landed
                    elif kt + 1 < n_ktiles:
                        # Its buffer was last read before the previous tile's barrier.
                        for i in range(A_CHUNKS):
                            r, c = chunk_coords(tid + i * THREADS, A_COLS)
                            st_shared_v4_u32(
                                shared_addr(smem, next_stage * A_ELEMS
                                            + _tile_index(r, c, A_ROWS, A_COLS)),
                                (ra[i, 0], ra[i, 1], ra[i, 2], ra[i, 3]))
                        for i in range(B_CHUNKS):
                            r, c = chunk_coords(tid + i * THREADS, B_COLS)
                            st_shared_v4_u32(
                                shared_addr(smem, B_BASE + next_stage * B_ELEMS
                                            + _tile_index(r, c, B_ROWS, B_COLS)),
                                (rb[i, 0], rb[i, 1], rb[i, 2], rb[i, 3]))
                    cuda.syncthreads()
                # Past the last tile this reads a stale stage: in bounds, and never used.
                load_fragments(smem, next_stage * A_ELEMS, B_BASE + next_stage * B_ELEMS,
                               a_idx, b_idx, next_ks, afrag, bfrag)
                for i in range(MT):
                    for j in range(NT):
                        d = mma((acur[i, 0], acur[i, 1], acur[i, 2], acur[i, 3]),
                                (bcur[j, 0], bcur[j, 1]),
                                (acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3]))
                        for e in range(4):
                            acc[i, j, e] = d[e]

        # Epilogue through shared memory: fragments -> an f32 C tile (rows padded by 8 so
        # each half-warp's 8-byte fragment stores hit 32 different banks), then each thread
        # writes whole 8-column chunks: coalesced 16-byte global stores.
        if ASYNC:
            cp_async_wait_group(0)
        cuda.syncthreads()
        cs = cuda.shared.array(0, float32)
        g, t = lane // 4, lane % 4
        for i in range(MT):
            for j in range(NT):
                r = wm + 16 * i + g
                c = wn + 8 * j + 2 * t
                cs[r * CS + c] = acc[i, j, 0]
                cs[r * CS + c + 1] = acc[i, j, 1]
                cs[(r + 8) * CS + c] = acc[i, j, 2]
                cs[(r + 8) * CS + c + 1] = acc[i, j, 3]
        cuda.syncthreads()
        split_k = int32(cuda.gridDim.z) > 1
        dst32 = ws[split] if split_k else out32
        out_kind = OUT_F32 if split_k else kind
        for q in range(BM * BN // 8 // THREADS):
            r, c = chunk_coords(tid + q * THREADS, BN)
            store_row_chunk8(dst32, out16, out_kind, m0 + r, n0 + c, M, N, out_vec, cs, r * CS + c)

    _matmul_fwd_kernel.threads = THREADS
    _matmul_fwd_kernel.shared_bytes = SHARED_BYTES
    _matmul_fwd_kernel.block_tile = (BM, BN, BK)
    return _matmul_fwd_kernel


@kernel(["void(float32[:, :, ::1], float32[:, ::1], uint16[:, ::1], int32)"],
        name="_matmul_splitk_reduce_kernel")
def _matmul_splitk_reduce_kernel(ws, out32, out16, kind):
    """out = Σ_s ws[s] in split order (deterministic), in the output's dtype. Each thread
    writes one pair of columns (one packed 32-bit store for 16-bit outputs)."""
    splits, m, n = ws.shape
    half_n = (n + 1) // 2
    i = int32(cuda.grid(1))
    if i >= m * half_n:
        return
    r = i // half_n
    c = (i % half_n) * 2
    lo = float32(0.0)
    hi = float32(0.0)
    for s in range(splits):
        lo += ws[s, r, c]
        if c + 1 < n:
            hi += ws[s, r, c + 1]
    if kind == OUT_F32:
        out32[r, c] = lo
        if c + 1 < n:
            out32[r, c + 1] = hi
    else:
        packed = cvt_rn_f16x2_f32(lo, hi) if kind == OUT_F16 else cvt_rn_bf16x2_f32(lo, hi)
        out16[r, c] = uint16(packed & 0xFFFF)
        if c + 1 < n:
            out16[r, c + 1] = uint16(packed >> 16)


# Every variant: dtype × layout (NN, NT, TN) × pipeline × tile class.
_LAYOUTS = ((True, False), (True, True), (False, False))
_KERNELS = {
    (dtype, a_k, b_k, pipeline, tile): _make_matmul_kernel(dtype, a_k, b_k, pipeline, tile)
    for dtype in ("f16", "bf16")
    for a_k, b_k in _LAYOUTS
    for pipeline in ("sync", "async")
    for tile in TILES
}

# -- host entries ----------------------------------------------------------------------------

_F32, _U16 = np.dtype(np.float32), np.dtype(np.uint16)


_DTYPE_KEY = {np.dtype(np.float16): "f16", bfloat16: "bf16"}


def _storage(op: str, name: str, x: DeviceArray, k_axis: int):
    """(storage view, ld, k_major) for operand ``x`` without copying when one axis has unit
    stride. The storage is row-major with rows of ``ld`` elements: ``x`` itself when its
    last axis is contiguous, ``x.T`` when its first is. Copies only when neither is."""
    rows, cols = x.shape
    isz = x.itemsize
    if cols == 1 or x.strides[1] == isz:
        ld = x.strides[0] // isz if rows > 1 else cols
        if rows > 1 and x.strides[0] % isz:
            fail(ValueError, op, name, "strides in whole elements", x.strides)
        strides = (max(ld, 1) * isz, isz)
        storage = x if x.strides == strides else x._view((rows, cols), strides)
        kmajor = k_axis == 1
    elif rows == 1 or x.strides[0] == isz:
        ld = x.strides[1] // isz
        storage, kmajor = x._view((cols, rows), (ld * isz, isz)), k_axis == 0
    else:
        return _storage(op, name, x.copy(), k_axis)
    ld = max(ld, 1)
    if storage.shape[0] == 1:
        ld = -(-storage.shape[1] // 8) * 8  # one row: ld is never used to step, align it
    return storage, ld, kmajor


def _aligned(storage: DeviceArray, ld: int) -> bool:
    """16-byte rows: cp.async / 128-bit loads may move whole chunks."""
    return storage.ptr % 16 == 0 and ld % 8 == 0


def _choose(m: int, n: int, k: int, sms: int, pipeline: str = "async") -> tuple[str, int, int]:
    """(tile class, splits, k per split) for an M×N×K problem on a GPU with ``sms`` SMs."""
    tiles_of = TILES if pipeline == "async" else SYNC_TILES
    bm, bn, bk = tiles_of["large"][:3]
    if math.ceil(m / bm) * math.ceil(n / bn) >= LARGE_MIN_BLOCKS_PER_SM * sms:
        return "large", 1, k
    bm, bn, bk = tiles_of["small"][:3]
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    splits = max(1, min(math.ceil(SPLIT_TARGET_BLOCKS_PER_SM * sms / tiles), k // MIN_SPLIT_K))
    k_chunk = math.ceil(math.ceil(k / splits) / bk) * bk
    return "small", math.ceil(k / k_chunk), k_chunk


# Hopper launch plans of the public entries, keyed by both operands' (address, shape,
# strides, dtype, device) and the input dtype: a repeated call skips validation, the
# layout analysis and the tile choice (the key pins all of them) and costs an allocation
# and a launch. Plans hold scalars and tensor maps, never the operands themselves.
_HOPPER_PLANS: dict[tuple, "matmul_hopper.LaunchPlan"] = {}
HOPPER_PLAN_CACHE = 256


def _output(op: str, out, out_dtype, shape: tuple, a: DeviceArray) -> DeviceArray:
    """The output: ``out`` checked (shape, dtype, ``a``'s device, contiguous), or a new
    array of ``out_dtype`` (default: ``out``'s dtype, else float32)."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None
                         else (out.dtype if out is not None else np.float32))
    if out_dtype not in _OUT_KIND:
        fail(TypeError, op, "out_dtype", "float32, float16 or bfloat16", out_dtype)
    if out is None:
        return empty(shape, out_dtype)
    out = check_out(op, out, shape, out_dtype)
    check_same_device(op, a=a, out=out)
    check_contiguous(op, "out", out)
    return out


def matmul_fwd(op: str, a, b, *, dtype, pipeline: str, out=None, out_dtype=None,
               tile: str | None = None, splits: int | None = None,
               prefer_wgmma: bool = False) -> DeviceArray:
    """Validate and launch: ``a @ b`` for ``dtype`` (float16 or bfloat16) inputs.

    ``pipeline``: "sync" or "async" (mma.sync; "async" falls back to "sync" where a storage
    row is not 16-byte aligned: cp.async moves whole 16-byte chunks), or "wgmma" (the
    Hopper kernel of :mod:`.matmul_hopper`; ValueError where the GPU or the operands
    cannot run it). ``prefer_wgmma``: run the Hopper kernel instead of ``pipeline``
    wherever it can and the shape fills the GPU (the public entries). ``tile``/``splits``
    override the shape-class choice (tests and benchmarks).
    """
    if prefer_wgmma and tile is None and splits is None and type(a) is type(b) is DeviceArray:
        key = (a.ptr, a.shape, a.strides, a.dtype, a.device, b.ptr, b.shape, b.strides,
               b.dtype, b.device, dtype)
        plan = _HOPPER_PLANS.get(key)
        if plan is not None:
            result = _output(op, out, out_dtype, (plan.m, plan.n), a)
            if result.ptr % 16 == 0:  # else the long way: mma.sync takes any output
                matmul_hopper.run(plan, result, _OUT_KIND[result.dtype])
                return result
    else:
        key = None
    a = as_array(op, "a", a, dtypes=(dtype,))
    b = as_array(op, "b", b, dtypes=(dtype,))
    check_ndim(op, "a", a, 2)
    check_ndim(op, "b", b, 2)
    check_same_device(op, a=a, b=b)
    (m, k), (kb, n) = a.shape, b.shape
    if kb != k:
        fail(ValueError, op, "b", f"{k} rows (a is {a.shape}: inner dimensions must match)",
              f"shape {b.shape}")
    out = _output(op, out, out_dtype, (m, n), a)
    if out.size == 0:
        return out
    if k == 0:
        return out.fill(0)

    sa, lda, a_kmajor = _storage(op, "a", a, k_axis=1)
    sb, ldb, b_kmajor = _storage(op, "b", b, k_axis=0)
    if max(lda * sa.shape[0], ldb * sb.shape[0]) >= 2**31:
        fail(ValueError, op, "a", "matrices of fewer than 2**31 elements", (a.shape, b.shape))
    kind = _OUT_KIND[out.dtype]
    out_vec = out.ptr % 16 == 0 and n % 8 == 0
    dtype_key = _DTYPE_KEY[np.dtype(dtype)]

    hopper_ok = (compute_capability() == (9, 0) and tma_compatible(sa, lda)
                 and tma_compatible(sb, ldb) and out_vec)
    if pipeline == "wgmma":
        if not hopper_ok:
            fail(ValueError, op, "a, b", "a compute capability 9.0 GPU and 16-byte aligned "
                 "operand and output rows for the wgmma kernel",
                 f"cc {compute_capability()}, row strides {lda}, {ldb}, {n} elements")
        hopper_tile = tile or matmul_hopper.choose_tile(m, n, multiprocessor_count()) or "narrow"
    else:
        hopper_tile = (matmul_hopper.choose_tile(m, n, multiprocessor_count())
                       if prefer_wgmma and hopper_ok and tile is None and splits is None
                       else None)
    if hopper_tile is not None:
        plan = matmul_hopper.launch(dtype_key, hopper_tile, sa, lda, a_kmajor, sb, ldb,
                                    b_kmajor, out, m, n, k, kind)
        # Only plans over the operands' own memory: a copied operand dies with this call.
        if key is not None and sa.ptr == a.ptr and sb.ptr == b.ptr:
            if len(_HOPPER_PLANS) >= HOPPER_PLAN_CACHE:
                _HOPPER_PLANS.pop(next(iter(_HOPPER_PLANS)))  # the oldest
            _HOPPER_PLANS[key] = plan
        return out

    out32 = out if kind == OUT_F32 else out._view((0, 0), (4, 4), dtype=_F32)
    out16 = (out._view(out.shape, out.strides, dtype=_U16) if kind != OUT_F32
             else out._view((0, 0), (2, 2), dtype=_U16))

    if not a_kmajor and b_kmajor:  # TT: make B N-major (one copy of B)
        sb, ldb, b_kmajor = _storage(op, "b", b.copy(), k_axis=0)
    vec_ok = _aligned(sa, lda) and _aligned(sb, ldb)
    if pipeline == "async" and not vec_ok:
        pipeline = "sync"
    chosen_tile, n_splits, k_chunk = _choose(m, n, k, multiprocessor_count(), pipeline)
    tile = tile or chosen_tile
    if splits is not None:
        bk = (TILES if pipeline == "async" else SYNC_TILES)[tile][2]
        k_chunk = math.ceil(math.ceil(k / splits) / bk) * bk
        n_splits = math.ceil(k / k_chunk)
    elif tile != chosen_tile:
        n_splits, k_chunk = 1, k
    kdef = _KERNELS[(dtype_key, a_kmajor, b_kmajor, pipeline, tile)]
    bm, bn, _ = kdef.block_tile
    ws = (empty((n_splits, m, n), np.float32) if n_splits > 1
          else out._view((0, 0, 0), (4, 4, 4), dtype=_F32))
    grid = (math.ceil(n / bn), math.ceil(m / bm), n_splits)
    kdef[0](grid, (kdef.threads,),
            (sa, sb, out32, out16, ws, m, n, k, lda, ldb, k_chunk, kind, int(vec_ok),
             int(out_vec)),
            shared_mem=kdef.shared_bytes)
    if n_splits > 1:
        pairs = m * ((n + 1) // 2)
        _matmul_splitk_reduce_kernel[0]((math.ceil(pairs / REDUCE_THREADS),),
                                        (REDUCE_THREADS,), (ws, out32, out16, kind))
    return out


def matmul_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 NumPy reference: the inputs as given (already f16/bf16-rounded), upcast."""
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


# -- public functions ------------------------------------------------------------------------


def matmul_tc(a, b, *, out=None, out_dtype=None) -> DeviceArray:
    """``a @ b`` for float16 a (M×K) and b (K×N) on tensor cores, f32 accumulation: the
    mma.sync kernel with synchronous loads, or on compute capability 9.0 the wgmma kernel
    (:mod:`.matmul_hopper`) where the operand rows are 16-byte aligned and the output
    fills the GPU. Any M, N, K; ``a.T`` / ``b.T`` views without copies.
    ``out_dtype``: float32 (default), float16 or bfloat16."""
    return matmul_fwd("matmul_tc", a, b, dtype=np.float16, pipeline="sync", out=out,
                      out_dtype=out_dtype, prefer_wgmma=True)


def matmul_tc_bf16(a, b, *, out=None, out_dtype=None) -> DeviceArray:
    """As :func:`matmul_tc` for bfloat16 inputs."""
    return matmul_fwd("matmul_tc_bf16", a, b, dtype=bfloat16, pipeline="sync", out=out,
                      out_dtype=out_dtype, prefer_wgmma=True)


def matmul_tc_async(a, b, *, out=None, out_dtype=None) -> DeviceArray:
    """As :func:`matmul_tc` with the 4-stage cp.async pipeline on the mma.sync path
    (16-byte-aligned rows; other inputs run the synchronous kernel)."""
    return matmul_fwd("matmul_tc_async", a, b, dtype=np.float16, pipeline="async", out=out,
                      out_dtype=out_dtype, prefer_wgmma=True)


def matmul_tc_bf16_async(a, b, *, out=None, out_dtype=None) -> DeviceArray:
    """As :func:`matmul_tc_async` for bfloat16 inputs."""
    return matmul_fwd("matmul_tc_bf16_async", a, b, dtype=bfloat16, pipeline="async",
                      out=out, out_dtype=out_dtype, prefer_wgmma=True)


def matmul(a, b, *, out=None, out_dtype=None) -> DeviceArray:
    """``a @ b``: float16 / bfloat16 inputs run the fastest tensor-core kernel for the shape
    (cp.async pipeline, tile class and split-K chosen per shape). Other dtypes raise
    TypeError: convert with ``.astype(kaionb.bfloat16)`` (or float16) first.

    Recorded on the active ``kaionb.grad.Tape`` when an input requires a gradient."""
    a = as_array("matmul", "a", a)
    b = as_array("matmul", "b", b)
    result = _matmul_dispatch(a, b, out=out, out_dtype=out_dtype)
    record(lambda g: _matmul_backward(a, b, g), (a, b), (result,))
    return result


def _matmul_dispatch(a, b, *, out=None, out_dtype=None) -> DeviceArray:
    check_dtype("matmul", "a", a, (np.float16, bfloat16))
    if a.dtype == np.float16:
        return matmul_tc_async(a, b, out=out, out_dtype=out_dtype)
    return matmul_tc_bf16_async(a, b, out=out, out_dtype=out_dtype)


def _matmul_backward(a, b, grad):
    """For C = A @ B: dA = dC @ Bᵀ, dB = Aᵀ @ dC — transposed views, no copies. dC is
    rounded to the inputs' dtype for the tensor cores; accumulation and results are f32."""
    grad = grad.astype(a.dtype)
    grad_a = _matmul_dispatch(grad, b.T) if a.requires_grad else None
    grad_b = _matmul_dispatch(a.T, grad) if b.requires_grad else None
    return grad_a, grad_b
