"""The Trainer: trains an exported model in any onnxruntime, without onnxruntime-training or torch.

It runs the models ``ortlstm.graphs.train_step.build_training_models`` builds (train step, eval,
gradients, apply) in ``onnxruntime.InferenceSession``s with the ortlstm kernel library, keeps the
parameters and optimizer state between steps, and offers what onnxruntime-training's Module,
Optimizer and CheckpointState gave: steps, evaluation, learning-rate schedules, gradient
accumulation, one-file checkpoints (safetensors) and the trained model in its original form
(standard ONNX ``LSTM`` nodes), which any onnxruntime runs without ortlstm.

The layers, one module each: ``spec`` (``TrainingSpec``, the one list of options), ``engine``
(sessions, double-buffered values, bindings, scalars), ``feeds`` (batch and target checks,
carried LSTM state), ``guard`` (non-finite updates), ``checkpoint`` (files, directories, export)
and ``trainer`` (``Trainer``, the facade over them). Continuing an onnxruntime-training run is
``ortlstm.ort_training``; the graph rewrites are ``ortlstm.graphs.carried_state`` and
``ortlstm.graphs.structure``.

onnxruntime is imported lazily (building models needs only onnx); onnxruntime.training never.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ortlstm.graphs.carried_state import CarriedState, with_carried_state
from ortlstm.graphs.structure import graph_hash
from ortlstm.training.checkpoint import (
    CHECKPOINT_FORMAT,
    DIRECTORY_FORMAT,
    MANIFEST_FILE,
    ORIGINAL_FILE,
    QUANTIZE_CHOICES,
    STATE_FILE,
    export_directory,
    export_model,
    export_trained_model,
)
from ortlstm.training.engine import MODEL_KINDS, float64_disabled_optimizers
from ortlstm.training.guard import NONFINITE_MODES, NonFiniteStepError
from ortlstm.training.spec import LearningRate, TrainingSpec
from ortlstm.training.trainer import Trainer

if TYPE_CHECKING:
    from ortlstm.ort_training import (
        ORT_TRAINING_ADAMW_EPS,
        OrtTrainingCheckpoint,
        OrtTrainingImport,
        read_onnxruntime_training_checkpoint,
    )

# The onnxruntime-training 1.19.2 names this package re-exports, read from ortlstm.ort_training when
# first asked for (PEP 562): ortlstm.ort_training imports ortlstm.training.checkpoint, so importing it
# here at module level made the two packages import each other and put the 1.19.2 path into every
# `import ortlstm.training`.
_ORT_TRAINING_NAMES = (
    "ORT_TRAINING_ADAMW_EPS",
    "OrtTrainingCheckpoint",
    "OrtTrainingImport",
    "read_onnxruntime_training_checkpoint",
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "DIRECTORY_FORMAT",
    "MANIFEST_FILE",
    "MODEL_KINDS",
    "NONFINITE_MODES",
    "ORIGINAL_FILE",
    "ORT_TRAINING_ADAMW_EPS",
    "QUANTIZE_CHOICES",
    "STATE_FILE",
    "CarriedState",
    "LearningRate",
    "NonFiniteStepError",
    "OrtTrainingCheckpoint",
    "OrtTrainingImport",
    "Trainer",
    "TrainingSpec",
    "export_directory",
    "export_model",
    "export_trained_model",
    "float64_disabled_optimizers",
    "graph_hash",
    "read_onnxruntime_training_checkpoint",
    "with_carried_state",
]


def __getattr__(name: str) -> Any:
    """Imports ``ortlstm.ort_training`` on the first use of one of its re-exported names."""
    if name in _ORT_TRAINING_NAMES:
        import ortlstm.ort_training

        return getattr(ortlstm.ort_training, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
