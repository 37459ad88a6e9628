"""The onnxruntime-training (1.19.2) side of a Trainer: continuing a run of that path.

- ``read_onnxruntime_training_checkpoint``: the content of a ``CheckpointState.save_checkpoint``
  file, read with the flatbuffers classes plain onnxruntime ships.
- ``import_checkpoint``: a trainer's parameters and optimizer state from it, and what is not carried
  over (``OrtTrainingImport``); ``Trainer.from_onnxruntime_training_checkpoint`` and
  ``Trainer.load_onnxruntime_training_checkpoint`` are the entry points.

A package of its own, beside ``ortlstm.training``: the only place of the Trainer's code that may
import onnxruntime.training (to save a live ``CheckpointState``), so that nothing under
``ortlstm/training/`` does. Importing it imports neither onnxruntime nor onnxruntime.training.
"""

from __future__ import annotations

from ortlstm.ort_training.checkpoint import (
    ORT_TRAINING_ADAMW_EPS,
    OrtTrainingCheckpoint,
    checkpoint_file,
    read_onnxruntime_training_checkpoint,
)
from ortlstm.ort_training.importer import OrtTrainingImport, import_checkpoint, trainer_defaults

__all__ = [
    "ORT_TRAINING_ADAMW_EPS",
    "OrtTrainingCheckpoint",
    "OrtTrainingImport",
    "checkpoint_file",
    "import_checkpoint",
    "read_onnxruntime_training_checkpoint",
    "trainer_defaults",
]
