"""What the optimizers share: ``ParamGroup``, the ``Optimizer`` protocol, the table, one whole step.

An optimizer is a frozen dataclass with torch's hyperparameter names and defaults, registered in
``OPTIMIZERS`` by ``@register_optimizer`` (``optimizer_from_torch``, the Trainer's checkpoints and
the command line read that table). It writes its update once, in standard ops
(``scalars`` + ``standard_update``); one with an ortlstm kernel also says which op and what it is
fed (``kernel`` + ``kernel_inputs``). Which of the two a build emits is decided in one place,
``Optimizer.emission`` (``STANDARD_OPS`` or ``KERNEL_NODE``, from ``implementation``), and
``prepare`` / ``update`` / ``apply`` go through it. ``add_optimizer_step`` is one
``optimizer.step()`` over all parameters: parameter groups resolved, gradients clipped, the
per-update scalars emitted once per group and element type. Protos only: nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import onnx

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.field_types import check_field_types
from ortlstm.graphs.optimizers.arithmetic import DOUBLE, TensorMath, group_lr, node_scalars, param_elem_type
from ortlstm.graphs.optimizers.clip import ClipGradNorm, ClipGradValue, clip_grad_norm, clip_grad_value
from ortlstm.graphs.parameters import ParameterNames
from ortlstm.ops import schema

Update = tuple[str, dict[str, str]]
"""The updated parameter's value name and the updated state (slot -> value name)."""


# ---- parameter groups --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParamGroup:
    """Parameters that share hyperparameters other than the optimizer's (torch's param groups).

    Every hyperparameter left at None takes the optimizer's value. Since the learning rate is a
    graph input, a group scales it instead of replacing it: torch's ``{"params": ..., "lr": x}``
    with a base lr ``b`` is ``ParamGroup(params, lr_scale=x / b)`` fed ``lr = b * schedule``.

    Attributes:
        params: The group's parameters: ONNX or torch names, globs or module prefixes, resolved among
            the trained parameters as ``requires_grad`` and ``frozen`` are (``parameters.ParameterNames``).
        lr_scale: This group's learning rate is ``lr * lr_scale``.
        weight_decay: Override (e.g. 0.0 for biases and norms).
        momentum: Override (SGD, RMSprop).
        dampening: Override (SGD).
        nesterov: Override (SGD).
        betas: Override (Adam, AdamW, NAdam).
        eps: Override (Adam, AdamW, RMSprop, Adagrad, NAdam).
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
            if isinstance(self.betas, (str, numbers.Real)):
                raise TypeError(f"ParamGroup.betas must be two numbers, e.g. (0.9, 0.999), got {self.betas!r}")
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


def as_param_groups(groups: Sequence[ParamGroup | Mapping[str, Any]], label: str) -> tuple[ParamGroup, ...]:
    """``ParamGroup``s from ``ParamGroup``s or torch's dicts (``[{"params": ["lstm.bias"], "weight_decay": 0.0}]``).

    ``label`` names the option in messages (``param_groups``, ``--param-groups``).

    Raises:
        TypeError: Not a list of groups.
        ValueError: A group without params, a key ParamGroup does not have (torch's ``lr``: say
            ``lr_scale``), or a bad value.
    """
    fields = [field.name for field in dataclasses.fields(ParamGroup)]
    example = '[{"params": ["lstm.bias"], "weight_decay": 0.0}]'
    if isinstance(groups, (str, Mapping)) or not all(isinstance(group, (ParamGroup, Mapping)) for group in groups):
        raise TypeError(f"{label}: expected a list of groups, e.g. {example}, got {groups!r}")
    built = []
    for index, group in enumerate(groups):
        if isinstance(group, ParamGroup):
            built.append(group)
            continue
        unknown = sorted(set(group) - set(fields))
        if unknown or "params" not in group:
            hint = " (lr: give lr_scale = the group's lr / the optimizer's lr)" if "lr" in unknown else ""
            raise ValueError(
                f"{label}: group {index} {dict(group)!r}: needs params (a list of parameter names) and "
                f"takes {', '.join(fields[1:])}; {'unknown: ' + ', '.join(unknown) if unknown else 'no params'}{hint}"
            )
        try:
            built.append(ParamGroup(**group))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{label}: group {index} {dict(group)!r}: {error}") from None
    return tuple(built)


# ---- hyperparameter checks ---------------------------------------------------------------------


IMPLEMENTATIONS = ("ortlstm", "onnx")
"""Values of the optimizers' ``implementation``: the fused ortlstm op or standard ONNX ops."""


def check_implementation(implementation: str, fused_multiply_add: bool) -> None:
    """Refuses an ``implementation`` not in ``IMPLEMENTATIONS``, or the kernel without fused multiply-adds."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation: expected one of {', '.join(map(repr, IMPLEMENTATIONS))}, got {implementation!r}"
        )
    if implementation == "ortlstm" and not fused_multiply_add:
        raise ValueError(
            "implementation='ortlstm' always fuses the multiply-adds torch fuses; "
            "for fused_multiply_add=False use implementation='onnx'"
        )


def check_nonnegative(*checks: tuple[float, str]) -> None:
    """Raises torch's ``Invalid <label>: <value>`` for the first value that is negative or NaN (torch's order)."""
    for value, label in checks:
        if not value >= 0.0:
            raise ValueError(f"Invalid {label}: {value}")


def as_betas(betas: Sequence[float]) -> tuple[float, float]:
    """``betas`` as a tuple of two Python floats.

    Raises:
        ValueError: There are not two.
    """
    floats = tuple(float(beta) for beta in betas)
    if len(floats) != 2:
        raise ValueError(f"betas must be two floats, got {floats}")
    return floats


def check_betas(betas: Sequence[float]) -> None:
    """Raises torch's ``Invalid beta parameter at index <i>: <value>`` for a beta outside [0, 1)."""
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta}")


# ---- how an update is emitted ------------------------------------------------------------------


class StandardOps:
    """Emits an update in standard ONNX ops: ``scalars`` in float64, then ``standard_update``."""

    def prepare(
        self, optimizer: Optimizer, emitter: GraphEmitter, lr: str, step: str, elem_type: int, lr_scale: float
    ) -> dict[str, str]:
        """The optimizer's scalars from the group's learning rate (0-D float64)."""
        return optimizer.scalars(emitter, group_lr(emitter, lr, lr_scale), step, elem_type)

    def update(
        self,
        optimizer: Optimizer,
        emitter: GraphEmitter,
        param: str,
        grad: str,
        state: Mapping[str, str],
        scalars: Mapping[str, str],
    ) -> Update:
        """``standard_update`` with torch's arithmetic for the parameter's element type."""
        math_ = TensorMath(emitter, param_elem_type(emitter, param), optimizer.fused_multiply_add)
        return optimizer.standard_update(math_, param, grad, state, scalars)


class KernelNode:
    """Emits an update as one node of the optimizer's ortlstm op (``Optimizer.kernel``).

    The node computes the scalars itself from the group's lr and the step, both fed as float64.
    """

    def prepare(
        self, optimizer: Optimizer, emitter: GraphEmitter, lr: str, step: str, elem_type: int, lr_scale: float
    ) -> dict[str, str]:
        """The group's lr and the step, as float64."""
        return node_scalars(emitter, lr, step, lr_scale)

    def update(
        self,
        optimizer: Optimizer,
        emitter: GraphEmitter,
        param: str,
        grad: str,
        state: Mapping[str, str],
        scalars: Mapping[str, str],
    ) -> Update:
        """One node; outputs the parameter, then the state slots in ``state_slots()`` order (the op's)."""
        op = optimizer.kernel
        assert op is not None, f"{type(optimizer).__name__} has no ortlstm kernel"
        elem_type = param_elem_type(emitter, param)
        inputs, flags = optimizer.kernel_inputs(emitter, param, grad, state, scalars)
        if elem_type not in (onnx.TensorProto.FLOAT, DOUBLE):
            raise ValueError(
                f"parameter {param!r} is {onnx.TensorProto.DataType.Name(elem_type)}; {op.name} takes FLOAT or "
                "DOUBLE parameters: use implementation='onnx' for others"
            )
        ordered = [inputs.get(name, "") for name in schema.input_names(op)]
        while not ordered[-1]:
            ordered.pop()
        slots = optimizer.state_slots()
        outputs = [emitter.fresh(f"{param}.new"), *(emitter.fresh(f"{param}.{slot}.new") for slot in slots)]
        attributes: dict[str, Any] = {name: int(value) for name, value in flags.items()}
        emitter.op_multi(op.name, ordered, outputs=outputs, domain=op.domain, **attributes)
        return outputs[0], dict(zip(slots, outputs[1:], strict=True))


STANDARD_OPS = StandardOps()
KERNEL_NODE = KernelNode()


# ---- the protocol ------------------------------------------------------------------------------


class Optimizer:
    """What the optimizers share: state slots, group overrides, the two-phase update.

    ``prepare`` emits the per-update scalars (once per group and dtype), ``update`` the tensor
    arithmetic of one parameter; ``apply`` does both for a single parameter. A subclass (a frozen
    dataclass of torch's hyperparameters, with ``fused_multiply_add``) writes ``state_slots``,
    ``scalars`` and ``standard_update``; one with an ortlstm op also ``kernel``, ``kernel_inputs``
    and an ``implementation`` field.
    """

    torch_name: ClassVar[str] = ""
    kernel: ClassVar[schema.OpSpec | None] = None
    # Every subclass is a dataclass; declared so that type checkers accept dataclasses.fields(optimizer).
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every optimizer's own checks run after the types are known good (check_field_types).
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None:

            def __post_init__(self: Any) -> None:
                check_field_types(self, type(self).__name__)
                own(self)

            cls.__post_init__ = __post_init__  # type: ignore[attr-defined]

    """The ortlstm op that does the whole update in one node, or None."""
    lr: float
    fused_multiply_add: bool

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
        names = {field.name for field in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(
                f"a parameter group of {type(self).__name__} sets {', '.join(unknown)}, which "
                f"{type(self).__name__} does not have (its hyperparameters: {', '.join(sorted(names - {'lr'}))})"
            )
        return dataclasses.replace(self, **overrides)

    @property
    def emission(self) -> StandardOps | KernelNode:
        """How this optimizer's updates are emitted: the one place that chooses the kernel or standard ops."""
        return KERNEL_NODE if getattr(self, "implementation", "onnx") == "ortlstm" else STANDARD_OPS

    def scalars(self, emitter: GraphEmitter, lr: str, step: str, elem_type: int) -> dict[str, str]:
        """Emits the standard-ops update's scalars, in float64 and rounded where torch rounds them.

        Args:
            emitter: Receives the nodes.
            lr: The group's learning rate, 0-D float64.
            step: The 1-based step-number input (0-D or one element, int64 recommended).
            elem_type: ONNX element type of the parameters the scalars serve.
        """
        raise NotImplementedError

    def standard_update(
        self, math: TensorMath, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> Update:
        """Emits one parameter's update in standard ops (``math`` for the parameter's type)."""
        raise NotImplementedError

    def kernel_inputs(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, bool]]:
        """The ``kernel`` node's inputs by port name (absent ones left out) and its flag attributes."""
        raise NotImplementedError(f"{type(self).__name__} has no ortlstm kernel")

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
        return self.emission.prepare(self, emitter, lr, step, elem_type, lr_scale)

    def update(
        self, emitter: GraphEmitter, param: str, grad: str, state: Mapping[str, str], scalars: Mapping[str, str]
    ) -> Update:
        """Emits one parameter's update; returns the updated parameter and state (slot -> value)."""
        self._check_state(param, state)
        new_param, new_state = self.emission.update(self, emitter, param, grad, state, scalars)
        known = emitter.value_type(param)
        if known is not None:
            for value in (new_param, *new_state.values()):
                emitter.set_type(value, known.elem_type, known.shape)
        return new_param, new_state

    def apply(
        self,
        emitter: GraphEmitter,
        param: str,
        grad: str,
        state: Mapping[str, str],
        lr: str,
        step: str,
        lr_scale: float = 1.0,
    ) -> Update:
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
        scalars = self.prepare(emitter, lr, step, param_elem_type(emitter, param), lr_scale)
        return self.update(emitter, param, grad, state, scalars)

    def _check_state(self, param: str, state: Mapping[str, str]) -> None:
        missing = [slot for slot in self.state_slots() if slot not in state]
        if missing:
            raise ValueError(
                f"{type(self).__name__} needs state {', '.join(missing)} for parameter {param!r}; "
                f"got {sorted(state) or 'none'} (state_slots(): {self.state_slots()})"
            )


# ---- the table ---------------------------------------------------------------------------------


OPTIMIZERS: dict[str, type[Optimizer]] = {}
"""torch.optim class name -> the optimizer here, in registration order (the command line lists it)."""

OptimizerType = TypeVar("OptimizerType", bound=type[Optimizer])


def register_optimizer(cls: OptimizerType) -> OptimizerType:
    """Class decorator: adds an optimizer to ``OPTIMIZERS`` under its ``torch_name``.

    Raises:
        ValueError: It has no ``torch_name``, or another optimizer has that name.
    """
    name = cls.torch_name
    if not name:
        raise ValueError(f"{cls.__name__} needs a torch_name (torch.optim's class name) to be registered")
    if name in OPTIMIZERS and OPTIMIZERS[name] is not cls:
        raise ValueError(f"an optimizer named {name!r} is already registered ({OPTIMIZERS[name].__qualname__})")
    OPTIMIZERS[name] = cls
    return cls


def optimizer_from_torch(name: str, **kwargs: Any) -> Optimizer:
    """The optimizer torch.optim's ``name(params, **kwargs)`` describes (``foreach``/``fused`` ignored).

    Raises:
        ValueError: The name is not one of ``OPTIMIZERS``, or a keyword is not one of its hyperparameters.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer {name!r} is not supported; choose one of {', '.join(OPTIMIZERS)}")
    cls = OPTIMIZERS[name]
    kwargs = {key: value for key, value in kwargs.items() if key not in ("foreach", "fused", "differentiable")}
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise ValueError(f"{name} has no hyperparameter {', '.join(unknown)} here (it has {', '.join(sorted(names))})")
    if isinstance(kwargs.get("betas"), list):  # JSON's; anything else is the optimizer's to refuse
        kwargs["betas"] = tuple(kwargs["betas"])
    return cls(**kwargs)


# ---- a whole optimizer step --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptimizerStep:
    """What ``add_optimizer_step`` emitted.

    Attributes:
        params: Parameter name -> its updated value.
        state: Parameter name -> slot -> its updated state value.
        total_norm: The gradients' total norm before clipping (None without norm clipping).
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

    A group's ``params`` are resolved among ``params`` as every option naming parameters is
    (``parameters.ParameterNames``: names, globs, module prefixes; ``build_training_models`` has
    resolved torch names already). Parameters in no group use the optimizer as it is, with an lr scale of 1.

    Raises:
        ValueError: A parameter is in two groups, or a group names a parameter not being trained.
    """
    trained = ParameterNames.of(params, {}, noun="trained parameter")
    resolved: dict[str, tuple[Optimizer, float]] = {}
    for group in trained.resolve_groups(param_groups):
        group_optimizer = optimizer.with_overrides(group)
        resolved.update(dict.fromkeys(group.params, (group_optimizer, group.lr_scale)))
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
    clip: ClipGradNorm | ClipGradValue | None = None,
) -> OptimizerStep:
    """Emits ``clip_grad_norm_`` or ``clip_grad_value_`` (optional) and one ``optimizer.step()`` over all parameters.

    Args:
        emitter: Receives the nodes; must know every parameter's element type.
        optimizer: The optimizer with its default hyperparameters.
        grads: Parameter name -> its gradient value (dict order is the clipping order).
        state: Parameter name -> slot -> current state value (slots of its group's optimizer).
        lr: Learning-rate input (0-D, float64 for exact parity, or float32).
        step: Step-number input (0-D, 1-based, int64).
        param_groups: Groups with their own hyperparameters / lr scales.
        clip: Clip the gradients' total norm (``ClipGradNorm``) or every element (``ClipGradValue``) first.

    Returns:
        The updated parameters and state, the total norm, and the optimizer of each parameter.
    """
    params = list(grads)
    per_param = resolve_groups(optimizer, params, param_groups)
    grad_values = [grads[name] for name in params]
    total_norm = None
    if isinstance(clip, ClipGradValue):
        grad_values = clip_grad_value(emitter, grad_values, clip.clip_value)
    elif clip is not None:
        grad_values, total_norm = clip_grad_norm(emitter, grad_values, clip.max_norm, clip.norm_type)
    prepared: dict[tuple[int, float, int], dict[str, str]] = {}
    optimizer_ids: dict[Optimizer, int] = {}
    new_params: dict[str, str] = {}
    new_state: dict[str, dict[str, str]] = {}
    for name, grad in zip(params, grad_values, strict=False):
        param_optimizer, lr_scale = per_param[name]
        elem_type = param_elem_type(emitter, name)
        key = (optimizer_ids.setdefault(param_optimizer, len(optimizer_ids)), lr_scale, elem_type)
        if key not in prepared:
            prepared[key] = param_optimizer.prepare(emitter, lr, step, elem_type, lr_scale)
        new_params[name], new_state[name] = param_optimizer.update(
            emitter, name, grad, state.get(name, {}), prepared[key]
        )
    return OptimizerStep(new_params, new_state, total_norm, {name: per_param[name][0] for name in params})
