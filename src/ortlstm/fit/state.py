"""Where a fit stands and what it did: ``EpochRecord``, ``FitState``, ``StepInfo``, ``FitResult``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from ortlstm.training import Trainer


@dataclasses.dataclass
class EpochRecord:
    """One epoch's figures.

    Attributes:
        epoch: 1-based.
        train_loss: The mean of the step losses, weighted by batch size.
        lr: The learning rate of the epoch's last update.
        val_loss: The validation loss (None without validation data).
        val_accuracy: Classification losses: argmax accuracy on the validation data.
        val_cer: ctc_loss: the greedy decoding's character error rate on the validation data.
        skipped: Batches skipped as non-finite (``nonfinite="skip"``).
    """

    epoch: int
    train_loss: float
    lr: float
    val_loss: float | None = None
    val_accuracy: float | None = None
    val_cer: float | None = None
    skipped: int = 0

    def line(self, epochs: int) -> str:
        """``epoch 3/10: loss 0.1234, lr 0.001, val loss 0.2, val accuracy 95.0%``."""
        parts = [f"epoch {self.epoch}/{epochs}: loss {self.train_loss:.4g}", f"lr {self.lr:.3g}"]
        if self.val_loss is not None:
            parts.append(f"val loss {self.val_loss:.4g}")
        if self.val_accuracy is not None:
            parts.append(f"val accuracy {self.val_accuracy:.1%}")
        if self.val_cer is not None:
            parts.append(f"val CER {self.val_cer:.2%}")
        if self.skipped:
            parts.append(f"skipped {self.skipped} non-finite update{'s' if self.skipped > 1 else ''}")
        return ", ".join(parts)


@dataclasses.dataclass
class FitState:
    """Where a fit stands; saved in the checkpoint's metadata to resume bitwise.

    Attributes:
        epoch: Epochs completed.
        steps_in_epoch: Batches done in the current (incomplete) epoch (updates, and skipped ones).
        rng_state: The shuffle generator's state at the start of the current epoch
            (``numpy.random.PCG64`` state), from which its order is drawn again on resume.
        loss_sum: The current epoch's step losses times batch sizes, summed.
        samples: The samples of the current epoch trained on (in updates kept).
        skipped: The current epoch's batches skipped as non-finite.
        history: The completed epochs.
    """

    epoch: int
    steps_in_epoch: int
    rng_state: dict[str, Any]
    loss_sum: float = 0.0
    samples: int = 0
    skipped: int = 0
    history: list[EpochRecord] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a ``fit`` callback sees after each update.

    Attributes:
        epoch: 1-based number of the epoch the update belongs to.
        step_in_epoch: 1-based number of the update within the epoch.
        global_step: The trainer's updates done.
        loss: The update's loss (NaN or inf for a skipped one).
        outputs: The trainer's extra outputs of the step, by name (``extra_outputs``).
    """

    epoch: int
    step_in_epoch: int
    global_step: int
    loss: float
    outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class FitResult:
    """What ``fit`` did.

    Attributes:
        trainer: The trainer, trained.
        history: One record per epoch (those before a resume too).
        resumed_from: The epoch and step a resumed run started from, or None.
        out: The exported model's path, or None.
        plot: The plot's path, or None (not asked, or matplotlib missing).
    """

    trainer: Trainer
    history: list[EpochRecord]
    resumed_from: tuple[int, int] | None = None
    out: Path | None = None
    plot: Path | None = None
