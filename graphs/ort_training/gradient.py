"""The gradients of the recurrent ops (LSTMTraining, GRUTraining, RNNTraining) for onnxruntime-training's builder.

``gradient_definition()`` writes LSTMGrad's wiring to LSTMTraining, which ops/schema.py declares
(``schema.LSTM_TRAINING_GRADIENT``: each port's ``from_forward`` / ``gradient_of``), in
onnxruntime-training's placeholder notation: forward inputs ``I(i)``, outputs ``O(i)``, output
gradients ``GO(i)`` and input gradients ``GI(i)``; nothing here names a port by hand.
``register_gradient()`` hands it to onnxruntime-training, whose builder otherwise silently picks
its own com.microsoft gradient for any op called LSTMTraining. The ortlstm gradient rule
(autodiff/rules_lstm.py) reads the same wiring.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from types import ModuleType

from ortlstm.ops import schema


@dataclasses.dataclass(frozen=True)
class GradientDefinition:
    """One gradient node in onnxruntime-training's placeholder notation."""

    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


RECURRENT_WIRINGS = (schema.LSTM_TRAINING_GRADIENT, schema.GRU_TRAINING_GRADIENT, schema.RNN_TRAINING_GRADIENT)
"""The recurrent ops whose gradient ``register_gradient`` registers: LSTMTraining's, GRUTraining's, RNNTraining's."""


def gradient_definition(wiring: schema.GradientWiring = schema.LSTM_TRAINING_GRADIENT) -> GradientDefinition:
    """The gradient node (LSTMGrad by default) that differentiates one forward node, from the spec's wiring."""
    return GradientDefinition(
        wiring.gradient.name,
        wiring.gradient.domain,
        tuple(link.placeholder for link in wiring.inputs),
        tuple(link.placeholder for link in wiring.outputs),
    )


def gradient_key(wiring: schema.GradientWiring = schema.LSTM_TRAINING_GRADIENT) -> str:
    """The registry key onnxruntime-training looks the definition up by."""
    forward = wiring.forward
    return f"{forward.domain}::{forward.name}"


def import_training_runtime() -> ModuleType:
    """Imports ``onnxruntime.training``, or says how to get it.

    Raises:
        ImportError: The installed onnxruntime has no training API.
    """
    try:
        importlib.import_module("onnxruntime")
    except ModuleNotFoundError as error:
        raise ImportError(
            "training needs onnxruntime-training, which is not installed: pip install 'ortlstm[train]' "
            "(onnxruntime-training-cpu 1.19.2 and torch, which its training API imports)"
        ) from error
    try:
        return importlib.import_module("onnxruntime.training")
    except ModuleNotFoundError as error:
        raise ImportError(
            "the installed onnxruntime has no training API (onnxruntime.training): it is the inference "
            "package. Install the training build in a separate environment: pip install 'ortlstm[train]' "
            "(onnxruntime and onnxruntime-training-cpu share one package directory and cannot coexist)."
        ) from error


@functools.cache
def register_gradient() -> None:
    """Registers LSTMGrad, GRUGrad and RNNGrad as the gradients of their forward ops (``RECURRENT_WIRINGS``).

    Idempotent (the registry is process-wide). Call before ``generate_artifacts`` or any other
    use of onnxruntime-training's gradient builder on a converted model.

    Raises:
        ImportError: onnxruntime-training is not installed.
    """
    import_training_runtime()
    state = importlib.import_module("onnxruntime.capi._pybind_state")
    for wiring in RECURRENT_WIRINGS:
        definition = gradient_definition(wiring)
        node = state.GradientNodeDefinition()
        node.op_type = definition.op_type
        node.domain = definition.domain
        node.inputs = list(definition.inputs)
        node.outputs = list(definition.outputs)
        # Attributes cannot be copied from the forward node by the registry: generate_artifacts in
        # ortlstm.graphs.ort_training.artifacts copies them after the gradient graph is built.
        node.attributes = []
        state.register_gradient_definition(gradient_key(wiring), [node])
