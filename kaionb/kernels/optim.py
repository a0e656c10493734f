"""Optimizer steps: a fused, in-place AdamW update (Loshchilov & Hutter 2019,
https://arxiv.org/abs/1711.05101), as torch.optim.AdamW computes it.

For step t >= 1 and every element, with g the gradient (−g under ``maximize``):

    p ← p − lr·λ·p                                    decoupled weight decay
    m ← β₁·m + (1 − β₁)·g  = m + (1 − β₁)·(g − m)      exp_avg
    v ← β₂·v + (1 − β₂)·g² = v + (1 − β₂)·(g² − v)     exp_avg_sq
    p ← p − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)

The scalars (lr·λ, 1 − β₁, 1 − β₂, lr / (1 − β₁ᵗ), √(1 − β₂ᵗ), ε) are computed on the host
in float64 and passed as float32; the element math is float32 with IEEE ``sqrt.rn`` and
``div.rn`` (and the multiply-adds NVVM fuses, as nvcc does for torch). The forms on the
right keep float32 scalars near 1 out of the math: β₂ = 0.999 rounds to float32 off by
1.3e-8, which v (a 1000-step average) gathers, and 1 − lr·λ by up to 3e-8, a drift of p
every step; 1 − β₂ and lr·λ round at no such cost. Measured with adamw_ref in float32
against float64, 2000 steps at torch's defaults: v's error 8.9e-6 -> 5.7e-7, p's 2.8e-5 ->
6.0e-6. The forms stand in for the float64 β and lr·λ of torch's fused kernel
(aten/src/ATen/native/cuda/fused_adam_utils.cuh); m's is the lerp of its foreach path;
the update is the fused kernel's ``param -= step_size * exp_avg / denom``.

One grid-stride pass: each thread updates 8 elements per step, two runs of 4 that lie
THREADS·4 elements apart — 16-byte loads and stores of p, m, v (two each), of a float32
g, 8-byte ones of a half g and of the optional half copy of p — so that consecutive
threads touch consecutive runs and each load or store instruction of a warp covers one
contiguous span (a thread's 8 consecutive elements made every instruction fill half of
each 32-byte sector, the other half coming from the next instruction: 81.7% of copy
bandwidth on an H100, docs/perf-log-primitives.md). Bytes per element: read 12 +
sizeof(g), write 12 (+2 for the copy). The elements past the last whole block's span,
and everything when an address breaks 16-byte alignment (a view at an odd offset), go
element by element, consecutive threads on consecutive elements.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from numba import cuda, float32, int64

from ..array import bfloat16
from ..ptx_patches import device_function
from ..validation import as_array, check_contiguous, check_same_device, check_shape, fail
from .helpers.rowwise import CODECS, FLOAT_DTYPES, MAX_GRID_X, VEC_BYTES
from .helpers.vector import (
    load_u32x2_readonly,
    load_u32x4,
    load_u32x4_readonly,
    store_u32x2,
    store_u32x4,
)
from .launch import kernel
from .op import Plan, PlanCache, device_guard

__all__ = ["adamw_step", "adamw_step_fwd", "adamw_ref"]

# Elements per thread per step: 2 words4 of each float32 array, 1 of a half array.
# Every load of a step is issued before the first use, 7-8 × 16 bytes in flight per
# thread; unrolling further would double the 32 float registers the step keeps live.
VEC = 8
THREADS = 256
# Launch bounds: at least 3 blocks of 256 a SM (ptxas takes 63-65 registers; 60-62 at a
# bound of 4). H100, float32 grads, 2^25 elements, % of copy bandwidth at a bound of
# 2 / 3 / 4 / 6 blocks: 97.9 / 97.9 / 95.7 / 57.5 (6: 40 registers and spills).
BLOCKS_PER_SM = 3
HALF_DTYPES = (np.dtype(np.float16), bfloat16)
_F32 = CODECS[np.dtype(np.float32)]


@device_function
def _adamw_element(p, g, m, v, sign, lr_wd, c1, c2, step_size, bc2_sqrt, eps):
    """One element's update (the module doc's right-hand forms); ``sign`` is −1 to
    ascend (``maximize``), else 1."""
    g = g * sign
    p = p - lr_wd * p
    m = m + c1 * (g - m)
    v = v + c2 * (g * g - v)
    denom = math.sqrt(v) / bc2_sqrt + eps
    return p - step_size * m / denom, m, v


def _make_adamw_kernel(grad_dtype, copy_dtype):
    """The AdamW kernel for a gradient of ``grad_dtype`` and a half copy of the updated
    parameters in ``copy_dtype`` (None: no copy; the ``copy`` argument is then ``p``
    again and never touched). ``aligned``: every array starts 16-byte aligned, so the
    first n // VEC * VEC elements go in 16-byte words and only the tail element by element."""
    gc = CODECS[grad_dtype]
    cc = CODECS[copy_dtype] if copy_dtype is not None else None
    HALF_GRAD = gc.vec == VEC
    HAS_COPY = cc is not None
    unpack_g, unpack_g_pair, decode_g = gc.unpack, gc.unpack_pair, gc.decode
    unpack_f, pack_f = _F32.unpack, _F32.pack
    pack_c_pair = cc.pack_pair if HAS_COPY else _F32.pack_pair
    encode_c = cc.encode if HAS_COPY else _F32.encode
    G = gc.storage
    C = cc.storage if HAS_COPY else "float32"
    suffix = grad_dtype.name + (f"_{copy_dtype.name}" if HAS_COPY else "")
    RUN = 4  # elements per 16-byte word of float32
    SPAN = THREADS * VEC  # elements a block's step covers

    @kernel([f"void(float32[::1], {G}[::1], float32[::1], float32[::1], {C}[::1], int64, "
             "int32, float32, float32, float32, float32, float32, float32, float32)"],
            name=f"_adamw_step_fwd_kernel_{suffix}", launch_bounds=(THREADS, BLOCKS_PER_SM))
    def _adamw_step_fwd_kernel(p, g, m, v, copy, n, aligned, sign, lr_wd, c1, c2, step_size,
                           bc2_sqrt, eps):
        fp = cuda.local.array(VEC, float32)
        fg = cuda.local.array(VEC, float32)
        fm = cuda.local.array(VEC, float32)
        fv = cuda.local.array(VEC, float32)
        first = int64(cuda.blockIdx.x) * THREADS + int64(cuda.threadIdx.x)
        stride = int64(cuda.gridDim.x) * THREADS
        nvec = n // SPAN * THREADS if aligned else int64(0)  # thread steps on whole spans
        for c in range(first, nvec, stride):
            t = c % THREADS
            e0 = (c - t) * VEC + t * RUN
            # p, m, v are written below: the coherent ld.global (ld.global.nc is for data
            # that stays read-only for the whole kernel); g goes through the read-only path.
            for h in range(2):
                e = e0 + h * (THREADS * RUN)
                unpack_f(load_u32x4(p, e), fp, RUN * h)
                unpack_f(load_u32x4(m, e), fm, RUN * h)
                unpack_f(load_u32x4(v, e), fv, RUN * h)
                if HALF_GRAD:
                    unpack_g_pair(load_u32x2_readonly(g, e), fg, RUN * h)
                else:
                    unpack_g(load_u32x4_readonly(g, e), fg, RUN * h)
            for j in range(VEC):
                fp[j], fm[j], fv[j] = _adamw_element(fp[j], fg[j], fm[j], fv[j], sign, lr_wd,
                                                     c1, c2, step_size, bc2_sqrt, eps)
            for h in range(2):
                e = e0 + h * (THREADS * RUN)
                store_u32x4(p, e, pack_f(fp, RUN * h))
                store_u32x4(m, e, pack_f(fm, RUN * h))
                store_u32x4(v, e, pack_f(fv, RUN * h))
                if HAS_COPY:
                    store_u32x2(copy, e, pack_c_pair(fp, RUN * h))
        # The tail (aligned) or everything (not): one element per thread per step.
        for e in range(nvec * VEC + first, n, stride):
            pe, me, ve = _adamw_element(p[e], decode_g(g[e]), m[e], v[e], sign, lr_wd, c1, c2,
                                        step_size, bc2_sqrt, eps)
            p[e] = pe
            m[e] = me
            v[e] = ve
            if HAS_COPY:
                copy[e] = encode_c(pe)

    return _adamw_step_fwd_kernel


_KERNELS = {(gd, cd): _make_adamw_kernel(gd, cd)
            for gd in FLOAT_DTYPES for cd in (None, *HALF_DTYPES)}


# -- host side ---------------------------------------------------------------------------

def _device_array(op, name, x, dtypes):
    """An array updated in place: device memory only (a NumPy array would be copied to
    the device, and the update would land in the copy)."""
    if isinstance(x, np.ndarray):
        fail(TypeError, op, name, "device memory (a DeviceArray, CuPy or PyTorch CUDA "
             "array), updated in place", "a NumPy array (the update would land in a copy)")
    return as_array(op, name, x, dtypes=dtypes)


def _real(op, name, value, lo, hi=math.inf, *, lo_open=False, hi_open=False):
    """``value`` as a float in the interval [lo, hi] (ends open where asked), finite."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(TypeError, op, name, "a real number", type(value).__name__)
    x = float(value)
    ok = math.isfinite(x) and (x > lo if lo_open else x >= lo) and (
        x < hi if hi_open else x <= hi)
    if not ok:
        interval = (f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
                    if hi != math.inf else f"{'>' if lo_open else '>='} {lo:g}")
        fail(ValueError, op, name, f"a finite value {'in ' if hi != math.inf else ''}"
             f"{interval}", value)
    return x


def _adamw_scalars(*, lr, beta1, beta2, eps, weight_decay, step, maximize=False):
    """The kernel's scalar arguments for ``step`` (validated, float64 on the host):
    (sign, lr_wd, c1, c2, step_size, bc2_sqrt, eps)."""
    op = "adamw_step"
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        fail(TypeError, op, "step", "an int >= 1 (the step count, this step included)",
             type(step).__name__)
    if step < 1:
        fail(ValueError, op, "step", "an int >= 1 (the step count, this step included)", step)
    lr = _real(op, "lr", lr, 0.0)
    beta1 = _real(op, "beta1", beta1, 0.0, 1.0, hi_open=True)
    beta2 = _real(op, "beta2", beta2, 0.0, 1.0, hi_open=True)
    eps = _real(op, "eps", eps, 0.0, lo_open=True)
    weight_decay = _real(op, "weight_decay", weight_decay, 0.0)
    if not isinstance(maximize, (bool, np.bool_)):
        fail(TypeError, op, "maximize", "a bool", type(maximize).__name__)
    step = int(step)
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    return (-1.0 if maximize else 1.0, lr * weight_decay, 1.0 - beta1, 1.0 - beta2,
            lr / bias_correction1, math.sqrt(bias_correction2), eps)


def _check_apart(op, arrays):
    """No two of the (C-contiguous, non-empty) arrays share a byte: each is read and
    written by one thread per element, and an alias would read what another wrote."""
    spans = sorted((a.ptr, a.ptr + a.nbytes, name) for name, a in arrays.items())
    for (lo0, hi0, name0), (lo1, hi1, name1) in zip(spans, spans[1:]):
        if lo1 < hi0:
            first, second = sorted((name0, name1), key=list(arrays).index)
            fail(ValueError, op, second, f"memory apart from '{first}' (every array is its "
                 "own buffer)", f"bytes 0x{lo1:x}..0x{min(hi0, hi1):x} shared with it")


# Not wrapped in kernels.op.fast_path: its replay keys on every scalar argument and
# relaunches with the recorded ones, and step (often lr) changes on every call. The
# layout checks and the plan are kept per layout instead (a training loop repeats one).
_PLANS = PlanCache()


@device_guard
def adamw_step_fwd(param, grad, m, v, *, lr, beta1=0.9, beta2=0.999, eps=1e-8,
                   weight_decay=0.01, step, maximize=False, model_param=None):
    """Validate everything, then launch (nothing for empty arrays). Returns None."""
    op = "adamw_step"
    scalars = _adamw_scalars(lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                             weight_decay=weight_decay, step=step, maximize=maximize)
    param = _device_array(op, "param", param, (np.float32,))
    grad = as_array(op, "grad", grad, dtypes=FLOAT_DTYPES)
    m = _device_array(op, "m", m, (np.float32,))
    v = _device_array(op, "v", v, (np.float32,))
    arrays = {"param": param, "grad": grad, "m": m, "v": v}
    if model_param is not None:
        arrays["model_param"] = _device_array(op, "model_param", model_param, HALF_DTYPES)
    # Everything the checks and the plan read (dtypes were checked above).
    key = tuple((a.shape, a.strides, a.dtype, a.device_id, a.ptr % VEC_BYTES)
                for a in arrays.values())
    plan = _PLANS.get(key)
    if plan is None:
        for name, a in arrays.items():
            check_shape(op, name, a, param.shape)
            check_contiguous(op, name, a)
        check_same_device(op, **arrays)
        if not param.size:
            return None
        plan = _PLANS.put(key, _adamw_plan(*arrays.values()))
    _check_apart(op, arrays)
    _adamw_launch(plan, tuple(arrays.values()), scalars)
    return None


def _adamw_plan(param, grad, m, v, model_param=None):
    """(kernel, grid, aligned) for non-empty, checked arrays: host work on their layout
    only (CPU tests check the choices)."""
    n = param.size
    arrays = (param, grad, m, v) if model_param is None else (param, grad, m, v, model_param)
    aligned = all(a.ptr % VEC_BYTES == 0 for a in arrays)
    # One step per thread: n // VEC words and n % VEC tail elements, or n elements.
    work = max(n // VEC, n % VEC) if aligned else n
    grid = (max(1, min(-(-work // THREADS), MAX_GRID_X)),)
    kdef = _KERNELS[grad.dtype, None if model_param is None else model_param.dtype]
    return kdef, grid, int(aligned)


def _adamw_args(arrays, aligned, scalars):
    """The kernel's arguments: flat 1-D views of the (C-contiguous) arrays, param again
    in the copy's place when there is none, and the scalars rounded to float32."""
    n = arrays[0].size
    flat = [a._view((n,), (a.itemsize,)) for a in arrays]
    if len(flat) == 4:
        flat.append(flat[0])
    return (*flat, n, aligned, *np.array(scalars, np.float32).tolist())


def _adamw_launch(plan, arrays, scalars):
    kdef, grid, aligned = plan
    Plan.of(kdef, grid, (THREADS,)).launch(*_adamw_args(arrays, aligned, scalars))


def adamw_ref(param, grad, m, v, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
              step, maximize=False, dtype=np.float64):
    """NumPy reference: (param, m, v) after one step, new arrays in ``dtype``.
    float64 is the reference; float32 mirrors the kernel (scalars rounded to float32,
    the same operations in the same order, without the GPU's fused multiply-adds)."""
    dt = np.dtype(dtype)
    s = [dt.type(x) for x in _adamw_scalars(lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                          weight_decay=weight_decay, step=step,
                                          maximize=maximize)]
    sign, lr_wd, c1, c2, step_size, bc2_sqrt, eps_ = s
    p, g = np.asarray(param).astype(dt), np.asarray(grad).astype(dt) * sign
    m, v = np.asarray(m).astype(dt), np.asarray(v).astype(dt)
    p = p - lr_wd * p
    m = m + c1 * (g - m)
    v = v + c2 * (g * g - v)
    denom = np.sqrt(v) / bc2_sqrt + eps_
    return p - step_size * m / denom, m, v


def adamw_step(param, grad, m, v, *, lr, beta1=0.9, beta2=0.999, eps=1e-8,
               weight_decay=0.01, step, maximize=False, model_param=None):
    """Take one AdamW step (torch.optim.AdamW's update), fused and in place.

    All arrays: the same shape (any), C-contiguous, on one device, and no two sharing
    memory; DeviceArrays or CUDA arrays of other libraries, zero-copy (a torch
    ``nn.Parameter`` as ``p.data``: torch exports no tensor that requires grad). m and v
    start as zeros, as torch's state does. A view off 16-byte alignment is updated
    element by element (correct, slower). Under graph capture the scalars (lr, step) are
    baked into the launch: a replayed graph repeats the captured step.

    Parameters
    ----------
    param : DeviceArray
        The float32 master weights, updated in place. float16 / bfloat16 parameters are
        refused (an update below half an ulp of a bf16 weight would be lost; keep a
        float32 master copy and pass the half weights as ``model_param``).
    grad : DeviceArray
        The gradient: float32, float16 or bfloat16 (read in float32, exactly).
    m : DeviceArray
        The float32 ``exp_avg``, updated in place.
    v : DeviceArray
        The float32 ``exp_avg_sq``, updated in place.
    lr : float
        The learning rate (finite, >= 0).
    beta1, beta2 : float, optional
        The moment decay rates, in [0, 1).
    eps : float, optional
        Added to the denominator (finite, > 0).
    weight_decay : float, optional
        Decoupled weight decay (finite, >= 0).
    step : int
        This step's count, from 1 (torch's ``state['step']`` after its increment).
    maximize : bool, optional
        Ascend (the gradient negated).
    model_param : DeviceArray, optional
        A float16 / bfloat16 array, written with the updated ``param`` rounded to nearest
        even in the same pass (the weights of a mixed-precision model).

    Returns
    -------
    None
        The arrays are updated in place.

    Raises
    ------
    TypeError
        ``param``, ``m`` or ``v`` not float32 device memory (NumPy arrays included), a
        ``grad`` of another dtype than float32 / float16 / bfloat16, a ``model_param``
        that is not float16 / bfloat16, a scalar of the wrong type (``step`` not an int,
        ``lr`` not a number, ``maximize`` not a bool).
    ValueError
        Arrays of different shapes, not C-contiguous, on two devices or sharing memory;
        ``step`` < 1; ``lr``, ``eps`` or ``weight_decay`` out of range or not finite;
        ``beta1`` / ``beta2`` outside [0, 1).

    Examples
    --------
    >>> p = kaionb.ones(4, dtype=np.float32)
    >>> g = kaionb.full(4, 0.5, np.float32)
    >>> m, v = kaionb.zeros(4, np.float32), kaionb.zeros(4, np.float32)
    >>> kaionb.adamw_step(p, g, m, v, lr=0.1, weight_decay=0.0, step=1)
    >>> p.get().round(4)
    array([0.9, 0.9, 0.9, 0.9], dtype=float32)
    """
    return adamw_step_fwd(param, grad, m, v, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                          weight_decay=weight_decay, step=step, maximize=maximize,
                          model_param=model_param)
