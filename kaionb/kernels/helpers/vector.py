"""128-bit vector loads and stores on 1-D arrays, with scalar fallback at the tail.

One ``ld.global.v4`` moves 16 bytes per thread per instruction instead of four 4-byte
loads: the difference between ~60% and ~90% of DRAM bandwidth in memory-bound kernels
(RMSNorm, softmax, elementwise ops). The element index must be a multiple of 4 (f32/u32)
and the array 16-byte aligned (numba and cuda.core allocations are 256-byte aligned).
The ``_masked`` forms take the logical length ``n`` and fall back to scalar accesses for
a partial last vector, filling missing elements with ``fill`` on loads.
:func:`vector_group` moves a group of one or more words4 at an address the caller forms
(any rank, 64-bit offsets) and converts it through a float codec (kernels that step
through arrays of different widths: a float16 x with its float32 gradient).
"""

import functools

from numba import uint64

from kaionb.ptx_patches import (
    device_function,
    global_addr,
    ld_global_nc_v2_u32,
    ld_global_nc_v4_f32,
    ld_global_nc_v4_u32,
    ld_global_v4_f32,
    ld_global_v4_u32,
    st_global_v2_u32,
    st_global_v4_f32,
    st_global_v4_u32,
)


@device_function
def load_f32x4(arr, i):
    """``(arr[i], arr[i+1], arr[i+2], arr[i+3])`` in one ld.global.v4.f32 (i % 4 == 0)."""
    return ld_global_v4_f32(global_addr(arr, i))


@device_function
def load_f32x4_readonly(arr, i):
    """As :func:`load_f32x4` through the read-only path (``ld.global.nc``); ``arr`` must
    not be written while the kernel runs."""
    return ld_global_nc_v4_f32(global_addr(arr, i))


@device_function
def store_f32x4(arr, i, v):
    """``arr[i:i+4] = v`` (a 4-tuple of float32) in one st.global.v4.f32."""
    st_global_v4_f32(global_addr(arr, i), v)


@device_function
def load_u32x4(arr, i):
    """Four 32-bit words from a uint32 array (e.g. 8 packed halves) in one load."""
    return ld_global_v4_u32(global_addr(arr, i))


@device_function
def load_u32x4_readonly(arr, i):
    """As :func:`load_u32x4` through the read-only path (``ld.global.nc``)."""
    return ld_global_nc_v4_u32(global_addr(arr, i))


@device_function
def store_u32x4(arr, i, v):
    """``arr[i:i+4] = v`` (a 4-tuple of uint32) in one st.global.v4.u32."""
    st_global_v4_u32(global_addr(arr, i), v)


@device_function
def load_u32x2_readonly(arr, i):
    """Two 32-bit words (e.g. 4 packed halves) from ``arr[i:]`` through the read-only
    path in one 8-byte load (``arr[i]`` 8-byte aligned)."""
    return ld_global_nc_v2_u32(global_addr(arr, i))


@device_function
def store_u32x2(arr, i, v):
    """``arr[i:]`` = the 8 bytes of ``v`` (a 2-tuple of uint32) in one st.global.v2.u32."""
    st_global_v2_u32(global_addr(arr, i), v)


@device_function
def load_f32x4_masked(arr, i, n, fill):
    """Elements i..i+3 of ``arr[:n]``, ``fill`` past ``n``; vector load when all exist."""
    if i + 4 <= n:
        return ld_global_v4_f32(global_addr(arr, i))
    v0 = arr[i] if i < n else fill
    v1 = arr[i + 1] if i + 1 < n else fill
    v2 = arr[i + 2] if i + 2 < n else fill
    v3 = arr[i + 3] if i + 3 < n else fill
    return (v0, v1, v2, v3)


@device_function
def store_f32x4_masked(arr, i, n, v):
    """``arr[i:min(i+4, n)] = v[:...]``: vector store when all four exist."""
    if i + 4 <= n:
        st_global_v4_f32(global_addr(arr, i), v)
        return
    for j in range(4):
        if i + j < n:
            arr[i + j] = v[j]


@functools.cache
def vector_group(codec, size):
    """``(ld, unpack, st, words)``: device helpers for ``size`` consecutive elements of a
    float array of ``codec``'s dtype (a :class:`~kaionb.kernels.helpers.rowwise.Codec`)
    at a 16-byte aligned address: ``size // codec.vec`` words4 (float32 under a half
    type's 8-element vectors: two). The caller forms the 64-bit address (``global_addr``
    of any rank and index), so no row length or offset width is assumed.

    - ``ld(addr, raw, at)``: ``raw[at : at + words]`` ← ``ld.global.nc.v4`` at addr, addr + 16..
    - ``unpack(raw, at, f)``: the group's values into ``f[0 : size]`` as float32.
    - ``st(addr, f)``: ``f[0 : size]`` rounded to the dtype and stored at addr.
    """
    Q = size // codec.vec
    if Q * codec.vec != size:
        raise ValueError(f"vector_group: {size} elements are not whole words4 of "
                         f"{codec.dtype}")
    CV = codec.vec
    unpack_words, pack = codec.unpack, codec.pack

    @device_function
    def ld(addr, raw, at):
        for q in range(Q):
            words = ld_global_nc_v4_u32(addr + uint64(16 * q))
            for k in range(4):
                raw[at + 4 * q + k] = words[k]

    @device_function
    def unpack(raw, at, f):
        for q in range(Q):
            b = at + 4 * q
            unpack_words((raw[b], raw[b + 1], raw[b + 2], raw[b + 3]), f, q * CV)

    @device_function
    def st(addr, f):
        for q in range(Q):
            st_global_v4_u32(addr + uint64(16 * q), pack(f, q * CV))

    return ld, unpack, st, 4 * Q
