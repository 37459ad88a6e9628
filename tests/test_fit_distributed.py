"""``ortlstm fit`` under ``mpirun`` (2, 3 and 4 ranks, oversubscribed here: correctness, never timings).

Oracles: one process on the same global batches (float32 rounding of the gradient's summation
order, the tolerance of tests/test_distributed.py), and, where the arithmetic is the same, the
bytes of the export: 2 ranks add their two scaled gradients exactly as one process with
``--accumulate 2`` adds its two micro-batches' (an IEEE sum of two terms does not depend on
their order), so those exports are byte-identical. The ranks run tests/fit_mpi_worker.py, which
kills a rank where the test asks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_fit import README_COMMAND, checkpoint_metadata, classifier_trainer, cli, rule_data, write_example

import ortlstm
from ortlstm import fit as fitting
from ortlstm.demo import build_classifier
from ortlstm.distributed import shard
from ortlstm.fit.parallel import Ranks, RootFailed, launched_rank, launched_world

PACKAGE_ROOT = Path(ortlstm.__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "fit_mpi_worker.py"
FLOAT32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}  # as tests/test_distributed.py: the summation order's rounding
BESIDE = Path(sys.executable).parent / "mpirun"
MPIRUN = str(BESIDE) if BESIDE.is_file() else shutil.which("mpirun")
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="no mpirun beside python or on PATH: pip install 'ortlstm[mpi]'")


def mpi_fit(ranks: int, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``mpirun -n ranks python fit_mpi_worker.py ARGS`` (= ``ortlstm fit ARGS`` on each rank) in ``cwd``."""
    pytest.importorskip("mpi4py", reason="fit under MPI needs mpi4py: pip install 'ortlstm[mpi]'")
    assert MPIRUN is not None
    command = [MPIRUN, "--oversubscribe", "-n", str(ranks), sys.executable, str(WORKER), *args]
    if os.geteuid() == 0:  # CI runs as root; Open MPI refuses unless told
        command.insert(1, "--allow-run-as-root")
    paths = [str(PACKAGE_ROOT), str(WORKER.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(env or {})}
    process = subprocess.Popen(
        command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"mpirun -n {ranks} fit {args} did not end in 180 s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def weights(path: Path) -> dict[str, np.ndarray]:
    return {item.name: numpy_helper.to_array(item) for item in onnx.load(str(path)).graph.initializer}


def assert_close_weights(path: Path, reference: Path) -> None:
    got, expected = weights(path), weights(reference)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, **FLOAT32_TOLERANCE, err_msg=name)


def fit_state(path: Path) -> dict[str, object]:
    return json.loads(checkpoint_metadata(path)[fitting.FIT_METADATA_KEY])["state"]


# ---- one process: the launcher's environment, --accumulate ------------------------------------------


def test_the_world_comes_from_whichever_launcher_started_the_process() -> None:
    assert launched_world({}) is None and launched_rank({}) is None
    assert launched_world({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2"}) == (3, "OMPI_COMM_WORLD_SIZE")
    assert launched_rank({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2"}) == 2
    assert launched_world({"PMI_SIZE": "4", "PMI_RANK": "1"}) == (4, "PMI_SIZE")
    srun = {"SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5"}
    assert launched_world(srun) == (8, "SLURM_STEP_NUM_TASKS") and launched_rank(srun) == 5
    # The sbatch script itself (SLURM_NTASKS set, no job step) is one process, not rank 0 of 8.
    assert launched_world({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}) is None


def test_accumulate_is_the_larger_batch_to_float32_rounding_with_a_ragged_last_update() -> None:
    data = rule_data(90, 0)  # updates of 16: the last one 10 rows, micro-batches of 5 and 5
    runs = {}
    for name, batch_size, accumulate in (("plain", 16, 1), ("accumulated", 8, 2)):
        trainer, model = classifier_trainer()
        result = fitting.fit(
            trainer, data, model=model, epochs=2, batch_size=batch_size, accumulate=accumulate, seed=3,
            log=lambda line: None,
        )  # fmt: skip
        runs[name] = result
    plain, accumulated = runs["plain"].trainer, runs["accumulated"].trainer
    assert accumulated.global_step == plain.global_step == 2 * 6
    for name, value in plain.parameters.items():
        np.testing.assert_allclose(accumulated.parameters[name], value, **FLOAT32_TOLERANCE, err_msg=name)
    for first, second in zip(runs["plain"].history, runs["accumulated"].history, strict=True):
        assert second.train_loss == pytest.approx(first.train_loss, rel=1e-5)


def test_bad_accumulate_distributed_mode_and_stateful_under_mpi_say_what_to_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = rule_data(64, 0)
    trainer, model = classifier_trainer()
    with pytest.raises(ValueError, match=r"--accumulate: expected an integer >= 1 \(micro-batches per update\), got 0"):
        fitting.fit(trainer, data, model=model, epochs=1, batch_size=16, accumulate=0, log=lambda line: None)
    with pytest.raises(ValueError, match="--distributed: expected one of auto, off, got 'on'"):
        fitting.fit(trainer, data, model=model, epochs=1, batch_size=16, distributed="on", log=lambda line: None)
    stateful, model = classifier_trainer(stateful=True)
    with pytest.raises(ValueError, match=r"--accumulate 2 with --stateful: .*drop --accumulate \(or --stateful\)"):
        fitting.fit(stateful, data, model=model, epochs=1, batch_size=16, accumulate=2, log=lambda line: None)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"--stateful under MPI \(OMPI_COMM_WORLD_SIZE=2\).*--distributed off"):
        fitting.fit(stateful, data, model=model, epochs=1, batch_size=16, log=lambda line: None)


class _TwoRanks:
    """Rank 0's view of a 2-rank communicator whose rank 1 sends what the test says (no MPI)."""

    def __init__(self, from_rank_1: object) -> None:
        self.from_rank_1 = from_rank_1

    def allgather(self, value: object) -> list[object]:
        return [value, self.from_rank_1]

    def bcast(self, value: object, root: int = 0) -> object:
        return value


def rank_0_of_two(from_rank_1: object) -> Ranks:
    ranks = Ranks.__new__(Ranks)  # without a DistributedTrainer: only the messages between ranks
    ranks.trainer = SimpleNamespace(comm=_TwoRanks(from_rank_1), rank=0, size=2)  # type: ignore[assignment]
    return ranks


def test_a_failure_on_one_rank_is_raised_on_every_rank_naming_where_it_happened(tmp_path: Path) -> None:
    assert rank_0_of_two(None).together(lambda: 7) == 7
    with pytest.raises(RuntimeError, match=r"^rank 1 of 2: FileNotFoundError: no run.safetensors$"):
        rank_0_of_two("FileNotFoundError: no run.safetensors").together(lambda: 7)
    with pytest.raises(ValueError, match=r"^exists$"):  # rank 0's own error, as it raised it
        rank_0_of_two("ValueError: exists").together(lambda: (_ for _ in ()).throw(ValueError("exists")))
    with pytest.raises(RootFailed, match=r"^rank 0 failed writing the checkpoint: IsADirectoryError: .*"):
        rank_0_of_two(None).on_root(lambda: open(tmp_path, "w"), "writing the checkpoint")  # noqa: SIM115 - it raises


# ---- under mpirun -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def readme_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's fit example, unchanged, under ``mpirun -n 2``."""
    directory = tmp_path_factory.mktemp("readme2")
    write_example(directory)
    done = mpi_fit(2, *README_COMMAND.split(), "--threads", "1", cwd=directory)
    assert done.returncode == 0, done.stdout + done.stderr
    (directory / "stdout.txt").write_text(done.stdout)
    return directory


@needs_mpi
def test_the_readmes_fit_example_under_two_ranks_prints_once_and_exports_what_it_validated(
    readme_two_ranks: Path,
) -> None:
    ort = pytest.importorskip("onnxruntime")
    lines = (readme_two_ranks / "stdout.txt").read_text().splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == [f"epoch {n}/6" for n in range(1, 7)]  # rank 0 alone prints
    assert lines.count("trained model: trained.onnx") == 1 and lines.count("curves: curves.png") == 1
    val = dict(np.load(readme_two_ranks / "val.npz"))
    session = ort.InferenceSession(str(readme_two_ranks / "trained.onnx"), providers=["CPUExecutionProvider"])
    accuracy = np.mean(np.argmax(session.run(None, {"pixels": val["pixels"]})[0], axis=1) == val["target"])
    last = float(epochs[-1].split("val accuracy ")[1].rstrip("%"))  # validation split over the ranks, reduced
    assert last == pytest.approx(100 * accuracy, abs=0.05) and accuracy > 0.5
    assert fit_state(readme_two_ranks / "run.safetensors")["epoch"] == 6


@needs_mpi
def test_a_rank_killed_in_an_epoch_resumes_on_one_process_or_three_ranks(
    readme_two_ranks: Path, tmp_path: Path
) -> None:
    write_example(tmp_path)
    killed = mpi_fit(2, *README_COMMAND.split(), "--threads", "1", cwd=tmp_path, env={"FIT_KILL_STEP": "1:50"})
    assert killed.returncode != 0, killed.stdout  # update 51 is in epoch 4 (15 per epoch): the job ends
    assert fit_state(tmp_path / "run.safetensors")["epoch"] == 3 and not (tmp_path / "trained.onnx").exists()
    reference = readme_two_ranks / "trained.onnx"
    resumes = {"one": (1, []), "accumulated": (1, ["--batch-size", "16", "--accumulate", "2"]), "three": (3, [])}
    for name, (ranks, extra) in resumes.items():
        directory = tmp_path / name
        shutil.copytree(tmp_path, directory, ignore=shutil.ignore_patterns("one", "accumulated", "three"))
        args = [*README_COMMAND.split(), "--threads", "1", "--resume", *extra]
        done = mpi_fit(ranks, *args, cwd=directory) if ranks > 1 else cli("fit", *args, cwd=directory)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "resuming run.safetensors: epoch 4, after update 0 of 15" in done.stdout
        assert_close_weights(directory / "trained.onnx", reference)
    # One process adding 2 micro-batches does the 2 ranks' arithmetic: the same bytes.
    assert (tmp_path / "accumulated" / "trained.onnx").read_bytes() == reference.read_bytes()


@needs_mpi
def test_four_ranks_with_empty_shards_and_rank_0_killed_in_a_checkpoint_write(tmp_path: Path) -> None:
    onnx.save(build_classifier(8, seed=0), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "train.npz", **rule_data(66, 0))  # updates of 16: the last 2 rows, 2 ranks get none
    np.savez(tmp_path / "val.npz", **rule_data(3, 1))  # rank 3 validates nothing
    common = ["model.onnx", "--data", "train.npz", "--val", "val.npz", "--loss", "cross_entropy", "--optimizer",
              "adamw", "--lr", "0.02", "--epochs", "3", "--threads", "1", "--checkpoint", "run.safetensors",
              "--out", "trained.onnx"]  # fmt: skip
    reference = tmp_path / "one"
    reference.mkdir()
    for name in ("model.onnx", "train.npz", "val.npz"):
        shutil.copy(tmp_path / name, reference / name)
    done = cli("fit", *common, "--batch-size", "16", cwd=reference)
    assert done.returncode == 0, done.stderr
    # 4 ranks, micro-batches of 8 (2 rows a rank), 2 per update; rank 0 dies half way through epoch 2's checkpoint.
    rows = tmp_path / "rows"
    rows.mkdir()
    faults = {"FIT_KILL_WRITE": "2", "FIT_ROWS": str(rows)}
    killed = mpi_fit(4, *common, "--batch-size", "8", "--accumulate", "2", cwd=tmp_path, env=faults)
    assert killed.returncode != 0, killed.stdout
    # Each rank read its part of each micro-batch of epoch 1's order (fit's generator, seed 0), nothing more.
    order = np.random.Generator(np.random.PCG64(0)).permutation(66)
    micro = [part for start in range(0, 66, 16) for part in np.array_split(order[start : start + 16], 2)]
    for rank in range(4):
        read = [json.loads(line) for line in (rows / f"rank-{rank}.jsonl").read_text().splitlines()][: len(micro)]
        assert read == [part[shard(len(part), rank, 4)].tolist() for part in micro], rank
    assert [len(part[shard(len(part), 3, 4)]) for part in micro[-2:]] == [0, 0]  # the last update: 1 + 1 rows
    saved = fit_state(tmp_path / "run.safetensors")  # the previous checkpoint, whole
    assert saved["epoch"] == 1
    expected = fit_state(reference / "run.safetensors")["history"][0]
    for key in ("train_loss", "val_loss", "val_accuracy"):
        assert saved["history"][0][key] == pytest.approx(expected[key], rel=1e-5), key
    resumed = mpi_fit(2, *common, "--batch-size", "16", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.count("epoch 3/3") == 1
    assert_close_weights(tmp_path / "trained.onnx", reference / "trained.onnx")
