"""Tensor-core matmul: ``a @ b`` for f16/bf16 on mma.sync, any shape, transposed views free.

Checks kaionb.matmul against NumPy float64 on odd shapes and every layout (a.T, b.T are
views, not copies), then times 4096³ and prints TFLOP/s. Exits 0 without a GPU.

    python examples/matmul.py
"""

import sys
import time

import numpy as np

import kaionb
from kaionb.kernels.matmul import matmul, matmul_ref, matmul_tc_bf16_async
from kaionb.testing import random_array, relative_error


def main():
    if not kaionb.gpu_available():
        print("examples/matmul.py: no CUDA GPU here; nothing to run (exit 0).")
        return 0
    rng = np.random.default_rng(0)
    ok = True
    for m, n, k in [(17, 9, 31), (1023, 1025, 1027), (1, 4096, 4096)]:
        for dtype, tol in ((np.float16, 1e-3), (kaionb.bfloat16, 5e-3)):
            a = random_array((m, k), dtype, rng=rng)
            b = random_array((k, n), dtype, rng=rng)
            da = kaionb.asarray(a)
            db_t = kaionb.asarray(np.ascontiguousarray(b.T))  # B stored N×K
            for name, x, y in (("a @ b", da, kaionb.asarray(b)), ("a @ (bᵀ)ᵀ", da, db_t.T)):
                err = relative_error((x @ y).get(), matmul_ref(a, b))
                ok &= err < tol
                print(f"{m}x{n}x{k} {np.dtype(dtype).name:8} {name:10} rel err {err:.1e} "
                      f"{'OK' if err < tol else 'FAIL'}")

    size = 4096
    a = kaionb.asarray(random_array((size, size), kaionb.bfloat16, rng=rng))
    b = kaionb.asarray(random_array((size, size), kaionb.bfloat16, rng=rng))
    out = kaionb.empty((size, size), kaionb.bfloat16)
    for _ in range(3):
        matmul_tc_bf16_async(a, b, out=out)
    kaionb.current_stream().synchronize()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        matmul(a, b, out=out)
    kaionb.current_stream().synchronize()
    seconds = (time.perf_counter() - t0) / reps
    print(f"{size}^3 bf16 -> bf16: {seconds * 1e3:.2f} ms, "
          f"{2 * size**3 / seconds / 1e12:.0f} TFLOP/s (mma.sync, f32 accumulation)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
