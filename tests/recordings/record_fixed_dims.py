"""Records the exports of tests/test_fixed_dims.py: torch.onnx.export's defaults fix the batch (and length).

Run in the train env (torch 2.13): ``.venvs/train/bin/python tests/recordings/record_fixed_dims.py``.
Each module is exported twice with the same weights: with the defaults (``<name>_fixed.onnx``, the
example's batch of 8 and length of 6 in the graph) and with the batch and length dynamic
(``<name>_dynamic.onnx``), the oracle a fixed export freed by ``prepare`` must train like.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
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


class RecurrentTimeMajor(torch.nn.Module):
    """nn.LSTM of torch's default layout, x [T, N, F], and a linear head on the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(FEATURES, 3)
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.fc(y[-1])


class TimeDistributed(torch.nn.Module):
    """A linear layer per step through x.reshape(B * T, F): the batch merged with the length."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, features = x.shape
        return self.fc(x.reshape(batch * length, features)).reshape(batch, length, 3).mean(dim=1)


class TimeMajorFlat(torch.nn.Module):
    """crnn.pytorch's head: time-major steps flattened as x.view(T * B, F), a Linear, and back (T, B, -1)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.transpose(0, 1)
        length, batch, features = steps.shape
        return self.fc(steps.reshape(length * batch, features)).view(length, batch, -1).mean(dim=0)


class CrnnHead(torch.nn.Module):
    """crnn.pytorch's BidirectionalLSTM: x [T, B, F], recurrent.view(T * b, h), a Linear, .view(T, b, -1)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(FEATURES, 3, bidirectional=True)
        self.embedding = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        recurrent, _ = self.rnn(x)
        length, batch, hidden = recurrent.size()
        output = self.embedding(recurrent.view(length * batch, hidden))
        return output.view(length, batch, -1).mean(0)


class LearnedState(Recurrent):
    """nn.LSTM from a trained initial state expanded to the batch: dynamo folds the expansion to [1, 8, H]."""

    def __init__(self) -> None:
        super().__init__()
        self.h0 = torch.nn.Parameter(torch.zeros(1, 1, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = self.h0.expand(1, x.shape[0], 3).contiguous()
        y, _ = self.rnn(x, (h0, torch.zeros_like(h0)))
        return self.fc(y[:, -1])


class ConstantFeature(torch.nn.Module):
    """nn.LSTM, then a constant feature per sample concatenated to the last step: dynamo writes ones [8, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(FEATURES, 3, batch_first=True)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.fc(torch.cat([y[:, -1], torch.ones(x.shape[0], 1)], dim=1))


def export(
    model: torch.nn.Module, example: torch.Tensor, path: Path, dynamo: bool, axes: dict[int, str] | None
) -> None:
    """torch.onnx.export with its defaults, or with ``axes`` (axis -> name) dynamic."""
    if dynamo:
        shapes = None if axes is None else {"x": {axis: torch.export.Dim(name) for axis, name in axes.items()}}
        torch.onnx.export(model, (example,), path, dynamic_shapes=shapes)
    else:
        torch.onnx.export(model, (example,), path, dynamo=False, input_names=["x"], dynamic_axes=axes and {"x": axes})


def main() -> None:
    warnings.filterwarnings("ignore")
    OUT.mkdir(parents=True, exist_ok=True)
    batch_first = torch.randn(BATCH, LENGTH, FEATURES)
    time_major = batch_first.transpose(0, 1).contiguous()
    both, batch = {0: "batch", 1: "seq_len"}, {0: "batch"}  # a Linear over the steps fixes the length
    # name, module, dynamo, example, write the default export, the dynamic axes of its twin (None: no twin);
    # dynamo specializes an LSTM's length even when asked for a dynamic one: TorchScript's twin is the oracle.
    for name, module, dynamo, example, fixed, dynamic in (
        ("lstm_dynamo", Recurrent, True, batch_first, True, None),
        ("lstm_torchscript", Recurrent, False, batch_first, True, both),
        ("flat_dynamo", Flat, True, batch_first, True, batch),
        ("conv_dynamo", Convolutional, True, batch_first, True, batch),
        ("lstm_flat_dynamo", RecurrentFlat, True, batch_first, True, None),
        ("time_distributed_dynamo", TimeDistributed, True, batch_first, True, batch),
        ("time_major_flat_dynamo", TimeMajorFlat, True, batch_first, True, batch),
        ("learned_state_dynamo", LearnedState, True, batch_first, True, None),
        ("constant_feature_dynamo", ConstantFeature, True, batch_first, True, None),
        ("crnn_head_dynamo", CrnnHead, True, time_major, True, None),
        ("crnn_head_torchscript", CrnnHead, False, time_major, False, {0: "seq_len", 1: "batch"}),
        ("lstm_time_major_dynamo", RecurrentTimeMajor, True, time_major, True, None),
        ("lstm_time_major_torchscript", RecurrentTimeMajor, False, time_major, False, {0: "seq_len", 1: "batch"}),
    ):
        torch.manual_seed(0)
        model = module().eval()
        if fixed:
            export(model, example, OUT / f"{name}_fixed.onnx", dynamo, None)
        if dynamic is not None:
            export(model, example, OUT / f"{name}_dynamic.onnx", dynamo, dynamic)
    for data in OUT.glob("*.onnx.data"):  # dynamo writes external data, often none: each model is one file
        model_path = data.with_suffix("")
        if data.stat().st_size:
            onnx.save(onnx.load(str(model_path)), str(model_path))  # the tensors back inside the model
        data.unlink()


if __name__ == "__main__":
    main()
