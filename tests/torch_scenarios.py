"""PyTorch models and data shared by the torch parity tests and the trajectory recorder.

An input layer (embedding of tokens or linear of features), a two-layer bidirectional LSTM and a
linear head, in the scenarios the parity tests train (loss on every step or on h_n, padded
batches, batch_first, frozen parameters, a trainable initial state, a batch size that changes
from step to step); their batches; their export; and the pairing of an exported model's
initializers with the torch parameters they were made from (exporters rename, transpose and
re-lay out LSTM weights). Imports torch: only for environments that have it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import torch
from torch_conversion import lstm_layer_onnx_weights, lstm_layer_sources

# Sizes: small, odd, no two alike, so that value matching cannot pair the wrong tensors.
VOCAB = 11
FEATURES = 3
INPUT_SIZE = 5
HIDDEN_SIZE = 7
CLASSES = 4
BATCH = 4
SEQ_LENGTH = 6
MAX_PADDED_LENGTH = 8  # padded batches have 2..8 steps, each sequence 1..steps valid ones
MAX_DYNAMIC_BATCH = 6  # a dynamic-batch scenario draws each batch's size from 1..6


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One model and data setup trained in both frameworks."""

    name: str
    tokens: bool  # input layer: Embedding of int64 tokens, else Linear of float features
    loss: str  # "cross_entropy" (labels), "mse" (target) or "binary_cross_entropy" (Sigmoid head, 0/1 target)
    reads_h_n: bool = False  # head on the last layer's final hidden states, else on every step's output
    batch_first: bool = False
    padded: bool = False  # pack_padded_sequence with per-sequence lengths; the step count varies per batch
    frozen: tuple[str, ...] = ()  # torch parameter names not trained
    # initial_h / initial_c as parameters h0 / c0 [num_layers * 2, 1, H], expanded to the batch
    trainable_state: bool = False
    dynamic_batch: bool = False  # every batch has its own size, from 1 to MAX_DYNAMIC_BATCH

    def __post_init__(self) -> None:
        if self.padded and not self.reads_h_n:
            raise ValueError(f"{self.name}: a padded scenario reads h_n (Net does not unpack the packed output)")


SCENARIOS = [
    Scenario("tokens_seq_first_y", tokens=True, loss="cross_entropy"),
    Scenario("tokens_padded_h_n", tokens=True, loss="cross_entropy", reads_h_n=True, padded=True),
    Scenario("features_batch_first_y", tokens=False, loss="mse", batch_first=True),
    Scenario(
        "features_padded_batch_first_h_n", tokens=False, loss="mse", reads_h_n=True, batch_first=True, padded=True
    ),
    Scenario(
        "tokens_frozen_embedding_R0_h_n",
        tokens=True,
        loss="cross_entropy",
        reads_h_n=True,
        frozen=("input_layer.weight", "lstm.weight_hh_l0", "lstm.weight_hh_l0_reverse"),
    ),
]
# Scenarios only the train step (build_training_models) trains: onnxruntime-training's generator
# cannot train initial_h / initial_c, so tests/test_training_parity.py keeps to SCENARIOS.
TRAIN_STEP_SCENARIOS = [
    *SCENARIOS,
    Scenario("tokens_trainable_state_y", tokens=True, loss="cross_entropy", trainable_state=True),
    Scenario("tokens_dynamic_batch_y", tokens=True, loss="cross_entropy", dynamic_batch=True),
    Scenario(
        "features_batch_first_trainable_state_dynamic_batch_h_n",
        tokens=False,
        loss="mse",
        reads_h_n=True,
        batch_first=True,
        trainable_state=True,
        dynamic_batch=True,
    ),
    Scenario("features_h_n_bce", tokens=False, loss="binary_cross_entropy", reads_h_n=True),
]


class Net(torch.nn.Module):
    """Input layer, two-layer bidirectional LSTM, linear head."""

    def __init__(self, scenario: Scenario):
        super().__init__()
        self.reads_h_n = scenario.reads_h_n
        self.batch_first = scenario.batch_first
        self.flatten = scenario.loss == "cross_entropy" and not scenario.reads_h_n
        self.probabilities = scenario.loss == "binary_cross_entropy"
        if scenario.tokens:
            self.input_layer: torch.nn.Module = torch.nn.Embedding(VOCAB, INPUT_SIZE)
        else:
            self.input_layer = torch.nn.Linear(FEATURES, INPUT_SIZE)
        self.lstm = torch.nn.LSTM(
            INPUT_SIZE, HIDDEN_SIZE, num_layers=2, bidirectional=True, batch_first=scenario.batch_first
        )
        self.head = torch.nn.Linear(2 * HIDDEN_SIZE, CLASSES)
        if scenario.trainable_state:
            # Created last, so the other parameters start as without them. Small, random and
            # distinct: pairing matches initializers by value.
            self.h0 = torch.nn.Parameter(0.3 * torch.randn(2 * self.lstm.num_layers, 1, HIDDEN_SIZE))
            self.c0 = torch.nn.Parameter(0.3 * torch.randn(2 * self.lstm.num_layers, 1, HIDDEN_SIZE))
        else:
            self.h0 = self.c0 = None

    def forward(self, x, lengths=None):
        """Logits: per step (flattened to rows for cross entropy), or per sequence from h_n.

        Probabilities (a Sigmoid of them) for binary_cross_entropy.
        """
        inputs = self.input_layer(x)
        state = None
        if self.h0 is not None:
            batch = x.shape[0 if self.batch_first else 1]
            state = (self.h0.expand(-1, batch, -1), self.c0.expand(-1, batch, -1))
        if lengths is not None:
            inputs = torch.nn.utils.rnn.pack_padded_sequence(
                inputs, lengths, batch_first=self.batch_first, enforce_sorted=False
            )
        y, (h_n, _) = self.lstm(inputs, state)
        if self.reads_h_n:
            out = self.head(torch.cat([h_n[-2], h_n[-1]], dim=1))
            return torch.sigmoid(out) if self.probabilities else out
        out = self.head(y)
        if self.probabilities:
            return torch.sigmoid(out)
        return out.reshape(-1, CLASSES) if self.flatten else out


def make_batch(scenario: Scenario, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Model inputs and the loss's labels / target, keyed by their ONNX input names."""
    steps = int(rng.integers(2, MAX_PADDED_LENGTH + 1)) if scenario.padded else SEQ_LENGTH
    batch_size = int(rng.integers(1, MAX_DYNAMIC_BATCH + 1)) if scenario.dynamic_batch else BATCH
    shape = (batch_size, steps) if scenario.batch_first else (steps, batch_size)
    if scenario.tokens:
        batch = {"x": rng.integers(0, VOCAB, shape, dtype=np.int64)}
    else:
        batch = {"x": rng.standard_normal((*shape, FEATURES)).astype(np.float32)}
    if scenario.padded:
        batch["lengths"] = rng.integers(1, steps + 1, batch_size, dtype=np.int64)
    if scenario.reads_h_n:
        out_shape: tuple[int, ...] = (batch_size, CLASSES)
    else:
        out_shape = (*shape, CLASSES)
    if scenario.loss == "cross_entropy":
        batch["labels"] = rng.integers(0, CLASSES, int(np.prod(out_shape[:-1])), dtype=np.int64)
    elif scenario.loss == "binary_cross_entropy":  # multi-label, as a VAD or tagger trains
        batch["target"] = (rng.random(out_shape) < 0.5).astype(np.float32)
    else:
        batch["target"] = rng.standard_normal(out_shape).astype(np.float32)
    return batch


def model_inputs(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value for name, value in batch.items() if name in ("x", "lengths")}


def torch_forward(net: Net, batch: dict[str, np.ndarray]):
    return net(*(torch.from_numpy(value) for value in model_inputs(batch).values()))


def torch_loss(net: Net, batch: dict[str, np.ndarray]):
    out = torch_forward(net, batch)
    if "labels" in batch:
        return torch.nn.functional.cross_entropy(out, torch.from_numpy(batch["labels"]))
    if net.probabilities:
        return torch.nn.functional.binary_cross_entropy(out, torch.from_numpy(batch["target"]))
    return torch.nn.functional.mse_loss(out, torch.from_numpy(batch["target"]))


def export(
    net: Net, scenario: Scenario, exporter: str, batch: dict[str, np.ndarray], path: Path, *, optimize: bool = True
) -> onnx.ModelProto:
    """Exports with the "dynamo" or "torchscript" exporter (``optimize`` applies to dynamo)."""
    inputs = model_inputs(batch)
    kwargs: dict = {"dynamo": exporter == "dynamo"}
    if exporter == "dynamo" and not optimize:
        kwargs["optimize"] = False
    step_axis, batch_axis = (1, 0) if scenario.batch_first else (0, 1)
    axes: dict[str, dict[int, str]] = {name: {} for name in inputs}
    if scenario.padded:  # the step count varies per batch
        axes["x"][step_axis] = "steps"
    if scenario.dynamic_batch:
        axes["x"][batch_axis] = "batch"
        if "lengths" in axes:
            axes["lengths"][0] = "batch"
    if any(axes.values()) and exporter == "dynamo":
        dims = {label: torch.export.Dim(label) for named in axes.values() for label in named.values()}
        kwargs["dynamic_shapes"] = {
            name: {axis: dims[label] for axis, label in named.items()} or None for name, named in axes.items()
        }
    elif any(axes.values()):
        kwargs["dynamic_axes"] = {name: named for name, named in axes.items() if named}
    torch.onnx.export(
        net,
        tuple(torch.from_numpy(value) for value in inputs.values()),
        str(path),
        input_names=list(inputs),
        output_names=["logits"],
        **kwargs,
    )
    return onnx.load(str(path))


# ---------------------------------------------------------------------------------------------
# Pairing ONNX initializers with torch parameters


@dataclasses.dataclass(frozen=True)
class TorchSource:
    """How one ONNX initializer is computed from torch parameters."""

    description: str
    parameters: tuple[str, ...]
    value: Callable[[torch.nn.Module], np.ndarray]


def _parameter(net: torch.nn.Module, name: str) -> np.ndarray:
    return net.get_parameter(name).detach().numpy().copy()  # a snapshot: SGD updates the tensor in place


def _lstm_port(net: torch.nn.Module, module_name: str, layer: int, port: str) -> np.ndarray:
    return lstm_layer_onnx_weights(net.get_submodule(module_name), layer)[port]


def torch_sources(net: torch.nn.Module) -> list[TorchSource]:
    """Every way an exporter may write a parameter: as is, transposed, or as an LSTM layer's W / R / B."""
    sources = []
    for name, parameter in net.named_parameters():
        sources.append(TorchSource(name, (name,), lambda m, n=name: _parameter(m, n)))
        if parameter.ndim == 2:
            sources.append(TorchSource(f"{name}^T", (name,), lambda m, n=name: _parameter(m, n).T))
    for module_name, module in net.named_modules():
        if isinstance(module, torch.nn.LSTM):
            for layer in range(module.num_layers):
                for port, names in lstm_layer_sources(module, layer).items():
                    sources.append(
                        TorchSource(
                            f"{module_name} layer {layer} {port}",
                            tuple(f"{module_name}.{name}" for name in names),
                            lambda m, mn=module_name, k=layer, p=port: _lstm_port(m, mn, k, p),
                        )
                    )
    return sources


def pair_initializers(model: onnx.ModelProto, net: torch.nn.Module) -> dict[str, TorchSource]:
    """ONNX initializer name -> the torch source it equals; every torch parameter must be covered."""
    candidates = [(source, source.value(net)) for source in torch_sources(net)]
    pairs = {}
    for initializer in model.graph.initializer:
        array = onnx.numpy_helper.to_array(initializer)
        hits = [source for source, value in candidates if value.shape == array.shape and np.array_equal(value, array)]
        assert len(hits) <= 1, f"initializer {initializer.name} equals several torch tensors: {hits}"
        if hits:
            pairs[initializer.name] = hits[0]
    covered = {name for source in pairs.values() for name in source.parameters}
    missing = sorted({name for name, _ in net.named_parameters()} - covered)
    assert not missing, f"no ONNX initializer equals (a view of) torch parameters {missing}"
    return pairs


def split_frozen(pairs: dict[str, TorchSource], frozen_parameters: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """ONNX initializer names (trained, frozen) for the torch parameters ``frozen_parameters``."""
    trainable, frozen = [], []
    for onnx_name, source in pairs.items():
        kinds = {name in frozen_parameters for name in source.parameters}
        assert len(kinds) == 1, f"{onnx_name} mixes frozen and trained torch parameters {source.parameters}"
        (frozen if kinds.pop() else trainable).append(onnx_name)
    return trainable, frozen
