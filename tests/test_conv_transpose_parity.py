"""A ConvTranspose1d/2d upsampler trained through the Trainer, without torch, against torch's recorded training.

``tests/recordings/conv_transpose/<exporter>.npz`` (made by tests/recordings/record_conv_transpose.py
with torch 2.13) holds an upsampler (ConvTranspose1d with stride, padding and output_padding; tanh;
a grouped ConvTranspose2d with per-axis stride, padding, output_padding and dilation) exported by
the dynamo (optimized or not) and TorchScript exporters, and three Adam steps of mse_loss. The
Trainer replays them with its defaults, ``Trainer(model, loss=Loss.mse_loss(), optimizer=Adam(lr=0.01))``,
and every parameter after every step must match torch's within the float32 tolerance of
test_train_step_parity.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_train_step_parity import MIN_TRAINED_CHANGE, assert_step_matches, load, optimizer_of

from ortlstm.graphs import losses
from ortlstm.training import Trainer

RECORDINGS = sorted((Path(__file__).parent / "recordings" / "conv_transpose").glob("*.npz"))


def test_recordings_exist() -> None:
    assert [path.stem for path in RECORDINGS] == ["dynamo", "dynamo_unoptimized", "torchscript"], (
        "run tests/recordings/record_conv_transpose.py (needs torch) to record them"
    )


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_trainer_defaults_match_torch_after_every_step(path: Path) -> None:
    recording = load(path)
    config = recording.config
    assert config["loss"] == "mse"
    op_types = {node.op_type for node in recording.model.graph.node}
    assert "ConvTranspose" in op_types, sorted(op_types)
    trainer = Trainer(recording.model, loss=losses.Loss.mse_loss(), optimizer=optimizer_of(config))
    assert sorted(trainer.signature.params) == sorted(config["trainable"]), trainer.summary()
    initial = {name: value.copy() for name, value in trainer.parameters.items()}
    for step in range(config["steps"]):
        batch = recording.batch(step)
        loss = trainer.step(batch["x"], target=batch["target"])
        assert_step_matches(recording, step, loss, trainer.parameters)
    for name, value in trainer.parameters.items():
        change = float(np.max(np.abs(value - initial[name])))
        assert change > MIN_TRAINED_CHANGE, f"{recording.name}: {name} moved only {change:.3g}"
