"""Records PyTorch training trajectories for the torch-free train-step parity test.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_training.py [WORD ...]

(with words: only the cases whose file name contains one of them). For each case it exports the
scenario's model (tests/torch_scenarios.py, tests/convlstm_scenarios.py), trains a copy in PyTorch
for ``STEPS`` steps and writes ``train_step/<case>.npz`` (the ConvLSTM cases:
``convlstm/<case>.npz``) next to this file: the exported model's bytes, a JSON config (optimizer and
loss with torch's arguments, parameter groups by ONNX initializer name, the ONNX initializers to
train and their torch sources, the batch input names), every batch, the loss of every step and, for
every trained ONNX initializer, its value after every step as computed from the torch parameters it
was made of.
``tests/test_train_step_parity.py`` replays the batches through the train-step model in
onnxruntime, without torch. Seeded: a rerun with the same torch computes the same arrays, and
leaves a file whose arrays are unchanged as it is (byte for byte).
"""

from __future__ import annotations

import copy
import json
import math
import pathlib
import sys
import tempfile
from types import ModuleType
from typing import Any

import numpy as np
import onnx

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import convlstm_scenarios  # noqa: E402
import torch  # noqa: E402
import torch_scenarios  # noqa: E402
from torch_scenarios import (  # noqa: E402
    TRAIN_STEP_SCENARIOS,
    Scenario,
    TorchSource,
    pair_initializers,
    split_frozen,
)

SEED = 20251123
STEPS = 20
OUTPUT_DIR = HERE / "train_step"


def lr_factor(step_index: int) -> float:
    """The factor of the base learning rate at 0-based step ``step_index``: a non-monotonic schedule."""
    return 0.55 + 0.45 * math.cos(1.3 * step_index)


def exportable(scenario: Scenario, exporter: str) -> bool:
    """Whether the export of ``scenario`` holds the model torch trains.

    torch 2.13's dynamo exporter cannot trace pack_padded_sequence. With a static batch size its
    optimizer folds the trainable initial state's Expand and per-layer Slice into one constant per
    layer, [2, batch, H]: h0 / c0 are gone from the export (per batch element copies are not torch's
    parameter, whose gradient sums over the batch), so only a dynamic batch keeps them there.
    """
    if scenario.padded:
        return exporter == "torchscript"
    if scenario.trainable_state and not scenario.dynamic_batch:
        return exporter != "dynamo"
    return True


ADAMW = {"name": "AdamW", "kwargs": {"lr": 0.01, "weight_decay": 0.01}}
# Scenarios whose Adam-family runs are recorded in float64. At step 1 Adam moves every element by
# about lr * g / (|g| + eps), so an element whose gradient is float32 rounding noise (|g| ~ eps)
# moves by a different fraction of lr in any two float32 implementations: in this scenario one
# element of R has |g| ~ 1.3e-8 at step 1 (0.5624 vs 0.5607 of lr, 1.8e-5 apart for good).
FLOAT64_ADAM_SCENARIOS = ("features_batch_first_y",)
CASES: list[dict[str, Any]] = [
    *(
        {
            "scenario": scenario.name,
            "exporter": exporter,
            "optimizer": ADAMW,
            **({"dtype": "float64"} if scenario.name in FLOAT64_ADAM_SCENARIOS else {}),
        }
        for scenario in TRAIN_STEP_SCENARIOS
        for exporter in ("torchscript", "dynamo", "dynamo_unoptimized")
        if exportable(scenario, exporter)
    ),
    {
        "scenario": "tokens_seq_first_y",
        "exporter": "torchscript",
        "optimizer": {"name": "SGD", "kwargs": {"lr": 0.3, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}},
    },
    # float64 end to end, for the reason of FLOAT64_ADAM_SCENARIOS.
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
    # clip_grad_value_, with a bound that clamps part of the gradient elements at most steps.
    {
        "scenario": "tokens_seq_first_y",
        "exporter": "dynamo",
        "optimizer": {"name": "SGD", "kwargs": {"lr": 0.2, "momentum": 0.9}},
        "clip_grad_value": 0.01,
    },
    {
        "scenario": "tokens_seq_first_y",
        "exporter": "torchscript",
        "optimizer": {"name": "Adam", "kwargs": {"lr": 0.02}},
        "clip_grad_value": 0.005,
    },
    # The per-step tagger with SGD's dampened momentum.
    {
        "scenario": "tokens_seq_first_y",
        "exporter": "dynamo",
        "optimizer": {"name": "SGD", "kwargs": {"lr": 0.2, "momentum": 0.8, "dampening": 0.3}},
    },
    # Two parameter groups: no weight decay on biases (grouped by ONNX initializer: an LSTM layer's
    # B packs bias_ih and bias_hh, both biases). The decay is large so that the groups matter:
    # lr * weight_decay = 1e-3 of a bias per step, far beyond the tolerance after 20 steps.
    *(
        {
            "scenario": "tokens_seq_first_y",
            "exporter": exporter,
            "optimizer": {"name": "AdamW", "kwargs": {"lr": 0.01, "weight_decay": 0.1}},
            "param_groups": [{"select": "biases", "weight_decay": 0.0}],
        }
        for exporter in ("torchscript", "dynamo")
    ),
]

# ConvLSTM models (tests/convlstm_scenarios.py) in every export flavour, with Adam; recorded into
# their own folder: tests/test_convlstm_parity.py replays them with the Trainer's defaults.
CONVLSTM_DIRECTORY = "convlstm"
CASES += [
    {
        "scenario": scenario.name,
        "exporter": exporter,
        "optimizer": {"name": "Adam", "kwargs": {"lr": 0.01}},
        "directory": CONVLSTM_DIRECTORY,
    }
    for scenario in convlstm_scenarios.SCENARIOS
    for exporter in ("torchscript", "dynamo", "dynamo_unoptimized")
]

# Parameter-group selections of torch parameter names (a case's "select").
SELECTIONS = {"biases": lambda name: name.rsplit(".", 1)[-1].startswith("bias")}


def case_name(case: dict[str, Any]) -> str:
    """File stem of a case: scenario, exporter, optimizer, clipping."""
    name = f"{case['scenario']}-{case['exporter']}-{case['optimizer']['name']}"
    if case["optimizer"]["name"] != "AdamW" or case["optimizer"]["kwargs"] != ADAMW["kwargs"]:
        name += "-" + "-".join(f"{key}{value}" for key, value in sorted(case["optimizer"]["kwargs"].items()))
    if "clip_grad_norm" in case:
        name += f"-clip{case['clip_grad_norm']}"
    if "clip_grad_value" in case:
        name += f"-clipvalue{case['clip_grad_value']}"
    for group in case.get("param_groups", ()):
        name += f"-group_{group['select']}_" + "-".join(
            f"{key}{value}" for key, value in sorted(group.items()) if key != "select"
        )
    if case.get("dtype", "float32") != "float32":
        name += f"-{case['dtype']}"
    return name


def param_groups(
    case: dict[str, Any], net: torch.nn.Module, pairs: dict[str, TorchSource], trainable: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The torch param groups of a case, and the same groups by ONNX initializer name.

    A group holds the torch parameters its selection accepts; an ONNX initializer belongs to it
    when all the torch parameters it was made of do (it must not mix them with others).
    """
    named = [(name, p) for name, p in net.named_parameters() if p.requires_grad]
    torch_groups: list[dict[str, Any]] = []
    onnx_groups: list[dict[str, Any]] = []
    grouped: set[str] = set()
    for group in case.get("param_groups", ()):
        select = SELECTIONS[group["select"]]
        overrides = {key: value for key, value in group.items() if key != "select"}
        members = [name for name, _ in named if select(name) and name not in grouped]
        grouped.update(members)
        torch_groups.append({"params": [p for name, p in named if name in members], **overrides})
        onnx_names = []
        for onnx_name in trainable:
            inside = {name in members for name in pairs[onnx_name].parameters}
            assert len(inside) == 1, f"{onnx_name} mixes {group['select']} and other parameters"
            if inside.pop():
                onnx_names.append(onnx_name)
        assert onnx_names, f"group {group['select']}: no ONNX initializer"
        onnx_groups.append({"params": onnx_names, **overrides})
    if not torch_groups:
        return [p for _, p in named], []
    torch_groups.insert(0, {"params": [p for name, p in named if name not in grouped]})
    return torch_groups, onnx_groups


def scenarios_of(name: str) -> ModuleType:
    """The module of scenario ``name``: tests/torch_scenarios.py or tests/convlstm_scenarios.py.

    Both offer Net, make_batch, model_inputs, torch_loss and export.
    """
    if any(scenario.name == name for scenario in convlstm_scenarios.SCENARIOS):
        return convlstm_scenarios
    return torch_scenarios


def record(case: dict[str, Any]) -> dict[str, np.ndarray]:
    """Trains one case in torch; returns the arrays of its .npz file."""
    models = scenarios_of(case["scenario"])
    scenario: Scenario | convlstm_scenarios.Scenario = next(
        s for s in [*TRAIN_STEP_SCENARIOS, *convlstm_scenarios.SCENARIOS] if s.name == case["scenario"]
    )
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    exported_net = models.Net(scenario)
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
        model = models.export(
            exported_net,
            scenario,
            "torchscript" if exporter == "torchscript" else "dynamo",
            batch_of(models.make_batch(scenario, rng)),
            pathlib.Path(directory) / "model.onnx",
            optimize=exporter != "dynamo_unoptimized",
        )
    pairs = pair_initializers(model, net)
    trainable, frozen = split_frozen(pairs, scenario.frozen)
    optimizer_class = getattr(torch.optim, case["optimizer"]["name"])
    base_lr = case["optimizer"]["kwargs"]["lr"]
    groups, onnx_groups = param_groups(case, net, pairs, trainable)
    optimizer = optimizer_class(groups, **case["optimizer"]["kwargs"], foreach=False)
    arrays: dict[str, np.ndarray] = {"model": np.frombuffer(model.SerializeToString(), dtype=np.uint8)}
    losses = []
    trajectories: dict[str, list[np.ndarray]] = {name: [] for name in trainable}
    batch_names: list[str] = []
    clamped = elements = 0
    for step in range(STEPS):
        batch = batch_of(models.make_batch(scenario, rng))
        batch_names = sorted(batch)
        for key, value in batch.items():
            arrays[f"batch/{step}/{key}"] = value
        for group in optimizer.param_groups:
            group["lr"] = base_lr * lr_factor(step)
        optimizer.zero_grad()
        loss = models.torch_loss(net, batch)
        loss.backward()
        if "clip_grad_norm" in case:
            torch.nn.utils.clip_grad_norm_(
                [p for p in net.parameters() if p.requires_grad], case["clip_grad_norm"], foreach=False
            )
        if "clip_grad_value" in case:
            grads = [p.grad for p in net.parameters() if p.requires_grad]
            clamped += sum(int((g.abs() > case["clip_grad_value"]).sum()) for g in grads)
            elements += sum(g.numel() for g in grads)
            torch.nn.utils.clip_grad_value_(
                [p for p in net.parameters() if p.requires_grad], case["clip_grad_value"], foreach=False
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
        "model_inputs": sorted(models.model_inputs({name: np.zeros(1) for name in batch_names})),
        "target": next(name for name in batch_names if name in ("labels", "target")),
        "torch": torch.__version__,
    }
    if onnx_groups:  # only then: the configs of the other recordings stay as they were
        config["param_groups"] = onnx_groups
    if "clip_grad_value" in case:  # likewise
        config["clip_grad_value"] = case["clip_grad_value"]
        print(f"clip_grad_value {case['clip_grad_value']}: clamped {clamped} of {elements} gradient elements")
    arrays["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    return arrays


def _without_metadata(model_bytes: bytes) -> bytes:
    """A serialized model without its metadata_props.

    The dynamo exporter's stack traces in them name lines of tests/torch_scenarios.py, which
    any edit there moves.
    """
    model = onnx.load_from_string(model_bytes)
    holders = [model, *model.graph.node, *model.graph.input, *model.graph.output, *model.graph.value_info]
    for holder in [*holders, *model.graph.initializer]:
        holder.ClearField("metadata_props")
    return model.SerializeToString(deterministic=True)


def unchanged(path: pathlib.Path, arrays: dict[str, np.ndarray]) -> bool:
    """Whether ``path`` already holds these arrays.

    Same keys, dtypes, shapes and bytes; the model the same but for its metadata.
    """
    if not path.exists():
        return False
    with np.load(path) as data:
        if sorted(data.files) != sorted(arrays):
            return False
        for key, value in arrays.items():
            old = data[key]
            if key == "model":
                if _without_metadata(old.tobytes()) != _without_metadata(value.tobytes()):
                    return False
            elif old.dtype != value.dtype or old.shape != value.shape or old.tobytes() != value.tobytes():
                return False
    return True


def write_unless_unchanged(path: pathlib.Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes ``arrays`` to ``path``, unless it holds them already (see ``unchanged``).

    (A zip holds its members' write times, so rewriting equal arrays would change its bytes.)
    """
    if unchanged(path, arrays):
        print(f"unchanged {path.stem}")
        return
    np.savez_compressed(path, **arrays)
    print(f"recorded {path.stem}")


def main(words: list[str]) -> None:
    """Writes every case's recording; a file whose arrays did not change is left as it is.

    Args:
        words: Record only the cases whose name contains one of these (all when empty).
    """
    names = [case_name(case) for case in CASES]
    assert len(set(names)) == len(names), f"two cases have the same name: {names}"
    for case, name in zip(CASES, names, strict=True):
        if words and not any(word in name for word in words):
            continue
        directory = HERE / case["directory"] if "directory" in case else OUTPUT_DIR
        directory.mkdir(exist_ok=True)
        write_unless_unchanged(directory / f"{name}.npz", record(case))


if __name__ == "__main__":
    main(sys.argv[1:])
