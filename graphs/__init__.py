"""Builders of ONNX training graphs around the ortlstm ops.

- ``convert``: standard ONNX ``LSTM`` nodes -> ortlstm ``LSTMTraining`` nodes.
- ``register_gradient``: tells onnxruntime-training that ``LSTMGrad`` differentiates them.
- ``generate_artifacts`` / ``open_training``: training artifacts and their onnxruntime-training
  session objects; ``export_inference_model``: the trained model, for inference.
- ``build_gradient_model``: a standalone model computing an LSTM's outputs and all gradients.
- ``build_training_models``: the train-step, eval, gradient and apply models that any plain
  onnxruntime runs (no training build, no torch), with ``losses`` and ``optimizers`` written in
  standard ops and gradients from ``autodiff``; ``register_gradient_rule`` adds a rule for a
  user's own op; ``prepare_model`` is the preparation those builders apply to an export.

Nothing here imports onnxruntime at import time; the functions that need it import it lazily.
"""

from __future__ import annotations

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.autodiff import register_gradient_rule
from ortlstm.graphs.convert import convert
from ortlstm.graphs.ort_training.artifacts import (
    TrainingArtifacts,
    export_inference_model,
    generate_artifacts,
    lstm_parameters,
    open_training,
)
from ortlstm.graphs.ort_training.gradient import gradient_definition, register_gradient
from ortlstm.graphs.prepare import PreparedModel, prepare_model
from ortlstm.graphs.standalone import LstmGraphConfig, build_gradient_model
from ortlstm.graphs.train_step import TrainingModels, TrainStepSignature, build_training_models

__all__ = [
    "LstmGraphConfig",
    "PreparedModel",
    "TrainStepSignature",
    "TrainingArtifacts",
    "TrainingModels",
    "build_gradient_model",
    "build_training_models",
    "convert",
    "export_inference_model",
    "generate_artifacts",
    "gradient_definition",
    "losses",
    "lstm_parameters",
    "open_training",
    "optimizers",
    "prepare_model",
    "register_gradient",
    "register_gradient_rule",
]
