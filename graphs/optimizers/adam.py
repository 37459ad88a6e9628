"""torch.optim.Adam and AdamW: one ``ortlstm::AdamUpdate`` node per parameter, or the same update in standard ops."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.optimizers.arithmetic import DOUBLE, TensorMath, cast_to, decoupled_decay, scalar_double
from ortlstm.graphs.optimizers.base import (
    Optimizer,
    Update,
    as_betas,
    check_betas,
    check_implementation,
    register_optimizer,
)
from ortlstm.ops import schema


@register_optimizer
@dataclasses.dataclass(frozen=True)
class Adam(Optimizer):
    """torch.optim.Adam (single-tensor path), ``lr`` and ``step`` fed per update.

    ``g`` the gradient (``-g`` if ``maximize``); ``g += weight_decay * p`` (L2, coupled);
    ``m = lerp(m, g, 1 - beta1)``; ``v = beta2 * v + (1 - beta2) * g * g``; with amsgrad
    ``v_max = max(v_max, v)`` replaces ``v`` below; ``bc1 = 1 - beta1**step``,
    ``bc2 = 1 - beta2**step`` (float64);
    ``p += (-lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)``.

    Attributes:
        lr: torch's default learning rate (the trainer's lr input when no schedule is given).
        betas: Decay rates of the first and second moment averages.
        eps: Added to the denominator.
        weight_decay: L2 penalty added to the gradient.
        amsgrad: Use the maximum of past second moments.
        maximize: Maximize the objective instead of minimizing it.
        fused_multiply_add: Round ``a * b + c`` once where torch's CPU kernels do (float32 and
            16-bit parameters; costs float64 temporaries). Not a torch hyperparameter.
        implementation: ``"ortlstm"`` (default): one ``ortlstm::AdamUpdate`` node per parameter,
            which needs the ortlstm library in the session (the train step does); always fused,
            so it needs ``fused_multiply_add=True``, and float32 or float64 parameters.
            ``"onnx"``: standard ONNX ops only (about 20 nodes per parameter, float64 temporaries
            for the fused multiply-adds), runnable without the library. The two agree bit for bit
            for float32 parameters (barring the one-in-2**29 double rounding of the emulation);
            for float64 the kernel's true fused multiply-adds are torch's, the graph's round twice.
            Not a torch hyperparameter.
    """

    torch_name: ClassVar[str] = "Adam"
    kernel: ClassVar[schema.OpSpec | None] = schema.ADAM_UPDATE
    decoupled_weight_decay: ClassVar[bool] = False
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    maximize: bool = False
    fused_multiply_add: bool = dataclasses.field(default=True, kw_only=True)
    implementation: str = dataclasses.field(default="ortlstm", kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", as_betas(self.betas))
        if not self.lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {self.lr}")
        if not self.eps >= 0.0:
            raise ValueError(f"Invalid epsilon value: {self.eps}")
        check_betas(self.betas)
        if not self.weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {self.weight_decay}")
        check_implementation(self.implementation, self.fused_multiply_add)

    def state_slots(self) -> tuple[str, ...]:
        """``exp_avg``, ``exp_avg_sq`` and, with amsgrad, ``max_exp_avg_sq``."""
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if self.amsgrad else ("exp_avg", "exp_avg_sq")

    def scalars(self, emitter: GraphEmitter, lr: str, step: str, elem_type: int) -> dict[str, str]:
        """``-lr / bc1``, ``sqrt(bc2)`` and (AdamW) ``1 - lr * weight_decay``, computed in float64."""
        beta1, beta2 = self.betas
        step_d = scalar_double(emitter, step)
        one = emitter.constant(1.0, DOUBLE)
        # torch: bias_correction1 = 1 - beta1**step; step_size = lr / bias_correction1 (Python floats).
        bc1 = emitter.op("Sub", [one, emitter.op("Pow", [emitter.constant(beta1, DOUBLE), step_d])])
        bc2 = emitter.op("Sub", [one, emitter.op("Pow", [emitter.constant(beta2, DOUBLE), step_d])])
        neg_step_size = emitter.op("Neg", [emitter.op("Div", [lr, bc1])])
        bc2_sqrt = emitter.op("Pow", [bc2, emitter.constant(0.5, DOUBLE)])  # torch: bias_correction2**0.5
        scalars = {
            "neg_step_size": cast_to(emitter, neg_step_size, elem_type),
            "bias_correction2_sqrt": cast_to(emitter, bc2_sqrt, elem_type),
        }
        if self.decoupled_weight_decay and self.weight_decay != 0:
            scalars["decay"] = decoupled_decay(emitter, lr, self.weight_decay, elem_type)
        return scalars

    def standard_update(
        self, math: TensorMath, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> Update:
        """See the class docstring."""
        beta1, beta2 = self.betas
        param, g = math.weight_decay(param, grad, self.maximize, self.weight_decay, scalars.get("decay"))
        # exp_avg.lerp_(grad, 1 - beta1)
        new_exp_avg = math.lerp(state["exp_avg"], g, 1.0 - beta1, name=f"{param}.exp_avg.new")
        # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        new_exp_avg_sq = math.decayed_square(state["exp_avg_sq"], g, beta2, name=f"{param}.exp_avg_sq.new")
        new_state = {"exp_avg": new_exp_avg, "exp_avg_sq": new_exp_avg_sq}
        second = new_exp_avg_sq
        if self.amsgrad:
            second = math.op(
                "Max",
                [state["max_exp_avg_sq"], new_exp_avg_sq],
                outputs=[math.emitter.fresh(f"{param}.max_exp_avg_sq.new")],
            )
            new_state["max_exp_avg_sq"] = second
        # denom = (v.sqrt() / bias_correction2_sqrt).add_(eps); param.addcdiv_(exp_avg, denom, value=-step_size)
        sqrt = math.op("Sqrt", [second])
        denom = math.op("Add", [math.op("Div", [sqrt, scalars["bias_correction2_sqrt"]]), math.const(self.eps)])
        # addcdiv_'s CPU kernel: param + value * exp_avg / denom, i.e. ((value * exp_avg) / denom) + param.
        scaled_exp_avg = math.op("Mul", [scalars["neg_step_size"], new_exp_avg])
        return math.addcdiv(param, scaled_exp_avg, denom, name=f"{param}.new"), new_state

    def kernel_inputs(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, bool]]:
        """The same update as one ``ortlstm::AdamUpdate`` node (docs/ops.md#adamupdate)."""
        beta1, beta2 = self.betas
        # The hyperparameters as float64 constants: the kernel rounds them where torch does.
        inputs = {
            "param": param,
            "grad": grad,
            "exp_avg": state["exp_avg"],
            "exp_avg_sq": state["exp_avg_sq"],
            "lr": scalars["lr"],
            "step": scalars["step"],
            "beta1": emitter.constant(beta1, DOUBLE),
            "beta2": emitter.constant(beta2, DOUBLE),
            "eps": emitter.constant(self.eps, DOUBLE),
        }
        if self.weight_decay != 0:
            inputs["weight_decay"] = emitter.constant(self.weight_decay, DOUBLE)
        if self.amsgrad:
            inputs["max_exp_avg_sq"] = state["max_exp_avg_sq"]
        return inputs, {"decoupled_weight_decay": self.decoupled_weight_decay, "maximize": self.maximize}


@register_optimizer
@dataclasses.dataclass(frozen=True)
class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay, ``p *= 1 - lr * weight_decay`` first.

    The update is Adam's without the L2 term in the gradient; the decay multiplies the parameter
    before the Adam step, as torch does (``1 - lr * weight_decay`` in float64, then rounded).

    Attributes:
        lr: torch's default learning rate (the trainer's lr input when no schedule is given).
        betas: Decay rates of the first and second moment averages.
        eps: Added to the denominator.
        weight_decay: Decoupled weight decay (torch's default 1e-2).
        amsgrad: Use the maximum of past second moments.
        maximize: Maximize the objective instead of minimizing it.
        fused_multiply_add: Round ``a * b + c`` once where torch's CPU kernels do (float32 and
            16-bit parameters; costs float64 temporaries). Not a torch hyperparameter.
        implementation: ``"ortlstm"`` (one fused node per parameter) or ``"onnx"``: as Adam's.
    """

    torch_name: ClassVar[str] = "AdamW"
    decoupled_weight_decay: ClassVar[bool] = True
    weight_decay: float = 1e-2
