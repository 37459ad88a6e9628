"""The fused optimizer updates: AdamUpdate and SGDUpdate. Part of the op contract (``ops/schema.py``)."""

from __future__ import annotations

from ortlstm.ops.contract import DOMAIN, OPSET_VERSION, AttrSpec, AttrType, OpSpec, PortSpec, TypeConstraintSpec
from ortlstm.ops.family import Family, InputFlag, OutputShape

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



OPTIMIZER_FAMILY = Family(
    name="optimizer",
    ops=OPTIMIZER_OPS,
    doc_label="for the train step's optimizer",
    input_flags=(InputFlag("IsDouble", ("tensor(double)",)),),
    output_shapes={
        op.name: tuple(OutputShape(port.name, "param") for port in op.outputs if port.shape_doc == SHAPE_AS_PARAM)
        for op in OPTIMIZER_OPS
    },
)
"""The optimizer ops: their attributes are their own; every tensor output is param's type and shape."""
