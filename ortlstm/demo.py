"""``ortlstm demo``: a bidirectional LSTM digit classifier trained in ONNX Runtime, end to end.

The whole path a user takes: a model built in PyTorch, ``torch.onnx.export``, ortlstm's
conversion and training artifacts, then training with onnxruntime-training's API on the ortlstm
kernels. Data: scikit-learn's handwritten digits (shipped inside the scikit-learn package), each
8x8 image read row by row as an 8-step sequence of 8 pixels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_ROWS = 8
IMAGE_COLUMNS = 8
NUM_CLASSES = 10
_PROGRESS_WIDTH = 30


@dataclasses.dataclass
class DemoResult:
    """What a demo run measured."""

    test_accuracy: float
    train_losses: list[float]
    epoch_test_accuracy: list[float]
    epoch_train_accuracy: list[float]
    seconds: float
    plot: Path | None


def _require(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise ImportError(f"ortlstm demo needs {module}: pip install 'ortlstm[{extra}]'") from error


def load_digits_sequences(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits as [N, 8 steps, 8 pixels] float32 in [0, 1], split 80/20 stratified."""
    datasets = _require("sklearn.datasets", "demo")
    model_selection = _require("sklearn.model_selection", "demo")
    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, IMAGE_ROWS, IMAGE_COLUMNS)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = model_selection.train_test_split(
        images, labels, test_size=0.2, random_state=seed, stratify=labels
    )
    return x_train, x_test, y_train, y_test


def _torch_classifier(hidden_size: int, seed: int) -> Any:
    torch = _require("torch", "train")

    class DigitClassifier(torch.nn.Module):
        """Bidirectional LSTM over image rows; the two final hidden states feed a linear head."""

        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(IMAGE_COLUMNS, hidden_size, batch_first=True, bidirectional=True)
            self.head = torch.nn.Linear(2 * hidden_size, NUM_CLASSES)

        def forward(self, pixels: Any) -> Any:
            _, (h_n, _) = self.lstm(pixels)
            return self.head(torch.cat([h_n[0], h_n[1]], dim=1))

    torch.manual_seed(seed)
    return DigitClassifier()


def export_classifier(model: Any, path: Path, batch_size: int) -> None:
    """``torch.onnx.export`` with a dynamic batch dimension and the parameters kept by name.

    ``optimize=False`` stops the exporter from folding the LSTM weights (reordered to ONNX's
    gate order) into new constants: the parameters stay initializers named as in PyTorch, so
    they can be trained and read back under those names.
    """
    torch = _require("torch", "train")
    example = torch.zeros(batch_size, IMAGE_ROWS, IMAGE_COLUMNS)
    # The exporter narrates each stage on stdout and warns about unrelated deprecations.
    with contextlib.redirect_stdout(io.StringIO()), _quiet_logger("torch.onnx"), _quiet_logger("torch.export"):
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=["pixels"],
            output_names=["logits"],
            dynamic_shapes={"pixels": {0: torch.export.Dim("batch")}},
            dynamo=True,
            optimize=False,
            verbose=False,
        )


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _progress(done: int, total: int, text: str) -> None:
    filled = _PROGRESS_WIDTH * done // max(total, 1)
    bar = "#" * filled + "-" * (_PROGRESS_WIDTH - filled)
    end = "\n" if done == total else ""
    print(f"\r[{bar}] {done}/{total} {text}", end=end, file=sys.stderr, flush=True)


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=1) == labels)) if labels.size else 0.0


def _plot(result: DemoResult, path: Path, steps_per_epoch: int) -> None:
    matplotlib = _require("matplotlib", "demo")
    matplotlib.use("Agg")
    pyplot = importlib.import_module("matplotlib.pyplot")
    figure, (loss_axis, accuracy_axis) = pyplot.subplots(1, 2, figsize=(11, 4))
    steps = np.arange(1, len(result.train_losses) + 1)
    loss_axis.plot(steps, result.train_losses, linewidth=0.8)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("training loss (cross-entropy)")
    loss_axis.set_yscale("log")
    loss_axis.set_title("Loss")
    epochs = np.arange(1, len(result.epoch_test_accuracy) + 1)
    accuracy_axis.plot(epochs, result.epoch_train_accuracy, marker="o", label="train")
    accuracy_axis.plot(epochs, result.epoch_test_accuracy, marker="o", label="held-out")
    accuracy_axis.set_xlabel(f"epoch ({steps_per_epoch} steps)")
    accuracy_axis.set_ylabel("accuracy")
    accuracy_axis.set_ylim(0.0, 1.0)
    accuracy_axis.legend()
    accuracy_axis.set_title(f"Held-out accuracy {result.test_accuracy:.1%}")
    figure.suptitle("ortlstm demo: bidirectional LSTM on handwritten digits, trained in ONNX Runtime")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def run_demo(
    epochs: int = 12,
    batch_size: int = 32,
    hidden_size: int = 64,
    learning_rate: float = 0.01,
    seed: int = 0,
    plot: Path | None = Path("ortlstm_demo.png"),
    threads: int = 2,
) -> DemoResult:
    """Trains the digit classifier in onnxruntime-training and returns what it measured.

    Args:
        epochs: Passes over the training set.
        batch_size: Sequences per step.
        hidden_size: LSTM hidden size per direction.
        learning_rate: AdamW learning rate.
        seed: Seeds the split, the initial weights and the batch order.
        plot: Where to write the PNG of loss and accuracy curves (None: no plot).
        threads: ONNX Runtime intra-op threads.

    Returns:
        Accuracy, losses and timing.
    """
    start = time.perf_counter()
    graphs = importlib.import_module("ortlstm.graphs")
    artifacts_api = _require("onnxruntime.training.artifacts", "train")
    # onnxruntime-training logs every graph transformation at INFO while generating artifacts.
    importlib.import_module("onnxruntime").set_default_logger_severity(3)
    onnx = importlib.import_module("onnx")
    x_train, x_test, y_train, y_test = load_digits_sequences(seed)
    classifier = _torch_classifier(hidden_size, seed)
    parameters = [name for name, _ in classifier.named_parameters()]

    with tempfile.TemporaryDirectory(prefix="ortlstm_demo_") as work:
        exported = Path(work) / "classifier.onnx"
        print(f"exporting a bidirectional LSTM classifier (hidden_size={hidden_size}) with torch.onnx.export")
        export_classifier(classifier, exported, batch_size)
        print("converting its LSTM to ortlstm.LSTMTraining and generating training artifacts")
        artifacts = graphs.generate_artifacts(
            onnx.load(str(exported)),
            requires_grad=parameters,
            loss=artifacts_api.LossType.CrossEntropyLoss,
            optimizer=artifacts_api.OptimType.AdamW,
            artifact_directory=Path(work) / "artifacts",
            additional_output_names=["logits"],
        )
        module, optimizer, _ = graphs.open_training(artifacts, intra_op_num_threads=threads)
        optimizer.set_learning_rate(learning_rate)

        rng = np.random.default_rng(seed)
        steps_per_epoch = (len(x_train) + batch_size - 1) // batch_size
        result = DemoResult(0.0, [], [], [], 0.0, None)
        for epoch in range(1, epochs + 1):
            module.train()
            order = rng.permutation(len(x_train))
            correct = 0
            for step in range(steps_per_epoch):
                batch = order[step * batch_size : (step + 1) * batch_size]
                loss, logits = module(x_train[batch], y_train[batch])
                optimizer.step()
                module.lazy_reset_grad()
                result.train_losses.append(float(loss))
                correct += int(np.sum(np.argmax(logits, axis=1) == y_train[batch]))
                _progress(step + 1, steps_per_epoch, f"epoch {epoch}/{epochs} loss {float(loss):.4f}")
            module.eval()
            _, test_logits = module(x_test, y_test)
            result.epoch_train_accuracy.append(correct / len(x_train))
            result.epoch_test_accuracy.append(_accuracy(test_logits, y_test))
            print(
                f"epoch {epoch:2d}: train accuracy {result.epoch_train_accuracy[-1]:.1%}, "
                f"held-out accuracy {result.epoch_test_accuracy[-1]:.1%}",
                flush=True,
            )
    result.test_accuracy = result.epoch_test_accuracy[-1]
    result.seconds = time.perf_counter() - start
    if plot is not None:
        _plot(result, plot, steps_per_epoch)
        result.plot = plot
    return result
