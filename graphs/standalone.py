"""Standalone gradient models: one LSTM's forward outputs and every gradient, in one graph.

``build_gradient_model`` takes an LSTM configuration and returns a model whose inputs are the
LSTM inputs plus the upstream gradients (``grad_HAll``, ``grad_Ht``, ``grad_Ct``) and whose
outputs are the forward outputs and the gradients of every input present. Port names, order and
the wiring between LSTMTraining and LSTMGrad come from the spec (``schema.LSTM_TRAINING_GRADIENT``), so the
model follows the contract without a name written here. ``lstm_with_gradients`` is the same pair
of nodes as an onnxscript function.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx.helper

from ortlstm.graphs.convert import MAX_IR_VERSION
from ortlstm.ops import make_node, schema

_ELEM_TYPES = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float64): onnx.TensorProto.DOUBLE}
_ONNX_OPSET = 17


@dataclasses.dataclass(frozen=True)
class LstmGraphConfig:
    """What a standalone gradient model is built for.

    Attributes:
        hidden_size: LSTM hidden size.
        input_size: Features per step of X.
        direction: ``forward``, ``reverse`` or ``bidirectional``.
        layout: 0 (seq_length first) or 1 (batch_size first).
        dtype: float32 or float64.
        seq_length: Fixed sequence length, or None for a symbolic ``seq_length`` dim.
        batch_size: Fixed batch size, or None for a symbolic ``batch_size`` dim.
        inputs: Optional LSTM inputs present (any of B, sequence_lens, initial_h, initial_c, P).
        attributes: Further LSTM attributes (activations, activation_alpha, clip, input_forget, ...).
    """

    hidden_size: int
    input_size: int
    direction: str = "forward"
    layout: int = 0
    dtype: type = np.float32
    seq_length: int | None = None
    batch_size: int | None = None
    inputs: tuple[str, ...] = ("B",)
    attributes: tuple[tuple[str, object], ...] = ()


def _check(config: LstmGraphConfig) -> None:
    if config.hidden_size <= 0:
        raise ValueError(f"hidden_size: expected a positive integer, got {config.hidden_size}")
    if config.input_size <= 0:
        raise ValueError(f"input_size: expected a positive integer, got {config.input_size}")
    if config.direction not in schema.DIRECTIONS:
        raise ValueError(f"direction: expected one of {schema.DIRECTIONS}, got {config.direction!r}")
    if config.layout not in (0, 1):
        raise ValueError(f"layout: expected 0 or 1, got {config.layout}")
    if np.dtype(config.dtype) not in _ELEM_TYPES:
        raise ValueError(f"dtype: expected float32 or float64, got {np.dtype(config.dtype)}")
    optional = [port.name for port in schema.LSTM_TRAINING.inputs if port.optional]
    unknown = sorted(set(config.inputs) - set(optional))
    if unknown:
        raise ValueError(f"inputs: {unknown} are not optional LSTMTraining inputs {optional}")


def _dims(config: LstmGraphConfig) -> dict[str, int | str]:
    return {
        "seq_length": config.seq_length if config.seq_length is not None else "seq_length",
        "batch_size": config.batch_size if config.batch_size is not None else "batch_size",
        "input_size": config.input_size,
        "hidden_size": config.hidden_size,
        "num_directions": schema.num_directions(config.direction),
    }


def _shape(port: schema.PortSpec, config: LstmGraphConfig) -> list[int | str]:
    dims = _dims(config)
    shape: list[int | str] = []
    for expression in schema.shape_for_layout(port, config.layout):
        factor, name = schema.parse_dim(expression)
        value = dims[name]
        shape.append(factor * value if isinstance(value, int) else (value if factor == 1 else f"{factor}*{value}"))
    return shape


def _value_info(port: schema.PortSpec, config: LstmGraphConfig, name: str | None = None) -> onnx.ValueInfoProto:
    elem = onnx.TensorProto.INT32 if port.type_str == "T1" else _ELEM_TYPES[np.dtype(config.dtype)]
    return onnx.helper.make_tensor_value_info(name or port.name, elem, _shape(port, config))


def build_gradient_model(config: LstmGraphConfig) -> onnx.ModelProto:
    """A model computing one LSTM's outputs and the gradients of every input it has.

    Inputs: the LSTMTraining inputs present in ``config`` (X, W, R always), then the upstream
    gradients grad_HAll, grad_Ht, grad_Ct (each may be fed zeros). Outputs: HAll, Ht, Ct, CAll,
    IOFC, then the LSTMGrad outputs of the inputs present (dX, dW, dR always).

    Args:
        config: The LSTM configuration.

    Returns:
        The model; run it with ``ortlstm.ops.session_options()``.

    Raises:
        ValueError: An invalid configuration value (named in the message).
    """
    _check(config)
    forward, backward = schema.LSTM_TRAINING, schema.LSTM_GRAD
    present = [port for port in forward.inputs if not port.optional or port.name in config.inputs]
    present_names = {port.name for port in present}
    attributes = {"hidden_size": config.hidden_size, "direction": config.direction, **dict(config.attributes)}
    if config.layout:
        attributes["layout"] = config.layout

    forward_node = make_node(
        forward.name,
        {port.name: port.name for port in present},
        {port.name: port.name for port in forward.outputs},
        name=forward.name,
        **attributes,
    )
    # Each LSTMGrad port as the spec wires it, in this graph's value names.
    upstream = {port.gradient_of: port.name for port in backward.inputs if port.gradient_of is not None}
    wiring = schema.LSTM_TRAINING_GRADIENT
    source = schema.GradientSource

    def resolve(link: schema.GradientLink) -> str:
        if link.source is source.INPUT:
            return link.forward_port if link.forward_port in present_names else ""
        if link.source is source.OUTPUT:
            return link.forward_port
        if link.source is source.OUTPUT_GRADIENT:
            return upstream[link.forward_port]
        return link.port if link.forward_port in present_names else ""  # the gradient of a present input

    grad_inputs = {link.port: resolve(link) for link in wiring.inputs}
    grad_outputs = {link.port: resolve(link) for link in wiring.outputs}
    backward_node = make_node(backward.name, grad_inputs, grad_outputs, name=backward.name, **attributes)

    upstream_ports = [port for port in backward.inputs if port.gradient_of is not None]
    graph = onnx.helper.make_graph(
        [forward_node, backward_node],
        "lstm_with_gradients",
        [_value_info(port, config) for port in present] + [_value_info(port, config) for port in upstream_ports],
        [_value_info(port, config) for port in forward.outputs]
        + [_value_info(port, config) for port in backward.outputs if grad_outputs[port.name]],
    )
    return onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", _ONNX_OPSET),
            onnx.helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION),
        ],
        ir_version=MAX_IR_VERSION,
        producer_name="ortlstm.graphs.build_gradient_model",
    )
