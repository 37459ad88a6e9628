"""The ``all_finite`` output of the models that update: the loss and every gradient are finite.

A trainer reads it to refuse an update computed from a non-finite loss or gradient
(``build_training_models(nonfinite_check=True)``, ``TrainStepSignature.all_finite``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import onnx

from ortlstm.graphs import optimizers as optimizers_module
from ortlstm.graphs.autodiff import GraphEmitter


@dataclasses.dataclass(frozen=True)
class FiniteCheck:
    """The nodes that compute ``TrainStepSignature.all_finite`` in each model that updates.

    Attributes:
        name: The bool output.
        train_step_nodes: The train step's: the gradients and the loss.
        apply_nodes: The apply model's: the gradients (the micro-batch losses are the trainer's).
    """

    name: str
    train_step_nodes: list[onnx.NodeProto]
    apply_nodes: list[onnx.NodeProto]


def add_finite_check(
    emitter: GraphEmitter,
    loss: tuple[str, int, bool],
    grads: Mapping[str, str],
    total_norm: str | None,
    clip: optimizers_module.ClipGradNorm | None,
) -> FiniteCheck:
    """Emits the bool "the loss and every gradient are finite" of one update, in few small nodes.

    The gradients are finite exactly when the sum of their squares is (a NaN or inf anywhere
    makes it NaN or inf; so does a sum past the type's range, a total norm that torch's
    ``clip_grad_norm_`` calls non-finite too): one read of each gradient, never of a parameter or
    moment. With clipping the total norm already tells it, except the max norm: onnxruntime's
    ReduceMax skips a NaN that is not the first element. The loss enters that sum as ``loss * 0``
    (0, or NaN for an inf or NaN loss), so the train step's flag is ``sum < inf``, one node more.

    Args:
        emitter: Receives the nodes (taken out again into the two lists returned).
        loss: The loss value, its element type, and whether it is a scalar (else it is summed).
        grads: Parameter -> its gradient value (the apply model's gradient inputs).
        total_norm: The clipped total norm, when clipping.
        clip: The clipping settings, when clipping.
    """
    first = len(emitter.nodes)
    terms: dict[int, list[str]] = {}
    if total_norm is not None and clip is not None and not math.isinf(clip.norm_type):
        terms[emitter.elem_type(total_norm) or emitter.elem_type(next(iter(grads.values())))] = [total_norm]
    else:
        for grad in grads.values():
            square_sum = emitter.reduce("ReduceSumSquare", grad, None, keepdims=False)
            terms.setdefault(emitter.elem_type(grad), []).append(square_sum)
    name = emitter.fresh("all_finite")
    apply_start = len(emitter.nodes)
    _all_below_inf(emitter, terms, name)
    apply_end = len(emitter.nodes)
    loss_value, loss_elem, loss_scalar = loss
    zeros = emitter.op("Mul", [loss_value, emitter.constant(0.0, loss_elem, name="zero")])
    if not loss_scalar:
        zeros = emitter.reduce_sum(zeros, None, keepdims=False)
    with_loss = {elem_type: list(values) for elem_type, values in terms.items()}
    with_loss.setdefault(loss_elem, []).append(zeros)
    _all_below_inf(emitter, with_loss, name)
    nodes = emitter.nodes
    return FiniteCheck(
        name,
        train_step_nodes=[*nodes[first:apply_start], *nodes[apply_end:]],
        apply_nodes=nodes[first:apply_end],
    )


def _all_below_inf(emitter: GraphEmitter, terms: Mapping[int, Sequence[str]], output: str) -> None:
    """``output = sum(terms of each type) < inf``, for every type (non-negative or NaN terms)."""
    flags = []
    for elem_type, values in terms.items():
        below = emitter.constant(math.inf, elem_type, name="inf")
        flags.append(emitter.op("Less", [emitter.sum(list(values)), below], outputs=[output] if len(terms) == 1 else 1))
    while len(flags) > 1:
        last = len(flags) == 2
        flags = [emitter.op("And", flags[:2], outputs=[output] if last else 1), *flags[2:]]
