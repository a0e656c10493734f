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
    return TOLERANCE[normalize_dtype(dtype, "tolerance")]


def random_array(shape, dtype=np.float32, *, rng=None, scale=1.0, offset=0.0) -> np.ndarray:
    """Host array of the given dtype: normal floats or full-range integers, never zeros only."""
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
    """A C-contiguous DeviceArray header over no memory: for host-side tests (validation,
    views) that must run without a GPU. Launching a kernel on it is a bug."""
    dt = normalize_dtype(dtype, "metadata_array")
    shape = tuple(shape)
    ptr = _FAKE_PTR + next(_fake_count) % 4096 * _FAKE_SPACING
    return DeviceArray(shape, dt, _contiguous_strides(shape, dt.itemsize), ptr, None,
                       device_id)


def poison_value(dtype):
    """NaN for float types; the largest value for integers (unlikely to be a real result)."""
    dt = normalize_dtype(dtype, "poison_value")
    if dt.kind == "f" or dt == bfloat16:
        return np.nan
    if dt.kind == "b":
        return True
    return np.iinfo(dt).max


def poisoned(shape, dtype) -> DeviceArray:
    """A device array filled with ``poison_value`` — for ``out=`` in tests."""
    return empty(shape, dtype).fill(poison_value(dtype))


def relative_error(out, ref) -> float:
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
    """Relative error of ``out`` (DeviceArray or NumPy) vs the float64 ``ref`` under ``tol``
    (default: the dtype's entry in TOLERANCE). Prints the first mismatches on failure."""
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
