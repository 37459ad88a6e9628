"""The Trainer: trains an exported model in any onnxruntime, without onnxruntime-training or torch.

It runs the models ``ortlstm.graphs.train_step.build_training_models`` builds (train step, eval,
gradients, apply) in ``onnxruntime.InferenceSession``s with the ortlstm kernel library, keeps the
parameters and optimizer state between steps, and offers what onnxruntime-training's Module,
Optimizer and CheckpointState gave: steps, evaluation, learning-rate schedules, gradient
accumulation, one-file checkpoints (safetensors) and the trained model in its original form
(standard ONNX ``LSTM`` nodes), which any onnxruntime runs without ortlstm.

onnxruntime is imported lazily (building models needs only onnx); onnxruntime.training never.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.autodiff.emitter import ValueType, infer_value_types, value_type_of
from ortlstm.graphs.carried_state import CarriedState, with_carried_state  # noqa: F401 - CarriedState: public here
from ortlstm.graphs.convert import MAX_IR_VERSION
from ortlstm.graphs.export_metadata import read_torch_origins
from ortlstm.graphs.parameters import TrainedParameter
from ortlstm.graphs.structure import all_graphs, graph_hash, set_constant, without_unused_initializers
from ortlstm.graphs.train_step import TrainStepSignature, build_training_models

CHECKPOINT_FORMAT = "ortlstm.trainer/1"
DIRECTORY_FORMAT = "ortlstm.training-directory/1"
MODEL_KINDS = ("train_step", "eval", "gradients", "apply")
ORIGINAL_FILE = "model.onnx"
MANIFEST_FILE = "training.json"
STATE_FILE = "state.safetensors"

LearningRate = float | Callable[[int], float]
"""A constant, or ``schedule(n) -> lr`` for the update that follows ``n`` completed updates."""

NONFINITE_MODES = ("raise", "skip")
"""What a Trainer does with an update whose loss or gradients are not finite (``Trainer(nonfinite=...)``)."""


class NonFiniteStepError(FloatingPointError):
    """An update was refused because its loss or gradients were not finite; the trainer is unchanged.

    A ``FloatingPointError`` (what NumPy raises under ``np.errstate(all="raise")``): the arithmetic
    of the step produced NaN or inf, whether from a bad batch or from a diverging run, so it is not
    a bad argument (``ValueError``). Raised by ``Trainer.step`` and ``Trainer.apply`` in the default
    ``nonfinite="raise"`` mode, before anything is kept: the parameters, the optimizer state,
    ``global_step`` and a stateful trainer's carried LSTM state are those before the call.

    Attributes:
        step: The number the refused update would have had (``global_step + 1``). The
            attributes are None in a copy made by pickling (which keeps the message).
        loss: The loss of the step (``apply``: the first non-finite micro-batch loss, else None).
        grad_norm: The total gradient norm when known (the clipped norm, or the 2-norm of the
            diagnosed gradients), else None.
        nonfinite_grads: The parameters whose gradients hold NaN or inf, when known, else None.
    """

    def __init__(
        self,
        message: str,
        *,
        step: int | None = None,
        loss: float | np.ndarray | None = None,
        grad_norm: float | None = None,
        nonfinite_grads: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.loss = loss
        self.grad_norm = grad_norm
        self.nonfinite_grads = nonfinite_grads


# ---- the training specification (what build_training_models was given) -------------------------


@dataclasses.dataclass(frozen=True)
class TrainingSpec:
    """Everything that decides the training graphs besides the model; saved with every checkpoint.

    Attributes:
        loss: The loss.
        optimizer: The optimizer and its hyperparameters.
        requires_grad: The trained parameters (resolved: never None).
        prediction: The model output the loss reads.
        target: Name of the target input (None when a model output is the loss).
        extra_outputs: Model outputs a step returns with the loss.
        param_groups: Per-group optimizer overrides.
        clip_grad_norm: Maximum global gradient norm, or None.
        clip_norm_type: The norm's type.
        stateful: Each LSTM's final state is the next step's initial state (truncated BPTT).
        frozen: Names, globs or module prefixes of parameters left untrained (as given).
        fixed_shapes: Input shapes fixed for training (``prepare_model``), or None.
        ir_version: The IR version of the training models.
    """

    loss: losses.Loss
    optimizer: optimizers.Optimizer
    requires_grad: tuple[str, ...]
    prediction: str
    target: str | None
    extra_outputs: tuple[str, ...] = ()
    param_groups: tuple[optimizers.ParamGroup, ...] = ()
    clip_grad_norm: float | None = None
    clip_norm_type: float = 2.0
    stateful: bool = False
    frozen: tuple[str, ...] = ()
    fixed_shapes: dict[str, tuple[int | str | None, ...]] | None = None
    ir_version: int = MAX_IR_VERSION

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready description (exact floats: JSON keeps Python's repr)."""
        loss = {field.name: getattr(self.loss, field.name) for field in dataclasses.fields(self.loss)}
        for key in ("weight", "pos_weight"):
            if loss[key] is not None:
                loss[key] = np.asarray(loss[key]).tolist()
        optimizer = {field.name: getattr(self.optimizer, field.name) for field in dataclasses.fields(self.optimizer)}
        return {
            "loss": loss,
            "optimizer": {"name": self.optimizer.torch_name, **_listed(optimizer)},
            "requires_grad": list(self.requires_grad),
            "prediction": self.prediction,
            "target": self.target,
            "extra_outputs": list(self.extra_outputs),
            "param_groups": [_listed(dataclasses.asdict(group)) for group in self.param_groups],
            "clip_grad_norm": self.clip_grad_norm,
            "clip_norm_type": self.clip_norm_type,
            "stateful": self.stateful,
            "frozen": list(self.frozen),
            "fixed_shapes": _listed(self.fixed_shapes) if self.fixed_shapes is not None else None,
            "ir_version": self.ir_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingSpec:
        """The inverse of ``to_json``."""
        optimizer = dict(data["optimizer"])
        return cls(
            loss=losses.Loss(**data["loss"]),
            optimizer=optimizers.optimizer_from_torch(optimizer.pop("name"), **optimizer),
            requires_grad=tuple(data["requires_grad"]),
            prediction=data["prediction"],
            target=data["target"],
            extra_outputs=tuple(data["extra_outputs"]),
            param_groups=tuple(optimizers.ParamGroup(**group) for group in data["param_groups"]),
            clip_grad_norm=data["clip_grad_norm"],
            clip_norm_type=data["clip_norm_type"],
            stateful=bool(data.get("stateful", False)),
            frozen=tuple(data.get("frozen", ())),
            fixed_shapes=_fixed_shapes(data.get("fixed_shapes")),
            ir_version=int(data.get("ir_version", MAX_IR_VERSION)),
        )


def _fixed_shapes(
    shapes: Mapping[str, Sequence[int | str | None]] | None,
) -> dict[str, tuple[int | str | None, ...]] | None:
    """``fixed_shapes`` in the spec's form (tuples, so that specs compare and hash alike)."""
    return None if shapes is None else {name: tuple(dims) for name, dims in shapes.items()}


def _listed(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


def _signature_from_json(data: Mapping[str, Any]) -> TrainStepSignature:
    fields = {field.name for field in dataclasses.fields(TrainStepSignature)}
    values = {key: tuple(value) if isinstance(value, list) else value for key, value in data.items() if key in fields}
    return TrainStepSignature(**values)


# ---- export ------------------------------------------------------------------------


def export_trained_model(original: onnx.ModelProto, params: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The original model with the trained values: standard ops only, no ortlstm needed to run it.

    The graph is the one given, as shipped: its opset and IR version stay even when training
    converted an old opset up (``prepare_model``), and only tensor values change. Each parameter
    goes back where preparation found it: an initializer of the main graph or of a subgraph (a
    specialized ``If`` branch), or a ``Constant`` node's value in the form the node held it.

    Raises:
        ValueError: A parameter is found nowhere in the model, or its shape or type differs.
    """
    result = onnx.ModelProto()
    result.CopyFrom(original)
    places: dict[str, onnx.TensorProto | onnx.NodeProto] = {}
    for graph in all_graphs(result.graph):
        for init in graph.initializer:
            places.setdefault(init.name, init)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
                places.setdefault(node.output[0], node)
    missing = sorted(set(params) - set(places))
    if missing:
        raise ValueError(
            f"export: {missing} are neither initializers nor Constant outputs of the original model; "
            "was the trainer built from a different model?"
        )
    for name, value in params.items():
        place = places[name]
        before = onnx.numpy_helper.to_array(place) if isinstance(place, onnx.TensorProto) else None
        if before is not None and (before.shape != value.shape or before.dtype != value.dtype):
            raise ValueError(
                f"export: {name!r} is {before.dtype} {list(before.shape)} in the model, "
                f"the trained value is {value.dtype} {list(value.shape)}"
            )
        # np.ascontiguousarray turns a 0-D array into a 1-D one: keep the parameter's own shape.
        contiguous = np.ascontiguousarray(value).reshape(np.shape(value))
        if isinstance(place, onnx.TensorProto):
            place.CopyFrom(onnx.numpy_helper.from_array(contiguous, name))
        else:
            set_constant(place, contiguous)
    return result


def _load_model(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(model)
    if not path.is_file():
        raise FileNotFoundError(f"no model file {str(path)!r}")
    return onnx.load(str(path))


# ---- the trainer ------------------------------------------------------------------------------------


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ModuleNotFoundError as error:
        raise ImportError("the Trainer runs models in onnxruntime: pip install 'ortlstm[infer]'") from error
    return onnxruntime


_SHARED_ARENA: list[bool] = []  # [registered]: the process-wide CPU arena of _plan_training_memory


def _plan_training_memory(ort: Any, options: Any) -> None:
    """Session options that keep a training step's memory near what it needs.

    onnxruntime's defaults double it for a train step: the first run allocates every intermediate
    from the session's arena, which grows by powers of two and keeps what it took; from the second
    run on the memory pattern allocates one block for all of them beside it. So the training
    sessions plan no memory pattern and share one process-wide CPU arena that grows by what is
    requested (``kSameAsRequested``), registered once (``create_and_register_allocator``; one
    that the application registered first is used as it is). Measured with
    benchmarks/bench_memory.py (bidirectional LSTM classifier, AdamW, 5 steps, 2 threads, Xeon
    AVX-512 VM): at (128, 64, 256, 512) 679 -> 480 MiB added (PyTorch: 527), step time within 1%
    (interleaved); at (64, 32, 128, 256) x 2 layers the step was within 3%.
    """
    options.enable_mem_pattern = False
    if not _SHARED_ARENA:
        memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        try:  # max_mem 0: no cap; extend strategy 1: kSameAsRequested; -1: defaults
            ort.create_and_register_allocator(memory, ort.OrtArenaCfg(0, 1, -1, -1))
        except RuntimeError as error:
            if "already been registered" not in str(error):
                raise
        _SHARED_ARENA.append(True)
    options.add_session_config_entry("session.use_env_allocators", "1")


def _loss_value(value: np.ndarray) -> float | np.ndarray:
    return float(value.reshape(())) if value.size == 1 else value


def _constrains(dim: int | str | None) -> bool:
    """Whether a declared dim fixes a size: only a positive int (an exporter's -1 or 0 means dynamic)."""
    return isinstance(dim, int) and dim > 0


def _all_finite(value: np.ndarray) -> bool:
    return bool(np.isfinite(value).all())


def _loss_text(loss: Any) -> str:
    """A loss for a message: the number, or how many of its elements are not finite."""
    array = np.asarray(loss)
    if array.size == 1:
        return str(float(array.reshape(())))
    return f"not finite in {int(np.size(array) - np.isfinite(array).sum())} of {array.size} elements"


def _dims_text(shape: Sequence[int | str | None] | None) -> str:
    if shape is None:
        return "of unknown shape"
    return "[" + ", ".join(str(d) if _constrains(d) or isinstance(d, str) else "?" for d in shape) + "]"


def float64_disabled_optimizers(values: Iterable[np.ndarray]) -> list[str]:
    """Graph optimizations to turn off for a model with these parameter values.

    onnxruntime-training 1.19.2 fuses MatMul(A, Transpose(B)) into com.microsoft FusedMatMul,
    which has no float64 kernel there: a float64 model with that pattern (torch's unoptimized
    dynamo export writes it for every Linear) would fail to load. Harmless elsewhere.
    """
    return ["MatmulTransposeFusion"] if any(np.asarray(value).dtype == np.float64 for value in values) else []


class Trainer:
    """Trains a model in onnxruntime: steps, evaluation, schedules, accumulation, checkpoints, export.

    The usual loop::

        trainer = Trainer(onnx.load("model.onnx"), loss=losses.Loss.cross_entropy(),
                          optimizer=optimizers.AdamW(lr=1e-3))
        for x, y in batches:
            loss = trainer.step(x, target=y)
        trainer.save("run.safetensors")        # parameters, moments, step, spec, graph hash
        trainer.export("trained.onnx")         # the original model with the trained values

    Parameters and optimizer state live in two sets of onnxruntime-owned buffers: a step reads
    one set and writes the other through IOBinding, then the two swap (no output is ever bound to
    its own input). Against ``session.run`` with NumPy feeds and outputs (shared 2-vCPU VM, 1
    thread, AdamW, three interleaved rounds): 2.46-3.05 vs 2.70-3.18 ms per step at the demo's size
    (batch 32, 8 steps, 8 inputs, hidden 64, bidirectional); 182-183 vs 177-187 ms at (64, 32,
    256, 256) bidirectional, where the LSTM kernels dominate. Bitwise the same parameters.

    Attributes:
        signature: Names of every input and output of the training models.
        spec: The loss, optimizer and options the models were built with.
        global_step: Number of optimizer updates done.
        skipped_steps: Number of updates skipped as non-finite (``nonfinite="skip"``); saved
            with the checkpoint.
    """

    def __init__(
        self,
        model: onnx.ModelProto | str | Path,
        *,
        loss: losses.Loss,
        optimizer: optimizers.Optimizer,
        lr: LearningRate | None = None,
        requires_grad: Sequence[str] | None = None,
        frozen: Sequence[str] = (),
        output: str | None = None,
        target: str = "target",
        extra_outputs: Sequence[str] = (),
        param_groups: Sequence[optimizers.ParamGroup] = (),
        clip_grad_norm: float | None = None,
        clip_norm_type: float = 2.0,
        fixed_inputs: Mapping[str, np.ndarray] | None = None,
        fixed_shapes: Mapping[str, Sequence[int | str | None]] | None = None,
        stateful: bool = False,
        threads: int | None = None,
        ir_version: int = MAX_IR_VERSION,
        nonfinite: str = "raise",
    ) -> None:
        """Builds the training models of ``model``.

        Args:
            model: The model as exported (a ModelProto or a path), with standard ``LSTM`` nodes.
            loss: The loss applied to the prediction.
            optimizer: The optimizer; its ``lr`` is the learning rate unless ``lr`` is given.
            lr: A constant learning rate, or a schedule ``f(n) -> lr`` called with the number of
                updates done before the one it serves (0 first), as torch's LR schedulers count.
            requires_grad: Parameters to train. Default: what torch trains that reaches the loss
                (a torch export's parameters by its metadata; without metadata every float
                tensor of rank >= 1); ``trained`` and ``summary()`` say what was chosen.
            frozen: Names, globs (``"FeatureExtraction.*"``) or module prefixes of parameters not
                to train; an initializer folded from torch parameters matches by their names.
            output: The model output the loss reads (needed when the model has several).
            target: Name given to the target input.
            extra_outputs: Model outputs ``step`` returns after the loss.
            param_groups: Per-group optimizer overrides (e.g. no weight decay on biases).
            clip_grad_norm: Clip the global gradient norm to this value.
            clip_norm_type: The clipping norm's type (2.0 or inf).
            fixed_inputs: Model inputs fixed for training (they become constants; an ``If`` they
                decide keeps one branch).
            fixed_shapes: Input shapes fixed for training, an int or None (keep) per axis, e.g.
                ``{"input": [None, 576]}``; ``If`` nodes decided by those dims keep one branch.
            stateful: Truncated backpropagation through time: each step starts every LSTM of the
                main graph (each direction) from the final state of the previous step, without a
                gradient through that boundary (torch's ``h.detach()``); zeros at first and after
                ``reset_state()``. The batch size must stay the same until a reset.
            threads: onnxruntime intra-op threads (default: onnxruntime's choice).
            ir_version: The IR version of the training models (10: onnxruntime >= 1.19 loads them).
            nonfinite: An update whose loss or gradient norm is not finite is never kept (the
                parameters, optimizer state, ``global_step`` and carried state stay bitwise as
                they were); ``"raise"`` (default) raises ``NonFiniteStepError``, ``"skip"`` skips
                the update and counts it in ``skipped_steps``, as torch.amp's GradScaler skips
                ``optimizer.step()``. Also settable later: ``trainer.nonfinite = "skip"``.

        Raises:
            ValueError: From ``build_training_models``: an unknown output or parameter, a target
                the loss cannot take, an op without gradient on a parameter's path.
        """
        original = _load_model(model)
        training_model, carried = with_carried_state(original) if stateful else (original, ())
        if output is None and len(original.graph.output) == 1:
            output = original.graph.output[0].name
        carried_outputs = [name for state in carried for name in (state.final_h, state.final_c)]
        built = build_training_models(
            training_model,
            loss=loss,
            optimizer=optimizer,
            requires_grad=requires_grad,
            frozen=frozen,
            output=output,
            target=target,
            extra_outputs=list(dict.fromkeys([*extra_outputs, *carried_outputs])),
            param_groups=param_groups,
            clip_grad_norm=clip_grad_norm,
            clip_norm_type=clip_norm_type,
            fixed_inputs=fixed_inputs,
            fixed_shapes=fixed_shapes,
            ir_version=ir_version,
        )
        outputs = [value.name for value in built.prepared.model.graph.output]
        spec = TrainingSpec(
            loss=loss,
            optimizer=optimizer,
            requires_grad=built.signature.params,
            prediction=output if output is not None else outputs[0],
            target=built.signature.target,
            extra_outputs=tuple(extra_outputs),
            param_groups=tuple(param_groups),
            clip_grad_norm=clip_grad_norm,
            clip_norm_type=clip_norm_type,
            stateful=stateful,
            frozen=tuple(frozen),
            fixed_shapes=_fixed_shapes(fixed_shapes),
            ir_version=ir_version,
        )
        models = {
            "train_step": built.train_step,
            "eval": built.eval,
            "gradients": built.gradients,
            "apply": built.apply,
        }
        self._setup(
            original, models, built.signature, spec, {**built.initial_params, **built.initial_state}, lr, threads
        )
        self._fixed_inputs = {name: np.asarray(value) for name, value in (fixed_inputs or {}).items()}
        self.nonfinite = nonfinite

    def _setup(
        self,
        original: onnx.ModelProto,
        models: Mapping[str, onnx.ModelProto],
        signature: TrainStepSignature,
        spec: TrainingSpec,
        values: Mapping[str, np.ndarray],
        lr: LearningRate | None,
        threads: int | None,
    ) -> None:
        self.signature = signature
        self.spec = spec
        self.global_step = 0
        self._original = original
        self._graph_hash = graph_hash(original)
        self._models = {kind: without_unused_initializers(models[kind]) for kind in MODEL_KINDS}
        self._fixed_inputs: dict[str, np.ndarray] = {}
        self._lr: LearningRate = spec.optimizer.lr if lr is None else lr
        self._threads = threads
        self._sessions: dict[str, Any] = {}
        self._bindings: dict[tuple[str, int], Any] = {}
        # Parameter or state input -> the output that carries its next value.
        self._updates: dict[str, str] = dict(zip(signature.params, signature.new_params, strict=True))
        for name in signature.params:
            for slot, value in signature.state[name].items():
                self._updates[value] = signature.new_state[name][slot]
        self._initial = {name: np.array(values[name]) for name in self._updates}
        self._buffers: list[dict[str, Any]] | None = None
        self._current = 0
        self._accumulated: dict[str, np.ndarray] = {}
        self._accumulated_batches = 0
        self._nonfinite = "raise"
        self.skipped_steps = 0
        # Of the micro-batches accumulated: (number, loss) of each non-finite loss, and the
        # carried state before the first, which a refused apply() restores.
        self._nonfinite_losses: list[tuple[int, float | np.ndarray]] = []
        self._carried_before_accumulation: dict[str, np.ndarray] | None = None
        self.last_grad_norm: float | None = None
        self.last_import: OrtTrainingImport | None = None
        self._carried = with_carried_state(original)[1] if spec.stateful else ()
        self._carried_values: dict[str, np.ndarray] | None = None
        carried_inputs = {name for state in self._carried for name in (state.initial_h, state.initial_c)}
        self._user_inputs = tuple(name for name in signature.batch_inputs if name not in carried_inputs)
        inputs = {value.name: value_type_of(value) for value in self._models["eval"].graph.input}
        self._batch_types = {name: inputs[name] for name in self._user_inputs}
        self._types: dict[str, ValueType] | None = None
        self._checked_targets: set[tuple[Any, ...]] = set()
        # lr and step of the next update: bound once to each update binding, written in place.
        self._lr_value = np.zeros((), dtype=np.float64)
        self._step_value = np.zeros((), dtype=np.int64)
        # The update's all_finite output: bound once to each update binding, read after each run.
        self._finite_value = np.zeros((), dtype=np.bool_)
        self._expected_dtypes = {
            name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.elem_type))
            for name, value in self._batch_types.items()
            if value is not None
        }

    # ---- construction from files ----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | Path,
        *,
        lr: LearningRate | None = None,
        threads: int | None = None,
        nonfinite: str = "raise",
    ) -> Trainer:
        """A trainer over the models ``write`` (or ``ortlstm train-step``) put in ``directory``.

        The state comes from ``directory/state.safetensors``. ``nonfinite`` as in ``Trainer``; a
        directory written before the models had the ``all_finite`` output is guarded on the loss
        (and the clipped gradient norm) only.

        Raises:
            FileNotFoundError: The directory lacks one of its files.
            ValueError: The files do not belong together.
        """
        directory = Path(directory)
        manifest_path = directory / MANIFEST_FILE
        if not manifest_path.is_file():
            raise FileNotFoundError(
                f"{str(directory)!r} holds no {MANIFEST_FILE}: write one with `ortlstm train-step MODEL.onnx "
                f"{directory}` or Trainer.write()"
            )
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != DIRECTORY_FORMAT:
            raise ValueError(f"{manifest_path}: format {manifest.get('format')!r}, expected {DIRECTORY_FORMAT!r}")
        models = {kind: _load_model(directory / f"{kind}.onnx") for kind in MODEL_KINDS}
        trainer = cls.__new__(cls)
        signature = _signature_from_json(manifest["signature"])
        values: dict[str, np.ndarray] = {}
        for name in signature.params:
            init = next(init for init in models["train_step"].graph.input if init.name == name)
            values[name] = np.zeros(
                [dim.dim_value for dim in init.type.tensor_type.shape.dim],
                onnx.helper.tensor_dtype_to_np_dtype(init.type.tensor_type.elem_type),
            )
            for slot_input in signature.state[name].values():
                values[slot_input] = values[name]
        spec = TrainingSpec.from_json(manifest["spec"])
        trainer._setup(_load_model(directory / ORIGINAL_FILE), models, signature, spec, values, lr, threads)
        trainer.nonfinite = nonfinite
        trainer.load(directory / STATE_FILE)
        return trainer

    @classmethod
    def from_checkpoint(
        cls,
        model: onnx.ModelProto | str | Path,
        checkpoint: str | Path,
        *,
        lr: LearningRate | None = None,
        threads: int | None = None,
        nonfinite: str = "raise",
    ) -> Trainer:
        """Rebuilds the trainer a checkpoint was saved from (its spec is in the file) and loads it."""
        metadata, tensors = _read_checkpoint(checkpoint)
        spec = TrainingSpec.from_json(json.loads(metadata["spec"]))
        fixed = {key.split("/", 1)[1]: value for key, value in tensors.items() if key.startswith("fixed/")}
        trainer = cls(
            model,
            loss=spec.loss,
            optimizer=spec.optimizer,
            lr=lr,
            requires_grad=spec.requires_grad,
            frozen=spec.frozen,
            output=spec.prediction,
            target=spec.target or "target",
            extra_outputs=spec.extra_outputs,
            param_groups=spec.param_groups,
            clip_grad_norm=spec.clip_grad_norm,
            clip_norm_type=spec.clip_norm_type,
            fixed_inputs=fixed or None,
            fixed_shapes=spec.fixed_shapes,
            stateful=spec.stateful,
            threads=threads,
            ir_version=spec.ir_version,
            nonfinite=nonfinite,
        )
        trainer.load(checkpoint)
        return trainer

    def write(self, directory: str | Path) -> Path:
        """Writes the original model, the four training models, a manifest and the current state.

        ``Trainer.open(directory)`` reads them back; ``ortlstm export DIR OUT.onnx`` exports them.
        Returns the directory.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        onnx.save(self._original, str(directory / ORIGINAL_FILE))
        for kind in MODEL_KINDS:
            onnx.save(self._models[kind], str(directory / f"{kind}.onnx"))
        manifest = {
            "format": DIRECTORY_FORMAT,
            "graph_sha256": self._graph_hash,
            "spec": self.spec.to_json(),
            "signature": _listed(dataclasses.asdict(self.signature)),
        }
        (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
        self.save(directory / STATE_FILE)
        return directory

    # ---- sessions and buffers -------------------------------------------------------------------

    def _session(self, kind: str) -> Any:
        if kind not in self._sessions:
            ort = _import_onnxruntime()
            from ortlstm.ops import session_options

            options = (
                session_options() if self._threads is None else session_options(intra_op_num_threads=self._threads)
            )
            _plan_training_memory(ort, options)
            self._sessions[kind] = ort.InferenceSession(
                self._models[kind].SerializeToString(),
                options,
                providers=["CPUExecutionProvider"],
                disabled_optimizers=float64_disabled_optimizers(self._initial.values()),
            )
        return self._sessions[kind]

    def _store(self) -> list[dict[str, Any]]:
        """The two buffer sets (onnxruntime-owned), created on first use from the initial values."""
        if self._buffers is None:
            ort = _import_onnxruntime()

            def buffer(value: np.ndarray) -> Any:
                result = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), value.dtype, "cpu")
                result.update_inplace(np.ascontiguousarray(value))
                return result

            self._buffers = [
                {name: buffer(value) for name, value in self._initial.items()},
                {name: buffer(np.zeros_like(value)) for name, value in self._initial.items()},
            ]
            self._current = 0
        return self._buffers

    def _update_binding(self, kind: str) -> Any:
        """The binding of ``kind`` (train_step or apply) reading the current set, writing the other."""
        key = (kind, self._current)
        if key not in self._bindings:
            buffers = self._store()
            binding = self._session(kind).io_binding()
            for name, output in self._updates.items():
                binding.bind_ortvalue_input(name, buffers[self._current][name])
                binding.bind_ortvalue_output(output, buffers[1 - self._current][name])
            binding.bind_cpu_input(self.signature.lr, self._lr_value)
            binding.bind_cpu_input(self.signature.step, self._step_value)
            if self.signature.all_finite:
                binding.bind_output(
                    self.signature.all_finite,
                    "cpu",
                    element_type=np.bool_,
                    shape=[],
                    buffer_ptr=self._finite_value.ctypes.data,
                )
            self._bindings[key] = binding
        return self._bindings[key]

    def _read_binding(self, kind: str) -> Any:
        """A binding of ``kind`` (eval or gradients) reading the current parameters."""
        binding = self._session(kind).io_binding()
        buffers = self._store()[self._current]
        for name in self.signature.params:
            binding.bind_ortvalue_input(name, buffers[name])
        return binding

    @staticmethod
    def _run(session: Any, binding: Any, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        """Binds the feeds and the outputs onnxruntime allocates, runs, returns those outputs."""
        keep = {name: np.ascontiguousarray(value) for name, value in feeds.items()}
        for name, value in keep.items():
            binding.bind_cpu_input(name, value)
        for name in outputs:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        # Every bound output in binding order; the ones asked for were bound last. The raw vector:
        # get_outputs() would wrap each parameter and state buffer in a Python OrtValue per step.
        values = binding.get_outputs_as_ortvaluevector()
        return [values[index].numpy() for index in range(len(values) - len(outputs), len(values))]

    # ---- feeds ------------------------------------------------------------------------------------

    def _batch_feeds(
        self, batch: Sequence[Any], named: Mapping[str, Any], target: Any, where: str, carry: bool = True
    ) -> dict[str, np.ndarray]:
        names = self._user_inputs
        # The loss's other targets (ctc_loss's lengths) come as keywords named as their inputs.
        extra_given = {
            port: named[name] for port, name in self.signature.extra_targets.items() if name in named
        }
        named = {name: value for name, value in named.items() if name not in self.signature.extra_targets.values()}
        if len(batch) > len(names):
            raise ValueError(f"{where}: {len(batch)} positional inputs, but the model has {len(names)}: {list(names)}")
        feeds: dict[str, np.ndarray] = {}
        for name, value in zip(names, batch, strict=False):
            feeds[name] = np.asarray(value)
        for name, value in named.items():
            if name not in names:
                raise ValueError(f"{where}: {name!r} is not an input of the model; its inputs are {list(names)}")
            if name in feeds:
                raise ValueError(f"{where}: input {name!r} given both by position and by name")
            feeds[name] = np.asarray(value)
        missing = [name for name in names if name not in feeds]
        if missing:
            raise ValueError(
                f"{where}: missing batch input(s) {missing}; the model's inputs are {list(names)} "
                "(pass them in that order, or by name)"
            )
        sizes: dict[str, int] = {}
        for name in names:
            declared = self._batch_types[name]
            value = feeds[name]
            if declared is None:
                continue
            expected_dtype = self._expected_dtypes[name]
            rank_ok = declared.shape is None or len(declared.shape) == value.ndim
            dims_ok = rank_ok and (
                declared.shape is None
                or all(
                    not _constrains(d) or d == actual for d, actual in zip(declared.shape, value.shape, strict=True)
                )
            )
            if value.dtype != expected_dtype or not dims_ok:
                raise ValueError(
                    f"{where}: input {name!r} must be {expected_dtype} {_dims_text(declared.shape)}, "
                    f"got {value.dtype} {list(value.shape)}"
                )
            for dim, actual in zip(declared.shape or (), value.shape, strict=False):
                if isinstance(dim, str):
                    sizes.setdefault(dim, actual)
        spec = self.spec
        if self._carried:
            feeds.update(self._carried_feeds(sizes, where, carry))
        if not spec.loss.needs_target:
            if target is not None:
                raise ValueError(f"{where}: the loss is the model output {spec.prediction!r}; it takes no target")
            return feeds
        if target is None:
            raise ValueError(f"{where}: the loss {spec.loss.kind} needs target=... (the labels of this batch)")
        target_array = np.asarray(target)
        if target_array.dtype == np.int32:
            target_array = target_array.astype(np.int64)  # torch's index type; the graph reads int64
        prediction = self._prediction()
        if prediction is not None and prediction.shape is not None:
            prediction = ValueType(
                prediction.elem_type, tuple(sizes.get(d, d) if isinstance(d, str) else d for d in prediction.shape)
            )
        target_elem = (
            onnx.helper.np_dtype_to_tensor_dtype(target_array.dtype) if target_array.dtype.kind in "iufb" else 0
        )
        target_type = ValueType(target_elem, tuple(target_array.shape))
        extra_feeds = self._extra_target_feeds(extra_given, where)
        extra_types = {
            port: ValueType(onnx.TensorProto.INT64, tuple(value.shape))
            for port, value in extra_feeds.items()
            if value.size or port in extra_given
        }
        key = (prediction, target_type, tuple(sorted(extra_types.items())))
        if key not in self._checked_targets:  # a loop feeds the same shapes
            losses.check_target(
                spec.loss,
                prediction,
                target_type,
                prediction_name=spec.prediction,
                target_name=spec.target or "target",
                extra_types=extra_types,
            )
            self._checked_targets.add(key)
        losses.check_target_values(spec.loss, prediction, target_array, target_name=spec.target or "target")
        feeds[spec.target] = target_array  # type: ignore[index]
        feeds.update({self.signature.extra_targets[port]: value for port, value in extra_feeds.items()})
        return feeds

    def _extra_target_feeds(self, given: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
        """The loss's other targets (ctc_loss's lengths) by torch name: int64, or empty for a derived one.

        Raises:
            ValueError: A required one is missing, or one is not an integer array.
        """
        feeds: dict[str, np.ndarray] = {}
        loss = self.spec.loss
        for extra in loss.extra_targets:
            keyword = self.signature.extra_targets[extra.name]
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

    def _value_type(self, name: str) -> ValueType | None:
        if self._types is None:
            self._types = infer_value_types(self._models["eval"])
        return self._types.get(name)

    def _prediction(self) -> ValueType | None:
        return self._value_type(self.spec.prediction)

    def _carried_feeds(self, sizes: Mapping[str, int], where: str, carry: bool) -> dict[str, np.ndarray]:
        """The initial state of each carried LSTM: the last final state, or zeros."""
        feeds: dict[str, np.ndarray] = {}
        for state in self._carried:
            sequence = self._value_type(state.sequence)
            dim = None if sequence is None or sequence.shape is None else sequence.shape[state.batch_axis]
            batch_size = sizes.get(dim) if isinstance(dim, str) else dim
            if batch_size is None:
                raise ValueError(
                    f"{where}: stateful: the batch size of LSTM {state.node!r} (axis {state.batch_axis} of its input "
                    f"{state.sequence!r}) does not follow from the model's input shapes"
                )
            dtype = onnx.helper.tensor_dtype_to_np_dtype(state.elem_type)
            zeros = np.zeros(state.shape(batch_size), dtype)
            for name in (state.initial_h, state.initial_c):
                value = self._carried_values.get(name) if carry and self._carried_values is not None else None
                if value is not None and value.shape != zeros.shape:
                    raise ValueError(
                        f"{where}: stateful: the batch has {batch_size} rows, the carried state of LSTM "
                        f"{state.node!r} {value.shape[state.batch_axis]}; call reset_state() when the batch changes"
                    )
                feeds[name] = zeros if value is None else value
        return feeds

    def _keep_carried(self, named: Mapping[str, np.ndarray]) -> None:
        if self._carried:
            self._carried_values = {}
            for state in self._carried:
                self._carried_values[state.initial_h] = named[state.final_h]
                self._carried_values[state.initial_c] = named[state.final_c]

    def reset_state(self, rows: Sequence[int] | np.ndarray | None = None) -> None:
        """Zeros the carried LSTM state (stateful trainers): all of it, or the given batch rows.

        Raises:
            RuntimeError: The trainer is not stateful.
        """
        if not self._carried:
            raise RuntimeError("reset_state(): the trainer carries no state; build it with stateful=True")
        if rows is None or self._carried_values is None:
            self._carried_values = None
            return
        for state in self._carried:
            for name in (state.initial_h, state.initial_c):
                value = self._carried_values[name].copy()
                index: tuple[Any, ...] = (slice(None), rows) if state.batch_axis == 1 else (rows,)
                value[index] = 0
                self._carried_values[name] = value

    @property
    def carried_state(self) -> dict[str, np.ndarray]:
        """The state the next step starts from, by initial_h/initial_c input (empty: zeros)."""
        return {name: value.copy() for name, value in (self._carried_values or {}).items()}

    def learning_rate(self, update: int | None = None) -> float:
        """The learning rate of update ``update`` (1-based; default: the next one)."""
        done = self.global_step if update is None else update - 1
        return float(self._lr(done)) if callable(self._lr) else float(self._lr)

    def _set_scalars(self, lr: float | None) -> None:
        """Writes this update's lr and step into the arrays the update bindings read."""
        value = self.learning_rate() if lr is None else float(lr)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"learning rate must be a finite number >= 0, got {value}")
        self._lr_value[()] = value
        self._step_value[()] = self.global_step + 1

    # ---- training ---------------------------------------------------------------------------------

    def step(self, *batch: Any, target: Any = None, lr: float | None = None, **named: Any) -> Any:
        """One optimizer update on a batch.

        Args:
            *batch: The model's inputs, in order (or by name as keywords).
            target: The labels (omitted for ``Loss.output()``).
            lr: The learning rate of this update (default: the trainer's constant or schedule).
            **named: Model inputs by name, and the loss's other targets by their input names
                (``signature.extra_targets``; ctc_loss: ``target_lengths=...`` and, optionally,
                ``input_lengths=...``, else every sample has all of the prediction's steps).

        Returns:
            The loss (a float when it is one number), or ``(loss, *extra_outputs)`` when the
            trainer was asked for extra outputs. A skipped update (``nonfinite="skip"``)
            returns its non-finite loss too.

        Raises:
            ValueError: A missing or unknown input, a target of the wrong type or shape.
            RuntimeError: Gradients were accumulated and not applied.
            NonFiniteStepError: The loss or a gradient is NaN or inf (``nonfinite="raise"``);
                nothing was updated.
        """
        if self._accumulated_batches:
            raise RuntimeError(
                f"step(): gradients of {self._accumulated_batches} batch(es) are accumulated; "
                "call apply() (or zero_grad()) first"
            )
        feeds = self._batch_feeds(batch, named, target, "step()")
        self._set_scalars(lr)
        signature = self.signature
        outputs = [signature.loss, *signature.extra_outputs, *self._prepare_checks()]
        values = self._run(self._session("train_step"), self._update_binding("train_step"), feeds, outputs)
        named_values = dict(zip(outputs, values, strict=True))
        result = self._result([named_values[name] for name in [signature.loss, *self.spec.extra_outputs]])
        loss = named_values[signature.loss]
        # all_finite covers the train step's loss; a model without it has the loss checked here.
        if not self._update_is_finite(named_values, bool(signature.all_finite) or _all_finite(loss)):
            self._refuse("step()", ("the loss", _loss_value(loss)), lambda: self._gradients_of(feeds))
            return result
        self._advance()
        self._keep_carried(named_values)
        return result

    def _advance(self) -> None:
        self._current = 1 - self._current
        self.global_step += 1

    # ---- the non-finite guard: a refused update only leaves the swap undone ------------------------

    @property
    def nonfinite(self) -> str:
        """``"raise"`` or ``"skip"``: what an update whose loss or gradients are not finite does."""
        return self._nonfinite

    @nonfinite.setter
    def nonfinite(self, mode: str) -> None:
        if mode not in NONFINITE_MODES:
            raise ValueError(
                f"nonfinite: expected one of {', '.join(map(repr, NONFINITE_MODES))}, got {mode!r} "
                "('raise' stops at a NaN or inf loss or gradient, 'skip' skips that update and counts it)"
            )
        self._nonfinite = mode

    def _prepare_checks(self) -> list[str]:
        """Clears the bound ``all_finite`` (a run that does not write it is refused); the outputs to bind.

        Those are the update model's outputs besides the loss bound per run: the clipped norm.
        """
        self._finite_value[()] = False
        return [self.signature.grad_norm] if self.signature.grad_norm else []

    def _update_is_finite(self, named: Mapping[str, np.ndarray], losses_finite: bool) -> bool:
        """Whether the update just computed may be kept; sets ``last_grad_norm`` when clipping.

        The models' ``all_finite`` output covers the train step's loss and the gradients; models
        without it (directories written before it) are checked on the losses and clipped norm only.
        """
        signature = self.signature
        if signature.grad_norm:
            self.last_grad_norm = float(named[signature.grad_norm].reshape(()))
        if not losses_finite:
            return False
        if signature.all_finite:
            return bool(self._finite_value)
        norm = self.last_grad_norm if signature.grad_norm else None
        return norm is None or math.isfinite(norm)

    def _gradients_of(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The parameter gradients of a batch (the gradients model; diagnosis of a refused step)."""
        signature = self.signature
        grads = [signature.grads[name] for name in signature.params]
        values = self._run(self._session("gradients"), self._read_binding("gradients"), feeds, grads)
        return dict(zip(signature.params, values, strict=True))

    def _refuse(
        self,
        where: str,
        loss: tuple[str, Any] | None,
        gradients: Callable[[], Mapping[str, np.ndarray]],
        discarded: str = "",
    ) -> None:
        """Counts a refused update (``skip``), or raises ``NonFiniteStepError`` saying what was not finite.

        Args:
            where: The call, for the message.
            loss: (what it is, its value) of the loss to report, or None.
            gradients: The update's gradients, called only for the error: which are not finite
                (a train step's are recomputed with the gradients model, on this path only).
            discarded: What else the refusal dropped, for the message.
        """
        if self._nonfinite == "skip":
            self.skipped_steps += 1
            return
        step = self.global_step + 1
        grad_norm = self.last_grad_norm if self.signature.grad_norm else None
        nonfinite_grads: tuple[str, ...] | None = None
        try:
            values = dict(gradients())
        except Exception:  # the diagnosis must never hide the refusal itself
            values = {}
        if values:
            nonfinite_grads = tuple(name for name, value in values.items() if not _all_finite(value))
            if grad_norm is None:
                with np.errstate(over="ignore", invalid="ignore"):
                    squares = [float(np.sum(np.square(value, dtype=np.float64))) for value in values.values()]
                grad_norm = math.sqrt(math.fsum(squares)) if not any(map(math.isnan, squares)) else math.nan
        found = [] if loss is None else [f"{loss[0]} is {_loss_text(loss[1])}"]
        if grad_norm is not None:
            found.append(f"the gradient norm is {grad_norm}")
        if nonfinite_grads:
            found.append(f"the gradients of {list(nonfinite_grads)} hold NaN or inf")
        elif loss is None or _all_finite(np.asarray(loss[1])):
            found.append("the gradients' sum of squares is not finite")
        carried = ", the carried LSTM state" if self._carried else ""
        raise NonFiniteStepError(
            f"{where}: update {step} refused, not finite: {'; '.join(found)}. The parameters, the optimizer "
            f"state{carried} and global_step ({self.global_step}) are unchanged{discarded}. To skip such updates "
            "and count them in trainer.skipped_steps instead, pass Trainer(..., nonfinite='skip') or set "
            "trainer.nonfinite = 'skip'",
            step=step,
            loss=None if loss is None else loss[1],
            grad_norm=grad_norm,
            nonfinite_grads=nonfinite_grads,
        )

    @staticmethod
    def _result(values: list[np.ndarray]) -> Any:
        loss = _loss_value(values[0])
        return loss if len(values) == 1 else (loss, *values[1:])

    def evaluate(self, *batch: Any, target: Any = None, outputs: Sequence[str] | None = None, **named: Any) -> Any:
        """The loss (and model outputs) on a batch, with training-mode Dropout off; no update.

        A stateful trainer's LSTMs start from zeros here, and the carried state is left alone.

        Args:
            *batch: The model's inputs, in order (or by name as keywords).
            target: The labels (omitted for ``Loss.output()``).
            outputs: Model outputs to return after the loss (default: the trainer's extra outputs).
            **named: Model inputs by name, and the loss's other targets (see ``step``).

        Returns:
            The loss, or ``(loss, *outputs)``.
        """
        wanted = list(self.spec.extra_outputs if outputs is None else outputs)
        available = [value.name for value in self._models["eval"].graph.output]
        unknown = [name for name in wanted if name not in available]
        if unknown:
            raise ValueError(f"evaluate(): {unknown} are not outputs of the model; it has {available[1:]}")
        feeds = self._batch_feeds(batch, named, target, "evaluate()", carry=False)
        outputs = [self.signature.loss, *wanted]
        values = self._run(self._session("eval"), self._read_binding("eval"), feeds, outputs)
        return self._result(values)

    def accumulate(self, *batch: Any, target: Any = None, **named: Any) -> Any:
        """Adds this batch's parameter gradients to the accumulated ones; ``apply()`` updates.

        As calling ``loss.backward()`` once per micro-batch in torch: the gradients of each
        micro-batch's loss are summed (in float, in call order). With a mean loss over equal
        micro-batches, k accumulations are k times the gradient of the concatenated batch; scale
        the loss or the learning rate as in torch.

        A non-finite loss or gradient is not refused here: ``apply()`` refuses the whole update.

        Returns:
            As ``step``: the micro-batch's loss, or ``(loss, *extra_outputs)``.
        """
        feeds = self._batch_feeds(batch, named, target, "accumulate()")
        if not self._accumulated_batches:
            self._carried_before_accumulation = None if self._carried_values is None else dict(self._carried_values)
        signature = self.signature
        grads = [signature.grads[name] for name in signature.params]
        wanted = [signature.loss, *signature.extra_outputs, *grads]
        values = self._run(self._session("gradients"), self._read_binding("gradients"), feeds, wanted)
        named_values = dict(zip(wanted, values, strict=True))
        for name in signature.params:
            grad = named_values[signature.grads[name]]
            if name in self._accumulated:
                self._accumulated[name] += grad
            else:
                self._accumulated[name] = grad.copy()
        self._accumulated_batches += 1
        loss = named_values[signature.loss]
        if not _all_finite(loss):
            self._nonfinite_losses.append((self._accumulated_batches, _loss_value(loss)))
        self._keep_carried(named_values)
        return self._result([named_values[name] for name in [signature.loss, *self.spec.extra_outputs]])

    def apply(self, lr: float | None = None, *, gradients: Mapping[str, np.ndarray] | None = None) -> None:
        """One optimizer update from the accumulated gradients, which are then cleared.

        An update whose accumulated gradients or micro-batch losses are not finite is refused as
        ``step`` refuses one; its gradients are discarded and a stateful trainer's carried state
        is the one before its first micro-batch.

        Args:
            lr: The learning rate of this update (default: the trainer's constant or schedule).
            gradients: Gradients to apply instead of the accumulated ones (which are cleared
                too), by parameter; e.g. ``accumulated_gradients`` all-reduced across processes.

        Raises:
            RuntimeError: Nothing was accumulated and no gradients were given.
            ValueError: ``gradients`` lacks a parameter, or one has another shape or type.
            NonFiniteStepError: A loss or gradient is NaN or inf (``nonfinite="raise"``).
        """
        if gradients is None and not self._accumulated_batches:
            raise RuntimeError("apply(): no gradients accumulated; call accumulate(...) first")
        if gradients is not None:
            self._check_gradients(gradients)
            self._accumulated = dict(gradients)
        signature = self.signature
        feeds = {signature.grads[name]: self._accumulated[name] for name in signature.params}
        self._set_scalars(lr)
        outputs = self._prepare_checks()
        values = self._run(self._session("apply"), self._update_binding("apply"), feeds, outputs)
        if not self._update_is_finite(dict(zip(outputs, values, strict=True)), not self._nonfinite_losses):
            batch, loss = self._nonfinite_losses[0] if self._nonfinite_losses else (0, None)
            count = self._accumulated_batches
            gradients = self._accumulated
            self._carried_values = self._carried_before_accumulation
            self.zero_grad()
            self._refuse(
                "apply()",
                None if loss is None else (f"the loss of accumulated batch {batch} of {count}", loss),
                lambda: gradients,
                f"; the gradients of the {count} accumulated batch(es) are discarded",
            )
            return
        self._advance()
        self.zero_grad()

    @property
    def accumulated_gradients(self) -> dict[str, np.ndarray]:
        """The gradients ``accumulate`` summed since the last update, by parameter (empty: none).

        The arrays themselves, not copies: read them (e.g. to all-reduce) before ``apply``.
        """
        return dict(self._accumulated)

    def _check_gradients(self, gradients: Mapping[str, np.ndarray]) -> None:
        for name in self.signature.params:
            value, expected = gradients.get(name), self._initial[name]
            if value is None or value.shape != expected.shape or value.dtype != expected.dtype:
                got = "nothing" if value is None else f"{value.dtype} {list(value.shape)}"
                raise ValueError(
                    f"apply(gradients=...): the gradient of {name!r} must be {expected.dtype} "
                    f"{list(expected.shape)} (as the parameter), got {got}"
                )

    def zero_grad(self) -> None:
        """Discards the accumulated gradients."""
        self._accumulated = {}
        self._accumulated_batches = 0
        self._nonfinite_losses = []

    # ---- state --------------------------------------------------------------------------------------

    def _values(self) -> dict[str, np.ndarray]:
        if self._buffers is None:
            return {name: value.copy() for name, value in self._initial.items()}
        # OrtValue.numpy() is a view of the buffer, which a later update overwrites: copy.
        return {name: np.array(value.numpy()) for name, value in self._buffers[self._current].items()}

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        """Copies of the trained parameters' current values, by their names in the model."""
        values = self._values()
        return {name: values[name] for name in self.signature.params}

    @property
    def trained(self) -> tuple[TrainedParameter, ...]:
        """What this trainer trains: each parameter's name, shape, type and the torch parameters it stands for."""
        origins = read_torch_origins(self._original)
        sources = origins.sources if origins is not None else {}
        return tuple(
            TrainedParameter(
                name, tuple(self._initial[name].shape), str(self._initial[name].dtype), sources.get(name, ())
            )
            for name in self.signature.params
        )

    def summary(self) -> str:
        """A table of the trained and frozen parameters, for a reader to check against their torch model."""
        trained = self.trained
        lines = [f"trains {len(trained)} parameters, {sum(p.size for p in trained):,} values:"]
        width = max(len(p.name) for p in trained)
        for parameter in trained:
            shape = "[" + ", ".join(map(str, parameter.shape)) + "]"
            origin = (
                f"  <- {', '.join(parameter.sources)}"
                if parameter.sources and parameter.sources != (parameter.name,)
                else ""
            )
            lines.append(f"  {parameter.name:<{width}}  {parameter.dtype:<7} {shape:<16} {parameter.size:>10,}{origin}")
        if self.signature.frozen:
            lines.append(f"frozen (constants): {', '.join(self.signature.frozen)}")
        return "\n".join(lines)

    @property
    def optimizer_state(self) -> dict[str, dict[str, np.ndarray]]:
        """Copies of the optimizer state: parameter -> slot (torch's names) -> value."""
        values = self._values()
        return {
            name: {slot: values[value] for slot, value in self.signature.state[name].items()}
            for name in self.signature.params
        }

    def save(self, path: str | Path) -> Path:
        """Writes the whole training state to one safetensors file.

        Tensors: ``param/NAME``, ``state/NAME/SLOT``, ``fixed/NAME`` for fixed inputs and
        ``carried/INPUT`` for a stateful trainer's carried LSTM state;
        metadata: the format, the global step, the learning rate (when constant), the spec (loss,
        optimizer with its hyperparameters, options) as JSON and the graph hash.

        Raises:
            RuntimeError: Gradients are accumulated but not applied.
        """
        from safetensors.numpy import save_file

        if self._accumulated_batches:
            raise RuntimeError("save(): accumulated gradients are not applied; call apply() or zero_grad() first")
        tensors = {f"param/{name}": value for name, value in self.parameters.items()}
        for name, slots in self.optimizer_state.items():
            tensors.update({f"state/{name}/{slot}": value for slot, value in slots.items()})
        tensors.update({f"fixed/{name}": value for name, value in self._fixed_inputs.items()})
        tensors.update({f"carried/{name}": value for name, value in (self._carried_values or {}).items()})
        metadata = {
            "format": CHECKPOINT_FORMAT,
            "global_step": str(self.global_step),
            "skipped_steps": str(self.skipped_steps),
            "lr": "schedule" if callable(self._lr) else repr(float(self._lr)),
            "spec": json.dumps(self.spec.to_json()),
            "graph_sha256": self._graph_hash,
        }
        path = Path(path)
        save_file(
            {key: np.ascontiguousarray(value).reshape(np.shape(value)) for key, value in tensors.items()},  # 0-D stays
            str(path),
            metadata=metadata,
        )
        return path

    def load(self, path: str | Path, *, check_graph: bool = True) -> None:
        """Restores parameters, optimizer state and the global step from ``save``'s file.

        Args:
            path: The checkpoint.
            check_graph: Refuse a checkpoint saved for a model of another structure.

        Raises:
            ValueError: The file is not a checkpoint of this model and spec, or a tensor is missing
                or of another shape or type.
        """
        metadata, tensors = _read_checkpoint(path)
        if check_graph and metadata.get("graph_sha256") != self._graph_hash:
            raise ValueError(
                f"{path}: the checkpoint was saved for another model (graph hash "
                f"{metadata.get('graph_sha256', '?')[:12]}, this trainer's model {self._graph_hash[:12]}); "
                "load(..., check_graph=False) skips this check"
            )
        # The optimizer's lr is only the default of the lr input: a resumed run may change it. The
        # saved spec is read back first, so fields added since it was written take their defaults.
        try:
            saved_spec = _without_lr(TrainingSpec.from_json(json.loads(metadata["spec"])).to_json())
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: the checkpoint's training spec cannot be read ({error})") from error
        current_spec = _without_lr(self.spec.to_json())
        differing = sorted(key for key in current_spec if saved_spec.get(key) != current_spec[key])
        if differing:
            details = "; ".join(
                f"{key}: saved {saved_spec.get(key)!r}, here {current_spec[key]!r}" for key in differing
            )
            raise ValueError(f"{path}: the checkpoint was saved with another training spec ({details})")
        values: dict[str, np.ndarray] = {}
        signature = self.signature
        for name in signature.params:
            values[name] = tensors.get(f"param/{name}")
            for slot, value in signature.state[name].items():
                values[value] = tensors.get(f"state/{name}/{slot}")
        missing = [name for name, value in values.items() if value is None]
        if missing:
            raise ValueError(f"{path}: the checkpoint lacks {missing}")
        current = self._initial
        for name, value in values.items():
            if value.shape != current[name].shape or value.dtype != current[name].dtype:
                raise ValueError(
                    f"{path}: {name!r} is {value.dtype} {list(value.shape)} in the checkpoint, "
                    f"the model expects {current[name].dtype} {list(current[name].shape)}"
                )
        if self._buffers is None:
            self._initial = {name: np.array(value) for name, value in values.items()}
        else:
            for name, value in values.items():
                self._buffers[self._current][name].update_inplace(np.ascontiguousarray(value))
        self.global_step = int(metadata["global_step"])
        self.skipped_steps = int(metadata.get("skipped_steps", 0))
        carried = {key.split("/", 1)[1]: value for key, value in tensors.items() if key.startswith("carried/")}
        self._carried_values = carried or None
        if not self._fixed_inputs:
            self._fixed_inputs = {key.split("/", 1)[1]: v for key, v in tensors.items() if key.startswith("fixed/")}
        self.zero_grad()

    # ---- from onnxruntime-training -------------------------------------------------------------------

    @classmethod
    def from_onnxruntime_training_checkpoint(
        cls,
        model: onnx.ModelProto | str | Path,
        checkpoint: Any,
        *,
        loss: losses.Loss,
        optimizer: optimizers.Optimizer | None = None,
        lr: LearningRate | None = None,
        requires_grad: Sequence[str] | None = None,
        threads: int | None = None,
        **options: Any,
    ) -> Trainer:
        """A trainer that continues a run of the onnxruntime-training path (``generate_artifacts``).

        Args:
            model: The model given to ``ortlstm.graphs.generate_artifacts`` (standard ``LSTM``
                nodes); the checkpoint's parameters are its initializers, by name.
            checkpoint: A checkpoint file written by ``CheckpointState.save_checkpoint(state, path,
                include_optimizer_state=True)`` (without it: parameters only), or the live
                ``CheckpointState`` (saved to a temporary file with its optimizer state).
            loss: The loss (onnxruntime-training's checkpoint does not record it).
                ``LossType.CrossEntropyLoss`` is ``losses.Loss.cross_entropy()``.
            optimizer: Default: ``AdamW(lr=the checkpoint's initial lr, eps=1e-6,
                weight_decay=0.0)``, torch's AdamW with the hyperparameters of
                onnxruntime-training's ``OptimType.AdamW`` (whose update rule differs: see
                ``load_onnxruntime_training_checkpoint``).
            lr: A constant or a schedule (default: the optimizer's lr). The checkpoint holds only
                the optimizer's initial learning rate, not one set later.
            requires_grad: Default: the checkpoint's trained parameters.
            threads: onnxruntime intra-op threads.
            **options: Other ``Trainer`` arguments (``output``, ``target``, ``param_groups``,
                ``clip_grad_norm``, ...).

        Returns:
            The trainer, its parameters, moments and step loaded; ``last_import`` says what was
            carried over and what was not.
        """
        with _ort_training_checkpoint_file(checkpoint) as path:
            content = read_onnxruntime_training_checkpoint(path)
            original = _load_model(model)
            if requires_grad is None:
                order = [init.name for init in original.graph.initializer]
                requires_grad = [name for name in order if name in content.parameters]
                requires_grad += [name for name in content.parameters if name not in requires_grad]
            if optimizer is None:
                initial_lr = content.initial_lr if content.initial_lr is not None else 1e-3
                optimizer = optimizers.AdamW(lr=initial_lr, eps=ORT_TRAINING_ADAMW_EPS, weight_decay=0.0)
            trainer = cls(
                original, loss=loss, optimizer=optimizer, lr=lr, requires_grad=requires_grad, threads=threads, **options
            )
            trainer._import_ort_training(content, str(path))
        return trainer

    def load_onnxruntime_training_checkpoint(self, checkpoint: Any) -> OrtTrainingImport:
        """Loads an onnxruntime-training ``CheckpointState`` (file or object) into this trainer.

        What is carried over:

        - every parameter this trainer trains, by name, bitwise (all must be in the checkpoint,
          and every parameter the checkpoint trained must be trained here);
        - with Adam or AdamW here, and a checkpoint saved with ``include_optimizer_state=True``:
          the first and second moments (onnxruntime-training's ``momentum0`` / ``momentum1`` are
          torch's ``exp_avg`` / ``exp_avg_sq``, measured equal) and the step count, which becomes
          ``global_step``.

        What cannot be: onnxruntime-training's AdamW (``OptimType.AdamW``) is the Hugging Face
        flavour (``adam_mode=1``): ``p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)``,
        and weight decay after the update, where torch divides ``sqrt(v)`` (not eps) by
        ``sqrt(1 - beta2^t)`` and decays first. The trainer follows torch, so the run continues
        from the same parameters and moments on a slightly different trajectory (most in the first
        steps, where ``eps / sqrt(1 - beta2^t)`` is large; the two rules converge as t grows). A
        learning rate set with ``set_learning_rate`` or a scheduler is not in the file (only the
        initial one), nor is the loss. SGD here keeps no state from onnxruntime-training (its SGD
        has none); torch's momentum buffer starts empty. amsgrad's ``max_exp_avg_sq`` starts at
        ``exp_avg_sq``. Frozen parameters in the checkpoint are left as the model has them.

        onnxruntime.training is imported only when ``checkpoint`` is a ``CheckpointState``
        object; a file is read with the flatbuffers classes that plain onnxruntime ships.

        Returns:
            What was carried over and what was not (also kept as ``last_import``).

        Raises:
            ValueError: A parameter is missing or has another shape or type; the checkpoint
                trained a parameter this trainer does not; accumulated gradients are pending.
        """
        if self._accumulated_batches:
            raise RuntimeError("load_onnxruntime_training_checkpoint(): accumulated gradients are not applied")
        with _ort_training_checkpoint_file(checkpoint) as path:
            content = read_onnxruntime_training_checkpoint(path)
            return self._import_ort_training(content, str(path))

    def _import_ort_training(self, content: OrtTrainingCheckpoint, where: str) -> OrtTrainingImport:
        signature = self.signature
        missing = [name for name in signature.params if name not in content.parameters]
        if missing:
            raise ValueError(
                f"{where}: the onnxruntime-training checkpoint lacks the parameters {missing} this trainer trains "
                f"(it has {sorted(content.parameters)}); was it saved for another model?"
            )
        untrained = [name for name in content.parameters if name not in signature.params]
        if untrained:
            raise ValueError(
                f"{where}: the checkpoint trained {untrained}, which this trainer keeps constant (their trained "
                "values would be lost); build it with requires_grad naming them"
            )
        values: dict[str, np.ndarray] = {name: content.parameters[name] for name in signature.params}
        for name in signature.params:  # every slot is set: what is not carried restarts where it starts
            values.update({value: np.array(self._initial[value]) for value in signature.state[name].values()})
        notes: list[str] = []
        carried: dict[str, tuple[str, ...]] = {}
        slots_here = {slot for name in signature.params for slot in signature.state[name]}
        if not content.moments:
            if slots_here:
                notes.append(
                    "optimizer state: the checkpoint has none (save it with CheckpointState.save_checkpoint(state, "
                    "path, include_optimizer_state=True)); moments start at zeros"
                )
        elif not {"exp_avg", "exp_avg_sq"} <= slots_here:
            notes.append(
                f"optimizer state: the checkpoint's AdamW moments are not carried: {self.spec.optimizer.torch_name} "
                "here does not keep them"
            )
        else:
            for name in signature.params:
                moments = content.moments.get(name, {})
                slots = signature.state[name]
                taken = []
                for slot, moment in _ORT_TRAINING_MOMENTS.items():
                    if slot in slots and moment in moments:
                        values[slots[slot]] = moments[moment]
                        taken.append(slot)
                carried[name] = tuple(taken)
                left = sorted(set(slots) - set(taken))
                if left:
                    notes.append(f"optimizer state of {name!r}: {left} not in the checkpoint, start at zeros")
            if any("max_exp_avg_sq" in slots for slots in carried.values()):
                notes.append("amsgrad: max_exp_avg_sq starts at exp_avg_sq (onnxruntime-training keeps no maximum)")
            notes.append(
                "update rule: onnxruntime-training's AdamW is the Hugging Face flavour (eps not bias-corrected, "
                "weight decay after the update); this trainer follows torch, so the trajectory differs slightly"
            )
        current = self._initial
        for name, value in values.items():
            if value.shape != current[name].shape or value.dtype != current[name].dtype:
                raise ValueError(
                    f"{where}: {name!r} is {value.dtype} {list(value.shape)} in the checkpoint, "
                    f"the model expects {current[name].dtype} {list(current[name].shape)}"
                )
        self._assign(values)
        if content.step is not None:
            self.global_step = content.step
        else:
            notes.append("step: the checkpoint has no optimizer step (saved without optimizer state); global_step is 0")
            self.global_step = 0
        notes.append("learning rate: only the initial one is in the checkpoint; pass lr= to continue a schedule")
        self._carried_values = None
        self.zero_grad()
        self.last_import = OrtTrainingImport(
            parameters=tuple(signature.params),
            optimizer_state=carried,
            global_step=self.global_step,
            initial_lr=content.initial_lr,
            properties=dict(content.properties),
            not_carried=tuple(notes),
        )
        return self.last_import

    def _assign(self, values: Mapping[str, np.ndarray]) -> None:
        """Sets parameters and optimizer state (by input name) in the current buffer set."""
        if self._buffers is None:
            self._initial.update({name: np.array(value) for name, value in values.items()})
        else:
            for name, value in values.items():
                self._buffers[self._current][name].update_inplace(np.ascontiguousarray(value))

    def export(self, path: str | Path | None = None) -> onnx.ModelProto:
        """The original model with the trained parameters (standard ops; runs without ortlstm).

        Writes it to ``path`` when given.
        """
        model = export_trained_model(self._original, self.parameters)
        if path is not None:
            onnx.save(model, str(path))
        return model


def _without_lr(spec: dict[str, Any]) -> dict[str, Any]:
    spec["optimizer"] = {key: value for key, value in spec["optimizer"].items() if key != "lr"}
    return spec


def _read_checkpoint(path: str | Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file {str(path)!r}")
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
    except Exception as error:
        raise ValueError(f"{path}: not a safetensors file ({error})") from error
    if metadata.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not an ortlstm Trainer checkpoint (format {metadata.get('format')!r})")
    return metadata, tensors


def export_directory(
    directory: str | Path, output: str | Path, checkpoint: str | Path | None = None
) -> onnx.ModelProto:
    """Writes the trained original model of a training directory (``ortlstm export``).

    Args:
        directory: Written by ``ortlstm train-step`` or ``Trainer.write``.
        output: Where to write the model.
        checkpoint: The state to export (default: ``directory/state.safetensors``).

    Raises:
        FileNotFoundError: The directory or checkpoint is missing.
        ValueError: The checkpoint belongs to another model.
    """
    directory = Path(directory)
    original_path = directory / ORIGINAL_FILE
    if not original_path.is_file():
        raise FileNotFoundError(
            f"{str(directory)!r} holds no {ORIGINAL_FILE}: is it a directory written by `ortlstm train-step`?"
        )
    original = onnx.load(str(original_path))
    metadata, tensors = _read_checkpoint(checkpoint if checkpoint is not None else directory / STATE_FILE)
    if metadata.get("graph_sha256") != graph_hash(original):
        raise ValueError(f"the checkpoint was saved for another model than {original_path}")
    params = {key.split("/", 1)[1]: value for key, value in tensors.items() if key.startswith("param/")}
    model = export_trained_model(original, params)
    onnx.save(model, str(output))
    return model


# ---- onnxruntime-training checkpoints ---------------------------------------------------------------

ORT_TRAINING_ADAMW_EPS = 1e-6
"""The eps of onnxruntime-training's ``OptimType.AdamW`` (onnxblock's AdamW default; torch's is 1e-8)."""

# torch's Adam/AdamW state slot -> onnxruntime-training's AdamW moment (measured: same definitions).
_ORT_TRAINING_MOMENTS = {"exp_avg": "momentum0", "exp_avg_sq": "momentum1", "max_exp_avg_sq": "momentum1"}


@dataclasses.dataclass(frozen=True)
class OrtTrainingCheckpoint:
    """The content of an onnxruntime-training checkpoint file (``CheckpointState.save_checkpoint``).

    Attributes:
        parameters: The trained parameters, by name.
        frozen: The frozen parameters, by name.
        moments: Per parameter, its optimizer state by onnxruntime-training's names
            (AdamW: ``momentum0``, ``momentum1``); empty when saved without optimizer state.
        step: The optimizer's step count (updates done), or None without optimizer state.
        initial_lr: The optimizer's initial learning rate, or None without optimizer state.
        properties: The user properties (``CheckpointState.properties``).
    """

    parameters: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray]
    moments: dict[str, dict[str, np.ndarray]]
    step: int | None
    initial_lr: float | None
    properties: dict[str, int | float | str]


@dataclasses.dataclass(frozen=True)
class OrtTrainingImport:
    """What ``Trainer.load_onnxruntime_training_checkpoint`` carried over.

    Attributes:
        parameters: The parameters loaded (bitwise).
        optimizer_state: Per parameter, the torch state slots filled from the checkpoint.
        global_step: The trainer's step count afterwards (the checkpoint's optimizer step).
        initial_lr: The checkpoint's initial learning rate, if it has one.
        properties: The checkpoint's user properties (e.g. an epoch a loop stored there).
        not_carried: What was not carried over, or differs from here on, in words.
    """

    parameters: tuple[str, ...]
    optimizer_state: dict[str, tuple[str, ...]]
    global_step: int
    initial_lr: float | None
    properties: dict[str, int | float | str]
    not_carried: tuple[str, ...]


def _fbs_tensor(tensor: Any, path: Path) -> tuple[str, np.ndarray]:
    """One flatbuffers ``fbs.Tensor`` of a checkpoint as (name, array): inline or external data."""
    name = tensor.Name().decode()
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.DataType())).newbyteorder("<")
    dims = [int(tensor.Dims(index)) for index in range(tensor.DimsLength())]
    size = math.prod(dims) * dtype.itemsize
    offset = tensor.ExternalDataOffset()
    if offset >= 0:
        # Large checkpoints keep tensor bytes in "<checkpoint>.data", at the tensor's offset.
        external = Path(str(path) + ".data")
        with open(external, "rb") as handle:
            handle.seek(offset)
            data = handle.read(size)
    else:
        data = tensor.RawDataAsNumpy().tobytes() if tensor.RawDataLength() else b""
    if len(data) != size:
        raise ValueError(f"{path}: tensor {name!r} {dims} has {len(data)} bytes of data, expected {size}")
    return name, np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(dims)


def read_onnxruntime_training_checkpoint(path: str | Path) -> OrtTrainingCheckpoint:
    """Reads an onnxruntime-training checkpoint file (flatbuffers, format version 1 or 2).

    Uses the flatbuffers classes of the checkpoint schema that onnxruntime ships
    (``onnxruntime.tools.ort_format_model``), so plain onnxruntime reads it: onnxruntime.training
    is not imported.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not a checkpoint, a nominal checkpoint (no parameter values), or more than one
            optimizer group.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no onnxruntime-training checkpoint file {str(path)!r} (CheckpointState.save_checkpoint writes one)"
        )
    try:
        from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import Checkpoint
    except ImportError as error:
        raise ImportError(
            "reading an onnxruntime-training checkpoint needs onnxruntime (its bundled flatbuffers schema) "
            "and the flatbuffers package"
        ) from error
    buffer = path.read_bytes()
    try:
        root = Checkpoint.Checkpoint.GetRootAs(buffer, 0)
        module = root.ModuleState()
    except Exception as error:
        raise ValueError(f"{path}: not an onnxruntime-training checkpoint ({error})") from error
    if module is None:
        raise ValueError(f"{path}: the checkpoint holds no module state (parameters)")
    if module.IsNominalState():
        raise ValueError(
            f"{path}: a nominal checkpoint (generate_artifacts(..., nominal_checkpoint=True)) holds no parameter "
            "values; save the state of a loaded run instead"
        )
    parameters = dict(_fbs_tensor(module.RequiresGradParams(i), path) for i in range(module.RequiresGradParamsLength()))
    frozen = dict(_fbs_tensor(module.FrozenParams(i), path) for i in range(module.FrozenParamsLength()))
    groups = root.OptimizerGroupsLength()
    if groups > 1:
        raise ValueError(f"{path}: {groups} optimizer groups; only one (onnxruntime-training's group0) is supported")
    moments: dict[str, dict[str, np.ndarray]] = {}
    step = initial_lr = None
    if groups == 1:
        group = root.OptimizerGroups(0)
        step = int(group.Step())
        # Stored as float32: its shortest repr is the value the user wrote (1e-3, not 0.0010000000474974513).
        initial_lr = float(str(np.float32(group.InitialLearningRate())))
        for index in range(group.OptimizerStatesLength()):
            state = group.OptimizerStates(index)
            moments[state.ParamName().decode()] = dict(
                _fbs_tensor(state.Momentums(j), path) for j in range(state.MomentumsLength())
            )
    properties: dict[str, int | float | str] = {}
    bag = root.PropertyBag()
    if bag is not None:
        for index in range(bag.IntsLength()):
            properties[bag.Ints(index).Name().decode()] = int(bag.Ints(index).Value())
        for index in range(bag.FloatsLength()):
            properties[bag.Floats(index).Name().decode()] = float(bag.Floats(index).Value())
        for index in range(bag.StringsLength()):
            properties[bag.Strings(index).Name().decode()] = bag.Strings(index).Value().decode()
    return OrtTrainingCheckpoint(parameters, frozen, moments, step, initial_lr, properties)


@contextlib.contextmanager
def _ort_training_checkpoint_file(checkpoint: Any) -> Iterator[Path]:
    """A path to the checkpoint: the given one, or a live ``CheckpointState`` saved to a temporary file."""
    if isinstance(checkpoint, (str, Path)):
        yield Path(checkpoint)
        return
    try:
        from onnxruntime.training.api import CheckpointState
    except ImportError as error:
        raise TypeError(
            f"checkpoint must be a path or an onnxruntime.training.api.CheckpointState, got {type(checkpoint).__name__}"
        ) from error
    if not isinstance(checkpoint, CheckpointState):
        raise TypeError(
            f"checkpoint must be a path or an onnxruntime.training.api.CheckpointState, got {type(checkpoint).__name__}"
        )
    with tempfile.TemporaryDirectory(prefix="ortlstm-ort-training-") as directory:
        path = Path(directory) / "checkpoint"
        try:
            CheckpointState.save_checkpoint(checkpoint, str(path), include_optimizer_state=True)
        except Exception:  # no Optimizer was ever created over this state: parameters only
            CheckpointState.save_checkpoint(checkpoint, str(path))
        yield path
