"""torch.optim.Adagrad (dense gradients) in standard ops."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.optimizers.arithmetic import DOUBLE, TensorMath, cast_to, scalar_double
from ortlstm.graphs.optimizers.base import Optimizer, Update, check_nonnegative, register_optimizer


@register_optimizer
@dataclasses.dataclass(frozen=True)
class Adagrad(Optimizer):
    """torch.optim.Adagrad (single-tensor path, dense gradients), ``lr`` fed per step; standard ops only.

    With ``g`` the gradient (``-g`` if ``maximize``), ``g += weight_decay * p``; ``s += g * g``
    (``s`` starts at ``initial_accumulator_value``); ``p -= clr * g / (sqrt(s) + eps)`` with
    ``clr = lr / (1 + (step - 1) * lr_decay)`` in float64.

    Attributes:
        lr: torch's default learning rate (the trainer's lr input when no schedule is given).
        lr_decay: Learning-rate decay per step.
        weight_decay: L2 penalty added to the gradient.
        initial_accumulator_value: Where the sum of squared gradients starts.
        eps: Added to the denominator.
        maximize: Maximize the objective instead of minimizing it.
        fused_multiply_add: Round ``a * b + c`` once where torch's CPU kernels do. Not a torch
            hyperparameter.
    """

    torch_name: ClassVar[str] = "Adagrad"
    lr: float = 1e-2
    lr_decay: float = 0.0
    weight_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10
    maximize: bool = False
    fused_multiply_add: bool = dataclasses.field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        check_nonnegative(
            (self.lr, "learning rate"),
            (self.lr_decay, "lr_decay value"),
            (self.weight_decay, "weight_decay value"),
            (self.initial_accumulator_value, "initial_accumulator_value value"),
            (self.eps, "epsilon value"),
        )

    def state_slots(self) -> tuple[str, ...]:
        """``("sum",)``, torch's name for the running sum of squared gradients."""
        return ("sum",)

    def initial_state(self, param: np.ndarray) -> dict[str, np.ndarray]:
        """``sum`` filled with ``initial_accumulator_value`` (rounded to the parameter's type), as torch."""
        return {"sum": np.full_like(param, self.initial_accumulator_value)}

    def scalars(self, emitter: GraphEmitter, lr: str, step: str, elem_type: int) -> dict[str, str]:
        """``-lr / (1 + (step - 1) * lr_decay)`` in float64, rounded to the parameters' type."""
        clr = lr
        if self.lr_decay != 0:
            one = emitter.constant(1.0, DOUBLE)
            steps_before = emitter.op("Sub", [scalar_double(emitter, step), one])
            decayed_steps = emitter.op("Mul", [steps_before, emitter.constant(self.lr_decay, DOUBLE)])
            clr = emitter.op("Div", [clr, emitter.op("Add", [one, decayed_steps])])
        return {"neg_clr": cast_to(emitter, emitter.op("Neg", [clr]), elem_type)}

    def standard_update(
        self, math: TensorMath, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> Update:
        """See the class docstring."""
        g = math.l2_gradient(param, grad, self.maximize, self.weight_decay)
        # state_sum.addcmul_(grad, grad, value=1); std = state_sum.sqrt().add_(eps)
        state_sum = math.fma(g, g, state["sum"], name=f"{param}.sum.new")
        std = math.op("Add", [math.op("Sqrt", [state_sum]), math.const(self.eps)])
        # param.addcdiv_(grad, std, value=-clr)
        new_param = math.addcdiv(param, math.op("Mul", [scalars["neg_clr"], g]), std, name=f"{param}.new")
        return new_param, {"sum": state_sum}
