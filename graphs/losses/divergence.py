"""Divergences: torch.nn.functional.kl_div, on log-probabilities (a LogSoftmax's output)."""

from __future__ import annotations

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.losses.base import KL_DIV_REDUCTIONS, float_constant, reduce, register_loss


@register_loss(reductions=KL_DIV_REDUCTIONS, broadcast="silent")
def kl_div(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean", log_target: bool = False) -> str:
    """torch.nn.functional.kl_div: ``input`` holds log-probabilities (a LogSoftmax's output).

    ``l = xlogy(y, y) - y * x`` (0 where ``y = 0``), or ``exp(y) * (y - x)`` with ``log_target``;
    then mean (default; over every element, as torch, which warns that it is not the KL
    divergence), sum, none, or ``"batchmean"``: the sum divided by the input's first dim (the
    divergence per sample). The gradient is ``-y`` (``-exp(y)``), divided likewise.
    """
    if log_target:
        loss = emitter.op("Mul", [emitter.op("Exp", [target]), emitter.op("Sub", [target, input])])
    else:
        zero = float_constant(emitter, 0.0, input)
        # xlogy: y * log(y), 0 where y is 0 (the Where drops the 0 * -inf); NaN stays NaN.
        entropy = emitter.op(
            "Where",
            [emitter.op("Equal", [target, zero]), zero, emitter.op("Mul", [target, emitter.op("Log", [target])])],
        )
        loss = emitter.op("Sub", [entropy, emitter.op("Mul", [target, input])])
    if reduction != "batchmean":
        return reduce(emitter, loss, reduction)
    total = reduce(emitter, loss, "sum")
    if emitter.rank(input) == 0:
        return total
    batch = emitter.op("CastLike", [emitter.op("Gather", [emitter.shape(input), emitter.ints(0)], axis=0), total])
    return emitter.op("Div", [total, batch])
