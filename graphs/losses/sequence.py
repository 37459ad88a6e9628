"""Sequence losses: torch.nn.functional.ctc_loss, as the ortlstm CTCLoss node and standard ops around it.

The per-sample loss is the domain's ``CTCLoss`` op (its gradient rule emits ``CTCLossGrad``, torch's
backward); what torch does around it is written in standard ops: the prediction made torch's
time-major log-probabilities (Transpose, Log or LogSoftmax, as declared), ``input_lengths`` derived
from the time axis when not given, and the reduction.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from ortlstm.graphs.emit.emitter import FLOAT_TYPES, GraphEmitter, ValueType
from ortlstm.graphs.losses.base import (
    INDEX_TYPES,
    ExtraTarget,
    Loss,
    described,
    float_constant,
    reduce,
    register_loss,
    shape_text,
    type_name,
)
from ortlstm.ops import schema
from ortlstm.ops.nodes import ordered_inputs

CTC_INPUTS = ("log_probs", "probs", "logits")
"""What a ctc_loss prediction may hold (``Loss.input``)."""

_CTC_TARGETS = (
    ExtraTarget(
        "input_lengths",
        "int64 [N], the valid steps of each sample's prediction; when not given, every sample has all T steps",
        required=False,
    ),
    ExtraTarget("target_lengths", "int64 [N], the number of labels of each sample's target"),
)


def _validate(spec: Loss) -> None:
    if spec.input not in CTC_INPUTS:
        choices = ", ".join(repr(choice) for choice in CTC_INPUTS)
        raise ValueError(f"ctc_loss input must be one of {choices} (what the prediction holds), got {spec.input!r}")
    if spec.blank < 0:
        raise ValueError(f"ctc_loss blank must be >= 0, got {spec.blank}")


def _batch_size(spec: Loss, prediction: ValueType | None) -> int | None:
    """N from the prediction's static shape ((T, N, C), or (N, T, C) batch-first), else None."""
    if prediction is None or prediction.shape is None or len(prediction.shape) != 3:
        return None
    dim = prediction.shape[0 if spec.batch_first else 1]
    return dim if isinstance(dim, int) else None


def _layout(spec: Loss) -> str:
    return "(N, T, C)" if spec.batch_first else "(T, N, C)"


def _check_targets(
    spec: Loss, prediction: ValueType | None, target: ValueType | None, prediction_name: str, target_name: str
) -> None:
    """A 3-D prediction; labels int64 (or int32), padded ``[N, S]`` or concatenated ``[sum(target_lengths)]``."""
    shape = prediction.shape if prediction is not None else None
    if shape is not None and len(shape) != 3:
        raise ValueError(
            f"loss ctc_loss: the prediction {prediction_name!r} must be 3-D {_layout(spec)}, got {shape_text(shape)}"
            + ("" if spec.batch_first else " (pass batch_first=True for a batch-major (N, T, C) output)")
        )
    classes = shape[2] if shape is not None else None
    if isinstance(classes, int) and spec.blank >= classes:
        raise ValueError(
            f"loss ctc_loss: blank {spec.blank} is not one of the {classes} classes of {prediction_name!r}"
        )
    if target is None:
        return
    expected = "int64 labels, padded [N, S] or concatenated [sum(target_lengths)]"
    if target.elem_type and target.elem_type not in INDEX_TYPES:
        raise ValueError(f"loss target {target_name!r}: ctc_loss expects {expected}, {described(target)}")
    if target.shape is not None and len(target.shape) not in (1, 2):
        raise ValueError(f"loss target {target_name!r}: ctc_loss expects {expected}, {described(target)}")
    batch = _batch_size(spec, prediction)
    if target.shape is not None and len(target.shape) == 2 and batch is not None and target.shape[0] != batch:
        first = target.shape[0]
        raise ValueError(
            f"loss target {target_name!r}: ctc_loss expects padded labels [N={batch}, S] (N from the prediction "
            f"{prediction_name!r} {shape_text(shape)}), got {type_name(target.elem_type)} [{first}, {target.shape[1]}]"
        )


def _check_lengths(
    spec: Loss, prediction: ValueType | None, target: ValueType | None, extras: Mapping[str, ValueType | None]
) -> None:
    """input_lengths and target_lengths: integers ``[N]``, N the prediction's batch size (or the padded target's)."""
    batch = _batch_size(spec, prediction)
    if batch is None and target is not None and target.shape is not None and len(target.shape) == 2:
        batch = target.shape[0] if isinstance(target.shape[0], int) else None
    for name, value in extras.items():
        if value is None:
            continue
        if value.elem_type and value.elem_type not in INDEX_TYPES:
            raise ValueError(f"loss ctc_loss: {name} must be int64 [N], {described(value)}")
        if value.shape is None:
            continue
        if len(value.shape) != 1 or (batch is not None and isinstance(value.shape[0], int) and value.shape[0] != batch):
            samples = "N" if batch is None else f"N={batch}"
            raise ValueError(
                f"loss ctc_loss: {name} must hold one length per sample, int64 [{samples}], {described(value)}"
            )


def _declared_target(prediction: ValueType | None, target_name: str) -> tuple[int, list[str] | None]:
    """int64 of unknown rank: padded [N, S] and concatenated [sum(target_lengths)] are both taken."""
    del prediction, target_name
    return onnx.TensorProto.INT64, None


def _time_major_log_probs(emitter: GraphEmitter, prediction: str, holds: str, batch_first: bool) -> str:
    """The prediction as torch's ctc_loss takes it: log-probabilities (T, N, C)."""
    known = emitter.value_type(prediction)
    value = prediction
    if batch_first:
        value = emitter.op("Transpose", [value], perm=[1, 0, 2])
    if holds == "logits":
        value = emitter.op("LogSoftmax", [value], axis=2)
    elif holds == "probs":
        value = emitter.op("Log", [value])
    if known is not None and value != prediction:
        shape = known.shape
        if batch_first and shape is not None and len(shape) == 3:
            shape = (shape[1], shape[0], shape[2])
        emitter.set_type(value, known.elem_type, shape)
    return value


def _lengths_like(emitter: GraphEmitter, lengths: str, like: str) -> str:
    """``lengths`` in ``like``'s integer type (CTCLoss takes both lengths in one type)."""
    if emitter.elem_type(lengths) and emitter.elem_type(lengths) == emitter.elem_type(like):
        return lengths
    return emitter.op("CastLike", [lengths, like])


def _input_lengths(emitter: GraphEmitter, log_probs: str, given: str | None, target_lengths: str) -> str:
    """``given``, or T for every sample: derived when ``given`` is None or holds no element (an empty feed).

    ``Slice(Concat(given, [T] * N), 0, N if Size(given) == 0 else Size(given))``: a given tensor of
    any other length than N stays that length, and CTCLoss refuses it by name.
    """
    batch = emitter.shape(target_lengths)
    steps = emitter.op("Slice", [emitter.shape(log_probs), emitter.ints([0]), emitter.ints([1])])
    derived = _lengths_like(emitter, emitter.op("Expand", [steps, batch]), target_lengths)
    if given is None:
        return derived
    given = _lengths_like(emitter, given, target_lengths)
    count = emitter.op("Reshape", [emitter.op("Size", [given]), emitter.ints([1])])
    end = emitter.op("Where", [emitter.op("Equal", [count, emitter.ints([0])]), batch, count])
    return emitter.op("Slice", [emitter.op("Concat", [given, derived], axis=0), emitter.ints([0]), end])


@register_loss(
    check_target=_check_targets,
    validate=_validate,
    extra_targets=_CTC_TARGETS,
    check_extra_targets=_check_lengths,
    declared_target=_declared_target,
    metric="cer",
    mean="samples",
    lengths="target_lengths",
)
def ctc_loss(
    emitter: GraphEmitter,
    log_probs: str,
    targets: str,
    input_lengths: str | None,
    target_lengths: str,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    input: str = "log_probs",
    batch_first: bool = False,
) -> str:
    """torch.nn.functional.ctc_loss: connectionist temporal classification (Graves et al. 2006).

    ``loss_n = -log sum over the alignments of target n of prod_t p[t, n, alignment_t]``, where an
    alignment spells the target with blanks and repeats inserted (the ``CTCLoss`` op,
    docs/ops.md). Reductions as torch's: ``"none"`` the ``[N]`` losses; ``"sum"`` their sum;
    ``"mean"`` each loss divided by its target length clamped to >= 1, then the batch mean.

    torch takes log-probabilities ``(T, N, C)``; its users write
    ``F.ctc_loss(logits.log_softmax(2), targets, input_lengths, target_lengths)``, transposing a
    batch-first output first. Here the model's output is used as it is, as declared: ``input``
    ``"log_probs"`` (the model ends in LogSoftmax), ``"logits"`` (a LogSoftmax over the classes is
    inserted, torch users' ``log_softmax(logits)``), or ``"probs"`` (the model ends in Softmax; a Log
    is inserted); ``batch_first`` for an ``(N, T, C)`` output (a Transpose is inserted). The
    gradient is torch's in each case (exact through the LogSoftmax or Softmax).

    Args:
        emitter: Receives the nodes.
        log_probs: The prediction, ``(T, N, C)`` (``(N, T, C)`` with ``batch_first``).
        targets: Labels int64 (or int32), padded ``[N, S]`` or concatenated ``[sum(target_lengths)]``;
            each in [0, C) and not ``blank`` (the op refuses others, naming the sample).
        input_lengths: Valid steps of each sample ``[N]``, or None: all T steps for every sample
            (also when the value fed holds no element, so one train step serves both).
        target_lengths: Labels of each sample ``[N]``.
        blank: The blank label.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        zero_infinity: An infinite loss (no alignment fits, e.g. a target longer than its input)
            and its gradient become 0.
        input: What the prediction holds: ``"log_probs"``, ``"probs"`` or ``"logits"``.
        batch_first: The prediction is ``(N, T, C)``.
    """
    lengths_type = emitter.elem_type(target_lengths)
    if lengths_type and lengths_type not in INDEX_TYPES:
        raise ValueError(f"loss ctc_loss: target_lengths must be int64 [N], got {type_name(lengths_type)}")
    time_major = _time_major_log_probs(emitter, log_probs, input, batch_first)
    ports = {
        "log_probs": time_major,
        "targets": targets,
        "input_lengths": _input_lengths(emitter, time_major, input_lengths, target_lengths),
        "target_lengths": target_lengths,
    }
    op = schema.CTC_LOSS
    loss = emitter.op(
        op.name,
        ordered_inputs(op, ports),
        domain=schema.DOMAIN,
        blank=blank,
        zero_infinity=int(zero_infinity),
    )
    known = emitter.value_type(time_major)
    if known is not None and known.elem_type in FLOAT_TYPES:
        emitter.set_type(loss, known.elem_type, None if known.shape is None else (known.shape[1],))
    if reduction != "mean":
        return reduce(emitter, loss, reduction)
    # torch: (loss / target_lengths.clamp_min(1)).mean()
    divisor = emitter.op("Max", [emitter.op("CastLike", [target_lengths, loss]), float_constant(emitter, 1.0, loss)])
    return reduce(emitter, emitter.op("Div", [loss, divisor]), "mean")
