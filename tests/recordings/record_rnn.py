"""Records PyTorch training of nn.RNN models for tests/test_rnn_training.py, which replays it without torch.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_rnn.py

Each case: an ``nn.RNN`` (2 layers; tanh or relu; uni- or bidirectional; batch_first or not) with a
Linear head on every step's output, exported by one of torch.onnx.export's three flavours (dynamo
with its defaults and with optimize=False, which unroll nn.RNN into MatMul/Add/Tanh or Relu per
step; TorchScript, which writes two ONNX RNN nodes whose W, R, B are torch's weight_ih, weight_hh and
[bias_ih, bias_hh], directions stacked), then trained in torch for ``STEPS`` steps with MSE. Written
in record_gru.py's format, with its helpers; seeded, an unchanged recording is left as it is.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from record_gru import export, random_batches, train  # noqa: E402
from record_training import write_unless_unchanged  # noqa: E402

SEED = 20261128
STEPS = 4
BATCH, LENGTH, FEATURES, HIDDEN, OUTPUTS = 4, 6, 3, 5, 2
OUTPUT_DIR = HERE / "rnn"

_SGD = {"name": "SGD", "kwargs": {"lr": 0.1, "momentum": 0.9}}
_ADAM = {"name": "Adam", "kwargs": {"lr": 0.02}}
_KEYS = ("nonlinearity", "bidirectional", "batch_first", "optimizer", "exporter")
CASES: list[dict[str, Any]] = [
    dict(zip(_KEYS, values, strict=True))
    for values in (
        ("tanh", False, True, _SGD, "dynamo"),
        ("relu", True, False, _ADAM, "dynamo_unoptimized"),
        ("tanh", True, True, _ADAM, "torchscript"),
        ("relu", False, False, _SGD, "torchscript"),
        ("relu", True, True, _SGD, "torchscript"),
    )
]


class Net(torch.nn.Module):
    """A 2-layer RNN and a Linear head on every step's output."""

    def __init__(self, nonlinearity: str, bidirectional: bool, batch_first: bool) -> None:
        super().__init__()
        self.rnn = torch.nn.RNN(
            FEATURES,
            HIDDEN,
            num_layers=2,
            nonlinearity=nonlinearity,
            bidirectional=bidirectional,
            batch_first=batch_first,
        )
        self.head = torch.nn.Linear(HIDDEN * (2 if bidirectional else 1), OUTPUTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(y)


def onnx_values(net: Net) -> dict[str, tuple[np.ndarray, str]]:
    """Every tensor the export may hold for the torch parameters.

    Each parameter (and its transpose), the ONNX-layout W, R, B of each layer.
    """
    rnn = net.rnn
    params = {name: value.detach().numpy() for name, value in net.named_parameters()}
    suffixes = ("", "_reverse") if rnn.bidirectional else ("",)
    values = {}
    for layer in range(rnn.num_layers):
        names = {kind: [f"rnn.{kind}_l{layer}{suffix}" for suffix in suffixes] for kind in ("weight_ih", "weight_hh")}
        biases = [(f"rnn.bias_ih_l{layer}{suffix}", f"rnn.bias_hh_l{layer}{suffix}") for suffix in suffixes]
        values[f"W{layer}"] = (np.stack([params[n] for n in names["weight_ih"]]), ", ".join(names["weight_ih"]))
        values[f"R{layer}"] = (np.stack([params[n] for n in names["weight_hh"]]), ", ".join(names["weight_hh"]))
        values[f"B{layer}"] = (
            np.stack([np.concatenate([params[i], params[h]]) for i, h in biases]),
            ", ".join(name for pair in biases for name in pair),
        )
    for name in params:  # as they are (dynamo keeps torch's parameters), or transposed for a MatMul
        values[name] = (params[name], name)
        if params[name].ndim == 2:
            values[f"{name}^T"] = (params[name].T.copy(), name)
    return values


def record(case: dict[str, Any]) -> tuple[str, dict[str, np.ndarray]]:
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    net = Net(case["nonlinearity"], case["bidirectional"], case["batch_first"])
    shape = (BATCH, LENGTH) if case["batch_first"] else (LENGTH, BATCH)
    batches = random_batches(rng, shape, FEATURES, OUTPUTS, STEPS)
    model = export(net, torch.from_numpy(batches[0]["x"]), case["exporter"])
    rnn_nodes = sum(node.op_type == "RNN" for node in model.graph.node)
    assert rnn_nodes == (2 if case["exporter"] == "torchscript" else 0), [node.op_type for node in model.graph.node]
    values = onnx_values(net)
    pairs, arrays = train(net, model, batches, case["optimizer"], values, onnx_values)
    direction = "bi" if case["bidirectional"] else "uni"
    layout = "batch_first" if case["batch_first"] else "seq_first"
    scenario = f"rnn2_{case['nonlinearity']}_{direction}_{layout}"
    config = {
        "scenario": scenario,
        "exporter": case["exporter"],
        "optimizer": case["optimizer"],
        "loss": "mse",
        "steps": STEPS,
        "lr_schedule": [case["optimizer"]["kwargs"]["lr"]] * STEPS,
        "trainable": sorted(pairs),
        "sources": {name: values[key][1] for name, key in pairs.items()},
        "model_inputs": [value.name for value in model.graph.input if value.name not in pairs],
        "target": "target",
        "rnn_nodes": rnn_nodes,
        "torch": torch.__version__,
    }
    arrays["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    return f"{scenario}-{case['exporter']}-{case['optimizer']['name']}", arrays


def main() -> None:
    OUTPUT_DIR.mkdir(exist_ok=True)
    for case in CASES:
        name, arrays = record(case)
        write_unless_unchanged(OUTPUT_DIR / f"{name}.npz", arrays)


if __name__ == "__main__":
    main()
