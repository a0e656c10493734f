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

import inspect
import numbers
import textwrap
import threading
import typing

import numpy as np

from .array import DeviceArray
from .kernels.random import Philox, integers_fwd, normal_fwd, uniform_fwd
from .validation import fail

__all__ = ["Generator", "default_rng", "integers", "normal", "random", "standard_normal",
           "uniform"]


# The docstrings of the draws, Generator methods and module functions alike, from one
# template (_docstring). Per draw: the summary, what the method's summary line adds, the
# method's extended summary, its own parameters (type, description; they override
# _PARAMS), the clauses of the method's TypeError and ValueError before the shared ones,
# and the examples of the method and of the function. A module function has the method's
# parameters but ``endpoint`` and ``out``, and ``seed``; it raises what the method does.
class _Draw(typing.NamedTuple):
    summary: str
    more: str
    notes: str
    params: dict
    errors: tuple
    method: str
    function: str


_DRAWS = {
    "random": _Draw(
        "Draw floats uniformly from [0, 1)", "", "", {}, (["another dtype"], []),
        ">>> x = kaionb.random.default_rng(0).random(1000, dtype=np.float32)\n"
        ">>> bool(((x.get() >= 0) & (x.get() < 1)).all())\nTrue",
        ">>> kaionb.random.random(seed=0).shape\n()"),
    "uniform": _Draw(
        "Draw floats uniformly from [low, high)", "",
        "``low`` and ``high`` are rounded to ``dtype`` first; ``high`` is never drawn, after "
        "rounding either. low == high gives low.",
        {"low, high": ("float, optional",
                       "The interval (finite in ``dtype``, low <= high, high − low finite).")},
        (["bounds that are not real numbers", "another dtype"],
         ["bounds not finite in ``dtype``", "low > high"]),
        ">>> x = kaionb.random.default_rng(0).uniform(-1.0, 1.0, (2, 3))\n"
        ">>> x.shape, x.dtype\n((2, 3), dtype('float64'))",
        ">>> kaionb.random.uniform(0.0, 10.0, 5, seed=3).shape\n(5,)"),
    "standard_normal": _Draw(
        "Draw N(0, 1) floats", " (Box-Muller; float32 and the half types computed in float32)",
        "", {}, (["another dtype"], []),
        ">>> x = kaionb.random.default_rng(0).standard_normal(100_000, dtype=np.float32)\n"
        ">>> abs(float(x.mean().item())) < 0.02\nTrue",
        ">>> kaionb.random.standard_normal((2, 2), seed=0).shape\n(2, 2)"),
    "normal": _Draw(
        "Draw N(loc, scale²) floats", ": ``loc + scale * standard_normal``", "",
        {"loc": ("float, optional", "The mean (finite in ``dtype``)."),
         "scale": ("float, optional", "The standard deviation (>= 0).")},
        (["parameters that are not real numbers", "another dtype"],
         ["a ``loc`` or ``scale`` not finite in ``dtype``", "a negative ``scale``"]),
        ">>> x = kaionb.random.default_rng(0).normal(10.0, 0.1, 1000, dtype=np.float32)\n"
        ">>> 9.9 < float(x.mean().item()) < 10.1\nTrue",
        ">>> kaionb.random.normal(0.0, 2.0, 8, np.float16, seed=1).dtype\ndtype('float16')"),
    "integers": _Draw(
        "Draw integers uniformly from [low, high)", ", or [low, high] with ``endpoint``",
        "``high=None`` draws from [0, low).",
        {"low": ("int", "The lowest value (or the upper bound when ``high`` is None)."),
         "high": ("int, optional", "The upper bound (excluded{unless_endpoint})."),
         "dtype": ("dtype, optional", "Any integer dtype or bool; int64 by default."),
         "endpoint": ("bool, optional", "Include ``high``.")},
        (["bounds that are not ints", "a dtype that is not an integer type or bool"],
         ["bounds outside the dtype", "an empty interval (high <= low)"]),
        ">>> w = kaionb.random.default_rng(0).integers(-127, 128, size=(64, 64), "
        "dtype=np.int8)\n>>> w.dtype, int(w.min().item()) >= -127\n(dtype('int8'), True)",
        ">>> kaionb.random.integers(10, size=3, seed=0).dtype\ndtype('int64')"),
}

# The parameters every draw shares (type, description).
_PARAMS = {
    "size": ("int, tuple of int or None, optional", "The shape (None: 0-d{or_out})."),
    "dtype": ("dtype, optional", "One of float64 (default), float32, float16 or bfloat16."),
    "out": ("DeviceArray, optional", "A C-contiguous array of the shape and dtype to fill."),
    "seed": ("int, numpy.random.SeedSequence or None, optional",
             "Draw from ``default_rng(seed)``; None draws from the module's generator (seeded "
             "from fresh entropy on first use)."),
}


def _wrap(text: str) -> str:
    """A description under its numpydoc heading: indented 4, lines of at most 88."""
    return textwrap.fill(text, 88, initial_indent="    ", subsequent_indent="    ")


def _clauses(clauses: list) -> str:
    """``["a", "b", "c"]`` as the sentence "A, b, or c."."""
    text = ", ".join(clauses[:-1]) + ", or " + clauses[-1] if len(clauses) > 1 else clauses[0]
    return _wrap(text[0].upper() + text[1:] + ".")


def _docstring(fn) -> str:
    """The numpydoc docstring of the draw ``fn``: a Generator method or a module function."""
    name = fn.__name__
    draw = _DRAWS[name]
    method = fn.__qualname__ != name
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    entries = {**_PARAMS, **draw.params}
    fields = {"or_out": ", or ``out``'s shape" if "out" in params else "",
              "unless_endpoint": " unless ``endpoint``" if "endpoint" in params else ""}
    # each entry once, in signature order ("low, high" documents both)
    names = dict.fromkeys(next(k for k in entries if p in k.split(", ")) for p in params)
    parameters = [f"{n} : {entries[n][0]}\n{_wrap(entries[n][1].format(**fields))}"
                  for n in names]
    if method:
        summary = draw.summary + draw.more + "."
        if draw.notes:
            summary += "\n\n" + textwrap.fill(draw.notes, 88)
        type_errors, value_errors = draw.errors
        type_errors = type_errors + ["a ``size`` that is not an int or a tuple of ints"]
        value_errors = value_errors + ["a negative size"]
        if "out" in params:
            type_errors.append("an ``out`` that is not device memory or has another dtype")
            value_errors.append("an ``out`` of another shape or not C-contiguous")
        raises = f"TypeError\n{_clauses(type_errors)}\nValueError\n{_clauses(value_errors)}"
    else:
        summary = f"{draw.summary} (see :meth:`Generator.{name}`)."
        raises = f"TypeError, ValueError\n    As :meth:`Generator.{name}`, and for a bad seed."
    returns = " (``out`` itself when given)" if "out" in params else ""
    sections = {"Parameters": "\n".join(parameters),
                "Returns": f"DeviceArray\n    The draws{returns}.",
                "Raises": raises, "Examples": draw.method if method else draw.function}
    return summary + "".join(f"\n\n{title}\n{'-' * len(title)}\n{body}"
                             for title, body in sections.items()) + "\n"


def _documented(fn):
    """``fn`` with its docstring from the template (_docstring)."""
    fn.__doc__ = _docstring(fn)
    return fn


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

    @_documented
    def random(self, size=None, dtype=np.float64, *, out=None) -> DeviceArray:
        return uniform_fwd(self._philox, 0.0, 1.0, size, dtype, out=out, op="random")

    @_documented
    def uniform(self, low=0.0, high=1.0, size=None, dtype=np.float64, *,
                out=None) -> DeviceArray:
        return uniform_fwd(self._philox, low, high, size, dtype, out=out)

    @_documented
    def standard_normal(self, size=None, dtype=np.float64, *, out=None) -> DeviceArray:
        return normal_fwd(self._philox, 0.0, 1.0, size, dtype, out=out,
                          op="standard_normal")

    @_documented
    def normal(self, loc=0.0, scale=1.0, size=None, dtype=np.float64) -> DeviceArray:
        return normal_fwd(self._philox, loc, scale, size, dtype)

    @_documented
    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False, *,
                 out=None) -> DeviceArray:
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


@_documented
def standard_normal(size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    return _rng(seed).standard_normal(size, dtype)


@_documented
def normal(loc=0.0, scale=1.0, size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    return _rng(seed).normal(loc, scale, size, dtype)


@_documented
def uniform(low=0.0, high=1.0, size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    return _rng(seed).uniform(low, high, size, dtype)


@_documented
def integers(low, high=None, size=None, dtype=np.int64, *, seed=None) -> DeviceArray:
    return _rng(seed).integers(low, high, size, dtype)


@_documented
def random(size=None, dtype=np.float64, *, seed=None) -> DeviceArray:
    return _rng(seed).random(size, dtype)
