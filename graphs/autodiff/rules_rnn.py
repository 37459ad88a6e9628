"""The gradient rule of ortlstm ``RNNTraining``: one ``RNNGrad`` node, wired by the spec.

The same rule as LSTMTraining's and GRUTraining's (``rules_lstm.recurrent_training_grad``) over the
RNN's wiring (``schema.RNN_TRAINING_GRADIENT``): forward inputs, HAll (RNNGrad reads f' off it),
the output gradients ("" where none reaches the loss) and the input gradients that are needed. A
standard ai.onnx ``RNN`` is converted to RNNTraining first (``ortlstm.graphs.convert_rnn``, a step
of the Trainer's preparation).
"""

from __future__ import annotations

from collections.abc import Sequence

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule, register_missing_rule_hint
from ortlstm.graphs.autodiff.rules_lstm import recurrent_training_grad
from ortlstm.ops import schema


@register_gradient_rule(schema.DOMAIN, schema.RNN_TRAINING.name)
def rnn_training_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX, dW, dR, dB, dinitial_h = RNNGrad(inputs, HAll, dHAll, dHt)."""
    return recurrent_training_grad(schema.RNN_TRAINING_GRADIENT, ctx, grad_outputs)


register_missing_rule_hint(
    "",
    "RNN",
    "A standard ONNX RNN is differentiated as ortlstm::RNNTraining: convert the model first "
    "(ortlstm.graphs.convert_rnn.convert_rnns(model) rewrites every RNN node, keeping its outputs); the Trainer and "
    "build_training_models do this themselves.",
)
