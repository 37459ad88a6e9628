"""Gradient rule of ConvTranspose (ai.onnx): N-D, strides, pads, output_padding, dilations, group, output_shape.

ConvTranspose is the adjoint of Conv: for X ``[N, C, in...]`` and W ``[C, M/group, k...]``,
``Y_full[n, m, i*s + k*d] += X[n, c, i] W[c, m, k]`` over ``s*(in-1) + k_eff + output_padding``
positions per axis, and Y is that cut by the pads (begin, end). So, with ``dY_full`` dY padded back
by the same pads:

- ``dX = conv(dY, W)`` with the forward's strides, dilations, group and pads (W's layout
  ``[C, M/group, k...]`` is a Conv weight mapping M channels to C); its output length
  ``floor((s*(in-1) + output_padding) / s) + 1`` is ``in`` once the last ``s * (output_padding // s)``
  positions, which no window reaches, are dropped (output_padding >= stride: onnxruntime 1.19 runs it);
- ``dW[c, m, k] = sum_{n, i} X[n, c, i] dY_full[n, m, i*s + k*d]``: Conv's dW with the roles of X
  and dY swapped (dY the Conv's input, X its output gradient), one ``ortlstm::ConvGrad`` node where
  the library may be used, otherwise rules_conv's im2col Conv and MatMul;
- ``dB = sum(dY)`` over the batch and spatial axes.

The pads are resolved as onnxruntime resolves them (the ONNX spec's rule): with ``output_shape``
(or ``auto_pad`` SAME_*, whose output shape is ``in * s``) the total padding
``s*(in-1) + output_padding + k_eff - out`` is split with the odd one at the end for SAME_UPPER and at
the start otherwise; an ``output_shape`` beyond the full extent leaves trailing positions that only
the bias reaches (their dY is cut before the convolutions). Those two need X's spatial dims at
build time; explicit pads work with any shapes. Protos only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
from ortlstm.graphs.autodiff.rules_conv import _CONV_GRAD_TYPES, _Geometry, _grad_w, _ints_attribute
from ortlstm.ops import schema
from ortlstm.ops.nodes import ordered_inputs

_INT64_MAX = 2**63 - 1


def _static_spatial(ctx: GradientContext, name: str) -> list[int] | None:
    value_type = ctx.emitter.value_type(name)
    if value_type is None or value_type.shape is None or not all(isinstance(d, int) for d in value_type.shape[2:]):
        return None
    return [int(d) for d in value_type.shape[2:]]  # type: ignore[arg-type]


def _kernel(ctx: GradientContext, spatial_rank: int) -> list[int]:
    kernel_attribute = _ints_attribute(ctx, "kernel_shape", [])
    if kernel_attribute:
        return kernel_attribute
    w_type = ctx.emitter.value_type(ctx.input(1))
    w_shape = w_type.shape if w_type is not None else None
    if w_shape is not None and len(w_shape) == spatial_rank + 2 and all(isinstance(d, int) for d in w_shape[2:]):
        return [int(d) for d in w_shape[2:]]  # type: ignore[arg-type]
    raise ctx.fail("the kernel shape is unknown: give the node kernel_shape or W a static shape")


def _rank(ctx: GradientContext) -> int:
    for name in (ctx.input(1), ctx.input(0)):
        value_type = ctx.emitter.value_type(name)
        if value_type is not None and value_type.rank is not None:
            return value_type.rank
    kernel_attribute = _ints_attribute(ctx, "kernel_shape", [])
    if kernel_attribute:
        return len(kernel_attribute) + 2
    raise ctx.fail("the rank of X and W is unknown; run onnx shape inference first")


def _pads(
    ctx: GradientContext, spatial_rank: int, kernel: list[int], strides: list[int], dilations: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """Begin and end pads of the forward as onnxruntime applies them, and output_padding.

    An end pad < 0 is a zero tail of Y (an output_shape past the full extent, which onnxruntime
    1.19 runs and newer versions refuse).
    """
    output_padding = _ints_attribute(ctx, "output_padding", [0] * spatial_rank)
    for axis, (extra, s, d) in enumerate(zip(output_padding, strides, dilations, strict=True)):
        if extra >= max(s, d) or extra < 0:
            raise ctx.fail(
                f"output_padding[{axis}] = {extra} must be >= 0 and less than the stride ({s}) or dilation ({d})"
            )
    auto_pad = str(ctx.attribute("auto_pad", "NOTSET"))
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.fail(f"auto_pad {auto_pad!r} is not an ONNX auto_pad value")
    output_shape = _ints_attribute(ctx, "output_shape", [])
    same = auto_pad in ("SAME_UPPER", "SAME_LOWER")
    if not output_shape and not same:
        zeros = [0] * (2 * spatial_rank)
        pads = zeros if auto_pad == "VALID" else _ints_attribute(ctx, "pads", zeros)
        return pads[:spatial_rank], pads[spatial_rank:], output_padding
    spatial = _static_spatial(ctx, ctx.input(0))
    if spatial is None:
        setting = "output_shape" if output_shape else f"auto_pad={auto_pad}"
        raise ctx.fail(
            f"{setting} places the output by X's spatial dims, which are not static here; "
            "give the model's inputs fixed shapes (fixed_shapes=...) or export it with explicit pads"
        )
    if output_shape:
        target = output_shape[-spatial_rank:]
    else:
        target = [size * s for size, s in zip(spatial, strides, strict=True)]
    begins, ends = [], []
    for size, k, s, d, extra, out in zip(spatial, kernel, strides, dilations, output_padding, target, strict=True):
        total = (size - 1) * s + extra + (k - 1) * d + 1 - out
        if total < 0:  # onnxruntime pads nothing and appends zeros (plus the bias)
            begins.append(0)
            ends.append(total)
            continue
        begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        begins.append(begin)
        ends.append(total - begin)
    return begins, ends, output_padding


@register_gradient_rule("", "ConvTranspose")
def conv_transpose_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = conv(dY, W), dW = Conv's dW with X and dY swapped, dB = sum(dY) over N and space."""
    (dy,) = grad_outputs
    assert dy is not None
    x, w, e = ctx.input(0), ctx.input(1), ctx.emitter
    spatial_rank = _rank(ctx) - 2
    kernel = _kernel(ctx, spatial_rank)
    strides = _ints_attribute(ctx, "strides", [1] * spatial_rank)
    dilations = _ints_attribute(ctx, "dilations", [1] * spatial_rank)
    group = int(ctx.attribute("group", 1))  # type: ignore[call-overload]
    begins, ends, output_padding = _pads(ctx, spatial_rank, kernel, strides, dilations)
    spatial_axes = list(range(2, 2 + spatial_rank))
    db = e.reduce_sum(dy, [0, *spatial_axes], keepdims=False) if ctx.needs(2) else None
    # The last s * (output_padding // s) positions of the full extent (output_padding >= stride, below
    # the dilation: onnxruntime 1.19 runs it) meet no window; dropped so that conv(dY) has X's extent.
    ends = [end - s * (extra // s) for end, s, extra in zip(ends, strides, output_padding, strict=True)]
    cut = dy
    if any(end < 0 for end in ends):  # positions of Y that no X or W reaches (zeros plus the bias): cut
        stops = [end if end < 0 else _INT64_MAX for end in ends]
        cut = ctx.op("Slice", [dy, e.ints([0] * spatial_rank), e.ints(stops), e.ints(spatial_axes)])
        ends = [max(end, 0) for end in ends]
    pads = begins + ends
    common = {"strides": strides, "dilations": dilations, "group": group, "kernel_shape": kernel, "pads": pads}
    dx = ctx.op("Conv", [cut, w], **common) if ctx.needs(0) else None
    dw = None
    if ctx.needs(1):
        if e.ortlstm_ops and e.elem_type(x) in _CONV_GRAD_TYPES:
            op = schema.CONV_GRAD
            base = ctx.node.name or ctx.node.op_type
            dw = e.fresh(f"{base}_grad_W")
            e.op_multi(
                op.name,
                ordered_inputs(op, {"dY": x, "X": cut, "W": w}),
                outputs=["", dw],
                domain=op.domain,
                name=f"{base}_grad/{op.name}",
                **common,
            )
            w_type = e.value_type(w)
            if w_type is not None:
                e.set_type(dw, w_type.elem_type, w_type.shape)
        else:
            spatial = _static_spatial(ctx, ctx.output(0)) if cut == dy else None  # dY has Y's shape
            geometry = _Geometry(spatial_rank, kernel, strides, dilations, group, "NOTSET", pads, spatial)
            dw = _grad_w(ctx, geometry, x, x=cut, w=w)
    return [dx, dw, db]
