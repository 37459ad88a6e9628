"""Replays a recorded random model (tests/recordings/record_random_models.py) through Trainer, without torch.

``replay(directory, seed, flavour)`` builds ``Trainer(model, loss=..., optimizer=...)`` with its
defaults (what it trains is its own choice) and checks, against torch's recording:

1. the forward output and loss of the untrained model on batch 0;
2. the mapping: every trained tensor is a torch parameter or a re-layout of some (a transpose,
   a reshape, an ONNX LSTM / GRU / RNN W, R or B stacking directions and reordering gates), found
   by the initial values (by name first where equal values make it ambiguous: fresh norms), and
   every torch parameter is trained by exactly one tensor;
3. per step, the loss, every trained tensor's gradient (``accumulate`` + ``accumulated_gradients``)
   against the same re-layout of torch's gradients, and each update (``apply``) against torch's
   parameters after ``optimizer.step()``.

The outcome: ``match``; ``refused`` (the Trainer raised ValueError: its message is the reason);
``warned`` (the Trainer warned at construction and then trains differently: the warning is the
reason); ``export failed`` (torch's exporter raised); or ``WRONG`` (different numbers, or a
parameter trained twice or not at all, without a word: a bug).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from torch_conversion import torch_ifgo_to_onnx_iofc

from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer

FLAVOURS = ("dynamo", "dynamo_unoptimized", "torchscript")
# float32 on models of a few dozen values: the forward and gradients to ~1e-6 relative, so these
# leave a factor of 10-100; an update is compared relative to its own size, so that a learning
# rate 1% off (an update 1% off) fails it.
FORWARD_RTOL, FORWARD_ATOL = 1e-4, 1e-5
GRADIENT_RTOL, GRADIENT_ATOL = 1e-4, 1e-6
UPDATE_RTOL, UPDATE_ATOL = 1e-3, 1e-7

Layout = Callable[[dict[str, np.ndarray]], np.ndarray]


@dataclasses.dataclass
class Outcome:
    """What replaying one recorded export gave.

    Attributes:
        seed: The grammar's seed.
        flavour: The export flavour.
        outcome: ``match``, ``refused``, ``warned``, ``export failed`` or ``WRONG``.
        reason: The refusal's or warning's message, or what differed.
        spec: The model's spec (the grammar's dict).
    """

    seed: int
    flavour: str
    outcome: str
    reason: str
    spec: dict[str, Any]


def load(directory: Path, seed: int) -> dict[str, np.ndarray]:
    with np.load(directory / f"{seed}.npz") as data:
        return dict(data)


def _text(array: np.ndarray) -> str:
    return array.tobytes().decode()


def _reorder(stacked: np.ndarray, kind: str) -> np.ndarray:
    """torch's gate order -> ONNX's: LSTM ifgo -> iofc; GRU rzn -> zrh; RNN has one gate."""
    if kind == "LSTM":
        return torch_ifgo_to_onnx_iofc(stacked)
    if kind == "GRU":
        r, z, n = np.split(stacked, 3, axis=0)
        return np.concatenate([z, r, n], axis=0)
    return stacked


def layouts(spec: dict[str, Any], names: list[str]) -> dict[tuple[str, tuple[str, ...]], Layout]:
    """Each candidate ONNX tensor, by (its kind, the torch parameters it is made of) -> how it is made of them."""
    candidates: dict[tuple[str, tuple[str, ...]], Layout] = {}
    for name in names:
        candidates[("torch", (name,))] = lambda values, name=name: values[name]
    for index, block in enumerate(spec["blocks"]):
        if block["block"] not in ("LSTM", "RNN", "GRU"):
            continue
        kind, prefix = block["block"], f"{index}.rnn."
        suffixes = ("", "_reverse") if block["bidirectional"] else ("",)
        for layer in range(block["layers"]):
            for onnx_name, torch_kind in (("W", "weight_ih"), ("R", "weight_hh")):
                sources = tuple(f"{prefix}{torch_kind}_l{layer}{s}" for s in suffixes)
                candidates[(onnx_name, sources)] = lambda values, sources=sources, kind=kind: np.stack(
                    [_reorder(values[source], kind) for source in sources]
                )
            sources = tuple(f"{prefix}{b}_l{layer}{s}" for s in suffixes for b in ("bias_ih", "bias_hh"))
            candidates[("B", sources)] = lambda values, sources=sources, kind=kind: np.stack(
                [
                    np.concatenate([_reorder(values[ih], kind), _reorder(values[hh], kind)])
                    for ih, hh in zip(sources[::2], sources[1::2], strict=True)
                ]
            )
    return candidates


def _same(candidate: np.ndarray, value: np.ndarray) -> str | None:
    """How ``value`` holds ``candidate``: 'reshape', 'transpose', or None."""
    if candidate.size != value.size:
        return None
    if np.array_equal(candidate.reshape(value.shape), value):
        return "reshape"
    if candidate.ndim == 2 and np.array_equal(candidate.T.reshape(value.shape), value):
        return "transpose"
    return None


def map_trained(
    run: Trainer, spec: dict[str, Any], initial: dict[str, np.ndarray]
) -> tuple[dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]], list[str]]:
    """Each trained tensor -> the function of torch's tensors it equals; and what did not map."""
    candidates = layouts(spec, sorted(initial))
    known = {parameter.name: set(parameter.sources) for parameter in run.trained}
    mapped: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]] = {}
    problems: list[str] = []
    covered: dict[str, list[str]] = {}
    for name, value in run.parameters.items():
        found = []
        for (_, sources), layout in candidates.items():
            how = _same(layout(initial), value)
            if how is not None:
                found.append((sources, layout, how))
        found = list({entry[0]: entry for entry in found}.values())  # a 1-gate RNN's W is its weight_ih
        if len(found) > 1:  # equal values (fresh norms): the tensor's own name, then the export's metadata
            by_name = [entry for entry in found if entry[0] == (name,)]
            by_metadata = [entry for entry in found if set(entry[0]) <= known.get(name, set())]
            found = by_name or by_metadata or found
        if len(found) != 1:
            problems.append(f"trained tensor {name!r} {list(value.shape)} is " + (
                f"ambiguous among torch's {[entry[0] for entry in found]}" if found else "no torch parameter's layout"))
            continue
        sources, layout, how = found[0]
        shape = value.shape
        if how == "reshape":
            mapped[name] = lambda values, layout=layout, shape=shape: layout(values).reshape(shape)
        else:
            mapped[name] = lambda values, layout=layout, shape=shape: layout(values).T.reshape(shape)
        for source in sources:
            covered.setdefault(source, []).append(name)
    for torch_name in sorted(initial):
        trained_as = covered.get(torch_name, [])
        if len(trained_as) != 1:
            problems.append(f"torch parameter {torch_name!r} is trained by {trained_as or 'no tensor'}")
    return mapped, problems


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> bool:
    """Whether ``actual`` is ``expected`` to ``rtol`` of its largest magnitude, plus ``atol``."""
    return float(np.max(np.abs(actual - expected), initial=0.0)) <= rtol * float(
        np.max(np.abs(expected), initial=0.0)
    ) + atol


def exported(directory: Path, seed: int, flavour: str) -> onnx.ModelProto:
    """The recorded export (gzipped by the recorder)."""
    return onnx.load_from_string(gzip.decompress((directory / f"{seed}-{flavour}.onnx.gz").read_bytes()))


def trainer(model: onnx.ModelProto, spec: dict[str, Any], lr_scale: float = 1.0) -> Trainer:
    """``Trainer(model, loss=..., optimizer=...)`` with its defaults, as the recording's torch run."""
    kwargs = dict(spec["optimizer_kwargs"])
    kwargs["lr"] *= lr_scale
    if spec["loss"] == "cross_entropy":
        loss = losses.Loss.cross_entropy()
    elif spec["loss"] == "mse_loss":
        loss = losses.Loss.mse_loss()
    else:
        loss = losses.Loss.ctc_loss(input="logits", batch_first=True)
    return Trainer(model, loss=loss, optimizer=optimizers.optimizer_from_torch(spec["optimizer"], **kwargs))


def _feeds(arrays: dict[str, np.ndarray], index: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    named = {"target": arrays[f"batch/{index}/target"]}
    if f"batch/{index}/target_lengths" in arrays:
        named["target_lengths"] = arrays[f"batch/{index}/target_lengths"]
    return arrays[f"batch/{index}/x"], named


def differences(run: Trainer, arrays: dict[str, np.ndarray], spec: dict[str, Any]) -> list[str]:
    """Everything in which ``run`` differs from torch's recording (empty: it trains as torch)."""
    x, named = _feeds(arrays, 0)
    loss, y = run.evaluate(x, outputs=["y"], **named)
    found: list[str] = []
    if not _close(y, arrays["forward/y"], FORWARD_RTOL, FORWARD_ATOL):
        found.append(f"forward before training differs by {np.max(np.abs(y - arrays['forward/y'])):.3g}")
    if not _close(np.asarray(loss), arrays["forward/loss"], FORWARD_RTOL, FORWARD_ATOL):
        found.append(f"loss before training {float(loss):.6g}, torch {float(arrays['forward/loss']):.6g}")
    initial = {key.split("/")[1]: value for key, value in arrays.items() if key.startswith("param/")
               and key.endswith("/initial")}
    mapped, problems = map_trained(run, spec, initial)
    found += problems
    if found:
        return found
    for step in range(3):
        x, named = _feeds(arrays, step + 1)
        before = run.parameters
        loss = run.accumulate(x, **named)
        if not _close(np.asarray(loss), arrays[f"loss/{step}"], FORWARD_RTOL, FORWARD_ATOL):
            found.append(f"step {step}: loss {float(loss):.6g}, torch {float(arrays[f'loss/{step}']):.6g}")
        torch_gradients = {name: arrays[f"grad/{name}/{step}"] for name in initial}
        torch_before = {name: arrays[f"param/{name}/{step - 1}" if step else f"param/{name}/initial"]
                        for name in initial}
        torch_after = {name: arrays[f"param/{name}/{step}"] for name in initial}
        for name, gradient in run.accumulated_gradients.items():
            if not _close(gradient, mapped[name](torch_gradients), GRADIENT_RTOL, GRADIENT_ATOL):
                error = np.max(np.abs(gradient - mapped[name](torch_gradients)))
                found.append(f"step {step}: gradient of {name!r} differs by {error:.3g}")
        # Each update is made from torch's own gradients (compared just above): Adam divides by sqrt(v) + eps,
        # so where weight decay cancels a gradient (seed 94: g + wd * p = 1.3e-7 from terms of 7.3e-4) the
        # float32 rounding of g alone moves that update by 0.2%; the update then checks the optimizer alone.
        run.apply(gradients={name: mapped[name](torch_gradients).astype(value.dtype) for name, value in before.items()})
        for name, value in run.parameters.items():
            expected = mapped[name](torch_after) - mapped[name](torch_before)
            if not _close(value - before[name], expected, UPDATE_RTOL, UPDATE_ATOL):
                error = np.max(np.abs(value - before[name] - expected))
                size = np.abs(expected).max()
                found.append(f"step {step}: update of {name!r} differs by {error:.3g} (torch's: {size:.3g})")
        if found:
            break
    return found


def replay(directory: Path, seed: int, flavour: str, lr_scale: float = 1.0) -> Outcome:
    """The outcome of training ``directory/<seed>-<flavour>.onnx`` as torch did (``lr_scale``: a wrong lr)."""
    arrays = load(directory, seed)
    spec = json.loads(_text(arrays["spec"]))
    if f"export_error/{flavour}" in arrays:
        return Outcome(seed, flavour, "export failed", _text(arrays[f"export_error/{flavour}"]), spec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run = trainer(exported(directory, seed, flavour), spec, lr_scale)
        except ValueError as refusal:
            return Outcome(seed, flavour, "refused", str(refusal), spec)
    said = [str(warning.message) for warning in caught]
    found = differences(run, arrays, spec)
    if not found:
        return Outcome(seed, flavour, "match", "; ".join(said), spec)
    if said:
        return Outcome(seed, flavour, "warned", "; ".join(said) + " || " + "; ".join(found), spec)
    return Outcome(seed, flavour, "WRONG", "; ".join(found), spec)
