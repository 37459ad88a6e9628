"""Rewrites standard ONNX ``RNN`` nodes into ortlstm ``RNNTraining`` nodes, as ``convert_gru`` does GRUs.

TorchScript's export of ``nn.RNN`` writes an ONNX RNN node (the dynamo exporter unrolls it into
MatMul/Add/Tanh or Relu, which train without this). A converted node computes the same Y and
Y_h (as HAll and Ht; HAll always gets a name, RNNGrad reads it), with the GRU converter's walkers,
attribute handling and messages (``convert_gru.convert_recurrent``). Protos only; never imports
onnxruntime.
"""

from __future__ import annotations

import onnx

from ortlstm.graphs.convert import _ONNX_DOMAINS
from ortlstm.graphs.convert_gru import convert_recurrent


def is_onnx_rnn(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a standard ONNX RNN."""
    return node.op_type == "RNN" and node.domain in _ONNX_DOMAINS


def convert_rnns(model: onnx.ModelProto) -> onnx.ModelProto:
    """Returns a copy of ``model`` with every ONNX ``RNN`` node replaced by ``RNNTraining``.

    Args:
        model: A model, e.g. written by ``torch.onnx.export(..., dynamo=False)`` for an ``nn.RNN``.

    Returns:
        The converted copy (the model itself, uncopied, when it has no RNN).

    Raises:
        ValueError: An RNN whose hidden_size cannot be determined, or whose weights are neither
            float32 nor float64; the message names the node and where it is.
    """
    return convert_recurrent(model, "RNN")
