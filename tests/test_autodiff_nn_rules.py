"""Gradient rules of activations, softmax, losses, dropout, normalizations and LSTMTraining.

One table of cases, checked like tests/test_autodiff_rules.py: central finite differences in
float64, and float32 (graph optimizations on and off) against the float64 gradients, all in
onnxruntime (see tests/gradcheck.py). Random inputs keep clear of kinks (Relu and its kin near 0,
HardSigmoid near its clip points, LSTM gates near their clip bound). Training-mode Dropout draws a
new mask every run, so finite differences do not apply: its gradient is checked exactly against
the mask of the same run. Elu, Softplus, HardSigmoid and InstanceNormalization have no float64
kernel in onnxruntime: their float64 rows run a float64 rewrite of the op (``Case.float64_forward``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from configs import LstmConfig, sample_inputs
from gradcheck import (
    OMITTED,
    Case,
    Input,
    build,
    check_case,
    check_case_float32,
    clear_of,
    const,
    fed,
    runs_opset,
    wrt,
)
from onnx import TensorProto, helper

import ortlstm.ops
from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types, onnx_opset
from ortlstm.graphs.emit.emitter import used_names

_RNG = np.random.default_rng(12)


def _r(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape)


def _clear_of(points: Sequence[float], *shape: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """Uniform values at least 0.1 away from each of ``points`` (the kinks of the op under test)."""
    return clear_of(_RNG, points, *shape, low=low, high=high)


def _positive(*shape: int) -> np.ndarray:
    return _RNG.uniform(0.5, 1.5, shape)


def _labels(classes: int, *shape: int, ignore: int | None = None, dtype: type = np.int64) -> Input:
    """Class labels fed at run time; with ``ignore``, the first and one more entry equal it."""
    labels = _RNG.integers(0, classes, shape)
    if ignore is not None:
        flat = labels.reshape(-1)
        flat[0] = flat[-2] = ignore
    return fed(labels, dtype=dtype)


# ---- float64 rewrites of ops onnxruntime runs in float32 only -------------------------------------


def _attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    found = [attribute for attribute in node.attribute if attribute.name == name]
    return float(helper.get_attribute_value(found[0])) if found else default


def _scalars(**values: float) -> list[onnx.NodeProto]:
    return [
        helper.make_node(
            "Constant", [], [f"f64/{name}"], value=helper.make_tensor(f"f64/{name}", TensorProto.DOUBLE, [], [value])
        )
        for name, value in values.items()
    ]


def _elu64(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    (x,), (y,) = node.input, node.output
    return [
        *_scalars(alpha=_attribute(node, "alpha", 1.0), zero=0.0, one=1.0),
        helper.make_node("Exp", [x], ["f64/exp"]),
        helper.make_node("Sub", ["f64/exp", "f64/one"], ["f64/expm1"]),
        helper.make_node("Mul", ["f64/alpha", "f64/expm1"], ["f64/negative_branch"]),
        helper.make_node("Less", [x, "f64/zero"], ["f64/negative"]),
        helper.make_node("Where", ["f64/negative", "f64/negative_branch", x], [y]),
    ]


def _softplus64(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    (x,), (y,) = node.input, node.output
    return [
        *_scalars(one=1.0),
        helper.make_node("Exp", [x], ["f64/exp"]),
        helper.make_node("Add", ["f64/exp", "f64/one"], ["f64/sum"]),
        helper.make_node("Log", ["f64/sum"], [y]),
    ]


def _hard_sigmoid64(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    (x,), (y,) = node.input, node.output
    return [
        *_scalars(alpha=_attribute(node, "alpha", 0.2), beta=_attribute(node, "beta", 0.5), zero=0.0, one=1.0),
        helper.make_node("Mul", ["f64/alpha", x], ["f64/scaled"]),
        helper.make_node("Add", ["f64/scaled", "f64/beta"], ["f64/linear"]),
        helper.make_node("Min", ["f64/linear", "f64/one"], ["f64/below_one"]),
        helper.make_node("Max", ["f64/below_one", "f64/zero"], [y]),
    ]


def _instance_normalization64(node: onnx.NodeProto, rank: int) -> list[onnx.NodeProto]:
    (x, scale, bias), (y,) = node.input, node.output
    spatial, channel_axes = list(range(2, rank)), list(range(1, rank - 1))
    return [
        *_scalars(epsilon=_attribute(node, "epsilon", 1e-5)),
        helper.make_node(
            "Constant",
            [],
            ["f64/channel_axes"],
            value=helper.make_tensor("a", TensorProto.INT64, [rank - 2], channel_axes),
        ),
        helper.make_node("ReduceMean", [x], ["f64/mean"], axes=spatial),
        helper.make_node("Sub", [x, "f64/mean"], ["f64/centered"]),
        helper.make_node("Mul", ["f64/centered", "f64/centered"], ["f64/squared"]),
        helper.make_node("ReduceMean", ["f64/squared"], ["f64/variance"], axes=spatial),
        helper.make_node("Add", ["f64/variance", "f64/epsilon"], ["f64/shifted"]),
        helper.make_node("Sqrt", ["f64/shifted"], ["f64/std"]),
        helper.make_node("Div", ["f64/centered", "f64/std"], ["f64/normalized"]),
        helper.make_node("Unsqueeze", [scale, "f64/channel_axes"], ["f64/scale"]),
        helper.make_node("Unsqueeze", [bias, "f64/channel_axes"], ["f64/bias"]),
        helper.make_node("Mul", ["f64/normalized", "f64/scale"], ["f64/scaled"]),
        helper.make_node("Add", ["f64/scaled", "f64/bias"], [y]),
    ]


# ---- LSTMTraining rows --------------------------------------------------------------------------


def _lstm(
    case_id: str,
    config: LstmConfig,
    *,
    differentiate: Sequence[str] | None = None,
    loss_outputs: tuple[int, ...] = (0, 1, 2),
    dynamic: bool = False,
) -> Case:
    """An LSTMTraining row, its inputs drawn clear of kinks and clip bounds.

    Every present float input is differentiated (or those in ``differentiate``); the loss reads
    HAll, Ht, Ct (or ``loss_outputs``), never the CAll/IOFC stash.
    """
    values = sample_inputs(config, np.random.default_rng(len(case_id)))
    inputs = []
    for port in ortlstm.ops.schema.LSTM_TRAINING.inputs:
        value = values[port.name]
        if value is None:
            inputs.append(OMITTED)
        elif not port.differentiable:
            inputs.append(fed(value, dtype=np.int32, dynamic=dynamic))
        elif differentiate is None or port.name in differentiate:
            inputs.append(wrt(value, dynamic=dynamic))
        else:
            inputs.append(fed(value, dynamic=dynamic))
    while inputs[-1] is OMITTED:
        inputs.pop()
    return Case(
        case_id,
        "LSTMTraining",
        tuple(inputs),
        ortlstm.ops.lstm_attributes(**config.attributes()),
        domain=ortlstm.ops.DOMAIN,
        num_outputs=5,
        loss_outputs=loss_outputs,
    )


_FULL = {"peephole": True, "initial_h": True, "initial_c": True}

LSTM_CASES = [
    _lstm("LSTMTraining_forward_all_inputs", LstmConfig(3, 2, 2, 2, **_FULL)),
    _lstm("LSTMTraining_reverse_lens", LstmConfig(3, 2, 2, 2, "reverse", sequence_lens=(3, 1), **_FULL)),
    _lstm(
        "LSTMTraining_bidirectional_lens_clip",
        LstmConfig(2, 2, 2, 2, "bidirectional", sequence_lens=(2, 1), clip=0.9, **_FULL),
    ),
    _lstm(
        "LSTMTraining_bidirectional_layout1",
        LstmConfig(3, 2, 2, 2, "bidirectional", initial_h=True, initial_c=True, sequence_lens=(1, 3), layout=1),
    ),
    _lstm("LSTMTraining_input_forget", LstmConfig(3, 2, 2, 2, peephole=True, initial_c=True, input_forget=1)),
    _lstm(
        "LSTMTraining_activations_alpha_beta",
        LstmConfig(
            2,
            2,
            2,
            3,
            "reverse",
            initial_h=True,
            activations=("Sigmoid", "Softsign", "ScaledTanh"),
            activation_alpha=(1.3,),
            activation_beta=(0.8,),
        ),
    ),
    _lstm("LSTMTraining_dynamic", LstmConfig(3, 2, 2, 2, sequence_lens=(2, 3), **_FULL), dynamic=True),
    _lstm("LSTMTraining_Ht_only_W_R", LstmConfig(3, 2, 2, 2, **_FULL), differentiate=("W", "R"), loss_outputs=(1,)),
    _lstm(
        "LSTMTraining_HAll_only_zero_length",
        LstmConfig(3, 2, 2, 2, initial_h=True, sequence_lens=(3, 0)),
        loss_outputs=(0,),
    ),
    _lstm("LSTMTraining_Ct_only_no_bias", LstmConfig(2, 2, 2, 2, bias=False, initial_c=True), loss_outputs=(2,)),
]

# ---- the table ----------------------------------------------------------------------------------

_WEIGHTS = _positive(3)

CASES = [
    # Activations.
    Case("Sigmoid", "Sigmoid", (wrt(_r(2, 5)),)),
    Case("Sigmoid_dynamic", "Sigmoid", (wrt(_r(2, 3), dynamic=True),)),
    Case("Relu", "Relu", (wrt(_clear_of([0.0], 3, 4)),)),
    Case("Relu_dynamic", "Relu", (wrt(_clear_of([0.0], 2, 3), dynamic=True),)),
    Case("LeakyRelu_default_alpha", "LeakyRelu", (wrt(_clear_of([0.0], 3, 4)),)),
    Case("LeakyRelu_alpha", "LeakyRelu", (wrt(_clear_of([0.0], 3, 4)),), {"alpha": 0.3}),
    Case("Elu_default_alpha", "Elu", (wrt(_clear_of([0.0], 3, 4)),), float64_forward=_elu64),
    Case(
        "Elu_alpha_dynamic", "Elu", (wrt(_clear_of([0.0], 2, 3), dynamic=True),), {"alpha": 0.6}, float64_forward=_elu64
    ),
    Case("Softplus", "Softplus", (wrt(_r(3, 4)),), float64_forward=_softplus64),
    Case(
        "HardSigmoid_default",
        "HardSigmoid",
        (wrt(_clear_of([-2.5, 2.5], 3, 4, low=-4.0, high=4.0)),),
        float64_forward=_hard_sigmoid64,
    ),
    Case(
        "HardSigmoid_alpha_beta",
        "HardSigmoid",
        (wrt(_clear_of([-4 / 3, 2.0], 3, 4, low=-3.0, high=3.0)),),
        {"alpha": 0.3, "beta": 0.4},
        float64_forward=_hard_sigmoid64,
    ),
    Case("PRelu_slope_per_channel", "PRelu", (wrt(_clear_of([0.0], 2, 3, 4)), wrt(_r(3, 1)))),
    Case("PRelu_slope_last_axis", "PRelu", (wrt(_clear_of([0.0], 2, 3, 4)), wrt(_r(4)))),
    Case("PRelu_slope_scalar_like", "PRelu", (wrt(_clear_of([0.0], 2, 3)), wrt(_r(1)))),
    Case("PRelu_slope_full", "PRelu", (wrt(_clear_of([0.0], 2, 3)), wrt(_r(2, 3)))),
    Case(
        "PRelu_dynamic",
        "PRelu",
        (wrt(_clear_of([0.0], 2, 3, 4), dynamic=True), wrt(_r(3, 1), dynamic=True)),
    ),
    # Softmax and LogSoftmax (opset >= 13: one axis).
    Case("Softmax_default_axis", "Softmax", (wrt(_r(2, 3, 4)),)),
    Case("Softmax_axis1", "Softmax", (wrt(_r(2, 3, 4)),), {"axis": 1}),
    Case("Softmax_axis0", "Softmax", (wrt(_r(3, 2)),), {"axis": 0}),
    Case("Softmax_axis_neg2_dynamic", "Softmax", (wrt(_r(2, 3, 2), dynamic=True),), {"axis": -2}),
    Case("LogSoftmax_default_axis", "LogSoftmax", (wrt(_r(2, 3, 4)),)),
    Case("LogSoftmax_axis0", "LogSoftmax", (wrt(_r(3, 2)),), {"axis": 0}),
    Case("LogSoftmax_axis_neg2_dynamic", "LogSoftmax", (wrt(_r(2, 3, 2), dynamic=True),), {"axis": -2}),
    # SoftmaxCrossEntropyLoss: scores [N, C] or [N, C, d1, ...].
    *[
        Case(f"SCE_{reduction}", "SoftmaxCrossEntropyLoss", (wrt(_r(4, 3)), _labels(3, 4)), {"reduction": reduction})
        for reduction in ("mean", "sum", "none")
    ],
    *[
        Case(
            f"SCE_weights_{reduction}",
            "SoftmaxCrossEntropyLoss",
            (wrt(_r(4, 3)), _labels(3, 4), const(_WEIGHTS)),
            {"reduction": reduction},
        )
        for reduction in ("mean", "sum", "none")
    ],
    *[
        Case(
            f"SCE_ignore_{reduction}",
            "SoftmaxCrossEntropyLoss",
            (wrt(_r(5, 3)), _labels(3, 5, ignore=-100)),
            {"reduction": reduction, "ignore_index": -100},
        )
        for reduction in ("mean", "sum", "none")
    ],
    Case(
        "SCE_weights_ignore_in_range_mean",
        "SoftmaxCrossEntropyLoss",
        (wrt(_r(5, 3)), _labels(3, 5, ignore=1), const(_WEIGHTS)),
        {"ignore_index": 1},
    ),
    Case(
        "SCE_NCd_weights_ignore_mean",
        "SoftmaxCrossEntropyLoss",
        (wrt(_r(2, 3, 4)), _labels(3, 2, 4, ignore=-1), const(_WEIGHTS)),
        {"ignore_index": -1},
    ),
    Case(
        "SCE_NCd1d2_none_int32",
        "SoftmaxCrossEntropyLoss",
        (wrt(_r(2, 3, 2, 2)), _labels(3, 2, 2, 2, dtype=np.int32)),
        {"reduction": "none"},
    ),
    Case(
        "SCE_log_prob_and_loss",
        "SoftmaxCrossEntropyLoss",
        (wrt(_r(2, 3, 2)), _labels(3, 2, 2, ignore=0), const(_WEIGHTS)),
        {"reduction": "sum", "ignore_index": 0},
        num_outputs=2,
    ),
    Case(
        "SCE_log_prob_only",
        "SoftmaxCrossEntropyLoss",
        (wrt(_r(4, 3)), _labels(3, 4)),
        num_outputs=2,
        loss_outputs=(1,),
    ),
    Case(
        "SCE_dynamic",
        "SoftmaxCrossEntropyLoss",
        (
            wrt(_r(3, 3, 2), dynamic=True),
            fed(np.array([[0, 2], [-100, 1], [2, -100]]), dtype=np.int64, dynamic=True),
            const(_WEIGHTS),
        ),
        {"ignore_index": -100},
    ),
    # NegativeLogLikelihoodLoss: input [N, C] or [N, C, d1, ...] (log-probabilities as a rule).
    *[
        Case(f"NLL_{reduction}", "NegativeLogLikelihoodLoss", (wrt(_r(4, 3)), _labels(3, 4)), {"reduction": reduction})
        for reduction in ("mean", "sum", "none")
    ],
    *[
        Case(
            f"NLL_weights_ignore_{reduction}",
            "NegativeLogLikelihoodLoss",
            (wrt(_r(5, 3)), _labels(3, 5, ignore=-100), const(_WEIGHTS)),
            {"reduction": reduction, "ignore_index": -100},
        )
        for reduction in ("mean", "sum", "none")
    ],
    Case(
        "NLL_ignore_in_range_mean",
        "NegativeLogLikelihoodLoss",
        (wrt(_r(5, 3)), _labels(3, 5, ignore=2)),
        {"ignore_index": 2},
    ),
    Case(
        "NLL_NCd_weights_mean_int32",
        "NegativeLogLikelihoodLoss",
        (wrt(_r(2, 3, 4)), _labels(3, 2, 4, dtype=np.int32), const(_WEIGHTS)),
    ),
    Case(
        "NLL_dynamic",
        "NegativeLogLikelihoodLoss",
        (wrt(_r(3, 3, 2), dynamic=True), _labels(3, 3, 2, ignore=1), const(_WEIGHTS)),
        {"ignore_index": 1, "reduction": "sum"},
    ),
    # Dropout whose mask is fixed (training_mode absent or false, or ratio 0); random masks below.
    Case("Dropout_no_training_mode", "Dropout", (wrt(_r(2, 3)),)),
    Case("Dropout_ratio_no_training_mode", "Dropout", (wrt(_r(2, 3)), const(0.3))),
    Case("Dropout_training_mode_false_fed", "Dropout", (wrt(_r(2, 3)), fed(0.3), fed(False, dtype=bool))),
    Case(
        "Dropout_training_ratio0_mask", "Dropout", (wrt(_r(2, 3)), const(0.0), const(True, dtype=bool)), num_outputs=2
    ),
    # LayerNormalization: normalized over [axis, rank); Scale and B broadcast to those dims.
    Case("LayerNormalization_last_axis", "LayerNormalization", (wrt(_r(2, 3, 4)), wrt(_r(4)), wrt(_r(4)))),
    Case(
        "LayerNormalization_axis1_epsilon",
        "LayerNormalization",
        (wrt(_r(2, 3, 4)), wrt(_r(3, 4)), wrt(_r(3, 4))),
        {"axis": 1, "epsilon": 1e-3},
    ),
    Case("LayerNormalization_axis_neg2_no_bias", "LayerNormalization", (wrt(_r(2, 3, 4)), wrt(_r(3, 4))), {"axis": -2}),
    Case("LayerNormalization_axis0", "LayerNormalization", (wrt(_r(2, 3)), wrt(_r(2, 3)), wrt(_r(2, 3))), {"axis": 0}),
    Case(
        "LayerNormalization_broadcast_scale_bias",
        "LayerNormalization",
        (wrt(_r(2, 3, 4)), wrt(_r(4)), wrt(_r(1, 4))),
        {"axis": -2},
    ),
    Case(
        "LayerNormalization_dynamic",
        "LayerNormalization",
        (wrt(_r(2, 3, 4), dynamic=True), wrt(_r(4), dynamic=True), wrt(_r(4), dynamic=True)),
    ),
    # InstanceNormalization: per (n, c) over the spatial axes.
    Case(
        "InstanceNormalization",
        "InstanceNormalization",
        (wrt(_r(2, 3, 4)), wrt(_r(3)), wrt(_r(3))),
        float64_forward=lambda node: _instance_normalization64(node, 3),
    ),
    Case(
        "InstanceNormalization_2d_epsilon",
        "InstanceNormalization",
        (wrt(_r(2, 2, 3, 2)), wrt(_r(2)), wrt(_r(2))),
        {"epsilon": 1e-2},
        float64_forward=lambda node: _instance_normalization64(node, 4),
    ),
    Case(
        "InstanceNormalization_dynamic",
        "InstanceNormalization",
        (wrt(_r(2, 3, 4), dynamic=True), wrt(_r(3), dynamic=True), wrt(_r(3), dynamic=True)),
        float64_forward=lambda node: _instance_normalization64(node, 3),
    ),
    # GroupNormalization (opset 21: scale and bias per channel; stash_type 11 keeps float64 statistics).
    Case(
        "GroupNormalization_2_groups",
        "GroupNormalization",
        (wrt(_r(2, 4, 3)), wrt(_r(4)), wrt(_r(4))),
        {"num_groups": 2, "stash_type": 11},
        opset=21,
    ),
    Case(
        "GroupNormalization_4d_1_group_epsilon",
        "GroupNormalization",
        (wrt(_r(2, 2, 3, 2)), wrt(_r(2)), wrt(_r(2))),
        {"num_groups": 1, "epsilon": 1e-3, "stash_type": 11},
        opset=21,
    ),
    Case(
        "GroupNormalization_dynamic_group_per_channel",
        "GroupNormalization",
        (wrt(_r(2, 3, 4), dynamic=True), wrt(_r(3), dynamic=True), wrt(_r(3), dynamic=True)),
        {"num_groups": 3, "stash_type": 11},
        opset=21,
    ),
    # RMSNormalization (opset 23): over [axis, rank), scale broadcast to those dims.
    Case("RMSNormalization_last_axis", "RMSNormalization", (wrt(_r(2, 3, 4)), wrt(_r(4))), opset=23),
    Case(
        "RMSNormalization_axis1_epsilon",
        "RMSNormalization",
        (wrt(_r(2, 3, 4)), wrt(_r(3, 4))),
        {"axis": 1, "epsilon": 1e-3},
        opset=23,
    ),
    Case(
        "RMSNormalization_broadcast_scale",
        "RMSNormalization",
        (wrt(_r(2, 3, 4)), wrt(_r(1, 4))),
        {"axis": -2},
        opset=23,
    ),
    Case(
        "RMSNormalization_dynamic",
        "RMSNormalization",
        (wrt(_r(2, 3, 4), dynamic=True), wrt(_r(4), dynamic=True)),
        opset=23,
    ),
    # BatchNormalization in inference form: running statistics are constants.
    Case(
        "BatchNormalization",
        "BatchNormalization",
        (wrt(_r(2, 3, 4)), wrt(_r(3)), wrt(_r(3)), const(_r(3)), const(_positive(3))),
    ),
    Case(
        "BatchNormalization_rank2_fed_statistics",
        "BatchNormalization",
        (wrt(_r(4, 2)), wrt(_r(2)), wrt(_r(2)), fed(_r(2)), fed(_positive(2))),
        {"epsilon": 1e-2, "training_mode": 0},
    ),
    Case(
        "BatchNormalization_dynamic_4d",
        "BatchNormalization",
        (wrt(_r(2, 2, 2, 3), dynamic=True), wrt(_r(2)), wrt(_r(2)), const(_r(2)), const(_positive(2))),
    ),
    *LSTM_CASES,
    # Sigmoid's gradient: one ortlstm SigmoidGrad node above; here the standard ops (Sub, Mul, Mul)
    Case("Sigmoid_standard_ops", "Sigmoid", (wrt(_r(2, 5)),), ortlstm_ops=False),
]


@functools.cache
def _layer_normalization_broadcasts() -> bool:
    """Whether this onnxruntime broadcasts LayerNormalization's Scale and B (1.19 wants them full-size)."""
    node = helper.make_node("LayerNormalization", ["X", "S"], ["Y"], axis=-2)
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.ones(2, np.float32), "S")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"X": np.ones((1, 2, 2), np.float32)}
        )
    except Exception:  # onnxruntime refuses it (its error types differ by version)
        return False
    return True


def _param(case: Case) -> object:
    marks = []
    if case.opset > 17:
        lacking = not runs_opset(case.opset)
        marks.append(pytest.mark.skipif(lacking, reason=f"this onnxruntime lacks opset {case.opset}"))
    if case.id == "LayerNormalization_broadcast_scale_bias":
        marks.append(
            pytest.mark.skipif(
                not _layer_normalization_broadcasts(), reason="this onnxruntime wants full-size Scale and B"
            )
        )
    return pytest.param(case, id=case.id, marks=marks)


PARAMS = [_param(case) for case in CASES]


@pytest.mark.parametrize("case", PARAMS)
def test_rule_matches_finite_differences(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("case", PARAMS)
def test_rule_float32(case: Case, optimize: bool) -> None:
    check_case_float32(case, optimize)


# ---- Dropout in training mode: checked exactly against the same run's mask ----------------------


def _session(model: onnx.ModelProto, optimize: bool) -> ort.InferenceSession:
    options = ortlstm.ops.session_options()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize(
    ("num_outputs", "training_mode"),
    [(1, const(True, dtype=bool)), (2, fed(True, dtype=bool)), (1, fed(False, dtype=bool))],
    ids=["mask_unnamed_constant_mode", "mask_named_fed_mode", "fed_mode_false"],
)
def test_dropout_training_gradient_is_the_masked_scale(
    num_outputs: int, training_mode: Input, dtype: type, optimize: bool
) -> None:
    ratio = 0.4
    x = _RNG.uniform(0.5, 1.5, (8, 16))
    case = Case("Dropout_training", "Dropout", (wrt(x), fed(ratio), training_mode), num_outputs=num_outputs)
    built = build(case, dtype)
    model = built.with_gradients
    forward_node = next(node for node in model.graph.node if node.name == "under_test")
    assert len(forward_node.output) == 2, "the rule names the mask output"
    assert forward_node.output[1]
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in forward_node.output)
    _, dx, y, mask = _session(model, optimize).run(None, built.feeds)
    dy = built.feeds["weight_out0"]
    training = bool(training_mode.value)
    assert mask.dtype == np.bool_
    assert not training or 0 < mask.mean() < 1, "a mask that drops some, keeps some"
    scale = np.asarray(1 / (1 - ratio) if training else 1.0, dtype=dtype)
    # onnxruntime scales the output by 1 / (1 - ratio) computed in float32, also for float64 data.
    np.testing.assert_allclose(y, np.where(mask, built.feeds["in0"] * scale, 0), rtol=1e-6)
    np.testing.assert_allclose(dx, np.where(mask, dy * scale, 0), rtol=1e-6 if dtype == np.float32 else 1e-14)


# ---- structure and refusals ---------------------------------------------------------------------


def _differentiate(model: onnx.ModelProto, loss: str, parameters: Sequence[str]) -> GraphEmitter:
    emitter = GraphEmitter(onnx_opset(model), used_names(model.graph), infer_value_types(model))
    build_backward(model.graph, loss, parameters, emitter)
    return emitter


def _lstm_model(op_type: str, domain: str, outputs: Sequence[str], **attributes: object) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    initializers = [
        onnx.numpy_helper.from_array(rng.standard_normal((1, 8, 3)).astype(np.float32), "W"),
        onnx.numpy_helper.from_array(rng.standard_normal((1, 8, 2)).astype(np.float32), "R"),
    ]
    node = helper.make_node(op_type, ["X", "W", "R"], list(outputs), name="lstm", domain=domain, **attributes)
    graph = helper.make_graph(
        [node, helper.make_node("ReduceSum", [outputs[0]], ["loss"], keepdims=0)],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "N", 3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ortlstm.ops.DOMAIN, ortlstm.ops.OPSET_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def test_lstm_grad_node_copies_attributes_and_names_only_needed_outputs() -> None:
    # A node written by hand: only HAll named, `activations` without its csv copy.
    model = _lstm_model(
        "LSTMTraining",
        ortlstm.ops.DOMAIN,
        ["HAll"],
        hidden_size=2,
        activations=["Sigmoid", "Softsign", "Tanh"],
        clip=5.0,
    )
    emitter = _differentiate(model, "loss", ["W"])
    (grad_node,) = [node for node in emitter.nodes if node.op_type == "LSTMGrad"]
    forward_node = model.graph.node[0]
    assert grad_node.domain == ortlstm.ops.DOMAIN
    assert forward_node.output[0] == "HAll"
    assert forward_node.output[3], "the CAll stash is named"
    assert forward_node.output[4], "the IOFC stash is named"
    attributes = {attribute.name: helper.get_attribute_value(attribute) for attribute in grad_node.attribute}
    assert attributes == {
        "hidden_size": 2,
        "activations": [b"Sigmoid", b"Softsign", b"Tanh"],
        "clip": 5.0,
        "activations_csv": b"Sigmoid,Softsign,Tanh",
    }
    grad_ports = [port.name for port in ortlstm.ops.schema.LSTM_GRAD.outputs]
    named = [port for port, output in zip(grad_ports, grad_node.output, strict=False) if output]
    assert named == ["dW"]
    # The built model runs: the forward node now computes the stash LSTMGrad reads. (Kernels on
    # onnxruntime < 1.25 read activations from activations_csv only, the forward node's too.)
    forward_node.attribute.append(helper.make_attribute("activations_csv", "Sigmoid,Softsign,Tanh"))
    model.graph.node.extend(emitter.nodes)
    model.graph.initializer.extend(emitter.initializers)
    model.graph.output.append(helper.make_empty_tensor_value_info(grad_node.output[1]))
    feeds = {"X": np.random.default_rng(0).standard_normal((3, 2, 3)).astype(np.float32)}
    _, dw = _session(model, optimize=True).run(None, feeds)
    assert dw.shape == (1, 8, 3)
    assert np.all(np.isfinite(dw))
    assert np.any(dw != 0)


def test_standard_lstm_is_refused_with_a_hint_to_convert() -> None:
    model = _lstm_model("LSTM", "", ["Y"], hidden_size=2)
    with pytest.raises(ValueError, match=r"no gradient rule for ai\.onnx::LSTM node 'lstm'.*convert the model first"):
        _differentiate(model, "loss", ["W"])


def test_standard_rnn_is_refused_with_a_hint_to_convert() -> None:
    # TorchScript writes nn.RNN as an ONNX RNN node; the Trainer converts it to RNNTraining, the engine alone does not.
    model = _lstm_model("RNN", "", ["Y"], hidden_size=2)
    message = r"no gradient rule for ai\.onnx::RNN node 'lstm'.*convert_rnns\(model\)"
    with pytest.raises(ValueError, match=message):
        _differentiate(model, "loss", ["W"])


def test_lstm_stash_in_the_loss_is_refused() -> None:
    model = _lstm_model("LSTMTraining", ortlstm.ops.DOMAIN, ["HAll", "", "", "CAll"], hidden_size=2)
    model.graph.node[1].input[0] = "CAll"
    with pytest.raises(ValueError, match="output CAll is a stash for LSTMGrad"):
        _differentiate(model, "loss", ["W"])


def test_batch_normalization_running_statistics_are_not_parameters() -> None:
    case = Case(
        "BatchNormalization_mean_wrt",
        "BatchNormalization",
        (wrt(_r(2, 3)), const(_r(3)), const(_r(3)), wrt(_r(3)), const(_positive(3))),
    )
    with pytest.raises(ValueError, match="do not reach the loss"):
        build(case)


def test_batch_normalization_training_mode_is_refused() -> None:
    case = Case(
        "BatchNormalization_training",
        "BatchNormalization",
        (wrt(_r(2, 3)), const(_r(3)), const(_r(3)), const(_r(3)), const(_positive(3))),
        {"training_mode": 1},
        num_outputs=3,
        loss_outputs=(0,),
    )
    with pytest.raises(ValueError, match="training_mode=1"):
        build(case)


def test_layer_normalization_statistics_outputs_carry_no_gradient() -> None:
    case = Case(
        "LayerNormalization_mean_in_loss",
        "LayerNormalization",
        (wrt(_r(2, 3)), const(_r(3))),
        num_outputs=2,
    )
    with pytest.raises(ValueError, match="only output 0 carries a gradient"):
        build(case)
