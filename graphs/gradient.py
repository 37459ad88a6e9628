"""The gradient of ``LSTMTraining`` for onnxruntime-training's gradient builder.

``gradient_definition()`` maps every ``LSTMGrad`` port to the forward node's inputs (``I(i)``),
outputs (``O(i)``), output gradients (``GO(i)``) and input gradients (``GI(i)``), derived from
the spec's ``gradient_of`` links, so nothing here names a port by hand. ``register_gradient()``
hands it to onnxruntime-training, whose builder otherwise silently picks its own com.microsoft
gradient for any op called LSTMTraining.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from types import ModuleType

try:
    from ortlstm.ops import schema
except ModuleNotFoundError:
    from ops import schema  # type: ignore[no-redef]


@dataclasses.dataclass(frozen=True)
class GradientDefinition:
    """One gradient node in onnxruntime-training's placeholder notation."""

    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def gradient_definition() -> GradientDefinition:
    """The LSTMGrad node that differentiates one LSTMTraining node."""
    forward, backward = schema.LSTM_TRAINING, schema.LSTM_GRAD
    forward_inputs = schema.input_names(forward)
    inputs = []
    for port in backward.inputs:
        if port.gradient_of is not None:
            inputs.append(f"GO({schema.output_index(forward, port.gradient_of)})")
        elif port.name in forward_inputs:
            inputs.append(f"I({schema.input_index(forward, port.name)})")
        else:
            inputs.append(f"O({schema.output_index(forward, port.name)})")
    outputs = []
    for port in backward.outputs:
        if port.gradient_of is None:
            raise ValueError(f"{backward.name}.{port.name} names no forward input in the spec")
        outputs.append(f"GI({schema.input_index(forward, port.gradient_of)})")
    return GradientDefinition(backward.name, backward.domain, tuple(inputs), tuple(outputs))


def gradient_key() -> str:
    """The registry key onnxruntime-training looks the definition up by."""
    return f"{schema.LSTM_TRAINING.domain}::{schema.LSTM_TRAINING.name}"


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
    """Registers ``LSTMGrad`` as the gradient of ``LSTMTraining`` with onnxruntime-training.

    Idempotent (the registry is process-wide). Call before ``generate_artifacts`` or any other
    use of onnxruntime-training's gradient builder on a converted model.

    Raises:
        ImportError: onnxruntime-training is not installed.
    """
    import_training_runtime()
    state = importlib.import_module("onnxruntime.capi._pybind_state")
    definition = gradient_definition()
    node = state.GradientNodeDefinition()
    node.op_type = definition.op_type
    node.domain = definition.domain
    node.inputs = list(definition.inputs)
    node.outputs = list(definition.outputs)
    # Attributes cannot be copied from the forward node by the registry: generate_artifacts in
    # ortlstm.graphs.artifacts copies them after the gradient graph is built.
    node.attributes = []
    state.register_gradient_definition(gradient_key(), [node])
