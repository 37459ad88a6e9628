"""Records what torch does with a target that does not fit the prediction, and cross_entropy on class probabilities.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_targets.py

It rewrites ``targets.json`` and ``targets.npz`` next to this file, which ``tests/test_targets.py``
reads without torch:

- ``decisions`` (in the JSON): for each loss, a prediction shape and targets of other shapes
  (another batch size, a broadcastable size, more or fewer axes), torch's decision: ``"error"``
  (its exception type and message), ``"warning"`` (its target-size UserWarning and the loss) or
  ``"ok"`` (the loss). The inputs are seeded and rebuilt by the test from the same rule
  (``decision_arrays``), so only the shapes and torch's answers are stored.
- ``probabilities`` (the npz, float32 and float64): a linear classifier ``x @ W.T + b`` under
  ``F.cross_entropy`` with class-probability targets (label_smoothing and class weights among
  them): the inputs, the weights, torch's loss and its gradients of ``W`` and ``b``.
"""

from __future__ import annotations

import json
import pathlib
import sys
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from target_cases import decision_arrays  # noqa: E402

SIZE_WARNING = "Using a target size"
"""The start of torch's warning for a target of another size (other warnings, such as kl_div's
advice on "batchmean", are not what this recording is about)."""


ELEMENTWISE = (
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "kl_div",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "soft_margin_loss",
)
ELEMENTWISE_TARGETS = ([32, 3], [16, 3], [40, 3], [1, 3], [1, 1], [32, 1], [3], [32], [2, 32, 3])
TIME_MAJOR_TARGETS = ([6, 4, 3], [6, 2, 3], [6, 1, 3], [1, 4, 3])
"""A time-major prediction [T=6, batch=4, 3]: the batch is axis 1."""
CLASS_TARGETS = (([32], "int64"), ([16], "int64"), ([1], "int64"), ([40], "int64"), ([32, 1], "int64"))
PROBABILITY_TARGETS = ([32, 3], [16, 3], [1, 3], [32, 4])


def _decide(kind: str, call: Any) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = call()
        except (RuntimeError, ValueError) as error:
            return {"outcome": "error", "error": type(error).__name__, "message": str(error).splitlines()[0]}
    size_warnings = [str(item.message) for item in caught if str(item.message).startswith(SIZE_WARNING)]
    result: dict[str, Any] = {"outcome": "warning" if size_warnings else "ok", "loss": float(value)}
    if size_warnings:
        result["message"] = size_warnings[0]
    return result


def _record(kind: str, input_shape: list[int], target_shape: list[int], dtype: str = "float64") -> dict[str, Any]:
    prediction, target = decision_arrays(kind, input_shape, target_shape, dtype)
    x, y = torch.from_numpy(prediction), torch.from_numpy(target)
    decision = _decide(kind, lambda: getattr(F, kind)(x, y))
    return {"kind": kind, "input": input_shape, "target": target_shape, "dtype": dtype, **decision}


def _record_ctc(case: str, target_shape: list[int], target_lengths: int, input_lengths: int) -> dict[str, Any]:
    """ctc_loss on log-probabilities (T=6, N=4, C=5): padded labels and lengths of other batch sizes."""
    prediction, _ = decision_arrays("ctc_loss", [6, 4, 5], target_shape, "float64")
    labels = torch.ones(target_shape, dtype=torch.int64)
    lengths = torch.full((target_lengths,), 2, dtype=torch.int64)
    steps = torch.full((input_lengths,), 6, dtype=torch.int64)
    decision = _decide("ctc_loss", lambda: F.ctc_loss(torch.from_numpy(prediction), labels, steps, lengths))
    return {
        "kind": "ctc_loss",
        "case": case,
        "input": [6, 4, 5],
        "target": target_shape,
        "target_lengths": target_lengths,
        "input_lengths": input_lengths,
        "dtype": "int64",
        **decision,
    }


def decisions() -> list[dict[str, Any]]:
    rows = [_record(kind, [32, 3], target) for kind in ELEMENTWISE for target in ELEMENTWISE_TARGETS]
    rows += [_record(kind, [6, 4, 3], target) for kind in ("mse_loss", "l1_loss") for target in TIME_MAJOR_TARGETS]
    for kind in ("cross_entropy", "nll_loss"):
        rows += [_record(kind, [32, 3], target, dtype) for target, dtype in CLASS_TARGETS]
    rows += [_record("cross_entropy", [32, 3], target) for target in PROBABILITY_TARGETS]
    rows += [
        _record_ctc("fits", [4, 2], 4, 4),
        _record_ctc("labels_of_another_batch", [3, 2], 4, 4),
        _record_ctc("target_lengths_of_another_batch", [4, 2], 3, 4),
        _record_ctc("input_lengths_of_another_batch", [4, 2], 4, 3),
    ]
    return rows


PROBABILITY_CASES = [
    {"name": "mean", "kwargs": {}},
    {"name": "sum", "kwargs": {"reduction": "sum"}},
    {"name": "none", "kwargs": {"reduction": "none"}},
    {"name": "smoothed_weighted", "kwargs": {"label_smoothing": 0.2, "weight": [0.5, 2.0, 1.0, 1.5]}},
    {"name": "smoothed", "kwargs": {"label_smoothing": 0.1}},
]
BATCH, FEATURES, CLASSES = 6, 5, 4


def probabilities() -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """The linear classifier's loss and parameter gradients under cross_entropy with class probabilities."""
    rng = np.random.default_rng(20261127)
    x = rng.standard_normal((BATCH, FEATURES))
    weight = rng.uniform(-0.5, 0.5, (CLASSES, FEATURES))
    bias = rng.uniform(-0.5, 0.5, CLASSES)
    logits = rng.standard_normal((BATCH, CLASSES))
    target = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    target[0] = [0.0, 1.0, 0.0, 0.0]  # a one-hot row (a zero probability: 0 * log p) among them
    arrays: dict[str, np.ndarray] = {}
    for dtype, torch_dtype in (("float32", torch.float32), ("float64", torch.float64)):
        arrays[f"{dtype}/x"] = x.astype(dtype)
        arrays[f"{dtype}/weight"] = weight.astype(dtype)
        arrays[f"{dtype}/bias"] = bias.astype(dtype)
        arrays[f"{dtype}/target"] = target.astype(dtype)
        for case in PROBABILITY_CASES:
            w = torch.tensor(weight, dtype=torch_dtype, requires_grad=True)
            b = torch.tensor(bias, dtype=torch_dtype, requires_grad=True)
            kwargs = dict(case["kwargs"])
            if "weight" in kwargs:
                kwargs["weight"] = torch.tensor(kwargs["weight"], dtype=torch_dtype)
            loss = F.cross_entropy(
                torch.tensor(x, dtype=torch_dtype) @ w.T + b, torch.tensor(target, dtype=torch_dtype), **kwargs
            )
            loss.sum().backward()
            arrays[f"{dtype}/{case['name']}/loss"] = loss.detach().numpy()
            arrays[f"{dtype}/{case['name']}/grad_weight"] = w.grad.numpy()  # type: ignore[union-attr]
            arrays[f"{dtype}/{case['name']}/grad_bias"] = b.grad.numpy()  # type: ignore[union-attr]
    return PROBABILITY_CASES, arrays


def main() -> None:
    cases, arrays = probabilities()
    meta = {"torch": torch.__version__, "decisions": decisions(), "probabilities": cases}
    (HERE / "targets.json").write_text(json.dumps(meta, indent=1) + "\n")
    np.savez_compressed(HERE / "targets.npz", **arrays)


if __name__ == "__main__":
    main()
