"""Rewrites standard ONNX ``GRU`` nodes into ortlstm ``GRUTraining`` nodes, as ``convert`` does LSTMs.

A converted node computes the same Y and Y_h (as HAll and Ht), also outputs the ZRH stash that
``GRUGrad`` reads (every output gets a value name), takes the full-length input list, carries the
attributes (with ``activations`` mirrored for older runtimes) and gets a unique name. The main
graph, subgraphs and model-local functions are all rewritten, with the LSTM converter's walkers
and name source. Protos only; never imports onnxruntime.
"""

from __future__ import annotations

import copy

import onnx
import onnx.helper

from ortlstm.graphs.convert import (
    _ONNX_DOMAINS,
    _SUPPORTED_ELEM_TYPES,
    _add_opset,
    _all_node_lists,
    _initializers,
    _NameSource,
    _used_names,
)
from ortlstm.graphs.emit.checks import make_checked_node
from ortlstm.graphs.emit.emitter import onnx_opset
from ortlstm.ops import lstm_attributes, schema


def is_onnx_gru(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a standard ONNX GRU."""
    return node.op_type == "GRU" and node.domain in _ONNX_DOMAINS


def convert_grus(model: onnx.ModelProto) -> onnx.ModelProto:
    """Returns a copy of ``model`` with every ONNX ``GRU`` node replaced by ``GRUTraining``.

    Args:
        model: A model, e.g. written by ``torch.onnx.export`` for an ``nn.GRU``.

    Returns:
        The converted copy (the model itself, uncopied, when it has no GRU).

    Raises:
        ValueError: A GRU whose hidden_size cannot be determined, or whose weights are neither
            float32 nor float64; the message names the node and where it is.
    """
    return convert_recurrent(model, "GRU")


CELLS = {"GRU": (schema.GRU_TRAINING, 3), "RNN": (schema.RNN_TRAINING, 1)}
"""ONNX recurrent op -> (the ortlstm forward op it becomes, its gate count), for the cells without a c."""


def convert_recurrent(model: onnx.ModelProto, op_type: str) -> onnx.ModelProto:
    """``convert_grus`` for any op of ``CELLS`` (``"GRU"``, ``"RNN"``): each becomes its training op."""

    def is_cell(node: onnx.NodeProto) -> bool:
        return node.op_type == op_type and node.domain in _ONNX_DOMAINS

    if not any(is_cell(node) for _, container in _all_node_lists(model) for node in container.node):
        return model
    result = copy.deepcopy(model)
    names = _NameSource(_used_names(result))
    constants = _initializers(result)
    opset = onnx_opset(result)
    for where, container in _all_node_lists(result):
        nodes = list(container.node)
        if not any(is_cell(node) for node in nodes):
            continue
        del container.node[:]
        container.node.extend(
            _convert_node(node, where, names, constants, op_type, opset) if is_cell(node) else node for node in nodes
        )
        if isinstance(container, onnx.FunctionProto):
            _add_opset(container)
    _add_opset(result)
    return result


def _convert_node(
    node: onnx.NodeProto,
    where: str,
    names: _NameSource,
    constants: dict[str, onnx.TensorProto],
    op_type: str,
    opset: int,
) -> onnx.NodeProto:
    forward, gates = CELLS[op_type]
    if len(node.input) > len(forward.inputs):
        raise ValueError(
            f"{op_type} node {node.name!r} in {where}: {len(node.input)} inputs; ONNX {op_type} takes at most "
            f"{len(forward.inputs)} (X, W, R, B, sequence_lens, initial_h)"
        )
    attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
    for key, value in list(attributes.items()):
        if isinstance(value, bytes):
            attributes[key] = value.decode()
        elif isinstance(value, list):
            attributes[key] = [item.decode() if isinstance(item, bytes) else item for item in value]
    weights = constants.get(node.input[1]) if len(node.input) > 1 else None
    if weights is not None and weights.data_type not in _SUPPORTED_ELEM_TYPES:
        raise ValueError(
            f"{op_type} node {node.name!r} in {where}: W ({node.input[1]!r}) is "
            f"{onnx.TensorProto.DataType.Name(weights.data_type)}; ortlstm supports float32 and float64. Cast the "
            f"model's {op_type} weights and inputs to float32 first."
        )
    if "hidden_size" not in attributes:
        recurrence = constants.get(node.input[2]) if len(node.input) > 2 else None
        if recurrence is None or len(recurrence.dims) != 3:
            raise ValueError(
                f"{op_type} node {node.name!r} in {where}: no hidden_size attribute, and R is not a constant of shape "
                f"[num_directions, {gates}*hidden_size, hidden_size] to read it from; set the attribute hidden_size"
            )
        attributes["hidden_size"] = int(recurrence.dims[2])
    node_name = names.fresh(node.name or op_type)
    inputs = list(node.input) + [""] * (len(forward.inputs) - len(node.input))
    outputs = list(node.output) + [""] * (len(forward.outputs) - len(node.output))
    # Every output gets a name: GRUGrad reads HAll and ZRH (RNNGrad HAll).
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
