"""Records PyTorch training of nn.GRU models for tests/test_gru_training.py, which replays it without torch.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_gru.py

Each case: an ``nn.GRU`` (2 layers; uni- or bidirectional; batch_first or not) with a Linear head
on every step's output, exported by each of torch.onnx.export's three flavours (its defaults:
dynamo with optimize=True, which folds torch's weights into the GRU's ONNX layout: gates r z n ->
z r h, directions stacked, B = [b_ih, b_hh]; dynamo with optimize=False; TorchScript), then
trained in torch for ``STEPS`` steps with MSE. Written in record_training.py's format (model,
config, batch/<step>/<input>, losses, param/<onnx name> after every step), each ONNX
initializer's value computed from the torch parameters it was folded from.

Seeded; an unchanged recording is left as it is (``write_unless_unchanged``).
"""

from __future__ import annotations

import io
import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from record_training import write_unless_unchanged  # noqa: E402

SEED = 20261127
STEPS = 4
BATCH, LENGTH, FEATURES, HIDDEN, OUTPUTS = 4, 6, 3, 5, 2
OUTPUT_DIR = HERE / "gru"

_SGD = {"name": "SGD", "kwargs": {"lr": 0.3, "momentum": 0.9}}
_ADAM = {"name": "Adam", "kwargs": {"lr": 0.02}}
CASES: list[dict[str, Any]] = [
    {"bidirectional": False, "batch_first": True, "optimizer": _SGD, "exporter": "dynamo"},
    {"bidirectional": True, "batch_first": False, "optimizer": _ADAM, "exporter": "dynamo"},
    {"bidirectional": True, "batch_first": True, "optimizer": _ADAM, "exporter": "dynamo_unoptimized"},
    {"bidirectional": False, "batch_first": False, "optimizer": _SGD, "exporter": "torchscript"},
]


class Net(torch.nn.Module):
    """A 2-layer GRU and a Linear head on every step's output."""

    def __init__(self, bidirectional: bool, batch_first: bool) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(FEATURES, HIDDEN, num_layers=2, bidirectional=bidirectional, batch_first=batch_first)
        self.head = torch.nn.Linear(HIDDEN * (2 if bidirectional else 1), OUTPUTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.gru(x)
        return self.head(y)


def _zrh(stacked: np.ndarray) -> np.ndarray:
    """torch's gate order r, z, n -> ONNX GRU's z, r, h (first axis)."""
    r, z, n = np.split(stacked, 3)
    return np.concatenate([z, r, n])


def onnx_values(net: Net) -> dict[str, tuple[np.ndarray, str]]:
    """Every tensor the export may hold for the torch parameters: each parameter, ONNX-layout W, R, B of each layer."""
    gru = net.gru
    params = {name: value.detach().numpy() for name, value in net.named_parameters()}
    suffixes = ("", "_reverse") if gru.bidirectional else ("",)
    values = {}
    for layer in range(gru.num_layers):
        names = {kind: [f"gru.{kind}_l{layer}{suffix}" for suffix in suffixes] for kind in ("weight_ih", "weight_hh")}
        biases = [(f"gru.bias_ih_l{layer}{suffix}", f"gru.bias_hh_l{layer}{suffix}") for suffix in suffixes]
        values[f"W{layer}"] = (np.stack([_zrh(params[n]) for n in names["weight_ih"]]), ", ".join(names["weight_ih"]))
        values[f"R{layer}"] = (np.stack([_zrh(params[n]) for n in names["weight_hh"]]), ", ".join(names["weight_hh"]))
        values[f"B{layer}"] = (
            np.stack([np.concatenate([_zrh(params[i]), _zrh(params[h])]) for i, h in biases]),
            ", ".join(name for pair in biases for name in pair),
        )
    for name in params:  # as they are (dynamo with optimize=False keeps torch's parameters)
        values[name] = (params[name], name)
    for name in ("head.weight", "head.bias"):
        if params[name].ndim == 2:  # the export's MatMul may hold the transposed weight
            values[f"{name}^T"] = (params[name].T.copy(), name)
    return values


def random_batches(
    rng: np.random.Generator, shape: tuple[int, int], features: int, outputs: int, steps: int
) -> list[dict[str, np.ndarray]]:
    """``steps`` batches of standard-normal inputs ``x`` and targets ``target`` of ``shape`` plus the last axis."""
    return [
        {
            "x": rng.standard_normal((*shape, features)).astype(np.float32),
            "target": rng.standard_normal((*shape, outputs)).astype(np.float32),
        }
        for _ in range(steps)
    ]


def initializer_pairs(model: onnx.ModelProto, values: dict[str, tuple[np.ndarray, str]]) -> dict[str, str]:
    """Each ONNX initializer that equals one of ``values`` -> that value's key (an export folds, never mixes)."""
    pairs = {}
    for initializer in model.graph.initializer:
        array = onnx.numpy_helper.to_array(initializer)
        hits = [key for key, (value, _) in values.items() if np.array_equal(value, array)]
        assert len(hits) <= 1, f"{initializer.name} equals {hits}"
        if hits:
            pairs[initializer.name] = hits[0]
    return pairs


def export(net: Net, x: torch.Tensor, exporter: str) -> onnx.ModelProto:
    """torch.onnx.export in one of three flavours.

    Its defaults (``dynamo``: dynamo=True, optimize=True), ``dynamo_unoptimized`` (optimize=False) or
    ``torchscript`` (dynamo=False, the exporter's default opset).
    """
    buffer = io.BytesIO()
    if exporter == "torchscript":
        torch.onnx.export(net, (x,), buffer, dynamo=False, input_names=["x"])
    else:
        torch.onnx.export(net, (x,), dynamo=True, optimize=exporter == "dynamo").save(buffer)
    return onnx.load_from_string(buffer.getvalue())


def train(
    net: torch.nn.Module,
    model: onnx.ModelProto,
    batches: list[dict[str, np.ndarray]],
    optimizer_spec: dict[str, Any],
    values: dict[str, tuple[np.ndarray, str]],
    values_of: Callable[[Any], dict[str, tuple[np.ndarray, str]]],
) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """Trains ``net`` with MSE on ``batches``; the initializer pairs and the arrays: model, batches, losses, params.

    ``values_of(net)`` gives the tensors an export may hold (``values``: before training); each
    initializer equal to one of them is recorded after every step.
    """
    pairs = initializer_pairs(model, values)
    optimizer = getattr(torch.optim, optimizer_spec["name"])(net.parameters(), **optimizer_spec["kwargs"])
    arrays: dict[str, np.ndarray] = {"model": np.frombuffer(model.SerializeToString(), dtype=np.uint8)}
    losses, trajectories = [], {name: [] for name in pairs}
    for step, batch in enumerate(batches):
        for key, value in batch.items():
            arrays[f"batch/{step}/{key}"] = value
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(torch.from_numpy(batch["x"])), torch.from_numpy(batch["target"]))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        now = values_of(net)
        for name, key in pairs.items():
            trajectories[name].append(now[key][0].copy())
    arrays["losses"] = np.asarray(losses, dtype=np.float64)
    for name, trajectory in trajectories.items():
        arrays[f"param/{name}"] = np.stack(trajectory)
    return pairs, arrays


def record(case: dict[str, Any]) -> tuple[str, dict[str, np.ndarray]]:
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    net = Net(case["bidirectional"], case["batch_first"])
    shape = (BATCH, LENGTH) if case["batch_first"] else (LENGTH, BATCH)
    batches = random_batches(rng, shape, FEATURES, OUTPUTS, STEPS)
    model = export(net, torch.from_numpy(batches[0]["x"]), case["exporter"])
    assert sum(node.op_type == "GRU" for node in model.graph.node) == 2, [node.op_type for node in model.graph.node]
    values = onnx_values(net)
    pairs, arrays = train(net, model, batches, case["optimizer"], values, onnx_values)
    direction = "bi" if case["bidirectional"] else "uni"
    layout = "batch_first" if case["batch_first"] else "seq_first"
    name = f"gru2_{direction}_{layout}-{case['exporter']}-{case['optimizer']['name']}"
    config = {
        "scenario": f"gru2_{direction}_{layout}",
        "exporter": case["exporter"],
        "optimizer": case["optimizer"],
        "loss": "mse",
        "steps": STEPS,
        "lr_schedule": [case["optimizer"]["kwargs"]["lr"]] * STEPS,
        "trainable": sorted(pairs),
        "sources": {name: values[key][1] for name, key in pairs.items()},
        "model_inputs": [value.name for value in model.graph.input if value.name not in pairs],
        "target": "target",
        "torch": torch.__version__,
    }
    arrays["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    return name, arrays


def main() -> None:
    OUTPUT_DIR.mkdir(exist_ok=True)
    for case in CASES:
        name, arrays = record(case)
        write_unless_unchanged(OUTPUT_DIR / f"{name}.npz", arrays)


if __name__ == "__main__":
    main()
