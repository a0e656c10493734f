"""Random device arrays for tests, examples and benchmarks (drawn on the host with NumPy's
PCG64, then copied up: reproducible from a seed, and never all zeros)."""

from __future__ import annotations

import numpy as np

from .array import DeviceArray, asarray
from .testing import random_array


def standard_normal(shape, dtype=np.float32, *, seed=None) -> DeviceArray:
    """N(0, 1) samples rounded to ``dtype``."""
    return asarray(random_array(shape, dtype, rng=np.random.default_rng(seed)))


def uniform(shape, low=0.0, high=1.0, dtype=np.float32, *, seed=None) -> DeviceArray:
    """U[low, high) samples rounded to ``dtype``."""
    rng = np.random.default_rng(seed)
    return asarray(rng.uniform(low, high, size=shape).astype(dtype))


def integers(shape, low, high, dtype=np.int8, *, seed=None) -> DeviceArray:
    """Integers in [low, high) of ``dtype`` (e.g. int8 weights for quantized matmul)."""
    rng = np.random.default_rng(seed)
    return asarray(rng.integers(low, high, size=shape).astype(dtype))
