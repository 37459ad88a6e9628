"""Records the exports of tests/test_fixed_dims.py: torch.onnx.export's defaults fix the batch (and length).

Run in the train env (torch 2.13): ``.venvs/train/bin/python tests/recordings/record_fixed_dims.py``.
Each module is exported twice with the same weights: with the defaults (``<name>_fixed.onnx``, the
example's batch of 8 and length of 6 in the graph) and with the batch and length dynamic
(``<name>_dynamic.onnx``), the oracle a fixed export freed by ``prepare`` must train like. (dynamo
specializes an LSTM's length even when asked for a dynamic one: the TorchScript export is the
oracle with a dynamic length.)
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "data" / "fixed_dims"
BATCH, LENGTH, FEATURES = 8, 6, 2


class Recurrent(torch.nn.Module):
    """nn.LSTM (batch_first) and a linear head on the last step: a sequence classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(FEATURES, 3, batch_first=True)
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


class Flat(torch.nn.Module):
    """x.view(x.shape[0], -1) then nn.Linear: dynamo writes the batch into the Reshape's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(LENGTH * FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.view(x.shape[0], -1))


class Convolutional(torch.nn.Module):
    """nn.Conv1d over the steps, ReLU, flatten(1), nn.Linear: dynamo's flatten is a Reshape to [8, 8]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(FEATURES, 2, 3)
        self.fc = torch.nn.Linear(2 * (LENGTH - 2), 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x.transpose(1, 2))).flatten(1))


class RecurrentFlat(torch.nn.Module):
    """nn.LSTM then a linear head over every step (y.reshape(B, -1)): the head's weights fix the length."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(FEATURES, 3, batch_first=True)
        self.fc = torch.nn.Linear(LENGTH * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.fc(y.reshape(y.shape[0], -1))


class TimeDistributed(torch.nn.Module):
    """A linear layer per step through x.reshape(B * T, F): the batch merged with the length."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, features = x.shape
        return self.fc(x.reshape(batch * length, features)).reshape(batch, length, 3).mean(dim=1)


def main() -> None:
    warnings.filterwarnings("ignore")
    OUT.mkdir(parents=True, exist_ok=True)
    x = torch.randn(BATCH, LENGTH, FEATURES)
    dims = {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq_len", min=2)}}
    for name, module, dynamo in (
        ("lstm_dynamo", Recurrent, True),
        ("lstm_torchscript", Recurrent, False),
        ("flat_dynamo", Flat, True),
        ("conv_dynamo", Convolutional, True),
        ("lstm_flat_dynamo", RecurrentFlat, True),
        ("time_distributed_dynamo", TimeDistributed, True),
    ):
        torch.manual_seed(0)
        model = module().eval()
        fixed = OUT / f"{name}_fixed.onnx"
        if dynamo:
            torch.onnx.export(model, (x,), fixed)
        else:
            torch.onnx.export(model, (x,), fixed, dynamo=False, input_names=["x"])
        if name in ("lstm_dynamo", "lstm_flat_dynamo", "time_distributed_dynamo"):
            continue  # the TorchScript export is the LSTM's oracle; the others' refusals are tested
        dynamic = OUT / f"{name}_dynamic.onnx"
        if module in (Flat, Convolutional):  # their Linear fixes the length
            dims_of = {"x": {0: torch.export.Dim("batch")}}
        else:
            dims_of = dims
        if dynamo:
            torch.onnx.export(model, (x,), dynamic, dynamic_shapes=dims_of)
        else:
            axes = {"x": {axis: dim.__name__ for axis, dim in dims_of["x"].items()}}
            torch.onnx.export(model, (x,), dynamic, dynamo=False, input_names=["x"], dynamic_axes=axes)
    for empty in OUT.glob("*.onnx.data"):  # dynamo writes an external-data file even when nothing is external
        if empty.stat().st_size == 0:
            empty.unlink()


if __name__ == "__main__":
    main()
