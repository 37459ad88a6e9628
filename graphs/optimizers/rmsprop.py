"""torch.optim.RMSprop (not centered yet) in standard ops."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.optimizers.arithmetic import TensorMath, cast_to
from ortlstm.graphs.optimizers.base import Optimizer, Update, check_nonnegative, register_optimizer


@register_optimizer
@dataclasses.dataclass(frozen=True)
class RMSprop(Optimizer):
    """torch.optim.RMSprop (single-tensor path), ``lr`` fed per step; standard ops only; not centered yet.

    With ``g`` the gradient (``-g`` if ``maximize``), ``g += weight_decay * p``;
    ``v = alpha * v + (1 - alpha) * g * g``; ``avg = sqrt(v) + eps``; with momentum
    ``b = momentum * b + g / avg`` and ``p -= lr * b``, else ``p -= lr * g / avg``.

    Attributes:
        lr: torch's default learning rate (the trainer's lr input when no schedule is given).
        alpha: Smoothing constant of the squared-gradient average.
        eps: Added to the denominator.
        weight_decay: L2 penalty added to the gradient.
        momentum: Momentum factor.
        centered: torch's variance-normalized variant; only False (torch's default) for now: see
            ``__post_init__``.
        maximize: Maximize the objective instead of minimizing it.
        fused_multiply_add: Round ``a * b + c`` once where torch's CPU kernels do. Not a torch
            hyperparameter.
    """

    torch_name: ClassVar[str] = "RMSprop"
    lr: float = 1e-2
    alpha: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    centered: bool = False
    maximize: bool = False
    fused_multiply_add: bool = dataclasses.field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        check_nonnegative(
            (self.lr, "learning rate"),
            (self.eps, "epsilon value"),
            (self.momentum, "momentum value"),
            (self.weight_decay, "weight_decay value"),
            (self.alpha, "alpha value"),
        )
        if self.centered:
            raise ValueError(
                "RMSprop(centered=True) is not supported yet: its variance, square_avg - grad_avg**2, cancels, "
                "and written in standard ops it ended 1 ulp (float32) to thousands of ulps (float64) away from "
                "torch's recorded updates where it did; centered=False is torch's default"
            )

    def state_slots(self) -> tuple[str, ...]:
        """``square_avg``, then ``momentum_buffer`` with momentum."""
        return ("square_avg", "momentum_buffer") if self.momentum > 0 else ("square_avg",)

    def scalars(self, emitter: GraphEmitter, lr: str, step: str, elem_type: int) -> dict[str, str]:
        """The negated group lr in the parameters' type (torch's ``alpha=-lr`` / ``value=-lr``)."""
        return {"neg_lr": cast_to(emitter, emitter.op("Neg", [lr]), elem_type)}

    def standard_update(
        self, math: TensorMath, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> Update:
        """See the class docstring."""
        g = math.l2_gradient(param, grad, self.maximize, self.weight_decay)
        # square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        square_avg = math.decayed_square(state["square_avg"], g, self.alpha, name=f"{param}.square_avg.new")
        new_state = {"square_avg": square_avg}
        # avg = square_avg.sqrt().add_(eps)
        avg = math.op("Add", [math.op("Sqrt", [square_avg]), math.const(self.eps)])
        if self.momentum > 0:
            # buf.mul_(momentum).addcdiv_(grad, avg); param.add_(buf, alpha=-lr)
            decayed = math.op("Mul", [state["momentum_buffer"], math.const(self.momentum)])
            buf = math.addcdiv(decayed, g, avg, name=f"{param}.momentum_buffer.new")
            new_state["momentum_buffer"] = buf
            return math.fma(buf, scalars["neg_lr"], param, name=f"{param}.new"), new_state
        # param.addcdiv_(grad, avg, value=-lr)
        return math.addcdiv(param, math.op("Mul", [scalars["neg_lr"], g]), avg, name=f"{param}.new"), new_state
