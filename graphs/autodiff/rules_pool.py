"""Gradient rules of pooling (ai.onnx): MaxPool, AveragePool, LpPool and their Global forms.

1-D, 2-D and 3-D windows with kernel_shape, strides, pads, auto_pad, dilations and ceil_mode:

- MaxPool: ``dX`` gets each window's ``dY`` at the window's argmax, the flat index onnxruntime's
  own MaxPool reports in its Indices output (the forward node's, or a second MaxPool's when the
  forward asks for column-major indices), added up where windows overlap.
- AveragePool: linear, so ``dX = B^T (dY / divisor)`` with ``B`` the 0/1 window membership of X's
  elements: one ConvTranspose with a kernel of ones over the batch and channels folded together,
  cut to X's extent. The divisor of each window is taken from the forward op itself:
  ``divisor = count / AveragePool(ones)``, ``count`` the X elements the window covers (a Conv of
  ones), so count_include_pad, ceil_mode windows and the opset's edge conventions are the
  kernel's by construction.
- LpPool: ``Y = (sum |X|^p)^(1/p)`` per window, so ``dX = sign(X) |X|^(p-1) B^T (dY Y^(1-p))``
  with the same ``B^T`` as AveragePool's (other exporters write it; torch writes ``nn.LPPool*d``
  as Pow, AveragePool and Mul).
- The global pools reduce over all spatial axes at once.

Ties (equal maxima in one window) follow onnxruntime's Indices: the whole ``dY`` goes to the first
maximum in the window's row-major scan order. torch does the same for ``max_pool*d`` and
``adaptive_max_pool*d`` on the CPU (one index per window); ``torch.amax`` splits instead (see the
ReduceMax rule). Dims may be dynamic: extents come from Shape nodes when types do not give them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import onnx

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
from ortlstm.graphs.autodiff.rules_conv import _Geometry, _ints_attribute, _run_time_same_pads, _spatial_shape
from ortlstm.graphs.autodiff.rules_math import cast_like
from ortlstm.graphs.autodiff.rules_shape import SCATTER_REDUCTION_OPSET


def _window(ctx: GradientContext) -> _Geometry:
    """The pool's windows as a Conv geometry (group 1); pads None for SAME (computed at run time)."""
    kernel = _ints_attribute(ctx, "kernel_shape", [])
    if not kernel:
        raise ctx.fail("the node has no kernel_shape (required by the ONNX schema)")
    r = len(kernel)
    auto_pad = str(ctx.attribute("auto_pad", "NOTSET"))
    if auto_pad == "NOTSET":
        pads: list[int] | None = _ints_attribute(ctx, "pads", [0] * (2 * r))
    elif auto_pad == "VALID":
        pads = [0] * (2 * r)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = None
    else:
        raise ctx.fail(f"auto_pad {auto_pad!r} is not an ONNX auto_pad value")
    spatial = _static_spatial(ctx, ctx.input(0))
    strides = _ints_attribute(ctx, "strides", [1] * r)
    dilations = _ints_attribute(ctx, "dilations", [1] * r)
    return _Geometry(r, kernel, strides, dilations, 1, auto_pad, pads, spatial)


def _begin_end_pads(ctx: GradientContext, window: _Geometry) -> tuple[str, str]:
    """Begin and end pads per spatial axis as 1-D int64 values."""
    if window.pads is None:
        return _run_time_same_pads(ctx, window, ctx.input(0))
    r = window.spatial_rank
    return ctx.emitter.ints(window.pads[:r]), ctx.emitter.ints(window.pads[r:])


def _zeros(ctx: GradientContext, shape: str) -> str:
    return ctx.op("Expand", [ctx.scalar(0.0, ctx.input(0)), shape])


def _flat(ctx: GradientContext, value: str) -> str:
    return ctx.op("Reshape", [value, ctx.emitter.ints([-1])])


def _as_input(ctx: GradientContext, value: str) -> str:
    return ctx.op("Reshape", [value, ctx.emitter.shape(ctx.input(0))])


def _size(ctx: GradientContext, value: str) -> str:
    """The element count of a value as a [1] int64 value (a constant when static)."""
    static = ctx.emitter.static_shape(value)
    if static is not None:
        return ctx.emitter.ints([math.prod(static)])
    return ctx.op("Reshape", [ctx.op("Size", [value]), ctx.emitter.ints([1])])


def _forward_attributes(ctx: GradientContext, **changes: object) -> dict[str, Any]:
    """The forward node's attributes, with ``changes`` (None drops one)."""
    attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in ctx.node.attribute}
    attributes.update(changes)
    return {name: value for name, value in attributes.items() if value is not None}


def _max_pool_indices(ctx: GradientContext) -> str:
    """Flat row-major indices of each window's maximum into X (N and C included), onnxruntime's choice."""
    if int(ctx.attribute("storage_order", 0)) == 0:  # type: ignore[call-overload]
        return ctx.require_output(1)
    _, indices = ctx.emitter.op_multi(
        "MaxPool",
        [ctx.input(0)],
        outputs=2,
        name=f"{ctx.node.name or ctx.node.op_type}_grad/MaxPool",
        **_forward_attributes(ctx, storage_order=None),
    )
    return indices


def _scatter_windows(ctx: GradientContext, window: _Geometry, dy: str, indices: str) -> str:
    """The flat dX: zeros of X's size with each dY added at its index.

    From opset 16 one ScatterElements with reduction='add'. Before it, windows are split into
    classes whose windows are disjoint (output positions equal modulo ceil(k_eff / s) per axis),
    so each class's indices are distinct and a plain scatter is exact; the classes are summed.
    """
    e = ctx.emitter
    zeros = _zeros(ctx, _size(ctx, ctx.input(0)))
    if ctx.opset >= SCATTER_REDUCTION_OPSET:
        return ctx.op("ScatterElements", [zeros, _flat(ctx, indices), _flat(ctx, dy)], axis=0, reduction="add")
    periods = [-(-extent // stride) for extent, stride in zip(window.effective_kernel, window.strides, strict=True)]
    if all(period == 1 for period in periods):
        return ctx.op("ScatterElements", [zeros, _flat(ctx, indices), _flat(ctx, dy)], axis=0)
    parts = []
    for starts in itertools.product(*(range(period) for period in periods)):
        bounds = [e.ints(list(starts)), e.ints([2**62] * len(periods)), e.ints(window.spatial_axes), e.ints(periods)]
        part_dy, part_indices = (ctx.op("Slice", [value, *bounds]) for value in (dy, indices))
        parts.append(ctx.op("ScatterElements", [zeros, _flat(ctx, part_indices), _flat(ctx, part_dy)], axis=0))
    return e.sum(parts)


@register_gradient_rule("", "MaxPool", differentiable=(0,))
def max_pool_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX[i] = sum of dY over the windows whose (first) maximum is X[i].

    Ties go to one element per window, the first maximum in row-major scan order (onnxruntime's
    Indices), as torch's max_pool*d on the CPU; none for the Indices output.
    """
    dy = grad_outputs[0]
    assert dy is not None
    window = _window(ctx)
    return [_as_input(ctx, _scatter_windows(ctx, window, dy, _max_pool_indices(ctx)))]


@register_gradient_rule("", "AveragePool", differentiable=(0,))
def average_pool_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX[i] = sum over the windows w covering X[i] of dY[w] / divisor[w]."""
    (dy,) = grad_outputs
    assert dy is not None
    x, y, e = ctx.input(0), ctx.output(0), ctx.emitter
    window = _window(ctx)
    r, axes = window.spatial_rank, window.spatial_axes
    ceil_mode = bool(ctx.attribute("ceil_mode", 0))
    spatial = _spatial_shape(ctx, window, x)
    ones = ctx.op("Expand", [ctx.scalar(1.0, x), ctx.op("Concat", [e.ints([1, 1]), spatial], axis=0)])
    kernel = ctx.op("Expand", [ctx.scalar(1.0, x), e.ints([1, 1, *window.kernel])])
    # count[w]: X's elements in window w. Zeros stand for the pads; under ceil_mode the last
    # windows may reach s - 1 past the end pad, and the count is cut to Y's windows.
    begins, ends = _begin_end_pads(ctx, window)
    if ceil_mode:
        ends = ctx.op("Add", [ends, e.ints([s - 1 for s in window.strides])])
    padded = ctx.op("Pad", [ones, ctx.op("Concat", [e.ints([0, 0]), begins, e.ints([0, 0]), ends], axis=0)])
    count = ctx.op("Conv", [padded, kernel], **_sliding(window))
    y_spatial = _spatial_tail(ctx, y, r)
    if ceil_mode:
        count = ctx.op("Slice", [count, e.ints([0] * r), y_spatial, e.ints(axes)])
    # 1 / divisor[w] = AveragePool(ones)[w] / count[w] (count >= 1 for every window ONNX allows).
    mean_of_ones = ctx.op("AveragePool", [ones], **_forward_attributes(ctx))
    inverse_divisor = ctx.op("Div", [mean_of_ones, ctx.op("Max", [count, ctx.scalar(1.0, x)])])
    scaled = ctx.op("Mul", [dy, inverse_divisor])
    return [_spread_over_windows(ctx, window, scaled, kernel, begins, spatial, y_spatial)]


def _sliding(window: _Geometry) -> dict[str, list[int]]:
    """The Conv / ConvTranspose attributes that slide a kernel of ones over the pool's windows."""
    return {"strides": window.strides, "dilations": window.dilations, "kernel_shape": window.kernel}


def _spread_over_windows(
    ctx: GradientContext, window: _Geometry, per_window: str, kernel: str, begins: str, spatial: str, y_spatial: str
) -> str:
    """B^T per_window, shaped as X: each window's value added to every X element the window covers.

    One ConvTranspose with ``kernel`` (ones, [1, 1, *kernel_shape]) over the batch and channels
    folded together spreads the windows over the padded input; X's part of it is cut out
    (``begins``: the begin pads; ``spatial`` and ``y_spatial``: X's and Y's dims after N and C).
    """
    e, r = ctx.emitter, window.spatial_rank
    folded = ctx.op("Reshape", [per_window, ctx.op("Concat", [e.ints([-1, 1]), y_spatial], axis=0)])
    full = ctx.op("ConvTranspose", [folded, kernel], **_sliding(window))
    if any(s > 1 for s in window.strides):  # up to s - 1 elements after the last window
        full = ctx.op("Pad", [full, e.ints([0, 0] + [0] * r + [0, 0] + [s - 1 for s in window.strides])])
    cut = ctx.op("Slice", [full, begins, ctx.op("Add", [begins, spatial]), e.ints(window.spatial_axes)])
    return _as_input(ctx, cut)


def _lp_factors(ctx: GradientContext, dy: str) -> tuple[str, str]:
    """What LpPool and GlobalLpPool share, with Y = (sum |X|^p)^(1/p) per window.

    Returns ``(per_window, per_element)``: dY * Y^(1-p), 0 where Y == 0 (a window of zeros, where
    the derivative is not defined: 0 as torch's abs at 0), and sign(X) |X|^(p-1); dX is their
    product summed over the windows covering each element.
    """
    x, y = ctx.input(0), ctx.output(0)
    p = int(ctx.attribute("p", 2))  # type: ignore[call-overload]
    if p < 1:
        raise ctx.fail(f"p={p} is not a norm (p >= 1 is needed for a gradient)")
    per_window = dy
    if p > 1:
        zero = ctx.scalar(0.0, y)
        powered = ctx.op("Mul", [dy, ctx.op("Pow", [y, ctx.scalar(float(1 - p), y)])])
        per_window = ctx.op("Where", [ctx.op("Greater", [y, zero]), powered, zero])
    if p == 1:
        return per_window, ctx.op("Sign", [x])
    if p == 2:
        return per_window, x
    magnitude = ctx.op("Pow", [ctx.op("Abs", [x]), ctx.scalar(float(p - 1), x)])
    return per_window, ctx.op("Mul", [ctx.op("Sign", [x]), magnitude])


@register_gradient_rule("", "LpPool", differentiable=(0,))
def lp_pool_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX[i] = sign(X[i]) |X[i]|^(p-1) * sum over the windows w covering X[i] of dY[w] * Y[w]^(1-p).

    Pads count as zeros (they add nothing to a window's sum), as onnxruntime's LpPool.
    """
    (dy,) = grad_outputs
    assert dy is not None
    x, y, e = ctx.input(0), ctx.output(0), ctx.emitter
    window = _window(ctx)
    per_window, per_element = _lp_factors(ctx, dy)
    kernel = ctx.op("Expand", [ctx.scalar(1.0, x), e.ints([1, 1, *window.kernel])])
    begins, _ = _begin_end_pads(ctx, window)
    spatial, y_spatial = _spatial_shape(ctx, window, x), _spatial_tail(ctx, y, window.spatial_rank)
    spread = _spread_over_windows(ctx, window, per_window, kernel, begins, spatial, y_spatial)
    return [ctx.op("Mul", [per_element, spread])]


def _static_spatial(ctx: GradientContext, value: str) -> list[int] | None:
    """A value's dims after N and C when they are all static (N may be dynamic)."""
    found = ctx.emitter.value_type(value)
    dims = found.shape[2:] if found is not None and found.shape is not None else None
    return [int(dim) for dim in dims] if dims is not None and all(isinstance(dim, int) for dim in dims) else None  # type: ignore[arg-type]


def _spatial_tail(ctx: GradientContext, value: str, rank: int) -> str:
    """A value's dims after N and C as 1-D int64 (a constant when static)."""
    static = _static_spatial(ctx, value)
    if static is not None:
        return ctx.emitter.ints(static)
    return ctx.op("Slice", [ctx.emitter.shape(value), ctx.emitter.ints([2]), ctx.emitter.ints([2 + rank])])


@register_gradient_rule("", "GlobalAveragePool")
def global_average_pool_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY / (number of spatial positions), broadcast over the spatial axes."""
    (dy,) = grad_outputs
    assert dy is not None
    x, y, e = ctx.input(0), ctx.output(0), ctx.emitter
    spatial = _static_spatial(ctx, x)
    if spatial is not None:
        count = ctx.scalar(float(math.prod(spatial)), x)
    else:
        count = cast_like(ctx, ctx.op("Div", [ctx.op("Size", [x]), ctx.op("Size", [y])]), x)
    return [ctx.op("Expand", [ctx.op("Div", [dy, count]), e.shape(x)])]


@register_gradient_rule("", "GlobalLpPool")
def global_lp_pool_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = sign(X) |X|^(p-1) * dY * Y^(1-p), Y = (sum over the spatial axes of |X|^p)^(1/p) per (n, c)."""
    (dy,) = grad_outputs
    assert dy is not None
    per_window, per_element = _lp_factors(ctx, dy)
    return [ctx.op("Mul", [per_element, per_window])]


@register_gradient_rule("", "GlobalMaxPool")
def global_max_pool_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY at the first maximum of each (n, c) plane (row-major), zero elsewhere.

    Ties go to the first maximum only, as torch's adaptive_max_pool*d(x, 1); torch.amax (and the
    ReduceMax rule, which torch exports adaptive max pools to) splits dY among tied maxima instead.
    """
    (dy,) = grad_outputs
    assert dy is not None
    x, e = ctx.input(0), ctx.emitter
    planes = ctx.op("Reshape", [x, e.ints([0, 0, -1])])  # [N, C, positions]
    first_max = ctx.op("ArgMax", [planes], axis=2, keepdims=1, select_last_index=0)
    per_plane = ctx.op("Reshape", [dy, e.ints([0, 0, 1])])
    dx = ctx.op("ScatterElements", [_zeros(ctx, e.shape(planes)), first_max, per_plane], axis=2)
    return [_as_input(ctx, dx)]
