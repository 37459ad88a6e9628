"""``ortlstm demo``: a bidirectional LSTM digit classifier trained in ONNX Runtime, end to end.

Default (``runtime="onnxruntime"``, no torch): the classifier is built as an ONNX model with a
standard ``LSTM`` node and torch's initialization, trained by ``ortlstm.training.Trainer`` (AdamW)
in the newest plain onnxruntime, exported back to standard ops and checked in an onnxruntime
session without the ortlstm library. ``runtime="onnxruntime-training"``: the older path, a model
built in PyTorch, ``torch.onnx.export``, ortlstm's training artifacts and onnxruntime-training's
API. Data: scikit-learn's handwritten digits (shipped inside the scikit-learn package), each 8x8
image read row by row as an 8-step sequence of 8 pixels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import logging
import math
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
RUNTIMES = ("onnxruntime", "onnxruntime-training")
_EXTRA = "demo"  # the pip extra of the torch-free demo; "demo-training" carries torch


@dataclasses.dataclass
class DemoResult:
    """What a demo run measured."""

    test_accuracy: float
    train_losses: list[float]
    epoch_test_accuracy: list[float]
    epoch_train_accuracy: list[float]
    seconds: float
    plot: Path | None
    model: Path | None = None
    plain_accuracy: float | None = None
    training_seconds: float = 0.0
    test_size: int = 0

    @property
    def plain_reproduces(self) -> bool:
        """Whether onnxruntime without ortlstm gets the trained accuracy, to one held-out sample.

        Its LSTM kernel rounds differently and may move one prediction across a tie.
        """
        if self.plain_accuracy is None:
            return True
        return abs(self.plain_accuracy - self.test_accuracy) * self.test_size <= 1 + 1e-9


def _require(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise ImportError(f"ortlstm demo needs {module}: pip install 'ortlstm[{extra}]'") from error


def load_digits_sequences(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits as [N, 8 steps, 8 pixels] float32 in [0, 1], split 80/20 stratified."""
    datasets = _require("sklearn.datasets", _EXTRA)
    model_selection = _require("sklearn.model_selection", _EXTRA)
    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, IMAGE_ROWS, IMAGE_COLUMNS)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = model_selection.train_test_split(
        images, labels, test_size=0.2, random_state=seed, stratify=labels
    )
    return x_train, x_test, y_train, y_test


def _torch_classifier(hidden_size: int, seed: int) -> Any:
    torch: Any = _require("torch", "demo-training")

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
    torch = _require("torch", "demo-training")
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


def build_classifier(hidden_size: int, seed: int) -> Any:
    """The demo's classifier as an ONNX model, without torch.

    ``pixels [batch, 8, 8]`` -> Transpose -> bidirectional ``LSTM`` -> ``Y_h [2, batch, hidden]``
    -> Transpose, Flatten (``torch.cat([h_n[0], h_n[1]], dim=1)``) -> Gemm -> ``logits [batch, 10]``:
    the architecture of the PyTorch model of ``--runtime onnxruntime-training``. Initialized as
    torch initializes it: every LSTM weight and bias U(-1/sqrt(H), 1/sqrt(H)) (ONNX's B holds
    torch's bias_ih and bias_hh), the head's weight and bias U(-1/sqrt(2H), 1/sqrt(2H))
    (nn.Linear's kaiming_uniform with a=sqrt(5), and its bias bound).
    """
    onnx = importlib.import_module("onnx")
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(seed)
    lstm_bound = 1.0 / np.sqrt(hidden_size)
    head_bound = 1.0 / np.sqrt(2 * hidden_size)
    shapes = {
        "lstm.W": ((2, 4 * hidden_size, IMAGE_COLUMNS), lstm_bound),
        "lstm.R": ((2, 4 * hidden_size, hidden_size), lstm_bound),
        "lstm.B": ((2, 8 * hidden_size), lstm_bound),
        "head.weight": ((NUM_CLASSES, 2 * hidden_size), head_bound),
        "head.bias": ((NUM_CLASSES,), head_bound),
    }
    initializers = [
        numpy_helper.from_array(rng.uniform(-bound, bound, shape).astype(np.float32), name)
        for name, (shape, bound) in shapes.items()
    ]
    nodes = [
        helper.make_node("Transpose", ["pixels"], ["rows"], perm=[1, 0, 2]),  # [8 steps, batch, 8 pixels]
        helper.make_node(
            "LSTM",
            ["rows", "lstm.W", "lstm.R", "lstm.B"],
            ["", "h_n"],
            hidden_size=hidden_size,
            direction="bidirectional",
        ),
        helper.make_node("Transpose", ["h_n"], ["h_n_batch"], perm=[1, 0, 2]),  # [batch, 2, hidden]
        helper.make_node("Flatten", ["h_n_batch"], ["features"], axis=1),  # [batch, 2 * hidden]
        helper.make_node("Gemm", ["features", "head.weight", "head.bias"], ["logits"], transB=1),
    ]
    float_type = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "digit_classifier",
        [helper.make_tensor_value_info("pixels", float_type, ["batch", IMAGE_ROWS, IMAGE_COLUMNS])],
        [helper.make_tensor_value_info("logits", float_type, ["batch", NUM_CLASSES])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _progress_bar(total: int, description: str) -> Any:
    """A tqdm bar on stderr, quiet when stdout is not a terminal (logs, CI, pipes)."""
    tqdm = _require("tqdm", _EXTRA)
    return tqdm.tqdm(total=total, desc=description, leave=False, disable=not sys.stdout.isatty(), file=sys.stderr)


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=1) == labels)) if labels.size else 0.0


def _plot(result: DemoResult, path: Path, steps_per_epoch: int, runtime: str) -> None:
    matplotlib = _require("matplotlib", _EXTRA)
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
    figure.suptitle(f"ortlstm demo: bidirectional LSTM on handwritten digits, trained in {runtime}")
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
    runtime: str = "onnxruntime",
    output: Path | None = Path("ortlstm_demo.onnx"),
    precision: str = "32-true",
) -> DemoResult:
    """Trains the digit classifier in ONNX Runtime and returns what it measured.

    Args:
        epochs: Passes over the training set.
        batch_size: Sequences per step.
        hidden_size: LSTM hidden size per direction.
        learning_rate: AdamW learning rate.
        seed: Seeds the split, the initial weights and the batch order.
        plot: Where to write the PNG of loss and accuracy curves (None: no plot).
        threads: ONNX Runtime intra-op threads.
        runtime: ``onnxruntime`` (the Trainer, no torch) or ``onnxruntime-training``.
        output: Where the ``onnxruntime`` path writes the trained model (None: not written,
            the check in onnxruntime without ortlstm still runs).
        precision: The Trainer's ``precision`` (``"32-true"`` or ``"bf16-mixed"``; ``onnxruntime`` only).

    Returns:
        Accuracy, losses and timing.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    if precision != "32-true" and runtime != "onnxruntime":
        raise ValueError(
            f"precision {precision!r} needs runtime 'onnxruntime' (the ortlstm Trainer), got {runtime!r}; "
            "pass precision '32-true' with onnxruntime-training"
        )
    start = time.perf_counter()
    x_train, x_test, y_train, y_test = load_digits_sequences(seed)
    steps_per_epoch = (len(x_train) + batch_size - 1) // batch_size
    if runtime == "onnxruntime":
        result = _train_plain(
            x_train, x_test, y_train, y_test, epochs, batch_size, hidden_size, learning_rate, seed, threads, output,
            precision,
        )
    else:
        result = _train_training_build(
            x_train, x_test, y_train, y_test, epochs, batch_size, hidden_size, learning_rate, seed, threads
        )
    result.test_accuracy = result.epoch_test_accuracy[-1]
    result.test_size = len(y_test)
    result.seconds = time.perf_counter() - start
    if plot is not None:
        _plot(result, plot, steps_per_epoch, runtime)
        result.plot = plot
    return result


def _batches(rng: np.random.Generator, count: int, batch_size: int) -> Iterator[np.ndarray]:
    order = rng.permutation(count)
    for first in range(0, count, batch_size):
        yield order[first : first + batch_size]


def _report_epoch(result: DemoResult, epoch: int) -> None:
    print(
        f"epoch {epoch:2d}: train accuracy {result.epoch_train_accuracy[-1]:.1%}, "
        f"held-out accuracy {result.epoch_test_accuracy[-1]:.1%}",
        flush=True,
    )


def _train_plain(
    x_train: np.ndarray,
    x_test: np.ndarray,
    y_train: np.ndarray,
    y_test: np.ndarray,
    epochs: int,
    batch_size: int,
    hidden_size: int,
    learning_rate: float,
    seed: int,
    threads: int,
    output: Path | None,
    precision: str,
) -> DemoResult:
    """The Trainer path: an ONNX model built here, trained in plain onnxruntime, exported."""
    ort = _require("onnxruntime", _EXTRA)
    training = importlib.import_module("ortlstm.training")
    losses = importlib.import_module("ortlstm.graphs.losses")
    optimizers = importlib.import_module("ortlstm.graphs.optimizers")
    print(
        f"building a bidirectional LSTM classifier (hidden_size={hidden_size}) as an ONNX model; "
        f"training it in onnxruntime {ort.__version__} with the ortlstm Trainer"
    )
    model = build_classifier(hidden_size, seed)
    steps_per_epoch = (len(x_train) + batch_size - 1) // batch_size
    total_steps = epochs * steps_per_epoch

    def cosine(done: int) -> float:
        """Torch's CosineAnnealingLR(T_max=total_steps, eta_min=0), stepped once per update."""
        return learning_rate * 0.5 * (1.0 + math.cos(math.pi * done / total_steps))

    trainer = training.Trainer(
        model,
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.AdamW(lr=learning_rate),
        lr=cosine,
        extra_outputs=["logits"],
        threads=threads,
        precision=precision,
    )
    rng = np.random.default_rng(seed)
    result = DemoResult(0.0, [], [], [], 0.0, None)
    for epoch in range(1, epochs + 1):
        correct = 0
        with _progress_bar(steps_per_epoch, f"epoch {epoch}/{epochs}") as bar:
            started = time.perf_counter()
            for batch in _batches(rng, len(x_train), batch_size):
                loss, logits = trainer.step(x_train[batch], target=y_train[batch])
                result.train_losses.append(loss)
                correct += int(np.sum(np.argmax(logits, axis=1) == y_train[batch]))
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
                bar.update()
            result.training_seconds += time.perf_counter() - started
        _, test_logits = trainer.evaluate(x_test, target=y_test, outputs=["logits"])
        result.epoch_train_accuracy.append(correct / len(x_train))
        result.epoch_test_accuracy.append(_accuracy(test_logits, y_test))
        _report_epoch(result, epoch)
    steps = trainer.global_step
    print(f"training loop: {result.training_seconds:.1f} s, {1e3 * result.training_seconds / steps:.2f} ms per step")

    # The trained model in its original form: standard ONNX ops, run without the ortlstm library.
    exported = trainer.export(output)
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    (plain_logits,) = session.run(["logits"], {"pixels": x_test})
    result.plain_accuracy = _accuracy(plain_logits, y_test)
    result.model = output
    return result


def _train_training_build(
    x_train: np.ndarray,
    x_test: np.ndarray,
    y_train: np.ndarray,
    y_test: np.ndarray,
    epochs: int,
    batch_size: int,
    hidden_size: int,
    learning_rate: float,
    seed: int,
    threads: int,
) -> DemoResult:
    """The onnxruntime-training path: a PyTorch model, torch.onnx.export, training artifacts."""
    graphs = importlib.import_module("ortlstm.graphs")
    artifacts_api = _require("onnxruntime.training.artifacts", "demo-training")
    # onnxruntime-training logs every graph transformation at INFO while generating artifacts.
    importlib.import_module("onnxruntime").set_default_logger_severity(3)
    onnx = importlib.import_module("onnx")
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
            correct = 0
            with _progress_bar(steps_per_epoch, f"epoch {epoch}/{epochs}") as bar:
                started = time.perf_counter()
                for batch in _batches(rng, len(x_train), batch_size):
                    loss, logits = module(x_train[batch], y_train[batch])
                    optimizer.step()
                    module.lazy_reset_grad()
                    result.train_losses.append(float(loss))
                    correct += int(np.sum(np.argmax(logits, axis=1) == y_train[batch]))
                    bar.set_postfix(loss=f"{float(loss):.4f}", refresh=False)
                    bar.update()
                result.training_seconds += time.perf_counter() - started
            module.eval()
            _, test_logits = module(x_test, y_test)
            result.epoch_train_accuracy.append(correct / len(x_train))
            result.epoch_test_accuracy.append(_accuracy(test_logits, y_test))
            _report_epoch(result, epoch)
    return result
