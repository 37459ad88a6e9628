"""Gradient rules of activations, softmax, losses, dropout and normalizations (ai.onnx).

Each rule's docstring states its derivative; ``dY`` is the gradient of the output, ``dX`` the
gradient of input X. Labels, class weights, dropout ratios and running statistics are data, not
parameters: they get no gradient. Every rule works with dynamic dims; the ones that need to know
which axes a reduction spans ask for the rank only (onnx shape inference keeps it for any export).
"""

from __future__ import annotations

from collections.abc import Sequence

from ortlstm.graphs.autodiff.registry import GradientContext, register_gradient_rule
from ortlstm.graphs.autodiff.rules_math import activation_grad
from ortlstm.graphs.export_metadata import batch_norm_in_train_mode, fx_call
from ortlstm.ops import schema

# ---- helpers -----------------------------------------------------------------------------------


def _rank(ctx: GradientContext, value: str) -> int:
    """The static rank of ``value``; a rule that needs it refuses a value of unknown rank."""
    rank = ctx.emitter.rank(value)
    if rank is None:
        raise ctx.fail(f"the rank of {value!r} is unknown; run onnx shape inference (with ortlstm.ops imported) first")
    return rank


def _float(ctx: GradientContext, name: str, default: float) -> float:
    """A float attribute of the node, or its default."""
    value = ctx.attribute(name, default)
    assert isinstance(value, (int, float)), f"attribute {name}: {value!r}"
    return float(value)


def _int(ctx: GradientContext, name: str, default: int) -> int:
    """An int attribute of the node, or its default."""
    value = ctx.attribute(name, default)
    assert isinstance(value, int), f"attribute {name}: {value!r}"
    return value


def _convert(ctx: GradientContext, value: str, type_of: str, to_type_of: str) -> str:
    """``value`` (of ``type_of``'s element type) in ``to_type_of``'s; no node when both are known to agree."""
    elem_type = ctx.emitter.elem_type(type_of)
    if elem_type and elem_type == ctx.emitter.elem_type(to_type_of):
        return value
    return ctx.op("CastLike", [value, to_type_of])


def _int_like(ctx: GradientContext, value: int, like: str) -> str:
    """A 0-D integer constant of ``like``'s element type (labels are int32 or int64)."""
    elem_type = ctx.emitter.elem_type(like)
    if elem_type:
        return ctx.emitter.constant(value, elem_type, name="label")
    return ctx.op("CastLike", [ctx.emitter.ints(value), like])


def _only_first_output(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> str:
    """The gradient of output 0; refuses gradients that reach the node's other outputs."""
    for index, grad in enumerate(grad_outputs[1:], start=1):
        if grad is not None:
            raise ctx.fail(
                f"only output 0 carries a gradient; output {index} ({ctx.output(index)!r}) must not reach the loss"
            )
    dy = grad_outputs[0]
    assert dy is not None
    return dy


def _normalize(ctx: GradientContext, x: str, axes: Sequence[int], epsilon: float) -> tuple[str, str]:
    """``(xhat, invstd)``: X standardized over ``axes`` (biased variance), recomputed from X."""
    emitter = ctx.emitter
    mean = emitter.reduce("ReduceMean", x, list(axes), keepdims=True)
    centered = ctx.op("Sub", [x, mean])
    variance = emitter.reduce("ReduceMean", ctx.op("Mul", [centered, centered]), list(axes), keepdims=True)
    invstd = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [variance, ctx.scalar(epsilon, x)])])])
    return ctx.op("Mul", [centered, invstd]), invstd


def _normalized_input_grad(ctx: GradientContext, dxhat: str, xhat: str, invstd: str, axes: Sequence[int]) -> str:
    """dX = invstd * (dXhat - mean(dXhat) - xhat * mean(dXhat * xhat)), means over ``axes``."""
    emitter = ctx.emitter
    mean_dxhat = emitter.reduce("ReduceMean", dxhat, list(axes), keepdims=True)
    mean_dxhat_xhat = emitter.reduce("ReduceMean", ctx.op("Mul", [dxhat, xhat]), list(axes), keepdims=True)
    centered = ctx.op("Sub", [ctx.op("Sub", [dxhat, mean_dxhat]), ctx.op("Mul", [xhat, mean_dxhat_xhat])])
    return ctx.op("Mul", [invstd, centered])


def _per_channel(ctx: GradientContext, value: str, rank: int) -> str:
    """A [C] value shaped [C, 1, ..., 1] to broadcast against [N, C, d1, ...] of ``rank`` axes."""
    return ctx.emitter.unsqueeze(value, list(range(1, rank - 1))) if rank > 2 else value


# ---- activations -------------------------------------------------------------------------------


@register_gradient_rule("", "Sigmoid")
def sigmoid_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * Y * (1 - Y): one ortlstm SigmoidGrad node in a train step."""
    (dy,) = grad_outputs
    fused = activation_grad(ctx, schema.SIGMOID_GRAD, dy)
    if fused is not None:
        return [fused]
    y = ctx.output(0)
    return [ctx.op("Mul", [dy, ctx.op("Mul", [y, ctx.op("Sub", [ctx.scalar(1.0, y), y])])])]


@register_gradient_rule("", "Relu")
def relu_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where X > 0, else 0."""
    (dy,) = grad_outputs
    x = ctx.input(0)
    zero = ctx.scalar(0.0, x)
    return [ctx.op("Where", [ctx.op("Greater", [x, zero]), dy, zero])]


@register_gradient_rule("", "LeakyRelu")
def leaky_relu_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where X > 0, else alpha * dY (at 0 too, as torch's leaky_relu_backward)."""
    (dy,) = grad_outputs
    x = ctx.input(0)
    alpha = ctx.scalar(_float(ctx, "alpha", 0.01), x)
    positive = ctx.op("Greater", [x, ctx.scalar(0.0, x)])
    return [ctx.op("Where", [positive, dy, ctx.op("Mul", [dy, alpha])])]


@register_gradient_rule("", "Elu")
def elu_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where X > 0, else dY * (Y + alpha) (= dY * alpha * exp(X); at 0 too, as torch's elu_backward)."""
    (dy,) = grad_outputs
    x, y = ctx.input(0), ctx.output(0)
    alpha = ctx.scalar(_float(ctx, "alpha", 1.0), x)
    positive = ctx.op("Greater", [x, ctx.scalar(0.0, x)])
    return [ctx.op("Where", [positive, dy, ctx.op("Mul", [dy, ctx.op("Add", [y, alpha])])])]


@register_gradient_rule("", "Softplus")
def softplus_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * sigmoid(X)."""
    (dy,) = grad_outputs
    return [ctx.op("Mul", [dy, ctx.op("Sigmoid", [ctx.input(0)])])]


@register_gradient_rule("", "HardSigmoid")
def hard_sigmoid_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = alpha * dY where 0 < Y < 1 (alpha * X + beta unclipped), else 0."""
    (dy,) = grad_outputs
    y = ctx.output(0)
    alpha = ctx.scalar(_float(ctx, "alpha", 0.2), y)
    inside = ctx.op("And", [ctx.op("Greater", [y, ctx.scalar(0.0, y)]), ctx.op("Less", [y, ctx.scalar(1.0, y)])])
    return [ctx.op("Where", [inside, ctx.op("Mul", [dy, alpha]), ctx.scalar(0.0, y)])]


@register_gradient_rule("", "PRelu")
def prelu_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY where X > 0, else slope * dY (at 0 too, as torch); dslope = dY * X where X <= 0, summed to its shape."""
    (dy,) = grad_outputs
    x, slope = ctx.input(0), ctx.input(1)
    zero = ctx.scalar(0.0, x)
    positive = ctx.op("Greater", [x, zero])
    dx = ctx.op("Where", [positive, dy, ctx.op("Mul", [dy, slope])]) if ctx.needs(0) else None
    dslope = None
    if ctx.needs(1):
        per_element = ctx.op("Where", [positive, zero, ctx.op("Mul", [dy, x])])
        dslope = ctx.emitter.unbroadcast(per_element, slope, grad_shape_of=ctx.output(0))
    return [dx, dslope]


# ---- softmax -----------------------------------------------------------------------------------


@register_gradient_rule("", "Softmax")
def softmax_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = Y * (dY - sum(dY * Y, axis)), the sum kept as a size-1 axis (opset >= 13 semantics)."""
    (dy,) = grad_outputs
    y = ctx.output(0)
    axis = _int(ctx, "axis", -1)
    dot = ctx.emitter.reduce_sum(ctx.op("Mul", [dy, y]), [axis], keepdims=True)
    return [ctx.op("Mul", [y, ctx.op("Sub", [dy, dot])])]


@register_gradient_rule("", "LogSoftmax")
def log_softmax_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY - exp(Y) * sum(dY, axis), the sum kept as a size-1 axis (opset >= 13 semantics)."""
    (dy,) = grad_outputs
    assert dy is not None
    y = ctx.output(0)
    axis = _int(ctx, "axis", -1)
    total = ctx.emitter.reduce_sum(dy, [axis], keepdims=True)
    return [ctx.op("Sub", [dy, ctx.op("Mul", [ctx.op("Exp", [y]), total])])]


# ---- losses ------------------------------------------------------------------------------------


def _label_loss_grad(ctx: GradientContext, dloss: str, scores: str) -> tuple[str, str]:
    """What SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss share.

    Per element i (an entry of the labels, shape [N, d1, ...]), loss_i = -w_i * s[i, label_i] with
    w_i = weights[label_i] (1 without weights) and 0 where label_i == ignore_index; reduction
    "mean" divides the sum by sum_i w_i (a weighted mean; the count of labels without weights or
    ignore_index). Returns ``(scale, safe_labels)``: d loss / d loss_i with the labels' shape, and
    the labels with ignored entries replaced by class 0 (their scale is 0), safe to index with.
    """
    labels, weights = ctx.input(1), ctx.input(2)
    ignore_index = ctx.attribute("ignore_index")
    reduction = ctx.attribute("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.fail(f"reduction {reduction!r} is not one of 'none', 'sum', 'mean'")
    safe_labels, label_weights = labels, None
    if ignore_index is not None:
        assert isinstance(ignore_index, int)
        ignored = ctx.op("Equal", [labels, _int_like(ctx, ignore_index, labels)])
        safe_labels = ctx.op("Where", [ignored, _int_like(ctx, 0, labels), labels])
        kept = ctx.op("Gather", [weights, safe_labels], axis=0) if weights else ctx.scalar(1.0, scores)
        label_weights = ctx.op("Where", [ignored, ctx.scalar(0.0, scores), kept])
    elif weights:
        label_weights = ctx.op("Gather", [weights, labels], axis=0)
    scale = dloss
    if reduction == "mean":
        if label_weights is None:
            count = ctx.op("CastLike", [ctx.op("Size", [labels]), scores])
        else:
            count = ctx.emitter.reduce_sum(label_weights, None, keepdims=False)
        scale = ctx.op("Div", [scale, count])
    if label_weights is not None:
        scale = ctx.op("Mul", [scale, label_weights])
    elif reduction != "none":
        scale = ctx.op("Expand", [scale, ctx.emitter.shape(labels)])
    return scale, safe_labels


def _scatter_to_classes(ctx: GradientContext, values: str, labels: str, scores: str) -> str:
    """A tensor shaped like ``scores`` holding ``values[i]`` at class labels[i] of element i, 0 elsewhere."""
    zeros = ctx.op("Expand", [ctx.scalar(0.0, scores), ctx.emitter.shape(scores)])
    indices, updates = ctx.emitter.unsqueeze(labels, [1]), ctx.emitter.unsqueeze(values, [1])
    return ctx.op("ScatterElements", [zeros, indices, updates], axis=1)


@register_gradient_rule("", "SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dscores = scale_i * (softmax(scores) - onehot(label_i)) + dlog_prob - softmax * sum(dlog_prob, 1).

    scale_i is d loss / d loss_i (see ``_label_loss_grad``); softmax is exp(log_prob), the node's
    second output (named if it was not). Labels and weights get no gradient.
    """
    scores = ctx.input(0)
    dloss = grad_outputs[0]
    dlog_prob = grad_outputs[1] if len(grad_outputs) > 1 else None
    softmax = ctx.op("Exp", [ctx.require_output(1)])
    terms = []
    if dloss is not None:
        scale, safe_labels = _label_loss_grad(ctx, dloss, scores)
        spread = ctx.op("Mul", [softmax, ctx.emitter.unsqueeze(scale, [1])])
        terms.append(ctx.op("Sub", [spread, _scatter_to_classes(ctx, scale, safe_labels, scores)]))
    if dlog_prob is not None:
        total = ctx.emitter.reduce_sum(dlog_prob, [1], keepdims=True)
        terms.append(ctx.op("Sub", [dlog_prob, ctx.op("Mul", [softmax, total])]))
    return [ctx.emitter.sum(terms), None, None]


@register_gradient_rule("", "NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dinput = -scale_i at [i, label_i], 0 elsewhere (scale_i = d loss / d loss_i, see ``_label_loss_grad``).

    Target and weight get no gradient.
    """
    (dloss,) = grad_outputs
    assert dloss is not None
    scores = ctx.input(0)
    scale, safe_labels = _label_loss_grad(ctx, dloss, scores)
    return [_scatter_to_classes(ctx, ctx.op("Neg", [scale]), safe_labels, scores), None, None]


# ---- dropout -----------------------------------------------------------------------------------


@register_gradient_rule("", "Dropout", differentiable=(0,))
def dropout_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * mask / (1 - ratio) in training mode, dX = dY otherwise; ratio and training_mode get none.

    Without a training_mode input the node is an identity. With one (constant or fed at run
    time) the rule reads the node's mask output (named if it was not) and selects the scale by
    training_mode, so an inference run (mask all true) gets dX = dY.
    """
    dy = _only_first_output(ctx, grad_outputs)
    ratio, training_mode = ctx.input(1), ctx.input(2)
    if not training_mode:
        return [dy, None, None]
    mask = ctx.require_output(1)
    one = ctx.scalar(1.0, dy)
    ratio_value = _convert(ctx, ratio, ratio, ctx.input(0)) if ratio else ctx.scalar(0.5, dy)
    scale = ctx.op("Where", [training_mode, ctx.op("Div", [one, ctx.op("Sub", [one, ratio_value])]), one])
    return [ctx.op("Where", [mask, ctx.op("Mul", [dy, scale]), ctx.scalar(0.0, dy)]), None, None]


# ---- normalizations ----------------------------------------------------------------------------


@register_gradient_rule("", "LayerNormalization")
def layer_normalization_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = invstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dY * Scale; dScale = dY * xhat; dB = dY.

    xhat = (X - mean) * invstd over axes [axis, rank); dScale and dB summed to their shapes. Only Y
    carries a gradient (the Mean and InvStdDev outputs must not reach the loss).
    """
    dy = _only_first_output(ctx, grad_outputs)
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    axis = _int(ctx, "axis", -1)
    axes = list(range(axis, 0)) if axis < 0 else list(range(axis, _rank(ctx, x)))
    xhat, invstd = _normalize(ctx, x, axes, _float(ctx, "epsilon", 1e-5))
    y = ctx.output(0)
    dx = _normalized_input_grad(ctx, ctx.op("Mul", [dy, scale]), xhat, invstd, axes) if ctx.needs(0) else None
    dscale = ctx.emitter.unbroadcast(ctx.op("Mul", [dy, xhat]), scale, grad_shape_of=y) if ctx.needs(1) else None
    dbias = ctx.emitter.unbroadcast(dy, bias, grad_shape_of=y) if ctx.needs(2) else None
    return [dx, dscale, dbias]


@register_gradient_rule("", "GroupNormalization")
def group_normalization_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = invstd * (g - mean(g) - xhat * mean(g * xhat)) per group, g = dY * scale[c]; dscale = sum(dY * xhat).

    Opset 21's form (torch exports nn.GroupNorm so from opset 21): X [N, C, d1, ...] standardized
    over each group of C / num_groups channels and the spatial axes, scale and bias per channel;
    dB = sum(dY). The sums for dscale and dB run over every axis but C. The statistics are
    recomputed in X's type (stash_type only says how precisely the forward computes them).
    """
    if ctx.opset < 21:
        raise ctx.fail(
            f"opset {ctx.opset}'s GroupNormalization has a scale and bias per group (changed in opset 21, "
            "which torch exports); re-export with torch.onnx.export(..., opset_version=21) or newer"
        )
    (dy,) = grad_outputs
    assert dy is not None
    x, scale = ctx.input(0), ctx.input(1)
    rank = _rank(ctx, x)
    groups = _int(ctx, "num_groups", 0)
    by_group = ctx.emitter.ints([0, groups, -1])
    xhat, invstd = _normalize(ctx, ctx.op("Reshape", [x, by_group]), [2], _float(ctx, "epsilon", 1e-5))
    x_shape = ctx.emitter.shape(x)
    dx = None
    if ctx.needs(0):
        dxhat = ctx.op("Reshape", [ctx.op("Mul", [dy, _per_channel(ctx, scale, rank)]), by_group])
        dx = ctx.op("Reshape", [_normalized_input_grad(ctx, dxhat, xhat, invstd, [2]), x_shape])
    not_channel = [0, *range(2, rank)]
    dscale = None
    if ctx.needs(1):
        xhat_as_x = ctx.op("Reshape", [xhat, x_shape])
        dscale = ctx.emitter.reduce_sum(ctx.op("Mul", [dy, xhat_as_x]), not_channel, keepdims=False)
    dbias = ctx.emitter.reduce_sum(dy, not_channel, keepdims=False) if ctx.needs(2) else None
    return [dx, dscale, dbias]


@register_gradient_rule("", "RMSNormalization")
def rms_normalization_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = r * (g - xn * mean(g * xn)), g = dY * scale, xn = X * r, r = 1 / sqrt(mean(X^2) + eps); dscale = dY * xn.

    Means over axes [axis, rank) (torch exports nn.RMSNorm so from opset 23); dscale summed to
    scale's shape.
    """
    (dy,) = grad_outputs
    assert dy is not None
    x, scale, y, e = ctx.input(0), ctx.input(1), ctx.output(0), ctx.emitter
    axis = _int(ctx, "axis", -1)
    axes = list(range(axis, 0)) if axis < 0 else list(range(axis, _rank(ctx, x)))
    mean_square = e.reduce("ReduceMean", ctx.op("Mul", [x, x]), axes, keepdims=True)
    epsilon = ctx.scalar(_float(ctx, "epsilon", 1e-5), x)
    r = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [mean_square, epsilon])])])
    xn = ctx.op("Mul", [x, r])
    dx = None
    if ctx.needs(0):
        g = ctx.op("Mul", [dy, scale])
        projection = ctx.op("Mul", [xn, e.reduce("ReduceMean", ctx.op("Mul", [g, xn]), axes, keepdims=True)])
        dx = ctx.op("Mul", [r, ctx.op("Sub", [g, projection])])
    dscale = e.unbroadcast(ctx.op("Mul", [dy, xn]), scale, grad_shape_of=y) if ctx.needs(1) else None
    return [dx, dscale]


@register_gradient_rule("", "InstanceNormalization")
def instance_normalization_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dY * scale[c]; dscale = sum(dY * xhat); dB = sum(dY).

    xhat standardizes X [N, C, d1, ...] over the spatial axes of each (n, c); the sums for
    dscale and dB run over every axis but C.
    """
    (dy,) = grad_outputs
    assert dy is not None
    x, scale = ctx.input(0), ctx.input(1)
    rank = _rank(ctx, x)
    spatial = list(range(2, rank))
    xhat, invstd = _normalize(ctx, x, spatial, _float(ctx, "epsilon", 1e-5))
    dx = None
    if ctx.needs(0):
        dxhat = ctx.op("Mul", [dy, _per_channel(ctx, scale, rank)])
        dx = _normalized_input_grad(ctx, dxhat, xhat, invstd, spatial)
    not_channel = [0, *spatial]
    dscale = ctx.emitter.reduce_sum(ctx.op("Mul", [dy, xhat]), not_channel, keepdims=False) if ctx.needs(1) else None
    dbias = ctx.emitter.reduce_sum(dy, not_channel, keepdims=False) if ctx.needs(2) else None
    return [dx, dscale, dbias]


@register_gradient_rule("", "BatchNormalization", differentiable=(0, 1, 2))
def batch_normalization_grad(ctx: GradientContext, grad_outputs: Sequence[str | None]) -> list[str | None]:
    """dX = dY * scale[c] * invstd[c]; dscale = sum(dY * (X - mean[c]) * invstd[c]); dB = sum(dY).

    Inference form (training_mode=0): the running mean and variance are constants, never
    parameters, so invstd = 1 / sqrt(var + epsilon) is too; sums run over every axis but C.
    training_mode=1 (batch statistics) is refused.
    """
    if _int(ctx, "training_mode", 0):
        raise ctx.fail(
            "training_mode=1 (normalizing by batch statistics) has no gradient rule; export the model in eval "
            "mode (model.eval()) so the running statistics are used and stay frozen"
        )
    if batch_norm_in_train_mode(fx_call(ctx.node)):
        raise ctx.fail(
            "torch called batch_norm in training mode here (the model was exported in train mode: torch normalizes "
            "by each batch's statistics), but the export normalizes by the running statistics, so training it would "
            "differ from torch's; export the model in eval mode (model.eval()) to train it on the running statistics"
        )
    dy = _only_first_output(ctx, grad_outputs)
    x, scale, bias, mean, var = (ctx.input(index) for index in range(5))
    rank = _rank(ctx, x)
    not_channel = [0, *range(2, rank)]
    # scale and B (T1) and the statistics (T2) may have another element type than X (T).
    epsilon = ctx.scalar(_float(ctx, "epsilon", 1e-5), var)
    invstd = _convert(ctx, ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [var, epsilon])])]), var, x)
    dx = dscale = dbias = None
    if ctx.needs(0):
        factor = ctx.op("Mul", [_convert(ctx, scale, scale, x), invstd])
        dx = ctx.op("Mul", [dy, _per_channel(ctx, factor, rank)])
    if ctx.needs(1):
        centered = ctx.op("Sub", [x, _per_channel(ctx, _convert(ctx, mean, mean, x), rank)])
        normalized = ctx.op("Mul", [centered, _per_channel(ctx, invstd, rank)])
        summed = ctx.emitter.reduce_sum(ctx.op("Mul", [dy, normalized]), not_channel, keepdims=False)
        dscale = _convert(ctx, summed, x, scale)
    if ctx.needs(2):
        dbias = _convert(ctx, ctx.emitter.reduce_sum(dy, not_channel, keepdims=False), x, bias)
    return [dx, dscale, dbias, None, None]
