"""The one table of LSTM configurations that every kernel and oracle test parametrizes over.

Each row names its shapes, which optional inputs exist and the attributes; ids read like
``T3_B2_I5_H3_bidirectional_peephole_clip``. It covers every direction, every ONNX activation
(explicit and default alpha/beta), clip, input_forget, layout 0 and 1, sequence lengths
including 0 and full, and size-1 and odd dims. ``sample_inputs`` draws inputs whose activation
inputs stay clear of kinks and clip bounds, so finite differences are meaningful.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from reference.lstm_ref import GATE_ORDER, linear_activation_attributes, lstm_trace

KINK_MARGIN = 1e-3  # pre-activations keep this far from kinks and clip bounds
MAX_SAMPLING_ATTEMPTS = 200

_NUM_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


@dataclasses.dataclass(frozen=True)
class LstmConfig:
    """One row of the table: shapes, which optional inputs exist, and the attributes."""

    seq_length: int
    batch_size: int
    input_size: int
    hidden_size: int
    direction: str = "forward"
    bias: bool = True
    peephole: bool = False
    initial_h: bool = False
    initial_c: bool = False
    sequence_lens: tuple[int, ...] | None = None
    activations: tuple[str, ...] | None = None
    activation_alpha: tuple[float, ...] | None = None
    activation_beta: tuple[float, ...] | None = None
    clip: float | None = None
    input_forget: int = 0
    layout: int = 0
    tag: str = ""  # replaces the activation list in the id when set

    @property
    def num_directions(self) -> int:
        """2 for bidirectional, else 1."""
        return _NUM_DIRECTIONS[self.direction]

    @property
    def id(self) -> str:
        """Readable test id, e.g. ``T3_B2_I5_H3_bidirectional_peephole_clip``."""
        parts = [
            f"T{self.seq_length}_B{self.batch_size}_I{self.input_size}_H{self.hidden_size}",
            self.direction,
        ]
        flags = {
            "bias": self.bias,
            "peephole": self.peephole,
            "h0": self.initial_h,
            "c0": self.initial_c,
            "clip": self.clip is not None,
            "input_forget": bool(self.input_forget),
            "layout1": self.layout == 1,
        }
        parts += [name for name, on in flags.items() if on]
        if self.sequence_lens is not None:
            parts.append("lens" + "-".join(map(str, self.sequence_lens)))
        if self.tag:
            parts.append(self.tag)
        elif self.activations:
            parts.append("-".join(self.activations))
            if self.activation_alpha or self.activation_beta:
                parts.append("alpha_beta")
        return "_".join(parts)

    def attributes(self) -> dict:
        """ONNX LSTM attributes, absent ones left out (as a model would)."""
        attributes: dict = {"hidden_size": self.hidden_size, "direction": self.direction}
        optional = {
            "activations": list(self.activations) if self.activations else None,
            "activation_alpha": list(self.activation_alpha) if self.activation_alpha else None,
            "activation_beta": list(self.activation_beta) if self.activation_beta else None,
            "clip": self.clip,
            "input_forget": self.input_forget or None,
            "layout": self.layout or None,
        }
        attributes.update({name: value for name, value in optional.items() if value is not None})
        return attributes


def _activation_configs() -> list[LstmConfig]:
    """Every ONNX activation, with explicit alpha/beta and with onnxruntime's defaults."""
    base = {
        "seq_length": 2,
        "batch_size": 2,
        "input_size": 3,
        "hidden_size": 3,
        "initial_h": True,
        "initial_c": True,
    }
    configs = [
        LstmConfig(**base, activations=(name,) * 3) for name in ("Relu", "Tanh", "Sigmoid", "Softsign", "Softplus")
    ]
    linear = linear_activation_attributes(1)
    configs.append(
        LstmConfig(
            **base,
            activations=tuple(linear["activations"]),
            activation_alpha=tuple(linear["activation_alpha"]),
            activation_beta=tuple(linear["activation_beta"]),
            tag="linear",
        )
    )
    explicit = {  # name: (alpha, beta or None)
        "Affine": (0.6, 0.2),
        "LeakyRelu": (0.3, None),
        "ThresholdedRelu": (0.2, None),
        "ScaledTanh": (1.5, 0.7),
        "HardSigmoid": (0.3, 0.45),
        "Elu": (0.6, None),
    }
    for name, (alpha, beta) in explicit.items():
        configs.append(
            LstmConfig(
                **base,
                activations=(name,) * 3,
                activation_alpha=(alpha,) * 3,
                activation_beta=None if beta is None else (beta,) * 3,
            )
        )
        # The defaults, in g and h (an all-default Affine f would make every gate 0).
        configs.append(LstmConfig(**base, activations=("Sigmoid", name, name), tag=f"Sigmoid-{name}-{name}_defaults"))
    return configs


CONFIGS: list[LstmConfig] = [
    LstmConfig(1, 1, 1, 1, bias=False),
    LstmConfig(4, 3, 5, 3, initial_h=True, initial_c=True),
    LstmConfig(4, 3, 5, 5, "reverse", peephole=True, initial_h=True, initial_c=True),
    LstmConfig(3, 2, 5, 3, "bidirectional", bias=False, peephole=True, clip=0.9),
    LstmConfig(4, 3, 5, 3, "bidirectional", peephole=True, initial_h=True, initial_c=True, clip=1.1),
    LstmConfig(4, 2, 3, 3, peephole=True, initial_c=True, clip=0.8),
    LstmConfig(
        5, 3, 7, 5, "bidirectional", peephole=True, initial_h=True, initial_c=True, sequence_lens=(5, 3, 0), clip=1.5
    ),
    LstmConfig(3, 2, 4, 3, bias=False, initial_h=True),
    LstmConfig(3, 2, 4, 3, bias=False, peephole=True, initial_c=True),
    # sequence_lens: zero, short and full lengths, each direction.
    LstmConfig(4, 3, 2, 3, initial_h=True, initial_c=True, sequence_lens=(4, 0, 2)),
    LstmConfig(4, 3, 2, 3, "reverse", peephole=True, initial_h=True, initial_c=True, sequence_lens=(3, 0, 4)),
    LstmConfig(
        4, 3, 3, 3, "bidirectional", peephole=True, initial_h=True, initial_c=True, sequence_lens=(0, 4, 2), clip=1.0
    ),
    LstmConfig(4, 3, 3, 3, sequence_lens=(4, 4, 4)),
    # input_forget.
    LstmConfig(4, 2, 3, 3, input_forget=1),
    LstmConfig(4, 2, 3, 5, "reverse", peephole=True, initial_h=True, initial_c=True, input_forget=1),
    LstmConfig(3, 2, 3, 3, "bidirectional", peephole=True, sequence_lens=(3, 1), clip=0.8, input_forget=1),
    # layout 1.
    LstmConfig(4, 3, 5, 3, initial_h=True, initial_c=True, sequence_lens=(2, 4, 0), layout=1),
    LstmConfig(3, 2, 5, 3, "bidirectional", peephole=True, initial_h=True, initial_c=True, clip=1.0, layout=1),
    LstmConfig(2, 2, 3, 3, "reverse", initial_h=True, initial_c=True, sequence_lens=(2, 0), input_forget=1, layout=1),
    # size-1 and odd dims.
    LstmConfig(1, 3, 4, 1, "bidirectional", initial_h=True, initial_c=True),
    LstmConfig(4, 1, 3, 5, "reverse", peephole=True),
    LstmConfig(3, 1, 1, 1, "bidirectional", peephole=True, initial_c=True, clip=0.7),
    *_activation_configs(),
    # Mixed activation lists: short alpha/beta lists, both directions, case-insensitive names.
    LstmConfig(
        3,
        2,
        3,
        3,
        initial_c=True,
        activations=("LeakyRelu", "Affine", "HardSigmoid"),
        activation_alpha=(0.2, 0.9),
        activation_beta=(0.3,),
    ),
    LstmConfig(
        3,
        2,
        3,
        3,
        "bidirectional",
        peephole=True,
        initial_h=True,
        initial_c=True,
        activations=("Affine", "Tanh", "ScaledTanh", "Relu", "Elu", "Softsign"),
        activation_alpha=(0.5, 0.7, 1.3),
        activation_beta=(0.1, 0.9),
    ),
    LstmConfig(
        3, 2, 3, 3, "reverse", peephole=True, initial_c=True, activations=("sigmoid", "TANH", "softSign"), clip=1.2
    ),
    LstmConfig(
        2,
        2,
        3,
        3,
        "bidirectional",
        initial_h=True,
        initial_c=True,
        sequence_lens=(2, 1),
        activations=("HardSigmoid", "Softplus", "ThresholdedRelu", "Sigmoid", "LeakyRelu", "ScaledTanh"),
        activation_alpha=(0.25,),
        input_forget=1,
    ),
]


def config_id(config: LstmConfig) -> str:
    return config.id


def config_by_id(config_id: str) -> LstmConfig:
    return next(config for config in CONFIGS if config.id == config_id)


def context(config: LstmConfig, rng: np.random.Generator) -> str:
    return f"config {config.id}, seed {rng.bit_generator.seed_seq.entropy}"


# ---------------------------------------------------------------------------------------------
# Inputs


def draw_inputs(config: LstmConfig, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
    """Random inputs in the config's layout; float32-representable values stored as float64."""
    seq_length, batch_size = config.seq_length, config.batch_size
    input_size, hidden_size, num_directions = config.input_size, config.hidden_size, config.num_directions

    def normal(shape: tuple[int, ...], scale: float) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32).astype(np.float64)

    x_shape = (seq_length, batch_size, input_size) if config.layout == 0 else (batch_size, seq_length, input_size)
    state_shape = (
        (num_directions, batch_size, hidden_size) if config.layout == 0 else (batch_size, num_directions, hidden_size)
    )
    return {
        "X": normal(x_shape, 1.0),
        "W": normal((num_directions, 4 * hidden_size, input_size), 1.0 / np.sqrt(input_size)),
        "R": normal((num_directions, 4 * hidden_size, hidden_size), 0.7 / np.sqrt(hidden_size)),
        "B": normal((num_directions, 8 * hidden_size), 0.3) if config.bias else None,
        "sequence_lens": None if config.sequence_lens is None else np.array(config.sequence_lens, dtype=np.int32),
        "initial_h": normal(state_shape, 1.0) if config.initial_h else None,
        "initial_c": normal(state_shape, 1.0) if config.initial_c else None,
        "P": normal((num_directions, 3 * hidden_size), 0.5) if config.peephole else None,
    }


def distance_to_kinks(config: LstmConfig, inputs: dict[str, np.ndarray | None]) -> float:
    """How close any activation input of a step that ran gets to a kink or a clip bound."""
    trace = lstm_trace(**inputs, **config.attributes())
    distances = [np.inf]

    def add(values: np.ndarray, points: tuple[float, ...]) -> None:
        for point in points:
            if values.size:
                distances.append(float(np.min(np.abs(values - point))))

    for steps, (f_act, g_act, h_act) in zip(trace.steps, trace.activations, strict=True):
        for step in steps:
            rows = step.active[:, 0]
            for gate in GATE_ORDER:
                if gate == "f" and config.input_forget:
                    continue
                activation = g_act if gate == "c" else f_act
                add(step.clipped[gate][rows], activation.kinks())
                if config.clip is not None:
                    add(np.abs(step.preactivation[gate][rows]), (config.clip,))
            add(step.c[rows], h_act.kinks())
    return min(distances)


def sample_inputs(config: LstmConfig, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
    """Draws until every activation input keeps KINK_MARGIN away from kinks and clip bounds."""
    for _ in range(MAX_SAMPLING_ATTEMPTS):
        inputs = draw_inputs(config, rng)
        if distance_to_kinks(config, inputs) > KINK_MARGIN:
            return inputs
    raise AssertionError(f"{context(config, rng)}: no inputs clear of kinks in {MAX_SAMPLING_ATTEMPTS} draws")
