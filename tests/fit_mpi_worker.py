"""``ortlstm fit ARGS`` as one rank of ``mpirun``, with a fault injected where the environment asks for one.

tests/test_fit_distributed.py launches it. ``FIT_KILL_STEP=RANK:STEP``: that rank kills itself
(SIGKILL, no cleanup, as the kernel's OOM killer or a lost node would) just before it takes update
STEP + 1. ``FIT_KILL_WRITE=N``: rank 0 kills itself in the middle of its N-th checkpoint write (half
of the new file written, not yet renamed over the checkpoint). ``FIT_ROWS=DIR``: each rank appends
the rows it reads for each training micro-batch to ``DIR/rank-R.jsonl``, one JSON list a line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortlstm import distributed
from ortlstm.__main__ import main
from ortlstm.fit import checkpoint, parallel
from ortlstm.fit.parallel import launched_rank


def _kill() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_at_step(rank: int, step: int) -> None:
    original = distributed.DistributedTrainer.step

    def step_or_die(self: distributed.DistributedTrainer, *args: Any, **kwargs: Any) -> Any:
        if launched_rank() == rank and self.trainer.global_step == step:
            _kill()
        return original(self, *args, **kwargs)

    distributed.DistributedTrainer.step = step_or_die  # type: ignore[method-assign]


def _kill_in_write(write_number: int) -> None:
    original = checkpoint.atomic_write
    calls = [0]

    def half_then_die(path: str | Path, write: Callable[[str], None]) -> Path:
        calls[0] += 1
        if calls[0] != write_number:
            return original(path, write)

        def partial(temporary: str) -> None:
            write(temporary)
            size = os.path.getsize(temporary)
            with open(temporary, "r+b") as handle:
                handle.truncate(size // 2)
            _kill()

        return original(path, partial)

    checkpoint.atomic_write = half_then_die  # type: ignore[assignment]


def _record_rows(directory: str) -> None:
    original = parallel.batch_arguments
    path = Path(directory) / f"rank-{launched_rank()}.jsonl"

    def recorded(arrays: Any, specs: Any, target: Any, rows: Any) -> Any:
        with open(path, "a") as handle:
            handle.write(json.dumps([int(row) for row in rows]) + "\n")
        return original(arrays, specs, target, rows)

    parallel.batch_arguments = recorded  # type: ignore[assignment]


if __name__ == "__main__":
    if "FIT_ROWS" in os.environ:
        _record_rows(os.environ["FIT_ROWS"])
    if "FIT_KILL_STEP" in os.environ:
        kill_rank, kill_step = os.environ["FIT_KILL_STEP"].split(":")
        _kill_at_step(int(kill_rank), int(kill_step))
    if "FIT_KILL_WRITE" in os.environ and launched_rank() == 0:
        _kill_in_write(int(os.environ["FIT_KILL_WRITE"]))
    sys.exit(main(["fit", *sys.argv[1:]]))
