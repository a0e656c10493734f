"""A tensor-parallel MLP block on one GPU and on two, from one process, kaionb alone.

    python benchmarks/multi_gpu_mlp.py [--tokens 8192] [--hidden 8192] [--inter 28672]
                                       [--reps 10] [--json FILE]

The block is LLaMA's feed-forward, bf16: ``y = (silu(x·Wg) ⊙ (x·Wu))·Wd``, 3 GEMMs of
2·tokens·hidden·inter FLOPs each. On two GPUs Wg and Wu are split by columns and Wd by
rows (Megatron's column- then row-parallel split): each GPU computes a partial y from
its halves, device 1's partial is copied to device 0 (``DeviceArray.to``: peer-to-peer)
and added there — the all-reduce a two-GPU inference step needs, done by kaionb alone
(examples/tensor_parallel_mlp.py does it through NCCL under torchrun).

One thread issues both GPUs' kernels: launches are asynchronous, so the GPUs run at once.
Time: wall clock over ``reps`` steps after a warm-up, both devices synchronized, median
of 5 batches. Printed: the 1-GPU step, the 2-GPU step, the speed-up, and the share of the
2-GPU step the reduction (copy + add) takes when timed alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import kaionb


def seconds_per_step(step, devices, reps: int, batches: int = 5) -> float:
    """Median wall time of one ``step()`` over ``batches`` runs of ``reps`` steps."""
    def synchronize():
        for d in devices:
            with kaionb.device(d):
                kaionb.current_stream().synchronize()

    for _ in range(2):
        step()
    synchronize()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        synchronize()
        samples.append((time.perf_counter() - t0) / reps)
    return statistics.median(samples)


def mlp(x, w_gate, w_up, w_down, buffers=None):
    """One device's share of the block (all arrays on one device); ``buffers``: (g, u, h,
    y) outputs to write, as an inference engine keeps them, else new arrays."""
    g, u, h, y = buffers or (None,) * 4
    h = kaionb.fused_silu_gate(kaionb.matmul(x, w_gate, out=g), kaionb.matmul(x, w_up, out=u),
                               out=h)
    return kaionb.matmul(h, w_down, out=y)


def buffers_for(x, w_gate, w_down):
    """(g, u, h, y) output buffers for :func:`mlp` on x's device."""
    t, f = x.shape[0], w_gate.shape[1]
    with kaionb.device(x.device_id):
        return tuple(kaionb.empty(shape, x.dtype) for shape in
                     ((t, f), (t, f), (t, f), (t, w_down.shape[1])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--inter", type=int, default=28672)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--allocate", action="store_true",
                        help="every op allocates its output (default: out= buffers)")
    args = parser.parse_args()
    if kaionb.device_count() < 2:
        print(f"multi_gpu_mlp: needs 2 GPUs, this machine has {kaionb.device_count()}")
        return 0
    t, d, f = args.tokens, args.hidden, args.inter
    half = f // 2
    bf16 = kaionb.bfloat16
    rng = kaionb.random.default_rng(0)
    # Weights scaled so activations stay O(1) through the block.
    x0 = rng.standard_normal((t, d), np.float32).astype(bf16)
    w_gate = (rng.standard_normal((d, f), np.float32) * (d ** -0.5)).astype(bf16)
    w_up = (rng.standard_normal((d, f), np.float32) * (d ** -0.5)).astype(bf16)
    w_down = (rng.standard_normal((f, d), np.float32) * (f ** -0.5)).astype(bf16)

    # Device 0 holds the first halves, device 1 the second; x is replicated.
    shards = [(x0, w_gate[:, :half].copy(), w_up[:, :half].copy(), w_down[:half].copy())]
    shards.append(tuple(a.to(1) for a in (x0, w_gate[:, half:], w_up[:, half:],
                                          w_down[half:])))

    buffers = [None, None, None]
    if not args.allocate:
        buffers = [buffers_for(x0, w_gate, w_down)] + [
            buffers_for(p[0], p[1], p[3]) for p in shards]

    def one_gpu():
        return mlp(x0, w_gate, w_up, w_down, buffers[0])

    def two_gpus():
        partial0 = mlp(*shards[0], buffers[1])
        partial1 = mlp(*shards[1], buffers[2])  # runs on device 1 while device 0 works
        return kaionb.add(partial0, partial1.to(0), out=partial0)

    # Correctness: the two-GPU block against the one-GPU block (the same bf16 GEMMs, the
    # sum split differently) — relative error in f32.
    ref = one_gpu().astype(np.float32)
    got = two_gpus().astype(np.float32)
    rel = float(kaionb.sqrt(kaionb.sum((got - ref) ** 2) / kaionb.sum(ref ** 2)).item())

    partial0, partial1 = mlp(*shards[0]), mlp(*shards[1])

    def reduce_only():
        kaionb.add(partial0, partial1.to(0), out=partial0)

    t1 = seconds_per_step(one_gpu, [0], args.reps)
    t2 = seconds_per_step(two_gpus, [0, 1], args.reps)
    t_reduce = seconds_per_step(reduce_only, [0, 1], args.reps)
    flops = 3 * 2 * t * d * f
    result = {
        "shape": {"tokens": t, "hidden": d, "inter": f, "dtype": "bfloat16"},
        "outputs": "allocated" if args.allocate else "out= buffers",
        "device": kaionb.Device(0).name,
        "peer_access": bool(kaionb.Device(0).can_access_peer(1)),
        "one_gpu_ms": t1 * 1e3, "two_gpu_ms": t2 * 1e3, "speedup": t1 / t2,
        "reduce_ms": t_reduce * 1e3, "reduce_share": t_reduce / t2,
        "one_gpu_tflops": flops / t1 / 1e12, "two_gpu_tflops": flops / t2 / 1e12,
        "rel_err_two_vs_one": rel,
    }
    print(f"{t}x{d}x{f} bf16 on {result['device']} (peer access: {result['peer_access']}, "
          f"{result['outputs']})")
    print(f"  1 GPU  {t1 * 1e3:8.2f} ms  {result['one_gpu_tflops']:6.1f} TFLOP/s")
    print(f"  2 GPUs {t2 * 1e3:8.2f} ms  {result['two_gpu_tflops']:6.1f} TFLOP/s  "
          f"speed-up {t1 / t2:.2f}x  (reduction {t_reduce * 1e3:.2f} ms = "
          f"{100 * t_reduce / t2:.1f}% of the step)")
    print(f"  2-GPU result vs 1-GPU: relative error {rel:.2e}")
    print("RESULT " + json.dumps(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0 if rel < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
