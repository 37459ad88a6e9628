"""Records what torch's exporters fold away, and torch's training of each model (issue 31).

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_folds.py

Four minimal models, each exported three ways (``dynamo``: torch.onnx.export's default,
optimize=True; ``dynamo_unoptimized``: optimize=False; ``torchscript``: dynamo=False), written as
``tests/data/folds/<case>-<exporter>.onnx``; and for each case and optimizer the batches of
``STEPS`` steps with torch's loss and every parameter after every step, by torch name, as
``folds/<case>-<optimizer>.npz`` next to this file (the same run serves the three exports):

- ``rnn_fold``: ``nn.RNN(batch_first)`` -> last step -> ``Linear``, static batch: dynamo's optimizer
  unrolls the RNN and folds step 0's ``h0 @ W_hh^T + b_hh`` into one initializer;
- ``embedding_pad``: ``nn.Embedding(padding_idx=0)`` (its padding row set non-zero, as a loaded
  model may have it) -> mean -> ``Linear``: the export is a plain Gather;
- ``conv_bn``: ``Conv2d`` -> ``BatchNorm2d`` (eval mode: running statistics) -> mean -> ``Linear``:
  TorchScript and dynamo's optimizer fold the BatchNorm into the Conv;
- ``merged_norms``: two fresh ``LayerNorm(4)`` (equal weights and biases): dynamo's optimizer
  merges them into one tensor, TorchScript writes ``Identity(a) -> b``;
- ``tied_embedding``: an ``Embedding`` whose table is the output ``Linear``'s weight (one
  parameter): TorchScript folds ``W^T`` into an initializer of its own, dynamo's optimizer too;
- ``lstm_state``: an ``nn.LSTM`` whose initial state is a parameter expanded to the batch: with a
  static batch, dynamo's optimizer folds the expanded state into a ``[1, N, H]`` tensor.

Seeded: a rerun with the same torch writes the same arrays.
"""

from __future__ import annotations

import json
import pathlib
import warnings

import numpy as np
import torch
from torch import nn

HERE = pathlib.Path(__file__).resolve().parent
MODELS = HERE.parent / "data" / "folds"
OUTPUT = HERE / "folds"
STEPS = 3
BATCH = 2
EXPORTERS = ("dynamo", "dynamo_unoptimized", "torchscript")


class RnnLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(3, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class EmbeddingPad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 4, padding_idx=0)
        with torch.no_grad():
            self.emb.weight[0] = torch.tensor([0.5, -0.25, 0.75, 1.0])
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x).mean(dim=1))


class ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.tensor([0.1, -0.2]))
            self.bn.running_var.copy_(torch.tensor([0.8, 1.3]))
        self.head = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class MergedNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.ln1 = nn.LayerNorm(4)
        self.fc2 = nn.Linear(4, 4)
        self.ln2 = nn.LayerNorm(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln2(self.fc2(torch.tanh(self.ln1(self.fc1(x))))))


def batch(case: str, generator: torch.Generator) -> torch.Tensor:
    if case in ("rnn_fold", "lstm_state"):
        return torch.randn(BATCH, 5, 3, generator=generator)
    if case == "tied_embedding":
        return torch.randint(0, 6, (BATCH, 3), generator=generator)
    if case == "embedding_pad":
        tokens = torch.randint(1, 6, (BATCH, 4), generator=generator)
        tokens[:, -1] = 0  # padding at the end of every sequence, and once in the middle
        tokens[0, 1] = 0
        return tokens
    if case == "conv_bn":
        return torch.randn(BATCH, 1, 5, 5, generator=generator)
    return torch.randn(BATCH, 4, generator=generator)


class TiedEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight
        self.out = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.head(self.emb(x)).mean(dim=1))


class LstmState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)
        self.head = nn.Linear(4, 2)
        self.h0 = nn.Parameter(0.3 * torch.randn(1, 1, 4))
        self.c0 = nn.Parameter(0.3 * torch.randn(1, 1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = (self.h0.expand(-1, x.shape[0], -1), self.c0.expand(-1, x.shape[0], -1))
        out, _ = self.lstm(x, state)
        return self.head(out[:, -1])


CASES = {
    "rnn_fold": RnnLast,
    "embedding_pad": EmbeddingPad,
    "conv_bn": ConvBn,
    "merged_norms": MergedNorms,
    "tied_embedding": TiedEmbedding,
    "lstm_state": LstmState,
}
OPTIMIZERS = {
    "Adam": ("Adam", {"lr": 0.05}),
    "SGD": ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}),
    "AdamW": ("AdamW", {"lr": 0.05, "weight_decay": 0.1}),
}
RECORDED = {
    "rnn_fold": ("Adam", "SGD"),
    "embedding_pad": ("Adam", "SGD", "AdamW"),
    "conv_bn": ("Adam",),
    "merged_norms": ("Adam",),
    "tied_embedding": ("SGD",),
    "lstm_state": ("Adam",),
}


def fresh(case: str) -> nn.Module:
    torch.manual_seed(0)
    model = CASES[case]()
    model.eval()  # the exported forward: BatchNorm on running statistics
    return model


def export(case: str, exporter: str) -> None:
    model = fresh(case)
    example = batch(case, torch.Generator().manual_seed(1))
    path = MODELS / f"{case}-{exporter}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, (example,), str(path), dynamo=False, input_names=["x"], output_names=["y"])
        else:
            program = torch.onnx.export(
                model, (example,), dynamo=True, input_names=["x"], output_names=["y"],
                optimize=exporter == "dynamo",
            )
            program.save(str(path))


def record(case: str, optimizer: str) -> None:
    model = fresh(case)
    name, kwargs = OPTIMIZERS[optimizer]
    torch_optimizer = getattr(torch.optim, name)(model.parameters(), **kwargs)
    generator = torch.Generator().manual_seed(2)
    arrays: dict[str, np.ndarray] = {}
    for name_, value in model.named_parameters():
        arrays[f"param/{name_}/initial"] = value.detach().numpy().copy()
    for step in range(STEPS):
        x = batch(case, generator)
        target = torch.randn(BATCH, 2, generator=generator)
        torch_optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        torch_optimizer.step()
        arrays[f"batch/{step}/x"] = x.numpy()
        arrays[f"target/{step}"] = target.numpy()
        arrays[f"loss/{step}"] = np.asarray(loss.item(), dtype=np.float32)
        for name_, value in model.named_parameters():
            arrays[f"param/{name_}/{step}"] = value.detach().numpy().copy()
    config = {"optimizer": OPTIMIZERS[optimizer][0], "kwargs": OPTIMIZERS[optimizer][1], "loss": "mse_loss"}
    arrays["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    np.savez_compressed(OUTPUT / f"{case}-{optimizer}.npz", **arrays)


def main() -> None:
    MODELS.mkdir(parents=True, exist_ok=True)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        for exporter in EXPORTERS:
            export(case, exporter)
        for optimizer in RECORDED[case]:
            record(case, optimizer)


if __name__ == "__main__":
    main()
