"""GRUTraining and GRUGrad in ``ortlstm.reference`` (onnx's ReferenceEvaluator), against real oracles.

- GRUGrad of the reference (``ortlstm.reference_gru.gru_grad``, which reads the ZRH stash) against
  float64 central finite differences of the reference's own forward, which recomputes every step
  from the inputs: the two share no gradient code.
- The ReferenceEvaluator running a GRUTraining -> GRUGrad model with ``ortlstm.reference.OPS``
  against onnxruntime running the same model with the kernel library, float32 and float64, for
  every configuration of tests/test_gru_ops.py (the kernels are checked there against onnxruntime's
  GRU and finite differences of their own).
- Refusals of the reference name the input or attribute, as the kernels' do.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort
import op_runner
import pytest
from lstm_helpers import central_difference
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_gru_ops import BASIC, EVERY, _attributes, _id, _inputs

import ortlstm.ops
import ortlstm.reference
from ortlstm.ops import schema
from ortlstm.reference_gru import gru_grad, gru_grad_op, gru_training, gru_training_op

FD_STEP = 1e-6
FD_REL_ERROR = 1e-7  # ||stash gradient - central differences|| / ||central differences||, float64
RTOL = {np.float32: 2e-5, np.float64: 1e-10}  # reference vs kernel, relative to each output's largest value
GRAD_OF = {"dX": "X", "dW": "W", "dR": "R", "dB": "B", "dH0": "initial_h"}
FD_CONFIGS = [
    *BASIC,
    {"linear_before_reset": 1, "direction": "bidirectional", "layout": 1},
    {"linear_before_reset": 0, "activations": ["HardSigmoid", "LeakyRelu"], "activation_alpha": [0.3, 0.1]},
    {"linear_before_reset": 1, "activations": ["Sigmoid", "Softsign"], "clip": 0.7},
]


def _weights(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {name: rng.standard_normal(shapes[name]) for name in ("HAll", "Ht")}


@pytest.mark.parametrize("config", FD_CONFIGS, ids=_id)
def test_reference_gradients_equal_finite_differences(config: dict) -> None:
    attributes = _attributes(config)
    inputs = _inputs(str(config.get("direction", "forward")), seed=11, layout=int(config.get("layout", 0)))
    forward = gru_training(inputs, **attributes)
    weights = _weights({name: value.shape for name, value in forward.items()})

    values = {name: None if value is None else np.array(value, np.float64) for name, value in inputs.items()}

    def loss() -> float:  # reads ``values``, which central_difference perturbs in place
        out = gru_training(values, **attributes)
        return float(np.sum(out["HAll"] * weights["HAll"]) + np.sum(out["Ht"] * weights["Ht"]))

    stash = {"HAll": forward["HAll"], "ZRH": forward["ZRH"]}
    grads = gru_grad({**inputs, **stash, "grad_HAll": weights["HAll"], "grad_Ht": weights["Ht"]}, **attributes)
    for grad_name, input_name in GRAD_OF.items():
        numeric = central_difference(loss, values[input_name], FD_STEP)
        error = np.linalg.norm(grads[grad_name] - numeric) / np.linalg.norm(numeric)
        assert error < FD_REL_ERROR, f"{grad_name}: relative error {error:.2e}"


def _chained_model(
    attributes: Mapping[str, object], present: list[str], dtype: type, gradient: schema.OpSpec = schema.GRU_GRAD
) -> object:
    """GRUTraining feeding GRUGrad (or another cell's pair, by ``gradient``) in one graph.

    The graph outputs the forward outputs and every gradient.
    """
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    training = schema.op_by_name(str(gradient.gradient_of))
    forward_outputs = schema.output_names(training)
    grad_inputs = [*present, *forward_outputs[:1], *forward_outputs[2:], "grad_HAll", "grad_Ht"]
    grad_outputs = schema.output_names(gradient)
    nodes = [
        ortlstm.ops.make_node(training.name, {n: n for n in present}, {n: n for n in forward_outputs}, **attributes),
        ortlstm.ops.make_node(gradient.name, {n: n for n in grad_inputs}, {n: n for n in grad_outputs}, **attributes),
    ]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT32 if name == "sequence_lens" else elem, None)
        for name in (*present, "grad_HAll", "grad_Ht")
    ]
    outputs = [helper.make_tensor_value_info(name, elem, None) for name in (*forward_outputs, *grad_outputs)]
    graph = helper.make_graph(nodes, f"{training.name}_chained", inputs, outputs)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", op_runner.ONNX_OPSET), helper.make_opsetid(schema.DOMAIN, 1)],
        ir_version=op_runner.IR_VERSION,
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("config", EVERY, ids=_id)
def test_evaluator_matches_the_kernels(config: dict, dtype: type) -> None:
    attributes = _attributes(config)
    inputs = _inputs(str(config.get("direction", "forward")), seed=12, layout=int(config.get("layout", 0)))
    present = [port.name for port in schema.GRU_TRAINING.inputs if inputs.get(port.name) is not None]
    shapes = {name: value.shape for name, value in gru_training(inputs, **attributes).items()}
    feeds = {
        name: value if name == "sequence_lens" else np.asarray(value, dtype)
        for name, value in {**{n: inputs[n] for n in present}, **_weights(shapes)}.items()
        if name in (*present, "HAll", "Ht")
    }
    feeds["grad_HAll"], feeds["grad_Ht"] = feeds.pop("HAll"), feeds.pop("Ht")
    model = _chained_model(attributes, present, dtype)
    names = [output.name for output in model.graph.output]
    expected = ReferenceEvaluator(model, new_ops=ortlstm.reference.OPS).run(None, feeds)
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )
    actual = session.run(None, feeds)
    for name, want, got in zip(names, expected, actual, strict=True):
        assert want.dtype == got.dtype == dtype, name
        scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
        np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=RTOL[dtype] * scale, err_msg=name)


def test_reference_refusals_name_the_input() -> None:
    inputs = {"X": np.zeros((2, 1, 3)), "W": np.zeros((1, 6, 3)), "R": np.zeros((1, 6, 3))}  # hidden_size 2
    with pytest.raises(ValueError, match=r"R: expected \[num_directions=1, 3\*hidden_size=6, hidden_size=2\], got"):
        gru_training_op(inputs, hidden_size=2)
    with pytest.raises(ValueError, match="W: expected element type float64"):
        gru_training_op({**inputs, "W": inputs["W"].astype(np.float32), "R": inputs["R"][..., :2]}, hidden_size=2)
    stash = {"HAll": np.zeros((2, 1, 1, 2)), "ZRH": np.zeros((2, 1, 1, 6))}
    with pytest.raises(ValueError, match="activation_alpha: GRUGrad needs alpha >= 0 for LeakyRelu as g"):
        gru_grad_op(
            {**inputs, "R": inputs["R"][..., :2], **stash},
            hidden_size=2,
            activations=["Sigmoid", "LeakyRelu"],
            activation_alpha=[-0.5],
        )


@pytest.mark.parametrize(("steps", "batch"), [(0, 2), (3, 0)])
def test_evaluator_matches_the_kernels_on_empty_inputs(steps: int, batch: int) -> None:
    """An empty sequence or batch gives empty or zero outputs and gradients, as the kernels give."""
    rng = np.random.default_rng(13)
    hidden, size = 2, 3
    feeds = {
        "X": rng.standard_normal((steps, batch, size)),
        "W": rng.standard_normal((1, 3 * hidden, size)),
        "R": rng.standard_normal((1, 3 * hidden, hidden)),
        "initial_h": rng.standard_normal((1, batch, hidden)),
        "grad_HAll": rng.standard_normal((steps, 1, batch, hidden)),
        "grad_Ht": rng.standard_normal((1, batch, hidden)),
    }
    model = _chained_model({"hidden_size": hidden}, ["X", "W", "R", "initial_h"], np.float64)
    expected = ReferenceEvaluator(model, new_ops=ortlstm.reference.OPS).run(None, feeds)
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )
    for output, want, got in zip(model.graph.output, expected, session.run(None, feeds), strict=True):
        assert want.shape == got.shape, output.name
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=output.name)
    if steps == 0:  # nothing ran: Ht is zero (not initial_h), initial_h gets no gradient
        names = [output.name for output in model.graph.output]
        assert not expected[names.index("Ht")].any() and not expected[names.index("dH0")].any()
