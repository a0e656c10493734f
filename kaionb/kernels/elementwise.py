"""Strided copy with dtype conversion (the kernel behind DeviceArray.copy / astype / fill),
and the float32 sum the tape uses to accumulate gradients.

dst[i] = convert(src[i]) over up to four (collapsed) dimensions with arbitrary byte strides.
Half types travel as uint16 bit patterns and convert through PTX ``cvt`` (round to nearest
even); other types convert through numba's own casts. One kernel per (source, destination)
storage pair, made by one factory. Copies of the same dtype move raw bits (one kernel per
element size), so every dtype gets strided copies.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, uint16, uint32

from .._device import multiprocessor_count
from ..array import bfloat16, register_kernel
from ..ptx_patches import (bf16x2_to_f32x2, cvt_rn_bf16x2_f32, cvt_rn_f16x2_f32, device_function,
                           f16x2_to_f32x2)
from ..validation import as_array, check_same_device, check_shape, fail
from .launch import kernel
from .op import ANY_LAYOUT, C_CONTIGUOUS, Plan, fast_path, output, run

THREADS = 256
# Enough resident blocks to cover the H100 (132 SMs × 8 blocks of 256 threads) in one wave;
# a grid-stride loop takes the rest.
BLOCKS_PER_SM = 8
MAX_DIMS = 4


@device_function
def _f16_bits_to_f32(bits):
    return f16x2_to_f32x2(uint32(bits))[0]


@device_function
def _bf16_bits_to_f32(bits):
    return bf16x2_to_f32x2(uint32(bits))[0]


@device_function
def _f32_to_f16_bits(x):
    return uint16(cvt_rn_f16x2_f32(float32(x), float32(0.0)) & 0xFFFF)


@device_function
def _f32_to_bf16_bits(x):
    return uint16(cvt_rn_bf16x2_f32(float32(x), float32(0.0)) & 0xFFFF)


@device_function
def _to_f32(x):
    return float32(x)


@device_function
def _to_f64(x):
    return float64(x)


@device_function
def _identity(x):
    return x


# name -> (numba storage type, decode to a float, encode from a float)
_FLOAT_STORAGE = {
    np.dtype(np.float32): ("float32", _to_f32, _to_f32),
    np.dtype(np.float64): ("float64", _to_f64, _to_f64),
    np.dtype(np.float16): ("uint16", _f16_bits_to_f32, _f32_to_f16_bits),
    bfloat16: ("uint16", _bf16_bits_to_f32, _f32_to_bf16_bits),
}
# Integer sources convert to any float (int8 → floats for dequantization and tests).
_INT_SOURCES = {np.dtype(t): (np.dtype(t).name, _identity)
                for t in (np.int8, np.uint8, np.int32)}
_BITS_BY_SIZE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _array_type(storage: str) -> str:
    return f"{storage}[:, :, :, :]"


def _make_copy_convert_kernel(name, decode, encode, src_storage, dst_storage):
    @kernel([f"void({_array_type(src_storage)}, {_array_type(dst_storage)})"], name=name)
    def _copy_convert_fwd_kernel(src, dst):
        n = dst.size
        d1, d2, d3 = dst.shape[1], dst.shape[2], dst.shape[3]
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < n:
            i3 = i % d3
            rest = i // d3
            i2 = rest % d2
            rest //= d2
            i1 = rest % d1
            i0 = rest // d1
            dst[i0, i1, i2, i3] = encode(decode(src[i0, i1, i2, i3]))
            i += step

    return _copy_convert_fwd_kernel


def _build_copy_convert_kernels():
    """Keyed ("bits", itemsize) for same-dtype copies, (source, destination) dtypes else."""
    kernels = {}
    for size, storage in _BITS_BY_SIZE.items():
        kernels[("bits", size)] = _make_copy_convert_kernel(
            f"_copy_convert_fwd_kernel_bits{size * 8}", _identity, _identity, storage, storage)
    sources = {dt: (storage, decode) for dt, (storage, decode, _) in _FLOAT_STORAGE.items()}
    sources.update(_INT_SOURCES)
    for src_dt, (src_storage, decode) in sources.items():
        for dst_dt, (dst_storage, _, encode) in _FLOAT_STORAGE.items():
            if src_dt != dst_dt:
                kernels[(src_dt, dst_dt)] = _make_copy_convert_kernel(
                    f"_copy_convert_fwd_kernel_{src_dt.name}_to_{dst_dt.name}", decode, encode,
                    src_storage, dst_storage)
    return kernels


_COPY_CONVERT_KERNELS = _build_copy_convert_kernels()


@kernel(["void(float32[::1], float32[::1], float32[::1])"])
def _add_fwd_kernel(a, b, out):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = a[i] + b[i]
        i += step


def _grid_stride_blocks(size: int) -> int:
    """Blocks of THREADS for a grid-stride loop over ``size`` elements: one element per
    thread, at most one resident wave."""
    return min(math.ceil(size / THREADS), multiprocessor_count() * BLOCKS_PER_SM)


def _collapse(shape, *stride_sets):
    """Merge adjacent axes that are contiguous with each other in every array, drop size-1
    axes: the fewest dimensions that describe the same walk (row-major order kept)."""
    dims = [(d, [s[i] for s in stride_sets]) for i, d in enumerate(shape) if d != 1]
    merged = []
    for d, strides in dims:
        if merged and all(ps == d * s for ps, s in zip(merged[-1][1], strides)):
            merged[-1] = (merged[-1][0] * d, strides)
        else:
            merged.append((d, strides))
    return [d for d, _ in merged], [[st[k] for _, st in merged] for k in range(len(stride_sets))]


@fast_path
def copy_convert_fwd(src, *, out):
    """Validate; launch unless empty: ``out[...] = src`` converted to out's dtype (same
    shape, any strides on either side). Returns ``out``."""
    src = as_array("copy", "src", src)
    op = "copy" if src.dtype == out.dtype else "astype"
    out = output(op, out, src.shape, out.dtype, device=src.device_id, layout=ANY_LAYOUT)
    key = ("bits", src.itemsize) if src.dtype == out.dtype else (src.dtype, out.dtype)
    kdef = _COPY_CONVERT_KERNELS.get(key)
    if kdef is None:
        fail(TypeError, op, "dtype", "a conversion kaionb has (floats ↔ floats; int8, uint8, "
             "int32 → floats)", f"{src.dtype} → {out.dtype}")
    return run(_copy_convert_launch, op, kdef, src, out=out)


def _copy_convert_launch(op, kdef, src, out):
    """One launch over both arrays' layouts, collapsed to at most MAX_DIMS axes."""
    shape, (src_strides, dst_strides) = _collapse(src.shape, src.strides, out.strides)
    if len(shape) > MAX_DIMS:
        fail(ValueError, op, "src", f"a layout of at most {MAX_DIMS} strided dimensions "
             "(make the source contiguous first)",
             f"{len(shape)} (shape {src.shape}, strides {src.strides} into {out.strides})")
    pad = MAX_DIMS - len(shape)
    shape = (1,) * pad + tuple(shape)
    src4 = src._view(shape, (0,) * pad + tuple(src_strides))
    dst4 = out._view(shape, (0,) * pad + tuple(dst_strides))
    Plan.of(kdef, (_grid_stride_blocks(out.size),), (THREADS,)).launch(src4, dst4)


@fast_path
def add_fwd(a, b, *, out=None):
    """Validate and resolve ``out``; launch unless empty. Returns ``out`` = a + b."""
    op = "add"
    a = as_array(op, "a", a)
    b = as_array(op, "b", b)
    check_shape(op, "b", b, a.shape)
    check_same_device(op, a=a, b=b)
    # The kernel reads contiguous float32: anything else is converted first.
    a = a if a.dtype == np.float32 and a.is_c_contiguous else a.astype(np.float32)
    b = b if b.dtype == np.float32 and b.is_c_contiguous else b.astype(np.float32)
    out = output(op, out, a.shape, np.float32, device=a.device_id, layout=C_CONTIGUOUS)
    return run(_add_launch, a, b, out=out)


def _add_launch(a, b, out):
    flat = (out.size,)
    Plan.of(_add_fwd_kernel, (_grid_stride_blocks(out.size),), (THREADS,)).launch(
        a.reshape(flat), b.reshape(flat), out.reshape(flat))


def copy_convert(src, dst) -> None:
    """``dst[...] = src`` converted to dst's dtype (same shape; any strides): the kernel
    behind DeviceArray.copy / astype / fill, which reach it through ``register_kernel``."""
    copy_convert_fwd(src, out=dst)


def add(a, b):
    """``a + b`` for two arrays of one shape, as a new float32 array (the tape sums
    gradients with it)."""
    return add_fwd(a, b)


register_kernel("copy_convert", copy_convert)
