"""``ortlstm fit`` on several processes: the MPI world detected from the launcher, each rank's rows, rank 0's files.

``mpirun -n K ortlstm fit ...`` (or ``srun``) starts K copies of the same command. Each finds the
launcher's world size in its environment, wraps its Trainer in a ``DistributedTrainer`` and,
of every global batch (the loop's order, the same on every rank and for any number of ranks),
reads and trains only its contiguous part (``shard``). Rank 0 alone prints, writes the
checkpoint, the export and the plot; the others learn of a failure there by a broadcast, so that
no rank waits for another forever. ``--accumulate K`` runs K micro-batches per update with one
all-reduce of the gradients (also in one process, without MPI).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ortlstm.distributed import DistributedTrainer, OneProcess, shard
from ortlstm.fit.arrays import ArraySpec, batch_arguments
from ortlstm.training import NonFiniteStepError, Trainer

DISTRIBUTED_MODES = ("auto", "off")
"""``--distributed``: auto (the launcher's world when started by mpirun/srun), off (one process)."""

_WORLD_SIZES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS")
"""Where launchers put the number of processes: Open MPI, MPICH/Intel MPI (PMI), PMIx, srun's job step."""
_WORLD_RANKS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def launched_world(environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """The number of processes the launcher started and the variable that says so; None outside a launcher.

    ``SLURM_STEP_NUM_TASKS`` (set by ``srun``), not ``SLURM_NTASKS``: an ``sbatch`` script itself
    runs once with ``SLURM_NTASKS`` set, and must not wait for ranks that were never started.
    """
    environ = os.environ if environ is None else environ
    for name in _WORLD_SIZES:
        text = environ.get(name, "")
        if text.isdigit():
            return int(text), name
    return None


def launched_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as the launcher set it (before MPI starts); None outside a launcher."""
    environ = os.environ if environ is None else environ
    for name in _WORLD_RANKS:
        text = environ.get(name, "")
        if text.isdigit():
            return int(text)
    return None


class RootFailed(RuntimeError):
    """Rank 0 failed to write a file; raised on every rank alike."""


class Ranks:
    """How the loop's updates, validation and files are spread over the processes of one fit.

    Attributes:
        trainer: The DistributedTrainer over this rank's Trainer.
        accumulate: Micro-batches per update.
    """

    def __init__(self, trainer: Trainer, comm: Any, accumulate: int) -> None:
        one = isinstance(comm, OneProcess)
        self.trainer = DistributedTrainer(trainer, comm, check_every=0 if one else 100, abort_on_exception=not one)
        self.accumulate = accumulate

    @classmethod
    def open(cls, trainer: Trainer, distributed: str, accumulate: int) -> Ranks | None:
        """The ranks of this fit; None for one process without accumulation (the plain Trainer's steps).

        Raises:
            ValueError: An unknown ``distributed`` mode, ``accumulate`` < 1, or a stateful trainer under MPI.
            ImportError: Started by a launcher, and mpi4py is not installed.
        """
        if distributed not in DISTRIBUTED_MODES:
            raise ValueError(f"--distributed: expected one of {', '.join(DISTRIBUTED_MODES)}, got {distributed!r}")
        if accumulate < 1:
            raise ValueError(f"--accumulate: expected an integer >= 1 (micro-batches per update), got {accumulate}")
        if accumulate > 1 and trainer.spec.stateful:
            raise ValueError(
                f"--accumulate {accumulate} with --stateful: the micro-batches split each batch's rows, whose LSTM "
                "state carries into the next batch's same rows; drop --accumulate (or --stateful)"
            )
        world = launched_world() if distributed == "auto" else None
        if world is None or world[0] < 2:
            return cls(trainer, OneProcess(), accumulate) if accumulate > 1 else None
        if trainer.spec.stateful:
            raise ValueError(
                f"--stateful under MPI ({world[1]}={world[0]}): the carried LSTM state belongs to the batch's rows, "
                "which the ranks split; run it in one process (--distributed off) or drop --stateful"
            )
        try:
            from mpi4py import MPI
        except ModuleNotFoundError:
            raise ImportError(
                f"started as one of {world[0]} processes ({world[1]}={world[0]}) but mpi4py is not installed: "
                "pip install 'ortlstm[mpi]' (or pass --distributed off to train each process alone)"
            ) from None
        return cls(trainer, MPI.COMM_WORLD, accumulate)

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.trainer.rank

    @property
    def size(self) -> int:
        """The number of processes."""
        return self.trainer.size

    def step(
        self,
        data: Mapping[str, Any],
        specs: Mapping[str, ArraySpec],
        rows: np.ndarray,
        lr: float | None,
    ) -> Any:
        """One update on the global batch ``rows``: this rank reads its part, in ``accumulate`` micro-batches."""
        target = self.trainer.trainer.signature.target
        if self.accumulate == 1:
            mine = rows[shard(len(rows), self.rank, self.size)]
            return self.trainer.step(lr=lr, **batch_arguments(data, specs, target, mine))
        # The micro-batches of the global update: --batch-size rows each, of which this rank takes its part.
        micro = [
            part[shard(len(part), self.rank, self.size)] for part in np.array_split(rows, self.accumulate) if len(part)
        ]
        return self.trainer.step_accumulated([batch_arguments(data, specs, target, part) for part in micro], lr)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (a collective)."""
        return list(self.trainer.comm.allgather(value))

    def on_root(self, action: Callable[[], Any], what: str) -> None:
        """Runs ``action`` on rank 0; every rank raises its error (a collective), none waits for rank 0 forever.

        Raises:
            RootFailed: On every rank, naming ``what`` and rank 0's error.
        """
        error: str | None = None
        if self.rank == 0:
            try:
                action()
            except Exception as failure:  # every rank must hear of it
                error = f"{type(failure).__name__}: {failure}" if self.size > 1 else None
                if error is None:
                    raise
        error = self.trainer.comm.bcast(error, root=0)
        if error is not None:
            raise RootFailed(f"rank 0 failed {what}: {error}")

    def together(self, action: Callable[[], Any]) -> Any:
        """Runs ``action`` on every rank; an error on any rank is raised on all (a collective).

        The first failing rank's error, as that rank raised it where it is rank 0, else a
        ``RuntimeError`` that names the rank (e.g. a checkpoint that one node cannot read).
        """
        result: Any = None
        failure: Exception | None = None
        try:
            result = action()
        except Exception as error:
            failure = error
        failed = self.gather(None if failure is None else f"{type(failure).__name__}: {failure}")
        first = next((rank for rank, text in enumerate(failed) if text is not None), None)
        if first is None:
            return result
        if first == self.rank and failure is not None:
            raise failure
        raise RuntimeError(f"rank {first} of {self.size}: {failed[first]}")

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """An error that only this rank raised ends every rank (``MPI_Abort``), after one line on stderr.

        Errors raised alike on every rank (a refused non-finite update, rank 0's failed write)
        end each rank normally; Ctrl-C under ``mpirun`` is the launcher's (it ends the job; the
        last epoch's checkpoint is kept).
        """
        try:
            yield
        except (NonFiniteStepError, RootFailed):
            raise
        except Exception as error:
            if self.size == 1:
                raise
            self._abort(error)

    def _abort(self, error: BaseException) -> None:
        sys.stderr.write(
            f"ortlstm fit: rank {self.rank} of {self.size}: error: {type(error).__name__}: {error}; "
            "aborting every rank (MPI_Abort)\n"
        )
        sys.stderr.flush()
        self.trainer.comm.Abort(1)
