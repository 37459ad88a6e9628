"""GRUTraining and GRUGrad: the GRU forward with its stash, and its gradient.

The recurrent family's second cell. The attributes and ports that ONNX GRU shares with ONNX LSTM
(hidden_size, direction, activations and their alpha/beta, clip, layout; X, W, R, B,
sequence_lens, initial_h, HAll, Ht) are the LSTM spec's declarations with the gate count and the
activation count changed (``recurrent_attributes``, ``_gated``), so a rule the two share is
written once. Part of the op contract (``ops/schema.py`` gathers every op).
"""

from __future__ import annotations

import dataclasses

from ortlstm.ops.contract import (
    ACTIVATIONS,
    BLAS_DIM_LIMIT,
    DOMAIN,
    MAX_BUFFER_ELEMENTS,
    OPSET_VERSION,
    AttrSpec,
    AttrType,
    OpSpec,
    PortSpec,
)
from ortlstm.ops.family import Family
from ortlstm.ops.spec_lstm import (
    FLOAT_TYPES,
    LSTM_ATTRIBUTES,
    LSTM_FAMILY,
    LSTM_GRAD,
    LSTM_TRAINING,
    SEQUENCE_LENS_TYPE,
)

GRU_GATES = 3
"""Gates of a GRU, stacked z, r, h in W, R and the stash (ONNX GRU's order)."""


def recurrent_attributes(
    cell: str, activation_roles: str, defaults: str, extra: tuple[AttrSpec, ...]
) -> tuple[AttrSpec, ...]:
    """The LSTM ops' attributes for a recurrent cell with its own activation count and extra attributes.

    Args:
        cell: The cell's name as its ONNX op spells it (``"GRU"``): it replaces "LSTM" in docs and accepts.
        activation_roles: The cell's activations as the docs name them, e.g. ``"f, g"``.
        defaults: Their default names, e.g. ``"Sigmoid, Tanh"``.
        extra: Attributes the cell adds; LSTM's `input_forget` is dropped.

    Returns:
        hidden_size, direction, activations, activation_alpha, activation_beta, activations_csv,
        clip, layout (LSTM's declarations, their activation count rewritten), then ``extra``.
    """
    count = len(activation_roles.split(","))
    shared = []
    for attr in LSTM_ATTRIBUTES:
        if attr.name == "input_forget":
            continue
        if attr.name == "activations":
            attr = dataclasses.replace(
                attr,
                doc=(
                    f"Activation functions {activation_roles} (one group per direction), ONNX spelling, "
                    f"case-insensitive. Default: `{defaults}` for each direction."
                ),
                accepts=attr.accepts.replace("3*num_directions", f"{count}*num_directions"),
            )
        if attr.name == "activations_csv":
            attr = dataclasses.replace(attr, doc=attr.doc.replace("Sigmoid,Tanh,Tanh", defaults.replace(" ", "")))
        doc, accepts = attr.doc.replace("LSTM", cell), attr.accepts.replace("LSTM", cell)
        shared.append(dataclasses.replace(attr, doc=doc, accepts=accepts))
    return (*shared, *extra)


GRU_ATTRIBUTES = recurrent_attributes(
    "GRU",
    "f, g",
    "Sigmoid, Tanh",
    (
        AttrSpec(
            name="linear_before_reset",
            type=AttrType.INT,
            default=0,
            required=False,
            doc=(
                "1 applies the reset gate after the recurrent product, `r * (H R_h^T + Rb_h)` (torch's nn.GRU, "
                "which torch.onnx.export writes as 1); 0 before it, `(r * H) R_h^T + Rb_h`."
            ),
            accepts="0 or 1",
        ),
    ),
)
if any(name not in ACTIVATIONS for name in ("Sigmoid", "Tanh")):
    raise ValueError("GRU's default activations must be among ACTIVATIONS")


def _gated(port: PortSpec, doc: str | None = None) -> PortSpec:
    """An LSTM port with its ``4*hidden_size`` / ``8*hidden_size`` gate width rewritten for three gates."""
    shape = tuple(
        {"4*hidden_size": f"{GRU_GATES}*hidden_size", "8*hidden_size": f"{2 * GRU_GATES}*hidden_size"}.get(dim, dim)
        for dim in port.shape
    )
    return dataclasses.replace(port, shape=shape, doc=doc or port.doc)


def _lstm_port(op: OpSpec, name: str) -> PortSpec:
    return next(port for port in op.inputs + op.outputs if port.name == name)


_GATE_WIDTH = ("seq_length", "num_directions", "batch_size", f"{GRU_GATES}*hidden_size")

_REFUSALS = (
    "When the session is created: a node without `hidden_size`; an attribute of another type than its declared "
    "one; a value outside the attribute's *Accepts*; `activations` and `activations_csv` that disagree; on "
    "onnxruntime older than 1.25, a node that sets `activations` without `activations_csv`.",
    "When run, before any work: X of a rank other than 3; X whose seq_length*batch_size, seq_length*3*hidden_size, "
    f"batch_size or input_size exceeds {BLAS_DIM_LIMIT} (BLAS takes 32-bit sizes), or whose scratch buffers would "
    f"hold more than {MAX_BUFFER_ELEMENTS} elements.",
    "When run: an input whose shape differs from its row in the tables for X's dims and the attributes; a "
    "`sequence_lens` value outside [0, seq_length]; element types outside the type constraints.",
)

GRU_TRAINING = OpSpec(
    name="GRUTraining",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
One GRU layer, forward, that also returns what `GRUGrad` needs to differentiate it.

Inputs and attributes are those of ONNX `GRU` (opset 14) plus `activations_csv`; HAll and Ht are
GRU's Y and Y_h. ZRH stashes the activated gates of every step, so the backward pass needs no
recurrence to recover them. All outputs are optional.

Drop-in: the inputs and outputs keep the order and meaning of `com.microsoft` `GRUTraining`
(onnxruntime-training), so a graph written for it switches to this domain without rewiring.

Per direction and step t, with gates in the order z, r, h and activations f, g (default Sigmoid,
Tanh); clip, when set, bounds each pre-activation before its activation:

    z_t = f(X_t W_z^T + H_{t-1} R_z^T + Wb_z + Rb_z)
    r_t = f(X_t W_r^T + H_{t-1} R_r^T + Wb_r + Rb_r)
    h_t = g(X_t W_h^T + (r_t * H_{t-1}) R_h^T + Rb_h + Wb_h)      linear_before_reset = 0
    h_t = g(X_t W_h^T + r_t * (H_{t-1} R_h^T + Rb_h) + Wb_h)      linear_before_reset = 1
    H_t = (1 - z_t) * h_t + z_t * H_{t-1}

Steps t >= sequence_lens[b] (counting from 0) are zero in HAll and ZRH; Ht holds the state at
each sequence's last valid step (zero for a sequence of length 0).""",
    inputs=(
        *(_gated(_lstm_port(LSTM_TRAINING, name)) for name in ("X",)),
        _gated(_lstm_port(LSTM_TRAINING, "W"), "Input weights, gates stacked zrh."),
        _gated(_lstm_port(LSTM_TRAINING, "R"), "Recurrence weights, gates stacked zrh."),
        _gated(_lstm_port(LSTM_TRAINING, "B"), "Biases `[Wb_zrh, Rb_zrh]`. Default zeros."),
        _lstm_port(LSTM_TRAINING, "sequence_lens"),
        _lstm_port(LSTM_TRAINING, "initial_h"),
    ),
    outputs=(
        _gated(_lstm_port(LSTM_TRAINING, "HAll"), "Hidden state of every step (ONNX GRU's Y)."),
        _gated(_lstm_port(LSTM_TRAINING, "Ht"), "Last hidden state (ONNX GRU's Y_h)."),
        PortSpec(
            name="ZRH",
            doc="Activated gates z, r, h of every step; stash for GRUGrad.",
            shape=_GATE_WIDTH,
            type_str="T",
            optional=True,
            differentiable=False,
        ),
    ),
    attributes=GRU_ATTRIBUTES,
    type_constraints=(FLOAT_TYPES, SEQUENCE_LENS_TYPE),
    refusals=_REFUSALS,
)


def _forward_port(name: str) -> PortSpec:
    return next(port for port in GRU_TRAINING.inputs + GRU_TRAINING.outputs if port.name == name)


def _from_forward(name: str, *, optional: bool | None = None) -> PortSpec:
    port = _forward_port(name)
    return dataclasses.replace(
        port,
        doc=f"{name} of the forward node.",
        optional=port.optional if optional is None else optional,
        differentiable=False,
        from_forward=name,
    )


def _lstm_grad_port(name: str) -> PortSpec:
    """An LSTMGrad port whose meaning GRUGrad shares, with three gates."""
    return _gated(next(port for port in LSTM_GRAD.inputs + LSTM_GRAD.outputs if port.name == name))


GRU_GRAD = OpSpec(
    name="GRUGrad",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Gradients of `GRUTraining` with respect to its differentiable inputs.

Takes the forward inputs, the stash of the forward node (HAll, ZRH) and the gradients that reach
the forward outputs HAll and Ht. Attributes must equal the forward node's. An omitted gradient
input counts as zeros; an omitted output is not computed. No port of this op is differentiable.

Drop-in: the inputs and outputs keep the order and meaning of `com.microsoft` `GRUGrad`
(onnxruntime-training). With linear_before_reset = 1, `H_{t-1} R_h^T` is recomputed from HAll
in one GEMM over all steps rather than stashed.""",
    inputs=(
        *(_from_forward(name) for name in ("X", "W", "R", "B", "sequence_lens", "initial_h")),
        *(_from_forward(name, optional=False) for name in ("HAll", "ZRH")),
        _lstm_grad_port("grad_HAll"),
        _lstm_grad_port("grad_Ht"),
    ),
    outputs=(
        *(_lstm_grad_port(name) for name in ("dX", "dW", "dR")),
        dataclasses.replace(_lstm_grad_port("dB"), doc="Gradient with respect to B."),
        _lstm_grad_port("dH0"),
    ),
    attributes=GRU_ATTRIBUTES,
    type_constraints=(FLOAT_TYPES, SEQUENCE_LENS_TYPE),
    refusals=(
        _REFUSALS[0],
        "When the session is created: LeakyRelu or Elu as f or g with a negative or NaN alpha (GRUGrad recovers "
        "the derivatives from the stashed activated gates, which such an alpha makes ambiguous).",
        *_REFUSALS[1:],
    ),
    gradient_of=GRU_TRAINING.name,
)

GRU_OPS: tuple[OpSpec, ...] = (GRU_TRAINING, GRU_GRAD)

GRU_FAMILY = Family(
    name="GRU",
    ops=GRU_OPS,
    doc_label="the GRU",
    shared_attributes=LSTM_FAMILY.shared_attributes,
    attribute_accepts=True,
)
"""The GRU ops: the attributes they share with the LSTM ops are ``attr::``'s; their own are named per op."""
