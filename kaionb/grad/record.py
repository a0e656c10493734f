"""The one place ops touch the tape: which tape is active, and ``record``.

A leaf module (no kaionb imports): the kernels import it, and :mod:`.tape` — which runs
kernels — imports them, so the tape's state cannot live there.
"""

from __future__ import annotations

import threading

_LOCAL = threading.local()


def active_tape():
    """The innermost ``kaionb.grad.Tape`` entered on this thread, or None."""
    return getattr(_LOCAL, "tape", None)


def set_active_tape(tape) -> None:
    _LOCAL.tape = tape


def record(backward_fn, inputs, outputs) -> None:
    """Called by ops: record ``(backward_fn, inputs, outputs)`` onto the active tape if
    any input needs a gradient; the outputs then need one too."""
    tape = active_tape()
    if tape is not None and any(getattr(x, "requires_grad", False) for x in inputs):
        tape.entries.append((backward_fn, tuple(inputs), tuple(outputs)))
        for out in outputs:
            out.requires_grad = True
