"""The feeds of a run: the batch and its targets, checked against the model, and the carried LSTM/GRU/RNN state.

A batch comes as the model's inputs in order or by name; each is checked against the type and
the fixed dims the model declares, a target against what the loss takes (``losses.check_target``,
once per shape), and a stateful trainer's LSTMs get their carried state (or zeros) as inputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper

from ortlstm.graphs import losses
from ortlstm.graphs.carried_state import CarriedState
from ortlstm.graphs.emit.emitter import ValueType, infer_value_types, value_type_of
from ortlstm.graphs.prepare.fixed_dims import ExportDim, read_export_dims
from ortlstm.graphs.train_step import TrainStepSignature
from ortlstm.training.spec import DEFAULT_TARGET, TrainingSpec


def _as_array(value: Any, what: str, where: str) -> np.ndarray:
    """``value`` as a NumPy array (a list or a scalar is converted as NumPy converts it).

    Raises:
        ValueError: Something that is not numbers: a dict (``step(**batch)`` passes one by name),
            a string, a ragged list.
    """
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Mapping):
        raise ValueError(
            f"{where}: {what} is a {type(value).__name__} of {list(value)}; pass arrays by name instead: "
            f"{where.rstrip('()')}(**batch) or {where.rstrip('()')}(x=..., target=...)"
        )
    try:
        array = np.asarray(value)
    except ValueError as error:
        raise ValueError(f"{where}: {what} is not an array of numbers ({error}); pass a NumPy array") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"{where}: {what} is not numbers: got {type(value).__name__} {str(value)[:60]!r}; pass a NumPy array"
        )
    return array


def _constrains(dim: int | str | None) -> bool:
    """Whether a declared dim fixes a size: only a positive int (an exporter's -1 or 0 means dynamic)."""
    return isinstance(dim, int) and dim > 0


def _dims_text(shape: Sequence[int | str | None] | None) -> str:
    if shape is None:
        return "of unknown shape"
    return "[" + ", ".join(str(d) if _constrains(d) or isinstance(d, str) else "?" for d in shape) + "]"


class Feeds:
    """Builds and checks the feeds of the training models; keeps the carried LSTM/GRU/RNN state.

    Attributes:
        carried: The LSTMs and GRUs whose state is carried (empty unless stateful).
        carried_values: The state the next step starts from, by initial_h/initial_c input
            (None: zeros).
        prediction: The prediction's type as the last batch's target was checked against (its
            dims resolved from the batch's inputs where the model says them), or None.
    """

    def __init__(
        self,
        signature: TrainStepSignature,
        spec: TrainingSpec,
        carried: tuple[CarriedState, ...],
        eval_model: onnx.ModelProto,
        original: onnx.ModelProto | None = None,
    ) -> None:
        self._signature = signature
        self._spec = spec  # only what decides the graphs is read: loss, prediction, target
        self._eval_model = eval_model
        self.carried = carried
        self.carried_values: dict[str, np.ndarray] | None = None
        self.prediction: ValueType | None = None
        carried_inputs = {initial for state in carried for initial, _ in state.states}
        self._user_inputs = tuple(name for name in signature.batch_inputs if name not in carried_inputs)
        inputs = {value.name: value_type_of(value) for value in eval_model.graph.input}
        self._batch_types = {name: inputs[name] for name in self._user_inputs}
        self._types: dict[str, ValueType] | None = None
        self._export_dims = {(dim.input, dim.axis): dim for dim in read_export_dims(eval_model) if not dim.freed}
        self._checked_targets: set[tuple[Any, ...]] = set()
        self._concrete_predictions: dict[tuple[Any, ...], ValueType | None] = {}
        # The prediction as the model declares it: its dim names say which input dims its own are
        # where inference lost them (a torch export's LSTM output becomes [unk__5, C]).
        declared = {value.name: value_type_of(value) for value in (original or eval_model).graph.output}
        self._declared_prediction = declared.get(spec.prediction) if spec.prediction is not None else None
        self._expected_dtypes = {
            name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.elem_type))
            for name, value in self._batch_types.items()
            if value is not None
        }

    def batch(
        self, batch: Sequence[Any], named: Mapping[str, Any], target: Any, where: str, carry: bool = True
    ) -> dict[str, np.ndarray]:
        """The feeds of a batch: its inputs, the carried state (zeros unless ``carry``) and its targets.

        Raises:
            ValueError: A missing, unknown or doubly given input, one of another type or fixed
                dim, a target the loss does not take or lacks.
        """
        # The loss's other targets (ctc_loss's lengths) come as keywords named as their inputs.
        extra_given = {port: named[name] for port, name in self._signature.extra_targets.items() if name in named}
        named = {name: value for name, value in named.items() if name not in self._signature.extra_targets.values()}
        feeds = self._inputs(batch, named, where)
        sizes = self._check_inputs(feeds, where)
        if self.carried:
            feeds.update(self._carried_feeds(sizes, where, carry))
        spec = self._spec
        if not spec.loss.needs_target:
            if target is not None:
                raise ValueError(f"{where}: the loss is the model output {spec.prediction!r}; it takes no target")
            return feeds
        if target is None:
            raise ValueError(f"{where}: the loss {spec.loss.kind} needs target=... (the labels of this batch)")
        feeds.update(self._target_feeds(_as_array(target, "target", where), extra_given, sizes, where, feeds))
        return feeds

    def _inputs(self, batch: Sequence[Any], named: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
        names = self._user_inputs
        if len(batch) > len(names):
            hint = "; the target goes by keyword: target=..." if len(batch) == len(names) + 1 else ""
            raise ValueError(
                f"{where}: {len(batch)} positional inputs, but the model has {len(names)}: {list(names)}{hint}"
            )
        feeds: dict[str, np.ndarray] = {}
        for name, value in zip(names, batch, strict=False):
            feeds[name] = _as_array(value, f"input {name!r}", where)
        for name, value in named.items():
            if name not in names:
                raise ValueError(f"{where}: {name!r} is not an input of the model; its inputs are {list(names)}")
            if name in feeds:
                raise ValueError(f"{where}: input {name!r} given both by position and by name")
            feeds[name] = _as_array(value, f"input {name!r}", where)
        missing = [name for name in names if name not in feeds]
        if missing:
            raise ValueError(
                f"{where}: missing batch input(s) {missing}; the model's inputs are {list(names)} "
                "(pass them in that order, or by name)"
            )
        return feeds

    def _check_inputs(self, feeds: Mapping[str, np.ndarray], where: str) -> dict[str, int]:
        """Checks each input's type and fixed dims; returns the sizes of the named dims."""
        sizes: dict[str, int] = {}
        for name in self._user_inputs:
            declared = self._batch_types[name]
            value = feeds[name]
            if declared is None:
                continue
            expected_dtype = self._expected_dtypes[name]
            rank_ok = declared.shape is None or len(declared.shape) == value.ndim
            dims_ok = rank_ok and (
                declared.shape is None
                or all(not _constrains(d) or d == actual for d, actual in zip(declared.shape, value.shape, strict=True))
            )
            if value.dtype == expected_dtype and rank_ok and not dims_ok:
                self._refuse_export_dim(name, declared.shape, value.shape, where)  # type: ignore[arg-type]
            if value.dtype != expected_dtype or not dims_ok:
                raise ValueError(
                    f"{where}: input {name!r} must be {expected_dtype} {_dims_text(declared.shape)}, "
                    f"got {value.dtype} {list(value.shape)}"
                    + (f"; pass np.asarray(..., np.{expected_dtype})" if value.dtype != expected_dtype else "")
                )
            free = [axis for axis, dim in enumerate(declared.shape or ()) if not _constrains(dim)]
            empty = [axis for axis in free if not value.shape[axis]]
            if empty:
                raise ValueError(
                    f"{where}: input {name!r} holds no samples (shape {list(value.shape)}, axis {empty[0]} is 0); "
                    "a step or evaluation needs at least one (torch's mean over an empty batch is nan): skip the batch"
                )
            for dim, actual in zip(declared.shape or (), value.shape, strict=False):
                if isinstance(dim, str):
                    sizes.setdefault(dim, actual)
        return sizes

    def _prediction_type(self, sizes: Mapping[str, int], inputs: Mapping[str, np.ndarray]) -> ValueType | None:
        """The prediction's type with each dim the batch's inputs decide made its size.

        An inferred symbolic dim named as an input's dim takes that input's size; where inference
        lost the name, the model's declared output dim (of the same rank) says it, as ``fit``
        reads it; where neither does, shape inference with the batch's input shapes (once per
        shapes).
        """
        prediction = self.value_type(self._spec.prediction)  # type: ignore[arg-type]
        if prediction is None or prediction.shape is None:
            return prediction
        declared = self._declared_prediction
        declared_shape = declared.shape if declared is not None else None
        if declared_shape is None or len(declared_shape) != len(prediction.shape):
            declared_shape = (None,) * len(prediction.shape)

        def resolved(dim: int | str | None, named: int | str | None) -> int | str | None:
            # The declared output lends its dim names only: a size it fixes may be one the export
            # fixed and prepare freed (free_export_dims), which inference of the eval model knows.
            if _constrains(dim):
                return dim
            for candidate in (dim, named):
                if isinstance(candidate, str) and candidate in sizes:
                    return sizes[candidate]
            return dim

        shape = tuple(resolved(dim, named) for dim, named in zip(prediction.shape, declared_shape, strict=True))
        if not all(_constrains(dim) for dim in shape):
            concrete = self._inferred_with(inputs)
            if concrete is not None and concrete.shape is not None and len(concrete.shape) == len(shape):
                shape = tuple(
                    dim if _constrains(dim) or not _constrains(known) else known
                    for dim, known in zip(shape, concrete.shape, strict=True)
                )
        return ValueType(prediction.elem_type, shape)

    def _inferred_with(self, inputs: Mapping[str, np.ndarray]) -> ValueType | None:
        """The prediction's type by shape inference of the eval model fed inputs of these shapes (cached)."""
        key = tuple(sorted((name, value.shape) for name, value in inputs.items()))
        if key not in self._concrete_predictions:
            model = onnx.ModelProto()
            model.CopyFrom(self._eval_model)
            for value in model.graph.input:
                if value.name in inputs and value.type.tensor_type.HasField("shape"):
                    for dim, size in zip(value.type.tensor_type.shape.dim, inputs[value.name].shape, strict=False):
                        dim.dim_value = int(size)  # replaces a dim_param (one field of a oneof)
            try:
                found = infer_value_types(model).get(self._spec.prediction)  # type: ignore[arg-type]
            except onnx.shape_inference.InferenceError:
                found = None
            if len(self._concrete_predictions) >= 16:  # a loop feeds a few shapes; bound what is kept
                self._concrete_predictions.clear()
            self._concrete_predictions[key] = found
        return self._concrete_predictions[key]
    def _refuse_export_dim(
        self, name: str, declared: Sequence[int | str | None], actual: Sequence[int], where: str
    ) -> None:
        """Raises the export's reason when the first wrong dim is one the export fixed (a batch of 8, say).

        Raises:
            ValueError: That dim is one ``prepare``'s ``free_export_dims`` kept (it names the node
                that depends on it and the export argument that frees it).
        """
        for axis, (dim, size) in enumerate(zip(declared, actual, strict=True)):
            if _constrains(dim) and dim != size:
                fixed: ExportDim | None = self._export_dims.get((name, axis))
                if fixed is not None:
                    raise ValueError(
                        f"{where}: input {name!r} has {fixed.kind} {size} at dim {axis}, but {fixed.advice()}; "
                        f"or pass batches of shape {_dims_text(declared)}"
                    )
                return

    def _target_feeds(
        self,
        target_array: np.ndarray,
        extra_given: Mapping[str, Any],
        sizes: Mapping[str, int],
        where: str,
        inputs: Mapping[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        """The target and the loss's other targets, checked against the prediction (its batch too) before running.

        A target of fewer axes than the prediction that the loss broadcasts (torch's rule, see
        ``losses.BROADCASTS``) gets leading axes of 1, as broadcasting reads it; one of another
        size than the prediction gets torch's warning where torch gives it.
        """
        spec = self._spec
        target_name = spec.target or DEFAULT_TARGET
        if target_array.dtype == np.int32:
            target_array = target_array.astype(np.int64)  # torch's index type; the graph reads int64
        prediction = self.prediction = self._prediction_type(sizes, inputs)
        target_elem = (
            onnx.helper.np_dtype_to_tensor_dtype(target_array.dtype) if target_array.dtype.kind in "iufb" else 0
        )
        given_type = ValueType(target_elem, tuple(target_array.shape))
        extra_feeds = self._extra_target_feeds(extra_given, where)
        extra_types = {
            port: ValueType(onnx.TensorProto.INT64, tuple(value.shape))
            for port, value in extra_feeds.items()
            if value.size or port in extra_given
        }
        key = (prediction, given_type, tuple(sorted(extra_types.items())))
        if key not in self._checked_targets:  # a loop feeds the same shapes
            try:
                losses.check_target(
                    spec.loss,
                    prediction,
                    given_type,
                    prediction_name=spec.prediction or "prediction",  # check_target's own default name
                    target_name=target_name,
                    extra_types=extra_types,
                )
                # What the loss takes that this train step does not (cross_entropy's other kind of target).
                losses.check_target_type(spec.loss, prediction, given_type, target_name=target_name)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
            self._checked_targets.add(key)
        warning = losses.target_size_warning(spec.loss, prediction, given_type)
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=4)  # at the caller of step/accumulate/evaluate
        losses.check_target_values(spec.loss, prediction, target_array, target_name=target_name)
        facts = losses.target_facts(spec.loss, prediction)
        if facts is not None and facts.shape is not None and target_array.ndim < len(facts.shape):
            # Only a broadcasting loss got here with fewer axes: broadcasting reads them as leading 1s.
            target_array = target_array.reshape((1,) * (len(facts.shape) - target_array.ndim) + target_array.shape)
        feeds = {spec.target: target_array}
        feeds.update({self._signature.extra_targets[port]: value for port, value in extra_feeds.items()})
        return feeds  # type: ignore[return-value]

    def _extra_target_feeds(self, given: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
        """The loss's other targets (ctc_loss's lengths) by torch name: int64, or empty for a derived one.

        Raises:
            ValueError: A required one is missing, or one is not an integer array.
        """
        feeds: dict[str, np.ndarray] = {}
        loss = self._spec.loss
        for extra in loss.extra_targets:
            keyword = self._signature.extra_targets[extra.name]
            if extra.name not in given:
                if extra.required:
                    raise ValueError(f"{where}: the loss {loss.kind} needs {keyword}=... ({extra.doc})")
                feeds[extra.name] = np.zeros(0, np.int64)  # the loss derives it
                continue
            value = np.asarray(given[extra.name])
            if value.dtype.kind not in "iu":
                raise ValueError(
                    f"{where}: {keyword} must be integers ({extra.doc}), got {value.dtype} {list(value.shape)}"
                )
            feeds[extra.name] = value.astype(np.int64, copy=False)
        return feeds

    def value_type(self, name: str) -> ValueType | None:
        """The type of a value of the eval model, by shape inference (run once)."""
        if self._types is None:
            self._types = infer_value_types(self._eval_model)
        return self._types.get(name)

    def _carried_feeds(self, sizes: Mapping[str, int], where: str, carry: bool) -> dict[str, np.ndarray]:
        """The initial state of each carried LSTM and GRU: the last final state, or zeros."""
        feeds: dict[str, np.ndarray] = {}
        for state in self.carried:
            sequence = self.value_type(state.sequence)
            dim = None if sequence is None or sequence.shape is None else sequence.shape[state.batch_axis]
            batch_size = sizes.get(dim) if isinstance(dim, str) else dim
            if batch_size is None:
                raise ValueError(
                    f"{where}: stateful: the batch size of {state.op_type} {state.node!r} (axis {state.batch_axis} "
                    f"of its input {state.sequence!r}) does not follow from the model's input shapes"
                )
            dtype = onnx.helper.tensor_dtype_to_np_dtype(state.elem_type)
            zeros = np.zeros(state.shape(batch_size), dtype)
            for name, _ in state.states:
                value = self.carried_values.get(name) if carry and self.carried_values is not None else None
                if value is not None and value.shape != zeros.shape:
                    raise ValueError(
                        f"{where}: stateful: the batch has {batch_size} rows, the carried state of {state.op_type} "
                        f"{state.node!r} {value.shape[state.batch_axis]}; call reset_state() when the batch changes"
                    )
                feeds[name] = zeros if value is None else value
        return feeds

    def keep_carried(self, named: Mapping[str, np.ndarray]) -> None:
        """Keeps the final states among a run's outputs as the next initial states."""
        if self.carried:
            self.carried_values = {}
            for state in self.carried:
                for initial, final in state.states:
                    self.carried_values[initial] = named[final]

    def restore_carried(self, saved: Mapping[str, np.ndarray]) -> None:
        """Takes a checkpoint's carried state (sorted by name there) in the graph's order, as keep_carried does."""
        order = [initial for state in self.carried for initial, _ in state.states]
        self.carried_values = {name: saved[name] for name in order if name in saved} or None

    def reset(self, rows: Sequence[int] | np.ndarray | None) -> None:
        """Zeros the carried state: all of it, or the given batch rows."""
        if rows is None or self.carried_values is None:
            self.carried_values = None
            return
        for state in self.carried:
            for name, _ in state.states:
                value = self.carried_values[name].copy()
                index: tuple[Any, ...] = (slice(None), rows) if state.batch_axis == 1 else (rows,)
                value[index] = 0
                self.carried_values[name] = value
