"""Gradient rule of Conv (ai.onnx): 1-D, 2-D and N-D, strides, pads, auto_pad, dilations, group.

For ``Y = conv(X, W) + B`` (X ``[N, C, in...]``, W ``[M, C/group, k...]``, Y ``[N, M, out...]``):

- ``dX = conv_transpose(dY, W)`` with the forward strides, dilations and group, cut to X's extent;
- ``dW[m, c, k] = sum_{n,o} dY[n,m,o] X[n,c,o*s+k*d-pad]``: X's windows gathered by one Conv with
  a one-hot kernel (im2col: ``[N, C*K, out...]``, K taps), then one MatMul per sample and a sum
  over the batch; where W's shape is not static, ``conv(X^T, dY^T)`` with strides and dilations
  swapped (the batch axis becomes the summed channel axis), which onnxruntime runs much slower;
- ``dB = sum(dY)`` over the batch and spatial axes.

Where the emitter may use the ortlstm library (``GraphEmitter.ortlstm_ops``, the train step's case)
and X is float32 or float64, all three are one ``ortlstm::ConvGrad`` node instead (docs/ops.md#convgrad:
im2col, GEMMs and col2im threaded over the images, about twice as fast as the standard ops below).

With X's spatial dims static (the common case once input shapes are known) dX is one node;
otherwise the extent of dX and SAME pads are computed at run time. Protos only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import onnx

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
from ortlstm.ops import schema
from ortlstm.ops.nodes import ordered_inputs

_CONV_GRAD_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
"""Element types ``ortlstm::ConvGrad`` takes; others (float16, bfloat16) get the standard-op gradient."""


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """The forward Conv's configuration, one entry per spatial axis.

    Attributes:
        spatial_rank: Number of spatial axes.
        kernel: Kernel size ``k`` per axis.
        strides: ``s`` per axis.
        dilations: ``d`` per axis.
        group: The group count.
        auto_pad: NOTSET, VALID, SAME_UPPER or SAME_LOWER.
        pads: Begin pads then end pads (as the ``pads`` attribute), when known at build time.
        spatial: X's spatial dims, when all are static.
    """

    spatial_rank: int
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    group: int
    auto_pad: str
    pads: list[int] | None
    spatial: list[int] | None

    @property
    def effective_kernel(self) -> list[int]:
        """``(k - 1) * d + 1`` per axis: the extent the dilated kernel covers."""
        return [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations, strict=True)]

    @property
    def spatial_axes(self) -> list[int]:
        return list(range(2, 2 + self.spatial_rank))

    def remainders(self) -> list[int]:
        """Per axis, the padded input elements past the last window, ``(in + pads - k_eff) mod s`` (static case)."""
        assert self.spatial is not None
        assert self.pads is not None
        r = self.spatial_rank
        return [
            (size + self.pads[axis] + self.pads[axis + r] - extent) % stride
            for axis, (size, extent, stride) in enumerate(
                zip(self.spatial, self.effective_kernel, self.strides, strict=True)
            )
        ]


def _ints_attribute(ctx: GradientContext, name: str, default: list[int]) -> list[int]:
    value = ctx.attribute(name)
    return [int(v) for v in value] if isinstance(value, list) and value else default


def _geometry(ctx: GradientContext) -> _Geometry:
    x, w = ctx.input(0), ctx.input(1)
    x_type, w_type = ctx.emitter.value_type(x), ctx.emitter.value_type(w)
    rank = next((found.rank for found in (w_type, x_type) if found is not None and found.rank is not None), None)
    kernel_attribute = _ints_attribute(ctx, "kernel_shape", [])
    if rank is None and kernel_attribute:
        rank = len(kernel_attribute) + 2
    if rank is None:
        raise ctx.fail("the rank of X and W is unknown; run onnx shape inference first")
    spatial_rank = rank - 2
    w_shape = w_type.shape if w_type is not None else None
    if kernel_attribute:
        kernel = kernel_attribute
    elif w_shape is not None and all(isinstance(dim, int) for dim in w_shape[2:]):
        kernel = [int(dim) for dim in w_shape[2:]]  # type: ignore[arg-type]
    else:
        raise ctx.fail("the kernel shape is unknown: give the node kernel_shape or W a static shape")
    x_shape = x_type.shape if x_type is not None else None
    spatial = None
    if x_shape is not None and all(isinstance(dim, int) for dim in x_shape[2:]):
        spatial = [int(dim) for dim in x_shape[2:]]  # type: ignore[arg-type]
    strides = _ints_attribute(ctx, "strides", [1] * spatial_rank)
    dilations = _ints_attribute(ctx, "dilations", [1] * spatial_rank)
    auto_pad = str(ctx.attribute("auto_pad", "NOTSET"))
    pads: list[int] | None
    if auto_pad == "NOTSET":
        pads = _ints_attribute(ctx, "pads", [0] * (2 * spatial_rank))
    elif auto_pad == "VALID":
        pads = [0] * (2 * spatial_rank)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = None
        if spatial is not None:
            begins, ends = [], []
            for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
                out = -(-size // s)
                total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
                begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
                begins.append(begin)
                ends.append(total - begin)
            pads = begins + ends
    else:
        raise ctx.fail(f"auto_pad {auto_pad!r} is not an ONNX auto_pad value")
    group = int(ctx.attribute("group", 1))  # type: ignore[call-overload]
    return _Geometry(spatial_rank, kernel, strides, dilations, group, auto_pad, pads, spatial)


def _spatial_shape(ctx: GradientContext, geometry: _Geometry, x: str) -> str:
    """X's spatial dims as a 1-D int64 value (a constant when static)."""
    if geometry.spatial is not None:
        return ctx.emitter.ints(geometry.spatial)
    shape = ctx.emitter.shape(x)
    return ctx.op("Slice", [shape, ctx.emitter.ints([2]), ctx.emitter.ints([2 + geometry.spatial_rank])])


def _run_time_same_pads(ctx: GradientContext, geometry: _Geometry, x: str) -> tuple[str, str]:
    """SAME pads of a dynamic input as 1-D int64 (begins, ends): total = max((ceil(in/s)-1)*s + k_eff - in, 0)."""
    e = ctx.emitter
    size = _spatial_shape(ctx, geometry, x)
    strides = e.ints(geometry.strides)
    out = ctx.op("Div", [ctx.op("Add", [size, e.ints([s - 1 for s in geometry.strides])]), strides])
    covered = ctx.op(
        "Add", [ctx.op("Mul", [ctx.op("Sub", [out, e.ints(1)]), strides]), e.ints(geometry.effective_kernel)]
    )
    total = ctx.op("Max", [ctx.op("Sub", [covered, size]), e.ints([0] * geometry.spatial_rank)])
    half = ctx.op("Div", [total, e.ints(2)])
    begins = half if geometry.auto_pad == "SAME_UPPER" else ctx.op("Sub", [total, half])
    return begins, ctx.op("Sub", [total, begins])


def _grad_x(ctx: GradientContext, geometry: _Geometry, dy: str) -> str:
    """dX = conv_transpose(dY, W), cut to X's extent."""
    x, w, e = ctx.input(0), ctx.input(1), ctx.emitter
    common = {
        "strides": geometry.strides,
        "dilations": geometry.dilations,
        "group": geometry.group,
        "kernel_shape": geometry.kernel,
    }
    if geometry.spatial is not None and geometry.pads is not None:
        # Length s*(out-1) + output_padding + k_eff - pads = in, with output_padding the remainder (< s).
        return ctx.op("ConvTranspose", [dy, w], pads=geometry.pads, output_padding=geometry.remainders(), **common)
    # Run time: the full transposed convolution covers the padded input up to its last window;
    # zeros for the remainder (< s per axis), then the window of X: [begin pad, begin pad + in).
    full = ctx.op("ConvTranspose", [dy, w], **common)
    if any(s > 1 for s in geometry.strides):
        r = geometry.spatial_rank
        tail = e.ints([0, 0] + [0] * r + [0, 0] + [s - 1 for s in geometry.strides])
        full = ctx.op("Pad", [full, tail])
    if geometry.pads is not None:
        begins = e.ints(geometry.pads[: geometry.spatial_rank])
    else:
        begins, _ = _run_time_same_pads(ctx, geometry, x)
    ends = ctx.op("Add", [begins, _spatial_shape(ctx, geometry, x)])
    return ctx.op("Slice", [full, begins, ends, e.ints(geometry.spatial_axes)])


def _grad_w(ctx: GradientContext, geometry: _Geometry, dy: str, x: str | None = None, w: str | None = None) -> str:
    """dW[m, c, k] = sum_{n, o} dY[n, m, o] cols[n, c, k, o]: X's windows (im2col) by one Conv, one MatMul.

    ``cols = conv(X, E)`` with the forward's strides, dilations and pads and group = C, where E
    ``[C*K, 1, k...]`` (K taps) is one-hot: output channel ``c*K + j`` copies tap j of channel c
    at every output position (exactly: one product by 1, the others by 0). Then per sample and
    group one MatMul ``dY [Mg, O] x cols^T [O, Cg*K]`` and a sum over the batch. onnxruntime runs
    this at about the forward Conv's speed, several times faster than one Conv of X^T and dY^T.
    A non-finite element of X spreads to all K taps of its channel here (0 * inf is NaN).
    ``x`` and ``w`` default to the node's inputs; ConvTranspose's dW passes its dY as ``x`` and its X as ``dy``.
    """
    x, w, e = x or ctx.input(0), w or ctx.input(1), ctx.emitter
    w_shape = e.static_shape(w)
    if w_shape is None:
        return _grad_w_transposed(ctx, geometry, dy, x, w)
    r, group = geometry.spatial_rank, geometry.group
    maps, per_group = w_shape[0], w_shape[1]
    taps = math.prod(geometry.kernel)
    channels = group * per_group
    one_hot = np.tile(np.eye(taps).reshape(taps, 1, *geometry.kernel), (channels, 1, *[1] * r))
    elem_type = e.elem_type(x)
    if elem_type:
        kernel = e.constant(one_hot, elem_type, name="im2col_kernel")
    else:
        kernel = ctx.op("CastLike", [e.constant(one_hot, onnx.TensorProto.FLOAT, name="im2col_kernel"), x])
    placement = {"pads": geometry.pads} if geometry.auto_pad == "NOTSET" else {"auto_pad": geometry.auto_pad}
    cols = ctx.op(
        "Conv",
        [x, kernel],
        strides=geometry.strides,
        dilations=geometry.dilations,
        group=channels,
        kernel_shape=geometry.kernel,
        **placement,
    )  # [N, C*K, out...]
    positions = -1  # the output positions O; explicit when static, so that an empty batch reshapes too
    if geometry.spatial is not None and geometry.pads is not None:
        pads = geometry.pads
        positions = math.prod(
            (size + pads[axis] + pads[axis + r] - extent) // stride + 1
            for axis, (size, extent, stride) in enumerate(
                zip(geometry.spatial, geometry.effective_kernel, geometry.strides, strict=True)
            )
        )
    cols = ctx.op("Reshape", [cols, e.ints([0, group, per_group * taps, positions])])  # [N, G, Cg*K, O]
    grads = ctx.op("Reshape", [dy, e.ints([0, group, maps // group, positions])])  # [N, G, Mg, O]
    per_sample = ctx.op("MatMul", [grads, ctx.op("Transpose", [cols], perm=[0, 1, 3, 2])])  # [N, G, Mg, Cg*K]
    summed = e.reduce_sum(per_sample, [0], keepdims=False)  # [G, Mg, Cg*K]
    return ctx.op("Reshape", [summed, e.ints(list(w_shape))])


def _grad_w_transposed(
    ctx: GradientContext, geometry: _Geometry, dy: str, x: str | None = None, w: str | None = None
) -> str:
    """dW = conv(X^T, dY^T) with strides and dilations swapped, cut to the kernel's extent.

    For a W whose shape is not static (``_grad_w`` needs its channel count); onnxruntime runs it
    3-10x slower than the forward Conv (a [C*N, k'] im2col per channel of X, a GEMM of N = k').
    ``x`` and ``w`` as in ``_grad_w``.
    """
    x, w, e = x or ctx.input(0), w or ctx.input(1), ctx.emitter
    r, group = geometry.spatial_rank, geometry.group
    spatial_perm = list(range(2, 2 + r))
    pads = geometry.pads
    if pads is None:  # SAME pads of a dynamic input: pad X itself, then convolve without pads
        begins, ends = _run_time_same_pads(ctx, geometry, x)
        x = ctx.op("Pad", [x, ctx.op("Concat", [e.ints([0, 0]), begins, e.ints([0, 0]), ends], axis=0)])
        pads = [0] * (2 * r)
    if group == 1:
        columns = ctx.op("Transpose", [x], perm=[1, 0, *spatial_perm])  # [C, N, in...]
    else:
        w_shape = e.static_shape(w)
        if w_shape is None:
            raise ctx.fail("group > 1 needs W's static shape (its channels per group)")
        per_group = w_shape[1]
        # [N, G*Cg, in...] -> [N, G, Cg, in...] -> [Cg, G, N, in...] -> [Cg, G*N, in...]:
        # input channel g*N + n of group g meets dY^T's channels of that group.
        spatial = _spatial_shape(ctx, geometry, x)
        split = ctx.op("Reshape", [x, ctx.op("Concat", [e.ints([0, group, per_group]), spatial], axis=0)])
        moved = ctx.op("Transpose", [split], perm=[2, 1, 0, *range(3, 3 + r)])
        columns = ctx.op("Reshape", [moved, ctx.op("Concat", [e.ints([per_group, -1]), spatial], axis=0)])
    kernels = ctx.op("Transpose", [dy], perm=[1, 0, *spatial_perm])  # [M, N, out...]
    # The padded input's last (in + pads - k_eff) mod s elements meet no window: with X's extent
    # known they are cut from the end pad, and the result is [Cg, M, k...] exactly; otherwise it
    # is [Cg, M, k'...] with k' >= k (one more per d of those elements) and gets sliced.
    exact = geometry.spatial is not None and geometry.pads is not None
    if exact:
        remainders = geometry.remainders()
        cut = [min(remainder, pads[r + axis]) for axis, remainder in enumerate(remainders)]
        pads = pads[:r] + [end - c for end, c in zip(pads[r:], cut, strict=True)]
        exact = all(rem - c < d for rem, c, d in zip(remainders, cut, geometry.dilations, strict=True))
    raw = ctx.op(
        "Conv", [columns, kernels], strides=geometry.dilations, dilations=geometry.strides, pads=pads, group=group
    )
    if not exact:
        raw = ctx.op("Slice", [raw, e.ints([0] * r), e.ints(geometry.kernel), e.ints(geometry.spatial_axes)])
    return ctx.op("Transpose", [raw], perm=[1, 0, *spatial_perm])


def _conv_grad_node(ctx: GradientContext, geometry: _Geometry, dy: str) -> list[str | None]:
    """dX, dW and dB as one ``ortlstm::ConvGrad`` node; the outputs no input needs are omitted."""
    x, w, e = ctx.input(0), ctx.input(1), ctx.emitter
    op = schema.CONV_GRAD
    base = ctx.node.name or ctx.node.op_type
    wanted = [ctx.needs(index) for index in range(len(op.outputs))]
    outputs = [
        e.fresh(f"{base}_grad_{port.name[1:]}") if needed else ""
        for port, needed in zip(op.outputs, wanted, strict=True)
    ]
    while not outputs[-1]:
        outputs.pop()
    # The geometry as resolved for the standard rule: explicit pads where known, else SAME at run time.
    placement = {"pads": geometry.pads} if geometry.pads is not None else {"auto_pad": geometry.auto_pad}
    e.op_multi(
        op.name,
        ordered_inputs(op, {"dY": dy, "X": x, "W": w}),
        outputs=outputs,
        domain=op.domain,
        name=f"{base}_grad/{op.name}",
        strides=geometry.strides,
        dilations=geometry.dilations,
        group=geometry.group,
        kernel_shape=geometry.kernel,
        **placement,
    )
    x_type, w_type = e.value_type(x), e.value_type(w)
    result: list[str | None] = [name or None for name in outputs] + [None] * (len(op.outputs) - len(outputs))
    for grad, known in ((result[0], x_type), (result[1], w_type)):
        if grad is not None and known is not None:  # a gradient has its input's type and shape
            e.set_type(grad, known.elem_type, known.shape)
    if result[2] is not None and w_type is not None:
        e.set_type(result[2], w_type.elem_type, None if w_type.shape is None else w_type.shape[:1])
    return result


@register_gradient_rule("", "Conv")
def conv_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = conv_transpose(dY, W), dW = dY x im2col(X)^T, dB = sum(dY) over N and space (a train step: one ConvGrad)."""
    (dy,) = grad_outputs
    assert dy is not None
    geometry = _geometry(ctx)
    if ctx.emitter.ortlstm_ops and ctx.emitter.elem_type(ctx.input(0)) in _CONV_GRAD_TYPES:
        return _conv_grad_node(ctx, geometry, dy)
    dx = _grad_x(ctx, geometry, dy) if ctx.needs(0) else None
    dw = _grad_w(ctx, geometry, dy) if ctx.needs(1) else None
    db = None
    if ctx.needs(2):
        db = ctx.emitter.reduce_sum(dy, [0, *geometry.spatial_axes], keepdims=False)
    return [dx, dw, db]
