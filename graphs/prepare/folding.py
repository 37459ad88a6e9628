"""The ``fold_constants`` rewrite of ``prepare_model``: constants, chosen branches and static shapes.

One pass walks the main graph's nodes in order and asks each fold in ``_FOLDS`` whether it
replaces the node; passes repeat until one changes nothing (a fold makes new constants, which
make more nodes foldable). Folding evaluates nodes with ``onnx.reference``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import onnx.reference

from ortlstm.graphs.emit.checks import make_checked_node
from ortlstm.graphs.emit.emitter import FLOAT_TYPES, ValueType, infer_value_types, onnx_opset
from ortlstm.graphs.emit.graph_utils import defined_names, rename_values, subgraphs, unique_name, used_names
from ortlstm.graphs.prepare.sequences import SEQUENCE_OPS
from ortlstm.graphs.prepare.state import Preparation, is_onnx

# Folding evaluates nodes in Python: never ops with side effects or randomness, never big outputs,
# never sequence ops (a folded sequence would become a tensor initializer; see resolve_static_sequences).
_NOT_FOLDED = frozenset(
    {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
) | frozenset(SEQUENCE_OPS)
_MAX_FOLDED_ELEMENTS = 1 << 16

# A Shape node's output -> (its input, start, end).
ShapeOf = tuple[str, int | None, int | None]


@dataclasses.dataclass
class _FoldPass:
    """One pass over the main graph: what the folds know and the nodes kept so far.

    Attributes:
        state: The preparation (its constants, candidates and graph).
        types: Static types inference gives at the start of the pass.
        taken: Every name in use, with those inlining creates in this pass.
        shape_of: ``Shape`` nodes kept in this pass, for the ``Gather``/``Size`` reads of them.
        kept: The nodes kept so far, in order.
        position: The index of the node being folded.
    """

    state: Preparation
    types: dict[str, ValueType]
    taken: set[str]
    shape_of: dict[str, ShapeOf] = dataclasses.field(default_factory=dict)
    kept: list[onnx.NodeProto] = dataclasses.field(default_factory=list)
    position: int = 0

    def set_constant(self, name: str, value: np.ndarray) -> None:
        """Makes ``name`` an initializer of ``value``, known to later folds."""
        self.state.constants[name] = value
        self.state.graph.initializer.append(onnx.numpy_helper.from_array(value, name))


def fold_constants(state: Preparation) -> None:
    """Folds constants, ``If`` nodes of a constant condition and static shapes until nothing changes.

    Float ``Constant`` tensors become initializers (candidates as ``Preparation.is_weight_constant``
    says); an ``If`` whose condition is constant is replaced by its branch; ``Shape``/``Size`` of a
    static shape, and ``Gather``/``Size`` of a ``Shape`` where inference knows enough, become
    constants; a node that computes from constants only, and reads no candidate, is evaluated.
    """
    graph = state.graph
    state.constants.update({init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer})
    changed = True
    while changed:
        fold = _FoldPass(state, infer_value_types(state.model), used_names(graph))
        changed = False
        for fold.position, node in enumerate(graph.node):
            if any(rule(fold, node) for rule in _FOLDS):
                changed = True
            else:
                fold.kept.append(node)
        del graph.node[:]
        graph.node.extend(fold.kept)


def _lift_constant(fold: _FoldPass, node: onnx.NodeProto) -> bool:
    """A ``Constant`` node becomes an initializer (a candidate if a float weight)."""
    if not (is_onnx(node) and node.op_type == "Constant" and len(node.output) == 1):
        return False
    literal = constant_value(node)
    if literal is None:
        return False
    fold.set_constant(node.output[0], literal)
    # A 0-D Constant is an exporter's literal (an exponent, an epsilon), not a weight;
    # a torch export's constants are never parameters.
    is_float = onnx.helper.np_dtype_to_tensor_dtype(literal.dtype) in FLOAT_TYPES
    if (
        is_float
        and fold.state.is_weight_constant(node.output[0], literal)
        and not _is_group_norm_identity(fold.state.graph, node.output[0], literal)
    ):
        fold.state.candidates.add(node.output[0])
    return True


def _is_group_norm_identity(graph: onnx.GraphProto, name: str, value: np.ndarray) -> bool:
    """Whether ``name`` is TorchScript's ones or zeros of a GroupNorm: not a weight torch has.

    TorchScript writes ``nn.GroupNorm(G, C)`` as ``InstanceNormalization(Reshape(x), ones[G],
    zeros[G])``, then the Reshape back and the affine ``weight`` / ``bias`` (initializers). With
    ``G = 1`` the ones and zeros are one-element Constants, which ``is_weight_constant`` would train.
    """
    producers = {output: node for node in graph.node for output in node.output}
    reads = [(node, index) for node in graph.node for index, input_name in enumerate(node.input) if input_name == name]
    identity = {1: 1.0, 2: 0.0}  # InstanceNormalization's scale and bias
    return bool(reads) and all(
        is_onnx(node)
        and node.op_type == "InstanceNormalization"
        and index in identity
        and bool(np.all(value == identity[index]))
        and getattr(producers.get(node.input[0]), "op_type", "") == "Reshape"
        for node, index in reads
    )


def _specialize_if(fold: _FoldPass, node: onnx.NodeProto) -> bool:
    """An ``If`` of a constant condition is replaced by the nodes of the branch it takes."""
    state = fold.state
    if not (is_onnx(node) and node.op_type == "If" and node.input[0] in state.constants):
        return False
    taken_branch = "then_branch" if bool(np.asarray(state.constants[node.input[0]]).reshape(-1)[0]) else "else_branch"
    branch = next(attr.g for attr in node.attribute if attr.name == taken_branch)
    graph = state.graph
    outer_defined = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    outer_defined |= defined_names(graph.node[fold.position + 1 :])  # earlier ones: the kept nodes
    outer_defined |= defined_names(fold.kept)
    inlined, branch_initializers = inline_branch(node, branch, outer_defined, fold.taken, onnx_opset(state.model))
    fold.kept.extend(inlined)
    graph.initializer.extend(branch_initializers)
    for init in branch_initializers:
        state.constants[init.name] = onnx.numpy_helper.to_array(init)
        if init.data_type in FLOAT_TYPES and state.is_weight_constant(init.name, state.constants[init.name]):
            state.candidates.add(init.name)
    state.specialized.append(node.name)
    return True


def _fold_static_shape(fold: _FoldPass, node: onnx.NodeProto) -> bool:
    """``Shape``/``Size`` of a value of static shape (or a ``Shape`` slice of static dims) is a constant.

    A ``Shape`` node kept is recorded for ``_fold_shape_read``.
    """
    if not (is_onnx(node) and node.op_type in ("Shape", "Size") and node.input[0] not in fold.state.constants):
        return False
    static = fold.types.get(node.input[0])
    if static is not None and static.static_shape is not None:
        full = np.asarray(static.static_shape, dtype=np.int64)
        if node.op_type == "Size":
            value = np.asarray(np.prod(full), dtype=np.int64)
        else:
            start = next((attr.i for attr in node.attribute if attr.name == "start"), 0)
            end = next((attr.i for attr in node.attribute if attr.name == "end"), len(full))
            value = full[start:end]
        fold.set_constant(node.output[0], value)
        return True
    if node.op_type != "Shape":
        return False
    start = next((attr.i for attr in node.attribute if attr.name == "start"), None)
    end = next((attr.i for attr in node.attribute if attr.name == "end"), None)
    fold.shape_of[node.output[0]] = (node.input[0], start, end)
    # Shape(x, start, end) over static dims of a partly dynamic x (a fixed width).
    sliced = _static_shape_dims(fold.shape_of[node.output[0]], fold.types)
    if sliced is None or not all(isinstance(dim, int) for dim in sliced):
        return False
    fold.set_constant(node.output[0], np.asarray(sliced, dtype=np.int64))
    return True


def _fold_shape_read(fold: _FoldPass, node: onnx.NodeProto) -> bool:
    """``Gather(Shape(x), k)`` where dim k of x is static; ``Size(Shape(x))`` where x's rank is known."""
    value = fold_partial_shape(node, fold.shape_of, fold.types, fold.state.constants)
    if value is None:
        return False
    fold.set_constant(node.output[0], value)
    return True


def _evaluate_constant_node(fold: _FoldPass, node: onnx.NodeProto) -> bool:
    """A node computing from constants only, and reading no candidate, is evaluated (small outputs only)."""
    state = fold.state
    foldable = (
        is_onnx(node)
        and node.op_type not in _NOT_FOLDED
        and node.op_type != "Constant"
        and not subgraphs(node)
        and all(name in state.constants for name in node.input if name)
        and not any(name in state.candidates for name in node.input if name)
    )
    if not foldable:
        return False
    outputs = evaluate(node, state.constants, list(state.model.opset_import))
    if outputs is None or any(out.size > _MAX_FOLDED_ELEMENTS for out in outputs):
        return False
    for name, value in zip(node.output, outputs, strict=False):
        if name:
            fold.set_constant(name, value)
    return True


# In order: the first fold that replaces a node ends its turn.
_FOLDS = (_lift_constant, _specialize_if, _fold_static_shape, _fold_shape_read, _evaluate_constant_node)


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node, whatever attribute holds it."""
    for attribute in node.attribute:
        if attribute.name == "value":
            return onnx.numpy_helper.to_array(attribute.t)
        if attribute.name in ("value_float", "value_int", "value_floats", "value_ints"):
            dtype = np.float32 if "float" in attribute.name else np.int64
            return np.asarray(onnx.helper.get_attribute_value(attribute), dtype=dtype)
    return None


def evaluate(
    node: onnx.NodeProto, values: Mapping[str, np.ndarray], opsets: list[onnx.OperatorSetIdProto]
) -> list[np.ndarray] | None:
    """Runs one node on constant inputs with onnx's reference evaluator; None if it cannot."""
    inputs = [name for name in node.input if name]
    graph = onnx.helper.make_graph(
        [node],
        "fold",
        [
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(values[name].dtype), values[name].shape
            )
            for name in dict.fromkeys(inputs)
        ],
        [onnx.helper.make_empty_tensor_value_info(name) for name in node.output if name],
    )
    model = onnx.helper.make_model(graph, opset_imports=opsets)
    try:
        results = onnx.reference.ReferenceEvaluator(model).run(
            None, {name: values[name] for name in dict.fromkeys(inputs)}
        )
    except Exception:
        return None
    return [np.asarray(result) for result in results]


def inline_branch(
    node: onnx.NodeProto, branch: onnx.GraphProto, outer_defined: set[str], taken: set[str], opset: int
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes that replace an ``If`` node by one of its branches (outputs renamed by Identity).

    A branch may define a name that the outer graph also defines (sibling branches of different
    ``If`` nodes may reuse names, as lexical scoping allows): such names are renamed in the
    branch, nested subgraphs included. Names the branch reads from the outer scope stay as they
    are, so they resolve to the same values once the nodes are in the outer graph.

    Args:
        node: The ``If`` node.
        branch: The branch taken (not modified).
        outer_defined: Values defined outside this ``If`` node (graph inputs, initializers, other
            nodes' outputs, names inside other nodes' subgraphs).
        taken: Every name in use; new names are added to it.
        opset: The model's ai.onnx opset (the Identity nodes that carry the outputs are checked against it).
    """
    inlined = onnx.GraphProto()
    inlined.CopyFrom(branch)
    defined = defined_names(inlined.node) | {init.name for init in inlined.initializer}
    renamed = {name: unique_name(f"{name}_inlined", taken, separator="") for name in sorted(defined & outer_defined)}
    if renamed:
        rename_values(inlined, renamed)
    nodes = list(inlined.node)
    for inner, outer in zip(inlined.output, node.output, strict=True):
        if outer:
            nodes.append(make_checked_node(opset, "Identity", [inner.name], [outer], name=f"{node.name}/{inner.name}"))
    return nodes, list(inlined.initializer)


def fold_partial_shape(
    node: onnx.NodeProto,
    shape_of: Mapping[str, ShapeOf],
    types: Mapping[str, ValueType],
    constants: Mapping[str, np.ndarray],
) -> np.ndarray | None:
    """``Gather(Shape(x), k)`` when dim k of x is static; ``Size(Shape(x))`` when x's rank is known."""
    if not is_onnx(node) or not node.input or node.input[0] not in shape_of:
        return None
    dims = _static_shape_dims(shape_of[node.input[0]], types)
    if dims is None:
        return None
    if node.op_type == "Size":
        return np.asarray(len(dims), dtype=np.int64)
    if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in constants:
        axis = next((attr.i for attr in node.attribute if attr.name == "axis"), 0)
        indices = np.asarray(constants[node.input[1]])
        if axis != 0 or indices.dtype.kind not in "iu" or np.any(indices >= len(dims)) or np.any(indices < -len(dims)):
            return None
        picked = [dims[int(index)] for index in indices.reshape(-1)]
        if not all(isinstance(dim, int) for dim in picked):
            return None
        return np.asarray(picked, dtype=np.int64).reshape(indices.shape)
    return None


def _static_shape_dims(shape_of: ShapeOf, types: Mapping[str, ValueType]) -> list[int | str | None] | None:
    """The dims a ``Shape`` node outputs, as inference knows them (None: rank unknown)."""
    source, start, end = shape_of
    found = types.get(source)
    if found is None or found.shape is None:
        return None
    return list(found.shape[start:end])
