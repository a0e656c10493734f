"""The bad-input catalogue: one table of refusals across the public API, on the CPU.

Each row calls one public function with one bad argument (a wrong dtype, rank or shape,
host memory for device memory, a layout or alignment the kernel cannot take, a value out
of range, a NaN / inf / negative scalar where it matters, None, a string, a foreign
object, a NumPy ``out=``) and checks the refusal. ``C`` rows: kaionb.validation's one
format, ``<op>: argument '<name>' expected ..., got ...``. ``N`` rows, for what mirrors
NumPy on purpose (elementwise, reductions, creation and shape functions, indexing,
asarray; tests/test_array_api.py): NumPy's exception type and text, prefixed with the
function's name where kaionb adds one.

Arrays are metadata headers (kaionb.testing.metadata_array): no GPU is needed, and an
autouse fixture fails a row that gets as far as planning or launching a kernel. Arrays on
two devices are tests/test_devices.py's table. A row the library gets wrong is
``xfail(strict=True)``, its reason one of the ``BUG_*`` below (file:line, what happens)."""

import math
import re

import numpy as np
import pytest

import kaionb
from kaionb import DeviceArray
from kaionb.kernels import elementwise, launch, op
from kaionb.kernels.matmul_int4 import Int4Weight
from kaionb.testing import metadata_array as fake

F16, F32, F64, BF16 = np.float16, np.float32, np.float64, kaionb.bfloat16
I8, I32, I64, U8, U32 = np.int8, np.int32, np.int64, np.uint8, np.uint32
TE, VE, IE, OE = TypeError, ValueError, IndexError, OverflowError
AXE = np.exceptions.AxisError  # a ValueError and an IndexError, as NumPy's
NAN, INF = math.nan, math.inf

# -- what the library gets wrong -----------------------------------------------
# (none known: a row found failing gets ``bug=BUG_<name>``, a constant here saying
# file:line and what happens)


# -- the checks ----------------------------------------------------------------

def _raised(call) -> Exception:
    try:
        call()
    except Exception as err:  # noqa: BLE001  (the checks name what came)
        return err
    pytest.fail("nothing was raised")


def check(exc, fn, arg, call):
    """``call()`` raises ``exc`` in the one format, naming ``fn`` and argument ``arg``."""
    err = _raised(call)
    msg = str(err)
    assert (isinstance(err, exc) and msg.startswith(f"{fn}: ")
            and f"argument '{arg}' expected " in msg and ", got " in msg), \
        f"{type(err).__name__}: {msg}"


def check_numpy(exc, fn, match, call):
    """``call()`` raises ``exc`` (NumPy's type), its text prefixed ``fn: `` (None: NumPy's
    own, unprefixed) and matching the regex ``match``."""
    err = _raised(call)
    msg = str(err)
    assert (isinstance(err, exc) and (fn is None or msg.startswith(f"{fn}: "))
            and re.search(match, msg)), f"{type(err).__name__}: {msg}"


def _row(how, fn, what, exc, call, bug, row_id):
    marks = () if bug is None else (pytest.mark.xfail(strict=True, reason=bug),)
    return pytest.param(how, fn, what, exc, call, marks=marks, id=row_id)


def C(fn, arg, exc, kind, call, bug=None):
    """A refusal in the one format (id ``fn:arg:kind``)."""
    return _row(check, fn, arg, exc, call, bug, f"{fn}:{arg}:{kind}")


def N(fn, match, exc, kind, call, bug=None):
    """NumPy's refusal: its type, its text prefixed with ``fn``, matching ``match``."""
    return _row(check_numpy, fn, match, exc, call, bug, f"{fn}:{kind}")


@pytest.fixture(autouse=True)
def nothing_launches(monkeypatch):
    """A row that plans or launches a kernel fails: refusals come before any launch."""
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was planned or launched before the refusal")

    monkeypatch.setattr(launch.KernelDef, "__getitem__", refuse)
    monkeypatch.setattr(launch.CompiledKernel, "__call__", refuse)
    monkeypatch.setattr(op._Launch, "__call__", refuse)


# -- arguments -----------------------------------------------------------------

def f(shape=(4, 8), dtype=F32):
    return fake(shape, dtype)


def strided(shape=(4, 8), dtype=F32):
    """``shape`` with its last axis at a stride of 2 elements."""
    return fake(shape[:-1] + (2 * shape[-1],), dtype)[..., ::2]


def rows_at(shape, dtype, row_bytes):
    """A 2-D ``shape`` whose rows lie ``row_bytes`` apart (not a whole number of elements)."""
    base = fake((shape[0] * row_bytes,), U8)
    dt = np.dtype(dtype)
    return DeviceArray(shape, dt, (row_bytes, dt.itemsize), base.ptr, None, 0)


def int4(k=128, n=16):
    """A symmetric int4 weight header [k, n], one group per column."""
    return Int4Weight(fake((n, k // 32), U32), fake((1, n), F16), None, None, (k, n), k)


class Foreign:
    """Another library's array on DLPack device type ``kind`` (1: CPU, 4: OpenCL)."""

    def __init__(self, kind):
        self.kind = kind

    def __dlpack_device__(self):
        return (self.kind, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("imported before its device was checked")


def with_defaults(fn, **defaults):
    """``fn`` called by keyword with ``defaults`` (callables are called for each call); a row
    replaces the argument it makes bad, or adds one."""
    def call(**kw):
        args = {n: kw.pop(n) if n in kw else (d() if callable(d) else d)
                for n, d in defaults.items()}
        return fn(**args, **kw)
    return call


Q, Q32, S2 = (1, 2, 16, 64), (1, 2, 16, 32), (16, 64)  # attention [B, H, S, D], one head
X4 = (1, 4, 2, 8)  # rope [B, S, H, D]


def q16(shape=Q, dtype=F16):
    return fake(shape, dtype)


def vec(n=8, dtype=F32):
    return lambda: fake((n,), dtype)


def qkv_out(dtype=F16, v=(4, 8)):
    return (f((4, 16), dtype), f((4, 8), dtype), f(v, dtype))


def _mm(fn, dtype=F16):
    return with_defaults(fn, a=lambda: f((4, 8), dtype), b=lambda: f((8, 16), dtype))


mm, tc16, tc16a = _mm(kaionb.matmul), _mm(kaionb.matmul_tc), _mm(kaionb.matmul_tc_async)
tcbf, tcbfa = _mm(kaionb.matmul_tc_bf16, BF16), _mm(kaionb.matmul_tc_bf16_async, BF16)
mm8 = with_defaults(kaionb.matmul_int8, a=lambda: f((4, 32), I8), b=lambda: f((16, 32), I8).T,
                    scale=1.0)
qkv8 = with_defaults(kaionb.qkv_project_int8, x=lambda: f((4, 32), F16),
                     w_q=lambda: f((32, 16), I8), w_k=lambda: f((32, 8), I8),
                     w_v=lambda: f((32, 8), I8), scale_q=1.0, scale_k=1.0, scale_v=1.0)
mm4 = with_defaults(kaionb.matmul_int4, a=lambda: f((4, 128), F16), w=int4)
qkv4 = with_defaults(kaionb.qkv_project_int4, x=lambda: f((4, 128), F16), w_q=int4, w_k=int4,
                     w_v=int4)
pack = with_defaults(kaionb.pack_int4, q=lambda: np.zeros((128, 16), U8),
                     scales=lambda: np.ones((1, 16), F32))
quant4 = with_defaults(kaionb.quantize_int4, w=lambda: np.ones((128, 16), F32))
deq4 = with_defaults(kaionb.dequantize_int4, w=int4)
att = with_defaults(kaionb.attention, q=q16, k=q16, v=q16)
att_bwd = with_defaults(kaionb.attention_bwd, dout=q16, q=q16, k=q16, v=q16, out=q16,
                        lse=lambda: f(Q[:-1]))
tc, tc_causal, flash, flash_causal = (
    with_defaults(fn, q=lambda: q16(S2), k=lambda: q16(S2), v=lambda: q16(S2))
    for fn in (kaionb.attention_tc, kaionb.attention_tc_causal, kaionb.attention_flash,
               kaionb.attention_flash_causal))
rms = with_defaults(kaionb.rms_norm, x=f, weight=vec())
ln = with_defaults(kaionb.layer_norm, x=f, weight=vec(), bias=vec())
arms = with_defaults(kaionb.add_rms_norm, x=f, residual=f, weight=vec())
rms_bwd = with_defaults(kaionb.rms_norm_bwd, grad=f, x=f, weight=vec())
ln_bwd = with_defaults(kaionb.layer_norm_bwd, grad=f, x=f, weight=vec(), bias=vec())
arms_bwd = with_defaults(kaionb.add_rms_norm_bwd, grad=f, grad_residual=f, s=f, weight=vec())
sm = with_defaults(kaionb.softmax, x=f)
sm_bwd = with_defaults(kaionb.softmax_bwd, grad=f, y=f)
gelu = with_defaults(kaionb.gelu, x=f)
gelu_bwd = with_defaults(kaionb.gelu_bwd, grad=f, x=f)
silu = with_defaults(kaionb.fused_silu_gate, x=f, gate=f)
silu_bwd = with_defaults(kaionb.fused_silu_gate_bwd, grad=f, x=f, gate=f)
TABLES = {"cos": lambda: f((4, 4)), "sin": lambda: f((4, 4))}
rope = with_defaults(kaionb.rope, x=lambda: f(X4), **TABLES)
rope_bwd = with_defaults(kaionb.rope_bwd, grad=lambda: f(X4), **TABLES)
q8 = with_defaults(kaionb.quantize_int8, x=f)
dq8 = with_defaults(kaionb.dequantize_int8, q=lambda: f(dtype=I8), scale=lambda: f(()))
adamw = with_defaults(kaionb.adamw_step, param=vec(64), grad=vec(64), m=vec(64), v=vec(64),
                      lr=1e-3, step=1)
rng = kaionb.random.default_rng
ELEMENTWISE = {n: elementwise.UFUNCS[n].nin for n in kaionb.__all__ if n in elementwise.UFUNCS}
REDUCTIONS = ("sum", "prod", "mean", "max", "min", "argmax", "argmin", "var", "std", "any", "all")
# Public callables that refuse nothing on the CPU, and the alias concat (its refusals name
# concatenate, the function it is).
NO_INPUT_CHECKS = {"DeviceArray", "Graph", "Int4Weight", "Stream", "current_stream",
                   "device_count", "gpu_available", "finfo", "iinfo", "result_type", "can_cast",
                   "concat", "empty_cache"}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
          "original_max_position_embeddings": 8192}  # the two bands swapped


def _same(make, call):
    """``call(a, a)``: one new array passed as two arguments."""
    a = make()
    return call(a, a)


def _rope_shifted_out():
    """rope with an out one token along x's memory: shared, not element for element."""
    base = f((1, 5, 2, 8))
    return rope(x=base[:, :4], out=base[:, 1:])


def _backward(grad_output):
    """Tape.backward of an output a (host-only) rule recorded, with ``grad_output``."""
    a, y = f(), f()
    a.requires_grad = True
    with kaionb.grad.Tape() as tape:
        kaionb.grad.record(lambda g: (g,), (a,), (y,))
    tape.backward(y, grad_output)


def _take_into(out):
    return kaionb.take(f(), f((3,), I64), axis=0, out=out)


def _in_stream(s):
    with kaionb.stream(s):
        pass


def _in_graph(stream):
    with kaionb.graph(stream):
        pass


# -- the catalogue -------------------------------------------------------------

CASES = [
    # matmul and KAIO's matmul_tc family
    C("matmul", "a", TE, "int8", lambda: mm(a=f((4, 8), I8))),
    C("matmul", "b", TE, "mixed", lambda: mm(b=f((8, 16), F32))),
    C("matmul", "a", TE, "None", lambda: mm(a=None)),
    C("matmul", "a", TE, "str", lambda: mm(a="abc")),
    C("matmul", "b", VE, "inner", lambda: mm(b=f((9, 16), F16))),
    C("matmul", "b", VE, "batch", lambda: mm(a=f((3, 4, 8), F16), b=f((2, 8, 16), F16))),
    C("matmul", "precision", VE, "unknown", lambda: mm(a=f(), b=f((8, 16)), precision="fast")),
    C("matmul", "dtype", TE, "int32", lambda: mm(dtype=I32)),
    C("matmul", "dtype", TE, "unknown", lambda: mm(dtype="foo")),
    C("matmul", "dtype", TE, "malformed", lambda: mm(dtype=("f4", -1))),
    C("matmul", "out", VE, "shape", lambda: mm(out=f((4, 15), F16))),
    C("matmul", "out", TE, "dtype", lambda: mm(dtype=F32, out=f((4, 16), F16))),
    C("matmul", "out", TE, "numpy", lambda: mm(out=np.zeros((4, 16), F16))),
    C("matmul", "out", TE, "list", lambda: mm(out=[[0.0] * 16] * 4)),
    C("matmul", "out", VE, "strided", lambda: mm(out=f((16, 4), F16).T)),
    C("matmul", "a", VE, "odd row bytes", lambda: mm(a=rows_at((4, 8), F16, 33), out=f((4, 16)))),
    C("matmul", "b", VE, "operator", lambda: f((4, 8), F16) @ f((9, 16), F16)),
    C("matmul_tc", "a", TE, "float32", lambda: tc16(a=f())),
    C("matmul_tc", "b", VE, "inner", lambda: tc16(b=f((4, 8), F16))),
    C("matmul_tc", "out", TE, "float64", lambda: tc16(out=f((4, 16), F64))),
    C("matmul_tc_bf16", "a", TE, "float16", lambda: tcbf(a=f((4, 8), F16))),
    C("matmul_tc_bf16", "out", TE, "numpy", lambda: tcbf(out=np.zeros((4, 16), F32))),
    C("matmul_tc_async", "a", TE, "bfloat16", lambda: tc16a(a=f((4, 8), BF16))),
    C("matmul_tc_bf16_async", "b", TE, "float32", lambda: tcbfa(b=f((8, 16)))),
    C("matmul_tc_bf16_async", "dtype", TE, "unknown", lambda: tcbfa(dtype="foo")),
    # matmul_int8 (W8A8), qkv_project_int8
    C("matmul_int8", "a", TE, "float16", lambda: mm8(a=f((4, 32), F16))),
    C("matmul_int8", "b", TE, "float32", lambda: mm8(b=f((32, 16)))),
    C("matmul_int8", "a", VE, "0-d", lambda: mm8(a=f((), I8))),
    C("matmul_int8", "b", VE, "3-d", lambda: mm8(b=f((1, 32, 16), I8))),
    C("matmul_int8", "b", VE, "inner", lambda: mm8(b=f((31, 16), I8))),
    C("matmul_int8", "a", VE, "K=0", lambda: mm8(a=f((4, 0), I8), b=f((0, 16), I8))),
    C("matmul_int8", "scale", TE, "str", lambda: mm8(scale="abc")),
    C("matmul_int8", "scale", TE, "None", lambda: mm8(scale=None)),
    C("matmul_int8", "scale", TE, "numpy float64", lambda: mm8(scale=np.ones(1, F64))),
    C("matmul_int8", "scale", VE, "vector", lambda: mm8(scale=f((16,)))),
    C("matmul_int8", "scale", VE, "triple", lambda: mm8(scale=(1.0, 1.0, 1.0))),
    C("matmul_int8", "scale_a", VE, "shape", lambda: mm8(scale=(f((5,)), 1.0))),
    C("matmul_int8", "scale_b", TE, "dtype", lambda: mm8(scale=(1.0, f((16,), F16)))),
    C("matmul_int8", "scale", VE, "nan", lambda: mm8(scale=NAN, out=f((4, 16)))),
    C("matmul_int8", "scale", VE, "inf", lambda: mm8(scale=INF, out=f((4, 16)))),
    C("matmul_int8", "bias", VE, "shape", lambda: mm8(bias=f((15,)))),
    C("matmul_int8", "bias", TE, "int8", lambda: mm8(bias=f((16,), I8))),
    C("matmul_int8", "out", TE, "numpy", lambda: mm8(out=np.zeros((4, 16), F32))),
    C("matmul_int8", "dtype", TE, "int32", lambda: mm8(dtype=I32)),
    C("qkv_project_int8", "x", TE, "float32", lambda: qkv8(x=f((4, 32)))),
    C("qkv_project_int8", "w_q", TE, "float16", lambda: qkv8(w_q=f((32, 16), F16))),
    C("qkv_project_int8", "w_k", VE, "hidden", lambda: qkv8(w_k=f((31, 8), I8))),
    C("qkv_project_int8", "w_v", VE, "width", lambda: qkv8(w_v=f((32, 16), I8))),
    C("qkv_project_int8", "x_scale", TE, "missing", lambda: qkv8(x=f((4, 32), I8))),
    C("qkv_project_int8", "x_scale", VE, "for float x", lambda: qkv8(x_scale=1.0)),
    C("qkv_project_int8", "scale_q", VE, "shape", lambda: qkv8(scale_q=f((8,)))),
    C("qkv_project_int8", "scale_q", VE, "nan", lambda: qkv8(scale_q=NAN, out=qkv_out())),
    C("qkv_project_int8", "bias", TE, "pair", lambda: qkv8(bias=(None, None))),
    C("qkv_project_int8", "bias[1]", VE, "shape", lambda: qkv8(bias=(None, f((16,)), None))),
    C("qkv_project_int8", "dtype", TE, "int8", lambda: qkv8(dtype=I8)),
    C("qkv_project_int8", "out", TE, "array", lambda: qkv8(out=f((4, 16), F16))),
    C("qkv_project_int8", "out[2]", VE, "shape", lambda: qkv8(out=qkv_out(v=(4, 16)))),
    C("qkv_project_int8", "out", TE, "float64", lambda: qkv8(out=qkv_out(F64))),
    C("qkv_project_int8", "out[1]", TE, "None", lambda: qkv8(out=(f((4, 16), F16), None,
                                                                   f((4, 8), F16)))),
    # matmul_int4 (W4A16), qkv_project_int4, pack_int4, quantize_int4, dequantize_int4
    C("matmul_int4", "a", TE, "float32", lambda: mm4(a=f((4, 128)))),
    C("matmul_int4", "a", VE, "K", lambda: mm4(a=f((4, 64), F16))),
    C("matmul_int4", "a", TE, "str", lambda: mm4(a="abc")),
    C("matmul_int4", "w", TE, "DeviceArray", lambda: mm4(w=f((128, 16), F16))),
    C("matmul_int4", "out", TE, "numpy", lambda: mm4(out=np.zeros((4, 16), F16))),
    C("matmul_int4", "dtype", TE, "int8", lambda: mm4(dtype=I8)),
    C("qkv_project_int4", "x", TE, "int8", lambda: qkv4(x=f((4, 128), I8))),
    C("qkv_project_int4", "w_q", TE, "numpy", lambda: qkv4(w_q=np.zeros((128, 16), F16))),
    C("qkv_project_int4", "w_k", VE, "K", lambda: qkv4(w_k=int4(64))),
    C("qkv_project_int4", "w_v", VE, "N", lambda: qkv4(w_v=int4(128, 32))),
    C("qkv_project_int4", "out", TE, "list of 1", lambda: qkv4(out=[f((4, 16), F16)])),
    C("pack_int4", "q", TE, "float", lambda: pack(q=np.zeros((128, 16), F32))),
    C("pack_int4", "q", VE, "1-d", lambda: pack(q=np.zeros(128, U8))),
    C("pack_int4", "q", VE, "code 16", lambda: pack(q=np.full((128, 16), 16, U8))),
    C("pack_int4", "q", TE, "None", lambda: pack(q=None)),
    C("pack_int4", "group_size", VE, "48", lambda: pack(group_size=48)),
    C("pack_int4", "group_size", VE, "divisor",
      lambda: pack(q=np.zeros((96, 4), U8), group_size=64)),
    C("pack_int4", "group_size", TE, "str", lambda: pack(group_size="128")),
    C("pack_int4", "scales", TE, "int", lambda: pack(scales=np.ones((1, 16), I32))),
    C("pack_int4", "scales", VE, "shape", lambda: pack(scales=np.ones((2, 16), F32))),
    C("pack_int4", "scales", VE, "inf", lambda: pack(scales=np.full((1, 16), INF, F32))),
    C("pack_int4", "zeros", TE, "float", lambda: pack(zeros=np.ones((1, 16), F32))),
    C("pack_int4", "g_idx", VE, "groups", lambda: pack(
        q=np.zeros((64, 16), U8), scales=np.ones((2, 16), F32), group_size=32,
        g_idx=np.zeros(64, I32))),
    C("quantize_int4", "w", TE, "int32", lambda: quant4(w=np.ones((128, 16), I32))),
    C("quantize_int4", "w", VE, "1-d", lambda: quant4(w=np.ones(128, F32))),
    C("quantize_int4", "w", VE, "nan", lambda: quant4(w=np.full((128, 16), NAN, F32))),
    C("quantize_int4", "group_size", VE, "100", lambda: quant4(group_size=100)),
    C("dequantize_int4", "w", TE, "DeviceArray", lambda: deq4(w=f((128, 16), F16))),
    C("dequantize_int4", "dtype", TE, "float32", lambda: deq4(dtype=F32)),
    C("dequantize_int4", "dtype", TE, "unknown", lambda: deq4(dtype="foo")),
    C("dequantize_int4", "out", VE, "shape", lambda: deq4(out=f((16, 128), F16))),
    C("dequantize_int4", "out", TE, "numpy", lambda: deq4(out=np.zeros((128, 16)))),
    # attention, attention_bwd and KAIO's single-head entries
    C("attention", "q", TE, "float64", lambda: att(q=q16(dtype=F64))),
    C("attention", "v", TE, "mixed", lambda: att(v=q16(dtype=BF16))),
    C("attention", "q", TE, "object", lambda: att(q=object())),
    C("attention", "k", VE, "rank", lambda: att(k=q16(Q[1:]))),
    C("attention", "k", VE, "head dim", lambda: att(k=q16(Q32), v=q16(Q32))),
    C("attention", "q", VE, "D=12", lambda: att(**{n: q16((1, 2, 16, 12)) for n in "qkv"})),
    C("attention", "k", VE, "batch", lambda: att(k=q16((2, 2, 16, 64)), v=q16((2, 2, 16, 64)))),
    C("attention", "k", VE, "GQA heads", lambda: att(q=q16((1, 3, 16, 64)))),
    C("attention", "q", VE, "strided", lambda: att(q=strided(Q, F16))),
    C("attention", "scale", VE, "0", lambda: att(scale=0.0)),
    C("attention", "scale", VE, "nan", lambda: att(scale=NAN)),
    C("attention", "scale", TE, "str", lambda: att(scale="0.125")),
    C("attention", "out", VE, "shape", lambda: att(out=q16(Q32))),
    C("attention", "out", TE, "numpy", lambda: att(out=np.zeros(Q, F16))),
    C("attention", "out", VE, "misaligned", lambda: att(out=q16((1, 2, 16, 72))[..., 1:65])),
    C("attention_bwd", "dout", VE, "shape", lambda: att_bwd(dout=q16((1, 2, 15, 64)))),
    C("attention_bwd", "lse", VE, "shape", lambda: att_bwd(lse=f(Q))),
    C("attention_bwd", "k", VE, "head dim", lambda: att_bwd(k=q16(Q32), v=q16(Q32))),
    C("attention_bwd", "scale", VE, "nan", lambda: att_bwd(scale=NAN)),
    C("attention_bwd", "dtype", TE, "int8", lambda: att_bwd(dtype=I8)),
    C("attention_bwd", "grads[1]", TE, "None", lambda: att_bwd(grads=(q16(), None, q16()))),
    C("attention_bwd", "dtype", TE, "unknown", lambda: att_bwd(dtype="foo")),
    C("attention_bwd", "grads", TE, "pair", lambda: att_bwd(grads=(q16(), q16()))),
    C("attention_bwd", "grads", TE, "float64",
      lambda: att_bwd(grads=tuple(q16(dtype=F64) for _ in "qkv"))),
    C("attention_bwd", "grads[1]", VE, "shape", lambda: att_bwd(grads=(q16(), q16(Q[1:]), q16()))),
    C("attention_bwd", "grads[0]", VE, "misaligned",
      lambda: att_bwd(grads=(q16((1, 2, 16, 72))[..., 1:65], q16(), q16()))),
    C("attention_tc", "q", VE, "3-d", lambda: tc(q=q16((2, 16, 64)))),
    C("attention_tc", "q", TE, "None", lambda: tc(q=None)),
    C("attention_tc", "out", TE, "float16", lambda: tc(out=q16(S2))),
    C("attention_tc_causal", "k", VE, "4-d", lambda: tc_causal(k=q16())),
    C("attention_flash", "v", VE, "1-d", lambda: flash(v=q16((64,)))),
    C("attention_flash", "q", VE, "D=4", lambda: flash(**{n: q16((16, 4)) for n in "qkv"})),
    C("attention_flash", "out", TE, "numpy", lambda: flash(out=np.zeros(S2, F16))),
    C("attention_flash_causal", "scale", VE, "negative", lambda: flash_causal(scale=-1.0)),
    # rms_norm, layer_norm, add_rms_norm and their backward passes
    C("rms_norm", "x", TE, "int32", lambda: rms(x=f(dtype=I32))),
    C("rms_norm", "x", TE, "str", lambda: rms(x="abc")),
    C("rms_norm", "x", VE, "strided", lambda: rms(x=strided())),
    C("rms_norm", "x", VE, "rows", lambda: rms(x=f((4, 6, 8))[:, :3], out=f((4, 3, 8)))),
    C("rms_norm", "weight", VE, "shape", lambda: rms(weight=f((7,)))),
    C("rms_norm", "weight", TE, "mixed", lambda: rms(weight=f((8,), F16))),
    C("rms_norm", "eps", VE, "0", lambda: rms(eps=0.0)),
    C("rms_norm", "eps", VE, "nan", lambda: rms(eps=NAN)),
    C("rms_norm", "eps", TE, "str", lambda: rms(eps="1e-6")),
    C("rms_norm", "out", TE, "numpy", lambda: rms(out=np.zeros((4, 8), F32))),
    C("layer_norm", "bias", VE, "shape", lambda: ln(bias=f((9,)))),
    C("layer_norm", "bias", TE, "mixed", lambda: ln(bias=f((8,), BF16))),
    C("layer_norm", "eps", VE, "nan", lambda: ln(eps=NAN)),
    C("add_rms_norm", "residual", VE, "shape", lambda: arms(residual=f((4, 9)))),
    C("add_rms_norm", "residual", TE, "mixed", lambda: arms(residual=f(dtype=F16))),
    C("add_rms_norm", "residual_out", TE, "numpy", lambda: arms(out=f(), residual_out=np.zeros(8))),
    C("add_rms_norm", "residual_out", VE, "is out", lambda: _same(f, lambda o, r: arms(
        out=o, residual_out=r))),
    C("rms_norm_bwd", "grad", VE, "shape", lambda: rms_bwd(grad=f((4, 9)))),
    C("rms_norm_bwd", "grad", TE, "float16", lambda: rms_bwd(grad=f(dtype=F16))),
    C("rms_norm_bwd", "out", TE, "triple", lambda: rms_bwd(out=(f(), f((8,)), f((8,))))),
    C("rms_norm_bwd", "out[1]", TE, "dtype", lambda: rms_bwd(out=(f(), f((8,), F16)))),
    C("layer_norm_bwd", "bias", VE, "shape", lambda: ln_bwd(bias=f((4,)))),
    C("layer_norm_bwd", "out", TE, "array", lambda: ln_bwd(out=f())),
    C("add_rms_norm_bwd", "grad_residual", VE, "shape", lambda: arms_bwd(grad_residual=f((8,)))),
    C("add_rms_norm_bwd", "eps", VE, "inf", lambda: arms_bwd(eps=INF)),
    # softmax, gelu, fused_silu_gate and their backward passes
    C("softmax", "x", TE, "int32", lambda: sm(x=f(dtype=I32))),
    C("softmax", "axis", VE, "range", lambda: sm(axis=2)),
    C("softmax", "axis", TE, "float", lambda: sm(axis=1.0)),
    C("softmax", "out", TE, "numpy", lambda: sm(out=np.zeros((4, 8), F32))),
    C("softmax_bwd", "y", TE, "int8", lambda: sm_bwd(y=f(dtype=I8))),
    C("softmax_bwd", "grad", TE, "float16", lambda: sm_bwd(grad=f(dtype=F16))),
    C("softmax_bwd", "out", TE, "dtype", lambda: sm_bwd(out=f(dtype=F16))),
    C("gelu", "approximate", VE, "fast", lambda: gelu(approximate="fast")),
    C("gelu", "approximate", TE, "None", lambda: gelu(approximate=None)),
    C("gelu", "x", TE, "int8", lambda: gelu(x=f(dtype=I8))),
    C("gelu_bwd", "grad", VE, "shape", lambda: gelu_bwd(grad=f((8, 4)))),
    C("gelu_bwd", "grad", TE, "float16", lambda: gelu_bwd(grad=f(dtype=F16))),
    C("fused_silu_gate", "gate", VE, "shape", lambda: silu(gate=f((4, 9)))),
    C("fused_silu_gate", "gate", TE, "mixed", lambda: silu(gate=f(dtype=BF16))),
    C("fused_silu_gate_bwd", "gate", TE, "mixed", lambda: silu_bwd(gate=f(dtype=F16))),
    C("fused_silu_gate_bwd", "out", TE, "single", lambda: silu_bwd(out=(f(),))),
    C("fused_silu_gate_bwd", "out[1]", TE, "dtype", lambda: silu_bwd(out=(f(), f(dtype=F16)))),
    # rope, rope_bwd, rope_cache
    C("rope", "x", TE, "int32", lambda: rope(x=f(X4, I32))),
    C("rope", "x", VE, "strided", lambda: rope(x=strided(X4))),
    C("rope", "x", VE, "odd row bytes", lambda: rope(x=rows_at((4, 8), F32, 34))),
    C("rope", "x", VE, "batch axes", lambda: rope(x=f((2, 3, 4, 2, 8))[:, :2])),
    C("rope", "layout", VE, "unknown", lambda: rope(layout="bsdh")),
    C("rope", "interleaved", TE, "int", lambda: rope(interleaved=1)),
    C("rope", "cos", VE, "R > D", lambda: rope(cos=f((4, 5)), sin=f((4, 5)))),
    C("rope", "cos", VE, "short", lambda: rope(cos=f((2, 4)), sin=f((2, 4)))),
    C("rope", "sin", VE, "shape", lambda: rope(sin=f((5, 4)))),
    C("rope", "positions", TE, "float", lambda: rope(positions=np.arange(4.0))),
    C("rope", "positions", VE, "range", lambda: rope(positions=np.array([0, 1, 2, 9]))),
    C("rope", "positions", VE, "shape", lambda: rope(positions=np.arange(3))),
    C("rope", "positions", TE, "device float", lambda: rope(positions=f((4,)))),
    C("rope", "out", TE, "numpy", lambda: rope(out=np.zeros(X4, F32))),
    C("rope", "out", VE, "overlap", _rope_shifted_out),
    C("rope", "out", VE, "broadcast", lambda: rope(out=kaionb.broadcast_to(f((1, 1, 2, 8)), X4))),
    C("rope_bwd", "grad", TE, "int8", lambda: rope_bwd(grad=f(X4, I8))),
    C("rope_bwd", "interleaved", TE, "str", lambda: rope_bwd(interleaved="yes")),
    C("rope_bwd", "positions", TE, "float", lambda: rope_bwd(positions=[0.5, 1, 2, 3])),
    C("rope_cache", "seq_len", VE, "negative", lambda: kaionb.rope_cache(-1, 8)),
    C("rope_cache", "dim", VE, "odd", lambda: kaionb.rope_cache(4, 7)),
    C("rope_cache", "dim", TE, "str", lambda: kaionb.rope_cache(4, "8")),
    C("rope_cache", "base", VE, "nan", lambda: kaionb.rope_cache(4, 8, base=NAN)),
    C("rope_cache", "base", TE, "str", lambda: kaionb.rope_cache(4, 8, base="1e4")),
    C("rope_cache", "seq_len", TE, "str", lambda: kaionb.rope_cache("4", 8)),
    C("rope_cache", "scaling", VE, "str", lambda: kaionb.rope_cache(4, 8, scaling="linear")),
    C("rope_cache", "scaling", VE, "llama3 bands", lambda: kaionb.rope_cache(4, 8, scaling=LLAMA3)),
    # quantize_int8, dequantize_int8
    C("quantize_int8", "x", TE, "int8", lambda: q8(x=f(dtype=I8))),
    C("quantize_int8", "x", VE, "strided", lambda: q8(x=strided())),
    C("quantize_int8", "axis", VE, "1 of 3-d", lambda: q8(x=f((2, 4, 8)), axis=1)),
    C("quantize_int8", "out", TE, "triple", lambda: q8(out=(f(dtype=I8), f(()), f(())))),
    C("quantize_int8", "out[0]", TE, "numpy", lambda: q8(out=(np.zeros((4, 8), I8), f(())))),
    C("dequantize_int8", "q", TE, "float32", lambda: dq8(q=f())),
    C("dequantize_int8", "scale", TE, "float16", lambda: dq8(scale=f((), F16))),
    C("dequantize_int8", "scale", VE, "axis -1", lambda: dq8(scale=f((4,)), axis=-1)),
    C("dequantize_int8", "scale", VE, "strided", lambda: dq8(scale=strided((8,)), axis=-1)),
    C("dequantize_int8", "dtype", TE, "int32", lambda: dq8(dtype=I32)),
    C("dequantize_int8", "dtype", TE, "unknown", lambda: dq8(dtype="foo")),
    # adamw_step
    C("adamw_step", "step", VE, "0", lambda: adamw(step=0)),
    C("adamw_step", "step", TE, "float", lambda: adamw(step=1.0)),
    C("adamw_step", "lr", VE, "negative", lambda: adamw(lr=-1e-3)),
    C("adamw_step", "lr", VE, "nan", lambda: adamw(lr=NAN)),
    C("adamw_step", "lr", TE, "str", lambda: adamw(lr="1e-3")),
    C("adamw_step", "beta1", VE, "1", lambda: adamw(beta1=1.0)),
    C("adamw_step", "beta2", VE, "nan", lambda: adamw(beta2=NAN)),
    C("adamw_step", "eps", VE, "0", lambda: adamw(eps=0.0)),
    C("adamw_step", "weight_decay", VE, "negative", lambda: adamw(weight_decay=-0.01)),
    C("adamw_step", "maximize", TE, "str", lambda: adamw(maximize="yes")),
    C("adamw_step", "param", TE, "float16", lambda: adamw(param=f((64,), F16))),
    C("adamw_step", "param", TE, "numpy", lambda: adamw(param=np.zeros(64, F32))),
    C("adamw_step", "grad", VE, "shape", lambda: adamw(grad=f((65,)))),
    C("adamw_step", "m", VE, "strided", lambda: adamw(m=strided((64,)))),
    C("adamw_step", "model_param", TE, "float32", lambda: adamw(model_param=f((64,)))),
    C("adamw_step", "m", VE, "alias", lambda: _same(vec(64), lambda p, m: adamw(param=p, m=m))),
    # elementwise functions and operators
    N("add", r"shape mismatch.*\(4, 8\).*\(4, 9\)", VE, "shapes", lambda: f() + f((4, 9))),
    N("multiply", "shape mismatch", VE, "operator", lambda: f((3,)) * f((4,))),
    N("remainder", "argument 'x2'", TE, "str", lambda: kaionb.remainder(f(), "abc")),
    N("divide", "non-broadcastable output", VE, "out shape",
      lambda: kaionb.divide(f(), f(), out=f((8,)))),
    N("maximum", "Cannot cast ufunc 'maximum' output", TE, "out cast",
      lambda: kaionb.maximum(f(), 1.0, out=f(dtype=I32))),
    N("bitwise_or", "not supported", TE, "float", lambda: kaionb.bitwise_or(f(), f())),
    N("negative", "boolean negative", TE, "bool", lambda: -f(dtype=bool)),
    N("floor_divide", "out of bounds for int8", OE, "python int", lambda: f(dtype=I8) // 300),
    N("pow", "negative integer powers", VE, "int", lambda: kaionb.pow(f(dtype=I64), -2)),
    N("where", "shape mismatch", VE, "shapes", lambda: kaionb.where(f((4, 9), bool), f(), f())),
    C("where", "condition", TE, "None", lambda: kaionb.where(None, f(), f())),
    C("multiply", "out", TE, "numpy", lambda: kaionb.multiply(f(), f(), out=np.zeros((4, 8)))),
    C("sqrt", "out", TE, "list", lambda: kaionb.sqrt(f(), out=[0.0] * 8)),
    C("exp", "x", TE, "None", lambda: kaionb.exp(None)),
    C("clip", "x", TE, "None", lambda: kaionb.clip(None)),
    C("clip", "max", TE, "str", lambda: kaionb.clip(f(), max="a")),
    *[C(name, "out", TE, "numpy", lambda fn=getattr(kaionb, name), n=nin: fn(
        *[f(dtype=I32)] * n, out=np.zeros((4, 8)))) for name, nin in ELEMENTWISE.items()],
    N("clip", "shape mismatch", VE, "bounds", lambda: kaionb.clip(f(), f(), f((3,)))),
    N("clip", "shape mismatch", VE, "max only", lambda: kaionb.clip(f(), max=f((9,)))),
    N("clip", "shape mismatch", VE, "min only", lambda: kaionb.clip(f(), min=f((9,)))),
    N("astype", "'foo' is not a dtype", TE, "unknown", lambda: kaionb.astype(f(), "foo")),
    N("astype", "complex64 is not supported", TE, "complex", lambda: f().astype(np.complex64)),
    # reductions
    N("sum", "axis 2 is out of bounds", AXE, "axis", lambda: kaionb.sum(f(), axis=2)),
    N("prod", "repeated", AXE, "repeated axis", lambda: kaionb.prod(f(), axis=(0, -2))),
    N("max", "zero-size array", VE, "empty", lambda: kaionb.max(f((0, 3)), axis=0)),
    N("argmax", "empty sequence|zero-size", VE, "empty", lambda: kaionb.argmax(f((0,)))),
    C("mean", "axis", TE, "float", lambda: kaionb.mean(f(), axis=1.5)),
    C("argmax", "axis", TE, "tuple", lambda: kaionb.argmax(f(), axis=(0, 1))),
    C("sum", "dtype", TE, "unknown", lambda: kaionb.sum(f(), dtype="foo")),
    C("var", "ddof", VE, "both", lambda: kaionb.var(f(), correction=1, ddof=1)),
    C("std", "correction", TE, "str", lambda: kaionb.std(f(), correction="1")),
    C("any", "out", TE, "numpy", lambda: kaionb.any(f(), axis=0, out=np.zeros(8, bool))),
    C("sum", "out", TE, "dtype", lambda: kaionb.sum(f(dtype=I32), out=f((), F32))),
    C("mean", "out", VE, "strided", lambda: kaionb.mean(f(), axis=0, out=strided((8,)))),
    C("min", "x", TE, "None", lambda: kaionb.min(None)),
    *[C(name, "out", TE, "numpy", lambda fn=getattr(kaionb, name): fn(f(), out=np.zeros(())))
      for name in REDUCTIONS],
    # creation
    N("empty", "must be >= 0", VE, "negative", lambda: kaionb.empty((-1,))),
    N("empty", "'foo' is not a dtype", TE, "dtype", lambda: kaionb.empty((2,), dtype="foo")),
    N("zeros", "must be >= 0", VE, "negative", lambda: kaionb.zeros((2, -1))),
    N("ones", "must be >= 0", VE, "negative", lambda: kaionb.ones((-1,))),
    N("full", "not supported", TE, "str value", lambda: kaionb.full((2,), "ab")),
    N("empty_like", "not a dtype", TE, "dtype", lambda: kaionb.empty_like(f(), "?!")),
    N("zeros_like", "not supported", TE, "complex", lambda: kaionb.zeros_like(f(), np.complex64)),
    N("ones_like", "not a dtype", TE, "float", lambda: kaionb.ones_like(f(), dtype=0.5)),
    N("full_like", "not a dtype", TE, "dtype", lambda: kaionb.full_like(f(), 1, dtype="foo")),
    N("eye", "must be >= 0", VE, "negative", lambda: kaionb.eye(-1)),
    N("eye", "not a dtype", TE, "dtype", lambda: kaionb.eye(2, dtype="foo")),
    C("arange", "stop", TE, "str", lambda: kaionb.arange("a")),
    C("arange", "step", TE, "None", lambda: kaionb.arange(0, 5, None)),
    C("arange", "step", VE, "0", lambda: kaionb.arange(0, 5, 0)),
    C("arange", "stop", VE, "inf", lambda: kaionb.arange(INF)),
    C("arange", "stop", VE, "nan", lambda: kaionb.arange(0, NAN)),
    C("arange", "dtype", TE, "bool", lambda: kaionb.arange(5, dtype=bool)),
    C("linspace", "num", VE, "negative", lambda: kaionb.linspace(0, 1, -1)),
    C("linspace", "num", TE, "float", lambda: kaionb.linspace(0, 1, 2.5)),
    C("linspace", "start", TE, "str", lambda: kaionb.linspace("a", 1, 5)),
    C("linspace", "dtype", TE, "bool", lambda: kaionb.linspace(0, 1, 5, dtype=bool)),
    C("concatenate", "arrays", VE, "empty", lambda: kaionb.concatenate([])),
    C("concatenate", "arrays", TE, "int", lambda: kaionb.concatenate(5)),
    C("stack", "arrays", TE, "int", lambda: kaionb.stack(5)),
    C("concatenate", "arrays[1]", TE, "None", lambda: kaionb.concatenate([f(), None])),
    N("concatenate", "must match exactly", VE, "shapes",
      lambda: kaionb.concat([f((2, 3)), f((2, 4))])),
    N("concatenate", "same number of dimensions", VE, "ranks",
      lambda: kaionb.concatenate([f((2, 3)), f((3,))])),
    N("concatenate", "axis 2 is out of bounds", AXE, "axis",
      lambda: kaionb.concatenate([f(), f()], axis=2)),
    C("stack", "arrays", VE, "empty", lambda: kaionb.stack(())),
    N("stack", "same shape", VE, "shapes", lambda: kaionb.stack([f((2, 3)), f((3, 2))])),
    N("stack", "out of bounds", AXE, "axis", lambda: kaionb.stack([f(), f()], axis=3)),
    # shape functions
    N("reshape", "cannot reshape", VE, "size", lambda: kaionb.reshape(f(), (5,))),
    N("reshape", "only one dimension can be -1", VE, "two -1",
      lambda: kaionb.reshape(f(), (-1, -1))),
    N("reshape", "without a copy", VE, "copy=False",
      lambda: kaionb.reshape(strided(), (16,), copy=False)),
    N("broadcast_to", "could not be broadcast", VE, "shape",
      lambda: kaionb.broadcast_to(f((3,)), (4,))),
    N("expand_dims", "out of bounds", AXE, "axis", lambda: kaionb.expand_dims(f(), axis=-4)),
    N("expand_dims", "must be an int", TE, "str axis", lambda: kaionb.expand_dims(f(), axis="1")),
    N("squeeze", "size not equal to one", VE, "size", lambda: kaionb.squeeze(f((1, 3)), axis=1)),
    N("squeeze", "out of bounds", AXE, "axis", lambda: kaionb.squeeze(f((1, 3)), axis=2)),
    N("flip", "out of bounds", AXE, "axis", lambda: kaionb.flip(f(), axis=2)),
    N("moveaxis", "same number of elements", VE, "lengths",
      lambda: kaionb.moveaxis(f((2, 3, 4)), (0, 1), 2)),
    N("moveaxis", "out of bounds", AXE, "axis", lambda: kaionb.moveaxis(f((2, 3, 4)), 0, 3)),
    N("permute_dims", "not a permutation", VE, "repeated",
      lambda: kaionb.permute_dims(f((2, 3, 4)), (0, 0, 1))),
    # take and indexing
    N("take", "must be of integer", IE, "float indices", lambda: kaionb.take(f(), [[1.5]], axis=0)),
    N("take", "index 9 is out of bounds", IE, "range", lambda: kaionb.take(f(), [0, 9], axis=0)),
    N("take", "out of bounds", AXE, "axis", lambda: kaionb.take(f(), f((3,), I64), axis=2)),
    N("take", "empty axis", IE, "empty axis", lambda: kaionb.take(f((0, 8)), f((2,), I64), axis=0)),
    C("take", "x", VE, "0-d", lambda: kaionb.take(f(()), f((1,), I64), axis=0)),
    C("take", "out", TE, "numpy", lambda: _take_into(np.zeros((3, 8), F32))),
    C("take", "out", TE, "dtype", lambda: _take_into(f((3, 8), F16))),
    C("take", "out", VE, "shape", lambda: _take_into(f((3, 9)))),
    N(None, "basic indexing only", IE, "getitem float", lambda: f()[1.5]),
    N(None, "index 4 is out of bounds for axis 0", IE, "getitem range", lambda: f()[4]),
    N("__getitem__", "index 9 is out of bounds", IE, "array range", lambda: f()[[0, 9]]),
    N("__getitem__", "boolean index did not match", IE, "mask", lambda: f()[np.ones(5, bool)]),
    N(None, "one array index per subscript", IE, "two arrays", lambda: f()[[0], [1]]),
    N("__setitem__", "index 9 is out of bounds", IE, "setitem range",
      lambda: f().__setitem__([9], 1.0)),
    # asarray, from_dlpack
    N("asarray", "dtype <U1 is not supported", TE, "strings", lambda: kaionb.asarray(["a"])),
    N("asarray", "dtype object is not supported", TE, "object", lambda: kaionb.asarray(object())),
    N("asarray", "lives in host memory", VE, "host dlpack", lambda: kaionb.asarray(Foreign(1))),
    N("asarray", "on a OpenCL device", VE, "other device", lambda: kaionb.asarray(Foreign(4))),
    N("from_dlpack", "expected an object with __dlpack__", TE, "int",
      lambda: kaionb.from_dlpack(5)),
    N("from_dlpack", "got NoneType", TE, "None", lambda: kaionb.from_dlpack(None)),
    N("from_dlpack", "host memory", VE, "numpy", lambda: kaionb.from_dlpack(np.ones(2))),
    N("from_dlpack", "OpenCL", VE, "other device", lambda: kaionb.from_dlpack(Foreign(4))),
    # kaionb.random
    C("Generator", "seed", VE, "negative", lambda: kaionb.random.Generator(-1)),
    C("Generator", "seed", TE, "str", lambda: rng("abc")),
    C("random", "dtype", TE, "int32", lambda: rng(0).random(dtype=I32)),
    C("random", "size", VE, "negative", lambda: rng(0).random(-1)),
    C("random", "out", TE, "numpy", lambda: rng(0).random(out=np.zeros(3))),
    C("random", "out", TE, "list", lambda: rng(0).random(out=[0.0])),
    C("random", "out", VE, "shape", lambda: rng(0).random((2,), F32, out=f((3,)))),
    C("uniform", "high", VE, "below low", lambda: rng(0).uniform(1.0, 0.0)),
    C("uniform", "low", VE, "nan", lambda: rng(0).uniform(NAN)),
    C("uniform", "high", VE, "inf", lambda: rng(0).uniform(0.0, INF)),
    C("uniform", "high", VE, "past f16", lambda: rng(0).uniform(0.0, 7e4, dtype=F16)),
    C("standard_normal", "dtype", TE, "int8", lambda: rng(0).standard_normal(dtype=I8)),
    C("normal", "scale", VE, "negative", lambda: rng(0).normal(0.0, -1.0)),
    C("normal", "loc", VE, "nan", lambda: rng(0).normal(NAN)),
    C("integers", "dtype", TE, "float32", lambda: rng(0).integers(10, dtype=F32)),
    C("integers", "high", TE, "float", lambda: rng(0).integers(1.5)),
    C("integers", "high", VE, "past int8", lambda: rng(0).integers(0, 300, dtype=I8)),
    C("random", "size", VE, "module", lambda: kaionb.random.random(size=-1)),
    C("normal", "scale", VE, "module", lambda: kaionb.random.normal(0.0, -2.0, seed=1)),
    C("Generator", "seed", VE, "module", lambda: kaionb.random.random(seed=-3)),
    # devices (specs tests/test_devices.py does not try), streams
    C("kaionb.device", "n", TE, "object", lambda: kaionb.device(object())),
    C("kaionb.device", "n", VE, "index", lambda: kaionb.device("cuda:x")),
    C("kaionb.set_device", "n", TE, "bool", lambda: kaionb.set_device(True)),
    C("kaionb.set_device", "n", VE, "gpu", lambda: kaionb.set_device("gpu:0")),
    C("kaionb.Device", "ordinal", TE, "list", lambda: kaionb.Device([0])),
    C("kaionb.Device", "ordinal", VE, "negative", lambda: kaionb.Device(np.int64(-2))),
    C("kaionb.stream", "s", TE, "str", lambda: _in_stream("abc")),
    C("kaionb.stream", "s", VE, "negative", lambda: _in_stream(-1)),
    C("kaionb.stream", "s", TE, "bool", lambda: _in_stream(True)),
    C("DeviceArray.get", "stream", TE, "str", lambda: f().get(stream="abc")),
    C("kaionb.graph", "stream", TE, "str", lambda: _in_graph("abc")),
    # grad.Tape.backward
    C("Tape.backward", "output", VE, "unrecorded", lambda: kaionb.grad.Tape().backward(f())),
    C("Tape.backward", "grad_output", VE, "shape", lambda: _backward(f((8, 4)))),
    C("Tape.backward", "grad_output", VE, "numpy shape", lambda: _backward(np.zeros((4, 9)))),
    C("Tape.backward", "grad_output", TE, "str", lambda: _backward("abc")),
    C("Tape.backward", "grad_output", TE, "float", lambda: _backward(1.0)),
]


@pytest.mark.parametrize("how, fn, what, exc, call", CASES)
def test_bad_input_is_refused(how, fn, what, exc, call):
    how(exc, fn, what, call)


def test_every_public_function_has_rows():
    named = {str(p.values[1]).removeprefix("kaionb.") for p in CASES}
    public = {n for n in kaionb.__all__ if callable(getattr(kaionb, n))} - NO_INPUT_CHECKS
    assert len(CASES) >= 220 and public <= named, sorted(public - named)


def test_the_launch_guard_is_armed():
    # What a row that reached a kernel would meet (the autouse fixture's refusal).
    for call in (lambda: launch.CompiledKernel.__call__(None, (1,), (1,), ()),
                 lambda: op._Launch.__call__(None, []),
                 lambda: launch.KernelDef.__getitem__(None, 0)):
        with pytest.raises(AssertionError, match="planned or launched"):
            call()


@pytest.mark.parametrize("eps", [BF16.type(1e-5), np.float32(1e-5), np.float16(1e-3),
                                 np.int64(1), np.array(1e-5), 1e-5],
                         ids=["bfloat16", "float32", "float16", "int64", "0-d", "float"])
def test_real_scalars_of_every_kind_pass(eps):
    """A real number in any of NumPy's and ml_dtypes' forms passes the kind check (a
    bfloat16 scalar, read back from a bfloat16 array, is no ``numbers.Real``)."""
    from kaionb.validation import check_positive

    check_positive("rms_norm", "eps", eps)
