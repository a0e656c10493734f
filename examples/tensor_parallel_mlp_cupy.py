"""The tensor-parallel Llama MLP of tensor_parallel_mlp.py without torch: the sum over
the GPUs goes through CuPy's NCCL bindings, on the kaionb output's pointer.

One process per GPU (multiprocessing, spawn); rank 0 makes the NCCL id and hands it to the
others through a queue. Each rank runs its part of the block on a CuPy stream, then
``comm.allReduce(y.ptr, y.ptr, ...)`` sums y in place on that same stream. y is float32
(``matmul(..., dtype=float32)``): the partials are summed before any rounding, for twice
the bytes of a bfloat16 sum (NCCL_BFLOAT16, which the torch example's sum uses). Every
rank checks its y against float64 NumPy and rank 0 against the block on one GPU; the
script exits 1 when a check fails or a rank dies or hangs. Without CuPy, NCCL or two GPUs:
says so and exits 0.

    python examples/tensor_parallel_mlp_cupy.py
"""

import multiprocessing
import sys
import time

import numpy as np

import kaionb
from tensor_parallel_mlp import (CHECK_SHAPE, TOL_VS_FLOAT64, TOL_VS_ONE_GPU, make_inputs,
                                 mlp, mlp_ref, report, shard)

WORLD = 2
TIMEOUT_S = 180  # for the ranks to finish, first kernel compilations included


def unavailable():
    """Why this machine cannot run the example, or None."""
    try:
        from cupy.cuda import nccl
    except ImportError:
        return "cupy is not installed"
    if not nccl.available:
        return "CuPy finds no NCCL library"
    if kaionb.device_count() < WORLD:
        return f"needs {WORLD} GPUs, this machine has {kaionb.device_count()}"
    return None


def worker(rank, world, ids):
    """One GPU: this rank's part of the block, then y summed over the ranks in place."""
    import cupy
    from cupy.cuda import nccl

    cupy.cuda.Device(rank).use()
    kaionb.set_device(rank)
    if rank == 0:
        uid = nccl.get_unique_id()
        for _ in range(world - 1):
            ids.put(uid)
    else:
        uid = ids.get()
    comm = nccl.NcclCommunicator(world, uid, rank)
    stream = cupy.cuda.Stream(non_blocking=True)
    # kaionb and NCCL on one stream: the all-reduce starts after the matmul that writes y,
    # and y.get() (on kaionb's current stream) waits for the all-reduce.
    with kaionb.stream(stream):
        x, *weights = make_inputs(*CHECK_SHAPE, on_device=False)
        y = mlp(x, *shard(*weights, rank, world), dtype=np.float32)
        comm.allReduce(y.ptr, y.ptr, y.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        out = y.get()
        ok = report(f"rank {rank}: {world} GPUs vs float64", out, mlp_ref(x, *weights),
                    TOL_VS_FLOAT64)
        if rank == 0:
            one_gpu = mlp(x, *weights, dtype=np.float32).get()
            ok &= report(f"rank 0: {world} GPUs vs 1 GPU", out, one_gpu, TOL_VS_ONE_GPU)
    stream.synchronize()
    comm.destroy()
    sys.exit(0 if ok else 1)


def main():
    reason = unavailable()
    if reason:
        print(f"examples/tensor_parallel_mlp_cupy.py: {reason}; nothing to run (exit 0).")
        return 0
    # spawn: each rank starts its own CUDA contexts (a forked child cannot use CUDA).
    context = multiprocessing.get_context("spawn")
    ids = context.Queue()
    ranks = [context.Process(target=worker, args=(rank, WORLD, ids)) for rank in range(WORLD)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + TIMEOUT_S
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [process for process in ranks if process.is_alive()]
    for process in hung:
        process.terminate()  # left waiting in NCCL for a rank that failed
        process.join()
    failed = bool(hung) or any(process.exitcode != 0 for process in ranks)
    if failed:
        codes = ", ".join(f"rank {r}: {p.exitcode}" for r, p in enumerate(ranks))
        print(f"examples/tensor_parallel_mlp_cupy.py: a rank failed or hung ({codes}); exit 1")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
