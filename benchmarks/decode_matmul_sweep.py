"""Decode matmul sweep: candidate tiles and split counts of the mma.sync split-K kernel
against cuBLAS (torch.matmul) on the same tensors in the same run.

    python benchmarks/decode_matmul_sweep.py [--ms 1,16,64,128] [--dtypes f16,bf16]
        [--layouts nn] [--samples 60] [--shipped-only] [--json out.json]

For each M (N = K = 4096), dtype and layout, every candidate (tile class, splits) is
first checked through the public path (``matmul_fwd(tile=, splits=)``; output poisoned with
NaN; relative error ‖out − ref‖/‖ref‖ < 1e-2 against a float64 product of the same
inputs; two runs bit-identical), then timed launched alone (the planned launch: no
validation, no allocation). Timing: CUDA events around ``REPS`` back-to-back calls queued
behind ``torch.cuda._sleep``, so the GPU runs them back to back whatever the host costs
(GPU time, not host time); median of ``--samples``. Two regimes:

  warm  the same A and B every call (B's 32 MiB may stay in the 50 MB L2)
  cold  calls rotate over enough copies of A and B to exceed 3× the L2: B comes from HBM,
        as it does in a model's decode step

The ratio printed is cuBLAS time / ours (≥ 1: faster than cuBLAS). The default choice
(``_choose``) is marked ``*``; the last lines give, per case, the best candidate and the
whole public call (``kaionb.matmul``) against ``torch.matmul`` as a user sees it
(back-to-back calls, host included).

Candidates beyond the shipped tile classes (``EXTRA_TILES``) are built here for the run
only (``--shipped-only`` skips them). Each tile class costs one numba compile per dtype
and layout (~3 s).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import kaionb
from kaionb.kernels import matmul as mm

N = K = 4096
REPS = 20  # back-to-back calls per timed sample
# Geometries (BM, BN, BK, WARPS_M, WARPS_N, STAGES) tried beside the shipped classes.
EXTRA_TILES = {
    "decode16_n128": (16, 128, 64, 1, 4, 4),  # 256-byte B rows per stage, 3 blocks/SM
    "decode16_s8": (16, 64, 64, 1, 4, 8),  # 7 stages of B in flight, 2 blocks/SM
    "decode64_s3": (64, 128, 64, 2, 4, 3),  # 3 blocks/SM
    "decode128": (128, 128, 64, 2, 4, 3),  # one 128-row tile: B read once
}
# (tile class, splits or None for _choose's) per M.
CANDIDATES = {
    1: [("decode16", None), ("decode16", 4), ("decode16", 16), ("decode16_n128", 8),
        ("decode16_n128", 16), ("decode16_s8", 4), ("decode16_s8", 8), ("small", None)],
    16: [("decode16", None), ("decode16", 4), ("decode16", 16), ("decode16_n128", 8),
         ("decode16_n128", 16), ("decode16_s8", 4), ("decode16_s8", 8), ("small", None)],
    64: [("decode64", None), ("decode64", 4), ("decode64", 16), ("decode64_s3", 8),
         ("decode64_s3", 12), ("small", None)],
    128: [("small", None), ("small", 6), ("decode64", 4), ("decode64", 8), ("decode128", 4),
          ("decode128", 8), ("large", 8)],
}
LAYOUTS = {"nn": (True, False), "nt": (True, True)}  # a_kmajor, b_kmajor
TOL = 1e-2


def add_extra_tiles(operands, layouts):
    """Register EXTRA_TILES as tile classes of the cp.async pipeline for this process."""
    for name, geometry in EXTRA_TILES.items():
        mm.TILES[("16bit", "async")][name] = geometry
        mm.FOLD_GROUP[name] = 8 if geometry[0] <= 64 else 4  # as the shipped tiles
        for operand in operands:
            for a_k, b_k in layouts:
                key = (operand, a_k, b_k, "async", name)
                mm._KERNELS[key] = mm._make_matmul_kernel(*key)
                mm._TILE_CHOICES[key[:4]][name] = geometry


def gpu_us(torch, fn, samples):
    """Median GPU µs per call of ``fn``: REPS calls queued behind a sleep kernel that
    outlasts the host's queueing, timed by events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(REPS):
        fn()
    host_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    sleep_cycles = int((3 * host_us + 100) * 2000)  # ≥ 3× the queueing at ≤ 2 GHz
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(samples):
        torch.cuda._sleep(sleep_cycles)
        start.record()
        for _ in range(REPS):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / REPS)
    return statistics.median(times)


def call_us(torch, fn, samples):
    """Median µs per call of back-to-back calls as a user makes them (host included)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(REPS):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / REPS)
    return statistics.median(times)


def plan(ka, kb, out, tile, splits, operand, sms):
    """The planned mma.sync launch of ``ka @ kb`` into ``out`` (the sweep times it alone)."""
    a2, b2, batch_shape, _ = mm._result_shape("sweep", ka, kb)
    p = mm.plan_operands("sweep", a2, b2, batch_shape)
    isz = out.itemsize
    out3 = out._view((p.batch, p.m, p.n), (p.m * p.n * isz, p.n * isz, isz))
    return mm._plan_mma("sweep", p, operand, out3, mm._OUT_KIND[out.dtype], True, "async",
                        tile, splits, sms)


def run_case(torch, name, m, layout, copies, samples, candidates, sms):
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[name]
    a_k, b_k = LAYOUTS[layout]
    gen = torch.Generator(device="cuda").manual_seed(1000 + m)
    a_t = [torch.randn(m, K, device="cuda", dtype=tdt, generator=gen) for _ in range(copies)]
    # B as K×N: row-major ("nn") or the transpose of a row-major N×K ("nt", weights [N, K]).
    b_t = [torch.randn(N, K, device="cuda", dtype=tdt, generator=gen).t() if b_k
           else torch.randn(K, N, device="cuda", dtype=tdt, generator=gen)
           for _ in range(copies)]
    ka = [kaionb.asarray(x) for x in a_t]
    kb = [kaionb.asarray(x) for x in b_t]
    ref = (a_t[0].double() @ b_t[0].double())
    ref_norm = ref.norm().item()
    outs_t = [torch.empty(m, N, device="cuda", dtype=tdt) for _ in range(copies)]
    outs = [kaionb.asarray(x) for x in outs_t]
    c_t = [torch.empty(m, N, device="cuda", dtype=tdt) for _ in range(copies)]

    def rotating(fns):
        state = [0]

        def step():
            fns[state[0]]()
            state[0] = (state[0] + 1) % len(fns)
        return step

    cublas = [lambda i=i: torch.matmul(a_t[i], b_t[i], out=c_t[i]) for i in range(copies)]
    cublas_warm = gpu_us(torch, cublas[0], samples)
    cublas_cold = gpu_us(torch, rotating(cublas), samples)
    default = mm._choose(m, N, K, sms, mm._TILE_CHOICES[(name, a_k, b_k, "async")])
    rows = []
    for tile, splits in candidates:
        if tile is not None and tile not in mm._TILE_CHOICES[(name, a_k, b_k, "async")]:
            continue
        chosen = mm._choose(m, N, K, sms, mm._TILE_CHOICES[(name, a_k, b_k, "async")],
                            tile=tile, splits=splits)
        # Correctness through the public path: NaN-poisoned, float64 reference, bit-identical.
        results = []
        for _ in range(2):
            outs_t[0].fill_(float("nan"))
            mm.matmul_fwd("sweep", ka[0], kb[0], out=outs[0], tile=tile, splits=splits,
                          prefer_wgmma=False)
            torch.cuda.synchronize()
            results.append(outs_t[0].clone())
        finite = bool(torch.isfinite(results[0]).all())
        err = ((results[0].double() - ref).norm().item() / ref_norm) if finite else math.inf
        same = torch.equal(results[0].view(torch.int16), results[1].view(torch.int16))
        ok = finite and err < TOL and same
        tile = chosen[0]
        plans = [plan(ka[i], kb[i], outs[i], tile, splits, name, sms) for i in range(copies)]
        runs = [lambda pl=pl: mm._run_mma(pl) for pl in plans]
        warm = gpu_us(torch, runs[0], samples)
        cold = gpu_us(torch, rotating(runs), samples)
        row = dict(dtype=name, m=m, n=N, k=K, layout=layout, tile=tile, splits=chosen[1],
                   k_chunk=chosen[2], default=chosen == default, rel_err=err,
                   bit_identical=same, ok=ok, us_warm=warm, us_cold=cold,
                   cublas_us_warm=cublas_warm, cublas_us_cold=cublas_cold,
                   ratio_warm=cublas_warm / warm, ratio_cold=cublas_cold / cold)
        rows.append(row)
        print(f"{name:4} {layout} M={m:3} {tile:14} split {chosen[1]:2} (k {chosen[2]:4})"
              f"{' *' if row['default'] else '  '} err {err:.1e} "
              f"{'ok ' if ok else 'BAD'}{'' if same else ' (not bit-identical)'}  "
              f"warm {warm:6.1f} us ({cublas_warm:5.1f}) {row['ratio_warm']:.2f}  "
              f"cold {cold:6.1f} us ({cublas_cold:5.1f}) {row['ratio_cold']:.2f}", flush=True)
    # The whole public call against torch.matmul, back to back, host included.
    ours_call = call_us(torch, lambda: mm.matmul(ka[0], kb[0]), samples)
    torch_call = call_us(torch, lambda: torch.matmul(a_t[0], b_t[0]), samples)
    good = [r for r in rows if r["ok"]]
    best = max(good, key=lambda r: r["ratio_cold"]) if good else None
    summary = dict(dtype=name, m=m, layout=layout, call_us=ours_call, torch_call_us=torch_call,
                   best=best and (best["tile"], best["splits"]))
    print(f"  -> {name} {layout} M={m}: best (cold) "
          f"{best and (best['tile'], best['splits'], round(best['ratio_cold'], 2))}; "
          f"kaionb.matmul call {ours_call:.1f} us vs torch.matmul {torch_call:.1f} us "
          f"(host included)", flush=True)
    return rows, summary


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="1,16,64,128")
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--layouts", default="nn")
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--shipped-only", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("decode_matmul_sweep: no CUDA GPU here; nothing to time.")
        return 0
    import torch

    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    dtypes = args.dtypes.split(",")
    layouts = args.layouts.split(",")
    if not args.shipped_only:
        add_extra_tiles(dtypes, [LAYOUTS[x] for x in layouts])
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    copies = max(2, math.ceil(3 * l2 / (N * K * 2)))
    print(f"GPU: {props.name}, {sms} SMs, L2 {l2 / 2**20:.0f} MiB; cold = {copies} copies of "
          f"A and B; {REPS} calls per sample, median of {args.samples}; ratio = cuBLAS / ours",
          flush=True)
    t0 = time.time()
    rows, summaries = [], []
    for name in dtypes:
        for layout in layouts:
            for m in (int(x) for x in args.ms.split(",")):
                cands = [c for c in CANDIDATES.get(m, [(None, None), ("small", None)])
                         if not args.shipped_only or c[0] not in EXTRA_TILES]
                r, s = run_case(torch, name, m, layout, copies, args.samples, cands, sms)
                rows += r
                summaries.append(s)
    print(f"done in {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=props.name, rows=rows, summaries=summaries), f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
