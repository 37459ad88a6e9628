"""Gradient rules of graphs/autodiff/rules_activations.py: Gelu, HardSwish, Mish, Selu, Celu, Softsign, ...

The same checks as tests/test_autodiff_nn_rules.py (tests/gradcheck.py): central finite
differences in float64, and float32 (graph optimizations on and off) against the float64
gradients. onnxruntime runs most of these ops in float32 only, so their float64 models run in
``onnx.reference`` (``Case.float64_reference``; Gelu and Erf as NumPy float64 kernels, since
onnx.reference's Erf rounds through float32); ``test_reference_forward_is_onnxruntimes`` shows
that onnx.reference computes the function onnxruntime's float32 kernel computes, so the finite
differences are those of the op the train step runs. Random inputs keep 0.1 clear of the kinks
(HardSwish at +-3, Selu and Celu at 0, the thresholds of ThresholdedRelu and Shrink);
tests/test_activation_kinks.py checks the kinks themselves against torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from gradcheck import Case, build, check_case, check_case_float32, clear_of, wrt
from onnx import TensorProto, helper
from onnx.reference.op_run import OpRun

from ortlstm.graphs.autodiff import GraphEmitter, build_backward, infer_value_types, onnx_opset
from ortlstm.graphs.emit.emitter import used_names

_RNG = np.random.default_rng(31)
_r = _RNG.standard_normal


def _kinks(points: Sequence[float], *shape: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    return clear_of(_RNG, points, *shape, low=low, high=high)


def _wide(*shape: int) -> np.ndarray:
    """Values from -6 to 6: the tails, where a formula that cancels or overflows would show it."""
    return _RNG.uniform(-6.0, 6.0, shape)


_erf64 = np.vectorize(math.erf, otypes=[np.float64])


class Erf(OpRun):
    """Erf in float64 (onnx.reference's Erf rounds through float32, too coarse for finite differences).

    onnx.reference replaces the op whose name is the class's: hence the op's own name.
    """

    op_domain = ""

    def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
        return (_erf64(x).astype(x.dtype),)


class Gelu(OpRun):
    """torch's GELU in NumPy float64: x * Phi(x), or 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    op_domain = ""

    def _run(self, x: np.ndarray, approximate: str = "none") -> tuple[np.ndarray]:
        if approximate == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
            return ((0.5 * x * (1.0 + np.tanh(inner))).astype(x.dtype),)
        return ((0.5 * x * (1.0 + _erf64(x / math.sqrt(2.0)))).astype(x.dtype),)


def _case(
    case_id: str, op_type: str, x: np.ndarray, opset: int = 17, dynamic: bool = False, **attributes: object
) -> Case:
    """One row: ``op_type`` on ``x`` (differentiated), its float64 side in onnx.reference."""
    ops = (Gelu, Erf) if op_type == "Gelu" else ()
    inputs = (wrt(x, dynamic=dynamic),)
    return Case(case_id, op_type, inputs, attributes, opset=opset, float64_ops=ops, float64_reference=True)


CASES = [
    _case("Gelu_none", "Gelu", _r((3, 4)), opset=20),
    _case("Gelu_none_tails", "Gelu", _wide(2, 5), opset=20),
    _case("Gelu_tanh", "Gelu", _r((3, 4)), opset=20, approximate="tanh"),
    _case("Gelu_tanh_tails_dynamic", "Gelu", _wide(2, 5), opset=20, dynamic=True, approximate="tanh"),
    _case("HardSwish", "HardSwish", _kinks([-3.0, 3.0], 3, 5, low=-5.0, high=5.0)),
    _case("HardSwish_dynamic", "HardSwish", _kinks([-3.0, 3.0], 2, 4, low=-5.0, high=5.0), dynamic=True),
    _case("Mish", "Mish", _r((3, 4)), opset=18),
    _case("Mish_tails", "Mish", _wide(2, 5), opset=18),
    _case("Selu_default", "Selu", _kinks([0.0], 3, 4)),
    _case("Selu_alpha_gamma", "Selu", _kinks([0.0], 3, 4), alpha=1.3, gamma=0.7),
    _case("Celu_default", "Celu", _kinks([0.0], 3, 4)),
    _case("Celu_alpha_dynamic", "Celu", _kinks([0.0], 3, 4), dynamic=True, alpha=0.6),
    _case("Softsign", "Softsign", _kinks([0.0], 3, 4)),
    _case("ThresholdedRelu_default", "ThresholdedRelu", _kinks([1.0], 3, 4)),
    _case("ThresholdedRelu_alpha", "ThresholdedRelu", _kinks([-0.4], 3, 4), alpha=-0.4),
    _case("Shrink_default", "Shrink", _kinks([-0.5, 0.5], 3, 4)),
    _case("Shrink_lambd_bias", "Shrink", _kinks([-1.2, 1.2], 3, 4), lambd=1.2, bias=0.3),
]
PARAMS = [pytest.param(case, id=case.id) for case in CASES]


@pytest.mark.parametrize("case", PARAMS)
def test_rule_matches_finite_differences(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("optimize", [False, True], ids=["opt_off", "opt_on"])
@pytest.mark.parametrize("case", PARAMS)
def test_rule_float32(case: Case, optimize: bool) -> None:
    check_case_float32(case, optimize)


@pytest.mark.parametrize("case", PARAMS)
def test_reference_forward_is_onnxruntimes(case: Case) -> None:
    """onnx.reference's float64 forward (the finite differences' function) equals onnxruntime's float32 kernel."""
    reference, runtime = build(case, np.float64), build(case, np.float32)
    assert reference.reference and not runtime.reference
    (expected,) = runtime.session(runtime.forward).run(None, runtime.feeds)
    (got,) = reference.session(reference.forward).run(None, reference.feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=case.id)


def _differentiate_single(op_type: str, opset: int, *constants: np.ndarray, **attributes: object) -> None:
    """Differentiates sum(op(X, *constants)) with respect to X, without running it (the rule's refusals)."""
    names = [f"c{index}" for index in range(len(constants))]
    graph = helper.make_graph(
        [
            helper.make_node(op_type, ["X", *names], ["Y"], name="act", **attributes),
            helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4, 3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [
            onnx.numpy_helper.from_array(value.astype(np.float32), name)
            for name, value in zip(names, constants, strict=True)
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    emitter = GraphEmitter(onnx_opset(model), used_names(model.graph), infer_value_types(model))
    build_backward(model.graph, "loss", ["X"], emitter)


def test_gelu_unknown_approximation_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Gelu node 'act': approximate='erf' is not one of 'none', 'tanh'"):
        _differentiate_single("Gelu", 20, approximate="erf")


def test_celu_alpha_zero_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Celu node 'act': alpha=0 divides by zero"):
        _differentiate_single("Celu", 17, alpha=0.0)


def test_group_normalization_before_opset_21_is_refused() -> None:
    message = r"GroupNormalization node 'act': opset 18's GroupNormalization has a scale and bias per group.*version=21"
    with pytest.raises(ValueError, match=message):
        _differentiate_single("GroupNormalization", 18, np.ones(2), np.zeros(2), num_groups=2)
