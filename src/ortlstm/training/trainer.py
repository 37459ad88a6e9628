"""The Trainer: a facade over the spec, the engine, the feeds, the guard and the checkpoints.

``Trainer`` keeps the public API (steps, evaluation, schedules, accumulation, checkpoints,
export); each layer is a module of this package: ``spec`` (the options), ``engine`` (sessions
and buffers), ``feeds`` (batches, targets, carried state), ``guard`` (non-finite updates) and
``checkpoint`` (files). Continuing an onnxruntime-training run is ``ortlstm.ort_training``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.carried_state import CarriedState, with_carried_state
from ortlstm.graphs.parameters import TrainedParameter, constant_sources, describe_trained, torch_sources
from ortlstm.graphs.prepare.dequantize import describe_int8
from ortlstm.graphs.structure import graph_hash
from ortlstm.graphs.train_step import TrainStepSignature, build_training_models
from ortlstm.training import checkpoint as files
from ortlstm.training.accumulation import Accumulator
from ortlstm.training.engine import Engine
from ortlstm.training.feeds import Feeds
from ortlstm.training.guard import all_finite, check_mode, loss_value, refusal
from ortlstm.training.options import DEFAULTS, run_time_values
from ortlstm.training.spec import LearningRate, TrainingSpec

if TYPE_CHECKING:  # the 1.19.2 path is imported where used: ortlstm.ort_training imports ortlstm.training
    from ortlstm.ort_training import OrtTrainingCheckpoint, OrtTrainingImport


_NOT_OPTIONS = ("self", "model")


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
    one set and writes the other through IOBinding, then the two swap (``engine``, which says
    what that gains over ``session.run``).

    Attributes:
        signature: Names of every input and output of the training models.
        spec: The loss, optimizer and options the models were built with, and the run-time ones.
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
        lr: LearningRate | None = DEFAULTS["lr"],
        requires_grad: Sequence[str] | None = DEFAULTS["requires_grad"],
        frozen: Sequence[str] = DEFAULTS["frozen"],
        output: str | None = DEFAULTS["output"],
        target: str = DEFAULTS["target"],
        extra_outputs: Sequence[str] = DEFAULTS["extra_outputs"],
        param_groups: Sequence[optimizers.ParamGroup] = DEFAULTS["param_groups"],
        clip_grad_norm: float | None = DEFAULTS["clip_grad_norm"],
        clip_norm_type: float = DEFAULTS["clip_norm_type"],
        clip_grad_value: float | None = DEFAULTS["clip_grad_value"],
        fixed_inputs: Mapping[str, np.ndarray] | None = DEFAULTS["fixed_inputs"],
        fixed_shapes: Mapping[str, Sequence[int | str | None]] | None = DEFAULTS["fixed_shapes"],
        stateful: bool = DEFAULTS["stateful"],
        threads: int | None = DEFAULTS["threads"],
        ir_version: int = DEFAULTS["ir_version"],
        nonfinite: str = DEFAULTS["nonfinite"],
        precision: str = DEFAULTS["precision"],
    ) -> None:
        """Builds the training models of ``model``.

        Args:
            model: The model as exported (a ModelProto or a path), with standard ``LSTM`` nodes.
            loss: The loss applied to the prediction.
            optimizer: The optimizer; its ``lr`` is the learning rate unless ``lr`` is given.
            lr: A constant learning rate, or a schedule ``f(n) -> lr`` called with the number of
                updates done before the one it serves (0 first), as torch's LR schedulers count.
            requires_grad: Parameters to train, named as ``frozen``. Default: what torch trains that reaches the loss
                (a torch export's parameters by its metadata; without metadata every float
                tensor of rank >= 1); ``trained`` and ``summary()`` say what was chosen.
            frozen: Parameters not to train, by ONNX or torch name, glob (``"FeatureExtraction.*"``) or
                module prefix (as ``requires_grad`` and ``param_groups``' params: ``parameters.ParameterNames``).
            output: The model output the loss reads (needed when the model has several).
            target: Name given to the target input.
            extra_outputs: Model outputs ``step`` returns after the loss.
            param_groups: Per-group optimizer overrides (no weight decay on ``"*.bias"``); params named as ``frozen``.
            clip_grad_norm: Clip the global gradient norm to this value.
            clip_norm_type: The clipping norm's type (2.0 or inf).
            clip_grad_value: Clamp every gradient element to ``[-clip_grad_value, clip_grad_value]``
                before the update (torch's ``clip_grad_value_``); finite and > 0; not together
                with ``clip_grad_norm``.
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
            precision: Lightning's name: ``"32-true"`` (float32 throughout) or ``"bf16-mixed"`` (every GEMM of the
                kernel ops on bfloat16 operands, float32 accumulation, weights, optimizer state and export, as
                torch.autocast on the CPU); saved with the run.

        Raises:
            ValueError: From ``build_training_models``: an unknown output or parameter, a target
                the loss cannot take, an op without gradient on a parameter's path.
        """
        # Every keyword but the model, by its own name: a new option reaches the spec without a list to extend.
        options = {name: value for name, value in locals().items() if name not in _NOT_OPTIONS}
        spec = TrainingSpec.from_options(**options)
        self._build(files.load_model(model), spec)

    def _build(self, original: onnx.ModelProto, spec: TrainingSpec) -> None:
        """Builds the training models of ``original`` as ``spec`` says, and sets the trainer up over them."""
        training_model, carried = with_carried_state(original) if spec.stateful else (original, ())
        if spec.prediction is None and len(original.graph.output) == 1:
            spec = dataclasses.replace(spec, prediction=original.graph.output[0].name)
        carried_outputs = [final for state in carried for _, final in state.states]
        arguments = spec.build_arguments()
        arguments["extra_outputs"] = list(dict.fromkeys([*spec.extra_outputs, *carried_outputs]))
        built = build_training_models(training_model, **arguments, kernel_gradients=True)  # the library is loaded
        outputs = [value.name for value in built.prepared.model.graph.output]
        resolved = dataclasses.replace(
            spec,
            requires_grad=built.signature.params,
            prediction=spec.prediction if spec.prediction is not None else outputs[0],
            target=built.signature.target,
        )
        models = {
            "train_step": built.train_step,
            "eval": built.eval,
            "gradients": built.gradients,
            "apply": built.apply,
        }
        values = {**built.initial_params, **built.initial_state}
        self._setup(original, models, built.signature, resolved, values, carried)
        self.nonfinite = spec.nonfinite

    def _setup(
        self,
        original: onnx.ModelProto,
        models: Mapping[str, onnx.ModelProto],
        signature: TrainStepSignature,
        spec: TrainingSpec,
        values: Mapping[str, np.ndarray],
        carried: tuple[CarriedState, ...],
    ) -> None:
        self.signature = signature
        self.spec = spec
        self.global_step = 0
        self._original = original
        self._graph_hash = graph_hash(original)
        self._engine = Engine(models, signature, values, spec.threads)
        self._feeds = Feeds(signature, spec, carried, self._engine.models["eval"], original)
        self._accumulator = Accumulator()
        self.skipped_steps = 0
        self.last_grad_norm: float | None = None
        self.last_import: OrtTrainingImport | None = None

    @property
    def _models(self) -> dict[str, onnx.ModelProto]:
        """The training models by kind (benchmarks/bench_training.py profiles the train step's)."""
        return self._engine.models

    @property
    def _sessions(self) -> dict[str, Any]:
        """The sessions made so far, by kind (a benchmark may put a profiled one in)."""
        return self._engine.sessions

    # ---- construction from files ----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | Path,
        *,
        lr: LearningRate | None = DEFAULTS["lr"],
        threads: int | None = DEFAULTS["threads"],
        nonfinite: str = DEFAULTS["nonfinite"],
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
        original, models, signature, spec, values = files.read_directory(directory)
        spec = dataclasses.replace(spec, **run_time_values(locals()))  # every run-time option, by its own name
        carried = with_carried_state(original)[1] if spec.stateful else ()
        trainer = cls.__new__(cls)
        trainer._setup(original, models, signature, spec, values, carried)
        trainer.nonfinite = spec.nonfinite  # checked
        trainer.load(directory / files.STATE_FILE)
        return trainer

    @classmethod
    def from_checkpoint(
        cls,
        model: onnx.ModelProto | str | Path,
        checkpoint: str | Path,
        *,
        lr: LearningRate | None = DEFAULTS["lr"],
        threads: int | None = DEFAULTS["threads"],
        nonfinite: str = DEFAULTS["nonfinite"],
    ) -> Trainer:
        """Rebuilds the trainer a checkpoint was saved from (its spec is in the file) and loads it."""
        run_time = run_time_values(locals())  # every run-time option, by its own name
        metadata, tensors = files.read_checkpoint(checkpoint)
        spec = dataclasses.replace(
            TrainingSpec.from_json(json.loads(metadata["spec"])),
            fixed_inputs=files.tensors_under(tensors, "fixed"),
            **run_time,
        )
        trainer = cls(model, **spec.trainer_options())
        trainer.load(checkpoint)
        return trainer

    def write(self, directory: str | Path) -> Path:
        """Writes the original model, the four training models, a manifest and the current state.

        ``Trainer.open(directory)`` reads them back; ``ortlstm export DIR OUT.onnx`` exports them.
        Returns the directory.
        """
        directory = Path(directory)
        files.write_directory(
            directory, self._original, self._engine.models, self.spec, self.signature, self._graph_hash
        )
        self.save(directory / files.STATE_FILE)
        return directory

    # ---- carried state and learning rate ----------------------------------------------------------

    def reset_state(self, rows: Sequence[int] | np.ndarray | None = None) -> None:
        """Zeros the carried LSTM/GRU/RNN state (stateful trainers): all of it, or the given batch rows.

        Raises:
            RuntimeError: The trainer is not stateful.
        """
        if not self._feeds.carried:
            raise RuntimeError("reset_state(): the trainer carries no state; build it with stateful=True")
        self._feeds.reset(rows)

    @property
    def carried_state(self) -> dict[str, np.ndarray]:
        """The state the next step starts from, by initial_h/initial_c input (empty: zeros)."""
        return {name: value.copy() for name, value in (self._feeds.carried_values or {}).items()}

    @property
    def _lr(self) -> LearningRate:
        """The learning rate: the spec's constant or schedule, else the optimizer's lr."""
        return self.spec.optimizer.lr if self.spec.lr is None else self.spec.lr

    def learning_rate(self, update: int | None = None) -> float:
        """The learning rate of update ``update`` (1-based; default: the next one)."""
        done = self.global_step if update is None else update - 1
        return float(self._lr(done)) if callable(self._lr) else float(self._lr)

    def _set_scalars(self, lr: float | None) -> None:
        """Writes this update's lr and step into the arrays the update bindings read."""
        value = self.learning_rate() if lr is None else float(lr)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"learning rate must be a finite number >= 0, got {value}")
        self._engine.set_scalars(value, self.global_step + 1)

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
        if self._accumulator.batches:
            raise RuntimeError(
                f"step(): gradients of {self._accumulator.batches} batch(es) are accumulated; "
                "call apply() (or zero_grad()) first"
            )
        feeds = self._feeds.batch(batch, named, target, "step()")
        self._set_scalars(lr)
        signature = self.signature
        outputs = [signature.loss, *signature.extra_outputs, *self._engine.begin_update()]
        values = self._engine.run("train_step", feeds, outputs)
        named_values = dict(zip(outputs, values, strict=True))
        result = self._result([named_values[name] for name in [signature.loss, *self.spec.extra_outputs]])
        loss = named_values[signature.loss]
        # all_finite covers the train step's loss; a model without it has the loss checked here.
        if not self._update_is_finite(named_values, bool(signature.all_finite) or all_finite(loss)):
            self._refuse("step()", ("the loss", loss_value(loss)), lambda: self._gradients_of(feeds))
            return result
        self._advance()
        self._feeds.keep_carried(named_values)
        return result

    def _advance(self) -> None:
        self._engine.swap()
        self.global_step += 1

    @staticmethod
    def _result(values: list[np.ndarray]) -> Any:
        loss = loss_value(values[0])
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
        available = [value.name for value in self._engine.models["eval"].graph.output]
        unknown = [name for name in wanted if name not in available]
        if unknown:
            raise ValueError(f"evaluate(): {unknown} are not outputs of the model; it has {available[1:]}")
        feeds = self._feeds.batch(batch, named, target, "evaluate()", carry=False)
        return self._result(self._engine.run("eval", feeds, [self.signature.loss, *wanted]))

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
        feeds = self._feeds.batch(batch, named, target, "accumulate()")
        signature = self.signature
        grads = [signature.grads[name] for name in signature.params]
        wanted = [signature.loss, *signature.extra_outputs, *grads]
        named_values = dict(zip(wanted, self._engine.run("gradients", feeds, wanted), strict=True))
        self._accumulator.add(
            {name: named_values[signature.grads[name]] for name in signature.params},
            named_values[signature.loss],
            self._feeds.carried_values,
        )
        self._feeds.keep_carried(named_values)
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
        accumulator = self._accumulator
        if gradients is None and not accumulator.batches:
            raise RuntimeError("apply(): no gradients accumulated; call accumulate(...) first")
        if gradients is not None:
            accumulator.replace(gradients, self.signature.params, self._engine.initial)
        signature = self.signature
        feeds = {signature.grads[name]: accumulator.gradients[name] for name in signature.params}
        self._set_scalars(lr)
        outputs = self._engine.begin_update()
        values = self._engine.run("apply", feeds, outputs)
        if not self._update_is_finite(dict(zip(outputs, values, strict=True)), not accumulator.nonfinite_losses):
            batch, loss = accumulator.nonfinite_losses[0] if accumulator.nonfinite_losses else (0, None)
            count = accumulator.batches
            gradients = accumulator.gradients
            self._feeds.carried_values = accumulator.carried_before
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
        return dict(self._accumulator.gradients)

    def zero_grad(self) -> None:
        """Discards the accumulated gradients."""
        self._accumulator.clear()

    # ---- the non-finite guard: a refused update only leaves the swap undone ------------------------

    @property
    def nonfinite(self) -> str:
        """``"raise"`` or ``"skip"``: what an update whose loss or gradients are not finite does."""
        return self.spec.nonfinite

    @nonfinite.setter
    def nonfinite(self, mode: str) -> None:
        self.spec = dataclasses.replace(self.spec, nonfinite=check_mode(mode))

    def _update_is_finite(self, named: Mapping[str, np.ndarray], losses_finite: bool) -> bool:
        """Whether the update just computed may be kept (``Engine.update_is_finite``); sets ``last_grad_norm``."""
        kept, norm = self._engine.update_is_finite(named, losses_finite)
        if norm is not None:
            self.last_grad_norm = norm
        return kept

    def _gradients_of(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The parameter gradients of a batch (the gradients model; diagnosis of a refused step)."""
        signature = self.signature
        values = self._engine.run("gradients", feeds, [signature.grads[name] for name in signature.params])
        return dict(zip(signature.params, values, strict=True))

    def _refuse(
        self,
        where: str,
        loss: tuple[str, Any] | None,
        gradients: Callable[[], Mapping[str, np.ndarray]],
        discarded: str = "",
    ) -> None:
        """Counts a refused update (``skip``), or raises ``NonFiniteStepError`` saying what was not finite."""
        if self.nonfinite == "skip":
            self.skipped_steps += 1
            return
        raise refusal(
            where,
            global_step=self.global_step,
            loss=loss,
            grad_norm=self.last_grad_norm if self.signature.grad_norm else None,
            gradients=gradients,
            carried=bool(self._feeds.carried),
            discarded=discarded,
            sources=torch_sources(self._original),
        )

    # ---- state --------------------------------------------------------------------------------------

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        """Copies of the trained parameters' current values, by their names in the model."""
        values = self._engine.values()
        return {name: values[name] for name in self.signature.params}

    @property
    def trained(self) -> tuple[TrainedParameter, ...]:
        """What this trainer trains: each parameter's name, shape, type and the torch parameters it stands for."""
        sources = torch_sources(self._original)
        initial = self._engine.initial
        return tuple(
            TrainedParameter(name, tuple(initial[name].shape), str(initial[name].dtype), sources.get(name, ()))
            for name in self.signature.params
        )

    def summary(self) -> str:
        """A table of the trained and frozen parameters, for a reader to check against their torch model."""
        sources, int8 = torch_sources(self._original), describe_int8(self._original)
        return describe_trained(self.trained, self.signature.frozen, sources, int8, constant_sources(self._original))

    @property
    def optimizer_state(self) -> dict[str, dict[str, np.ndarray]]:
        """Copies of the optimizer state: parameter -> slot (torch's names) -> value."""
        values = self._engine.values()
        return {
            name: {slot: values[value] for slot, value in self.signature.state[name].items()}
            for name in self.signature.params
        }

    def _assign(self, values: Mapping[str, np.ndarray]) -> None:
        """Sets parameters and optimizer state (by input name) in the current buffer set."""
        self._engine.assign(values)

    def save(self, path: str | Path) -> Path:
        """Writes the whole training state to one safetensors file.

        Tensors: ``param/NAME``, ``state/NAME/SLOT``, ``fixed/NAME`` for fixed inputs and
        ``carried/INPUT`` for a stateful trainer's carried LSTM state;
        metadata: the format, the global step, the learning rate (when constant), the spec (loss,
        optimizer with its hyperparameters, options) as JSON and the graph hash.

        Raises:
            RuntimeError: Gradients are accumulated but not applied.
        """
        if self._accumulator.batches:
            raise RuntimeError("save(): accumulated gradients are not applied; call apply() or zero_grad() first")
        return files.write_checkpoint(
            path,
            parameters=self.parameters,
            optimizer_state=self.optimizer_state,
            fixed_inputs=self.spec.fixed_inputs,
            carried=self._feeds.carried_values or {},
            global_step=self.global_step,
            skipped_steps=self.skipped_steps,
            lr=self._lr,
            spec=self.spec,
            graph_sha256=self._graph_hash,
        )

    def load(self, path: str | Path, *, check_graph: bool = True) -> None:
        """Restores parameters, optimizer state and the global step from ``save``'s file.

        Args:
            path: The checkpoint.
            check_graph: Refuse a checkpoint saved for a model of another structure.

        Raises:
            ValueError: The file is not a checkpoint of this model and spec, or a tensor is missing
                or of another shape or type.
        """
        metadata, tensors = files.read_checkpoint(path)
        if check_graph and metadata.get("graph_sha256") != self._graph_hash:
            raise ValueError(
                f"{path}: the checkpoint was saved for another model (graph hash "
                f"{metadata.get('graph_sha256', '?')[:12]}, this trainer's model {self._graph_hash[:12]}); "
                "load(..., check_graph=False) skips this check"
            )
        values = files.checkpoint_values(
            path, metadata, tensors, spec=self.spec, signature=self.signature, expected=self._engine.initial
        )
        self._engine.assign(values)
        self.global_step = int(metadata["global_step"])
        self.skipped_steps = int(metadata.get("skipped_steps", 0))
        self._feeds.restore_carried(files.tensors_under(tensors, "carried"))
        if not self.spec.fixed_inputs:
            self.spec = dataclasses.replace(self.spec, fixed_inputs=files.tensors_under(tensors, "fixed"))
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
        lr: LearningRate | None = DEFAULTS["lr"],
        requires_grad: Sequence[str] | None = None,
        threads: int | None = DEFAULTS["threads"],
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
        from ortlstm.ort_training import checkpoint_file, read_onnxruntime_training_checkpoint, trainer_defaults
        with checkpoint_file(checkpoint) as path:
            content = read_onnxruntime_training_checkpoint(path)
            original = files.load_model(model)
            requires_grad, optimizer = trainer_defaults(content, original, requires_grad, optimizer)
            trainer = cls(
                original, loss=loss, optimizer=optimizer, lr=lr, requires_grad=requires_grad, threads=threads, **options
            )
            trainer._import_ort_training(content, str(path))
        return trainer

    def load_onnxruntime_training_checkpoint(self, checkpoint: Any) -> OrtTrainingImport:
        """Loads an onnxruntime-training ``CheckpointState`` (file or object) into this trainer.

        Every parameter this trainer trains is loaded bitwise, by name; with Adam or AdamW and a
        checkpoint saved with ``include_optimizer_state=True``, the first and second moments and
        the step count (``global_step``) too. The run continues on a slightly different
        trajectory: onnxruntime-training's AdamW is the Hugging Face flavour, this trainer follows
        torch. The details, and what is not carried: ``ortlstm.ort_training.importer``.

        onnxruntime.training is imported only when ``checkpoint`` is a ``CheckpointState``
        object; a file is read with the flatbuffers classes that plain onnxruntime ships.

        Returns:
            What was carried over and what was not (also kept as ``last_import``).

        Raises:
            ValueError: A parameter is missing or has another shape or type; the checkpoint
                trained a parameter this trainer does not; accumulated gradients are pending.
        """
        if self._accumulator.batches:
            raise RuntimeError("load_onnxruntime_training_checkpoint(): accumulated gradients are not applied")
        from ortlstm.ort_training import checkpoint_file, read_onnxruntime_training_checkpoint
        with checkpoint_file(checkpoint) as path:
            content = read_onnxruntime_training_checkpoint(path)
            return self._import_ort_training(content, str(path))

    def _import_ort_training(self, content: OrtTrainingCheckpoint, where: str) -> OrtTrainingImport:
        """Loads an ``OrtTrainingCheckpoint``'s content (see ``load_onnxruntime_training_checkpoint``)."""
        from ortlstm.ort_training import import_checkpoint
        values, imported = import_checkpoint(
            content, where, self.signature, self._engine.initial, self.spec.optimizer.torch_name
        )
        self._engine.assign(values)
        self.global_step = imported.global_step
        self._feeds.carried_values = None
        self.zero_grad()
        self.last_import = imported
        return imported

    def export(self, path: str | Path | None = None, quantize: str | None = None) -> onnx.ModelProto:
        """The original model with the trained parameters (standard ops; runs without ortlstm), written to ``path``.

        ``quantize="dynamic"``: int8 again, as onnxruntime.quantization.quantize_dynamic writes it (``export_model``).
        """
        return files.export_model(self._original, self.parameters, path, quantize)
