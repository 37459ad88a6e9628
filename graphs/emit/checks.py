"""Checks a node against its op's schema when a builder makes it: op name, arities, attribute names and types.

The training-graph builders write nodes from op-type strings at hundreds of call sites; without a
check, a misspelt op, a missing input or an attribute the op does not have shows only when
onnxruntime loads the model, and only for the graphs some test happens to build. ``check_node``
runs on every node a ``GraphEmitter`` makes, and ``make_checked_node`` on every node a rewrite
makes outside one, so such a mistake raises at the first build, naming the node, the op and what
the op allows.

What a node is checked against, per domain:

- ai.onnx (``""``): onnx's own schema at the model's opset (``onnx.defs.get_schema``), so an op
  or an attribute newer than the model's opset is refused too;
- ``ortlstm``: the op's ``OpSpec`` in ``ortlstm.ops.schema`` (its ports and attributes), the
  contract the kernels are generated from, whether or not it is registered with onnx;
- any other domain onnx registers (ai.onnx.ml, ai.onnx.preview.training): its newest schema there
  (the emitter knows only the ai.onnx opset);
- anything else, ``com.microsoft`` included: not checked. onnx does not register onnxruntime's
  contrib ops, and ``ortlstm.graphs`` never imports onnxruntime (the graphs are built where none
  is installed) to read them there; a user's own op in their own domain cannot be told from a typo
  either. onnxruntime checks those nodes when it loads the model.

What an op allows is computed once per (domain, op, opset) and cached (about 35 us an op, once per
process); a check is then a few comparisons per node, on the parts the emitter has at hand rather
than the proto. Measured when it was added (a loaded 2-core machine, interleaved rounds): about 3 us
a node, 0.4 ms of the 35-45 ms build of the demo classifier's training models, within the noise.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Sequence
from typing import Any

import onnx
import onnx.defs
import onnx.helper

from ortlstm.ops import schema as ortlstm_schema

ONNX_DOMAINS = ("", "ai.onnx")
"""The names of the default domain."""


_ATTRIBUTE_TYPES: dict[object, int] = {
    getattr(onnx.defs.OpSchema.AttrType, name): value
    for name, value in onnx.AttributeProto.AttributeType.items()
    if hasattr(onnx.defs.OpSchema.AttrType, name)
}
"""onnx's ``OpSchema.AttrType`` to ``AttributeProto``'s attribute type: two enums, matched by name."""


class NodeSchemaError(ValueError):
    """A node a builder made does not fit its op's schema (a bug in the builder, not in the user's model)."""


@dataclasses.dataclass(frozen=True)
class OpSignature:
    """What nodes of one op (at one opset) may look like.

    Attributes:
        title: How messages name the op: ``ai.onnx Softmax (opset 17)``, ``ortlstm LSTMGrad``.
        inputs: The formal input names, in order (a variadic one last).
        min_inputs: Fewest inputs a node may list (an absent optional one counts as ``""``).
        max_inputs: Most inputs a node may list.
        required_inputs: Positions that may not be ``""`` (a required port).
        outputs: The formal output names, in order.
        min_outputs: Fewest outputs a node may list.
        max_outputs: Most outputs a node may list.
        required_outputs: Positions that may not be ``""``.
        attributes: Each attribute's name and its ``AttributeProto`` type.
        required_attributes: Attributes a node must carry.
    """

    title: str
    inputs: tuple[str, ...]
    min_inputs: int
    max_inputs: int
    required_inputs: frozenset[int]
    outputs: tuple[str, ...]
    min_outputs: int
    max_outputs: int
    required_outputs: frozenset[int]
    attributes: dict[str, int]
    required_attributes: frozenset[str]


def _onnx_ports(params: list[onnx.defs.OpSchema.FormalParameter]) -> tuple[tuple[str, ...], frozenset[int]]:
    """The names of formal parameters and the positions that must be named (the Single ones).

    A Variadic parameter's values are not required to be named here: onnx's checker leaves that to
    each op's own inference, and no builder writes an empty one.
    """
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    return tuple(param.name for param in params), frozenset(
        index for index, param in enumerate(params) if param.option == single
    )


def _from_onnx(found: onnx.defs.OpSchema, title: str) -> OpSignature:
    """An ``OpSignature`` from onnx's schema of the op."""
    inputs, required_inputs = _onnx_ports(list(found.inputs))
    outputs, required_outputs = _onnx_ports(list(found.outputs))
    return OpSignature(
        title=title,
        inputs=inputs,
        min_inputs=found.min_input,
        max_inputs=found.max_input,
        required_inputs=required_inputs,
        outputs=outputs,
        min_outputs=found.min_output,
        max_outputs=found.max_output,
        required_outputs=required_outputs,
        attributes={name: _ATTRIBUTE_TYPES[attribute.type] for name, attribute in found.attributes.items()},
        required_attributes=frozenset(name for name, attribute in found.attributes.items() if attribute.required),
    )


def _from_spec(spec: ortlstm_schema.OpSpec) -> OpSignature:
    """An ``OpSignature`` from the op's declaration in ``ortlstm.ops.schema``."""

    def arity(ports: tuple[ortlstm_schema.PortSpec, ...]) -> tuple[int, frozenset[int]]:
        required = frozenset(index for index, port in enumerate(ports) if not port.optional)
        return (max(required) + 1 if required else 0), required

    min_inputs, required_inputs = arity(spec.inputs)
    min_outputs, required_outputs = arity(spec.outputs)
    return OpSignature(
        title=f"{spec.domain} {spec.name}",
        inputs=tuple(port.name for port in spec.inputs),
        min_inputs=min_inputs,
        max_inputs=len(spec.inputs),
        required_inputs=required_inputs,
        outputs=tuple(port.name for port in spec.outputs),
        min_outputs=min_outputs,
        max_outputs=len(spec.outputs),
        required_outputs=required_outputs,
        attributes={
            attribute.name: onnx.AttributeProto.AttributeType.Value(attribute.type.name)
            for attribute in spec.attributes
        },
        required_attributes=frozenset(attribute.name for attribute in spec.attributes if attribute.required),
    )


def _unknown_op(op_type: str, domain: str, known: list[str], where: str) -> NodeSchemaError:
    """The error for an op the domain does not have, with the nearest names it does."""
    close = difflib.get_close_matches(op_type, known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
    return NodeSchemaError(f"{domain or 'ai.onnx'} has no op {op_type!r} {where}{hint}")


@functools.cache
def _onnx_domains() -> dict[str, frozenset[str]]:
    """The op names of every domain onnx registers, by domain (ai.onnx as ``""``)."""
    ops: dict[str, set[str]] = {}
    for found in onnx.defs.get_all_schemas_with_history():
        ops.setdefault(found.domain, set()).add(found.name)
    return {domain: frozenset(names) for domain, names in ops.items()}


@functools.cache
def op_signature(domain: str, op_type: str, opset: int) -> OpSignature | None:
    """What nodes of ``domain``'s ``op_type`` may look like at ai.onnx ``opset``; None for a domain not checked.

    Raises:
        NodeSchemaError: The domain is checked and has no such op (at that opset, for ai.onnx).
    """
    if domain in ONNX_DOMAINS:
        try:
            found = onnx.defs.get_schema(op_type, opset, "")
        except onnx.defs.SchemaError:
            if op_type in _onnx_domains()[""]:
                first = min(
                    found.since_version
                    for found in onnx.defs.get_all_schemas_with_history()
                    if found.domain == "" and found.name == op_type
                )
                raise NodeSchemaError(
                    f"ai.onnx has no op {op_type!r} at opset {opset}: it exists from opset {first}; "
                    f"emit it only where the model's opset is >= {first}"
                ) from None
            raise _unknown_op(op_type, "", sorted(_onnx_domains()[""]), f"at opset {opset}") from None
        return _from_onnx(found, f"ai.onnx {op_type} (opset {opset}, the op's version {found.since_version})")
    if domain == ortlstm_schema.DOMAIN:
        try:
            return _from_spec(ortlstm_schema.op_by_name(op_type))
        except KeyError:
            raise _unknown_op(
                op_type, domain, [op.name for op in ortlstm_schema.ALL_OPS], "(ortlstm.ops.schema.ALL_OPS)"
            ) from None
    if domain in _onnx_domains():
        if op_type not in _onnx_domains()[domain]:
            raise _unknown_op(op_type, domain, sorted(_onnx_domains()[domain]), "(onnx.defs)")
        return _from_onnx(onnx.defs.get_schema(op_type, domain), f"{domain} {op_type}")
    return None


def _port_problems(kind: str, names: list[str], low: int, high: int, ports: tuple[str, ...]) -> list[str]:
    """What is wrong with a node's inputs or outputs, given the count the op takes."""
    if low <= len(names) <= high:
        return []
    takes = str(low) if low == high else f"{low} to {high}" if high < 2**31 - 1 else f"at least {low}"
    plural = "" if len(names) == 1 else "s"
    return [f"has {len(names)} {kind}{plural} {names}; it takes {takes} ({', '.join(ports) or 'none'})"]


def node_problems(
    found: OpSignature, inputs: Sequence[str], outputs: Sequence[str], attributes: Sequence[tuple[str, int]]
) -> list[str]:
    """Every way a node does not fit ``found``, one phrase each (empty when it fits).

    Args:
        found: What the op allows.
        inputs: The node's input names ("" for an absent optional one).
        outputs: The node's output names.
        attributes: Each attribute's name and ``AttributeProto`` type.

    It reads plain Python values, not the proto: every node of every build passes through here, and
    a protobuf field read costs about as much as the whole check of a node that fits.
    """
    problems: list[str] = []
    if not found.min_inputs <= len(inputs) <= found.max_inputs:
        problems += _port_problems("input", list(inputs), found.min_inputs, found.max_inputs, found.inputs)
    if not found.min_outputs <= len(outputs) <= found.max_outputs:
        problems += _port_problems("output", list(outputs), found.min_outputs, found.max_outputs, found.outputs)
    for kind, names, required, ports in (
        ("input", inputs, found.required_inputs, found.inputs),
        ("output", outputs, found.required_outputs, found.outputs),
    ):
        problems += [
            f"leaves {kind} {index} ({ports[index]}) empty, which the op requires"
            for index in sorted(required)
            if index < len(names) and not names[index]
        ]
    for name, actual in attributes:
        expected = found.attributes.get(name)
        if expected is None:
            known = sorted(found.attributes) or "none"
            problems.append(f"has attribute {name!r}, which the op does not have (its attributes: {known})")
        elif expected and actual != expected:
            problems.append(
                f"has attribute {name!r} of type {onnx.AttributeProto.AttributeType.Name(actual)}; the op's is "
                f"{onnx.AttributeProto.AttributeType.Name(expected)}"
            )
    if found.required_attributes:
        missing = sorted(found.required_attributes - {name for name, _ in attributes})
        if missing:
            problems.append(f"lacks the required attribute(s) {missing}")
    return problems


def check_parts(
    domain: str,
    op_type: str,
    name: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    attributes: Sequence[tuple[str, int]],
    opset: int,
) -> None:
    """``check_node`` on a node's parts as plain values (what ``GraphEmitter`` has at hand when it makes one).

    Raises:
        NodeSchemaError: As ``check_node``.
    """
    try:
        found = op_signature(domain, op_type, opset)
    except NodeSchemaError as error:
        raise NodeSchemaError(f"node {name!r}: {error}") from None
    if found is None:
        return
    problems = node_problems(found, inputs, outputs, attributes)
    if problems:
        raise NodeSchemaError(f"node {name!r} ({found.title}) " + "; ".join(problems))


def check_node(node: onnx.NodeProto, opset: int) -> None:
    """Raises when ``node`` does not fit its op's schema (see the module's docstring for which schema).

    Args:
        node: A node a builder made.
        opset: The model's ai.onnx opset.

    Raises:
        NodeSchemaError: The op does not exist, or the node's inputs, outputs or attributes do not
            fit it; the message names the node, the op and what it allows.
    """
    attributes = [(attribute.name, attribute.type) for attribute in node.attribute]
    check_parts(node.domain, node.op_type, node.name, list(node.input), list(node.output), attributes, opset)


def make_checked_node(
    opset: int,
    op_type: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    *,
    name: str | None = None,
    domain: str | None = None,
    doc_string: str | None = None,
    **attributes: Any,
) -> onnx.NodeProto:
    """``onnx.helper.make_node`` and ``check_node``: a node made outside a ``GraphEmitter``, checked the same way.

    prepare's rewrites, the converters and the train step's links make a few nodes straight into a
    graph they edit, where no emitter is at hand; made through here, a misspelt op, a wrong count of
    inputs or an attribute the op lacks raises when the node is made, naming it, not when onnxruntime
    loads the model.

    Args:
        opset: The model's ai.onnx opset (``onnx_opset(model)``); the ortlstm domain is checked
            against ``ortlstm.ops.schema`` whatever it is.
        op_type: The op type.
        inputs: Input names ("" for an absent optional input).
        outputs: Output names.
        name: The node's name.
        domain: The op's domain; None (ai.onnx) leaves the field unset, as ``onnx.helper.make_node``
            does, so that a rewrite's model serializes to the same bytes as before it was checked.
        doc_string: The node's doc string.
        **attributes: Node attributes; None values are left out (as ``onnx.helper.make_node`` does).

    Raises:
        NodeSchemaError: As ``check_node``.
    """
    node = onnx.helper.make_node(
        op_type, list(inputs), list(outputs), name=name, doc_string=doc_string, domain=domain, **attributes
    )
    check_node(node, opset)
    return node
