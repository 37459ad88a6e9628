"""SGD on the new path equals SGD on the onnxruntime-training Module path.

The same exported model (from a torch recording: tests/recordings/train_step) trains 10 SGD steps
twice, on the same batches with the same learning-rate schedule: once through
``graphs.generate_artifacts`` / ``graphs.open_training`` (onnxruntime-training's Module and
Optimizer, its own gradient graph and SGD kernel) and once through ``build_training_models`` run
in an ``InferenceSession``. Every parameter must agree after every step, to float32 tolerance.
Only in an environment with onnxruntime-training (whose training API imports torch); the
recordings' models are reused, so nothing is exported here.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import onnx.numpy_helper
import onnxruntime as ort
import pytest

from ortlstm import graphs
from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.train_step import build_training_models
from ortlstm.ops import session_options

pytest.importorskip("torch")
ort_artifacts = pytest.importorskip("onnxruntime.training.artifacts")

from test_train_step_parity import RECORDINGS, TOLERANCES, Recording, load  # noqa: E402

STEPS = 10
BASE_LR = 1.0  # large, so that 10 SGD steps move every parameter well beyond the tolerance
MIN_TRAINED_CHANGE = 1e-3
# Recordings whose model and batches are trained here (not their optimizer). The Module path
# cannot train initial_h / initial_c: recordings that do are left out.
CASES = [
    "tokens_seq_first_y-torchscript-AdamW",
    "tokens_seq_first_y-dynamo-AdamW",
    "tokens_frozen_embedding_R0_h_n-dynamo_unoptimized-AdamW",
    "features_padded_batch_first_h_n-torchscript-AdamW",
    "tokens_padded_h_n-torchscript-AdamW",
    "tokens_frozen_embedding_R0_h_n-dynamo-AdamW",
    "tokens_dynamic_batch_y-torchscript-AdamW",
]


def lr_of(step: int) -> float:
    """The learning rate of 0-based step ``step``: a non-monotonic schedule around BASE_LR."""
    return BASE_LR * (0.55 + 0.45 * math.cos(1.3 * step))


@dataclasses.dataclass
class Trajectory:
    """Loss and parameters after every step."""

    losses: list[float] = dataclasses.field(default_factory=list)
    params: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)


def train_module(recording: Recording, directory: Path) -> Trajectory:
    """onnxruntime-training: generate_artifacts, Module, Optimizer (SGD)."""
    config = recording.config
    loss = (
        ort_artifacts.LossType.CrossEntropyLoss if config["loss"] == "cross_entropy" else ort_artifacts.LossType.MSELoss
    )
    artifacts = graphs.generate_artifacts(
        recording.model,
        requires_grad=config["trainable"],
        frozen_params=config["frozen"],
        loss=loss,
        optimizer=ort_artifacts.OptimType.SGD,
        artifact_directory=directory,
    )
    module, optimizer, state = graphs.open_training(artifacts, intra_op_num_threads=1)
    module.train()
    trajectory = Trajectory()
    for step in range(STEPS):
        batch = recording.batch(step)
        optimizer.set_learning_rate(lr_of(step))
        loss_value = module(*(batch[name] for name in module.input_names()))
        optimizer.step()
        module.lazy_reset_grad()
        trajectory.losses.append(float(loss_value))
        trajectory.params.append({name: state.parameters[name].data.copy() for name in config["trainable"]})
    return trajectory


def train_step(recording: Recording) -> Trajectory:
    """The new path: build_training_models in an InferenceSession."""
    config = recording.config
    built = build_training_models(
        recording.model,
        loss=losses.Loss.cross_entropy() if config["loss"] == "cross_entropy" else losses.Loss.mse_loss(),
        optimizer=optimizers.SGD(lr=BASE_LR),
        requires_grad=config["trainable"],
        target=config["target"],
    )
    signature = built.signature
    assert not built.initial_state, "plain SGD keeps no state"
    session = ort.InferenceSession(
        built.train_step.SerializeToString(),
        session_options(intra_op_num_threads=1),
        providers=["CPUExecutionProvider"],
    )
    params = dict(built.initial_params)
    trajectory = Trajectory()
    for step in range(STEPS):
        batch = recording.batch(step)
        feeds = {name: batch[name] for name in signature.batch_inputs}
        feeds[signature.target] = batch[config["target"]]
        feeds.update(params)
        feeds[signature.lr] = np.asarray(lr_of(step), dtype=np.float64)
        feeds[signature.step] = np.asarray(step + 1, dtype=np.int64)
        loss_value, *new_params = session.run([signature.loss, *signature.new_params], feeds)
        params = dict(zip(signature.params, new_params, strict=True))
        trajectory.losses.append(float(loss_value))
        trajectory.params.append(params)
    return trajectory


@pytest.mark.parametrize("name", CASES)
def test_sgd_matches_onnxruntime_training_module(name: str, tmp_path: Path) -> None:
    recording = load(next(path for path in RECORDINGS if path.stem == name))
    module = train_module(recording, tmp_path / "artifacts")
    new = train_step(recording)
    rtol, atol = TOLERANCES[np.dtype(np.float32)]
    worst = 0.0
    for step in range(STEPS):
        np.testing.assert_allclose(
            new.losses[step], module.losses[step], rtol=rtol, atol=atol, err_msg=f"{name}: loss of step {step + 1}"
        )
        assert set(new.params[step]) == set(module.params[step]) == set(recording.config["trainable"])
        for param, value in new.params[step].items():
            np.testing.assert_allclose(
                value,
                module.params[step][param],
                rtol=rtol,
                atol=atol,
                err_msg=f"{name}: {param} ({recording.config['sources'][param]}) after step {step + 1}",
            )
            worst = max(worst, float(np.max(np.abs(value - module.params[step][param]))))
    print(f"{name}: max |new - Module| over {STEPS} SGD steps: {worst:.3g}")
    initial = {init.name: onnx.numpy_helper.to_array(init) for init in recording.model.graph.initializer}
    for param, value in new.params[-1].items():
        change = float(np.max(np.abs(value - initial[param])))
        assert change > MIN_TRAINED_CHANGE, f"{name}: {param} moved only {change:.3g}"
