"""Tests of the graph builders in ``ortlstm.graphs``.

1. ``convert``: hand-built ONNX ``LSTM`` models (every input-slot count, omitted middle inputs,
   partially omitted outputs, two nodes of one name, control-flow subgraphs, model-local
   functions) give the same outputs after conversion as before, in onnxruntime; layout 1, which
   onnxruntime's own LSTM rejects, is compared with the float64 oracle. Each converted model also
   runs in ``onnx.reference.ReferenceEvaluator`` with the oracle as the ``LSTMTraining`` kernel.
   With torch: models written by ``torch.onnx.export``.
2. ``gradient_definition`` against the spec's ``gradient_of`` links and port names, and the
   ``LSTMGrad`` node onnxruntime-training builds from it (training build only).
3. ``build_gradient_model`` against the oracle's ``lstm_forward`` / ``lstm_backward``.
4. The onnxscript function ``lstm_with_gradients``: its wiring, and a model calling it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import io
import logging
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
import pytest
from configs import LstmConfig, config_by_id, config_id, context, sample_inputs
from lstm_helpers import LSTM_INPUT_NAMES, LSTM_OUTPUT_NAMES, assert_close, oracle_attributes
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnxruntime.capi.onnxruntime_pybind11_state import Fail as OrtFail
from reference.lstm_ref import lstm_backward, lstm_forward

from ortlstm import graphs
from ortlstm.graphs.functions import lstm_with_gradients
from ortlstm.graphs.ort_training.gradient import gradient_definition, register_gradient
from ortlstm.graphs.standalone import LstmGraphConfig, build_gradient_model
from ortlstm.ops import schema, session_options

HAS_TRAINING = importlib.util.find_spec("onnxruntime.training") is not None
needs_training = pytest.mark.skipif(
    not HAS_TRAINING, reason="needs onnxruntime-training (onnxruntime.training): pip install 'ortlstm[train]'"
)

# Both runtimes load these: onnxruntime-training 1.19 takes IR <= 10 and opset <= 21.
OPSET = 21
IR_VERSION = 10
MAX_IR_VERSION = 10

FLOAT32_RTOL = 1e-5  # float32 kernels vs onnxruntime's LSTM or the float64 oracle
FLOAT64_RTOL = 1e-12  # float64 kernels vs the float64 oracle

FORWARD, BACKWARD = schema.LSTM_TRAINING, schema.LSTM_GRAD
WEIGHTS = ("W", "R", "B", "P")  # initializers in the hand-built models; the other inputs are fed
# ONNX LSTM output -> LSTMTraining output of the same value.
TRAINING_OUTPUT = dict(zip(LSTM_OUTPUT_NAMES, ("HAll", "Ht", "Ct"), strict=True))
UPSTREAM = tuple(port.name for port in BACKWARD.inputs if port.gradient_of is not None)  # grad_HAll, ...
GRADIENT_OF = {port.name: port.gradient_of for port in BACKWARD.outputs}  # dX -> X, ...


def _float32_attribute(value: float) -> float:
    return float(np.float32(value))


# ---------------------------------------------------------------------------------------------
# Hand-built ONNX LSTM models


def _elem(name: str) -> int:
    return TensorProto.INT32 if name == "sequence_lens" else TensorProto.FLOAT


def _as_fed(name: str, value: np.ndarray) -> np.ndarray:
    return np.asarray(value, dtype=np.int32 if name == "sequence_lens" else np.float32)


def _output_shapes(config: LstmConfig) -> dict[str, list[int]]:
    t, b, d, h = config.seq_length, config.batch_size, config.num_directions, config.hidden_size
    if config.layout == 1:
        return {"Y": [b, t, d, h], "Y_h": [b, d, h], "Y_c": [b, d, h]}
    return {"Y": [t, d, b, h], "Y_h": [d, b, h], "Y_c": [d, b, h]}


def trailing_slots(config: LstmConfig, inputs: dict) -> list[str]:
    """The LSTM node's input list for the inputs a config has: absent ones "", trailing ones dropped."""
    slots = [name if inputs[name] is not None else "" for name in LSTM_INPUT_NAMES]
    while not slots[-1]:
        slots.pop()
    return slots


def lstm_model(
    config: LstmConfig,
    inputs: dict,
    slots: Sequence[str],
    outputs: Sequence[str] = LSTM_OUTPUT_NAMES,
    *,
    node_name: str = "lstm",
    attributes: dict | None = None,
    ir_version: int = IR_VERSION,
) -> onnx.ModelProto:
    """One ONNX LSTM node with input list ``slots`` and output list ``outputs`` ("" = omitted).

    W, R, B and P are initializers (as exporters write them); X, sequence_lens and the initial
    states are graph inputs. Graph outputs are the named node outputs.
    """
    present = [name for name in slots if name]
    node = helper.make_node(
        "LSTM",
        list(slots),
        list(outputs),
        name=node_name,
        **(config.attributes() if attributes is None else attributes),
    )
    initializers = [numpy_helper.from_array(_as_fed(name, inputs[name]), name) for name in present if name in WEIGHTS]
    graph_inputs = [
        helper.make_tensor_value_info(name, _elem(name), list(inputs[name].shape))
        for name in present
        if name not in WEIGHTS
    ]
    shapes = _output_shapes(config)
    graph_outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, shapes[port])
        for name, port in zip(outputs, LSTM_OUTPUT_NAMES, strict=False)
        if name
    ]
    graph = helper.make_graph([node], "lstm", graph_inputs, graph_outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=ir_version)


def feeds_for(model: onnx.ModelProto, values: dict) -> dict[str, np.ndarray]:
    return {value.name: _as_fed(value.name, values[value.name]) for value in model.graph.input}


def run_onnxruntime(model: onnx.ModelProto, feeds: dict, *, ortlstm_kernels: bool) -> dict[str, np.ndarray]:
    options = session_options() if ortlstm_kernels else ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [value.name for value in model.graph.output]
    return dict(zip(names, session.run(names, feeds), strict=True))


class LSTMTraining(OpRun):
    """``ortlstm::LSTMTraining`` for ``onnx.reference``: the float64 oracle."""

    op_domain = schema.DOMAIN

    def _run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, **attributes):
        attributes.pop("activations_csv", None)
        # The evaluator passes the registered schema's defaults once the ortlstm schemas are in onnx's
        # registry (which of the suite's tests does that first decides the order): only float32 is modelled.
        precision = attributes.pop("matmul_precision", None)
        assert precision in (None, "float32"), precision
        result = lstm_forward(X, W, R, B, sequence_lens, initial_h, initial_c, P, **attributes)
        return tuple(result[port.name].astype(X.dtype) for port in FORWARD.outputs)


def run_reference_evaluator(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """Runs ``model`` in ``onnx.reference`` with the oracle as LSTMTraining kernel.

    Model-local functions are inlined first: onnx 1.23's evaluator does not hand ``new_ops`` to
    the evaluators it builds for functions (it does for control-flow subgraphs).
    """
    evaluator = ReferenceEvaluator(onnx.inliner.inline_local_functions(model), new_ops=[LSTMTraining])
    names = [value.name for value in model.graph.output]
    return dict(zip(names, evaluator.run(names, feeds), strict=True))


def expected_outputs(config: LstmConfig, model: onnx.ModelProto, inputs: dict, slots: Sequence[str]) -> dict:
    """The original model's outputs: onnxruntime's LSTM, or the oracle for layout 1 (ORT rejects it)."""
    feeds = feeds_for(model, inputs)
    if config.layout == 0:
        return run_onnxruntime(model, feeds, ortlstm_kernels=False)
    node = model.graph.node[0]
    given = {name: inputs[name] for name in slots if name}
    result = lstm_forward(**given, **oracle_attributes(config))
    return {
        name: result[TRAINING_OUTPUT[port]] for name, port in zip(node.output, LSTM_OUTPUT_NAMES, strict=False) if name
    }


def check_converted_node(original: onnx.NodeProto, converted: onnx.NodeProto) -> None:
    """The contract of one converted node: full-length inputs, every output named, same attributes."""
    assert (converted.op_type, converted.domain) == (FORWARD.name, FORWARD.domain)
    assert converted.name, "a converted node has a name (gradient post-processing pairs nodes by it)"
    assert list(converted.input) == list(original.input) + [""] * (len(FORWARD.inputs) - len(original.input))
    assert len(converted.output) == len(FORWARD.outputs)
    assert all(converted.output), f"every output is named: {list(converted.output)}"
    assert len(set(converted.output)) == len(converted.output)
    for index, name in enumerate(original.output):
        if name:
            assert converted.output[index] == name, f"output {index} keeps its name {name!r}"
    before = {a.name: helper.get_attribute_value(a) for a in original.attribute}
    after = {a.name: helper.get_attribute_value(a) for a in converted.attribute}
    for name, value in before.items():
        assert after[name] == value, f"attribute {name}: {after[name]!r} != {value!r}"
    assert "hidden_size" in after
    if "activations" in before:
        assert after["activations_csv"] == b",".join(before["activations"])
    else:
        assert "activations_csv" not in after
    assert set(after) - set(before) <= {"hidden_size", "activations_csv"}


def check_converted_model(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    lstm = [node for node in original.graph.node if node.op_type == "LSTM"]
    training = [node for node in converted.graph.node if node.op_type == FORWARD.name]
    assert len(training) == len(lstm)
    assert not any(node.op_type == "LSTM" for node in converted.graph.node)
    for before, after in zip(lstm, training, strict=True):
        check_converted_node(before, after)
    assert [(entry.domain, entry.version) for entry in converted.opset_import if entry.domain == schema.DOMAIN] == [
        (schema.DOMAIN, schema.OPSET_VERSION)
    ]
    assert converted.ir_version <= MAX_IR_VERSION
    onnx.checker.check_model(converted, full_check=True)


def check_conversion(
    config: LstmConfig,
    inputs: dict,
    slots: Sequence[str],
    outputs: Sequence[str],
    what: str,
) -> None:
    """Converts a one-LSTM model and compares its outputs with the original's (or the oracle's)."""
    model = lstm_model(config, inputs, slots, outputs)
    original = model.SerializeToString()
    converted = graphs.convert(model)
    assert model.SerializeToString() == original, f"{what}: convert() modified its argument"
    check_converted_model(model, converted)
    feeds = feeds_for(model, inputs)
    expected = expected_outputs(config, model, inputs, slots)
    actual = run_onnxruntime(converted, feeds, ortlstm_kernels=True)
    assert set(actual) == set(expected)
    evaluated = run_reference_evaluator(converted, feeds)
    for name, value in expected.items():
        assert_close(actual[name].astype(np.float64), value.astype(np.float64), FLOAT32_RTOL, f"{what}: {name}")
        assert_close(
            evaluated[name].astype(np.float64),
            value.astype(np.float64),
            FLOAT32_RTOL,
            f"{what}: {name} (onnx.reference)",
        )


# ---------------------------------------------------------------------------------------------
# 1. convert()

# Every direction, layout 1, clip, input_forget, non-default activations (also in odd case),
# sequence_lens, peepholes, with and without bias and initial states.
CONVERT_CONFIGS = [
    config_by_id("T1_B1_I1_H1_forward"),
    config_by_id("T3_B2_I4_H3_forward_h0"),
    config_by_id("T4_B3_I5_H5_reverse_bias_peephole_h0_c0"),
    config_by_id("T5_B3_I7_H5_bidirectional_bias_peephole_h0_c0_clip_lens5-3-0"),
    config_by_id("T4_B2_I3_H5_reverse_bias_peephole_h0_c0_input_forget"),
    config_by_id("T4_B3_I5_H3_forward_bias_h0_c0_layout1_lens2-4-0"),
    config_by_id("T3_B2_I5_H3_bidirectional_bias_peephole_h0_c0_clip_layout1"),
    config_by_id("T2_B2_I3_H3_reverse_bias_h0_c0_input_forget_layout1_lens2-0"),
    config_by_id("T2_B2_I3_H3_forward_bias_h0_c0_Sigmoid-LeakyRelu-LeakyRelu_defaults"),
    config_by_id("T3_B2_I3_H3_reverse_bias_peephole_c0_clip_sigmoid-TANH-softSign"),
    config_by_id("T3_B2_I3_H3_bidirectional_bias_peephole_h0_c0_Affine-Tanh-ScaledTanh-Relu-Elu-Softsign_alpha_beta"),
    config_by_id(
        "T2_B2_I3_H3_bidirectional_bias_h0_c0_input_forget_lens2-1_"
        "HardSigmoid-Softplus-ThresholdedRelu-Sigmoid-LeakyRelu-ScaledTanh_alpha_beta"
    ),
]
# Every optional input present: the slot tests drop some of them.
FULL_CONFIG = config_by_id("T5_B3_I7_H5_bidirectional_bias_peephole_h0_c0_clip_lens5-3-0")
FULL_LAYOUT1_CONFIG = dataclasses.replace(FULL_CONFIG, layout=1)


@pytest.mark.parametrize("config", CONVERT_CONFIGS, ids=config_id)
def test_convert_matches_lstm(config: LstmConfig, rng: np.random.Generator) -> None:
    """Y, Y_h, Y_c of the converted model equal the original's (layout 1: the oracle's)."""
    inputs = sample_inputs(config, rng)
    check_conversion(config, inputs, trailing_slots(config, inputs), LSTM_OUTPUT_NAMES, context(config, rng))


@pytest.mark.parametrize("layout_config", [FULL_CONFIG, FULL_LAYOUT1_CONFIG], ids=config_id)
@pytest.mark.parametrize("count", range(3, len(LSTM_INPUT_NAMES) + 1))
def test_convert_every_input_count(count: int, layout_config: LstmConfig, rng: np.random.Generator) -> None:
    """3..8 input slots, the rest omitted by leaving them off the end of the list."""
    inputs = sample_inputs(layout_config, rng)
    slots = LSTM_INPUT_NAMES[:count]
    check_conversion(layout_config, inputs, slots, LSTM_OUTPUT_NAMES, f"{context(layout_config, rng)}, slots {slots}")


OMITTED_MIDDLE_INPUTS = [
    ["X", "W", "R", "", "", "initial_h"],
    ["X", "W", "R", "", "sequence_lens", "", "initial_c"],
    ["X", "W", "R", "B", "", "", "", "P"],
    ["X", "W", "R", "", "", "", "", "P"],
    ["X", "W", "R", "", "sequence_lens", "initial_h", "", "P"],
    ["X", "W", "R", "B", "", "initial_h", "initial_c", ""],  # an explicit trailing ""
]


@pytest.mark.parametrize("layout_config", [FULL_CONFIG, FULL_LAYOUT1_CONFIG], ids=config_id)
@pytest.mark.parametrize("slots", OMITTED_MIDDLE_INPUTS, ids=lambda slots: "-".join(name or "_" for name in slots))
def test_convert_omitted_middle_inputs(slots: list[str], layout_config: LstmConfig, rng: np.random.Generator) -> None:
    """Inputs left out as "" between present ones stay at their positions."""
    inputs = sample_inputs(layout_config, rng)
    check_conversion(layout_config, inputs, slots, LSTM_OUTPUT_NAMES, f"{context(layout_config, rng)}, slots {slots}")


PARTIAL_OUTPUTS = [["Y"], ["", "Y_h"], ["", "", "Y_c"], ["Y", "", "Y_c"], ["", "Y_h", "Y_c"]]


@pytest.mark.parametrize("layout_config", [FULL_CONFIG, FULL_LAYOUT1_CONFIG], ids=config_id)
@pytest.mark.parametrize("outputs", PARTIAL_OUTPUTS, ids=lambda outputs: "-".join(name or "_" for name in outputs))
def test_convert_partial_outputs(outputs: list[str], layout_config: LstmConfig, rng: np.random.Generator) -> None:
    """Omitted Y / Y_h / Y_c get fresh names in the converted node; the named ones keep theirs."""
    inputs = sample_inputs(layout_config, rng)
    slots = trailing_slots(layout_config, inputs)
    check_conversion(layout_config, inputs, slots, outputs, f"{context(layout_config, rng)}, outputs {outputs}")


def _weights(rng: np.random.Generator, directions: int, input_size: int, hidden_size: int) -> dict[str, np.ndarray]:
    return {
        "W": (0.5 * rng.standard_normal((directions, 4 * hidden_size, input_size))).astype(np.float32),
        "R": (0.5 * rng.standard_normal((directions, 4 * hidden_size, hidden_size))).astype(np.float32),
        "B": (0.3 * rng.standard_normal((directions, 8 * hidden_size))).astype(np.float32),
    }


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                nodes.extend(_all_nodes(attribute.g))
    return nodes


def test_convert_gives_unique_node_and_value_names(rng: np.random.Generator) -> None:
    """Two LSTMs named alike and one unnamed get distinct names; generated names take no used name."""
    seq_length, batch_size, input_size, hidden_size = 3, 2, 4, 3
    weights = _weights(rng, 1, input_size, hidden_size)
    lstms = [
        helper.make_node("LSTM", ["X", "W", "R", "B"], ["", f"Y_h{k}"], name=name, hidden_size=hidden_size)
        for k, name in enumerate(["twin", "twin", ""])
    ]
    # Names the generated ones would pick first are already taken, by a node and by values.
    taken = [
        helper.make_node("Identity", ["Y_h0"], ["twin_HAll"], name="twin_1"),
        helper.make_node("Identity", ["Y_h1"], ["LSTM"], name="LSTM_1"),
    ]
    graph = helper.make_graph(
        lstms + taken,
        "twins",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq_length, batch_size, input_size])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, batch_size, hidden_size])
            for name in ("Y_h2", "twin_HAll", "LSTM")
        ],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    converted = graphs.convert(model)

    names = [node.name for node in converted.graph.node]
    assert all(names), f"unnamed node: {names}"
    assert len(set(names)) == len(names), f"node names not unique: {names}"
    assert names[0] == "twin", "the first node keeps its name"
    produced = [name for node in converted.graph.node for name in node.output if name]
    assert len(set(produced)) == len(produced), f"a value is produced twice: {produced}"
    assert not set(produced) & {"X", *weights}
    for before, after in zip(lstms, converted.graph.node[:3], strict=True):
        check_converted_node(before, after)
    onnx.checker.check_model(converted, full_check=True)

    # onnxruntime rejects the original ("two nodes with same node name"): the oracle stands in.
    x = rng.standard_normal((seq_length, batch_size, input_size)).astype(np.float32)
    actual = run_onnxruntime(converted, {"X": x}, ortlstm_kernels=True)
    expected = lstm_forward(x.astype(np.float64), **weights, hidden_size=hidden_size)["Ht"]
    for name in ("Y_h2", "twin_HAll", "LSTM"):
        assert_close(actual[name].astype(np.float64), expected, FLOAT32_RTOL, name)


@pytest.mark.parametrize("ir_version", [7, IR_VERSION, 11, onnx.IR_VERSION])
def test_convert_caps_ir_version(ir_version: int, rng: np.random.Generator) -> None:
    """onnxruntime-training 1.19 loads IR <= 10: higher versions are lowered, lower ones kept."""
    config = config_by_id("T3_B2_I4_H3_forward_h0")
    inputs = sample_inputs(config, rng)
    model = lstm_model(config, inputs, trailing_slots(config, inputs), ir_version=ir_version)
    assert graphs.convert(model).ir_version == min(ir_version, MAX_IR_VERSION)


# -- Subgraphs and model-local functions


def _nested_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray], int]:
    """LSTMs in both branches of an If, in a Loop body and in a model-local function."""
    seq_length, batch_size, input_size, hidden_size = 3, 2, 4, 3
    weights = _weights(rng, 1, input_size, hidden_size)
    bidirectional = {f"{name}2": value for name, value in _weights(rng, 2, input_size, hidden_size).items()}

    def branch(name: str, direction: str) -> onnx.GraphProto:
        lstm = helper.make_node(
            "LSTM",
            ["X", "W", "R", "B"],
            ["", f"{name}_Y_h"],
            name="branch_lstm",
            hidden_size=hidden_size,
            direction=direction,
        )
        output = helper.make_tensor_value_info(f"{name}_Y_h", TensorProto.FLOAT, [1, batch_size, hidden_size])
        return helper.make_graph([lstm], name, [], [output])

    if_node = helper.make_node(
        "If", ["cond"], ["if_out"], then_branch=branch("then", "forward"), else_branch=branch("else", "reverse")
    )
    state = [1, batch_size, hidden_size]
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node(
                "LSTM", ["X", "W", "R", "", "", "h_in"], ["", "h_out"], name="body_lstm", hidden_size=hidden_size
            ),
        ],
        "body",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, state),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, state),
        ],
    )
    # An explicit condition: onnx.reference's Loop runs no iteration when it is omitted.
    loop = helper.make_node("Loop", ["trip_count", "keep_going", "h0"], ["loop_out"], body=body)
    function = helper.make_function(
        "local",
        "bidirectional_lstm",
        ["x", "w", "r"],
        ["y"],
        [helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=hidden_size, direction="bidirectional")],
        [helper.make_opsetid("", OPSET)],
    )
    call = helper.make_node("bidirectional_lstm", ["X", "W2", "R2"], ["function_out"], domain="local")
    initializers = [numpy_helper.from_array(value, name) for name, value in {**weights, **bidirectional}.items()]
    initializers.append(numpy_helper.from_array(np.array(2, dtype=np.int64), "trip_count"))
    initializers.append(numpy_helper.from_array(np.array(True), "keep_going"))
    graph = helper.make_graph(
        [if_node, loop, call],
        "nested",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq_length, batch_size, input_size]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, state),
        ],
        [
            helper.make_tensor_value_info("if_out", TensorProto.FLOAT, state),
            helper.make_tensor_value_info("loop_out", TensorProto.FLOAT, state),
            helper.make_tensor_value_info("function_out", TensorProto.FLOAT, [seq_length, 2, batch_size, hidden_size]),
        ],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("local", 1)],
        ir_version=IR_VERSION,
        functions=[function],
    )
    feeds = {
        "X": rng.standard_normal((seq_length, batch_size, input_size)).astype(np.float32),
        "h0": rng.standard_normal(state).astype(np.float32),
    }
    return model, feeds, hidden_size


@pytest.mark.parametrize("cond", [True, False], ids=["then", "else"])
def test_convert_subgraphs_and_functions(cond: bool, rng: np.random.Generator) -> None:
    """LSTMs inside If branches, a Loop body and a model-local function are converted and still run."""
    model, feeds, hidden_size = _nested_model(rng)
    feeds["cond"] = np.array(cond)
    # Without hidden_size in the Loop body, convert reads it from R, an initializer of the main
    # graph (onnxruntime's LSTM needs the attribute, so the original keeps it).
    stripped = copy.deepcopy(model)
    body = next(a.g for a in stripped.graph.node[1].attribute if a.name == "body")
    body_lstm = body.node[1]
    kept = [a for a in body_lstm.attribute if a.name != "hidden_size"]
    del body_lstm.attribute[:]
    body_lstm.attribute.extend(kept)
    converted = graphs.convert(stripped)

    everywhere = _all_nodes(converted.graph) + list(converted.functions[0].node)
    assert not any(node.op_type == "LSTM" for node in everywhere)
    training = [node for node in everywhere if node.op_type == FORWARD.name]
    assert len(training) == 4
    names = [node.name for node in training]
    assert all(names), f"unnamed node: {names}"
    assert len(set(names)) == len(names), f"names not unique across graphs: {names}"
    for node in training:
        assert len(node.input) == len(FORWARD.inputs)
        assert all(node.output)
        assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "hidden_size")) == hidden_size
    assert any(entry.domain == schema.DOMAIN for entry in converted.functions[0].opset_import)
    onnx.checker.check_model(converted, full_check=True)

    expected = run_onnxruntime(model, feeds, ortlstm_kernels=False)
    actual = run_onnxruntime(converted, feeds, ortlstm_kernels=True)
    evaluated = run_reference_evaluator(converted, feeds)
    for name, value in expected.items():
        assert_close(actual[name], value, FLOAT32_RTOL, f"{name} (cond={cond})")
        assert_close(evaluated[name], value, FLOAT32_RTOL, f"{name} (cond={cond}, onnx.reference)")


# -- hidden_size, element types, no LSTM


def _without_hidden_size(model: onnx.ModelProto) -> onnx.ModelProto:
    node = model.graph.node[0]
    kept = [attribute for attribute in node.attribute if attribute.name != "hidden_size"]
    del node.attribute[:]
    node.attribute.extend(kept)
    return model


@pytest.mark.parametrize("source", ["initializer", "constant"])
def test_convert_reads_hidden_size_from_r(source: str, rng: np.random.Generator) -> None:
    """No hidden_size attribute: R's shape [D, 4H, H] gives it (R an initializer or a Constant)."""
    config = config_by_id("T4_B3_I5_H5_reverse_bias_peephole_h0_c0")
    inputs = sample_inputs(config, rng)
    slots = trailing_slots(config, inputs)
    model = _without_hidden_size(lstm_model(config, inputs, slots))
    if source == "constant":
        r = next(init for init in model.graph.initializer if init.name == "R")
        model.graph.initializer.remove(r)
        model.graph.node.insert(0, helper.make_node("Constant", [], ["R"], value=r))
    converted = graphs.convert(model)
    node = next(node for node in converted.graph.node if node.op_type == FORWARD.name)
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "hidden_size")) == config.hidden_size
    actual = run_onnxruntime(converted, feeds_for(model, inputs), ortlstm_kernels=True)
    expected = lstm_forward(**{name: inputs[name] for name in slots if name}, **oracle_attributes(config))
    for name, port in TRAINING_OUTPUT.items():
        assert_close(actual[name].astype(np.float64), expected[port], FLOAT32_RTOL, f"{context(config, rng)}: {name}")


def test_convert_without_hidden_size_names_the_node(rng: np.random.Generator) -> None:
    """R fed at run time: hidden_size cannot be inferred, and the error says which node and why."""
    config = config_by_id("T3_B2_I4_H3_forward_h0")
    inputs = sample_inputs(config, rng)
    model = _without_hidden_size(lstm_model(config, inputs, ["X", "W", "R"], node_name="encoder_lstm"))
    r = next(init for init in model.graph.initializer if init.name == "R")
    model.graph.initializer.remove(r)
    model.graph.input.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, list(r.dims)))
    with pytest.raises(ValueError, match=r"'encoder_lstm'.*hidden_size"):
        graphs.convert(model)


def test_convert_rejects_float16_weights(rng: np.random.Generator) -> None:
    config = config_by_id("T3_B2_I4_H3_forward_h0")
    inputs = sample_inputs(config, rng)
    model = lstm_model(config, inputs, ["X", "W", "R"], node_name="half_lstm")
    for index, init in enumerate(model.graph.initializer):
        model.graph.initializer[index].CopyFrom(
            numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name)
        )
    with pytest.raises(ValueError, match=r"'half_lstm'.*FLOAT16.*float32 and float64"):
        graphs.convert(model)


def test_convert_rejects_model_without_lstm() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "no_lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    with pytest.raises(ValueError, match="no ONNX LSTM node"):
        graphs.convert(model)


# -- torch.onnx.export

TORCH_INPUT_SIZE, TORCH_HIDDEN_SIZE, TORCH_BATCH, TORCH_STEPS = 3, 5, 2, 4


def _export_torch_lstm(exporter: str, batch_first: bool, path: Path) -> tuple[onnx.ModelProto, np.ndarray, tuple]:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(
                TORCH_INPUT_SIZE, TORCH_HIDDEN_SIZE, num_layers=2, bidirectional=True, batch_first=batch_first
            )

        def forward(self, x):
            y, (h, c) = self.lstm(x)
            return y, h, c

    torch.manual_seed(0)
    net = Net().eval()
    shape = (TORCH_BATCH, TORCH_STEPS) if batch_first else (TORCH_STEPS, TORCH_BATCH)
    x = torch.randn(*shape, TORCH_INPUT_SIZE)
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                net, (x,), str(path), dynamo=exporter == "dynamo", input_names=["x"], output_names=["y", "h", "c"]
            )
    finally:
        logger.setLevel(level)
    with torch.no_grad():
        expected = tuple(value.numpy() for value in net(x))
    return onnx.load(str(path)), x.numpy(), expected


@pytest.mark.parametrize(
    ("exporter", "batch_first"),
    [("dynamo", False), ("dynamo", True), ("torchscript", False), ("torchscript", True)],
    ids=["dynamo", "dynamo-batch_first", "torchscript", "torchscript-batch_first"],
)
def test_convert_torch_export(exporter: str, batch_first: bool, tmp_path: Path) -> None:
    """A 2-layer bidirectional nn.LSTM from torch.onnx.export: same outputs before and after, and as torch."""
    model, x, torch_outputs = _export_torch_lstm(exporter, batch_first, tmp_path / "lstm.onnx")
    assert sum(node.op_type == "LSTM" for node in model.graph.node) == 2
    converted = graphs.convert(model)
    check_converted_model(model, converted)
    expected = run_onnxruntime(model, {"x": x}, ortlstm_kernels=False)
    actual = run_onnxruntime(converted, {"x": x}, ortlstm_kernels=True)
    for name, from_torch in zip(("y", "h", "c"), torch_outputs, strict=True):
        assert_close(actual[name], expected[name], FLOAT32_RTOL, f"{exporter}: {name} vs onnxruntime's LSTM")
        assert_close(actual[name], from_torch, FLOAT32_RTOL, f"{exporter}: {name} vs torch")


# ---------------------------------------------------------------------------------------------
# 2. gradient_definition() and onnxruntime-training's gradient graph

# What docs/ops.md says, written out: LSTMGrad's inputs are the forward inputs X, W, R,
# sequence_lens, initial_h, initial_c, the stash HAll, CAll, IOFC, the upstream gradients of
# HAll, Ht, Ct, and P; its outputs the gradients of X, W, R, B, initial_h, initial_c, P.
EXPECTED_GRADIENT_INPUTS = (
    "I(0)", "I(1)", "I(2)", "I(4)", "I(5)", "I(6)", "O(0)", "O(3)", "O(4)", "GO(0)", "GO(1)", "GO(2)", "I(7)",
)  # fmt: skip
EXPECTED_GRADIENT_OUTPUTS = ("GI(0)", "GI(1)", "GI(2)", "GI(3)", "GI(5)", "GI(6)", "GI(7)")


def _placeholder(text: str) -> tuple[str, int]:
    kind, _, rest = text.partition("(")
    return kind, int(rest.rstrip(")"))


def test_gradient_definition_is_the_spec() -> None:
    definition = gradient_definition()
    assert (definition.op_type, definition.domain) == (BACKWARD.name, BACKWARD.domain) == ("LSTMGrad", "ortlstm")
    assert definition.inputs == EXPECTED_GRADIENT_INPUTS
    assert definition.outputs == EXPECTED_GRADIENT_OUTPUTS


def test_gradient_definition_follows_schema_links() -> None:
    """Each placeholder points at the forward port of the same name, or the one gradient_of names."""
    definition = gradient_definition()
    assert len(definition.inputs) == len(BACKWARD.inputs)
    for port, placeholder in zip(BACKWARD.inputs, definition.inputs, strict=True):
        kind, index = _placeholder(placeholder)
        if port.gradient_of is not None:
            assert kind == "GO", (port.name, placeholder)
            assert FORWARD.outputs[index].name == port.gradient_of, (port.name, placeholder)
        elif kind == "I":
            assert FORWARD.inputs[index].name == port.name, (port.name, placeholder)
        else:
            assert kind == "O", (port.name, placeholder)
            assert FORWARD.outputs[index].name == port.name, (port.name, placeholder)
    differentiable = [index for index, port in enumerate(FORWARD.inputs) if port.differentiable]
    assert [_placeholder(p)[1] for p in definition.outputs] == differentiable
    for port, placeholder in zip(BACKWARD.outputs, definition.outputs, strict=True):
        kind, index = _placeholder(placeholder)
        assert kind == "GI", (port.name, placeholder)
        assert FORWARD.inputs[index].name == port.gradient_of, (port.name, placeholder)


def test_wiring_is_each_ports_declaration() -> None:
    """schema.LSTM_TRAINING_GRADIENT, which both training paths read, is what each LSTMGrad port declares."""
    wiring = schema.LSTM_TRAINING_GRADIENT
    assert (wiring.forward, wiring.gradient) == (FORWARD, BACKWARD)
    assert BACKWARD.gradient_of == FORWARD.name
    assert [link.port for link in wiring.inputs] == list(schema.input_names(BACKWARD))
    assert [link.port for link in wiring.outputs] == list(schema.output_names(BACKWARD))
    for port, link in zip(BACKWARD.inputs + BACKWARD.outputs, wiring.inputs + wiring.outputs, strict=True):
        assert link.forward_port == (port.from_forward or port.gradient_of), port.name
        ports = FORWARD.inputs if link.source.value in ("I", "GI") else FORWARD.outputs
        assert ports[link.index].name == link.forward_port, port.name
    assert gradient_definition().inputs == tuple(link.placeholder for link in wiring.inputs)
    assert gradient_definition().outputs == tuple(link.placeholder for link in wiring.outputs)


def _port_replaced(op: schema.OpSpec, kind: str, name: str, **changes: object) -> schema.OpSpec:
    ports = tuple(dataclasses.replace(p, **changes) if p.name == name else p for p in getattr(op, kind))
    return dataclasses.replace(op, **{kind: ports})


@pytest.mark.parametrize(
    ("gradient", "message"),
    [
        (
            _port_replaced(BACKWARD, "inputs", "X", from_forward=None),
            r"LSTMGrad.X: an input of a gradient op names exactly one of from_forward and gradient_of",
        ),
        (
            _port_replaced(BACKWARD, "inputs", "grad_Ht", from_forward="Ht"),
            r"LSTMGrad.grad_Ht: an input of a gradient op names exactly one",
        ),
        (_port_replaced(BACKWARD, "inputs", "CAll", from_forward="Y"), r"from_forward='Y' is no port of LSTMTraining"),
        (
            _port_replaced(BACKWARD, "inputs", "grad_Ct", gradient_of="X"),
            r"LSTMGrad.grad_Ct: gradient_of='X' is not an output of LSTMTraining \('HAll', 'Ht', 'Ct', 'CAll', 'IOF",
        ),
        (
            _port_replaced(BACKWARD, "outputs", "dP", gradient_of="HAll"),
            r"LSTMGrad.dP: an output of a gradient op is the gradient of an input of LSTMTraining",
        ),
        (
            dataclasses.replace(BACKWARD, outputs=BACKWARD.outputs[:-1]),
            r"LSTMGrad has no gradient output for the differentiable inputs \['P'\] of LSTMTraining",
        ),
    ],
    ids=["neither", "both", "unknown_port", "gradient_of_an_input", "output_of_an_output", "missing_gradient"],
)
def test_wiring_refuses_a_port_it_cannot_place(gradient: schema.OpSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        schema.gradient_wiring(FORWARD, gradient)


TRAINING_SIZES = {"seq_length": 3, "batch_size": 2, "input_size": 4, "hidden_size": 3}
TRAINING_ATTRIBUTES = {
    "hidden_size": 3,
    "direction": "bidirectional",
    "clip": 2.5,
    "activations": ["Sigmoid", "Tanh", "Tanh"] * 2,
}


def _training_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """X -> LSTM(W, R, B) -> Y_h: only Ht reaches the loss, so grad_HAll and grad_Ct dangle."""
    t, b, i, h = (TRAINING_SIZES[k] for k in ("seq_length", "batch_size", "input_size", "hidden_size"))
    weights = _weights(rng, 2, i, h)
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["", "Y_h"], name="lstm", **TRAINING_ATTRIBUTES)
    graph = helper.make_graph(
        [node],
        "tiny",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [t, b, i])],
        [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [2, b, h])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    return model, weights


@pytest.fixture(scope="module")
def training_artifacts(tmp_path_factory: pytest.TempPathFactory):
    """Artifacts for the tiny model (training build only), generated once for the module."""
    if not HAS_TRAINING:
        pytest.skip("needs onnxruntime-training (onnxruntime.training): pip install 'ortlstm[train]'")
    from onnxruntime.training import artifacts as ort_artifacts

    ort.set_default_logger_severity(3)
    model, weights = _training_model(np.random.default_rng(1))
    result = graphs.generate_artifacts(
        graphs.convert(model),  # a converted model goes through as is
        requires_grad=["W", "R", "B"],
        loss=ort_artifacts.LossType.MSELoss,
        optimizer=ort_artifacts.OptimType.SGD,
        artifact_directory=tmp_path_factory.mktemp("artifacts"),
    )
    return model, weights, result


@needs_training
def test_artifacts_gradient_node(training_artifacts) -> None:
    """The LSTMGrad node: wired as gradient_definition() says, forward attributes, dangling inputs blank."""
    _, _, result = training_artifacts
    training = onnx.load(str(result.training_model))
    forward = [node for node in training.graph.node if node.op_type == FORWARD.name]
    backward = [node for node in training.graph.node if node.op_type == BACKWARD.name]
    assert len(forward) == len(backward) == 1
    forward, backward = forward[0], backward[0]
    assert backward.domain == schema.DOMAIN

    produced = {name for node in training.graph.node for name in node.output}
    produced |= {value.name for value in training.graph.input} | {init.name for init in training.graph.initializer}
    gradient_of_output = {}  # forward output index -> the upstream gradient's name, where it exists
    for index, name in enumerate(forward.output):
        if f"{name}_grad" in produced:
            gradient_of_output[index] = f"{name}_grad"
    assert set(gradient_of_output) == {schema.output_index(FORWARD, "Ht")}, "only Ht reaches the loss"

    assert len(backward.input) <= len(BACKWARD.inputs)
    actual_inputs = list(backward.input) + [""] * (len(BACKWARD.inputs) - len(backward.input))
    for port, placeholder, actual in zip(BACKWARD.inputs, gradient_definition().inputs, actual_inputs, strict=True):
        kind, index = _placeholder(placeholder)
        if kind == "I":
            expected = forward.input[index]
        elif kind == "O":
            expected = forward.output[index]
        else:  # GO: blank where the forward output does not reach the loss
            expected = gradient_of_output.get(index, "")
        assert actual == expected, f"LSTMGrad input {port.name}: {actual!r}, expected {expected!r} ({placeholder})"
        assert not actual or actual in produced, f"LSTMGrad input {port.name} ({actual!r}) is produced by nothing"

    assert len(backward.output) <= len(BACKWARD.outputs)
    outputs = dict(zip((port.name for port in BACKWARD.outputs), backward.output, strict=False))
    for name in ("dW", "dR", "dB"):
        assert outputs[name] == f"{GRADIENT_OF[name]}_grad", outputs
    assert not any(outputs.get(name) for name in ("dX", "dH0", "dC0", "dP")), f"unneeded gradients computed: {outputs}"

    forward_attributes = {a.name: helper.get_attribute_value(a) for a in forward.attribute}
    assert {a.name: helper.get_attribute_value(a) for a in backward.attribute} == forward_attributes
    assert forward_attributes["clip"] == pytest.approx(TRAINING_ATTRIBUTES["clip"])

    for path in (result.training_model, result.eval_model, result.optimizer_model):
        assert onnx.load(str(path)).ir_version <= MAX_IR_VERSION, path.name


@needs_training
def test_artifacts_gradients_match_oracle(training_artifacts, rng: np.random.Generator) -> None:
    """One training step's parameter gradients equal the oracle's for the MSE loss on Y_h."""
    _, weights, result = training_artifacts
    module, _, state = graphs.open_training(result, intra_op_num_threads=1)
    t, b, i, h = (TRAINING_SIZES[k] for k in ("seq_length", "batch_size", "input_size", "hidden_size"))
    x = rng.standard_normal((t, b, i)).astype(np.float32)
    target = rng.standard_normal((2, b, h)).astype(np.float32)
    module.train()
    loss = module(x, target)
    float64 = {name: value.astype(np.float64) for name, value in weights.items()}
    attributes = {**TRAINING_ATTRIBUTES, "clip": _float32_attribute(TRAINING_ATTRIBUTES["clip"])}
    forward = lstm_forward(x.astype(np.float64), **float64, **attributes)
    assert float(loss) == pytest.approx(np.mean((forward["Ht"] - target) ** 2), rel=1e-5)
    grad_ht = 2.0 * (forward["Ht"] - target) / target.size
    expected = lstm_backward(x.astype(np.float64), **float64, **attributes, grad_Ht=grad_ht)
    for name in ("W", "R", "B"):
        assert_close(state.parameters[name].grad.astype(np.float64), expected[f"d{name}"], FLOAT32_RTOL, f"grad {name}")


@needs_training
def test_register_gradient_is_idempotent(training_artifacts, tmp_path: Path) -> None:
    register_gradient()
    register_gradient()
    register_gradient.cache_clear()
    register_gradient()  # registering again with onnxruntime-training replaces, it does not fail
    model, _, _ = training_artifacts
    from onnxruntime.training import artifacts as ort_artifacts

    result = graphs.generate_artifacts(
        model, requires_grad=["W"], loss=ort_artifacts.LossType.MSELoss, artifact_directory=tmp_path
    )
    training = onnx.load(str(result.training_model))
    assert sum(node.op_type == BACKWARD.name for node in training.graph.node) == 1


@needs_training
def test_requires_grad_must_name_initializers(rng: np.random.Generator, tmp_path: Path) -> None:
    from onnxruntime.training import artifacts as ort_artifacts

    model, _ = _training_model(rng)
    with pytest.raises(ValueError, match=r"requires_grad: 'weight_ih' matches no parameter of the model.*are: W, R, B"):
        graphs.generate_artifacts(
            model, requires_grad=["W", "weight_ih"], loss=ort_artifacts.LossType.MSELoss, artifact_directory=tmp_path
        )
    with pytest.raises(ValueError, match=r"frozen_params: 'X' matches no parameter of the model"):
        graphs.generate_artifacts(model, frozen_params=["X"], artifact_directory=tmp_path)


def test_generate_artifacts_needs_training_build(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, tmp_path: Path
) -> None:
    """With the inference package, generate_artifacts says to install the training build.

    In the training environment the inference package is simulated by hiding onnxruntime.training.
    """
    if HAS_TRAINING:
        for name in [name for name in sys.modules if name.startswith("onnxruntime.training")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, "onnxruntime.training", None)
    model, _ = _training_model(rng)
    with pytest.raises(ImportError, match=r"Install the training build.*pip install 'ortlstm\[train\]'"):
        graphs.generate_artifacts(model, artifact_directory=tmp_path)
    assert not list(tmp_path.iterdir()), "nothing is written"


# ---------------------------------------------------------------------------------------------
# 3. build_gradient_model()


def graph_config(config: LstmConfig, dtype: type, fixed_dims: bool = True) -> LstmGraphConfig:
    """The standalone-model configuration of a test-table row."""
    present = ("B", config.bias), ("sequence_lens", config.sequence_lens is not None), ("initial_h", config.initial_h)
    present += ("initial_c", config.initial_c), ("P", config.peephole)
    attributes = {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in config.attributes().items()
        if name not in ("hidden_size", "direction", "layout")
    }
    return LstmGraphConfig(
        hidden_size=config.hidden_size,
        input_size=config.input_size,
        direction=config.direction,
        layout=config.layout,
        dtype=dtype,
        seq_length=config.seq_length if fixed_dims else None,
        batch_size=config.batch_size if fixed_dims else None,
        inputs=tuple(name for name, on in present if on),
        attributes=tuple(sorted(attributes.items())),
    )


GRADIENT_MODEL_CONFIGS = [
    config_by_id("T1_B1_I1_H1_forward"),
    config_by_id("T3_B2_I4_H3_forward_h0"),
    config_by_id("T4_B3_I5_H5_reverse_bias_peephole_h0_c0"),
    config_by_id("T5_B3_I7_H5_bidirectional_bias_peephole_h0_c0_clip_lens5-3-0"),
    config_by_id("T3_B2_I5_H3_bidirectional_bias_peephole_h0_c0_clip_layout1"),
    config_by_id("T2_B2_I3_H3_reverse_bias_h0_c0_input_forget_layout1_lens2-0"),
    config_by_id("T3_B2_I3_H3_bidirectional_bias_peephole_h0_c0_Affine-Tanh-ScaledTanh-Relu-Elu-Softsign_alpha_beta"),
    config_by_id("T3_B2_I4_H3_forward_peephole_c0"),
]


def _upstream(config: LstmConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = _output_shapes(config)
    return {
        name: rng.standard_normal(shapes[onnx_name]).astype(np.float32).astype(np.float64)
        for name, onnx_name in zip(UPSTREAM, LSTM_OUTPUT_NAMES, strict=True)
    }


def _run_gradient_model(model: onnx.ModelProto, values: dict, dtype: type) -> dict[str, np.ndarray]:
    feeds = {
        value.name: values[value.name] if value.name == "sequence_lens" else np.asarray(values[value.name], dtype=dtype)
        for value in model.graph.input
    }
    return run_onnxruntime(model, feeds, ortlstm_kernels=True)


@pytest.mark.parametrize("fixed_dims", [True, False], ids=["fixed", "symbolic"])
@pytest.mark.parametrize("config", GRADIENT_MODEL_CONFIGS, ids=config_id)
def test_gradient_model_is_valid_and_named_per_spec(config: LstmConfig, fixed_dims: bool) -> None:
    graph = graph_config(config, np.float32, fixed_dims)
    model = build_gradient_model(graph)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= MAX_IR_VERSION
    present = [port.name for port in FORWARD.inputs if not port.optional or port.name in graph.inputs]
    assert [value.name for value in model.graph.input] == present + list(UPSTREAM)
    gradients = [port.name for port in BACKWARD.outputs if GRADIENT_OF[port.name] in present]
    assert [value.name for value in model.graph.output] == [port.name for port in FORWARD.outputs] + gradients
    x = next(value for value in model.graph.input if value.name == "X")
    dims = [dim.dim_value or dim.dim_param for dim in x.type.tensor_type.shape.dim]
    seq, batch = (config.seq_length, config.batch_size) if fixed_dims else ("seq_length", "batch_size")
    assert dims == ([seq, batch, config.input_size] if config.layout == 0 else [batch, seq, config.input_size])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("config", GRADIENT_MODEL_CONFIGS, ids=config_id)
def test_gradient_model_matches_oracle(config: LstmConfig, dtype: type, rng: np.random.Generator) -> None:
    """Forward outputs and every gradient against lstm_forward / lstm_backward (float64 oracle)."""
    inputs = sample_inputs(config, rng)
    upstream = _upstream(config, rng)
    model = build_gradient_model(graph_config(config, dtype, fixed_dims=dtype is np.float32))
    actual = _run_gradient_model(model, {**inputs, **upstream}, dtype)
    attributes = oracle_attributes(config)
    expected = {**lstm_forward(**inputs, **attributes), **lstm_backward(**inputs, **attributes, **upstream)}
    rtol = FLOAT64_RTOL if dtype is np.float64 else FLOAT32_RTOL
    for name, value in actual.items():
        assert value.dtype == np.dtype(dtype), f"{context(config, rng)}: {name} dtype {value.dtype}"
        assert_close(
            value.astype(np.float64), expected[name], rtol, f"{context(config, rng)}, {np.dtype(dtype)}: {name}"
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hidden_size", 0),
        ("input_size", -2),
        ("direction", "sideways"),
        ("layout", 2),
        ("dtype", np.float16),
        ("inputs", ("B", "Y")),
        ("inputs", ("X",)),
    ],
)
def test_gradient_model_rejects_invalid_config(field: str, value: object) -> None:
    config = LstmGraphConfig(**{"hidden_size": 3, "input_size": 2, field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"^{field}: "):
        build_gradient_model(config)


# ---------------------------------------------------------------------------------------------
# 4. The onnxscript function lstm_with_gradients


def _function_proto() -> onnx.FunctionProto:
    return lstm_with_gradients.to_function_proto()


def test_function_wires_lstm_grad_as_gradient_definition() -> None:
    """LSTMGrad's inputs are the forward inputs, outputs and upstream gradients the definition names."""
    function = _function_proto()
    assert [(node.op_type, node.domain) for node in function.node] == [
        (FORWARD.name, FORWARD.domain),
        (BACKWARD.name, BACKWARD.domain),
    ]
    forward, backward = function.node
    assert list(forward.input) == list(schema.input_names(FORWARD))
    assert list(function.input) == list(forward.input) + list(UPSTREAM)
    upstream_of = {port.gradient_of: port.name for port in BACKWARD.inputs if port.gradient_of is not None}
    definition = gradient_definition()
    expected_inputs = []
    for placeholder in definition.inputs:
        kind, index = _placeholder(placeholder)
        if kind == "I":
            expected_inputs.append(forward.input[index])
        elif kind == "O":
            expected_inputs.append(forward.output[index])
        else:
            assert kind == "GO", placeholder
            expected_inputs.append(upstream_of[FORWARD.outputs[index].name])
    assert list(backward.input) == expected_inputs
    for placeholder, output in zip(definition.outputs, backward.output, strict=True):
        _, index = _placeholder(placeholder)
        port = next(port for port in BACKWARD.outputs if port.gradient_of == FORWARD.inputs[index].name)
        assert output == port.name
    assert list(function.output) == list(forward.output) + list(backward.output)
    # Both nodes take the function's attributes.
    for node in function.node:
        assert {a.name: a.ref_attr_name for a in node.attribute} == {
            name: name for name in ("hidden_size", "direction", "layout", "input_forget")
        }


FUNCTION_CONFIG = config_by_id("T3_B2_I5_H3_bidirectional_bias_peephole_h0_c0_clip_layout1")
FUNCTION_OMITTED = ("sequence_lens", "initial_h", "P", "grad_Ct")  # left empty in the call


def _function_call_model(config: LstmConfig, consume_ht: bool = False) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A model calling lstm_with_gradients (some inputs omitted) and the matching build_gradient_model.

    With ``consume_ht`` the call's Ht reaches the graph output through an Identity, so the graph
    gives that call output no type.
    """
    function = _function_proto()
    graph = graph_config(config, np.float32)
    graph = dataclasses.replace(
        graph,
        inputs=tuple(name for name in graph.inputs if name not in FUNCTION_OMITTED),
        # The function takes hidden_size, direction, layout and input_forget only.
        attributes=tuple((name, value) for name, value in graph.attributes if name == "input_forget"),
    )
    reference = build_gradient_model(graph)
    wanted = {value.name for value in reference.graph.output}
    call = helper.make_node(
        function.name,
        [name if name not in FUNCTION_OMITTED else "" for name in function.input],
        [name if name in wanted else "" for name in function.output],
        domain=function.domain,
        hidden_size=config.hidden_size,
        direction=config.direction,
        layout=config.layout,
    )
    nodes = [call]
    if consume_ht:
        call.output[list(call.output).index("Ht")] = "Ht_of_call"
        nodes.append(helper.make_node("Identity", ["Ht_of_call"], ["Ht"]))
    caller = helper.make_graph(
        nodes,
        "calls_lstm_with_gradients",
        [value for value in reference.graph.input if value.name not in FUNCTION_OMITTED],
        list(reference.graph.output),
    )
    model = helper.make_model(
        caller,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION)],
        ir_version=IR_VERSION,
        functions=[function],
    )
    return model, reference


@pytest.mark.parametrize("consume_ht", [False, True], ids=["outputs", "Ht_consumed"])
def test_inlined_function_matches_gradient_model(consume_ht: bool, rng: np.random.Generator) -> None:
    """Called as a model-local function and inlined, it runs in ORT and equals build_gradient_model."""
    config = FUNCTION_CONFIG
    model, reference = _function_call_model(config, consume_ht)
    inlined = onnx.inliner.inline_local_functions(model)
    assert [node.op_type for node in inlined.graph.node][:2] == [FORWARD.name, BACKWARD.name]
    onnx.checker.check_model(inlined, full_check=True)
    inputs = sample_inputs(config, rng)
    values = {**inputs, **_upstream(config, rng)}
    for name in FUNCTION_OMITTED:
        values[name] = None
    actual = _run_gradient_model(inlined, values, np.float32)
    # The standalone model has no slot for omitted inputs but the upstream gradients: zeros there.
    values["grad_Ct"] = np.zeros(_output_shapes(config)["Y_c"])
    expected = _run_gradient_model(reference, values, np.float32)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=f"{context(config, rng)}: {name}")


@pytest.mark.xfail(
    strict=True,
    raises=OrtFail,
    reason="onnxruntime cannot type-infer the outputs of a model-local function's custom-op nodes: a call "
    "output the graph gives no type (one another node consumes) fails at session creation; inline first",
)
def test_function_call_feeding_another_node_needs_inlining() -> None:
    """Not inlined, the model of test_inlined_function_matches_gradient_model[Ht_consumed] fails to load."""
    model, _ = _function_call_model(FUNCTION_CONFIG, consume_ht=True)
    try:
        run_onnxruntime(model, {}, ortlstm_kernels=True)
    except OrtFail as error:
        if "type inference failed" not in str(error):  # any other failure is a real one
            raise AssertionError(f"unexpected failure: {error}") from error
        raise
