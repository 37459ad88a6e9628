"""Peepholes through the ops: the train step's gradients of a standard ONNX LSTM with P.

torch's nn.LSTM has no peepholes, so no torch recording covers them. Instead a model is built by
hand, in float64: a standard ONNX ``LSTM`` whose W, R, B, P, initial_h and initial_c are all
initializers, a linear head reading Y (averaged over time), Y_h and Y_c, and an MSE loss that
``build_training_models`` appends. Every gradient of the ``gradients`` model (dP, dW, dR, dB,
d initial_h, d initial_c, and the head's) must equal central finite differences of the ``eval``
model's loss, element by element; one SGD step of the train step must move P by ``-lr * dP``.
Runs in onnxruntime (ORT's float64 kernels for the standard ops, ortlstm's for the LSTM).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from conftest import RNG_SEED

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.train_step import TrainingModels, build_training_models
from ortlstm.ops import session_options

SEQ_LENGTH, BATCH, INPUT_SIZE, HIDDEN_SIZE, OUTPUTS = 4, 3, 2, 3, 2
LSTM_PARAMS = ("W", "R", "B", "P", "initial_h", "initial_c")
PARAMS = (*LSTM_PARAMS, "head_weight", "head_bias")
EPSILON = 1e-6
# Central differences in float64 with step 1e-6: truncation ~1e-12, rounding ~1e-10.
RTOL, ATOL = 1e-6, 1e-8
LR = 0.1


def peephole_model(direction: str, rng: np.random.Generator) -> onnx.ModelProto:
    """X [T, N, I] -> LSTM (P, initial_h, initial_c as initializers) -> Gemm head -> prediction [N, OUTPUTS]."""
    d = 2 if direction == "bidirectional" else 1
    h = HIDDEN_SIZE

    def values(*shape: int, scale: float = 0.5) -> np.ndarray:
        return scale * rng.standard_normal(shape)

    initializers = {
        "W": values(d, 4 * h, INPUT_SIZE),
        "R": values(d, 4 * h, h),
        "B": values(d, 8 * h, scale=0.2),
        "P": values(d, 3 * h),  # large enough that the peepholes matter
        "initial_h": values(d, BATCH, h),
        "initial_c": values(d, BATCH, h),
        "head_weight": values(OUTPUTS, 3 * d * h),
        "head_bias": values(OUTPUTS, scale=0.1),
        "time_axis": np.asarray([0], dtype=np.int64),
        "features": np.asarray([BATCH, d * h], dtype=np.int64),
    }
    nodes = [
        onnx.helper.make_node(
            "LSTM",
            ["X", "W", "R", "B", "", "initial_h", "initial_c", "P"],
            ["Y", "Y_h", "Y_c"],
            hidden_size=h,
            direction=direction,
            name="lstm",
        ),
        onnx.helper.make_node("ReduceMean", ["Y", "time_axis"], ["Y_mean"], keepdims=0),  # [D, N, H]
        *(
            node
            for value in ("Y_mean", "Y_h", "Y_c")
            for node in (
                onnx.helper.make_node("Transpose", [value], [f"{value}_t"], perm=[1, 0, 2]),
                onnx.helper.make_node("Reshape", [f"{value}_t", "features"], [f"{value}_flat"]),
            )
        ),
        onnx.helper.make_node("Concat", ["Y_mean_flat", "Y_h_flat", "Y_c_flat"], ["hidden"], axis=1),
        onnx.helper.make_node("Gemm", ["hidden", "head_weight", "head_bias"], ["prediction"], transB=1),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "peepholes",
        [onnx.helper.make_tensor_value_info("X", onnx.TensorProto.DOUBLE, [SEQ_LENGTH, BATCH, INPUT_SIZE])],
        [onnx.helper.make_tensor_value_info("prediction", onnx.TensorProto.DOUBLE, [BATCH, OUTPUTS])],
        [onnx.numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(
        model.SerializeToString(), session_options(intra_op_num_threads=1), providers=["CPUExecutionProvider"]
    )


class Case:
    """One model, its training models and a batch."""

    def __init__(self, direction: str, optimizer: optimizers.Optimizer):
        rng = np.random.default_rng(RNG_SEED)
        self.model = peephole_model(direction, rng)
        self.built: TrainingModels = build_training_models(
            self.model, loss=losses.Loss.mse_loss(), optimizer=optimizer, requires_grad=PARAMS
        )
        signature = self.built.signature
        self.batch = {
            "X": rng.standard_normal((SEQ_LENGTH, BATCH, INPUT_SIZE)),
            signature.target: rng.standard_normal((BATCH, OUTPUTS)),
        }
        self.params = dict(self.built.initial_params)

    def gradients(self) -> tuple[float, dict[str, np.ndarray]]:
        """The gradients model's loss and every parameter's gradient."""
        signature = self.built.signature
        grad_outputs = [signature.grads[name] for name in signature.params]
        loss, *grads = session(self.built.gradients).run([signature.loss, *grad_outputs], {**self.batch, **self.params})
        return float(loss), dict(zip(signature.params, grads, strict=True))

    def finite_differences(self) -> dict[str, np.ndarray]:
        """Central differences of the eval model's loss, for every element of every parameter."""
        evaluate = session(self.built.eval)
        loss_name = self.built.signature.loss

        def loss(params: dict[str, np.ndarray]) -> float:
            return float(evaluate.run([loss_name], {**self.batch, **params})[0])

        result = {}
        for name, value in self.params.items():
            grad = np.zeros_like(value)
            for index in np.ndindex(value.shape):
                shifted = {sign: value.copy() for sign in (1, -1)}
                for sign, array in shifted.items():
                    array[index] += sign * EPSILON
                grad[index] = (loss({**self.params, name: shifted[1]}) - loss({**self.params, name: shifted[-1]})) / (
                    2 * EPSILON
                )
            result[name] = grad
        return result


DIRECTIONS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gradients_equal_finite_differences(direction: str) -> None:
    case = Case(direction, optimizers.SGD(lr=LR))
    assert case.built.prepared.converted, "the standard LSTM was not converted to LSTMTraining"
    assert all(value.dtype == np.float64 for value in case.params.values())
    eval_loss = float(session(case.built.eval).run([case.built.signature.loss], {**case.batch, **case.params})[0])
    loss, grads = case.gradients()
    assert loss == pytest.approx(eval_loss, rel=1e-14)
    expected = case.finite_differences()
    for name in PARAMS:
        assert grads[name].shape == case.params[name].shape, name
        assert np.max(np.abs(expected[name])) > 1e-3, f"{name}: the loss hardly depends on it"
        np.testing.assert_allclose(grads[name], expected[name], rtol=RTOL, atol=ATOL, err_msg=f"d{name} ({direction})")


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_sgd_step_moves_p_by_minus_lr_times_its_gradient(direction: str) -> None:
    case = Case(direction, optimizers.SGD(lr=LR))
    signature = case.built.signature
    _, grads = case.gradients()
    feeds = {
        **case.batch,
        **case.params,
        signature.lr: np.asarray(LR, dtype=np.float64),
        signature.step: np.asarray(1, dtype=np.int64),
    }
    new_params = dict(
        zip(signature.params, session(case.built.train_step).run(list(signature.new_params), feeds), strict=True)
    )
    for name in LSTM_PARAMS:
        np.testing.assert_allclose(
            new_params[name], case.params[name] - LR * grads[name], rtol=1e-15, atol=1e-15, err_msg=name
        )
    assert np.max(np.abs(new_params["P"] - case.params["P"])) > 1e-4
