"""The CUDA devices kaionb works on, the current device and stream of each thread.

kaionb uses each device's *primary* context, the same one numba, CuPy and PyTorch use, so
pointers and streams pass between them freely. Each thread has a current device (the one
whose context is current on the thread when kaionb first needs one, device 0 on a fresh
thread, until ``kaionb.set_device(n)`` or ``with kaionb.device(n):`` says otherwise), and
each device a current stream on that thread: the legacy default stream unless a
``with kaionb.stream(s):`` block says otherwise.

Ops run where their inputs live: :func:`enter_device` makes the inputs' device current
for the length of one op (its primary context, allocator and stream) and
:func:`leave_device` restores what was current before, the driver's current context
included (PyTorch and CuPy keep their own current device in it). With one GPU that is
one comparison per op; with several, one ``cuCtxGetCurrent`` more.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import threading


class _ThreadState(threading.local):
    """Per-thread state (``STATE``); class attributes are the defaults (a miss costs no
    exception: ``current_stream()`` runs on every call of every op). ``device``,
    ``allocator``, ``graph_allocator`` and ``stream`` belong to device ``ordinal``; the
    same four of this thread's other devices wait in ``parked``."""

    ordinal = 0  # this thread's current device
    chosen = False  # whether ordinal was chosen (else current_device() adopts the driver's)
    device = None  # its cuda.core Device, once its context was made current
    allocator = None
    graph_allocator = None
    stream = None  # the default stream, set below once Stream exists
    parked = None  # ordinal -> (device, allocator, graph_allocator, stream)
    scopes = None  # the undo tokens of the kaionb.device blocks open on this thread
    recorder = None  # kernels.op's recording of an op's first call, while it runs
    calls = None  # kernels.op's replays of recorded calls, by call key
    capture = None  # the kaionb.graph() capture in progress on this thread


STATE = _ThreadState()
# Set once a context exists and more than one GPU is visible: ops then also check the
# driver's current context (another library may have switched it).
_MULTI_GPU = False


def gpu_available() -> bool:
    """Test whether a CUDA driver and at least one GPU are present.

    Returns
    -------
    bool
        True when kaionb can run kernels on this machine.

    Examples
    --------
    >>> kaionb.gpu_available()
    True
    """
    return device_count() > 0


@functools.lru_cache(maxsize=1)
def device_count() -> int:
    """Count the CUDA GPUs this process sees.

    Returns
    -------
    int
        The number of GPUs (0 without a driver); ``CUDA_VISIBLE_DEVICES`` applies.

    Examples
    --------
    >>> kaionb.device_count() >= 1
    True
    """
    from numba import cuda

    try:
        return len(cuda.gpus) if cuda.is_available() else 0
    except Exception:
        return 0


def device_ordinal(spec, where: str = "kaionb", name: str = "device") -> int:
    """The ordinal of device ``spec``: an int, a cuda.core ``Device``, a ``torch.device``
    (``cuda:n``), a CuPy ``Device``, a string ``"cuda:n"``, a ``kaionb.device`` or a
    DeviceArray (its device); None is the current device. A ValueError naming ``where``
    for an ordinal no GPU has, TypeError for anything else."""
    if spec is None:
        return current_ordinal()
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
        ordinal = int(spec)
    elif isinstance(spec, device):  # kaionb.device(n)
        ordinal = spec.ordinal
    elif isinstance(spec, str) or type(spec).__name__ == "device":  # "cuda:1", torch
        text = str(spec)
        kind, _, index = text.partition(":")
        if kind != "cuda" or (index and not (index.isascii() and index.isdigit())):
            raise ValueError(f"{where}: argument '{name}' expected a CUDA device ('cuda', "
                             f"'cuda:N' or an ordinal), got {text!r}")
        ordinal = int(index) if index else current_ordinal()
    else:
        for attr in ("device_id", "id"):  # cuda.core / DeviceArray, CuPy
            value = getattr(spec, attr, None)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                ordinal = int(value)
                break
        else:
            raise TypeError(f"{where}: argument '{name}' expected a device (an ordinal, "
                            f"kaionb.Device, torch.device or 'cuda:N'), got "
                            f"{type(spec).__name__}")
    check_ordinal(ordinal, where, name)
    return ordinal


def check_ordinal(ordinal: int, where: str = "kaionb", name: str = "device") -> None:
    """A ValueError for a device ordinal below 0 or (with a GPU) past the last GPU."""
    if ordinal == 0:  # the hot case, and every machine with a GPU has a device 0
        return
    count = device_count()
    if ordinal < 0 or (count and ordinal >= count):
        raise ValueError(f"{where}: argument '{name}' expected a device ordinal from 0 to "
                         f"{max(count, 1) - 1} ({count} GPU{'s' if count != 1 else ''} "
                         f"visible), got {ordinal}")


@functools.lru_cache(maxsize=None)
def _core_device(ordinal: int):
    from cuda.core import Device

    return Device(ordinal)


def Device(ordinal=None):
    """Return the cuda.core ``Device`` for ``ordinal``.

    ``kaionb.Device(1).name``, ``.compute_capability``, ``.properties``.

    Parameters
    ----------
    ordinal : int, torch.device, str or None, optional
        The GPU: an ordinal, a ``torch.device``, ``"cuda:N"``, a CuPy or cuda.core
        device, a DeviceArray (its device); None is this thread's current device.

    Returns
    -------
    cuda.core.Device
        The device (one object per ordinal).

    Raises
    ------
    TypeError
        Something that names no device.
    ValueError
        An ordinal no GPU has, or a string that is not ``"cuda"`` / ``"cuda:N"``.

    Examples
    --------
    >>> kaionb.Device(0).compute_capability >= (8, 0)
    True
    """
    return _core_device(device_ordinal(ordinal, "kaionb.Device", "ordinal"))


def current_device():
    """The cuda.core Device that is current on this thread, its primary context made current.

    A thread that has not chosen a device (``set_device``, ``with kaionb.device``) takes
    the one whose context is current on it, as the CUDA runtime would: after
    ``torch.cuda.set_device(1)``, kaionb's first array lands on device 1 too."""
    dev = STATE.device
    if dev is None:
        if not gpu_available():
            raise RuntimeError("kaionb: no CUDA GPU is available on this machine")
        if not STATE.chosen:
            STATE.chosen = True
            STATE.ordinal = _driver_current_ordinal(STATE.ordinal)
        check_ordinal(STATE.ordinal)
        dev = _core_device(STATE.ordinal)
        dev.set_current()
        STATE.device = dev
        global _MULTI_GPU
        _MULTI_GPU = device_count() > 1
    return dev


def _driver_current_ordinal(default: int) -> int:
    """The device of the context current on this thread, or ``default`` when none is."""
    from cuda.bindings import driver

    err, ctx = driver.cuCtxGetCurrent()
    if int(err) != 0 or not int(ctx):
        return default
    err, ordinal = driver.cuCtxGetDevice()
    return int(ordinal) if int(err) == 0 else default


def current_ordinal() -> int:
    """This thread's current device ordinal (a thread that chose none adopts the driver's
    current device first, see :func:`current_device`)."""
    if not STATE.chosen and STATE.device is None and gpu_available():
        current_device()
    return STATE.ordinal


def current_allocator():
    """(the current device's stream-ordered memory resource, its ordinal) — cached per thread,
    since every allocation asks."""
    alloc = STATE.allocator
    if alloc is None:
        dev = current_device()
        alloc = STATE.allocator = (dev.memory_resource, dev.device_id)
    return alloc


@functools.lru_cache(maxsize=None)
def _primary_context(ordinal: int) -> int:
    """The primary context of device ``ordinal`` (retained for the life of the process)."""
    from cuda.bindings import driver

    err, dev = driver.cuDeviceGet(ordinal)
    check_driver(err, f"cuDeviceGet({ordinal})")
    err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
    check_driver(err, f"cuDevicePrimaryCtxRetain({ordinal})")
    return int(ctx)


def _switch(ordinal: int) -> None:
    """Make ``ordinal`` this thread's current device in STATE (park the current one's
    state, bring back the new one's); the driver's context is the caller's business."""
    STATE.chosen = True
    if ordinal == STATE.ordinal:
        return
    parked = STATE.parked
    if parked is None:
        parked = STATE.parked = {}
    parked[STATE.ordinal] = (STATE.device, STATE.allocator, STATE.graph_allocator,
                             STATE.stream)
    (STATE.device, STATE.allocator, STATE.graph_allocator, STATE.stream) = parked.pop(
        ordinal, (None, None, None, _DEFAULT_STREAM))
    STATE.ordinal = ordinal


def _set_context(ctx: int) -> None:
    from cuda.bindings import driver

    (err,) = driver.cuCtxSetCurrent(ctx)
    check_driver(err, "cuCtxSetCurrent")


def enter_device(ordinal: int):
    """Make device ``ordinal`` current for one op (STATE and the driver's context); returns
    what :func:`leave_device` needs to restore the previous state, or None when nothing
    changed. Hot path: with one GPU a matching ordinal costs two comparisons (and
    without a GPU nothing is checked: the op's validation runs, then fails to launch)."""
    if not _MULTI_GPU and ordinal == STATE.ordinal and (
            STATE.device is not None or not gpu_available()):
        return None
    from cuda.bindings import driver

    check_ordinal(ordinal)
    current_device()  # the thread's own device initialized (and _MULTI_GPU known)
    err, ctx = driver.cuCtxGetCurrent()
    check_driver(err, "cuCtxGetCurrent")
    previous_ctx = int(ctx)
    target = _primary_context(ordinal)
    if ordinal == STATE.ordinal and previous_ctx == target:
        return None
    if STATE.capture is not None and ordinal != STATE.ordinal:
        # its launches would go to the other device's stream, outside the graph
        raise RuntimeError(f"kaionb.graph: an op on device {ordinal} inside a capture on "
                           f"device {STATE.ordinal}; a graph captures one device's work")
    token = (STATE.ordinal, previous_ctx)
    _switch(ordinal)
    try:
        if STATE.device is None:
            current_device()  # first use of this device on this thread: cuda.core sets it up
        if previous_ctx != target:
            _set_context(target)
    except BaseException:
        leave_device(token)
        raise
    return token


def leave_device(token) -> None:
    """Undo :func:`enter_device` (``token`` is what it returned; None does nothing)."""
    if token is None:
        return
    ordinal, ctx = token
    _switch(ordinal)
    _set_context(ctx)


class device:
    """Make GPU ``n`` this thread's current device inside a ``with`` block.

    ``with kaionb.device(n):`` — new arrays are allocated there and ``kaionb.stream``
    names its streams; the previous device comes back at the end of the block. (Ops run
    on their inputs' device wherever they are called.) Entering returns the ordinal. One
    object may be entered by several threads, or nested.

    Parameters
    ----------
    n : int, kaionb.Device, torch.device or str
        The GPU: an ordinal, a ``kaionb.Device``, a ``torch.device``, ``"cuda:N"``, a
        CuPy device or a DeviceArray (its device).

    Raises
    ------
    TypeError
        Something that names no device.
    ValueError
        An ordinal no GPU has, or a string that is not ``"cuda"`` / ``"cuda:N"``.

    Examples
    --------
    >>> with kaionb.device(0) as ordinal:
    ...     a = kaionb.zeros(4)
    >>> ordinal, a.device
    (0, 0)
    """

    __slots__ = ("ordinal",)

    def __init__(self, n):
        self.ordinal = device_ordinal(n, "kaionb.device", "n")

    def __enter__(self) -> int:
        # The undo token on a per-thread stack: one object may be entered by several
        # threads, or nested.
        token = enter_device(self.ordinal)
        scopes = STATE.scopes
        if scopes is None:
            scopes = STATE.scopes = []
        scopes.append(token)
        return self.ordinal

    def __exit__(self, *exc) -> None:
        leave_device(STATE.scopes.pop())


def set_device(n) -> None:
    """Make GPU ``n`` this thread's current device (outside any ``with kaionb.device``).

    Parameters
    ----------
    n : int, kaionb.Device, torch.device or str
        The GPU, as :class:`device` takes it.

    Raises
    ------
    TypeError
        Something that names no device.
    ValueError
        An ordinal no GPU has, or a string that is not ``"cuda"`` / ``"cuda:N"``.
    RuntimeError
        No GPU on this machine, or a :func:`kaionb.graph` capture in progress on another
        device.

    Examples
    --------
    >>> kaionb.set_device(0)
    >>> kaionb.zeros(2).device
    0
    """
    ordinal = device_ordinal(n, "kaionb.set_device", "n")
    if not gpu_available():
        raise RuntimeError("kaionb.set_device: no CUDA GPU is available on this machine")
    if STATE.capture is not None and ordinal != STATE.ordinal:
        raise RuntimeError("kaionb.set_device: a kaionb.graph() capture is in progress on "
                           f"device {STATE.ordinal}; a graph captures one device's work")
    _switch(ordinal)
    current_device()
    if _MULTI_GPU:
        _set_context(_primary_context(ordinal))


@functools.lru_cache(maxsize=None)
def _compute_capability(ordinal: int) -> tuple[int, int]:
    cc = _core_device(ordinal).compute_capability
    return (cc.major, cc.minor)


def compute_capability(ordinal: int | None = None) -> tuple[int, int]:
    """(major, minor) of device ``ordinal`` (default: the current device)."""
    return _compute_capability(STATE.ordinal if ordinal is None else ordinal)


@functools.lru_cache(maxsize=None)
def _multiprocessor_count(ordinal: int) -> int:
    return _core_device(ordinal).properties.multiprocessor_count


def multiprocessor_count(ordinal: int | None = None) -> int:
    """The SM count of device ``ordinal`` (default: the current device)."""
    return _multiprocessor_count(STATE.ordinal if ordinal is None else ordinal)


@functools.lru_cache(maxsize=None)
def _shared_per_block_optin(ordinal: int) -> int:
    return _core_device(ordinal).properties.max_shared_memory_per_block_optin


def shared_per_block_optin(ordinal: int | None = None) -> int:
    """The most shared memory (bytes) one block of device ``ordinal`` may opt in to:
    99 KiB on sm_86/sm_89, 163 on sm_80, 227 on sm_90."""
    return _shared_per_block_optin(STATE.ordinal if ordinal is None else ordinal)


# -- streams ---------------------------------------------------------------------------


class Stream:
    """A CUDA stream as kaionb sees it: a raw ``CUstream`` handle plus whatever owns it.

    ``kaionb.Stream()`` creates a new non-blocking stream on the current device
    (cuda.core owns it); ``Stream.wrap(obj)`` adopts a CuPy, PyTorch, numba or cuda.core
    stream, an object with ``__cuda_stream__``, or a raw integer handle, keeping the owner
    alive. It exports ``__cuda_stream__`` and ``int(stream)`` is the handle.

    Parameters
    ----------
    _handle : int, optional
        Internal (what :meth:`wrap` passes): an existing handle; leave it out.
    _owner : object, optional
        Internal: what keeps that handle's stream alive.

    Attributes
    ----------
    handle : int
        The raw ``CUstream`` handle (0: the legacy default stream).
    cu : cuda.bindings.driver.CUstream
        The same handle as the driver bindings' type.

    Examples
    --------
    >>> s = kaionb.Stream()
    >>> with kaionb.stream(s):
    ...     a = kaionb.ones(4)
    >>> s.synchronize()
    >>> a.get(stream=s)
    array([1., 1., 1., 1.])
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
    def wrap(cls, obj, where: str = "kaionb.stream", name: str = "s") -> "Stream":
        """Return ``obj`` (any stream-like object) as a Stream.

        A Stream is returned as is; others are adopted, keeping ``obj`` alive.

        Parameters
        ----------
        obj : stream-like
            A kaionb, CuPy, PyTorch, numba or cuda.core stream, an object with
            ``__cuda_stream__``, a raw handle (int >= 0), or None (the default stream).
        where : str, optional
            The function named in refusals.
        name : str, optional
            The argument named in refusals.

        Returns
        -------
        Stream
            The stream.

        Raises
        ------
        TypeError
            An object that is not a stream.
        ValueError
            A negative handle.

        Examples
        --------
        >>> kaionb.Stream.wrap(0).handle
        0
        """
        if isinstance(obj, Stream):
            return obj
        return cls(_handle=stream_handle(obj, where, name), _owner=obj)

    def as_core(self):
        """Return this stream as a cuda.core Stream (for the allocator).

        Made once and kept; a wrapped stream's cuda.core Stream holds its owner.

        Returns
        -------
        cuda.core.Stream
            The same CUDA stream.

        Raises
        ------
        RuntimeError
            No GPU on this machine.

        Examples
        --------
        >>> kaionb.Stream().as_core().handle is not None
        True
        """
        if self._core is None:
            from cuda.core import LEGACY_DEFAULT_STREAM, Stream as CoreStream

            if isinstance(self._owner, CoreStream):
                self._core = self._owner
            elif self.handle == 0:
                self._core = LEGACY_DEFAULT_STREAM
            else:
                # Wrapped through __cuda_stream__, the cuda.core stream holds this one and
                # so the owner (a CuPy or torch stream): an array freed after the owner's
                # last reference died would otherwise free on a destroyed stream (seen:
                # CUDA_ERROR_INVALID_CONTEXT, then a crash, at the end of a CuPy process).
                self._core = current_device().create_stream(self)
        return self._core

    def synchronize(self) -> None:
        """Wait until the work queued on this stream has finished.

        Raises
        ------
        RuntimeError
            The driver's error (a failed kernel earlier on the stream included).

        Examples
        --------
        >>> kaionb.current_stream().synchronize()
        """
        from cuda.bindings import driver

        (err,) = driver.cuStreamSynchronize(self.handle)
        check_driver(err, "cuStreamSynchronize")

    def __cuda_stream__(self):
        return (0, self.handle)

    def __int__(self) -> int:
        return self.handle

    def __repr__(self) -> str:
        return f"kaionb.Stream(handle=0x{self.handle:x})"


def stream_handle(obj, where: str = "kaionb.stream", name: str = "s") -> int:
    """The raw CUstream handle of any stream-like object (None means the default stream);
    refusals name ``where`` and its argument ``name``."""
    if obj is None:
        return 0
    if isinstance(obj, Stream):
        return obj.handle
    if isinstance(obj, int) and not isinstance(obj, bool):
        if obj < 0:
            raise ValueError(f"{where}: argument '{name}' expected a raw stream handle >= 0, "
                             f"got {obj}")
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
        f"{where}: argument '{name}' expected a kaionb/CuPy/PyTorch/numba/cuda.core stream, an "
        f"object with __cuda_stream__, or an int handle, got {type(obj).__name__}"
    )


_ThreadState.stream = _DEFAULT_STREAM = Stream(_handle=0)


def current_stream() -> Stream:
    """Return the stream kaionb ops on this thread run on (the current device's).

    The legacy default stream (handle 0) unless a ``with kaionb.stream(s):`` block says
    otherwise.

    Returns
    -------
    Stream
        The current stream.

    Examples
    --------
    >>> kaionb.current_stream().handle
    0
    """
    return STATE.stream


def stream_of(ordinal: int) -> Stream:
    """This thread's current stream of device ``ordinal``."""
    if ordinal == STATE.ordinal:
        return STATE.stream
    parked = (STATE.parked or {}).get(ordinal)
    return _DEFAULT_STREAM if parked is None else parked[3]


def pointer_device(obj) -> int | None:
    """The device of the memory an object with ``__cuda_array_interface__`` points to, or
    None when it does not say (a null pointer, host memory, a malformed interface)."""
    from cuda.bindings import driver

    try:
        ptr = int(obj.__cuda_array_interface__["data"][0])
    except Exception:  # the op's own validation names what is wrong with it
        return None
    if not ptr:
        return None
    err, ordinal = driver.cuPointerGetAttribute(
        driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    return int(ordinal) if int(err) == 0 else None


_LEGACY_COMPANIONS: dict = {}


def allocation_stream(ordinal: int, stream: Stream):
    """The cuda.core stream an allocation on ``stream`` of device ``ordinal`` is made and
    later freed on. The legacy default stream's handle means the *current* context's, so
    with several GPUs a device-1 array freed while device 0 is current would have its
    free ordered on device 0's work (and its memory reused under a running kernel): there
    a blocking stream of the array's own device stands in, which the legacy default
    stream of that device waits for and is waited on by."""
    if not _MULTI_GPU or stream.handle not in (0, 1):
        return stream.as_core()
    companion = _LEGACY_COMPANIONS.get(ordinal)
    if companion is None:
        from cuda.core import StreamOptions

        companion = _LEGACY_COMPANIONS.setdefault(ordinal, current_device().create_stream(
            options=StreamOptions(nonblocking=False)))  # (a racing thread's is dropped)
    return companion


_PEERS_ENABLED: set = set()  # (src, dst) pairs settled: peer access on, or not possible
_PEERS_LOCK = threading.Lock()


def _enable_peer_access(src: int, dst: int) -> None:
    """Let device ``dst`` read ``src``'s memory directly where the GPUs allow it (NVLink or
    PCIe peer-to-peer): the pool kaionb allocates from and the primary context (for other
    libraries' memory). Where they do not, copies go through the host (the driver stages
    them)."""
    if (src, dst) in _PEERS_ENABLED:
        return
    with _PEERS_LOCK:
        if (src, dst) in _PEERS_ENABLED or not _core_device(dst).can_access_peer(src):
            _PEERS_ENABLED.add((src, dst))
            return
        from cuda.bindings import driver

        token = enter_device(dst)
        try:
            (err,) = driver.cuCtxEnablePeerAccess(_primary_context(src), 0)
            if err in (driver.CUresult.CUDA_SUCCESS,
                       driver.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
                _core_device(src).memory_resource.peer_accessible_by.add(dst)
            # else (too many peers, ...): the copies go through the host
        finally:
            leave_device(token)
        _PEERS_ENABLED.add((src, dst))


def peer_copy(dst_ptr: int, dst: int, dst_stream: int, src_ptr: int, src: int,
              nbytes: int) -> None:
    """Copy ``nbytes`` from device ``src`` to device ``dst`` on ``dst_stream`` (a stream
    of ``dst``), after the work queued on ``src``'s current stream; that stream then
    waits for the copy, so the source memory is not freed (stream-ordered) before it is
    read."""
    from cuda.bindings import driver

    _enable_peer_access(src, dst)
    src_stream = stream_of(src).handle
    done_src = _event_on(src, src_stream)
    (err,) = driver.cuStreamWaitEvent(dst_stream, done_src, 0)
    check_driver(err, "cuStreamWaitEvent")
    (err,) = driver.cuMemcpyPeerAsync(dst_ptr, _primary_context(dst), src_ptr,
                                      _primary_context(src), nbytes, dst_stream)
    check_driver(err, f"cuMemcpyPeerAsync(device {src} -> {dst})")
    done_dst = _event_on(dst, dst_stream)
    token = enter_device(src)
    try:
        (err,) = driver.cuStreamWaitEvent(src_stream, done_dst, 0)
        check_driver(err, "cuStreamWaitEvent")
    finally:
        leave_device(token)
    driver.cuEventDestroy(done_src)  # the driver frees it once the waits are done
    driver.cuEventDestroy(done_dst)


def _event_on(ordinal: int, stream_handle: int):
    """A new event recorded on ``stream_handle`` of device ``ordinal``."""
    from cuda.bindings import driver

    token = enter_device(ordinal)
    try:
        err, event = driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        check_driver(err, "cuEventCreate")
        (err,) = driver.cuEventRecord(event, stream_handle)
        check_driver(err, "cuEventRecord")
    finally:
        leave_device(token)
    return event


@contextlib.contextmanager
def stream(s):
    """Run the kaionb ops of a ``with`` block on stream ``s``.

    ``with kaionb.stream(s):`` — ``s`` is any stream-like object of the current device
    (for another device: ``with kaionb.device(n), kaionb.stream(s):``); the previous
    stream comes back at the end of the block. The block's value is the wrapped
    :class:`Stream`.

    Parameters
    ----------
    s : stream-like
        A kaionb, CuPy, PyTorch, numba or cuda.core stream, an object with
        ``__cuda_stream__``, or a raw handle.

    Yields
    ------
    Stream
        ``s`` as a kaionb Stream.

    Raises
    ------
    TypeError
        An object that is not a stream.
    ValueError
        A negative handle, or a stream of another device or context.

    Examples
    --------
    >>> s = kaionb.Stream()
    >>> with kaionb.stream(s) as current:
    ...     y = kaionb.arange(4) * 2
    >>> current.handle == s.handle
    True
    """
    previous = current_stream()
    wrapped = Stream.wrap(s)
    _check_stream_context(wrapped.handle)
    entered = STATE.ordinal
    STATE.stream = wrapped
    try:
        yield STATE.stream
    finally:
        if STATE.ordinal == entered:
            STATE.stream = previous
        else:  # set_device moved the thread inside the block: restore the device entered
            device_state = STATE.parked[entered]
            STATE.parked[entered] = (*device_state[:3], previous)


def _check_stream_context(handle: int) -> None:
    """A ValueError, before anything runs on it, for a stream of another device or
    context: kaionb's kernels are loaded in the current device's primary context."""
    if handle in (0, 1, 2):  # the legacy / per-thread default streams: every context's
        return
    from cuda.bindings import driver

    current_device()
    err, ctx = driver.cuStreamGetCtx(handle)
    check_driver(err, "kaionb.stream: cuStreamGetCtx")
    ours = _primary_context(STATE.ordinal)
    if int(ctx) != ours:
        owner = next((f"device {i}" for i in range(device_count())
                      if _primary_context(i) == int(ctx)), "another context")
        raise ValueError(
            f"kaionb.stream: argument 's' expected a stream of the current device's primary "
            f"context (device {STATE.ordinal}), got a stream of {owner} (handle "
            f"0x{handle:x}); run `with kaionb.device(n), kaionb.stream(s):` for a stream of "
            f"device n")


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
