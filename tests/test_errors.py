"""Every error the kernels report, matched on its text, and the point where it surfaces.

Attribute problems fail at session creation (kernel construction, ``lstm/lstm_config.cc`` and
``ort/ort_util.cc``); shape and value problems fail at ``run()`` (``ort/lstm_validation.cc``);
LSTMGrad's activation rule and out-of-memory come from ``ort/lstm_ops.cc``. Each message names the
node, the input or attribute, and the expected vs the actual value with the ONNX dim names. Type
errors and missing required inputs are onnxruntime's own messages; the tests pin what they say.

Expected shape messages are built from the spec (``schema.shape_for_layout``), so a port whose
shape changes in the spec changes its expected message with it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import op_runner
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, InvalidGraph, RuntimeException
from reference.lstm_ref import lstm_backward, lstm_forward

import ortlstm.ops
from ortlstm.ops import schema
from ortlstm.ops.nodes import ordered_inputs

ORT_VERSION = tuple(int(part) for part in ort.__version__.split(".")[:2])
# onnxruntime >= 1.25 hands string-list attributes (activations) to custom-op kernels.
READS_STRING_LISTS = ORT_VERSION >= (1, 25)
# make_node writes both activations and activations_csv; the kernel reads (and names in its
# messages) the string list where it can, else the comma-separated copy.
NAMES_SOURCE = "activations" if READS_STRING_LISTS else "activations_csv"
# 8*hidden_size (B's width) must fit BLAS's 32-bit ints.
MAX_HIDDEN_SIZE = 2**31 // 8 - 1

OPS = ("LSTMTraining", "LSTMGrad")
SHAPE_OPS = (*OPS, "RNNTraining", "RNNGrad")  # the shape checks are the recurrent family's, by gate count
# Distinct sizes, so that no two dims coincide and a message can only be read one way.
SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE, HIDDEN_SIZE = 3, 2, 4, 5
SEQUENCE_LENS = (3, 1)
INT32 = {"sequence_lens"}
FLOAT64_RTOL = 1e-12


# ---------------------------------------------------------------------------------------------
# Helpers


def _node(op: str) -> str:
    """The prefix of every kernel message for op_runner's node."""
    return f"{op} node '{op}_under_test': "


def _num_directions(direction: str) -> int:
    return schema.num_directions(direction)


def _dims(direction: str) -> dict[str, int]:
    return {
        "seq_length": SEQ_LENGTH,
        "batch_size": BATCH_SIZE,
        "input_size": INPUT_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "num_directions": _num_directions(direction),
    }


def _port(op: str, name: str) -> schema.PortSpec:
    return next(port for port in schema.op_by_name(op).inputs if port.name == name)


def _shape(op: str, name: str, layout: int, direction: str) -> tuple[int, ...]:
    """The shape the spec gives input ``name`` at the module's dims."""
    dims = _dims(direction)
    shape = []
    for expression in schema.shape_for_layout(_port(op, name), layout):
        factor, dim = schema.parse_dim(expression)
        shape.append(factor * dims[dim])
    return tuple(shape)


def _valid_inputs(op: str, layout: int, direction: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every input of ``op`` present with a valid shape (values matter only for sequence_lens)."""
    inputs: dict[str, np.ndarray] = {}
    for port in schema.op_by_name(op).inputs:
        if port.name == "sequence_lens":
            inputs[port.name] = np.array(SEQUENCE_LENS, dtype=np.int32)
        else:
            inputs[port.name] = rng.standard_normal(_shape(op, port.name, layout, direction)).astype(np.float32)
    return inputs


def _shape_message(op: str, name: str, layout: int, direction: str, actual: tuple[int, ...]) -> str:
    """The kernel's message for input ``name`` of shape ``actual``."""
    dims = _dims(direction)
    labels = list(schema.shape_for_layout(_port(op, name), layout))
    values = []
    for expression in labels:
        factor, dim = schema.parse_dim(expression)
        values.append(factor * dims[dim])
    if name in ("W", "R"):  # the message says which direction attribute implies num_directions
        labels[0] = f"num_directions(direction={direction})"
    expected = ", ".join(f"{label}={value}" for label, value in zip(labels, values, strict=True))
    got = ", ".join(str(dim) for dim in actual)
    return f"{_node(op)}{name}: expected [{expected}], got [{got}]"


def _feeds(inputs: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {
        name: np.asarray(value, dtype=np.int32 if name in INT32 else np.float32)
        for name, value in inputs.items()
        if value is not None
    }


def _session(
    op: str, inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object]
) -> ort.InferenceSession:
    """op_runner's (cached) float32 session for the present inputs; creating it must succeed."""
    present = [port.name for port in schema.op_by_name(op).inputs if inputs.get(port.name) is not None]
    return op_runner.session(op, present, schema.output_names(schema.op_by_name(op)), np.float32, attributes)


def _run(op: str, inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object]) -> list[np.ndarray]:
    """Creates the session (which must succeed), then runs it: shape errors surface here."""
    session = _session(op, inputs, attributes)
    return session.run(None, _feeds(inputs))


def _create_session(op: str, attributes: Mapping[str, object]) -> ort.InferenceSession:
    """A fresh (uncached) session of op_runner's model of ``op``: the kernel is constructed here."""
    spec = schema.op_by_name(op)
    model = op_runner.make_model(op, list(_required(op)), schema.output_names(spec), np.float32, attributes)
    return _session_from_model(model)


def _session_from_model(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )


def _raw_model(
    op: str,
    inputs: Mapping[str, str],
    attributes: Mapping[str, object],
    elem_types: Mapping[str, int] | None = None,
    name: str | None = "raw",
) -> onnx.ModelProto:
    """One node built with onnx.helper directly, its attributes exactly as given.

    Unlike make_node, ``activations`` is not mirrored into activations_csv. Graph inputs are
    float32 (int32 for sequence_lens) unless ``elem_types`` says otherwise.
    """
    spec = schema.op_by_name(op)
    elem_types = dict(elem_types or {})
    node_inputs = ordered_inputs(spec, inputs)
    node = helper.make_node(
        op, node_inputs, list(schema.output_names(spec)), name=name, domain=schema.DOMAIN, **attributes
    )
    graph_inputs = []
    for port in spec.inputs:
        value = inputs.get(port.name)
        if value:
            default = TensorProto.INT32 if port.name in INT32 else TensorProto.FLOAT
            graph_inputs.append(helper.make_tensor_value_info(value, elem_types.get(port.name, default), None))
    graph_outputs = [helper.make_empty_tensor_value_info(output) for output in schema.output_names(spec)]
    graph = helper.make_graph([node], op, graph_inputs, graph_outputs)
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", op_runner.ONNX_OPSET),
            helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION),
        ],
        ir_version=op_runner.IR_VERSION,
    )


def _required(op: str) -> dict[str, str]:
    return {port.name: port.name for port in schema.op_by_name(op).inputs if not port.optional}


# ---------------------------------------------------------------------------------------------
# Attributes: rejected when the session is created, before any run.

_ATTRIBUTE_ERRORS = [
    pytest.param({}, "attribute hidden_size is required (a positive integer) but is missing", id="hidden_size_missing"),
    *[
        pytest.param(
            {"hidden_size": value},
            f"attribute hidden_size: expected an integer in [1, {MAX_HIDDEN_SIZE}], got {value}",
            id=f"hidden_size_{name}",
        )
        for name, value in {"0": 0, "neg": -3, "above_max": MAX_HIDDEN_SIZE + 1, "2**62": 2**62}.items()
    ],
    pytest.param(
        {"hidden_size": 5, "direction": "sideways"},
        "attribute direction: expected one of forward, reverse, bidirectional, got 'sideways'",
        id="direction_unknown",
    ),
    pytest.param(
        {"hidden_size": 5, "direction": "Forward"},
        "attribute direction: expected one of forward, reverse, bidirectional, got 'Forward'",
        id="direction_case",
    ),
    pytest.param(
        {"hidden_size": 5, "activations": ["Sigmoid", "Tanh", "Foo"]},
        f"attribute {NAMES_SOURCE}: unknown activation 'Foo' at position 2; expected one of Relu, Tanh, Sigmoid, "
        "Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus",
        id="activation_unknown",
    ),
    pytest.param(
        {"hidden_size": 5, "activations": ["Sigmoid", "Tanh"]},
        f"attribute {NAMES_SOURCE}: expected 3*num_directions=3 names (f, g, h per direction, direction=forward), "
        "got 2 [Sigmoid, Tanh]",
        id="activations_2",
    ),
    pytest.param(
        {"hidden_size": 5, "direction": "reverse", "activations": ["Sigmoid", "Tanh", "Tanh"] * 2},
        f"attribute {NAMES_SOURCE}: expected 3*num_directions=3 names (f, g, h per direction, direction=reverse), "
        "got 6 [Sigmoid, Tanh, Tanh, Sigmoid, Tanh, Tanh]",
        id="activations_6_reverse",
    ),
    pytest.param(
        {"hidden_size": 5, "direction": "bidirectional", "activations": ["Sigmoid", "Tanh", "Tanh"]},
        f"attribute {NAMES_SOURCE}: expected 3*num_directions=6 names (f, g, h per direction, "
        "direction=bidirectional), got 3 [Sigmoid, Tanh, Tanh]",
        id="activations_3_bidirectional",
    ),
    # Surplus activation_alpha / activation_beta values are accepted and ignored, as onnxruntime's LSTM
    # does (tests/test_lstm_attribute_differential.py).
    pytest.param(
        {"hidden_size": 5, "clip": 0.0},
        "attribute clip: expected a positive threshold (+inf clips nothing), got 0.000000",
        id="clip_0",
    ),
    pytest.param(
        {"hidden_size": 5, "clip": -1.5},
        "attribute clip: expected a positive threshold (+inf clips nothing), got -1.500000",
        id="clip_neg",
    ),
    pytest.param(
        {"hidden_size": 5, "clip": float("nan")},
        "attribute clip: expected a positive threshold (+inf clips nothing), got nan",
        id="clip_nan",
    ),
    # clip=+inf (no clipping) and any nonzero input_forget are accepted, as in onnxruntime's LSTM.
    pytest.param({"hidden_size": 5, "layout": 2}, "attribute layout: expected 0 or 1, got 2", id="layout_2"),
    pytest.param({"hidden_size": 5, "layout": -1}, "attribute layout: expected 0 or 1, got -1", id="layout_neg"),
]


@pytest.mark.parametrize(("attributes", "message"), _ATTRIBUTE_ERRORS)
@pytest.mark.parametrize("op", OPS)
def test_attribute_error_at_session_creation(op: str, attributes: dict, message: str) -> None:
    with pytest.raises(RuntimeException, match=re.escape(_node(op) + message)):
        _create_session(op, attributes)


def test_message_of_a_node_without_name() -> None:
    model = _raw_model("LSTMTraining", _required("LSTMTraining"), {"hidden_size": 0}, name=None)
    with pytest.raises(RuntimeException, match=re.escape("LSTMTraining: attribute hidden_size: expected an integer")):
        _session_from_model(model)


# Attributes of another type than the spec declares. The C API (version 19) has no type query:
# the kernel probes each getter, and string lists show only where it can read them (>= 1.25).
_STRINGS_SEEN = "STRINGS" if READS_STRING_LISTS else "another type (not INT, FLOAT, STRING or a non-empty INTS, FLOATS)"
_WRONG_TYPES = [
    ("hidden_size", 5.0, "FLOAT"),
    ("hidden_size", [5], "INTS"),
    ("hidden_size", "5", "STRING"),
    ("direction", 2, "INT"),
    ("direction", ["reverse"], _STRINGS_SEEN),
    ("activations", "Sigmoid,Tanh,Tanh", "STRING"),
    ("activations", [1, 2, 3], "INTS"),
    ("activation_alpha", 0.5, "FLOAT"),
    ("activation_alpha", [1, 2], "INTS"),
    ("activation_beta", "1.0", "STRING"),
    ("activation_beta", 1, "INT"),
    ("activations_csv", ["Sigmoid", "Tanh", "Tanh"], _STRINGS_SEEN),
    ("activations_csv", 3, "INT"),
    ("clip", 1, "INT"),
    ("clip", [1.0], "FLOATS"),
    ("input_forget", 1.0, "FLOAT"),
    ("layout", "1", "STRING"),
    ("layout", [0.0], "FLOATS"),
    ("matmul_precision", 1, "INT"),
    ("matmul_precision", ["bfloat16"], _STRINGS_SEEN),
]


def test_wrong_types_cover_every_attribute() -> None:
    for op in OPS:
        assert {name for name, _, _ in _WRONG_TYPES} == set(schema.attribute_names(schema.op_by_name(op)))


@pytest.mark.parametrize(
    ("name", "value", "actual"),
    [pytest.param(name, value, actual, id=f"{name}_{actual.split()[0]}") for name, value, actual in _WRONG_TYPES],
)
@pytest.mark.parametrize("op", OPS)
def test_attribute_of_wrong_type(op: str, name: str, value: object, actual: str) -> None:
    """Refused by name when the session is created, not read as absent (direction=2 once ran forward)."""
    expected = schema.attribute(schema.op_by_name(op), name).type.name
    attributes = {"hidden_size": HIDDEN_SIZE, name: value}  # hidden_size's own cases overwrite it
    model = _raw_model(op, _required(op), attributes)
    message = f"{op} node 'raw': attribute {name}: expected {expected}, got {actual}"
    with pytest.raises(RuntimeException, match=re.escape(message)):
        _session_from_model(model)


# LSTMGrad derives f' and g' from the stashed activated gates, so f and g must be invertible.
_GATE_ALPHA_ERRORS = [
    pytest.param(
        {"direction": "forward", "activations": ["LeakyRelu", "Tanh", "Tanh"], "activation_alpha": [-0.5]},
        "LeakyRelu with alpha=-0.500000",
        id="leakyrelu_f",
    ),
    pytest.param(
        {"direction": "reverse", "activations": ["Sigmoid", "Elu", "Tanh"], "activation_alpha": [-1.0]},
        "Elu with alpha=-1.000000",
        id="elu_g",
    ),
    pytest.param(
        {
            "direction": "bidirectional",
            "activations": ["Sigmoid", "Tanh", "Tanh", "Sigmoid", "LeakyRelu", "Tanh"],
            "activation_alpha": [-0.25],
        },
        "LeakyRelu with alpha=-0.250000",
        id="leakyrelu_g_second_direction",
    ),
]


@pytest.mark.parametrize(("attributes", "what"), _GATE_ALPHA_ERRORS)
def test_grad_rejects_gate_activation_with_negative_alpha(attributes: dict, what: str) -> None:
    message = (
        f"{_node('LSTMGrad')}attribute activation_alpha: {what} maps negative and positive inputs onto the same "
        "outputs, so LSTMGrad cannot recover its derivative from the stashed gates; use alpha >= 0"
    )
    with pytest.raises(RuntimeException, match=re.escape(message)):
        _create_session("LSTMGrad", {"hidden_size": HIDDEN_SIZE, **attributes})


@pytest.mark.parametrize(("attributes", "what"), _GATE_ALPHA_ERRORS)
def test_training_accepts_negative_alpha(attributes: dict, what: str) -> None:
    del what  # the forward pass needs no inverse
    _create_session("LSTMTraining", {"hidden_size": HIDDEN_SIZE, **attributes})


@pytest.mark.parametrize(
    "attributes",
    [
        pytest.param({"activations": ["LeakyRelu", "Elu", "Tanh"], "activation_alpha": [0.0, 0.0]}, id="alpha_0"),
        pytest.param({"activations": ["Sigmoid", "Tanh", "LeakyRelu"], "activation_alpha": [-0.5]}, id="h_negative"),
        pytest.param({"activations": ["Sigmoid", "Tanh", "Elu"], "activation_alpha": [-0.5]}, id="h_elu_negative"),
    ],
)
def test_grad_accepts_invertible_gate_activations(attributes: dict) -> None:
    """Alpha = 0 keeps the derivative readable from the output; h is differentiated from C_t."""
    _create_session("LSTMGrad", {"hidden_size": HIDDEN_SIZE, **attributes})


# ---------------------------------------------------------------------------------------------
# activations vs activations_csv


def _activation_inputs(op: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """float64 inputs; LSTMGrad's stash comes from the oracle with ``_ACTIVATIONS``."""
    inputs = {
        "X": rng.standard_normal((SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE)),
        "W": rng.standard_normal((1, 4 * HIDDEN_SIZE, INPUT_SIZE)),
        "R": rng.standard_normal((1, 4 * HIDDEN_SIZE, HIDDEN_SIZE)),
    }
    if op == "LSTMGrad":
        forward = lstm_forward(**inputs, hidden_size=HIDDEN_SIZE, activations=_ACTIVATIONS)
        inputs.update(
            HAll=forward["HAll"],
            CAll=forward["CAll"],
            IOFC=forward["IOFC"],
            grad_HAll=rng.standard_normal(forward["HAll"].shape),
        )
    return inputs


def _run_raw(op: str, inputs: dict[str, np.ndarray], attributes: dict) -> dict[str, np.ndarray]:
    """Runs a float64 node whose attributes are exactly ``attributes`` plus hidden_size."""
    elem_types = dict.fromkeys(inputs, TensorProto.DOUBLE)
    model = _raw_model(op, {name: name for name in inputs}, {"hidden_size": HIDDEN_SIZE, **attributes}, elem_types)
    names = schema.output_names(schema.op_by_name(op))
    return dict(zip(names, _session_from_model(model).run(None, inputs), strict=True))


def _oracle(op: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if op == "LSTMTraining":
        return lstm_forward(**inputs, hidden_size=HIDDEN_SIZE, activations=_ACTIVATIONS)
    forward_inputs = {name: inputs[name] for name in ("X", "W", "R")}
    return lstm_backward(
        **forward_inputs, hidden_size=HIDDEN_SIZE, activations=_ACTIVATIONS, grad_HAll=inputs["grad_HAll"]
    )


_ACTIVATIONS = ["Relu", "Tanh", "Softsign"]


@pytest.mark.parametrize("op", OPS)
def test_activations_without_activations_csv(op: str, rng: np.random.Generator) -> None:
    """A string list alone works from onnxruntime 1.25; before, the session is refused.

    From 1.25 it gives the results of activations_csv. Before, the message says what to do,
    rather than the node computing with the default activations.
    """
    listed = {"activations": _ACTIVATIONS}
    if READS_STRING_LISTS:
        inputs = _activation_inputs(op, rng)
        actual = _run_raw(op, inputs, listed)
        expected = _run_raw(op, inputs, {"activations_csv": ",".join(_ACTIVATIONS)})
        for name, value in expected.items():
            np.testing.assert_array_equal(actual[name], value, err_msg=name)
    else:
        model = _raw_model(op, _required(op), {"hidden_size": HIDDEN_SIZE, **listed})
        message = (
            "raw': attribute activations cannot be read by custom-op kernels on onnxruntime older than 1.25 "
            "(its C API has no string-list attribute reader), and ignoring it would compute with the wrong "
            'activations. Also give the same names as the string attribute activations_csv, e.g. activations_csv="'
        )
        with pytest.raises(RuntimeException, match=re.escape(message)):
            _session_from_model(model)


@pytest.mark.parametrize(
    "attributes",
    [
        pytest.param({"activations_csv": " relu, TANH ,softsign"}, id="csv_case_and_spaces"),
        pytest.param({"activations": _ACTIVATIONS, "activations_csv": "RELU,tanh, SoftSign"}, id="both_agreeing"),
    ],
)
@pytest.mark.parametrize("op", OPS)
def test_activations_csv_matches_oracle(op: str, attributes: dict, rng: np.random.Generator) -> None:
    """Case and spaces do not matter, in activations_csv or between it and activations."""
    inputs = _activation_inputs(op, rng)
    actual = _run_raw(op, inputs, attributes)
    for name, value in _oracle(op, inputs).items():
        np.testing.assert_allclose(actual[name], value, rtol=FLOAT64_RTOL, atol=FLOAT64_RTOL, err_msg=name)


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(
            op,
            marks=pytest.mark.xfail(
                not READS_STRING_LISTS,
                strict=True,
                reason="onnxruntime < 1.25 cannot read `activations`, so a disagreeing activations_csv wins silently "
                "(the node computes with activations_csv's names)",
            ),
        )
        for op in OPS
    ],
)
def test_activations_and_csv_disagreeing_fail(op: str) -> None:
    attributes = {
        "hidden_size": HIDDEN_SIZE,
        "activations": ["Sigmoid", "Tanh", "Tanh"],
        "activations_csv": "Sigmoid,Tanh,Relu",
    }
    model = _raw_model(op, _required(op), attributes)
    message = (
        "raw': attributes activations and activations_csv disagree: activations has 3 names, "
        "activations_csv is 'Sigmoid,Tanh,Relu'"
    )
    with pytest.raises(RuntimeException, match=re.escape(message)):
        _session_from_model(model)


def test_activations_csv_error_names_activations_csv() -> None:
    """A node with activations_csv only: the message names the attribute the node has."""
    model = _raw_model(
        "LSTMTraining", _required("LSTMTraining"), {"hidden_size": HIDDEN_SIZE, "activations_csv": "Relu,Foo,Tanh"}
    )
    with pytest.raises(
        RuntimeException, match=re.escape("attribute activations_csv: unknown activation 'Foo' at position 1")
    ):
        _session_from_model(model)


@pytest.mark.parametrize(
    ("csv", "message"),
    [
        ("Relu,,Tanh", "attribute activations_csv: unknown activation '' at position 1"),
        ("Relu,Tanh,Softsign,", "attribute activations_csv: expected 3*num_directions=3 names"),
    ],
    ids=["empty_middle", "trailing_comma"],
)
def test_activations_csv_empty_entry(csv: str, message: str) -> None:
    model = _raw_model("LSTMTraining", _required("LSTMTraining"), {"hidden_size": HIDDEN_SIZE, "activations_csv": csv})
    with pytest.raises(RuntimeException, match=re.escape(message)):
        _session_from_model(model)


# ---------------------------------------------------------------------------------------------
# Shapes: checked at run(), after the session was created.


def _checked_ports(op: str) -> list[str]:
    return [port.name for port in schema.op_by_name(op).inputs if port.name != "X"]


_MUTATIONS = {
    "first_axis": lambda shape: (shape[0] + 1, *shape[1:]),
    "last_axis": lambda shape: (*shape[:-1], shape[-1] + 1),
    "extra_axis": lambda shape: (1, *shape),
    "missing_axis": lambda shape: shape[1:],
}


@pytest.mark.parametrize("mutation", list(_MUTATIONS))
@pytest.mark.parametrize("direction", schema.DIRECTIONS)
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize(("op", "port"), [(op, port) for op in SHAPE_OPS for port in _checked_ports(op)])
def test_shape_mismatch(
    op: str, port: str, layout: int, direction: str, mutation: str, rng: np.random.Generator
) -> None:
    attributes = {"hidden_size": HIDDEN_SIZE, "direction": direction, "layout": layout}
    inputs = _valid_inputs(op, layout, direction, rng)
    bad_shape = _MUTATIONS[mutation](inputs[port].shape)
    inputs[port] = np.zeros(bad_shape, dtype=inputs[port].dtype)
    session = _session(op, inputs, attributes)
    with pytest.raises(InvalidArgument, match=re.escape(_shape_message(op, port, layout, direction, bad_shape))):
        session.run(None, _feeds(inputs))


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op", SHAPE_OPS)
def test_valid_inputs_run(op: str, layout: int, rng: np.random.Generator) -> None:
    """The baseline of test_shape_mismatch: the unmodified inputs pass validation."""
    for direction in schema.DIRECTIONS:
        attributes = {"hidden_size": HIDDEN_SIZE, "direction": direction, "layout": layout}
        _run(op, _valid_inputs(op, layout, direction, rng), attributes)


@pytest.mark.parametrize("rank", [2, 4])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op", SHAPE_OPS)
def test_x_rank(op: str, layout: int, rank: int, rng: np.random.Generator) -> None:
    inputs = _valid_inputs(op, layout, "forward", rng)
    shape = inputs["X"].shape[1:] if rank == 2 else (1, *inputs["X"].shape)
    inputs["X"] = np.zeros(shape, dtype=np.float32)
    axes = "[seq_length, batch_size, input_size]" if layout == 0 else "[batch_size, seq_length, input_size]"
    message = f"{_node(op)}X: expected rank 3 {axes} (layout={layout}), got rank {rank} [{', '.join(map(str, shape))}]"
    session = _session(op, inputs, {"hidden_size": HIDDEN_SIZE, "layout": layout})
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        session.run(None, _feeds(inputs))


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op", OPS)
def test_dims_are_read_from_x(op: str, layout: int, rng: np.random.Generator) -> None:
    """X defines seq_length, batch_size and input_size; the first tensor that disagrees is named."""
    attributes = {"hidden_size": HIDDEN_SIZE, "layout": layout}
    seq_axis, batch_axis = (0, 1) if layout == 0 else (1, 0)
    cases = {  # X axis -> (its new size, the message)
        2: (
            INPUT_SIZE + 2,
            f"W: expected [num_directions(direction=forward)=1, 4*hidden_size={4 * HIDDEN_SIZE}, "
            f"input_size={INPUT_SIZE + 2}], got [1, {4 * HIDDEN_SIZE}, {INPUT_SIZE}]",
        ),
        batch_axis: (BATCH_SIZE + 1, f"sequence_lens: expected [batch_size={BATCH_SIZE + 1}], got [{BATCH_SIZE}]"),
        seq_axis: (
            SEQ_LENGTH - 1,
            f"sequence_lens: every value must be in [0, seq_length={SEQ_LENGTH - 1}], "
            f"got {SEQUENCE_LENS[0]} at index 0",
        ),
    }
    for axis, (size, message) in cases.items():
        inputs = _valid_inputs(op, layout, "forward", rng)
        shape = list(inputs["X"].shape)
        shape[axis] = size
        inputs["X"] = np.zeros(shape, dtype=np.float32)
        session = _session(op, inputs, attributes)
        with pytest.raises(InvalidArgument, match=re.escape(_node(op) + message)):
            session.run(None, _feeds(inputs))


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize(
    ("lens", "message"),
    [
        pytest.param((SEQ_LENGTH + 1, 1), f"got {SEQ_LENGTH + 1} at index 0", id="above"),
        pytest.param((1, -1), "got -1 at index 1", id="negative"),
        pytest.param((2**31 - 1, 0), f"got {2**31 - 1} at index 0", id="int32_max"),
        pytest.param((0, -(2**31)), f"got {-(2**31)} at index 1", id="int32_min"),
    ],
)
@pytest.mark.parametrize("op", OPS)
def test_sequence_lens_out_of_range(
    op: str, lens: tuple[int, int], message: str, layout: int, rng: np.random.Generator
) -> None:
    inputs = _valid_inputs(op, layout, "forward", rng)
    inputs["sequence_lens"] = np.array(lens, dtype=np.int32)
    expected = f"{_node(op)}sequence_lens: every value must be in [0, seq_length={SEQ_LENGTH}], {message}"
    session = _session(op, inputs, {"hidden_size": HIDDEN_SIZE, "layout": layout})
    with pytest.raises(InvalidArgument, match=re.escape(expected)):
        session.run(None, _feeds(inputs))


# ---------------------------------------------------------------------------------------------
# LSTMGrad attributes that contradict the forward tensors it is given.


def _forward_stash(layout: int, direction: str, hidden_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """LSTMGrad's required inputs from a real LSTMTraining run with these attributes."""
    num_directions = _num_directions(direction)
    x_shape = (SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE) if layout == 0 else (BATCH_SIZE, SEQ_LENGTH, INPUT_SIZE)
    inputs = {
        "X": rng.standard_normal(x_shape),
        "W": rng.standard_normal((num_directions, 4 * hidden_size, INPUT_SIZE)),
        "R": rng.standard_normal((num_directions, 4 * hidden_size, hidden_size)),
    }
    attributes = {"hidden_size": hidden_size, "direction": direction, "layout": layout}
    forward = op_runner.run("LSTMTraining", inputs, attributes, dtype=np.float32)
    return {**inputs, "HAll": forward["HAll"], "CAll": forward["CAll"], "IOFC": forward["IOFC"]}


def test_grad_hidden_size_contradicts_tensors(rng: np.random.Generator) -> None:
    stash = _forward_stash(0, "forward", HIDDEN_SIZE, rng)
    message = (
        f"{_node('LSTMGrad')}W: expected [num_directions(direction=forward)=1, 4*hidden_size={4 * (HIDDEN_SIZE - 1)}, "
        f"input_size={INPUT_SIZE}], got [1, {4 * HIDDEN_SIZE}, {INPUT_SIZE}]"
    )
    session = _session("LSTMGrad", stash, {"hidden_size": HIDDEN_SIZE - 1})
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        session.run(None, _feeds(stash))


@pytest.mark.parametrize(
    ("attribute", "tensors"),
    [
        ("forward", "bidirectional"),
        ("reverse", "bidirectional"),
        ("bidirectional", "forward"),
        ("bidirectional", "reverse"),
    ],
)
def test_grad_direction_contradicts_tensors(attribute: str, tensors: str, rng: np.random.Generator) -> None:
    stash = _forward_stash(0, tensors, HIDDEN_SIZE, rng)
    message = (
        f"{_node('LSTMGrad')}W: expected [num_directions(direction={attribute})={_num_directions(attribute)}, "
        f"4*hidden_size={4 * HIDDEN_SIZE}, input_size={INPUT_SIZE}], "
        f"got [{_num_directions(tensors)}, {4 * HIDDEN_SIZE}, {INPUT_SIZE}]"
    )
    session = _session("LSTMGrad", stash, {"hidden_size": HIDDEN_SIZE, "direction": attribute})
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        session.run(None, _feeds(stash))


@pytest.mark.parametrize("tensor_layout", [0, 1])
def test_grad_layout_contradicts_tensors(tensor_layout: int, rng: np.random.Generator) -> None:
    """X alone cannot tell (it is just [a, b, input_size]); the stash's axis order can."""
    stash = _forward_stash(tensor_layout, "forward", HIDDEN_SIZE, rng)
    attribute_layout = 1 - tensor_layout
    # X [SEQ_LENGTH, BATCH_SIZE, ...] read in the other layout swaps the two sizes.
    seq_length, batch_size = BATCH_SIZE, SEQ_LENGTH
    if attribute_layout == 1:
        expected = f"batch_size={batch_size}, seq_length={seq_length}, num_directions=1, hidden_size={HIDDEN_SIZE}"
    else:
        expected = f"seq_length={seq_length}, num_directions=1, batch_size={batch_size}, hidden_size={HIDDEN_SIZE}"
    got = ", ".join(map(str, stash["HAll"].shape))
    message = f"{_node('LSTMGrad')}HAll: expected [{expected}], got [{got}]"
    session = _session("LSTMGrad", stash, {"hidden_size": HIDDEN_SIZE, "layout": attribute_layout})
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        session.run(None, _feeds(stash))


# ---------------------------------------------------------------------------------------------
# Sizes beyond what BLAS takes (32-bit dims), with empty tensors so nothing is allocated.

_BLAS_LIMIT = 2**31 - 1


@pytest.mark.parametrize(
    ("x_shape", "hidden_size", "message"),
    [
        pytest.param(
            (2**16, 2**16, 0),
            1,
            "X: seq_length*batch_size=4294967296, seq_length*4*hidden_size=262144, batch_size=65536, input_size=0",
            id="rows",
        ),
        pytest.param(
            (2**29, 1, 0),
            2,
            "X: seq_length*batch_size=536870912, seq_length*4*hidden_size=4294967296, batch_size=1, input_size=0",
            id="gates",
        ),
        pytest.param(
            (3, 1, 0),
            MAX_HIDDEN_SIZE,
            f"X: seq_length*batch_size=3, seq_length*4*hidden_size={3 * 4 * MAX_HIDDEN_SIZE}, batch_size=1, "
            "input_size=0",
            id="hidden",
        ),
        pytest.param(
            (0, 1, 2**31),
            1,
            "X: seq_length*batch_size=0, seq_length*4*hidden_size=0, batch_size=1, input_size=2147483648",
            id="input",
        ),
        # seq_length = 0 must not let a batch_size through that no GEMM takes.
        pytest.param(
            (0, 2**31, 0),
            1,
            "X: seq_length*batch_size=0, seq_length*4*hidden_size=0, batch_size=2147483648, input_size=0",
            id="batch",
        ),
    ],
)
@pytest.mark.parametrize("op", OPS)
def test_dims_beyond_blas(op: str, x_shape: tuple[int, int, int], hidden_size: int, message: str) -> None:
    # The check comes first, so the other inputs only need to exist.
    inputs = {port: np.zeros((1, 1, 0), np.float32) for port in _required(op) if port != "X"}
    inputs["X"] = np.zeros(x_shape, np.float32)
    expected = f"{_node(op)}{message}: each must be at most {_BLAS_LIMIT}, the largest dimension BLAS accepts"
    session = _session(op, inputs, {"hidden_size": hidden_size})
    with pytest.raises(InvalidArgument, match=re.escape(expected)):
        session.run(None, _feeds(inputs))


# Shapes whose dim products pass 64 bits. A check that wrapped once passed X of shape
# [2**62, 0, 1] (seq_length*4*hidden_size = 2**64 -> 0) and the kernel looped over 2**62 empty steps,
# so these run in a child with a timeout: a hang fails the test instead of stalling the suite.
# X is an OrtValue (numpy makes no such arrays); the other inputs only need to exist.

_OVERFLOW_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import onnxruntime as ort
    sys.path.insert(0, {tests!r})
    import op_runner

    for case, (op, inputs, x_shape, attributes) in json.loads({cases!r}).items():
        session = op_runner.session(op, inputs, ["Ht"] if op == "LSTMTraining" else ["dX"], np.float32, attributes)
        feeds = {{name: ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 1, 0), np.float32)) for name in inputs}}
        feeds["X"] = ort.OrtValue.ortvalue_from_shape_and_type(x_shape, np.float32)
        start = time.perf_counter()
        try:
            session.run_with_ort_values(None, feeds)
            message = "no error"
        except Exception as error:
            message = str(error)
        print(json.dumps({{case: [message, time.perf_counter() - start]}}), flush=True)
    """
)

_BLAS_MESSAGE = (
    "X: seq_length*batch_size={}, seq_length*4*hidden_size={}, batch_size={}, input_size={}: each must be at most "
    "2147483647, the largest dimension BLAS accepts"
)
_BUFFER_LIMIT = (2**63 - 1) // 8
_OVERFLOWS = {
    # id: (X shape, attributes, message after the node prefix)
    "seq_2**62": ((2**62, 0, 1), {"hidden_size": 1}, _BLAS_MESSAGE.format(0, 2**64, 0, 1)),
    "seq_2**61_hidden_2": ((2**61, 0, 1), {"hidden_size": 2}, _BLAS_MESSAGE.format(0, 2**64, 0, 1)),
    "seq_2**63-1": ((2**63 - 1, 0, 1), {"hidden_size": 1}, _BLAS_MESSAGE.format(0, 4 * (2**63 - 1), 0, 1)),
    "seq_2**62_layout_1": ((0, 2**62, 1), {"hidden_size": 1, "layout": 1}, _BLAS_MESSAGE.format(0, 2**64, 0, 1)),
    "batch_2**62": ((0, 2**62, 1), {"hidden_size": 1}, _BLAS_MESSAGE.format(0, 0, 2**62, 1)),
    "batch_2**62_input_2**62": ((0, 2**62, 2**62), {"hidden_size": 1}, _BLAS_MESSAGE.format(0, 0, 2**62, 2**62)),
    "seq_and_input_2**40": ((2**40, 0, 2**40), {"hidden_size": 1}, _BLAS_MESSAGE.format(0, 2**42, 0, 2**40)),
    # Within BLAS's sizes, but IOFC would need more than 2**63 bytes as float64.
    "iofc_elements": (
        (1, 2**31 - 1, 0),
        {"hidden_size": MAX_HIDDEN_SIZE, "direction": "bidirectional"},
        "X: [seq_length, num_directions, batch_size, 4*hidden_size] (IOFC and the gate scratch) would hold "
        f"{2 * (2**31 - 1) * 4 * MAX_HIDDEN_SIZE} elements, more than {_BUFFER_LIMIT}, the most one buffer may hold "
        "(2**63 bytes of float64)",
    ),
    # seq_length = 0 zeroes IOFC, but a step's gate gradients are still formed.
    "step_elements": (
        (0, 2**31 - 1, 0),
        {"hidden_size": MAX_HIDDEN_SIZE},
        "X: [batch_size, 4*hidden_size] (one step's gates) would hold "
        f"{(2**31 - 1) * 4 * MAX_HIDDEN_SIZE} elements, more than {_BUFFER_LIMIT}, the most one buffer may hold "
        "(2**63 bytes of float64)",
    ),
}


@pytest.fixture(scope="module")
def overflow_results() -> dict[str, tuple[str, float]]:
    """(message, seconds) of every _OVERFLOWS case in both ops, from one child process."""
    cases = {
        f"{op}-{case}": (op, list(_required(op)), x_shape, attributes)
        for op in OPS
        for case, (x_shape, attributes, _) in _OVERFLOWS.items()
    }
    script = _OVERFLOW_SCRIPT.format(tests=str(Path(__file__).parent), cases=json.dumps(cases))
    try:
        # cwd outside the checkout: from its root, `import ortlstm` would find the source folder.
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"a shape was not refused: the child hung; it printed {error.stdout!r}")
    assert result.returncode == 0, f"child crashed (rc={result.returncode}): {result.stderr[-3000:]}"
    results: dict[str, tuple[str, float]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            results.update({case: (message, seconds) for case, (message, seconds) in json.loads(line).items()})
    return results


@pytest.mark.parametrize("case", list(_OVERFLOWS))
@pytest.mark.parametrize("op", OPS)
def test_dims_overflowing_64_bits(overflow_results: dict[str, tuple[str, float]], op: str, case: str) -> None:
    message, seconds = overflow_results[f"{op}-{case}"]
    assert f"{_node(op)}{_OVERFLOWS[case][2]}" in message
    assert seconds < 1.0, f"refused after {seconds:.2f} s"


# ---------------------------------------------------------------------------------------------
# Element types and missing inputs: onnxruntime's own messages.


@pytest.mark.parametrize("op", OPS)
def test_sequence_lens_int64_in_graph(op: str) -> None:
    inputs = {**_required(op), "sequence_lens": "sequence_lens"}
    model = _raw_model(op, inputs, {"hidden_size": HIDDEN_SIZE}, {"sequence_lens": TensorProto.INT64})
    message = f"Type 'tensor(int64)' of input parameter (sequence_lens) of operator ({op}) in node (raw) is invalid"
    with pytest.raises(InvalidGraph, match=re.escape(message)):
        _session_from_model(model)


@pytest.mark.parametrize("op", OPS)
def test_float16_in_graph(op: str) -> None:
    model = _raw_model(op, _required(op), {"hidden_size": HIDDEN_SIZE}, {"X": TensorProto.FLOAT16})
    message = f"Type 'tensor(float16)' of input parameter (X) of operator ({op}) in node (raw) is invalid"
    with pytest.raises(InvalidGraph, match=re.escape(message)):
        _session_from_model(model)


@pytest.mark.parametrize("op", OPS)
def test_sequence_lens_int64_fed(op: str, rng: np.random.Generator) -> None:
    inputs = _valid_inputs(op, 0, "forward", rng)
    session = _session(op, inputs, {"hidden_size": HIDDEN_SIZE})
    feeds = {**_feeds(inputs), "sequence_lens": inputs["sequence_lens"].astype(np.int64)}
    with pytest.raises(
        InvalidArgument,
        match=re.escape("Unexpected input data type. Actual: (tensor(int64)) , expected: (tensor(int32))"),
    ):
        session.run(None, feeds)


@pytest.mark.xfail(strict=True, reason="onnxruntime's feed type check does not name the input (outside ortlstm)")
def test_sequence_lens_int64_fed_names_the_input(rng: np.random.Generator) -> None:
    inputs = _valid_inputs("LSTMTraining", 0, "forward", rng)
    session = _session("LSTMTraining", inputs, {"hidden_size": HIDDEN_SIZE})
    feeds = {**_feeds(inputs), "sequence_lens": inputs["sequence_lens"].astype(np.int64)}
    with pytest.raises(InvalidArgument, match="sequence_lens"):
        session.run(None, feeds)


_MIXED = [("LSTMTraining", "W"), ("LSTMTraining", "X"), ("LSTMGrad", "HAll"), ("LSTMGrad", "R")]


@pytest.mark.parametrize(("op", "port"), _MIXED)
def test_mixed_float_and_double(op: str, port: str) -> None:
    model = _raw_model(op, _required(op), {"hidden_size": HIDDEN_SIZE}, {port: TensorProto.DOUBLE})
    with pytest.raises(
        Fail,
        match=re.escape(f"Node (raw) Op ({op})") + ".*" + re.escape(f"no kernel def matches node inputs for Op: {op}"),
    ):
        _session_from_model(model)


@pytest.mark.xfail(
    strict=True,
    reason="onnxruntime's custom-op type check says 'no kernel def matches node inputs' without naming the input "
    "whose type differs; the float and double kernels are separate registrations",
)
@pytest.mark.parametrize(("op", "port"), _MIXED)
def test_mixed_float_and_double_names_the_input(op: str, port: str) -> None:
    model = _raw_model(op, _required(op), {"hidden_size": HIDDEN_SIZE}, {port: TensorProto.DOUBLE})
    with pytest.raises(Fail, match=rf"\b{port}\b"):
        _session_from_model(model)


@pytest.mark.parametrize(("op", "port"), [("LSTMTraining", "X"), ("LSTMGrad", "HAll")])
def test_required_input_missing(op: str, port: str) -> None:
    """Onnxruntime rejects the graph itself; the kernel's own 'is required but missing' is a backstop."""
    node = helper.make_node(
        op,
        [name if name != port else "" for name in ordered_inputs(schema.op_by_name(op), _required(op))],
        list(schema.output_names(schema.op_by_name(op))),
        name="raw",
        domain=schema.DOMAIN,
        hidden_size=HIDDEN_SIZE,
    )
    graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in node.input if name]
    graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output]
    model = helper.make_model(
        helper.make_graph([node], op, graph_inputs, graph_outputs),
        opset_imports=[
            helper.make_opsetid("", op_runner.ONNX_OPSET),
            helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION),
        ],
        ir_version=op_runner.IR_VERSION,
    )
    index = schema.input_index(schema.op_by_name(op), port)
    with pytest.raises(
        InvalidGraph, match=re.escape(f"Node (raw)'s input {index} is marked single but has an empty string")
    ):
        _session_from_model(model)


# ---------------------------------------------------------------------------------------------
# Out of memory: in a child process whose address space is capped just above what it holds, so
# the allocation fails the same way on every machine.

_OOM_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import op_runner

    for case, (op, outputs, shapes, warm_up_shapes, attributes) in json.loads({cases!r}).items():
        session = op_runner.session(op, list(shapes), outputs, np.float32, attributes)
        # Warm-up at a small size: BLAS buffers and the arena are set up before the cap.
        session.run(outputs, {{name: np.ones(shape, np.float32) for name, shape in warm_up_shapes.items()}})
        feeds = {{name: np.zeros(shape, np.float32) for name, shape in shapes.items()}}
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
        resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, resource.RLIM_INFINITY))
        try:
            session.run(outputs, feeds)
            message = "no error"
        except Exception as error:
            message = type(error).__name__ + " " + str(error)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        del feeds
        print(json.dumps({{case: message}}), flush=True)
    """
)

_OOM_HIDDEN_SIZE = 4
_OOM_CASES = {
    # 2**26 rows x 4*4 gates x 4 bytes = 4 GiB of gate scratch; only Ht (256 floats) is requested.
    "training_scratch": (
        "LSTMTraining",
        ["Ht"],
        {"X": (2**20, 64, 0), "W": (1, 16, 0), "R": (1, 16, _OOM_HIDDEN_SIZE)},
        0,
    ),
    # HAll (1 GiB) is the first allocation: onnxruntime's message, prefixed with the output's name.
    "training_output": (
        "LSTMTraining",
        ["HAll"],
        {"X": (2**20, 64, 0), "W": (1, 16, 0), "R": (1, 16, _OOM_HIDDEN_SIZE)},
        0,
    ),
    # The stash (6 x 128 MiB) fits under the cap; the gate-gradient scratch (5 x 128 MiB) does not.
    # layout=1 keeps the whole sequence's gate gradients (with layout 0 LSTMGrad holds them for a
    # window of steps at a time, a few KiB here).
    "grad_scratch": (
        "LSTMGrad",
        ["dB"],
        {
            "X": (64, 2**17, 0),
            "W": (1, 16, 0),
            "R": (1, 16, _OOM_HIDDEN_SIZE),
            "HAll": (64, 2**17, 1, _OOM_HIDDEN_SIZE),
            "CAll": (64, 2**17, 1, _OOM_HIDDEN_SIZE),
            "IOFC": (64, 2**17, 1, 4 * _OOM_HIDDEN_SIZE),
        },
        1,
    ),
}


def _warm_up_shape(name: str, shape: tuple[int, ...], layout: int) -> tuple[int, ...]:
    """The same shape with seq_length and batch_size 1."""
    if name == "X":
        return (1, 1, *shape[2:])
    if len(shape) == 4:
        return (1, shape[1], 1, shape[3]) if layout == 0 else (1, 1, shape[2], shape[3])
    return shape


@pytest.fixture(scope="module")
def out_of_memory_messages() -> dict[str, str]:
    """Each _OOM_CASES entry's error message, all from one child process.

    One child for all: importing onnxruntime-training takes seconds.
    """
    cases = {
        case: (
            op,
            outputs,
            shapes,
            {name: _warm_up_shape(name, shape, layout) for name, shape in shapes.items()},
            {"hidden_size": _OOM_HIDDEN_SIZE, "layout": layout},
        )
        for case, (op, outputs, shapes, layout) in _OOM_CASES.items()
    }
    script = _OOM_SCRIPT.format(tests=str(Path(__file__).parent), cases=json.dumps(cases))
    # cwd outside the checkout: from its root, `import ortlstm` would find the source folder, not the install.
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    assert result.returncode == 0, f"child crashed (rc={result.returncode}): {result.stderr[-3000:]}"
    messages: dict[str, str] = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            messages.update(json.loads(line))
    return messages


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("training_scratch", "Fail [ONNXRuntimeError] : 1 : FAIL : "),
        ("training_scratch", f"{_node('LSTMTraining')}out of memory for the scratch buffers"),
        ("training_output", f"{_node('LSTMTraining')}HAll: "),
        ("grad_scratch", f"{_node('LSTMGrad')}out of memory for the scratch buffers"),
    ],
)
def test_out_of_memory(out_of_memory_messages: dict[str, str], case: str, message: str) -> None:
    assert message in out_of_memory_messages[case], out_of_memory_messages
