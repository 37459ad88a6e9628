"""CTCLoss and CTCLossGrad against recorded torch.nn.functional.ctc_loss runs, without torch.

``tests/recordings/ctc.npz`` (made by ``tests/recordings/record_ctc.py`` with torch 2.13) holds, per
case, the inputs and torch's loss under each reduction with its gradients with respect to log_probs
and the logits. Each test builds one onnx graph: CTCLoss, the reduction in standard ops (none:
a weighted sum; sum; mean: each loss divided by max(target_length, 1), then the batch mean), the
seed of each reduction's gradient in standard ops, and CTCLossGrad, and runs it in plain
onnxruntime. Bad inputs are refused with messages that name the input, matched here.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import pathlib

import gradcheck
import numpy as np
import onnx
import onnx.shape_inference
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument, RuntimeException

import ortlstm.ops
from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types, onnx_opset
from ortlstm.graphs.emit.emitter import used_names
from ortlstm.ops import schema

RECORDING = pathlib.Path(__file__).resolve().parent / "recordings" / "ctc.npz"
_DATA = np.load(RECORDING)
_CONFIGS = json.loads(str(_DATA["configs"]))["cases"]
_IR_VERSION = 10
_ONNX_OPSET = 17
_ELEM = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}
_INT_ELEM = {np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64}
# Named per dtype: float32 sums of up to 1000 logsumexp steps (the T = 1000 case), float64 to rounding.
_TOLERANCE = {"float32": {"rtol": 2e-5, "atol": 2e-5}, "float64": {"rtol": 1e-11, "atol": 1e-12}}
REDUCTIONS = ("none", "sum", "mean")


def _session_for(graph: onnx.GraphProto, threads: int = 0) -> ort.InferenceSession:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _ONNX_OPSET), helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION)],
        ir_version=_IR_VERSION,
    )
    options = ortlstm.ops.session_options(intra_op_num_threads=threads)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _objective_nodes(reduction: str, elem: int) -> list[onnx.NodeProto]:
    """Returns the nodes loss -> objective and the objective's gradient with respect to loss -> grad_loss."""
    if reduction == "none":
        return [
            helper.make_node("Mul", ["loss", "weights"], ["weighted"]),
            helper.make_node("ReduceSum", ["weighted"], ["objective"], keepdims=0),
            helper.make_node("Identity", ["weights"], ["grad_loss"]),
        ]
    if reduction == "sum":
        return [
            helper.make_node("ReduceSum", ["loss"], ["objective"], keepdims=0),
            helper.make_node("Shape", ["loss"], ["loss_shape"]),
            helper.make_node(
                "ConstantOfShape", ["loss_shape"], ["grad_loss"], value=helper.make_tensor("one", elem, [1], [1])
            ),
        ]
    # mean: ReduceMean(loss / Max(target_lengths, 1)); d/d loss[n] = 1 / (N * Max(target_lengths[n], 1)).
    return [
        helper.make_node("Cast", ["target_lengths"], ["lengths_float"], to=elem),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", elem, [], [1])),
        helper.make_node("Max", ["lengths_float", "one"], ["divisor"]),
        helper.make_node("Div", ["loss", "divisor"], ["per_label"]),
        helper.make_node("ReduceMean", ["per_label"], ["objective"], keepdims=0),
        helper.make_node("Shape", ["loss"], ["batch"]),
        helper.make_node("Cast", ["batch"], ["batch_float"], to=elem),
        helper.make_node("Mul", ["divisor", "batch_float"], ["scaled_divisor"]),
        helper.make_node("Reciprocal", ["scaled_divisor"], ["grad_loss"]),
    ]


@functools.lru_cache(maxsize=64)
def _session(
    dtype: str, target_elem: int, reduction: str, blank: int, zero_infinity: int, threads: int
) -> ort.InferenceSession:
    elem = _ELEM[dtype]
    attributes = {"blank": blank, "zero_infinity": zero_infinity}
    ports = {name: name for name in ("log_probs", "targets", "input_lengths", "target_lengths")}
    nodes = [
        ortlstm.ops.make_node("CTCLoss", ports, {"loss": "loss", "log_alpha": "log_alpha"}, **attributes),
        *_objective_nodes(reduction, elem),
        ortlstm.ops.make_node(
            "CTCLossGrad",
            {**ports, "grad_loss": "grad_loss", "loss": "loss", "log_alpha": "log_alpha"},
            {"grad_log_probs": "grad_log_probs"},
            **attributes,
        ),
    ]
    inputs = [
        helper.make_tensor_value_info("log_probs", elem, None),
        helper.make_tensor_value_info("targets", target_elem, None),
        helper.make_tensor_value_info("input_lengths", target_elem, None),
        helper.make_tensor_value_info("target_lengths", target_elem, None),
    ]
    if reduction == "none":
        inputs.append(helper.make_tensor_value_info("weights", elem, None))
    outputs = [
        helper.make_tensor_value_info(name, elem, None) for name in ("loss", "objective", "grad_log_probs", "log_alpha")
    ]
    graph = helper.make_graph(nodes, f"ctc_{reduction}", inputs, outputs)
    return _session_for(graph, threads)


def _run(case: str, dtype: str, reduction: str, threads: int = 0, **overrides: np.ndarray) -> dict[str, np.ndarray]:
    config = _CONFIGS[case]
    feeds = {
        "log_probs": _DATA[f"{case}/{dtype}/log_probs"],
        "targets": _DATA[f"{case}/targets"],
        "input_lengths": _DATA[f"{case}/input_lengths"],
        "target_lengths": _DATA[f"{case}/target_lengths"],
    }
    if reduction == "none":
        feeds["weights"] = _DATA[f"{case}/weights"].astype(dtype)
    feeds.update(overrides)
    sess = _session(
        dtype, _INT_ELEM[feeds["targets"].dtype], reduction, config["blank"], int(config["zero_infinity"]), threads
    )
    names = ["loss", "objective", "grad_log_probs", "log_alpha"]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def _log_softmax_backward(grad_log_probs: np.ndarray, log_probs: np.ndarray) -> np.ndarray:
    """The gradient at the logits of log_probs = log_softmax(logits, axis=2): g - softmax * sum(g)."""
    return grad_log_probs - np.exp(log_probs) * grad_log_probs.sum(axis=2, keepdims=True)


CASES = sorted(_CONFIGS)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_matches_torch(case: str, dtype: str, reduction: str) -> None:
    result = _run(case, dtype, reduction)
    tolerance = _TOLERANCE[dtype]
    prefix = f"{case}/{dtype}"
    context = f"case {case} {dtype} reduction={reduction}"
    np.testing.assert_allclose(
        result["objective"],
        _DATA[f"{prefix}/loss_{reduction}"]
        if reduction != "none"
        else (_DATA[f"{prefix}/loss_none"] * _DATA[f"{case}/weights"].astype(dtype)).sum(dtype=dtype),
        **tolerance,
        err_msg=context,
    )
    if reduction == "none":
        np.testing.assert_allclose(result["loss"], _DATA[f"{prefix}/loss_none"], **tolerance, err_msg=context)
    np.testing.assert_allclose(
        result["grad_log_probs"], _DATA[f"{prefix}/grad_log_probs_{reduction}"], **tolerance, err_msg=context
    )
    if reduction != "sum":
        logits_gradient = _log_softmax_backward(result["grad_log_probs"], _DATA[f"{prefix}/log_probs"])
        np.testing.assert_allclose(
            logits_gradient, _DATA[f"{prefix}/grad_logits_{reduction}"], **tolerance, err_msg=context
        )


def test_long_input_does_not_underflow() -> None:
    # T = 1000 with sharp logits: the likelihood is e^-5000, far below the smallest float64 in
    # probability space, yet the loss and every gradient are finite and match torch (above).
    for dtype in ("float32", "float64"):
        result = _run("long_input_T1000", dtype, "mean")
        assert np.all(np.exp(-result["loss"].astype(np.float64)) == 0.0)
        assert np.all(np.isfinite(result["loss"])), dtype
        assert np.all(np.isfinite(result["grad_log_probs"])), dtype
        np.testing.assert_allclose(result["loss"], _DATA[f"long_input_T1000/{dtype}/loss_none"], **_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_padded_and_concatenated_targets_agree(dtype: str) -> None:
    targets = _DATA["random_padded/targets"]
    lengths = _DATA["random_padded/target_lengths"]
    concatenated = np.concatenate([row[:length] for row, length in zip(targets, lengths, strict=True)])
    padded = _run("random_padded", dtype, "mean")
    flat = _run("random_padded", dtype, "mean", targets=concatenated)
    np.testing.assert_array_equal(flat["loss"], padded["loss"])
    np.testing.assert_array_equal(flat["grad_log_probs"], padded["grad_log_probs"])
    # int32 targets and lengths give the same bits as int64.
    as_int32 = _run(
        "random_padded",
        dtype,
        "mean",
        targets=targets.astype(np.int32),
        input_lengths=_DATA["random_padded/input_lengths"].astype(np.int32),
        target_lengths=lengths.astype(np.int32),
    )
    np.testing.assert_array_equal(as_int32["grad_log_probs"], padded["grad_log_probs"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_results_do_not_depend_on_the_thread_count(dtype: str) -> None:
    one, two = (_run("batch_64", dtype, "none", threads=threads) for threads in (1, 2))
    for name in ("loss", "log_alpha", "grad_log_probs"):
        np.testing.assert_array_equal(one[name], two[name], err_msg=name)


def test_log_alpha_is_minus_infinity_where_unreached() -> None:
    case = "random_padded"
    result = _run(case, "float64", "sum")
    log_alpha = result["log_alpha"]
    input_lengths = _DATA[f"{case}/input_lengths"]
    target_lengths = _DATA[f"{case}/target_lengths"]
    assert log_alpha.shape == (len(input_lengths), _DATA[f"{case}/float64/log_probs"].shape[0], 2 * 5 + 1)
    for n, (length, target_length) in enumerate(zip(input_lengths, target_lengths, strict=True)):
        assert np.all(log_alpha[n, length:] == -np.inf)
        assert np.all(log_alpha[n, :, 2 * target_length + 1 :] == -np.inf)
        # The loss is -log(alpha[L-1, 2U] + alpha[L-1, 2U-1]) (eq. 8).
        last = log_alpha[n, length - 1]
        expected = -np.logaddexp(last[2 * target_length], last[2 * target_length - 1])
        np.testing.assert_allclose(result["loss"][n], expected, rtol=1e-14)


# ---- bad input --------------------------------------------------------------------------------------

_PREFIX = "CTCLoss node 'ctc_under_test': "


@functools.lru_cache(maxsize=16)
def _loss_session(blank: int = 0, zero_infinity: int = 0, target_elem: int = TensorProto.INT64) -> ort.InferenceSession:
    node = ortlstm.ops.make_node(
        "CTCLoss",
        {name: name for name in ("log_probs", "targets", "input_lengths", "target_lengths")},
        {"loss": "loss"},
        name="ctc_under_test",
        blank=blank,
        zero_infinity=zero_infinity,
    )
    graph = helper.make_graph(
        [node],
        "ctc",
        [
            helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("targets", target_elem, None),
            helper.make_tensor_value_info("input_lengths", TensorProto.INT64, None),
            helper.make_tensor_value_info("target_lengths", TensorProto.INT64, None),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, None)],
    )
    return _session_for(graph)


def _good_feeds() -> dict[str, np.ndarray]:
    # T = 6, N = 2, C = 5, S = 3
    return {
        "log_probs": np.full((6, 2, 5), np.log(0.2), np.float32),
        "targets": np.array([[1, 2, 2], [3, 4, 0]], np.int64),
        "input_lengths": np.array([6, 5], np.int64),
        "target_lengths": np.array([3, 2], np.int64),
    }


BAD_INPUTS = {
    "label_out_of_range": (
        {"targets": np.array([[1, 5, 2], [3, 4, 0]], np.int64)},
        "targets: sample 0, position 1: expected a label in [0, C=5) other than blank=0, got 5",
    ),
    "label_equal_to_blank": (
        {"targets": np.array([[1, 2, 2], [0, 4, 0]], np.int64)},
        "targets: sample 1, position 0: expected a label in [0, C=5) other than blank=0, got 0",
    ),
    "negative_label": (
        {"targets": np.array([[1, 2, -1], [3, 4, 0]], np.int64)},
        "targets: sample 0, position 2: expected a label in [0, C=5) other than blank=0, got -1",
    ),
    "input_length_above_T": (
        {"input_lengths": np.array([6, 7], np.int64)},
        "input_lengths[1]: expected a value in [0, T=6 (log_probs' dim 0)], got 7",
    ),
    "negative_input_length": (
        {"input_lengths": np.array([-1, 5], np.int64)},
        "input_lengths[0]: expected a value in [0, T=6 (log_probs' dim 0)], got -1",
    ),
    "target_length_above_S": (
        {"target_lengths": np.array([4, 2], np.int64)},
        "target_lengths[0]: expected a value in [0, S=3 (padded targets' dim 1)], got 4",
    ),
    "negative_target_length": (
        {"target_lengths": np.array([3, -2], np.int64)},
        "target_lengths[1]: expected a value in [0, S=3 (padded targets' dim 1)], got -2",
    ),
    "negative_target_length_concatenated": (
        {"targets": np.array([1, 2, 2, 3, 4], np.int64), "target_lengths": np.array([-1, 2], np.int64)},
        "target_lengths[0]: expected a value >= 0, got -1",
    ),
    "concatenated_length_mismatch": (
        {"targets": np.array([1, 2, 2, 3], np.int64)},
        "targets: expected shape [sum(target_lengths)=5] (concatenated), got [4]",
    ),
    "padded_batch_mismatch": (
        {"targets": np.array([[1, 2, 2]], np.int64)},
        "targets: expected shape [N=2, S] (padded), got [1, 3]",
    ),
    "targets_rank_3": (
        {"targets": np.zeros((2, 3, 1), np.int64)},
        "targets: expected rank 2 [N, S] (padded) or rank 1 [sum(target_lengths)] (concatenated), got shape [2, 3, 1]",
    ),
    "input_lengths_shape": (
        {"input_lengths": np.array([6, 5, 4], np.int64)},
        "input_lengths: expected shape [N=2], got [3]",
    ),
    "log_probs_rank_2": (
        {"log_probs": np.zeros((6, 5), np.float32)},
        "log_probs: expected rank 3 [T, N, C] (time-major), got shape [6, 5]",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_refused_with_its_name(name: str) -> None:
    overrides, message = BAD_INPUTS[name]
    with pytest.raises(InvalidArgument) as error:
        _loss_session().run(None, {**_good_feeds(), **overrides})
    assert _PREFIX + message in str(error.value)


def test_blank_outside_the_classes_is_refused() -> None:
    with pytest.raises(InvalidArgument) as error:
        _loss_session(blank=5).run(None, _good_feeds())
    assert _PREFIX + "attribute blank: expected a value in [0, C=5) (log_probs' dim 2), got 5" in str(error.value)


def test_float_targets_are_refused() -> None:
    feeds = {**_good_feeds(), "targets": np.array([[1, 2, 2], [3, 4, 0]], np.float32)}
    with pytest.raises(InvalidArgument) as error:
        _loss_session(target_elem=TensorProto.FLOAT).run(None, feeds)
    assert _PREFIX + "targets: expected element type int32 or int64, got ONNX element type 1" in str(error.value)


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"blank": -1}, "attribute blank: expected an integer >= 0, got -1"),
        ({"zero_infinity": 2}, "attribute zero_infinity: expected 0 or 1, got 2"),
    ],
)
def test_bad_attributes_are_refused_at_session_creation(attributes: dict[str, int], message: str) -> None:
    with pytest.raises(RuntimeException) as error:
        _loss_session(**attributes)
    assert _PREFIX + message in str(error.value)


def test_grad_refuses_a_log_alpha_of_another_shape() -> None:
    feeds = _good_feeds()
    feeds.pop("log_probs")
    log_probs = np.full((6, 2, 5), np.log(0.2))
    with pytest.raises(InvalidArgument) as error:
        _run_grad(log_probs=log_probs, log_alpha=np.zeros((2, 6, 5)), **feeds)
    assert "CTCLossGrad: log_alpha: expected shape [N=2, T=6, 2*S+1=7] (CTCLoss's output), got [2, 6, 5]" in str(
        error.value
    )


def _run_grad(**feeds: np.ndarray) -> list[np.ndarray]:
    node = ortlstm.ops.make_node(
        "CTCLossGrad", {port.name: port.name for port in schema.CTC_LOSS_GRAD.inputs}, {"grad_log_probs": "g"}
    )
    elem = {np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.int64): TensorProto.INT64}
    full = {"grad_loss": np.ones(2), "loss": np.ones(2), **feeds}
    graph = helper.make_graph(
        [node],
        "grad",
        [
            helper.make_tensor_value_info(name, elem[full[name].dtype], None)
            for name in schema.input_names(schema.CTC_LOSS_GRAD)
        ],
        [helper.make_tensor_value_info("g", TensorProto.DOUBLE, None)],
    )
    return _session_for(graph).run(None, full)


# ---- the gradient rule: float64 finite differences -----------------------------------------------
# CTCLossGrad follows torch's convention (the derivative plus exp(log_probs) * grad_loss, which a
# log_softmax in front cancels), so the finite differences run through a LogSoftmax: at its input
# the rule's gradient is the true one. The bare node is checked too, against the differences plus
# that term.


def _fd_case(case_id: str, targets: np.ndarray, input_lengths: list[int], target_lengths: list[int], **attributes: int):
    """A CTCLoss node on log_probs = log_softmax(logits) for gradcheck: T = 5, N = len(input_lengths), C = 4."""
    rng = np.random.default_rng(len(case_id))
    logits = rng.normal(size=(5, len(input_lengths), 4))
    return gradcheck.Case(
        case_id,
        "CTCLoss",
        (
            gradcheck.wrt(logits),
            gradcheck.fed(targets, dtype=np.int64),
            gradcheck.fed(input_lengths, dtype=np.int64),
            gradcheck.fed(target_lengths, dtype=np.int64),
        ),
        attributes,
        domain=schema.DOMAIN,
        num_outputs=2,
        loss_outputs=(0,),  # log_alpha is a stash
    )


FD_CASES = [
    _fd_case("padded_repeats", np.array([[1, 1, 2], [3, 2, 0]]), [5, 4], [3, 2]),
    _fd_case("concatenated", np.array([1, 2, 3, 3, 1]), [5, 5], [2, 3]),
    _fd_case("empty_target_and_short_input", np.array([[2, 3], [0, 0], [1, 0]]), [5, 3, 2], [2, 0, 1]),
    _fd_case("blank_2", np.array([[1, 3, 1], [0, 1, 0]]), [5, 4], [3, 2], blank=2),
    _fd_case("zero_infinity", np.array([[1, 1, 1], [3, 2, 0]]), [4, 5], [3, 2], zero_infinity=1),
]


def _through_log_softmax(case: gradcheck.Case) -> gradcheck._Built:
    """gradcheck.build's models with a LogSoftmax(axis=2) between the logits (in0) and CTCLoss."""
    built = gradcheck.build(case, np.float64)
    for model in (built.forward, built.with_gradients):
        node = next(node for node in model.graph.node if node.op_type == "CTCLoss")
        node.input[0] = "log_probs"
        model.graph.node.insert(0, helper.make_node("LogSoftmax", ["in0"], ["log_probs"], axis=2))
    # Differentiate again, now through the LogSoftmax (build's gradient graph differentiated the bare node).
    seeds = {"out0": "weight_out0"}
    with_gradients = onnx.ModelProto()
    with_gradients.CopyFrom(built.forward)
    emitter = GraphEmitter(onnx_opset(built.forward), used_names(built.forward.graph), infer_value_types(built.forward))
    result = build_backward(with_gradients.graph, seeds, built.wrt_names, emitter)
    with_gradients.graph.node.extend(emitter.nodes)
    with_gradients.graph.initializer.extend(emitter.initializers)
    for name in built.wrt_names:
        with_gradients.graph.output.append(helper.make_empty_tensor_value_info(result.gradients[name]))
    built.with_gradients = with_gradients
    return built


@pytest.mark.parametrize("case", FD_CASES, ids=lambda case: case.id)
def test_rule_matches_finite_differences_through_log_softmax(case: gradcheck.Case) -> None:
    built = _through_log_softmax(case)
    analytic = gradcheck.analytic_gradients(built)["in0"]
    numeric = gradcheck.numeric_gradients(built)["in0"]
    np.testing.assert_allclose(
        analytic,
        numeric,
        rtol=gradcheck.FLOAT64_RTOL,
        atol=gradcheck.FLOAT64_ATOL,
        err_msg=f"{case.id}: d loss / d logits",
    )


@pytest.mark.parametrize("case", FD_CASES, ids=lambda case: case.id)
def test_bare_node_gradient_is_the_derivative_plus_torchs_term(case: gradcheck.Case) -> None:
    # Here in0 is log_probs itself (random, not normalized): the rule gives the derivative of the loss
    # plus exp(log_probs) * grad_loss for every valid step of a sample whose loss is not zeroed.
    built = gradcheck.build(case, np.float64)
    analytic = gradcheck.analytic_gradients(built)["in0"]
    numeric = gradcheck.numeric_gradients(built)["in0"]
    log_probs = built.feeds["in0"]
    (loss,) = gradcheck._session(_loss_only(built.forward)).run(None, built.feeds)
    term = np.exp(log_probs) * built.feeds["weight_out0"][None, :, None]
    steps = np.arange(log_probs.shape[0])[:, None] < built.feeds["in2"][None, :]
    term = np.where(steps[:, :, None] & (loss[None, :, None] != 0), term, 0.0)
    np.testing.assert_allclose(
        analytic - term, numeric, rtol=gradcheck.FLOAT64_RTOL, atol=gradcheck.FLOAT64_ATOL, err_msg=case.id
    )


def _loss_only(forward: onnx.ModelProto) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(forward)
    del model.graph.output[:]
    model.graph.output.append(helper.make_empty_tensor_value_info("out0"))
    return model


def test_log_alpha_in_the_loss_is_refused() -> None:
    case = dataclasses.replace(FD_CASES[0], loss_outputs=(0, 1))
    with pytest.raises(ValueError, match="output log_alpha is a stash for CTCLossGrad and must not reach the loss"):
        gradcheck.build(case, np.float64)


def test_onnx_infers_the_output_types_and_shapes() -> None:
    ports = {name: name for name in ("log_probs", "targets", "input_lengths", "target_lengths")}
    nodes = [
        ortlstm.ops.make_node("CTCLoss", ports, {"loss": "loss", "log_alpha": "log_alpha"}),
        ortlstm.ops.make_node(
            "CTCLossGrad",
            {**ports, "grad_loss": "loss", "loss": "loss", "log_alpha": "log_alpha"},
            {"grad_log_probs": "grad_log_probs"},
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "ctc",
        [
            helper.make_tensor_value_info("log_probs", TensorProto.DOUBLE, ["T", 3, 7]),
            helper.make_tensor_value_info("targets", TensorProto.INT32, [3, 4]),
            helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [3]),
            helper.make_tensor_value_info("target_lengths", TensorProto.INT64, [3]),
        ],
        [],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _ONNX_OPSET), helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION)],
        ir_version=_IR_VERSION,
    )
    onnx.checker.check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {
        info.name: (
            info.type.tensor_type.elem_type,
            [dim.dim_param or dim.dim_value for dim in info.type.tensor_type.shape.dim],
        )
        for info in inferred.graph.value_info
    }
    assert shapes == {
        "loss": (TensorProto.DOUBLE, [3]),
        "log_alpha": (TensorProto.DOUBLE, [3, "T", 9]),
        "grad_log_probs": (TensorProto.DOUBLE, ["T", 3, 7]),
    }


# ---- an oracle independent of torch and of the recursions: every alignment, enumerated ---------


def _brute_force_loss(log_probs: np.ndarray, target: list[int], blank: int) -> float:
    """-log of the summed probability of every path over C^L that collapses to ``target`` (L = len(log_probs))."""
    length, num_classes = log_probs.shape
    total = 0.0
    for path in itertools.product(range(num_classes), repeat=length):
        collapsed = [label for i, label in enumerate(path) if label != blank and (i == 0 or path[i - 1] != label)]
        if collapsed == target:
            total += float(np.exp(sum(log_probs[t, label] for t, label in enumerate(path))))
    return -np.log(total) if total > 0 else np.inf


@pytest.mark.parametrize("blank", [0, 2])
def test_loss_is_the_sum_over_every_alignment(blank: int) -> None:
    rng = np.random.default_rng(blank)
    labels = [label for label in range(4) if label != blank]
    # T = 6, N = 6, C = 4: repeats, an empty target, a target that needs every step, one that cannot fit.
    targets = [
        [labels[0], labels[0]],
        [labels[1]],
        [],
        [labels[0], labels[1], labels[0]],
        [labels[2]] * 3,
        [labels[1]] * 4,
    ]
    input_lengths = np.array([6, 4, 3, 6, 5, 6])
    logits = rng.normal(size=(6, len(targets), 4))
    log_probs = logits - np.log(np.exp(logits).sum(axis=2, keepdims=True))
    padded = np.full((len(targets), 4), blank, np.int64)
    for n, target in enumerate(targets):
        padded[n, : len(target)] = target
    sess = _session("float64", TensorProto.INT64, "sum", blank, 0, 0)
    (loss,) = sess.run(
        ["loss"],
        {
            "log_probs": log_probs,
            "targets": padded,
            "input_lengths": input_lengths,
            "target_lengths": np.array([len(target) for target in targets], np.int64),
        },
    )
    expected = [_brute_force_loss(log_probs[: input_lengths[n], n], target, blank) for n, target in enumerate(targets)]
    assert np.isinf(expected[5])  # four equal labels need seven steps
    np.testing.assert_allclose(loss, expected, rtol=1e-12)
