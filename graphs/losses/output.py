"""A model output used as the loss as it is: no target, no reduction (it must hold one element)."""

from __future__ import annotations

from ortlstm.graphs.emit.emitter import GraphEmitter, ValueType
from ortlstm.graphs.losses.base import Loss, register_loss, shape_text


def _check_single_element(
    spec: Loss, prediction: ValueType | None, target: ValueType | None, prediction_name: str, target_name: str
) -> None:
    if target is not None:
        raise ValueError(f"loss {spec.kind!r} reads no target, but target {target_name!r} was given")
    shape = prediction.shape if prediction is not None else None
    if shape is not None and any(isinstance(dim, int) and dim != 1 for dim in shape):
        raise ValueError(
            f"the model output {prediction_name!r} used as the loss must hold one element, "
            f"its shape is {shape_text(shape)}"
        )


@register_loss(needs_target=False, check_target=_check_single_element, mean="batch")
def output(emitter: GraphEmitter, input: str, target: str | None) -> str:
    """The model output ``input`` is the loss (``Loss.output()``); nothing is emitted."""
    del emitter, target
    return input
