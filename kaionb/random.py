"""Random device arrays drawn on the GPU: NumPy's Generator API on Philox4x32-10.

    rng = kaionb.random.default_rng(42)
    x = rng.standard_normal((4096, 4096), dtype=np.float32)   # DeviceArray
    w = rng.integers(-127, 128, size=(4096, 4096), dtype=np.int8)

A :class:`Generator` is a 64-bit Philox key, derived from its seed by NumPy's
``SeedSequence``, and a 64-bit counter of Philox blocks used: each draw takes the next
blocks and moves the counter past them, so successive draws differ and the whole sequence
is reproduced from the seed (kaionb/kernels/random.py has the scheme: counter layout,
values per block, how values map to elements). The values are not NumPy's: the same seed
gives other numbers than ``np.random.default_rng(seed)``.

Draws are stream-ordered and never wait for the GPU or copy from the host, so they may be
captured in a CUDA graph; the counter then lives in the captured launch, and every replay
repeats the numbers drawn at capture.

The module-level functions draw from ``default_rng(seed)``, or with ``seed=None`` from one
generator the module seeds from fresh entropy on first use.
"""

from __future__ import annotations

import numbers
import threading

import numpy as np

from .array import DeviceArray
from .kernels.random import Philox, integers_fwd, normal_fwd, uniform_fwd
from .validation import fail

__all__ = ["Generator", "default_rng", "integers", "normal", "random", "standard_normal",
           "uniform"]


class Generator:
    """Draws device arrays (:class:`~kaionb.DeviceArray`) with NumPy's ``Generator``
    methods. ``seed``: an int >= 0, a ``numpy.random.SeedSequence``, or None for fresh
    entropy (``SeedSequence()``). ``size=None`` gives a 0-d array; ``out=`` fills a
    C-contiguous device array of the draw's shape and dtype."""

    def __init__(self, seed=None):
        if isinstance(seed, np.random.SeedSequence):
            sequence = seed
        elif seed is None or (isinstance(seed, (numbers.Integral, np.integer))
                              and not isinstance(seed, (bool, np.bool_))):
            if seed is not None and seed < 0:
                fail(ValueError, "Generator", "seed", "an int >= 0", seed)
            sequence = np.random.SeedSequence(None if seed is None else int(seed))
        else:
            fail(TypeError, "Generator", "seed", "an int, None or a numpy SeedSequence",
                 type(seed).__name__)
        k0, k1 = (int(k) for k in sequence.generate_state(2, np.uint32))
        self._philox = Philox(k0 | k1 << 32)

    @property
    def key(self) -> int:
        """The 64-bit Philox key: k0 | k1 << 32, (k0, k1) = the seed's
        ``SeedSequence.generate_state(2, uint32)``."""
        return self._philox.key

    @property
    def counter(self) -> int:
        """The first Philox block counter the next draw uses."""
        return self._philox.counter

    def __repr__(self) -> str:
        return f"Generator(Philox4x32-10, key=0x{self.key:016x}, counter={self.counter})"

    def random(self, size=None, dtype=np.float64, *, out=None) -> DeviceArray:
        """Floats in [0, 1): float64, float32, float16 or bfloat16."""
        return uniform_fwd(self._philox, 0.0, 1.0, size, dtype, out=out, op="random")

    def uniform(self, low=0.0, high=1.0, size=None, dtype=np.float64, *,
                out=None) -> DeviceArray:
        """Floats in [low, high) (low and high rounded to ``dtype`` first; high is never
        drawn, after rounding either). low == high gives low; low > high is refused."""
        return uniform_fwd(self._philox, low, high, size, dtype, out=out)

    def standard_normal(self, size=None, dtype=np.float64, *, out=None) -> DeviceArray:
        """N(0, 1) floats (Box-Muller; float32 and the half types computed in float32)."""
        return normal_fwd(self._philox, 0.0, 1.0, size, dtype, out=out,
                          op="standard_normal")

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=np.float64) -> DeviceArray:
        """N(loc, scale²) floats: ``loc + scale * standard_normal``; scale >= 0."""
        return normal_fwd(self._philox, loc, scale, size, dtype)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False, *,
                 out=None) -> DeviceArray:
        """Integers in [low, high), or [low, high] with ``endpoint``; ``high=None`` draws
        from [0, low). Any integer dtype or bool; bounds outside the dtype are refused."""
        if high is None:
            low, high = 0, low
        return integers_fwd(self._philox, low, high, size, dtype, endpoint, out=out)


def default_rng(seed=None) -> Generator:
    """A new :class:`Generator` seeded with ``seed``; a Generator is returned as is."""
    return seed if isinstance(seed, Generator) else Generator(seed)


_SHARED: Generator | None = None
_SHARED_LOCK = threading.Lock()


def _rng(seed) -> Generator:
    """``default_rng(seed)``, or for seed None the module's own generator."""
    global _SHARED
    if seed is not None:
        return default_rng(seed)
    if _SHARED is None:
        with _SHARED_LOCK:
            if _SHARED is None:
                _SHARED = Generator()
    return _SHARED


def standard_normal(size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    """N(0, 1) floats (see :meth:`Generator.standard_normal`)."""
    return _rng(seed).standard_normal(size, dtype)


def normal(loc=0.0, scale=1.0, size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    """N(loc, scale²) floats (see :meth:`Generator.normal`)."""
    return _rng(seed).normal(loc, scale, size, dtype)


def uniform(low=0.0, high=1.0, size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    """Floats in [low, high) (see :meth:`Generator.uniform`)."""
    return _rng(seed).uniform(low, high, size, dtype)


def integers(low, high=None, size=None, dtype=np.int64, *, seed=None) -> DeviceArray:
    """Integers in [low, high) (see :meth:`Generator.integers`)."""
    return _rng(seed).integers(low, high, size, dtype)


def random(size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    """Floats in [0, 1) (see :meth:`Generator.random`)."""
    return _rng(seed).random(size, dtype)
