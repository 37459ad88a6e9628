"""Kernel tests of ``ortlstm::LSTMTraining``, the forward op.

Oracles: onnxruntime's standard ``LSTM`` (float32: HAll, Ht, Ct are its Y, Y_h, Y_c) and the
float64 NumPy oracle ``reference.lstm_ref`` (all five outputs, tight). Neither shares code with
the kernels. Also: omitted outputs, determinism, and the linear-activation mode that separates a
GEMM bug from a gate bug.
"""

from __future__ import annotations

import numpy as np
import op_runner
import pytest
from configs import CONFIGS, LstmConfig, config_by_id, config_id, context, draw_inputs, sample_inputs
from lstm_helpers import (
    LARGE_CONFIG,
    MEDIUM_CONFIG,
    SPLIT_CONFIGS,
    OrtLstm,
    assert_close,
    linear_variant,
    oracle_attributes,
    slow,
)
from reference.lstm_ref import lstm_forward

OP = "LSTMTraining"
OUTPUTS = ("HAll", "Ht", "Ct", "CAll", "IOFC")
LSTM_OUTPUTS = ("HAll", "Ht", "Ct")  # the ones ONNX LSTM has (Y, Y_h, Y_c)

FLOAT32_RTOL = 1e-5  # float32 kernel vs ORT's float32 LSTM, or vs the float64 oracle
FLOAT64_RTOL = 1e-12  # float64 kernel vs the float64 oracle

# Linear-activation variants of the configs that use the default activations.
LINEAR_CONFIGS = [linear_variant(config) for config in CONFIGS if config.activations is None]


def _run(config: LstmConfig, inputs: dict, dtype: type = np.float64, outputs: tuple[str, ...] = OUTPUTS) -> dict:
    return op_runner.run(OP, inputs, config.attributes(), dtype=dtype, outputs=list(outputs))


@pytest.mark.parametrize("config", [*CONFIGS, *SPLIT_CONFIGS, slow(MEDIUM_CONFIG)], ids=config_id)
def test_matches_onnxruntime_lstm(config: LstmConfig, rng: np.random.Generator) -> None:
    """Float32 HAll, Ht, Ct against ORT's LSTM Y, Y_h, Y_c (layout 1 through transposes)."""
    inputs = sample_inputs(config, rng)
    expected = OrtLstm(config, inputs).run(inputs)
    actual = _run(config, inputs, np.float32, LSTM_OUTPUTS)
    for name in LSTM_OUTPUTS:
        assert actual[name].dtype == np.float32, f"{context(config, rng)}: {name} dtype {actual[name].dtype}"
        assert_close(actual[name], expected[name].astype(np.float64), FLOAT32_RTOL, f"{context(config, rng)}: {name}")


@pytest.mark.parametrize("config", [*CONFIGS, *SPLIT_CONFIGS, slow(MEDIUM_CONFIG)], ids=config_id)
def test_float64_matches_reference(config: LstmConfig, rng: np.random.Generator) -> None:
    """All five outputs, float64, against the oracle (fed the float32-rounded attributes)."""
    inputs = sample_inputs(config, rng)
    expected = lstm_forward(**inputs, **oracle_attributes(config))
    actual = _run(config, inputs)
    for name in OUTPUTS:
        assert actual[name].dtype == np.float64, f"{context(config, rng)}: {name} dtype {actual[name].dtype}"
        assert_close(actual[name], expected[name], FLOAT64_RTOL, f"{context(config, rng)}: {name}")


@pytest.mark.parametrize("config", [*CONFIGS, slow(MEDIUM_CONFIG)], ids=config_id)
def test_float32_matches_reference(config: LstmConfig, rng: np.random.Generator) -> None:
    """All five outputs, float32 (the stash has no ORT counterpart; the oracle stands in)."""
    inputs = sample_inputs(config, rng)
    expected = lstm_forward(**inputs, **oracle_attributes(config))
    actual = _run(config, inputs, np.float32)
    for name in OUTPUTS:
        assert_close(actual[name].astype(np.float64), expected[name], FLOAT32_RTOL, f"{context(config, rng)}: {name}")


@pytest.mark.parametrize("config", LINEAR_CONFIGS, ids=config_id)
def test_linear_activations_match_reference(config: LstmConfig, rng: np.random.Generator) -> None:
    """Identity f, g and h: what is left is the GEMMs, bias, peepholes, clip and the state update."""
    inputs = sample_inputs(config, rng)
    expected = lstm_forward(**inputs, **oracle_attributes(config))
    actual = _run(config, inputs)
    for name in OUTPUTS:
        assert_close(actual[name], expected[name], FLOAT64_RTOL, f"{context(config, rng)}: {name} (linear mode)")


# Each output alone, and all outputs but one.
OUTPUT_SUBSETS = [(name,) for name in OUTPUTS] + [tuple(o for o in OUTPUTS if o != name) for name in OUTPUTS]

# Configs that reach every skip path: both directions, sequence_lens with 0, both layouts.
OMITTED_OUTPUT_CONFIGS = [
    config_by_id("T5_B3_I7_H5_bidirectional_bias_peephole_h0_c0_clip_lens5-3-0"),
    config_by_id("T3_B2_I5_H3_bidirectional_bias_peephole_h0_c0_clip_layout1"),
    config_by_id("T2_B2_I3_H3_reverse_bias_h0_c0_input_forget_layout1_lens2-0"),
]


@pytest.mark.parametrize("subset", OUTPUT_SUBSETS, ids="-".join)
@pytest.mark.parametrize("config", OMITTED_OUTPUT_CONFIGS, ids=config_id)
def test_omitted_outputs_leave_the_others_unchanged(
    config: LstmConfig, subset: tuple[str, ...], rng: np.random.Generator
) -> None:
    """Requesting a subset of the outputs gives bitwise the values of the full run."""
    inputs = sample_inputs(config, rng)
    full = _run(config, inputs)
    partial = _run(config, inputs, outputs=subset)
    for name in subset:
        np.testing.assert_array_equal(
            partial[name], full[name], err_msg=f"{context(config, rng)}: {name} when only {subset} are requested"
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("config", [*CONFIGS, slow(MEDIUM_CONFIG), slow(LARGE_CONFIG)], ids=config_id)
def test_deterministic(config: LstmConfig, dtype: type, rng: np.random.Generator) -> None:
    """Two runs of one session give bitwise identical outputs."""
    inputs = draw_inputs(config, rng)
    first = _run(config, inputs, dtype)
    second = _run(config, inputs, dtype)
    for name in OUTPUTS:
        np.testing.assert_array_equal(second[name], first[name], err_msg=f"{context(config, rng)}: {name}")
