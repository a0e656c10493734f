"""Property-based fuzzing of every public op on the GPU, against float64 NumPy.

One table (``OPS``) of op families: each draws a case — shapes (0, 1, primes, one off
every tile size, now and then a large one), dtypes, layouts (transposed, stepped,
flipped, padded or misaligned rows, broadcast), ``out=`` (NaN-poisoned, in several
layouts, or an input itself where the op allows in place) and the op's own options —
builds fresh random inputs (never zeros) from the case's seed, runs the op and checks it
against the float64 reference and tolerance that op's own tests use (their reference
functions and helpers, imported). The float64 references are kept to a bounded size.

Run on the GPU machine (without a GPU every test here skips):

    python -m pytest -q tests/test_fuzz_ops.py                 # "ci": a fixed 50 per op
    KAIONB_FUZZ_PROFILE=gpu-long python -m pytest -q tests/test_fuzz_ops.py \\
        --hypothesis-show-statistics                            # 2000 per op
    bash tests/run_fuzz_long.sh LOGDIR                         # gpu-long, in parallel, timed

``KAIONB_FUZZ_SECONDS=N`` stops running an op's examples after N seconds. A failure
prints the shrunk case and a ``@reproduce_failure(...)`` blob; with a random profile the
``--hypothesis-seed`` the run used (run_fuzz_long.sh prints it) replays the whole run.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import kaionb
from kaionb.kernels import attention as at
from kaionb.kernels import elementwise
from kaionb.kernels import matmul_int4 as mi4
from kaionb.kernels.activations import (fused_silu_gate_bwd_ref, fused_silu_gate_ref,
                                        gelu_bwd_ref, gelu_ref)
from kaionb.kernels.matmul_int8 import matmul_int8_ref, qkv_project_int8_ref
from kaionb.kernels.norms import (add_rms_norm_bwd_ref, layer_norm_bwd_ref, layer_norm_ref,
                                  rms_norm_bwd_ref, rms_norm_ref)
from kaionb.kernels.optim import adamw_ref
from kaionb.kernels.quantize import dequantize_int8_ref, quantize_int8_ref
from kaionb.kernels.rope import rope_ref
from kaionb.kernels.softmax import softmax_bwd_ref, softmax_ref
from kaionb.testing import assert_close, random_array, relative_error, tolerance

from fuzz_strategies import (ALL_DTYPES, ANY_LAYOUTS, BF16, BOOL, F16, F32, F64, FLOATS, I8,
                             I16, I32, I64, OUT_LAYOUTS, ROW_LAYOUTS, U8, Out, cap, on_device,
                             rarely, seeds, shapes, sizes, time_budget)
from test_adamw import TOL as ADAMW_TOL
from test_array_api import _close, _inputs
from test_array_api import _numpy as numpy_ufunc
from test_attention import LSE_TOL
from test_attention import TOL as ATTENTION_TOL
from test_attention_bwd import TOL as ATTENTION_BWD_TOL
from test_matmul import F32_TOL, OUT_TOL
from test_matmul import TOL as MATMUL_TOL
from test_matmul_int4 import TOL as INT4_TOL
from test_matmul_int4 import _weight as int4_weight
from test_matmul_w8a8 import MODES as SCALE_MODES
from test_matmul_w8a8 import TOL as INT8_TOL
from test_matmul_w8a8 import _scales as int8_scales
from test_norms import _sum_rounded
from test_norms_bwd import _dy_scale, assert_dw, assert_dx
from test_quantize import check_q
from test_random import EPS as RANDOM_EPS
from test_random import TOL as RANDOM_TOL
from test_random import _bits, integers_ref, normal_ref, uniform_ref
from test_reductions import _sample as reduction_sample
from test_reductions import check as check_reduction
from test_rope import _host_cache

pytestmark = pytest.mark.gpu


class FuzzOp(NamedTuple):
    """One op family: ``cases`` draws a dict (its "seed" seeds the values); ``check(case)``
    builds the inputs, runs the op and compares."""

    name: str
    cases: object
    check: object


def outputs_of(case, shape, dtype):
    """An ``Out`` for the case's "out" choice (None: the op allocates)."""
    return None if case["out"] is None else Out(shape, dtype, case["out"])


def check_out(result, out):
    """A given ``out=`` is the result, and nothing around it was written."""
    if out is not None:
        assert result is out.array, "out= given: the result must be that array"
        out.untouched()


# One step of each float type's subnormal range: how far a correctly rounded result that
# underflows may lie from float64 (GELU far left, a small scaled int8 sum in float16).
SUBNORMAL_STEP = {F64: 2.0**-1074, F32: 2.0**-149, F16: 2.0**-24, BF16: 2.0**-133}


def assert_near(got, ref, *, dtype=None, tol=None, what="result", scale=0.0):
    """kaionb.testing.assert_close (‖got − ref‖ / ‖ref‖ under the dtype's tolerance),
    with one subnormal step of the result's type of absolute slack per element, and
    ``scale`` added to ‖ref‖ where the rounding scales with more than the result (terms
    that cancel: ‖ref‖ alone would ask for more than the arithmetic can give)."""
    host = got.get() if isinstance(got, kaionb.DeviceArray) else np.asarray(got)
    tol = tolerance(dtype or host.dtype) if tol is None else tol
    if relative_error(host, ref) <= tol:
        return
    h, r = np.asarray(host, np.float64), np.asarray(ref, np.float64)
    finite = np.isfinite(r)
    slack = SUBNORMAL_STEP.get(np.dtype(host.dtype), 0.0) * math.sqrt(h.size)
    close = (np.linalg.norm(h[finite] - r[finite])
             <= tol * (np.linalg.norm(r[finite]) + scale) + slack)
    if close and np.array_equal(np.isfinite(h), finite) and np.array_equal(h[~finite],
                                                                            r[~finite]):
        return
    assert_close(host, ref, tol=tol, what=what)  # fails, showing the first mismatches


def _eps_norm(x, dtype) -> float:
    """The extra reference size (``assert_near``'s ``scale``) that allows an absolute
    rounding of float32's epsilon·|x| (the kernels' arithmetic) under ``dtype``'s
    tolerance."""
    return 2.0**-23 / tolerance(dtype) * float(np.linalg.norm(np.asarray(x, np.float64)))


def assert_matmul_close(got, ref, a, b, tol, what="result"):
    """‖got − ref‖ / ‖ref‖ under ``tol``, or where the outputs are few and cancel (‖ref‖
    far below its typical size ‖|a|·|b|‖ / √K) against that size: the rounding of a dot
    product scales with Σ|a_k·b_k|, not with the sum."""
    host = np.asarray(got.get() if hasattr(got, "get") else got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert host.shape == ref.shape, (what, host.shape, ref.shape)
    assert np.isfinite(host).all(), f"{what}: non-finite values (unwritten output?)"
    k = a.shape[-1]
    if not ref.size or not k:
        assert np.array_equal(host, ref), what
        return
    typical = np.linalg.norm(np.matmul(np.abs(np.asarray(a, np.float64)),
                                       np.abs(np.asarray(b, np.float64)))) / math.sqrt(k)
    err = np.linalg.norm(host - ref) / max(np.linalg.norm(ref), typical)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


def lead_shape(max_dims=2, hi=4):
    return st.lists(sizes(1, hi), max_size=max_dims).map(tuple)


# -- matmul and the matmul_tc family ---------------------------------------------------------

MATMUL_ENTRIES = {"matmul": FLOATS, "matmul_tc": (F16,), "matmul_tc_async": (F16,),
                  "matmul_tc_bf16": (BF16,), "matmul_tc_bf16_async": (BF16,)}
MATMUL_LAYOUTS = ("n", "t", "step_last", "offset")  # "t": stored transposed (a .mT view)


def matmul_operand(host, layout):
    if host.ndim < 2 or layout == "n":
        return kaionb.asarray(host)
    if layout == "t":
        return kaionb.asarray(np.ascontiguousarray(np.swapaxes(host, -1, -2))).mT
    return on_device(host, layout)[0]


@st.composite
def matmul_cases(draw):
    entry = draw(st.sampled_from(sorted(MATMUL_ENTRIES)))
    dtype = draw(st.sampled_from(MATMUL_ENTRIES[entry]))
    m, n = draw(sizes(1, 160, large=(500, 1100))), draw(sizes(1, 160, large=(500, 1100)))
    k = draw(rarely(sizes(1, 300, large=(600, 2100)), st.just(0), one_in=16))
    batch_a = batch_b = ()
    vector = None
    if entry == "matmul":
        batch_a = draw(rarely(st.just(()), lead_shape(), one_in=3))
        batch_b = draw(st.sampled_from([(), batch_a[-1:], tuple(1 for _ in batch_a), batch_a]))
        vector = draw(rarely(st.none(), st.sampled_from(["a", "b"])))
    m, n, k = cap((m, n, k), 2e8 / math.prod(batch_a))
    if draw(st.booleans()):  # 16-byte rows: the cp.async and (on an H100) wgmma paths
        m, n, k = (-(-d // 8) * 8 for d in (m, n, k))
    shape_a = (k,) if vector == "a" else batch_a + (m, k)
    shape_b = (k,) if vector == "b" else batch_b + (k, n)
    return dict(entry=entry, dtype=dtype, shape_a=shape_a, shape_b=shape_b,
                layouts=(draw(st.sampled_from(MATMUL_LAYOUTS)),
                         draw(st.sampled_from(MATMUL_LAYOUTS))),
                out_dtype=draw(st.sampled_from([None, F32, F16, BF16])),
                out=draw(st.sampled_from([None, "c"])),
                precision=draw(st.sampled_from(["highest", "tf32"])), seed=draw(seeds))


def check_matmul(c):
    rng = np.random.default_rng(c["seed"])
    a, b = (random_array(s, c["dtype"], rng=rng) for s in (c["shape_a"], c["shape_b"]))
    da, db = (matmul_operand(h, lay) for h, lay in zip((a, b), c["layouts"]))
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    default = c["dtype"] if c["entry"] == "matmul" else F32
    dtype = c["out_dtype"] or default
    out = outputs_of(c, ref.shape, dtype)
    kw = dict(precision=c["precision"]) if c["entry"] == "matmul" else {}
    got = getattr(kaionb, c["entry"])(da, db, out=None if out is None else out.array,
                                      dtype=c["out_dtype"], **kw)
    check_out(got, out)
    assert got.dtype == dtype and got.shape == ref.shape
    tol = MATMUL_TOL.get(c["dtype"], F32_TOL[c["precision"]]) + OUT_TOL[np.dtype(dtype)]
    assert_matmul_close(got, ref, a, b, tol)


# -- matmul_int8 and qkv_project_int8 ---------------------------------------------------------

@st.composite
def matmul_int8_cases(draw):
    m, n = draw(sizes(1, 300, large=(1000, 2100))), draw(sizes(1, 300, large=(1000, 2100)))
    k = draw(sizes(1, 600, large=(1000, 4100)))
    batch = draw(rarely(st.just(()), st.tuples(sizes(1, 3)), one_in=4))
    m, n, k = cap((m, n, k), 2e8 / math.prod(batch))
    if draw(st.booleans()):  # TMA rows (the wgmma kernel on an H100, for large M·N)
        n, k = -(-n // 8) * 8, -(-k // 16) * 16
    return dict(batch=batch, m=m, n=n, k=k, a_layout=draw(st.sampled_from(
        ["c", "c", "offset", "padded_rows"])), b_kmajor=draw(st.booleans()),
        mode=draw(st.sampled_from(SCALE_MODES)),
        bias=draw(st.sampled_from([None, F32, F16, BF16])),
        out_dtype=draw(st.sampled_from([None, F32, F16, BF16])),
        out=draw(st.sampled_from([None, "c"])), seed=draw(seeds))


def check_matmul_int8(c):
    rng = np.random.default_rng(c["seed"])
    n, k, rows = c["n"], c["k"], c["batch"] + (c["m"],)
    a = rng.integers(-128, 128, rows + (k,), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)  # the [N, K] checkpoint layout
    da = on_device(a, c["a_layout"])[0]
    db = kaionb.asarray(w).T if c["b_kmajor"] else kaionb.asarray(np.ascontiguousarray(w.T))
    host_scale, dev_scale = int8_scales(c["mode"], rows, n, rng)
    bias = None if c["bias"] is None else rng.standard_normal(n).astype(c["bias"])
    dtype = c["out_dtype"] or F32
    out = outputs_of(c, rows + (n,), dtype)
    got = kaionb.matmul_int8(da, db, dev_scale, bias=None if bias is None else
                             kaionb.asarray(bias), out=None if out is None else out.array,
                             dtype=c["out_dtype"])
    check_out(got, out)
    assert got.dtype == dtype
    assert_near(got, matmul_int8_ref(a, w.T, host_scale, bias), tol=INT8_TOL[np.dtype(dtype)])


@st.composite
def qkv_int8_cases(draw):
    m = draw(rarely(sizes(1, 80), st.integers(81, 400), one_in=4))
    hidden = draw(sizes(1, 600, large=(1000, 4100)))
    n_q, n_kv = draw(sizes(1, 300)), draw(sizes(1, 200))
    batch = draw(rarely(st.just(()), st.tuples(sizes(1, 3)), one_in=4))
    m, hidden, n_q, n_kv = cap((m, hidden, n_q, n_kv), 5e7 / math.prod(batch))
    return dict(rows=batch + (m,), hidden=hidden, widths=(n_q, n_kv, n_kv),
                x_dtype=draw(st.sampled_from([I8, F16, BF16])),
                x_scale=draw(st.sampled_from(["float", "0-d", "row"])),
                per_channel=draw(st.lists(st.booleans(), min_size=3, max_size=3)),
                b_kmajor=draw(st.booleans()),
                bias=draw(st.one_of(st.none(), st.lists(st.sampled_from([None, F32, F16]),
                                                        min_size=3, max_size=3))),
                out_dtype=draw(st.sampled_from([None, F32, F16, BF16])),
                out=draw(st.sampled_from([None, "c"])), seed=draw(seeds))


def check_qkv_int8(c):
    rng = np.random.default_rng(c["seed"])
    rows, hidden, widths = c["rows"], c["hidden"], c["widths"]
    if c["x_dtype"] == I8:
        x = rng.integers(-128, 128, rows + (hidden,), dtype=np.int8)
        sx = (rng.uniform(0.5, 2.0, rows) * 1e-2).astype(np.float32)
        host_sx, dev_sx = {"float": (2e-3, 2e-3),
                           "0-d": (np.float32(2e-3), kaionb.asarray(np.array(np.float32(2e-3)))),
                           "row": (sx, kaionb.asarray(sx))}[c["x_scale"]]
    else:
        x = (rng.standard_normal(rows + (hidden,)) * 3).astype(c["x_dtype"])
        dev_sx = None
    ws = [rng.integers(-128, 128, (n, hidden), dtype=np.int8) for n in widths]  # [N, hidden]
    dws = [kaionb.asarray(w).T if c["b_kmajor"] else kaionb.asarray(np.ascontiguousarray(w.T))
           for w in ws]
    scales = [(rng.uniform(0.5, 2.0, n) * 1e-3).astype(np.float32) if pc else 3e-3
              for n, pc in zip(widths, c["per_channel"])]
    dscales = [kaionb.asarray(s) if isinstance(s, np.ndarray) else s for s in scales]
    biases = None if c["bias"] is None else [None if b is None else
                                             rng.standard_normal(n).astype(b)
                                             for b, n in zip(c["bias"], widths)]
    dtype = c["out_dtype"] or (F32 if c["x_dtype"] == I8 else c["x_dtype"])
    outs = None if c["out"] is None else [Out(rows + (n,), dtype) for n in widths]
    dx = kaionb.asarray(x)
    got = kaionb.qkv_project_int8(
        dx, *dws, *dscales, x_scale=dev_sx,
        bias=None if biases is None else tuple(None if b is None else kaionb.asarray(b)
                                               for b in biases),
        out=None if outs is None else tuple(o.array for o in outs), dtype=c["out_dtype"])
    if c["x_dtype"] != I8:  # the reference quantizes x as kaionb.quantize_int8 does
        qx, sx = kaionb.quantize_int8(dx.reshape(-1, hidden), axis=0)
        x, host_sx = qx.get().reshape(x.shape), sx.get().reshape(rows)
    refs = qkv_project_int8_ref(x, *(w.T for w in ws), *scales, x_scale=host_sx, bias=biases)
    for i, (g, ref) in enumerate(zip(got, refs)):
        check_out(g, None if outs is None else outs[i])
        assert g.dtype == dtype and g.shape == ref.shape
        assert_near(g, ref, tol=INT8_TOL[np.dtype(dtype)], what="qkv"[i])


# -- matmul_int4, qkv_project_int4, pack / quantize / dequantize_int4 ----------------------

@st.composite
def int4_weight_cases(draw, k=None):
    """(K, N, group_size, asymmetric, act order) of one packed weight."""
    g = draw(st.sampled_from([32, 64, 128, -1]))
    if k is None:
        k = draw(sizes(1, 700)) if g == -1 else g * draw(sizes(1, 8))
    elif g != -1 and k % g:
        g = -1
    return k, draw(sizes(1, 300)), g, draw(st.booleans()), draw(st.booleans()) and g != -1


@st.composite
def matmul_int4_cases(draw):
    k, n, g, asym, act = draw(int4_weight_cases())
    m = draw(rarely(sizes(1, 128), st.integers(129, 300), one_in=4))  # streaming / dense
    lead = draw(rarely(st.just(()), st.tuples(sizes(1, 3)), one_in=4))
    return dict(k=k, n=n, g=g, asym=asym, act=act, rows=lead + (m,),
                dtype=draw(st.sampled_from([F16, BF16])),
                layout=draw(st.sampled_from(["c", "offset", "padded_rows"])),
                out_dtype=draw(st.sampled_from([None, F32, F16, BF16])),
                out=draw(st.sampled_from([None, "c"])), seed=draw(seeds))


def int4_reference_weight(w, w16, dtype):
    """The dequantized weight a matmul of ``dtype`` activations multiplies by."""
    return w16 if dtype == F16 else mi4.dequantize_int4_ref(w, BF16)


def check_matmul_int4(c):
    rng = np.random.default_rng(c["seed"])
    w, w16 = int4_weight(c["k"], c["n"], c["g"], c["asym"], rng, c["act"])
    # the packed weight as dequantize_int4 gives it, bit for bit, in both half types
    for dt in (F16, BF16):
        deq = Out((c["k"], c["n"]), dt)
        check_out(kaionb.dequantize_int4(w, dt, out=deq.array), deq)
        np.testing.assert_array_equal(deq.array.get().view(np.uint16),
                                      np.asarray(mi4.dequantize_int4_ref(w, dt)).view(np.uint16))
    x = random_array(c["rows"] + (c["k"],), c["dtype"], rng=rng)
    dx = on_device(x, c["layout"])[0]
    dtype = c["out_dtype"] or c["dtype"]
    out = outputs_of(c, c["rows"] + (c["n"],), dtype)
    got = kaionb.matmul_int4(dx, w, out=None if out is None else out.array, dtype=c["out_dtype"])
    check_out(got, out)
    assert got.dtype == dtype
    wref = int4_reference_weight(w, w16, c["dtype"])
    assert_matmul_close(got, np.matmul(x.astype(np.float64), wref.astype(np.float64)), x, wref,
                        INT4_TOL[np.dtype(dtype)])


@st.composite
def qkv_int4_cases(draw):
    k, *first = draw(int4_weight_cases())
    n_kv = draw(sizes(1, 200))
    weights = [tuple(first)] + [(n_kv,) + draw(int4_weight_cases(k=k))[2:] for _ in range(2)]
    m = draw(rarely(sizes(1, 128), st.integers(129, 300), one_in=4))
    return dict(k=k, weights=weights, rows=draw(rarely(st.just(()), st.tuples(sizes(1, 3)),
                                                        one_in=4)) + (m,),
                dtype=draw(st.sampled_from([F16, BF16])),
                out_dtype=draw(st.sampled_from([None, F32, F16, BF16])),
                out=draw(st.sampled_from([None, "c"])), seed=draw(seeds))


def check_qkv_int4(c):
    rng = np.random.default_rng(c["seed"])
    packed = [int4_weight(c["k"], n, g, asym, rng, act) for n, g, asym, act in c["weights"]]
    x = random_array(c["rows"] + (c["k"],), c["dtype"], rng=rng)
    dtype = c["out_dtype"] or c["dtype"]
    outs = None if c["out"] is None else [Out(c["rows"] + (w.n,), dtype) for w, _ in packed]
    got = kaionb.qkv_project_int4(kaionb.asarray(x), *(w for w, _ in packed),
                                  out=None if outs is None else tuple(o.array for o in outs),
                                  dtype=c["out_dtype"])
    for i, (g, (w, w16)) in enumerate(zip(got, packed)):
        check_out(g, None if outs is None else outs[i])
        assert g.dtype == dtype
        wref = int4_reference_weight(w, w16, c["dtype"])
        assert_matmul_close(g, np.matmul(x.astype(np.float64), wref.astype(np.float64)), x,
                            wref, INT4_TOL[np.dtype(dtype)], what="qkv"[i])


@st.composite
def quantize_int4_cases(draw):
    g = draw(st.sampled_from([32, 64, 128, -1]))
    k = draw(sizes(1, 700)) if g == -1 else g * draw(sizes(1, 8))
    return dict(k=k, n=draw(sizes(1, 300)), g=g, symmetric=draw(st.booleans()),
                dtype=draw(st.sampled_from([F32, F16, BF16])), on_gpu=draw(st.booleans()),
                seed=draw(seeds))


def check_quantize_int4(c):
    rng = np.random.default_rng(c["seed"])
    wf = random_array((c["k"], c["n"]), c["dtype"], rng=rng, scale=rng.uniform(0.01, 3))
    w = kaionb.quantize_int4(kaionb.asarray(wf) if c["on_gpu"] else wf, c["g"], c["symmetric"])
    assert w.shape == wf.shape and w.symmetric == c["symmetric"]
    q, s16, zeros = mi4.quantize_int4_host("quantize_int4", wf, c["g"], c["symmetric"])
    rows = np.arange(c["k"]) // (c["k"] if c["g"] == -1 else c["g"])
    z = 8 if zeros is None else zeros.astype(np.float64)[rows]
    expect = (s16.astype(np.float64)[rows] * (q.astype(np.float64) - z)).astype(np.float16)
    np.testing.assert_array_equal(kaionb.dequantize_int4(w).get().view(np.uint16),
                                  expect.view(np.uint16))


# -- attention ----------------------------------------------------------------------------------

HEAD_DIMS = st.one_of(st.sampled_from([64, 128, 256]), st.integers(1, 32).map(lambda i: 8 * i))
KAIO_ENTRIES = ("attention_tc", "attention_tc_causal", "attention_flash",
                "attention_flash_causal")


@st.composite
def attention_cases(draw, backward=False):
    rank = draw(st.sampled_from([2, 3, 4, 4]))
    dims = (draw(sizes(1, 3)), draw(sizes(1, 4)), draw(sizes(1, 8)),
            draw(sizes(1, 200, large=(300, 1100))), draw(sizes(0, 200, large=(300, 4100))))
    d = draw(HEAD_DIMS)
    b, hkv, g, sq, sk = cap(dims, (1e7 if backward else 3e7) / d)
    if rank < 4:
        b = 1
    if rank == 2:
        hkv = g = 1
    entry = draw(rarely(st.just("attention"), st.sampled_from(KAIO_ENTRIES), one_in=3)) \
        if rank == 2 and not backward else "attention"
    dtype = F16 if entry.startswith("attention_tc") else draw(st.sampled_from(FLOATS))
    return dict(rank=rank, b=b, hkv=hkv, g=g, sq=sq, sk=sk, d=d, dtype=dtype, entry=entry,
                causal=draw(st.booleans()) if entry == "attention" else entry.endswith("causal"),
                scale=draw(rarely(st.none(), st.floats(0.02, 1.0))),
                layout=draw(st.sampled_from(["c", "bshd", "offset"])),
                out=draw(st.sampled_from([None, "c", "bshd"])),
                grad_dtype=draw(st.sampled_from([None, F32])), seed=draw(seeds))


def attention_inputs(c, rng, count=3):
    """q, then k and v (then dO), on the host and on the device in the case's layout:
    "bshd" a [B, S, H, D] memory seen transposed, "offset" rows one element in."""
    lead = {4: (c["b"], c["hkv"] * c["g"]), 3: (c["hkv"] * c["g"],), 2: ()}[c["rank"]]
    klead = lead[:-1] + (c["hkv"],) if lead else ()
    shapes_ = [lead + (c["sq"], c["d"]), klead + (c["sk"], c["d"]), klead + (c["sk"], c["d"]),
               lead + (c["sq"], c["d"])][:count]
    hosts = [random_array(s, c["dtype"], rng=rng) for s in shapes_]
    return hosts, [attention_operand(h, c["layout"]) for h in hosts]


def attention_operand(host, layout):
    if layout == "bshd" and host.ndim == 4:
        return kaionb.asarray(np.ascontiguousarray(host.transpose(0, 2, 1, 3))).transpose(
            0, 2, 1, 3)
    return on_device(host, "offset" if layout == "offset" else "c")[0]


def attention_out(c, shape, dtype):
    """A poisoned out= with 16-byte aligned rows (the kernels store 16 bytes at a time)."""
    if c["out"] is None:
        return None
    if c["out"] == "bshd" and len(shape) == 4:
        out = Out((shape[0], shape[2], shape[1], shape[3]), dtype)
        out.array = out.array.transpose(0, 2, 1, 3)
        return out
    return Out(shape, dtype)


def check_attention(c):
    rng = np.random.default_rng(c["seed"])
    (q, k, v), (dq, dk, dv) = attention_inputs(c, rng)
    ref, ref_lse = at.attention_ref(q, k, v, causal=c["causal"], scale=c["scale"])
    dtype = F32 if c["entry"].startswith("attention_tc") else c["dtype"]
    out = attention_out(c, q.shape, dtype)
    target = None if out is None else out.array
    if c["entry"] == "attention":
        got, lse = kaionb.attention(dq, dk, dv, causal=c["causal"], scale=c["scale"],
                                    return_lse=True, out=target)
    else:
        got, lse = getattr(kaionb, c["entry"])(dq, dk, dv, scale=c["scale"], with_stats=True,
                                               out=target)
    check_out(got, out)
    assert got.dtype == dtype and lse.shape == q.shape[:-1]
    assert_near(got, ref, tol=ATTENTION_TOL[c["dtype"]], what="out")
    if c["dtype"] == F32:
        # float32 inputs run on bfloat16 copies: their statistics are those of the copies
        # (with few keys lse is about one score, whose rounding scales with Σ|q·k|, not
        # with the score: Sk = 1 once gave 2e-3 against float64 of the float32 inputs)
        rounded = (x.astype(BF16).astype(F32) for x in (q, k, v))
        ref_lse = at.attention_ref(*rounded, causal=c["causal"], scale=c["scale"])[1]
    assert_near(lse, ref_lse, tol=LSE_TOL if c["dtype"] != F32 else 1e-3, what="lse")


def check_attention_bwd(c):
    rng = np.random.default_rng(c["seed"])
    (q, k, v, dout), (dq, dk, dv, ddout) = attention_inputs(c, rng, count=4)
    out, lse = kaionb.attention(dq, dk, dv, causal=c["causal"], scale=c["scale"],
                                return_lse=True)
    dtype = c["grad_dtype"] or c["dtype"]
    grads = None if c["out"] is None else [attention_out(c, x.shape, dtype) for x in (q, k, v)]
    got = kaionb.attention_bwd(ddout, dq, dk, dv, out, lse, causal=c["causal"],
                               scale=c["scale"], dtype=c["grad_dtype"],
                               grads=None if grads is None else tuple(g.array for g in grads))
    refs = at.attention_bwd_ref(dout, q, k, v, causal=c["causal"], scale=c["scale"])
    for i, (g, ref) in enumerate(zip(got, refs)):
        check_out(g, None if grads is None else grads[i])
        assert g.dtype == dtype
        assert_near(g, ref, tol=ATTENTION_BWD_TOL[c["dtype"]], what=("dq", "dk", "dv")[i])


# -- rms_norm, layer_norm, add_rms_norm and their backward passes ------------------------------

# Row widths where the row-wise kernels change plan (registers, streaming, clusters).
ROW_WIDTHS = (1, 7, 33, 1000, 4096, 8191, 8192, 8200, 16384, 16392, 32768, 32776, 40000)


@st.composite
def row_cases(draw, ops, max_elements=2e6):
    """A row-wise op's case: x [*lead, n] in a row layout, dtype, out choice."""
    n = draw(rarely(sizes(1, 300), st.sampled_from(ROW_WIDTHS), one_in=3))
    lead = draw(st.lists(sizes(0, 40, large=(100, 3000)), max_size=2).map(tuple))
    *lead, n = cap(lead + (n,), max_elements)
    return dict(op=draw(st.sampled_from(ops)), shape=tuple(lead) + (n,),
                dtype=draw(st.sampled_from(FLOATS)),
                layouts=(draw(st.sampled_from(ROW_LAYOUTS)), draw(st.sampled_from(ROW_LAYOUTS))),
                grad_layout=draw(st.sampled_from(ANY_LAYOUTS)),
                grad_dtype=draw(st.sampled_from(["x", F32])),
                out=draw(st.sampled_from([None, "c", "padded_rows", "offset"])),
                eps=draw(st.sampled_from([1e-6, 1e-5, 1e-3])), flag=draw(st.booleans()),
                alias=draw(rarely(st.none(), st.sampled_from(["in place", "swapped"]))),
                seed=draw(seeds))


def check_norm(c):
    rng = np.random.default_rng(c["seed"])
    op, shape, dtype, eps = c["op"], c["shape"], c["dtype"], c["eps"]
    n = shape[-1]
    layer = op == "layer_norm"
    x = random_array(shape, dtype, rng=rng, scale=2.0 if layer else 1.0, offset=3.0 * layer)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    dx = on_device(x, c["layouts"][0])[0]
    if op != "add_rms_norm":
        b = random_array((n,), dtype, rng=rng) if layer and c["flag"] else None
        out = outputs_of(c, shape, dtype)
        args = (dx, kaionb.asarray(w)) + ((None if b is None else kaionb.asarray(b),)
                                          if layer else ())
        got = getattr(kaionb, op)(*args, eps, out=None if out is None else out.array)
        check_out(got, out)
        ref = layer_norm_ref(x, w, b, eps) if layer else rms_norm_ref(x, w, eps)
        assert_near(got, ref, dtype=dtype)
        return
    r = random_array(shape, dtype, rng=rng, scale=3.0)
    dr = on_device(r, c["layouts"][1])[0]
    # in place (vLLM's residual stream): normed over x and s over residual, or swapped
    poisoned_outs = [outputs_of(c, shape, dtype) for _ in range(2)]
    outs = {None: tuple(None if o is None else o.array for o in poisoned_outs),
            "in place": (dx, dr), "swapped": (dr, dx)}[c["alias"]]
    normed, s = kaionb.add_rms_norm(dx, dr, kaionb.asarray(w), eps, out=outs[0],
                                    residual_out=outs[1])
    assert outs[0] is None or (normed is outs[0] and s is outs[1])
    if not c["alias"]:
        for got, o in zip((normed, s), poisoned_outs):
            check_out(got, o)
    ref_s = _sum_rounded(x, r)  # one float32 add, one rounding: bit for bit
    np.testing.assert_array_equal(s.get().view(np.uint8), ref_s.view(np.uint8))
    assert_near(normed, rms_norm_ref(ref_s, w, eps), dtype=dtype, what="normed")


def check_norm_bwd(c):
    rng = np.random.default_rng(c["seed"])
    op, shape, dtype, eps = c["op"], c["shape"], c["dtype"], c["eps"]
    gdt = dtype if c["grad_dtype"] == "x" else F32
    n, layer = shape[-1], op == "layer_norm_bwd"
    x = random_array(shape, dtype, rng=rng, scale=2.0, offset=3.0 * layer)
    g = random_array(shape, gdt, rng=rng)
    w = random_array((n,), dtype, rng=rng, scale=0.5, offset=1.0)
    dx, dg = on_device(x, c["layouts"][0])[0], on_device(g, c["layouts"][1])[0]
    extra = c["flag"]  # layer_norm: a bias; add_rms_norm: a gradient of s
    count = 3 if layer and extra else 2
    outs = None if c["out"] is None else [Out(shape, gdt, c["out"])] + [
        Out((n,), F32) for _ in range(count - 1)]
    target = None if outs is None else tuple(o.array for o in outs)
    scale = _dy_scale(g, x, w, eps, layer=layer)
    if op == "rms_norm_bwd":
        got = kaionb.rms_norm_bwd(dg, dx, kaionb.asarray(w), eps, out=target)
        refs = rms_norm_bwd_ref(g, x, w, eps)
    elif layer:
        b = random_array((n,), dtype, rng=rng) if extra else None
        got = kaionb.layer_norm_bwd(dg, dx, kaionb.asarray(w), None if b is None else
                                    kaionb.asarray(b), eps, out=target)
        refs = layer_norm_bwd_ref(g, x, w, b, eps)
        assert (got[2] is None) == (b is None)
    else:
        gs = random_array(shape, gdt, rng=rng) if extra else None
        got = kaionb.add_rms_norm_bwd(dg, None if gs is None else kaionb.asarray(gs), dx,
                                      kaionb.asarray(w), eps, out=target)
        refs = add_rms_norm_bwd_ref(g, gs, x, w, eps)
        if gs is not None:
            scale = np.abs(scale) + np.abs(gs.astype(np.float64))
    for i, o in enumerate(outs or ()):
        check_out(got[i], o)
    assert got[0].dtype == gdt
    assert_dx(got[0], refs[0], scale, gdt)
    for name, d, ref in zip(("dweight", "dbias"), got[1:], refs[1:]):
        if ref is not None:
            assert_dw(d, ref, name)


# -- softmax ----------------------------------------------------------------------------------

@st.composite
def softmax_cases(draw):
    shape = cap(draw(shapes(1, 4, sizes(1, 64, large=(100, 20000)))), 1e6)
    return dict(shape=shape, axis=draw(st.integers(-len(shape), len(shape) - 1)),
                dtype=draw(st.sampled_from(FLOATS)), grad_dtype=draw(st.sampled_from(["y", F32])),
                layouts=(draw(st.sampled_from(ANY_LAYOUTS)), draw(st.sampled_from(ANY_LAYOUTS))),
                out=draw(rarely(st.sampled_from((None,) + OUT_LAYOUTS), st.just("in place"))),
                backward=draw(st.booleans()), seed=draw(seeds))


def check_softmax(c):
    rng = np.random.default_rng(c["seed"])
    shape, axis, dtype = c["shape"], c["axis"], c["dtype"]
    if not c["backward"]:
        dx, x = on_device(random_array(shape, dtype, rng=rng, scale=3.0), c["layouts"][0])
        in_place = c["out"] == "in place" and c["layouts"][0] != "broadcast"
        out = None if c["out"] in (None, "in place") else Out(shape, dtype, c["out"])
        target = dx if in_place else None if out is None else out.array
        got = kaionb.softmax(dx, axis, out=target)
        check_out(got, out)
        assert got is dx or not in_place
        assert_near(got, softmax_ref(x, axis), dtype=dtype)
        return
    gdt = dtype if c["grad_dtype"] == "y" else F32
    y = softmax_ref(random_array(shape, F32, rng=rng, scale=2.0), axis).astype(dtype)
    dy, y = on_device(y, c["layouts"][0])
    dg, g = on_device(random_array(shape, gdt, rng=rng), c["layouts"][1])
    in_place = c["out"] == "in place" and c["layouts"][1] != "broadcast"
    out = None if c["out"] in (None, "in place") else Out(shape, gdt, c["out"])
    got = kaionb.softmax_bwd(dg, dy, axis, out=dg if in_place else
                             None if out is None else out.array)
    check_out(got, out)
    # As the norms' backward is measured: against ‖ref‖ + the size of the terms (y·g) that
    # dx = y·(g − Σ g·y) subtracts, so a line whose dx nearly cancels is held to rounding.
    ref = softmax_bwd_ref(g, y, axis)
    host = got.get().astype(np.float64)
    err = np.linalg.norm(host - ref) / (np.linalg.norm(ref) + np.linalg.norm(
        y.astype(np.float64) * g.astype(np.float64)) or 1.0)
    assert np.isfinite(host).all() and err <= tolerance(gdt), f"softmax_bwd: {err:.3e}"


# -- gelu, fused_silu_gate and their backward passes ------------------------------------------

def check_activation(c):
    rng = np.random.default_rng(c["seed"])
    shape, dtype, silu = c["shape"], c["dtype"], c["op"].startswith("fused_silu_gate")
    approximate = "tanh" if c["flag"] else "none"
    x = random_array(shape, dtype, rng=rng, scale=3.0)
    gate = random_array(shape, dtype, rng=rng)
    dx, dgate = on_device(x, c["layouts"][0])[0], on_device(gate, c["layouts"][1])[0]
    if not c["op"].endswith("_bwd"):
        out = outputs_of(c, shape, dtype)
        target = None if out is None else out.array
        got = kaionb.fused_silu_gate(dx, dgate, out=target) if silu else kaionb.gelu(
            dx, approximate, out=target)
        check_out(got, out)
        # x·Φ(x) as x·(1 + erf)/2 (as torch computes it) rounds 1 + erf at 1: in the far
        # negative tail the error is eps·|x|, not eps·|gelu(x)| (x = -5.3 in float32: 3%)
        assert_near(got, fused_silu_gate_ref(x, gate) if silu else gelu_ref(x, approximate),
                    dtype=dtype, scale=_eps_norm(x, dtype))
        return
    gdt = dtype if c["grad_dtype"] == "x" else F32
    dg, g = on_device(random_array(shape, gdt, rng=rng), c["grad_layout"])  # (any layout)
    outs = None if c["out"] is None else [Out(shape, gdt, c["out"]) for _ in range(1 + silu)]
    if silu:
        got = kaionb.fused_silu_gate_bwd(dg, dx, dgate, out=None if outs is None else
                                         tuple(o.array for o in outs))
        refs = fused_silu_gate_bwd_ref(g, x, gate)
    else:
        got = (kaionb.gelu_bwd(dg, dx, approximate, out=None if outs is None else
                               outs[0].array),)
        refs = (gelu_bwd_ref(g, x, approximate),)
    for i, (d, ref) in enumerate(zip(got, refs)):
        check_out(d, None if outs is None else outs[i])
        assert d.dtype == gdt
        assert_near(d, ref, tol=tolerance(gdt), what=("dx", "dgate")[i])


# -- rope, rope_bwd ------------------------------------------------------------------------------

@st.composite
def rope_cases(draw):
    rank = draw(st.sampled_from([2, 3, 4, 4, 5]))
    d = draw(sizes(2, 160))
    s, h = draw(sizes(1, 60)), draw(sizes(1, 9))
    batch = tuple(draw(sizes(1, 3)) for _ in range(rank - 3))
    layout = draw(st.sampled_from(["bshd", "bhsd"]))
    inner = ((s, h) if layout == "bshd" else (h, s)) if rank > 2 else (s,)
    positions = draw(st.sampled_from(["none", "host [S]", "host batch", "int32", "int64"]))
    return dict(shape=batch + inner + (d,), s=s, batch=batch, layout=layout,
                half=draw(st.integers(1, d // 2)), interleaved=draw(st.booleans()),
                positions=positions if rank > 3 or positions in ("none", "host [S]") else "none",
                extra_seq=draw(rarely(st.integers(0, 3), st.integers(4, 5000))),
                table=draw(rarely(st.just(F32), st.sampled_from([F16, BF16]))),
                dtype=draw(st.sampled_from(FLOATS)),
                view=draw(st.sampled_from(["c", "offset", "swapped", "reversed"])),
                out=draw(rarely(st.sampled_from([None, "c", "padded_rows"]), st.just("in place"))),
                backward=draw(st.booleans()), seed=draw(seeds))


def rope_x(c, rng):
    """(host x, device x): x in the case's view of a memory both sides slice alike —
    "offset" one element into each row, "swapped" the other layout's memory transposed,
    "reversed" the sequence backwards."""
    shape, view = c["shape"], c["view"]
    ndim = len(shape)
    s_axis = 0 if ndim == 2 else ndim - 3 if c["layout"] == "bshd" else ndim - 2
    if view == "offset":
        memory, pick = shape[:-1] + (shape[-1] + 1,), lambda a: a[..., 1:]
    elif view == "swapped" and ndim > 2:
        perm = list(range(ndim))
        perm[-3], perm[-2] = perm[-2], perm[-3]
        memory, pick = tuple(shape[p] for p in perm), lambda a: a.transpose(tuple(perm))
    elif view == "reversed":
        memory = shape
        pick = lambda a: a[(slice(None),) * s_axis + (slice(None, None, -1),)]  # noqa: E731
    else:
        memory, pick = shape, lambda a: a  # noqa: E731
    host = random_array(memory, c["dtype"], rng=rng)
    return pick(host), pick(kaionb.asarray(host))


def check_rope(c):
    rng = np.random.default_rng(c["seed"])
    x, dx = rope_x(c, rng)
    s, half = c["s"], c["half"]
    max_seq = s + c["extra_seq"]
    positions = {"none": None, "host [S]": rng.integers(0, max_seq, s),
                 "host batch": rng.integers(0, max_seq, c["batch"][-1:] + (s,))}.get(
        c["positions"])
    device_positions = None
    if c["positions"] in ("int32", "int64"):
        positions = rng.integers(0, max_seq, c["batch"] + (s,)).astype(c["positions"])
        device_positions = kaionb.asarray(positions)
    cos, sin = _host_cache(max_seq, half)
    tables = [kaionb.asarray(t.astype(c["table"])) for t in (cos, sin)]
    cos, sin = (t.astype(c["table"]).astype(np.float32) for t in (cos, sin))  # as used
    in_place = c["out"] == "in place"
    out = None if c["out"] in (None, "in place") else Out(x.shape, c["dtype"], c["out"])
    fn = kaionb.rope_bwd if c["backward"] else kaionb.rope
    got = fn(dx, *tables, positions=device_positions if device_positions is not None
             else positions, interleaved=c["interleaved"], layout=c["layout"],
             out=dx if in_place else None if out is None else out.array)
    check_out(got, out)
    assert got is dx or not in_place
    ref = rope_ref(x, cos, sin, positions, c["interleaved"], c["layout"], inverse=c["backward"])
    assert_near(got, ref, dtype=c["dtype"])
    rest = got.get()[..., 2 * half:]  # the pass-through features: copied bit for bit
    np.testing.assert_array_equal(rest.view(np.uint8), np.ascontiguousarray(x[..., 2 * half:])
                                  .view(np.uint8))


# -- quantize_int8, dequantize_int8 ----------------------------------------------------------

@st.composite
def quantize_cases(draw):
    axis = draw(st.sampled_from([None, -1, 0]))
    n = draw(rarely(sizes(1, 300), st.sampled_from(ROW_WIDTHS + (4112, 65536, 262144)),
                    one_in=3))
    lead = draw(st.lists(sizes(1, 40, large=(100, 3000)),  # (empty x: test_quantize's)
                         min_size=1 if axis == 0 else 0, max_size=1 if axis == 0 else 2))
    *lead, n = cap(tuple(lead) + (n,), 2e6)
    return dict(shape=tuple(lead) + (n,), axis=axis, dtype=draw(st.sampled_from(FLOATS)),
                layout=draw(st.sampled_from(ROW_LAYOUTS)), zero_group=draw(rarely(
                    st.just(False), st.just(True))), out=draw(st.sampled_from([None, "c"])),
                deq_dtype=draw(st.sampled_from(FLOATS)), seed=draw(seeds))


def check_quantize(c):
    rng = np.random.default_rng(c["seed"])
    shape, axis = c["shape"], c["axis"]
    x = random_array(shape, c["dtype"], rng=rng, scale=2.0)
    if c["zero_group"] and axis == 0:  # a group of zeros: scale 0, q 0
        x[0] = 0
    elif c["zero_group"] and axis == -1:
        x[..., 0] = 0
    ref_q, ref_s = quantize_int8_ref(x, axis)
    outs = None if c["out"] is None else (Out(shape, I8), Out(ref_s.shape, F32))
    q, s = kaionb.quantize_int8(on_device(x, c["layout"])[0], axis,
                                out=None if outs is None else (outs[0].array, outs[1].array))
    for got, o in zip((q, s), outs or (None, None)):
        check_out(got, o)
    assert q.dtype == I8 and q.shape == shape and s.shape == ref_s.shape
    assert_near(s, ref_s, tol=1e-6, what="scale")
    check_q(q, x, axis)
    out = Out(shape, c["deq_dtype"])
    check_out(kaionb.dequantize_int8(q, s, axis, c["deq_dtype"], out=out.array), out)
    assert_near(out.array, dequantize_int8_ref(q.get(), s.get(), axis), dtype=c["deq_dtype"])


# -- adamw_step ---------------------------------------------------------------------------------

@st.composite
def adamw_cases(draw):
    return dict(shape=cap(draw(shapes(0, 3, sizes(1, 64, large=(1000, 300000)))), 1e6),
                grad_dtype=draw(st.sampled_from(FLOATS)),
                copy=draw(st.sampled_from([None, F16, BF16])),
                misaligned=draw(rarely(st.none(), st.sampled_from(
                    ["param", "grad", "m", "v", "model_param"]))),
                lr=draw(st.floats(0, 0.1)), beta1=draw(st.floats(0, 0.99)),
                beta2=draw(st.floats(0.9, 0.9999)), eps=draw(st.floats(1e-8, 1e-4)),
                weight_decay=draw(st.floats(0, 0.2)), maximize=draw(st.booleans()),
                step=draw(st.integers(1, 10000)), steps=draw(st.integers(1, 3)),
                seed=draw(seeds))


def check_adamw(c):
    rng = np.random.default_rng(c["seed"])
    shape = c["shape"]

    def device(name, host):  # one element past an allocation: off 16-byte alignment
        if name != c["misaligned"] or not host.size:
            return kaionb.asarray(host)
        flat = np.concatenate([host.reshape(-1)[:1], host.reshape(-1)])
        return kaionb.asarray(flat)[1:].reshape(shape)

    ref = (random_array(shape, rng=rng), random_array(shape, rng=rng, scale=0.1),
           np.abs(random_array(shape, rng=rng, scale=0.01)))
    p, m, v = (device(n, h) for n, h in zip(("param", "m", "v"), ref))
    copy = None if c["copy"] is None else device("model_param",
                                                  np.full(shape, np.nan, c["copy"]))
    hyper = {k: c[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "maximize")}
    m0, v0 = (np.asarray(x, np.float64) for x in ref[1:])
    grads = []
    for step in range(c["step"], c["step"] + c["steps"]):
        g = random_array(shape, c["grad_dtype"], rng=rng, scale=0.1)
        grads.append(np.asarray(g, np.float64))
        assert kaionb.adamw_step(p, device("grad", g), m, v, step=step, model_param=copy,
                                 **hyper) is None
        ref = adamw_ref(*ref[:1], g, *ref[1:], step=step, **hyper)
    got = [x.get() for x in (p, m, v)]
    # m and v are running sums whose terms may cancel (maximize flips the gradient's
    # sign): their rounding scales with the terms, ‖m₀‖ + Σ‖g‖ and ‖v₀‖ + Σ‖g²‖
    terms = {"param": 0.0, "m": np.linalg.norm(m0) + sum(np.linalg.norm(g) for g in grads),
             "v": np.linalg.norm(v0) + sum(np.linalg.norm(np.square(g)) for g in grads)}
    for name, out, r in zip(("param", "m", "v"), got, ref):
        assert_near(out, r, tol=ADAMW_TOL, what=name, scale=terms[name])
    if copy is not None:  # the updated param rounded to nearest even, bit for bit
        np.testing.assert_array_equal(copy.get().view(np.uint16),
                                      got[0].astype(c["copy"]).view(np.uint16))


# -- elementwise ufuncs, where, clip ------------------------------------------------------------

def _accepts(name, dtype):
    """Whether kaionb and NumPy both have a loop for ``name`` on ``dtype`` operands."""
    spec = elementwise.UFUNCS[name]
    try:
        elementwise.resolve(name, (dtype,) * spec.nin)
        numpy_ufunc(name, *[np.ones(2, dtype)] * spec.nin)
    except (TypeError, ValueError):
        return False
    return True


UFUNCS = {name: tuple(d for d in ALL_DTYPES if _accepts(name, d))
          for name, spec in elementwise.UFUNCS.items()
          if hasattr(kaionb, name) and spec.numpy is not None and name != "clip"}
# Continuous in floats: against float64, rounded once to the result dtype (where the
# result overflows, both are inf). The others against NumPy in the operands' dtype,
# exactly for integers and booleans (elementwise rtol for floats: _close).
CONTINUOUS = {"add", "subtract", "multiply", "divide", "pow", "square", "exp", "log", "sqrt",
              "rsqrt", "sin", "cos", "tanh", "sigmoid"}
POSITIVE = {"log", "sqrt", "rsqrt"}  # real-valued only for positive inputs
FLOAT64_FORMULAS = {"rsqrt": lambda x: 1 / np.sqrt(x), "sigmoid": lambda x: 1 / (1 + np.exp(-x))}


@st.composite
def broadcast_shapes(draw, count):
    """A result shape and ``count`` operand shapes that broadcast to it (leading axes
    dropped, some axes 1)."""
    shape = draw(rarely(shapes(0, 4, sizes(0, 40)), st.tuples(st.integers(1000, 200000)),
                        one_in=10))
    operands = []
    for _ in range(count):
        s = shape[draw(st.integers(0, len(shape))):]
        operands.append(tuple(1 if draw(rarely(st.just(False), st.just(True), 4)) else d
                              for d in s))
    return shape, operands


@st.composite
def elementwise_cases(draw):
    kind = draw(st.sampled_from(["ufunc"] * 6 + ["where", "clip", "astype"]))
    name = draw(st.sampled_from(sorted(UFUNCS))) if kind == "ufunc" else kind
    nin = elementwise.UFUNCS[name].nin if kind == "ufunc" else {"astype": 1}.get(kind, 3)
    shape, operands = draw(broadcast_shapes(nin))
    dtypes = {"ufunc": lambda: st.sampled_from(UFUNCS[name]),
              "where": lambda: st.sampled_from([d for d in ALL_DTYPES if d != BF16]),
              "clip": lambda: st.sampled_from([F64, F32, F16, BF16, I64, I32, I8, U8]),
              "astype": lambda: st.sampled_from(ALL_DTYPES)}[kind]()
    return dict(kind=kind, name=name, shape=shape, operands=operands, dtype=draw(dtypes),
                dtype2=draw(dtypes), to=draw(st.sampled_from(ALL_DTYPES)),
                open_side=draw(rarely(st.none(), st.sampled_from(["min", "max"]))),
                layouts=[draw(st.sampled_from(ANY_LAYOUTS)) for _ in range(nin)],
                out=draw(rarely(st.sampled_from((None,) + OUT_LAYOUTS), st.just("in place"))),
                seed=draw(seeds))


def elementwise_inputs(c, rng, dtypes):
    """Host values and device arrays of the case's operand shapes, dtypes and layouts, in
    each op's real domain: positive for log / sqrt / rsqrt, pow of a base >= 0 (floats) to
    a small exponent >= 0, no integer 0 / 0 (NaN, which relative errors cannot compare)."""
    hosts, devs = [], []
    name = c["name"]
    for i, (shape, dt, layout) in enumerate(zip(c["operands"], dtypes, c["layouts"])):
        host = _inputs(dt, shape, rng, positive=name in POSITIVE)
        integral = np.dtype(dt).kind in "iub"
        if (name in POSITIVE or name == "divide" and i == 1) and integral:
            host = (np.abs(host.astype(np.int64)) % 100 + 1).astype(dt)
        elif name == "pow" and i == 1:
            host = (np.abs(host.astype(np.float64)) % 4).astype(dt)
        elif name == "pow" and not integral:
            host = np.abs(host.astype(np.float64)).astype(dt)
        dev, host = on_device(host, layout)
        hosts.append(host)
        devs.append(dev)
    return hosts, devs


def _astype_source(host, to):
    """Values whose conversion to ``to`` is defined (C leaves float to int out of range
    undefined) and single-rounded on both sides (no float64 to half)."""
    if host.dtype.kind == "f" or host.dtype == BF16:
        if np.dtype(to).kind in "iu":
            lo = 0 if np.dtype(to).kind == "u" else -100
            return np.clip(host.astype(np.float64), lo, 100).astype(host.dtype)
    return host


def check_elementwise(c):
    rng = np.random.default_rng(c["seed"])
    kind, name = c["kind"], c["name"]
    if kind == "astype":
        to = c["to"]
        # (single roundings on both sides: NumPy takes float64 and integers to the half
        # types through float32)
        assume(not (np.dtype(c["dtype"]).kind in "iub" or c["dtype"] == F64)
               or to not in (F16, BF16))
        host = _astype_source(_inputs(c["dtype"], c["operands"][0], rng), to)
        dev, host = on_device(host, c["layouts"][0])
        got = kaionb.astype(dev, to)
        assert got.dtype == np.dtype(to)
        _close(got, host.astype(to), f"astype {to}")
        _close(dev.copy(), host, "copy")
        return
    if kind == "where":
        hosts, devs = elementwise_inputs(c, rng, [BOOL, c["dtype"], c["dtype2"]])
        ref = np.where(*hosts)
        fn = kaionb.where
    elif kind == "clip":
        hosts, devs = elementwise_inputs(c, rng, [c["dtype"]] * 3)
        lo, hi = (None if c["open_side"] == side else h for side, h in zip(("min", "max"),
                                                                          hosts[1:]))
        ref = np.clip(hosts[0], lo, hi)  # (NumPy's types: bfloat16 with both bounds: float32)
        devs[1:] = [None if c["open_side"] == side else d for side, d in zip(("min", "max"),
                                                                             devs[1:])]
        fn = kaionb.clip
    else:
        hosts, devs = elementwise_inputs(c, rng, [c["dtype"]] * len(c["operands"]))
        ref = np.asarray(numpy_ufunc(name, *hosts))
        fn = getattr(kaionb, name)
    ref = np.asarray(ref)
    out = None
    if c["out"] == "in place":  # out is the first operand (a += b)
        assume(devs[0] is not None and devs[0].shape == ref.shape
               and devs[0].dtype == ref.dtype and c["layouts"][0] != "broadcast")
        target = devs[0]
    else:
        out = None if c["out"] is None else Out(ref.shape, ref.dtype, c["out"])
        target = None if out is None else out.array
    got = fn(*devs, out=target)
    check_out(got, out)
    assert got is target or target is None
    assert got.dtype == ref.dtype and got.shape == ref.shape
    float_result = ref.dtype.kind == "f" or ref.dtype == BF16
    if kind == "ufunc" and name in CONTINUOUS and float_result:
        wide = [h.astype(np.float64) for h in hosts]
        with np.errstate(all="ignore"):
            exact = FLOAT64_FORMULAS.get(name, lambda *xs: numpy_ufunc(name, *xs))(*wide)
        assert_near(got, np.asarray(exact).astype(ref.dtype), dtype=ref.dtype, what=name)
    else:
        if name in FLOAT64_FORMULAS:
            ref = FLOAT64_FORMULAS[name](hosts[0].astype(np.float64)).astype(ref.dtype)
        _close(got, ref, name)


# -- reductions -----------------------------------------------------------------------------------

REDUCTIONS = ("sum", "prod", "mean", "max", "min", "argmax", "argmin", "var", "std", "any",
              "all")
REDUCTION_VIEWS = {"c": lambda a: a, "T": lambda a: a.T, "step": lambda a: a[::2],
                   "flip_last": lambda a: a[..., ::-1], "slice_last": lambda a: a[..., 1:]}


@st.composite
def reduction_cases(draw):
    op = draw(st.sampled_from(REDUCTIONS))
    shape = cap(draw(rarely(shapes(0, 4, sizes(0, 64)), st.tuples(st.integers(1, 2**20)),
                            one_in=12)), 3e6)
    ndim = len(shape)
    if op in ("argmax", "argmin"):
        axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1))) if ndim else None
    else:
        axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1) if ndim else st.none(),
                              st.permutations(range(ndim)).flatmap(
                                  lambda p: st.integers(0, ndim).map(lambda i: tuple(p[:i])))))
    kw = {}
    if op in ("sum", "prod"):
        kw = draw(st.sampled_from([{}, {}, {"dtype": F32}, {"dtype": F64}, {"dtype": I64},
                                   {"dtype": I32}]))
    elif op in ("var", "std"):
        kw = {"correction": draw(st.sampled_from([0, 1, 0.5]))}
    return dict(op=op, shape=shape, axis=axis, kw=kw, dtype=draw(st.sampled_from(ALL_DTYPES)),
                view=draw(st.sampled_from(sorted(REDUCTION_VIEWS))),
                keepdims=draw(st.booleans()), out=draw(st.booleans()), seed=draw(seeds))


def check_reductions(c):
    rng = np.random.default_rng(c["seed"])
    op, axis, view = c["op"], c["axis"], REDUCTION_VIEWS[c["view"]]
    host = reduction_sample(op, c["dtype"], c["shape"], rng)
    if not host.ndim:
        view = REDUCTION_VIEWS["c"]
    h = view(host)
    reduced = range(h.ndim) if axis is None else [a % h.ndim for a in np.atleast_1d(axis)]
    count = math.prod(h.shape[a] for a in reduced)
    assume(op not in ("max", "min", "argmax", "argmin") or count > 0)  # refused: no identity
    kw = {("ddof" if k == "correction" else k): v for k, v in c["kw"].items()}
    with np.errstate(all="ignore"):
        expect = np.asarray(getattr(np, op)(h, axis=axis, keepdims=c["keepdims"], **kw))
    if op in ("sum", "mean") and (expect.dtype.kind == "f" or expect.dtype == BF16) and count:
        # Rounded partial sums: relative to a sum that cancels far below its typical size
        # (√N·|x|) their rounding is no longer small. Such draws are left out: Σ|x| over
        # |Σx|, norm-wise, at most 10·(√N + 1).
        wide = h.astype(c["kw"].get("dtype", h.dtype)).astype(np.float64)
        with np.errstate(all="ignore"):
            spread = np.linalg.norm(np.sum(np.abs(wide), axis=axis))
            total = np.linalg.norm(np.sum(wide, axis=axis))
        assume(spread <= 10 * (math.sqrt(count) + 1) * total)
    out = Out(expect.shape, expect.dtype) if c["out"] else None
    got = check_reduction(op, host, axis, view=view, keepdims=c["keepdims"],
                          out=None if out is None else out.array, **c["kw"])
    check_out(got, out)


# -- creation: arange, linspace, eye, full, concatenate, stack; take ------------------------------

@st.composite
def creation_cases(draw):
    fn = draw(st.sampled_from(["arange", "linspace", "eye", "full", "concatenate", "stack",
                               "take"]))
    return dict(fn=fn, shape=draw(shapes(1, 4, sizes(0, 40))), count=draw(st.integers(1, 4)),
                dtype=draw(st.sampled_from(ALL_DTYPES)),
                dtypes=draw(st.lists(st.sampled_from([F64, F32, F16, I32, I16, I8, U8, BOOL]),
                                     min_size=4, max_size=4)),
                mixed=draw(st.booleans()), layouts=draw(st.lists(st.sampled_from(ANY_LAYOUTS),
                                                                 min_size=4, max_size=4)),
                ints=draw(st.lists(st.integers(-50, 50), min_size=4, max_size=4)),
                floats=draw(st.lists(st.floats(-100, 100), min_size=3, max_size=3)),
                axis=draw(st.one_of(st.none(), st.integers(-5, 4))), flag=draw(st.booleans()),
                out=draw(st.sampled_from([None, "c", "step_last"])), seed=draw(seeds))


def same(got, ref, what, computed=False):
    """NumPy's dtype and values: exact for integers and copies (_close: rtol for floats);
    ``computed`` float values (a ramp: start + i·step, an fma on the GPU, two roundings in
    NumPy) norm-wise, where an element near 0 cannot tell the two apart."""
    assert got.dtype == ref.dtype, f"{what}: {got.dtype} vs NumPy's {ref.dtype}"
    if computed and (ref.dtype.kind == "f" or ref.dtype == BF16):
        assert_near(got, ref, what=what)
    else:
        _close(got, ref, what)


def check_creation(c):
    rng = np.random.default_rng(c["seed"])
    fn, ints, floats = c["fn"], c["ints"], c["floats"]
    if fn == "arange":
        step = ints[2] or 1
        if c["flag"]:  # integer bounds; the dtype NumPy's or one that holds the values
            dtype = None if ints[3] % 3 == 0 else [I64, I32, I16, F32, F64][ints[3] % 5]
            got = kaionb.arange(ints[0], ints[1], step, dtype=dtype)
            ref = np.arange(ints[0], ints[1], step)
        else:  # float bounds, computed in float64 and rounded once (as NumPy's default)
            span = abs(floats[1] - floats[0])
            step = math.copysign(max(abs(floats[2]), span / 5000, 1e-3), floats[2])
            dtype = [None, F32, F64][ints[3] % 3]
            got = kaionb.arange(floats[0], floats[1], step, dtype=dtype)
            ref = np.arange(floats[0], floats[1], step)
        same(got, ref.astype(dtype) if dtype is not None else ref, "arange", computed=True)
    elif fn == "linspace":
        num, dtype = abs(ints[0]), [None, F64, F32, F16, BF16, I64, I32][ints[1] % 7]
        # integer results truncate: start at 0, where both sides compute i·step alike
        start = 0.0 if dtype is not None and np.dtype(dtype).kind in "iu" else floats[0]
        got = kaionb.linspace(start, floats[1], num, endpoint=c["flag"], dtype=dtype)
        ref = np.linspace(start, floats[1], num, endpoint=c["flag"])
        same(got, ref.astype(dtype) if dtype is not None else ref, "linspace", computed=True)
    elif fn == "eye":
        n, m, k = abs(ints[0]) % 20, abs(ints[1]) % 20, ints[2] % 25 - 12
        same(kaionb.eye(n, m, k=k, dtype=c["dtype"]), np.eye(n, m, k=k, dtype=c["dtype"]), "eye")
    elif fn == "full":
        value = np.asarray(floats[0] if np.dtype(c["dtype"]).kind in "fV" else ints[0] % 2
                           if c["dtype"] == BOOL else ints[0]).astype(c["dtype"])
        same(kaionb.full(c["shape"], value, c["dtype"]), np.full(c["shape"], value, c["dtype"]),
             "full")
    elif fn in ("concatenate", "stack"):
        shape, axis = c["shape"], c["axis"]
        if fn == "concatenate" and axis is not None:
            assume(-len(shape) <= axis < len(shape))
        if fn == "stack":
            axis = 0 if axis is None else axis
            assume(-len(shape) - 1 <= axis <= len(shape))
        hosts, devs = [], []
        for i in range(c["count"]):
            s = list(shape)
            if fn == "concatenate" and axis is not None:
                s[axis] = abs(ints[i]) % 5  # the joined axis may differ
            dt = c["dtypes"][i] if c["mixed"] else c["dtypes"][0]
            dev, host = on_device(random_array(tuple(s), dt, rng=rng), c["layouts"][i])
            hosts.append(host)
            devs.append(dev)
        same(getattr(kaionb, fn)(devs, axis=axis), getattr(np, fn)(hosts, axis=axis), fn)
    else:  # take: host indices (in range, negative from the end) or device ones (wrapping)
        dev, x = on_device(random_array(c["shape"], c["dtype"], rng=rng), c["layouts"][0])
        axis = c["axis"]
        assume(axis is None or -x.ndim <= axis < x.ndim)
        n = x.size if axis is None else x.shape[axis]
        idx_shape = (abs(ints[0]) % 6,) if c["count"] < 3 else (2, abs(ints[0]) % 4)
        assume(n > 0 or not math.prod(idx_shape))
        if c["flag"]:
            idx = rng.integers(-n, n, idx_shape) if n else np.zeros(idx_shape, np.int64)
            indices, mode = idx, "raise"
        else:
            idx = rng.integers(-3 * n - 1, 3 * n + 1, idx_shape).astype([I64, I32][ints[1] % 2])
            indices, mode = kaionb.asarray(idx), "wrap"
        ref = np.take(x, idx, axis=axis, mode=mode)
        out = None if c["out"] is None else Out(ref.shape, ref.dtype, c["out"])
        got = kaionb.take(dev, indices, axis=axis, out=None if out is None else out.array)
        check_out(got, out)
        same(got, ref, "take")


# -- random --------------------------------------------------------------------------------------

@st.composite
def random_cases(draw):
    method = draw(st.sampled_from(["random", "uniform", "standard_normal", "normal",
                                   "integers"]))
    sizes_ = st.one_of(st.none(), sizes(0, 5000, large=(10**4, 3 * 10**5)),
                       shapes(0, 3, sizes(0, 40)))
    integral = [d for d in ALL_DTYPES if d.kind in "iub"]
    return dict(method=method, size=draw(sizes_),
                dtype=draw(st.sampled_from(integral if method == "integers" else
                                           [F64, F32, F16, BF16])),
                bounds=draw(st.tuples(st.floats(-1000, 1000), st.floats(0, 1000))),
                ints=draw(st.tuples(st.integers(-2**63, 2**64), st.integers(0, 2**64))),
                endpoint=draw(st.booleans()), out=draw(st.booleans()) and method != "normal",
                counter=draw(rarely(st.integers(0, 2**20), st.integers(2**64 - 50, 2**64 - 1))),
                seed=draw(seeds))


def check_random(c):
    g = kaionb.random.Generator(c["seed"])
    g._philox.counter = c["counter"]  # near 2^64: the counters wrap inside the draw
    method, dt, size = c["method"], np.dtype(c["dtype"]), c["size"]
    shape = () if size is None else (int(size),) if not isinstance(size, tuple) else size
    out = Out(shape, dt) if c["out"] else None
    kw = dict(out=out.array) if out is not None else {}
    key, offset = g.key, g.counter
    n = math.prod(shape)
    if method == "integers":
        info = (0, 1) if dt == BOOL else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
        low = min(max(c["ints"][0], info[0]), info[1])
        last = min(low + c["ints"][1], info[1])  # the largest value drawn
        high = last if c["endpoint"] else last + 1
        got = g.integers(low, high, size=size, dtype=dt, endpoint=c["endpoint"], **kw)
        np.testing.assert_array_equal(got.get().reshape(-1), integers_ref(
            key, offset, n, dt, low, high, c["endpoint"]))
    elif method in ("random", "uniform"):
        low, span = c["bounds"]
        args = () if method == "random" else (low, low + span)
        got = getattr(g, method)(*args, size=size, dtype=dt, **kw)
        ref = uniform_ref(key, offset, n, dt, *args)
        values = got.get().reshape(-1).astype(np.float64)
        if method == "random":  # bit for bit
            np.testing.assert_array_equal(_bits(got.get().reshape(-1)), _bits(ref.astype(dt)))
        else:
            np.testing.assert_allclose(values, ref, rtol=0,
                                       atol=RANDOM_EPS[dt] * max(abs(low), abs(low + span)))
        lo, hi = (float(np.asarray(b).astype(dt)) for b in (args or (0.0, 1.0)))
        assert (values >= lo).all() and ((values < hi).all() or lo == hi)
    else:
        loc, scale = (c["bounds"][0] / 100, c["bounds"][1] / 100) if method == "normal" else (0, 1)
        if method == "normal":  # (no out=)
            got = g.normal(loc, scale, size, dt)
        else:
            got = g.standard_normal(size, dt, **kw)
        rtol, atol = RANDOM_TOL[dt]
        # loc + scale·z in the compute type: its rounding scales with |loc| + |scale·z|
        compute_eps = 2.0**-52 if dt == F64 else 2.0**-23
        np.testing.assert_allclose(got.get().reshape(-1).astype(np.float64),
                                   normal_ref(key, offset, n, dt, loc, scale), rtol=rtol,
                                   atol=atol * 4 + 4 * compute_eps * (abs(loc) + 9 * scale))
    assert got.shape == shape and got.dtype == dt
    check_out(got, out)
    blocks = -(-n // kaionb.kernels.random.values_per_block(
        "integers" if method == "integers" else "uniform" if method in ("random", "uniform")
        else "normal", dt))
    assert g.counter == (offset + blocks) % 2**64


# -- the table --------------------------------------------------------------------------------

OPS = [
    FuzzOp("matmul", matmul_cases(), check_matmul),
    FuzzOp("matmul_int8", matmul_int8_cases(), check_matmul_int8),
    FuzzOp("qkv_project_int8", qkv_int8_cases(), check_qkv_int8),
    FuzzOp("matmul_int4", matmul_int4_cases(), check_matmul_int4),
    FuzzOp("qkv_project_int4", qkv_int4_cases(), check_qkv_int4),
    FuzzOp("quantize_int4", quantize_int4_cases(), check_quantize_int4),
    FuzzOp("attention", attention_cases(), check_attention),
    FuzzOp("attention_bwd", attention_cases(backward=True), check_attention_bwd),
    FuzzOp("norms", row_cases(("rms_norm", "layer_norm", "add_rms_norm")), check_norm),
    FuzzOp("norms_bwd", row_cases(("rms_norm_bwd", "layer_norm_bwd", "add_rms_norm_bwd")),
           check_norm_bwd),
    FuzzOp("softmax", softmax_cases(), check_softmax),
    FuzzOp("activations", row_cases(("gelu", "fused_silu_gate", "gelu_bwd",
                                     "fused_silu_gate_bwd")), check_activation),
    FuzzOp("rope", rope_cases(), check_rope),
    FuzzOp("quantize_int8", quantize_cases(), check_quantize),
    FuzzOp("adamw_step", adamw_cases(), check_adamw),
    FuzzOp("elementwise", elementwise_cases(), check_elementwise),
    FuzzOp("reductions", reduction_cases(), check_reductions),
    FuzzOp("creation_and_take", creation_cases(), check_creation),
    FuzzOp("random", random_cases(), check_random),
]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@given(data=st.data())
def test_op_matches_float64(op, data):
    time_budget(op.check)(data.draw(op.cases, label=op.name))
