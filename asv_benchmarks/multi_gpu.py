"""asv: a tensor-parallel LLaMA MLP block (bf16, Wg/Wu split by columns, Wd by rows) on
two GPUs from one process against the same block on one GPU — the speed-up and the share
of the step the partial-sum reduction (a peer copy and an add) takes. Skipped with fewer
than two GPUs. benchmarks/multi_gpu_mlp.py prints the same numbers as a table."""

import numpy as np

import kaionb

from .common import require_gpu, wall_seconds_per_call

SHAPES = ["8192x8192x28672", "2048x4096x14336"]  # tokens x hidden x intermediate


def _wall_ms(fn, devices, reps=5):
    """Wall time per call of ``fn`` over ``reps`` calls, the devices synchronized."""
    def sync():
        for d in devices:
            with kaionb.device(d):
                kaionb.current_stream().synchronize()

    return wall_seconds_per_call(fn, sync, reps, warmup=1) * 1e3


class TensorParallelMLP:
    params = SHAPES
    param_names = ["shape"]
    timeout = 600

    def setup(self, shape):
        require_gpu()
        if kaionb.device_count() < 2:
            raise NotImplementedError("needs 2 GPUs")
        t, d, f = map(int, shape.split("x"))
        rng = kaionb.random.default_rng(0)

        def weight(rows, cols):
            return (rng.standard_normal((rows, cols), np.float32)
                    * rows ** -0.5).astype(kaionb.bfloat16)

        x, wg, wu, wd = (weight(t, d), weight(d, f), weight(d, f), weight(f, d))
        half = f // 2
        parts = [(x, wg[:, :half].copy(), wu[:, :half].copy(), wd[:half].copy()),
                 tuple(a.to(1) for a in (x, wg[:, half:], wu[:, half:], wd[half:]))]

        def block(x, wg, wu, wd):
            return kaionb.matmul(kaionb.fused_silu_gate(kaionb.matmul(x, wg),
                                                        kaionb.matmul(x, wu)), wd)

        def two():
            y0, y1 = block(*parts[0]), block(*parts[1])
            kaionb.add(y0, y1.to(0), out=y0)

        y0, y1 = block(*parts[0]), block(*parts[1])
        self.one = lambda: block(x, wg, wu, wd)
        self.two = two
        self.reduce = lambda: kaionb.add(y0, y1.to(0), out=y0)

    def time_two_gpus(self, shape):
        self.two()
        for d in (0, 1):
            with kaionb.device(d):
                kaionb.current_stream().synchronize()

    def track_speedup_two_gpus(self, shape):
        return _wall_ms(self.one, [0]) / _wall_ms(self.two, [0, 1])

    track_speedup_two_gpus.unit = "x"

    def track_reduce_share(self, shape):
        return _wall_ms(self.reduce, [0, 1]) / _wall_ms(self.two, [0, 1])

    track_reduce_share.unit = "fraction"
