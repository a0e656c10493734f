"""CUDA graphs: capture a sequence of kaionb ops once, replay it for a few µs.

    with kaionb.graph() as g:          # the ops run nothing: they are recorded
        h = kaionb.rms_norm(x, w)
        y = kaionb.matmul(h, wq)
    g.replay()                         # runs them on the current stream; y holds the result
    x[...] = new values; g.replay()    # (write new inputs into the same memory)

A graph holds pointers: each replay reads the inputs and writes the outputs that the
captured calls saw. kaionb.graph keeps that memory alive for as long as the graph lives,
so a replay never reads freed memory. Arrays allocated during the capture (the outputs of
ops that allocate, split-K workspaces) belong to the graph (cuda.core's
GraphMemoryResource): an array that dies inside the ``with`` block is freed inside the
graph, one that outlives it (``y`` above) holds the result of the latest replay.

Capture works the same under ``torch.cuda.graph`` and CuPy's ``Stream.begin_capture``:
run the ops inside ``with kaionb.stream(capturing_stream):``. There, keeping inputs and
outputs alive is the caller's job (as it is for torch's own static tensors).

What cannot be captured raises before anything is queued: host transfers (``.get()``,
``asarray`` of host memory) wait for the GPU, which a capturing stream cannot do.
"""

from __future__ import annotations

import contextlib

from ._device import STATE, Stream, current_device, current_stream, device
from ._device import stream as run_on

__all__ = ["Graph", "graph"]


class Graph:
    """A captured sequence of kaionb launches: :meth:`replay` runs it.

    Made by :func:`graph`. A graph holds pointers: each replay reads the inputs and
    writes the outputs that the captured calls saw, and the graph keeps that memory
    alive for as long as it lives. Arrays allocated during the capture belong to the
    graph; one that outlives the ``with`` block holds the result of the latest replay.

    Attributes
    ----------
    device : int
        The ordinal of the device whose work it captured.

    Examples
    --------
    >>> x = kaionb.ones(4, dtype=np.float32)
    >>> with kaionb.graph() as g:
    ...     y = x * 2
    >>> g.replay()
    >>> y.get()
    array([2., 2., 2., 2.], dtype=float32)
    """

    def __init__(self):
        self._graph = None  # the cuda.core Graph, once the capture ends
        self._kept: dict[int, object] = {}  # id → owner of memory the launches read
        self.device = STATE.ordinal  # the device whose work it captured

    def keep(self, arrays) -> None:
        """Hold the memory of a captured launch's array arguments (called by the capture).

        The graph's own allocations need no holding (they live with the graph).

        Parameters
        ----------
        arrays : iterable of DeviceArray
            The launch's array arguments.

        Examples
        --------
        >>> g = kaionb.Graph()
        >>> g.keep([kaionb.zeros(4)])
        >>> g.kept_buffers
        1
        """
        from cuda.core import GraphMemoryResource

        for a in arrays:
            owner = getattr(a, "_owner", None)
            if owner is None or id(owner) in self._kept:
                continue
            if isinstance(getattr(owner, "memory_resource", None), GraphMemoryResource):
                continue
            self._kept[id(owner)] = owner

    def replay(self, stream=None) -> None:
        """Run the captured launches, after the work queued on the stream so far.

        Parameters
        ----------
        stream : stream-like, optional
            Where to run (default: this thread's current stream of the graph's device).

        Raises
        ------
        RuntimeError
            A graph still capturing, whose capture failed, or closed.
        TypeError
            A ``stream`` that is not a stream.

        Examples
        --------
        >>> x = kaionb.zeros(3, np.int32)
        >>> with kaionb.graph() as g:
        ...     x += 1
        >>> g.replay(); g.replay()
        >>> x.get()
        array([2, 2, 2], dtype=int32)
        """
        if self._graph is None:
            raise RuntimeError("kaionb.Graph.replay: the graph is not complete (still "
                               "capturing, or the capture failed) or was closed")
        with device(self.device):  # its launches are that device's
            target = (current_stream() if stream is None
                      else Stream.wrap(stream, "kaionb.Graph.replay", "stream"))
            self._graph.launch(target.as_core())

    def upload(self, stream=None) -> None:
        """Prepare the graph's launch resources ahead of the first replay (optional).

        Parameters
        ----------
        stream : stream-like, optional
            The stream to upload on (default: the current stream of the graph's device).

        Raises
        ------
        RuntimeError
            A graph that is not complete or was closed.
        TypeError
            A ``stream`` that is not a stream.

        Examples
        --------
        >>> x = kaionb.zeros(3)
        >>> with kaionb.graph() as g:
        ...     y = x + 1
        >>> g.upload()
        """
        if self._graph is None:
            raise RuntimeError("kaionb.Graph.upload: the graph is not complete or was closed")
        with device(self.device):
            target = (current_stream() if stream is None
                      else Stream.wrap(stream, "kaionb.Graph.upload", "stream"))
            self._graph.upload(target.as_core())

    def close(self) -> None:
        """Release the graph and the memory it holds.

        The driver defers the release until the work queued on it finishes; a closed
        graph cannot replay.

        Raises
        ------
        RuntimeError
            The driver's error, if releasing fails.

        Examples
        --------
        >>> with kaionb.graph() as g:
        ...     y = kaionb.zeros(3) + 1
        >>> g.close()
        """
        if self._graph is not None:
            self._graph.close()
            self._graph = None
        self._kept.clear()

    @property
    def kept_buffers(self) -> int:
        """How many separate allocations the graph keeps alive (inputs, outputs).

        Examples
        --------
        >>> x = kaionb.ones(4)
        >>> with kaionb.graph() as g:
        ...     y = x + 1
        >>> g.kept_buffers >= 1
        True
        """
        return len(self._kept)


@contextlib.contextmanager
def graph(stream=None):
    """Capture the kaionb ops of the ``with`` block into a :class:`Graph`.

    The ops run nothing during the capture: they are recorded on a capturing stream, a
    new one or ``stream`` (any stream-like object of the current device; not the legacy
    default stream, which cannot capture). An exception inside the block ends the
    capture and discards it; the context stays usable. What cannot be captured raises
    before anything is queued: host transfers (``.get()``, ``asarray`` of host memory)
    wait for the GPU, which a capturing stream cannot do. Under ``torch.cuda.graph`` or
    CuPy's ``Stream.begin_capture``, run the ops in ``with kaionb.stream(capturing):``
    instead.

    Parameters
    ----------
    stream : stream-like, optional
        The stream to capture on (default: a new one).

    Yields
    ------
    Graph
        The graph, complete (replayable) once the block ends.

    Raises
    ------
    TypeError
        A ``stream`` that is not a stream.
    ValueError
        The default stream as ``stream``.
    RuntimeError
        A capture already in progress on this thread (captures do not nest).

    Examples
    --------
    >>> x = kaionb.asarray(np.arange(4.0))
    >>> with kaionb.graph() as g:
    ...     y = kaionb.exp(x) + 1
    >>> x[...] = 0.0          # new inputs, written into the same memory
    >>> g.replay()
    >>> y.get()
    array([2., 2., 2., 2.])
    """
    if STATE.capture is not None:
        raise RuntimeError("kaionb.graph: a capture is already in progress on this thread "
                           "(captures do not nest)")
    from cuda.core.graph import GraphCompleteOptions

    capture_stream = Stream() if stream is None else Stream.wrap(stream, "kaionb.graph", "stream")
    if capture_stream.handle in (0, 1, 2):
        raise ValueError("kaionb.graph: argument 'stream' expected a created stream, got the "
                         "default stream (it cannot capture)")
    current_device()
    builder = capture_stream.as_core().create_graph_builder()
    g = Graph()
    # relaxed: a kernel's first use loads its module, which a stricter mode refuses.
    builder.begin_building("relaxed")
    STATE.capture = g
    try:
        with run_on(builder.stream):
            yield g
    except BaseException:
        STATE.capture = None
        try:
            builder.end_building()
        except Exception:  # the capture may be invalid already: the original error matters
            pass
        builder.close()
        g.close()
        raise
    STATE.capture = None
    builder.end_building()
    try:
        g._graph = builder.complete(GraphCompleteOptions(auto_free_on_launch=True))
    finally:
        builder.close()
