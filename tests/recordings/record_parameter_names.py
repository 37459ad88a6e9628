"""Records tests/data/lstm2_classifier_dynamo.onnx and .npz: the parameter-naming tests' torch export and values.

A 2-layer LSTM + Linear classifier (``lstm`` and ``head``, as torch users name their modules),
exported by torch.onnx.export's dynamo exporter with ``optimize=True``: the optimizer folds
each layer's ``weight_ih_l<k>`` / ``weight_hh_l<k>`` into ONNX W / R initializers named ``val_*``
and the two biases into one B, so the tests can name parameters by torch names that no
initializer carries. The .npz holds a batch, the model's logits before training, and the logits
after a few AdamW steps taken by torch with parameter groups (the LSTM's biases without weight
decay, the head at half the learning rate) and without them, so that a trainer given those
groups by torch names, globs and module prefixes can be checked against torch itself.

Run with the train environment (torch): ``.venvs/train/bin/python tests/recordings/record_parameter_names.py``.
"""

from __future__ import annotations

import copy
import pathlib
import tempfile

import numpy as np
import onnx
import torch

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
STEM = "lstm2_classifier_dynamo"
SEED = 5
BATCH, STEPS_IN_TIME, FEATURES, HIDDEN, CLASSES = 6, 4, 3, 5, 4
UPDATES = 3
LR, WEIGHT_DECAY, HEAD_LR_SCALE = 0.05, 0.1, 0.5


class Classifier(torch.nn.Module):
    """x [batch, time, features] -> 2-layer LSTM -> the last step's hidden state -> Linear -> logits."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(FEATURES, HIDDEN, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x)
        return self.head(y[:, -1])


def train(net: Classifier, x: torch.Tensor, labels: torch.Tensor, grouped: bool) -> np.ndarray:
    """The logits after ``UPDATES`` AdamW steps on (x, labels), with or without the parameter groups."""
    if grouped:
        biases = [p for name, p in net.named_parameters() if name.startswith("lstm.bias_")]
        weights = [p for name, p in net.named_parameters() if name.startswith("lstm.weight_")]
        groups = [
            {"params": biases, "weight_decay": 0.0},
            {"params": list(net.head.parameters()), "lr": LR * HEAD_LR_SCALE},
            {"params": weights},
        ]
    else:
        groups = [{"params": list(net.parameters())}]
    optimizer = torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY, foreach=False)
    for _ in range(UPDATES):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), labels).backward()
        optimizer.step()
    with torch.no_grad():
        return net(x).numpy()


def main() -> None:
    torch.manual_seed(SEED)
    net = Classifier()
    x = torch.randn(BATCH, STEPS_IN_TIME, FEATURES)
    labels = torch.randint(0, CLASSES, (BATCH,))
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory) / "model.onnx"
        torch.onnx.export(
            net, (x,), str(path), dynamo=True, optimize=True, input_names=["x"], output_names=["logits"]
        )
        model = onnx.load(str(path))
    with torch.no_grad():
        before = net(x).numpy()
    DATA.mkdir(exist_ok=True)
    onnx.save(model, str(DATA / f"{STEM}.onnx"))
    np.savez(
        DATA / f"{STEM}.npz",
        x=x.numpy(),
        labels=labels.numpy(),
        logits_before=before,
        logits_grouped=train(copy.deepcopy(net), x, labels, grouped=True),
        logits_ungrouped=train(copy.deepcopy(net), x, labels, grouped=False),
        hyperparameters=np.asarray([LR, WEIGHT_DECAY, HEAD_LR_SCALE, UPDATES]),
    )


if __name__ == "__main__":
    main()
