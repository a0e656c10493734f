"""Transformer primitives: achieved bandwidth vs a device-to-device copy and vs torch, all
measured in one run on the same GPU.

    python benchmarks/primitives_table.py [--quick] [--threads 128,256,512]

Bytes counted: each input read once plus the output written once (weights included).
Times: CUDA events around each call after a warm-up, median of --reps calls; the inputs
(≥ 256 MiB for the large shapes) are far larger than L2. Decode rows: host wall time per
call of 2000 back-to-back calls (launch-bound), out= preallocated, then synchronized.
"""

import argparse
import statistics
import time


import kaionb
from kaionb.kernels.helpers import rowwise
from kaionb.kernels.activations import fused_silu_gate, fused_silu_gate_bwd, gelu, gelu_bwd
from kaionb.kernels.norms import (add_rms_norm, add_rms_norm_bwd, layer_norm, layer_norm_bwd,
                                  rms_norm, rms_norm_bwd)
from kaionb.kernels.optim import adamw_step
from kaionb.kernels.quantize import dequantize_int8, quantize_int8
from kaionb.kernels.rope import rope, rope_bwd, rope_cache
from kaionb.kernels.softmax import softmax, softmax_bwd

LARGE = [((16384, 8192), "float16"), ((16384, 8192), "float32"), ((16384, 8192), "bfloat16"),
         ((2048, 65536), "float16"), ((512, 262144), "float16"), ((2048, 65536), "float32"),
         ((512, 262144), "float32")]
DECODE = [(1, 4096), (16, 4096), (64, 4096)]


def bench_gpu(fn, reps):
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def bench_host(fn, calls=2000):
    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def cases(shape, dtype):
    """(name, kaionb call, torch call, bytes moved) for one shape and dtype."""
    import torch
    import torch.nn.functional as F

    tdt = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=tdt, generator=g)
    y = torch.randn(shape, device="cuda", dtype=tdt, generator=g)
    w = torch.randn(shape[-1], device="cuda", dtype=tdt, generator=g)
    b = torch.randn(shape[-1], device="cuda", dtype=tdt, generator=g)
    out = torch.empty_like(x)
    kx, ky, kw, kb, ko = (kaionb.asarray(t) for t in (x, y, w, b, out))
    q = torch.empty(shape, device="cuda", dtype=torch.int8)
    s = torch.empty(shape[0], device="cuda", dtype=torch.float32)
    kq, ks = kaionb.asarray(q), kaionb.asarray(s)
    quantize_int8(kx, 0, out=(kq, ks))
    ks_tensor, ks_cols = quantize_int8(kx)[1], quantize_int8(kx, -1)[1]
    s_tensor, s_cols = torch.from_dlpack(ks_tensor), torch.from_dlpack(ks_cols)
    nb = x.numel() * x.element_size()
    wb = w.numel() * w.element_size()
    # RoPE on x seen as [B, 1024, 32, 128] (NeoX layout, full rotary).
    x4 = x.view(-1, 1024, 32, 128) if x.numel() % (1024 * 32 * 128) == 0 else None
    cases = [
        ("rms_norm", lambda: rms_norm(kx, kw, out=ko),
         lambda: F.rms_norm(x, (shape[-1],), w, 1e-6), 2 * nb + wb),  # torch >= 2.4
        ("layer_norm", lambda: layer_norm(kx, kw, kb, out=ko),
         lambda: F.layer_norm(x, (shape[-1],), w, b, 1e-5), 2 * nb + 2 * wb),
        ("softmax", lambda: softmax(kx, out=ko), lambda: torch.softmax(x, -1), 2 * nb),
        ("fused_silu_gate", lambda: fused_silu_gate(kx, ky, out=ko),
         lambda: F.silu(x) * y, 3 * nb),
        ("gelu", lambda: gelu(kx, out=ko), lambda: F.gelu(x), 2 * nb),
        ("gelu_tanh", lambda: gelu(kx, "tanh", out=ko),
         lambda: F.gelu(x, approximate="tanh"), 2 * nb),
        ("quantize_int8 row", lambda: quantize_int8(kx, 0, out=(kq, ks)),
         lambda: torch.clamp(torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)),
                             -127, 127).to(torch.int8), nb + x.numel()),
        # Per tensor and per column read x twice (a scale before its first q): the floor
        # is 2·|x| + |q|, counted here as |x| + |q| like the one-pass modes.
        ("quantize_int8 tensor", lambda: quantize_int8(kx, None, out=(kq, ks_tensor)),
         lambda: torch.clamp(torch.round(x / (x.abs().amax() / 127)), -127,
                             127).to(torch.int8), nb + x.numel()),
        ("quantize_int8 col", lambda: quantize_int8(kx, -1, out=(kq, ks_cols)),
         lambda: torch.clamp(torch.round(x / (x.abs().amax(0, keepdim=True) / 127)),
                             -127, 127).to(torch.int8), nb + x.numel()),
        ("dequantize_int8 row", lambda: dequantize_int8(kq, ks, 0, ko.dtype, out=ko),
         lambda: (q.to(tdt) * s[:, None].to(tdt)), nb + x.numel()),
        ("dequantize_int8 tensor", lambda: dequantize_int8(kq, ks_tensor, None, ko.dtype, out=ko),
         lambda: (q.to(tdt) * s_tensor.to(tdt)), nb + x.numel()),
        ("dequantize_int8 col", lambda: dequantize_int8(kq, ks_cols, -1, ko.dtype, out=ko),
         lambda: (q.to(tdt) * s_cols.to(tdt)), nb + x.numel()),
    ]
    ko2 = kaionb.empty(shape, kx.dtype)
    n = shape[-1]
    cases += [
        ("add_rms_norm", lambda: add_rms_norm(kx, ky, kw, out=ko, residual_out=ko2),
         lambda: F.rms_norm(x + y, (n,), w, 1e-6), 4 * nb + wb),
        ("softmax axis=0", lambda: softmax(kx, 0, out=ko), lambda: torch.softmax(x, 0), 2 * nb),
    ]
    cases += backward_cases(x, y, w, b, kx, ky, kw, kb, nb)
    if x4 is not None:
        cases += rope_cases(x4, kaionb.asarray(out.view(x4.shape)), y.view(x4.shape))
    return cases


def rope_cases(x4, out4, grad4):
    """RoPE (NeoX, full rotary D) on x4 [B, S, H, D] and its backward (grad4 rotated back)
    against the eager torch expression and its autograd: read x (grad), write out."""
    import torch

    seq, dim = x4.shape[1], x4.shape[3]
    cos, sin = rope_cache(seq, dim)
    tc = torch.from_dlpack(cos).to(x4.dtype)[:, None, :]
    ts = torch.from_dlpack(sin).to(x4.dtype)[:, None, :]
    kx4, kg4 = kaionb.asarray(x4), kaionb.asarray(grad4)
    nb = x4.numel() * x4.element_size()

    def torch_rope(t):
        t1, t2 = t[..., :dim // 2], t[..., dim // 2:]
        return torch.cat((t1 * tc - t2 * ts, t2 * tc + t1 * ts), -1)

    xr = x4.detach().clone().requires_grad_()
    rotated = torch_rope(xr)
    return [
        (f"rope (neox, D={dim})", lambda: rope(kx4, cos, sin, out=out4),
         lambda: torch_rope(x4), 2 * nb),
        (f"rope_bwd (neox, D={dim})", lambda: rope_bwd(kg4, cos, sin, out=out4),
         lambda: torch.autograd.grad(rotated, xr, grad4, retain_graph=True), 2 * nb),
    ]


def backward_cases(x, y, w, b, kx, ky, kw, kb, nb):
    """Backward kernels against torch autograd's (grad = y, in x's dtype as torch keeps
    it): read x (or the saved output) and the gradient, write dx (and the gates' second
    gradient); weight gradients (n floats) not counted."""
    import torch
    import torch.nn.functional as F

    n = x.shape[-1]
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    gate = y.detach().clone().requires_grad_()
    resr = y.detach().clone().requires_grad_()
    summed = xr + resr
    torch_out = {
        "rms_norm": (F.rms_norm(xr, (n,), wr, 1e-6), (xr, wr)),
        "layer_norm": (F.layer_norm(xr, (n,), wr, br, 1e-5), (xr, wr, br)),
        "softmax": (torch.softmax(xr, -1), (xr,)),
        "fused_silu_gate": (F.silu(xr) * gate, (xr, gate)),
        "gelu": (F.gelu(xr), (xr,)),
        "add_rms_norm": ((F.rms_norm(summed, (n,), wr, 1e-6), summed), (xr, resr, wr)),
    }

    def theirs(name):
        out, inputs = torch_out[name]
        grads = (y, y) if isinstance(out, tuple) else y
        return lambda: torch.autograd.grad(out, inputs, grads, retain_graph=True)

    ksm = softmax(kx)
    return [
        ("rms_norm_bwd", lambda: rms_norm_bwd(ky, kx, kw), theirs("rms_norm"), 3 * nb),
        ("layer_norm_bwd", lambda: layer_norm_bwd(ky, kx, kw, kb), theirs("layer_norm"),
         3 * nb),
        ("softmax_bwd", lambda: softmax_bwd(ky, ksm), theirs("softmax"), 3 * nb),
        ("fused_silu_gate_bwd", lambda: fused_silu_gate_bwd(ky, kx, ky),
         theirs("fused_silu_gate"), 5 * nb),
        ("gelu_bwd", lambda: gelu_bwd(ky, kx), theirs("gelu"), 3 * nb),
        # read grad, grad_residual and s; write ds (the gradient of x and of residual)
        ("add_rms_norm_bwd", lambda: add_rms_norm_bwd(ky, ky, kx, kw),
         theirs("add_rms_norm"), 4 * nb),
    ]


def adamw_case(numel):
    """kaionb.adamw_step against torch.optim.AdamW(fused=True) on float32 params and grads:
    read p, g, m, v and write p, m, v (28 bytes per element)."""
    import torch

    p = torch.randn(numel, device="cuda")
    grad = torch.randn(numel, device="cuda")
    m = torch.zeros(numel, device="cuda")
    v = torch.zeros(numel, device="cuda")
    kp, kg, km, kv = (kaionb.asarray(t) for t in (p, grad, m, v))
    tp = torch.nn.Parameter(p.clone())
    tp.grad = grad.clone()
    opt = torch.optim.AdamW([tp], lr=1e-3, fused=True)
    step = [0]

    def ours():
        step[0] += 1
        adamw_step(kp, kg, km, kv, lr=1e-3, step=step[0])

    return ours, opt.step, 28 * numel


def copy_bandwidth(nbytes, reps):
    import torch

    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    us = bench_gpu(lambda: dst.copy_(src), reps)
    return 2 * nbytes / us / 1e3, us


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="headline shape only")
    parser.add_argument("--ops", default="",
                        help="comma-separated op names to time (default: all), e.g. "
                             "rms_norm_bwd,layer_norm_bwd")
    parser.add_argument("--threads", default="",
                        help="also time rms_norm/softmax f16 [16384, 8192] at these "
                             "rowwise.PREFERRED_THREADS values")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return
    import torch

    copy_gbs, copy_us = copy_bandwidth(1 << 28, args.reps)
    print(f"device-to-device copy, 256 MiB: {copy_us:.1f} us, {copy_gbs:.0f} GB/s "
          f"(read + write) on {torch.cuda.get_device_name()}")
    header = (f"{'op':22s} {'dtype':9s} {'shape':15s} {'us':>8s} {'GB/s':>7s} {'%copy':>6s} "
              f"{'torch us':>9s} {'torch GB/s':>10s} {'speedup':>8s}")
    print(header)
    wanted = {op for op in args.ops.split(",") if op}
    for shape, dtype in (LARGE[:1] if args.quick else LARGE):
        for name, ours, theirs, nbytes in cases(shape, dtype):
            if wanted and name.split(" ")[0] not in wanted:
                continue
            us = bench_gpu(ours, args.reps)
            tus = bench_gpu(theirs, args.reps)
            gbs, tgbs = nbytes / us / 1e3, nbytes / tus / 1e3
            line = (f"{name:22s} {dtype:9s} {str(list(shape)):15s} {us:8.1f} {gbs:7.0f} "
                    f"{100 * gbs / copy_gbs:5.1f}% {tus:9.1f} {tgbs:10.0f} {tus / us:7.2f}x")
            print(line, flush=True)
        torch.cuda.empty_cache()
    if not wanted or "adamw_step" in wanted:
        ours, theirs, nbytes = adamw_case(1 << 25)
        us, tus = bench_gpu(ours, args.reps), bench_gpu(theirs, args.reps)
        gbs, tgbs = nbytes / us / 1e3, nbytes / tus / 1e3
        print(f"{'adamw_step':22s} {'float32':9s} {str([1 << 25]):15s} {us:8.1f} {gbs:7.0f} "
              f"{100 * gbs / copy_gbs:5.1f}% {tus:9.1f} {tgbs:10.0f} {tus / us:7.2f}x",
              flush=True)
        torch.cuda.empty_cache()
    if wanted:
        return
    for t in [int(v) for v in args.threads.split(",") if v]:
        rowwise.PREFERRED_THREADS = t
        for name, ours, _, nbytes in cases((16384, 8192), "float16")[:3]:
            us = bench_gpu(ours, args.reps)
            print(f"threads={t:4d} {name:12s} f16 [16384, 8192] {us:8.1f} us "
                  f"{nbytes / us / 1e3:6.0f} GB/s {100 * nbytes / us / 1e3 / copy_gbs:5.1f}%")
        rowwise.PREFERRED_THREADS = 256
    print("\ndecode sizes, float16, host time per call end to end (out= given):")
    for shape in DECODE:
        for name, ours, theirs, _ in cases(shape, "float16")[:6]:  # the forward ops
            us = bench_host(ours)
            tus = bench_host(theirs)
            print(f"  {name:16s} {str(list(shape)):12s} kaionb {us:6.1f} us   torch {tus:6.1f} us")


if __name__ == "__main__":
    main()
