"""asv: per-call time of kaionb ops at decode sizes against torch's equivalent op in the
same process (issue 11's target: ratio ≤ 0.5), and the replay time per op of the same
call captured with kaionb.graph(). benchmarks/call_overhead.py prints the full table."""

import numpy as np

from .common import require_gpu, wall_seconds_per_call

CALLS = 2000
OPS = ["rms_norm", "rms_norm_out", "softmax", "gelu", "fused_silu_gate", "quantize_int8",
       "matmul_64", "matmul_16x4096x4096"]


def _per_call_us(fn, sync):
    return wall_seconds_per_call(fn, sync, CALLS) * 1e6


class CallOverhead:
    params = OPS
    param_names = ["op"]
    timeout = 300

    def setup(self, op):
        require_gpu()
        import torch
        import torch.nn.functional as F

        import kaionb

        rng = np.random.default_rng(0)

        def dev(shape):
            return kaionb.asarray(rng.standard_normal(shape).astype(np.float16))

        x, g, w = dev((4, 4096)), dev((4, 4096)), dev(4096)
        o = kaionb.empty((4, 4096), np.float16)
        a64, b64, a16, w4k = dev((64, 64)), dev((64, 64)), dev((16, 4096)), dev((4096, 4096))
        t = {name: torch.from_dlpack(v) for name, v in
             dict(x=x, g=g, w=w, a64=a64, b64=b64, a16=a16, w4k=w4k).items()}

        def torch_quantize():
            scale = t["x"].abs().amax(dim=-1, keepdim=True).float() / 127
            return (t["x"] / scale).round().clamp(-127, 127).to(torch.int8), scale

        self.ours, self.theirs = {
            "rms_norm": (lambda: kaionb.rms_norm(x, w),
                         lambda: F.rms_norm(t["x"], (4096,), t["w"], 1e-6)),
            "rms_norm_out": (lambda: kaionb.rms_norm(x, w, out=o),
                             lambda: F.rms_norm(t["x"], (4096,), t["w"], 1e-6)),
            "softmax": (lambda: kaionb.softmax(x), lambda: torch.softmax(t["x"], -1)),
            "gelu": (lambda: kaionb.gelu(x), lambda: F.gelu(t["x"])),
            "fused_silu_gate": (lambda: kaionb.fused_silu_gate(x, g),
                                lambda: F.silu(t["x"]) * t["g"]),
            "quantize_int8": (lambda: kaionb.quantize_int8(x, axis=0), torch_quantize),
            "matmul_64": (lambda: kaionb.matmul(a64, b64),
                          lambda: torch.matmul(t["a64"], t["b64"])),
            "matmul_16x4096x4096": (lambda: kaionb.matmul(a16, w4k),
                                    lambda: torch.matmul(t["a16"], t["w4k"])),
        }[op]
        self.sync = torch.cuda.synchronize
        with kaionb.graph() as self.graph:
            for _ in range(10):
                self.ours()

    def time_kaionb_call(self, op):
        for _ in range(CALLS):
            self.ours()
        self.sync()

    def track_kaionb_us_per_call(self, op):
        return _per_call_us(self.ours, self.sync)

    def track_ratio_to_torch(self, op):
        """kaionb's time per call / torch's (lower is better; the target is ≤ 0.5)."""
        return _per_call_us(self.ours, self.sync) / _per_call_us(self.theirs, self.sync)

    def track_graph_replay_us_per_op(self, op):
        return _per_call_us(self.graph.replay, self.sync) / 10

    track_kaionb_us_per_call.unit = "us"
    track_ratio_to_torch.unit = "x"
    track_graph_replay_us_per_op.unit = "us"
