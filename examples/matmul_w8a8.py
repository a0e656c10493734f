"""A W8A8 linear layer: an f16 weight [N, K] quantized per output channel and an f16
activation [M, K] per token with kaionb.quantize_int8, multiplied by kaionb.matmul_int8
(int32 sums, scales applied in the epilogue, f16 out) and compared with the f16 matmul
and a float64 reference; both timed.

    python examples/matmul_w8a8.py
"""

import numpy as np

from _primitive_demo import no_gpu_exit

no_gpu_exit()
import torch  # noqa: E402

import kaionb  # noqa: E402


def ms(fn, reps=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / reps


rng = np.random.default_rng(0)
m, n, k = 2048, 4096, 4096
x = rng.standard_normal((m, k)).astype(np.float16)
w = (rng.standard_normal((n, k)) * 0.02).astype(np.float16)
dx, dw = kaionb.asarray(x), kaionb.asarray(w)
qx, sx = kaionb.quantize_int8(dx, axis=0)  # per token
qw, sw = kaionb.quantize_int8(dw, axis=0)  # per output channel (rows of [N, K])
y8 = kaionb.matmul_int8(qx, qw.T, (sx, sw), dtype=np.float16)  # qw.T: a K-major view
y16 = kaionb.matmul(dx, dw.T)
ref = x.astype(np.float64) @ w.astype(np.float64).T


def rel(y):
    return np.linalg.norm(y.get().astype(np.float64) - ref) / np.linalg.norm(ref)


print(f"[{m}, {k}] @ [{k}, {n}]: relative error vs float64 — int8 {rel(y8):.2e}, "
      f"f16 {rel(y16):.2e}")
t8 = ms(lambda: kaionb.matmul_int8(qx, qw.T, (sx, sw), out=y8))
t16 = ms(lambda: kaionb.matmul(dx, dw.T, out=y16))
print(f"matmul_int8 {t8 * 1e3:.1f} µs, f16 matmul {t16 * 1e3:.1f} µs ({t16 / t8:.2f}x)")
