"""The `matmul_precision` attribute (issue 33): ConvGrad's bfloat16 GEMMs against float64 oracles, refusals.

ConvGrad with "bfloat16" is held to the float64 gradients of the bfloat16-rounded inputs (rounded by
the NumPy RNE reference of test_bf16_gemm.py) within float32 accumulation, and to the float64
gradients of the inputs themselves within bfloat16's rounding (2^-8 relative per operand); "float32",
given or omitted, keeps today's results bit for bit. The recurrent ops' bfloat16 runs are checked in
test_bf16_recurrent.py; any other value is refused naming the attribute, the value and the allowed ones.
"""

from __future__ import annotations

import numpy as np
import op_runner
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException
from test_bf16_gemm import _rounded
from test_conv_grad import ROWS, reference_conv_grad

_CONV_ROWS = [row for row in ROWS if row.id in ("2d_convlstm_cell", "2d_group2", "1d_stride2_pads", "3d_strides_pads")]


@pytest.mark.parametrize("row", _CONV_ROWS, ids=lambda row: row.id)
def test_conv_grad_bfloat16_matches_float64_on_rounded_inputs(row) -> None:
    inputs = {name: value.astype(np.float32) for name, value in row.inputs(seed=3).items()}
    got = op_runner.run("ConvGrad", inputs, {**row.attributes, "matmul_precision": "bfloat16"}, dtype=np.float32)
    rounded = {name: _rounded(value) for name, value in inputs.items()}
    exact = reference_conv_grad(rounded["dY"], rounded["X"], rounded["W"], row.attributes)
    magnitude = reference_conv_grad(*(np.abs(rounded[name]) for name in ("dY", "X", "W")), row.attributes)
    unrounded = reference_conv_grad(inputs["dY"], inputs["X"], inputs["W"], row.attributes)
    float32 = op_runner.run("ConvGrad", inputs, row.attributes, dtype=np.float32)
    terms = inputs["dY"].size + inputs["W"].size  # more than any one sum has
    for name in ("dX", "dW"):
        # float32 accumulation of exact products.
        bound = (terms + 2) * 2.0**-24 * magnitude[name] + 1e-30
        error = np.abs(got[name] - exact[name])
        assert (error <= bound).all(), f"{row.id} {name}: worst error/bound {np.max(error / bound):.3g}"
        # Against the unrounded inputs: each operand rounded by at most 2^-9 relative.
        assert (np.abs(got[name] - unrounded[name]) <= 2 * 2.0**-8 * magnitude[name] + bound).all()
        # And it is not float32: the rounding shows.
        assert not np.array_equal(got[name], float32[name]), f"{row.id} {name}"
    np.testing.assert_array_equal(got["dB"], float32["dB"])  # a sum, no GEMM: unchanged


def test_conv_grad_float32_given_or_omitted_is_bit_for_bit_today() -> None:
    row = _CONV_ROWS[0]
    inputs = {name: value.astype(np.float32) for name, value in row.inputs(seed=4).items()}
    omitted = op_runner.run("ConvGrad", inputs, row.attributes, dtype=np.float32)
    given = op_runner.run("ConvGrad", inputs, {**row.attributes, "matmul_precision": "float32"}, dtype=np.float32)
    for name in ("dX", "dW", "dB"):
        np.testing.assert_array_equal(given[name], omitted[name])


def _refusal(op: str, inputs: list[str], outputs: list[str], dtype: type, attributes: dict) -> str:
    with pytest.raises(RuntimeException) as error:
        op_runner.session(op, inputs, outputs, dtype, attributes)
    return str(error.value)


_CONV = ("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"])
_LSTM = ("LSTMTraining", ["X", "W", "R"], ["HAll", "Ht"])
_LSTM_GRAD = ("LSTMGrad", ["X", "W", "R", "HAll", "CAll", "IOFC", "grad_HAll"], ["dX", "dW", "dR"])
_GRU = ("GRUTraining", ["X", "W", "R"], ["HAll", "Ht"])


@pytest.mark.parametrize("op", [_CONV, _LSTM, _GRU], ids=lambda op: op[0])
def test_unknown_value_is_refused_naming_attribute_value_and_allowed(op) -> None:
    attributes = {} if op[0] == "ConvGrad" else {"hidden_size": 4}
    message = _refusal(*op, np.float32, {**attributes, "matmul_precision": "bf16"})
    expected = "attribute matmul_precision: expected float32 or bfloat16, got 'bf16'"
    assert f"{op[0]} node '{op[0]}_under_test': {expected}" in message


def test_conv_grad_bfloat16_refuses_float64() -> None:
    message = _refusal(*_CONV, np.float64, {"matmul_precision": "bfloat16"})
    assert "attribute matmul_precision: bfloat16 takes float32 tensors, got float64" in message
