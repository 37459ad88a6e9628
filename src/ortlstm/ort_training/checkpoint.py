"""onnxruntime-training checkpoints (``CheckpointState.save_checkpoint``), read without onnxruntime.training.

The file is flatbuffers in the schema onnxruntime ships (``onnxruntime.tools.ort_format_model``),
so plain onnxruntime reads it; onnxruntime.training is imported only to save a live
``CheckpointState`` object to a file first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper

ORT_TRAINING_ADAMW_EPS = 1e-6
"""The eps of onnxruntime-training's ``OptimType.AdamW`` (onnxblock's AdamW default; torch's is 1e-8)."""


@dataclasses.dataclass(frozen=True)
class OrtTrainingCheckpoint:
    """The content of an onnxruntime-training checkpoint file (``CheckpointState.save_checkpoint``).

    Attributes:
        parameters: The trained parameters, by name.
        frozen: The frozen parameters, by name.
        moments: Per parameter, its optimizer state by onnxruntime-training's names
            (AdamW: ``momentum0``, ``momentum1``); empty when saved without optimizer state.
        step: The optimizer's step count (updates done), or None without optimizer state.
        initial_lr: The optimizer's initial learning rate, or None without optimizer state.
        properties: The user properties (``CheckpointState.properties``).
    """

    parameters: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray]
    moments: dict[str, dict[str, np.ndarray]]
    step: int | None
    initial_lr: float | None
    properties: dict[str, int | float | str]


def _fbs_tensor(tensor: Any, path: Path) -> tuple[str, np.ndarray]:
    """One flatbuffers ``fbs.Tensor`` of a checkpoint as (name, array): inline or external data."""
    name = tensor.Name().decode()
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.DataType())).newbyteorder("<")
    dims = [int(tensor.Dims(index)) for index in range(tensor.DimsLength())]
    size = math.prod(dims) * dtype.itemsize
    offset = tensor.ExternalDataOffset()
    if offset >= 0:
        # Large checkpoints keep tensor bytes in "<checkpoint>.data", at the tensor's offset.
        external = Path(str(path) + ".data")
        with open(external, "rb") as handle:
            handle.seek(offset)
            data = handle.read(size)
    else:
        data = tensor.RawDataAsNumpy().tobytes() if tensor.RawDataLength() else b""
    if len(data) != size:
        raise ValueError(f"{path}: tensor {name!r} {dims} has {len(data)} bytes of data, expected {size}")
    return name, np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(dims)


def read_onnxruntime_training_checkpoint(path: str | Path) -> OrtTrainingCheckpoint:
    """Reads an onnxruntime-training checkpoint file (flatbuffers, format version 1 or 2).

    Uses the flatbuffers classes of the checkpoint schema that onnxruntime ships
    (``onnxruntime.tools.ort_format_model``), so plain onnxruntime reads it: onnxruntime.training
    is not imported.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not a checkpoint, a nominal checkpoint (no parameter values), or more than one
            optimizer group.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no onnxruntime-training checkpoint file {str(path)!r} (CheckpointState.save_checkpoint writes one)"
        )
    try:
        from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import Checkpoint
    except ImportError as error:
        raise ImportError(
            "reading an onnxruntime-training checkpoint needs onnxruntime (its bundled flatbuffers schema) "
            "and the flatbuffers package"
        ) from error
    buffer = path.read_bytes()
    try:
        root = Checkpoint.Checkpoint.GetRootAs(buffer, 0)
        module = root.ModuleState()
    except Exception as error:
        raise ValueError(f"{path}: not an onnxruntime-training checkpoint ({error})") from error
    if module is None:
        raise ValueError(f"{path}: the checkpoint holds no module state (parameters)")
    if module.IsNominalState():
        raise ValueError(
            f"{path}: a nominal checkpoint (generate_artifacts(..., nominal_checkpoint=True)) holds no parameter "
            "values; save the state of a loaded run instead"
        )
    parameters = dict(_fbs_tensor(module.RequiresGradParams(i), path) for i in range(module.RequiresGradParamsLength()))
    frozen = dict(_fbs_tensor(module.FrozenParams(i), path) for i in range(module.FrozenParamsLength()))
    groups = root.OptimizerGroupsLength()
    if groups > 1:
        raise ValueError(f"{path}: {groups} optimizer groups; only one (onnxruntime-training's group0) is supported")
    moments: dict[str, dict[str, np.ndarray]] = {}
    step = initial_lr = None
    if groups == 1:
        group = root.OptimizerGroups(0)
        step = int(group.Step())
        # Stored as float32: its shortest repr is the value the user wrote (1e-3, not 0.0010000000474974513).
        initial_lr = float(str(np.float32(group.InitialLearningRate())))
        for index in range(group.OptimizerStatesLength()):
            state = group.OptimizerStates(index)
            moments[state.ParamName().decode()] = dict(
                _fbs_tensor(state.Momentums(j), path) for j in range(state.MomentumsLength())
            )
    properties: dict[str, int | float | str] = {}
    bag = root.PropertyBag()
    if bag is not None:
        for index in range(bag.IntsLength()):
            properties[bag.Ints(index).Name().decode()] = int(bag.Ints(index).Value())
        for index in range(bag.FloatsLength()):
            properties[bag.Floats(index).Name().decode()] = float(bag.Floats(index).Value())
        for index in range(bag.StringsLength()):
            properties[bag.Strings(index).Name().decode()] = bag.Strings(index).Value().decode()
    return OrtTrainingCheckpoint(parameters, frozen, moments, step, initial_lr, properties)


@contextlib.contextmanager
def checkpoint_file(checkpoint: Any) -> Iterator[Path]:
    """A path to the checkpoint: the given one, or a live ``CheckpointState`` saved to a temporary file."""
    if isinstance(checkpoint, (str, Path)):
        yield Path(checkpoint)
        return
    try:
        from onnxruntime.training.api import CheckpointState
    except ImportError as error:
        raise TypeError(
            f"checkpoint must be a path or an onnxruntime.training.api.CheckpointState, got {type(checkpoint).__name__}"
        ) from error
    if not isinstance(checkpoint, CheckpointState):
        raise TypeError(
            f"checkpoint must be a path or an onnxruntime.training.api.CheckpointState, got {type(checkpoint).__name__}"
        )
    with tempfile.TemporaryDirectory(prefix="ortlstm-ort-training-") as directory:
        path = Path(directory) / "checkpoint"
        try:
            CheckpointState.save_checkpoint(checkpoint, str(path), include_optimizer_state=True)
        except Exception:  # no Optimizer was ever created over this state: parameters only
            CheckpointState.save_checkpoint(checkpoint, str(path))
        yield path
