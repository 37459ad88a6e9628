"""Gradients of standard ops as single ops (ConvGrad, SigmoidGrad, TanhGrad; com.microsoft's contracts).

Part of the op contract (``ops/schema.py``).
"""

from __future__ import annotations

from ortlstm.ops.contract import DOMAIN, OPSET_VERSION, AttrSpec, AttrType, OpSpec, PortSpec, TypeConstraintSpec
from ortlstm.ops.family import AxisOf, Family, OutputShape
from ortlstm.ops.spec_lstm import MATMUL_PRECISION

# ---- Gradients of standard ops ------------------------------------------------------------------
# The backward of a standard ONNX op in one op where the standard-op formulation is slow, each with
# the contract of onnxruntime's com.microsoft op of the same name (same port names and order, same
# attributes), so that either can take the other's node. Their ports have their own dims
# (shape_doc): for ConvGrad N (batch), C (input channels), M (output maps), G (group), in... /
# out... / k... (X's, Y's and W's spatial dims).

_GRADIENT_FLOAT = TypeConstraintSpec(
    type_str="T",
    allowed_types=("tensor(float)", "tensor(double)"),
    doc="Every port: float32, or float64 for gradient checks.",
)


def _gradient_port(name: str, doc: str, shape: str, *, optional: bool = False) -> PortSpec:
    return PortSpec(
        name=name, doc=doc, shape=(), type_str="T", optional=optional, differentiable=False, shape_doc=shape
    )


_CONV_ATTRIBUTES = (
    AttrSpec(
        name="auto_pad",
        type=AttrType.STRING,
        default="NOTSET",
        required=False,
        doc=(
            "As the forward Conv's: NOTSET (explicit `pads`), VALID (no padding), SAME_UPPER or SAME_LOWER "
            "(out = ceil(in / stride), the odd pad at the end or the beginning)."
        ),
        accepts="NOTSET, VALID, SAME_UPPER or SAME_LOWER; with any but NOTSET, no `pads`",
    ),
    AttrSpec(
        name="dilations",
        type=AttrType.INTS,
        default=None,
        required=False,
        doc="As the forward Conv's; 1 per spatial axis when omitted.",
        accepts="one integer >= 1 per spatial axis",
    ),
    AttrSpec(
        name="group",
        type=AttrType.INT,
        default=1,
        required=False,
        doc="As the forward Conv's: C and M are split into G groups, group g's maps read group g's channels only.",
        accepts="an integer >= 1 that divides M and equals C / (W's second axis)",
    ),
    AttrSpec(
        name="kernel_shape",
        type=AttrType.INTS,
        default=None,
        required=False,
        doc="As the forward Conv's; W's spatial dims when omitted.",
        accepts="W's spatial dims",
    ),
    AttrSpec(
        name="pads",
        type=AttrType.INTS,
        default=None,
        required=False,
        doc="As the forward Conv's: the begin pads then the end pads of each spatial axis; 0 when omitted.",
        accepts="two integers >= 0 per spatial axis",
    ),
    AttrSpec(
        name="strides",
        type=AttrType.INTS,
        default=None,
        required=False,
        doc="As the forward Conv's; 1 per spatial axis when omitted.",
        accepts="one integer >= 1 per spatial axis",
    ),
    MATMUL_PRECISION,
)

CONV_GRAD = OpSpec(
    name="ConvGrad",
    domain=DOMAIN,
    version=OPSET_VERSION,
    doc="""\
Gradients of a standard ONNX `Conv` `Y = conv(X, W) + B` (N-D: 1-D, 2-D, 3-D, ...) with respect to
X, W and B, given the gradient dY of Y. A drop-in for onnxruntime's com.microsoft ConvGrad (of the
training build): the same ports and attributes, which are the forward Conv's.

With G groups, Cg = C/G channels and Mg = M/G maps per group, K taps and `cols = im2col(X[n, g])`
([Cg*K, O]: tap j of channel c at each of the O output positions, 0 in the padding):

    dW[g] = sum_n dY[n, g] cols^T                  ([Mg, O] x [O, Cg*K], one GEMM per image and group)
    dX[n, g] = col2im(W[g]^T dY[n, g])              (each column entry added to the element its tap read)
    dB[m] = sum over n and the output positions of dY[n, m]

Images are split over the session's intra-op threads (each running the BLAS single-threaded); each
part sums its own dW, and the parts are added in a fixed order, so results do not depend on
scheduling. dB is summed in float64. Omitted outputs are not computed.""",
    inputs=(
        _gradient_port("dY", "Gradient with respect to the forward Conv's output Y.", "[N, M, out...]"),
        _gradient_port("X", "The forward Conv's input.", "[N, C, in...]"),
        _gradient_port("W", "The forward Conv's weight.", "[M, C/G, k...]"),
    ),
    outputs=(
        _gradient_port("dX", "Gradient with respect to X.", "[N, C, in...]", optional=True),
        _gradient_port("dW", "Gradient with respect to W.", "[M, C/G, k...]", optional=True),
        _gradient_port("dB", "Gradient with respect to the bias B.", "[M]", optional=True),
    ),
    attributes=_CONV_ATTRIBUTES,
    type_constraints=(_GRADIENT_FLOAT,),
    refusals=(
        "When run, before any work: X of rank < 3, W of another rank than X's, dY of another shape than "
        "[N, M, out...] with out = floor((in + pad_begin + pad_end - (k - 1) * dilation - 1) / stride) + 1 per axis "
        "(SAME: ceil(in / stride)); C other than G times W's second axis, M not divisible by G; kernel_shape other "
        "than W's spatial dims; strides, dilations or pads of the wrong length or out of range; a GEMM dim above "
        "2^31 - 1. Each message names the input or attribute with the expected and actual values.",
    ),
)


def _activation_grad(name: str, activation: str, formula: str) -> OpSpec:
    return OpSpec(
        name=name,
        domain=DOMAIN,
        version=OPSET_VERSION,
        doc=f"""\
Gradient of a standard ONNX `{activation}` `Y = {activation.lower()}(X)` with respect to X, from its
output Y and the gradient dY of Y, in one pass (a drop-in for onnxruntime's com.microsoft {name}):

    {formula}

computed in that order, each operation rounded as the standard ops would round it (no fused
multiply-adds), so the result equals the standard-op gradient's bit for bit. Split over the
session's intra-op threads in fixed chunks.""",
        inputs=(
            _gradient_port("dY", f"Gradient with respect to the {activation}'s output Y.", "as Y"),
            _gradient_port("Y", f"The forward {activation}'s output.", "any"),
        ),
        outputs=(_gradient_port("dX", "Gradient with respect to X.", "as Y"),),
        attributes=(),
        type_constraints=(_GRADIENT_FLOAT,),
        refusals=("When run: dY of another shape than Y's (the message gives both).",),
    )


SIGMOID_GRAD = _activation_grad("SigmoidGrad", "Sigmoid", "dX = dY * (Y * (1 - Y))")
TANH_GRAD = _activation_grad("TanhGrad", "Tanh", "dX = dY * (1 - Y * Y)")

GRADIENT_OPS: tuple[OpSpec, ...] = (CONV_GRAD, SIGMOID_GRAD, TANH_GRAD)
"""Gradients of standard ops (Conv, Sigmoid, Tanh): ops with their own dims and attributes, like the CTC ops."""

GRADIENT_FAMILY = Family(
    name="gradients",
    ops=GRADIENT_OPS,
    doc_label="gradients of standard ops",
    output_shapes={
        CONV_GRAD.name: (
            OutputShape("dX", "X"),
            OutputShape("dW", "W"),
            OutputShape("dB", "W", (AxisOf("W", 0),)),  # [M], the maps: W's first axis
        ),
        **{op.name: (OutputShape("dX", "dY"),) for op in (SIGMOID_GRAD, TANH_GRAD)},
    },
)
"""The gradients of standard ops: their attributes are their own; each output is shaped like an input."""
