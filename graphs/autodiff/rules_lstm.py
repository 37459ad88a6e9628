"""The gradient rule of ortlstm ``LSTMTraining``: one ``LSTMGrad`` node.

The node is wired as ops/schema.py declares (``schema.LSTM_TRAINING_GRADIENT``, the wiring
onnxruntime-training's gradient definition is written from too), so no port is named here:
forward inputs, forward outputs (HAll and the CAll/IOFC stash, which the forward node is asked
to name), output gradients ("" where none reaches the loss: LSTMGrad counts it as zeros) and
input gradients (named only where needed, so the kernel skips the rest). All seven gradients are
available, initial_h, initial_c and P included.

A standard ai.onnx ``LSTM`` has no rule: models are converted to LSTMTraining first
(``ortlstm.graphs.convert``); the engine's refusal says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx.helper

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule, register_missing_rule_hint
from ortlstm.ops import lstm_attributes, schema

_WIRING = schema.LSTM_TRAINING_GRADIENT
_SOURCE = schema.GradientSource


@register_gradient_rule(schema.DOMAIN, schema.LSTM_TRAINING.name)
def lstm_training_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX, dW, dR, dB, dinitial_h, dinitial_c, dP = LSTMGrad(inputs, HAll, CAll, IOFC, dHAll, dHt, dCt).

    sequence_lens gets no gradient (integer); the CAll and IOFC outputs are a stash for LSTMGrad
    and must not reach the loss. The gradient node carries every attribute of the forward node.
    """
    return recurrent_training_grad(_WIRING, ctx, grad_outputs)


def recurrent_training_grad(
    wiring: schema.GradientWiring, ctx: GradientContext, grad_outputs: Sequence[str | None]
) -> list[str | None]:
    """The gradient node of a recurrent op's forward node, wired as the spec's ``wiring`` says.

    Shared by every recurrent cell (LSTMTraining, GRUTraining, RNNTraining): outputs without an upstream
    gradient port (the stash) must not reach the loss.
    """
    carried = {link.index for link in wiring.inputs if link.source is _SOURCE.OUTPUT_GRADIENT}
    for index, grad in enumerate(grad_outputs):
        if grad is not None and index not in carried:
            port = wiring.forward.outputs[index].name
            raise ctx.fail(f"output {port} is a stash for {wiring.gradient.name} and must not reach the loss")

    inputs = []
    for link in wiring.inputs:
        if link.source is _SOURCE.INPUT:
            inputs.append(ctx.input(link.index))
        elif link.source is _SOURCE.OUTPUT:
            inputs.append(ctx.require_output(link.index))
        else:  # "" where no gradient reaches the output: LSTMGrad takes it as zeros
            inputs.append((grad_outputs[link.index] if link.index < len(grad_outputs) else None) or "")
    while inputs and not inputs[-1]:
        inputs.pop()

    grad_inputs: list[str | None] = [None] * len(ctx.node.input)
    outputs = []
    for link in wiring.outputs:
        if not ctx.needs(link.index):
            outputs.append("")
            continue
        name = ctx.emitter.fresh(f"{ctx.node.name or ctx.node.op_type}_{link.port}")
        grad_inputs[link.index] = name
        outputs.append(name)
        known = ctx.emitter.value_type(ctx.input(link.index))
        if known is not None:  # a gradient has its input's type and shape
            ctx.emitter.set_type(name, known.elem_type, known.shape)
    while outputs and not outputs[-1]:
        outputs.pop()

    gradient = wiring.gradient
    ctx.op(gradient.name, inputs, outputs=outputs, domain=gradient.domain, attribute_protos=ctx.node.attribute)
    grad_node = ctx.emitter.nodes[-1]
    activations = ctx.attribute("activations")
    if activations is not None and not ctx.has_attribute("activations_csv"):
        # Kernels on onnxruntime < 1.25 read only the comma-separated copy.
        csv = lstm_attributes(activations=activations)["activations_csv"]
        grad_node.attribute.append(onnx.helper.make_attribute("activations_csv", csv))
    return grad_inputs


register_missing_rule_hint(
    "",
    "LSTM",
    "A standard ONNX LSTM is differentiated as ortlstm::LSTMTraining: convert the model first "
    "(ortlstm.graphs.convert(model) rewrites every LSTM node, keeping its outputs), then build the training graph.",
)
