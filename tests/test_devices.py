"""Devices: every op runs on its arrays' device whatever device is current, arrays on two
devices are refused naming the op and the argument, device specs parse, and creation,
``asarray`` and ``DeviceArray.to`` land where they are told.

CPU: metadata headers (kaionb.testing.metadata_array) on devices 0 and 1. The refusal
comes from kernels.op.call_device before anything touches a GPU: without one, any later
step would raise RuntimeError ("no CUDA GPU") instead of the ValueError asserted here.
GPU: one GPU (``@gpu``), then two (``@two_gpus``: skipped unless
``kaionb.device_count() >= 2``), against float64 NumPy references on fresh seeded inputs,
outputs poisoned first."""

import operator
import re
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

import numpy as np
import pytest

import kaionb
from kaionb._device import current_ordinal, device_ordinal
from kaionb.kernels.activations import fused_silu_gate_ref, gelu_ref
from kaionb.kernels.attention import attention_ref
from kaionb.kernels.matmul import matmul_ref
from kaionb.kernels.matmul_int4 import Int4Weight
from kaionb.kernels.matmul_int8 import matmul_int8_ref
from kaionb.kernels.norms import layer_norm_ref, rms_norm_ref
from kaionb.kernels.optim import adamw_ref
from kaionb.kernels.quantize import dequantize_int8_ref, quantize_int8_ref
from kaionb.kernels.rope import rope_ref
from kaionb.kernels.softmax import softmax_ref
from kaionb.testing import assert_close, poison_value, random_array
from kaionb.testing import metadata_array as fake

F16, F32, F64, I8, I32, I64 = np.float16, np.float32, np.float64, np.int8, np.int32, np.int64
COUNT = kaionb.device_count()
HAS_GPU = COUNT > 0

gpu = pytest.mark.gpu


def two_gpus(test):
    """A GPU test that needs two GPUs (skipped, with the count seen, on fewer)."""
    return gpu(pytest.mark.skipif(COUNT < 2, reason=f"needs 2 GPUs; kaionb.device_count() "
                                                   f"is {COUNT}")(test))


def d0(shape=(4, 8), dtype=F32):
    """A metadata header on device 0 (of (4, 8) float32 unless told)."""
    return fake(shape, dtype)


def d1(shape=(4, 8), dtype=F32):
    """A metadata header on device 1."""
    return fake(shape, dtype, device_id=1)


def mixed_message(op, arg, first, expected=0, got=1):
    """The refusal's exact text; ``first`` the argument whose device is expected (None:
    an output, whose message says "where the inputs are")."""
    where = "where the inputs are" if first is None else f"where '{first}' is"
    return "^" + re.escape(f"{op}: argument '{arg}' expected device {expected} ({where}), "
                           f"got device {got}") + "$"


class _Foreign:
    """Another library's GPU array as call_device sees it: only ``__dlpack_device__``
    (importing it would fail the test: the refusal must come first)."""

    def __init__(self, ordinal):
        self.ordinal = ordinal

    def __dlpack_device__(self):
        return (2, self.ordinal)  # kDLCUDA

    def __dlpack__(self, **kwargs):
        raise AssertionError("imported before the devices were compared")


def _int4(device_id):
    """A 128×16 symmetric int4 weight header on ``device_id``."""
    return Int4Weight(fake((16, 4), np.uint32, device_id=device_id),
                      fake((1, 16), F16, device_id=device_id), None, None, (128, 16), 128)


# ============================================================================== CPU
# -- arrays on two devices are refused, naming the op and the argument -------------------

Q4 = (1, 2, 16, 64)  # attention [B, H, S, D], float16
X4 = (1, 4, 2, 8)  # rope [B, S, H, D]; cos, sin [4, 4]


def case(op, arg, first, call, *marks):
    return pytest.param(op, arg, first, call, marks=marks, id=f"{op}:{arg}")


def q0():
    return d0(Q4, F16)


def a8(device=0, shape=(4, 32)):
    return fake(shape, I8, device_id=device)


W8 = (32, 16)
MIXED = [
    # op, the argument named, the argument whose device 0 is expected (None: an output)
    case("rms_norm", "weight", "x", lambda: kaionb.rms_norm(d0(), d1((8,)))),
    case("rms_norm", "out", None, lambda: kaionb.rms_norm(d0(), d0((8,)), out=d1())),
    case("layer_norm", "bias", "x", lambda: kaionb.layer_norm(d0(), d0((8,)), d1((8,)))),
    case("add_rms_norm", "residual", "x", lambda: kaionb.add_rms_norm(d0(), d1(), d0((8,)))),
    case("add_rms_norm", "residual_out", None,
         lambda: kaionb.add_rms_norm(d0(), d0(), d0((8,)), residual_out=d1())),
    case("rms_norm_bwd", "x", "grad", lambda: kaionb.rms_norm_bwd(d0(), d1(), d0((8,)))),
    case("layer_norm_bwd", "weight", "grad", lambda: kaionb.layer_norm_bwd(d0(), d0(), d1((8,)))),
    case("softmax", "out", None, lambda: kaionb.softmax(d0(), out=d1())),
    case("softmax_bwd", "y", "grad", lambda: kaionb.softmax_bwd(d0(), d1())),
    case("gelu", "out", None, lambda: kaionb.gelu(d0(), out=d1())),
    case("gelu_bwd", "x", "grad", lambda: kaionb.gelu_bwd(d0(), d1())),
    case("fused_silu_gate", "gate", "x", lambda: kaionb.fused_silu_gate(d0(), d1())),
    case("fused_silu_gate", "out", None, lambda: kaionb.fused_silu_gate(d0(), d0(), out=d1())),
    case("fused_silu_gate_bwd", "gate", "grad",
         lambda: kaionb.fused_silu_gate_bwd(d0(), d0(), d1())),
    case("matmul", "b", "a", lambda: kaionb.matmul(d0(dtype=F16), d1((8, 16), F16))),
    case("matmul", "b", "a", lambda: d0(dtype=F16) @ d1((8, 16), F16)),
    case("matmul", "out", None,
         lambda: kaionb.matmul(d0(dtype=F16), d0((8, 16), F16), out=d1((4, 16), F16))),
    case("matmul_tc", "b", "a", lambda: kaionb.matmul_tc(d0(dtype=F16), d1((8, 16), F16))),
    case("matmul_int8", "b", "a", lambda: kaionb.matmul_int8(a8(), a8(1, W8), d0(()))),
    case("matmul_int8", "scale", "a", lambda: kaionb.matmul_int8(a8(), a8(0, W8), d1(()))),
    case("matmul_int8", "bias", "a",
         lambda: kaionb.matmul_int8(a8(), a8(0, W8), d0(()), bias=d1((16,)))),
    case("matmul_int8", "out", None,
         lambda: kaionb.matmul_int8(a8(), a8(0, W8), d0(()), out=d1((4, 16)))),
    case("qkv_project_int8", "w_k", "x", lambda: kaionb.qkv_project_int8(
        a8(), a8(0, W8), a8(1, W8), a8(0, W8), d0(()), d0(()), d0(()))),
    case("matmul_int4", "w", "a", lambda: kaionb.matmul_int4(d0((4, 128), F16), _int4(1))),
    case("qkv_project_int4", "w_v", "x",
         lambda: kaionb.qkv_project_int4(d0((4, 128), F16), _int4(0), _int4(0), _int4(1))),
    case("dequantize_int4", "out", None,
         lambda: kaionb.dequantize_int4(_int4(0), out=d1((128, 16), F16))),
    case("attention", "k", "q", lambda: kaionb.attention(q0(), d1(Q4, F16), q0())),
    case("attention", "v", "q", lambda: kaionb.attention(q0(), q0(), d1(Q4, F16))),
    case("attention", "out", None, lambda: kaionb.attention(q0(), q0(), q0(), out=d1(Q4, F16))),
    case("attention_bwd", "lse", "dout",
         lambda: kaionb.attention_bwd(q0(), q0(), q0(), q0(), q0(), d1(Q4[:-1]))),
    case("add", "x2", "x1", lambda: kaionb.add(d0(), d1())),
    case("add", "x2", "x1", lambda: d0() + d1()),
    case("add", "x2", "x1", lambda: kaionb.add(d0(), _Foreign(1))),
    case("add", "out", None, lambda: kaionb.add(d0(), d0(), out=d1())),
    case("add", "out", None, lambda: kaionb.add(d0(()), 1.0, out=d1(()))),
    case("exp", "out", None, lambda: kaionb.exp(d0(), out=d1())),
    case("less", "x2", "x1", lambda: d0() < d1()),
    case("where", "x2", "condition", lambda: kaionb.where(d0(dtype=bool), d0(), d1())),
    case("clip", "max", "x", lambda: kaionb.clip(d0(), d0(), d1())),
    case("sum", "out", None, lambda: kaionb.sum(d0(), axis=1, out=d1((4,)))),
    case("max", "out", None, lambda: kaionb.max(d0(), axis=0, out=d1((8,)))),
    case("argmax", "out", None, lambda: kaionb.argmax(d0(), axis=1, out=d1((4,), I64))),
    case("concatenate", "arrays[1]", "arrays[0]", lambda: kaionb.concatenate([d0(), d1()])),
    case("concatenate", "arrays[2]", "arrays[0]",
         lambda: kaionb.concatenate((d0((2,)), d0((3,)), d1((2,))))),
    case("stack", "arrays[1]", "arrays[0]", lambda: kaionb.stack([d0(), d1()])),
    case("rope", "cos", "x", lambda: kaionb.rope(d0(X4), d1((4, 4)), d0((4, 4)))),
    case("rope", "positions", "x",
         lambda: kaionb.rope(d0(X4), d0((4, 4)), d0((4, 4)), positions=d1((4,), I32))),
    case("rope", "out", None, lambda: kaionb.rope(d0(X4), d0((4, 4)), d0((4, 4)), out=d1(X4))),
    case("rope_bwd", "sin", "grad", lambda: kaionb.rope_bwd(d0(X4), d0((4, 4)), d1((4, 4)))),
    case("quantize_int8", "out[0]", None,
         lambda: kaionb.quantize_int8(d0(), out=(d1(dtype=I8), d0(())))),
    case("quantize_int8", "out[1]", None,
         lambda: kaionb.quantize_int8(d0(), axis=0, out=(d0(dtype=I8), d1((4,))))),
    case("dequantize_int8", "scale", "q", lambda: kaionb.dequantize_int8(d0(dtype=I8), d1(()))),
    case("dequantize_int8", "out", None,
         lambda: kaionb.dequantize_int8(d0(dtype=I8), d0(()), out=d1())),
    case("adamw_step", "grad", "param",
         lambda: kaionb.adamw_step(d0(), d1(), d0(), d0(), lr=1e-3, step=1)),
    case("adamw_step", "v", "param",
         lambda: kaionb.adamw_step(d0(), d0(), d0(), d1(), lr=1e-3, step=1)),
    case("adamw_step", "model_param", "param", lambda: kaionb.adamw_step(
        d0(), d0(), d0(), d0(), lr=1e-3, step=1, model_param=d1(dtype=F16))),
    case("take", "indices", "x", lambda: kaionb.take(d0(), d1((3,), I64), axis=0)),
    case("take", "out", None, lambda: kaionb.take(d0(), d0((3,), I64), axis=0, out=d1((3, 8)))),
    # DeviceArray.__getitem__ makes every key a tuple: a[i] is key (i,), so 'key[0]'.
    case("getitem", "key[0]", "x", lambda: d0()[d1((3,), I64)]),
    case("getitem", "key[0]", "x", lambda: d0()[d1(dtype=bool)]),
    case("getitem", "key[1]", "x", lambda: d0()[d0((3,), I64), d1((3,), I64)]),
    case("setitem", "key", "x", lambda: operator.setitem(d0(), d1((3,), I64), 1.0)),
    case("setitem", "value", "x", lambda: operator.setitem(d0(), d0((3,), I64), d1((3, 8)))),
]


@pytest.mark.parametrize("op, arg, first, call", MIXED)
def test_arrays_on_two_devices_are_refused(op, arg, first, call):
    with pytest.raises(ValueError, match=mixed_message(op, arg, first)):
        call()


# The first array found sets the device the others are held to.
FIRST_ON_1 = [
    case("rms_norm", "weight", "x", lambda: kaionb.rms_norm(d1(), d0((8,)))),
    case("rms_norm", "weight", "x", lambda: kaionb.rms_norm(_Foreign(1), d0((8,)))),
    case("matmul", "b", "a", lambda: kaionb.matmul(d1(dtype=F16), d0((8, 16), F16))),
    case("attention", "k", "q", lambda: kaionb.attention(d1(Q4, F16), q0(), q0())),
    case("subtract", "x2", "x1", lambda: d1() - d0()),
    case("concatenate", "arrays[1]", "arrays[0]", lambda: kaionb.concatenate((d1(), d0()))),
    case("adamw_step", "m", "param",
         lambda: kaionb.adamw_step(d1(), d1(), d0(), d1(), lr=1e-3, step=1)),
]


@pytest.mark.parametrize("op, arg, first, call", FIRST_ON_1)
def test_the_first_array_sets_the_device(op, arg, first, call):
    with pytest.raises(ValueError, match=mixed_message(op, arg, first, expected=1, got=0)):
        call()


# -- device specs: kaionb._device.device_ordinal ---------------------------------------

class device:  # noqa: N801  (torch.device as device_ordinal recognizes it: by class name)
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


class HasDeviceId:  # cuda.core Device, DeviceArray
    def __init__(self, device_id):
        self.device_id = device_id


class HasId:  # CuPy Device
    def __init__(self, id):  # noqa: A002
        self.id = id


@pytest.mark.parametrize("spec, ordinal", [
    (0, 0), (1, 1), (np.int64(2), 2), ("cuda:0", 0), ("cuda:1", 1), ("cuda:01", 1),
    ("cuda", 0),  # "cuda" (no index) is the current device: 0 on this thread
    (device("cuda:2"), 2), (device("cuda"), 0), (HasDeviceId(3), 3), (HasId(4), 4),
    (fake((2,), device_id=5), 5), (None, 0), (kaionb.device(0), 0),
], ids=repr)
def test_device_ordinal(spec, ordinal):
    # Positive ordinals pass here without a GPU: device_count() is then 0, and
    # check_ordinal only checks the upper bound when a GPU is visible.
    if HAS_GPU and ordinal >= COUNT:
        pytest.skip(f"ordinal {ordinal} is past this machine's {COUNT} GPU(s)")
    assert device_ordinal(spec) == ordinal


def test_one_device_block_entered_twice_and_nested_restores_each():
    from kaionb._device import STATE

    block = kaionb.device(0)
    with block:
        with block:  # the undo tokens live on a per-thread stack, not on the object
            assert len(STATE.scopes) == 2
        assert len(STATE.scopes) == 1
    assert STATE.scopes == [] and current_ordinal() == 0


NOT_CUDA = "kaionb: argument 'device' expected a CUDA device ('cuda', 'cuda:N' or an ordinal), got "


@pytest.mark.parametrize("spec", ["cpu", "cuda:x", "cuda:-1", "CUDA:1", " cuda:1", "cuda:1:2",
                                  "gpu:0", "", device("cpu"), device("cuda:x")], ids=repr)
def test_device_ordinal_refuses_other_devices(spec):
    with pytest.raises(ValueError, match="^" + re.escape(NOT_CUDA + repr(str(spec))) + "$"):
        device_ordinal(spec)


def test_device_ordinal_refuses_a_superscript_digit():
    with pytest.raises(ValueError, match="^" + re.escape(NOT_CUDA + "'cuda:²'") + "$"):
        device_ordinal("cuda:²")


NOT_A_DEVICE = ("kaionb: argument 'device' expected a device (an ordinal, kaionb.Device, "
                "torch.device or 'cuda:N'), got ")


@pytest.mark.parametrize("spec", [True, False, np.True_, 1.0, np.float32(1), 1 + 0j, b"cuda:1",
                                  [1], object(), HasDeviceId(True), HasId(1.0)], ids=repr)
def test_device_ordinal_refuses_non_devices(spec):
    kind = type(spec).__name__  # bool and np.bool_, float, ..., HasDeviceId (a bool id)
    with pytest.raises(TypeError, match="^" + re.escape(NOT_A_DEVICE + kind) + "$"):
        device_ordinal(spec)


@pytest.mark.parametrize("spec, got", [(-1, -1), (np.int64(-3), -3), (HasDeviceId(-1), -1),
                                       (HasId(-2), -2)], ids=repr)
def test_device_ordinal_refuses_negative_ordinals(spec, got):
    with pytest.raises(ValueError, match=r"^kaionb: argument 'device' expected a device ordinal "
                                         rf"from 0 to \d+ \(\d+ GPUs? visible\), got {got}$"):
        device_ordinal(spec)


def test_negative_ordinal_message_counts_the_gpus():
    with pytest.raises(ValueError, match=rf"\({COUNT} GPUs? visible\), got -1$"):
        device_ordinal(-1)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU case (a GPU is visible here)")
def test_without_a_gpu_positive_ordinals_are_not_range_checked():
    assert kaionb.device_count() == 0
    assert device_ordinal(7) == 7 and device_ordinal("cuda:9") == 9
    assert kaionb.device(3).ordinal == 3  # parsed; entering it needs a GPU


# Each public function that takes a device names itself and its argument in the error.


def named(fn, arg, call, *marks):
    return pytest.param(fn, arg, call, marks=marks, id=fn)


WHERE_NAMED = [
    named("kaionb.device", "n", lambda d: kaionb.device(d)),
    named("kaionb.set_device", "n", lambda d: kaionb.set_device(d)),
    named("kaionb.Device", "ordinal", lambda d: kaionb.Device(d)),
    named("empty", "device", lambda d: kaionb.empty((2,), device=d)),
    named("zeros", "device", lambda d: kaionb.zeros((2,), device=d)),
    named("arange", "device", lambda d: kaionb.arange(3, device=d)),
    named("linspace", "device", lambda d: kaionb.linspace(0, 1, 3, device=d)),
    named("asarray", "device", lambda d: kaionb.asarray(np.ones(2), device=d)),
    named("asarray", "device", lambda d: kaionb.asarray(d0((2,)), device=d)),
    named("DeviceArray.to", "device", lambda d: d0((2,)).to(d)),
    named("DeviceArray.to", "device", lambda d: d0((2,)).to_device(d)),  # the same method
    named("full", "device", lambda d: kaionb.full((2,), 1.0, device=d)),
    named("ones", "device", lambda d: kaionb.ones((2,), device=d)),
    named("eye", "device", lambda d: kaionb.eye(2, device=d)),
    named("empty_like", "device", lambda d: kaionb.empty_like(d0((2,)), device=d)),
    named("zeros_like", "device", lambda d: kaionb.zeros_like(d0((2,)), device=d)),
    named("ones_like", "device", lambda d: kaionb.ones_like(d0((2,)), device=d)),
    named("full_like", "device", lambda d: kaionb.full_like(d0((2,)), 1, device=d)),
]


@pytest.mark.parametrize("fn, arg, call", WHERE_NAMED)
def test_bad_device_named_by_the_function(fn, arg, call):
    prefix = re.escape(f"{fn}: argument '{arg}' expected ")
    with pytest.raises(ValueError, match=f"^{prefix}a CUDA device .*, got 'cpu'$"):
        call("cpu")
    with pytest.raises(ValueError, match=rf"^{prefix}a device ordinal from 0 .*, got -1$"):
        call(-1)
    with pytest.raises(TypeError, match=f"^{prefix}a device .*, got float$"):
        call(1.5)


def test_already_there_is_no_copy():
    a0 = d0()
    assert a0.to(0) is a0 and a0.to("cuda:0") is a0 and a0.to_device(HasDeviceId(0)) is a0
    assert kaionb.asarray(a0, device=0) is a0 and kaionb.asarray(a0, device=0, copy=False) is a0


@pytest.mark.skipif(COUNT == 1, reason="device 1 is out of range on a machine with one GPU")
def test_already_on_device_one_is_no_copy():
    a1 = d1()
    assert a1.to(1) is a1 and a1.to(device("cuda:1")) is a1 and a1.to(a1) is a1
    assert kaionb.asarray(a1, device=1) is a1
    assert kaionb.asarray(a1, device="cuda:1", copy=False) is a1
    assert a1.device == a1.device_id == 1 and a1.__dlpack_device__() == (2, 1)


def test_asarray_copy_false_to_another_device_is_refused():
    with pytest.raises(ValueError, match="^" + re.escape(
            "asarray: argument 'device' expected the device of the array (device 1) with "
            "copy=False, got device 0") + "$"):
        kaionb.asarray(d1(), device=0, copy=False)
    with pytest.raises(ValueError, match="^asarray: a host .NumPy. array needs a copy"):
        kaionb.asarray(np.ones(3), device=0, copy=False)


def test_device_zero_context_without_launching():
    # Entering the device that is current already changes nothing (no GPU needed).
    with kaionb.device(0) as n, kaionb.device("cuda") as m, kaionb.device(device("cuda:0")):
        assert n == m == 0 and current_ordinal() == 0
    assert current_ordinal() == 0


def _in_a_thread(fn):
    """``fn()`` on a new thread (whose device state is its own); its exception re-raised."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU case (a GPU is visible here)")
def test_without_a_gpu_entering_another_device_fails_and_changes_nothing():
    def enter():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            with kaionb.device(1):
                pass
        return current_ordinal()

    assert _in_a_thread(enter) == 0


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU case (a GPU is visible here)")
def test_without_a_gpu_a_failed_set_device_changes_nothing():
    def set_3():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            kaionb.set_device(3)
        return current_ordinal()

    assert _in_a_thread(set_3) == 0


# ============================================================================== GPU
# -- helpers ---------------------------------------------------------------------------

def rnd(rng, shape, dtype=F32, **kw):
    return random_array(shape, dtype, rng=rng, **kw)


def _f64(host):
    return host.astype(F64) if host.dtype.kind == "f" else host


def _poisoned(shape, dtype, on):
    """kaionb.testing.poisoned on device ``on``: every element an output must overwrite."""
    return kaionb.full(shape, poison_value(dtype), dtype, device=on)


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _driver_device() -> int:
    """The device of the context current in the driver (what PyTorch and CuPy see)."""
    from cuda.bindings import driver

    err, ordinal = driver.cuCtxGetDevice()
    assert int(err) == 0, err
    return int(ordinal)


class Op(NamedTuple):
    """One op family's case: its inputs (a shape: float32 N(0, 1); (shape, dtype); or a
    function of the rng), the op on device arrays (``out``: a poisoned array or None), its
    float64 reference, the dtype of ``out`` (None: the op allocates), bit-exact or not."""

    inputs: list
    call: Callable
    ref: Callable
    out: object = None
    exact: bool = False


def _draw(rng, spec):
    if callable(spec):
        return spec(rng)
    return rnd(rng, *spec) if isinstance(spec[0], tuple) else rnd(rng, spec)


def SCALE(n):  # noqa: N802  (a per-row or per-column int8 scale)
    return lambda r: r.uniform(1e-4, 1e-3, n).astype(F32)


H = F16
QKV = [((1, 2, 128, 64), H)] * 3
GQA = [((2, 4, 77, 64), H), ((2, 2, 77, 64), H), ((2, 2, 77, 64), H)]
OPS = {
    "add": Op([(77, 129), (129,)], lambda x, y, out: kaionb.add(x, y, out=out), np.add, F32),
    "exp": Op([(33, 65)], lambda x, out: kaionb.exp(x, out=out), np.exp, F32),
    "where": Op([((33, 65), bool), (33, 65), (65,)],
                lambda c, x, y, out: kaionb.where(c, x, y, out=out), np.where, F32, exact=True),
    "sum": Op([(77, 1029)], lambda x, out: kaionb.sum(x, axis=1, out=out), lambda x: x.sum(1), F32),
    "sum all": Op([(77, 1029)], lambda x, out: kaionb.sum(x), np.sum),
    "max": Op([(77, 129)], lambda x, out: kaionb.max(x, axis=0, out=out), lambda x: x.max(0), F32,
              exact=True),
    "matmul f16 77x129x61": Op([((77, 61), H), ((61, 129), H)],
                               lambda a, b, out: kaionb.matmul(a, b, out=out), matmul_ref, H),
    # 8×8 blocks of 128×128 fill an H100: the wgmma kernel and its TMA tensor maps
    "matmul f16 1024x1024x256": Op([((1024, 256), H), ((256, 1024), H)], lambda a, b, out: a @ b,
                                   matmul_ref),
    "matmul_int8": Op([((77, 96), I8), ((96, 129), I8), SCALE(77), SCALE(129), (129,)],
                      lambda a, b, sa, sb, c, out: kaionb.matmul_int8(a, b, (sa, sb), bias=c,
                                                                      out=out),
                      lambda a, b, sa, sb, c: matmul_int8_ref(a, b, (sa, sb), c), F32),
    "matmul_int8 1024x1024x256": Op([((1024, 256), I8), ((256, 1024), I8), SCALE(())],
                                    lambda a, b, s, out: kaionb.matmul_int8(a, b, s, out=out),
                                    matmul_int8_ref, F32),
    "attention": Op(QKV, lambda q, k, v, out: kaionb.attention(q, k, v, out=out),
                    lambda q, k, v: attention_ref(q, k, v)[0], H),
    "attention causal gqa": Op(GQA, lambda q, k, v, out: kaionb.attention(q, k, v, causal=True,
                                                                          out=out),
                               lambda q, k, v: attention_ref(q, k, v, causal=True)[0], H),
    "rms_norm": Op([(37, 1000), (1000,)], lambda x, w, out: kaionb.rms_norm(x, w, out=out),
                   rms_norm_ref, F32),
    "layer_norm f16": Op([((37, 1000), H), ((1000,), H), ((1000,), H)],
                         lambda x, w, b, out: kaionb.layer_norm(x, w, b, out=out),
                         layer_norm_ref, H),
    "softmax": Op([(37, 1000)], lambda x, out: kaionb.softmax(x, out=out), softmax_ref, F32),
    "gelu": Op([(37, 1000)], lambda x, out: kaionb.gelu(x, out=out), gelu_ref, F32),
    "fused_silu_gate": Op([(37, 1000)] * 2, lambda x, g, out: kaionb.fused_silu_gate(x, g, out=out),
                          fused_silu_gate_ref, F32),
    # cos and sin tables [S, R/2] of any values: the kernel and rope_ref take them as given
    "rope": Op([(2, 16, 4, 64), (16, 32), (16, 32)],
               lambda x, c, s, out: kaionb.rope(x, c, s, out=out), rope_ref, F32),
    "concatenate": Op([(7, 33), (7, 5)], lambda a, b, out: kaionb.concatenate([a, b], axis=1),
                      lambda a, b: np.concatenate([a, b], axis=1), exact=True),
    "take": Op([(37, 129), lambda r: r.integers(0, 37, 50)],
               lambda x, i, out: kaionb.take(x, i, axis=0, out=out),
               lambda x, i: np.take(x, i, axis=0), F32, exact=True),
    "getitem mask": Op([(37, 129), ((37, 129), bool)], lambda x, m, out: x[m], lambda x, m: x[m],
                       exact=True),
}


def _run_op(name, where, current, rng):
    """OPS[name] on fresh inputs on device ``where`` with device ``current`` current."""
    case = OPS[name]
    host = [_draw(rng, spec) for spec in case.inputs]
    ref = case.ref(*map(_f64, host))
    args = [kaionb.asarray(h, device=where) for h in host]
    out = None if case.out is None else _poisoned(np.shape(ref), case.out, where)
    with kaionb.device(current):
        got = case.call(*args, out=out)
        assert current_ordinal() == current and _driver_device() == current
    assert out is None or got is out
    assert got.device_id == where, f"{name}: result on device {got.device_id}, inputs on {where}"
    if case.exact:
        np.testing.assert_array_equal(got.get(), ref, err_msg=name)
    else:
        assert_close(got, ref, what=name)


# -- one GPU -----------------------------------------------------------------------------

@gpu
def test_device_context_nesting_restores_state():
    before = current_ordinal()
    with kaionb.device(0) as n:
        assert n == 0
        with kaionb.device("cuda:0"), kaionb.device(kaionb.Device(0)):
            assert current_ordinal() == 0 and kaionb.empty((3,)).device_id == 0
        assert current_ordinal() == 0
    with pytest.raises(KeyError):  # an exception in the block restores too
        with kaionb.device(0):
            raise KeyError("inside")
    assert current_ordinal() == before and _driver_device() == before


SPECS = {"0": lambda: 0, "'cuda:0'": lambda: "cuda:0", "'cuda'": lambda: "cuda",
         "Device(0)": lambda: kaionb.Device(0), "torch-like": lambda: device("cuda:0")}

CREATE = {
    # name: (the call on device d, its NumPy result)
    "asarray": (lambda d: kaionb.asarray(np.arange(12.0).reshape(3, 4), device=d),
                np.arange(12.0).reshape(3, 4)),
    "zeros": (lambda d: kaionb.zeros((3, 5), F32, device=d), np.zeros((3, 5), F32)),
    "full": (lambda d: kaionb.full((4,), 2.5, F16, device=d), np.full(4, 2.5, F16)),
    "ones": (lambda d: kaionb.ones((2, 3), dtype=I32, device=d), np.ones((2, 3), I32)),
    "arange": (lambda d: kaionb.arange(3, 50, 7, device=d), np.arange(3, 50, 7)),
    "linspace": (lambda d: kaionb.linspace(-1.0, 2.0, 13, device=d), np.linspace(-1.0, 2.0, 13)),
    "eye": (lambda d: kaionb.eye(5, 7, k=1, device=d), np.eye(5, 7, k=1)),
}


@gpu
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("name", CREATE)
def test_creation_on_device_zero(name, spec):
    call, expected = CREATE[name]
    got = call(SPECS[spec]())
    assert got.device_id == 0
    np.testing.assert_array_equal(got.get(), expected)
    e = kaionb.empty((2, 3), F32, device=SPECS[spec]())
    assert e.device_id == 0 and e.shape == (2, 3)


@gpu
def test_to_the_same_device_is_no_copy():
    x = kaionb.asarray(rnd(np.random.default_rng(1), (5, 7)))
    assert x.to(0) is x and x.to("cuda:0") is x and x.to_device(kaionb.Device(0)) is x
    assert kaionb.asarray(x, device=0) is x and kaionb.asarray(x, device=0, copy=False) is x


def _out_of_range_message(fn, arg, n):
    visible = f"{n} GPU{'s' if n != 1 else ''} visible"
    return "^" + re.escape(f"{fn}: argument '{arg}' expected a device ordinal from 0 to {n - 1} "
                           f"({visible}), got {n}") + "$"


@gpu
@pytest.mark.parametrize("fn, arg, call", [
    p for p in WHERE_NAMED if not p.marks  # the functions that name themselves
] + [named("empty", "device", lambda d: kaionb.empty((2,), device=f"cuda:{d}")),
     named("zeros", "device", lambda d: kaionb.zeros((2,), device=device(f"cuda:{d}")))])
def test_out_of_range_device_refused_before_anything_runs(fn, arg, call):
    kaionb.zeros((1,))  # a context is current (what the checks below compare with)
    n = kaionb.device_count()
    before = current_ordinal()
    with pytest.raises(ValueError, match=_out_of_range_message(fn, arg, n)):
        call(n)
    assert current_ordinal() == before and _driver_device() == before
    _run_op("rms_norm", before, before, np.random.default_rng(_seed(fn)))  # still usable


@gpu
def test_stream_per_device():
    rng = np.random.default_rng(2)
    host = rnd(rng, (129, 257))
    side = kaionb.Stream()  # a stream of device 0 (current)
    with kaionb.stream(side) as s:
        assert kaionb.current_stream() is s and s.handle == side.handle
        x = kaionb.asarray(host)
        y = kaionb.exp(x)
        assert y.device_id == 0
        got = y.get()  # on the side stream: after the exp
    assert kaionb.current_stream().handle == 0
    assert_close(got, np.exp(_f64(host)), dtype=F32)


@gpu
def test_dlpack_reports_the_device():
    x = kaionb.asarray(rnd(np.random.default_rng(3), (6, 10)))
    assert x.__dlpack_device__() == (2, 0)
    y = kaionb.from_dlpack(x)
    assert y.ptr == x.ptr and y.device_id == 0
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(x)
    assert t.device == torch.device("cuda:0") and t.data_ptr() == x.ptr


# -- two GPUs: ops -----------------------------------------------------------------------

@two_gpus
@pytest.mark.parametrize("where, current", [(1, 0), (0, 1)], ids=["on 1, 0 current",
                                                               "on 0, 1 current"])
@pytest.mark.parametrize("name", OPS)
def test_op_runs_on_its_inputs_device(name, where, current):
    rng = np.random.default_rng(_seed(name, where))
    for _ in range(2):  # the first call records, the second replays (kernels.op.fast_path)
        _run_op(name, where, current, rng)


@two_gpus
@pytest.mark.parametrize("where, current", [(1, 0), (0, 1)])
def test_quantize_roundtrip_on_its_inputs_device(where, current):
    rng = np.random.default_rng(_seed("quantize", where))
    x = rnd(rng, (37, 1000), scale=2.0)
    ref_q, ref_s = quantize_int8_ref(x, 0)
    q, s = _poisoned(x.shape, I8, where), _poisoned(ref_s.shape, F32, where)
    dx = kaionb.asarray(x, device=where)
    with kaionb.device(current):
        got = kaionb.quantize_int8(dx, 0, out=(q, s))
        deq = kaionb.dequantize_int8(q, s, 0, F32, out=_poisoned(x.shape, F32, where))
    assert got[0] is q and got[1] is s and q.device_id == s.device_id == deq.device_id == where
    assert_close(s, ref_s, dtype=F32, what="scale")
    diff = np.abs(q.get().astype(I32) - ref_q.astype(I32))
    assert diff.max() <= 1 and np.count_nonzero(diff) <= 5e-3 * diff.size  # rounding ties
    assert_close(deq, dequantize_int8_ref(q.get(), s.get(), 0), dtype=F32, what="dequantized")


@two_gpus
@pytest.mark.parametrize("where, current", [(1, 0), (0, 1)])
def test_adamw_step_on_its_inputs_device(where, current):
    rng = np.random.default_rng(_seed("adamw", where))
    p, g, m = (rnd(rng, (4099,)) for _ in range(3))
    v = np.abs(rnd(rng, (4099,)))
    dp, dg, dm, dv = (kaionb.asarray(h, device=where) for h in (p, g, m, v))
    copy = _poisoned((4099,), F16, where)
    kw = dict(lr=1e-2, weight_decay=0.1, step=3)
    with kaionb.device(current):
        assert kaionb.adamw_step(dp, dg, dm, dv, model_param=copy, **kw) is None
    for name, got, ref in zip(("param", "m", "v"), (dp, dm, dv), adamw_ref(p, g, m, v, **kw)):
        assert got.device_id == where
        assert_close(got, ref, dtype=F32, what=name)
    np.testing.assert_array_equal(copy.get(), dp.get().astype(F16))


@two_gpus
@pytest.mark.parametrize("where, current", [(1, 0), (0, 1)])
def test_indexing_on_its_inputs_device(where, current):
    rng = np.random.default_rng(_seed("index", where))
    host = rnd(rng, (37, 129))
    rows = rng.permutation(37)[:10]  # distinct: a scatter's result is then defined
    values = rnd(rng, (10, 129))
    x = kaionb.asarray(host, device=where)
    with kaionb.device(current):
        picked = x[kaionb.asarray(rows, device=where)]
        from_host = x[rows]  # host indices travel to x's device
        x[kaionb.asarray(rows, device=where)] = kaionb.asarray(values, device=where)
        x[:, ::3] = 2.5
    expect = host.copy()
    expect[rows] = values
    expect[:, ::3] = 2.5
    for got, ref in ((picked, host[rows]), (from_host, host[rows]), (x, expect)):
        assert got.device_id == where
        np.testing.assert_array_equal(got.get(), ref)


@two_gpus
@pytest.mark.parametrize("where, current", [(1, 0), (0, 1)])
def test_random_draws_into_out_on_another_device(where, current):
    out = _poisoned((1000,), F32, where)
    ints = _poisoned((1000,), I32, where)
    with kaionb.device(current):
        assert kaionb.random.default_rng(7).standard_normal((1000,), F32, out=out) is out
        assert kaionb.random.default_rng(8).integers(-5, 6, (1000,), I32, out=ints) is ints
        with kaionb.device(where):
            drawn = kaionb.random.default_rng(9).random((1000,), F32)  # on the current device
    assert out.device_id == ints.device_id == drawn.device_id == where
    # The same seed gives the same numbers on every device.
    other = 1 - where
    with kaionb.device(other):
        same = kaionb.random.default_rng(7).standard_normal((1000,), F32)
    assert same.device_id == other
    np.testing.assert_array_equal(out.get(), same.get())
    z, k, u = out.get(), ints.get(), drawn.get()
    assert abs(z.mean()) < 0.15 and 0.85 < z.std() < 1.15
    assert k.min() >= -5 and k.max() <= 5 and len(np.unique(k)) == 11
    assert u.min() >= 0 and u.max() < 1 and 0.4 < u.mean() < 0.6


@two_gpus
def test_arrays_on_two_real_devices_are_refused():
    rng = np.random.default_rng(4)
    x0 = kaionb.asarray(rnd(rng, (33, 65)), device=0)
    x1 = kaionb.asarray(rnd(rng, (33, 65)), device=1)
    with pytest.raises(ValueError, match=mixed_message("add", "x2", "x1")):
        kaionb.add(x0, x1)
    with pytest.raises(ValueError, match=mixed_message("rms_norm", "out", None, 1, 0)):
        kaionb.rms_norm(x1, kaionb.asarray(rnd(rng, (65,)), device=1), out=x0)
    assert current_ordinal() == 0 and _driver_device() == 0
    assert_close(kaionb.add(x1, x1), 2 * _f64(x1.get()), dtype=F32)


# -- two GPUs: creation, transfers, interop ----------------------------------------------

@two_gpus
@pytest.mark.parametrize("name", CREATE)
def test_creation_on_device_one(name):
    call, expected = CREATE[name]
    for spec in (1, "cuda:1", kaionb.Device(1), device("cuda:1")):
        got = call(spec)
        assert got.device_id == 1 and current_ordinal() == 0
        np.testing.assert_array_equal(got.get(), expected)


@two_gpus
def test_like_functions_keep_the_inputs_device():
    x1 = kaionb.asarray(rnd(np.random.default_rng(5), (4, 6)), device=1)
    for got, value in ((kaionb.empty_like(x1), None), (kaionb.zeros_like(x1), 0.0),
                       (kaionb.ones_like(x1), 1.0), (kaionb.full_like(x1, 3.5), 3.5)):
        assert got.device_id == 1 and got.shape == x1.shape and got.dtype == x1.dtype
        if value is not None:
            assert (got.get() == value).all()
    assert kaionb.full_like(x1, 2.0, device=0).device_id == 0


VIEWS = {"strided": lambda a: a[::2, 1::3], "transposed": lambda a: a.T,
         "reversed": lambda a: a[::-1, 5:]}


@two_gpus
@pytest.mark.parametrize("src, dst", [(0, 1), (1, 0)])
@pytest.mark.parametrize("view", VIEWS)
def test_to_copies_a_view_between_devices(src, dst, view):
    host = rnd(np.random.default_rng(_seed(view, src)), (37, 129))
    v = VIEWS[view](kaionb.asarray(host, device=src))
    got = v.to(dst)
    assert got.device_id == dst and got.is_c_contiguous and v.device_id == src
    np.testing.assert_array_equal(got.get(), VIEWS[view](host))
    back = got.to_device(src)
    assert back.device_id == src
    np.testing.assert_array_equal(back.get(), VIEWS[view](host))
    assert v.to(src) is v


@two_gpus
def test_asarray_to_device_one():
    host = rnd(np.random.default_rng(6), (33, 65))
    a1 = kaionb.asarray(host, device=1)
    a0 = kaionb.asarray(host)
    b1 = kaionb.asarray(a0, device="cuda:1")
    c1 = kaionb.asarray(a0, F16, device=1)
    assert (a1.device_id, a0.device_id, b1.device_id, c1.device_id) == (1, 0, 1, 1)
    assert c1.dtype == F16 and kaionb.asarray(a1, device=1) is a1
    for got, ref in ((a1, host), (b1, host), (c1, host.astype(F16))):
        np.testing.assert_array_equal(got.get(), ref)
    with pytest.raises(ValueError, match=re.escape("(device 0) with copy=False, got device 1")):
        kaionb.asarray(a0, device=1, copy=False)


@two_gpus
def test_torch_tensors_on_device_one():
    torch = pytest.importorskip("torch")
    host = rnd(np.random.default_rng(7), (33, 65))
    t = torch.from_numpy(host).to("cuda:1")
    k = kaionb.asarray(t)
    assert k.ptr == t.data_ptr() and k.device_id == 1  # zero-copy
    y = kaionb.exp(t)  # runs on the tensor's device, whatever torch's current one is
    assert y.device_id == 1 and torch.cuda.current_device() == 0
    assert_close(y, np.exp(_f64(host)), dtype=F32)
    back = torch.from_dlpack(y)
    assert back.device == torch.device("cuda:1") and back.data_ptr() == y.ptr
    np.testing.assert_array_equal(back.cpu().numpy(), y.get())
    w0 = kaionb.asarray(rnd(np.random.default_rng(8), (65,)), device=0)
    with pytest.raises(ValueError, match=mixed_message("rms_norm", "weight", "x", 1, 0)):
        kaionb.rms_norm(t, w0)
    assert kaionb.empty((2,), device=torch.device("cuda:1")).device_id == 1
    assert y.to(torch.device("cuda:0")).device_id == 0


@two_gpus
def test_cupy_arrays_on_device_one():
    cp = pytest.importorskip("cupy")
    host = rnd(np.random.default_rng(11), (33, 65))
    with cp.cuda.Device(1):
        c = cp.asarray(host)
    k = kaionb.asarray(c)
    assert k.ptr == c.data.ptr and k.device_id == 1  # zero-copy
    y = kaionb.exp(c)
    assert y.device_id == 1 and cp.cuda.runtime.getDevice() == 0
    assert_close(y, np.exp(_f64(host)), dtype=F32)
    with cp.cuda.Device(1):  # CuPy imports memory of its current device without a copy
        back = cp.asarray(y)  # __cuda_array_interface__
        assert back.data.ptr == y.ptr and back.device.id == 1
        np.testing.assert_array_equal(cp.asnumpy(back), y.get())
    assert kaionb.zeros((2,), device=cp.cuda.Device(1)).device_id == 1


# -- two GPUs: the current device, threads, kernels loaded per device ---------------------

@two_gpus
def test_device_one_context():
    host = rnd(np.random.default_rng(9), (5, 7))
    with kaionb.device(1) as n:
        assert n == 1 and current_ordinal() == 1 and _driver_device() == 1
        made = [kaionb.empty((4,)), kaionb.zeros((2,)), kaionb.asarray(host), kaionb.arange(5),
                kaionb.random.default_rng(1).standard_normal((8,), F32)]
        assert [a.device_id for a in made] == [1] * 5
        np.testing.assert_array_equal(made[2].get(), host)
        with kaionb.device(0):
            assert kaionb.empty((1,)).device_id == 0 and _driver_device() == 0
        assert current_ordinal() == 1 and _driver_device() == 1
    assert current_ordinal() == 0 and _driver_device() == 0
    assert kaionb.empty((1,)).device_id == 0


@two_gpus
def test_set_device_inside_a_stream_block_keeps_each_devices_stream():
    def body():
        outer, inner = kaionb.Stream(), kaionb.Stream()  # device 0's
        with kaionb.stream(outer):
            with kaionb.stream(inner):
                kaionb.set_device(1)
            on_1 = kaionb.current_stream().handle  # device 1's: still its default
            kaionb.set_device(0)
            on_0 = kaionb.current_stream().handle  # device 0's: back to outer
        return on_1, on_0, outer.handle

    on_1, on_0, outer = _in_a_thread(body)
    assert on_1 == 0 and on_0 == outer


@two_gpus
def test_set_device_to_another_device_is_refused_during_a_capture():
    def body():
        with pytest.raises(RuntimeError, match="^kaionb.set_device: a kaionb.graph"):
            with kaionb.graph():
                kaionb.set_device(1)
        return current_ordinal()

    assert _in_a_thread(body) == 0


@two_gpus
def test_set_device_is_per_thread():
    def on_1():
        kaionb.set_device(1)
        return current_ordinal(), kaionb.zeros((3,)).device_id

    assert _in_a_thread(on_1) == (1, 1)
    assert current_ordinal() == 0 and kaionb.zeros((3,)).device_id == 0


# The first call in a new thread (kaionb running on another thread already).
FIRST_CALLS = {"empty": lambda: kaionb.empty((2,)), "zeros": lambda: kaionb.zeros((2,)),
               "asarray": lambda: kaionb.asarray(np.ones(2)), "arange": lambda: kaionb.arange(3)}


@two_gpus
@pytest.mark.parametrize("first", FIRST_CALLS)
def test_a_new_thread_adopts_the_drivers_current_device(first):
    # As after torch.cuda.set_device(1) or cupy.cuda.Device(1).use() on that thread.
    from kaionb._device import _primary_context

    kaionb.zeros((1,))  # kaionb is running on this thread already (several GPUs known)

    def fresh():
        from cuda.bindings import driver

        (err,) = driver.cuCtxSetCurrent(_primary_context(1))
        assert int(err) == 0, err
        return FIRST_CALLS[first]().device_id, current_ordinal()

    assert _in_a_thread(fresh) == (1, 1)


@two_gpus
@pytest.mark.parametrize("current", [0, 1])
def test_backward_of_outputs_on_device_one(current):
    rng = np.random.default_rng(12)
    a, b = rnd(rng, (33, 65)), rnd(rng, (65, 17))
    a1, b1 = kaionb.asarray(a, device=1), kaionb.asarray(b, device=1)
    a1.requires_grad = b1.requires_grad = True
    with kaionb.grad.Tape() as tape:
        y = kaionb.matmul(a1, b1)
    with kaionb.device(current):
        tape.backward(y)  # L = sum(a @ b)
    ones = np.ones((33, 17))
    assert a1.grad.device_id == b1.grad.device_id == 1
    assert_close(a1.grad, ones @ _f64(b).T, dtype=F32, what="grad a")
    assert_close(b1.grad, _f64(a).T @ ones, dtype=F32, what="grad b")


@two_gpus
@pytest.mark.parametrize("current", [0, 1])
def test_graph_of_an_op_on_device_one(current):
    """A graph captures one device: an op on another device's arrays inside the capture
    is refused before it runs (it would run at once, outside the graph)."""
    rng = np.random.default_rng(14)
    x1 = kaionb.asarray(rnd(rng, (64, 129)), device=1)
    with kaionb.device(current):
        try:
            with kaionb.graph() as g:
                y = kaionb.exp(x1)
        except RuntimeError as exc:
            assert current != 1 and str(exc) == ("kaionb.graph: an op on device 1 inside a "
                                                 "capture on device 0; a graph captures one "
                                                 "device's work")
            return
        assert current == 1
        new = rnd(rng, (64, 129))
        x1[...] = kaionb.asarray(new, device=1)
        g.replay()
        kaionb.current_stream().synchronize()
    assert y.device_id == 1
    assert_close(y, np.exp(_f64(new)), dtype=F32)


@two_gpus
def test_stream_of_each_device():
    rng = np.random.default_rng(10)
    host = rnd(rng, (129, 257))
    with kaionb.device(1):
        s1 = kaionb.Stream()
    with pytest.raises(ValueError, match=re.escape(
            "kaionb.stream: argument 's' expected a stream of the current device's primary "
            "context (device 0), got a stream of device 1")):
        with kaionb.stream(s1):
            pass
    with kaionb.device(1), kaionb.stream(s1):
        y1 = kaionb.exp(kaionb.asarray(host))
        got1 = y1.get()
    s0 = kaionb.Stream()
    with kaionb.stream(s0) as s:  # device 0's stream: an op on device 1 runs on device 1's
        x1 = kaionb.asarray(host, device=1)
        y = kaionb.exp(x1)
        got = y.get()
        assert kaionb.current_stream() is s and current_ordinal() == 0
    assert y1.device_id == y.device_id == 1
    assert_close(got1, np.exp(_f64(host)), dtype=F32)
    assert_close(got, np.exp(_f64(host)), dtype=F32)


@two_gpus
def test_same_op_on_device_0_then_1_then_0():
    # Each device loads its own copy of a kernel (a module is per context).
    for name in ("rms_norm", "matmul f16 1024x1024x256", "attention", "softmax"):
        rng = np.random.default_rng(_seed(name, "0-1-0"))
        for where in (0, 1, 0, 1):
            _run_op(name, where, 0, rng)


@two_gpus
def test_two_threads_on_two_devices_at_once():
    names = ("rms_norm", "matmul f16 77x129x61", "matmul f16 1024x1024x256", "attention")
    start = threading.Barrier(2, timeout=60)

    def work(where):
        rng = np.random.default_rng(_seed("threads", where))
        start.wait()
        for _ in range(5):
            for name in names:
                _run_op(name, where, where, rng)
        return where

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(work, (0, 1))) == [0, 1]  # a thread's exception re-raised here
