"""The Einsum and ScatterND gradient rules against central finite differences (float64) and in float32.

The table of tests/test_autodiff_rules.py, for the two ops speech-enhancement models (DeepFilterNet,
streaming caches) need besides GRU; in a file of its own to keep that one under 700 lines. See
tests/gradcheck.py for the method: onnxruntime runs Einsum, ScatterND and GatherND in float64, so
both sides of every float64 row are onnxruntime's kernels. Then the configurations whose gradient
is undefined, refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import Case, build, check_case, check_case_float32, const, fed, wrt
from onnx import TensorProto, helper

from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types
from ortlstm.graphs.emit.emitter import used_names

_RNG = np.random.default_rng(32)


def _r(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape)


def _i(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


CASES = [
    # ---- Einsum: every form torch.einsum exports (explicit, implicit, ellipsis, diagonals, sums, broadcasting)
    Case("Einsum_batched_matmul", "Einsum", (wrt(_r(2, 3, 4)), wrt(_r(2, 4, 2))), {"equation": "bij,bjk->bik"}),
    Case("Einsum_linear", "Einsum", (wrt(_r(2, 3, 4)), wrt(_r(4, 2))), {"equation": "btf,fh->bth"}),
    Case(  # DeepFilterNet's grouped linear
        "Einsum_grouped_linear", "Einsum", (wrt(_r(1, 2, 3, 2)), wrt(_r(3, 2, 2))), {"equation": "btgi,gih->btgh"}
    ),
    Case("Einsum_transpose", "Einsum", (wrt(_r(3, 4)),), {"equation": "ij->ji"}),
    Case("Einsum_diagonal", "Einsum", (wrt(_r(3, 3)),), {"equation": "ii->i"}),
    Case("Einsum_trace", "Einsum", (wrt(_r(3, 3)),), {"equation": "ii->"}),
    Case("Einsum_batch_diagonal_spaces", "Einsum", (wrt(_r(2, 3, 3)),), {"equation": "b i i -> b i"}),
    Case("Einsum_row_sum", "Einsum", (wrt(_r(3, 4)),), {"equation": "ij->i"}),
    Case("Einsum_diagonal_times_vector", "Einsum", (wrt(_r(3, 3)), wrt(_r(3))), {"equation": "ii,i->i"}),
    Case("Einsum_batch_trace", "Einsum", (wrt(_r(2, 3, 3)),), {"equation": "bii->b"}),
    Case("Einsum_triple_diagonal", "Einsum", (wrt(_r(3, 3, 2, 3)),), {"equation": "iiji->ji"}),
    Case("Einsum_ellipsis_diagonal", "Einsum", (wrt(_r(2, 3, 3)),), {"equation": "...ii->...i"}),
    Case("Einsum_uppercase_letters", "Einsum", (wrt(_r(2, 3)), wrt(_r(3, 4))), {"equation": "Ab,bC->AC"}),
    Case("Einsum_dot_per_row", "Einsum", (wrt(_r(2, 5)), wrt(_r(2, 5))), {"equation": "bi,bi->b"}),
    Case("Einsum_same_input_twice", "Einsum", (wrt(_r(2, 5)),) * 2, {"equation": "bi,bi->b"}),
    Case("Einsum_outer", "Einsum", (wrt(_r(3)), wrt(_r(4))), {"equation": "i,j->ij"}),
    Case("Einsum_implicit_matmul", "Einsum", (wrt(_r(3, 4)), wrt(_r(4, 2))), {"equation": "ij,jk"}),
    Case("Einsum_implicit_sorted", "Einsum", (wrt(_r(3, 4)), wrt(_r(2, 4))), {"equation": "kj,ij"}),
    Case(
        "Einsum_three_operands", "Einsum", (wrt(_r(2, 3)), wrt(_r(3, 4)), wrt(_r(4, 2))), {"equation": "ij,jk,kl->il"}
    ),
    Case("Einsum_summed_only_here", "Einsum", (wrt(_r(2, 3, 4)), wrt(_r(2, 5))), {"equation": "bij,bk->bk"}),
    Case(
        "Einsum_ellipsis_broadcast",
        "Einsum",
        (wrt(_r(2, 1, 3, 4)), wrt(_r(1, 3, 4, 2))),
        {"equation": "...ij,...jk->...ik"},
    ),
    Case("Einsum_ellipsis_implicit", "Einsum", (wrt(_r(2, 3, 4)),), {"equation": "...ij"}),
    Case("Einsum_ellipsis_middle_constant", "Einsum", (wrt(_r(2, 3, 4)), const(_r(4))), {"equation": "b...f,f->b..."}),
    Case(
        "Einsum_dynamic",
        "Einsum",
        (wrt(_r(2, 3, 4), dynamic=True), wrt(_r(4, 3), dynamic=True)),
        {"equation": "bij,jk->bik"},
    ),
    Case("Einsum_diagonal_dynamic", "Einsum", (wrt(_r(3, 3), dynamic=True),), {"equation": "ii->i"}),
    Case(
        "Einsum_summed_dynamic",
        "Einsum",
        (wrt(_r(2, 3), dynamic=True), wrt(_r(2), dynamic=True)),
        {"equation": "ij,i->i"},
    ),
    Case(
        "Einsum_ellipsis_broadcast_dynamic",
        "Einsum",
        (wrt(_r(1, 3, 4), dynamic=True), wrt(_r(2, 4, 2), dynamic=True)),
        {"equation": "...ij,...jk->...ik"},
    ),
    # ---- ScatterND: the updates and the untouched data (indices are not differentiable)
    Case("ScatterND_rows", "ScatterND", (wrt(_r(4, 3)), const(_i([[1], [3]])), wrt(_r(2, 3)))),
    Case("ScatterND_elements", "ScatterND", (wrt(_r(2, 3)), const(_i([[0, 1], [1, 2], [1, 0]])), wrt(_r(3)))),
    Case(
        "ScatterND_streaming_cache_negative",
        "ScatterND",
        (wrt(_r(1, 3, 4)), const(_i([[[0, -1]]])), wrt(_r(1, 1, 4))),
    ),
    Case("ScatterND_updates_only", "ScatterND", (const(_r(4, 3)), const(_i([[2], [0]])), wrt(_r(2, 3)))),
    Case(
        "ScatterND_add_duplicates",
        "ScatterND",
        (wrt(_r(4, 2)), const(_i([[1], [1], [0]])), wrt(_r(3, 2))),
        {"reduction": "add"},
    ),
    Case("ScatterND_mul", "ScatterND", (wrt(_r(4, 2)), const(_i([[3], [1]])), wrt(_r(2, 2))), {"reduction": "mul"}),
    Case(
        "ScatterND_dynamic",
        "ScatterND",
        (wrt(_r(3, 4), dynamic=True), fed(_i([[2], [0]]), dynamic=True), wrt(_r(2, 4), dynamic=True)),
    ),
    Case(
        "ScatterND_mul_dynamic",
        "ScatterND",
        (wrt(_r(3, 4), dynamic=True), fed(_i([[2, 1], [0, 3]]), dynamic=True), wrt(_r(2), dynamic=True)),
        {"reduction": "mul"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_rule_matches_finite_differences(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_rule_float32(case: Case, optimize: bool) -> None:
    check_case_float32(case, optimize)


def test_scatter_nd_duplicate_indices_without_reduction_are_refused() -> None:
    """ONNX requires distinct indices for reduction none: the output (and gradient) depend on the write order."""
    case = Case("dup", "ScatterND", (wrt(_r(4, 2)), const(_i([[1], [-3]])), wrt(_r(2, 2))))
    with pytest.raises(
        ValueError,
        match=r"ScatterND node 'under_test': indices 'in1' write the slice \[1\] more than once with "
        r"reduction='none': the output depends on the order of the writes .* pass distinct indices, "
        r"or reduction='add'",
    ):
        build(case)


def test_scatter_nd_mul_duplicates_and_max_are_refused() -> None:
    """Reduction mul with duplicates would need the product of the other updates; max/min have no tie convention yet."""
    mul = Case("mul", "ScatterND", (wrt(_r(3)), const(_i([[0], [0]])), wrt(_r(2))), {"reduction": "mul"})
    with pytest.raises(ValueError, match=r"slice \[0\] more than once with reduction='mul': each update's"):
        build(mul)
    maximum = Case("max", "ScatterND", (wrt(_r(3)), const(_i([[0]])), wrt(_r(1))), {"reduction": "max"}, opset=18)
    with pytest.raises(ValueError, match=r"ScatterND node 'under_test': reduction='max' has no gradient rule"):
        build(maximum)


def test_einsum_ellipsis_of_unknown_rank_is_refused_by_name() -> None:
    """Spelling out the ellipsis needs the operand's rank; without it the error names the input."""
    graph = helper.make_graph(
        [
            helper.make_node("Einsum", ["x"], ["y"], name="ein", equation="...ij->...ji"),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    emitter = GraphEmitter(17, used_names(model.graph), infer_value_types(model))
    with pytest.raises(ValueError, match=r"Einsum node 'ein': equation '...ij->...ji': the rank of input 0 \('x'\)"):
        build_backward(model.graph, "loss", ["x"], emitter)
