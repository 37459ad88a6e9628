"""One rank of the data-parallel tests (tests/test_distributed.py), started by ``mpirun``.

Usage: ``mpirun -n 2 python tests/distributed_worker.py SCENARIO[,SCENARIO...] OUTPUT_DIR [CHECKPOINT]``. Each rank
trains its shard of the scenario's global batches and writes ``OUTPUT_DIR/SCENARIO.rankR.npz`` with
the parameters after every update; the test compares the ranks with each other and rank 0 with one
process training on the global batches. The scenarios are a table shared with the test.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
from test_trainer import CLASSES, batches, classifier

from ortlstm.distributed import DistributedTrainer, shard
from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A training run: loss, optimizer, clipping, the sizes of its global batches.

    ``nan_batch``: the index of a global batch whose last row (rank 1's shard) is NaN; the
    trainers then skip non-finite updates (``nonfinite="skip"``).
    """

    optimizer: optimizers.Optimizer
    sizes: tuple[int, ...] = (8, 8, 8, 8)
    loss: losses.Loss = dataclasses.field(default_factory=losses.Loss.cross_entropy)
    clip_grad_norm: float | None = None
    nan_batch: int | None = None


SCENARIOS = {
    "sgd": Scenario(optimizers.SGD(lr=0.1, momentum=0.9)),
    "adam": Scenario(optimizers.Adam(lr=0.01)),
    "adamw_clip": Scenario(optimizers.AdamW(lr=0.01, weight_decay=0.1), clip_grad_norm=0.15),
    # Odd global batches: 7 -> 4 + 3 rows; 1 -> 1 + 0 (rank 1 has an empty shard).
    "ragged": Scenario(optimizers.AdamW(lr=0.01), sizes=(7, 5, 1, 3)),
    # The mean divides by the class weights of the non-ignored targets, not by the rows.
    "weighted_ignore": Scenario(
        optimizers.SGD(lr=0.5),
        sizes=(9, 6, 5),
        loss=losses.Loss.cross_entropy(weight=np.array([1.0, 3.0, 0.5], np.float32), ignore_index=1),
    ),
    "mse_sum": Scenario(optimizers.Adam(lr=0.01), sizes=(5, 8), loss=losses.Loss.mse_loss(reduction="sum")),
    # Only rank 1's loss is NaN: every rank must skip that update alike.
    "nan_skip": Scenario(optimizers.Adam(lr=0.01), sizes=(6, 6, 6), nan_batch=1),
}
RESUME_SPLIT = 2  # the resume test: updates before the checkpoint, with 2 ranks
FAULT_STEP = 3  # the fault tests: the update at which rank 1 fails
HANG_TIMEOUT = 3.0  # the hang test's collective_timeout, seconds


def make_trainer(name: str) -> Trainer:
    """The scenario's Trainer (1 thread: two ranks share this machine's two cores)."""
    scenario = SCENARIOS[name]
    return Trainer(
        classifier(),
        loss=scenario.loss,
        optimizer=scenario.optimizer,
        clip_grad_norm=scenario.clip_grad_norm,
        threads=1,
        nonfinite="raise" if scenario.nan_batch is None else "skip",
    )


def global_batches(name: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The scenario's global batches: class labels, or one-hot floats for a regression loss."""
    scenario = SCENARIOS[name]
    result = []
    for index, size in enumerate(scenario.sizes):
        ((x, y),) = batches(1, size=size, seed=10 + index)
        if not scenario.loss.class_target:
            y = np.eye(CLASSES, dtype=np.float32)[y]
        if index == scenario.nan_batch:
            x[-1] = np.nan
        result.append((x, y))
    return result


def _train(
    trainer: DistributedTrainer, data: list[tuple[np.ndarray, np.ndarray]], first: int = 1
) -> dict[str, np.ndarray]:
    """Trains this rank's shards; by global batch number: loss, grad norm, parameters, counts."""
    record: dict[str, np.ndarray] = {}
    for number, (x, y) in enumerate(data, first):
        part = shard(len(x), trainer.rank, trainer.size)
        record[f"loss/{number}"] = np.float64(trainer.step(x[part], target=y[part]))
        record.update({f"{number}/{key}": value for key, value in trainer.trainer.parameters.items()})
        if trainer.trainer.last_grad_norm is not None:
            record[f"grad_norm/{number}"] = np.float64(trainer.trainer.last_grad_norm)
        record[f"counts/{number}"] = np.array([trainer.trainer.global_step, trainer.trainer.skipped_steps])
    x, y = data[0]
    part = shard(len(x), trainer.rank, trainer.size)
    record["evaluate"] = np.float64(trainer.evaluate(x[part], target=y[part]))
    return record


def main() -> None:
    from mpi4py import MPI

    scenario, output = sys.argv[1], Path(sys.argv[2])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    (output / f"pid.{rank}").write_text(str(os.getpid()))
    if scenario in ("die", "raise", "diverge", "hang"):
        timeout = HANG_TIMEOUT if scenario == "hang" else None
        trainer = DistributedTrainer(make_trainer("sgd"), check_every=1, collective_timeout=timeout)
        data = global_batches("sgd")
        for update in range(1, 100_000):
            if update == FAULT_STEP:
                trainer.save(output / "last.safetensors")
                if rank == 1 and scenario == "die":
                    os.kill(os.getpid(), signal.SIGKILL)
                if rank == 1 and scenario == "hang":
                    time.sleep(600)  # alive, but never reaches the next collective
                if rank == 1 and scenario == "diverge":
                    trainer.trainer.skipped_steps += 1  # this rank's state no longer is rank 0's
                elif rank == 1:
                    raise RuntimeError(f"rank 1 fails on purpose at update {update}")
            x, y = data[update % len(data)]
            trainer.step(x[rank::2], target=y[rank::2])
        return
    if scenario == "mismatch":  # rank 1 builds another optimizer
        DistributedTrainer(make_trainer("sgd" if rank == 0 else "adam"))
    if scenario.startswith("resume"):
        # resume-save: 2 ranks, RESUME_SPLIT updates, checkpoint, then on uninterrupted;
        # resume-continue: any number of ranks loads the checkpoint and trains the rest.
        data = global_batches("adamw_clip")
        trainer = DistributedTrainer(make_trainer("adamw_clip"), check_every=1)
        if scenario == "resume-save":
            _train(trainer, data[:RESUME_SPLIT])
            trainer.save(Path(sys.argv[3]))
        else:
            trainer.load(Path(sys.argv[3]))
        record = _train(trainer, data[RESUME_SPLIT:], first=RESUME_SPLIT + 1)
        np.savez(output / f"{scenario}.rank{rank}.npz", **record)
        return
    for name in scenario.split(","):  # one launch for several scenarios: MPI starts once
        # The watchdog guards every collective; it must never fire on a healthy run.
        trainer = DistributedTrainer(make_trainer(name), check_every=1, collective_timeout=60)
        record = _train(trainer, global_batches(name))
        np.savez(output / f"{name}.rank{rank}.npz", **record)


if __name__ == "__main__":
    main()
