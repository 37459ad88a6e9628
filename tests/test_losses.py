"""Losses built in ONNX against recorded torch.nn.functional values (no torch needed).

``tests/recordings/losses.npz`` (made by ``tests/recordings/record_torch.py``) holds, for
cross_entropy (class indices and probabilities), nll_loss, mse_loss, l1_loss, smooth_l1_loss
and huber_loss (differences at their thresholds among them), kl_div (probability and log
targets, "batchmean" too), binary_cross_entropy (saturated probabilities among them),
binary_cross_entropy_with_logits, soft_margin_loss (large margins among them) over every reduction,
ignore_index absent / default / custom, label smoothing, class weights and pos_weight, on
[N, C], [N, C, d1] and [C] inputs, the inputs, targets, torch's loss and its
gradient (the gradient is checked in test_loss_gradients.py).
"""

from __future__ import annotations

import inspect
import json
import pathlib
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnxruntime as ort
import pytest

from ortlstm.graphs import losses
from ortlstm.graphs.emit.emitter import GraphEmitter, ValueType

RECORDING = pathlib.Path(__file__).resolve().parent / "recordings" / "losses.npz"
OPSET = 17
IR_VERSION = 10

FLOAT64_RTOL = 1e-12
FLOAT64_ATOL = 1e-13
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-6
"""Loss values vs torch: float64 to a few roundings, float32 to the usual float32 tolerance
(log_softmax and the reductions sum in a different order)."""
TOLERANCES = {"float32": (FLOAT32_RTOL, FLOAT32_ATOL), "float64": (FLOAT64_RTOL, FLOAT64_ATOL)}

_DATA = np.load(RECORDING)
_META = json.loads(str(_DATA["configs"]))
CASES = {case["name"]: case for case in _META["cases"]}


def loss_spec(case: dict[str, Any]) -> losses.Loss:
    """The Loss a recorded case's torch call describes (same keyword names)."""
    return losses.Loss(case["kind"], **case["kwargs"])


def recorded(case: dict[str, Any], dtype: str) -> dict[str, np.ndarray]:
    """The case's input, target, torch's loss and its gradient."""
    inputs = _DATA[f"{case['data']}/{dtype}/input"]
    loss_size = int(np.prod(case["loss_shape"]))
    return {
        "input": inputs,
        "target": _DATA[f"{case['data']}/{dtype}/target"],
        "loss": _DATA[f"{dtype}/loss"][case["loss_offset"] : case["loss_offset"] + loss_size].reshape(
            case["loss_shape"]
        ),
        "grad": _DATA[f"{dtype}/grad"][case["grad_offset"] : case["grad_offset"] + inputs.size].reshape(inputs.shape),
    }


def build_loss_model(
    spec: losses.Loss, input_value: np.ndarray, target_value: np.ndarray, *, dynamic: bool = False
) -> tuple[onnx.ModelProto, GraphEmitter, str]:
    """A model with inputs ``input`` and ``target`` and the loss as its output.

    ``dynamic`` declares the batch axis symbolic, so the builders take their run-time paths.
    """

    def dims(array: np.ndarray) -> list[int | str]:
        shape: list[int | str] = list(array.shape)
        if dynamic and shape:
            shape[0] = "batch"
        return shape

    input_type = onnx.helper.np_dtype_to_tensor_dtype(input_value.dtype)
    target_type = onnx.helper.np_dtype_to_tensor_dtype(target_value.dtype)
    inputs = [
        onnx.helper.make_tensor_value_info("input", input_type, dims(input_value)),
        onnx.helper.make_tensor_value_info("target", target_type, dims(target_value)),
    ]
    emitter = GraphEmitter(OPSET, used=["input", "target"])
    emitter.set_type("input", input_type, dims(input_value))
    emitter.set_type("target", target_type, dims(target_value))
    loss = losses.add_loss(emitter, spec, "input", "target")
    if spec.reduction != "none":
        loss_shape: list[int | str] = []
    elif losses.LOSSES[spec.kind].class_target:  # class indices or probabilities: a loss per position
        loss_shape = dims(input_value)[:1] + dims(input_value)[2:] if input_value.ndim > 1 else []
    else:
        loss_shape = dims(input_value)
    output = onnx.helper.make_tensor_value_info(loss, input_type, loss_shape)
    graph = onnx.helper.make_graph(emitter.nodes, "loss", inputs, [output], emitter.initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    return model, emitter, loss


def run_loss(
    spec: losses.Loss, input_value: np.ndarray, target_value: np.ndarray, *, dynamic: bool = False
) -> np.ndarray:
    model, _, _ = build_loss_model(spec, input_value, target_value, dynamic=dynamic)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (value,) = session.run(None, {"input": input_value, "target": target_value})
    return value


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_matches_torch(name: str, dtype: str) -> None:
    case = CASES[name]
    data = recorded(case, dtype)
    value = run_loss(loss_spec(case), data["input"], data["target"])
    rtol, atol = TOLERANCES[dtype]
    assert value.dtype == np.dtype(dtype)
    assert value.shape == data["loss"].shape
    np.testing.assert_allclose(value, data["loss"], rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize(
    "name",
    [
        "cross_entropy_index_3d_ignorecustom_ls0.1_w_mean",
        "cross_entropy_prob_3d_ls0.2_w_mean",
        "nll_loss_index_2d_ignored_ls0.0_w_mean",
        "binary_cross_entropy_with_logits_binary_3d_w_pw_mean",
        "binary_cross_entropy_probability_3d_w_mean",
        "kl_div_divergence_3d_prob_batchmean",
    ],
)
def test_dynamic_batch(name: str) -> None:
    """A symbolic batch axis takes the run-time paths (class count, element count) to the same values."""
    case = CASES[name]
    data = recorded(case, "float64")
    value = run_loss(loss_spec(case), data["input"], data["target"], dynamic=True)
    np.testing.assert_allclose(value, data["loss"], rtol=FLOAT64_RTOL, atol=FLOAT64_ATOL)


def test_output_is_the_loss_as_it_is() -> None:
    emitter = GraphEmitter(OPSET, used=["loss"])
    emitter.set_type("loss", onnx.TensorProto.FLOAT, [])
    assert losses.add_loss(emitter, losses.Loss.output(), "loss") == "loss"
    assert not emitter.nodes


def test_defaults_are_torchs() -> None:
    spec = losses.Loss.cross_entropy()
    assert (spec.reduction, spec.ignore_index, spec.label_smoothing, spec.weight) == ("mean", -100, 0.0, None)
    assert losses.Loss.nll_loss().ignore_index == -100
    assert losses.Loss.mse_loss().reduction == "mean"
    assert losses.Loss.binary_cross_entropy_with_logits().pos_weight is None


# ---- the table ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", losses.KINDS)
def test_each_loss_has_a_constructor_and_a_function_from_the_table(kind: str) -> None:
    """``Loss.<kind>`` takes the loss function's torch arguments (after emitter, input, targets), its defaults."""
    targets = 3 + len(losses.LOSSES[kind].extra_targets)
    function_arguments = list(inspect.signature(losses.LOSSES[kind].body).parameters.values())[targets:]
    constructor = getattr(losses.Loss, kind)
    assert list(inspect.signature(constructor).parameters.values()) == function_arguments
    assert list(losses.LOSSES[kind].options) == [argument.name for argument in function_arguments]
    spec = constructor()
    assert spec.kind == kind
    assert spec.needs_target == (kind != "output")
    assert spec.class_target == (kind in ("cross_entropy", "nll_loss"))
    if kind != "output":
        assert getattr(losses, kind) is losses.LOSSES[kind].function


def test_unknown_names_are_no_losses() -> None:
    with pytest.raises(AttributeError, match="type object 'Loss' has no attribute 'hinge'"):
        losses.Loss.hinge  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'hinge'"):
        losses.hinge  # noqa: B018


def test_register_loss_refuses_what_the_table_cannot_hold() -> None:
    def margin_loss(emitter: GraphEmitter, input: str, target: str, margin: float = 1.0) -> str:
        return input

    def summed(emitter: GraphEmitter, input: str, target: str, reduction: str = "sum") -> str:
        return input

    with pytest.raises(TypeError, match="margin_loss: argument 'margin' is no Loss field; add the field first"):
        losses.register_loss()(margin_loss)
    with pytest.raises(TypeError, match="summed: reduction defaults to 'sum', Loss to 'mean'"):
        losses.register_loss()(summed)
    with pytest.raises(ValueError, match="loss 'mse_loss' is registered twice"):
        losses.register_loss(name="mse_loss")(summed)
    assert "margin_loss" not in losses.LOSSES
    assert "summed" not in losses.LOSSES


# ---- refusals ------------------------------------------------------------------------------------

F32, F64, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT64


@pytest.mark.parametrize(
    ("spec", "prediction", "target", "message"),
    [
        (
            losses.Loss.cross_entropy(),
            ValueType(F32, ("batch", 5)),
            ValueType(F32, ("batch",)),
            r"loss target 'labels'.*int64.*\[batch\].*got float32 \[batch\]",
        ),
        (
            losses.Loss.nll_loss(),
            ValueType(F32, (4, 5)),
            ValueType(F32, (4, 5)),
            r"loss target 'labels': nll_loss expects class indices of type int64 \[4\], got float32 \[4, 5\]",
        ),
        (
            losses.Loss.cross_entropy(),
            ValueType(F32, (4, 5, 7)),
            ValueType(I64, (4,)),
            r"loss target 'labels'.*class indices int64 \[4, 7\].*got int64 \[4\]",
        ),
        (
            losses.Loss.cross_entropy(),
            ValueType(F32, (4, 5)),
            ValueType(I64, (3,)),
            r"expects class indices int64 \[4\].*got int64 \[3\]",
        ),
        (
            losses.Loss.cross_entropy(),
            ValueType(F32, (4, 5)),
            ValueType(F64, (4, 5)),
            r"class probabilities expects float32 \[4, 5\].*got float64 \[4, 5\]",
        ),
        (
            losses.Loss.cross_entropy(weight=[1.0, 2.0]),
            ValueType(F32, (4, 5)),
            ValueType(I64, (4,)),
            r"weight has 2 entries but 'logits' has 5 classes",
        ),
        (
            losses.Loss.mse_loss(),
            ValueType(F32, (4, 5)),
            ValueType(I64, (4, 5)),
            r"loss target 'labels': mse_loss expects float32 \[4, 5\].*got int64 \[4, 5\]",
        ),
        (
            losses.Loss.binary_cross_entropy_with_logits(),
            ValueType(F32, (4, 5)),
            ValueType(F32, (4, 1)),
            r"expects the prediction's shape \[4, 5\], got float32 \[4, 1\]",
        ),
        (
            losses.Loss.l1_loss(),
            ValueType(onnx.TensorProto.INT64, (4,)),
            ValueType(F32, (4,)),
            r"the prediction 'logits' must be a float tensor, got int64",
        ),
    ],
)
def test_wrong_target_is_refused(spec: losses.Loss, prediction: ValueType, target: ValueType, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        losses.check_target(spec, prediction, target, prediction_name="logits", target_name="labels")
    emitter = GraphEmitter(OPSET, used=["logits", "labels"])
    emitter.types.update({"logits": prediction, "labels": target})
    with pytest.raises(ValueError, match=message):
        losses.add_loss(emitter, spec, "logits", "labels")
    assert not emitter.nodes


@pytest.mark.parametrize(
    "spec",
    [
        losses.Loss.cross_entropy(),
        losses.Loss.nll_loss(weight=[1.0, 2.0, 3.0]),
        losses.Loss.cross_entropy(ignore_index=5),
    ],
    ids=["cross_entropy", "nll_loss_weighted", "cross_entropy_ignore5"],
)
def test_negative_class_index_fails_instead_of_reading_from_the_end(spec: losses.Loss) -> None:
    """GatherElements reads index -1 as the last class; the graph makes onnxruntime fail on it, as torch raises."""
    logits = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    run_loss(spec, logits, np.asarray([0, spec.ignore_index, 2, 1]))  # ignore_index itself is fine
    with pytest.raises(Exception, match=r"[Oo]ut of (range|data bounds)"):
        run_loss(spec, logits, np.asarray([0, -1, 2, 1]))


def test_target_values_are_checked_where_torch_checks_them() -> None:
    spec = losses.Loss.cross_entropy()
    # [C] input, 0-D target; an unknown class count is not checked; probabilities are not either.
    with pytest.raises(ValueError, match=r"'y': class index 5 is out of range for 5 classes"):
        losses.check_target_values(spec, ValueType(F32, (5,)), np.asarray(5), target_name="y")
    losses.check_target_values(spec, ValueType(F32, ("N", "C")), np.asarray([7, -3]))
    losses.check_target_values(spec, ValueType(F32, (2, 3)), np.asarray([[1.5, -2.0, 0.0]] * 2, np.float32))
    losses.check_target_values(losses.Loss.mse_loss(), ValueType(F32, (2,)), np.asarray([-5.0, 7.0]))
    with pytest.raises(ValueError, match=r"binary_cross_entropy takes targets in \[0, 1\], got -0\.5"):
        losses.check_target_values(losses.Loss.binary_cross_entropy(), None, np.asarray([0.0, -0.5]))


def test_output_loss_refusals() -> None:
    emitter = GraphEmitter(OPSET, used=["out", "y"])
    emitter.set_type("out", F32, [4, 2])
    with pytest.raises(ValueError, match=r"'out' used as the loss must hold one element, its shape is \[4, 2\]"):
        losses.add_loss(emitter, losses.Loss.output(), "out")
    with pytest.raises(ValueError, match="reads no target"):
        losses.add_loss(emitter, losses.Loss.output(), "out", "y")
    with pytest.raises(ValueError, match="needs a target"):
        losses.add_loss(emitter, losses.Loss.mse_loss(), "out")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: losses.Loss("hinge"), "unknown loss kind 'hinge'"),
        (lambda: losses.Loss.mse_loss(reduction="avg"), "avg is not a valid value for reduction"),
        (lambda: losses.Loss.cross_entropy(label_smoothing=1.5), "label_smoothing must be between 0.0 and 1.0"),
        (lambda: losses.Loss("nll_loss", label_smoothing=0.1), "label_smoothing applies to cross_entropy only"),
        (lambda: losses.Loss.cross_entropy(weight=[[1.0, 2.0]]), "weight must be 1-D"),
        (lambda: losses.Loss("mse_loss", pos_weight=[1.0]), "pos_weight applies to binary_cross_entropy_with_logits"),
        (lambda: losses.Loss("l1_loss", weight=[1.0]), "l1_loss takes no weight"),
        (lambda: losses.Loss("huber_loss", beta=0.5), "beta applies to smooth_l1_loss only, not huber_loss"),
        (lambda: losses.Loss("smooth_l1_loss", delta=0.5), "delta applies to huber_loss only, not smooth_l1_loss"),
        (lambda: losses.Loss.smooth_l1_loss(beta=-0.1), "smooth_l1_loss does not support negative values for beta"),
        (lambda: losses.Loss.huber_loss(delta=0.0), "huber_loss does not support non-positive values for delta"),
        (lambda: losses.Loss.mse_loss("batchmean"), r"batchmean is not a valid value for reduction \(choose mean, sum"),
        (
            lambda: losses.Loss.kl_div("avg"),
            r"avg is not a valid value for reduction \(choose mean, sum, none or batch",
        ),
        (lambda: losses.Loss("mse_loss", log_target=True), "log_target applies to kl_div only, not mse_loss"),
    ],
)
def test_invalid_specs_are_refused(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()
