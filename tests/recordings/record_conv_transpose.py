"""Records a small ConvTranspose1d/2d upsampler trained in torch, for the torch-free ConvTranspose parity test.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_conv_transpose.py

The model upsamples as speech-enhancement decoders do (DeepFilterNet's ConvTranspose2d over
frequency, NSNet-like 1-D upsampling): ConvTranspose1d (stride 2, padding, output_padding), tanh,
the result and its square as two channels of an image, then a grouped ConvTranspose2d (stride,
padding, output_padding and dilation differing per axis). For each exporter (dynamo, optimized or
not, and TorchScript) it exports the model, trains a copy with Adam for ``STEPS`` steps of mse_loss
on random batches and writes ``conv_transpose/<exporter>.npz`` in the format of record_training.py
(model, config, batches, losses, every trained initializer after every step).
tests/test_conv_transpose_parity.py replays it without torch. Seeded; a file whose arrays did not
change is left as it is.
"""

from __future__ import annotations

import copy
import json
import pathlib
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from record_crnn_ctc import EXPORTERS, export  # noqa: E402
from record_training import write_unless_unchanged  # noqa: E402
from torch_scenarios import pair_initializers  # noqa: E402

SEED = 20261127
STEPS = 3
OUTPUT_DIR = HERE / "conv_transpose"
BATCH, CHANNELS, LENGTH = 3, 2, 5
OPTIMIZER = {"name": "Adam", "kwargs": {"lr": 0.01}}


class Upsampler(torch.nn.Module):
    """ConvTranspose1d, tanh, [h, h^2] as an image, grouped ConvTranspose2d: [N, 2, 5] -> [N, 4, 5, 22]."""

    def __init__(self) -> None:
        super().__init__()
        self.up1 = torch.nn.ConvTranspose1d(CHANNELS, 3, kernel_size=4, stride=2, padding=1, output_padding=1)
        self.up2 = torch.nn.ConvTranspose2d(
            2, 4, kernel_size=(2, 3), stride=(1, 2), padding=(0, 1), output_padding=(0, 1), groups=2, dilation=(2, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, 2, 5] -> [N, 4, 5, 22]: the 1-D upsampling, then the 2-D one over [h, h^2]."""
        h = torch.tanh(self.up1(x)).unsqueeze(1)  # [N, 1, 3, 11]
        return self.up2(torch.cat([h, h * h], dim=1))


def make_batch(rng: np.random.Generator, net: Upsampler) -> dict[str, np.ndarray]:
    x = rng.normal(size=(BATCH, CHANNELS, LENGTH)).astype(np.float32)
    with torch.no_grad():
        shape = net(torch.from_numpy(x)).shape
    return {"x": x, "target": rng.normal(size=tuple(shape)).astype(np.float32)}


def record(exporter: str) -> dict[str, np.ndarray]:
    """Trains the upsampler in torch; returns the arrays of the exporter's .npz file."""
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    exported_net = Upsampler()
    net = copy.deepcopy(exported_net)
    batches = [make_batch(rng, net) for _ in range(STEPS)]
    with tempfile.TemporaryDirectory() as directory:
        model = export(exported_net, exporter, batches[0]["x"], pathlib.Path(directory) / "model.onnx", "y")
    pairs = pair_initializers(model, net)
    trainable = list(pairs)
    optimizer = torch.optim.Adam(net.parameters(), **OPTIMIZER["kwargs"], foreach=False)
    arrays: dict[str, np.ndarray] = {"model": np.frombuffer(model.SerializeToString(), dtype=np.uint8)}
    losses = []
    trajectories: dict[str, list[np.ndarray]] = {name: [] for name in trainable}
    for step, batch in enumerate(batches):
        for key, value in batch.items():
            arrays[f"batch/{step}/{key}"] = value
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(torch.from_numpy(batch["x"])), torch.from_numpy(batch["target"]))
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
        "loss": "mse",
        "target": "target",
        "steps": STEPS,
        "trainable": trainable,
        "sources": {name: pairs[name].description for name in pairs},
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
