"""Gradient rule of ScatterND (ai.onnx): reduction none, add and mul; indices get no gradient.

``Y = data`` with the slices ``indices[u]`` replaced by (none), increased by (add) or multiplied by
(mul) ``updates[u]``. Streaming models write their cache this way (the new frame into the state).

- none: ``dData = dY`` with the written slices zeroed (a ScatterND of zeros), ``dUpdates =
  GatherND(dY, indices)``. ONNX requires distinct indices here (with duplicates the output depends
  on the order of the writes, so the gradient is undefined): duplicates in constant indices are
  refused by name; run-time indices are not checked, and each duplicate then gets the slice's
  gradient, as torch's ``index_put_`` backward gives it (torch 2.13: every duplicate, one write wins).
- add: ``dData = dY``, ``dUpdates = GatherND(dY, indices)``; duplicates are defined (each adds) and
  each gets the slice's gradient.
- mul: ``dData = dY * ScatterND(ones, indices, updates, mul)`` (the factor each element was
  multiplied by), ``dUpdates = GatherND(dY * data, indices)`` for distinct indices; with duplicates
  each update's gradient would need the product of the others, so they are refused (constant
  indices) or must not occur (run time).
- max / min (opset 18): refused; the gradient at ties has no convention here yet.

Protos only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule


def _refuse_duplicates(ctx: GradientContext, reduction: str) -> None:
    """Raises where constant indices name one slice twice (the gradient is undefined for none and mul)."""
    indices = ctx.constant_input(1)
    if indices is None or indices.size == 0:
        return
    data_shape = ctx.emitter.static_shape(ctx.input(0))
    rows = indices.reshape(-1, indices.shape[-1]).astype(np.int64)
    if data_shape is not None:  # negative indices count from the end
        rows = np.where(rows < 0, rows + np.asarray(data_shape[: rows.shape[1]], dtype=np.int64), rows)
    unique, counts = np.unique(rows, axis=0, return_counts=True)
    if np.any(counts > 1):
        twice = tuple(int(v) for v in unique[np.argmax(counts > 1)])
        what = (
            "the output depends on the order of the writes (ONNX requires distinct indices)"
            if reduction == "none"
            else "each update's gradient would need the product of the others"
        )
        raise ctx.fail(
            f"indices {ctx.input(1)!r} write the slice {list(twice)} more than once with reduction={reduction!r}: "
            f"{what}, so the gradient is undefined; pass distinct indices, or reduction='add' to accumulate"
        )


@register_gradient_rule("", "ScatterND", differentiable=(0, 2))
def scatter_nd_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dData: dY where nothing was written (none), all of dY (add), dY times the factors (mul); dUpdates: gathered."""
    (dy,) = grad_outputs
    assert dy is not None
    data, indices, updates, e = ctx.input(0), ctx.input(1), ctx.input(2), ctx.emitter
    reduction = str(ctx.attribute("reduction", "none"))
    if reduction not in ("none", "add", "mul"):
        raise ctx.fail(
            f"reduction={reduction!r} has no gradient rule (ties have no convention); "
            "freeze the parameters before it or use reduction 'none', 'add' or 'mul'"
        )
    if reduction != "add":
        _refuse_duplicates(ctx, reduction)
    d_data = d_updates = None
    if ctx.needs(0):
        if reduction == "none":
            zeros = ctx.op("Expand", [ctx.scalar(0.0, dy), e.shape(updates)])
            d_data = ctx.op("ScatterND", [dy, indices, zeros])
        elif reduction == "add":
            d_data = dy
        else:
            ones = ctx.op("Expand", [ctx.scalar(1.0, dy), e.shape(data)])
            factors = ctx.op("ScatterND", [ones, indices, updates], reduction="mul")
            d_data = ctx.op("Mul", [dy, factors])
    if ctx.needs(2):
        source = ctx.op("Mul", [dy, data]) if reduction == "mul" else dy
        d_updates = ctx.op("GatherND", [source, indices])
    return [d_data, None, d_updates]
