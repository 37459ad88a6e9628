"""The inputs of the recorded target decisions (``recordings/record_targets.py``), rebuilt alike without torch."""

from __future__ import annotations

import numpy as np


def decision_arrays(
    kind: str, input_shape: list[int], target_shape: list[int], dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """The seeded prediction and target of one decision: the recording and ``tests/test_targets.py`` both call this.

    Predictions lie in [0.1, 0.9] (binary_cross_entropy's probabilities; any other loss takes them),
    ctc_loss's normalized to log-probabilities over the last axis; float targets in [0, 1]; class
    indices in [0, 3).
    """
    rng = np.random.default_rng([len(input_shape), *input_shape, len(target_shape), *target_shape])
    prediction = rng.uniform(0.1, 0.9, input_shape)
    if kind == "ctc_loss":
        prediction = np.log(prediction / prediction.sum(axis=-1, keepdims=True))
    if dtype == "int64":
        return prediction, rng.integers(0, 3, target_shape).astype(np.int64)
    return prediction, rng.uniform(0.0, 1.0, target_shape)
