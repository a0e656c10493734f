"""The one place ops touch the tape: which tape is active, and ``record``.

A leaf module (no kaionb imports): the kernels import it, and :mod:`.tape` — which runs
kernels — imports them, so the tape's state cannot live there.
"""

from __future__ import annotations

import threading


class _TapeState(threading.local):
    tape = None  # a class default: a thread that never entered a tape reads it without a miss


_LOCAL = _TapeState()


def active_tape():
    """Return the innermost ``kaionb.grad.Tape`` entered on this thread, or None.

    Returns
    -------
    Tape or None
        The active tape.

    Examples
    --------
    >>> kaionb.grad.active_tape() is None
    True
    >>> with kaionb.grad.Tape() as tape:
    ...     print(kaionb.grad.active_tape() is tape)
    True
    """
    return _LOCAL.tape


def set_active_tape(tape) -> None:
    _LOCAL.tape = tape


def record(backward_fn, inputs, outputs) -> None:
    """Record an op's backward rule onto the active tape (called by ops).

    Records ``(backward_fn, inputs, outputs)`` when a tape is active and any input needs
    a gradient; the outputs then need one too. Does nothing otherwise.

    Parameters
    ----------
    backward_fn : callable
        ``backward_fn(*grad_outputs)`` returns one gradient (or None) per input.
    inputs : sequence
        The op's inputs (those that are not arrays are ignored).
    outputs : sequence of DeviceArray
        The op's outputs.

    Raises
    ------
    AttributeError
        An output that cannot carry ``requires_grad`` (not an array), when recorded.

    Examples
    --------
    >>> x = kaionb.asarray([3.0], dtype=np.float32)
    >>> x.requires_grad = True
    >>> with kaionb.grad.Tape() as tape:
    ...     y = kaionb.empty(1, np.float32).fill(6.0)        # an op computed by hand
    ...     kaionb.grad.record(lambda g: (g * 2,), (x,), (y,))
    >>> tape.backward(y)
    >>> x.grad.get()
    array([2.], dtype=float32)
    """
    tape = active_tape()
    if tape is not None and any(getattr(x, "requires_grad", False) for x in inputs):
        tape.entries.append((backward_fn, tuple(inputs), tuple(outputs)))
        for out in outputs:
            out.requires_grad = True
