"""The Conv gradient rule against central finite differences (float64) and in float32, one table.

Every row runs twice: as the train step builds it, the gradient one ``ortlstm::ConvGrad`` node
(the C++ kernel), and with ``ortlstm_ops=False``, the standard-op gradient (ConvTranspose, an
im2col Conv, MatMul). onnxruntime has no float64 Conv or ConvTranspose kernel, so the float64
rows run in ``onnx.reference.ReferenceEvaluator`` with the NumPy Conv and ConvTranspose below
(``Case.float64_ops``; onnx's own ConvTranspose mishandles group > 1) and ConvGrad run by the
library's float64 kernel in onnxruntime (``OrtConvGrad``). The float32 rows run the rule's graph in
onnxruntime (graph optimizations on and off) against those float64 gradients, and
``test_numpy_conv_is_onnxruntimes`` pins the NumPy forward to onnxruntime's Conv for every row.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.reference
import onnxruntime as ort
import pytest
from gradcheck import Case, build, check_case, check_case_float32, const, wrt
from onnx import TensorProto, helper
from onnx.reference.op_run import OpRun

import ortlstm.ops
from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types
from ortlstm.graphs.emit.emitter import used_names

_RNG = np.random.default_rng(21)


def _r(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape)


def _same_pads(
    spatial: tuple[int, ...], kernel: tuple[int, ...], strides: list[int], dilations: list[int], upper: bool
) -> list[int]:
    """ONNX auto_pad SAME_*: output ceil(in / s); the odd pad goes at the end (UPPER) or the start (LOWER)."""
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        begin = total // 2 if upper else total - total // 2
        begins.append(begin)
        ends.append(total - begin)
    return begins + ends


def _windows(start: tuple[int, ...], count: tuple[int, ...], strides: list[int]) -> tuple[slice, ...]:
    """Batch, channel, then per axis the positions start, start + s, ... (count of them)."""
    spatial = tuple(slice(b, b + (n - 1) * s + 1, s) for b, n, s in zip(start, count, strides, strict=True))
    return (slice(None), slice(None), *spatial)


class NumpyConv(OpRun):
    """ai.onnx Conv in float64: y[n, m, o] = b[m] + sum_{c, k} x_pad[n, c, o*s + k*d] w[m, c, k] per group."""

    op_domain = ""

    def _run(  # type: ignore[override]
        self, x, w, b=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, pads=None, strides=None
    ):
        kernel = w.shape[2:]
        r = len(kernel)
        strides = list(strides or [1] * r)
        dilations = list(dilations or [1] * r)
        group = int(group or 1)
        mode = auto_pad.decode() if isinstance(auto_pad, bytes) else (auto_pad or "NOTSET")
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            pads = _same_pads(x.shape[2:], kernel, strides, dilations, mode == "SAME_UPPER")
        elif mode == "VALID" or pads is None:
            pads = [0] * (2 * r)
        padded = np.pad(x, [(0, 0), (0, 0), *((pads[i], pads[i + r]) for i in range(r))])
        out = tuple((padded.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(r))
        channels, maps = x.shape[1] // group, w.shape[0] // group
        y = np.zeros((x.shape[0], w.shape[0], *out), dtype=x.dtype)
        for g in range(group):
            xg, wg = padded[:, g * channels : (g + 1) * channels], w[g * maps : (g + 1) * maps]
            for k in np.ndindex(*kernel):
                start = tuple(k[i] * dilations[i] for i in range(r))
                patch = xg[_windows(start, out, strides)]
                y[:, g * maps : (g + 1) * maps] += np.einsum(
                    "nc...,mc->nm...", patch, wg[(slice(None), slice(None), *k)]
                )
        if b is not None:
            y += b.reshape(1, -1, *([1] * r))
        return (y,)


class NumpyConvTranspose(OpRun):
    """ai.onnx ConvTranspose in float64; output_shape and auto_pad SAME_* place the output as the ONNX spec says.

    Total padding ``s*(in-1) + output_padding + k_eff - out`` (out = output_shape, or in * s for
    SAME_*), the odd one at the end for SAME_UPPER and at the start otherwise; a negative total
    (an output_shape past the full extent) appends zeros, as onnxruntime does.
    """

    op_domain = ""

    def _run(  # type: ignore[override]
        self,
        x,
        w,
        b=None,
        auto_pad=None,
        dilations=None,
        group=None,
        kernel_shape=None,
        output_padding=None,
        output_shape=None,
        pads=None,
        strides=None,
    ):
        mode = auto_pad.decode() if isinstance(auto_pad, bytes) else (auto_pad or "NOTSET")
        kernel = w.shape[2:]
        r = len(kernel)
        strides = list(strides or [1] * r)
        dilations = list(dilations or [1] * r)
        output_padding = list(output_padding or [0] * r)
        pads = list(pads or [0] * (2 * r))
        group = int(group or 1)
        size = x.shape[2:]
        full = [(size[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 + output_padding[i] for i in range(r)]
        if output_shape is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
            target = (
                list(output_shape)[-r:]
                if output_shape is not None
                else [n * s for n, s in zip(size, strides, strict=True)]
            )
            totals = [full[i] - target[i] for i in range(r)]
            begins = [max(t, 0) // 2 if mode == "SAME_UPPER" else max(t, 0) - max(t, 0) // 2 for t in totals]
            pads = begins + [t - b for t, b in zip(totals, begins, strict=True)]
        elif mode == "VALID":
            pads = [0] * (2 * r)
        channels, maps = x.shape[1] // group, w.shape[1]
        y = np.zeros((x.shape[0], maps * group, *full), dtype=x.dtype)
        for g in range(group):
            xg, wg = x[:, g * channels : (g + 1) * channels], w[g * channels : (g + 1) * channels]
            for k in np.ndindex(*kernel):
                start = tuple(k[i] * dilations[i] for i in range(r))
                target = (slice(None), slice(g * maps, (g + 1) * maps), *_windows(start, size, strides)[2:])
                y[target] += np.einsum("nc...,cm->nm...", xg, wg[(slice(None), slice(None), *k)])
        crop = tuple(slice(pads[i], full[i] - max(pads[i + r], 0)) for i in range(r))
        tail = [(0, max(-pads[i + r], 0)) for i in range(r)]  # an output_shape past the full extent: zeros
        y = np.pad(y[(slice(None), slice(None), *crop)], [(0, 0), (0, 0), *tail])
        if b is not None:
            y = y + b.reshape(1, -1, *([1] * r))
        return (y,)


class OrtConvGrad(OpRun):
    """ortlstm ConvGrad as the library's kernel runs it: the node alone in an onnxruntime session."""

    op_domain = ortlstm.ops.DOMAIN

    def _run(self, dy, x, w, **attributes):  # type: ignore[override]
        elem = helper.np_dtype_to_tensor_dtype(x.dtype)
        node = onnx.NodeProto()
        node.CopyFrom(self.onnx_node)
        graph = helper.make_graph(
            [node],
            "conv_grad",
            [helper.make_tensor_value_info(name, elem, None) for name in node.input],
            [helper.make_tensor_value_info(name, elem, None) for name in node.output if name],
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ortlstm.ops.DOMAIN, 1)],
            ir_version=10,
        )
        session = ort.InferenceSession(model.SerializeToString(), ortlstm.ops.session_options())
        values = iter(session.run(None, dict(zip(node.input, (dy, x, w), strict=True))))
        # The evaluator wants an array for every output slot; an omitted one ("") is never read.
        return tuple(next(values) if name else np.empty(0, x.dtype) for name in node.output)


# ReferenceEvaluator matches new_ops to nodes by class name (and domain).
_FLOAT64_OPS = (
    type("Conv", (NumpyConv,), {}),
    type("ConvTranspose", (NumpyConvTranspose,), {}),
    type("ConvGrad", (OrtConvGrad,), {}),
)


def _conv(
    id: str,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    dynamic: bool = False,
    op_type: str = "Conv",
    **attributes: object,
) -> Case:
    """A Conv (or ConvTranspose) row differentiated with respect to X, W and B (when given)."""
    inputs = [wrt(x, dynamic=dynamic), wrt(w)]
    if b is not None:
        inputs.append(wrt(b))
    return Case(id, op_type, tuple(inputs), attributes, float64_ops=_FLOAT64_OPS)


CASES = [
    # 1-D (silero's STFT and encoder layers)
    _conv("1d", _r(2, 3, 7), _r(4, 3, 3), _r(4)),
    _conv("1d_stride2_pads1", _r(2, 3, 8), _r(4, 3, 3), _r(4), strides=[2], pads=[1, 1]),
    _conv("1d_stride3_remainder", _r(1, 2, 8), _r(3, 2, 3), _r(3), strides=[3]),  # (8-3) % 3 = 2 >= d
    _conv("1d_dilation2_stride2_asym_pads", _r(2, 2, 9), _r(3, 2, 3), _r(3), strides=[2], dilations=[2], pads=[2, 1]),
    _conv("1d_group2", _r(2, 4, 7), _r(6, 2, 3), _r(6), group=2, strides=[2], pads=[1, 0]),
    _conv("1d_depthwise", _r(1, 3, 6), _r(3, 1, 3), None, group=3, pads=[1, 1]),
    _conv("1d_stft_like_no_bias", _r(2, 1, 16), _r(6, 1, 8), None, strides=[4]),
    _conv("1d_kernel1", _r(2, 4, 5), _r(1, 4, 1), _r(1)),
    _conv("1d_same_upper_stride2", _r(1, 2, 7), _r(3, 2, 4), _r(3), auto_pad="SAME_UPPER", strides=[2]),
    _conv("1d_same_lower_stride_beyond_kernel", _r(1, 2, 8), _r(2, 2, 2), None, auto_pad="SAME_LOWER", strides=[3]),
    _conv("1d_valid_kernel_shape", _r(1, 2, 6), _r(2, 2, 3), _r(2), auto_pad="VALID", kernel_shape=[3]),
    # 2-D
    _conv("2d", _r(1, 2, 5, 4), _r(3, 2, 3, 2), _r(3)),
    _conv(
        "2d_strides_dilations_asym_pads",
        _r(2, 2, 6, 5),
        _r(3, 2, 2, 2),
        _r(3),
        strides=[2, 1],
        dilations=[1, 2],
        pads=[1, 0, 0, 1],
    ),
    _conv("2d_group2_stride2", _r(1, 4, 5, 5), _r(4, 2, 3, 3), _r(4), group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
    _conv("2d_same_upper", _r(1, 2, 5, 6), _r(2, 2, 3, 2), None, auto_pad="SAME_UPPER", strides=[2, 3]),
    # dynamic dims: extents and SAME pads computed at run time
    _conv("1d_dynamic_stride2_pads1", _r(2, 3, 8), _r(4, 3, 3), _r(4), dynamic=True, strides=[2], pads=[1, 1]),
    _conv("1d_dynamic_stride3_remainder", _r(1, 2, 8), _r(3, 2, 3), None, dynamic=True, strides=[3]),
    _conv("1d_dynamic_same_lower", _r(1, 2, 7), _r(2, 2, 3), None, dynamic=True, auto_pad="SAME_LOWER", strides=[2]),
    _conv("1d_dynamic_group2", _r(2, 4, 7), _r(4, 2, 3), _r(4), dynamic=True, group=2, dilations=[2]),
    # (onnxruntime refuses SAME with dilations > 1, so SAME rows have none)
    _conv(
        "2d_dynamic_same_upper",
        _r(1, 2, 6, 5),
        _r(2, 2, 2, 3),
        _r(2),
        dynamic=True,
        auto_pad="SAME_UPPER",
        strides=[2, 2],
    ),
    # 3-D: the im2col kernel's taps in W's order
    _conv("3d_strides_pads", _r(1, 2, 4, 3, 5), _r(2, 2, 2, 2, 3), _r(2), strides=[1, 2, 2], pads=[1, 0, 1, 0, 1, 0]),
    # W's shape not static (kernel_shape given): dW through conv(X^T, dY^T)
    Case(
        "2d_weight_shape_dynamic",
        "Conv",
        (wrt(_r(2, 2, 5, 4)), wrt(_r(3, 2, 3, 2), dynamic=True), wrt(_r(3))),
        {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]},
        float64_ops=_FLOAT64_OPS,
    ),
    # only some inputs differentiated: X a constant (the STFT's input), W a constant
    Case(
        "1d_weight_only",
        "Conv",
        (const(_r(2, 1, 12)), wrt(_r(4, 1, 4)), wrt(_r(4))),
        {"strides": [2]},
        float64_ops=_FLOAT64_OPS,
    ),
    Case("1d_input_only", "Conv", (wrt(_r(2, 2, 6)), const(_r(3, 2, 3))), {"pads": [1, 1]}, float64_ops=_FLOAT64_OPS),
    # ConvLSTM-like: the cell's Conv over [x_t, h], 2-D, pads 1, several images
    _conv("2d_convlstm_cell", _r(3, 5, 6, 5), _r(8, 5, 3, 3), _r(8), pads=[1, 1, 1, 1]),
    _conv("2d_depthwise_same_lower", _r(2, 3, 5, 6), _r(3, 1, 3, 3), _r(3), group=3, auto_pad="SAME_LOWER"),
    _conv(
        "2d_group3_dilations_strides", _r(2, 6, 7, 7), _r(9, 2, 2, 3), None, group=3, strides=[2, 2], dilations=[2, 1]
    ),
]


_convt = functools.partial(_conv, op_type="ConvTranspose")
"""A ConvTranspose row (W ``[C, M/group, k...]``) differentiated with respect to X, W and B (when given)."""

TRANSPOSED_CASES = [
    # 1-D (NSNet2/DeepFilterNet-like upsampling)
    _convt("convT_1d", _r(2, 3, 5), _r(3, 4, 3), _r(4)),
    _convt(
        "convT_1d_stride2_pads_output_padding",
        _r(2, 3, 5),
        _r(3, 2, 3),
        _r(2),
        strides=[2],
        pads=[1, 0],
        output_padding=[1],
    ),
    _convt(
        "convT_1d_stride3_dilation2_output_padding2",
        _r(1, 2, 4),
        _r(2, 3, 2),
        None,
        strides=[3],
        dilations=[2],
        output_padding=[2],
    ),
    _convt("convT_1d_group2", _r(2, 4, 5), _r(4, 3, 3), _r(6), group=2, strides=[2], pads=[1, 1]),
    _convt("convT_1d_depthwise", _r(1, 3, 4), _r(3, 1, 3), _r(3), group=3, strides=[2]),
    _convt("convT_1d_output_shape", _r(1, 2, 4), _r(2, 2, 3), _r(2), strides=[2], output_shape=[8]),
    _convt("convT_1d_output_shape_past_full", _r(1, 2, 3), _r(2, 2, 3), _r(2), strides=[2], output_shape=[8]),
    _convt("convT_1d_same_upper", _r(1, 2, 4), _r(2, 2, 3), None, strides=[2], auto_pad="SAME_UPPER"),
    _convt("convT_1d_same_lower", _r(1, 2, 4), _r(2, 2, 3), _r(2), strides=[2], auto_pad="SAME_LOWER"),
    _convt("convT_1d_valid_kernel_shape", _r(1, 2, 4), _r(2, 2, 3), None, auto_pad="VALID", kernel_shape=[3]),
    _convt(
        "convT_1d_dynamic_stride2_pads",
        _r(2, 3, 5),
        _r(3, 2, 3),
        _r(2),
        dynamic=True,
        strides=[2],
        pads=[1, 2],
        output_padding=[1],
    ),
    # 2-D
    _convt("convT_2d", _r(1, 2, 3, 4), _r(2, 3, 3, 2), _r(3)),
    _convt(
        "convT_2d_strides_asym_pads_output_padding",
        _r(2, 2, 3, 4),
        _r(2, 2, 3, 3),
        _r(2),
        strides=[2, 1],
        pads=[1, 0, 0, 1],
        output_padding=[1, 0],
    ),
    _convt(
        "convT_2d_group2_dilations", _r(1, 4, 3, 3), _r(4, 1, 2, 2), _r(2), group=2, strides=[2, 2], dilations=[2, 1]
    ),
    _convt(
        "convT_2d_dfnet_like_freq_upsample",
        _r(2, 2, 3, 4),
        _r(2, 2, 1, 3),
        None,
        group=2,
        strides=[1, 2],
        pads=[0, 1, 0, 1],
        output_padding=[0, 1],
    ),
    _convt(
        "convT_2d_same_upper_output_shape",
        _r(1, 2, 3, 3),
        _r(2, 2, 2, 3),
        _r(2),
        auto_pad="SAME_UPPER",
        strides=[2, 2],
        output_shape=[5, 6],
    ),
    _convt(  # H one past its full extent (a zero tail plus the bias), W cut by a begin pad
        "convT_2d_output_shape_past_and_pads",
        _r(1, 2, 3, 3),
        _r(2, 2, 3, 2),
        _r(2),
        strides=[2, 1],
        output_shape=[8, 3],
    ),
    # 3-D
    _convt(
        "convT_3d_strides_pads", _r(1, 2, 2, 3, 2), _r(2, 2, 2, 2, 2), _r(2), strides=[1, 2, 2], pads=[0, 1, 0, 1, 0, 0]
    ),
    # W's shape not static: the standard-op dW through conv(dY^T, X^T)
    Case(
        "convT_2d_weight_shape_dynamic",
        "ConvTranspose",
        (wrt(_r(2, 2, 3, 3)), wrt(_r(2, 3, 2, 2), dynamic=True), wrt(_r(3))),
        {"kernel_shape": [2, 2], "strides": [2, 1], "pads": [1, 0, 0, 1]},
        float64_ops=_FLOAT64_OPS,
    ),
    Case(
        "convT_1d_weight_only",
        "ConvTranspose",
        (const(_r(2, 1, 5)), wrt(_r(1, 3, 4)), wrt(_r(3))),
        {"strides": [2]},
        float64_ops=_FLOAT64_OPS,
    ),
    Case(
        "convT_1d_input_only",
        "ConvTranspose",
        (wrt(_r(2, 2, 4)), const(_r(2, 3, 3))),
        {"pads": [1, 1], "strides": [2]},
        float64_ops=_FLOAT64_OPS,
    ),
]
# onnxruntime 1.19 (the training environment's) runs this and newer versions refuse it: an
# output_padding at or past the stride (below the dilation, as torch allows). float64 runs
# everywhere (the NumPy oracle), float32 where the runtime runs the forward. (An output_shape a
# stride or more past the full extent is refused by newer versions and leaves 1.19's tail
# uninitialized: no row.)
LENIENT_TRANSPOSED_CASES = [
    _convt("convT_1d_output_padding_past_stride", _r(1, 2, 4), _r(2, 2, 3), _r(2), dilations=[2], output_padding=[1]),
]
_LENIENT = {case.id for case in LENIENT_TRANSPOSED_CASES}
TRANSPOSED_CASES += LENIENT_TRANSPOSED_CASES


def _skip_where_the_runtime_refuses(case: Case) -> None:
    """Skips a LENIENT_TRANSPOSED_CASES row whose forward this onnxruntime refuses (newer than 1.19)."""
    if case.id.removesuffix("-standard_ops") not in _LENIENT:
        return
    names = [f"in{index}" for index in range(len(case.inputs))]
    graph = helper.make_graph(
        [helper.make_node(case.op_type, names, ["y"], **case.attributes)],
        "forward",
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, item.value.shape)
            for name, item in zip(names, case.inputs, strict=True)
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=10)
    feeds = {name: item.value.astype(np.float32) for name, item in zip(names, case.inputs, strict=True)}
    try:
        ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    except Exception as error:  # onnxruntime's error types differ by version
        pytest.skip(f"onnxruntime {ort.__version__} refuses the forward ({str(error).splitlines()[0][:200]})")


_BOTH = [
    *CASES,
    *TRANSPOSED_CASES,
    *(dataclasses.replace(case, id=f"{case.id}-standard_ops", ortlstm_ops=False) for case in CASES + TRANSPOSED_CASES),
]


@pytest.mark.parametrize("case", _BOTH, ids=lambda case: case.id)
def test_conv_gradient_matches_finite_differences(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("case", _BOTH, ids=lambda case: case.id)
def test_conv_gradient_float32(case: Case, optimize: bool) -> None:
    _skip_where_the_runtime_refuses(case)
    check_case_float32(case, optimize)


@pytest.mark.parametrize("case", CASES + TRANSPOSED_CASES, ids=lambda case: case.id)
def test_numpy_conv_is_onnxruntimes(case: Case) -> None:
    """The float64 oracle computes onnxruntime's Conv and ConvTranspose to float32 accuracy.

    Pads, SAME placement, ConvTranspose's output_shape and output_padding, groups.
    """
    _skip_where_the_runtime_refuses(case)
    names = [f"in{index}" for index in range(len(case.inputs))]
    values = [item.value for item in case.inputs]

    def model(elem_type: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node(case.op_type, names, ["y"], **case.attributes)],
            "conv",
            [
                helper.make_tensor_value_info(name, elem_type, value.shape)
                for name, value in zip(names, values, strict=True)
            ],
            [helper.make_tensor_value_info("y", elem_type, None)],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=10)

    (expected,) = ort.InferenceSession(model(TensorProto.FLOAT).SerializeToString()).run(
        None, {name: value.astype(np.float32) for name, value in zip(names, values, strict=True)}
    )
    reference = onnx.reference.ReferenceEvaluator(model(TensorProto.DOUBLE), new_ops=list(_FLOAT64_OPS))
    (got,) = reference.run(None, dict(zip(names, values, strict=True)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=case.id)


def test_static_geometry_is_one_conv_transpose_and_one_im2col_conv() -> None:
    """With X's spatial dims static, dX is one ConvTranspose and dW an im2col Conv and one MatMul.

    dX is a ConvTranspose with pads and output_padding set; dW's windows come from one Conv with
    the forward's geometry, group = C and a one-hot kernel. No run-time shape arithmetic.
    """
    case = dataclasses.replace(
        _conv("static", _r(2, 3, 8), _r(4, 3, 3), _r(4), strides=[2], pads=[1, 1]), ortlstm_ops=False
    )
    built = build(case, np.float32)
    forward_count = len(built.forward.graph.node)
    op_types = [node.op_type for node in built.with_gradients.graph.node[forward_count:]]
    assert op_types.count("ConvTranspose") == 1, op_types
    assert op_types.count("Conv") == 1, op_types
    assert op_types.count("MatMul") == 1, op_types
    assert not {"Shape", "Slice", "Pad"} & set(op_types), op_types
    transpose = next(node for node in built.with_gradients.graph.node if node.op_type == "ConvTranspose")
    attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in transpose.attribute}
    assert attributes["pads"] == [1, 1]
    assert attributes["output_padding"] == [1]  # (8 + 2 - 3) % 2 = 1
    conv = next(node for node in built.with_gradients.graph.node[forward_count:] if node.op_type == "Conv")
    attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in conv.attribute}
    assert (attributes["pads"], attributes["strides"], attributes["group"]) == ([1, 1], [2], 3)
    kernel = next(init for init in built.with_gradients.graph.initializer if init.name == conv.input[1])
    one_hot = onnx.numpy_helper.to_array(kernel)
    assert one_hot.shape == (9, 1, 3)  # C * K output channels, one input channel per group
    np.testing.assert_array_equal(one_hot[:, 0, :], np.tile(np.eye(3), (3, 1)))


def test_train_step_gradient_is_one_conv_grad_node_with_the_outputs_needed() -> None:
    """With the library (the default), dX/dW/dB are one ConvGrad node; outputs no input needs are omitted.

    The node carries the forward's geometry with SAME pads resolved (X static) and no standard-op gradient.
    """
    case = Case(
        "weight_only", "Conv", (const(_r(2, 3, 8)), wrt(_r(4, 3, 3))), {"auto_pad": "SAME_UPPER", "strides": [2]}
    )
    built = build(case, np.float32)
    forward_count = len(built.forward.graph.node)
    grad_nodes = built.with_gradients.graph.node[forward_count:]
    assert [node.op_type for node in grad_nodes] == ["ConvGrad"], [node.op_type for node in grad_nodes]
    (node,) = grad_nodes
    assert node.domain == ortlstm.ops.DOMAIN
    assert list(node.input) == [*node.input[:1], "in0", "in1"]
    assert len(node.output) == 2  # dB absent (no bias)
    assert node.output[0] == ""  # dX not needed
    assert node.output[1]
    attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
    assert attributes == {"strides": [2], "dilations": [1], "group": 1, "kernel_shape": [3], "pads": [0, 1]}


def test_float16_conv_keeps_the_standard_op_gradient() -> None:
    """ConvGrad takes float32 and float64 only: a float16 Conv gets ConvTranspose/Conv/MatMul."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1]), helper.make_node("ReduceSum", ["y"], ["loss"])],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3, 8])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT16, [1, 1, 1])],
        [onnx.numpy_helper.from_array(_r(4, 3, 3).astype(np.float16), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    emitter = GraphEmitter(17, used_names(model.graph), infer_value_types(model))
    build_backward(model.graph, "loss", ["x", "w"], emitter)
    op_types = {node.op_type for node in emitter.nodes}
    assert "ConvGrad" not in op_types, op_types
    assert {"ConvTranspose", "MatMul"} <= op_types, op_types


def test_conv_transpose_output_shape_with_dynamic_input_is_refused_by_name() -> None:
    """output_shape places Y by X's spatial dims; with them symbolic the rule says so and what to pass."""
    case = Case(
        "dynamic_output_shape",
        "ConvTranspose",
        (wrt(_r(1, 2, 4), dynamic=True), wrt(_r(2, 2, 3))),
        {"strides": [2], "output_shape": [8]},
    )
    with pytest.raises(
        ValueError, match=r"ConvTranspose node 'under_test': output_shape places .* \(fixed_shapes=\.\.\.\)"
    ):
        build(case, np.float32)
