"""Training artifacts for models with LSTMs, through onnxruntime-training's generator.

``generate_artifacts`` converts the model's LSTM nodes, registers the gradient, calls
``onnxruntime.training.artifacts.generate_artifacts`` and repairs what that generator cannot do
for a custom op: it copies each forward node's attributes onto its gradient node (the registry
has no way to say "same attributes"), blanks gradient inputs that nothing produces (outputs that
do not reach the loss), and writes every model with an IR version onnxruntime 1.19 loads.
``open_training`` loads the result into ``onnxruntime.training.api`` objects.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import onnx

try:
    from ortlstm.graphs.convert import MAX_IR_VERSION, convert, is_onnx_lstm
    from ortlstm.graphs.gradient import import_training_runtime, register_gradient
    from ortlstm.ops import library_path, schema, session_options
except ModuleNotFoundError:
    from graphs.convert import MAX_IR_VERSION, convert, is_onnx_lstm  # type: ignore[no-redef]
    from graphs.gradient import import_training_runtime, register_gradient  # type: ignore[no-redef]
    from ops import library_path, schema, session_options  # type: ignore[no-redef]

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


def _check_parameter_names(model: onnx.ModelProto, names: Iterable[str], argument: str) -> None:
    available = set(_initializer_names(model))
    missing = [name for name in names if name not in available]
    if missing:
        float_params = [
            init.name
            for init in model.graph.initializer
            if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) and len(init.dims) > 0
        ]
        raise ValueError(
            f"{argument}: {missing} are not initializers of the model, so they cannot be trained or frozen. "
            f"The model's float initializers are: {float_params}. torch.onnx.export may rename LSTM weights "
            "(e.g. val_109); ortlstm.graphs.lstm_parameters(model) lists each LSTM's W, R, B."
        )


def _fix_gradient_nodes(model: onnx.ModelProto) -> None:
    """Copies forward attributes onto LSTMGrad nodes and blanks inputs nothing produces."""
    graph = model.graph
    forward_by_name = {
        node.name: node
        for node in graph.node
        if node.op_type == schema.LSTM_TRAINING.name and node.domain == schema.LSTM_TRAINING.domain
    }
    produced = {name for node in graph.node for name in node.output}
    produced.update(value.name for value in graph.input)
    produced.update(init.name for init in graph.initializer)
    for node in graph.node:
        if node.op_type != schema.LSTM_GRAD.name or node.domain != schema.LSTM_GRAD.domain:
            continue
        forward_name, _, _ = node.name.rpartition(_GRADIENT_NODE_INFIX)
        forward = forward_by_name.get(forward_name)
        if forward is None:
            raise RuntimeError(
                f"gradient node {node.name!r} has no forward LSTMTraining node {forward_name!r}; "
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
        requires_grad: Initializers to train. Default: every float initializer not in
            ``frozen_params``.
        frozen_params: Initializers kept fixed.
        loss: An ``onnxruntime.training.artifacts.LossType`` or an onnxblock loss block.
        optimizer: An ``onnxruntime.training.artifacts.OptimType`` (None: no optimizer model).
        artifact_directory: Where to write; created if missing.
        **kwargs: Passed to onnxruntime-training's ``generate_artifacts``.

    Returns:
        The paths written.

    Raises:
        ImportError: onnxruntime-training is not installed.
        ValueError: A parameter name is not an initializer, or the model cannot be converted.
    """
    import_training_runtime()
    artifacts_module = importlib.import_module("onnxruntime.training.artifacts")
    converted = convert(model) if any(is_onnx_lstm(node) for node in model.graph.node) else model
    frozen = list(frozen_params or [])
    if requires_grad is None:
        requires_grad = [
            init.name
            for init in converted.graph.initializer
            if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
            and len(init.dims) > 0
            and init.name not in frozen
        ]
    _check_parameter_names(converted, requires_grad, "requires_grad")
    _check_parameter_names(converted, frozen, "frozen_params")
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
    training_model = onnx.load(str(result.training_model))
    _fix_gradient_nodes(training_model)
    training_model.ir_version = min(training_model.ir_version, MAX_IR_VERSION)
    onnx.save(training_model, str(result.training_model))
    _cap_ir_version(result.eval_model)
    if result.optimizer_model is not None:
        _cap_ir_version(result.optimizer_model)
    return result


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
