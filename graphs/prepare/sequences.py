"""Sequence ops (ai.onnx) on a parameter's path: resolved into tensor ops before differentiation.

torch's dynamo exporter with ``optimize=False`` writes ``torch.split`` and ``torch.chunk`` as a
``SplitToSequence`` read by ``SequenceAt`` at constant positions (``torch.unbind`` becomes Slice
and Squeeze). A sequence's gradient would be a sequence, summed element by element over its
readers; instead, wherever a sequence's structure is known when the model is prepared (how many
tensors it holds and which value sits at each position), ``resolve_static_sequences`` rewrites
the reads of it into tensor ops whose gradient rules exist:

- ``SplitToSequence(X, split)`` gets a ``Split`` beside it when the piece count is static (a 1-D
  ``split`` of static length, its values constant or not; a constant scalar ``split`` or none at
  all with X's extent along ``axis`` static; without ``split`` and with ``keepdims=0`` each piece
  is squeezed). A scalar ``split`` (constant or not) or none on an axis of dynamic extent (torch's
  chunk of a dynamic dim) is read piece by piece instead: each constant ``SequenceAt`` position
  becomes a ``Slice``, counted from the back at run time for a negative position;
- ``SequenceConstruct``, ``SequenceEmpty``, ``SequenceInsert`` and ``SequenceErase`` (constant or
  default positions) are followed as lists of values;
- ``SequenceAt`` at a constant position becomes an ``Identity`` of that value,
  ``ConcatFromSequence`` a ``Concat`` (of ``Unsqueeze``-d values for ``new_axis=1``), and
  ``SequenceLength`` a constant.

The sequence ops themselves stay until nothing reads them (``prepare_model`` drops dead nodes), so
a read left as it was (a run-time position; a ConcatFromSequence or SequenceLength of chunks
whose count is dynamic) still finds its sequence; on a parameter's path it is refused with the
hint registered below. Protos only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnx.helper

from ortlstm.graphs.autodiff.registry import register_missing_rule_hint
from ortlstm.graphs.emit.emitter import MIN_OPSET, GraphEmitter, infer_value_types, onnx_opset, used_names

SEQUENCE_OPS = (
    "SplitToSequence",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceInsert",
    "SequenceErase",
    "SequenceLength",
    "ConcatFromSequence",
)
"""The ai.onnx sequence ops ``resolve_static_sequences`` follows or rewrites."""

for _op_type in SEQUENCE_OPS:
    register_missing_rule_hint(
        "",
        _op_type,
        "Sequences are differentiated only where prepare_model resolves them into tensors: SequenceAt and "
        "SequenceInsert/Erase positions must be constants, and ConcatFromSequence or SequenceLength of a "
        "SplitToSequence needs its piece count static (a split of static length, or a static extent of the "
        "split axis: fix it with build_training_models(..., fixed_shapes={input: dims})). "
        "Exporting with torch.onnx.export(..., dynamo=True) and the default optimize=True writes Split instead.",
    )


@dataclasses.dataclass(frozen=True)
class _Chunks:
    """A SplitToSequence into equal chunks whose count is known at run time only.

    Attributes:
        data: The split value.
        axis: The split axis.
        size: The chunk size: an int, or a run-time scalar's name.
        squeeze: Drop the axis from each piece (no split and keepdims=0).
    """

    data: str
    axis: int
    size: int | str
    squeeze: bool


class _Rewriter:
    """Rewrites one graph's sequence reads; see ``resolve_static_sequences``."""

    def __init__(self, model: onnx.ModelProto, constants: Mapping[str, np.ndarray]) -> None:
        self.graph = model.graph
        self.types = infer_value_types(model)
        self.emitter = GraphEmitter(onnx_opset(model), used_names(model.graph), self.types)
        self.constants = constants
        self.contents: dict[str, list[str]] = {}  # sequence -> the values it holds, in order
        self.chunks: dict[str, _Chunks] = {}  # sequence -> how to cut any one piece (count not static)
        self.rewritten: list[str] = []

    def int_constant(self, name: str) -> np.ndarray | None:
        value = self.constants.get(name) if name else None
        if value is None or np.asarray(value).dtype.kind not in "iu":
            return None
        return np.asarray(value, dtype=np.int64)

    def position(
        self, node: onnx.NodeProto, index: int, length: int, default: int, *, insert: bool = False, counted: bool = True
    ) -> int | None:
        """A constant position input, made non-negative unless not ``counted``; None if run-time or out of range."""
        name = node.input[index] if index < len(node.input) else ""
        if not name:
            found = default
        else:
            value = self.int_constant(name)
            if value is None or value.size != 1:
                return None
            found = int(value.reshape(-1)[0])
        if not counted:
            return found
        if found < 0:  # counted from the back (SequenceInsert's too: -1 inserts before the last)
            found += length
        return found if 0 <= found < length + int(insert) else None

    # ---- producers: followed as lists, the node kept ----------------------------------------

    def split_to_sequence(self, node: onnx.NodeProto) -> None:
        """A Split beside the node when the piece count is static; else its pieces read one by one."""
        e, x = self.emitter, node.input[0]
        axis = int(_attributes(node).get("axis", 0))
        split = node.input[1] if len(node.input) > 1 else ""
        value = self.int_constant(split)
        split_type = self.types.get(split) if split else None
        rank = value.ndim if value is not None else (split_type.rank if split_type is not None else None)
        if split and rank == 1:  # sizes: constant, or run-time values of a static count
            static = split_type.static_shape if split_type is not None else None
            count = len(value) if value is not None else (static[0] if static else None)
            sizes = e.ints([int(size) for size in value]) if value is not None else split
        elif split and rank != 0:
            return
        else:  # a chunk size (the last piece may be shorter), or none: pieces of 1
            chunk: int | str = int(value.reshape(-1)[0]) if value is not None else (split or 1)
            squeeze = not split and not int(_attributes(node).get("keepdims", 1))
            extent = self.extent(x, axis)
            if not (isinstance(chunk, int) and isinstance(extent, int)):
                self.chunks[node.output[0]] = _Chunks(x, axis, chunk, squeeze)
                self.rewritten.append(node.name)
                return
            if chunk <= 0:
                return
            count = -(-extent // chunk)
            sizes = e.ints([chunk] * (extent // chunk) + ([extent % chunk] if extent % chunk else []))
        if not count:
            return
        pieces = e.op_multi(
            "Split",
            [x, sizes],
            outputs=[e.fresh(f"{node.output[0]}_piece{index}") for index in range(count)],
            name=f"{node.name or node.output[0]}/Split",
            axis=axis,
        )
        if not split and not int(_attributes(node).get("keepdims", 1)):
            pieces = [e.squeeze(piece, [axis]) for piece in pieces]
        self.contents[node.output[0]] = pieces
        self.rewritten.append(node.name)

    def extent(self, value: str, axis: int) -> int | str | None:
        found = self.types.get(value)
        shape = found.shape if found is not None else None
        return shape[axis] if shape is not None and -len(shape) <= axis < len(shape) else None

    def chunk_at(self, chunks: _Chunks, position: int) -> str:
        """Piece ``position`` of a split into chunks whose count is known at run time only: a Slice."""
        e, x, axis = self.emitter, chunks.data, chunks.axis
        if isinstance(chunks.size, int) and position >= 0:
            start, end = e.ints([position * chunks.size]), e.ints([(position + 1) * chunks.size])
        else:
            size = e.ints([chunks.size]) if isinstance(chunks.size, int) else self.one_int64(chunks.size)
            if position >= 0:
                start = e.op("Mul", [size, e.ints([position])])
            else:  # from the back: count = ceil(extent / size)
                extent = e.op("Gather", [e.shape(x), e.ints([axis])])
                count = e.op("Div", [e.op("Add", [extent, e.op("Sub", [size, e.ints([1])])]), size])
                start = e.op("Mul", [e.op("Add", [count, e.ints([position])]), size])
            end = e.op("Add", [start, size])
        piece = e.op("Slice", [x, start, end, e.ints([axis])])
        return e.squeeze(piece, [axis]) if chunks.squeeze else piece

    def one_int64(self, value: str) -> str:
        """A run-time scalar as a [1] int64 value."""
        e = self.emitter
        if e.elem_type(value) not in (0, onnx.TensorProto.INT64):
            value = e.op("Cast", [value], to=onnx.TensorProto.INT64)
        return e.op("Reshape", [value, e.ints([1])])

    def follow(self, node: onnx.NodeProto) -> None:
        """Records what a SequenceConstruct / Empty / Insert / Erase holds, when that is known."""
        if node.op_type == "SequenceConstruct":
            self.contents[node.output[0]] = list(node.input)
        elif node.op_type == "SequenceEmpty":
            self.contents[node.output[0]] = []
        elif node.input[0] in self.contents:
            held = list(self.contents[node.input[0]])
            if node.op_type == "SequenceInsert":
                at = self.position(node, 2, len(held), len(held), insert=True)
                if at is None:
                    return
                held.insert(at, node.input[1])
            else:  # SequenceErase
                at = self.position(node, 1, len(held), -1)
                if at is None:
                    return
                del held[at]
            self.contents[node.output[0]] = held

    # ---- readers: replaced when what they read is known --------------------------------------

    def read(self, node: onnx.NodeProto) -> bool:
        """Replaces a SequenceAt / ConcatFromSequence / SequenceLength of a known sequence; False if not."""
        e, output, name = self.emitter, node.output[0], node.name or node.output[0]
        chunks = self.chunks.get(node.input[0])
        if chunks is not None and node.op_type == "SequenceAt":
            at = self.position(node, 1, 0, 0, counted=False)
            if at is None:
                return False
            e.op("Identity", [self.chunk_at(chunks, at)], outputs=[output], name=name)
            self.rewritten.append(node.name)
            return True
        held = self.contents.get(node.input[0])
        if held is None:
            return False
        if node.op_type == "SequenceLength":
            e.op("Identity", [e.ints(len(held))], outputs=[output], name=name)
        elif node.op_type == "SequenceAt":
            at = self.position(node, 1, len(held), 0)
            if at is None:
                return False
            e.op("Identity", [held[at]], outputs=[output], name=name)
        else:  # ConcatFromSequence
            if not held:
                return False
            axis = int(_attributes(node)["axis"])
            values = held
            if int(_attributes(node).get("new_axis", 0)):
                values = [e.unsqueeze(value, [axis]) for value in held]
            e.op("Concat", values, outputs=[output], name=name, axis=axis)
        self.rewritten.append(node.name)
        return True

    def run(self) -> tuple[str, ...]:
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.node:
            is_onnx = node.domain in ("", "ai.onnx")
            if not (
                is_onnx and node.op_type in ("SequenceAt", "ConcatFromSequence", "SequenceLength") and self.read(node)
            ):
                nodes.append(node)
                if is_onnx and node.op_type == "SplitToSequence":
                    self.split_to_sequence(node)
                elif is_onnx and node.op_type in (
                    "SequenceConstruct",
                    "SequenceEmpty",
                    "SequenceInsert",
                    "SequenceErase",
                ):
                    self.follow(node)
            nodes.extend(self.emitter.nodes)  # what the node became, or what follows it
            del self.emitter.nodes[:]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        self.graph.initializer.extend(self.emitter.initializers)
        return tuple(self.rewritten)


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}


def resolve_static_sequences(model: onnx.ModelProto, constants: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """Rewrites, in place, the reads of sequences whose structure is static into tensor ops (module docstring).

    Args:
        model: The model; its main graph is changed in place. Nodes must be in topological order.
            Models older than ai.onnx opset 13 (which the training builders refuse) are left as they are.
        constants: Values known to be constant (positions, split sizes), by name.

    Returns:
        The names of the nodes rewritten or given a tensor form (SplitToSequence nodes stay beside
        their Split until nothing reads them).
    """
    if onnx_opset(model) < MIN_OPSET:
        return ()
    return _Rewriter(model, constants).run()
