"""Binary losses: torch.nn.functional.binary_cross_entropy, binary_cross_entropy_with_logits, soft_margin_loss.

Element-wise on a float prediction (probabilities, or logits) and a target of its type and shape
(probabilities, or labels of 1 and -1), then torch's reduction (mean by default, sum or none).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx.helper

from ortlstm.graphs.emit.emitter import GraphEmitter, ValueType
from ortlstm.graphs.losses.base import Loss, float_constant, reduce, register_loss


def _log_sigmoid(emitter: GraphEmitter, x: str) -> str:
    """``log(sigmoid(x))`` without overflow, smooth everywhere (also its gradient at 0).

    ``-log(1 + exp(-x))`` where ``x >= 0``, ``x - log(1 + exp(x))`` elsewhere; each branch reads
    ``x`` through a Where that zeroes it on the other side, so neither overflows and the branch
    not taken backpropagates zeros, not NaNs. (onnxruntime has Softplus for float32 only.)
    """
    zero = float_constant(emitter, 0.0, x)
    one = float_constant(emitter, 1.0, x)
    non_negative = emitter.op("Not", [emitter.op("Less", [x, zero])])
    x_pos = emitter.op("Where", [non_negative, x, zero])
    x_neg = emitter.op("Where", [non_negative, zero, x])
    positive = emitter.op(
        "Neg", [emitter.op("Log", [emitter.op("Add", [one, emitter.op("Exp", [emitter.op("Neg", [x_pos])])])])]
    )
    negative = emitter.op("Sub", [x_neg, emitter.op("Log", [emitter.op("Add", [one, emitter.op("Exp", [x_neg])])])])
    return emitter.op("Where", [non_negative, positive, negative])


# torch's binary_cross_entropy_backward divides by max(x (1 - x), EPSILON), EPSILON a float 1e-12 in
# every dtype (float64 gradients show 1 / 9.999999960041972e-13).
_BCE_EPSILON = float(np.float32(1e-12))


def _log1p_of_negative(emitter: GraphEmitter, x: str) -> str:
    """``log1p(-x)`` to a few roundings (ONNX has no Log1p).

    With ``w = 1 - x`` rounded, ``log(w) * -x / (w - 1)``, which cancels the rounding of ``w``,
    and ``-x`` where ``w`` is 1. ``x = 1`` gives -inf (torch then clamps to -100).
    """
    one = float_constant(emitter, 1.0, x)
    w = emitter.op("Sub", [one, x])
    neg_x = emitter.op("Neg", [x])
    corrected = emitter.op("Div", [emitter.op("Mul", [emitter.op("Log", [w]), neg_x]), emitter.op("Sub", [w, one])])
    return emitter.op("Where", [emitter.op("Equal", [w, one]), neg_x, corrected])


def _binary_cross_entropy_gradient(emitter: GraphEmitter, spec: Loss, input: str, target: str) -> str:
    """The gradient torch's binary_cross_entropy_backward computes for a seed of ones.

    In its order of operations: ``(x - y) / max((1 - x) * x, EPSILON)``, times the weight,
    divided by the element count for mean. torch's backward of this loss is not the derivative
    of its forward (it divides by ``max(x (1 - x), 1e-12)`` where the forward clamps the logs at
    -100, so a saturated wrong prediction still gets a gradient): the backward starts here.
    """
    one = float_constant(emitter, 1.0, input)
    denominator = emitter.op(
        "Max",
        [emitter.op("Mul", [emitter.op("Sub", [one, input]), input]), float_constant(emitter, _BCE_EPSILON, input)],
    )
    grad = emitter.op("Div", [emitter.op("Sub", [input, target]), denominator])
    if spec.weight is not None:
        grad = emitter.op("Mul", [grad, float_constant(emitter, spec.weight, input)])
    if spec.reduction == "mean":
        count = emitter.op("CastLike", [emitter.op("Size", [input]), input])
        grad = emitter.op("Div", [grad, count])
    return grad


def _check_probabilities(spec: Loss, prediction: ValueType | None, target: np.ndarray, target_name: str) -> None:
    """Every target in [0, 1], as torch checks."""
    del prediction
    bad = ~((target >= 0) & (target <= 1))
    if bad.any():
        raise ValueError(
            f"loss target {target_name!r}: {spec.kind} takes targets in [0, 1], got "
            f"{float(target[bad].reshape(-1)[0])} (torch: 'all elements of target should be between 0 and 1')"
        )


@register_loss(check_values=_check_probabilities, gradient=_binary_cross_entropy_gradient)
def binary_cross_entropy(
    emitter: GraphEmitter,
    input: str,
    target: str,
    weight: Sequence[float] | np.ndarray | None = None,
    reduction: str = "mean",
) -> str:
    """torch.nn.functional.binary_cross_entropy: ``input`` holds probabilities (a Sigmoid's output).

    ``l = (y - 1) * max(log1p(-x), -100) - y * max(log(x), -100)``, times ``weight`` (broadcast to
    the input), then mean (default), sum or none; torch's formula and its clamp, so saturated
    probabilities (0 or 1) give a finite loss. Its gradient is torch's backward, not this graph's
    derivative: build the backward from ``gradient_seed``. Inputs outside [0, 1] give NaN where
    torch raises.

    Args:
        emitter: Receives the nodes.
        input: Probabilities of the positive class, any shape.
        target: Target probabilities, the input's type and shape.
        weight: Weights broadcast to the input (default: ones).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    floor = float_constant(emitter, -100.0, input)
    log_x = emitter.op("Max", [emitter.op("Log", [input]), floor])
    log_1mx = emitter.op("Max", [_log1p_of_negative(emitter, input), floor])
    target_minus_one = emitter.op("Sub", [target, float_constant(emitter, 1.0, input)])
    loss = emitter.op("Sub", [emitter.op("Mul", [target_minus_one, log_1mx]), emitter.op("Mul", [target, log_x])])
    if weight is not None:
        loss = emitter.op("Mul", [loss, float_constant(emitter, weight, input)])
    return reduce(emitter, loss, reduction)


@register_loss()
def binary_cross_entropy_with_logits(
    emitter: GraphEmitter,
    input: str,
    target: str,
    weight: Sequence[float] | np.ndarray | None = None,
    reduction: str = "mean",
    pos_weight: Sequence[float] | np.ndarray | None = None,
) -> str:
    """torch.nn.functional.binary_cross_entropy_with_logits, in torch's numerically stable form.

    ``l = w * ((1 - y) * x - (1 + (pw - 1) * y) * log_sigmoid(x))`` with a stable
    ``log_sigmoid`` (see ``_log_sigmoid``); equal to ``-w * (pw * y * log(sigmoid(x)) + (1 - y) *
    log(1 - sigmoid(x)))`` without overflow for large ``|x|``. Then mean (default), sum or none.

    Args:
        emitter: Receives the nodes.
        input: Logits, any shape.
        target: Probabilities of the positive class, the input's type and shape.
        weight: Weights broadcast to the input (default: ones).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        pos_weight: Weights of the positive examples, broadcast to the input (default: ones).
    """
    log_sigmoid = _log_sigmoid(emitter, input)
    if pos_weight is not None:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(emitter.elem_type(input) or onnx.TensorProto.FLOAT)
        # torch: (pos_weight - 1).mul(target).add_(1), in the tensor's type
        pos_minus_one = np.asarray(pos_weight).astype(dtype) - dtype.type(1)
        log_weight = emitter.op(
            "Add",
            [
                emitter.op("Mul", [float_constant(emitter, pos_minus_one, input), target]),
                float_constant(emitter, 1.0, input),
            ],
        )
        log_sigmoid = emitter.op("Mul", [log_sigmoid, log_weight])
    one_minus_target = emitter.op("Sub", [float_constant(emitter, 1.0, input), target])
    loss = emitter.op("Sub", [emitter.op("Mul", [one_minus_target, input]), log_sigmoid])
    if weight is not None:
        loss = emitter.op("Mul", [loss, float_constant(emitter, weight, input)])
    return reduce(emitter, loss, reduction)


def _softplus(emitter: GraphEmitter, t: str) -> str:
    """``log(1 + exp(t))`` to a few roundings for every ``t``, smooth at 0 (gradient ``sigmoid(t)``).

    ``t + log1p(exp(-t))`` where ``t >= 0``, ``log1p(exp(t))`` elsewhere, each branch reading ``t``
    through a Where that zeroes it on the other side (see ``_log_sigmoid``). ONNX has no Log1p:
    with ``w = 1 + z`` rounded, ``log1p(z) = log(w) * z / (w - 1)`` (the rounding of ``w`` cancels),
    and ``z`` where ``w`` is 1, the division then by 1 so that neither branch's gradient is NaN.
    """
    zero = float_constant(emitter, 0.0, t)
    one = float_constant(emitter, 1.0, t)
    non_negative = emitter.op("Not", [emitter.op("Less", [t, zero])])
    t_pos = emitter.op("Where", [non_negative, t, zero])
    t_neg = emitter.op("Where", [non_negative, zero, t])

    def log1p_exp(exponent: str) -> str:
        z = emitter.op("Exp", [exponent])
        w = emitter.op("Add", [one, z])
        exact = emitter.op("Equal", [w, one])
        denominator = emitter.op("Where", [exact, one, emitter.op("Sub", [w, one])])
        corrected = emitter.op("Div", [emitter.op("Mul", [emitter.op("Log", [w]), z]), denominator])
        return emitter.op("Where", [exact, z, corrected])

    positive = emitter.op("Add", [t_pos, log1p_exp(emitter.op("Neg", [t_pos]))])
    return emitter.op("Where", [non_negative, positive, log1p_exp(t_neg)])


@register_loss(broadcast="into")
def soft_margin_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean") -> str:
    """torch.nn.functional.soft_margin_loss: ``l = log(1 + exp(-y * x))``, then mean (default), sum or none.

    The two-class logistic loss on labels ``y`` of 1 or -1 (other float targets are taken as they
    are, as torch takes them); the gradient is ``-y * sigmoid(-y * x)``. torch computes
    ``log1p(exp(-x * y))``, which overflows to inf where ``-x * y`` exceeds exp's range (about 88
    in float32) and gives a NaN gradient there; this form (``_softplus``) stays finite.
    """
    margin = emitter.op("Mul", [emitter.op("Neg", [input]), target])  # torch: (-input) * target
    return reduce(emitter, _softplus(emitter, margin), reduction)
