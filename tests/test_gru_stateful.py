"""Stateful truncated BPTT of GRUs (and a GRU feeding an LSTM, and a TorchScript nn.RNN) trains as torch trains it.

tests/recordings/record_gru_stateful.py trained, in torch, a 2-layer ``nn.GRU`` (seq-first, SGD with
momentum) and a bidirectional ``nn.GRU`` feeding an ``nn.LSTM`` (batch_first, Adam) on consecutive
chunks, each starting from the last chunk's final states ``detach()``-ed, the state dropped before one
step (an epoch's start), and recorded every parameter and every final state after every step. Here,
without torch, ``Trainer(model, ..., stateful=True)`` replays the chunks (``reset_state()`` where torch
dropped the state): each parameter, the loss and the carried state must be torch's after every step.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from test_cli import ortlstm_cli

from ortlstm import fit as fitting
from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.carried_state import STATE_PORTS, with_carried_state
from ortlstm.ops.spec_gru import GRU_TRAINING
from ortlstm.ops.spec_lstm import LSTM_TRAINING
from ortlstm.ops.spec_rnn import RNN_TRAINING
from ortlstm.training import Trainer

RECORDED = Path(__file__).parent / "recordings" / "gru_stateful"
RECORDINGS = {path.stem.split("-")[0]: path for path in RECORDED.glob("*.npz")}
RTOL, ATOL = 1e-4, 2e-5  # float32 through a few steps, as test_gru_training's


def _load(name: str) -> tuple[dict, onnx.ModelProto, dict[str, np.ndarray]]:
    with np.load(RECORDINGS[name]) as data:
        arrays = {key: data[key] for key in data.files}
    config = json.loads(arrays.pop("config").tobytes().decode())
    return config, onnx.load_from_string(arrays.pop("model").tobytes()), arrays


def _trainer(config: dict, model: onnx.ModelProto) -> Trainer:
    optimizer = optimizers.optimizer_from_torch(config["optimizer"]["name"], **config["optimizer"]["kwargs"])
    return Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizer, stateful=True, threads=1)


def _batch(arrays: dict[str, np.ndarray], step: int) -> dict[str, np.ndarray]:
    return {key.split("/")[-1]: value for key, value in arrays.items() if key.startswith(f"batch/{step}/")}


def _check_step(
    trainer: Trainer, model: onnx.ModelProto, arrays: dict[str, np.ndarray], step: int, loss: float
) -> None:
    """The loss, every parameter and every carried state after ``step`` are torch's."""
    np.testing.assert_allclose(loss, arrays["losses"][step], rtol=RTOL, atol=ATOL, err_msg=f"loss {step}")
    for name, value in trainer.parameters.items():
        np.testing.assert_allclose(
            value, arrays[f"param/{name}"][step], rtol=RTOL, atol=ATOL,
            err_msg=f"{name} after step {step + 1}",
        )  # fmt: skip
    carried = trainer.carried_state
    order = [initial for state in with_carried_state(model)[1] for initial, _ in state.states]
    assert sorted(carried) == sorted(order) and f"state/{step}/{len(order)}" not in arrays
    for index, name in enumerate(order):  # the recording's order: each layer's h (an LSTM's h, c) in graph order
        expected = arrays[f"state/{step}/{index}"]
        np.testing.assert_allclose(carried[name], expected, rtol=RTOL, atol=ATOL, err_msg=f"{name} after {step + 1}")


def test_recordings_exist() -> None:
    expected = {"gru2", "bigru_lstm", "rnn2"}
    assert set(RECORDINGS) == expected, "run tests/recordings/record_gru_stateful.py (needs torch)"


def test_the_carried_ports_are_the_training_ops_initial_states() -> None:
    """STATE_PORTS (from ONNX's schemas) names the inputs the recurrent training ops take as initial state."""
    for op_type, spec in (("LSTM", LSTM_TRAINING), ("GRU", GRU_TRAINING), ("RNN", RNN_TRAINING)):
        initial = [port.name for port in spec.inputs if port.name.startswith("initial_")]
        assert [spec.inputs[index].name for index, _ in STATE_PORTS[op_type]] == initial, op_type
    assert STATE_PORTS["LSTM"] == ((5, 1), (6, 2)) and STATE_PORTS["GRU"] == STATE_PORTS["RNN"] == ((5, 1),)


@pytest.mark.parametrize("name", ["gru2", "bigru_lstm", "rnn2"])
def test_stateful_trainer_follows_torchs_truncated_bptt(name: str) -> None:
    config, model, arrays = _load(name)
    trainer = _trainer(config, model)
    assert set(trainer.signature.params) == set(config["trainable"])
    assert trainer.carried_state == {}
    for step in range(config["steps"]):
        if step == config["reset_before"]:
            trainer.reset_state()
        _check_step(trainer, model, arrays, step, float(trainer.step(**_batch(arrays, step))))
    # The state really carried: the step after the reset differs from one that had kept it.
    assert not np.allclose(arrays[f"state/{config['reset_before'] - 1}/0"], 0)


def test_a_gru_carried_state_names_only_h() -> None:
    _, model, _ = _load("bigru_lstm")
    _, carried = with_carried_state(model)
    assert [(state.op_type, [initial.rsplit(".", 1)[1] for initial, _ in state.states]) for state in carried] == [
        ("GRU", ["initial_h"]),
        ("LSTM", ["initial_h", "initial_c"]),
    ]
    assert carried[0].initial_c == carried[0].final_c == ""


def test_a_resumed_gru_lstm_run_carries_its_state_bitwise(tmp_path: Path) -> None:
    """save() holds the carried GRU and LSTM state; the resumed run continues as the uninterrupted one."""
    config, model, arrays = _load("bigru_lstm")
    uninterrupted, first = _trainer(config, model), _trainer(config, model)
    for step in range(2):
        uninterrupted.step(**_batch(arrays, step))
        first.step(**_batch(arrays, step))
    resumed = Trainer.from_checkpoint(model, first.save(tmp_path / "run.safetensors"), threads=1)
    assert list(resumed.carried_state) == list(first.carried_state)  # the graph's order, as before the save
    for step in range(2, config["steps"]):
        if step == config["reset_before"]:
            uninterrupted.reset_state()
            resumed.reset_state()
        loss = float(resumed.step(**_batch(arrays, step)))
        assert loss == float(uninterrupted.step(**_batch(arrays, step)))
        _check_step(resumed, model, arrays, step, loss)
    for name, value in uninterrupted.carried_state.items():
        np.testing.assert_array_equal(resumed.carried_state[name], value, err_msg=name)


def test_reset_state_of_some_rows_of_a_gru() -> None:
    config, model, arrays = _load("gru2")  # seq-first: the state's batch axis is 1
    trainer = _trainer(config, model)
    trainer.step(**_batch(arrays, 0))
    before = trainer.carried_state
    trainer.reset_state(rows=[1])
    for name, value in trainer.carried_state.items():
        assert np.all(value[:, 1] == 0) and np.any(before[name][:, 1] != 0), name
        np.testing.assert_array_equal(value[:, [0, 2]], before[name][:, [0, 2]])


def _stream_data(config: dict, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Two batches of the recording as one file of 6 streams (seq-first: streams on axis 1)."""
    return {key: np.concatenate([_batch(arrays, step)[key] for step in range(2)], axis=1) for key in ("x", "target")}


def test_a_stateful_fit_of_a_gru_is_its_steps_with_the_state_reset_each_epoch(tmp_path: Path) -> None:
    config, model, arrays = _load("gru2")
    data = _stream_data(config, arrays)
    trainer = _trainer(config, model)
    assert list(fitting.data_specs(trainer, model)) == ["x", "target"]  # the carried state is no data
    fitting.fit(trainer, data, model=model, epochs=2, batch_size=3, log=lambda line: None)
    reference = _trainer(config, model)
    for _ in range(2):
        reference.reset_state()
        for first in (0, 3):
            reference.step(x=data["x"][:, first : first + 3], target=data["target"][:, first : first + 3])
    for name, value in reference.parameters.items():
        np.testing.assert_array_equal(trainer.parameters[name], value, err_msg=name)
    for name, value in reference.carried_state.items():
        np.testing.assert_array_equal(trainer.carried_state[name], value, err_msg=name)
    # The same through the command line, whose --stateful reaches the trainer.
    onnx.save(model, str(tmp_path / "gru.onnx"))
    np.savez(tmp_path / "streams.npz", **data)
    done = ortlstm_cli(
        "fit", "gru.onnx", "--data", "streams.npz", "--loss", "mse_loss", "--optimizer", "sgd", "--lr", "0.3",
        "--optimizer-option", "momentum=0.9", "--epochs", "2", "--batch-size", "3", "--stateful", "--threads", "1",
        "--out", "trained.onnx", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    exported = onnx.load(str(tmp_path / "trained.onnx"))
    trained = {init.name: onnx.numpy_helper.to_array(init) for init in exported.graph.initializer}
    for name, value in reference.parameters.items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
