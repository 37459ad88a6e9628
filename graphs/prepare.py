"""Makes an exported model ready for differentiation: the passes before the train step is built.

Real exports arrive with weights in ``Constant`` nodes (spox, paddle2onnx), integer shape
arithmetic that is static once the model's fixed dims are known (torch's dynamo export with
``optimize=False`` computes LSTM weight slices from ``Shape``), ``If`` nodes whose branch is
chosen by an input the user fixes (a sample rate), output shapes declared wrongly, and
standard ``LSTM`` nodes. ``prepare_model`` returns a model where:

- each fixed input is an initializer, and ``If`` nodes whose condition is then constant are
  replaced by the chosen branch's nodes;
- float ``Constant`` tensors are initializers, so they can be trained like any other;
- nodes computing from constants only are folded into initializers when they read no candidate
  parameter (so a weight sliced from a parameter stays differentiable), and ``Shape``/``Size`` of
  a value whose shape is static become constants;
- ONNX ``LSTM`` nodes are ortlstm ``LSTMTraining`` nodes (``convert``);
- declared output shapes and intermediate ``value_info`` are dropped (shape inference redoes them;
  an exporter's wrong declaration is never trusted for labels or losses).

Protos only; folding uses ``onnx.reference``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import onnx.reference

try:
    from ortlstm.graphs.autodiff.emitter import FLOAT_TYPES, infer_value_types
    from ortlstm.graphs.convert import convert, is_onnx_lstm
    from ortlstm.ops import schema
except ModuleNotFoundError:
    from graphs.autodiff.emitter import FLOAT_TYPES, infer_value_types  # type: ignore[no-redef]
    from graphs.convert import convert, is_onnx_lstm  # type: ignore[no-redef]
    from ops import schema  # type: ignore[no-redef]

_ONNX_DOMAINS = ("", "ai.onnx")
# Folding evaluates nodes in Python: never ops with side effects or randomness, never big outputs.
_NOT_FOLDED = frozenset(
    {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
)
_MAX_FOLDED_ELEMENTS = 1 << 16


@dataclasses.dataclass(frozen=True)
class PreparedModel:
    """A model ready for ``build_backward``.

    Attributes:
        model: The prepared model.
        candidates: Float initializers that may be trained: the model's own float initializers
            and lifted float ``Constant`` tensors, not the values folding created.
        specialized: Names of the ``If`` nodes replaced by a branch.
        converted: Names of the ``LSTMTraining`` nodes that replaced ONNX ``LSTM`` nodes.
    """

    model: onnx.ModelProto
    candidates: frozenset[str]
    specialized: tuple[str, ...]
    converted: tuple[str, ...]


def _is_onnx(node: onnx.NodeProto) -> bool:
    return node.domain in _ONNX_DOMAINS


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node, whatever attribute holds it."""
    for attribute in node.attribute:
        if attribute.name == "value":
            return onnx.numpy_helper.to_array(attribute.t)
        if attribute.name in ("value_float", "value_int", "value_floats", "value_ints"):
            dtype = np.float32 if "float" in attribute.name else np.int64
            return np.asarray(onnx.helper.get_attribute_value(attribute), dtype=dtype)
    return None


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attr in node.attribute)


def _evaluate(
    node: onnx.NodeProto, values: Mapping[str, np.ndarray], opsets: list[onnx.OperatorSetIdProto]
) -> list[np.ndarray] | None:
    """Runs one node on constant inputs with onnx's reference evaluator; None if it cannot."""
    inputs = [name for name in node.input if name]
    graph = onnx.helper.make_graph(
        [node],
        "fold",
        [
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(values[name].dtype), values[name].shape
            )
            for name in dict.fromkeys(inputs)
        ],
        [onnx.helper.make_empty_tensor_value_info(name) for name in node.output if name],
    )
    model = onnx.helper.make_model(graph, opset_imports=opsets)
    try:
        results = onnx.reference.ReferenceEvaluator(model).run(
            None, {name: values[name] for name in dict.fromkeys(inputs)}
        )
    except Exception:
        return None
    return [np.asarray(result) for result in results]


def _inline_branch(
    node: onnx.NodeProto, branch: onnx.GraphProto
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes that replace an ``If`` node by one of its branches (outputs renamed by Identity)."""
    nodes = list(branch.node)
    for inner, outer in zip(branch.output, node.output, strict=True):
        if outer:
            nodes.append(onnx.helper.make_node("Identity", [inner.name], [outer], name=f"{node.name}/{inner.name}"))
    return nodes, list(branch.initializer)


def prepare_model(model: onnx.ModelProto, fixed_inputs: Mapping[str, np.ndarray] | None = None) -> PreparedModel:
    """Returns the model made ready for differentiation (see the module docstring).

    Args:
        model: The model as exported.
        fixed_inputs: Graph inputs whose values the user fixes for training (e.g. a sample rate
            that chooses an ``If`` branch); they become initializers.

    Raises:
        ValueError: A fixed input is not a graph input.
    """
    result = copy.deepcopy(model)
    graph = result.graph
    fixed = dict(fixed_inputs or {})
    input_names = [value.name for value in graph.input]
    unknown = sorted(set(fixed) - set(input_names))
    if unknown:
        raise ValueError(f"fixed_inputs: {unknown} are not inputs of the model; its inputs are {input_names}")
    kept_inputs = [value for value in graph.input if value.name not in fixed]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    initializer_names = {init.name for init in graph.initializer}
    for name, value in fixed.items():
        graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))

    # Declared shapes are the exporter's word, not facts: inference recomputes them.
    del graph.value_info[:]
    for output in graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")

    candidates = {
        init.name for init in graph.initializer if init.data_type in FLOAT_TYPES and init.name in initializer_names
    }
    opsets = list(result.opset_import)
    specialized: list[str] = []
    constants: dict[str, np.ndarray] = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    changed = True
    while changed:
        changed = False
        types = infer_value_types(result)
        new_nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            if _is_onnx(node) and node.op_type == "Constant" and len(node.output) == 1:
                value = _constant_value(node)
                if value is not None:
                    constants[node.output[0]] = value
                    graph.initializer.append(onnx.numpy_helper.from_array(value, node.output[0]))
                    if onnx.helper.np_dtype_to_tensor_dtype(value.dtype) in FLOAT_TYPES:
                        candidates.add(node.output[0])
                    changed = True
                    continue
            if _is_onnx(node) and node.op_type == "If" and node.input[0] in constants:
                branch_name = (
                    "then_branch" if bool(np.asarray(constants[node.input[0]]).reshape(-1)[0]) else "else_branch"
                )
                branch = next(attr.g for attr in node.attribute if attr.name == branch_name)
                inlined, branch_initializers = _inline_branch(node, branch)
                new_nodes.extend(inlined)
                graph.initializer.extend(branch_initializers)
                for init in branch_initializers:
                    constants[init.name] = onnx.numpy_helper.to_array(init)
                    if init.data_type in FLOAT_TYPES:
                        candidates.add(init.name)
                specialized.append(node.name)
                changed = True
                continue
            if _is_onnx(node) and node.op_type in ("Shape", "Size") and node.input[0] not in constants:
                static = types.get(node.input[0])
                if static is not None and static.static_shape is not None:
                    full = np.asarray(static.static_shape, dtype=np.int64)
                    if node.op_type == "Size":
                        value = np.asarray(np.prod(full), dtype=np.int64)
                    else:
                        start = next((attr.i for attr in node.attribute if attr.name == "start"), 0)
                        end = next((attr.i for attr in node.attribute if attr.name == "end"), len(full))
                        value = full[start:end]
                    constants[node.output[0]] = value
                    graph.initializer.append(onnx.numpy_helper.from_array(value, node.output[0]))
                    changed = True
                    continue
            foldable = (
                _is_onnx(node)
                and node.op_type not in _NOT_FOLDED
                and node.op_type != "Constant"
                and not _has_subgraph(node)
                and all(name in constants for name in node.input if name)
                and not any(name in candidates for name in node.input if name)
            )
            if foldable:
                outputs = _evaluate(node, constants, opsets)
                if outputs is not None and all(out.size <= _MAX_FOLDED_ELEMENTS for out in outputs):
                    for name, value in zip(node.output, outputs, strict=False):
                        if name:
                            constants[name] = value
                            graph.initializer.append(onnx.numpy_helper.from_array(value, name))
                    changed = True
                    continue
            new_nodes.append(node)
        del graph.node[:]
        graph.node.extend(new_nodes)

    _drop_unused_initializers(graph)
    converted: tuple[str, ...] = ()
    if any(is_onnx_lstm(node) for node in graph.node):
        already = sum(1 for node in graph.node if _is_lstm_training(node))
        result = convert(result)
        converted = tuple(node.name for node in result.graph.node if _is_lstm_training(node))[already:]
    return PreparedModel(result, frozenset(candidates), tuple(specialized), converted)


def _is_lstm_training(node: onnx.NodeProto) -> bool:
    return node.op_type == schema.LSTM_TRAINING.name and node.domain == schema.LSTM_TRAINING.domain


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Removes initializers that no node, subgraph or output reads (folded intermediates)."""
    used = {name for node in graph.node for name in node.input}
    used.update(_subgraph_reads(graph))
    used.update(output.name for output in graph.output)
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for node in graph.node:
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for subgraph in subgraphs:
                for inner in subgraph.node:
                    names.update(inner.input)
                names.update(_subgraph_reads(subgraph))
    return names
