"""A small tape-based autograd for the ops that need a backward pass (matmul,
FlashAttention). DeviceArray carries ``requires_grad`` and ``grad`` and never imports this
package; ops record onto the active tape (:mod:`.record`) only when one is active.

Imports run one way: kernels → :mod:`.record` (a leaf), and :mod:`.tape` → array and
kernels. This package therefore loads ``.tape`` on first use of ``Tape`` or ``gradcheck``:
loading it here would make every kernel module that imports ``.record`` wait for the
kernels ``.tape`` imports — an import cycle.
"""

from .record import active_tape, record

__all__ = ["Tape", "active_tape", "gradcheck", "record"]

_FROM_TAPE = ("Tape", "gradcheck")


def __getattr__(name):
    if name in _FROM_TAPE:
        from . import tape

        return getattr(tape, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_FROM_TAPE))
