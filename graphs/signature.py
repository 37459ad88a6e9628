"""The names and initial values a train step comes with: ``TrainStepSignature``, ``TrainingModels``.

``build_training_models`` (graphs/train_step.py) returns them; trainers read every input and output
name from the signature, so nothing downstream guesses names. Protos and arrays only.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from ortlstm.graphs.prepare import PreparedModel


@dataclasses.dataclass(frozen=True)
class TrainStepSignature:
    """Names of every input and output of the training models.

    Attributes:
        batch_inputs: The model's own inputs, fed with each batch.
        target: The target (labels) input the loss reads, or None when a model output is the loss.
        loss: The loss output.
        extra_outputs: Model outputs returned alongside the loss.
        params: Trained parameters, as inputs (their names in the original model).
        new_params: Output carrying each parameter's updated value, same order as ``params``.
        frozen: Float initializers left as constants.
        state: Per parameter, optimizer state slot -> input name.
        new_state: Per parameter, optimizer state slot -> output name.
        grads: Per parameter, the gradient output of the ``gradients`` model and input of ``apply``.
        lr: The learning-rate input (a float64 scalar: torch keeps lr as a Python float).
        step: The step-count input (1-based number of this update, as torch counts).
        grad_norm: The total gradient norm output, when gradients are clipped.
        all_finite: A bool output of the train-step and apply models: the loss (train step) and
            every gradient are finite, so the update may be kept (``nonfinite_check``). None in
            models built without it (and in training directories written before it existed).
        extra_targets: The loss's other target inputs (``Loss.extra_targets``; ctc_loss:
            ``input_lengths``, ``target_lengths``): torch's name -> input name (the same name
            unless the model has a value of that name). Empty for one-target losses (and in
            training directories written before it existed). An optional one
            (``input_lengths``) is fed an empty array to have the loss derive it.
    """

    batch_inputs: tuple[str, ...]
    target: str | None
    loss: str
    extra_outputs: tuple[str, ...]
    params: tuple[str, ...]
    new_params: tuple[str, ...]
    frozen: tuple[str, ...]
    state: dict[str, dict[str, str]]
    new_state: dict[str, dict[str, str]]
    grads: dict[str, str]
    lr: str
    step: str
    grad_norm: str | None
    all_finite: str | None = None
    extra_targets: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TrainingModels:
    """What ``build_training_models`` returns.

    Attributes:
        train_step: One whole training step.
        eval: Forward and loss without training-mode Dropout.
        gradients: Forward, loss and parameter gradients (for gradient accumulation).
        apply: Clipping and the optimizer update, from summed gradients.
        signature: The names of every input and output.
        initial_params: Each parameter's starting value (from the model).
        initial_state: Each state input's starting value (zeros, as torch starts).
        prepared: The model after preparation (converted LSTMs, specialized branches).
    """

    train_step: onnx.ModelProto
    eval: onnx.ModelProto
    gradients: onnx.ModelProto
    apply: onnx.ModelProto
    signature: TrainStepSignature
    initial_params: dict[str, np.ndarray]
    initial_state: dict[str, np.ndarray]
    prepared: PreparedModel
