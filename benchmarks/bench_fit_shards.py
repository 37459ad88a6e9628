"""Memory of ``ortlstm fit`` over a sharded dataset: what the process holds while it reads by the batch.

Writes ``--gigabytes`` of float32 sequences [N, T, F] with int64 labels as ``--shards`` shard files
(``np.savez``, safetensors, or subfolders of NAME.npy) into a temporary folder, builds a Trainer for
an LSTM classifier (T steps of F features, one LSTM of 32, a linear head to 10 classes, AdamW), and
runs one epoch of ``ortlstm.fit.fit`` over the folder with shuffled batches of ``--batch-size``.
Before reading the data and after every update it reads ``RssAnon`` (memory the process allocated)
and ``RssFile`` (mapped file pages resident, which the kernel may drop at any time) from
``/proc/self/status``; it prints their growth over the baseline next to the dataset's size and what
one batch needs. A dataset read whole would add its size to RssAnon. ``--kind memory`` holds the
arrays in memory before the baseline: the growth of the loop itself. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CLASSES = 10
HIDDEN = 32


def status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def build_model(steps: int, features: int):  # noqa: ANN201 - onnx.ModelProto, imported lazily
    """X [batch, T, F] -> Transpose -> LSTM -> Y_h -> Squeeze -> Gemm -> logits [batch, 10]."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    bound = 1.0 / np.sqrt(HIDDEN)
    shapes = {
        "lstm.W": (1, 4 * HIDDEN, features),
        "lstm.R": (1, 4 * HIDDEN, HIDDEN),
        "lstm.B": (1, 8 * HIDDEN),
        "head.weight": (CLASSES, HIDDEN),
        "head.bias": (CLASSES,),
    }
    initializers = [
        numpy_helper.from_array(rng.uniform(-bound, bound, shape).astype(np.float32), name)
        for name, shape in shapes.items()
    ]
    initializers.append(numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    nodes = [
        helper.make_node("Transpose", ["x"], ["x_time_major"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["x_time_major", "lstm.W", "lstm.R", "lstm.B"], ["", "h_n"], hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["h_n", "axis0"], ["features"]),
        helper.make_node("Gemm", ["features", "head.weight", "head.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "sequence_classifier",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", steps, features])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", CLASSES])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def write_shards(directory: Path, kind: str, samples: int, shards: int, steps: int, features: int) -> None:
    """``samples`` random samples in ``shards`` files, written shard by shard (never all in memory)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    bounds = np.linspace(0, samples, shards + 1).astype(int)
    for index in range(shards):
        rows = int(bounds[index + 1] - bounds[index])
        shard = {
            "x": rng.standard_normal((rows, steps, features), dtype=np.float32),
            "target": rng.integers(0, CLASSES, rows),
        }
        name = f"train-{index:05d}"
        if kind == "npz":
            np.savez(directory / f"{name}.npz", **shard)
        elif kind == "safetensors":
            save_file(shard, str(directory / f"{name}.safetensors"))
        else:
            (directory / name).mkdir()
            for key, value in shard.items():
                np.save(directory / name / f"{key}.npy", value)
        del shard


def main() -> int:
    """Runs the benchmark; prints one table row."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.5, help="dataset size (default 1.5)")
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument(
        "--kind",
        choices=("npz", "safetensors", "npy", "memory"),
        default="npz",
        help="the shards' format; memory: the arrays in memory before the baseline (the loop's own growth)",
    )
    parser.add_argument("--steps", type=int, default=32, help="sequence length T")
    parser.add_argument("--features", type=int, default=512, help="features per step F")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--directory", type=Path, default=None, help="where to write the shards (default: a temp dir)")
    args = parser.parse_args()

    from ortlstm.fit import fit, read_arrays
    from ortlstm.graphs import losses, optimizers
    from ortlstm.training import Trainer

    sample_bytes = args.steps * args.features * 4 + 8
    samples = int(args.gigabytes * 2**30 // sample_bytes)
    with tempfile.TemporaryDirectory(dir=args.directory) as temporary:
        directory = Path(temporary)
        started = time.perf_counter()
        if args.kind == "memory":
            rng = np.random.default_rng(1)
            in_memory = {
                "x": rng.standard_normal((samples, args.steps, args.features), dtype=np.float32),
                "target": rng.integers(0, CLASSES, samples),
            }
        else:
            write_shards(directory, args.kind, samples, args.shards, args.steps, args.features)
        written = time.perf_counter() - started
        model = build_model(args.steps, args.features)
        trainer = Trainer(
            model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(lr=1e-3), threads=args.threads
        )
        # Two steps outside the measurement: onnxruntime's sessions and buffers are not the data's.
        warm = np.random.default_rng(2).standard_normal((args.batch_size, args.steps, args.features), np.float32)
        for _ in range(2):
            trainer.step(x=warm, target=np.zeros(args.batch_size, np.int64))
        anon_before, file_before = status_bytes("RssAnon"), status_bytes("RssFile")
        peaks = {"anon": 0, "file": 0}

        def sample(_: object) -> None:
            peaks["anon"] = max(peaks["anon"], status_bytes("RssAnon") - anon_before)
            peaks["file"] = max(peaks["file"], status_bytes("RssFile") - file_before)

        arrays = in_memory if args.kind == "memory" else read_arrays(directory)
        sample(None)
        started = time.perf_counter()
        result = fit(trainer, arrays, model=model, epochs=1, batch_size=args.batch_size, callback=sample, log=print)
        epoch = time.perf_counter() - started
    mib = 2**20
    print(
        f"| {args.kind} | {args.shards} | {samples * sample_bytes / mib:,.0f} MiB ({samples} samples) | "
        f"{args.batch_size * sample_bytes / mib:.1f} MiB | {peaks['anon'] / mib:.1f} MiB | "
        f"{peaks['file'] / mib:,.0f} MiB | {epoch:.1f} s ({result.trainer.global_step} updates; "
        f"written in {written:.1f} s) |"
    )
    print("columns: shard kind | shards | dataset | one batch | RssAnon growth (peak) | RssFile growth (peak) | epoch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
