"""Trainer(precision=...), TrainingSpec.precision, train-step/fit --precision (issue 33).

"bf16-mixed" marks every GEMM kernel node of the training models matmul_precision="bfloat16" and
nothing else: parameters, optimizer state and the export stay float32. On a Conv model (ConvGrad
runs bfloat16) it trains, its gradients within bfloat16's rounding of float32's; an LSTM model trains
too (the recurrent ops run bf16 GEMMs), its losses within bfloat16's rounding of float32's.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_cli import lstm_model
from test_conv_grad import _conv_classifier

from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer

_X = np.random.default_rng(0).standard_normal((6, 2, 6, 6)).astype(np.float32)
_Y = np.array([0, 1, 3, 2, 1, 0])


def _trainer(precision: str, model: onnx.ModelProto | None = None) -> Trainer:
    return Trainer(model or _conv_classifier(), loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.5),
                   precision=precision)


def _attributes(model: onnx.ModelProto) -> dict[str, str]:
    return {
        node.op_type: onnx.helper.get_attribute_value(attribute).decode()
        for node in model.graph.node
        for attribute in node.attribute
        if attribute.name == "matmul_precision"
    }


def test_unknown_precision_is_refused_listing_both() -> None:
    with pytest.raises(ValueError, match=r"^precision must be") as error:
        _trainer("bf16")
    assert str(error.value) == (
        "precision must be '32-true' (float32, the default) or 'bf16-mixed' (bfloat16 GEMMs with float32 "
        "accumulation, weights and optimizer state, as torch.autocast on the CPU), got 'bf16'"
    )


def test_bf16_mixed_marks_the_gemm_kernels_only_and_float32_marks_nothing() -> None:
    mixed, full = _trainer("bf16-mixed"), _trainer("32-true")
    assert _attributes(mixed._models["train_step"]) == {"ConvGrad": "bfloat16"}
    assert _attributes(mixed._models["gradients"]) == {"ConvGrad": "bfloat16"}
    assert all(_attributes(model) == {} for model in full._models.values())
    assert mixed.spec.precision == "bf16-mixed"
    assert full.spec.precision == "32-true"


def test_conv_model_trains_in_bf16_within_rounding_of_float32() -> None:
    mixed, full = _trainer("bf16-mixed"), _trainer("32-true")
    mixed.accumulate(_X, target=_Y)
    full.accumulate(_X, target=_Y)
    got, reference = mixed.accumulated_gradients, full.accumulated_gradients
    # dW's products each carry two bfloat16 roundings (<= 2^-8 relative together), dB has none.
    np.testing.assert_array_equal(got["b"], reference["b"])
    error = np.linalg.norm(got["w"] - reference["w"]) / np.linalg.norm(reference["w"])
    assert 0 < error < 2.0**-7, error
    mixed.zero_grad()
    full.zero_grad()
    for _ in range(5):
        loss_mixed, loss_full = mixed.step(_X, target=_Y), full.step(_X, target=_Y)
    assert abs(float(loss_mixed) - float(loss_full)) < 2.0**-7 * abs(float(loss_full))
    for name, value in full.parameters.items():
        assert mixed.parameters[name].dtype == np.float32  # float32 master weights
        np.testing.assert_allclose(mixed.parameters[name], value, rtol=0, atol=2.0**-7 * np.abs(value).max())


def test_export_is_the_float32_model_with_standard_ops(tmp_path: Path) -> None:
    trainer = _trainer("bf16-mixed")
    trainer.step(_X, target=_Y)
    exported = trainer.export(tmp_path / "trained.onnx")
    assert {node.domain for node in exported.graph.node} == {""}
    assert _attributes(exported) == {}
    assert all(t.data_type == onnx.TensorProto.FLOAT for t in exported.graph.initializer)
    assert "bfloat16" not in str(exported).lower()


def test_checkpoint_of_other_precision_is_refused(tmp_path: Path) -> None:
    path = _trainer("bf16-mixed").save(tmp_path / "run.safetensors")
    with pytest.raises(ValueError, match="precision") as error:
        _trainer("32-true").load(path)
    assert "bf16-mixed" in str(error.value)
    _trainer("bf16-mixed").load(path)  # the same precision loads


def test_lstm_model_trains_with_bf16_mixed_near_float32(tmp_path: Path) -> None:
    model = lstm_model(tmp_path / "lstm.onnx", np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    target = rng.standard_normal((2, 2, 5)).astype(np.float32)

    def losses_of(precision: str) -> list[float]:
        trainer = Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(lr=0.5), precision=precision)
        return [float(trainer.step(x, target=target)) for _ in range(8)]

    mixed, full = losses_of("bf16-mixed"), losses_of("32-true")
    assert all(b < a for a, b in itertools.pairwise(mixed)) and mixed[-1] < 0.9 * mixed[0], mixed
    # Within bfloat16's rounding (2^-8 relative per GEMM operand) of float32, and not float32 itself.
    np.testing.assert_allclose(mixed, full, rtol=2e-2)
    assert mixed != full


def test_train_step_cli_writes_bf16_models(tmp_path: Path) -> None:
    onnx.save(_conv_classifier(), str(tmp_path / "conv.onnx"))
    out = tmp_path / "steps"
    result = subprocess.run(
        [sys.executable, "-m", "ortlstm", "train-step", str(tmp_path / "conv.onnx"), str(out), "--loss",
         "cross_entropy", "--optimizer", "sgd", "--lr", "0.1", "--precision", "bf16-mixed"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "training.json").read_text())["spec"]["precision"] == "bf16-mixed"
    assert _attributes(onnx.load(str(out / "train_step.onnx"))) == {"ConvGrad": "bfloat16"}
    bad = subprocess.run([sys.executable, "-m", "ortlstm", "train-step", str(tmp_path / "conv.onnx"),
                          str(tmp_path / "x"), "--loss", "cross_entropy", "--optimizer", "sgd", "--precision", "bf16"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "argument --precision: invalid choice: 'bf16' (choose from" in bad.stderr
