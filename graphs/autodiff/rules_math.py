"""Gradient rules of elementwise math and matrix products (ai.onnx).

Each rule's docstring states its derivative; ``dY`` is the gradient of the output, ``dA`` the
gradient of input A. Broadcast inputs get their gradient summed back to their own shape
(``GraphEmitter.unbroadcast``). At points where the derivative is not defined the rules follow
torch: Abs has 0 at 0; Clip passes dY at its bounds (torch.clamp; not for hardtanh, which dynamo's
metadata tells); Max/Min and ReduceMax/ReduceMin
share dY evenly among tied inputs or elements (torch.maximum halves a two-way tie, torch.amax splits
evenly; a variadic Max of three tied inputs gives each a third, where chained torch.maximum would
depend on the order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
from ortlstm.ops import schema
from ortlstm.ops.nodes import ordered_inputs

# ---- helpers (cast_like and require_rank are shared with rules_shape, activation_grad with rules_nn)


def activation_grad(ctx: GradientContext, op: schema.OpSpec, dy: str | None) -> str | None:
    """dX from the node's output Y as one ortlstm node ``op`` (SigmoidGrad, TanhGrad), or None.

    None (the rule emits standard ops) unless the emitter may use the library
    (``GraphEmitter.ortlstm_ops``) and Y is float32 or float64. One pass instead of three nodes.
    """
    y = ctx.output(0)
    known = ctx.emitter.value_type(y)
    if not ctx.emitter.ortlstm_ops or known is None or known.elem_type not in _LIBRARY_TYPES:
        return None
    grad = ctx.op(op.name, ordered_inputs(op, {"dY": dy, "Y": y}), domain=op.domain)
    ctx.emitter.set_type(grad, known.elem_type, known.shape)
    return grad


_LIBRARY_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def cast_like(ctx: GradientContext, value: str, like: str) -> str:
    """``value`` in ``like``'s element type (a Cast when that type is known, else CastLike)."""
    elem_type = ctx.emitter.elem_type(like)
    if elem_type and elem_type == ctx.emitter.elem_type(value):
        return value
    if elem_type:
        return ctx.op("Cast", [value], to=elem_type)
    if ctx.opset >= 15:
        return ctx.op("CastLike", [value, like])
    raise ctx.fail(f"the element type of {like!r} is unknown (CastLike needs ai.onnx opset >= 15)")


def require_rank(ctx: GradientContext, name: str) -> int:
    """The static rank of a value, which the rule needs (e.g. for a Transpose perm)."""
    rank = ctx.emitter.rank(name)
    if rank is None:
        raise ctx.fail(f"the rank of {name!r} is unknown (run onnx shape inference on the model first)")
    return rank


def _unbroadcast(ctx: GradientContext, grad: str, index: int) -> str:
    return ctx.emitter.unbroadcast(grad, ctx.input(index), grad_shape_of=ctx.output(0))


@register_gradient_rule("", "Add")
def add_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA = dY, dB = dY (each summed to its input's shape)."""
    (dy,) = grad_outputs
    assert dy is not None
    return [_unbroadcast(ctx, dy, i) if ctx.needs(i) else None for i in range(2)]


@register_gradient_rule("", "Mul")
def mul_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA = dY * B, dB = dY * A."""
    (dy,) = grad_outputs
    assert dy is not None
    a, b = ctx.input(0), ctx.input(1)
    return [
        _unbroadcast(ctx, ctx.op("Mul", [dy, b]), 0) if ctx.needs(0) else None,
        _unbroadcast(ctx, ctx.op("Mul", [dy, a]), 1) if ctx.needs(1) else None,
    ]


@register_gradient_rule("", "Tanh")
def tanh_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * (1 - Y^2): one ortlstm TanhGrad node in a train step."""
    (dy,) = grad_outputs
    fused = activation_grad(ctx, schema.TANH_GRAD, dy)
    if fused is not None:
        return [fused]
    y = ctx.output(0)
    one_minus = ctx.op("Sub", [ctx.scalar(1.0, y), ctx.op("Mul", [y, y])])
    return [ctx.op("Mul", [dy, one_minus])]


# ---- elementwise arithmetic --------------------------------------------------------------------


@register_gradient_rule("", "Sub")
def sub_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA = dY, dB = -dY."""
    (dy,) = grad_outputs
    assert dy is not None
    return [
        _unbroadcast(ctx, dy, 0) if ctx.needs(0) else None,
        _unbroadcast(ctx, ctx.op("Neg", [dy]), 1) if ctx.needs(1) else None,
    ]


@register_gradient_rule("", "Div")
def div_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA = dY / B, dB = -dY * Y / B."""
    (dy,) = grad_outputs
    assert dy is not None
    b, y = ctx.input(1), ctx.output(0)
    da = ctx.op("Div", [dy, b])
    return [
        _unbroadcast(ctx, da, 0) if ctx.needs(0) else None,
        _unbroadcast(ctx, ctx.op("Neg", [ctx.op("Mul", [da, y])]), 1) if ctx.needs(1) else None,
    ]


@register_gradient_rule("", "Neg")
def neg_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = -dY."""
    (dy,) = grad_outputs
    return [ctx.op("Neg", [dy])]


@register_gradient_rule("", "Pow")
def pow_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * E * X^(E-1), dE = dY * Y * log(X) (0 where X == 0); an integer exponent gets none."""
    (dy,) = grad_outputs
    assert dy is not None
    x, exponent, y = ctx.input(0), ctx.input(1), ctx.output(0)
    dx = de = None
    if ctx.needs(0):
        power = ctx.op("Pow", [x, ctx.op("Sub", [exponent, ctx.scalar(1.0, exponent)])])
        dx = _unbroadcast(ctx, ctx.op("Mul", [dy, ctx.op("Mul", [cast_like(ctx, exponent, x), power])]), 0)
    if ctx.needs(1):
        zero = ctx.scalar(0.0, x)
        log_x = ctx.op("Where", [ctx.op("Equal", [x, zero]), zero, ctx.op("Log", [x])])
        de = _unbroadcast(ctx, cast_like(ctx, ctx.op("Mul", [dy, ctx.op("Mul", [y, log_x])]), exponent), 1)
    return [dx, de]


@register_gradient_rule("", "Sqrt")
def sqrt_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * 0.5 / Y."""
    (dy,) = grad_outputs
    y = ctx.output(0)
    return [ctx.op("Div", [ctx.op("Mul", [dy, ctx.scalar(0.5, y)]), y])]


@register_gradient_rule("", "Exp")
def exp_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * Y."""
    (dy,) = grad_outputs
    return [ctx.op("Mul", [dy, ctx.output(0)])]


@register_gradient_rule("", "Log")
def log_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY / X."""
    (dy,) = grad_outputs
    return [ctx.op("Div", [dy, ctx.input(0)])]


@register_gradient_rule("", "Abs")
def abs_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * sign(X) (0 at X == 0, as torch)."""
    (dy,) = grad_outputs
    return [ctx.op("Mul", [dy, ctx.op("Sign", [ctx.input(0)])])]


@register_gradient_rule("", "Reciprocal")
def reciprocal_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = -dY * Y^2."""
    (dy,) = grad_outputs
    y = ctx.output(0)
    return [ctx.op("Neg", [ctx.op("Mul", [dy, ctx.op("Mul", [y, y])])])]


@register_gradient_rule("", "Erf")
def erf_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * 2 / sqrt(pi) * exp(-X^2)."""
    (dy,) = grad_outputs
    x = ctx.input(0)
    gauss = ctx.op("Exp", [ctx.op("Neg", [ctx.op("Mul", [x, x])])])
    return [ctx.op("Mul", [dy, ctx.op("Mul", [gauss, ctx.scalar(2.0 / math.sqrt(math.pi), x)])])]


@register_gradient_rule("", "Identity")
def identity_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY."""
    return [grad_outputs[0]]


@register_gradient_rule("", "Cast")
def cast_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = cast(dY, type of X); a non-float X or Y carries no gradient (the walk never gets here)."""
    (dy,) = grad_outputs
    assert dy is not None
    return [cast_like(ctx, dy, ctx.input(0))]


@register_gradient_rule("", "CastLike", differentiable=[0])
def castlike_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = cast(dY, type of X); none for target_type (only its type is read)."""
    (dy,) = grad_outputs
    assert dy is not None
    return [cast_like(ctx, dy, ctx.input(0)), None]


# ---- variadic elementwise ----------------------------------------------------------------------


@register_gradient_rule("", "Sum")
def sum_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX_i = dY."""
    (dy,) = grad_outputs
    assert dy is not None
    return [_unbroadcast(ctx, dy, i) if ctx.needs(i) else None for i in range(len(ctx.node.input))]


@register_gradient_rule("", "Mean")
def mean_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX_i = dY / n for n inputs."""
    (dy,) = grad_outputs
    assert dy is not None
    count = len(ctx.node.input)
    share = ctx.op("Div", [dy, ctx.scalar(float(count), ctx.output(0))]) if count > 1 else dy
    return [_unbroadcast(ctx, share, i) if ctx.needs(i) else None for i in range(count)]


def _extremum_grad(ctx: GradientContext, dy: str) -> list[str | None]:
    """Min/Max: dX_i = dY * [X_i == Y] / #{j : X_j == Y}, ties split evenly (torch.maximum halves a 2-way tie)."""
    y, count = ctx.output(0), len(ctx.node.input)
    if count == 1:
        return [dy]
    hits = [cast_like(ctx, ctx.op("Equal", [ctx.input(i), y]), y) for i in range(count)]
    share = ctx.op("Div", [dy, ctx.op("Sum", hits)])
    return [_unbroadcast(ctx, ctx.op("Mul", [share, hits[i]]), i) if ctx.needs(i) else None for i in range(count)]


@register_gradient_rule("", "Max")
def max_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX_i = dY where X_i is the maximum, split evenly among tied inputs (torch.maximum's halves for two)."""
    assert grad_outputs[0] is not None
    return _extremum_grad(ctx, grad_outputs[0])


@register_gradient_rule("", "Min")
def min_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX_i = dY where X_i is the minimum, split evenly among tied inputs (torch.minimum's halves for two)."""
    assert grad_outputs[0] is not None
    return _extremum_grad(ctx, grad_outputs[0])


@register_gradient_rule("", "Where")
def where_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where C else 0, dY_false = dY where not C else 0; none for the condition C."""
    (dy,) = grad_outputs
    assert dy is not None
    condition, zero = ctx.input(0), ctx.scalar(0.0, ctx.output(0))
    return [
        None,
        _unbroadcast(ctx, ctx.op("Where", [condition, dy, zero]), 1) if ctx.needs(1) else None,
        _unbroadcast(ctx, ctx.op("Where", [condition, zero, dy]), 2) if ctx.needs(2) else None,
    ]


def _from_hardtanh(node: onnx.NodeProto) -> bool:
    """Whether torch's dynamo exporter wrote this node for aten.hardtanh (nn.ReLU6, nn.Hardtanh), by its metadata."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.class_hierarchy":
            return prop.value.rstrip("]'\" ").endswith("aten.hardtanh.default")
    return False


@register_gradient_rule("", "Clip")
def clip_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where min <= X <= max (bounds included, as torch.clamp) else 0; none for min and max.

    A Clip the dynamo exporter wrote for hardtanh (nn.ReLU6, nn.Hardtanh; its node metadata says
    so) excludes the bounds, as torch's hardtanh_backward: dX = dY where min < X < max.
    """
    (dy,) = grad_outputs
    assert dy is not None
    x, low, high = ctx.input(0), ctx.input(1), ctx.input(2)
    strict = _from_hardtanh(ctx.node)
    inside = [ctx.op("Greater" if strict else "GreaterOrEqual", [x, low])] if low else []
    inside += [ctx.op("Less" if strict else "LessOrEqual", [x, high])] if high else []
    if not inside:
        return [dy]
    mask = inside[0] if len(inside) == 1 else ctx.op("And", inside)
    return [ctx.op("Where", [mask, dy, ctx.scalar(0.0, x)])]


# ---- matrix products ---------------------------------------------------------------------------


def _as_rows(ctx: GradientContext, value: str, width_of: str) -> str:
    """``value`` reshaped to [-1, W], W the last dim of ``width_of`` (a constant when static)."""
    found = ctx.emitter.value_type(width_of)
    width = found.shape[-1] if found is not None and found.shape else None
    if isinstance(width, int):
        return ctx.op("Reshape", [value, ctx.emitter.ints([-1, width])])
    last = ctx.op("Gather", [ctx.emitter.shape(width_of), ctx.emitter.ints([-1])])
    return ctx.op("Reshape", [value, ctx.op("Concat", [ctx.emitter.ints([-1]), last], axis=0)])


def _swap_last(ctx: GradientContext, value: str, rank: int) -> str:
    return ctx.op("Transpose", [value], perm=[*range(rank - 2), rank - 1, rank - 2])


@register_gradient_rule("", "MatMul")
def matmul_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA = dY @ B^T, dB = A^T @ dY (over the last two axes; 1-D operands as a row / column; batch axes summed back)."""
    (dy,) = grad_outputs
    assert dy is not None
    a, b, e = ctx.input(0), ctx.input(1), ctx.emitter
    rank_a, rank_b = require_rank(ctx, a), require_rank(ctx, b)
    a_vector, b_vector = rank_a == 1, rank_b == 1
    # Promote 1-D operands as numpy does: A [K] -> [1, K], B [K] -> [K, 1]; dY gets the unit axes back.
    dy_axes = [-2] * a_vector + [-1] * b_vector
    dy_2d = e.unsqueeze(dy, dy_axes) if dy_axes else dy
    # What shape inference knows: batch dims, M, N (from Y) and K (from A or B), for static unbroadcasts.
    y_type, a_type, b_type = e.value_type(ctx.output(0)), e.value_type(a), e.value_type(b)
    y_shape = y_type.shape if y_type is not None else None
    k_dim = a_type.shape[-1] if a_type is not None and a_type.shape else None
    if k_dim is None and b_type is not None and b_type.shape:
        k_dim = b_type.shape[-1 if b_vector else -2]
    batch = m_dim = n_dim = None
    if y_shape is not None:
        batch = y_shape[: len(y_shape) - (not a_vector) - (not b_vector)]
        m_dim = None if a_vector else y_shape[len(batch)]
        n_dim = None if b_vector else y_shape[-1]
    grads: list[str | None] = [None, None]
    if ctx.needs(0) and rank_b == 2 and not a_vector:
        # B without batch axes (a Linear layer): dA is one rows x N @ (K x N)^T Gemm, reshaped to A.
        # A Gemm with transB rather than MatMul of a Transpose: onnxruntime-training 1.19.2 fuses
        # the latter into com.microsoft FusedMatMul, which has no float64 kernel there.
        da = ctx.op("Gemm", [_as_rows(ctx, dy, b) if rank_a > 2 else dy, b], transB=1)
        grads[0] = ctx.op("Reshape", [da, e.shape(a)]) if rank_a > 2 else da
    elif ctx.needs(0):
        b_t = e.unsqueeze(b, [0]) if b_vector else _swap_last(ctx, b, rank_b)
        da = ctx.op("MatMul", [dy_2d, b_t])
        if a_vector:
            da = e.squeeze(da, [-2])
        if batch is not None:
            e.set_type(da, e.elem_type(a), [*batch, *([] if a_vector else [m_dim]), k_dim])
        grads[0] = e.unbroadcast(da, a)
    if ctx.needs(1) and rank_b == 2 and rank_a > 2:
        # B shared by every batch (a Linear layer): one [K, rows] @ [rows, N] product, no per-batch partials.
        grads[1] = ctx.op("Gemm", [_as_rows(ctx, a, a), _as_rows(ctx, dy, b)], transA=1)
    elif ctx.needs(1):
        a_t = e.unsqueeze(a, [-1]) if a_vector else _swap_last(ctx, a, rank_a)
        db = ctx.op("MatMul", [a_t, dy_2d])
        if b_vector:
            db = e.squeeze(db, [-1])
        if batch is not None:
            e.set_type(db, e.elem_type(b), [*batch, k_dim, *([] if b_vector else [n_dim])])
        grads[1] = e.unbroadcast(db, b)
    return grads


@register_gradient_rule("", "Gemm")
def gemm_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dA' = alpha * dY @ B'^T, dB' = alpha * A'^T @ dY, dC = beta * dY summed to C's shape (A' = A or A^T ...)."""
    (dy,) = grad_outputs
    assert dy is not None
    a, b = ctx.input(0), ctx.input(1)
    trans_a, trans_b = int(ctx.attribute("transA", 0)), int(ctx.attribute("transB", 0))  # type: ignore[call-overload]
    alpha, beta = float(ctx.attribute("alpha", 1.0)), float(ctx.attribute("beta", 1.0))  # type: ignore[arg-type]
    scale = None if alpha == 1.0 else alpha

    def gemm(left: str, right: str, left_t: int, right_t: int) -> str:
        return ctx.op("Gemm", [left, right], transA=left_t or None, transB=right_t or None, alpha=scale)

    # Each case transposes the untransposed formula: d(A^T) = (dA')^T etc.
    grads: list[str | None] = [None, None, None]
    if ctx.needs(0):
        grads[0] = gemm(b, dy, trans_b, 1) if trans_a else gemm(dy, b, 0, 1 - trans_b)
    if ctx.needs(1):
        grads[1] = gemm(dy, a, 1, trans_a) if trans_b else gemm(a, dy, 1 - trans_a, 0)
    if ctx.needs(2):
        dc = dy if beta == 1.0 else ctx.op("Mul", [dy, ctx.scalar(beta, ctx.output(0))])
        grads[2] = _unbroadcast(ctx, dc, 2)
    return grads


# ---- reductions --------------------------------------------------------------------------------


def _reduce_axes(ctx: GradientContext) -> str | None:
    """The reduced axes as a 1-D int64 value (input from opset 13 for ReduceSum, 18 for the others), or None for all."""
    if ctx.has_attribute("axes"):
        return ctx.emitter.ints(list(ctx.attribute("axes")))  # type: ignore[call-overload]
    return ctx.input(1) or None


def _is_identity(ctx: GradientContext) -> bool:
    """No axes and noop_with_empty_axes=1: the reduction returns X (onnxruntime 1.19.2 even fails on that form)."""
    return _reduce_axes(ctx) is None and bool(ctx.attribute("noop_with_empty_axes", 0))


def _restore_reduced(ctx: GradientContext, value: str, axes: str | None) -> str:
    """A reduction's output with the reduced axes back as size 1 (keepdims=0 dropped them), broadcastable to X."""
    if int(ctx.attribute("keepdims", 1)) or axes is None:  # type: ignore[call-overload]
        return value  # all axes without keepdims: a 0-D value broadcasts already
    return ctx.op("Unsqueeze", [value, axes])


def _expand_to_input(ctx: GradientContext, value: str) -> str:
    return ctx.op("Expand", [value, ctx.emitter.shape(ctx.input(0))])


@register_gradient_rule("", "ReduceSum")
def reduce_sum_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY broadcast over the reduced axes; none for axes."""
    (dy,) = grad_outputs
    assert dy is not None
    if _is_identity(ctx):
        return [dy, None]
    return [_expand_to_input(ctx, _restore_reduced(ctx, dy, _reduce_axes(ctx))), None]


@register_gradient_rule("", "ReduceMean")
def reduce_mean_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY / n broadcast over the reduced axes, n = size(X) / size(Y); none for axes."""
    (dy,) = grad_outputs
    assert dy is not None
    if _is_identity(ctx):
        return [dy, None]
    x, y, e = ctx.input(0), ctx.output(0), ctx.emitter
    x_shape, y_shape = e.static_shape(x), e.static_shape(y)
    if x_shape is not None and y_shape is not None:
        count = ctx.scalar(float(math.prod(x_shape) // max(math.prod(y_shape), 1)), y)
    else:
        count = cast_like(ctx, ctx.op("Div", [ctx.op("Size", [x]), ctx.op("Size", [y])]), y)
    return [_expand_to_input(ctx, _restore_reduced(ctx, ctx.op("Div", [dy, count]), _reduce_axes(ctx))), None]


def _reduce_extremum_grad(ctx: GradientContext, dy: str) -> list[str | None]:
    if _is_identity(ctx):
        return [dy, None]
    x, y = ctx.input(0), ctx.output(0)
    axes = _reduce_axes(ctx)
    hits = cast_like(ctx, ctx.op("Equal", [x, _restore_reduced(ctx, y, axes)]), x)
    noop = int(ctx.attribute("noop_with_empty_axes", 0)) or None  # type: ignore[call-overload]
    ties = ctx.op("ReduceSum", [hits] if axes is None else [hits, axes], keepdims=1, noop_with_empty_axes=noop)
    share = ctx.op("Div", [_restore_reduced(ctx, dy, axes), ties])
    return [ctx.op("Mul", [hits, share]), None]


@register_gradient_rule("", "ReduceMax")
def reduce_max_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where X equals the maximum, split evenly among ties (as torch.amax); none for axes."""
    assert grad_outputs[0] is not None
    return _reduce_extremum_grad(ctx, grad_outputs[0])


@register_gradient_rule("", "ReduceMin")
def reduce_min_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where X equals the minimum, split evenly among ties (as torch.amin); none for axes."""
    assert grad_outputs[0] is not None
    return _reduce_extremum_grad(ctx, grad_outputs[0])
