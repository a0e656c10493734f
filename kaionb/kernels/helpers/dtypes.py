"""How each dtype kaionb stores is held in a kernel, and computed with.

A kernel over arbitrary dtypes (elementwise ops, reductions, gathers) reads each element
in its *storage* type, decodes it to its *compute* type, works there, and encodes the
result back to the output's storage type:

- float16 / bfloat16: stored as uint16 bit patterns (numba's own half arithmetic goes
  through a slow NVRTC shim), computed in float32, rounded to nearest even on the way
  out by PTX ``cvt`` — NumPy computes its float16 ufuncs in float32 the same way.
- bool: stored as uint8 (0 or 1), computed as a numba boolean.
- everything else: stored and computed as itself.

``converter(src, dst)`` is the decode of a ``src`` element into ``dst``'s compute type,
rounding through ``dst`` when ``dst`` is a half type (so that mixing dtypes gives what
NumPy gives: it casts the input to the loop's dtype first).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
from llvmlite import ir
from numba import boolean, float32, float64, int8, int16, int32, int64, types, uint8, uint16
from numba import uint32, uint64
from numba.cuda.extending import intrinsic

from kaionb.ptx_patches import (bf16x2_to_f32x2, cvt_rn_bf16x2_f32, cvt_rn_f16x2_f32,
                                device_function, f16x2_to_f32x2)

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
HALF_DTYPES = (np.dtype(np.float16), BFLOAT16)
BOOL = np.dtype(np.bool_)


@device_function
def f16_bits_to_f32(bits):
    return f16x2_to_f32x2(uint32(bits))[0]


@device_function
def bf16_bits_to_f32(bits):
    return bf16x2_to_f32x2(uint32(bits))[0]


@device_function
def f32_to_f16_bits(x):
    return uint16(cvt_rn_f16x2_f32(float32(x), float32(0.0)) & 0xFFFF)


@device_function
def f32_to_bf16_bits(x):
    return uint16(cvt_rn_bf16x2_f32(float32(x), float32(0.0)) & 0xFFFF)


@device_function
def _bool_from_storage(x):
    return x != 0


@device_function
def _bool_to_storage(x):
    return uint8(1) if x else uint8(0)


def _cast(numba_type):
    @device_function
    def cast(x):
        return numba_type(x)

    return cast


# dtype -> (storage type name for array signatures, numba compute type)
_TYPES = {
    np.dtype(np.float64): ("float64", float64),
    np.dtype(np.float32): ("float32", float32),
    np.dtype(np.float16): ("uint16", float32),
    BFLOAT16: ("uint16", float32),
    np.dtype(np.int64): ("int64", int64),
    np.dtype(np.int32): ("int32", int32),
    np.dtype(np.int16): ("int16", int16),
    np.dtype(np.int8): ("int8", int8),
    np.dtype(np.uint64): ("uint64", uint64),
    np.dtype(np.uint32): ("uint32", uint32),
    np.dtype(np.uint16): ("uint16", uint16),
    np.dtype(np.uint8): ("uint8", uint8),
    BOOL: ("uint8", boolean),
}
_CASTS = {dt: _cast(t) for dt, (_, t) in _TYPES.items()}
_DECODE = {np.dtype(np.float16): f16_bits_to_f32, BFLOAT16: bf16_bits_to_f32,
           BOOL: _bool_from_storage}
_ENCODE = {np.dtype(np.float16): f32_to_f16_bits, BFLOAT16: f32_to_bf16_bits,
           BOOL: _bool_to_storage}


def storage(dt: np.dtype) -> str:
    """The numba type name a ``dt`` array is declared with in a kernel signature."""
    return _TYPES[np.dtype(dt)][0]


def compute_type(dt: np.dtype):
    """The numba type a ``dt`` value is computed in."""
    return _TYPES[np.dtype(dt)][1]


def scalar_type_name(dt: np.dtype) -> str:
    """The kernel-signature name of a scalar argument computed as ``dt``."""
    t = compute_type(dt)
    return "boolean" if t is boolean else str(t)


def host_scalar(value, dt: np.dtype):
    """``value`` as the host number a kernel scalar argument of ``dt`` takes: rounded to
    ``dt`` first (a half scalar is the half nearest to it, passed as float32)."""
    rounded = np.asarray(value).astype(dt)
    if dt in HALF_DTYPES:
        return float(rounded.astype(np.float32))
    return rounded.item()


def decode(dt: np.dtype):
    """Device function: a stored ``dt`` element -> its compute value."""
    return _DECODE.get(np.dtype(dt), _CASTS[np.dtype(dt)])


def encode(dt: np.dtype):
    """Device function: a compute value (any numeric type) -> ``dt``'s storage."""
    dt = np.dtype(dt)
    return _ENCODE.get(dt, _CASTS[dt])  # the half encoders cast to float32 first


def converter(src: np.dtype, dst: np.dtype):
    """Device function: a stored ``src`` element -> ``dst``'s compute value, as NumPy's
    cast of ``src`` to ``dst`` would give it."""
    src, dst = np.dtype(src), np.dtype(dst)
    dec = decode(src)
    if src == dst:
        return dec
    if dst == BOOL:
        @device_function
        def to_bool(x):
            return dec(x) != 0

        return to_bool
    if dst in HALF_DTYPES:
        enc, dec_dst = encode(dst), decode(dst)

        @device_function
        def through_half(x):
            return dec_dst(enc(float32(dec(x))))

        return through_half
    cast = _CASTS[dst]

    @device_function
    def convert(x):
        return cast(dec(x))

    return convert


# -- elements packed in 16-byte words4 (vector loads and stores of any dtype) ----------------

def _bitcast(from_type, to_type, ir_type):
    """An intrinsic reinterpreting a ``from_type`` value's bits as ``to_type`` (an LLVM
    bitcast: same width)."""
    @intrinsic
    def bitcast(typingctx, value):
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir_type)

        return to_type(from_type), codegen

    return bitcast


# The float32 whose bit pattern is a uint32, and back; the same for float64 and uint64.
f32_from_bits = _bitcast(types.uint32, types.float32, ir.FloatType())
f32_to_bits = _bitcast(types.float32, types.uint32, ir.IntType(32))
_f64_from_bits = _bitcast(types.uint64, types.float64, ir.DoubleType())
_f64_to_bits = _bitcast(types.float64, types.uint64, ir.IntType(64))


@functools.cache
def word_codec(dt: np.dtype):
    """``(get, put)``: device functions between a words4 (four uint32, 16 bytes, little
    endian) and the ``16 // itemsize`` elements of ``dt`` in it, in ``dt``'s storage
    type: ``get(words, k)`` is element k; ``put(w, k, value)`` ors element k's bits into
    the local uint32 array ``w`` (zeroed by the caller). ``k`` a compile-time constant
    after unrolling, so everything stays in registers."""
    dt = np.dtype(dt)
    size = dt.itemsize
    store_type = getattr(types, storage(dt))
    if size == 8:
        is_float = dt.kind == "f"

        @device_function
        def get(words, k):
            bits = uint64(words[2 * k]) | (uint64(words[2 * k + 1]) << uint64(32))
            return _f64_from_bits(bits) if is_float else store_type(bits)

        @device_function
        def put(w, k, value):
            bits = _f64_to_bits(value) if is_float else uint64(value)
            w[2 * k] = uint32(bits & uint64(0xFFFFFFFF))
            w[2 * k + 1] = uint32(bits >> uint64(32))
    elif size == 4:
        is_float = dt.kind == "f"

        @device_function
        def get(words, k):
            return f32_from_bits(words[k]) if is_float else store_type(words[k])

        @device_function
        def put(w, k, value):
            w[k] = f32_to_bits(value) if is_float else uint32(value)
    else:
        PER = 4 // size
        BITS = 8 * size
        MASK = (1 << BITS) - 1

        @device_function
        def get(words, k):
            return store_type((words[k // PER] >> uint32((k % PER) * BITS)) & uint32(MASK))

        @device_function
        def put(w, k, value):
            w[k // PER] |= (uint32(value) & uint32(MASK)) << uint32((k % PER) * BITS)
    return get, put
