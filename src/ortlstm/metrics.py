"""Reading a CTC model's outputs: greedy decoding, character error rate and sequence accuracy, in NumPy.

Usable on the eval model's outputs (``Trainer.evaluate(..., outputs=[...])``) or any runtime's:
``ctc_greedy_decode`` turns per-step class scores into label sequences, ``character_error_rate``
and ``sequence_accuracy`` compare them with the references. No onnxruntime, no torch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def ctc_greedy_decode(
    scores: np.ndarray,
    blank: int = 0,
    time_major: bool = True,
    input_lengths: Sequence[int] | np.ndarray | None = None,
) -> list[list[int]]:
    """Best-path CTC decoding: the most likely class at each step, repeats merged, blanks dropped.

    ``scores`` may be log-probabilities, probabilities or logits: the argmax over the classes is
    the same. A repeated label needs a blank between its two occurrences (``a - a`` reads ``aa``,
    ``a a`` reads ``a``), as in CTC's alignments.

    Args:
        scores: ``(T, N, C)`` class scores (``(N, T, C)`` with ``time_major=False``), as ctc_loss
            takes log-probabilities.
        blank: The blank class.
        time_major: Whether the first axis is time (torch's ctc_loss layout), else the batch.
        input_lengths: Valid steps of each sample (default: all T).

    Returns:
        Each sample's labels, a list of ints per sample.

    Raises:
        ValueError: ``scores`` is not 3-D, ``blank`` is not one of its classes, or
            ``input_lengths`` does not hold one length in [0, T] per sample.
    """
    scores = np.asarray(scores)
    layout = "(T, N, C)" if time_major else "(N, T, C)"
    if scores.ndim != 3:
        raise ValueError(f"scores must be 3-D {layout} (time_major={time_major}), got shape {list(scores.shape)}")
    if time_major:
        scores = scores.transpose(1, 0, 2)
    batch, steps, classes = scores.shape
    if not 0 <= blank < classes:
        raise ValueError(f"blank {blank} is not one of the {classes} classes of scores {layout}")
    if input_lengths is None:
        lengths = np.full(batch, steps)
    else:
        lengths = np.asarray(input_lengths)
        if lengths.shape != (batch,) or lengths.dtype.kind not in "iu" or np.any((lengths < 0) | (lengths > steps)):
            raise ValueError(
                f"input_lengths must hold one integer in [0, T={steps}] per sample, [N={batch}], "
                f"got {lengths.dtype} {list(lengths.shape)}: {lengths.tolist()}"
            )
    best = scores.argmax(axis=2)  # [N, T]
    decoded = []
    for row, length in zip(best, lengths, strict=True):
        path = row[: int(length)]
        keep = np.ones(len(path), dtype=bool)
        keep[1:] = path[1:] != path[:-1]  # the first step of each run
        decoded.append([int(label) for label in path[keep & (path != blank)]])
    return decoded


def edit_distance(prediction: Sequence[Hashable], reference: Sequence[Hashable]) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions turning one into the other."""
    previous = list(range(len(reference) + 1))
    for i, item in enumerate(prediction, start=1):
        current = [i]
        for j, wanted in enumerate(reference, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (item != wanted)))
        previous = current
    return previous[-1]


def _pairs(
    predictions: Sequence[Sequence[Hashable]], references: Sequence[Sequence[Hashable]]
) -> list[tuple[Sequence[Hashable], Sequence[Hashable]]]:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references: give one per sample")
    return list(zip(predictions, references, strict=True))


def character_error_rate(
    predictions: Sequence[Sequence[Hashable]], references: Sequence[Sequence[Hashable]]
) -> float:
    """Edit distances summed over the samples, divided by the references' total length.

    Sequences are strings or label lists (as ``ctc_greedy_decode`` returns). 0 is perfect; it
    exceeds 1 when the predictions hold many insertions.

    Raises:
        ValueError: The counts differ, or every reference is empty (the rate is undefined).
    """
    pairs = _pairs(predictions, references)
    total = sum(len(reference) for _, reference in pairs)
    if total == 0:
        raise ValueError("the references hold no character: the character error rate is undefined")
    return sum(edit_distance(prediction, reference) for prediction, reference in pairs) / total


def sequence_accuracy(predictions: Sequence[Sequence[Hashable]], references: Sequence[Sequence[Hashable]]) -> float:
    """The fraction of samples read exactly right.

    Raises:
        ValueError: The counts differ, or there is no sample.
    """
    pairs = _pairs(predictions, references)
    if not pairs:
        raise ValueError("no sample: the sequence accuracy is undefined")
    return sum(list(prediction) == list(reference) for prediction, reference in pairs) / len(pairs)
