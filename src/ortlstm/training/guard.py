"""The non-finite guard: an update whose loss or gradients are not finite is never kept.

A refused update only leaves the engine's swap undone, so the parameters, the optimizer state,
``global_step`` and the carried state stay bitwise as they were; ``NonFiniteStepError`` says what
was not finite (``nonfinite="raise"``), or the trainer counts the skip (``nonfinite="skip"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ortlstm.graphs.parameters import label

NONFINITE_MODES = ("raise", "skip")
"""What a Trainer does with an update whose loss or gradients are not finite (``Trainer(nonfinite=...)``)."""


class NonFiniteStepError(FloatingPointError):
    """An update was refused because its loss or gradients were not finite; the trainer is unchanged.

    A ``FloatingPointError`` (what NumPy raises under ``np.errstate(all="raise")``): the arithmetic
    of the step produced NaN or inf, whether from a bad batch or from a diverging run, so it is not
    a bad argument (``ValueError``). Raised by ``Trainer.step`` and ``Trainer.apply`` in the default
    ``nonfinite="raise"`` mode, before anything is kept: the parameters, the optimizer state,
    ``global_step`` and a stateful trainer's carried LSTM state are those before the call.

    Attributes:
        step: The number the refused update would have had (``global_step + 1``). The
            attributes are None in a copy made by pickling (which keeps the message).
        loss: The loss of the step (``apply``: the first non-finite micro-batch loss, else None).
        grad_norm: The total gradient norm when known (the clipped norm, or the 2-norm of the
            diagnosed gradients), else None.
        nonfinite_grads: The parameters whose gradients hold NaN or inf, when known, else None.
        reason: What was not finite, as the message says it (``the loss is nan; ...``), else None;
            for a caller that words its own message around it (``ortlstm fit``).
    """

    def __init__(
        self,
        message: str,
        *,
        step: int | None = None,
        loss: float | np.ndarray | None = None,
        grad_norm: float | None = None,
        nonfinite_grads: tuple[str, ...] | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.loss = loss
        self.grad_norm = grad_norm
        self.nonfinite_grads = nonfinite_grads
        self.reason = reason


def check_mode(mode: str) -> str:
    """``mode`` if it is one of ``NONFINITE_MODES``.

    Raises:
        ValueError: It is not.
    """
    if mode not in NONFINITE_MODES:
        raise ValueError(
            f"nonfinite: expected one of {', '.join(map(repr, NONFINITE_MODES))}, got {mode!r} "
            "('raise' stops at a NaN or inf loss or gradient, 'skip' skips that update and counts it)"
        )
    return mode


def loss_value(value: np.ndarray) -> float | np.ndarray:
    """A loss as a step returns it: a float when it is one number."""
    return float(value.reshape(())) if value.size == 1 else value


def all_finite(value: np.ndarray) -> bool:
    """Whether every element is finite."""
    return bool(np.isfinite(value).all())


def _loss_text(loss: Any) -> str:
    """A loss for a message: the number, or how many of its elements are not finite."""
    array = np.asarray(loss)
    if array.size == 1:
        return str(float(array.reshape(())))
    return f"not finite in {int(np.size(array) - np.isfinite(array).sum())} of {array.size} elements"


def refusal(
    where: str,
    *,
    global_step: int,
    loss: tuple[str, Any] | None,
    grad_norm: float | None,
    gradients: Callable[[], Mapping[str, np.ndarray]],
    carried: bool,
    discarded: str = "",
    sources: Mapping[str, tuple[str, ...]] | None = None,
) -> NonFiniteStepError:
    """The error of a refused update, saying what was not finite.

    Args:
        where: The call, for the message.
        global_step: The updates done (the refused one would have been the next).
        loss: (what it is, its value) of the loss to report, or None.
        grad_norm: The clipped gradient norm when the models compute it, else None.
        gradients: The update's gradients, called only here: which are not finite (a train
            step's are recomputed with the gradients model, on this path only).
        carried: The trainer carries LSTM/GRU/RNN state (the message says it is unchanged too).
        discarded: What else the refusal dropped, for the message.
        sources: Initializer -> the torch parameters behind it (``parameters.torch_sources``): the
            message names a gradient by them, as the user's model does (``lstm.weight_ih_l0 (onnx: val_41)``).
    """
    nonfinite_grads: tuple[str, ...] | None = None
    try:
        values = dict(gradients())
    except Exception:  # the diagnosis must never hide the refusal itself
        values = {}
    if values:
        nonfinite_grads = tuple(name for name, value in values.items() if not all_finite(value))
        if grad_norm is None:
            with np.errstate(over="ignore", invalid="ignore"):
                squares = [float(np.sum(np.square(value, dtype=np.float64))) for value in values.values()]
            grad_norm = math.sqrt(math.fsum(squares)) if not any(map(math.isnan, squares)) else math.nan
    found = [] if loss is None else [f"{loss[0]} is {_loss_text(loss[1])}"]
    if grad_norm is not None:
        found.append(f"the gradient norm is {grad_norm}")
    if nonfinite_grads:
        named = [label(name, sources or {}) for name in nonfinite_grads]
        found.append(f"the gradients of {named} hold NaN or inf")
    elif loss is None or all_finite(np.asarray(loss[1])):
        found.append("the gradients' sum of squares is not finite")
    state = ", the carried LSTM/GRU/RNN state" if carried else ""
    return NonFiniteStepError(
        f"{where}: update {global_step + 1} refused, not finite: {'; '.join(found)}. The parameters, the optimizer "
        f"state{state} and global_step ({global_step}) are unchanged{discarded}. To skip such updates "
        "and count them in trainer.skipped_steps instead, pass Trainer(..., nonfinite='skip') or set "
        "trainer.nonfinite = 'skip'",
        step=global_step + 1,
        loss=None if loss is None else loss[1],
        grad_norm=grad_norm,
        nonfinite_grads=nonfinite_grads,
        reason="; ".join(found),
    )
