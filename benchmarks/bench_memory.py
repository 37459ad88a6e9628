"""Memory of one training step: what the ortlstm Trainer and PyTorch add, side by side.

Each (config, runtime) runs in a fresh process: the libraries are imported and the model is built
(the ONNX model; for torch the ``nn.Module`` with the same weights), the resident set is read
(``VmRSS``) and the peak is reset (``/proc/self/clear_refs``), then the Trainer (or torch's AdamW)
is built and ``--steps`` steps run; "added" is the peak resident set after them (``VmHWM``) minus
the baseline. The models are bench_training.py's LSTM classifiers (cross-entropy over 10 classes,
AdamW), bidirectional, at the sizes of issue 26: demo (8, 32, 8, 64, 1 layer), mid (64, 32, 128,
256, 2 layers), big (128, 64, 256, 512, 1 layer); its ConvLSTM classifier (``convlstm``); and a CTC
text recognizer (``crnn``: two Conv2d+ReLU+MaxPool2d, a bidirectional LSTM of 128, Linear to 100
classes, log_softmax; [16, 1, 32, 320] images, 80 steps, labels of 5-20; exported by
torch.onnx.export's defaults in the torch interpreter, trained with ``Loss.ctc_loss()``).

The Trainer runs with the interpreter given by ``--trainer-python`` (plain onnxruntime), torch
with ``--torch-python`` (default: this interpreter for both). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CONFIGS = {
    "demo": (8, 32, 8, 64, 1),
    "mid": (64, 32, 128, 256, 2),
    "big": (128, 64, 256, 512, 1),
    # bench_training.py's ConvLSTM classifier: (N, T, C, H, W, hidden) = (8, 8, 4, 32, 32, 16)
    "convlstm": (8, 8, 4, 32, 32, 16),
    # a CTC text recognizer (N, H, W, hidden, classes): two Conv+ReLU+MaxPool, biLSTM, Linear, log_softmax
    "crnn": (16, 32, 320, 128, 100),
}
CRNN_MODEL = "ORTLSTM_BENCH_CRNN_MODEL"  # the child's environment: the CRNN exported by the parent
MAX_LABELS = 20


def crnn_module(torch: ModuleType) -> Any:
    """The CTC recognizer of the ``crnn`` row: [N, 1, 32, 320] -> log-probabilities [T = 80, N, 100]."""
    _, height, _, hidden, classes = CONFIGS["crnn"]

    class Crnn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = torch.nn.Sequential(
                torch.nn.Conv2d(1, 32, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(32, 64, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
            )
            self.lstm = torch.nn.LSTM(64 * (height // 4), hidden, bidirectional=True)
            self.head = torch.nn.Linear(2 * hidden, classes)

        def forward(self, x: Any) -> Any:
            features = self.features(x)
            batch, channels, rows, columns = features.shape
            sequence = features.permute(3, 0, 1, 2).reshape(columns, batch, channels * rows)
            y, _ = self.lstm(sequence)
            return torch.log_softmax(self.head(y), dim=2)

    torch.manual_seed(0)
    return Crnn()


def crnn_batch() -> dict[str, np.ndarray]:
    """Images, padded labels in [1, classes) of lengths 5..20, their lengths."""
    batch, height, width, _, classes = CONFIGS["crnn"]
    rng = np.random.default_rng(1)
    lengths = rng.integers(5, MAX_LABELS + 1, batch).astype(np.int64)
    return {
        "x": rng.standard_normal((batch, 1, height, width), dtype=np.float32),
        "targets": rng.integers(1, classes, (batch, MAX_LABELS)).astype(np.int64),
        "target_lengths": lengths,
        "input_lengths": np.full(batch, width // 4, np.int64),
    }


def export_crnn(path: str) -> None:
    """Runs with torch: the ``crnn`` model exported as torch.onnx.export's defaults write it."""
    import torch

    net = crnn_module(torch).eval()
    torch.onnx.export(
        net,
        (torch.from_numpy(crnn_batch()["x"]),),
        path,
        input_names=["x"],
        output_names=["log_probs"],
        dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
    )


def measure_crnn(runtime: str, steps: int, threads: int) -> dict[str, float]:
    """Like ``measure``, for the CTC recognizer: AdamW, ctc_loss (torch's defaults)."""
    batch = crnn_batch()
    if runtime == "torch":
        import torch

        torch.set_num_threads(threads)
        net = crnn_module(torch)
        tensors = {name: torch.from_numpy(value) for name, value in batch.items()}
    else:
        import onnx
        import onnxruntime  # noqa: F401 - imported before the baseline, as torch is

        from ortlstm.graphs import losses, optimizers
        from ortlstm.training import Trainer

        model = onnx.load(os.environ[CRNN_MODEL])
    baseline = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    if runtime == "torch":
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.ctc_loss(
                net(tensors["x"]), tensors["targets"], tensors["input_lengths"], tensors["target_lengths"]
            )
            loss.backward()
            optimizer.step()
            float(loss.item())
    else:
        trainer = Trainer(model, loss=losses.Loss.ctc_loss(), optimizer=optimizers.AdamW(lr=1e-3), threads=threads)
        for _ in range(steps):
            float(
                trainer.step(
                    batch["x"],
                    target=batch["targets"],
                    target_lengths=batch["target_lengths"],
                    input_lengths=batch["input_lengths"],
                )
            )
    return {"baseline": baseline, "peak_added": _status("VmHWM") - baseline, "end_added": _status("VmRSS") - baseline}


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(config_name: str, runtime: str, steps: int, threads: int) -> dict[str, float]:
    """Runs in the child: baseline, build, ``steps`` steps; bytes added at the peak and at the end."""
    if config_name == "crnn":
        return measure_crnn(runtime, steps, threads)
    sys.path.insert(0, str(HERE))
    import bench_training

    if config_name == "convlstm":
        config = bench_training.CONFIGS["convlstm"]
    else:
        seq_length, batch_size, input_size, hidden_size, layers = CONFIGS[config_name]
        config = bench_training.Config(config_name, seq_length, batch_size, input_size, hidden_size, layers, True)
    model = bench_training.build_model(config)
    batch = bench_training.batch_of(config)
    if runtime == "torch":
        import torch

        torch.set_num_threads(threads)
        net = bench_training.torch_model(torch, config, model)
        x, y = torch.from_numpy(batch[0]), torch.from_numpy(batch[1])
        del model
    else:
        import onnxruntime  # noqa: F401 - imported before the baseline, as torch is

        from ortlstm.graphs import losses, optimizers
        from ortlstm.training import Trainer
    baseline = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    if runtime == "torch":
        optimizer = torch.optim.AdamW(net.parameters(), lr=bench_training.LR)
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            float(loss.item())
    else:
        trainer = Trainer(
            model,
            loss=losses.Loss.cross_entropy(),
            optimizer=optimizers.AdamW(lr=bench_training.LR),
            threads=threads,
        )
        for _ in range(steps):
            float(trainer.step(batch[0], target=batch[1]))
    return {"baseline": baseline, "peak_added": _status("VmHWM") - baseline, "end_added": _status("VmRSS") - baseline}


def _child(python: str, config: str, runtime: str, steps: int, threads: int) -> dict[str, float]:
    command = [python, __file__, "--child", config, runtime, "--steps", str(steps), "--threads", str(threads)]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd="/")
    if result.returncode != 0:
        raise RuntimeError(f"{config} {runtime} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    """Measures every config in both runtimes (``--repeats`` fresh processes each) and prints a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "RUNTIME"), help=argparse.SUPPRESS)
    parser.add_argument("--export-crnn", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--runtimes", default="torch,trainer")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per config and runtime (median)")
    parser.add_argument("--trainer-python", default=sys.executable)
    parser.add_argument("--torch-python", default=sys.executable)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[0], args.child[1], args.steps, args.threads)))
        return
    if args.export_crnn:
        export_crnn(args.export_crnn)
        return
    if "crnn" in args.configs.split(","):
        directory = tempfile.mkdtemp(prefix="bench_memory_")
        os.environ[CRNN_MODEL] = str(Path(directory) / "crnn.onnx")
        subprocess.run([args.torch_python, __file__, "--export-crnn", os.environ[CRNN_MODEL]], check=True, cwd="/")
    pythons = {"torch": args.torch_python, "trainer": args.trainer_python}
    runtimes = args.runtimes.split(",")
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    print(f"CPU: {cpu}, {os.cpu_count()} CPUs; {args.threads} threads, {args.steps} steps, median of {args.repeats}")
    print(
        "| config (T, N, I, H, layers; convlstm: N, T, C, H, W, hidden; crnn: N, H, W, hidden, classes) | "
        + " | ".join(f"{runtime} added (peak)" for runtime in runtimes)
        + " | ratio |"
    )
    print("|---|" + "---:|" * (len(runtimes) + 1))
    for name in args.configs.split(","):
        added = {}
        for runtime in runtimes:
            runs = [_child(pythons[runtime], name, runtime, args.steps, args.threads) for _ in range(args.repeats)]
            added[runtime] = statistics.median(run["peak_added"] for run in runs) / 2**20
        ratio = added["trainer"] / added["torch"] if {"trainer", "torch"} <= set(added) else float("nan")
        cells = " | ".join(f"{added[runtime]:.0f} MiB" for runtime in runtimes)
        print(f"| {name} {CONFIGS[name]} | {cells} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
