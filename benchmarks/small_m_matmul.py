"""16-bit matmul on grids of few output tiles (16 < M ≤ 256 at N = 4096): cuBLAS against
each kernel that could serve the shape and the public call, same tensors, same run.

    python benchmarks/small_m_matmul.py [--ms 32,64,128,256] [--ks 1024,2048,3072,4096,8192]
        [--dtype f16] [--layout nt]

Columns (µs per call, ratio cuBLAS / ours in brackets): ``mma`` the mma.sync split-K tiles
(``prefer_wgmma=False``), ``narrow`` the Hopper kernel's 128×128 tile alone, ``split`` /
``split64`` its split-K tiles (128×128 / 128×64) with the default splits
(``matmul_hopper.split_count``), ``public``
``kaionb.matmul`` (``matmul_hopper.choose_tile`` picks); the Hopper tiles run through
their launch plans (``matmul_hopper.launch`` / ``run``), as the public call does. Layout
``nt``: B is the ``w.T`` view of a row-major [N, K] weight; ``nn``: B row-major [K, N].
Every call is checked first (output poisoned with NaN, relative error against a float64
product < 1e-2). Calls rotate over enough copies of the operands to exceed 3× the L2 (B
comes from HBM, as in a model's layer), GPU time as decode_stream_table.py measures it
(calls queued behind a sleep).
"""

import argparse

from decode_stream_table import gpu_us  # benchmarks/ is on sys.path as a script

import kaionb
from kaionb.kernels import matmul as mm
from kaionb.kernels import matmul_hopper as mh

N = 4096
L2_COPIES_BYTES = 160_000_000
TOL = 1e-2
HOPPER_TILES = ("narrow", "split", "split64")  # the Hopper kernel's columns


def kernels(a, b, outs, copies, dtype, layout):
    """name -> call(i) of every candidate, rotating over the copies."""
    def forced(**options):
        return lambda i: mm.matmul_fwd("small_m_matmul", a[i % copies], b[i % copies],
                                       out=outs[i % copies], **options)

    def planned(tile):
        # The Hopper tiles through their launch plans, as the public call's plan cache
        # runs them (a forced tile re-plans on every call: host-bound).
        plans = {}
        m, k = a[0].shape
        kind = mm._OUT_KIND[outs[0].dtype]

        def call(i):
            j = i % copies
            if j in plans:
                mh.run(plans[j], outs[j], kind)
            elif layout == "nt":  # B = w.T: K-major, its storage the [N, K] weight
                plans[j] = mh.launch(dtype, tile, a[j], k, True, b[j].T, k, True, outs[j], m,
                                     N, k, kind)
            else:
                plans[j] = mh.launch(dtype, tile, a[j], k, True, b[j], N, False, outs[j], m,
                                     N, k, kind)
        return call

    return {"mma": forced(prefer_wgmma=False), **{t: planned(t) for t in HOPPER_TILES},
            "public": lambda i: kaionb.matmul(a[i % copies], b[i % copies],
                                              out=outs[i % copies])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", default="32,64,128,256")
    parser.add_argument("--ks", default="1024,2048,3072,4096,8192")
    parser.add_argument("--dtype", default="f16", choices=("f16", "bf16"))
    parser.add_argument("--layout", default="nt", choices=("nt", "nn"))
    args = parser.parse_args()
    if not kaionb.gpu_available():
        print("no CUDA GPU: nothing to time")
        return
    import torch

    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    for m in map(int, args.ms.split(",")):
        for k in map(int, args.ks.split(",")):
            copies = max(2, -(-L2_COPIES_BYTES // (2 * N * k)))
            at = [torch.randn(m, k, dtype=dt, device="cuda") for _ in range(copies)]
            bt = [torch.randn(N, k, dtype=dt, device="cuda").T if args.layout == "nt"
                  else torch.randn(k, N, dtype=dt, device="cuda") for _ in range(copies)]
            ot = [torch.empty(m, N, dtype=dt, device="cuda") for _ in range(copies)]
            a, b = [kaionb.asarray(x) for x in at], [kaionb.asarray(x) for x in bt]
            outs = [kaionb.asarray(x) for x in ot]
            ref = at[0].double() @ bt[0].double()
            row = {}
            for name, fn in kernels(a, b, outs, copies, args.dtype, args.layout).items():
                ot[0].fill_(float("nan"))
                fn(0)
                err = ((ot[0].double() - ref).norm() / ref.norm()).item()
                if not err < TOL:  # NaN (an unwritten element) fails too
                    raise SystemExit(f"{name} M={m} K={k}: relative error {err:.2e}")
                row[name] = gpu_us(torch, fn)
            t = gpu_us(torch, lambda i: torch.matmul(at[i % copies], bt[i % copies],
                                                     out=ot[i % copies]))
            cells = " | ".join(f"{name} {us:6.1f} ({t / us:.2f})" for name, us in row.items())
            print(f"{args.dtype} {args.layout} M={m:3d} K={k:5d}: cuBLAS {t:6.1f} | {cells}",
                  flush=True)


if __name__ == "__main__":
    main()
