"""Gradient rules of MaxPool, AveragePool, LpPool and their Global forms against finite differences.

One table, checked like tests/test_autodiff_conv_rules.py: central finite differences in float64,
and float32 (graph optimizations on and off) against the float64 gradients (tests/gradcheck.py).
onnxruntime runs MaxPool in float64 but not AveragePool, GlobalMaxPool or GlobalAveragePool:
AveragePool's float64 rows run in ``onnx.reference`` (its AveragePool matches onnxruntime's,
``test_reference_average_pool_is_onnxruntimes``; the rule's Conv and ConvTranspose run in the NumPy
versions the Conv tests pin to onnxruntime), the global pools' float64 rows run a ReduceMean /
ReduceMax rewrite (``Case.float64_forward``); LpPool's in onnx.reference too (pinned to
onnxruntime's by ``test_reference_lp_pool_is_onnxruntimes``), GlobalLpPool's in NumPy. Random
inputs have no ties; the tie convention has its own test.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import onnx.reference
import onnxruntime as ort
import pytest
from gradcheck import (
    FLOAT32_RTOL,
    FLOAT64_ATOL,
    FLOAT64_RTOL,
    Case,
    analytic_gradients,
    build,
    check_case,
    check_case_float32,
    numeric_gradients,
    wrt,
)
from onnx import TensorProto, helper
from onnx.reference.op_run import OpRun
from test_autodiff_conv_rules import _FLOAT64_OPS as CONV_FLOAT64_OPS

import ortlstm.ops
from ortlstm.graphs import build_training_models, losses, optimizers
from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types, onnx_opset
from ortlstm.graphs.emit.emitter import used_names

_RNG = np.random.default_rng(31)


def _r(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape)


def _max(id: str, x: np.ndarray, *, dynamic: bool = False, indices: bool = False, opset: int = 17, **attributes):
    """A MaxPool row; with ``indices`` the forward node also outputs Indices (kept out of the loss)."""
    return Case(
        id,
        "MaxPool",
        (wrt(x, dynamic=dynamic),),
        attributes,
        opset=opset,
        num_outputs=2 if indices else 1,
        loss_outputs=(0,) if indices else None,
    )


def _average(id: str, x: np.ndarray, *, dynamic: bool = False, opset: int = 17, **attributes) -> Case:
    return Case(id, "AveragePool", (wrt(x, dynamic=dynamic),), attributes, opset=opset, float64_ops=CONV_FLOAT64_OPS)


def _global64(node: onnx.NodeProto, rank: int) -> list[onnx.NodeProto]:
    """The float64 forward of a global pool: ReduceMean / ReduceMax over the spatial axes, dims kept."""
    reduce = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}[node.op_type]
    return [helper.make_node(reduce, list(node.input), list(node.output), axes=list(range(2, rank)), keepdims=1)]


def _global(op_type: str, id: str, x: np.ndarray, *, dynamic: bool = False) -> Case:
    return Case(id, op_type, (wrt(x, dynamic=dynamic),), float64_forward=lambda node: _global64(node, x.ndim))


MAX_POOL_CASES = [
    _max("max_1d_overlapping_odd", _r(2, 3, 7), kernel_shape=[3]),
    _max("max_1d_stride2_pads", _r(1, 2, 9), kernel_shape=[2], strides=[2], pads=[1, 0]),
    _max("max_1d_ceil_mode", _r(1, 2, 8), kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1),
    _max("max_1d_dilations", _r(1, 2, 9), kernel_shape=[2], dilations=[3], strides=[2]),
    _max("max_2d_asym_pads_odd", _r(2, 2, 7, 5), kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1]),
    _max("max_2d_overlapping_with_indices", _r(1, 2, 5, 5), indices=True, kernel_shape=[3, 3]),
    _max("max_2d_storage_order_column_major", _r(1, 2, 5, 4), indices=True, kernel_shape=[2, 2], storage_order=1),
    _max("max_2d_same_upper", _r(1, 2, 7, 6), kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
    _max("max_2d_same_lower", _r(1, 1, 5, 6), kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
    _max("max_2d_valid", _r(1, 2, 6, 7), kernel_shape=[2, 3], strides=[2, 2], auto_pad="VALID"),
    _max("max_2d_ceil_dilations", _r(1, 1, 7, 8), kernel_shape=[2, 2], strides=[2, 3], dilations=[2, 1], ceil_mode=1),
    _max(
        "max_3d_pads_ceil",
        _r(1, 2, 4, 5, 3),
        kernel_shape=[2, 3, 2],
        strides=[2, 2, 1],
        pads=[1, 1, 0, 0, 1, 1],
        ceil_mode=1,
    ),
    _max("max_1d_dynamic_ceil", _r(2, 2, 8), dynamic=True, kernel_shape=[3], strides=[2], ceil_mode=1),
    _max(
        "max_2d_dynamic_same_upper",
        _r(2, 1, 5, 7),
        dynamic=True,
        kernel_shape=[3, 3],
        strides=[2, 2],
        auto_pad="SAME_UPPER",
    ),
    # before opset 16 (no scatter-add): disjoint window classes, each a plain scatter
    _max(
        "max_2d_opset13_overlapping", _r(1, 2, 6, 5), opset=13, kernel_shape=[3, 2], strides=[1, 1], pads=[1, 0, 1, 0]
    ),
    _max("max_1d_opset13_disjoint", _r(2, 2, 8), opset=13, kernel_shape=[2], strides=[2]),
    _max(
        "max_2d_opset13_dynamic_dilations",
        _r(1, 2, 7, 6),
        dynamic=True,
        opset=13,
        kernel_shape=[2, 2],
        dilations=[2, 2],
        strides=[1, 2],
    ),
]

AVERAGE_POOL_CASES = [
    _average("avg_1d_overlapping_odd", _r(2, 3, 7), kernel_shape=[3]),
    _average("avg_1d_pads_exclude", _r(1, 2, 7), kernel_shape=[3], strides=[2], pads=[1, 1]),
    _average("avg_1d_pads_include", _r(1, 2, 7), kernel_shape=[3], strides=[2], pads=[1, 1], count_include_pad=1),
    _average("avg_1d_ceil_exclude", _r(1, 2, 8), kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1),
    _average(
        "avg_1d_ceil_include", _r(1, 2, 8), kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1, count_include_pad=1
    ),
    _average("avg_1d_ceil_no_pads", _r(1, 2, 8), kernel_shape=[3], strides=[2], ceil_mode=1),
    _average(
        "avg_1d_dilations_opset19", _r(1, 2, 9), opset=19, kernel_shape=[2], strides=[2], dilations=[2], pads=[1, 0]
    ),
    _average(
        "avg_2d_asym_pads_include",
        _r(2, 2, 5, 6),
        kernel_shape=[3, 2],
        strides=[2, 1],
        pads=[1, 0, 0, 1],
        count_include_pad=1,
    ),
    _average(
        "avg_2d_same_upper_include",
        _r(1, 1, 5, 6),
        kernel_shape=[2, 3],
        strides=[2, 2],
        auto_pad="SAME_UPPER",
        count_include_pad=1,
    ),
    _average("avg_2d_same_lower_exclude", _r(1, 2, 5, 6), kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
    _average("avg_2d_valid", _r(1, 2, 6, 5), kernel_shape=[2, 2], strides=[2, 2], auto_pad="VALID"),
    _average(
        "avg_2d_ceil_dilations_include_opset19",
        _r(1, 1, 7, 6),
        opset=19,
        kernel_shape=[2, 2],
        strides=[2, 2],
        dilations=[2, 1],
        pads=[1, 1, 0, 1],
        ceil_mode=1,
        count_include_pad=1,
    ),
    _average(
        "avg_3d_pads_ceil_include",
        _r(1, 1, 4, 5, 6),
        kernel_shape=[2, 2, 3],
        strides=[1, 2, 2],
        pads=[1, 0, 1, 0, 1, 1],
        ceil_mode=1,
        count_include_pad=1,
    ),
    _average(
        "avg_1d_dynamic_ceil_exclude",
        _r(2, 2, 8),
        dynamic=True,
        kernel_shape=[3],
        strides=[2],
        pads=[1, 1],
        ceil_mode=1,
    ),
    _average(
        "avg_2d_dynamic_same_upper_include",
        _r(2, 1, 5, 7),
        dynamic=True,
        kernel_shape=[3, 3],
        strides=[2, 2],
        auto_pad="SAME_UPPER",
        count_include_pad=1,
    ),
    _average("avg_2d_opset13", _r(1, 2, 5, 5), opset=13, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
]

GLOBAL_POOL_CASES = [
    _global("GlobalAveragePool", "global_avg_1d", _r(2, 3, 7)),
    _global("GlobalAveragePool", "global_avg_2d", _r(2, 2, 3, 5)),
    _global("GlobalAveragePool", "global_avg_3d", _r(1, 2, 3, 2, 3)),
    _global("GlobalAveragePool", "global_avg_2d_dynamic", _r(2, 2, 3, 5), dynamic=True),
    _global("GlobalMaxPool", "global_max_1d", _r(2, 3, 7)),
    _global("GlobalMaxPool", "global_max_2d", _r(2, 2, 3, 5)),
    _global("GlobalMaxPool", "global_max_3d", _r(1, 2, 3, 2, 3)),
    _global("GlobalMaxPool", "global_max_2d_dynamic", _r(2, 2, 3, 5), dynamic=True),
]



class GlobalLpPool(OpRun):
    """GlobalLpPool in NumPy float64 (onnx.reference has none): (sum over the spatial axes of |x|^p)^(1/p)."""

    op_domain = ""

    def _run(self, x: np.ndarray, p: int = 2) -> tuple[np.ndarray]:
        return ((np.abs(x) ** p).sum(axis=tuple(range(2, x.ndim)), keepdims=True) ** (1.0 / p),)


def _lp(id: str, x: np.ndarray, *, dynamic: bool = False, opset: int = 18, **attributes) -> Case:
    """An LpPool row; float64 in onnx.reference (its LpPool; the rule's Conv and ConvTranspose in NumPy)."""
    return Case(id, "LpPool", (wrt(x, dynamic=dynamic),), attributes, opset=opset, float64_ops=CONV_FLOAT64_OPS)


def _global_lp(id: str, x: np.ndarray, *, dynamic: bool = False, **attributes) -> Case:
    return Case(id, "GlobalLpPool", (wrt(x, dynamic=dynamic),), attributes, float64_ops=(GlobalLpPool,))


LP_POOL_CASES = [
    _lp("lp_1d_p2_overlapping", _r(2, 3, 7), kernel_shape=[3]),
    _lp("lp_1d_p1_stride_pads", _r(1, 2, 9), p=1, kernel_shape=[2], strides=[2], pads=[1, 0]),
    _lp("lp_2d_p3_asym_pads", _r(2, 2, 5, 4), p=3, kernel_shape=[2, 2], strides=[2, 1], pads=[1, 0, 0, 1]),
    _lp("lp_2d_ceil_dilations", _r(1, 2, 7, 8), kernel_shape=[2, 2], strides=[2, 3], dilations=[2, 1], ceil_mode=1),
    _lp("lp_2d_same_upper", _r(1, 2, 7, 6), kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
    _lp("lp_2d_dynamic_p3", _r(2, 1, 5, 6), dynamic=True, p=3, kernel_shape=[3, 2], strides=[2, 2]),
    _lp("lp_2d_opset17", _r(1, 2, 5, 5), opset=17, kernel_shape=[2, 2], strides=[2, 2]),
    _global_lp("global_lp_1d_p2", _r(2, 3, 7)),
    _global_lp("global_lp_2d_p3", _r(2, 2, 3, 5), p=3),
    _global_lp("global_lp_2d_p1_dynamic", _r(2, 2, 3, 4), dynamic=True, p=1),
]

CASES = [*MAX_POOL_CASES, *AVERAGE_POOL_CASES, *GLOBAL_POOL_CASES, *LP_POOL_CASES]


def _single_node_model(case: Case, elem_type: int) -> onnx.ModelProto:
    (item,) = case.inputs
    graph = helper.make_graph(
        [helper.make_node(case.op_type, ["x"], ["y"], **case.attributes)],
        "pool",
        [helper.make_tensor_value_info("x", elem_type, item.value.shape)],
        [helper.make_tensor_value_info("y", elem_type, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=10)


def _pool_in_onnxruntime(case: Case) -> np.ndarray:
    (y,) = ort.InferenceSession(_single_node_model(case, TensorProto.FLOAT).SerializeToString()).run(
        None, {"x": case.inputs[0].value.astype(np.float32)}
    )
    return y


def _pool_in_reference(case: Case) -> np.ndarray:
    (y,) = onnx.reference.ReferenceEvaluator(_single_node_model(case, TensorProto.DOUBLE)).run(
        None, {"x": case.inputs[0].value}
    )
    return y


@functools.cache
def _onnxruntime_divides_ceil_windows_by_the_kernel() -> bool:
    """Whether this onnxruntime divides a ceil_mode window that overhangs the end pad unlike onnx.reference.

    Under count_include_pad=1 onnxruntime 1.19 divides such a window by the whole kernel, 1.32 and
    onnx.reference by its part inside the padded input.
    """
    probe = _average(
        "probe", np.arange(1.0, 9.0).reshape(1, 1, 8), kernel_shape=[3], strides=[2], ceil_mode=1, count_include_pad=1
    )
    return not np.allclose(_pool_in_onnxruntime(probe), _pool_in_reference(probe))


def _param(case: Case) -> object:
    """The case, expected to fail where this onnxruntime's AveragePool edge divisor is not the oracle's."""
    marks = []
    if case.op_type == "AveragePool" and case.attributes.get("ceil_mode") and case.attributes.get("count_include_pad"):
        marks.append(
            pytest.mark.xfail(
                _onnxruntime_divides_ceil_windows_by_the_kernel(),
                reason="this onnxruntime's AveragePool divides ceil_mode overhang windows unlike onnx.reference "
                "(the float64 oracle); the rule takes the divisor from the runtime's kernel",
                strict=True,
            )
        )
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_pool_gradient_matches_finite_differences(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("case", [_param(case) for case in CASES])
def test_pool_gradient_float32(case: Case, optimize: bool) -> None:
    check_case_float32(case, optimize)


@pytest.mark.parametrize("case", [_param(case) for case in AVERAGE_POOL_CASES])
def test_reference_average_pool_is_onnxruntimes(case: Case) -> None:
    """The float64 oracle (onnx.reference's AveragePool) computes onnxruntime's, edges and divisors included."""
    np.testing.assert_allclose(
        _pool_in_reference(case), _pool_in_onnxruntime(case), rtol=1e-5, atol=1e-6, err_msg=case.id
    )


@pytest.mark.parametrize("case", LP_POOL_CASES, ids=lambda case: case.id)
def test_reference_lp_pool_is_onnxruntimes(case: Case) -> None:
    """The float64 oracle (onnx.reference's LpPool, the NumPy GlobalLpPool) computes onnxruntime's."""
    evaluator = onnx.reference.ReferenceEvaluator(_single_node_model(case, TensorProto.DOUBLE), new_ops=[GlobalLpPool])
    (expected,) = evaluator.run(None, {"x": case.inputs[0].value})
    np.testing.assert_allclose(expected, _pool_in_onnxruntime(case), rtol=1e-5, atol=1e-6, err_msg=case.id)


def test_lp_pool_window_of_zeros_gets_no_gradient() -> None:
    # Y = 0 there: dY * Y^(1-p) would be inf and 0 * inf NaN; the rule gives 0, as torch's abs at 0.
    x = np.zeros((1, 1, 4))
    x[0, 0, 2:] = [1.5, -2.0]
    case = _lp("lp_zeros", x, kernel_shape=[2], strides=[2])
    built = build(case, np.float32)
    grad = analytic_gradients(built)["in0"]
    np.testing.assert_array_equal(grad[0, 0, :2], [0.0, 0.0])
    np.testing.assert_allclose(grad[0, 0, 2:], built.feeds["weight_out0"][0, 0, 1] * x[0, 0, 2:] / 2.5, rtol=1e-6)


@pytest.mark.parametrize(
    "case",
    [
        Case("max_pool", "MaxPool", (wrt(np.ones((1, 1, 3, 3))),), {"kernel_shape": [2, 2]}),
        Case(
            "max_pool_column_major",
            "MaxPool",
            (wrt(np.ones((1, 1, 3, 3))),),
            {"kernel_shape": [2, 2], "storage_order": 1},
        ),
        _global("GlobalMaxPool", "global_max_pool", np.ones((1, 1, 3, 3))),
    ],
    ids=lambda case: case.id,
)
def test_ties_send_the_gradient_to_the_first_maximum(case: Case) -> None:
    """All-equal windows: each window's dY goes to its first element in row-major order, as in torch.

    torch's CPU max_pool2d / adaptive_max_pool2d keep the first maximum of a window (its index),
    so their gradient is the same; finite differences do not apply at a tie.
    """
    built = build(case, np.float64)
    weights = built.feeds["weight_out0"]
    grad = built.session(built.with_gradients).run(None, built.feeds)[1]
    expected = np.zeros((1, 1, 3, 3))
    if case.op_type == "GlobalMaxPool":
        expected[0, 0, 0, 0] = weights.reshape(-1)[0]
    else:  # 2x2 windows at (0, 0), (0, 1), (1, 0), (1, 1): their first elements are those positions
        expected[0, 0, :2, :2] = weights[0, 0]
    np.testing.assert_array_equal(grad, expected)


@pytest.mark.parametrize(
    "case",
    [
        Case("max_pool", "MaxPool", (wrt(np.ones((1, 1, 3, 3))),), {"kernel_shape": [2, 2]}),
        _global("GlobalMaxPool", "global_max_pool", np.ones((1, 1, 3, 3))),
    ],
    ids=lambda case: case.id,
)
def test_ties_as_torch(case: Case) -> None:
    """At ties the rule's gradient is torch's (max_pool2d / adaptive_max_pool2d autograd on the CPU)."""
    torch = pytest.importorskip("torch")
    built = build(case, np.float64)
    weights = built.feeds["weight_out0"]
    grad = built.session(built.with_gradients).run(None, built.feeds)[1]
    x = torch.ones((1, 1, 3, 3), dtype=torch.float64, requires_grad=True)
    if case.op_type == "MaxPool":
        y = torch.nn.functional.max_pool2d(x, kernel_size=2, stride=1)
    else:
        y = torch.nn.functional.adaptive_max_pool2d(x, 1)
    (y * torch.from_numpy(weights)).sum().backward()
    np.testing.assert_array_equal(grad, x.grad.numpy())


def test_torch_pooling_export_gradient_is_torchs() -> None:
    """Max and average pools exported from torch with dynamo: the built gradient is torch autograd's.

    A CNN with ceil_mode, pads, count_include_pad both ways, dilations, 1-D and 3-D pools, exported
    with ``optimize=False`` and a dynamic batch; float32 in onnxruntime (it has no float64
    AveragePool) against torch in float64. The sizes keep every ceil_mode window starting inside the
    input (onnxruntime 1.19 keeps a window that starts in the end pad, torch drops it) and
    count_include_pad=1 off ceil_mode (1.19 divides an overhanging window by the whole kernel).
    """
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional

    class Pools(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
            self.conv1d = torch.nn.Conv1d(3, 2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.tanh(self.conv(x))
            a = functional.max_pool2d(h, 3, stride=2, padding=1, ceil_mode=True)
            b = functional.avg_pool2d(h, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
            c = functional.avg_pool2d(h, 2, stride=2, padding=1, count_include_pad=True)
            m3 = functional.max_pool3d(h.unsqueeze(1), 2, stride=1, dilation=(1, 2, 1))
            e = functional.max_pool1d(self.conv1d(h.flatten(2)), 3, stride=2)
            return (
                a.sum((2, 3))
                + b.mean((2, 3)) * c.mean((2, 3))
                + m3.flatten(1).mean(1, keepdim=True)
                + e.mean(2).sum(1, keepdim=True)
            )

    torch.manual_seed(0)
    module = Pools()
    program = torch.onnx.export(
        module,
        (torch.randn(2, 2, 8, 10),),
        dynamo=True,
        optimize=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_shapes=({0: torch.export.Dim("batch")},),
    )
    built = build_training_models(program.model_proto, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD())
    signature = built.signature
    rng = np.random.default_rng(3)
    batch = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in (("x", (3, 2, 8, 10)), ("target", (3, 3)))
    }
    names = [output.name for output in built.gradients.graph.output]
    session = ort.InferenceSession(built.gradients.SerializeToString(), ortlstm.ops.session_options())
    values = dict(zip(names, session.run(None, {**batch, **built.initial_params}), strict=True))

    module = module.double()
    loss = functional.mse_loss(
        module(torch.from_numpy(batch["x"]).double()), torch.from_numpy(batch["target"]).double()
    )
    loss.backward()
    assert float(values[signature.loss]) == pytest.approx(float(loss), rel=1e-5)
    for name, parameter in module.named_parameters():
        expected = parameter.grad.numpy()
        scale = max(float(np.max(np.abs(expected))), 1e-3)
        np.testing.assert_allclose(
            values[signature.grads[name]], expected, rtol=0, atol=FLOAT32_RTOL * scale, err_msg=name
        )


BATCH_DYNAMIC_IDS = (
    "max_1d_ceil_mode",
    "max_2d_same_upper",
    "max_2d_opset13_overlapping",
    "avg_1d_ceil_exclude",
    "avg_2d_same_upper_include",
    "global_avg_2d",
    "global_max_2d",
    "lp_2d_ceil_dilations",
    "global_lp_2d_p3",
)


@pytest.mark.parametrize("case", [case for case in CASES if case.id in BATCH_DYNAMIC_IDS], ids=lambda case: case.id)
def test_pool_gradient_with_only_the_batch_dynamic(case: Case) -> None:
    """X declared [N, C, static...] (a torch export's dynamic batch): spatial constants, run-time sizes.

    The rows' models from ``build`` with X's first dim made symbolic, differentiated again, against
    central differences.
    """
    static = build(case, np.float64)
    forward = onnx.ModelProto()
    forward.CopyFrom(static.forward)
    pool = helper.make_node(case.op_type, ["in0"], ["out0"], name="under_test", **case.attributes)
    stand_in = len(case.float64_forward(pool)) if case.float64_forward is not None else 1
    loss_nodes = list(forward.graph.node)[stand_in:]
    del forward.graph.node[:]
    forward.graph.node.extend([pool, *loss_nodes])
    batch = forward.graph.input[0].type.tensor_type.shape.dim[0]
    batch.Clear()
    batch.dim_param = "N"
    with_gradients = onnx.ModelProto()
    with_gradients.CopyFrom(forward)
    types = infer_value_types(forward)
    assert types["in0"].shape[0] == "N"
    emitter = GraphEmitter(onnx_opset(forward), used_names(forward.graph), types)
    result = build_backward(with_gradients.graph, {"out0": "weight_out0"}, ["in0"], emitter)
    with_gradients.graph.node.extend(emitter.nodes)
    with_gradients.graph.initializer.extend(emitter.initializers)
    with_gradients.graph.output.append(helper.make_empty_tensor_value_info(result.gradients["in0"]))
    if case.float64_forward is not None:  # the float64 stand-in for the pool, as ``build`` places it
        for model in (forward, with_gradients):
            nodes = list(model.graph.node)
            del model.graph.node[:]
            model.graph.node.extend([*case.float64_forward(nodes[0]), *nodes[1:]])
    built = dataclasses.replace(static, forward=forward, with_gradients=with_gradients)
    np.testing.assert_allclose(
        analytic_gradients(built)["in0"], numeric_gradients(built)["in0"], rtol=FLOAT64_RTOL, atol=FLOAT64_ATOL
    )
