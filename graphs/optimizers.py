"""torch.optim's SGD, Adam, AdamW, RMSprop and Adagrad and clip_grad_norm_ as ONNX nodes.

Clipping, RMSprop and Adagrad are standard ops. SGD, Adam and AdamW emit one ``ortlstm::SGDUpdate`` or
``ortlstm::AdamUpdate`` node per parameter by default (the ortlstm library's kernels: one pass
over the parameter, threaded, true fused multiply-adds; docs/ops.md#sgdupdate, #adamupdate), or
the same update in standard ops with ``implementation="onnx"`` (up to about 20 nodes per
parameter, float64 temporaries), which runs without the library. Both follow the description
below.

Each optimizer is a frozen dataclass with torch's hyperparameter names and defaults. The
learning rate and the step number are graph inputs, so a schedule changes them per run without
a rebuild:

- ``lr``: a 0-D (or one-element) float tensor, the learning rate of this update. It is cast to
  float64 inside, where the scalar arithmetic happens (see below); feeding it as float64 gives
  bit-for-bit torch's Python-float lr, float32 works too (the step size then differs from torch's
  by at most one float32 rounding).
- ``step``: a 0-D (or one-element) tensor, the 1-based number of this update (torch's
  ``state["step"]`` after its increment), int64 recommended: exact at any count (a float32
  counter stops counting at 2**24) and compared exactly for SGD's first-step momentum buffer.
  Any numeric type is accepted; it is cast to float64.

The per-update scalars (bias corrections, step size, decoupled decay factor) are computed in
float64, as torch computes them in Python floats, and rounded once to the parameter's type where
torch hands them to a tensor op; the tensor arithmetic then follows torch's single-tensor
(``foreach=False``) code path operation by operation, including where torch's CPU kernels fuse a
multiply-add (``add(alpha=)``, ``lerp``, ``addcmul``): with ``fused_multiply_add=True`` (the
default) those are computed in float64 and rounded once, which for float32 parameters is the fused
result. Measured: 13 of 23 recorded float32 trajectories bit-identical to torch 2.13 over 10 steps,
the rest within 1 ulp per step (clip_grad_norm's float32 sum order; ties in addcdiv).

The update ``exp_avg / (sqrt(v) / bc2 + eps)`` must reach the runtime as written: run no generic
algebraic optimizer over these nodes (one rewrote ``x / (sqrt(v) + eps)`` to ``x / sqrt(v)``).

Per-parameter state uses torch's ``state_dict`` names (``momentum_buffer``, ``exp_avg``,
``exp_avg_sq``, ``max_exp_avg_sq``), initialized to zeros. torch's per-parameter ``step`` is the
``step`` input. Protos only: nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
import onnx.helper

try:
    from ortlstm.graphs.autodiff.emitter import GraphEmitter
    from ortlstm.ops import schema
except ModuleNotFoundError:
    from graphs.autodiff.emitter import GraphEmitter  # type: ignore[no-redef]
    from ops import schema  # type: ignore[no-redef]

_DOUBLE = onnx.TensorProto.DOUBLE


# ---- parameter groups --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParamGroup:
    """Parameters that share hyperparameters other than the optimizer's (torch's param groups).

    Every hyperparameter left at None takes the optimizer's value. Since the learning rate is a
    graph input, a group scales it instead of replacing it: torch's ``{"params": ..., "lr": x}``
    with a base lr ``b`` is ``ParamGroup(params, lr_scale=x / b)`` fed ``lr = b * schedule``.

    Attributes:
        params: Names of the parameters (graph values) in the group.
        lr_scale: This group's learning rate is ``lr * lr_scale``.
        weight_decay: Override (e.g. 0.0 for biases and norms).
        momentum: Override (SGD, RMSprop).
        dampening: Override (SGD).
        nesterov: Override (SGD).
        betas: Override (Adam, AdamW).
        eps: Override (Adam, AdamW, RMSprop, Adagrad).
        amsgrad: Override (Adam, AdamW).
        maximize: Override (all).
    """

    params: tuple[str, ...]
    lr_scale: float = 1.0
    weight_decay: float | None = None
    momentum: float | None = None
    dampening: float | None = None
    nesterov: bool | None = None
    betas: tuple[float, float] | None = None
    eps: float | None = None
    amsgrad: bool | None = None
    maximize: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.params, str):
            raise TypeError(f"ParamGroup.params must be a sequence of names, got the string {self.params!r}")
        object.__setattr__(self, "params", tuple(self.params))
        if self.betas is not None:
            object.__setattr__(self, "betas", tuple(self.betas))
        if not (math.isfinite(self.lr_scale) and self.lr_scale >= 0.0):
            raise ValueError(f"Invalid lr_scale value: {self.lr_scale}")

    def overrides(self) -> dict[str, Any]:
        """The hyperparameters this group sets (those not None), by torch's names."""
        skip = {"params", "lr_scale"}
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in skip and getattr(self, field.name) is not None
        }


# ---- shared scalar helpers ---------------------------------------------------------------------


def _scalar_double(emitter: GraphEmitter, value: str) -> str:
    """A 0-D float64 copy of a 0-D or one-element input."""
    return emitter.op("Reshape", [emitter.op("Cast", [value], to=_DOUBLE), emitter.ints([])])


def _as_double(emitter: GraphEmitter, value: str) -> str:
    """``value`` as float64: itself when it is, else a Cast (its shape kept)."""
    return value if emitter.elem_type(value) == _DOUBLE else emitter.op("Cast", [value], to=_DOUBLE)


def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def _param_elem_type(emitter: GraphEmitter, param: str) -> int:
    elem_type = emitter.elem_type(param)
    if not elem_type:
        raise ValueError(
            f"the element type of parameter {param!r} is unknown to the emitter; record it with "
            "emitter.set_type (or build the emitter with infer_value_types(model))"
        )
    return elem_type


def _const(emitter: GraphEmitter, value: float, elem_type: int) -> str:
    """A 0-D constant: ``value`` (a Python float, i.e. double) rounded to ``elem_type`` once."""
    return emitter.constant(np.asarray(value, dtype=np.float64).astype(_np_dtype(elem_type)), elem_type)


def _cast_to(emitter: GraphEmitter, value: str, elem_type: int) -> str:
    return value if elem_type == _DOUBLE else emitter.op("Cast", [value], to=elem_type)


def _wide(emitter: GraphEmitter, value: str | float, elem_type: int) -> str:
    """``value`` (a tensor of ``elem_type`` or a Python float rounded to it) as float64, exactly."""
    if isinstance(value, str):
        return emitter.op("Cast", [value], to=_DOUBLE)
    rounded = np.asarray(value, dtype=np.float64).astype(_np_dtype(elem_type)).astype(np.float64)
    return emitter.constant(rounded, _DOUBLE)


def _fma(
    emitter: GraphEmitter, a: str, b: str | float, c: str, elem_type: int, fused: bool, *, name: str | None = None
) -> str:
    """``a * b + c``, rounded once when ``fused`` (a fused multiply-add, as torch's CPU kernels do).

    ONNX has no FMA op. For float32 (and 16-bit) values the product of two is exact in float64, so
    computing there and rounding back gives the fused result (a double rounding could differ in
    about one case in 2**29). float64 values are multiplied and added with two roundings.
    ``b`` may be a Python float, rounded to ``elem_type`` first as torch rounds a scalar argument.
    """
    outputs = 1 if name is None else [emitter.fresh(name)]
    if fused and elem_type != _DOUBLE:
        product = emitter.op("Mul", [_wide(emitter, a, elem_type), _wide(emitter, b, elem_type)])
        wide = emitter.op("Add", [product, _wide(emitter, c, elem_type)])
        return emitter.op("Cast", [wide], to=elem_type, outputs=outputs)
    factor = b if isinstance(b, str) else _const(emitter, b, elem_type)
    return emitter.op("Add", [emitter.op("Mul", [a, factor]), c], outputs=outputs)


def _l2_gradient(
    emitter: GraphEmitter, param: str, grad: str, maximize: bool, weight_decay: float, elem_type: int, fused: bool
) -> str:
    """The gradient as torch's first lines make it: ``-grad`` if maximize, then ``+ weight_decay * param``."""
    g = emitter.op("Neg", [grad]) if maximize else grad
    return g if weight_decay == 0 else _fma(emitter, param, weight_decay, g, elem_type, fused)


def _lerp(emitter: GraphEmitter, start: str, end: str, weight: float, elem_type: int, fused: bool, *, name: str) -> str:
    """The lerp of torch's ``start.lerp_(end, weight)``, the weight rounded to the tensor's type.

    ``start + w * (end - start)`` for ``|w| < 0.5``, else ``end + (w - 1) * (end - start)``.
    """
    rounded = np.asarray(weight, dtype=np.float64).astype(_np_dtype(elem_type))
    diff = emitter.op("Sub", [end, start])
    if abs(float(rounded)) < 0.5:
        return _fma(emitter, diff, float(rounded), start, elem_type, fused, name=name)
    return _fma(emitter, diff, float(rounded - rounded.dtype.type(1)), end, elem_type, fused, name=name)


def _decayed_square(
    emitter: GraphEmitter, average: str, g: str, decay: float, elem_type: int, fused: bool, *, name: str
) -> str:
    """The average of ``average.mul_(decay).addcmul_(g, g, value=1 - decay)``, torch's order.

    ``((1 - decay) * g) * g + average * decay``, the multiply-add fused as torch's CPU kernel fuses it.
    """
    scaled = emitter.op("Mul", [average, _const(emitter, decay, elem_type)])
    weighted = emitter.op("Mul", [g, _const(emitter, 1.0 - decay, elem_type)])
    return _fma(emitter, weighted, g, scaled, elem_type, fused, name=name)


def _addcdiv(emitter: GraphEmitter, base: str, numerator: str, denominator: str, *, name: str) -> str:
    """The result of torch's CPU ``base.addcdiv_(numerator, denominator)``, the value folded into ``numerator``.

    ``base + numerator / denominator``, each operation rounded.
    """
    return emitter.op("Add", [base, emitter.op("Div", [numerator, denominator])], outputs=[emitter.fresh(name)])


# ---- the optimizers ----------------------------------------------------------------------------


class Optimizer:
    """What the optimizers share: state slots, group overrides, the two-phase update.

    ``prepare`` emits the per-update scalars (once per group and dtype), ``update`` the tensor
    arithmetic of one parameter; ``apply`` does both for a single parameter.
    """

    torch_name: ClassVar[str] = ""
    lr: float

    def state_slots(self) -> tuple[str, ...]:
        """Names of the per-parameter state tensors, as in torch's ``optimizer.state_dict()``."""
        raise NotImplementedError

    def initial_state(self, param: np.ndarray) -> dict[str, np.ndarray]:
        """Each state slot's initial value for a parameter: zeros of its shape and dtype."""
        return {slot: np.zeros_like(param) for slot in self.state_slots()}

    def with_overrides(self, group: ParamGroup) -> Optimizer:
        """This optimizer with a parameter group's hyperparameters.

        Raises:
            ValueError: The group sets a hyperparameter this optimizer does not have.
        """
        overrides = group.overrides()
        names = {field.name for field in dataclasses.fields(self)}  # type: ignore[arg-type]
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(
                f"a parameter group of {type(self).__name__} sets {', '.join(unknown)}, which "
                f"{type(self).__name__} does not have (its hyperparameters: {', '.join(sorted(names - {'lr'}))})"
            )
        return dataclasses.replace(self, **overrides)  # type: ignore[type-var]

    def prepare(
        self, emitter: GraphEmitter, lr: str, step: str, elem_type: int, lr_scale: float = 1.0
    ) -> dict[str, str]:
        """Emits the scalars an update needs, of the parameters' element type where torch rounds them.

        Args:
            emitter: Receives the nodes.
            lr: The learning-rate input (0-D or one element, any float type).
            step: The 1-based step-number input (0-D or one element, int64 recommended).
            elem_type: ONNX element type of the parameters the scalars serve.
            lr_scale: The parameter group's multiplier of ``lr``.
        """
        raise NotImplementedError

    def update(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> tuple[str, dict[str, str]]:
        """Emits one parameter's update; returns the updated parameter and state (slot -> value)."""
        raise NotImplementedError

    def apply(
        self,
        emitter: GraphEmitter,
        param: str,
        grad: str,
        state: Mapping[str, str],
        lr: str,
        step: str,
        lr_scale: float = 1.0,
    ) -> tuple[str, dict[str, str]]:
        """Emits the update of one parameter (``prepare`` then ``update``).

        Args:
            emitter: Receives the nodes; must know ``param``'s element type.
            param: The parameter's current value.
            grad: Its gradient (already clipped, if clipping is wanted).
            state: Slot name (``state_slots()``) -> current state value.
            lr: Learning-rate input.
            step: 1-based step-number input.
            lr_scale: Multiplier of ``lr`` (a parameter group's).

        Returns:
            The updated parameter's value name and the updated state (slot -> value name).
        """
        scalars = self.prepare(emitter, lr, step, _param_elem_type(emitter, param), lr_scale)
        return self.update(emitter, param, grad, state, scalars)

    def _check_state(self, param: str, state: Mapping[str, str]) -> None:
        missing = [slot for slot in self.state_slots() if slot not in state]
        if missing:
            raise ValueError(
                f"{type(self).__name__} needs state {', '.join(missing)} for parameter {param!r}; "
                f"got {sorted(state) or 'none'} (state_slots(): {self.state_slots()})"
            )

    def _finish(self, emitter: GraphEmitter, param: str, new_param: str, state: dict[str, str]) -> None:
        known = emitter.value_type(param)
        if known is not None:
            for value in (new_param, *state.values()):
                emitter.set_type(value, known.elem_type, known.shape)

    def _fused_node(
        self,
        emitter: GraphEmitter,
        op: schema.OpSpec,
        param: str,
        inputs: Mapping[str, str],
        elem_type: int,
        **flags: bool,
    ) -> tuple[str, dict[str, str]]:
        """One node of the ortlstm optimizer op ``op`` (inputs by port name, absent ones omitted).

        Outputs: the updated parameter, then one per state slot, in ``state_slots()`` order (the
        order of the op's state outputs).
        """
        if elem_type not in (onnx.TensorProto.FLOAT, _DOUBLE):
            raise ValueError(
                f"parameter {param!r} is {onnx.TensorProto.DataType.Name(elem_type)}; {op.name} takes FLOAT or "
                "DOUBLE parameters: use implementation='onnx' for others"
            )
        ordered = [inputs.get(name, "") for name in schema.input_names(op)]
        while not ordered[-1]:
            ordered.pop()
        slots = self.state_slots()
        outputs = [emitter.fresh(f"{param}.new"), *(emitter.fresh(f"{param}.{slot}.new") for slot in slots)]
        emitter.op_multi(
            op.name,
            ordered,
            outputs=outputs,
            domain=op.domain,
            **{name: int(value) for name, value in flags.items()},
        )
        new_state = dict(zip(slots, outputs[1:], strict=True))
        self._finish(emitter, param, outputs[0], new_state)
        return outputs[0], new_state


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
    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    maximize: bool = False
    fused_multiply_add: bool = dataclasses.field(default=True, kw_only=True)
    implementation: str = dataclasses.field(default="ortlstm", kw_only=True)

    def __post_init__(self) -> None:
        _check_implementation(self.implementation, self.fused_multiply_add)
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

    def prepare(
        self, emitter: GraphEmitter, lr: str, step: str, elem_type: int, lr_scale: float = 1.0
    ) -> dict[str, str]:
        """The negated group lr in the parameters' type and, with momentum, ``step == 1``.

        For the SGDUpdate node only the group's lr and the step, as float64: it computes the rest.
        """
        if self.implementation == "ortlstm":
            return _node_scalars(emitter, lr, step, lr_scale)
        lr_d = _scalar_double(emitter, lr)
        if lr_scale != 1.0:
            lr_d = emitter.op("Mul", [lr_d, emitter.constant(lr_scale, _DOUBLE)])
        # torch: param.add_(grad, alpha=-lr), the Python float rounded to the tensor's type.
        scalars = {"neg_lr": _cast_to(emitter, emitter.op("Neg", [lr_d]), elem_type)}
        if self.momentum != 0:
            step_d = _scalar_double(emitter, step)
            scalars["first_step"] = emitter.op("Equal", [step_d, emitter.constant(1.0, _DOUBLE)])
        return scalars

    def update(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> tuple[str, dict[str, str]]:
        """See the class docstring."""
        self._check_state(param, state)
        elem_type = _param_elem_type(emitter, param)
        if self.implementation == "ortlstm":
            hyperparameters = {
                "momentum": self.momentum,
                "dampening": self.dampening,
                "weight_decay": self.weight_decay,
            }
            inputs = {"param": param, "grad": grad, "lr": scalars["lr"]}
            if self.momentum != 0:
                inputs.update(momentum_buffer=state["momentum_buffer"], step=scalars["step"])
            # The hyperparameters as float64 constants (0 ones left out): the kernel rounds them where torch does.
            inputs.update(
                {name: emitter.constant(value, _DOUBLE) for name, value in hyperparameters.items() if value != 0}
            )
            return self._fused_node(
                emitter, schema.SGD_UPDATE, param, inputs, elem_type, nesterov=self.nesterov, maximize=self.maximize
            )
        fused = self.fused_multiply_add
        g = _l2_gradient(emitter, param, grad, self.maximize, self.weight_decay, elem_type, fused)
        new_state: dict[str, str] = {}
        if self.momentum != 0:
            # buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            decayed = emitter.op("Mul", [state["momentum_buffer"], _const(emitter, self.momentum, elem_type)])
            running = _fma(emitter, g, 1.0 - self.dampening, decayed, elem_type, fused)
            # torch: the buffer is a copy of the gradient at its first step.
            buf = emitter.op(
                "Where", [scalars["first_step"], g, running], outputs=[emitter.fresh(f"{param}.momentum_buffer.new")]
            )
            new_state["momentum_buffer"] = buf
            g = _fma(emitter, buf, self.momentum, g, elem_type, fused) if self.nesterov else buf
        # param.add_(grad, alpha=-lr)
        new_param = _fma(emitter, g, scalars["neg_lr"], param, elem_type, fused, name=f"{param}.new")
        self._finish(emitter, param, new_param, new_state)
        return new_param, new_state


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
        object.__setattr__(self, "betas", tuple(float(beta) for beta in self.betas))
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two floats, got {self.betas}")
        if not self.lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {self.lr}")
        if not self.eps >= 0.0:
            raise ValueError(f"Invalid epsilon value: {self.eps}")
        for index, beta in enumerate(self.betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
        if not self.weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {self.weight_decay}")
        _check_implementation(self.implementation, self.fused_multiply_add)

    def state_slots(self) -> tuple[str, ...]:
        """``exp_avg``, ``exp_avg_sq`` and, with amsgrad, ``max_exp_avg_sq``."""
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if self.amsgrad else ("exp_avg", "exp_avg_sq")

    def prepare(
        self, emitter: GraphEmitter, lr: str, step: str, elem_type: int, lr_scale: float = 1.0
    ) -> dict[str, str]:
        """``-lr / bc1``, ``sqrt(bc2)`` and (AdamW) ``1 - lr * weight_decay``, computed in float64.

        For the AdamUpdate node only the group's lr and the step, as float64: it computes the rest.
        """
        beta1, beta2 = self.betas
        if self.implementation == "ortlstm":
            return _node_scalars(emitter, lr, step, lr_scale)
        lr_d = _scalar_double(emitter, lr)
        if lr_scale != 1.0:
            lr_d = emitter.op("Mul", [lr_d, emitter.constant(lr_scale, _DOUBLE)])
        step_d = _scalar_double(emitter, step)
        one = emitter.constant(1.0, _DOUBLE)
        # torch: bias_correction1 = 1 - beta1**step; step_size = lr / bias_correction1 (Python floats).
        bc1 = emitter.op("Sub", [one, emitter.op("Pow", [emitter.constant(beta1, _DOUBLE), step_d])])
        bc2 = emitter.op("Sub", [one, emitter.op("Pow", [emitter.constant(beta2, _DOUBLE), step_d])])
        neg_step_size = emitter.op("Neg", [emitter.op("Div", [lr_d, bc1])])
        bc2_sqrt = emitter.op("Pow", [bc2, emitter.constant(0.5, _DOUBLE)])  # torch: bias_correction2**0.5
        scalars = {
            "neg_step_size": _cast_to(emitter, neg_step_size, elem_type),
            "bias_correction2_sqrt": _cast_to(emitter, bc2_sqrt, elem_type),
        }
        if self.decoupled_weight_decay and self.weight_decay != 0:
            # torch: param.mul_(1 - lr * weight_decay), a Python float.
            decay = emitter.op("Sub", [one, emitter.op("Mul", [lr_d, emitter.constant(self.weight_decay, _DOUBLE)])])
            scalars["decay"] = _cast_to(emitter, decay, elem_type)
        return scalars

    def update(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> tuple[str, dict[str, str]]:
        """See the class docstring."""
        self._check_state(param, state)
        elem_type = _param_elem_type(emitter, param)
        if self.implementation == "ortlstm":
            return self._update_node(emitter, param, grad, state, scalars, elem_type)
        beta1, beta2 = self.betas
        fused = self.fused_multiply_add
        g = emitter.op("Neg", [grad]) if self.maximize else grad
        if self.weight_decay != 0:
            if self.decoupled_weight_decay:
                param = emitter.op("Mul", [param, scalars["decay"]])  # param.mul_(1 - lr * weight_decay)
            else:
                g = _fma(emitter, param, self.weight_decay, g, elem_type, fused)  # grad.add(param, alpha=wd)
        # exp_avg.lerp_(grad, 1 - beta1)
        new_exp_avg = _lerp(emitter, state["exp_avg"], g, 1.0 - beta1, elem_type, fused, name=f"{param}.exp_avg.new")
        # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        new_exp_avg_sq = _decayed_square(
            emitter, state["exp_avg_sq"], g, beta2, elem_type, fused, name=f"{param}.exp_avg_sq.new"
        )
        new_state = {"exp_avg": new_exp_avg, "exp_avg_sq": new_exp_avg_sq}
        second = new_exp_avg_sq
        if self.amsgrad:
            second = emitter.op(
                "Max", [state["max_exp_avg_sq"], new_exp_avg_sq], outputs=[emitter.fresh(f"{param}.max_exp_avg_sq.new")]
            )
            new_state["max_exp_avg_sq"] = second
        # denom = (v.sqrt() / bias_correction2_sqrt).add_(eps); param.addcdiv_(exp_avg, denom, value=-step_size)
        denom = emitter.op(
            "Add",
            [
                emitter.op("Div", [emitter.op("Sqrt", [second]), scalars["bias_correction2_sqrt"]]),
                _const(emitter, self.eps, elem_type),
            ],
        )
        # addcdiv_'s CPU kernel: param + value * exp_avg / denom, i.e. ((value * exp_avg) / denom) + param.
        scaled_exp_avg = emitter.op("Mul", [scalars["neg_step_size"], new_exp_avg])
        new_param = _addcdiv(emitter, param, scaled_exp_avg, denom, name=f"{param}.new")
        self._finish(emitter, param, new_param, new_state)
        return new_param, new_state

    def _update_node(
        self,
        emitter: GraphEmitter,
        param: str,
        grad: str,
        state: Mapping[str, str],
        scalars: Mapping[str, str],
        elem_type: int,
    ) -> tuple[str, dict[str, str]]:
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
            "beta1": emitter.constant(beta1, _DOUBLE),
            "beta2": emitter.constant(beta2, _DOUBLE),
            "eps": emitter.constant(self.eps, _DOUBLE),
        }
        if self.weight_decay != 0:
            inputs["weight_decay"] = emitter.constant(self.weight_decay, _DOUBLE)
        if self.amsgrad:
            inputs["max_exp_avg_sq"] = state["max_exp_avg_sq"]
        return self._fused_node(
            emitter,
            schema.ADAM_UPDATE,
            param,
            inputs,
            elem_type,
            decoupled_weight_decay=self.decoupled_weight_decay,
            maximize=self.maximize,
        )


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
        _check_nonnegative(
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

    def prepare(
        self, emitter: GraphEmitter, lr: str, step: str, elem_type: int, lr_scale: float = 1.0
    ) -> dict[str, str]:
        """The negated group lr in the parameters' type (torch's ``alpha=-lr`` / ``value=-lr``)."""
        return {"neg_lr": _cast_to(emitter, emitter.op("Neg", [_group_lr(emitter, lr, lr_scale)]), elem_type)}

    def update(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> tuple[str, dict[str, str]]:
        """See the class docstring."""
        self._check_state(param, state)
        elem_type = _param_elem_type(emitter, param)
        fused = self.fused_multiply_add
        g = _l2_gradient(emitter, param, grad, self.maximize, self.weight_decay, elem_type, fused)
        # square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        square_avg = _decayed_square(
            emitter, state["square_avg"], g, self.alpha, elem_type, fused, name=f"{param}.square_avg.new"
        )
        new_state = {"square_avg": square_avg}
        # avg = square_avg.sqrt().add_(eps)
        avg = emitter.op("Add", [emitter.op("Sqrt", [square_avg]), _const(emitter, self.eps, elem_type)])
        if self.momentum > 0:
            # buf.mul_(momentum).addcdiv_(grad, avg); param.add_(buf, alpha=-lr)
            decayed = emitter.op("Mul", [state["momentum_buffer"], _const(emitter, self.momentum, elem_type)])
            buf = _addcdiv(emitter, decayed, g, avg, name=f"{param}.momentum_buffer.new")
            new_state["momentum_buffer"] = buf
            new_param = _fma(emitter, buf, scalars["neg_lr"], param, elem_type, fused, name=f"{param}.new")
        else:
            # param.addcdiv_(grad, avg, value=-lr)
            scaled = emitter.op("Mul", [scalars["neg_lr"], g])
            new_param = _addcdiv(emitter, param, scaled, avg, name=f"{param}.new")
        self._finish(emitter, param, new_param, new_state)
        return new_param, new_state


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
        _check_nonnegative(
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

    def prepare(
        self, emitter: GraphEmitter, lr: str, step: str, elem_type: int, lr_scale: float = 1.0
    ) -> dict[str, str]:
        """``-lr / (1 + (step - 1) * lr_decay)`` in float64, rounded to the parameters' type."""
        clr = _group_lr(emitter, lr, lr_scale)
        if self.lr_decay != 0:
            one = emitter.constant(1.0, _DOUBLE)
            steps_before = emitter.op("Sub", [_scalar_double(emitter, step), one])
            decayed_steps = emitter.op("Mul", [steps_before, emitter.constant(self.lr_decay, _DOUBLE)])
            clr = emitter.op("Div", [clr, emitter.op("Add", [one, decayed_steps])])
        return {"neg_clr": _cast_to(emitter, emitter.op("Neg", [clr]), elem_type)}

    def update(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> tuple[str, dict[str, str]]:
        """See the class docstring."""
        self._check_state(param, state)
        elem_type = _param_elem_type(emitter, param)
        fused = self.fused_multiply_add
        g = _l2_gradient(emitter, param, grad, self.maximize, self.weight_decay, elem_type, fused)
        # state_sum.addcmul_(grad, grad, value=1); std = state_sum.sqrt().add_(eps)
        state_sum = _fma(emitter, g, g, state["sum"], elem_type, fused, name=f"{param}.sum.new")
        std = emitter.op("Add", [emitter.op("Sqrt", [state_sum]), _const(emitter, self.eps, elem_type)])
        # param.addcdiv_(grad, std, value=-clr)
        new_param = _addcdiv(emitter, param, emitter.op("Mul", [scalars["neg_clr"], g]), std, name=f"{param}.new")
        new_state = {"sum": state_sum}
        self._finish(emitter, param, new_param, new_state)
        return new_param, new_state


IMPLEMENTATIONS = ("ortlstm", "onnx")
"""Values of the optimizers' ``implementation``: the fused ortlstm op or standard ONNX ops."""


def _check_implementation(implementation: str, fused_multiply_add: bool) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation: expected one of {', '.join(map(repr, IMPLEMENTATIONS))}, got {implementation!r}"
        )
    if implementation == "ortlstm" and not fused_multiply_add:
        raise ValueError(
            "implementation='ortlstm' always fuses the multiply-adds torch fuses; "
            "for fused_multiply_add=False use implementation='onnx'"
        )


def _node_scalars(emitter: GraphEmitter, lr: str, step: str, lr_scale: float) -> dict[str, str]:
    """What an ortlstm optimizer node reads of the graph: the group's lr and the step, as float64."""
    lr_d = _as_double(emitter, lr)
    if lr_scale != 1.0:
        lr_d = emitter.op("Mul", [lr_d, emitter.constant(lr_scale, _DOUBLE)])
    return {"lr": lr_d, "step": _as_double(emitter, step)}


def _check_nonnegative(*checks: tuple[float, str]) -> None:
    """Raises torch's ``Invalid <label>: <value>`` for the first value that is negative or NaN (torch's order)."""
    for value, label in checks:
        if not value >= 0.0:
            raise ValueError(f"Invalid {label}: {value}")


def _group_lr(emitter: GraphEmitter, lr: str, lr_scale: float) -> str:
    """The group's learning rate, 0-D float64 (torch's Python float)."""
    lr_d = _scalar_double(emitter, lr)
    return lr_d if lr_scale == 1.0 else emitter.op("Mul", [lr_d, emitter.constant(lr_scale, _DOUBLE)])


OPTIMIZERS: dict[str, type[Optimizer]] = {
    "SGD": SGD,
    "Adam": Adam,
    "AdamW": AdamW,
    "RMSprop": RMSprop,
    "Adagrad": Adagrad,
}
"""torch.optim class name -> the optimizer here."""


def optimizer_from_torch(name: str, **kwargs: Any) -> Optimizer:
    """The optimizer torch.optim's ``name(params, **kwargs)`` describes (``foreach``/``fused`` ignored).

    Raises:
        ValueError: The name is not one of ``OPTIMIZERS``, or a keyword is not one of its hyperparameters.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer {name!r} is not supported; choose one of {', '.join(OPTIMIZERS)}")
    cls = OPTIMIZERS[name]
    kwargs = {key: value for key, value in kwargs.items() if key not in ("foreach", "fused", "differentiable")}
    names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise ValueError(f"{name} has no hyperparameter {', '.join(unknown)} here (it has {', '.join(sorted(names))})")
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    return cls(**kwargs)


# ---- gradient clipping -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClipGradNorm:
    """torch.nn.utils.clip_grad_norm_'s settings.

    Attributes:
        max_norm: Largest allowed total norm.
        norm_type: The p of the p-norm (``math.inf`` for the largest absolute value).
    """

    max_norm: float
    norm_type: float = 2.0

    def __post_init__(self) -> None:
        if not self.norm_type > 0:
            raise ValueError(f"clip_grad_norm norm_type must be positive or inf, got {self.norm_type}")


def _vector_norm(emitter: GraphEmitter, value: str, norm_type: float) -> str:
    """torch.linalg.vector_norm(value, norm_type) over every element, 0-D."""
    if math.isinf(norm_type):
        return emitter.reduce("ReduceMax", emitter.op("Abs", [value]), None, keepdims=False)
    if norm_type == 2.0:
        return emitter.op("Sqrt", [emitter.reduce("ReduceSumSquare", value, None, keepdims=False)])
    if norm_type == 1.0:
        return emitter.reduce("ReduceL1", value, None, keepdims=False)
    power = emitter.op("Pow", [emitter.op("Abs", [value]), emitter.scalar_like(norm_type, value)])
    total = emitter.reduce_sum(power, None, keepdims=False)
    return emitter.op("Pow", [total, emitter.scalar_like(1.0 / norm_type, value)])


def clip_grad_norm(
    emitter: GraphEmitter, grads: Sequence[str], max_norm: float, norm_type: float = 2.0
) -> tuple[list[str], str]:
    """torch.nn.utils.clip_grad_norm_: scales all gradients together to a total norm of at most max_norm.

    ``total_norm = ||(||g_1||_p, ..., ||g_k||_p)||_p``; ``clip_coef = max_norm / (total_norm + 1e-6)``
    (computed like torch: ``reciprocal(total_norm + 1e-6) * max_norm``), clamped at 1.0; every
    gradient is multiplied by it, so it is unchanged when the norm is already small enough.

    Args:
        emitter: Receives the nodes.
        grads: The gradient values (the first one's type is the total norm's).
        max_norm: Largest allowed total norm.
        norm_type: The p of the p-norms (2.0 by default, ``math.inf`` for the max norm).

    Returns:
        The clipped gradients (same order) and the total norm before clipping, a 0-D value.
    """
    ClipGradNorm(max_norm, norm_type)  # validates
    if not grads:
        raise ValueError("clip_grad_norm needs at least one gradient")
    first = grads[0]
    norms = []
    for grad in grads:
        norm = _vector_norm(emitter, grad, norm_type)
        if emitter.elem_type(grad) != emitter.elem_type(first) or not emitter.elem_type(first):
            norm = emitter.op("CastLike", [norm, first])
        norms.append(emitter.op("Reshape", [norm, emitter.ints([1])]))
    stacked = norms[0] if len(norms) == 1 else emitter.op("Concat", norms, axis=0)
    total_norm = _vector_norm(emitter, stacked, norm_type)
    shifted = emitter.op("Add", [total_norm, emitter.scalar_like(1e-6, first)])
    coef = emitter.op("Mul", [emitter.op("Reciprocal", [shifted]), emitter.scalar_like(max_norm, first)])
    clamped = emitter.op("Min", [coef, emitter.scalar_like(1.0, first)])
    clipped = []
    for grad in grads:
        factor = (
            clamped if emitter.elem_type(grad) == emitter.elem_type(first) else emitter.op("CastLike", [clamped, grad])
        )
        clipped.append(emitter.op("Mul", [grad, factor]))
        known = emitter.value_type(grad)
        if known is not None:
            emitter.set_type(clipped[-1], known.elem_type, known.shape)
    known_first = emitter.value_type(first)
    if known_first is not None:
        emitter.set_type(total_norm, known_first.elem_type, ())
    return clipped, total_norm


# ---- a whole optimizer step --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptimizerStep:
    """What ``add_optimizer_step`` emitted.

    Attributes:
        params: Parameter name -> its updated value.
        state: Parameter name -> slot -> its updated state value.
        total_norm: The gradients' total norm before clipping (None without clipping).
        optimizers: Parameter name -> the optimizer (group overrides applied) that updates it.
    """

    params: dict[str, str]
    state: dict[str, dict[str, str]]
    total_norm: str | None
    optimizers: dict[str, Optimizer]


def resolve_groups(
    optimizer: Optimizer, params: Sequence[str], param_groups: Sequence[ParamGroup] = ()
) -> dict[str, tuple[Optimizer, float]]:
    """Each parameter's optimizer (its group's overrides applied) and lr scale.

    Parameters in no group use the optimizer as it is, with an lr scale of 1.

    Raises:
        ValueError: A parameter is in two groups, or a group names a parameter not being trained.
    """
    known = set(params)
    resolved: dict[str, tuple[Optimizer, float]] = {}
    for index, group in enumerate(param_groups):
        group_optimizer = optimizer.with_overrides(group)
        for name in group.params:
            if name not in known:
                raise ValueError(f"parameter group {index} names {name!r}, which is not among the parameters trained")
            if name in resolved:
                raise ValueError(f"some parameters appear in more than one parameter group: {name!r}")
            resolved[name] = (group_optimizer, group.lr_scale)
    return {name: resolved.get(name, (optimizer, 1.0)) for name in params}


def add_optimizer_step(
    emitter: GraphEmitter,
    optimizer: Optimizer,
    grads: Mapping[str, str],
    state: Mapping[str, Mapping[str, str]],
    lr: str,
    step: str,
    *,
    param_groups: Sequence[ParamGroup] = (),
    clip: ClipGradNorm | None = None,
) -> OptimizerStep:
    """Emits ``clip_grad_norm_`` (optional) and one ``optimizer.step()`` over all parameters.

    Args:
        emitter: Receives the nodes; must know every parameter's element type.
        optimizer: The optimizer with its default hyperparameters.
        grads: Parameter name -> its gradient value (dict order is the clipping order).
        state: Parameter name -> slot -> current state value (slots of its group's optimizer).
        lr: Learning-rate input (0-D, float64 for exact parity, or float32).
        step: Step-number input (0-D, 1-based, int64).
        param_groups: Groups with their own hyperparameters / lr scales.
        clip: Clip the gradients' total norm first.

    Returns:
        The updated parameters and state, the total norm, and the optimizer of each parameter.
    """
    params = list(grads)
    per_param = resolve_groups(optimizer, params, param_groups)
    grad_values = [grads[name] for name in params]
    total_norm = None
    if clip is not None:
        grad_values, total_norm = clip_grad_norm(emitter, grad_values, clip.max_norm, clip.norm_type)
    prepared: dict[tuple[int, float, int], dict[str, str]] = {}
    optimizer_ids: dict[Optimizer, int] = {}
    new_params: dict[str, str] = {}
    new_state: dict[str, dict[str, str]] = {}
    for name, grad in zip(params, grad_values, strict=False):
        param_optimizer, lr_scale = per_param[name]
        elem_type = _param_elem_type(emitter, name)
        key = (optimizer_ids.setdefault(param_optimizer, len(optimizer_ids)), lr_scale, elem_type)
        if key not in prepared:
            prepared[key] = param_optimizer.prepare(emitter, lr, step, elem_type, lr_scale)
        new_params[name], new_state[name] = param_optimizer.update(
            emitter, name, grad, state.get(name, {}), prepared[key]
        )
    return OptimizerStep(new_params, new_state, total_norm, {name: per_param[name][0] for name in params})
