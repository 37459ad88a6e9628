"""Records torch's training of random models of the grammar (tests/random_model_grammar.py), issue 31.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_random_models.py [--seeds 0-119] [--out DIR]

For each seed: the model exported three ways as ``<seed>-<flavour>.onnx.gz`` (``dynamo``:
torch.onnx.export's default, optimize=True; ``dynamo_unoptimized``: optimize=False;
``torchscript``: dynamo=False; gzipped, without the stack traces and name scopes of dynamo's node
metadata, which nothing reads), and ``<seed>.npz`` with the spec, the batches, torch's output of
the untrained model on batch 0, and for each of the 3 steps (batches 1-3) the loss, every
parameter's gradient and every parameter after the update, by torch name. An export that fails
is recorded with its message (``export_error/<flavour>``). Seeded: a rerun writes the same arrays.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import sys
import warnings
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import random_model_grammar as grammar

HERE = pathlib.Path(__file__).resolve().parent
OUTPUT = HERE / "random_models"
FLAVOURS = ("dynamo", "dynamo_unoptimized", "torchscript")
# The fast subset (tests/test_random_models.py): seeds 0-19, three that bring GRU, SiLU, Hardswish, and
# two whose BatchNorm dynamo's optimizer fuses (into a Conv in train mode, into a Linear).
FAST_SEEDS = (*range(20), 27, 37, 41, 46, 78)


def torch_loss(spec: dict[str, Any], y: torch.Tensor, batch: dict[str, np.ndarray]) -> torch.Tensor:
    target = torch.from_numpy(batch["target"])
    if spec["loss"] == "cross_entropy":
        return F.cross_entropy(y, target)
    if spec["loss"] == "mse_loss":
        return F.mse_loss(y, target)
    lengths = torch.full((y.shape[0],), y.shape[1], dtype=torch.int64)
    return F.ctc_loss(y.log_softmax(2).transpose(0, 1), target, lengths, torch.from_numpy(batch["target_lengths"]))


def export(
    model: torch.nn.Module, spec: dict[str, Any], flavour: str, x: torch.Tensor, out: pathlib.Path
) -> dict[str, str]:
    """Exports ``model`` as ``flavour`` ('torchscript', or 'dynamo': both dynamo flavours at once).

    torch.onnx.export(optimize=True) is the optimize=False export followed by
    ``ONNXProgram.optimize()`` (torch 2.13's ``_core.export``), so one dynamo export serves both.

    Returns:
        Each flavour whose exporter failed -> the error's message.
    """
    seed = spec["seed"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if flavour == "torchscript":
                mode = torch.onnx.TrainingMode.TRAINING if spec["train_mode"] else torch.onnx.TrainingMode.EVAL
                path = out / f"{seed}-torchscript.onnx"
                torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"],
                                  training=mode)
                shrink(path)
            else:
                program = torch.onnx.export(model, (x,), dynamo=True, input_names=["x"], output_names=["y"],
                                            optimize=False, verbose=False)
                program.save(str(out / f"{seed}-dynamo_unoptimized.onnx"))
                shrink(out / f"{seed}-dynamo_unoptimized.onnx")
                program.optimize()
                program.save(str(out / f"{seed}-dynamo.onnx"))
                shrink(out / f"{seed}-dynamo.onnx")
    except Exception as error:  # any exporter failure is recorded as what it says
        message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500]
        flavours = ("torchscript",) if flavour == "torchscript" else ("dynamo", "dynamo_unoptimized")
        return dict.fromkeys(flavours, message)
    return {}


# Per-node metadata the training never reads: half of a dynamo export's bytes.
UNREAD_METADATA = ("pkg.torch.onnx.stack_trace", "namespace", "pkg.torch.onnx.name_scopes")


def shrink(path: pathlib.Path) -> None:
    """Rewrites ``path`` as ``path.gz`` without the node metadata nothing reads (a recording stays small)."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        kept = [prop for prop in node.metadata_props if prop.key not in UNREAD_METADATA]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(model.SerializeToString(), mtime=0))
    path.unlink()


def record(seed: int, output: pathlib.Path) -> None:
    spec = grammar.draw(seed)
    data = grammar.batches(spec)
    arrays: dict[str, np.ndarray] = {}
    for flavour in ("dynamo", "torchscript"):
        # A fresh copy per export: TorchScript's TRAINING mode and dynamo may touch the module's state.
        errors = export(grammar.build(spec), spec, flavour, torch.from_numpy(data[0]["x"]), output)
        for name, error in errors.items():
            arrays[f"export_error/{name}"] = np.frombuffer(error.encode(), dtype=np.uint8)
    model = grammar.build(spec)
    name, kwargs = spec["optimizer"], spec["optimizer_kwargs"]
    optimizer = getattr(torch.optim, name)(model.parameters(), **kwargs)
    for key, value in data[0].items():
        arrays[f"batch/0/{key}"] = value
    with torch.no_grad():
        if spec["train_mode"]:  # the forward check must not move the running statistics torch trains from
            state = {key: value.clone() for key, value in model.state_dict().items()}
            arrays["forward/y"] = model(torch.from_numpy(data[0]["x"])).numpy()
            model.load_state_dict(state)
        else:
            arrays["forward/y"] = model(torch.from_numpy(data[0]["x"])).numpy()
    arrays["forward/loss"] = np.asarray(torch_loss(spec, torch.from_numpy(arrays["forward/y"]), data[0]).item())
    for parameter_name, value in model.named_parameters():
        arrays[f"param/{parameter_name}/initial"] = value.detach().numpy().copy()
    for step in range(grammar.STEPS):
        batch = data[step + 1]
        for key, value in batch.items():
            arrays[f"batch/{step + 1}/{key}"] = value
        optimizer.zero_grad()
        loss = torch_loss(spec, model(torch.from_numpy(batch["x"])), batch)
        loss.backward()
        arrays[f"loss/{step}"] = np.asarray(loss.item(), dtype=np.float32)
        for parameter_name, value in model.named_parameters():
            arrays[f"grad/{parameter_name}/{step}"] = value.grad.numpy().copy()
        optimizer.step()
        for parameter_name, value in model.named_parameters():
            arrays[f"param/{parameter_name}/{step}"] = value.detach().numpy().copy()
    arrays["spec"] = np.frombuffer(json.dumps(spec).encode(), dtype=np.uint8)
    np.savez_compressed(output / f"{seed}.npz", **arrays)


def parse_seeds(text: str) -> list[int]:
    """``0-19`` or ``3,5,8``."""
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(seed) for seed in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds", default=",".join(map(str, FAST_SEEDS)), help="0-19 or 3,5,8 (default: the fast subset)"
    )
    parser.add_argument("--out", default=str(OUTPUT))
    args = parser.parse_args()
    output = pathlib.Path(args.out)
    output.mkdir(parents=True, exist_ok=True)
    for seed in parse_seeds(args.seeds):
        record(seed, output)
        print(f"recorded seed {seed}", flush=True)


if __name__ == "__main__":
    main()
