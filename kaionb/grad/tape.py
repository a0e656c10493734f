"""Tape: record ops while active, replay their backward rules in reverse.

    with kaionb.grad.Tape() as tape:
        y = kaionb.matmul(a, b)          # a.requires_grad = True
    tape.backward(y)                      # a.grad = dL/da for L = sum(y)

An op records ``(backward_fn, inputs, outputs)``: ``backward_fn(*grad_outputs)`` returns one
gradient (or None) per input. Gradients are float32 DeviceArrays, summed when an array is
used more than once. ``gradcheck`` compares a rule with central finite differences.
"""

from __future__ import annotations

import numpy as np

from ..array import asarray, full
from ..kernels.elementwise import add
from ..validation import fail
from .record import active_tape, set_active_tape


class Tape:
    """Record ops while active, then replay their backward rules in reverse.

    ``with kaionb.grad.Tape() as tape:`` makes the tape active on this thread (tapes
    nest; the previous one comes back at the end of the block). An op whose input has
    ``requires_grad`` set records ``(backward_fn, inputs, outputs)`` on it
    (:func:`kaionb.grad.record`) and marks its outputs as requiring a gradient too.
    :meth:`backward` then fills ``.grad`` of every input that requires one. Gradients
    are float32 DeviceArrays, summed when an array is used more than once.

    Attributes
    ----------
    entries : list of tuple
        The recorded ``(backward_fn, inputs, outputs)``, in call order.

    Examples
    --------
    >>> a = kaionb.asarray(np.ones((2, 3), np.float16))
    >>> b = kaionb.asarray(np.ones((3, 4), np.float16))
    >>> a.requires_grad = True
    >>> with kaionb.grad.Tape() as tape:
    ...     y = kaionb.matmul(a, b)
    >>> tape.backward(y)            # L = sum(y): dL/da = ones @ b.T
    >>> a.grad.get()
    array([[4., 4., 4.],
           [4., 4., 4.]], dtype=float32)
    """

    def __init__(self):
        self.entries: list[tuple] = []

    def __enter__(self) -> "Tape":
        self._previous = active_tape()
        set_active_tape(self)
        return self

    def __exit__(self, *exc) -> None:
        set_active_tape(self._previous)

    def backward(self, output, grad_output=None) -> None:
        """Propagate ``grad_output`` back to every ``requires_grad`` input's ``.grad``.

        The recorded backward rules run in reverse order; an input's ``.grad`` is set to
        its gradient (float32), summed over its uses.

        Parameters
        ----------
        output : DeviceArray
            An output of an op recorded on this tape.
        grad_output : DeviceArray or array_like, optional
            The gradient of the loss with respect to ``output`` (its shape); default ones,
            i.e. L = sum(output).

        Raises
        ------
        ValueError
            An ``output`` no op recorded on this tape produced (nothing would be computed),
            or a ``grad_output`` of another shape.
        TypeError
            A ``grad_output`` that is not an array.

        Examples
        --------
        >>> x = kaionb.asarray([1.0, 2.0], dtype=np.float32)
        >>> x.requires_grad = True
        >>> with kaionb.grad.Tape() as tape:
        ...     y = x * x
        >>> tape.backward(y, kaionb.asarray([1.0, 0.5], dtype=np.float32))
        >>> x.grad.get()
        array([2., 2.], dtype=float32)
        """
        if not any(o is output for _, _, outs in self.entries for o in outs):
            fail(ValueError, "Tape.backward", "output", "an array an op recorded on this "
                 f"tape produced ({len(self.entries)} entries)",
                 f"an array of shape {getattr(output, 'shape', None)} that none produced")
        if grad_output is not None:
            if not hasattr(grad_output, "shape"):
                fail(TypeError, "Tape.backward", "grad_output", "an array (or None: ones)",
                     type(grad_output).__name__)
            if tuple(grad_output.shape) != tuple(output.shape):
                fail(ValueError, "Tape.backward", "grad_output",
                     f"shape {tuple(output.shape)}", tuple(grad_output.shape))
        grads = {id(output): grad_output if grad_output is not None
                 else full(output.shape, 1.0, np.float32, device=output.device_id)}
        for backward_fn, inputs, outputs in reversed(self.entries):
            if not any(id(o) in grads for o in outputs):
                continue
            grad_outputs = [grads[id(o)] if id(o) in grads
                            else full(o.shape, 0.0, np.float32, device=o.device_id)
                            for o in outputs]
            for x, g in zip(inputs, backward_fn(*grad_outputs)):
                if g is None or not getattr(x, "requires_grad", False):
                    continue
                grads[id(x)] = _accumulate(grads.get(id(x)), g)
        for _, inputs, _ in self.entries:
            for x in inputs:
                if getattr(x, "requires_grad", False) and id(x) in grads:
                    x.grad = grads.pop(id(x))

    def reset(self) -> None:
        """Forget every recorded entry (the tape can record again).

        Examples
        --------
        >>> tape = kaionb.grad.Tape()
        >>> tape.reset()
        >>> tape.entries
        []
        """
        self.entries.clear()


def _accumulate(total, g):
    return g.astype(np.float32) if total is None else add(total, g)


def gradcheck(fn, inputs, *, eps=1e-2, rtol=2e-2, probes=6, rng=None, reference=None) -> float:
    """Check the tape's gradient of ``fn`` against central finite differences.

    The loss is ``L = sum(fn(*inputs) * w)`` with random weights ``w``; at ``probes``
    random elements of each input that requires a gradient, the tape's gradient is
    compared with the central difference of L (the shifted input rounded to its dtype).

    Parameters
    ----------
    fn : callable
        Takes the inputs, returns one DeviceArray.
    inputs : sequence of DeviceArray
        The arguments; those with ``requires_grad`` are checked.
    eps : float, optional
        The finite-difference step.
    rtol : float, optional
        The largest relative error allowed.
    probes : int, optional
        Elements checked per input.
    rng : numpy.random.Generator, optional
        For the weights and the probed elements.
    reference : callable, optional
        A float64 NumPy model of ``fn`` (host arrays in, an array out) whose differences
        are taken instead — for ops that compute in less precision than their inputs
        (attention runs float32 inputs on bf16 tensor cores: differences of its own
        output would measure the rounding, not the derivative).

    Returns
    -------
    float
        The worst relative error found.

    Raises
    ------
    AssertionError
        An error above ``rtol`` (naming the input and the element).

    Examples
    --------
    >>> x = kaionb.asarray(np.random.default_rng(0).standard_normal((4, 8)), np.float32)
    >>> x.requires_grad = True
    >>> w = kaionb.ones(8, dtype=np.float32)
    >>> err = kaionb.grad.gradcheck(lambda x: kaionb.rms_norm(x, w), [x])
    >>> bool(err < 2e-2)
    True
    """
    rng = np.random.default_rng() if rng is None else rng
    with Tape() as tape:
        out = fn(*inputs)
    weights = rng.standard_normal(out.shape).astype(np.float32)
    tape.backward(out, asarray(weights, device=out.device_id))

    def loss(args):
        if reference is not None:
            host = [a.get() if hasattr(a, "get") else a for a in args]
            return float(np.sum(np.asarray(reference(*host), np.float64) * weights))
        return float(np.sum(fn(*args).get().astype(np.float64) * weights))

    worst = 0.0
    for index, x in enumerate(inputs):
        if not x.requires_grad:
            continue
        host = x.get()
        analytic = x.grad.get()
        for flat in rng.choice(host.size, size=min(probes, host.size), replace=False):
            pos = np.unravel_index(flat, host.shape)
            shifted, points = [], []
            for sign in (1, -1):
                h = host.copy()
                h[pos] = h[pos] + sign * eps  # rounded to the input's dtype
                points.append(float(h[pos]))
                args = list(inputs)
                args[index] = asarray(h, device=x.device_id)
                shifted.append(loss(args))
            numeric = (shifted[0] - shifted[1]) / (points[0] - points[1])
            err = abs(numeric - analytic[pos]) / max(abs(numeric), 1e-3)
            worst = max(worst, err)
            if err > rtol:
                raise AssertionError(f"gradcheck: input {index} at {pos}: tape {analytic[pos]:.6g}"
                                     f" vs finite difference {numeric:.6g}")
    return worst
