"""asv: transformer primitives (rms_norm, layer_norm, softmax, fused_silu_gate, gelu, INT8
quantize/dequantize per row, per column and per tensor) — achieved GB/s, the ratio to
torch's own op, and the share of a device-to-device copy's bandwidth measured in the same
process (bytes: each input read once, the output written once)."""

import kaionb

from .common import median_ms, require_gpu

# the sizes of the bandwidth targets (issue 17); decode sizes are call_overhead's
SHAPES = [(16384, 8192), (2048, 65536)]
DTYPES = ["float16", "bfloat16"]
OPS = ["rms_norm", "layer_norm", "softmax", "fused_silu_gate", "gelu", "gelu_tanh",
       "quantize_int8", "dequantize_int8", "quantize_int8_col", "dequantize_int8_col",
       "quantize_int8_tensor"]


class Primitives:
    params = (OPS, SHAPES, DTYPES)
    param_names = ["op", "shape", "dtype"]
    timeout = 300

    def setup(self, op, shape, dtype):
        require_gpu()
        import torch
        import torch.nn.functional as F

        from kaionb.kernels.activations import fused_silu_gate, gelu
        from kaionb.kernels.norms import layer_norm, rms_norm
        from kaionb.kernels.quantize import dequantize_int8, quantize_int8
        from kaionb.kernels.softmax import softmax

        tdt = getattr(torch, dtype)
        x = torch.randn(shape, device="cuda", dtype=tdt)
        y = torch.randn(shape, device="cuda", dtype=tdt)
        w = torch.randn(shape[-1], device="cuda", dtype=tdt)
        b = torch.randn(shape[-1], device="cuda", dtype=tdt)
        kx, ky, kw, kb = (kaionb.asarray(t) for t in (x, y, w, b))
        ko = kaionb.empty(shape, kx.dtype)
        kq, ks = quantize_int8(kx, 0)
        q, s = torch.from_dlpack(kq), torch.from_dlpack(ks)
        kqc, ksc = quantize_int8(kx, -1)  # per column (channel) scales
        qc, sc = torch.from_dlpack(kqc), torch.from_dlpack(ksc)
        kqt, kst = quantize_int8(kx)  # one scale for the tensor
        nb = x.numel() * x.element_size()
        n = shape[-1]
        self.ours, self.theirs, self.nbytes = {
            "rms_norm": (lambda: rms_norm(kx, kw, out=ko),
                         lambda: F.rms_norm(x, (n,), w, 1e-6), 2 * nb),
            "layer_norm": (lambda: layer_norm(kx, kw, kb, out=ko),
                           lambda: F.layer_norm(x, (n,), w, b, 1e-5), 2 * nb),
            "softmax": (lambda: softmax(kx, out=ko), lambda: torch.softmax(x, -1), 2 * nb),
            "fused_silu_gate": (lambda: fused_silu_gate(kx, ky, out=ko),
                                lambda: F.silu(x) * y, 3 * nb),
            "gelu": (lambda: gelu(kx, out=ko), lambda: F.gelu(x), 2 * nb),
            "gelu_tanh": (lambda: gelu(kx, "tanh", out=ko),
                          lambda: F.gelu(x, approximate="tanh"), 2 * nb),
            "quantize_int8": (lambda: quantize_int8(kx, 0, out=(kq, ks)),
                              lambda: torch.clamp(torch.round(
                                  x / (x.abs().amax(-1, keepdim=True) / 127)), -127,
                                  127).to(torch.int8), nb + x.numel()),
            "dequantize_int8": (lambda: dequantize_int8(kq, ks, 0, ko.dtype, out=ko),
                                lambda: q.to(tdt) * s[:, None].to(tdt), nb + x.numel()),
            "quantize_int8_col": (lambda: quantize_int8(kx, -1, out=(kqc, ksc)),
                                  lambda: torch.clamp(torch.round(
                                      x / (x.abs().amax(0, keepdim=True) / 127)), -127,
                                      127).to(torch.int8), nb + x.numel()),
            "dequantize_int8_col": (lambda: dequantize_int8(kqc, ksc, -1, ko.dtype, out=ko),
                                    lambda: qc.to(tdt) * sc[None, :].to(tdt),
                                    nb + x.numel()),
            "quantize_int8_tensor": (lambda: quantize_int8(kx, out=(kqt, kst)),
                                     lambda: torch.clamp(torch.round(x / (x.abs().amax() / 127)),
                                                         -127, 127).to(torch.int8),
                                     nb + x.numel()),
        }[op]
        copy_dst = torch.empty_like(x)
        self.copy = lambda: copy_dst.copy_(x)  # reads and writes 2 * nb bytes
        self.copy_nbytes = 2 * nb
        for _ in range(3):
            self.ours()
            self.theirs()
            self.copy()
        torch.cuda.synchronize()

    def track_gbps(self, op, shape, dtype):
        return self.nbytes / median_ms(self.ours) / 1e6

    track_gbps.unit = "GB/s"

    def track_speedup_vs_torch(self, op, shape, dtype):
        return median_ms(self.theirs) / median_ms(self.ours)

    track_speedup_vs_torch.unit = "x"

    def track_fraction_of_copy(self, op, shape, dtype):
        ours_gbps = self.nbytes / median_ms(self.ours)
        return ours_gbps / (self.copy_nbytes / median_ms(self.copy))

    track_fraction_of_copy.unit = "of copy"
