"""Fit's report: the loss curves, and accuracy or CER, per epoch as a PNG (matplotlib, when installed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ortlstm.fit.state import EpochRecord


def plot_history(
    history: Sequence[EpochRecord], path: Path, loss_name: str, log: Callable[[str], None] = print
) -> Path | None:
    """Draws the loss curves (and accuracy or CER) per epoch to a PNG; None without matplotlib."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        log(f"no plot: matplotlib is not installed (pip install matplotlib), {path} not written")
        return None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    epochs = [record.epoch for record in history]
    metric_name, metric = next(
        (
            (name, values)
            for name, values in (
                ("val accuracy", [r.val_accuracy for r in history]),
                ("val CER", [r.val_cer for r in history]),
            )
            if any(value is not None for value in values)
        ),
        (None, None),
    )
    figure, axes = pyplot.subplots(1, 2 if metric is not None else 1, figsize=(11 if metric else 6, 4), squeeze=False)
    axes[0][0].plot(epochs, [r.train_loss for r in history], marker="o", label="train")
    if any(r.val_loss is not None for r in history):
        axes[0][0].plot(epochs, [r.val_loss for r in history], marker="o", label="val")
    axes[0][0].set_xlabel("epoch")
    axes[0][0].set_ylabel(f"loss ({loss_name})")
    axes[0][0].legend()
    if metric is not None:
        axes[0][1].plot(epochs, metric, marker="o")
        axes[0][1].set_xlabel("epoch")
        axes[0][1].set_ylabel(metric_name)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
