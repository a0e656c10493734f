"""The host path every op follows, written once.

An op's host side has two layers (docs: style.md #3). ``<op>_fwd(inputs..., out=None)``
validates the inputs (:mod:`kaionb.validation`: every error through ``fail``, naming the
op, the argument, what was expected and what came), resolves the output with
:func:`output` (or :func:`outputs`), and hands a launch function to :func:`run`, which
calls it only when there is something to compute. The launch function takes views,
chooses a :class:`Plan` — the kernel picked by key, never by position — and launches it.
The public ``<op>(...)`` comes last: it calls ``<op>_fwd`` and, for an op with a backward
rule, records it on the active tape with :func:`record`. An op written on it::

    def scale_rows_fwd(x, w, *, out=None):
        x = as_array("scale_rows", "x", x, dtypes=FLOAT_DTYPES)
        w = as_array("scale_rows", "w", w, dtypes=(x.dtype,))
        check_shape("scale_rows", "w", w, x.shape[-1:])
        out = output("scale_rows", out, x.shape, x.dtype, device=x.device_id)
        return run(_scale_rows_launch, x, w, out=out)

    def _scale_rows_launch(x, w, out):  # never called for an empty x
        x2, out2 = rows_view("scale_rows", "x", x), rows_view("scale_rows", "out", out)
        plan = Plan.of(_KERNELS["scale_rows", x.dtype], (x2.shape[0],), (256,))
        plan.launch(x2, w, out2)

    def scale_rows(x, w, *, out=None):
        y = scale_rows_fwd(x, w, out=out)
        record(lambda g: scale_rows_bwd(g, x, w), (x, w), (y,))
        return y

An op that chooses its output dtype (matmul's ``dtype=``) settles it first and passes
it to :func:`output`. Ops whose plan depends only on the operands' layout (matmul) keep
plans in a :class:`PlanCache` keyed by that layout and skip the analysis on a repeated
call.

Every ``<op>_fwd`` is wrapped in :func:`fast_path`: the first call with a given
signature (array layouts, scalars) runs the whole host path above while a recorder
notes what it did — allocations, launches, workspaces — in terms of the call's own
arrays; a later call with the same signature replays that record: no validation, no
views, no plan choice, arguments packed once with only the pointers rewritten.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import threading
from typing import NamedTuple

import numpy as np

from .. import _device
from .._device import (
    STATE,
    check_driver,
    current_allocator,
    current_ordinal,
    current_stream,
    enter_device,
    is_capturing,
    leave_device,
    pointer_device,
)
from ..array import DeviceArray, _new, empty
from ..grad.record import record
from ..validation import as_out, check_contiguous, check_out, fail
from .launch import CompiledKernel, KernelDef

__all__ = ["ANY_LAYOUT", "C_CONTIGUOUS", "LAST_AXIS", "Plan", "PlanCache", "arrival_workspace",
           "call_device", "device_guard", "fast_path", "output", "outputs", "record", "run",
           "workspace"]

# Layouts an output may be required to have: what the op's kernel can write.
C_CONTIGUOUS = "C-contiguous"
LAST_AXIS = "contiguous last axis"  # rows at any stride: the row-wise kernels
ANY_LAYOUT = "any layout"  # kernels that follow every stride (copies)


def output(op: str, out, shape: tuple, dtype, *, device: int, layout: str = LAST_AXIS,
           name: str = "out") -> DeviceArray:
    """The op's output: a new C-contiguous array when ``out`` is None, else ``out`` checked
    — device memory (a NumPy array is refused: the results would land in a copy), exactly
    ``shape`` and ``dtype``, on ``device`` (the inputs'), in ``layout``."""
    if out is None:
        return empty(shape, dtype)
    out = check_out(op, out, shape, dtype, name)
    if out.device_id != device:
        fail(ValueError, op, name, f"device {device} (where the inputs are)",
             f"device {out.device_id}")
    if layout != ANY_LAYOUT:
        check_contiguous(op, name, out, last_axis_only=layout == LAST_AXIS)
    return out


def outputs(op: str, out, specs, *, device: int, name: str = "out") -> tuple:
    """Several outputs, ``specs`` one ``(shape, dtype, layout)`` each: new arrays when
    ``out`` is None, else the ``out`` tuple checked element by element as :func:`output`
    checks one (named ``out[0]``, ``out[1]``, ... in errors; ``name`` replaces "out")."""
    if out is None:
        return tuple(empty(shape, dtype) for shape, dtype, _ in specs)
    if not isinstance(out, (tuple, list)) or len(out) != len(specs):
        got = (f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list))
               else type(out).__name__)
        fail(TypeError, op, name, f"a tuple of {len(specs)} arrays", got)
    # Each element device memory first: output() would allocate for a None, a result the
    # caller never sees.
    out = [as_out(op, o, f"{name}[{i}]") for i, o in enumerate(out)]
    return tuple(output(op, o, shape, dtype, device=device, layout=layout, name=f"{name}[{i}]")
                 for i, (o, (shape, dtype, layout)) in enumerate(zip(out, specs)))


def run(launch, *args, out):
    """The empty rule of every op: ``launch(*args, *outputs)`` plans and launches the op's
    kernels, and is not called at all when an output has no elements (nothing to write,
    and a grid of zero blocks is a launch error). ``out``: the output, or a tuple of them.
    Returns ``out``."""
    if type(out) is tuple:
        if all(o.size for o in out):
            launch(*args, *out)
    elif out.size:
        launch(*args, out)
    return out


class Plan(NamedTuple):
    """One launch: the compiled kernel, its grid and block, and its dynamic shared memory.
    ``launch(*args)`` runs it with the arguments in the kernel's order."""

    kernel: CompiledKernel
    grid: tuple
    block: tuple
    shared_mem: int = 0
    cluster: tuple | None = None  # thread-block cluster dimensions (sm_90)

    @classmethod
    def of(cls, kdef: KernelDef, grid: tuple, block: tuple, shared_mem: int = 0,
           cluster: tuple | None = None) -> "Plan":
        """The plan for ``kdef``, loaded on the current device. Ops declare one
        specialization per kernel and pick kernels by key (dtype, variant)."""
        if len(kdef.signatures) != 1:
            raise TypeError(f"Plan.of: kernel {kdef.name} has {len(kdef.signatures)} "
                            f"specializations; an op's kernels have one each")
        return cls(kdef[kdef.signatures[0]], grid, block, shared_mem, cluster)

    def launch(self, *args) -> None:
        if self.cluster is None:
            self.kernel(self.grid, self.block, args, shared_mem=self.shared_mem)
        else:
            self.kernel(self.grid, self.block, args, shared_mem=self.shared_mem,
                        cluster=self.cluster)


class PlanCache:
    """Plans kept per operand signature: ``key`` is a hashable tuple of everything the plan
    depends on (addresses, shapes, strides, dtypes, device), so a repeated call skips the
    layout analysis and the kernel choice. Past ``size`` plans the oldest goes. A plan
    must not hold the operands: a cached one would keep their memory alive."""

    def __init__(self, size: int = 256):
        self.size = size
        self._plans: dict = {}

    def get(self, key):
        return self._plans.get(key)

    def put(self, key, plan):
        """Keep ``plan`` for ``key``; returns it."""
        if key not in self._plans and len(self._plans) >= self.size:
            del self._plans[next(iter(self._plans))]  # dicts keep insertion order
        self._plans[key] = plan
        return plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


# -- the fast path: record a call once, replay it --------------------------------------------
#
# A call's *signature* is everything the host path's decisions depend on: each array's
# shape, strides, dtype, device and pointer alignment (vector paths need 16 bytes), and
# every other argument's value. Two calls with one signature run the same kernels with
# the same grids and scalar arguments; only the pointers differ — and each pointer a kernel
# gets lies at a fixed offset inside one of the call's arrays or of the memory the call
# allocated. The recorder finds those offsets; a replay adds them to the new pointers.
# Launches in thread-block clusters replay too; a kernel taking addresses as scalars (a
# tensor map, a workspace: KernelDef's address_scalars) does not — its calls run the whole
# path each time.

MAX_REPLAYS_PER_THREAD = 1024
_SCALARS = frozenset((int, float, bool, str, type(None), type))
_NOT_RECORDED = object()  # a signature whose calls do something a replay cannot redo


def fast_path(fwd):
    """Wrap an op's ``<op>_fwd`` (see the module doc). Calls whose arguments are not all
    DeviceArrays, plain values and objects with a ``fast_path_parts()`` method (a tuple
    of those: kernels.matmul_int4.Int4Weight) run ``fwd`` itself (e.g. a CuPy array: it
    is imported on each call). Every call runs on its arrays' device (:func:`call_device`;
    arrays on two devices are refused), which is current for the length of the call."""

    @functools.wraps(fwd)
    def call(*args, **kwargs):
        if STATE.recorder is not None:  # inside another op's recorded first call
            return fwd(*args, **kwargs)
        arrays = []
        key = _signature(fwd, args, kwargs, arrays)
        if key is None:
            return _on_call_device(fwd, args, kwargs)
        n = len(arrays)
        if n > 2 or n == 2 and arrays[0]._owner is arrays[1]._owner:  # (a set costs 0.2 µs)
            owners = len({id(a._owner) for a in arrays})
            if owners < n:
                if len(set(map(id, arrays))) > owners and _overlapping(arrays):
                    # Distinct views of one allocation that overlap (``add(y[:n], 1,
                    # out=y[1:])``): the layouts alone cannot say so, and a replay
                    # recorded on separate arrays would skip the copy the host path makes.
                    return _on_call_device(fwd, args, kwargs)
                # One array passed twice (``a += b``: input and out): the signature says
                # which arguments are the same object, so a replay finds the same aliasing.
                first = {}
                key = (*key, tuple(first.setdefault(id(a), i) for i, a in enumerate(arrays)))
        replays = STATE.calls
        if replays is None:
            replays = STATE.calls = {}
        replay = replays.get(key)
        if replay is None:
            token = enter_device(call_device(fwd, args, kwargs))
            try:
                return _record(fwd, args, kwargs, arrays, replays, key)
            finally:
                leave_device(token)
        if replay is _NOT_RECORDED:
            return _on_call_device(fwd, args, kwargs)
        token = enter_device(replay.device)
        if token is None:  # the hot path: the call's device is current already
            return replay(arrays)
        try:
            return replay(arrays)
        finally:
            leave_device(token)

    call.uncached = fwd
    return call


def device_guard(fwd):
    """Wrap an op's ``<op>_fwd`` that is not a :func:`fast_path` (one whose every call
    differs: a step counter, a random draw) so that it too runs on its arrays' device."""

    @functools.wraps(fwd)
    def call(*args, **kwargs):
        return _on_call_device(fwd, args, kwargs)

    return call


def _on_call_device(fwd, args, kwargs):
    """``fwd(*args, **kwargs)`` with the call's device current."""
    token = enter_device(call_device(fwd, args, kwargs))
    try:
        return fwd(*args, **kwargs)
    finally:
        leave_device(token)


def call_device(fwd, args, kwargs) -> int:
    """The device a call runs on: that of its GPU arrays (DeviceArrays, and other
    libraries' arrays by ``__dlpack_device__``; nested in tuples and ``fast_path_parts``),
    else the current one. Arrays on two devices: a ValueError naming the op and both
    arguments, before anything runs (by ``fwd``'s parameter names, or where a fwd serves
    several public functions, its ``public_names[op]``: {parameter: public name})."""
    found = []
    _devices((*args, *kwargs.values()), found)
    if not found:
        return current_ordinal()
    first = found[0]
    if len(found) > 1 and any(d != first for d in found):
        _refuse_mixed_devices(fwd, args, kwargs)
    return first


def _devices(values, found) -> None:
    for value in values:
        kind = type(value)
        if kind is DeviceArray:
            found.append(value.device_id)
        elif kind is tuple or kind is list:
            _devices(value, found)
        elif hasattr(kind, "fast_path_parts"):
            _devices(value.fast_path_parts(), found)
        elif hasattr(value, "__dlpack_device__") and not isinstance(value, np.ndarray):
            try:
                dl_kind, ordinal = value.__dlpack_device__()
            except Exception:  # the op's own validation names what is wrong with it
                continue
            if int(dl_kind) in (2, 13):  # kDLCUDA, kDLCUDAManaged
                found.append(int(ordinal))
        elif hasattr(value, "__cuda_array_interface__") and _device._MULTI_GPU:
            ordinal = pointer_device(value)  # (numba arrays: no __dlpack_device__)
            if ordinal is not None:
                found.append(ordinal)


def _refuse_mixed_devices(fwd, args, kwargs):
    params = inspect.signature(fwd).bind_partial(*args, **kwargs).arguments
    names = list(params)
    op = fwd.__name__.lstrip("_").removesuffix("_fwd")
    if names and names[0] in ("op", "name") and isinstance(params[names[0]], str):
        op = params[names.pop(0)]
    # an op whose fwd serves several public functions names their arguments
    public = getattr(fwd, "public_names", {}).get(op, {})
    seen = []
    for name in names:
        value = params[name]
        parts = value if type(value) in (tuple, list) else (value,)
        name = public.get(name, name)
        for i, part in enumerate(parts):
            found = []
            _devices((part,), found)
            label = f"{name}[{i}]" if parts is value else name
            for ordinal in found:
                if seen and ordinal != seen[0][1]:
                    output = label.startswith("out") or label.endswith("_out")
                    where = ("where the inputs are" if output
                             else f"where '{seen[0][0]}' is")
                    fail(ValueError, op, label, f"device {seen[0][1]} ({where})",
                         f"device {ordinal}")
                seen.append((label, ordinal))
    raise ValueError(f"{op}: arrays on several devices")  # a part nested deeper


def _signature(fwd, args, kwargs, arrays):
    """The call's signature as a hashable tuple, its DeviceArrays appended to ``arrays``
    in order; None when an argument has no signature (not an array or a plain value).
    Keyword names go in as one tuple, their values after the positional ones. The
    current device is part of it: a call with no arrays runs there."""
    key = [fwd, STATE.ordinal if STATE.chosen else current_ordinal()]
    if kwargs:
        key.append(tuple(kwargs))
        args = (*args, *kwargs.values())
    return tuple(key) if _add(args, key, arrays) else None


def _layout(a) -> tuple:
    """What the host path reads of an array: never changes for one DeviceArray."""
    return (a.shape, a.strides, a.dtype, a.ptr & 15, a.device_id)


def _add(values, key, arrays) -> bool:
    """Append each value's part of the signature to ``key``; False for a value that has
    none. (Runs on every call: arrays and strings first.)"""
    for value in values:
        kind = type(value)
        if kind is DeviceArray:
            layout = value._layout
            if layout is None:
                layout = value._layout = _layout(value)
            key.append(layout)
            arrays.append(value)
        elif kind is str or value is None:
            key.append(value)
        elif kind in _SCALARS or isinstance(value, (np.dtype, np.generic)):
            key.append((kind, value))  # 1, 1.0 and True are equal: keep their types apart
        elif kind is tuple:
            key.append(len(value))
            if not _add(value, key, arrays):
                return False
        elif hasattr(kind, "fast_path_parts"):  # an object made of arrays (Int4Weight)
            key.append(kind)
            if not _add(value.fast_path_parts(), key, arrays):
                return False
        else:
            return False
    return True


def _record(fwd, args, kwargs, arrays, replays, key):
    recording = _Recording(arrays)
    STATE.recorder = recording
    try:
        result = fwd(*args, **kwargs)
    finally:
        STATE.recorder = None
    replay = recording.replay(result)
    if replay is not None or recording.reason is not None:
        if len(replays) >= MAX_REPLAYS_PER_THREAD:
            del replays[next(iter(replays))]  # the oldest
        replays[key] = _NOT_RECORDED if replay is None else replay
    return result


class _Workspace(NamedTuple):
    partials: DeviceArray  # f32 (a kernel may view the bytes as another type)
    counters: DeviceArray  # uint32, zero between launches
    buffer: DeviceArray  # owns both


# Arrival workspaces, one per (device, stream handle): kernels on one stream run one after
# another, and each leaves its counters at 0, so the next reuses the memory without a memset.
# At most MAX_WORKSPACES streams keep one (the oldest made goes first: a program that makes a
# stream per step would otherwise keep a buffer per stream it ever used); a dropped one is
# freed in its stream's order, after the launches queued on it.
MAX_WORKSPACES = 16
_WORKSPACES: dict[tuple, _Workspace] = {}
_WORKSPACES_LOCK = threading.Lock()  # streams are per thread, the cache is the process's


def arrival_workspace(nbytes_partials: int, n_counters: int):
    """(f32 partials of at least ``nbytes_partials`` bytes, ``n_counters`` or more uint32
    arrival counters, all zero) for a launch on the current stream whose last block to
    arrive folds the others' partials (split-K matmul, split reductions). Grows as
    needed; a new buffer's counters are zeroed on the stream (the old buffer is freed in
    stream order, after the launches queued on it)."""
    stream = current_stream()
    device = current_allocator()[1]
    capturing = is_capturing(stream.handle)
    ws = None if capturing else _WORKSPACES.get((device, stream.handle))
    if ws is None or ws.partials.nbytes < nbytes_partials or ws.counters.size < n_counters:
        if ws is not None:
            nbytes_partials = max(nbytes_partials, ws.partials.nbytes)
            n_counters = max(n_counters, ws.counters.size)
        n_counters = -(-n_counters // 64) * 64  # 256-byte aligned partials
        nbytes_partials = -(-nbytes_partials // 256) * 256
        buffer = empty((4 * n_counters + nbytes_partials,), np.uint8)
        _zero_u32(buffer.ptr, n_counters, stream.handle)
        ws = _Workspace(buffer._view((nbytes_partials // 4,), (4,), 4 * n_counters,
                                     np.dtype(np.float32)),
                        buffer._view((n_counters,), (4,), 0, np.dtype(np.uint32)), buffer)
        # Under capture the workspace is the graph's own (allocated and zeroed in it, freed
        # when the call's views die): a cached one would be shared with eager calls.
        if not capturing:
            with _WORKSPACES_LOCK:
                _WORKSPACES.pop((device, stream.handle), None)
                if len(_WORKSPACES) >= MAX_WORKSPACES:
                    del _WORKSPACES[next(iter(_WORKSPACES))]
                _WORKSPACES[(device, stream.handle)] = ws
    return ws.partials, ws.counters


def _zero_u32(ptr: int, count: int, stream_handle: int) -> None:
    from cuda.bindings import driver

    (err,) = driver.cuMemsetD32Async(ptr, 0, count, stream_handle)
    check_driver(err, "arrival workspace: cuMemsetD32Async")


def workspace(provide, *args):
    """``provide(*args)``: a tuple of arrays a launch needs besides the op's inputs and
    outputs (a cached scratch buffer, say), obtained again by a replay. What ``provide``
    allocates is its own business, not the recorded call's."""
    recording = STATE.recorder
    if recording is None:
        return provide(*args)
    STATE.recorder = None
    try:
        arrays = provide(*args)
    finally:
        STATE.recorder = recording
    recording.provided(provide, args, arrays)
    return arrays


class _Recording:
    """What one call did (the hooks in kaionb.array and CompiledKernel report here), with
    every array named by its index in ``bases``: the call's arrays, then each array the
    call allocated or was provided, in order."""

    def __init__(self, arrays):
        self.bases = list(arrays)
        self.steps = []
        self.reason = None  # why the call cannot be replayed, when it cannot

    def unrecordable(self, what: str) -> None:
        self.reason = self.reason or what

    def allocated(self, array) -> None:
        self.steps.append(_Allocate(array.shape, array.dtype, array.strides, array.nbytes))
        self.bases.append(array)

    def zeroed(self, array) -> None:
        self.steps.append(_Zero(self._index(array), array.nbytes))

    def provided(self, provide, args, arrays) -> None:
        self.steps.append(_Provide(provide, args))
        self.bases.extend(arrays)

    def launched(self, compiled, grid, block, args, flat, shared_mem, plain,
                 cluster=None) -> None:
        if not plain:
            return self.unrecordable("a launch on an explicit stream")
        if compiled.kdef.address_scalars:
            return self.unrecordable(f"{compiled.kdef.name} takes raw addresses (tensor maps, "
                                     "workspaces) a replay cannot move")
        slots, at = [], 0
        for is_array, arg in zip(compiled._array_flags, args):
            if is_array:
                if arg.size:  # an empty array is never read: its pointer is a constant
                    where = self._locate(arg)
                    if where is None:
                        return self.unrecordable(f"{compiled.kdef.name} reads memory the "
                                                 "call neither got nor allocated")
                    slots.append((at + 4, *where))
                at += len(arg._numba_abi)
            else:
                at += 1
        self.steps.append(_Launch(compiled, grid, block, shared_mem, flat, tuple(slots),
                                  cluster))

    def _index(self, array) -> int:
        for i, base in enumerate(self.bases):
            if base is array:
                return i
        self.unrecordable("memory the call neither got nor allocated")
        return -1

    def _locate(self, view):
        """(index of the base whose memory holds ``view``, byte offset) or None."""
        lo, hi = _span(view)
        for i, base in enumerate(self.bases):
            b_lo, b_hi = _span(base)
            if base.size and b_lo <= lo and hi <= b_hi:
                return i, view.ptr - base.ptr
        return None

    def replay(self, result):
        """The replay of this call returning ``result``'s arrays, or None."""
        if self.reason is not None or _overlapping(self.bases):
            return None
        if type(result) is tuple:
            indices = tuple(self._result(r) for r in result)
        else:
            indices = self._result(result)
        if self.reason is not None:
            return None
        return _Replay(tuple(self.steps), indices, STATE.ordinal)

    def _result(self, array):
        """How a replay finds a result: its base's index, or for a view into one (several
        results carved from one allocation) (index, byte offset, shape, strides, dtype)."""
        for i, base in enumerate(self.bases):
            if base is array:
                return i
        where = self._locate(array)
        if where is None:
            self.unrecordable("a result the call neither got nor allocated")
            return -1
        return _View(*where, array.shape, array.strides, array.dtype)


class _View(NamedTuple):
    """A result that is a view into a base (a tuple subclass: a replay tells one result
    that is a view from a tuple of results by ``type(result) is tuple``)."""
    index: int
    offset: int
    shape: tuple
    strides: tuple
    dtype: object


def _span(array) -> tuple:
    """[first byte, one past the last byte] an array touches (strides may be negative)."""
    lo = hi = array.ptr
    for d, st in zip(array.shape, array.strides):
        if d > 1:
            if st < 0:
                lo += (d - 1) * st
            else:
                hi += (d - 1) * st
    return lo, hi + array.itemsize


def _overlapping(arrays) -> bool:
    """Whether two distinct non-empty arrays share memory: a pointer inside both could
    not be told apart (a replay with separate arrays would read the wrong one). The same
    array object twice is one array (the signature records that aliasing)."""
    unique = {id(a): a for a in arrays}.values()
    spans = sorted(_span(a) for a in unique if a.size)
    return any(nxt[0] < prev[1] for prev, nxt in zip(spans, spans[1:]))


class _Replay:
    __slots__ = ("steps", "result", "device")

    def __init__(self, steps, result, device):
        self.steps = steps
        self.result = result
        self.device = device  # the device the recorded call ran on

    def __call__(self, bases):
        for step in self.steps:
            step(bases)
        if STATE.capture is not None:
            STATE.capture.keep(bases)
        result = self.result
        if type(result) is tuple:
            return tuple(_result(bases, r) for r in result)
        return _result(bases, result)


def _result(bases, where):
    """A replay's result: ``bases[where]``, or the view ``where`` describes
    (:meth:`_Recording._result`)."""
    if type(where) is int:
        return bases[where]
    i, offset, shape, strides, dtype = where
    return bases[i]._view(shape, strides, offset, dtype)


class _Allocate(NamedTuple):
    shape: tuple
    dtype: object
    strides: tuple
    nbytes: int

    def __call__(self, bases):
        if self.nbytes:
            bases.append(_new(self.shape, self.dtype, self.strides, self.nbytes))
        else:
            bases.append(empty(self.shape, self.dtype))


class _Zero(NamedTuple):
    index: int
    nbytes: int

    def __call__(self, bases):
        from cuda.bindings import driver

        (err,) = driver.cuMemsetD8Async(bases[self.index].ptr, 0, self.nbytes,
                                        current_stream().handle)
        check_driver(err, "cuMemsetD8Async")


class _Provide(NamedTuple):
    provide: object
    args: tuple

    def __call__(self, bases):
        bases.extend(self.provide(*self.args))


class _Launch:
    """One recorded launch: its own parameter block, packed once; a replay writes the
    pointer slots (slot, base index, byte offset) and launches — with ``cluster``
    dimensions through ``cuLaunchKernelEx`` and the compiled kernel's per-thread launch
    configuration."""

    __slots__ = ("function", "dims", "params", "slots", "address", "pointers", "name",
                 "launch", "cluster", "compiled")

    def __init__(self, compiled, grid, block, shared_mem, flat, slots, cluster=None):
        from cuda.bindings import driver

        count = max(1, len(flat))
        self.params = (ctypes.c_uint64 * count)()
        compiled._packer.pack_into(self.params, 0, *flat)
        base = ctypes.addressof(self.params)
        self.pointers = (ctypes.c_void_p * count)(*[base + 8 * i for i in range(count)])
        self.address = ctypes.addressof(self.pointers)
        self.function = compiled._function
        self.dims = (*grid, *block, shared_mem)
        self.slots = slots
        self.name = compiled.kdef.name
        self.cluster = cluster
        self.compiled = compiled
        self.launch = driver.cuLaunchKernel if cluster is None else driver.cuLaunchKernelEx

    def __call__(self, bases):
        params = self.params
        for slot, index, offset in self.slots:
            params[slot] = bases[index].ptr + offset
        gx, gy, gz, bx, by, bz, shared = self.dims
        if self.cluster is None:
            (err,) = self.launch(self.function, gx, gy, gz, bx, by, bz, shared,
                                 current_stream().cu, self.address, 0)
        else:
            config = self.compiled._cluster_config(self.cluster, (gx, gy, gz), (bx, by, bz),
                                                   shared)
            config.hStream = current_stream().cu
            (err,) = self.launch(config, self.function, self.address, 0)
        if err:
            check_driver(err, f"launching {self.name}")
