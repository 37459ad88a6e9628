"""Gradient accumulation: the gradients summed since the last update, and what a refused apply() needs.

As calling ``loss.backward()`` once per micro-batch in torch, the gradients of each micro-batch are
summed in call order; the non-finite micro-batch losses and the carried LSTM state before the first
micro-batch are kept so that ``apply()`` can refuse the whole update and restore that state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ortlstm.training.guard import all_finite, loss_value


class Accumulator:
    """The accumulated gradients of a trainer.

    Attributes:
        gradients: The summed gradients by parameter (empty: none).
        batches: The micro-batches summed.
        nonfinite_losses: (number, loss) of each micro-batch whose loss is not finite.
        carried_before: The carried LSTM state before the first micro-batch (None: zeros).
    """

    def __init__(self) -> None:
        self.carried_before: dict[str, np.ndarray] | None = None
        self.clear()

    def clear(self) -> None:
        """Discards the accumulated gradients (the carried state before them is kept until the next add)."""
        self.gradients: dict[str, np.ndarray] = {}
        self.batches = 0
        self.nonfinite_losses: list[tuple[int, float | np.ndarray]] = []

    def add(
        self, gradients: Mapping[str, np.ndarray], loss: np.ndarray, carried: Mapping[str, np.ndarray] | None
    ) -> None:
        """Adds a micro-batch's gradients; ``carried`` is the state it started from."""
        if not self.batches:
            self.carried_before = None if carried is None else dict(carried)
        for name, grad in gradients.items():
            if name in self.gradients:
                self.gradients[name] += grad
            else:
                self.gradients[name] = grad.copy()
        self.batches += 1
        if not all_finite(loss):
            self.nonfinite_losses.append((self.batches, loss_value(loss)))

    def replace(
        self, gradients: Mapping[str, np.ndarray], params: Sequence[str], expected: Mapping[str, np.ndarray]
    ) -> None:
        """Takes given gradients (e.g. all-reduced) instead of the accumulated ones.

        Raises:
            ValueError: One of ``params`` lacks a gradient, or its gradient has another shape or
                type than the parameter (``expected``).
        """
        for name in params:
            value, want = gradients.get(name), expected[name]
            if value is None or value.shape != want.shape or value.dtype != want.dtype:
                got = "nothing" if value is None else f"{value.dtype} {list(value.shape)}"
                raise ValueError(
                    f"apply(gradients=...): the gradient of {name!r} must be {want.dtype} "
                    f"{list(want.shape)} (as the parameter), got {got}"
                )
        self.gradients = dict(gradients)
