"""The loss table: ``Loss`` (which loss, with torch's arguments), ``register_loss`` and the dispatch.

Each loss is one function in a family module of this package (``classification``, ``regression``,
``divergence``, ``binary``, ``output``), written as torch.nn.functional writes it:
``name(emitter, input, target, <torch's keyword arguments with torch's defaults>) -> loss value``,
and registered here by ``@register_loss``. ``LOSSES`` is the only list of losses: ``Loss``
validates against it, ``add_loss`` / ``check_target`` / ``check_target_values`` /
``gradient_seed`` dispatch through it, and the train-step builder, the Trainer and the command
line read it. Adding a loss is one registered function (and its test rows); an argument no loss
took before is also one ``Loss`` field. Protos only: nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper

from ortlstm.graphs.emit.emitter import FLOAT_TYPES, GraphEmitter, ValueType
from ortlstm.graphs.field_types import check_field_types
from ortlstm.graphs.losses.facts import check_facts
from ortlstm.graphs.losses.shapes import broadcast_problem, described, shape_text, type_name
from ortlstm.graphs.losses.shapes import shape_conflict as shape_conflict  # the families import it from here

REDUCTIONS = ("mean", "sum", "none")
KL_DIV_REDUCTIONS = (*REDUCTIONS, "batchmean")
"""kl_div also takes torch's "batchmean": the sum divided by the input's first dim."""
INDEX_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})
"""Element types accepted for class indices (int32 is cast to int64, torch's type)."""
BROADCASTS = ("exact", "warn", "silent", "into")
"""How a loss takes a target of another shape than the prediction, as torch does (``LossDef.broadcast``):
``exact`` refuses it (binary_cross_entropy and its logits form raise); ``warn`` broadcasts with torch's
UserWarning (mse_loss, l1_loss, smooth_l1_loss, huber_loss); ``silent`` broadcasts without one
(kl_div); ``into`` broadcasts without one where the broadcast shape is the prediction's
(soft_margin_loss writes into a tensor of the input's shape)."""
LossFunction = Callable[..., str]
"""``loss(emitter, input, target, **torch_keyword_arguments) -> the loss value's name``."""
TargetCheck = Callable[["Loss", "ValueType | None", "ValueType | None", str, str], None]
"""``check(spec, prediction_type, target_type, prediction_name, target_name)``; raises ValueError."""
ValuesCheck = Callable[["Loss", "ValueType | None", np.ndarray, str], None]
"""``check(spec, prediction_type, target_values, target_name)``; raises ValueError."""
GradientFunction = Callable[[GraphEmitter, "Loss", str, str], str]
"""``gradient(emitter, spec, prediction, target) -> torch's gradient of the prediction``."""
ExtraTargetsCheck = Callable[
    ["Loss", "ValueType | None", "ValueType | None", "Mapping[str, ValueType | None]"], None
]
"""``check(spec, prediction_type, target_type, {extra target: its type or None})``; raises ValueError."""
DeclaredTarget = Callable[["ValueType | None", str], "tuple[int, list[str] | None]"]
"""``declare(prediction_type, target_name) -> (elem_type, symbolic shape or None)`` of the target input."""


@dataclasses.dataclass(frozen=True)
class ExtraTarget:
    """A target input a loss reads besides ``target`` (ctc_loss's ``input_lengths``, ``target_lengths``).

    Attributes:
        name: torch's argument name; also the train step's input name (unless the model has a
            value of that name) and the Trainer's keyword.
        doc: What it holds, for messages.
        required: False when the loss derives it when not given (an empty ``[0]`` feed in a
            train step).
    """

    name: str
    doc: str
    required: bool = True


@dataclasses.dataclass(frozen=True)
class LossDef:
    """One row of the loss table.

    Attributes:
        name: torch.nn.functional's name, the ``kind`` of a ``Loss``.
        function: The public function: torch's arguments, checked as ``Loss`` and
            ``check_target`` check them, then ``body``.
        body: The loss's graph as written in its family module; arguments already checked.
        signature: Its torch keyword arguments (after ``emitter, input, target``) with torch's defaults.
        reductions: The values ``reduction`` takes.
        class_target: The target holds class indices: int64, the prediction's shape without its
            class axis (axis 1; a ``[C]`` prediction takes a 0-D target).
        needs_target: False for a model output used as the loss.
        check_target: Refuses a prediction/target type pair (after the prediction is known to be float).
        check_values: Refuses target values torch refuses, or None.
        validate: Refuses argument values torch refuses, beyond ``reductions``, or None.
        gradient: torch's gradient of the prediction where its backward is not the derivative of
            the loss graph (binary_cross_entropy), or None: the loss value is differentiated.
        extra_targets: Target inputs read besides ``target``, in the function's argument order
            (after ``target``); () for most losses.
        check_extra_targets: Refuses types/shapes of the extra targets, or None.
        declared_target: The target input's declared type, when it is not what ``class_target``
            says (class indices or the prediction's type), or None.
        broadcast: How a target of another shape than the prediction is taken (``BROADCASTS``),
            for the losses whose target is shaped like the prediction.
        metric: What ``fit`` reports beside the loss (``METRICS``), or None: the loss alone.
        mean: What its ``'mean'`` divides by (``MEANS``); kl_div's ``'batchmean'`` divides by the batch.
        lengths: The extra target holding each sample's label count, when the target may come padded
            ``[N, S]`` or concatenated ``[sum(lengths)]`` (ctc_loss's ``target_lengths``), else None.
    """

    name: str
    function: LossFunction
    body: LossFunction
    signature: inspect.Signature
    reductions: tuple[str, ...]
    class_target: bool
    needs_target: bool
    check_target: TargetCheck
    check_values: ValuesCheck | None
    validate: Callable[[Loss], None] | None
    gradient: GradientFunction | None
    extra_targets: tuple[ExtraTarget, ...] = ()
    check_extra_targets: ExtraTargetsCheck | None = None
    declared_target: DeclaredTarget | None = None
    broadcast: str = "exact"
    metric: str | None = None
    mean: str = "elements"
    lengths: str | None = None

    @property
    def options(self) -> tuple[str, ...]:
        """The ``Loss`` fields the function takes, in torch's order."""
        return tuple(self.signature.parameters)


LOSSES: dict[str, LossDef] = {}
"""kind -> LossDef, in registration order; the family modules fill it when the package is imported."""


def _choices(values: Sequence[str]) -> str:
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def _as_array(value: object, name: str) -> np.ndarray | None:
    if value is None:
        return None
    array = np.array(value, dtype=np.float64)
    array.setflags(write=False)
    if array.ndim == 0:
        raise ValueError(f"{name} must be a tensor (a sequence of floats), got the scalar {value!r}")
    return array


class _LossConstructors(type):
    """``Loss.<kind>(...)``: a constructor per registered loss, with that loss's torch arguments."""

    def __getattr__(cls, name: str) -> Callable[..., Loss]:
        entry = LOSSES.get(name)
        if entry is None:
            raise AttributeError(f"type object 'Loss' has no attribute {name!r}")
        return _constructor(entry)

    def __dir__(cls) -> list[str]:
        return sorted({*super().__dir__(), *LOSSES})


@functools.cache
def _constructor(entry: LossDef) -> Callable[..., Loss]:
    """``Loss.<kind>``: the loss function's torch arguments and defaults, returning a ``Loss``."""

    def construct(*args: object, **kwargs: object) -> Loss:
        return _construct(entry, *args, **kwargs)

    construct.__name__ = construct.__qualname__ = entry.name
    construct.__doc__ = f"torch.nn.functional.{entry.name}'s arguments -> a Loss; see losses.{entry.name}."
    construct.__signature__ = entry.signature.replace(return_annotation="Loss")  # type: ignore[attr-defined]
    return construct


def _construct(entry: LossDef, *args: object, **kwargs: object) -> Loss:
    bound = entry.signature.bind(*args, **kwargs)
    return Loss(entry.name, **bound.arguments)


@dataclasses.dataclass(frozen=True, eq=False)
class Loss(metaclass=_LossConstructors):
    """What loss to append to the model: the kind and torch's keyword arguments.

    ``Loss.<kind>(...)`` builds one with that loss function's own arguments and defaults, e.g.
    ``Loss.cross_entropy(label_smoothing=0.1)``, ``Loss.mse_loss()``, ``Loss.output()``;
    ``Loss("mse_loss")`` and ``Loss(kind="output")`` work too. Every field is saved with a
    checkpoint (``TrainingSpec.to_json``), so a field is only ever added, with torch's default.

    Attributes:
        kind: A key of ``LOSSES``: a torch.nn.functional name, or ``"output"`` for a model output
            used as the loss as it is.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (torch's default: mean); kl_div also
            ``"batchmean"``.
        ignore_index: Class index whose targets are skipped (cross_entropy, nll_loss).
        label_smoothing: cross_entropy's smoothing in [0, 1].
        weight: Class weights ``[C]`` (cross_entropy, nll_loss), or per-element weights
            broadcast to the input (binary_cross_entropy, binary_cross_entropy_with_logits).
        pos_weight: Weights of positive examples, broadcast to the input's trailing axes
            (binary_cross_entropy_with_logits).
        beta: Where smooth_l1_loss turns from quadratic to linear (>= 0; 0 is l1_loss).
        delta: Where huber_loss turns from quadratic to linear (> 0).
        log_target: kl_div's target holds log-probabilities instead of probabilities.
        blank: ctc_loss's blank label.
        zero_infinity: ctc_loss: an infinite loss (no alignment fits) and its gradient become 0.
        input: What the prediction holds (ctc_loss): ``"log_probs"`` as torch takes them,
            ``"probs"`` (a Log is inserted) or ``"logits"`` (a LogSoftmax over the classes).
        batch_first: ctc_loss: the prediction is batch-major ``(N, T, C)`` (a Transpose is
            inserted), not torch's time-major ``(T, N, C)``.
        class_probabilities: cross_entropy: the target holds class probabilities (a float of
            the prediction's type and shape) rather than class indices. torch decides by the
            target's dtype at each call; a train step declares its target input's type once,
            when it is built, so the Trainer, ``fit`` and ``train-step`` need it said (the loss
            function alone still decides by the target value's type, as torch does).
    """

    kind: str
    reduction: str = "mean"
    ignore_index: int = -100
    label_smoothing: float = 0.0
    weight: np.ndarray | None = None
    pos_weight: np.ndarray | None = None
    beta: float = 1.0
    delta: float = 1.0
    log_target: bool = False
    blank: int = 0
    zero_infinity: bool = False
    input: str = "log_probs"
    batch_first: bool = False
    class_probabilities: bool = False

    def __post_init__(self) -> None:
        entry = LOSSES.get(self.kind)
        if entry is None:
            raise ValueError(f"unknown loss kind {self.kind!r}; choose one of {', '.join(LOSSES)}")
        check_field_types(self, self.kind)
        if self.reduction not in entry.reductions:
            raise ValueError(
                f"{self.reduction} is not a valid value for reduction (choose {_choices(entry.reductions)})"
            )
        for field in dataclasses.fields(self):
            if field.name in ("kind", "reduction") or field.name in entry.options:
                continue
            value = getattr(self, field.name)
            if value is None if field.default is None else value == field.default:
                continue
            takers = [name for name, other in LOSSES.items() if field.name in other.options]
            if len(takers) == 1:
                raise ValueError(f"{field.name} applies to {takers[0]} only, not {self.kind}")
            raise ValueError(f"{self.kind} takes no {field.name}")
        for name in ("weight", "pos_weight"):
            object.__setattr__(self, name, _as_array(getattr(self, name), name))
        if entry.validate is not None:
            entry.validate(self)

    @property
    def needs_target(self) -> bool:
        """Whether the loss reads a target (every kind but ``output``)."""
        return LOSSES[self.kind].needs_target

    @property
    def class_target(self) -> bool:
        """Whether the target holds class indices (int64, the prediction without its class axis)."""
        return LOSSES[self.kind].class_target and not self.class_probabilities

    @property
    def options(self) -> dict[str, Any]:
        """The loss function's keyword arguments: this spec's values of its torch arguments."""
        return {name: getattr(self, name) for name in LOSSES[self.kind].options}

    @property
    def extra_targets(self) -> tuple[ExtraTarget, ...]:
        """Target inputs besides ``target`` (ctc_loss: input_lengths, target_lengths); () for most."""
        return LOSSES[self.kind].extra_targets

    @property
    def metric(self) -> str | None:
        """What ``fit`` reports beside the loss (``METRICS``), or None; accuracy reads class indices only."""
        metric = LOSSES[self.kind].metric
        return None if metric == "accuracy" and not self.class_target else metric

    @property
    def mean_denominator(self) -> str | None:
        """What this reduction divides by (``MEANS``); None for ``'sum'`` and ``'none'``, which divide by nothing."""
        if self.reduction in ("sum", "none"):
            return None
        mean = "batch" if self.reduction == "batchmean" else LOSSES[self.kind].mean
        return "elements" if mean == "class_weights" and not self.class_target else mean

    @property
    def lengths(self) -> str | None:
        """The extra target of each sample's label count (ctc_loss: target_lengths), or None (``LossDef.lengths``)."""
        return LOSSES[self.kind].lengths


_FIELD_DEFAULTS = {field.name: field.default for field in dataclasses.fields(Loss) if field.name != "kind"}


# ---- target checks shared by the families ------------------------------------------------------


def check_like_prediction(
    spec: Loss, prediction: ValueType | None, target: ValueType | None, prediction_name: str, target_name: str
) -> None:
    """The element-wise losses' target: a float of the prediction's type, its shape or one torch broadcasts to it.

    Which other shapes are taken is the loss's ``broadcast`` (see ``BROADCASTS``); unknown dims pass.
    """
    del prediction_name
    if target is None:
        return
    pred_elem = prediction.elem_type if prediction is not None else 0
    pred_shape = prediction.shape if prediction is not None else None
    if target.elem_type and (target.elem_type not in FLOAT_TYPES or (pred_elem and target.elem_type != pred_elem)):
        raise ValueError(
            f"loss target {target_name!r}: {spec.kind} expects "
            f"{type_name(pred_elem) if pred_elem else 'a float type'} {shape_text(pred_shape)} "
            f"(the prediction's type and shape), {described(target)}"
        )
    if pred_shape is None or target.shape is None:
        return
    problem = broadcast_problem(LOSSES[spec.kind].broadcast, pred_shape, target.shape)
    if problem is not None:
        raise ValueError(
            f"loss target {target_name!r}: {spec.kind} expects the prediction's shape {shape_text(pred_shape)}, "
            f"{described(target)}: {problem}"
        )


def target_size_warning(spec: Loss, prediction: ValueType | None, target: ValueType | None) -> str | None:
    """The UserWarning torch gives for a target of another size than the prediction (``"warn"`` losses), or None.

    Given only when both shapes are static and differ, in torch's words: such a target
    broadcasts, which is rarely what was meant (a ``[N]`` target for a ``[N, 1]`` prediction
    gives an ``[N, N]`` loss).
    """
    if LOSSES[spec.kind].broadcast != "warn" or prediction is None or target is None:
        return None
    expected, actual = prediction.static_shape, target.static_shape
    if expected is None or actual is None or expected == actual:
        return None
    return (
        f"Using a target size (torch.Size({list(actual)})) that is different to the input size "
        f"(torch.Size({list(expected)})). This will likely lead to incorrect results due to broadcasting. "
        "Please ensure they have the same size."
    )


@dataclasses.dataclass(frozen=True)
class TargetFacts:
    """What a loss's target may be for a prediction: the one source the train step, the Trainer and fit read.

    The train step declares its target input from it (the first element type and the rank), the
    Trainer checks each batch's target against it before running, and ``fit`` its label array
    before training, so that the three agree.

    Attributes:
        what: What the target holds, for messages.
        elem_types: The accepted element types; the first is the one the train step declares.
        shape: The expected shape: the prediction's, less its class axis for class indices; None
            for any rank (ctc_loss's padded or concatenated labels).
        broadcast: How a target of another shape is taken (``BROADCASTS``).
        other: How to build the loss for the other kind of target it could hold, or "".
        lengths: The extra target of each sample's label count when the target may come padded
            ``[N, S]`` or concatenated ``[sum(lengths)]`` (``LossDef.lengths``), else None.
    """

    what: str
    elem_types: tuple[int, ...]
    shape: tuple[int | str | None, ...] | None
    broadcast: str
    other: str = ""
    lengths: str | None = None

    def expected(self) -> str:
        """``int64 or int32 [32]`` for messages."""
        return f"{' or '.join(type_name(elem) for elem in self.elem_types)} {shape_text(self.shape)}"


def unbatched_hint(spec: Loss, pred_shape: Sequence[int | str | None] | None) -> str:
    """For a class loss on a 1-D prediction (a regressor's by mistake): why torch's target is 0-D, else ""."""
    if pred_shape is None or len(pred_shape) != 1:
        return ""
    return (
        f"the prediction {shape_text(pred_shape)} has one axis, which torch's {spec.kind} reads as the classes of "
        "one unbatched sample: a classifier's output is [batch, classes], and a regressor's [batch] output needs a "
        "regression loss (mse_loss, l1_loss, ...)"
    )


def target_facts(spec: Loss, prediction: ValueType | None) -> TargetFacts | None:
    """What the target of ``spec`` may be for ``prediction`` (None: the loss reads no target)."""
    entry = LOSSES[spec.kind]
    if not entry.needs_target:
        return None
    pred_elem = prediction.elem_type if prediction is not None else 0
    pred_shape = prediction.shape if prediction is not None else None
    indices = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    if entry.declared_target is not None:
        elem, declared = entry.declared_target(prediction, "")
        elems = indices if elem in INDEX_TYPES else (elem,)
        labels = None if declared is None else tuple(declared)
        return TargetFacts("labels", elems, labels, "exact", lengths=entry.lengths)
    probabilities = "class_probabilities" in entry.options
    if spec.class_target:
        shape = None if pred_shape is None else (pred_shape[:1] + pred_shape[2:] if len(pred_shape) > 1 else ())
        other = f"class probabilities need Loss.{spec.kind}(class_probabilities=True)" if probabilities else ""
        other = "; ".join(filter(None, [unbatched_hint(spec, pred_shape), other]))
        return TargetFacts("class indices", indices, shape, "exact", other)
    floats = (pred_elem,) if pred_elem else (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
    if entry.class_target:
        other = f"class indices need Loss.{spec.kind}() (class_probabilities=False)"
        return TargetFacts("class probabilities", floats, pred_shape, "exact", other)
    return TargetFacts("target", floats, pred_shape, entry.broadcast)


def check_target_type(spec: Loss, prediction: ValueType | None, target: ValueType, *, target_name: str) -> None:
    """Refuses a target whose element type is not one a train step of ``spec`` takes (``target_facts``).

    Stricter than ``check_target``, which takes what the loss function takes (cross_entropy's
    class indices or probabilities, decided by the target's type as torch decides): a train step
    declared its target input's type when it was built.

    Raises:
        ValueError: Naming the target, the expected and actual type and shape, and how to build
            the loss for the target given, where it takes that kind.
    """
    facts = target_facts(spec, prediction)
    if facts is None or not target.elem_type or target.elem_type in facts.elem_types:
        return
    other = f"; {facts.other}" if facts.other else ""
    raise ValueError(
        f"loss target {target_name!r}: {spec.kind} expects {facts.what} {facts.expected()}, {described(target)}{other}"
    )


# ---- registration ------------------------------------------------------------------------------


def register_loss(
    *,
    name: str | None = None,
    reductions: tuple[str, ...] = REDUCTIONS,
    class_target: bool = False,
    needs_target: bool = True,
    check_target: TargetCheck = check_like_prediction,
    check_values: ValuesCheck | None = None,
    validate: Callable[[Loss], None] | None = None,
    gradient: GradientFunction | None = None,
    extra_targets: tuple[ExtraTarget, ...] = (),
    check_extra_targets: ExtraTargetsCheck | None = None,
    declared_target: DeclaredTarget | None = None,
    broadcast: str = "exact",
    metric: str | None = None,
    mean: str = "elements",
    lengths: str | None = None,
) -> Callable[[LossFunction], LossFunction]:
    """Adds the decorated loss function to ``LOSSES`` (see ``LossDef`` for the arguments).

    The function's arguments after ``(emitter, input, target)`` and its ``extra_targets`` (value
    names, None for an absent optional one) are its torch keyword arguments: each must be a
    ``Loss`` field, with the field's default (torch's). The decorator returns the public
    function: it validates its arguments as ``Loss`` does, checks the target's type and shape,
    then emits (``add_loss``).

    Raises:
        TypeError: An argument that is no ``Loss`` field, or a default that is not the field's.
        ValueError: A name registered twice, an unknown ``broadcast``, ``metric`` or ``mean``, or
            facts that disagree (accuracy without class indices, lengths no extra target holds).
    """

    def register(function: LossFunction) -> LossFunction:
        kind = name or function.__name__
        if kind in LOSSES:
            raise ValueError(f"loss {kind!r} is registered twice")
        if broadcast not in BROADCASTS:
            raise ValueError(f"{kind}: broadcast must be one of {BROADCASTS}, got {broadcast!r}")
        check_facts(kind, class_target, [extra.name for extra in extra_targets], metric, mean, lengths)
        every = list(inspect.signature(function).parameters.values())
        extra_names = tuple(extra.name for extra in extra_targets)
        if tuple(parameter.name for parameter in every[3 : 3 + len(extra_names)]) != extra_names:
            raise TypeError(f"{kind}: the arguments after (emitter, input, target) must be {list(extra_names)}")
        parameters = every[3 + len(extra_names) :]
        for parameter in parameters:
            if parameter.name not in _FIELD_DEFAULTS:
                raise TypeError(f"{kind}: argument {parameter.name!r} is no Loss field; add the field first")
            if parameter.default != _FIELD_DEFAULTS[parameter.name]:
                default = _FIELD_DEFAULTS[parameter.name]
                raise TypeError(f"{kind}: {parameter.name} defaults to {parameter.default!r}, Loss to {default!r}")

        @functools.wraps(function)
        def checked(emitter: GraphEmitter, input: str, target: str, /, *args: object, **kwargs: object) -> str:
            given = dict(zip(extra_names, args, strict=False))
            for extra in extra_names:
                if extra in kwargs:
                    given[extra] = kwargs.pop(extra)
            spec = _construct(LOSSES[kind], *args[len(extra_names) :], **kwargs)
            return add_loss(emitter, spec, input, target, given)  # type: ignore[arg-type]

        LOSSES[kind] = LossDef(
            kind,
            checked,
            function,
            inspect.Signature(parameters),
            reductions,
            class_target,
            needs_target,
            check_target,
            check_values,
            validate,
            gradient,
            extra_targets,
            check_extra_targets,
            declared_target,
            broadcast,
            metric,
            mean,
            lengths,
        )
        return checked

    return register


# ---- dispatch ----------------------------------------------------------------------------------


def check_target(
    spec: Loss,
    prediction_type: ValueType | None,
    target_type: ValueType | None,
    *,
    prediction_name: str = "prediction",
    target_name: str = "target",
    extra_types: Mapping[str, ValueType | None] | None = None,
) -> None:
    """Refuses a prediction/target pair the loss cannot take; unknown types and dims pass.

    ``extra_types`` gives the types of the loss's extra targets (``Loss.extra_targets``, by name;
    None or absent: unknown), checked by the loss when given.

    The prediction is a float tensor; the target is what the loss's ``check_target`` takes:
    class indices (int64 or int32, the prediction without its class axis) for cross_entropy and
    nll_loss, also class probabilities for cross_entropy; no target for ``output``, whose value
    holds one element; otherwise a float of the prediction's type and shape.

    Raises:
        ValueError: Naming the target (or prediction), the expected and the actual type/shape.
    """
    if prediction_type is not None and prediction_type.elem_type and prediction_type.elem_type not in FLOAT_TYPES:
        raise ValueError(
            f"loss {spec.kind}: the prediction {prediction_name!r} must be a float tensor, "
            f"got {type_name(prediction_type.elem_type)}"
        )
    entry = LOSSES[spec.kind]
    entry.check_target(spec, prediction_type, target_type, prediction_name, target_name)
    if extra_types is not None and entry.check_extra_targets is not None:
        entry.check_extra_targets(spec, prediction_type, target_type, extra_types)


def check_target_values(
    spec: Loss, prediction_type: ValueType | None, target: np.ndarray, *, target_name: str = "target"
) -> None:
    """Refuses target values torch refuses, before a graph would take them silently.

    cross_entropy / nll_loss: class indices in [0, C) or ``ignore_index``; binary_cross_entropy:
    targets in [0, 1] (each loss's ``check_values``).

    Raises:
        ValueError: Naming the target, the first offending value and the allowed range (torch's
            message too).
    """
    check = LOSSES[spec.kind].check_values
    if target.size and check is not None:
        check(spec, prediction_type, target, target_name)


def add_loss(
    emitter: GraphEmitter,
    spec: Loss,
    prediction: str,
    target: str | None = None,
    extra_targets: Mapping[str, str | None] | None = None,
) -> str:
    """Emits the loss ``spec`` describes; returns its value's name (0-D for mean and sum).

    Args:
        emitter: Receives the nodes; its ``types`` should know the prediction and target.
        spec: The loss.
        prediction: The model output the loss reads (logits, log-probabilities, values).
        target: The labels' value (a graph input); None for ``Loss.output()``.
        extra_targets: The values of the loss's other targets (``spec.extra_targets``) by name
            (ctc_loss: ``target_lengths``, and ``input_lengths`` or None to derive it).

    Raises:
        ValueError: The target or a required extra target is missing, an unknown extra target
            is given, or a type or shape does not fit (``check_target``).
    """
    entry = LOSSES[spec.kind]
    if entry.needs_target and target is None:
        raise ValueError(f"loss {spec.kind} needs a target, none was given")
    if not entry.needs_target and target is not None:
        raise ValueError(f"loss {spec.kind!r} reads no target, but target {target!r} was given")
    given = dict(extra_targets or {})
    names = [extra.name for extra in entry.extra_targets]
    unknown = [name for name in given if name not in names]
    if unknown:
        takes = f"takes only {names}" if names else "takes no other target"
        raise ValueError(f"loss {spec.kind} {takes} besides the target; got {unknown}")
    missing = [extra.name for extra in entry.extra_targets if extra.required and not given.get(extra.name)]
    if missing:
        raise ValueError(f"loss {spec.kind} needs {missing} besides the target ({_extra_docs(entry, missing)})")
    check_target(
        spec,
        emitter.value_type(prediction),
        emitter.value_type(target) if target is not None else None,
        prediction_name=prediction,
        target_name=target or "",
        extra_types={name: emitter.value_type(value) for name, value in given.items() if value},
    )
    if target is not None:
        warning = target_size_warning(spec, emitter.value_type(prediction), emitter.value_type(target))
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=2)
    extras = [given.get(name) or None for name in names]
    return entry.body(emitter, prediction, target, *extras, **spec.options)


def _extra_docs(entry: LossDef, names: Sequence[str]) -> str:
    return "; ".join(f"{extra.name}: {extra.doc}" for extra in entry.extra_targets if extra.name in names)


def gradient_seed(
    emitter: GraphEmitter, spec: Loss, prediction: str, target: str | None, loss: str
) -> str | dict[str, str | None]:
    """Where ``build_backward`` starts for the loss ``spec``, emitted as ``loss`` by ``add_loss``.

    The loss value itself (its graph is differentiated, seeded with ones), or, for a loss whose
    torch backward is not the derivative of its forward (binary_cross_entropy, see its
    ``gradient``), torch's gradient of the prediction as ``{prediction: gradient}``, a
    vector-Jacobian seed.
    """
    gradient = LOSSES[spec.kind].gradient
    if gradient is None:
        return loss
    assert target is not None
    return {prediction: gradient(emitter, spec, prediction, target)}


# ---- graph pieces shared by the families -------------------------------------------------------


def reduce(emitter: GraphEmitter, value: str, reduction: str) -> str:
    """Torch's ``reduction``: mean or sum over every element, or the value as it is ("none")."""
    if reduction == "mean":
        return emitter.reduce("ReduceMean", value, None, keepdims=False)
    if reduction == "sum":
        return emitter.reduce_sum(value, None, keepdims=False)
    return value


def float_constant(emitter: GraphEmitter, value: object, like: str) -> str:
    """A constant of ``like``'s float type; Python floats are rounded once, as torch rounds scalars."""
    elem_type = emitter.elem_type(like)
    if elem_type:
        return emitter.constant(np.asarray(value, dtype=np.float64), elem_type)
    return emitter.op(
        "CastLike", [emitter.constant(np.asarray(value, dtype=np.float64), onnx.TensorProto.DOUBLE), like]
    )
