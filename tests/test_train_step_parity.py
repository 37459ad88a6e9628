"""The plain-onnxruntime train step against recorded PyTorch training, with no torch installed.

Each recording (tests/recordings/record_training.py) holds a model exported from PyTorch (an
embedding or linear layer, a two-layer bidirectional LSTM, a linear head; TorchScript and dynamo
exports, the latter optimized or not), the batches of 20 steps, and torch's loss and parameters
after every step. ``ortlstm.graphs.build_training_models`` builds the train step from the export,
onnxruntime runs it on the same batches with the same learning-rate schedule, and every trained
parameter must match torch's after every step, to float32 tolerance. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.train_step import build_training_models
from ortlstm.ops import session_options

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


def loss_of(config: dict) -> losses.Loss:
    return losses.Loss.cross_entropy() if config["loss"] == "cross_entropy" else losses.Loss.mse_loss()


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
    )
    signature = built.signature
    session = ort.InferenceSession(
        built.train_step.SerializeToString(),
        session_options(intra_op_num_threads=1),
        providers=["CPUExecutionProvider"],
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
    assert len(RECORDINGS) >= 10, "run tests/recordings/record_training.py (needs torch) to record them"


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_parameters_match_torch_after_every_step(path: Path) -> None:
    run = train(path)
    recording = run.recording
    assert set(run.params[0]) == set(recording.config["trainable"])
    rtol, atol = TOLERANCES[next(iter(run.initial.values())).dtype]
    for step in range(recording.config["steps"]):
        np.testing.assert_allclose(
            run.losses[step],
            recording.arrays["losses"][step],
            rtol=rtol,
            atol=atol,
            err_msg=f"{recording.name}: loss of step {step + 1}",
        )
        for name, value in run.params[step].items():
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
