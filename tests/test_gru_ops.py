"""GRUTraining and GRUGrad against independent oracles.

- onnxruntime's own ONNX ``GRU`` kernel (float32 only in onnxruntime): HAll and Ht of every
  configuration it runs, within float32 rounding.
- ``ortlstm.reference_gru``: a NumPy float64 forward written from the equations, for every
  configuration (float64, layout 1, all activations, clip) and the ZRH stash.
- Central finite differences of the float64 GRUTraining for every GRUGrad output.
- onnxruntime-training's ``com.microsoft`` GRUTraining / GRUGrad (the drop-in contract), where the
  installed onnxruntime registers them (the train env).
- Hostile inputs: a clear message naming the input or attribute, never a crash.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Mapping

import numpy as np
import onnxruntime as ort
import op_runner
import pytest
from onnx import TensorProto, helper

import ortlstm.ops
from ortlstm.ops import schema
from ortlstm.reference_gru import gru_grad, gru_training

T, N, I, H = 4, 3, 5, 4  # noqa: E741 - the op's dimension names
SEQUENCE_LENS = np.array([4, 2, 0], np.int32)  # full, partial, empty
FLOAT32_ATOL = 2e-6  # |ortlstm float32 - onnxruntime GRU float32|, values of order 1
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
        "W": rng.standard_normal((d, 3 * H, I)) * 0.5,
        "R": rng.standard_normal((d, 3 * H, H)) * 0.5,
        "B": rng.standard_normal((d, 6 * H)) * 0.5,
        "sequence_lens": SEQUENCE_LENS if lens else None,
        "initial_h": initial_h if h0 else None,
    }


BASIC = [
    {"linear_before_reset": lbr, "direction": direction}
    for lbr, direction in itertools.product((0, 1), ("forward", "reverse", "bidirectional"))
]
ACTIVATION_CONFIGS = [
    {"activations": ["HardSigmoid", "LeakyRelu"], "activation_alpha": [0.3, 0.1], "activation_beta": [0.4]},
    {"activations": ["Sigmoid", "Softsign"], "clip": 0.7},
    {"activations": ["Sigmoid", "ScaledTanh"], "activation_alpha": [1.5], "activation_beta": [0.8]},
    {"activations": ["Softplus", "Elu"], "activation_alpha": [0.9]},
    {"activations": ["Affine", "Tanh"], "activation_alpha": [0.4], "activation_beta": [0.2]},
    {"activations": ["Sigmoid", "Relu"], "clip": 1.5},
]
EVERY = [
    *BASIC,
    *({**c, "linear_before_reset": lbr} for c, lbr in itertools.product(ACTIVATION_CONFIGS, (0, 1))),
    {"linear_before_reset": 1, "direction": "bidirectional", "layout": 1},
    {"linear_before_reset": 0, "direction": "reverse", "layout": 1},
]


def _attributes(config: Mapping[str, object]) -> dict[str, object]:
    attributes = {"hidden_size": H, **config}
    if "activations" in config and config.get("direction") == "bidirectional":
        attributes["activations"] = list(config["activations"]) * 2  # type: ignore[call-overload]
    return attributes


def _id(config: Mapping[str, object]) -> str:
    return "-".join(f"{k}={v}" for k, v in config.items())


_ELEM = {False: TensorProto.FLOAT, True: TensorProto.INT32}  # by "is it sequence_lens"


def _onnx_gru(inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object]) -> list[np.ndarray]:
    """onnxruntime's ONNX GRU (opset 14), float32."""
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h"]
    present = [name if inputs.get(name) is not None else "" for name in names]
    node = helper.make_node("GRU", present, ["Y", "Y_h"], **attributes)
    graph = helper.make_graph(
        [node],
        "gru",
        [
            helper.make_tensor_value_info(name, _ELEM[name == "sequence_lens"], None)
            for name in present
            if name
        ],
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
def test_forward_equals_onnxruntime_gru(config: dict) -> None:
    attributes = _attributes(config)
    inputs = _inputs(str(config.get("direction", "forward")), seed=1)
    y, y_h = _onnx_gru(inputs, attributes)
    out = op_runner.run("GRUTraining", inputs, attributes, dtype=np.float32)
    np.testing.assert_allclose(out["HAll"], y, rtol=0, atol=FLOAT32_ATOL)
    np.testing.assert_allclose(out["Ht"], y_h, rtol=0, atol=FLOAT32_ATOL)


@pytest.mark.parametrize("config", EVERY, ids=_id)
def test_forward_equals_numpy_reference(config: dict) -> None:
    attributes = _attributes(config)
    layout = int(config.get("layout", 0))
    inputs = _inputs(str(config.get("direction", "forward")), seed=2, layout=layout)
    expected = gru_training(inputs, **attributes)
    out = op_runner.run("GRUTraining", inputs, attributes, dtype=np.float64)
    for name in ("HAll", "Ht", "ZRH"):
        np.testing.assert_allclose(out[name], expected[name], rtol=0, atol=FLOAT64_ATOL, err_msg=name)


def _loss_weights(attributes: Mapping[str, object], inputs: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    shapes = {name: value.shape for name, value in gru_training(inputs, **attributes).items()}
    rng = np.random.default_rng(7)
    return {"HAll": rng.standard_normal(shapes["HAll"]), "Ht": rng.standard_normal(shapes["Ht"])}


def _loss(inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object], weights: dict) -> float:
    out = op_runner.run("GRUTraining", inputs, attributes, dtype=np.float64, outputs=["HAll", "Ht"])
    return float(np.sum(out["HAll"] * weights["HAll"]) + np.sum(out["Ht"] * weights["Ht"]))


def _gradients(inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object], weights: dict, dtype) -> dict:
    forward = op_runner.run("GRUTraining", inputs, attributes, dtype=dtype)
    grad_inputs = {
        **inputs,
        "HAll": forward["HAll"],
        "ZRH": forward["ZRH"],
        "grad_HAll": weights["HAll"],
        "grad_Ht": weights["Ht"],
    }
    return op_runner.run("GRUGrad", grad_inputs, attributes, dtype=dtype)


GRAD_OF = {"dX": "X", "dW": "W", "dR": "R", "dB": "B", "dH0": "initial_h"}
GRAD_CONFIGS = [
    *BASIC,
    {"linear_before_reset": 1, "direction": "bidirectional", "layout": 1},
    {"linear_before_reset": 0, "layout": 1},
    *({**c, "linear_before_reset": lbr} for c, lbr in itertools.product(ACTIVATION_CONFIGS[:3], (0, 1))),
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
    attributes = {"hidden_size": H, "linear_before_reset": 1}
    inputs = {**_inputs("forward", seed=5, lens=False, h0=False), "B": None}
    expected = gru_training(inputs, **attributes)
    only_ht = op_runner.run("GRUTraining", inputs, attributes, outputs=["Ht"])
    np.testing.assert_allclose(only_ht["Ht"], expected["Ht"], rtol=0, atol=FLOAT64_ATOL)
    forward = op_runner.run("GRUTraining", inputs, attributes)
    grads = op_runner.run(
        "GRUGrad",
        {**inputs, "HAll": forward["HAll"], "ZRH": forward["ZRH"], "grad_Ht": np.ones((1, N, H))},
        attributes,
        outputs=["dW"],
    )
    assert grads["dW"].shape == (1, 3 * H, I) and np.all(np.isfinite(grads["dW"]))


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gradients_without_bias_or_grad_hall_equal_the_reference(linear_before_reset: int) -> None:
    """GRUGrad with B and grad_HAll omitted (the backward step reads a row of zeros for them) equals NumPy."""
    attributes = {"hidden_size": H, "linear_before_reset": linear_before_reset, "direction": "bidirectional"}
    inputs = {**_inputs("bidirectional", seed=17), "B": None}
    forward = op_runner.run("GRUTraining", inputs, attributes)
    grad_ht = np.random.default_rng(18).standard_normal(forward["Ht"].shape)
    grad_inputs = {**inputs, "HAll": forward["HAll"], "ZRH": forward["ZRH"], "grad_Ht": grad_ht}
    grads = op_runner.run("GRUGrad", grad_inputs, attributes)
    expected = gru_grad(grad_inputs, **attributes)
    for name in ("dX", "dW", "dR", "dH0"):
        value = expected[name]
        np.testing.assert_allclose(grads[name], value, rtol=0, atol=FLOAT64_ATOL * np.abs(value).max(), err_msg=name)


@pytest.mark.parametrize(("steps", "batch"), [(0, N), (T, 0)])
def test_empty_sequence_or_batch(steps: int, batch: int) -> None:
    attributes = {"hidden_size": H, "direction": "bidirectional", "linear_before_reset": 1}
    rng = np.random.default_rng(6)
    inputs = {
        "X": rng.standard_normal((steps, batch, I)),
        "W": rng.standard_normal((2, 3 * H, I)),
        "R": rng.standard_normal((2, 3 * H, H)),
        "initial_h": rng.standard_normal((2, batch, H)),
    }
    forward = op_runner.run("GRUTraining", inputs, attributes)
    assert forward["HAll"].shape == (steps, 2, batch, H)
    np.testing.assert_array_equal(forward["Ht"], np.zeros((2, batch, H)))
    grads = op_runner.run(
        "GRUGrad",
        {**inputs, "HAll": forward["HAll"], "ZRH": forward["ZRH"], "grad_Ht": np.ones((2, batch, H))},
        attributes,
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
    message = _error("GRUTraining", {**inputs, "W": np.zeros((1, 4 * H, I))}, attributes)
    expected = "W: expected [num_directions(direction=forward)=1, 3*hidden_size=12, input_size=5], got [1, 16, 5]"
    assert expected in message
    message = _error("GRUTraining", {**inputs, "B": np.zeros((1, 8 * H))}, attributes)
    assert "B: expected [num_directions=1, 6*hidden_size=24], got [1, 32]" in message
    message = _error("GRUTraining", {**inputs, "sequence_lens": np.array([5, 1, 1], np.int32)}, attributes)
    assert "sequence_lens: every value must be in [0, seq_length=4], got 5 at index 0" in message
    message = _error("GRUTraining", {**inputs, "X": np.zeros((T, N))}, attributes)
    assert "X: expected rank 3 [seq_length, batch_size, input_size] (layout=0), got rank 2 [4, 3]" in message
    forward = op_runner.run("GRUTraining", inputs, attributes)
    message = _error("GRUGrad", {**inputs, "HAll": forward["HAll"], "ZRH": forward["HAll"]}, attributes)
    assert "ZRH: expected [seq_length=4, num_directions=1, batch_size=3, 3*hidden_size=12], got [4, 1, 3, 4]" in message


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"hidden_size": H, "linear_before_reset": 2}, "attribute linear_before_reset: expected 0 or 1, got 2"),
        (
            {"hidden_size": H, "activations": ["Sigmoid", "Tanh", "Tanh"]},
            # "activations" or, on onnxruntime < 1.25, the "activations_csv" the kernel reads there
            "expected 2*num_directions=2 names (f, g per direction, direction=forward), got 3 [Sigmoid, Tanh, Tanh]",
        ),
        ({"hidden_size": H, "input_forget": 1}, "attribute input_forget: the GRU has none"),
        ({"hidden_size": 0}, "attribute hidden_size: expected an integer in [1, 268435455], got 0"),
    ],
)
def test_bad_attributes_are_refused_when_the_session_is_created(attributes: dict, expected: str) -> None:
    message = _error("GRUTraining", _inputs("forward", seed=9), attributes)
    assert expected in message


# ---------------------------------------------------------------------------------------------
# com.microsoft GRUTraining / GRUGrad (onnxruntime-training): the same ports, the same numbers.

IS_TRAINING_BUILD = importlib.util.find_spec("onnxruntime.training") is not None
needs_com_microsoft = pytest.mark.skipif(
    not IS_TRAINING_BUILD, reason=f"needs onnxruntime-training: onnxruntime {ort.__version__} has no com.microsoft GRU"
)


def _com_microsoft(op_type: str, feeds: Mapping[str, np.ndarray | None], outputs: list[str], attributes: dict) -> dict:
    """One com.microsoft node whose inputs are the ortlstm op's, in the ortlstm op's order (the drop-in claim)."""
    names = [name if feeds.get(name) is not None else "" for name in schema.input_names(schema.op_by_name(op_type))]
    node = helper.make_node(op_type, names, outputs, domain="com.microsoft", **attributes)
    graph = helper.make_graph(
        [node],
        op_type,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in names if name],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=op_runner.IR_VERSION,
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values = session.run(outputs, {name: np.asarray(feeds[name], np.float32) for name in names if name})
    return dict(zip(outputs, values, strict=True))


@needs_com_microsoft
@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_equals_com_microsoft(linear_before_reset: int) -> None:
    """What com.microsoft accepts: forward, Sigmoid/Tanh, no clip, no sequence_lens, layout 0, float32."""
    attributes = {"hidden_size": H, "linear_before_reset": linear_before_reset}
    inputs = _inputs("forward", seed=10, lens=False)
    forward_ports = list(schema.output_names(schema.GRU_TRAINING))
    expected = _com_microsoft("GRUTraining", inputs, forward_ports, attributes)
    actual = op_runner.run("GRUTraining", inputs, attributes, dtype=np.float32)
    for name in forward_ports:
        np.testing.assert_allclose(actual[name], expected[name], rtol=0, atol=FLOAT32_ATOL, err_msg=name)
    rng = np.random.default_rng(11)
    upstream = {"grad_HAll": rng.standard_normal(expected["HAll"].shape), "grad_Ht": rng.standard_normal((1, N, H))}
    grad_ports = list(schema.output_names(schema.GRU_GRAD))
    expected_grads = _com_microsoft("GRUGrad", {**inputs, **expected, **upstream}, grad_ports, attributes)
    actual_grads = op_runner.run("GRUGrad", {**inputs, **actual, **upstream}, attributes, dtype=np.float32)
    for name in grad_ports:
        scale = np.abs(expected_grads[name]).max()
        np.testing.assert_allclose(actual_grads[name], expected_grads[name], rtol=0, atol=2e-6 * scale, err_msg=name)


def test_dims_past_the_blas_limit_are_refused_before_any_work() -> None:
    inputs = {**_inputs("forward", seed=12, lens=False, h0=False), "X": np.zeros((2**40, 0, I))}
    message = _error("GRUTraining", inputs, {"hidden_size": H})
    assert (
        "X: seq_length*batch_size=0, seq_length*3*hidden_size=13194139533312, batch_size=0, input_size=5: each must be "
        "at most 2147483647, the largest dimension BLAS accepts"
    ) in message


# Shapes whose time loop the kernels cut into tasks at 2 threads (SplitTimeLoop, lstm/lstm_math.h):
# one step wide enough for blocks of hidden units (each a task, two recurrent stages per step with
# linear_before_reset=0; the backward's blocks with linear_before_reset=1 only), enough entries
# with a small R for groups of entries, and as many rows as the LSTM's and RNN's backward cut
# into two windows of gate gradients (the GRU's keeps one: gru_backward.cc); one entry through many
# steps cut into blocks, whose hand-offs run inside one round of tasks (ForPhases, common/parallel.h).
SPLIT_SHAPES = {
    "unit-blocks": (3, 2, 8, 256),
    "entry-groups": (3, 16, 8, 32),
    "windows": (40, 16, 8, 32),
    "one-entry-blocks": (48, 1, 8, 128),
    "small-entry-groups": (12, 8, 8, 32),  # below 2 x 8 entries, a small step takes groups of 4
}


def _run_threads(
    op_type: str, feeds: dict, attributes: dict, threads: int, spinning: bool = True
) -> dict[str, np.ndarray]:
    op = schema.op_by_name(op_type)
    outputs = list(schema.output_names(op))
    model = op_runner.make_model(op_type, list(feeds), outputs, np.float64, attributes)
    options = ortlstm.ops.session_options(intra_op_num_threads=threads)
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(outputs, session.run(outputs, feeds), strict=True))


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("shape", list(SPLIT_SHAPES))
def test_time_loop_cut_into_tasks_equals_the_reference(shape: str, linear_before_reset: int, direction: str) -> None:
    """GRUTraining and GRUGrad at 2 threads equal the NumPy reference (float64)."""
    steps, batch, inputs, hidden = SPLIT_SHAPES[shape]
    d = schema.num_directions(direction)
    rng = np.random.default_rng(13)
    feeds = {
        "X": rng.standard_normal((steps, batch, inputs)),
        "W": rng.standard_normal((d, 3 * hidden, inputs)) * 0.3,
        "R": rng.standard_normal((d, 3 * hidden, hidden)) / np.sqrt(hidden),
        "B": rng.standard_normal((d, 6 * hidden)) * 0.3,
        "sequence_lens": np.array(([steps, 1] + [steps - 1] * (batch - 2))[:batch], np.int32),
        "initial_h": rng.standard_normal((d, batch, hidden)),
    }
    attributes = {"hidden_size": hidden, "linear_before_reset": linear_before_reset, "direction": direction}
    expected = gru_training(feeds, **attributes)
    forward = _run_threads("GRUTraining", feeds, attributes, threads=2)
    for name in ("HAll", "Ht", "ZRH"):
        np.testing.assert_allclose(forward[name], expected[name], rtol=0, atol=FLOAT64_ATOL, err_msg=name)
    grad_feeds = {
        **feeds,
        "HAll": forward["HAll"],
        "ZRH": forward["ZRH"],
        "grad_HAll": rng.standard_normal(forward["HAll"].shape),
        "grad_Ht": rng.standard_normal(forward["Ht"].shape),
    }
    split = _run_threads("GRUGrad", grad_feeds, attributes, threads=2)
    expected_grads = gru_grad(grad_feeds, **attributes)
    for name in GRAD_OF:
        value = expected_grads[name]
        np.testing.assert_allclose(split[name], value, rtol=0, atol=FLOAT64_ATOL * np.abs(value).max(), err_msg=name)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_blocks_whose_workers_start_late_or_share_cores_give_the_same_results(linear_before_reset: int) -> None:
    """Late or crowded workers in a time loop cut into blocks change no result.

    One entry through many steps, a phase of tasks per step (ForPhases in common/parallel.h),
    with workers woken late each round (no spinning: the first worker runs the others' items
    until they arrive) and with more workers than cores (4 threads: descheduled mid-loop):
    bitwise the results of 2 spinning threads, which split the loop the same way, and at 4
    threads (3 blocks) the float64 reference.
    """
    steps, batch, inputs, hidden = SPLIT_SHAPES["one-entry-blocks"]
    rng = np.random.default_rng(17)
    feeds = {
        "X": rng.standard_normal((steps, batch, inputs)),
        "W": rng.standard_normal((1, 3 * hidden, inputs)) * 0.3,
        "R": rng.standard_normal((1, 3 * hidden, hidden)) / np.sqrt(hidden),
        "B": rng.standard_normal((1, 6 * hidden)) * 0.3,
        "initial_h": rng.standard_normal((1, batch, hidden)),
    }
    attributes = {"hidden_size": hidden, "linear_before_reset": linear_before_reset}
    spinning = _run_threads("GRUTraining", feeds, attributes, threads=2)
    grad_feeds = {
        **feeds,
        "HAll": spinning["HAll"],
        "ZRH": spinning["ZRH"],
        "grad_HAll": rng.standard_normal(spinning["HAll"].shape),
        "grad_Ht": rng.standard_normal(spinning["Ht"].shape),
    }
    spinning.update(_run_threads("GRUGrad", grad_feeds, attributes, threads=2))
    expected = {**gru_training(feeds, **attributes), **gru_grad(grad_feeds, **attributes)}
    for _ in range(3):  # late workers differ from call to call
        woken = {
            **_run_threads("GRUTraining", feeds, attributes, threads=2, spinning=False),
            **_run_threads("GRUGrad", grad_feeds, attributes, threads=2, spinning=False),
        }
        crowded = {
            **_run_threads("GRUTraining", feeds, attributes, threads=4),
            **_run_threads("GRUGrad", grad_feeds, attributes, threads=4),
        }
        for name, value in spinning.items():
            np.testing.assert_array_equal(woken[name], value, err_msg=name)
            reference = expected[name]
            atol = FLOAT64_ATOL * max(np.abs(reference).max(), 1.0)
            np.testing.assert_allclose(crowded[name], reference, rtol=0, atol=atol, err_msg=name)
