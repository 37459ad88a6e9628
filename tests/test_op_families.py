"""Op families are data: a family declared outside ops/ renders through codegen and onnx_defs unedited.

ops/family.py says what a family is made of; codegen and onnx_defs iterate ``schema.FAMILIES`` and
never name a family. The toy family below is declared here, in a test module, and must come out
in the C++ header (ports, traits, output shapes), in docs/ops.md and in onnx's shape inference
exactly as the real families do, with no edit to either renderer.
"""

from __future__ import annotations

import onnx
import onnx.checker
import onnx.defs
import onnx.helper
import onnx.shape_inference
import pytest

from ortlstm.ops import codegen, onnx_defs, schema

_TOY_DOMAIN = "test.ortlstm.families"  # not the real domain: onnx's registry is global to the process
_FLOAT = schema.TypeConstraintSpec("T", ("tensor(float)", "tensor(double)"), "float32 or float64.")
_INDEX = schema.TypeConstraintSpec("I", ("tensor(int64)",), "int64 indices.")


def _port(name: str, type_str: str = "T") -> schema.PortSpec:
    return schema.PortSpec(
        name=name, doc=f"{name}.", shape=(), type_str=type_str, optional=False, differentiable=False, shape_doc="any"
    )


_TOY_OP = schema.OpSpec(
    name="ToyGather",
    domain=_TOY_DOMAIN,
    version=1,
    doc="A toy op: picks rows of X.",
    inputs=(_port("X"), _port("rows", "I")),
    outputs=(_port("Y"), _port("Y_like_X")),
    attributes=(schema.AttrSpec("stride", schema.AttrType.INT, 1, False, "Row stride.", "an int >= 1"),),
    type_constraints=(_FLOAT, _INDEX),
)
_TOY_FAMILY = schema.Family(
    name="toy",
    ops=(_TOY_OP,),
    doc_label="a toy family",
    input_flags=(schema.InputFlag("IsIndex", ("tensor(int64)",)),),
    output_shapes={
        _TOY_OP.name: (
            schema.OutputShape("Y", "X", (schema.AxisOf("rows", 0), schema.AxisOf("X", 1, rank=2, factor=3, offset=1))),
            schema.OutputShape("Y_like_X", "X"),
        )
    },
)


@pytest.fixture
def toy_families(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema, "FAMILIES", (*schema.FAMILIES, _TOY_FAMILY))


@pytest.mark.usefixtures("toy_families")
def test_a_family_declared_outside_ops_renders_into_the_header() -> None:
    header = codegen.render_header()
    namespace = header[header.index("namespace toy_gather {") : header.index("}  // namespace toy_gather")]
    for line in (
        'inline constexpr char kName[] = "ToyGather";',
        "enum class In : int { kX, kRows, kCount };",
        "enum class Out : int { kY, kYLikeX, kCount };",
        'inline constexpr char kAttrStride[] = "stride";',
        "inline constexpr std::int64_t kAttrStrideDefault = 1;",
        "inline constexpr bool kInputIsIndex[kNumInputs] = {false, true};",
        "    {kAttrStride, kAttrStrideDefault},",
        "  static constexpr const auto& kInputIsIndex = toy_gather::kInputIsIndex;",
        "  static constexpr std::size_t kNumIntAttributes = 1;",
        "    case Out::kY: return Shape{AxisOf(shape_of(In::kRows), 0, -1, 1, 0), "
        "AxisOf(shape_of(In::kX), 1, 2, 3, 1)};",
        "    case Out::kYLikeX: return shape_of(In::kX);",
    ):
        assert line in namespace.splitlines()


@pytest.mark.usefixtures("toy_families")
def test_a_family_declared_outside_ops_renders_into_the_docs() -> None:
    docs = codegen.render_docs()
    assert "; a toy family: [ToyGather](#toygather)." in docs.splitlines()[4]
    assert "## ToyGather" in docs
    assert f"`{_TOY_DOMAIN}::ToyGather`, since version 1." in docs


def test_a_family_declared_outside_ops_infers_shapes_in_onnx() -> None:
    if not onnx.defs.has(_TOY_OP.name, _TOY_OP.version, _TOY_OP.domain):
        onnx.defs.register_schema(onnx_defs.build_op_schema(_TOY_OP, _TOY_FAMILY))
    node = onnx.helper.make_node("ToyGather", ["X", "rows"], ["Y", "Y_like_X"], domain=_TOY_DOMAIN)
    graph = onnx.helper.make_graph(
        [node],
        "toy",
        [
            onnx.helper.make_tensor_value_info("X", onnx.TensorProto.DOUBLE, ["n", 5]),
            onnx.helper.make_tensor_value_info("rows", onnx.TensorProto.INT64, [4]),
        ],
        [],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid(_TOY_DOMAIN, 1)]
    )
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {
        info.name: (
            info.type.tensor_type.elem_type,
            [dim.dim_param or dim.dim_value for dim in info.type.tensor_type.shape.dim],
        )
        for info in inferred.graph.value_info
    }
    # Y: [rows[0], 3 * X[1] + 1]; Y_like_X: X's whole shape, the symbol kept.
    assert shapes == {"Y": (onnx.TensorProto.DOUBLE, [4, 16]), "Y_like_X": (onnx.TensorProto.DOUBLE, ["n", 5])}


def test_every_op_is_in_exactly_one_family() -> None:
    names = [op.name for family in schema.FAMILIES for op in family.ops]
    assert len(names) == len(set(names))
    assert tuple(op for family in schema.FAMILIES for op in family.ops) == schema.ALL_OPS


@pytest.mark.parametrize(
    "family", [family for family in schema.FAMILIES if family.output_shapes is not None], ids=lambda f: f.name
)
def test_a_family_with_shape_rules_covers_every_output(family: schema.Family) -> None:
    # An output without a rule gets no inferred type and no C++ shape: a new output must say how it is shaped.
    for op in family.ops:
        covered = [rule.output for rule in family.shapes_of(op)]
        assert covered == list(schema.output_names(op)), op.name


def test_a_rule_naming_a_missing_port_is_refused() -> None:
    with pytest.raises(ValueError, match=r"family toy: ToyGather rule .* names a port ToyGather does not have"):
        schema.Family(
            name="toy",
            ops=(_TOY_OP,),
            doc_label="a toy family",
            output_shapes={_TOY_OP.name: (schema.OutputShape("Y", "W"),)},
        )


def test_a_rule_for_an_op_outside_the_family_is_refused() -> None:
    with pytest.raises(ValueError, match=r"family toy: output_shapes names op 'CTCLoss', not one of \['ToyGather'\]"):
        schema.Family(
            name="toy",
            ops=(_TOY_OP,),
            doc_label="a toy family",
            output_shapes={schema.CTC_LOSS.name: ()},
        )
