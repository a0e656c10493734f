"""The Hopper (sm_90a) GEMM pipeline as parts: TMA into a swizzled shared-memory ring,
``wgmma`` from it, warp-specialized and persistent. Kernels built from
:func:`wgmma_pipeline`: the matmul of :mod:`kaionb.kernels.matmul_hopper`; the quantized
matmuls and attention reuse the producer, the ring and the consumer loop.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions
(wgmma, mbarrier, cp.async.bulk.tensor); design as CUTLASS's sm90 warp-specialized
persistent "cooperative" GEMM. What each piece gained is in docs/perf-log-matmul.md.

A block is 3 warpgroups (384 threads) computing BM×BN tiles of C, persistent (as many
CLUSTER_M-CTA clusters as fit; each walks tiles t, t + clusters, ... rasterized in groups
of GROUP_ROWS cluster rows so a wave's A and B panels stay in L2):

    producer   warpgroup 0 (:meth:`produce`): its warp 0 walks every K-step of every tile,
               lane 0 issuing the TMA copies into stage ``step % STAGES`` of the ring once
               every consumer of the cluster released it (``empty`` mbarrier), with the
               byte count on the ``full`` mbarrier. A is the CTA's own; B is shared by the
               cluster (same N tile, neighbouring M tiles): each CTA loads 1/CLUSTER_M of
               it and multicasts it to all. TMA zero-fills what lies past the matrix,
               except A's rows past M, which a box does not load (:func:`a_box_rows`).
    consumers  warpgroups 1..CONSUMERS (:meth:`consume_tile`), 64 rows of the tile each:
               wait ``full``, run BK·size/32 wgmma k-steps on the stage (descriptors into
               the 128-byte swizzled tiles), commit, and release the *previous* stage in
               every CTA of the cluster once its group retired (``wgmma.wait_group 1``).
    epilogue   the kernel's, per tile, from the accumulators: :meth:`store_staged` (16-bit
               outputs through a swizzled staging buffer and asynchronous TMA stores that
               overlap the next tile's loads) or :meth:`store_direct` (f32 straight from
               registers, whole 32-byte sectors). Both clip at M and N.

**Split-K** (``split_k``, for grids of few tiles: M ≤ 256 at N = 4096): one work item
(tile, split) per CTA, the MAX_SPLITS (2) splits of a tile being the CTAs of one cluster,
split s taking k-tiles [s·kps, (s + 1)·kps) of K: no multicast (the cluster's CTAs hold
different K ranges), each loads its whole B tile and its consumers release stages of
their own CTA only, so the K loop needs no cluster barrier (the start-up one is waited on
only before the exchange). The splits meet in distributed shared memory
(:meth:`exchange_partials`): split s keeps column half s of its f32 accumulators, sends
the other half into the peer's exchange buffer with ``st.async`` (which completes the
peer's exchange mbarrier), adds the half it receives and stores its half of the tile from
registers. No cluster barrier after the K loop: a fold through shared memory behind
cluster barriers cost 3.3 of the kernel's 8.7 µs at M = 128, N = 4096, K = 1024
(docs/perf-log-matmul.md #21).

Geometry: a k-step is 32 bytes of K (k16 of 16-bit operands, k32 of s8); a stage is BK
elements of K = one 128-byte swizzled line per row. s8 accumulates in s32;
:meth:`store_scaled` stores it scaled into f32 (per-row and per-column scales, a bias), in
any output kind, straight from registers. A (M×K) is read K-major or M-major, B (K×N) N-major or
K-major: the M/N-major tiles through wgmma's transpose bits (16-bit operands only). The
tensor maps (:mod:`kaionb._tensor_map`) live in global memory and are passed by address:
numba cannot declare a ``__grid_constant__`` parameter.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, int32, int64, uint32, uint64

from kaionb._tensor_map import BOX_INNER
from kaionb.ptx_patches import (
    add_shared_f32,
    bar_sync_threads,
    cluster_arrive,
    cluster_arrive_relaxed,
    cluster_ctarank,
    cluster_id_x,
    cluster_wait,
    cp_async_bulk_commit_group,
    cp_async_bulk_tensor_2d_global_to_shared,
    cp_async_bulk_tensor_2d_multicast,
    cp_async_bulk_tensor_2d_shared_to_global,
    cp_async_bulk_wait_group_read,
    device_function,
    fence_mbarrier_init_cluster,
    fence_proxy_async_shared,
    make_smem_desc,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_arrive_remote,
    mbarrier_init,
    mbarrier_wait,
    mbarrier_wait_cluster,
    prefetch_tensormap,
    st_async_cluster_f32,
    st_global_accumulator,
    st_global_accumulator_s32_scaled,
    st_shared_accumulator_swizzled,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_m64n64k16_f32_bf16,
    wgmma_m64n64k16_f32_f16,
    wgmma_m64n128k16_f32_bf16,
    wgmma_m64n128k16_f32_f16,
    wgmma_m64n256k16_f32_bf16,
    wgmma_m64n256k16_f32_f16,
    wgmma_m64n128k32_s32_s8,
    wgmma_m64n256k32_s32_s8,
    wgmma_wait_group,
)

from .epilogue import OUT_F16, OUT_F32

CONSUMERS = 2  # consumer warpgroups
THREADS = 128 * (1 + CONSUMERS)
CONSUMER_THREADS = 128 * CONSUMERS
# CTAs per cluster, neighbours along M: they share their B tile, each loading 1/CLUSTER_M
# of it from L2 and multicasting it to all (less L2 -> SM traffic per FLOP).
CLUSTER_M = 2
CLUSTER_MASK = (1 << CLUSTER_M) - 1
CLUSTER = (CLUSTER_M, 1, 1)
# Split-K: K splits per tile at most, the CTAs of one cluster. exchange_partials depends on
# it (its peer is rank 1 - s; one peer's bytes expected); clusters of 4 and 8 were slower
# at every M = 32-256 measured (docs/perf-log-matmul.md #19).
MAX_SPLITS = 2
GROUP_ROWS = 4  # cluster rows (GROUP_ROWS·CLUSTER_M tile rows) a group walks before moving right
STAGED_COLS = 128  # output columns a consumer stages per TMA store (16-bit outputs)
LINE = 128  # bytes of one swizzled row
ATOM = 8 * LINE  # the 128-byte swizzle's period: 8 rows, 1024 bytes
KSTEP_BYTES = 32  # bytes of K one wgmma consumes
CONSUMER_BARRIER = 1  # the named barrier of the consumer warpgroups

# (operand, N) -> the m64nN instruction of one 32-byte k-step: k16 with f32 accumulators
# for 16-bit operands, k32 with s32 accumulators for s8.
WGMMA = {
    ("f16", 64): wgmma_m64n64k16_f32_f16,
    ("bf16", 64): wgmma_m64n64k16_f32_bf16,
    ("f16", 128): wgmma_m64n128k16_f32_f16,
    ("f16", 256): wgmma_m64n256k16_f32_f16,
    ("bf16", 128): wgmma_m64n128k16_f32_bf16,
    ("bf16", 256): wgmma_m64n256k16_f32_bf16,
    ("s8", 128): wgmma_m64n128k32_s32_s8,
    ("s8", 256): wgmma_m64n256k32_s32_s8,
}
ELEMENT_BYTES = {"f16": 2, "bf16": 2, "s8": 1}


class Tile(NamedTuple):
    """BM×BN of C per block, BK elements of K per stage, STAGES stages in the ring."""

    BM: int
    BN: int
    BK: int
    STAGES: int


def a_box_rows(m: int, bm: int) -> int:
    """Rows of a K-major A's TMA box for an M×K A and BM-row tiles: BM, or M rounded up
    to 8 rows where M < BM. Rows a box does not load keep stale bytes in the stage; they
    only reach accumulator rows past M, which nothing stores. A box past M's end would be
    zero-filled by TMA instead, which costs more than loading them (H100, 128×64 split
    tile, N = K = 4096: M = 32 26.1 → 19.4 µs, M = 64 23.6 → 19.8, while M = 128 takes
    20.2; docs/perf-log-matmul.md #20)."""
    return min(bm, (m + 7) // 8 * 8)


a_box_rows_device = device_function(a_box_rows)


@device_function
def tile_schedule(M, N, K, BM, BN, BK):
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
def split_item(M, N, K, kps, BM, BN, BK):
    """(m0, n0, first k-tile, k-tiles, split, splits) of this CTA's split-K work item: the
    splits of a tile are the CTAs of one cluster (cluster c holds tile c, tiles walking M
    first; rank s takes k-tiles [s·kps, (s + 1)·kps)). ``kps``: k-tiles per split."""
    tiles_m = (M + BM - 1) // BM
    n_ktiles = (K + BK - 1) // BK
    tile = int32(cluster_id_x())
    split = int32(cluster_ctarank())
    kt0 = split * kps
    return ((tile % tiles_m) * BM, tile // tiles_m * BN, kt0, min(kps, n_ktiles - kt0), split,
            (n_ktiles + kps - 1) // kps)


@device_function
def tile_origin(t, tiles_m, tiles_n, rank, BM, BN):
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


def accumulator_store(n: int):
    """Device function ``(out, kind, r0, c0, M, N, acc)``: a consumer thread's values of an
    m64nN f32 accumulator — rows r0 and r0 + 8, columns c0 + 8j + {0, 1} — into the
    row-major M×N ``out`` (an address) as ``kind`` (OUT_F32 / OUT_F16 / OUT_BF16),
    clipped at M and N (``ptx_patches.st_global_accumulator``)."""
    as_f32, as_f16, as_bf16 = (st_global_accumulator(n, kind) for kind in ("f32", "f16", "bf16"))

    @device_function
    def store(out, kind, r0, c0, M, N, acc):
        width = 4 if kind == OUT_F32 else 2  # bytes per output element
        offset = int64(r0) * N + c0
        at0, at8 = out + uint64(offset * width), out + uint64((offset + 8 * N) * width)
        ok0, ok8, left = uint32(r0 < M), uint32(r0 + 8 < M), N - c0
        if kind == OUT_F32:
            as_f32(at0, at8, ok0, ok8, left, acc)
        elif kind == OUT_F16:
            as_f16(at0, at8, ok0, ok8, left, acc)
        else:
            as_bf16(at0, at8, ok0, ok8, left, acc)

    return store


class WgmmaPipeline:
    """Compile-time geometry and device functions of one pipeline variant (module doc).

    Shared memory (``SHARED_BYTES``, dynamic): the ring, the 16-bit C staging buffers
    (split-K: none, the exchange buffers instead), then full[STAGES] and empty[STAGES]
    mbarriers (split-K: and one exchange mbarrier per consumer); :meth:`layout` places
    them.
    """

    def __init__(self, operand: str, a_kmajor: bool, b_kmajor: bool, tile: Tile,
                 split_k: bool = False):
        BM, BN, BK, STAGES = tile
        SPLIT_K = split_k
        E = ELEMENT_BYTES[operand]
        if BK * E != LINE:
            raise ValueError(f"wgmma_pipeline: BK must be one {LINE}-byte swizzled line")
        if E == 1 and not (a_kmajor and b_kmajor):
            raise ValueError("wgmma_pipeline: s8 wgmma reads K-major tiles only")
        A_BYTES, B_BYTES = BM * BK * E, BN * BK * E
        STAGE_BYTES = A_BYTES + B_BYTES
        BOX_BYTES = BK * LINE  # an M/N-major box: 64 M/N × BK rows of K
        KSTEPS = BK * E // KSTEP_BYTES
        # Descriptor strides (ptx_patches.make_smem_desc): K-major tiles step 32 bytes per
        # k-step inside their 128-byte rows; M/N-major tiles step 16 rows, and their
        # 64-wide blocks (one TMA box each) lie BOX_BYTES apart.
        A_LBO, A_KSTEP = (16, KSTEP_BYTES) if a_kmajor else (BOX_BYTES, 16 * LINE)
        B_LBO, B_KSTEP = (16, KSTEP_BYTES) if b_kmajor else (BOX_BYTES, 16 * LINE)
        A_K1, B_K1 = A_KSTEP >> 4, B_KSTEP >> 4  # one k-step in descriptor units
        STAGE_DESC = STAGE_BYTES >> 4
        TRANS_A, TRANS_B = (0 if a_kmajor else 1), (0 if b_kmajor else 1)
        WG_A_OFFSET = 64 * LINE  # consumer 1's rows: 64 rows on (K-major) or box 1 (M-major)
        # The 16-bit C staging buffers: consumer w's 64 rows × STAGED_COLS columns at a
        # time (2 swizzled boxes of 64×64, 16 KB; a whole 64×256 half would leave room for
        # 3 stages only, and the 4th stage is worth more). Split-K stores from registers
        # after its exchange: no staging.
        STAGING = STAGES * STAGE_BYTES
        C_BOX_BYTES = 64 * LINE
        C_BUFFER_BYTES = 0 if SPLIT_K else STAGED_COLS // BOX_INNER * C_BOX_BYTES
        PARTS = max(1, BN // STAGED_COLS)
        ACC = BN // 2  # f32 accumulators per consumer thread
        # Split-K's exchange (:meth:`exchange_partials`): a consumer's buffer receives the
        # other split's half of each thread's accumulators (HALF floats), thread t's chunk
        # i at 16·t + i·EXCHANGE_STRIDE (a warp's chunks contiguous: no bank conflicts).
        # Outside the ring: the other split sends while this one may still be reading it.
        HALF = ACC // 2
        EXCHANGE_STRIDE = 16 * 128
        EXCHANGE_BYTES = 4 * HALF * 128  # per consumer
        EXCHANGE = CONSUMERS * EXCHANGE_BYTES if SPLIT_K else 0
        BARRIERS = STAGING + CONSUMERS * C_BUFFER_BYTES + EXCHANGE
        # + alignment slack for the ring, the ring's mbarriers, split-K's exchange mbarriers
        SHARED_BYTES = ATOM + BARRIERS + 2 * STAGES * 8 + (8 * CONSUMERS if SPLIT_K else 0)
        # B is shared by the cluster's CTAs (same N tile): each loads 1/CLUSTER_M of it and
        # multicasts it to all. N-major: whole 64-column boxes; K-major: a box of the rows.
        B_PART_BYTES = B_BYTES // CLUSTER_M
        B_PART_BOXES = BN // BOX_INNER // CLUSTER_M
        B_PART_ROWS = BN // CLUSTER_M
        # CTAs whose consumers release a stage (lane 0 of each consumer warp arrives):
        # the cluster, whose B parts every stage holds, or (split-K) the CTA alone.
        PEERS = 1 if SPLIT_K else CLUSTER_M
        EMPTY_ARRIVALS = 4 * CONSUMERS * PEERS
        if KSTEPS != 4:
            raise ValueError("wgmma_pipeline: the consumer loop is written for 4 k-steps")
        if PARTS > 2:
            raise ValueError(f"wgmma_pipeline: BN up to {2 * STAGED_COLS}")
        if BN % STAGED_COLS and not SPLIT_K:
            raise ValueError(f"wgmma_pipeline: BN a multiple of {STAGED_COLS} (staged "
                             "16-bit stores); split-K also takes 64")
        if SPLIT_K and BM != 64 * CONSUMERS:
            raise ValueError("wgmma_pipeline: split-K exchanges the consumers' 64-row halves")
        mma = WGMMA[(operand, BN)]
        store_whole, store_half = accumulator_store(BN), accumulator_store(BN // 2)
        send_half = st_async_cluster_f32(HALF, EXCHANGE_STRIDE)
        add_half = add_shared_f32(HALF, EXCHANGE_STRIDE)
        if E == 1:  # the W8A8 epilogue's stores, one per output kind
            scaled_f32 = st_global_accumulator_s32_scaled(BN, "f32")
            scaled_f16 = st_global_accumulator_s32_scaled(BN, "f16")
            scaled_bf16 = st_global_accumulator_s32_scaled(BN, "bf16")
        # The staging stores of part 0 and part 1 (the same instruction when PARTS == 1).
        stage_f16_0 = st_shared_accumulator_swizzled(BN, "f16", 0, PARTS)
        stage_bf16_0 = st_shared_accumulator_swizzled(BN, "bf16", 0, PARTS)
        stage_f16_1 = st_shared_accumulator_swizzled(BN, "f16", PARTS - 1, PARTS)
        stage_bf16_1 = st_shared_accumulator_swizzled(BN, "bf16", PARTS - 1, PARTS)

        @device_function
        def layout(smem0):
            """(ring, full, empty): shared addresses of the ring (on a swizzle atom) and
            of the two mbarrier arrays, from the dynamic shared memory's address."""
            ring = (smem0 + ATOM - 1) // ATOM * ATOM
            full = ring + BARRIERS
            return ring, full, full + 8 * STAGES

        @device_function
        def init_barriers(full, empty):
            """Thread 0 initializes the mbarriers; then the whole cluster syncs, so every
            CTA's barriers exist before anyone multicasts or arrives. Split-K touches no
            other CTA before its exchange: a CTA barrier publishes the mbarriers, and the
            cluster's start-up barrier is only arrived at here (:meth:`exchange_partials`
            waits on it, after the K loop)."""
            if int32(cuda.threadIdx.x) == 0:
                for s in range(STAGES):
                    mbarrier_init(full + 8 * s, 1)
                    mbarrier_init(empty + 8 * s, EMPTY_ARRIVALS)
                if SPLIT_K:
                    for c in range(CONSUMERS):
                        mbarrier_init(empty + 8 * (STAGES + c), 1)
                fence_mbarrier_init_cluster()
            if SPLIT_K:
                cuda.syncthreads()
                cluster_arrive_relaxed()
            else:
                cluster_arrive()
                cluster_wait()

        @device_function
        def schedule(M, N, K):
            return tile_schedule(M, N, K, BM, BN, BK)

        @device_function
        def origin(t, tiles_m, tiles_n, rank):
            return tile_origin(t, tiles_m, tiles_n, rank, BM, BN)

        @device_function
        def item(M, N, K, kps):
            return split_item(M, N, K, kps, BM, BN, BK)

        @device_function
        def a_stage_bytes(M, m0):
            """Bytes of A a stage of the tile at row m0 receives: the K-major box's rows
            (:func:`a_box_rows`), or the M-major boxes that start before M."""
            if a_kmajor:
                return a_box_rows_device(M, BM) * LINE
            boxes = min(BM // BOX_INNER, max(0, (M - m0 + BOX_INNER - 1) // BOX_INNER))
            return boxes * BOX_BYTES

        @device_function
        def load_stage(ring, full, s, tmap_a, tmap_b, M, m0, n0, k, rank):
            """Lane 0 of the producer: stage ``s`` of the ring gets A's tile at (m0, k) —
            the rows up to M a box holds — and B's at (k, n0): this CTA's part of B,
            multicast to the cluster, or (split-K) the whole of it."""
            bar = full + 8 * s
            mbarrier_arrive_expect_tx(bar, a_stage_bytes(M, m0) + B_BYTES)
            a_dst = ring + s * STAGE_BYTES
            b_dst = a_dst + A_BYTES
            if a_kmajor:
                cp_async_bulk_tensor_2d_global_to_shared(a_dst, tmap_a, k, m0, bar)
            else:
                for i in range(BM // BOX_INNER):
                    if m0 + i * BOX_INNER < M:
                        cp_async_bulk_tensor_2d_global_to_shared(
                            a_dst + i * BOX_BYTES, tmap_a, m0 + i * BOX_INNER, k, bar)
            if SPLIT_K:
                if b_kmajor:
                    for r in range(CLUSTER_M):
                        cp_async_bulk_tensor_2d_global_to_shared(
                            b_dst + r * B_PART_BYTES, tmap_b, k, n0 + r * B_PART_ROWS, bar)
                else:
                    for box in range(BN // BOX_INNER):
                        cp_async_bulk_tensor_2d_global_to_shared(
                            b_dst + box * BOX_BYTES, tmap_b, n0 + box * BOX_INNER, k, bar)
            elif b_kmajor:
                cp_async_bulk_tensor_2d_multicast(
                    b_dst + rank * B_PART_BYTES, tmap_b, k, n0 + rank * B_PART_ROWS, bar,
                    CLUSTER_MASK)
            else:
                for i in range(B_PART_BOXES):
                    box = rank * B_PART_BOXES + i
                    cp_async_bulk_tensor_2d_multicast(
                        b_dst + box * BOX_BYTES, tmap_b, n0 + box * BOX_INNER, k, bar,
                        CLUSTER_MASK)

        @device_function
        def produce_steps(ring, full, empty, tmap_a, tmap_b, M, m0, n0, kt0, nk, rank, step,
                          lane):
            """The ``nk`` K-steps from k-tile ``kt0`` of the tile at (m0, n0), each into
            the next stage once its consumers released it; returns ``step``."""
            for kt in range(kt0, kt0 + nk):
                s = step % STAGES
                if step >= STAGES:  # every consumer of the stage released it
                    mbarrier_wait(empty + 8 * s, (step // STAGES - 1) & 1)
                if lane == 0:
                    load_stage(ring, full, s, tmap_a, tmap_b, M, m0, n0, kt * BK, rank)
                step += 1
            return step

        @device_function
        def produce(ring, full, empty, tmap_a, tmap_b, M, N, K, kps):
            """The producer role, run by warp 0 of warpgroup 0 together (a lone looping
            lane would share its warp with lanes parked at a barrier);
            lane 0 issues. Runs up to STAGES K-steps ahead of the consumers, across tile
            boundaries, so the next tile's loads overlap this tile's epilogue. ``kps``:
            k-tiles per split (split-K only)."""
            lane = int32(cuda.threadIdx.x) % 32
            if lane == 0:
                prefetch_tensormap(tmap_a)
                prefetch_tensormap(tmap_b)
            step = int32(0)
            if SPLIT_K:
                m0, n0, kt0, nk, _, _ = item(M, N, K, kps)
                produce_steps(ring, full, empty, tmap_a, tmap_b, M, m0, n0, kt0, nk, int32(0),
                              step, lane)
            else:
                tiles_m, tiles_n, cluster_tiles, first_tile, clusters, n_ktiles, rank = (
                    schedule(M, N, K))
                for t in range(first_tile, cluster_tiles, clusters):
                    m0, n0 = origin(t, tiles_m, tiles_n, rank)
                    step = produce_steps(ring, full, empty, tmap_a, tmap_b, M, m0, n0, 0,
                                         n_ktiles, rank, step, lane)

        @device_function
        def descriptors(ring, consumer):
            """Consumer ``consumer``'s wgmma descriptors of stage 0 (A: its 64 rows; B)."""
            return (make_smem_desc(ring + consumer * WG_A_OFFSET, A_LBO, ATOM, 128),
                    make_smem_desc(ring + A_BYTES, B_LBO, ATOM, 128))

        @device_function
        def release(bar):
            """Arrive on empty barrier ``bar`` of every CTA that loaded into the stage."""
            if SPLIT_K:
                mbarrier_arrive(bar)
            else:
                for r in range(CLUSTER_M):
                    mbarrier_arrive_remote(bar, r)

        @device_function
        def consume_tile(a_desc, b_desc, full, empty, step, n_ktiles, acc):
            """One tile's K loop of a consumer: returns (acc, step). ``step`` counts
            K-steps over all tiles: stage step % STAGES, phase parity (step // STAGES) & 1.
            The first k-step of a tile ignores the accumulator (scale-d 0): no zeroing."""
            lane = int32(cuda.threadIdx.x) % 32
            for kt in range(n_ktiles):
                s = step % STAGES
                mbarrier_wait(full + 8 * s, (step // STAGES) & 1)
                a_stage = a_desc + uint64(s * STAGE_DESC)
                b_stage = b_desc + uint64(s * STAGE_DESC)
                # The 4 k-steps written out: numba keeps a range loop rolled, and ptxas then
                # fences every wgmma of the loop.
                wgmma_fence()
                acc = mma(a_stage, b_stage, kt, TRANS_A, TRANS_B, acc)
                acc = mma(a_stage + A_K1, b_stage + B_K1, 1, TRANS_A, TRANS_B, acc)
                acc = mma(a_stage + 2 * A_K1, b_stage + 2 * B_K1, 1, TRANS_A, TRANS_B, acc)
                acc = mma(a_stage + 3 * A_K1, b_stage + 3 * B_K1, 1, TRANS_A, TRANS_B, acc)
                wgmma_commit_group()
                wgmma_wait_group(1)  # the previous K-step's group has read its stage
                if kt > 0 and lane == 0:  # release it in every CTA that loaded it (release)
                    release(empty + 8 * ((step - 1) % STAGES))
                step += 1
            wgmma_wait_group(0)
            if lane == 0:  # the tile's last stage
                release(empty + 8 * ((step - 1) % STAGES))
            return acc, step

        @device_function
        def store_direct(out, m0, n0, row, col, M, N, acc):
            """f32 accumulators of the consumer thread at tile (row, col) straight to the
            row-major M×N float32 ``out`` (an address), clipped at M and N."""
            store_whole(out, OUT_F32, m0 + row, n0 + col, M, N, acc)

        @device_function
        def store_scaled(out, kind, m0, n0, row, col, M, N, acc, row_scale0, row_scale8,
                         col_scale, col_step, has_col_scale, bias, has_bias):
            """s8: the s32 accumulators scaled (``ptx_patches.st_global_accumulator_s32_
            scaled``: ``col_scale`` / ``bias`` address the thread's first column) straight
            to the row-major M×N ``out`` (an address) of ``kind``, clipped at M and N."""
            r0 = m0 + row
            offset = int64(r0) * N + n0 + col
            ok0, ok8, left = uint32(r0 < M), uint32(r0 + 8 < M), N - (n0 + col)
            if kind == OUT_F32:
                scaled_f32(out + uint64(offset * 4), out + uint64((offset + 8 * N) * 4), ok0,
                           ok8, left, acc, row_scale0, row_scale8, col_scale, col_step,
                           has_col_scale, bias, has_bias)
            elif kind == OUT_F16:
                scaled_f16(out + uint64(offset * 2), out + uint64((offset + 8 * N) * 2), ok0,
                           ok8, left, acc, row_scale0, row_scale8, col_scale, col_step,
                           has_col_scale, bias, has_bias)
            else:
                scaled_bf16(out + uint64(offset * 2), out + uint64((offset + 8 * N) * 2), ok0,
                            ok8, left, acc, row_scale0, row_scale8, col_scale, col_step,
                            has_col_scale, bias, has_bias)

        @device_function
        def store_staged(tmap_c, kind, m0, n0, consumer, stage_buffer, stage_row, stage_xor,
                         issuer, acc):
            """16-bit accumulators (``kind`` OUT_F16 or OUT_BF16) through the consumer's
            staging buffer and TMA stores, STAGED_COLS columns at a time; asynchronous
            (the ``issuer`` thread waits for a buffer's previous store to read it)."""
            for part in range(PARTS):
                if issuer:
                    cp_async_bulk_wait_group_read(0)
                bar_sync_threads(CONSUMER_BARRIER, CONSUMER_THREADS)
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
                bar_sync_threads(CONSUMER_BARRIER, CONSUMER_THREADS)
                if issuer:
                    for b in range(STAGED_COLS // BOX_INNER):
                        cp_async_bulk_tensor_2d_shared_to_global(
                            tmap_c, n0 + part * STAGED_COLS + b * BOX_INNER, m0 + consumer * 64,
                            stage_buffer + b * C_BOX_BYTES)
                    cp_async_bulk_commit_group()

        @device_function
        def exchange_partials(ring, empty, out, kind, M, N, K, kps, consumer, row, col,
                              acc):
            """Split-K's epilogue (module doc) for the thread of consumer ``consumer`` at
            tile (row, col): of two splits, split s sends column half 1 - s of its
            accumulators into the other split's exchange buffer, adds the half it receives
            to its half s (a sum of two: the same bits in either split) and stores that
            as ``kind`` into the row-major M×N ``out`` (an address), clipped at M and N;
            one split stores its whole accumulator. A consumer whose 64 rows all lie past
            M does nothing, in every split."""
            m0, n0, _, _, split, splits = item(M, N, K, kps)
            if m0 + consumer * 64 >= M:
                return
            if splits == 1:
                store_whole(out, kind, m0 + row, n0 + col, M, N, acc)
                return
            t = int32(cuda.threadIdx.x) % 128
            buffer = ring + STAGING + consumer * EXCHANGE_BYTES + 16 * t
            bar = empty + 8 * (STAGES + consumer)
            if t == 0:
                mbarrier_arrive_expect_tx(bar, EXCHANGE_BYTES)
            cluster_wait()  # the start-up barrier: the other split runs, its mbarriers exist
            if split == 0:
                keep, send = acc[:HALF], acc[HALF:]
            else:
                keep, send = acc[HALF:], acc[:HALF]
            send_half(buffer, bar, uint32(1 - split), send)
            mbarrier_wait_cluster(bar, 0)
            store_half(out, kind, m0 + row, n0 + split * (BN // 2) + col, M, N,
                       add_half(buffer, keep))

        @device_function
        def staging(ring, consumer, row, col):
            """(buffer, this thread's row address in it, the row's swizzle XOR) of the
            consumer's 16-bit staging buffer for tile row ``row``, column ``col``. Split-K
            has no staging buffer: its address is then the exchange's, not to be written."""
            buffer = ring + STAGING + consumer * C_BUFFER_BYTES
            return buffer, buffer + (row % 64) * LINE + 2 * col, (row % 8) * 16

        self.tile = tile
        self.ACC, self.SHARED_BYTES = ACC, SHARED_BYTES
        # s8: the s32 accumulator's scale-and-bias step into f32, before either store.
        self.integer = E == 1
        self.store_scaled = store_scaled
        self.layout, self.init_barriers, self.schedule = layout, init_barriers, schedule
        self.origin, self.produce, self.descriptors = origin, produce, descriptors
        self.item = item
        self.consume_tile, self.store_direct = consume_tile, store_direct
        self.store_staged, self.staging = store_staged, staging
        self.exchange_partials = exchange_partials


def wgmma_pipeline(operand: str, a_kmajor: bool, b_kmajor: bool, tile,
                   split_k: bool = False) -> WgmmaPipeline:
    """The pipeline parts for ``operand`` ("f16", "bf16", "s8": K-major only), the
    operands' layouts and ``tile`` (BM, BN, BK, STAGES); ``split_k``: the split-K schedule
    (module doc)."""
    return WgmmaPipeline(operand, a_kmajor, b_kmajor, Tile(*tile), split_k)
