"""LSTMTraining and LSTMGrad: the LSTM forward with its stash, and its gradient.

Both take ONNX LSTM's attributes; LSTMGrad's ports mirror LSTMTraining's. Part of the op contract
(``ops/schema.py`` gathers every op).
"""

from __future__ import annotations

import dataclasses

from ortlstm.ops.contract import (
    ACTIVATIONS,
    BLAS_DIM_LIMIT,
    DIRECTIONS,
    DOMAIN,
    MAX_BUFFER_ELEMENTS,
    MAX_HIDDEN_SIZE,
    OPSET_VERSION,
    AttrSpec,
    AttrType,
    OpSpec,
    PortSpec,
    TypeConstraintSpec,
)
from ortlstm.ops.family import Family

FLOAT_TYPES = TypeConstraintSpec(
    type_str="T",
    allowed_types=("tensor(float)", "tensor(double)"),
    doc="All float tensors of a node share one type: float32 for training, float64 for gradient checks.",
)
SEQUENCE_LENS_TYPE = TypeConstraintSpec(
    type_str="T1",
    allowed_types=("tensor(int32)",),
    doc="sequence_lens is int32, as in ONNX LSTM.",
)

MATMUL_PRECISION = AttrSpec(
    name="matmul_precision",
    type=AttrType.STRING,
    default="float32",
    required=False,
    doc=(
        "Precision of the op's GEMMs (no standard ONNX op has it; export drops it). `float32`: today's results bit "
        "for bit. `bfloat16`: every GEMM takes its operands rounded to bfloat16 (round to nearest even) and "
        "accumulates in float32, on the CPU's bf16 units where it has them (AVX512-BF16, AMX; else slower than "
        "float32, same numbers); gate math, states, the stash, all outputs and gradients stay float32. "
        "`bfloat16` takes float32 tensors only (float64, for gradient checks, is refused when the session is "
        "created)."
    ),
    accepts="float32 or bfloat16",
)
"""Declared once for every op with GEMMs: the recurrent ops (via LSTM_ATTRIBUTES) and ConvGrad."""

# Both ops take ONNX LSTM's attributes so a gradient node can copy its forward node's attributes
# verbatim. hidden_size is required (ONNX LSTM makes it optional) because the kernels size every
# buffer from it before reading R.
LSTM_ATTRIBUTES = (
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
    MATMUL_PRECISION,
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
    attributes=LSTM_ATTRIBUTES,
    type_constraints=(FLOAT_TYPES, SEQUENCE_LENS_TYPE),
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
    attributes=LSTM_ATTRIBUTES,
    type_constraints=(FLOAT_TYPES, SEQUENCE_LENS_TYPE),
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



LSTM_FAMILY = Family(
    name="LSTM",
    ops=OPS,
    doc_label="Ops",
    shared_attributes=tuple(attr.name for attr in LSTM_ATTRIBUTES),
    attribute_accepts=True,
)
"""The LSTM ops: their attributes are the header's shared ``attr::``; output shapes from the spec's dims."""
