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
"""

from __future__ import annotations

from typing import NamedTuple

from ..array import DeviceArray, empty
from ..grad.record import record
from ..validation import check_contiguous, check_out, fail
from .launch import CompiledKernel, KernelDef

__all__ = ["ANY_LAYOUT", "C_CONTIGUOUS", "LAST_AXIS", "Plan", "PlanCache", "output",
           "outputs", "record", "run"]

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


def outputs(op: str, out, specs, *, device: int) -> tuple:
    """Several outputs, ``specs`` one ``(shape, dtype, layout)`` each: new arrays when
    ``out`` is None, else the ``out`` tuple checked element by element as :func:`output`
    checks one (named ``out[0]``, ``out[1]``, ... in errors)."""
    if out is None:
        return tuple(empty(shape, dtype) for shape, dtype, _ in specs)
    if not isinstance(out, (tuple, list)) or len(out) != len(specs):
        got = (f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list))
               else type(out).__name__)
        fail(TypeError, op, "out", f"a tuple of {len(specs)} arrays", got)
    return tuple(output(op, o, shape, dtype, device=device, layout=layout, name=f"out[{i}]")
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

    @classmethod
    def of(cls, kdef: KernelDef, grid: tuple, block: tuple, shared_mem: int = 0) -> "Plan":
        """The plan for ``kdef``, loaded on the current device. Ops declare one
        specialization per kernel and pick kernels by key (dtype, variant)."""
        if len(kdef.signatures) != 1:
            raise TypeError(f"Plan.of: kernel {kdef.name} has {len(kdef.signatures)} "
                            f"specializations; an op's kernels have one each")
        return cls(kdef[kdef.signatures[0]], grid, block, shared_mem)

    def launch(self, *args) -> None:
        self.kernel(self.grid, self.block, args, shared_mem=self.shared_mem)


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
