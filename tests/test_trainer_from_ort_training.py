"""A run of the onnxruntime-training path moves to the Trainer: parameters, AdamW moments, step.

The demo's classifier (a bidirectional LSTM and a linear head, built with onnx.helper) trains a few
AdamW steps through ``graphs.generate_artifacts`` / ``graphs.open_training`` (onnxruntime-training's
Module and Optimizer); its ``CheckpointState`` is saved with the optimizer state and loaded into a
``Trainer``, which must hold the same parameters and moments bitwise, the same step count, compute
the same loss on the next batch and keep training. Only where onnxruntime-training is installed
(its training API imports torch).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ortlstm import graphs
from ortlstm.demo import build_classifier
from ortlstm.graphs import losses, optimizers
from ortlstm.ops import session_options
from ortlstm.training import Trainer, read_onnxruntime_training_checkpoint

pytest.importorskip("torch")
ort_api = pytest.importorskip("onnxruntime.training.api")
ort_artifacts = pytest.importorskip("onnxruntime.training.artifacts")

HIDDEN_SIZE = 8
BATCH = 16
MODULE_STEPS = 5
CONTINUED_STEPS = 20
LR = 1e-2


def batch(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``index``: digits-shaped sequences [BATCH, 8 rows, 8 pixels] and labels, fixed by the index."""
    rng = np.random.default_rng(100 + index)
    return rng.random((BATCH, 8, 8), dtype=np.float32), rng.integers(0, 10, BATCH).astype(np.int64)


@pytest.fixture(scope="module")
def module_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """MODULE_STEPS AdamW steps on the Module path; the checkpoint with and without optimizer state."""
    directory = tmp_path_factory.mktemp("ort_training")
    model = build_classifier(HIDDEN_SIZE, seed=0)
    artifacts = graphs.generate_artifacts(
        model,
        loss=ort_artifacts.LossType.CrossEntropyLoss,
        optimizer=ort_artifacts.OptimType.AdamW,
        artifact_directory=directory / "artifacts",
    )
    module, optimizer, state = graphs.open_training(artifacts, intra_op_num_threads=1)
    optimizer.set_learning_rate(LR)
    module.train()
    for step in range(MODULE_STEPS):
        module(*batch(step))
        optimizer.step()
        module.lazy_reset_grad()
    state.properties["epoch"] = 2
    with_state = directory / "checkpoint_with_optimizer"
    ort_api.CheckpointState.save_checkpoint(state, str(with_state), include_optimizer_state=True)
    params_only = directory / "checkpoint_params_only"
    ort_api.CheckpointState.save_checkpoint(state, str(params_only))
    parameters = {name: parameter.data.copy() for name, parameter in state.parameters}
    # The Module's loss on the next batch, at these parameters (its forward, before any update).
    next_loss = float(module(*batch(MODULE_STEPS)))
    module.lazy_reset_grad()
    return {
        "model": model,
        "artifacts": artifacts,
        "module": module,
        "optimizer": optimizer,
        "state": state,
        "with_state": with_state,
        "params_only": params_only,
        "parameters": parameters,
        "next_loss": next_loss,
    }


def continue_training(trainer: Trainer) -> list[float]:
    """CONTINUED_STEPS steps on one fixed batch: the loss must go down."""
    x, y = batch(MODULE_STEPS + 1)
    return [trainer.step(x, target=y) for _ in range(CONTINUED_STEPS)]


def test_parameters_moments_and_step_carry_over(module_run: dict) -> None:
    trainer = Trainer.from_onnxruntime_training_checkpoint(
        module_run["model"], module_run["with_state"], loss=losses.Loss.cross_entropy(), lr=LR, threads=1
    )
    # The default optimizer: torch's AdamW with OptimType.AdamW's hyperparameters and initial lr.
    assert trainer.spec.optimizer == optimizers.AdamW(lr=1e-3, eps=1e-6, weight_decay=0.0)
    assert set(trainer.signature.params) == set(module_run["parameters"])
    for name, value in trainer.parameters.items():
        assert value.dtype == module_run["parameters"][name].dtype
        np.testing.assert_array_equal(value, module_run["parameters"][name], err_msg=name, strict=True)
    content = read_onnxruntime_training_checkpoint(module_run["with_state"])
    for name, slots in trainer.optimizer_state.items():
        np.testing.assert_array_equal(slots["exp_avg"], content.moments[name]["momentum0"], err_msg=name, strict=True)
        np.testing.assert_array_equal(
            slots["exp_avg_sq"], content.moments[name]["momentum1"], err_msg=name, strict=True
        )
        assert np.any(slots["exp_avg"] != 0), f"{name}: the moments were trained, they cannot be zeros"
    assert trainer.global_step == MODULE_STEPS
    report = trainer.last_import
    assert report is not None
    assert report.global_step == MODULE_STEPS
    assert report.properties == {"epoch": 2}
    assert all(slots == ("exp_avg", "exp_avg_sq") for slots in report.optimizer_state.values())
    assert any("Hugging Face" in note for note in report.not_carried)

    # Same parameters, same kernels: the same loss on the next batch as the Module computes.
    first = trainer.evaluate(*batch(MODULE_STEPS)[:1], target=batch(MODULE_STEPS)[1])
    np.testing.assert_allclose(first, module_run["next_loss"], rtol=1e-5)
    trajectory = continue_training(trainer)
    assert trainer.global_step == MODULE_STEPS + CONTINUED_STEPS
    assert trajectory[-1] < 0.95 * trajectory[0], trajectory


def test_the_next_update_is_torch_adamw_where_the_module_does_hf_adamw(module_run: dict) -> None:
    """Both continue from the same parameters and moments; the update rules differ, as documented.

    From the Module's gradient g on the next batch and the checkpoint's moments: the Trainer's
    parameters follow torch's AdamW, the Module's the Hugging Face rule (eps added to sqrt(v)
    before the bias correction of v).
    """
    trainer = Trainer.from_onnxruntime_training_checkpoint(
        module_run["model"], module_run["with_state"], loss=losses.Loss.cross_entropy(), lr=LR, threads=1
    )
    x, y = batch(MODULE_STEPS)
    trainer.step(x, target=y)
    state = ort_api.CheckpointState.load_checkpoint(str(module_run["with_state"]))
    module = ort_api.Module(
        str(module_run["artifacts"].training_model),
        state,
        str(module_run["artifacts"].eval_model),
        session_options=session_options(intra_op_num_threads=1),
    )
    optimizer = ort_api.Optimizer(str(module_run["artifacts"].optimizer_model), module)
    optimizer.set_learning_rate(LR)
    module.train()
    module(x, y)
    gradients = {name: parameter.grad.astype(np.float64) for name, parameter in state.parameters}
    optimizer.step()
    content = read_onnxruntime_training_checkpoint(module_run["with_state"])
    step = MODULE_STEPS + 1
    beta1, beta2, eps = 0.9, 0.999, 1e-6
    correction1, correction2 = 1 - beta1**step, 1 - beta2**step
    for name, value in trainer.parameters.items():
        before = module_run["parameters"][name].astype(np.float64)
        g = gradients[name]
        m = beta1 * content.moments[name]["momentum0"] + (1 - beta1) * g
        v = beta2 * content.moments[name]["momentum1"] + (1 - beta2) * g * g
        torch_rule = before - LR / correction1 * m / (np.sqrt(v) / np.sqrt(correction2) + eps)
        hf_rule = before - LR * np.sqrt(correction2) / correction1 * m / (np.sqrt(v) + eps)
        scale = float(np.max(np.abs(torch_rule - before)))
        np.testing.assert_allclose(value, torch_rule, rtol=0, atol=1e-3 * scale, err_msg=f"{name}: Trainer vs torch")
        np.testing.assert_allclose(
            state.parameters[name].data, hf_rule, rtol=0, atol=1e-3 * scale, err_msg=f"{name}: Module vs HF"
        )


def test_live_checkpoint_state_into_a_trained_trainer(module_run: dict) -> None:
    """A CheckpointState object loads too, over a trainer that already trained (its buffers exist)."""
    trainer = Trainer(
        build_classifier(HIDDEN_SIZE, seed=1),
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.AdamW(lr=LR, eps=1e-6, weight_decay=0.0),
        threads=1,
    )
    for step in range(3):
        trainer.step(*batch(50 + step)[:1], target=batch(50 + step)[1])
    report = trainer.load_onnxruntime_training_checkpoint(module_run["state"])
    assert report.global_step == trainer.global_step == MODULE_STEPS
    for name, value in trainer.parameters.items():
        np.testing.assert_array_equal(value, module_run["parameters"][name], err_msg=name, strict=True)
    trajectory = continue_training(trainer)
    assert trajectory[-1] < 0.95 * trajectory[0], trajectory


def test_checkpoint_without_optimizer_state(module_run: dict) -> None:
    trainer = Trainer.from_onnxruntime_training_checkpoint(
        module_run["model"],
        module_run["params_only"],
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.AdamW(lr=LR, eps=1e-6, weight_decay=0.0),
        threads=1,
    )
    for name, value in trainer.parameters.items():
        np.testing.assert_array_equal(value, module_run["parameters"][name], err_msg=name, strict=True)
    assert trainer.global_step == 0
    assert all(not np.any(slot) for slots in trainer.optimizer_state.values() for slot in slots.values())
    assert any("include_optimizer_state=True" in note for note in trainer.last_import.not_carried)
    trajectory = continue_training(trainer)
    assert trajectory[-1] < 0.95 * trajectory[0], trajectory


def test_sgd_takes_the_parameters_and_step_only(module_run: dict) -> None:
    trainer = Trainer.from_onnxruntime_training_checkpoint(
        module_run["model"],
        module_run["with_state"],
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.SGD(lr=0.5),
        threads=1,
    )
    assert trainer.global_step == MODULE_STEPS
    assert trainer.last_import.optimizer_state == {}
    assert any("SGD here does not keep them" in note for note in trainer.last_import.not_carried)


def test_refuses_a_checkpoint_of_another_model(module_run: dict) -> None:
    other = Trainer(
        build_classifier(HIDDEN_SIZE + 1, seed=0),
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.AdamW(),
        threads=1,
    )
    with pytest.raises(ValueError, match=r"'lstm\.[WRB]' is float32 \[.*\] in the checkpoint, the model expects"):
        other.load_onnxruntime_training_checkpoint(module_run["with_state"])
    narrower = Trainer(
        module_run["model"],
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.AdamW(),
        requires_grad=["head.weight", "head.bias"],
        threads=1,
    )
    with pytest.raises(ValueError, match="which this trainer keeps constant"):
        narrower.load_onnxruntime_training_checkpoint(module_run["with_state"])
    with pytest.raises(FileNotFoundError, match="save_checkpoint writes one"):
        narrower.load_onnxruntime_training_checkpoint(module_run["with_state"].parent / "missing")


def test_importing_the_trainer_imports_no_onnxruntime(module_run: dict) -> None:
    """Reading a checkpoint imports onnxruntime; importing ortlstm.training does not.

    (onnxruntime-training's ``import onnxruntime`` imports onnxruntime.training and torch too.)
    """
    code = (
        "import sys\n"
        "from ortlstm.training import read_onnxruntime_training_checkpoint\n"
        "assert 'onnxruntime' not in sys.modules and 'torch' not in sys.modules\n"
        f"content = read_onnxruntime_training_checkpoint({str(module_run['with_state'])!r})\n"
        f"assert content.step == {MODULE_STEPS}, content.step\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=module_run["with_state"].parent
    )
    assert result.returncode == 0, result.stderr
