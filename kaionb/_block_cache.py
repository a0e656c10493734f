"""Reuse of small device allocations made on the legacy default stream.

An allocation from cuda.core's stream-ordered pool and its free cost about 5.5 µs of
host time between them (H100 host, 2026-11-26: ``[4, 4096] + [4096]`` 14.65 µs a call
allocating its result, 9.11 µs with ``out=``; ``kaionb.empty`` 5.43 µs, ``cupy.empty``
2.57 µs) — a third of a small op. So an array of at most ``SMALL_BYTES`` made on the
legacy default stream (the stream kaionb and PyTorch run on unless told otherwise) gets a
:class:`Block`: a pool buffer of the size rounded up to a power of two, which goes back on
a free list when the last array viewing it dies, and the next allocation of that size on
that stream takes it from there. Stream order makes that safe exactly as the pool's own
reuse is: work queued later on the stream runs after the work that used the block
(other streams are ordered against it as they would be against a pool free on it).

Only the legacy stream is cached: it never captures a graph (so a block never becomes
part of one) and never dies (so no free list outlives its stream). With
``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1`` handle 0 names each thread's own stream,
unordered with the others', and nothing is cached. At most
``CLASS_BYTES`` of one size wait per device (52 MiB over the 13 sizes); past that a
dying block's buffer is freed. :func:`empty_cache` frees every waiting block.
"""

from __future__ import annotations

import os

from ._device import allocation_stream

# With CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1 (read as cuda.bindings reads it),
# handle 0 is each thread's own stream, and streams of two threads are not ordered: no
# stream is cached then (None: no handle matches).
CACHED_STREAM = (None if bool(int(os.getenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM",
                                            "0"))) else 0)
SMALL_BYTES = 1 << 20  # the largest allocation cached
MIN_BYTES = 256        # the smallest size class
CLASS_BYTES = 4 << 20  # per device and size: the most memory waiting on one free list

# (device, size) -> [(cuda.core Buffer, its address), ...]. list.append, list.pop and
# len are atomic under the GIL: threads share the lists without a lock.
_FREE: dict = {}


class Block:
    """The owner of a cached allocation (a DeviceArray's ``_owner``): holds the pool
    buffer, and hands it to the free list of its device and size when it dies."""

    __slots__ = ("buffer", "handle", "device", "size")

    def __init__(self, buffer, handle: int, device: int, size: int):
        self.buffer = buffer
        self.handle = handle  # the address, as a Buffer's ``handle``
        self.device = device
        self.size = size

    def __del__(self):
        try:
            give_back(self.buffer, self.handle, self.device, self.size)
        except Exception:  # interpreter shutdown: the buffer frees itself
            pass


def allocate(memory_resource, device: int, stream, nbytes: int) -> Block:
    """A Block of at least ``nbytes`` (1 … ``SMALL_BYTES``) on ``device``: a waiting one
    of its size class, else a new buffer of that size from ``memory_resource`` on the
    legacy default stream ``stream`` (a kaionb Stream)."""
    size = MIN_BYTES if nbytes <= MIN_BYTES else 1 << (nbytes - 1).bit_length()
    free = _FREE.get((device, size))
    if free:
        try:
            buffer, handle = free.pop()
            return Block(buffer, handle, device, size)
        except IndexError:  # another thread took the last one
            pass
    buffer = memory_resource.allocate(size, stream=allocation_stream(device, stream))
    return Block(buffer, int(buffer.handle), device, size)


def give_back(buffer, handle: int, device: int, size: int) -> None:
    """Put a dead block's buffer on its free list, or free it when ``CLASS_BYTES`` of
    its size already wait there."""
    free = _FREE.get((device, size))
    if free is None:
        free = _FREE.setdefault((device, size), [])
    if (len(free) + 1) * size <= CLASS_BYTES:
        free.append((buffer, handle))
    # else dropping the last reference frees the buffer on its stream


def empty_cache() -> None:
    """Free the small allocations kaionb keeps for reuse.

    Arrays of at most 1 MiB made on the legacy default stream keep their memory for the
    next allocation of the same size when they die (at most 52 MiB per device wait so);
    this hands all of it back to each device's stream-ordered pool, as
    ``torch.cuda.empty_cache()`` does for PyTorch's cache.

    Examples
    --------
    >>> x = kaionb.empty(1000, np.float32)
    >>> del x
    >>> kaionb.empty_cache()
    """
    for free in list(_FREE.values()):
        while free:
            try:
                free.pop()
            except IndexError:  # another thread took the last one
                break


def waiting_bytes(device: int = 0) -> int:
    """Bytes of ``device`` waiting on the free lists."""
    return sum(len(free) * size for (d, size), free in list(_FREE.items()) if d == device)
