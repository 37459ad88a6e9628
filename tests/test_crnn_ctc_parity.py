"""A CRNN trained with CTC through the Trainer, without torch, against torch's recorded training.

``tests/recordings/crnn_ctc/<exporter>.npz`` (made by tests/recordings/record_crnn_ctc.py with
torch 2.13) holds a text-line recognizer (Conv2d, ReLU, MaxPool2d, columns as steps, a
bidirectional LSTM, Linear, log_softmax) exported by the dynamo (optimized or not) and TorchScript
exporters, and ten Adam steps of torch.nn.functional.ctc_loss on random label sequences of random
lengths. The Trainer replays them as a user would, with its defaults: ``Trainer(model,
loss=Loss.ctc_loss(), optimizer=Adam(lr=0.01))``, the lengths by keyword (input_lengths left out
where every sample has all T steps, so the loss derives them), and every parameter after every
step must match torch's within the float32 tolerance of test_train_step_parity.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_train_step_parity import MIN_TRAINED_CHANGE, assert_step_matches, load, optimizer_of

from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer

RECORDINGS = sorted((Path(__file__).parent / "recordings" / "crnn_ctc").glob("*.npz"))


def test_recordings_exist() -> None:
    assert [path.stem for path in RECORDINGS] == ["dynamo", "dynamo_unoptimized", "torchscript"], (
        "run tests/recordings/record_crnn_ctc.py (needs torch) to record them"
    )


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_trainer_defaults_match_torch_after_every_step(path: Path) -> None:
    recording = load(path)
    config = recording.config
    assert config["loss"] == {"kind": "ctc_loss", "blank": 0, "reduction": "mean", "zero_infinity": False}
    trainer = Trainer(recording.model, loss=losses.Loss.ctc_loss(), optimizer=optimizer_of(config))
    assert sorted(trainer.signature.params) == sorted(config["trainable"]), trainer.summary()
    initial = {name: value.copy() for name, value in trainer.parameters.items()}
    derived = 0
    for step in range(config["steps"]):
        batch = recording.batch(step)
        lengths = {"target_lengths": batch["target_lengths"]}
        if np.any(batch["input_lengths"] != config["time_steps"]):
            lengths["input_lengths"] = batch["input_lengths"]
        else:
            derived += 1
        loss = trainer.step(batch["x"], target=batch["targets"], **lengths)
        assert_step_matches(recording, step, loss, trainer.parameters)
    assert 0 < derived < config["steps"], "both paths: input_lengths given and derived"
    for name, value in trainer.parameters.items():
        change = float(np.max(np.abs(value - initial[name])))
        assert change > MIN_TRAINED_CHANGE, f"{recording.name}: {name} moved only {change:.3g}"


def test_optimizer_is_torchs_adam() -> None:
    assert optimizer_of(load(RECORDINGS[0]).config) == optimizers.Adam(lr=0.01)
