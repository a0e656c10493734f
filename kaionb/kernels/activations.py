"""Element-wise activations: the fused SiLU gate and GELU (exact and tanh forms), and
their backward passes.

    fused_silu_gate: y = x · sigmoid(x) · gate = x · gate / (1 + e^(−x))
                     (SwiGLU's gate, Shazeer 2020, https://arxiv.org/abs/2002.05202)
        backward:    dx = g · gate · σ · (1 + x·(1 − σ)),  dgate = g · x · σ,  σ = sigmoid(x)
    gelu "none":     y = x · Φ(x) = ½ x (1 + erf(x / √2))
                     (Hendrycks & Gimpel 2016, https://arxiv.org/abs/1606.08415)
        backward:    dx = g · (Φ(x) + x·φ(x)),  φ(x) = e^(−x²/2) / √(2π)
    gelu "tanh":     y = ½ x (1 + tanh(u)),  u = √(2/π) (x + 0.044715 x³)
                     computed as x · s, s = 1 / (1 + e^(−2u)) (the same function; one ex2 and
                     one rcp instead of tanh.approx, whose 2^-11 error would miss float32's 1e-5)
        backward:    dx = g · (s + 2x · s(1 − s) · √(2/π) (1 + 3·0.044715 x²))

Arithmetic in float32: e^t as ``ex2.approx`` of t·log2(e), 1/t as ``rcp.approx`` (~1-2 ulp
each). Φ: libdevice ``erff`` for the float32 forward (its results are checked at 1e-5) and
``erfcf`` for the float32 backward (see ``_gelu_erf_bwd``); for float16 and bfloat16 a
branch-free erfc (:func:`phi_approx_f32`: one rcp, one ex2, ten fma), because ``erff`` —
two branches, ~30 instructions — left the half kernels issue-bound at 71-76% of copy
bandwidth (they carry twice f32's elements per byte; docs/perf-log-primitives.md).

Pure streaming: each input read once, each output written once, 16 bytes per access (the
gradient arrays of a half-type backward in float32: two words4 per eight elements), a
grid-stride loop sized to the GPU. Bytes moved for N elements of itemsize s (s_g: the
gradient's): fused_silu_gate 3·N·s, gelu 2·N·s; fused_silu_gate_bwd N·(2·s + 3·s_g),
gelu_bwd N·(s + 2·s_g).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64, uint32

from ..array import DeviceArray
from ..ptx_patches import (
    device_function,
    ex2_approx_f32,
    global_addr,
    rcp_approx_f32,
)
from ..validation import (
    as_array,
    check_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
    fail,
)
from .helpers.rowwise import (
    CODECS,
    FLOAT_DTYPES,
    MAP_THREADS,
    MAP_UNROLL,
    chunk_io,
    elementwise_views,
    map_plan,
    rows_view,
)
from .helpers.vector import vector_group
from .launch import kernel
from .op import LAST_AXIS, Plan, fast_path, output, outputs, record, run

LOG2E = 1.4426950408889634
SQRT_HALF = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327  # 1/√(2π)
GELU_TANH_C = 0.7978845608028654  # √(2/π)
GELU_TANH_A = 0.044715
F32 = np.dtype(np.float32)

# Φ for the half types. Numerical Recipes' erfcc (Press et al., Numerical Recipes, 2nd ed.,
# §6.2; a Chebyshev fit): for z >= 0, t = 1 / (1 + z/2) and
#     erfc(z) = t · exp(−z² + P(t)),   P(t) = Σ_k ERFC_P[k] · t^k,
# relative error below 1.2e-7 for every z >= 0 (tests/test_activations.py measures
# 1.05e-7 at z = 4.74 on a dense grid of [0, 10] against math.erfc). With z = |x|/√2 and
# the ½ and log2(e) folded into the coefficients:
#     Φ(−|x|) = ½ erfc(|x|/√2) = t · 2^(Q(t) − x²·log2(e)/2),   Q = P·log2(e) − 1,
# Φ(x) = Φ(−|x|) for x < 0, 1 − Φ(−|x|) otherwise. Max error of Φ over x in [−14, 14]:
# 4.2e-8 absolute and 1.05e-7 relative in exact arithmetic; in float32 (exact exp2 and
# reciprocal) 2.4e-7 absolute, and 4.2e-6 relative for |x| <= 8 (the rounding of x² in
# the exponent; past that Φ nears float32's subnormals) — 7 to 15 bits below the half
# types' 2^-11 and 2^-8. ex2.approx and rcp.approx add ~2 ulp each.
ERFC_P = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
          -1.13520398, 1.48851587, -0.82215223, 0.17087277)
PHI_Q = tuple(c * LOG2E - (1.0 if k == 0 else 0.0) for k, c in enumerate(ERFC_P))
PHI_T = 0.5 * SQRT_HALF  # t = 1 / (1 + |x|·PHI_T)
PHI_X2 = -0.5 * LOG2E  # the exponent's −x²·log2(e)/2


# -- element functions: (x, gate, g) -> (out, out2), float32 -------------------------------
# Forward functions return (y, 0); backward ones (dx, dgate) (gelu: (dx, 0)). A one-input
# op's gate and a forward's g are never loaded (their values are undefined).

@device_function
def phi_approx_f32(x):
    """Φ(x), the standard normal CDF, branch-free (the half types' GELU; see PHI_Q)."""
    t = rcp_approx_f32(abs(x) * float32(PHI_T) + float32(1.0))
    q = float32(PHI_Q[9]) * t + float32(PHI_Q[8])
    q = q * t + float32(PHI_Q[7])
    q = q * t + float32(PHI_Q[6])
    q = q * t + float32(PHI_Q[5])
    q = q * t + float32(PHI_Q[4])
    q = q * t + float32(PHI_Q[3])
    q = q * t + float32(PHI_Q[2])
    q = q * t + float32(PHI_Q[1])
    q = q * t + float32(PHI_Q[0])
    low = t * ex2_approx_f32(x * float32(PHI_X2) * x + q)  # Φ(−|x|); (x·c)·x + q: one fma
    return low if x < float32(0.0) else float32(1.0) - low


@device_function
def _phi_erff(x):
    return float32(0.5) * (float32(1.0) + math.erf(x * float32(SQRT_HALF)))


@device_function
def _sigmoid(x):
    return rcp_approx_f32(float32(1.0) + ex2_approx_f32(-x * float32(LOG2E)))


@device_function
def _silu_gate(x, gate, g):
    return x * gate * _sigmoid(x), float32(0.0)


@device_function
def _silu_gate_bwd(x, gate, g):
    s = _sigmoid(x)
    gs = g * s
    return gs * gate * (float32(1.0) + x * (float32(1.0) - s)), gs * x


@device_function
def _gelu_erf(x, gate, g):
    return x * _phi_erff(x), float32(0.0)


@device_function
def _gelu_erf_half(x, gate, g):
    return x * phi_approx_f32(x), float32(0.0)


@device_function
def _normal_pdf(x):
    return ex2_approx_f32(x * x * float32(PHI_X2)) * float32(INV_SQRT_2PI)


@device_function
def _phi_erfc(x):
    return float32(0.5) * math.erfc(x * float32(-SQRT_HALF))


@device_function
def _gelu_erf_bwd(x, gate, g):
    # Φ through erfcf: ½(1 + erf) keeps only Φ's bits above 2^-24 for negative x, and
    # Φ + x·φ cancels there (1% off at x = −5).
    return g * (_phi_erfc(x) + x * _normal_pdf(x)), float32(0.0)


@device_function
def _gelu_erf_half_bwd(x, gate, g):
    return g * (phi_approx_f32(x) + x * _normal_pdf(x)), float32(0.0)


@device_function
def _gelu_tanh_s(x):
    """s = 1 / (1 + e^(−2u)) = ½ (1 + tanh u)."""
    u2 = float32(-2.0 * GELU_TANH_C * LOG2E) * (x + float32(GELU_TANH_A) * x * x * x)
    return rcp_approx_f32(float32(1.0) + ex2_approx_f32(u2))


@device_function
def _gelu_tanh(x, gate, g):
    return x * _gelu_tanh_s(x), float32(0.0)


@device_function
def _gelu_tanh_bwd(x, gate, g):
    s = _gelu_tanh_s(x)
    du = float32(2.0 * GELU_TANH_C) * (float32(1.0) + float32(3.0 * GELU_TANH_A) * x * x)
    return g * (s + x * s * (float32(1.0) - s) * du), float32(0.0)


# -- the kernel ------------------------------------------------------------------------------

def _make_activation_kernel(codec, fn, two_inputs, name, grad_codec=None):
    """``(out, out2) = fn(x, gate, g)`` element-wise over [rows, n] views; one-input ops
    (gate = x) skip the second load (it cost 9% of gelu's bandwidth in L1/L2 traffic).
    Forward (``grad_codec`` None): g and out2 are not touched, out = fn's first value.
    Backward: g, out (dx) and out2 (dgate, two-input ops only) are in grad_codec's dtype,
    moved in groups of x's VEC elements (a float32 group under half x: two words4).
    ``aligned``: every words4 is whole and 16-byte aligned (no edge checks)."""
    VEC = codec.vec
    S = codec.storage
    BACKWARD = grad_codec is not None
    # Vectors per thread per step. The backward's loads (x, gate and a float32 g: 16 words
    # a vector) at MAP_UNROLL took 148 registers, one 256-thread block per SM.
    U = MAP_UNROLL // 2 if BACKWARD else MAP_UNROLL
    GS = grad_codec.storage if BACKWARD else S
    ocodec = grad_codec if BACKWARD else codec  # g, out and out2
    # Aligned vectors by 64-bit address (a flat view's row may pass 4 GiB); the edge path
    # through the codecs' masked loads and stores (chunk_io).
    x_ld, x_unpack, _, XW = vector_group(codec, VEC)
    o_ld, o_unpack, o_st, GW = vector_group(ocodec, VEC)
    xio, oio = chunk_io(codec, VEC), chunk_io(ocodec, VEC)
    x_load, o_load, o_store = xio.load, oio.load, oio.store
    head_of = codec.head
    RAWX = XW * U
    RAWG = GW * U if BACKWARD else 1
    TWO_OUTPUTS = BACKWARD and two_inputs

    @kernel([f"void({S}[:, :], {S}[:, :], {GS}[:, :], {GS}[:, :], {GS}[:, :], int64, int32)"],
            name=name)
    def _activation_kernel(x, gate, g, out, out2, n, aligned):
        rx = cuda.local.array(RAWX, uint32)
        rg = cuda.local.array(RAWX, uint32)
        rd = cuda.local.array(RAWG, uint32)
        f = cuda.local.array(VEC, float32)
        h = cuda.local.array(VEC, float32)
        d = cuda.local.array(VEC, float32)
        T = int64(cuda.blockDim.x)
        first = int64(cuda.blockIdx.x) * T * U + int64(cuda.threadIdx.x)
        stride = int64(cuda.gridDim.x) * T * U
        for r in range(int64(cuda.blockIdx.y), int64(x.shape[0]), int64(cuda.gridDim.y)):
            if aligned:
                nv = n // VEC
                for v0 in range(first, nv, stride):
                    for u in range(U):
                        v = v0 + u * T
                        if v < nv:
                            x_ld(global_addr(x, (r, v * VEC)), rx, XW * u)
                            if two_inputs:
                                x_ld(global_addr(gate, (r, v * VEC)), rg, XW * u)
                            if BACKWARD:
                                o_ld(global_addr(g, (r, v * VEC)), rd, GW * u)
                    for u in range(U):
                        v = v0 + u * T
                        if v < nv:
                            x_unpack(rx, XW * u, f)
                            if two_inputs:
                                x_unpack(rg, XW * u, h)
                            if BACKWARD:
                                o_unpack(rd, GW * u, d)
                            for j in range(VEC):
                                f[j], h[j] = fn(f[j], h[j], d[j])
                            o_st(global_addr(out, (r, v * VEC)), f)
                            if TWO_OUTPUTS:
                                o_st(global_addr(out2, (r, v * VEC)), h)
            else:
                head = int64(head_of(x, r))
                nv = (head + n + VEC - 1) // VEC
                for v0 in range(first, nv, stride):
                    for u in range(U):
                        v = v0 + u * T
                        if v < nv:
                            e0 = v * VEC - head
                            x_load(x, r, e0, n, 0, rx, 0)
                            x_unpack(rx, 0, f)
                            if two_inputs:
                                x_load(gate, r, e0, n, 0, rg, 0)
                                x_unpack(rg, 0, h)
                            if BACKWARD:
                                o_load(g, r, e0, n, 0, rd, 0)
                                o_unpack(rd, 0, d)
                            for j in range(VEC):
                                f[j], h[j] = fn(f[j], h[j], d[j])
                            o_store(out, r, e0, n, f)
                            if TWO_OUTPUTS:
                                o_store(out2, r, e0, n, h)

    return _activation_kernel


def _grad_dtypes(dt):
    """The gradient dtypes a backward kernel exists for: float32, and x's own."""
    return tuple(dict.fromkeys((F32, dt)))


# gelu's ``approximate`` argument → (forward, backward) element functions for float32 and
# for the half types, and the kernel-name suffix.
_GELU_FORMS = {"none": ((_gelu_erf, _gelu_erf_bwd), (_gelu_erf_half, _gelu_erf_half_bwd), ""),
               "tanh": ((_gelu_tanh, _gelu_tanh_bwd), (_gelu_tanh, _gelu_tanh_bwd), "tanh_")}


def _gelu_fns(approximate, dt):
    f32_fns, half_fns, _ = _GELU_FORMS[approximate]
    return f32_fns if dt == F32 else half_fns


_SILU_GATE_KERNELS = {
    dt: _make_activation_kernel(c, _silu_gate, True, f"_fused_silu_gate_fwd_kernel_{dt.name}")
    for dt, c in CODECS.items()}
_SILU_GATE_BWD_KERNELS = {
    (dt, gdt): _make_activation_kernel(
        c, _silu_gate_bwd, True, f"_fused_silu_gate_bwd_kernel_{dt.name}_grad_{gdt.name}",
        CODECS[gdt])
    for dt, c in CODECS.items() for gdt in _grad_dtypes(dt)}
_GELU_KERNELS = {
    (approximate, dt): _make_activation_kernel(c, _gelu_fns(approximate, dt)[0], False,
                                               f"_gelu_fwd_kernel_{suffix}{dt.name}")
    for approximate, (_, _, suffix) in _GELU_FORMS.items() for dt, c in CODECS.items()}
_GELU_BWD_KERNELS = {
    (approximate, dt, gdt): _make_activation_kernel(
        c, _gelu_fns(approximate, dt)[1], False,
        f"_gelu_bwd_kernel_{suffix}{dt.name}_grad_{gdt.name}", CODECS[gdt])
    for approximate, (_, _, suffix) in _GELU_FORMS.items() for dt, c in CODECS.items()
    for gdt in _grad_dtypes(dt)}


# -- host ------------------------------------------------------------------------------------

def _activation_launch(op, kdef, x, gate, g, out, out2):
    """One grid-stride launch over [rows, n] views (one long row when all are contiguous).
    The forward passes x as g and out as out2 (never touched)."""
    xv, gv, dv, ov, ov2 = elementwise_views(op, x=x, gate=gate, grad=g, out=out, out2=out2)
    grid, aligned = map_plan(CODECS[x.dtype], xv, gv, dv, ov, ov2)
    Plan.of(kdef, grid, (MAP_THREADS,)).launch(xv, gv, dv, ov, ov2, xv.shape[1], aligned)


def _check_approximate(op, approximate):
    if not isinstance(approximate, str):
        fail(TypeError, op, "approximate", "'none' or 'tanh'", type(approximate).__name__)
    if approximate not in _GELU_FORMS:
        fail(ValueError, op, "approximate", "'none' or 'tanh'", repr(approximate))


def _grad_operand(op, grad, x):
    """The output gradient: x's shape, x's dtype or float32, on x's device; copied to C
    order when its rows are not a [rows, n] view (the tape may hand any layout)."""
    grad = as_array(op, "grad", grad, dtypes=_grad_dtypes(x.dtype))
    check_shape(op, "grad", grad, x.shape)
    check_same_device(op, x=x, grad=grad)
    if grad.is_c_contiguous:
        return grad
    if grad.ndim and grad.shape[-1] > 1 and grad.strides[-1] != grad.itemsize:
        return grad.copy()
    try:
        rows_view(op, "grad", grad)
    except ValueError:
        return grad.copy()
    return grad


@fast_path
def fused_silu_gate_fwd(x, gate, *, out=None):
    """Validate and resolve ``out``; launch unless x is empty. Returns ``out``."""
    op = "fused_silu_gate"
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    gate = as_array(op, "gate", gate, dtypes=FLOAT_DTYPES)
    check_shape(op, "gate", gate, x.shape)
    check_same_dtype(op, x=x, gate=gate)
    check_same_device(op, x=x, gate=gate)
    check_contiguous(op, "x", x, last_axis_only=True)
    check_contiguous(op, "gate", gate, last_axis_only=True)
    out = output(op, out, x.shape, x.dtype, device=x.device_id)
    return run(_activation_launch, op, _SILU_GATE_KERNELS[x.dtype], x, gate, x, out, out=out)


@fast_path
def gelu_fwd(x, approximate="none", *, out=None):
    """Validate and resolve ``out``; launch unless x is empty. Returns ``out``."""
    op = "gelu"
    _check_approximate(op, approximate)
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    check_contiguous(op, "x", x, last_axis_only=True)
    out = output(op, out, x.shape, x.dtype, device=x.device_id)
    # One input: the gate argument is x again, and the kernel never loads it.
    return run(_activation_launch, op, _GELU_KERNELS[approximate, x.dtype], x, x, x, out,
               out=out)


@fast_path
def fused_silu_gate_bwd(grad, x, gate, *, out=None):
    """Backward of :func:`fused_silu_gate`: ``(dx, dgate)`` for the output gradient ``grad``.

    dx = grad·gate·σ·(1 + x·(1 − σ)), dgate = grad·x·σ, σ = sigmoid(x) — in one pass
    over x, gate and grad.

    Parameters
    ----------
    grad : DeviceArray or array_like
        The gradient of the output: x's shape, x's dtype or float32, any layout.
    x, gate : DeviceArray or array_like
        The forward's inputs.
    out : tuple of DeviceArray, optional
        (dx, dgate) to write: x's shape, grad's dtype, last axis contiguous.

    Returns
    -------
    dx : DeviceArray
        The gradient of x, in grad's dtype.
    dgate : DeviceArray
        The gradient of gate, in grad's dtype.

    Raises
    ------
    TypeError
        The forward's type checks, a ``grad`` dtype other than x's or float32, or an
        ``out`` that is not a pair of device arrays of grad's dtype.
    ValueError
        The forward's shape and layout checks, a ``grad`` of another shape, or ``out``
        arrays of other shapes.

    Examples
    --------
    >>> x = kaionb.asarray([[0.0, 1.0]], dtype=np.float32)
    >>> dx, dgate = kaionb.fused_silu_gate_bwd(kaionb.ones_like(x), x, kaionb.ones_like(x))
    >>> dx.get().round(4)
    array([[0.5   , 0.9277]], dtype=float32)
    """
    op = "fused_silu_gate_bwd"
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    gate = as_array(op, "gate", gate, dtypes=FLOAT_DTYPES)
    check_shape(op, "gate", gate, x.shape)
    check_same_dtype(op, x=x, gate=gate)
    check_same_device(op, x=x, gate=gate)
    check_contiguous(op, "x", x, last_axis_only=True)
    check_contiguous(op, "gate", gate, last_axis_only=True)
    grad = _grad_operand(op, grad, x)
    grads = outputs(op, out, [(x.shape, grad.dtype, LAST_AXIS)] * 2, device=x.device_id)
    return run(_activation_launch, op, _SILU_GATE_BWD_KERNELS[x.dtype, grad.dtype], x, gate,
               grad, out=grads)


@fast_path
def gelu_bwd(grad, x, approximate="none", *, out=None):
    """Backward of :func:`gelu`: ``dx = grad·GELU'(x)``, in one pass over x and grad.

    GELU' as in the module doc of ``kaionb.kernels.activations``.

    Parameters
    ----------
    grad : DeviceArray or array_like
        The gradient of the output: x's shape, x's dtype or float32, any layout.
    x : DeviceArray or array_like
        The forward's input.
    approximate : {"none", "tanh"}, optional
        The forward's form.
    out : DeviceArray, optional
        An array of x's shape in grad's dtype to write.

    Returns
    -------
    DeviceArray
        The gradient dx, in grad's dtype.

    Raises
    ------
    TypeError
        The forward's type checks, or a ``grad`` dtype other than x's or float32.
    ValueError
        The forward's checks (``approximate``, layout), a ``grad`` of another shape, or
        an ``out`` of another shape.

    Examples
    --------
    >>> x = kaionb.asarray([0.0], dtype=np.float32)
    >>> kaionb.gelu_bwd(kaionb.ones_like(x), x).get()
    array([0.5], dtype=float32)
    """
    op = "gelu_bwd"
    _check_approximate(op, approximate)
    x = as_array(op, "x", x, dtypes=FLOAT_DTYPES)
    check_contiguous(op, "x", x, last_axis_only=True)
    grad = _grad_operand(op, grad, x)
    out = output(op, out, x.shape, grad.dtype, device=x.device_id)
    return run(_activation_launch, op, _GELU_BWD_KERNELS[approximate, x.dtype, grad.dtype],
               x, x, grad, out, out=out)


# -- references ------------------------------------------------------------------------------

def phi_approx(x, dtype=np.float64):
    """NumPy twin of :func:`phi_approx_f32` (same constants, same steps) in ``dtype``
    arithmetic, with exact exp2 and reciprocal: the approximation's own error (float64)
    or with float32 rounding (float32), for the CPU tests."""
    x = np.asarray(x, dtype)
    c = [dtype(q) for q in PHI_Q]
    t = (dtype(1.0) / (np.abs(x) * dtype(PHI_T) + dtype(1.0))).astype(dtype)
    q = c[9] * t + c[8]
    for k in range(7, -1, -1):
        q = (q * t + c[k]).astype(dtype)
    low = (t * np.exp2((x * dtype(PHI_X2) * x + q).astype(dtype))).astype(dtype)
    return np.where(x < 0, low, dtype(1.0) - low)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def fused_silu_gate_ref(x, gate):
    """float64 NumPy reference."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x)) * np.asarray(gate, np.float64)


def gelu_ref(x, approximate="none"):
    """float64 NumPy reference (erf through math.erf, vectorized)."""
    x = np.asarray(x, np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(GELU_TANH_C * (x + GELU_TANH_A * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x * SQRT_HALF))


def fused_silu_gate_bwd_ref(grad, x, gate):
    """float64 NumPy reference of :func:`fused_silu_gate_bwd`: (dx, dgate)."""
    g, x, gate = (np.asarray(a, np.float64) for a in (grad, x, gate))
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-x))
    return g * gate * s * (1.0 + x * (1.0 - s)), g * x * s


def gelu_bwd_ref(grad, x, approximate="none"):
    """float64 NumPy reference of :func:`gelu_bwd`."""
    g, x = np.asarray(grad, np.float64), np.asarray(x, np.float64)
    if approximate == "tanh":
        th = np.tanh(GELU_TANH_C * (x + GELU_TANH_A * x ** 3))
        return g * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_TANH_C
                    * (1.0 + 3.0 * GELU_TANH_A * x * x))
    phi = np.exp(-0.5 * x * x) * INV_SQRT_2PI
    return g * (0.5 * (1.0 + _erf(x * SQRT_HALF)) + x * phi)


# -- the public functions --------------------------------------------------------------------

def _needs_grad(*arrays):
    return any(type(a) is DeviceArray and a.requires_grad for a in arrays)


def fused_silu_gate(x, gate, *, out=None):
    """Compute ``x * sigmoid(x) * gate`` elementwise: the SiLU-gated feed-forward gate.

    The LLaMA / Mistral / Qwen feed-forward gate in one pass. On the tape
    (:func:`fused_silu_gate_bwd`).

    Parameters
    ----------
    x, gate : DeviceArray or array_like
        The same shape and dtype (float32, float16 or bfloat16), last axis contiguous.
    out : DeviceArray, optional
        An array of x's shape and dtype to write.

    Returns
    -------
    DeviceArray
        The gated activations (``out`` itself when given).

    Raises
    ------
    TypeError
        An argument that is not a float32 / float16 / bfloat16 array, mixed dtypes, or an
        ``out`` that is not device memory or has another dtype.
    ValueError
        Shapes that differ, a non-contiguous last axis, arrays on two devices, or an
        ``out`` of another shape.

    Examples
    --------
    >>> x = kaionb.asarray([-1.0, 0.0, 1.0], dtype=np.float32)
    >>> kaionb.fused_silu_gate(x, kaionb.full_like(x, 2.0)).get().round(4)
    array([-0.5379,  0.    ,  1.4621], dtype=float32)
    """
    y = fused_silu_gate_fwd(x, gate, out=out)
    if _needs_grad(x, gate):
        record(lambda g: fused_silu_gate_bwd(g, x, gate), (x, gate), (y,))
    return y


def gelu(x, approximate="none", *, out=None):
    """Apply GELU elementwise: ``x · Φ(x)``, exact (erf) or the tanh form.

    ``approximate="none"`` the exact erf form, ``"tanh"`` the tanh form (as
    torch.nn.functional.gelu). Φ is libdevice's erff for float32 and a branch-free
    approximation for the half types (relative error ~1e-7 in exact arithmetic; module
    doc of ``kaionb.kernels.activations``). On the tape (:func:`gelu_bwd`).

    Parameters
    ----------
    x : DeviceArray or array_like
        An array of float32, float16 or bfloat16, last axis contiguous.
    approximate : {"none", "tanh"}, optional
        The form.
    out : DeviceArray, optional
        An array of x's shape and dtype to write.

    Returns
    -------
    DeviceArray
        GELU(x) (``out`` itself when given).

    Raises
    ------
    TypeError
        ``x`` that is not a float32 / float16 / bfloat16 array, an ``approximate`` that
        is not a string, or an ``out`` that is not device memory or has another dtype.
    ValueError
        An ``approximate`` other than "none" or "tanh", a non-contiguous last axis, or an
        ``out`` of another shape.

    Examples
    --------
    >>> x = kaionb.asarray([-1.0, 0.0, 1.0], dtype=np.float32)
    >>> kaionb.gelu(x).get().round(4)
    array([-0.1587,  0.    ,  0.8413], dtype=float32)
    """
    y = gelu_fwd(x, approximate, out=out)
    if _needs_grad(x):
        record(lambda g: (gelu_bwd(g, x, approximate),), (x,), (y,))
    return y
