"""``free_export_dims``: the batch and sequence dims an exporter fixed, made symbolic where nothing depends on them.

``torch.onnx.export(model, (x,), f)`` declares the example input's shape unless told otherwise
(``dynamic_shapes`` for dynamo, the default; ``dynamic_axes`` for ``dynamo=False``), and writes
the example's batch into the graph: dynamo's zero initial states ``[layers*dirs, 8, H]`` as
initializers and ``x.view(x.shape[0], -1)`` as a Reshape to ``[8, -1]``; TorchScript's zero
states as ``Expand`` of a ``[1, 8, H]`` constant to a shape computed from the input. The torch
model trains with any batch, so the Trainer should too: each such dim becomes symbolic, the
constants that carry it are rewritten to follow it, and the dim stays fixed (with the node that
fixes it recorded, for the input check's message) wherever that is not provably right.

The dims tried, in a torch export only (other producers declare a positive dim on purpose): the
batch of every input (axis 0, torch's convention, or the axis that reaches an RNN's batch axis
through Transposes) and the sequence axis of an input that reaches an RNN's ``X``. The
rewrites, each exact for the exported size and following the dim for any other:

- a ``Reshape`` constant entry equal to the size at the position of the symbolic dim, every entry
  before it copying the input's dim, becomes 0 (copy that dim; ``x.view(x.shape[0], -1)``);
  an entry that merges whole input dims, the dim among them, becomes -1 (``x.reshape(B * T,
  F)``, crnn.pytorch's ``view(T * b, h)``), and a later Reshape that splits that merged dim
  again reads the freed dims' sizes from the graph input at run time (``.view(T, b, -1)``);
- an ``Expand`` of a constant that holds the size on an axis and is the same along it, to a shape
  computed at run time, expands the constant's single slice instead (TorchScript's zero states);
  it is kept only where the result has the dim, as the checks below require;
- a constant operand of ``Add``/``Sub``/``Mul``/``Div``/``Max``/``Min`` that holds the size where
  the other operand has the dim, the same along it, keeps one slice (broadcasting repeats it:
  a zero state folded through ``h0 @ R``, ``[1, 8, H]``);
- an RNN's initial state that is provably zeros (a zeros initializer or ``Constant``, an
  ``Expand`` or ``ConstantOfShape`` of zeros) is omitted, which ONNX defines as zeros.

Then shape inference runs with the symbolic dims, and a dim is freed only when no node loses it
(its inputs carry the dim, its outputs do not: a Reshape to a constant, a Split of fixed sizes, a
broadcast with a batch-sized constant), except the ops that consume a dim whatever its size
(``Shape``, reductions, a ``Gather`` of one index: ``y[:, -1]``), no RNN reads a batch-sized
initial state, and every value keeps the shape it had for the exported size. Otherwise the
dim that the first such node loses stays fixed, as exported, and the others are tried again.
Nothing that may be trained is rewritten (torch's parameters and the folds of them, e.g. a
trained initial state expanded to the batch): its trained values go back into the export.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs.carried_state import STATE_PORTS
from ortlstm.graphs.emit.checks import make_checked_node
from ortlstm.graphs.emit.emitter import FLOAT_TYPES, ValueType, infer_value_types, onnx_opset
from ortlstm.graphs.emit.graph_utils import subgraph_reads, unique_name, used_names
from ortlstm.graphs.export_metadata import read_torch_origins
from ortlstm.graphs.prepare.folding import constant_value
from ortlstm.graphs.prepare.state import Preparation, is_onnx

TORCH_PRODUCER = "pytorch"  # torch.onnx.export's producer_name, dynamo and TorchScript alike
EXPORT_DIMS_KEY = "ortlstm.export_dims"
"""The metadata key of the training models that lists the dims the export fixed (JSON)."""

_RNN_STATES = {op: tuple(into for into, _ in ports) for op, ports in STATE_PORTS.items()}  # initial-state inputs
_CONSUMING_OPS = frozenset(
    {"Shape", "Size", "ArgMax", "ArgMin", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax"}
    | {"ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"}
)  # ops whose result drops a dim whatever its size
_ZERO_KEEPING_OPS = frozenset({"Expand", "Slice", "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Cast"})
_BROADCASTING_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})
_MAX_PASSES = 8  # rewrites feed later rewrites (a Reshape's output reaches the next RNN): a few passes


@dataclasses.dataclass(frozen=True)
class ExportDim:
    """One input dim the export fixed: freed (symbolic in the training models) or kept.

    Attributes:
        input: The graph input.
        axis: The dim.
        size: The size the export fixed.
        kind: ``batch`` or ``length`` (an RNN's sequence axis).
        symbol: The dim's name in the training models when freed.
        fixed_by: The node that depends on the size (``'name' (Op)``), when kept; None when freed.
    """

    input: str
    axis: int
    size: int
    kind: str
    symbol: str
    fixed_by: str | None = None

    @property
    def freed(self) -> bool:
        """Whether the training models take any size here."""
        return self.fixed_by is None

    def advice(self) -> str:
        """Why the dim is fixed and the export argument that frees it, for messages."""
        word = "batch" if self.kind == "batch" else "seq_len"
        condition = "" if self.kind == "batch" else "if the torch model takes other lengths, "
        return (
            f"the model was exported with a fixed {self.kind} of {self.size} at dim {self.axis} (torch.onnx.export's "
            f"default: the example input's shape), and node {self.fixed_by} depends on it; {condition}re-export with "
            f'dynamic_shapes={{"{self.input}": {{{self.axis}: torch.export.Dim("{word}")}}}} (dynamo, the default) '
            f'or dynamic_axes={{"{self.input}": {{{self.axis}: "{word}"}}}} (dynamo=False)'
        )


def record_export_dims(model: onnx.ModelProto, dims: Sequence[ExportDim]) -> None:
    """Writes ``dims`` into the model's metadata (the input check reads them back)."""
    if dims:
        entry = model.metadata_props.add()
        entry.key = EXPORT_DIMS_KEY
        entry.value = json.dumps([dataclasses.asdict(dim) for dim in dims])


def read_export_dims(model: onnx.ModelProto) -> tuple[ExportDim, ...]:
    """The dims ``record_export_dims`` wrote into a training model (none for an older model)."""
    text = next((prop.value for prop in model.metadata_props if prop.key == EXPORT_DIMS_KEY), "[]")
    return tuple(ExportDim(**entry) for entry in json.loads(text))


def free_export_dims(state: Preparation) -> None:
    """Makes the batch and sequence dims the export fixed symbolic where nothing depends on them.

    The module docstring says which dims, how the graph is made to follow them and when one stays
    fixed; ``state.export_dims`` records each.
    """
    dims = _candidates(state)
    if not dims:
        return
    static = infer_value_types(state.model)
    trainable = _trainable(state)
    blamed: dict[str, str] = {}
    active = list(dims)
    work = state.model
    while active:
        work = copy.deepcopy(state.model)
        _declare(work.graph, active)
        trial = _Trial(
            {dim.symbol: dim.size for dim in active}, {dim.symbol: (dim.input, dim.axis) for dim in active}, static
        )
        types = _rewrite(work, trial, _Constants(work.graph, trainable))
        fixing = _fixing_nodes(work.graph, types, trial)
        if not fixing:
            break
        # One dim at a time, the first node's (a length before a batch): a node that loses one freed
        # dim may lose the others with it (a Linear over T * F leaves shape inference without a shape).
        first = [symbol for symbol, label in fixing.items() if label == next(iter(fixing.values()))]
        kinds = {dim.symbol: dim.kind for dim in active}
        dropped = next((symbol for symbol in first if kinds[symbol] == "length"), first[0])
        blamed[dropped] = fixing[dropped]
        active = [dim for dim in active if dim.symbol != dropped]
    if active:
        kept = [info for info in work.graph.value_info if info.name not in trial.declared]
        del work.graph.value_info[:]
        work.graph.value_info.extend(kept)  # a merged dim's name means nothing after this rewrite
        state.model = work
    state.export_dims = tuple(dataclasses.replace(dim, fixed_by=blamed.get(dim.symbol)) for dim in dims)


@dataclasses.dataclass
class _Trial:
    """The dims freed in one trial: their exported sizes, where each is read, and the merged dims.

    Attributes:
        sizes: Each freed dim's symbol -> its exported size.
        sources: Each symbol -> a graph input and axis that has it (its size at run time).
        static: The shapes of the export, every dim fixed.
        merged: Input dims merged into one by a Reshape (``x.reshape(B * T, F)``), a freed one
            among them: the name declared for it -> those dims, in order.
        declared: The values whose shape a merge declared (``value_info``), undone at the end.
    """

    sizes: dict[str, int]
    sources: dict[str, tuple[str, int]]
    static: Mapping[str, ValueType]
    merged: dict[str, tuple[int | str, ...]] = dataclasses.field(default_factory=dict)
    declared: set[str] = dataclasses.field(default_factory=set)

    def carried(self, dim: int | str | None) -> set[str]:
        """The freed dims a dim carries: itself, or those merged into it."""
        if not isinstance(dim, str):
            return set()
        if dim in self.sizes:
            return {dim}
        return {part for part in self.merged.get(dim, ()) if isinstance(part, str)}

    def exported(self, dim: str) -> int:
        """The exported size of a freed or merged dim."""
        return int(np.prod([part if isinstance(part, int) else self.sizes[part] for part in self.merged[dim]])) if (
            dim in self.merged
        ) else self.sizes[dim]


def _candidates(state: Preparation) -> list[ExportDim]:
    """The static batch and sequence dims of a torch export's inputs that the caller did not fix (``fixed_shapes``).

    Only torch.onnx.export fixes a dim by default; other producers declare a positive dim on
    purpose (paddle2onnx writes -1 for a dynamic one), and it stays as declared.
    """
    if state.source.producer_name != TORCH_PRODUCER:
        return []
    graph = state.graph
    user_fixed = {
        (name, axis)
        for name, dims in (state.fixed_shapes or {}).items()
        for axis, dim in enumerate(dims)
        if isinstance(dim, int)
    }
    rnn_axes = _rnn_axes(graph)
    taken = used_names(graph) | {
        dim.dim_param
        for value in graph.input
        if value.type.HasField("tensor_type")
        for dim in value.type.tensor_type.shape.dim
        if dim.HasField("dim_param")
    }
    symbols: dict[tuple[str, int], str] = {}  # one symbol per kind and size: the inputs share their batch
    found: list[ExportDim] = []
    weights = {init.name for init in graph.initializer}  # an IR < 4 model lists its weights as inputs too
    states = {  # a stateful trainer's carried state: its batch is the sequence's, checked on the RNN
        name
        for node in graph.node
        if is_onnx(node)
        for index in _RNN_STATES.get(node.op_type, ())
        for name in node.input[index : index + 1]
    }
    for value in graph.input:
        if value.name in weights | states or not value.type.tensor_type.HasField("shape"):
            continue
        shape = value.type.tensor_type.shape.dim
        batch_axis, length_axis = rnn_axes.get(value.name, (0, None))
        for axis, kind in ((batch_axis, "batch"), (length_axis, "length")):
            if axis is None or axis >= len(shape) or (value.name, axis) in user_fixed:
                continue
            if not shape[axis].HasField("dim_value") or shape[axis].dim_value <= 0:
                continue
            size = int(shape[axis].dim_value)
            if (kind, size) not in symbols:
                symbols[(kind, size)] = unique_name("batch" if kind == "batch" else "sequence", taken)
            found.append(ExportDim(value.name, axis, size, kind, symbols[(kind, size)]))
    return found


def _rnn_axes(graph: onnx.GraphProto) -> dict[str, tuple[int, int]]:
    """Per graph input that reaches an RNN's X through Transposes: its (batch, sequence) axes."""
    producers = {output: node for node in graph.node for output in node.output}
    inputs = {value.name for value in graph.input}
    axes: dict[str, tuple[int, int]] = {}
    for node in graph.node:
        if not (is_onnx(node) and node.op_type in _RNN_STATES) or not node.input:
            continue
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        batch, length = (1, 0) if layout == 0 else (0, 1)
        name = node.input[0]
        while name in producers and producers[name].op_type == "Transpose" and is_onnx(producers[name]):
            transpose = producers[name]
            perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
            if perm is None:
                break
            batch, length, name = perm[batch], perm[length], transpose.input[0]
        if name in inputs:
            axes.setdefault(name, (batch, length))
    return axes


def _declare(graph: onnx.GraphProto, dims: Sequence[ExportDim]) -> None:
    """Declares each dim of a trial symbolic on its graph input."""
    inputs = {value.name: value for value in graph.input}
    for dim in dims:
        target = inputs[dim.input].type.tensor_type.shape.dim[dim.axis]
        target.Clear()
        target.dim_param = dim.symbol


def _trainable(state: Preparation) -> set[str]:
    """The initializers that may be trained, which no rule rewrites (``choose_candidates``'s choice).

    Torch's parameters and the folds of them, or without the export's metadata every float
    initializer of rank >= 1; and those the caller keeps. A parameter ``[8, H]`` makes a torch
    model take batches of 8 only; a slice of it would train as something else, and the trained
    values go back into the model by name and shape.
    """
    origins = read_torch_origins(state.source)
    if origins is not None:
        return set(origins.sources) | state.kept
    own = {init.name for init in state.graph.initializer if init.data_type in FLOAT_TYPES and init.dims}
    return own | state.kept


def _rewrite(model: onnx.ModelProto, trial: _Trial, constants: _Constants) -> dict[str, ValueType]:
    """Rewrites the constants that carry a freed dim until none changes; returns the inferred types."""
    types = infer_value_types(model)
    sizes = trial.sizes
    opset = onnx_opset(model)
    for _ in range(_MAX_PASSES):
        constants = _Constants(model.graph, constants.trainable)
        changed = False
        inserted: dict[str, list[onnx.NodeProto]] = {}  # nodes to put before the node of that first output
        for node in list(model.graph.node):
            if not is_onnx(node):
                continue
            if node.op_type == "Reshape":
                changed |= (
                    _follow_in_reshape(node, types, sizes, constants)
                    or _merge_in_reshape(node, types, trial, constants)
                    or _split_in_reshape(node, types, trial, constants, inserted, opset)
                )
            elif node.op_type == "Expand":
                changed |= _expand_one_slice(node, sizes, constants)
            elif node.op_type in _RNN_STATES:
                changed |= _omit_zero_states(node, types, sizes, constants)
            elif node.op_type in _BROADCASTING_OPS:
                changed |= _broadcast_one_slice(node, types, sizes, constants)
        if inserted:
            nodes = list(model.graph.node)
            del model.graph.node[:]
            for node in nodes:
                model.graph.node.extend([*inserted.get(node.output[0], []), node])
        if not changed:
            break
        types = infer_value_types(model)
    return types


class _Constants:
    """The graph's constant tensors (initializers, ``Constant`` nodes) by name, read when asked.

    Attributes:
        trainable: Initializers that may be trained: ``value`` never returns them (no rule rewrites them).
    """

    def __init__(self, graph: onnx.GraphProto, trainable: set[str] | frozenset[str] = frozenset()) -> None:
        self.graph = graph
        self.trainable = trainable
        self._tensors = {init.name: init for init in graph.initializer}
        self._nodes = {node.output[0]: node for node in graph.node if is_onnx(node) and node.op_type == "Constant"}
        self._producers = {output: node for node in graph.node for output in node.output}
        self.taken = used_names(graph)

    def value(self, name: str) -> np.ndarray | None:
        """The constant's value; None for a computed value or one that may be trained."""
        if name in self.trainable:
            return None
        if name in self._tensors:
            return onnx.numpy_helper.to_array(self._tensors[name])
        return constant_value(self._nodes[name]) if name in self._nodes else None

    def is_zeros(self, name: str) -> bool:
        """Whether the value is provably all zeros: a zeros constant, ConstantOfShape of 0, a Slice of zeros..."""
        value = self.value(name)
        if value is not None:
            return not np.any(value)
        node = self._producers.get(name)
        if node is None or not is_onnx(node):
            return False
        if node.op_type in _ZERO_KEEPING_OPS:  # ops that move or repeat elements keep zeros zeros
            return self.is_zeros(node.input[0])
        if node.op_type == "ConstantOfShape":
            fill = next((a.t for a in node.attribute if a.name == "value"), None)
            return fill is None or not np.any(onnx.numpy_helper.to_array(fill))
        return False

    def add(self, base: str, value: np.ndarray) -> str:
        """A new initializer holding ``value``; its name."""
        name = unique_name(base, self.taken)
        self.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
        self._tensors[name] = self.graph.initializer[-1]
        return name


def _follow_in_reshape(
    node: onnx.NodeProto, types: Mapping[str, ValueType], sizes: Mapping[str, int], constants: _Constants
) -> bool:
    """A Reshape constant's entry at a freed dim's position, with every entry before it a copy, becomes 0.

    dynamo writes ``allowzero=1``, under which 0 is a size; it means nothing unless the constant
    has a 0, so a constant without one drops it (``_set_reshape_shape``).
    """
    entries, data = _shape_entries(node, constants), types.get(node.input[0])
    if entries is None or data is None or data.shape is None:
        return False
    given = list(entries)
    for position, (dim, entry) in enumerate(zip(data.shape, given, strict=False)):
        if isinstance(dim, str) and sizes.get(dim) == entry and _copies(data.shape, entries, position):
            entries[position] = 0
    if entries == given:
        return False
    _set_reshape_shape(node, constants.add(f"{node.input[1]}_following", np.asarray(entries, dtype=np.int64)))
    return True


def _merge_in_reshape(
    node: onnx.NodeProto, types: Mapping[str, ValueType], trial: _Trial, constants: _Constants
) -> bool:
    """``x.reshape(B * T, F)``: an entry that merges whole input dims, a freed one among them, becomes -1.

    The entries before it copy the input's dims, and its exported size is the product of the
    input dims from its position on (``B * T``, crnn.pytorch's time-major ``T * B``): so -1 (the
    one left, when no other entry is -1) is that product for any size. The output's dim gets a
    name of its own (``batch*6``), declared, so that a Reshape that splits it again
    (``_split_in_reshape``) knows what it holds.
    """
    entries, data = _shape_entries(node, constants), types.get(node.input[0])
    out = trial.static.get(node.output[0])
    if entries is None or data is None or data.shape is None or node.output[0] in trial.declared:
        return False
    if out is None or out.static_shape is None or len(out.static_shape) != len(entries):
        return False
    for start in range(min(len(entries), len(data.shape))):
        if not _copies(data.shape, entries, start):
            return False
        if entries[start] == 0:
            continue  # a copy, not a merge
        group, product = [], 1
        for dim in data.shape[start:]:
            size = dim if isinstance(dim, int) else trial.sizes.get(dim)  # type: ignore[arg-type]
            if size is None or product >= out.static_shape[start]:
                break
            group.append(dim)
            product *= size
        freed = any(isinstance(dim, str) for dim in group)
        if len(group) > 1 and freed and product == out.static_shape[start]:
            if entries[start] != -1 and -1 in entries:
                return False
            merged = "*".join(str(dim) for dim in group)
            trial.merged[merged] = tuple(group)  # type: ignore[arg-type]
            entries[start] = -1
            _set_reshape_shape(node, constants.add(f"{node.input[1]}_following", np.asarray(entries, dtype=np.int64)))
            dims = [*data.shape[:start], merged, *out.static_shape[start + 1 :]]  # before: copies of the input's
            constants.graph.value_info.append(onnx.helper.make_tensor_value_info(node.output[0], out.elem_type, dims))
            trial.declared.add(node.output[0])
            return True
    return False


def _split_in_reshape(
    node: onnx.NodeProto,
    types: Mapping[str, ValueType],
    trial: _Trial,
    constants: _Constants,
    inserted: dict[str, list[onnx.NodeProto]],
    opset: int,
) -> bool:
    """``y.reshape(B, T, H)`` of a merged dim: the entries of its freed dims read their sizes at run time.

    The entries before it copy the input's dims and the entries from its position on are the
    merged dims' exported sizes, in order: each freed one becomes ``Gather(Shape(input), axis)``
    of the graph input the dim comes from (a shape ``Concat`` of those and the constants).
    """
    entries, data = _shape_entries(node, constants), types.get(node.input[0])
    if entries is None or data is None or data.shape is None:
        return False
    position = next((i for i, dim in enumerate(data.shape[: len(entries)]) if dim in trial.merged), None)
    if position is None or not _copies(data.shape, entries, position):
        return False
    group = trial.merged[data.shape[position]]  # type: ignore[index]
    exported = [dim if isinstance(dim, int) else trial.sizes[dim] for dim in group]
    if entries[position : position + len(group)] != exported:
        return False
    pieces: list[str] = []  # the new shape, in order: constants and the freed dims' sizes
    nodes: list[onnx.NodeProto] = []
    constant: list[int] = []
    for index, entry in enumerate(entries):
        dim = group[index - position] if position <= index < position + len(group) else None
        if not isinstance(dim, str):
            constant.append(entry)
            continue
        if constant:
            pieces.append(constants.add(f"{node.input[1]}_part", np.asarray(constant, dtype=np.int64)))
            constant = []
        source, axis = trial.sources[dim]
        shape_of, size = (unique_name(f"{node.input[1]}_{part}", constants.taken) for part in ("input_shape", dim))
        index_name = constants.add(f"{dim}_axis", np.array([axis]))
        nodes += [
            make_checked_node(opset, "Shape", [source], [shape_of]),
            make_checked_node(opset, "Gather", [shape_of, index_name], [size]),
        ]
        pieces.append(size)
    if constant:
        pieces.append(constants.add(f"{node.input[1]}_part", np.asarray(constant, dtype=np.int64)))
    following = unique_name(f"{node.input[1]}_following", constants.taken)
    nodes.append(make_checked_node(opset, "Concat", pieces, [following], axis=0))
    inserted.setdefault(node.output[0], []).extend(nodes)
    _set_reshape_shape(node, following)
    return True


def _shape_entries(node: onnx.NodeProto, constants: _Constants) -> list[int] | None:
    """A Reshape's constant shape, or None: computed, or holding a 0 that ``allowzero=1`` makes a size."""
    shape = constants.value(node.input[1]) if len(node.input) > 1 else None
    if shape is None or shape.ndim != 1:
        return None
    allowzero = any(attribute.name == "allowzero" and attribute.i for attribute in node.attribute)
    return None if allowzero and not np.all(shape) else [int(entry) for entry in shape]


def _copies(data: Sequence[int | str | None], entries: Sequence[int], position: int) -> bool:
    """Whether each Reshape entry before ``position`` keeps the input's dim (0, or the same static size)."""
    return all(entries[i] == 0 or (isinstance(data[i], int) and data[i] == entries[i]) for i in range(position))


def _set_reshape_shape(node: onnx.NodeProto, shape: str) -> None:
    """Points a Reshape at a new shape, 0 copying a dim (dynamo's ``allowzero=1`` is dropped: it had no 0)."""
    node.input[1] = shape
    kept = [attribute for attribute in node.attribute if attribute.name != "allowzero"]
    del node.attribute[:]
    node.attribute.extend(kept)


def _expand_one_slice(node: onnx.NodeProto, sizes: Mapping[str, int], constants: _Constants) -> bool:
    """An Expand of a constant to a computed shape expands one slice along each axis of a freed dim's size."""
    data = constants.value(node.input[0])
    if data is None or constants.value(node.input[1]) is not None:
        return False
    sliced = _one_slice(data, [axis for axis, extent in enumerate(data.shape) if extent in sizes.values()])
    if sliced.shape == data.shape:
        return False
    node.input[0] = constants.add(f"{node.input[0]}_slice", sliced)
    return True


def _freed_size(dim: int | str | None, sizes: Mapping[str, int]) -> int | None:
    """The exported size of a freed dim, else None."""
    return sizes.get(dim) if isinstance(dim, str) else None


def _one_slice(value: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """``value`` with each of ``axes`` along which it holds one slice repeated reduced to that slice."""
    for axis in axes:
        first = np.take(value, [0], axis=axis)
        if value.shape[axis] > 1 and np.array_equal(value, np.broadcast_to(first, value.shape)):
            value = first
    return value


def _broadcast_one_slice(
    node: onnx.NodeProto, types: Mapping[str, ValueType], sizes: Mapping[str, int], constants: _Constants
) -> bool:
    """A constant operand of the freed dim's size, the same along it, keeps one slice: broadcasting repeats it.

    A value folded from a zero initial state (``h0 @ R``, ``[1, 8, H]``) added to one that carries
    the batch gives the same sums from ``[1, 1, H]`` for 8 rows, and follows any other batch.
    """
    if len(node.input) != 2:
        return False
    changed = False
    for position, other in ((0, 1), (1, 0)):
        value, partner = constants.value(node.input[position]), types.get(node.input[other])
        if value is None or partner is None or partner.shape is None or value.ndim > len(partner.shape):
            continue
        aligned = partner.shape[len(partner.shape) - value.ndim :]  # broadcasting aligns the last axes
        axes = [axis for axis, extent in enumerate(value.shape) if _freed_size(aligned[axis], sizes) == extent]
        sliced = _one_slice(value, axes)
        if sliced.shape != value.shape:
            node.input[position] = constants.add(f"{node.input[position]}_slice", sliced)
            changed = True
    return changed


def _omit_zero_states(
    node: onnx.NodeProto, types: Mapping[str, ValueType], sizes: Mapping[str, int], constants: _Constants
) -> bool:
    """An RNN's initial state of zeros whose batch is a freed dim's size is omitted (ONNX: zeros)."""
    changed = False
    for index in _RNN_STATES[node.op_type]:
        if index < len(node.input) and node.input[index] and constants.is_zeros(node.input[index]):
            state = types.get(node.input[index])
            batch = _rnn_batch(node, state)
            if batch is not None and batch in sizes.values():
                node.input[index] = ""
                changed = True
    return changed


def _rnn_batch(node: onnx.NodeProto, value: ValueType | None) -> int | str | None:
    """The batch dim of an RNN's X or initial state (axis 1, or 0 with layout=1), when its shape is known."""
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    if value is None or value.shape is None or len(value.shape) != 3:
        return None
    return value.shape[1 if layout == 0 else 0]


def _fixing_nodes(graph: onnx.GraphProto, types: Mapping[str, ValueType], trial: _Trial) -> dict[str, str]:
    """Per freed dim that a node still depends on, the first such node (``'name' (Op)``)."""
    fixing: dict[str, str] = {}
    constants = _Constants(graph)
    graph_inputs = {value.name for value in graph.input}
    for index, node in enumerate(graph.node):
        label = f"{node.name or f'#{index}'!r} ({node.op_type})"
        reads = [*node.input, *subgraph_reads(node)]  # an If branch may read x from the graph around it
        carried_in = {dim for name in reads if name for dim in _symbols(types.get(name), trial)}
        carried_out = {dim for name in node.output if name for dim in _symbols(types.get(name), trial)}
        for symbol in sorted(carried_in - carried_out):
            if not _consumes(node, constants):
                fixing.setdefault(symbol, label)
        if is_onnx(node) and node.op_type in _RNN_STATES:
            batch = _rnn_batch(node, types.get(node.input[0]))
            states = [name for i, name in enumerate(node.input) if i in _RNN_STATES[node.op_type] and name]
            if batch in trial.sizes and any(not _follows(node, name, batch, types, graph_inputs) for name in states):
                fixing.setdefault(batch, label)
        for name in node.output:
            changed = _changed_shape(types.get(name), trial.static.get(name), trial)
            if changed is not None:
                fixing.setdefault(changed, label)
    return fixing


def _follows(
    node: onnx.NodeProto, state: str, batch: str, types: Mapping[str, ValueType], graph_inputs: set[str]
) -> bool:
    """Whether an RNN's initial state has the batch of its X: the same dim, or a graph input of unknown batch.

    A stateful trainer's carried state is an input ``[D, ?, H]`` that it feeds with X's batch.
    """
    dim = _rnn_batch(node, types.get(state))
    return dim == batch or (dim is None and state in graph_inputs)


def _symbols(value: ValueType | None, trial: _Trial) -> set[str]:
    """The freed dims a value carries (a merged dim carries its freed one)."""
    return {symbol for dim in (value.shape or ()) for symbol in trial.carried(dim)} if value else set()


def _consumes(node: onnx.NodeProto, constants: _Constants) -> bool:
    """Whether the node drops a dim whatever its size: Shape, a reduction, a Gather of one constant index."""
    if not is_onnx(node):
        return False
    if node.op_type in _CONSUMING_OPS:
        return True
    if node.op_type == "Gather" and len(node.input) > 1:
        index = constants.value(node.input[1])
        return index is not None and index.ndim == 0
    return False


def _changed_shape(value: ValueType | None, exported: ValueType | None, trial: _Trial) -> str | None:
    """A freed dim blamed when a value's shape differs from the exported one other than by freed dims."""
    sizes = trial.sizes
    if value is None or exported is None or value.shape is None or exported.shape is None:
        return None
    if len(value.shape) != len(exported.shape):
        return next(iter(sizes))
    for dim, before in zip(value.shape, exported.shape, strict=True):
        carried = sorted(trial.carried(dim))
        if carried:
            if isinstance(before, int) and before != trial.exported(dim):  # type: ignore[arg-type]
                return carried[0]
        elif isinstance(dim, int) and isinstance(before, int) and dim != before:
            return next((symbol for symbol, size in sizes.items() if size == before), next(iter(sizes)))
    return None
