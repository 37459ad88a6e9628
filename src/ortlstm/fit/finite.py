"""NaN and inf in fit's data and in its validation loss: found before training, and said in words.

A NaN or inf in a sample makes the loss and the gradients of every batch that holds it NaN: the
Trainer refuses that update (``nonfinite="raise"``) or skips it (``"skip"``). Rather than stop
in the middle of a run, ``check_finite`` reads every floating-point array before training, in
chunks (a memory-mapped shard is never read whole), and names the array, how many samples hold
NaN or inf, the first of them and its shard. With ``nonfinite="skip"`` it warns and the run goes
on, skipping each batch that holds one; otherwise it refuses, saying how to train anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ortlstm.datafiles import ConcatenatedRows, ShardedArray
from ortlstm.fit.arrays import ArraySpec, batch_arguments
from ortlstm.training import Trainer

CHUNK_BYTES = 16 << 20
"""How much of an array ``nonfinite_samples`` reads at a time (16 MiB; bounded memory for any data size)."""


def nonfinite_samples(array: Any, axis: int) -> tuple[int, int | None, str | None]:
    """(samples holding NaN or inf, the first one's index, the shard file holding it) of ``array``.

    A sample is a slice along ``axis``. The array is read ``CHUNK_BYTES`` at a time, shard by
    shard for a ``ShardedArray`` (whose parts are concatenated along ``axis``); the file is
    None when the array is not sharded. Integer arrays hold no NaN: (0, None, None).
    """
    if isinstance(array, ConcatenatedRows):
        array = array.values
    if np.dtype(array.dtype).kind not in "fc":
        return 0, None, None
    parts = zip(array.files, array.parts, strict=True) if isinstance(array, ShardedArray) else [(None, array)]
    count, first, first_file, offset = 0, None, None, 0
    for file, part in parts:
        if part.ndim <= axis:
            continue
        rows = part.shape[axis]
        row_bytes = max(1, part.itemsize * (part.size // rows if rows else 0))
        step = max(1, CHUNK_BYTES // row_bytes)
        others = tuple(index for index in range(part.ndim) if index != axis)
        for start in range(0, rows, step):
            chunk = part[(slice(None),) * axis + (slice(start, start + step),)]
            bad = np.flatnonzero(~np.isfinite(chunk).all(axis=others))
            if bad.size and first is None:
                first, first_file = offset + start + int(bad[0]), file
            count += int(bad.size)
        offset += rows
    return count, first, first_file


def check_finite(
    arrays: Mapping[str, Any],
    specs: Mapping[str, ArraySpec],
    where: str,
    *,
    skip: bool,
    warn: Callable[[str], None],
    validation: bool = False,
) -> None:
    """Checks the floating-point arrays of a data file for NaN and inf, before anything is trained.

    Args:
        arrays: The arrays as the loop reads them (``prepare_data``).
        specs: Their batch axes.
        where: The data's name in messages (its file).
        skip: The trainer skips non-finite updates (``nonfinite="skip"``): warn and go on.
        warn: Receives the warning.
        validation: The arrays are the validation set, which is evaluated, never skipped.

    Raises:
        ValueError: Without ``skip``, an array holds NaN or inf; the message names each such array,
            the count of samples, the first one (and its shard) and says how to train anyway.
    """
    found = []
    for name, array in arrays.items():
        count, first, file = nonfinite_samples(array, specs[name].batch_axis)
        if count:  # a float array holds one entry per sample (only ctc_loss's integer labels come concatenated)
            total = array.shape[specs[name].batch_axis]
            shard = f" in shard {file}" if file is not None else ""
            found.append(
                f"array {name!r} holds NaN or inf in {count} of {total} samples (the first: sample {first}{shard})"
            )
    if not found:
        return
    if skip:
        effect = (
            "the validation set is evaluated as it is, so its loss will not be finite (each epoch's warning counts "
            "the samples)"
            if validation
            else "each batch holding one is skipped, its other samples too"
        )
        warn(f"{where}: {'; '.join(found)}; --nonfinite skip: {effect}")
        return
    raise ValueError(
        f"{where}: {'; '.join(found)}; a batch holding one has a NaN loss and gradients. Fix or drop those samples, "
        "or pass --nonfinite skip (Trainer(..., nonfinite='skip')) to train anyway, skipping each batch that holds one"
    )


def nonfinite_validation(
    trainer: Trainer, arrays: Mapping[str, Any], specs: Mapping[str, ArraySpec], batch_size: int, count: int
) -> tuple[int, int | None, bool]:
    """(samples whose validation loss is not finite, the first one, whether counted sample by sample).

    Called only when the validation loss is not finite: each batch is evaluated again, and each
    sample of a batch whose loss is not finite alone. A model that cannot evaluate one sample (a
    fixed batch size) counts the samples of such batches instead (then the flag is False).
    """
    bad: list[int] = []
    exact = True
    for start in range(0, count, batch_size):
        rows = np.arange(start, min(start + batch_size, count))
        if _finite(_evaluate_rows(trainer, arrays, specs, rows)):
            continue
        try:
            bad += [int(row) for row in rows if not _finite(_evaluate_rows(trainer, arrays, specs, np.array([row])))]
        except Exception:  # a model that refuses a batch of one: count the batch's samples
            bad += [int(row) for row in rows]
            exact = False
    return len(bad), (bad[0] if bad else None), exact


def _evaluate_rows(trainer: Trainer, arrays: Mapping[str, Any], specs: Mapping[str, ArraySpec], rows: Any) -> Any:
    """The loss of ``rows`` of the validation arrays (``Trainer.evaluate``)."""
    return trainer.evaluate(outputs=[], **batch_arguments(arrays, specs, trainer.signature.target, rows))


def _finite(loss: Any) -> bool:
    """Whether every element of a loss is finite."""
    return bool(np.isfinite(np.asarray(loss, dtype=np.float64)).all())


def validation_warning(
    trainer: Trainer,
    arrays: Mapping[str, Any],
    specs: Mapping[str, ArraySpec],
    batch_size: int,
    val_loss: float,
    where: str,
) -> str | None:
    """The warning for a validation loss that is not finite (None when it is): how many samples, the first."""
    if math.isfinite(val_loss):
        return None
    count = next(
        int(array.shape[specs[name].batch_axis])
        for name, array in arrays.items()
        if not isinstance(array, ConcatenatedRows)
    )
    bad, first, exact = nonfinite_validation(trainer, arrays, specs, batch_size, count)
    if not bad:
        counted = f"every batch's loss is finite, their {trainer.spec.loss.reduction} is not"
    elif exact:
        verb = "has" if bad == 1 else "have"
        counted = f"{bad} of {count} samples {verb} a loss that is not finite (the first: sample {first})"
    else:
        counted = (
            f"{bad} of {count} samples are in batches whose loss is not finite (the first: sample {first}; the model "
            "cannot evaluate a sample alone)"
        )
    return f"{where}: the validation loss is {val_loss}: {counted}"
