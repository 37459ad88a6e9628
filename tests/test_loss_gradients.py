"""Gradients of the ONNX losses (through the autodiff engine) against torch autograd's, recorded.

For every recorded loss case (see test_losses.py), the loss graph is differentiated with
``ortlstm.graphs.autodiff.build_backward`` with respect to the input, from where
``losses.gradient_seed`` says (the loss seeded with ones, so reduction="none" gives the gradient
of ``loss.sum()``, as recorded; binary_cross_entropy's torch backward seeds the input) and run in
onnxruntime. binary_cross_entropy's seed is also checked against float64 central differences of
its loss where torch's backward is the derivative (probabilities away from 0 and 1), and the
losses of ``FINITE_DIFFERENCE_CASES`` are, where torch's recording cannot reach (margins beyond
exp's range, where torch's soft_margin_loss overflows), and cross_entropy on class probabilities
as a train step declares them (``class_probabilities=True``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper
import onnxruntime as ort
import pytest
from test_losses import CASES, build_loss_model, loss_spec, recorded, run_loss

from ortlstm.graphs import losses

FLOAT64_RTOL = 1e-10
FLOAT64_ATOL = 1e-12
FLOAT32_RTOL = 1e-4
FLOAT32_ATOL = 1e-5
TOLERANCES = {"float32": (FLOAT32_RTOL, FLOAT32_ATOL), "float64": (FLOAT64_RTOL, FLOAT64_ATOL)}


def loss_gradient(spec: losses.Loss, input_value: np.ndarray, target_value: np.ndarray) -> np.ndarray:
    """d(loss)/d(input) as the train step computes it: ``build_backward`` from ``gradient_seed``."""
    from ortlstm.graphs.autodiff import build_backward

    model, emitter, loss = build_loss_model(spec, input_value, target_value)
    seed = losses.gradient_seed(emitter, spec, "input", "target", loss)
    backward = build_backward(model.graph, seed, ["input"], emitter)
    grad = backward.gradients["input"]
    graph = model.graph
    graph.node.extend(emitter.nodes[len(graph.node) :])
    known = {init.name for init in graph.initializer}
    graph.initializer.extend(init for init in emitter.initializers if init.name not in known)
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(input_value.dtype)
    graph.output.append(onnx.helper.make_tensor_value_info(grad, elem_type, list(input_value.shape)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _, value = session.run(None, {"input": input_value, "target": target_value})
    return value


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_gradient_matches_torch(name: str, dtype: str) -> None:
    case = CASES[name]
    data = recorded(case, dtype)
    value = loss_gradient(loss_spec(case), data["input"], data["target"])
    rtol, atol = TOLERANCES[dtype]
    np.testing.assert_allclose(value, data["grad"], rtol=rtol, atol=atol, equal_nan=True)


def central_differences(spec: losses.Loss, inputs: np.ndarray, target: np.ndarray, step: float) -> np.ndarray:
    """d(sum of the loss)/d(input), float64 central differences of the loss model run in onnxruntime."""
    numeric = np.empty_like(inputs)
    for index in np.ndindex(inputs.shape):
        up, down = inputs.copy(), inputs.copy()
        up[index] += step
        down[index] -= step
        numeric[index] = (run_loss(spec, up, target).sum() - run_loss(spec, down, target).sum()) / (2 * step)
    return numeric


# (id, loss, inputs, target, step): float64, no kink within a step of any input. Where the loss is
# large the step is too: the difference rounds at eps * |loss| / step, and there it is linear.
FINITE_DIFFERENCE_CASES = [
    (f"soft_margin_loss_{margins}_{reduction}", losses.Loss.soft_margin_loss(reduction=reduction), x, y, step)
    for margins, x, y, step in (
        (
            "near",
            np.array([[-2.5, 0.0, 0.25], [3.0, -0.5, 1.5]]),
            np.array([[1.0, -1.0, 1.0], [-1.0, 0.5, -0.25]]),
            1e-6,
        ),
        ("far", np.array([[-800.0, -30.0], [40.0, 900.0]]), np.array([[1.0, -1.0], [0.5, -1.0]]), 1e-3),
    )
    for reduction in ("mean", "sum", "none")
]
_PROBABILITY_RNG = np.random.default_rng(20261127)
_LOGITS = _PROBABILITY_RNG.standard_normal((3, 4, 2))
_SOFT = np.exp(_PROBABILITY_RNG.standard_normal((3, 4, 2)))
FINITE_DIFFERENCE_CASES += [
    # cross_entropy with class probabilities (rows summing to 1, and not: torch takes both), as a train step takes them.
    (
        f"cross_entropy_probabilities_{name}",
        losses.Loss.cross_entropy(class_probabilities=True, **kwargs),
        _LOGITS[..., 0] if flat else _LOGITS,
        (_SOFT / _SOFT.sum(axis=1, keepdims=True))[..., 0] if flat else _SOFT,
        1e-6,
    )
    for name, flat, kwargs in (
        ("2d_mean", True, {}),
        ("2d_smoothed_weighted_mean", True, {"label_smoothing": 0.3, "weight": [0.5, 2.0, 1.0, 1.5]}),
        ("3d_unnormalized_smoothed_sum", False, {"label_smoothing": 0.1, "reduction": "sum"}),
        ("3d_weighted_none", False, {"weight": [1.5, 0.5, 1.0, 2.0], "reduction": "none"}),
    )
]


@pytest.mark.parametrize(
    ("spec", "inputs", "target", "step"),
    [case[1:] for case in FINITE_DIFFERENCE_CASES],
    ids=[case[0] for case in FINITE_DIFFERENCE_CASES],
)
def test_loss_gradient_matches_finite_differences(
    spec: losses.Loss, inputs: np.ndarray, target: np.ndarray, step: float
) -> None:
    grad = loss_gradient(spec, inputs, target)
    assert np.isfinite(run_loss(spec, inputs, target)).all()
    np.testing.assert_allclose(grad, central_differences(spec, inputs, target, step), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["nw", "w"])
def test_binary_cross_entropy_seed_matches_finite_differences(
    reduction: str, weighted: bool, rng: np.random.Generator
) -> None:
    """Inside (0, 1), where no clamp acts, torch's backward is the loss's derivative."""
    spec = losses.Loss.binary_cross_entropy(weight=[1.5, 0.5, 2.0] if weighted else None, reduction=reduction)
    probs = rng.uniform(0.05, 0.95, (4, 3))
    target = rng.random((4, 3))
    grad = loss_gradient(spec, probs, target)
    np.testing.assert_allclose(grad, central_differences(spec, probs, target, 1e-6), rtol=1e-7, atol=1e-9)
