"""DeviceArray logic that needs no GPU: shapes, dtypes, views, streams, validation messages.

Views are pure metadata, so they are checked here on arrays with a made-up pointer and the
same indexing applied to a NumPy array of the same layout (byte offsets compared)."""

import numpy as np
import pytest

import kaionb
from kaionb._device import Stream, stream_handle
from kaionb.array import DeviceArray, _contiguous_strides, bfloat16, normalize_dtype, normalize_shape
from kaionb.kernels.elementwise import _collapse
from kaionb.kernels.launch import _scalar_format
from kaionb import validation as v

BASE = 0x10_0000


def fake(shape, dtype=np.float32, strides=None):
    dt = np.dtype(dtype)
    return DeviceArray(tuple(shape), dt, strides or _contiguous_strides(shape, dt.itemsize),
                       BASE, None)


def host_twin(shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def offset(view_np, base_np):
    return view_np.__array_interface__["data"][0] - base_np.__array_interface__["data"][0]


@pytest.mark.parametrize("key", [
    0, -1, slice(1, 5), slice(None, None, 2), slice(5, 1, -1), (Ellipsis, 3),
    (slice(None), None, 2), (1, slice(2, 9, 3)), (None, Ellipsis), slice(7, 3),
    (slice(None, None, -2), slice(1, None)),
])
def test_getitem_matches_numpy(key):
    ref = host_twin((7, 10))
    view_np = ref[key]
    view = fake((7, 10))[key]
    assert view.shape == view_np.shape
    assert view.strides == view_np.strides
    if view_np.size:
        assert view.ptr - BASE == offset(view_np, ref)


@pytest.mark.parametrize("key, exc", [
    (7, IndexError), (-8, IndexError), ((0, 0, 0), IndexError), ((Ellipsis, Ellipsis), IndexError),
    (1.5, IndexError),
])
def test_getitem_rejects(key, exc):
    with pytest.raises(exc):
        fake((7, 10))[key]


def test_transpose_and_T():
    a = fake((2, 3, 4))
    ref = host_twin((2, 3, 4))
    assert a.T.shape == (4, 3, 2) and a.T.strides == ref.T.strides
    t = a.transpose(1, 0, 2)
    assert t.shape == (3, 2, 4) and t.strides == ref.transpose(1, 0, 2).strides
    assert not t.is_c_contiguous and a.is_c_contiguous
    with pytest.raises(ValueError, match="permutation"):
        a.transpose(0, 0, 1)


def test_reshape_views_and_errors():
    a = fake((4, 6))
    r = a.reshape(2, -1, 3)
    assert r.shape == (2, 4, 3) and r.ptr == a.ptr and r.is_c_contiguous
    assert a.reshape((24,)).shape == (24,)
    with pytest.raises(ValueError, match="cannot reshape array of size 24 into shape"):
        a.reshape(5, 5)
    with pytest.raises(ValueError, match="only one dimension"):
        a.reshape(-1, -1)
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(-1, 7)


def test_view_same_itemsize_only():
    a = fake((3,), bfloat16)
    assert a.view(np.uint16).dtype == np.uint16
    with pytest.raises(ValueError, match="itemsize"):
        a.view(np.float32)


@pytest.mark.parametrize("bad", [np.complex64, object, "U4", np.float128 if hasattr(np, "float128") else "S3"])
def test_unsupported_dtypes(bad):
    with pytest.raises(TypeError, match="not supported"):
        normalize_dtype(bad)


@pytest.mark.parametrize("shape, exc", [((-1, 2), ValueError), ((2.0, 3), TypeError),
                                        ("ab", TypeError), ((True,), TypeError), (None, TypeError)])
def test_bad_shapes(shape, exc):
    with pytest.raises(exc):
        normalize_shape(shape, "empty")


def test_bad_shape_raises_before_touching_the_gpu():
    # Raised by the argument check, which runs before any allocation (works without a GPU).
    with pytest.raises(ValueError, match="empty: shape entries must be >= 0"):
        kaionb.empty((3, -2))
    with pytest.raises(TypeError, match="is not supported"):
        kaionb.empty((3,), np.complex128)


def test_implicit_host_conversion_refused():
    with pytest.raises(TypeError, match=r"call \.get\(\)"):
        np.asarray(fake((3,)))


def test_cuda_array_interface_and_dlpack_device():
    a = fake((4, 5))[:, 1:3]
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (4, 2) and cai["typestr"] == "<f4"
    assert cai["data"] == (BASE + 4, False) and cai["strides"] == (20, 4)
    assert cai["stream"] == 1  # legacy default stream, CAI's encoding
    assert a.__dlpack_device__() == (2, 0)
    assert not hasattr(fake((2,), bfloat16), "__cuda_array_interface__")


class _ForeignDevice:
    """A DLPack producer on a ROCm device."""

    def __dlpack_device__(self):
        return (10, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("must not be consumed")


class _HostTensor:
    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("must not be consumed without copy=True")


def test_foreign_device_kinds_are_refused():
    with pytest.raises(ValueError, match="ROCm device; kaionb needs CUDA device memory"):
        kaionb.asarray(_ForeignDevice())
    with pytest.raises(ValueError, match="host memory .* copy=True"):
        kaionb.asarray(_HostTensor())
    with pytest.raises(ValueError, match="copy=False"):
        kaionb.asarray(np.ones(3), copy=False)
    with pytest.raises(TypeError, match="__dlpack__"):
        kaionb.from_dlpack(np.ones(3).tolist())


def test_stream_handles_from_every_library_shape():
    class TorchLike:
        cuda_stream = 0x1234

    class CupyLike:
        ptr = 0x2345

    class NumbaLike:
        class handle:
            value = 0x3456

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x4567)

    assert stream_handle(TorchLike()) == 0x1234
    assert stream_handle(CupyLike()) == 0x2345
    assert stream_handle(NumbaLike()) == 0x3456
    assert stream_handle(Protocol()) == 0x4567
    assert stream_handle(None) == 0 and stream_handle(77) == 77
    with pytest.raises(TypeError, match="expected a kaionb/CuPy/PyTorch"):
        stream_handle("default")
    with pytest.raises(ValueError):
        stream_handle(-3)


def test_stream_context_nests_and_restores():
    # CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: real handles in every context, so the
    # stream's context check needs no GPU.
    outer, inner = Stream(_handle=1), Stream(_handle=2)
    assert kaionb.current_stream().handle == 0
    with kaionb.stream(outer):
        assert kaionb.current_stream() is outer
        with kaionb.stream(2):
            assert kaionb.current_stream().handle == inner.handle
        assert kaionb.current_stream() is outer
    assert kaionb.current_stream().handle == 0


def test_collapse_merges_contiguous_axes():
    shape, (s1, s2) = _collapse((2, 3, 4), (48, 16, 4), (48, 16, 4))
    assert shape == [24] and s1 == [4] and s2 == [4]
    shape, (s1, s2) = _collapse((3, 4), (4, 12), (16, 4))  # transposed source
    assert shape == [3, 4] and s1 == [4, 12]
    assert _collapse((1, 5, 1), (20, 4, 4), (20, 4, 4))[0] == [5]


def test_scalar_parameter_slots():
    from numba import types

    import struct

    # Every parameter takes one 8-byte slot, its value at the slot's start (little-endian).
    for ty, value in [(types.int32, -7), (types.float32, 1.5), (types.float64, 2.25),
                      (types.uint64, 2**63), (types.boolean, True), (types.int8, -2)]:
        fmt = "<" + _scalar_format(ty, "k")
        assert struct.calcsize(fmt) == 8
        packed = struct.pack(fmt, value)
        assert struct.unpack_from("<" + fmt[1], packed)[0] == value
    with pytest.raises(TypeError, match="unsupported argument type"):
        _scalar_format(types.complex64, "k")


def test_validation_messages_name_op_argument_expected_and_got():
    x = fake((4, 8))
    with pytest.raises(TypeError, match=r"rms_norm: argument 'x' expected dtype float16 or bfloat16, got float32"):
        v.check_dtype("rms_norm", "x", x, (np.float16, bfloat16))
    with pytest.raises(ValueError, match=r"rms_norm: argument 'weight' expected shape \(8,\), got \(4, 8\)"):
        v.check_shape("rms_norm", "weight", x, (8,))
    with pytest.raises(ValueError, match=r"argument 'a' expected 3 dimensions, got 2"):
        v.check_ndim("matmul", "a", x, 3)
    with pytest.raises(ValueError, match="a C-contiguous array"):
        v.check_contiguous("op", "x", x.T)
    v.check_contiguous("op", "x", x[:, :4], last_axis_only=True)
    with pytest.raises(ValueError, match="contiguous last axis"):
        v.check_contiguous("op", "x", x[:, ::2], last_axis_only=True)
    with pytest.raises(ValueError, match="16-byte aligned"):
        v.check_alignment("op", "x", x[:, 1:], 16)
    with pytest.raises(ValueError, match="a finite value > 0"):
        v.check_positive("rms_norm", "eps", 0.0)
    with pytest.raises(TypeError, match="expected dtype float16, got float32"):
        v.check_out("op", x, (4, 8), np.float16)
    with pytest.raises(TypeError, match="a NumPy array"):
        v.check_out("op", np.zeros((4, 8), np.float32), (4, 8), np.float32)
    with pytest.raises(TypeError, match=r"argument 'b' expected the dtype of 'a' \(float32\)"):
        v.check_same_dtype("op", a=x, b=fake((2,), np.float16))
    other = DeviceArray((2,), np.dtype(np.float32), (4,), BASE, None, device_id=1)
    with pytest.raises(ValueError, match="expected device 0"):
        v.check_same_device("op", a=x, b=other)
