"""Array creation that needs a kernel or a copy: ``arange``, ``linspace`` (one ramp
kernel), ``eye``, ``ones``, ``full_like``, ``concatenate`` / ``stack`` (copies into
slices of one new array).

The ramp writes ``out[i] = start + i * step`` computed in float64 for float outputs (NumPy
computes ``arange`` and ``linspace`` in float64 and rounds once to the output dtype) and in
int64 / uint64 for integer ones (exact for every value the dtype holds); ``linspace``
pins its last element to ``stop`` exactly, as NumPy does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64, int64, uint64

from .._device import device as on_device
from .._device import device_ordinal
from ..array import (
    DeviceArray,
    _axis_index,
    _full,
    _on_device_of,
    _zeros,
    empty,
    normalize_dtype,
)
from ..validation import as_array, check_int, check_real, fail
from .elementwise import THREADS, _grid_stride_blocks, elementwise_fwd
from .helpers.dtypes import encode, storage
from .launch import kernel
from .op import Plan, device_guard, fast_path, run

_RAMP_DTYPES = [np.dtype(t) for t in (np.float64, np.float32, np.float16, "bfloat16",
                                      np.int64, np.uint64, np.int32, np.uint32, np.int16,
                                      np.uint16, np.int8, np.uint8)]


def _make_ramp(dt: np.dtype):
    enc = encode(dt)
    T = "uint64" if dt.kind == "u" else "int64" if dt.kind == "i" else "float64"
    as_compute = {"uint64": uint64, "int64": int64, "float64": float64}[T]

    @kernel([f"void({storage(dt)}[::1], {T}, {T}, boolean, {T})"],
            name=f"_ramp_{dt.name}_kernel")
    def _ramp_kernel(out, start, step, pin_last, last):
        n = out.size
        i = cuda.grid(1)
        while i < n:
            value = start + as_compute(i) * step
            if pin_last and i == n - 1:
                value = last
            out[i] = enc(value)
            i += cuda.gridsize(1)

    return _ramp_kernel


_RAMP_KERNELS = {dt: _make_ramp(dt) for dt in _RAMP_DTYPES}


@fast_path
def ramp_fwd(op, n, start, step, dtype, last=None):
    """A new 1-D array of ``n`` elements ``start + i * step`` in ``dtype`` (the last one
    ``last`` when given), for ``op`` (arange or linspace: named in refusals)."""
    dt = normalize_dtype(dtype, op)
    if dt == np.bool_:
        fail(TypeError, op, "dtype", "a numeric dtype", dt)
    out = empty((n,), dt)
    return run(_ramp_launch, dt, start, step, last, out=out)


def _ramp_launch(dt, start, step, last, out):
    cast = float if dt.kind not in "iu" else int
    Plan.of(_RAMP_KERNELS[dt], (_grid_stride_blocks(out.size),), (THREADS,)).launch(
        out, cast(start), cast(step), last is not None, cast(0 if last is None else last))


def arange(start, /, stop=None, step=1, *, dtype=None, device=None) -> DeviceArray:
    """``np.arange``: ``start, start + step, ...`` below ``stop`` (one argument: ``stop``
    from 0). The dtype is NumPy's (int64 for integers, float64 otherwise) unless given."""
    if device is not None:
        with on_device(device_ordinal(device, "arange")):
            return arange(start, stop, step, dtype=dtype)
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        check_real("arange", name, v)
        if not math.isfinite(v):  # no length to count (NumPy: a bare OverflowError)
            fail(ValueError, "arange", name, "a finite number", v)
    if step == 0:
        fail(ValueError, "arange", "step", "a nonzero number", step)
    dt = np.arange(start, start + step, step).dtype if dtype is None else \
        normalize_dtype(dtype, "arange")
    n = max(0, math.ceil((stop - start) / step))
    return ramp_fwd("arange", n, start, step, dt)


def linspace(start, stop, /, num, *, dtype=None, endpoint=True, device=None) -> DeviceArray:
    """``np.linspace``: ``num`` evenly spaced values from ``start`` to ``stop`` (included
    when ``endpoint``), float64 unless ``dtype`` is given."""
    if device is not None:
        with on_device(device_ordinal(device, "linspace")):
            return linspace(start, stop, num, dtype=dtype, endpoint=endpoint)
    check_real("linspace", "start", start)
    check_real("linspace", "stop", stop)
    check_int("linspace", "num", num, "an integer >= 0")
    if num < 0:
        fail(ValueError, "linspace", "num", "an integer >= 0", num)
    dt = np.dtype(np.float64) if dtype is None else normalize_dtype(dtype, "linspace")
    div = num - 1 if endpoint else num
    step = (stop - start) / div if div > 0 else 0.0
    if dt.kind in "iu":  # NumPy computes in float64, then truncates: do the same here
        values = empty((num,), np.float64)
        if num:
            _ramp_launch(np.dtype(np.float64), float(start), step,
                         float(stop) if endpoint and num > 1 else None, values)
        return values.astype(dt)
    return ramp_fwd("linspace", num, float(start), step, dt,
                    float(stop) if endpoint and num > 1 else None)


def ones(shape, *, dtype=None, device=None) -> DeviceArray:
    """A new array of ones (float64 unless ``dtype`` is given) on ``device`` (default:
    the current one)."""
    return _full("ones", shape, 1, np.float64 if dtype is None else dtype, device)


def ones_like(x, /, *, dtype=None, device=None) -> DeviceArray:
    """Ones of ``x``'s shape, dtype and device (unless ``dtype`` / ``device`` say)."""
    return _full("ones_like", x.shape, 1, x.dtype if dtype is None else dtype,
                 x.device_id if device is None else device)


def full_like(x, /, fill_value, *, dtype=None, device=None) -> DeviceArray:
    """``fill_value`` in ``x``'s shape, dtype and device (unless ``dtype`` / ``device``
    say)."""
    return _full("full_like", x.shape, fill_value, x.dtype if dtype is None else dtype,
                 x.device_id if device is None else device)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None) -> DeviceArray:
    """A 2-D array with ones on diagonal ``k`` and zeros elsewhere (float64 unless
    ``dtype`` is given) on ``device`` (default: the current one)."""
    n_cols = n_rows if n_cols is None else n_cols
    out = _on_device_of(device, "eye", _zeros, (n_rows, n_cols),
                        np.float64 if dtype is None else dtype, "eye")
    length = max(0, min(n_rows + min(k, 0), n_cols - max(k, 0)))
    if length:
        step = (n_cols + 1) * out.itemsize
        offset = (max(k, 0) + max(-k, 0) * n_cols) * out.itemsize
        out._view((length,), (step,), offset).fill(1)
    return out


def _arrays(op: str, arrays) -> list:
    """concatenate's / stack's ``arrays``: a non-empty list or tuple, each an array."""
    if not isinstance(arrays, (list, tuple)):
        fail(TypeError, op, "arrays", "a list or tuple of arrays", type(arrays).__name__)
    if not arrays:
        fail(ValueError, op, "arrays", "a non-empty sequence of arrays", "an empty one")
    return [as_array(op, f"arrays[{i}]", a) for i, a in enumerate(arrays)]


@device_guard
def concatenate(arrays, /, *, axis=0) -> DeviceArray:
    """The arrays joined along an existing ``axis`` (None: flattened first); the result
    dtype is NumPy's ``result_type`` of theirs, on their device."""
    op = "concatenate"
    arrays = _arrays(op, arrays)
    if axis is None:
        arrays, axis = [a.reshape(-1) for a in arrays], 0
    ndim = arrays[0].ndim
    if ndim == 0:
        raise ValueError(f"{op}: zero-dimensional arrays cannot be concatenated")
    axis = _axis_index(op, axis, ndim)
    for i, a in enumerate(arrays):
        if a.ndim != ndim:
            raise ValueError(f"{op}: all the input arrays must have same number of "
                             f"dimensions, but the array at index 0 has {ndim} dimension(s) "
                             f"and the array at index {i} has {a.ndim} dimension(s)")
        for d in range(ndim):
            if d != axis and a.shape[d] != arrays[0].shape[d]:
                raise ValueError(f"{op}: all the input array dimensions except for the "
                                 f"concatenation axis must match exactly, but along dimension "
                                 f"{d}, the array at index 0 has size {arrays[0].shape[d]} "
                                 f"and the array at index {i} has size {a.shape[d]}")
    dt = np.result_type(*(a.dtype for a in arrays))
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    out = empty(tuple(shape), dt)
    at = 0
    for a in arrays:
        if a.size:
            index = (slice(None),) * axis + (slice(at, at + a.shape[axis]),)
            elementwise_fwd("copy", a, out=out[index], dtype=dt)
        at += a.shape[axis]
    return out


@device_guard
def stack(arrays, /, *, axis=0) -> DeviceArray:
    """The arrays (all of one shape) joined along a new ``axis``."""
    op = "stack"
    arrays = _arrays(op, arrays)
    shape = arrays[0].shape
    if any(a.shape != shape for a in arrays):
        raise ValueError(f"{op}: all input arrays must have the same shape, got "
                         f"{[a.shape for a in arrays]}")
    axis = _axis_index(op, axis, len(shape) + 1)
    expanded = []
    for a in arrays:
        new_shape = shape[:axis] + (1,) + shape[axis:]
        expanded.append(a._view(new_shape, a.strides[:axis] + (0,) + a.strides[axis:]))
    return concatenate(expanded, axis=axis)
