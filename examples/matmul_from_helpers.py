"""A tensor-core matmul kernel written from kaionb's shared pipeline helpers, in ~25 lines
(docs/writing-kernels.md, "The tensor-core pipelines"): the cp.async + ldmatrix + mma.sync
mainloop of ``helpers.mma_pipeline``, and a plain f32 epilogue. Checks it against NumPy
float64 on an odd shape. Exits 0 without a GPU.

    python examples/matmul_from_helpers.py
"""

import math
import sys

import numpy as np
from numba import cuda, float32, int32, uint8

import kaionb
from kaionb.kernels.helpers import OUT_F32, chunk_coords, store_row_chunk8
from kaionb.kernels.helpers.mma_pipeline import mma_pipeline
from kaionb.kernels.launch import kernel
from kaionb.testing import random_array, relative_error

BM = BN = 64
pipe = mma_pipeline("f16", True, False, "async", (BM, BN, 32, 2, 2, 4))
mainloop, stage = pipe.mainloop, pipe.stage_accumulators
MT, NT, CS, THREADS = pipe.MT, pipe.NT, pipe.CS, pipe.THREADS


@kernel(["void(uint16[:, :, :], uint16[:, :, :], float32[:, ::1], uint16[:, ::1], "
         "int32, int32, int32)"], max_dynamic_shared_bytes=pipe.SHARED_BYTES,
        launch_bounds=THREADS)
def _example_matmul_fwd_kernel(a, b, out, unused16, M, N, K):
    smem = cuda.shared.array(0, uint8)
    acc = cuda.local.array((MT, NT, 4), float32)
    for i in range(MT):
        for j in range(NT):
            for e in range(4):
                acc[i, j, e] = float32(0.0)
    m0, n0 = int32(cuda.blockIdx.y) * BM, int32(cuda.blockIdx.x) * BN
    mainloop(smem, a, b, 0, K, N, m0, n0, 0, K, M, N, 1, acc)  # lda = K, ldb = N
    cuda.syncthreads()
    cs = cuda.shared.array(0, float32)
    stage(cs, acc)
    cuda.syncthreads()
    for q in range(BM * BN // 8 // THREADS):  # the epilogue hook: a plain f32 store
        r, c = chunk_coords(int32(cuda.threadIdx.x) + q * THREADS, BN)
        store_row_chunk8(out, unused16, OUT_F32, m0 + r, n0 + c, M, N, 0, cs, r * CS + c)


def example_matmul(a, b):
    """a (M×K) @ b (K×N), float16 row-major with K and N multiples of 8, float32 result."""
    (m, k), n = a.shape, b.shape[1]
    out = kaionb.empty((m, n), np.float32)
    unused16 = out._view((0, 0), (2, 2), dtype=np.dtype(np.uint16))
    a3 = a._view((1, m, k), (0,) + a.strides)
    b3 = b._view((1, k, n), (0,) + b.strides)
    _example_matmul_fwd_kernel[0]((math.ceil(n / BN), math.ceil(m / BM)), (THREADS,),
                                  (a3, b3, out, unused16, m, n, k),
                                  shared_mem=pipe.SHARED_BYTES)
    return out


def main():
    if not kaionb.gpu_available():
        print("examples/matmul_from_helpers.py: no CUDA GPU here; nothing to run (exit 0).")
        return 0
    rng = np.random.default_rng(0)
    a = random_array((1000, 520), np.float16, rng=rng)
    b = random_array((520, 1016), np.float16, rng=rng)
    got = example_matmul(kaionb.asarray(a), kaionb.asarray(b)).get()
    err = relative_error(got, a.astype(np.float64) @ b.astype(np.float64))
    print(f"1000x1016x520 f16 -> f32: relative error {err:.2e} vs NumPy float64")
    return 0 if err < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
