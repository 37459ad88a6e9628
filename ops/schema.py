"""The op contract of ortlstm: every op declared once, as plain data.

This module is the single source of truth for op names, port order, shapes and attributes.
The C++ header, docs/ops.md, the onnx OpSchema registration and the NumPy reference all read it;
nothing else in the repository spells out a port name or index by hand. It must stay pure data
(standard library only, no onnx or onnxruntime) so that every layer can import it cheaply.
Changing the order or meaning of a port requires bumping the op's version.
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


def op_by_name(name: str) -> OpSpec:
    """Returns the spec of op type ``name`` in ``DOMAIN``.

    Raises:
        KeyError: If no op of that name is declared.
    """
    every = OPS + OPTIMIZER_OPS + CTC_OPS + GRADIENT_OPS
    for op in every:
        if op.name == name:
            return op
    raise KeyError(f"no op {name!r} in domain {DOMAIN!r}; ops are {[op.name for op in every]}")


def _index(op: OpSpec, kind: str, names: tuple[str, ...], name: str) -> int:
    if name not in names:
        raise KeyError(f"{op.name} has no {kind} {name!r}; {kind}s are {list(names)}")
    return names.index(name)


_FLOAT_TYPES = TypeConstraintSpec(
    type_str="T",
    allowed_types=("tensor(float)", "tensor(double)"),
    doc="All float tensors of a node share one type: float32 for training, float64 for gradient checks.",
)
_SEQUENCE_LENS_TYPE = TypeConstraintSpec(
    type_str="T1",
    allowed_types=("tensor(int32)",),
    doc="sequence_lens is int32, as in ONNX LSTM.",
)

# Both ops take ONNX LSTM's attributes so a gradient node can copy its forward node's attributes
# verbatim. hidden_size is required (ONNX LSTM makes it optional) because the kernels size every
# buffer from it before reading R.
_LSTM_ATTRIBUTES = (
    AttrSpec(
        name="hidden_size",
        type=AttrType.INT,
        default=None,
        required=True,
        doc="Number of neurons in the hidden layer. Required here, unlike in ONNX LSTM.",
        accepts=f"an integer in [1, {MAX_HIDDEN_SIZE}]",
    ),
    AttrSpec(
        name="direction",
        type=AttrType.STRING,
        default="forward",
        required=False,
        doc="`forward`, `reverse` or `bidirectional`. Bidirectional makes num_directions 2.",
        accepts=f"one of {', '.join(DIRECTIONS)}",
    ),
    AttrSpec(
        name="activations",
        type=AttrType.STRINGS,
        default=None,
        required=False,
        doc=(
            "Activation functions f, g, h (one triple per direction), ONNX spelling, case-insensitive. "
            "Default: `Sigmoid, Tanh, Tanh` for each direction."
        ),
        accepts=(
            f"3*num_directions names, each one of {', '.join(ACTIVATIONS)} (any case); on onnxruntime older "
            "than 1.25 only together with `activations_csv`"
        ),
    ),
    AttrSpec(
        name="activation_alpha",
        type=AttrType.FLOATS,
        default=None,
        required=False,
        doc=(
            "Alpha of the activations that take one (Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, "
            "Elu): each takes the next value, in activation order; once the list runs out, the default (LeakyRelu "
            "0.01, HardSigmoid 0.2, Elu 1, others 0). Surplus values are ignored, as in onnxruntime's LSTM, so a "
            "list with one value per activation works."
        ),
        accepts=(
            "any list of floats; for LSTMGrad, LeakyRelu and Elu as f or g need alpha >= 0 (not negative, not NaN)"
        ),
    ),
    AttrSpec(
        name="activation_beta",
        type=AttrType.FLOATS,
        default=None,
        required=False,
        doc=(
            "Beta of the activations that take one (Affine, ScaledTanh, HardSigmoid), read like `activation_alpha` "
            "by its own cursor; default HardSigmoid 0.5, others 0. Surplus values are ignored."
        ),
        accepts="any list of floats",
    ),
    # Not an ONNX LSTM attribute. The custom-op C API of onnxruntime before 1.25 cannot read a
    # string-list attribute, so a kernel there would never see `activations`; builders write both.
    AttrSpec(
        name="activations_csv",
        type=AttrType.STRING,
        default=None,
        required=False,
        doc=(
            "`activations` as one comma-separated string, e.g. `Sigmoid,Tanh,Tanh`: custom-op kernels on "
            "onnxruntime older than 1.25 cannot read string-list attributes. If both are set they must agree "
            "(case-insensitive)."
        ),
        accepts=(
            "the names `activations` accepts, separated by commas; the same names as `activations` (any case) "
            "when both are set"
        ),
    ),
    AttrSpec(
        name="clip",
        type=AttrType.FLOAT,
        default=None,
        required=False,
        doc=(
            "Cell clip threshold: gate pre-activations are clipped to [-clip, clip]. Default (and +inf): no clipping."
        ),
        accepts="a positive threshold (+inf clips nothing)",
    ),
    AttrSpec(
        name="input_forget",
        type=AttrType.INT,
        default=0,
        required=False,
        doc="1 couples the input and forget gates (f_t = 1 - i_t); as in onnxruntime's LSTM, any nonzero value does.",
        accepts="any integer",
    ),
    AttrSpec(
        name="layout",
        type=AttrType.INT,
        default=0,
        required=False,
        doc="0: seq_length first, the layout=0 shapes. 1: batch_size moves to the first axis, the layout=1 shapes.",
        accepts="0 or 1",
    ),
)

_SEQ = ("seq_length", "num_directions", "batch_size", "hidden_size")

# What both kernels refuse beyond each attribute's type and `accepts` (docs/ops.md lists these).
_SESSION_REFUSALS = (
    "When the session is created: a node without `hidden_size`; an attribute of another type than its "
    "declared one (`attribute direction: expected STRING, got INT`); a value outside the attribute's "
    "*Accepts*; `activations` and `activations_csv` that disagree; on onnxruntime older than 1.25, a node that sets "
    "`activations` without `activations_csv` (its custom-op API cannot read string lists).",
)
_RUN_REFUSALS = (
    "When run, before any work: X of a rank other than 3; X whose seq_length*batch_size, "
    f"seq_length*4*hidden_size, batch_size or input_size exceeds {BLAS_DIM_LIMIT} (BLAS takes 32-bit sizes), "
    "or for which [seq_length, num_directions, batch_size, 4*hidden_size] (IOFC and the gate scratch) or "
    f"[batch_size, 4*hidden_size] (one step's gates) would hold more than {MAX_BUFFER_ELEMENTS} elements, the "
    "largest buffers either op forms. Products of dims are checked before they are formed, so nothing wraps and "
    "a zero dim lets no other through.",
    "When run: an input whose shape differs from its row in the tables for X's dims and the attributes "
    "(`direction`, `hidden_size`, `layout`); a `sequence_lens` value outside [0, seq_length]; element types "
    "outside the type constraints (onnxruntime's own message).",
)
_STATE = ("num_directions", "batch_size", "hidden_size")

LSTM_TRAINING = OpSpec(
    name="LSTMTraining",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
One LSTM layer, forward, that also returns what `LSTMGrad` needs to differentiate it.

Inputs, attributes and the first three outputs are exactly those of ONNX `LSTM` (opset 14):
HAll, Ht and Ct are LSTM's Y, Y_h and Y_c. Two more outputs stash the intermediate values of
every step, CAll (cell states) and IOFC (activated gates), so the backward pass recomputes
nothing. All outputs are optional; a kernel skips the work of an omitted one where it can.

Drop-in: the inputs and outputs keep the order and meaning of `com.microsoft` `LSTMTraining`
(onnxruntime-training), so a graph written for it switches to this domain without rewiring.

Per direction and step t, with gates in the order i, o, f, c and activations f, g, h
(default Sigmoid, Tanh, Tanh):

    i_t = f(X_t W_i^T + H_{t-1} R_i^T + P_i * C_{t-1} + Wb_i + Rb_i)
    f_t = f(X_t W_f^T + H_{t-1} R_f^T + P_f * C_{t-1} + Wb_f + Rb_f)
    c_t = g(X_t W_c^T + H_{t-1} R_c^T + Wb_c + Rb_c)
    C_t = f_t * C_{t-1} + i_t * c_t
    o_t = f(X_t W_o^T + H_{t-1} R_o^T + P_o * C_t + Wb_o + Rb_o)
    H_t = o_t * h(C_t)

Steps t >= sequence_lens[b] (counting from 0) are zero in HAll, CAll and IOFC; Ht and Ct hold
the state at each sequence's last valid step.""",
    inputs=(
        PortSpec(
            name="X",
            doc="Input sequences.",
            shape=("seq_length", "batch_size", "input_size"),
            type_str="T",
            optional=False,
            differentiable=True,
        ),
        PortSpec(
            name="W",
            doc="Input weights, gates stacked iofc.",
            shape=("num_directions", "4*hidden_size", "input_size"),
            type_str="T",
            optional=False,
            differentiable=True,
        ),
        PortSpec(
            name="R",
            doc="Recurrence weights, gates stacked iofc.",
            shape=("num_directions", "4*hidden_size", "hidden_size"),
            type_str="T",
            optional=False,
            differentiable=True,
        ),
        PortSpec(
            name="B",
            doc="Biases `[Wb_iofc, Rb_iofc]`. Default zeros.",
            shape=("num_directions", "8*hidden_size"),
            type_str="T",
            optional=True,
            differentiable=True,
        ),
        PortSpec(
            name="sequence_lens",
            doc="Valid steps of each sequence. Default: seq_length for all.",
            shape=("batch_size",),
            type_str="T1",
            optional=True,
            differentiable=False,
        ),
        PortSpec(
            name="initial_h",
            doc="Initial hidden state. Default zeros.",
            shape=_STATE,
            type_str="T",
            optional=True,
            differentiable=True,
        ),
        PortSpec(
            name="initial_c",
            doc="Initial cell state. Default zeros.",
            shape=_STATE,
            type_str="T",
            optional=True,
            differentiable=True,
        ),
        PortSpec(
            name="P",
            doc="Peephole weights, gates stacked iof. Default zeros.",
            shape=("num_directions", "3*hidden_size"),
            type_str="T",
            optional=True,
            differentiable=True,
        ),
    ),
    outputs=(
        PortSpec(
            name="HAll",
            doc="Hidden state of every step (ONNX LSTM's Y).",
            shape=_SEQ,
            type_str="T",
            optional=True,
            differentiable=True,
        ),
        PortSpec(
            name="Ht",
            doc="Last hidden state (ONNX LSTM's Y_h).",
            shape=_STATE,
            type_str="T",
            optional=True,
            differentiable=True,
        ),
        PortSpec(
            name="Ct",
            doc="Last cell state (ONNX LSTM's Y_c).",
            shape=_STATE,
            type_str="T",
            optional=True,
            differentiable=True,
        ),
        PortSpec(
            name="CAll",
            doc="Cell state of every step; stash for LSTMGrad.",
            shape=_SEQ,
            type_str="T",
            optional=True,
            differentiable=False,
        ),
        PortSpec(
            name="IOFC",
            doc="Activated gates i, o, f, c of every step; stash for LSTMGrad.",
            shape=("seq_length", "num_directions", "batch_size", "4*hidden_size"),
            type_str="T",
            optional=True,
            differentiable=False,
        ),
    ),
    attributes=_LSTM_ATTRIBUTES,
    type_constraints=(_FLOAT_TYPES, _SEQUENCE_LENS_TYPE),
    refusals=(*_SESSION_REFUSALS, *_RUN_REFUSALS),
)


def _forward_port(name: str) -> PortSpec:
    return next(port for port in LSTM_TRAINING.inputs + LSTM_TRAINING.outputs if port.name == name)


# LSTMGrad's ports mirror LSTMTraining's: the same shapes and types, taken from the forward spec.
def _from_forward(name: str, *, optional: bool | None = None, doc: str | None = None) -> PortSpec:
    """A forward input or output passed to the gradient op."""
    port = _forward_port(name)
    return dataclasses.replace(
        port,
        doc=doc or f"{name} of the forward node.",
        optional=port.optional if optional is None else optional,
        differentiable=False,
        from_forward=name,
    )


def _upstream_gradient(name: str, doc: str) -> PortSpec:
    """The gradient of the loss with respect to forward output ``name``: optional, zeros if absent."""
    return dataclasses.replace(
        _forward_port(name), name=f"grad_{name}", doc=doc, optional=True, differentiable=False, gradient_of=name
    )


def _input_gradient(name: str, of: str, doc: str | None = None) -> PortSpec:
    """The gradient with respect to forward input ``of``: optional, skipped when not requested."""
    return dataclasses.replace(
        _forward_port(of),
        name=name,
        doc=doc or f"Gradient with respect to {of}.",
        optional=True,
        differentiable=False,
        gradient_of=of,
    )


LSTM_GRAD = OpSpec(
    name="LSTMGrad",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Gradients of `LSTMTraining` with respect to its differentiable inputs.

Takes the forward inputs, the stash of the forward node (HAll, CAll, IOFC) and the gradients
that reach the forward outputs HAll, Ht and Ct. Attributes must equal the forward node's. An
omitted gradient input counts as zeros (for an LSTM, usually only HAll or only Ht feeds the
loss). Every output is optional and an omitted one is not computed, so a graph pays only for the
gradients it uses. dB has both halves equal, because Wb and Rb enter the gates only as a sum. No
port of this op is differentiable: second-order gradients are not provided.

Drop-in: the first twelve inputs and the outputs keep the order and meaning of `com.microsoft`
`LSTMGrad` (onnxruntime-training). Input P is an addition, placed last so that order holds: the
peephole terms need P to propagate through the cell state, so without it the gradients of a
peephole LSTM would be wrong.""",
    inputs=(
        *(_from_forward(name) for name in ("X", "W", "R", "sequence_lens", "initial_h", "initial_c")),
        # The stash: outputs of the forward node, required here.
        *(_from_forward(name, optional=False) for name in ("HAll", "CAll", "IOFC")),
        *(
            _upstream_gradient(name, f"Gradient of the loss with respect to {name}. Default zeros.")
            for name in ("HAll", "Ht", "Ct")
        ),
        _from_forward("P", doc="P of the forward node. Default zeros."),
    ),
    outputs=(
        _input_gradient("dX", "X"),
        _input_gradient("dW", "W"),
        _input_gradient("dR", "R"),
        _input_gradient("dB", "B", "Gradient with respect to B; its Wb and Rb halves are equal."),
        _input_gradient("dH0", "initial_h"),
        _input_gradient("dC0", "initial_c"),
        _input_gradient("dP", "P"),
    ),
    attributes=_LSTM_ATTRIBUTES,
    type_constraints=(_FLOAT_TYPES, _SEQUENCE_LENS_TYPE),
    refusals=(
        *_SESSION_REFUSALS,
        "When the session is created: LeakyRelu or Elu as f or g (gate or cell activation) with a negative or NaN "
        "alpha. Such an alpha maps negative and positive inputs onto the same outputs, so LSTMGrad cannot recover "
        "the derivative from the stashed activated gates; h takes any alpha, and LSTMTraining accepts them all.",
        *_RUN_REFUSALS,
    ),
    gradient_of=LSTM_TRAINING.name,
)

OPS: tuple[OpSpec, ...] = (LSTM_TRAINING, LSTM_GRAD)


# ---- gradient wiring ----------------------------------------------------------------------------
# How a gradient op connects to the forward node it differentiates, resolved from the ports'
# ``from_forward`` and ``gradient_of``. Both training paths read it: the ortlstm gradient rule
# (graphs/autodiff/rules_lstm.py) and onnxruntime-training's gradient definition (graphs/ort_training/gradient.py).


class GradientSource(enum.Enum):
    """What a port of a gradient op connects to; the values are onnxruntime-training's notation."""

    INPUT = "I"
    """A forward input, as it is."""
    OUTPUT = "O"
    """A forward output, as it is (a stash such as CAll)."""
    OUTPUT_GRADIENT = "GO"
    """The loss's gradient with respect to a forward output; "" where none reaches it (zeros)."""
    INPUT_GRADIENT = "GI"
    """The gradient with respect to a forward input (an output of the gradient op)."""


@dataclasses.dataclass(frozen=True)
class GradientLink:
    """One port of a gradient op and the forward port it connects to.

    Attributes:
        port: The gradient op's port.
        source: What it connects to.
        forward_port: The forward op's port (the output for ``OUTPUT_GRADIENT``, the input for
            ``INPUT_GRADIENT``).
        index: That port's position among the forward node's inputs or outputs.
    """

    port: str
    source: GradientSource
    forward_port: str
    index: int

    @property
    def placeholder(self) -> str:
        """onnxruntime-training's notation, e.g. ``GO(1)``."""
        return f"{self.source.value}({self.index})"


@dataclasses.dataclass(frozen=True)
class GradientWiring:
    """A forward op, its gradient op, and one link per gradient-op input and output, in node order."""

    forward: OpSpec
    gradient: OpSpec
    inputs: tuple[GradientLink, ...]
    outputs: tuple[GradientLink, ...]


def gradient_wiring(forward: OpSpec, gradient: OpSpec | None = None) -> GradientWiring:
    """How ``gradient`` (default: the op of ``OPS`` whose ``gradient_of`` is ``forward``) connects to ``forward``.

    Raises:
        KeyError: No op differentiates ``forward``.
        ValueError: A gradient-op port that names no forward port, both or neither of
            ``from_forward`` and ``gradient_of``, or an output that is not a forward input's
            gradient; a differentiable forward input without a gradient output.
    """
    if gradient is None:
        found = [op for op in OPS if op.gradient_of == forward.name]
        if not found:
            raise KeyError(f"no op of {DOMAIN!r} declares gradient_of={forward.name!r}")
        gradient = found[0]
    forward_inputs, forward_outputs = input_names(forward), output_names(forward)

    def fail(port: PortSpec, problem: str) -> ValueError:
        return ValueError(f"{gradient.name}.{port.name}: {problem}")

    inputs = []
    for port in gradient.inputs:
        if (port.from_forward is None) == (port.gradient_of is None):
            raise fail(port, "an input of a gradient op names exactly one of from_forward and gradient_of")
        if port.gradient_of is not None:
            if port.gradient_of not in forward_outputs:
                raise fail(
                    port, f"gradient_of={port.gradient_of!r} is not an output of {forward.name} {forward_outputs}"
                )
            link = GradientSource.OUTPUT_GRADIENT, port.gradient_of, forward_outputs.index(port.gradient_of)
        elif port.from_forward in forward_inputs:
            link = GradientSource.INPUT, port.from_forward, forward_inputs.index(port.from_forward)
        elif port.from_forward in forward_outputs:
            link = GradientSource.OUTPUT, port.from_forward, forward_outputs.index(port.from_forward)
        else:
            raise fail(port, f"from_forward={port.from_forward!r} is no port of {forward.name}")
        inputs.append(GradientLink(port.name, *link))
    outputs = []
    for port in gradient.outputs:
        if port.gradient_of not in forward_inputs or port.from_forward is not None:
            raise fail(
                port, f"an output of a gradient op is the gradient of an input of {forward.name} {forward_inputs}"
            )
        outputs.append(
            GradientLink(
                port.name, GradientSource.INPUT_GRADIENT, port.gradient_of, forward_inputs.index(port.gradient_of)
            )
        )
    covered = {link.forward_port for link in outputs}
    missing = [port.name for port in forward.inputs if port.differentiable and port.name not in covered]
    if missing:
        raise ValueError(
            f"{gradient.name} has no gradient output for the differentiable inputs {missing} of {forward.name}"
        )
    return GradientWiring(forward, gradient, tuple(inputs), tuple(outputs))


LSTM_TRAINING_GRADIENT = gradient_wiring(LSTM_TRAINING)
"""LSTMGrad's wiring to LSTMTraining, resolved (and checked) when the spec is imported."""


# ---- optimizer ops ------------------------------------------------------------------------------
# Not LSTM ops: their ports have no LSTM dims (shape_doc says what they are) and they take none of
# LSTM's attributes. graphs/optimizers.py emits them for the train step; they are declared here so
# that the C++ header, docs/ops.md and the onnx schema read one contract.

SHAPE_AS_PARAM = "as param"
"""``shape_doc`` of an optimizer op's tensor ports: the shape of input ``param``, whatever it is."""
_SCALAR = "[] or [1]"


def _tensor_port(name: str, doc: str, *, optional: bool = False) -> PortSpec:
    return PortSpec(
        name=name, doc=doc, shape=(), type_str="T", optional=optional, differentiable=False, shape_doc=SHAPE_AS_PARAM
    )


def _scalar_port(name: str, doc: str, *, optional: bool = False) -> PortSpec:
    return PortSpec(
        name=name, doc=doc, shape=(), type_str="T1", optional=optional, differentiable=False, shape_doc=_SCALAR
    )


def _flag(name: str, doc: str) -> AttrSpec:
    """A 0/1 int attribute of an optimizer op, default 0."""
    return AttrSpec(name=name, type=AttrType.INT, default=0, required=False, doc=doc, accepts="0 or 1")


_MAXIMIZE = _flag("maximize", "1 maximizes the objective (the gradient is negated first), as torch's maximize=True.")

ADAM_UPDATE = OpSpec(
    name="AdamUpdate",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
One parameter's update by torch.optim.Adam or AdamW (torch's single-tensor path), in one pass.

The scalars are computed in float64 as torch computes them in Python floats:
`bias_correction1 = 1 - beta1**step`, `bias_correction2 = 1 - beta2**step`,
`step_size = lr / bias_correction1`, `bias_correction2_sqrt = bias_correction2**0.5`, and with
`decoupled_weight_decay` the factor `1 - lr * weight_decay`. Each is rounded once to T where
torch hands it to a tensor op, as are `1 - beta1`, `beta2`, `1 - beta2`, `eps` and `weight_decay`.

With `g` the gradient (negated if `maximize`): `g += weight_decay * param` (Adam's L2 term; with
`decoupled_weight_decay`, `param *= 1 - lr * weight_decay` instead); then
`exp_avg = lerp(exp_avg, g, 1 - beta1)` (torch's lerp: `exp_avg + w * (g - exp_avg)` for
`|w| < 0.5`, else `g + (w - 1) * (g - exp_avg)`), `exp_avg_sq = ((1 - beta2) * g) * g + beta2 *
exp_avg_sq`, with amsgrad `max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq)` (NaN propagates)
taking `exp_avg_sq`'s place below, and `param += (-step_size * exp_avg) /
(sqrt(v) / bias_correction2_sqrt + eps)`. Each `a * b + c` above is one fused multiply-add,
rounded once, as torch's CPU kernels compute `add(alpha=)`, `lerp` and `addcmul`.

The hyperparameters are float64 inputs, not attributes, because onnx's float attributes are
float32 and torch's are Python floats. Elementwise work is split over the session's intra-op
threads; the result does not depend on how.""",
    inputs=(
        _tensor_port("param", "The parameter before the update."),
        _tensor_port("grad", "Its gradient."),
        _tensor_port("exp_avg", "First moment estimate (torch's state name)."),
        _tensor_port("exp_avg_sq", "Second moment estimate."),
        _scalar_port("lr", "Learning rate of this update (the parameter group's)."),
        _scalar_port("step", "1-based number of this update (torch's state step after its increment)."),
        _scalar_port("beta1", "Decay rate of the first moment."),
        _scalar_port("beta2", "Decay rate of the second moment."),
        _scalar_port("eps", "Added to the denominator."),
        _scalar_port(
            "weight_decay",
            "Weight decay: Adam's L2 term, or AdamW's with decoupled_weight_decay. Default 0.",
            optional=True,
        ),
        _tensor_port(
            "max_exp_avg_sq",
            "amsgrad's running maximum of exp_avg_sq; given exactly when that output is.",
            optional=True,
        ),
    ),
    outputs=(
        _tensor_port("param_out", "The updated parameter."),
        _tensor_port("exp_avg_out", "The updated first moment."),
        _tensor_port("exp_avg_sq_out", "The updated second moment."),
        _tensor_port("max_exp_avg_sq_out", "The updated maximum (amsgrad).", optional=True),
    ),
    attributes=(
        _flag(
            "decoupled_weight_decay",
            "1: AdamW (torch's AdamW, or Adam's decoupled_weight_decay=True): the parameter is scaled by "
            "1 - lr * weight_decay before the step instead of weight_decay * param joining the gradient.",
        ),
        _MAXIMIZE,
    ),
    type_constraints=(
        TypeConstraintSpec(
            type_str="T",
            allowed_types=("tensor(float)", "tensor(double)"),
            doc="The parameter, its gradient and state share one type.",
        ),
        TypeConstraintSpec(
            type_str="T1",
            allowed_types=("tensor(double)",),
            doc="Learning rate, step and hyperparameters are float64, as torch's Python floats.",
        ),
    ),
    refusals=(
        "When run: grad, exp_avg, exp_avg_sq or max_exp_avg_sq of another shape than param; a scalar input with more "
        "than one element; max_exp_avg_sq given without max_exp_avg_sq_out or the reverse; an element type outside the "
        "type constraints, e.g. a float32 lr (onnxruntime's own message, which names the types, not the input).",
    ),
)

_OPTIMIZER_TYPE_CONSTRAINTS = ADAM_UPDATE.type_constraints

SGD_UPDATE = OpSpec(
    name="SGDUpdate",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
One parameter's update by torch.optim.SGD (torch's single-tensor path), in one pass.

With `g` the gradient (negated if `maximize`): `g += weight_decay * param`; with momentum, the
buffer becomes `g` itself at step 1 and `(momentum * buffer) + (1 - dampening) * g` after, and `g`
becomes `g + momentum * buffer` (`nesterov`) or the buffer; then `param += -lr * g`. `-lr`,
`weight_decay`, `momentum` and `1 - dampening` are computed in float64 as torch computes them in
Python floats and rounded once to T. Each `a * b + c` above is one fused multiply-add, rounded
once, as torch's CPU kernels compute `add(alpha=)`; `momentum * buffer` is rounded before it.

The hyperparameters are float64 inputs, not attributes, because onnx's float attributes are
float32 and torch's are Python floats. Elementwise work is split over the session's intra-op
threads; the result does not depend on how.""",
    inputs=(
        _tensor_port("param", "The parameter before the update."),
        _tensor_port("grad", "Its gradient."),
        _scalar_port("lr", "Learning rate of this update (the parameter group's)."),
        _tensor_port(
            "momentum_buffer",
            "Momentum buffer (torch's state name); given exactly when momentum_buffer_out is, i.e. with momentum.",
            optional=True,
        ),
        _scalar_port(
            "step",
            "1-based number of this update (the buffer starts as the gradient at step 1); required with "
            "momentum_buffer.",
            optional=True,
        ),
        _scalar_port(
            "momentum", "Momentum factor, > 0; required with momentum_buffer, refused without.", optional=True
        ),
        _scalar_port("dampening", "Dampening of the momentum. Default 0.", optional=True),
        _scalar_port("weight_decay", "L2 penalty added to the gradient. Default 0.", optional=True),
    ),
    outputs=(
        _tensor_port("param_out", "The updated parameter."),
        _tensor_port("momentum_buffer_out", "The updated momentum buffer.", optional=True),
    ),
    attributes=(
        _flag("nesterov", "1: Nesterov momentum, the step uses g + momentum * buffer (needs momentum_buffer)."),
        _MAXIMIZE,
    ),
    type_constraints=_OPTIMIZER_TYPE_CONSTRAINTS,
    refusals=(
        "When run: grad or momentum_buffer of another shape than param; a scalar input with more than one element; "
        "momentum_buffer given without momentum_buffer_out or the reverse; momentum_buffer without step or momentum, "
        "a momentum that is not > 0 with it, or momentum without it; nesterov without momentum_buffer; an element type "
        "outside the type constraints, e.g. a float32 lr (onnxruntime's own message, which names the types, not the "
        "input).",
    ),
)

OPTIMIZER_OPS: tuple[OpSpec, ...] = (ADAM_UPDATE, SGD_UPDATE)
"""Ops of the domain that are not LSTMs: the train step's optimizer updates."""


# ---- CTC ops ------------------------------------------------------------------------------------
# torch.nn.functional.ctc_loss's native pair (_ctc_loss, _ctc_loss_backward) as ops of the domain.
# Not LSTM ops: their ports have their own dims (shape_doc), named as in torch's docs: T (max_time,
# log_probs' first axis), N (batch), C (classes, blank included), S (padded targets' second axis, or
# the largest target length for concatenated targets). Reductions stay in the graph (standard ops).

_CTC_FLOAT = TypeConstraintSpec(
    type_str="T",
    allowed_types=("tensor(float)", "tensor(double)"),
    doc="log_probs, the losses, log_alpha and the gradients share one type: float32, or float64 for gradient checks.",
)
_CTC_TARGETS = TypeConstraintSpec(
    type_str="T1",
    allowed_types=("tensor(int32)", "tensor(int64)"),
    doc="Target labels, int32 or int64 as torch takes them.",
)
_CTC_LENGTHS = TypeConstraintSpec(
    type_str="T2",
    allowed_types=("tensor(int32)", "tensor(int64)"),
    doc="input_lengths and target_lengths, int32 or int64 (both the same).",
)


def _ctc_port(name: str, doc: str, shape: str, type_str: str, *, differentiable: bool = False) -> PortSpec:
    return PortSpec(
        name=name,
        doc=doc,
        shape=(),
        type_str=type_str,
        optional=False,
        differentiable=differentiable,
        shape_doc=shape,
    )


_CTC_SHARED_INPUTS = (
    _ctc_port(
        "log_probs",
        "Log-probabilities of every class at every step (e.g. a log_softmax over C), time-major as torch's.",
        "[T, N, C]",
        "T",
        differentiable=True,
    ),
    _ctc_port(
        "targets",
        "Label sequences: padded [N, S] (sample n's labels in its first target_lengths[n] entries) or all of them "
        "concatenated, [sum(target_lengths)]. Labels lie in [0, C) and differ from blank.",
        "[N, S] or [sum(target_lengths)]",
        "T1",
    ),
    _ctc_port("input_lengths", "Valid steps of each sample's log_probs, each in [0, T].", "[N]", "T2"),
    _ctc_port(
        "target_lengths",
        "Length of each sample's target, each >= 0 (and <= S for padded targets).",
        "[N]",
        "T2",
    ),
)

_CTC_ATTRIBUTES = (
    AttrSpec(
        name="blank",
        type=AttrType.INT,
        default=0,
        required=False,
        doc="The blank label, as torch's `blank`.",
        accepts="an integer >= 0 (and < C, checked when run)",
    ),
    AttrSpec(
        name="zero_infinity",
        type=AttrType.INT,
        default=0,
        required=False,
        doc=(
            "1: an infinite loss (no alignment of the target fits in the input, e.g. a target longer than the "
            "input) becomes 0, and so does its gradient, as torch's `zero_infinity=True`."
        ),
        accepts="0 or 1",
    ),
)

_CTC_REFUSALS = (
    "When run, before any work: log_probs of a rank other than 3; targets of a rank other than 1 or 2; "
    "input_lengths or target_lengths of another shape than [N]; padded targets with a first axis other than N, or "
    "concatenated targets with another length than sum(target_lengths); a length below 0, an input length above "
    "T, a target length above S (padded targets); a label (within a sample's target length) outside [0, C) or "
    "equal to blank; blank >= C; integer inputs of a type other than int32 or int64. Each message names the input, "
    "the sample and the expected and actual values.",
)

CTC_LOSS = OpSpec(
    name="CTCLoss",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Connectionist temporal classification loss of each sample: torch.nn.functional.ctc_loss with
reduction='none' (torch's `_ctc_loss`), and the forward variables `CTCLossGrad` needs.

For sample n with input length L = input_lengths[n] and target l of length U = target_lengths[n],
the extended target l' = (blank, l_1, blank, l_2, ..., l_U, blank) has 2U+1 states, and in log space
(Graves et al. 2006, eqs. 6-8):

    log_alpha[n, 0, 0] = log_probs[0, n, blank],  log_alpha[n, 0, 1] = log_probs[0, n, l_1]
    log_alpha[n, t, s] = logsumexp(log_alpha[n, t-1, s], log_alpha[n, t-1, s-1],
                                   log_alpha[n, t-1, s-2] if l'_s != l'_{s-2}) + log_probs[t, n, l'_s]
    loss[n] = -logsumexp(log_alpha[n, L-1, 2U], log_alpha[n, L-1, 2U-1])

(only log_alpha[n, L-1, 0] when U = 0; with L = 0 the loss is 0 for U = 0, else +inf). Every sum
is a logsumexp with the maximum taken out, so nothing underflows however long the input.
log_alpha is -inf wherever the recursion does not reach (t >= L, s > 2U). `reduction='mean'` is
`ReduceMean(loss / Max(target_lengths, 1))` and `'sum'` is `ReduceSum(loss)` in the graph.
Samples are split over the session's intra-op threads; the result does not depend on how.""",
    inputs=_CTC_SHARED_INPUTS,
    outputs=(
        _ctc_port(
            "loss",
            "Negative log-likelihood of each sample's target; +inf when no alignment fits (0 with zero_infinity).",
            "[N]",
            "T",
            differentiable=True,
        ),
        dataclasses.replace(
            _ctc_port(
                "log_alpha",
                "The forward variables, stash for CTCLossGrad; -inf where unreached. S is targets' second axis "
                "(padded) or max(target_lengths) (concatenated), as torch's.",
                "[N, T, 2*S+1]",
                "T",
            ),
            optional=True,
        ),
    ),
    attributes=_CTC_ATTRIBUTES,
    type_constraints=(_CTC_FLOAT, _CTC_TARGETS, _CTC_LENGTHS),
    refusals=_CTC_REFUSALS,
)

CTC_LOSS_GRAD = OpSpec(
    name="CTCLossGrad",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Gradient of `CTCLoss`'s loss with respect to log_probs, as torch's `_ctc_loss_backward` computes it.

With log_beta the backward variables (eqs. 10-11 of Graves et al.) and, for step t < L and class c,
`collected[t, c] = logsumexp over the states s with l'_s = c of log_alpha[n, t, s] + log_beta[n, t, s]`:

    grad_log_probs[t, n, c] = (exp(log_probs[t, n, c]) - exp(collected[t, c] + loss[n] - log_probs[t, n, c]))
                              * grad_loss[n]

and 0 for t >= L. This is torch's convention: the derivative of the loss with respect to log_probs
plus exp(log_probs) * grad_loss. A normalization over C in front (log_softmax, or Log of a softmax)
cancels that term exactly, so the gradient at its input is the true one; fed log_probs that are not
normalized, the gradient is torch's, not the derivative. With zero_infinity an infinite loss gets a
zero gradient (known from log_alpha, as loss holds 0 there); without it, its gradient is NaN, as
torch's. Attributes must equal the forward node's. No port is differentiable: second-order
gradients are not provided.""",
    inputs=(
        dataclasses.replace(
            _ctc_port("grad_loss", "Gradient of the objective with respect to each sample's loss.", "[N]", "T"),
            gradient_of="loss",
        ),
        *(dataclasses.replace(port, differentiable=False) for port in _CTC_SHARED_INPUTS),
        _ctc_port("loss", "The forward node's loss output.", "[N]", "T"),
        _ctc_port("log_alpha", "The forward node's log_alpha output.", "[N, T, 2*S+1]", "T"),
    ),
    outputs=(
        dataclasses.replace(
            _ctc_port(
                "grad_log_probs", "Gradient with respect to log_probs (torch's convention, above).", "[T, N, C]", "T"
            ),
            gradient_of="log_probs",
        ),
    ),
    attributes=_CTC_ATTRIBUTES,
    type_constraints=(_CTC_FLOAT, _CTC_TARGETS, _CTC_LENGTHS),
    refusals=(
        *_CTC_REFUSALS,
        "When run: grad_loss or loss of another shape than [N]; log_alpha of another shape than [N, T, 2*S+1].",
    ),
)

CTC_OPS: tuple[OpSpec, ...] = (CTC_LOSS, CTC_LOSS_GRAD)
"""The CTC loss and its gradient: ops with their own dims and attributes, like the optimizer ops."""


# ---- Gradients of standard ops ------------------------------------------------------------------
# The backward of a standard ONNX op in one op where the standard-op formulation is slow, each with
# the contract of onnxruntime's com.microsoft op of the same name (same port names and order, same
# attributes), so that either can take the other's node. Their ports have their own dims
# (shape_doc): for ConvGrad N (batch), C (input channels), M (output maps), G (group), in... /
# out... / k... (X's, Y's and W's spatial dims).

_GRADIENT_FLOAT = TypeConstraintSpec(
    type_str="T",
    allowed_types=("tensor(float)", "tensor(double)"),
    doc="Every port: float32, or float64 for gradient checks.",
)


def _gradient_port(name: str, doc: str, shape: str, *, optional: bool = False) -> PortSpec:
    return PortSpec(
        name=name, doc=doc, shape=(), type_str="T", optional=optional, differentiable=False, shape_doc=shape
    )


_CONV_ATTRIBUTES = (
    AttrSpec(
        name="auto_pad",
        type=AttrType.STRING,
        default="NOTSET",
        required=False,
        doc=(
            "As the forward Conv's: NOTSET (explicit `pads`), VALID (no padding), SAME_UPPER or SAME_LOWER "
            "(out = ceil(in / stride), the odd pad at the end or the beginning)."
        ),
        accepts="NOTSET, VALID, SAME_UPPER or SAME_LOWER; with any but NOTSET, no `pads`",
    ),
    AttrSpec(
        name="dilations",
        type=AttrType.INTS,
        default=None,
        required=False,
        doc="As the forward Conv's; 1 per spatial axis when omitted.",
        accepts="one integer >= 1 per spatial axis",
    ),
    AttrSpec(
        name="group",
        type=AttrType.INT,
        default=1,
        required=False,
        doc="As the forward Conv's: C and M are split into G groups, group g's maps read group g's channels only.",
        accepts="an integer >= 1 that divides M and equals C / (W's second axis)",
    ),
    AttrSpec(
        name="kernel_shape",
        type=AttrType.INTS,
        default=None,
        required=False,
        doc="As the forward Conv's; W's spatial dims when omitted.",
        accepts="W's spatial dims",
    ),
    AttrSpec(
        name="pads",
        type=AttrType.INTS,
        default=None,
        required=False,
        doc="As the forward Conv's: the begin pads then the end pads of each spatial axis; 0 when omitted.",
        accepts="two integers >= 0 per spatial axis",
    ),
    AttrSpec(
        name="strides",
        type=AttrType.INTS,
        default=None,
        required=False,
        doc="As the forward Conv's; 1 per spatial axis when omitted.",
        accepts="one integer >= 1 per spatial axis",
    ),
)

CONV_GRAD = OpSpec(
    name="ConvGrad",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Gradients of a standard ONNX `Conv` `Y = conv(X, W) + B` (N-D: 1-D, 2-D, 3-D, ...) with respect to
X, W and B, given the gradient dY of Y. A drop-in for onnxruntime's com.microsoft ConvGrad (of the
training build): the same ports and attributes, which are the forward Conv's.

With G groups, Cg = C/G channels and Mg = M/G maps per group, K taps and `cols = im2col(X[n, g])`
([Cg*K, O]: tap j of channel c at each of the O output positions, 0 in the padding):

    dW[g] = sum_n dY[n, g] cols^T                  ([Mg, O] x [O, Cg*K], one GEMM per image and group)
    dX[n, g] = col2im(W[g]^T dY[n, g])              (each column entry added to the element its tap read)
    dB[m] = sum over n and the output positions of dY[n, m]

Images are split over the session's intra-op threads (each running the BLAS single-threaded); each
part sums its own dW, and the parts are added in a fixed order, so results do not depend on
scheduling. dB is summed in float64. Omitted outputs are not computed.""",
    inputs=(
        _gradient_port("dY", "Gradient with respect to the forward Conv's output Y.", "[N, M, out...]"),
        _gradient_port("X", "The forward Conv's input.", "[N, C, in...]"),
        _gradient_port("W", "The forward Conv's weight.", "[M, C/G, k...]"),
    ),
    outputs=(
        _gradient_port("dX", "Gradient with respect to X.", "[N, C, in...]", optional=True),
        _gradient_port("dW", "Gradient with respect to W.", "[M, C/G, k...]", optional=True),
        _gradient_port("dB", "Gradient with respect to the bias B.", "[M]", optional=True),
    ),
    attributes=_CONV_ATTRIBUTES,
    type_constraints=(_GRADIENT_FLOAT,),
    refusals=(
        "When run, before any work: X of rank < 3, W of another rank than X's, dY of another shape than "
        "[N, M, out...] with out = floor((in + pad_begin + pad_end - (k - 1) * dilation - 1) / stride) + 1 per axis "
        "(SAME: ceil(in / stride)); C other than G times W's second axis, M not divisible by G; kernel_shape other "
        "than W's spatial dims; strides, dilations or pads of the wrong length or out of range; a GEMM dim above "
        "2^31 - 1. Each message names the input or attribute with the expected and actual values.",
    ),
)


def _activation_grad(name: str, activation: str, formula: str) -> OpSpec:
    return OpSpec(
        name=name,
        domain=DOMAIN,
        version=OPSET_VERSION,
        doc=f"""\
Gradient of a standard ONNX `{activation}` `Y = {activation.lower()}(X)` with respect to X, from its
output Y and the gradient dY of Y, in one pass (a drop-in for onnxruntime's com.microsoft {name}):

    {formula}

computed in that order, each operation rounded as the standard ops would round it (no fused
multiply-adds), so the result equals the standard-op gradient's bit for bit. Split over the
session's intra-op threads in fixed chunks.""",
        inputs=(
            _gradient_port("dY", f"Gradient with respect to the {activation}'s output Y.", "as Y"),
            _gradient_port("Y", f"The forward {activation}'s output.", "any"),
        ),
        outputs=(_gradient_port("dX", "Gradient with respect to X.", "as Y"),),
        attributes=(),
        type_constraints=(_GRADIENT_FLOAT,),
        refusals=("When run: dY of another shape than Y's (the message gives both).",),
    )


SIGMOID_GRAD = _activation_grad("SigmoidGrad", "Sigmoid", "dX = dY * (Y * (1 - Y))")
TANH_GRAD = _activation_grad("TanhGrad", "Tanh", "dX = dY * (1 - Y * Y)")

GRADIENT_OPS: tuple[OpSpec, ...] = (CONV_GRAD, SIGMOID_GRAD, TANH_GRAD)
"""Gradients of standard ops (Conv, Sigmoid, Tanh): ops with their own dims and attributes, like the CTC ops."""
