"""ONNX's backend test cases of LSTM, GRU and RNN, run through ortlstm LSTMTraining / GRUTraining / RNNTraining.

onnx defines its node cases in code (``onnx.backend.test.case.node.lstm``; the public way to get
them is ``onnx.backend.test.case.node.collect_testcases("LSTM")``): each case is a one-node model
with its inputs and expected outputs, computed by onnx's NumPy LSTM. (The onnx 1.23 wheel does not
ship the serialized ``onnx/backend/test/data/node/test_lstm_*`` directories, so the code is the
source here.) onnx 1.23 provides six cases, all float32: defaults, with_initial_bias,
with_peepholes, batchwise (layout=1), reverse and bidirectional.

Each case's model is rewritten into ours: the LSTM node becomes an ``ortlstm`` LSTMTraining node
with the same inputs and attributes, its outputs Y, Y_h, Y_c becoming HAll, Ht, Ct; graph inputs
and outputs stay the case's own. The result must match the case's expected outputs within the
case's tolerance (rtol 1e-3, atol 1e-7 in onnx 1.23). There are no double-typed LSTM cases, so
each case also runs with every float tensor cast to float64, against the same expected values
and tolerance, and against the float64 oracle.

The GRU's six cases (onnx 1.23, opset 22, float32: defaults, with_initial_bias, seq_length,
batchwise, reverse, bidirectional) go through ``convert_grus``, the rewrite the Trainer applies to a
user's model, so the converter's input and attribute mapping is under test too; the converted graph
keeps the case's inputs and outputs. The float64 oracle is ``ortlstm.reference_gru``. The RNN's
six cases (defaults, with_initial_bias, seq_length, batchwise, reverse, bidirectional) go through
``convert_rnns`` likewise, with ``ortlstm.reference_rnn`` as the float64 oracle.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.backend.test.case import node as node_cases
from onnx.backend.test.case.test_case import TestCase
from reference.lstm_ref import lstm_forward

import ortlstm.ops
from ortlstm.graphs.convert_gru import convert_grus
from ortlstm.graphs.convert_rnn import convert_rnns
from ortlstm.ops import schema
from ortlstm.reference_gru import gru_training
from ortlstm.reference_rnn import rnn_training

IR_VERSION = 10  # onnxruntime 1.19 loads IR <= 10
ONNX_OPSET = 17  # the rewritten graph has no standard ops; any opset both onnxruntimes know
FLOAT64_ORACLE_RTOL = 1e-10
FLOAT64_ORACLE_ATOL = 1e-12

TRAINING = schema.op_by_name("LSTMTraining")
# ONNX LSTM's Y, Y_h, Y_c are LSTMTraining's first three outputs; its inputs are ours, in order.
LSTM_OUTPUT_TO_PORT = dict(zip(("Y", "Y_h", "Y_c"), schema.output_names(TRAINING)[:3], strict=True))
KNOWN_CASES = {
    "test_lstm_defaults",
    "test_lstm_with_initial_bias",
    "test_lstm_with_peepholes",
    "test_lstm_batchwise",
    "test_lstm_reverse",
    "test_lstm_bidirectional",
}

KNOWN_GRU_CASES = {
    "test_gru_defaults",
    "test_gru_with_initial_bias",
    "test_gru_seq_length",
    "test_gru_batchwise",
    "test_gru_reverse",
    "test_gru_bidirectional",
}
GRU_TRAINING = schema.GRU_TRAINING
GRU_OUTPUT_TO_PORT = dict(zip(("Y", "Y_h"), schema.output_names(GRU_TRAINING)[:2], strict=True))
KNOWN_RNN_CASES = {
    "test_simple_rnn_defaults",
    "test_simple_rnn_with_initial_bias",
    "test_rnn_seq_length",
    "test_simple_rnn_batchwise",
    "test_simple_rnn_reverse",
    "test_simple_rnn_bidirectional",
}
RNN_OUTPUT_TO_PORT = dict(zip(("Y", "Y_h"), schema.output_names(schema.RNN_TRAINING), strict=True))


def _collect_cases(op_type: str) -> list[TestCase]:
    """The node cases of onnx for ``op_type`` (``"LSTM"`` or ``"GRU"``).

    onnx registers a case module's cases when the module is imported (its ``export_*`` methods
    run at class creation and call ``expect``), so importing just the LSTM module is enough and
    costs ~0.1 s, where ``collect_testcases`` imports every op's cases (~6 s of CPU). If onnx's
    private module or case list moves, the public ``collect_testcases("LSTM")`` takes over.
    """
    with contextlib.suppress(ImportError):
        importlib.import_module(f"onnx.backend.test.case.node.{op_type.lower()}")
    cases = [case for case in getattr(node_cases, "_NodeTestCases", []) if _op_type(case) == op_type]
    if not cases:
        with warnings.catch_warnings():  # importing every node case module warns from unrelated ops
            warnings.simplefilter("ignore")
            cases = [case for case in node_cases.collect_testcases(op_type) if _op_type(case) == op_type]
    return cases


def _op_type(case: TestCase) -> str:
    return case.model.graph.node[0].op_type


CASES = _collect_cases("LSTM")
GRU_CASES = _collect_cases("GRU")
RNN_CASES = _collect_cases("RNN")


def _case_id(case: TestCase) -> str:
    return case.name


def _attributes(node: onnx.NodeProto) -> dict[str, object]:
    """The node's attributes as Python values, strings decoded."""

    def decode(value: object) -> object:
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list):
            return [decode(item) for item in value]
        return value

    return {attribute.name: decode(helper.get_attribute_value(attribute)) for attribute in node.attribute}


def _our_model(case: TestCase, elem_type: int) -> onnx.ModelProto:
    """The case's model with its LSTM node replaced by LSTMTraining (same inputs, attributes)."""
    (node,) = case.model.graph.node
    input_ports = schema.input_names(TRAINING)
    inputs = {input_ports[index]: name for index, name in enumerate(node.input) if name}
    outputs = {LSTM_OUTPUT_TO_PORT[("Y", "Y_h", "Y_c")[index]]: name for index, name in enumerate(node.output) if name}
    ours = ortlstm.ops.make_node("LSTMTraining", inputs, outputs, name=f"{case.name}_ortlstm", **_attributes(node))
    return _model_around([ours], case, elem_type)


def _model_around(nodes: list[onnx.NodeProto], case: TestCase, elem_type: int) -> onnx.ModelProto:
    """``nodes`` between the case's graph inputs and outputs, float tensors retyped to ``elem_type``."""

    def retyped(values: list[onnx.ValueInfoProto]) -> list[onnx.ValueInfoProto]:
        result = []
        for value in values:
            value = onnx.ValueInfoProto.FromString(value.SerializeToString())
            if value.type.tensor_type.elem_type == TensorProto.FLOAT:
                value.type.tensor_type.elem_type = elem_type
            result.append(value)
        return result

    graph = helper.make_graph(
        nodes, case.name, retyped(list(case.model.graph.input)), retyped(list(case.model.graph.output))
    )
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", ONNX_OPSET),
            helper.make_opsetid(ortlstm.ops.DOMAIN, ortlstm.ops.OPSET_VERSION),
        ],
        ir_version=IR_VERSION,
    )


def _feeds(case: TestCase, dtype: type) -> dict[str, np.ndarray]:
    ((inputs, _),) = case.data_sets
    return {
        value.name: array.astype(dtype) if array.dtype == np.float32 else array
        for value, array in zip(case.model.graph.input, inputs, strict=True)
    }


def _expected(case: TestCase) -> dict[str, np.ndarray]:
    ((_, outputs),) = case.data_sets
    return {value.name: array for value, array in zip(case.model.graph.output, outputs, strict=True)}


def _run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )
    names = [output.name for output in model.graph.output]
    return dict(zip(names, session.run(names, dict(feeds)), strict=True))


def _converted_gru_model(case: TestCase, elem_type: int) -> onnx.ModelProto:
    """The case's model through ``convert_grus``: its GRU node becomes GRUTraining, nothing else changes."""
    return _converted_model(case, elem_type, convert_grus(case.model), GRU_TRAINING)


def _converted_rnn_model(case: TestCase, elem_type: int) -> onnx.ModelProto:
    """The case's model through ``convert_rnns``: its RNN node becomes RNNTraining, nothing else changes."""
    return _converted_model(case, elem_type, convert_rnns(case.model), schema.RNN_TRAINING)


def _converted_model(
    case: TestCase, elem_type: int, converted: onnx.ModelProto, training: schema.OpSpec
) -> onnx.ModelProto:
    (node,) = converted.graph.node
    assert (node.op_type, node.domain) == (training.name, schema.DOMAIN), f"{case.name}: {node.op_type}"
    (original,) = case.model.graph.node
    kept = {port: name for port, name in zip(schema.input_names(training), node.input, strict=False) if name}
    given = {port: name for port, name in zip(schema.input_names(training), original.input, strict=False) if name}
    assert kept == given, f"{case.name}: the converter rewired the inputs"
    return _model_around(list(converted.graph.node), case, elem_type)


def _lstm_oracle(inputs: Mapping[str, np.ndarray], attributes: Mapping[str, object]) -> dict[str, np.ndarray]:
    return lstm_forward(**inputs, **attributes)


def _gru_oracle(inputs: Mapping[str, np.ndarray], attributes: Mapping[str, object]) -> dict[str, np.ndarray]:
    return gru_training(inputs, **attributes)


def _rnn_oracle(inputs: Mapping[str, np.ndarray], attributes: Mapping[str, object]) -> dict[str, np.ndarray]:
    return rnn_training(inputs, **attributes)


# op type -> (the case's model on the library, the float64 oracle, ONNX output -> port, the training op)
FAMILIES = {
    "LSTM": (_our_model, _lstm_oracle, LSTM_OUTPUT_TO_PORT, TRAINING),
    "GRU": (_converted_gru_model, _gru_oracle, GRU_OUTPUT_TO_PORT, GRU_TRAINING),
    "RNN": (_converted_rnn_model, _rnn_oracle, RNN_OUTPUT_TO_PORT, schema.RNN_TRAINING),
}


def test_onnx_provides_the_known_lstm_cases() -> None:
    """The cases this file was written against are all collected (onnx may add more)."""
    assert {case.name for case in CASES} >= KNOWN_CASES, f"onnx {onnx.__version__}: {sorted(c.name for c in CASES)}"


def test_onnx_provides_the_known_gru_cases() -> None:
    """The GRU cases this file was written against are all collected (onnx may add more)."""
    names = {case.name for case in GRU_CASES}
    assert names >= KNOWN_GRU_CASES, f"onnx {onnx.__version__}: {sorted(names)}"


def test_onnx_provides_the_known_rnn_cases() -> None:
    names = {case.name for case in RNN_CASES}
    assert names >= KNOWN_RNN_CASES, f"onnx {onnx.__version__}: {sorted(names)}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("case", CASES + GRU_CASES + RNN_CASES, ids=_case_id)
def test_onnx_backend_case(case: TestCase, dtype: type) -> None:
    """LSTMTraining / GRUTraining reproduce the case's expected Y / Y_h (/ Y_c) within the case's tolerance."""
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    build = FAMILIES[_op_type(case)][0]
    actual = _run(build(case, elem_type), _feeds(case, dtype))
    for name, expected in _expected(case).items():
        assert actual[name].dtype == dtype, f"{case.name}: {name}"
        assert actual[name].shape == expected.shape, f"{case.name}: {name}"
        np.testing.assert_allclose(
            actual[name], expected, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} ({np.dtype(dtype)}): {name}"
        )


@pytest.mark.parametrize("case", CASES + GRU_CASES + RNN_CASES, ids=_case_id)
def test_onnx_backend_case_float64_matches_oracle(case: TestCase) -> None:
    """In float64 the kernel and the NumPy oracle agree to rounding on every case's inputs."""
    build, oracle_of, output_to_port, training = FAMILIES[_op_type(case)]
    (node,) = case.model.graph.node
    feeds = _feeds(case, np.float64)
    input_ports = schema.input_names(training)
    oracle_inputs = {input_ports[index]: feeds[name] for index, name in enumerate(node.input) if name}
    oracle = oracle_of(oracle_inputs, _attributes(node))
    actual = _run(build(case, TensorProto.DOUBLE), feeds)
    for index, name in enumerate(node.output):
        if name:
            port = output_to_port[list(output_to_port)[index]]
            np.testing.assert_allclose(
                actual[name],
                oracle[port],
                rtol=FLOAT64_ORACLE_RTOL,
                atol=FLOAT64_ORACLE_ATOL,
                err_msg=f"{case.name} (float64 oracle): {name}",
            )
