"""Edge cases of both kernels, and static type and shape inference.

Covered: empty dims, zero lengths, NaN and Inf, size-1 and odd dims, and what onnx and
onnxruntime infer about the outputs of a graph with ortlstm nodes.

Values are compared with the float64 oracle (tests/reference/lstm_ref.py), which follows
onnxruntime's LSTM: an entry of length 0 (and every entry when seq_length is 0) reports zero
final states, and its Ht/Ct gradients go nowhere. Expected shapes come from the spec.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnx.shape_inference
import onnxruntime as ort
import op_runner
import pytest
from onnx import TensorProto, helper
from reference.lstm_ref import lstm_backward, lstm_forward

import ortlstm.ops
from ortlstm.ops import schema

ORT_VERSION = tuple(int(part) for part in ort.__version__.split(".")[:2])
# Before onnxruntime 1.25 the kernels install no shape-inference hook on purpose: those runtimes
# crash in custom-op shape inference when an optional input in the middle is omitted.
ORT_INFERS_SHAPES = ORT_VERSION >= (1, 25)

OPS = ("LSTMTraining", "LSTMGrad")
LAYOUTS = (0, 1)
DTYPES = (np.float32, np.float64)
ELEM_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}
ORT_TYPE_NAMES = {TensorProto.FLOAT: "tensor(float)", TensorProto.DOUBLE: "tensor(double)"}

# Kernel vs the float64 oracle, on float32-representable inputs.
TOLERANCES = {  # dtype name -> (rtol, atol)
    "float32": (1e-4, 1e-5),
    "float64": (1e-10, 1e-12),
}

TRAINING = schema.op_by_name("LSTMTraining")
GRAD = schema.op_by_name("LSTMGrad")
GRAD_OUTPUTS = schema.output_names(GRAD)
UPSTREAM = ("grad_HAll", "grad_Ht", "grad_Ct")


# ---------------------------------------------------------------------------------------------
# Helpers


def _num_directions(direction: str) -> int:
    return schema.num_directions(direction)


def _spec_shape(port: schema.PortSpec, layout: int, dims: Mapping[str, int]) -> tuple[int, ...]:
    shape = []
    for expression in schema.shape_for_layout(port, layout):
        factor, name = schema.parse_dim(expression)
        shape.append(factor * dims[name])
    return tuple(shape)


def _draw(
    seq_length: int,
    batch_size: int,
    input_size: int,
    hidden_size: int,
    layout: int,
    direction: str,
    rng: np.random.Generator,
    *,
    optional: bool = True,
    sequence_lens: tuple[int, ...] | None = None,
) -> dict[str, np.ndarray | None]:
    """LSTMTraining inputs with the spec's shapes; float32-representable values held as float64.

    ``optional`` adds B, initial_h, initial_c and P; ``sequence_lens`` is added when given.
    """
    dims = {
        "seq_length": seq_length,
        "batch_size": batch_size,
        "input_size": input_size,
        "hidden_size": hidden_size,
        "num_directions": _num_directions(direction),
    }
    inputs: dict[str, np.ndarray | None] = {}
    for port in TRAINING.inputs:
        if port.name == "sequence_lens":
            inputs[port.name] = None if sequence_lens is None else np.array(sequence_lens, dtype=np.int32)
        elif port.optional and not optional:
            inputs[port.name] = None
        else:
            scale = 0.5 if port.name in ("W", "R", "P") else 1.0
            values = scale * rng.standard_normal(_spec_shape(port, layout, dims))
            inputs[port.name] = values.astype(np.float32).astype(np.float64)
    return inputs


def _attributes(hidden_size: int, layout: int, direction: str) -> dict[str, object]:
    return {"hidden_size": hidden_size, "direction": direction, "layout": layout}


def _upstream(forward: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random gradients reaching HAll, Ht and Ct, shaped like them."""
    return {
        f"grad_{name}": rng.standard_normal(forward[name].shape).astype(np.float32).astype(np.float64)
        for name in ("HAll", "Ht", "Ct")
    }


def _grad_inputs(
    inputs: Mapping[str, np.ndarray | None], stash: Mapping[str, np.ndarray], upstream: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray | None]:
    names = schema.input_names(GRAD)
    merged = {**inputs, **{name: stash[name] for name in ("HAll", "CAll", "IOFC")}, **upstream}
    return {name: merged.get(name) for name in names}


def _oracle_backward(
    inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object], upstream: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    return lstm_backward(**inputs, **attributes, **upstream)


def _assert_matches(
    actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], dtype: type, what: str
) -> None:
    """Same shapes, NaN and ±Inf in the same places, finite values within the dtype's tolerance."""
    rtol, atol = TOLERANCES[np.dtype(dtype).name]
    for name, value in expected.items():
        got = actual[name]
        assert got.dtype == np.dtype(dtype), f"{what}: {name} is {got.dtype}"
        assert got.shape == value.shape, f"{what}: {name} shape {got.shape}, expected {value.shape}"
        np.testing.assert_array_equal(np.isnan(got), np.isnan(value), err_msg=f"{what}: {name} NaN positions")
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(value), err_msg=f"{what}: {name} +Inf positions")
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(value), err_msg=f"{what}: {name} -Inf positions")
        finite = np.isfinite(value)
        np.testing.assert_allclose(got[finite], value[finite], rtol=rtol, atol=atol, err_msg=f"{what}: {name}")


def _forward_and_backward(
    inputs: dict[str, np.ndarray | None],
    attributes: dict[str, object],
    dtype: type,
    rng: np.random.Generator,
    upstream: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Kernel and oracle forward, then kernel LSTMGrad on the kernel's stash and oracle backward."""
    with np.errstate(all="ignore"):
        expected_forward = lstm_forward(**inputs, **attributes)
        actual_forward = op_runner.run("LSTMTraining", inputs, attributes, dtype=dtype)
        if upstream is None:
            upstream = _upstream(expected_forward, rng)
        grad_inputs = _grad_inputs(inputs, actual_forward, upstream)
        actual_backward = op_runner.run("LSTMGrad", grad_inputs, attributes, dtype=dtype)
        expected_backward = _oracle_backward(inputs, attributes, upstream)
    return actual_forward, expected_forward, actual_backward, expected_backward


# ---------------------------------------------------------------------------------------------
# Empty dims: batch_size 0 and seq_length 0


@pytest.mark.parametrize("optional", [True, False], ids=["all_inputs", "required_only"])
@pytest.mark.parametrize("direction", schema.DIRECTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("seq_length", "batch_size"), [(0, 3), (4, 0), (0, 0)], ids=["T0", "B0", "T0_B0"])
def test_empty_dims(
    seq_length: int, batch_size: int, layout: int, direction: str, optional: bool, rng: np.random.Generator
) -> None:
    hidden_size, input_size = 3, 2
    lens = (0,) * batch_size if optional else None
    inputs = _draw(
        seq_length, batch_size, input_size, hidden_size, layout, direction, rng, optional=optional, sequence_lens=lens
    )
    attributes = _attributes(hidden_size, layout, direction)
    what = f"T{seq_length}_B{batch_size} layout={layout} {direction} optional={optional}"
    actual_forward, expected_forward, actual_backward, expected_backward = _forward_and_backward(
        inputs, attributes, np.float32, rng
    )

    dims = {
        "seq_length": seq_length,
        "batch_size": batch_size,
        "input_size": input_size,
        "hidden_size": hidden_size,
        "num_directions": _num_directions(direction),
    }
    for port in TRAINING.outputs:
        assert actual_forward[port.name].shape == _spec_shape(port, layout, dims), f"{what}: {port.name}"
    for port in GRAD.outputs:
        assert actual_backward[port.name].shape == _spec_shape(port, layout, dims), f"{what}: {port.name}"
    _assert_matches(actual_forward, expected_forward, np.float32, what)
    _assert_matches(actual_backward, expected_backward, np.float32, what)
    # Nothing ran: zero final states (not initial_h/initial_c), and no gradient anywhere.
    for name in ("Ht", "Ct"):
        assert not np.any(actual_forward[name]), f"{what}: {name}"
    for name in GRAD_OUTPUTS:
        assert not np.any(actual_backward[name]), f"{what}: {name}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("direction", schema.DIRECTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_all_sequence_lens_zero(layout: int, direction: str, dtype: type, rng: np.random.Generator) -> None:
    seq_length, batch_size, hidden_size = 4, 3, 3
    inputs = _draw(seq_length, batch_size, 2, hidden_size, layout, direction, rng, sequence_lens=(0,) * batch_size)
    attributes = _attributes(hidden_size, layout, direction)
    what = f"all lengths 0, layout={layout} {direction}"
    actual_forward, expected_forward, actual_backward, expected_backward = _forward_and_backward(
        inputs, attributes, dtype, rng
    )
    _assert_matches(actual_forward, expected_forward, dtype, what)
    _assert_matches(actual_backward, expected_backward, dtype, what)
    for name, value in {**actual_forward, **actual_backward}.items():
        assert not np.any(value), f"{what}: {name} is not all zeros"


# ---------------------------------------------------------------------------------------------
# Size-1, zero-width and odd dims


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("direction", schema.DIRECTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    ("seq_length", "batch_size", "input_size", "hidden_size", "lens"),
    [
        pytest.param(1, 1, 1, 1, (1,), id="T1_B1_I1_H1"),
        pytest.param(1, 3, 1, 1, (1, 0, 1), id="T1_B3_I1_H1_lens"),
        pytest.param(5, 1, 1, 1, (3,), id="T5_B1_I1_H1_lens"),
        pytest.param(3, 2, 0, 2, None, id="T3_B2_I0_H2"),  # no input features: gates from bias and state only
        pytest.param(5, 3, 7, 37, (5, 3, 0), id="T5_B3_I7_H37_lens"),
        pytest.param(6, 17, 13, 37, None, id="T6_B17_I13_H37"),
    ],
)
def test_small_and_odd_dims(
    seq_length: int,
    batch_size: int,
    input_size: int,
    hidden_size: int,
    lens: tuple[int, ...] | None,
    layout: int,
    direction: str,
    dtype: type,
    rng: np.random.Generator,
) -> None:
    inputs = _draw(seq_length, batch_size, input_size, hidden_size, layout, direction, rng, sequence_lens=lens)
    attributes = _attributes(hidden_size, layout, direction)
    what = f"T{seq_length}_B{batch_size}_I{input_size}_H{hidden_size} lens={lens} layout={layout} {direction}"
    actual_forward, expected_forward, actual_backward, expected_backward = _forward_and_backward(
        inputs, attributes, dtype, rng
    )
    _assert_matches(actual_forward, expected_forward, dtype, what)
    _assert_matches(actual_backward, expected_backward, dtype, what)


# ---------------------------------------------------------------------------------------------
# NaN and Inf: no exception, and they reach exactly the outputs the oracle says they reach.

_NAN_SEQ_LENGTH, _NAN_BATCH_SIZE, _NAN_INPUT_SIZE, _NAN_HIDDEN_SIZE = 4, 3, 3, 4


def _poison_index(name: str, layout: int) -> tuple[int, ...]:
    """Where ``name`` gets the bad value: step 1 (where there is one) of batch entry 0."""
    if name == "X":
        return (1, 0, 0) if layout == 0 else (0, 1, 0)
    if name == "grad_HAll":
        return (1, 0, 0, 2) if layout == 0 else (0, 1, 0, 2)
    return {
        "W": (0, 2, 1),
        "R": (0, 3, 1),
        "B": (0, 5),
        "P": (0, 1),
        "initial_h": (0, 0, 1),
        "initial_c": (0, 0, 1),
        "grad_Ht": (0, 0, 1),
        "grad_Ct": (0, 0, 1),
    }[name]


# Per-batch-entry tensors: a bad value in entry 0 must leave entries 1.. finite.
_BATCH_AXIS = {  # name -> batch axis for layout 0, layout 1
    "HAll": (2, 0),
    "CAll": (2, 0),
    "IOFC": (2, 0),
    "Ht": (1, 0),
    "Ct": (1, 0),
    "dX": (1, 0),
    "dH0": (1, 0),
    "dC0": (1, 0),
}
_PER_ENTRY_SOURCES = {"X", "initial_h", "initial_c", "grad_HAll", "grad_Ht", "grad_Ct"}


_POISONS = [
    pytest.param(name, value, id=f"{name}={value}")
    for name in ("X", "W", "R", "B", "P", "initial_h", "initial_c", *UPSTREAM)
    for value in (np.nan, np.inf, -np.inf)
    if value != -np.inf or name in ("X", "initial_c", "grad_Ct")
]


# bidirectional runs both the forward and the reverse loop.
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("name", "value"), _POISONS)
def test_nan_and_inf(
    name: str, value: float, layout: int, direction: str, dtype: type, rng: np.random.Generator
) -> None:
    inputs = _draw(_NAN_SEQ_LENGTH, _NAN_BATCH_SIZE, _NAN_INPUT_SIZE, _NAN_HIDDEN_SIZE, layout, direction, rng)
    attributes = _attributes(_NAN_HIDDEN_SIZE, layout, direction)
    with np.errstate(all="ignore"):
        upstream = _upstream(lstm_forward(**inputs, **attributes), rng)
    poisoned = upstream if name in UPSTREAM else inputs
    poisoned[name] = poisoned[name].copy()
    poisoned[name][_poison_index(name, layout)] = value
    what = f"{name}={value} layout={layout} {direction}"

    actual_forward, expected_forward, actual_backward, expected_backward = _forward_and_backward(
        inputs, attributes, dtype, rng, upstream
    )
    _assert_matches(actual_forward, expected_forward, dtype, what)
    _assert_matches(actual_backward, expected_backward, dtype, what)
    if name in _PER_ENTRY_SOURCES:
        for output, tensor in {**actual_forward, **actual_backward}.items():
            if output in _BATCH_AXIS:
                others = np.delete(tensor, 0, axis=_BATCH_AXIS[output][layout])
                assert np.all(np.isfinite(others)), f"{what}: {output} of other batch entries"


def _gate_probe(
    steps: np.ndarray, hidden_size: int, clip: float | None, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray | None], dict[str, object]]:
    """Inputs and attributes under which every gate's pre-activation is a value of ``steps``.

    ``steps`` is [seq_length, batch_size]: input_size 1, W = 1, R = 0, B = 0, no peepholes;
    initial_h and initial_c random. A ``clip`` that never bites selects the general (unfused) path.
    """
    inputs = _draw(steps.shape[0], steps.shape[1], 1, hidden_size, 0, "forward", rng)
    inputs["X"] = steps[:, :, None].astype(np.float64)
    inputs["W"] = np.ones_like(inputs["W"])
    inputs["R"] = np.zeros_like(inputs["R"])
    inputs["B"] = np.zeros_like(inputs["B"])
    inputs["P"] = None
    attributes = _attributes(hidden_size, 0, "forward")
    if clip is not None:
        attributes["clip"] = clip
    return inputs, attributes


# Saturating pre-activations: every gate's pre-activation is one of these values (W = 1, R = 0,
# B = 0, input_size 1), around the points where the float kernels' exponential changes regime:
# tanh's e^(-2|x|) leaving the normal range (|x| ~ 43.7), sigmoid's e^(-x) underflowing (x ~ 87.3)
# and overflowing (x ~ -88.7), and far beyond.
_SATURATING_VALUES = (1e-3, 1.0, 20.0, 43.5, 43.9, 44.4, 60.0, 87.0, 87.5, 88.3, 88.8, 89.5, 100.0, 1e4, 3e38)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("hidden_size", [4, 20], ids=lambda size: f"H{size}")
@pytest.mark.parametrize("clip", [None, 1e38], ids=["default_cell", "general_path"])
def test_saturating_pre_activations(
    clip: float | None, hidden_size: int, dtype: type, rng: np.random.Generator
) -> None:
    values = np.array([0.0, *_SATURATING_VALUES, *(-v for v in _SATURATING_VALUES)], dtype=np.float32)
    inputs, attributes = _gate_probe(np.stack([values, -values]), hidden_size, clip, rng)
    what = f"saturating pre-activations H{hidden_size} clip={clip}"
    actual_forward, expected_forward, actual_backward, expected_backward = _forward_and_backward(
        inputs, attributes, dtype, rng
    )
    _assert_matches(actual_forward, expected_forward, dtype, what)
    _assert_matches(actual_backward, expected_backward, dtype, what)


# Gates saturated far out are exactly 0, 1 or -1, as the oracle's: a gate of 1e-308 instead of 0
# would turn 0 * inf = NaN into inf further on.
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("clip", [None, 1e38], ids=["default_cell", "general_path"])
def test_saturated_gates_are_exact(clip: float | None, dtype: type, rng: np.random.Generator) -> None:
    values = np.array([800.0, 1e4, 3e38, np.inf, -800.0, -1e4, -3e38, -np.inf])
    inputs, attributes = _gate_probe(values[None, :], 4, clip, rng)
    expected = lstm_forward(**inputs, **attributes)["IOFC"]
    assert set(np.unique(expected)) == {-1.0, 0.0, 1.0}
    actual = op_runner.run("LSTMTraining", inputs, attributes, dtype=dtype)["IOFC"]
    np.testing.assert_array_equal(actual, expected, err_msg=f"IOFC, clip={clip}")


# float64 activations keep their relative precision for small arguments (tanh by its own series
# below 1/4, lstm/fast_math.h): pre-activations from 1e-12 to 0.3, checked relative to the oracle
# with no absolute slack. (float32's tanh is accurate to a few ulp of 1 only, which is what a gate
# needs.)
_SMALL_VALUES = (1e-12, 1e-8, 1e-4, 0.1, 0.2499, 0.2501, 0.3)


@pytest.mark.parametrize("clip", [None, 1e38], ids=["default_cell", "general_path"])
def test_float64_small_pre_activations_keep_relative_precision(clip: float | None, rng: np.random.Generator) -> None:
    values = np.array([*_SMALL_VALUES, *(-v for v in _SMALL_VALUES)])
    inputs, attributes = _gate_probe(values[None, :], 20, clip, rng)
    inputs["initial_h"] = np.zeros_like(inputs["initial_h"])
    inputs["initial_c"] = np.zeros_like(inputs["initial_c"])
    expected = lstm_forward(**inputs, **attributes)
    actual = op_runner.run("LSTMTraining", inputs, attributes, dtype=np.float64)
    for name in ("IOFC", "CAll", "HAll"):  # the gates, C = i * tanh(x), H = o * tanh(C)
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-14, atol=0, err_msg=f"clip={clip}: {name}")


def _padded_case(layout: int, direction: str, rng: np.random.Generator) -> tuple[dict, dict, dict, tuple[int, ...]]:
    lens = (4, 2, 0)
    inputs = _draw(
        _NAN_SEQ_LENGTH, len(lens), _NAN_INPUT_SIZE, _NAN_HIDDEN_SIZE, layout, direction, rng, sequence_lens=lens
    )
    attributes = _attributes(_NAN_HIDDEN_SIZE, layout, direction)
    upstream = _upstream(lstm_forward(**inputs, **attributes), rng)
    return inputs, attributes, upstream, lens


def _padding_mask(lens: tuple[int, ...], layout: int, rank: int) -> np.ndarray:
    """True at the padded steps, t >= sequence_lens[b].

    Broadcastable to a layout-``layout`` tensor of ``rank``: X, or one shaped like HAll.
    """
    padded = np.arange(_NAN_SEQ_LENGTH)[:, None] >= np.array(lens)[None, :]  # [seq_length, batch_size]
    if layout == 1:
        mask = padded.T.reshape(len(lens), _NAN_SEQ_LENGTH, *([1] * (rank - 2)))
    elif rank == 3:  # X: [seq_length, batch_size, input_size]
        mask = padded[:, :, None]
    else:  # [seq_length, num_directions, batch_size, width]
        mask = padded[:, None, :, None]
    return mask


@pytest.mark.parametrize("direction", schema.DIRECTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_nan_in_padding_does_not_reach_the_forward(layout: int, direction: str, rng: np.random.Generator) -> None:
    """Steps past a sequence's length are not computed: NaN there changes no output."""
    inputs, attributes, _, lens = _padded_case(layout, direction, rng)
    clean = op_runner.run("LSTMTraining", inputs, attributes)
    dirty = dict(inputs, X=np.where(_padding_mask(lens, layout, 3), np.nan, inputs["X"]))
    actual = op_runner.run("LSTMTraining", dirty, attributes)
    for name, value in clean.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


# dW = dGatesᵀ·X over every step: padded steps must not contribute 0·NaN.
@pytest.mark.parametrize("output", GRAD_OUTPUTS)
@pytest.mark.parametrize("direction", schema.DIRECTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_nan_in_padding_does_not_reach_the_gradients(
    layout: int, direction: str, output: str, rng: np.random.Generator
) -> None:
    inputs, attributes, upstream, lens = _padded_case(layout, direction, rng)
    stash = op_runner.run("LSTMTraining", inputs, attributes)
    clean = op_runner.run("LSTMGrad", _grad_inputs(inputs, stash, upstream), attributes, outputs=[output])
    dirty = dict(inputs, X=np.where(_padding_mask(lens, layout, 3), np.nan, inputs["X"]))
    actual = op_runner.run("LSTMGrad", _grad_inputs(dirty, stash, upstream), attributes, outputs=[output])
    np.testing.assert_array_equal(actual[output], clean[output], err_msg=output)


@pytest.mark.parametrize("direction", schema.DIRECTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_nan_upstream_gradient_of_outputs_that_do_not_depend_on_anything(
    layout: int, direction: str, rng: np.random.Generator
) -> None:
    """NaN or Inf in the upstream gradient of a constant output goes nowhere.

    HAll at padded steps and Ht/Ct of a length-0 entry are constant zeros.
    """
    inputs, attributes, upstream, lens = _padded_case(layout, direction, rng)
    stash = op_runner.run("LSTMTraining", inputs, attributes)
    clean = op_runner.run("LSTMGrad", _grad_inputs(inputs, stash, upstream), attributes)
    never_ran = np.array(lens) == 0
    state_mask = never_ran[None, :, None] if layout == 0 else never_ran[:, None, None]
    dirty_upstream = {
        "grad_HAll": np.where(_padding_mask(lens, layout, 4), np.nan, upstream["grad_HAll"]),
        "grad_Ht": np.where(state_mask, np.inf, upstream["grad_Ht"]),
        "grad_Ct": np.where(state_mask, np.nan, upstream["grad_Ct"]),
    }
    actual = op_runner.run("LSTMGrad", _grad_inputs(inputs, stash, dirty_upstream), attributes)
    for name, value in clean.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


# ---------------------------------------------------------------------------------------------
# Static type and shape inference


def _symbolic_dims(direction: str) -> dict[str, int | str]:
    return {
        "seq_length": "T",
        "batch_size": "N",
        "input_size": 3,
        "hidden_size": 5,
        "num_directions": _num_directions(direction),
    }


def _concrete_dims(direction: str) -> dict[str, int | str]:
    return {
        "seq_length": 4,
        "batch_size": 2,
        "input_size": 3,
        "hidden_size": 5,
        "num_directions": _num_directions(direction),
    }


def _declared_shape(port: schema.PortSpec, layout: int, dims: Mapping[str, int | str]) -> list[int | str]:
    """The spec's shape with symbols kept (``4*T`` never occurs: factors only scale known dims)."""
    shape: list[int | str] = []
    for expression in schema.shape_for_layout(port, layout):
        factor, name = schema.parse_dim(expression)
        value = dims[name]
        shape.append(value if isinstance(value, str) else factor * value)
    return shape


def _inference_model(
    op: schema.OpSpec,
    present: list[str],
    elem_type: int,
    layout: int,
    direction: str,
    dims: Mapping[str, int | str],
    *,
    consumer: str | None = None,
) -> onnx.ModelProto:
    """One ortlstm node whose inputs have known shapes and whose outputs carry no type or shape.

    With ``consumer`` (an op type such as ``"Neg"``), each output goes through a standard op first,
    so the graph outputs are what onnxruntime's standard inference derives from ours.
    """
    outputs = list(schema.output_names(op))
    raw = {name: (f"{name}_raw" if consumer else name) for name in outputs}
    node = ortlstm.ops.make_node(
        op.name,
        {name: name for name in present},
        raw,
        name="under_test",
        hidden_size=dims["hidden_size"],
        direction=direction,
        layout=layout,
    )
    nodes = [node] + ([helper.make_node(consumer, [raw[name]], [name]) for name in outputs] if consumer else [])
    graph_inputs = [
        helper.make_tensor_value_info(
            port.name,
            TensorProto.INT32 if port.name == "sequence_lens" else elem_type,
            _declared_shape(port, layout, dims),
        )
        for port in op.inputs
        if port.name in present
    ]
    graph_outputs = [helper.make_empty_tensor_value_info(name) for name in outputs]
    graph = helper.make_graph(nodes, op.name, graph_inputs, graph_outputs)
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", op_runner.ONNX_OPSET),
            helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION),
        ],
        ir_version=op_runner.IR_VERSION,
    )


def _dims_of(value_type: onnx.TypeProto) -> list[int | str]:
    return [dim.dim_param if dim.HasField("dim_param") else dim.dim_value for dim in value_type.tensor_type.shape.dim]


_INFERENCE_CASES = [
    pytest.param(op, direction, layout, dtype, id=f"{op}_{direction}_layout{layout}_{np.dtype(dtype).name}")
    for op in OPS
    for direction in ("forward", "bidirectional")
    for layout in LAYOUTS
    for dtype in DTYPES
]


@pytest.mark.parametrize("dims_kind", ["concrete", "symbolic"])
@pytest.mark.parametrize(("op_name", "direction", "layout", "dtype"), _INFERENCE_CASES)
def test_onnx_infers_types_and_shapes(op_name: str, direction: str, layout: int, dtype: type, dims_kind: str) -> None:
    op = schema.op_by_name(op_name)
    dims = _concrete_dims(direction) if dims_kind == "concrete" else _symbolic_dims(direction)
    elem_type = ELEM_TYPES[np.dtype(dtype)]
    present = [port.name for port in op.inputs]
    model = _inference_model(op, present, elem_type, layout, direction, dims)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    outputs = {value.name: value.type for value in inferred.graph.output}
    for port in op.outputs:
        assert outputs[port.name].tensor_type.elem_type == elem_type, port.name
        assert _dims_of(outputs[port.name]) == _declared_shape(port, layout, dims), port.name


@pytest.mark.parametrize(("op_name", "direction", "layout", "dtype"), _INFERENCE_CASES)
def test_onnxruntime_infers_types_and_shapes(op_name: str, direction: str, layout: int, dtype: type) -> None:
    """Output types follow X's on every runtime; shapes are inferred from onnxruntime 1.25.

    Before 1.25 the kernels install no shape inference on purpose: the outputs stay of unknown shape.
    """
    op = schema.op_by_name(op_name)
    dims = _symbolic_dims(direction)
    elem_type = ELEM_TYPES[np.dtype(dtype)]
    present = [port.name for port in op.inputs]
    model = _inference_model(op, present, elem_type, layout, direction, dims, consumer="Neg")
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )
    outputs = {value.name: value for value in session.get_outputs()}
    for port in op.outputs:
        assert outputs[port.name].type == ORT_TYPE_NAMES[elem_type], port.name
        if ORT_INFERS_SHAPES:
            assert outputs[port.name].shape == _declared_shape(port, layout, dims), port.name
        else:
            assert not outputs[port.name].shape, f"{port.name}: {outputs[port.name].shape}"


# An omitted optional input in the middle of the input list: onnxruntime < 1.25 crashed in
# custom-op shape inference on these, which is why the hook is off there.
_OMITTED_MIDDLE = {
    "LSTMTraining": ["X", "W", "R", "B", "initial_h", "P"],  # no sequence_lens, no initial_c
    "LSTMGrad": ["X", "W", "R", "initial_h", "HAll", "CAll", "IOFC", "grad_Ht", "P"],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("op_name", OPS)
def test_omitted_middle_input_loads_and_runs(op_name: str, dtype: type, rng: np.random.Generator) -> None:
    op = schema.op_by_name(op_name)
    direction, layout = "bidirectional", 0
    dims = _symbolic_dims(direction)
    present = _OMITTED_MIDDLE[op_name]
    model = _inference_model(op, present, ELEM_TYPES[np.dtype(dtype)], layout, direction, dims)
    assert "" in list(model.graph.node[0].input), "the node must have an omitted input in the middle"
    session = ort.InferenceSession(
        model.SerializeToString(), ortlstm.ops.session_options(), providers=["CPUExecutionProvider"]
    )

    hidden_size = int(dims["hidden_size"])
    inputs = _draw(4, 2, int(dims["input_size"]), hidden_size, layout, direction, rng)
    inputs["initial_c"] = None
    attributes = _attributes(hidden_size, layout, direction)
    forward = lstm_forward(**inputs, **attributes)
    if op_name == "LSTMTraining":
        expected = forward
    else:
        inputs["B"] = None  # LSTMGrad has no B; the stash below is that of a bias-free forward
        forward = lstm_forward(**inputs, **attributes)
        upstream = {"grad_Ht": rng.standard_normal(forward["Ht"].shape)}
        inputs.update(HAll=forward["HAll"], CAll=forward["CAll"], IOFC=forward["IOFC"], **upstream)
        expected = lstm_backward(
            **{name: inputs[name] for name in schema.input_names(TRAINING)}, **attributes, **upstream
        )
    feeds = {name: np.asarray(inputs[name], dtype=dtype) for name in present}
    actual = dict(zip(schema.output_names(op), session.run(None, feeds), strict=True))
    _assert_matches(actual, expected, dtype, f"{op_name} with inputs {present}")
    if ORT_INFERS_SHAPES:
        for value in session.get_outputs():
            port = next(port for port in op.outputs if port.name == value.name)
            assert value.shape == _declared_shape(port, layout, dims), value.name
