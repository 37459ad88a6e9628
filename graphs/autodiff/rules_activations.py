"""Gradient rules of the activations torch.nn layers export as one ONNX op (ai.onnx), beyond rules_nn's.

torch.onnx.export writes ``nn.GELU`` as ``Gelu`` (opset 20, both approximations), ``nn.SELU``,
``nn.CELU``, ``nn.Hardswish`` and (dynamo) ``nn.Mish`` as single ops; other exporters write
``Softsign``, ``ThresholdedRelu`` and ``Shrink``. The table of which layer exports to what is in
docs/training.md (``scripts/layer_ops.py`` prints it). Each rule's docstring states its
derivative; ``dY`` is the gradient of the output. At the kinks the rules take torch's side (its
``*_backward`` kernels, recorded in tests/recordings/activations.npz): SELU and CELU use the
negative branch at 0, Hardswish's gradient is 0 at -3 and dY at 3, the thresholds of
ThresholdedRelu and Shrink give 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
from ortlstm.graphs.autodiff.rules_nn import _float


def _where(ctx: GradientContext, condition: str, then: str, otherwise: str) -> str:
    return ctx.op("Where", [condition, then, otherwise])


@register_gradient_rule("", "Gelu")
def gelu_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """approximate='none': dX = dY * (Phi(X) + X * phi(X)), Phi the normal CDF, phi its density.

    approximate='tanh': with t = tanh(sqrt(2/pi) * (X + 0.044715 X^3)),
    dX = dY * (0.5 (1 + t) + 0.5 X (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 X^2)), torch's formula.
    """
    (dy,) = grad_outputs
    assert dy is not None
    x = ctx.input(0)
    approximate = ctx.attribute("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.fail(f"approximate={approximate!r} is not one of 'none', 'tanh' (the ONNX Gelu attribute)")
    half, one, x2 = ctx.scalar(0.5, x), ctx.scalar(1.0, x), ctx.op("Mul", [x, x])
    if approximate == "none":
        cdf = ctx.op("Mul", [half, ctx.op("Add", [one, ctx.op("Erf", [ctx.op("Mul", [x, ctx.scalar(0.5**0.5, x)])])])])
        gauss = ctx.op("Exp", [ctx.op("Mul", [x2, ctx.scalar(-0.5, x)])])
        density = ctx.op("Mul", [gauss, ctx.scalar(1.0 / math.sqrt(2.0 * math.pi), x)])
        return [ctx.op("Mul", [dy, ctx.op("Add", [cdf, ctx.op("Mul", [x, density])])])]
    k, c = math.sqrt(2.0 / math.pi), 0.044715
    cubic = ctx.op("Add", [x, ctx.op("Mul", [ctx.scalar(c, x), ctx.op("Mul", [x2, x])])])
    t = ctx.op("Tanh", [ctx.op("Mul", [ctx.scalar(k, x), cubic])])
    left = ctx.op("Mul", [half, ctx.op("Add", [one, t])])
    slope = ctx.op("Mul", [ctx.scalar(k, x), ctx.op("Add", [one, ctx.op("Mul", [ctx.scalar(3 * c, x), x2])])])
    sech2 = ctx.op("Sub", [one, ctx.op("Mul", [t, t])])
    right = ctx.op("Mul", [ctx.op("Mul", [half, x]), ctx.op("Mul", [sech2, slope])])
    return [ctx.op("Mul", [dy, ctx.op("Add", [left, right])])]


@register_gradient_rule("", "HardSwish")
def hard_swish_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = 0 where X <= -3, dY * (X / 3 + 1/2) where -3 < X < 3, dY where X >= 3 (torch's hardswish_backward)."""
    (dy,) = grad_outputs
    assert dy is not None
    x = ctx.input(0)
    ramp = ctx.op("Mul", [dy, ctx.op("Add", [ctx.op("Mul", [x, ctx.scalar(1.0 / 3.0, x)]), ctx.scalar(0.5, x)])])
    below_top = _where(ctx, ctx.op("Less", [x, ctx.scalar(3.0, x)]), ramp, dy)
    return [_where(ctx, ctx.op("LessOrEqual", [x, ctx.scalar(-3.0, x)]), ctx.scalar(0.0, x), below_top)]


@register_gradient_rule("", "Mish")
def mish_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * (t + X * sigmoid(X) * (1 - t^2)), t = tanh(softplus(X)) (torch's mish_backward)."""
    (dy,) = grad_outputs
    assert dy is not None
    x = ctx.input(0)
    t = ctx.op("Tanh", [ctx.op("Softplus", [x])])
    sech2 = ctx.op("Sub", [ctx.scalar(1.0, x), ctx.op("Mul", [t, t])])
    x_sigmoid = ctx.op("Mul", [x, ctx.op("Sigmoid", [x])])
    return [ctx.op("Mul", [dy, ctx.op("Add", [t, ctx.op("Mul", [x_sigmoid, sech2])])])]


def _exponential_branch(
    ctx: GradientContext, dy: str, positive_scale: float, negative_scale: float, rate: float
) -> str:
    """dY * positive_scale where X > 0, else dY * negative_scale * exp(rate * X) (torch's elu_backward on X)."""
    x = ctx.input(0)
    scaled_x = x if rate == 1.0 else ctx.op("Mul", [x, ctx.scalar(rate, x)])
    negative = ctx.op("Mul", [dy, ctx.op("Mul", [ctx.op("Exp", [scaled_x]), ctx.scalar(negative_scale, x)])])
    positive = dy if positive_scale == 1.0 else ctx.op("Mul", [dy, ctx.scalar(positive_scale, x)])
    return _where(ctx, ctx.op("Greater", [x, ctx.scalar(0.0, x)]), positive, negative)


@register_gradient_rule("", "Selu")
def selu_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = gamma * dY where X > 0, else gamma * alpha * exp(X) * dY (ONNX's alpha and gamma, torch's values)."""
    (dy,) = grad_outputs
    assert dy is not None
    alpha = _float(ctx, "alpha", 1.67326319217681884765625)
    gamma = _float(ctx, "gamma", 1.05070102214813232421875)
    return [_exponential_branch(ctx, dy, gamma, gamma * alpha, 1.0)]


@register_gradient_rule("", "Celu")
def celu_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where X > 0, else dY * exp(X / alpha)."""
    (dy,) = grad_outputs
    assert dy is not None
    alpha = _float(ctx, "alpha", 1.0)
    if alpha == 0.0:
        raise ctx.fail("alpha=0 divides by zero (CELU needs alpha != 0, as torch.nn.CELU)")
    return [_exponential_branch(ctx, dy, 1.0, 1.0, 1.0 / alpha)]


@register_gradient_rule("", "Softsign")
def softsign_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY / (1 + |X|)^2."""
    (dy,) = grad_outputs
    assert dy is not None
    x = ctx.input(0)
    denominator = ctx.op("Add", [ctx.scalar(1.0, x), ctx.op("Abs", [x])])
    return [ctx.op("Div", [dy, ctx.op("Mul", [denominator, denominator])])]


@register_gradient_rule("", "ThresholdedRelu")
def thresholded_relu_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where X > alpha, else 0 (torch's threshold_backward)."""
    (dy,) = grad_outputs
    assert dy is not None
    x = ctx.input(0)
    above = ctx.op("Greater", [x, ctx.scalar(_float(ctx, "alpha", 1.0), x)])
    return [_where(ctx, above, dy, ctx.scalar(0.0, x))]


@register_gradient_rule("", "Shrink")
def shrink_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where |X| > lambd (X < -lambd or X > lambd), else 0; bias only shifts Y (torch's softshrink_backward)."""
    (dy,) = grad_outputs
    assert dy is not None
    x = ctx.input(0)
    lambd = _float(ctx, "lambd", 0.5)
    outside = ctx.op("Or", [ctx.op("Greater", [x, ctx.scalar(lambd, x)]), ctx.op("Less", [x, ctx.scalar(-lambd, x)])])
    return [_where(ctx, outside, dy, ctx.scalar(0.0, x))]
