"""torch.nn.utils.clip_grad_norm_ and clip_grad_value_ as ONNX nodes.

clip_grad_norm_ scales all gradients together to a total norm of at most max_norm;
clip_grad_value_ clamps every gradient element to [-clip_value, clip_value].
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

from ortlstm.graphs.emit.emitter import GraphEmitter
from ortlstm.graphs.options import BUILDER_DEFAULTS


@dataclasses.dataclass(frozen=True)
class ClipGradNorm:
    """torch.nn.utils.clip_grad_norm_'s settings.

    Attributes:
        max_norm: Largest allowed total norm.
        norm_type: The p of the p-norm (``math.inf`` for the largest absolute value).
    """

    max_norm: float
    norm_type: float = BUILDER_DEFAULTS["clip_norm_type"]

    def __post_init__(self) -> None:
        # torch does not check max_norm: a negative one multiplies every gradient by a negative coefficient.
        max_norm = self.max_norm
        if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not max_norm >= 0:
            raise ValueError(
                f"clip_grad_norm must be a number >= 0 (the largest total gradient norm), got {max_norm!r}; "
                "a negative one would flip the gradients' sign: pass e.g. 1.0, or None"
            )
        if isinstance(self.norm_type, bool) or not isinstance(self.norm_type, numbers.Real) or not self.norm_type > 0:
            raise ValueError(f"clip_grad_norm norm_type must be positive or inf, got {self.norm_type!r}")


@dataclasses.dataclass(frozen=True)
class ClipGradValue:
    """torch.nn.utils.clip_grad_value_'s setting.

    Attributes:
        clip_value: Every gradient element is clamped to ``[-clip_value, clip_value]``.
    """

    clip_value: float

    def __post_init__(self) -> None:
        value = self.clip_value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"clip_grad_value must be a finite number > 0, got {value!r}; pass e.g. 1.0, or None")


def clip_grad_value(emitter: GraphEmitter, grads: Sequence[str], clip_value: float) -> list[str]:
    """torch.nn.utils.clip_grad_value_: clamps every gradient element to [-clip_value, clip_value].

    One ONNX ``Clip`` per gradient, its min and max 0-D constants of the gradient's type. A NaN
    element stays NaN (Clip, like torch.clamp, propagates it), so a non-finite check still sees it.

    Args:
        emitter: Receives the nodes.
        grads: The gradient values.
        clip_value: The bound, finite and > 0.

    Returns:
        The clipped gradients, same order.
    """
    ClipGradValue(clip_value)  # validates
    clipped = []
    for grad in grads:
        low, high = emitter.scalar_like(-clip_value, grad), emitter.scalar_like(clip_value, grad)
        clipped.append(emitter.op("Clip", [grad, low, high]))
        known = emitter.value_type(grad)
        if known is not None:
            emitter.set_type(clipped[-1], known.elem_type, known.shape)
    return clipped


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
    emitter: GraphEmitter, grads: Sequence[str], max_norm: float, norm_type: float = BUILDER_DEFAULTS["clip_norm_type"]
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


def clip_settings(
    clip_grad_norm: float | None,
    clip_norm_type: float = BUILDER_DEFAULTS["clip_norm_type"],
    clip_grad_value: float | None = BUILDER_DEFAULTS["clip_grad_value"],
) -> ClipGradNorm | ClipGradValue | None:
    """The gradient clipping asked for: by total norm, by value, or none (validated).

    Raises:
        ValueError: Both ``clip_grad_norm`` and ``clip_grad_value`` given, or a bad value.
    """
    if clip_grad_norm is not None and clip_grad_value is not None:
        raise ValueError(
            f"clip_grad_norm={clip_grad_norm!r} and clip_grad_value={clip_grad_value!r} given together: their order "
            "would be ambiguous (torch users call clip_grad_norm_ and clip_grad_value_ in their own order); pass one"
        )
    if clip_grad_value is not None:
        return ClipGradValue(clip_grad_value)
    if clip_grad_norm is not None:
        return ClipGradNorm(clip_grad_norm, clip_norm_type)
    return None
