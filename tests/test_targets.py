"""Targets checked against the batch as torch checks them, and cross_entropy on class probabilities.

``tests/recordings/targets.json`` (made with torch by ``tests/recordings/record_targets.py``) holds
torch's decision for each loss and a target of another shape than the prediction: an error, a
broadcast with torch's target-size UserWarning, or a broadcast without one, and the loss. The
Trainer makes the same decision before running (its error names the target, the expected and
actual shape; its warning is torch's text) and, where torch computes a loss, the same loss.
``targets.npz`` holds cross_entropy with class-probability targets on a linear classifier: the
Trainer's loss and parameter gradients match torch's. fit refuses, up front, the labels the
Trainer refuses. Nothing here imports torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from target_cases import decision_arrays

from ortlstm import fit as fitting
from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer

RECORDINGS = Path(__file__).resolve().parent / "recordings"
META = json.loads((RECORDINGS / "targets.json").read_text())
ARRAYS = np.load(RECORDINGS / "targets.npz")
FLOAT64 = {"rtol": 1e-12, "atol": 1e-14}
FLOAT32 = {"rtol": 1e-5, "atol": 1e-6}
"""float64 to a few roundings; float32 to the usual tolerance (sums in another order)."""


def passthrough(
    dims: list[str | int],
    dtype: int = TensorProto.DOUBLE,
    ending: str | None = None,
    declared: list[str | int] | None = None,
) -> onnx.ModelProto:
    """``x * w`` (w: ones, the one parameter) reshaped to x's shape: the prediction is the input.

    The Reshape by a computed shape makes shape inference lose the batch dim's name (as in a
    torch.onnx dynamo export of an LSTM: ``[unk__0, 3]``); the declared output says it, unless
    ``declared`` gives the output other dims. ``ending``: an op applied last (LogSoftmax over
    the classes for ctc_loss).
    """
    weight = numpy_helper.from_array(np.ones(dims[-1], onnx.helper.tensor_dtype_to_np_dtype(dtype)), "w")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["scaled"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Reshape", ["scaled", "shape"], ["reshaped" if ending else "y"]),
    ]
    if ending:
        nodes.append(helper.make_node(ending, ["reshaped"], ["y"], axis=len(dims) - 1))
    graph = helper.make_graph(
        nodes,
        "passthrough",
        [helper.make_tensor_value_info("x", dtype, dims)],
        [helper.make_tensor_value_info("y", dtype, dims if declared is None else declared)],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


_TRAINERS: dict[tuple[Any, ...], Trainer] = {}


def trainer_for(loss: losses.Loss, dims: tuple[str | int, ...]) -> Trainer:
    key = (repr(loss), dims)
    if key not in _TRAINERS:
        model = passthrough(list(dims), ending="LogSoftmax" if loss.kind == "ctc_loss" else None)
        _TRAINERS[key] = Trainer(model, loss=loss, optimizer=optimizers.SGD(lr=0.1), threads=1)
    return _TRAINERS[key]


def evaluate(subject: Trainer, x: np.ndarray, target: np.ndarray, **named: Any) -> tuple[Any, list[str]]:
    """The Trainer's loss (no update) and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = subject.evaluate(x, target=target, **named)
    return value, [str(item.message) for item in caught if issubclass(item.category, UserWarning)]


def decision_id(row: dict[str, Any]) -> str:
    return f"{row['kind']}-{row.get('case', '')}{row['input']}-{row['target']}-{row['dtype']}".replace(" ", "")


DECISIONS = [row for row in META["decisions"] if row["kind"] != "ctc_loss"]
CTC_DECISIONS = [row for row in META["decisions"] if row["kind"] == "ctc_loss"]
BATCH_DIMS = {2: ("batch", 3), 3: ("steps", "batch", 3)}
"""The model's declared input (and output) for a recorded prediction of that rank: time-major for 3."""


def more_axes(row: dict[str, Any]) -> bool:
    """A target with more axes than the prediction: torch broadcasts the loss to a larger shape; ortlstm refuses."""
    return len(row["target"]) > len(row["input"])


@pytest.mark.parametrize("row", DECISIONS, ids=[decision_id(row) for row in DECISIONS])
def test_a_target_of_another_shape_gets_torchs_decision_before_running(row: dict[str, Any]) -> None:
    probabilities = row["kind"] == "cross_entropy" and row["dtype"] == "float64"
    loss = losses.Loss(row["kind"], class_probabilities=True) if probabilities else losses.Loss(row["kind"])
    subject = trainer_for(loss, BATCH_DIMS[len(row["input"])])
    x, target = decision_arrays(row["kind"], row["input"], row["target"], row["dtype"])
    if row["outcome"] == "error" or more_axes(row):
        with pytest.raises(ValueError, match=r"evaluate\(\): loss target 'target': ") as raised:
            evaluate(subject, x, target)
        message = str(raised.value)
        assert f"got {row['dtype']} [{', '.join(map(str, row['target']))}]" in message
        if "Expected input batch_size" in row.get("message", ""):
            assert f"(torch: '{row['message']}'); pass one target per sample of the batch" in message
        if more_axes(row) and row["outcome"] != "error":
            assert "it has more axes than the prediction" in message
        return
    value, given = evaluate(subject, x, target)
    assert given == ([row["message"]] if row["outcome"] == "warning" else [])
    np.testing.assert_allclose(value, row["loss"], **FLOAT64)


def test_the_decision_table_covers_every_loss_that_reads_a_target() -> None:
    recorded = {row["kind"] for row in META["decisions"]}
    assert recorded == {kind for kind, entry in losses.LOSSES.items() if entry.needs_target}
    outcomes = {row["outcome"] for row in DECISIONS}
    assert outcomes == {"ok", "warning", "error"}


@pytest.mark.parametrize("row", CTC_DECISIONS, ids=[row["case"] for row in CTC_DECISIONS])
def test_ctc_labels_and_lengths_of_another_batch_are_refused_as_torch_refuses(row: dict[str, Any]) -> None:
    """The batch is axis 1 of the time-major prediction (T, N, C), as the model declares it."""
    subject = trainer_for(losses.Loss.ctc_loss(), ("steps", "batch", 5))
    x = np.random.default_rng(0).uniform(0.1, 0.9, row["input"])
    lengths = {
        "target": np.ones(row["target"], np.int64),
        "target_lengths": np.full(row["target_lengths"], 2),
        "input_lengths": np.full(row["input_lengths"], 6),
    }
    if row["outcome"] == "ok":
        assert np.isfinite(subject.evaluate(x, **lengths))
        return
    name = {"labels_of_another_batch": "target", "target_lengths_of_another_batch": "target_lengths"}
    with pytest.raises(ValueError, match=rf"{name.get(row['case'], 'input_lengths')}.*N=4"):
        subject.evaluate(x, **lengths)


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run as a user runs it, in a fresh Python (this folder on its path as argv[1])."""
    return subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).resolve().parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_the_readmes_loop_with_a_short_target_fails_by_name_and_onnxruntime_logs_nothing() -> None:
    """The reported case, run as a user runs it: a message naming the target, no red onnxruntime log line."""
    script = """
import numpy as np, sys
sys.path.insert(0, sys.argv[1])
from test_targets import passthrough
from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer
model = passthrough(["batch", 3])
x = np.zeros((32, 3))
for loss, target in [(losses.Loss.cross_entropy(), np.zeros(40, np.int64)), (losses.Loss.cross_entropy(),
        np.zeros(16, np.int64)), (losses.Loss.cross_entropy(), np.full((32, 3), 1 / 3)),
        (losses.Loss.mse_loss(), np.zeros((40, 3)))]:
    try:
        Trainer(model, loss=loss, optimizer=optimizers.SGD(lr=0.1)).step(x, target=target)
    except ValueError as error:
        print(error)
"""
    done = run_script(script)
    assert "onnxruntime" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stdout
    assert "(torch: 'Expected input batch_size (32) to match target batch_size (40).')" in lines[0]
    assert "(torch: 'Expected input batch_size (32) to match target batch_size (16).')" in lines[1]
    assert lines[2] == (
        "step(): loss target 'target': cross_entropy expects class indices int64 or int32 [32], got float64 [32, 3]; "
        "class probabilities need Loss.cross_entropy(class_probabilities=True)"
    )
    assert lines[3].startswith("step(): loss target 'target': mse_loss expects the prediction's shape [32, 3], got ")


def test_each_entry_point_checks_before_anything_runs() -> None:
    subject = Trainer(
        passthrough(["batch", 3]), loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1), threads=1
    )

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model ran")

    subject._engine.run = refuse  # type: ignore[method-assign]
    x = np.zeros((32, 3))
    for call in (subject.step, subject.accumulate, subject.evaluate):
        with pytest.raises(ValueError, match=r"match target batch_size \(16\)"):
            call(x, target=np.zeros(16, np.int64))
    assert subject.global_step == 0


def test_the_batch_is_found_by_inference_with_the_batchs_shapes_where_no_dim_name_says_it() -> None:
    """The declared output's dims name nothing of the input's ("rows"), and inference alone loses them."""
    model = passthrough(["batch", 3], declared=["rows", 3])
    subject = Trainer(model, loss=losses.Loss.nll_loss(), optimizer=optimizers.SGD(lr=0.1), threads=1)
    assert subject._feeds.value_type("y").shape[0] not in ("batch", "rows")  # type: ignore[union-attr]
    with pytest.raises(
        ValueError, match=r"\(torch: 'Expected input batch_size \(32\) to match target batch_size \(16\)"
    ):
        subject.step(np.zeros((32, 3)), target=np.zeros(16, np.int64))
    assert np.isfinite(subject.step(np.zeros((32, 3)), target=np.zeros(32, np.int64)))


def test_a_target_with_fewer_axes_broadcasts_as_torchs_does_and_the_gradient_follows() -> None:
    """A [3] target for a [4, 3] prediction is a [1, 3] one: the loss and its gradient are NumPy's broadcast."""
    subject = trainer_for(losses.Loss.mse_loss(reduction="sum"), ("batch", 3))
    x = np.arange(12.0).reshape(4, 3) / 7
    target = np.array([0.5, -1.0, 2.0])
    with pytest.warns(UserWarning, match=r"target size \(torch.Size\(\[3\]\)\) .* input size \(torch.Size\(\[4, 3\]\)"):
        subject.accumulate(x, target=target)
    np.testing.assert_allclose(subject.accumulated_gradients["w"], (2 * (x - target) * x).sum(axis=0), **FLOAT64)
    subject.zero_grad()


# ---- cross_entropy with class probabilities --------------------------------------------------------


def linear_classifier(dtype: str) -> onnx.ModelProto:
    """A linear classifier, ``logits = x @ W.T + b``, with W and b as recorded."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["logits"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("x", elem, ["batch", ARRAYS[f"{dtype}/x"].shape[1]])],
        [helper.make_tensor_value_info("logits", elem, ["batch", ARRAYS[f"{dtype}/weight"].shape[0]])],
        [numpy_helper.from_array(ARRAYS[f"{dtype}/{name}"], key) for name, key in (("weight", "W"), ("bias", "b"))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


PROBABILITY_CASES = {case["name"]: case for case in META["probabilities"]}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(PROBABILITY_CASES))
def test_class_probability_targets_train_with_torchs_loss_and_gradients(name: str, dtype: str) -> None:
    case = PROBABILITY_CASES[name]
    loss = losses.Loss.cross_entropy(class_probabilities=True, **case["kwargs"])
    subject = Trainer(linear_classifier(dtype), loss=loss, optimizer=optimizers.SGD(lr=1.0), threads=1)
    tolerance = FLOAT64 if dtype == "float64" else FLOAT32
    value = subject.accumulate(ARRAYS[f"{dtype}/x"], target=ARRAYS[f"{dtype}/target"])
    np.testing.assert_allclose(value, ARRAYS[f"{dtype}/{name}/loss"], **tolerance)
    gradients = subject.accumulated_gradients
    np.testing.assert_allclose(gradients["W"], ARRAYS[f"{dtype}/{name}/grad_weight"], **tolerance)
    np.testing.assert_allclose(gradients["b"], ARRAYS[f"{dtype}/{name}/grad_bias"], **tolerance)
    subject.zero_grad()
    before = subject.parameters["W"]
    subject.step(ARRAYS[f"{dtype}/x"], target=ARRAYS[f"{dtype}/target"])  # SGD, lr 1: W - grad
    np.testing.assert_allclose(subject.parameters["W"], before - ARRAYS[f"{dtype}/{name}/grad_weight"], **tolerance)


def test_class_probabilities_and_class_indices_are_each_refused_by_the_other_kind_of_trainer() -> None:
    x, probabilities = ARRAYS["float64/x"], ARRAYS["float64/target"]
    indices = Trainer(linear_classifier("float64"), loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=1.0))
    with pytest.raises(ValueError, match=r"^step\(\): loss target 'target'") as raised:
        indices.step(x, target=probabilities)
    assert str(raised.value) == (
        "step(): loss target 'target': cross_entropy expects class indices int64 or int32 [6], got float64 [6, 4]; "
        "class probabilities need Loss.cross_entropy(class_probabilities=True)"
    )
    soft = Trainer(
        linear_classifier("float64"),
        loss=losses.Loss.cross_entropy(class_probabilities=True),
        optimizer=optimizers.SGD(lr=1.0),
    )
    with pytest.raises(ValueError, match=r"^step\(\): loss target 'target'") as raised:
        soft.step(x, target=np.zeros(6, np.int64))
    assert str(raised.value) == (
        "step(): loss target 'target': cross_entropy(class_probabilities=True) expects class probabilities "
        "float64 [6, 4] (the prediction's type and shape), got int64 [6]; class indices need Loss.cross_entropy() "
        "(class_probabilities=False)"
    )
    assert soft.global_step == indices.global_step == 0


def test_a_probability_trainer_is_saved_and_rebuilt_with_its_target_kind(tmp_path: Path) -> None:
    model = linear_classifier("float64")
    subject = Trainer(model, loss=losses.Loss.cross_entropy(class_probabilities=True), optimizer=optimizers.SGD(lr=0.5))
    subject.step(ARRAYS["float64/x"], target=ARRAYS["float64/target"])
    resumed = Trainer.from_checkpoint(model, subject.save(tmp_path / "run.safetensors"))
    assert resumed.spec.loss.class_probabilities
    opened = Trainer.open(subject.write(tmp_path / "run"))
    for other in (resumed, opened):
        np.testing.assert_array_equal(other.parameters["W"], subject.parameters["W"])
        other.step(ARRAYS["float64/x"], target=ARRAYS["float64/target"])


# ---- fit: the same labels refused up front ----------------------------------------------------------


def fit(loss: losses.Loss, target: np.ndarray) -> Trainer:
    subject = Trainer(linear_classifier("float64"), loss=loss, optimizer=optimizers.SGD(lr=0.5), threads=1)
    data = {"x": ARRAYS["float64/x"], "target": target}
    fitting.fit(subject, data, model=linear_classifier("float64"), epochs=1, batch_size=3, log=lambda line: None)
    return subject


def test_fit_refuses_float_labels_for_class_indices_up_front_and_says_what_to_pass() -> None:
    labels = np.array([0.0, 1.0, 3.0, 2.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"^data: array 'target'") as raised:
        fit(losses.Loss.cross_entropy(), labels)
    assert str(raised.value) == (
        "data: array 'target' (cross_entropy's class indices) must be int64 or int32 [batch] (batch axis 0), got "
        "float64 [6]; pass it as array.astype(np.int64); class probabilities need "
        "Loss.cross_entropy(class_probabilities=True) (--loss-option class_probabilities=true)"
    )
    with pytest.raises(ValueError, match=r"^data: array 'target'") as raised:
        fit(losses.Loss.cross_entropy(), ARRAYS["float64/target"])
    assert str(raised.value) == (
        "data: array 'target' (cross_entropy's class indices) must be int64 or int32 [batch] (batch axis 0), got "
        "float64 [6, 4]; class probabilities need Loss.cross_entropy(class_probabilities=True) "
        "(--loss-option class_probabilities=true)"
    )
    with pytest.raises(ValueError, match=r"^data: array 'target'") as raised:
        fit(losses.Loss.cross_entropy(class_probabilities=True), labels.astype(np.int64))
    assert str(raised.value) == (
        "data: array 'target' (cross_entropy's class probabilities) must be float64 [batch, 4] (batch axis 0), got "
        "int64 [6]; class indices need Loss.cross_entropy() (class_probabilities=False) "
        "(--loss-option class_probabilities=false)"
    )


def test_fit_trains_on_class_probabilities_as_the_trainer_does() -> None:
    loss = losses.Loss.cross_entropy(class_probabilities=True, label_smoothing=0.1)
    fitted = fit(loss, ARRAYS["float64/target"])
    direct = Trainer(linear_classifier("float64"), loss=loss, optimizer=optimizers.SGD(lr=0.5), threads=1)
    assert fitted.global_step == 2
    assert not np.array_equal(fitted.parameters["W"], direct.parameters["W"])


# ---- distributed: the same checks before the loss weight's arithmetic ----------------------------------


def test_shards_with_a_broadcast_target_weigh_the_broadcast_elements() -> None:
    """A [1, 3] target on ragged shards of [7, 3]: the weighted shard gradients are the global batch's."""
    from ortlstm.distributed import loss_weight, shard

    subject = trainer_for(losses.Loss.mse_loss(), ("batch", 3))
    x = np.arange(21.0).reshape(7, 3) / 10
    target = np.array([[0.5, -1.0, 2.0]])
    with pytest.warns(UserWarning, match="Using a target size"):
        subject.accumulate(x, target=target)
    expected = subject.accumulated_gradients["w"]
    subject.zero_grad()
    total = np.zeros_like(expected)
    parts = [shard(len(x), rank, 2) for rank in range(2)]
    weights = [loss_weight(subject.spec.loss, target, len(x[part]), {}, x[part].shape) for part in parts]
    assert weights == [12.0, 9.0]  # rows * 3 each, not the target's 3 elements
    for part, weight in zip(parts, weights, strict=True):
        with pytest.warns(UserWarning, match="Using a target size"):
            subject.accumulate(x[part], target=target)
        total += subject.accumulated_gradients["w"] * weight / sum(weights)
        subject.zero_grad()
    np.testing.assert_allclose(total, expected, **FLOAT64)


def test_a_distributed_step_refuses_a_bad_target_by_name_before_weighing_it() -> None:
    """One rank (mpi4py's singleton): an out-of-range class index with class weights failed in NumPy indexing."""
    pytest.importorskip("mpi4py")
    script = """
import numpy as np, sys
sys.path.insert(0, sys.argv[1])
from test_targets import passthrough
from ortlstm.distributed import DistributedTrainer
from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer
loss = losses.Loss.cross_entropy(weight=[1.0, 2.0, 3.0])
subject = DistributedTrainer(Trainer(passthrough(["batch", 3]), loss=loss, optimizer=optimizers.SGD(lr=0.1), threads=1))
for target in (np.array([0, 1, 2, 5]), np.zeros(2, np.int64)):
    try:
        subject.step(np.zeros((4, 3)), target=target)
    except ValueError as error:
        print(error)
"""
    done = run_script(script)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    assert lines[0].startswith("loss target 'target': class index 5 is out of range for 3 classes")
    assert lines[1].startswith("step(): loss target 'target': cross_entropy expects class indices int64 [4]")
