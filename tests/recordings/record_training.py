"""Records PyTorch training trajectories for the torch-free train-step parity test.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_training.py

For each case it exports the scenario's model (tests/torch_scenarios.py), trains a copy in
PyTorch for ``STEPS`` steps and writes ``train_step/<case>.npz`` next to this file: the exported
model's bytes, a JSON config (optimizer and loss with torch's arguments, the ONNX initializers to
train and their torch sources, the batch input names), every batch, the loss of every step and,
for every trained ONNX initializer, its value after every step as computed from the torch
parameters it was made of. ``tests/test_train_step_parity.py`` replays the batches through the
train-step model in onnxruntime, without torch. Seeded: a rerun with the same torch writes the
same arrays.
"""

from __future__ import annotations

import copy
import json
import math
import pathlib
import sys
import tempfile
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
from torch_scenarios import (  # noqa: E402
    SCENARIOS,
    Net,
    Scenario,
    export,
    make_batch,
    model_inputs,
    pair_initializers,
    split_frozen,
    torch_loss,
)

SEED = 20251123
STEPS = 20
OUTPUT_DIR = HERE / "train_step"


def lr_factor(step_index: int) -> float:
    """The factor of the base learning rate at 0-based step ``step_index``: a non-monotonic schedule."""
    return 0.55 + 0.45 * math.cos(1.3 * step_index)


ADAMW = {"name": "AdamW", "kwargs": {"lr": 0.01, "weight_decay": 0.01}}
CASES: list[dict[str, Any]] = [
    *(
        {"scenario": scenario.name, "exporter": exporter, "optimizer": ADAMW}
        for scenario in SCENARIOS
        for exporter in ("torchscript", "dynamo", "dynamo_unoptimized")
        if not (scenario.padded and exporter != "torchscript")
    ),
    {
        "scenario": "tokens_seq_first_y",
        "exporter": "torchscript",
        "optimizer": {"name": "SGD", "kwargs": {"lr": 0.3, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}},
    },
    # float64 end to end: at step 1 Adam moves every element by about lr * g / (|g| + eps), so an
    # element whose gradient is float32 rounding noise (|g| ~ eps) would differ by a sizeable part
    # of lr between any two float32 implementations.
    {
        "scenario": "features_batch_first_y",
        "exporter": "dynamo",
        "optimizer": {"name": "Adam", "kwargs": {"lr": 0.02, "amsgrad": True}},
        "dtype": "float64",
    },
    {
        "scenario": "tokens_seq_first_y",
        "exporter": "dynamo",
        "optimizer": {"name": "AdamW", "kwargs": {"lr": 0.05}},
        "clip_grad_norm": 0.5,
    },
]


def case_name(case: dict[str, Any]) -> str:
    """File stem of a case: scenario, exporter, optimizer, clipping."""
    name = f"{case['scenario']}-{case['exporter']}-{case['optimizer']['name']}"
    if case["optimizer"]["name"] != "AdamW" or case["optimizer"]["kwargs"] != ADAMW["kwargs"]:
        name += "-" + "-".join(f"{key}{value}" for key, value in sorted(case["optimizer"]["kwargs"].items()))
    if "clip_grad_norm" in case:
        name += f"-clip{case['clip_grad_norm']}"
    if case.get("dtype", "float32") != "float32":
        name += f"-{case['dtype']}"
    return name


def record(case: dict[str, Any]) -> dict[str, np.ndarray]:
    """Trains one case in torch; returns the arrays of its .npz file."""
    scenario: Scenario = next(s for s in SCENARIOS if s.name == case["scenario"])
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    exported_net = Net(scenario)
    float64 = case.get("dtype") == "float64"
    if float64:
        exported_net = exported_net.double()

    def batch_of(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v.astype(np.float64) if float64 and v.dtype == np.float32 else v for k, v in batch.items()}

    net = copy.deepcopy(exported_net)
    for name in scenario.frozen:
        net.get_parameter(name).requires_grad_(False)
    exporter = case["exporter"]
    with tempfile.TemporaryDirectory() as directory:
        model = export(
            exported_net,
            scenario,
            "torchscript" if exporter == "torchscript" else "dynamo",
            batch_of(make_batch(scenario, rng)),
            pathlib.Path(directory) / "model.onnx",
            optimize=exporter != "dynamo_unoptimized",
        )
    pairs = pair_initializers(model, net)
    trainable, frozen = split_frozen(pairs, scenario.frozen)
    optimizer_class = getattr(torch.optim, case["optimizer"]["name"])
    base_lr = case["optimizer"]["kwargs"]["lr"]
    optimizer = optimizer_class(
        [p for p in net.parameters() if p.requires_grad], **case["optimizer"]["kwargs"], foreach=False
    )
    arrays: dict[str, np.ndarray] = {"model": np.frombuffer(model.SerializeToString(), dtype=np.uint8)}
    losses = []
    trajectories: dict[str, list[np.ndarray]] = {name: [] for name in trainable}
    batch_names: list[str] = []
    for step in range(STEPS):
        batch = batch_of(make_batch(scenario, rng))
        batch_names = sorted(batch)
        for key, value in batch.items():
            arrays[f"batch/{step}/{key}"] = value
        for group in optimizer.param_groups:
            group["lr"] = base_lr * lr_factor(step)
        optimizer.zero_grad()
        loss = torch_loss(net, batch)
        loss.backward()
        if "clip_grad_norm" in case:
            torch.nn.utils.clip_grad_norm_(
                [p for p in net.parameters() if p.requires_grad], case["clip_grad_norm"], foreach=False
            )
        optimizer.step()
        losses.append(loss.item())
        for name in trainable:
            trajectories[name].append(pairs[name].value(net))
    arrays["losses"] = np.asarray(losses, dtype=np.float64)
    for name, values in trajectories.items():
        arrays[f"param/{name}"] = np.stack(values)
    config = {
        "scenario": scenario.name,
        "exporter": exporter,
        "optimizer": case["optimizer"],
        "clip_grad_norm": case.get("clip_grad_norm"),
        "loss": scenario.loss,
        "steps": STEPS,
        "lr_schedule": [case["optimizer"]["kwargs"]["lr"] * lr_factor(step) for step in range(STEPS)],
        "trainable": trainable,
        "frozen": frozen,
        "sources": {name: pairs[name].description for name in pairs},
        "model_inputs": sorted(model_inputs({name: np.zeros(1) for name in batch_names})),
        "target": next(name for name in batch_names if name in ("labels", "target")),
        "torch": torch.__version__,
    }
    arrays["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    return arrays


def main() -> None:
    """Writes every case's recording."""
    OUTPUT_DIR.mkdir(exist_ok=True)
    for case in CASES:
        name = case_name(case)
        np.savez_compressed(OUTPUT_DIR / f"{name}.npz", **record(case))
        print(f"recorded {name}")


if __name__ == "__main__":
    main()
