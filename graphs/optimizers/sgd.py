"""torch.optim.SGD: one ``ortlstm::SGDUpdate`` node per parameter, or the same update in standard ops."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.optimizers.arithmetic import DOUBLE, TensorMath, cast_to, scalar_double
from ortlstm.graphs.optimizers.base import Optimizer, Update, check_implementation, register_optimizer
from ortlstm.ops import schema


@register_optimizer
@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
    """torch.optim.SGD (single-tensor path), ``lr`` fed per step.

    With ``g`` the gradient (``-g`` if ``maximize``), ``g += weight_decay * p``; with momentum,
    ``b = g`` at step 1, else ``b = momentum * b + (1 - dampening) * g``, and ``g = g + momentum * b``
    (nesterov) or ``g = b``; then ``p -= lr * g``.

    Attributes:
        lr: torch's default learning rate; the trainer's value for the lr input when no schedule
            is given (the graph reads the input).
        momentum: Momentum factor.
        dampening: Dampening of the momentum.
        weight_decay: L2 penalty added to the gradient.
        nesterov: Nesterov momentum (needs momentum > 0 and dampening == 0).
        maximize: Maximize the objective instead of minimizing it.
        fused_multiply_add: Round ``a * b + c`` once where torch's CPU kernels do (float32 and
            16-bit parameters; costs float64 temporaries). Not a torch hyperparameter.
        implementation: ``"ortlstm"`` (default): one ``ortlstm::SGDUpdate`` node per parameter,
            which needs the ortlstm library in the session (the train step does); always fused,
            so it needs ``fused_multiply_add=True``, and float32 or float64 parameters.
            ``"onnx"``: standard ops only, runnable without the library. The two agree bit for
            bit for float32; for float64 the kernel's true fused multiply-adds are torch's, the
            graph's round twice. Not a torch hyperparameter.
    """

    torch_name: ClassVar[str] = "SGD"
    kernel: ClassVar[schema.OpSpec | None] = schema.SGD_UPDATE
    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    maximize: bool = False
    fused_multiply_add: bool = dataclasses.field(default=True, kw_only=True)
    implementation: str = dataclasses.field(default="ortlstm", kw_only=True)

    def __post_init__(self) -> None:
        check_implementation(self.implementation, self.fused_multiply_add)
        if self.lr < 0.0:
            raise ValueError(f"Invalid learning rate: {self.lr}")
        if self.momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {self.momentum}")
        if self.weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {self.weight_decay}")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def state_slots(self) -> tuple[str, ...]:
        """``("momentum_buffer",)`` with momentum, else none."""
        return ("momentum_buffer",) if self.momentum != 0 else ()

    def scalars(self, emitter: GraphEmitter, lr: str, step: str, elem_type: int) -> dict[str, str]:
        """The negated group lr in the parameters' type and, with momentum, ``step == 1``."""
        # torch: param.add_(grad, alpha=-lr), the Python float rounded to the tensor's type.
        scalars = {"neg_lr": cast_to(emitter, emitter.op("Neg", [lr]), elem_type)}
        if self.momentum != 0:
            step_d = scalar_double(emitter, step)
            scalars["first_step"] = emitter.op("Equal", [step_d, emitter.constant(1.0, DOUBLE)])
        return scalars

    def standard_update(
        self, math: TensorMath, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> Update:
        """See the class docstring."""
        g = math.l2_gradient(param, grad, self.maximize, self.weight_decay)
        new_state: dict[str, str] = {}
        if self.momentum != 0:
            # buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            decayed = math.op("Mul", [state["momentum_buffer"], math.const(self.momentum)])
            running = math.fma(g, 1.0 - self.dampening, decayed)
            # torch: the buffer is a copy of the gradient at its first step.
            buf = math.op(
                "Where",
                [scalars["first_step"], g, running],
                outputs=[math.emitter.fresh(f"{param}.momentum_buffer.new")],
            )
            new_state["momentum_buffer"] = buf
            g = math.fma(buf, self.momentum, g) if self.nesterov else buf
        # param.add_(grad, alpha=-lr)
        return math.fma(g, scalars["neg_lr"], param, name=f"{param}.new"), new_state

    def kernel_inputs(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, bool]]:
        """Parameter, gradient, lr, buffer and step (with momentum), the nonzero hyperparameters."""
        hyperparameters = {"momentum": self.momentum, "dampening": self.dampening, "weight_decay": self.weight_decay}
        inputs = {"param": param, "grad": grad, "lr": scalars["lr"]}
        if self.momentum != 0:
            inputs.update(momentum_buffer=state["momentum_buffer"], step=scalars["step"])
        # The hyperparameters as float64 constants (0 ones left out): the kernel rounds them where torch does.
        inputs.update({name: emitter.constant(value, DOUBLE) for name, value in hyperparameters.items() if value != 0})
        return inputs, {"nesterov": self.nesterov, "maximize": self.maximize}
