"""The CUDA device and context kaionb works on, and the current stream.

kaionb uses the current device's *primary* context, the same one numba, CuPy and PyTorch
use, so pointers and streams pass between them freely. Every op runs on the current
stream: the legacy default stream unless a ``with kaionb.stream(s):`` block says otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import threading



class _ThreadState(threading.local):
    """Per-thread state (``STATE``); class attributes are the defaults (a miss costs no
    exception: ``current_stream()`` runs on every call of every op)."""

    device = None
    allocator = None
    graph_allocator = None
    stream = None  # the default stream, set below once Stream exists
    recorder = None  # kernels.op's recording of an op's first call, while it runs
    calls = None  # kernels.op's replays of recorded calls, by call key
    capture = None  # the kaionb.graph() capture in progress on this thread


STATE = _ThreadState()


def gpu_available() -> bool:
    """True when a CUDA driver and at least one GPU are present."""
    from numba import cuda

    try:
        return bool(cuda.is_available()) and len(cuda.gpus) > 0
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def _core_device(ordinal: int):
    from cuda.core import Device

    return Device(ordinal)


def current_device():
    """The cuda.core Device that is current on this thread, its primary context made current."""
    dev = STATE.device
    if dev is None:
        if not gpu_available():
            raise RuntimeError("kaionb: no CUDA GPU is available on this machine")
        dev = _core_device(0)
        dev.set_current()
        STATE.device = dev
    return dev


def current_allocator():
    """(the current device's stream-ordered memory resource, its ordinal) — cached per thread,
    since every allocation asks."""
    alloc = STATE.allocator
    if alloc is None:
        dev = current_device()
        alloc = STATE.allocator = (dev.memory_resource, dev.device_id)
    return alloc


@functools.lru_cache(maxsize=None)
def compute_capability(ordinal: int = 0) -> tuple[int, int]:
    cc = _core_device(ordinal).compute_capability
    return (cc.major, cc.minor)


@functools.lru_cache(maxsize=None)
def multiprocessor_count(ordinal: int = 0) -> int:
    return _core_device(ordinal).properties.multiprocessor_count


# -- streams ---------------------------------------------------------------------------


class Stream:
    """A CUDA stream as kaionb sees it: a raw ``CUstream`` handle plus whatever owns it.

    ``kaionb.Stream()`` creates a new non-blocking stream (cuda.core owns it);
    ``Stream.wrap(obj)`` adopts a CuPy, PyTorch, numba or cuda.core stream, an object with
    ``__cuda_stream__``, or a raw integer handle, keeping the owner alive.
    """

    __slots__ = ("handle", "cu", "_owner", "_core")

    def __init__(self, *, _handle: int | None = None, _owner=None):
        if _handle is None:
            core = current_device().create_stream()
            _handle, _owner = int(core.handle), core
        from cuda.bindings.driver import CUstream

        self.handle = int(_handle)
        self.cu = CUstream(self.handle)  # made once: the launch path passes it as is
        self._owner = _owner
        self._core = None

    @classmethod
    def wrap(cls, obj) -> "Stream":
        if isinstance(obj, Stream):
            return obj
        return cls(_handle=stream_handle(obj), _owner=obj)

    def as_core(self):
        """This stream as a cuda.core Stream (for the allocator)."""
        if self._core is None:
            from cuda.core import LEGACY_DEFAULT_STREAM, Stream as CoreStream

            if isinstance(self._owner, CoreStream):
                self._core = self._owner
            elif self.handle == 0:
                self._core = LEGACY_DEFAULT_STREAM
            else:
                self._core = CoreStream.from_handle(self.handle)
        return self._core

    def synchronize(self) -> None:
        from cuda.bindings import driver

        (err,) = driver.cuStreamSynchronize(self.handle)
        check_driver(err, "cuStreamSynchronize")

    def __cuda_stream__(self):
        return (0, self.handle)

    def __int__(self) -> int:
        return self.handle

    def __repr__(self) -> str:
        return f"kaionb.Stream(handle=0x{self.handle:x})"


def stream_handle(obj) -> int:
    """The raw CUstream handle of any stream-like object (None means the default stream)."""
    if obj is None:
        return 0
    if isinstance(obj, Stream):
        return obj.handle
    if isinstance(obj, int):
        if obj < 0:
            raise ValueError(f"kaionb.stream: a raw stream handle must be >= 0, got {obj}")
        return obj
    if hasattr(obj, "__cuda_stream__"):
        return int(obj.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr"):  # PyTorch, CuPy
        if hasattr(obj, attr):
            return int(getattr(obj, attr))
    handle = getattr(obj, "handle", None)  # numba (ctypes c_void_p) or cuda.core (CUstream)
    if handle is not None:
        value = getattr(handle, "value", handle)
        return int(value or 0)
    raise TypeError(
        "kaionb.stream: expected a kaionb/CuPy/PyTorch/numba/cuda.core stream, an object with "
        f"__cuda_stream__, or an int handle; got {type(obj).__name__}"
    )


_ThreadState.stream = _DEFAULT_STREAM = Stream(_handle=0)


def current_stream() -> Stream:
    """The stream kaionb ops on this thread run on."""
    return STATE.stream


@contextlib.contextmanager
def stream(s):
    """``with kaionb.stream(s):`` run the ops in the block on ``s`` (any stream-like object)."""
    previous = current_stream()
    wrapped = Stream.wrap(s)
    _check_stream_context(wrapped.handle)
    STATE.stream = wrapped
    try:
        yield STATE.stream
    finally:
        STATE.stream = previous


def _check_stream_context(handle: int) -> None:
    """A ValueError, before anything runs on it, for a stream of another device or
    context: kaionb's kernels are loaded in the current device's primary context."""
    if handle in (0, 1, 2):  # the legacy / per-thread default streams: every context's
        return
    from cuda.bindings import driver

    current_device()
    err, ctx = driver.cuStreamGetCtx(handle)
    check_driver(err, "kaionb.stream: cuStreamGetCtx")
    err, ours = driver.cuCtxGetCurrent()
    check_driver(err, "kaionb.stream: cuCtxGetCurrent")
    if int(ctx) != int(ours):
        raise ValueError(
            f"kaionb.stream: argument 's' expected a stream of the current device's primary "
            f"context (device {current_device().device_id}), got a stream of another device "
            f"or context (handle 0x{handle:x})")


def is_capturing(handle: int) -> bool:
    """Whether the stream ``handle`` is capturing a CUDA graph (any library's capture:
    torch.cuda.graph, CuPy's begin_capture, kaionb.graph)."""
    from cuda.bindings import driver

    if STATE.device is None:
        current_device()  # the driver call needs the context current
    err, status = driver.cuStreamIsCapturing(handle)
    check_driver(err, "cuStreamIsCapturing")
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def graph_allocator():
    """The current device's graph memory resource: allocations made while a stream
    captures become the graph's own (an allocation node; freed by a free node, or before
    the next launch of a graph instantiated to free on launch)."""
    gmr = STATE.graph_allocator
    if gmr is None:
        from cuda.core import GraphMemoryResource

        gmr = STATE.graph_allocator = GraphMemoryResource(current_device())
    return gmr


def check_driver(err, what: str) -> None:
    """Raise RuntimeError naming the driver call when a CUresult is not CUDA_SUCCESS."""
    if int(err) != 0:
        from cuda.bindings import driver

        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"kaionb: {what} failed: {name.decode() if name else int(err)}")
