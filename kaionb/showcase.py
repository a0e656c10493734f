"""``python -m kaionb.showcase``: what kaionb does, on this machine.

With a GPU: DeviceArray round trips, zero-copy exchange with the libraries present, the
launch path's cost, and every op family checked against NumPy with its latency.
Without one: says so, then compiles every kernel the package ships for sm_80, sm_89 and
sm_90a (or the ``--arch`` given) and assembles it with ptxas, printing registers and spills
per kernel as each finishes. Reports come from the kernel cache when the kernel's source
has not changed, so a second run takes seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np

import kaionb
from kaionb import _kernel_cache as kernel_cache
from kaionb._toolchain import CHECK_ARCHS, assemble, assembler_version, find_ptxas, parse_report
from kaionb.kernels.launch import all_kernels


# Compile + ptxas time per kernel × signature × architecture on the CI machine (2 cores):
# tests/test_compile_all.py's ~700 cases take about 10 minutes there.
SECONDS_PER_COMPILATION = 0.9


def ptxas_report(kdef, signature: str, cc: tuple, arch: str) -> tuple[str, bool]:
    """``ptxas -v``'s report for one specialization, and whether it came from the cache."""
    key = kernel_cache.kernel_key(kdef, signature, arch,
                                  f"ptxas -v report by {assembler_version('ptxas')}")
    record = kernel_cache.load(key)
    if record is not None:
        return record[0].decode(), True
    report = assemble(kdef.compile_ptx(signature, cc), arch)
    kernel_cache.store(key, [report.encode()])
    return report, False


def ptxas_table(archs=tuple(CHECK_ARCHS.values())) -> bool:
    """Compile + assemble every kernel specialization for each of ``archs`` it supports;
    print a row per specialization as it finishes."""
    if find_ptxas() is None:
        print("ptxas not found (install numba-cuda[cu12]); cannot assemble")
        return False
    jobs = [(k, sig, cc, arch) for k in all_kernels() for sig in k.signatures
            for cc, arch in k.check_archs().items() if arch in archs]

    def run(job):
        try:
            report, cached = ptxas_report(*job)
            return parse_report(report), cached, None
        except Exception as exc:  # reported in the table, counted as a failure
            return None, False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"

    print(f"{len(jobs)} compilations: about {len(jobs) * SECONDS_PER_COMPILATION / 60:.0f} "
          "minutes the first time on 2 cores, seconds once the kernel cache holds them.\n")
    print(f"{'':>11s} {'kernel':44s} {'arch':7s} {'regs':>5s} {'spills':>7s}  status",
          flush=True)
    failures = 0
    start = time.perf_counter()
    # numba compiles under one lock, so the second thread's gain is ptxas running beside it.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {pool.submit(run, job): job for job in jobs}
        for done, future in enumerate(as_completed(futures), 1):
            k, _, _, arch = futures[future]
            report, cached, error = future.result()
            progress = f"{done:4d} {time.perf_counter() - start:5.0f}s"
            if error:
                failures += 1
                print(f"{progress} {k.name[:44]:44s} {arch:7s} {'-':>5s} {'-':>7s}  FAILED "
                      f"{error}", flush=True)
                continue
            spills = report["spill_stores"] + report["spill_loads"]
            status = "ok (cached)" if cached else "ok"
            print(f"{progress} {k.name[:44]:44s} {arch:7s} {report['registers']:5d} "
                  f"{spills:7d}  {status}", flush=True)
    kernels = len({k.name for k, *_ in jobs})
    print(f"\n{len(jobs) - failures} of {len(jobs)} compilations assembled "
          f"({kernels} kernels, {len(jobs)} kernel×signature×arch)")
    return failures == 0


def _timed(fn, repeats=20):
    from numba import cuda

    fn()
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    cuda.synchronize()
    return (time.perf_counter() - t0) / repeats * 1e6


def gpu_tour() -> None:
    from numba import cuda

    print(f"GPU: {cuda.get_current_device().name}")
    rng = np.random.default_rng(0)
    host = rng.standard_normal((1024, 1024)).astype(np.float32)
    x = kaionb.asarray(host)
    print(f"\nasarray → {x!r}")
    half = x.astype(kaionb.bfloat16)
    ok = np.array_equal(half.get(), host.astype(kaionb.bfloat16))
    print(f"x.astype(bfloat16) matches NumPy/ml_dtypes rounding: {ok} "
          f"({_timed(lambda: x.astype(kaionb.bfloat16)):.1f} µs per call)")
    print(f"x.T[::2, 5:] is a view: shape {x.T[::2, 5:].shape}, strides {x.T[::2, 5:].strides}")
    try:
        import cupy as cp

        c = cp.asarray(x)
        print(f"CuPy zero-copy: same pointer {c.data.ptr == x.ptr}, sum {float(c.sum()):.4f} "
              f"vs NumPy {host.sum(dtype=np.float64):.4f}")
    except ImportError:
        print("CuPy not installed: skipping the CuPy exchange")
    try:
        import torch

        t = torch.from_dlpack(half)
        print(f"PyTorch zero-copy (bfloat16 via DLPack): same pointer "
              f"{t.data_ptr() == half.ptr}, dtype {t.dtype}")
    except ImportError:
        print("PyTorch not installed: skipping the PyTorch exchange")


def ops_tour() -> None:
    """Every op family once: checked against its float64 NumPy reference, timed."""
    from kaionb.kernels import (
        activations,
        attention,
        matmul,
        matmul_int4,
        norms,
        quantize,
        softmax,
    )
    from kaionb.testing import relative_error

    rng = np.random.default_rng(1)
    rows, width = 4096, 4096
    x_h = rng.standard_normal((rows, width)).astype(np.float16)
    g_h = rng.standard_normal((rows, width)).astype(np.float16)
    w_h = rng.standard_normal(width).astype(np.float16)
    x, g, w = kaionb.asarray(x_h), kaionb.asarray(g_h), kaionb.asarray(w_h)
    a_h = rng.standard_normal((2048, 2048)).astype(kaionb.bfloat16)
    b_h = rng.standard_normal((2048, 2048)).astype(kaionb.bfloat16)
    a, b = kaionb.asarray(a_h), kaionb.asarray(b_h)
    w4 = kaionb.quantize_int4(rng.standard_normal((width, width)).astype(np.float16), 128)
    t_h = x_h[:16]
    t = kaionb.asarray(t_h)
    q_h, k_h, v_h = (rng.standard_normal(shape).astype(kaionb.bfloat16)
                     for shape in ((2, 16, 1000, 128), (2, 4, 1000, 128), (2, 4, 1000, 128)))
    q, k, v = kaionb.asarray(q_h), kaionb.asarray(k_h), kaionb.asarray(v_h)
    cases = [
        ("rms_norm   [4096, 4096] f16", lambda: kaionb.rms_norm(x, w),
         lambda: norms.rms_norm_ref(x_h, w_h)),
        ("layer_norm [4096, 4096] f16", lambda: kaionb.layer_norm(x, w),
         lambda: norms.layer_norm_ref(x_h, w_h)),
        ("softmax    [4096, 4096] f16", lambda: kaionb.softmax(x),
         lambda: softmax.softmax_ref(x_h)),
        ("silu gate  [4096, 4096] f16", lambda: kaionb.fused_silu_gate(x, g),
         lambda: activations.fused_silu_gate_ref(x_h, g_h)),
        ("gelu tanh  [4096, 4096] f16", lambda: kaionb.gelu(x, approximate="tanh"),
         lambda: activations.gelu_ref(x_h, approximate="tanh")),
        ("int8 quantize per row [4096, 4096]", lambda: kaionb.quantize_int8(x, axis=0)[0],
         lambda: quantize.quantize_int8_ref(x_h, axis=0)[0]),
        ("matmul 2048³ bf16 → f32", lambda: kaionb.matmul(a, b),
         lambda: matmul.matmul_ref(a_h, b_h)),
        ("matmul_int4 16×4096×4096 (GPTQ g128)", lambda: kaionb.matmul_int4(t, w4),
         lambda: matmul_int4.matmul_int4_ref(t_h, w4)),
        ("attention GQA 16/4 S1000 D128 causal", lambda: kaionb.attention(q, k, v, causal=True),
         lambda: attention.attention_ref(q_h, k_h, v_h, causal=True)[0]),
    ]
    print(f"\n{'op':36s} {'rel. error':>10s} {'µs':>9s}")
    for name, run, ref in cases:
        err = relative_error(run().get(), ref())
        print(f"{name:36s} {err:10.2e} {_timed(run):9.1f}")


def _arch_list(text: str) -> list[str]:
    archs = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in archs if a not in CHECK_ARCHS.values()]
    if unknown or not archs:
        raise argparse.ArgumentTypeError(
            f"expected {', '.join(CHECK_ARCHS.values())} (comma-separated), got {text!r}")
    return archs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kaionb.showcase",
        description="What kaionb does on this machine: with a GPU, arrays and every op family "
                    "checked and timed; without one, every kernel compiled and assembled.")
    parser.add_argument("--arch", action="extend", type=_arch_list, metavar="ARCH[,ARCH]",
                        help="without a GPU, assemble for these architectures only "
                             f"(repeatable; default: {', '.join(CHECK_ARCHS.values())})")
    args = parser.parse_args(argv)
    archs = args.arch or list(CHECK_ARCHS.values())
    print(f"kaionb {kaionb.__version__}")
    if kaionb.gpu_available():
        gpu_tour()
        ops_tour()
        return 0
    print("No CUDA GPU on this machine: nothing can run here. Instead, every kernel is "
          f"compiled (numba → PTX) and assembled (ptxas) for {', '.join(archs)}.\n",
          flush=True)
    return 0 if ptxas_table(archs) else 1


if __name__ == "__main__":
    sys.exit(main())
