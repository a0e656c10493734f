"""Scalar arithmetic with NumPy's semantics, as device functions on compute values.

One function per ufunc and *loop kind* — "f" (float32 or float64: halves are computed in
float32, see :mod:`.dtypes`), "i" (signed), "u" (unsigned), "b" (bool). The elementwise
kernels and reductions call these on values already converted to the loop's compute type;
``scalar_op(name, kind, T)`` picks one (``T`` is the numba compute type, for typed
constants: a literal ``1`` would widen float32 work to float64).

Where NumPy and C differ, NumPy wins:

- integer ``//`` and ``%`` round toward −∞ (Python's rule), and a zero divisor gives 0
  (NumPy warns; a kernel cannot);
- float ``//`` and ``%`` follow NumPy's ``npy_divmod``: ``fmod``, then a correction so the
  remainder takes the divisor's sign, ``floor_divide`` = ``floor((a - mod) / b)``, signed
  zeros kept;
- ``maximum`` / ``minimum`` propagate NaN from either side;
- integer ``**`` multiplies by squaring and wraps like NumPy. A negative integer exponent
  is an error in NumPy, which a kernel cannot raise: it gives the integral part of the
  true power (1 for base 1, ±1 for base −1, else 0); the host refuses a negative scalar
  exponent before launching.
"""

from __future__ import annotations

import math

from kaionb.ptx_patches import device_function


def _arith():
    @device_function
    def add(a, b):
        return a + b

    @device_function
    def subtract(a, b):
        return a - b

    @device_function
    def multiply(a, b):
        return a * b

    @device_function
    def true_divide(a, b):
        return a / b

    @device_function
    def negative(a):
        return -a

    @device_function
    def positive(a):
        return a

    @device_function
    def absolute(a):
        return abs(a)

    @device_function
    def square(a):
        return a * a

    return dict(add=add, subtract=subtract, multiply=multiply, true_divide=true_divide,
                negative=negative, positive=positive, absolute=absolute, square=square)


def _compare():
    @device_function
    def equal(a, b):
        return a == b

    @device_function
    def not_equal(a, b):
        return a != b

    @device_function
    def less(a, b):
        return a < b

    @device_function
    def less_equal(a, b):
        return a <= b

    @device_function
    def greater(a, b):
        return a > b

    @device_function
    def greater_equal(a, b):
        return a >= b

    @device_function
    def maximum(a, b):
        return a if (a > b or a != a) else b  # a NaN on either side wins

    @device_function
    def minimum(a, b):
        return a if (a < b or a != a) else b

    @device_function
    def logical_and(a, b):
        return a != 0 and b != 0

    @device_function
    def logical_or(a, b):
        return a != 0 or b != 0

    @device_function
    def logical_xor(a, b):
        return (a != 0) != (b != 0)

    @device_function
    def logical_not(a):
        return a == 0

    return dict(equal=equal, not_equal=not_equal, less=less, less_equal=less_equal,
                greater=greater, greater_equal=greater_equal, maximum=maximum, minimum=minimum,
                logical_and=logical_and, logical_or=logical_or, logical_xor=logical_xor,
                logical_not=logical_not)


def _bitwise():
    @device_function
    def bitwise_and(a, b):
        return a & b

    @device_function
    def bitwise_or(a, b):
        return a | b

    @device_function
    def bitwise_xor(a, b):
        return a ^ b

    @device_function
    def invert(a):
        return ~a

    @device_function
    def invert_bool(a):
        return not a

    return dict(bitwise_and=bitwise_and, bitwise_or=bitwise_or, bitwise_xor=bitwise_xor,
                invert=invert), invert_bool


def _float_ops(T):
    """Ops whose float versions need constants of the compute type ``T``."""
    one, zero, half = T(1.0), T(0.0), T(0.5)

    @device_function
    def floor_divide(a, b):
        if b == zero:
            return a / b  # ±inf or NaN, as NumPy
        mod = math.fmod(a, b)
        div = (a - mod) / b
        if mod != zero and ((b < zero) != (mod < zero)):
            div -= one
        if div == zero:
            return math.copysign(zero, a / b)
        floor = math.floor(div)
        if div - floor > half:
            floor += one
        return floor

    @device_function
    def remainder(a, b):
        if b == zero:
            return math.fmod(a, b)  # NaN
        mod = math.fmod(a, b)
        if mod == zero:
            return math.copysign(zero, b)
        if (b < zero) != (mod < zero):
            mod += b
        return mod

    @device_function
    def power(a, b):
        return a ** b

    @device_function
    def exp(a):
        return math.exp(a)

    @device_function
    def log(a):
        return math.log(a)

    @device_function
    def sqrt(a):
        return math.sqrt(a)

    @device_function
    def rsqrt(a):
        return one / math.sqrt(a)

    @device_function
    def sin(a):
        return math.sin(a)

    @device_function
    def cos(a):
        return math.cos(a)

    @device_function
    def tanh(a):
        return math.tanh(a)

    @device_function
    def sigmoid(a):
        return one / (one + math.exp(-a))

    @device_function
    def floor_(a):
        return math.floor(a)

    @device_function
    def ceil(a):
        return math.ceil(a)

    @device_function
    def sign(a):
        if a != a:
            return a
        return one if a > zero else (-one if a < zero else zero)

    @device_function
    def isnan(a):
        return a != a

    @device_function
    def isinf(a):
        return math.isinf(a)

    @device_function
    def isfinite(a):
        return math.isfinite(a)

    return dict(floor_divide=floor_divide, remainder=remainder, power=power, exp=exp, log=log,
                sqrt=sqrt, rsqrt=rsqrt, sin=sin, cos=cos, tanh=tanh, sigmoid=sigmoid,
                floor=floor_, ceil=ceil, sign=sign, isnan=isnan, isinf=isinf,
                isfinite=isfinite)


def _int_ops(T, signed: bool):
    """Integer versions (``T`` the compute type), NumPy's rounding and zero rules."""
    one, zero = T(1), T(0)

    @device_function
    def floor_divide(a, b):
        if b == zero:
            return zero
        return T(a // b)  # numba's // floors, as Python and NumPy do

    @device_function
    def remainder(a, b):
        if b == zero:
            return zero
        return T(a % b)

    @device_function
    def power(a, b):
        if signed and b < zero:
            if a == one:
                return one
            if a == -one:
                return one if b % 2 == 0 else -one
            return zero
        result = one
        base = a
        e = b
        while e > zero:
            if e & one:
                result = T(result * base)
            base = T(base * base)
            e >>= one
        return result

    @device_function
    def sign(a):
        return one if a > zero else (-one if a < zero else zero)

    @device_function
    def identity(a):
        return a

    @device_function
    def never(a):
        return False

    @device_function
    def always(a):
        return True

    return dict(floor_divide=floor_divide, remainder=remainder, power=power, sign=sign,
                floor=identity, ceil=identity, isnan=never, isinf=never, isfinite=always)


_ARITH = _arith()
_COMPARE = _compare()
_BITWISE, _INVERT_BOOL = _bitwise()
_TYPED: dict = {}


def scalar_op(name: str, kind: str, T):
    """The device function for ufunc ``name`` on a loop of ``kind`` computed in ``T``."""
    if name == "invert" and kind == "b":
        return _INVERT_BOOL
    for table in (_ARITH, _COMPARE, _BITWISE):
        if name in table:
            return table[name]
    key = (kind, T)
    ops = _TYPED.get(key)
    if ops is None:
        ops = _TYPED[key] = _float_ops(T) if kind == "f" else _int_ops(T, kind == "i")
    if name not in ops:
        raise KeyError(f"scalar_op: no {name!r} for {kind!r} loops")
    return ops[name]
