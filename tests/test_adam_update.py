"""The AdamUpdate kernel against an exact elementwise reference, and its refusals.

The reference takes every operation the op's formula names (docs/ops.md#adamupdate) one at a time
in the parameter's type: NumPy's scalar subtract, multiply, divide and sqrt are correctly rounded,
and each fused multiply-add is computed in exact rational arithmetic (``fractions.Fraction``) and
rounded once to the nearest value of the type, ties to even. So the kernel must match it bit for
bit, in float32 and float64. graphs/optimizers.py's standard-op update is a second oracle for
float32 (tests/test_optimizers.py); torch's recorded trajectories are the third.
"""

from __future__ import annotations

import fractions
import itertools

import numpy as np
import onnx
import onnx.helper
import onnxruntime as ort
import pytest

from ortlstm import ops
from ortlstm.ops import schema

SPEC = schema.ADAM_UPDATE
SCALARS = ("neg_step_size", "bias_correction2_sqrt", "exp_avg_weight", "beta2", "exp_avg_sq_weight", "eps")
DTYPES = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE}


def _round(value: fractions.Fraction, dtype: np.dtype) -> np.floating:
    """``value`` rounded to the nearest ``dtype`` value, ties to even (one rounding, no double rounding)."""
    guess = dtype.type(float(value))
    candidates = [np.nextafter(guess, dtype.type(-np.inf)), guess, np.nextafter(guess, dtype.type(np.inf))]
    finite = [c for c in candidates if np.isfinite(c)]

    def key(c: np.floating) -> tuple[fractions.Fraction, int]:
        mantissa_odd = int(np.frombuffer(c.tobytes(), dtype=np.uint32 if dtype == np.float32 else np.uint64)[0]) & 1
        return abs(fractions.Fraction(float(c)) - value), mantissa_odd

    return min(finite, key=key)


def _fma(a: np.floating, b: np.floating, c: np.floating) -> np.floating:
    dtype = np.dtype(type(a))
    exact = fractions.Fraction(float(a)) * fractions.Fraction(float(b)) + fractions.Fraction(float(c))
    return _round(exact, dtype)


def scalars_of(inputs: dict[str, np.ndarray], dtype: np.dtype, decoupled: bool) -> dict[str, np.floating]:
    """Torch's scalars from the float64 inputs, in Python floats (``**`` is C's pow), rounded to ``dtype``."""
    h = {name: float(inputs[name].reshape(())) for name in ("lr", "step", "beta1", "beta2", "eps")}
    weight_decay = float(inputs["weight_decay"].reshape(())) if "weight_decay" in inputs else 0.0
    bias_correction1 = 1 - h["beta1"] ** h["step"]
    bias_correction2 = 1 - h["beta2"] ** h["step"]
    s = {
        "neg_step_size": -(h["lr"] / bias_correction1),
        "bias_correction2_sqrt": bias_correction2**0.5,
        "exp_avg_weight": 1 - h["beta1"],
        "beta2": h["beta2"],
        "exp_avg_sq_weight": 1 - h["beta2"],
        "eps": h["eps"],
    }
    if weight_decay != 0 and decoupled:
        s["decay"] = 1 - h["lr"] * weight_decay
    elif weight_decay != 0:
        s["weight_decay"] = weight_decay
    return {name: dtype.type(value) for name, value in s.items()}


def reference(
    inputs: dict[str, np.ndarray], maximize: bool, decoupled: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The update element by element, each operation as the op's documentation spells it."""
    param, grad, exp_avg, exp_avg_sq = (inputs[name] for name in ("param", "grad", "exp_avg", "exp_avg_sq"))
    dtype = param.dtype
    s = scalars_of(inputs, dtype, decoupled)
    one = dtype.type(1)
    weight = s["exp_avg_weight"]
    lerp_from_start = abs(weight) < dtype.type(0.5)
    amsgrad = "max_exp_avg_sq" in inputs
    outputs = [np.empty_like(param) for _ in range(4 if amsgrad else 3)]
    for index in np.ndindex(param.shape):
        g = -grad[index] if maximize else grad[index]
        p = param[index]
        if "weight_decay" in s:
            g = _fma(p, s["weight_decay"], g)
        if "decay" in s:
            p = p * s["decay"]
        m = exp_avg[index]
        m_new = _fma(g - m, weight, m) if lerp_from_start else _fma(g - m, weight - one, g)
        v_new = _fma(s["exp_avg_sq_weight"] * g, g, exp_avg_sq[index] * s["beta2"])
        second = v_new
        if amsgrad:
            previous = inputs["max_exp_avg_sq"][index]
            second = previous if np.isnan(previous) or previous > v_new else v_new
            outputs[3][index] = second
        denom = np.sqrt(second) / s["bias_correction2_sqrt"] + s["eps"]
        outputs[0][index] = p + (s["neg_step_size"] * m_new) / denom
        outputs[1][index] = m_new
        outputs[2][index] = v_new
    return outputs[0], outputs[1], outputs[2], outputs[3] if amsgrad else None


def make_session(
    dtype: str,
    present: set[str],
    *,
    state_output: bool | None = None,
    attributes: dict[str, object] | None = None,
    threads: int = 2,
    spec: schema.OpSpec = SPEC,
) -> ort.InferenceSession:
    """One node of optimizer op ``spec`` over graph inputs named as its ports (the ``present`` optional ones).

    Its optional state output (AdamUpdate's max_exp_avg_sq_out, SGDUpdate's momentum_buffer_out) is
    wired when ``state_output`` says so, by default when the optional state input is present.
    """
    names = [port.name if (not port.optional or port.name in present) else "" for port in spec.inputs]
    while not names[-1]:
        names.pop()
    optional_state = {port.name for port in spec.inputs if port.optional and port.type_str == "T"}
    wired = bool(optional_state & present) if state_output is None else state_output
    outputs = [port.name for port in spec.outputs if not port.optional or wired]
    node = onnx.helper.make_node(spec.name, names, outputs, domain=spec.domain, name="update", **(attributes or {}))
    elem = DTYPES[dtype]
    float64_ports = {port.name for port in spec.inputs if port.type_str == "T1"}
    graph = onnx.helper.make_graph(
        [node],
        "optimizer_update",
        [
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.DOUBLE if name in float64_ports else elem, None)
            for name in names
            if name
        ],
        [onnx.helper.make_tensor_value_info(name, elem, None) for name in outputs],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid(ops.DOMAIN, ops.OPSET_VERSION)]
    )
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), ops.session_options(intra_op_num_threads=threads))


def random_inputs(
    dtype: str, shape: tuple[int, ...], *, beta1: float, seed: int, optional: set[str]
) -> dict[str, np.ndarray]:
    """Parameters, gradients and moments as in training (v >= 0); the hyperparameters in float64."""
    rng = np.random.default_rng(seed)
    t = np.dtype(dtype)
    inputs = {
        "param": rng.standard_normal(shape).astype(t),
        "grad": rng.standard_normal(shape).astype(t),
        "exp_avg": (0.1 * rng.standard_normal(shape)).astype(t),
        "exp_avg_sq": (0.01 * rng.random(shape)).astype(t),
        "lr": np.asarray(1e-2),
        "step": np.asarray([3.0]),  # [1] as well as []
        "beta1": np.asarray(beta1),
        "beta2": np.asarray(0.999),
        "eps": np.asarray(1e-8),
    }
    if "max_exp_avg_sq" in optional:
        inputs["max_exp_avg_sq"] = (0.01 * rng.random(shape)).astype(t)
    if "weight_decay" in optional:
        # Close to -grad / param for some elements, so that grad + weight_decay * param cancels.
        inputs["weight_decay"] = np.asarray(0.5)
        inputs["grad"][..., :2] = (-0.5 * inputs["param"][..., :2] * (1 + 1e-3)).astype(t)
    return inputs


OPTIONAL_SETS = [set(), {"max_exp_avg_sq"}, {"weight_decay"}, {"max_exp_avg_sq", "weight_decay"}]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("optional", OPTIONAL_SETS, ids=lambda o: "+".join(sorted(o)) or "plain")
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("beta1", [0.9, 0.2], ids=["lerp_from_start", "lerp_from_end"])
def test_matches_exact_reference(dtype: str, optional: set[str], decoupled: bool, maximize: bool, beta1: float) -> None:
    inputs = random_inputs(dtype, (5, 7), beta1=beta1, seed=len(optional) + 10 * maximize, optional=optional)
    attributes = {"maximize": int(maximize), "decoupled_weight_decay": int(decoupled)}
    got = make_session(dtype, optional, attributes=attributes).run(None, inputs)
    want = [value for value in reference(inputs, maximize, decoupled) if value is not None]
    assert len(got) == len(want)
    for port, actual, expected in zip(SPEC.outputs, got, want, strict=False):
        assert actual.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(actual, expected, err_msg=port.name)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_threads_do_not_change_the_result(dtype: str) -> None:
    """Large enough for several tasks; every element is computed alike whichever task has it."""
    optional = {"max_exp_avg_sq", "weight_decay"}
    inputs = random_inputs(dtype, (3, 100_003), beta1=0.9, seed=7, optional=optional)
    attributes = {"decoupled_weight_decay": 1}
    sessions = [make_session(dtype, optional, attributes=attributes, threads=threads) for threads in (1, 2, 3)]
    results = [session.run(None, inputs) for session in sessions]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    # A slice through the exact reference, from the end (the last task's tail).
    tail = {name: value[:, -9:] if value.ndim == 2 else value for name, value in inputs.items()}
    for actual, expected in zip(results[0], reference(tail, False, True), strict=True):
        np.testing.assert_array_equal(actual[:, -9:], expected)


def test_amsgrad_maximum_propagates_nan() -> None:
    """torch.maximum's rule: NaN in either the running maximum or the new moment gives NaN."""
    inputs = random_inputs("float32", (4,), beta1=0.9, seed=3, optional={"max_exp_avg_sq"})
    inputs["max_exp_avg_sq"][0] = np.nan
    inputs["grad"][1] = np.nan
    _, _, _, maximum = make_session("float32", {"max_exp_avg_sq"}).run(None, inputs)
    assert np.isnan(maximum[:2]).all()
    assert np.isfinite(maximum[2:]).all()


def test_empty_parameter() -> None:
    inputs = random_inputs("float64", (0, 3), beta1=0.9, seed=1, optional=set())
    for value in make_session("float64", set()).run(None, inputs):
        assert value.shape == (0, 3)


def _run_error(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> str:
    with pytest.raises(Exception) as caught:  # onnxruntime raises its own types
        session.run(None, inputs)
    return str(caught.value)


@pytest.mark.parametrize("port", ["grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"])
def test_shape_mismatch_names_the_input(port: str) -> None:
    inputs = random_inputs("float32", (2, 3), beta1=0.9, seed=0, optional={"max_exp_avg_sq"})
    inputs[port] = inputs[port].reshape(3, 2)
    message = _run_error(make_session("float32", {"max_exp_avg_sq"}), inputs)
    assert f"AdamUpdate node 'update': input {port}: expected shape [2, 3] (param's), got [3, 2]" in message


def test_scalar_with_two_elements_is_refused() -> None:
    inputs = random_inputs("float32", (2,), beta1=0.9, seed=0, optional=set())
    inputs["beta2"] = np.asarray([0.999, 0.999])
    message = _run_error(make_session("float32", set()), inputs)
    assert "input beta2: expected a scalar (shape [] or [1]), got shape [2]" in message


@pytest.mark.parametrize("amsgrad_input", [True, False])
def test_amsgrad_input_and_output_go_together(amsgrad_input: bool) -> None:
    optional = {"max_exp_avg_sq"} if amsgrad_input else set()
    inputs = random_inputs("float32", (2,), beta1=0.9, seed=0, optional=optional)
    message = _run_error(make_session("float32", optional, state_output=not amsgrad_input), inputs)
    half = "the input without the output" if amsgrad_input else "the output without the input"
    assert f"input max_exp_avg_sq and output max_exp_avg_sq_out go together (amsgrad): the node has {half}" in message


def test_hyperparameter_of_another_type_is_refused() -> None:
    """Refused by onnxruntime before the kernel runs, with its own message (no input name in it)."""
    inputs = random_inputs("float32", (2,), beta1=0.9, seed=0, optional=set())
    inputs["beta1"] = inputs["beta1"].astype(np.float32)
    with pytest.raises(Exception, match=r"Actual: \(tensor\(float\)\) , expected: \(tensor\(double\)\)"):
        make_session("float32", set()).run(None, inputs)


@pytest.mark.parametrize("name", ["maximize", "decoupled_weight_decay"])
@pytest.mark.parametrize(("value", "message"), [(2, "expected 0 or 1, got 2"), (1.0, "expected INT, got FLOAT")])
def test_bad_flag_is_refused_at_session_creation(name: str, value: object, message: str) -> None:
    with pytest.raises(Exception, match=f"attribute {name}: {message}"):
        make_session("float32", set(), attributes={name: value})


def test_every_combination_is_covered() -> None:
    """The reference test's parameters reach every branch the kernel selects on (5 flags)."""
    covered = set()
    for optional, decoupled, maximize, beta1 in itertools.product(
        OPTIONAL_SETS, (False, True), (False, True), (0.9, 0.2)
    ):
        decay = "weight_decay" in optional
        covered.add(
            (maximize, decay and not decoupled, decay and decoupled, "max_exp_avg_sq" in optional, beta1 == 0.9)
        )
    for flag in range(5):
        assert {combo[flag] for combo in covered} == {False, True}
