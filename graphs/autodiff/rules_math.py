"""Gradient rules of elementwise math and matrix products (ai.onnx).

Each rule's docstring states its derivative; ``dY`` is the gradient of the output, ``dA`` the
gradient of input A. Broadcast inputs get their gradient summed back to their own shape
(``GraphEmitter.unbroadcast``).
"""

from __future__ import annotations

from collections.abc import Sequence

try:
    from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
except ModuleNotFoundError:
    from graphs.autodiff.registry import GradientContext, register_gradient_rule  # type: ignore[no-redef]


def _unbroadcast(ctx: GradientContext, grad: str, index: int) -> str:
    return ctx.emitter.unbroadcast(grad, ctx.input(index), grad_shape_of=ctx.output(0))


@register_gradient_rule("", "Add")
def add_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA = dY, dB = dY (each summed to its input's shape)."""
    (dy,) = grad_outputs
    assert dy is not None
    return [_unbroadcast(ctx, dy, i) if ctx.needs(i) else None for i in range(2)]


@register_gradient_rule("", "Mul")
def mul_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA = dY * B, dB = dY * A."""
    (dy,) = grad_outputs
    assert dy is not None
    a, b = ctx.input(0), ctx.input(1)
    return [
        _unbroadcast(ctx, ctx.op("Mul", [dy, b]), 0) if ctx.needs(0) else None,
        _unbroadcast(ctx, ctx.op("Mul", [dy, a]), 1) if ctx.needs(1) else None,
    ]


@register_gradient_rule("", "Tanh")
def tanh_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * (1 - Y^2)."""
    (dy,) = grad_outputs
    y = ctx.output(0)
    one_minus = ctx.op("Sub", [ctx.scalar(1.0, y), ctx.op("Mul", [y, y])])
    return [ctx.op("Mul", [dy, one_minus])]
