"""``ortlstm fit``: data checks, the loop, schedules, checkpoints and resume, the CLI end to end.

Oracles: torch's documented scheduler formulas worked by hand (and torch's own schedulers when
torch is installed); an uninterrupted run's parameters for resume (bitwise); the exported model
run in plain onnxruntime without the ortlstm library for the validation figures; the process's
exit status, files and output for the CLI.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
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


def classifier_trainer(
    model: onnx.ModelProto | None = None, lr: float = 0.02, **options: object
) -> tuple[Trainer, onnx.ModelProto]:
    """The classifier's trainer (cross_entropy, AdamW, 1 thread; ``options``: other Trainer keywords) and model."""
    model = model if model is not None else build_classifier(HIDDEN, seed=0)
    trainer = Trainer(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(lr=lr), threads=1, **options)  # type: ignore[arg-type]
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
        schedule=schedule,
        **{"seed": 3, "log": lambda line: None, **options},  # type: ignore[arg-type]
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
            r"array 'target' \(cross_entropy's class indices\) must be int64 or int32 \[batch\] \(batch axis 0\), "
            r"got float64 \[40\]; pass it as array.astype\(np.int64\); class probabilities need",
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
    with pytest.raises(ValueError, match=r"was trained with schedule=None, this run has schedule=cosine \(pass"):
        run(tmp_path, epochs=6, checkpoint=checkpoint, resume=True, schedule=fitting.Schedule("cosine", 0.02))


def test_a_resume_with_other_settings_names_only_the_options_that_differ(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run.safetensors"
    constant = fitting.Schedule("constant", 0.02)
    run(tmp_path, epochs=1, checkpoint=checkpoint, schedule=constant)

    def refusal(before: str, now: str, same: str = "the same option") -> str:
        return re.escape(
            f"--resume: the checkpoint {checkpoint} was trained with {before}, this run has {now} (pass {same}, or "
            "start a new run without --resume)"
        )

    with pytest.raises(ValueError, match=refusal("lr=0.02", "lr=0.01")):
        run(tmp_path, epochs=2, checkpoint=checkpoint, resume=True, schedule=fitting.Schedule("constant", 0.01))
    with pytest.raises(ValueError, match=refusal("seed=3 and lr=0.02", "seed=4 and lr=0.01", "the same options")):
        run(tmp_path, epochs=2, checkpoint=checkpoint, resume=True, seed=4, schedule=fitting.Schedule("constant", 0.01))
    model = build_classifier(HIDDEN, seed=0)
    trainer = Trainer(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.AdamW(weight_decay=0.1), threads=1)
    with pytest.raises(ValueError, match=refusal("weight_decay=0.01", "weight_decay=0.1")):
        fitting.fit(
            trainer, rule_data(90, 0), model=model, epochs=2, batch_size=16, seed=3, schedule=constant,
            checkpoint=checkpoint, resume=True, log=lambda line: None,
        )  # fmt: skip
    run_on_fewer = classifier_trainer()
    with pytest.raises(ValueError, match=refusal("samples=90", "samples=80", "the same data")):
        fitting.fit(
            run_on_fewer[0], rule_data(80, 0), model=run_on_fewer[1], epochs=2, batch_size=16, seed=3,
            schedule=constant, checkpoint=checkpoint, resume=True, log=lambda line: None,
        )  # fmt: skip
    with pytest.raises(ValueError, match=refusal("seed=3 and samples=90", "seed=5 and samples=80",
                                                 "the same option and the same data")):  # fmt: skip
        fitting.fit(
            run_on_fewer[0], rule_data(80, 0), model=run_on_fewer[1], epochs=2, batch_size=16, seed=5,
            schedule=constant, checkpoint=checkpoint, resume=True, log=lambda line: None,
        )  # fmt: skip
    # A cosine schedule spans the run: its epochs are named, not its length in updates.
    cosine = tmp_path / "cosine.safetensors"
    run(tmp_path, epochs=1, checkpoint=cosine, schedule=fitting.Schedule("cosine", 0.02))
    with pytest.raises(ValueError, match=re.escape("was trained with epochs=1, this run has epochs=2 (pass the same")):
        run(tmp_path, epochs=2, checkpoint=cosine, resume=True, schedule=fitting.Schedule("cosine", 0.02))


def test_resuming_a_finished_run_says_so_trains_nothing_and_still_exports(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run.safetensors"
    first = run(tmp_path, epochs=2, checkpoint=checkpoint, out=tmp_path / "first.onnx")
    finished = f"{checkpoint}: the run already finished its 2 epochs; pass --epochs N with N > 2 to train further"
    lines: list[str] = []
    again = run(tmp_path, epochs=2, checkpoint=checkpoint, resume=True, out=tmp_path / "again.onnx", log=lines.append)
    assert lines == [finished]
    assert again.trainer.global_step == first.trainer.global_step == 12
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "first.onnx").read_bytes()
    lines.clear()
    run(tmp_path, epochs=1, checkpoint=checkpoint, resume=True, log=lines.append)  # fewer epochs than done
    assert lines == [finished]
    cosine = tmp_path / "cosine.safetensors"
    run(tmp_path, epochs=1, checkpoint=cosine, schedule=fitting.Schedule("cosine", 0.02))
    lines.clear()
    run(tmp_path, epochs=1, checkpoint=cosine, resume=True, schedule=fitting.Schedule("cosine", 0.02), log=lines.append)
    assert lines == [f"{cosine}: the run already finished its 1 epoch; its schedule ends there (start a new run to "
                     "train further)"]  # fmt: skip


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_checkpoints_get_the_mode_open_gives_not_mkstemps_0600(tmp_path: Path) -> None:
    """fit's checkpoint, Trainer.save and a training directory: 0o666 less the umask, as any file the user writes."""
    for mask, expected in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        folder = tmp_path / f"umask{mask:03o}"
        folder.mkdir()
        with umask(mask):
            result = run(tmp_path, epochs=1, checkpoint=folder / "run.safetensors")
            result.trainer.save(folder / "trainer.safetensors")
            result.trainer.write(folder / "directory")
            reference = folder / "open.txt"
            reference.write_text("")
        files = [folder / "run.safetensors", folder / "trainer.safetensors", *(folder / "directory").iterdir()]
        assert {path.name: oct(path.stat().st_mode & 0o777) for path in files} == {
            path.name: oct(expected) for path in files
        }, f"umask {mask:03o}"
        assert reference.stat().st_mode & 0o777 == expected
    # A file that exists keeps its own mode, as open() keeps it.
    checkpoint = tmp_path / "umask022" / "run.safetensors"
    checkpoint.chmod(0o640)
    with umask(0o022):
        run(tmp_path, epochs=2, checkpoint=checkpoint, resume=True)
    assert checkpoint.stat().st_mode & 0o777 == 0o640


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


def test_cli_resume_of_another_lr_or_of_a_finished_run_says_what_to_do(tmp_path: Path) -> None:
    onnx.save(build_classifier(HIDDEN, seed=0), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "train.npz", **rule_data(64, 0))
    common = ["fit", "model.onnx", "--data", "train.npz", "--loss", "cross_entropy", "--optimizer", "adamw",
              "--epochs", "2", "--batch-size", "32", "--threads", "1", "--checkpoint", "run.safetensors"]  # fmt: skip
    first = cli(*common, "--lr", "0.01", "--out", "first.onnx", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    other = cli(*common, "--lr", "0.001", "--resume", cwd=tmp_path)
    assert other.returncode == 1
    assert other.stderr == (
        "ortlstm fit: error: --resume: the checkpoint run.safetensors was trained with lr=0.01, this run has "
        "lr=0.001 (pass the same option, or start a new run without --resume)\n"
    )
    done = cli(*common, "--lr", "0.01", "--resume", "--out", "again.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "run.safetensors: the run already finished its 2 epochs; pass --epochs N with N > 2 to train further\n"
        "trained model: again.onnx\n"
    )
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "first.onnx").read_bytes()


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


# ---- shards: a folder of files read as one memory-mapped dataset ----------------------------------

SHARD_SIZES = (7, 13, 10)  # uneven, so that batches straddle the boundaries


def write_shards(directory: Path, data: dict[str, np.ndarray], kind: str, sizes: tuple[int, ...] = SHARD_SIZES) -> Path:
    """``data`` cut into shards of ``sizes`` rows: stored .npz, .safetensors, or subfolders of NAME.npy."""
    from safetensors.numpy import save_file

    directory.mkdir()
    bounds = np.cumsum((0, *sizes))
    for index, (first, end) in enumerate(itertools.pairwise(bounds)):
        shard = {name: np.ascontiguousarray(value[first:end]) for name, value in data.items()}
        if kind == "npz":
            np.savez(directory / f"train-{index:05d}.npz", **shard)
        elif kind == "safetensors":
            save_file(shard, str(directory / f"train-{index:05d}.safetensors"))
        else:
            (directory / f"{index:05d}").mkdir()
            for name, value in shard.items():
                np.save(directory / f"{index:05d}" / f"{name}.npy", value)
    return directory


@pytest.mark.parametrize("kind", ["npz", "safetensors", "npy"])
def test_a_folder_of_shards_is_one_memory_mapped_dataset_that_trains_as_the_whole(tmp_path: Path, kind: str) -> None:
    from ortlstm.datafiles import ShardedArray

    data = rule_data(sum(SHARD_SIZES), 0)
    arrays = fitting.read_arrays(write_shards(tmp_path / "shards", data, kind))
    assert sorted(arrays) == ["pixels", "target"]
    for name, value in data.items():
        array = arrays[name]
        assert isinstance(array, ShardedArray)
        assert all(isinstance(part, np.memmap) for part in array.parts)  # mapped, not read
        assert [len(part) for part in array.parts] == list(SHARD_SIZES)
        assert (array.shape, array.dtype) == (value.shape, value.dtype)
        rows = np.array([29, 0, 6, 7, 19, 20, 3, 7])  # across every boundary, repeated, out of order
        assert np.array_equal(array.take(rows), value[rows])
        assert np.array_equal(np.asarray(array), value)
    # Training on the shards equals training on the same rows in memory: the seeded order runs over all rows.
    trained = []
    for source in (data, arrays):
        trainer, model = classifier_trainer()
        fitting.fit(trainer, source, model=model, epochs=2, batch_size=8, seed=11, log=lambda line: None)
        trained.append(params(trainer))
    for name, value in trained[0].items():
        assert np.array_equal(trained[1][name], value), name


def test_safetensors_shards_map_the_bytes_safetensors_reads(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    from ortlstm.datafiles import map_shard

    tensors = {
        "f64": np.linspace(-1, 1, 12).reshape(3, 4),
        "i32": np.arange(-5, 5, dtype=np.int32),
        "u8": np.arange(7, dtype=np.uint8),
        "flags": np.array([True, False, True]),
        "f16": np.array([0.5, -2.0], dtype=np.float16),
    }
    save_file(tensors, str(tmp_path / "one.safetensors"), metadata={"note": "x"})
    mapped, loaded = map_shard(tmp_path / "one.safetensors"), load_file(str(tmp_path / "one.safetensors"))
    assert sorted(mapped) == sorted(loaded)
    for name, value in loaded.items():
        assert mapped[name].dtype == value.dtype, name
        assert np.array_equal(mapped[name], value), name


def shard_fit(directory: Path, **options: object) -> None:
    trainer, model = classifier_trainer()
    fitting.fit(
        trainer, fitting.read_arrays(directory), model=model, epochs=1, batch_size=8, log=lambda line: None, **options
    )  # type: ignore[arg-type]


def test_mismatched_shards_are_refused_before_training_naming_the_shard_the_array_and_both(tmp_path: Path) -> None:
    data = rule_data(30, 0)
    directory = write_shards(tmp_path / "names", data, "npz")
    np.savez(directory / "train-00001.npz", pixels=data["pixels"][7:20])
    with pytest.raises(
        ValueError,
        match=r"names: shard train-00001.npz holds the arrays \['pixels'\], the first shard \(train-00000.npz\) "
        r"\['pixels', 'target'\]; every shard needs the same arrays",
    ):
        fitting.read_arrays(directory)
    directory = write_shards(tmp_path / "dtype", data, "safetensors")
    from safetensors.numpy import save_file

    save_file(
        {"pixels": data["pixels"][20:].astype(np.float64), "target": data["target"][20:]},
        str(directory / "train-00002.safetensors"),
    )
    with pytest.raises(
        ValueError,
        match=r"shard train-00002.safetensors: array 'pixels' is float64 \[10, 8, 8\], the first shard "
        r"\(train-00000.safetensors\) holds float32 \[7, 8, 8\]; every shard needs the same dtype",
    ):
        fitting.read_arrays(directory)
    directory = write_shards(tmp_path / "shape", data, "npy")
    np.save(directory / "00001" / "pixels.npy", data["pixels"][7:20, :, :5])
    arrays = fitting.read_arrays(directory)
    trainer, model = classifier_trainer()
    with pytest.raises(
        ValueError,
        match=r"shape/00001: array 'pixels' is float32 \[13, 8, 5\], the first shard \(.*shape/00000\) holds "
        r"float32 \[7, 8, 8\]; the shards may differ only along the batch axis \(0\)",
    ):
        fitting.fit(trainer, arrays, model=model, epochs=1, batch_size=8, log=lambda line: None, data_name="shape")
    assert trainer.global_step == 0
    # Equal totals but misaligned shards: pixels 7 + 13, target 8 + 12 rows.
    directory = tmp_path / "rows"
    directory.mkdir()
    np.savez(directory / "a.npz", pixels=data["pixels"][:7], target=data["target"][:8])
    np.savez(directory / "b.npz", pixels=data["pixels"][7:20], target=data["target"][8:20])
    with pytest.raises(
        ValueError,
        match=r"shard .*a.npz: array 'target' holds 8 samples \(axis 0\), 'pixels' 7 \(axis 0\); the arrays ",
    ):
        shard_fit(directory)
    compressed = tmp_path / "compressed"
    compressed.mkdir()
    for name in ("a", "b"):
        np.savez_compressed(compressed / f"{name}.npz", **data)
    with pytest.raises(
        ValueError,
        match=r"a.npz: array 'pixels' is compressed \(np.savez_compressed\); a shard is memory-mapped, which needs "
        r"its arrays stored: write the shards with np.savez",
    ):
        fitting.read_arrays(compressed)
    mixed = tmp_path / "mixed"
    write_shards(mixed, data, "npz")
    np.save(mixed / "pixels.npy", data["pixels"])
    with pytest.raises(ValueError, match=r"holds both NAME.npy files and shards"):
        fitting.read_arrays(mixed)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: a folder without data; expected NAME.npy files .*, or shards"):
        fitting.read_arrays(tmp_path / "empty")


def test_an_interrupted_run_over_shards_resumes_bitwise(tmp_path: Path) -> None:
    data = rule_data(90, 0)
    directory = write_shards(tmp_path / "shards", data, "npz", sizes=(40, 25, 25))
    schedule = fitting.Schedule("cosine", 0.02)
    straight = run(tmp_path, epochs=3, schedule=schedule)  # the same rows in memory
    checkpoint = tmp_path / "run.safetensors"

    def stop(info: fitting.StepInfo) -> None:
        if info.global_step == 8:
            raise KeyboardInterrupt

    def sharded(**options: object) -> fitting.FitResult:
        trainer, model = classifier_trainer()
        arrays = fitting.read_arrays(directory)
        return fitting.fit(
            trainer,
            arrays,
            model=model,
            epochs=3,
            batch_size=16,
            seed=3,
            schedule=schedule,
            checkpoint=checkpoint,
            log=lambda line: None,
            **options,  # type: ignore[arg-type]
        )

    with pytest.raises(KeyboardInterrupt):
        sharded(callback=stop)
    saved, state = fitting.read_fit_state(checkpoint)
    assert saved["shards"] == [["train-00000.npz", 40], ["train-00001.npz", 25], ["train-00002.npz", 25]]
    assert (state.epoch, state.steps_in_epoch) == (1, 2)
    resumed = sharded(resume=True)
    for name, value in params(straight.trainer).items():
        assert np.array_equal(params(resumed.trainer)[name], value), name
    # Other shards (the same rows cut differently) are another run.
    (directory / "train-00002.npz").unlink()
    np.savez(directory / "train-00001.npz", **{name: value[40:] for name, value in data.items()})
    other_shards = r"trained with shards=\[\['train-00000.npz', 40\], \['train-00001.npz', 25\], \["
    with pytest.raises(ValueError, match=other_shards):
        sharded(resume=True)


def rss_anon() -> int:
    """This process's anonymous resident memory in bytes (file-backed mapped pages not counted)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from Linux's /proc")
def test_shards_are_read_by_the_batch_not_whole(tmp_path: Path) -> None:
    from ortlstm.datafiles import take_rows

    rng = np.random.default_rng(0)
    rows, features = 16384, 1024  # 64 MiB of float32 in 4 shards
    directory = tmp_path / "big"
    directory.mkdir()
    for index in range(4):
        block = rng.standard_normal((rows // 4, features), dtype=np.float32)
        np.savez(directory / f"part-{index}.npz", x=block, y=np.arange(rows // 4) + index * rows // 4)
        del block
    before = rss_anon()
    arrays = fitting.read_arrays(directory)
    order = np.random.default_rng(1).permutation(rows)
    peak = 0
    for first in range(0, rows, 256):  # one epoch of batches of 256 rows (1 MiB)
        batch = take_rows(arrays["x"], 0, order[first : first + 256])
        labels = take_rows(arrays["y"], 0, order[first : first + 256])
        assert np.array_equal(labels, order[first : first + 256])
        peak = max(peak, rss_anon() - before)
        del batch
    assert peak < 16 * 2**20, f"anonymous memory grew by {peak / 2**20:.1f} MiB reading 64 MiB of shards"


# ---- every Trainer option reachable: the command line, --config JSON or TOML ----------------------


def test_fit_names_an_option_for_every_keyword_of_the_trainer() -> None:
    import argparse
    import inspect

    from ortlstm.__main__ import _add_fit_arguments, _fit_options, _fit_trainer_arguments, _parser

    keywords = set(inspect.signature(Trainer.__init__).parameters) - {"self", "model"}
    assert set(fitting.TRAINER_OPTIONS) == keywords  # a new Trainer option fails here until fit has one
    standalone = argparse.ArgumentParser()
    _add_fit_arguments(standalone)
    dests = vars(standalone.parse_args([]))
    assert [option for option in fitting.TRAINER_OPTIONS.values() if option not in dests] == []
    args = _parser().parse_args(
        [
            "fit",
            "m.onnx",
            "--data",
            "d.npz",
            "--loss",
            "mse_loss",
            "--optimizer",
            "sgd",
            "--epochs",
            "1",
            "--batch-size",
            "2",
        ]
    )
    assert set(_fit_trainer_arguments(_fit_options(args))) == keywords


NEW_OPTIONS_CLI = [
    "--extra-outputs", "logits",
    "--param-groups", '[{"params": ["lstm.B", "head.bias"], "weight_decay": 0.0}]',
    "--stateful",
    "--ir-version", "9",
    "--nonfinite", "skip",
    "--optimizer-option", "betas=[0.8,0.9]",
    "--optimizer-option", "amsgrad=true",
    "--loss-option", "label_smoothing=0.05",
    "--frozen", "head.weight",
    "--clip-grad-norm", "1.0",
    "--fixed-shape", "pixels=?,8,8",
    "--threads", "1",
    "--schedule", '{"kind": "linear-warmup", "warmup": 2}',
]  # fmt: skip
NEW_OPTIONS_CONFIG: dict[str, object] = {
    "extra_outputs": ["logits"],
    "param_groups": [{"params": ["lstm.B", "head.bias"], "weight_decay": 0.0}],
    "stateful": True,
    "ir_version": 9,
    "nonfinite": "skip",
    "optimizer_option": {"betas": [0.8, 0.9], "amsgrad": True},
    "loss_option": {"label_smoothing": 0.05},
    "frozen": ["head.weight"],
    "clip-grad-norm": 1.0,
    "fixed_shape": {"pixels": [None, 8, 8]},
    "threads": 1,
    "schedule": {"kind": "linear-warmup", "warmup": 2},
}
TOML_CONFIG = """
extra_outputs = ["logits"]
param_groups = [{params = ["lstm.B", "head.bias"], weight_decay = 0.0}]
stateful = true
ir_version = 9
nonfinite = "skip"
optimizer_option = {betas = [0.8, 0.9], amsgrad = true}
loss_option = {label_smoothing = 0.05}
frozen = ["head.weight"]
clip-grad-norm = 1.0
fixed_shape = {pixels = ["?", 8, 8]}
threads = 1
schedule = {kind = "linear-warmup", warmup = 2}
"""


def test_clip_grad_value_with_clip_grad_norm_is_refused(tmp_path: Path) -> None:
    write_example(tmp_path)
    command = (
        "model.onnx --data train.npz --loss cross_entropy --optimizer sgd --epochs 1 --batch-size 64 --threads 1 "
        "--clip-grad-norm 1.0 --clip-grad-value 0.5 --out trained.onnx"
    )
    done = cli("fit", *command.split(), cwd=tmp_path)
    assert done.returncode != 0
    assert "clip_grad_norm=1.0 and clip_grad_value=0.5 given together" in done.stderr, done.stderr
    assert not (tmp_path / "trained.onnx").exists()


def capture_fit(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Trainer, dict[str, object]]]:
    """Records the trainer and options ``ortlstm fit`` runs ``fit`` with (and runs it)."""
    calls: list[tuple[Trainer, dict[str, object]]] = []
    real = fitting.fit

    def recording(trainer: Trainer, data: object, **options: object) -> fitting.FitResult:
        calls.append((trainer, options))
        return real(trainer, data, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(fitting, "fit", recording)
    return calls


def fit_with(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    cli_options: list[str],
    config: dict[str, object],
    toml: str,
) -> tuple[Trainer, dict[str, object]]:
    """Runs ``ortlstm fit`` (Adam, lr 0.01, one epoch) with options from ``source``; its trainer and fit options."""
    from ortlstm.__main__ import main

    write_example(tmp_path)
    np.savez(tmp_path / "small.npz", **rule_data(30, 0))
    calls = capture_fit(monkeypatch)
    base = {"model": str(tmp_path / "model.onnx"), "data": str(tmp_path / "small.npz"), "loss": "cross_entropy"}
    base.update({"optimizer": "adam", "lr": 0.01, "epochs": 1, "batch_size": 10})
    if source == "command_line":
        argv = [base["model"], "--data", base["data"], "--loss", "cross_entropy", "--optimizer", "adam", "--lr", "0.01"]
        argv += ["--epochs", "1", "--batch-size", "10", *cli_options]
    elif source == "json":
        (tmp_path / "run.json").write_text(json.dumps({**base, **config}))
        argv = ["--config", str(tmp_path / "run.json")]
    else:
        pytest.importorskip("tomllib")  # Python >= 3.11
        lines = [f"{key} = {json.dumps(value)}" for key, value in base.items()]
        (tmp_path / "run.toml").write_text("\n".join(lines) + toml)
        argv = ["--config", str(tmp_path / "run.toml")]
    assert main(["fit", *argv]) == 0, capsys.readouterr().err
    ((trainer, options),) = calls
    return trainer, options


@pytest.mark.parametrize("source", ["command_line", "json", "toml"])
def test_each_trainer_option_reaches_the_built_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    trainer, options = fit_with(tmp_path, monkeypatch, capsys, source, NEW_OPTIONS_CLI, NEW_OPTIONS_CONFIG, TOML_CONFIG)
    spec = trainer.spec
    assert spec.extra_outputs == ("logits",)
    assert spec.param_groups == (optimizers.ParamGroup(("lstm.B", "head.bias"), weight_decay=0.0),)
    assert (spec.stateful, spec.ir_version, trainer.nonfinite) == (True, 9, "skip")
    assert spec.optimizer == optimizers.Adam(lr=0.01, betas=(0.8, 0.9), amsgrad=True)
    assert (spec.loss.kind, spec.loss.label_smoothing) == ("cross_entropy", 0.05)  # Loss compares by identity
    assert spec.frozen == ("head.weight",)
    assert "head.weight" not in spec.requires_grad
    assert spec.clip_grad_norm == 1.0
    assert spec.fixed_shapes == {"pixels": (None, 8, 8)}
    assert options["shuffle"] is None  # the stateful default: in order
    assert options["schedule"] == fitting.Schedule("linear-warmup", 0.01, warmup=2)
    assert trainer.global_step == 3


def test_the_command_line_overrides_the_config_and_bad_configs_are_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ortlstm.__main__ import main

    write_example(tmp_path)
    calls = capture_fit(monkeypatch)
    config = {
        "model": str(tmp_path / "model.onnx"),
        "data": str(tmp_path / "val.npz"),
        "loss": "cross_entropy",
        "optimizer": "sgd",
        "epochs": 3,
        "batch-size": 80,
        "nonfinite": "skip",
    }
    (tmp_path / "run.json").write_text(json.dumps(config))
    assert main(["fit", "--config", str(tmp_path / "run.json"), "--epochs", "1", "--nonfinite", "raise"]) == 0
    ((trainer, options),) = calls
    assert (options["epochs"], options["batch_size"], trainer.nonfinite) == (1, 80, "raise")
    cases = [
        ({**config, "epoch": 2}, r"bad.json: unknown option 'epoch'; the options are .*batch_size, .*epochs"),
        ({**config, "epochs": "many"}, r"bad.json: argument --epochs: invalid int value: 'many'"),
        ({**config, "stateful": "yes"}, r"bad.json: stateful must be true or false, got 'yes'"),
        (
            {**config, "param_groups": [{"params": ["lstm.B"], "lr": 0.1}]},
            r"--param-groups: group 0 .*unknown: lr \(lr: give lr_scale",
        ),
        ({"model": "m.onnx", "loss": "mse_loss"}, r"--data, --optimizer, --epochs, --batch-size required"),
        ({**config, "schedule": {"warmup": 3}}, r"--schedule \{\"warmup\": 3\}: expected an object with kind"),
    ]  # fmt: skip
    for bad, message in cases:
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        capsys.readouterr()
        assert main(["fit", "--config", str(tmp_path / "bad.json")]) == 1
        assert re.search(message, capsys.readouterr().err), message
    (tmp_path / "bad.yaml").write_text("epochs: 1")
    assert main(["fit", "--config", str(tmp_path / "bad.yaml")]) == 1
    assert "expected a .json or .toml file, got '.yaml'" in capsys.readouterr().err


# ---- nonfinite="skip": skipped batches counted per epoch ------------------------------------------


def skip_trainer(nonfinite: str = "skip") -> Trainer:
    return classifier_trainer(nonfinite=nonfinite)[0]


def test_skipped_nonfinite_batches_are_counted_per_epoch_and_a_resume_stays_bitwise(tmp_path: Path) -> None:
    data = rule_data(40, 0)
    data["pixels"][13] = np.nan  # the one batch holding sample 13 has a NaN loss, each epoch
    schedule = fitting.Schedule("cosine", 0.02)
    lines: list[str] = []
    trainer = skip_trainer()
    model = build_classifier(HIDDEN, seed=0)
    result = fitting.fit(
        trainer, data, model=model, epochs=3, batch_size=8, seed=2, schedule=schedule, log=lines.append
    )
    assert [record.skipped for record in result.history] == [1, 1, 1]
    assert all(math.isfinite(record.train_loss) for record in result.history)
    assert lines[0] == (  # the data check warns (nonfinite="skip") rather than refuses
        "warning: data: array 'pixels' holds NaN or inf in 1 of 40 samples (the first: sample 13); --nonfinite skip: "
        "each batch holding one is skipped, its other samples too"
    )
    assert lines[1].endswith("skipped 1 non-finite update")
    assert (trainer.global_step, trainer.skipped_steps) == (12, 3)
    # Oracle: the same seeded order by hand, the batch with sample 13 left out; it still counts for the schedule.
    reference = skip_trainer("raise")
    bound = schedule.bound(5, 3)
    generator = np.random.Generator(np.random.PCG64(2))
    done = 0
    for _ in range(3):
        order = generator.permutation(40)
        for first in range(0, 40, 8):
            rows = order[first : first + 8]
            if 13 not in rows:
                reference.step(pixels=data["pixels"][rows], target=data["target"][rows], lr=bound(done))
            done += 1
    for name, value in params(reference).items():
        assert np.array_equal(params(trainer)[name], value), name
    # Interrupted right after epoch 2's skipped batch, then resumed: the same parameters and counts.
    checkpoint = tmp_path / "run.safetensors"

    def stop(info: fitting.StepInfo) -> None:
        if info.epoch == 2 and not math.isfinite(info.loss):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fitting.fit(
            skip_trainer(), data, model=model, epochs=3, batch_size=8, seed=2, schedule=schedule,
            checkpoint=checkpoint, callback=stop, log=lambda line: None,
        )  # fmt: skip
    assert fitting.read_fit_state(checkpoint)[1].skipped == 1
    resumed = fitting.fit(
        skip_trainer(), data, model=model, epochs=3, batch_size=8, seed=2, schedule=schedule,
        checkpoint=checkpoint, resume=True, log=lambda line: None,
    )  # fmt: skip
    assert [record.skipped for record in resumed.history] == [1, 1, 1]
    assert (resumed.trainer.global_step, resumed.trainer.skipped_steps) == (12, 3)
    for name, value in params(trainer).items():
        assert np.array_equal(params(resumed.trainer)[name], value), name
    # nonfinite="raise": the data check refuses the NaN before the first update.
    raising = skip_trainer("raise")
    with pytest.raises(ValueError, match=r"^data: array 'pixels' holds NaN or inf in 1 of 40 samples"):
        fitting.fit(raising, data, model=model, epochs=1, batch_size=8, seed=2, log=lambda line: None)
    assert (raising.global_step, raising.skipped_steps) == (0, 0)


# ---- stateful: batches in order, the carried state reset each epoch -------------------------------


def stateful_trainer() -> Trainer:
    return classifier_trainer(stateful=True)[0]


def test_a_stateful_fit_reads_batches_in_order_and_resets_the_state_each_epoch(tmp_path: Path) -> None:
    data = rule_data(32, 0)
    model = build_classifier(HIDDEN, seed=0)
    trainer = stateful_trainer()
    assert list(fitting.data_specs(trainer, model)) == ["pixels", "target"]  # the carried state is no data
    fitting.fit(trainer, data, model=model, epochs=2, batch_size=8, seed=5, log=lambda line: None)
    reference = stateful_trainer()
    for _ in range(2):
        reference.reset_state()
        for first in range(0, 32, 8):
            reference.step(pixels=data["pixels"][first : first + 8], target=data["target"][first : first + 8])
    for name, value in params(reference).items():
        assert np.array_equal(params(trainer)[name], value), name
    for name, value in reference.carried_state.items():
        assert np.array_equal(trainer.carried_state[name], value), name
    # Interrupted within epoch 2 and resumed: the carried state comes back with the checkpoint.
    checkpoint = tmp_path / "run.safetensors"

    def stop(info: fitting.StepInfo) -> None:
        if info.global_step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fitting.fit(
            stateful_trainer(), data, model=model, epochs=2, batch_size=8, checkpoint=checkpoint, callback=stop,
            log=lambda line: None,
        )  # fmt: skip
    resumed = fitting.fit(
        stateful_trainer(), data, model=model, epochs=2, batch_size=8, checkpoint=checkpoint, resume=True,
        log=lambda line: None,
    )  # fmt: skip
    for name, value in params(reference).items():
        assert np.array_equal(params(resumed.trainer)[name], value), name
    shuffled = r"--stateful carries row i of each batch's LSTM/GRU/RNN state .* drop --shuffle"
    with pytest.raises(ValueError, match=shuffled):
        fitting.fit(stateful_trainer(), data, model=model, epochs=1, batch_size=8, shuffle=True)
    with pytest.raises(ValueError, match=r"--stateful: data holds 30 samples, not a multiple of --batch-size 8"):
        fitting.fit(stateful_trainer(), rule_data(30, 0), model=model, epochs=1, batch_size=8)


# ---- ctc_loss: labels padded or concatenated ------------------------------------------------------


def test_ctc_labels_may_come_concatenated_as_one_row_per_label_in_memory_and_in_shards(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 4, 12)
    padded = np.zeros((12, 3), np.int64)
    for row, length in enumerate(lengths):
        padded[row, :length] = rng.integers(1, 6, length)
    concatenated = np.concatenate([row[:n] for row, n in zip(padded, lengths, strict=True)])
    x = rng.normal(size=(12, 10, 8)).astype(np.float32)
    model = ctc_model()

    def train(data: dict[str, object]) -> fitting.FitResult:
        trainer = Trainer(
            model, loss=losses.Loss.ctc_loss(input="logits", batch_first=True), optimizer=optimizers.Adam(lr=0.05)
        )
        return fitting.fit(trainer, data, model=model, val=data, epochs=2, batch_size=5, seed=1, log=lambda line: None)

    padded_run = train({"x": x, "target": padded, "target_lengths": lengths})
    concatenated_run = train({"x": x, "target": concatenated, "target_lengths": lengths})
    assert concatenated_run.history[-1].val_cer == padded_run.history[-1].val_cer
    for name, value in params(padded_run.trainer).items():
        np.testing.assert_allclose(params(concatenated_run.trainer)[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    directory = tmp_path / "shards"
    directory.mkdir()
    for index, (first, end) in enumerate([(0, 5), (5, 12)]):
        labels = np.concatenate([row[:n] for row, n in zip(padded[first:end], lengths[first:end], strict=True)])
        np.savez(directory / f"{index}.npz", x=x[first:end], target=labels, target_lengths=lengths[first:end])
    sharded_run = train(fitting.read_arrays(directory))
    for name, value in params(concatenated_run.trainer).items():
        assert np.array_equal(params(sharded_run.trainer)[name], value), name
    with pytest.raises(
        ValueError,
        match=rf"'target' holds {len(concatenated) - 1} concatenated labels, but 'target_lengths' sums to "
        rf"{len(concatenated)}",
    ):
        train({"x": x, "target": concatenated[:-1], "target_lengths": lengths})
    with pytest.raises(
        ValueError,
        match=r"'target' must be int64 or int32 labels, padded \[N, S\] .* or concatenated "
        r"\[sum\(target_lengths\)\], got int64 \[12, 3, 1\]",
    ):
        train({"x": x, "target": padded[:, :, None], "target_lengths": lengths})


def test_the_command_line_trains_on_a_folder_of_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ortlstm.__main__ import main

    write_example(tmp_path)
    write_shards(tmp_path / "shards", rule_data(30, 0), "safetensors")
    command = "model.onnx --data shards --loss cross_entropy --optimizer adamw --epochs 2 --batch-size 8 --threads 1"
    monkeypatch.chdir(tmp_path)
    assert main(["fit", *command.split(), "--out", "trained.onnx"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.count("epoch ") == 2
    assert (tmp_path / "trained.onnx").exists()


def test_time_major_shards_are_concatenated_along_the_declared_batch_axis(tmp_path: Path) -> None:
    data = rule_data(24, 0)
    time_major = {"rows_in": np.ascontiguousarray(data["pixels"].transpose(1, 0, 2)), "target": data["target"]}
    directory = tmp_path / "shards"
    directory.mkdir()
    for index, (first, end) in enumerate([(0, 9), (9, 24)]):
        np.savez(
            directory / f"{index}.npz", rows_in=time_major["rows_in"][:, first:end], target=data["target"][first:end]
        )
    trained = []
    for source in (time_major, fitting.read_arrays(directory)):
        trainer, model = classifier_trainer(time_major_classifier())
        fitting.fit(trainer, source, model=model, epochs=1, batch_size=8, seed=5, log=lambda line: None)
        trained.append(params(trainer))
    for name, value in trained[0].items():
        assert np.array_equal(trained[1][name], value), name


@pytest.mark.parametrize("source", ["command_line", "json", "toml"])
def test_clip_grad_value_reaches_the_built_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    options = ["--clip-grad-value", "0.05", "--threads", "1"]
    config = {"clip_grad_value": 0.05, "threads": 1}
    toml = "\nclip-grad-value = 0.05\nthreads = 1\n"
    trainer, _ = fit_with(tmp_path, monkeypatch, capsys, source, options, config, toml)
    assert (trainer.spec.clip_grad_value, trainer.spec.clip_grad_norm) == (0.05, None)
