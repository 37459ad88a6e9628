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
from pathlib import Path

import numpy as np
from test_trainer import CLASSES, batches, classifier

from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A training run: loss, optimizer, clipping and the sizes of its global batches."""

    optimizer: optimizers.Optimizer
    sizes: tuple[int, ...] = (8, 8, 8, 8)
    loss: losses.Loss = dataclasses.field(default_factory=losses.Loss.cross_entropy)
    clip_grad_norm: float | None = None


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
}
RESUME_SPLIT = 2  # the resume test: updates before the checkpoint, with 2 ranks
FAULT_STEP = 3  # the fault tests: the update at which rank 1 fails


def make_trainer(name: str) -> Trainer:
    """The scenario's Trainer (1 thread: two ranks share this machine's two cores)."""
    scenario = SCENARIOS[name]
    return Trainer(
        classifier(),
        loss=scenario.loss,
        optimizer=scenario.optimizer,
        clip_grad_norm=scenario.clip_grad_norm,
        threads=1,
    )


def global_batches(name: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The scenario's global batches: class labels, or one-hot floats for a regression loss."""
    scenario = SCENARIOS[name]
    result = []
    for index, size in enumerate(scenario.sizes):
        ((x, y),) = batches(1, size=size, seed=10 + index)
        if not scenario.loss.class_target:
            y = np.eye(CLASSES, dtype=np.float32)[y]
        result.append((x, y))
    return result


def _train(
    trainer: object, name: str, data: list[tuple[np.ndarray, np.ndarray]], record: dict[str, np.ndarray]
) -> None:
    from ortlstm.distributed import shard

    for x, y in data:
        part = shard(len(x), trainer.rank, trainer.size)  # type: ignore[attr-defined]
        loss = trainer.step(x[part], target=y[part])  # type: ignore[attr-defined]
        step = trainer.trainer.global_step  # type: ignore[attr-defined]
        record[f"loss/{step}"] = np.float64(loss)
        record.update({f"{step}/{key}": value for key, value in trainer.trainer.parameters.items()})  # type: ignore[attr-defined]
        if trainer.trainer.last_grad_norm is not None:  # type: ignore[attr-defined]
            record[f"grad_norm/{step}"] = np.float64(trainer.trainer.last_grad_norm)  # type: ignore[attr-defined]


def main() -> None:
    from mpi4py import MPI

    from ortlstm.distributed import DistributedTrainer

    scenario, output = sys.argv[1], Path(sys.argv[2])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    (output / f"pid.{rank}").write_text(str(os.getpid()))
    record: dict[str, np.ndarray] = {}
    if scenario in ("die", "raise"):
        trainer = DistributedTrainer(make_trainer("sgd"), check_every=1)
        data = global_batches("sgd")
        for update in range(1, 100_000):
            if update == FAULT_STEP:
                trainer.save(output / "last.safetensors")
                if rank == 1 and scenario == "die":
                    os.kill(os.getpid(), signal.SIGKILL)
                if rank == 1:
                    raise RuntimeError(f"rank 1 fails on purpose at update {update}")
            x, y = data[update % len(data)]
            trainer.step(x[rank::2], target=y[rank::2])
        return
    if scenario.startswith("resume"):
        # resume-save: 2 ranks, RESUME_SPLIT updates, checkpoint, then on uninterrupted;
        # resume-continue: any number of ranks loads the checkpoint and trains the rest.
        data = global_batches("adamw_clip")
        trainer = DistributedTrainer(make_trainer("adamw_clip"), check_every=1)
        if scenario == "resume-save":
            _train(trainer, "adamw_clip", data[:RESUME_SPLIT], {})
            trainer.save(Path(sys.argv[3]))
            _train(trainer, "adamw_clip", data[RESUME_SPLIT:], record)
        else:
            trainer.load(Path(sys.argv[3]))
            _train(trainer, "adamw_clip", data[RESUME_SPLIT:], record)
        np.savez(output / f"{scenario}.rank{rank}.npz", **record)
        return
    for name in scenario.split(","):  # one launch for several scenarios: MPI starts once
        record = {}
        trainer = DistributedTrainer(make_trainer(name), check_every=1)
        _train(trainer, name, global_batches(name), record)
        np.savez(output / f"{name}.rank{rank}.npz", **record)


if __name__ == "__main__":
    main()
