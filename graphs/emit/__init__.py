"""The ground floor of ``ortlstm.graphs``: how every builder makes nodes, and the graph plumbing they share.

- ``emitter``: ``GraphEmitter`` (fresh names, typed constants, opset-aware forms), ``ValueType``
  and static type inference;
- ``checks``: each node checked against its op's schema when it is made (onnx's for ai.onnx,
  ``ortlstm.ops.schema`` for the ortlstm domain);
- ``graph_utils``: subgraphs, what they read, fresh names, pruning.

It imports only ``ortlstm.ops`` and onnx; autodiff, losses, optimizers, prepare, the train step,
the Trainer and fit import it (tests/test_layers.py keeps it so).
"""

from __future__ import annotations

from ortlstm.graphs.emit.checks import NodeSchemaError, check_node, make_checked_node
from ortlstm.graphs.emit.emitter import (
    FLOAT_TYPES,
    MIN_OPSET,
    GraphEmitter,
    ValueType,
    infer_value_types,
    make_model,
    onnx_opset,
    value_type_of,
)

__all__ = [
    "FLOAT_TYPES",
    "MIN_OPSET",
    "GraphEmitter",
    "NodeSchemaError",
    "ValueType",
    "check_node",
    "infer_value_types",
    "make_checked_node",
    "make_model",
    "onnx_opset",
    "value_type_of",
]
