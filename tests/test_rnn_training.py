"""nn.RNN models exported with torch.onnx.export's three flavours train through the Trainer as torch trains them.

tests/recordings/record_rnn.py trained each model in torch (2 layers; tanh and relu; uni- and
bidirectional; batch_first and not; SGD with momentum, Adam), exported by torch.onnx.export with
dynamo (its defaults, and optimize=False: nn.RNN unrolled into MatMul/Add/Tanh or Relu) or
TorchScript (two ONNX RNN nodes), and recorded every parameter after every step. Here, without
torch, ``Trainer(model, loss=..., optimizer=...)`` (an ONNX RNN node becomes RNNTraining, its
gradient RNNGrad) replays the same batches; every parameter must equal torch's after every step,
to float32 tolerance.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from test_gru_training import _load, follows_torch, gradients_equal_torch

from ortlstm.graphs.autodiff import registry
from ortlstm.graphs.convert_rnn import convert_rnns

RECORDINGS = sorted((Path(__file__).parent / "recordings" / "rnn").glob("*.npz"))


def test_recordings_exist() -> None:
    assert len(RECORDINGS) >= 5, "run tests/recordings/record_rnn.py (needs torch) to record them"
    exporters = {_load(path)[0]["exporter"] for path in RECORDINGS}
    assert exporters == {"dynamo", "dynamo_unoptimized", "torchscript"}


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_trainer_follows_torch_after_every_step(path: Path) -> None:
    config, model, arrays = _load(path)
    assert sum(node.op_type == "RNN" for node in model.graph.node) == config["rnn_nodes"]
    follows_torch(config, model, arrays)


def _torchscript(nonlinearity: str = "") -> Path:
    return next(path for path in RECORDINGS if path.stem.endswith("torchscript-SGD") and nonlinearity in path.stem)


def test_convert_rnns_keeps_outputs_and_names_hall() -> None:
    _, model, _ = _load(_torchscript())
    converted = convert_rnns(model)
    rnns = [node for node in converted.graph.node if node.op_type == "RNNTraining"]
    originals = [node for node in model.graph.node if node.op_type == "RNN"]
    assert len(rnns) == len(originals) == 2
    for rnn, original in zip(rnns, originals, strict=True):
        assert rnn.domain == "ortlstm"
        kept = [name or rnn.output[index] for index, name in enumerate(original.output)]
        assert list(rnn.output[: len(original.output)]) == kept
        assert all(rnn.output), "every output (HAll, which RNNGrad reads) is named"


def test_an_unconverted_rnn_names_the_conversion() -> None:
    hint = registry.missing_rule_hint("", "RNN")
    assert hint is not None and "convert_rnns" in hint


def test_onnxruntime_training_artifacts_differentiate_the_rnn_as_torch(tmp_path: Path) -> None:
    """The onnxruntime-training 1.19.2 path: generate_artifacts registers RNNGrad for RNNTraining.

    The recording's first step is SGD with momentum from a zero buffer, p1 = p0 - lr * grad, so torch's
    gradient is (p0 - p1) / lr; the Module's must equal it. Only where onnxruntime-training is installed.
    """
    ort_artifacts = pytest.importorskip("onnxruntime.training.artifacts")
    from ortlstm import graphs

    config, model, arrays = _load(_torchscript("relu_uni"))
    artifacts = graphs.generate_artifacts(model, loss=ort_artifacts.LossType.MSELoss, artifact_directory=tmp_path)
    training_model = onnx.load(str(artifacts.training_model))
    ortlstm_ops = {node.op_type for node in training_model.graph.node if node.domain == "ortlstm"}
    assert ortlstm_ops == {"RNNTraining", "RNNGrad"}
    gradients_equal_torch(artifacts, config, model, arrays)
