"""RNNTraining and RNNGrad in ``ortlstm.reference`` (onnx's ReferenceEvaluator), against the kernels.

The reference's math (``ortlstm.reference_rnn``) is checked in tests/test_rnn_ops.py against
onnxruntime's RNN, and the kernels there against float64 finite differences. Here the
ReferenceEvaluator runs an RNNTraining -> RNNGrad model with ``ortlstm.reference.OPS`` against
onnxruntime running the same model with the kernel library, float32 and float64, for every
configuration of tests/test_rnn_ops.py, and an empty sequence or batch; refusals name the input.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator
from test_reference_gru import RTOL, _chained_model, _weights
from test_rnn_ops import EVERY, _attributes, _id, _inputs

import ortlstm.ops
import ortlstm.reference
from ortlstm.ops import schema
from ortlstm.reference_rnn import rnn_grad_op, rnn_training, rnn_training_op


def _compare(model: object, feeds: dict[str, np.ndarray], dtype: type, rtol: float) -> list[np.ndarray]:
    expected = ReferenceEvaluator(model, new_ops=ortlstm.reference.OPS).run(None, feeds)
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )
    for output, want, got in zip(model.graph.output, expected, session.run(None, feeds), strict=True):
        assert want.dtype == got.dtype == dtype and want.shape == got.shape, output.name
        scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=output.name)
    return expected


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("config", EVERY, ids=_id)
def test_evaluator_matches_the_kernels(config: dict, dtype: type) -> None:
    attributes = _attributes(config)
    inputs = _inputs(str(config.get("direction", "forward")), seed=12, layout=int(config.get("layout", 0)))
    present = [port.name for port in schema.RNN_TRAINING.inputs if inputs.get(port.name) is not None]
    weights = _weights({name: value.shape for name, value in rnn_training(inputs, **attributes).items()})
    feeds = {name: inputs[name] if name == "sequence_lens" else np.asarray(inputs[name], dtype) for name in present}
    feeds["grad_HAll"], feeds["grad_Ht"] = (np.asarray(weights[name], dtype) for name in ("HAll", "Ht"))
    _compare(_chained_model(attributes, present, dtype, schema.RNN_GRAD), feeds, dtype, RTOL[dtype])


@pytest.mark.parametrize(("steps", "batch"), [(0, 2), (3, 0)])
def test_evaluator_matches_the_kernels_on_empty_inputs(steps: int, batch: int) -> None:
    rng = np.random.default_rng(13)
    hidden, size = 2, 3
    feeds = {
        "X": rng.standard_normal((steps, batch, size)),
        "W": rng.standard_normal((1, hidden, size)),
        "R": rng.standard_normal((1, hidden, hidden)),
        "initial_h": rng.standard_normal((1, batch, hidden)),
        "grad_HAll": rng.standard_normal((steps, 1, batch, hidden)),
        "grad_Ht": rng.standard_normal((1, batch, hidden)),
    }
    model = _chained_model({"hidden_size": hidden}, ["X", "W", "R", "initial_h"], np.float64, schema.RNN_GRAD)
    expected = _compare(model, feeds, np.float64, 1e-12)
    if steps == 0:  # nothing ran: Ht is zero (not initial_h), initial_h gets no gradient
        names = [output.name for output in model.graph.output]
        assert not expected[names.index("Ht")].any() and not expected[names.index("dH0")].any()


def test_reference_refusals_name_the_input() -> None:
    inputs = {"X": np.zeros((2, 1, 3)), "W": np.zeros((1, 2, 3)), "R": np.zeros((1, 3, 2))}  # hidden_size 2
    with pytest.raises(ValueError, match=r"R: expected \[num_directions=1, hidden_size=2, hidden_size=2\], got"):
        rnn_training_op(inputs, hidden_size=2)
    with pytest.raises(ValueError, match=r"activations: expected 1\*num_directions=1 names \(f per direction\)"):
        rnn_training_op({**inputs, "R": inputs["R"][:, :2]}, hidden_size=2, activations=["Tanh", "Relu"])
    with pytest.raises(ValueError, match="activation_alpha: RNNGrad needs alpha >= 0 for LeakyRelu as f"):
        rnn_grad_op(
            {**inputs, "R": inputs["R"][:, :2], "HAll": np.zeros((2, 1, 1, 2))},
            hidden_size=2,
            activations=["LeakyRelu"],
            activation_alpha=[-0.5],
        )
