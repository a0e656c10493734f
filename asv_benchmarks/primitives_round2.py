"""asv: the round-2 primitives — rope, adamw_step and the INT8 (de)quantizers in every
scale mode — achieved GB/s and the ratio to torch (RoPE: the eager NeoX
expression; AdamW: torch.optim.AdamW(fused=True); quantizers: the eager expressions)."""

import sys
from pathlib import Path

import kaionb

from .common import median_ms, require_gpu

SHAPE = (16384, 8192)
DTYPES = ["float16", "bfloat16"]
OPS = ["rope", "quantize_int8_tensor", "quantize_int8_col", "dequantize_int8_tensor",
       "dequantize_int8_col"]
ADAMW_NUMEL = 1 << 25


def _table():
    """benchmarks/primitives_table.py, which defines the cases (and their byte counts)
    and prints them as a table."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import primitives_table

    return primitives_table


class PrimitivesRound2:
    params = (OPS, DTYPES)
    param_names = ["op", "dtype"]
    timeout = 300

    def setup(self, op, dtype):
        require_gpu()
        import torch

        from kaionb.kernels.quantize import dequantize_int8, quantize_int8

        tdt = getattr(torch, dtype)
        x = torch.randn(SHAPE, device="cuda", dtype=tdt)
        kx = kaionb.asarray(x)
        ko = kaionb.empty(SHAPE, kx.dtype)
        nb = x.numel() * x.element_size()
        if op == "rope":  # (rope_bwd: primitives_backward.py)
            x4 = x.view(-1, 1024, 32, 128)
            self.ours, self.theirs, self.nbytes = _table().rope_cases(
                x4, ko.reshape(x4.shape), x4)[0][1:]
        else:
            kind, mode = op.rsplit("_", 1)
            axis = None if mode == "tensor" else -1
            kq, ks = quantize_int8(kx, axis)
            q, s = torch.from_dlpack(kq), torch.from_dlpack(ks)
            amax = (lambda: x.abs().amax()) if axis is None else (
                lambda: x.abs().amax(0, keepdim=True))
            if kind == "quantize_int8":
                self.ours = lambda: quantize_int8(kx, axis, out=(kq, ks))
                self.theirs = lambda: torch.clamp(torch.round(x / (amax() / 127)), -127,
                                                  127).to(torch.int8)
            else:
                self.ours = lambda: dequantize_int8(kq, ks, axis, kx.dtype, out=ko)
                self.theirs = lambda: q.to(tdt) * s.to(tdt)
            self.nbytes = nb + x.numel()
        for _ in range(3):
            self.ours()
            self.theirs()
        torch.cuda.synchronize()

    def track_gbps(self, op, dtype):
        return self.nbytes / median_ms(self.ours) / 1e6

    track_gbps.unit = "GB/s"

    def track_speedup_vs_torch(self, op, dtype):
        return median_ms(self.theirs) / median_ms(self.ours)

    track_speedup_vs_torch.unit = "x"


class AdamW:
    """adamw_step on 2^25 float32 parameters against torch's fused AdamW: 28 bytes per
    element (read p, g, m, v; write p, m, v)."""

    timeout = 300

    def setup(self):
        require_gpu()
        import torch

        from kaionb.kernels.optim import adamw_step

        p, g = torch.randn(ADAMW_NUMEL, device="cuda"), torch.randn(ADAMW_NUMEL, device="cuda")
        m, v = torch.zeros_like(p), torch.zeros_like(p)
        kp, kg, km, kv = (kaionb.asarray(t) for t in (p, g, m, v))
        tp = torch.nn.Parameter(p.clone())
        tp.grad = g.clone()
        opt = torch.optim.AdamW([tp], lr=1e-3, fused=True)
        self.step = 0

        def ours():
            self.step += 1
            adamw_step(kp, kg, km, kv, lr=1e-3, step=self.step)

        self.ours, self.theirs = ours, opt.step
        for _ in range(3):
            self.ours()
            self.theirs()
        torch.cuda.synchronize()

    def track_gbps(self):
        return 28 * ADAMW_NUMEL / median_ms(self.ours) / 1e6

    track_gbps.unit = "GB/s"

    def track_speedup_vs_torch(self):
        return median_ms(self.theirs) / median_ms(self.ours)

    track_speedup_vs_torch.unit = "x"
