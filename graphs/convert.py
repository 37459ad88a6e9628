"""Rewrites standard ONNX ``LSTM`` nodes into ortlstm ``LSTMTraining`` nodes.

A converted node computes the same Y, Y_h, Y_c (as HAll, Ht, Ct) and also outputs what
``LSTMGrad`` needs (every output gets a value name), takes the full-length input list
(onnxruntime-training's gradient builder indexes forward inputs by position), carries the
attributes (with ``activations`` mirrored for older runtimes) and gets a unique name, by which
gradient post-processing pairs it with its gradient node. The main graph, subgraphs of control
flow and model-local functions are all rewritten. This module builds protos only; it never
imports onnxruntime.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator

import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs.emit.checks import make_checked_node
from ortlstm.graphs.emit.emitter import onnx_opset
from ortlstm.graphs.emit.graph_utils import named_subgraphs, unique_name
from ortlstm.ops import lstm_attributes, schema

# onnxruntime-training 1.19 loads models up to this IR version.
MAX_IR_VERSION = 10
_ONNX_DOMAINS = ("", "ai.onnx")
MAIN_GRAPH = "main graph"
_QUANTIZED_LSTM = ("com.microsoft", "DynamicQuantizeLSTM")
INT8_ADVICE = (
    "the Trainer (and `ortlstm train-step` / `ortlstm fit`) trains an int8 model as it is, its int8 weights "
    "dequantized into float32 parameters; ortlstm.graphs.prepare.dequantize_model(model) writes that float model, "
    "which convert takes; export(path, quantize='dynamic') writes the trained model as int8 again"
)
"""What to do with a quantized LSTM, for every message that meets one."""
_SUPPORTED_ELEM_TYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64"}


def is_onnx_lstm(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a standard ONNX LSTM."""
    return node.op_type == "LSTM" and node.domain in _ONNX_DOMAINS


@dataclasses.dataclass(frozen=True)
class ConvertedNode:
    """One LSTM node that ``convert`` rewrote, and where it sits.

    Attributes:
        name: The LSTMTraining node's name (the LSTM's own unless another node took it).
        where: ``"main graph"``, or the path to a subgraph or function, e.g. ``"main graph > If node
            'select' then_branch"`` or ``"function local::encoder"``.
    """

    name: str
    where: str


def _graphs(graph: onnx.GraphProto, where: str = MAIN_GRAPH) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The graph and every subgraph nested in its nodes' attributes, depth first, with their paths."""
    yield where, graph
    for node in graph.node:
        yield from _subgraphs(node, where)


def _subgraphs(node: onnx.NodeProto, where: str) -> Iterator[tuple[str, onnx.GraphProto]]:
    for label, subgraph in named_subgraphs(node):
        yield from _graphs(subgraph, f"{where} > {node.op_type} node {node.name!r} {label}")


def _all_node_lists(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.GraphProto | onnx.FunctionProto]]:
    yield from _graphs(model.graph)
    for function in model.functions:
        where = f"function {function.domain}::{function.name}"
        yield where, function
        for node in function.node:
            yield from _subgraphs(node, where)


def lstm_locations(model: onnx.ModelProto) -> list[ConvertedNode]:
    """Every ONNX LSTM and ortlstm LSTMTraining node of ``model`` (main graph, subgraphs, functions)."""
    return [
        ConvertedNode(node.name, where)
        for where, container in _all_node_lists(model)
        for node in container.node
        if is_onnx_lstm(node) or (node.domain, node.op_type) == (schema.LSTM_TRAINING.domain, schema.LSTM_TRAINING.name)
    ]


def _quantized_lstms(model: onnx.ModelProto) -> list[ConvertedNode]:
    return [
        ConvertedNode(node.name, where)
        for where, container in _all_node_lists(model)
        for node in container.node
        if (node.domain, node.op_type) == _QUANTIZED_LSTM
    ]


def _describe(nodes: list[ConvertedNode]) -> str:
    return ", ".join(f"{node.name or '(unnamed)'!r} in {node.where}" for node in nodes)


def _used_names(model: onnx.ModelProto) -> set[str]:
    names: set[str] = set()
    for _, container in _all_node_lists(model):
        for node in container.node:
            names.update(node.input)
            names.update(node.output)
            if not is_onnx_lstm(node):  # a converted node may keep its name if no other takes it
                names.add(node.name)
        if isinstance(container, onnx.GraphProto):
            names.update(value.name for value in container.input)
            names.update(value.name for value in container.output)
            names.update(init.name for init in container.initializer)
    return names


class _NameSource:
    """Hands out names that occur nowhere in the model."""

    def __init__(self, used: set[str]) -> None:
        self._used = set(used)

    def fresh(self, base: str) -> str:
        return unique_name(base, self._used)


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    found: dict[str, onnx.TensorProto] = {}
    for _, graph in _graphs(model.graph):
        found.update({init.name: init for init in graph.initializer})
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in _ONNX_DOMAINS and node.output:
                for attribute in node.attribute:
                    if attribute.name == "value":
                        found[node.output[0]] = attribute.t
    return found


def _hidden_size(node: onnx.NodeProto, where: str, constants: dict[str, onnx.TensorProto]) -> int:
    """hidden_size of an LSTM node: its attribute, or read off R's shape [D, 4H, H]."""
    for attribute in node.attribute:
        if attribute.name == "hidden_size":
            return int(attribute.i)
    r_name = node.input[2] if len(node.input) > 2 else ""
    if r_name in constants and len(constants[r_name].dims) == 3:
        return int(constants[r_name].dims[2])
    raise ValueError(
        f"LSTM node {node.name!r} in {where}: no hidden_size attribute, and R ({r_name!r}) is not an "
        "initializer whose shape gives it. Set hidden_size on the node."
    )


def _check_element_type(node: onnx.NodeProto, where: str, constants: dict[str, onnx.TensorProto]) -> None:
    w_name = node.input[1] if len(node.input) > 1 else ""
    if w_name in constants:
        elem = constants[w_name].data_type
        if elem not in _SUPPORTED_ELEM_TYPES:
            type_name = onnx.TensorProto.DataType.Name(elem)
            raise ValueError(
                f"LSTM node {node.name!r} in {where}: W ({w_name!r}) is {type_name}; ortlstm supports float32 and "
                "float64. Cast the model's LSTM weights and inputs to float32 first."
            )


def _convert_node(
    node: onnx.NodeProto, where: str, names: _NameSource, constants: dict[str, onnx.TensorProto], opset: int
) -> onnx.NodeProto:
    _check_element_type(node, where, constants)
    hidden_size = _hidden_size(node, where, constants)
    node_name = names.fresh(node.name or "LSTM")
    attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
    for key in ("direction", "activations"):
        value = attributes.get(key)
        if isinstance(value, bytes):
            attributes[key] = value.decode()
        elif isinstance(value, list):
            attributes[key] = [item.decode() if isinstance(item, bytes) else item for item in value]
    attributes["hidden_size"] = hidden_size

    forward = schema.LSTM_TRAINING
    inputs = list(node.input) + [""] * (len(forward.inputs) - len(node.input))
    outputs = list(node.output) + [""] * (len(forward.outputs) - len(node.output))
    # Every output gets a name, even if nothing reads it: LSTMGrad reads HAll, CAll and IOFC, and
    # onnxruntime-training names the gradient of output k "<name of k>_grad", which an empty name
    # turns into the invalid "_grad".
    for index, port in enumerate(forward.outputs):
        if not outputs[index]:
            outputs[index] = names.fresh(f"{node_name}_{port.name}")
    return make_checked_node(
        opset,
        forward.name,
        inputs,
        outputs,
        name=node_name,
        domain=forward.domain,
        doc_string=node.doc_string,
        **lstm_attributes(**attributes),
    )


def _add_opset(container: onnx.ModelProto | onnx.FunctionProto) -> None:
    if not any(entry.domain == schema.DOMAIN for entry in container.opset_import):
        container.opset_import.append(onnx.helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION))


def convert(model: onnx.ModelProto) -> onnx.ModelProto:
    """Returns a copy of ``model`` with every ONNX ``LSTM`` node replaced by ``LSTMTraining``.

    :func:`convert_with_report` does the same and also says which nodes it converted, and where.

    The converted model computes the same outputs (check with onnxruntime and
    ``ortlstm.ops.session_options()``), is differentiable by onnxruntime-training once
    :func:`ortlstm.graphs.register_gradient` ran, and has an IR version onnxruntime 1.19 loads.

    Args:
        model: A model, e.g. written by ``torch.onnx.export`` for an ``nn.LSTM``.

    Returns:
        The converted model (``model`` is not modified).

    Raises:
        ValueError: The model has no LSTM node (also when its only LSTMs are quantized), an LSTM
            whose hidden_size cannot be determined, or LSTM weights of an element type other than
            float32/float64.
    """
    return convert_with_report(model)[0]


def convert_with_report(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[ConvertedNode]]:
    """Like :func:`convert`, and returns the converted nodes with where each sits.

    com.microsoft ``DynamicQuantizeLSTM`` nodes (int8 weights, written by onnxruntime's
    quantization tools) are not converted: their int8 weights have no gradient. The Trainer trains
    them dequantized (``prepare.dequantize_model`` writes that float model, whose LSTMs convert). A
    model whose only LSTMs are quantized is refused with that advice; in a model that also has float
    LSTMs, the quantized ones stay as they are (``quantized_lstms(model)`` lists them).

    Returns:
        ``(converted model, converted nodes in graph order)``.

    Raises:
        ValueError: As :func:`convert`.
    """
    result = copy.deepcopy(model)
    names = _NameSource(_used_names(result))
    constants = _initializers(result)
    converted: list[ConvertedNode] = []
    for where, container in _all_node_lists(result):
        nodes = list(container.node)
        if not any(is_onnx_lstm(node) for node in nodes):
            continue
        del container.node[:]
        for node in nodes:
            if is_onnx_lstm(node):
                new_node = _convert_node(node, where, names, constants, onnx_opset(result))
                container.node.append(new_node)
                converted.append(ConvertedNode(new_node.name, where))
            else:
                container.node.append(node)
        if isinstance(container, onnx.FunctionProto):
            _add_opset(container)
    if not converted:
        quantized = _quantized_lstms(model)
        if quantized:
            raise ValueError(
                f"the model's LSTMs are quantized (com.microsoft DynamicQuantizeLSTM: {_describe(quantized)}). "
                f"convert rewrites float LSTMs only: {INT8_ADVICE}"
            )
        raise ValueError(
            "the model has no ONNX LSTM node to convert (looked in the main graph, subgraphs and functions). "
            "Export the LSTM as an ONNX LSTM op: torch.onnx.export of nn.LSTM does this."
        )
    _add_opset(result)
    result.ir_version = min(result.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
    return result, converted


def quantized_lstms(model: onnx.ModelProto) -> list[ConvertedNode]:
    """The com.microsoft ``DynamicQuantizeLSTM`` nodes of ``model``, which ``convert`` leaves alone."""
    return _quantized_lstms(model)


def lstm_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The ``LSTMTraining`` nodes of a converted model's main graph, in graph order."""
    return [
        node
        for node in model.graph.node
        if node.op_type == schema.LSTM_TRAINING.name and node.domain == schema.LSTM_TRAINING.domain
    ]
