"""The plain-onnxruntime train step against recorded PyTorch training, with no torch installed.

Each recording (tests/recordings/record_training.py) holds a model exported from PyTorch (an
embedding or linear layer, a two-layer bidirectional LSTM, a linear head; TorchScript and dynamo
exports, the latter optimized or not), the batches of 20 steps, and torch's loss and parameters
after every step. ``ortlstm.graphs.build_training_models`` builds the train step from the export,
onnxruntime runs it on the same batches with the same learning-rate schedule, and every trained
parameter must match torch's after every step, to float32 tolerance (also the Linear -> GELU ->
Linear classifiers of tests/recordings/record_activations.py: one opset-20 Gelu node). The scenarios
(tests/torch_scenarios.py): loss on every step's output (a per-step tagger) or on h_n, padded
batches, batch_first, frozen parameters, a Sigmoid head trained with binary_cross_entropy,
initial_h / initial_c as torch parameters, a batch size that changes from step to step; SGD
(momentum with nesterov or dampening), Adam, AdamW, clipping (clip_grad_norm_ and clip_grad_value_),
parameter groups (no weight decay on biases). Nothing here imports torch, and a child process
proves that training needs neither torch nor onnxruntime.training.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.train_step import build_training_models
from ortlstm.ops import session_options
from ortlstm.training import float64_disabled_optimizers

RECORDINGS = sorted((Path(__file__).parent / "recordings" / "train_step").glob("*.npz"))

# Through 20 optimizer steps of a two-layer LSTM; observed differences: float32 a few 1e-7.
TOLERANCES = {np.dtype(np.float32): (1e-4, 2e-5), np.dtype(np.float64): (1e-9, 1e-12)}
# Every trained parameter must move by more than this, or the comparison would prove little.
MIN_TRAINED_CHANGE = 1e-3


@dataclasses.dataclass
class Recording:
    """One recorded torch run."""

    name: str
    config: dict
    model: onnx.ModelProto
    arrays: dict[str, np.ndarray]

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """The batch of 0-based step ``step``, keyed by input name."""
        prefix = f"batch/{step}/"
        return {key[len(prefix) :]: value for key, value in self.arrays.items() if key.startswith(prefix)}


def load(path: Path) -> Recording:
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    config = json.loads(arrays.pop("config").tobytes().decode())
    model = onnx.load_from_string(arrays.pop("model").tobytes())
    return Recording(path.stem, config, model, arrays)


def optimizer_of(config: dict) -> optimizers.Optimizer:
    return optimizers.optimizer_from_torch(config["optimizer"]["name"], **config["optimizer"]["kwargs"])


LOSSES = {
    "cross_entropy": losses.Loss.cross_entropy,
    "mse": losses.Loss.mse_loss,
    "binary_cross_entropy": losses.Loss.binary_cross_entropy,
}
"""A recording's loss (tests/torch_scenarios.py) -> its ortlstm builder, torch's defaults."""


def loss_of(config: dict) -> losses.Loss:
    return LOSSES[config["loss"]]()


@dataclasses.dataclass
class Run:
    """A recording replayed in onnxruntime: the loss and parameters after every step."""

    recording: Recording
    losses: list[float]
    params: list[dict[str, np.ndarray]]
    initial: dict[str, np.ndarray]


_RUNS: dict[str, Run] = {}


def train(path: Path) -> Run:
    """Replays a recording through the train step in onnxruntime (once per module)."""
    if path.stem in _RUNS:
        return _RUNS[path.stem]
    recording = load(path)
    config = recording.config
    built = build_training_models(
        recording.model,
        loss=loss_of(config),
        optimizer=optimizer_of(config),
        requires_grad=config["trainable"],
        target=config["target"],
        clip_grad_norm=config["clip_grad_norm"],
        clip_grad_value=config.get("clip_grad_value"),
        param_groups=[optimizers.ParamGroup(**group) for group in config.get("param_groups", ())],
    )
    signature = built.signature
    session = ort.InferenceSession(
        built.train_step.SerializeToString(),
        session_options(intra_op_num_threads=1),
        providers=["CPUExecutionProvider"],
        disabled_optimizers=float64_disabled_optimizers(built.initial_params.values()),
    )
    params = dict(built.initial_params)
    state = dict(built.initial_state)
    outputs = [signature.loss, *signature.new_params]
    state_inputs = [signature.state[name][slot] for name in signature.params for slot in signature.state[name]]
    state_outputs = [signature.new_state[name][slot] for name in signature.params for slot in signature.state[name]]
    run = Run(recording, [], [], dict(params))
    for step in range(config["steps"]):
        batch = recording.batch(step)
        feeds = {name: batch[name] for name in signature.batch_inputs}
        feeds[signature.target] = batch[config["target"]]
        feeds.update(params)
        feeds.update(state)
        feeds[signature.lr] = np.asarray(config["lr_schedule"][step], dtype=np.float64)
        feeds[signature.step] = np.asarray(step + 1, dtype=np.int64)
        values = session.run(outputs + state_outputs, feeds)
        run.losses.append(float(values[0]))
        params = dict(zip(signature.params, values[1 : 1 + len(signature.params)], strict=True))
        state = dict(zip(state_inputs, values[1 + len(signature.params) :], strict=True))
        run.params.append(params)
    _RUNS[path.stem] = run
    return run


def test_recordings_exist() -> None:
    assert len(RECORDINGS) >= 25, "run tests/recordings/record_training.py (needs torch) to record them"


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_parameters_match_torch_after_every_step(path: Path) -> None:
    run = train(path)
    recording = run.recording
    assert set(run.params[0]) == set(recording.config["trainable"])
    for step in range(recording.config["steps"]):
        assert_step_matches(recording, step, run.losses[step], run.params[step])


def assert_step_matches(recording: Recording, step: int, loss: float, params: dict[str, np.ndarray]) -> None:
    """The loss of 0-based ``step`` and every parameter after it equal torch's, to the dtype's tolerance."""
    rtol, atol = TOLERANCES[next(iter(params.values())).dtype]
    np.testing.assert_allclose(
        loss,
        recording.arrays["losses"][step],
        rtol=rtol,
        atol=atol,
        err_msg=f"{recording.name}: loss of step {step + 1}",
    )
    for name, value in params.items():
        assert value.dtype == recording.arrays[f"param/{name}"].dtype, f"{recording.name}: {name} dtype"
        np.testing.assert_allclose(
            value,
            recording.arrays[f"param/{name}"][step],
            rtol=rtol,
            atol=atol,
            err_msg=f"{recording.name}: {name} ({recording.config['sources'][name]}) after step {step + 1}",
        )


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_every_trained_parameter_moved(path: Path) -> None:
    run = train(path)
    for name, value in run.params[-1].items():
        change = float(np.max(np.abs(value - run.initial[name])))
        assert change > MIN_TRAINED_CHANGE, f"{run.recording.name}: {name} moved only {change:.3g}"


# Run as a child with torch and onnxruntime.training unimportable, as where they are not installed:
# builds the train step of a recording's model and runs two steps in onnxruntime. Every attempt to
# import them is recorded with the module that tried (onnxruntime-training's own `import onnxruntime`
# probes for onnxruntime.training and carries on without it).
_NO_TORCH_SCRIPT = """
import importlib.abc
import json
import sys

BLOCKED = ("torch", "onnxruntime.training")
attempts = []


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == blocked or name.startswith(blocked + ".") for blocked in BLOCKED):
            frame = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__", "").startswith(
                ("importlib", "_frozen_importlib")
            ):
                frame = frame.f_back
            attempts.append([name, frame.f_globals.get("__name__") if frame is not None else None])
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Block())

import numpy as np
import onnx

import ortlstm.graphs
from ortlstm.graphs import build_training_models, losses, optimizers

import onnxruntime as ort
from ortlstm.ops import session_options

recording, result = sys.argv[1], sys.argv[2]
with np.load(recording) as data:
    arrays = {key: data[key] for key in data.files}
config = json.loads(arrays["config"].tobytes().decode())
built = build_training_models(
    onnx.load_from_string(arrays["model"].tobytes()),
    loss=getattr(losses.Loss, {"mse": "mse_loss"}.get(config["loss"], config["loss"]))(),
    optimizer=optimizers.optimizer_from_torch(config["optimizer"]["name"], **config["optimizer"]["kwargs"]),
    requires_grad=config["trainable"],
    target=config["target"],
)
signature = built.signature
session = ort.InferenceSession(
    built.train_step.SerializeToString(), session_options(intra_op_num_threads=1), providers=["CPUExecutionProvider"]
)
params, state = dict(built.initial_params), dict(built.initial_state)
state_inputs = [signature.state[name][slot] for name in signature.params for slot in signature.state[name]]
state_outputs = [signature.new_state[name][slot] for name in signature.params for slot in signature.state[name]]
saved = {}
for step in range(2):
    feeds = {name: arrays[f"batch/{step}/{name}"] for name in signature.batch_inputs}
    feeds[signature.target] = arrays[f"batch/{step}/{config['target']}"]
    feeds.update(params)
    feeds.update(state)
    feeds[signature.lr] = np.asarray(config["lr_schedule"][step], dtype=np.float64)
    feeds[signature.step] = np.asarray(step + 1, dtype=np.int64)
    values = session.run([signature.loss, *signature.new_params, *state_outputs], feeds)
    count = len(signature.params)
    params = dict(zip(signature.params, values[1 : 1 + count]))
    state = dict(zip(state_inputs, values[1 + count :]))
    saved[f"loss/{step}"] = values[0]
    saved.update({f"param/{step}/{name}": value for name, value in params.items()})
np.savez(result, **saved)
print(json.dumps({
    "attempts": attempts,
    "torch": "torch" in sys.modules,
    "onnxruntime.training": "onnxruntime.training" in sys.modules,
    "onnxruntime": ort.__version__,
    "graphs": ortlstm.graphs.__file__,
}))
"""


def test_training_needs_no_torch(tmp_path: Path) -> None:
    """The train step builds and runs where torch and onnxruntime.training cannot be imported.

    The child's cwd is outside the checkout: from its root, `import ortlstm` would find the source
    folder, not the install. In an onnxruntime-training environment (which has torch), the child
    makes both unimportable; the only attempt allowed is onnxruntime's own probe.
    """
    path = next(path for path in RECORDINGS if path.stem == "tokens_seq_first_y-torchscript-AdamW")
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH_SCRIPT, str(path), str(tmp_path / "result.npz")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, f"child failed (rc={result.returncode}):\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(report)
    assert report["torch"] is False, report
    assert report["onnxruntime.training"] is False, report
    importers = {importer for _, importer in report["attempts"]}
    assert all(importer and importer.startswith("onnxruntime.") for importer in importers), (
        f"something other than onnxruntime's own probe tried to import torch / onnxruntime.training: {report}"
    )
    recording = load(path)
    rtol, atol = TOLERANCES[np.dtype(np.float32)]
    with np.load(tmp_path / "result.npz") as data:
        for step in range(2):
            np.testing.assert_allclose(data[f"loss/{step}"], recording.arrays["losses"][step], rtol=rtol, atol=atol)
            for name in recording.config["trainable"]:
                np.testing.assert_allclose(
                    data[f"param/{step}/{name}"],
                    recording.arrays[f"param/{name}"][step],
                    rtol=rtol,
                    atol=atol,
                    err_msg=f"{name} after step {step + 1}",
                )


# ---- the Trainer with its defaults, as a user arrives -------------------------------------------

# How a user freezes what the frozen scenario's torch run froze (tests/torch_scenarios.py: the
# embedding and the first layer's recurrent weights): by torch's names where the export records
# them (dynamo: its metadata says which initializer came from which parameter), by the ONNX
# initializer names where it does not (TorchScript renames LSTM weights to onnx::LSTM_N).
FROZEN_BY_TORCH_NAME = {"tokens_frozen_embedding_R0_h_n": ["input_layer", "lstm.weight_hh_l0*"]}


def _user_frozen(config: dict) -> list[str]:
    if config["exporter"] == "torchscript":
        return list(config["frozen"])
    return FROZEN_BY_TORCH_NAME.get(config["scenario"], [])


def recorded_trainer(recording: Recording, **selection: object) -> Any:
    """A Trainer with a recording's loss, optimizer, schedule, clipping and groups; ``selection``: what it trains."""
    from ortlstm.training import Trainer

    config = recording.config
    schedule = config["lr_schedule"]
    return Trainer(
        recording.model,
        loss=loss_of(config),
        optimizer=optimizer_of(config),
        lr=lambda done: schedule[done],
        target=config["target"],
        clip_grad_norm=config["clip_grad_norm"],
        clip_grad_value=config.get("clip_grad_value"),
        param_groups=[optimizers.ParamGroup(**group) for group in config.get("param_groups", ())],
        threads=1,
        **selection,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_trainer_defaults_train_what_torch_trains(path: Path) -> None:
    """``Trainer(model, loss=..., optimizer=...)`` with no requires_grad follows torch, step by step.

    The default trained set is exactly the torch parameters (never the exporter's zero initial
    states: a 0-D initializer expanded to the batch, a folded zeros tensor, TorchScript's Constant
    zeros), and every parameter after every step matches the recording.
    """
    recording = load(path)
    config = recording.config
    trainer = recorded_trainer(recording, frozen=_user_frozen(config))
    assert sorted(trainer.signature.params) == sorted(config["trainable"]), trainer.summary()
    for step in range(config["steps"]):
        batch = recording.batch(step)
        loss = trainer.step(target=batch.pop(config["target"]), **batch)
        assert_step_matches(recording, step, loss, trainer.parameters)


CLIPPED_RECORDINGS = [path for path in RECORDINGS if "-clip" in path.stem]


@pytest.mark.parametrize("path", CLIPPED_RECORDINGS, ids=lambda path: path.stem)
def test_apply_clips_as_torch_clips(path: Path) -> None:
    """``accumulate`` + ``apply`` (the apply model clips the accumulated gradients) follows torch too.

    One micro-batch per update: the accumulated gradient is the step's, so the recording holds.
    """
    recording = load(path)
    config = recording.config
    trainer = recorded_trainer(recording, requires_grad=config["trainable"])
    for step in range(config["steps"]):
        batch = recording.batch(step)
        loss = trainer.accumulate(target=batch.pop(config["target"]), **batch)
        trainer.apply()
        assert_step_matches(recording, step, loss, trainer.parameters)
