"""Hypothesis strategies and helpers shared by the fuzz tests (tests/test_fuzz_ops.py on the
GPU, tests/test_fuzz_host.py on the CPU).

- sizes and shapes: 0 and 1, primes, one off every tile size, now and then a large one;
  ``cap`` keeps a shape's element count (and so the float64 reference) bounded;
- dtypes;
- layouts: a recipe (``ANY_LAYOUTS``, ``ROW_LAYOUTS``) that ``on_device`` turns into a
  device view holding given host values — transposed, stepped, flipped, padded rows,
  misaligned starts, broadcast — and ``Out``: a NaN-poisoned ``out=`` in such a layout
  that also checks the memory around it was left alone;
- ``time_budget``: stop running a test's examples after KAIONB_FUZZ_SECONDS.

The hypothesis profiles ("ci", "gpu-long") are registered in tests/conftest.py.
"""

from __future__ import annotations

import functools
import math
import os
import time

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption

import kaionb
from kaionb.array import bfloat16
from kaionb.testing import poison_value, poisoned

F64, F32, F16, BF16 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), bfloat16
I64, U64, I32, U32 = (np.dtype(t) for t in (np.int64, np.uint64, np.int32, np.uint32))
I16, U16, I8, U8, BOOL = (np.dtype(t) for t in (np.int16, np.uint16, np.int8, np.uint8, np.bool_))
FLOATS = (F32, F16, BF16)  # what the tensor-core and row-wise ops take
ALL_DTYPES = (F64, F32, F16, BF16, I64, U64, I32, U32, I16, U16, I8, U8, BOOL)

# Kernels tile by these; one element either side of a tile is where edge handling breaks.
TILE_SIZES = (8, 16, 32, 64, 128, 256)
EDGE_SIZES = tuple(sorted({0, 1, 2, 3, 5, 7, 13, 17, 31, 37, 61, 67, 97, 127, 131, 257}
                          | {t + d for t in TILE_SIZES for d in (-1, 1)}))


def rarely(common, rare, one_in=8):
    """``rare`` about once in ``one_in`` draws, else ``common``; shrinks towards ``common``."""
    return st.integers(0, one_in - 1).flatmap(lambda k: rare if k == one_in - 1 else common)


def sizes(lo=1, hi=64, large=None):
    """One dimension in [lo, hi]: an edge size or any size; with ``large`` = (lo2, hi2), now
    and then one from that range instead (where a kernel changes its plan)."""
    edge = [s for s in EDGE_SIZES if lo <= s <= hi]
    common = st.one_of(st.sampled_from(edge), st.integers(lo, hi)) if edge else st.integers(lo, hi)
    return common if large is None else rarely(common, st.integers(*large))


def shapes(min_dims=1, max_dims=3, dim=None):
    return st.lists(dim if dim is not None else sizes(), min_size=min_dims,
                    max_size=max_dims).map(tuple)


def cap(shape, limit):
    """``shape`` with its largest dimensions halved until it has at most ``limit`` elements
    (bounds the float64 reference; a pure function of the draw, so it shrinks well)."""
    shape = list(shape)
    while math.prod(shape) > limit and max(shape) > 1:
        i = shape.index(max(shape))
        shape[i] = -(-shape[i] // 2)
    return tuple(shape)


seeds = st.integers(0, 2**32 - 1)  # for the NumPy generator of an example's values


# -- layouts -----------------------------------------------------------------------------
#
# Row layouts keep the last axis contiguous and the leading axes collapsible into one row
# stride (what the row-wise ops and the tensor-core kernels read); the others may not.

ROW_LAYOUTS = ("c", "padded_rows", "offset", "step_rows", "flip_rows")
ANY_LAYOUTS = ROW_LAYOUTS + ("transposed", "step_last", "flip_last", "broadcast")
OUT_LAYOUTS = ("c", "padded_rows", "offset", "transposed", "step_last")


def _rows_view(host, layout):
    """A device view of the 2-D ``host`` [R, n] in a row layout."""
    r, n = host.shape
    if layout == "padded_rows":
        buf = np.zeros((r, n + 3), host.dtype)
        buf[:, :n] = host
        return kaionb.asarray(buf)[:, :n]
    if layout == "offset":  # one element in: every row off 16-byte alignment
        buf = np.zeros((r, n + 1), host.dtype)
        buf[:, 1:] = host
        return kaionb.asarray(buf)[:, 1:]
    if layout == "step_rows":
        buf = np.zeros((2 * r, n), host.dtype)
        buf[::2] = host
        return kaionb.asarray(buf)[::2]
    if layout == "flip_rows":
        return kaionb.asarray(np.ascontiguousarray(host[::-1]))[::-1]
    return kaionb.asarray(host)


def on_device(host, layout):
    """(device array, host values it holds) for ``host`` in ``layout``. The values are
    ``host``'s except for "broadcast", which repeats the first entry of axis 0 (stride 0)."""
    host = np.asarray(host)
    if host.ndim == 0 or host.size == 0 or layout == "c":
        return kaionb.asarray(host), host
    if layout in ROW_LAYOUTS:
        # Built as [R, n] rows, then split back: the leading axes stay one stride.
        rows = _rows_view(host.reshape(-1, host.shape[-1]), layout)
        return (rows if host.ndim == 2 else rows.reshape(host.shape)), host
    if layout == "transposed":
        return kaionb.asarray(np.ascontiguousarray(host.T)).T, host
    if layout == "step_last":
        buf = np.zeros(host.shape[:-1] + (2 * host.shape[-1],), host.dtype)
        buf[..., ::2] = host
        return kaionb.asarray(buf)[..., ::2], host
    if layout == "flip_last":
        return kaionb.asarray(np.ascontiguousarray(host[..., ::-1]))[..., ::-1], host
    if layout == "broadcast":
        first = np.ascontiguousarray(host[:1])
        return kaionb.broadcast_to(kaionb.asarray(first), host.shape), \
            np.broadcast_to(first, host.shape).copy()
    raise ValueError(f"on_device: unknown layout {layout!r}")


class Out:
    """A NaN-poisoned ``out=`` of ``shape`` / ``dtype`` in one of OUT_LAYOUTS, carved from a
    larger poisoned buffer; ``untouched()`` checks that the op wrote nothing outside it."""

    def __init__(self, shape, dtype, layout="c"):
        shape = tuple(shape)
        if not shape or layout == "c":
            layout = "c"
        n = shape[-1] if shape else 1
        buf_shape, key = {
            "c": (shape, ...),
            "padded_rows": (shape[:-1] + (n + 3,), (..., slice(0, n))),
            "offset": (shape[:-1] + (n + 1,), (..., slice(1, n + 1))),
            "step_last": (shape[:-1] + (2 * n,), (..., slice(None, None, 2))),
            "transposed": (shape[::-1], ...),
        }[layout]
        self.buffer = poisoned(buf_shape, dtype)
        self.array = self.buffer.T if layout == "transposed" else self.buffer[key]
        self._mask = np.zeros(buf_shape, bool)
        self._mask[key] = True

    def untouched(self):
        rest = self.buffer.get()[~self._mask]
        poison = poison_value(self.buffer.dtype)
        ok = np.isnan(rest.astype(np.float64)).all() if poison != poison else (rest == poison).all()
        assert ok, "the op wrote outside its out= view"


# -- the time budget ---------------------------------------------------------------------

FUZZ_SECONDS = float(os.environ.get("KAIONB_FUZZ_SECONDS", "0")) or None
_STARTED: dict = {}  # test id -> when its first example ran
_FAILED: set = set()  # test ids that have failed: from then on every example runs


def time_budget(check):
    """``check`` to be run on an example's drawn values at most KAIONB_FUZZ_SECONDS (unset:
    no limit) after the current test's first example. Hypothesis has no time budget and
    cannot be stopped from inside a test, so later examples are drawn but not checked;
    the events "ran" / "not run: time budget spent" in ``--hypothesis-show-statistics``
    count them. Draw everything before calling the wrapper (an example whose check is
    skipped must draw what one that runs draws: hypothesis replays them). After a
    failure every example runs (the shrinker and the final replay need the outcome)."""
    if FUZZ_SECONDS is None:
        return check

    @functools.wraps(check)
    def budgeted(*args, **kwargs):
        key = os.environ.get("PYTEST_CURRENT_TEST", check.__name__)  # one clock per test id
        start = _STARTED.setdefault(key, time.monotonic())
        if key not in _FAILED and time.monotonic() - start > FUZZ_SECONDS:
            event("not run: time budget spent")
            return
        event("ran")
        try:
            check(*args, **kwargs)
        except UnsatisfiedAssumption:
            raise
        except Exception:  # (not hypothesis's own BaseExceptions)
            _FAILED.add(key)
            raise

    return budgeted
