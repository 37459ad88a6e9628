"""Reads and small rewrites of a model's structure that the Trainer applies: protos only.

- ``graph_hash``: SHA-256 of the structure (nodes, names, types, shapes), not of tensor values;
  a checkpoint records it so that its parameters are never loaded into another model.
- ``without_unused_initializers``: drops main-graph initializers no node reads.
- ``set_constant``: writes a value into a ``Constant`` node in the form it had.

Nothing here imports onnxruntime.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs.emit.graph_utils import drop_unread_initializers, walk_graphs


def graph_hash(model: onnx.ModelProto) -> str:
    """SHA-256 of the model's structure: nodes, names, types and shapes, not tensor values.

    A checkpoint records it, so that its parameters are never loaded into another model; the
    values are left out because training (and export) changes them.
    """
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    stripped.ClearField("metadata_props")
    stripped.ClearField("doc_string")
    for graph in walk_graphs(stripped.graph):
        tensors = list(graph.initializer)
        for node in graph.node:
            tensors.extend(attribute.t for attribute in node.attribute if attribute.type == onnx.AttributeProto.TENSOR)
        for tensor in tensors:
            for field in ("raw_data", "float_data", "double_data", "int32_data", "int64_data", "uint64_data"):
                tensor.ClearField(field)
    return hashlib.sha256(stripped.SerializeToString(deterministic=True)).hexdigest()


def set_constant(node: onnx.NodeProto, value: np.ndarray) -> None:
    """Writes ``value`` into a ``Constant`` node in the form it had (its tensor's name kept)."""
    for attribute in node.attribute:
        if attribute.name == "value":
            attribute.t.CopyFrom(onnx.numpy_helper.from_array(value, attribute.t.name))
            return
        if attribute.name == "value_float":
            attribute.f = float(value)
            return
        if attribute.name == "value_floats":
            del attribute.floats[:]
            attribute.floats.extend(float(item) for item in value.reshape(-1))
            return
    node.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(value, node.output[0])))


def without_unused_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drops main-graph initializers no node reads (onnxruntime warns about each one); in place."""
    drop_unread_initializers(model.graph)
    return model
