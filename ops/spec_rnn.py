"""RNNTraining and RNNGrad: the vanilla RNN (ONNX ``RNN``, torch's ``nn.RNN``) forward and its gradient.

The recurrent family's third cell, declared as the GRU's is: the attributes ONNX RNN shares with
ONNX LSTM are the LSTM spec's (``recurrent_attributes`` with one activation per direction), the
ports are the LSTM's with one gate. There is no stash output: the cell's only activation produces
H_t itself, so RNNGrad reads its derivative off HAll (the refusal of LeakyRelu/Elu with a negative
alpha, whose outputs do not determine the derivative, is the GRU's). There is no com.microsoft
RNN training op to be a drop-in for; the port order follows GRUTraining/GRUGrad's without ZRH.
Part of the op contract (``ops/schema.py`` gathers every op).
"""

from __future__ import annotations

import dataclasses

from ortlstm.ops.contract import ACTIVATIONS, DOMAIN, OPSET_VERSION, OpSpec, PortSpec
from ortlstm.ops.spec_gru import GRU_FAMILY, GRU_GRAD, GRU_TRAINING, recurrent_attributes
from ortlstm.ops.spec_lstm import FLOAT_TYPES, SEQUENCE_LENS_TYPE

RNN_GATES = 1
"""Gates of an RNN: W, R and the biases hold one hidden_size block per direction."""

RNN_ATTRIBUTES = recurrent_attributes("RNN", "f", "Tanh", ())
if "Tanh" not in ACTIVATIONS:
    raise ValueError("RNN's default activation must be among ACTIVATIONS")


def _one_gate(port: PortSpec, doc: str | None = None) -> PortSpec:
    """A GRU port with its ``3*hidden_size`` / ``6*hidden_size`` gate width rewritten for one gate."""
    widths = {"3*hidden_size": "hidden_size", "6*hidden_size": "2*hidden_size"}
    shape = tuple(widths.get(dim, dim) for dim in port.shape)
    doc = doc or port.doc.replace("GRU", "RNN")
    return dataclasses.replace(port, shape=shape, doc=doc)


def _port(op: OpSpec, name: str) -> PortSpec:
    return next(port for port in op.inputs + op.outputs if port.name == name)


_REFUSALS = tuple(refusal.replace("3*hidden_size", "hidden_size") for refusal in GRU_TRAINING.refusals)

RNN_TRAINING = OpSpec(
    name="RNNTraining",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
One vanilla RNN layer, forward, whose outputs are all `RNNGrad` needs to differentiate it.

Inputs and attributes are those of ONNX `RNN` (opset 14) plus `activations_csv`; HAll and Ht are
RNN's Y and Y_h. No stash: f's output is H_t itself, so RNNGrad reads f' off HAll. All outputs
are optional (RNNGrad needs HAll).

Per direction and step t, with activation f (default Tanh; torch's nn.RNN exports Tanh or Relu);
clip, when set, bounds the pre-activation before f:

    H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)

Steps t >= sequence_lens[b] (counting from 0) are zero in HAll; Ht holds the state at each
sequence's last valid step (zero for a sequence of length 0).""",
    inputs=(
        _port(GRU_TRAINING, "X"),
        _one_gate(_port(GRU_TRAINING, "W"), "Input weights W."),
        _one_gate(_port(GRU_TRAINING, "R"), "Recurrence weights R."),
        _one_gate(_port(GRU_TRAINING, "B"), "Biases `[Wb, Rb]`. Default zeros."),
        _port(GRU_TRAINING, "sequence_lens"),
        _port(GRU_TRAINING, "initial_h"),
    ),
    outputs=(
        _one_gate(_port(GRU_TRAINING, "HAll"), "Hidden state of every step (ONNX RNN's Y)."),
        _one_gate(_port(GRU_TRAINING, "Ht"), "Last hidden state (ONNX RNN's Y_h)."),
    ),
    attributes=RNN_ATTRIBUTES,
    type_constraints=(FLOAT_TYPES, SEQUENCE_LENS_TYPE),
    refusals=_REFUSALS,
)


def _from_forward(name: str, *, optional: bool | None = None) -> PortSpec:
    port = _port(RNN_TRAINING, name)
    return dataclasses.replace(
        port,
        doc=f"{name} of the forward node.",
        optional=port.optional if optional is None else optional,
        differentiable=False,
        from_forward=name,
    )


RNN_GRAD = OpSpec(
    name="RNNGrad",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Gradients of `RNNTraining` with respect to its differentiable inputs.

Takes the forward inputs, the forward node's HAll and the gradients that reach the forward
outputs HAll and Ht. Attributes must equal the forward node's. An omitted gradient input counts
as zeros; an omitted output is not computed. No port of this op is differentiable.

With dH = dL/dH_t (from step t+1 and grad_HAll) and f' read off H_t (zero where clip held the
pre-activation): da = dH . f'(H_t), dH_{t-1} = da R, dX = da W, dW = da^T X, dR = da^T H_{t-1},
dWb = dRb = sum da.""",
    inputs=(
        *(_from_forward(name) for name in ("X", "W", "R", "B", "sequence_lens", "initial_h")),
        _from_forward("HAll", optional=False),
        _one_gate(_port(GRU_GRAD, "grad_HAll")),
        _one_gate(_port(GRU_GRAD, "grad_Ht")),
    ),
    outputs=tuple(_one_gate(_port(GRU_GRAD, name)) for name in ("dX", "dW", "dR", "dB", "dH0")),
    attributes=RNN_ATTRIBUTES,
    type_constraints=(FLOAT_TYPES, SEQUENCE_LENS_TYPE),
    refusals=(
        _REFUSALS[0],
        "When the session is created: LeakyRelu or Elu as f with a negative or NaN alpha (RNNGrad reads f' off "
        "HAll, f's output, which such an alpha makes ambiguous).",
        *_REFUSALS[1:],
    ),
    gradient_of=RNN_TRAINING.name,
)

RNN_OPS: tuple[OpSpec, ...] = (RNN_TRAINING, RNN_GRAD)

RNN_FAMILY = dataclasses.replace(GRU_FAMILY, name="RNN", ops=RNN_OPS, doc_label="the RNN")
"""The RNN ops: rendered as the GRU's (shared ``attr::``, their own attributes per op)."""
