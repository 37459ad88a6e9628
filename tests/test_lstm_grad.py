"""Kernel tests of ``ortlstm::LSTMGrad``, the backward op.

Oracles, none sharing code with the kernels:

* central finite differences of the float64 ``LSTMTraining`` kernel itself, run through
  onnxruntime, for every gradient output and every config: the issue's acceptance criterion
  (relative error in norm <= 1e-6);
* the float64 NumPy oracle ``reference.lstm_ref.lstm_backward`` (tight), also in the
  linear-activation mode that separates a GEMM bug from a gate bug;
* float64 ``LSTMGrad`` for the float32 path, run end to end (the issue's float32 criterion,
  1e-4 relative in norm).

Also: each output alone, omitted upstream gradients as zeros, LSTMTraining chained into LSTMGrad
in one graph, and determinism. The loss throughout is
L = Σ grad_HAll ⊙ HAll + Σ grad_Ht ⊙ Ht + Σ grad_Ct ⊙ Ct with random upstream gradients.
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import op_runner
import pytest
from configs import CONFIGS, LstmConfig, config_by_id, config_id, context, draw_inputs, sample_inputs
from lstm_helpers import (
    GRADIENT_OF,
    LARGE_CONFIG,
    MEDIUM_CONFIG,
    SPLIT_CONFIGS,
    assert_close,
    central_difference,
    linear_variant,
    materialised,
    oracle_attributes,
    slow,
)
from onnx import TensorProto, helper
from reference.lstm_ref import lstm_backward

import ortlstm.ops
from ortlstm.ops import schema

FORWARD_INPUTS = tuple(schema.input_names(schema.op_by_name("LSTMTraining")))
GRADIENTS = tuple(GRADIENT_OF)  # dX, dW, dR, dB, dH0, dC0, dP: LSTMGrad's outputs
UPSTREAM = ("grad_HAll", "grad_Ht", "grad_Ct")
LOSS_OUTPUTS = ("HAll", "Ht", "Ct")
STASH = ("HAll", "CAll", "IOFC")

FLOAT64_RTOL = 1e-12  # float64 LSTMGrad vs the float64 oracle, elementwise (atol scaled)
FINITE_DIFFERENCE_RTOL = 1e-6  # ||analytic - numeric|| / max(||numeric||, FINITE_DIFFERENCE_FLOOR)
FINITE_DIFFERENCE_FLOOR = 1e-2  # below this gradient norm the bound is absolute
FLOAT32_RTOL = 1e-4  # ||float32 - float64|| / max(||float64||, FLOAT32_FLOOR), end-to-end float32 path
FLOAT32_FLOOR = 1e-2  # below this gradient norm the bound is absolute

LINEAR_CONFIGS = [linear_variant(config) for config in CONFIGS if config.activations is None]

# Configs that reach every skip path: both directions, sequence_lens with 0, both layouts.
OMISSION_CONFIGS = [
    config_by_id("T5_B3_I7_H5_bidirectional_bias_peephole_h0_c0_clip_lens5-3-0"),
    config_by_id("T3_B2_I5_H3_bidirectional_bias_peephole_h0_c0_clip_layout1"),
    config_by_id("T2_B2_I3_H3_reverse_bias_h0_c0_input_forget_layout1_lens2-0"),
]


# ---------------------------------------------------------------------------------------------
# Helpers


def _forward(config: LstmConfig, inputs: dict, dtype: type = np.float64, outputs: tuple[str, ...] = STASH) -> dict:
    return op_runner.run("LSTMTraining", inputs, config.attributes(), dtype=dtype, outputs=list(outputs))


def _grad(
    config: LstmConfig, grad_inputs: dict, dtype: type = np.float64, outputs: tuple[str, ...] = GRADIENTS
) -> dict:
    return op_runner.run("LSTMGrad", grad_inputs, config.attributes(), dtype=dtype, outputs=list(outputs))


def _upstream(config: LstmConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random gradients reaching HAll, Ht and Ct, shaped like them."""
    seq_length, batch_size, num_directions = config.seq_length, config.batch_size, config.num_directions
    hidden_size = config.hidden_size
    if config.layout == 0:
        sequence_shape, state_shape = (seq_length, num_directions, batch_size), (num_directions, batch_size)
    else:
        sequence_shape, state_shape = (batch_size, seq_length, num_directions), (batch_size, num_directions)
    return {
        "grad_HAll": rng.standard_normal((*sequence_shape, hidden_size)),
        "grad_Ht": rng.standard_normal((*state_shape, hidden_size)),
        "grad_Ct": rng.standard_normal((*state_shape, hidden_size)),
    }


def _grad_inputs(inputs: dict, stash: dict, upstream: dict) -> dict:
    """LSTMGrad's inputs: the forward inputs but B, the forward's stash, the upstream gradients."""
    grad_inputs = {name: value for name, value in inputs.items() if name != "B"}
    grad_inputs.update({name: stash[name] for name in STASH})
    grad_inputs.update(upstream)
    return grad_inputs


def _kernel_gradients(config: LstmConfig, inputs: dict, upstream: dict, dtype: type = np.float64) -> dict:
    """LSTMTraining then LSTMGrad, as two separate sessions."""
    return _grad(config, _grad_inputs(inputs, _forward(config, inputs, dtype), upstream), dtype)


def _relative_error(actual: np.ndarray, expected: np.ndarray, floor: float) -> float:
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), floor))


# ---------------------------------------------------------------------------------------------
# Finite differences of the kernel's own forward


def _numeric_gradients(config: LstmConfig, inputs: dict, upstream: dict) -> dict[str, np.ndarray]:
    """Central differences of L through the float64 LSTMTraining kernel, one scalar at a time.

    One session run per perturbed copy: a run of these tiny configs costs about 0.1 ms, so the
    whole table (about 8000 scalars) stays within seconds without batching tricks.
    """
    feeds = materialised(config, inputs)
    present = [name for name in FORWARD_INPUTS if feeds[name] is not None]
    session = op_runner.session("LSTMTraining", present, LOSS_OUTPUTS, np.float64, config.attributes())
    feeds = {name: np.array(feeds[name]) for name in present}  # private copies, perturbed in place
    weights = [upstream[f"grad_{name}"] for name in LOSS_OUTPUTS]

    def loss() -> float:
        return float(sum(np.sum(w * y) for w, y in zip(weights, session.run(list(LOSS_OUTPUTS), feeds), strict=True)))

    numeric = {}
    for grad_name, input_name in GRADIENT_OF.items():
        numeric[grad_name] = central_difference(loss, feeds[input_name])
    return numeric


@pytest.mark.parametrize("config", [*CONFIGS, slow(MEDIUM_CONFIG)], ids=config_id)
def test_matches_finite_differences(config: LstmConfig, rng: np.random.Generator) -> None:
    """Float64 LSTMGrad vs central differences of float64 LSTMTraining, every output.

    Absent optional inputs stay absent for the kernels and are perturbed as explicit zeros; dB
    is checked against the perturbation of B, whose two halves enter as a sum.
    """
    inputs = sample_inputs(config, rng)
    upstream = _upstream(config, rng)
    analytic = _kernel_gradients(config, inputs, upstream)
    numeric = _numeric_gradients(config, inputs, upstream)
    errors = {}
    for name in GRADIENTS:
        assert analytic[name].shape == numeric[name].shape, (
            f"{context(config, rng)}: {name} shape {analytic[name].shape}, expected {numeric[name].shape}"
        )
        errors[name] = _relative_error(analytic[name], numeric[name], FINITE_DIFFERENCE_FLOOR)
    failed = {name: error for name, error in errors.items() if not error <= FINITE_DIFFERENCE_RTOL}
    assert not failed, (
        f"{context(config, rng)}: relative errors above {FINITE_DIFFERENCE_RTOL}: {failed} (all: {errors})"
    )


# ---------------------------------------------------------------------------------------------
# The NumPy oracle


def _check_against_reference(config: LstmConfig, rng: np.random.Generator, what: str) -> None:
    inputs = sample_inputs(config, rng)
    upstream = _upstream(config, rng)
    expected = lstm_backward(**inputs, **oracle_attributes(config), **upstream)
    actual = _kernel_gradients(config, inputs, upstream)
    for name in GRADIENTS:
        assert actual[name].dtype == np.float64, f"{context(config, rng)}: {name} dtype {actual[name].dtype}"
        assert_close(actual[name], expected[name], FLOAT64_RTOL, f"{context(config, rng)}: {name}{what}")
    half = 4 * config.hidden_size
    np.testing.assert_array_equal(
        actual["dB"][:, :half], actual["dB"][:, half:], err_msg=f"{context(config, rng)}: dB halves{what}"
    )


@pytest.mark.parametrize("config", [*CONFIGS, *SPLIT_CONFIGS, slow(MEDIUM_CONFIG)], ids=config_id)
def test_float64_matches_reference(config: LstmConfig, rng: np.random.Generator) -> None:
    """Every output against the oracle's lstm_backward; dB's halves bitwise equal."""
    _check_against_reference(config, rng, "")


@pytest.mark.parametrize("config", LINEAR_CONFIGS, ids=config_id)
def test_linear_activations_match_reference(config: LstmConfig, rng: np.random.Generator) -> None:
    """Identity f, g and h: a failure here is in the GEMMs, the peepholes, clip or the state path."""
    _check_against_reference(config, rng, " (linear mode)")


# ---------------------------------------------------------------------------------------------
# LSTMTraining -> LSTMGrad in one graph, and the float32 path


@functools.lru_cache(maxsize=128)
def _chained_session(config: LstmConfig, present: tuple[str, ...], dtype: str) -> ort.InferenceSession:
    """One graph: LSTMTraining's stash feeds LSTMGrad; outputs the seven gradients."""
    elem = TensorProto.FLOAT if dtype == "float32" else TensorProto.DOUBLE
    forward_inputs = {name: name for name in FORWARD_INPUTS if name in present}
    forward = ortlstm.ops.make_node(
        "LSTMTraining",
        forward_inputs,
        {name: f"stash_{name}" for name in STASH},
        name="forward",
        **config.attributes(),
    )
    grad_inputs = {name: value for name, value in forward_inputs.items() if name != "B"}
    grad_inputs.update({name: f"stash_{name}" for name in STASH})
    grad_inputs.update({name: name for name in UPSTREAM})
    backward = ortlstm.ops.make_node(
        "LSTMGrad", grad_inputs, {name: name for name in GRADIENTS}, name="backward", **config.attributes()
    )
    graph_inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT32 if name == "sequence_lens" else elem, None)
        for name in (*forward_inputs, *UPSTREAM)
    ]
    graph_outputs = [helper.make_tensor_value_info(name, elem, None) for name in GRADIENTS]
    model = helper.make_model(
        helper.make_graph([forward, backward], "lstm_training_and_grad", graph_inputs, graph_outputs),
        opset_imports=[
            helper.make_opsetid("", op_runner.ONNX_OPSET),
            helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION),
        ],
        ir_version=op_runner.IR_VERSION,
    )
    return ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )


def _chained_gradients(config: LstmConfig, inputs: dict, upstream: dict, dtype: type) -> dict[str, np.ndarray]:
    present = tuple(name for name in FORWARD_INPUTS if inputs[name] is not None)
    feeds = {
        name: inputs[name] if name == "sequence_lens" else np.asarray(inputs[name], dtype=dtype) for name in present
    }
    feeds.update({name: np.asarray(value, dtype=dtype) for name, value in upstream.items()})
    session = _chained_session(config, present, np.dtype(dtype).name)
    return dict(zip(GRADIENTS, session.run(list(GRADIENTS), feeds), strict=True))


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_chained_graph_matches_separate_runs(config: LstmConfig, rng: np.random.Generator) -> None:
    """LSTMGrad consumes LSTMTraining's stash inside one graph: bitwise the two-session result."""
    inputs = sample_inputs(config, rng)
    upstream = _upstream(config, rng)
    separate = _kernel_gradients(config, inputs, upstream)
    chained = _chained_gradients(config, inputs, upstream, np.float64)
    for name in GRADIENTS:
        np.testing.assert_array_equal(chained[name], separate[name], err_msg=f"{context(config, rng)}: {name}")


@pytest.mark.parametrize("config", [*CONFIGS, *SPLIT_CONFIGS, slow(MEDIUM_CONFIG)], ids=config_id)
def test_float32_matches_float64(config: LstmConfig, rng: np.random.Generator) -> None:
    """The float32 path end to end (one graph, forward and backward) vs float64 LSTMGrad."""
    inputs = sample_inputs(config, rng)
    upstream = {name: value.astype(np.float32).astype(np.float64) for name, value in _upstream(config, rng).items()}
    expected = _kernel_gradients(config, inputs, upstream)
    actual = _chained_gradients(config, inputs, upstream, np.float32)
    errors = {}
    for name in GRADIENTS:
        assert actual[name].dtype == np.float32, f"{context(config, rng)}: {name} dtype {actual[name].dtype}"
        assert actual[name].shape == expected[name].shape, f"{context(config, rng)}: {name} shape"
        errors[name] = _relative_error(actual[name].astype(np.float64), expected[name], FLOAT32_FLOOR)
    failed = {name: error for name, error in errors.items() if not error <= FLOAT32_RTOL}
    assert not failed, f"{context(config, rng)}: relative errors above {FLOAT32_RTOL}: {failed} (all: {errors})"


# ---------------------------------------------------------------------------------------------
# Optional outputs and inputs


@pytest.mark.parametrize("output", GRADIENTS)
@pytest.mark.parametrize("config", OMISSION_CONFIGS, ids=config_id)
def test_single_output_matches_all_outputs(config: LstmConfig, output: str, rng: np.random.Generator) -> None:
    """An output requested alone is bitwise what the all-outputs run gives."""
    inputs = sample_inputs(config, rng)
    grad_inputs = _grad_inputs(inputs, _forward(config, inputs), _upstream(config, rng))
    everything = _grad(config, grad_inputs)
    alone = _grad(config, grad_inputs, outputs=(output,))
    np.testing.assert_array_equal(alone[output], everything[output], err_msg=f"{context(config, rng)}: {output} alone")


@pytest.mark.parametrize("omitted", [*UPSTREAM, "all"])
@pytest.mark.parametrize("config", OMISSION_CONFIGS, ids=config_id)
def test_omitted_upstream_gradients_are_zeros(config: LstmConfig, omitted: str, rng: np.random.Generator) -> None:
    """An absent grad_HAll / grad_Ht / grad_Ct gives bitwise the result of explicit zeros."""
    inputs = sample_inputs(config, rng)
    upstream = _upstream(config, rng)
    names = UPSTREAM if omitted == "all" else (omitted,)
    zeros = upstream | {name: np.zeros_like(upstream[name]) for name in names}
    absent = upstream | dict.fromkeys(names)
    stash = _forward(config, inputs)
    with_zeros = _grad(config, _grad_inputs(inputs, stash, zeros))
    with_absent = _grad(config, _grad_inputs(inputs, stash, absent))
    for name in GRADIENTS:
        np.testing.assert_array_equal(
            with_absent[name], with_zeros[name], err_msg=f"{context(config, rng)}: {name} without {names}"
        )
        if omitted == "all":
            assert not np.any(with_absent[name]), f"{context(config, rng)}: {name} nonzero without upstream gradients"


# ---------------------------------------------------------------------------------------------
# Determinism


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("config", [*CONFIGS, slow(MEDIUM_CONFIG), slow(LARGE_CONFIG)], ids=config_id)
def test_deterministic(config: LstmConfig, dtype: type, rng: np.random.Generator) -> None:
    """Two runs of one session give bitwise identical gradients."""
    inputs = draw_inputs(config, rng)
    grad_inputs = _grad_inputs(inputs, _forward(config, inputs, dtype), _upstream(config, rng))
    first = _grad(config, grad_inputs, dtype)
    second = _grad(config, grad_inputs, dtype)
    for name in GRADIENTS:
        np.testing.assert_array_equal(second[name], first[name], err_msg=f"{context(config, rng)}: {name}")
