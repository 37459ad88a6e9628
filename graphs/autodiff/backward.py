"""Reverse-mode differentiation of an ONNX graph with respect to chosen values.

``build_backward`` walks the forward graph once forwards (which values depend on a parameter
through differentiable inputs) and once backwards (which of those reach the loss), checks that
every node on a parameter -> loss path has a rule, then visits those nodes in reverse order,
handing each rule the summed gradients of its outputs. Gradient nodes go to a ``GraphEmitter``;
the forward graph is left as it is except where a rule asks a node to name an output it
computes anyway (``GradientContext.require_output``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import onnx

from ortlstm.graphs.autodiff.registry import (
    GradientContext,
    gradient_rule,
    input_is_differentiable,
    missing_rule_hint,
)
from ortlstm.graphs.emit.emitter import FLOAT_TYPES, GraphEmitter
from ortlstm.graphs.emit.graph_utils import subgraph_reads
from ortlstm.graphs.parameters import freeze_hint, label


@dataclasses.dataclass(frozen=True)
class Backward:
    """The result of ``build_backward``.

    Attributes:
        gradients: Parameter name -> name of its gradient value.
        unreachable: Requested parameters that do not reach the loss (no gradient).
    """

    gradients: dict[str, str]
    unreachable: tuple[str, ...]


def _node_label(node: onnx.NodeProto) -> str:
    domain = node.domain if node.domain not in ("", "ai.onnx") else "ai.onnx"
    return f"{domain}::{node.op_type} node {_node_name(node)}"


def _node_name(node: onnx.NodeProto) -> str:
    """The node's name quoted, or what it computes when it has none (exporters leave some unnamed)."""
    if node.name or not node.output:
        return repr(node.name)
    return f"(unnamed) computing {node.output[0]!r}"


def _carries_gradient(name: str, emitter: GraphEmitter) -> bool:
    elem_type = emitter.elem_type(name)
    return bool(name) and (not elem_type or elem_type in FLOAT_TYPES)


def build_backward(
    graph: onnx.GraphProto,
    loss: str | Mapping[str, str | None],
    wrt: Sequence[str],
    emitter: GraphEmitter,
    *,
    allow_unreachable: bool = False,
    hints: Mapping[str, str] | None = None,
    torch_names: Mapping[str, tuple[str, ...]] | None = None,
) -> Backward:
    """Emits the gradient of ``loss`` with respect to each value in ``wrt``.

    Args:
        graph: The forward graph (main graph of a model; its nodes in topological order).
        loss: The value to differentiate (its gradient seeded with ones of its shape), or
            several outputs, each mapped to the name of its given gradient (None: ones), which
            makes the result a vector-Jacobian product.
        wrt: Values to differentiate with respect to (initializers or graph inputs).
        emitter: Receives the gradient nodes; its ``types`` should hold the forward graph's
            inferred types (``infer_value_types``), which rules use to skip run-time shape work.
        allow_unreachable: Leave parameters that do not reach the loss out of the result
            instead of refusing them.
        hints: Advice for a node without rule, by the node's first output (what decides an ``If``
            and what to pass instead); it replaces the op type's generic advice in the refusal.
        torch_names: For a torch export's metadata, each parameter -> the torch parameters it is
            or was folded from (``PreparedModel.sources``): a refusal names ``val_29`` as
            ``encoder.weight (onnx: val_29)`` and suggests freezing it by its torch name.

    Returns:
        The gradient value of each reachable parameter, and the unreachable ones.

    Raises:
        ValueError: A parameter does not reach the loss (unless allowed), the loss is not
            computed by the graph, or nodes on a parameter -> loss path have no gradient rule
            (one message lists every such node, by op type, with the parameters behind each).
    """
    nodes = list(graph.node)
    seeds = {loss: None} if isinstance(loss, str) else dict(loss)
    _check_values(graph, seeds, wrt)
    loss_label = ", ".join(map(repr, seeds))
    depends = _dependencies(nodes, wrt, emitter)
    active, reaches = _active_nodes(nodes, seeds, depends, emitter)
    unreachable = tuple(name for name in wrt if name not in reaches)
    if unreachable and not allow_unreachable:
        raise ValueError(
            f"parameters {[label(name, torch_names or {}) for name in unreachable]} do not reach the "
            f"loss {loss_label} through differentiable inputs: "
            "nothing to train. Leave them out of requires_grad (or freeze them)."
        )
    missing = [node for node in active if gradient_rule(node.domain, node.op_type) is None]
    if missing:
        raise ValueError(_no_rule_message(missing[::-1], depends, loss_label, hints, torch_names or {}))
    grads: dict[str, list[str]] = {
        name: [seed or _ones_like(name, emitter)] for name, seed in seeds.items() if name in reaches
    }
    for node in active:  # already in reverse topological order
        _apply_rule(node, grads, reaches, depends, emitter)
    gradients = {name: emitter.sum(grads[name]) for name in wrt if name in reaches}
    return Backward(gradients, unreachable)


def _check_values(graph: onnx.GraphProto, seeds: Mapping[str, str | None], wrt: Sequence[str]) -> None:
    """Refuses a loss or parameter that is not a value of the graph."""
    produced = {name for node in graph.node for name in node.output if name}
    known = produced | {value.name for value in graph.input} | {init.name for init in graph.initializer}
    for name in seeds:
        if name not in known:
            raise ValueError(f"the loss {name!r} is not a value of the graph")
    missing = [name for name in wrt if name not in known]
    if missing:
        raise ValueError(
            f"parameters {missing} are not values of the graph (not initializers, inputs or outputs of nodes)"
        )


def _dependencies(
    nodes: Sequence[onnx.NodeProto], wrt: Sequence[str], emitter: GraphEmitter
) -> dict[str, frozenset[str]]:
    """Forward: which parameters each value depends on, through differentiable inputs only.

    A value a node's subgraph reads from the outer scope (If/Loop/Scan bodies) counts as an input.
    """
    depends: dict[str, frozenset[str]] = {name: frozenset([name]) for name in wrt}
    for node in nodes:
        sources: set[str] = set()
        for index, name in enumerate(node.input):
            if name in depends and input_is_differentiable(node, index, emitter):
                sources |= depends[name]
        for name in subgraph_reads(node):
            sources |= depends.get(name, frozenset())
        if sources:
            for name in node.output:
                if _carries_gradient(name, emitter):
                    depends[name] = depends.get(name, frozenset()) | frozenset(sources)
    return depends


def _active_nodes(
    nodes: Sequence[onnx.NodeProto],
    seeds: Mapping[str, str | None],
    depends: Mapping[str, frozenset[str]],
    emitter: GraphEmitter,
) -> tuple[list[onnx.NodeProto], set[str]]:
    """Backward: the nodes between the parameters and the loss (reverse order), and the values that reach it."""
    reaches = {name for name in seeds if name in depends}
    active: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if not any(name in reaches for name in node.output):
            continue
        on_path = [
            index
            for index, name in enumerate(node.input)
            if name in depends and input_is_differentiable(node, index, emitter)
        ]
        implicit = [name for name in subgraph_reads(node) if name in depends]
        if on_path or implicit:
            active.append(node)
            reaches.update(node.input[index] for index in on_path)
            reaches.update(implicit)
    return active, reaches


def _no_rule_message(
    nodes: Sequence[onnx.NodeProto],
    depends: Mapping[str, frozenset[str]],
    loss_label: str,
    hints: Mapping[str, str] | None,
    torch_names: Mapping[str, tuple[str, ...]],
) -> str:
    """The refusal for the active nodes without gradient rule (in graph order): all of them at once.

    Nodes are grouped by op type (and by their own advice, which an ``If`` has per node), each
    group with its node names and the parameters behind it: freezing the parameters of, or
    registering a rule for, only the first op would meet the next one.
    """
    groups: dict[tuple[str, str, str], tuple[list[str], set[str]]] = {}
    for node in nodes:
        reads = [*node.input, *subgraph_reads(node)]
        hint = (hints or {}).get(node.output[0] if node.output else "") or missing_rule_hint(node.domain, node.op_type)
        names, parameters = groups.setdefault((node.domain, node.op_type, hint or ""), ([], set()))
        names.append(_node_name(node))
        parameters.update(*(depends[name] for name in reads if name in depends))
    needing = sorted(set().union(*(parameters for _, parameters in groups.values())))
    unhinted = [(domain, op_type) for domain, op_type, hint in groups if not hint]
    behind_unhinted = set().union(*(parameters for (*_, hint), (_, parameters) in groups.items() if not hint))
    advice = _generic_advice(unhinted, sorted(behind_unhinted), torch_names) if unhinted else ""
    labels = [label(name, torch_names) for name in needing]
    if len(nodes) == 1:
        ((*_, hint),) = groups
        return (
            f"no gradient rule for {_node_label(nodes[0])}, which lies between the loss {loss_label} and "
            f"{len(needing)} parameter(s) {labels}. {hint or advice}"
        )
    op_types = len({(domain, op_type) for domain, op_type, _ in groups})
    lines = [
        f"no gradient rule for {op_types} op(s) in {len(nodes)} nodes between the loss {loss_label} and "
        f"{len(needing)} parameter(s) {labels}:"
    ]
    advised: dict[str, str] = {}  # each advice in full once (told apart without the node's name)
    for (domain, op_type, hint), (names, parameters) in groups.items():
        op = f"{domain or 'ai.onnx'}::{op_type}"
        which = f"node {names[0]}" if len(names) == 1 else f"nodes {', '.join(names)}"
        behind = [label(name, torch_names) for name in sorted(parameters)]
        entry = f"  {op} {which}, on the path of " + (
            f"all {len(needing)} parameters" if len(behind) == len(needing) > 1 else f"parameter(s) {behind}"
        )
        if hint:
            key = hint.replace(names[0], "") if len(names) == 1 else hint
            entry += f": as for {advised[key]}" if key in advised else f": {hint}"
            advised.setdefault(key, f"{op} {which}")
        lines.append(entry)
    if advice and len(unhinted) < len(groups):
        ops = "op" if len(unhinted) == 1 else "ops"
        advice = f"For the {ops} without advice above: {advice[0].lower()}{advice[1:]}"
    return "\n".join([*lines, advice] if advice else lines)


def _generic_advice(
    ops: Sequence[tuple[str, str]], parameters: Sequence[str], torch_names: Mapping[str, tuple[str, ...]]
) -> str:
    """Freeze ``parameters`` (by their torch names where known) or register a rule for each op of ``ops``."""
    calls = " and ".join(f"register_gradient_rule({domain!r}, {op_type!r}, rule)" for domain, op_type in ops)
    return (
        f"Freeze them ({freeze_hint(parameters, torch_names)} on the Trainer, --frozen on the command line), or "
        f"register {'a rule' if len(ops) == 1 else 'a rule for each op'} with ortlstm.graphs.{calls}."
    )


def _apply_rule(
    node: onnx.NodeProto,
    grads: dict[str, list[str]],
    reaches: set[str],
    depends: Mapping[str, frozenset[str]],
    emitter: GraphEmitter,
) -> None:
    """Emits one node's gradient rule and adds the gradients of its inputs to ``grads``."""
    grad_outputs = [emitter.sum(grads[name]) if name in grads else None for name in node.output]
    if all(grad is None for grad in grad_outputs):
        return
    needs = [
        name in reaches and name in depends and input_is_differentiable(node, index, emitter)
        for index, name in enumerate(node.input)
    ]
    context = GradientContext(node, emitter, needs)
    entry = gradient_rule(node.domain, node.op_type)
    assert entry is not None
    grad_inputs = list(entry.rule(context, grad_outputs))
    for index, needed in enumerate(needs):
        if not needed:
            continue
        grad = grad_inputs[index] if index < len(grad_inputs) else None
        if grad is None:
            raise ValueError(
                f"the gradient rule of {_node_label(node)} gives no gradient for input {index} "
                f"({node.input[index]!r}), which a parameter's gradient needs"
            )
        grads.setdefault(node.input[index], []).append(grad)


def _ones_like(value: str, emitter: GraphEmitter) -> str:
    """d(loss)/d(loss): ones of the loss's shape (a constant 1 for a scalar loss)."""
    one = emitter.scalar_like(1.0, value)
    if emitter.static_shape(value) == ():
        return one
    return emitter.op("Expand", [one, emitter.shape(value)], name="loss_grad_seed")
