"""A small tape-based autograd for the ops that need a backward pass (matmul,
FlashAttention). DeviceArray carries ``requires_grad`` and ``grad`` and never imports this
package; ops record onto the active tape only when one is active."""

from .tape import Tape, active_tape, gradcheck, record

__all__ = ["Tape", "active_tape", "gradcheck", "record"]
