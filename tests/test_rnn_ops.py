"""RNNTraining and RNNGrad against independent oracles.

- onnxruntime's own ONNX ``RNN`` kernel (float32 only in onnxruntime): HAll and Ht of every
  configuration it runs, within float32 rounding.
- ``ortlstm.reference_rnn``: a NumPy float64 forward and backward written from the equations, for
  every configuration (float64, layout 1, all activations, clip).
- Central finite differences of the float64 RNNTraining for every RNNGrad output.
- Hostile inputs: a clear message naming the input or attribute, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort
import op_runner
import pytest
from onnx import TensorProto, helper

from ortlstm.ops import schema
from ortlstm.reference_rnn import rnn_grad, rnn_training

T, N, I, H = 4, 3, 5, 4  # noqa: E741 - the op's dimension names
SEQUENCE_LENS = np.array([4, 2, 0], np.int32)  # full, partial, empty
FLOAT32_ATOL = 2e-6  # |ortlstm float32 - onnxruntime RNN float32|, values of order 1
FLOAT64_ATOL = 1e-12  # ortlstm float64 vs the NumPy float64 reference
FD_STEP = 1e-6
FD_REL_ERROR = 1e-7  # ||analytic - central differences|| / ||central differences||


def _inputs(direction: str, *, seed: int, layout: int = 0, lens: bool = True, h0: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    d = schema.num_directions(direction)
    x = rng.standard_normal((T, N, I))
    initial_h = rng.standard_normal((d, N, H))
    if layout == 1:
        x, initial_h = x.transpose(1, 0, 2), initial_h.transpose(1, 0, 2)
    return {
        "X": x,
        "W": rng.standard_normal((d, H, I)) * 0.5,
        "R": rng.standard_normal((d, H, H)) * 0.5,
        "B": rng.standard_normal((d, 2 * H)) * 0.5,
        "sequence_lens": SEQUENCE_LENS if lens else None,
        "initial_h": initial_h if h0 else None,
    }


BASIC = [
    {"direction": direction, **activation}
    for direction in ("forward", "reverse", "bidirectional")
    for activation in ({}, {"activations": ["Relu"]})
]
ACTIVATION_CONFIGS = [
    {"activations": ["LeakyRelu"], "activation_alpha": [0.1]},
    {"activations": ["Softsign"], "clip": 0.7},
    {"activations": ["ScaledTanh"], "activation_alpha": [1.5], "activation_beta": [0.8]},
    {"activations": ["Elu"], "activation_alpha": [0.9]},
    {"activations": ["Affine"], "activation_alpha": [0.4], "activation_beta": [0.2]},
    {"activations": ["HardSigmoid"], "activation_alpha": [0.3], "activation_beta": [0.4]},
    {"activations": ["Sigmoid"]},
    {"activations": ["Softplus"]},
    {"activations": ["ThresholdedRelu"], "activation_alpha": [0.2]},
    {"activations": ["Relu"], "clip": 1.5},
    {"clip": 0.5},
]
EVERY = [
    *BASIC,
    *ACTIVATION_CONFIGS,
    {"direction": "bidirectional", "layout": 1, "activations": ["Tanh", "Relu"]},
    {"direction": "reverse", "layout": 1},
]


def _attributes(config: Mapping[str, object]) -> dict[str, object]:
    attributes = {"hidden_size": H, **config}
    activations = list(config.get("activations", []))  # type: ignore[call-overload]
    if len(activations) == 1 and config.get("direction") == "bidirectional":
        attributes["activations"] = activations * 2
    return attributes


def _id(config: Mapping[str, object]) -> str:
    return "-".join(f"{k}={v}" for k, v in config.items()) or "defaults"


_ELEM = {False: TensorProto.FLOAT, True: TensorProto.INT32}  # by "is it sequence_lens"
# onnxruntime 1.19.2's RNN kernel leaves Y_h of a length-0 sequence unwritten (4.7e15 seen); 1.32's writes 0.
ORT_RNN_LEAVES_EMPTY_YH = tuple(int(part) for part in ort.__version__.split(".")[:2]) < (1, 20)


def _onnx_rnn(inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object]) -> list[np.ndarray]:
    """onnxruntime's ONNX RNN (opset 14), float32."""
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h"]
    present = [name if inputs.get(name) is not None else "" for name in names]
    node = helper.make_node("RNN", present, ["Y", "Y_h"], **attributes)
    graph = helper.make_graph(
        [node],
        "rnn",
        [helper.make_tensor_value_info(name, _ELEM[name == "sequence_lens"], None) for name in present if name],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("Y", "Y_h")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=op_runner.IR_VERSION)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {
        name: inputs[name] if name == "sequence_lens" else np.asarray(inputs[name], np.float32)
        for name in present
        if name
    }
    return session.run(None, feeds)


@pytest.mark.parametrize("config", [c for c in EVERY if c.get("layout", 0) == 0], ids=_id)
def test_forward_equals_onnxruntime_rnn(config: dict) -> None:
    """onnxruntime's RNN refuses layout 1 ("Batchwise recurrent operations ... are not supported")."""
    attributes = _attributes(config)
    inputs = _inputs(str(config.get("direction", "forward")), seed=1)
    y, y_h = _onnx_rnn(inputs, attributes)
    out = op_runner.run("RNNTraining", inputs, attributes, dtype=np.float32)
    np.testing.assert_allclose(out["HAll"], y, rtol=0, atol=FLOAT32_ATOL)
    rows = np.arange(N)
    if ORT_RNN_LEAVES_EMPTY_YH:  # its Y_h of a length-0 entry is whatever memory held (zero here: reference test)
        rows = rows[SEQUENCE_LENS > 0]
    np.testing.assert_allclose(out["Ht"][:, rows], y_h[:, rows], rtol=0, atol=FLOAT32_ATOL)


@pytest.mark.parametrize("config", EVERY, ids=_id)
def test_forward_equals_numpy_reference(config: dict) -> None:
    attributes = _attributes(config)
    layout = int(config.get("layout", 0))
    inputs = _inputs(str(config.get("direction", "forward")), seed=2, layout=layout)
    expected = rnn_training(inputs, **attributes)
    out = op_runner.run("RNNTraining", inputs, attributes, dtype=np.float64)
    for name in ("HAll", "Ht"):
        np.testing.assert_allclose(out[name], expected[name], rtol=0, atol=FLOAT64_ATOL, err_msg=name)


def _loss_weights(attributes: Mapping[str, object], inputs: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    shapes = {name: value.shape for name, value in rnn_training(inputs, **attributes).items()}
    rng = np.random.default_rng(7)
    return {"HAll": rng.standard_normal(shapes["HAll"]), "Ht": rng.standard_normal(shapes["Ht"])}


def _loss(inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object], weights: dict) -> float:
    out = op_runner.run("RNNTraining", inputs, attributes, dtype=np.float64)
    return float(np.sum(out["HAll"] * weights["HAll"]) + np.sum(out["Ht"] * weights["Ht"]))


def _grad_inputs(inputs: Mapping[str, np.ndarray | None], hall: np.ndarray, weights: dict) -> dict:
    return {**inputs, "HAll": hall, "grad_HAll": weights["HAll"], "grad_Ht": weights["Ht"]}


def _gradients(inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object], weights: dict, dtype) -> dict:
    forward = op_runner.run("RNNTraining", inputs, attributes, dtype=dtype)
    return op_runner.run("RNNGrad", _grad_inputs(inputs, forward["HAll"], weights), attributes, dtype=dtype)


GRAD_OF = {"dX": "X", "dW": "W", "dR": "R", "dB": "B", "dH0": "initial_h"}
# Smooth activations, and Relu / clip away from their kinks (finite differences straddle none at these seeds).
GRAD_CONFIGS = [
    *BASIC,
    {"direction": "bidirectional", "layout": 1},
    *ACTIVATION_CONFIGS[:5],
    {"clip": 0.5},
]


@pytest.mark.parametrize("config", GRAD_CONFIGS, ids=_id)
def test_gradients_equal_finite_differences(config: dict) -> None:
    attributes = _attributes(config)
    layout = int(config.get("layout", 0))
    inputs = _inputs(str(config.get("direction", "forward")), seed=3, layout=layout)
    weights = _loss_weights(attributes, inputs)
    analytic = _gradients(inputs, attributes, weights, np.float64)
    for grad_name, input_name in GRAD_OF.items():
        value = np.asarray(inputs[input_name], np.float64)
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            for sign in (1.0, -1.0):
                moved = value.copy()
                moved[index] += sign * FD_STEP
                numeric[index] += sign * _loss({**inputs, input_name: moved}, attributes, weights) / (2 * FD_STEP)
        error = np.linalg.norm(analytic[grad_name] - numeric) / max(np.linalg.norm(numeric), 1e-300)
        assert error < FD_REL_ERROR, f"{grad_name}: relative error {error:.2e}"


@pytest.mark.parametrize("config", EVERY, ids=_id)
def test_gradients_equal_numpy_reference(config: dict) -> None:
    attributes = _attributes(config)
    layout = int(config.get("layout", 0))
    inputs = _inputs(str(config.get("direction", "forward")), seed=4, layout=layout)
    weights = _loss_weights(attributes, inputs)
    forward = op_runner.run("RNNTraining", inputs, attributes, dtype=np.float64)
    grad_inputs = _grad_inputs(inputs, forward["HAll"], weights)
    expected = rnn_grad(grad_inputs, **attributes)
    actual = op_runner.run("RNNGrad", grad_inputs, attributes, dtype=np.float64)
    for name in GRAD_OF:
        np.testing.assert_allclose(actual[name], expected[name], rtol=0, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("config", BASIC, ids=_id)
def test_float32_gradients_track_float64(config: dict) -> None:
    attributes = _attributes(config)
    inputs = _inputs(str(config["direction"]), seed=4)
    weights = _loss_weights(attributes, inputs)
    exact = _gradients(inputs, attributes, weights, np.float64)
    single = _gradients(inputs, attributes, weights, np.float32)
    for name in GRAD_OF:
        error = np.linalg.norm(single[name] - exact[name]) / np.linalg.norm(exact[name])
        assert error < 1e-5, f"{name}: float32 relative error {error:.2e}"


def test_omitted_inputs_and_outputs() -> None:
    attributes = {"hidden_size": H}
    inputs = {**_inputs("forward", seed=5, lens=False, h0=False), "B": None}
    expected = rnn_training(inputs, **attributes)
    only_ht = op_runner.run("RNNTraining", inputs, attributes, outputs=["Ht"])
    np.testing.assert_allclose(only_ht["Ht"], expected["Ht"], rtol=0, atol=FLOAT64_ATOL)
    forward = op_runner.run("RNNTraining", inputs, attributes)
    grads = op_runner.run(
        "RNNGrad", {**inputs, "HAll": forward["HAll"], "grad_Ht": np.ones((1, N, H))}, attributes, outputs=["dW"]
    )
    expected_dw = rnn_grad({**inputs, "HAll": forward["HAll"], "grad_Ht": np.ones((1, N, H))}, **attributes)["dW"]
    np.testing.assert_allclose(grads["dW"], expected_dw, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("steps", "batch"), [(0, N), (T, 0)])
def test_empty_sequence_or_batch(steps: int, batch: int) -> None:
    attributes = {"hidden_size": H, "direction": "bidirectional"}
    rng = np.random.default_rng(6)
    inputs = {
        "X": rng.standard_normal((steps, batch, I)),
        "W": rng.standard_normal((2, H, I)),
        "R": rng.standard_normal((2, H, H)),
        "initial_h": rng.standard_normal((2, batch, H)),
    }
    forward = op_runner.run("RNNTraining", inputs, attributes)
    assert forward["HAll"].shape == (steps, 2, batch, H)
    np.testing.assert_array_equal(forward["Ht"], np.zeros((2, batch, H)))
    grads = op_runner.run(
        "RNNGrad", {**inputs, "HAll": forward["HAll"], "grad_Ht": np.ones((2, batch, H))}, attributes
    )
    for name in ("dW", "dR", "dB", "dH0"):
        np.testing.assert_array_equal(grads[name], np.zeros_like(grads[name]), err_msg=name)
    assert grads["dX"].shape == (steps, batch, I)


def _error(op_type: str, inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object]) -> str:
    with pytest.raises(Exception) as caught:
        op_runner.run(op_type, inputs, attributes)
    return str(caught.value)


def test_hostile_inputs_are_refused_with_the_input_named() -> None:
    inputs = _inputs("forward", seed=8)
    attributes = {"hidden_size": H}
    message = _error("RNNTraining", {**inputs, "W": np.zeros((1, 3 * H, I))}, attributes)
    assert "W: expected [num_directions(direction=forward)=1, hidden_size=4, input_size=5], got [1, 12, 5]" in message
    message = _error("RNNTraining", {**inputs, "B": np.zeros((1, 6 * H))}, attributes)
    assert "B: expected [num_directions=1, 2*hidden_size=8], got [1, 24]" in message
    message = _error("RNNTraining", {**inputs, "sequence_lens": np.array([5, 1, 1], np.int32)}, attributes)
    assert "sequence_lens: every value must be in [0, seq_length=4], got 5 at index 0" in message
    message = _error("RNNTraining", {**inputs, "X": np.zeros((T, N))}, attributes)
    assert "X: expected rank 3 [seq_length, batch_size, input_size] (layout=0), got rank 2 [4, 3]" in message
    forward = op_runner.run("RNNTraining", inputs, attributes)
    message = _error("RNNGrad", {**inputs, "HAll": forward["Ht"]}, attributes)
    assert "HAll: expected [seq_length=4, num_directions=1, batch_size=3, hidden_size=4], got [1, 3, 4]" in message


@pytest.mark.parametrize(
    ("op_type", "attributes", "expected"),
    [
        (
            "RNNTraining",
            {"hidden_size": H, "activations": ["Tanh", "Tanh"]},
            # "activations" or, on onnxruntime < 1.25, the "activations_csv" the kernel reads there
            "expected 1*num_directions=1 names (f per direction, direction=forward), got 2 [Tanh, Tanh]",
        ),
        ("RNNTraining", {"hidden_size": H, "input_forget": 1}, "attribute input_forget: the RNN has none"),
        ("RNNTraining", {"hidden_size": 0}, "attribute hidden_size: expected an integer in [1, 268435455], got 0"),
        ("RNNTraining", {"hidden_size": H, "direction": "sideways"}, "attribute direction: expected"),
        (
            "RNNGrad",
            {"hidden_size": H, "activations": ["LeakyRelu"], "activation_alpha": [-0.5]},
            "LeakyRelu with alpha=-0.500000 maps negative and positive inputs onto the same outputs, so RNNGrad "
            "cannot recover its derivative from HAll; use alpha >= 0",
        ),
    ],
)
def test_bad_attributes_are_refused_when_the_session_is_created(op_type: str, attributes: dict, expected: str) -> None:
    inputs = _inputs("forward", seed=9)
    if op_type == "RNNGrad":
        inputs = {**inputs, "HAll": np.zeros((T, 1, N, H))}
    assert expected in _error(op_type, inputs, attributes)


def test_dims_past_the_blas_limit_are_refused_before_any_work() -> None:
    inputs = {**_inputs("forward", seed=12, lens=False, h0=False), "X": np.zeros((2**40, 0, I))}
    message = _error("RNNTraining", inputs, {"hidden_size": H})
    assert (
        "X: seq_length*batch_size=0, seq_length*1*hidden_size=4398046511104, batch_size=0, input_size=5: each must be "
        "at most 2147483647, the largest dimension BLAS accepts"
    ) in message


# Shapes whose time loop the kernels cut into tasks at 2 threads (SplitTimeLoop, lstm/lstm_math.h):
# one step wide enough for blocks of hidden units, enough entries with a small R for groups of
# entries (forward and backward), and enough steps for the backward's windows of gate gradients
# (512 rows each, recurrent/backward_driver.h: 32 steps of 16 entries, then 8).
SPLIT_SHAPES = {
    "unit-blocks": (3, 2, 8, 512),
    "entry-groups": (3, 16, 8, 32),
    "windows": (40, 16, 8, 32),
    "small-entry-groups": (12, 8, 8, 32),  # below 2 x 8 entries, a small step takes groups of 4
}


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("shape", list(SPLIT_SHAPES))
def test_time_loop_cut_into_tasks_equals_the_reference(shape: str, direction: str) -> None:
    """RNNTraining and RNNGrad at 2 threads (the directions in parallel) equal the NumPy reference (float64)."""
    steps, batch, inputs, hidden = SPLIT_SHAPES[shape]
    d = schema.num_directions(direction)
    rng = np.random.default_rng(13)
    feeds = {
        "X": rng.standard_normal((steps, batch, inputs)),
        "W": rng.standard_normal((d, hidden, inputs)) * 0.3,
        "R": rng.standard_normal((d, hidden, hidden)) / np.sqrt(hidden),
        "B": rng.standard_normal((d, 2 * hidden)) * 0.3,
        "sequence_lens": np.array([steps, 1] + [steps - 1] * (batch - 2), np.int32),
        "initial_h": rng.standard_normal((d, batch, hidden)),
    }
    attributes = {"hidden_size": hidden, "direction": direction}
    expected = rnn_training(feeds, **attributes)
    forward = op_runner.run("RNNTraining", feeds, attributes, threads=2)
    for name in ("HAll", "Ht"):
        np.testing.assert_allclose(forward[name], expected[name], rtol=0, atol=FLOAT64_ATOL, err_msg=name)
    grad_feeds = {
        **feeds,
        "HAll": forward["HAll"],
        "grad_HAll": rng.standard_normal(forward["HAll"].shape),
        "grad_Ht": rng.standard_normal(forward["Ht"].shape),
    }
    expected_grads = rnn_grad(grad_feeds, **attributes)
    grads = op_runner.run("RNNGrad", grad_feeds, attributes, threads=2)
    for name in GRAD_OF:
        value = expected_grads[name]
        np.testing.assert_allclose(grads[name], value, rtol=0, atol=FLOAT64_ATOL * np.abs(value).max(), err_msg=name)
