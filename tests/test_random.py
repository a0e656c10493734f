"""kaionb.random: Philox4x32-10 on the GPU against a NumPy reference of the same scheme.

The reference below is written from the Philox paper and the module doc of
kaionb/kernels/random.py (counter layout, values per block, element layout), in vectorized
uint64 NumPy, independent of the kernel code; it is itself checked against Random123's
published known-answer vectors. ``integers`` and ``random`` must match it bit for bit;
uniform with other bounds and the normals within the tolerances in ``TOL`` (the device's
log / sqrt / sincospi differ from NumPy's by an ulp or two).

CPU tests (no GPU): the reference, the device Philox function's Python version, the
kernels run in numba's CUDA simulator, and every validation error. GPU tests: marked.
"""

import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import kaionb
from kaionb import random as kr
from kaionb.array import bfloat16
from kaionb.kernels import random as K
from kaionb.testing import metadata_array, poisoned

gpu = pytest.mark.gpu
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLOATS = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), bfloat16]
INTS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                              np.uint32, np.uint64, np.bool_)]
ODD_SIZES = [1, 2, 3, 5, 7, 37, 1001, 4099]
# One place for the float tolerances against the float64 reference: (rtol, atol) for the
# normals, and the unit roundoff that scales uniform's absolute tolerance by max|bound|.
TOL = {np.dtype(np.float64): (1e-12, 1e-12), np.dtype(np.float32): (2e-6, 2e-6),
       np.dtype(np.float16): (2**-10, 1e-6), bfloat16: (2**-7, 1e-6)}
EPS = {np.dtype(np.float64): 2**-52, np.dtype(np.float32): 2**-23,
       np.dtype(np.float16): 2**-10, bfloat16: 2**-7}

# Random123 kat_vectors for philox4x32_10: (counter, key, output).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


# -- the reference ------------------------------------------------------------------------------

M32 = np.uint64(0xFFFFFFFF)
S32 = np.uint64(32)


def philox_ref(counter, key):
    """Philox4x32-10 of counters (4 arrays or ints) under key (k0, k1): 4 uint64 arrays
    holding the uint32 output words."""
    c0, c1, c2, c3 = (np.asarray(c, np.uint64) for c in counter)
    k0, k1 = np.asarray(key[0], np.uint64), np.asarray(key[1], np.uint64)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0  # < 2^64: no wrap
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> S32) ^ c1 ^ k0, p1 & M32, (p0 >> S32) ^ c3 ^ k1, p0 & M32
        k0 = (k0 + np.uint64(0x9E3779B9)) & M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & M32
    return c0, c1, c2, c3


def blocks_ref(key, offset, blocks):
    """The words of a draw's blocks: counters offset + i (mod 2^64), i < blocks."""
    t = np.uint64(offset) + np.arange(blocks, dtype=np.uint64)  # wraps like the device
    return philox_ref((t & M32, t >> S32, 0, 0), (key & 0xFFFFFFFF, key >> 32))


def mulhi64_ref(a, b):
    """floor(a·b / 2^64) for uint64 arrays, from 32-bit halves (no product overflows)."""
    a, b = np.asarray(a, np.uint64), np.asarray(b, np.uint64)
    al, ah, bl, bh = a & M32, a >> S32, b & M32, b >> S32
    cross = ((al * bl) >> S32) + ((ah * bl) & M32) + al * bh
    return ah * bh + ((ah * bl) >> S32) + (cross >> S32)


def _elements(values, n):
    """Element e = value e // B of block e % B (the module doc's layout)."""
    return np.concatenate(values)[:n]


def _unit24(x):
    return (x >> np.uint64(8)).astype(np.float64) * 2.0**-24


def _unit53(w):
    return (w >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _words64(x):
    return x[0] | (x[1] << S32), x[2] | (x[3] << S32)


def _v(dist, dt):
    return 2 if dist == "integers" or dt == np.float64 else 4


def uniform_ref(key, offset, n, dt, low=0.0, high=1.0):
    """float64 values before the final rounding to dt (exact for low=0, high=1)."""
    x = blocks_ref(key, offset, -(-n // _v("uniform", dt)))
    ct = np.float64 if dt == np.float64 else np.float32
    low_d, high_d = np.asarray(low).astype(dt), np.asarray(high).astype(dt)
    span = float(ct(high_d) - ct(low_d))
    top = max(float(np.nextafter(high_d, np.asarray(-np.inf, dt))), float(low_d))
    units = [_unit53(w) for w in _words64(x)] if dt == np.float64 else [_unit24(w) for w in x]
    return np.minimum(float(low_d) + span * _elements(units, n), top)


def normal_ref(key, offset, n, dt, loc=0.0, scale=1.0):
    """float64 Box-Muller on the device's exact uniforms."""
    x = blocks_ref(key, offset, -(-n // _v("normal", dt)))
    if dt == np.float64:
        w0, w1 = _words64(x)
        pairs = [(((w0 >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53,
                  _unit53(w1))]
    else:
        radius = [(w.astype(np.float32) * np.float32(2.0**-32) + np.float32(2.0**-33))
                  .astype(np.float64) for w in (x[0], x[2])]  # in float32, as the device
        pairs = [(radius[0], _unit24(x[1])), (radius[1], _unit24(x[3]))]
    values = []
    for u, v in pairs:
        r = np.sqrt(-2.0 * np.log(u))
        values += [r * np.cos(2 * np.pi * v), r * np.sin(2 * np.pi * v)]
    return loc + scale * _elements(values, n)


def integers_ref(key, offset, n, dt, low, high, endpoint=False):
    x = blocks_ref(key, offset, -(-n // 2))
    span = (high - low + (1 if endpoint else 0)) % 2**64
    low_bits = np.uint64(low % 2**64)
    values = [w if span == 0 else mulhi64_ref(w, span) for w in _words64(x)]
    with np.errstate(over="ignore"):
        flat = _elements(values, n) + low_bits  # mod 2^64: two's complement for signed
    return flat.astype(np.int64).astype(dt) if dt.kind == "i" else flat.astype(dt)


# -- CPU: the reference and the device functions ---------------------------------------------------

@pytest.mark.parametrize("counter, key, expected", KAT)
def test_philox_reference_known_answers(counter, key, expected):
    got = philox_ref(counter, key)
    assert tuple(int(w) for w in got) == expected


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_device_philox_python_version_known_answers(counter, key, expected):
    words = [np.uint32(c) for c in counter]
    got = K.philox4x32_10.py_func(*words, np.uint32(key[0]), np.uint32(key[1]))
    assert tuple(int(w) for w in got) == expected


def test_device_philox_python_version_matches_reference():
    rng = np.random.default_rng(3)
    counters = rng.integers(0, 2**32, size=(4, 40), dtype=np.uint64)
    keys = rng.integers(0, 2**32, size=(2, 40), dtype=np.uint64)
    ref = np.stack(philox_ref(counters, keys))
    for j in range(40):
        got = K.philox4x32_10.py_func(*(np.uint32(c) for c in counters[:, j]),
                                      np.uint32(keys[0, j]), np.uint32(keys[1, j]))
        assert [int(w) for w in got] == [int(w) for w in ref[:, j]], j


def test_mulhi64_reference():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 2**64, size=200, dtype=np.uint64, endpoint=False)
    for b in (1, 3, 2**32 - 1, 2**32 + 7, 2**63 + 12345, 2**64 - 1):
        assert [int(v) for v in mulhi64_ref(a, b)] == [int(v) * b >> 64 for v in a]


def test_generator_key_and_counter_from_seed():
    k0, k1 = np.random.SeedSequence(1234).generate_state(2, np.uint32)
    g = kr.Generator(1234)
    assert g.key == int(k0) | int(k1) << 32 and g.counter == 0
    assert kr.default_rng(1234).key == g.key and kr.Generator(1235).key != g.key
    assert kr.Generator(np.random.SeedSequence(1234)).key == g.key
    assert kr.default_rng(g) is g
    assert kr.Generator().key != kr.Generator().key  # fresh entropy
    assert kr.Generator(None).counter == 0


def test_values_per_block():
    assert [K.values_per_block("uniform", d) for d in FLOATS] == [2, 4, 4, 4]
    assert [K.values_per_block("normal", d) for d in FLOATS] == [2, 4, 4, 4]
    assert {K.values_per_block("integers", d) for d in INTS} == {2}


def test_philox_take_reserves_counters_and_wraps():
    p = K.Philox(key=5, counter=2**64 - 3)
    assert p.take(2) == 2**64 - 3 and p.take(4) == 2**64 - 1 and p.counter == 3


def test_draws_are_not_on_the_fast_path():
    # A fast_path replay would relaunch with the recorded counter offset: the same numbers.
    for fwd in (K.uniform_fwd, K.normal_fwd, K.integers_fwd):
        assert not hasattr(fwd, "uncached"), fwd


# The kernels themselves, in numba's CUDA simulator (a subprocess: the simulator is chosen at
# import). libdevice has no simulator version: the script gives plain-Python ones. Halves
# are left out (their stores are inline PTX).
_SIMULATE = r"""
import sys, warnings
import numpy as np
from numba import cuda
from numba.cuda import libdevice
warnings.simplefilter("ignore")
np.seterr(all="ignore")
libdevice.sincospif = lambda x: (np.float32(np.sin(np.pi * float(x))),
                                 np.float32(np.cos(np.pi * float(x))))
libdevice.sincospi = lambda x: (np.sin(np.pi * float(x)), np.cos(np.pi * float(x)))
libdevice.umul64hi = lambda a, b: np.uint64(int(a) % 2**64 * (int(b) % 2**64) >> 64).view(np.int64)
from kaionb.kernels import random as K
key, offset, n = 0x0123456789ABCDEF, 2**64 - 5, 37  # the counters wrap mid-draw
cases = {
    "uniform_float32": (np.float32, (-1.5, 4.0, float(np.nextafter(np.float32(2.5), -np.inf)))),
    "uniform_float64": (np.float64, (0.0, 1.0, 1.0 - 2**-53)),
    "normal_float32": (np.float32, (0.5, 2.0, 0.0)),
    "normal_float64": (np.float64, (0.0, 1.0, 0.0)),
    "integers_int8": (np.int8, (2**64 - 100, 200, 0)),
    "integers_int64": (np.int64, (2**63, 0, 0)),
    "integers_uint32": (np.uint32, (7, 1000, 0)),
}
results = {}
for name, (dt, params) in cases.items():
    dist = name.split("_")[0]
    kdef = K._KERNELS[dist, np.dtype(dt)]
    out = np.zeros(n, dt)
    cuda.jit(kdef.pyfunc)[2, 4](out, n, key, offset, *params)  # 8 threads: grid-stride
    results[name] = out
np.savez(sys.argv[1], **results)
"""


def test_kernels_in_the_simulator_match_the_reference():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.npz")
        env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": REPO}
        run = subprocess.run([sys.executable, "-c", _SIMULATE, path], env=env,
                             capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stderr
        got = dict(np.load(path))
    key, offset, n = 0x0123456789ABCDEF, 2**64 - 5, 37
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    np.testing.assert_allclose(got["uniform_float32"],
                               uniform_ref(key, offset, n, f32, -1.5, 2.5), rtol=0, atol=4e-7)
    np.testing.assert_array_equal(got["uniform_float64"], uniform_ref(key, offset, n, f64))
    np.testing.assert_allclose(got["normal_float32"],
                               normal_ref(key, offset, n, f32, 0.5, 2.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["normal_float64"], normal_ref(key, offset, n, f64),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got["integers_int8"],
                                  integers_ref(key, offset, n, np.dtype(np.int8), -100, 100))
    np.testing.assert_array_equal(got["integers_int64"], integers_ref(
        key, offset, n, np.dtype(np.int64), -(2**63), 2**63 - 1, endpoint=True))
    np.testing.assert_array_equal(got["integers_uint32"],
                                  integers_ref(key, offset, n, np.dtype(np.uint32), 7, 1007))


# -- CPU: validation, raised before any launch or allocation ------------------------------------

def _g():
    return kr.Generator(0)


@pytest.mark.parametrize("method", ["random", "standard_normal", "uniform", "normal"])
@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.uint8, "complex64", "nope"])
def test_float_draws_refuse_other_dtypes(method, dtype):
    with pytest.raises(TypeError, match=rf"^{method}: argument 'dtype' expected float64"):
        getattr(_g(), method)(size=3, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, bfloat16, "complex64"])
def test_integers_refuses_float_dtypes(dtype):
    with pytest.raises(TypeError, match="^integers: argument 'dtype' expected an integer"):
        _g().integers(0, 5, size=3, dtype=dtype)


@pytest.mark.parametrize("size, exc", [((3, -1), ValueError), (-2, ValueError),
                                       (2.5, TypeError), ((2, "a"), TypeError)])
@pytest.mark.parametrize("method", ["random", "standard_normal", "uniform", "integers"])
def test_bad_size(method, size, exc):
    g = _g()
    call = (lambda: g.integers(0, 9, size=size)) if method == "integers" else (
        lambda: getattr(g, method)(size=size))
    with pytest.raises(exc, match=rf"^{method}: argument 'size' expected"):
        call()
    assert g.counter == 0


@pytest.mark.parametrize("low, high, kwargs", [(5, 3, {}), (5, 5, {}), (0, None, {}),
                                               (5, 4, {"endpoint": True})])
def test_integers_low_ge_high(low, high, kwargs):
    match = "low > high" if kwargs else "low >= high"
    with pytest.raises(ValueError, match=f"^integers: argument 'high' expected .*{match}"):
        _g().integers(low, high, size=4, **kwargs)


@pytest.mark.parametrize("low, high, dtype, endpoint, name", [
    (-1, 10, np.uint8, False, "low"), (0, 257, np.uint8, False, "high"),
    (0, 256, np.uint8, True, "high"), (-129, 0, np.int8, False, "low"),
    (0, 2**63 + 1, np.int64, False, "high"), (0, 2**64, np.uint64, True, "high"),
    (0, 3, np.bool_, False, "high"), (0, 2, np.bool_, True, "high"),
])
def test_integers_bounds_outside_the_dtype(low, high, dtype, endpoint, name):
    with pytest.raises(ValueError, match=f"^integers: argument '{name}' .*out of bounds"):
        _g().integers(low, high, size=4, dtype=dtype, endpoint=endpoint)


def test_integers_bad_bound_types():
    with pytest.raises(TypeError, match="^integers: argument 'low' expected an int"):
        _g().integers(0.5, 3)
    with pytest.raises(TypeError, match="^integers: argument 'high' expected an int"):
        _g().integers(0, np.array([3, 4]))


@pytest.mark.parametrize("low, high, dtype, exc, name", [
    (2.0, 1.0, np.float64, ValueError, "high"), (0.0, np.inf, np.float64, ValueError, "high"),
    (np.nan, 1.0, np.float32, ValueError, "low"), (0.0, 1e5, np.float16, ValueError, "high"),
    (-3e38, 3e38, np.float32, ValueError, "high"), (-1e308, 1e308, np.float64, ValueError,
                                                    "high"),
    ("a", 1.0, np.float64, TypeError, "low"), (0.0, [1.0], np.float64, TypeError, "high"),
])
def test_uniform_bad_bounds(low, high, dtype, exc, name):
    with pytest.raises(exc, match=f"^uniform: argument '{name}' expected"):
        _g().uniform(low, high, size=4, dtype=dtype)


@pytest.mark.parametrize("loc, scale, name", [(0.0, -1.0, "scale"), (np.inf, 1.0, "loc"),
                                              (0.0, np.nan, "scale"), (0.0, 1e39, "scale")])
def test_normal_bad_parameters(loc, scale, name):
    with pytest.raises(ValueError, match=f"^normal: argument '{name}' expected"):
        _g().normal(loc, scale, size=4, dtype=np.float32)


@pytest.mark.parametrize("seed, exc", [(-1, ValueError), ("x", TypeError), (1.5, TypeError)])
def test_bad_seed(seed, exc):
    with pytest.raises(exc, match="^Generator: argument 'seed' expected"):
        kr.Generator(seed)


def test_bad_out_is_refused_before_the_gpu():
    g = _g()
    with pytest.raises(TypeError, match="^random: argument 'out' expected dtype float64"):
        g.random(4, out=metadata_array((4,), np.float32))
    with pytest.raises(ValueError, match="^standard_normal: argument 'out' expected shape"):
        g.standard_normal((4, 2), np.float32, out=metadata_array((4, 3), np.float32))
    with pytest.raises(ValueError, match="^integers: argument 'out' expected a C-contiguous"):
        g.integers(0, 5, size=(4, 2), dtype=np.int8,
                   out=metadata_array((4, 4), np.int8)[:, ::2])
    with pytest.raises(TypeError, match="^uniform: argument 'out' expected device memory"):
        g.uniform(size=3, out=np.zeros(3))
    assert g.counter == 0


# -- GPU ------------------------------------------------------------------------------------------

def _host(a):
    return a.get() if isinstance(a, kaionb.DeviceArray) else a


def _bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.itemsize}") if a.dtype.kind != "b" else a


@gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("n", ODD_SIZES + [2**16 + 3])
def test_random_bit_exact(dtype, n):
    g = kr.Generator(n)
    g._philox.counter = 2**64 - 7  # the counters wrap inside the draw
    key, offset = g.key, g.counter
    got = g.random(n, dtype).get()
    assert got.dtype == dtype and got.shape == (n,)
    ref = uniform_ref(key, offset, n, dtype).astype(dtype)
    np.testing.assert_array_equal(_bits(got), _bits(ref))
    assert g.counter == (offset + -(-n // K.values_per_block("uniform", dtype))) % 2**64


INT_CASES = [(0, 10, False), (-5, 7, False), (-3, 3, True)]


def _int_cases(dt):
    if dt.kind == "b":
        return [(0, 2, False), (0, 1, True), (1, 1, True)]
    info = np.iinfo(dt)
    cases = [(int(info.min), int(info.max), True), (int(info.min), int(info.max), False),
             (3, 10, True)]
    return cases + [c for c in INT_CASES if c[0] >= info.min]


@gpu
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("n", [1, 7, 1001])
def test_integers_bit_exact(dtype, n):
    g = kr.Generator(int(n) + dtype.itemsize)
    for low, high, endpoint in _int_cases(dtype):
        key, offset = g.key, g.counter
        got = g.integers(low, high, size=n, dtype=dtype, endpoint=endpoint).get()
        ref = integers_ref(key, offset, n, dtype, low, high, endpoint)
        np.testing.assert_array_equal(got, ref, err_msg=f"[{low}, {high}] endpoint={endpoint}")
        assert g.counter == offset + -(-n // 2)


@gpu
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
def test_integers_in_range(dtype):
    g = kr.Generator(9)
    n = 2**16 + 1
    for low, high, endpoint in _int_cases(dtype):
        got = g.integers(low, high, size=n, dtype=dtype, endpoint=endpoint).get()
        last = high if endpoint else high - 1
        assert got.dtype == dtype and got.shape == (n,)
        assert int(got.min()) >= low and int(got.max()) <= last, (low, high, endpoint)
        if last - low < 256:  # every value shows up (a miss has probability < 1e-100)
            assert len(np.unique(got)) == last - low + 1, (low, high, endpoint)
    # high=None draws from [0, low)
    got = g.integers(5, size=1000, dtype=dtype if dtype.kind != "b" else np.int8).get()
    assert got.min() >= 0 and got.max() <= 4


@gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("low, high", [(-2.5, 7.25), (1000.0, 1001.0), (-1.0, -1.0)])
def test_uniform_matches_reference(dtype, low, high):
    g = kr.Generator(17)
    key, offset = g.key, g.counter
    n = 4099
    got = g.uniform(low, high, n, dtype).get()
    ref = uniform_ref(key, offset, n, dtype, low, high)
    atol = EPS[dtype] * max(abs(low), abs(high))
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=0, atol=atol)
    low_d, high_d = (float(np.asarray(b).astype(dtype)) for b in (low, high))
    assert (got.astype(np.float64) >= low_d).all()
    assert (got.astype(np.float64) < high_d).all() or (got == low_d).all() and low_d == high_d


@gpu
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), bfloat16], ids=lambda d: d.name)
def test_uniform_half_never_rounds_to_high(dtype):
    # [1, 1.5): f32 values within half an ulp of 1.5 round to it; the clamp keeps them below.
    got = kr.Generator(5).uniform(1.0, 1.5, 2**20, dtype).get().astype(np.float64)
    top = float(np.nextafter(np.asarray(1.5, dtype), np.asarray(-np.inf, dtype)))
    assert got.max() == top and got.min() >= 1.0


@gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("n", [1, 3, 6, 4099])
def test_normal_matches_reference(dtype, n):
    g = kr.Generator(23)
    rtol, atol = TOL[dtype]
    key, offset = g.key, g.counter
    got = g.standard_normal(n, dtype).get()
    np.testing.assert_allclose(got.astype(np.float64), normal_ref(key, offset, n, dtype),
                               rtol=rtol, atol=atol)
    key, offset = g.key, g.counter
    got = g.normal(-3.0, 0.5, n, dtype).get()
    np.testing.assert_allclose(got.astype(np.float64),
                               normal_ref(key, offset, n, dtype, -3.0, 0.5),
                               rtol=rtol, atol=atol * 4)


@gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_moments(dtype):
    n = 2**20
    g = kr.Generator(2024)
    z = g.standard_normal(n, dtype).get().astype(np.float64)
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert np.isfinite(z).all() and np.abs(z).max() < 9
    u = g.random(n, dtype).get().astype(np.float64)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 5 * math.sqrt((1 / 80 - 1 / 144) / n)
    x = g.normal(3.0, 2.0, n, dtype).get().astype(np.float64)
    assert abs(x.mean() - 3) < 5 * 2 / math.sqrt(n)
    assert abs(x.var() / 4 - 1) < 5 * math.sqrt(2 / n) + EPS[dtype]


@gpu
def test_reproducible_and_successive_draws_differ():
    for method, args in [("random", ()), ("standard_normal", ()), ("uniform", (-1.0, 2.0)),
                         ("integers", (0, 1000))]:
        a, b = kr.default_rng(7), kr.default_rng(7)
        first = getattr(a, method)(*args, size=1001).get()
        np.testing.assert_array_equal(first, getattr(b, method)(*args, size=1001).get())
        second = getattr(a, method)(*args, size=1001).get()
        assert (first != second).mean() > 0.9, method
        np.testing.assert_array_equal(second, getattr(b, method)(*args, size=1001).get())
    x1 = kr.default_rng(1).standard_normal(1000).get()
    x2 = kr.default_rng(2).standard_normal(1000).get()
    assert (x1 != x2).all()


@gpu
def test_module_functions():
    np.testing.assert_array_equal(kr.standard_normal(100, np.float32, seed=3).get(),
                                  kr.Generator(3).standard_normal(100, np.float32).get())
    np.testing.assert_array_equal(kr.uniform(-1, 1, 100, seed=3).get(),
                                  kr.Generator(3).uniform(-1, 1, 100).get())
    np.testing.assert_array_equal(kr.integers(0, 50, 100, np.int16, seed=3).get(),
                                  kr.Generator(3).integers(0, 50, 100, np.int16).get())
    np.testing.assert_array_equal(kr.random(100, seed=3).get(), kr.Generator(3).random(100).get())
    assert (kr.random(100).get() != kr.random(100).get()).all()  # the shared generator moves on
    assert kr.normal(1.0, 2.0, (2, 3)).shape == (2, 3)


@gpu
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=lambda d: d.name)
def test_size_none_is_0d_and_zero_sizes_are_empty(dtype):
    g = kr.Generator(0)
    draw = ((lambda size: g.integers(0, 2, size=size, dtype=dtype)) if dtype in INTS
            else (lambda size: g.random(size, dtype)))
    x = draw(None)
    assert x.shape == () and x.dtype == dtype and x.get().shape == ()
    counter = g.counter
    assert counter == 1
    for size in [0, (0,), (3, 0), (0, 5, 2)]:
        e = draw(size)
        assert e.size == 0 and e.shape == ((size,) if isinstance(size, int) else size)
    assert g.counter == counter  # nothing drawn, no counters used


@gpu
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 7), (1,)])
def test_shapes_and_out(shape):
    g = kr.Generator(31)
    n = math.prod(shape)
    key, offset = g.key, g.counter
    x = g.random(shape, np.float32)
    assert x.shape == shape
    np.testing.assert_array_equal(x.get().ravel(),
                                  uniform_ref(key, offset, n, np.dtype(np.float32)))
    out = poisoned(shape, np.int32)
    key, offset = g.key, g.counter
    assert g.integers(-9, 9, dtype=np.int32, out=out) is out  # size None: out's shape
    np.testing.assert_array_equal(out.get().ravel(),
                                  integers_ref(key, offset, n, np.dtype(np.int32), -9, 9))
    out = poisoned(shape, bfloat16)
    g.standard_normal(shape, bfloat16, out=out)
    assert np.isfinite(out.get().astype(np.float32)).all()
    with pytest.raises(ValueError, match="C-contiguous"):
        g.random(out=poisoned((4, 6), np.float64)[:, ::2])


@gpu
def test_draws_capture_in_a_cuda_graph():
    g = kr.Generator(77)
    key, offset = g.key, g.counter
    with kaionb.graph() as graph:
        x = g.random(1001, np.float32)
        y = g.integers(0, 100, size=501, dtype=np.int16)
    assert g.counter == offset + 251 + 251
    graph.replay()
    np.testing.assert_array_equal(x.get(), uniform_ref(key, offset, 1001, np.dtype(np.float32)))
    first_y = y.get()
    np.testing.assert_array_equal(first_y, integers_ref(key, offset + 251, 501,
                                                        np.dtype(np.int16), 0, 100))
    graph.replay()  # the counters are captured: a replay repeats the draw
    np.testing.assert_array_equal(y.get(), first_y)
    graph.close()
