"""Records a small CRNN trained with torch.nn.functional.ctc_loss, for the torch-free CTC parity test.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_crnn_ctc.py

The model reads a text-line image as OCR recognizers do: Conv2d, ReLU, MaxPool2d, the columns
made a sequence, a bidirectional LSTM, a Linear over the classes (blank 0 among them) and
log_softmax, i.e. log-probabilities (T, N, C) as ctc_loss takes them. For each exporter (dynamo,
optimized or not, and TorchScript) it exports the model, trains a copy with Adam for ``STEPS``
steps on random label sequences of random lengths (padded targets; input_lengths all T on even
steps, random on odd ones) and writes
``crnn_ctc/<exporter>.npz`` in the format of record_training.py (model, config, batches, losses,
every trained initializer after every step). tests/test_crnn_ctc_parity.py replays it without
torch. Seeded; a file whose arrays did not change is left as it is.
"""

from __future__ import annotations

import copy
import json
import pathlib
import sys
import tempfile

import numpy as np
import onnx

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from record_training import write_unless_unchanged  # noqa: E402
from torch_scenarios import pair_initializers  # noqa: E402

SEED = 20261126
STEPS = 10
OUTPUT_DIR = HERE / "crnn_ctc"
# Sizes: small and odd. A 9 x 14 one-channel image -> conv 3 channels -> max-pool 2 -> 4 x 7, so T = 7
# steps of 3 * 4 = 12 features; bidirectional LSTM of 5; 6 classes with blank 0.
HEIGHT, WIDTH, CHANNELS, HIDDEN_SIZE, CLASSES = 9, 14, 3, 5, 6
BATCH, MAX_TARGET = 4, 3
STEPS_T = WIDTH // 2
OPTIMIZER = {"name": "Adam", "kwargs": {"lr": 0.01}}
EXPORTERS = ("dynamo", "dynamo_unoptimized", "torchscript")


class Crnn(torch.nn.Module):
    """Conv2d + ReLU + MaxPool2d, columns as steps, bidirectional LSTM, Linear, log_softmax: (T, N, C)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, CHANNELS, kernel_size=3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.lstm = torch.nn.LSTM(CHANNELS * (HEIGHT // 2), HIDDEN_SIZE, bidirectional=True)
        self.head = torch.nn.Linear(2 * HIDDEN_SIZE, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.pool(torch.relu(self.conv(x)))  # [N, C', H', W']
        batch, channels, height, width = features.shape
        sequence = features.permute(3, 0, 1, 2).reshape(width, batch, channels * height)  # [T = W', N, C' * H']
        y, _ = self.lstm(sequence)
        return torch.log_softmax(self.head(y), dim=2)


def make_batch(rng: np.random.Generator, step: int) -> dict[str, np.ndarray]:
    """An image batch, padded labels in [1, C) of random lengths 1..MAX_TARGET, and the lengths."""
    target_lengths = rng.integers(1, MAX_TARGET + 1, BATCH)
    targets = np.zeros((BATCH, MAX_TARGET), np.int64)
    for row, length in enumerate(target_lengths):
        targets[row, :length] = rng.integers(1, CLASSES, length)
    input_lengths = np.full(BATCH, STEPS_T) if step % 2 == 0 else rng.integers(2 * MAX_TARGET, STEPS_T + 1, BATCH)
    return {
        "x": rng.normal(size=(BATCH, 1, HEIGHT, WIDTH)).astype(np.float32),
        "targets": targets,
        "input_lengths": input_lengths.astype(np.int64),
        "target_lengths": target_lengths.astype(np.int64),
    }


def export(
    net: torch.nn.Module, exporter: str, x: np.ndarray, path: pathlib.Path, output_name: str = "log_probs"
) -> onnx.ModelProto:
    """Exports ``net`` (one input ``x``, one output) with one of ``EXPORTERS`` (record_conv_transpose.py's too)."""
    torch.onnx.export(
        net,
        (torch.from_numpy(x),),
        str(path),
        input_names=["x"],
        output_names=[output_name],
        dynamo=exporter != "torchscript",
        **({"optimize": False} if exporter == "dynamo_unoptimized" else {}),
    )
    return onnx.load(str(path))


def record(exporter: str) -> dict[str, np.ndarray]:
    """Trains the CRNN in torch; returns the arrays of the exporter's .npz file."""
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    exported_net = Crnn()
    net = copy.deepcopy(exported_net)
    with tempfile.TemporaryDirectory() as directory:
        model = export(exported_net, exporter, make_batch(rng, 0)["x"], pathlib.Path(directory) / "model.onnx")
    pairs = pair_initializers(model, net)
    trainable = list(pairs)
    optimizer = torch.optim.Adam(net.parameters(), **OPTIMIZER["kwargs"], foreach=False)
    arrays: dict[str, np.ndarray] = {"model": np.frombuffer(model.SerializeToString(), dtype=np.uint8)}
    losses = []
    trajectories: dict[str, list[np.ndarray]] = {name: [] for name in trainable}
    for step in range(STEPS):
        batch = make_batch(rng, step)
        for key, value in batch.items():
            arrays[f"batch/{step}/{key}"] = value
        optimizer.zero_grad()
        log_probs = net(torch.from_numpy(batch["x"]))
        loss = torch.nn.functional.ctc_loss(
            log_probs,
            torch.from_numpy(batch["targets"]),
            torch.from_numpy(batch["input_lengths"]),
            torch.from_numpy(batch["target_lengths"]),
        )
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        for name in trainable:
            trajectories[name].append(pairs[name].value(net))
    arrays["losses"] = np.asarray(losses, dtype=np.float64)
    for name, values in trajectories.items():
        arrays[f"param/{name}"] = np.stack(values)
    config = {
        "exporter": exporter,
        "optimizer": OPTIMIZER,
        "loss": {"kind": "ctc_loss", "blank": 0, "reduction": "mean", "zero_infinity": False},
        "steps": STEPS,
        "trainable": trainable,
        "sources": {name: pairs[name].description for name in pairs},
        "time_steps": STEPS_T,
        "torch": torch.__version__,
    }
    arrays["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    return arrays


def main() -> None:
    OUTPUT_DIR.mkdir(exist_ok=True)
    for exporter in EXPORTERS:
        write_unless_unchanged(OUTPUT_DIR / f"{exporter}.npz", record(exporter))


if __name__ == "__main__":
    main()
