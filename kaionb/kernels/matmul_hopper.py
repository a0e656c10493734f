"""Hopper (sm_90a) matmul: TMA into a swizzled shared-memory ring, ``wgmma`` from it.

    C[m, n] = Σ_k A[m, k] · B[k, n]   f16 / bf16 inputs, f32 accumulation, any M, N, K

The H100's tensor cores reach their dense peak only through ``wgmma.mma_async`` (the
``mma.sync`` path of :mod:`.matmul` tops out near 600 TFLOP/s); this is the kernel the
matmul entries run on compute capability 9.0 when the operands allow it. Design as in
CUTLASS's sm90 warp-specialized GEMM (https://github.com/NVIDIA/cutlass, "cooperative"
schedule) and the PTX ISA's asynchronous warpgroup MMA chapter.

Block of 3 warpgroups (384 threads), one BM×BN tile of C (rasterized in groups of
GROUP_M tile rows so a wave's A and B panels stay in L2):

    producer   warpgroup 0; one thread issues, per K-step of BK, the TMA copies of the
               A and B tiles into stage ``kt % STAGES`` of the ring once consumers have
               released it (``empty`` mbarrier), signalling the ``full`` mbarrier with the
               byte count. TMA zero-fills what lies past the matrix: edge tiles and any K
               need no other code.
    consumers  warpgroups 1 and 2, rows 0-63 and 64-127 of the tile: wait ``full``, run
               BK/16 ``wgmma m64nBNk16`` on the stage (descriptors into the 128-byte
               swizzled tiles), commit, and release the *previous* stage once its group
               has retired (``wgmma.wait_group 1``), so one group is always in flight.
    epilogue   accumulators -> an f32 C tile in shared memory (the drained ring) -> 16-byte
               coalesced stores in the output dtype, bounds-checked (helpers.epilogue).

Layouts: A (M×K) is read K-major (row-major A) or M-major (``x.T``), B (K×N) N-major
(row-major B) or K-major (``y.T``): all four combinations run without copies, the
M/N-major tiles through wgmma's transpose bits. The tensor maps (:mod:`kaionb._tensor_map`)
are built on the host and passed by global address: numba cannot declare a
``__grid_constant__`` parameter. Requirements (else the mma.sync kernels run): 16-byte
aligned storage and row strides.
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32, uint8, uint64

from .._tensor_map import BOX_INNER, tensor_map_2d
from ..kernels.helpers import chunk_coords, store_row_chunk8
from ..ptx_patches import (
    accumulator_zeros,
    bar_sync_threads,
    cp_async_bulk_tensor_2d_global_to_shared,
    fence_proxy_async_shared,
    make_smem_desc,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait,
    prefetch_tensormap,
    shared_addr,
    st_shared_accumulator,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_m64n128k16_f32_bf16,
    wgmma_m64n128k16_f32_f16,
    wgmma_m64n256k16_f32_bf16,
    wgmma_m64n256k16_f32_f16,
    wgmma_wait_group,
)
from .launch import kernel

# Tile classes: (BM, BN, BK, STAGES). wide: 128×256, the two consumer warpgroups each
# 64×256 (m64n256k16, 128 f32 accumulators per thread), 4 stages of 48 KB; narrow:
# 128×128 (m64n128k16), 6 stages of 32 KB, for grids the wide tile leaves under one wave.
TILES = {
    "wide": (128, 256, 64, 4),
    "narrow": (128, 128, 64, 6),
}
CONSUMERS = 2  # consumer warpgroups
THREADS = 128 * (1 + CONSUMERS)
GROUP_M = 8  # tile rows a group of blocks walks before moving right (L2 reuse)
# Tile choice: wide from 0.9 blocks per SM (2048² has 128 wide tiles on 132 SMs), narrow
# from NARROW_MIN_BLOCKS_PER_SM; smaller grids run mma.sync with split-K.
WIDE_MIN_BLOCKS_PER_SM = 0.9
NARROW_MIN_BLOCKS_PER_SM = 0.45

LINE = 2 * BOX_INNER  # bytes of one swizzled row: 64 16-bit elements
ATOM = 8 * LINE  # the 128-byte swizzle's period: 8 rows, 1024 bytes

_WGMMA = {
    ("f16", 128): wgmma_m64n128k16_f32_f16,
    ("f16", 256): wgmma_m64n256k16_f32_f16,
    ("bf16", 128): wgmma_m64n128k16_f32_bf16,
    ("bf16", 256): wgmma_m64n256k16_f32_bf16,
}

_SIGNATURE = "void(uint64, uint64, float32[:, ::1], uint16[:, ::1], int32, int32, int32, int32, int32)"


def _make_kernel(dtype: str, a_kmajor: bool, b_kmajor: bool, tile: str):
    """One variant. Arguments: the device addresses of A's and B's tensor maps, the
    output as f32 (``kind`` OUT_F32) or uint16 bits (OUT_F16/OUT_BF16; the other is a
    dummy), M, N, K, kind, and ``out_vec`` (output rows 16-byte aligned)."""
    BM, BN, BK, STAGES = TILES[tile]
    if BK != BOX_INNER:
        raise ValueError(f"tile {tile}: BK must be {BOX_INNER} (one swizzled line, 4 k-steps)")
    A_BYTES, B_BYTES = BM * BK * 2, BN * BK * 2
    STAGE_BYTES = A_BYTES + B_BYTES
    BOX_BYTES = BK * LINE  # an M/N-major box: 64 M/N × BK rows of K
    # Descriptor strides (ptx_patches.make_smem_desc): K-major tiles step 32 bytes per k16
    # inside their 128-byte rows; M/N-major tiles step 16 rows, and their 64-wide blocks
    # (one TMA box each) lie BOX_BYTES apart.
    A_LBO, A_KSTEP = (16, 32) if a_kmajor else (BOX_BYTES, 16 * LINE)
    B_LBO, B_KSTEP = (16, 32) if b_kmajor else (BOX_BYTES, 16 * LINE)
    A_K1, B_K1 = A_KSTEP >> 4, B_KSTEP >> 4  # one k-step in descriptor units
    TRANS_A, TRANS_B = (0 if a_kmajor else 1), (0 if b_kmajor else 1)
    WG_A_OFFSET = 64 * LINE  # consumer 1's rows: 64 rows on (K-major) or box 1 (M-major)
    CS = BN + 8  # f32 row stride of the staged C tile (+8: conflict-free fragment stores)
    RING_BYTES = STAGES * STAGE_BYTES
    BARRIERS = max(RING_BYTES, BM * CS * 4)  # full[STAGES], empty[STAGES] after both
    SHARED_BYTES = ATOM + BARRIERS + 2 * STAGES * 8  # + alignment slack for the ring
    ACC = BN // 2  # f32 accumulators per consumer thread
    CONSUMER_THREADS = 128 * CONSUMERS
    CHUNKS = BM * BN // 8 // CONSUMER_THREADS  # 8-column output chunks per consumer thread
    mma = _WGMMA[(dtype, BN)]
    store_accumulator = st_shared_accumulator(BN, CS * 4)

    layout = ("n" if a_kmajor else "t") + ("t" if b_kmajor else "n")
    name = f"_matmul_wgmma_{dtype}_{layout}_{tile}_fwd_kernel"

    @kernel([_SIGNATURE], name=name, arch_specific=True, min_cc=(9, 0),
            max_dynamic_shared_bytes=SHARED_BYTES, launch_bounds=THREADS)
    def _matmul_wgmma_fwd_kernel(tmap_a, tmap_b, out32, out16, M, N, K, kind, out_vec):
        smem = cuda.shared.array(0, uint8)
        smem0 = int32(shared_addr(smem, 0))
        ring = (smem0 + ATOM - 1) // ATOM * ATOM  # swizzled tiles start on an atom
        full = ring + BARRIERS
        empty = full + 8 * STAGES
        tid = int32(cuda.threadIdx.x)
        lane = tid % 32
        # The warpgroup index, broadcast from lane 0: ptxas then knows every branch on it
        # is warp-uniform (it serializes wgmma behind branches it cannot prove uniform).
        warpgroup = cuda.shfl_sync(0xFFFFFFFF, tid // 128, 0)

        tiles_m = (M + BM - 1) // BM
        tiles_n = (N + BN - 1) // BN
        pid = int32(cuda.blockIdx.x)
        first_m = pid // (GROUP_M * tiles_n) * GROUP_M
        group_rows = min(tiles_m - first_m, GROUP_M)
        in_group = pid % (GROUP_M * tiles_n)
        m0 = (first_m + in_group % group_rows) * BM
        n0 = (in_group // group_rows) * BN
        n_ktiles = (K + BK - 1) // BK

        if tid == 0:
            for s in range(STAGES):
                mbarrier_init(full + 8 * s, 1)
                mbarrier_init(empty + 8 * s, 4 * CONSUMERS)  # lane 0 of each consumer warp
            fence_proxy_async_shared()
        cuda.syncthreads()

        if warpgroup == 0:  # producer: one thread issues every copy
            if tid == 0:
                prefetch_tensormap(tmap_a)
                prefetch_tensormap(tmap_b)
                for kt in range(n_ktiles):
                    s = kt % STAGES
                    if kt >= STAGES:  # wait for the consumers to release its last use
                        mbarrier_wait(empty + 8 * s, (kt // STAGES - 1) & 1)
                    bar = full + 8 * s
                    mbarrier_arrive_expect_tx(bar, STAGE_BYTES)
                    a_dst = ring + s * STAGE_BYTES
                    b_dst = a_dst + A_BYTES
                    k = kt * BK
                    if a_kmajor:
                        cp_async_bulk_tensor_2d_global_to_shared(a_dst, tmap_a, k, m0, bar)
                    else:
                        for i in range(BM // BOX_INNER):
                            cp_async_bulk_tensor_2d_global_to_shared(
                                a_dst + i * BOX_BYTES, tmap_a, m0 + i * BOX_INNER, k, bar)
                    if b_kmajor:
                        cp_async_bulk_tensor_2d_global_to_shared(b_dst, tmap_b, k, n0, bar)
                    else:
                        for i in range(BN // BOX_INNER):
                            cp_async_bulk_tensor_2d_global_to_shared(
                                b_dst + i * BOX_BYTES, tmap_b, n0 + i * BOX_INNER, k, bar)
            return

        consumer = warpgroup - 1
        acc = accumulator_zeros(ACC)
        a_desc = make_smem_desc(ring + consumer * WG_A_OFFSET, A_LBO, ATOM, 128)
        b_desc = make_smem_desc(ring + A_BYTES, B_LBO, ATOM, 128)
        for kt in range(n_ktiles):
            s = kt % STAGES
            mbarrier_wait(full + 8 * s, (kt // STAGES) & 1)
            a_stage = a_desc + uint64(s * (STAGE_BYTES >> 4))  # descriptors: 16-byte units
            b_stage = b_desc + uint64(s * (STAGE_BYTES >> 4))
            # The BK/16 = 4 k-steps written out: numba keeps a range loop rolled, and ptxas
            # then fences every wgmma of the loop.
            wgmma_fence()
            acc = mma(a_stage, b_stage, 1, TRANS_A, TRANS_B, acc)
            acc = mma(a_stage + A_K1, b_stage + B_K1, 1, TRANS_A, TRANS_B, acc)
            acc = mma(a_stage + 2 * A_K1, b_stage + 2 * B_K1, 1, TRANS_A, TRANS_B, acc)
            acc = mma(a_stage + 3 * A_K1, b_stage + 3 * B_K1, 1, TRANS_A, TRANS_B, acc)
            wgmma_commit_group()
            wgmma_wait_group(1)  # the previous K-step's group has read its stage
            if kt > 0 and lane == 0:
                mbarrier_arrive(empty + 8 * ((kt - 1) % STAGES))
        wgmma_wait_group(0)

        # Epilogue: both consumers are past the ring before it becomes the C tile.
        bar_sync_threads(1, CONSUMER_THREADS)
        row = consumer * 64 + 16 * (tid // 32 % 4) + lane // 4
        store_accumulator(ring + (row * CS + 2 * (lane % 4)) * 4, acc)
        bar_sync_threads(1, CONSUMER_THREADS)
        cs = cuda.shared.array(0, float32)
        c_tile = (ring - smem0) // 4
        ctid = tid - 128
        for q in range(CHUNKS):
            r, c = chunk_coords(ctid + q * CONSUMER_THREADS, BN)
            store_row_chunk8(out32, out16, kind, m0 + r, n0 + c, M, N, out_vec, cs,
                             c_tile + r * CS + c)

    _matmul_wgmma_fwd_kernel.block_tile = (BM, BN, BK)
    return _matmul_wgmma_fwd_kernel


# Every variant: dtype × layout (NN, NT, TN, TT) × tile class.
_KERNELS = {
    (dtype, a_k, b_k, tile): _make_kernel(dtype, a_k, b_k, tile)
    for dtype in ("f16", "bf16")
    for a_k in (True, False)
    for b_k in (False, True)
    for tile in TILES
}


def choose_tile(m: int, n: int, sms: int) -> str | None:
    """The tile class for an M×N output on ``sms`` SMs, or None where the grid would leave
    most SMs idle (mma.sync with split-K serves those shapes better)."""
    for tile, least in (("wide", WIDE_MIN_BLOCKS_PER_SM), ("narrow", NARROW_MIN_BLOCKS_PER_SM)):
        bm, bn = TILES[tile][:2]
        if math.ceil(m / bm) * math.ceil(n / bn) >= least * sms:
            return tile
    return None


def launch(dtype: str, tile: str, sa, lda: int, a_kmajor: bool, sb, ldb: int, b_kmajor: bool,
           out32, out16, m: int, n: int, k: int, kind: int, out_vec: bool) -> None:
    """Launch the variant for storage matrices ``sa`` (A: M×K K-major or K×M) and ``sb``
    (B: N×K K-major or K×N), both TMA-compatible (``_tensor_map.tma_compatible``)."""
    bm, bn, bk, _ = TILES[tile]
    kdef = _KERNELS[(dtype, a_kmajor, b_kmajor, tile)]
    tmap_a = tensor_map_2d(sa, lda, bm if a_kmajor else bk)
    tmap_b = tensor_map_2d(sb, ldb, bn if b_kmajor else bk)
    grid = math.ceil(m / bm) * math.ceil(n / bn)
    kdef[0]((grid,), (THREADS,), (tmap_a, tmap_b, out32, out16, m, n, k, kind, int(out_vec)),
            shared_mem=kdef.max_dynamic_shared_bytes)
