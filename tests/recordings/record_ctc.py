"""Records torch.nn.functional.ctc_loss values and gradients for the torch-free CTC tests.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_ctc.py

It rewrites ``ctc.npz`` next to this file: a ``configs`` entry (JSON: each case's sizes, blank,
zero_infinity and target layout) and, per case, the inputs (``<case>/logits`` in float64, targets
and lengths, ``<case>/weights`` for reduction='none') and, per dtype, torch's log_softmax of the
logits (the log_probs the ops are fed), the loss under each reduction and its gradients with respect
to log_probs and (for 'none' and 'mean') to the logits, through log_softmax. Everything is seeded, so a rerun with the
same torch gives the same file. ``tests/test_ctc.py`` reads it without torch.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
SEED = 20261126
DTYPES = {"float32": torch.float32, "float64": torch.float64}
REDUCTIONS = ("none", "sum", "mean")

# Each case: sizes (T steps, N samples, C classes, S padded target width), blank, zero_infinity,
# target layout, target dtype and how its lengths and labels are drawn.
CASES: dict[str, dict[str, Any]] = {
    "random_padded": {"T": 12, "N": 4, "C": 6, "S": 5},
    "random_concatenated": {"T": 12, "N": 4, "C": 6, "S": 5, "layout": "concatenated"},
    "repeated_labels": {"T": 14, "N": 3, "C": 4, "S": 6, "repeats": True},
    "empty_targets": {"T": 8, "N": 4, "C": 5, "S": 3, "empty": (0, 2)},
    "blank_last": {"T": 10, "N": 3, "C": 6, "S": 4, "blank": 5},
    "blank_middle_int32": {"T": 10, "N": 3, "C": 7, "S": 4, "blank": 3, "target_dtype": "int32"},
    "too_long": {"T": 6, "N": 4, "C": 5, "S": 5, "too_long": True},
    "too_long_zero_infinity": {"T": 6, "N": 4, "C": 5, "S": 5, "too_long": True, "zero_infinity": True},
    "too_long_concatenated_zero_infinity": {
        "T": 6,
        "N": 4,
        "C": 5,
        "S": 5,
        "too_long": True,
        "zero_infinity": True,
        "layout": "concatenated",
    },
    "batch_1": {"T": 9, "N": 1, "C": 5, "S": 3},
    "batch_64": {"T": 16, "N": 64, "C": 8, "S": 5, "repeats": True},
    "long_input_T1000": {"T": 1000, "N": 2, "C": 4, "S": 40, "full_lengths": True},
}


def _draw(name: str, case: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Logits, padded targets and lengths for one case."""
    t, n, c, s = case["T"], case["N"], case["C"], case["S"]
    blank = case.get("blank", 0)
    labels = np.array([k for k in range(c) if k != blank])
    target_lengths = rng.integers(1, s + 1, size=n)
    targets = np.zeros((n, s), np.int64)
    for b in range(n):
        row = rng.choice(labels, size=s)
        if case.get("repeats"):
            row[1::2] = row[0::2][: len(row[1::2])]  # pairs of equal neighbours: each needs a blank between
        targets[b] = row
    for b in case.get("empty", ()):
        target_lengths[b] = 0
    input_lengths = np.empty(n, np.int64)
    for b in range(n):
        row = targets[b, : target_lengths[b]]
        needed = len(row) + int(np.sum(row[1:] == row[:-1]))  # each repeat needs a blank between
        input_lengths[b] = t if case.get("full_lengths") else rng.integers(min(max(needed, 1), t), t + 1)
    if case.get("too_long"):
        # Sample 0: more labels than steps; 1: fits only without repeats (it has some); 2: input length 0
        # with a target; 3: input length 0 and an empty target (loss 0).
        target_lengths[0], input_lengths[0] = s, s - 2
        targets[1, :3] = targets[1, 0]
        target_lengths[1], input_lengths[1] = 3, 4
        target_lengths[2], input_lengths[2] = 2, 0
        target_lengths[3], input_lengths[3] = 0, 0
    # Padding beyond each target length holds blank, which must be ignored.
    for b in range(n):
        targets[b, target_lengths[b] :] = blank
    logits = rng.normal(scale=2.0, size=(t, n, c))
    if name == "long_input_T1000":
        logits *= 3.0  # sharper: a likelihood far below float's smallest normal in probability space
    return {"logits": logits, "targets": targets, "input_lengths": input_lengths, "target_lengths": target_lengths}


def main() -> None:
    """Writes ctc.npz."""
    rng = np.random.default_rng(SEED)
    arrays: dict[str, np.ndarray] = {}
    configs = {}
    for name, case in CASES.items():
        drawn = _draw(name, case, rng)
        layout = case.get("layout", "padded")
        target_dtype = np.int32 if case.get("target_dtype") == "int32" else np.int64
        if layout == "concatenated":
            targets = np.concatenate(
                [row[:length] for row, length in zip(drawn["targets"], drawn["target_lengths"], strict=True)]
            )
        else:
            targets = drawn["targets"]
        targets = targets.astype(target_dtype)
        weights = rng.uniform(0.5, 1.5, size=case["N"])
        configs[name] = {
            "blank": case.get("blank", 0),
            "zero_infinity": bool(case.get("zero_infinity", False)),
            "layout": layout,
        }
        arrays[f"{name}/logits"] = drawn["logits"]
        arrays[f"{name}/targets"] = targets
        arrays[f"{name}/input_lengths"] = drawn["input_lengths"].astype(target_dtype)
        arrays[f"{name}/target_lengths"] = drawn["target_lengths"].astype(target_dtype)
        arrays[f"{name}/weights"] = weights
        for dtype_name, dtype in DTYPES.items():
            prefix = f"{name}/{dtype_name}"
            for reduction in REDUCTIONS:
                logits = torch.tensor(drawn["logits"], dtype=dtype, requires_grad=True)
                log_probs = F.log_softmax(logits, dim=2)
                log_probs.retain_grad()
                loss = F.ctc_loss(
                    log_probs,
                    torch.from_numpy(targets),
                    torch.from_numpy(arrays[f"{name}/input_lengths"]),
                    torch.from_numpy(arrays[f"{name}/target_lengths"]),
                    blank=configs[name]["blank"],
                    reduction=reduction,
                    zero_infinity=configs[name]["zero_infinity"],
                )
                objective = (loss * torch.tensor(weights, dtype=dtype)).sum() if reduction == "none" else loss
                objective.backward()
                arrays[f"{prefix}/log_probs"] = log_probs.detach().numpy()
                arrays[f"{prefix}/loss_{reduction}"] = loss.detach().numpy()
                arrays[f"{prefix}/grad_log_probs_{reduction}"] = log_probs.grad.numpy()
                if reduction != "sum":  # kept small: 'sum' differs from 'none' only by the weights
                    arrays[f"{prefix}/grad_logits_{reduction}"] = logits.grad.numpy()
    arrays["configs"] = np.array(json.dumps({"torch": torch.__version__, "cases": configs}, sort_keys=True))
    np.savez_compressed(HERE / "ctc.npz", **arrays)


if __name__ == "__main__":
    main()
