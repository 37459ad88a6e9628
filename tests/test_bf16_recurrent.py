"""matmul_precision="bfloat16" in the recurrent ops (issue 33): LSTM, GRU and RNN against NumPy oracles.

The oracle is the float64 reference of each op (ortlstm.reference*, run with the node's
matmul_precision="bfloat16"): every GEMM operand rounded to bfloat16 (round to nearest even), products
and sums in float64, gate math in float64. The ops accumulate in float32, so they are held to it
within float32's rounding carried through the time loop; and to the float64 op on the unrounded
inputs within bfloat16's rounding. The forward's outputs feed the gradient op as in training, so the
gradient check covers the stash the bf16 forward wrote. float32, given or omitted, is bit for bit
today's result (test_matmul_precision.py, scripts/compare_kernel_libraries.py for the libraries).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import op_runner
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

from ortlstm import reference, reference_gru, reference_rnn

_Array = np.ndarray
_BF16 = {"matmul_precision": "bfloat16"}


def _inputs(cell: str, attributes: Mapping[str, object], seed: int, *, lens: bool = False,
            peepholes: bool = False, wide: bool = False) -> dict[str, _Array | None]:
    """float32 inputs of a training op in the node's layout; weights of torch's scale, U(-1/sqrt(H), 1/sqrt(H))."""
    # wide: a step big enough that the forward driver cuts it into blocks of hidden units.
    T, N, I, H = (8, 2, 32, 512) if wide else (7, 5, 12, 16)  # noqa: E741 (the op's dimension names)
    rng = np.random.default_rng(seed)
    gates = {"lstm": 4, "gru": 3, "rnn": 1}[cell]
    D = 2 if attributes.get("direction") == "bidirectional" else 1
    bound = 1.0 / np.sqrt(H)

    def uniform(*shape: int) -> _Array:
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    layout = attributes.get("layout", 0)
    inputs: dict[str, _Array | None] = {
        "X": rng.standard_normal((N, T, I) if layout else (T, N, I)).astype(np.float32),
        "W": uniform(D, gates * H, I),
        "R": uniform(D, gates * H, H),
        "B": uniform(D, 2 * gates * H),
        "initial_h": (0.5 * rng.standard_normal((N, D, H) if layout else (D, N, H))).astype(np.float32),
        "sequence_lens": rng.integers(1, T + 1, N).astype(np.int32) if lens else None,
    }
    if cell == "lstm":
        inputs["initial_c"] = (0.5 * rng.standard_normal((N, D, H) if layout else (D, N, H))).astype(np.float32)
        inputs["P"] = uniform(D, 3 * H) if peepholes else None
    return inputs


_FORWARD: dict[str, tuple[str, Callable[..., dict[str, _Array]], tuple[str, ...]]] = {
    "lstm": ("LSTMTraining", reference.lstm_training, ("HAll", "Ht", "Ct", "CAll", "IOFC")),
    "gru": ("GRUTraining", reference_gru.gru_training, ("HAll", "Ht", "ZRH")),
    "rnn": ("RNNTraining", reference_rnn.rnn_training, ("HAll", "Ht")),
}
_BACKWARD: dict[str, tuple[str, Callable[..., dict[str, _Array]], tuple[str, ...]]] = {
    "lstm": ("LSTMGrad", reference.lstm_grad, ("dX", "dW", "dR", "dB", "dH0", "dC0", "dP")),
    "gru": ("GRUGrad", reference_gru.gru_grad, ("dX", "dW", "dR", "dB", "dH0")),
    "rnn": ("RNNGrad", reference_rnn.rnn_grad, ("dX", "dW", "dR", "dB", "dH0")),
}


def _close(name: str, got: _Array, oracle: _Array, rtol: float) -> None:
    """Within rtol of the oracle's scale (its largest element), element by element."""
    scale = max(float(np.max(np.abs(oracle))), 1e-30)
    error = float(np.max(np.abs(got.astype(np.float64) - oracle))) / scale
    assert error <= rtol, f"{name}: largest error {error:.3g} of the oracle's scale, expected <= {rtol:.3g}"


def _matches_bf16(name: str, got: _Array, oracle: _Array) -> None:
    """float32 accumulation of the bf16 reference's products, up to rare bfloat16 rounding flips.

    The op's intermediates (H_t, the gate gradients) are float32, the reference's float64; where one
    lies within float32's error of a bfloat16 rounding midpoint, the two round it to neighbours 2^-8
    apart, and the flip carries on through that batch entry's earlier steps (in the backward) and into
    the sums over the batch: up to a few tens of percent of the elements at wide H, by up to ~1e-3 of
    the scale. So the median element (of those not exactly zero) must be within float32's rounding
    (1e-6 of the scale) and every element within 2^-8; a GEMM left in float32, or rounded where it
    should not be, puts the median at 1e-5 to 1e-3 of the scale.
    """
    scale = max(float(np.max(np.abs(oracle))), 1e-30)
    error = np.abs(got.astype(np.float64) - oracle) / scale
    typical = float(np.median(error[oracle != 0]))  # not the padded steps' exact zeros
    assert typical <= 1e-6, f"{name}: half of the elements are off by more than {typical:.3g} of the scale"
    assert float(np.max(error)) <= 2.0**-8, f"{name}: largest error {np.max(error):.3g} of the scale"


def _forward(cell: str, inputs: Mapping[str, _Array | None], attributes: Mapping[str, object]) -> dict[str, _Array]:
    """The training op's outputs, in float32."""
    op, _, outputs = _FORWARD[cell]
    return op_runner.run(op, inputs, attributes, dtype=np.float32, outputs=outputs)


# Rows: (cell, attributes, input options). Small shapes: an element's float32 error rarely moves a
# later GEMM operand across a bfloat16 rounding boundary (which would be a 2^-9 jump, not an error).
_ROWS = [
    ("lstm", {}, {}),
    ("lstm", {}, {"peepholes": True, "lens": True}),
    ("lstm", {"layout": 1, "direction": "bidirectional"}, {"lens": True}),
    ("lstm", {"direction": "reverse", "clip": 0.6}, {"peepholes": True}),
    ("gru", {"linear_before_reset": 0}, {"lens": True}),
    ("gru", {"linear_before_reset": 1, "direction": "bidirectional", "layout": 1}, {}),
    ("lstm", {"hidden_size": 512}, {"wide": True}),
    ("gru", {"hidden_size": 512, "linear_before_reset": 1}, {"wide": True}),
    ("rnn", {}, {"lens": True}),
    ("rnn", {"direction": "bidirectional", "clip": 0.8}, {}),
]
_IDS = ["lstm", "lstm-peepholes-lens", "lstm-layout1-bidir-lens", "lstm-reverse-clip-peepholes", "gru-lbr0-lens",
        "gru-lbr1-bidir-layout1", "lstm-wide",
        "gru-lbr1-wide", "rnn-lens", "rnn-bidir-clip"]


@pytest.mark.parametrize(("cell", "options", "shape"), _ROWS, ids=_IDS)
def test_bfloat16_ops_match_the_bf16_reference(cell: str, options: dict, shape: dict) -> None:
    attributes = {"hidden_size": 16, **options}  # 512 for the wide rows
    inputs = _inputs(cell, attributes, seed=len(str(options)) + len(shape), **shape)
    forward = _forward(cell, inputs, {**attributes, **_BF16})
    op, oracle, _ = _FORWARD[cell]
    expected = oracle(inputs, **attributes, **_BF16)
    for name, value in forward.items():
        _matches_bf16(f"{op} {name}", value, expected[name])
    # Not float32: the rounding shows, and stays within bfloat16's relative precision of float64.
    float64 = oracle(inputs, **attributes)
    assert not np.allclose(forward["HAll"], float64["HAll"], rtol=0, atol=1e-5), f"{op}: looks like float32"
    _close(f"{op} HAll vs float64", forward["HAll"], float64["HAll"], 2e-2)
    rng = np.random.default_rng(1)
    grad_inputs = {**inputs, **forward, "grad_HAll": rng.standard_normal(forward["HAll"].shape).astype(np.float32),
                   "grad_Ht": rng.standard_normal(forward["Ht"].shape).astype(np.float32)}
    op, oracle, outputs = _BACKWARD[cell]
    got = op_runner.run(op, grad_inputs, {**attributes, **_BF16}, dtype=np.float32, outputs=outputs)
    expected = oracle(grad_inputs, **attributes, **_BF16)
    float64 = oracle(grad_inputs, **attributes)
    for name in outputs:
        _matches_bf16(f"{op} {name}", got[name], expected[name])
        _close(f"{op} {name} vs float64", got[name], float64[name], 2e-2)
    assert not np.allclose(got["dW"], float64["dW"], rtol=0, atol=1e-5), f"{op}: looks like float32"


@pytest.mark.parametrize("op", ["LSTMTraining", "LSTMGrad", "GRUTraining", "GRUGrad", "RNNTraining", "RNNGrad"])
def test_bfloat16_on_float64_tensors_is_refused(op: str) -> None:
    required = {"LSTMGrad": ["HAll", "CAll", "IOFC"], "GRUGrad": ["HAll", "ZRH"], "RNNGrad": ["HAll"]}
    inputs = ["X", "W", "R", *required.get(op, [])]
    with pytest.raises(RuntimeException) as error:
        op_runner.session(op, inputs, ["HAll"] if "Training" in op else ["dX"], np.float64,
                          {"hidden_size": 4, **_BF16})
    assert (f"{op} node '{op}_under_test': attribute matmul_precision: bfloat16 takes float32 tensors, got float64 "
            '(float64 is for gradient checks); pass float32 tensors or matmul_precision="float32"') in str(error.value)
