"""Training artifacts for models with LSTMs, through onnxruntime-training's generator.

``generate_artifacts`` converts the model's LSTM nodes, registers the gradient, calls
``onnxruntime.training.artifacts.generate_artifacts`` and repairs what that generator cannot do
for a custom op: it copies each forward node's attributes onto its gradient node (the registry
has no way to say "same attributes"), blanks gradient inputs that nothing produces (outputs that
do not reach the loss), and writes every model with an IR version onnxruntime 1.19 loads.
``open_training`` loads the result into ``onnxruntime.training.api`` objects, and
``export_inference_model`` writes the trained model for inference (onnxruntime-training's own
export cannot load the custom ops).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx.numpy_helper

from ortlstm.graphs.convert import MAIN_GRAPH, MAX_IR_VERSION, convert, is_onnx_lstm, lstm_locations
from ortlstm.graphs.convert_gru import convert_grus
from ortlstm.graphs.convert_rnn import convert_rnns
from ortlstm.graphs.emit.graph_utils import prune_to_outputs
from ortlstm.graphs.ort_training.gradient import RECURRENT_WIRINGS, import_training_runtime, register_gradient
from ortlstm.graphs.parameters import ParameterNames, torch_sources
from ortlstm.ops import library_path, schema, session_options

# onnxruntime-training names the gradient node of forward node F "F_Grad/<op>_<k>".
_GRADIENT_NODE_INFIX = "_Grad/"


@dataclasses.dataclass(frozen=True)
class TrainingArtifacts:
    """Paths of the files ``generate_artifacts`` writes."""

    training_model: Path
    eval_model: Path
    optimizer_model: Path | None
    checkpoint: Path


def _initializer_names(model: onnx.ModelProto) -> list[str]:
    return [init.name for init in model.graph.initializer]


def _resolve_names(
    model: onnx.ModelProto, converted: onnx.ModelProto, names: Sequence[str], argument: str
) -> list[str]:
    """``names`` as initializer names: ONNX or torch names, globs, module prefixes, as the Trainer takes them.

    ``parameters.ParameterNames`` is the one resolver; torch names come from ``model``'s export
    metadata (``convert`` keeps initializer names). ``torch.onnx.export`` renames LSTM weights
    (``val_109``); ``ortlstm.graphs.lstm_parameters(model)`` lists each LSTM's W, R, B.

    Raises:
        ValueError: A name selects no initializer (the refusal lists them), or half of a folded one.
    """
    names_of = ParameterNames.of(_initializer_names(converted), torch_sources(model))
    return names_of.select(argument, names, verb="train" if argument == "requires_grad" else "freeze")


def _fix_gradient_nodes(model: onnx.ModelProto) -> None:
    """Copies forward attributes onto LSTMGrad / GRUGrad nodes and blanks inputs nothing produces."""
    graph = model.graph
    gradient_of = {(wiring.gradient.domain, wiring.gradient.name): wiring.forward for wiring in RECURRENT_WIRINGS}
    forward_by_name = {
        node.name: node
        for node in graph.node
        if any((node.domain, node.op_type) == (forward.domain, forward.name) for forward in gradient_of.values())
    }
    produced = {name for node in graph.node for name in node.output}
    produced.update(value.name for value in graph.input)
    produced.update(init.name for init in graph.initializer)
    for node in graph.node:
        forward_spec = gradient_of.get((node.domain, node.op_type))
        if forward_spec is None:
            continue
        forward_name, _, _ = node.name.rpartition(_GRADIENT_NODE_INFIX)
        forward = forward_by_name.get(forward_name)
        if forward is None or forward.op_type != forward_spec.name:
            raise RuntimeError(
                f"gradient node {node.name!r} has no forward {forward_spec.name} node {forward_name!r}; "
                "onnxruntime-training's naming of gradient nodes changed"
            )
        del node.attribute[:]
        node.attribute.extend(forward.attribute)
        for index, name in enumerate(node.input):
            if name and name not in produced:
                node.input[index] = ""


def _cap_ir_version(path: Path) -> None:
    model = onnx.load(str(path))
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
        onnx.save(model, str(path))


def _lstm_inputs_named(model: onnx.ModelProto, port_names: tuple[str, ...]) -> set[str]:
    """Values fed to the given inputs of the main graph's LSTMTraining and GRUTraining nodes (those they have)."""
    found = set()
    for forward in (wiring.forward for wiring in RECURRENT_WIRINGS):
        ports = [schema.input_index(forward, name) for name in port_names if name in schema.input_names(forward)]
        found |= {
            node.input[index]
            for node in model.graph.node
            if node.op_type == forward.name and node.domain == forward.domain
            for index in ports
            if index < len(node.input) and node.input[index]
        }
    return found


# onnxruntime-training 1.19 drops output k of a registered gradient node unless forward input k
# needs a gradient. LSTMGrad's outputs dH0, dC0, dP sit at positions 4-6, facing sequence_lens,
# initial_h and initial_c, so the generator cannot produce the gradients of these inputs.
_UNTRAINABLE_PORTS = ("initial_h", "initial_c", "P")
_UNTRAINABLE_REASON = (
    "onnxruntime-training 1.19 keeps output k of a custom gradient node only if forward input k needs a "
    "gradient, and LSTMGrad's dH0, dC0, dP (outputs 4-6) face the forward inputs sequence_lens, initial_h and "
    "initial_c, so generate_artifacts cannot train an LSTM's initial_h, initial_c or P. LSTMGrad computes these "
    "gradients (see ortlstm.graphs.build_gradient_model); through generate_artifacts, train W, R, B and the "
    "rest of the model."
)


def _check_trainable(model: onnx.ModelProto, requires_grad: Sequence[str]) -> None:
    untrainable = _lstm_inputs_named(model, _UNTRAINABLE_PORTS)
    blocked = [name for name in requires_grad if name in untrainable]
    if blocked:
        raise ValueError(f"requires_grad: {blocked} feed an LSTM's initial_h, initial_c or P. {_UNTRAINABLE_REASON}")


def _check_generator_inputs(model: onnx.ModelProto, requires_grad: Sequence[str] | None, kwargs: dict) -> None:
    """Refuses, before onnxruntime-training runs, what its generator would fail on deep inside."""
    nested = [node for node in lstm_locations(model) if node.where != MAIN_GRAPH]
    if nested:
        places = ", ".join(f"{node.name or '(unnamed)'!r} in {node.where}" for node in nested)
        raise ValueError(
            f"LSTMs inside subgraphs or functions: {places}. onnxruntime-training's generator differentiates the "
            "main graph only. Inline the functions (onnx.inliner.inline_local_functions) and export without "
            "control flow around the LSTMs, or train with ortlstm.training.Trainer, which differentiates "
            "subgraphs' LSTMs too."
        )
    if requires_grad is not None and len(requires_grad) == 0:
        raise ValueError(
            "requires_grad is empty: there is nothing to train. Name the initializers to train "
            "(ortlstm.graphs.lstm_parameters(model) lists each LSTM's W, R, B), or pass None to train every float "
            "initializer."
        )
    outputs = [output.name for output in model.graph.output]
    if len(outputs) > 1 and not kwargs.get("loss_input_names"):
        raise ValueError(
            f"the model has {len(outputs)} outputs {outputs} and the loss would receive all of them. Name the "
            f"output(s) the loss reads: loss_input_names=[{outputs[0]!r}] (ortlstm artifacts: --loss-input "
            f"{outputs[0]})."
        )


def lstm_parameters(model: onnx.ModelProto) -> list[dict[str, str]]:
    """The W, R, B (and P) value names of each LSTM / LSTMTraining node of the main graph.

    Exporters rename weights (``torch.onnx.export`` writes LSTM weights as new initializers such as
    ``val_109``); this tells which initializer is which, e.g. to pass them as ``requires_grad``.
    """
    result = []
    for node in model.graph.node:
        if is_onnx_lstm(node) or (node.op_type == schema.LSTM_TRAINING.name and node.domain == schema.DOMAIN):
            ports = {}
            for port_name in ("W", "R", "B", "P"):
                index = schema.input_index(schema.LSTM_TRAINING, port_name)
                if index < len(node.input) and node.input[index]:
                    ports[port_name] = node.input[index]
            result.append({"node": node.name, **ports})
    return result


def generate_artifacts(
    model: onnx.ModelProto,
    requires_grad: Sequence[str] | None = None,
    frozen_params: Sequence[str] | None = None,
    loss: Any = None,
    optimizer: Any = None,
    artifact_directory: str | os.PathLike[str] = "artifacts",
    **kwargs: Any,
) -> TrainingArtifacts:
    """Writes training, eval and optimizer models and a checkpoint for ``model``.

    Same arguments as ``onnxruntime.training.artifacts.generate_artifacts``; the model may hold
    standard ONNX LSTM nodes (converted here) or ortlstm LSTMTraining nodes.

    Args:
        model: The model whose outputs the loss reads.
        requires_grad: Initializers to train, by ONNX or torch name, glob or module prefix
            (``parameters.ParameterNames``, as the Trainer takes them). Default: every float
            initializer not in ``frozen_params`` and not an LSTM's initial_h / initial_c (exporters write a zero
            initial state as an initializer, e.g. torch.onnx.export's dynamo exporter; PyTorch
            does not train it).
        frozen_params: Initializers kept fixed (named as ``requires_grad``).
        loss: An ``onnxruntime.training.artifacts.LossType`` or an onnxblock loss block.
        optimizer: An ``onnxruntime.training.artifacts.OptimType`` (None: no optimizer model).
        artifact_directory: Where to write; created if missing.
        **kwargs: Passed to onnxruntime-training's ``generate_artifacts``.

    Returns:
        The paths written.

    Raises:
        ImportError: onnxruntime-training is not installed.
        ValueError: A parameter name is not an initializer, the model cannot be converted, an LSTM
            sits in a subgraph or function, ``requires_grad`` is empty, or the model has several
            outputs and no ``loss_input_names``.
    """
    _check_generator_inputs(model, requires_grad, kwargs)
    import_training_runtime()
    artifacts_module = importlib.import_module("onnxruntime.training.artifacts")
    converted = convert(model) if any(is_onnx_lstm(node) for node in model.graph.node) else model
    converted = convert_rnns(convert_grus(converted))
    frozen = _resolve_names(model, converted, list(frozen_params or []), "frozen_params")
    if requires_grad is None:
        requires_grad = _default_requires_grad(converted, frozen)
    requires_grad = _resolve_names(model, converted, requires_grad, "requires_grad")
    _check_trainable(converted, requires_grad)
    register_gradient()

    directory = Path(artifact_directory)
    directory.mkdir(parents=True, exist_ok=True)
    artifacts_module.generate_artifacts(
        converted,
        requires_grad=list(requires_grad),
        frozen_params=frozen,
        loss=loss,
        optimizer=optimizer,
        artifact_directory=str(directory),
        custom_op_library=library_path(),
        **kwargs,
    )
    result = TrainingArtifacts(
        training_model=directory / "training_model.onnx",
        eval_model=directory / "eval_model.onnx",
        optimizer_model=(directory / "optimizer_model.onnx") if optimizer is not None else None,
        checkpoint=directory / "checkpoint",
    )
    _finish(result)
    return result


def _default_requires_grad(converted: onnx.ModelProto, frozen: Sequence[str]) -> list[str]:
    """Every float initializer of rank >= 1 but the frozen ones and the LSTMs' initial states.

    Exported initial states are constants (PyTorch does not train them), and P cannot be
    trained through this generator: neither is picked by default.

    Raises:
        ValueError: The LSTMs have peephole weights (name what to train instead).
    """
    peepholes = _lstm_inputs_named(converted, ("P",))
    if peepholes:
        raise ValueError(
            f"the model's LSTMs have peephole weights {sorted(peepholes)}: pass requires_grad explicitly. "
            + _UNTRAINABLE_REASON
        )
    states = _lstm_inputs_named(converted, ("initial_h", "initial_c"))
    return [
        init.name
        for init in converted.graph.initializer
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
        and len(init.dims) > 0
        and init.name not in frozen
        and init.name not in states
    ]


def _finish(artifacts: TrainingArtifacts) -> None:
    """Fixes the generator's gradient nodes and caps every model's IR version for onnxruntime 1.19."""
    training_model = onnx.load(str(artifacts.training_model))
    _fix_gradient_nodes(training_model)
    training_model.ir_version = min(training_model.ir_version, MAX_IR_VERSION)
    onnx.save(training_model, str(artifacts.training_model))
    _cap_ir_version(artifacts.eval_model)
    if artifacts.optimizer_model is not None:
        _cap_ir_version(artifacts.optimizer_model)


def open_training(artifacts: TrainingArtifacts, **options: object) -> tuple[Any, Any, Any]:
    """Loads artifacts into onnxruntime-training's API with the ortlstm kernels registered.

    Args:
        artifacts: What :func:`generate_artifacts` returned.
        **options: ``onnxruntime.SessionOptions`` attributes, e.g. ``intra_op_num_threads=2``.

    Returns:
        ``(module, optimizer, state)``: ``onnxruntime.training.api`` ``Module``, ``Optimizer``
        (None without an optimizer model) and ``CheckpointState``.
    """
    import_training_runtime()
    api = importlib.import_module("onnxruntime.training.api")
    state = api.CheckpointState.load_checkpoint(str(artifacts.checkpoint))
    module = api.Module(
        str(artifacts.training_model),
        state,
        str(artifacts.eval_model),
        session_options=session_options(**options),
    )
    optimizer = None
    if artifacts.optimizer_model is not None:
        optimizer = api.Optimizer(str(artifacts.optimizer_model), module)
    return module, optimizer, state


def export_inference_model(
    artifacts: TrainingArtifacts,
    state: Any,
    output_names: Sequence[str],
    path: str | os.PathLike[str],
) -> onnx.ModelProto:
    """Writes the eval model with the current parameters as initializers and without the loss.

    What ``Module.export_model_for_inferencing`` does, which onnxruntime-training 1.19 cannot do
    for these models: it reloads the eval model without the session's custom-op library and
    fails with "ortlstm:LSTMTraining(-1) is not a registered function/op". The result keeps the
    ``LSTMTraining`` nodes: run it with ``onnxruntime.InferenceSession(path,
    ortlstm.ops.session_options())``, also in plain onnxruntime.

    Args:
        artifacts: What :func:`generate_artifacts` returned.
        state: The ``CheckpointState`` from :func:`open_training`, after training.
        output_names: Values of the model to output, e.g. the exported model's own outputs
            (the loss's inputs).
        path: Where to write the model.

    Returns:
        The model written.

    Raises:
        ValueError: An output name is not a value of the eval model.
    """
    model = onnx.load(str(artifacts.eval_model))
    graph = model.graph
    value_infos = {value.name: value for value in [*graph.input, *graph.value_info, *graph.output]}
    known = {value.name for value in graph.input} | {name for node in graph.node for name in node.output if name}
    unknown = [name for name in output_names if name not in known]
    if unknown:
        raise ValueError(
            f"export_inference_model: outputs {unknown} are not values of the eval model {artifacts.eval_model}; "
            f"its user inputs are {[value.name for value in graph.input if value.name not in state.parameters]}. "
            "Pass the exported model's output names (the inputs of the loss)."
        )

    # Keep only the nodes the outputs depend on (this drops the loss).
    needed = prune_to_outputs(graph, output_names)
    del graph.output[:]
    # The generator drops the type of the model outputs it feeds to the loss; ORT infers it.
    graph.output.extend(value_infos.get(name, onnx.ValueInfoProto(name=name)) for name in output_names)

    # Parameters (trained and frozen) become initializers; inputs nothing reads any more go.
    parameters = state.parameters
    inputs = list(graph.input)
    del graph.input[:]
    for value in inputs:
        if value.name not in needed:
            continue
        if value.name in parameters:
            graph.initializer.append(onnx.numpy_helper.from_array(parameters[value.name].data, value.name))
        else:
            graph.input.append(value)
    value_info = [value for value in graph.value_info if value.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(value_info)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    onnx.save(model, str(path))
    return model
