"""Carried RNN state (stateful truncated backpropagation through time): the graph rewrite.

``with_carried_state`` feeds each main-graph LSTM's and GRU's initial state from new graph inputs
and outputs its final state, so that a trainer can feed one step's final state as the next step's
initial state. ``STATE_PORTS`` is the one place that says which recurrent ops carry which states
(an LSTM h and c, a GRU h), read from ONNX's op schemas. Protos only; nothing here imports onnxruntime.
"""

from __future__ import annotations

import dataclasses

import onnx
import onnx.defs
import onnx.helper

from ortlstm.graphs.emit.graph_utils import prune_to_outputs, unique_name
from ortlstm.graphs.prepare.dequantize import dequantize_model, is_quantized

CARRIED_OPS = ("LSTM", "GRU", "RNN")  # the ONNX recurrent ops the library trains (LSTMTraining, GRUTraining, ...)


def _state_ports(op_type: str) -> tuple[tuple[int, int], ...]:
    """The ``(initial-state input, final-state output)`` indices of an ONNX recurrent op, from its schema.

    Each ``initial_X`` input is paired with the ``Y_X`` output (LSTM: h and c; GRU and RNN: h), so a
    recurrent op that gains a state gains it here without a second table to keep in step.
    """
    op_schema = onnx.defs.get_schema(op_type)
    outputs = [port.name for port in op_schema.outputs]
    return tuple(
        (index, outputs.index("Y_" + port.name.removeprefix("initial_")))
        for index, port in enumerate(op_schema.inputs)
        if port.name.startswith("initial_")
    )


STATE_PORTS: dict[str, tuple[tuple[int, int], ...]] = {op: _state_ports(op) for op in ("LSTM", "GRU", "RNN")}
"""Each ONNX recurrent op's ``(initial-state input index, final-state output index)`` pairs."""


@dataclasses.dataclass(frozen=True)
class CarriedState:
    """One LSTM or GRU node whose final state becomes its next initial state.

    Attributes:
        node: The node's name (or ``lstm_<index>`` / ``gru_<index>``).
        initial_h: The graph input that feeds its initial_h (``initial_c`` likewise; ``""`` for a GRU).
        initial_c: See ``initial_h``.
        final_h: The output carrying its Y_h (``final_c``: Y_c; ``""`` for a GRU) to the next step.
        final_c: See ``final_h``.
        sequence: Its input X (the batch size is read from X's shape).
        layout: The node's layout (0: state ``[num_directions, batch, hidden]``; 1: ``[batch, ...]``).
        num_directions: 1, or 2 when bidirectional.
        hidden_size: The node's hidden size.
        elem_type: The state's ONNX element type.
        op_type: ``"LSTM"`` or ``"GRU"``.
    """

    node: str
    initial_h: str
    initial_c: str
    final_h: str
    final_c: str
    sequence: str
    layout: int
    num_directions: int
    hidden_size: int
    elem_type: int
    op_type: str = "LSTM"

    @property
    def states(self) -> tuple[tuple[str, str], ...]:
        """Each carried state's ``(initial-state input, final-state output)``: h and c, or a GRU's h."""
        pairs = ((self.initial_h, self.final_h), (self.initial_c, self.final_c))
        return tuple(pair for pair in pairs if pair[0])

    def shape(self, batch_size: int) -> tuple[int, ...]:
        """The state's shape for a batch of ``batch_size``."""
        if self.layout == 0:
            return (self.num_directions, batch_size, self.hidden_size)
        return (batch_size, self.num_directions, self.hidden_size)

    @property
    def batch_axis(self) -> int:
        """The batch axis of the state (and of X)."""
        return 1 if self.layout == 0 else 0


def with_carried_state(model: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[CarriedState, ...]]:
    """The model with each main-graph LSTM's and GRU's initial state fed by new inputs, its final state output.

    Feeding the final state back as the next step's input (a graph input, not a parameter) carries
    the state without a gradient through the boundary, as torch's ``h.detach()`` does. Whatever fed
    initial_h/initial_c before (nothing, zeros, an input) is replaced; inputs and nodes left unused
    are removed. The ports come from ``STATE_PORTS``. An int8 model is dequantized first
    (``prepare.dequantize_model``), as its training is.

    Raises:
        ValueError: The main graph has no ONNX LSTM, GRU or RNN node.
    """
    result = onnx.ModelProto()
    # An int8 model's LSTMs are DynamicQuantizeLSTM nodes until dequantized; the training build
    # dequantizes the same way, so its parameters keep their names.
    result.CopyFrom(dequantize_model(model)[0] if is_quantized(model) else model)
    graph = result.graph
    taken = {value.name for value in [*graph.input, *graph.output]} | {init.name for init in graph.initializer}
    taken.update(name for node in graph.node for name in [*node.input, *node.output])
    initializers = {init.name: init for init in graph.initializer}
    declared = {value.name: value.type.tensor_type.elem_type for value in graph.input}

    def fresh(base: str) -> str:
        return unique_name(base, taken)

    outputs = {value.name for value in graph.output}
    carried: list[CarriedState] = []
    for index, node in enumerate(graph.node):
        if node.op_type not in CARRIED_OPS or node.domain not in ("", "ai.onnx"):
            continue
        label = node.name or f"{node.op_type.lower()}_{index}"
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
        direction = attributes.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        weight = node.input[1]
        elem_type = initializers[weight].data_type if weight in initializers else declared.get(weight, 0)
        ports = STATE_PORTS[node.op_type]
        while len(node.input) <= max(port for port, _ in ports):
            node.input.append("")
        while len(node.output) <= max(port for _, port in ports):
            node.output.append("")
        initial, final = ["", ""], ["", ""]  # h, then c (a GRU has no c)
        for slot, (into, out) in enumerate(ports):
            suffix = onnx.defs.get_schema(node.op_type).outputs[out].name  # Y_h, Y_c
            initial[slot] = fresh(f"{label}.initial_{suffix[2:]}")
            final[slot] = node.output[out] or fresh(f"{label}.{suffix}")
            node.input[into], node.output[out] = initial[slot], final[slot]
        state = CarriedState(
            node=label,
            initial_h=initial[0],
            initial_c=initial[1],
            final_h=final[0],
            final_c=final[1],
            sequence=node.input[0],
            layout=int(attributes.get("layout", 0)),
            num_directions=2 if direction == "bidirectional" else 1,
            hidden_size=int(attributes["hidden_size"]),
            elem_type=elem_type or onnx.TensorProto.FLOAT,
            op_type=node.op_type,
        )
        for initial_name, final_name in state.states:
            shape: list[int | None] = list(state.shape(None))  # type: ignore[arg-type]
            graph.input.append(onnx.helper.make_tensor_value_info(initial_name, state.elem_type, shape))
            if final_name not in outputs:
                graph.output.append(onnx.helper.make_empty_tensor_value_info(final_name))
        carried.append(state)
    if not carried:
        raise ValueError(
            "stateful=True: the model's main graph has no ONNX LSTM, GRU or RNN node whose state could be carried"
        )
    prune_to_outputs(graph, initializers=False, inputs=True)
    return result, tuple(carried)

