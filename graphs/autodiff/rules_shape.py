"""Gradient rules of ops that move, copy or select elements (ai.onnx).

Each rule's docstring states its derivative; ``dY`` is the gradient of the output, ``dX`` that of
the data input. Integer inputs (shapes, axes, indices, bounds) get no gradient. Shapes come from
static types when they are known and from Shape nodes otherwise, so a dynamic batch or sequence
dim survives. Selections with run-time bounds (Slice, Pad, GatherElements before opset 16) send
``dY`` back through the flat positions of X's elements ("positions": 0 .. size(X)-1 in X's
shape), selected by the very node's op and inputs, so ONNX's clamping and negative-index rules
are the forward op's by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
from ortlstm.graphs.autodiff.rules_math import cast_like, require_rank

SCATTER_REDUCTION_OPSET = 16
"""ScatterND / ScatterElements accumulate (reduction='add') from this ai.onnx opset."""

Dim = int | str
"""A 1-D extent: a static int, or a 1-element int64 value computed at run time."""


# ---- helpers -----------------------------------------------------------------------------------


def _dims(ctx: GradientContext, x: str, start: int, stop: int) -> Dim:
    """The product of X's dims start..stop-1, as an int when static, else a [1] int64 value."""
    value = ctx.emitter.value_type(x)
    dims = value.shape[start:stop] if value is not None and value.shape is not None else None
    if dims is not None and all(isinstance(dim, int) for dim in dims):
        product = 1
        for dim in dims:
            product *= int(dim)  # type: ignore[arg-type]
        return product
    e = ctx.emitter
    part = ctx.op("Slice", [e.shape(x), e.ints([start]), e.ints([stop])])
    return part if stop - start == 1 else ctx.op("ReduceProd", [part], keepdims=1)


def _size(ctx: GradientContext, x: str) -> Dim:
    """The element count of X (int when static, else a [1] int64 value)."""
    static = ctx.emitter.static_shape(x)
    if static is not None:
        size = 1
        for dim in static:
            size *= dim
        return size
    return ctx.op("Reshape", [ctx.op("Size", [x]), ctx.emitter.ints([1])])


def _ints(ctx: GradientContext, parts: Sequence[Dim]) -> str:
    """A 1-D int64 value from static ints and [1] values: a constant when every part is static."""
    if all(isinstance(part, int) for part in parts):
        return ctx.emitter.ints([int(part) for part in parts])
    pieces = [ctx.emitter.ints([part]) if isinstance(part, int) else part for part in parts]
    return pieces[0] if len(pieces) == 1 else ctx.op("Concat", pieces, axis=0)


def _times(ctx: GradientContext, a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return ctx.op("Mul", [_ints(ctx, [a]), _ints(ctx, [b])])


def _scalar_int(ctx: GradientContext, dim: Dim) -> str:
    """A 0-D int64 value of a Dim (Range's bounds are scalars)."""
    return ctx.emitter.ints(dim) if isinstance(dim, int) else ctx.op("Reshape", [dim, ctx.emitter.ints([])])


def _zeros(ctx: GradientContext, shape: str, like: str) -> str:
    return ctx.op("Expand", [ctx.scalar(0.0, like), shape])


def _positions(ctx: GradientContext, x: str, size: Dim) -> str:
    """int64 0 .. size(X)-1 in X's shape: X's flat element positions."""
    e = ctx.emitter
    flat = ctx.op("Range", [e.ints(0), _scalar_int(ctx, size), e.ints(1)])
    return ctx.op("Reshape", [flat, e.shape(x)])


def _as_flat_index(ctx: GradientContext, indices: str, dim: Dim) -> str:
    """Indices flattened to 1-D int64, negative ones counted from the end of an axis of size ``dim``."""
    e = ctx.emitter
    flat = ctx.op("Reshape", [indices, e.ints([-1])])
    if e.elem_type(indices) != onnx.TensorProto.INT64:
        flat = ctx.op("Cast", [flat], to=onnx.TensorProto.INT64)
    wrapped = ctx.op("Add", [flat, _ints(ctx, [dim])])
    return ctx.op("Where", [ctx.op("Less", [flat, e.ints(0)]), wrapped, flat])


def _accumulate_rows(ctx: GradientContext, rows: str, index: str, count: Dim, width: Dim, like: str) -> str:
    """[count, width] zeros with ``rows`` [n, width] added at rows ``index`` [n]; repeats accumulate.

    ScatterND with reduction='add' from opset 16; before it a one-hot [count, n] matrix times ``rows``.
    """
    e = ctx.emitter
    if ctx.opset >= SCATTER_REDUCTION_OPSET:
        zeros = _zeros(ctx, _ints(ctx, [count, width]), like)
        return ctx.op("ScatterND", [zeros, e.unsqueeze(index, [1]), rows], reduction="add")
    row_ids = ctx.op("Range", [e.ints(0), _scalar_int(ctx, count), e.ints(1)])
    one_hot = ctx.op("Equal", [e.unsqueeze(row_ids, [1]), e.unsqueeze(index, [0])])
    return ctx.op("MatMul", [cast_like(ctx, one_hot, like), rows])


def _reshape_like_input(ctx: GradientContext, dy: str | None) -> list[str | None]:
    """dX = dY reshaped to X's shape; none for the other inputs (shape, axes)."""
    assert dy is not None
    allowzero = 1 if ctx.opset >= 14 else None  # Shape(X) has a 0 only for an empty X: a real 0
    dx = ctx.op("Reshape", [dy, ctx.emitter.shape(ctx.input(0))], allowzero=allowzero)
    return [dx] + [None] * (len(ctx.node.input) - 1)


# ---- reshapes ----------------------------------------------------------------------------------


@register_gradient_rule("", "Reshape")
def reshape_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = reshape(dY, shape(X)); none for shape."""
    return _reshape_like_input(ctx, grad_outputs[0])


@register_gradient_rule("", "Flatten")
def flatten_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = reshape(dY, shape(X))."""
    return _reshape_like_input(ctx, grad_outputs[0])


@register_gradient_rule("", "Squeeze")
def squeeze_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = reshape(dY, shape(X)); none for axes."""
    return _reshape_like_input(ctx, grad_outputs[0])


@register_gradient_rule("", "Unsqueeze")
def unsqueeze_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = reshape(dY, shape(X)); none for axes."""
    return _reshape_like_input(ctx, grad_outputs[0])


@register_gradient_rule("", "Transpose")
def transpose_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = transpose(dY, inverse of perm) (no perm: reversed axes, its own inverse)."""
    (dy,) = grad_outputs
    perm = ctx.attribute("perm")
    if not isinstance(perm, list):  # absent (None): the reversed axes
        return [ctx.op("Transpose", [dy])]
    inverse = [0] * len(perm)
    for axis, source in enumerate(perm):
        inverse[source] = axis
    return [ctx.op("Transpose", [dy], perm=inverse)]


@register_gradient_rule("", "Expand")
def expand_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY summed over the broadcast axes; none for shape."""
    (dy,) = grad_outputs
    assert dy is not None
    return [ctx.emitter.unbroadcast(dy, ctx.input(0), grad_shape_of=ctx.output(0)), None]


@register_gradient_rule("", "Tile")
def tile_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = sum over the tiles of dY (dY viewed as [r0, d0, r1, d1, ...]); none for repeats."""
    (dy,) = grad_outputs
    assert dy is not None
    x, repeats, e = ctx.input(0), ctx.input(1), ctx.emitter
    rank = require_rank(ctx, x)
    pairs = ctx.op("Concat", [e.unsqueeze(repeats, [1]), e.unsqueeze(e.shape(x), [1])], axis=1)
    tiles = ctx.op("Reshape", [dy, ctx.op("Reshape", [pairs, e.ints([-1])])])
    return [e.reduce_sum(tiles, list(range(0, 2 * rank, 2)), keepdims=False), None]


# ---- joins and splits --------------------------------------------------------------------------


@register_gradient_rule("", "Concat")
def concat_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX_i = the slice of dY that X_i fills along axis (one Split, sizes from the inputs' shapes)."""
    (dy,) = grad_outputs
    assert dy is not None
    inputs = list(ctx.node.input)
    if len(inputs) == 1:
        return [dy]
    axis = int(ctx.attribute("axis"))  # type: ignore[call-overload]
    sizes: list[Dim] = []
    for name in inputs:
        value = ctx.emitter.value_type(name)
        dim = value.shape[axis] if value is not None and value.shape else None
        sizes.append(
            dim if isinstance(dim, int) else ctx.op("Gather", [ctx.emitter.shape(name), ctx.emitter.ints([axis])])
        )
    parts = ctx.emitter.op_multi(
        "Split",
        [dy, _ints(ctx, sizes)],
        outputs=len(inputs),
        axis=axis,
        name=f"{ctx.node.name or ctx.node.op_type}_grad/Split",
    )
    return [part if ctx.needs(i) else None for i, part in enumerate(parts)]


@register_gradient_rule("", "Split")
def split_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = concat(dY_i) along axis, zeros for outputs no gradient reaches; none for split."""
    x, axis = ctx.input(0), int(ctx.attribute("axis", 0))  # type: ignore[call-overload]
    pieces = [
        dy if dy is not None else _zeros(ctx, ctx.emitter.shape(ctx.require_output(i)), x)
        for i, dy in enumerate(grad_outputs)
    ]
    return [pieces[0] if len(pieces) == 1 else ctx.op("Concat", pieces, axis=axis), None]


# ---- selections --------------------------------------------------------------------------------


def _static_slice_pads(ctx: GradientContext) -> list[int] | None:
    """Pad amounts that turn dY back into X's shape, when the slice is static with unit steps.

    ONNX Slice: a negative start or end counts from the end of the axis; both are then clamped to
    [0, dim] (unit steps). Returns None for anything else (run-time bounds, other steps, an
    unknown shape, an empty selection), which the general rule handles.
    """
    shape = ctx.emitter.static_shape(ctx.input(0))
    starts, ends = ctx.constant_input(1), ctx.constant_input(2)
    axes = ctx.constant_input(3) if ctx.input(3) else np.arange(0 if starts is None else starts.size)
    steps = ctx.constant_input(4) if ctx.input(4) else None
    if shape is None or starts is None or ends is None or axes is None or (ctx.input(4) and steps is None):
        return None
    if steps is not None and not np.all(steps == 1):
        return None
    before, after = [0] * len(shape), [0] * len(shape)
    for start, end, axis in zip(starts.reshape(-1), ends.reshape(-1), axes.reshape(-1), strict=True):
        dim = shape[int(axis) % len(shape)]
        first = min(max(int(start) + dim if start < 0 else int(start), 0), dim)
        last = min(max(int(end) + dim if end < 0 else int(end), 0), dim)
        if last <= first:
            return None
        before[int(axis) % len(shape)], after[int(axis) % len(shape)] = first, dim - last
    return before + after


@register_gradient_rule("", "Slice")
def slice_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = zeros with dY scattered to the positions the slice selected; none for starts, ends, axes, steps.

    The positions are X's flat positions sliced by the node's own (run-time) inputs, so clamped
    and negative bounds and negative steps select exactly what the forward Slice selected.
    """
    (dy,) = grad_outputs
    assert dy is not None
    x, e = ctx.input(0), ctx.emitter
    pads = _static_slice_pads(ctx)
    if pads is not None:  # constant bounds, unit steps, static shape: pad dY back to X's shape
        return [ctx.op("Pad", [dy, e.ints(pads)])] + [None] * (len(ctx.node.input) - 1)
    size = _size(ctx, x)
    picked = ctx.op("Slice", [_positions(ctx, x, size), *ctx.node.input[1:]])
    flat = ctx.op(
        "ScatterElements",  # each position at most once: no reduction needed
        [
            _zeros(ctx, _ints(ctx, [size]), x),
            ctx.op("Reshape", [picked, e.ints([-1])]),
            ctx.op("Reshape", [dy, e.ints([-1])]),
        ],
        axis=0,
    )
    return [ctx.op("Reshape", [flat, e.shape(x)])] + [None] * (len(ctx.node.input) - 1)


@register_gradient_rule("", "Pad")
def pad_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = pad(dY, -pads) in constant mode; edge/reflect/wrap sum dY into the positions they copied."""
    (dy,) = grad_outputs
    assert dy is not None
    x, e = ctx.input(0), ctx.emitter
    pads, axes = ctx.input(1), ctx.input(3)
    mode = ctx.attribute("mode", "constant")
    nones = [None] * (len(ctx.node.input) - 1)
    if mode == "constant":
        # The inverse pad crops what was added and zero-pads what a negative pad cropped.
        negated = ctx.op("Neg", [pads])
        return [ctx.op("Pad", [dy, negated, "", axes] if axes else [dy, negated]), *nones]
    # edge / reflect / wrap repeat elements of X: accumulate.
    size = _size(ctx, x)
    positions = ctx.op("Pad", [_positions(ctx, x, size), pads, "", axes][: 4 if axes else 2], mode=mode)
    index = ctx.op("Reshape", [positions, e.ints([-1])])
    rows = ctx.op("Reshape", [dy, e.ints([-1, 1])])
    flat = _accumulate_rows(ctx, rows, index, size, 1, x)
    return [ctx.op("Reshape", [flat, e.shape(x)]), *nones]


@register_gradient_rule("", "Gather")
def gather_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = zeros with dY's slices added at the indices along axis (repeats accumulate); none for indices."""
    (dy,) = grad_outputs
    assert dy is not None
    x, e = ctx.input(0), ctx.emitter
    rank = require_rank(ctx, x)
    axis = int(ctx.attribute("axis", 0)) % rank  # type: ignore[call-overload]
    count, after = _dims(ctx, x, axis, axis + 1), _dims(ctx, x, axis + 1, rank)
    index = _as_flat_index(ctx, ctx.input(1), count)
    if axis == 0:  # dY is [indices..., rest]: rows of X directly
        rows = ctx.op("Reshape", [dy, _ints(ctx, [-1, after])])
        grad = _accumulate_rows(ctx, rows, index, count, after, x)
        return [ctx.op("Reshape", [grad, e.shape(x)]), None]
    # dY is [before, indices..., after]: bring the indices' axis first, accumulate rows, put it back.
    before = _dims(ctx, x, 0, axis)
    blocks = ctx.op("Transpose", [ctx.op("Reshape", [dy, _ints(ctx, [before, -1, after])])], perm=[1, 0, 2])
    width = _times(ctx, before, after)
    rows = ctx.op("Reshape", [blocks, _ints(ctx, [-1, width])])
    grad = _accumulate_rows(ctx, rows, index, count, width, x)
    grad = ctx.op("Transpose", [ctx.op("Reshape", [grad, _ints(ctx, [count, before, after])])], perm=[1, 0, 2])
    return [ctx.op("Reshape", [grad, e.shape(x)]), None]


@register_gradient_rule("", "GatherElements")
def gather_elements_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = zeros with dY added at the indexed elements (repeats accumulate); none for indices."""
    (dy,) = grad_outputs
    assert dy is not None
    x, indices, e = ctx.input(0), ctx.input(1), ctx.emitter
    axis = int(ctx.attribute("axis", 0))  # type: ignore[call-overload]
    if ctx.opset >= SCATTER_REDUCTION_OPSET:
        zeros = _zeros(ctx, e.shape(x), x)
        return [ctx.op("ScatterElements", [zeros, indices, dy], axis=axis, reduction="add"), None]
    size = _size(ctx, x)
    picked = ctx.op("GatherElements", [_positions(ctx, x, size), indices], axis=axis)
    index = ctx.op("Reshape", [picked, e.ints([-1])])
    rows = ctx.op("Reshape", [dy, e.ints([-1, 1])])
    flat = _accumulate_rows(ctx, rows, index, size, 1, x)
    return [ctx.op("Reshape", [flat, e.shape(x)]), None]
