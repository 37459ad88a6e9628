"""The rewrites of ``prepare_model`` other than folding, one function each, in pipeline order.

Each takes the ``Preparation`` and changes it in place; ``pipeline.REWRITES`` lists the order.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import onnx.shape_inference
import onnx.version_converter

from ortlstm.graphs.convert import convert, is_onnx_lstm
from ortlstm.graphs.convert_gru import convert_grus as convert_grus_of
from ortlstm.graphs.convert_rnn import convert_rnns as convert_rnns_of
from ortlstm.graphs.emit.emitter import FLOAT_TYPES
from ortlstm.graphs.emit.graph_utils import prune_to_outputs, reads_in_subgraphs, unique_name, used_names
from ortlstm.graphs.export_metadata import read_torch_origins
from ortlstm.graphs.prepare.sequences import resolve_static_sequences
from ortlstm.graphs.prepare.state import ONNX_DOMAINS, Preparation, is_onnx
from ortlstm.ops import schema

# A model older than MIN_OPSET is converted to this opset: 15 at least (the losses emit CastLike,
# new in 15), and below 18, where the reductions and Split take their axes as inputs (fewer nodes
# for the converter to rewrite). ddddocr's and PP-OCRv2's opset-12 exports train at 17.
CONVERTED_OPSET = 17
# Models of opset 13 and 14 are converted too: the builders accept them (MIN_OPSET), but the losses
# and the rules that match element types emit CastLike, which a model of opset < 15 cannot hold.
CONVERTED_BELOW = 15


def convert_old_opset(state: Preparation) -> None:
    """Makes the working copy: the model, each opset imported once, its ai.onnx opset 17 when older than 15.

    The converter keeps initializer and Constant names, which is what export relies on to put the
    trained values back into the model as shipped.

    Raises:
        ValueError: onnx's converter cannot convert the model (an op without adapter), or the model
            imports one domain at two versions.
    """
    model = _one_import_per_domain(state.source)
    opset = next((entry.version for entry in model.opset_import if entry.domain in ONNX_DOMAINS), None)
    if opset is None or opset >= CONVERTED_BELOW:
        state.model = copy.deepcopy(model)
        return
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
    state.model = converted


def _one_import_per_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy that imports each opset domain once where the model repeats one at one version.

    onnx.compose.merge_models lists a domain once per model merged (enc, erb_dec and df_dec of
    DeepFilterNet3 chained: ai.onnx 12 three times), which onnx.checker accepts. The version
    converter then updates only the first entry to 17, and shape inference and onnxruntime read the
    nodes it converted at 12: an Unsqueeze whose axes became an input loses its shape (a MatMul rule
    after it was refused, "the rank of ... is unknown") and onnxruntime refuses the graph.

    Raises:
        ValueError: A domain is imported at different versions.
    """
    versions: dict[str, list[int]] = {}
    for entry in model.opset_import:
        versions.setdefault(entry.domain, []).append(entry.version)
    if all(len(found) == 1 for found in versions.values()):
        return model
    conflicting = {domain or "ai.onnx": found for domain, found in versions.items() if len(set(found)) > 1}
    if conflicting:
        listed = "; ".join(f"{domain} at versions {found}" for domain, found in conflicting.items())
        raise ValueError(
            f"the model imports an opset domain more than once at different versions ({listed}), which no runtime "
            "reads one way; convert each model to one opset (onnx.version_converter.convert_version) before "
            "merging them (onnx.compose.merge_models)"
        )
    result = copy.deepcopy(model)
    del result.opset_import[:]
    result.opset_import.extend(onnx.helper.make_opsetid(domain, found[0]) for domain, found in versions.items())
    return result


def make_dynamic_dims_symbolic(state: Preparation) -> None:
    """Makes input dims declared as -1 or 0 symbolic (``<input>_dim<axis>``).

    paddle2onnx declares a dynamic batch as -1 and some exporters write 0: neither is a size a
    batch must have. A fresh name per such dim keeps it apart from every other dim.
    """
    graph = state.graph
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
                name = unique_name(f"{value.name}_dim{axis}", taken)
                dim.Clear()
                dim.dim_param = name


def fix_inputs(state: Preparation) -> None:
    """Declares the fixed input shapes and makes each fixed input an initializer of its value.

    Raises:
        ValueError: A fixed input or shape is not a graph input, or a fixed shape contradicts the
            declared one.
    """
    graph = state.graph
    fixed = state.fixed_inputs
    input_names = [value.name for value in graph.input]
    unknown = sorted(set(fixed) - set(input_names))
    if unknown:
        raise ValueError(f"fixed_inputs: {unknown} are not inputs of the model; its inputs are {input_names}")
    if state.fixed_shapes:
        _fix_input_shapes(graph, state.fixed_shapes)
    kept_inputs = [value for value in graph.input if value.name not in fixed]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    state.initializer_names = {init.name for init in graph.initializer}
    for name, value in fixed.items():
        graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))


def _fix_input_shapes(graph: onnx.GraphProto, fixed_shapes: Mapping[str, Sequence[int | str | None]]) -> None:
    """Declares the given dims on graph inputs (None keeps the declared dim)."""
    inputs = {value.name: value for value in graph.input}
    unknown = sorted(set(fixed_shapes) - set(inputs))
    if unknown:
        raise ValueError(f"fixed_shapes: {unknown} are not inputs of the model; its inputs are {list(inputs)}")
    for name, dims in fixed_shapes.items():
        tensor = inputs[name].type.tensor_type
        declared = list(tensor.shape.dim) if tensor.HasField("shape") else None
        _check_fixed_shape(name, list(dims), declared)
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


def _check_fixed_shape(
    name: str, dims: list[int | str | None], declared: list[onnx.TensorShapeProto.Dimension] | None
) -> None:
    if declared is not None and len(declared) != len(dims):
        raise ValueError(
            f"fixed_shapes: input {name!r} has rank {len(declared)}, the fixed shape {dims} has {len(dims)}"
        )
    for axis, dim in enumerate(dims):
        if not isinstance(dim, int):
            continue
        if dim < 0:
            raise ValueError(f"fixed_shapes: input {name!r} dim {axis} is {dim}; dims are >= 0 (or None to keep it)")
        if declared is not None and declared[axis].HasField("dim_value") and declared[axis].dim_value != dim:
            raise ValueError(
                f"fixed_shapes: input {name!r} dim {axis} is declared {declared[axis].dim_value}, not {dim}"
            )


def drop_declared_shapes(state: Preparation) -> None:
    """Drops the output shapes and ``value_info`` declared: the exporter's word, not facts."""
    graph = state.graph
    del graph.value_info[:]
    for output in graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")


def choose_candidates(state: Preparation) -> None:
    """The float initializers trained by default: torch's parameters, else those of rank >= 1.

    With a torch export's metadata, the initializers that are torch parameters or were folded from
    them; without it, the model's own float initializers of rank >= 1 (0-D ones are an exporter's
    literals). Initializers the caller keeps always count.
    """
    state.origins = origins = read_torch_origins(state.source)
    kept = state.kept
    initializers = state.graph.initializer
    if origins is not None:
        chosen = {
            init.name
            for init in initializers
            if init.data_type in FLOAT_TYPES and (init.name in origins.sources or init.name in kept)
        }
    else:
        chosen = {
            init.name
            for init in initializers
            if init.data_type in FLOAT_TYPES
            and init.name in state.initializer_names
            and (init.dims or init.name in kept)
        }
    state.candidates = chosen


def resolve_sequences(state: Preparation) -> None:
    """Reads of sequences of static structure become tensor ops (``resolve_static_sequences``)."""
    resolve_static_sequences(state.model, state.constants)  # torch.split / chunk with optimize=False


def drop_dead_values(state: Preparation) -> None:
    """Removes nodes and initializers no output needs (Shape nodes whose uses were folded, say)."""
    prune_to_outputs(state.graph)


def convert_lstms(state: Preparation) -> None:
    """ONNX ``LSTM`` nodes become ortlstm ``LSTMTraining`` nodes (``convert``)."""
    graph = state.graph
    if any(is_onnx_lstm(node) for node in graph.node):
        already = sum(1 for node in graph.node if _is_lstm_training(node))
        state.model = convert(state.model)
        state.converted = tuple(node.name for node in state.graph.node if _is_lstm_training(node))[already:]


def convert_grus(state: Preparation) -> None:
    """ONNX ``GRU`` nodes become ortlstm ``GRUTraining`` nodes (``convert_gru``)."""
    state.model = convert_grus_of(state.model)


def convert_rnns(state: Preparation) -> None:
    """ONNX ``RNN`` nodes become ortlstm ``RNNTraining`` nodes (``convert_rnn``)."""
    state.model = convert_rnns_of(state.model)


def _is_lstm_training(node: onnx.NodeProto) -> bool:
    return node.op_type == schema.LSTM_TRAINING.name and node.domain == schema.LSTM_TRAINING.domain


def drop_pow_exponents(state: Preparation) -> None:
    """Candidates read only as the exponent of ``Pow`` are not (unless the caller keeps them).

    An exponent is a literal of the formula (x ** 2), not a weight; its gradient, log(x), is NaN
    wherever the base is negative (an STFT's real part). Named in requires_grad it still trains.
    """
    state.candidates -= _only_pow_exponents(state.graph, state.candidates) - state.kept


def _only_pow_exponents(graph: onnx.GraphProto, names: Iterable[str]) -> set[str]:
    """The values among ``names`` that nodes read only as the exponent of ``Pow``."""
    uses: dict[str, set[tuple[str, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            op = node.op_type if is_onnx(node) else f"{node.domain}::{node.op_type}"
            uses.setdefault(name, set()).add((op, index))
    read_in_subgraphs = reads_in_subgraphs(graph)
    return {name for name in names if name in uses and uses[name] == {("Pow", 1)} and name not in read_in_subgraphs}


def untie_running_statistics(state: Preparation) -> None:
    """Gives each BatchNormalization that reads a candidate as its running mean or variance a copy.

    The statistics are data, never trained; a candidate read there is an equal initializer the
    exporter's optimizer merged with a parameter (zeros of a bias and of a running mean): onnxscript's
    optimizer merges equal initializers, and training the bias must not move the statistic.
    """
    graph, candidates = state.graph, state.candidates
    initializers = {init.name: init for init in graph.initializer}
    statistic_reads = {
        (position, index)
        for position, node in enumerate(graph.node)
        if is_onnx(node) and node.op_type == "BatchNormalization"
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
        | reads_in_subgraphs(graph)
        | {output.name for output in graph.output}
    )
    taken = used_names(graph)
    for position, index in sorted(statistic_reads):
        node = graph.node[position]
        name = node.input[index]
        if name in read_elsewhere and name in initializers:
            copied = onnx.TensorProto()
            copied.CopyFrom(initializers[name])
            copied.name = unique_name(f"{name}.running_statistic", taken)
            graph.initializer.append(copied)
            node.input[index] = copied.name


def declare_output_shapes(state: Preparation) -> None:
    """Gives each graph output whose shape was dropped the shape inference computes for it.

    onnx.checker requires a shape on every main-graph output; the exporter's was dropped as
    untrusted, so the prepared model declares what inference derives (symbolic dims kept). An
    output whose rank inference cannot tell keeps no shape.
    """
    model = state.model
    inferred = {info.name: info for info in onnx.shape_inference.infer_shapes(model, strict_mode=False).graph.output}
    for output in model.graph.output:
        tensor = output.type.tensor_type
        found = inferred.get(output.name)
        if not output.type.HasField("tensor_type") or tensor.HasField("shape") or found is None:
            continue
        if found.type.tensor_type.HasField("shape"):
            tensor.shape.CopyFrom(found.type.tensor_type.shape)
