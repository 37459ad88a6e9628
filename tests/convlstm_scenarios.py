"""ConvLSTM models and data for the trajectory recorder (tests/recordings/record_training.py).

The classic ConvLSTM cell (Shi et al. 2015, without peepholes): one Conv2d over the channel
concatenation ``[x_t, h_{t-1}]`` makes the 4*hidden gate channels, split into i, f, g, o;
``c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)``, ``h_t = sigmoid(o) * tanh(c_t)``, a Python
loop over the steps, a zero initial state. Heads: a 1x1 Conv2d per pixel on the last hidden state
(mse against a per-pixel target) or the mean of the last hidden state over H, W and a Linear
(cross_entropy). The same interface as tests/torch_scenarios.py (``Net``, ``make_batch``,
``model_inputs``, ``torch_loss``, ``export``), so the recorder treats both alike; the pairing of
initializers with torch parameters is torch_scenarios'. Imports torch: only for environments
that have it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import torch

# Small, odd, no two alike (pairing matches initializers by value and shape).
BATCH = 3
MAX_DYNAMIC_BATCH = 4  # a dynamic-batch scenario draws each batch's size from 1..4
SEQ_LENGTH = 4
CHANNELS = 2
HEIGHT = 6
WIDTH = 7
HIDDEN = 5
KERNEL = 3
TARGET_CHANNELS = 2  # the per-pixel head's outputs
CLASSES = 3  # the pooled head's classes


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One ConvLSTM model and its loss: ``head`` "pixels" (mse) or "pooled" (cross_entropy).

    With ``dynamic_batch`` the export's batch axis is dynamic and every batch has its own size
    (TorchScript then writes the zero state as ConstantOfShape, dynamo as an Expand of a 0-D
    zero); with static shapes both write it as a zero tensor of the state's full shape.
    """

    name: str
    head: str
    dynamic_batch: bool = False

    @property
    def loss(self) -> str:
        """The recording's loss name (tests/test_train_step_parity.py's LOSSES)."""
        return "mse" if self.head == "pixels" else "cross_entropy"

    @property
    def frozen(self) -> tuple[str, ...]:
        """Torch parameters not trained: none."""
        return ()


SCENARIOS = [
    Scenario("convlstm_pixels_mse_dynamic_batch", head="pixels", dynamic_batch=True),
    Scenario("convlstm_pooled_ce_dynamic_batch", head="pooled", dynamic_batch=True),
    Scenario("convlstm_pooled_ce", head="pooled"),
]


class ConvLstmCell(torch.nn.Module):
    """One step: ``[x_t, h_{t-1}]`` -> Conv2d -> split into i, f, g, o -> (h_t, c_t)."""

    def __init__(self, channels: int, hidden: int, kernel: int = KERNEL) -> None:
        super().__init__()
        self.hidden = hidden
        self.conv = torch.nn.Conv2d(channels + hidden, 4 * hidden, kernel, padding=kernel // 2)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``c_t = f * c + i * g``, ``h_t = o * tanh(c_t)`` (i, f, o sigmoids, g a tanh)."""
        i, f, g, o = torch.split(self.conv(torch.cat([x, h], dim=1)), self.hidden, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class ConvLstm(torch.nn.Module):
    """A ConvLSTM layer over ``x [N, T, C, H, W]`` from a zero state; returns the last ``h [N, hidden, H, W]``."""

    def __init__(self, channels: int, hidden: int, kernel: int = KERNEL) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = ConvLstmCell(channels, hidden, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, _, height, width = x.shape
        h = torch.zeros(batch, self.hidden, height, width, dtype=x.dtype)
        c = torch.zeros(batch, self.hidden, height, width, dtype=x.dtype)
        for t in range(steps):
            h, c = self.cell(x[:, t], h, c)
        return h


class Net(torch.nn.Module):
    """ConvLSTM layer and the scenario's head."""

    def __init__(self, scenario: Scenario) -> None:
        super().__init__()
        self.convlstm = ConvLstm(CHANNELS, HIDDEN)
        self.pooled = scenario.head == "pooled"
        if self.pooled:
            self.head: torch.nn.Module = torch.nn.Linear(HIDDEN, CLASSES)
        else:
            self.head = torch.nn.Conv2d(HIDDEN, TARGET_CHANNELS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Per-pixel predictions ``[N, 2, H, W]`` or logits ``[N, 3]`` from the mean over H, W."""
        h = self.convlstm(x)
        return self.head(h.mean(dim=(2, 3))) if self.pooled else self.head(h)


def make_batch(scenario: Scenario, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``x [N, T, C, H, W]`` and the loss's labels / target, keyed by their ONNX input names."""
    size = int(rng.integers(1, MAX_DYNAMIC_BATCH + 1)) if scenario.dynamic_batch else BATCH
    batch = {"x": rng.standard_normal((size, SEQ_LENGTH, CHANNELS, HEIGHT, WIDTH)).astype(np.float32)}
    if scenario.head == "pooled":
        batch["labels"] = rng.integers(0, CLASSES, size, dtype=np.int64)
    else:
        batch["target"] = rng.standard_normal((size, TARGET_CHANNELS, HEIGHT, WIDTH)).astype(np.float32)
    return batch


def model_inputs(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's inputs of a batch (the rest is the loss's)."""
    return {name: value for name, value in batch.items() if name == "x"}


def torch_loss(net: Net, batch: dict[str, np.ndarray]) -> torch.Tensor:
    """The scenario's loss of ``net`` on ``batch``, torch's defaults."""
    out = net(torch.from_numpy(batch["x"]))
    if "labels" in batch:
        return torch.nn.functional.cross_entropy(out, torch.from_numpy(batch["labels"]))
    return torch.nn.functional.mse_loss(out, torch.from_numpy(batch["target"]))


def export(
    net: Net, scenario: Scenario, exporter: str, batch: dict[str, np.ndarray], path: Path, *, optimize: bool = True
) -> onnx.ModelProto:
    """Exports with the "dynamo" or "torchscript" exporter (``optimize`` applies to dynamo)."""
    kwargs: dict = {"dynamo": exporter == "dynamo"}
    if exporter == "dynamo" and not optimize:
        kwargs["optimize"] = False
    if scenario.dynamic_batch and exporter == "dynamo":
        kwargs["dynamic_shapes"] = {"x": {0: torch.export.Dim("batch")}}
    elif scenario.dynamic_batch:
        kwargs["dynamic_axes"] = {"x": {0: "batch"}}
    torch.onnx.export(
        net, (torch.from_numpy(batch["x"]),), str(path), input_names=["x"], output_names=["logits"], **kwargs
    )
    return onnx.load(str(path))
