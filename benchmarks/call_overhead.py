"""Per-call time of every public op at decode sizes, against torch's equivalent op in the
same process, and (where kaionb.graph exists) the replay time of the same op captured
in a CUDA graph.

    python benchmarks/call_overhead.py [--calls 2000] [--profile OP]

Each row: ``calls`` back-to-back calls on the same inputs, wall time / calls (host time
to enqueue; the GPU runs each of these kernels in a few µs, so for all but the large
matmul the host is the limit), median of 7 repeats. kaionb's ratio to torch must be
≤ 0.5 (issue 11). ``--profile OP`` prints a cProfile of that op's kaionb calls.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time

import numpy as np

import kaionb

TARGET = 0.5  # kaionb time / torch time, per call


def per_call_us(fn, calls, sync, repeats=7):
    for _ in range(20):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def cases():
    """(name, kaionb call, torch call) at decode sizes, on the same memory."""
    import torch
    import torch.nn.functional as F

    from kaionb.kernels.quantize import QMAX

    rng = np.random.default_rng(0)
    f16 = np.float16

    def dev(shape, dtype=f16):
        return kaionb.asarray(rng.standard_normal(shape).astype(dtype))

    x, g, w, b = dev((4, 4096)), dev((4, 4096)), dev(4096), dev(4096)
    tx, tg, tw, tb = (torch.from_dlpack(a) for a in (x, g, w, b))
    o = kaionb.empty((4, 4096), f16)
    a64, b64 = dev((64, 64)), dev((64, 64))
    ta64, tb64 = torch.from_dlpack(a64), torch.from_dlpack(b64)
    o64 = kaionb.empty((64, 64), f16)
    a16, w4k = dev((16, 4096)), dev((4096, 4096))
    ta16, tw4k = torch.from_dlpack(a16), torch.from_dlpack(w4k)
    o16 = kaionb.empty((16, 4096), f16)
    q, s = kaionb.quantize_int8(x, axis=0)
    tq, ts = torch.from_dlpack(q), torch.from_dlpack(s)

    def torch_quantize(t):
        scale = t.abs().amax(dim=-1, keepdim=True).float() / QMAX
        return (t / scale).round().clamp(-QMAX, QMAX).to(torch.int8), scale

    return [
        ("rms_norm [4,4096] f16", lambda: kaionb.rms_norm(x, w),
         lambda: F.rms_norm(tx, (4096,), tw, 1e-6)),
        ("rms_norm out= [4,4096]", lambda: kaionb.rms_norm(x, w, out=o),
         lambda: F.rms_norm(tx, (4096,), tw, 1e-6)),
        ("layer_norm [4,4096] f16", lambda: kaionb.layer_norm(x, w, b),
         lambda: F.layer_norm(tx, (4096,), tw, tb, 1e-5)),
        ("softmax [4,4096] f16", lambda: kaionb.softmax(x),
         lambda: torch.softmax(tx, -1)),
        ("gelu [4,4096] f16", lambda: kaionb.gelu(x), lambda: F.gelu(tx)),
        ("gelu tanh [4,4096] f16", lambda: kaionb.gelu(x, approximate="tanh"),
         lambda: F.gelu(tx, approximate="tanh")),
        ("fused_silu_gate [4,4096] f16", lambda: kaionb.fused_silu_gate(x, g),
         lambda: F.silu(tx) * tg),
        ("quantize_int8 per row [4,4096]", lambda: kaionb.quantize_int8(x, axis=0),
         lambda: torch_quantize(tx)),
        ("dequantize_int8 per row", lambda: kaionb.dequantize_int8(q, s, axis=0),
         lambda: tq.float() * ts[:, None]),
        ("matmul 64x64x64 f16", lambda: kaionb.matmul(a64, b64),
         lambda: torch.matmul(ta64, tb64)),
        ("matmul 64^3 out=", lambda: kaionb.matmul(a64, b64, out=o64),
         lambda: torch.matmul(ta64, tb64)),
        ("matmul 16x4096x4096 f16", lambda: kaionb.matmul(a16, w4k),
         lambda: torch.matmul(ta16, tw4k)),
        ("matmul 16x4096x4096 out=", lambda: kaionb.matmul(a16, w4k, out=o16),
         lambda: torch.matmul(ta16, tw4k)),
        ("empty((4, 4096))", lambda: kaionb.empty((4, 4096), f16),
         lambda: torch.empty((4, 4096), dtype=torch.float16, device="cuda")),
    ]


GRAPH_OPS = 10  # calls captured per graph: the replay time is divided among them


def graph_replay_us(fn, calls, sync):
    """Replay time per op of ``GRAPH_OPS`` calls of ``fn`` captured with kaionb.graph()."""
    with kaionb.graph() as g:
        for _ in range(GRAPH_OPS):
            fn()
    return per_call_us(g.replay, max(1, calls // GRAPH_OPS), sync) / GRAPH_OPS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", default=None, help="cProfile this op's kaionb calls")
    args = parser.parse_args(argv)
    if not kaionb.gpu_available():
        print("call_overhead: no CUDA GPU here; nothing to time.")
        return 0
    import torch

    sync = torch.cuda.synchronize
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{args.calls} calls per sample, median of 7")
    print(f"{'op':32s} {'kaionb µs':>10s} {'torch µs':>9s} {'ratio':>6s} {'graph µs':>9s}")
    misses = []
    tx = torch.randn((4, 4096), device="cuda", dtype=torch.float16)
    for name, ours, theirs in cases():
        if args.profile and args.profile in name:
            profile = cProfile.Profile()
            profile.runcall(lambda: [ours() for _ in range(args.calls)])
            pstats.Stats(profile).sort_stats("tottime").print_stats(18)
        k_us = per_call_us(ours, args.calls, sync)
        t_us = per_call_us(theirs, args.calls, sync) if theirs else float("nan")
        try:
            g_us = graph_replay_us(ours, args.calls, sync)
        except Exception as exc:  # reported, not hidden: capture must work for every op
            g_us = None
            print(f"  graph capture of {name} failed: {type(exc).__name__}: {exc}")
        ratio = k_us / t_us
        if theirs and not ratio <= TARGET:
            misses.append(name)
        graph = f"{g_us:9.1f}" if g_us is not None else f"{'-':>9s}"
        print(f"{name:32s} {k_us:10.1f} {t_us:9.1f} {ratio:6.2f} {graph}", flush=True)
    # Importing another library's array orders its stream before ours (an event wait):
    # not an op, and not capturable; its host cost is shown for reference.
    imported = per_call_us(lambda: kaionb.asarray(tx), args.calls, sync)
    print(f"{'asarray(torch tensor)':32s} {imported:10.1f}")
    print(f"\n{len(misses)} op(s) above {TARGET}x torch: {', '.join(misses) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
