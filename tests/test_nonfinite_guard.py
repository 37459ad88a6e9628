"""The Trainer's non-finite guard: an update from a NaN or inf loss or gradient is never kept.

A refused update leaves the parameters, every optimizer state slot, ``global_step`` and a stateful
trainer's carried LSTM state bitwise as they were; ``nonfinite="raise"`` (the default) raises
``NonFiniteStepError``, ``nonfinite="skip"`` counts the update and goes on, so that the next good
update is bitwise the one of a run that never saw the bad batch (the oracle: that run). Models are
the tiny classifier of test_trainer.py (float32, and the same in float64) and a model whose loss
stays finite while a gradient is NaN. Sessions use one thread, so runs are bitwise repeatable.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_trainer import CLASSES, batches, classifier, forward_classifier_with_zero_state

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.train_step import build_training_models
from ortlstm.training import NonFiniteStepError, Trainer

OPTIMIZERS = {
    "sgd_fused": optimizers.SGD(lr=0.05, momentum=0.9),
    "sgd_onnx": optimizers.SGD(lr=0.05, momentum=0.9, implementation="onnx"),
    "adam_fused": optimizers.Adam(lr=0.05),
    "adam_onnx": optimizers.Adam(lr=0.05, implementation="onnx"),
    "adamw_fused": optimizers.AdamW(lr=0.05),
    "adamw_onnx": optimizers.AdamW(lr=0.05, implementation="onnx"),
}
DTYPES = {"float32": np.float32, "float64": np.float64}
# What makes a batch bad, and the loss that sees it.
BAD_KINDS = ("nan_input", "inf_target", "overflowing_loss")
REFUSED = r"update 2 refused, not finite: the loss is {loss}; .*\. The parameters, the optimizer state and "
SKIP_HINT = r"To skip such updates and count them in trainer\.skipped_steps instead, pass Trainer\(\.\.\., "
SKIP_HINT += r"nonfinite='skip'\) or set trainer\.nonfinite = 'skip'$"


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float32 initializer, Constant, input and output in float64."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float64), init.name))
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT:
                attribute.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attribute.t).astype(np.float64)))
    for value in [*graph.input, *graph.output]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    return result


def loss_for(kind: str) -> losses.Loss:
    return losses.Loss.cross_entropy() if kind == "nan_input" else losses.Loss.mse_loss()


def good_batches(kind: str, dtype: type, count: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """Class labels for cross-entropy, one-hot float targets for MSE."""
    result = []
    for x, y in batches(count, seed=seed):
        target = y if kind == "nan_input" else np.eye(CLASSES, dtype=dtype)[y]
        result.append((x.astype(dtype), target))
    return result


def bad_batch(kind: str, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """One NaN input element; one inf target element; a target so far off that the loss overflows."""
    ((x, target),) = good_batches(kind, dtype, 1, seed=7)
    x, target = x.copy(), target.copy()
    if kind == "nan_input":
        x[2, 1, 3] = np.nan
    elif kind == "inf_target":
        target[1, 0] = np.inf
    else:
        target[3, 2] = 1e30 if dtype == np.float32 else 1e200  # squared: past the type's range
    return x, target


def step_bad(trainer: Trainer, kind: str = "nan_input", dtype: type = np.float32) -> float:
    x, target = bad_batch(kind, dtype)
    return trainer.step(x, target=target)


def make_trainer(
    kind: str = "nan_input",
    dtype: type = np.float32,
    optimizer: optimizers.Optimizer = OPTIMIZERS["adamw_fused"],
    model: onnx.ModelProto | None = None,
    **options: object,
) -> Trainer:
    model = classifier() if model is None else model
    model = as_float64(model) if dtype == np.float64 else model
    return Trainer(model, loss=loss_for(kind), optimizer=optimizer, threads=1, **options)  # type: ignore[arg-type]


def snapshot(trainer: Trainer) -> dict[str, object]:
    return {
        "parameters": trainer.parameters,
        "optimizer_state": trainer.optimizer_state,
        "global_step": trainer.global_step,
        "carried_state": trainer.carried_state,
    }


def assert_bitwise_equal(actual: dict[str, object], expected: dict[str, object]) -> None:
    assert actual["global_step"] == expected["global_step"]
    for field in ("parameters", "carried_state"):
        got, want = actual[field], expected[field]
        assert set(got) == set(want), field  # type: ignore[arg-type]
        for name, value in want.items():  # type: ignore[attr-defined]
            assert value.tobytes() == got[name].tobytes(), f"{field} {name} differs"  # type: ignore[index]
    slots = 0
    for name, state in expected["optimizer_state"].items():  # type: ignore[attr-defined]
        for slot, value in state.items():
            got = actual["optimizer_state"][name][slot]  # type: ignore[index]
            assert value.tobytes() == got.tobytes(), f"optimizer state {name}.{slot} differs"
            slots += 1
    assert slots == sum(len(state) for state in actual["optimizer_state"].values())  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# step(): refused bitwise, raise or skip


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_step_raises_and_changes_nothing(kind: str, optimizer: optimizers.Optimizer, dtype: type) -> None:
    subject = make_trainer(kind, dtype, optimizer)
    ((x, target),) = good_batches(kind, dtype, 1)
    subject.step(x, target=target)  # moments and momentum buffers are not zeros any more
    before = snapshot(subject)
    loss = "nan" if kind == "nan_input" else "inf"  # (x - inf)^2 is inf
    with pytest.raises(NonFiniteStepError, match=r"^step\(\): " + REFUSED.format(loss=loss)) as error:
        step_bad(subject, kind, dtype)
    assert_bitwise_equal(snapshot(subject), before)
    assert error.value.step == 2
    assert isinstance(error.value, FloatingPointError)
    assert str(error.value.loss) == loss
    assert subject.skipped_steps == 0


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_skipped_step_is_a_run_without_the_bad_batch(kind: str, optimizer: optimizers.Optimizer, dtype: type) -> None:
    (x1, y1), (x2, y2) = good_batches(kind, dtype, 2)
    reference = make_trainer(kind, dtype, optimizer)
    reference.step(x1, target=y1)
    expected_loss = reference.step(x2, target=y2)

    subject = make_trainer(kind, dtype, optimizer, nonfinite="skip")
    subject.step(x1, target=y1)
    skipped_loss = step_bad(subject, kind, dtype)
    assert not math.isfinite(skipped_loss)
    assert (subject.skipped_steps, subject.global_step) == (1, 1)
    assert subject.step(x2, target=y2) == expected_loss
    assert_bitwise_equal(snapshot(subject), snapshot(reference))
    assert (subject.skipped_steps, subject.global_step) == (1, 2)


def test_message_names_the_gradients_and_the_norm() -> None:
    subject = make_trainer()
    ((x, y),) = good_batches("nan_input", np.float32, 1)
    subject.step(x, target=y)
    bad_x, _ = bad_batch("nan_input", np.float32)
    with pytest.raises(NonFiniteStepError) as error:
        subject.step(bad_x, target=y)
    message = str(error.value)
    params = list(subject.signature.params)
    assert message.startswith(
        "step(): update 2 refused, not finite: the loss is nan; the gradient norm is nan; "
        f"the gradients of {params} hold NaN or inf. The parameters, the optimizer state and global_step (1) "
        "are unchanged. "
    ), message
    assert error.value.nonfinite_grads == tuple(params)
    assert math.isnan(error.value.grad_norm)  # type: ignore[arg-type]
    assert str(pickle.loads(pickle.dumps(error.value))) == message  # e.g. raised in a worker process


def test_nonfinite_mode_is_checked_and_settable() -> None:
    with pytest.raises(ValueError, match=r"nonfinite: expected one of 'raise', 'skip', got 'ignore'"):
        make_trainer(nonfinite="ignore")
    subject = make_trainer()
    assert subject.nonfinite == "raise"
    subject.nonfinite = "skip"
    step_bad(subject)
    assert (subject.skipped_steps, subject.global_step) == (1, 0)
    with pytest.raises(ValueError, match=r"got 'Skip'"):
        subject.nonfinite = "Skip"


# ---------------------------------------------------------------------------------------------
# a finite loss with a NaN gradient: only the gradients' check can see it


def sqrt_model(dtype: type = np.float64) -> onnx.ModelProto:
    """``y = sqrt(x * w) + b``: where a row of x is 0, d/dw is 0 * inf = NaN, and the loss is finite."""
    elem = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "w"], ["scaled"]),
            helper.make_node("Sqrt", ["scaled"], ["root"]),
            helper.make_node("Add", ["root", "b"], ["y"]),
        ],
        "sqrt_model",
        [helper.make_tensor_value_info("x", elem, ["batch", 3])],
        [helper.make_tensor_value_info("y", elem, ["batch", 3])],
        [
            numpy_helper.from_array(np.array([1.0, 2.0, 3.0], dtype), "w"),
            numpy_helper.from_array(np.array([0.1, 0.2, 0.3], dtype), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def sqrt_batch(zero: bool, seed: int = 0, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (np.abs(rng.standard_normal((4, 3))) + 0.5).astype(dtype)
    if zero:
        x[2, 1] = 0.0  # w's gradient: NaN in element 1 only, not the first (ReduceMax skips such a NaN)
    return x, rng.standard_normal((4, 3)).astype(dtype)


def sqrt_trainer(**options: object) -> Trainer:
    options.setdefault("optimizer", optimizers.Adam(lr=0.1))
    return Trainer(sqrt_model(), loss=losses.Loss.mse_loss(), threads=1, **options)  # type: ignore[arg-type]


CLIPPINGS: dict[str, dict[str, float]] = {
    "no_clip": {},
    "clip_l2": {"clip_grad_norm": 1.0, "clip_norm_type": 2.0},
    "clip_max": {"clip_grad_norm": 1.0, "clip_norm_type": math.inf},
    "clip_l1": {"clip_grad_norm": 1.0, "clip_norm_type": 1.0},
    # clip_grad_value_ clamps the finite elements; the check reads the gradients before it.
    "clip_value": {"clip_grad_value": 0.01},
}
APPLY_CLIPPINGS = ("no_clip", "clip_l2", "clip_max", "clip_value")


@pytest.mark.parametrize("clip", CLIPPINGS.values(), ids=CLIPPINGS.keys())
def test_finite_loss_with_a_nan_gradient_is_refused(clip: dict[str, float]) -> None:
    """The max norm (clip_norm_type=inf) cannot tell: onnxruntime's ReduceMax skips a later NaN."""
    subject = sqrt_trainer(**clip)
    subject.step(*sqrt_batch(False)[:1], target=sqrt_batch(False)[1])
    before = snapshot(subject)
    x, target = sqrt_batch(True)
    assert math.isfinite(subject.evaluate(x, target=target))
    with pytest.raises(NonFiniteStepError, match=r"the gradients of \['w'\] hold NaN or inf\.") as error:
        subject.step(x, target=target)
    assert_bitwise_equal(snapshot(subject), before)
    assert math.isfinite(error.value.loss)  # type: ignore[arg-type]
    assert error.value.nonfinite_grads == ("w",)
    if math.isinf(clip.get("clip_norm_type", 2.0)):
        assert math.isfinite(subject.last_grad_norm)  # type: ignore[arg-type]  # the pitfall itself


def mixed_model() -> onnx.ModelProto:
    """``y = x * w32 + float(sqrt(double(x) * w64))``: float32 and float64 parameters, one check each."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "w32"], ["linear"]),
            helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE),
            helper.make_node("Mul", ["x64", "w64"], ["scaled"]),
            helper.make_node("Sqrt", ["scaled"], ["root"]),
            helper.make_node("Cast", ["root"], ["root32"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["linear", "root32"], ["y"]),
        ],
        "mixed_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [
            numpy_helper.from_array(np.array([0.5, 1.0, 1.5], np.float32), "w32"),
            numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float64), "w64"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("implementation", ["ortlstm", "onnx"])
def test_nan_gradient_of_the_second_parameter_type_is_refused(implementation: str) -> None:
    """Gradients of two types are summed per type; the float64 one's check, second, counts too."""
    optimizer = optimizers.Adam(lr=0.1, implementation=implementation)
    subject = Trainer(mixed_model(), loss=losses.Loss.mse_loss(), optimizer=optimizer, threads=1)
    x, target = sqrt_batch(False, dtype=np.float32)
    subject.step(x, target=target)
    before = snapshot(subject)
    x, target = sqrt_batch(True, dtype=np.float32)
    with pytest.raises(NonFiniteStepError, match=r"the gradients of \['w64'\] hold NaN or inf\.") as error:
        subject.step(x, target=target)
    assert math.isfinite(error.value.loss)  # type: ignore[arg-type]
    assert_bitwise_equal(snapshot(subject), before)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_infinite_loss_with_finite_gradients_is_refused(reduction: str) -> None:
    """l1_loss against an inf target: the loss is inf, its gradient sign(y - target) finite."""
    subject = Trainer(sqrt_model(), loss=losses.Loss.l1_loss(reduction), optimizer=optimizers.SGD(lr=0.1), threads=1)
    x, target = sqrt_batch(False)
    subject.step(x, target=target)
    before = snapshot(subject)
    target[1, 2] = np.inf
    loss = "inf" if reduction == "mean" else "not finite in 1 of 12 elements"
    with pytest.raises(
        NonFiniteStepError, match=rf"not finite: the loss is {loss}; the gradient norm is [0-9.]+\. "
    ) as error:
        subject.step(x, target=target)
    assert error.value.nonfinite_grads == ()
    assert_bitwise_equal(snapshot(subject), before)


def test_the_models_output_all_finite_and_can_be_built_without_it() -> None:
    options = {"loss": losses.Loss.mse_loss(), "optimizer": optimizers.Adam(lr=0.1)}
    built = build_training_models(sqrt_model(), **options)  # type: ignore[arg-type]
    name = built.signature.all_finite
    assert name is not None
    for model in (built.train_step, built.apply):
        (output,) = [value for value in model.graph.output if value.name == name]
        assert output.type.tensor_type.elem_type == TensorProto.BOOL
    assert name not in {value.name for value in built.gradients.graph.output}
    plain = build_training_models(sqrt_model(), nonfinite_check=False, **options)  # type: ignore[arg-type]
    assert plain.signature.all_finite is None
    assert len(plain.train_step.graph.output) == len(built.train_step.graph.output) - 1


# ---------------------------------------------------------------------------------------------
# accumulate() / apply()


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_accumulated_bad_batch_refuses_apply(optimizer: optimizers.Optimizer, dtype: type) -> None:
    kind = "nan_input"
    (x1, y1), (x2, y2), (x3, y3) = good_batches(kind, dtype, 3)
    subject = make_trainer(kind, dtype, optimizer)
    subject.accumulate(x1, target=y1)
    subject.apply()
    before = snapshot(subject)
    subject.accumulate(x2, target=y2)
    subject.accumulate(*bad_batch(kind, dtype)[:1], target=bad_batch(kind, dtype)[1])
    with pytest.raises(
        NonFiniteStepError,
        match=r"^apply\(\): update 2 refused, not finite: the loss of accumulated batch 2 of 2 is nan; .* are "
        r"unchanged; the gradients of the 2 accumulated batch\(es\) are discarded\. " + SKIP_HINT,
    ):
        subject.apply()
    assert_bitwise_equal(snapshot(subject), before)
    with pytest.raises(RuntimeError, match=r"apply\(\): no gradients accumulated"):
        subject.apply()

    reference = make_trainer(kind, dtype, optimizer)
    skipping = make_trainer(kind, dtype, optimizer, nonfinite="skip")
    for run in (reference, skipping):
        run.accumulate(x1, target=y1)
        run.apply()
    skipping.accumulate(x2, target=y2)
    skipping.accumulate(*bad_batch(kind, dtype)[:1], target=bad_batch(kind, dtype)[1])
    skipping.apply()
    assert (skipping.skipped_steps, skipping.global_step) == (1, 1)
    for run in (reference, skipping):
        run.accumulate(x3, target=y3)
        run.apply()
    assert_bitwise_equal(snapshot(skipping), snapshot(reference))


@pytest.mark.parametrize("clip", [CLIPPINGS[key] for key in APPLY_CLIPPINGS], ids=APPLY_CLIPPINGS)
def test_apply_refuses_a_nan_gradient_under_finite_losses(clip: dict[str, float]) -> None:
    """The apply model's own check: every accumulated loss is finite, a summed gradient is not."""
    subject = sqrt_trainer(**clip)
    subject.accumulate(*sqrt_batch(False)[:1], target=sqrt_batch(False)[1])
    subject.apply()
    before = snapshot(subject)
    subject.accumulate(*sqrt_batch(False, seed=1)[:1], target=sqrt_batch(False, seed=1)[1])
    loss = subject.accumulate(*sqrt_batch(True)[:1], target=sqrt_batch(True)[1])
    assert math.isfinite(loss)
    with pytest.raises(
        NonFiniteStepError,
        match=r"^apply\(\): update 2 refused, not finite: the gradient norm is [0-9.na]+; "
        r"the gradients of \['w'\] hold",
    ):
        subject.apply()
    assert_bitwise_equal(snapshot(subject), before)


# ---------------------------------------------------------------------------------------------
# stateful: the carried LSTM state is not carried from a refused update


@pytest.mark.parametrize("optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_stateful_refused_step_keeps_the_carried_state(optimizer: optimizers.Optimizer) -> None:
    model = forward_classifier_with_zero_state()
    (x1, y1), (x2, y2) = good_batches("nan_input", np.float32, 2)
    bad_x, _ = bad_batch("nan_input", np.float32)
    subject = make_trainer(model=model, optimizer=optimizer, stateful=True)
    subject.step(x1, target=y1)
    before = snapshot(subject)
    assert before["carried_state"]
    with pytest.raises(
        NonFiniteStepError, match=r"The parameters, the optimizer state, the carried LSTM/GRU/RNN state and"
    ):
        subject.step(bad_x, target=y2)
    assert_bitwise_equal(snapshot(subject), before)

    reference = make_trainer(model=model, optimizer=optimizer, stateful=True)
    skipping = make_trainer(model=model, optimizer=optimizer, stateful=True, nonfinite="skip")
    reference.step(x1, target=y1)
    reference.step(x2, target=y2)
    skipping.step(x1, target=y1)
    skipping.step(bad_x, target=y2)
    skipping.step(x2, target=y2)
    assert_bitwise_equal(snapshot(skipping), snapshot(reference))


def test_stateful_refused_apply_restores_the_state_before_its_micro_batches() -> None:
    model = forward_classifier_with_zero_state()
    (x1, y1), (x2, y2), (x3, y3) = good_batches("nan_input", np.float32, 3)
    bad_x, _ = bad_batch("nan_input", np.float32)
    reference = make_trainer(model=model, stateful=True)
    skipping = make_trainer(model=model, stateful=True, nonfinite="skip")
    for run in (reference, skipping):
        run.accumulate(x1, target=y1)
        run.apply()
    before = snapshot(skipping)
    skipping.accumulate(x2, target=y2)  # carries a good state on to the bad micro-batch
    skipping.accumulate(bad_x, target=y2)
    skipping.apply()
    assert_bitwise_equal(snapshot(skipping), before)
    for run in (reference, skipping):
        run.accumulate(x3, target=y3)
        run.apply()
    assert_bitwise_equal(snapshot(skipping), snapshot(reference))


# ---------------------------------------------------------------------------------------------
# checkpoints and training directories


def test_save_after_a_refused_step_writes_the_good_state(tmp_path: Path) -> None:
    (x1, y1), (x2, y2) = good_batches("nan_input", np.float32, 2)
    subject = make_trainer()
    subject.step(x1, target=y1)
    with pytest.raises(NonFiniteStepError):
        step_bad(subject)
    path = subject.save(tmp_path / "run.safetensors")
    reference = make_trainer()
    reference.step(x1, target=y1)
    resumed = Trainer.from_checkpoint(classifier(), path, threads=1)
    assert_bitwise_equal(snapshot(resumed), snapshot(reference))
    assert resumed.step(x2, target=y2) == reference.step(x2, target=y2)

    subject.accumulate(*bad_batch("nan_input", np.float32)[:1], target=bad_batch("nan_input", np.float32)[1])
    with pytest.raises(NonFiniteStepError):
        subject.apply()
    subject.save(tmp_path / "after_apply.safetensors")  # nothing is left accumulated


def test_skipped_steps_survive_save_and_load(tmp_path: Path) -> None:
    subject = make_trainer(nonfinite="skip")
    ((x, y),) = good_batches("nan_input", np.float32, 1)
    subject.step(x, target=y)
    step_bad(subject)
    step_bad(subject)
    resumed = Trainer.from_checkpoint(classifier(), subject.save(tmp_path / "run.safetensors"), threads=1)
    assert (resumed.skipped_steps, resumed.global_step, resumed.nonfinite) == (2, 1, "raise")
    opened = Trainer.open(subject.write(tmp_path / "directory"), threads=1, nonfinite="skip")
    assert (opened.skipped_steps, opened.nonfinite) == (2, "skip")


def test_directory_written_before_the_check_opens_and_guards_the_loss(tmp_path: Path) -> None:
    """Its models lack ``all_finite`` and its manifest the field: the loss is still checked."""
    subject = make_trainer()
    ((x, y),) = good_batches("nan_input", np.float32, 1)
    subject.step(x, target=y)
    directory = subject.write(tmp_path / "old")
    old = build_training_models(
        classifier(), loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(lr=0.05), nonfinite_check=False
    )
    for kind in ("train_step", "apply"):
        onnx.save(getattr(old, kind), str(directory / f"{kind}.onnx"))
    manifest = json.loads((directory / "training.json").read_text())
    del manifest["signature"]["all_finite"]
    (directory / "training.json").write_text(json.dumps(manifest))

    opened = Trainer.open(directory, threads=1)
    assert opened.signature.all_finite is None
    before = snapshot(opened)
    with pytest.raises(NonFiniteStepError, match=r"^step\(\): update 2 refused, not finite: the loss is nan"):
        step_bad(opened)
    assert_bitwise_equal(snapshot(opened), before)
    assert opened.step(x, target=y) == subject.step(x, target=y)
    assert_bitwise_equal(snapshot(opened), snapshot(subject))
