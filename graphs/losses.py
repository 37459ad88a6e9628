"""Losses appended to a model in standard ONNX ops, with torch.nn.functional's formulas and defaults.

The exporters drop options such as ``label_smoothing``, and onnxruntime-training has no gradient
for ``NegativeLogLikelihoodLoss``; so ortlstm builds the loss itself, from ops the autodiff engine
differentiates (LogSoftmax, GatherElements, Where, Mul, ReduceSum, Exp, Log, ...) plus
non-differentiable helpers on the labels (Equal, Not, Cast, Gather of constant weights).

``Loss`` describes one (``Loss.cross_entropy(label_smoothing=0.1)``, ``Loss.output()``, ...);
``add_loss(emitter, spec, prediction, target)`` emits it and returns the loss value's name;
``check_target`` refuses a target of the wrong element type or shape before anything is built.
The functions ``cross_entropy``, ``nll_loss``, ``mse_loss``, ``l1_loss``, ``smooth_l1_loss``,
``huber_loss``, ``kl_div``, ``binary_cross_entropy`` and ``binary_cross_entropy_with_logits``
take torch's arguments (after the emitter) with torch's defaults. ``gradient_seed`` says where
the backward starts: the loss value, or for ``binary_cross_entropy`` (whose torch backward is
not the derivative of its clamped forward) torch's gradient of the prediction. Protos only:
nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.helper

try:
    from ortlstm.graphs.autodiff.emitter import GraphEmitter, ValueType
except ModuleNotFoundError:
    from graphs.autodiff.emitter import GraphEmitter, ValueType  # type: ignore[no-redef]

REDUCTIONS = ("mean", "sum", "none")
KL_DIV_REDUCTIONS = (*REDUCTIONS, "batchmean")
"""kl_div also takes torch's "batchmean": the sum divided by the input's first dim."""
KINDS = (
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "kl_div",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "output",
)
INDEX_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})
"""Element types accepted for class indices (int32 is cast to int64, torch's type)."""
_FLOATS = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
)


def _as_array(value: object, name: str) -> np.ndarray | None:
    if value is None:
        return None
    array = np.array(value, dtype=np.float64)
    array.setflags(write=False)
    if array.ndim == 0:
        raise ValueError(f"{name} must be a tensor (a sequence of floats), got the scalar {value!r}")
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class Loss:
    """What loss to append to the model: the kind and torch's keyword arguments.

    Attributes:
        kind: One of ``KINDS``: a torch.nn.functional name, or ``"output"`` for a model output
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

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown loss kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.reduction not in (KL_DIV_REDUCTIONS if self.kind == "kl_div" else REDUCTIONS):
            choices = "mean, sum, none or batchmean" if self.kind == "kl_div" else "mean, sum or none"
            raise ValueError(f"{self.reduction} is not a valid value for reduction (choose {choices})")
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {self.label_smoothing}")
        if self.label_smoothing and self.kind != "cross_entropy":
            raise ValueError(f"label_smoothing applies to cross_entropy only, not {self.kind}")
        if self.beta != 1.0 and self.kind != "smooth_l1_loss":
            raise ValueError(f"beta applies to smooth_l1_loss only, not {self.kind}")
        if self.delta != 1.0 and self.kind != "huber_loss":
            raise ValueError(f"delta applies to huber_loss only, not {self.kind}")
        if self.log_target and self.kind != "kl_div":
            raise ValueError(f"log_target applies to kl_div only, not {self.kind}")
        if not self.beta >= 0.0:  # torch's messages; NaN is refused too
            raise ValueError(f"smooth_l1_loss does not support negative values for beta, got {self.beta}")
        if not self.delta > 0.0:
            raise ValueError(f"huber_loss does not support non-positive values for delta, got {self.delta}")
        object.__setattr__(self, "weight", _as_array(self.weight, "weight"))
        object.__setattr__(self, "pos_weight", _as_array(self.pos_weight, "pos_weight"))
        if self.weight is not None and self.kind in ("cross_entropy", "nll_loss") and self.weight.ndim != 1:
            raise ValueError(f"{self.kind} weight must be 1-D (one weight per class), got shape {self.weight.shape}")
        if self.weight is not None and self.kind not in (
            "cross_entropy",
            "nll_loss",
            "binary_cross_entropy",
            "binary_cross_entropy_with_logits",
        ):
            raise ValueError(f"{self.kind} takes no weight")
        if self.pos_weight is not None and self.kind != "binary_cross_entropy_with_logits":
            raise ValueError(f"pos_weight applies to binary_cross_entropy_with_logits only, not {self.kind}")

    @classmethod
    def cross_entropy(
        cls,
        weight: Sequence[float] | np.ndarray | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> Loss:
        """torch.nn.functional.cross_entropy; see ``cross_entropy``."""
        return cls("cross_entropy", reduction, ignore_index, label_smoothing, _as_array(weight, "weight"))

    @classmethod
    def nll_loss(
        cls, weight: Sequence[float] | np.ndarray | None = None, ignore_index: int = -100, reduction: str = "mean"
    ) -> Loss:
        """torch.nn.functional.nll_loss; see ``nll_loss``."""
        return cls("nll_loss", reduction, ignore_index, weight=_as_array(weight, "weight"))

    @classmethod
    def mse_loss(cls, reduction: str = "mean") -> Loss:
        """torch.nn.functional.mse_loss; see ``mse_loss``."""
        return cls("mse_loss", reduction)

    @classmethod
    def l1_loss(cls, reduction: str = "mean") -> Loss:
        """torch.nn.functional.l1_loss; see ``l1_loss``."""
        return cls("l1_loss", reduction)

    @classmethod
    def smooth_l1_loss(cls, reduction: str = "mean", beta: float = 1.0) -> Loss:
        """torch.nn.functional.smooth_l1_loss; see ``smooth_l1_loss``."""
        return cls("smooth_l1_loss", reduction, beta=beta)

    @classmethod
    def huber_loss(cls, reduction: str = "mean", delta: float = 1.0) -> Loss:
        """torch.nn.functional.huber_loss; see ``huber_loss``."""
        return cls("huber_loss", reduction, delta=delta)

    @classmethod
    def kl_div(cls, reduction: str = "mean", log_target: bool = False) -> Loss:
        """torch.nn.functional.kl_div; see ``kl_div``."""
        return cls("kl_div", reduction, log_target=log_target)

    @classmethod
    def binary_cross_entropy(cls, weight: Sequence[float] | np.ndarray | None = None, reduction: str = "mean") -> Loss:
        """torch.nn.functional.binary_cross_entropy (probabilities in); see that function here."""
        return cls("binary_cross_entropy", reduction, weight=_as_array(weight, "weight"))

    @classmethod
    def binary_cross_entropy_with_logits(
        cls,
        weight: Sequence[float] | np.ndarray | None = None,
        reduction: str = "mean",
        pos_weight: Sequence[float] | np.ndarray | None = None,
    ) -> Loss:
        """torch.nn.functional.binary_cross_entropy_with_logits; see that function here."""
        return cls(
            "binary_cross_entropy_with_logits",
            reduction,
            weight=_as_array(weight, "weight"),
            pos_weight=_as_array(pos_weight, "pos_weight"),
        )

    @classmethod
    def output(cls) -> Loss:
        """A model output is the loss, as it is (it must hold a single element); no target."""
        return cls("output")

    @property
    def needs_target(self) -> bool:
        """Whether the loss reads a target (every kind but ``output``)."""
        return self.kind != "output"


# ---- target checks -----------------------------------------------------------------------------


def _type_name(elem_type: int) -> str:
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _shape_text(shape: Sequence[int | str | None] | None) -> str:
    if shape is None:
        return "of unknown rank"
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in shape) + "]"


def _dims_conflict(a: int | str | None, b: int | str | None) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def _shape_conflict(expected: Sequence[int | str | None], actual: Sequence[int | str | None]) -> bool:
    return len(expected) != len(actual) or any(_dims_conflict(e, a) for e, a in zip(expected, actual, strict=False))


def _class_count(spec: Loss, prediction: ValueType | None) -> int | None:
    if prediction is None or prediction.shape is None or not prediction.shape:
        return None
    dim = prediction.shape[0] if len(prediction.shape) == 1 else prediction.shape[1]
    return dim if isinstance(dim, int) else None


def check_target(
    spec: Loss,
    prediction_type: ValueType | None,
    target_type: ValueType | None,
    *,
    prediction_name: str = "prediction",
    target_name: str = "target",
) -> None:
    """Refuses a prediction/target pair the loss cannot take; unknown types and dims pass.

    - cross_entropy / nll_loss: a float input ``[N, C, d1, ...]`` or ``[C]``; class indices of
      type int64 (or int32) shaped like the input without its class axis (``[N, d1, ...]``, 0-D
      for a ``[C]`` input); cross_entropy also takes class probabilities, a float target of the
      input's type and shape. Class weights must have C entries.
    - mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div, binary_cross_entropy,
      binary_cross_entropy_with_logits: a float target of the input's type and shape.
    - output: no target; the value must be a float holding one element.

    Raises:
        ValueError: Naming the target (or prediction), the expected and the actual type/shape.
    """
    if prediction_type is not None and prediction_type.elem_type and prediction_type.elem_type not in _FLOATS:
        raise ValueError(
            f"loss {spec.kind}: the prediction {prediction_name!r} must be a float tensor, "
            f"got {_type_name(prediction_type.elem_type)}"
        )
    if spec.kind == "output":
        if target_type is not None:
            raise ValueError(f"loss 'output' reads no target, but target {target_name!r} was given")
        shape = prediction_type.shape if prediction_type is not None else None
        if shape is not None and any(isinstance(dim, int) and dim != 1 for dim in shape):
            raise ValueError(
                f"the model output {prediction_name!r} used as the loss must hold one element, "
                f"its shape is {_shape_text(shape)}"
            )
        return
    pred_shape = prediction_type.shape if prediction_type is not None else None
    pred_elem = prediction_type.elem_type if prediction_type is not None else 0
    if target_type is None:
        return
    target_elem, target_shape = target_type.elem_type, target_type.shape
    got = f"got {_type_name(target_elem) if target_elem else 'an unknown type'} {_shape_text(target_shape)}"
    if spec.kind in ("cross_entropy", "nll_loss"):
        if pred_shape is not None and len(pred_shape) == 0:
            raise ValueError(f"loss {spec.kind}: the prediction {prediction_name!r} must have a class axis, it is 0-D")
        classes = _class_count(spec, prediction_type)
        if spec.weight is not None and classes is not None and spec.weight.shape[0] != classes:
            raise ValueError(
                f"loss {spec.kind}: weight has {spec.weight.shape[0]} entries "
                f"but {prediction_name!r} has {classes} classes"
            )
        index_shape = None if pred_shape is None else (pred_shape[:1] + pred_shape[2:] if len(pred_shape) > 1 else ())
        if target_elem in _FLOATS and spec.kind == "cross_entropy":
            # class probabilities
            if pred_elem and target_elem != pred_elem:
                raise ValueError(
                    f"loss target {target_name!r}: cross_entropy with class probabilities expects "
                    f"{_type_name(pred_elem)} {_shape_text(pred_shape)} (the prediction's type and shape), {got}; "
                    f"class indices must be int64 {_shape_text(index_shape)}"
                )
            if pred_shape is not None and target_shape is not None and _shape_conflict(pred_shape, target_shape):
                raise ValueError(
                    f"loss target {target_name!r}: cross_entropy expects class indices (int64 "
                    f"{_shape_text(index_shape)}) or class probabilities "
                    f"({_type_name(pred_elem) if pred_elem else 'float'} "
                    f"{_shape_text(pred_shape)}), {got}"
                )
            return
        if target_elem and target_elem not in INDEX_TYPES:
            raise ValueError(
                f"loss target {target_name!r}: {spec.kind} expects class indices of type int64 "
                f"{_shape_text(index_shape)}, {got}"
                + ("" if spec.kind == "cross_entropy" else " (nll_loss takes no class probabilities)")
            )
        if index_shape is not None and target_shape is not None and _shape_conflict(index_shape, target_shape):
            raise ValueError(
                f"loss target {target_name!r}: {spec.kind} expects class indices int64 {_shape_text(index_shape)} "
                f"(the prediction {prediction_name!r} {_shape_text(pred_shape)} without its class axis), {got}"
            )
        return
    # element-wise losses
    if target_elem and (target_elem not in _FLOATS or (pred_elem and target_elem != pred_elem)):
        raise ValueError(
            f"loss target {target_name!r}: {spec.kind} expects "
            f"{_type_name(pred_elem) if pred_elem else 'a float type'} {_shape_text(pred_shape)} "
            f"(the prediction's type and shape), {got}"
        )
    if pred_shape is not None and target_shape is not None and _shape_conflict(pred_shape, target_shape):
        raise ValueError(
            f"loss target {target_name!r}: {spec.kind} expects the prediction's shape {_shape_text(pred_shape)}, {got}"
        )


def check_target_values(
    spec: Loss, prediction_type: ValueType | None, target: np.ndarray, *, target_name: str = "target"
) -> None:
    """Refuses target values torch refuses, before a graph would take them silently.

    - cross_entropy / nll_loss with class indices: each is in [0, C) or ``ignore_index`` (C from
      the prediction's static type; unknown C is not checked). The loss graph fails on such an
      index too (``_nll_core``), with onnxruntime's out-of-range message naming no input.
    - binary_cross_entropy: every target in [0, 1].

    Raises:
        ValueError: Naming the target, the first offending value and the allowed range (torch's
            message too).
    """
    if target.size == 0:
        return
    if spec.kind in ("cross_entropy", "nll_loss") and target.dtype.kind in "iu":
        classes = _class_count(spec, prediction_type)
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
    if spec.kind == "binary_cross_entropy":
        bad = ~((target >= 0) & (target <= 1))
        if bad.any():
            raise ValueError(
                f"loss target {target_name!r}: binary_cross_entropy takes targets in [0, 1], got "
                f"{float(target[bad].reshape(-1)[0])} (torch: 'all elements of target should be between 0 and 1')"
            )


# ---- shared pieces -----------------------------------------------------------------------------


def _reduce(emitter: GraphEmitter, value: str, reduction: str) -> str:
    if reduction == "mean":
        return emitter.reduce("ReduceMean", value, None, keepdims=False)
    if reduction == "sum":
        return emitter.reduce_sum(value, None, keepdims=False)
    return value


def _float_const(emitter: GraphEmitter, value: object, like: str) -> str:
    """A constant of ``like``'s float type; Python floats are rounded once, as torch rounds scalars."""
    elem_type = emitter.elem_type(like)
    if elem_type:
        return emitter.constant(np.asarray(value, dtype=np.float64), elem_type)
    return emitter.op(
        "CastLike", [emitter.constant(np.asarray(value, dtype=np.float64), onnx.TensorProto.DOUBLE), like]
    )


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
    zero = _float_const(emitter, 0.0, logp)
    target_weight = None
    if weight is not None:
        picked_weight = emitter.op("Gather", [_float_const(emitter, weight, logp), safe], axis=0)
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
    return _reduce(emitter, loss, reduction), ignored, target_weight


def _class_weight_broadcast(emitter: GraphEmitter, weight: np.ndarray, rank: int, like: str) -> str:
    """The class weights shaped [C, 1, ..., 1] to broadcast over [N, C, d1, ...]."""
    return _float_const(emitter, weight.reshape((weight.shape[0],) + (1,) * (rank - 2)), like)


# ---- the losses --------------------------------------------------------------------------------


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
    spec = Loss.nll_loss(weight, ignore_index, reduction)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    target = _index_target(emitter, target)
    rank = _rank(emitter, input, "input", "nll_loss")
    if rank == 1:
        batched, target_b = _batch_of_one(emitter, input), _batch_of_one(emitter, target)
        loss, _, _ = _nll_core(emitter, batched, target_b, spec.weight, ignore_index, reduction)
        return emitter.squeeze(loss, [0]) if reduction == "none" else loss
    loss, _, _ = _nll_core(emitter, input, target, spec.weight, ignore_index, reduction)
    return loss


def cross_entropy(
    emitter: GraphEmitter,
    input: str,
    target: str,
    weight: Sequence[float] | np.ndarray | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
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
    """
    spec = Loss.cross_entropy(weight, ignore_index, reduction, label_smoothing)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    rank = _rank(emitter, input, "input", "cross_entropy")
    probabilities = emitter.elem_type(target) in _FLOATS
    if rank == 1:
        batched, target_b = _batch_of_one(emitter, input), _batch_of_one(emitter, target)
        loss = _cross_entropy_batched(emitter, batched, target_b, spec, probabilities, 2)
        return emitter.squeeze(loss, [0]) if reduction == "none" else loss
    return _cross_entropy_batched(emitter, input, target, spec, probabilities, rank)


def _cross_entropy_batched(
    emitter: GraphEmitter, logits: str, target: str, spec: Loss, probabilities: bool, rank: int
) -> str:
    logp = emitter.op("LogSoftmax", [logits], axis=1)
    known = emitter.value_type(logits)
    if known is not None:
        emitter.set_type(logp, known.elem_type, known.shape)
    smoothing = spec.label_smoothing
    if probabilities:
        if smoothing > 0:
            classes = _num_classes(emitter, logits)
            spread = (
                _float_const(emitter, smoothing / classes, logits)
                if isinstance(classes, int)
                else emitter.op("Div", [_float_const(emitter, smoothing, logits), classes])
            )
            target = emitter.op(
                "Add", [emitter.op("Mul", [target, _float_const(emitter, 1 - smoothing, logits)]), spread]
            )
        product = emitter.op("Mul", [logp, target])
        if spec.weight is not None:
            product = emitter.op("Mul", [product, _class_weight_broadcast(emitter, spec.weight, rank, logits)])
        if spec.reduction == "none":
            return emitter.op("Neg", [emitter.reduce_sum(product, [1], keepdims=False)])
        total = emitter.op("Neg", [emitter.reduce_sum(product, None, keepdims=False)])
        if spec.reduction == "sum":
            return total
        # torch: divided by input.numel() / C, the number of [N, d1, ...] positions.
        static = known.static_shape if known is not None else None
        if static is not None:
            count = _float_const(emitter, float(np.prod(static)) / static[1], logits)
        else:
            size = emitter.op("CastLike", [emitter.op("Size", [logits]), logits])
            count = emitter.op("Div", [size, emitter.op("CastLike", [_num_classes_int(emitter, logits), logits])])
        return emitter.op("Div", [total, count])
    target = _index_target(emitter, target)
    nll, ignored, target_weight = _nll_core(emitter, logp, target, spec.weight, spec.ignore_index, spec.reduction)
    if smoothing <= 0:
        return nll
    if spec.weight is not None:
        weighted = emitter.op("Mul", [logp, _class_weight_broadcast(emitter, spec.weight, rank, logits)])
        smooth = emitter.op("Neg", [emitter.reduce_sum(weighted, [1], keepdims=False)])
    else:
        smooth = emitter.op("Neg", [emitter.reduce_sum(logp, [1], keepdims=False)])
    smooth = emitter.op("Where", [ignored, _float_const(emitter, 0.0, logits), smooth])
    if spec.reduction == "mean":
        if target_weight is not None:
            denominator = emitter.reduce_sum(target_weight, None, keepdims=False)
        else:
            denominator = emitter.reduce_sum(
                emitter.op("CastLike", [emitter.op("Not", [ignored]), logits]), None, keepdims=False
            )
        smooth = emitter.op("Div", [emitter.reduce_sum(smooth, None, keepdims=False), denominator])
    else:
        smooth = _reduce(emitter, smooth, spec.reduction)
    classes = _num_classes(emitter, logits)
    if isinstance(classes, int):
        spread = _float_const(emitter, smoothing / classes, logits)
    else:
        spread = emitter.op("Div", [_float_const(emitter, smoothing, logits), classes])
    kept = emitter.op("Mul", [_float_const(emitter, 1.0 - smoothing, logits), nll])
    return emitter.op("Add", [kept, emitter.op("Mul", [smooth, spread])])


def mse_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean") -> str:
    """torch.nn.functional.mse_loss: ``l = (x - y)^2``, then mean (default), sum or none."""
    spec = Loss.mse_loss(reduction)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    diff = emitter.op("Sub", [input, target])
    return _reduce(emitter, emitter.op("Mul", [diff, diff]), reduction)


def l1_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean") -> str:
    """torch.nn.functional.l1_loss: ``l = |x - y|``, then mean (default), sum or none."""
    spec = Loss.l1_loss(reduction)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    return _reduce(emitter, emitter.op("Abs", [emitter.op("Sub", [input, target])]), reduction)


def smooth_l1_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean", beta: float = 1.0) -> str:
    """torch.nn.functional.smooth_l1_loss, then mean (default), sum or none.

    With ``z = |x - y|``: ``l = 0.5 * z * z / beta`` where ``z < beta``, else ``z - 0.5 * beta``
    (torch's order of operations); ``beta = 0`` is ``l1_loss``, as in torch. The gradient is
    ``(x - y) / beta`` inside, ``sign(x - y)`` outside (0 at ``x = y``).
    """
    spec = Loss.smooth_l1_loss(reduction, beta)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    if spec.beta == 0.0:
        return l1_loss(emitter, input, target, reduction)
    distance = emitter.op("Abs", [emitter.op("Sub", [input, target])])
    beta_value = _float_const(emitter, spec.beta, input)
    half = _float_const(emitter, 0.5, input)
    quadratic = emitter.op("Div", [emitter.op("Mul", [emitter.op("Mul", [half, distance]), distance]), beta_value])
    linear = emitter.op("Sub", [distance, _float_const(emitter, 0.5 * spec.beta, input)])
    inside = emitter.op("Less", [distance, beta_value])
    return _reduce(emitter, emitter.op("Where", [inside, quadratic, linear]), reduction)


def huber_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean", delta: float = 1.0) -> str:
    """torch.nn.functional.huber_loss, then mean (default), sum or none.

    With ``z = |x - y|``: ``l = 0.5 * z * z`` where ``z < delta``, else
    ``delta * (z - 0.5 * delta)`` (torch's order of operations); ``smooth_l1_loss`` times ``beta``
    for ``beta = delta``. The gradient is ``x - y`` inside, ``delta * sign(x - y)`` outside.
    """
    spec = Loss.huber_loss(reduction, delta)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    distance = emitter.op("Abs", [emitter.op("Sub", [input, target])])
    delta_value = _float_const(emitter, spec.delta, input)
    quadratic = emitter.op("Mul", [emitter.op("Mul", [_float_const(emitter, 0.5, input), distance]), distance])
    linear = emitter.op(
        "Mul", [delta_value, emitter.op("Sub", [distance, _float_const(emitter, 0.5 * spec.delta, input)])]
    )
    inside = emitter.op("Less", [distance, delta_value])
    return _reduce(emitter, emitter.op("Where", [inside, quadratic, linear]), reduction)


def _log_sigmoid(emitter: GraphEmitter, x: str) -> str:
    """``log(sigmoid(x))`` without overflow, smooth everywhere (also its gradient at 0).

    ``-log(1 + exp(-x))`` where ``x >= 0``, ``x - log(1 + exp(x))`` elsewhere; each branch reads
    ``x`` through a Where that zeroes it on the other side, so neither overflows and the branch
    not taken backpropagates zeros, not NaNs. (onnxruntime has Softplus for float32 only.)
    """
    zero = _float_const(emitter, 0.0, x)
    one = _float_const(emitter, 1.0, x)
    non_negative = emitter.op("Not", [emitter.op("Less", [x, zero])])
    x_pos = emitter.op("Where", [non_negative, x, zero])
    x_neg = emitter.op("Where", [non_negative, zero, x])
    positive = emitter.op(
        "Neg", [emitter.op("Log", [emitter.op("Add", [one, emitter.op("Exp", [emitter.op("Neg", [x_pos])])])])]
    )
    negative = emitter.op("Sub", [x_neg, emitter.op("Log", [emitter.op("Add", [one, emitter.op("Exp", [x_neg])])])])
    return emitter.op("Where", [non_negative, positive, negative])


def binary_cross_entropy_with_logits(
    emitter: GraphEmitter,
    input: str,
    target: str,
    weight: Sequence[float] | np.ndarray | None = None,
    reduction: str = "mean",
    pos_weight: Sequence[float] | np.ndarray | None = None,
) -> str:
    """torch.nn.functional.binary_cross_entropy_with_logits, in torch's numerically stable form.

    ``l = w * ((1 - y) * x - (1 + (pw - 1) * y) * log_sigmoid(x))`` with a stable
    ``log_sigmoid`` (see ``_log_sigmoid``); equal to ``-w * (pw * y * log(sigmoid(x)) + (1 - y) *
    log(1 - sigmoid(x)))`` without overflow for large ``|x|``. Then mean (default), sum or none.

    Args:
        emitter: Receives the nodes.
        input: Logits, any shape.
        target: Probabilities of the positive class, the input's type and shape.
        weight: Weights broadcast to the input (default: ones).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        pos_weight: Weights of the positive examples, broadcast to the input (default: ones).
    """
    spec = Loss.binary_cross_entropy_with_logits(weight, reduction, pos_weight)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    log_sigmoid = _log_sigmoid(emitter, input)
    if spec.pos_weight is not None:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(emitter.elem_type(input) or onnx.TensorProto.FLOAT)
        # torch: (pos_weight - 1).mul(target).add_(1), in the tensor's type
        pos_minus_one = spec.pos_weight.astype(dtype) - dtype.type(1)
        log_weight = emitter.op(
            "Add",
            [
                emitter.op("Mul", [_float_const(emitter, pos_minus_one, input), target]),
                _float_const(emitter, 1.0, input),
            ],
        )
        log_sigmoid = emitter.op("Mul", [log_sigmoid, log_weight])
    one_minus_target = emitter.op("Sub", [_float_const(emitter, 1.0, input), target])
    loss = emitter.op("Sub", [emitter.op("Mul", [one_minus_target, input]), log_sigmoid])
    if spec.weight is not None:
        loss = emitter.op("Mul", [loss, _float_const(emitter, spec.weight, input)])
    return _reduce(emitter, loss, reduction)


# torch's binary_cross_entropy_backward divides by max(x (1 - x), EPSILON), EPSILON a float 1e-12 in
# every dtype (float64 gradients show 1 / 9.999999960041972e-13).
_BCE_EPSILON = float(np.float32(1e-12))


def kl_div(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean", log_target: bool = False) -> str:
    """torch.nn.functional.kl_div: ``input`` holds log-probabilities (a LogSoftmax's output).

    ``l = xlogy(y, y) - y * x`` (0 where ``y = 0``), or ``exp(y) * (y - x)`` with ``log_target``;
    then mean (default; over every element, as torch, which warns that it is not the KL
    divergence), sum, none, or ``"batchmean"``: the sum divided by the input's first dim (the
    divergence per sample). The gradient is ``-y`` (``-exp(y)``), divided likewise.
    """
    spec = Loss.kl_div(reduction, log_target)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    if log_target:
        loss = emitter.op("Mul", [emitter.op("Exp", [target]), emitter.op("Sub", [target, input])])
    else:
        zero = _float_const(emitter, 0.0, input)
        # xlogy: y * log(y), 0 where y is 0 (the Where drops the 0 * -inf); NaN stays NaN.
        entropy = emitter.op(
            "Where",
            [emitter.op("Equal", [target, zero]), zero, emitter.op("Mul", [target, emitter.op("Log", [target])])],
        )
        loss = emitter.op("Sub", [entropy, emitter.op("Mul", [target, input])])
    if reduction != "batchmean":
        return _reduce(emitter, loss, reduction)
    total = _reduce(emitter, loss, "sum")
    if emitter.rank(input) == 0:
        return total
    batch = emitter.op("CastLike", [emitter.op("Gather", [emitter.shape(input), emitter.ints(0)], axis=0), total])
    return emitter.op("Div", [total, batch])


def _log1p_of_negative(emitter: GraphEmitter, x: str) -> str:
    """``log1p(-x)`` to a few roundings (ONNX has no Log1p).

    With ``w = 1 - x`` rounded, ``log(w) * -x / (w - 1)``, which cancels the rounding of ``w``,
    and ``-x`` where ``w`` is 1. ``x = 1`` gives -inf (torch then clamps to -100).
    """
    one = _float_const(emitter, 1.0, x)
    w = emitter.op("Sub", [one, x])
    neg_x = emitter.op("Neg", [x])
    corrected = emitter.op("Div", [emitter.op("Mul", [emitter.op("Log", [w]), neg_x]), emitter.op("Sub", [w, one])])
    return emitter.op("Where", [emitter.op("Equal", [w, one]), neg_x, corrected])


def binary_cross_entropy(
    emitter: GraphEmitter,
    input: str,
    target: str,
    weight: Sequence[float] | np.ndarray | None = None,
    reduction: str = "mean",
) -> str:
    """torch.nn.functional.binary_cross_entropy: ``input`` holds probabilities (a Sigmoid's output).

    ``l = (y - 1) * max(log1p(-x), -100) - y * max(log(x), -100)``, times ``weight`` (broadcast to
    the input), then mean (default), sum or none; torch's formula and its clamp, so saturated
    probabilities (0 or 1) give a finite loss. Its gradient is torch's backward, not this graph's
    derivative: build the backward from ``gradient_seed``. Inputs outside [0, 1] give NaN where
    torch raises.

    Args:
        emitter: Receives the nodes.
        input: Probabilities of the positive class, any shape.
        target: Target probabilities, the input's type and shape.
        weight: Weights broadcast to the input (default: ones).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    spec = Loss.binary_cross_entropy(weight, reduction)
    check_target(spec, emitter.value_type(input), emitter.value_type(target), prediction_name=input, target_name=target)
    floor = _float_const(emitter, -100.0, input)
    log_x = emitter.op("Max", [emitter.op("Log", [input]), floor])
    log_1mx = emitter.op("Max", [_log1p_of_negative(emitter, input), floor])
    target_minus_one = emitter.op("Sub", [target, _float_const(emitter, 1.0, input)])
    loss = emitter.op("Sub", [emitter.op("Mul", [target_minus_one, log_1mx]), emitter.op("Mul", [target, log_x])])
    if spec.weight is not None:
        loss = emitter.op("Mul", [loss, _float_const(emitter, spec.weight, input)])
    return _reduce(emitter, loss, reduction)


def _binary_cross_entropy_gradient(emitter: GraphEmitter, spec: Loss, input: str, target: str) -> str:
    """The gradient torch's binary_cross_entropy_backward computes for a seed of ones.

    In its order of operations: ``(x - y) / max((1 - x) * x, EPSILON)``, times the weight,
    divided by the element count for mean.
    """
    one = _float_const(emitter, 1.0, input)
    denominator = emitter.op(
        "Max",
        [emitter.op("Mul", [emitter.op("Sub", [one, input]), input]), _float_const(emitter, _BCE_EPSILON, input)],
    )
    grad = emitter.op("Div", [emitter.op("Sub", [input, target]), denominator])
    if spec.weight is not None:
        grad = emitter.op("Mul", [grad, _float_const(emitter, spec.weight, input)])
    if spec.reduction == "mean":
        count = emitter.op("CastLike", [emitter.op("Size", [input]), input])
        grad = emitter.op("Div", [grad, count])
    return grad


def gradient_seed(
    emitter: GraphEmitter, spec: Loss, prediction: str, target: str | None, loss: str
) -> str | dict[str, str | None]:
    """Where ``build_backward`` starts for the loss ``spec``, emitted as ``loss`` by ``add_loss``.

    The loss value itself (its graph is differentiated, seeded with ones) for every kind but
    ``binary_cross_entropy``: torch's backward of that one is not the derivative of its forward
    (it divides by ``max(x (1 - x), 1e-12)`` where the forward clamps the logs at -100, so a
    saturated wrong prediction still gets a gradient), so this emits torch's gradient of the
    prediction and returns ``{prediction: that gradient}``, a vector-Jacobian seed.
    """
    if spec.kind != "binary_cross_entropy":
        return loss
    assert target is not None
    return {prediction: _binary_cross_entropy_gradient(emitter, spec, prediction, target)}


def add_loss(emitter: GraphEmitter, spec: Loss, prediction: str, target: str | None = None) -> str:
    """Emits the loss ``spec`` describes; returns its value's name (0-D for mean and sum).

    Args:
        emitter: Receives the nodes; its ``types`` should know the prediction and target.
        spec: The loss.
        prediction: The model output the loss reads (logits, log-probabilities, values).
        target: The labels' value (a graph input); None for ``Loss.output()``.

    Raises:
        ValueError: The target is missing, or its type or shape does not fit (``check_target``).
    """
    if spec.needs_target and target is None:
        raise ValueError(f"loss {spec.kind} needs a target, none was given")
    if not spec.needs_target and target is not None:
        raise ValueError(f"loss 'output' reads no target, but target {target!r} was given")
    check_target(
        spec,
        emitter.value_type(prediction),
        emitter.value_type(target) if target is not None else None,
        prediction_name=prediction,
        target_name=target or "",
    )
    if spec.kind == "output":
        return prediction
    assert target is not None
    if spec.kind == "cross_entropy":
        return cross_entropy(
            emitter, prediction, target, spec.weight, spec.ignore_index, spec.reduction, spec.label_smoothing
        )
    if spec.kind == "nll_loss":
        return nll_loss(emitter, prediction, target, spec.weight, spec.ignore_index, spec.reduction)
    if spec.kind == "mse_loss":
        return mse_loss(emitter, prediction, target, spec.reduction)
    if spec.kind == "l1_loss":
        return l1_loss(emitter, prediction, target, spec.reduction)
    if spec.kind == "smooth_l1_loss":
        return smooth_l1_loss(emitter, prediction, target, spec.reduction, spec.beta)
    if spec.kind == "huber_loss":
        return huber_loss(emitter, prediction, target, spec.reduction, spec.delta)
    if spec.kind == "kl_div":
        return kl_div(emitter, prediction, target, spec.reduction, spec.log_target)
    if spec.kind == "binary_cross_entropy":
        return binary_cross_entropy(emitter, prediction, target, spec.weight, spec.reduction)
    return binary_cross_entropy_with_logits(emitter, prediction, target, spec.weight, spec.reduction, spec.pos_weight)
