"""The ground floor of ``ortlstm.graphs``: how every builder makes nodes, and the graph plumbing they share.

- ``emitter``: ``GraphEmitter`` (fresh names, typed constants, opset-aware forms), ``ValueType``
  and static type inference;
- ``graph_utils``: subgraphs, what they read, fresh names, pruning.

It imports only ``ortlstm.ops`` and onnx; autodiff, losses, optimizers, prepare, the train step,
the Trainer and fit import it.
"""

from __future__ import annotations

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
    "ValueType",
    "infer_value_types",
    "make_model",
    "onnx_opset",
    "value_type_of",
]
