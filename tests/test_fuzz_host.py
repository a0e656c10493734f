"""Property-based fuzzing of the host side of the public ops, on the CPU (no GPU needed).

Arrays are metadata headers (kaionb.testing.metadata_array) in random shapes, dtypes and
layouts (stepped, flipped, transposed, padded, misaligned, broadcast), and the GPU is
replaced by recorders for the length of one example (``stubbed_device``): kernels record
their launches after checking their arguments against the kernel's signature (count,
rank, element size) and against the memory the call got or allocated; allocations,
memsets and copies are recorded too. Properties:

- every op with kaionb's one refusal format refuses — TypeError / ValueError
  ``<op>: argument '<name>' expected ..., got ...``, naming an argument whose contract
  the case breaks, before anything is launched — exactly when a predicate written from
  its docs says the arguments are outside its contract; otherwise, given an ``out=`` of
  the right shape, it launches (when there is anything to compute) and raises nothing;
- elementwise ops and reductions refuse exactly where NumPy does, with NumPy's exception
  type, and otherwise give NumPy's result shape and dtype;
- the view functions (reshape, broadcast_to, expand_dims, squeeze, flip, moveaxis,
  permute_dims, basic slicing) give NumPy's shape, strides and offset on the same layout.

Run: ``python -m pytest -q tests/test_fuzz_host.py`` (the "ci" hypothesis profile: a fixed
small number of examples, the same every run); ``KAIONB_FUZZ_PROFILE=gpu-long`` for
thousands per test (``--hypothesis-show-statistics`` prints how many ran). A failure
prints the falsifying case and a ``@reproduce_failure(...)`` blob; with a random profile
also rerun with the ``--hypothesis-seed`` it ran with. Cases found here and kept as
regular tests are at the end (library bugs: ``xfail(strict=True)``, reason file:line).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import struct
import sys
import threading
import warnings
from typing import NamedTuple

import numpy as np
import pytest
from cuda.bindings import driver
from hypothesis import assume, event, given
from hypothesis import strategies as st
from numba.core import sigutils, types
from numba.np.numpy_support import as_dtype

import kaionb
from kaionb import DeviceArray, _device, array
from kaionb._device import STATE
from kaionb.kernels import elementwise, launch
from kaionb.kernels.matmul_int4 import Int4Weight
from kaionb.kernels.op import _span
from kaionb.testing import metadata_array as fake

from fuzz_strategies import (ALL_DTYPES, BF16, F16, F32, F64, FLOATS, I8, U32, rarely, sizes,
                             time_budget)

TE, VE = TypeError, ValueError


# -- the GPU, stubbed --------------------------------------------------------------------

class Device:
    """What one example did to the (stubbed) GPU: kernel launches by name, other driver
    actions (memsets, copies), and the memory it may touch (``own``: the call's arrays;
    allocations add themselves)."""

    def __init__(self):
        self.launches, self.actions, self.spans = [], [], []
        self._addresses = itertools.count()

    def own(self, *values):
        for x in values:
            if isinstance(x, DeviceArray):
                if x.size:
                    self.spans.append(_span(x))
            elif isinstance(x, (tuple, list)):
                self.own(*x)
            elif isinstance(x, dict):
                self.own(*x.values())
            elif isinstance(x, Int4Weight):
                self.own(*x.fast_path_parts())

    def allocate(self, nbytes):
        ptr = 0x600000000000 + next(self._addresses) * (1 << 32)
        self.spans.append((ptr, ptr + nbytes))
        return _Buffer(ptr), 0

    def kernel(self, kdef, which):
        return _Kernel(self, kdef, kdef.signatures[which] if isinstance(which, int) else which)


class _Buffer(NamedTuple):
    handle: int


class _Driver:
    """The launch calls of cuda.bindings.driver, as a CompiledKernel makes them."""

    CUresult = driver.CUresult

    def cuLaunchKernel(self, *args):
        return (driver.CUresult.CUDA_SUCCESS,)

    cuLaunchKernelEx = cuLaunchKernel


class _Kernel:
    """A kernel specialization that checks its arguments, records the launch and packs
    the parameters as kaionb.kernels.launch.CompiledKernel does (its own ``__call__``),
    with no module loaded and the driver's launch a no-op."""

    def __init__(self, device, kdef, signature):
        self.device, self.kdef = device, kdef
        self.argtypes, _ = sigutils.normalize_signature(signature)
        fmt = "<" + "".join("q" * (5 + 2 * t.ndim) if isinstance(t, types.Array)
                            else launch._scalar_format(t, kdef.name) for t in self.argtypes)
        ck = self._compiled = launch.CompiledKernel.__new__(launch.CompiledKernel)
        ck.kdef, ck.signature, ck._packer = kdef, signature, struct.Struct(fmt)
        ck._nparams = ck._packer.size // 8
        ck._array_flags = tuple(isinstance(t, types.Array) for t in self.argtypes)
        ck._local, ck._function, ck._max_clusters = threading.local(), None, {}
        ck._driver, ck._success = _Driver(), driver.CUresult.CUDA_SUCCESS
        self._function = None  # (occupancy queries pass it to the stubbed driver)
        self.max_dynamic_shared = max(kdef.max_dynamic_shared_bytes,
                                      launch.DEFAULT_MAX_DYNAMIC_SHARED)

    def __call__(self, grid, block, args, **kwargs):
        name = self.kdef.name
        assert len(args) == len(self.argtypes), f"{name}: {len(args)} arguments"
        for i, (t, a) in enumerate(zip(self.argtypes, args)):
            if not isinstance(t, types.Array):
                continue
            assert isinstance(a, DeviceArray) and a.ndim == t.ndim and \
                a.itemsize == as_dtype(t.dtype).itemsize, f"{name} argument {i}: {t} <- {a}"
            if a.size:
                lo, hi = _span(a)
                assert any(l <= lo and hi <= h for l, h in self.device.spans), \
                    f"{name} argument {i} reaches memory the call neither got nor allocated: {a}"
        assert all(g >= 1 for g in launch._dim3(grid)) and math.prod(launch._dim3(block)) <= 1024
        self.device.launches.append(name)
        launch.CompiledKernel.__call__(self._compiled, grid, block, args, **kwargs)


_DRIVER_ACTIONS = ("cuMemsetD8Async", "cuMemsetD16Async", "cuMemsetD32Async",
                   "cuMemsetD2D32Async", "cuMemcpyDtoDAsync", "cuMemcpyHtoDAsync",
                   "cuMemcpyDtoHAsync", "cuStreamSynchronize")


@contextlib.contextmanager
def stubbed_device():
    """The GPU replaced for one example: a compute capability 8.0 device of 132 SMs (the
    mma.sync paths: sm_90's TMA descriptors need the driver), kernels and driver actions
    recorded, allocations at made-up addresses, and the split-K workspace cache of its
    own (one made here must not outlive the stub). The op fast path starts afresh, and a
    replay within the example (a second call of one signature) is recorded as a launch
    "replay" (it calls the driver directly, after the first call's checked launch)."""
    device = Device()
    capturing = _device.is_capturing
    with pytest.MonkeyPatch.context() as mp:
        # (a function, not the bound method: a class attribute binds the KernelDef)
        mp.setattr(launch.KernelDef, "__getitem__", lambda kdef, which: device.kernel(kdef, which))
        mp.setattr(_device, "_multiprocessor_count", lambda ordinal: 132)
        mp.setattr(_device, "_compute_capability", lambda ordinal: (8, 0))
        mp.setattr(STATE, "allocator", (None, 0))
        mp.setattr(STATE, "calls", None)
        mp.setattr(array, "_allocate", device.allocate)
        mp.setattr(kaionb.kernels.op, "_WORKSPACES", {})
        for name in _DRIVER_ACTIONS:
            mp.setattr(driver, name, lambda *a, name=name: device.actions.append(name) or (0,))
        mp.setattr(driver, "cuLaunchKernel",
                   lambda *a: device.launches.append("replay") or (driver.CUresult.CUDA_SUCCESS,))
        mp.setattr(driver, "cuOccupancyMaxActiveBlocksPerMultiprocessor", lambda *a: (0, 4))
        for module in [m for n, m in sys.modules.items() if n.startswith("kaionb")]:
            if getattr(module, "is_capturing", None) is capturing:  # imported by name
                mp.setattr(module, "is_capturing", lambda handle: False)
        yield device


def test_reductions_split_at_the_real_occupancy_only():
    """plan_grid first sizes a split at 8 blocks/SM; where the stage-1 kernel's real
    occupancy (the stub's 4 blocks/SM) leaves the outputs more than half a wave, the
    reduction runs one launch, not a split into a single chunk. A split row folds in one
    launch; a split column takes two."""
    rows, cols = fake((400, 40000), F32), fake((1000, 38400), F32)  # 400 / 300 blocks
    long, tall = fake((1 << 22,), F32), fake((100_000, 512), F32)
    with stubbed_device() as device:
        device.own(rows, cols, long, tall)

        def ran(call):
            kaionb._device.STATE.calls = None
            start = len(device.launches)
            call()
            return [n.removeprefix("_reduce_sum_fwd_kernel_").removesuffix(
                "_float32_float32_float32") for n in device.launches[start:]]

        assert ran(lambda: kaionb.sum(rows, axis=1)) == ["row"]
        assert ran(lambda: kaionb.sum(cols, axis=0)) == ["colv"]
        assert ran(lambda: kaionb.sum(long)) == ["flat_fold"]
        assert ran(lambda: kaionb.sum(long[1:])) == ["row_fold"]  # 4 bytes in
        assert ran(lambda: kaionb.sum(tall, axis=0)) == ["colv_partial", "colv_merge"]


def test_the_stub_checks_kernel_arguments():
    x, out = fake((4, 8)), fake((4, 8))
    with stubbed_device() as device:
        device.own(x, out)
        kaionb.gelu(x, out=out)
        assert device.launches == ["_gelu_fwd_kernel_float32"]
        other = fake((4, 9))
        device.own(other)
        with pytest.raises(AssertionError, match="neither got nor allocated"):
            kaionb.gelu(fake((4, 9)), out=other)  # x not owned
        kdef = kaionb.kernels.activations._GELU_KERNELS["none", F32]
        with pytest.raises(AssertionError, match="argument 0"):
            kdef[0]((1,), (32,), (x.reshape(32),) + (x,) * 4 + (8, 1))


# -- metadata arrays in a layout ---------------------------------------------------------

# Row layouts keep a last axis of unit stride and leading axes of one row stride; the
# lead layouts break the second (for 3 or more dimensions), the rest the first.
ROW = ("c", "padded_rows", "offset", "step_rows")
LEAD = ("step_lead", "flip_lead", "broadcast")
OTHER = ("transposed", "step_last", "flip_last")
LAYOUTS = ROW + LEAD + OTHER
# An out= that broadcasts would write one element many times; the ops' docs do not say
# whether they refuse one (rope does), so outs are of the others.
OUT_LAYOUTS = tuple(lay for lay in LAYOUTS if lay != "broadcast")


def meta(shape, dtype=F32, layout="c"):
    """A metadata view of ``shape`` in ``layout`` ("c" where the shape has too few axes)."""
    shape, n = tuple(shape), shape[-1] if shape else 1
    if len(shape) < (2 if layout in ("step_rows", "transposed") else 1):
        layout = "c"
    if layout == "padded_rows":
        return fake(shape[:-1] + (n + 3,), dtype)[..., :n]
    if layout == "offset":
        return fake(shape[:-1] + (n + 1,), dtype)[..., 1:]
    if layout == "step_rows":
        return fake(shape[:-2] + (2 * shape[-2], n), dtype)[..., ::2, :]
    if layout == "step_lead":
        return fake((2 * shape[0],) + shape[1:], dtype)[::2]
    if layout == "flip_lead":
        return fake(shape, dtype)[::-1]
    if layout == "broadcast":
        return kaionb.broadcast_to(fake((1,) + shape[1:], dtype), shape)
    if layout == "transposed":
        return fake(shape[::-1], dtype).T
    if layout == "step_last":
        return fake(shape[:-1] + (2 * n,), dtype)[..., ::2]
    if layout == "flip_last":
        return fake(shape, dtype)[..., ::-1]
    return fake(shape, dtype)


def np_twin(x):
    """A NumPy array with x's shape, strides and dtype, over zeroed memory of its span."""
    lo, hi = _span(x) if x.size else (x.ptr, x.ptr)
    return np.ndarray(x.shape, x.dtype, np.zeros(hi - lo, np.uint8), x.ptr - lo, x.strides)


def zeros_like_shape(shape, dtype):
    """Readable zeros of ``shape`` in one element (stride 0): NumPy's answer, cheaply."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def last_axis_unit(x):
    return not (x.ndim and x.shape[-1] > 1 and x.strides[-1] != x.itemsize)


def one_stride(shape, strides):
    """Whether the axes (ignoring those of length 1) walk their elements with one stride."""
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    return all(outer == inner * d for (_, outer), (d, inner) in zip(dims, dims[1:]))


def rows_collapse(x):
    """The row-wise contract: the leading axes walk the rows with one stride."""
    return one_stride(x.shape[:-1], x.strides[:-1])


def dtypes_mostly(allowed):
    return rarely(st.sampled_from(allowed), st.sampled_from(ALL_DTYPES))

layouts = st.sampled_from(LAYOUTS)
dims = sizes(0, 40)


# -- the one refusal format, per op --------------------------------------------------------

class HostOp(NamedTuple):
    """One op's fuzz: ``cases`` draws a dict of arguments (``args``: everything passed,
    ``work``: whether a valid call has anything to compute); ``violations(case)`` lists
    the (exception type, argument name) pairs the case breaks, empty when it is in the
    contract; ``call(case)`` runs the op."""

    name: str
    cases: object
    violations: object
    call: object


def _scale_ok(value, name, vector_shape):
    """matmul_int8's scale arguments: a finite float, or a float32 device array of one
    element or of ``vector_shape``, C-contiguous."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(VE, name)]
    if value.dtype != F32:
        return [(TE, name)]
    if value.size == 1 and value.ndim <= 1:
        return []
    if vector_shape is None or value.shape != vector_shape:
        return [(VE, name)]
    return [] if np_twin(value).flags.c_contiguous else [(VE, name)]


# matmul and KAIO's matmul_tc family: NumPy's matmul shapes, one input dtype per entry.
MATMUL_ENTRIES = {"matmul": (F16, BF16, F32), "matmul_tc": (F16,), "matmul_tc_async": (F16,),
                  "matmul_tc_bf16": (BF16,), "matmul_tc_bf16_async": (BF16,)}


@st.composite
def matmul_cases(draw):
    entry = draw(st.sampled_from(list(MATMUL_ENTRIES)))
    dt_a = draw(dtypes_mostly(MATMUL_ENTRIES[entry]))
    dt_b = draw(rarely(st.just(dt_a), dtypes_mostly(MATMUL_ENTRIES[entry])))
    m, n, k = draw(dims), draw(dims), draw(dims)
    batch = draw(st.lists(sizes(0, 3), max_size=2))
    shape_a = draw(rarely(st.just(tuple(batch) + (m, k)),
                          st.sampled_from([(k,), (), (m, k + 1)])))
    shape_b = draw(rarely(st.sampled_from([(k, n), tuple(batch[-1:]) + (k, n),
                                           tuple(1 for _ in batch) + (k, n)]),
                          st.sampled_from([(k,), (), (2, 5, k, n)])))
    a = meta(shape_a, dt_a, draw(layouts))
    b = meta(shape_b, dt_b, draw(layouts))
    dtype = draw(st.sampled_from([None, None, F32, F16, BF16]))
    try:
        shape = np.matmul(zeros_like_shape(shape_a, F32), zeros_like_shape(shape_b, F32)).shape
    except ValueError:
        shape = (1,)
    default = a.dtype if entry == "matmul" and a.dtype in FLOATS else F32
    out = meta(shape, dtype or default, draw(rarely(st.just("c"), st.just("transposed"))))
    return dict(entry=entry, a=a, b=b, dtype=dtype, out=out, args=(a, b, out),
                work=out.size > 0)


def matmul_violations(c):
    a, b, allowed = c["a"], c["b"], MATMUL_ENTRIES[c["entry"]]
    found = [(TE, n) for n, x in (("a", a), ("b", b)) if x.dtype not in allowed]
    if a.dtype != b.dtype:
        found.append((TE, "b"))
    if found:
        return found
    try:
        np.matmul(zeros_like_shape(a.shape, F32), zeros_like_shape(b.shape, F32))
    except ValueError:
        return [(VE, "a" if a.ndim == 0 else "b")]
    return [] if np_twin(c["out"]).flags.c_contiguous else [(VE, "out")]


def matmul_call(c):
    fn = getattr(kaionb, c["entry"])
    fn(c["a"], c["b"], out=c["out"], dtype=c["dtype"])


# matmul_int8: a int8 [..., M, K], b int8 [K, N], per-tensor or per-row / per-column scales.
@st.composite
def matmul_int8_cases(draw):
    m, n, k = draw(dims), draw(dims), draw(dims)
    batch = tuple(draw(st.lists(sizes(1, 3), max_size=1)))
    shape_a = draw(rarely(st.just(batch + (m, k)), st.sampled_from([(), (k,), (m, k + 1)])))
    shape_b = draw(rarely(st.just((k, n)), st.sampled_from([(n,), (1, k, n), (k + 1, n)])))
    a = meta(shape_a, draw(dtypes_mostly((I8,))), draw(layouts))
    if shape_b == (k, n) and draw(st.booleans()):
        b = meta((n, k), I8).T  # the checkpoint layout, K-major
    else:
        b = meta(shape_b, draw(dtypes_mostly((I8,))), draw(layouts))
    rows = a.shape[:-1]

    def vector(shape):
        wrong = st.sampled_from([(2,) + shape, (shape[0] + 1,) if shape else (3,)])
        return st.builds(meta, rarely(st.just(shape), wrong), dtypes_mostly((F32,)),
                         rarely(st.just("c"), st.just("step_last")))

    one = st.one_of(st.floats(1e-4, 1.0), rarely(st.just(1.0), st.just(math.nan)))
    scale = draw(st.one_of(one, st.tuples(st.one_of(one, vector(rows)),
                                          st.one_of(one, vector(b.shape[-1:])))))
    bias = draw(st.one_of(st.none(), st.builds(
        meta, rarely(st.just(b.shape[-1:]), st.just((n + 1,))), dtypes_mostly((F32, F16, BF16)))))
    dtype = draw(st.sampled_from([None, F32, F16, BF16]))
    shape = rows + b.shape[-1:] if a.ndim and b.ndim == 2 else (1,)
    out = meta(shape, dtype or F32)
    return dict(a=a, b=b, scale=scale, bias=bias, dtype=dtype, out=out,
                args=(a, b, scale, bias, out), work=out.size > 0)


def matmul_int8_violations(c):
    a, b, scale, bias = c["a"], c["b"], c["scale"], c["bias"]
    found = [(TE, n) for n, x in (("a", a), ("b", b)) if x.dtype != I8]
    if found:
        return found
    if a.ndim < 1:
        return [(VE, "a")]
    if b.ndim != 2 or a.shape[-1] != b.shape[0]:
        return [(VE, "b")]
    if b.shape[0] == 0:
        return [(VE, "a")]
    if isinstance(scale, tuple):
        found = _scale_ok(scale[0], "scale_a", a.shape[:-1]) + _scale_ok(scale[1], "scale_b",
                                                                        b.shape[1:])
    else:
        found = _scale_ok(scale, "scale", None)
    if bias is not None:
        if bias.dtype not in FLOATS:
            found.append((TE, "bias"))
        elif bias.shape != b.shape[1:]:
            found.append((VE, "bias"))
    return found


def matmul_int8_call(c):
    kaionb.matmul_int8(c["a"], c["b"], c["scale"], bias=c["bias"], out=c["out"], dtype=c["dtype"])


# matmul_int4: f16 / bf16 activations [..., M, K] times a packed [K, N] weight.
def int4_weight(k, n):
    """A symmetric per-channel Int4Weight header [k, n] (helpers.int4's packed shapes)."""
    return Int4Weight(fake((-(-n // 16), -(-k // 64) * 128), U32), fake((1, -(-n // 16) * 8), U32),
                      None, None, (k, n), -1)


@st.composite
def matmul_int4_cases(draw):
    m, n, k = draw(dims), draw(sizes(1, 40)), draw(sizes(1, 300))
    lead = tuple(draw(st.lists(sizes(0, 3), max_size=1)))
    shape_a = draw(rarely(st.just(lead + (m, k)), st.sampled_from([(), (m, k + 1)])))
    a = meta(shape_a, draw(dtypes_mostly((F16, BF16))), draw(layouts))
    w = draw(rarely(st.just(int4_weight(k, n)), st.just(fake((k, n), F16))))
    dtype = draw(st.sampled_from([None, F32, F16, BF16]))
    out = meta(a.shape[:-1] + (n,) if a.ndim else (n,),
               dtype or (a.dtype if a.dtype in (F16, BF16) else F16))
    return dict(a=a, w=w, dtype=dtype, out=out, args=(a, w, out), work=out.size > 0)


def matmul_int4_violations(c):
    a, w = c["a"], c["w"]
    if a.dtype not in (F16, BF16):
        return [(TE, "a")]
    if a.ndim < 1:
        return [(VE, "a")]
    if not isinstance(w, Int4Weight):
        return [(TE, "w")]
    return [] if a.shape[-1] == w.k else [(VE, "a")]


def matmul_int4_call(c):
    kaionb.matmul_int4(c["a"], c["w"], out=c["out"], dtype=c["dtype"])


# attention: [B, H, S, D], [H, S, D] or [S, D]; GQA; D a multiple of 8 up to 256.
@st.composite
def attention_cases(draw):
    dtype = draw(dtypes_mostly((F16, BF16, F32)))
    rank = draw(rarely(st.integers(2, 4), st.sampled_from([1, 5])))
    b, hkv, g = draw(sizes(0, 3)), draw(sizes(0, 3)), draw(sizes(1, 4))
    sq, sk = draw(dims), draw(dims)
    d = draw(rarely(st.sampled_from([8, 16, 64, 80, 128, 256]), st.sampled_from([0, 4, 60, 264])))
    shape_q, shape_k = (2, b, hkv * g, sq, d)[5 - rank:], (2, b, hkv, sk, d)[5 - rank:]
    shape_k = draw(rarely(st.just(shape_k), st.just(shape_k[:-1] + (d + 8,))))
    shape_v = draw(rarely(st.just(shape_k), st.just(shape_k[:-1] + (1,) if shape_k else ())))
    lay = st.sampled_from(("c", "offset", "padded_rows", "flip_lead", "step_last"))
    q = meta(shape_q, dtype, draw(lay))
    k = meta(shape_k, draw(rarely(st.just(dtype), dtypes_mostly(FLOATS))), draw(lay))
    v = meta(shape_v, draw(rarely(st.just(dtype), dtypes_mostly(FLOATS))), draw(lay))
    scale = draw(rarely(st.sampled_from([None, 0.125, 1.0]), st.sampled_from([0.0, math.nan, "1"])))
    out = meta(shape_q, dtype, draw(rarely(st.just("c"), st.just("offset"))))
    return dict(q=q, k=k, v=v, scale=scale, causal=draw(st.booleans()), out=out,
                args=(q, k, v, out), work=out.size > 0)


def attention_violations(c):
    q, k, v = c["q"], c["k"], c["v"]
    found = [(TE, n) for n, x in (("q", q), ("k", k), ("v", v)) if x.dtype not in (F16, BF16, F32)]
    for n, x in (("q", q), ("k", k), ("v", v)):
        if not 2 <= x.ndim <= 4 or not last_axis_unit(x):
            found.append((VE, n))
    found += [(TE, n) for n, x in (("k", k), ("v", v)) if x.dtype != q.dtype]
    if found:
        return found
    d = q.shape[-1]
    if k.ndim != q.ndim or v.ndim != q.ndim:
        return [(VE, "k" if k.ndim != q.ndim else "v")]
    if v.shape != k.shape:
        return [(VE, "v")]
    if k.shape[-1] != d:
        return [(VE, "k")]
    if d % 8 or not 8 <= d <= 256:
        return [(VE, "q")]
    if (q.ndim == 4 and k.shape[0] != q.shape[0]) or (
            q.ndim >= 3 and (k.shape[-3] == 0 or q.shape[-3] % k.shape[-3])):
        return [(VE, "k")]
    scale = c["scale"]
    if isinstance(scale, str):
        return [(TE, "scale")]
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        return [(VE, "scale")]
    out = c["out"]
    aligned = out.ptr % 16 == 0 and all(s % 16 == 0 for n, s in zip(out.shape[:-1],
                                                                   out.strides[:-1]) if n > 1)
    return [] if aligned else [(VE, "out")]


def attention_call(c):
    kaionb.attention(c["q"], c["k"], c["v"], causal=c["causal"], scale=c["scale"], out=c["out"])


# rms_norm, layer_norm, add_rms_norm: over the last axis, rows of one stride.
NORMS = ("rms_norm", "layer_norm", "add_rms_norm")


@st.composite
def norm_cases(draw):
    op = draw(st.sampled_from(NORMS))
    dtype = draw(dtypes_mostly(FLOATS))
    shape = draw(rarely(st.lists(dims, min_size=1, max_size=4).map(tuple), st.just(())))
    n = shape[-1] if shape else 1
    x = meta(shape, dtype, draw(layouts))
    wdt = draw(rarely(st.just(dtype), dtypes_mostly(FLOATS)))
    lay = rarely(st.just("c"), st.just("step_last"))
    weight = meta(draw(rarely(st.just((n,)), st.just((n + 1,)))), wdt, draw(lay))
    bias = draw(st.none() if op != "layer_norm" else st.one_of(st.none(), st.builds(
        meta, rarely(st.just((n,)), st.just((1, n))), rarely(st.just(dtype), st.just(F64)))))
    residual = meta(draw(rarely(st.just(shape), st.just(shape[:-1] + (n + 1,)))),
                    draw(rarely(st.just(dtype), dtypes_mostly(FLOATS))), draw(layouts))
    eps = draw(rarely(st.sampled_from([1e-6, 1e-5, 0.1]), st.sampled_from([0.0, -1.0, math.nan])))
    out = meta(shape, dtype, draw(rarely(st.just("c"), st.just("step_last"))))
    aliases = ("new", "x", "residual", "out")
    residual_out = draw(rarely(st.just("new"), st.sampled_from(aliases)))
    args = dict(x=x, weight=weight, bias=bias, residual=residual, eps=eps, out=out,
                residual_out=meta(shape, dtype))
    if op == "add_rms_norm":  # in place (documented): out over x, residual_out over residual
        args["out"] = draw(rarely(st.just(out), st.sampled_from([x, residual])))
        args["residual_out"] = {"new": args["residual_out"], "x": x, "residual": residual,
                                "out": args["out"]}[residual_out]
    return dict(op=op, args=args, work=x.size > 0)


def norm_violations(c):
    op, a = c["op"], c["args"]
    x, weight, bias, residual = a["x"], a["weight"], a["bias"], a["residual"]
    named = [("x", x), ("weight", weight)] + (
        [("residual", residual)] if op == "add_rms_norm" else [])
    found = [(TE, n) for n, t in named if t.dtype not in FLOATS]
    if found:  # (x, weight and residual are converted first)
        return found
    if bias is not None:
        named.append(("bias", bias))
        if bias.dtype not in FLOATS:
            found.append((TE, "bias"))
    if x.ndim < 1:
        found.append((VE, "x"))
    for n, t in named[1:]:
        want = x.shape if n == "residual" else x.shape[-1:]
        if t.shape != want:
            found.append((VE, n))
        if t.dtype != x.dtype:
            found.append((TE, n))
    found += [(VE, n) for n, t in named if not last_axis_unit(t)]
    eps = a["eps"]
    if not (math.isfinite(eps) and eps > 0):
        found.append((VE, "eps"))
    outs = [("out", a["out"])] + ([("residual_out", a["residual_out"])]
                                  if op == "add_rms_norm" else [])
    found += [(VE, n) for n, o in outs if not last_axis_unit(o)]
    if op == "add_rms_norm" and a["out"] is a["residual_out"] and x.size:
        found.append((VE, "residual_out"))
    if found:
        return found
    # At launch (something to compute): the rows of every array one stride apart.
    rows = [("x", x)] + ([("residual", residual)] if op == "add_rms_norm" else [])
    return [(VE, n) for n, t in rows if x.size and not rows_collapse(t)]


def norm_call(c):
    op, a = c["op"], c["args"]
    if op == "rms_norm":
        kaionb.rms_norm(a["x"], a["weight"], a["eps"], out=a["out"])
    elif op == "layer_norm":
        kaionb.layer_norm(a["x"], a["weight"], a["bias"], a["eps"], out=a["out"])
    else:
        kaionb.add_rms_norm(a["x"], a["residual"], a["weight"], a["eps"], out=a["out"],
                            residual_out=a["residual_out"])


# softmax and softmax_bwd: any axis, any layout, out of any layout (or x itself).
@st.composite
def softmax_cases(draw):
    backward = draw(st.booleans())
    dtype = draw(dtypes_mostly(FLOATS))
    shape = draw(rarely(st.lists(dims, min_size=1, max_size=4).map(tuple), st.just(())))
    x = meta(shape, dtype, draw(layouts))
    axis = draw(rarely(st.integers(-len(shape), max(len(shape) - 1, 0)),
                       st.sampled_from([len(shape), -len(shape) - 1, 1.0, True])))
    grad = meta(draw(rarely(st.just(shape), st.just(shape + (2,)))),
                draw(rarely(st.sampled_from([dtype, F32]), dtypes_mostly(FLOATS))), draw(layouts))
    out_dtype = grad.dtype if backward else dtype
    out = draw(rarely(st.builds(meta, st.just(shape), st.just(out_dtype),
                                st.sampled_from(OUT_LAYOUTS)),
                      st.just(grad if backward else x)))  # in place
    return dict(backward=backward, x=x, grad=grad, axis=axis, out=out, args=(x, grad, out),
                work=x.size > 0)


def softmax_violations(c):
    x, grad, axis, backward = c["x"], c["grad"], c["axis"], c["backward"]
    name = "y" if backward else "x"
    if x.dtype not in FLOATS:
        return [(TE, name)]
    if x.ndim < 1:
        return [(VE, name)]
    found = []
    if backward:
        if grad.dtype not in (x.dtype, F32):
            found.append((TE, "grad"))
        elif grad.shape != x.shape:
            found.append((VE, "grad"))
    if isinstance(axis, bool) or not isinstance(axis, int):
        found.append((TE, "axis"))
    elif not -x.ndim <= axis < x.ndim:
        found.append((VE, "axis"))
    return found


def softmax_call(c):
    if c["backward"]:
        kaionb.softmax_bwd(c["grad"], c["x"], c["axis"], out=c["out"])
    else:
        kaionb.softmax(c["x"], c["axis"], out=c["out"])


# gelu and fused_silu_gate: element-wise over rows of one stride (contiguous last axis).
@st.composite
def activation_cases(draw):
    op = draw(st.sampled_from(["gelu", "fused_silu_gate"]))
    dtype = draw(dtypes_mostly(FLOATS))
    shape = draw(st.lists(dims, max_size=4).map(tuple))
    x = meta(shape, dtype, draw(layouts))
    gate = meta(draw(rarely(st.just(shape), st.just(shape + (1,)))),
                draw(rarely(st.just(dtype), dtypes_mostly(FLOATS))), draw(layouts))
    approximate = draw(rarely(st.sampled_from(["none", "tanh"]), st.just("fast")))
    out = meta(shape, dtype, draw(rarely(st.just("c"), st.just("step_last"))))
    return dict(op=op, x=x, gate=gate, approximate=approximate, out=out, args=(x, gate, out),
                work=x.size > 0)


def activation_violations(c):
    x, gate, out, silu = c["x"], c["gate"], c["out"], c["op"] == "fused_silu_gate"
    if not silu and c["approximate"] not in ("none", "tanh"):
        return [(VE, "approximate")]
    named = [("x", x)] + ([("gate", gate)] if silu else [])
    found = [(TE, n) for n, t in named if t.dtype not in FLOATS]
    if found:
        return found
    if silu and gate.shape != x.shape:
        return [(VE, "gate")]
    if silu and gate.dtype != x.dtype:
        return [(TE, "gate")]
    found = [(VE, n) for n, t in named if not last_axis_unit(t)]
    if not last_axis_unit(out):
        found.append((VE, "out"))
    if found or not x.size:
        return found
    # At launch: one flat row when every array is C-contiguous, else rows of one stride.
    if all(np_twin(t).flags.c_contiguous for _, t in named + [("out", out)]):
        return []
    return [(VE, n) for n, t in named if not rows_collapse(t)]


def activation_call(c):
    if c["op"] == "gelu":
        kaionb.gelu(c["x"], c["approximate"], out=c["out"])
    else:
        kaionb.fused_silu_gate(c["x"], c["gate"], out=c["out"])


# rope: [..., S, H, D] or [..., H, S, D] (or [S, D]); cos / sin [max_seq, R/2], R <= D.
@st.composite
def rope_cases(draw):
    dtype = draw(dtypes_mostly(FLOATS))
    ndim = draw(rarely(st.integers(2, 5), st.just(1)))
    shape = tuple(draw(sizes(0, 9 if i < ndim - 1 else 40)) for i in range(ndim))
    layout = draw(rarely(st.sampled_from(["bshd", "bhsd"]), st.just("sbhd")))
    x = meta(shape, dtype, draw(st.sampled_from(("c", "padded_rows", "step_lead", "step_last",
                                                 "transposed"))))
    d = shape[-1]
    s = shape[-2] if ndim == 2 else shape[-3 if layout == "bshd" else -2] if ndim > 2 else 0
    max_seq = draw(rarely(st.integers(s, s + 3), st.integers(0, 40)))
    half = draw(rarely(st.integers(1, max(1, d // 2)), st.integers(0, d + 2)))
    table_dtype = draw(rarely(st.just(F32), dtypes_mostly(FLOATS)))
    cos = meta((max_seq, half), table_dtype)
    sin = meta(draw(rarely(st.just((max_seq, half)), st.just((max_seq, half + 1)))), table_dtype)
    interleaved = draw(rarely(st.booleans(), st.just(1)))
    out = meta(shape, dtype, draw(rarely(st.just("c"), st.just("step_last"))))
    return dict(x=x, cos=cos, sin=sin, interleaved=interleaved, layout=layout, s=s, out=out,
                backward=draw(st.booleans()), args=(x, cos, sin, out), work=x.size > 0)


def rope_violations(c):
    x, cos, sin, name = c["x"], c["cos"], c["sin"], "grad" if c["backward"] else "x"
    if x.dtype not in FLOATS:
        return [(TE, name)]
    found = [] if c["layout"] in ("bshd", "bhsd") else [(VE, "layout")]
    if type(c["interleaved"]) is not bool:
        found.append((TE, "interleaved"))
    if not last_axis_unit(x) or x.ndim < 2 or not one_stride(x.shape[:-3], x.strides[:-3]):
        found.append((VE, name))  # (the batch axes, all but the last 3, one stride)
    if found:
        return found
    d = x.shape[-1]
    for n, t in (("cos", cos), ("sin", sin)):
        if t.dtype not in FLOATS:
            found.append((TE, n))
        elif t.ndim != 2 or t.shape[1] < 1 or 2 * t.shape[1] > d:
            found.append((VE, n))
    if not found and sin.shape != cos.shape:
        found.append((VE, "sin"))
    if not found and c["s"] > cos.shape[0]:
        found.append((VE, "cos"))
    if not last_axis_unit(c["out"]):
        found.append((VE, "out"))
    return found


def rope_call(c):
    fn = kaionb.rope_bwd if c["backward"] else kaionb.rope
    fn(c["x"], c["cos"], c["sin"], interleaved=c["interleaved"], layout=c["layout"], out=c["out"])


# quantize_int8 / dequantize_int8: axis None, -1 (the last), or 0 of a 2-D array.
def _scale_shape(shape, axis):
    """The scale's shape for ``axis`` (module doc), or None outside the contract."""
    ndim = len(shape)
    if axis is None:
        return ()
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        return None
    a = axis % ndim
    if a == ndim - 1:
        return shape[-1:]
    return shape[:1] if a == 0 and ndim == 2 else None


@st.composite
def quantize_cases(draw):
    backward = draw(st.booleans())
    shape = draw(rarely(st.lists(dims, min_size=1, max_size=3).map(tuple), st.just(())))
    axis = draw(st.one_of(st.none(), st.integers(-len(shape) - 1, len(shape))))
    x = meta(shape, draw(dtypes_mostly((I8,) if backward else FLOATS)), draw(layouts))
    want = _scale_shape(shape, axis)
    scale = meta(draw(rarely(st.just(want if want is not None else ()),
                             st.sampled_from([(1,), (3,), shape]))),
                 draw(dtypes_mostly((F32,))), draw(rarely(st.just("c"), st.just("flip_last"))))
    dtype = draw(dtypes_mostly(FLOATS))
    if backward:
        out = meta(shape, dtype if dtype in FLOATS else F32)
        args = (x, scale, out)
    else:
        out = (meta(shape, I8), meta(want if want is not None else (), F32))
        args = (x, out)
    return dict(backward=backward, x=x, axis=axis, scale=scale, dtype=dtype, out=out, args=args,
                work=x.size > 0 and (want is None or math.prod(want) > 0))


def quantize_violations(c):
    x, axis, scale, backward = c["x"], c["axis"], c["scale"], c["backward"]
    name = "q" if backward else "x"
    if x.dtype not in ((I8,) if backward else FLOATS):
        return [(TE, name)]
    found = []
    if backward and scale.dtype != F32:
        found.append((TE, "scale"))
    want = _scale_shape(x.shape, axis)
    if want is None:
        return found + [(VE, "axis")]
    if backward and (scale.size != math.prod(want) or (want and scale.shape != want)):
        found.append((VE, "scale"))
    if not last_axis_unit(x):
        found.append((VE, name))
    if backward and not np_twin(scale).flags.c_contiguous:
        found.append((VE, "scale"))
    if backward and c["dtype"] not in FLOATS:
        found.append((TE, "dtype"))
    if found or not c["work"]:
        return found
    # At launch: one flat row (per-tensor, all contiguous) or rows of one stride.
    if axis is None and np_twin(x).flags.c_contiguous:
        return []
    return [] if rows_collapse(x) else [(VE, name)]


def quantize_call(c):
    if c["backward"]:
        kaionb.dequantize_int8(c["x"], c["scale"], c["axis"], c["dtype"], out=c["out"])
    else:
        kaionb.quantize_int8(c["x"], c["axis"], out=c["out"])


# adamw_step: float32 param / m / v, a float grad, one shape, C-contiguous, apart.
ADAMW_ARRAYS = ("param", "grad", "m", "v", "model_param")


@st.composite
def adamw_cases(draw):
    shape = draw(st.lists(dims, max_size=3).map(tuple))
    wants = {"param": (F32,), "grad": FLOATS, "m": (F32,), "v": (F32,), "model_param": (F16, BF16)}
    arrays = {n: meta(draw(rarely(st.just(shape), st.just(shape + (1,)))),
                      draw(dtypes_mostly(wants[n])),
                      draw(rarely(st.just("c"), st.sampled_from(LAYOUTS)))) for n in ADAMW_ARRAYS}
    if draw(st.booleans()):
        arrays["model_param"] = None
    alias = draw(rarely(st.none(), st.sampled_from(ADAMW_ARRAYS[1:4])))
    if alias:
        arrays[alias] = arrays["param"]
    scalars = dict(lr=draw(rarely(st.floats(0, 0.1), st.sampled_from([-1e-3, math.nan]))),
                   beta1=draw(rarely(st.floats(0, 0.99), st.just(1.0))),
                   eps=draw(rarely(st.floats(1e-8, 1e-4), st.just(0.0))),
                   step=draw(rarely(st.integers(1, 10**6), st.sampled_from([0, 1.0]))))
    return dict(arrays=arrays, scalars=scalars, args=tuple(arrays.values()),
                work=math.prod(arrays["param"].shape) > 0)


def adamw_violations(c):
    arrays, s = c["arrays"], c["scalars"]
    found = []
    if isinstance(s["step"], float):
        found.append((TE, "step"))
    elif s["step"] < 1:
        found.append((VE, "step"))
    found += [(VE, n) for n in ("lr", "eps") if not (math.isfinite(s[n]) and s[n] >= 0)]
    if s["eps"] == 0:
        found.append((VE, "eps"))
    if s["beta1"] >= 1:
        found.append((VE, "beta1"))
    if found:
        return found
    wants = {"param": (F32,), "grad": FLOATS, "m": (F32,), "v": (F32,), "model_param": (F16, BF16)}
    named = [(n, a) for n, a in arrays.items() if a is not None]
    found = [(TE, n) for n, a in named if a.dtype not in wants[n]]
    if found:
        return found
    param = arrays["param"]
    found = [(VE, n) for n, a in named if a.shape != param.shape
             or not np_twin(a).flags.c_contiguous]
    if found or not param.size:
        return found
    seen = {}
    for n, a in named:  # the later of two names for one buffer is the refused one
        if id(a) in seen:
            found.append((VE, n))
        seen[id(a)] = n
    return found


def adamw_call(c):
    kaionb.adamw_step(*(c["arrays"][n] for n in ADAMW_ARRAYS[:4]), **c["scalars"],
                      model_param=c["arrays"]["model_param"])


HOST_OPS = [
    HostOp("matmul", matmul_cases(), matmul_violations, matmul_call),
    HostOp("matmul_int8", matmul_int8_cases(), matmul_int8_violations, matmul_int8_call),
    HostOp("matmul_int4", matmul_int4_cases(), matmul_int4_violations, matmul_int4_call),
    HostOp("attention", attention_cases(), attention_violations, attention_call),
    HostOp("norms", norm_cases(), norm_violations, norm_call),
    HostOp("softmax", softmax_cases(), softmax_violations, softmax_call),
    HostOp("activations", activation_cases(), activation_violations, activation_call),
    HostOp("rope", rope_cases(), rope_violations, rope_call),
    HostOp("quantize_int8", quantize_cases(), quantize_violations, quantize_call),
    HostOp("adamw_step", adamw_cases(), adamw_violations, adamw_call),
]


def _op_name(c, spec):
    """The name an op's refusals carry."""
    for key in ("entry", "op"):
        if key in c:
            return c[key]
    if "backward" in c:
        return {"softmax": "softmax_bwd", "rope": "rope_bwd",
                "quantize_int8": "dequantize_int8"}[spec.name] if c["backward"] else spec.name
    return spec.name


@pytest.mark.parametrize("spec", HOST_OPS, ids=lambda s: s.name)
@given(data=st.data())
def test_refused_exactly_outside_the_contract(spec, data):
    time_budget(check_refusal)(spec, data.draw(spec.cases, label="case"))


def check_refusal(spec, case):
    expected = spec.violations(case)
    op = _op_name(case, spec)
    with stubbed_device() as device:
        device.own(case["args"])
        try:
            spec.call(case)
        except (TypeError, ValueError) as err:
            msg = str(err)
            named = next((name for exc, name in expected if isinstance(err, exc)
                          and msg.startswith(f"{op}: argument '{name}' expected ")
                          and ", got " in msg), None)
            assert named, f"refused with {type(err).__name__}: {msg}; expected one of {expected}"
            assert not device.launches, f"launched {device.launches} before refusing"
            event(f"refused: {type(err).__name__} '{named}'")
            return
    assert not expected, f"accepted, but the case breaks {expected}"
    if case["work"]:
        assert device.launches or device.actions, "nothing launched"
    event("accepted" if case["work"] else "accepted, nothing to compute")


# -- elementwise ops and reductions: NumPy's refusals, shapes and dtypes -------------------

BINARY = sorted(n for n, u in elementwise.UFUNCS.items() if u.nin == 2 and hasattr(kaionb, n))
REDUCTIONS = ("sum", "prod", "mean", "max", "min", "argmax", "argmin", "var", "std", "any", "all")
small_shapes = st.lists(sizes(0, 4), max_size=4).map(tuple)


def _numpy(call):
    """(result or None, the exception raised or None)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (NumPy's means of empty slices)
        try:
            return call(), None
        except Exception as err:  # noqa: BLE001  (compared with kaionb's)
            return None, err


def _same_refusal(err, ref_err, what):
    """kaionb refuses where NumPy does, with NumPy's kind of exception: one of the builtin
    types NumPy's derives from (AxisError: ValueError or IndexError; the order of the checks
    may differ)."""
    assert err is not None, f"{what}: NumPy refuses ({ref_err!r}), kaionb does not"
    kinds = tuple(t for t in type(ref_err).__mro__ if t in (TypeError, ValueError, IndexError))
    assert isinstance(err, kinds or type(ref_err)), f"{what}: {err!r}, NumPy {ref_err!r}"


def _same_outcome(ours, theirs, what):
    """True when both give a result (then of one shape and dtype); False when both refuse."""
    (got, err), (ref, ref_err) = ours, theirs
    if ref_err is not None:
        _same_refusal(err, ref_err, what)
        return False
    assert err is None, f"{what}: kaionb refuses ({err!r}), NumPy does not"
    ref = np.asarray(ref)
    assert (got.shape, got.dtype) == (ref.shape, ref.dtype), \
        f"{what}: {got.shape} {got.dtype} vs NumPy's {ref.shape} {ref.dtype}"
    return True


@given(name=st.sampled_from(BINARY), shapes=st.tuples(small_shapes, small_shapes),
       dtypes=st.tuples(st.sampled_from(ALL_DTYPES), st.sampled_from(ALL_DTYPES)),
       layouts=st.tuples(layouts, layouts))
@time_budget
def test_elementwise_refuses_where_numpy_does(name, shapes, dtypes, layouts):
    xs = [meta(s, d, lay) for s, d, lay in zip(shapes, dtypes, layouts)]
    theirs = _numpy(lambda: elementwise.UFUNCS[name].numpy(
        *(zeros_like_shape(s, d) for s, d in zip(shapes, dtypes))))
    with stubbed_device() as device:
        device.own(xs)
        ours = _numpy(lambda: getattr(kaionb, name)(*xs))
        if _same_outcome(ours, theirs, f"{name}{shapes}"):
            assert bool(device.launches) == (ours[0].size > 0)


@given(op=st.sampled_from(REDUCTIONS), shape=small_shapes.filter(len),
       dtype=st.sampled_from(ALL_DTYPES), layout=layouts, keepdims=st.booleans(),
       axis=st.one_of(st.none(), st.integers(-5, 4),
                      st.lists(st.integers(-5, 4), max_size=3).map(tuple)))
@time_budget
def test_reductions_refuse_where_numpy_does(op, shape, dtype, layout, keepdims, axis):
    # (0-d arrays are left out: their axis=0 is a documented difference from NumPy)
    x = meta(shape, dtype, layout)
    theirs = _numpy(lambda: getattr(np, op)(zeros_like_shape(shape, dtype), axis=axis,
                                            keepdims=keepdims))
    with stubbed_device() as device:
        device.own(x)
        ours = _numpy(lambda: getattr(kaionb, op)(x, axis, keepdims=keepdims))
        if _same_outcome(ours, theirs, f"{op}{shape} axis={axis}"):
            assert bool(device.launches) == (ours[0].size > 0)


# -- views: NumPy's shape, strides and offset ----------------------------------------------

def _layout_of(a, base_ptr):
    """(shape, strides of the axes longer than 1, byte offset) — what a view is; the
    strides of other axes and the offset of an empty view are arbitrary in both."""
    strides = tuple(s for n, s in zip(a.shape, a.strides) if n > 1)
    size = math.prod(a.shape)
    ptr = a.ptr if isinstance(a, DeviceArray) else a.__array_interface__["data"][0]
    return a.shape, strides if size else (), ptr - base_ptr if size else 0


axes = st.integers(-5, 4)
index_items = st.one_of(
    st.integers(-6, 5), st.none(), st.just(Ellipsis),
    st.builds(slice, st.none() | st.integers(-6, 6), st.none() | st.integers(-6, 6),
              st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3])))
VIEW_FUNCTIONS = {
    "getitem": (st.lists(index_items, max_size=4).map(tuple), lambda a, key: a[key],
                lambda a, key: a[key]),
    "reshape": (st.lists(st.integers(-1, 6), max_size=4).map(tuple),
                lambda a, s: np.reshape(a, s, copy=False), lambda a, s: kaionb.reshape(a, s)),
    "broadcast_to": (small_shapes, np.broadcast_to, kaionb.broadcast_to),
    "expand_dims": (axes, lambda a, ax: np.expand_dims(a, ax), kaionb.expand_dims),
    "squeeze": (st.one_of(st.none(), axes, st.lists(axes, max_size=2).map(tuple)),
                lambda a, ax: np.squeeze(a, ax), kaionb.squeeze),
    "flip": (st.one_of(st.none(), axes, st.lists(axes, max_size=2).map(tuple)),
             lambda a, ax: np.flip(a, ax), lambda a, ax: kaionb.flip(a, axis=ax)),
    "moveaxis": (st.tuples(st.lists(axes, max_size=2).map(tuple), st.lists(axes, max_size=2)
                           .map(tuple)), lambda a, sd: np.moveaxis(a, *sd),
                 lambda a, sd: kaionb.moveaxis(a, *sd)),
    "permute_dims": (st.lists(axes, max_size=5).map(tuple), np.permute_dims,
                     kaionb.permute_dims),
}


def _repeated(axis, ndim):
    axes = axis if isinstance(axis, tuple) else (axis,)
    return len({a % ndim for a in axes if -ndim <= a < ndim}) < len(axes)


# Where kaionb's views differ from NumPy, left out here: its bugs (the regular tests at
# the end), and NumPy's squeeze of a 0-d array over an int axis 0 or -1, which the array
# API refuses (as kaionb does).
DIFFERENCES = {
    "permute_dims": lambda x, axes: (axes == () and x.ndim > 0)
    or any(not -x.ndim <= a < x.ndim for a in axes),
    "squeeze": lambda x, axis: (isinstance(axis, tuple) and x.ndim and _repeated(axis, x.ndim))
    or (x.ndim == 0 and axis in (0, -1)),
    "flip": lambda x, axis: isinstance(axis, tuple) and x.ndim and _repeated(axis, x.ndim),
}


@given(base=small_shapes, dtype=st.sampled_from((F32, F16, I8)), layout=layouts,
       chain=st.lists(st.sampled_from(sorted(VIEW_FUNCTIONS)).flatmap(
           lambda f: st.tuples(st.just(f), VIEW_FUNCTIONS[f][0])), min_size=1, max_size=3))
@time_budget
def test_views_match_numpy(base, dtype, layout, chain):
    x = meta(base, dtype, layout)
    twin = np_twin(x)
    ptr0, np0 = x.ptr, twin.__array_interface__["data"][0]
    with stubbed_device() as device:
        device.own(x)
        for name, arg in chain:
            if name == "getitem" and Ellipsis not in arg:
                arg += (Ellipsis,)
            assume(not DIFFERENCES.get(name, lambda *a: False)(x, arg))
            _, theirs, ours = VIEW_FUNCTIONS[name]
            what = f"{name}({arg!r}) of {twin.shape} strides {twin.strides}"
            (ref, ref_err), (got, err) = _numpy(lambda: theirs(twin, arg)), _numpy(
                lambda: ours(x, arg))
            if name == "reshape" and ref_err is not None and err is None:
                # NumPy needs a copy here; kaionb makes one (C-contiguous, a launch)
                assert got.is_c_contiguous and got.size == x.size and device.launches, what
                return
            if ref_err is not None:
                _same_refusal(err, ref_err, what)
                return
            assert err is None, f"{what}: kaionb refuses ({err!r}), NumPy does not"
            if not isinstance(ref, np.ndarray):  # np.flip of a 0-d array: a scalar
                ref = twin[...]
            assert _layout_of(got, ptr0) == _layout_of(ref, np0), what
            assert not device.launches, f"{what}: a view launched {device.launches}"
            x, twin = got, ref


# -- cases the fuzz found, kept as regular tests ------------------------------------------

@pytest.mark.parametrize("call, exc", [
    pytest.param(lambda: kaionb.permute_dims(fake((3,)), ()), ValueError),
    pytest.param(lambda: kaionb.permute_dims(fake((2, 3)), (0, 3)), np.exceptions.AxisError),
    pytest.param(lambda: kaionb.squeeze(fake((1, 3)), (0, 0)), ValueError),
    pytest.param(lambda: kaionb.flip(fake((1, 3)), axis=(0, 0)), ValueError),
], ids=["permute_dims-empty", "permute_dims-wrap", "squeeze-repeated", "flip-repeated"])
def test_view_refusals_found_by_fuzzing(call, exc):
    with pytest.raises(exc):
        call()


def test_overlapping_views_of_one_array_are_not_replayed():
    """A call recorded on separate arrays is not replayed onto overlapping views of one
    allocation with the same layouts (``add(y[:n], 1, out=y[1:n + 1])``): the host path
    runs and copies the input first, as NumPy's semantics need. Disjoint views of one
    allocation are replayed (found in review, 2026-11-26)."""
    with stubbed_device() as device:
        x, y = fake((64,), F32), fake((128,), F32)
        x._owner, y._owner = object(), object()  # (metadata arrays all have owner None)
        device.own(x, y)
        for _ in range(2):
            kaionb.add(x[:32], 1.0, out=y[1:33])
        assert device.launches[-1] == "replay" and not device.actions
        kaionb.add(y[:32], 1.0, out=y[1:33])
        assert device.launches[-1] != "replay" and device.actions == ["cuMemcpyDtoDAsync"]
        device.actions.clear()
        for _ in range(2):
            kaionb.add(y[:32], 1.0, out=y[40:72])
        assert device.launches[-1] == "replay" and not device.actions


def test_transposed_operands_take_the_tiled_layout():
    """Which operands the tiled layout stages, for the walks a transposed view gives: one
    or both operands, a transposed output (the walk follows the output's strides), a
    batch of planes, more axes than the kernels index (one launch per leading index), and
    planes narrower than a tile (the strided kernel)."""
    with stubbed_device() as device:
        a, b, c = fake((67, 45), F32), fake((45, 67), F32), fake((67, 45), F32)
        batch, wide = fake((3, 40, 50), F16), fake((2, 3, 2, 3, 40, 34), F16)
        narrow = fake((33, 8), F32)
        for x in (a, b, c, batch, wide, narrow):
            x._owner = object()
        device.own(a, b, c, batch, wide, narrow)

        def ran(call):
            kaionb._device.STATE.calls = None  # plan afresh: no replay
            start = len(device.launches)
            call()
            names = device.launches[start:]
            return [n.split("_to_")[1].removesuffix("_kernel") for n in names]

        assert ran(lambda: a + b.T) == ["float32_staging_x1_tiled"]
        assert ran(lambda: b.T - a) == ["float32_staging_x0_tiled"]
        assert ran(lambda: a.T * c.T) == ["float32_staging_x0_staging_x1_tiled"]
        assert ran(lambda: kaionb.add(a, 1.0, out=b.T)) == ["float32_staging_x0_tiled"]
        assert ran(lambda: kaionb.add(a, b.T, out=c)) == ["float32_staging_x1_tiled"]
        assert ran(lambda: b.T.astype(F16)) == ["float16_staging_x0_tiled"]
        assert ran(lambda: batch.transpose(0, 2, 1) + 1) == ["float16_staging_x0_tiled"]
        # Six axes that do not merge: the first two in a host loop, 2 x 2 launches.
        six = kaionb.permute_dims(wide[:, ::2, :, ::2], (0, 1, 2, 3, 5, 4))
        assert ran(lambda: six + 1) == ["float16_staging_x0_tiled"] * 4
        assert ran(lambda: narrow.T + 1) == ["float32_strided"]
        assert ran(lambda: a + a) == ["float32_vector"]
