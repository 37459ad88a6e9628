"""Builders of ONNX training graphs around the ortlstm ops.

- ``convert``: standard ONNX ``LSTM`` nodes -> ortlstm ``LSTMTraining`` nodes.
- ``register_gradient``: tells onnxruntime-training that ``LSTMGrad`` differentiates them.
- ``generate_artifacts`` / ``open_training``: training artifacts and their onnxruntime-training
  session objects; ``export_inference_model``: the trained model, for inference.
- ``build_gradient_model``: a standalone model computing an LSTM's outputs and all gradients.

Nothing here imports onnxruntime at import time; the functions that need it import it lazily.
"""

from __future__ import annotations

try:
    from ortlstm.graphs.artifacts import (
        TrainingArtifacts,
        export_inference_model,
        generate_artifacts,
        lstm_parameters,
        open_training,
    )
    from ortlstm.graphs.convert import convert
    from ortlstm.graphs.gradient import gradient_definition, register_gradient
    from ortlstm.graphs.standalone import LstmGraphConfig, build_gradient_model
except ModuleNotFoundError:
    from graphs.artifacts import (  # type: ignore[no-redef]
        TrainingArtifacts,
        export_inference_model,
        generate_artifacts,
        lstm_parameters,
        open_training,
    )
    from graphs.convert import convert  # type: ignore[no-redef]
    from graphs.gradient import gradient_definition, register_gradient  # type: ignore[no-redef]
    from graphs.standalone import LstmGraphConfig, build_gradient_model  # type: ignore[no-redef]

__all__ = [
    "LstmGraphConfig",
    "TrainingArtifacts",
    "build_gradient_model",
    "convert",
    "export_inference_model",
    "generate_artifacts",
    "gradient_definition",
    "lstm_parameters",
    "open_training",
    "register_gradient",
]
