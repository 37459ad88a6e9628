"""The loop of ``ortlstm fit``: epochs of seeded shuffled batches, validation, a checkpoint per epoch, resume.

``fit`` checks its options and data (NaN and inf too: ``ortlstm.fit.finite``), then hands them to
one ``_Run``: it starts (or resumes from the checkpoint), runs the epochs update by update, and on
Ctrl-C or a refused non-finite update saves where it stopped (the last update kept). The trained
model's export and the plot come last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortlstm.datafiles import shard_files
from ortlstm.fit.arrays import ArraySpec, batch_arguments, check_export_batch, check_values, data_specs, prepare_data
from ortlstm.fit.checkpoint import check_resumable, finished_message, fit_config, read_fit_state, save_checkpoint
from ortlstm.fit.evaluation import evaluate_data
from ortlstm.fit.finite import check_finite, validation_warning
from ortlstm.fit.parallel import Ranks, launched_world
from ortlstm.fit.report import plot_history
from ortlstm.fit.schedule import Schedule
from ortlstm.fit.state import EpochRecord, FitResult, FitState, StepInfo
from ortlstm.training import QUANTIZE_CHOICES, NonFiniteStepError, Trainer


def fit(
    trainer: Trainer,
    data: Mapping[str, Any],
    *,
    model: onnx.ModelProto,
    epochs: int,
    batch_size: int,
    val: Mapping[str, Any] | None = None,
    seed: int = 0,
    shuffle: bool | None = None,
    schedule: Schedule | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    batch_axes: Mapping[str, int] | None = None,
    out: str | Path | None = None,
    plot: str | Path | None = None,
    quantize: str | None = None,
    callback: Callable[[StepInfo], None] | None = None,
    log: Callable[[str], None] = print,
    data_name: str = "data",
    val_name: str = "val",
    warn: Callable[[str], None] | None = None,
    distributed: str = "auto",
    accumulate: int = 1,
) -> FitResult:
    """Trains ``trainer`` on ``data`` for ``epochs`` epochs: the loop of ``ortlstm fit``.

    Each epoch visits every sample once, in an order drawn from one ``numpy.random.PCG64(seed)``
    generator that continues from epoch to epoch (torch's ``RandomSampler(generator=...)``); the
    last batch of an epoch keeps what is left (``drop_last=False``). Sharded data (``read_arrays``
    of a folder of shards) is shuffled over all rows of all shards; a batch gathers its rows from
    whichever shards hold them. After each epoch: validation on ``val`` in order, one line through
    ``log``, and the checkpoint. With ``schedule``, each batch gets
    ``step(lr=schedule(batches_done))``; without, the trainer's own ``lr``.

    A trainer with ``nonfinite="skip"`` skips a batch whose loss or gradients are not finite:
    the batch still counts (for the schedule and the epoch's position), its loss does not enter
    the epoch's mean, and the epoch's line says how many were skipped. NaN or inf in the data
    (``data`` and ``val``) is found before training: refused, or with ``"skip"`` a warning. A
    validation loss that is not finite is a warning with the count of samples whose loss is not.
    An update refused as not finite (``nonfinite="raise"``: a run that diverged) ends the run
    after the checkpoint of the last update kept was written.

    A stateful trainer (truncated BPTT) reads batch ``k`` as the rows ``k*batch_size`` to
    ``(k+1)*batch_size - 1`` in the file's order: row ``i`` of each batch continues the sequence of
    row ``i`` of the batch before, so the batches are not shuffled, every batch has
    ``batch_size`` rows, and the carried LSTM state is reset to zeros at the start of every epoch.
    Validation batches start from zeros (``Trainer.evaluate``).

    Args:
        trainer: A fresh trainer (or one ``resume`` loads into).
        data: The training arrays by name (``read_arrays``), checked by ``check_data`` first.
        model: The model as given to the trainer (its declared types decide dtypes and batch axes).
        epochs: Total epochs of the run (a resumed run continues to this many).
        batch_size: Samples per update.
        val: Validation arrays, same names.
        seed: Seeds the shuffling.
        shuffle: Shuffle the samples each epoch (default: True, False for a stateful trainer,
            which refuses True).
        schedule: The learning-rate schedule (default: the optimizer's constant lr).
        checkpoint: Written at the end of each epoch, and on KeyboardInterrupt (atomically).
        resume: Continue from ``checkpoint``: the trainer's state, the epoch and the step within
            it, the shuffle order and the history; bitwise the parameters of an uninterrupted run.
            A run whose ``epochs`` are all done says so through ``log`` and trains nothing (the
            export and plot still come); other settings than the checkpoint's are refused, naming
            each option that differs.
        batch_axes: Per array, its batch axis when the declared layout does not say it.
        out: Where to export the trained model at the end.
        plot: Where to draw the curves (PNG) when matplotlib is installed.
        quantize: ``"dynamic"`` exports ``out`` as int8 again (``Trainer.export``); None: float32.
        callback: Called after every batch with a ``StepInfo`` (e.g. to stop a run).
        log: Receives one line per epoch and the notes.
        data_name: The data's name in messages (its file).
        val_name: The validation data's name in messages.
        warn: Receives the warnings (NaN or inf in the data with ``"skip"``, a validation loss
            that is not finite); default: ``log`` with ``warning: `` before them.
        distributed: ``"auto"``: when ``mpirun``/``srun`` started this process as one of several
            (``ortlstm.fit.parallel.launched_world``), train data-parallel over MPI: each rank
            reads its part of every global batch, rank 0 alone logs and writes the files.
            ``"off"``: this process alone.
        accumulate: Micro-batches of ``batch_size`` per update (one all-reduce of the gradients
            per update): the update of a ``accumulate * batch_size`` batch, whose order and
            checkpoint it shares (a run resumes with another split of the same global batch).

    Raises:
        ValueError: Bad data (NaN or inf too, unless the trainer skips non-finite updates),
            options, or a checkpoint of another run.
        NonFiniteStepError: An update was refused as not finite, after the checkpoint of the last
            update kept was written; the message says where, what was not finite, what was saved
            and what to pass (``--nonfinite skip``, ``--lr``).
        KeyboardInterrupt: After the checkpoint of the last completed update was written.
    """
    warn = warn if warn is not None else lambda message: log(f"warning: {message}")
    shuffle = _checked_shuffle(trainer, epochs, batch_size, shuffle)
    _check_outputs(out, plot)
    if quantize not in (None, *QUANTIZE_CHOICES):
        raise ValueError(f"quantize={quantize!r}: pass None (float32, the default) or 'dynamic'")
    specs = data_specs(trainer, model, batch_axes)
    data, samples = _training_data(trainer, model, data, specs, batch_size, data_name)
    check_finite(data, specs, data_name, skip=trainer.nonfinite == "skip", warn=warn)
    counts = {data_name: samples}
    if val is not None:
        val, counts[val_name] = prepare_data(val, specs, val_name)
        check_finite(val, specs, val_name, skip=trainer.nonfinite == "skip", warn=warn, validation=True)
    check_export_batch(specs, batch_size, counts)  # before an epoch is spent on a batch the export fixed
    ranks = Ranks.open(trainer, distributed, accumulate)
    if ranks is not None and ranks.rank != 0:  # rank 0 alone prints
        log = warn = _silent
    run = _Run.plan(trainer, data, specs, val, samples, epochs, batch_size * accumulate, seed, shuffle, schedule)
    run.val_name, run.warn, run.ranks, run.eval_batch = val_name, warn, ranks, batch_size
    where = Path(checkpoint) if checkpoint is not None else None
    if ranks is None:
        resumed_from = run.begin(where, resume, log)
    else:  # every rank reads the checkpoint; a failure on any one is raised on all
        resumed_from = ranks.together(lambda: run.begin(where, resume, log))
        ranks.trainer.check_state()
    with contextlib.nullcontext() if ranks is None else ranks.guard():
        run.train(callback, log)
        return _finish(trainer, run.state.history, resumed_from, out, plot, log, ranks, quantize)


def _silent(line: str) -> None:
    """The log and warnings of a rank other than 0."""


def _checked_shuffle(trainer: Trainer, epochs: int, batch_size: int, shuffle: bool | None) -> bool:
    """Whether to shuffle (default: unless the trainer is stateful), after checking the run's sizes.

    Raises:
        ValueError: ``epochs`` or ``batch_size`` below 1, or ``shuffle`` asked of a stateful trainer.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"--epochs and --batch-size must be >= 1, got {epochs} and {batch_size}")
    stateful = trainer.spec.stateful
    if shuffle is None:
        shuffle = not stateful
    if stateful and shuffle:
        raise ValueError(
            "--stateful carries row i of each batch's LSTM/GRU/RNN state into row i of the next batch, so the batches "
            "must come in the file's order: drop --shuffle (each stream's consecutive chunks are rows "
            "i, i + batch_size, i + 2 * batch_size, ... of the data)"
        )
    return shuffle


def _check_outputs(out: str | Path | None, plot: str | Path | None) -> None:
    """Refuses an --out or --plot that is a directory before training, not when writing it after.

    Raises:
        ValueError: It is a directory.
    """
    for flag, path, example in (("--out", out, "trained.onnx"), ("--plot", plot, "curves.png")):
        if path is not None and Path(path).is_dir():
            raise ValueError(f"{flag} {path}: a directory; pass the file to write (e.g. {Path(path) / example})")


def _training_data(
    trainer: Trainer,
    model: onnx.ModelProto,
    data: Mapping[str, Any],
    specs: Mapping[str, ArraySpec],
    batch_size: int,
    data_name: str,
) -> tuple[dict[str, Any], int]:
    """The training arrays as the loop reads them, and their samples, checked (``prepare_data``, target values).

    Raises:
        ValueError: Bad data, or a stateful trainer's samples not a multiple of ``batch_size``.
    """
    data, samples = prepare_data(data, specs, data_name)
    if trainer.spec.stateful and samples % batch_size:
        raise ValueError(
            f"--stateful: {data_name} holds {samples} samples, not a multiple of --batch-size {batch_size}; every "
            "batch continues the streams of the one before, so each needs batch_size rows (drop the last "
            f"{samples % batch_size} samples, or choose a batch size that divides {samples})"
        )
    check_values(trainer, model, data, data_name)
    return data, samples


@dataclasses.dataclass
class _Run:
    """One run of the loop: what it reads, where it stands, and (during an epoch) where the epoch started.

    Attributes:
        trainer: The trainer it steps.
        data: The training arrays (``prepare_data``).
        specs: What each array is (its batch axis).
        val: The validation arrays, or None.
        samples: The training samples.
        steps_per_epoch: Updates per epoch (the last batch keeps what is left).
        total_epochs: The epochs of the whole run.
        batch_size: Samples per update.
        shuffle: Whether each epoch's order is shuffled.
        schedule: The schedule bound to the run, or None (the trainer's lr).
        config: What a resumed run must share with this one (``fit_config``).
        generator: The shuffle generator (``numpy.random.PCG64(seed)``).
        state: Where the run stands (``FitState``).
        checkpoint: Where it saves, or None.
        stepping: Within an epoch's updates: the trainer's counts say where the epoch stands.
        epoch_start: The trainer's batches done when the current epoch started.
        skipped_before: The trainer's skipped batches when the current epoch started.
        val_name: The validation data's name in warnings.
        warn: Receives the warning of a validation loss that is not finite.
        ranks: The processes it runs on (``Ranks``), or None: this one, with the Trainer's own steps.
        eval_batch: The validation's batch size (``batch_size`` is the update's, micro-batches together).
    """

    trainer: Trainer
    data: Mapping[str, Any]
    specs: Mapping[str, ArraySpec]
    val: Mapping[str, Any] | None
    samples: int
    steps_per_epoch: int
    total_epochs: int
    batch_size: int
    shuffle: bool
    schedule: Schedule | None
    config: dict[str, Any]
    generator: np.random.Generator
    state: FitState
    checkpoint: Path | None = None
    stepping: bool = False
    epoch_start: int = 0
    skipped_before: int = 0
    val_name: str = "val"
    warn: Callable[[str], None] = print
    ranks: Ranks | None = None
    eval_batch: int = 0

    @classmethod
    def plan(
        cls,
        trainer: Trainer,
        data: Mapping[str, Any],
        specs: Mapping[str, ArraySpec],
        val: Mapping[str, Any] | None,
        samples: int,
        epochs: int,
        batch_size: int,
        seed: int,
        shuffle: bool,
        schedule: Schedule | None,
    ) -> _Run:
        """A run from its first update: the schedule bound to its length, its config, a seeded generator."""
        steps_per_epoch = -(-samples // batch_size)
        if schedule is not None:
            schedule = schedule.bound(steps_per_epoch, epochs)
        config = fit_config(batch_size, seed, samples, schedule, list(data), shuffle, shard_files(data))
        generator = np.random.Generator(np.random.PCG64(seed))
        state = FitState(epoch=0, steps_in_epoch=0, rng_state=dict(generator.bit_generator.state))
        return cls(
            trainer=trainer,
            data=data,
            specs=specs,
            val=val,
            samples=samples,
            steps_per_epoch=steps_per_epoch,
            total_epochs=epochs,
            batch_size=batch_size,
            shuffle=shuffle,
            schedule=schedule,
            config=config,
            generator=generator,
            state=state,
        )

    def begin(self, checkpoint: Path | None, resume: bool, log: Callable[[str], None]) -> tuple[int, int] | None:
        """Sets where the run saves; with ``resume``, loads the checkpoint and returns (epoch, step) it resumes from.

        Raises:
            ValueError: ``resume`` without a checkpoint, a checkpoint of another run, or an existing
                checkpoint without ``resume``.
        """
        self.checkpoint = checkpoint
        if checkpoint is not None and checkpoint.is_dir():
            example = checkpoint / "run.safetensors"
            raise ValueError(f"--checkpoint {checkpoint}: a directory; pass the file to write (e.g. {example})")
        if not resume:
            if checkpoint is not None and checkpoint.exists():
                raise ValueError(
                    f"{checkpoint} exists: pass --resume to continue that run, or choose another --checkpoint"
                )
            return None
        if checkpoint is None:
            raise ValueError("--resume needs --checkpoint PATH (the file to continue from)")
        saved, self.state = read_fit_state(checkpoint)
        check_resumable(checkpoint, saved, self.config, self.trainer)
        self.trainer.load(checkpoint)
        finished = finished_message(checkpoint, self.state, self.total_epochs, saved.get("schedule"))
        if finished is not None:  # nothing left to train: the export and plot still come
            log(finished)
        else:
            log(
                f"resuming {checkpoint}: epoch {self.state.epoch + 1}, after update {self.state.steps_in_epoch} of "
                f"{self.steps_per_epoch}"
            )
        return self.state.epoch, self.state.steps_in_epoch

    def train(self, callback: Callable[[StepInfo], None] | None, log: Callable[[str], None]) -> None:
        """Runs the epochs left, each ended by ``_end_epoch``.

        Raises:
            NonFiniteStepError: An update was refused, after the checkpoint of the last kept one was written.
            KeyboardInterrupt: After the checkpoint of the last completed update was written.
        """
        try:
            while self.state.epoch < self.total_epochs:
                self._updates(callback)
                self._end_epoch(log)
        except KeyboardInterrupt:
            self._interrupted(log)
            raise
        except NonFiniteStepError as error:
            raise self._refused(error) from error

    def _updates(self, callback: Callable[[StepInfo], None] | None) -> None:
        """The current epoch's updates, from where it stands, in its order (drawn again from its generator state)."""
        trainer, state = self.trainer, self.state
        self.generator.bit_generator.state = state.rng_state
        order = self.generator.permutation(self.samples) if self.shuffle else np.arange(self.samples)
        self.epoch_start = _batches_done(trainer) - state.steps_in_epoch
        self.skipped_before = trainer.skipped_steps - state.skipped
        if trainer.spec.stateful and state.steps_in_epoch == 0:
            trainer.reset_state()
        bar = _progress(self.steps_per_epoch, f"epoch {state.epoch + 1}/{self.total_epochs}")
        if bar is not None:
            bar.update(state.steps_in_epoch)
        self.stepping = True
        try:
            for index in range(state.steps_in_epoch, self.steps_per_epoch):
                loss_value, outputs = self._step(order[index * self.batch_size : (index + 1) * self.batch_size])
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss_value:.4g}")
                if callback is not None:
                    named = dict(zip(trainer.spec.extra_outputs, outputs, strict=True))
                    callback(StepInfo(state.epoch + 1, index + 1, trainer.global_step, loss_value, named))
        finally:
            if bar is not None:
                bar.close()
        self.stepping = False

    def _step(self, rows: np.ndarray) -> tuple[float, tuple[Any, ...]]:
        """One update on ``rows``, counted in the epoch's state; its mean loss and extra outputs."""
        trainer, state = self.trainer, self.state
        lr = self.schedule(_batches_done(trainer)) if self.schedule is not None else None
        if self.ranks is not None:  # this rank's part of ``rows``, the global batch
            result = self.ranks.step(self.data, self.specs, rows, lr)
        else:
            result = trainer.step(lr=lr, **batch_arguments(self.data, self.specs, trainer.signature.target, rows))
        loss, outputs = (result[0], result[1:]) if trainer.spec.extra_outputs else (result, ())
        loss_value = float(np.mean(loss))
        self._count_updates()
        if math.isfinite(loss_value):
            state.loss_sum += loss_value * len(rows)
            state.samples += len(rows)
        return loss_value, tuple(outputs)

    def _count_updates(self) -> None:
        """The epoch's batches done and skipped, from the trainer's counts (an update may be kept or skipped)."""
        self.state.steps_in_epoch = _batches_done(self.trainer) - self.epoch_start
        self.state.skipped = self.trainer.skipped_steps - self.skipped_before

    def _end_epoch(self, log: Callable[[str], None]) -> None:
        """The epoch's record (validated on ``val``) and line; then the next epoch's state, saved."""
        trainer, state, schedule = self.trainer, self.state, self.schedule
        last = _batches_done(trainer) - 1
        record = EpochRecord(
            state.epoch + 1,
            state.loss_sum / state.samples if state.samples else math.nan,
            schedule(last) if schedule is not None else trainer.learning_rate(max(trainer.global_step, 1)),
            skipped=state.skipped,
        )
        ranks, eval_batch = self.ranks, self.eval_batch or self.batch_size
        if self.val is not None:
            split: dict[str, Any] = {}
            if ranks is not None:
                split = {"rank": ranks.rank, "size": ranks.size, "gather": ranks.gather}
            record.val_loss, record.val_accuracy, record.val_cer = evaluate_data(
                trainer, self.val, self.specs, eval_batch, **split
            )
        log(record.line(self.total_epochs))
        if self.val is not None and record.val_loss is not None and (ranks is None or ranks.rank == 0):
            warning = validation_warning(trainer, self.val, self.specs, eval_batch, record.val_loss, self.val_name)
            if warning is not None:
                self.warn(warning)
        rng_state = dict(self.generator.bit_generator.state)
        self.state = FitState(state.epoch + 1, 0, rng_state, history=[*state.history, record])
        self._save()

    def _save(self) -> None:
        """Writes the checkpoint, if any (rank 0 alone; every rank raises its failure)."""
        if self.checkpoint is None:
            return
        checkpoint = self.checkpoint

        def write() -> None:
            save_checkpoint(self.trainer, checkpoint, self.config, self.state)

        if self.ranks is None:
            write()
        else:
            self.ranks.on_root(write, f"writing the checkpoint {checkpoint}")

    def _save_position(self) -> None:
        """Saves where the run stands to the checkpoint, if any: the trainer's counts say which update was last kept."""
        if self.stepping:
            self._count_updates()
        self._save()

    def _refused(self, error: NonFiniteStepError) -> NonFiniteStepError:
        """A refused update: the checkpoint of the last kept one (the trainer is unchanged), and fit's error.

        The error says where (epoch, batch, update), what was not finite, what was saved, and what
        to pass: ``--nonfinite skip`` to skip such batches, a lower ``--lr`` when the run diverged.
        """
        self._save_position()
        state, trainer = self.state, self.trainer
        where = (
            f"epoch {state.epoch + 1}/{self.total_epochs}, batch {state.steps_in_epoch + 1} of {self.steps_per_epoch}: "
            f"update {trainer.global_step + 1} refused, not finite: {error.reason or error}"
        )
        if self.checkpoint is not None:
            position = f"batch {state.steps_in_epoch} of" if state.steps_in_epoch else "the start of"
            saved = (
                f"saved {self.checkpoint} after the last update kept (global step {trainer.global_step}, {position} "
                f"epoch {state.epoch + 1}). To skip such batches, pass --nonfinite skip "
                "(with --resume, the run continues from that checkpoint); if the loss grew before this (the run "
                "diverged), start a new run with a lower --lr"
            )
        else:
            saved = (
                "nothing saved (no --checkpoint). To skip such batches, pass --nonfinite skip; if the loss grew "
                "before this (the run diverged), pass a lower --lr"
            )
        message = f"{where}; {saved}"
        return NonFiniteStepError(
            message,
            step=error.step,
            loss=error.loss,
            grad_norm=error.grad_norm,
            nonfinite_grads=error.nonfinite_grads,
            reason=error.reason,
        )

    def _interrupted(self, log: Callable[[str], None]) -> None:
        """Ctrl-C: saves where the run stands (an interrupt inside step() may come after its update was kept).

        Not over several processes: each rank is interrupted at its own point, perhaps inside a
        collective, so a write that needs them all could hang; the last epoch's checkpoint stays.
        """
        if self.ranks is not None and self.ranks.size > 1:
            kept = f": {self.checkpoint} holds the last completed epoch" if self.checkpoint is not None else ""
            log(f"interrupted: under MPI nothing is saved at an interrupt{kept}")
            return
        self._save_position()
        if self.checkpoint is not None:
            log(
                f"interrupted: saved {self.checkpoint} after update {self.state.steps_in_epoch} of epoch "
                f"{self.state.epoch + 1} (global step {self.trainer.global_step}); continue with the same command "
                "and --resume"
            )
        else:
            log("interrupted: nothing saved (no --checkpoint)")


def _finish(
    trainer: Trainer,
    history: list[EpochRecord],
    resumed_from: tuple[int, int] | None,
    out: str | Path | None,
    plot: str | Path | None,
    log: Callable[[str], None],
    ranks: Ranks | None = None,
    quantize: str | None = None,
) -> FitResult:
    """What the fit did, after the trained model's export to ``out`` and the plot to ``plot`` (folders made).

    Over several processes rank 0 writes both; every rank returns the same paths.
    """
    result = FitResult(trainer, history, resumed_from)

    def write() -> None:
        for path in (out, plot):  # as for --checkpoint: a folder that does not exist yet is made
            if path is not None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        if out is not None:
            trainer.export(Path(out), quantize=quantize)
        if plot is not None:
            result.plot = plot_history(history, Path(plot), trainer.spec.loss.kind, log)

    if ranks is None:
        write()
    else:
        ranks.on_root(write, "writing --out and --plot")
        result.plot = ranks.trainer.comm.bcast(result.plot, root=0)
    result.out = Path(out) if out is not None else None
    return result


def _batches_done(trainer: Trainer) -> int:
    """Batches the trainer has taken: its updates and the non-finite ones it skipped."""
    return trainer.global_step + trainer.skipped_steps


def _progress(total: int, description: str) -> Any:
    """A tqdm bar on stderr when stdout is a terminal; None otherwise (one line per epoch is printed).

    Never under mpirun/srun (also with --distributed off): Open MPI gives the processes a
    pseudo-terminal even when the job's output goes to a file.
    """
    world = launched_world()
    if not sys.stdout.isatty() or (world is not None and world[0] > 1):
        return None
    try:
        import tqdm
    except ModuleNotFoundError:
        return None
    return tqdm.tqdm(total=total, desc=description, leave=False, file=sys.stderr)
