"""TMA tensor maps for 2-D matrices of 1- or 2-byte elements: encoded on the host, kept in device memory.

A Hopper bulk tensor copy (``cp.async.bulk.tensor``) names its source through a 128-byte
``CUtensorMap`` (base address, sizes, row stride, box size, swizzle). CUDA C passes it as
a ``const __grid_constant__`` kernel parameter; numba cannot declare one, so kaionb
encodes the map with ``cuTensorMapEncodeTiled``, copies it into device memory, and passes
the kernel its address (the PTX ISA accepts a tensor map in the global state space).

Maps are cached by (device, address, shape, row stride, box), the oldest dropped past
CACHE_SIZE: the same operand reuses its map and costs one dict lookup. A map only encodes
addresses and sizes, so a reused key gives the same bytes even after the memory behind it
was freed and reallocated.

A new map is uploaded on a side stream of its device, which the host waits for (a
128-byte copy, never the work queued on the caller's stream), and freed in the caller's
stream order. Under CUDA graph capture a graph holds the map's address for every replay:
maps used while the current stream captures are kept for the life of the process.
"""

from __future__ import annotations

import threading

import numpy as np

from ._device import (
    STATE,
    Stream,
    allocation_stream,
    check_driver,
    current_stream,
    is_capturing,
    stream,
)

# A box's inner dimension: one 128-byte line, the width of the 128-byte swizzle (the
# layout wgmma reads): 64 16-bit elements, 128 int8 ones.
LINE_BYTES = 128
BOX_INNER = LINE_BYTES // 2  # of a 16-bit matrix
CACHE_SIZE = 512

_CACHE: dict[tuple, object] = {}
_CAPTURED: dict[tuple, object] = {}  # maps a captured graph may read: never dropped
_LOCK = threading.Lock()
_SIDE = threading.local()  # per device, the stream new maps are uploaded on


def tma_compatible(storage, ld: int) -> bool:
    """Whether a row-major matrix of 1- or 2-byte elements with ``ld`` elements per row
    can be a TMA source: 16-byte aligned base and row stride (the tensor map's
    requirements)."""
    row_bytes = ld * storage.itemsize
    return storage.ptr % 16 == 0 and row_bytes % 16 == 0 and row_bytes < 2**40


def tensor_map_2d(storage, ld: int, box_rows: int):
    """A tensor map over the row-major matrix ``storage`` (rows × cols, ``ld`` elements a
    row, 1- or 2-byte elements), in device memory (a DeviceArray: pass ``.ptr`` to the
    kernel, and keep the array while a launch may read it): boxes of ``box_rows`` rows ×
    one 128-byte line, the 128-byte swizzle, zeros for elements past the matrix (so edge
    tiles need no code)."""
    rows, cols = storage.shape
    size = storage.itemsize
    key = (storage.device, storage.ptr, rows, cols, ld, box_rows, size)
    capturing = is_capturing(current_stream().handle)
    held = _CACHE.get(key)  # a dict read is atomic: the hit path takes no lock
    if held is None:
        held = _CAPTURED.get(key)
    if held is not None and not capturing:
        return held
    if held is None:
        held = _encode(storage.ptr, rows, cols, ld, box_rows, size, capturing)
    if capturing:
        _CAPTURED[key] = held
        return held
    with _LOCK:
        _CACHE[key] = held
        while len(_CACHE) > CACHE_SIZE:  # oldest first
            _CACHE.pop(next(iter(_CACHE)))
    return held


def _encode(ptr: int, rows: int, cols: int, ld: int, box_rows: int, size: int,
            capturing: bool):
    from cuda.bindings import driver

    from .array import asarray

    kinds = driver.CUtensorMapDataType
    element = kinds.CU_TENSOR_MAP_DATA_TYPE_UINT16 if size == 2 else kinds.CU_TENSOR_MAP_DATA_TYPE_UINT8
    err, tensor_map = driver.cuTensorMapEncodeTiled(
        element,
        2,
        ptr,
        [driver.cuuint64_t(cols), driver.cuuint64_t(rows)],
        [driver.cuuint64_t(ld * size)],
        [driver.cuuint32_t(LINE_BYTES // size), driver.cuuint32_t(box_rows)],
        [driver.cuuint32_t(1), driver.cuuint32_t(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    check_driver(err, f"cuTensorMapEncodeTiled({rows}x{cols}, ld={ld}, box={box_rows}x"
                      f"{LINE_BYTES // size}, {size}-byte elements)")
    words = np.array(tensor_map.opaque, dtype=np.uint64).view(np.uint32)
    # Uploaded on a side stream of the map's device, which asarray then waits for: the
    # map is in place before any launch after this returns, from any stream, and the host
    # waits for a 128-byte copy, not for the work queued on the current stream (waiting for
    # that stalled the host on every new output, and with several GPUs serialized them:
    # 1.25x for two GPUs in benchmarks/multi_gpu_mlp.py --allocate). A capturing stream
    # could not wait for a host copy at all.
    caller = current_stream()
    sides = getattr(_SIDE, "streams", None)
    if sides is None:
        sides = _SIDE.streams = {}
    side = sides.get(STATE.ordinal)
    if side is None:
        side = sides[STATE.ordinal] = Stream()  # on the current device: the map's own
    with stream(side):
        held = asarray(words)
    if not capturing:  # (maps a graph reads are never freed)
        # freed after the kernels queued on the caller's stream, which may read it
        held._owner.set_deallocation_stream(allocation_stream(STATE.ordinal, caller))
    return held
