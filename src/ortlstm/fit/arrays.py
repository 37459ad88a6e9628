"""What fit's arrays must be for a model (``ArraySpec``, ``data_specs``), their checks, and a batch's rows.

Everything here is checked before anything is trained: names, dtypes, shapes, batch axes, sample
counts, ctc_loss's concatenated labels, and the loss's own check of target values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np
import onnx

from ortlstm.datafiles import ConcatenatedRows, ShardedArray, bind_batch_axes, take_rows
from ortlstm.graphs import losses
from ortlstm.graphs.emit.emitter import ValueType, value_type_of
from ortlstm.graphs.prepare.fixed_dims import ExportDim, read_export_dims
from ortlstm.training import CarriedState, Trainer, with_carried_state

_BATCH_WORDS = ("batch", "n")  # a declared dim named so (any case, "batch" as a part) is the batch axis


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
        other: How to take the other kind of target the loss could read (cross_entropy's class
            probabilities or indices), for messages, or "".
        export_dims: The dims of this model input that the export fixed and the Trainer could not
            free (their messages say how to re-export, not ``--batch-axis``).
    """

    name: str
    role: str
    dtypes: tuple[np.dtype, ...]
    shape: tuple[int | str | None, ...] | None
    batch_axis: int
    required: bool = True
    lengths: str | None = None
    other: str = ""
    export_dims: tuple[ExportDim, ...] = ()

    def expected(self) -> str:
        """``float32 [batch, 8, 8] (batch axis 0)`` for messages."""
        dims = "any shape" if self.shape is None else "[" + ", ".join(_dim_text(d) for d in self.shape) + "]"
        dtypes = " or ".join(str(dtype) for dtype in self.dtypes)
        return f"{dtypes} {dims} (batch axis {self.batch_axis})"


def _dim_text(dim: int | str | None) -> str:
    return str(dim) if isinstance(dim, (int, str)) and dim not in (0, -1) else "?"


def _fixed(dim: int | str | None) -> bool:
    return isinstance(dim, int) and dim > 0


def _is_batch_dim(dim: int | str | None) -> TypeGuard[str]:
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
    """The LSTMs and GRUs whose state a stateful trainer carries (their initial states are not data), else ()."""
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
    declared = _declared_types(trainer, model)
    kept = [dim for dim in read_export_dims(trainer._models["eval"]) if not dim.freed]
    carried = {initial for state in carried_states(trainer, model) for initial, _ in state.states}
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
        fixed = tuple(dim for dim in kept if dim.input == name)
        specs[name] = ArraySpec(name, "model input", (dtype,), shape, axis, export_dims=fixed)
    if signature.target is not None:
        prediction = trainer.spec.prediction
        target = _target_spec(loss, signature.target, declared.get(prediction) if prediction else None, batch_dim)
        lengths = signature.extra_targets.get(target.lengths) if target.lengths is not None else None
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


def _declared_types(trainer: Trainer, model: onnx.ModelProto) -> dict[str, ValueType | None]:
    """The model's declared input and output types, with the dims the Trainer freed symbolic.

    An export that fixed a batch (or sequence length) the Trainer freed (``free_export_dims``)
    takes any size there, as the training models do.
    """
    declared = {value.name: value_type_of(value) for value in [*model.graph.input, *model.graph.output]}
    trained = trainer._models["eval"]  # the training models' own declarations
    freed = {dim.symbol for dim in read_export_dims(trained) if dim.freed}
    for value in [*trained.graph.input, *trained.graph.output] if freed else ():
        mine, given = value_type_of(value), declared.get(value.name)
        if mine is None or given is None or mine.shape is None or given.shape is None:
            continue
        if len(mine.shape) == len(given.shape):
            dims = tuple(m if m in freed else g for m, g in zip(mine.shape, given.shape, strict=True))
            declared[value.name] = ValueType(given.elem_type, dims)
    return declared


def _target_spec(loss: losses.Loss, name: str, prediction: ValueType | None, batch_dim: str | None) -> ArraySpec:
    """The target array: what ``losses.target_facts`` says a train step of ``loss`` takes (the Trainer's check too).

    Labels with per-sample lengths (``facts.lengths``: ctc_loss's) come padded or concatenated, any
    rank, samples on axis 0; its ``lengths`` is the loss's port here, the array's name in ``data_specs``.
    """
    facts = losses.target_facts(loss, prediction)
    assert facts is not None
    dtypes = tuple(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) for elem in facts.elem_types)
    if facts.lengths is not None:
        layout = f"padded [N, S] or concatenated [sum({facts.lengths})]"
        return ArraySpec(name, f"{loss.kind}'s {facts.what}: {layout}", dtypes, None, 0, lengths=facts.lengths)
    option = f"--loss-option class_probabilities={str(not loss.class_probabilities).lower()}"
    other = f"{facts.other} ({option})" if facts.other else ""
    axis = declared_batch_axis(facts.shape, batch_dim)
    return ArraySpec(name, f"{loss.kind}'s {facts.what}", dtypes, facts.shape, axis, other=other)


def _shape_hint(array: np.ndarray, spec: ArraySpec) -> str:
    """What to do about an array of the wrong shape: re-export for a dim the export fixed, else --batch-axis."""
    if spec.shape is not None and array.ndim == len(spec.shape):
        for dim in spec.export_dims:
            if dim.axis != spec.batch_axis and array.shape[dim.axis] != dim.size:
                return f"its dim {dim.axis} is {array.shape[dim.axis]}: {dim.advice()}"
    return f"the batch axis stacks the samples (--batch-axis {spec.name}=AXIS sets another)"


def check_export_batch(specs: Mapping[str, ArraySpec], batch_size: int, samples: Mapping[str, int]) -> None:
    """Refuses, before training, batches of another size than a batch the export fixed for good.

    A fit of ``samples`` (by data name) in batches of ``batch_size`` feeds a last batch of what is
    left; each batch must have the export's size where the Trainer could not free it.

    Raises:
        ValueError: ``batch_size`` differs from that size, or a data file's last batch would.
    """
    for spec in specs.values():
        for dim in spec.export_dims:
            if dim.axis != spec.batch_axis:
                continue
            ragged = {name: count % dim.size for name, count in samples.items() if count % dim.size}
            if batch_size == dim.size and not ragged:
                continue
            left = ", ".join(f"{name}: {samples[name]} samples, last batch {rest}" for name, rest in ragged.items())
            raise ValueError(
                f"--batch-size {batch_size}: {dim.advice()}; or pass --batch-size {dim.size} with a multiple of "
                f"{dim.size} samples" + (f" ({left})" if left else "")
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
    _check_names(arrays, specs, where)
    counts: dict[str, int] = {}
    for name, array in arrays.items():
        spec = specs[name]
        if array.dtype not in spec.dtypes:
            # Integers for a float target, or floats with a class axis for indices, are the other kind of
            # target (class indices, class probabilities), never a cast away.
            integers, wants_integers = array.dtype.kind in "iu", spec.dtypes[0].kind in "iu"
            with_classes = spec.shape is not None and array.ndim == len(spec.shape) + 1
            other_kind = spec.other and ((integers and not wants_integers) or (wants_integers and with_classes))
            advice = "" if other_kind else f"pass it as array.astype(np.{spec.dtypes[0]})"
            if spec.other:
                advice = f"{advice}; {spec.other}" if advice else spec.other
            raise ValueError(
                f"{where}: array {name!r} ({spec.role}) must be {spec.expected()}, got {array.dtype} "
                f"{list(array.shape)}; {advice}"
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
                f"{list(array.shape)}; {_shape_hint(array, spec)}"
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
        if spec.lengths is not None and _is_concatenated(array, spec) and spec.lengths in arrays:
            labels = _sum(arrays[spec.lengths])
            if labels != array.shape[0]:
                raise ValueError(
                    f"{where}: array {name!r} holds {array.shape[0]} concatenated labels, but {spec.lengths!r} "
                    f"sums to {labels}; pass every sample's labels end to end (or padded [N, S])"
                )
    return count


def _check_names(arrays: Mapping[str, Any], specs: Mapping[str, ArraySpec], where: str) -> None:
    """Checks that ``arrays`` holds every required array of ``specs`` and nothing else."""
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
        if spec.lengths is None or not _is_concatenated(array, spec):
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


def check_values(trainer: Trainer, model: onnx.ModelProto, data: Mapping[str, Any], where: str) -> None:
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


def batch_arguments(
    arrays: Mapping[str, np.ndarray], specs: Mapping[str, ArraySpec], target: str | None, rows: np.ndarray
) -> dict[str, Any]:
    """Keywords for ``Trainer.step``/``evaluate``: inputs and extra targets by name, ``target=``."""
    named: dict[str, Any] = {}
    for name, array in arrays.items():
        value = take_rows(array, specs[name].batch_axis, rows)
        named["target" if name == target else name] = value
    return named
