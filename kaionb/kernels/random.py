"""Random numbers drawn on the GPU with Philox4x32-10, a counter-based generator.

Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3",
SC 2011, https://www.thesalmons.org/john/random123/papers/random123sc11.pdf — curand's
``curandStatePhilox4_32_10``) maps a 128-bit counter (c0, c1, c2, c3) and a 64-bit key
(k0, k1) to four random 32-bit words by ten rounds of

    (c0, c1, c2, c3) <- (hi(M1·c2) ^ c1 ^ k0,  lo(M1·c2),  hi(M0·c0) ^ c3 ^ k1,  lo(M0·c0))

(32×32 → 64-bit products), the key bumped by the Weyl constants (W0, W1) between rounds.
Every block is a pure function of (counter, key): a thread computes the blocks it needs
directly, and the device keeps no generator state.

**Counters.** A :class:`Philox` holds a 64-bit key (kaionb.random.Generator derives it
from its seed: ``SeedSequence(seed).generate_state(2, uint32)`` gives k0, k1) and the
count of blocks used so far. A draw of B blocks takes the next B counters and moves the
count on by B: block i of a draw is Philox((lo32(t), hi32(t), 0, 0), (k0, k1)) with
t = offset + i (mod 2^64), ``offset`` the count before the draw. The key, the offset, the
size and the distribution's parameters go in as kernel scalar arguments: a draw copies
nothing to the device and never waits for it (stream-ordered, capturable in a CUDA graph;
a replay of the graph launches with the captured arguments, so it repeats the numbers
drawn at capture).

**Values.** A block's words x0..x3 give V values:

- float32, float16, bfloat16 (computed in float32; halves rounded to nearest even at the
  store): V = 4 — uniforms (x >> 8)·2^-24 in [0, 1); normals by Box-Muller, two from each
  of the pairs (x0, x1) and (x2, x3): (r cos 2πv, r sin 2πv) with r = sqrt(-2 ln u) from
  the first word, u = x·2^-32 + 2^-33 in (0, 1] (so |z| <= 6.77), and v = (x >> 8)·2^-24
  from the second.
- float64: the 64-bit words w0 = x0 | x1 << 32, w1 = x2 | x3 << 32; V = 2 — uniforms
  (w >> 11)·2^-53; one Box-Muller pair, u = ((w0 >> 11) + 1)·2^-53 in (0, 1] (|z| <= 8.58)
  and v = (w1 >> 11)·2^-53.
- integers and bool: the same 64-bit words, V = 2 (one word per value, whatever the
  dtype's width): low + hi64(w·R) for the R = high - low values of [low, high), modulo
  2^64 and truncated to the dtype (R = 2^64, the whole 64-bit range, is passed as 0 and
  takes w as is). hi64(w·R) = floor(w·R / 2^64) takes each value for floor(2^64/R) or
  ceil(2^64/R) of the 2^64 words, so each probability is within 2^-64 of 1/R — off by at
  most R/2^64 relatively (below 2^-32 for any range of a 32-bit or narrower dtype); no
  word is rejected, so a draw's block count is known before it runs.

Uniforms are ``low + (high - low)·u`` clamped to ``top``, the largest value of the output
dtype below ``high``: rounding (to float32, or float32 to a half) can never give ``high``.

**Elements.** n elements take B = ceil(n / V) blocks; element e is value e // B of block
e % B. Thread i of a grid-stride loop over blocks writes elements i, i + B, ..., i + (V-1)B:
each of a warp's V store instructions covers 32 consecutive elements, coalesced for every
dtype and every address ``out=`` may start at. (V consecutive elements per thread would
stride each store instruction by V elements, or need a vector store and the alignment that
comes with it.) So an element's value depends on n, not only on its index: a draw is
reproduced from the seed and the sequence of (distribution, size) calls.
"""

from __future__ import annotations

import math
import numbers
import threading

import numpy as np
from numba import cuda, float32, float64, int64, uint32, uint64
from numba.cuda import libdevice

from .._device import current_allocator, multiprocessor_count
from ..array import bfloat16, normalize_shape
from ..ptx_patches import device_function
from ..validation import as_dtype, as_out, check_contiguous, check_out, fail
from .helpers.dtypes import HALF_DTYPES, compute_type, encode, storage
from .launch import kernel
from .op import C_CONTIGUOUS, Plan, device_guard, output, run

# Philox4x32 multipliers and Weyl key increments (Random123, philox.h).
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10

THREADS = 256
# Up to 8 blocks of 256 threads per SM: the 2048 threads an SM holds at <= 32 registers
# (ptxas gives most variants 20-32; the float64 normals up to 38). The grid-stride loop
# over Philox blocks takes the rest.
BLOCKS_PER_SM = 8

FLOAT_DTYPES = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), bfloat16)
INT_DTYPES = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8,
                                          np.uint16, np.uint32, np.uint64, np.bool_))
FLOAT_NAMES = "float64, float32, float16 or bfloat16"

_MASK32 = uint64(0xFFFFFFFF)
_U64 = 2**64


# -- device helpers ---------------------------------------------------------------------------

@device_function
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """The four uint32 words of Philox4x32-10 for counter (c0..c3) and key (k0, k1)."""
    for _ in range(ROUNDS):
        p0 = uint64(PHILOX_M0) * uint64(c0)  # mul.wide.u32: hi and lo in one product
        p1 = uint64(PHILOX_M1) * uint64(c2)
        c0, c1, c2, c3 = (uint32((p1 >> uint64(32)) ^ uint64(c1) ^ uint64(k0)),
                          uint32(p1 & _MASK32),
                          uint32((p0 >> uint64(32)) ^ uint64(c3) ^ uint64(k1)),
                          uint32(p0 & _MASK32))
        # The bump after the last round is dead code (folded away on the device).
        k0 = uint32((uint64(k0) + uint64(PHILOX_W0)) & _MASK32)
        k1 = uint32((uint64(k1) + uint64(PHILOX_W1)) & _MASK32)
    return c0, c1, c2, c3


@device_function
def _word64(lo, hi):
    return uint64(lo) | (uint64(hi) << uint64(32))


@device_function
def _unit_f32(x):
    """[0, 1) from the top 24 bits: every value a multiple of 2^-24, exact in float32."""
    return float32(x >> uint32(8)) * float32(2.0**-24)


@device_function
def _unit_f64(w):
    """[0, 1) from the top 53 bits of a 64-bit word."""
    return float64(w >> uint64(11)) * float64(2.0**-53)


@device_function
def _box_muller_f32(xr, xt):
    # u in (0, 1]: the log never sees 0. sincospi reduces its argument exactly in
    # registers; sinf/cosf's reduction for large arguments takes a 32-byte stack frame.
    u = float32(xr) * float32(2.0**-32) + float32(2.0**-33)
    r = math.sqrt(float32(-2.0) * math.log(u))
    s, c = libdevice.sincospif(float32(2.0) * _unit_f32(xt))
    return r * c, r * s


@device_function
def _box_muller_f64(wr, wt):
    u = float64((wr >> uint64(11)) + uint64(1)) * float64(2.0**-53)  # (0, 1]
    r = math.sqrt(float64(-2.0) * math.log(u))
    s, c = libdevice.sincospi(float64(2.0) * _unit_f64(wt))
    return r * c, r * s


@device_function
def _uniform4(x0, x1, x2, x3, low, span, top):
    return (min(low + span * _unit_f32(x0), top), min(low + span * _unit_f32(x1), top),
            min(low + span * _unit_f32(x2), top), min(low + span * _unit_f32(x3), top))


@device_function
def _uniform2(x0, x1, x2, x3, low, span, top):
    return (min(low + span * _unit_f64(_word64(x0, x1)), top),
            min(low + span * _unit_f64(_word64(x2, x3)), top))


@device_function
def _normal4(x0, x1, x2, x3, loc, scale, unused):
    z0, z1 = _box_muller_f32(x0, x1)
    z2, z3 = _box_muller_f32(x2, x3)
    return loc + scale * z0, loc + scale * z1, loc + scale * z2, loc + scale * z3


@device_function
def _normal2(x0, x1, x2, x3, loc, scale, unused):
    z0, z1 = _box_muller_f64(_word64(x0, x1), _word64(x2, x3))
    return loc + scale * z0, loc + scale * z1


@device_function
def _bounded(w, low, span):
    """low + floor(w·span / 2^64) (mod 2^64); span 0 stands for 2^64."""
    if span == uint64(0):
        return low + w
    return low + uint64(libdevice.umul64hi(int64(w), int64(span)))


@device_function
def _integers2(x0, x1, x2, x3, low, span, unused):
    return _bounded(_word64(x0, x1), low, span), _bounded(_word64(x2, x3), low, span)


def _store2(enc):
    @device_function
    def store(out, i, blocks, n, v):
        out[i] = enc(v[0])
        if i + blocks < n:
            out[i + blocks] = enc(v[1])

    return store


def _store4(enc):
    @device_function
    def store(out, i, blocks, n, v):
        out[i] = enc(v[0])
        if i + blocks < n:
            out[i + blocks] = enc(v[1])
        if i + 2 * blocks < n:
            out[i + 2 * blocks] = enc(v[2])
        if i + 3 * blocks < n:
            out[i + 3 * blocks] = enc(v[3])

    return store


# -- kernels ------------------------------------------------------------------------------------

def values_per_block(dist: str, dt) -> int:
    """V of the module doc: the values one Philox block gives ``dist`` in dtype ``dt``."""
    return 4 if dist != "integers" and compute_type(dt) is float32 else 2


def _make_random_kernel(dist, dt):
    """out[e] for e < n: ``dist`` ("uniform", "normal", "integers") in dtype ``dt``, from
    key and the blocks' counters offset + i. One parameter list (a, b, c) for all, so one
    kernel body: uniform (low, span = high - low, top), normal (loc, scale, unused),
    integers (low, span, unused) as uint64 bit patterns."""
    V = values_per_block(dist, dt)
    draw = {("uniform", 4): _uniform4, ("uniform", 2): _uniform2, ("normal", 4): _normal4,
            ("normal", 2): _normal2, ("integers", 2): _integers2}[dist, V]
    store = (_store4 if V == 4 else _store2)(encode(dt))
    scalar = "uint64" if dist == "integers" else str(compute_type(dt))

    @kernel([f"void({storage(dt)}[::1], int64, uint64, uint64, {scalar}, {scalar}, {scalar})"],
            name=f"_random_{dist}_fwd_kernel_{dt.name}")
    def _random_fwd_kernel(out, n, key, offset, a, b, c):
        k0 = uint32(key & _MASK32)
        k1 = uint32(key >> uint64(32))
        blocks = (n + (V - 1)) // V
        i = int64(cuda.blockIdx.x) * int64(cuda.blockDim.x) + int64(cuda.threadIdx.x)
        step = int64(cuda.gridDim.x) * int64(cuda.blockDim.x)
        while i < blocks:
            t = offset + uint64(i)
            x0, x1, x2, x3 = philox4x32_10(uint32(t & _MASK32), uint32(t >> uint64(32)),
                                           uint32(0), uint32(0), k0, k1)
            store(out, i, blocks, n, draw(x0, x1, x2, x3, a, b, c))
            i += step

    return _random_fwd_kernel


_KERNELS = {(dist, dt): _make_random_kernel(dist, dt)
            for dist, dtypes in (("uniform", FLOAT_DTYPES), ("normal", FLOAT_DTYPES),
                                 ("integers", INT_DTYPES))
            for dt in dtypes}


# -- host side -----------------------------------------------------------------------------------

class Philox:
    """A Philox key and the next unused block counter (see the module doc). ``take(B)``
    reserves B counters and returns the first; thread-safe, so two threads drawing from
    one generator never share counters."""

    def __init__(self, key: int, counter: int = 0):
        self.key = key
        self.counter = counter
        self._lock = threading.Lock()

    def take(self, blocks: int) -> int:
        with self._lock:
            first = self.counter
            self.counter = (first + blocks) % _U64
        return first


# The fwds below are not wrapped in kernels.op.fast_path: its replay would launch with the
# recorded counter offset and repeat the earlier draw. Every draw must take new counters.

@device_guard
def uniform_fwd(philox, low, high, size, dtype, *, out=None, op="uniform"):
    """Validate; launch unless empty: U[low, high) in ``dtype``, of shape ``size`` (None:
    0-d, or out's shape). Returns the output."""
    dt = as_dtype(op, "dtype", dtype, FLOAT_DTYPES, FLOAT_NAMES)
    shape = _size(op, size, out)
    low_d, high_d = _finite(op, "low", low, dt), _finite(op, "high", high, dt)
    if low_d > high_d:
        fail(ValueError, op, "high", f"a value >= low ({low})", high)
    ct = _compute_dtype(dt)
    with np.errstate(over="ignore"):
        span = ct.type(high_d) - ct.type(low_d)
    if not np.isfinite(span):
        fail(ValueError, op, "high", f"high - low finite in {ct}", f"{high} - {low}")
    # The largest dt value below high (low itself when low == high): the clamp of the doc.
    top = max(np.nextafter(np.asarray(high_d, dt), np.asarray(-np.inf, dt)), low_d)
    out = _output(op, out, shape, dt)
    params = (float(low_d), float(span), float(top))
    return run(_launch, "uniform", philox, params, out=out)


@device_guard
def normal_fwd(philox, loc, scale, size, dtype, *, out=None, op="normal"):
    """Validate; launch unless empty: N(loc, scale²) in ``dtype`` (computed in float32 for
    float32 and the halves), of shape ``size``. Returns the output."""
    dt = as_dtype(op, "dtype", dtype, FLOAT_DTYPES, FLOAT_NAMES)
    shape = _size(op, size, out)
    ct = _compute_dtype(dt)
    loc_c, scale_c = _finite(op, "loc", loc, ct), _finite(op, "scale", scale, ct)
    if scale_c < 0:
        fail(ValueError, op, "scale", "a value >= 0", scale)
    out = _output(op, out, shape, dt)
    return run(_launch, "normal", philox, (float(loc_c), float(scale_c), 0.0), out=out)


@device_guard
def integers_fwd(philox, low, high, size, dtype, endpoint=False, *, out=None):
    """Validate; launch unless empty: integers in [low, high) ([low, high] with
    ``endpoint``) in ``dtype`` (integer or bool), of shape ``size``. Returns the output."""
    op = "integers"
    dt = as_dtype(op, "dtype", dtype, INT_DTYPES, "an integer or bool dtype")
    shape = _size(op, size, out)
    low, high = _integer(op, "low", low), _integer(op, "high", high)
    info = (0, 1) if dt.kind == "b" else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
    last = high if endpoint else high - 1  # the largest value asked for
    if low < info[0]:
        fail(ValueError, op, "low", f"low >= {info[0]}", f"{low} (low is out of bounds for {dt})")
    if last > info[1]:
        bound = f"high <= {info[1]} (endpoint=True)" if endpoint else f"high <= {info[1] + 1}"
        fail(ValueError, op, "high", bound, f"{high} (high is out of bounds for {dt})")
    if last < low:
        if endpoint:
            fail(ValueError, op, "high", "high >= low (endpoint=True)",
                 f"low > high (low={low}, high={high})")
        fail(ValueError, op, "high", "high > low", f"low >= high (low={low}, high={high})")
    out = _output(op, out, shape, dt)
    params = (low % _U64, (last - low + 1) % _U64, 0)  # two's complement bits; 2^64 -> 0
    return run(_launch, "integers", philox, params, out=out)


def _launch(dist, philox, params, out):
    """Reserve the draw's counters (only now: a refused call uses none) and launch."""
    n = out.size
    blocks = -(-n // values_per_block(dist, out.dtype))
    offset = philox.take(blocks)
    grid = (min(-(-blocks // THREADS), multiprocessor_count() * BLOCKS_PER_SM),)
    Plan.of(_KERNELS[dist, out.dtype], grid, (THREADS,)).launch(
        out.reshape(-1), n, philox.key, offset, *params)


def _output(op, out, shape, dt):
    """A new array, or ``out`` checked: dtype, shape and layout first (C-contiguous: the
    kernel writes flat indices), then the device, which asks the GPU."""
    device = None
    if out is not None:
        out = check_out(op, out, shape, dt)
        check_contiguous(op, "out", out)
        device = current_allocator()[1]
    return output(op, out, shape, dt, device=device, layout=C_CONTIGUOUS)


def _size(op, size, out):
    """The output shape: ``size``; None is 0-d, or out's shape when out is given."""
    if size is None:
        return () if out is None else tuple(as_out(op, out).shape)
    try:
        return normalize_shape(size, op)
    except (TypeError, ValueError) as exc:
        fail(type(exc), op, "size", "None, an int >= 0 or a tuple of them", repr(size))


def _compute_dtype(dt):
    return np.dtype(np.float32) if dt in HALF_DTYPES else dt


def _finite(op, name, value, dt):
    """``value`` rounded to ``dt``, refused unless a real number finite in ``dt``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        fail(TypeError, op, name, "a real number", type(value).__name__)
    with np.errstate(over="ignore"):  # overflow to inf is refused below
        rounded = np.asarray(value).astype(dt)[()]
    if not np.isfinite(float(rounded)):
        fail(ValueError, op, name, f"a value finite in {dt}", value)
    return rounded


def _integer(op, name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral,
                                                                      np.integer)):
        fail(TypeError, op, name, "an int", type(value).__name__)
    return int(value)
