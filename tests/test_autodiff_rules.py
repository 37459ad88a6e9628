"""Every gradient rule against central finite differences (float64) and in float32, in onnxruntime.

One table of cases; each rule has at least one row. See tests/gradcheck.py for the method. Random
data keeps away from non-differentiable points (ties of Max/Min/ReduceMax, |x| near 0 for Abs,
Clip's bounds); the conventions at those points (torch's) have exact tests of their own below.
"""

from __future__ import annotations

import ast
import functools
import math
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gradcheck import OMITTED, Case, analytic_gradients, build, check_case, check_case_float32, const, fed, wrt
from onnx import TensorProto, helper

from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types
from ortlstm.graphs.emit.emitter import used_names

_RNG = np.random.default_rng(7)

INT64_MAX = np.iinfo(np.int64).max


def _r(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape)


def _away(*shape: int) -> np.ndarray:
    """Random values with 0.5 <= |x| <= 1.5 (away from 0: Abs, Div, Reciprocal)."""
    return _RNG.uniform(0.5, 1.5, shape) * _RNG.choice([-1.0, 1.0], shape)


def _pos(*shape: int) -> np.ndarray:
    """Random values in [0.5, 2] (Log, Sqrt, Pow bases)."""
    return _RNG.uniform(0.5, 2.0, shape)


def _distinct(*shape: int) -> np.ndarray:
    """A random permutation of well separated values (no ties within one tensor)."""
    return (_RNG.permutation(int(np.prod(shape))) * 0.37 - 1.0).reshape(shape)


def _i(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _float64_constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, np.float64)))


def _erf_float64(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """erf(x) = 2/sqrt(pi) * sum_k (-1)^k x^(2k+1) / (k! (2k+1)): 40 terms, exact to 1e-15 for |x| <= 2.

    onnxruntime has no float64 Erf kernel; the float32 check runs the real one.
    """
    k = np.arange(40)
    coefficients = 2 / np.sqrt(np.pi) * (-1.0) ** k / (np.array([math.factorial(i) for i in k], float) * (2 * k + 1))
    (x,), (y,) = node.input, node.output
    return [
        _float64_constant("erf_powers", 2.0 * k + 1),
        _float64_constant("erf_coefficients", coefficients),
        helper.make_node("Constant", [], ["erf_axis"], value=onnx.numpy_helper.from_array(_i([-1]))),
        helper.make_node("Unsqueeze", [x, "erf_axis"], ["erf_x"]),
        helper.make_node("Pow", ["erf_x", "erf_powers"], ["erf_terms"]),
        helper.make_node("Mul", ["erf_terms", "erf_coefficients"], ["erf_scaled"]),
        helper.make_node("ReduceSum", ["erf_scaled", "erf_axis"], [y], keepdims=0),
    ]


def _mean_float64(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Mean as Sum / n (onnxruntime has no float64 Mean kernel)."""
    return [
        helper.make_node("Sum", list(node.input), ["mean_sum"]),
        _float64_constant("mean_count", np.asarray(float(len(node.input)))),
        helper.make_node("Div", ["mean_sum", "mean_count"], list(node.output)),
    ]


CASES = [
    Case("Add_broadcast", "Add", (wrt(_r(2, 3, 4)), wrt(_r(3, 1)))),
    Case("Add_broadcast_dynamic", "Add", (wrt(_r(2, 3, 4), dynamic=True), wrt(_r(1, 4), dynamic=True))),
    Case("Mul_scalar", "Mul", (wrt(_r(2, 3)), wrt(_r()))),
    Case("Mul_same_input_twice", "Mul", (wrt(_r(3, 2)),) * 2),
    Case("Tanh", "Tanh", (wrt(_r(2, 5)),)),
    # ---- elementwise arithmetic
    Case("Sub_broadcast", "Sub", (wrt(_r(2, 3)), wrt(_r(3)))),
    Case("Sub_broadcast_dynamic", "Sub", (wrt(_r(2, 1, 3), dynamic=True), wrt(_r(4, 1), dynamic=True))),
    Case("Sub_rhs_only", "Sub", (const(_r(2, 3)), wrt(_r(2, 3)))),
    Case("Div_broadcast", "Div", (wrt(_r(2, 3)), wrt(_away(3, 1, 1)))),
    Case("Div_scalar_dynamic", "Div", (wrt(_r(3, 2), dynamic=True), wrt(_away(), dynamic=True))),
    Case("Div_denominator_only", "Div", (const(_r(3)), wrt(_away(3)))),
    Case("Neg", "Neg", (wrt(_r(2, 3)),)),
    Case("Pow_constant_exponent", "Pow", (wrt(_pos(2, 3)), const(2.5))),
    Case("Pow_int_exponent", "Pow", (wrt(_away(2, 3)), const(3, dtype=np.int64))),
    Case("Pow_fed_exponent", "Pow", (wrt(_pos(3, 2), dynamic=True), fed(_r(2), dynamic=True))),
    Case("Pow_both_broadcast", "Pow", (wrt(_pos(2, 3)), wrt(_r(3)))),
    Case("Pow_exponent_only", "Pow", (const(_pos(2, 3)), wrt(_r(1, 1)))),
    Case("Sqrt", "Sqrt", (wrt(_pos(2, 3)),)),
    Case("Exp", "Exp", (wrt(_r(2, 3)),)),
    Case("Log", "Log", (wrt(_pos(2, 3)),)),
    Case("Abs", "Abs", (wrt(_away(2, 3)),)),
    Case("Reciprocal", "Reciprocal", (wrt(_away(2, 3)),)),
    Case("Erf", "Erf", (wrt(_RNG.uniform(-1.8, 1.8, (2, 3))),), float64_forward=_erf_float64),
    Case("Identity", "Identity", (wrt(_r(2, 3)),)),
    Case("Cast_to_double", "Cast", (wrt(_r(2, 3)),), {"to": TensorProto.DOUBLE}),
    Case("Cast_to_double_dynamic", "Cast", (wrt(_r(3), dynamic=True),), {"to": TensorProto.DOUBLE}),
    Case("CastLike", "CastLike", (wrt(_r(2, 3)), const(np.zeros(1))), opset=15),
    Case("CastLike_dynamic_opset21", "CastLike", (wrt(_r(4), dynamic=True), const(np.zeros(1))), opset=21),
    # ---- matrix products
    Case("MatMul_2d", "MatMul", (wrt(_r(3, 4)), wrt(_r(4, 2)))),
    Case("MatMul_batched_broadcast", "MatMul", (wrt(_r(2, 1, 3, 4)), wrt(_r(3, 4, 2)))),
    Case("MatMul_batch_times_matrix", "MatMul", (wrt(_r(2, 3, 4)), wrt(_r(4, 2)))),
    Case("MatMul_vector_left", "MatMul", (wrt(_r(4)), wrt(_r(2, 4, 3)))),
    Case("MatMul_vector_right", "MatMul", (wrt(_r(2, 3, 4)), wrt(_r(4)))),
    Case("MatMul_vectors", "MatMul", (wrt(_r(4)), wrt(_r(4)))),
    Case("MatMul_dynamic", "MatMul", (wrt(_r(2, 3, 4), dynamic=True), wrt(_r(4, 2), dynamic=True))),
    Case("MatMul_dynamic_broadcast", "MatMul", (wrt(_r(2, 1, 3, 4), dynamic=True), wrt(_r(2, 4, 2), dynamic=True))),
    Case("MatMul_dynamic_vector", "MatMul", (wrt(_r(4), dynamic=True), wrt(_r(2, 4, 3), dynamic=True))),
    Case("Gemm_C_row", "Gemm", (wrt(_r(3, 4)), wrt(_r(4, 2)), wrt(_r(2)))),
    Case("Gemm_transA_C_column", "Gemm", (wrt(_r(4, 3)), wrt(_r(4, 2)), wrt(_r(3, 1))), {"transA": 1, "alpha": 0.5}),
    Case("Gemm_transB_C_scalar", "Gemm", (wrt(_r(3, 4)), wrt(_r(2, 4)), wrt(_r())), {"transB": 1, "beta": 2.0}),
    Case(
        "Gemm_transAB_C_full",
        "Gemm",
        (wrt(_r(4, 3)), wrt(_r(2, 4)), wrt(_r(3, 2))),
        {"transA": 1, "transB": 1, "alpha": 1.5, "beta": -0.5},
    ),
    Case("Gemm_no_C_dynamic", "Gemm", (wrt(_r(3, 4), dynamic=True), wrt(_r(2, 4), dynamic=True)), {"transB": 1}),
    Case(
        "Gemm_C_dynamic",
        "Gemm",
        (wrt(_r(3, 4), dynamic=True), const(_r(4, 2)), wrt(_r(1, 2), dynamic=True)),
        {"beta": 0.5},
    ),
    # ---- variadic and selecting elementwise ops
    Case("Sum_variadic_broadcast", "Sum", (wrt(_r(2, 3)), wrt(_r(3)), wrt(_r(2, 1)))),
    Case("Sum_single", "Sum", (wrt(_r(2, 3)),)),
    Case("Sum_dynamic", "Sum", (wrt(_r(2, 3), dynamic=True), const(_r(3)), wrt(_r(1), dynamic=True))),
    Case(
        "Mean_variadic_broadcast",
        "Mean",
        (wrt(_r(2, 3)), wrt(_r(3)), wrt(_r(2, 1))),
        float64_forward=_mean_float64,
    ),
    Case(
        "Mean_dynamic",
        "Mean",
        (wrt(_r(2, 3), dynamic=True), wrt(_r(2, 3), dynamic=True)),
        float64_forward=_mean_float64,
    ),
    Case("Max_two", "Max", (wrt(_distinct(2, 3)), wrt(_distinct(2, 3) + 0.1))),
    Case("Max_variadic_broadcast", "Max", (wrt(_distinct(2, 3)), wrt(_distinct(3) + 0.1), wrt(_distinct(2, 1) + 0.2))),
    Case("Max_single", "Max", (wrt(_r(3)),)),
    Case("Max_dynamic", "Max", (wrt(_distinct(2, 3), dynamic=True), wrt(_distinct(3) + 0.1, dynamic=True))),
    Case("Min_variadic_broadcast", "Min", (wrt(_distinct(2, 3)), wrt(_distinct(3) + 0.1), wrt(_distinct(2, 1) + 0.2))),
    Case("Where_broadcast", "Where", (fed(_r(2, 3) > 0), wrt(_r(2, 3)), wrt(_r(3)))),
    Case("Where_condition_broadcast", "Where", (fed(_r(3) > 0), wrt(_r(2, 1)), wrt(_r(2, 3)))),
    Case(
        "Where_dynamic",
        "Where",
        (fed(_r(2, 3) > 0, dynamic=True), wrt(_r(2, 3), dynamic=True), wrt(_r(1), dynamic=True)),
    ),
    Case("Clip_both", "Clip", (wrt(np.array([[-1.2, -0.3, 0.2], [0.4, 0.9, -0.8]])), const(-0.5), const(0.5))),
    Case("Clip_min_only", "Clip", (wrt(np.array([-1.2, -0.3, 0.7])), const(-0.5))),
    Case("Clip_max_only", "Clip", (wrt(np.array([-1.2, -0.3, 0.7])), OMITTED, const(0.5))),
    Case("Clip_no_bounds", "Clip", (wrt(_r(3)),)),
    Case(
        "Clip_fed_bounds_dynamic",
        "Clip",
        (wrt(np.array([[-1.2, -0.3], [0.4, 0.9]]), dynamic=True), fed(-0.5), fed(0.5)),
    ),
    # ---- reductions (axes: an input from opset 13 for ReduceSum, from 18 for the others)
    Case("ReduceSum_axes_keepdims", "ReduceSum", (wrt(_r(2, 3, 4)), const(_i([1])))),
    Case("ReduceSum_negative_axes", "ReduceSum", (wrt(_r(2, 3, 4)), const(_i([-1, 0]))), {"keepdims": 0}),
    Case("ReduceSum_all", "ReduceSum", (wrt(_r(2, 3)),), {"keepdims": 0}, opset=13),
    Case("ReduceSum_all_keepdims", "ReduceSum", (wrt(_r(2, 3)),)),
    Case(
        "ReduceSum_noop_empty_axes",
        "ReduceSum",
        (wrt(_r(2, 3)), const(_i([]))),
        {"keepdims": 0, "noop_with_empty_axes": 1},
    ),
    Case("ReduceSum_fed_empty_axes_all", "ReduceSum", (wrt(_r(2, 3), dynamic=True), fed(_i([]))), {"keepdims": 0}),
    Case(
        "ReduceSum_fed_axes_dynamic",
        "ReduceSum",
        (wrt(_r(2, 3, 4), dynamic=True), fed(_i([0, -1]), dynamic=True)),
        {"keepdims": 0},
        opset=13,
    ),
    Case("ReduceMean_attr_axes", "ReduceMean", (wrt(_r(2, 3, 4)),), {"axes": [-1], "keepdims": 0}, opset=13),
    Case("ReduceMean_attr_all", "ReduceMean", (wrt(_r(2, 3)),), {"keepdims": 1}, opset=13),
    Case("ReduceMean_input_axes", "ReduceMean", (wrt(_r(2, 3, 4)), const(_i([0, 2]))), {"keepdims": 0}, opset=18),
    Case(
        "ReduceMean_fed_axes_dynamic",
        "ReduceMean",
        (wrt(_r(2, 3, 4), dynamic=True), fed(_i([1]), dynamic=True)),
        opset=18,
    ),
    Case("ReduceMean_attr_dynamic", "ReduceMean", (wrt(_r(2, 3), dynamic=True),), {"axes": [0]}, opset=13),
    Case("ReduceMax_attr_axes", "ReduceMax", (wrt(_distinct(2, 3, 4)),), {"axes": [1], "keepdims": 0}, opset=13),
    Case("ReduceMax_attr_all", "ReduceMax", (wrt(_distinct(2, 3)),), {"keepdims": 0}, opset=13),
    Case("ReduceMax_input_axes", "ReduceMax", (wrt(_distinct(2, 3, 4)), const(_i([-1, 0]))), opset=18),
    Case(
        "ReduceMax_fed_axes_dynamic",
        "ReduceMax",
        (wrt(_distinct(2, 3, 4), dynamic=True), fed(_i([-2]), dynamic=True)),
        {"keepdims": 0},
        opset=18,
    ),
    Case(
        "ReduceMax_noop_fed_empty_axes",
        "ReduceMax",
        (wrt(_r(2, 3)), fed(_i([]))),
        {"keepdims": 0, "noop_with_empty_axes": 1},
        opset=18,
    ),
    Case("ReduceMin_attr_axes", "ReduceMin", (wrt(_distinct(3, 4)),), {"axes": [-1], "keepdims": 0}, opset=13),
    # ---- reshapes and broadcasts
    Case("Transpose_default", "Transpose", (wrt(_r(2, 3, 4)),)),
    Case("Transpose_perm_dynamic", "Transpose", (wrt(_r(2, 3, 4), dynamic=True),), {"perm": [1, 2, 0]}),
    Case("Reshape_zero_and_minus_one", "Reshape", (wrt(_r(2, 3, 4)), const(_i([0, -1])))),
    Case("Reshape_allowzero", "Reshape", (wrt(_r(2, 3, 4)), const(_i([4, 6]))), {"allowzero": 1}, opset=14),
    Case("Reshape_fed_shape_dynamic", "Reshape", (wrt(_r(2, 3, 4), dynamic=True), fed(_i([3, -1]), dynamic=True))),
    Case("Flatten_axis", "Flatten", (wrt(_r(2, 3, 4)),), {"axis": 2}),
    Case("Flatten_negative_axis_dynamic", "Flatten", (wrt(_r(2, 3, 4), dynamic=True),), {"axis": -1}),
    Case("Flatten_axis_0", "Flatten", (wrt(_r(2, 3)),), {"axis": 0}),
    Case("Squeeze_axes", "Squeeze", (wrt(_r(2, 1, 3, 1)), const(_i([-1, 1])))),
    Case("Squeeze_all_dynamic", "Squeeze", (wrt(_r(2, 1, 3), dynamic=True),)),
    Case("Unsqueeze", "Unsqueeze", (wrt(_r(2, 3), dynamic=True), const(_i([0, -1])))),
    Case("Expand", "Expand", (wrt(_r(3, 1)), const(_i([2, 3, 4])))),
    Case("Expand_to_lower_rank", "Expand", (wrt(_r(2, 3)), const(_i([3])))),
    Case("Expand_dynamic", "Expand", (wrt(_r(3, 1), dynamic=True), fed(_i([2, 1, 4]), dynamic=True))),
    Case("Tile", "Tile", (wrt(_r(2, 3)), const(_i([2, 3])))),
    Case("Tile_fed_dynamic", "Tile", (wrt(_r(2, 1, 3), dynamic=True), fed(_i([1, 2, 2]), dynamic=True))),
    # ---- joins and splits
    Case("Concat_negative_axis", "Concat", (wrt(_r(2, 3)), const(_r(2, 1)), wrt(_r(2, 2))), {"axis": -1}),
    Case("Concat_dynamic", "Concat", (wrt(_r(2, 3), dynamic=True), wrt(_r(1, 3), dynamic=True)), {"axis": 0}),
    Case("Concat_single", "Concat", (wrt(_r(2, 3)),), {"axis": 1}),
    Case("Split_sizes_opset13", "Split", (wrt(_r(2, 5)), const(_i([2, 3]))), {"axis": 1}, opset=13, num_outputs=2),
    Case("Split_equal_opset13", "Split", (wrt(_r(6, 2)),), {"axis": 0}, opset=13, num_outputs=3),
    Case(
        "Split_num_outputs_opset18",
        "Split",
        (wrt(_r(2, 5), dynamic=True),),
        {"axis": -1, "num_outputs": 3},
        opset=18,
        num_outputs=3,
    ),
    Case(
        "Split_some_outputs_unused",
        "Split",
        (wrt(_r(3, 4), dynamic=True), const(_i([1, 1, 2]))),
        {"axis": 1},
        opset=18,
        num_outputs=3,
        loss_outputs=(1,),
    ),
    # ---- selections
    Case("Slice_constant_bounds", "Slice", (wrt(_r(4, 5)), const(_i([1, 0])), const(_i([3, 4])), const(_i([0, 1])))),
    Case(
        "Slice_clamped_bounds_axes_omitted",
        "Slice",
        (wrt(_r(3, 4)), const(_i([-1000, 1])), const(_i([INT64_MAX, 1000]))),
    ),
    Case(
        "Slice_negative_steps",
        "Slice",
        (wrt(_r(4, 5)), const(_i([-1, 3])), const(_i([-INT64_MAX, 0])), const(_i([1, 0])), const(_i([-2, -1]))),
    ),
    Case(
        "Slice_fed_bounds_dynamic",
        "Slice",
        (
            wrt(_r(2, 5, 3), dynamic=True),
            fed(_i([-4, 0])),
            fed(_i([INT64_MAX, 2])),
            fed(_i([1, -1])),
            fed(_i([2, 1])),
        ),
    ),
    Case(
        "Slice_empty_selection",
        "Slice",
        (wrt(_r(2, 3)), const(_i([2])), const(_i([1])), const(_i([1]))),
    ),
    Case("Pad_constant", "Pad", (wrt(_r(2, 3)), const(_i([1, 0, 0, 2])), const(0.7))),
    Case("Pad_negative_crops", "Pad", (wrt(_r(3, 4), dynamic=True), fed(_i([-1, 1, 0, -2])))),
    Case("Pad_axes_opset18", "Pad", (wrt(_r(2, 3, 2)), const(_i([1, 2])), OMITTED, const(_i([-2]))), opset=18),
    Case("Pad_reflect", "Pad", (wrt(_r(3, 4)), const(_i([0, 2, 1, 1]))), {"mode": "reflect"}),
    Case("Pad_edge_opset13", "Pad", (wrt(_r(2, 3), dynamic=True), const(_i([1, 2, 2, 0]))), {"mode": "edge"}, opset=13),
    Case("Gather_repeated_indices", "Gather", (wrt(_r(4, 3)), const(_i([[0, 2], [2, 3], [0, 0]])))),
    Case("Gather_repeated_indices_opset13", "Gather", (wrt(_r(4, 3)), const(_i([0, 2, 2, 0]))), opset=13),
    Case("Gather_negative_axis_indices", "Gather", (wrt(_r(2, 4, 3)), const(_i([-1, 1, -1]))), {"axis": -2}),
    Case(
        "Gather_axis_opset13",
        "Gather",
        (wrt(_r(2, 4, 3)), const(np.array([[-1, 1], [3, 3]], dtype=np.int32))),
        {"axis": 1},
        opset=13,
    ),
    Case("Gather_scalar_index", "Gather", (wrt(_r(3, 4)), const(_i(-1))), {"axis": 1}),
    Case("Gather_scalar_index_opset13", "Gather", (wrt(_r(3, 4)), const(_i(1))), opset=13),
    Case("Gather_vector_data", "Gather", (wrt(_r(5)), const(_i([4, 0, 4])))),
    Case(
        "Gather_dynamic",
        "Gather",
        (wrt(_r(4, 3, 2), dynamic=True), fed(_i([[1, 1], [-1, 0]]), dynamic=True)),
        {"axis": 1},
    ),
    Case(
        "Gather_dynamic_opset15",
        "Gather",
        (wrt(_r(4, 3), dynamic=True), fed(_i([1, 1, -4]), dynamic=True)),
        opset=15,
    ),
    Case(
        "GatherElements_repeated",
        "GatherElements",
        (wrt(_r(3, 4)), const(_i([[0, 0, 2, 1], [2, 0, 2, 2]]))),
        {"axis": 0},
    ),
    Case(
        "GatherElements_negative_opset13",
        "GatherElements",
        (wrt(_r(3, 4)), const(_i([[-1, 0], [1, 1], [3, -4]]))),
        {"axis": -1},
        opset=13,
    ),
    Case(
        "GatherElements_negative_axis_indices",
        "GatherElements",
        (wrt(_r(2, 3, 2)), const(_i([[[-1, 0]], [[2, -1]]]))),
        {"axis": -2},
    ),
    Case(
        "GatherElements_dynamic",
        "GatherElements",
        (wrt(_r(2, 3), dynamic=True), fed(_i([[2, 2, 0]]), dynamic=True)),
        {"axis": 1},
        opset=18,
    ),
    # Tanh's gradient: one ortlstm TanhGrad node above; here the standard ops (Mul, Sub, Mul)
    Case("Tanh_standard_ops", "Tanh", (wrt(_r(2, 5)),), ortlstm_ops=False),
    Case("Tanh_dynamic", "Tanh", (wrt(_r(3, 4), dynamic=True),)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_rule_matches_finite_differences(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_rule_float32(case: Case, optimize: bool) -> None:
    check_case_float32(case, optimize)


# ---- conventions at non-differentiable points (torch's), exact -----------------------------------


def _exact_gradients(case: Case) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The float64 gradients of a case and the loss weight of its first output (= dY)."""
    built = build(case, np.float64)
    return analytic_gradients(built), built.feeds["weight_out0"]


def test_max_tie_splits_gradient_in_half() -> None:
    # torch.maximum: at a == b each input gets dY / 2.
    grads, dy = _exact_gradients(Case("Max_tie", "Max", (wrt([1.0, 2.0, 3.0]), wrt([1.0, 0.0, 3.0]))))
    np.testing.assert_array_equal(grads["in0"], dy * [0.5, 1.0, 0.5])
    np.testing.assert_array_equal(grads["in1"], dy * [0.5, 0.0, 0.5])


def test_min_tie_of_three_splits_evenly() -> None:
    # Variadic Min: dY is shared evenly among all inputs equal to the minimum (a broadcast input's
    # shares summed). Chained torch.minimum would give 1/4, 1/4, 1/2 instead: order-dependent.
    case = Case("Min_tie3", "Min", (wrt([1.0, 2.0]), wrt([1.0, 3.0]), wrt([1.0])))
    grads, dy = _exact_gradients(case)
    np.testing.assert_allclose(grads["in0"], dy * [1 / 3, 0.0], rtol=1e-15)
    np.testing.assert_allclose(grads["in1"], dy * [1 / 3, 0.0], rtol=1e-15)
    np.testing.assert_allclose(grads["in2"], [dy[0] / 3 + dy[1]], rtol=1e-15)


def test_reduce_max_ties_split_evenly() -> None:
    # torch.amax: dY of a row is shared evenly among the row's maxima.
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    grads, dy = _exact_gradients(
        Case("ReduceMax_tie", "ReduceMax", (wrt(x), const(_i([1]))), {"keepdims": 0}, opset=18)
    )
    expected = np.array([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]]) * dy[:, None]
    np.testing.assert_allclose(grads["in0"], expected, rtol=1e-15)


def test_clip_passes_gradient_at_its_bounds() -> None:
    # torch.clamp: the gradient flows where min <= x <= max, bounds included.
    case = Case("Clip_bounds", "Clip", (wrt([-0.5, 0.0, 0.5, 0.75, -0.75]), const(-0.5), const(0.5)))
    grads, dy = _exact_gradients(case)
    np.testing.assert_array_equal(grads["in0"], dy * [1.0, 1.0, 1.0, 0.0, 0.0])


def test_abs_has_zero_gradient_at_zero() -> None:
    grads, dy = _exact_gradients(Case("Abs_zero", "Abs", (wrt([-2.0, 0.0, 3.0]),)))
    np.testing.assert_array_equal(grads["in0"], dy * [-1.0, 0.0, 1.0])


@pytest.mark.skipif(
    tuple(int(part) for part in ort.__version__.split(".")[:2]) < (1, 20),
    reason="onnxruntime 1.19.2 fails on a reduction without axes and noop_with_empty_axes=1 (the forward op)",
)
@pytest.mark.parametrize("op_type", ["ReduceSum", "ReduceMean", "ReduceMax"])
def test_reduction_without_axes_and_noop_is_identity(op_type: str) -> None:
    case = Case(f"{op_type}_noop", op_type, (wrt(_r(2, 3)),), {"keepdims": 0, "noop_with_empty_axes": 1}, opset=18)
    grads, dy = _exact_gradients(case)
    np.testing.assert_array_equal(grads["in0"], dy)


# ---- the walk around rules ----------------------------------------------------------------------


def _model(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto], opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [], [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])], initializers
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _backward(model: onnx.ModelProto, wrt_names: list[str]) -> tuple[onnx.ModelProto, dict[str, str]]:
    emitter = GraphEmitter(17, used_names(model.graph), infer_value_types(model))
    result = build_backward(model.graph, "loss", wrt_names, emitter)
    model.graph.node.extend(emitter.nodes)
    model.graph.initializer.extend(emitter.initializers)
    return model, result.gradients


def test_op_without_rule_is_refused_naming_node_op_and_parameter() -> None:
    weight = onnx.numpy_helper.from_array(np.eye(2), "weight")
    nodes = [
        helper.make_node("Tanh", ["weight"], ["t"], name="squash"),
        helper.make_node("Det", ["t"], ["loss"], name="determinant"),
    ]
    with pytest.raises(
        ValueError,
        match=r"ai\.onnx::Det node 'determinant'.*1 parameter\(s\) \['weight'\]. Freeze them \(frozen=\['weight'\]",
    ):
        _backward(_model(nodes, [weight]), ["weight"])


def test_op_without_rule_is_refused_naming_every_parameter_behind_it() -> None:
    # Both of a module's weights lie behind the node; a third parameter after it does not.
    first = onnx.numpy_helper.from_array(np.eye(2), "features.conv.weight")
    second = onnx.numpy_helper.from_array(np.eye(2), "features.conv.bias")
    after = onnx.numpy_helper.from_array(np.ones(()), "head.scale")
    nodes = [
        helper.make_node("Add", ["features.conv.weight", "features.conv.bias"], ["summed"]),
        helper.make_node("Det", ["summed"], ["det"], name="determinant"),
        helper.make_node("Mul", ["det", "head.scale"], ["loss"]),
    ]
    message = (
        r"2 parameter\(s\) \['features.conv.bias', 'features.conv.weight'\]. Freeze them "
        r"\(frozen=\['features.conv.bias', 'features.conv.weight'\], or frozen=\['features.\*'\] for the whole module"
    )
    with pytest.raises(ValueError, match=message):
        _backward(_model(nodes, [first, second, after]), ["features.conv.weight", "features.conv.bias", "head.scale"])


def test_every_op_without_rule_is_refused_at_once_with_its_nodes_and_parameters() -> None:
    # Issue 32 item 6: a refusal naming only the first op sent users freezing one op after the next.
    inits = [onnx.numpy_helper.from_array(np.eye(2), name) for name in ("encoder.weight", "decoder.weight", "scale")]
    nodes = [
        helper.make_node("Det", ["encoder.weight"], ["det"], name="determinant"),
        helper.make_node("Sin", ["decoder.weight"], ["sin"], name="wave_1"),
        helper.make_node("Sin", ["sin"], ["sin2"], name="wave_2"),
        helper.make_node("Mul", ["det", "sin2"], ["product"]),
        helper.make_node("Mul", ["product", "scale"], ["scaled"]),
        helper.make_node("ReduceSum", ["scaled"], ["loss"], keepdims=0),
    ]
    with pytest.raises(ValueError) as refused:
        _backward(_model(nodes, inits), ["encoder.weight", "decoder.weight", "scale"])
    assert str(refused.value) == (
        "no gradient rule for 2 op(s) in 3 nodes between the loss 'loss' and 2 parameter(s) "
        "['decoder.weight', 'encoder.weight']:\n"
        "  ai.onnx::Det node 'determinant', on the path of parameter(s) ['encoder.weight']\n"
        "  ai.onnx::Sin nodes 'wave_1', 'wave_2', on the path of parameter(s) ['decoder.weight']\n"
        "Freeze them (frozen=['decoder.weight', 'encoder.weight'] on the Trainer, --frozen on the command line), "
        "or register a rule for each op with ortlstm.graphs.register_gradient_rule('', 'Det', rule) and "
        "register_gradient_rule('', 'Sin', rule)."
    )


def test_refusal_names_parameters_by_their_torch_names() -> None:
    # dynamo's optimizer names a folded weight val_29; the export's metadata knows it is encoder.weight.
    inits = [onnx.numpy_helper.from_array(np.eye(2), name) for name in ("val_29", "val_30")]
    nodes = [
        helper.make_node("Add", ["val_29", "val_30"], ["summed"]),
        helper.make_node("Det", ["summed"], ["loss"], name="determinant"),
    ]
    model = _model(nodes, inits)
    emitter = GraphEmitter(17, used_names(model.graph), infer_value_types(model))
    sources = {"val_29": ("encoder.weight",), "val_30": ("lstm.bias_ih_l0", "lstm.bias_hh_l0")}
    message = (
        r"2 parameter\(s\) \['encoder.weight \(onnx: val_29\)', "
        r"'lstm.bias_ih_l0 \+ lstm.bias_hh_l0 \(onnx: val_30\)'\]\. "
        r"Freeze them \(frozen=\['encoder.weight', 'lstm.bias_hh_l0', 'lstm.bias_ih_l0'\] on the Trainer"
    )
    with pytest.raises(ValueError, match=message):
        build_backward(model.graph, "loss", ["val_29", "val_30"], emitter, torch_names=sources)


def test_refusal_of_a_dynamo_export_names_torch_parameters_and_its_freeze_advice_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real dynamo export (tests/recordings): its optimizer folds each LSTM layer's weights into
    # val_108, ...; with the LSTMTraining rule taken away, the refusal names them by torch name,
    # and the frozen= it suggests builds.
    from ortlstm.graphs import losses, optimizers
    from ortlstm.graphs.autodiff import registry
    from ortlstm.graphs.train_step import build_training_models

    recording = Path(__file__).parent / "recordings" / "train_step" / "tokens_seq_first_y-dynamo-AdamW.npz"
    with np.load(recording) as data:
        model = onnx.load_from_string(data["model"].tobytes())
    monkeypatch.delitem(registry._RULES, ("ortlstm", "LSTMTraining"))
    build_models = functools.partial(
        build_training_models, model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1)
    )
    with pytest.raises(ValueError) as refused:
        build_models(target="labels")
    message = str(refused.value)
    lstms = "\n  ortlstm::LSTMTraining nodes 'node_LSTM_111', 'node_LSTM_219', on the path of all 7 parameters\n"
    assert lstms in message
    assert "'lstm.weight_ih_l0 + lstm.weight_ih_l0_reverse (onnx: val_108)'" in message
    assert "val_108'" not in message.replace("(onnx: val_108)'", "")
    frozen = ast.literal_eval(re.search(r"Freeze them \(frozen=(\[[^]]*\])", message)[1])
    assert "lstm.weight_ih_l0" in frozen
    assert "input_layer.weight" in frozen
    assert sorted(build_models(target="labels", frozen=frozen).signature.params) == ["head.bias", "val_234"]


def test_unreachable_parameters_are_named_by_their_torch_names() -> None:
    inits = [onnx.numpy_helper.from_array(np.eye(2), name) for name in ("val_29", "weight")]
    nodes = [helper.make_node("ReduceSum", ["weight"], ["loss"], keepdims=0)]
    model = _model(nodes, inits)
    emitter = GraphEmitter(17, used_names(model.graph), infer_value_types(model))
    with pytest.raises(ValueError, match=r"parameters \['encoder.weight \(onnx: val_29\)'\] do not reach the loss"):
        build_backward(model.graph, "loss", ["val_29", "weight"], emitter, torch_names={"val_29": ("encoder.weight",)})


def test_refusal_keeps_each_ops_own_advice_and_the_generic_advice_for_the_others() -> None:
    inits = [onnx.numpy_helper.from_array(np.ones((1, 8, 3)), "W"), onnx.numpy_helper.from_array(np.eye(2), "A")]
    nodes = [
        helper.make_node("LSTM", ["X", "W", "W"], ["Y"], name="lstm", hidden_size=2),
        helper.make_node("ReduceSum", ["Y"], ["y"], keepdims=0),
        helper.make_node("Det", ["A"], ["det"], name="determinant"),
        helper.make_node("Add", ["y", "det"], ["loss"]),
    ]
    model = _model(nodes, inits)
    model.graph.input.append(helper.make_tensor_value_info("X", TensorProto.DOUBLE, [1, 1, 3]))
    with pytest.raises(ValueError) as refused:
        _backward(model, ["W", "A"])
    lines = str(refused.value).splitlines()
    assert lines[0].startswith("no gradient rule for 2 op(s) in 2 nodes between the loss 'loss' and 2 parameter(s)")
    assert lines[1].startswith("  ai.onnx::LSTM node 'lstm', on the path of parameter(s) ['W']: ")
    assert "convert the model first" in lines[1]
    assert lines[2] == "  ai.onnx::Det node 'determinant', on the path of parameter(s) ['A']"
    assert lines[3].startswith("For the op without advice above: freeze them (frozen=['A'] on the Trainer")


def test_cast_to_an_integer_type_stops_the_gradient() -> None:
    weight = onnx.numpy_helper.from_array(np.ones((2,)), "weight")
    nodes = [
        helper.make_node("Cast", ["weight"], ["rounded"], to=TensorProto.INT64),
        helper.make_node("Cast", ["rounded"], ["back"], to=TensorProto.DOUBLE),
        helper.make_node("ReduceSum", ["back"], ["loss"], keepdims=0),
    ]
    with pytest.raises(ValueError, match=r"parameters \['weight'\] do not reach the loss"):
        _backward(_model(nodes, [weight]), ["weight"])


def test_shape_derived_integer_paths_need_no_rules() -> None:
    # Reshape(W, Shape(W)[::-1]): Shape, Slice on the shape and Concat are integer paths; only
    # Reshape, Mul and ReduceSum are differentiated.
    weight_value = _RNG.standard_normal((2, 3))
    scale_value = _RNG.standard_normal((3, 2))
    nodes = [
        helper.make_node("Shape", ["weight"], ["shape"]),
        helper.make_node("Slice", ["shape", "start", "end", "axis", "step"], ["reversed"]),
        helper.make_node("Reshape", ["weight", "reversed"], ["reshaped"]),
        helper.make_node("Mul", ["reshaped", "scale"], ["scaled"]),
        helper.make_node("ReduceSum", ["scaled"], ["loss"], keepdims=0),
    ]
    initializers = [
        onnx.numpy_helper.from_array(weight_value, "weight"),
        onnx.numpy_helper.from_array(scale_value, "scale"),
        *(
            onnx.numpy_helper.from_array(_i([value]), name)
            for name, value in [("start", -1), ("end", -INT64_MAX), ("axis", 0), ("step", -1)]
        ),
    ]
    model, gradients = _backward(_model(nodes, initializers), ["weight"])
    model.graph.output.append(helper.make_empty_tensor_value_info(gradients["weight"]))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _, grad = session.run(None, {})
    np.testing.assert_array_equal(grad, scale_value.reshape(2, 3))
