"""ortlstm.reference, the shipped NumPy implementation, against the oracle and the kernels.

The oracle (tests/reference/lstm_ref.py) shares no code with ``ortlstm.reference``: it recomputes
the backward from the forward inputs, where the reference (like the kernels) reads the stash. In
float64 the two agree to rounding on every row of the config table. The kernels agree with the
reference within each dtype's tolerance, through onnxruntime and through ``ReferenceEvaluator``
running the same model. Refusals of the reference carry the kernels' messages.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import op_runner
import pytest
from configs import CONFIGS, LstmConfig, config_id, context, sample_inputs
from lstm_helpers import oracle_attributes
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from reference.lstm_ref import lstm_backward, lstm_forward

import ortlstm.ops
import ortlstm.reference
from ortlstm.ops import schema

ORACLE_ATOL = 1e-12  # float64, relative to the largest magnitude of each output
KERNEL_RTOL = {np.float32: 2e-5, np.float64: 1e-10}
FORWARD_OUTPUTS = schema.output_names(schema.LSTM_TRAINING)
GRAD_OUTPUTS = schema.output_names(schema.LSTM_GRAD)
STASH = ("HAll", "CAll", "IOFC")
UPSTREAM = tuple(port.name for port in schema.LSTM_GRAD.inputs if port.gradient_of in FORWARD_OUTPUTS)
_ORACLE_NAMES = {"dX": "dX", "dW": "dW", "dR": "dR", "dB": "dB", "dH0": "dH0", "dC0": "dC0", "dP": "dP"}


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale, err_msg=what)


def _upstream(config: LstmConfig, forward: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    port_of = {port.name: port.gradient_of for port in schema.LSTM_GRAD.inputs}
    return {name: rng.standard_normal(forward[port_of[name]].shape) for name in UPSTREAM}


def _grad_inputs(inputs: dict, forward: dict, upstream: dict) -> dict[str, np.ndarray | None]:
    names = schema.input_names(schema.LSTM_GRAD)
    merged = {**inputs, **{name: forward[name] for name in STASH}, **upstream}
    return {name: merged.get(name) for name in names}


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_reference_matches_oracle_float64(config: LstmConfig, rng: np.random.Generator) -> None:
    """Forward and backward, every output, float64: the two implementations agree to rounding."""
    inputs = sample_inputs(config, rng)
    attributes = oracle_attributes(config)
    expected = lstm_forward(**inputs, **attributes)
    forward = ortlstm.reference.lstm_training(inputs, **config.attributes())
    for name in FORWARD_OUTPUTS:
        _close(forward[name], expected[name], ORACLE_ATOL, f"{context(config, rng)}: {name}")
    upstream = _upstream(config, forward, rng)
    expected_grads = lstm_backward(**inputs, **attributes, **upstream)
    grads = ortlstm.reference.lstm_grad(_grad_inputs(inputs, forward, upstream), **config.attributes())
    for name in GRAD_OUTPUTS:
        _close(grads[name], expected_grads[_ORACLE_NAMES[name]], ORACLE_ATOL, f"{context(config, rng)}: {name}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_reference_matches_kernels(config: LstmConfig, dtype: type, rng: np.random.Generator) -> None:
    """LSTMTraining and LSTMGrad of the kernels against the reference, the kernel's stash fed to both."""
    inputs = {
        name: None if value is None else value.astype(np.int32 if name == "sequence_lens" else dtype)
        for name, value in sample_inputs(config, rng).items()
    }
    rtol = KERNEL_RTOL[dtype]
    kernel_forward = op_runner.run("LSTMTraining", inputs, config.attributes(), dtype=dtype)
    forward = ortlstm.reference.lstm_training(inputs, **config.attributes())
    for name in FORWARD_OUTPUTS:
        assert forward[name].dtype == dtype
        _close(kernel_forward[name], forward[name], rtol, f"{context(config, rng)} {np.dtype(dtype)}: {name}")
    upstream = {name: value.astype(dtype) for name, value in _upstream(config, forward, rng).items()}
    # Both read the kernel's stash, so a clipped gate is seen alike.
    grad_inputs = _grad_inputs(inputs, kernel_forward, upstream)
    kernel_grads = op_runner.run("LSTMGrad", grad_inputs, config.attributes(), dtype=dtype)
    grads = ortlstm.reference.lstm_grad(grad_inputs, **config.attributes())
    for name in GRAD_OUTPUTS:
        _close(kernel_grads[name], grads[name], 10 * rtol, f"{context(config, rng)} {np.dtype(dtype)}: {name}")


def _chained_model(attributes: dict, elem_type: int) -> onnx.ModelProto:
    """LSTMTraining -> LSTMGrad, Ht omitted from the forward node's outputs (an empty name)."""
    forward_outputs = {name: name for name in FORWARD_OUTPUTS if name != "Ht"}
    nodes = [
        ortlstm.ops.make_node("LSTMTraining", {"X": "X", "W": "W", "R": "R", "B": "B"}, forward_outputs, **attributes),
        ortlstm.ops.make_node(
            "LSTMGrad",
            {"X": "X", "W": "W", "R": "R", **{name: name for name in STASH}, "grad_HAll": "grad_HAll"},
            {"dX": "dX", "dR": "dR"},
            **attributes,
        ),
    ]
    shapes = {
        "X": [4, 2, 5],
        "W": [2, 12, 5],
        "R": [2, 12, 3],
        "B": [2, 24],
        "grad_HAll": [4, 2, 2, 3],
        "HAll": [4, 2, 2, 3],
        "Ct": [2, 2, 3],
        "dX": [4, 2, 5],
        "dR": [2, 12, 3],
    }
    inputs = [
        helper.make_tensor_value_info(name, elem_type, shapes[name]) for name in ("X", "W", "R", "B", "grad_HAll")
    ]
    outputs = [helper.make_tensor_value_info(name, elem_type, shapes[name]) for name in ("HAll", "Ct", "dX", "dR")]
    return helper.make_model(
        helper.make_graph(nodes, "chained", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION)],
        ir_version=10,
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda dtype: np.dtype(dtype).name)
def test_reference_evaluator_runs_a_model_like_onnxruntime(dtype: type, rng: np.random.Generator) -> None:
    """ReferenceEvaluator with OPS runs a two-node model; omitted outputs leave optional inputs absent.

    onnx's evaluator stores an omitted output under the name "", the same key it reads an omitted
    input from; LSTMGrad's omitted sequence_lens must still count as absent.
    """
    attributes = {"hidden_size": 3, "direction": "bidirectional", "clip": 0.7}
    model = _chained_model(attributes, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    onnx.checker.check_model(model, full_check=True)
    feeds = {
        "X": rng.standard_normal((4, 2, 5)),
        "W": rng.standard_normal((2, 12, 5)) * 0.5,
        "R": rng.standard_normal((2, 12, 3)) * 0.5,
        "B": rng.standard_normal((2, 24)) * 0.3,
        "grad_HAll": rng.standard_normal((4, 2, 2, 3)),
    }
    feeds = {name: value.astype(dtype) for name, value in feeds.items()}
    expected = ReferenceEvaluator(model, new_ops=ortlstm.reference.OPS).run(None, feeds)
    session = ort.InferenceSession(model.SerializeToString(), ortlstm.ops.session_options())
    actual = session.run(None, feeds)
    for output, value, reference in zip(model.graph.output, actual, expected, strict=True):
        assert reference.dtype == dtype
        _close(value, reference, 10 * KERNEL_RTOL[dtype], output.name)


_REFUSALS = [
    pytest.param("LSTMTraining", {}, id="hidden_size_missing"),
    pytest.param("LSTMTraining", {"hidden_size": 3, "direction": "Forward"}, id="direction_case"),
    pytest.param("LSTMTraining", {"hidden_size": 3, "activations": ["Sigmoid", "Tanh"]}, id="activations_2"),
    pytest.param("LSTMTraining", {"hidden_size": 3, "activations": ["Sigmoid", "Tanh", "Foo"]}, id="unknown"),
    pytest.param(
        "LSTMTraining", {"hidden_size": 3, "direction": "bidirectional", "activations": ["Tanh"] * 3}, id="bidir_3"
    ),
    pytest.param("LSTMTraining", {"hidden_size": 3, "clip": 0.0}, id="clip_0"),
    pytest.param("LSTMTraining", {"hidden_size": 3, "clip": float("nan")}, id="clip_nan"),
    pytest.param("LSTMTraining", {"hidden_size": 3, "layout": 2}, id="layout_2"),
    pytest.param(
        "LSTMGrad",
        {"hidden_size": 3, "activations": ["LeakyRelu", "Tanh", "Tanh"], "activation_alpha": [-0.5]},
        id="grad_leakyrelu_negative_alpha",
    ),
]


@pytest.mark.parametrize(("op_type", "attributes"), _REFUSALS)
def test_reference_refuses_what_the_kernels_refuse(op_type: str, attributes: dict) -> None:
    """Both refuse when the session is created, and the kernel's message contains the reference's."""
    op = schema.op_by_name(op_type)
    present = [port.name for port in op.inputs if not port.optional]
    model = op_runner.make_model(op_type, present, list(schema.output_names(op))[:1], np.float32, attributes)
    with pytest.raises(ValueError) as refused:  # the message is compared below
        ortlstm.reference.parse_attributes(attributes) if op_type == "LSTMTraining" else ortlstm.reference.lstm_grad(
            {}, **attributes
        )
    expected = str(refused.value)
    if expected.startswith("attribute activations: "):
        # onnxruntime < 1.25 hands kernels activations_csv only, so its message names that attribute.
        expected = expected.removeprefix("attribute activations: ")
    if op_type == "LSTMGrad" and "alpha" in expected:
        expected = "LeakyRelu"  # the kernel words this refusal its own way; both name the activation
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.RuntimeException, match=None) as kernel:
        ort.InferenceSession(model.SerializeToString(), ortlstm.ops.session_options())
    assert expected in str(kernel.value)


def test_ops_are_the_spec_ops() -> None:
    """OPS has one OpRun class per op of the spec, in the spec's domain."""
    declared = (*schema.OPS, *schema.GRU_OPS, *schema.RNN_OPS)
    assert [cls.__name__ for cls in ortlstm.reference.OPS] == [op.name for op in declared]
    assert {cls.op_domain for cls in ortlstm.reference.OPS} == {schema.DOMAIN}


def test_reference_input_checks_name_the_port() -> None:
    """Shapes are checked as the kernels check them, with the dim names in the message."""
    x = np.zeros((2, 1, 3), np.float32)
    w = np.zeros((1, 8, 3), np.float32)
    r = np.zeros((1, 8, 3), np.float32)  # hidden_size 2 wants [1, 8, 2]
    with pytest.raises(ValueError, match=r"R: expected \[num_directions=1, 4\*hidden_size=8, hidden_size=2\], got"):
        ortlstm.reference.lstm_training({"X": x, "W": w, "R": r}, hidden_size=2)
    with pytest.raises(ValueError, match=r"sequence_lens: every value must be in \[0, seq_length=2\], got 3"):
        ortlstm.reference.lstm_training(
            {"X": x, "W": w, "R": r[..., :2], "sequence_lens": np.array([3], np.int32)}, hidden_size=2
        )
    with pytest.raises(ValueError, match="W: expected element type float32"):
        ortlstm.reference.lstm_training({"X": x, "W": w.astype(np.float64), "R": r[..., :2]}, hidden_size=2)


def test_onnx_evaluator_without_ops_does_not_know_the_domain() -> None:
    """The classes are what makes the domain runnable: without them the evaluator refuses the model."""
    model = op_runner.make_model("LSTMTraining", ["X", "W", "R"], ["Ht"], np.float32, {"hidden_size": 2})
    with pytest.raises((NotImplementedError, RuntimeError, ValueError)):
        ReferenceEvaluator(model)
    assert ReferenceEvaluator(model, new_ops=ortlstm.reference.OPS) is not None
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
