"""torch.optim.NAdam (Adam with Nesterov momentum, torch's momentum schedule) in standard ops."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import onnx

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.optimizers.arithmetic import DOUBLE, TensorMath, cast_to, decoupled_decay, scalar_double
from ortlstm.graphs.optimizers.base import (
    Optimizer,
    Update,
    as_betas,
    check_betas,
    check_nonnegative,
    register_optimizer,
)

NEGLIGIBLE_MU_PRODUCT = 2.0**-54
"""At or below it ``1 - mu_product`` is 1.0 in float64: the update no longer depends on the product."""
MAX_MU_PRODUCTS = 1 << 20
"""The longest table of ``mu_products`` (4 MiB); betas[0] within about 4e-5 of 1 needs more."""


def mu_products(beta1: float, momentum_decay: float) -> np.ndarray:
    """The values of torch's ``state["mu_product"]`` before step 1, after step 1, 2, ... until negligible (float32).

    ``mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))`` in Python floats; torch keeps the
    product in a float32 tensor (its default dtype, whatever the parameter's) and multiplies it by
    each ``mu_t`` rounded to float32. The product depends on the step number alone, so the update
    reads it from this table instead of carrying it as state. The table ends at the first value at
    or below ``NEGLIGIBLE_MU_PRODUCT``; later steps read that one (the products only fall), which
    gives the same update.

    Raises:
        ValueError: The product stays above ``NEGLIGIBLE_MU_PRODUCT`` for ``MAX_MU_PRODUCTS`` steps.
    """
    products = [np.float32(1.0)]
    while products[-1] > NEGLIGIBLE_MU_PRODUCT:
        if len(products) > MAX_MU_PRODUCTS:
            raise ValueError(
                f"NAdam(betas[0]={beta1}, momentum_decay={momentum_decay}): torch's mu_product stays above "
                f"2**-54 for more than {MAX_MU_PRODUCTS} steps, too long to tabulate; use a smaller betas[0]"
            )
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (len(products) * momentum_decay)))
        products.append(products[-1] * np.float32(mu))
    return np.asarray(products, dtype=np.float32)


@register_optimizer
@dataclasses.dataclass(frozen=True)
class NAdam(Optimizer):
    """torch.optim.NAdam (single-tensor path), ``lr`` and ``step`` fed per update; standard ops only.

    ``g`` the gradient (``-g`` if ``maximize``); ``g += weight_decay * p``, or with
    ``decoupled_weight_decay`` ``p *= 1 - lr * weight_decay`` first; ``m = lerp(m, g, 1 - beta1)``;
    ``v = beta2 * v + (1 - beta2) * g * g``; ``denom = sqrt(v / (1 - beta2**step)) + eps``;
    ``p += (-lr * (1 - mu) / (1 - mu_product)) * g / denom``, then
    ``p += (-lr * mu_next / (1 - mu_product * mu_next)) * m / denom``, with ``mu``, ``mu_next`` and
    ``mu_product`` torch's momentum schedule at this step and the next (``mu_products``).

    Attributes:
        lr: torch's default learning rate (the trainer's lr input when no schedule is given).
        betas: Decay rates of the first and second moment averages.
        eps: Added to the denominator.
        weight_decay: L2 penalty added to the gradient, or the decoupled decay.
        momentum_decay: How fast ``mu`` rises from ``beta1 / 2`` towards ``beta1``.
        decoupled_weight_decay: Decay the parameter as AdamW does, not through the gradient.
        maximize: Maximize the objective instead of minimizing it.
        fused_multiply_add: Round ``a * b + c`` once where torch's CPU kernels do. Not a torch
            hyperparameter.
    """

    torch_name: ClassVar[str] = "NAdam"
    lr: float = 2e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum_decay: float = 4e-3
    decoupled_weight_decay: bool = False
    maximize: bool = False
    fused_multiply_add: bool = dataclasses.field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", as_betas(self.betas))
        check_nonnegative((self.lr, "learning rate"), (self.eps, "epsilon value"))
        check_betas(self.betas)
        check_nonnegative((self.weight_decay, "weight_decay value"), (self.momentum_decay, "momentum_decay value"))

    def state_slots(self) -> tuple[str, ...]:
        """``exp_avg`` and ``exp_avg_sq``; torch's ``mu_product`` is read by step (``mu_products``)."""
        return ("exp_avg", "exp_avg_sq")

    def scalars(self, emitter: GraphEmitter, lr: str, step: str, elem_type: int) -> dict[str, str]:
        """The two addcdiv values, ``1 - beta2**step`` and the decoupled decay factor, in float64 then rounded."""
        beta1, beta2 = self.betas
        op = emitter.op

        def const(value: float) -> str:
            return emitter.constant(value, DOUBLE)

        def mu_at(steps: str) -> str:  # beta1 * (1.0 - 0.5 * (0.96 ** (steps * momentum_decay)))
            power = op("Pow", [const(0.96), op("Mul", [steps, const(self.momentum_decay)])])
            return op("Mul", [const(beta1), op("Sub", [one, op("Mul", [const(0.5), power])])])

        step_d = scalar_double(emitter, step)
        one = const(1.0)
        mu, mu_next = mu_at(step_d), mu_at(op("Add", [step_d, one]))
        table = mu_products(beta1, self.momentum_decay)
        index = op("Cast", [op("Min", [step_d, const(len(table) - 1)])], to=onnx.TensorProto.INT64)
        mu_product = op("Cast", [op("Gather", [emitter.constant(table, onnx.TensorProto.FLOAT), index])], to=DOUBLE)
        neg_lr = op("Neg", [lr])
        # torch: -lr * (1.0 - mu) / (1.0 - mu_product) and (-lr * mu_next) / (1.0 - mu_product * mu_next)
        grad_value = op("Div", [op("Mul", [neg_lr, op("Sub", [one, mu])]), op("Sub", [one, mu_product])])
        next_product = op("Mul", [mu_product, mu_next])
        exp_avg_value = op("Div", [op("Mul", [neg_lr, mu_next]), op("Sub", [one, next_product])])
        bias_correction2 = op("Sub", [one, op("Pow", [const(beta2), step_d])])
        scalars = {
            "grad_value": cast_to(emitter, grad_value, elem_type),
            "exp_avg_value": cast_to(emitter, exp_avg_value, elem_type),
            "bias_correction2": cast_to(emitter, bias_correction2, elem_type),
        }
        if self.decoupled_weight_decay and self.weight_decay != 0:
            scalars["decay"] = decoupled_decay(emitter, lr, self.weight_decay, elem_type)
        return scalars

    def standard_update(
        self, math: TensorMath, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> Update:
        """See the class docstring."""
        beta1, beta2 = self.betas
        value, g = math.weight_decay(param, grad, self.maximize, self.weight_decay, scalars.get("decay"))
        # exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        exp_avg = math.lerp(state["exp_avg"], g, 1.0 - beta1, name=f"{param}.exp_avg.new")
        exp_avg_sq = math.decayed_square(state["exp_avg_sq"], g, beta2, name=f"{param}.exp_avg_sq.new")
        # denom = exp_avg_sq.div(bias_correction2).sqrt(); denom.add_(eps)
        root = math.op("Sqrt", [math.op("Div", [exp_avg_sq, scalars["bias_correction2"]])])
        denom = math.op("Add", [root, math.const(self.eps)])
        # param.addcdiv_(grad, denom, value=...); param.addcdiv_(exp_avg, denom, value=...)
        value = math.addcdiv(value, math.op("Mul", [scalars["grad_value"], g]), denom, name=f"{param}.nesterov")
        value = math.addcdiv(value, math.op("Mul", [scalars["exp_avg_value"], exp_avg]), denom, name=f"{param}.new")
        return value, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
