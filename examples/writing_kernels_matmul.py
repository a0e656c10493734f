"""A small tensor-core matmul written against kaionb's helpers (docs/writing-kernels.md).

C (M×N, f16) = A (M×K, f16) · B (K×N, f16), f32 accumulation, any M; K and N multiples
of 8 (16-byte rows for cp.async). Each 128-thread block computes a 64×64 tile of C; each
of its four warps a 32×32 sub-tile as 2×4 m16n8k16 mmas per k-step of 16:

    cp.async 16-byte chunks   global -> swizzled shared tiles (zero-filled at the edges)
    ldmatrix.x4 / .x4.trans   shared -> A and B fragments
    mma.sync m16n8k16         f32 accumulators in registers
    cvt.rn.f16x2.f32 + st     accumulators -> packed f16 output (bounds-checked)

Single-stage (load, wait, compute): the next steps for speed are a 2-3 stage cp.async
pipeline and larger warp tiles. Run: ``python examples/writing_kernels_matmul.py``;
it checks against NumPy float64 and prints the error and time, and exits 0 without a GPU.
"""

import math
import sys

import numpy as np
from numba import cuda, float32, uint16

from kaionb.kernels.helpers import (
    cp_async_tile_16b,
    ldmatrix_x4_row_col,
    store_c_frag_f16,
    swizzled_index,
)
from kaionb.ptx_patches import (
    cp_async_commit_group,
    cp_async_wait_all,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_m16n8k16_f32_f16,
    shared_addr,
)

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32  # a 64×64 C tile per block, K in steps of 32
WARP_M, WARP_N = 32, 32  # 2×2 warps; each warp: 2 (m16) × 4 (n8) mma tiles
THREADS = 128
# Shared-array sizes must be compile-time constants: name the products.
SA_ELEMS, SB_ELEMS = BLOCK_M * BLOCK_K, BLOCK_K * BLOCK_N


@cuda.jit
def _matmul_f16_kernel(a, b, c):
    # sA: [BLOCK_M][BLOCK_K], sB: [BLOCK_K][BLOCK_N], both swizzled (helpers.tiles).
    sA = cuda.shared.array(SA_ELEMS, uint16)
    sB = cuda.shared.array(SB_ELEMS, uint16)
    acc = cuda.local.array((2, 4, 4), float32)  # [m16 tile][n8 tile][fragment element]
    for i in range(2):
        for j in range(4):
            for e in range(4):
                acc[i, j, e] = 0.0

    tid = cuda.threadIdx.x
    lane, warp = tid % 32, tid // 32
    wm, wn = (warp // 2) * WARP_M, (warp % 2) * WARP_N
    m0, n0 = cuda.blockIdx.y * BLOCK_M, cuda.blockIdx.x * BLOCK_N
    row, col = ldmatrix_x4_row_col(lane)  # the row/column this lane addresses

    for k0 in range(0, a.shape[1], BLOCK_K):
        cp_async_tile_16b(sA, a, m0, k0, BLOCK_M, BLOCK_K, tid, THREADS)
        cp_async_tile_16b(sB, b, k0, n0, BLOCK_K, BLOCK_N, tid, THREADS)
        cp_async_commit_group()
        cp_async_wait_all()
        cuda.syncthreads()
        for kk in range(0, BLOCK_K, 16):
            a0 = ldmatrix_x4(shared_addr(sA, swizzled_index(wm + row, kk + col, BLOCK_K)))
            a1 = ldmatrix_x4(shared_addr(sA, swizzled_index(wm + 16 + row, kk + col, BLOCK_K)))
            for nb in range(2):
                # .trans on the [k][n] tile: (b0, b1) of n-tile 2nb and (b2, b3) of 2nb+1.
                bq = ldmatrix_x4_trans(
                    shared_addr(sB, swizzled_index(kk + row, wn + 16 * nb + col, BLOCK_N))
                )
                for h in range(2):
                    bf = (bq[0], bq[1]) if h == 0 else (bq[2], bq[3])
                    j = 2 * nb + h
                    for i in range(2):
                        af = a0 if i == 0 else a1
                        d = mma_m16n8k16_f32_f16(
                            af, bf, (acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
                        )
                        for e in range(4):
                            acc[i, j, e] = d[e]
        cuda.syncthreads()  # the tiles are overwritten by the next k-step

    for i in range(2):
        for j in range(4):
            frag = (acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
            store_c_frag_f16(c, m0 + wm + 16 * i, n0 + wn + 8 * j, lane, frag)


def matmul_f16(a, b, c):
    """Launch on device arrays of uint16 (f16 bits): a (M, K), b (K, N), c (M, N)."""
    (m, k), n = a.shape, b.shape[1]
    if k % 8 or n % 8 or b.shape[0] != k or c.shape != (m, n):
        raise ValueError(f"matmul_f16: need K, N multiples of 8, got a {a.shape}, b {b.shape}")
    grid = (math.ceil(n / BLOCK_N), math.ceil(m / BLOCK_M))
    _matmul_f16_kernel[grid, THREADS](a, b, c)


def check(m, n, k, rng):
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = cuda.to_device(np.full((m, n), 0x7E00, np.uint16))  # poisoned with f16 NaN
    matmul_f16(cuda.to_device(a.view(np.uint16)), cuda.to_device(b.view(np.uint16)), c)
    got = c.copy_to_host().view(np.float16).astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # f32 accumulation, one f16 rounding of the output: error scales with sqrt(K).
    err = np.max(np.abs(got - ref) / (np.abs(ref) + np.sqrt(k)))
    return err, bool(np.isfinite(got).all())


def main():
    if not cuda.is_available():
        print("writing_kernels_matmul: no CUDA GPU here; nothing to run (exit 0).")
        return 0
    rng = np.random.default_rng(0)
    ok = True
    for m, n, k in [(64, 64, 32), (100, 72, 40), (1000, 1016, 520)]:
        err, finite = check(m, n, k, rng)
        good = finite and err < 2e-3
        ok &= good
        print(f"M={m} N={n} K={k}: max scaled error {err:.2e} vs NumPy float64 "
              f"{'OK' if good else 'FAIL'}")

    size = 2048
    a = cuda.to_device(rng.standard_normal((size, size)).astype(np.float16).view(np.uint16))
    b = cuda.to_device(rng.standard_normal((size, size)).astype(np.float16).view(np.uint16))
    c = cuda.device_array((size, size), np.uint16)
    matmul_f16(a, b, c)  # compile + warm up
    start, stop = cuda.event(), cuda.event()
    times = []
    for _ in range(10):
        start.record()
        matmul_f16(a, b, c)
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    ms = float(np.median(times))
    print(f"{size}^3 f16: {ms:.3f} ms median of 10, {2 * size**3 / ms / 1e9:.1f} TFLOP/s "
          "(single-stage teaching kernel, not tuned)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
