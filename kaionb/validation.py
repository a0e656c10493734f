"""Input checks every op runs before it launches anything.

Each check raises TypeError (wrong kind of thing: dtype, not an array) or ValueError (right
kind, wrong value: shape, rank, layout, device) with one message format::

    rms_norm: argument 'weight' expected shape (4096,), got (4095,)

so a user sees which op, which argument, what was expected and what came.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Iterable
from typing import NoReturn

import numpy as np

from ._device import STATE
from .array import DeviceArray, asarray, bfloat16, normalize_dtype


def fail(exc_type, op: str, name: str, expected: str, got) -> NoReturn:
    """Raise ``exc_type`` in the one message format (for checks with no function here)."""
    raise exc_type(f"{op}: argument '{name}' expected {expected}, got {got}")


def as_array(op: str, name: str, x, *, dtypes: Iterable | None = None) -> DeviceArray:
    """``x`` as a DeviceArray (zero-copy for GPU memory, a copy for NumPy input)."""
    if type(x) is DeviceArray:  # hot path: no conversion
        arr = x
    elif x is None:
        fail(TypeError, op, name, "an array", "None")
    else:
        try:
            arr = asarray(x)
        except (TypeError, ValueError) as exc:
            # asarray's reason in the op's format: a TypeError is no array at all, a
            # ValueError memory no kernel reaches (another library's host memory)
            got = f"{type(x).__name__} ({str(exc).removeprefix('asarray: ')})"
            if isinstance(exc, TypeError):
                fail(TypeError, op, name, "an array", got)
            fail(ValueError, op, name, "CUDA device memory", got)
        if arr.device_id != STATE.ordinal:
            # GPU memory whose device the op's device choice could not see (an object with
            # only __cuda_array_interface__ on a machine where that was not asked)
            fail(ValueError, op, name, f"device {STATE.ordinal} (where the op runs)",
                 f"device {arr.device_id}")
    if dtypes is not None:
        check_dtype(op, name, arr, dtypes)
    return arr


@functools.lru_cache(maxsize=256)
def _allowed_dtypes(dtypes: tuple) -> tuple:
    return tuple(normalize_dtype(d) for d in dtypes)


def check_dtype(op: str, name: str, x: DeviceArray, dtypes: Iterable) -> None:
    allowed = _allowed_dtypes(tuple(dtypes))  # ops pass the same few tuples every call
    if x.dtype not in allowed:
        fail(TypeError, op, name, "dtype " + " or ".join(str(d) for d in allowed), x.dtype)


def check_same_dtype(op: str, **arrays: DeviceArray) -> None:
    items = [(n, a) for n, a in arrays.items() if a is not None]
    first_name, first = items[0]
    for n, a in items[1:]:
        if a.dtype != first.dtype:
            fail(TypeError, op, n, f"the dtype of '{first_name}' ({first.dtype})", a.dtype)


def check_ndim(op: str, name: str, x: DeviceArray, ndim: int | tuple[int, int]) -> None:
    lo, hi = (ndim, ndim) if isinstance(ndim, int) else ndim
    if not lo <= x.ndim <= (hi if hi is not None else x.ndim):
        want = f"{lo}" if lo == hi else f"{lo} or more" if hi is None else f"{lo} to {hi}"
        fail(ValueError, op, name, f"{want} dimensions", f"{x.ndim} (shape {x.shape})")


def check_shape(op: str, name: str, x: DeviceArray, shape: tuple) -> None:
    if tuple(x.shape) != tuple(shape):
        fail(ValueError, op, name, f"shape {tuple(shape)}", tuple(x.shape))


def check_same_device(op: str, **arrays: DeviceArray) -> None:
    items = [(n, a) for n, a in arrays.items() if a is not None]
    first_name, first = items[0]
    for n, a in items[1:]:
        if a.device_id != first.device_id:
            fail(ValueError, op, n, f"device {first.device_id} (where '{first_name}' is)",
                  f"device {a.device_id}")


def check_contiguous(op: str, name: str, x: DeviceArray, *, last_axis_only=False) -> None:
    """C-contiguous, or (``last_axis_only``) unit stride along the last axis."""
    if last_axis_only:
        if x.ndim and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
            fail(ValueError, op, name, "a contiguous last axis (stride "
                  f"{x.itemsize} bytes)", f"strides {x.strides}")
    elif not x.is_c_contiguous:
        fail(ValueError, op, name, "a C-contiguous array", f"strides {x.strides} for shape "
              f"{x.shape}")


def check_alignment(op: str, name: str, x: DeviceArray, nbytes: int) -> None:
    """Base pointer and every non-unit stride a multiple of ``nbytes`` (vector loads)."""
    bad_stride = [s for d, s in zip(x.shape[:-1], x.strides[:-1]) if d > 1 and s % nbytes]
    if x.ptr % nbytes or bad_stride:
        fail(ValueError, op, name, f"{nbytes}-byte aligned data and row strides",
              f"pointer 0x{x.ptr:x}, strides {x.strides}")


def as_dtype(op: str, name: str, dtype, allowed, expected: str) -> np.dtype:
    """A dtype argument as one of ``allowed`` (NumPy dtypes); TypeError naming ``name``,
    ``expected`` saying which, for anything else (a dtype kaionb does not store, or not a
    dtype at all)."""
    try:
        dt = normalize_dtype(dtype, op)
    except (TypeError, ValueError):  # not a dtype, or a malformed spec ("f4", -1)
        fail(TypeError, op, name, expected, repr(dtype))
    if dt not in allowed:
        fail(TypeError, op, name, expected, dt)
    return dt


def output_dtype(op: str, dtype, out, allowed, expected: str, default,
                 out_name: str = "out") -> np.dtype:
    """The dtype of an op's result(s): ``dtype`` when given (one of ``allowed``,
    ``expected`` names them), else that of ``out`` — one array or a tuple (its first) —
    whose dtype the caller chose (refused naming ``out_name``), else ``default``."""
    if dtype is not None:
        return as_dtype(op, "dtype", dtype, allowed, expected)
    if isinstance(out, (tuple, list)):
        if not out:
            return default
        dt, what = as_out(op, out[0], f"{out_name}[0]").dtype, f"arrays of dtype {expected}"
    elif out is not None:
        dt, what = as_out(op, out, out_name).dtype, f"dtype {expected}"
    else:
        return default
    if dt not in allowed:
        fail(TypeError, op, out_name, what, dt)
    return dt


def check_real(op: str, name: str, value) -> None:
    """A real number (a bool is not one): TypeError otherwise, before its value is judged.
    NumPy scalars and 0-d arrays of a real dtype count (bfloat16's scalar type is no
    ``numbers.Real``, yet a value read back from a bfloat16 array is one)."""
    if isinstance(value, (bool, np.bool_)):
        fail(TypeError, op, name, "a real number", type(value).__name__)
    if isinstance(value, numbers.Real):
        return
    dt = getattr(value, "dtype", None)
    if not (isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0
            and (dt.kind in "iuf" or dt == bfloat16)):
        fail(TypeError, op, name, "a real number", type(value).__name__)


def check_int(op: str, name: str, value, expected: str = "an int") -> None:
    """An integer (a bool is not one): TypeError otherwise, before its value is judged."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        fail(TypeError, op, name, expected, type(value).__name__)


def check_positive(op: str, name: str, value: float) -> None:
    check_real(op, name, value)
    if not np.isfinite(value) or value <= 0:
        fail(ValueError, op, name, "a finite value > 0", value)


def as_out(op: str, out, name: str = "out") -> DeviceArray:
    """``out=`` as a DeviceArray: device memory, written in place (checked before anything
    reads its shape or dtype)."""
    if type(out) is DeviceArray:
        return out
    # Host memory would be copied to the device: the results would land in a temporary
    # copy that the caller never sees.
    expected = "device memory (a DeviceArray, CuPy or PyTorch CUDA array)"
    if isinstance(out, np.ndarray):
        fail(TypeError, op, name, expected, "a NumPy array (results would land in a "
             "temporary copy)")
    if not (hasattr(out, "__cuda_array_interface__") or hasattr(out, "__dlpack__")):
        fail(TypeError, op, name, expected, type(out).__name__)
    return as_array(op, name, out)


def check_out(op: str, out, shape: tuple, dtype, name: str = "out") -> DeviceArray:
    """``out=``: device memory of exactly this shape and dtype, written in place (the
    rest of the contract — device, layout — is :func:`kaionb.kernels.op.output`'s)."""
    if type(out) is not DeviceArray:
        out = as_out(op, out, name)
    dt = normalize_dtype(dtype, op)
    if out.dtype != dt:
        fail(TypeError, op, name, f"dtype {dt}", out.dtype)
    check_shape(op, name, out, shape)
    return out
