"""Type and shape words of the loss checks' messages, and torch's broadcasting rule for a target's shape.

Pure functions of element types and shapes (nothing here reads the loss table), shared by the
table's checks (``base``) and the family modules, which import them from ``base`` as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx.helper

if TYPE_CHECKING:
    from ortlstm.graphs.emit.emitter import ValueType


def type_name(elem_type: int) -> str:
    """``float32`` for TensorProto.FLOAT, the ONNX name for types NumPy lacks."""
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def shape_text(shape: Sequence[int | str | None] | None) -> str:
    """``[4, batch, ?]``, or "of unknown rank"."""
    if shape is None:
        return "of unknown rank"
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in shape) + "]"


def shape_conflict(expected: Sequence[int | str | None], actual: Sequence[int | str | None]) -> bool:
    """The ranks differ, or two static dims do (symbolic and unknown dims match anything)."""
    return len(expected) != len(actual) or any(
        isinstance(e, int) and isinstance(a, int) and e != a for e, a in zip(expected, actual, strict=False)
    )


def described(value_type: ValueType | None) -> str:
    """``got float32 [4, 5]`` for an error message."""
    elem, shape = (value_type.elem_type, value_type.shape) if value_type is not None else (0, None)
    return f"got {type_name(elem) if elem else 'an unknown type'} {shape_text(shape)}"


def broadcast_problem(
    broadcast: str, prediction: Sequence[int | str | None], target: Sequence[int | str | None]
) -> str | None:
    """Why a target of shape ``target`` is refused for a prediction of shape ``prediction``, or None.

    ``broadcast`` is the loss's rule (``BROADCASTS``): what torch refuses is refused. Dims are
    aligned from the right (NumPy's and torch's broadcasting); unknown and symbolic dims pass. A
    target with more axes than the prediction is refused by every rule, also where torch would
    broadcast the loss to a larger shape: a train step declares the target's rank (the
    prediction's).
    """
    if broadcast == "exact":
        if not shape_conflict(prediction, target):
            return None
        return "a target of another shape is refused, as torch refuses it; pass a target of the prediction's shape"
    if len(target) > len(prediction):
        larger = "would broadcast the loss to a larger shape"
        verdict = {"warn": f"{larger} with its size warning", "silent": larger, "into": "refuses it too"}[broadcast]
        return (
            f"it has more axes than the prediction (torch {verdict}); a train step takes at most the "
            f"prediction's {len(prediction)} axes: pass a target of the prediction's shape"
        )
    offset = len(prediction) - len(target)
    for axis, (p, t) in enumerate(zip(prediction[offset:], target, strict=True), start=offset):
        if not (isinstance(p, int) and isinstance(t, int)) or p == t or t == 1:
            continue
        if p != 1:
            return (
                f"aligned from the right as torch broadcasts, its {t} meets the prediction's {p} at axis {axis}, "
                f"and neither is 1 (torch raises: 'The size of tensor ... must match the size of tensor ... at "
                f"non-singleton dimension {axis}'); pass a target of the prediction's shape"
            )
        if broadcast == "into":
            return (
                f"its {t} at axis {axis} would broadcast the prediction's 1 to a larger loss, which torch refuses "
                "(it writes the loss into a tensor of the prediction's shape); pass a target of the prediction's shape"
            )
    return None
