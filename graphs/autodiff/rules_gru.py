"""The gradient rule of ortlstm ``GRUTraining``: one ``GRUGrad`` node, wired by the spec.

The same rule as LSTMTraining's (``rules_lstm.recurrent_training_grad``) over the GRU's wiring
(``schema.GRU_TRAINING_GRADIENT``): forward inputs, HAll and the ZRH stash, the output gradients
("" where none reaches the loss) and the input gradients that are needed. A standard ai.onnx
``GRU`` is converted to GRUTraining first (``ortlstm.graphs.convert_gru``, a step of the
Trainer's preparation).
"""

from __future__ import annotations

from collections.abc import Sequence

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule, register_missing_rule_hint
from ortlstm.graphs.autodiff.rules_lstm import recurrent_training_grad
from ortlstm.ops import schema


@register_gradient_rule(schema.DOMAIN, schema.GRU_TRAINING.name)
def gru_training_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX, dW, dR, dB, dinitial_h = GRUGrad(inputs, HAll, ZRH, dHAll, dHt); ZRH must not reach the loss."""
    return recurrent_training_grad(schema.GRU_TRAINING_GRADIENT, ctx, grad_outputs)


register_missing_rule_hint(
    "",
    "GRU",
    "A standard ONNX GRU is differentiated as ortlstm::GRUTraining: convert the model first "
    "(ortlstm.graphs.convert_gru.convert_grus(model) rewrites every GRU node, keeping its outputs); the Trainer and "
    "build_training_models do this themselves.",
)
