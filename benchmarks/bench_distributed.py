"""Times data-parallel training (ortlstm.distributed) against one process on the same global batch.

Per model size (bench_training.py's ``demo`` and ``M-2bi``, AdamW, cross-entropy), the same global
batch each step:

- **1 process x 1 thread** and **1 process x 2 threads**: ``Trainer.step`` (the fused train-step model);
- **2 ranks x 1 thread**: ``mpirun -n 2``, each rank ``DistributedTrainer.step`` on half the batch
  (gradients model, in-place all-reduce of the gradients, apply model).

With ``--fit``, the same comparison through ``ortlstm.fit.fit`` (what ``ortlstm fit`` and
``mpirun -n 2 ortlstm fit`` run): one epoch of shuffled batches of the same size over
``3 + steps`` copies of that batch, each rank reading its rows of every batch; the time between
two updates (the loop's callback), median over the updates after the first 3.

Reported: median ms per step, the bytes all-reduced per step and the median time in the all-reduce
(rank 0; it includes waiting for the slower rank), and the all-reduce alone (every rank entering it
together after a barrier: the transfer). Run it with the environment that has the ``mpi`` extra
(mpirun is taken from beside its python)::

    python benchmarks/bench_distributed.py [--configs demo,M-2bi] [--steps 20] [--fit]

It only measures: the ranks are this same script with ``--run`` (one JSON line from rank 0).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

WARMUP = 3


def _bench_training() -> ModuleType:
    """benchmarks/bench_training.py, for its model sizes, models and batches."""
    path = Path(__file__).resolve().parent / "bench_training.py"
    spec = importlib.util.spec_from_file_location("bench_training", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_training"] = module
    spec.loader.exec_module(module)
    return module


def run(config_name: str, threads: int, steps: int, distributed: bool) -> dict[str, Any]:
    """Trains ``steps`` timed steps (after warm-up) in this process; rank 0's figures."""
    import numpy as np

    from ortlstm.graphs import losses, optimizers
    from ortlstm.training import Trainer

    bench = _bench_training()
    config = bench.CONFIGS[config_name]
    trainer = Trainer(
        bench.build_model(config),
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.AdamW(lr=bench.LR),
        threads=threads,
    )
    x, y = bench.batch_of(config)
    batch_axis = 0 if config.demo else 1  # bench_training's non-demo models are time-major
    if distributed:
        from ortlstm.distributed import DistributedTrainer, shard

        subject: Any = DistributedTrainer(trainer)
        part = shard(config.batch_size, subject.rank, subject.size)
        x = np.ascontiguousarray(x[part] if batch_axis == 0 else x[:, part])
        y = y[part]
    else:
        subject = trainer
    times, reduce_times = [], []
    for index in range(WARMUP + steps):
        reduced_before = subject.reduce_seconds if distributed else 0.0
        started = time.perf_counter()
        subject.step(x, target=y)
        if index >= WARMUP:
            times.append(time.perf_counter() - started)
            if distributed:
                reduce_times.append(subject.reduce_seconds - reduced_before)
    alone = []
    if distributed:  # the all-reduce by itself: every rank enters it at once (after a barrier)
        from mpi4py import MPI

        for _ in range(steps):
            subject.comm.Barrier()
            started = time.perf_counter()
            for bucket in subject._buckets.values():
                subject.comm.Allreduce(MPI.IN_PLACE, bucket)
            alone.append(time.perf_counter() - started)
    return {
        "config": config_name,
        "reduce_alone_ms": 1e3 * statistics.median(alone) if alone else None,
        "describe": config.describe(),
        "ranks": subject.size if distributed else 1,
        "threads": threads,
        "step_ms": 1e3 * statistics.median(times),
        "reduce_ms": 1e3 * statistics.median(reduce_times) if reduce_times else None,
        "reduced_bytes": subject.reduced_bytes if distributed else None,
        "rank": subject.rank if distributed else 0,
    }


def run_fit(config_name: str, threads: int, steps: int) -> dict[str, Any]:
    """One epoch of ``ortlstm.fit.fit`` over ``WARMUP + steps`` batches (data-parallel when started by mpirun)."""
    import numpy as np

    from ortlstm.fit import fit
    from ortlstm.fit.parallel import launched_rank, launched_world
    from ortlstm.graphs import losses, optimizers
    from ortlstm.training import Trainer

    bench = _bench_training()
    config = bench.CONFIGS[config_name]
    model = bench.build_model(config)
    trainer = Trainer(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(lr=bench.LR), threads=threads)
    x, y = bench.batch_of(config)
    initializers = {item.name for item in model.graph.initializer}
    name = next(item.name for item in model.graph.input if item.name not in initializers)
    copies = WARMUP + steps
    data = {name: np.concatenate([x] * copies, axis=0 if config.demo else 1), "target": np.tile(y, copies)}
    times: list[float] = []
    last = [time.perf_counter()]

    def tick(_: Any) -> None:
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    fit(trainer, data, model=model, epochs=1, batch_size=config.batch_size, callback=tick, log=lambda line: None)
    world = launched_world()
    return {
        "config": config_name,
        "describe": config.describe(),
        "ranks": world[0] if world is not None else 1,
        "threads": threads,
        "step_ms": 1e3 * statistics.median(times[WARMUP:]),
        "reduce_ms": None,
        "reduce_alone_ms": None,
        "reduced_bytes": None,
        "rank": launched_rank() or 0,
    }


def launch(config: str, ranks: int, threads: int, steps: int, through_fit: bool = False) -> dict[str, Any]:
    """This script with ``--run`` under ``mpirun -n ranks`` (or in a plain process when ranks is 0)."""
    command = [sys.executable, __file__, "--run", "--configs", config, "--threads", str(threads), "--steps", str(steps)]
    command += ["--fit"] if through_fit else []
    if ranks:
        mpirun = str(Path(sys.executable).parent / "mpirun")
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        # Oversubscribed, Open MPI yields the CPU while it waits, which slows every collective.
        over = ["--oversubscribe"] if ranks > (os.cpu_count() or 1) else []
        command = [mpirun, *root, *over, "-n", str(ranks), *command, "--distributed"]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return next(json.loads(line) for line in output.splitlines() if line.startswith("{"))


def main() -> None:
    """Runs the comparison (or, with ``--run``, one measurement) and prints a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="demo,M-2bi")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fit", action="store_true", help="time ortlstm.fit.fit's loop (2 ranks vs 1 x 2 threads)")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--distributed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        if args.fit:
            result = run_fit(args.configs, args.threads, args.steps)
        else:
            result = run(args.configs, args.threads, args.steps, args.distributed)
        if result["rank"] == 0:
            print(json.dumps(result), flush=True)
        return
    print("| model (T, N, I, H) | run | ms/step | in the all-reduce, ms/step | all-reduce alone, ms | bytes/step |")
    print("|---|---|---:|---:|---:|---:|")
    for config in args.configs.split(","):
        runs = (
            (0, 1, "1 process x 1 thread"),
            (0, 2, "1 process x 2 threads"),
            (2, 1, "2 ranks x 1 thread"),
        )
        for ranks, threads, label in runs[1:] if args.fit else runs:
            result = launch(config, ranks, threads, args.steps, args.fit)
            label = f"fit, {label}" if args.fit else label
            reduce_ms = f"{result['reduce_ms']:.2f}" if result["reduce_ms"] is not None else "-"
            alone = f"{result['reduce_alone_ms']:.2f}" if result["reduce_alone_ms"] is not None else "-"
            reduced = f"{result['reduced_bytes']:,}" if result["reduced_bytes"] is not None else "-"
            print(
                f"| {result['describe']} | {label} | {result['step_ms']:.2f} | {reduce_ms} | {alone} | {reduced} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
