"""The rewrites that keep training torch's after its exporters folded parameters together (issue 31).

torch's exporters fold tensors in ways that are exact for inference and wrong for training:

- ``untie_merged_parameters``: equal-valued parameters merged into one tensor (onnxscript's
  optimizer makes two fresh LayerNorms read one weight; TorchScript writes ``Identity(a) -> b``)
  would be trained with the sum of both gradients; each torch parameter gets its own copy, read
  by the nodes that stand for it (dynamo: the node's torch call names the parameter;
  TorchScript: the Identity's output is the parameter's name);
- ``rebuild_folded_parameters``: an initializer the optimizer folded from torch parameters that
  the graph also trains elsewhere (an unrolled ``nn.RNN``'s step 0, ``h0 @ W_hh^T + b_hh`` with a
  zero h0) would be trained as a tensor of its own, and their gradients would miss its part; it
  is recomputed from them in the graph when its value is a broadcast, transpose or reshape of
  one of them, else refused with the export option that keeps the computation;
- ``read_padding_rows``: ``nn.Embedding(padding_idx=...)`` exports as a plain ``Gather``; dynamo's
  metadata records the index (``PreparedModel.padding_rows``), whose row the train step gives no
  gradient, as torch's embedding backward does (weight decay and momentum still act on it, as in
  torch); a TorchScript export says nothing, so an embedding-shaped Gather gets a warning;
- ``warn_fused_batchnorms``: a BatchNorm folded into the Conv before it (TorchScript in eval mode,
  onnxscript's optimizer) leaves two tensors where torch trains four: a warning says so and names
  the export call that keeps them apart.

``restructure_for_export`` applies the two structural rewrites to the model as shipped, so the
trained copies and the recomputed tensors have a place in the exported model.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import warnings
from collections.abc import Collection, Mapping

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs.emit.checks import make_checked_node
from ortlstm.graphs.emit.emitter import FLOAT_TYPES, GraphEmitter, onnx_opset
from ortlstm.graphs.emit.graph_utils import unique_name, used_names
from ortlstm.graphs.export_metadata import (
    FUSES_BATCHNORM,
    PARAMETER,
    TorchOrigins,
    batch_norm_in_train_mode,
    fused_batchnorms,
    fx_call,
    read_torch_origins,
)
from ortlstm.graphs.prepare.state import Preparation, is_onnx

_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})
_FOLDED_EXPORT_ADVICE = (
    "re-export with torch.onnx.export(..., optimize=False), or with a dynamic batch (dynamic_shapes=...), "
    "which keep that computation in the graph"
)


# ---- merged parameters ----------------------------------------------------------------------------


def untie_merged_parameters(state: Preparation) -> None:
    """Gives each torch parameter that an exporter merged with an equal one a trained copy of its own."""
    untied, origins = untie_merged(state.model, state.origins)
    state.origins = origins
    for copied, merged_into in untied.items():
        if merged_into in state.candidates:
            state.candidates.add(copied)
        state.initializer_names.add(copied)
    if untied and state.origins is None:
        pairs = ", ".join(f"{copied!r} = Identity({source!r})" for copied, source in untied.items())
        message = (
            f"the TorchScript export writes {pairs}: it stores equal-valued parameters once, so each is trained "
            "here as a tensor of its own, as torch trains two parameters of equal values. If the model ties them "
            "(one nn.Parameter in two modules), export with torch.onnx.export(..., dynamo=True), whose metadata "
            "tells a tie from equal values."
        )
        state.notes.update(dict.fromkeys(untied, message))


def untie_merged(model: onnx.ModelProto, origins: TorchOrigins | None) -> tuple[dict[str, str], TorchOrigins | None]:
    """Unties merged parameters in ``model`` (in place): each copy made -> the tensor it copies.

    With dynamo's metadata, a node whose torch call reads a parameter the export dropped, while
    its input is an initializer of another parameter that the call does not name, reads a copy
    named after the dropped parameter. Without metadata, ``Identity(initializer) -> b`` (TorchScript)
    becomes an initializer ``b``. Returns the origins with the copies as parameters of their own.
    """
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    taken = used_names(graph)
    untied: dict[str, str] = {}
    if origins is not None:
        copies: dict[str, str] = {}  # dropped parameter -> its copy (one aten call may export as several nodes)
        for node in graph.node:
            for index, target in _merged_reads(node, origins, initializers):
                if target not in copies:
                    copies[target] = unique_name(target, taken)
                    graph.initializer.append(_copy_of(initializers[node.input[index]], copies[target]))
                    untied[copies[target]] = node.input[index]
                node.input[index] = copies[target]
        sources = {**origins.sources, **{name: (name,) for name in untied}}
        kinds = {**origins.kinds, **dict.fromkeys(untied, PARAMETER)}
        dropped = tuple(name for name in origins.dropped if name not in copies)
        return untied, dataclasses.replace(origins, kinds=kinds, sources=sources, dropped=dropped)
    outputs = {value.name for value in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        source = initializers.get(node.input[0]) if is_onnx(node) and node.op_type == "Identity" else None
        if source is None or source.data_type not in FLOAT_TYPES or node.output[0] in outputs | set(initializers):
            kept.append(node)
            continue
        graph.initializer.append(_copy_of(source, node.output[0]))
        untied[node.output[0]] = source.name
    del graph.node[:]
    graph.node.extend(kept)
    return untied, None


def _merged_reads(
    node: onnx.NodeProto, origins: TorchOrigins, initializers: Mapping[str, onnx.TensorProto]
) -> list[tuple[int, str]]:
    """The inputs of ``node`` that read a merged tensor, each with the dropped parameter it stands for.

    A read stands for a dropped parameter its torch call names when the tensor read is another
    parameter the call does not name, and both are the same attribute (``weight``) of their
    modules, or are the only such pair.
    """
    call = fx_call(node)
    if call is None or (node.op_type in FUSES_BATCHNORM and "batch_norm" in call.target):
        return []
    named = [origins.placeholders[name] for name in call.placeholders() if name in origins.placeholders]
    wanted = [target for target in named if target in origins.dropped]
    foreign = [
        index
        for index, name in enumerate(node.input)
        if name in initializers and origins.sources.get(name) == (name,) and name not in named
    ]
    if len(wanted) == 1 and len(foreign) == 1:
        return [(foreign[0], wanted[0])]
    pairs: list[tuple[int, str]] = []
    for index in foreign:
        suffix = node.input[index].rsplit(".", 1)[-1]
        same = [target for target in wanted if target.rsplit(".", 1)[-1] == suffix]
        if len(same) == 1:
            pairs.append((index, same[0]))
    return pairs


def _copy_of(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    copied = onnx.TensorProto()
    copied.CopyFrom(tensor)
    copied.name = name
    del copied.metadata_props[:]
    return copied


# ---- initializers folded from parameters trained elsewhere -----------------------------------------


def rebuild_folded_parameters(state: Preparation) -> None:
    """Recomputes in the graph each initializer folded from parameters the graph also trains elsewhere.

    One whose value is not a broadcast, transpose or reshape of one of its sources stays, with a
    refusal (``Preparation.refusals``) that the train step raises if it trains that tensor or one
    sharing its sources (a model whose head alone is fine-tuned still trains).
    """
    if state.origins is None:
        state.candidates -= rebuild_torchscript_folds(state.model, state.candidates, keep=state.kept)
        return
    rebuilt, refusals = rebuild_folded(state.model, state.origins, state.candidates, keep=state.kept)
    state.candidates -= rebuilt
    state.refusals.update(refusals)


def rebuild_folded(
    model: onnx.ModelProto, origins: TorchOrigins, candidates: Collection[str], keep: Collection[str] = ()
) -> tuple[set[str], dict[str, str]]:
    """Replaces (in place) each folded initializer among ``candidates`` that shares a source.

    Those in ``keep`` (named in ``requires_grad``) stay initializers. Returns the names replaced,
    and for those that cannot be, each tensor involved -> the refusal to raise if it is trained.
    """
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    # A Conv's weight and bias with a BatchNorm fused in share the BatchNorm's parameters by construction
    # (a bias-free Conv gets a new bias folded from them): warn_fused_batchnorms says what they are.
    fused = fused_batchnorms(graph, origins.placeholders, origins.kinds)
    sources = {
        name: origins.sources[name]
        for name in candidates
        if name in origins.sources and name in initializers and name not in fused
    }
    users: dict[str, list[str]] = {}
    for name, parameters in sources.items():
        for parameter in parameters:
            users.setdefault(parameter, []).append(name)
    rebuilt: dict[str, tuple[tuple[int, ...], tuple[str, str]]] = {}
    refusals: dict[str, str] = {}
    # Folds of several parameters first: once rebuilt, a re-layout of one of them (W_hh^T) is its only user.
    for name, parameters in sorted(sources.items(), key=lambda item: (-len(item[1]), item[0])):
        if origins.kinds.get(name) == PARAMETER or name in keep:
            continue
        shared = [parameter for parameter in parameters if len(users[parameter]) > 1]
        value = onnx.numpy_helper.to_array(initializers[name])
        repeated = _repeated_axis(value)
        if not shared and repeated is None:
            continue  # a re-layout of parameters trained nowhere else (an LSTM's stacked W)
        relation = _as_function_of(value, parameters, initializers) if shared else None
        if relation is None:
            elsewhere = sorted({user for parameter in shared for user in users[parameter]} - {name})
            refusals.update(dict.fromkeys([name, *elsewhere], _folded_refusal(name, value, parameters, elsewhere)))
            continue
        for parameter in parameters:
            users[parameter].remove(name)
        rebuilt[name] = (value.shape, relation)
    _recompute_all(graph, rebuilt, onnx_opset(model))
    return set(rebuilt), refusals


def rebuild_torchscript_folds(
    model: onnx.ModelProto, candidates: Collection[str], keep: Collection[str] = ()
) -> set[str]:
    """Recomputes (in place) TorchScript's folded copies of parameters the graph also reads as themselves.

    TorchScript's constant folding writes ``W^T`` of a Linear on 3-D inputs as an initializer
    ``onnx::MatMul_<n>``; when ``W`` is tied to another module (an Embedding's table, read as
    itself), training both as tensors of their own would untie them. An ``onnx::`` initializer
    that is a transpose or reshape of another candidate, of more than one distinct value (equal
    fresh ones or zeros prove nothing), is recomputed from it. Returns the names replaced.
    """
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    names = [name for name in sorted(candidates) if name in initializers]
    folded = [name for name in names if name.startswith("onnx::") and name not in keep]
    if not folded:
        return set()
    # Values that a transpose or reshape keeps (size, extremes, signs): only a match is compared in full.
    by_fingerprint: dict[tuple[object, ...], list[str]] = {}
    for name in names:
        if not name.startswith("onnx::"):
            by_fingerprint.setdefault(_fingerprint(onnx.numpy_helper.to_array(initializers[name])), []).append(name)
    rebuilt: dict[str, tuple[tuple[int, ...], tuple[str, str]]] = {}
    for name in folded:
        value = onnx.numpy_helper.to_array(initializers[name])
        sources = tuple(by_fingerprint.get(_fingerprint(value), ()))
        if not sources or np.unique(value).size < 2:
            continue
        relation = _as_function_of(value, sources, initializers)
        if relation is not None:
            rebuilt[name] = (value.shape, relation)
    _recompute_all(graph, rebuilt, onnx_opset(model))
    return set(rebuilt)


def _fingerprint(value: np.ndarray) -> tuple[object, ...]:
    if value.size == 0:
        return (value.dtype.str, 0)
    return (value.dtype.str, value.size, value.min().item(), value.max().item(), int(np.count_nonzero(value > 0)))


def _recompute_all(
    graph: onnx.GraphProto, rebuilt: Mapping[str, tuple[tuple[int, ...], tuple[str, str]]], opset: int
) -> None:
    """Replaces each initializer named in ``rebuilt`` by the node computing it from its source."""
    if not rebuilt:
        return
    taken = used_names(graph)
    nodes: list[onnx.NodeProto] = []
    constants: list[onnx.TensorProto] = []
    for name, (shape, relation) in rebuilt.items():
        node, shape_constant = _recompute(name, shape, relation, taken, opset)
        nodes.append(node)
        constants.extend(shape_constant)
    kept = [init for init in graph.initializer if init.name not in rebuilt]
    del graph.initializer[:]
    graph.initializer.extend([*kept, *constants])
    existing = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *existing])


def _folded_refusal(name: str, value: np.ndarray, parameters: tuple[str, ...], elsewhere: list[str]) -> str:
    """Why a folded initializer cannot be trained as torch's parameters, and the export that keeps them."""
    repeated = _repeated_axis(value)
    also = f", which the model also trains as {elsewhere}" if elsewhere else ""
    reasons = [
        f"initializer {name!r} {list(value.shape)} was folded by the exporter's optimizer from torch parameters "
        f"{list(parameters)}{also}"
    ]
    if repeated is not None:
        reasons.append(
            f"its value repeats along axis {repeated} (size {value.shape[repeated]}): a parameter expanded over a "
            "static batch, whose copies torch trains as one"
        )
    return (
        "; ".join(reasons) + "; it is not a copy, broadcast or transpose of a tensor of the model, so training it as "
        "a tensor of its own would not train torch's parameters (their copies would drift apart, and their "
        f"gradients would miss its part). To train it as torch does, {_FOLDED_EXPORT_ADVICE}; or freeze "
        f"{'all of ' + str([name, *elsewhere]) if elsewhere else repr(name)}."
    )


def _repeated_axis(value: np.ndarray) -> int | None:
    """An axis (size > 1) along which every slice equals the first: an Expand folded over it.

    None for a tensor of one value (a zero bias), which repeats along every axis and proves nothing.
    """
    for axis, size in enumerate(value.shape):
        if size > 1 and np.array_equal(np.broadcast_to(np.take(value, [0], axis=axis), value.shape), value):
            return axis if np.unique(value).size > 1 else None
    return None


def _as_function_of(
    value: np.ndarray, parameters: tuple[str, ...], initializers: Mapping[str, onnx.TensorProto]
) -> tuple[str, str] | None:
    """(op, source) such that ``value`` is op(source): Expand, Transpose or Reshape of a source initializer."""
    for parameter in parameters:
        if parameter not in initializers:
            continue
        source = onnx.numpy_helper.to_array(initializers[parameter])
        if source.dtype != value.dtype:
            continue
        try:
            if np.array_equal(np.broadcast_to(source, value.shape), value):
                return "Expand", parameter
        except ValueError:
            pass
        if source.ndim == 2 and source.T.shape == value.shape and np.array_equal(source.T, value):
            return "Transpose", parameter
        if source.size == value.size and np.array_equal(source.reshape(value.shape), value):
            return "Reshape", parameter
    return None


def _recompute(
    name: str, shape: tuple[int, ...], relation: tuple[str, str], taken: set[str], opset: int
) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """The node computing ``name`` from its source, and the shape constant it reads (if any)."""
    op, source = relation
    node_name = unique_name(f"{name}/recomputed", taken)
    if op == "Transpose":
        return make_checked_node(opset, "Transpose", [source], [name], name=node_name, perm=[1, 0]), []
    dims = onnx.numpy_helper.from_array(np.asarray(shape, dtype=np.int64), unique_name(f"{name}.shape", taken))
    return make_checked_node(opset, op, [source, dims.name], [name], name=node_name), [dims]


# ---- the model as shipped, for export --------------------------------------------------------------


def restructure_for_export(model: onnx.ModelProto, trained: Collection[str] = ()) -> onnx.ModelProto:
    """``model`` with merged parameters untied and folded ones recomputed, as the train step has them.

    The trained copies (``ln2.weight``) then have initializers to go to, and a recomputed tensor
    follows its trained source in the exported model; one that was trained (named in
    ``requires_grad``) stays. A model neither applies to is returned as is.
    """
    origins = read_torch_origins(model)
    result = copy.deepcopy(model)
    untied, origins = untie_merged(result, origins)
    if origins is not None:
        rebuilt = rebuild_folded(result, origins, set(origins.sources), keep=trained)[0]
    else:  # choose_candidates' rule without metadata: float initializers of rank >= 1
        floats = {init.name for init in result.graph.initializer if init.data_type in FLOAT_TYPES and init.dims}
        rebuilt = rebuild_torchscript_folds(result, floats, keep=trained)
    return result if untied or rebuilt else model


# ---- embedding padding rows ------------------------------------------------------------------------


def read_padding_rows(state: Preparation) -> None:
    """Records each embedding's ``padding_idx`` from dynamo's metadata; warns on TorchScript's embeddings."""
    graph = state.graph
    inputs = {value.name: value for value in graph.input}
    initializers = {init.name: init for init in graph.initializer}
    for node in graph.node:
        weight = initializers.get(node.input[0]) if is_onnx(node) and node.op_type == "Gather" else None
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)
        if weight is None or axis != 0 or len(weight.dims) != 2 or weight.name not in state.candidates:
            continue
        call = fx_call(node)
        if call is not None and call.target.startswith("torch.ops.aten.embedding."):
            row = _padding_idx(call.args)
            if row is not None and row < weight.dims[0]:
                state.padding_rows.setdefault(weight.name, set()).add(row)
        elif state.origins is None and _is_int_input(inputs.get(node.input[1])):
            state.notes[weight.name] = (
                f"Gather {node.name!r} reads {weight.name!r} {list(weight.dims)} as an embedding table indexed by "
                f"input {node.input[1]!r}, and every row of it is trained: a TorchScript export does not say whether "
                "torch's nn.Embedding had a padding_idx, whose row torch never trains (its gradient is 0). If it "
                "had one, export with torch.onnx.export(..., dynamo=True), whose metadata records it."
            )


def _padding_idx(args: tuple[str, ...]) -> int | None:
    """aten.embedding(weight, indices, padding_idx=-1, ...): the padding row, or None (-1: none)."""
    if len(args) < 3 or not re.fullmatch(r"-?\d+", args[2]):
        return None
    row = int(args[2])
    return row if row >= 0 else None


def _is_int_input(value: onnx.ValueInfoProto | None) -> bool:
    return value is not None and value.type.tensor_type.elem_type in _INTEGER_TYPES


def zero_padding_gradients(
    emitter: GraphEmitter,
    gradients: Mapping[str, str],
    padding_rows: Mapping[str, tuple[int, ...]],
    graph: onnx.GraphProto,
) -> dict[str, str]:
    """Each embedding's gradient with its padding rows zeroed (torch's embedding backward skips them).

    ``Where`` rather than a product: a non-finite gradient elsewhere never reaches the row.
    """
    result = dict(gradients)
    initializers = {init.name: init for init in graph.initializer if init.name in padding_rows}
    for name, rows in padding_rows.items():
        if name not in result:
            continue
        mask = np.zeros((initializers[name].dims[0], 1), dtype=bool)
        mask[list(rows)] = True
        zero = emitter.scalar_like(0.0, result[name])
        rows_mask = emitter.constant(mask, onnx.TensorProto.BOOL, name=f"{name}.padding_rows")
        result[name] = emitter.op("Where", [rows_mask, zero, result[name]], name=f"{name}/padding_idx")
    return result


# ---- Conv + BatchNorm ------------------------------------------------------------------------------


def warn_fused_batchnorms(state: Preparation) -> None:
    """Warns when a BatchNorm was folded into the Conv before it: torch trains four tensors, this two."""
    graph = state.graph
    if state.origins is not None:
        fused = fused_batchnorms(state.source.graph, state.origins.placeholders, state.origins.kinds)
        fused = {name: parameters for name, parameters in fused.items() if name in state.candidates}
        if fused:
            ops = {node.op_type for node in state.source.graph.node if set(node.input[1:3]) & set(fused)}
            into = "the Conv" if ops <= {"Conv"} else "the Conv or Linear (Gemm)"
            message = (
                f"the export folded a BatchNorm into {into} before it: {sorted(fused)} are each "
                f"weight * bn.weight / sqrt(bn.running_var + eps) (+ bn.bias), one tensor standing for torch's "
                f"{sorted({p for name in fused for p in state.origins.sources.get(name, (name,))})}; trained as such, "
                "they do not train as torch's separate Conv (Linear) and BatchNorm parameters do. To train those, "
                "export with "
                "torch.onnx.export(..., optimize=False)."
            )
            state.notes.update(dict.fromkeys(fused, message))
            trained_mode = [
                name
                for node in state.source.graph.node
                if node.op_type in FUSES_BATCHNORM and batch_norm_in_train_mode(fx_call(node))
                for name in node.input[1:3]
                if name in fused
            ]
            refusal = (
                f"the tensors {sorted(trained_mode)} hold a BatchNorm that torch called in training mode (the model "
                "was exported in train mode: torch normalizes by each batch's statistics), folded into the Conv or "
                "Linear before it on the running statistics, so training them would differ from torch's; export the "
                "model in eval mode (model.eval()), with torch.onnx.export(..., optimize=False) to keep the BatchNorm "
                "apart."
            )
            state.refusals.update(dict.fromkeys(trained_mode, refusal))
        return
    torch_named = any("." in init.name for init in graph.initializer)
    folded = [
        node.input[1]
        for node in graph.node
        if is_onnx(node) and node.op_type == "Conv" and len(node.input) > 1 and node.input[1].startswith("onnx::Conv_")
    ]
    if torch_named and folded:
        message = (
            f"Conv weights {folded} are not torch parameters of the TorchScript export but tensors it computed: "
            "exported in eval mode, torch.onnx.export folds each BatchNorm into the Conv before it, so one "
            "tensor stands for the Conv's and the BatchNorm's parameters and does not train as torch's do. To "
            "train those, export with torch.onnx.export(..., do_constant_folding=False) (BatchNorm on its running "
            "statistics, as exported), or after model.train() with training=torch.onnx.TrainingMode.TRAINING "
            "(on batch statistics, as torch trains)."
        )
        state.notes.update(dict.fromkeys(folded, message))


def check_trained(notes: Mapping[str, str], refusals: Mapping[str, str], params: Collection[str]) -> None:
    """Refuses, or warns (each message once), what the export folded into the parameters that are trained.

    Raises:
        ValueError: A trained tensor shares torch parameters with a folded one that cannot be recomputed.
    """
    refused = next((refusals[name] for name in params if name in refusals), None)
    if refused is not None:
        raise ValueError(refused)
    for message in dict.fromkeys(notes[name] for name in params if name in notes):
        warnings.warn(message, stacklevel=3)
