"""Fused AdamW for mixed-precision training: float32 master weights, bfloat16 gradients,
and the bfloat16 model weights written in the same pass. 100 steps checked against float64
NumPy, then one step timed on 64M parameters beside a device-to-device copy.

    python examples/adamw.py
"""

import statistics
import time

import numpy as np

from _primitive_demo import no_gpu_exit

no_gpu_exit()
import kaionb  # noqa: E402
from kaionb.array import bfloat16  # noqa: E402
from kaionb.kernels.optim import adamw_ref, adamw_step  # noqa: E402
from kaionb.testing import assert_close  # noqa: E402

HYPER = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
rng = np.random.default_rng(0)

# -- 100 steps on 1M + 3 parameters against the float64 reference --------------------------
n = (1 << 20) + 3
p0 = rng.standard_normal(n).astype(np.float32)
p, m, v = kaionb.asarray(p0), kaionb.zeros(n, np.float32), kaionb.zeros(n, np.float32)
weights = kaionb.empty(n, bfloat16)
ref = (p0, np.zeros(n), np.zeros(n))
for step in range(1, 101):
    g = (0.1 * rng.standard_normal(n)).astype(bfloat16)
    adamw_step(p, kaionb.asarray(g), m, v, step=step, model_param=weights, **HYPER)
    ref = adamw_ref(ref[0], g, *ref[1:], step=step, **HYPER)
errors = [assert_close(x, r, tol=1e-5, what=name) for x, r, name in zip((p, m, v), ref,
                                                                        ("param", "m", "v"))]
assert np.array_equal(weights.get().view(np.uint16), p.get().astype(bfloat16).view(np.uint16))
print("100 steps: relative error vs float64 NumPy: param {:.1e}, m {:.1e}, v {:.1e}; "
      "bf16 weights = param rounded".format(*errors))


# -- timing: 64M parameters --------------------------------------------------------------------
def median_us(call, reps=20):
    call()
    kaionb.current_stream().synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        kaionb.current_stream().synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


n = 1 << 26
p, m, v = kaionb.zeros(n, np.float32), kaionb.zeros(n, np.float32), kaionb.zeros(n, np.float32)
g, weights = kaionb.zeros(n, bfloat16).fill(0.01), kaionb.empty(n, bfloat16)
# Read p, m, v (4 bytes each) and g (2); write p, m, v and the bf16 weights.
nbytes = n * (3 * 4 + 2 + 3 * 4 + 2)
state = {"step": 0}


def one_step():
    state["step"] += 1
    adamw_step(p, g, m, v, step=state["step"], model_param=weights, **HYPER)


us = median_us(one_step)
src = kaionb.empty(nbytes // 2, np.uint8)  # a copy of the same traffic: nbytes/2 each way
copy_us = median_us(lambda: src.copy())
print(f"adamw_step, {n >> 20}M params (bf16 grads and weights): {us:.0f} us, "
      f"{nbytes / us / 1e3:.0f} GB/s; a device-to-device copy of {nbytes >> 21} MiB: "
      f"{copy_us:.0f} us ({nbytes / copy_us / 1e3:.0f} GB/s) -> {copy_us / us:.0%} of copy")
