"""Float64 NumPy oracle for the ONNX LSTM forward pass and its backward pass.

Role in the flow: test-only ground truth. ``lstm_forward`` reproduces what onnxruntime's
standard ``LSTM`` kernel computes (Y, Y_h, Y_c) and also returns what ``LSTMTraining`` stashes
for ``LSTMGrad`` (all cell states, activated gates). ``lstm_backward`` is the gradient of a
weighted sum of the forward outputs. It must stay plain NumPy (no package imports), readable
next to the equations below, and slow is fine.

Equations (one direction, one step t; ``⊙`` is elementwise, ``clip`` clamps to
[-clip, +clip] and is the identity when the attribute is absent)::

    i_t = f(clip(X_t·W_iᵀ + H_{t-1}·R_iᵀ + Wb_i + Rb_i + P_i ⊙ C_{t-1}))
    f_t = f(clip(X_t·W_fᵀ + H_{t-1}·R_fᵀ + Wb_f + Rb_f + P_f ⊙ C_{t-1}))   (input_forget=0)
    f_t = 1 - i_t                                                          (input_forget=1)
    c_t = g(clip(X_t·W_cᵀ + H_{t-1}·R_cᵀ + Wb_c + Rb_c))
    C_t = f_t ⊙ C_{t-1} + i_t ⊙ c_t
    o_t = f(clip(X_t·W_oᵀ + H_{t-1}·R_oᵀ + Wb_o + Rb_o + P_o ⊙ C_t))
    H_t = o_t ⊙ h(C_t)

Defaults: f = Sigmoid, g = Tanh, h = Tanh. Gate order in W, R, B and in the stashed gates is
i, o, f, c; B = [Wb_iofc, Rb_iofc]; P = [P_i, P_o, P_f]. For a batch entry with
sequence_lens[b] = L, only the steps t < L run (reverse direction: t = L-1, ..., 0); the state
is carried unchanged through the other steps, which are zero in Y (and in the stash).

Backward (per step, in reverse processing order; ``a_*`` are the clipped pre-activations,
``[|a| < clip]`` is the clip mask, dH and dC are what flows into H_t and C_t)::

    do       = dH ⊙ h(C_t)
    da_o     = do ⊙ f'(a_o) ⊙ [|a_o| < clip]
    dC       = dC + dH ⊙ o_t ⊙ h'(C_t) + da_o ⊙ P_o
    di, dc, df = dC ⊙ c_t, dC ⊙ i_t, dC ⊙ C_{t-1}
    di      -= df, df = 0                            (input_forget=1)
    da_i     = di ⊙ f'(a_i) ⊙ [|a_i| < clip],  likewise da_f (f'), da_c (g')
    dC_{t-1} = dC ⊙ f_t + da_i ⊙ P_i + da_f ⊙ P_f
    dH_{t-1} = da_iofc · R,  dX_t = da_iofc · W
    dW += da_iofcᵀ · X_t,  dR += da_iofcᵀ · H_{t-1},  dWb = dRb += Σ_batch da_iofc
    dP_i += Σ_batch da_i ⊙ C_{t-1},  dP_f += Σ_batch da_f ⊙ C_{t-1},  dP_o += Σ_batch da_o ⊙ C_t

Linear-activation mode (separates GEMM bugs from gate bugs): ``**linear_activation_attributes(
num_directions)`` gives activations=["Affine"]*3 per direction with alpha=1, beta=0. The alpha
and beta must be explicit: onnxruntime's Affine defaults are alpha=0, beta=0.

Documented onnxruntime 1.31.1 CPU behaviour (established by experiment; this module follows it):

* Data types: the kernel's type constraint allows double, but a double model fails at run time
  with "LSTM operator does not support double yet". Comparisons with ORT run in float32.
* Clip: applied to each gate's pre-activation after the bias and the peephole term are added,
  right before the activation (i, f, c, o). The cell state is never clipped: neither the
  reported Y_c nor the input of h(). Without the attribute there is no clipping.
* Peepholes: P_i ⊙ C_{t-1}, P_f ⊙ C_{t-1} (previous cell), P_o ⊙ C_t (new cell).
* input_forget=1: f_t = 1 - i_t with the activated i_t (whatever f is); W_f, R_f, Wb_f, Rb_f and
  P_f are ignored (changing them changes no output).
* sequence_lens: Y is zero at t >= sequence_lens[b]; Y_h, Y_c hold the state after the last step
  that ran. Reverse runs t = L-1, ..., 0. Length 0 is accepted and gives zero Y and
  Y_h = Y_c = 0 for that entry, NOT initial_h / initial_c. Values < 0 or > seq_length are
  rejected at run time ("All values must be >= 0 and <= seq_length").
* layout=1 is rejected at session creation ("Batchwise recurrent operations (layout == 1) are
  not supported"). This module implements layout=1 as the ONNX spec defines it (X, initial_h,
  initial_c, Y, Y_h, Y_c batch-major); tests compare it with ORT through transposes and with
  ``onnx.reference``.
* Activations: names are case-insensitive; an unknown name fails at session creation. The list
  must have exactly 3*num_directions entries (a bidirectional LSTM rejects 3). alpha and beta
  come from two independent cursors over activation_alpha and activation_beta, in list order
  (direction 0's f, g, h, then direction 1's); an activation advances only the cursors of the
  parameters it uses (Affine, ScaledTanh, HardSigmoid: alpha and beta; LeakyRelu,
  ThresholdedRelu, Elu: alpha; Relu, Tanh, Sigmoid, Softsign, Softplus: none). Once a list
  runs out the default applies: Affine alpha=0 beta=0 (so the output is 0), ScaledTanh alpha=0
  beta=0, HardSigmoid alpha=0.2 beta=0.5, LeakyRelu alpha=0.01, ThresholdedRelu alpha=0
  (y = x where x > alpha, else 0), Elu alpha=1. Surplus values are ignored silently.
* seq_length = 0: Y is empty, Y_h is 0, and Y_c is uninitialised memory (NaN and garbage were
  observed). This module returns Y_h = Y_c = 0, as for length-0 sequences.
* batch_size = 0: the process aborts inside ``run()`` (std::terminate, SIGABRT). This module
  returns empty outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

_Array = np.ndarray
_ActivationFn = Callable[[_Array, float, float], _Array]

GATE_ORDER = "iofc"
DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")


@dataclasses.dataclass(frozen=True)
class _ActivationKind:
    """One ONNX RNN activation: value, derivative, which of alpha/beta it reads, defaults."""

    value: _ActivationFn
    derivative: _ActivationFn
    uses_alpha: bool
    uses_beta: bool
    default_alpha: float = 0.0
    default_beta: float = 0.0
    # Points where the derivative is discontinuous (finite differences must stay away).
    kinks: Callable[[float, float], tuple[float, ...]] = lambda alpha, beta: ()


def _sigmoid(x: _Array) -> _Array:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _hard_sigmoid_kinks(alpha: float, beta: float) -> tuple[float, ...]:
    return () if alpha == 0.0 else (-beta / alpha, (1.0 - beta) / alpha)


# Keys are lower-case: onnxruntime matches activation names case-insensitively.
_ACTIVATIONS: dict[str, _ActivationKind] = {
    "relu": _ActivationKind(
        value=lambda x, a, b: np.maximum(x, 0.0),
        derivative=lambda x, a, b: (x > 0.0).astype(np.float64),
        uses_alpha=False,
        uses_beta=False,
        kinks=lambda a, b: (0.0,),
    ),
    "tanh": _ActivationKind(
        value=lambda x, a, b: np.tanh(x),
        derivative=lambda x, a, b: 1.0 - np.tanh(x) ** 2,
        uses_alpha=False,
        uses_beta=False,
    ),
    "sigmoid": _ActivationKind(
        value=lambda x, a, b: _sigmoid(x),
        derivative=lambda x, a, b: _sigmoid(x) * (1.0 - _sigmoid(x)),
        uses_alpha=False,
        uses_beta=False,
    ),
    "affine": _ActivationKind(
        value=lambda x, a, b: a * x + b,
        derivative=lambda x, a, b: np.full_like(x, a),
        uses_alpha=True,
        uses_beta=True,
    ),
    "leakyrelu": _ActivationKind(
        value=lambda x, a, b: np.where(x >= 0.0, x, a * x),
        derivative=lambda x, a, b: np.where(x >= 0.0, 1.0, a),
        uses_alpha=True,
        uses_beta=False,
        default_alpha=0.01,
        kinks=lambda a, b: (0.0,),
    ),
    "thresholdedrelu": _ActivationKind(
        value=lambda x, a, b: np.where(x > a, x, 0.0),
        derivative=lambda x, a, b: (x > a).astype(np.float64),
        uses_alpha=True,
        uses_beta=False,
        kinks=lambda a, b: (a,),
    ),
    "scaledtanh": _ActivationKind(
        value=lambda x, a, b: a * np.tanh(b * x),
        derivative=lambda x, a, b: a * b * (1.0 - np.tanh(b * x) ** 2),
        uses_alpha=True,
        uses_beta=True,
    ),
    "hardsigmoid": _ActivationKind(
        value=lambda x, a, b: np.clip(a * x + b, 0.0, 1.0),
        derivative=lambda x, a, b: np.where((a * x + b > 0.0) & (a * x + b < 1.0), a, 0.0),
        uses_alpha=True,
        uses_beta=True,
        default_alpha=0.2,
        default_beta=0.5,
        kinks=_hard_sigmoid_kinks,
    ),
    "elu": _ActivationKind(
        value=lambda x, a, b: np.where(x >= 0.0, x, a * np.expm1(np.minimum(x, 0.0))),
        derivative=lambda x, a, b: np.where(x >= 0.0, 1.0, a * np.exp(np.minimum(x, 0.0))),
        uses_alpha=True,
        uses_beta=False,
        default_alpha=1.0,
        kinks=lambda a, b: (0.0,),
    ),
    "softsign": _ActivationKind(
        value=lambda x, a, b: x / (1.0 + np.abs(x)),
        derivative=lambda x, a, b: 1.0 / (1.0 + np.abs(x)) ** 2,
        uses_alpha=False,
        uses_beta=False,
        kinks=lambda a, b: (0.0,),
    ),
    "softplus": _ActivationKind(
        value=lambda x, a, b: np.logaddexp(0.0, x),
        derivative=lambda x, a, b: _sigmoid(x),
        uses_alpha=False,
        uses_beta=False,
    ),
}


@dataclasses.dataclass(frozen=True)
class Activation:
    """An activation function with its alpha and beta resolved."""

    name: str
    alpha: float
    beta: float

    def __call__(self, x: _Array) -> _Array:
        """The activation applied elementwise."""
        return _ACTIVATIONS[self.name.lower()].value(x, self.alpha, self.beta)

    def derivative(self, x: _Array) -> _Array:
        """The derivative at x (0 on flat pieces; at a kink, the value of one side)."""
        return _ACTIVATIONS[self.name.lower()].derivative(x, self.alpha, self.beta)

    def kinks(self) -> tuple[float, ...]:
        """Inputs where the derivative jumps; finite differences must keep away from them."""
        return _ACTIVATIONS[self.name.lower()].kinks(self.alpha, self.beta)


def parse_activations(
    activations: Sequence[str] | None,
    activation_alpha: Sequence[float] | None,
    activation_beta: Sequence[float] | None,
    num_directions: int,
) -> list[tuple[Activation, Activation, Activation]]:
    """Resolves the activation attributes into (f, g, h) per direction, as onnxruntime does.

    Two independent cursors walk activation_alpha and activation_beta in list order; each
    activation takes the next value from the lists it uses, or its default once a list runs
    short; surplus values are ignored.

    Raises:
        ValueError: unknown activation name or wrong list length.
    """
    names = list(activations) if activations else list(DEFAULT_ACTIVATIONS) * num_directions
    if len(names) != 3 * num_directions:
        raise ValueError(f"activations: expected 3*num_directions={3 * num_directions} entries, got {len(names)}")
    alphas = iter(activation_alpha or ())
    betas = iter(activation_beta or ())
    resolved = []
    for name in names:
        kind = _ACTIVATIONS.get(name.lower())
        if kind is None:
            raise ValueError(f"activations: unknown activation {name!r}")
        alpha = next(alphas, kind.default_alpha) if kind.uses_alpha else kind.default_alpha
        beta = next(betas, kind.default_beta) if kind.uses_beta else kind.default_beta
        resolved.append(Activation(name, float(alpha), float(beta)))
    return [tuple(resolved[3 * d : 3 * d + 3]) for d in range(num_directions)]  # type: ignore[misc]


def linear_activation_attributes(num_directions: int = 1) -> dict[str, list]:
    """Attributes that make f, g and h the identity (Affine with explicit alpha=1, beta=0)."""
    return {
        "activations": ["Affine"] * (3 * num_directions),
        "activation_alpha": [1.0] * (3 * num_directions),
        "activation_beta": [0.0] * (3 * num_directions),
    }


@dataclasses.dataclass
class StepRecord:
    """Everything one step of one direction computed; inactive batch rows hold garbage."""

    t: int
    active: _Array  # [batch_size, 1] bool: t < sequence_lens[b]
    x: _Array  # [batch_size, input_size]
    h_prev: _Array  # [batch_size, hidden_size]
    c_prev: _Array  # [batch_size, hidden_size]
    preactivation: dict[str, _Array]  # gate -> [batch_size, hidden_size], before clip
    clipped: dict[str, _Array]  # gate -> [batch_size, hidden_size], input of the activation
    gate: dict[str, _Array]  # gate -> [batch_size, hidden_size], activated (f: 1 - i if coupled)
    c: _Array  # [batch_size, hidden_size], C_t
    h: _Array  # [batch_size, hidden_size], H_t


@dataclasses.dataclass
class LstmTrace:
    """The whole forward computation in layout 0, for the backward pass and for tests."""

    steps: list[list[StepRecord]]  # [num_directions][processing order]
    activations: list[tuple[Activation, Activation, Activation]]
    final_h: _Array  # [num_directions, batch_size, hidden_size], Y_h
    final_c: _Array  # [num_directions, batch_size, hidden_size], Y_c


@dataclasses.dataclass
class _Inputs:
    """All inputs in layout 0, float64, with absent optional inputs materialised as zeros."""

    X: _Array  # [seq_length, batch_size, input_size]
    W: _Array  # [num_directions, 4*hidden_size, input_size], iofc
    R: _Array  # [num_directions, 4*hidden_size, hidden_size], iofc
    B: _Array  # [num_directions, 8*hidden_size], Wb_iofc then Rb_iofc
    sequence_lens: _Array  # [batch_size] int
    initial_h: _Array  # [num_directions, batch_size, hidden_size]
    initial_c: _Array  # [num_directions, batch_size, hidden_size]
    P: _Array  # [num_directions, 3*hidden_size], iof


_NUM_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _normalise_inputs(
    X: _Array,
    W: _Array,
    R: _Array,
    B: _Array | None,
    sequence_lens: _Array | None,
    initial_h: _Array | None,
    initial_c: _Array | None,
    P: _Array | None,
    hidden_size: int,
    direction: str,
    layout: int,
) -> _Inputs:
    if direction not in _NUM_DIRECTIONS:
        raise ValueError(f"direction: expected forward, reverse or bidirectional, got {direction!r}")
    if layout not in (0, 1):
        raise ValueError(f"layout: expected 0 or 1, got {layout}")
    num_directions = _NUM_DIRECTIONS[direction]
    X = np.asarray(X, dtype=np.float64)
    if layout == 1:  # [batch_size, seq_length, input_size] -> [seq_length, batch_size, input_size]
        X = X.transpose(1, 0, 2)
    seq_length, batch_size, input_size = X.shape
    state_shape = (num_directions, batch_size, hidden_size)

    def state(value: _Array | None) -> _Array:
        if value is None:
            return np.zeros(state_shape)
        value = np.asarray(value, dtype=np.float64)
        return value.transpose(1, 0, 2) if layout == 1 else value

    inputs = _Inputs(
        X=X,
        W=np.asarray(W, dtype=np.float64),
        R=np.asarray(R, dtype=np.float64),
        B=np.zeros((num_directions, 8 * hidden_size)) if B is None else np.asarray(B, np.float64),
        sequence_lens=(
            np.full(batch_size, seq_length, dtype=np.int64)
            if sequence_lens is None
            else np.asarray(sequence_lens, dtype=np.int64)
        ),
        initial_h=state(initial_h),
        initial_c=state(initial_c),
        P=np.zeros((num_directions, 3 * hidden_size)) if P is None else np.asarray(P, np.float64),
    )
    expected = {
        "W": (inputs.W, (num_directions, 4 * hidden_size, input_size)),
        "R": (inputs.R, (num_directions, 4 * hidden_size, hidden_size)),
        "B": (inputs.B, (num_directions, 8 * hidden_size)),
        "sequence_lens": (inputs.sequence_lens, (batch_size,)),
        "initial_h": (inputs.initial_h, state_shape),
        "initial_c": (inputs.initial_c, state_shape),
        "P": (inputs.P, (num_directions, 3 * hidden_size)),
    }
    for name, (value, shape) in expected.items():
        if value.shape != shape:
            raise ValueError(f"{name}: expected shape {shape} (layout 0), got {value.shape}")
    if np.any(inputs.sequence_lens < 0) or np.any(inputs.sequence_lens > seq_length):
        raise ValueError(f"sequence_lens: expected values in [0, {seq_length}], got {inputs.sequence_lens}")
    return inputs


def _split_gates(values: _Array, hidden_size: int) -> dict[str, _Array]:
    """[..., 4*hidden_size] in iofc order -> {"i": ..., "o": ..., "f": ..., "c": ...}."""
    return {gate: values[..., k * hidden_size : (k + 1) * hidden_size] for k, gate in enumerate(GATE_ORDER)}


def _clip(x: _Array, clip: float | None) -> _Array:
    return x if clip is None else np.clip(x, -clip, clip)


def _clip_derivative(x: _Array, clip: float | None) -> _Array:
    return np.ones_like(x) if clip is None else (np.abs(x) < clip).astype(np.float64)


def _run_direction(
    inputs: _Inputs,
    d: int,
    reverse: bool,
    activations: tuple[Activation, Activation, Activation],
    hidden_size: int,
    clip: float | None,
    input_forget: int,
) -> list[StepRecord]:
    f_act, g_act, h_act = activations
    W = _split_gates(inputs.W[d].T, hidden_size)  # gate -> [input_size, hidden_size]
    R = _split_gates(inputs.R[d].T, hidden_size)  # gate -> [hidden_size, hidden_size]
    Wb = _split_gates(inputs.B[d, : 4 * hidden_size], hidden_size)
    Rb = _split_gates(inputs.B[d, 4 * hidden_size :], hidden_size)
    P_i, P_o, P_f = np.split(inputs.P[d], 3)
    h, c = inputs.initial_h[d], inputs.initial_c[d]
    seq_length = inputs.X.shape[0]
    steps = []
    for t in reversed(range(seq_length)) if reverse else range(seq_length):
        x = inputs.X[t]
        active = (t < inputs.sequence_lens)[:, None]
        a = {gate: x @ W[gate] + h @ R[gate] + Wb[gate] + Rb[gate] for gate in GATE_ORDER}
        a["i"] = a["i"] + P_i * c
        a["f"] = a["f"] + P_f * c
        z = {gate: _clip(a[gate], clip) for gate in "ifc"}
        gate = {"i": f_act(z["i"]), "c": g_act(z["c"])}
        gate["f"] = 1.0 - gate["i"] if input_forget else f_act(z["f"])
        c_new = gate["f"] * c + gate["i"] * gate["c"]
        a["o"] = a["o"] + P_o * c_new
        z["o"] = _clip(a["o"], clip)
        gate["o"] = f_act(z["o"])
        h_new = gate["o"] * h_act(c_new)
        steps.append(StepRecord(t, active, x, h, c, a, z, gate, c_new, h_new))
        h = np.where(active, h_new, h)
        c = np.where(active, c_new, c)
    return steps


def lstm_trace(
    X: _Array,
    W: _Array,
    R: _Array,
    B: _Array | None = None,
    sequence_lens: _Array | None = None,
    initial_h: _Array | None = None,
    initial_c: _Array | None = None,
    P: _Array | None = None,
    *,
    hidden_size: int,
    direction: str = "forward",
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    clip: float | None = None,
    input_forget: int = 0,
    layout: int = 0,
) -> LstmTrace:
    """Runs the forward pass and keeps every intermediate (see ``StepRecord``)."""
    inputs = _normalise_inputs(X, W, R, B, sequence_lens, initial_h, initial_c, P, hidden_size, direction, layout)
    num_directions = _NUM_DIRECTIONS[direction]
    resolved = parse_activations(activations, activation_alpha, activation_beta, num_directions)
    steps = [
        _run_direction(inputs, d, direction == "reverse" or d == 1, resolved[d], hidden_size, clip, input_forget)
        for d in range(num_directions)
    ]
    final_h = inputs.initial_h.copy()
    final_c = inputs.initial_c.copy()
    for d in range(num_directions):
        for step in steps[d]:
            final_h[d] = np.where(step.active, step.h, final_h[d])
            final_c[d] = np.where(step.active, step.c, final_c[d])
    # onnxruntime reports a zero state, not the initial one, for a sequence of length 0.
    never_ran = (inputs.sequence_lens == 0)[None, :, None]
    final_h = np.where(never_ran, 0.0, final_h)
    final_c = np.where(never_ran, 0.0, final_c)
    return LstmTrace(steps, resolved, final_h, final_c)


def lstm_forward(
    X: _Array,
    W: _Array,
    R: _Array,
    B: _Array | None = None,
    sequence_lens: _Array | None = None,
    initial_h: _Array | None = None,
    initial_c: _Array | None = None,
    P: _Array | None = None,
    *,
    hidden_size: int,
    direction: str = "forward",
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    clip: float | None = None,
    input_forget: int = 0,
    layout: int = 0,
) -> dict[str, _Array]:
    """ONNX LSTM forward in float64, plus the stash LSTMTraining returns.

    Args and attributes are those of ONNX ``LSTM`` (inputs in the given ``layout``).

    Returns:
        A dict with ``HAll`` (= Y), ``Ht`` (= Y_h), ``Ct`` (= Y_c) exactly as onnxruntime
        computes them, ``CAll`` (C_t of every step, Y's shape) and ``IOFC`` (activated gates
        i, o, f, c of every step, ``[seq_length, num_directions, batch_size, 4*hidden_size]``,
        or ``[batch_size, seq_length, num_directions, 4*hidden_size]`` for layout 1). Steps
        past a sequence's length are zero in HAll, CAll and IOFC.
    """
    trace = lstm_trace(
        X,
        W,
        R,
        B,
        sequence_lens,
        initial_h,
        initial_c,
        P,
        hidden_size=hidden_size,
        direction=direction,
        activations=activations,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta,
        clip=clip,
        input_forget=input_forget,
        layout=layout,
    )
    num_directions = len(trace.steps)
    seq_length = len(trace.steps[0])
    batch_size = trace.final_h.shape[1]
    HAll = np.zeros((seq_length, num_directions, batch_size, hidden_size))
    CAll = np.zeros_like(HAll)
    IOFC = np.zeros((seq_length, num_directions, batch_size, 4 * hidden_size))
    for d, steps in enumerate(trace.steps):
        for step in steps:
            HAll[step.t, d] = np.where(step.active, step.h, 0.0)
            CAll[step.t, d] = np.where(step.active, step.c, 0.0)
            gates = np.concatenate([step.gate[gate] for gate in GATE_ORDER], axis=-1)
            IOFC[step.t, d] = np.where(step.active, gates, 0.0)
    Ht, Ct = trace.final_h, trace.final_c
    if layout == 1:
        HAll, CAll, IOFC = (a.transpose(2, 0, 1, 3) for a in (HAll, CAll, IOFC))
        Ht, Ct = Ht.transpose(1, 0, 2), Ct.transpose(1, 0, 2)
    return {"HAll": HAll, "Ht": Ht, "Ct": Ct, "CAll": CAll, "IOFC": IOFC}


def lstm_backward(
    X: _Array,
    W: _Array,
    R: _Array,
    B: _Array | None = None,
    sequence_lens: _Array | None = None,
    initial_h: _Array | None = None,
    initial_c: _Array | None = None,
    P: _Array | None = None,
    *,
    hidden_size: int,
    direction: str = "forward",
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    clip: float | None = None,
    input_forget: int = 0,
    layout: int = 0,
    grad_HAll: _Array | None = None,
    grad_Ht: _Array | None = None,
    grad_Ct: _Array | None = None,
) -> dict[str, _Array]:
    """Gradient of L = Σ grad_HAll⊙HAll + Σ grad_Ht⊙Ht + Σ grad_Ct⊙Ct (equations above).

    Re-runs the forward pass. Missing upstream gradients count as zeros. Gradients flow
    through clip (zero where clipped) and through every activation.

    Returns:
        A dict with ``dX``, ``dH0``, ``dC0`` (shaped like X, initial_h, initial_c in the given
        layout), ``dW``, ``dR``, ``dB`` (``[num_directions, 8*hidden_size]``, equal Wb and Rb
        halves) and ``dP`` (``[num_directions, 3*hidden_size]``, order i, o, f), whether or
        not the optional inputs were given.
    """
    inputs = _normalise_inputs(X, W, R, B, sequence_lens, initial_h, initial_c, P, hidden_size, direction, layout)
    trace = lstm_trace(
        X,
        W,
        R,
        B,
        sequence_lens,
        initial_h,
        initial_c,
        P,
        hidden_size=hidden_size,
        direction=direction,
        activations=activations,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta,
        clip=clip,
        input_forget=input_forget,
        layout=layout,
    )
    num_directions, batch_size, _ = trace.final_h.shape
    seq_length = inputs.X.shape[0]

    def to_layout0(grad: _Array | None, shape: tuple[int, ...], axes: tuple[int, ...]) -> _Array:
        if grad is None:
            return np.zeros(shape)
        grad = np.asarray(grad, dtype=np.float64)
        return grad.transpose(axes) if layout == 1 else grad

    grad_HAll = to_layout0(grad_HAll, (seq_length, num_directions, batch_size, hidden_size), (1, 2, 0, 3))
    grad_Ht = to_layout0(grad_Ht, (num_directions, batch_size, hidden_size), (1, 0, 2))
    grad_Ct = to_layout0(grad_Ct, (num_directions, batch_size, hidden_size), (1, 0, 2))
    # A length-0 sequence reports Y_h = Y_c = 0, so its Y_h/Y_c gradient goes nowhere.
    ran = (inputs.sequence_lens > 0)[None, :, None]
    grad_Ht = np.where(ran, grad_Ht, 0.0)
    grad_Ct = np.where(ran, grad_Ct, 0.0)

    dX = np.zeros_like(inputs.X)
    dW = np.zeros_like(inputs.W)
    dR = np.zeros_like(inputs.R)
    dB = np.zeros_like(inputs.B)
    dP = np.zeros_like(inputs.P)
    dH0 = np.zeros_like(inputs.initial_h)
    dC0 = np.zeros_like(inputs.initial_c)
    for d in range(num_directions):
        f_act, g_act, h_act = trace.activations[d]
        P_i, P_o, P_f = np.split(inputs.P[d], 3)
        dH = grad_Ht[d]  # flows into the carried H (= H_t of the last step that ran)
        dC = grad_Ct[d]
        for step in reversed(trace.steps[d]):
            gate, z, a = step.gate, step.clipped, step.preactivation
            dH_t = np.where(step.active, dH + grad_HAll[step.t, d], 0.0)
            dC_t = np.where(step.active, dC, 0.0)
            # H_t = o ⊙ h(C_t)
            d_o = dH_t * h_act(step.c)
            dC_t = dC_t + dH_t * gate["o"] * h_act.derivative(step.c)
            da_o = d_o * f_act.derivative(z["o"]) * _clip_derivative(a["o"], clip)
            dC_t = dC_t + da_o * P_o  # o's peephole reads C_t
            # C_t = f ⊙ C_{t-1} + i ⊙ c
            d_i = dC_t * gate["c"]
            d_c = dC_t * gate["i"]
            d_f = dC_t * step.c_prev
            if input_forget:  # f = 1 - i
                d_i = d_i - d_f
                d_f = np.zeros_like(d_f)
            da = {
                "i": d_i * f_act.derivative(z["i"]) * _clip_derivative(a["i"], clip),
                "o": da_o,
                "f": d_f * f_act.derivative(z["f"]) * _clip_derivative(a["f"], clip),
                "c": d_c * g_act.derivative(z["c"]) * _clip_derivative(a["c"], clip),
            }
            da_iofc = np.concatenate([da[g] for g in GATE_ORDER], axis=-1)  # [batch, 4*hidden]
            dC_prev = dC_t * gate["f"] + da["i"] * P_i + da["f"] * P_f
            dH_prev = da_iofc @ inputs.R[d]
            dX[step.t] += da_iofc @ inputs.W[d]
            dW[d] += da_iofc.T @ step.x
            dR[d] += da_iofc.T @ step.h_prev
            dB[d] += np.tile(da_iofc.sum(axis=0), 2)
            dP[d] += np.concatenate(
                [
                    (da["i"] * step.c_prev).sum(axis=0),
                    (da["o"] * step.c).sum(axis=0),
                    (da["f"] * step.c_prev).sum(axis=0),
                ]
            )
            # Inactive rows carry their state through the step unchanged.
            dH = np.where(step.active, dH_prev, dH)
            dC = np.where(step.active, dC_prev, dC)
        dH0[d], dC0[d] = dH, dC
    if layout == 1:
        dX = dX.transpose(1, 0, 2)
        dH0, dC0 = dH0.transpose(1, 0, 2), dC0.transpose(1, 0, 2)
    return {"dX": dX, "dW": dW, "dR": dR, "dB": dB, "dH0": dH0, "dC0": dC0, "dP": dP}
