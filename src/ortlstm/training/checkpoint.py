"""Checkpoints, training directories and the trained model.

- A checkpoint is one safetensors file: tensors ``param/NAME``, ``state/NAME/SLOT``,
  ``fixed/NAME`` (fixed inputs) and ``carried/INPUT`` (a stateful trainer's carried LSTM state);
  metadata: the format, the step counts, the learning rate (when constant), the spec's JSON and
  the graph hash of the original model.
- A training directory (``ortlstm train-step``, ``Trainer.write``) holds the original model, the
  four training models, a manifest (format, graph hash, spec, signature) and a checkpoint.
- ``export_trained_model`` writes trained values back into the original model; ``export_model``
  writes it to a file, float32 or re-quantized (``quantize="dynamic"``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs.emit.graph_utils import walk_graphs
from ortlstm.graphs.model_files import load_model_file
from ortlstm.graphs.prepare.dequantize import (
    QUANTIZE_CHOICES,
    Quantization,
    dequantize_model,
    is_quantized,
    quantization_of,
)
from ortlstm.graphs.prepare.torch_folds import restructure_for_export
from ortlstm.graphs.structure import graph_hash, set_constant
from ortlstm.graphs.train_step import TrainStepSignature
from ortlstm.training.engine import MODEL_KINDS
from ortlstm.training.spec import TrainingSpec, signature_from_json, signature_to_json

CHECKPOINT_FORMAT = "ortlstm.trainer/1"
DIRECTORY_FORMAT = "ortlstm.training-directory/1"
ORIGINAL_FILE = "model.onnx"
MANIFEST_FILE = "training.json"
STATE_FILE = "state.safetensors"


def load_model(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """The model itself, or the one in the file ``model`` (``load_model_file``: errors name the file)."""
    if isinstance(model, onnx.ModelProto):
        return model
    return load_model_file(model)


def export_trained_model(original: onnx.ModelProto, params: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The original model with the trained values: standard ops only, no ortlstm needed to run it.

    The graph is the one given, as shipped: its opset and IR version stay even when training
    converted an old opset up (``prepare_model``), and only tensor values change, except where the
    exporter merged or folded torch parameters: those are untied or recomputed as training had them
    (``prepare.torch_folds.restructure_for_export``). Each parameter
    goes back where preparation found it: an initializer of the main graph or of a subgraph (a
    specialized ``If`` branch), or a ``Constant`` node's value in the form the node held it.

    An int8 model (onnxruntime.quantization's dynamic patterns) is written as the float model it
    trained as: each quantized op the float op it was made from (``prepare.dequantize``).

    Raises:
        ValueError: A parameter is found nowhere in the model, or its shape or type differs.
    """
    if is_quantized(original):
        original = dequantize_model(original)[0]
    result = onnx.ModelProto()
    # Parameters an exporter merged are untied, and tensors it folded from trained ones recomputed,
    # as in the train step (prepare.torch_folds): the trained copies need places of their own.
    result.CopyFrom(restructure_for_export(original, params))
    places: dict[str, onnx.TensorProto | onnx.NodeProto] = {}
    for graph in walk_graphs(result.graph):
        for init in graph.initializer:
            places.setdefault(init.name, init)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
                places.setdefault(node.output[0], node)
    missing = sorted(set(params) - set(places))
    if missing:
        raise ValueError(
            f"export: {missing} are neither initializers nor Constant outputs of the original model; "
            "was the trainer built from a different model?"
        )
    for name, value in params.items():
        place = places[name]
        before = onnx.numpy_helper.to_array(place) if isinstance(place, onnx.TensorProto) else None
        if before is not None and (before.shape != value.shape or before.dtype != value.dtype):
            raise ValueError(
                f"export: {name!r} is {before.dtype} {list(before.shape)} in the model, "
                f"the trained value is {value.dtype} {list(value.shape)}"
            )
        # np.ascontiguousarray turns a 0-D array into a 1-D one: keep the parameter's own shape.
        contiguous = np.ascontiguousarray(value).reshape(np.shape(value))
        if isinstance(place, onnx.TensorProto):
            place.CopyFrom(onnx.numpy_helper.from_array(contiguous, name))
        else:
            set_constant(place, contiguous)
    return result


def export_model(
    original: onnx.ModelProto,
    params: Mapping[str, np.ndarray],
    path: str | Path | None = None,
    quantize: str | None = None,
) -> onnx.ModelProto:
    """``export_trained_model``, re-quantized when ``quantize="dynamic"``, written to ``path`` when given.

    ``"dynamic"`` runs onnxruntime.quantization.quantize_dynamic on the trained float model (int8
    weights, activations quantized at run time: DynamicQuantizeLSTM, MatMulInteger, ConvInteger), the
    tool that wrote shipped int8 models such as ddddocr's: per channel or per tensor as the original
    was (``prepare.dequantize.quantization_of``), int8 weights (its default; onnxruntime before 1.20
    runs ConvInteger on uint8 weights only); None writes float32.

    Raises:
        ValueError: ``quantize`` is not None or ``"dynamic"``; as ``export_trained_model``.
    """
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"export: quantize={quantize!r}; pass None (float32, the default) or 'dynamic'")
    model = export_trained_model(original, params)
    if quantize == "dynamic":
        model = quantize_dynamic(model, quantization_of(original))
    if path is not None:
        onnx.save(model, str(path))
    return model


def quantize_dynamic(model: onnx.ModelProto, quantization: Quantization) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime.quantization.quantize_dynamic (which works on files)."""
    from onnxruntime.quantization import quantize_dynamic as quantize  # ships with onnxruntime, imports no torch

    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder, "float.onnx"), Path(folder, "int8.onnx")
        onnx.save(model, str(source))
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # its advice to run onnxruntime's pre-processing script first, on every call
        try:
            quantize(source, target, per_channel=quantization.per_channel)  # int8 weights, its default
        finally:
            root.setLevel(level)
        return onnx.load(str(target))


# ---- checkpoint files ---------------------------------------------------------------------------


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and restored at once (the only portable way to read it)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[str], None]) -> Path:
    """Calls ``write(temporary)`` for a file beside ``path``, then moves it over ``path`` in one step.

    A reader sees the old file or the new one, never a partial one, and a failed write leaves the
    old file as it was. The file gets the mode ``open()`` would give it: an existing file's own
    mode, else 0o666 less the umask (0644 with umask 022), not ``mkstemp``'s private 0600, so that
    a checkpoint is as readable as any other file the user writes.

    Raises:
        IsADirectoryError: ``path`` is a directory.
        FileNotFoundError: Its directory does not exist.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    # Refused before the temporary file is made: it would go beside the folder, in its parent.
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory: pass a file path, e.g. {path / 'run.safetensors'}")
    if not directory.is_dir():
        raise FileNotFoundError(f"cannot write {path}: no directory {directory} (create it first)")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(handle)
    try:
        write(temporary)
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return path


def write_checkpoint(
    path: str | Path,
    *,
    parameters: Mapping[str, np.ndarray],
    optimizer_state: Mapping[str, Mapping[str, np.ndarray]],
    fixed_inputs: Mapping[str, np.ndarray],
    carried: Mapping[str, np.ndarray],
    global_step: int,
    skipped_steps: int,
    lr: Any,
    spec: TrainingSpec,
    graph_sha256: str,
) -> Path:
    """Writes a checkpoint (the module docstring lists its tensors and metadata) atomically; returns its path."""
    from safetensors.numpy import save_file

    tensors = {f"param/{name}": value for name, value in parameters.items()}
    for name, slots in optimizer_state.items():
        tensors.update({f"state/{name}/{slot}": value for slot, value in slots.items()})
    tensors.update({f"fixed/{name}": value for name, value in fixed_inputs.items()})
    tensors.update({f"carried/{name}": value for name, value in carried.items()})

    metadata = {
        "format": CHECKPOINT_FORMAT,
        "global_step": str(global_step),
        "skipped_steps": str(skipped_steps),
        "lr": "schedule" if callable(lr) else repr(float(lr)),
        "spec": json.dumps(spec.to_json()),
        "graph_sha256": graph_sha256,
    }
    # reshape: np.ascontiguousarray turns a 0-D array into a 1-D one; the tensor keeps its shape.
    contiguous = {key: np.ascontiguousarray(value).reshape(np.shape(value)) for key, value in tensors.items()}
    return atomic_write(path, lambda temporary: save_file(contiguous, temporary, metadata=metadata))


def read_checkpoint(path: str | Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The metadata and tensors of a checkpoint.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not a safetensors file, or not a Trainer checkpoint.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file {str(path)!r}")
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
    except Exception as error:
        raise ValueError(f"{path}: not a safetensors file ({error})") from error
    if metadata.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not an ortlstm Trainer checkpoint (format {metadata.get('format')!r})")
    return metadata, tensors


def tensors_under(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The tensors whose key is ``prefix/NAME``, by NAME (``fixed``, ``carried``, ``param``)."""
    return {key.split("/", 1)[1]: value for key, value in tensors.items() if key.startswith(f"{prefix}/")}


def check_values(where: str, values: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> None:
    """Raises ValueError naming the first value whose shape or type is not the expected one's."""
    for name, value in values.items():
        if value.shape != expected[name].shape or value.dtype != expected[name].dtype:
            raise ValueError(
                f"{where}: {name!r} is {value.dtype} {list(value.shape)} in the checkpoint, "
                f"the model expects {expected[name].dtype} {list(expected[name].shape)}"
            )


Difference = tuple[str, Any, Any]
"""One setting that differs: its dotted name (``optimizer.betas``), the saved value, the current one."""


def differing_settings(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[Difference]:
    """Each setting whose value differs, nested objects walked down to the field (``optimizer.betas``).

    A refusal then names the one field that differs, not two whole dicts of settings; of another
    optimizer or loss, only its ``name`` / ``kind``. A key that one side lacks has the value None there.
    """
    differing: list[Difference] = []
    for key in [*current, *(key for key in saved if key not in current)]:
        old, new, name = saved.get(key), current.get(key), f"{prefix}{key}"
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            # Another optimizer (or loss) differs in every field: its name (kind) alone says it.
            other = [field for field in ("name", "kind") if field in new and old.get(field) != new[field]]
            differing += [(f"{name}.{other[0]}", old.get(other[0]), new[other[0]])] if other else differing_settings(
                old, new, f"{name}."
            )
        elif old != new:
            differing.append((name, old, new))
    return differing


def settings_text(differing: Sequence[Difference]) -> tuple[str, str]:
    """The saved and the current values as ``lr=0.01 and batch_size=32``, ``lr=0.001 and batch_size=16``."""

    def shown(value: Any) -> str:
        return value if isinstance(value, str) else repr(value)

    return (
        " and ".join(f"{name}={shown(old)}" for name, old, _ in differing),
        " and ".join(f"{name}={shown(new)}" for name, _, new in differing),
    )


def saved_spec(path: str | Path, metadata: Mapping[str, str]) -> TrainingSpec:
    """The training spec a checkpoint's metadata records (fields added since it was written at their defaults).

    Raises:
        ValueError: The spec cannot be read.
    """
    try:
        return TrainingSpec.from_json(json.loads(metadata["spec"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: the checkpoint's training spec cannot be read ({error})") from error


def checkpoint_values(
    path: str | Path,
    metadata: Mapping[str, str],
    tensors: Mapping[str, np.ndarray],
    *,
    spec: TrainingSpec,
    signature: TrainStepSignature,
    expected: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """A checkpoint's parameters and optimizer state by input name, checked against this trainer's.

    Raises:
        ValueError: The checkpoint was saved with another spec (``TrainingSpec.graph_json``; the
            message names each field that differs), or a tensor is missing or of another shape or type.
    """
    differing = differing_settings(saved_spec(path, metadata).graph_json(), spec.graph_json())
    if differing:
        saved, here = settings_text(differing)
        raise ValueError(
            f"{path}: the checkpoint was saved with {saved}, this trainer has {here} (build the Trainer with the "
            "same options, or rebuild the saved one with Trainer.from_checkpoint(model, path))"
        )
    values: dict[str, Any] = {}
    for name in signature.params:
        values[name] = tensors.get(f"param/{name}")
        for slot, value in signature.state[name].items():
            values[value] = tensors.get(f"state/{name}/{slot}")
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise ValueError(f"{path}: the checkpoint lacks {missing}")
    check_values(str(path), values, expected)
    return values


# ---- training directories -------------------------------------------------------------------------


def write_directory(
    directory: Path,
    original: onnx.ModelProto,
    models: Mapping[str, onnx.ModelProto],
    spec: TrainingSpec,
    signature: TrainStepSignature,
    graph_sha256: str,
) -> None:
    """Writes the original model, the training models and the manifest (the state: ``STATE_FILE``)."""
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(original, str(directory / ORIGINAL_FILE))
    for kind in MODEL_KINDS:
        onnx.save(models[kind], str(directory / f"{kind}.onnx"))
    manifest = {
        "format": DIRECTORY_FORMAT,
        "graph_sha256": graph_sha256,
        "spec": spec.to_json(),
        "signature": signature_to_json(signature),
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")


def read_directory(
    directory: Path,
) -> tuple[onnx.ModelProto, dict[str, onnx.ModelProto], TrainStepSignature, TrainingSpec, dict[str, np.ndarray]]:
    """The original model, training models, signature, spec and placeholder values of a directory.

    The values are zeros of each parameter's shape and type (the checkpoint holds the real ones).

    Raises:
        FileNotFoundError: The directory lacks one of its files.
        ValueError: The manifest is of another format.
    """
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{str(directory)!r} holds no {MANIFEST_FILE}: write one with `ortlstm train-step MODEL.onnx "
            f"{directory}` or Trainer.write()"
        )
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != DIRECTORY_FORMAT:
        raise ValueError(f"{manifest_path}: format {manifest.get('format')!r}, expected {DIRECTORY_FORMAT!r}")
    models = {kind: load_model(directory / f"{kind}.onnx") for kind in MODEL_KINDS}
    signature = signature_from_json(manifest["signature"])
    values: dict[str, np.ndarray] = {}
    for name in signature.params:
        init = next(init for init in models["train_step"].graph.input if init.name == name)
        values[name] = np.zeros(
            [dim.dim_value for dim in init.type.tensor_type.shape.dim],
            onnx.helper.tensor_dtype_to_np_dtype(init.type.tensor_type.elem_type),
        )
        for slot_input in signature.state[name].values():
            values[slot_input] = values[name]
    spec = TrainingSpec.from_json(manifest["spec"])
    return load_model(directory / ORIGINAL_FILE), models, signature, spec, values


def export_directory(
    directory: str | Path, output: str | Path, checkpoint: str | Path | None = None, quantize: str | None = None
) -> onnx.ModelProto:
    """Writes the trained original model of a training directory (``ortlstm export``).

    Args:
        directory: Written by ``ortlstm train-step`` or ``Trainer.write``.
        output: Where to write the model.
        checkpoint: The state to export (default: ``directory/state.safetensors``).
        quantize: None (float32) or ``"dynamic"`` (``export_model``).

    Raises:
        FileNotFoundError: The directory or checkpoint is missing.
        ValueError: The checkpoint belongs to another model.
    """
    directory = Path(directory)
    original_path = directory / ORIGINAL_FILE
    if not original_path.is_file():
        raise FileNotFoundError(
            f"{str(directory)!r} holds no {ORIGINAL_FILE}: is it a directory written by `ortlstm train-step`?"
        )
    original = load_model_file(original_path)
    metadata, tensors = read_checkpoint(checkpoint if checkpoint is not None else directory / STATE_FILE)
    if metadata.get("graph_sha256") != graph_hash(original):
        raise ValueError(f"the checkpoint was saved for another model than {original_path}")
    return export_model(original, tensors_under(tensors, "param"), output, quantize)
