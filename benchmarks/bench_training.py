"""Times one training step of the same LSTM classifiers: the ortlstm Trainer, onnxruntime-training, PyTorch.

Competitors, one process, the same model, batch and thread count:

- **trainer**: ``ortlstm.training.Trainer`` (plain onnxruntime's InferenceSession over the
  train-step model; ``trainer.step(x, target=y)``);
- **module**: onnxruntime-training's ``Module`` + ``Optimizer`` over the artifacts of
  ``ortlstm.graphs.generate_artifacts`` (``module(x, y); optimizer.step(); module.lazy_reset_grad()``);
- **torch**: the same network in PyTorch (``nn.LSTM`` + ``nn.Linear``; ``zero_grad``,
  forward, ``cross_entropy``, ``backward``, ``AdamW.step``, ``loss.item()``).

bf16 mixed precision (issue 33), when named in ``--competitors``: **ortlstm-bf16** is the Trainer with
``precision="bf16-mixed"`` (every GEMM on bfloat16 operands, float32 accumulation, master weights and
AdamW state), **torch-autocast** torch's step with ``torch.autocast("cpu", dtype=torch.bfloat16)`` around
forward and loss (what a PyTorch user on a bf16 CPU runs). The issue's two models are the ``M128-2bi`` and
``L256-1`` configs; ``--bf16`` runs them with trainer, ortlstm-bf16, torch and torch-autocast.

Every model is an LSTM classifier (cross-entropy over 10 classes, AdamW) on top of 1 forward or 2
bidirectional LSTM layers; the ONNX model is built with onnx.helper and torch's copy gets the same
weights (the first losses of the three are compared). The ``convlstm`` row (issue 22) is a ConvLSTM
classifier instead (``build_convlstm_model``: one Conv2d cell over [x_t, h], the same loss and
optimizer) at (N, T, C, H, W, hidden) = (8, 8, 4, 32, 32, 16). Rounds are interleaved (the first
competitor rotating), medians of per-step times are reported with ratios. ``--profile`` adds an onnxruntime
profile of the Trainer's (and the Module's) train step at M: the time in the LSTMTraining and
LSTMGrad kernels against the rest. ``--competitors trainer,trainer-noguard --guard-pairs N``
measures the non-finite guard: the Trainer with and without its ``all_finite`` output, side by
side, and over N steps alternating one by one. See benchmarks/README.md.

Runs where onnxruntime-training and torch are installed (``.venvs/train``); without them the
missing competitors are ``n/a``. It only measures; it never builds the kernels.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import datetime
import functools
import gc
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import unittest.mock
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper


def _bench_lstm() -> ModuleType:
    """benchmarks/bench_lstm.py, for its thread, load, machine and markdown helpers."""
    path = Path(__file__).resolve().parent / "bench_lstm.py"
    spec = importlib.util.spec_from_file_location("bench_lstm", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_lstm"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


bench_lstm = _bench_lstm()

CLASSES = 10
LR = 1e-3
COMPETITORS = ("trainer", "module", "torch")
# Diagnostics, only when named in --competitors: the Trainer with AdamW in standard ONNX ops
# (implementation="onnx", the update before the fused AdamUpdate op), with torch's fused multiply-adds
# emulated in float64 (trainer-onnx) or not (trainer-onnx-nofma: within 1 ulp of torch per step);
# the Trainer without the non-finite guard's all_finite output (trainer-noguard: the train step as
# before the guard; run it with trainer for the guard's cost, side by side).
# trainer-stdgrad: the Trainer with the gradients of Conv, Sigmoid and Tanh in standard ops
# (ConvTranspose, an im2col Conv and MatMul; Sub and Mul) instead of the ortlstm ConvGrad,
# SigmoidGrad and TanhGrad nodes (GraphEmitter(ortlstm_ops=False)): the train step before them.
EXTRA_COMPETITORS = (
    "trainer-onnx",
    "trainer-onnx-nofma",
    "trainer-noguard",
    "trainer-stdgrad",
    "ortlstm-bf16",
    "torch-autocast",
)
# torch-autocast: torch's step with the forward under torch.autocast("cpu", dtype=torch.bfloat16) (issue 33: what
# a PyTorch user on a bf16 CPU runs; float32 parameters and AdamW state). ortlstm-bf16: the Trainer with
# precision="bf16-mixed" (bench_lstm.py's name for the ops with matmul_precision="bfloat16"). Their losses differ
# from the others' by bfloat16 rounding, so they are left out of the first-loss agreement check.
BF16_COMPETITORS = ("ortlstm-bf16", "torch-autocast")
LSTM_OPS = ("LSTMTraining", "LSTMGrad")

# Targets from the issue (one run): trainer / torch at the two larger sizes, trainer / module at
# every size, time outside the LSTM kernels at M.
TARGET_TORCH = 0.9
TARGET_MODULE = 1.1
TARGET_OUTSIDE = 0.10
# Issue 33: a bf16-mixed Trainer step at most 0.8x torch autocast's step on its two models (BF16_CONFIGS).
TARGET_AUTOCAST = 0.8


@dataclasses.dataclass(frozen=True)
class Config:
    """One model and batch: (T, N, I, H), layers, directions."""

    name: str
    seq_length: int
    batch_size: int
    input_size: int
    hidden_size: int
    layers: int
    bidirectional: bool
    demo: bool = False  # ortlstm.demo.build_classifier: batch-first pixels, Transpose first

    @property
    def directions(self) -> int:
        """2 when bidirectional."""
        return 2 if self.bidirectional else 1

    def describe(self) -> str:
        """Dims and architecture in words."""
        kind = f"{self.layers}-layer {'bidirectional' if self.bidirectional else 'forward'}"
        dims = f"({self.seq_length}, {self.batch_size}, {self.input_size}, {self.hidden_size})"
        return f"{dims} {kind}" + (" (ortlstm demo)" if self.demo else "")


CONFIGS: dict[str, Config] = {
    config.name: config
    for config in (
        Config("demo", 8, 32, 8, 64, 1, True, demo=True),
        Config("M-1", 64, 32, 256, 256, 1, False),
        Config("M-2bi", 64, 32, 256, 256, 2, True),
        Config("L-1", 128, 64, 512, 512, 1, False),
        Config("L-2bi", 128, 64, 512, 512, 2, True),
        # Issue 33's two models for the bf16-mixed step against torch autocast.
        Config("M128-2bi", 64, 32, 128, 256, 2, True),
        Config("L256-1", 128, 64, 256, 512, 1, False),
    )
}
BF16_CONFIGS = ("M128-2bi", "L256-1")


@dataclasses.dataclass(frozen=True)
class ConvLstmConfig:
    """A ConvLSTM classifier: x [N, T, C, H, W], one cell (Conv2d over [x_t, h], k x k, padding k // 2)."""

    name: str
    batch_size: int
    seq_length: int
    channels: int
    height: int
    width: int
    hidden_size: int
    kernel: int = 3

    def describe(self) -> str:
        """Dims and architecture in words."""
        dims = (self.batch_size, self.seq_length, self.channels, self.height, self.width, self.hidden_size)
        return f"ConvLSTM (N, T, C, H, W, hidden) = {dims}, {self.kernel}x{self.kernel}"


# The ConvLSTM of issue 22: the torch target applies to it too.
CONVLSTM = ConvLstmConfig("convlstm", 8, 8, 4, 32, 32, 16)
CONFIGS[CONVLSTM.name] = CONVLSTM  # type: ignore[assignment]
LARGE = ("M-1", "M-2bi", "L-1", "L-2bi", CONVLSTM.name)  # the torch target applies here
PROFILE_CONFIGS = ("M-1", "M-2bi")

# ---------------------------------------------------------------------------------------------
# The model: ONNX (numpy weights) and its torch copy


def _uniform(rng: np.random.Generator, bound: float, *shape: int) -> np.ndarray:
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def build_model(config: Config, seed: int = 0) -> onnx.ModelProto:
    """The classifier as ONNX, initialized as torch initializes nn.LSTM and nn.Linear.

    ``x [T, N, I]`` -> LSTM layers (between two: Y [T, D, N, H] -> Transpose, Reshape -> [T, N, D*H])
    -> the last layer's Y_h [D, N, H] -> Transpose, Flatten (torch's ``cat(h_n[-2], h_n[-1])``)
    -> Gemm -> ``logits [N, 10]``. The demo config is ``ortlstm.demo.build_classifier``; a
    ConvLstmConfig's model is ``build_convlstm_model``'s.
    """
    if isinstance(config, ConvLstmConfig):
        return build_convlstm_model(config, seed)
    if config.demo:
        from ortlstm.demo import build_classifier

        return build_classifier(config.hidden_size, seed)
    helper = onnx.helper
    rng = np.random.default_rng(seed)
    hidden, directions = config.hidden_size, config.directions
    bound = 1 / math.sqrt(hidden)
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    sequence, width = "x", config.input_size
    direction = "bidirectional" if config.bidirectional else "forward"
    for layer in range(config.layers):
        names = [f"lstm{layer}.{part}" for part in ("W", "R", "B")]
        values = [
            _uniform(rng, bound, directions, 4 * hidden, width),
            _uniform(rng, bound, directions, 4 * hidden, hidden),
            _uniform(rng, bound, directions, 8 * hidden),
        ]
        initializers += [onnx.numpy_helper.from_array(value, name) for name, value in zip(names, values, strict=True)]
        last = layer == config.layers - 1
        outputs = ["", f"h_n{layer}"] if last else [f"y{layer}"]
        nodes.append(helper.make_node("LSTM", [sequence, *names], outputs, hidden_size=hidden, direction=direction))
        if not last:
            nodes.append(helper.make_node("Transpose", [f"y{layer}"], [f"y{layer}_t"], perm=[0, 2, 1, 3]))
            nodes.append(helper.make_node("Reshape", [f"y{layer}_t", "merge_directions"], [f"seq{layer + 1}"]))
            sequence, width = f"seq{layer + 1}", directions * hidden
    if config.layers > 1:
        initializers.append(onnx.numpy_helper.from_array(np.array([0, 0, -1], np.int64), "merge_directions"))
    head_bound = 1 / math.sqrt(directions * hidden)
    initializers += [
        onnx.numpy_helper.from_array(_uniform(rng, head_bound, CLASSES, directions * hidden), "head.weight"),
        onnx.numpy_helper.from_array(_uniform(rng, head_bound, CLASSES), "head.bias"),
    ]
    top = config.layers - 1
    nodes += [
        helper.make_node("Transpose", [f"h_n{top}"], ["h_n_batch"], perm=[1, 0, 2]),
        helper.make_node("Flatten", ["h_n_batch"], ["features"], axis=1),
        helper.make_node("Gemm", ["features", "head.weight", "head.bias"], ["logits"], transB=1),
    ]
    float_type = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        f"classifier_{config.name}",
        [helper.make_tensor_value_info("x", float_type, ["T", "N", config.input_size])],
        [helper.make_tensor_value_info("logits", float_type, ["N", CLASSES])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def batch_of(config: Config, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The batch every step trains on: x in the model's layout, labels [N] int64."""
    rng = np.random.default_rng(seed)
    if isinstance(config, ConvLstmConfig):
        shape = (config.batch_size, config.seq_length, config.channels, config.height, config.width)
        labels = rng.integers(0, CLASSES, config.batch_size).astype(np.int64)
        return rng.standard_normal(shape, dtype=np.float32), labels
    shape = (config.batch_size, config.seq_length, config.input_size)
    if not config.demo:
        shape = (config.seq_length, config.batch_size, config.input_size)
    x = rng.random(shape, dtype=np.float32) if config.demo else rng.standard_normal(shape, dtype=np.float32)
    return x, rng.integers(0, CLASSES, config.batch_size).astype(np.int64)


# ONNX gate blocks (i, o, f, c) -> torch's (i, f, g, o): torch block k is ONNX block _TORCH_GATES[k].
_TORCH_GATES = (0, 2, 3, 1)


def _torch_gates(value: np.ndarray, hidden: int) -> np.ndarray:
    blocks = [value[k * hidden : (k + 1) * hidden] for k in range(4)]
    return np.concatenate([blocks[k] for k in _TORCH_GATES])


def torch_model(torch: ModuleType, config: Config, model: onnx.ModelProto) -> Any:
    """The same network in torch, with the ONNX model's weights."""
    if isinstance(config, ConvLstmConfig):
        return torch_convlstm_model(torch, config, model)
    hidden, directions = config.hidden_size, config.directions
    weights = {init.name: onnx.numpy_helper.to_array(init).copy() for init in model.graph.initializer}

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(
                config.input_size,
                hidden,
                num_layers=config.layers,
                bidirectional=config.bidirectional,
                batch_first=config.demo,
            )
            self.head = torch.nn.Linear(directions * hidden, CLASSES)

        def forward(self, x: Any) -> Any:
            _, (h_n, _) = self.lstm(x)
            features = torch.cat([h_n[-2], h_n[-1]], dim=1) if config.bidirectional else h_n[-1]
            return self.head(features)

    net = Classifier()
    with torch.no_grad():
        for layer in range(config.layers):
            prefix = "lstm" if config.demo else f"lstm{layer}"
            w, r, b = (weights[f"{prefix}.{part}"] for part in ("W", "R", "B"))
            for d in range(directions):
                suffix = f"l{layer}" + ("_reverse" if d == 1 else "")
                getattr(net.lstm, f"weight_ih_{suffix}").copy_(torch.from_numpy(_torch_gates(w[d], hidden)))
                getattr(net.lstm, f"weight_hh_{suffix}").copy_(torch.from_numpy(_torch_gates(r[d], hidden)))
                getattr(net.lstm, f"bias_ih_{suffix}").copy_(torch.from_numpy(_torch_gates(b[d][: 4 * hidden], hidden)))
                getattr(net.lstm, f"bias_hh_{suffix}").copy_(torch.from_numpy(_torch_gates(b[d][4 * hidden :], hidden)))
        net.head.weight.copy_(torch.from_numpy(weights["head.weight"]))
        net.head.bias.copy_(torch.from_numpy(weights["head.bias"]))
    return net


def build_convlstm_model(config: ConvLstmConfig, seed: int = 0) -> onnx.ModelProto:
    """The ConvLSTM classifier as ONNX, as TorchScript exports it with a dynamic batch.

    Zero state (ConstantOfShape of [N, hidden, H, W]); per step ``t``: Gather(x, t, axis=1),
    Concat([x_t, h]) -> Conv(k x k, padding k // 2) -> [N, 4*hidden, H, W] -> Split into i, f, g, o;
    ``c = sigmoid(f) * c + sigmoid(i) * tanh(g)``, ``h = sigmoid(o) * tanh(c)``; then the mean of
    the last h over H, W -> Gemm -> ``logits [N, 10]``. Initialized as torch initializes Conv2d
    and Linear.
    """
    helper = onnx.helper
    rng = np.random.default_rng(seed)
    hidden, k = config.hidden_size, config.kernel
    fan_in = (config.channels + hidden) * k * k
    arrays = {
        "cell.weight": _uniform(rng, 1 / math.sqrt(fan_in), 4 * hidden, config.channels + hidden, k, k),
        "cell.bias": _uniform(rng, 1 / math.sqrt(fan_in), 4 * hidden),
        "head.weight": _uniform(rng, 1 / math.sqrt(hidden), CLASSES, hidden),
        "head.bias": _uniform(rng, 1 / math.sqrt(hidden), CLASSES),
        "state_dims": np.array([hidden, config.height, config.width], np.int64),
        "gate_sizes": np.full(4, hidden, np.int64),
    }
    arrays.update({f"t{t}": np.array(t, np.int64) for t in range(config.seq_length)})
    nodes = [
        helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "state_dims"], ["state_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["state_shape"], ["zeros"]),
    ]
    h = c = "zeros"
    for t in range(config.seq_length):
        gates = [f"{gate}{t}" for gate in "ifgo"]
        nodes += [
            helper.make_node("Gather", ["x", f"t{t}"], [f"x{t}"], axis=1),
            helper.make_node("Concat", [f"x{t}", h], [f"xh{t}"], axis=1),
            helper.make_node("Conv", [f"xh{t}", "cell.weight", "cell.bias"], [f"gates{t}"], pads=[k // 2] * 4),
            helper.make_node("Split", [f"gates{t}", "gate_sizes"], gates, axis=1),
            *(helper.make_node("Sigmoid", [f"{g}{t}"], [f"{g}s{t}"]) for g in "ifo"),
            helper.make_node("Tanh", [f"g{t}"], [f"gt{t}"]),
            helper.make_node("Mul", [f"fs{t}", c], [f"fc{t}"]),
            helper.make_node("Mul", [f"is{t}", f"gt{t}"], [f"ig{t}"]),
            helper.make_node("Add", [f"fc{t}", f"ig{t}"], [f"c{t}"]),
            helper.make_node("Tanh", [f"c{t}"], [f"ct{t}"]),
            helper.make_node("Mul", [f"os{t}", f"ct{t}"], [f"h{t}"]),
        ]
        h, c = f"h{t}", f"c{t}"
    nodes += [
        helper.make_node("ReduceMean", [h, "spatial_axes"], ["pooled"], keepdims=0),
        helper.make_node("Gemm", ["pooled", "head.weight", "head.bias"], ["logits"], transB=1),
    ]
    arrays["spatial_axes"] = np.array([2, 3], np.int64)
    float_type = onnx.TensorProto.FLOAT
    x_shape = ["N", config.seq_length, config.channels, config.height, config.width]
    graph = helper.make_graph(
        nodes,
        f"convlstm_{config.name}",
        [helper.make_tensor_value_info("x", float_type, x_shape)],
        [helper.make_tensor_value_info("logits", float_type, ["N", CLASSES])],
        [onnx.numpy_helper.from_array(value, name) for name, value in arrays.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def torch_convlstm_model(torch: ModuleType, config: ConvLstmConfig, model: onnx.ModelProto) -> Any:
    """The same ConvLSTM in torch (torch.split of the gates, a Python loop), with the ONNX model's weights."""
    weights = {init.name: onnx.numpy_helper.to_array(init).copy() for init in model.graph.initializer}
    hidden = config.hidden_size

    class ConvLstmClassifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = torch.nn.Conv2d(config.channels + hidden, 4 * hidden, config.kernel, padding=config.kernel // 2)
            self.head = torch.nn.Linear(hidden, CLASSES)

        def forward(self, x: Any) -> Any:
            h = x.new_zeros(x.shape[0], hidden, config.height, config.width)
            c = torch.zeros_like(h)
            for t in range(x.shape[1]):
                i, f, g, o = torch.split(self.cell(torch.cat([x[:, t], h], dim=1)), hidden, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
            return self.head(h.mean(dim=(2, 3)))

    net = ConvLstmClassifier()
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            parameter.copy_(torch.from_numpy(weights[name]))
    return net


# ---------------------------------------------------------------------------------------------
# Competitors: each offers step() -> the loss of the step (before its update)


class Unavailable(Exception):
    """A competitor cannot run here (not installed, or it failed to build)."""


class TrainerRunner:
    """ortlstm.training.Trainer: the train-step model in an InferenceSession, IOBinding buffers."""

    def __init__(
        self,
        config: Config,
        model: onnx.ModelProto,
        batch: tuple[np.ndarray, np.ndarray],
        threads: int,
        implementation: str = "ortlstm",
        fused_multiply_add: bool = True,
        nonfinite_check: bool = True,
        ortlstm_ops: bool = True,
        precision: str = "32-true",
    ) -> None:
        from ortlstm import training
        from ortlstm.graphs import losses, optimizers
        from ortlstm.graphs.autodiff import GraphEmitter
        from ortlstm.training import trainer as trainer_module

        optimizer = optimizers.AdamW(lr=LR, implementation=implementation, fused_multiply_add=fused_multiply_add)
        # Without the check, the Trainer builds its models as before the guard (it then looks at
        # the returned loss only, one np.isfinite of a scalar per step).
        build = functools.partial(trainer_module.build_training_models, nonfinite_check=nonfinite_check)
        # ortlstm_ops=False: every emitter the train step makes keeps the gradient rules to standard ops.
        emitter_init = functools.partialmethod(GraphEmitter.__init__, ortlstm_ops=ortlstm_ops)
        with (
            unittest.mock.patch.object(trainer_module, "build_training_models", build),
            unittest.mock.patch.object(GraphEmitter, "__init__", emitter_init),
        ):
            self.trainer = training.Trainer(
                model, loss=losses.Loss.cross_entropy(), optimizer=optimizer, threads=threads, precision=precision
            )
        self.x, self.y = batch

    def step(self) -> float:  # noqa: D102
        return float(self.trainer.step(self.x, target=self.y))


class ModuleRunner:
    """onnxruntime-training's Module + Optimizer over ortlstm's generate_artifacts."""

    def __init__(
        self,
        config: Config,
        model: onnx.ModelProto,
        batch: tuple[np.ndarray, np.ndarray],
        threads: int,
        directory: Path,
        **options: Any,
    ) -> None:
        try:
            artifacts_api = importlib.import_module("onnxruntime.training.artifacts")
        except ImportError as error:
            raise Unavailable("onnxruntime-training is not installed") from error
        from ortlstm import graphs

        self.artifacts = graphs.generate_artifacts(
            model,
            loss=artifacts_api.LossType.CrossEntropyLoss,
            optimizer=artifacts_api.OptimType.AdamW,
            artifact_directory=directory,
        )
        self.module, self.optimizer, self.state = graphs.open_training(
            self.artifacts, intra_op_num_threads=threads, **options
        )
        self.optimizer.set_learning_rate(LR)
        self.module.train()
        self.x, self.y = batch

    def step(self) -> float:  # noqa: D102
        loss = self.module(self.x, self.y)
        self.optimizer.step()
        self.module.lazy_reset_grad()
        return float(loss)


class TorchRunner:
    """The same network in PyTorch: zero_grad(set_to_none), forward, loss, backward, AdamW step."""

    def __init__(
        self,
        config: Config,
        model: onnx.ModelProto,
        batch: tuple[np.ndarray, np.ndarray],
        threads: int,
        autocast: bool = False,
    ) -> None:
        self.autocast = autocast
        try:
            self.torch = importlib.import_module("torch")
        except ImportError as error:
            raise Unavailable("torch is not installed") from error
        self.torch.set_num_threads(threads)
        self.net = torch_model(self.torch, config, model)
        self.optimizer = self.torch.optim.AdamW(self.net.parameters(), lr=LR)
        self.x = self.torch.from_numpy(batch[0])
        self.y = self.torch.from_numpy(batch[1])

    def step(self) -> float:  # noqa: D102
        self.optimizer.zero_grad(set_to_none=True)
        with self.torch.autocast("cpu", dtype=self.torch.bfloat16, enabled=self.autocast):
            loss = self.torch.nn.functional.cross_entropy(self.net(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        return float(loss.item())


def make_runner(name: str, config: Config, model: onnx.ModelProto, threads: int, directory: Path) -> Any:
    """Builds competitor ``name`` for ``config`` (raises Unavailable)."""
    batch = batch_of(config)
    try:
        if name == "trainer":
            return TrainerRunner(config, model, batch, threads)
        if name == "trainer-onnx":
            return TrainerRunner(config, model, batch, threads, implementation="onnx")
        if name == "trainer-onnx-nofma":
            return TrainerRunner(config, model, batch, threads, implementation="onnx", fused_multiply_add=False)
        if name == "trainer-noguard":
            return TrainerRunner(config, model, batch, threads, nonfinite_check=False)
        if name == "trainer-stdgrad":
            return TrainerRunner(config, model, batch, threads, ortlstm_ops=False)
        if name == "ortlstm-bf16":
            return TrainerRunner(config, model, batch, threads, precision="bf16-mixed")
        if name == "module":
            return ModuleRunner(config, model, batch, threads, directory / f"artifacts-{config.name}")
        return TorchRunner(config, model, batch, threads, autocast=name == "torch-autocast")
    except Unavailable:
        raise
    except Exception as error:
        raise Unavailable(f"{type(error).__name__}: {str(error).splitlines()[0][:200]}") from error


# ---------------------------------------------------------------------------------------------
# Interleaved rounds


@dataclasses.dataclass
class Timing:
    """Per-step times (s) of one competitor at one config."""

    iterations_per_round: int
    rounds: int = 0
    seconds: list[float] = dataclasses.field(default_factory=list)
    first_loss: float = math.nan

    def median_ms(self) -> float:
        """Median step time in ms."""
        return 1e3 * statistics.median(self.seconds)

    def best_ms(self) -> float:
        """Fastest step in ms."""
        return 1e3 * min(self.seconds)

    def spread(self) -> float:
        """Interquartile range relative to the median."""
        if len(self.seconds) < 4:
            return math.nan
        quartiles = statistics.quantiles(self.seconds, n=4)
        return (quartiles[2] - quartiles[0]) / statistics.median(self.seconds)


def time_steps(
    runners: dict[str, Any], repeats: int, min_round_seconds: float, max_seconds: float, log: Callable[[str], None]
) -> dict[str, Timing]:
    """Interleaved rounds (as bench_lstm.time_config): warm-up, rounds rotating the first competitor.

    Each competitor's first step (its loss is kept: the three must agree) and a second one are
    untimed warm-ups; the second sets the steps per round (a round lasts >= ``min_round_seconds``)
    and the rounds (at most ``repeats``, fewer, but at least 3, when they would exceed
    ``max_seconds``). Each round starts after a ``bench_lstm.SETTLE_SECONDS`` pause and, for steps under a
    second, one untimed step.
    """
    timings: dict[str, Timing] = {}
    rounds_of: dict[str, int] = {}
    for name, runner in runners.items():
        first_loss = runner.step()
        start = time.perf_counter()
        runner.step()
        seconds = time.perf_counter() - start
        iterations = max(1, math.ceil(min_round_seconds / max(seconds, 1e-9)))
        rounds_of[name] = min(repeats, max(3, int(max_seconds / (iterations * seconds))))
        timings[name] = Timing(iterations_per_round=iterations, first_loss=first_loss)
        if rounds_of[name] < repeats:
            log(f"    {name}: {seconds:.2f} s per step, limited to {rounds_of[name]} rounds")

    def run_round(name: str) -> None:
        timing = timings[name]
        if timing.seconds and statistics.median(timing.seconds) < 1.0:
            runners[name].step()
        for _ in range(timing.iterations_per_round):
            start = time.perf_counter()
            runners[name].step()
            timing.seconds.append(time.perf_counter() - start)
        timing.rounds += 1

    bench_lstm.run_interleaved_rounds(rounds_of, run_round)
    return timings


def paired_ratio(runners: dict[str, Any], pairs: int) -> float:
    """Median over ``pairs`` of (trainer step time / trainer-noguard step time), the two alternating.

    Steps one by one, the order flipped each pair: load that comes and goes on a shared machine
    hits both sides of a pair alike, where rounds of many steps each (``time_steps``) see it apart.
    """
    ratios = []
    for index in range(pairs):
        seconds = {}
        for name in ("trainer", "trainer-noguard")[:: 1 if index % 2 == 0 else -1]:
            start = time.perf_counter()
            runners[name].step()
            seconds[name] = time.perf_counter() - start
        ratios.append(seconds["trainer"] / seconds["trainer-noguard"])
    return statistics.median(ratios)


# ---------------------------------------------------------------------------------------------
# Where the time goes: onnxruntime profiles


@dataclasses.dataclass
class Profile:
    """One competitor's profiled train steps at one config: per-step values in ms.

    A step's LSTM and other kernel times are the node events inside its session runs (for the
    Module: its k-th train run and k-th optimizer run); medians over the profiled steps.
    """

    competitor: str
    config: str
    wall: list[float]  # perf_counter around the whole step (Python, feeds, every session run)
    run: list[float]  # onnxruntime's model_run events of the step
    nodes: list[float]  # every node's kernel time
    lstm: list[float]  # LSTMTraining + LSTMGrad kernel time
    by_op: dict[str, float]  # mean kernel ms per step, per op type
    unprofiled_ms: float | None = None  # the median of the timed rounds, for comparison

    @property
    def outside_share(self) -> float:
        """Median over the profiled steps of 1 - LSTM kernel time / step time: the target's measure."""
        return statistics.median(1 - lstm / wall for lstm, wall in zip(self.lstm, self.wall, strict=True))

    def median(self, field: str) -> float:
        """The median of a per-step field."""
        return statistics.median(getattr(self, field))


def _read_profile(paths: Sequence[Path], skip_runs: int) -> list[dict[str, float]]:
    """Per step (ms): "run" (model_run), "nodes" (all kernels) and each op type's kernel time.

    Each file is one session; its runs after the first ``skip_runs`` are matched by order across
    files (the Module's train and optimizer sessions each run once per step).
    """
    per_file: list[list[dict[str, float]]] = []
    for path in paths:
        events = json.loads(path.read_text())
        runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[skip_runs:]
        steps: list[dict[str, float]] = [collections.defaultdict(float) for _ in runs]
        starts = [run["ts"] for run in runs]
        for index, run in enumerate(runs):
            steps[index]["run"] += run["dur"] / 1e3
        for event in events:
            if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
                continue
            index = bisect.bisect_right(starts, event["ts"]) - 1
            if index < 0 or event["ts"] > runs[index]["ts"] + runs[index]["dur"]:
                continue
            op = event.get("args", {}).get("op_name", "?")
            steps[index][op] += event["dur"] / 1e3
            steps[index]["nodes"] += event["dur"] / 1e3
        per_file.append(steps)
    count = min(len(steps) for steps in per_file)
    result = []
    for index in range(count):
        total: dict[str, float] = collections.defaultdict(float)
        for steps in per_file:
            for key, value in steps[index].items():
                total[key] += value
        result.append(total)
    return result


def _profile(competitor: str, config: Config, walls: Sequence[float], steps: Sequence[dict[str, float]]) -> Profile:
    count = min(len(walls), len(steps))
    if count == 0:
        raise RuntimeError(f"{competitor} at {config.name}: the profile holds no steps")
    ops = sorted({key for step in steps for key in step} - {"run", "nodes"})
    return Profile(
        competitor,
        config.name,
        wall=[1e3 * wall for wall in walls[:count]],
        run=[step["run"] for step in steps[:count]],
        nodes=[step["nodes"] for step in steps[:count]],
        lstm=[sum(step.get(op, 0.0) for op in LSTM_OPS) for step in steps[:count]],
        by_op={op: statistics.fmean(step.get(op, 0.0) for step in steps[:count]) for op in ops},
    )


def profile_trainer(config: Config, model: onnx.ModelProto, threads: int, steps: int, directory: Path) -> Profile:
    """The Trainer's train step with ``SessionOptions.enable_profiling``: LSTM kernels vs the rest."""
    import onnxruntime as ort

    from ortlstm.ops import session_options

    runner = TrainerRunner(config, model, batch_of(config), threads)
    trainer = runner.trainer
    options = session_options(intra_op_num_threads=threads)
    options.enable_profiling = True
    options.profile_file_prefix = str(directory / f"trainer-{config.name}")
    # The benchmark swaps in a profiled session for the train step (the Trainer has no option for it).
    trainer._sessions["train_step"] = ort.InferenceSession(
        trainer._models["train_step"].SerializeToString(),
        options,
        providers=["CPUExecutionProvider"],
    )
    warmup = 2
    for _ in range(warmup):
        runner.step()
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        runner.step()
        walls.append(time.perf_counter() - start)
    path = Path(trainer._sessions["train_step"].end_profiling())
    return _profile("trainer", config, walls, _read_profile([path], skip_runs=warmup))


def profile_module(config: Config, model: onnx.ModelProto, threads: int, steps: int, directory: Path) -> Profile:
    """The Module + Optimizer step, both sessions profiled (files written when they are destroyed).

    A profile file is named by its prefix and the second its session was created, and the Module
    has no option of its own: the Module gets no eval session (it would write a file of the same
    name) and the Optimizer is created a second later.
    """
    from ortlstm import graphs
    from ortlstm.ops import session_options

    api = importlib.import_module("onnxruntime.training.api")
    artifacts_api = importlib.import_module("onnxruntime.training.artifacts")
    artifacts = graphs.generate_artifacts(
        model,
        loss=artifacts_api.LossType.CrossEntropyLoss,
        optimizer=artifacts_api.OptimType.AdamW,
        artifact_directory=directory / f"artifacts-profile-{config.name}",
    )
    prefix = directory / f"module-{config.name}"
    options = session_options(intra_op_num_threads=threads, enable_profiling=True, profile_file_prefix=str(prefix))
    state = api.CheckpointState.load_checkpoint(str(artifacts.checkpoint))
    module = api.Module(str(artifacts.training_model), state, None, session_options=options)
    time.sleep(1.1)
    optimizer = api.Optimizer(str(artifacts.optimizer_model), module)
    optimizer.set_learning_rate(LR)
    module.train()
    x, y = batch_of(config)
    warmup = 2
    walls = []
    for index in range(warmup + steps):
        start = time.perf_counter()
        float(module(x, y))
        optimizer.step()
        module.lazy_reset_grad()
        if index >= warmup:
            walls.append(time.perf_counter() - start)
    del module, optimizer, state
    gc.collect()
    paths = sorted(directory.glob(f"{prefix.name}*.json"))
    if len(paths) != 2:
        raise RuntimeError(f"expected the profiles of the train and optimizer sessions, found {paths}")
    return _profile("module", config, walls, _read_profile(paths, skip_runs=warmup))


# ---------------------------------------------------------------------------------------------
# Report


def _ms(value: float | None) -> str:
    return bench_lstm._ms(value)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


@dataclasses.dataclass
class Results:
    """What one run measured."""

    threads: int
    configs: list[Config]
    timings: dict[tuple[str, str], Timing | str]
    others: dict[str, float | None]
    load_before: dict[str, str]
    load_after: dict[str, str]
    profiles: list[Profile]
    environment: dict[str, str]
    cpu: dict[str, str]
    command: str
    started: datetime.datetime
    minutes: float
    guard_pairs: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)  # config -> (pairs, ratio)

    def median(self, competitor: str, config: str) -> float | None:
        """Median ms per step, or None."""
        timing = self.timings.get((competitor, config))
        return timing.median_ms() if isinstance(timing, Timing) else None


def render_markdown(results: Results) -> str:
    """The report: setup, times, ratios, targets, profiles."""
    lines = [
        f"Run: {results.started:%Y-%m-%d %H:%M} UTC, `{results.command}`, {results.minutes:.1f} min.",
        "",
        "Machine: " + "; ".join(f"{key} {value}" for key, value in results.cpu.items()) + ".",
        "",
    ]
    lines += [f"- {key}: {value}" for key, value in results.environment.items()]
    lines += [
        "- steps: AdamW (lr 1e-3), cross-entropy over 10 classes, the same batch every step; the Module's "
        "AdamW is onnxruntime-training's OptimType.AdamW (Hugging Face flavour, eps 1e-6, no weight decay), "
        "the Trainer's and torch's torch.optim.AdamW's defaults",
        "- load: /proc/loadavg (1, 5, 15 min) before and after each config, and the cores other processes "
        "used while it ran (/proc/stat less this process), in the ratios table",
        "",
        "### Time per training step (median, ms)",
        "",
        "best: the fastest step; IQR: interquartile range / median; first loss: the loss of each "
        "competitor's first step (same model, weights and batch: they must agree).",
        "",
    ]
    rows = []
    present = [name for name in COMPETITORS + EXTRA_COMPETITORS if any(key[0] == name for key in results.timings)]
    for config in results.configs:
        for competitor in present:
            timing = results.timings.get((competitor, config.name))
            if isinstance(timing, Timing):
                rows.append(
                    [
                        config.name,
                        config.describe(),
                        competitor,
                        _ms(timing.median_ms()),
                        _ms(timing.best_ms()),
                        f"{timing.rounds}x{timing.iterations_per_round}",
                        f"{100 * timing.spread():.0f}%",
                        f"{timing.first_loss:.6f}",
                    ]
                )
            else:
                rows.append([config.name, config.describe(), competitor, "n/a", "", "", "", str(timing or "")])
    lines += bench_lstm._table(
        ["config", "model (T, N, I, H)", "competitor", "ms/step", "best", "rounds x steps", "IQR", "first loss"],
        rows,
        align_left=3,
    )
    lines += ["", "### Ratios (below 1: the Trainer is faster)", ""]
    rows = []
    for config in results.configs:
        trainer = results.median("trainer", config.name)
        others = results.others.get(config.name)
        rows.append(
            [
                config.name,
                bench_lstm._number(_ratio(trainer, results.median("torch", config.name))),
                bench_lstm._number(_ratio(trainer, results.median("module", config.name))),
                bench_lstm._number(_ratio(results.median("module", config.name), results.median("torch", config.name))),
                f"{results.load_before.get(config.name, '?')} / {results.load_after.get(config.name, '?')}",
                "n/a" if others is None else f"{others:.2f}",
            ]
        )
    lines += bench_lstm._table(
        ["config", "trainer / torch", "trainer / module", "module / torch", "loadavg before / after", "others' cores"],
        rows,
    )
    lines += ["", "### Targets", ""]
    rows = []
    for config in results.configs:
        trainer = results.median("trainer", config.name)
        if config.name in LARGE:
            value = _ratio(trainer, results.median("torch", config.name))
            rows.append(_target_row(f"trainer / torch <= {TARGET_TORCH}", config.name, value, TARGET_TORCH))
        if _ran(results, "module"):  # --bf16 runs leave the Module out
            value = _ratio(trainer, results.median("module", config.name))
            rows.append(_target_row(f"trainer / module <= {TARGET_MODULE}", config.name, value, TARGET_MODULE))
        if config.name in BF16_CONFIGS and _ran(results, "ortlstm-bf16"):
            value = _ratio(results.median("ortlstm-bf16", config.name), results.median("torch-autocast", config.name))
            rows.append(
                _target_row(f"ortlstm-bf16 / torch-autocast <= {TARGET_AUTOCAST}", config.name, value, TARGET_AUTOCAST)
            )
    for profile in results.profiles:
        if profile.competitor == "trainer" and profile.config != CONVLSTM.name:  # no LSTM kernels there
            rows.append(
                _target_row(
                    f"outside the LSTM kernels <= {TARGET_OUTSIDE:.0%}",
                    profile.config,
                    profile.outside_share,
                    TARGET_OUTSIDE,
                    percent=True,
                )
            )
    lines += bench_lstm._table(["target", "config", "value", "met"], rows, align_left=2)
    lines += _bf16_lines(results)
    lines += _guard_lines(results)
    if results.profiles:
        lines += _profile_lines(results.profiles)
    return "\n".join(lines) + "\n"


def _ran(results: Results, competitor: str) -> bool:
    """Whether ``competitor`` was asked for (timed, or n/a with its reason) at some config."""
    return any(key[0] == competitor for key in results.timings)


def _bf16_lines(results: Results) -> list[str]:
    """bf16 mixed precision side by side (issue 33): each side's bf16 step against its float32 step and each other."""
    if not any(_ran(results, name) for name in BF16_COMPETITORS):
        return []
    rows = []
    for config in results.configs:
        trainer, bf16 = results.median("trainer", config.name), results.median("ortlstm-bf16", config.name)
        torch, autocast = results.median("torch", config.name), results.median("torch-autocast", config.name)
        rows.append(
            [
                config.name,
                *(_ms(value) for value in (trainer, bf16, torch, autocast)),
                bench_lstm._number(_ratio(bf16, autocast)),
                bench_lstm._number(_ratio(bf16, trainer)),
                bench_lstm._number(_ratio(autocast, torch)),
                bench_lstm._number(_ratio(trainer, autocast)),
            ]
        )
    return [
        "",
        "### bf16 mixed precision (medians, ms/step)",
        "",
        'ortlstm-bf16: the Trainer with precision="bf16-mixed" (bfloat16 GEMM operands, float32 accumulation, '
        "master weights and AdamW state); torch-autocast: torch's step with forward and loss under "
        'torch.autocast("cpu", dtype=torch.bfloat16), AdamW in float32. Below 1: the numerator is faster.',
        "",
        *bench_lstm._table(
            [
                "config",
                "trainer",
                "ortlstm-bf16",
                "torch",
                "torch-autocast",
                "ortlstm-bf16 / torch-autocast",
                "ortlstm-bf16 / trainer",
                "torch-autocast / torch",
                "trainer / torch-autocast",
            ],
            rows,
        ),
    ]


def _guard_lines(results: Results) -> list[str]:
    """The non-finite guard's cost: the Trainer with and without it (when trainer-noguard ran)."""
    if not any(key[0] == "trainer-noguard" for key in results.timings):
        return []
    rows = []
    for config in results.configs:
        guarded, unguarded = results.median("trainer", config.name), results.median("trainer-noguard", config.name)
        change = _ratio(guarded, unguarded)
        pairs, paired = results.guard_pairs.get(config.name, (0, None))
        rows.append(
            [
                config.name,
                _ms(unguarded),
                _ms(guarded),
                "n/a" if change is None else f"{100 * (change - 1):+.1f}%",
                "" if paired is None else f"{100 * (paired - 1):+.2f}% ({pairs} pairs)",
            ]
        )
    return [
        "",
        "### The non-finite guard (medians, ms/step)",
        "",
        "without: the train step as before the guard (trainer-noguard); with: the default Trainer, whose "
        "train step also outputs all_finite (loss and gradients' sum of squares) and skips the buffer swap "
        "when it is false; paired (--guard-pairs): the median of with / without over steps alternating one by one.",
        "",
        *bench_lstm._table(["config", "without", "with", "change", "paired"], rows),
    ]


def _target_row(target: str, config: str, value: float | None, bound: float, percent: bool = False) -> list[str]:
    if value is None:
        return [target, config, "n/a", "n/a"]
    text = f"{100 * value:.1f}%" if percent else f"{value:.2f}"
    return [target, config, text, "yes" if value <= bound else "**no**"]


def _profile_lines(profiles: Sequence[Profile]) -> list[str]:
    lines = [
        "",
        "### Where the time goes (onnxruntime profile, ms per step, medians over the profiled steps)",
        "",
        "step: perf_counter around the whole step with profiling on (Python, feeds, every session run); "
        "unprofiled: the median of the timed rounds above; ORT runs: onnxruntime's model_run events; "
        "kernels: every node's kernel time; LSTM: LSTMTraining + LSTMGrad; outside LSTM: "
        "1 - LSTM / step per profiled step (the target's measure); step - runs: Python and feeds; "
        "runs - kernels: onnxruntime between kernels; then the largest other kernels (mean ms per step).",
        "",
    ]
    rows = []
    for profile in profiles:
        others = sorted(((op, ms) for op, ms in profile.by_op.items() if op not in LSTM_OPS), key=lambda item: -item[1])
        rows.append(
            [
                profile.config,
                profile.competitor,
                _ms(profile.median("wall")),
                _ms(profile.unprofiled_ms),
                _ms(profile.median("run")),
                _ms(profile.median("nodes")),
                _ms(profile.median("lstm")),
                f"{100 * profile.outside_share:.1f}%",
                _ms(statistics.median(w - r for w, r in zip(profile.wall, profile.run, strict=True))),
                _ms(statistics.median(r - n for r, n in zip(profile.run, profile.nodes, strict=True))),
                ", ".join(f"{op} {ms:.2f}" for op, ms in others[:6]),
            ]
        )
    lines += bench_lstm._table(
        [
            "config",
            "competitor",
            "step",
            "unprofiled",
            "ORT runs",
            "kernels",
            "LSTM",
            "outside LSTM",
            "step - runs",
            "runs - kernels",
            "largest other kernels",
        ],
        rows,
        align_left=2,
    )
    return lines


def _markers(section: str) -> tuple[str, str]:
    return (
        f"<!-- BEGIN bench_training.py output [{section}]: rewritten by each run, edit outside the markers -->",
        f"<!-- END bench_training.py output [{section}] -->",
    )


def write_markdown(path: Path, body: str, section: str) -> None:
    """Writes ``body`` between the markers of ``section`` (appended at the end if missing)."""
    begin, end = _markers(section)
    # Under docs/benchmarks.md's "## Training step": the report's "###" headings go one level down.
    body = ("\n" + body.strip()).replace("\n### ", "\n#### ").strip()
    block = f"{begin}\n\n### Results: training step, {section}\n\n{body}\n\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


# ---------------------------------------------------------------------------------------------
# Main


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--threads", type=int, default=2, help="threads for ORT, BLAS and torch (default 2)")
    parser.add_argument(
        "--configs",
        default=",".join(name for name in CONFIGS if name not in BF16_CONFIGS),
        help=f"comma-separated, from {', '.join(CONFIGS)} (default: all but {', '.join(BF16_CONFIGS)}: see --bf16)",
    )
    parser.add_argument(
        "--competitors",
        default=",".join(COMPETITORS),
        help=f"subset of {','.join(COMPETITORS)}, with any of {','.join(EXTRA_COMPETITORS)}",
    )
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds per config (default 9)")
    parser.add_argument(
        "--max-seconds", type=float, default=20.0, help="a competitor's rounds at a config take about this long at most"
    )
    parser.add_argument("--min-round-seconds", type=float, default=0.3, help="steps per round: at least this long")
    parser.add_argument(
        "--profile", action="store_true", help=f"profile the train step at {', '.join(PROFILE_CONFIGS)}"
    )
    parser.add_argument(
        "--profile-configs", default=",".join(PROFILE_CONFIGS), help="configs --profile profiles (default M-1,M-2bi)"
    )
    parser.add_argument("--profile-steps", type=int, default=9, help="profiled steps (after 2 warm-up steps)")
    parser.add_argument("--quick", action="store_true", help="smoke run: demo and M-1, 3 rounds, profile M-1")
    parser.add_argument(
        "--bf16",
        action="store_true",
        help=f"issue 33's comparison: configs {','.join(BF16_CONFIGS)} (unless --configs is given), competitors "
        "trainer,ortlstm-bf16,torch,torch-autocast (unless --competitors is given)",
    )
    parser.add_argument("--wait-idle", type=float, default=0.0, help="first wait up to S seconds for an idle machine")
    parser.add_argument("--markdown", type=Path, help="write the report into this file, between its section's markers")
    parser.add_argument("--markdown-section", default=None, help="section name (default: threads-N)")
    parser.add_argument("--json", type=Path, help="write every step time and profile here")
    parser.add_argument(
        "--guard-pairs",
        type=int,
        default=0,
        help="with trainer and trainer-noguard: also time N steps of each alternating one by one (the guard's "
        "cost; fewer where they would take over --max-seconds, at least 5)",
    )
    args = parser.parse_args(argv)
    if args.bf16:
        given = set(sys.argv[1:] if argv is None else argv)
        if not any(option.split("=")[0] == "--configs" for option in given):
            args.configs = ",".join(BF16_CONFIGS)
        if not any(option.split("=")[0] == "--competitors" for option in given):
            args.competitors = "trainer,ortlstm-bf16,torch,torch-autocast"
    if args.quick:
        args.configs, args.repeats, args.max_seconds = "demo,M-1", 3, 5.0
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark and prints (and optionally writes) the report."""
    args = _parse_args(argv)
    bench_lstm._fix_thread_env(args.threads)
    started = datetime.datetime.now(datetime.timezone.utc)
    clock = time.monotonic()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    unknown_configs = [name for name in args.configs.split(",") if name and name not in CONFIGS]
    if unknown_configs:  # the two bf16 configs are new: an older name list would otherwise end in a KeyError
        raise SystemExit(f"unknown configs {unknown_configs}; choose from {', '.join(CONFIGS)}")
    configs = [CONFIGS[name] for name in args.configs.split(",") if name]
    competitors = [name for name in args.competitors.split(",") if name]
    unknown = [name for name in competitors if name not in COMPETITORS + EXTRA_COMPETITORS]
    if unknown:
        raise SystemExit(f"unknown competitors {unknown}; choose from {', '.join(COMPETITORS + EXTRA_COMPETITORS)}")
    monitor = bench_lstm.CpuMonitor()
    if args.wait_idle > 0:
        bench_lstm.wait_until_idle(monitor, args.wait_idle, log)
    timings: dict[tuple[str, str], Timing | str] = {}
    others: dict[str, float | None] = {}
    load_before: dict[str, str] = {}
    load_after: dict[str, str] = {}
    profiles: list[Profile] = []
    guard_pairs: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_training-") as scratch:
        directory = Path(scratch)
        for config in configs:
            log(f"{config.name}: {config.describe()}")
            model = build_model(config)
            runners: dict[str, Any] = {}
            for name in competitors:
                try:
                    runners[name] = make_runner(name, config, model, args.threads, directory)
                except Unavailable as error:
                    timings[(name, config.name)] = str(error)
                    log(f"    {name}: n/a ({error})")
            load_before[config.name] = _load_average()
            mark = monitor.mark()
            timings.update(
                {
                    (name, config.name): timing
                    for name, timing in time_steps(
                        runners, args.repeats, args.min_round_seconds, args.max_seconds, log
                    ).items()
                }
            )
            others[config.name] = monitor.others_since(mark)
            load_after[config.name] = _load_average()
            first_losses = {name: timings[(name, config.name)].first_loss for name in runners}  # type: ignore[union-attr]
            losses = {name: loss for name, loss in first_losses.items() if name not in BF16_COMPETITORS}
            if losses and max(losses.values()) - min(losses.values()) > 1e-4 * max(abs(v) for v in losses.values()):
                log(f"    WARNING: the first losses differ: {losses}")
            _check_bf16_losses(first_losses, log)
            log(
                "    "
                + ", ".join(
                    f"{name} {timings[(name, config.name)].median_ms():.2f} ms"  # type: ignore[union-attr]
                    for name in runners
                )
                + f"; loadavg {load_after[config.name]}"
            )
            if args.guard_pairs and {"trainer", "trainer-noguard"} <= runners.keys():
                step_ms = timings[("trainer", config.name)].median_ms()  # type: ignore[union-attr]
                pairs = min(args.guard_pairs, max(5, int(1e3 * args.max_seconds / (2 * step_ms))))
                guard_pairs[config.name] = (pairs, paired_ratio(runners, pairs))
                log(f"    guard: with / without, median of {pairs} pairs {guard_pairs[config.name][1]:.4f}")
            del runners
            gc.collect()
            wanted = ("M-1",) if args.quick else tuple(args.profile_configs.split(","))
            if (args.profile or args.quick) and config.name in wanted:
                log(f"    profiling {config.name}")
                for name, profiler in (("trainer", profile_trainer), ("module", profile_module)):
                    if name not in competitors or not isinstance(timings.get((name, config.name)), Timing):
                        continue
                    profile = profiler(config, model, args.threads, args.profile_steps, directory)
                    profile.unprofiled_ms = timings[(name, config.name)].median_ms()  # type: ignore[union-attr]
                    profiles.append(profile)
                    log(
                        f"    {name}: step {profile.median('wall'):.2f} ms, LSTM kernels "
                        f"{profile.median('lstm'):.2f} ms, outside them {100 * profile.outside_share:.1f}%"
                    )
                gc.collect()
    environment = bench_lstm.environment_description(args.threads, [])
    environment.pop("GEMM rate", None)
    ort = importlib.import_module("onnxruntime")
    environment["onnxruntime"] = (
        f"{ort.__version__} (the Trainer runs in the same onnxruntime; "
        f"onnxruntime-training {_distribution_version('onnxruntime-training-cpu', 'onnxruntime-training')})"
    )
    environment["threads"] += f"; MKL_NUM_THREADS={os.environ.get('MKL_NUM_THREADS')}"
    results = Results(
        threads=args.threads,
        configs=configs,
        timings=timings,
        others=others,
        load_before=load_before,
        load_after=load_after,
        profiles=profiles,
        environment=environment,
        cpu=_cpu(),
        command="python benchmarks/bench_training.py " + " ".join(sys.argv[1:]),
        started=started,
        minutes=(time.monotonic() - clock) / 60,
        guard_pairs=guard_pairs,
    )
    report = render_markdown(results)
    print(report)
    if args.markdown is not None:
        write_markdown(args.markdown, report, args.markdown_section or f"threads-{args.threads}")
    if args.json is not None:
        args.json.write_text(json.dumps(_json_payload(results), indent=1))


def _check_bf16_losses(first_losses: dict[str, float], log: Callable[[str], None]) -> None:
    """Warns where a bf16 competitor's first loss is not its float32 twin's within 1% (issue 33's loss bound).

    The same model, weights and batch: the two differ by bfloat16 rounding only (~0.01% here).
    """
    for name, reference in (("ortlstm-bf16", "trainer"), ("torch-autocast", "torch")):
        if name in first_losses and reference in first_losses:
            bf16, float32 = first_losses[name], first_losses[reference]
            if not abs(bf16 - float32) <= 0.01 * abs(float32):
                log(f"    WARNING: {name}'s first loss {bf16:.6f} is not within 1% of {reference}'s {float32:.6f}")


def _cpu() -> dict[str, str]:
    """bench_lstm's CPU description, with every AVX/AMX flag /proc/cpuinfo lists."""
    info = bench_lstm._cpu_description()
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
        flags = next((line.split(":", 1)[1].split() for line in first.splitlines() if line.startswith("flags")), [])
        simd = sorted(flag for flag in flags if flag.startswith(("avx", "amx", "fma", "sse4")))
        info["SIMD"] = " ".join(simd) or info.get("SIMD", "none listed")
    except OSError:
        pass
    info["platform"] = platform.machine()
    return info


def _distribution_version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def _json_payload(results: Results) -> dict[str, Any]:
    return {
        "threads": results.threads,
        "started": results.started.isoformat(),
        "environment": results.environment,
        "cpu": results.cpu,
        "timings": {
            f"{competitor}/{config}": (
                dataclasses.asdict(timing) if isinstance(timing, Timing) else {"unavailable": timing}
            )
            for (competitor, config), timing in results.timings.items()
        },
        "others_cores": results.others,
        "loadavg_before": results.load_before,
        "loadavg_after": results.load_after,
        "profiles": [dataclasses.asdict(profile) for profile in results.profiles],
        "guard_pairs": results.guard_pairs,
        "library_sha256": _library_hash(),
    }


def _library_hash() -> str:
    try:
        import ortlstm.ops

        return hashlib.sha256(Path(ortlstm.ops.library_path()).read_bytes()).hexdigest()
    except (ImportError, OSError):
        return "unknown"


if __name__ == "__main__":
    main()
