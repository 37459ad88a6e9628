"""ortlstm SigmoidGrad and TanhGrad: equal to the standard ops' gradient bit for bit, and their refusal.

The oracle is onnxruntime's own Sub and Mul: the graph the Sigmoid and Tanh rules emit without the
library (``dY * (Y * (1 - Y))``, ``dY * (1 - Y * Y)``), run on the same inputs. Finite differences of
the rules that emit these ops are in tests/test_autodiff_rules.py and tests/test_autodiff_nn_rules.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import op_runner
import pytest
from onnx import helper
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

import ortlstm.ops
from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types
from ortlstm.graphs.emit.emitter import used_names

_STANDARD = {
    "SigmoidGrad": [
        helper.make_node("Sub", ["one", "Y"], ["t"]),
        helper.make_node("Mul", ["Y", "t"], ["u"]),
        helper.make_node("Mul", ["dY", "u"], ["dX"]),
    ],
    "TanhGrad": [
        helper.make_node("Mul", ["Y", "Y"], ["t"]),
        helper.make_node("Sub", ["one", "t"], ["u"]),
        helper.make_node("Mul", ["dY", "u"], ["dX"]),
    ],
}


def _standard_ops(op_type: str, dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    elem = helper.np_dtype_to_tensor_dtype(y.dtype)
    graph = helper.make_graph(
        _STANDARD[op_type],
        "standard",
        [helper.make_tensor_value_info(name, elem, None) for name in ("dY", "Y")],
        [helper.make_tensor_value_info("dX", elem, None)],
        [onnx.numpy_helper.from_array(np.asarray(1, y.dtype), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (dx,) = ort.InferenceSession(model.SerializeToString(), options).run(None, {"dY": dy, "Y": y})
    return dx


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (8, 16, 32, 33)], ids=str)
@pytest.mark.parametrize("op_type", ["SigmoidGrad", "TanhGrad"])
def test_equals_the_standard_ops_bit_for_bit(op_type: str, shape: tuple[int, ...], dtype: type) -> None:
    rng = np.random.default_rng(len(shape))
    y = (np.tanh if op_type == "TanhGrad" else lambda v: 1 / (1 + np.exp(-v)))(rng.standard_normal(shape))
    feeds = {"dY": rng.standard_normal(shape).astype(dtype), "Y": np.asarray(y, dtype)}
    got = op_runner.run(op_type, feeds, {}, dtype=dtype)["dX"]
    assert got.dtype == dtype
    assert got.shape == shape
    np.testing.assert_array_equal(got, _standard_ops(op_type, feeds["dY"], feeds["Y"]))


def test_results_do_not_depend_on_the_thread_count() -> None:
    rng = np.random.default_rng(1)
    model = op_runner.make_model("TanhGrad", ["dY", "Y"], ["dX"], np.float32, {})
    feeds = {
        "dY": rng.standard_normal((9, 70001)).astype(np.float32),
        "Y": rng.uniform(-1, 1, (9, 70001)).astype(np.float32),
    }
    results = [
        ort.InferenceSession(model.SerializeToString(), ortlstm.ops.session_options(intra_op_num_threads=threads)).run(
            None, feeds
        )[0]
        for threads in (1, 2)
    ]
    np.testing.assert_array_equal(*results)


@pytest.mark.parametrize("op_type", ["SigmoidGrad", "TanhGrad"])
def test_dy_of_another_shape_is_refused(op_type: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        op_runner.run(op_type, {"dY": np.zeros((2, 3)), "Y": np.zeros((3, 2))}, {})
    assert f"{op_type} node '{op_type}_under_test': dY: expected Y's shape [3, 2], got [2, 3]" in str(error.value)


@pytest.mark.parametrize(("activation", "op_type"), [("Sigmoid", "SigmoidGrad"), ("Tanh", "TanhGrad")])
@pytest.mark.parametrize("ortlstm_ops", [True, False], ids=["library", "standard_ops"])
def test_rule_emits_the_op_only_where_the_library_may_be_used(activation: str, op_type: str, ortlstm_ops: bool) -> None:
    graph = helper.make_graph(
        [helper.make_node(activation, ["x"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)],
        "activation",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    emitter = GraphEmitter(17, used_names(model.graph), infer_value_types(model), ortlstm_ops=ortlstm_ops)
    build_backward(model.graph, "loss", ["x"], emitter)
    op_types = [node.op_type for node in emitter.nodes]
    assert (op_type in op_types) == ortlstm_ops, op_types
    assert ("Sub" in op_types) != ortlstm_ops, op_types
