"""nn.GRU models exported with torch.onnx.export's defaults train through the Trainer as torch trains them.

tests/recordings/record_gru.py trained each model in torch (2 layers; uni- and bidirectional;
batch_first and not; SGD with momentum, Adam), exported by each of torch.onnx.export's flavours
(dynamo with its defaults, dynamo with optimize=False, TorchScript), and recorded every parameter
after every step, in the layout the export holds it (torch's, or the GRU's ONNX layout it was
folded into). Here, without torch, ``Trainer(model, loss=...,
optimizer=...)`` (the ONNX GRU nodes become GRUTraining, their gradient GRUGrad) replays the same
batches; every parameter must equal torch's after every step, to float32 tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.autodiff import registry
from ortlstm.graphs.convert_gru import convert_grus
from ortlstm.training import Trainer

RECORDINGS = sorted((Path(__file__).parent / "recordings" / "gru").glob("*.npz"))
RTOL, ATOL = 1e-4, 2e-5  # float32 through a few steps, as test_train_step_parity's LSTMs
MIN_TRAINED_CHANGE = 1e-3


def _load(path: Path) -> tuple[dict, onnx.ModelProto, dict[str, np.ndarray]]:
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    config = json.loads(arrays.pop("config").tobytes().decode())
    return config, onnx.load_from_string(arrays.pop("model").tobytes()), arrays


def test_recordings_exist() -> None:
    assert len(RECORDINGS) >= 4, "run tests/recordings/record_gru.py (needs torch) to record them"


def follows_torch(config: dict, model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> None:
    """The Trainer's defaults replay the recorded batches; every parameter equals torch's after every step."""
    optimizer = optimizers.optimizer_from_torch(config["optimizer"]["name"], **config["optimizer"]["kwargs"])
    trainer = Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizer)
    assert set(trainer.signature.params) == set(config["trainable"])
    initial = trainer.parameters
    for step in range(config["steps"]):
        batch = {key.split("/")[-1]: value for key, value in arrays.items() if key.startswith(f"batch/{step}/")}
        loss = trainer.step(batch["x"], target=batch["target"])
        np.testing.assert_allclose(float(loss), arrays["losses"][step], rtol=RTOL, atol=ATOL, err_msg=f"loss {step}")
        for name, value in trainer.parameters.items():
            np.testing.assert_allclose(
                value,
                arrays[f"param/{name}"][step],
                rtol=RTOL,
                atol=ATOL,
                err_msg=f"{name} ({config['sources'][name]}) after step {step + 1}",
            )
    for name, value in trainer.parameters.items():
        assert np.max(np.abs(value - initial[name])) > MIN_TRAINED_CHANGE, f"{name} barely moved"


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_trainer_follows_torch_after_every_step(path: Path) -> None:
    config, model, arrays = _load(path)
    assert sum(node.op_type == "GRU" for node in model.graph.node) == 2
    follows_torch(config, model, arrays)


def test_convert_grus_keeps_outputs_and_names_the_stash() -> None:
    _, model, _ = _load(RECORDINGS[0])
    converted = convert_grus(model)
    grus = [node for node in converted.graph.node if node.op_type == "GRUTraining"]
    originals = [node for node in model.graph.node if node.op_type == "GRU"]
    assert len(grus) == len(originals) == 2
    for gru, original in zip(grus, originals, strict=True):
        assert gru.domain == "ortlstm"
        kept = [name or gru.output[index] for index, name in enumerate(original.output)]
        assert list(gru.output[: len(original.output)]) == kept
        assert all(gru.output), "every output (the ZRH stash included) is named for GRUGrad"


def test_an_unconverted_gru_names_the_conversion() -> None:
    hint = registry.missing_rule_hint("", "GRU")
    assert hint is not None and "convert_grus" in hint


def test_onnxruntime_training_artifacts_differentiate_the_gru_as_torch(tmp_path: Path) -> None:
    """The onnxruntime-training 1.19.2 path: generate_artifacts registers GRUGrad for GRUTraining.

    The recording's first step is SGD with momentum from a zero buffer, p1 = p0 - lr * grad, so torch's
    gradient is (p0 - p1) / lr; the Module's must equal it. Only where onnxruntime-training is installed.
    """
    ort_artifacts = pytest.importorskip("onnxruntime.training.artifacts")
    from ortlstm import graphs

    path = next(path for path in RECORDINGS if path.stem.endswith("-dynamo-SGD"))
    config, model, arrays = _load(path)
    artifacts = graphs.generate_artifacts(model, loss=ort_artifacts.LossType.MSELoss, artifact_directory=tmp_path)
    training_model = onnx.load(str(artifacts.training_model))
    ortlstm_ops = {node.op_type for node in training_model.graph.node if node.domain == "ortlstm"}
    assert ortlstm_ops == {"GRUTraining", "GRUGrad"}
    gradients_equal_torch(artifacts, config, model, arrays)


def gradients_equal_torch(artifacts: Any, config: dict, model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> None:
    """The artifacts' Module gives the first step's loss and torch's gradients, (p0 - p1) / lr (SGD's first step)."""
    from ortlstm import graphs

    module, _, state = graphs.open_training(artifacts, intra_op_num_threads=1)
    module.train()
    loss = module(arrays["batch/0/x"], arrays["batch/0/target"])
    np.testing.assert_allclose(float(loss), arrays["losses"][0], rtol=RTOL, atol=ATOL)
    lr = config["optimizer"]["kwargs"]["lr"]
    initial = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
    for name in config["trainable"]:
        torch_grad = (initial[name] - arrays[f"param/{name}"][0]) / lr
        np.testing.assert_allclose(state.parameters[name].grad, torch_grad, rtol=RTOL, atol=ATOL, err_msg=name)
