"""The engine: the training models in onnxruntime sessions, and the values they update.

Parameters and optimizer state live in two sets of onnxruntime-owned buffers: an update (train
step or apply) reads one set and writes the other through IOBinding, then the two swap (no output
is ever bound to its own input). Against ``session.run`` with NumPy feeds and outputs (shared
2-vCPU VM, 1 thread, AdamW, three interleaved rounds): 2.46-3.05 vs 2.70-3.18 ms per step at the
demo's size (batch 32, 8 steps, 8 inputs, hidden 64, bidirectional); 182-183 vs 177-187 ms at
(64, 32, 256, 256) bidirectional, where the LSTM kernels dominate. Bitwise the same parameters.

The learning rate and step of the next update, and the update's ``all_finite`` output, are 0-D
arrays bound once to each update binding and written in place.

onnxruntime is imported lazily, when the first session or buffer is made.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from ortlstm.graphs.structure import without_unused_initializers
from ortlstm.graphs.train_step import TrainStepSignature

MODEL_KINDS = ("train_step", "eval", "gradients", "apply")


def import_onnxruntime() -> Any:
    """onnxruntime, or an ImportError that says how to install it."""
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


def float64_disabled_optimizers(values: Iterable[np.ndarray]) -> list[str]:
    """Graph optimizations to turn off for a model with these parameter values.

    onnxruntime-training 1.19.2 fuses MatMul(A, Transpose(B)) into com.microsoft FusedMatMul,
    which has no float64 kernel there: a float64 model with that pattern (torch's unoptimized
    dynamo export writes it for every Linear) would fail to load. Harmless elsewhere.
    """
    return ["MatmulTransposeFusion"] if any(np.asarray(value).dtype == np.float64 for value in values) else []


class Engine:
    """Sessions, double-buffered parameters and optimizer state, bindings and the update's scalars.

    Attributes:
        models: The training models by kind (``MODEL_KINDS``), without unused initializers.
        signature: Names of every input and output of the models.
        sessions: The sessions made so far, by kind.
        initial: The values before the buffers exist (parameters and state, by input name); their
            shapes and types are those of the buffers.
    """

    def __init__(
        self,
        models: Mapping[str, onnx.ModelProto],
        signature: TrainStepSignature,
        values: Mapping[str, np.ndarray],
        threads: int | None,
    ) -> None:
        self.models = {kind: without_unused_initializers(models[kind]) for kind in MODEL_KINDS}
        self.signature = signature
        self.sessions: dict[str, Any] = {}
        self._threads = threads
        self._bindings: dict[tuple[str, int], Any] = {}
        # Parameter or state input -> the output that carries its next value.
        self._updates: dict[str, str] = dict(zip(signature.params, signature.new_params, strict=True))
        for name in signature.params:
            for slot, value in signature.state[name].items():
                self._updates[value] = signature.new_state[name][slot]
        self.initial = {name: np.array(values[name]) for name in self._updates}
        self._buffers: list[dict[str, Any]] | None = None
        self._current = 0
        # lr and step of the next update: bound once to each update binding, written in place.
        self._lr_value = np.zeros((), dtype=np.float64)
        self._step_value = np.zeros((), dtype=np.int64)
        # The update's all_finite output: bound once to each update binding, read after each run.
        self._finite_value = np.zeros((), dtype=np.bool_)

    def session(self, kind: str) -> Any:
        """The session of ``kind``, made on first use."""
        if kind not in self.sessions:
            ort = import_onnxruntime()
            from ortlstm.ops import session_options

            options = (
                session_options() if self._threads is None else session_options(intra_op_num_threads=self._threads)
            )
            _plan_training_memory(ort, options)
            self.sessions[kind] = ort.InferenceSession(
                self.models[kind].SerializeToString(),
                options,
                providers=["CPUExecutionProvider"],
                disabled_optimizers=float64_disabled_optimizers(self.initial.values()),
            )
        return self.sessions[kind]

    def _store(self) -> list[dict[str, Any]]:
        """The two buffer sets (onnxruntime-owned), created on first use from the initial values."""
        if self._buffers is None:
            ort = import_onnxruntime()

            def buffer(value: np.ndarray) -> Any:
                result = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), value.dtype, "cpu")
                result.update_inplace(np.ascontiguousarray(value))
                return result

            self._buffers = [
                {name: buffer(value) for name, value in self.initial.items()},
                {name: buffer(np.zeros_like(value)) for name, value in self.initial.items()},
            ]
            self._current = 0
        return self._buffers

    def _update_binding(self, kind: str) -> Any:
        """The binding of ``kind`` (train_step or apply) reading the current set, writing the other."""
        key = (kind, self._current)
        if key not in self._bindings:
            buffers = self._store()
            binding = self.session(kind).io_binding()
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
        binding = self.session(kind).io_binding()
        buffers = self._store()[self._current]
        for name in self.signature.params:
            binding.bind_ortvalue_input(name, buffers[name])
        return binding

    def run(self, kind: str, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        """Runs ``kind`` on the current values: an update (train_step, apply) writes the other set.

        Binds the feeds and the outputs onnxruntime allocates, runs, returns those outputs. An
        update takes effect only with ``swap``.
        """
        binding = self._update_binding(kind) if kind in ("train_step", "apply") else self._read_binding(kind)
        keep = {name: np.ascontiguousarray(value) for name, value in feeds.items()}
        for name, value in keep.items():
            binding.bind_cpu_input(name, value)
        for name in outputs:
            binding.bind_output(name, "cpu")
        self.session(kind).run_with_iobinding(binding)
        # Every bound output in binding order; the ones asked for were bound last. The raw vector:
        # get_outputs() would wrap each parameter and state buffer in a Python OrtValue per step.
        values = binding.get_outputs_as_ortvaluevector()
        return [values[index].numpy() for index in range(len(values) - len(outputs), len(values))]

    def set_scalars(self, lr: float, step: int) -> None:
        """Writes the next update's lr and step (1-based) where the update bindings read them."""
        self._lr_value[()] = lr
        self._step_value[()] = step

    def begin_update(self) -> list[str]:
        """Clears the bound ``all_finite`` (a run that does not write it is refused); the outputs to bind.

        Those are the update model's outputs besides the loss bound per run: the clipped norm.
        """
        self._finite_value[()] = False
        return [self.signature.grad_norm] if self.signature.grad_norm else []

    def update_is_finite(self, named: Mapping[str, np.ndarray], losses_finite: bool) -> tuple[bool, float | None]:
        """Whether the update just run may be kept, and its clipped gradient norm (None: not clipped).

        The models' ``all_finite`` output covers the train step's loss and the gradients; models
        without it (directories written before it) are checked on the losses and clipped norm only.
        """
        signature = self.signature
        norm = float(named[signature.grad_norm].reshape(())) if signature.grad_norm else None
        if not losses_finite:
            return False, norm
        if signature.all_finite:
            return bool(self._finite_value), norm
        return norm is None or math.isfinite(norm), norm

    def swap(self) -> None:
        """Keeps the last update: the set it wrote becomes the current one."""
        self._current = 1 - self._current

    def values(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters and optimizer state, by input name."""
        if self._buffers is None:
            return {name: value.copy() for name, value in self.initial.items()}
        # OrtValue.numpy() is a view of the buffer, which a later update overwrites: copy.
        return {name: np.array(value.numpy()) for name, value in self._buffers[self._current].items()}

    def assign(self, values: Mapping[str, np.ndarray]) -> None:
        """Sets parameters and optimizer state (by input name) in the current buffer set."""
        if self._buffers is None:
            self.initial.update({name: np.array(value) for name, value in values.items()})
        else:
            for name, value in values.items():
                self._buffers[self._current][name].update_inplace(np.ascontiguousarray(value))
