"""How a gradient op connects to the forward node it differentiates, resolved from the spec.

Read by both training paths (the ortlstm gradient rule and onnxruntime-training's gradient
definition). Part of the op contract (``ops/schema.py``).
"""

from __future__ import annotations

import dataclasses
import enum

from ortlstm.ops.contract import DOMAIN, OpSpec, PortSpec, input_names, output_names
from ortlstm.ops.spec_gru import GRU_GRAD, GRU_TRAINING
from ortlstm.ops.spec_lstm import LSTM_TRAINING, OPS
from ortlstm.ops.spec_rnn import RNN_GRAD, RNN_TRAINING

# ---- gradient wiring ----------------------------------------------------------------------------
# How a gradient op connects to the forward node it differentiates, resolved from the ports'
# ``from_forward`` and ``gradient_of``. Both training paths read it: the ortlstm gradient rule
# (graphs/autodiff/rules_lstm.py) and onnxruntime-training's gradient definition (graphs/ort_training/gradient.py).


class GradientSource(enum.Enum):
    """What a port of a gradient op connects to; the values are onnxruntime-training's notation."""

    INPUT = "I"
    """A forward input, as it is."""
    OUTPUT = "O"
    """A forward output, as it is (a stash such as CAll)."""
    OUTPUT_GRADIENT = "GO"
    """The loss's gradient with respect to a forward output; "" where none reaches it (zeros)."""
    INPUT_GRADIENT = "GI"
    """The gradient with respect to a forward input (an output of the gradient op)."""


@dataclasses.dataclass(frozen=True)
class GradientLink:
    """One port of a gradient op and the forward port it connects to.

    Attributes:
        port: The gradient op's port.
        source: What it connects to.
        forward_port: The forward op's port (the output for ``OUTPUT_GRADIENT``, the input for
            ``INPUT_GRADIENT``).
        index: That port's position among the forward node's inputs or outputs.
    """

    port: str
    source: GradientSource
    forward_port: str
    index: int

    @property
    def placeholder(self) -> str:
        """onnxruntime-training's notation, e.g. ``GO(1)``."""
        return f"{self.source.value}({self.index})"


@dataclasses.dataclass(frozen=True)
class GradientWiring:
    """A forward op, its gradient op, and one link per gradient-op input and output, in node order."""

    forward: OpSpec
    gradient: OpSpec
    inputs: tuple[GradientLink, ...]
    outputs: tuple[GradientLink, ...]


def gradient_wiring(forward: OpSpec, gradient: OpSpec | None = None) -> GradientWiring:
    """How ``gradient`` (default: the op of ``OPS`` whose ``gradient_of`` is ``forward``) connects to ``forward``.

    Raises:
        KeyError: No op differentiates ``forward``.
        ValueError: A gradient-op port that names no forward port, both or neither of
            ``from_forward`` and ``gradient_of``, or an output that is not a forward input's
            gradient; a differentiable forward input without a gradient output.
    """
    if gradient is None:
        found = [op for op in OPS if op.gradient_of == forward.name]
        if not found:
            raise KeyError(f"no op of {DOMAIN!r} declares gradient_of={forward.name!r}")
        gradient = found[0]
    forward_inputs, forward_outputs = input_names(forward), output_names(forward)

    def fail(port: PortSpec, problem: str) -> ValueError:
        return ValueError(f"{gradient.name}.{port.name}: {problem}")

    inputs = []
    for port in gradient.inputs:
        if (port.from_forward is None) == (port.gradient_of is None):
            raise fail(port, "an input of a gradient op names exactly one of from_forward and gradient_of")
        if port.gradient_of is not None:
            if port.gradient_of not in forward_outputs:
                raise fail(
                    port, f"gradient_of={port.gradient_of!r} is not an output of {forward.name} {forward_outputs}"
                )
            link = GradientSource.OUTPUT_GRADIENT, port.gradient_of, forward_outputs.index(port.gradient_of)
        elif port.from_forward in forward_inputs:
            link = GradientSource.INPUT, port.from_forward, forward_inputs.index(port.from_forward)
        elif port.from_forward in forward_outputs:
            link = GradientSource.OUTPUT, port.from_forward, forward_outputs.index(port.from_forward)
        else:
            raise fail(port, f"from_forward={port.from_forward!r} is no port of {forward.name}")
        inputs.append(GradientLink(port.name, *link))
    outputs = []
    for port in gradient.outputs:
        if port.gradient_of not in forward_inputs or port.from_forward is not None:
            raise fail(
                port, f"an output of a gradient op is the gradient of an input of {forward.name} {forward_inputs}"
            )
        outputs.append(
            GradientLink(
                port.name, GradientSource.INPUT_GRADIENT, port.gradient_of, forward_inputs.index(port.gradient_of)
            )
        )
    covered = {link.forward_port for link in outputs}
    missing = [port.name for port in forward.inputs if port.differentiable and port.name not in covered]
    if missing:
        raise ValueError(
            f"{gradient.name} has no gradient output for the differentiable inputs {missing} of {forward.name}"
        )
    return GradientWiring(forward, gradient, tuple(inputs), tuple(outputs))


LSTM_TRAINING_GRADIENT = gradient_wiring(LSTM_TRAINING)
"""LSTMGrad's wiring to LSTMTraining, resolved (and checked) when the spec is imported."""

GRU_TRAINING_GRADIENT = gradient_wiring(GRU_TRAINING, GRU_GRAD)
"""GRUGrad's wiring to GRUTraining, resolved (and checked) when the spec is imported."""

RNN_TRAINING_GRADIENT = gradient_wiring(RNN_TRAINING, RNN_GRAD)
"""RNNGrad's wiring to RNNTraining, resolved (and checked) when the spec is imported."""
