"""Class-index losses: torch.nn.functional.cross_entropy and nll_loss, in standard ONNX ops.

The input is ``[N, C, d1, ...]`` (or ``[C]``), the class axis 1; the target holds class indices
(int64, or int32 cast to it) shaped like the input without its class axis; cross_entropy also
takes class probabilities. The exporters drop ``label_smoothing`` and onnxruntime-training has no
gradient for ``NegativeLogLikelihoodLoss``, so both are built from LogSoftmax, GatherElements,
Where, Mul and ReduceSum, plus non-differentiable helpers on the labels (Equal, Not, Cast).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx

from ortlstm.graphs.emit.emitter import FLOAT_TYPES, GraphEmitter, ValueType
from ortlstm.graphs.losses.base import (
    INDEX_TYPES,
    Loss,
    described,
    float_constant,
    reduce,
    register_loss,
    shape_conflict,
    shape_text,
    type_name,
    unbatched_hint,
)

# ---- checks ------------------------------------------------------------------------------------


def _class_count(prediction: ValueType | None) -> int | None:
    if prediction is None or prediction.shape is None or not prediction.shape:
        return None
    dim = prediction.shape[0] if len(prediction.shape) == 1 else prediction.shape[1]
    return dim if isinstance(dim, int) else None


def _validate(spec: Loss) -> None:
    if not 0.0 <= spec.label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {spec.label_smoothing}")
    if spec.weight is not None and spec.weight.ndim != 1:
        raise ValueError(f"{spec.kind} weight must be 1-D (one weight per class), got shape {spec.weight.shape}")


def _batch_text(pred_shape: tuple[int | str | None, ...] | None, target: ValueType) -> str:
    """In torch's words, how the target's first dim is not the prediction's batch size (both static), else ""."""
    if not pred_shape or len(pred_shape) < 2 or not target.shape:
        return ""
    batch, rows = pred_shape[0], target.shape[0]
    if not isinstance(batch, int) or not isinstance(rows, int) or batch == rows:
        return ""
    return (
        f" (torch: 'Expected input batch_size ({batch}) to match target batch_size ({rows}).'); "
        "pass one target per sample of the batch"
    )


def _check_class_target(
    spec: Loss,
    prediction: ValueType | None,
    target: ValueType | None,
    prediction_name: str,
    target_name: str,
    probabilities: bool = False,
) -> None:
    """Class indices ``[N, d1, ...]`` (0-D for a ``[C]`` input), or with ``probabilities`` also a float target.

    Class weights must have C entries; probabilities are a float of the prediction's type and shape.
    A float target is taken as probabilities (torch decides by the target's type) unless the loss
    says ``class_probabilities=True``, which takes only those.
    """
    pred_shape = prediction.shape if prediction is not None else None
    pred_elem = prediction.elem_type if prediction is not None else 0
    if target is None:
        return
    got = described(target)
    if pred_shape is not None and len(pred_shape) == 0:
        raise ValueError(f"loss {spec.kind}: the prediction {prediction_name!r} must have a class axis, it is 0-D")
    classes = _class_count(prediction)
    if spec.weight is not None and classes is not None and spec.weight.shape[0] != classes:
        raise ValueError(
            f"loss {spec.kind}: weight has {spec.weight.shape[0]} entries but {prediction_name!r} has {classes} classes"
        )
    index_shape = None if pred_shape is None else (pred_shape[:1] + pred_shape[2:] if len(pred_shape) > 1 else ())
    batch = _batch_text(pred_shape, target)
    if spec.class_probabilities and target.elem_type and target.elem_type not in FLOAT_TYPES:
        raise ValueError(
            f"loss target {target_name!r}: {spec.kind}(class_probabilities=True) expects class probabilities "
            f"{type_name(pred_elem) if pred_elem else 'float'} {shape_text(pred_shape)} (the prediction's type and "
            f"shape), {got}; class indices need Loss.{spec.kind}() (class_probabilities=False)"
        )
    if target.elem_type in FLOAT_TYPES and probabilities:
        if pred_elem and target.elem_type != pred_elem:
            raise ValueError(
                f"loss target {target_name!r}: {spec.kind} with class probabilities expects "
                f"{type_name(pred_elem)} {shape_text(pred_shape)} (the prediction's type and shape), {got}; "
                f"class indices must be int64 {shape_text(index_shape)}"
            )
        if pred_shape is not None and target.shape is not None and shape_conflict(pred_shape, target.shape):
            indices = "" if spec.class_probabilities else f"class indices (int64 {shape_text(index_shape)}) or "
            labels = index_shape is not None and not shape_conflict(index_shape, target.shape)
            advice = "; class indices stored as floats need labels.astype(np.int64)" if labels and indices else ""
            raise ValueError(
                f"loss target {target_name!r}: {spec.kind} expects {indices}class probabilities "
                f"({type_name(pred_elem) if pred_elem else 'float'} {shape_text(pred_shape)}), {got}{batch}{advice}"
            )
        return
    if target.elem_type and target.elem_type not in INDEX_TYPES:
        raise ValueError(
            f"loss target {target_name!r}: {spec.kind} expects class indices of type int64 "
            f"{shape_text(index_shape)}, {got}"
            + ("" if probabilities else f" ({spec.kind} takes no class probabilities)")
        )
    if index_shape is not None and target.shape is not None and shape_conflict(index_shape, target.shape):
        raise ValueError(
            f"loss target {target_name!r}: {spec.kind} expects class indices int64 {shape_text(index_shape)} "
            f"(the prediction {prediction_name!r} {shape_text(pred_shape)} without its class axis), {got}{batch}"
            + "".join(f"; {hint}" for hint in [unbatched_hint(spec, pred_shape)] if hint)
        )


def _check_class_indices(spec: Loss, prediction: ValueType | None, target: np.ndarray, target_name: str) -> None:
    """Each index is in [0, C) or ``ignore_index`` (C from the prediction's static type; unknown C passes).

    The loss graph fails on such an index too (``_nll_core``), with onnxruntime's out-of-range
    message naming no input.
    """
    if target.dtype.kind not in "iu":
        return
    classes = _class_count(prediction)
    if classes is None:
        return
    bad = (target != spec.ignore_index) & ((target < 0) | (target >= classes))
    if bad.any():
        value = int(target[bad].reshape(-1)[0])
        raise ValueError(
            f"loss target {target_name!r}: class index {value} is out of range for {classes} classes "
            f"(expected 0..{classes - 1}, or ignore_index {spec.ignore_index}; torch: "
            f"'Target {value} is out of bounds.')"
        )


# ---- shared pieces -----------------------------------------------------------------------------


def _rank(emitter: GraphEmitter, value: str, what: str, kind: str) -> int:
    rank = emitter.rank(value)
    if rank is None:
        raise ValueError(f"{kind} needs the rank of the {what} {value!r}; record its type in the emitter")
    return rank


def _num_classes_int(emitter: GraphEmitter, logits: str) -> str:
    """C (axis 1 of a [N, C, ...] value) as a 0-D int64 value."""
    return emitter.op("Gather", [emitter.shape(logits), emitter.ints(1)], axis=0)


def _num_classes(emitter: GraphEmitter, logits: str) -> int | str:
    """C (axis 1 of a [N, C, ...] value) as an int when static, else a 0-D float of the logits' type."""
    found = emitter.value_type(logits)
    if found is not None and found.shape is not None and len(found.shape) > 1 and isinstance(found.shape[1], int):
        return found.shape[1]
    return emitter.op("CastLike", [_num_classes_int(emitter, logits), logits])


def _batch_of_one(emitter: GraphEmitter, value: str) -> str:
    """``value`` with a leading axis of 1 (a [C] input, a 0-D index target), its type recorded."""
    batched = emitter.unsqueeze(value, [0])
    known = emitter.value_type(value)
    if known is not None:
        emitter.set_type(batched, known.elem_type, None if known.shape is None else (1, *known.shape))
    return batched


def _index_target(emitter: GraphEmitter, target: str) -> str:
    if emitter.elem_type(target) == onnx.TensorProto.INT32:
        return emitter.op("Cast", [target], to=onnx.TensorProto.INT64)
    return target


def _nll_core(
    emitter: GraphEmitter, logp: str, target: str, weight: np.ndarray | None, ignore_index: int, reduction: str
) -> tuple[str, str, str | None]:
    """Torch's nll_loss on ``logp`` [N, C, ...] and int64 ``target`` [N, ...].

    Returns the loss (reduced), the ignored mask, and the per-target weights (zero where ignored;
    None without class weights).
    """
    ignored = emitter.op("Equal", [target, emitter.ints(ignore_index)])
    # A negative index that is not ignore_index would be read from the end by GatherElements, a
    # silently wrong loss (torch raises); it becomes one no class count reaches, so onnxruntime
    # fails on it as it does on an index >= C. (The Trainer refuses both first, with a message.)
    negative = emitter.op("Less", [target, emitter.ints(0)])
    unreachable = emitter.op("Where", [negative, emitter.ints(int(np.iinfo(np.int64).max)), target])
    safe = emitter.op("Where", [ignored, emitter.ints(0), unreachable])
    picked = emitter.squeeze(emitter.op("GatherElements", [logp, emitter.unsqueeze(safe, [1])], axis=1), [1])
    loss = emitter.op("Neg", [picked])
    zero = float_constant(emitter, 0.0, logp)
    target_weight = None
    if weight is not None:
        picked_weight = emitter.op("Gather", [float_constant(emitter, weight, logp), safe], axis=0)
        target_weight = emitter.op("Where", [ignored, zero, picked_weight])
        loss = emitter.op("Mul", [loss, picked_weight])
    loss = emitter.op("Where", [ignored, zero, loss])
    if reduction == "mean":
        if target_weight is not None:
            denominator = emitter.reduce_sum(target_weight, None, keepdims=False)
        else:
            kept = emitter.op("CastLike", [emitter.op("Not", [ignored]), logp])
            denominator = emitter.reduce_sum(kept, None, keepdims=False)
        return emitter.op("Div", [emitter.reduce_sum(loss, None, keepdims=False), denominator]), ignored, target_weight
    return reduce(emitter, loss, reduction), ignored, target_weight


def _class_weight_broadcast(emitter: GraphEmitter, weight: np.ndarray, rank: int, like: str) -> str:
    """The class weights shaped [C, 1, ..., 1] to broadcast over [N, C, d1, ...]."""
    return float_constant(emitter, weight.reshape((weight.shape[0],) + (1,) * (rank - 2)), like)


# ---- the losses --------------------------------------------------------------------------------


@register_loss(
    class_target=True,
    metric="accuracy",
    mean="class_weights",
    check_target=functools.partial(_check_class_target, probabilities=True),
    check_values=_check_class_indices,
    validate=_validate,
)
def cross_entropy(
    emitter: GraphEmitter,
    input: str,
    target: str,
    weight: Sequence[float] | np.ndarray | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    class_probabilities: bool = False,
) -> str:
    """torch.nn.functional.cross_entropy: log_softmax over the class axis, then NLL, optionally smoothed.

    With class indices and ``eps = label_smoothing``: ``loss = (1 - eps) * nll(log_softmax(x), y)
    + eps / C * s`` where ``s_n = -sum_c w[c] * log_softmax(x)[n, c]`` (0 for ignored targets),
    reduced like the NLL part: mean divides ``sum_n s_n`` by the summed weights ``sum_n w[y_n]`` of
    the non-ignored targets (their count without weights), as torch does.
    With class probabilities ``p`` (a float target shaped like the input):
    ``p' = (1 - eps) * p + eps / C``, ``l_n = -sum_c w[c] * p'[n, c] * log_softmax(x)[n, c]``; mean
    divides by N * d1 * ... (not by weights).

    Args:
        emitter: Receives the nodes; must know the input's rank.
        input: Logits ``[N, C, d1, ...]`` or ``[C]``.
        target: Class indices (int64, or int32) ``[N, d1, ...]`` / 0-D, or class probabilities.
        weight: Class weights ``[C]`` (default: all ones).
        ignore_index: Index targets with this value contribute nothing.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        label_smoothing: Amount of smoothing in [0, 1].
        class_probabilities: The target must hold class probabilities (what a train step declares;
            see ``Loss``); without it the target's type decides, as in torch.
    """
    del class_probabilities  # checked with the target (_check_class_target); the type decides below
    assert weight is None or isinstance(weight, np.ndarray)
    rank = _rank(emitter, input, "input", "cross_entropy")
    probabilities = emitter.elem_type(target) in FLOAT_TYPES
    arguments = (weight, ignore_index, reduction, label_smoothing)
    if rank == 1:
        batched, target_b = _batch_of_one(emitter, input), _batch_of_one(emitter, target)
        loss = _cross_entropy_batched(emitter, batched, target_b, *arguments, probabilities, 2)
        return emitter.squeeze(loss, [0]) if reduction == "none" else loss
    return _cross_entropy_batched(emitter, input, target, *arguments, probabilities, rank)


def _cross_entropy_batched(
    emitter: GraphEmitter,
    logits: str,
    target: str,
    weight: np.ndarray | None,
    ignore_index: int,
    reduction: str,
    smoothing: float,
    probabilities: bool,
    rank: int,
) -> str:
    logp = emitter.op("LogSoftmax", [logits], axis=1)
    known = emitter.value_type(logits)
    if known is not None:
        emitter.set_type(logp, known.elem_type, known.shape)
    if probabilities:
        if smoothing > 0:
            classes = _num_classes(emitter, logits)
            spread = (
                float_constant(emitter, smoothing / classes, logits)
                if isinstance(classes, int)
                else emitter.op("Div", [float_constant(emitter, smoothing, logits), classes])
            )
            target = emitter.op(
                "Add", [emitter.op("Mul", [target, float_constant(emitter, 1 - smoothing, logits)]), spread]
            )
        product = emitter.op("Mul", [logp, target])
        if weight is not None:
            product = emitter.op("Mul", [product, _class_weight_broadcast(emitter, weight, rank, logits)])
        if reduction == "none":
            return emitter.op("Neg", [emitter.reduce_sum(product, [1], keepdims=False)])
        total = emitter.op("Neg", [emitter.reduce_sum(product, None, keepdims=False)])
        if reduction == "sum":
            return total
        # torch: divided by input.numel() / C, the number of [N, d1, ...] positions.
        static = known.static_shape if known is not None else None
        if static is not None:
            count = float_constant(emitter, float(np.prod(static)) / static[1], logits)
        else:
            size = emitter.op("CastLike", [emitter.op("Size", [logits]), logits])
            count = emitter.op("Div", [size, emitter.op("CastLike", [_num_classes_int(emitter, logits), logits])])
        return emitter.op("Div", [total, count])
    target = _index_target(emitter, target)
    nll, ignored, target_weight = _nll_core(emitter, logp, target, weight, ignore_index, reduction)
    if smoothing <= 0:
        return nll
    if weight is not None:
        weighted = emitter.op("Mul", [logp, _class_weight_broadcast(emitter, weight, rank, logits)])
        smooth = emitter.op("Neg", [emitter.reduce_sum(weighted, [1], keepdims=False)])
    else:
        smooth = emitter.op("Neg", [emitter.reduce_sum(logp, [1], keepdims=False)])
    smooth = emitter.op("Where", [ignored, float_constant(emitter, 0.0, logits), smooth])
    if reduction == "mean":
        if target_weight is not None:
            denominator = emitter.reduce_sum(target_weight, None, keepdims=False)
        else:
            denominator = emitter.reduce_sum(
                emitter.op("CastLike", [emitter.op("Not", [ignored]), logits]), None, keepdims=False
            )
        smooth = emitter.op("Div", [emitter.reduce_sum(smooth, None, keepdims=False), denominator])
    else:
        smooth = reduce(emitter, smooth, reduction)
    classes = _num_classes(emitter, logits)
    if isinstance(classes, int):
        spread = float_constant(emitter, smoothing / classes, logits)
    else:
        spread = emitter.op("Div", [float_constant(emitter, smoothing, logits), classes])
    kept = emitter.op("Mul", [float_constant(emitter, 1.0 - smoothing, logits), nll])
    return emitter.op("Add", [kept, emitter.op("Mul", [smooth, spread])])


@register_loss(
    class_target=True,
    metric="accuracy",
    mean="class_weights",
    check_target=_check_class_target,
    check_values=_check_class_indices,
    validate=_validate,
)
def nll_loss(
    emitter: GraphEmitter,
    input: str,
    target: str,
    weight: Sequence[float] | np.ndarray | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> str:
    """torch.nn.functional.nll_loss: the negative log-likelihood of the target classes.

    ``l_n = -w[y_n] * x[n, y_n]`` (0 where ``y_n == ignore_index``); mean:
    ``sum_n l_n / sum_n w[y_n]`` over non-ignored n (NaN when every target is ignored), sum:
    ``sum_n l_n``, none: ``l`` shaped like the target.

    Args:
        emitter: Receives the nodes; must know the input's rank.
        input: Log-probabilities ``[N, C, d1, ...]`` or ``[C]``.
        target: Class indices (int64, or int32) ``[N, d1, ...]`` or 0-D.
        weight: Class weights ``[C]`` (default: all ones).
        ignore_index: Targets with this value contribute nothing.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    assert weight is None or isinstance(weight, np.ndarray)
    target = _index_target(emitter, target)
    rank = _rank(emitter, input, "input", "nll_loss")
    if rank == 1:
        batched, target_b = _batch_of_one(emitter, input), _batch_of_one(emitter, target)
        loss, _, _ = _nll_core(emitter, batched, target_b, weight, ignore_index, reduction)
        return emitter.squeeze(loss, [0]) if reduction == "none" else loss
    loss, _, _ = _nll_core(emitter, input, target, weight, ignore_index, reduction)
    return loss
