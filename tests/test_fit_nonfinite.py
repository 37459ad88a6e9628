"""NaN and inf in ``ortlstm fit``: the data check, a validation loss that is not finite, a refused update mid-run.

Oracles: the samples a test puts NaN or inf into (their count, the first, its shard); for a
refused update, a trainer stepped by hand over the same seeded batches up to the last update kept
(bitwise), and the checkpoint read back.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_fit import classifier_trainer, params, rule_data, time_major_classifier, write_shards

from ortlstm import fit as fitting
from ortlstm.demo import build_classifier
from ortlstm.fit import finite
from ortlstm.graphs import losses, optimizers
from ortlstm.training import NonFiniteStepError, Trainer

BAD_SAMPLES = (3, 17, 18, 24)  # NaN in the first three, inf in the last


def with_nonfinite(count: int, samples: tuple[int, ...] = BAD_SAMPLES) -> dict[str, np.ndarray]:
    data = rule_data(count, 0)
    for sample in samples[:-1]:
        data["pixels"][sample, 2, 5] = np.nan
    data["pixels"][samples[-1], 7, 0] = -np.inf
    return data


@pytest.mark.parametrize("chunk_bytes", [1, 300, 1 << 20], ids=["one_row_a_chunk", "a_few_rows", "whole"])
def test_nonfinite_samples_counts_the_samples_and_finds_the_first_in_chunks(
    monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    monkeypatch.setattr(finite, "CHUNK_BYTES", chunk_bytes)
    pixels = with_nonfinite(30)["pixels"]
    assert finite.nonfinite_samples(pixels, 0) == (4, 3, None)
    assert finite.nonfinite_samples(np.ascontiguousarray(pixels.transpose(1, 0, 2)), 1) == (4, 3, None)
    assert finite.nonfinite_samples(np.arange(30), 0) == (0, None, None)  # integers hold no NaN


def test_nan_in_the_data_is_refused_before_training_naming_the_array_the_count_and_the_first() -> None:
    trainer, model = classifier_trainer()
    with pytest.raises(ValueError) as raised:
        fitting.fit(trainer, with_nonfinite(40), model=model, epochs=1, batch_size=8, log=lambda line: None)
    assert str(raised.value) == (
        "data: array 'pixels' holds NaN or inf in 4 of 40 samples (the first: sample 3); a batch holding one has a NaN "
        "loss and gradients. Fix or drop those samples, or pass --nonfinite skip (Trainer(..., nonfinite='skip')) to "
        "train anyway, skipping each batch that holds one"
    )
    assert trainer.global_step == 0
    # The batch axis of a time-major input is the declared one.
    trainer, model = classifier_trainer(time_major_classifier())
    data = with_nonfinite(40)
    time_major = {"rows_in": np.ascontiguousarray(data["pixels"].transpose(1, 0, 2)), "target": data["target"]}
    expected = r"^data: array 'rows_in' holds NaN or inf in 4 of 40 samples \(the first: sample 3\)"
    with pytest.raises(ValueError, match=expected):
        fitting.fit(trainer, time_major, model=model, epochs=1, batch_size=8, log=lambda line: None)


@pytest.mark.parametrize("kind", ["npz", "safetensors", "npy"])
def test_nan_in_shards_names_the_shard_of_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr(finite, "CHUNK_BYTES", 1000)  # several chunks per shard
    data = with_nonfinite(30, (9, 12, 25))  # shards of 7, 13, 10 rows: the first in the second shard, row 2
    arrays = fitting.read_arrays(write_shards(tmp_path / "shards", data, kind))
    trainer, model = classifier_trainer()
    second = sorted(path.name for path in (tmp_path / "shards").iterdir())[1]
    with pytest.raises(ValueError) as raised:
        fitting.fit(trainer, arrays, model=model, epochs=1, batch_size=8, log=lambda line: None, data_name="shards")
    assert str(raised.value).startswith(
        f"shards: array 'pixels' holds NaN or inf in 3 of 30 samples (the first: sample 9 in shard "
        f"{tmp_path / 'shards' / second});"
    )


def test_with_skip_the_data_check_warns_and_a_nonfinite_validation_loss_is_a_warning_with_its_count() -> None:
    trainer, model = classifier_trainer(nonfinite="skip")
    lines: list[str] = []
    warnings: list[str] = []
    val = with_nonfinite(30, (4, 21, 22))  # NaN in 4 and 21: their loss is NaN
    result = fitting.fit(
        trainer, rule_data(32, 1), model=model, val=val, epochs=2, batch_size=8, log=lines.append,
        warn=warnings.append, val_name="val.npz",
    )  # fmt: skip
    assert warnings[0] == (
        "val.npz: array 'pixels' holds NaN or inf in 3 of 30 samples (the first: sample 4); --nonfinite skip: the "
        "validation set is evaluated as it is, so its loss will not be finite (each epoch's warning counts the samples)"
    )
    # An LSTM reads a lone -inf pixel into saturated gates: sample 22's loss stays finite, only the NaN ones are not.
    count = sum(
        not math.isfinite(trainer.evaluate(pixels=val["pixels"][[row]], target=val["target"][[row]]))
        for row in range(30)
    )
    assert count == 2
    epoch_warning = (
        "val.npz: the validation loss is nan: 2 of 30 samples have a loss that is not finite (the first: sample 4)"
    )
    assert warnings[1:] == [epoch_warning] * 2
    assert all(math.isnan(record.val_loss) for record in result.history)
    assert len(lines) == 2 and all(line.startswith("epoch ") for line in lines)


def regression_trainer() -> tuple[Trainer, onnx.ModelProto]:
    """The classifier's logits regressed by mse_loss with SGD at lr 1e10: it diverges to inf within a few updates."""
    model = build_classifier(8, seed=0)
    trainer = Trainer(model, loss=losses.Loss.mse_loss(), optimizer=optimizers.SGD(lr=1e10), threads=1)
    return trainer, model


def regression_data() -> dict[str, np.ndarray]:
    data = rule_data(40, 0)
    return {"pixels": data["pixels"], "target": np.eye(10, dtype=np.float32)[data["target"]]}


def test_a_refused_update_saves_the_last_kept_one_and_says_so_and_resume_with_skip_continues(tmp_path: Path) -> None:
    trainer, model = regression_trainer()
    checkpoint = tmp_path / "run.safetensors"
    with pytest.raises(NonFiniteStepError) as raised:
        fitting.fit(
            trainer, regression_data(), model=model, epochs=2, batch_size=8, seed=0, checkpoint=checkpoint,
            log=lambda line: None,
        )  # fmt: skip
    kept = trainer.global_step
    assert kept >= 1
    message = str(raised.value)
    assert message.startswith(f"epoch 1/2, batch {kept + 1} of 5: update {kept + 1} refused, not finite: the loss is ")
    assert message.endswith(
        f"; saved {checkpoint} after the last update kept (global step {kept}, batch {kept} of epoch 1). To skip such "
        "batches, pass --nonfinite skip (with --resume, the run continues from that checkpoint); if the loss grew "
        "before this (the run diverged), start a new run with a lower --lr"
    )
    assert "\n" not in message and raised.value.step == kept + 1
    # Oracle: the same seeded batches stepped by hand, up to the last update kept.
    reference, _ = regression_trainer()
    order = np.random.Generator(np.random.PCG64(0)).permutation(40)
    data = regression_data()
    for index in range(kept):
        rows = order[index * 8 : (index + 1) * 8]
        reference.step(pixels=data["pixels"][rows], target=data["target"][rows])
    _, state = fitting.read_fit_state(checkpoint)
    assert (state.epoch, state.steps_in_epoch, state.skipped) == (0, kept, 0)
    loaded, _ = regression_trainer()
    loaded.load(checkpoint)
    assert loaded.global_step == kept
    for name, value in params(reference).items():
        assert np.array_equal(params(loaded)[name], value), name
        assert np.array_equal(params(trainer)[name], value), name
    # --resume with --nonfinite skip: continues from that update and skips what is refused.
    resumed_trainer, _ = regression_trainer()
    resumed_trainer.nonfinite = "skip"
    resumed = fitting.fit(
        resumed_trainer, data, model=model, epochs=2, batch_size=8, seed=0, checkpoint=checkpoint, resume=True,
        log=lambda line: None,
    )  # fmt: skip
    assert resumed.resumed_from == (0, kept)
    assert resumed_trainer.global_step + resumed_trainer.skipped_steps == 10


def test_nan_in_a_float_target_is_refused_naming_the_target() -> None:
    trainer, model = regression_trainer()
    data = regression_data()
    data["target"][[5, 38], 2] = np.nan
    expected = r"^data: array 'target' holds NaN or inf in 2 of 40 samples \(the first: sample 5\)"
    with pytest.raises(ValueError, match=expected):
        fitting.fit(trainer, data, model=model, epochs=1, batch_size=8, log=lambda line: None)


def test_without_a_checkpoint_the_refusal_says_nothing_was_saved() -> None:
    trainer, model = regression_trainer()
    with pytest.raises(NonFiniteStepError, match=r"; nothing saved \(no --checkpoint\)\. To skip such batches, pass "
                       r"--nonfinite skip; if the loss grew before this \(the run diverged\), pass a lower --lr$"):
        fitting.fit(trainer, regression_data(), model=model, epochs=1, batch_size=8, log=lambda line: None)


def test_an_out_or_plot_directory_is_refused_before_training_and_a_missing_folder_is_made(tmp_path: Path) -> None:
    trainer, model = classifier_trainer()
    for option in ("out", "plot"):
        with pytest.raises(ValueError, match=rf"^--{option} {tmp_path}: a directory; pass the file to write"):
            fitting.fit(
                trainer, rule_data(16, 0), model=model, epochs=1, batch_size=8, log=lambda line: None,
                **{option: tmp_path},  # type: ignore[arg-type]
            )  # fmt: skip
    assert trainer.global_step == 0
    # A folder that does not exist yet is made (as for --checkpoint), not found missing after training.
    fitting.fit(
        trainer, rule_data(16, 0), model=model, epochs=1, batch_size=8, log=lambda line: None,
        out=tmp_path / "new" / "trained.onnx",
    )  # fmt: skip
    assert (tmp_path / "new" / "trained.onnx").is_file()
