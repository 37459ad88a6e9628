"""The gradient rule of ortlstm ``CTCLoss``: one ``CTCLossGrad`` node.

Ports are matched by name against ops/schema.py: each input of CTCLossGrad is the forward node's
input or output of the same name (loss and the log_alpha stash, which the forward node is asked
to name) or, for ``grad_loss``, the gradient reaching the port it is the ``gradient_of``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
from ortlstm.ops import schema
from ortlstm.ops.nodes import ordered_inputs


@register_gradient_rule(schema.DOMAIN, schema.CTC_LOSS.name)
def ctc_loss_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """d log_probs = CTCLossGrad(d loss, log_probs, targets, input_lengths, target_lengths, loss, log_alpha).

    The derivative is torch's (docs/ops.md#ctclossgrad): exact at the input of the log_softmax
    that normally precedes the loss. targets and the lengths get no gradient (integers); log_alpha
    is a stash for CTCLossGrad and must not reach the loss. The attributes are the forward node's.
    """
    forward, grad_op = schema.CTC_LOSS, schema.CTC_LOSS_GRAD
    stash = schema.output_index(forward, "log_alpha")
    if stash < len(grad_outputs) and grad_outputs[stash] is not None:
        raise ctx.fail(f"output log_alpha is a stash for {grad_op.name} and must not reach the loss")
    grad_inputs: list[str | None] = [None] * len(ctx.node.input)
    log_probs = schema.input_index(forward, "log_probs")
    if not grad_outputs or grad_outputs[0] is None or not ctx.needs(log_probs):
        return grad_inputs

    values: dict[str, str | None] = {}
    for port in grad_op.inputs:
        if port.gradient_of is not None:
            values[port.name] = grad_outputs[schema.output_index(forward, port.gradient_of)]
        elif port.name in schema.input_names(forward):
            values[port.name] = ctx.input(schema.input_index(forward, port.name))
        else:
            values[port.name] = ctx.require_output(schema.output_index(forward, port.name))
    grad = ctx.emitter.fresh(f"{ctx.node.name or ctx.node.op_type}_grad_log_probs")
    inputs = ordered_inputs(grad_op, values)
    ctx.op(grad_op.name, inputs, outputs=[grad], domain=schema.DOMAIN, attribute_protos=ctx.node.attribute)
    known = ctx.emitter.value_type(ctx.input(log_probs))
    if known is not None:  # a gradient has its input's type and shape
        ctx.emitter.set_type(grad, known.elem_type, known.shape)
    grad_inputs[log_probs] = grad
    return grad_inputs
