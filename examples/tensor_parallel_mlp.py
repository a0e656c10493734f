"""Tensor-parallel Llama MLP on several GPUs: kaionb kernels, torch.distributed (NCCL) sums.

The block y = (silu(x·W_gate) ⊙ x·W_up)·W_down is split Megatron-style (Shoeybi et al.
2019, https://arxiv.org/abs/1909.08053): W_gate and W_up by columns, W_down by rows. Each
GPU then computes a partial y from its slice of the intermediate width, with no traffic
between the matmuls, and one all-reduce sums the partials. kaionb runs the matmuls and the
fused SiLU gate on torch's current stream, so NCCL and kaionb stay in order without a
sync; the all-reduce works in place on kaionb's output, which torch sees through DLPack
(zero-copy: the same pointer).

    torchrun --nproc-per-node 2 examples/tensor_parallel_mlp.py           # check
    torchrun --nproc-per-node 2 examples/tensor_parallel_mlp.py --bench   # time

Default: a small odd shape (37 tokens, hidden 256, intermediate 688) in bfloat16. Every
rank checks its all-reduced y against float64 NumPy; rank 0 also against the same block on
one GPU. Exits 1 when a relative error is over its tolerance. --bench: 8192 tokens, hidden
8192, intermediate 28672 (Llama-3-70B's MLP); prints the median times of the block on one
GPU and on all of them, of the all-reduce alone, the speed-up, TFLOP/s, and one line
``RESULT {json}``. Without torch, NCCL or two GPUs, or outside torchrun: says so and exits 0.
"""

import argparse
import json
import os
import statistics
import sys

import numpy as np

import kaionb
from kaionb.kernels.activations import fused_silu_gate_ref
from kaionb.testing import relative_error

CHECK_SHAPE = (37, 256, 688)  # tokens, hidden, intermediate: 37 and 344 (688 / 2) fit no tile
BENCH_SHAPE = (8192, 8192, 28672)
SEED = 0
# ‖out − ref‖ / ‖ref‖. x·W_gate, x·W_up, the gate and y are each rounded to bfloat16; a
# NumPy model of those roundings at CHECK_SHAPE gives 3.9e-3 against float64, and 2.8e-3
# between two GPUs and one (there y is rounded per partial, then again after the sum).
TOL_VS_FLOAT64 = 2e-2
TOL_VS_ONE_GPU = 1e-2
WARMUP, REPS = 3, 20


def make_inputs(tokens, hidden, inter, *, on_device):
    """x, W_gate, W_up, W_down in bfloat16 on the current GPU, the same on every rank (one
    seed). Weights are scaled by 1/√fan-in so that activations stay near 1.
    ``on_device``: draw them there (kaionb.random); otherwise NumPy draws them and they
    are copied up (slow at the bench shape: 2·10⁹ values)."""
    shapes = [((tokens, hidden), 1.0), ((hidden, inter), hidden ** -0.5),
              ((hidden, inter), hidden ** -0.5), ((inter, hidden), inter ** -0.5)]
    if on_device:
        rng = kaionb.random.default_rng(SEED)
        return [rng.normal(0.0, scale, shape, kaionb.bfloat16) for shape, scale in shapes]
    rng = np.random.default_rng(SEED)
    return [kaionb.asarray((rng.standard_normal(shape) * scale).astype(kaionb.bfloat16))
            for shape, scale in shapes]


def shard(w_gate, w_up, w_down, rank, world):
    """This rank's weights: columns rank·n … (rank+1)·n of W_gate and W_up and the same
    rows of W_down (n = intermediate / world). Copies, so each shard owns its memory."""
    inter = w_gate.shape[1]
    if inter % world:
        raise ValueError(f"intermediate size {inter} does not split over {world} GPUs")
    part = slice(rank * inter // world, (rank + 1) * inter // world)
    return w_gate[:, part].copy(), w_up[:, part].copy(), w_down[part, :].copy()


def mlp(x, w_gate, w_up, w_down, *, out=None, dtype=None):
    """The block on one GPU: (silu(x·W_gate) ⊙ x·W_up)·W_down, result in ``dtype``
    (default: x's). fused_silu_gate(a, b) is a·sigmoid(a)·b: the SiLU goes on its first
    argument."""
    h = kaionb.fused_silu_gate(kaionb.matmul(x, w_gate), kaionb.matmul(x, w_up))
    return kaionb.matmul(h, w_down, out=out, dtype=dtype)


def mlp_ref(x, w_gate, w_up, w_down):
    """float64 NumPy reference of :func:`mlp` (DeviceArrays are read back)."""
    x, w_gate, w_up, w_down = (a.get().astype(np.float64) for a in (x, w_gate, w_up, w_down))
    return fused_silu_gate_ref(x @ w_gate, x @ w_up) @ w_down


def report(what, out, ref, tol):
    """Print one check line (tests/test_multi_gpu_examples.py reads it); True if it passed."""
    err = relative_error(out, ref)
    ok = err <= tol  # False for NaN
    print(f"{what}: relative error {err:.2e} (tolerance {tol:.0e}) {'OK' if ok else 'FAIL'}",
          flush=True)
    return ok


def unavailable(torch, dist):
    """Why this machine or launch cannot run the example, or None."""
    if torch is None:
        return "torch is not installed"
    if not (dist.is_available() and dist.is_nccl_available()):
        return "this torch has no NCCL backend"
    if kaionb.device_count() < 2:
        return f"needs 2 GPUs, this machine has {kaionb.device_count()}"
    if "LOCAL_RANK" not in os.environ:
        return "launch it with torchrun --nproc-per-node 2"
    if int(os.environ["WORLD_SIZE"]) > kaionb.device_count():
        return f"{os.environ['WORLD_SIZE']} ranks but {kaionb.device_count()} GPUs"
    return None


def time_ms(fn):
    """Median milliseconds of ``fn()`` on torch's current stream (CUDA events), after
    warm-up calls."""
    import torch

    for _ in range(WARMUP):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(REPS)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def check(rank, world, x, weights, y, tp_block):
    """Run the parallel block once; every rank checks its y, rank 0 against one GPU too.
    Returns whether every check passed on this rank."""
    tp_block()
    out = y.get()
    ok = report(f"rank {rank}: {world} GPUs vs float64", out, mlp_ref(x, *weights),
                TOL_VS_FLOAT64)
    if rank == 0:
        ok &= report(f"rank 0: {world} GPUs vs 1 GPU", out, mlp(x, *weights).get(),
                     TOL_VS_ONE_GPU)
    return ok


def bench(rank, world, x, weights, y, tp_block):
    """Time the block on all GPUs and the all-reduce alone; rank 0 also times the block on
    one GPU, checks that both gave the same y and prints the summary. Returns whether the
    check passed (True on the other ranks)."""
    import torch
    import torch.distributed as dist

    t_tp = time_ms(tp_block)
    spare = kaionb.zeros(y.shape, y.dtype)  # zeros: summing them in place leaves zeros
    spare_t = torch.from_dlpack(spare)
    t_allreduce = time_ms(lambda: dist.all_reduce(spare_t))
    if rank != 0:
        return True
    one_gpu_out = kaionb.empty(y.shape, y.dtype)
    t_one = time_ms(lambda: mlp(x, *weights, out=one_gpu_out))
    # No float64 reference at this size (3 · 4·10¹² flops on the host): y holds the last
    # parallel run, one_gpu_out the last one-GPU run.
    ok = report(f"rank 0: {world} GPUs vs 1 GPU", y.get(), one_gpu_out.get(), TOL_VS_ONE_GPU)
    tokens, hidden = x.shape
    inter = weights[0].shape[1]
    flops = 2 * tokens * hidden * inter * 3  # three matmuls
    result = {
        "device": kaionb.Device().name, "torch": torch.__version__, "world": world,
        "tokens": tokens, "hidden": hidden, "intermediate": inter, "dtype": "bfloat16",
        "t_one_gpu_ms": t_one, "t_tp_ms": t_tp, "t_allreduce_ms": t_allreduce,
        "speedup": t_one / t_tp, "allreduce_share": t_allreduce / t_tp,
        "tflops_one_gpu": flops / t_one / 1e9, "tflops_tp": flops / t_tp / 1e9,
    }
    print(f"[{tokens}, {hidden}] x [{hidden}, {inter}] MLP, bfloat16, {result['device']}")
    print(f"1 GPU:       {t_one:7.2f} ms  {result['tflops_one_gpu']:5.0f} TFLOP/s")
    print(f"{world} GPUs:      {t_tp:7.2f} ms  {result['tflops_tp']:5.0f} TFLOP/s (all GPUs), "
          f"speed-up {result['speedup']:.2f}x")
    print(f"all-reduce:  {t_allreduce:7.2f} ms  ({100 * result['allreduce_share']:.0f}% of "
          f"the {world}-GPU block)")
    print("RESULT " + json.dumps(result), flush=True)
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", action="store_true", help="time the 8192-token block")
    args = parser.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        torch = dist = None
    reason = unavailable(torch, dist)
    if reason:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"examples/tensor_parallel_mlp.py: {reason}; nothing to run (exit 0).")
        return 0

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    kaionb.set_device(local_rank)
    # One stream for both libraries: torch.distributed orders NCCL after torch's current
    # stream and that stream after NCCL, so kaionb's work on it needs no extra sync.
    with kaionb.stream(torch.cuda.current_stream()):
        x, *weights = make_inputs(*(BENCH_SHAPE if args.bench else CHECK_SHAPE),
                                  on_device=args.bench)
        shards = shard(*weights, rank, world)
        y = kaionb.empty(x.shape, kaionb.bfloat16)  # [tokens, hidden], as x
        y_t = torch.from_dlpack(y)
        if y_t.data_ptr() != y.ptr:
            raise RuntimeError("torch.from_dlpack copied the kaionb array")

        def tp_block():
            mlp(x, *shards, out=y)  # this rank's partial y ...
            dist.all_reduce(y_t)  # ... summed over the ranks, in place

        if args.bench:
            ok = bench(rank, world, x, weights, y, tp_block)
        else:
            ok = check(rank, world, x, weights, y, tp_block)
        # Every rank exits with the same status: a failure on one fails them all.
        flag = torch.tensor([int(ok)], device="cuda")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    return 0 if flag.item() else 1


if __name__ == "__main__":
    sys.exit(main())
