"""The op contract stays in sync everywhere: generated files, C++ enums, onnx and onnxscript.

ops/schema.py is the only place the contract is written. These tests fail when a generated file
is stale (with the diff to apply), when the C++ enums drift from the ports, or when the onnx
schema registered from the spec stops validating and inferring what the spec says.
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import onnx.checker
import onnx.helper
import onnx.shape_inference
import onnx_ir as ir
import onnxscript
import pytest
from onnxscript import FLOAT

from ortlstm.ops import codegen, onnx_defs, schema

# The checkout this test file sits in: the checked-in generated files live there, also when the
# package under test is installed elsewhere (codegen.REPO_ROOT then points into site-packages).
REPO_ROOT = Path(__file__).resolve().parents[1]
_IR_VERSION = 10  # the newest IR version onnxruntime-training 1.19.2 loads
_ONNX_OPSET = 17

# One shape config for the graph tests: odd sizes so that no two dims coincide by accident.
_DIMS = {"seq_length": 5, "batch_size": 3, "input_size": 7, "hidden_size": 4}
_EVERY_OP = schema.OPS + schema.OPTIMIZER_OPS + schema.CTC_OPS + schema.GRADIENT_OPS


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    onnx_defs.register_onnx_schemas()


def test_generated_files_are_current() -> None:
    stale = codegen.stale_files(REPO_ROOT)
    if stale:
        pytest.fail(
            "generated files differ from ops/schema.py; run `python -m ortlstm.ops.codegen`:\n"
            + "\n".join(stale.values()),
            pytrace=False,
        )


def test_check_mode_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    codegen.write_all(tmp_path)
    assert codegen.main(["--check", "--root", str(tmp_path)]) == 0
    header = tmp_path / codegen.HEADER_PATH
    header.write_text(header.read_text(encoding="utf-8").replace("kSequenceLens", "kSeqLens"), encoding="utf-8")
    assert codegen.main(["--check", "--root", str(tmp_path)]) == 1
    assert "+enum class In : int { kX, kW, kR, kB, kSequenceLens," in capsys.readouterr().out


@pytest.mark.parametrize(
    ("port_name", "enumerator"),
    [
        ("X", "kX"),
        ("sequence_lens", "kSequenceLens"),
        ("initial_h", "kInitialH"),
        ("IOFC", "kIOFC"),
        ("grad_HAll", "kGradHAll"),
        ("dH0", "kDH0"),
    ],
)
def test_cpp_enumerator_rule(port_name: str, enumerator: str) -> None:
    assert codegen.cpp_enumerator(port_name) == enumerator


@pytest.mark.parametrize("op", _EVERY_OP, ids=lambda op: op.name)
def test_header_enums_list_every_port_in_order(op: schema.OpSpec) -> None:
    header = codegen.render_header()
    namespace = re.search(rf"namespace {codegen.cpp_namespace(op.name)} {{\n(.*?)\n}}", header, re.DOTALL)
    assert namespace is not None, f"namespace {codegen.cpp_namespace(op.name)} missing from the header"
    for enum_name, ports in (("In", op.inputs), ("Out", op.outputs)):
        match = re.search(rf"enum class {enum_name} : int {{ (.*) }};", namespace[1])
        assert match is not None, f"{op.name}: enum class {enum_name} missing"
        enumerators = match[1].split(", ")
        expected = [codegen.cpp_enumerator(port.name) for port in ports]
        assert enumerators == [*expected, "kCount"], f"{op.name}::{enum_name}"
        assert len(set(enumerators)) == len(ports) + 1, f"{op.name}::{enum_name} has duplicate enumerators"


def test_spec_index_helpers() -> None:
    assert schema.input_index(schema.LSTM_GRAD, "P") == len(schema.LSTM_GRAD.inputs) - 1
    assert schema.output_index(schema.LSTM_TRAINING, "IOFC") == 4
    assert schema.input_names(schema.LSTM_GRAD)[:3] == ("X", "W", "R")
    with pytest.raises(KeyError, match="LSTMTraining has no input 'Y'; inputs are"):
        schema.input_index(schema.LSTM_TRAINING, "Y")
    with pytest.raises(ValueError, match="shape entry 'four\\*hidden_size'"):
        schema.parse_dim("four*hidden_size")


def test_registration_is_idempotent() -> None:
    onnx_defs.register_onnx_schemas()
    onnx_defs.register_onnx_schemas()
    for op in _EVERY_OP:
        registered = onnx.defs.get_schema(op.name, op.version, op.domain)
        assert [port.name for port in registered.inputs] == list(schema.input_names(op))
        for attr in op.attributes:
            registered_attr = registered.attributes[attr.name]
            assert registered_attr.required == attr.required, attr.name
            default = (
                onnx.helper.get_attribute_value(registered_attr.default_value) if attr.default is not None else None
            )
            expected = attr.default.encode() if isinstance(attr.default, str) else attr.default
            assert default == expected, attr.name


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("op", schema.OPS, ids=lambda op: op.name)
def test_checker_accepts_node_and_infers_spec_shapes(op: schema.OpSpec, direction: str, layout: int) -> None:
    dims = {**_DIMS, "num_directions": schema.num_directions(direction)}
    model = _model(
        op,
        dims,
        schema.input_names(op),
        onnx.TensorProto.DOUBLE,
        hidden_size=dims["hidden_size"],
        direction=direction,
        layout=layout,
    )
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    actual = {value.name: value.type.tensor_type for value in inferred.graph.output}
    for port in op.outputs:
        assert actual[port.name].elem_type == onnx.TensorProto.DOUBLE, port.name
        shape = [dim.dim_value for dim in actual[port.name].shape.dim]
        assert shape == _concrete_shape(port, dims, layout), f"{op.name}.{port.name}"


def test_shape_inference_keeps_symbolic_dims() -> None:
    model = _lstm_training_model(hidden_size=4)
    (x,) = [value for value in model.graph.input if value.name == "X"]
    for dim, symbol in zip(x.type.tensor_type.shape.dim, ("seq", "batch"), strict=False):
        dim.dim_param = symbol
    (sequence_lens,) = [value for value in model.graph.input if value.name == "sequence_lens"]
    sequence_lens.type.tensor_type.shape.dim[0].dim_param = "batch"
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    actual = {
        value.name: [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]
        for value in inferred.graph.output
    }
    assert actual["HAll"] == ["seq", 1, "batch", 4]
    assert actual["IOFC"] == ["seq", 1, "batch", 16]
    assert actual["Ht"] == [1, "batch", 4]


def test_checker_rejects_wrong_attribute_type() -> None:
    model = _lstm_training_model(hidden_size=4.0)
    with pytest.raises(onnx.checker.ValidationError, match="Mismatched attribute type in ' : hidden_size'"):
        onnx.checker.check_model(model)


def test_checker_rejects_missing_hidden_size() -> None:
    model = _lstm_training_model()
    with pytest.raises(onnx.checker.ValidationError, match="Required attribute 'hidden_size' is missing"):
        onnx.checker.check_model(model)


def test_checker_rejects_int64_sequence_lens() -> None:
    model = _lstm_training_model(hidden_size=4)
    (sequence_lens,) = [value for value in model.graph.input if value.name == "sequence_lens"]
    sequence_lens.type.tensor_type.elem_type = onnx.TensorProto.INT64
    with pytest.raises(onnx.shape_inference.InferenceError, match="sequence_lens typestr: T1, has unsupported type"):
        onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"hidden_size": 5}, "hidden_size is 4 from W axis 1 \\(4\\*hidden_size\\) but 5 from attribute hidden_size"),
        ({"hidden_size": 4, "direction": "bidirectional"}, "num_directions is 1 from W axis 0"),
        ({"hidden_size": 4, "direction": "sideways"}, "direction: expected one of"),
        ({"hidden_size": 4, "layout": 2}, "layout must be 0 or 1, got 2"),
    ],
)
def test_shape_inference_names_inconsistent_dims(attributes: dict[str, object], message: str) -> None:
    with pytest.raises(onnx.shape_inference.InferenceError, match=message):
        onnx.checker.check_model(_lstm_training_model(**attributes), full_check=True)


def test_onnxscript_script_builds_node_in_domain() -> None:
    ortlstm = onnx_defs.opset()

    @onnxscript.script(default_opset=onnxscript.opset17)
    def forward(x: FLOAT[5, 3, 7], w: FLOAT[1, 16, 7], r: FLOAT[1, 16, 4]):
        all_hidden, _last_hidden, _last_cell, _all_cells, _gates = ortlstm.LSTMTraining(x, w, r, hidden_size=4)
        return all_hidden

    (node,) = forward.to_model_proto().graph.node
    assert (node.domain, node.op_type, len(node.output)) == (schema.DOMAIN, "LSTMTraining", 5)


def test_onnxscript_graph_builder_takes_output_count() -> None:
    inputs = [ir.Value(name=name) for name in ("x", "w", "r")]
    graph = ir.Graph(inputs=inputs, outputs=[], nodes=[], opset_imports={"": _ONNX_OPSET, schema.DOMAIN: 1})
    ortlstm = onnxscript.GraphBuilder(graph).opset(schema.DOMAIN, schema.OPSET_VERSION)
    outputs = ortlstm.LSTMTraining(*inputs, hidden_size=4, _outputs=len(schema.LSTM_TRAINING.outputs))
    node = outputs[0].producer()
    assert (node.domain, node.op_type, node.version, len(node.outputs)) == (schema.DOMAIN, "LSTMTraining", 1, 5)


def _concrete_shape(port: schema.PortSpec, dims: dict[str, int], layout: int) -> list[int]:
    shape = []
    for expression in schema.shape_for_layout(port, layout):
        factor, name = schema.parse_dim(expression)
        shape.append(factor * dims[name])
    return shape


def _elem_type(op: schema.OpSpec, port: schema.PortSpec, float_type: int) -> int:
    allowed = {constraint.type_str: constraint.allowed_types for constraint in op.type_constraints}[port.type_str]
    return onnx.TensorProto.INT32 if allowed == ("tensor(int32)",) else float_type


def _model(
    op: schema.OpSpec,
    dims: dict[str, int],
    present_inputs: tuple[str, ...],
    float_type: int = onnx.TensorProto.FLOAT,
    **attributes: object,
) -> onnx.ModelProto:
    """A one-node model with the op's inputs in ``present_inputs`` and all of its outputs."""
    layout = attributes.get("layout", 0)
    layout = layout if layout in (0, 1) else 0
    graph_inputs = [
        onnx.helper.make_tensor_value_info(
            port.name, _elem_type(op, port, float_type), _concrete_shape(port, dims, int(layout))
        )
        for port in op.inputs
        if port.name in present_inputs
    ]
    graph_outputs = [
        onnx.helper.make_tensor_value_info(port.name, float_type, [None] * len(port.shape)) for port in op.outputs
    ]
    node_inputs = [name if name in present_inputs else "" for name in schema.input_names(op)]
    while node_inputs[-1] == "":
        node_inputs.pop()
    node = onnx.helper.make_node(op.name, node_inputs, list(schema.output_names(op)), domain=op.domain, **attributes)
    graph = onnx.helper.make_graph([node], "schema_sync", graph_inputs, graph_outputs)
    return onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", _ONNX_OPSET),
            onnx.helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION),
        ],
        ir_version=_IR_VERSION,
    )


def _lstm_training_model(**attributes: object) -> onnx.ModelProto:
    """LSTMTraining over X, W, R and sequence_lens, one direction, with the given attributes."""
    dims = {**_DIMS, "num_directions": 1}
    return _model(schema.LSTM_TRAINING, dims, ("X", "W", "R", "sequence_lens"), **attributes)
