"""Registers the ops of ops/schema.py with onnx, so onnx tools know the custom domain.

Once registered, ``onnx.checker`` validates ortlstm nodes (port count, types, attribute names and
types, required attributes), ``onnx.shape_inference`` infers their output types and shapes, and
onnxscript's ``Opset`` finds the ops by name. Everything here is derived from the spec; this
module adds no names or rules of its own beyond the translation into onnx's types. It does not
touch onnxruntime, which takes its schema from the kernel library.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import onnx
import onnx.defs
import onnx.helper
import onnx.shape_inference

from ortlstm.ops import schema

if TYPE_CHECKING:
    import onnxscript.values

_OpSchema = onnx.defs.OpSchema


def build_op_schema(op: schema.OpSpec, family: schema.Family | None = None) -> onnx.defs.OpSchema:
    """Translates one op spec into an ``onnx.defs.OpSchema``, with type and shape inference.

    Args:
        op: The op spec.
        family: Its family, whose ``output_shapes`` rules the inference follows; None looks it up in
            ``schema.FAMILIES``.

    Returns:
        A schema ready for ``onnx.defs.register_schema``.
    """
    op_schema = _OpSchema(
        op.name,
        op.domain,
        op.version,
        op.doc,
        inputs=[_formal_parameter(port) for port in op.inputs],
        outputs=[_formal_parameter(port) for port in op.outputs],
        type_constraints=[
            (constraint.type_str, list(constraint.allowed_types), constraint.doc) for constraint in op.type_constraints
        ],
        attributes=[_attribute(attr) for attr in op.attributes],
    )
    family = schema.family_of(op) if family is None else family
    if family.output_shapes is None:
        op_schema.set_type_and_shape_inference_function(functools.partial(infer_types_and_shapes, op))
    else:
        rules = family.shapes_of(op)
        op_schema.set_type_and_shape_inference_function(functools.partial(infer_from_rules, op, rules))
    return op_schema


def register_onnx_schemas() -> None:
    """Registers every op of the spec with onnx's schema registry; safe to call repeatedly.

    onnx refuses to register a schema twice, so an op already present is checked instead: if it
    came from a different contract (other port names), registration fails loudly rather than
    letting tools validate against the wrong one.

    Raises:
        RuntimeError: If an op of the same name, domain and version with other ports is registered.
    """
    for family in schema.FAMILIES:
        for op in family.ops:
            if onnx.defs.has(op.name, op.version, op.domain):
                _check_registered(op)
                continue
            onnx.defs.register_schema(build_op_schema(op, family))


def opset() -> onnxscript.values.Opset:
    """Returns the onnxscript opset of the domain, for ``@onnxscript.script`` functions.

    onnxscript resolves ``opset().LSTMTraining`` through onnx's schema registry (an unregistered op
    is an AttributeError), so the schemas are registered first. The schema then types the
    attributes and rejects unknown keywords. Two onnxscript 0.7 limits shape how to call it:

    - Pass inputs positionally, with None for an absent optional input. A keyword input after an
      omitted optional one lands in the omitted one's slot (``P=p`` becomes input 3, B),
      microsoft/onnxscript#2007.
    - In a script, the output count comes from the assignment targets; ``_outputs=`` is rejected
      as an unknown keyword. ``onnxscript.GraphBuilder(graph).opset(DOMAIN, OPSET_VERSION)`` is the
      builder that takes ``_outputs=`` (a count or names).

    Returns:
        ``Opset(DOMAIN, OPSET_VERSION)``; onnxscript keeps one instance per domain and version.
    """
    register_onnx_schemas()
    # Imported on use: onnxscript takes most of a second to import, and registering the schemas
    # at package import (for onnx.checker and shape inference) must not pay for it.
    import onnxscript.values

    return onnxscript.values.Opset(schema.DOMAIN, schema.OPSET_VERSION)


def infer_types_and_shapes(op: schema.OpSpec, ctx: onnx.shape_inference.InferenceContext) -> None:
    """Sets the type and shape of each present output of an ``op`` node.

    Every dim name of the spec is bound from the attributes (hidden_size, num_directions) and from
    the shapes of the present inputs, then each output's shape is read off the spec. Conflicting
    bindings are reported with the dim name, both values and where each came from, which is the
    schema layer's share of validation; runtime shapes are the kernel's. onnx turns an error
    raised here into a failure even in non-strict ``infer_shapes`` (it only forgives its own C++
    errors), so this raises only for a node that no kernel could run.

    Args:
        op: The op spec the node instantiates.
        ctx: onnx's inference context for the node.

    Raises:
        onnx.shape_inference.InferenceError: On an invalid direction or layout, a rank mismatch or
            inconsistent dims.
    """
    layout = _int_attribute(ctx, op, "layout")
    if layout not in (0, 1):
        raise onnx.shape_inference.InferenceError(f"{op.name}: layout must be 0 or 1, got {layout}")
    dims = _DimBindings(op.name)
    hidden_size = _int_attribute(ctx, op, "hidden_size")
    if hidden_size is not None:
        dims.bind("hidden_size", hidden_size, "attribute hidden_size")
    direction = _string_attribute(ctx, op, "direction")
    try:
        dims.bind("num_directions", schema.num_directions(direction), f"direction={direction}")
    except ValueError as error:
        raise onnx.shape_inference.InferenceError(f"{op.name}: {error}") from error

    elem_types: dict[str, int] = {}
    for index, port in enumerate(op.inputs):
        input_type = _input_tensor_type(ctx, index)
        if input_type is None:
            continue
        if input_type.elem_type:
            elem_types.setdefault(port.type_str, input_type.elem_type)
        if input_type.HasField("shape"):
            dims.bind_shape(port.name, schema.shape_for_layout(port, layout), input_type.shape)

    for index, port in enumerate(op.outputs):
        if index >= ctx.get_num_outputs() or not ctx.has_output(index):
            continue
        output_type = onnx.TypeProto()
        tensor_type = output_type.tensor_type
        tensor_type.elem_type = elem_types.get(port.type_str, onnx.TensorProto.UNDEFINED)
        tensor_type.shape.SetInParent()
        for expression in schema.shape_for_layout(port, layout):
            dims.write(expression, tensor_type.shape.dim.add())
        ctx.set_output_type(index, output_type)


def infer_from_rules(
    op: schema.OpSpec, rules: Sequence[schema.OutputShape], ctx: onnx.shape_inference.InferenceContext
) -> None:
    """Sets the type and shape of each present output that a rule of the op's family covers.

    An output takes the element type of its rule's ``like`` input and, where that input's shape is
    known (at the rule's rank, if it names one), either its whole shape or the rule's axes (an axis
    that cannot be read stays unknown). Runtime checks are the kernel's.

    Args:
        op: The op spec the node instantiates.
        rules: Its family's ``OutputShape`` rules for it.
        ctx: onnx's inference context for the node.
    """
    for rule in rules:
        index = schema.output_index(op, rule.output)
        like = _input_tensor_type(ctx, schema.input_index(op, rule.like))
        if like is None or index >= ctx.get_num_outputs() or not ctx.has_output(index):
            continue
        output_type = onnx.TypeProto()
        tensor_type = output_type.tensor_type
        tensor_type.elem_type = like.elem_type
        if like.HasField("shape") and (rule.rank is None or len(like.shape.dim) == rule.rank):
            tensor_type.shape.SetInParent()
            if rule.axes is None:
                for dim in like.shape.dim:
                    tensor_type.shape.dim.add().CopyFrom(dim)
            for axis in rule.axes or ():
                _write_axis(ctx, op, axis, tensor_type.shape.dim.add())
        ctx.set_output_type(index, output_type)


def _write_axis(
    ctx: onnx.shape_inference.InferenceContext,
    op: schema.OpSpec,
    axis: schema.AxisOf,
    dim: onnx.TensorShapeProto.Dimension,
) -> None:
    """Fills one output dim from ``axis``'s input; leaves it unknown where that cannot be read."""
    source = _input_tensor_type(ctx, schema.input_index(op, axis.input))
    if source is None or not source.HasField("shape"):
        return
    dims = list(source.shape.dim)
    if (axis.rank is not None and len(dims) != axis.rank) or axis.axis >= len(dims):
        return
    if axis.factor == 1 and axis.offset == 0:
        dim.CopyFrom(dims[axis.axis])
    elif dims[axis.axis].HasField("dim_value"):
        dim.dim_value = axis.factor * dims[axis.axis].dim_value + axis.offset


class _Binding(NamedTuple):
    value: int | str  # dim_value, or dim_param when only a symbol is known
    source: str


class _DimBindings:
    """Values of the spec's dim names in one node, each with where it came from."""

    def __init__(self, op_name: str) -> None:
        self._op_name = op_name
        self._bindings: dict[str, _Binding] = {}

    def bind(self, name: str, value: int | str, source: str) -> None:
        """Records ``name = value``; a concrete value replaces a symbol, two values must agree."""
        known = self._bindings.get(name)
        if known is None or (isinstance(known.value, str) and isinstance(value, int)):
            self._bindings[name] = _Binding(value, source)
        elif isinstance(known.value, int) and isinstance(value, int) and known.value != value:
            raise onnx.shape_inference.InferenceError(
                f"{self._op_name}: {name} is {value} from {source} but {known.value} from {known.source}"
            )

    def bind_shape(self, port_name: str, expected: Sequence[str], shape: onnx.TensorShapeProto) -> None:
        """Binds the dim names of one input's expected shape from its actual shape."""
        if len(shape.dim) != len(expected):
            actual = [_dim_text(dim) for dim in shape.dim]
            raise onnx.shape_inference.InferenceError(
                f"{self._op_name}: {port_name}: expected rank {len(expected)} [{', '.join(expected)}], "
                f"got rank {len(shape.dim)} [{', '.join(actual)}]"
            )
        for axis, (expression, dim) in enumerate(zip(expected, shape.dim, strict=True)):
            factor, name = schema.parse_dim(expression)
            source = f"{port_name} axis {axis} ({expression})"
            if dim.HasField("dim_value"):
                if dim.dim_value % factor:
                    raise onnx.shape_inference.InferenceError(
                        f"{self._op_name}: {source} is {dim.dim_value}, not a multiple of {factor}"
                    )
                self.bind(name, dim.dim_value // factor, source)
            elif dim.HasField("dim_param") and factor == 1:
                self.bind(name, dim.dim_param, source)

    def write(self, expression: str, dim: onnx.TensorShapeProto.Dimension) -> None:
        """Fills one output dim; leaves it unknown when the value or a symbol for it is not known."""
        factor, name = schema.parse_dim(expression)
        known = self._bindings.get(name)
        if known is None:
            return
        if isinstance(known.value, int):
            dim.dim_value = factor * known.value
        elif factor == 1:
            dim.dim_param = known.value


def _input_tensor_type(ctx: onnx.shape_inference.InferenceContext, index: int) -> onnx.TypeProto.Tensor | None:
    """Returns the type of input ``index`` if the node has it and its type is a known tensor."""
    if index >= ctx.get_num_inputs() or not ctx.has_input(index):
        return None
    input_type = ctx.get_input_type(index)
    if input_type is None or not input_type.HasField("tensor_type"):
        return None
    return input_type.tensor_type


def _dim_text(dim: onnx.TensorShapeProto.Dimension) -> str:
    if dim.HasField("dim_value"):
        return str(dim.dim_value)
    return dim.dim_param or "?"


def _int_attribute(ctx: onnx.shape_inference.InferenceContext, op: schema.OpSpec, name: str) -> int | None:
    proto = ctx.get_attribute(name)
    if proto is not None:
        return int(proto.i)
    default = schema.attribute(op, name).default
    return default if isinstance(default, int) else None


def _string_attribute(ctx: onnx.shape_inference.InferenceContext, op: schema.OpSpec, name: str) -> str:
    proto = ctx.get_attribute(name)
    if proto is not None:
        return proto.s.decode()
    default = schema.attribute(op, name).default
    if not isinstance(default, str):
        raise onnx.shape_inference.InferenceError(f"{op.name}: attribute {name} has no string default")
    return default


def _formal_parameter(port: schema.PortSpec) -> onnx.defs.OpSchema.FormalParameter:
    option = _OpSchema.FormalParameterOption.Optional if port.optional else _OpSchema.FormalParameterOption.Single
    category = (
        _OpSchema.DifferentiationCategory.Differentiable
        if port.differentiable
        else _OpSchema.DifferentiationCategory.NonDifferentiable
    )
    shape = (
        f"Shape: {port.shape_doc}." if port.shape_doc is not None else f"Shape [{', '.join(port.shape)}] (layout=0)."
    )
    return _OpSchema.FormalParameter(
        port.name,
        port.type_str,
        f"{port.doc} {shape}",
        param_option=option,
        differentiation_category=category,
    )


def _attribute(attr: schema.AttrSpec) -> onnx.defs.OpSchema.Attribute:
    # The spec's AttrType members carry onnx's names (INT, STRINGS, ...), so both enums map by name.
    if attr.default is None:
        return _OpSchema.Attribute(
            attr.name, getattr(_OpSchema.AttrType, attr.type.name), attr.doc, required=attr.required
        )
    default = list(attr.default) if isinstance(attr.default, tuple) else attr.default
    proto_type = onnx.AttributeProto.AttributeType.Value(attr.type.name)
    return _OpSchema.Attribute(
        attr.name, onnx.helper.make_attribute(attr.name, default, attr_type=proto_type), attr.doc
    )


def _check_registered(op: schema.OpSpec) -> None:
    registered = onnx.defs.get_schema(op.name, op.version, op.domain)
    actual = (
        [port.name for port in registered.inputs],
        [port.name for port in registered.outputs],
        sorted(registered.attributes),
    )
    expected = (list(schema.input_names(op)), list(schema.output_names(op)), sorted(schema.attribute_names(op)))
    if actual != expected:
        raise RuntimeError(
            f"{op.domain}::{op.name} version {op.version} is already registered with onnx with inputs {actual[0]}, "
            f"outputs {actual[1]} and attributes {actual[2]}; this package's spec has inputs {expected[0]}, "
            f"outputs {expected[1]} and attributes {expected[2]}"
        )
