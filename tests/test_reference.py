"""Validates the NumPy LSTM oracle before anything is tested against it.

Forward: against onnxruntime's standard ``LSTM`` (float32: ORT's CPU LSTM refuses double) and,
for the configurations it supports, against ``onnx.reference`` in float64. Backward: against
central finite differences of the oracle's own forward, in float64. The last section pins the
onnxruntime behaviour the oracle's docstring documents, so an ORT upgrade that changes it fails.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from configs import CONFIGS, LstmConfig, config_by_id, config_id, context, draw_inputs, sample_inputs
from lstm_helpers import (
    GRADIENT_OF,
    LSTM_INPUT_NAMES,
    OrtLstm,
    assert_close,
    central_difference,
    lstm_model,
    materialised,
    ort_session,
)
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator
from reference.lstm_ref import (
    lstm_backward,
    lstm_forward,
    parse_activations,
)

FLOAT32_RTOL = 1e-5  # ORT float32 vs oracle float64 on the same float32 inputs
FLOAT64_RTOL = 1e-10  # oracle vs onnx.reference, both float64
FINITE_DIFFERENCE_RTOL = 1e-6  # ||analytic - numeric|| / max(||numeric||, floor)
FINITE_DIFFERENCE_FLOOR = 1e-2  # below this gradient norm the bound is absolute


# ---------------------------------------------------------------------------------------------
# (a) Forward


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_forward_matches_onnxruntime(config: LstmConfig, rng: np.random.Generator) -> None:
    inputs = sample_inputs(config, rng)
    expected = lstm_forward(**inputs, **config.attributes())
    actual = OrtLstm(config, inputs).run(inputs)
    for name in ("HAll", "Ht", "Ct"):
        assert_close(actual[name], expected[name], FLOAT32_RTOL, f"{context(config, rng)}: {name}")


def _to_layout0(value: np.ndarray, layout: int) -> np.ndarray:
    """[batch_size, seq_length, num_directions, ...] -> [seq_length, num_directions, batch_size, ...]."""
    return value.transpose(1, 2, 0, 3) if layout == 1 else value


def _truncated(config: LstmConfig, inputs: dict, start: int, stop: int) -> dict:
    """Inputs restricted to steps [start, stop), with sequence_lens cut to match."""
    truncated = dict(inputs)
    time_axis = 0 if config.layout == 0 else 1
    truncated["X"] = np.take(inputs["X"], np.arange(start, stop), axis=time_axis)
    if inputs["sequence_lens"] is not None:
        truncated["sequence_lens"] = np.clip(np.minimum(inputs["sequence_lens"], stop) - start, 0, None)
    return truncated


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_stash_matches_onnxruntime(config: LstmConfig, rng: np.random.Generator) -> None:
    """CAll against ORT's Y_c of truncated sequences; IOFC against the cell and hidden recurrence.

    Direction 0 reaches C_t after running X[:t+1]; the reverse direction reaches it after
    running X[t:] (it starts at the end), so C_t is ORT's Y_c of those truncated inputs.
    """
    inputs = sample_inputs(config, rng)
    expected = lstm_forward(**inputs, **config.attributes())
    lstm = OrtLstm(config, inputs)
    all_cell_states = _to_layout0(expected["CAll"], config.layout)  # [seq, dirs, batch, hidden]
    for t in range(config.seq_length):
        for d in range(config.num_directions):
            reverse = config.direction == "reverse" or d == 1
            start, stop = (t, config.seq_length) if reverse else (0, t + 1)
            Y_c = lstm.run(_truncated(config, inputs, start, stop))["Ct"]
            if config.layout == 1:
                Y_c = Y_c.transpose(1, 0, 2)
            ran = (
                np.ones(config.batch_size, bool) if config.sequence_lens is None else t < np.array(config.sequence_lens)
            )
            ort_cell = np.where(ran[:, None], Y_c[d], 0.0)
            assert_close(ort_cell, all_cell_states[t, d], FLOAT32_RTOL, f"{context(config, rng)}: CAll[t={t}, d={d}]")

    # IOFC must rebuild CAll and HAll through C_t = f ⊙ C_{t-1} + i ⊙ c and H_t = o ⊙ h(C_t).
    hidden_size = config.hidden_size
    gates = _to_layout0(expected["IOFC"], config.layout)
    all_hidden_states = _to_layout0(expected["HAll"], config.layout)
    initial_c = inputs["initial_c"]
    if initial_c is None:
        initial_c = np.zeros((config.num_directions, config.batch_size, hidden_size))
    elif config.layout == 1:
        initial_c = initial_c.transpose(1, 0, 2)
    lens = (
        np.full(config.batch_size, config.seq_length)
        if config.sequence_lens is None
        else np.array(config.sequence_lens)
    )
    activations = parse_activations(
        config.activations, config.activation_alpha, config.activation_beta, config.num_directions
    )
    for d in range(config.num_directions):
        reverse = config.direction == "reverse" or d == 1
        c_prev = initial_c[d]
        for t in reversed(range(config.seq_length)) if reverse else range(config.seq_length):
            ran = (t < lens)[:, None]
            i, o, f, c = (gates[t, d, :, k * hidden_size : (k + 1) * hidden_size] for k in range(4))
            what = f"{context(config, rng)}: IOFC[t={t}, d={d}]"
            assert_close(np.where(ran, f * c_prev + i * c, 0.0), all_cell_states[t, d], 1e-12, what + " vs CAll")
            hidden = o * activations[d][2](all_cell_states[t, d])
            assert_close(np.where(ran, hidden, 0.0), all_hidden_states[t, d], 1e-12, what + " vs HAll")
            assert not np.any(gates[t, d][~ran[:, 0]]), f"{what}: nonzero gates past sequence_lens"
            c_prev = np.where(ran, all_cell_states[t, d], c_prev)


def _supported_by_onnx_reference(config: LstmConfig) -> bool:
    """onnx.reference's LSTM ignores activations, clip, sequence_lens and input_forget."""
    return (
        config.activations is None and config.clip is None and config.sequence_lens is None and not config.input_forget
    )


@pytest.mark.parametrize("config", [c for c in CONFIGS if _supported_by_onnx_reference(c)], ids=config_id)
def test_forward_matches_onnx_reference_in_float64(config: LstmConfig, rng: np.random.Generator) -> None:
    """Float64, and layout 1 natively (ORT rejects both)."""
    inputs = sample_inputs(config, rng)
    expected = lstm_forward(**inputs, **config.attributes())
    present = [name for name in LSTM_INPUT_NAMES if inputs[name] is not None]
    evaluator = ReferenceEvaluator(lstm_model(present, config.attributes(), TensorProto.DOUBLE))
    Y, Y_h, Y_c = evaluator.run(None, {name: inputs[name] for name in present})
    for name, actual in (("HAll", Y), ("Ht", Y_h), ("Ct", Y_c)):
        assert_close(actual, expected[name], FLOAT64_RTOL, f"{context(config, rng)}: {name}")


# ---------------------------------------------------------------------------------------------
# (b) Backward


def _relative_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    return float(np.linalg.norm(analytic - numeric) / max(np.linalg.norm(numeric), FINITE_DIFFERENCE_FLOOR))


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_backward_matches_finite_differences(config: LstmConfig, rng: np.random.Generator) -> None:
    inputs = materialised(config, sample_inputs(config, rng))
    attributes = config.attributes()
    outputs = lstm_forward(**inputs, **attributes)
    upstream = {f"grad_{name}": rng.standard_normal(outputs[name].shape) for name in ("HAll", "Ht", "Ct")}

    def loss() -> float:
        out = lstm_forward(**inputs, **attributes)
        return float(sum(np.sum(upstream[f"grad_{name}"] * out[name]) for name in ("HAll", "Ht", "Ct")))

    analytic = lstm_backward(**inputs, **attributes, **upstream)
    errors = {}
    for grad_name, input_name in GRADIENT_OF.items():
        numeric = central_difference(loss, inputs[input_name])
        assert analytic[grad_name].shape == numeric.shape, f"{context(config, rng)}: {grad_name} shape"
        errors[grad_name] = _relative_error(analytic[grad_name], numeric)
    failed = {name: error for name, error in errors.items() if not error <= FINITE_DIFFERENCE_RTOL}
    assert not failed, (
        f"{context(config, rng)}: relative errors above {FINITE_DIFFERENCE_RTOL}: {failed} (all: {errors})"
    )


def test_backward_bias_halves_are_equal(rng: np.random.Generator) -> None:
    config = config_by_id("T4_B3_I5_H3_bidirectional_bias_peephole_h0_c0_clip")
    inputs = sample_inputs(config, rng)
    outputs = lstm_forward(**inputs, **config.attributes())
    grad_B = lstm_backward(**inputs, **config.attributes(), grad_HAll=rng.standard_normal(outputs["HAll"].shape))["dB"]
    half = 4 * config.hidden_size
    np.testing.assert_array_equal(grad_B[:, :half], grad_B[:, half:], err_msg=context(config, rng))


@pytest.mark.parametrize("given", ["grad_HAll", "grad_Ht", "grad_Ct"])
def test_backward_missing_upstream_gradients_are_zeros(given: str, rng: np.random.Generator) -> None:
    config = config_by_id("T4_B3_I3_H3_bidirectional_bias_peephole_h0_c0_clip_lens0-4-2")
    inputs = sample_inputs(config, rng)
    outputs = lstm_forward(**inputs, **config.attributes())
    upstream = {f"grad_{name}": np.zeros_like(outputs[name]) for name in ("HAll", "Ht", "Ct")}
    upstream[given] = rng.standard_normal(upstream[given].shape)
    with_zeros = lstm_backward(**inputs, **config.attributes(), **upstream)
    with_missing = lstm_backward(**inputs, **config.attributes(), **{given: upstream[given]})
    for name, value in with_zeros.items():
        np.testing.assert_array_equal(with_missing[name], value, err_msg=f"{context(config, rng)}: {name}")


@pytest.mark.parametrize(("seq_length", "batch_size"), [(0, 2), (3, 0)], ids=["seq_length_0", "batch_size_0"])
@pytest.mark.parametrize("layout", [0, 1])
def test_reference_empty_inputs(seq_length: int, batch_size: int, layout: int, rng: np.random.Generator) -> None:
    """Empty outputs, and a zero final state (as for sequences of length 0)."""
    config = LstmConfig(seq_length, batch_size, 3, 2, "bidirectional", initial_h=True, initial_c=True, layout=layout)
    inputs = draw_inputs(config, rng)
    outputs = lstm_forward(**inputs, **config.attributes())
    y_shape = (seq_length, 2, batch_size, 2) if layout == 0 else (batch_size, seq_length, 2, 2)
    state_shape = (2, batch_size, 2) if layout == 0 else (batch_size, 2, 2)
    assert outputs["HAll"].shape == outputs["CAll"].shape == y_shape
    assert outputs["IOFC"].shape == (*y_shape[:-1], 8)
    assert outputs["Ht"].shape == outputs["Ct"].shape == state_shape
    assert not np.any(outputs["Ht"])
    assert not np.any(outputs["Ct"])
    gradients = lstm_backward(**inputs, **config.attributes(), grad_Ht=np.ones(state_shape))
    assert gradients["dX"].shape == inputs["X"].shape
    assert all(not np.any(value) for value in gradients.values())


# ---------------------------------------------------------------------------------------------
# Documented onnxruntime behaviour (see the lstm_ref module docstring)


def _small_inputs(rng: np.random.Generator, num_directions: int = 1, seq_length: int = 3) -> dict[str, np.ndarray]:
    config = LstmConfig(
        seq_length,
        2,
        3,
        2,
        "bidirectional" if num_directions == 2 else "forward",
        peephole=True,
        initial_h=True,
        initial_c=True,
    )
    return {name: value for name, value in draw_inputs(config, rng).items() if value is not None}


def _run_onnxruntime(
    inputs: dict[str, np.ndarray], attributes: dict, elem_type: int = TensorProto.FLOAT
) -> list[np.ndarray]:
    dtype = np.float64 if elem_type == TensorProto.DOUBLE else np.float32
    feeds = {name: value.astype(np.int32 if name == "sequence_lens" else dtype) for name, value in inputs.items()}
    return ort_session(lstm_model(list(feeds), attributes, elem_type)).run(None, feeds)


def test_onnxruntime_lstm_rejects_double(rng: np.random.Generator) -> None:
    with pytest.raises(Exception, match="LSTM operator does not support double yet"):
        _run_onnxruntime(_small_inputs(rng), {"hidden_size": 2}, TensorProto.DOUBLE)


def test_onnxruntime_lstm_rejects_layout_1(rng: np.random.Generator) -> None:
    with pytest.raises(Exception, match=r"Batchwise recurrent operations \(layout == 1\) are not supported"):
        _run_onnxruntime(_small_inputs(rng), {"hidden_size": 2, "layout": 1})


@pytest.mark.parametrize("sequence_lens", [(4, 1), (-1, 1)], ids=["above_seq_length", "negative"])
def test_onnxruntime_lstm_rejects_sequence_lens_out_of_range(
    sequence_lens: tuple[int, int], rng: np.random.Generator
) -> None:
    inputs = _small_inputs(rng) | {"sequence_lens": np.array(sequence_lens)}
    with pytest.raises(Exception, match=r"All values must be >=? 0 and <=? seq_length"):
        _run_onnxruntime(inputs, {"hidden_size": 2})
    with pytest.raises(ValueError, match="sequence_lens"):
        lstm_forward(**inputs, hidden_size=2)


def test_onnxruntime_lstm_bidirectional_needs_six_activations(rng: np.random.Generator) -> None:
    attributes = {"hidden_size": 2, "direction": "bidirectional", "activations": ["Sigmoid", "Tanh", "Tanh"]}
    inputs = _small_inputs(rng, num_directions=2)
    with pytest.raises(
        Exception, match=r"activation_func_names.size\(\) == static_cast<size_t>\(num_directions_\) \* 3"
    ):
        _run_onnxruntime(inputs, attributes)
    with pytest.raises(ValueError, match=r"activations: expected 3\*num_directions=6 entries, got 3"):
        lstm_forward(**inputs, **attributes)


@pytest.mark.xfail(strict=True, reason="onnxruntime 1.31.1 aborts the process (std::terminate) on batch_size 0")
def test_onnxruntime_lstm_accepts_batch_size_zero(tmp_path: pathlib.Path) -> None:
    """Runs in a subprocess because the failure mode is SIGABRT."""
    model_path = tmp_path / "lstm.onnx"
    onnx.save(lstm_model(["X", "W", "R"], {"hidden_size": 2}), model_path)
    script = (
        "import numpy as np, onnxruntime as ort\n"
        f"session = ort.InferenceSession({str(model_path)!r}, providers=['CPUExecutionProvider'])\n"
        "feeds = {'X': np.zeros((3, 0, 3), np.float32), 'W': np.ones((1, 8, 3), np.float32),"
        " 'R': np.ones((1, 8, 2), np.float32)}\n"
        "assert session.run(None, feeds)[1].shape == (1, 0, 2)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"returncode {result.returncode}: {result.stderr[-500:]}"


def test_onnxruntime_lstm_sequence_length_zero_gives_zero_state(rng: np.random.Generator) -> None:
    inputs = _small_inputs(rng) | {"sequence_lens": np.array([0, 3])}
    Y, Y_h, Y_c = _run_onnxruntime(inputs, {"hidden_size": 2})
    assert np.all(inputs["initial_h"][:, 0] != 0)
    assert np.all(inputs["initial_c"][:, 0] != 0)
    assert not np.any(Y[:, :, 0])
    assert not np.any(Y_h[:, 0])
    assert not np.any(Y_c[:, 0])
    expected = lstm_forward(**inputs, hidden_size=2)
    assert not np.any(expected["Ht"][:, 0])
    assert not np.any(expected["Ct"][:, 0])


def test_onnxruntime_lstm_does_not_clip_the_cell_state(rng: np.random.Generator) -> None:
    inputs = _small_inputs(rng)
    inputs["initial_c"] = 5.0 + np.abs(inputs["initial_c"])
    clip = 0.5
    Y, Y_h, Y_c = _run_onnxruntime(inputs, {"hidden_size": 2, "clip": clip})
    assert np.max(np.abs(Y_c)) > 2 * clip
    expected = lstm_forward(**inputs, hidden_size=2, clip=clip)  # h(C_t) sees the unclipped C_t too
    for name, actual in (("HAll", Y), ("Ht", Y_h), ("Ct", Y_c)):
        assert_close(actual, expected[name], FLOAT32_RTOL, name)


def test_onnxruntime_lstm_input_forget_ignores_forget_gate_parameters(rng: np.random.Generator) -> None:
    inputs = _small_inputs(rng) | {"B": rng.standard_normal((1, 16))}
    attributes = {"hidden_size": 2, "input_forget": 1}
    changed = {name: value.copy() for name, value in inputs.items()}
    f_rows = slice(2 * 2, 3 * 2)  # gate f of iofc, hidden_size 2
    changed["W"][:, f_rows] += 1.0
    changed["R"][:, f_rows] += 1.0
    changed["B"][:, f_rows] += 1.0
    changed["B"][:, 8 + 4 : 8 + 6] += 1.0  # Rb_f
    changed["P"][:, 4:6] += 1.0  # P_f
    for before, after in zip(_run_onnxruntime(inputs, attributes), _run_onnxruntime(changed, attributes), strict=True):
        np.testing.assert_array_equal(before, after)
    gradients = lstm_backward(**inputs, **attributes, grad_HAll=np.ones((3, 1, 2, 2)))
    assert not np.any(gradients["dW"][:, f_rows])
    assert not np.any(gradients["dP"][:, 4:6])


@pytest.mark.parametrize(
    ("activation", "alpha", "beta", "expected"),
    [
        ("Affine", [], [], lambda x: 0.0 * x),
        ("Affine", [0.7], [], lambda x: 0.7 * x),
        ("ScaledTanh", [], [0.4], lambda x: 0.0 * x),
        ("HardSigmoid", [], [], lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
        ("LeakyRelu", [], [], lambda x: np.where(x >= 0, x, 0.01 * x)),
        ("ThresholdedRelu", [], [], lambda x: np.where(x > 0, x, 0.0)),
        ("ThresholdedRelu", [0.75], [], lambda x: np.where(x > 0.75, x, 0.0)),
        ("Elu", [], [], lambda x: np.where(x >= 0, x, np.expm1(np.minimum(x, 0)))),
    ],
    ids=[
        "affine",
        "affine_alpha_only",
        "scaledtanh_beta_only",
        "hardsigmoid",
        "leakyrelu",
        "thresholdedrelu",
        "thresholdedrelu_at_alpha",
        "elu",
    ],
)
def test_onnxruntime_activation_defaults(activation: str, alpha: list, beta: list, expected: Callable) -> None:
    """Probes h alone, so that Y = h(x).

    f = g = Affine(1, 0) come first in the list and take the first alpha and beta; the bias
    makes i = o = 1 and W makes the candidate c = x, with C_{t-1} = 0.
    """
    x = np.array([-2.0, -0.5, -0.1, 0.05, 0.3, 0.75, 0.9, 3.0])
    inputs = {
        "X": x.reshape(1, -1, 1),
        "W": np.array([0.0, 0.0, 0.0, 1.0]).reshape(1, 4, 1),
        "R": np.zeros((1, 4, 1)),
        "B": np.array([1.0, 1.0, 0, 0, 0, 0, 0, 0]).reshape(1, 8),
    }
    attributes = {
        "hidden_size": 1,
        "activations": ["Affine", "Affine", activation],
        "activation_alpha": [1.0, 1.0, *alpha],
        "activation_beta": [0.0, 0.0, *beta],
    }
    Y = _run_onnxruntime(inputs, attributes)[0]
    assert_close(Y.ravel(), expected(x), FLOAT32_RTOL, f"{activation} alpha={alpha} beta={beta} (ORT)")
    assert_close(lstm_forward(**inputs, **attributes)["HAll"].ravel(), expected(x), 1e-12, f"{activation} (reference)")
