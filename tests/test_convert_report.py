"""Converting what exporters and tools write, and saying what happened.

``convert_with_report`` (and ``ortlstm convert``) names every converted LSTM and where it sits,
also inside ``If`` branches; quantized LSTMs are refused with the way to train them (dequantized);
the onnxruntime-training path refuses up front what its generator would fail on deep inside; and
the per-activation alpha/beta lists other exporters write convert and compute what onnxruntime's
LSTM computes.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortlstm.ops
from ortlstm import __main__ as cli
from ortlstm.graphs import generate_artifacts
from ortlstm.graphs.convert import MAIN_GRAPH, convert_with_report

HIDDEN, INPUT = 2, 3


def _lstm(name: str, x: str, **attributes: object) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    rng = np.random.default_rng(len(name))
    weights = [
        numpy_helper.from_array((0.5 * rng.standard_normal((1, 4 * HIDDEN, INPUT))).astype(np.float32), f"{name}_W"),
        numpy_helper.from_array((0.5 * rng.standard_normal((1, 4 * HIDDEN, HIDDEN))).astype(np.float32), f"{name}_R"),
    ]
    node = helper.make_node(
        "LSTM", [x, f"{name}_W", f"{name}_R"], ["", f"{name}_Y_h"], name=name, hidden_size=HIDDEN, **attributes
    )
    return node, weights


def _model_with_lstms_in_if_branches() -> onnx.ModelProto:
    """Main graph: one LSTM; an If whose branches hold one LSTM each (as some shipped models do)."""
    main_lstm, main_weights = _lstm("encoder", "X")
    branches = []
    for branch in ("then", "else"):
        node, weights = _lstm(f"{branch}_lstm", "X")
        out = helper.make_tensor_value_info(f"{branch}_lstm_Y_h", TensorProto.FLOAT, None)
        branches.append(helper.make_graph([node], f"{branch}_graph", [], [out], initializer=weights))
    if_node = helper.make_node(
        "If", ["cond"], ["branch_Y_h"], name="select", then_branch=branches[0], else_branch=branches[1]
    )
    graph = helper.make_graph(
        [main_lstm, if_node],
        "main",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 1, INPUT]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("encoder_Y_h", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("branch_Y_h", TensorProto.FLOAT, None),
        ],
        initializer=main_weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_report_names_every_converted_node_and_where_it_sits() -> None:
    converted, nodes = convert_with_report(_model_with_lstms_in_if_branches())
    assert [(node.name, node.where) for node in nodes] == [
        ("encoder", MAIN_GRAPH),
        ("else_lstm", "main graph > If node 'select' else_branch"),  # helper.make_node sorts attributes
        ("then_lstm", "main graph > If node 'select' then_branch"),
    ]
    feeds = {"X": np.ones((3, 1, INPUT), np.float32), "cond": np.array(True)}
    session = ort.InferenceSession(converted.SerializeToString(), ortlstm.ops.session_options())
    original = ort.InferenceSession(_model_with_lstms_in_if_branches().SerializeToString())
    for actual, expected in zip(session.run(None, feeds), original.run(None, feeds), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_cli_convert_prints_every_node(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"  # type: ignore[operator]
    onnx.save(_model_with_lstms_in_if_branches(), str(source))
    assert cli.main(["convert", str(source), str(target)]) == 0
    out = capsys.readouterr().out
    assert f"{target}: 3 LSTM node(s) now run as ortlstm.LSTMTraining:" in out
    assert "'then_lstm' in main graph > If node 'select' then_branch" in out


def _quantized_model() -> onnx.ModelProto:
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        ["X", "W", "R"],
        ["Y"],
        name="qlstm",
        domain="com.microsoft",
        hidden_size=HIDDEN,
    )
    graph = helper.make_graph(
        [node],
        "quantized",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("X", "W", "R")],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )


def test_quantized_lstm_is_refused_with_how_to_train_it() -> None:
    expected = (
        r"'qlstm' in main graph\)\. convert rewrites float LSTMs only: the Trainer \(and `ortlstm train-step` / "
        r"`ortlstm fit`\) trains an int8 model as it is, its int8 weights dequantized into float32 parameters; "
        r"ortlstm\.graphs\.prepare\.dequantize_model\(model\) writes that float model"
    )
    with pytest.raises(ValueError, match=expected):
        convert_with_report(_quantized_model())


def _generate(model: onnx.ModelProto, **kwargs: object) -> None:
    generate_artifacts(model, loss=None, optimizer=None, artifact_directory="unused", **kwargs)


def test_artifacts_refuse_lstms_in_subgraphs() -> None:
    with pytest.raises(ValueError, match=r"LSTMs inside subgraphs or functions: 'else_lstm' in main graph > If"):
        _generate(_model_with_lstms_in_if_branches())


def test_artifacts_refuse_an_empty_requires_grad() -> None:
    model = _model_with_lstms_in_if_branches()
    del model.graph.node[1:]  # only the main graph's LSTM
    del model.graph.output[1:]
    with pytest.raises(ValueError, match="requires_grad is empty: there is nothing to train"):
        _generate(model, requires_grad=[])


def test_artifacts_refuse_several_outputs_without_the_loss_input() -> None:
    model = _model_with_lstms_in_if_branches()
    del model.graph.node[1:]
    model.graph.output[1].name = "encoder_Y_h_copy"
    model.graph.node.append(helper.make_node("Identity", ["encoder_Y_h"], ["encoder_Y_h_copy"]))
    with pytest.raises(ValueError, match=r"loss_input_names=\['encoder_Y_h'\] \(ortlstm artifacts: --loss-input"):
        _generate(model)


@pytest.mark.parametrize(
    ("activations", "alpha", "beta"),
    [
        (["HardSigmoid", "ScaledTanh", "Affine"], [0.3, 1.2, 0.8], [0.45, 0.6, 0.1]),
        (["Sigmoid", "Tanh", "LeakyRelu"], [0.0, 0.0, 0.2], [0.0, 0.0, 0.0]),
    ],
)
def test_per_activation_alpha_beta_lists_convert(activations: list, alpha: list, beta: list) -> None:
    """One value per activation, as non-PyTorch exporters write: converted, same outputs as ORT's LSTM."""
    node, weights = _lstm("lstm", "X", activations=activations, activation_alpha=alpha, activation_beta=beta)
    graph = helper.make_graph(
        [node],
        "per_activation",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 1, INPUT])],
        [helper.make_tensor_value_info("lstm_Y_h", TensorProto.FLOAT, None)],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    converted, nodes = convert_with_report(model)
    assert [node.name for node in nodes] == ["lstm"]
    feeds = {"X": np.random.default_rng(0).standard_normal((3, 1, INPUT)).astype(np.float32)}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    actual = ort.InferenceSession(converted.SerializeToString(), ortlstm.ops.session_options()).run(None, feeds)[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
