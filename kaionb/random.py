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
    """Draw device arrays (:class:`~kaionb.DeviceArray`) with NumPy's ``Generator`` methods.

    A 64-bit Philox4x32-10 key derived from the seed by NumPy's ``SeedSequence``, and a
    counter of Philox blocks used: each draw takes the next blocks, so successive draws
    differ and the whole sequence is reproduced from the seed (the values are not
    NumPy's). ``size=None`` gives a 0-d array (or ``out``'s shape); ``out=`` fills a
    C-contiguous device array of the draw's shape and dtype.

    Parameters
    ----------
    seed : int, numpy.random.SeedSequence or None, optional
        An int >= 0, a ``SeedSequence``, or None for fresh entropy (``SeedSequence()``).

    Raises
    ------
    TypeError
        A seed of another type (a bool or a string included).
    ValueError
        A negative seed.

    Examples
    --------
    >>> rng = kaionb.random.Generator(42)
    >>> x = rng.standard_normal((4096, 4096), dtype=np.float32)
    >>> x.shape, x.dtype
    ((4096, 4096), dtype('float32'))
    """

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
        """The 64-bit Philox key: k0 | k1 << 32.

        (k0, k1) = the seed's ``SeedSequence.generate_state(2, uint32)``.

        Examples
        --------
        >>> kaionb.random.Generator(1).key == kaionb.random.Generator(1).key
        True
        """
        return self._philox.key

    @property
    def counter(self) -> int:
        """The first Philox block counter the next draw uses.

        Examples
        --------
        >>> rng = kaionb.random.Generator(0)
        >>> rng.counter
        0
        >>> _ = rng.random(1000)
        >>> rng.counter > 0
        True
        """
        return self._philox.counter

    def __repr__(self) -> str:
        return f"Generator(Philox4x32-10, key=0x{self.key:016x}, counter={self.counter})"

    def random(self, size=None, dtype=np.float64, *, out=None) -> DeviceArray:
        """Draw floats uniformly from [0, 1).

        Parameters
        ----------
        size : int, tuple of int or None, optional
            The shape (None: 0-d, or ``out``'s shape).
        dtype : dtype, optional
            One of float64 (default), float32, float16 or bfloat16.
        out : DeviceArray, optional
            A C-contiguous array of the shape and dtype to fill.

        Returns
        -------
        DeviceArray
            The draws (``out`` itself when given).

        Raises
        ------
        TypeError
            Another dtype, a ``size`` that is not an int or a tuple of ints, or an ``out``
            that is not device memory or has another dtype.
        ValueError
            A negative size, or an ``out`` of another shape or not C-contiguous.

        Examples
        --------
        >>> x = kaionb.random.default_rng(0).random(1000, dtype=np.float32)
        >>> bool(((x.get() >= 0) & (x.get() < 1)).all())
        True
        """
        return uniform_fwd(self._philox, 0.0, 1.0, size, dtype, out=out, op="random")

    def uniform(self, low=0.0, high=1.0, size=None, dtype=np.float64, *,
                out=None) -> DeviceArray:
        """Draw floats uniformly from [low, high).

        ``low`` and ``high`` are rounded to ``dtype`` first; ``high`` is never drawn,
        after rounding either. low == high gives low.

        Parameters
        ----------
        low, high : float, optional
            The interval (finite in ``dtype``, low <= high, high − low finite).
        size : int, tuple of int or None, optional
            The shape (None: 0-d, or ``out``'s shape).
        dtype : dtype, optional
            One of float64 (default), float32, float16 or bfloat16.
        out : DeviceArray, optional
            A C-contiguous array of the shape and dtype to fill.

        Returns
        -------
        DeviceArray
            The draws (``out`` itself when given).

        Raises
        ------
        TypeError
            Bounds that are not real numbers, another dtype, or a bad ``size`` / ``out``.
        ValueError
            Bounds not finite in ``dtype``, low > high, a negative size, or an ``out`` of
            another shape.

        Examples
        --------
        >>> x = kaionb.random.default_rng(0).uniform(-1.0, 1.0, (2, 3))
        >>> x.shape, x.dtype
        ((2, 3), dtype('float64'))
        """
        return uniform_fwd(self._philox, low, high, size, dtype, out=out)

    def standard_normal(self, size=None, dtype=np.float64, *, out=None) -> DeviceArray:
        """Draw N(0, 1) floats (Box-Muller; float32 and the half types computed in float32).

        Parameters
        ----------
        size : int, tuple of int or None, optional
            The shape (None: 0-d, or ``out``'s shape).
        dtype : dtype, optional
            One of float64 (default), float32, float16 or bfloat16.
        out : DeviceArray, optional
            A C-contiguous array of the shape and dtype to fill.

        Returns
        -------
        DeviceArray
            The draws (``out`` itself when given).

        Raises
        ------
        TypeError
            Another dtype, or a bad ``size`` / ``out``.
        ValueError
            A negative size, or an ``out`` of another shape or not C-contiguous.

        Examples
        --------
        >>> x = kaionb.random.default_rng(0).standard_normal(100_000, dtype=np.float32)
        >>> abs(float(x.mean().item())) < 0.02
        True
        """
        return normal_fwd(self._philox, 0.0, 1.0, size, dtype, out=out,
                          op="standard_normal")

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=np.float64) -> DeviceArray:
        """Draw N(loc, scale²) floats: ``loc + scale * standard_normal``.

        Parameters
        ----------
        loc : float, optional
            The mean (finite in ``dtype``).
        scale : float, optional
            The standard deviation (>= 0).
        size : int, tuple of int or None, optional
            The shape (None: 0-d).
        dtype : dtype, optional
            One of float64 (default), float32, float16 or bfloat16.

        Returns
        -------
        DeviceArray
            The draws.

        Raises
        ------
        TypeError
            Parameters that are not real numbers, another dtype, or a bad ``size``.
        ValueError
            A ``loc`` or ``scale`` not finite in ``dtype``, a negative ``scale``, or a
            negative size.

        Examples
        --------
        >>> x = kaionb.random.default_rng(0).normal(10.0, 0.1, 1000, dtype=np.float32)
        >>> 9.9 < float(x.mean().item()) < 10.1
        True
        """
        return normal_fwd(self._philox, loc, scale, size, dtype)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False, *,
                 out=None) -> DeviceArray:
        """Draw integers uniformly from [low, high), or [low, high] with ``endpoint``.

        ``high=None`` draws from [0, low).

        Parameters
        ----------
        low : int
            The lowest value (or the upper bound when ``high`` is None).
        high : int, optional
            The upper bound (excluded unless ``endpoint``).
        size : int, tuple of int or None, optional
            The shape (None: 0-d, or ``out``'s shape).
        dtype : dtype, optional
            Any integer dtype or bool; int64 by default.
        endpoint : bool, optional
            Include ``high``.
        out : DeviceArray, optional
            A C-contiguous array of the shape and dtype to fill.

        Returns
        -------
        DeviceArray
            The draws (``out`` itself when given).

        Raises
        ------
        TypeError
            Bounds that are not ints, a dtype that is not an integer type or bool, or a bad
            ``size`` / ``out``.
        ValueError
            Bounds outside the dtype, an empty interval (high <= low), or a negative size.

        Examples
        --------
        >>> w = kaionb.random.default_rng(0).integers(-127, 128, size=(64, 64), dtype=np.int8)
        >>> w.dtype, int(w.min().item()) >= -127
        (dtype('int8'), True)
        """
        if high is None:
            low, high = 0, low
        return integers_fwd(self._philox, low, high, size, dtype, endpoint, out=out)


def default_rng(seed=None) -> Generator:
    """Return a new :class:`Generator` seeded with ``seed`` (a Generator is returned as is).

    Parameters
    ----------
    seed : int, numpy.random.SeedSequence, Generator or None, optional
        An int >= 0, a ``SeedSequence``, None for fresh entropy, or a Generator.

    Returns
    -------
    Generator
        The generator.

    Raises
    ------
    TypeError
        A seed of another type.
    ValueError
        A negative seed.

    Examples
    --------
    >>> a = kaionb.random.default_rng(7).random(4).get()
    >>> b = kaionb.random.default_rng(7).random(4).get()
    >>> bool((a == b).all())
    True
    """
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
    """Draw N(0, 1) floats (see :meth:`Generator.standard_normal`).

    Parameters
    ----------
    size : int, tuple of int or None, optional
        The shape (None: 0-d).
    dtype : dtype, optional
        One of float64 (default), float32, float16 or bfloat16.
    seed : int, numpy.random.SeedSequence or None, optional
        Draw from ``default_rng(seed)``; None draws from the module's generator (seeded
        from fresh entropy on first use).

    Returns
    -------
    DeviceArray
        The draws.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Generator.standard_normal`, and for a bad seed.

    Examples
    --------
    >>> kaionb.random.standard_normal((2, 2), seed=0).shape
    (2, 2)
    """
    return _rng(seed).standard_normal(size, dtype)


def normal(loc=0.0, scale=1.0, size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    """Draw N(loc, scale²) floats (see :meth:`Generator.normal`).

    Parameters
    ----------
    loc : float, optional
        The mean.
    scale : float, optional
        The standard deviation (>= 0).
    size : int, tuple of int or None, optional
        The shape (None: 0-d).
    dtype : dtype, optional
        One of float64 (default), float32, float16 or bfloat16.
    seed : int, numpy.random.SeedSequence or None, optional
        Draw from ``default_rng(seed)``; None draws from the module's generator.

    Returns
    -------
    DeviceArray
        The draws.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Generator.normal`, and for a bad seed.

    Examples
    --------
    >>> kaionb.random.normal(0.0, 2.0, 8, np.float16, seed=1).dtype
    dtype('float16')
    """
    return _rng(seed).normal(loc, scale, size, dtype)


def uniform(low=0.0, high=1.0, size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    """Draw floats uniformly from [low, high) (see :meth:`Generator.uniform`).

    Parameters
    ----------
    low, high : float, optional
        The interval.
    size : int, tuple of int or None, optional
        The shape (None: 0-d).
    dtype : dtype, optional
        One of float64 (default), float32, float16 or bfloat16.
    seed : int, numpy.random.SeedSequence or None, optional
        Draw from ``default_rng(seed)``; None draws from the module's generator.

    Returns
    -------
    DeviceArray
        The draws.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Generator.uniform`, and for a bad seed.

    Examples
    --------
    >>> kaionb.random.uniform(0.0, 10.0, 5, seed=3).shape
    (5,)
    """
    return _rng(seed).uniform(low, high, size, dtype)


def integers(low, high=None, size=None, dtype=np.int64, *, seed=None) -> DeviceArray:
    """Draw integers uniformly from [low, high) (see :meth:`Generator.integers`).

    Parameters
    ----------
    low : int
        The lowest value (or the upper bound when ``high`` is None).
    high : int, optional
        The upper bound (excluded).
    size : int, tuple of int or None, optional
        The shape (None: 0-d).
    dtype : dtype, optional
        Any integer dtype or bool; int64 by default.
    seed : int, numpy.random.SeedSequence or None, optional
        Draw from ``default_rng(seed)``; None draws from the module's generator.

    Returns
    -------
    DeviceArray
        The draws.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Generator.integers`, and for a bad seed.

    Examples
    --------
    >>> kaionb.random.integers(10, size=3, seed=0).dtype
    dtype('int64')
    """
    return _rng(seed).integers(low, high, size, dtype)


def random(size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    """Draw floats uniformly from [0, 1) (see :meth:`Generator.random`).

    Parameters
    ----------
    size : int, tuple of int or None, optional
        The shape (None: 0-d).
    dtype : dtype, optional
        One of float64 (default), float32, float16 or bfloat16.
    seed : int, numpy.random.SeedSequence or None, optional
        Draw from ``default_rng(seed)``; None draws from the module's generator.

    Returns
    -------
    DeviceArray
        The draws.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Generator.random`, and for a bad seed.

    Examples
    --------
    >>> kaionb.random.random(seed=0).shape
    ()
    """
    return _rng(seed).random(size, dtype)
