"""The recurrent cells bench_lstm.py times (``--cells lstm,gru,rnn``): what differs between LSTM, GRU and RNN.

One table, :data:`CELLS`, holds each cell's op names, gate count, state ports, attributes and which
competitors can run it; the functions below derive the ports and shapes that bench_lstm.py's
competitors and GEMM limit need from it, so the timing, the interleaved rounds and the report stay
one code path for all three cells (issue 32 item 7). Port names come from the op contract
(ops/schema.py): the ortlstm ops keep com.microsoft's port order, which makes them drop-ins.

This module only describes; it never builds or changes the kernels.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

import ortlstm.ops

if TYPE_CHECKING:
    from bench_lstm import BenchConfig

# The benchmark runs full sequences without peepholes, with a loss on HAll and Ht: the gradient ops
# get no sequence_lens, P or grad_Ct, and there is no dP to give.
_UNUSED_GRAD_INPUTS = ("sequence_lens", "grad_Ct", "P")
_UNUSED_GRAD_OUTPUTS = ("dP",)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One recurrent cell as the benchmark runs it.

    Attributes:
        name: The ``--cells`` name ("lstm", "gru", "rnn", "rnn_relu"), no "-" (report names are ``<cell>-<config>``).
        label: The name in the report ("LSTM", ...).
        gates: Gate blocks per hidden unit (4, 3, 1): W is [D, gates*H, I], R [D, gates*H, H].
        forward_op: The ortlstm forward op (com.microsoft's has the same name where it exists).
        grad_op: Its gradient op.
        cell_state: Whether the cell has a cell state c besides h (initial_c, grad_Ct, dC0).
        attributes: Attributes beyond hidden_size and direction: what torch exports (``activations``
            are per direction: :meth:`node_attributes` repeats them for bidirectional).
        torch_module: The ``torch.nn`` class of the same layer.
        torch_kwargs: Its constructor's arguments beyond the sizes (nn.RNN's nonlinearity).
        microsoft: None where com.microsoft has this cell's training ops, else why it is n/a.
        microsoft_directions: The directions com.microsoft's ops accept (others are n/a, said so).
    """

    name: str
    label: str
    gates: int
    forward_op: str
    grad_op: str
    cell_state: bool
    attributes: tuple[tuple[str, object], ...]
    torch_module: str
    torch_kwargs: tuple[tuple[str, object], ...] = ()
    microsoft: str | None = None
    microsoft_directions: tuple[str, ...] = ("forward",)

    def node_attributes(self, num_directions: int) -> dict[str, object]:
        """:attr:`attributes` for a node of ``num_directions`` directions."""
        attributes = dict(self.attributes)
        if "activations" in attributes:
            attributes["activations"] = list(attributes["activations"]) * num_directions  # type: ignore[call-overload]
        return attributes

    @property
    def forward_outputs(self) -> tuple[str, ...]:
        """The forward op's outputs, in spec order."""
        return ortlstm.ops.schema.output_names(ortlstm.ops.schema.op_by_name(self.forward_op))

    @property
    def gradient_outputs(self) -> tuple[str, ...]:
        """The gradient op's outputs the benchmark requests (all but dP): every gradient, as training does."""
        outputs = ortlstm.ops.schema.output_names(ortlstm.ops.schema.op_by_name(self.grad_op))
        return tuple(name for name in outputs if name not in _UNUSED_GRAD_OUTPUTS)

    @property
    def grad_inputs(self) -> tuple[str, ...]:
        """The gradient op's inputs the benchmark feeds."""
        inputs = ortlstm.ops.schema.input_names(ortlstm.ops.schema.op_by_name(self.grad_op))
        return tuple(name for name in inputs if name not in _UNUSED_GRAD_INPUTS)

    @property
    def stash(self) -> tuple[str, ...]:
        """The forward outputs the gradient op takes back (LSTM: HAll, CAll, IOFC; GRU: HAll, ZRH; RNN: HAll)."""
        return tuple(name for name in self.forward_outputs if name in self.grad_inputs)

    def stash_shapes(self, config: BenchConfig) -> list[tuple[int, ...]]:
        """Shapes of the stash (layout 0), as in docs/ops.md: sequences of h, c or the per-step gates."""
        t, n, h, d = config.seq_length, config.batch_size, config.hidden_size, config.num_directions
        shapes = {"HAll": (t, d, n, h), "CAll": (t, d, n, h), "IOFC": (t, d, n, 4 * h), "ZRH": (t, d, n, 3 * h)}
        return [shapes[name] for name in self.stash]

    def gradient_shapes(self, config: BenchConfig) -> list[tuple[int, ...]]:
        """Shapes of the requested gradient outputs (layout 0), as in docs/ops.md."""
        t, n, i, h = config.seq_length, config.batch_size, config.input_size, config.hidden_size
        d, g = config.num_directions, self.gates * h
        shapes = {"dX": (t, n, i), "dW": (d, g, i), "dR": (d, g, h), "dB": (d, 2 * g), "dH0": (d, n, h)}
        shapes["dC0"] = (d, n, h)
        return [shapes[name] for name in self.gradient_outputs]

    def microsoft_unavailable(self, config: BenchConfig) -> str | None:
        """Why com.microsoft's ops cannot run ``config`` (said before trying, so the report names the limit)."""
        if self.microsoft is not None:
            return self.microsoft
        if config.direction not in self.microsoft_directions:
            return f"com.microsoft {self.forward_op} supports direction {'/'.join(self.microsoft_directions)} only"
        if config.dtype != "float32":
            return f"com.microsoft {self.forward_op} supports float32 only"
        return None


CELLS: dict[str, Cell] = {
    cell.name: cell
    for cell in (
        Cell("lstm", "LSTM", 4, "LSTMTraining", "LSTMGrad", True, (), "LSTM"),
        Cell("gru", "GRU", 3, "GRUTraining", "GRUGrad", False, (("linear_before_reset", 1),), "GRU"),
        Cell(
            "rnn", "RNN", 1, "RNNTraining", "RNNGrad", False, (), "RNN",
            microsoft="com.microsoft has no RNN training ops",
        ),
        Cell(
            "rnn_relu", "RNN relu", 1, "RNNTraining", "RNNGrad", False, (("activations", ("Relu",)),), "RNN",
            torch_kwargs=(("nonlinearity", "relu"),), microsoft="com.microsoft has no RNN training ops",
        ),
    )
}  # fmt: skip
"""LSTM, GRU (linear_before_reset=1, torch's nn.GRU) and RNN (tanh, torch's nn.RNN default; relu as rnn_relu)."""


def cell_inputs(config: BenchConfig, cell: Cell, seed: int = 0) -> dict[str, np.ndarray]:
    """Forward inputs in the ONNX layout (layout=0), weights scaled like torch's init (uniform +-1/sqrt(H)).

    The LSTM's values are the same as before cells were added (same generator calls, same order).
    """
    rng = np.random.default_rng(seed)
    t, n, i, h, d = config.seq_length, config.batch_size, config.input_size, config.hidden_size, config.num_directions
    scale = 1.0 / math.sqrt(h)

    def uniform(*shape: int) -> np.ndarray:
        return rng.uniform(-scale, scale, shape).astype(config.dtype)

    inputs = {
        "X": rng.standard_normal((t, n, i)).astype(config.dtype),
        "W": uniform(d, cell.gates * h, i),
        "R": uniform(d, cell.gates * h, h),
        "B": uniform(d, 2 * cell.gates * h),
        "initial_h": rng.standard_normal((d, n, h)).astype(config.dtype),
    }
    if cell.cell_state:
        inputs["initial_c"] = rng.standard_normal((d, n, h)).astype(config.dtype)
    return inputs


_NONLINEARITY_CELLS = {"tanh": "rnn", "relu": "rnn_relu"}


def short_name_argv(argv: list[str], cells: str) -> list[str]:
    """bench_lstm.py's arguments for bench_gru.py / bench_rnn.py, which run ``--cells cells``.

    Their own options from before they became short names keep working: ``--rounds N`` is
    ``--repeats N``, ``--configs S M`` (space-separated) is ``--configs S,M``, and bench_rnn.py's
    ``--nonlinearity tanh relu`` picks the cells ``rnn,rnn_relu``. A ``--cells`` given wins (last).
    """
    result = ["--cells", cells]
    index = 0
    while index < len(argv):
        arg = argv[index]
        values = []
        while arg in ("--configs", "--nonlinearity") and index + 1 + len(values) < len(argv):
            following = argv[index + 1 + len(values)]
            if following.startswith("-"):
                break
            values.append(following)
        if arg == "--configs" and values:
            result += ["--configs", ",".join(values)]
        elif arg == "--nonlinearity" and values:
            result += ["--cells", ",".join(_NONLINEARITY_CELLS.get(value, value) for value in values)]
        elif arg == "--rounds":
            result.append("--repeats")
        else:
            result.append(arg)
        index += 1 + len(values)
    return result
