"""NumPy reference implementation of the ortlstm ops, for ``onnx.reference.ReferenceEvaluator``.

Role in the flow: a second, independent implementation of the op contract in ops/schema.py, in
plain NumPy, that runs without the C++ library. Other runtimes, kernels and exporters check
themselves against it, and the conformance data (``ortlstm.conformance``) is generated from it.
It imports only the spec from the package; the kernels never call it, and the tests keep their own
oracle (tests/reference/lstm_ref.py), which shares no code with this module::

    import ortlstm.reference
    from onnx.reference import ReferenceEvaluator

    session = ReferenceEvaluator(model, new_ops=ortlstm.reference.OPS)
    outputs = session.run(None, feeds)

``OPS`` holds the GRU and RNN ops too: ``GRUTraining``, ``GRUGrad``, ``RNNTraining`` and ``RNNGrad``,
whose math (equations in their docstrings) is ``ortlstm.reference_gru`` and ``ortlstm.reference_rnn``, on
this module's attribute rules and input checks.

``LSTMTraining``, per direction and step t, gates stacked i, o, f, c in W, R and B, activations
f, g, h (default Sigmoid, Tanh, Tanh), ``clip`` clamping to [-clip, clip] (identity without it)::

    i_t = f(clip(X_t W_i^T + H_{t-1} R_i^T + Wb_i + Rb_i + P_i * C_{t-1}))
    f_t = f(clip(X_t W_f^T + H_{t-1} R_f^T + Wb_f + Rb_f + P_f * C_{t-1}))     (1 - i_t if input_forget)
    c_t = g(clip(X_t W_c^T + H_{t-1} R_c^T + Wb_c + Rb_c))
    C_t = f_t * C_{t-1} + i_t * c_t
    o_t = f(clip(X_t W_o^T + H_{t-1} R_o^T + Wb_o + Rb_o + P_o * C_t))
    H_t = o_t * h(C_t)

A reverse direction runs t = L-1, ..., 0 for a sequence of length L. Steps t >= L are zero in
HAll, CAll and IOFC; Ht and Ct hold the state after the last step that ran, and are zero (not the
initial state) for a sequence of length 0, as onnxruntime's LSTM reports.

``LSTMGrad`` differentiates that from the stash alone (it has no B input): H_{t-1} and C_{t-1} are
HAll and CAll of the step processed before (initial_h / initial_c, or zeros, for the first), and
each gate derivative is written in terms of the activated gate in IOFC, so the stash fully
determines the result. With ``dH`` the gradient reaching H_t (grad_HAll_t plus what step t+1 sends
back, starting from grad_Ht) and ``dC`` likewise for C_t (starting from grad_Ct)::

    dpre_o   = dH * h(C_t) * f'(o_t)
    dC      += dH * o_t * h'(C_t) + dpre_o * P_o
    dpre_i   = dC * c_t * f'(i_t)          (input_forget: dC * (c_t - C_{t-1}) * f'(i_t), dpre_f = 0)
    dpre_f   = dC * C_{t-1} * f'(f_t)
    dpre_c   = dC * i_t * g'(c_t)
    dC_{t-1} = dC * f_t + dpre_i * P_i + dpre_f * P_f,   dH_{t-1} = dpre R
    dX_t = dpre W,  dW += dpre^T X_t,  dR += dpre^T H_{t-1},  dWb = dRb += sum_batch dpre
    dP_i += sum_batch dpre_i * C_{t-1},  dP_o += sum_batch dpre_o * C_t,  dP_f += sum_batch dpre_f * C_{t-1}

A gate whose activation input was clipped (its activated value equals f(+-clip) or g(+-clip)
exactly) passes no gradient. Gradients of Ht / Ct of a sequence of length 0 go nowhere.

Attributes follow onnxruntime's LSTM: activation names are case-insensitive; ``activation_alpha``
and ``activation_beta`` are read by two independent cursors, in activation order (direction 0's
f, g, h, then direction 1's): an activation that takes an alpha (Affine, LeakyRelu,
ThresholdedRelu, ScaledTanh, HardSigmoid, Elu) takes the next alpha, one that takes a beta
(Affine, ScaledTanh, HardSigmoid) the next beta, the default once a list runs out, and surplus
values are ignored (so a list with one value per activation is accepted). Defaults: LeakyRelu
alpha 0.01, HardSigmoid 0.2 and 0.5, Elu alpha 1, every other 0 (an Affine without values gives 0).

Precision: every computation runs in float64; outputs take the inputs' float type (float32 or
float64), so float32 results are the float64 ones rounded once.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from onnx.reference.op_run import OpRun

from ortlstm.ops import schema
from ortlstm.reference_precision import matmul, parse_matmul_precision

_Array = np.ndarray
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_SEQUENCE_LENS_DTYPE = np.dtype(np.int32)
_CLIP_ULPS = 4  # how far a stashed gate may be from act(+-clip), in units of the last place, to count as clipped


@dataclasses.dataclass(frozen=True)
class _ActivationRule:
    """What an activation reads from the alpha/beta lists and its defaults (onnxruntime's)."""

    takes_alpha: bool
    takes_beta: bool
    default_alpha: float = 0.0
    default_beta: float = 0.0


# Keys: lower-case names, as matched (names are case-insensitive).
_ACTIVATION_RULES: dict[str, _ActivationRule] = {
    "relu": _ActivationRule(False, False),
    "tanh": _ActivationRule(False, False),
    "sigmoid": _ActivationRule(False, False),
    "affine": _ActivationRule(True, True),
    "leakyrelu": _ActivationRule(True, False, default_alpha=0.01),
    "thresholdedrelu": _ActivationRule(True, False),
    "scaledtanh": _ActivationRule(True, True),
    "hardsigmoid": _ActivationRule(True, True, default_alpha=0.2, default_beta=0.5),
    "elu": _ActivationRule(True, False, default_alpha=1.0),
    "softsign": _ActivationRule(False, False),
    "softplus": _ActivationRule(False, False),
}
if set(_ACTIVATION_RULES) != {name.lower() for name in schema.ACTIVATIONS}:
    raise ImportError(f"ortlstm.reference knows {sorted(_ACTIVATION_RULES)}, the spec {list(schema.ACTIVATIONS)}")
_SPELLING = {name.lower(): name for name in schema.ACTIVATIONS}


def _sigmoid(x: _Array) -> _Array:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@dataclasses.dataclass(frozen=True)
class Activation:
    """One of f, g, h with its alpha and beta resolved; ``kind`` is the spec's spelling."""

    kind: str
    alpha: float
    beta: float

    def __call__(self, x: _Array) -> _Array:
        """The activation, elementwise."""
        a, b = self.alpha, self.beta
        kind = self.kind.lower()
        with np.errstate(over="ignore", invalid="ignore"):
            if kind == "relu":
                return np.where(x > 0.0, x, np.where(np.isnan(x), x, 0.0))
            if kind == "tanh":
                return np.tanh(x)
            if kind == "sigmoid":
                return _sigmoid(x)
            if kind == "affine":
                return a * x + b
            if kind == "leakyrelu":
                return np.where(x >= 0.0, x, a * x)
            if kind == "thresholdedrelu":
                return np.where(x > a, x, np.where(np.isnan(x), x, 0.0))
            if kind == "scaledtanh":
                return a * np.tanh(b * x)
            if kind == "hardsigmoid":
                return np.clip(a * x + b, 0.0, 1.0)
            if kind == "elu":
                return np.where(x >= 0.0, x, a * np.expm1(np.minimum(x, 0.0)))
            if kind == "softsign":
                return x / (1.0 + np.abs(x))
            return np.logaddexp(0.0, x)  # softplus

    def derivative_from_input(self, x: _Array) -> _Array:
        """The derivative d act / dx at x (at a kink, the right-hand value)."""
        a, b = self.alpha, self.beta
        kind = self.kind.lower()
        if kind == "relu":
            return (x > 0.0).astype(np.float64)
        if kind == "tanh":
            return 1.0 - np.tanh(x) ** 2
        if kind == "sigmoid":
            return _sigmoid(x) * (1.0 - _sigmoid(x))
        if kind == "affine":
            return np.full_like(x, a)
        if kind == "leakyrelu":
            return np.where(x >= 0.0, 1.0, a)
        if kind == "thresholdedrelu":
            return (x > a).astype(np.float64)
        if kind == "scaledtanh":
            return a * b * (1.0 - np.tanh(b * x) ** 2)
        if kind == "hardsigmoid":
            y = a * x + b
            return np.where((y > 0.0) & (y < 1.0), a, 0.0)
        if kind == "elu":
            return np.where(x >= 0.0, 1.0, a * np.exp(np.minimum(x, 0.0)))
        if kind == "softsign":
            return 1.0 / (1.0 + np.abs(x)) ** 2
        return _sigmoid(x)  # softplus

    def derivative_from_output(self, y: _Array) -> _Array:
        """The derivative d act / dx written in terms of y = act(x), as LSTMGrad reads the activated gates.

        Exact for every activation except LeakyRelu and Elu with a negative or NaN alpha, which
        LSTMGrad refuses as f or g (their output does not tell which side of 0 the input was).
        """
        a, b = self.alpha, self.beta
        kind = self.kind.lower()
        if kind == "relu":
            return (y > 0.0).astype(np.float64)
        if kind == "tanh":
            return 1.0 - y * y
        if kind == "sigmoid":
            return y * (1.0 - y)
        if kind == "affine":
            return np.full_like(y, a)
        if kind == "leakyrelu":  # alpha >= 0: y >= 0 exactly where x >= 0
            return np.where((y > 0.0) | ((y == 0.0) & (a != 0.0)), 1.0, a)
        if kind == "thresholdedrelu":
            return (y != 0.0).astype(np.float64)
        if kind == "scaledtanh":
            return np.zeros_like(y) if a == 0.0 else a * b * (1.0 - (y / a) ** 2)
        if kind == "hardsigmoid":
            return np.where((y > 0.0) & (y < 1.0), a, 0.0)
        if kind == "elu":  # below 0: a * e^x = y + a
            return np.where(y >= 0.0, 1.0, y + a)
        if kind == "softsign":
            return (1.0 - np.abs(y)) ** 2
        return -np.expm1(-y)  # softplus: sigmoid(x) = 1 - e^-y


@dataclasses.dataclass(frozen=True)
class LstmAttributes:
    """The attributes of one node, parsed and checked as the kernels do when a session is created."""

    hidden_size: int
    direction: str
    activations: tuple[tuple[Activation, Activation, Activation], ...]  # (f, g, h) per direction
    clip: float | None  # None: no clipping
    input_forget: bool
    layout: int
    matmul_precision: str = "float32"  # of every GEMM (reference_precision.py)

    @property
    def num_directions(self) -> int:
        """2 for bidirectional, else 1."""
        return schema.num_directions(self.direction)

    def is_reverse(self, d: int) -> bool:
        """Whether direction slot d runs backwards in time."""
        return self.direction == "reverse" or (self.direction == "bidirectional" and d == 1)


def _decoded(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [_decoded(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def parse_attributes(attributes: Mapping[str, Any]) -> LstmAttributes:
    """Parses and checks the attributes of an LSTMTraining or LSTMGrad node.

    Args:
        attributes: Attribute name -> value as Python values (bytes are decoded); absent
            attributes are left out or None.

    Returns:
        The parsed attributes.

    Raises:
        ValueError: For every attribute the kernels refuse, with the same wording.
    """
    values = {name: _decoded(value) for name, value in attributes.items() if value is not None}

    def accepts(name: str) -> str:
        return schema.attribute(schema.LSTM_TRAINING, name).accepts

    hidden_size = values.get("hidden_size")
    if hidden_size is None:
        raise ValueError("attribute hidden_size is required (a positive integer) but is missing")
    if not 1 <= int(hidden_size) <= schema.MAX_HIDDEN_SIZE:
        raise ValueError(f"attribute hidden_size: expected {accepts('hidden_size')}, got {hidden_size}")
    direction = values.get("direction", "forward")
    if direction not in schema.DIRECTIONS:
        raise ValueError(f"attribute direction: expected {accepts('direction')}, got '{direction}'")
    num_directions = schema.num_directions(direction)

    names, source = _activation_names(values)
    if not names:
        names, source = ["Sigmoid", "Tanh", "Tanh"] * num_directions, "activations"
    if len(names) != 3 * num_directions:
        raise ValueError(
            f"attribute {source}: expected 3*num_directions={3 * num_directions} names (f, g, h per direction, "
            f"direction={direction}), got {len(names)} [{', '.join(names)}]"
        )
    alphas = iter(float(np.float32(value)) for value in values.get("activation_alpha", ()))
    betas = iter(float(np.float32(value)) for value in values.get("activation_beta", ()))
    resolved = []
    for position, name in enumerate(names):
        rule = _ACTIVATION_RULES.get(name.lower())
        if rule is None:
            raise ValueError(
                f"attribute {source}: unknown activation '{name}' at position {position}; expected one of "
                f"{', '.join(schema.ACTIVATIONS)}"
            )
        # Attribute values are float32, and so are onnxruntime's defaults (0.01f): round them alike.
        default_alpha, default_beta = float(np.float32(rule.default_alpha)), float(np.float32(rule.default_beta))
        alpha = next(alphas, default_alpha) if rule.takes_alpha else default_alpha
        beta = next(betas, default_beta) if rule.takes_beta else default_beta
        resolved.append(Activation(_SPELLING[name.lower()], alpha, beta))
    # Surplus alpha/beta values are ignored, as onnxruntime's LSTM does.

    clip = values.get("clip")
    if clip is not None:
        clip = float(np.float32(clip))
        if not clip > 0.0:
            raise ValueError(f"attribute clip: expected {accepts('clip')}, got {clip:f}")
        if np.isinf(clip):
            clip = None  # +inf clips nothing
    input_forget = int(values.get("input_forget", 0))
    layout = int(values.get("layout", 0))
    if layout not in (0, 1):
        raise ValueError(f"attribute layout: expected {accepts('layout')}, got {layout}")
    return LstmAttributes(
        hidden_size=int(hidden_size),
        direction=direction,
        activations=tuple(tuple(resolved[3 * d : 3 * d + 3]) for d in range(num_directions)),  # type: ignore[misc]
        clip=clip,
        input_forget=input_forget != 0,
        layout=layout,
        matmul_precision=parse_matmul_precision(values),
    )


def _activation_names(values: Mapping[str, Any]) -> tuple[list[str], str]:
    """The activation names and the attribute they came from; ([], "") when neither is set."""
    listed = values.get("activations")
    csv = values.get("activations_csv")
    from_csv = [name.strip() for name in csv.split(",")] if csv else []
    if listed and csv and [name.lower() for name in listed] != [name.lower() for name in from_csv]:
        raise ValueError(
            f"attributes activations and activations_csv disagree: activations has {len(listed)} names, "
            f"activations_csv is '{csv}'"
        )
    if listed:
        return list(listed), "activations"
    if from_csv:
        return from_csv, "activations_csv"
    return [], ""


def _check_grad_activations(attrs: LstmAttributes, op: str = "LSTMGrad") -> None:
    """LSTMGrad (and GRUGrad) read f' and g' off the activated gates: LeakyRelu/Elu need alpha >= 0 there."""
    for d, (f_act, g_act, _) in enumerate(attrs.activations):
        for role, act in (("f", f_act), ("g", g_act)):
            if act.kind in ("LeakyRelu", "Elu") and not act.alpha >= 0.0:
                raise ValueError(
                    f"attribute activation_alpha: {op} needs alpha >= 0 for {act.kind} as {role} "
                    f"(direction {d}), got {act.alpha}; its output then does not determine its derivative"
                )


# ---------------------------------------------------------------------------------------------
# Inputs: types and shapes, checked as the kernels check them.


def _dims_and_dtype(
    op: schema.OpSpec, inputs: Mapping[str, _Array | None], attrs: LstmAttributes
) -> tuple[dict[str, int], np.dtype]:
    """Binds the spec's dim names from X and the attributes, then checks every present input."""
    X = inputs["X"]
    if X is None or X.ndim != 3:
        rank = "absent" if X is None else f"rank {X.ndim} {list(X.shape)}"
        expected = schema.shape_for_layout(op.inputs[schema.input_index(op, "X")], attrs.layout)
        raise ValueError(f"X: expected rank 3 [{', '.join(expected)}] (layout={attrs.layout}), got {rank}")
    dtype = X.dtype
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"X: expected float32 or float64, got {dtype}")
    first, second, input_size = X.shape
    seq_length, batch_size = (second, first) if attrs.layout == 1 else (first, second)
    dims = {
        "seq_length": seq_length,
        "batch_size": batch_size,
        "input_size": input_size,
        "hidden_size": attrs.hidden_size,
        "num_directions": attrs.num_directions,
    }
    for port in op.inputs:
        value = inputs.get(port.name)
        if value is None:
            if not port.optional:
                raise ValueError(f"{port.name}: a required input is missing")
            continue
        expected_dtype = _SEQUENCE_LENS_DTYPE if port.type_str == "T1" else dtype
        if value.dtype != expected_dtype:
            raise ValueError(f"{port.name}: expected element type {expected_dtype} (as X's), got {value.dtype}")
        expressions = schema.shape_for_layout(port, attrs.layout)
        expected_shape = tuple(_dim_value(expression, dims) for expression in expressions)
        if value.shape != expected_shape:
            described = ", ".join(f"{e}={v}" for e, v in zip(expressions, expected_shape, strict=True))
            raise ValueError(f"{port.name}: expected [{described}], got {list(value.shape)}")
    lens = inputs.get("sequence_lens")
    if lens is not None and lens.size and (lens.min() < 0 or lens.max() > seq_length):
        index = int(np.flatnonzero((lens < 0) | (lens > seq_length))[0])
        raise ValueError(
            f"sequence_lens: every value must be in [0, seq_length={seq_length}], got {lens[index]} at index {index}"
        )
    return dims, dtype


def _dim_value(expression: str, dims: Mapping[str, int]) -> int:
    factor, name = schema.parse_dim(expression)
    return factor * dims[name]


def _to_layout0(value: _Array | None, layout: int, batch_axis: int) -> _Array | None:
    """A layout-1 tensor with batch_size first, moved to its layout-0 position, as float64."""
    if value is None:
        return None
    value = np.asarray(value, dtype=np.float64)
    return np.moveaxis(value, 0, batch_axis) if layout == 1 else value


def _from_layout0(value: _Array, layout: int, batch_axis: int) -> _Array:
    return np.moveaxis(value, batch_axis, 0) if layout == 1 else value


def _split4(gates: _Array, hidden_size: int) -> tuple[_Array, _Array, _Array, _Array]:
    """[..., 4*hidden_size] in iofc order -> (i, o, f, c)."""
    return tuple(gates[..., k * hidden_size : (k + 1) * hidden_size] for k in range(4))  # type: ignore[return-value]


def _clip(x: _Array, clip: float | None) -> _Array:
    return x if clip is None else np.clip(x, -clip, clip)


# ---------------------------------------------------------------------------------------------
# The ops as functions of port-name dicts.


def lstm_training(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """LSTMTraining on NumPy arrays.

    Args:
        inputs: Input port name -> array (None or absent for an omitted optional input), in the
            node's ``layout``.
        **attributes: The node's attributes (``hidden_size`` required).

    Returns:
        Every output port name -> array, in the inputs' float type and ``layout``.

    Raises:
        ValueError: For attributes or inputs the kernels refuse.
    """
    attrs = parse_attributes(attributes)
    dims, dtype = _dims_and_dtype(schema.LSTM_TRAINING, inputs, attrs)
    outputs = _forward(inputs, attrs, dims)
    return {name: value.astype(dtype) for name, value in outputs.items()}


def _forward(inputs: Mapping[str, _Array | None], attrs: LstmAttributes, dims: Mapping[str, int]) -> dict[str, _Array]:
    seq_length, batch_size = dims["seq_length"], dims["batch_size"]
    hidden, directions, precision = attrs.hidden_size, attrs.num_directions, attrs.matmul_precision
    X = _to_layout0(inputs["X"], attrs.layout, 1)  # [seq_length, batch_size, input_size]
    assert X is not None  # a required input
    W = np.asarray(inputs["W"], np.float64)
    R = np.asarray(inputs["R"], np.float64)
    B = inputs.get("B")
    B = np.zeros((directions, 8 * hidden)) if B is None else np.asarray(B, np.float64)
    bias = B[:, : 4 * hidden] + B[:, 4 * hidden :]  # Wb + Rb
    P = inputs.get("P")
    peephole = np.zeros((directions, 3 * hidden)) if P is None else np.asarray(P, np.float64)
    state_shape = (directions, batch_size, hidden)
    h0 = _to_layout0(inputs.get("initial_h"), attrs.layout, 1)
    c0 = _to_layout0(inputs.get("initial_c"), attrs.layout, 1)
    h0 = np.zeros(state_shape) if h0 is None else h0
    c0 = np.zeros(state_shape) if c0 is None else c0
    lens = inputs.get("sequence_lens")
    lengths = np.full(batch_size, seq_length) if lens is None else lens.astype(np.int64)

    HAll = np.zeros((seq_length, directions, batch_size, hidden))  # Y
    CAll = np.zeros_like(HAll)
    IOFC = np.zeros((seq_length, directions, batch_size, 4 * hidden))
    Ht = np.zeros(state_shape)
    Ct = np.zeros(state_shape)
    for d in range(directions):
        f_act, g_act, h_act = attrs.activations[d]
        P_i, P_o, P_f = np.split(peephole[d], 3)
        h, c = h0[d].copy(), c0[d].copy()
        times = range(seq_length - 1, -1, -1) if attrs.is_reverse(d) else range(seq_length)
        for t in times:
            active = (t < lengths)[:, None]  # [batch_size, 1]
            pre = matmul(precision, X[t], W[d].T) + matmul(precision, h, R[d].T) + bias[d]
            pre_i, pre_o, pre_f, pre_c = _split4(pre, hidden)
            i = f_act(_clip(pre_i + P_i * c, attrs.clip))
            forget = 1.0 - i if attrs.input_forget else f_act(_clip(pre_f + P_f * c, attrs.clip))
            cell_in = g_act(_clip(pre_c, attrs.clip))
            c_new = forget * c + i * cell_in
            o = f_act(_clip(pre_o + P_o * c_new, attrs.clip))
            h_new = o * h_act(c_new)
            HAll[t, d] = np.where(active, h_new, 0.0)
            CAll[t, d] = np.where(active, c_new, 0.0)
            IOFC[t, d] = np.where(active, np.concatenate([i, o, forget, cell_in], axis=-1), 0.0)
            h = np.where(active, h_new, h)
            c = np.where(active, c_new, c)
        ran = (lengths > 0)[:, None]
        Ht[d] = np.where(ran, h, 0.0)
        Ct[d] = np.where(ran, c, 0.0)
    return {
        "HAll": _from_layout0(HAll, attrs.layout, 2),
        "Ht": _from_layout0(Ht, attrs.layout, 1),
        "Ct": _from_layout0(Ct, attrs.layout, 1),
        "CAll": _from_layout0(CAll, attrs.layout, 2),
        "IOFC": _from_layout0(IOFC, attrs.layout, 2),
    }


def lstm_grad(inputs: Mapping[str, _Array | None], **attributes: Any) -> dict[str, _Array]:
    """LSTMGrad on NumPy arrays.

    Args:
        inputs: Input port name -> array (None or absent for an omitted optional input), in the
            node's ``layout``; HAll, CAll and IOFC as LSTMTraining returned them.
        **attributes: The forward node's attributes.

    Returns:
        Every output port name -> array, in the inputs' float type and ``layout``.

    Raises:
        ValueError: For attributes or inputs the kernels refuse.
    """
    attrs = parse_attributes(attributes)
    _check_grad_activations(attrs)
    dims, dtype = _dims_and_dtype(schema.LSTM_GRAD, inputs, attrs)
    outputs = _backward(inputs, attrs, dims, dtype)
    return {name: value.astype(dtype) for name, value in outputs.items()}


def _gate_derivative(act: Activation, y: _Array, clip: float | None, dtype: np.dtype) -> _Array:
    """f'(pre) from the stashed y = act(clip(pre)); zero where the clip held (y is act(+-clip)).

    A stash from another implementation holds its own act(+-clip), which may differ from this
    module's in the last bits (a kernel's fast tanh or sigmoid), so "is" allows a few units in the
    last place of the stash's type. An unclipped gate that close to the bound is as good as clipped.
    """
    derivative = act.derivative_from_output(y)
    if clip is None:
        return derivative
    clipped = np.zeros(y.shape, dtype=bool)
    for bound in act(np.array([clip, -clip])):
        tolerance = _CLIP_ULPS * np.spacing(np.abs(np.asarray(bound, dtype=dtype))).astype(np.float64)
        clipped |= np.abs(y - bound) <= tolerance
    return np.where(clipped, 0.0, derivative)


def _backward(
    inputs: Mapping[str, _Array | None], attrs: LstmAttributes, dims: Mapping[str, int], dtype: np.dtype
) -> dict[str, _Array]:
    seq_length, batch_size = dims["seq_length"], dims["batch_size"]
    hidden, directions, precision = attrs.hidden_size, attrs.num_directions, attrs.matmul_precision
    X = _to_layout0(inputs["X"], attrs.layout, 1)
    assert X is not None  # a required input
    W = np.asarray(inputs["W"], np.float64)
    R = np.asarray(inputs["R"], np.float64)
    P = inputs.get("P")
    peephole = np.zeros((directions, 3 * hidden)) if P is None else np.asarray(P, np.float64)
    state_shape = (directions, batch_size, hidden)
    seq_shape = (seq_length, directions, batch_size, hidden)

    def state(name: str) -> _Array:
        value = _to_layout0(inputs.get(name), attrs.layout, 1)
        return np.zeros(state_shape) if value is None else value

    def sequence(name: str, width: int = hidden) -> _Array:
        value = _to_layout0(inputs.get(name), attrs.layout, 2)
        return np.zeros((*seq_shape[:3], width)) if value is None else value

    h0, c0, grad_Ht, grad_Ct = state("initial_h"), state("initial_c"), state("grad_Ht"), state("grad_Ct")
    HAll, CAll, grad_HAll, IOFC = (
        sequence("HAll"),
        sequence("CAll"),
        sequence("grad_HAll"),
        sequence("IOFC", 4 * hidden),
    )
    lens = inputs.get("sequence_lens")
    lengths = np.full(batch_size, seq_length) if lens is None else lens.astype(np.int64)
    ran = (lengths > 0)[:, None]

    dX = np.zeros_like(X)
    dW, dR = np.zeros_like(W), np.zeros_like(R)
    dB = np.zeros((directions, 8 * hidden))
    dP = np.zeros((directions, 3 * hidden))
    dH0, dC0 = np.zeros(state_shape), np.zeros(state_shape)
    for d in range(directions):
        f_act, g_act, h_act = attrs.activations[d]
        P_i, P_o, P_f = np.split(peephole[d], 3)
        reverse = attrs.is_reverse(d)
        dH = np.where(ran, grad_Ht[d], 0.0)  # gradient reaching the carried H
        dC = np.where(ran, grad_Ct[d], 0.0)
        times = range(seq_length) if reverse else range(seq_length - 1, -1, -1)  # processing order, reversed
        for t in times:
            active = (t < lengths)[:, None]
            before = t + 1 if reverse else t - 1  # the step processed before t
            has_before = ((before < lengths) & (before >= 0))[:, None]
            h_prev = np.where(has_before, HAll[min(max(before, 0), seq_length - 1), d], h0[d])
            c_prev = np.where(has_before, CAll[min(max(before, 0), seq_length - 1), d], c0[d])
            i, o, forget, cell_in = _split4(IOFC[t, d], hidden)
            cell = CAll[t, d]
            dH_t = dH + grad_HAll[t, d]
            dpre_o = dH_t * h_act(cell) * _gate_derivative(f_act, o, attrs.clip, dtype)
            dC_t = dC + dH_t * o * h_act.derivative_from_input(cell) + dpre_o * P_o
            if attrs.input_forget:
                dpre_i = dC_t * (cell_in - c_prev) * _gate_derivative(f_act, i, attrs.clip, dtype)
                dpre_f = np.zeros_like(dpre_i)
            else:
                dpre_i = dC_t * cell_in * _gate_derivative(f_act, i, attrs.clip, dtype)
                dpre_f = dC_t * c_prev * _gate_derivative(f_act, forget, attrs.clip, dtype)
            dpre_c = dC_t * i * _gate_derivative(g_act, cell_in, attrs.clip, dtype)
            dpre = np.where(active, np.concatenate([dpre_i, dpre_o, dpre_f, dpre_c], axis=-1), 0.0)
            dpre_i, dpre_o, dpre_f, _ = _split4(dpre, hidden)
            dX[t] += matmul(precision, dpre, W[d])
            dW[d] += matmul(precision, dpre.T, X[t])
            dR[d] += matmul(precision, dpre.T, h_prev)
            dB[d] += np.tile(dpre.sum(axis=0), 2)
            dP[d] += np.concatenate(
                [(dpre_i * c_prev).sum(axis=0), (dpre_o * cell).sum(axis=0), (dpre_f * c_prev).sum(axis=0)]
            )
            # An inactive step passes its state through unchanged.
            dH = np.where(active, matmul(precision, dpre, R[d]), dH)
            dC = np.where(active, dC_t * forget + dpre_i * P_i + dpre_f * P_f, dC)
        dH0[d], dC0[d] = dH, dC
    return {
        "dX": _from_layout0(dX, attrs.layout, 1),
        "dW": dW,
        "dR": dR,
        "dB": dB,
        "dH0": _from_layout0(dH0, attrs.layout, 1),
        "dC0": _from_layout0(dC0, attrs.layout, 1),
        "dP": dP,
    }


# ---------------------------------------------------------------------------------------------
# onnx.reference OpRun classes.


def _run_node(
    node: OpRun,
    op: schema.OpSpec,
    compute: Callable[..., dict[str, _Array]],
    args: Sequence[_Array | None],
    attributes: Mapping[str, Any],
) -> tuple[_Array, ...]:
    """Maps a node's positional inputs and outputs to port names and runs ``compute``.

    An input whose name in the node is empty counts as absent whatever value the evaluator passes:
    onnx's evaluator stores an omitted output under the name "" too, so "" may hold a stale value.
    """
    node_inputs = list(node.onnx_node.input)
    if len(args) > len(op.inputs):
        raise ValueError(f"{op.name} takes at most {len(op.inputs)} inputs, got {len(args)}")
    inputs = {
        port.name: (None if index >= len(args) or not node_inputs[index] else args[index])
        for index, port in enumerate(op.inputs)
    }
    node_outputs = list(node.onnx_node.output)
    if len(node_outputs) > len(op.outputs):
        raise ValueError(f"{op.name} has {len(op.outputs)} outputs, the node lists {len(node_outputs)}")
    results = compute(inputs, **attributes)
    dtype = results[op.outputs[0].name].dtype
    # onnx's evaluator takes no None output; an omitted one gets an empty array.
    return tuple(
        results[port.name] if name else np.empty(0, dtype) for port, name in zip(op.outputs, node_outputs, strict=False)
    )


class LSTMTraining(OpRun):
    """``ortlstm::LSTMTraining`` for ``ReferenceEvaluator`` (see the module docstring)."""

    op_domain = schema.DOMAIN

    def _run(self, *args: _Array | None, **attributes: Any) -> tuple[_Array, ...]:
        return _run_node(self, schema.LSTM_TRAINING, lstm_training, args, attributes)


class LSTMGrad(OpRun):
    """``ortlstm::LSTMGrad`` for ``ReferenceEvaluator`` (see the module docstring)."""

    op_domain = schema.DOMAIN

    def _run(self, *args: _Array | None, **attributes: Any) -> tuple[_Array, ...]:
        return _run_node(self, schema.LSTM_GRAD, lstm_grad, args, attributes)


def _cell_op(op: schema.OpSpec, module: str, function: str) -> type[OpRun]:
    """The ``ReferenceEvaluator`` op of another recurrent cell, whose math is ``ortlstm.<module>.<function>``.

    The module is imported when the op runs: it builds on this module.
    """

    def _run(self: OpRun, *args: _Array | None, **attributes: Any) -> tuple[_Array, ...]:
        compute = getattr(importlib.import_module(f"ortlstm.{module}"), function)
        return _run_node(self, op, compute, args, attributes)

    doc = f"``ortlstm::{op.name}`` for ``ReferenceEvaluator`` (the math: ``ortlstm.{module}``)."
    return type(op.name, (OpRun,), {"op_domain": schema.DOMAIN, "_run": _run, "__doc__": doc, "__module__": __name__})


GRUTraining = _cell_op(schema.GRU_TRAINING, "reference_gru", "gru_training_op")
GRUGrad = _cell_op(schema.GRU_GRAD, "reference_gru", "gru_grad_op")
RNNTraining = _cell_op(schema.RNN_TRAINING, "reference_rnn", "rnn_training_op")
RNNGrad = _cell_op(schema.RNN_GRAD, "reference_rnn", "rnn_grad_op")


OPS: tuple[type[OpRun], ...] = (LSTMTraining, LSTMGrad, GRUTraining, GRUGrad, RNNTraining, RNNGrad)
"""The domain's recurrent ops, for ``ReferenceEvaluator(model, new_ops=OPS)``."""

_DECLARED = (*schema.OPS, *schema.GRU_OPS, *schema.RNN_OPS)
if tuple(cls.__name__ for cls in OPS) != tuple(op.name for op in _DECLARED):
    raise ImportError(f"ortlstm.reference implements {[cls.__name__ for cls in OPS]}, the spec declares {_DECLARED}")
