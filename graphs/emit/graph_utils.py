"""The graph plumbing every builder shares: subgraphs, what they read, names, pruning to outputs.

One module of proto-level helpers, not onnx_ir. onnx_ir (1.1, installed with onnxscript) has
use-def chains, ``RecursiveGraphIterator``, a ``NameAuthority`` and ``RemoveUnusedNodesPass``,
but the rest of ``graphs/`` builds ``onnx.ModelProto``s, and none of those serves as is:

- a round trip through the IR (``ir.serde.deserialize_model`` then ``serialize_model``) is not
  byte-stable, so the training models would change where they must stay bit for bit: measured on
  PP-OCRv2 (onnx_ir 1.1), the prepared model comes back with 386 ``value_info`` entries it did not
  have and the CTC train step with 1222 of its 1715 nodes rewritten; and it costs 18 ms (prepared
  model) to 66 ms (train step) per model, against 0.5 s for the whole ``build_training_models``;
- ``RemoveUnusedNodesPass`` is more than pruning: it also drops unused optional outputs
  (renames them ``""``) and trailing empty inputs, prunes inside subgraphs, never drops a graph
  input, and cannot prune to chosen outputs (what ``export_inference_model`` does);
- ``NameAuthority`` hands out ``val_<n>`` names, where these builders derive each new name from
  the value it belongs to (``<param>.new``, ``<name>_inlined``: names users see in signatures);
- onnxscript's ``fold_constants`` folds any node whose inputs are initializers under a size
  limit, and drops the initializers it no longer needs: a weight sliced from a parameter would
  be folded and the parameter lost, where it must stay differentiable (``prepare`` folds only
  nodes that read no candidate parameter, and folds shapes that only it knows are static).

So the plumbing is written once here, on protos, and every builder uses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import onnx


def named_subgraphs(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """The graphs a node holds in its attributes, each with its attribute's name (``body[k]`` in a list)."""
    graphs: list[tuple[str, onnx.GraphProto]] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graphs.append((attribute.name, attribute.g))
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            graphs.extend((f"{attribute.name}[{k}]", graph) for k, graph in enumerate(attribute.graphs))
    return graphs


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds in its attributes (``If`` branches, ``Loop``/``Scan`` bodies)."""
    return [graph for _, graph in named_subgraphs(node)]


def walk_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph nested in its nodes' attributes, any depth, depth first."""
    yield graph
    for node in graph.node:
        for subgraph in subgraphs(node):
            yield from walk_graphs(subgraph)


def outer_reads(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph reads from the scopes around it, in order of first read.

    A name counts when a node of the subgraph (or of a subgraph nested in it) reads it, or the
    subgraph outputs it (an ``If`` branch may return an outer value as is), and the subgraph does
    not define it (as an input, an initializer or a node's output) before.
    """
    defined = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    reads: list[str] = []
    for node in graph.node:
        reads.extend(name for name in [*node.input, *subgraph_reads(node)] if name and name not in defined)
        defined.update(node.output)
    reads.extend(value.name for value in graph.output if value.name and value.name not in defined)
    return list(dict.fromkeys(reads))


def subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """Names the node's subgraphs read from the enclosing graph (``outer_reads`` of each)."""
    reads: list[str] = []
    for subgraph in subgraphs(node):
        reads.extend(outer_reads(subgraph))
    return list(dict.fromkeys(reads))


def reads_in_subgraphs(graph: onnx.GraphProto) -> set[str]:
    """Names of ``graph`` that the subgraphs of its nodes read."""
    return {name for node in graph.node for name in subgraph_reads(node)}


def defined_names(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Values the nodes define, with those defined inside their subgraphs (any depth)."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.output)
        for subgraph in subgraphs(node):
            names.update(value.name for value in subgraph.input)
            names.update(init.name for init in subgraph.initializer)
            names.update(defined_names(subgraph.node))
    names.discard("")
    return names


def used_names(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name of a graph and its subgraphs."""
    names: set[str] = set()
    for inner in walk_graphs(graph):
        names.update(value.name for value in inner.input)
        names.update(value.name for value in inner.output)
        names.update(value.name for value in inner.value_info)
        names.update(init.name for init in inner.initializer)
        for node in inner.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    names.discard("")
    return names


def unique_name(base: str, taken: set[str], separator: str = "_") -> str:
    """``base``, or ``base<separator>1``, ``2``, ... : the first not in ``taken``, which it joins."""
    name, k = base, 1
    while name in taken or not name:
        name, k = f"{base}{separator}{k}", k + 1
    taken.add(name)
    return name


def rename_values(graph: onnx.GraphProto, renamed: Mapping[str, str]) -> None:
    """Renames values everywhere in ``graph`` and its subgraphs (inputs, outputs, initializers)."""
    for inner in walk_graphs(graph):
        for node in inner.node:
            for index, name in enumerate(node.input):
                node.input[index] = renamed.get(name, name)
            for index, name in enumerate(node.output):
                node.output[index] = renamed.get(name, name)
        for values in (inner.input, inner.output, inner.value_info):
            for value in values:
                value.name = renamed.get(value.name, value.name)
        for init in inner.initializer:
            init.name = renamed.get(init.name, init.name)


def drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Removes the initializers that no node (nor a subgraph of one) and no output reads; nodes stay."""
    read = {name for node in graph.node for name in node.input} | reads_in_subgraphs(graph)
    read.update(value.name for value in graph.output)
    kept = [init for init in graph.initializer if init.name in read]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def prune_to_outputs(
    graph: onnx.GraphProto,
    outputs: Sequence[str] | None = None,
    *,
    initializers: bool = True,
    inputs: bool = False,
) -> set[str]:
    """Keeps only the nodes the outputs depend on (their subgraphs' outer reads included).

    Args:
        graph: Changed in place.
        outputs: The values to keep computing; the graph's outputs when None (the graph's
            outputs themselves are left as they are).
        initializers: Also drop the initializers nothing kept reads.
        inputs: Also drop the graph inputs nothing kept reads.

    Returns:
        Every name the kept nodes read, with the outputs: what the pruned graph needs.
    """
    needed = {value.name for value in graph.output} if outputs is None else set(outputs)
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output if name):
            kept.append(node)
            needed.update(name for name in node.input if name)
            needed.update(subgraph_reads(node))
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    if initializers:
        read = [init for init in graph.initializer if init.name in needed]
        del graph.initializer[:]
        graph.initializer.extend(read)
    if inputs:
        fed = [value for value in graph.input if value.name in needed]
        del graph.input[:]
        graph.input.extend(fed)
    return needed
