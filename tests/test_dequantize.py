"""int8 models fine-tune (issue 32): quantize_dynamic's patterns become float ops with float32 parameters.

A float model (a bidirectional LSTM, a MatMul head, a Conv) is quantized by
onnxruntime.quantization.quantize_dynamic itself, per tensor and per channel. The oracles, none of
them the rewrite under test:

- the float weights it was quantized from: each dequantized weight is within half a quantization
  step of them, and equal to NumPy's ``(q - zero_point) * scale`` of the int8 initializers;
- onnxruntime running the int8 model: the float forward is within the bound the activations'
  quantization step gives (one LSTM step, so that the bound is exact, and the ops after it);
- the float model carrying NumPy's dequantized weights, trained by the Trainer: training the int8
  model is training it, and its exports (float32, and int8 again) run in onnxruntime without ortlstm.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from test_cli import ortlstm_cli

from ortlstm import fit as fitting
from ortlstm.demo import build_classifier
from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.prepare import dequantize_model
from ortlstm.graphs.prepare.dequantize import Quantization, quantization_of
from ortlstm.training import Trainer

INPUT, HIDDEN, DIRECTIONS, CLASSES = 6, 5, 2, 3


def _float_model(rng: np.random.Generator) -> onnx.ModelProto:
    """x [T, N, 6] -> bidirectional LSTM (H=5) -> Y -> flattened -> MatMul + Add -> out; img -> Conv -> c."""
    weights = {
        "W": rng.normal(size=(DIRECTIONS, 4 * HIDDEN, INPUT)) * 0.3,
        "R": rng.normal(size=(DIRECTIONS, 4 * HIDDEN, HIDDEN)) * 0.3,
        "B": rng.normal(size=(DIRECTIONS, 8 * HIDDEN)) * 0.1,
        "fcW": rng.normal(size=(DIRECTIONS * HIDDEN, CLASSES)),
        "fcB": rng.normal(size=(CLASSES,)),
        "convW": rng.normal(size=(4, 1, 3, 3)),
        "convB": rng.normal(size=(4,)),
    }
    initializers = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "shape"))
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], hidden_size=HIDDEN, direction="bidirectional"),
        helper.make_node("Transpose", ["Y"], ["Y_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["Y_t", "shape"], ["Y_flat"]),
        helper.make_node("MatMul", ["Y_flat", "fcW"], ["product"]),
        helper.make_node("Add", ["product", "fcB"], ["out"]),
        helper.make_node("Conv", ["img", "convW", "convB"], ["c"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "int8_source",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "N", INPUT]),
            helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 1, 8, 8]),
        ],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, None),
        ],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _quantized(
    model: onnx.ModelProto, folder: Path, per_channel: bool, weight_type: QuantType = QuantType.QInt8
) -> onnx.ModelProto:
    source, target = folder / "float.onnx", folder / "int8.onnx"
    onnx.save(model, str(source))
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's advice to pre-process, on every call
    quantize_dynamic(source, target, per_channel=per_channel, weight_type=weight_type)
    return onnx.load(str(target))


# quantize_dynamic's default (int8 weights, per tensor), per channel, and the older default (uint8 weights:
# ddddocr's MatMulInteger and ConvInteger; the LSTM's are int8 whatever the option).
QUANTIZATIONS = {
    "per_tensor": (False, QuantType.QInt8),
    "per_channel": (True, QuantType.QInt8),
    "uint8": (False, QuantType.QUInt8),
}


@pytest.fixture(scope="module", params=list(QUANTIZATIONS))
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(the float model, its int8 quantization, NumPy's dequantization of the int8 weights by name)."""
    float_model = _float_model(np.random.default_rng(0))
    int8 = _quantized(float_model, tmp_path_factory.mktemp("int8"), *QUANTIZATIONS[request.param])
    return float_model, int8, _numpy_dequantized(int8)


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def _numpy_dequantized(int8: onnx.ModelProto) -> dict[str, np.ndarray]:
    """(q - zero_point) * scale of each int8 weight, in the float op's layout: the reference."""
    values = _initializers(int8)
    result = {}
    for name in ("W", "R"):  # DynamicQuantizeLSTM: [D, in, 4H], a scale per direction [D] or per gate row [D, 4H]
        q, scale, zero = (values[f"{name}_{suffix}"] for suffix in ("quantized", "scale", "zero_point"))
        scale, zero = (v.reshape(DIRECTIONS, 1, -1).astype(np.float32) for v in (scale, zero))
        result[name] = ((q.astype(np.float32) - zero) * scale).transpose(0, 2, 1)
    for name, shape in (("fcW", (1, -1)), ("convW", (-1, 1, 1, 1))):  # per column / per output channel
        q, scale, zero = (values[f"{name}_{suffix}"] for suffix in ("quantized", "scale", "zero_point"))
        result[name] = (q.astype(np.float32) - zero.reshape(shape)) * scale.reshape(shape)
    return result


def _plain(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Onnxruntime without the ortlstm library (onnxruntime < 1.20 runs ConvInteger on uint8 weights only)."""
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's NotImplemented
        if "ConvInteger" not in str(error) or not ort.__version__.startswith("1.19."):
            raise
        pytest.skip(f"onnxruntime {ort.__version__} has no ConvInteger for int8 weights")
    return dict(zip([value.name for value in model.graph.output], session.run(None, feeds), strict=True))


def _with_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for init in result.graph.initializer:
        if init.name in weights:
            init.CopyFrom(numpy_helper.from_array(weights[init.name].astype(np.float32), init.name))
    return result


def test_dequantized_weights_are_the_int8_values_within_half_a_step_of_the_float_ones(models: tuple) -> None:
    float_model, int8, reference = models
    dequantized, made = dequantize_model(int8)
    assert {item.name: item.quantized for item in made} == {name: f"{name}_quantized" for name in reference}
    values, original = _initializers(dequantized), _initializers(float_model)
    int8_values = _initializers(int8)
    for name, expected in reference.items():
        np.testing.assert_array_equal(values[name], expected)
        step = int8_values[f"{name}_scale"].max()
        assert np.abs(values[name] - original[name]).max() <= step / 2 * (1 + 1e-6), name
    assert {node.domain for node in dequantized.graph.node} == {""}
    assert quantization_of(int8) == Quantization(per_channel=int8_values["W_scale"].ndim == 2)
    assert not any(node.op_type.endswith("Integer") or "Quantize" in node.op_type for node in dequantized.graph.node)
    onnx.checker.check_model(dequantized, full_check=True)


def _lstm_step_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """|Y_float - Y_int8| over one LSTM step from zero states, x quantized to uint8 over its range.

    The gates' pre-activations move by at most step/2 * sum|W row| (h0 = 0 is exact), sigmoid by a
    quarter of that, tanh by as much; c = i * g and h = o * tanh(c) then bound the output.
    """
    step = (max(x.max(), 0.0) - min(x.min(), 0.0)) / 255.0
    moves = step / 2 * np.abs(w).sum(axis=2)  # [D, 4H]: per gate unit, ONNX's order i, o, f, c
    i, o, _, g = (moves[:, k * HIDDEN : (k + 1) * HIDDEN] for k in range(4))
    cell = i / 4 + g + i / 4 * g
    return o / 4 + cell + o / 4 * cell  # [D, H]


def test_float_forward_is_the_int8_one_within_the_activation_rounding(models: tuple) -> None:
    _, int8, reference = models
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(1, 4, INPUT)).astype(np.float32), "img": rng.normal(size=(2, 1, 8, 8))}
    feeds["img"] = feeds["img"].astype(np.float32)
    dequantized = _plain(dequantize_model(int8)[0], feeds)
    quantized = _plain(int8, feeds)
    slack = 1e-5  # float32 sums and onnxruntime's activations
    lstm_bound = _lstm_step_bound(feeds["x"], reference["W"])[None, :, None, :]
    assert np.all(np.abs(dequantized["Y"] - quantized["Y"]) <= lstm_bound + slack)
    image_step = (max(feeds["img"].max(), 0) - min(feeds["img"].min(), 0)) / 255.0
    conv_bound = image_step / 2 * np.abs(reference["convW"]).sum(axis=(1, 2, 3))
    assert np.all(np.abs(dequantized["c"] - quantized["c"]) <= conv_bound[None, :, None, None] + slack)
    y = quantized["Y"]  # the head's input moves by the LSTM's bound and is quantized again
    head_step = (max(y.max(), 0) - min(y.min(), 0)) / 255.0
    head_bound = (lstm_bound.max() + head_step / 2) * np.abs(reference["fcW"]).sum(axis=0)
    assert np.all(np.abs(dequantized["out"] - quantized["out"]) <= head_bound + slack)
    assert np.abs(dequantized["out"] - quantized["out"]).max() > 0  # int8 arithmetic really ran


def _trainer(model: onnx.ModelProto) -> Trainer:
    return Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam(lr=0.01), output="out")


def _batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.normal(size=(5, 3, INPUT)).astype(np.float32)
    return x, rng.normal(size=(2, 1, 8, 8)).astype(np.float32), rng.normal(size=(5, 3, CLASSES)).astype(np.float32)


def _step_alike(trainers: list[Trainer], rng: np.random.Generator) -> None:
    """Three steps of each trainer on the same batches: the int8 and the float model's losses agree."""
    for _ in range(3):
        x, img, target = _batch(rng)
        losses_ = [trainer.step(x, img, target=target) for trainer in trainers]
        np.testing.assert_allclose(losses_[0], losses_[1], rtol=1e-6)


def test_training_the_int8_model_is_training_its_dequantized_float_model(models: tuple, tmp_path: Path) -> None:
    float_model, int8, reference = models
    trainers = [_trainer(int8), _trainer(_with_weights(float_model, reference))]
    _step_alike(trainers, np.random.default_rng(2))
    trained, expected = (trainer.parameters for trainer in trainers)
    assert set(trained) == set(expected) == {"W", "R", "B", "fcW", "fcB"}  # the Conv does not reach "out"
    for name, value in expected.items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.abs(trained["W"] - reference["W"]).max() > 1e-3  # it trained
    summary = trainers[0].summary()
    assert "dequantized from int8 to float32 (export(path, quantize='dynamic') writes int8 again):" in summary
    assert "  W <- int8 W_quantized of '(unnamed)' (com.microsoft::DynamicQuantizeLSTM) input 1, per " in summary
    assert "  fcW <- int8 fcW_quantized of '(unnamed)' (MatMulInteger) input 1, per " in summary
    _check_exports(trainers[0], int8, trained, tmp_path)


def _check_exports(trainer: Trainer, int8: onnx.ModelProto, trained: dict, folder: Path) -> None:
    """The float32 export holds the trained weights; the int8 one is them quantized as quantize_dynamic does."""
    rng = np.random.default_rng(3)
    x, img, _ = _batch(rng)
    float_export = trainer.export(folder / "trained.onnx")
    assert onnx.load(str(folder / "trained.onnx")) == float_export
    assert {node.domain for node in float_export.graph.node} == {""}
    values = _initializers(float_export)
    for name, value in trained.items():
        np.testing.assert_array_equal(values[name], value)
    (prediction,) = trainer.evaluate(x, img, target=np.zeros((5, 3, CLASSES), np.float32), outputs=["out"])[1:]
    np.testing.assert_allclose(_plain(float_export, {"x": x, "img": img})["out"], prediction, rtol=1e-5, atol=1e-5)

    requantized = trainer.export(folder / "trained_int8.onnx", quantize="dynamic")
    assert quantization_of(requantized) == quantization_of(int8)  # quantized as the shipped model was
    assert sorted((n.domain, n.op_type) for n in requantized.graph.node) == sorted(
        (n.domain, n.op_type) for n in int8.graph.node
    )
    # Its int8 weights are the trained ones within half a step: quantized from them, not from the shipped ones.
    steps, back = _initializers(requantized), _initializers(dequantize_model(requantized)[0])
    for name in ("W", "R", "fcW"):
        assert np.abs(back[name] - trained[name]).max() <= steps[f"{name}_scale"].max() / 2 * (1 + 1e-6), name
    if not ort.__version__.startswith("1.19."):  # 1.19 has no ConvInteger for int8 weights (quantize_dynamic's)
        assert _plain(requantized, {"x": x, "img": img})["out"].shape == prediction.shape


def test_export_refuses_another_quantization(models: tuple) -> None:
    _, int8, _ = models
    expected = r"^export: quantize='static'; pass None \(float32, the default\) or 'dynamic'$"
    with pytest.raises(ValueError, match=expected):
        _trainer(int8).export(quantize="static")


def test_an_int8_weight_that_is_not_an_initializer_is_refused_by_name(models: tuple) -> None:
    _, int8, _ = models
    model = onnx.ModelProto()
    model.CopyFrom(int8)
    weight = next(init for init in model.graph.initializer if init.name == "R_quantized")
    model.graph.input.append(helper.make_tensor_value_info("R_quantized", weight.data_type, list(weight.dims)))
    model.graph.initializer.remove(weight)
    with pytest.raises(ValueError, match=r"\(com.microsoft::DynamicQuantizeLSTM\): its input 2 \(the int8 weight\)"):
        _trainer(model)


def test_cli_trains_the_int8_model_and_exports_it_as_int8(tmp_path: Path) -> None:
    onnx.save(_quantized(_float_model(np.random.default_rng(0)), tmp_path, False), str(tmp_path / "int8.onnx"))
    step = ortlstm_cli(
        "train-step", "int8.onnx", "--out", "run", "--loss", "mse_loss", "--optimizer", "adam", "--output", "out",
        cwd=tmp_path,
    )  # fmt: skip
    assert step.returncode == 0, step.stderr
    assert "dequantized from int8 to float32 (export(path, quantize='dynamic') writes int8 again):" in step.stdout
    exported = ortlstm_cli("export", "run", "--out", "trained.onnx", "--quantize", "dynamic", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    kind = "int8, onnxruntime.quantization.quantize_dynamic"
    assert exported.stdout == f"trained.onnx: the original model with the trained parameters ({kind})\n"
    ops = {(node.domain, node.op_type) for node in onnx.load(str(tmp_path / "trained.onnx")).graph.node}
    assert {("com.microsoft", "DynamicQuantizeLSTM"), ("", "MatMulInteger"), ("", "ConvInteger")} <= ops
    refused = ortlstm_cli("export", "run", "--out", "trained.onnx", "--quantize", "static", cwd=tmp_path)
    assert refused.returncode == 2
    assert re.search(r"argument --quantize: invalid choice: 'static' \(choose from '?dynamic'?\)", refused.stderr)


def test_fit_trains_an_int8_classifier_and_exports_it_int8(tmp_path: Path) -> None:
    """``ortlstm fit``'s loop with ``--quantize dynamic``: the demo's digit classifier, quantized, then fitted."""
    int8 = _quantized(build_classifier(8, seed=0), tmp_path, False)
    trainer = Trainer(int8, loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(lr=0.02), threads=1)
    rng = np.random.default_rng(4)
    data = {"pixels": rng.uniform(0, 1, (12, 8, 8)).astype(np.float32), "target": rng.integers(0, 10, 12)}
    out = tmp_path / "fitted.onnx"
    fitting.fit(trainer, data, model=int8, epochs=1, batch_size=6, out=out, quantize="dynamic", log=lambda line: None)
    assert {"DynamicQuantizeLSTM", "MatMulInteger"} <= {node.op_type for node in onnx.load(str(out)).graph.node}
    with pytest.raises(ValueError, match=r"^quantize='int4': pass None \(float32, the default\) or 'dynamic'$"):
        fitting.fit(trainer, data, model=int8, epochs=1, batch_size=6, out=out, quantize="int4")


def test_an_optimized_sessions_dynamic_quantize_matmul_is_a_matmul_plus_bias() -> None:
    """com.microsoft DynamicQuantizeMatMul (what an optimized session saves) -> MatMul + Add, per column scales."""
    rng = np.random.default_rng(5)
    weight = rng.integers(-127, 128, (6, 4)).astype(np.int8)
    scale, zero = rng.uniform(0.01, 0.02, 4).astype(np.float32), np.zeros(4, np.int8)
    bias = rng.normal(size=4).astype(np.float32)
    initializers = [numpy_helper.from_array(v, n) for n, v in (("B", weight), ("s", scale), ("z", zero), ("b", bias))]
    node = helper.make_node("DynamicQuantizeMatMul", ["A", "B", "s", "z", "b"], ["Y"], domain="com.microsoft")
    graph = helper.make_graph(
        [node],
        "fused",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 4])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    dequantized, made = dequantize_model(model)
    assert [(n.op_type, n.domain) for n in dequantized.graph.node] == [("MatMul", ""), ("Add", "")]
    assert [(item.name, item.scale) for item in made] == [("B_1", "per channel")]  # "B" is the int8 one
    a = rng.normal(size=(3, 6)).astype(np.float32)
    expected = a @ (weight.astype(np.float32) * scale) + bias
    np.testing.assert_allclose(_plain(dequantized, {"A": a})["Y"], expected, rtol=1e-5, atol=1e-6)
    a_step = (max(a.max(), 0) - min(a.min(), 0)) / 255.0  # onnxruntime's int8 kernel: A quantized to uint8
    bound = a_step / 2 * np.abs(weight.astype(np.float32) * scale).sum(axis=0) + 1e-5
    assert np.all(np.abs(_plain(model, {"A": a})["Y"] - expected) <= bound)


def test_static_quantization_is_refused_with_what_to_do() -> None:
    """QuantizeLinear -> DequantizeLinear (static QDQ) on the way: integer values cut the gradient, and it says so."""
    initializers = [
        numpy_helper.from_array(np.ones((3, 2), np.float32), "W"),
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        numpy_helper.from_array(np.array(128, np.uint8), "z"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "s", "z"], ["q"], name="quant"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequant"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    expected = (
        r"^no float initializer of the model reaches the loss \(candidates: \['W'\]\); nothing to train\. The model "
        r"computes in int8 \('quant' \(QuantizeLinear\)\): int8 ops have no gradient\. ortlstm dequantizes the "
        r"patterns onnxruntime\.quantization\.quantize_dynamic writes .* train the float model it was quantized from"
    )
    with pytest.raises(ValueError, match=expected):
        Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(lr=0.1))


def test_a_stateful_int8_model_carries_its_dequantized_lstms_state(models: tuple, tmp_path: Path) -> None:
    """stateful=True on an int8 model is stateful training of its dequantized float model.

    It was refused: the DynamicQuantizeLSTM was looked at before the dequantize rewrite made it an LSTM.
    """
    float_model, int8, reference = models
    trainers = [
        Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.Adam(lr=0.01), output="out", stateful=True)
        for model in (int8, _with_weights(float_model, reference))
    ]
    _step_alike(trainers, np.random.default_rng(4))
    carried, expected = (trainer.carried_state for trainer in trainers)
    assert [name.rsplit(".", 1)[1] for name in carried] == ["initial_h", "initial_c"]  # the node's name differs
    for name, value, float_value in zip(carried, carried.values(), expected.values(), strict=True):
        assert value.shape == (DIRECTIONS, 3, HIDDEN) and np.abs(value).max() > 0
        np.testing.assert_allclose(value, float_value, rtol=1e-5, atol=1e-6, err_msg=name)
    resumed = Trainer.from_checkpoint(int8, trainers[0].save(tmp_path / "int8.safetensors"), threads=1)
    for name, value in carried.items():
        np.testing.assert_array_equal(resumed.carried_state[name], value)
