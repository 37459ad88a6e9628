"""ortlstm LSTMTraining + LSTMGrad against ``torch.nn.LSTM`` and torch autograd.

Every combination of: float64 / float32; unidirectional / bidirectional; 1 / 2 layers;
seq-first / batch_first (ortlstm ``layout=1``); zero / given initial states; full sequences /
packed sequences of different lengths (``pack_padded_sequence(enforce_sorted=False)``, ortlstm
``sequence_lens``). Two ortlstm layers are stacked by hand: layer 2's X is layer 1's HAll with
the direction axis folded into the features, which is how torch concatenates the directions.

Compared: the (padded) output, h_n and c_n, and the gradients of
``L = Σ gY⊙output + Σ gh⊙h_n + Σ gc⊙c_n`` with respect to the input, every weight and bias and
the initial states, torch autograd against LSTMGrad chained through the layers.

Weights: torch stacks the gates i, f, g, o and ONNX i, o, f, c (c is torch's g);
``torch_ifgo_to_onnx_iofc`` is the one converter, used for parameters and their gradients.
torch's two biases b_ih and b_hh are ONNX's Wb and Rb.
"""

from __future__ import annotations

import dataclasses
import itertools
from types import ModuleType

import numpy as np
import op_runner
import pytest
from torch_conversion import torch_ifgo_to_onnx_iofc

SEQ_LENGTH = 5
BATCH_SIZE = 4
INPUT_SIZE = 3
HIDDEN_SIZE = 5
SEQUENCE_LENS = (3, 5, 1, 4)  # unsorted: enforce_sorted=False has to permute; full and length-1
WEIGHT_SCALE = 0.5  # parameters ~ N(0, WEIGHT_SCALE²): gates stay away from saturation

# (rtol, atol) per dtype: same math in both libraries, only the summation order differs.
TOLERANCES = {
    np.dtype(np.float64): (1e-10, 1e-12),
    np.dtype(np.float32): (1e-4, 1e-5),
}


@pytest.fixture(scope="module")
def torch() -> ModuleType:
    """The torch module; the tests that compare with torch are skipped without it."""
    return pytest.importorskip("torch")


def test_torch_ifgo_to_onnx_iofc() -> None:
    """Block k of the result is ONNX gate k: i <- i, o <- o, f <- f, c <- g."""
    torch_blocks = np.repeat(np.array([[1.0], [2.0], [3.0], [4.0]]), 2, axis=0)  # i=1, f=2, g=3, o=4
    np.testing.assert_array_equal(torch_ifgo_to_onnx_iofc(torch_blocks)[:, 0], [1, 1, 4, 4, 2, 2, 3, 3])


@dataclasses.dataclass(frozen=True)
class TorchCase:
    """One torch.nn.LSTM setup."""

    dtype: str
    bidirectional: bool
    num_layers: int
    batch_first: bool
    initial_state: bool
    packed: bool

    @property
    def id(self) -> str:
        """E.g. ``float32_bidirectional_2layers_batch_first_h0c0_packed``."""
        parts = [self.dtype, "bidirectional" if self.bidirectional else "forward", f"{self.num_layers}layers"]
        parts += [name for name, on in (("batch_first", self.batch_first), ("h0c0", self.initial_state)) if on]
        parts += ["packed"] if self.packed else []
        return "_".join(parts)

    @property
    def num_directions(self) -> int:
        """2 for bidirectional, else 1."""
        return 2 if self.bidirectional else 1

    @property
    def layout(self) -> int:
        """The ortlstm layout that matches torch's batch_first."""
        return 1 if self.batch_first else 0


CASES = [
    TorchCase(*values)
    for values in itertools.product(
        ("float64", "float32"), (False, True), (1, 2), (False, True), (False, True), (False, True)
    )
]


# ---------------------------------------------------------------------------------------------
# Layout plumbing between torch's tensors and ortlstm's ports


def _hall_to_features(HAll: np.ndarray, layout: int) -> np.ndarray:
    """HAll [T, D, N, H] (layout 1: [N, T, D, H]) -> torch's output [T, N, D*H] ([N, T, D*H])."""
    if layout == 0:
        HAll = HAll.transpose(0, 2, 1, 3)
    return HAll.reshape(*HAll.shape[:2], -1)


def _features_to_hall(features: np.ndarray, layout: int, num_directions: int) -> np.ndarray:
    """Inverse of ``_hall_to_features``: torch-shaped output (or its gradient) -> HAll's shape."""
    split = features.reshape(*features.shape[:2], num_directions, -1)
    return split.transpose(0, 2, 1, 3) if layout == 0 else split


def _state_to_port(state: np.ndarray, layout: int) -> np.ndarray:
    """One layer's [D, N, H] slice of torch's h_0 / c_0 / h_n -> ortlstm's state shape."""
    return state.transpose(1, 0, 2) if layout == 1 else state


def _port_to_state(value: np.ndarray, layout: int) -> np.ndarray:
    return value.transpose(1, 0, 2) if layout == 1 else value


@pytest.mark.parametrize("layout", [0, 1])
def test_layout_plumbing_round_trips(layout: int) -> None:
    """Folding HAll's direction axis into the features matches torch: [forward, backward] per step."""
    shape = (5, 2, 3, 4) if layout == 0 else (3, 5, 2, 4)  # [T, D, N, H] or [N, T, D, H]
    HAll = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    features = _hall_to_features(HAll, layout)
    np.testing.assert_array_equal(_features_to_hall(features, layout, 2), HAll)
    if layout == 0:  # step t, batch n: forward's H values, then backward's
        np.testing.assert_array_equal(features[1, 2], np.concatenate([HAll[1, 0, 2], HAll[1, 1, 2]]))
    else:
        np.testing.assert_array_equal(features[1, 2], HAll[1, 2].ravel())


def _parameter_names(layer: int, direction: int) -> dict[str, str]:
    suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
    return {kind: f"{kind}{suffix}" for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}


def _onnx_weights(values: dict[str, np.ndarray], layer: int, num_directions: int) -> dict[str, np.ndarray]:
    """W, R, B of one layer from torch parameters (or their gradients), via the one converter."""
    per_direction = [
        {kind: torch_ifgo_to_onnx_iofc(values[name]) for kind, name in _parameter_names(layer, d).items()}
        for d in range(num_directions)
    ]
    return {
        "W": np.stack([p["weight_ih"] for p in per_direction]),
        "R": np.stack([p["weight_hh"] for p in per_direction]),
        "B": np.stack([np.concatenate([p["bias_ih"], p["bias_hh"]]) for p in per_direction]),
    }


# ---------------------------------------------------------------------------------------------
# The two sides


@dataclasses.dataclass
class Problem:
    """Inputs and upstream gradients in torch's shapes, float64 NumPy (cast per side)."""

    x: np.ndarray  # [T, N, I] or [N, T, I]
    h0: np.ndarray | None  # [L*D, N, H]
    c0: np.ndarray | None
    grad_output: np.ndarray  # like torch's (padded) output
    grad_h_n: np.ndarray  # [L*D, N, H]
    grad_c_n: np.ndarray
    parameters: dict[str, np.ndarray]  # torch parameter name -> value


def _draw(case: TorchCase, rng: np.random.Generator) -> Problem:
    dtype = np.dtype(case.dtype)

    def normal(shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(dtype)

    D, L = case.num_directions, case.num_layers
    x_shape = (BATCH_SIZE, SEQ_LENGTH, INPUT_SIZE) if case.batch_first else (SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE)
    state_shape = (L * D, BATCH_SIZE, HIDDEN_SIZE)
    output_shape = (*x_shape[:2], D * HIDDEN_SIZE)
    parameters = {}
    for layer, d in itertools.product(range(L), range(D)):
        layer_input = INPUT_SIZE if layer == 0 else D * HIDDEN_SIZE
        names = _parameter_names(layer, d)
        parameters[names["weight_ih"]] = normal((4 * HIDDEN_SIZE, layer_input), WEIGHT_SCALE)
        parameters[names["weight_hh"]] = normal((4 * HIDDEN_SIZE, HIDDEN_SIZE), WEIGHT_SCALE)
        parameters[names["bias_ih"]] = normal((4 * HIDDEN_SIZE,), WEIGHT_SCALE)
        parameters[names["bias_hh"]] = normal((4 * HIDDEN_SIZE,), WEIGHT_SCALE)
    return Problem(
        x=normal(x_shape),
        h0=normal(state_shape) if case.initial_state else None,
        c0=normal(state_shape) if case.initial_state else None,
        grad_output=normal(output_shape),
        grad_h_n=normal(state_shape),
        grad_c_n=normal(state_shape),
        parameters=parameters,
    )


def _torch_side(torch: ModuleType, case: TorchCase, problem: Problem) -> dict[str, np.ndarray]:
    """torch.nn.LSTM forward and autograd; keys: output, h_n, c_n, grad_x, grad_h0, grad_c0, <param>."""
    dtype = getattr(torch, case.dtype)
    lstm = torch.nn.LSTM(
        INPUT_SIZE,
        HIDDEN_SIZE,
        num_layers=case.num_layers,
        bias=True,
        batch_first=case.batch_first,
        bidirectional=case.bidirectional,
        dtype=dtype,
    )
    with torch.no_grad():
        for name, parameter in lstm.named_parameters():
            parameter.copy_(torch.from_numpy(problem.parameters[name]))
    x = torch.tensor(problem.x, requires_grad=True)
    states = None
    if case.initial_state:
        states = (torch.tensor(problem.h0, requires_grad=True), torch.tensor(problem.c0, requires_grad=True))
    if case.packed:
        lengths = torch.tensor(SEQUENCE_LENS, dtype=torch.int64)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=case.batch_first, enforce_sorted=False)
        packed_output, (h_n, c_n) = lstm(packed, states)
        output, _ = torch.nn.utils.rnn.pad_packed_sequence(
            packed_output, batch_first=case.batch_first, total_length=SEQ_LENGTH
        )
    else:
        output, (h_n, c_n) = lstm(x, states)
    loss = (
        (output * torch.from_numpy(problem.grad_output)).sum()
        + (h_n * torch.from_numpy(problem.grad_h_n)).sum()
        + (c_n * torch.from_numpy(problem.grad_c_n)).sum()
    )
    loss.backward()
    result = {
        "output": output.detach().numpy(),
        "h_n": h_n.detach().numpy(),
        "c_n": c_n.detach().numpy(),
        "grad_x": x.grad.numpy(),
    }
    if states is not None:
        result["grad_h0"], result["grad_c0"] = states[0].grad.numpy(), states[1].grad.numpy()
    result.update({name: parameter.grad.numpy() for name, parameter in lstm.named_parameters()})
    return result


def _ortlstm_side(case: TorchCase, problem: Problem) -> dict[str, np.ndarray]:
    """The same network as stacked ortlstm layers; returns torch-shaped results (ONNX weights)."""
    D, layout, dtype = case.num_directions, case.layout, np.dtype(case.dtype)
    attributes = {"hidden_size": HIDDEN_SIZE, "direction": "bidirectional" if case.bidirectional else "forward"}
    if layout:
        attributes["layout"] = layout
    sequence_lens = np.array(SEQUENCE_LENS, dtype=np.int32) if case.packed else None

    def layer_states(states: np.ndarray | None, layer: int) -> np.ndarray | None:
        return None if states is None else _state_to_port(states[layer * D : (layer + 1) * D], layout)

    # Forward, layer by layer.
    layers = []
    X = problem.x
    for layer in range(case.num_layers):
        inputs = {
            "X": X,
            **_onnx_weights(problem.parameters, layer, D),
            "sequence_lens": sequence_lens,
            "initial_h": layer_states(problem.h0, layer),
            "initial_c": layer_states(problem.c0, layer),
        }
        outputs = op_runner.run("LSTMTraining", inputs, attributes, dtype=dtype)
        layers.append((inputs, outputs))
        X = _hall_to_features(outputs["HAll"], layout)

    # Backward, from the last layer down; dX of layer l is the HAll gradient of layer l-1.
    grad_HAll = _features_to_hall(problem.grad_output, layout, D)
    grads = [None] * case.num_layers
    requested = ["dX", "dW", "dR", "dB"] + (["dH0", "dC0"] if case.initial_state else [])
    for layer in reversed(range(case.num_layers)):
        inputs, outputs = layers[layer]
        grad_inputs = {
            **inputs,
            "HAll": outputs["HAll"],
            "CAll": outputs["CAll"],
            "IOFC": outputs["IOFC"],
            "grad_HAll": grad_HAll,
            "grad_Ht": layer_states(problem.grad_h_n, layer),
            "grad_Ct": layer_states(problem.grad_c_n, layer),
        }
        grads[layer] = op_runner.run("LSTMGrad", grad_inputs, attributes, dtype=dtype, outputs=requested)
        if layer > 0:
            grad_HAll = _features_to_hall(grads[layer]["dX"], layout, D)

    result = {
        "output": _hall_to_features(layers[-1][1]["HAll"], layout),
        "h_n": np.concatenate([_port_to_state(outputs["Ht"], layout) for _, outputs in layers]),
        "c_n": np.concatenate([_port_to_state(outputs["Ct"], layout) for _, outputs in layers]),
        "grad_x": grads[0]["dX"],
    }
    if case.initial_state:
        result["grad_h0"] = np.concatenate([_port_to_state(g["dH0"], layout) for g in grads])
        result["grad_c0"] = np.concatenate([_port_to_state(g["dC0"], layout) for g in grads])
    for layer, layer_grads in enumerate(grads):
        result.update({f"{name}_l{layer}": layer_grads[f"d{name}"] for name in ("W", "R", "B")})
    return result


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_matches_torch(torch: ModuleType, case: TorchCase, rng: np.random.Generator) -> None:
    """Outputs, final states and all gradients agree with torch.nn.LSTM and torch autograd."""
    where = f"{case.id}, seed {rng.bit_generator.seed_seq.entropy}"
    problem = _draw(case, rng)
    expected = _torch_side(torch, case, problem)
    actual = _ortlstm_side(case, problem)
    rtol, atol = TOLERANCES[np.dtype(case.dtype)]

    def check(name: str, actual_value: np.ndarray, expected_value: np.ndarray) -> None:
        assert actual_value.dtype == expected_value.dtype, f"{where}: {name} dtype"
        assert actual_value.shape == expected_value.shape, f"{where}: {name} shape"
        np.testing.assert_allclose(actual_value, expected_value, rtol=rtol, atol=atol, err_msg=f"{where}: {name}")

    names = ["output", "h_n", "c_n", "grad_x"] + (["grad_h0", "grad_c0"] if case.initial_state else [])
    for name in names:
        check(name, actual[name], expected[name])
    for layer in range(case.num_layers):
        torch_grads = _onnx_weights(expected, layer, case.num_directions)
        for name in ("W", "R", "B"):
            check(f"d{name} (layer {layer})", actual[f"{name}_l{layer}"], torch_grads[name])
