"""Regression losses: torch.nn.functional.mse_loss, l1_loss, smooth_l1_loss and huber_loss.

Element-wise on a float prediction and a target of its type and shape (or one that broadcasts to
it, with torch's warning), then torch's reduction (mean by default, sum or none), in torch's order
of operations.
"""

from __future__ import annotations

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.losses.base import Loss, float_constant, reduce, register_loss


@register_loss(broadcast="warn")
def mse_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean") -> str:
    """torch.nn.functional.mse_loss: ``l = (x - y)^2``, then mean (default), sum or none."""
    diff = emitter.op("Sub", [input, target])
    return reduce(emitter, emitter.op("Mul", [diff, diff]), reduction)


@register_loss(broadcast="warn")
def l1_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean") -> str:
    """torch.nn.functional.l1_loss: ``l = |x - y|``, then mean (default), sum or none."""
    return reduce(emitter, emitter.op("Abs", [emitter.op("Sub", [input, target])]), reduction)


def _validate_beta(spec: Loss) -> None:
    if not spec.beta >= 0.0:  # torch's message; NaN is refused too
        raise ValueError(f"smooth_l1_loss does not support negative values for beta, got {spec.beta}")


@register_loss(validate=_validate_beta, broadcast="warn")
def smooth_l1_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean", beta: float = 1.0) -> str:
    """torch.nn.functional.smooth_l1_loss, then mean (default), sum or none.

    With ``z = |x - y|``: ``l = 0.5 * z * z / beta`` where ``z < beta``, else ``z - 0.5 * beta``
    (torch's order of operations); ``beta = 0`` is ``l1_loss``, as in torch. The gradient is
    ``(x - y) / beta`` inside, ``sign(x - y)`` outside (0 at ``x = y``).
    """
    if beta == 0.0:
        return l1_loss(emitter, input, target, reduction)
    distance = emitter.op("Abs", [emitter.op("Sub", [input, target])])
    beta_value = float_constant(emitter, beta, input)
    half = float_constant(emitter, 0.5, input)
    quadratic = emitter.op("Div", [emitter.op("Mul", [emitter.op("Mul", [half, distance]), distance]), beta_value])
    linear = emitter.op("Sub", [distance, float_constant(emitter, 0.5 * beta, input)])
    inside = emitter.op("Less", [distance, beta_value])
    return reduce(emitter, emitter.op("Where", [inside, quadratic, linear]), reduction)


def _validate_delta(spec: Loss) -> None:
    if not spec.delta > 0.0:
        raise ValueError(f"huber_loss does not support non-positive values for delta, got {spec.delta}")


@register_loss(validate=_validate_delta, broadcast="warn")
def huber_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean", delta: float = 1.0) -> str:
    """torch.nn.functional.huber_loss, then mean (default), sum or none.

    With ``z = |x - y|``: ``l = 0.5 * z * z`` where ``z < delta``, else
    ``delta * (z - 0.5 * delta)`` (torch's order of operations); ``smooth_l1_loss`` times ``beta``
    for ``beta = delta``. The gradient is ``x - y`` inside, ``delta * sign(x - y)`` outside.
    """
    distance = emitter.op("Abs", [emitter.op("Sub", [input, target])])
    delta_value = float_constant(emitter, delta, input)
    quadratic = emitter.op("Mul", [emitter.op("Mul", [float_constant(emitter, 0.5, input), distance]), distance])
    linear = emitter.op(
        "Mul", [delta_value, emitter.op("Sub", [distance, float_constant(emitter, 0.5 * delta, input)])]
    )
    inside = emitter.op("Less", [distance, delta_value])
    return reduce(emitter, emitter.op("Where", [inside, quadratic, linear]), reduction)
