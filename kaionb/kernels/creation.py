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
    """Return evenly spaced values ``start, start + step, ...`` below ``stop``, as ``np.arange``.

    With one argument it is ``stop``, counting from 0. The dtype is NumPy's for
    ``start`` and ``step`` (int64 for integers, float64 otherwise) unless given. Values
    are computed in float64 (integer dtypes: exactly in int64 / uint64) and rounded once
    to the dtype, as NumPy does.

    Parameters
    ----------
    start : int or float
        The first value, or ``stop`` when it is the only argument.
    stop : int or float, optional
        The end (excluded).
    step : int or float, optional
        The spacing (nonzero).
    dtype : dtype, optional
        A numeric dtype kaionb stores (not bool).
    device : int, kaionb.Device, torch.device or str, optional
        The GPU: an ordinal, a ``kaionb.Device``, a ``torch.device`` or ``"cuda:N"``.

    Returns
    -------
    DeviceArray
        A new 1-D array.

    Raises
    ------
    TypeError
        ``start``, ``stop`` or ``step`` that is not a real number, or a dtype that is not
        numeric or that kaionb does not store.
    ValueError
        A non-finite ``start``, ``stop`` or ``step``, or ``step`` 0.

    Examples
    --------
    >>> kaionb.arange(5).get()
    array([0, 1, 2, 3, 4])
    >>> kaionb.arange(0.0, 1.0, 0.25).get()
    array([0.  , 0.25, 0.5 , 0.75])
    """
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
    """Return ``num`` evenly spaced values from ``start`` to ``stop``, as ``np.linspace``.

    Computed in float64 and rounded once to the dtype (integer dtypes truncate, as
    NumPy's); the last element is ``stop`` exactly when ``endpoint``.

    Parameters
    ----------
    start, stop : int or float
        The first and last values.
    num : int
        How many values (>= 0).
    dtype : dtype, optional
        A numeric dtype kaionb stores; float64 by default.
    endpoint : bool, optional
        Whether ``stop`` is the last value (else it is excluded).
    device : int, kaionb.Device, torch.device or str, optional
        The GPU: an ordinal, a ``kaionb.Device``, a ``torch.device`` or ``"cuda:N"``.

    Returns
    -------
    DeviceArray
        A new 1-D array.

    Raises
    ------
    TypeError
        ``start`` or ``stop`` that is not a real number, ``num`` that is not an int, or a
        dtype that is not numeric or that kaionb does not store.
    ValueError
        A negative ``num``.

    Examples
    --------
    >>> kaionb.linspace(0.0, 1.0, 5).get()
    array([0.  , 0.25, 0.5 , 0.75, 1.  ])
    """
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
    """Return a new C-contiguous array filled with ones.

    Parameters
    ----------
    shape : int or tuple of int
        The shape.
    dtype : dtype, optional
        A dtype kaionb stores; float64 by default, as NumPy's.
    device : int, kaionb.Device, torch.device or str, optional
        The GPU (default: the current one): an ordinal, a ``kaionb.Device``, a
        ``torch.device`` or ``"cuda:N"``.

    Returns
    -------
    DeviceArray
        The new array of ones.

    Raises
    ------
    TypeError
        A shape that is not an int or a tuple of ints, a dtype kaionb does not store, or a
        ``device`` that names no device.
    ValueError
        A negative shape entry, or an ordinal no GPU has.

    Examples
    --------
    >>> kaionb.ones((2, 2), dtype=np.int8).get()
    array([[1, 1],
           [1, 1]], dtype=int8)
    """
    return _full("ones", shape, 1, np.float64 if dtype is None else dtype, device)


def ones_like(x, /, *, dtype=None, device=None) -> DeviceArray:
    """Return a new array of ones with the shape, dtype and device of ``x``.

    Parameters
    ----------
    x : DeviceArray
        The array whose shape (and dtype, device) to take.
    dtype : dtype, optional
        The dtype instead of ``x``'s.
    device : int, kaionb.Device, torch.device or str, optional
        The GPU instead of ``x``'s.

    Returns
    -------
    DeviceArray
        The new array of ones.

    Raises
    ------
    TypeError
        A dtype kaionb does not store, or a ``device`` that names no device.
    ValueError
        An ordinal no GPU has.

    Examples
    --------
    >>> kaionb.ones_like(kaionb.zeros(3, np.float32)).get()
    array([1., 1., 1.], dtype=float32)
    """
    return _full("ones_like", x.shape, 1, x.dtype if dtype is None else dtype,
                 x.device_id if device is None else device)


def full_like(x, /, fill_value, *, dtype=None, device=None) -> DeviceArray:
    """Return a new array filled with ``fill_value`` with the shape, dtype and device of ``x``.

    Parameters
    ----------
    x : DeviceArray
        The array whose shape (and dtype, device) to take.
    fill_value : scalar
        The value of every element, converted to the dtype.
    dtype : dtype, optional
        The dtype instead of ``x``'s.
    device : int, kaionb.Device, torch.device or str, optional
        The GPU instead of ``x``'s.

    Returns
    -------
    DeviceArray
        The new array.

    Raises
    ------
    TypeError
        A dtype kaionb does not store, or a ``device`` that names no device.
    ValueError
        An ordinal no GPU has.

    Examples
    --------
    >>> kaionb.full_like(kaionb.zeros(3, np.int32), 4).get()
    array([4, 4, 4], dtype=int32)
    """
    return _full("full_like", x.shape, fill_value, x.dtype if dtype is None else dtype,
                 x.device_id if device is None else device)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None) -> DeviceArray:
    """Return a 2-D array with ones on diagonal ``k`` and zeros elsewhere.

    Parameters
    ----------
    n_rows : int
        The number of rows.
    n_cols : int, optional
        The number of columns (default: ``n_rows``).
    k : int, optional
        The diagonal: 0 the main one, > 0 above it, < 0 below it.
    dtype : dtype, optional
        A dtype kaionb stores; float64 by default.
    device : int, kaionb.Device, torch.device or str, optional
        The GPU (default: the current one).

    Returns
    -------
    DeviceArray
        A new C-contiguous [n_rows, n_cols] array.

    Raises
    ------
    TypeError
        A dtype kaionb does not store, or a ``device`` that names no device.
    ValueError
        A negative size, or an ordinal no GPU has.

    Examples
    --------
    >>> kaionb.eye(2).get()
    array([[1., 0.],
           [0., 1.]])
    >>> kaionb.eye(2, 3, k=1, dtype=np.int32).get()
    array([[0, 1, 0],
           [0, 0, 1]], dtype=int32)
    """
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
    """Join arrays along an existing axis.

    The result dtype is NumPy's ``result_type`` of the arrays' dtypes; the result is a
    new C-contiguous array on their device. ``concat`` is the array API's name.

    Parameters
    ----------
    arrays : list or tuple of DeviceArray or array_like
        The arrays, non-empty, of one rank, their shapes equal except along ``axis``.
    axis : int or None, optional
        The axis to join along; None flattens the arrays first.

    Returns
    -------
    DeviceArray
        The joined array.

    Raises
    ------
    TypeError
        ``arrays`` that is not a list or tuple, or an element that is not an array.
    ValueError
        No arrays, 0-d arrays, arrays of different ranks, or shapes that differ off
        ``axis``; arrays on two devices.
    numpy.exceptions.AxisError
        An axis out of range.

    Examples
    --------
    >>> a = kaionb.asarray([[1, 2]])
    >>> kaionb.concatenate([a, a + 2], axis=0).get()
    array([[1, 2],
           [3, 4]])
    """
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
    """Join arrays of one shape along a new axis.

    Parameters
    ----------
    arrays : list or tuple of DeviceArray or array_like
        The arrays, non-empty, all of one shape.
    axis : int, optional
        Where the new axis is in the result's axes.

    Returns
    -------
    DeviceArray
        A new array with one more dimension; dtype NumPy's ``result_type`` of theirs.

    Raises
    ------
    TypeError
        ``arrays`` that is not a list or tuple, or an element that is not an array.
    ValueError
        No arrays, or arrays of different shapes; arrays on two devices.
    numpy.exceptions.AxisError
        An axis out of range.

    Examples
    --------
    >>> a = kaionb.asarray([1, 2])
    >>> kaionb.stack([a, a * 10], axis=1).get()
    array([[ 1, 10],
           [ 2, 20]])
    """
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
