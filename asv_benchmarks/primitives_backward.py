"""asv: the primitives' backward kernels against torch autograd's backward of the same
forward (RoPE's: the eager NeoX expression's), and the fused residual RMSNorm against
torch's ``F.rms_norm(x + residual)``, at [16384, 8192] — achieved GB/s and the ratio to
torch. The cases (and their byte counts) are benchmarks/primitives_table.py's, which
prints them as a table."""

from . import primitives_round2
from .common import require_gpu

SHAPE = (16384, 8192)
DTYPES = ["float16", "bfloat16"]
OPS = ["rms_norm_bwd", "layer_norm_bwd", "softmax_bwd", "fused_silu_gate_bwd", "gelu_bwd",
       "add_rms_norm", "add_rms_norm_bwd", "rope_bwd"]


class PrimitivesBackward:
    params = (OPS, DTYPES)
    param_names = ["op", "dtype"]
    timeout = 300

    def setup(self, op, dtype):
        require_gpu()
        import torch
        import torch.nn.functional as F

        import kaionb

        tdt = getattr(torch, dtype)
        x, y = (torch.randn(SHAPE, device="cuda", dtype=tdt) for _ in range(2))
        w, b = (torch.randn(SHAPE[-1], device="cuda", dtype=tdt) for _ in range(2))
        kx, ky, kw, kb = (kaionb.asarray(t) for t in (x, y, w, b))
        nb = x.numel() * x.element_size()
        if op == "add_rms_norm":  # read x, residual; write normed, x + residual (+ weight)
            normed, summed = kaionb.empty(SHAPE, kx.dtype), kaionb.empty(SHAPE, kx.dtype)
            self.ours = lambda: kaionb.add_rms_norm(kx, ky, kw, out=normed,
                                                    residual_out=summed)
            self.theirs = lambda: F.rms_norm(x + y, (SHAPE[-1],), w, 1e-6)
            self.nbytes = 4 * nb + w.numel() * w.element_size()
        else:
            table = primitives_round2._table()
            x4 = x.view(-1, 1024, 32, 128)
            cases = table.backward_cases(x, y, w, b, kx, ky, kw, kb, nb) + table.rope_cases(
                x4, kaionb.empty(x4.shape, kx.dtype), y.view(x4.shape))
            self.ours, self.theirs, self.nbytes = {
                name.split(" ")[0]: case for name, *case in cases}[op]
        for _ in range(3):
            self.ours()
            self.theirs()
        torch.cuda.synchronize()

    # GB/s and the ratio to torch of self.ours / self.theirs / self.nbytes, as for round 2
    track_gbps = primitives_round2.PrimitivesRound2.track_gbps
    track_speedup_vs_torch = primitives_round2.PrimitivesRound2.track_speedup_vs_torch
