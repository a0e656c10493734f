"""Soak: many mixed calls, and nothing may grow.

Runs ``--calls`` (default 10,000) calls drawn at random (fixed seed) from a mix of ops at
several shapes — allocating and ``out=``, eager and under a ``kaionb.grad.Tape`` with a
backward — after a warm-up of the same mix (kernels compiled, the memory pool at its
working size, plans recorded). Samples every ``--every`` calls, after a synchronize:

- device memory in use as the driver sees it (``cuMemGetInfo``: total − free, which counts
  what the stream-ordered pool holds, not only live arrays),
- the process's resident host memory (``VmRSS``) and Python's live object count,
- the sizes of kaionb's caches: recorded calls (this thread's replays), loaded kernels,
  Hopper plans, split-K workspaces.

Prints one line per sample and a summary; exits 1 when the growth from the first sample to
the last exceeds ``--device-mib`` / ``--host-mib``, or a cache is larger than its bound.

    source .gpu/prelude.sh && python3 tests/gpu/soak.py --calls 10000 --json $OUT/soak.json
"""

import argparse
import gc
import json
import sys
import time

import numpy as np

import kaionb
from kaionb import grad
from kaionb.kernels import launch, matmul, matmul_int8, op
from kaionb.testing import random_array

F16, F32, BF16 = np.float16, np.float32, kaionb.bfloat16


def _arr(rng, shape, dtype=F16, scale=1.0):
    return kaionb.asarray(random_array(shape, dtype, rng=rng, scale=scale))


def _int8(rng, shape):
    return kaionb.asarray(rng.integers(-127, 128, size=shape, dtype=np.int8))


def build_mix(rng):
    """(name, call) pairs: each call runs one op (or a taped forward + backward) on inputs
    made once, so that the soak measures the library, not the test's allocations."""
    mix = []
    for rows, width in ((4, 4096), (33, 1000), (512, 768)):
        x, r = _arr(rng, (rows, width)), _arr(rng, (rows, width))
        w, b = _arr(rng, (width,)), _arr(rng, (width,))
        o = kaionb.empty((rows, width), F16)
        mix += [
            (f"rms_norm {rows}x{width}", lambda x=x, w=w: kaionb.rms_norm(x, w)),
            (f"rms_norm out= {rows}x{width}", lambda x=x, w=w, o=o: kaionb.rms_norm(x, w, out=o)),
            (f"layer_norm {rows}x{width}", lambda x=x, w=w, b=b: kaionb.layer_norm(x, w, b)),
            (f"add_rms_norm {rows}x{width}", lambda x=x, r=r, w=w: kaionb.add_rms_norm(x, r, w)),
            (f"softmax {rows}x{width}", lambda x=x: kaionb.softmax(x)),
            (f"gelu {rows}x{width}", lambda x=x: kaionb.gelu(x)),
            (f"silu_gate {rows}x{width}", lambda x=x, r=r: kaionb.fused_silu_gate(x, r)),
            (f"quantize_int8 {rows}x{width}", lambda x=x: kaionb.quantize_int8(x)),
            (f"add {rows}x{width}", lambda x=x, r=r: x + r),
            (f"iadd out= {rows}x{width}", lambda o=o, r=r: kaionb.add(o, r, out=o)),
            (f"sum axis=-1 {rows}x{width}", lambda x=x: x.sum(axis=-1)),
            (f"max {rows}x{width}", lambda x=x: x.max()),
            (f"astype f32 {rows}x{width}", lambda x=x: x.astype(F32)),
            (f"strided mul {rows}x{width}", lambda x=x, r=r: x[:, ::2] * r[:, 1::2]),
        ]
    for m, n, k in ((1, 4096, 4096), (16, 4096, 4096), (64, 64, 64), (333, 257, 130),
                    (2048, 2048, 2048)):
        a, bt = _arr(rng, (m, k), scale=0.1), _arr(rng, (n, k), scale=0.1)
        c = kaionb.empty((m, n), F16)
        mix += [
            (f"matmul {m}x{n}x{k}", lambda a=a, bt=bt: kaionb.matmul(a, bt.T)),
            (f"matmul out= {m}x{n}x{k}", lambda a=a, bt=bt, c=c: kaionb.matmul(a, bt.T, out=c)),
        ]
    a, bt = _arr(rng, (16, 4096), scale=0.1), _arr(rng, (4096, 4096), scale=0.1)

    def on_new_stream():  # split-K on a stream made for the call: one workspace each
        with kaionb.stream(kaionb.Stream()):
            kaionb.matmul(a, bt.T)
    mix.append(("split-K matmul on a new stream", on_new_stream))
    for m, n, k in ((1, 4096, 4096), (300, 1000, 512)):
        a8, b8 = _int8(rng, (m, k)), _int8(rng, (n, k))
        mix.append((f"matmul_int8 {m}x{n}x{k}",
                    lambda a8=a8, b8=b8: kaionb.matmul_int8(a8, b8.T, 1e-3)))
    for b, h, hkv, s, d, causal in ((1, 8, 8, 1, 128, False), (2, 8, 2, 200, 64, True),
                                    (1, 16, 16, 1024, 128, True)):
        q = _arr(rng, (b, h, s, d))
        k, v = _arr(rng, (b, hkv, s, d)), _arr(rng, (b, hkv, s, d))
        mix.append((f"attention {b}x{h}/{hkv}x{s}x{d} causal={causal}",
                    lambda q=q, k=k, v=v, c=causal: kaionb.attention(q, k, v, causal=c)))
    mix += _taped(rng)
    return mix


def _taped(rng):
    """Forward under a Tape and its backward: the tape's records and the gradients must go
    when the tape does."""
    x, w = _arr(rng, (64, 512), scale=0.5), _arr(rng, (512, 256), scale=0.05)
    g = _arr(rng, (64, 256))
    q, k, v = (_arr(rng, (1, 4, 128, 64)) for _ in range(3))
    dout = _arr(rng, (1, 4, 128, 64))

    def mlp():
        x.requires_grad = w.requires_grad = True
        with grad.Tape() as tape:
            y = kaionb.gelu(kaionb.matmul(x, w))
        tape.backward(y, g)
        x.grad = w.grad = None

    def attention():
        q.requires_grad = k.requires_grad = v.requires_grad = True
        with grad.Tape() as tape:
            o = kaionb.attention(q, k, v, causal=True)
        tape.backward(o, dout)
        q.grad = k.grad = v.grad = None

    return [("taped matmul+gelu backward", mlp), ("taped attention backward", attention)]


def device_used_bytes() -> int:
    from cuda.bindings import driver

    err, free, total = driver.cuMemGetInfo()
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuMemGetInfo: {err}")
    return total - free


def host_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def cache_sizes() -> dict:
    return {
        "replays": len(op.STATE.calls or ()),
        # family members (elementwise, reductions) are made on first use, outside the
        # registry: count the loaded kernels themselves
        "loaded_kernels": sum(type(o) is launch.CompiledKernel for o in gc.get_objects()),
        "hopper_plans": len(matmul._HOPPER_PLANS) + len(matmul_int8._HOPPER_PLANS),
        "arrival_workspaces": len(op._WORKSPACES),
    }


CACHE_BOUNDS = {"replays": op.MAX_REPLAYS_PER_THREAD,
                "hopper_plans": matmul.HOPPER_PLAN_CACHE + matmul_int8.HOPPER_PLAN_CACHE,
                "arrival_workspaces": op.MAX_WORKSPACES}


def sample(done: int, started: float) -> dict:
    kaionb.current_stream().synchronize()
    gc.collect()
    return {"calls": done, "seconds": round(time.perf_counter() - started, 2),
            "device_mib": device_used_bytes() / 2**20, "host_mib": host_rss_bytes() / 2**20,
            "objects": len(gc.get_objects()), **cache_sizes()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--every", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--device-mib", type=float, default=64.0,
                        help="allowed growth of device memory in use (pool granularity)")
    parser.add_argument("--host-mib", type=float, default=32.0,
                        help="allowed growth of resident host memory")
    parser.add_argument("--json", help="write the samples and summary here")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    mix = build_mix(rng)
    for _, call in mix:  # every op compiled and recorded once before the warm-up draws
        call()
    picks = rng.integers(0, len(mix), size=args.warmup + args.calls)
    for i in picks[:args.warmup]:
        mix[i][1]()

    started = time.perf_counter()
    samples = [sample(0, started)]
    print(f"soak: {len(mix)} calls in the mix, seed {args.seed}")
    print(json.dumps(samples[0]))
    for done, i in enumerate(picks[args.warmup:], 1):
        mix[i][1]()
        if done % args.every == 0 or done == args.calls:
            samples.append(sample(done, started))
            print(json.dumps(samples[-1]))

    first, last = samples[0], samples[-1]
    growth = {"device_mib": last["device_mib"] - first["device_mib"],
              "host_mib": last["host_mib"] - first["host_mib"],
              "objects": last["objects"] - first["objects"]}
    failures = []
    if growth["device_mib"] > args.device_mib:
        failures.append(f"device memory grew {growth['device_mib']:.1f} MiB")
    if growth["host_mib"] > args.host_mib:
        failures.append(f"host memory grew {growth['host_mib']:.1f} MiB")
    for name, bound in CACHE_BOUNDS.items():
        if last[name] > bound:
            failures.append(f"{name}: {last[name]} entries, bound {bound}")
    if last["loaded_kernels"] != first["loaded_kernels"]:  # all compiled before the first
        failures.append(f"loaded kernels grew from {first['loaded_kernels']} to "
                        f"{last['loaded_kernels']}")
    summary = {"calls": args.calls, "mix": len(mix), "seed": args.seed, "growth": growth,
               "seconds": last["seconds"], "failures": failures,
               "device": kaionb.Device().name}
    print("summary:", json.dumps(summary))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"summary": summary, "samples": samples}, fh, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
