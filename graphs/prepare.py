"""Makes an exported model ready for differentiation: the passes before the train step is built.

Real exports arrive with weights in ``Constant`` nodes (spox, paddle2onnx), integer shape
arithmetic that is static once the model's fixed dims are known (torch's dynamo export with
``optimize=False`` computes LSTM weight slices from ``Shape``), ``If`` nodes whose branch is
chosen by an input the user fixes (a sample rate), output shapes declared wrongly, and
standard ``LSTM`` nodes. ``prepare_model`` returns a model where:

- an ai.onnx opset older than 15 (CastLike's, which the losses emit) is converted to 17 by
  ``onnx.version_converter`` (the opset-12 recognizers paddle2onnx and torch 1.9 wrote; an LSTM
  converts from opset 7 on, onnx has no adapter from LSTM-1), its IR version raised to one that
  opset needs; weights keep their names, so the trained values go back into the model as shipped;
- input dims an exporter declared as -1 or 0 (paddle2onnx's batch) are symbolic: only a positive
  static dim fixes a size;
- each fixed input is an initializer, each fixed input shape is declared on its input, and
  ``If`` nodes whose condition is then constant are replaced by the chosen branch's nodes,
  nested ones too (names the branch defines are renamed where they would collide);
- float ``Constant`` tensors are initializers, so they can be trained like any other;
- the candidates for training by default are what torch trains: with a torch export's metadata,
  the initializers that are torch parameters or were folded from them (``export_metadata``),
  never buffers or an exporter's constants (a zero initial state); without it, the float
  initializers of rank >= 1 (0-D ones are an exporter's literals, an epsilon or a zero state to
  expand) and the float ``Constant`` tensors of rank >= 1 that are not many elements of one value
  (TorchScript's and paddle2onnx's zero initial states); never a value read only as a ``Pow``
  exponent;
- a candidate that a ``BatchNormalization`` also reads as its running mean or variance gets its
  own constant copy there (onnxscript's optimizer merges equal initializers: a zero bias and a
  zero running mean become one, and training the bias must not move the statistic);
- nodes computing from constants only are folded into initializers when they read no candidate
  parameter (so a weight sliced from a parameter stays differentiable), and ``Shape``/``Size`` of
  a value whose shape is static become constants, and so do ``Gather(Shape(x), k)`` where dim
  ``k`` of ``x`` is static and ``Size(Shape(x))`` where the rank of ``x`` is known (the rank and
  dim checks exporters write around squeezes, whatever the dynamic dims);
- reads of sequences whose structure is static (``SequenceAt`` of a ``SplitToSequence`` at a
  constant position: torch.split / torch.chunk exported with ``optimize=False``) are tensor ops
  (``autodiff.rules_sequence.resolve_static_sequences``);
- ONNX ``LSTM`` nodes are ortlstm ``LSTMTraining`` nodes (``convert``);
- declared output shapes and intermediate ``value_info`` are dropped (shape inference redoes them;
  an exporter's wrong declaration is never trusted for labels or losses), and each output then
  declares the shape inference computes, so the model passes ``onnx.checker``.

Protos only; folding uses ``onnx.reference``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import onnx.reference
import onnx.shape_inference
import onnx.version_converter

try:
    from ortlstm.graphs.autodiff.emitter import FLOAT_TYPES, ValueType, infer_value_types, used_names
    from ortlstm.graphs.autodiff.rules_sequence import SEQUENCE_OPS, resolve_static_sequences
    from ortlstm.graphs.convert import convert, is_onnx_lstm
    from ortlstm.graphs.export_metadata import read_torch_origins
    from ortlstm.ops import schema
except ModuleNotFoundError:
    from graphs.autodiff.emitter import (  # type: ignore[no-redef]
        FLOAT_TYPES,
        ValueType,
        infer_value_types,
        used_names,
    )
    from graphs.autodiff.rules_sequence import SEQUENCE_OPS, resolve_static_sequences  # type: ignore[no-redef]
    from graphs.convert import convert, is_onnx_lstm  # type: ignore[no-redef]
    from graphs.export_metadata import read_torch_origins  # type: ignore[no-redef]
    from ops import schema  # type: ignore[no-redef]

_ONNX_DOMAINS = ("", "ai.onnx")
# A model older than MIN_OPSET is converted to this opset: 15 at least (the losses emit CastLike,
# new in 15), and below 18, where the reductions and Split take their axes as inputs (fewer nodes
# for the converter to rewrite). ddddocr's and PP-OCRv2's opset-12 exports train at 17.
CONVERTED_OPSET = 17
# Models of opset 13 and 14 are converted too: the builders accept them (MIN_OPSET), but the losses
# and the rules that match element types emit CastLike, which a model of opset < 15 cannot hold.
CONVERTED_BELOW = 15
# Folding evaluates nodes in Python: never ops with side effects or randomness, never big outputs,
# never sequence ops (a folded sequence would become a tensor initializer; see resolve_static_sequences).
_NOT_FOLDED = frozenset(
    {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
) | frozenset(SEQUENCE_OPS)
_MAX_FOLDED_ELEMENTS = 1 << 16


@dataclasses.dataclass(frozen=True)
class PreparedModel:
    """A model ready for ``build_backward``.

    Attributes:
        model: The prepared model.
        candidates: Float initializers trained by default (see the module docstring), and those
            the caller named to keep; never the values folding created.
        specialized: Names of the ``If`` nodes replaced by a branch.
        converted: Names of the ``LSTMTraining`` nodes that replaced ONNX ``LSTM`` nodes.
        remaining_ifs: Names of the ``If`` nodes left in the main graph (their condition is not
            constant: fix the inputs or input shapes that decide it to differentiate through them).
        sources: For a torch export with metadata, each candidate -> the torch parameters it is
            or was folded from; empty without metadata.
        dropped: Torch parameters the export lost (see ``export_metadata.TorchOrigins``).
        control_flow: For each remaining ``If``, by its first output: what decides it and what to
            pass to fix it, in words (the advice of a refusal that meets it).
    """

    model: onnx.ModelProto
    candidates: frozenset[str]
    specialized: tuple[str, ...]
    converted: tuple[str, ...]
    remaining_ifs: tuple[str, ...] = ()
    sources: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    control_flow: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _is_onnx(node: onnx.NodeProto) -> bool:
    return node.domain in _ONNX_DOMAINS


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node, whatever attribute holds it."""
    for attribute in node.attribute:
        if attribute.name == "value":
            return onnx.numpy_helper.to_array(attribute.t)
        if attribute.name in ("value_float", "value_int", "value_floats", "value_ints"):
            dtype = np.float32 if "float" in attribute.name else np.int64
            return np.asarray(onnx.helper.get_attribute_value(attribute), dtype=dtype)
    return None


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attr in node.attribute)


def _evaluate(
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


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs: list[onnx.GraphProto] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graphs.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attribute.graphs)
    return graphs


def _defined_names(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Values the nodes define, with those defined inside their subgraphs (any depth)."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.output)
        for subgraph in _subgraphs(node):
            names.update(value.name for value in subgraph.input)
            names.update(init.name for init in subgraph.initializer)
            names.update(_defined_names(subgraph.node))
    names.discard("")
    return names


def _rename_in_graph(graph: onnx.GraphProto, renamed: Mapping[str, str]) -> None:
    """Renames values everywhere in ``graph`` and its subgraphs (inputs, outputs, initializers)."""
    for node in graph.node:
        _rename_in_node(node, renamed)
    for values in (graph.input, graph.output, graph.value_info):
        for value in values:
            value.name = renamed.get(value.name, value.name)
    for init in graph.initializer:
        init.name = renamed.get(init.name, init.name)


def _rename_in_node(node: onnx.NodeProto, renamed: Mapping[str, str]) -> None:
    for index, name in enumerate(node.input):
        node.input[index] = renamed.get(name, name)
    for index, name in enumerate(node.output):
        node.output[index] = renamed.get(name, name)
    for subgraph in _subgraphs(node):
        _rename_in_graph(subgraph, renamed)


def _inline_branch(
    node: onnx.NodeProto, branch: onnx.GraphProto, outer_defined: set[str], taken: set[str]
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
    """
    inlined = onnx.GraphProto()
    inlined.CopyFrom(branch)
    defined = _defined_names(inlined.node) | {init.name for init in inlined.initializer}
    renamed: dict[str, str] = {}
    for name in sorted(defined & outer_defined):
        fresh, k = f"{name}_inlined", 1
        while fresh in taken:
            fresh, k = f"{name}_inlined{k}", k + 1
        taken.add(fresh)
        renamed[name] = fresh
    if renamed:
        _rename_in_graph(inlined, renamed)
    nodes = list(inlined.node)
    for inner, outer in zip(inlined.output, node.output, strict=True):
        if outer:
            nodes.append(onnx.helper.make_node("Identity", [inner.name], [outer], name=f"{node.name}/{inner.name}"))
    return nodes, list(inlined.initializer)


def _fix_input_shapes(graph: onnx.GraphProto, fixed_shapes: Mapping[str, Sequence[int | str | None]]) -> None:
    """Declares the given dims on graph inputs (None keeps the declared dim)."""
    inputs = {value.name: value for value in graph.input}
    unknown = sorted(set(fixed_shapes) - set(inputs))
    if unknown:
        raise ValueError(f"fixed_shapes: {unknown} are not inputs of the model; its inputs are {list(inputs)}")
    for name, dims in fixed_shapes.items():
        tensor = inputs[name].type.tensor_type
        dims = list(dims)
        declared = list(tensor.shape.dim) if tensor.HasField("shape") else None
        if declared is not None and len(declared) != len(dims):
            raise ValueError(
                f"fixed_shapes: input {name!r} has rank {len(declared)}, the fixed shape {dims} has {len(dims)}"
            )
        for axis, dim in enumerate(dims):
            if not isinstance(dim, int):
                continue
            if dim < 0:
                raise ValueError(
                    f"fixed_shapes: input {name!r} dim {axis} is {dim}; dims are >= 0 (or None to keep it)"
                )
            if declared is not None and declared[axis].HasField("dim_value") and declared[axis].dim_value != dim:
                raise ValueError(
                    f"fixed_shapes: input {name!r} dim {axis} is declared {declared[axis].dim_value}, not {dim}"
                )
        if declared is None:
            for _ in dims:
                tensor.shape.dim.add()
        for axis, dim in enumerate(dims):
            target = tensor.shape.dim[axis]
            if isinstance(dim, int):
                target.Clear()
                target.dim_value = dim
            elif isinstance(dim, str):
                target.Clear()
                target.dim_param = dim


def _upgraded_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model, its ai.onnx opset converted to ``CONVERTED_OPSET`` when older than ``CONVERTED_BELOW``.

    The converter keeps initializer and Constant names, which is what export relies on to put the
    trained values back into the model as shipped.

    Raises:
        ValueError: onnx's converter cannot convert the model (an op without adapter).
    """
    opset = next((entry.version for entry in model.opset_import if entry.domain in _ONNX_DOMAINS), None)
    if opset is None or opset >= CONVERTED_BELOW:
        return copy.deepcopy(model)
    try:
        converted = onnx.version_converter.convert_version(model, CONVERTED_OPSET)
    except Exception as error:
        raise ValueError(
            f"the model's ai.onnx opset {opset} is older than {CONVERTED_BELOW}, the oldest the training graphs can "
            f"be built in, and onnx.version_converter cannot convert it to {CONVERTED_OPSET} ({error}); re-export it "
            f"with opset_version>={CONVERTED_BELOW}"
        ) from error
    # The converter keeps the IR version; an IR older than 4 (opset <= 8 exports) reads initializers
    # only as graph inputs, so shape inference would not see the constants prepare_model lifts.
    converted.ir_version = max(
        converted.ir_version, onnx.helper.find_min_ir_version_for(list(converted.opset_import), ignore_unknown=True)
    )
    return converted


def _declared_dims_dynamic(graph: onnx.GraphProto) -> None:
    """Makes input dims declared as -1 or 0 symbolic (``<input>_dim<axis>``).

    paddle2onnx declares a dynamic batch as -1 and some exporters write 0: neither is a size a
    batch must have. A fresh name per such dim keeps it apart from every other dim.
    """
    taken = {
        dim.dim_param
        for value in [*graph.input, *graph.output, *graph.value_info]
        if value.type.HasField("tensor_type")
        for dim in value.type.tensor_type.shape.dim
        if dim.HasField("dim_param")
    }
    for value in graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else ()):
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                name, k = f"{value.name}_dim{axis}", 1
                while name in taken:
                    name, k = f"{value.name}_dim{axis}_{k}", k + 1
                taken.add(name)
                dim.Clear()
                dim.dim_param = name


def _static_shape_dims(
    shape_of: tuple[str, int | None, int | None], types: Mapping[str, ValueType]
) -> list[int | str | None] | None:
    """The dims a ``Shape`` node outputs, as inference knows them (None: rank unknown)."""
    source, start, end = shape_of
    found = types.get(source)
    if found is None or found.shape is None:
        return None
    return list(found.shape[start:end])


def prepare_model(
    model: onnx.ModelProto,
    fixed_inputs: Mapping[str, np.ndarray] | None = None,
    fixed_shapes: Mapping[str, Sequence[int | str | None]] | None = None,
    keep: Iterable[str] = (),
) -> PreparedModel:
    """Returns the model made ready for differentiation (see the module docstring).

    Args:
        model: The model as exported.
        fixed_inputs: Graph inputs whose values the user fixes for training (e.g. a sample rate
            that chooses an ``If`` branch); they become initializers.
        fixed_shapes: Graph input shapes the user fixes for training, one entry per axis: an int
            fixes that dim, None keeps the declared one (e.g. ``{"input": [None, 576]}`` fixes
            the sample count and keeps the batch dynamic). ``If`` conditions computed from those
            dims then fold; the prepared model accepts only inputs of these shapes.
        keep: Initializers to keep as candidates whatever the defaults say (the parameters a
            caller names to train, a 0-D scale say): they are never folded away.

    Raises:
        ValueError: A fixed input or shape is not a graph input, or a fixed shape contradicts the
            declared one.
    """
    prepared = _prepare(model, fixed_inputs, fixed_shapes, keep)
    if prepared.remaining_ifs:
        advice = _ControlFlowAdvice(model, fixed_inputs, fixed_shapes, keep, prepared)
        prepared = dataclasses.replace(prepared, control_flow=advice)
    return prepared


def _prepare(
    model: onnx.ModelProto,
    fixed_inputs: Mapping[str, np.ndarray] | None,
    fixed_shapes: Mapping[str, Sequence[int | str | None]] | None,
    keep: Iterable[str] = (),
    *,
    decide_only: bool = False,
) -> PreparedModel:
    """``prepare_model`` without the advice on remaining ``If`` nodes.

    ``decide_only`` stops after folding and specializing (no LSTM conversion, no declared
    outputs, no candidates): what a probe needs to know which ``If`` nodes a fixed dim decides.
    """
    result = _upgraded_opset(model)
    graph = result.graph
    _declared_dims_dynamic(graph)
    fixed = dict(fixed_inputs or {})
    input_names = [value.name for value in graph.input]
    unknown = sorted(set(fixed) - set(input_names))
    if unknown:
        raise ValueError(f"fixed_inputs: {unknown} are not inputs of the model; its inputs are {input_names}")
    kept_inputs = [value for value in graph.input if value.name not in fixed]
    if fixed_shapes:
        _fix_input_shapes(graph, fixed_shapes)
        kept_inputs = [value for value in graph.input if value.name not in fixed]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    initializer_names = {init.name for init in graph.initializer}
    for name, value in fixed.items():
        graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))

    # Declared shapes are the exporter's word, not facts: inference recomputes them.
    del graph.value_info[:]
    for output in graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")

    origins = read_torch_origins(model)
    kept = set(keep)
    if origins is not None:
        candidates = {
            init.name
            for init in graph.initializer
            if init.data_type in FLOAT_TYPES and (init.name in origins.sources or init.name in kept)
        }
    else:
        candidates = {
            init.name
            for init in graph.initializer
            if init.data_type in FLOAT_TYPES and init.name in initializer_names and (init.dims or init.name in kept)
        }

    # A Constant node filled with one value is a literal of the forward: TorchScript writes
    # torch.zeros initial states so, paddle2onnx its LSTMs' zero states (spox and paddle2onnx write
    # every weight as a Constant, so the weights among Constants are the other ones).
    def is_weight_constant(name: str, value: np.ndarray) -> bool:
        if name in kept:
            return True
        if origins is not None or value.ndim == 0 or value.size == 0:
            return False
        # A tensor of many elements and one value (zeros to Tile or Expand into a state) is a
        # literal, in a model of Constant weights too: paddle2onnx's PP-OCRv2 writes its LSTMs' zero
        # states so. A one-element tensor is a weight (silero-vad's output bias).
        return value.size == 1 or bool(np.any(value != value.reshape(-1)[0]))

    opsets = list(result.opset_import)
    specialized: list[str] = []
    constants: dict[str, np.ndarray] = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    changed = True
    while changed:
        changed = False
        types = infer_value_types(result)
        # Shape nodes left in the graph: output -> (input, start, end), for Gather/Size of them.
        shape_of: dict[str, tuple[str, int | None, int | None]] = {}
        new_nodes: list[onnx.NodeProto] = []
        taken = used_names(graph)  # and the names inlining creates in this pass
        for position, node in enumerate(graph.node):
            if _is_onnx(node) and node.op_type == "Constant" and len(node.output) == 1:
                literal = _constant_value(node)
                if literal is not None:
                    constants[node.output[0]] = literal
                    graph.initializer.append(onnx.numpy_helper.from_array(literal, node.output[0]))
                    # A 0-D Constant is an exporter's literal (an exponent, an epsilon), not a weight;
                    # a torch export's constants are never parameters.
                    is_float = onnx.helper.np_dtype_to_tensor_dtype(literal.dtype) in FLOAT_TYPES
                    if is_float and is_weight_constant(node.output[0], literal):
                        candidates.add(node.output[0])
                    changed = True
                    continue
            if _is_onnx(node) and node.op_type == "If" and node.input[0] in constants:
                branch_name = (
                    "then_branch" if bool(np.asarray(constants[node.input[0]]).reshape(-1)[0]) else "else_branch"
                )
                branch = next(attr.g for attr in node.attribute if attr.name == branch_name)
                outer_defined = {value.name for value in graph.input} | {init.name for init in graph.initializer}
                outer_defined |= _defined_names(graph.node[position + 1 :])  # earlier ones: new_nodes
                outer_defined |= _defined_names(new_nodes)
                inlined, branch_initializers = _inline_branch(node, branch, outer_defined, taken)
                new_nodes.extend(inlined)
                graph.initializer.extend(branch_initializers)
                for init in branch_initializers:
                    constants[init.name] = onnx.numpy_helper.to_array(init)
                    if init.data_type in FLOAT_TYPES and is_weight_constant(init.name, constants[init.name]):
                        candidates.add(init.name)
                specialized.append(node.name)
                changed = True
                continue
            if _is_onnx(node) and node.op_type in ("Shape", "Size") and node.input[0] not in constants:
                static = types.get(node.input[0])
                if static is not None and static.static_shape is not None:
                    full = np.asarray(static.static_shape, dtype=np.int64)
                    if node.op_type == "Size":
                        value = np.asarray(np.prod(full), dtype=np.int64)
                    else:
                        start = next((attr.i for attr in node.attribute if attr.name == "start"), 0)
                        end = next((attr.i for attr in node.attribute if attr.name == "end"), len(full))
                        value = full[start:end]
                    constants[node.output[0]] = value
                    graph.initializer.append(onnx.numpy_helper.from_array(value, node.output[0]))
                    changed = True
                    continue
                if node.op_type == "Shape":
                    start = next((attr.i for attr in node.attribute if attr.name == "start"), None)
                    end = next((attr.i for attr in node.attribute if attr.name == "end"), None)
                    shape_of[node.output[0]] = (node.input[0], start, end)
                    # Shape(x, start, end) over static dims of a partly dynamic x (a fixed width).
                    sliced = _static_shape_dims(shape_of[node.output[0]], types)
                    if sliced is not None and all(isinstance(dim, int) for dim in sliced):
                        value = np.asarray(sliced, dtype=np.int64)
                        constants[node.output[0]] = value
                        graph.initializer.append(onnx.numpy_helper.from_array(value, node.output[0]))
                        changed = True
                        continue
            partial = _fold_partial_shape(node, shape_of, types, constants)
            if partial is not None:
                constants[node.output[0]] = partial
                graph.initializer.append(onnx.numpy_helper.from_array(partial, node.output[0]))
                changed = True
                continue
            foldable = (
                _is_onnx(node)
                and node.op_type not in _NOT_FOLDED
                and node.op_type != "Constant"
                and not _has_subgraph(node)
                and all(name in constants for name in node.input if name)
                and not any(name in candidates for name in node.input if name)
            )
            if foldable:
                outputs = _evaluate(node, constants, opsets)
                if outputs is not None and all(out.size <= _MAX_FOLDED_ELEMENTS for out in outputs):
                    for name, value in zip(node.output, outputs, strict=False):
                        if name:
                            constants[name] = value
                            graph.initializer.append(onnx.numpy_helper.from_array(value, name))
                    changed = True
                    continue
            new_nodes.append(node)
        del graph.node[:]
        graph.node.extend(new_nodes)

    if decide_only:
        left = tuple(node.name for node in graph.node if _is_onnx(node) and node.op_type == "If")
        return PreparedModel(result, frozenset(), tuple(specialized), (), left)
    resolve_static_sequences(result, constants)  # torch.split / chunk with optimize=False: tensor ops
    _drop_dead_nodes(graph)
    _drop_unused_initializers(graph)
    converted: tuple[str, ...] = ()
    if any(is_onnx_lstm(node) for node in graph.node):
        already = sum(1 for node in graph.node if _is_lstm_training(node))
        result = convert(result)
        converted = tuple(node.name for node in result.graph.node if _is_lstm_training(node))[already:]
    # An exponent is a literal of the formula (x ** 2), not a weight; its gradient, log(x), is NaN
    # wherever the base is negative (an STFT's real part). Named in requires_grad it still trains.
    candidates -= _only_pow_exponents(result.graph, candidates) - kept
    _untie_running_statistics(result.graph, candidates)
    _declare_inferred_output_shapes(result)
    remaining = tuple(node.name for node in result.graph.node if _is_onnx(node) and node.op_type == "If")
    sources = {name: origins.sources[name] for name in candidates if name in origins.sources} if origins else {}
    return PreparedModel(
        result,
        frozenset(candidates),
        tuple(specialized),
        converted,
        remaining,
        sources,
        origins.dropped if origins else (),
    )


# ---- what decides an If that preparation could not replace ---------------------------------------

# Sizes a dynamic dim takes while testing whether fixing it decides an If (models take only some
# sizes: silero-vad's rank checks fold for 576 samples and less, not for 1024).
_PROBE_DIMS = (64, 1024)


class _ControlFlowAdvice(Mapping[str, str]):
    """Per remaining ``If`` of a prepared model: what decides it and what to pass, in words.

    Computed when a refusal asks for it: finding the input dims that decide an If prepares the
    model again with each dynamic input dim fixed in turn.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        fixed_inputs: Mapping[str, np.ndarray] | None,
        fixed_shapes: Mapping[str, Sequence[int | str | None]] | None,
        keep: Iterable[str],
        prepared: PreparedModel,
    ) -> None:
        self._model = model
        self._keep = tuple(keep)
        self._fixed_inputs = dict(fixed_inputs or {})
        self._fixed_shapes = {name: list(dims) for name, dims in (fixed_shapes or {}).items()}
        self._prepared = prepared
        self._ifs = _if_nodes(prepared.model.graph)
        self._advice: dict[str, str] = {}
        self._deciding: dict[str, dict[str, list[int]]] | None = None

    def __getitem__(self, name: str) -> str:
        if name not in self._ifs:
            raise KeyError(name)
        if name not in self._advice:
            self._advice[name] = self._describe(name)
        return self._advice[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ifs)

    def __len__(self) -> int:
        return len(self._ifs)

    def _dims_deciding(self) -> dict[str, dict[str, list[int]]]:
        """Per remaining If (by first output), the input dims that decide it: fixing one alone replaces it."""
        if self._deciding is None:
            self._deciding = {}
            graph = self._prepared.model.graph
            for value in graph.input:
                declared = _declared_dims(graph, value.name) or []
                for axis, dim in enumerate(declared):
                    if isinstance(dim, int):
                        continue
                    decided: set[str] = set()
                    for size in _PROBE_DIMS:
                        shapes = {name: list(dims) for name, dims in self._fixed_shapes.items()}
                        shapes.setdefault(value.name, [None] * len(declared))[axis] = size
                        try:
                            probe = _prepare(self._model, self._fixed_inputs, shapes, self._keep, decide_only=True)
                        except Exception:  # a size the model cannot take decides nothing
                            continue
                        decided |= set(self._ifs) - set(_if_nodes(probe.model.graph))
                    for if_name in decided:
                        self._deciding.setdefault(if_name, {}).setdefault(value.name, []).append(axis)
        return self._deciding

    def _describe(self, key: str) -> str:
        graph = self._prepared.model.graph
        node = self._ifs[key]
        label = f"If {node.name!r}" if node.name else f"The If computing {key!r}"
        values, shape_reads = _condition_sources(graph, node.input[0])
        parts: list[str] = []
        options: list[str] = []
        flags: list[str] = []  # the command line's spelling of the same options
        if values:
            parts.append("the value of input " + " and ".join(map(repr, values)))
            options.append("fixed_inputs={" + ", ".join(f"{name!r}: <value>" for name in values) + "}")
            flags.extend(f"--fixed-input {name}=VALUE" for name in values)
        if shape_reads:
            decided = self._dims_deciding().get(key) or {
                name: [] for name in _inputs_reaching(graph, shape_reads) if name not in values
            }
            for name, axes in decided.items():
                declared = _declared_dims(graph, name) or []
                which = f"dim {', '.join(map(str, axes))}" if axes else "no single dim decides it"
                parts.append(f"the shape of input {name!r} ({which})")
                chosen = [axis in axes or (not axes and not isinstance(dim, int)) for axis, dim in enumerate(declared)]
                dims = [f"<size of dim {axis}>" if fix else "None" for axis, fix in enumerate(chosen)]
                options.append(f"fixed_shapes={{{name!r}: [{', '.join(dims)}]}}")
                spelled = ",".join(f"SIZE{axis}" if fix else "?" for axis, fix in enumerate(chosen))
                flags.append(f"--fixed-shape {name}={spelled}")
        if not parts:
            return (
                f"{label}: its condition is computed at run time from values training cannot fix; "
                "its branches are not differentiated (freeze the parameters they read)."
            )
        return (
            f"{label} is decided by {' and by '.join(parts)}; control flow is not differentiated, so fix it "
            f"for training: pass {' and '.join(options)} ({' '.join(flags)} on the command line; the If is then "
            "replaced by the branch chosen)."
        )


def _if_nodes(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """The main graph's ``If`` nodes by first output (node names may be empty or repeated)."""
    return {node.output[0]: node for node in graph.node if _is_onnx(node) and node.op_type == "If"}


def _condition_sources(graph: onnx.GraphProto, condition: str) -> tuple[list[str], list[str]]:
    """The graph inputs a condition reads by value, and the values whose shape (or size) it reads."""
    producers = {name: node for node in graph.node for name in node.output if name}
    inputs = {value.name for value in graph.input} - {init.name for init in graph.initializer}
    values: list[str] = []
    shape_reads: list[str] = []
    seen: set[str] = set()
    stack = [condition]
    while stack:
        name = stack.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in inputs:
            values.append(name)
            continue
        node = producers.get(name)
        if node is None:
            continue
        if _is_onnx(node) and node.op_type in ("Shape", "Size"):
            shape_reads.append(node.input[0])
            continue
        stack.extend(node.input)
        for subgraph in _subgraphs(node):
            stack.extend(_subgraph_reads_of(subgraph))
    return values, shape_reads


def _declared_dims(graph: onnx.GraphProto, name: str) -> list[int | str | None] | None:
    value = next(value for value in graph.input if value.name == name)
    if not value.type.tensor_type.HasField("shape"):
        return None
    return [
        dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
        for dim in value.type.tensor_type.shape.dim
    ]


def _inputs_reaching(graph: onnx.GraphProto, names: Sequence[str]) -> list[str]:
    producers = {name: node for node in graph.node for name in node.output if name}
    inputs = {value.name for value in graph.input}
    found: list[str] = []
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.append(name)
        node = producers.get(name)
        if node is not None:
            stack.extend(node.input)
    return found


def _untie_running_statistics(graph: onnx.GraphProto, candidates: set[str]) -> None:
    """Gives each BatchNormalization that reads a candidate as its running mean or variance a copy.

    The statistics are data, never trained; a candidate read there is an equal initializer the
    exporter's optimizer merged with a parameter (zeros of a bias and of a running mean).
    """
    initializers = {init.name: init for init in graph.initializer}
    statistic_reads = {
        (position, index)
        for position, node in enumerate(graph.node)
        if _is_onnx(node) and node.op_type == "BatchNormalization"
        for index in (3, 4)
        if index < len(node.input) and node.input[index] in candidates
    }
    if not statistic_reads:
        return
    read_elsewhere = (
        {
            name
            for position, node in enumerate(graph.node)
            for index, name in enumerate(node.input)
            if (position, index) not in statistic_reads
        }
        | _subgraph_reads(graph)
        | {output.name for output in graph.output}
    )
    taken = used_names(graph)
    for position, node in enumerate(graph.node):
        for index in (3, 4):
            name = node.input[index] if (position, index) in statistic_reads else ""
            if name in read_elsewhere and name in initializers:
                copy_name, k = f"{name}.running_statistic", 1
                while copy_name in taken:
                    copy_name, k = f"{name}.running_statistic_{k}", k + 1
                taken.add(copy_name)
                copied = onnx.TensorProto()
                copied.CopyFrom(initializers[name])
                copied.name = copy_name
                graph.initializer.append(copied)
                node.input[index] = copy_name


def _declare_inferred_output_shapes(model: onnx.ModelProto) -> None:
    """Gives each graph output whose shape was dropped the shape inference computes for it.

    onnx.checker requires a shape on every main-graph output; the exporter's was dropped as
    untrusted, so the prepared model declares what inference derives (symbolic dims kept). An
    output whose rank inference cannot tell keeps no shape.
    """
    inferred = {info.name: info for info in onnx.shape_inference.infer_shapes(model, strict_mode=False).graph.output}
    for output in model.graph.output:
        tensor = output.type.tensor_type
        found = inferred.get(output.name)
        if not output.type.HasField("tensor_type") or tensor.HasField("shape") or found is None:
            continue
        if found.type.tensor_type.HasField("shape"):
            tensor.shape.CopyFrom(found.type.tensor_type.shape)


def _fold_partial_shape(
    node: onnx.NodeProto,
    shape_of: Mapping[str, tuple[str, int | None, int | None]],
    types: Mapping[str, ValueType],
    constants: Mapping[str, np.ndarray],
) -> np.ndarray | None:
    """``Gather(Shape(x), k)`` when dim k of x is static; ``Size(Shape(x))`` when x's rank is known."""
    if not _is_onnx(node) or not node.input or node.input[0] not in shape_of:
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


def _only_pow_exponents(graph: onnx.GraphProto, names: Iterable[str]) -> set[str]:
    """The values among ``names`` that nodes read only as the exponent of ``Pow``."""
    uses: dict[str, set[tuple[str, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            uses.setdefault(name, set()).add(
                (node.op_type if _is_onnx(node) else f"{node.domain}::{node.op_type}", index)
            )
    read_in_subgraphs = _subgraph_reads(graph)
    return {name for name in names if name in uses and uses[name] == {("Pow", 1)} and name not in read_in_subgraphs}


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Removes nodes whose outputs nothing reads (Shape nodes whose uses were folded, say)."""
    needed = {output.name for output in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output if name):
            kept.append(node)
            needed.update(name for name in node.input if name)
            for subgraph in _subgraphs(node):
                needed.update(_subgraph_reads_of(subgraph))
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)


def _subgraph_reads_of(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for inner in graph.node:
        names.update(inner.input)
        for subgraph in _subgraphs(inner):
            names.update(_subgraph_reads_of(subgraph))
    names.update(output.name for output in graph.output)
    return names


def _is_lstm_training(node: onnx.NodeProto) -> bool:
    return node.op_type == schema.LSTM_TRAINING.name and node.domain == schema.LSTM_TRAINING.domain


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Removes initializers that no node, subgraph or output reads (folded intermediates)."""
    used = {name for node in graph.node for name in node.input}
    used.update(_subgraph_reads(graph))
    used.update(output.name for output in graph.output)
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Outer-scope values the subgraphs of ``graph``'s nodes read (inputs and outputs, any depth)."""
    names: set[str] = set()
    for node in graph.node:
        for subgraph in _subgraphs(node):
            names.update(_subgraph_reads_of(subgraph))
    return names
