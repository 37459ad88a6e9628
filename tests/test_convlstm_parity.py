"""A ConvLSTM trained by the Trainer with its default settings against recorded PyTorch training.

The recordings (tests/recordings/record_training.py, models in tests/convlstm_scenarios.py) hold a
ConvLSTM (one Conv2d over ``[x_t, h_{t-1}]``, the gates split from its output, a Python loop over
the steps from a zero state) with a per-pixel head (mse) or a pooled classifier (mean over H, W,
Linear, cross_entropy), exported with a dynamic batch (each batch its own size) or static shapes, by
TorchScript and by dynamo (optimized or not), the batches of 20 Adam steps and torch's loss and
parameters after every step. Here ``Trainer(model, loss=..., optimizer=...)`` trains the export as a
user would (no ``requires_grad``: the Trainer must find the parameters torch trains by itself) on
the same batches with the same learning-rate schedule, and every parameter must match torch's after
every step, to float32 tolerance. With ``requires_grad`` named, the same replay tells a wrong
default apart from wrong gradients. No torch here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx.numpy_helper
import pytest
from test_train_step_parity import MIN_TRAINED_CHANGE, TOLERANCES, Recording, load, loss_of, optimizer_of

from ortlstm.training import Trainer

RECORDINGS = sorted((Path(__file__).parent / "recordings" / "convlstm").glob("*.npz"))

def _cases() -> list:
    # The zero initial state (torch.zeros) reaches every export as a float tensor that is no torch
    # parameter: a full-shape Constant (TorchScript, static shapes), a zeros initializer or a 0-D one
    # an Expand broadcasts (dynamo). The defaults must leave it alone in all of them.
    return [
        pytest.param(path, settings, id=f"{path.stem}-{settings}")
        for settings in ("defaults", "requires_grad")
        for path in RECORDINGS
    ]


def replay(recording: Recording, settings: str) -> tuple[list[float], list[dict[str, np.ndarray]]]:
    """Trains the recording's model with the Trainer: losses and parameters after every step."""
    config = recording.config
    schedule = config["lr_schedule"]
    trainer = Trainer(
        recording.model,
        loss=loss_of(config),
        optimizer=optimizer_of(config),
        lr=lambda done: schedule[done],
        **({"requires_grad": config["trainable"]} if settings == "requires_grad" else {}),
    )
    losses, params = [], []
    for step in range(config["steps"]):
        batch = recording.batch(step)
        losses.append(float(trainer.step(batch["x"], target=batch[config["target"]])))
        params.append({name: value.copy() for name, value in trainer.parameters.items()})
    return losses, params


def test_recordings_exist() -> None:
    exporters = sorted({path.stem.split("-")[1] for path in RECORDINGS})
    assert len(RECORDINGS) == 9, "run tests/recordings/record_training.py convlstm (needs torch) to record them"
    assert exporters == ["dynamo", "dynamo_unoptimized", "torchscript"], exporters


@pytest.mark.parametrize(("path", "settings"), _cases())
def test_parameters_match_torch_after_every_step(path: Path, settings: str) -> None:
    recording = load(path)
    config = recording.config
    losses, params = replay(recording, settings)
    assert sorted(params[0]) == sorted(config["trainable"]), (
        f"{recording.name}: the Trainer trains {sorted(params[0])}, torch {sorted(config['trainable'])}"
    )
    initial = {init.name: onnx.numpy_helper.to_array(init) for init in recording.model.graph.initializer}
    rtol, atol = TOLERANCES[np.dtype(np.float32)]
    for step in range(config["steps"]):
        np.testing.assert_allclose(
            losses[step],
            recording.arrays["losses"][step],
            rtol=rtol,
            atol=atol,
            err_msg=f"{recording.name}: loss of step {step + 1}",
        )
        for name, value in params[step].items():
            np.testing.assert_allclose(
                value,
                recording.arrays[f"param/{name}"][step],
                rtol=rtol,
                atol=atol,
                err_msg=f"{recording.name}: {name} ({config['sources'][name]}) after step {step + 1}",
            )
    for name, value in params[-1].items():
        change = float(np.max(np.abs(value - initial[name])))
        assert change > MIN_TRAINED_CHANGE, f"{recording.name}: {name} moved only {change:.3g}"
