"""Helpers shared by the oracle tests and the kernel tests.

onnxruntime's standard ``LSTM`` (the float32 ground truth), the comparison used everywhere
(``assert_close``), absent optional inputs made explicit so they can be perturbed, the oracle's
view of a config's attributes, and the linear-activation variant of a config. Nothing here
imports the kernels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from configs import LstmConfig
from onnx import TensorProto, helper
from reference.lstm_ref import linear_activation_attributes, parse_activations

# LSTM last changed in opset 14 (layout) before 22; onnxruntime 1.19 (the training build)
# refuses models stamped with opset 22, so the models use the newest opset both runtimes load.
OPSET = 21
IR_VERSION = 10
LSTM_INPUT_NAMES = [port.name for port in onnx.defs.get_schema("LSTM", OPSET).inputs]
LSTM_OUTPUT_NAMES = [port.name for port in onnx.defs.get_schema("LSTM", OPSET).outputs]

# Beyond the table's tiny sizes, for the tests marked slow: several BLAS tiles with tails, and
# (LARGE_CONFIG) enough rows that BLAS blocks and threads the GEMMs.
MEDIUM_CONFIG = LstmConfig(
    7,
    5,
    9,
    11,
    "bidirectional",
    peephole=True,
    initial_h=True,
    initial_c=True,
    sequence_lens=(7, 0, 3, 6, 1),
    clip=1.3,
    layout=1,
)
# With two threads the kernels split the time loop in one of two ways (SplitTimeLoop in
# kernels_cpp/lstm/lstm_math.h). BLOCKED_CONFIGS: fewer than 16 batch entries but enough recurrent
# work per step (batch_size*4*hidden_size*hidden_size >= 2**18 multiply-adds with AVX-512, 2**16
# without: MinBlockWork in lstm_math.h) that each step is cut into two blocks of hidden units, with
# block-major reordered weights; hidden_size 67 splits unevenly. GROUPED_CONFIGS: 16 or more
# batch entries, so each task takes a group of entries for all steps; 17 splits unevenly. (Small
# configs run in one task, and there a bidirectional LSTM runs its two directions as the parallel
# tasks instead.) The last two of each take the fused default-cell path (float32): bidirectional,
# where LSTMGrad runs the directions one after the other, and reverse with layout 0 and full
# sequences, where dR reads H_{t-1} from HAll.


def _split_configs(batch_size: int, hidden_size: int) -> tuple[LstmConfig, ...]:
    return (
        LstmConfig(
            4,
            batch_size,
            7,
            hidden_size,
            "forward",
            peephole=True,
            initial_h=True,
            initial_c=True,
            clip=3.0,
            sequence_lens=(4, 0, 2, *([3] * (batch_size - 3))),
        ),
        LstmConfig(3, batch_size, 5, hidden_size, "reverse", initial_c=True, input_forget=1, layout=1),
        LstmConfig(3, batch_size, 6, hidden_size, "bidirectional", initial_h=True, initial_c=True),
        LstmConfig(4, batch_size, 5, hidden_size, "reverse", initial_h=True),
    )


BLOCKED_CONFIGS = _split_configs(15, 67)
GROUPED_CONFIGS = _split_configs(17, 13)
# Enough rows (seq_length * batch_size > 512, layout 0) that LSTMGrad keeps its gate gradients in
# several windows of steps and adds each window's share of dW, dR, dX and dP in turn, the first four
# with groups of batch entries: forward with peepholes (dP across windows; dR from HAll with
# initial_h in the first window processed), reverse (initial_h in the last window), the default
# cell (float32 fused path), and bidirectional with padded sequences (the directions one after
# the other, dR from a copy of H_{t-1}); the last with blocks of hidden units, bidirectional.
WINDOWED_CONFIGS = (
    LstmConfig(20, 40, 3, 5, "forward", peephole=True, initial_h=True, initial_c=True),
    LstmConfig(19, 48, 4, 6, "reverse", initial_h=True),
    LstmConfig(21, 40, 3, 5),
    LstmConfig(12, 64, 3, 33, "bidirectional", initial_h=True, sequence_lens=tuple(12 - i % 13 for i in range(64))),
    LstmConfig(37, 15, 3, 67, "bidirectional", initial_c=True, sequence_lens=tuple(37 - 2 * i for i in range(15))),
)
# Every config above: each way the kernels split work over threads.
SPLIT_CONFIGS = (*BLOCKED_CONFIGS, *GROUPED_CONFIGS, *WINDOWED_CONFIGS)
LARGE_CONFIG = LstmConfig(
    24, 48, 96, 64, "bidirectional", peephole=True, initial_h=True, initial_c=True, clip=2.0, layout=1
)


def slow(config: LstmConfig) -> object:
    """A ``pytest.param`` of ``config`` marked slow, with the config's id."""
    return pytest.param(config, marks=pytest.mark.slow, id=config.id)


# Gradient output of LSTMGrad -> the LSTMTraining input it differentiates.
GRADIENT_OF = {"dX": "X", "dW": "W", "dR": "R", "dB": "B", "dH0": "initial_h", "dC0": "initial_c", "dP": "P"}


# ---------------------------------------------------------------------------------------------
# onnxruntime's LSTM


def lstm_model(present: list[str], attributes: dict, elem_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One standard LSTM node; ``present`` lists the inputs that are fed, the rest are absent."""
    node_inputs = [name if name in present else "" for name in LSTM_INPUT_NAMES]
    while node_inputs[-1] == "":
        node_inputs.pop()
    graph_inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT32 if name == "sequence_lens" else elem_type, None)
        for name in LSTM_INPUT_NAMES
        if name in present
    ]
    graph_outputs = [helper.make_tensor_value_info(name, elem_type, None) for name in LSTM_OUTPUT_NAMES]
    node = helper.make_node("LSTM", node_inputs, LSTM_OUTPUT_NAMES, **attributes)
    graph = helper.make_graph([node], "lstm", graph_inputs, graph_outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A single-threaded, unoptimised CPU session (no fusion hides what the node computes)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class OrtLstm:
    """onnxruntime's LSTM for one config, in float32, any seq_length.

    Feeds and results use the config's layout; layout 1 goes through transposes because ORT's
    CPU LSTM rejects layout=1.
    """

    def __init__(self, config: LstmConfig, inputs: dict[str, np.ndarray | None]):
        self.layout = config.layout
        self.present = [name for name in LSTM_INPUT_NAMES if inputs[name] is not None]
        attributes = {name: value for name, value in config.attributes().items() if name != "layout"}
        self.session = ort_session(lstm_model(self.present, attributes))

    def run(self, inputs: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """Y, Y_h, Y_c under the LSTMTraining names HAll, Ht, Ct."""
        feeds = {}
        for name in self.present:
            value = inputs[name]
            if name == "sequence_lens":
                feeds[name] = value.astype(np.int32)
                continue
            if self.layout == 1 and name in ("X", "initial_h", "initial_c"):
                value = value.transpose(1, 0, 2)
            feeds[name] = np.ascontiguousarray(value, dtype=np.float32)
        Y, Y_h, Y_c = self.session.run(None, feeds)
        if self.layout == 1:
            Y, Y_h, Y_c = Y.transpose(2, 0, 1, 3), Y_h.transpose(1, 0, 2), Y_c.transpose(1, 0, 2)
        return {"HAll": Y, "Ht": Y_h, "Ct": Y_c}


# ---------------------------------------------------------------------------------------------
# Comparisons and inputs


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float, what: str) -> None:
    """Elementwise, with the absolute tolerance scaled by the largest expected magnitude."""
    assert actual.shape == expected.shape, f"{what}: expected shape {expected.shape}, got {actual.shape}"
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale, err_msg=what)


def materialised(config: LstmConfig, inputs: dict[str, np.ndarray | None]) -> dict[str, np.ndarray | None]:
    """Absent B, initial_h, initial_c, P as explicit zeros, so they can be perturbed."""
    hidden_size, num_directions, batch_size = config.hidden_size, config.num_directions, config.batch_size
    state_shape = (
        (num_directions, batch_size, hidden_size) if config.layout == 0 else (batch_size, num_directions, hidden_size)
    )
    zeros = {
        "B": np.zeros((num_directions, 8 * hidden_size)),
        "initial_h": np.zeros(state_shape),
        "initial_c": np.zeros(state_shape),
        "P": np.zeros((num_directions, 3 * hidden_size)),
    }
    return {name: zeros[name] if value is None and name in zeros else value for name, value in inputs.items()}


def _float32(value: float) -> float:
    return float(np.float32(value))


def _uses_parameters(name: str) -> tuple[bool, bool]:
    """Whether activation ``name`` takes a value from activation_alpha / activation_beta."""
    probe = 1234.5  # no activation's default
    f_act = parse_activations([name] * 3, [probe], [probe], 1)[0][0]
    return f_act.alpha == probe, f_act.beta == probe


def oracle_attributes(config: LstmConfig) -> dict:
    """The config's attributes as a kernel reads them: clip, alpha and beta rounded to float32.

    ONNX float attributes are float32, and so are onnxruntime's activation defaults (0.01f for
    LeakyRelu, ...); the oracle fed float64 literals differs from any kernel by about 1e-8. So
    every activation's alpha and beta, defaults included, is resolved and passed explicitly.
    """
    attributes = config.attributes()
    if "clip" in attributes:
        attributes["clip"] = _float32(attributes["clip"])
    resolved = parse_activations(
        config.activations, config.activation_alpha, config.activation_beta, config.num_directions
    )
    alphas, betas = [], []
    for activation in (activation for direction in resolved for activation in direction):
        uses_alpha, uses_beta = _uses_parameters(activation.name)
        if uses_alpha:
            alphas.append(_float32(activation.alpha))
        if uses_beta:
            betas.append(_float32(activation.beta))
    attributes["activations"] = [activation.name for direction in resolved for activation in direction]
    attributes["activation_alpha"] = alphas
    attributes["activation_beta"] = betas
    return attributes


def linear_variant(config: LstmConfig) -> LstmConfig:
    """The config with f, g and h all the identity (the oracle's linear-activation mode)."""
    linear = linear_activation_attributes(config.num_directions)
    return dataclasses.replace(
        config,
        activations=tuple(linear["activations"]),
        activation_alpha=tuple(linear["activation_alpha"]),
        activation_beta=tuple(linear["activation_beta"]),
        tag="linear",
    )


FINITE_DIFFERENCE_STEP = 1e-5


def central_difference(
    loss: Callable[[], float], value: np.ndarray, step: float = FINITE_DIFFERENCE_STEP
) -> np.ndarray:
    """Numerical gradient of ``loss`` w.r.t. ``value``, perturbed in place one element at a time."""
    gradient = np.zeros_like(value)
    for index in np.ndindex(value.shape):
        original = value[index]
        value[index] = original + step
        loss_plus = loss()
        value[index] = original - step
        loss_minus = loss()
        value[index] = original
        gradient[index] = (loss_plus - loss_minus) / (2 * step)
    return gradient
