"""A seeded random-model parity suite against torch: the fast subset (issue 31).

25 models of the grammar in tests/random_model_grammar.py (seeds 0-19, 27, 37, 41, 46, 78), each exported three ways
(dynamo's default, dynamo optimize=False, TorchScript), trained 3 steps by torch 2.13 and
recorded (tests/recordings/record_random_models.py), are replayed here without torch through
``Trainer(model, loss=..., optimizer=...)`` with its defaults (tests/random_model_replay.py): the
forward before training, the mapping of every trained tensor to torch's parameters (and of every
torch parameter to one trained tensor), each step's loss, gradients and update. Each export's
outcome is pinned: ``match``, or ``refused`` / ``warned`` with the reason's words. A model that
trains differently without a word is a bug, pinned as xfail(strict=True) with its reason until
fixed. ``scripts/random_models.py --count 120`` runs the larger suite; docs/parity.md has its table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import random_model_grammar as grammar
from random_model_replay import FLAVOURS, load, replay

RECORDINGS = Path(__file__).parent / "recordings" / "random_models"
SEEDS = (*range(20), 27, 37, 41, 46, 78)  # 27, 37, 41: SiLU, a unidirectional GRU, Hardswish; 46, 78: fused BatchNorms

TRAIN_MODE_BN_DYNAMO = "torch called batch_norm in training mode here"
TRAIN_MODE_BN_TORCHSCRIPT = "training_mode=1 (normalizing by batch statistics) has no gradient rule"
EMBEDDING_PADDING = "a TorchScript export does not say whether torch's nn.Embedding had a padding_idx"

# (seed, flavour) -> (outcome, words of its reason); the others match.
EXPECTED: dict[tuple[int, str], tuple[str, str]] = {
    (0, "dynamo"): ("refused", TRAIN_MODE_BN_DYNAMO),
    (0, "dynamo_unoptimized"): ("refused", TRAIN_MODE_BN_DYNAMO),
    (0, "torchscript"): ("refused", TRAIN_MODE_BN_TORCHSCRIPT),
    (2, "dynamo"): ("refused", TRAIN_MODE_BN_DYNAMO),
    (2, "dynamo_unoptimized"): ("refused", TRAIN_MODE_BN_DYNAMO),
    (2, "torchscript"): ("refused", TRAIN_MODE_BN_TORCHSCRIPT),
    (8, "torchscript"): ("warned", EMBEDDING_PADDING),
    (12, "torchscript"): ("warned", EMBEDDING_PADDING),
    (41, "torchscript"): ("warned", EMBEDDING_PADDING),
    (46, "dynamo"): ("refused", "hold a BatchNorm that torch called in training mode"),
    (46, "dynamo_unoptimized"): ("refused", TRAIN_MODE_BN_DYNAMO),
    (46, "torchscript"): ("refused", TRAIN_MODE_BN_TORCHSCRIPT),
    (78, "dynamo"): ("warned", "folded a BatchNorm into the Conv or Linear (Gemm) before it: ['2.bias', '2.weight']"),
}


def _cases() -> list[object]:
    cases: list[object] = []
    for seed in SEEDS:
        for flavour in FLAVOURS:
            outcome, reason = EXPECTED.get((seed, flavour), ("match", ""))
            marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if outcome == "WRONG" else []
            cases.append(pytest.param(seed, flavour, outcome, reason, marks=marks, id=f"{seed}-{flavour}"))
    return cases


@pytest.mark.parametrize(("seed", "flavour", "outcome", "reason"), _cases())
def test_random_model_trains_as_torch_or_says_why(seed: int, flavour: str, outcome: str, reason: str) -> None:
    result = replay(RECORDINGS, seed, flavour)
    if outcome == "WRONG":  # a bug: fails until fixed, then XPASS(strict) says to pin "match" here
        assert result.outcome == "match", result.reason
        return
    assert (result.outcome, reason in result.reason) == (outcome, True), result.reason


def test_recordings_are_the_grammars_models() -> None:
    """The recorded specs are what the grammar draws today (rerun the recorder after editing it)."""
    for seed in SEEDS:
        assert json.loads(load(RECORDINGS, seed)["spec"].tobytes()) == grammar.draw(seed), seed


def test_subset_covers_the_grammar() -> None:
    """The 25 seeds reach every loss, optimizer, export flavour and the blocks the suite is about."""
    specs = [grammar.draw(seed) for seed in SEEDS]
    assert {spec["loss"] for spec in specs} == {"cross_entropy", "mse_loss", "ctc_loss"}
    assert {spec["optimizer"] for spec in specs} == {"SGD", "Adam", "AdamW"}
    classes = {name for spec in specs for name in grammar.block_classes(spec)}
    wanted = {"LSTM", "LSTM bi", "RNN", "GRU", "Conv1d", "Conv2d", "Linear", "LayerNorm", "GroupNorm",
              "BatchNorm eval", "BatchNorm train", "Embedding", "Embedding padding_idx", "ResidualLinear",
              "GELU", "SiLU", "Hardswish", "Dropout"}
    assert wanted <= classes, sorted(wanted - classes)


@pytest.mark.parametrize(("seed", "optimizer"), [(3, "Adam"), (6, "AdamW"), (9, "SGD")])
def test_a_learning_rate_one_percent_off_fails_the_check(seed: int, optimizer: str) -> None:
    """Not only the loss: each update is compared, so a 1% wrong lr is WRONG at the first step."""
    assert replay(RECORDINGS, seed, "dynamo").outcome == "match"
    assert grammar.draw(seed)["optimizer"] == optimizer
    for scale in (1.01, 0.99):
        result = replay(RECORDINGS, seed, "dynamo", lr_scale=scale)
        assert result.outcome == "WRONG", result.reason
        assert result.reason.startswith("step 0: update of "), result.reason


def test_torch_gradients_are_recorded_for_every_parameter() -> None:
    """The oracle itself: torch's gradients are there, finite and not all zero, for each step."""
    arrays = load(RECORDINGS, 3)
    names = [key.split("/")[1] for key in arrays if key.startswith("param/") and key.endswith("/initial")]
    for step in range(grammar.STEPS):
        gradients = [arrays[f"grad/{name}/{step}"] for name in names]
        assert all(np.all(np.isfinite(gradient)) for gradient in gradients)
        assert any(np.any(gradient != 0) for gradient in gradients)
