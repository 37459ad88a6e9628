"""Validation during a fit: the loss over data in order, and argmax accuracy or greedy-decoding CER."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ortlstm import metrics
from ortlstm.datafiles import ConcatenatedRows
from ortlstm.distributed import shard
from ortlstm.fit.arrays import ArraySpec, batch_arguments
from ortlstm.training import Trainer


def evaluate_data(
    trainer: Trainer,
    arrays: Mapping[str, np.ndarray],
    specs: Mapping[str, ArraySpec],
    batch_size: int,
    *,
    rank: int = 0,
    size: int = 1,
    gather: Callable[[Any], list[Any]] | None = None,
) -> tuple[float, float | None, float | None]:
    """(loss, accuracy or None, CER or None) over data in order, in batches of ``batch_size``.

    Over several processes, rank ``rank`` of ``size`` evaluates its contiguous part of the rows
    (``shard``) and ``gather`` (an all-gather) brings every rank's sums, added in rank order: the
    figures of one process up to the rounding of the batches' float32 losses.

    The loss of a ``mean`` reduction is the batch means weighted by batch size (the mean over the
    samples); ``sum`` adds the batches; ``none`` averages every element. The metric is the one the
    loss's table entry declares (``Loss.metric``, see ``losses.METRICS``): accuracy for class-index
    targets (argmax over axis 1, ``ignore_index`` left out), CER for labels with lengths (ctc_loss:
    greedy decoding of the prediction, ``ortlstm.metrics``), none for the others.
    """
    spec = trainer.spec
    loss_kind = spec.loss
    count = next(
        int(array.shape[specs[name].batch_axis])
        for name, array in arrays.items()
        if not isinstance(array, ConcatenatedRows)
    )
    target_name = trainer.signature.target
    metric = loss_kind.metric
    wants_output = target_name is not None and metric is not None
    outputs = [spec.prediction] if spec.prediction is not None else []  # a trainer's spec: resolved
    total = 0.0
    elements = 0
    correct = counted = 0
    decoded: list[list[int]] = []
    references: list[list[int]] = []
    part = shard(count, rank, size)
    for first in range(part.start, part.stop, batch_size):
        rows = np.arange(first, min(first + batch_size, part.stop))
        named = batch_arguments(arrays, specs, target_name, rows)
        if wants_output:
            loss, prediction = trainer.evaluate(outputs=outputs, **named)
        else:
            loss, prediction = trainer.evaluate(outputs=[], **named), None
        loss_array = np.asarray(loss, dtype=np.float64)
        if loss_kind.reduction == "none":
            total += float(loss_array.sum())
            elements += loss_array.size
        else:
            total += float(loss_array) * (len(rows) if loss_kind.reduction != "sum" else 1)
            elements += len(rows)
        if prediction is None:
            continue
        target = named["target"]
        if metric == "cer" and loss_kind.lengths is not None:
            lengths = named.get(trainer.signature.extra_targets.get("input_lengths", ""))
            decoded += metrics.ctc_greedy_decode(
                prediction, blank=loss_kind.blank, time_major=not loss_kind.batch_first, input_lengths=lengths
            )
            target_lengths = named[trainer.signature.extra_targets[loss_kind.lengths]]
            if target.ndim == 1:  # concatenated labels
                references += [list(row) for row in np.split(target, np.cumsum(target_lengths)[:-1])]
            else:
                references += [list(row[: int(n)]) for row, n in zip(target, target_lengths, strict=True)]
        elif metric == "accuracy" and target.dtype.kind in "iu":
            keep = target != loss_kind.ignore_index
            correct += int(np.sum((np.argmax(prediction, axis=1) == target) & keep))
            counted += int(np.sum(keep))
    if gather is not None:  # every rank's sums, in rank order
        sums = gather((total, elements, correct, counted, decoded, references))
        total, elements = sum(item[0] for item in sums), sum(item[1] for item in sums)
        correct, counted = sum(item[2] for item in sums), sum(item[3] for item in sums)
        decoded = [row for item in sums for row in item[4]]
        references = [row for item in sums for row in item[5]]
    loss_value = total / elements if loss_kind.reduction != "sum" else total
    accuracy = correct / counted if counted else None
    cer = metrics.character_error_rate(decoded, references) if references and any(references) else None
    return loss_value, accuracy, cer
