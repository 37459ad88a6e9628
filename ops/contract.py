"""The contract's vocabulary: what an op declaration is made of, and how to read one.

Ports, attributes, type constraints and ``OpSpec``; the dims shapes may use; lookups by name and
index. Pure data and the standard library only: ``ops/schema.py`` and the ``spec_*`` modules
declare the ops with it.
"""

from __future__ import annotations

import dataclasses
import enum
import re

DOMAIN = "ortlstm"
OPSET_VERSION = 1

DIM_DOCS: dict[str, str] = {
    "seq_length": "number of time steps, read from X",
    "batch_size": "number of sequences, read from X",
    "input_size": "features per step, read from X",
    "hidden_size": "the `hidden_size` attribute",
    "num_directions": "2 if `direction` is bidirectional, else 1",
}
"""The ONNX LSTM dim names that shapes may use, with where each value comes from."""

DIRECTIONS = ("forward", "reverse", "bidirectional")
"""Values of the `direction` attribute, as in ONNX LSTM."""

ACTIVATIONS = (
    "Relu",
    "Tanh",
    "Sigmoid",
    "Affine",
    "LeakyRelu",
    "ThresholdedRelu",
    "ScaledTanh",
    "HardSigmoid",
    "Elu",
    "Softsign",
    "Softplus",
)
"""Names the `activations` attribute takes, ONNX spelling (kernels_cpp/lstm/activation.cc's table)."""

BLAS_DIM_LIMIT = 2**31 - 1
"""Largest dimension or leading dimension BLAS takes: its sizes are 32-bit ints."""

MAX_HIDDEN_SIZE = (BLAS_DIM_LIMIT + 1) // 8 - 1
"""Largest `hidden_size`: B's width, 8*hidden_size, must stay within ``BLAS_DIM_LIMIT``."""

MAX_BUFFER_ELEMENTS = (2**63 - 1) // 8
"""Most elements one tensor or scratch buffer of the ops may hold: 2**63 bytes of float64, so that
no byte count, index or pointer difference computed from a shape can wrap."""

_DIM_EXPRESSION = re.compile(r"^(?:(?P<factor>[1-9][0-9]*)\*)?(?P<name>[a-z_]+)$")


class AttrType(enum.Enum):
    """ONNX attribute types used by the ops, spelled as in onnx's AttributeProto (lowercase)."""

    INT = "int"
    FLOAT = "float"
    STRING = "string"
    INTS = "ints"
    FLOATS = "floats"
    STRINGS = "strings"


AttrValue = int | float | str | tuple[int, ...] | tuple[float, ...] | tuple[str, ...]


def parse_dim(expression: str) -> tuple[int, str]:
    """Splits a shape entry such as ``"4*hidden_size"`` into its factor and dim name.

    Shapes are written as text so the docs can show them verbatim, but code that checks or
    infers shapes needs the parts.

    Args:
        expression: A dim name from ``DIM_DOCS``, optionally prefixed by ``<factor>*``.

    Returns:
        ``(factor, dim_name)``; the factor is 1 for a bare name.

    Raises:
        ValueError: If the expression is malformed or names an unknown dim.
    """
    match = _DIM_EXPRESSION.match(expression)
    if match is None or match["name"] not in DIM_DOCS:
        raise ValueError(
            f"shape entry {expression!r}: expected '<dim>' or '<factor>*<dim>' with <dim> one of {sorted(DIM_DOCS)}"
        )
    return int(match["factor"] or 1), match["name"]


@dataclasses.dataclass(frozen=True)
class PortSpec:
    """One input or output of an op.

    Attributes:
        name: Port name as it appears in the ONNX schema.
        doc: One or two sentences for the generated reference.
        shape: Shape for ``layout=0``, one ONNX dim name or ``"<factor>*<dim>"`` per axis.
            Use ``shape_for_layout`` for ``layout=1``.
        type_str: Type parameter, a key of the op's type constraints (``"T"`` or ``"T1"``).
        optional: Whether the port may be omitted (an empty name in the node).
        differentiable: Whether gradients flow through this port (ONNX differentiation category).
        gradient_of: For a port of a gradient op, the forward port whose gradient it carries: an
            input receives the loss's gradient of a forward output (``grad_HAll``: HAll's), an
            output is the gradient of a forward input (``dX``: X's). See ``gradient_wiring``.
        from_forward: For an input of a gradient op, the forward input or output it takes as it
            is (``X``; the stash ``CAll``). A gradient op's input names exactly one of
            ``gradient_of`` and ``from_forward``.
        shape_doc: For a port of an op that is not an LSTM (the optimizer ops), its shape in words
            (e.g. "as param"); ``shape`` is then empty.
    """

    name: str
    doc: str
    shape: tuple[str, ...]
    type_str: str
    optional: bool
    differentiable: bool
    gradient_of: str | None = None
    shape_doc: str | None = None
    from_forward: str | None = None

    def __post_init__(self) -> None:
        """Rejects malformed shape entries when the spec is declared, not when it is used."""
        for expression in self.shape:
            parse_dim(expression)
        if self.shape_doc is not None and self.shape:
            raise ValueError(f"port {self.name!r}: shape_doc describes a shape that has no LSTM dims; shape must be ()")


@dataclasses.dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op.

    Attributes:
        name: Attribute name as in ONNX LSTM.
        type: ONNX attribute type.
        default: Value the schema declares when the node omits the attribute, or None when the
            effective default depends on other attributes (documented in ``doc``) or there is none.
        required: Whether a node must carry the attribute.
        doc: Meaning, for the generated reference.
        accepts: The values the kernels accept, completing "expected ...": anything else, and a
            value of another type than ``type``, is refused when the session is created. The C++
            messages quote it (``k<Name>Accepts`` in the generated header) and docs/ops.md lists it.
    """

    name: str
    type: AttrType
    default: AttrValue | None
    required: bool
    doc: str
    accepts: str

    def __post_init__(self) -> None:
        """A required attribute with a default would be contradictory in an ONNX schema."""
        if self.required and self.default is not None:
            raise ValueError(f"attribute {self.name!r}: required attributes take no default")


@dataclasses.dataclass(frozen=True)
class TypeConstraintSpec:
    """One type parameter shared by several ports.

    Attributes:
        type_str: Parameter name used by ``PortSpec.type_str``.
        allowed_types: ONNX type strings, e.g. ``"tensor(float)"``.
        doc: Why these types.
    """

    type_str: str
    allowed_types: tuple[str, ...]
    doc: str


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op of the custom domain.

    Attributes:
        name: Op type.
        domain: Always ``DOMAIN``.
        version: Opset version the op appears in.
        doc: Description for the generated reference (Markdown).
        inputs: Inputs in node order.
        outputs: Outputs in node order.
        attributes: Attributes, in documentation order.
        type_constraints: Type parameters used by the ports.
        refusals: Every other rule by which the kernels refuse a node or a call, beyond each
            attribute's type and ``accepts``, one Markdown sentence each, for docs/ops.md.
        gradient_of: For a gradient op, the forward op it differentiates; its ports'
            ``gradient_of`` and ``from_forward`` name that op's ports (``gradient_wiring``).
    """

    name: str
    domain: str
    version: int
    doc: str
    inputs: tuple[PortSpec, ...]
    outputs: tuple[PortSpec, ...]
    attributes: tuple[AttrSpec, ...]
    type_constraints: tuple[TypeConstraintSpec, ...]
    refusals: tuple[str, ...] = ()
    gradient_of: str | None = None

    def __post_init__(self) -> None:
        """Catches inconsistent specs at import time, before any generated file is written."""
        for kind, names in (
            ("input", [port.name for port in self.inputs]),
            ("output", [port.name for port in self.outputs]),
            ("attribute", [attr.name for attr in self.attributes]),
            ("type constraint", [constraint.type_str for constraint in self.type_constraints]),
        ):
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"{self.name}: duplicate {kind} names {duplicates}")
        declared = {constraint.type_str for constraint in self.type_constraints}
        for port in self.inputs + self.outputs:
            if port.type_str not in declared:
                raise ValueError(
                    f"{self.name}.{port.name}: type {port.type_str!r} is not among the constraints {sorted(declared)}"
                )


def shape_for_layout(port: PortSpec, layout: int) -> tuple[str, ...]:
    """Returns the port's shape for an ONNX LSTM ``layout`` value.

    ONNX LSTM's ``layout=1`` is batch-major: batch_size moves to the first axis of every tensor
    that has one (X ``[batch_size, seq_length, input_size]``, Y ``[batch_size, seq_length,
    num_directions, hidden_size]``, Y_h ``[batch_size, num_directions, hidden_size]``). The same
    rule covers the stash and gradient ports, which share X's, Y's or Y_h's shape.

    Args:
        port: The port.
        layout: 0 (seq_length first) or 1 (batch_size first).

    Returns:
        The shape entries in axis order.

    Raises:
        ValueError: If ``layout`` is neither 0 nor 1.
    """
    if layout not in (0, 1):
        raise ValueError(f"layout: expected 0 or 1, got {layout}")
    if layout == 0 or "batch_size" not in port.shape:
        return port.shape
    return ("batch_size", *(dim for dim in port.shape if dim != "batch_size"))


def num_directions(direction: str) -> int:
    """Returns the num_directions dim for a ``direction`` attribute value.

    Args:
        direction: ``forward``, ``reverse`` or ``bidirectional``.

    Returns:
        2 for bidirectional, else 1.

    Raises:
        ValueError: For any other value.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {list(DIRECTIONS)}, got {direction!r}")
    return 2 if direction == "bidirectional" else 1


def input_names(op: OpSpec) -> tuple[str, ...]:
    """Returns the op's input names in node order."""
    return tuple(port.name for port in op.inputs)


def output_names(op: OpSpec) -> tuple[str, ...]:
    """Returns the op's output names in node order."""
    return tuple(port.name for port in op.outputs)


def attribute_names(op: OpSpec) -> tuple[str, ...]:
    """Returns the op's attribute names."""
    return tuple(attr.name for attr in op.attributes)


def input_index(op: OpSpec, name: str) -> int:
    """Returns the position of input ``name`` in the op's node.

    Raises:
        KeyError: If the op has no such input; the message lists the valid names.
    """
    return _index(op, "input", input_names(op), name)


def output_index(op: OpSpec, name: str) -> int:
    """Returns the position of output ``name`` in the op's node.

    Raises:
        KeyError: If the op has no such output; the message lists the valid names.
    """
    return _index(op, "output", output_names(op), name)


def attribute(op: OpSpec, name: str) -> AttrSpec:
    """Returns the op's attribute spec called ``name``.

    Raises:
        KeyError: If the op has no such attribute; the message lists the valid names.
    """
    return op.attributes[_index(op, "attribute", attribute_names(op), name)]


def _index(op: OpSpec, kind: str, names: tuple[str, ...], name: str) -> int:
    if name not in names:
        raise KeyError(f"{op.name} has no {kind} {name!r}; {kind}s are {list(names)}")
    return names.index(name)


