"""Hopper (sm_90a) matmul: TMA into a swizzled shared-memory ring, ``wgmma`` from it.

    C[m, n] = Σ_k A[m, k] · B[k, n]   f16 / bf16 inputs, f32 accumulation, any M, N, K

The H100's tensor cores reach their dense peak only through ``wgmma.mma_async`` (the
``mma.sync`` path of :mod:`.matmul` tops out near 600 TFLOP/s); this is the kernel the
matmul entries run on compute capability 9.0 when the operands allow it. Design as in
CUTLASS's sm90 warp-specialized persistent "cooperative" GEMM
(https://github.com/NVIDIA/cutlass) and the PTX ISA's asynchronous warpgroup MMA chapter;
what each piece gained is in docs/perf-log-matmul.md.

The kernel is built from :mod:`.helpers.wgmma_pipeline` (which describes the roles): a
producer warpgroup issues TMA loads into a 4-6 stage ring shared with the cluster's other
CTA by multicast, two consumer warpgroups run wgmma from it (56 / 224 registers after
``setmaxnreg``), persistent over the tiles; its epilogue stores 16-bit outputs through
the staged TMA store and f32 outputs straight from registers.

Grids of few tiles with M > 16 (M ≤ 256 at N = 4096: 32-64 narrow tiles for 132 SMs) and K
≥ 1024 take a split tile (:func:`choose_tile`): 128×64 ("split64", while two splits of each
fit one wave: M ≤ 128 at N = 4096) or the narrow 128×128 ("split"), with K split over the
CTAs of a cluster, one (tile, split) work item per CTA (``helpers.wgmma_pipeline``'s
split-K schedule); the two splits swap column halves of their f32 partials in distributed
shared memory (``st.async``), each adding and storing one half (a sum of two: the same
bits every run). The 128×64 tile's consumers (m64n64, 32 accumulators) keep the 73
registers ptxas gives the kernel: no ``setmaxnreg``. Same operands, layouts and outputs as
the others.

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

from numba import cuda, float32, int32, int64, uint8, uint32, uint64

from .._tensor_map import tensor_map_2d
from ..ptx_patches import (
    accumulator_zeros,
    accumulator_zeros_s32,
    cluster_arrive,
    cluster_wait,
    cp_async_bulk_wait_group,
    device_function,
    ld_global_nc_f32,
    setmaxnreg_dec,
    setmaxnreg_inc,
    shared_addr,
)
from .helpers import OUT_F32
from .helpers.epilogue import SCALE_NONE, SCALE_TENSOR
from .helpers.wgmma_pipeline import (
    CLUSTER,
    CLUSTER_M,
    ELEMENT_BYTES,
    MAX_SPLITS,
    THREADS,
    a_box_rows,
    wgmma_pipeline,
)
from .launch import kernel

# Tile classes: (BM, BN, BK, STAGES), BK for 16-bit operands (s8: twice as many elements,
# the same 128-byte line; :func:`geometry`). wide: 128×256, the two consumer warpgroups each
# 64×256 (m64n256k16, 128 f32 accumulators per thread), 4 stages of 48 KB; narrow:
# 128×128 (m64n128k16), 6 stages of 32 KB, for grids the wide tile leaves under one wave;
# split: the narrow tile with K split over a cluster's CTAs (16-bit operands), for grids of
# fewer tiles; split64: 128×64 (m64n64k16), 8 stages of 24 KB, where two splits of it
# still fit one wave (twice the CTAs of split's, each streaming half the B tile). The
# split tiles store from registers: no staging buffers, the exchange's instead (16 / 32
# KB; split64 had 9 stages before it, #21). 7 stages for split were no faster than 6
# (M = 256, K = 4096: 24.9 vs 24.5 µs, #20).
TILES = {
    "wide": (128, 256, 64, 4),
    "narrow": (128, 128, 64, 6),
    "split": (128, 128, 64, 6),
    "split64": (128, 64, 64, 8),
}
SPLIT_TILES = ("split", "split64")
# Register split (setmaxnreg) of the 168 per thread a 384-thread block starts with:
# 128 × 56 + 256 × 224 = 384 × 168.
PRODUCER_REGISTERS = 56
CONSUMER_REGISTERS = 224
# Tile choice: wide from 0.9 blocks per SM (2048² has 128 wide tiles on 132 SMs), narrow
# from NARROW_MIN_BLOCKS_PER_SM; smaller grids of 16-bit products with M > 16 below.
WIDE_MIN_BLOCKS_PER_SM = 0.9
NARROW_MIN_BLOCKS_PER_SM = 0.45
# Grids of SPLIT_MIN_BLOCKS_PER_SM to SPLIT_MAX_BLOCKS_PER_SM narrow tiles with M >
# SPLIT_MIN_M (16-bit; the range measured: N = 4096, M = 32-256): split-K from
# SPLIT_MIN_KTILES k-tiles of K, else (and for grids of fewer tiles, not measured)
# mma.sync's split-K tiles. H100, f16, µs mma.sync / narrow / split
# (benchmarks/small_m_matmul.py; docs/perf-log-matmul.md #19): M = 128, K = 1024 18.9 /
# 13.2 / 12.8, 2048 26.3 / 19.6 / 15.9, 4096 40.6 / 33.0 / 22.4; M = 32, K = 1024 15.0 /
# 12.9 / 12.2, 2048 18.2 / 19.6 / 16.2. M ≤ 16 keeps the weight stream or the mma.sync
# decode tiles (row-major B at M = 16: 19.1 against 22.7 split, #18).
SPLIT_MIN_BLOCKS_PER_SM = 0.2
SPLIT_MAX_BLOCKS_PER_SM = 0.5
SPLIT_MIN_M = 16
SPLIT_MIN_KTILES = 16
# Splits per tile: one work item per SM, at most MAX_SPLITS (2, the pipeline's exchange
# pairs them), each at least MIN_SPLIT_KTILES k-tiles. Clusters of 4 or 8 were slower
# than 2 at every M = 32-256, K = 2048-16384 (#19: M = 128, K = 4096, 2 / 4 / 8 splits
# 22.4 / 32.2 / 41.5 µs).
SPLIT_ITEMS_PER_SM = 1
MIN_SPLIT_KTILES = 4



def geometry(dtype: str, tile: str) -> tuple:
    """(BM, BN, BK, STAGES) of ``tile`` for operands ``dtype``: BK spans one 128-byte line."""
    bm, bn, bk, stages = TILES[tile]
    return bm, bn, bk * 2 // ELEMENT_BYTES[dtype], stages


_SIGNATURE = ("void(uint64, uint64, uint64, uint64, int32, int32, int32, int32, float32, "
              "uint64, int32, uint64, int32, uint64, int32, int32)")
# The dequantization arguments of a float kernel (ignored): alpha, no scales, no bias.
NO_DEQUANT = (1.0, 0, SCALE_NONE, 0, SCALE_NONE, 0, 0)


def _make_matmul_wgmma_kernel(dtype: str, a_kmajor: bool, b_kmajor: bool, tile: str):
    """One variant, built from :func:`helpers.wgmma_pipeline.wgmma_pipeline`. Arguments:
    the device addresses of A's, B's and C's tensor maps (C's only for 16-bit outputs,
    else 0), the output's address, M, N, K and ``kind`` (OUT_F32 / OUT_F16 / OUT_BF16);
    then, read by the s8 variants only (else :data:`NO_DEQUANT`), the dequantization
    ``C = alpha · sa[row] · sb[col] · acc + bias[col]``: alpha, the addresses and modes
    (``helpers.epilogue.SCALE_*``) of the f32 row and column scales, the f32 bias's
    address and whether there is one; last, read by the split-K variants only (else 0):
    ``kps``, the k-tiles per split (launched in clusters of the splits).
    The output is row-major M×N with rows of whole 16-byte chunks (N % 8 == 0, 16-byte
    aligned base): f32 pairs are stored straight from registers, 16-bit tiles through TMA,
    split-K's sums from registers after the exchange (``exchange_partials``)."""
    SPLIT_K = tile in SPLIT_TILES
    # m64n64 (split64: 32 accumulators a consumer thread) needs no register split: ptxas
    # sizes that kernel at 73 registers, and setmaxnreg.inc could then wait for registers
    # the block was never given.
    REGISTER_SPLIT = geometry(dtype, tile)[1] > 64
    pipe = wgmma_pipeline(dtype, a_kmajor, b_kmajor, geometry(dtype, tile), SPLIT_K)
    ACC = pipe.ACC
    INTEGER, store_scaled = pipe.integer, pipe.store_scaled
    layout, init_barriers, schedule, origin = (pipe.layout, pipe.init_barriers, pipe.schedule,
                                               pipe.origin)
    item = pipe.item
    produce, descriptors, consume_tile = pipe.produce, pipe.descriptors, pipe.consume_tile
    store_direct, store_staged, staging = pipe.store_direct, pipe.store_staged, pipe.staging
    exchange_partials = pipe.exchange_partials
    name = f"_matmul_wgmma_fwd_kernel_{dtype}_{'n' if a_kmajor else 't'}" \
           f"{'t' if b_kmajor else 'n'}_{tile}"

    @device_function
    def store_tile(tmap_c, out, kind, m0, n0, M, N, consumer, row, col, stage_buffer,
                   stage_row, stage_xor, issuer, alpha, scale_a, sa_mode, scale_b, sb_mode,
                   bias, has_bias, acc):
        """The epilogue of one output tile (the ring is already refilling for the next).
        s8 stores every kind from registers, scaling on the way (one pass over acc)."""
        if INTEGER:
            r0 = m0 + row
            col_step = uint64(4 if sb_mode > SCALE_TENSOR else 0)
            first_col = uint64(n0 + col)
            store_scaled(out, kind, m0, n0, row, col, M, N, acc,
                         row_scale(scale_a, sa_mode, r0, M, alpha),
                         row_scale(scale_a, sa_mode, r0 + 8, M, alpha),
                         scale_b + first_col * col_step, col_step,
                         uint32(sb_mode != SCALE_NONE), bias + first_col * uint64(4),
                         uint32(has_bias))
        elif kind == OUT_F32:
            store_direct(out, m0, n0, row, col, M, N, acc)
        else:
            store_staged(tmap_c, kind, m0, n0, consumer, stage_buffer, stage_row,
                         stage_xor, issuer, acc)

    @kernel([_SIGNATURE], name=name, arch_specific=True, min_cc=(9, 0), address_scalars=True,
            max_dynamic_shared_bytes=pipe.SHARED_BYTES, launch_bounds=THREADS)
    def _matmul_wgmma_fwd_kernel(tmap_a, tmap_b, tmap_c, out, M, N, K, kind, alpha, scale_a,
                                 sa_mode, scale_b, sb_mode, bias, has_bias, kps):
        smem = cuda.shared.array(0, uint8)
        ring, full, empty = layout(int32(shared_addr(smem, 0)))
        tid = int32(cuda.threadIdx.x)
        lane = tid % 32
        # The warpgroup index, broadcast from lane 0: ptxas then knows every branch on it
        # is warp-uniform (it serializes wgmma behind branches it cannot prove uniform).
        warpgroup = cuda.shfl_sync(0xFFFFFFFF, tid // 128, 0)
        init_barriers(full, empty)
        # Each role computes its schedule after setmaxnreg: values live across the split
        # would have to fit the producer's few registers.
        if warpgroup == 0:
            if REGISTER_SPLIT:
                setmaxnreg_dec(PRODUCER_REGISTERS)  # the producer's registers go to consumers
            if tid < 32:
                produce(ring, full, empty, tmap_a, tmap_b, M, N, K, kps)
        else:
            if REGISTER_SPLIT:
                setmaxnreg_inc(CONSUMER_REGISTERS)
            consumer = warpgroup - 1
            a_desc, b_desc = descriptors(ring, consumer)
            row = consumer * 64 + 16 * (tid // 32 % 4) + lane // 4  # of the tile
            col = 2 * (lane % 4)
            issuer = tid % 128 == 0  # issues this consumer's TMA stores
            stage_buffer, stage_row, stage_xor = staging(ring, consumer, row, col)
            acc = accumulator_zeros_s32(ACC) if INTEGER else accumulator_zeros(ACC)
            step = int32(0)
            if SPLIT_K:
                nk = item(M, N, K, kps)[3]
                acc, step = consume_tile(a_desc, b_desc, full, empty, step, nk, acc)
                exchange_partials(ring, empty, out, kind, M, N, K, kps, consumer, row, col,
                                  acc)
            else:
                tiles_m, tiles_n, cluster_tiles, first_tile, clusters, n_ktiles, rank = (
                    schedule(M, N, K))
                for t in range(first_tile, cluster_tiles, clusters):
                    m0, n0 = origin(t, tiles_m, tiles_n, rank)
                    acc, step = consume_tile(a_desc, b_desc, full, empty, step, n_ktiles, acc)
                    store_tile(tmap_c, out, kind, m0, n0, M, N, consumer, row, col,
                               stage_buffer, stage_row, stage_xor, issuer, alpha, scale_a,
                               sa_mode, scale_b, sb_mode, bias, has_bias, acc)
            if issuer:
                cp_async_bulk_wait_group(0)
        if not SPLIT_K:
            # No CTA leaves while another may still arrive on its barriers or multicast
            # into it (split-K's CTAs touch each other only in their exchange).
            cluster_arrive()
            cluster_wait()

    _matmul_wgmma_fwd_kernel.block_tile = geometry(dtype, tile)[:3]
    return _matmul_wgmma_fwd_kernel


@device_function
def row_scale(scale_a, sa_mode, r, M, alpha):
    """alpha times row ``r``'s scale (mode SCALE_NONE: 1, SCALE_TENSOR: the one at
    ``scale_a``, else ``scale_a[r]``; rows past M read nothing)."""
    if sa_mode == SCALE_NONE:
        return float32(alpha)
    at = 0 if sa_mode == SCALE_TENSOR else min(r, M - 1)
    return float32(alpha) * ld_global_nc_f32(scale_a + uint64(int64(at) * 4))


# Every variant: dtype × layout (NN, NT, TN, TT) × tile class; s8 (W8A8) reads K-major
# tiles only and does not split K.
_KERNELS = {
    (dtype, a_k, b_k, tile): _make_matmul_wgmma_kernel(dtype, a_k, b_k, tile)
    for dtype in ("f16", "bf16", "s8")
    for a_k in (True, False)
    for b_k in (False, True)
    for tile in TILES
    if dtype != "s8" or (a_k and b_k and tile not in SPLIT_TILES)
}


def split_count(m: int, n: int, k: int, ctas: int, dtype: str = "f16",
                splits: int | None = None, tile: str = "split") -> tuple:
    """(splits, k-tiles per split) of the split tile for an M×N×K product on a grid of at
    most ``ctas`` CTAs: SPLIT_ITEMS_PER_SM work items per CTA, at most MAX_SPLITS, each
    split at least MIN_SPLIT_KTILES k-tiles — or ``splits`` (tests, benchmarks), at most
    MAX_SPLITS and one per k-tile. The splits make a cluster; the last may be shorter."""
    bm, bn, bk, _ = geometry(dtype, tile)
    n_ktiles = -(-k // bk)
    if splits is None:
        tiles = -(-m // bm) * -(-n // bn)
        splits = min(SPLIT_ITEMS_PER_SM * ctas // tiles, n_ktiles // MIN_SPLIT_KTILES,
                     MAX_SPLITS)
    splits = max(1, min(splits, n_ktiles, MAX_SPLITS))
    return splits, -(-n_ktiles // splits)


def choose_tile(m: int, n: int, sms: int, k: int | None = None) -> str | None:
    """The tile class for an M×N output on ``sms`` SMs, or None where the grid would leave
    most SMs idle (mma.sync with split-K serves those shapes better). ``k``: the K of a
    16-bit product, whose grids of a fifth to half a wave of narrow tiles with M > 16 split
    K from SPLIT_MIN_KTILES k-tiles (the constants above; None: no split-K, as for s8):
    in 128×64 tiles where MAX_SPLITS splits of them fit one wave, else in 128×128."""
    narrow = math.ceil(m / TILES["narrow"][0]) * math.ceil(n / TILES["narrow"][1])
    if (k is not None and m > SPLIT_MIN_M
            and SPLIT_MIN_BLOCKS_PER_SM * sms <= narrow <= SPLIT_MAX_BLOCKS_PER_SM * sms):
        ktiles = -(-k // geometry("f16", "split")[2])
        if ktiles >= SPLIT_MIN_KTILES:  # up to MAX_SPLITS splits of MIN_SPLIT_KTILES
            bm, bn = TILES["split64"][:2]
            if MAX_SPLITS * math.ceil(m / bm) * math.ceil(n / bn) <= sms:
                return "split64"
            return "split"
    for tile, least in (("wide", WIDE_MIN_BLOCKS_PER_SM), ("narrow", NARROW_MIN_BLOCKS_PER_SM)):
        bm, bn = TILES[tile][:2]
        if math.ceil(m / bm) * math.ceil(n / bn) >= least * sms:
            return tile
    return None


class LaunchPlan(NamedTuple):
    """Everything a launch needs that does not depend on the output: the operands' tensor
    maps (held, so they stay alive while the plan is cached), the grid, the kernel, and
    for the split tile its split-K layout."""

    compiled: object
    shared: int
    grid: int
    tmap_a: object
    tmap_b: object
    m: int
    n: int
    k: int
    shape: tuple  # the caller's output shape (M×N, or a batch folded into M)
    kps: int = 0  # split tile: k-tiles per split (else 0)
    cluster: tuple = CLUSTER  # the launch's cluster shape (split tile: its splits)


def launch(dtype: str, tile: str, sa, lda: int, a_kmajor: bool, sb, ldb: int, b_kmajor: bool,
           out, m: int, n: int, k: int, kind: int, shape: tuple | None = None,
           dequant: tuple = NO_DEQUANT, splits: int | None = None) -> LaunchPlan:
    """Launch the variant for storage matrices ``sa`` (A: M×K K-major or K×M) and ``sb``
    (B: N×K K-major or K×N), both TMA-compatible (``_tensor_map.tma_compatible``), and a
    row-major M×N output ``out`` of ``kind`` whose rows are whole 16-byte chunks. The grid
    is persistent: as many clusters as fit on the GPU at once, or fewer where there are
    fewer cluster tiles (split tile: one CTA per work item, a cluster per output tile).
    Returns the plan, which :func:`run`
    launches again for another output of ``shape`` (default (m, n)): any C-contiguous
    array of m·n elements. ``dequant``: the s8 kernels' scale and bias arguments (kernel
    doc). ``splits``: the split tile's K splits (default :func:`split_count`'s)."""
    bm, bn, bk, _ = geometry(dtype, tile)
    compiled = _KERNELS[(dtype, a_kmajor, b_kmajor, tile)][0]
    shared = compiled.kdef.max_dynamic_shared_bytes
    tmap_a = tensor_map_2d(sa, lda, a_box_rows(m, bm) if a_kmajor else bk)
    tmap_b = tensor_map_2d(sb, ldb, bn // CLUSTER_M if b_kmajor else bk)
    most = compiled.max_active_clusters(CLUSTER, THREADS, shared) * CLUSTER_M
    kps, cluster = 0, CLUSTER
    if tile in SPLIT_TILES:  # one CTA per (tile, split), a cluster per tile
        given, (splits, kps) = splits, split_count(m, n, k, most, dtype, splits, tile)
        # The kernel's exchange pairs the splits; its item() recomputes them from kps.
        n_ktiles = -(-k // bk)
        assert splits <= MAX_SPLITS and -(-n_ktiles // kps) == splits, (splits, kps)
        if tile == "split64" and given is None and splits < MAX_SPLITS:
            # choose_tile counted SMs; fewer CTAs fit at once (clusters, MPS), or K has too
            # few k-tiles for two splits: the 128×128 tiles keep their splits where 128×64
            # ones would lose theirs (or run unsplit as well).
            return launch(dtype, "split", sa, lda, a_kmajor, sb, ldb, b_kmajor, out, m, n, k,
                          kind, shape, dequant)
        grid = -(-m // bm) * -(-n // bn) * splits
        cluster = (splits, 1, 1)
    else:
        cluster_tiles = -(-m // (bm * CLUSTER_M)) * -(-n // bn)  # ceil divisions
        grid = min(cluster_tiles * CLUSTER_M, most)
    plan = LaunchPlan(compiled, shared, grid, tmap_a, tmap_b, m, n, k,
                      (m, n) if shape is None else tuple(shape), kps, cluster)
    run(plan, out, kind, dequant)
    return plan


def run(plan: LaunchPlan, out, kind: int, dequant: tuple = NO_DEQUANT) -> None:
    """Launch ``plan`` writing ``out`` (M×N, kind, rows whole 16-byte chunks)."""
    if kind == OUT_F32 or plan.kps:  # f32 and the split tile's sums: stored from registers
        tmap_c = 0
    else:  # a batch folded into M is stored as one (m, n) matrix
        tmap_c = tensor_map_2d(out if out.ndim == 2 else out.reshape(plan.m, plan.n), plan.n,
                               64).ptr
    plan.compiled((plan.grid,), THREADS,
                  (plan.tmap_a.ptr, plan.tmap_b.ptr, tmap_c, out.ptr, plan.m, plan.n, plan.k,
                   kind) + dequant + (plan.kps,), shared_mem=plan.shared, cluster=plan.cluster)
