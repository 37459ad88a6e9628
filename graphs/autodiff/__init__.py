"""Reverse-mode differentiation of ONNX graphs in standard ops, for training in plain onnxruntime.

- ``build_backward``: gradients of a loss with respect to chosen values, as new graph nodes.
- ``register_gradient_rule`` / ``gradient_rule``: the table of rules, keyed by (domain, op_type);
  a user's own op gets a gradient by registering a rule.
- ``GraphEmitter``: how every training-graph builder appends nodes (fresh names, typed
  constants, opset-aware forms, each node checked against its schema); it lives at the ground
  floor, ``ortlstm.graphs.emit``, and is re-exported here.

Importing this package registers the built-in rules (the ``rules_*`` modules).
"""

from __future__ import annotations

from ortlstm.graphs.autodiff import (  # noqa: F401 - importing them registers the rules
    rules_activations,
    rules_conv,
    rules_convtranspose,
    rules_ctc,
    rules_einsum,
    rules_gru,
    rules_lstm,
    rules_math,
    rules_nn,
    rules_pool,
    rules_rnn,
    rules_scatter,
    rules_shape,
)
from ortlstm.graphs.autodiff.backward import Backward, build_backward
from ortlstm.graphs.autodiff.registry import (
    GradientContext,
    GradientRule,
    gradient_rule,
    register_gradient_rule,
    registered_ops,
)
from ortlstm.graphs.emit.emitter import GraphEmitter, ValueType, infer_value_types, onnx_opset

__all__ = [
    "Backward",
    "GradientContext",
    "GradientRule",
    "GraphEmitter",
    "ValueType",
    "build_backward",
    "gradient_rule",
    "infer_value_types",
    "onnx_opset",
    "register_gradient_rule",
    "registered_ops",
]
