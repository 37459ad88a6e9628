"""The Trainer (``ortlstm.training``): steps, schedules, accumulation, checkpoints and export.

Models are tiny: a bidirectional LSTM classifier built with onnx.helper (its head weight in a
``Constant`` node, as spox and paddle2onnx write weights) and the torch exports recorded in
tests/recordings/train_step. Nothing here imports torch. Sessions use one thread, so runs are
bitwise repeatable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_train_step_parity import RECORDINGS, load, loss_of, optimizer_of

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.train_step import build_training_models
from ortlstm.ops import schema, session_options
from ortlstm.training import Trainer, export_directory, with_carried_state

SEQ_LENGTH, INPUT_SIZE, HIDDEN_SIZE, CLASSES = 3, 4, 5, 3
FLOAT32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def classifier(seed: int = 0, direction: str = "bidirectional") -> onnx.ModelProto:
    """Pixels [batch, T, I] -> Transpose -> bidirectional LSTM -> Y_h -> Flatten -> Gemm -> logits.

    The head weight is a ``Constant`` node (training lifts it to an initializer; export must put
    the trained value back into the node).
    """
    rng = np.random.default_rng(seed)
    bound = 1 / np.sqrt(HIDDEN_SIZE)
    directions = 2 if direction == "bidirectional" else 1
    weights = {
        "lstm.W": rng.uniform(-bound, bound, (directions, 4 * HIDDEN_SIZE, INPUT_SIZE)),
        "lstm.R": rng.uniform(-bound, bound, (directions, 4 * HIDDEN_SIZE, HIDDEN_SIZE)),
        "lstm.B": rng.uniform(-bound, bound, (directions, 8 * HIDDEN_SIZE)),
        "head.bias": rng.uniform(-bound, bound, (CLASSES,)),
    }
    head_weight = rng.uniform(-bound, bound, (CLASSES, directions * HIDDEN_SIZE)).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["head.weight"], value=numpy_helper.from_array(head_weight)),
        helper.make_node("Transpose", ["pixels"], ["sequence"], perm=[1, 0, 2]),
        helper.make_node(
            "LSTM",
            ["sequence", "lstm.W", "lstm.R", "lstm.B"],
            ["", "h_n"],
            hidden_size=HIDDEN_SIZE,
            direction=direction,
        ),
        helper.make_node("Transpose", ["h_n"], ["h_batch"], perm=[1, 0, 2]),
        helper.make_node("Flatten", ["h_batch"], ["features"], axis=1),
        helper.make_node("Gemm", ["features", "head.weight", "head.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", "steps", INPUT_SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def batches(count: int, size: int = 6, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((size, SEQ_LENGTH, INPUT_SIZE)).astype(np.float32),
            rng.integers(0, CLASSES, size).astype(np.int64),
        )
        for _ in range(count)
    ]


def trainer(model: onnx.ModelProto | None = None, **options: object) -> Trainer:
    options.setdefault("loss", losses.Loss.cross_entropy())
    options.setdefault("optimizer", optimizers.AdamW(lr=0.05))
    return Trainer(classifier() if model is None else model, threads=1, **options)  # type: ignore[arg-type]


def assert_same_state(a: Trainer, b: Trainer) -> None:
    assert a.global_step == b.global_step
    for name, value in a.parameters.items():
        assert np.array_equal(value, b.parameters[name]), f"{name} differs"
    for name, slots in a.optimizer_state.items():
        for slot, value in slots.items():
            assert np.array_equal(value, b.optimizer_state[name][slot]), f"{name}.{slot} differs"


def schedule(done: int) -> float:
    return 0.05 * 0.8**done


# ---------------------------------------------------------------------------------------------
# steps


def test_steps_match_the_train_step_run_with_numpy_feeds() -> None:
    """IOBinding with alternating buffers computes bitwise what ``session.run`` does."""
    data = batches(4)
    subject = trainer()
    losses_seen = [subject.step(x, target=y) for x, y in data]

    built = build_training_models(classifier(), loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(lr=0.05))
    signature = built.signature
    session = ort.InferenceSession(
        built.train_step.SerializeToString(),
        session_options(intra_op_num_threads=1),
        providers=["CPUExecutionProvider"],
    )
    values = {**built.initial_params, **built.initial_state}
    names = list(signature.params) + [signature.state[p][s] for p in signature.params for s in signature.state[p]]
    outputs = list(signature.new_params) + [
        signature.new_state[p][s] for p in signature.params for s in signature.state[p]
    ]
    for step, (x, y) in enumerate(data):
        feeds = {"pixels": x, signature.target: y, signature.lr: np.asarray(0.05), **values}
        feeds[signature.step] = np.asarray(step + 1, dtype=np.int64)
        loss, *new = session.run([signature.loss, *outputs], feeds)
        assert float(loss) == losses_seen[step]
        values = dict(zip(names, new, strict=True))
    for name, value in subject.parameters.items():
        assert np.array_equal(value, values[name]), name
        assert not np.array_equal(value, built.initial_params[name]), f"{name} did not move"


def test_step_returns_extra_outputs_and_evaluate_changes_nothing() -> None:
    subject = trainer(extra_outputs=["logits"])
    (x, y), (x_eval, y_eval) = batches(2)
    loss, logits = subject.step(x, target=y)
    assert isinstance(loss, float)
    assert logits.shape == (len(x), CLASSES)
    before = subject.parameters
    eval_loss, eval_logits = subject.evaluate(x_eval, target=y_eval)
    assert subject.evaluate(pixels=x_eval, target=y_eval, outputs=[]) == eval_loss
    assert eval_logits.shape == (len(x_eval), CLASSES)
    assert subject.global_step == 1
    for name, value in subject.parameters.items():
        assert np.array_equal(value, before[name])


def test_int32_labels_are_taken_as_int64() -> None:
    ((x, y),) = batches(1)
    assert trainer().step(x, target=y.astype(np.int32)) == trainer().step(x, target=y)


# ---------------------------------------------------------------------------------------------
# learning-rate schedule


def test_schedule_gives_the_lr_of_each_update_as_torch_counts() -> None:
    """schedule(n) serves the update after n updates: the same as passing those lrs by hand."""
    data = batches(4)
    scheduled = trainer(optimizer=optimizers.SGD(lr=1.0), lr=schedule)
    by_hand = trainer(optimizer=optimizers.SGD(lr=1.0))
    assert scheduled.learning_rate() == schedule(0)
    for step, (x, y) in enumerate(data):
        scheduled.step(x, target=y)
        by_hand.step(x, target=y, lr=0.05 * 0.8**step)
    assert scheduled.learning_rate(1) == schedule(0)
    assert scheduled.learning_rate() == schedule(4)
    assert_same_state(scheduled, by_hand)
    constant = trainer(optimizer=optimizers.SGD(lr=1.0))
    for x, y in data:
        constant.step(x, target=y)
    assert not np.array_equal(constant.parameters["lstm.W"], scheduled.parameters["lstm.W"])


def test_each_update_reads_its_own_lr() -> None:
    """The two alternating update bindings read lr and step where each update writes them.

    The third step runs the first step's binding again: with lr 0 it must change nothing, whatever
    lr that binding saw when it was made.
    """
    ((x, y),) = batches(1)
    sgd = trainer(optimizer=optimizers.SGD(lr=1.0))
    sgd.step(x, target=y, lr=0.5)
    sgd.step(x, target=y, lr=0.0)
    before = {name: value.copy() for name, value in sgd.parameters.items()}
    sgd.step(x, target=y, lr=0.0)
    for name, value in sgd.parameters.items():
        assert np.array_equal(value, before[name]), name


@pytest.mark.parametrize("path", [path for path in RECORDINGS if "unoptimized" in path.stem][:1], ids=lambda p: p.stem)
def test_torch_schedule_replayed_by_the_trainer(path: Path) -> None:
    """A recorded torch run (LambdaLR-style schedule) replayed with ``lr=callable`` matches torch."""
    recording = load(path)
    config = recording.config
    subject = Trainer(
        recording.model,
        loss=loss_of(config),
        optimizer=optimizer_of(config),
        lr=lambda done: config["lr_schedule"][done],
        requires_grad=config["trainable"],
        target=config["target"],
        threads=1,
    )
    for step in range(config["steps"]):
        batch = recording.batch(step)
        subject.step(**{name: batch[name] for name in config["model_inputs"]}, target=batch[config["target"]])
    for name, value in subject.parameters.items():
        np.testing.assert_allclose(value, recording.arrays[f"param/{name}"][-1], rtol=1e-4, atol=2e-5, err_msg=name)


# ---------------------------------------------------------------------------------------------
# gradient accumulation


def test_accumulated_sum_loss_equals_one_step_on_the_whole_batch() -> None:
    """Summed gradients of micro-batches (like k backward() calls) = the gradient of the sum."""
    data = batches(3, size=4)
    whole_x = np.concatenate([x for x, _ in data])
    whole_y = np.concatenate([y for _, y in data])
    options = {"loss": losses.Loss.cross_entropy(reduction="sum"), "optimizer": optimizers.SGD(lr=0.01, momentum=0.9)}
    accumulated, whole = trainer(**options), trainer(**options)
    for _ in range(2):
        micro_losses = [accumulated.accumulate(x, target=y) for x, y in data]
        accumulated.apply()
        whole_loss = whole.step(whole_x, target=whole_y)
        assert sum(micro_losses) == pytest.approx(whole_loss, rel=1e-5)
    assert accumulated.global_step == whole.global_step == 2
    for name, value in accumulated.parameters.items():
        np.testing.assert_allclose(value, whole.parameters[name], **FLOAT32_TOLERANCE, err_msg=name)


def test_accumulated_mean_loss_is_k_times_the_whole_batch_gradient() -> None:
    """With a mean loss over k equal micro-batches, SGD at lr equals the whole batch at k * lr."""
    data = batches(2, size=5)
    accumulated = trainer(optimizer=optimizers.SGD(lr=0.1))
    whole = trainer(optimizer=optimizers.SGD(lr=0.2))
    for x, y in data:
        accumulated.accumulate(x, target=y)
    accumulated.apply()
    whole.step(np.concatenate([x for x, _ in data]), target=np.concatenate([y for _, y in data]))
    for name, value in accumulated.parameters.items():
        np.testing.assert_allclose(value, whole.parameters[name], **FLOAT32_TOLERANCE, err_msg=name)


def test_accumulation_over_one_batch_is_a_step_bitwise() -> None:
    data = batches(3)
    stepped, accumulated = trainer(), trainer()
    for x, y in data:
        stepped.step(x, target=y)
        accumulated.accumulate(x, target=y)
        accumulated.apply()
    assert_same_state(stepped, accumulated)


def test_apply_of_given_gradients_is_apply_of_the_accumulated_ones_bitwise() -> None:
    """The seam of a data-parallel trainer: read the accumulated gradients, apply (reduced) ones."""
    data = batches(2)
    accumulated, given = trainer(), trainer()
    for x, y in data:
        accumulated.accumulate(x, target=y)
        accumulated.apply()
        given.accumulate(x, target=y)
        gradients = {name: value.copy() for name, value in given.accumulated_gradients.items()}
        given.zero_grad()
        given.apply(gradients=gradients)
        assert given.accumulated_gradients == {}
    assert_same_state(accumulated, given)


def test_apply_of_wrong_gradients_is_refused() -> None:
    subject = trainer()
    gradients = {name: np.zeros_like(value) for name, value in subject.parameters.items()}
    with pytest.raises(ValueError, match=r"gradient of 'lstm.B' must be float32 \[2, 40\] .*, got float64 \[2, 40\]"):
        subject.apply(gradients={**gradients, "lstm.B": np.zeros((2, 40), np.float64)})
    del gradients["lstm.W"]
    with pytest.raises(ValueError, match=r"apply\(gradients=...\): the gradient of 'lstm.W' must be .*, got nothing"):
        subject.apply(gradients=gradients)
    assert subject.global_step == 0


def test_parameters_and_state_are_copies_that_later_updates_leave_alone() -> None:
    """Two updates later the buffer a step read is written again; what was returned must not change."""
    data = batches(3)
    subject = trainer()
    subject.step(*data[0][:1], target=data[0][1])
    parameters, state = subject.parameters, subject.optimizer_state
    kept = {name: value.copy() for name, value in parameters.items()}
    kept_state = {name: {slot: value.copy() for slot, value in slots.items()} for name, slots in state.items()}
    for x, y in data[1:]:
        subject.step(x, target=y)
    for name, value in parameters.items():
        assert np.array_equal(value, kept[name]), name
        for slot, slot_value in state[name].items():
            assert np.array_equal(slot_value, kept_state[name][slot]), f"{name}.{slot}"


def test_accumulation_misuse_is_refused(tmp_path: Path) -> None:
    subject = trainer()
    ((x, y),) = batches(1)
    with pytest.raises(RuntimeError, match=r"apply\(\): no gradients accumulated; call accumulate"):
        subject.apply()
    subject.accumulate(x, target=y)
    with pytest.raises(RuntimeError, match=r"step\(\): gradients of 1 batch\(es\) are accumulated; call apply\(\)"):
        subject.step(x, target=y)
    with pytest.raises(RuntimeError, match=r"save\(\): accumulated gradients are not applied"):
        subject.save(tmp_path / "state.safetensors")
    subject.zero_grad()
    subject.step(x, target=y)


# ---------------------------------------------------------------------------------------------
# checkpoints


def test_resume_from_checkpoint_is_bitwise_an_uninterrupted_run(tmp_path: Path) -> None:
    data = batches(6)
    uninterrupted = trainer(lr=schedule)
    for x, y in data:
        uninterrupted.step(x, target=y)

    first = trainer(lr=schedule)
    for x, y in data[:3]:
        first.step(x, target=y)
    checkpoint = first.save(tmp_path / "run.safetensors")

    resumed = Trainer.from_checkpoint(classifier(), checkpoint, lr=schedule, threads=1)
    reloaded = trainer(lr=schedule)
    reloaded.step(*data[0][:1], target=data[0][1])  # state in its buffers already: load overwrites it
    reloaded.load(checkpoint)
    for subject in (resumed, reloaded):
        assert subject.global_step == 3
        for x, y in data[3:]:
            subject.step(x, target=y)
        assert_same_state(uninterrupted, subject)


def test_checkpoint_holds_parameters_state_step_and_spec(tmp_path: Path) -> None:
    from safetensors import safe_open

    subject = trainer(optimizer=optimizers.AdamW(lr=0.05, betas=(0.8, 0.9)), clip_grad_norm=1.0)
    ((x, y),) = batches(1)
    subject.step(x, target=y)
    assert subject.last_grad_norm is not None
    assert subject.last_grad_norm > 0
    path = subject.save(tmp_path / "run.safetensors")
    with safe_open(str(path), framework="numpy") as handle:
        keys = set(handle.keys())
        metadata = handle.metadata()
    assert {"param/lstm.W", "param/head.weight", "state/lstm.W/exp_avg", "state/head.bias/exp_avg_sq"} <= keys
    assert metadata["global_step"] == "1"
    assert metadata["format"] == "ortlstm.trainer/1"
    assert '"betas": [0.8, 0.9]' in metadata["spec"]
    assert '"clip_grad_norm": 1.0' in metadata["spec"]
    assert len(metadata["graph_sha256"]) == 64


def test_checkpoint_of_another_model_or_spec_is_refused(tmp_path: Path) -> None:
    path = trainer().save(tmp_path / "run.safetensors")
    other = classifier()
    other.graph.node[-1].attribute.append(helper.make_attribute("alpha", 2.0))
    with pytest.raises(ValueError, match=r"the checkpoint was saved for another model"):
        trainer(other).load(path)
    # Only the field that differs is named, not the two whole optimizers.
    refusal = (
        "the checkpoint was saved with optimizer.weight_decay=0.01, this trainer has optimizer.weight_decay=0.1 "
        "(build the Trainer with the same options, or rebuild the saved one with Trainer.from_checkpoint(model, path))"
    )
    with pytest.raises(ValueError, match=re.escape(f"{path}: {refusal}")):
        trainer(optimizer=optimizers.AdamW(lr=0.05, weight_decay=0.1)).load(path)
    with pytest.raises(ValueError, match=r"saved with loss.kind=cross_entropy and optimizer.betas=\[0.9, 0.999\], "
                       r"this trainer has loss.kind=nll_loss and optimizer.betas=\[0.8, 0.9\] \("):
        trainer(loss=losses.Loss.nll_loss(), optimizer=optimizers.AdamW(lr=0.05, betas=(0.8, 0.9))).load(path)
    # A different default lr is not a different spec: a resumed run may change it.
    trainer(optimizer=optimizers.AdamW(lr=0.001)).load(path)
    (tmp_path / "bad.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"not a safetensors file"):
        trainer().load(tmp_path / "bad.safetensors")


def test_checkpoint_from_before_newer_spec_fields_loads(tmp_path: Path) -> None:
    """A spec saved without fields added since (``stateful``, the loss's beta and delta) means their defaults."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    subject = trainer()
    ((x, y),) = batches(1)
    subject.step(x, target=y)
    path = subject.save(tmp_path / "run.safetensors")
    with safe_open(str(path), framework="numpy") as handle:
        metadata = dict(handle.metadata())
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
    spec = json.loads(metadata["spec"])
    del spec["stateful"], spec["loss"]["beta"], spec["loss"]["delta"]
    save_file(tensors, str(path), metadata={**metadata, "spec": json.dumps(spec)})
    resumed = trainer()
    resumed.load(path)
    for name, value in subject.parameters.items():
        np.testing.assert_array_equal(resumed.parameters[name], value, err_msg=name)
    spec["loss"]["kind"] = "huber_loss"
    save_file(tensors, str(path), metadata={**metadata, "spec": json.dumps(spec)})
    with pytest.raises(
        ValueError, match=r"saved with loss.kind=huber_loss, this trainer has loss.kind=cross_entropy \("
    ):
        trainer().load(path)


CHECKPOINT_BEFORE_LOSS_TABLE = Path(__file__).resolve().parent / "data" / "checkpoint_before_loss_table.safetensors"
"""Saved by the code before the losses became a table (graphs/losses.py, one dataclass): the
classifier, cross_entropy(weight=[0.5, 2.0, 1.0], label_smoothing=0.1), AdamW(lr=0.05),
clip_grad_norm=1.0, after two steps on ``batches(2)``."""


def test_checkpoint_saved_before_the_loss_table_loads_exactly_and_continues() -> None:
    def run() -> Trainer:
        return trainer(
            loss=losses.Loss.cross_entropy(weight=[0.5, 2.0, 1.0], label_smoothing=0.1),
            optimizer=optimizers.AdamW(lr=0.05),
            clip_grad_norm=1.0,
        )

    resumed = run()
    resumed.load(CHECKPOINT_BEFORE_LOSS_TABLE)
    assert resumed.global_step == 2
    assert resumed.spec.loss.options == {
        "weight": resumed.spec.loss.weight,
        "ignore_index": -100,
        "reduction": "mean",
        "label_smoothing": 0.1,
        "class_probabilities": False,  # added after the checkpoint: its default
    }
    np.testing.assert_array_equal(resumed.spec.loss.weight, [0.5, 2.0, 1.0])
    from safetensors.numpy import load_file

    saved = load_file(str(CHECKPOINT_BEFORE_LOSS_TABLE))
    for name, value in resumed.parameters.items():  # loading is exact
        np.testing.assert_array_equal(value, saved[f"param/{name}"], err_msg=name)
    for name, slots in resumed.optimizer_state.items():
        for slot, value in slots.items():
            np.testing.assert_array_equal(value, saved[f"state/{name}/{slot}"], err_msg=f"{name}.{slot}")
    # The file was written on an AVX-512 Intel CPU: the same two steps here equal it bitwise only on a
    # CPU whose BLAS kernels sum in the same order (an AMD EPYC's differ in the last bit, 6e-8 in lstm.W).
    uninterrupted = run()
    for x, y in batches(2):
        uninterrupted.step(x, target=y)
    assert uninterrupted.global_step == resumed.global_step
    for name, value in uninterrupted.parameters.items():
        np.testing.assert_allclose(value, resumed.parameters[name], rtol=1e-6, atol=1e-7, err_msg=name)
    for name, slots in uninterrupted.optimizer_state.items():
        for slot, value in slots.items():
            np.testing.assert_allclose(value, resumed.optimizer_state[name][slot], rtol=1e-5, atol=1e-9, err_msg=slot)


def test_written_directory_opens_and_exports(tmp_path: Path) -> None:
    data = batches(3)
    subject = trainer(extra_outputs=["logits"])
    subject.write(tmp_path / "run")
    opened = Trainer.open(tmp_path / "run", threads=1)
    for x, y in data:
        subject.step(x, target=y)
        opened.step(x, target=y)
    assert_same_state(subject, opened)
    opened.save(tmp_path / "run" / "state.safetensors")
    exported = export_directory(tmp_path / "run", tmp_path / "trained.onnx")
    reference = subject.export()
    assert exported.SerializeToString() == reference.SerializeToString()


# ---------------------------------------------------------------------------------------------
# export


def run_plain(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs a model in onnxruntime without the ortlstm library (no session_options())."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_export_is_the_original_model_with_trained_values() -> None:
    data = batches(3)
    subject = trainer()
    for x, y in data:
        subject.step(x, target=y)
    exported = subject.export()
    original = classifier()
    assert [(n.op_type, n.domain) for n in exported.graph.node] == [(n.op_type, n.domain) for n in original.graph.node]
    assert not any(node.domain == schema.DOMAIN for node in exported.graph.node)
    params = subject.parameters
    constant = next(node for node in exported.graph.node if node.op_type == "Constant")
    assert np.array_equal(onnx.numpy_helper.to_array(constant.attribute[0].t), params["head.weight"])
    for init in exported.graph.initializer:
        assert np.array_equal(onnx.numpy_helper.to_array(init), params[init.name])
    onnx.checker.check_model(exported, full_check=True)

    x, y = data[0]
    (logits,) = run_plain(exported, {"pixels": x})
    _, trainer_logits = subject.evaluate(x, target=y, outputs=["logits"])
    np.testing.assert_allclose(logits, trainer_logits, **FLOAT32_TOLERANCE)


@pytest.mark.parametrize(
    "path",
    [path for path in RECORDINGS if "frozen" in path.stem and "torchscript" in path.stem]
    + [path for path in RECORDINGS if path.stem == "tokens_seq_first_y-dynamo_unoptimized-AdamW"],
    ids=lambda p: p.stem,
)
def test_export_of_torch_exports_matches_the_trainer(path: Path) -> None:
    recording = load(path)
    config = recording.config
    subject = Trainer(
        recording.model,
        loss=loss_of(config),
        optimizer=optimizer_of(config),
        requires_grad=config["trainable"],
        target=config["target"],
        extra_outputs=["logits"],
        threads=1,
    )
    for step in range(3):
        batch = recording.batch(step)
        subject.step(**{name: batch[name] for name in config["model_inputs"]}, target=batch[config["target"]])
    batch = recording.batch(3)
    inputs = {name: batch[name] for name in config["model_inputs"]}
    _, expected = subject.evaluate(**inputs, target=batch[config["target"]])
    (actual,) = run_plain(subject.export(), inputs)
    np.testing.assert_allclose(actual, expected, **FLOAT32_TOLERANCE)
    frozen = set(config["frozen"])
    exported = {init.name: onnx.numpy_helper.to_array(init) for init in subject.export().graph.initializer}
    original = {init.name: onnx.numpy_helper.to_array(init) for init in recording.model.graph.initializer}
    for name in frozen:
        assert np.array_equal(exported[name], original[name]), f"frozen {name} changed"
    assert all(not np.array_equal(exported[name], original[name]) for name in config["trainable"])


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (np.zeros(6, np.float32), r"cross_entropy expects class indices \(int64 \[6\]\) or class probabilities"),
        (np.zeros(5, np.int64), r"expects class indices int64 \[6\] \(the prediction 'logits' \[6, 3\] without its"),
        (np.zeros((6, 1), np.int64), r"expects class indices int64 \[6\]"),
        (np.zeros(6, np.uint8), r"expects class indices of type int64 \[6\], got uint8 \[6\]"),
        (
            np.asarray([0, 1, 2, 3, 0, 1]),
            r"class index 3 is out of range for 3 classes \(expected 0\.\.2, or ignore_index -100; torch: 'Target 3",
        ),
        (np.asarray([0, -1, 2, 0, 1, 2]), r"class index -1 is out of range for 3 classes"),
    ],
    ids=["float_labels", "batch_size", "rank", "uint8", "index_too_large", "negative_index"],
)
def test_wrong_target_is_refused_before_running(target: np.ndarray, message: str) -> None:
    ((x, _),) = batches(1)
    subject = trainer()
    with pytest.raises(ValueError, match=message):
        subject.step(x, target=target)
    assert subject.global_step == 0


def test_ignored_targets_pass_the_range_check() -> None:
    """ignore_index is the one value outside [0, C) a class target may hold (torch's rule)."""
    ((x, _),) = batches(1)
    trainer().step(x, target=np.asarray([0, -100, 2, 0, 1, 2]))
    trainer(loss=losses.Loss.cross_entropy(ignore_index=-1)).step(x, target=np.asarray([0, -1, 2, 0, 1, 2]))
    with pytest.raises(ValueError, match=r"class index -100 is out of range .* or ignore_index -1;"):
        trainer(loss=losses.Loss.nll_loss(ignore_index=-1)).step(x, target=np.asarray([0, -100, 2, 0, 1, 2]))


def test_binary_cross_entropy_targets_outside_0_1_are_refused() -> None:
    ((x, _),) = batches(1)
    subject = trainer(loss=losses.Loss.binary_cross_entropy())
    target = np.full((6, 3), 0.5, np.float32)
    target[2, 1] = 1.5
    with pytest.raises(ValueError, match=r"binary_cross_entropy takes targets in \[0, 1\], got 1\.5 \(torch: 'all"):
        subject.step(x, target=target)
    target[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"got nan"):
        subject.step(x, target=target)
    assert subject.global_step == 0


def test_wrong_target_of_an_elementwise_loss() -> None:
    ((x, _),) = batches(1)
    subject = trainer(loss=losses.Loss.mse_loss())
    with pytest.raises(
        ValueError, match=r"mse_loss expects float32 \[6, 3\] \(the prediction's type and shape\), got float64"
    ):
        subject.step(x, target=np.zeros((6, 3)))


def test_batch_input_errors() -> None:
    ((x, y),) = batches(1)
    subject = trainer()
    with pytest.raises(ValueError, match=r"step\(\): missing batch input\(s\) \['pixels'\]; the model's inputs are"):
        subject.step(target=y)
    with pytest.raises(
        ValueError, match=r"step\(\): 'image' is not an input of the model; its inputs are \['pixels'\]"
    ):
        subject.step(image=x, target=y)
    with pytest.raises(
        ValueError, match=r"input 'pixels' must be float32 \[batch, steps, 4\], got float64 \[6, 3, 4\]"
    ):
        subject.step(x.astype(np.float64), target=y)
    with pytest.raises(
        ValueError, match=r"input 'pixels' must be float32 \[batch, steps, 4\], got float32 \[6, 4, 3\]"
    ):
        subject.step(x.transpose(0, 2, 1), target=y)
    with pytest.raises(ValueError, match=r"the loss cross_entropy needs target=\.\.\."):
        subject.step(x)
    with pytest.raises(ValueError, match=r"evaluate\(\): \['hidden'\] are not outputs of the model"):
        subject.evaluate(x, target=y, outputs=["hidden"])


def test_unknown_parameter_and_output_are_refused() -> None:
    with pytest.raises(ValueError, match=r"requires_grad: 'lstm\.Q' matches no parameter of the model.*: lstm\.W, "):
        trainer(requires_grad=["lstm.W", "lstm.Q"])
    with pytest.raises(
        ValueError, match=r"output 'scores' is not an output of the model; its outputs are \['logits'\]"
    ):
        trainer(output="scores")
    with pytest.raises(ValueError, match=r"output 'scores' is not an output of the model"):
        trainer(extra_outputs=["scores"])


def test_output_loss_takes_no_target() -> None:
    """A model output used as the loss (here the logits' mean): step() refuses a target."""
    model = classifier()
    model.graph.node.append(helper.make_node("ReduceMean", ["logits"], ["objective"], keepdims=0))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("objective", TensorProto.FLOAT, []))
    subject = trainer(model, loss=losses.Loss.output(), optimizer=optimizers.SGD(lr=0.1))
    ((x, y),) = batches(1)
    with pytest.raises(ValueError, match=r"the loss is the model output 'objective'; it takes no target"):
        subject.step(x, target=y)
    first = subject.step(x)
    assert subject.step(x) < first


# ---------------------------------------------------------------------------------------------
# stateful truncated backpropagation through time


def forward_classifier_with_zero_state() -> onnx.ModelProto:
    """The forward-only classifier whose LSTM takes initial_h/initial_c from zero initializers."""
    model = classifier(direction="forward")
    lstm = next(node for node in model.graph.node if node.op_type == "LSTM")
    lstm.input.extend(["", "h0", "c0"])
    zeros = np.zeros((1, 6, HIDDEN_SIZE), np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(zeros, "h0"), numpy_helper.from_array(zeros, "c0")])
    return model


def test_stateful_chunks_see_the_whole_sequence() -> None:
    """Without updates (lr 0), two carried chunks give what one pass over both gives."""
    (x, y), (x_next, _) = batches(2)
    subject = trainer(classifier(direction="forward"), optimizer=optimizers.SGD(lr=0.0), stateful=True,
                      extra_outputs=["logits"])  # fmt: skip
    subject.step(x, target=y)
    assert set(subject.carried_state) == {"lstm_2.initial_h", "lstm_2.initial_c"}
    _, logits = subject.step(x_next, target=y)
    whole = trainer(classifier(direction="forward"))
    _, expected = whole.evaluate(np.concatenate([x, x_next], axis=1), target=y, outputs=["logits"])
    np.testing.assert_allclose(logits, expected, **FLOAT32_TOLERANCE)
    # evaluate() starts from zeros and leaves the carried state alone
    _, fresh = subject.evaluate(x_next, target=y, outputs=["logits"])
    _, expected_fresh = whole.evaluate(x_next, target=y, outputs=["logits"])
    np.testing.assert_allclose(fresh, expected_fresh, **FLOAT32_TOLERANCE)


@pytest.mark.parametrize("model", [classifier(), forward_classifier_with_zero_state()], ids=["no_state", "zeros"])
def test_stateful_step_is_a_step_from_the_detached_state(model: onnx.ModelProto) -> None:
    """The carried state enters as a constant: the same as feeding it to the model by hand."""
    (x, y), (x_next, y_next) = batches(2)
    stateful = trainer(model, optimizer=optimizers.SGD(lr=0.1), stateful=True)
    stateful.step(x, target=y)
    carried = stateful.carried_state
    explicit = trainer(with_carried_state(model)[0], optimizer=optimizers.SGD(lr=0.1), output="logits")
    explicit.step(x, target=y, **{name: np.zeros_like(value) for name, value in carried.items()})
    stateful.step(x_next, target=y_next)
    explicit.step(x_next, target=y_next, **carried)
    assert_same_state(stateful, explicit)
    assert np.any(carried["lstm_2.initial_h" if "lstm_2.initial_h" in carried else "lstm_1.initial_h"] != 0)


def test_reset_state_of_some_rows() -> None:
    (x, y), (x_next, _) = batches(2)
    subject = trainer(classifier(direction="forward"), optimizer=optimizers.SGD(lr=0.0), stateful=True,
                      extra_outputs=["logits"])  # fmt: skip
    subject.step(x, target=y)
    before = subject.carried_state
    subject.reset_state(rows=[0, 3])
    after = subject.carried_state
    for name, value in after.items():
        assert np.all(value[:, [0, 3]] == 0)
        np.testing.assert_array_equal(value[:, [1, 2, 4, 5]], before[name][:, [1, 2, 4, 5]])
    _, logits = subject.step(x_next, target=y)
    whole = trainer(classifier(direction="forward"))
    _, fresh = whole.evaluate(x_next, target=y, outputs=["logits"])
    _, continued = whole.evaluate(np.concatenate([x, x_next], axis=1), target=y, outputs=["logits"])
    np.testing.assert_allclose(logits[[0, 3]], fresh[[0, 3]], **FLOAT32_TOLERANCE)
    np.testing.assert_allclose(logits[[1, 2, 4, 5]], continued[[1, 2, 4, 5]], **FLOAT32_TOLERANCE)
    subject.reset_state()
    assert subject.carried_state == {}


def test_stateful_resume_is_bitwise(tmp_path: Path) -> None:
    data = batches(4)
    uninterrupted = trainer(stateful=True)
    for x, y in data:
        uninterrupted.step(x, target=y)
    first = trainer(stateful=True)
    for x, y in data[:2]:
        first.step(x, target=y)
    resumed = Trainer.from_checkpoint(classifier(), first.save(tmp_path / "run.safetensors"), threads=1)
    assert set(resumed.carried_state) == set(first.carried_state)
    for x, y in data[2:]:
        resumed.step(x, target=y)
    assert_same_state(uninterrupted, resumed)
    for name, value in uninterrupted.carried_state.items():
        assert np.array_equal(value, resumed.carried_state[name])


def test_stateful_errors() -> None:
    ((x, y),) = batches(1)
    subject = trainer(stateful=True)
    subject.step(x, target=y)
    with pytest.raises(
        ValueError, match=r"the batch has 4 rows, the carried state of LSTM 'lstm_2' 6; call reset_state"
    ):
        subject.step(x[:4], target=y[:4])
    subject.reset_state()
    subject.step(x[:4], target=y[:4])
    with pytest.raises(
        RuntimeError, match=r"reset_state\(\): the trainer carries no state; build it with stateful=True"
    ):
        trainer().reset_state()
    no_lstm = classifier()
    no_lstm.graph.node[2].op_type = "Sum"  # no recurrent op left: no state to carry
    with pytest.raises(ValueError, match=r"stateful=True: the model's main graph has no ONNX LSTM, GRU or RNN node"):
        trainer(no_lstm, stateful=True)


@pytest.mark.filterwarnings("ignore")  # the TorchScript exporter warns about tracing and its own retirement
def test_stateful_training_matches_torch_with_detached_state(tmp_path: Path) -> None:
    """Truncated BPTT as torch does it: the same losses at every step and the same final state.

    A 2-layer LSTM tagger trained on consecutive chunks: torch carries ``state.detach()``, the
    Trainer is ``stateful=True``; both AdamW. Runs where torch is installed (the training venv).
    """
    torch = pytest.importorskip("torch")
    seq_length, batch_size, input_size, hidden_size, classes, steps = 4, 3, 5, 6, 4, 5

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(input_size, hidden_size, num_layers=2)
            self.head = torch.nn.Linear(hidden_size, classes)

        def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
            out, self.final = self.lstm(x, state)
            return self.head(out).reshape(-1, classes)

    torch.manual_seed(0)
    model = Tagger()
    path = tmp_path / "tagger.onnx"
    example = torch.zeros(seq_length, batch_size, input_size)
    torch.onnx.export(model, (example,), str(path), input_names=["x"], output_names=["logits"], dynamo=False)
    subject = Trainer(
        str(path), loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(lr=0.02), stateful=True, threads=1
    )
    assert len(subject.carried_state) == 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    rng = np.random.default_rng(3)
    state = None
    for step in range(steps):
        x = rng.standard_normal((seq_length, batch_size, input_size)).astype(np.float32)
        y = rng.integers(0, classes, seq_length * batch_size)
        logits = model(torch.from_numpy(x), state)
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state = tuple(value.detach() for value in model.final)
        ours = subject.step(x, target=y)
        assert ours == pytest.approx(loss.item(), rel=1e-5, abs=1e-6), f"step {step + 1}"
    carried = subject.carried_state
    final_h = np.concatenate([value for name, value in sorted(carried.items()) if name.endswith("initial_h")])
    np.testing.assert_allclose(final_h, state[0].numpy(), rtol=1e-4, atol=1e-5)
