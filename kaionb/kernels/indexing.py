"""Integer and boolean array indexing: ``take`` (gather), ``a[idx]``, ``a[mask]`` and
``a[...] = value`` (scatter, masked and basic assignment).

One subscript may hold one integer array (any shape; the other entries basic: ints,
slices, ``...``, ``None``) or one boolean mask over leading axes. The basic part is
applied first as a view; the array index then selects along its axis:
``out[o, j, i] = src[o, idx[j], i]`` with ``src`` seen as (outer, axis, inner) at any
strides. Elements move as raw bits (one kernel per element size and index type), so every
dtype is covered. A boolean mask becomes integer indices on the host (``np.nonzero``):
that waits for the mask, as in CuPy — except ``a[mask] = scalar`` with a full-shape mask,
which is ``where(mask, scalar, a, out=a)`` and never leaves the GPU.

Indices are checked against the axis on the host when they come from the host (a list or
NumPy array: NumPy's IndexError). Device indices are not read back: a negative index
counts from the end, and one outside the axis wraps around (modulo the axis size), as in
CuPy — never an out-of-bounds access.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from numba import cuda

from ..array import DeviceArray, _axis_index, _is_array_index, asarray, register_kernel
from ..validation import as_array, fail
from .elementwise import THREADS, _grid_stride_blocks, apply, elementwise_fwd
from .launch import kernel
from .op import ANY_LAYOUT, Plan, device_guard, fast_path, output, run

_BITS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


def _make_gather(bits: str, index: str, scatter: bool):
    name = f"_{'scatter' if scatter else 'gather'}_{bits}_by_{index}_kernel"

    @kernel([f"void({bits}[:, :, :], {index}[::1], {bits}[:, :, :])"], name=name)
    def _gather_kernel(src, idx, dst):
        # gather: dst (O, J, I) <- src (O, A, I);  scatter: src (O, J, I) -> dst (O, A, I)
        outer = src.shape[0]
        inner = src.shape[2]
        count = idx.shape[0]
        axis = dst.shape[1] if scatter else src.shape[1]
        n = outer * count * inner
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < n:
            k = i % inner
            rest = i // inner
            j = rest % count
            o = rest // count
            a = idx[j] % axis  # Python's % : negative indices count from the end
            if scatter:
                dst[o, a, k] = src[o, j, k]
            else:
                dst[o, j, k] = src[o, a, k]
            i += step

    return _gather_kernel


_KERNELS = {(size, index.name, scatter): _make_gather(bits, index.name, scatter)
            for size, bits in _BITS.items() for index in _INDEX_DTYPES
            for scatter in (False, True)}


def _as_index_array(op: str, indices, axis_size: int) -> DeviceArray:
    """Integer indices as a DeviceArray (host ones checked against the axis first)."""
    if isinstance(indices, DeviceArray) or hasattr(indices, "__cuda_array_interface__") or \
            (hasattr(indices, "__dlpack__") and not isinstance(indices, np.ndarray)):
        idx = as_array(op, "indices", indices)
    else:
        host = np.asarray(indices)
        if host.dtype.kind not in "iu" and host.size:
            raise IndexError(f"{op}: arrays used as indices must be of integer (or boolean) "
                             f"type, got {host.dtype}")
        host = host.astype(np.int64)
        bad = (host < -axis_size) | (host >= axis_size)
        if bad.any():
            raise IndexError(f"{op}: index {int(host[bad][0])} is out of bounds for axis "
                             f"with size {axis_size}")
        idx = asarray(host)
    if idx.dtype.kind not in "iu":
        raise IndexError(f"{op}: arrays used as indices must be of integer (or boolean) type, "
                         f"got {idx.dtype}")
    if idx.dtype not in _INDEX_DTYPES:
        idx = idx.astype(np.int64)
    return idx


def _three_axes(x: DeviceArray, axis: int) -> DeviceArray:
    """``x`` as (outer, axis, inner), or None when the outer or inner axes do not merge."""
    outer, inner = x.shape[:axis], x.shape[axis + 1:]

    def merged(shape, strides):
        size = math.prod(shape)
        dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
        for (d0, s0), (d1, s1) in zip(dims, dims[1:]):
            if s0 != d1 * s1:
                return None
        return size, (dims[-1][1] if dims else x.itemsize)

    o = merged(outer, x.strides[:axis])
    i = merged(inner, x.strides[axis + 1:])
    if o is None or i is None:
        return None
    return x._view((o[0], x.shape[axis], i[0]), (o[1], x.strides[axis], i[1]))


@fast_path
def take_fwd(x, indices, *, axis=None, out=None):
    """Validate; gather ``x`` along ``axis`` (None: the flattened array) at ``indices``."""
    op = "take"
    x = as_array(op, "x", x)
    if axis is None:
        x, axis = x.reshape(-1), 0
    if x.ndim == 0:
        fail(ValueError, op, "x", "at least one dimension", "a 0-d array")
    axis = _axis_index(op, axis, x.ndim)
    idx = _as_index_array(op, indices, x.shape[axis])
    shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if idx.size and x.shape[axis] == 0:
        raise IndexError(f"{op}: cannot take from an empty axis {axis}")
    out = output(op, out, shape, x.dtype, device=x.device_id, layout=ANY_LAYOUT)
    return run(_gather_launch, x, idx, axis, out=out)


def _gather_launch(x, idx, axis, out):
    src = _three_axes(x, axis)
    if src is None:  # outer or inner axes that do not merge: gather from a copy
        src = _three_axes(x.copy(), axis)
    flat_idx = idx.reshape(-1)
    dst = out if out.is_c_contiguous else None
    target = dst if dst is not None else out.copy()
    view = target._view((src.shape[0], flat_idx.size, src.shape[2]),
                        (flat_idx.size * src.shape[2] * out.itemsize,
                         src.shape[2] * out.itemsize, out.itemsize))
    bits = np.dtype(_BITS[x.itemsize])
    kdef = _KERNELS[x.itemsize, idx.dtype.name, False]
    Plan.of(kdef, (_grid_stride_blocks(view.size),), (THREADS,)).launch(
        src.view(bits), flat_idx, view.view(bits))
    if dst is None:
        elementwise_fwd("copy", target, out=out, dtype=out.dtype)


def take(x, indices, /, *, axis=None, out=None):
    """Gather the elements of ``x`` at integer ``indices`` along ``axis``, as ``np.take``.

    The result has ``indices``' shape in place of that axis. Host indices (a list, a
    NumPy array) are bounds-checked on the host (NumPy's IndexError); device indices are
    not read back: a negative one counts from the end and one outside the axis wraps
    around (modulo the axis size), as in CuPy, never an out-of-bounds read. Elements
    move as raw bits, so every dtype is covered.

    Parameters
    ----------
    x : DeviceArray or array_like
        The array to gather from (at least 1-D).
    indices : DeviceArray or array_like of int
        The indices, any shape.
    axis : int or None, optional
        The axis to gather along; None gathers from the flattened array.
    out : DeviceArray, optional
        An array of the result's shape and ``x``'s dtype to write (any layout).

    Returns
    -------
    DeviceArray
        The gathered elements (``out`` itself when given).

    Raises
    ------
    TypeError
        ``x`` that is not an array, or an ``out`` that is not a DeviceArray or has another
        dtype.
    ValueError
        A 0-d ``x``, or an ``out`` of another shape.
    IndexError
        Host indices out of range or not integers, or indices into an empty axis.
    numpy.exceptions.AxisError
        An axis out of range.

    Examples
    --------
    >>> x = kaionb.asarray([[1, 2], [3, 4], [5, 6]])
    >>> kaionb.take(x, [2, 0], axis=0).get()
    array([[5, 6],
           [1, 2]])
    """
    return take_fwd(x, indices, axis=axis, out=out)


def _scatter(x: DeviceArray, axis: int, idx: DeviceArray, value) -> None:
    """x[..., idx, ...] = value along ``axis`` (value broadcast to the gathered shape)."""
    shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    from ..array import empty

    values = empty(shape, x.dtype)
    elementwise_fwd("copy", value, out=values, dtype=x.dtype)  # broadcast + convert
    if not values.size:
        return
    dst = _three_axes(x, axis)
    if dst is None:  # scatter into a contiguous copy, then copy it back
        staged = x.copy()
        _scatter(staged, axis, idx, values)
        elementwise_fwd("copy", staged, out=x, dtype=x.dtype)
        return
    flat_idx = idx.reshape(-1)
    src = values._view((dst.shape[0], flat_idx.size, dst.shape[2]),
                       (flat_idx.size * dst.shape[2] * x.itemsize, dst.shape[2] * x.itemsize,
                        x.itemsize))
    bits = np.dtype(_BITS[x.itemsize])
    kdef = _KERNELS[x.itemsize, idx.dtype.name, True]
    Plan.of(kdef, (_grid_stride_blocks(src.size),), (THREADS,)).launch(
        src.view(bits), flat_idx, dst.view(bits))


# -- subscripts ------------------------------------------------------------------------------

def _split(x: DeviceArray, key):
    """(basic view, axis of the array index in it, the index, whether it is a mask) for a
    subscript with one array index."""
    key = key if isinstance(key, tuple) else (key,)
    positions = [i for i, k in enumerate(key) if _is_array_index(k)]
    if len(positions) > 1:
        raise IndexError("kaionb supports one array index per subscript (the others basic: "
                         "ints, slices, ..., None)")
    pos = positions[0]
    index = np.asarray(key[pos]) if isinstance(key[pos], list) else key[pos]
    is_mask = np.dtype(getattr(index, "dtype", np.int64)) == np.bool_
    width = index.ndim if is_mask else 1  # axes the index covers
    if any(k is Ellipsis for k in key):
        n_real = sum(width if i == pos else 1 for i, k in enumerate(key)
                     if k is not None and k is not Ellipsis)
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * max(x.ndim - n_real, 0) + key[at + 1:]
        pos = next(i for i, k in enumerate(key) if _is_array_index(k))
    view = x[key[:pos] + (slice(None),) * width + key[pos + 1:]]
    axis = sum(1 for k in key[:pos] if k is None or isinstance(k, slice))
    # NumPy counts integer entries as advanced indices too: when they and the array are
    # not one run of the subscript, the array's axes go first in the result.
    advanced = [i for i, k in enumerate(key) if i == pos or (
        isinstance(k, (numbers.Integral, np.integer)) and not isinstance(k, bool))]
    lead = advanced != list(range(advanced[0], advanced[-1] + 1))
    return view, axis, index, is_mask, lead


def _mask_indices(op: str, view: DeviceArray, axis: int, mask):
    """A boolean mask over ``view``'s axes [axis, axis + mask.ndim): (view with those axes
    merged into one, int64 indices of the True elements) — reads the mask on the host."""
    shape = tuple(mask.shape)
    covered = view.shape[axis:axis + len(shape)]
    for i, want in enumerate(shape):
        have = covered[i] if i < len(covered) else None
        if have != want:
            raise IndexError(f"{op}: boolean index did not match indexed array along axis "
                             f"{axis + i}; size of axis is {have} but size of corresponding "
                             f"boolean axis is {want}")
    host = mask.get() if isinstance(mask, DeviceArray) else np.asarray(mask)
    flat = np.flatnonzero(host.reshape(-1))
    merged_shape = view.shape[:axis] + (math.prod(shape),) + view.shape[axis + len(shape):]
    return view.reshape(merged_shape), flat


@device_guard
def getitem(x: DeviceArray, key) -> DeviceArray:
    """``x[key]`` for a subscript holding an integer array or a boolean mask."""
    view, axis, index, is_mask, lead = _split(x, key)
    if is_mask:
        merged, flat = _mask_indices("__getitem__", view, axis, index)
        out, width = take_fwd(merged, flat, axis=axis), 1
    else:
        idx = _as_index_array("__getitem__", index, view.shape[axis] if view.ndim else 0)
        out, width = take_fwd(view, idx, axis=axis), idx.ndim
    if lead and axis:
        from ..array import moveaxis

        out = moveaxis(out, tuple(range(axis, axis + width)), tuple(range(width)))
    return out


@device_guard
def setitem(x: DeviceArray, key, value) -> None:
    """``x[key] = value``: basic subscripts assign into a view (broadcast, converted as
    NumPy's unsafe cast); an integer array scatters (with repeated indices, which of the
    values lands is unspecified, as in CuPy); a boolean mask of x's whole shape with a
    scalar value is a ``where``."""
    keys = key if isinstance(key, tuple) else (key,)
    if not any(_is_array_index(k) for k in keys):
        view = x[key]
        if view.size:
            elementwise_fwd("copy", value, out=view, dtype=x.dtype)
        return
    view, axis, index, is_mask, lead = _split(x, key)
    if lead and axis:
        raise IndexError("__setitem__: an integer and an array index separated by a slice "
                         "is not supported on the left of '=' (NumPy moves their axes first)")
    if is_mask and tuple(index.shape) == x.shape and \
            isinstance(value, (bool, int, float, np.generic)):
        # The scalar in x's dtype (a weak Python number keeps x's dtype in where).
        scalar = np.asarray(value).astype(x.dtype, casting="unsafe").item()
        apply("where", as_array("__setitem__", "key", index), scalar, x, out=x)
        return
    if is_mask:
        merged, flat = _mask_indices("__setitem__", view, axis, index)
        if merged._owner is not view._owner:  # reshape had to copy: writes would miss x
            raise ValueError("__setitem__: a boolean mask over axes that do not merge in "
                             "memory (a strided view) cannot be assigned through; use a "
                             "mask of the array's full shape or a contiguous array")
        view, idx = merged, asarray(flat)
    else:
        idx = _as_index_array("__setitem__", index, view.shape[axis])
    _scatter(view, axis, idx, value)


register_kernel("take", getitem)
register_kernel("setitem", setitem)
