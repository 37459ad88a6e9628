"""``ortlstm fit``: one call from data files to a trained model, over ``ortlstm.training.Trainer``.

Reads named arrays (.npz, .safetensors, folders of .npy, folders of memory-mapped shards:
``ortlstm.datafiles``), checks them against the model's inputs and the loss's targets before
anything is trained, then runs epochs of seeded shuffled batches with validation,
a learning-rate schedule, an atomic checkpoint per epoch (resumable bitwise, also after Ctrl-C),
the trained model's export and a plot. It drives the Trainer's public API only; it never changes
how a step is computed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortlstm import metrics
from ortlstm.datafiles import (  # read_arrays: fit's own reader, as before
    ConcatenatedRows,
    ShardedArray,
    bind_batch_axes,
    read_arrays,  # noqa: F401
    shard_files,
    take_rows,
)
from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.autodiff.emitter import ValueType, value_type_of
from ortlstm.training import CarriedState, Trainer, with_carried_state

FIT_METADATA_KEY = "ortlstm.fit"
"""The checkpoint's metadata entry that holds fit's own state (JSON), beside the Trainer's."""
FIT_FORMAT = "ortlstm.fit/1"
SCHEDULES = ("constant", "step", "cosine", "linear-warmup")
SCHEDULE_UNITS = ("update", "epoch")
CONFIG_SUFFIXES = (".json", ".toml")

TRAINER_OPTIONS: dict[str, str] = {
    "loss": "loss",  # with loss_option
    "optimizer": "optimizer",  # with lr, weight_decay, optimizer_option
    "lr": "lr",  # the optimizer's lr; with schedule, each update's lr is given to step(lr=...)
    "requires_grad": "requires_grad",
    "frozen": "frozen",
    "output": "output",
    "target": "target",
    "extra_outputs": "extra_outputs",
    "param_groups": "param_groups",
    "clip_grad_norm": "clip_grad_norm",
    "clip_norm_type": "clip_norm_type",
    "fixed_inputs": "fixed_input",
    "fixed_shapes": "fixed_shape",
    "stateful": "stateful",
    "threads": "threads",
    "ir_version": "ir_version",
    "nonfinite": "nonfinite",
}
"""Every keyword of ``Trainer(...)`` but the model -> the option of ``ortlstm fit`` that sets it.

An option is ``--NAME`` on the command line (``_`` written ``-``) and ``NAME`` in ``--config``;
tests/test_fit.py checks this table against the Trainer's signature, so a new Trainer option
fails there until fit reaches it.
"""
_BATCH_WORDS = ("batch", "n")  # a declared dim named so (any case, "batch" as a part) is the batch axis


# ---- learning-rate schedules (torch.optim.lr_scheduler's closed forms) ----------------------------


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule as torch.optim.lr_scheduler computes it, as ``lr(n)`` for the Trainer.

    ``n`` counts the scheduler's steps done: with ``unit="update"`` (the default) the scheduler is
    stepped after every optimizer update, as the Hugging Face Trainer does; with ``unit="epoch"``
    after every epoch, as torch's examples do (``n`` is then ``updates_done // steps_per_epoch``).

    - ``constant``: ``lr``.
    - ``step`` (StepLR): ``lr * gamma ** (n // step_size)``.
    - ``cosine`` (CosineAnnealingLR, its documented closed form):
      ``eta_min + (lr - eta_min) * (1 + cos(pi * n / T_max)) / 2`` with ``T_max`` the run's total
      scheduler steps unless given.
    - ``linear-warmup`` (SequentialLR of LinearLR(start_factor, end_factor=1.0,
      total_iters=warmup) then CosineAnnealingLR(T_max - warmup, eta_min), milestone ``warmup``):
      ``lr * (start_factor + (1 - start_factor) * n / warmup)`` for ``n < warmup``, then the cosine
      above at ``n - warmup`` over ``T_max - warmup``.

    Attributes:
        kind: One of ``SCHEDULES``.
        lr: The base learning rate (torch's ``base_lr``).
        unit: ``"update"`` or ``"epoch"``: when the scheduler steps.
        steps_per_epoch: Updates per epoch (to count epochs with ``unit="epoch"``).
        total: The run's scheduler steps (updates, or epochs): cosine's default ``T_max``
            (``bound`` fills it and ``steps_per_epoch`` in from the run).
        step_size: StepLR's period, in scheduler steps.
        gamma: StepLR's decay factor (torch's default 0.1).
        t_max: CosineAnnealingLR's ``T_max`` (default: ``total``).
        eta_min: The cosine's minimum (torch's default 0).
        warmup: Scheduler steps of linear warmup.
        start_factor: LinearLR's start factor (torch's default 1/3).
    """

    kind: str
    lr: float
    unit: str = "update"
    steps_per_epoch: int | None = None
    total: int | None = None
    step_size: int | None = None
    gamma: float = 0.1
    t_max: int | None = None
    eta_min: float = 0.0
    warmup: int = 0
    start_factor: float = 1.0 / 3.0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"--schedule: expected one of {', '.join(SCHEDULES)}, got {self.kind!r}")
        if self.unit not in SCHEDULE_UNITS:
            raise ValueError(f"--schedule-unit: expected one of {', '.join(SCHEDULE_UNITS)}, got {self.unit!r}")
        if self.kind == "step" and (self.step_size is None or self.step_size < 1):
            raise ValueError(f"--schedule step needs --step-size N (scheduler steps, >= 1), got {self.step_size}")
        if self.kind == "linear-warmup" and not 0 < self.start_factor <= 1:
            raise ValueError(f"--start-factor must be in (0, 1] (torch's LinearLR), got {self.start_factor}")
        t_max = self.t_max if self.t_max is not None else self.total
        if self.kind in ("cosine", "linear-warmup") and t_max is not None and not 0 <= self.warmup < t_max:
            raise ValueError(
                f"--schedule {self.kind}: needs 0 <= --warmup ({self.warmup}) < T_max ({t_max} scheduler steps)"
            )

    @classmethod
    def from_options(cls, lr: float, kind: str | Mapping[str, Any], **fields: Any) -> Schedule:
        """The schedule of fit's options: ``kind`` a name, or a JSON object of fields that override ``fields``.

        Raises:
            ValueError: An object without ``kind`` or with a field a schedule does not have.
        """
        if isinstance(kind, str):
            return cls(kind, lr, **fields)
        settable = [
            field.name for field in dataclasses.fields(cls) if field.name not in ("lr", "steps_per_epoch", "total")
        ]
        unknown = sorted(set(kind) - set(settable))
        if unknown or "kind" not in kind:
            raise ValueError(
                f"--schedule {json.dumps(kind)}: expected an object with kind ({', '.join(SCHEDULES)}) and any of "
                f"{', '.join(settable[1:])}; {'unknown: ' + ', '.join(unknown) if unknown else 'kind is missing'}"
            )
        return cls(lr=lr, **{**fields, **kind})

    def bound(self, steps_per_epoch: int, epochs: int) -> Schedule:
        """This schedule for a run of ``epochs`` epochs of ``steps_per_epoch`` updates (``total`` filled in)."""
        total = epochs * steps_per_epoch if self.unit == "update" else epochs
        return dataclasses.replace(self, steps_per_epoch=steps_per_epoch, total=total)

    @property
    def cosine_t_max(self) -> int:
        """The cosine's period: ``T_max``, less the warmup for ``linear-warmup``."""
        t_max = self.t_max if self.t_max is not None else self.total
        if t_max is None:
            raise ValueError("the schedule's length is unknown: give t_max, or bind it to a run (bound())")
        return t_max - self.warmup if self.kind == "linear-warmup" else t_max

    def __call__(self, updates_done: int) -> float:
        """The learning rate of the update that follows ``updates_done`` updates."""
        n = updates_done if self.unit == "update" else updates_done // (self.steps_per_epoch or 1)
        if self.kind == "constant":
            return self.lr
        if self.kind == "step":
            return self.lr * self.gamma ** (n // self.step_size)  # type: ignore[operator]
        if self.kind == "linear-warmup" and n < self.warmup:
            return self.lr * (self.start_factor + (1.0 - self.start_factor) * n / self.warmup)
        n -= self.warmup if self.kind == "linear-warmup" else 0
        return self.eta_min + (self.lr - self.eta_min) * (1.0 + math.cos(math.pi * n / self.cosine_t_max)) / 2.0

    def to_json(self) -> dict[str, Any]:
        """The fields that decide its values (a resumed run must use the same).

        A constant or step schedule does not depend on the run's length, so a run may be resumed
        with more epochs; a cosine one does.
        """
        fields = dataclasses.asdict(self)
        if self.kind in ("constant", "step"):
            del fields["total"]
        return fields


# ---- options ----------------------------------------------------------------------------------------


def read_config(path: str | Path) -> dict[str, Any]:
    """The options of a ``--config`` file: a JSON object, or a TOML table (Python >= 3.11's tomllib).

    Raises:
        FileNotFoundError: No such file.
        ValueError: Another suffix, or a file that is not one object of options.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--config: no file {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise ValueError(f"--config {path}: expected a .json or .toml file, got {suffix or 'no suffix'!r}")
    try:
        if suffix == ".toml":
            import tomllib

            config = tomllib.loads(path.read_text())
        else:
            config = json.loads(path.read_text())
    except ModuleNotFoundError:
        raise ValueError(f"--config {path}: reading TOML needs Python >= 3.11 (tomllib); write it as JSON") from None
    except ValueError as error:
        raise ValueError(f"--config {path}: not valid {suffix[1:].upper()} ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f'--config {path}: expected an object of options, e.g. {{"epochs": 10}}, got {config!r}')
    return config


def param_groups_from_json(groups: Any) -> tuple[optimizers.ParamGroup, ...]:
    """``ParamGroup``s from JSON: ``[{"params": ["lstm.bias"], "weight_decay": 0.0}, ...]``.

    Raises:
        ValueError: Not a list of objects, a group without params, or a key ParamGroup does not have.
    """
    if groups is None:
        return ()
    fields = [field.name for field in dataclasses.fields(optimizers.ParamGroup)]
    example = '[{"params": ["lstm.bias"], "weight_decay": 0.0}]'
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        raise ValueError(f"--param-groups: expected a JSON list of objects, e.g. {example}, got {groups!r}")
    built = []
    for index, group in enumerate(groups):
        unknown = sorted(set(group) - set(fields))
        if unknown or "params" not in group:
            hint = " (lr: give lr_scale = the group's lr / the optimizer's lr)" if "lr" in unknown else ""
            raise ValueError(
                f"--param-groups: group {index} {json.dumps(group)}: needs params (a list of parameter names) and "
                f"takes {', '.join(fields[1:])}; {'unknown: ' + ', '.join(unknown) if unknown else 'no params'}{hint}"
            )
        try:
            built.append(optimizers.ParamGroup(**group))
        except (TypeError, ValueError) as error:
            raise ValueError(f"--param-groups: group {index} {json.dumps(group)}: {error}") from None
    return tuple(built)


# ---- data -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """What one data array must be.

    Attributes:
        name: Its name in the file (the model input's, the target's, or the loss's extra target's).
        role: What it feeds, for messages.
        dtypes: The accepted dtypes (the first is the one to convert to).
        shape: The declared shape (int: fixed; str or None: free), or None (any rank).
        batch_axis: The axis that indexes samples.
        required: False for an optional extra target (ctc_loss's input_lengths).
        lengths: The array of per-sample lengths when this one may also come concatenated as
            ``[sum(lengths)]`` (ctc_loss's labels beside ``target_lengths``), else None.
    """

    name: str
    role: str
    dtypes: tuple[np.dtype, ...]
    shape: tuple[int | str | None, ...] | None
    batch_axis: int
    required: bool = True
    lengths: str | None = None

    def expected(self) -> str:
        """``float32 [batch, 8, 8] (batch axis 0)`` for messages."""
        dims = "any shape" if self.shape is None else "[" + ", ".join(_dim_text(d) for d in self.shape) + "]"
        dtypes = " or ".join(str(dtype) for dtype in self.dtypes)
        return f"{dtypes} {dims} (batch axis {self.batch_axis})"


def _dim_text(dim: int | str | None) -> str:
    return str(dim) if isinstance(dim, (int, str)) and dim not in (0, -1) else "?"


def _fixed(dim: int | str | None) -> bool:
    return isinstance(dim, int) and dim > 0


def _is_batch_dim(dim: int | str | None) -> bool:
    return isinstance(dim, str) and (dim.lower() in _BATCH_WORDS or "batch" in dim.lower())


def declared_batch_axis(shape: Sequence[int | str | None] | None, batch_dim: str | None) -> int:
    """The batch axis an array's declared shape says: where ``batch_dim`` (a dim name) is, else 0.

    ``batch_dim`` is the model's batch dim name: in the first model input that has one, the first
    declared dim named ``batch`` or ``N`` or containing ``batch`` (any case). Arrays whose shape does not name it
    (targets, lengths, a model without names) take axis 0, torch's convention for a batch.
    """
    if shape is None or batch_dim is None:
        return 0
    return next((axis for axis, dim in enumerate(shape) if dim == batch_dim), 0)


def carried_states(trainer: Trainer, model: onnx.ModelProto) -> tuple[CarriedState, ...]:
    """The LSTMs whose state a stateful trainer carries (their initial states are not data), else ()."""
    return with_carried_state(model)[1] if trainer.spec.stateful else ()


def data_specs(
    trainer: Trainer, model: onnx.ModelProto, batch_axes: Mapping[str, int] | None = None
) -> dict[str, ArraySpec]:
    """The arrays a fit of ``trainer`` reads, by name, in feed order: model inputs, target, extra targets.

    Args:
        trainer: The trainer (its signature and loss say the names).
        model: The model as given (its declared input and output types say dtypes, shapes, layout).
        batch_axes: Per array name, a batch axis that overrides the declared one (``--batch-axis``).

    Raises:
        ValueError: ``batch_axes`` names no array of the fit, or an axis outside its rank.
    """
    signature, loss = trainer.signature, trainer.spec.loss
    declared = {value.name: value_type_of(value) for value in [*model.graph.input, *model.graph.output]}
    carried = {name for state in carried_states(trainer, model) for name in (state.initial_h, state.initial_c)}
    inputs = [name for name in signature.batch_inputs if name not in carried]
    batch_dim = None
    for name in inputs:
        value = declared.get(name)
        shape = value.shape if value is not None else None
        batch_dim = next((dim for dim in shape or () if _is_batch_dim(dim)), None)
        if batch_dim is not None:
            break
    specs: dict[str, ArraySpec] = {}
    for name in inputs:
        value = declared.get(name)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.elem_type)) if value else np.dtype(np.float32)
        shape = value.shape if value is not None else None
        axis = declared_batch_axis(shape, batch_dim)
        specs[name] = ArraySpec(name, "model input", (dtype,), shape, axis)
    if signature.target is not None:
        target = _target_spec(loss, signature.target, declared.get(trainer.spec.prediction), batch_dim)
        lengths = signature.extra_targets.get("target_lengths") if loss.kind == "ctc_loss" else None
        specs[signature.target] = dataclasses.replace(target, lengths=lengths)
    required = {extra.name: extra.required for extra in loss.extra_targets}
    for port, name in signature.extra_targets.items():
        integers = (np.dtype(np.int64), np.dtype(np.int32))
        specs[name] = ArraySpec(name, f"{loss.kind}'s {port}", integers, (None,), 0, required[port])
    for name, axis in (batch_axes or {}).items():
        if name not in specs:
            raise ValueError(f"--batch-axis {name}={axis}: no such array; the fit reads {list(specs)}")
        spec = specs[name]
        if spec.shape is not None and not -len(spec.shape) <= axis < len(spec.shape):
            raise ValueError(f"--batch-axis {name}={axis}: {name!r} has {len(spec.shape)} axes")
        specs[name] = dataclasses.replace(spec, batch_axis=axis % len(spec.shape) if spec.shape else axis)
    return specs


def _target_spec(loss: losses.Loss, name: str, prediction: ValueType | None, batch_dim: str | None) -> ArraySpec:
    pred_shape = prediction.shape if prediction is not None else None
    pred_dtype = (
        np.dtype(onnx.helper.tensor_dtype_to_np_dtype(prediction.elem_type)) if prediction else np.dtype(np.float32)
    )
    integers = (np.dtype(np.int64), np.dtype(np.int32))
    if loss.kind == "ctc_loss":
        return ArraySpec(
            name, "ctc_loss's labels: padded [N, S] or concatenated [sum(target_lengths)]", integers, None, 0
        )
    if loss.class_target:
        shape = None if pred_shape is None else tuple(d for axis, d in enumerate(pred_shape) if axis != 1)
        dtypes = (*integers, pred_dtype) if loss.kind == "cross_entropy" else integers
        return ArraySpec(name, f"{loss.kind}'s class indices", dtypes, shape, declared_batch_axis(shape, batch_dim))
    return ArraySpec(
        name, f"{loss.kind}'s target", (pred_dtype,), pred_shape, declared_batch_axis(pred_shape, batch_dim)
    )


def check_data(arrays: Mapping[str, np.ndarray], specs: Mapping[str, ArraySpec], where: str) -> int:
    """Checks a data file's arrays against what the fit reads; returns the number of samples.

    ctc_loss's labels may be padded ``[N, S]`` or concatenated ``[sum(target_lengths)]`` (then
    checked against the lengths' sum rather than counted as samples).

    Raises:
        ValueError: An array is missing or unknown, of another dtype or shape, or the arrays hold
            different numbers of samples; the message names the array, expected vs actual, and
            what to pass.
    """
    names = list(specs)
    missing = [name for name in names if specs[name].required and name not in arrays]
    unknown = [name for name in arrays if name not in specs]
    if missing:
        details = "; ".join(f"{name!r} ({specs[name].role}, {specs[name].expected()})" for name in missing)
        raise ValueError(
            f"{where}: missing array(s) {details}; the file holds {sorted(arrays)}. Save them by these names, "
            f"e.g. np.savez(path, {', '.join(f'{name}=...' for name in names if specs[name].required)})"
        )
    if unknown:
        raise ValueError(
            f"{where}: array(s) {unknown} feed nothing; the fit reads {names} (model inputs, then the loss's "
            "targets). Rename or drop them"
        )
    counts: dict[str, int] = {}
    for name, array in arrays.items():
        spec = specs[name]
        if array.dtype not in spec.dtypes:
            raise ValueError(
                f"{where}: array {name!r} ({spec.role}) must be {spec.expected()}, got {array.dtype} "
                f"{list(array.shape)}; pass it as array.astype(np.{spec.dtypes[0]})"
            )
        if spec.lengths is not None and array.ndim not in (1, 2):
            raise ValueError(
                f"{where}: array {name!r} must be {' or '.join(map(str, spec.dtypes))} labels, padded [N, S] (row n's "
                f"first {spec.lengths}[n] entries count) or concatenated [sum({spec.lengths})], got {array.dtype} "
                f"{list(array.shape)}"
            )
        if _is_concatenated(array, spec):
            continue  # one entry per label, not per sample: checked against the lengths below
        shape_ok = spec.shape is None or (
            array.ndim == len(spec.shape)
            and all(
                not _fixed(dim) or dim == actual or axis == spec.batch_axis
                for axis, (dim, actual) in enumerate(zip(spec.shape, array.shape, strict=True))
            )
        )
        if not shape_ok or array.ndim <= spec.batch_axis:
            raise ValueError(
                f"{where}: array {name!r} ({spec.role}) must be {spec.expected()}, got {array.dtype} "
                f"{list(array.shape)}; the batch axis stacks the samples (--batch-axis {name}=AXIS sets another)"
            )
        counts[name] = int(array.shape[spec.batch_axis])
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name!r}: {count} (axis {specs[name].batch_axis})" for name, count in counts.items())
        raise ValueError(
            f"{where}: the arrays hold different numbers of samples along their batch axes ({listed}); every "
            "array needs one entry per sample (--batch-axis NAME=AXIS if an axis is not the batch)"
        )
    count = next(iter(counts.values()))
    if count == 0:
        raise ValueError(f"{where}: the arrays hold no sample")
    for name, array in arrays.items():
        spec = specs[name]
        if _is_concatenated(array, spec) and spec.lengths in arrays:
            labels = _sum(arrays[spec.lengths])
            if labels != array.shape[0]:
                raise ValueError(
                    f"{where}: array {name!r} holds {array.shape[0]} concatenated labels, but {spec.lengths!r} "
                    f"sums to {labels}; pass every sample's labels end to end (or padded [N, S])"
                )
    return count


def _is_concatenated(array: Any, spec: ArraySpec) -> bool:
    """Whether ``array`` holds labels end to end (ctc_loss's ``[sum(target_lengths)]``)."""
    return spec.lengths is not None and array.ndim == 1


def _sum(array: Any) -> int:
    """The sum of an integer array, shard by shard (never the whole array in memory at once)."""
    parts = array.parts if isinstance(array, ShardedArray) else (array,)
    return sum(int(np.sum(part, dtype=np.int64)) for part in parts)


def prepare_data(arrays: Mapping[str, Any], specs: Mapping[str, ArraySpec], where: str) -> tuple[dict[str, Any], int]:
    """The arrays as the loop reads them, checked (``check_data``); and the number of samples.

    Shards are concatenated along each array's batch axis after every shard was checked;
    concatenated labels (ctc_loss) are indexed by sample.

    Raises:
        ValueError: As ``check_data``, and for shards whose arrays differ in shape or sample count.
    """
    per_sample = {
        name: spec.batch_axis
        for name, spec in specs.items()
        if name in arrays and not _is_concatenated(arrays[name], spec)
    }
    arrays = bind_batch_axes(arrays, per_sample, where)
    count = check_data(arrays, specs, where)
    prepared = dict(arrays)
    for name, array in arrays.items():
        spec = specs[name]
        if not _is_concatenated(array, spec):
            continue
        lengths = arrays[spec.lengths]
        if isinstance(array, ShardedArray) and isinstance(lengths, ShardedArray):
            for file, part, lengths_part in zip(array.files, array.parts, lengths.parts, strict=True):
                if _sum(lengths_part) != part.shape[0]:
                    raise ValueError(
                        f"{where}: shard {file}: array {name!r} holds {part.shape[0]} concatenated labels, but "
                        f"{spec.lengths!r} sums to {_sum(lengths_part)} there; each shard holds its samples' labels"
                    )
        prepared[name] = ConcatenatedRows(array, take_rows(lengths, 0, np.arange(count)))
    return prepared, count


# ---- the loop -------------------------------------------------------------------------------------


@dataclasses.dataclass
class EpochRecord:
    """One epoch's figures.

    Attributes:
        epoch: 1-based.
        train_loss: The mean of the step losses, weighted by batch size.
        lr: The learning rate of the epoch's last update.
        val_loss: The validation loss (None without validation data).
        val_accuracy: Classification losses: argmax accuracy on the validation data.
        val_cer: ctc_loss: the greedy decoding's character error rate on the validation data.
        skipped: Batches skipped as non-finite (``nonfinite="skip"``).
    """

    epoch: int
    train_loss: float
    lr: float
    val_loss: float | None = None
    val_accuracy: float | None = None
    val_cer: float | None = None
    skipped: int = 0

    def line(self, epochs: int) -> str:
        """``epoch 3/10: loss 0.1234, lr 0.001, val loss 0.2, val accuracy 95.0%``."""
        parts = [f"epoch {self.epoch}/{epochs}: loss {self.train_loss:.4g}", f"lr {self.lr:.3g}"]
        if self.val_loss is not None:
            parts.append(f"val loss {self.val_loss:.4g}")
        if self.val_accuracy is not None:
            parts.append(f"val accuracy {self.val_accuracy:.1%}")
        if self.val_cer is not None:
            parts.append(f"val CER {self.val_cer:.2%}")
        if self.skipped:
            parts.append(f"skipped {self.skipped} non-finite update{'s' if self.skipped > 1 else ''}")
        return ", ".join(parts)


@dataclasses.dataclass
class FitState:
    """Where a fit stands; saved in the checkpoint's metadata to resume bitwise.

    Attributes:
        epoch: Epochs completed.
        steps_in_epoch: Batches done in the current (incomplete) epoch (updates, and skipped ones).
        rng_state: The shuffle generator's state at the start of the current epoch
            (``numpy.random.PCG64`` state), from which its order is drawn again on resume.
        loss_sum: The current epoch's step losses times batch sizes, summed.
        samples: The samples of the current epoch trained on (in updates kept).
        skipped: The current epoch's batches skipped as non-finite.
        history: The completed epochs.
    """

    epoch: int
    steps_in_epoch: int
    rng_state: dict[str, Any]
    loss_sum: float = 0.0
    samples: int = 0
    skipped: int = 0
    history: list[EpochRecord] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a ``fit`` callback sees after each update.

    Attributes:
        epoch: 1-based number of the epoch the update belongs to.
        step_in_epoch: 1-based number of the update within the epoch.
        global_step: The trainer's updates done.
        loss: The update's loss (NaN or inf for a skipped one).
        outputs: The trainer's extra outputs of the step, by name (``extra_outputs``).
    """

    epoch: int
    step_in_epoch: int
    global_step: int
    loss: float
    outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class FitResult:
    """What ``fit`` did.

    Attributes:
        trainer: The trainer, trained.
        history: One record per epoch (those before a resume too).
        resumed_from: The epoch and step a resumed run started from, or None.
        out: The exported model's path, or None.
        plot: The plot's path, or None (not asked, or matplotlib missing).
    """

    trainer: Trainer
    history: list[EpochRecord]
    resumed_from: tuple[int, int] | None = None
    out: Path | None = None
    plot: Path | None = None


def _fit_config(
    batch_size: int,
    seed: int,
    samples: int,
    schedule: Schedule | None,
    names: Sequence[str],
    shuffle: bool,
    shards: list[list[Any]] | None,
) -> dict[str, Any]:
    """What a resumed run must share with the saved one (keys added later only when they differ from before)."""
    config = {
        "format": FIT_FORMAT,
        "batch_size": batch_size,
        "seed": seed,
        "samples": samples,
        "schedule": schedule.to_json() if schedule is not None else None,
        "arrays": list(names),
    }
    if not shuffle:
        config["shuffle"] = False
    if shards is not None:
        config["shards"] = shards
    return config


def save_checkpoint(trainer: Trainer, path: str | Path, config: Mapping[str, Any], state: FitState) -> Path:
    """Writes the Trainer's checkpoint with fit's state in its metadata, atomically.

    ``Trainer.save`` writes a temporary file in the checkpoint's directory; its tensors and
    metadata are written again, with ``FIT_METADATA_KEY`` added, to a second temporary file there,
    which ``os.replace`` moves over the checkpoint: a reader sees the old file or the new one,
    never a partial one. ``Trainer.load`` and ``Trainer.from_checkpoint`` read it as any checkpoint.
    """
    from safetensors import safe_open
    from safetensors.numpy import save_file

    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fit_state = {**config, "state": {**dataclasses.asdict(state)}}
    temporaries: list[str] = []
    try:
        for _ in range(2):
            handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
            os.close(handle)
            temporaries.append(name)
        trainer.save(temporaries[0])
        with safe_open(temporaries[0], framework="numpy") as reader:
            metadata = dict(reader.metadata() or {})
            tensors = {key: reader.get_tensor(key) for key in reader.keys()}  # noqa: SIM118 - not a dict
        metadata[FIT_METADATA_KEY] = json.dumps(fit_state)
        save_file(tensors, temporaries[1], metadata=metadata)
        with open(temporaries[1], "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporaries[1], path)
    finally:
        for name in temporaries:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
    return path


def read_fit_state(path: str | Path) -> tuple[dict[str, Any], FitState]:
    """The fit configuration and state of a checkpoint that ``save_checkpoint`` wrote.

    Raises:
        FileNotFoundError: No such file.
        ValueError: The checkpoint has no fit state (written by ``Trainer.save`` alone).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint {str(path)!r} to resume from (drop --resume to start)")
    with safe_open(str(path), framework="numpy") as reader:
        text = (reader.metadata() or {}).get(FIT_METADATA_KEY)
    if text is None:
        raise ValueError(f"{path}: a Trainer checkpoint without fit's state (epoch, shuffle order); not resumable")
    data = json.loads(text)
    state = data.pop("state")
    state["history"] = [EpochRecord(**record) for record in state["history"]]
    return data, FitState(**state)


def _check_resumable(path: Path, saved: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    keys = [*config, *(key for key in saved if key not in config)]
    differing = [key for key in keys if saved.get(key) != config.get(key)]
    if differing:
        details = "; ".join(f"{key}: saved {saved.get(key)!r}, now {config.get(key)!r}" for key in differing)
        raise ValueError(
            f"{path}: the run was started with other settings ({details}); resume with the same data (and "
            "shards), --batch-size, --seed, --shuffle, --epochs and schedule, or start a new run"
        )


def _progress(total: int, description: str) -> Any:
    """A tqdm bar on stderr when stdout is a terminal; None otherwise (one line per epoch is printed)."""
    if not sys.stdout.isatty():
        return None
    try:
        import tqdm
    except ModuleNotFoundError:
        return None
    return tqdm.tqdm(total=total, desc=description, leave=False, file=sys.stderr)


def _batch_arguments(
    arrays: Mapping[str, np.ndarray], specs: Mapping[str, ArraySpec], target: str | None, rows: np.ndarray
) -> dict[str, Any]:
    """Keywords for ``Trainer.step``/``evaluate``: inputs and extra targets by name, ``target=``."""
    named: dict[str, Any] = {}
    for name, array in arrays.items():
        value = take_rows(array, specs[name].batch_axis, rows)
        named["target" if name == target else name] = value
    return named


def evaluate_data(
    trainer: Trainer, arrays: Mapping[str, np.ndarray], specs: Mapping[str, ArraySpec], batch_size: int
) -> tuple[float, float | None, float | None]:
    """(loss, accuracy or None, CER or None) over data in order, in batches of ``batch_size``.

    The loss of a ``mean`` reduction is the batch means weighted by batch size (the mean over the
    samples); ``sum`` adds the batches; ``none`` averages every element. Accuracy: losses with
    class-index targets (argmax over axis 1, ``ignore_index`` left out). CER: ctc_loss (greedy
    decoding of the prediction, ``ortlstm.metrics``).
    """
    spec = trainer.spec
    loss_kind = spec.loss
    count = next(
        int(array.shape[specs[name].batch_axis])
        for name, array in arrays.items()
        if not isinstance(array, ConcatenatedRows)
    )
    target_name = trainer.signature.target
    wants_output = target_name is not None and (loss_kind.class_target or loss_kind.kind == "ctc_loss")
    total = 0.0
    elements = 0
    correct = counted = 0
    decoded: list[list[int]] = []
    references: list[list[int]] = []
    for first in range(0, count, batch_size):
        rows = np.arange(first, min(first + batch_size, count))
        named = _batch_arguments(arrays, specs, target_name, rows)
        if wants_output:
            loss, prediction = trainer.evaluate(outputs=[spec.prediction], **named)
        else:
            loss, prediction = trainer.evaluate(outputs=[], **named), None
        loss_array = np.asarray(loss, dtype=np.float64)
        if loss_kind.reduction == "none":
            total += float(loss_array.sum())
            elements += loss_array.size
        else:
            total += float(loss_array) * (len(rows) if loss_kind.reduction != "sum" else 1)
            elements += len(rows)
        if prediction is None:
            continue
        target = named["target"]
        if loss_kind.kind == "ctc_loss":
            lengths = named.get(trainer.signature.extra_targets.get("input_lengths", ""))
            decoded += metrics.ctc_greedy_decode(
                prediction, blank=loss_kind.blank, time_major=not loss_kind.batch_first, input_lengths=lengths
            )
            target_lengths = named[trainer.signature.extra_targets["target_lengths"]]
            if target.ndim == 1:  # concatenated labels
                references += [list(row) for row in np.split(target, np.cumsum(target_lengths)[:-1])]
            else:
                references += [list(row[: int(n)]) for row, n in zip(target, target_lengths, strict=True)]
        elif target.dtype.kind in "iu":
            keep = target != loss_kind.ignore_index
            correct += int(np.sum((np.argmax(prediction, axis=1) == target) & keep))
            counted += int(np.sum(keep))
    loss_value = total / elements if loss_kind.reduction != "sum" else total
    accuracy = correct / counted if counted else None
    cer = metrics.character_error_rate(decoded, references) if references and any(references) else None
    return loss_value, accuracy, cer


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
    callback: Callable[[StepInfo], None] | None = None,
    log: Callable[[str], None] = print,
    data_name: str = "data",
    val_name: str = "val",
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
    the epoch's mean, and the epoch's line says how many were skipped.

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
        batch_axes: Per array, its batch axis when the declared layout does not say it.
        out: Where to export the trained model at the end.
        plot: Where to draw the curves (PNG) when matplotlib is installed.
        callback: Called after every batch with a ``StepInfo`` (e.g. to stop a run).
        log: Receives one line per epoch and the notes.
        data_name: The data's name in messages (its file).
        val_name: The validation data's name in messages.

    Raises:
        ValueError: Bad data, options, or a checkpoint of another run.
        KeyboardInterrupt: After the checkpoint of the last completed update was written.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"--epochs and --batch-size must be >= 1, got {epochs} and {batch_size}")
    stateful = trainer.spec.stateful
    if shuffle is None:
        shuffle = not stateful
    if stateful and shuffle:
        raise ValueError(
            "--stateful carries row i of each batch's LSTM state into row i of the next batch, so the batches "
            "must come in the file's order: drop --shuffle (each stream's consecutive chunks are rows "
            "i, i + batch_size, i + 2 * batch_size, ... of the data)"
        )
    specs = data_specs(trainer, model, batch_axes)
    data, samples = prepare_data(data, specs, data_name)
    if val is not None:
        val, _ = prepare_data(val, specs, val_name)
    if stateful and samples % batch_size:
        raise ValueError(
            f"--stateful: {data_name} holds {samples} samples, not a multiple of --batch-size {batch_size}; every "
            "batch continues the streams of the one before, so each needs batch_size rows (drop the last "
            f"{samples % batch_size} samples, or choose a batch size that divides {samples})"
        )
    _check_values(trainer, model, data, data_name)
    steps_per_epoch = -(-samples // batch_size)
    if schedule is not None:
        schedule = schedule.bound(steps_per_epoch, epochs)
    config = _fit_config(batch_size, seed, samples, schedule, list(data), shuffle, shard_files(data))
    generator = np.random.Generator(np.random.PCG64(seed))
    state = FitState(epoch=0, steps_in_epoch=0, rng_state=generator.bit_generator.state)
    resumed_from = None
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    if resume:
        if checkpoint is None:
            raise ValueError("--resume needs --checkpoint PATH (the file to continue from)")
        saved, state = read_fit_state(checkpoint)
        _check_resumable(checkpoint, saved, config)
        trainer.load(checkpoint)
        resumed_from = (state.epoch, state.steps_in_epoch)
        log(f"resuming {checkpoint}: epoch {state.epoch + 1}, after update {state.steps_in_epoch} of {steps_per_epoch}")
    elif checkpoint is not None and checkpoint.exists():
        raise ValueError(f"{checkpoint} exists: pass --resume to continue that run, or choose another --checkpoint")
    target_name = trainer.signature.target
    extra_outputs = trainer.spec.extra_outputs
    stepping = False  # within an epoch's updates: the trainer's counts say where the epoch stands
    start = _batches_done(trainer) - state.steps_in_epoch
    try:
        while state.epoch < epochs:
            generator.bit_generator.state = state.rng_state
            order = generator.permutation(samples) if shuffle else np.arange(samples)
            start = _batches_done(trainer) - state.steps_in_epoch
            skipped_before = trainer.skipped_steps - state.skipped
            if stateful and state.steps_in_epoch == 0:
                trainer.reset_state()
            bar = _progress(steps_per_epoch, f"epoch {state.epoch + 1}/{epochs}")
            if bar is not None:
                bar.update(state.steps_in_epoch)
            stepping = True
            try:
                for index in range(state.steps_in_epoch, steps_per_epoch):
                    rows = order[index * batch_size : (index + 1) * batch_size]
                    lr = schedule(_batches_done(trainer)) if schedule is not None else None
                    result = trainer.step(lr=lr, **_batch_arguments(data, specs, target_name, rows))
                    loss, outputs = (result[0], result[1:]) if extra_outputs else (result, ())
                    loss_value = float(np.mean(loss))
                    state.steps_in_epoch = _batches_done(trainer) - start
                    state.skipped = trainer.skipped_steps - skipped_before
                    if math.isfinite(loss_value):
                        state.loss_sum += loss_value * len(rows)
                        state.samples += len(rows)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{loss_value:.4g}")
                    if callback is not None:
                        named = dict(zip(extra_outputs, outputs, strict=True))
                        callback(StepInfo(state.epoch + 1, index + 1, trainer.global_step, loss_value, named))
            finally:
                if bar is not None:
                    bar.close()
            stepping = False
            last = _batches_done(trainer) - 1
            record = EpochRecord(
                state.epoch + 1,
                state.loss_sum / state.samples if state.samples else math.nan,
                schedule(last) if schedule is not None else trainer.learning_rate(max(trainer.global_step, 1)),
                skipped=state.skipped,
            )
            if val is not None:
                record.val_loss, record.val_accuracy, record.val_cer = evaluate_data(trainer, val, specs, batch_size)
            log(record.line(epochs))
            state = FitState(state.epoch + 1, 0, generator.bit_generator.state, history=[*state.history, record])
            if checkpoint is not None:
                save_checkpoint(trainer, checkpoint, config, state)
    except KeyboardInterrupt:
        if stepping:  # an interrupt inside step() may come after its update was kept
            state.steps_in_epoch = _batches_done(trainer) - start
            state.skipped = trainer.skipped_steps - skipped_before
        if checkpoint is not None:
            save_checkpoint(trainer, checkpoint, config, state)
            log(
                f"interrupted: saved {checkpoint} after update {state.steps_in_epoch} of epoch {state.epoch + 1} "
                f"(global step {trainer.global_step}); continue with the same command and --resume"
            )
        else:
            log("interrupted: nothing saved (no --checkpoint)")
        raise
    result = FitResult(trainer, state.history, resumed_from)
    if out is not None:
        result.out = Path(out)
        trainer.export(result.out)
    if plot is not None:
        result.plot = plot_history(state.history, Path(plot), trainer.spec.loss.kind, log)
    return result


def _batches_done(trainer: Trainer) -> int:
    """Batches the trainer has taken: its updates and the non-finite ones it skipped."""
    return trainer.global_step + trainer.skipped_steps


def _check_values(trainer: Trainer, model: onnx.ModelProto, data: Mapping[str, Any], where: str) -> None:
    """The loss's own check of target values (class indices in range, ...) over the whole file, shard by shard."""
    target = trainer.signature.target
    if target is None or target not in data:
        return
    outputs = {value.name: value_type_of(value) for value in model.graph.output}
    values = data[target].values if isinstance(data[target], ConcatenatedRows) else data[target]
    parts = zip(values.files, values.parts, strict=True) if isinstance(values, ShardedArray) else [(where, values)]
    for part_name, part in parts:
        try:
            losses.check_target_values(
                trainer.spec.loss, outputs.get(trainer.spec.prediction), np.asarray(part), target_name=target
            )
        except ValueError as error:
            raise ValueError(f"{part_name}: {error}") from None


def plot_history(
    history: Sequence[EpochRecord], path: Path, loss_name: str, log: Callable[[str], None] = print
) -> Path | None:
    """Draws the loss curves (and accuracy or CER) per epoch to a PNG; None without matplotlib."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        log(f"no plot: matplotlib is not installed (pip install matplotlib), {path} not written")
        return None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    epochs = [record.epoch for record in history]
    metric_name, metric = next(
        (
            (name, values)
            for name, values in (
                ("val accuracy", [r.val_accuracy for r in history]),
                ("val CER", [r.val_cer for r in history]),
            )
            if any(value is not None for value in values)
        ),
        (None, None),
    )
    figure, axes = pyplot.subplots(1, 2 if metric is not None else 1, figsize=(11 if metric else 6, 4), squeeze=False)
    axes[0][0].plot(epochs, [r.train_loss for r in history], marker="o", label="train")
    if any(r.val_loss is not None for r in history):
        axes[0][0].plot(epochs, [r.val_loss for r in history], marker="o", label="val")
    axes[0][0].set_xlabel("epoch")
    axes[0][0].set_ylabel(f"loss ({loss_name})")
    axes[0][0].legend()
    if metric is not None:
        axes[0][1].plot(epochs, metric, marker="o")
        axes[0][1].set_xlabel("epoch")
        axes[0][1].set_ylabel(metric_name)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def build_trainer(
    model: str | Path,
    *,
    loss: losses.Loss,
    optimizer: optimizers.Optimizer,
    threads: int | None = None,
    **options: Any,
) -> tuple[Trainer, onnx.ModelProto]:
    """The Trainer of ``model`` (a path) and the model as loaded (for ``data_specs``).

    Args:
        model: The model file.
        loss: The Trainer's.
        optimizer: The Trainer's.
        threads: The Trainer's.
        **options: Any other keyword of ``Trainer`` (``TRAINER_OPTIONS``).
    """
    unknown = sorted(set(options) - set(TRAINER_OPTIONS))
    if unknown:
        raise TypeError(f"build_trainer: {unknown} are not Trainer options; they are {sorted(TRAINER_OPTIONS)}")
    path = Path(model)
    if not path.is_file():
        raise FileNotFoundError(f"no model file {str(path)!r}")
    loaded = onnx.load(str(path))
    return Trainer(loaded, loss=loss, optimizer=optimizer, threads=threads, **options), loaded
