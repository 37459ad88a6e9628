"""``ortlstm fit``: data checks, the loop, schedules, checkpoints and resume, the CLI end to end.

Oracles: torch's documented scheduler formulas worked by hand (and torch's own schedulers when
torch is installed); an uninterrupted run's parameters for resume (bitwise); the exported model
run in plain onnxruntime without the ortlstm library for the validation figures; the process's
exit status, files and output for the CLI.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlstm import fit as fitting
from ortlstm.demo import build_classifier
from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = 8
CLASSES = 8  # the rule's classes; the classifier has 10 outputs


def rule_data(count: int, seed: int) -> dict[str, np.ndarray]:
    """Samples: pixels [N, 8, 8], one of 8 fixed random patterns (the target) plus as much uniform noise."""
    patterns = np.random.default_rng(12345).uniform(0, 1, (CLASSES, 8, 8))
    rng = np.random.default_rng(seed)
    target = rng.integers(0, CLASSES, count)
    pixels = 0.5 * patterns[target] + 0.5 * rng.uniform(0, 1, (count, 8, 8))
    return {"pixels": pixels.astype(np.float32), "target": target.astype(np.int64)}


def classifier_trainer(model: onnx.ModelProto | None = None, lr: float = 0.02) -> tuple[Trainer, onnx.ModelProto]:
    model = model if model is not None else build_classifier(HIDDEN, seed=0)
    trainer = Trainer(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(lr=lr), threads=1)
    return trainer, model


def run(
    tmp_path: Path, epochs: int = 3, schedule: fitting.Schedule | None = None, **options: object
) -> fitting.FitResult:
    trainer, model = classifier_trainer()
    return fitting.fit(
        trainer,
        rule_data(90, 0),
        model=model,
        epochs=epochs,
        batch_size=16,
        seed=3,
        schedule=schedule,
        log=lambda line: None,
        **options,  # type: ignore[arg-type]
    )


def params(trainer: Trainer) -> dict[str, np.ndarray]:
    return trainer.parameters


# ---- schedules: torch's documented formulas, worked by hand ---------------------------------------

HALF_SQRT2 = math.sqrt(2.0) / 2.0


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # StepLR(step_size=3, gamma=0.5): lr * gamma ** (n // 3)
        (fitting.Schedule("step", 1.0, step_size=3, gamma=0.5), [1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25]),
        # CosineAnnealingLR(T_max=4, eta_min=0.01): 0.01 + 0.09 * (1 + cos(pi n / 4)) / 2
        (
            fitting.Schedule("cosine", 0.1, total=4, eta_min=0.01),
            [0.1, 0.01 + 0.09 * (1 + HALF_SQRT2) / 2, 0.055, 0.01 + 0.09 * (1 - HALF_SQRT2) / 2, 0.01],
        ),
        # LinearLR(start_factor=0.25, total_iters=4) then CosineAnnealingLR(T_max=8 - 4) from n = 4
        (
            fitting.Schedule("linear-warmup", 0.8, total=8, warmup=4, start_factor=0.25),
            [0.2, 0.35, 0.5, 0.65, 0.8, 0.8 * (1 + HALF_SQRT2) / 2, 0.4, 0.8 * (1 - HALF_SQRT2) / 2],
        ),
        # stepped per epoch of 3 updates: StepLR(step_size=1, gamma=0.5) over updates 0..6
        (
            fitting.Schedule("step", 1.0, unit="epoch", steps_per_epoch=3, step_size=1, gamma=0.5),
            [1, 1, 1, 0.5, 0.5, 0.5, 0.25],
        ),
        (fitting.Schedule("constant", 0.3), [0.3, 0.3, 0.3]),
    ],
    ids=["step", "cosine", "linear_warmup_cosine", "step_per_epoch", "constant"],
)
def test_schedules_follow_torchs_formulas(schedule: fitting.Schedule, expected: list[float]) -> None:
    np.testing.assert_allclose([schedule(n) for n in range(len(expected))], expected, rtol=1e-15, atol=1e-17)


def test_schedules_match_torchs_schedulers_when_torch_is_installed() -> None:
    torch = pytest.importorskip("torch")

    def torch_lrs(make: object, steps: int) -> list[float]:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        scheduler = make(optimizer)  # type: ignore[operator]
        values = []
        for _ in range(steps):
            values.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return values

    lr_scheduler = torch.optim.lr_scheduler
    cases = {
        "step": (
            lambda o: lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
            fitting.Schedule("step", 0.1, step_size=3, gamma=0.5),
        ),
        "cosine": (
            lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
            fitting.Schedule("cosine", 0.1, total=10, eta_min=0.001),
        ),
        "warmup": (
            lambda o: lr_scheduler.SequentialLR(
                o,
                [lr_scheduler.LinearLR(o, start_factor=0.2, total_iters=3), lr_scheduler.CosineAnnealingLR(o, T_max=7)],
                milestones=[3],
            ),
            fitting.Schedule("linear-warmup", 0.1, total=10, warmup=3, start_factor=0.2),
        ),
    }
    for name, (make, schedule) in cases.items():
        np.testing.assert_allclose([schedule(n) for n in range(10)], torch_lrs(make, 10), rtol=1e-12, err_msg=name)


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match="--schedule step needs --step-size"):
        fitting.Schedule("step", 0.1)
    with pytest.raises(ValueError, match=r"needs 0 <= --warmup \(9\) < T_max \(4"):
        fitting.Schedule("linear-warmup", 0.1, total=4, warmup=9)


# ---- data checks, before anything is trained ------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("target"), r"missing array\(s\) 'target' \(cross_entropy's class indices, int64 or int32"),
        (
            lambda d: d.pop("pixels"),
            r"missing array\(s\) 'pixels' \(model input, float32 \[batch, 8, 8\] \(batch axis 0\)\)",
        ),
        (
            lambda d: d.update(pixels=d["pixels"].astype(np.float64)),
            r"array 'pixels' \(model input\) must be float32 \[batch, 8, 8\] \(batch axis 0\), got float64 "
            r"\[40, 8, 8\]; pass it as array.astype\(np.float32\)",
        ),
        (
            lambda d: d.update(pixels=d["pixels"][:, :, :5]),
            r"array 'pixels' \(model input\) must be float32 \[batch, 8, 8\] \(batch axis 0\), "
            r"got float32 \[40, 8, 5\]",
        ),
        (
            lambda d: d.update(target=d["target"].astype(np.float64)),
            r"array 'target' .* must be int64 or int32 or float32 .*got float64",
        ),
        (
            lambda d: d.update(target=d["target"][:39]),
            r"different numbers of samples along their batch axes \('pixels': 40 \(axis 0\), 'target': 39 \(axis 0\)\)",
        ),
        (
            lambda d: d.update(labels=d["target"]),
            r"array\(s\) \['labels'\] feed nothing; the fit reads \['pixels', 'target'\]",
        ),
        (lambda d: d.update(target=np.full(40, 10)), r"class index 10 is out of range for 10 classes"),
    ],
    ids=["missing_target", "missing_input", "dtype", "shape", "target_dtype", "lengths", "unknown", "label_range"],
)
def test_bad_data_is_refused_with_the_arrays_name_before_training(change: object, message: str) -> None:
    data = rule_data(40, 0)
    change(data)  # type: ignore[operator]
    trainer, model = classifier_trainer()
    before = params(trainer)
    with pytest.raises(ValueError, match=message):
        fitting.fit(trainer, data, model=model, epochs=1, batch_size=8, log=lambda line: None, data_name="train.npz")
    assert trainer.global_step == 0
    for name, value in params(trainer).items():
        np.testing.assert_array_equal(value, before[name])


def test_validation_data_is_checked_before_training_too() -> None:
    trainer, model = classifier_trainer()
    val = rule_data(20, 1)
    val["pixels"] = val["pixels"][:, :4]
    with pytest.raises(ValueError, match=r"^val.npz: array 'pixels'"):
        fitting.fit(
            trainer,
            rule_data(40, 0),
            model=model,
            val=val,
            epochs=1,
            batch_size=8,
            log=lambda line: None,
            val_name="val.npz",
        )
    assert trainer.global_step == 0


def time_major_classifier() -> onnx.ModelProto:
    """The demo classifier reading rows [8 steps, batch, 8 pixels]: its input declares the batch on axis 1."""
    model = build_classifier(HIDDEN, seed=0)
    graph = model.graph
    transpose = graph.node[0]
    graph.node.remove(transpose)
    for node in graph.node:
        node.input[:] = ["rows_in" if name == "rows" else name for name in node.input]
    del graph.input[:]
    graph.input.append(helper.make_tensor_value_info("rows_in", TensorProto.FLOAT, [8, "batch", 8]))
    return model


def test_the_batch_axis_follows_the_declared_layout_and_can_be_set_per_array() -> None:
    trainer, model = classifier_trainer(time_major_classifier())
    specs = fitting.data_specs(trainer, model)
    assert (specs["rows_in"].batch_axis, specs["target"].batch_axis) == (1, 0)
    data = rule_data(24, 0)
    time_major = {"rows_in": np.ascontiguousarray(data["pixels"].transpose(1, 0, 2)), "target": data["target"]}
    fitting.fit(trainer, time_major, model=model, epochs=1, batch_size=8, seed=5, log=lambda line: None)
    # The same samples, batch-major: the batch-major model trains to the same parameters (same order).
    reference, reference_model = classifier_trainer()
    fitting.fit(reference, data, model=reference_model, epochs=1, batch_size=8, seed=5, log=lambda line: None)
    for name, value in params(reference).items():
        np.testing.assert_allclose(params(trainer)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # A model whose dims name no batch: axis 0 by default, --batch-axis says otherwise.
    model = time_major_classifier()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "s1"
    trainer, model = classifier_trainer(model)
    assert fitting.data_specs(trainer, model)["rows_in"].batch_axis == 0
    with pytest.raises(
        ValueError, match=r"\('rows_in': 8 \(axis 0\), 'target': 24 \(axis 0\)\); .*--batch-axis NAME=AXIS"
    ):
        fitting.check_data(time_major, fitting.data_specs(trainer, model), "d")
    specs = fitting.data_specs(trainer, model, {"rows_in": 1})
    assert specs["rows_in"].batch_axis == 1
    assert fitting.check_data(time_major, specs, "d") == 24
    with pytest.raises(
        ValueError, match=r"--batch-axis labels=0: no such array; the fit reads \['rows_in', 'target'\]"
    ):
        fitting.data_specs(trainer, model, {"labels": 0})


def test_npz_safetensors_and_a_folder_of_npy_read_alike_and_other_files_are_refused(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    data = rule_data(10, 0)
    np.savez(tmp_path / "data.npz", **data)
    save_file(data, str(tmp_path / "data.safetensors"))
    (tmp_path / "folder").mkdir()
    for key, value in data.items():
        np.save(tmp_path / "folder" / f"{key}.npy", value)
    assert isinstance(fitting.read_arrays(tmp_path / "folder")["pixels"], np.memmap)
    for name in ("data.npz", "data.safetensors", "folder"):
        read = fitting.read_arrays(tmp_path / name)
        assert sorted(read) == ["pixels", "target"]
        for key, value in data.items():
            assert np.array_equal(read[key], value)
            assert read[key].dtype == value.dtype
    trained = []
    for name in ("data.npz", "folder"):  # memory-mapped rows train as loaded ones
        trainer, model = classifier_trainer()
        arrays = fitting.read_arrays(tmp_path / name)
        fitting.fit(trainer, arrays, model=model, epochs=1, batch_size=4, log=lambda line: None)
        trained.append(params(trainer))
    for key, value in trained[0].items():
        assert np.array_equal(trained[1][key], value), key
    (tmp_path / "data.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match=r"expected a .npz \(np.savez\(path, name=array, ...\)\) or .safetensors"):
        fitting.read_arrays(tmp_path / "data.csv")
    with pytest.raises(FileNotFoundError, match="no data file"):
        fitting.read_arrays(tmp_path / "missing.npz")


# ---- the loop -------------------------------------------------------------------------------------


def test_every_sample_once_per_epoch_in_a_seeded_order_with_the_ragged_batch_kept(tmp_path: Path) -> None:
    seen: list[int] = []
    data = rule_data(21, 0)
    data["pixels"][:, 0, 0] = np.arange(21)  # tags each sample
    trainer, model = classifier_trainer()
    original_step = trainer.step

    def spy(**named: object) -> object:
        seen.extend(int(tag) for tag in np.asarray(named["pixels"])[:, 0, 0])
        return original_step(**named)

    trainer.step = spy  # type: ignore[method-assign]
    fitting.fit(trainer, data, model=model, epochs=2, batch_size=8, seed=7, log=lambda line: None)
    assert trainer.global_step == 6  # 8 + 8 + 5, twice
    generator = np.random.Generator(np.random.PCG64(7))
    expected = [*generator.permutation(21), *generator.permutation(21)]
    assert seen == [int(index) for index in expected]
    assert sorted(seen[:21]) == list(range(21))
    assert seen[:21] != seen[21:]


def test_validation_figures_match_the_exported_model_in_plain_onnxruntime(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    val = rule_data(50, 9)
    result = run(tmp_path, epochs=2, val=val, out=tmp_path / "trained.onnx")
    session = ort.InferenceSession(str(tmp_path / "trained.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"pixels": val["pixels"]})[0].astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(50), val["target"]].mean()
    last = result.history[-1]
    assert last.val_accuracy == np.mean(np.argmax(logits, axis=1) == val["target"])
    assert last.val_loss == pytest.approx(loss, rel=1e-5)
    assert [record.epoch for record in result.history] == [1, 2]


def ctc_model() -> onnx.ModelProto:
    """Logits [N, T, 6] = x [N, T, 8] @ W + B: batch-first logits for ctc_loss."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["logits"])],
        "ctc_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "T", 6])],
        [
            numpy_helper.from_array(rng.normal(0, 0.5, (8, 6)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.normal(0, 0.1, 6).astype(np.float32), "B"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_ctc_fit_reads_the_lengths_and_reports_the_cer_of_the_greedy_reading() -> None:
    ort = pytest.importorskip("onnxruntime")
    from ortlstm.metrics import character_error_rate, ctc_greedy_decode

    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 4, 12)
    labels = np.zeros((12, 3), np.int64)
    for row, length in enumerate(lengths):
        labels[row, :length] = rng.integers(1, 6, length)
    data = {"x": rng.normal(size=(12, 10, 8)).astype(np.float32), "target": labels, "target_lengths": lengths}
    model = ctc_model()
    trainer = Trainer(
        model, loss=losses.Loss.ctc_loss(input="logits", batch_first=True), optimizer=optimizers.Adam(lr=0.05)
    )
    specs = fitting.data_specs(trainer, model)
    assert list(specs) == ["x", "target", "input_lengths", "target_lengths"]
    assert not specs["input_lengths"].required
    result = fitting.fit(trainer, data, model=model, val=data, epochs=3, batch_size=5, log=lambda line: None)
    exported = trainer.export()
    logits = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": data["x"]}
    )[0]
    references = [list(row[:n]) for row, n in zip(labels, lengths, strict=True)]
    expected = character_error_rate(ctc_greedy_decode(logits, time_major=False), references)
    assert result.history[-1].val_cer == expected
    assert result.history[-1].val_accuracy is None
    with pytest.raises(ValueError, match=r"missing array\(s\) 'target_lengths' \(ctc_loss's target_lengths"):
        fitting.fit(trainer, {"x": data["x"], "target": labels}, model=model, epochs=1, batch_size=5)


# ---- checkpoints and resume -----------------------------------------------------------------------


def test_an_interrupted_run_resumes_bitwise_to_the_uninterrupted_parameters(tmp_path: Path) -> None:
    schedule = fitting.Schedule("linear-warmup", 0.02, warmup=3)
    straight = run(tmp_path, epochs=3, schedule=schedule)
    checkpoint = tmp_path / "run.safetensors"

    def stop(info: fitting.StepInfo) -> None:
        if info.global_step == 9:  # epoch 2, update 3 of 6
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, epochs=3, schedule=schedule, checkpoint=checkpoint, callback=stop)
    saved, state = fitting.read_fit_state(checkpoint)
    assert (state.epoch, state.steps_in_epoch, len(state.history)) == (1, 3, 1)
    assert saved["batch_size"] == 16
    assert saved["schedule"]["total"] == 18
    assert [path.name for path in tmp_path.iterdir()] == ["run.safetensors"]  # no temporary left
    resumed = run(tmp_path, epochs=3, schedule=schedule, checkpoint=checkpoint, resume=True)
    assert resumed.resumed_from == (1, 3)
    assert resumed.trainer.global_step == straight.trainer.global_step == 18
    for name, value in params(straight.trainer).items():
        assert np.array_equal(params(resumed.trainer)[name], value), name
    for name, slots in straight.trainer.optimizer_state.items():
        for slot, value in slots.items():
            assert np.array_equal(resumed.trainer.optimizer_state[name][slot], value), (name, slot)
    assert [r.train_loss for r in resumed.history] == [r.train_loss for r in straight.history]


def test_k_epochs_then_resumed_to_n_equals_n_epochs_straight(tmp_path: Path) -> None:
    straight = run(tmp_path, epochs=4)
    checkpoint = tmp_path / "run.safetensors"
    run(tmp_path, epochs=2, checkpoint=checkpoint)
    # The checkpoint is a Trainer checkpoint as any other.
    assert Trainer.from_checkpoint(build_classifier(HIDDEN, seed=0), checkpoint).global_step == 12
    resumed = run(tmp_path, epochs=4, checkpoint=checkpoint, resume=True)
    for name, value in params(straight.trainer).items():
        assert np.array_equal(params(resumed.trainer)[name], value), name
    with pytest.raises(ValueError, match=r"exists: pass --resume to continue that run"):
        run(tmp_path, epochs=4, checkpoint=checkpoint)
    with pytest.raises(ValueError, match=r"other settings \(schedule: saved"):
        run(tmp_path, epochs=6, checkpoint=checkpoint, resume=True, schedule=fitting.Schedule("cosine", 0.02))


def test_a_failed_checkpoint_write_leaves_the_previous_checkpoint_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = tmp_path / "run.safetensors"
    first = run(tmp_path, epochs=1, checkpoint=checkpoint)
    before = checkpoint.read_bytes()
    import safetensors.numpy

    def fail(tensors: dict[str, np.ndarray], filename: str, metadata: dict[str, str]) -> None:
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", fail)
    with pytest.raises(OSError, match="disk full"):
        fitting.save_checkpoint(first.trainer, checkpoint, {}, fitting.FitState(2, 0, {}))
    assert checkpoint.read_bytes() == before
    assert [path.name for path in tmp_path.iterdir()] == ["run.safetensors"]


# ---- the command line, end to end -----------------------------------------------------------------


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m ortlstm ARGS`` with this interpreter and its installed ortlstm (cwd outside the checkout)."""
    return subprocess.run(
        [sys.executable, "-m", "ortlstm", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def write_example(directory: Path) -> None:
    onnx.save(build_classifier(16, seed=0), str(directory / "model.onnx"))
    np.savez(directory / "train.npz", **rule_data(480, 0))
    np.savez(directory / "val.npz", **rule_data(160, 1))


README_COMMAND = (
    "model.onnx --data train.npz --val val.npz --loss cross_entropy --optimizer adamw --lr 1e-2 --epochs 6 "
    "--batch-size 32 --schedule cosine --checkpoint run.safetensors --out trained.onnx --plot curves.png"
)


def test_the_readmes_fit_example_end_to_end(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    assert f"ortlstm fit {README_COMMAND}" in " ".join((ROOT / "README.md").read_text().replace("\\\n", " ").split())
    write_example(tmp_path)
    done = cli("fit", *README_COMMAND.split(), "--threads", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 6, done.stdout  # one line per epoch off a terminal, no progress bar
    assert "\r" not in done.stdout + done.stderr
    first, last = (float(line.split("val accuracy ")[1].rstrip("%")) for line in (epochs[0], epochs[-1]))
    val = dict(np.load(tmp_path / "val.npz"))
    session = ort.InferenceSession(str(tmp_path / "trained.onnx"), providers=["CPUExecutionProvider"])
    accuracy = np.mean(np.argmax(session.run(None, {"pixels": val["pixels"]})[0], axis=1) == val["target"])
    assert last == pytest.approx(100 * accuracy, abs=0.05)
    assert accuracy > 0.5, done.stdout  # chance is 1/8
    assert last > first + 20, done.stdout
    state = json.loads(checkpoint_metadata(tmp_path / "run.safetensors")[fitting.FIT_METADATA_KEY])
    assert state["state"]["epoch"] == 6
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        assert "no plot: matplotlib is not installed" in done.stdout
    else:
        assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def checkpoint_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as reader:
        return dict(reader.metadata())


def test_cli_refuses_bad_data_naming_the_array(tmp_path: Path) -> None:
    write_example(tmp_path)
    data = rule_data(40, 0)
    np.savez(tmp_path / "bad.npz", pixels=data["pixels"].astype(np.float64), target=data["target"])
    command = (
        "model.onnx --data bad.npz --loss cross_entropy --optimizer adamw --epochs 1 --batch-size 8 --out trained.onnx"
    )
    done = cli("fit", *command.split(), cwd=tmp_path)
    assert done.returncode == 1
    assert "ortlstm fit: error: bad.npz: array 'pixels' (model input) must be float32 [batch, 8, 8]" in done.stderr
    assert not (tmp_path / "trained.onnx").exists()


def test_cli_reaches_the_trainers_options(tmp_path: Path) -> None:
    write_example(tmp_path)
    command = (
        "model.onnx --data train.npz --loss cross_entropy --loss-option label_smoothing=0.1 --optimizer sgd "
        "--lr 0.1 --weight-decay 0.01 --clip-grad-norm 1.0 --frozen head.* --fixed-shape pixels=?,8,8 "
        "--schedule step --step-size 1 --schedule-unit epoch --epochs 2 --batch-size 64 --threads 1 --out trained.onnx"
    )
    done = cli("fit", *command.split(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [line.split(", ")[1] for line in done.stdout.splitlines()[:2]] == ["lr 0.1", "lr 0.01"]
    before, after = (
        {init.name: numpy_helper.to_array(init) for init in onnx.load(str(tmp_path / name)).graph.initializer}
        for name in ("model.onnx", "trained.onnx")
    )
    assert np.array_equal(before["head.weight"], after["head.weight"])
    assert not np.array_equal(before["lstm.W"], after["lstm.W"])


def test_a_terminal_gets_a_progress_bar(tmp_path: Path) -> None:
    pytest.importorskip("tqdm")
    pty = pytest.importorskip("pty")
    write_example(tmp_path)
    controller, terminal = pty.openpty()
    command = "model.onnx --data train.npz --loss cross_entropy --optimizer adamw --epochs 2 --batch-size 32"
    done = subprocess.run(
        [sys.executable, "-m", "ortlstm", "fit", *command.split()],
        cwd=tmp_path,
        stdout=terminal,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    os.close(terminal)
    shown = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(controller, 65536):
            shown += chunk
    os.close(controller)
    assert done.returncode == 0, done.stderr
    assert "epoch 2/2" in done.stderr  # the bar's description, on stderr
    assert "15/15" in done.stderr  # 480 samples in batches of 32
    assert shown.decode().count("epoch ") == 2  # the epoch lines still go to stdout


def test_sigint_saves_a_checkpoint_and_the_resumed_run_exports_the_uninterrupted_model(tmp_path: Path) -> None:
    write_example(tmp_path)
    common = [
        "model.onnx",
        "--data",
        "train.npz",
        "--loss",
        "cross_entropy",
        "--optimizer",
        "adam",
        "--lr",
        "1e-2",
        "--batch-size",
        "4",
        "--epochs",
        "8",
        "--threads",
        "1",
        "--seed",
        "4",
    ]
    straight = cli("fit", *common, "--out", "straight.onnx", cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr
    process = subprocess.Popen(
        [sys.executable, "-m", "ortlstm", "fit", *common, "--checkpoint", "run.safetensors", "--out", "resumed.onnx"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "run.safetensors").exists() and time.monotonic() < deadline:  # after epoch 1 of 8
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted: saved run.safetensors after update" in stdout
    assert not (tmp_path / "resumed.onnx").exists()
    _, state = fitting.read_fit_state(tmp_path / "run.safetensors")
    assert 1 <= state.epoch < 8
    resumed = cli("fit", *common, "--checkpoint", "run.safetensors", "--resume", "--out", "resumed.onnx", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("resuming run.safetensors: epoch")
    straight_model, resumed_model = (onnx.load(str(tmp_path / name)) for name in ("straight.onnx", "resumed.onnx"))
    for a, b in zip(straight_model.graph.initializer, resumed_model.graph.initializer, strict=True):
        assert np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b)), a.name
