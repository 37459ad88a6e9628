"""A grammar of small random torch models, drawn from a seed, for the parity suite (issue 31).

``draw(seed)`` is pure Python (no torch): a JSON-able spec of a model (its input, a chain of
blocks, a head), a loss and an optimizer. ``build(spec)`` (torch, the train environment) makes
the ``nn.Module``; ``batches(spec)`` the seeded inputs and targets. The replayer reads the spec
from the recording to know each recurrent module's torch parameters (their ONNX re-layouts).

The blocks, by the kind of tensor they take (``seq`` [N, T, F], ``vec`` [N, F], ``img1d``
[N, C, L], ``img2d`` [N, C, H, W], ``tokens`` [N, T] int64):

- seq: LSTM / RNN (tanh, relu) / GRU (uni or bidirectional, 1-2 layers, batch_first or not),
  Linear, LayerNorm, an activation, Dropout(0), a residual Linear, Conv1d over time;
- img1d / img2d: Conv1d / Conv2d, BatchNorm (eval or train mode), GroupNorm, an activation,
  max / average pooling, a residual Conv;
- vec: Linear, LayerNorm, BatchNorm1d, an activation, Dropout(0), a residual Linear;
- tokens: Embedding, with or without padding_idx.

Heads: ``cross_entropy`` (class indices), ``mse_loss`` on a vector, ``ctc_loss`` on per-step
logits (batch first). Optimizers: SGD with momentum, Adam, AdamW with weight decay. Widths stay
tiny so that a recording is a few kB.
"""

from __future__ import annotations

import random
from typing import Any

BATCH = 3
STEPS = 3
ACTIVATIONS = ("ReLU", "Tanh", "Sigmoid", "GELU", "GELU_tanh", "SiLU", "Hardswish", "ELU", "LeakyReLU", "Softplus",
               "Mish", "Hardsigmoid", "SELU", "CELU", "Softsign")
OPTIMIZERS = (
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
)


def _recurrent(r: random.Random, width: int) -> dict[str, Any]:
    kind = r.choice(("LSTM", "LSTM", "RNN", "GRU"))
    block: dict[str, Any] = {
        "block": kind,
        "hidden": r.choice((3, 4)),
        "layers": r.choice((1, 1, 2)),
        "bidirectional": r.random() < 0.4,
        "batch_first": r.random() < 0.6,
        "in": width,
    }
    if kind == "RNN":
        block["nonlinearity"] = r.choice(("tanh", "relu"))
    return block


def _out_width(block: dict[str, Any], width: int) -> int:
    if block["block"] in ("LSTM", "RNN", "GRU"):
        return block["hidden"] * (2 if block["bidirectional"] else 1)
    return block.get("out", width)


def _seq_blocks(r: random.Random, width: int, count: int) -> tuple[list[dict[str, Any]], int]:
    blocks: list[dict[str, Any]] = []
    for _ in range(count):
        choice = r.choice(("rnn", "rnn", "linear", "norm", "act", "dropout", "residual", "conv1d"))
        if choice == "rnn":
            block = _recurrent(r, width)
        elif choice == "linear":
            block = {"block": "Linear", "in": width, "out": r.choice((3, 4, 5))}
        elif choice == "norm" and width >= 3:  # over 2 features the output is +-1: its gradient is all rounding
            block = {"block": "LayerNorm", "in": width}
        elif choice in ("act", "norm"):
            block = {"block": "act", "act": r.choice(ACTIVATIONS)}
        elif choice == "dropout":
            block = {"block": "Dropout"}
        elif choice == "residual":
            block = {"block": "ResidualLinear", "in": width, "act": r.choice(ACTIVATIONS)}
        else:
            block = {"block": "SeqConv1d", "in": width, "out": r.choice((3, 4)), "kernel": r.choice((1, 3))}
        blocks.append(block)
        width = _out_width(block, width)
    return blocks, width


def _image_blocks(r: random.Random, channels: int, rank: int, count: int, train_bn: bool) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    pooled = False
    for _ in range(count):
        choice = r.choice(("conv", "conv", "bn", "gn", "act", "pool", "residual"))
        if choice == "pool" and pooled:
            choice = "conv"
        if choice == "conv":
            out = r.choice((2, 3, 4))
            blocks.append({"block": f"Conv{rank}d", "in": channels, "out": out, "kernel": 3, "padding": 1,
                           "bias": r.random() < 0.8})
            channels = out
        elif choice == "bn":
            blocks.append({"block": f"BatchNorm{rank}d", "in": channels, "train": train_bn})
        elif choice == "gn" and channels >= 2:
            # Groups of one channel would make the global mean after them exactly zero, and every
            # gradient before them rounding noise (which Adam scales up to whole updates).
            groups = 2 if channels == 4 else 1
            blocks.append({"block": "GroupNorm", "in": channels, "groups": groups})
        elif choice in ("act", "gn"):
            blocks.append({"block": "act", "act": r.choice(ACTIVATIONS)})
        elif choice == "pool":
            blocks.append({"block": f"{r.choice(('Max', 'Avg'))}Pool{rank}d", "kernel": 2})
            pooled = True
        else:
            blocks.append({"block": f"ResidualConv{rank}d", "in": channels, "act": r.choice(ACTIVATIONS)})
    return blocks


def _vec_blocks(r: random.Random, width: int, count: int, train_bn: bool) -> tuple[list[dict[str, Any]], int]:
    blocks: list[dict[str, Any]] = []
    for _ in range(count):
        choice = r.choice(("linear", "linear", "norm", "bn", "act", "dropout", "residual"))
        if choice == "linear":
            block = {"block": "Linear", "in": width, "out": r.choice((3, 4, 5))}
        elif choice == "norm" and width >= 3:
            block = {"block": "LayerNorm", "in": width}
        elif choice in ("bn", "norm"):
            block = {"block": "BatchNorm1d", "in": width, "train": train_bn}
        elif choice == "act":
            block = {"block": "act", "act": r.choice(ACTIVATIONS)}
        elif choice == "dropout":
            block = {"block": "Dropout"}
        else:
            block = {"block": "ResidualLinear", "in": width, "act": r.choice(ACTIVATIONS)}
        blocks.append(block)
        width = _out_width(block, width)
    return blocks, width


def draw(seed: int) -> dict[str, Any]:
    """The model, loss and optimizer of ``seed``: a JSON-able dict."""
    r = random.Random(seed)
    loss = r.choice(("cross_entropy", "mse_loss", "ctc_loss"))
    source = r.choice(("seq", "seq", "tokens", "img1d", "img2d", "vec"))
    if loss == "ctc_loss" and source in ("img2d", "vec"):
        source = "seq"
    train_bn = r.random() < 0.3
    blocks: list[dict[str, Any]] = []
    length = r.choice((4, 5))
    if source == "tokens":
        vocab, width = 7, r.choice((3, 4))
        padding = r.choice((None, 0, 2))
        blocks.append({"block": "Embedding", "vocab": vocab, "out": width, "padding_idx": padding})
        input_shape: list[int] = [BATCH, length]
        source = "seq"
    elif source == "seq":
        width = r.choice((2, 3))
        input_shape = [BATCH, length, width]
    elif source == "vec":
        width = r.choice((3, 4))
        input_shape = [BATCH, width]
    else:
        rank = 1 if source == "img1d" else 2
        channels = r.choice((1, 2))
        input_shape = [BATCH, channels, 6] if rank == 1 else [BATCH, channels, 5, 5]
        blocks += _image_blocks(r, channels, rank, r.randint(1, 3), train_bn)
        channels = next((b["out"] for b in reversed(blocks) if "out" in b), channels)
        if rank == 1 and (loss == "ctc_loss" or r.random() < 0.5):
            blocks.append({"block": "ToSeq"})  # [N, C, L] -> [N, L, C]
            width, source = channels, "seq"
        else:
            blocks.append({"block": "GlobalMean", "rank": rank})
            width, source = channels, "vec"
    if source == "seq":
        more, width = _seq_blocks(r, width, r.randint(1, 3))
        blocks += more
        if loss != "ctc_loss":
            blocks.append({"block": r.choice(("LastStep", "MeanSteps"))})
            source = "vec"
    if source == "vec":
        more, width = _vec_blocks(r, width, r.randint(0, 2), train_bn)
        blocks += more
    classes = 4 if loss == "ctc_loss" else r.choice((2, 3))
    blocks.append({"block": "Linear", "in": width, "out": classes})
    optimizer, kwargs = r.choice(OPTIMIZERS)
    train_mode = any(block.get("train") for block in blocks)
    return {
        "seed": seed,
        "input_shape": input_shape,
        "tokens": input_shape == [BATCH, length] and blocks[0]["block"] == "Embedding",
        "vocab": 7,
        "blocks": blocks,
        "classes": classes,
        "loss": loss,
        "optimizer": optimizer,
        "optimizer_kwargs": kwargs,
        "train_mode": train_mode,
        "perturb": r.random() < 0.5,  # norms' fresh ones / zeros made distinct, or kept equal (merged by exporters)
    }


def block_classes(spec: dict[str, Any]) -> list[str]:
    """The classes a model's table row counts it under: its blocks' kinds, its loss, its optimizer."""
    names = []
    for block in spec["blocks"]:
        name = block["block"]
        if name in ("LSTM", "RNN", "GRU"):
            name += " bi" if block["bidirectional"] else ""
        elif name == "Embedding":
            name += " padding_idx" if block["padding_idx"] is not None else ""
        elif name.startswith("BatchNorm"):
            name = "BatchNorm " + ("train" if block["train"] else "eval")
        elif name == "act":
            name = block["act"]
        elif "act" in block:  # a residual block's activation
            names.append(block["act"])
        names.append(name)
    return sorted(set(names))


# ---- torch (the train environment only) ----------------------------------------------------------


def _activation(name: str) -> Any:
    from torch import nn

    if name == "GELU_tanh":
        return nn.GELU(approximate="tanh")
    return getattr(nn, name)()


def _module(block: dict[str, Any]) -> Any:
    import torch
    from torch import nn

    kind = block["block"]

    class Lambda(nn.Module):
        def __init__(self, function: Any, **children: Any) -> None:
            super().__init__()
            self.function = function
            for name, child in children.items():
                self.add_module(name, child)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.function(self, x)

    if kind in ("LSTM", "RNN", "GRU"):
        options = {"num_layers": block["layers"], "bidirectional": block["bidirectional"],
                   "batch_first": block["batch_first"]}
        if kind == "RNN":
            options["nonlinearity"] = block["nonlinearity"]
        rnn = getattr(nn, kind)(block["in"], block["hidden"], **options)
        if block["batch_first"]:
            return Lambda(lambda self, x: self.rnn(x)[0], rnn=rnn)
        return Lambda(lambda self, x: self.rnn(x.transpose(0, 1))[0].transpose(0, 1), rnn=rnn)
    if kind == "Linear":
        return nn.Linear(block["in"], block["out"])
    if kind == "LayerNorm":
        return nn.LayerNorm(block["in"])
    if kind == "act":
        return _activation(block["act"])
    if kind == "Dropout":
        return nn.Dropout(0.0)
    if kind == "ResidualLinear":
        return Lambda(lambda self, x: x + self.act(self.fc(x)), fc=nn.Linear(block["in"], block["in"]),
                      act=_activation(block["act"]))
    if kind == "SeqConv1d":
        conv = nn.Conv1d(block["in"], block["out"], block["kernel"], padding=block["kernel"] // 2)
        return Lambda(lambda self, x: self.conv(x.transpose(1, 2)).transpose(1, 2), conv=conv)
    if kind in ("Conv1d", "Conv2d"):
        return getattr(nn, kind)(block["in"], block["out"], block["kernel"], padding=block["padding"],
                                 bias=block["bias"])
    if kind.startswith("BatchNorm"):
        norm = getattr(nn, kind)(block["in"])
        with torch.no_grad():  # running statistics of a model trained before (eval mode reads them)
            norm.running_mean.uniform_(-0.3, 0.3)
            norm.running_var.uniform_(0.5, 1.5)
        return norm
    if kind == "GroupNorm":
        return nn.GroupNorm(block["groups"], block["in"])
    if kind[:3] in ("Max", "Avg"):
        return getattr(nn, kind)(block["kernel"])
    if kind.startswith("ResidualConv"):
        conv = getattr(nn, f"Conv{kind[-2:]}")(block["in"], block["in"], 3, padding=1)
        return Lambda(lambda self, x: x + self.act(self.conv(x)), conv=conv, act=_activation(block["act"]))
    if kind == "Embedding":
        embedding = nn.Embedding(block["vocab"], block["out"], padding_idx=block["padding_idx"])
        if block["padding_idx"] is not None:
            with torch.no_grad():  # a loaded model's padding row need not be zero
                embedding.weight[block["padding_idx"]].uniform_(-0.5, 0.5)
        return embedding
    if kind == "ToSeq":
        return Lambda(lambda self, x: x.transpose(1, 2))
    if kind == "GlobalMean":
        return Lambda(lambda self, x: x.mean(dim=tuple(range(2, 2 + block["rank"]))))
    if kind == "LastStep":
        return Lambda(lambda self, x: x[:, -1])
    if kind == "MeanSteps":
        return Lambda(lambda self, x: x.mean(dim=1))
    raise ValueError(f"unknown block {kind!r}")


def build(spec: dict[str, Any]) -> Any:
    """The torch model of ``spec``, seeded, in the mode it is exported and trained in."""
    import torch
    from torch import nn

    torch.manual_seed(spec["seed"])
    model = nn.Sequential(*[_module(block) for block in spec["blocks"]])
    if spec["perturb"]:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
                    module.weight.add_(0.2 * torch.randn_like(module.weight))
                    module.bias.add_(0.2 * torch.randn_like(module.bias))
    model.train(spec["train_mode"])
    return model


def batches(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """``STEPS + 1`` batches (the first for the forward check and the export) as NumPy arrays."""
    import numpy as np

    rng = np.random.default_rng(spec["seed"] + 1000)
    result = []
    for _ in range(STEPS + 1):
        if spec["tokens"]:
            x = rng.integers(0, spec["vocab"], spec["input_shape"]).astype(np.int64)
        else:
            x = rng.normal(size=spec["input_shape"]).astype(np.float32)
        batch: dict[str, Any] = {"x": x}
        if spec["loss"] == "cross_entropy":
            batch["target"] = rng.integers(0, spec["classes"], BATCH).astype(np.int64)
        elif spec["loss"] == "mse_loss":
            batch["target"] = rng.normal(size=(BATCH, spec["classes"])).astype(np.float32)
        else:
            lengths = rng.integers(1, 3, BATCH).astype(np.int64)
            labels = np.zeros((BATCH, 2), np.int64)
            for row, count in enumerate(lengths):
                labels[row, :count] = rng.integers(1, spec["classes"], count)
            batch["target"], batch["target_lengths"] = labels, lengths
        result.append(batch)
    return result
