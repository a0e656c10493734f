"""Hopper (sm_90a) matmul: TMA into a swizzled shared-memory ring, ``wgmma`` from it.

    C[m, n] = Σ_k A[m, k] · B[k, n]   f16 / bf16 inputs, f32 accumulation, any M, N, K

The H100's tensor cores reach their dense peak only through ``wgmma.mma_async`` (the
``mma.sync`` path of :mod:`.matmul` tops out near 600 TFLOP/s); this is the kernel the
matmul entries run on compute capability 9.0 when the operands allow it. Design as in
CUTLASS's sm90 warp-specialized persistent "cooperative" GEMM
(https://github.com/NVIDIA/cutlass) and the PTX ISA's asynchronous warpgroup MMA chapter;
what each piece gained is in docs/perf-log-matmul.md.

Block of 3 warpgroups (384 threads) computing BM×BN tiles of C, persistent (as many
2-CTA clusters as fit; each walks the tiles t, t + clusters, ... rasterized in groups of
GROUP_ROWS cluster rows so a wave's A and B panels stay in L2):

    producer   warpgroup 0 (56 registers after setmaxnreg); its warp 0 walks every K-step
               of every tile, lane 0 issuing the TMA copies into stage ``step % STAGES``
               of the ring once every consumer of the cluster released it (``empty``
               mbarrier), with the byte count on the ``full`` mbarrier. A is the CTA's own;
               B is shared by the cluster (same N tile, neighbouring M tiles): each CTA
               loads half and multicasts it to both. TMA zero-fills what lies past the
               matrix: edge tiles and any K need no other code.
    consumers  warpgroups 1 and 2 (224 registers), rows 0-63 and 64-127 of the tile: wait
               ``full``, run BK/16 ``wgmma m64nBNk16`` on the stage (descriptors into the
               128-byte swizzled tiles), commit, and release the *previous* stage in both
               CTAs once its group has retired (``wgmma.wait_group 1``).
    epilogue   16-bit outputs: accumulators -> a 128-byte-swizzled staging buffer (128
               columns at a time) -> TMA stores, asynchronous, while the producer already
               fills the ring for the next tile; f32 outputs: straight from registers
               (whole 32-byte sectors). Both clip at M and N.

Layouts: A (M×K) is read K-major (row-major A) or M-major (``x.T``), B (K×N) N-major
(row-major B) or K-major (``y.T``): all four combinations run without copies, the
M/N-major tiles through wgmma's transpose bits. The tensor maps (:mod:`kaionb._tensor_map`)
are built on the host and passed by global address: numba cannot declare a
``__grid_constant__`` parameter. Requirements (else the mma.sync kernels run): 16-byte
aligned storage, operand row strides and output rows (N % 8 == 0).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from numba import cuda, int32, int64, uint8, uint32, uint64

from .._tensor_map import BOX_INNER, tensor_map_2d
from ..kernels.helpers import OUT_F16, OUT_F32
from ..ptx_patches import (
    accumulator_zeros,
    bar_sync_threads,
    cluster_arrive,
    cluster_ctarank,
    cluster_wait,
    cp_async_bulk_commit_group,
    cp_async_bulk_tensor_2d_global_to_shared,
    cp_async_bulk_tensor_2d_multicast,
    cp_async_bulk_tensor_2d_shared_to_global,
    cp_async_bulk_wait_group,
    cp_async_bulk_wait_group_read,
    device_function,
    fence_mbarrier_init_cluster,
    fence_proxy_async_shared,
    make_smem_desc,
    mbarrier_arrive_expect_tx,
    mbarrier_arrive_remote,
    mbarrier_init,
    mbarrier_wait,
    prefetch_tensormap,
    setmaxnreg_dec,
    setmaxnreg_inc,
    shared_addr,
    st_global_accumulator,
    st_shared_accumulator_swizzled,
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
CONSUMER_THREADS = 128 * CONSUMERS
# CTAs per cluster, neighbours along M: they share their B tile, each loading 1/CLUSTER_M
# of it from L2 and multicasting it to all (less L2 -> SM traffic per FLOP).
CLUSTER_M = 2
CLUSTER_MASK = (1 << CLUSTER_M) - 1
_CLUSTER = (CLUSTER_M, 1, 1)
STAGED_COLS = 128  # output columns a consumer stages per TMA store (16-bit outputs)
# Register split (setmaxnreg) of the 168 per thread a 384-thread block starts with:
# 128 × 56 + 256 × 224 = 384 × 168.
PRODUCER_REGISTERS = 56
CONSUMER_REGISTERS = 224
GROUP_ROWS = 4  # cluster rows (GROUP_ROWS·CLUSTER_M tile rows) a group walks before moving right
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

_SIGNATURE = "void(uint64, uint64, uint64, uint64, int32, int32, int32, int32)"


@device_function
def _schedule(M, N, K, BM, BN, BK):
    """(tiles_m, tiles_n, cluster tiles, this cluster's first tile, clusters in the grid,
    K-steps per tile, rank in the cluster) of the persistent schedule."""
    tiles_m = (M + BM - 1) // BM
    tiles_n = (N + BN - 1) // BN
    cluster_tiles = (tiles_m + CLUSTER_M - 1) // CLUSTER_M * tiles_n
    first_tile = int32(cuda.blockIdx.x) // CLUSTER_M
    clusters = int32(cuda.gridDim.x) // CLUSTER_M
    return (tiles_m, tiles_n, cluster_tiles, first_tile, clusters, (K + BK - 1) // BK,
            int32(cluster_ctarank()))


@device_function
def _tile_origin(t, tiles_m, tiles_n, rank, BM, BN):
    """(m0, n0) of cluster tile ``t`` for the CTA of cluster rank ``rank``. Cluster tiles
    are CLUSTER_M tile rows × 1 tile column, walked in groups of GROUP_ROWS cluster rows
    (L2 reuse); rank r takes tile row CLUSTER_M·(cluster row) + r — past M in an odd last
    row, where it still loads and multicasts its part of B and stores nothing."""
    cluster_rows = (tiles_m + CLUSTER_M - 1) // CLUSTER_M
    first_row = t // (GROUP_ROWS * tiles_n) * GROUP_ROWS
    group_rows = min(cluster_rows - first_row, GROUP_ROWS)
    in_group = t % (GROUP_ROWS * tiles_n)
    m0 = ((first_row + in_group % group_rows) * CLUSTER_M + rank) * BM
    return m0, (in_group // group_rows) * BN


def _make_kernel(dtype: str, a_kmajor: bool, b_kmajor: bool, tile: str):
    """One variant. Arguments: the device addresses of A's, B's and C's tensor maps (C's
    only for 16-bit outputs, else 0), the output's address, M, N, K and ``kind``
    (OUT_F32 / OUT_F16 / OUT_BF16). The output is row-major M×N with rows of whole 16-byte
    chunks (N % 8 == 0, 16-byte aligned base): f32 pairs are stored straight from
    registers, 16-bit tiles through TMA."""
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
    STAGE_DESC = STAGE_BYTES >> 4
    TRANS_A, TRANS_B = (0 if a_kmajor else 1), (0 if b_kmajor else 1)
    WG_A_OFFSET = 64 * LINE  # consumer 1's rows: 64 rows on (K-major) or box 1 (M-major)
    # Shared memory: the ring, then the 16-bit C staging buffers of the TMA-store epilogue
    # (consumer w's 64 rows × STAGED_COLS columns at a time: 2 swizzled boxes of 64×64,
    # 16 KB; a whole 64×256 half would leave room for 3 stages only, and the 4th stage is
    # worth more), then full[STAGES], empty[STAGES].
    STAGING = STAGES * STAGE_BYTES
    C_BOX_BYTES = 64 * LINE
    C_BUFFER_BYTES = STAGED_COLS // BOX_INNER * C_BOX_BYTES
    PARTS = BN // STAGED_COLS
    BARRIERS = STAGING + CONSUMERS * C_BUFFER_BYTES
    SHARED_BYTES = ATOM + BARRIERS + 2 * STAGES * 8  # + alignment slack for the ring
    ACC = BN // 2  # f32 accumulators per consumer thread
    # B is shared by the cluster's CTAs (same N tile): each loads 1/CLUSTER_M of it and
    # multicasts it to all. N-major: whole 64-column boxes; K-major: a box of the rows.
    B_PART_BYTES = B_BYTES // CLUSTER_M
    B_PART_BOXES = BN // BOX_INNER // CLUSTER_M
    B_PART_ROWS = BN // CLUSTER_M
    EMPTY_ARRIVALS = 4 * CONSUMERS * CLUSTER_M  # lane 0 of every consumer warp of the cluster
    mma = _WGMMA[(dtype, BN)]
    store_f32 = st_global_accumulator(BN, "f32")
    # The staging stores of part 0 and part 1 (the same instruction when PARTS == 1).
    stage_f16_0 = st_shared_accumulator_swizzled(BN, "f16", 0, PARTS)
    stage_bf16_0 = st_shared_accumulator_swizzled(BN, "bf16", 0, PARTS)
    stage_f16_1 = st_shared_accumulator_swizzled(BN, "f16", PARTS - 1, PARTS)
    stage_bf16_1 = st_shared_accumulator_swizzled(BN, "bf16", PARTS - 1, PARTS)
    if PARTS > 2:
        raise ValueError(f"tile {tile}: BN up to {2 * STAGED_COLS}")

    layout = ("n" if a_kmajor else "t") + ("t" if b_kmajor else "n")
    name = f"_matmul_wgmma_{dtype}_{layout}_{tile}_fwd_kernel"

    @kernel([_SIGNATURE], name=name, arch_specific=True, min_cc=(9, 0),
            max_dynamic_shared_bytes=SHARED_BYTES, launch_bounds=THREADS)
    def _matmul_wgmma_fwd_kernel(tmap_a, tmap_b, tmap_c, out, M, N, K, kind):
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

        if tid == 0:
            for s in range(STAGES):
                mbarrier_init(full + 8 * s, 1)
                mbarrier_init(empty + 8 * s, EMPTY_ARRIVALS)
            fence_mbarrier_init_cluster()
        cluster_arrive()  # every CTA's barriers exist before anyone multicasts or arrives
        cluster_wait()

        # Persistent: the cluster walks tiles first_tile, + clusters, ...; the producer runs
        # up to STAGES K-steps ahead of the consumers, across tile boundaries, so the next
        # tile's loads overlap this tile's epilogue. `step` counts K-steps over all tiles:
        # stage step % STAGES, its barriers' phase parity (step // STAGES) & 1.
        # Each role computes its schedule after setmaxnreg: values live across the split
        # would have to fit the producer's few registers.
        if warpgroup == 0:
            setmaxnreg_dec(PRODUCER_REGISTERS)  # the producer's registers go to consumers
            tiles_m, tiles_n, cluster_tiles, first_tile, clusters, n_ktiles, rank = _schedule(
                M, N, K, BM, BN, BK)
            # The producer: warp 0 walks the loop together (a lone looping lane would
            # share its warp with lanes parked at the final cluster barrier), lane 0 issues.
            if tid < 32:
                if lane == 0:
                    prefetch_tensormap(tmap_a)
                    prefetch_tensormap(tmap_b)
                step = int32(0)
                for t in range(first_tile, cluster_tiles, clusters):
                    m0, n0 = _tile_origin(t, tiles_m, tiles_n, rank, BM, BN)
                    for kt in range(n_ktiles):
                        s = step % STAGES
                        if step >= STAGES:  # every consumer of the cluster released it
                            mbarrier_wait(empty + 8 * s, (step // STAGES - 1) & 1)
                        if lane == 0:
                            bar = full + 8 * s
                            mbarrier_arrive_expect_tx(bar, STAGE_BYTES)
                            a_dst = ring + s * STAGE_BYTES
                            b_dst = a_dst + A_BYTES
                            k = kt * BK
                            if a_kmajor:
                                cp_async_bulk_tensor_2d_global_to_shared(a_dst, tmap_a, k, m0,
                                                                         bar)
                            else:
                                for i in range(BM // BOX_INNER):
                                    cp_async_bulk_tensor_2d_global_to_shared(
                                        a_dst + i * BOX_BYTES, tmap_a, m0 + i * BOX_INNER, k,
                                        bar)
                            if b_kmajor:
                                cp_async_bulk_tensor_2d_multicast(
                                    b_dst + rank * B_PART_BYTES, tmap_b, k,
                                    n0 + rank * B_PART_ROWS, bar, CLUSTER_MASK)
                            else:
                                for i in range(B_PART_BOXES):
                                    box = rank * B_PART_BOXES + i
                                    cp_async_bulk_tensor_2d_multicast(
                                        b_dst + box * BOX_BYTES, tmap_b, n0 + box * BOX_INNER,
                                        k, bar, CLUSTER_MASK)
                        step += 1
        else:
            setmaxnreg_inc(CONSUMER_REGISTERS)
            tiles_m, tiles_n, cluster_tiles, first_tile, clusters, n_ktiles, rank = _schedule(
                M, N, K, BM, BN, BK)
            consumer = warpgroup - 1
            a_desc = make_smem_desc(ring + consumer * WG_A_OFFSET, A_LBO, ATOM, 128)
            b_desc = make_smem_desc(ring + A_BYTES, B_LBO, ATOM, 128)
            row = consumer * 64 + 16 * (tid // 32 % 4) + lane // 4  # of the tile
            col = 2 * (lane % 4)
            issuer = tid % 128 == 0  # issues this consumer's TMA stores
            stage_buffer = ring + STAGING + consumer * C_BUFFER_BYTES
            stage_row = stage_buffer + (row % 64) * LINE + 2 * col
            stage_xor = (row % 8) * 16
            acc = accumulator_zeros(ACC)
            step = int32(0)
            for t in range(first_tile, cluster_tiles, clusters):
                m0, n0 = _tile_origin(t, tiles_m, tiles_n, rank, BM, BN)
                for kt in range(n_ktiles):
                    s = step % STAGES
                    mbarrier_wait(full + 8 * s, (step // STAGES) & 1)
                    a_stage = a_desc + uint64(s * STAGE_DESC)
                    b_stage = b_desc + uint64(s * STAGE_DESC)
                    # The BK/16 = 4 k-steps written out: numba keeps a range loop rolled,
                    # and ptxas then fences every wgmma of the loop. The first k-step of a
                    # tile ignores the accumulator (scale-d 0): no zeroing between tiles.
                    wgmma_fence()
                    acc = mma(a_stage, b_stage, kt, TRANS_A, TRANS_B, acc)
                    acc = mma(a_stage + A_K1, b_stage + B_K1, 1, TRANS_A, TRANS_B, acc)
                    acc = mma(a_stage + 2 * A_K1, b_stage + 2 * B_K1, 1, TRANS_A, TRANS_B,
                              acc)
                    acc = mma(a_stage + 3 * A_K1, b_stage + 3 * B_K1, 1, TRANS_A, TRANS_B,
                              acc)
                    wgmma_commit_group()
                    wgmma_wait_group(1)  # the previous K-step's group has read its stage
                    if kt > 0 and lane == 0:  # release it in every CTA (its B parts are here)
                        for r in range(CLUSTER_M):
                            mbarrier_arrive_remote(empty + 8 * ((step - 1) % STAGES), r)
                    step += 1
                wgmma_wait_group(0)
                if lane == 0:  # the tile's last stage
                    for r in range(CLUSTER_M):
                        mbarrier_arrive_remote(empty + 8 * ((step - 1) % STAGES), r)

                # Epilogue (the ring is already refilling for the next tile).
                if kind == OUT_F32:  # straight from registers: whole 32-byte sectors
                    r0 = m0 + row
                    offset = int64(r0) * N + n0 + col
                    store_f32(out + uint64(offset * 4), out + uint64((offset + 8 * N) * 4),
                              uint32(r0 < M), uint32(r0 + 8 < M), N - (n0 + col), acc)
                else:  # 16-bit: through the staging buffer and TMA stores, asynchronous
                    for part in range(PARTS):
                        if issuer:  # the buffer's previous TMA store has read it
                            cp_async_bulk_wait_group_read(0)
                        bar_sync_threads(1, CONSUMER_THREADS)
                        if kind == OUT_F16:
                            if part == 0:
                                stage_f16_0(stage_row, stage_xor, acc)
                            else:
                                stage_f16_1(stage_row, stage_xor, acc)
                        elif part == 0:
                            stage_bf16_0(stage_row, stage_xor, acc)
                        else:
                            stage_bf16_1(stage_row, stage_xor, acc)
                        fence_proxy_async_shared()  # st.shared -> visible to the TMA engine
                        bar_sync_threads(1, CONSUMER_THREADS)
                        if issuer:
                            for b in range(STAGED_COLS // BOX_INNER):
                                cp_async_bulk_tensor_2d_shared_to_global(
                                    tmap_c, n0 + part * STAGED_COLS + b * BOX_INNER,
                                    m0 + consumer * 64, stage_buffer + b * C_BOX_BYTES)
                            cp_async_bulk_commit_group()
            if issuer:
                cp_async_bulk_wait_group(0)
        # No CTA leaves while another may still arrive on its barriers.
        cluster_arrive()
        cluster_wait()

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


class LaunchPlan(NamedTuple):
    """Everything a launch needs that does not depend on the output: the operands' tensor
    maps (held, so they stay alive while the plan is cached), the grid, the kernel."""

    compiled: object
    shared: int
    grid: int
    tmap_a: object
    tmap_b: object
    m: int
    n: int
    k: int


def launch(dtype: str, tile: str, sa, lda: int, a_kmajor: bool, sb, ldb: int, b_kmajor: bool,
           out, m: int, n: int, k: int, kind: int) -> LaunchPlan:
    """Launch the variant for storage matrices ``sa`` (A: M×K K-major or K×M) and ``sb``
    (B: N×K K-major or K×N), both TMA-compatible (``_tensor_map.tma_compatible``), and a
    row-major M×N output ``out`` of ``kind`` whose rows are whole 16-byte chunks. The grid
    is persistent: as many clusters as fit on the GPU at once, or fewer where there are
    fewer cluster tiles. Returns the plan, which :func:`run` launches again for another
    output."""
    bm, bn, bk, _ = TILES[tile]
    compiled = _KERNELS[(dtype, a_kmajor, b_kmajor, tile)][0]
    shared = compiled.kdef.max_dynamic_shared_bytes
    tmap_a = tensor_map_2d(sa, lda, bm if a_kmajor else bk)
    tmap_b = tensor_map_2d(sb, ldb, bn // CLUSTER_M if b_kmajor else bk)
    cluster_tiles = -(-m // (bm * CLUSTER_M)) * -(-n // bn)  # ceil divisions
    clusters = min(cluster_tiles, compiled.max_active_clusters(_CLUSTER, THREADS, shared))
    plan = LaunchPlan(compiled, shared, clusters * CLUSTER_M, tmap_a, tmap_b, m, n, k)
    run(plan, out, kind)
    return plan


def run(plan: LaunchPlan, out, kind: int) -> None:
    """Launch ``plan`` writing ``out`` (M×N, kind, rows whole 16-byte chunks)."""
    tmap_c = 0 if kind == OUT_F32 else tensor_map_2d(out, plan.n, 64).ptr
    plan.compiled((plan.grid,), THREADS,
                  (plan.tmap_a.ptr, plan.tmap_b.ptr, tmap_c, out.ptr, plan.m, plan.n, plan.k,
                   kind), shared_mem=plan.shared, cluster=_CLUSTER)
