"""Which parameters the training models train: those the caller names, or the defaults that reach the loss."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from ortlstm.graphs.autodiff import GraphEmitter, build_backward
from ortlstm.graphs.autodiff.emitter import FLOAT_TYPES
from ortlstm.graphs.graph_utils import used_names
from ortlstm.graphs.parameters import resolve_frozen
from ortlstm.graphs.prepare import PreparedModel


def default_requires_grad(prepared: PreparedModel) -> list[str]:
    """The candidates, in the order of the initializers."""
    order = [init.name for init in prepared.model.graph.initializer]
    return [name for name in order if name in prepared.candidates]


def _nothing_reaches_the_loss(prepared: PreparedModel, candidates: Sequence[str]) -> str:
    """The refusal when no parameter reaches the loss: names the control flow in the way, if any."""
    message = f"no float initializer of the model reaches the loss (candidates: {list(candidates)}); nothing to train"
    if not prepared.remaining_ifs:
        return message
    inside = "" if candidates else " (its weights are Constant nodes or initializers inside the branches)"
    advice = " ".join(prepared.control_flow.values())
    return f"{message}. The model computes its outputs through control flow{inside}: {advice}"


def _check_requires_grad(prepared: PreparedModel, requires_grad: Sequence[str]) -> None:
    initializers = {init.name: init for init in prepared.model.graph.initializer}
    not_found = [name for name in requires_grad if name not in initializers]
    if not_found:
        raise ValueError(
            f"requires_grad: {not_found} are not initializers (or Constant tensors) of the model, so they cannot "
            f"be trained. Its float initializers are: {sorted(prepared.candidates)}"
        )
    not_float = [name for name in requires_grad if initializers[name].data_type not in FLOAT_TYPES]
    if not_float:
        raise ValueError(f"requires_grad: {not_float} are not float tensors and cannot be trained")


def choose_params(
    prepared: PreparedModel,
    forward_and_loss: onnx.GraphProto,
    seed: str | Mapping[str, str | None],
    emitter: GraphEmitter,
    requires_grad: Sequence[str] | None,
    frozen: Sequence[str],
) -> list[str]:
    """The parameters to train: those named, or the default candidates that reach the loss; never frozen ones.

    Args:
        prepared: The prepared model.
        forward_and_loss: Its graph with the loss appended.
        seed: Where the backward starts (the loss, or the gradient seed of the prediction).
        emitter: The emitter of the loss (its opset and types; a probe emitter builds the trial backward).
        requires_grad: The parameters the caller names, or None for the defaults.
        frozen: Names, globs or module prefixes not to train (``parameters.resolve_frozen``).

    Raises:
        ValueError: A named parameter is not a float initializer, none is left, or none reaches the loss.
    """
    initializers = prepared.model.graph.initializer
    frozen_names = resolve_frozen(
        frozen,
        [*dict.fromkeys([*default_requires_grad(prepared), *(requires_grad or ())])],
        prepared.sources,
        known=[*(init.name for init in initializers), *prepared.dropped],
    )
    if requires_grad is not None:
        _check_requires_grad(prepared, requires_grad)
        params = [name for name in dict.fromkeys(requires_grad) if name not in frozen_names]
        if not params:
            raise ValueError("requires_grad is empty (or all frozen): name at least one parameter to train")
        return params
    candidates = [name for name in default_requires_grad(prepared) if name not in frozen_names]
    probe = GraphEmitter(emitter.opset, used_names(forward_and_loss), dict(emitter.types))
    probe.record_constants(initializers)
    trial = onnx.GraphProto()
    trial.CopyFrom(forward_and_loss)
    reachable = build_backward(
        trial,
        seed,
        candidates,
        probe,
        allow_unreachable=True,
        hints=prepared.control_flow,
        torch_names=prepared.sources,
    )
    params = [name for name in candidates if name in reachable.gradients]
    if not params:
        raise ValueError(_nothing_reaches_the_loss(prepared, candidates))
    return params
