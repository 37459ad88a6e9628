"""Carried LSTM state (stateful truncated backpropagation through time): the graph rewrite.

``with_carried_state`` feeds each main-graph LSTM's initial state from new graph inputs and
outputs its final state, so that a trainer can feed one step's final state as the next step's
initial state. Protos only; nothing here imports onnxruntime.
"""

from __future__ import annotations

import dataclasses

import onnx
import onnx.helper

from ortlstm.graphs.graph_utils import prune_to_outputs, unique_name


@dataclasses.dataclass(frozen=True)
class CarriedState:
    """One LSTM node whose final state becomes its next initial state.

    Attributes:
        node: The LSTM node's name (or ``lstm_<index>``).
        initial_h: The graph input that feeds its initial_h (``initial_c`` likewise).
        initial_c: See ``initial_h``.
        final_h: The output carrying its Y_h (``final_c``: Y_c) to the next step.
        final_c: See ``final_h``.
        sequence: Its input X (the batch size is read from X's shape).
        layout: The node's layout (0: state ``[num_directions, batch, hidden]``; 1: ``[batch, ...]``).
        num_directions: 1, or 2 when bidirectional.
        hidden_size: The node's hidden size.
        elem_type: The state's ONNX element type.
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
    """The model with each main-graph LSTM's initial state fed by new inputs and its final state output.

    Feeding the final state back as the next step's input (a graph input, not a parameter) carries
    the state without a gradient through the boundary, as torch's ``h.detach()`` does. Whatever fed
    initial_h/initial_c before (nothing, zeros, an input) is replaced; inputs and nodes left unused
    are removed.

    Raises:
        ValueError: The main graph has no ONNX LSTM node.
    """
    result = onnx.ModelProto()
    result.CopyFrom(model)
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
        if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx"):
            continue
        label = node.name or f"lstm_{index}"
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
        direction = attributes.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        weight = node.input[1]
        elem_type = initializers[weight].data_type if weight in initializers else declared.get(weight, 0)
        while len(node.input) < 7:
            node.input.append("")
        while len(node.output) < 3:
            node.output.append("")
        state = CarriedState(
            node=label,
            initial_h=fresh(f"{label}.initial_h"),
            initial_c=fresh(f"{label}.initial_c"),
            final_h=node.output[1] or fresh(f"{label}.Y_h"),
            final_c=node.output[2] or fresh(f"{label}.Y_c"),
            sequence=node.input[0],
            layout=int(attributes.get("layout", 0)),
            num_directions=2 if direction == "bidirectional" else 1,
            hidden_size=int(attributes["hidden_size"]),
            elem_type=elem_type or onnx.TensorProto.FLOAT,
        )
        node.input[5], node.input[6] = state.initial_h, state.initial_c
        node.output[1], node.output[2] = state.final_h, state.final_c
        for name in (state.initial_h, state.initial_c):
            graph.input.append(onnx.helper.make_tensor_value_info(name, state.elem_type, list(state.shape(None))))  # type: ignore[arg-type]
        for name in (state.final_h, state.final_c):
            if name not in outputs:
                graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
        carried.append(state)
    if not carried:
        raise ValueError("stateful=True: the model's main graph has no ONNX LSTM node whose state could be carried")
    prune_to_outputs(graph, initializers=False, inputs=True)
    return result, tuple(carried)

