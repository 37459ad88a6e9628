"""Which parameters the training models train: those the caller names, or the defaults that reach the loss.

The caller's names go through ``parameters.ParameterNames`` (ONNX names, torch names, globs, module prefixes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import onnx

from ortlstm.graphs.autodiff import GraphEmitter, build_backward
from ortlstm.graphs.emit.emitter import FLOAT_TYPES
from ortlstm.graphs.emit.graph_utils import used_names
from ortlstm.graphs.parameters import ParameterNames
from ortlstm.graphs.prepare import PreparedModel
from ortlstm.graphs.prepare.dequantize import INT8_HINT, int8_nodes


def default_requires_grad(prepared: PreparedModel) -> list[str]:
    """The candidates, in the order of the initializers."""
    order = [init.name for init in prepared.model.graph.initializer]
    return [name for name in order if name in prepared.candidates]


def _nothing_reaches_the_loss(prepared: PreparedModel, candidates: Sequence[str]) -> str:
    """The refusal when no parameter reaches the loss: names the control flow in the way, if any."""
    message = f"no float initializer of the model reaches the loss (candidates: {list(candidates)}); nothing to train"
    int8 = int8_nodes(prepared.model.graph)
    if int8:  # integer values carry no gradient: static (QDQ) quantization cuts every path
        message = f"{message}. The model computes in int8 ({', '.join(int8[:3])}{', ...' if len(int8) > 3 else ''}): "
        message += INT8_HINT
    if not prepared.remaining_ifs:
        return message
    inside = "" if candidates else " (its weights are Constant nodes or initializers inside the branches)"
    advice = " ".join(prepared.control_flow.values())
    return f"{message}. The model computes its outputs through control flow{inside}: {advice}"


def _check_requires_grad(prepared: PreparedModel, requires_grad: Sequence[str]) -> None:
    """Refuses initializers named exactly that cannot be trained (not float), before the patterns are resolved."""
    initializers = {init.name: init for init in prepared.model.graph.initializer}
    not_float = [
        name
        for name in requires_grad
        if name in initializers and name not in prepared.candidates and initializers[name].data_type not in FLOAT_TYPES
    ]
    if not_float:
        raise ValueError(f"requires_grad: {not_float} are not float tensors and cannot be trained")


def parameter_names(prepared: PreparedModel) -> ParameterNames:
    """The names ``requires_grad``, ``frozen`` and ``param_groups`` may use for ``prepared``'s candidates."""
    return ParameterNames.of(
        [init.name for init in prepared.model.graph.initializer if init.name in prepared.candidates],
        prepared.sources,
        dropped=prepared.dropped,
    )


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
        requires_grad: The parameters the caller names (as ``frozen``), or None for the defaults.
        frozen: Names, torch names, globs or module prefixes not to train (``parameters.ParameterNames``).

    Raises:
        ValueError: A named parameter is not a float initializer, none is left, or none reaches the loss.
    """
    initializers = prepared.model.graph.initializer
    names = parameter_names(prepared)
    frozen_names = set(
        dataclasses.replace(names, known=frozenset([*(init.name for init in initializers), *prepared.dropped])).select(
            "frozen", frozen, verb="freeze"
        )
    )
    if requires_grad is not None:
        _check_requires_grad(prepared, requires_grad)
        named = names.select("requires_grad", requires_grad, verb="train")
        params = [name for name in named if name not in frozen_names]
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
