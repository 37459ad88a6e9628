"""The SGDUpdate kernel against an exact elementwise reference, and its refusals.

As for AdamUpdate (tests/test_adam_update.py, whose exact fused multiply-add and session helpers
this reuses): the reference takes every operation docs/ops.md#sgdupdate names one at a time in the
parameter's type, each fused multiply-add in exact rational arithmetic rounded once, so the kernel
must match it bit for bit in float32 and float64. graphs/optimizers.py's standard-op update and
torch's recorded trajectories are the other oracles (tests/test_optimizers.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_adam_update import _fma, _run_error, make_session

from ortlstm.ops import schema

SPEC = schema.SGD_UPDATE
HYPERPARAMETERS = ("momentum", "dampening", "weight_decay")


def reference(inputs: dict[str, np.ndarray], nesterov: bool, maximize: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The update element by element, each operation as the op's documentation spells it."""
    param, grad = inputs["param"], inputs["grad"]
    dtype = param.dtype
    h = {name: float(inputs[name].reshape(())) if name in inputs else 0.0 for name in HYPERPARAMETERS}
    neg_lr = dtype.type(-float(inputs["lr"].reshape(())))
    momentum = "momentum_buffer" in inputs
    first_step = momentum and float(inputs["step"].reshape(())) == 1.0
    new_param = np.empty_like(param)
    new_buffer = np.empty_like(param) if momentum else None
    for index in np.ndindex(param.shape):
        p = param[index]
        g = -grad[index] if maximize else grad[index]
        if h["weight_decay"] != 0:
            g = _fma(p, dtype.type(h["weight_decay"]), g)
        if momentum:
            m = dtype.type(h["momentum"])
            decayed = inputs["momentum_buffer"][index] * m
            b = g if first_step else _fma(g, dtype.type(1.0 - h["dampening"]), decayed)
            new_buffer[index] = b  # type: ignore[index]
            g = _fma(b, m, g) if nesterov else b
        new_param[index] = _fma(g, neg_lr, p)
    return new_param, new_buffer


def random_inputs(
    dtype: str, shape: tuple[int, ...], *, seed: int, optional: set[str], step: float = 3.0
) -> dict[str, np.ndarray]:
    """Parameters, gradients and a momentum buffer; the hyperparameters (torch-like values) in float64."""
    rng = np.random.default_rng(seed)
    t = np.dtype(dtype)
    inputs = {
        "param": rng.standard_normal(shape).astype(t),
        "grad": rng.standard_normal(shape).astype(t),
        "lr": np.asarray(0.1),
    }
    if "momentum_buffer" in optional:
        inputs["momentum_buffer"] = rng.standard_normal(shape).astype(t)
        inputs["step"] = np.asarray([step])  # [1] as well as []
        inputs["momentum"] = np.asarray(0.9)
    if "dampening" in optional:
        inputs["dampening"] = np.asarray(0.3)
    if "weight_decay" in optional:
        # Close to -grad / param for some elements, so that grad + weight_decay * param cancels.
        inputs["weight_decay"] = np.asarray(0.5)
        inputs["grad"][..., :2] = (-0.5 * inputs["param"][..., :2] * (1 + 1e-3)).astype(t)
    return inputs


OPTIONAL_SETS = [
    set(),
    {"weight_decay"},
    {"momentum_buffer"},
    {"momentum_buffer", "dampening"},
    {"momentum_buffer", "weight_decay"},
    {"momentum_buffer", "dampening", "weight_decay"},
]


def _present(optional: set[str]) -> set[str]:
    """The node's optional inputs for a set of ``random_inputs`` options (step and momentum go with the buffer)."""
    return optional | ({"step", "momentum"} if "momentum_buffer" in optional else set())


COMBINATIONS = [
    (optional, nesterov)
    for optional in OPTIONAL_SETS
    for nesterov in (False, True)
    if "momentum_buffer" in optional or not nesterov  # nesterov without momentum: refused (tested below)
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    ("optional", "nesterov"),
    COMBINATIONS,
    ids=[("+".join(sorted(o)) or "plain") + ("+nesterov" if n else "") for o, n in COMBINATIONS],
)
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("step", [1.0, 3.0], ids=["first_step", "later_step"])
def test_matches_exact_reference(dtype: str, optional: set[str], nesterov: bool, maximize: bool, step: float) -> None:
    inputs = random_inputs(dtype, (5, 7), seed=len(optional) + 10 * maximize, optional=optional, step=step)
    attributes = {"maximize": int(maximize), "nesterov": int(nesterov)}
    got = make_session(dtype, _present(optional), attributes=attributes, spec=SPEC).run(None, inputs)
    want = [value for value in reference(inputs, nesterov, maximize) if value is not None]
    assert len(got) == len(want)
    for port, actual, expected in zip(SPEC.outputs, got, want, strict=False):
        assert actual.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(actual, expected, err_msg=port.name)
    if "momentum_buffer" in optional and step == 1.0:
        # torch's buffer starts as the (decayed, possibly negated) gradient, whatever the buffer held.
        g = -inputs["grad"] if maximize else inputs["grad"]
        if "weight_decay" not in optional:
            np.testing.assert_array_equal(got[1], g)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_threads_do_not_change_the_result(dtype: str) -> None:
    """Large enough for several tasks; every element is computed alike whichever task has it."""
    optional = {"momentum_buffer", "dampening", "weight_decay"}
    inputs = random_inputs(dtype, (3, 100_003), seed=7, optional=optional)
    attributes = {"nesterov": 0}
    sessions = [
        make_session(dtype, _present(optional), attributes=attributes, threads=threads, spec=SPEC)
        for threads in (1, 2, 3)
    ]
    results = [session.run(None, inputs) for session in sessions]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    tail = {name: value[:, -9:] if value.ndim == 2 else value for name, value in inputs.items()}
    for actual, expected in zip(results[0], reference(tail, False, False), strict=True):
        np.testing.assert_array_equal(actual[:, -9:], expected)


def test_empty_parameter() -> None:
    optional = {"momentum_buffer"}
    inputs = random_inputs("float64", (0, 3), seed=1, optional=optional)
    for value in make_session("float64", _present(optional), spec=SPEC).run(None, inputs):
        assert value.shape == (0, 3)


@pytest.mark.parametrize("port", ["grad", "momentum_buffer"])
def test_shape_mismatch_names_the_input(port: str) -> None:
    optional = {"momentum_buffer"}
    inputs = random_inputs("float32", (2, 3), seed=0, optional=optional)
    inputs[port] = inputs[port].reshape(3, 2)
    message = _run_error(make_session("float32", _present(optional), spec=SPEC), inputs)
    assert f"SGDUpdate node 'update': input {port}: expected shape [2, 3] (param's), got [3, 2]" in message


def test_scalar_with_two_elements_is_refused() -> None:
    optional = {"momentum_buffer"}
    inputs = random_inputs("float32", (2,), seed=0, optional=optional)
    inputs["momentum"] = np.asarray([0.9, 0.9])
    message = _run_error(make_session("float32", _present(optional), spec=SPEC), inputs)
    assert "input momentum: expected a scalar (shape [] or [1]), got shape [2]" in message


@pytest.mark.parametrize("buffer_input", [True, False])
def test_buffer_input_and_output_go_together(buffer_input: bool) -> None:
    optional = {"momentum_buffer"} if buffer_input else set()
    inputs = random_inputs("float32", (2,), seed=0, optional=optional)
    session = make_session("float32", _present(optional), state_output=not buffer_input, spec=SPEC)
    half = "the input without the output" if buffer_input else "the output without the input"
    assert (
        f"input momentum_buffer and output momentum_buffer_out go together (momentum): the node has {half}"
        in _run_error(session, inputs)
    )


@pytest.mark.parametrize("missing", ["step", "momentum"])
def test_buffer_needs_step_and_momentum(missing: str) -> None:
    optional = {"momentum_buffer"}
    inputs = random_inputs("float32", (2,), seed=0, optional=optional)
    del inputs[missing]
    session = make_session("float32", _present(optional) - {missing}, spec=SPEC)
    assert f"input {missing}: required with input momentum_buffer" in _run_error(session, inputs)


@pytest.mark.parametrize("momentum", [0.0, -0.5, float("nan")])
def test_buffer_needs_positive_momentum(momentum: float) -> None:
    optional = {"momentum_buffer"}
    inputs = random_inputs("float32", (2,), seed=0, optional=optional)
    inputs["momentum"] = np.asarray(momentum)
    message = _run_error(make_session("float32", _present(optional), spec=SPEC), inputs)
    assert "input momentum: expected a value > 0 with a momentum buffer, got" in message


def test_momentum_without_buffer_is_refused() -> None:
    inputs = random_inputs("float32", (2,), seed=0, optional=set())
    inputs["momentum"] = np.asarray(0.9)
    message = _run_error(make_session("float32", {"momentum"}, spec=SPEC), inputs)
    assert "input momentum: given without input momentum_buffer (momentum needs its buffer)" in message


def test_nesterov_without_momentum_is_refused() -> None:
    inputs = random_inputs("float32", (2,), seed=0, optional=set())
    message = _run_error(make_session("float32", set(), attributes={"nesterov": 1}, spec=SPEC), inputs)
    assert "attribute nesterov: 1 needs input momentum_buffer" in message


def test_lr_of_another_type_is_refused() -> None:
    """Refused by onnxruntime before the kernel runs, with its own message (no input name in it)."""
    inputs = random_inputs("float32", (2,), seed=0, optional=set())
    inputs["lr"] = inputs["lr"].astype(np.float32)
    with pytest.raises(Exception, match=r"Actual: \(tensor\(float\)\) , expected: \(tensor\(double\)\)"):
        make_session("float32", set(), spec=SPEC).run(None, inputs)


@pytest.mark.parametrize("name", ["maximize", "nesterov"])
@pytest.mark.parametrize(("value", "message"), [(2, "expected 0 or 1, got 2"), (1.0, "expected INT, got FLOAT")])
def test_bad_flag_is_refused_at_session_creation(name: str, value: object, message: str) -> None:
    with pytest.raises(Exception, match=f"SGDUpdate.*attribute {name}: {message}"):
        make_session("float32", set(), attributes={name: value}, spec=SPEC)


def test_every_combination_is_covered() -> None:
    """The reference test's parameters reach every branch the kernel selects on (5 flags)."""
    covered = set()
    for (optional, nesterov), maximize, step in itertools.product(COMBINATIONS, (False, True), (1, 3)):
        momentum = "momentum_buffer" in optional
        covered.add((maximize, "weight_decay" in optional, momentum, momentum and step == 1, nesterov))
    for flag in range(5):
        assert {combo[flag] for combo in covered} == {False, True}
