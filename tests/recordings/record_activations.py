"""Records PyTorch values for the activations torch exports as one ONNX op (GELU, SELU, Hardswish, ...).

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_activations.py

- Training: a Linear -> activation -> Linear classifier, exported with torch.onnx.export's
  defaults (dynamo, optimize=True: ``nn.GELU`` becomes one opset-20 ``Gelu`` node), trained for
  ``STEPS`` steps in torch; written to ``train_step/<case>.npz`` in record_training.py's format,
  so that tests/test_train_step_parity.py replays it through the train step (and the Trainer's
  defaults) without torch.
- Kinks: each activation's output and input gradient in float32 (torch's CPU kernels) at its
  kinks (where torch's ``*_backward`` picks a side) and at random points, into ``activations.npz``
  (a JSON ``configs`` entry: the ONNX op and attributes of each case), read by
  tests/test_activation_kinks.py.
- Layers: each torch.nn layer that exports as one op (GELU, Mish, Hardswish, SELU, CELU, PReLU,
  ReLU6 and Hardtanh as Clip; GroupNorm at opset 21, RMSNorm at opset 23) with random parameters,
  exported, and torch's gradients of its input (its kinks among the values) and parameters for a
  random dY, into ``activation_layers.npz``.

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

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from record_training import OUTPUT_DIR, write_unless_unchanged  # noqa: E402

SEED = 20261127
STEPS = 3
BATCH, FEATURES, HIDDEN, CLASSES = 8, 6, 16, 3

CASES: list[dict[str, Any]] = [
    {"activation": "gelu", "make": lambda: torch.nn.GELU(), "optimizer": {"name": "Adam", "kwargs": {"lr": 0.02}}},
    {
        "activation": "gelu",
        "make": lambda: torch.nn.GELU(),
        "optimizer": {"name": "SGD", "kwargs": {"lr": 0.5, "momentum": 0.9}},
    },
    {
        "activation": "gelu_tanh",
        "make": lambda: torch.nn.GELU(approximate="tanh"),
        "optimizer": {"name": "Adam", "kwargs": {"lr": 0.02}},
    },
]


class Net(torch.nn.Module):
    """Linear -> activation -> Linear: a transformer block's MLP as a classifier head."""

    def __init__(self, activation: torch.nn.Module) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.act = activation
        self.fc2 = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def case_name(case: dict[str, Any]) -> str:
    """File stem: the model, the exporter, the optimizer and its arguments."""
    kwargs = "-".join(f"{key}{value}" for key, value in sorted(case["optimizer"]["kwargs"].items()))
    return f"{case['activation']}_mlp_y-dynamo-{case['optimizer']['name']}-{kwargs}"


def export(net: torch.nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    """torch.onnx.export with its defaults (dynamo=True, optimize=True, its opset)."""
    program = torch.onnx.export(net, (x,), dynamo=True)
    buffer = io.BytesIO()
    program.save(buffer)
    return onnx.load_from_string(buffer.getvalue())


def record(case: dict[str, Any]) -> dict[str, np.ndarray]:
    """Trains one case in torch; returns the arrays of its .npz file."""
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    net = Net(case["make"]())
    batches = [
        {
            "x": rng.standard_normal((BATCH, FEATURES)).astype(np.float32),
            "labels": rng.integers(0, CLASSES, BATCH).astype(np.int64),
        }
        for _ in range(STEPS)
    ]
    model = export(net, torch.from_numpy(batches[0]["x"]))
    op_types = {node.op_type for node in model.graph.node}
    assert "Gelu" in op_types, f"the export has no Gelu node: {sorted(op_types)}"
    initializers = {init.name for init in model.graph.initializer}
    named = dict(net.named_parameters())
    assert set(named) <= initializers, f"torch parameters {sorted(set(named) - initializers)} renamed by the export"
    optimizer = getattr(torch.optim, case["optimizer"]["name"])(net.parameters(), **case["optimizer"]["kwargs"])
    arrays: dict[str, np.ndarray] = {"model": np.frombuffer(model.SerializeToString(), dtype=np.uint8)}
    losses, trajectories = [], {name: [] for name in named}
    for step, batch in enumerate(batches):
        for key, value in batch.items():
            arrays[f"batch/{step}/{key}"] = value
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(batch["x"])), torch.from_numpy(batch["labels"]))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        for name, parameter in named.items():
            trajectories[name].append(parameter.detach().numpy().copy())
    arrays["losses"] = np.asarray(losses, dtype=np.float64)
    for name, values in trajectories.items():
        arrays[f"param/{name}"] = np.stack(values)
    config = {
        "scenario": f"{case['activation']}_mlp_y",
        "exporter": "dynamo",
        "optimizer": case["optimizer"],
        "clip_grad_norm": None,
        "loss": "cross_entropy",
        "steps": STEPS,
        "lr_schedule": [case["optimizer"]["kwargs"]["lr"]] * STEPS,
        "trainable": sorted(named),
        "frozen": [],
        "sources": {name: name for name in named},
        "model_inputs": ["x"],
        "target": "labels",
        "torch": torch.__version__,
    }
    arrays["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    return arrays


# (name, torch function, ONNX op, its attributes, opset, kinks). Thresholds are exact in float32.
KINKS: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], str, dict[str, Any], int, list[float]]] = [
    ("gelu", F.gelu, "Gelu", {}, 20, [0.0]),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), "Gelu", {"approximate": "tanh"}, 20, [0.0]),
    ("hardswish", F.hardswish, "HardSwish", {}, 17, [-3.0, 3.0]),
    ("mish", F.mish, "Mish", {}, 18, [0.0]),
    ("selu", F.selu, "Selu", {}, 17, [0.0]),
    ("celu", lambda x: F.celu(x, 0.75), "Celu", {"alpha": 0.75}, 17, [0.0]),
    ("softsign", F.softsign, "Softsign", {}, 17, [0.0]),
    ("threshold", lambda x: F.threshold(x, 0.75, 0.0), "ThresholdedRelu", {"alpha": 0.75}, 17, [0.75]),
    ("softshrink", lambda x: F.softshrink(x, 0.5), "Shrink", {"lambd": 0.5, "bias": 0.5}, 17, [-0.5, 0.5]),
    ("hardshrink", lambda x: F.hardshrink(x, 0.5), "Shrink", {"lambd": 0.5}, 17, [-0.5, 0.5]),
    ("elu", lambda x: F.elu(x, 0.75), "Elu", {"alpha": 0.75}, 17, [0.0]),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.125), "LeakyRelu", {"alpha": 0.125}, 17, [0.0]),
    ("relu", F.relu, "Relu", {}, 17, [0.0]),
    ("hardsigmoid", F.hardsigmoid, "HardSigmoid", {"alpha": 1.0 / 6.0, "beta": 0.5}, 17, [-3.0, 3.0]),
    ("softplus", F.softplus, "Softplus", {}, 17, [0.0]),
]
KINK_SHAPE = (2, 3, 4)  # [N, C, L]: PRelu's slope is per channel


def record_kinks() -> dict[str, np.ndarray]:
    """Each activation's Y and dX = dY * f'(X) in float32, X holding its kinks and random points."""
    rng = np.random.default_rng(SEED)
    arrays: dict[str, np.ndarray] = {}
    configs: dict[str, Any] = {}
    for name, function, op_type, attributes, opset, kinks in [*KINKS, ("prelu", None, "PRelu", {}, 17, [0.0])]:
        x = rng.uniform(-6.0, 6.0, KINK_SHAPE).astype(np.float32)
        x.reshape(-1)[: len(kinks)] = kinks
        x.reshape(-1)[-len(kinks) :] = kinks  # the kinks in other channels too (PRelu)
        dy = rng.uniform(-1.5, 1.5, KINK_SHAPE).astype(np.float32)
        x_torch = torch.from_numpy(x).requires_grad_(True)
        inputs = [x_torch]
        if op_type == "PRelu":
            slope = torch.from_numpy(rng.uniform(0.1, 0.4, (KINK_SHAPE[1],)).astype(np.float32)).requires_grad_(True)
            inputs.append(slope)
            y = F.prelu(x_torch, slope)
            arrays[f"{name}/slope"] = slope.detach().numpy().reshape(-1, 1)  # ONNX: broadcast against [N, C, L]
        else:
            y = function(x_torch)
        grads = torch.autograd.grad(y, inputs, torch.from_numpy(dy))
        arrays[f"{name}/x"], arrays[f"{name}/dy"], arrays[f"{name}/y"] = x, dy, y.detach().numpy()
        arrays[f"{name}/dx"] = grads[0].numpy()
        if op_type == "PRelu":
            arrays[f"{name}/dslope"] = grads[1].numpy().reshape(-1, 1)
        configs[name] = {"op_type": op_type, "attributes": attributes, "opset": opset, "kinks": kinks}
    arrays["configs"] = np.frombuffer(json.dumps({"torch": torch.__version__, "cases": configs}).encode(), np.uint8)
    return arrays


# (name, layer, input shape, opset or None for the exporter's default, values X holds): layers
# exported as one op.
LAYERS: list[tuple[str, Callable[[], torch.nn.Module], tuple[int, ...], int | None, list[float]]] = [
    ("gelu", torch.nn.GELU, (2, 3, 5), None, []),
    ("gelu_tanh", lambda: torch.nn.GELU(approximate="tanh"), (2, 3, 5), None, []),
    ("mish", torch.nn.Mish, (2, 3, 5), None, []),
    ("hardswish", torch.nn.Hardswish, (2, 3, 5), None, [-3.0, 3.0]),
    ("selu", torch.nn.SELU, (2, 3, 5), None, [0.0]),
    ("celu", lambda: torch.nn.CELU(0.75), (2, 3, 5), None, [0.0]),
    ("prelu", lambda: torch.nn.PReLU(3), (2, 3, 5), None, [0.0]),
    ("relu6", torch.nn.ReLU6, (2, 3, 5), None, [0.0, 6.0, 6.5]),
    ("hardtanh", lambda: torch.nn.Hardtanh(-0.5, 0.75), (2, 3, 5), None, [-0.5, 0.75]),
    ("group_norm", lambda: torch.nn.GroupNorm(2, 4), (2, 4, 3, 2), 21, []),
    ("rms_norm", lambda: torch.nn.RMSNorm([3, 5]), (2, 3, 5), 23, []),
]


def record_layers() -> dict[str, np.ndarray]:
    """Each layer's export (its parameters random) and torch's Y, dX and parameter gradients for a random dY."""
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    arrays: dict[str, np.ndarray] = {}
    for name, make, shape, opset, kinks in LAYERS:
        layer = make()
        with torch.no_grad():
            for parameter in layer.parameters():
                parameter.copy_(torch.from_numpy(rng.uniform(0.2, 1.5, parameter.shape).astype(np.float32)))
        values = (rng.standard_normal(shape) * 2).astype(np.float32)
        values.reshape(-1)[: len(kinks)] = kinks
        x = torch.from_numpy(values).requires_grad_(True)
        program = torch.onnx.export(layer, (x.detach(),), dynamo=True, opset_version=opset)
        buffer = io.BytesIO()
        program.save(buffer)
        model = onnx.load_from_string(buffer.getvalue())
        assert len(model.graph.node) == 1, f"{name}: {[node.op_type for node in model.graph.node]}"
        y = layer(x)
        dy = rng.uniform(-1.5, 1.5, y.shape).astype(np.float32)
        named = dict(layer.named_parameters())
        grads = torch.autograd.grad(y, [x, *named.values()], torch.from_numpy(dy))
        arrays[f"{name}/model"] = np.frombuffer(model.SerializeToString(), dtype=np.uint8)
        arrays[f"{name}/x"], arrays[f"{name}/dy"], arrays[f"{name}/y"] = x.detach().numpy(), dy, y.detach().numpy()
        arrays[f"{name}/grad/x"] = grads[0].numpy()
        for parameter, grad in zip(named, grads[1:], strict=True):
            arrays[f"{name}/grad/{parameter}"] = grad.numpy()
    return arrays


def main() -> None:
    """Writes every recording; a file whose arrays did not change is left as it is."""
    for case in CASES:
        write_unless_unchanged(OUTPUT_DIR / f"{case_name(case)}.npz", record(case))
    write_unless_unchanged(HERE / "activations.npz", record_kinks())
    write_unless_unchanged(HERE / "activation_layers.npz", record_layers())


if __name__ == "__main__":
    main()
