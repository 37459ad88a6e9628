"""The Trainer with a loss that reads several targets: ctc_loss's labels, target_lengths and input_lengths.

A small hand-built model (batch-first logits from a MatMul) is trained with
``Loss.ctc_loss(input="logits", batch_first=True)``: the lengths are fed by keyword, input_lengths
derived when not given, bad targets refused with their names, the kernel's refusal of a label
equal to blank surfaced with nothing trained, and a written directory and a checkpoint keep the
extra targets.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer

FEATURES, CLASSES = 4, 6


def model(seed: int = 0, features: int = FEATURES) -> onnx.ModelProto:
    """x [N, T, F] -> logits [N, T, C] = x @ W + B."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(0, 0.5, (features, CLASSES)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.normal(0, 0.1, CLASSES).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["logits"])],
        "ctc_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "T", CLASSES])],
        [weight, bias],
    )
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result.ir_version = 10
    return result


def trainer(features: int = FEATURES, **loss_options: object) -> Trainer:
    spec = losses.Loss.ctc_loss(input="logits", batch_first=True, **loss_options)
    return Trainer(model(features=features), loss=spec, optimizer=optimizers.Adam(lr=0.05))


def batch(size: int = 3, steps: int = 8, seed: int = 1, features: int = FEATURES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 4, size)
    labels = np.zeros((size, 3), np.int64)
    for row, length in enumerate(lengths):
        labels[row, :length] = rng.integers(1, CLASSES, length)
    return {
        "x": rng.normal(size=(size, steps, features)).astype(np.float32),
        "target": labels,
        "target_lengths": lengths.astype(np.int64),
    }


def params(trained: Trainer) -> dict[str, np.ndarray]:
    return {name: value.copy() for name, value in trained.parameters.items()}


def test_signature_keeps_target_and_names_the_other_targets() -> None:
    signature = trainer().signature
    assert signature.target == "target"
    assert signature.extra_targets == {"input_lengths": "input_lengths", "target_lengths": "target_lengths"}


def test_steps_lower_the_loss_and_input_lengths_are_derived_when_not_given() -> None:
    data = batch()
    derived, given = trainer(), trainer()
    steps = data["x"].shape[1]
    losses_derived = [derived.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])]
    for _ in range(5):
        losses_derived.append(derived.step(data["x"], target=data["target"], target_lengths=data["target_lengths"]))
    for _ in range(6):
        given.step(
            data["x"],
            target=data["target"],
            target_lengths=data["target_lengths"],
            input_lengths=np.full(3, steps, np.int32),
        )
    assert losses_derived[-1] < losses_derived[0]
    for name, value in params(derived).items():
        np.testing.assert_array_equal(value, params(given)[name], err_msg=name)


def test_shorter_input_lengths_change_the_loss() -> None:
    data = batch()
    full = trainer().evaluate(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    short = trainer().evaluate(
        data["x"], target=data["target"], target_lengths=data["target_lengths"], input_lengths=np.array([8, 6, 5])
    )
    assert np.isfinite(full) and np.isfinite(short) and full != short


def test_concatenated_targets_train_as_padded_ones() -> None:
    data = batch()
    lengths = data["target_lengths"]
    concatenated = np.concatenate([row[:length] for row, length in zip(data["target"], lengths, strict=True)])
    padded, flat = trainer(), trainer()
    padded.step(data["x"], target=data["target"], target_lengths=lengths)
    flat.step(data["x"], target=concatenated, target_lengths=lengths)
    for name, value in params(padded).items():
        np.testing.assert_array_equal(value, params(flat)[name], err_msg=name)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"target_lengths": None}, r"step\(\): the loss ctc_loss needs target_lengths=\.\.\. \(int64 \[N\]"),
        ({"target_lengths": np.array([1, 2])}, r"target_lengths must hold one length per sample, int64 \[N=3\]"),
        ({"input_lengths": np.array([8, 8, 8, 8])}, r"input_lengths must hold one length per sample, int64 \[N=3\]"),
        ({"target_lengths": np.array([1.0, 2.0, 1.0])}, r"step\(\): target_lengths must be integers"),
        ({"target": np.zeros((2, 3), np.int64)}, r"loss target 'target': ctc_loss expects padded labels \[N=3, S\]"),
        ({"target": np.zeros((3, 3), np.float32)}, "loss target 'target': ctc_loss expects int64 labels"),
    ],
)
def test_bad_targets_are_refused_with_their_names_before_running(changes: dict[str, object], message: str) -> None:
    trained = trainer()
    before = params(trained)
    data = {**batch(), **changes}
    named = {key: value for key, value in data.items() if key not in ("x", "target") and value is not None}
    with pytest.raises(ValueError, match=message):
        trained.step(data["x"], target=data["target"], **named)
    assert trained.global_step == 0
    for name, value in params(trained).items():
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (0, "targets: sample 1, position 0: expected a label in [0, C=6) other than blank=0, got 0"),
        (6, "targets: sample 1, position 0: expected a label in [0, C=6) other than blank=0, got 6"),
    ],
)
def test_labels_equal_to_blank_or_out_of_range_are_refused_by_the_kernel_and_nothing_is_trained(
    label: int, message: str
) -> None:
    trained = trainer()
    data = batch()
    trained.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    before = params(trained)
    bad = data["target"].copy()
    bad[1, 0] = label
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        trained.step(data["x"], target=bad, target_lengths=data["target_lengths"])
    assert trained.global_step == 1
    for name, value in params(trained).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    trained.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    assert trained.global_step == 2


def test_a_written_directory_and_a_checkpoint_keep_the_targets(tmp_path: Path) -> None:
    data = batch()
    original = trainer(blank=0, zero_infinity=True)
    original.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    directory = original.write(tmp_path / "run")
    original.save(tmp_path / "checkpoint.safetensors")
    reopened = Trainer.open(directory)
    rebuilt = Trainer.from_checkpoint(model(), tmp_path / "checkpoint.safetensors")
    assert reopened.signature.extra_targets == original.signature.extra_targets
    assert rebuilt.spec.loss.zero_infinity and rebuilt.spec.loss.batch_first and rebuilt.spec.loss.input == "logits"
    results = [
        each.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])
        for each in (original, reopened, rebuilt)
    ]
    assert results[0] == results[1] == results[2]


def test_cli_train_step_takes_the_loss_options_and_lists_the_targets(tmp_path: Path) -> None:
    from test_cli import describe, ortlstm_cli

    onnx.save(model(), str(tmp_path / "model.onnx"))
    result = ortlstm_cli(
        "train-step", "model.onnx", "run", "--loss", "ctc_loss", "--loss-option", "input=logits",
        "--loss-option", "batch_first=true", "--loss-option", "reduction=sum", "--optimizer", "adam", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    assert "batch feeds: x, target, input_lengths (optional), target_lengths;" in result.stdout, describe(result)
    opened = Trainer.open(tmp_path / "run")
    assert (opened.spec.loss.input, opened.spec.loss.batch_first, opened.spec.loss.reduction) == ("logits", True, "sum")
    data = batch()
    first = opened.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    for _ in range(3):
        last = opened.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    assert last < first


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("blank=one", r"--loss-option blank=one: expected int"),
        ("zero_infinity=maybe", r"--loss-option zero_infinity=maybe: expected true or false"),
        ("beta=2", r"--loss-option beta: ctc_loss takes blank, reduction, zero_infinity, input, batch_first"),
        ("input=softmax", r"ctc_loss input must be one of 'log_probs', 'probs', 'logits'"),
    ],
)
def test_cli_refuses_bad_loss_options(tmp_path: Path, option: str, message: str) -> None:
    from test_cli import describe, ortlstm_cli

    onnx.save(model(), str(tmp_path / "model.onnx"))
    result = ortlstm_cli(
        "train-step", "model.onnx", "run", "--loss", "ctc_loss", "--loss-option", option, "--optimizer", "adam",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, describe(result)
    assert result.stderr.startswith("ortlstm train-step: error:"), describe(result)
    assert re.search(message, result.stderr), describe(result)
    assert not (tmp_path / "run").exists()


def test_training_reads_the_batch_right_and_accumulation_is_a_step() -> None:
    """End to end: CTC training until the greedy reading of the eval model's output has no error.

    Also ``accumulate`` + ``apply`` on one batch is bitwise a ``step`` with the extra targets.
    """
    from ortlstm.metrics import character_error_rate, ctc_greedy_decode

    data = batch(seed=3, features=8)  # 24 steps in 8 dims: a linear map can tell them apart
    references = [list(row[:length]) for row, length in zip(data["target"], data["target_lengths"], strict=True)]
    trained = trainer(features=8)
    _, log_probs = trained.evaluate(
        data["x"], target=data["target"], target_lengths=data["target_lengths"], outputs=["logits"]
    )
    before = character_error_rate(ctc_greedy_decode(log_probs, time_major=False), references)
    for _ in range(150):
        trained.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    _, log_probs = trained.evaluate(
        data["x"], target=data["target"], target_lengths=data["target_lengths"], outputs=["logits"]
    )
    assert before > 0.5
    assert character_error_rate(ctc_greedy_decode(log_probs, time_major=False), references) == 0.0

    stepped, accumulated = trainer(features=8), trainer(features=8)
    stepped.step(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    accumulated.accumulate(data["x"], target=data["target"], target_lengths=data["target_lengths"])
    accumulated.apply()
    for name, value in params(stepped).items():
        np.testing.assert_array_equal(value, params(accumulated)[name], err_msg=name)
