"""``Loss.ctc_loss``: the loss unit (CTCLoss + torch's reduction in standard ops) against recorded torch runs.

``tests/recordings/ctc.npz`` (see test_ctc.py) holds per case torch's logits, log_probs, targets,
lengths, the loss under each reduction and its gradients with respect to log_probs and the logits.
Here the loss is emitted by ``losses.add_loss`` as the train step emits it, differentiated by
``build_backward`` and run in plain onnxruntime, for each declared prediction (log_probs, logits,
probs; time- or batch-major), with input_lengths given, derived, or fed empty.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import onnx.helper
import onnxruntime as ort
import pytest

import ortlstm.ops
from ortlstm.graphs import losses
from ortlstm.graphs.autodiff import build_backward
from ortlstm.graphs.emit.emitter import GraphEmitter, ValueType
from ortlstm.ops import schema

RECORDING = pathlib.Path(__file__).resolve().parent / "recordings" / "ctc.npz"
_DATA = np.load(RECORDING)
_CONFIGS = json.loads(str(_DATA["configs"]))["cases"]
OPSET = 17
IR_VERSION = 10
# As test_ctc.py: float32 sums of up to 1000 logsumexp steps, float64 to rounding.
TOLERANCE = {"float32": {"rtol": 2e-5, "atol": 2e-5}, "float64": {"rtol": 1e-11, "atol": 1e-12}}
CASES = sorted(_CONFIGS)
REDUCTIONS = ("none", "sum", "mean")


def _elem(array: np.ndarray) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(array.dtype)


def run_ctc(
    spec: losses.Loss, feeds: dict[str, np.ndarray], *, derive: bool = False, dynamic: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """The loss and its gradient with respect to ``prediction`` (the seed as the train step's: the loss).

    ``derive`` builds the loss without input_lengths (the function derives T for every sample).
    """
    names = ["prediction", "targets", *(() if derive else ("input_lengths",)), "target_lengths"]
    emitter = GraphEmitter(OPSET, used=names)
    inputs = []
    shapes: dict[str, list[int | str]] = {}
    for name in names:
        value = feeds[name]
        shape: list[int | str] = [f"{name}_{axis}" for axis in range(value.ndim)] if dynamic else list(value.shape)
        shapes[name] = shape
        inputs.append(onnx.helper.make_tensor_value_info(name, _elem(value), shape))
        emitter.set_type(name, _elem(value), shape)
    extra = {"target_lengths": "target_lengths", **({} if derive else {"input_lengths": "input_lengths"})}
    loss = losses.add_loss(emitter, spec, "prediction", "targets", extra)
    elem = _elem(feeds["prediction"])
    loss_shape = ["N"] if spec.reduction == "none" else []
    graph = onnx.helper.make_graph(
        list(emitter.nodes), "ctc", inputs, [onnx.helper.make_tensor_value_info(loss, elem, loss_shape)]
    )
    graph.initializer.extend(emitter.initializers)
    seed = losses.gradient_seed(emitter, spec, "prediction", "targets", loss)
    grad = build_backward(graph, seed, ["prediction"], emitter).gradients["prediction"]
    graph.node.extend(emitter.nodes[len(graph.node) :])
    known = {init.name for init in graph.initializer}
    graph.initializer.extend(init for init in emitter.initializers if init.name not in known)
    graph.output.append(onnx.helper.make_tensor_value_info(grad, elem, shapes["prediction"]))
    model = onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", OPSET),
            onnx.helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION),
        ],
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )
    value, gradient = session.run(None, {name: feeds[name] for name in names})
    return value, gradient


def _case(case: str, dtype: str) -> dict[str, np.ndarray]:
    return {
        "log_probs": _DATA[f"{case}/{dtype}/log_probs"],
        "logits": _DATA[f"{case}/logits"].astype(dtype),
        "targets": _DATA[f"{case}/targets"].astype(np.int64),
        "input_lengths": _DATA[f"{case}/input_lengths"].astype(np.int64),
        "target_lengths": _DATA[f"{case}/target_lengths"].astype(np.int64),
    }


def _spec(case: str, reduction: str, **options: object) -> losses.Loss:
    config = _CONFIGS[case]
    return losses.Loss.ctc_loss(
        blank=config["blank"], reduction=reduction, zero_infinity=config["zero_infinity"], **options
    )


def _expected_loss(case: str, dtype: str, reduction: str) -> np.ndarray:
    return _DATA[f"{case}/{dtype}/loss_{reduction}"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_log_probs_match_torch(case: str, dtype: str, reduction: str) -> None:
    """The loss of each reduction, and (sum, mean) torch's gradient at log_probs."""
    data = _case(case, dtype)
    value, gradient = run_ctc(_spec(case, reduction), {**data, "prediction": data["log_probs"]})
    context = f"case {case} {dtype} reduction={reduction}"
    np.testing.assert_allclose(value, _expected_loss(case, dtype, reduction), **TOLERANCE[dtype], err_msg=context)
    if reduction != "none":
        expected = _DATA[f"{case}/{dtype}/grad_log_probs_{reduction}"]
        np.testing.assert_allclose(gradient, expected, **TOLERANCE[dtype], err_msg=context)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_logits_match_torchs_log_softmax_then_ctc_loss(case: str, dtype: str, batch_first: bool) -> None:
    """``input="logits"``: torch users' ``ctc_loss(logits.log_softmax(2), ...)``, its gradient at the logits."""
    data = _case(case, dtype)
    logits = data["logits"].transpose(1, 0, 2).copy() if batch_first else data["logits"]
    spec = _spec(case, "mean", input="logits", batch_first=batch_first)
    value, gradient = run_ctc(spec, {**data, "prediction": logits})
    expected = _DATA[f"{case}/{dtype}/grad_logits_mean"]
    if batch_first:
        expected = expected.transpose(1, 0, 2)
    np.testing.assert_allclose(value, _expected_loss(case, dtype, "mean"), **TOLERANCE[dtype])
    np.testing.assert_allclose(gradient, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("case", ["random_padded", "random_concatenated", "blank_last", "too_long_zero_infinity"])
def test_probs_are_taken_through_a_log(case: str) -> None:
    """``input="probs"`` (a Softmax output): torch's ``ctc_loss(probs.log(), ...)``; its gradient at probs."""
    data = _case(case, "float64")
    probs = np.exp(data["log_probs"])
    value, gradient = run_ctc(_spec(case, "sum", input="probs"), {**data, "prediction": probs})
    np.testing.assert_allclose(value, _expected_loss(case, "float64", "sum"), **TOLERANCE["float64"])
    expected = _DATA[f"{case}/float64/grad_log_probs_sum"] / probs  # torch: d log(p) / dp = 1 / p
    np.testing.assert_allclose(gradient, expected, **TOLERANCE["float64"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", ["batch_64", "random_padded", "random_concatenated", "repeated_labels"])
def test_input_lengths_are_derived_from_the_time_axis(case: str, dtype: str) -> None:
    """Absent, or fed as an empty array: every sample has all T steps, as given explicitly."""
    data = _case(case, dtype)
    steps = data["log_probs"].shape[0]
    full = {**data, "prediction": data["log_probs"], "input_lengths": np.full_like(data["input_lengths"], steps)}
    spec = _spec(case, "none")
    expected, expected_gradient = run_ctc(spec, full)
    assert np.isfinite(expected).any()
    for feeds, derive in (({**full, "input_lengths": np.zeros(0, np.int64)}, False), (full, True)):
        value, gradient = run_ctc(spec, feeds, derive=derive)
        np.testing.assert_array_equal(value, expected)
        np.testing.assert_array_equal(gradient, expected_gradient)


def test_input_lengths_of_another_length_are_refused_by_name() -> None:
    data = _case("random_padded", "float32")
    feeds = {**data, "prediction": data["log_probs"], "input_lengths": data["input_lengths"][:-1]}
    with pytest.raises(Exception, match="input_lengths"):
        run_ctc(_spec("random_padded", "mean"), feeds)


def test_defaults_are_torchs() -> None:
    spec = losses.Loss.ctc_loss()
    assert (spec.blank, spec.reduction, spec.zero_infinity) == (0, "mean", False)
    assert (spec.input, spec.batch_first) == ("log_probs", False)
    assert [extra.name for extra in spec.extra_targets] == ["input_lengths", "target_lengths"]
    assert [extra.required for extra in spec.extra_targets] == [False, True]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"input": "softmax"}, "ctc_loss input must be one of 'log_probs', 'probs', 'logits'"),
        ({"blank": -1}, "ctc_loss blank must be >= 0, got -1"),
        ({"reduction": "batchmean"}, "batchmean is not a valid value for reduction"),
    ],
)
def test_invalid_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        losses.Loss.ctc_loss(**options)


def test_other_losses_take_no_ctc_options() -> None:
    with pytest.raises(ValueError, match="blank applies to ctc_loss only, not mse_loss"):
        losses.Loss("mse_loss", blank=3)
    with pytest.raises(ValueError, match="input applies to ctc_loss only"):
        losses.Loss("nll_loss", input="probs")


_FLOAT = onnx.TensorProto.FLOAT
_INT64 = onnx.TensorProto.INT64


@pytest.mark.parametrize(
    ("spec", "prediction", "target", "extras", "message"),
    [
        (
            losses.Loss.ctc_loss(),
            ValueType(_FLOAT, (7, 3)),
            ValueType(_INT64, (3, 2)),
            {},
            r"the prediction 'prediction' must be 3-D \(T, N, C\), got \[7, 3\] \(pass batch_first=True",
        ),
        (
            losses.Loss.ctc_loss(),
            ValueType(_FLOAT, (7, 3, 5)),
            ValueType(_FLOAT, (3, 2)),
            {},
            "loss target 'target': ctc_loss expects int64 labels, padded",
        ),
        (
            losses.Loss.ctc_loss(),
            ValueType(_FLOAT, (7, 3, 5)),
            ValueType(_INT64, (4, 2)),
            {},
            r"expects padded labels \[N=3, S\]",
        ),
        (
            losses.Loss.ctc_loss(batch_first=True),
            ValueType(_FLOAT, (3, 7, 5)),
            ValueType(_INT64, (3, 2)),
            {"target_lengths": ValueType(_INT64, (4,))},
            r"target_lengths must hold one length per sample, int64 \[N=3\], got int64 \[4\]",
        ),
        (
            losses.Loss.ctc_loss(),
            ValueType(_FLOAT, (7, 3, 5)),
            ValueType(_INT64, (6,)),
            {"input_lengths": ValueType(_FLOAT, (3,))},
            r"input_lengths must be int64 \[N\], got float32 \[3\]",
        ),
        (
            losses.Loss.ctc_loss(blank=5),
            ValueType(_FLOAT, (7, 3, 5)),
            ValueType(_INT64, (3, 2)),
            {},
            "blank 5 is not one of the 5 classes",
        ),
    ],
)
def test_bad_targets_are_refused_with_their_names(
    spec: losses.Loss,
    prediction: ValueType,
    target: ValueType,
    extras: dict[str, ValueType],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        losses.check_target(spec, prediction, target, extra_types=extras)


def test_missing_and_unknown_extra_targets_are_refused() -> None:
    emitter = GraphEmitter(OPSET, used=["p", "t", "l"])
    emitter.set_type("p", _FLOAT, (7, 3, 5))
    emitter.set_type("t", _INT64, (3, 2))
    with pytest.raises(ValueError, match=r"loss ctc_loss needs \['target_lengths'\] besides the target"):
        losses.add_loss(emitter, losses.Loss.ctc_loss(), "p", "t")
    with pytest.raises(ValueError, match=r"takes only \['input_lengths', 'target_lengths'\] .* got \['lengths'\]"):
        losses.add_loss(emitter, losses.Loss.ctc_loss(), "p", "t", {"target_lengths": "l", "lengths": "l"})
    with pytest.raises(ValueError, match=r"loss mse_loss takes no other target besides the target"):
        losses.add_loss(emitter, losses.Loss.mse_loss(), "p", "t", {"target_lengths": "l"})


def test_the_function_takes_torchs_arguments() -> None:
    """``losses.ctc_loss(emitter, log_probs, targets, input_lengths, target_lengths, blank=..., ...)``."""
    data = _case("blank_last", "float64")
    emitter = GraphEmitter(OPSET, used=list(data))
    for name, value in data.items():
        emitter.set_type(name, _elem(value), value.shape)
    loss = losses.ctc_loss(emitter, "log_probs", "targets", "input_lengths", "target_lengths", blank=5)
    reference = losses.ctc_loss(emitter, "log_probs", "targets", target_lengths="target_lengths", blank=5)
    assert loss != reference
    ctc_nodes = [node for node in emitter.nodes if node.op_type == "CTCLoss"]
    assert [{a.name: a.i for a in node.attribute}["blank"] for node in ctc_nodes] == [5, 5]
