"""Test and benchmark support shared by kaionb's tests, examples and users' own kernels.

- one table of tolerances per dtype (relative error ‖out − ref‖ / ‖ref‖ against float64),
- random inputs that are never all zeros,
- outputs poisoned before a run so unwritten elements show up,
- ``assert_close`` that prints the first mismatching elements.
"""

from __future__ import annotations

import itertools

import numpy as np

from .array import DeviceArray, _contiguous_strides, bfloat16, empty, normalize_dtype

# A made-up device address for metadata-only arrays (never dereferenced).
_FAKE_PTR = 0x7F0000000000
_FAKE_SPACING = 1 << 32  # each header its own address range: no two of them overlap
_fake_count = itertools.count()

# Relative-error tolerances against a float64 reference, for element-wise ops and
# reductions that accumulate in float32. Half types sit at their rounding (2^-11, 2^-8),
# with room for a few roundings.
TOLERANCE = {
    np.dtype(np.float64): 1e-12,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float16): 2e-3,
    bfloat16: 1.6e-2,
}


def tolerance(dtype) -> float:
    """Return the relative-error tolerance of ``dtype`` (its ``TOLERANCE`` entry).

    Parameters
    ----------
    dtype : dtype
        One of float64, float32, float16 or bfloat16.

    Returns
    -------
    float
        The tolerance against a float64 reference.

    Raises
    ------
    TypeError
        A dtype kaionb does not store.
    KeyError
        A stored dtype with no entry (integers, bool).

    Examples
    --------
    >>> import kaionb.testing
    >>> kaionb.testing.tolerance(np.float16)
    0.002
    """
    return TOLERANCE[normalize_dtype(dtype, "tolerance")]


def random_array(shape, dtype=np.float32, *, rng=None, scale=1.0, offset=0.0) -> np.ndarray:
    """Return a random host array of ``dtype``: normal floats or full-range integers.

    Never all zeros: floats are standard normal (times ``scale``, plus ``offset``),
    integers uniform over the dtype's range (clipped to int32's), bools fair coin flips.

    Parameters
    ----------
    shape : int or tuple of int
        The shape.
    dtype : dtype, optional
        A dtype kaionb stores.
    rng : numpy.random.Generator, optional
        The generator (default: a fresh one).
    scale, offset : float, optional
        For floats: ``standard_normal * scale + offset``.

    Returns
    -------
    numpy.ndarray
        The values, in ``dtype``.

    Raises
    ------
    TypeError
        A dtype kaionb does not store.

    Examples
    --------
    >>> import kaionb.testing
    >>> x = kaionb.testing.random_array((2, 3), kaionb.bfloat16, rng=np.random.default_rng(0))
    >>> x.shape, x.dtype
    ((2, 3), dtype(bfloat16))
    """
    rng = np.random.default_rng() if rng is None else rng
    dt = normalize_dtype(dtype, "random_array")
    if dt.kind == "f" or dt == bfloat16:
        values = rng.standard_normal(shape) * scale + offset
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        values = rng.integers(max(info.min, -(2**31)), min(info.max, 2**31 - 1), size=shape,
                              endpoint=True)
    elif dt.kind == "b":
        values = rng.random(shape) < 0.5
    else:
        raise TypeError(f"random_array: dtype {dt} is not supported")
    return np.asarray(values).astype(dt)


def metadata_array(shape, dtype=np.float32, *, device_id=0) -> DeviceArray:
    """Return a C-contiguous DeviceArray header over no memory, for tests without a GPU.

    For host-side tests (validation, views) that must run without a GPU: each header
    gets its own made-up address range. Launching a kernel on it is a bug.

    Parameters
    ----------
    shape : int or tuple of int
        The shape.
    dtype : dtype, optional
        A dtype kaionb stores.
    device_id : int, optional
        The device it claims to be on.

    Returns
    -------
    DeviceArray
        The header.

    Raises
    ------
    TypeError
        A dtype kaionb does not store.

    Examples
    --------
    >>> import kaionb.testing
    >>> a = kaionb.testing.metadata_array((4, 8), np.float16)
    >>> a.T.strides
    (2, 16)
    """
    dt = normalize_dtype(dtype, "metadata_array")
    shape = tuple(shape)
    ptr = _FAKE_PTR + next(_fake_count) % 4096 * _FAKE_SPACING
    return DeviceArray(shape, dt, _contiguous_strides(shape, dt.itemsize), ptr, None,
                       device_id)


def poison_value(dtype):
    """Return the poison value of ``dtype``: NaN for floats, the largest integer, True.

    A value unlikely to be a real result, written into outputs before a run so that
    unwritten elements show up.

    Parameters
    ----------
    dtype : dtype
        A dtype kaionb stores.

    Returns
    -------
    float, int or bool
        NaN for float types, the largest value for integers, True for bool.

    Raises
    ------
    TypeError
        A dtype kaionb does not store.

    Examples
    --------
    >>> import kaionb.testing
    >>> kaionb.testing.poison_value(np.int8)
    127
    """
    dt = normalize_dtype(dtype, "poison_value")
    if dt.kind == "f" or dt == bfloat16:
        return np.nan
    if dt.kind == "b":
        return True
    return np.iinfo(dt).max


def poisoned(shape, dtype) -> DeviceArray:
    """Return a new device array filled with :func:`poison_value`, for ``out=`` in tests.

    Parameters
    ----------
    shape : int or tuple of int
        The shape.
    dtype : dtype
        A dtype kaionb stores.

    Returns
    -------
    DeviceArray
        The poisoned array.

    Raises
    ------
    TypeError
        A dtype kaionb does not store.

    Examples
    --------
    >>> import kaionb.testing
    >>> out = kaionb.testing.poisoned((3,), np.float32)
    >>> kaionb.add(kaionb.ones(3, dtype=np.float32), 1, out=out).get()
    array([2., 2., 2.], dtype=float32)
    """
    return empty(shape, dtype).fill(poison_value(dtype))


def relative_error(out, ref) -> float:
    """Return ``‖out − ref‖ / ‖ref‖`` over the finite elements, in float64.

    inf when the two differ in which elements are finite, or in their non-finite values
    (NaN where NaN is expected compares equal); ``‖out − ref‖`` itself when ``ref`` is
    all zeros.

    Parameters
    ----------
    out : array_like
        The result (host).
    ref : array_like
        The reference, of ``out``'s shape.

    Returns
    -------
    float
        The relative error.

    Raises
    ------
    ValueError
        Shapes that differ.

    Examples
    --------
    >>> import kaionb.testing
    >>> kaionb.testing.relative_error([1.0, 2.0], [1.0, 2.5])
    0.18569533817705186
    """
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"relative_error: shapes differ: {out.shape} vs {ref.shape}")
    if not np.all(np.isfinite(out) == np.isfinite(ref)):
        return float("inf")
    finite = np.isfinite(ref)
    if not np.array_equal(out[~finite], ref[~finite]):
        return float("inf")
    denom = np.linalg.norm(ref[finite])
    diff = np.linalg.norm(out[finite] - ref[finite])
    return float(diff / denom) if denom else float(diff)


def assert_close(out, ref, *, dtype=None, tol=None, what="result") -> float:
    """Assert that ``out`` matches the float64 ``ref`` within a relative error ``tol``.

    The error is :func:`relative_error`; the failure message shows the first mismatching
    elements.

    Parameters
    ----------
    out : DeviceArray or array_like
        The result (copied to the host).
    ref : array_like
        The float64 reference.
    dtype : dtype, optional
        Whose tolerance to use (default: ``out``'s dtype).
    tol : float, optional
        The tolerance (default: the dtype's entry in ``TOLERANCE``).
    what : str, optional
        Names the result in the failure message.

    Returns
    -------
    float
        The relative error.

    Raises
    ------
    AssertionError
        An error above ``tol``.
    ValueError
        Shapes that differ.

    Examples
    --------
    >>> import kaionb.testing
    >>> x = kaionb.asarray([1.0, 2.0], dtype=np.float32)
    >>> kaionb.testing.assert_close(kaionb.exp(x), np.exp([1.0, 2.0])) < 1e-5
    True
    """
    host = out.get() if isinstance(out, DeviceArray) else np.asarray(out)
    tol = tolerance(dtype or host.dtype) if tol is None else tol
    err = relative_error(host, ref)
    if not err <= tol:
        h = np.asarray(host, np.float64).ravel()
        r = np.asarray(ref, np.float64).ravel()
        bad = np.flatnonzero(~np.isclose(h, r, rtol=max(tol, 1e-6) * 10, atol=0, equal_nan=True))
        shown = ", ".join(f"[{np.unravel_index(i, np.shape(ref))}] {h[i]!r} vs {r[i]!r}"
                          for i in bad[:5])
        raise AssertionError(f"{what}: relative error {err:.3e} > {tol:.1e}; "
                             f"{bad.size} of {h.size} elements differ; first: {shown}")
    return err
