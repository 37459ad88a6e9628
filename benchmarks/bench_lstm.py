"""Times ortlstm's LSTMTraining / LSTMGrad, com.microsoft's ops, torch's nn.LSTM and the GEMM limit.

Every competitor runs forward and backward at the same shapes; repetitions are interleaved
(round-robin over competitors, the starting competitor rotating each round) so that drift in clock
speed or background load hits all of them alike. Medians and ratios are printed; ``--markdown``
writes them as the tables of docs/benchmarks.md. The peak extra memory of each backward is measured
in a fresh subprocess per (competitor, config). Competitors that are not installed, or that do not
support a config, are reported as ``n/a``. See benchmarks/README.md for the method and the columns.

This script only measures; it never builds or changes the kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import gc
import hashlib
import importlib
import importlib.metadata
import json
import math
import mmap
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx.helper
from bench_cells import CELLS, Cell, cell_inputs

import ortlstm.ops

if TYPE_CHECKING:
    import onnxruntime

# ---------------------------------------------------------------------------------------------
# Configurations and FLOP counts


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One benchmark shape: ONNX LSTM dims, direction and float type, and the cell (``--cells``; bench_cells.py)."""

    name: str
    seq_length: int
    batch_size: int
    input_size: int
    hidden_size: int
    direction: str = "forward"
    dtype: str = "float32"
    cell: str = "lstm"

    @property
    def gates(self) -> int:
        """Gate blocks per hidden unit: 4 (LSTM), 3 (GRU), 1 (RNN); the GEMMs' N is gates*hidden_size."""
        return CELLS[self.cell].gates

    @property
    def num_directions(self) -> int:
        """2 for bidirectional, else 1."""
        return 2 if self.direction == "bidirectional" else 1

    @property
    def forward_flops(self) -> float:
        """GEMM FLOPs of the forward: X·Wᵀ and H_{t-1}·Rᵀ over all steps, per direction."""
        gate_rows = self.seq_length * self.batch_size * self.gates * self.hidden_size
        return 2.0 * gate_rows * (self.input_size + self.hidden_size) * self.num_directions

    @property
    def backward_flops(self) -> float:
        """GEMM FLOPs of the backward: dX and dW (K or N = input_size), dH_{t-1} and dR (hidden_size)."""
        gate_rows = self.seq_length * self.batch_size * self.gates * self.hidden_size
        return 2.0 * gate_rows * (2 * self.input_size + 2 * self.hidden_size) * self.num_directions

    def describe(self) -> str:
        """``(T, N, I, H)`` plus direction and dtype when they are not the defaults."""
        text = f"({self.seq_length}, {self.batch_size}, {self.input_size}, {self.hidden_size})"
        if self.direction != "forward":
            text += f" {self.direction}"
        if self.dtype != "float32":
            text += f" {self.dtype}"
        return text


CONFIGS: dict[str, BenchConfig] = {
    config.name: config
    for config in (
        BenchConfig("S", 16, 8, 64, 64),
        BenchConfig("M", 64, 32, 256, 256),
        BenchConfig("L", 128, 64, 512, 512),
        BenchConfig("B1", 256, 1, 128, 128),
        BenchConfig("M-bidir", 64, 32, 256, 256, direction="bidirectional"),
        BenchConfig("M-f64", 64, 32, 256, 256, dtype="float64"),
    )
}
"""The issue's configs (T, N, I, H) plus a bidirectional and a float64 one."""


def cell_config(config: BenchConfig, cell: str) -> BenchConfig:
    """``config`` for ``cell``: the LSTM's as it is, the others named ``<cell>-<name>`` (``gru-M``) in the report."""
    return config if cell == "lstm" else dataclasses.replace(config, name=f"{cell}-{config.name}", cell=cell)


def config_by_name(name: str) -> BenchConfig:
    """The config of a report name (``M``, ``gru-M``, ``rnn-B1``), as the memory probes get it."""
    cell, _, base = name.partition("-") if name.split("-", 1)[0] in CELLS else ("lstm", "", name)
    return cell_config(CONFIGS[base], cell)


QUICK_CONFIGS = ("S", "M", "B1", "M-bidir", "M-f64")
COMPETITORS = ("ortlstm", "ortlstm-bf16", "com.microsoft", "torch", "torch-autocast")
LIMIT = "GEMM limit"
SEPARATE = "ORT sessions per op"

# Targets from the issue; all compare fwd+bwd medians.
TARGET_TORCH_RATIO = 0.9  # ortlstm fwd+bwd / torch fwd(grad)+bwd, every config
TARGET_LIMIT_RATIO = 1.2  # ortlstm fwd+bwd / GEMM limit, at M and L (issue 15; the earlier speed issue had 1.25)
TARGET_LIMIT_CONFIGS = ("M", "L")
TARGET_MICROSOFT_SPEEDUP = 20.0  # com.microsoft fwd+bwd / ortlstm fwd+bwd, at M and L
TARGET_MICROSOFT_CONFIGS = ("M", "L")
# GRU and RNN (issue 32 item 7, ``--cells``): the torch ratio at every config, and against
# com.microsoft's GRUTraining + GRUGrad at every config they run.
TARGET_CELL_MICROSOFT_SPEEDUP = 5.0

MIB = 1024.0 * 1024.0
MEMORY_RESOLUTION_MIB = 1.0  # below this, peak-memory differences are noise (page-granular, allocator)
BUSY_CORES = 0.1  # other processes' average load (cores) above which a report warns

# ---------------------------------------------------------------------------------------------
# Threads: one count for BLAS, OpenMP and onnxruntime, fixed before any of them loads

_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_REEXEC_MARK = "ORTLSTM_BENCH_THREADS_SET"


def _fix_thread_env(threads: int) -> None:
    """Sets the thread variables and re-executes the script once if they were not already set.

    OpenBLAS and OpenMP read them when their library loads, and numpy (with its own OpenBLAS) is
    already loaded when the arguments are parsed; re-executing is the only way to be sure every
    library, in this process and in the memory subprocesses, starts with the same count.
    """
    wanted = str(threads)
    if all(os.environ.get(name) == wanted for name in _THREAD_ENV):
        return
    if os.environ.get(_REEXEC_MARK) == wanted:
        raise RuntimeError("thread environment variables did not survive re-execution")
    for name in _THREAD_ENV:
        os.environ[name] = wanted
    os.environ[_REEXEC_MARK] = wanted
    os.execv(sys.executable, [sys.executable, *sys.argv])


# ---------------------------------------------------------------------------------------------
# Optional imports


def _optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# ---------------------------------------------------------------------------------------------
# GEMM rate: the best any BLAS in this process reaches

_CBLAS_ROW_MAJOR = 101
_CBLAS_NO_TRANS = 111


class GemmSource:
    """One way to run C[m, n] = A[m, k] · B[k, n] with ``threads`` threads; ``name`` says which."""

    name = ""
    operands = "native"
    """The precision the GEMM multiplies in: "native" (the arrays' dtype) or "bfloat16" (operands
    rounded first). Only native GEMMs set a float32 or float64 limit; a bf16 GEMM's rate is not one."""

    def prepare(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:
        """Returns a call that computes c = a · b."""
        raise NotImplementedError


class TorchGemm(GemmSource):
    """torch.mm: PyTorch's CPU BLAS (oneMKL in the x86-64 wheels), ``torch.set_num_threads``."""

    def __init__(self, torch: ModuleType, threads: int) -> None:
        self._torch = torch
        torch.set_num_threads(threads)
        self.name = f"torch.mm (torch {torch.__version__}), {threads} threads"

    def prepare(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:  # noqa: D102
        ta, tb, tc = (self._torch.from_numpy(x) for x in (a, b, c))

        def run() -> None:
            self._torch.mm(ta, tb, out=tc)

        return run


class OpenBlasGemm(GemmSource):
    """scipy_cblas_{s,d}gemm of scipy-openblas32 (the BLAS of builds off x86-64), via ctypes.

    The thread count the process had (libortlstm_ops.so, when built against it, sets its own when
    it loads) is restored after each call sequence.
    """

    def __init__(self, module: ModuleType, threads: int) -> None:
        self.threads = threads
        # The same shared object such a kernel library resolves (scipy_openblas32 loads it globally).
        path = Path(module.get_lib_dir()) / f"lib{module.get_library()}.so"
        self._lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        self._lib.scipy_openblas_get_num_threads.restype = ctypes.c_int
        self._lib.scipy_openblas_get_config.restype = ctypes.c_char_p
        self._lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
        config = self._lib.scipy_openblas_get_config().decode()
        core = self._lib.scipy_openblas_get_corename().decode()
        self.name = f"scipy-openblas32 scipy_cblas_*gemm, {threads} threads ({config}, core {core})"

    def prepare(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:  # noqa: D102
        is_float = a.dtype == np.float32
        gemm = self._lib.scipy_cblas_sgemm if is_float else self._lib.scipy_cblas_dgemm
        scalar = ctypes.c_float if is_float else ctypes.c_double
        (m, k), n = a.shape, b.shape[1]
        args = (
            _CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS, _CBLAS_NO_TRANS, m, n, k, scalar(1.0),
            a.ctypes.data_as(ctypes.c_void_p), k, b.ctypes.data_as(ctypes.c_void_p), n,
            scalar(0.0), c.ctypes.data_as(ctypes.c_void_p), n,
        )  # fmt: skip

        def run() -> None:
            previous = self._lib.scipy_openblas_get_num_threads()
            self._lib.scipy_openblas_set_num_threads(ctypes.c_int(self.threads))
            try:
                gemm(*args)
            finally:
                self._lib.scipy_openblas_set_num_threads(ctypes.c_int(previous))

        return run


class NumpyGemm(GemmSource):
    """numpy.matmul: numpy's own BLAS (OpenBLAS in its wheels), threads from the environment."""

    def __init__(self, threads: int) -> None:
        self.name = f"numpy.matmul (numpy {np.__version__}), OPENBLAS_NUM_THREADS={threads}"

    def prepare(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:  # noqa: D102
        def run() -> None:
            np.matmul(a, b, out=c)

        return run


def gemm_sources(threads: int) -> list[GemmSource]:
    """Every BLAS this process can call from Python.

    libortlstm_ops.so's own BLAS (oneMKL on x86-64) is linked in with hidden symbols and cannot be
    called from here; PyTorch's wheels carry oneMKL too.
    """
    sources: list[GemmSource] = []
    torch = _optional_module("torch")
    if torch is not None:
        sources.append(TorchGemm(torch, threads))
    openblas = _optional_module("scipy_openblas32")
    if openblas is not None:
        sources.append(OpenBlasGemm(openblas, threads))
    sources.append(NumpyGemm(threads))
    return sources


class OrtlstmBf16Gemm(GemmSource):
    """The kernel library's bf16 GEMM (issue 33, kernels_cpp/common/bf16_gemm.h) on operands already in bfloat16.

    Through the library's ctypes probe ``OrtLstmGemmBf16``, one thread as a kernel task calls it:
    the bf16 GEMM limit. Absent from libraries built before the probe (then not listed).
    """

    def __init__(self) -> None:
        backend = ortlstm.ops.bf16_gemm_backend()
        self._lib = ctypes.CDLL(ortlstm.ops.library_path())
        self._gemm = self._lib.OrtLstmGemmBf16  # AttributeError on an older library
        i64, p = ctypes.c_int64, ctypes.c_void_p
        self._gemm.argtypes = [ctypes.c_int] * 3 + [i64] * 3 + [ctypes.c_float, p, i64, p, i64, ctypes.c_float, p, i64]
        self._round = self._lib.OrtLstmRoundToBfloat16
        self._round.argtypes = [p, p, i64]
        self.name = f"ortlstm bf16 GEMM ({backend} backend), 1 thread"
        self.operands = "bfloat16"

    def prepare(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:  # noqa: D102
        a16, b16 = np.empty(a.shape, np.uint16), np.empty(b.shape, np.uint16)
        self._round(a.ctypes.data, a16.ctypes.data, a.size)
        self._round(b.ctypes.data, b16.ctypes.data, b.size)
        (m, k), n = a.shape, b.shape[1]
        args = (1, 0, 0, m, n, k, 1.0, a16.ctypes.data, k, b16.ctypes.data, n, 0.0, c.ctypes.data, n)

        def run() -> None:
            self._gemm(*args)

        run.keep = (a16, b16, c)  # type: ignore[attr-defined]  # C too: run writes into it after prepare returns
        return run


class TorchBf16Gemm(GemmSource):
    """torch.mm on bfloat16 tensors (oneDNN), ``torch.set_num_threads``."""

    def __init__(self, torch: ModuleType, threads: int) -> None:
        self._torch = torch
        self.name = f"torch.mm bfloat16 (torch {torch.__version__}), {threads} threads"
        self.operands = "bfloat16"

    def prepare(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:  # noqa: D102
        ta, tb = (self._torch.from_numpy(x).bfloat16() for x in (a, b))
        tc = self._torch.empty(c.shape, dtype=self._torch.bfloat16)

        def run() -> None:
            self._torch.mm(ta, tb, out=tc)

        return run


def bf16_gemm_sources(threads: int) -> list[GemmSource]:
    """The bf16 GEMMs this process can call: ortlstm's (when its library has the probe) and torch's."""
    sources: list[GemmSource] = []
    with contextlib.suppress(AttributeError, OSError, ValueError):  # a library without the probe, or none
        sources.append(OrtlstmBf16Gemm())
    torch = _optional_module("torch")
    if torch is not None:
        sources.append(TorchBf16Gemm(torch, threads))
    return sources


def prepare_gemm(source: GemmSource, m: int, n: int, k: int, dtype: str) -> Callable[[], None]:
    """C[m, n] = A[m, k] · B[k, n], row-major, no transposes, on random operands; run once."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = np.zeros((m, n), dtype=dtype)
    run = source.prepare(a, b, c)
    run()
    return run


def gemm_seconds(source: GemmSource, m: int, n: int, k: int, dtype: str, repeats: int) -> float:
    """Median seconds of C[m, n] = A[m, k] · B[k, n], row-major, no transposes."""
    run = prepare_gemm(source, m, n, k, dtype)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclasses.dataclass(frozen=True)
class GemmCandidate:
    """One (BLAS, shape, dtype) whose rate may set the limit."""

    source: GemmSource
    m: int
    n: int
    k: int
    dtype: str

    @property
    def flops(self) -> float:
        """2·m·n·k."""
        return 2.0 * self.m * self.n * self.k

    @property
    def blas(self) -> str:
        """The source's name up to its first comma (the thread setting follows it)."""
        return self.source.name.split(",")[0]

    @property
    def shape(self) -> str:
        """``M x N x K``."""
        return f"{self.m} x {self.n} x {self.k}"

    @property
    def label(self) -> str:
        """``BLAS, M x N x K``: the phase name under which the limit's runner times it."""
        return f"{self.blas}, {self.shape}"


LIMIT_CANDIDATES = 3
"""How many of the fastest GEMMs of the survey are timed again in every config's rounds."""


def measure_gemm_rates(
    sources: Sequence[GemmSource],
    configs: Sequence[BenchConfig],
    quick: bool,
    bf16_sources: Sequence[GemmSource] = (),
) -> tuple[dict[str, list[GemmCandidate]], list[tuple[str, str, str, float]]]:
    """The survey at the start of the run: per dtype, the fastest GEMMs, and every measurement.

    Every source runs every shape: square products (the best case) and each config's input
    projection (seq_length·batch_size) x gates·hidden_size x input_size. Returns, per dtype, the
    ``LIMIT_CANDIDATES`` fastest (source, shape) pairs, fastest first, which the limit's runner
    times again inside each config's rounds; and every measurement as (dtype, shape, source name,
    GFLOP/s). ``bf16_sources`` (float32 operands rounded to bfloat16 before timing) add rows of dtype
    bfloat16 at the float32 configs' shapes: the bf16 GEMM limit of issue 33, never a float32 candidate.
    """
    rows: list[tuple[str, str, str, float]] = []
    candidates: dict[str, list[GemmCandidate]] = {}
    # A bf16 GEMM listed among ``sources`` is moved to the bf16 rows: it never sets a float32 limit.
    bf16_sources = [*bf16_sources, *(source for source in sources if source.operands != "native")]
    sources = [source for source in sources if source.operands == "native"]
    for dtype in sorted({config.dtype for config in configs}):
        squares = (1024, 2048) if quick else (1024, 2048, 3072)
        shapes = [(size, size, size) for size in squares]
        shapes += [
            (c.seq_length * c.batch_size, c.gates * c.hidden_size, c.input_size) for c in configs if c.dtype == dtype
        ]
        rated: list[tuple[float, GemmCandidate]] = []
        for source in sources:
            for m, n, k in dict.fromkeys(shapes):
                candidate = GemmCandidate(source, m, n, k, dtype)
                rate = candidate.flops / gemm_seconds(source, m, n, k, dtype, repeats=3 if quick else 5)
                rows.append((dtype, candidate.shape, source.name, rate / 1e9))
                rated.append((rate, candidate))
        rated.sort(key=lambda pair: -pair[0])
        candidates[dtype] = [candidate for _, candidate in rated[:LIMIT_CANDIDATES]]
        for source in bf16_sources if dtype == "float32" else ():
            for m, n, k in dict.fromkeys(shapes):
                seconds = gemm_seconds(source, m, n, k, dtype, repeats=3 if quick else 5)
                rows.append(("bfloat16", f"{m} x {n} x {k}", source.name, 2.0 * m * n * k / seconds / 1e9))
    return candidates, rows


# ---------------------------------------------------------------------------------------------
# Inputs


def _lstm_inputs(config: BenchConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Forward inputs of ``config``'s cell in the ONNX layout (layout=0), weights scaled like torch's init."""
    return cell_inputs(config, CELLS[config.cell], seed)


def _upstream_gradients(config: BenchConfig, seed: int = 1) -> dict[str, np.ndarray]:
    """grad_HAll [seq_length, num_directions, batch_size, hidden_size] and grad_Ht."""
    rng = np.random.default_rng(seed)
    t, n, h, d = config.seq_length, config.batch_size, config.hidden_size, config.num_directions
    return {
        "grad_HAll": rng.standard_normal((t, d, n, h)).astype(config.dtype),
        "grad_Ht": rng.standard_normal((d, n, h)).astype(config.dtype),
    }


# ---------------------------------------------------------------------------------------------
# Competitors: each times its forward and backward calls one by one


class Unavailable(Exception):
    """A competitor that is not installed or does not support a config; the message says why."""


Phases = dict[str, list[float]]
"""Phase name ("fwd", "bwd", "fwd_nograd") -> seconds of each call."""


class Runner:
    """One competitor at one config: ``iteration()`` runs one forward and one backward."""

    name: str
    warm_up_each_round = True
    """Whether rounds start with an untimed iteration when iterations are short (time_config)."""

    def iteration(self, phases: Phases) -> None:
        """Runs forward then backward once, appending each call's seconds to ``phases``."""
        raise NotImplementedError

    def run_backward_once(self) -> int:
        """Runs the backward once (untimed) and returns the bytes of gradients it allocated."""
        raise NotImplementedError


# Port names come from the op contract (ops/schema.py), per cell (bench_cells.py). The benchmark
# runs full sequences without peepholes and with a loss on HAll and Ht, so the gradient op gets no
# sequence_lens, P or grad_Ct and has no dP to give. LSTMGrad of com.microsoft crashes the process
# unless dW and dR are requested: every other gradient is requested, for both domains. The LSTM's
# names stay here under their old names (bench_distributed.py and scripts read them).
FORWARD_OUTPUTS = CELLS["lstm"].forward_outputs
GRADIENT_OUTPUTS = CELLS["lstm"].gradient_outputs
_GRAD_INPUTS = CELLS["lstm"].grad_inputs
# The stash: the forward outputs that the gradient op takes back (LSTM: HAll, CAll, IOFC).
_STASH = CELLS["lstm"].stash

_IR_VERSION = 10  # onnxruntime-training 1.19 loads IR <= 10
_ONNX_OPSET = 17


def _stash_input(name: str, cell: Cell = CELLS["lstm"]) -> str:
    """Graph input name of the gradient op's stash port ``name`` (the forward's output has the port name)."""
    return f"stash_{name}" if name in cell.stash else name


def _training_pair_model(
    domain: str, forward_inputs: Sequence[str], config: BenchConfig, matmul_precision: str = "float32"
) -> onnx.ModelProto:
    """The forward and gradient op of ``domain`` (LSTMTraining and LSTMGrad, or config.cell's) side by side.

    The two nodes are not connected: LSTMGrad reads the stash from graph inputs, so one run can
    fetch the forward's outputs only and another the gradients only (with
    ``only_execute_path_to_fetches``), both on the session's one thread pool. Nodes come from
    ``ortlstm.ops.make_node`` (ports ordered by the spec) in both domains: the ortlstm ops keep
    com.microsoft's port order, which is what makes them drop-in.
    """
    elem = onnx.TensorProto.FLOAT if config.dtype == "float32" else onnx.TensorProto.DOUBLE
    cell = CELLS[config.cell]
    attributes: dict[str, object] = {"hidden_size": config.hidden_size, "direction": config.direction}
    attributes.update(cell.node_attributes(config.num_directions))
    if matmul_precision != "float32":  # ortlstm-bf16 (issue 33); com.microsoft's ops have no such attribute
        attributes["matmul_precision"] = matmul_precision
    forward = ortlstm.ops.make_node(
        cell.forward_op,
        {name: name for name in forward_inputs},
        {name: name for name in cell.forward_outputs},
        name=cell.forward_op,
        **attributes,
    )
    backward = ortlstm.ops.make_node(
        cell.grad_op,
        {name: _stash_input(name, cell) for name in cell.grad_inputs},
        {name: name for name in cell.gradient_outputs},
        name=cell.grad_op,
        **attributes,
    )
    forward.domain = backward.domain = domain
    inputs = list(dict.fromkeys([*forward_inputs, *(_stash_input(name, cell) for name in cell.grad_inputs)]))
    outputs = (*cell.forward_outputs, *cell.gradient_outputs)
    graph = onnx.helper.make_graph(
        [forward, backward],
        f"{domain}_training_pair",
        [onnx.helper.make_tensor_value_info(name, elem, None) for name in inputs],
        [onnx.helper.make_tensor_value_info(name, elem, None) for name in outputs],
    )
    return onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid("", _ONNX_OPSET), onnx.helper.make_opsetid(domain, 1)],
        ir_version=_IR_VERSION,
    )


def _single_op_model(pair: onnx.ModelProto, index: int) -> onnx.ModelProto:
    """Node ``index`` of a ``_training_pair_model`` alone, with the graph inputs and outputs it uses."""
    model = onnx.ModelProto()
    model.CopyFrom(pair)
    graph = model.graph
    node = onnx.NodeProto()
    node.CopyFrom(graph.node[index])
    inputs = [value for value in graph.input if value.name in set(node.input)]
    outputs = [value for value in graph.output if value.name in set(node.output)]
    del graph.node[:], graph.input[:], graph.output[:]
    graph.node.append(node)
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    return model


class OrtRunner(Runner):
    """The forward + gradient op of one domain (LSTMTraining + LSTMGrad, or the config's cell's) in one session.

    One session, hence one intra-op thread pool for both ops, as in a training graph. ``spinning``
    is onnxruntime's ``session.intra_op.allow_spinning`` (on by default in onnxruntime): idle pool
    threads spin for a while before they sleep.

    With ``feed="iobinding"`` inputs are bound as OrtValues over the numpy arrays and outputs are
    preallocated OrtValues, so a call times the kernel plus ORT's dispatch; the stash outputs of
    LSTMTraining are bound as LSTMGrad's inputs without a copy, as inside a training graph. With
    ``feed="numpy"`` every call goes through ``InferenceSession.run`` with numpy arrays.

    Where onnxruntime runs the gradient op on a run that fetches the forward's outputs only
    (``only_execute_path_to_fetches`` ignored: onnxruntime 1.32 does, 1.19 does not), a forward
    call would time both ops: then each op gets its own session (``separate_sessions``), as the
    log says. The first run finds out: its placeholder stash has the wrong rank, on which a
    gradient op that runs fails.
    """

    separate_sessions = False

    def __init__(
        self,
        domain: str,
        config: BenchConfig,
        threads: int,
        feed: str = "iobinding",
        spinning: bool = True,
        memory_arena: bool = True,
    ) -> None:
        ort = _optional_module("onnxruntime")
        if ort is None:
            raise Unavailable("onnxruntime not installed")
        self.name = domain
        self._feed = feed
        cell = self._cell = CELLS[config.cell]
        if domain == "com.microsoft" and config.cell != "lstm":
            # Said up front (the LSTM's reasons are onnxruntime's own messages, as before cells).
            unsupported = cell.microsoft_unavailable(config)
            if unsupported is not None:
                raise Unavailable(unsupported)
        # ortlstm-bf16: the ortlstm ops with matmul_precision="bfloat16" (issue 33).
        matmul_precision = "bfloat16" if domain == "ortlstm-bf16" else "float32"
        domain = "ortlstm" if domain == "ortlstm-bf16" else domain
        if domain == "ortlstm":
            options = ortlstm.ops.session_options(intra_op_num_threads=threads)
        else:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = memory_arena
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        options.log_severity_level = 4  # an unsupported config is reported as n/a, not logged

        forward_inputs = _lstm_inputs(config)
        gradient_inputs = _upstream_gradients(config)
        self._run_options = ort.RunOptions()
        self._run_options.only_execute_path_to_fetches = True
        pair = _training_pair_model(domain, list(forward_inputs), config, matmul_precision)
        try:
            session = ort.InferenceSession(pair.SerializeToString(), options, providers=["CPUExecutionProvider"])
            self._forward_session = self._backward_session = session
            # A placeholder stash for the first run, which fetches the forward's outputs only: of rank
            # 1, which the gradient op refuses, so that the run fails if the gradient op runs too.
            placeholder = {_stash_input(name, cell): np.zeros(1, config.dtype) for name in cell.stash}
            try:
                first = session.run(
                    list(cell.forward_outputs), {**forward_inputs, **placeholder, **gradient_inputs}, self._run_options
                )
            except Exception:  # onnxruntime's own types; the forward alone says whether it is the forward's fault
                self.separate_sessions = True
                self._forward_session, self._backward_session = (
                    ort.InferenceSession(
                        _single_op_model(pair, index).SerializeToString(), options, providers=["CPUExecutionProvider"]
                    )
                    for index in (0, 1)
                )
                first = self._forward_session.run(list(cell.forward_outputs), forward_inputs, self._run_options)
        except Exception as error:  # onnxruntime raises its own exception types
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise Unavailable(_short_ort_error(first_line)) from error

        stash = dict(zip(cell.forward_outputs, first, strict=True))
        self._feeds = {
            **forward_inputs,
            **{_stash_input(name, cell): stash[name] for name in cell.stash},
            **gradient_inputs,
        }
        forward_names = {value.name for value in self._forward_session.get_inputs()}
        backward_names = {value.name for value in self._backward_session.get_inputs()}
        self._forward_feeds = {name: array for name, array in self._feeds.items() if name in forward_names}
        self._backward_feeds = {name: array for name, array in self._feeds.items() if name in backward_names}
        gradient_shapes = cell.gradient_shapes(config)
        self.gradient_bytes = sum(int(np.prod(shape)) for shape in gradient_shapes) * np.dtype(config.dtype).itemsize

        if feed == "iobinding":
            # A binding keeps the native value but not the Python OrtValue, which is what keeps a
            # wrapped numpy array alive: every bound value is kept here for the runner's lifetime.
            self._bound: list[onnxruntime.OrtValue] = []

            def value(array: np.ndarray) -> onnxruntime.OrtValue:
                self._bound.append(ort.OrtValue.ortvalue_from_numpy(array))
                return self._bound[-1]

            def empty(shape: tuple[int, ...]) -> onnxruntime.OrtValue:
                self._bound.append(ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.dtype(config.dtype).type))
                return self._bound[-1]

            # Over the arrays of the first forward, so LSTMGrad sees a valid stash even before a
            # timed forward has written into them; the forward's outputs are the gradient's stash
            # inputs, without a copy, as inside a training graph.
            outputs = {name: value(stash[name]) for name in cell.forward_outputs}
            inputs = {name: value(array) for name, array in self._feeds.items() if _stash_input(name, cell) == name}
            inputs.update({_stash_input(name, cell): outputs[name] for name in cell.stash})
            self._forward_binding = self._forward_session.io_binding()
            self._backward_binding = self._backward_session.io_binding()
            for binding, names in ((self._forward_binding, forward_names), (self._backward_binding, backward_names)):
                for name, bound in inputs.items():
                    if name in names:
                        binding.bind_ortvalue_input(name, bound)
            for name in cell.forward_outputs:
                self._forward_binding.bind_ortvalue_output(name, outputs[name])
            for name, shape in zip(cell.gradient_outputs, gradient_shapes, strict=True):
                self._backward_binding.bind_ortvalue_output(name, empty(shape))

    def _run_forward(self) -> None:
        if self._feed == "iobinding":
            self._forward_session.run_with_iobinding(self._forward_binding, self._run_options)
        else:
            self._forward_session.run(list(self._cell.forward_outputs), self._forward_feeds, self._run_options)

    def _run_backward(self) -> None:
        if self._feed == "iobinding":
            self._backward_session.run_with_iobinding(self._backward_binding, self._run_options)
        else:
            self._backward_session.run(list(self._cell.gradient_outputs), self._backward_feeds, self._run_options)

    def iteration(self, phases: Phases) -> None:  # noqa: D102
        start = time.perf_counter()
        self._run_forward()
        middle = time.perf_counter()
        self._run_backward()
        end = time.perf_counter()
        phases.setdefault("fwd", []).append(middle - start)
        phases.setdefault("bwd", []).append(end - middle)

    def run_backward_once(self) -> int:  # noqa: D102
        self._run_backward()
        # Bound outputs exist before the call; numpy-fed outputs are allocated by it.
        return 0 if self._feed == "iobinding" else self.gradient_bytes


def _short_ort_error(message: str) -> str:
    """The reason in an onnxruntime error message, without its source-path prefix."""
    if "is not a registered function/op" in message:
        return "op not in this onnxruntime build (com.microsoft training ops need onnxruntime-training)"
    if "Type 'tensor(double)'" in message:
        return "float64 not supported"
    for marker in (" was false. ", "INVALID_GRAPH : ", "NOT_IMPLEMENTED : "):
        if marker in message:
            return message.split(marker, 1)[1][:120]
    return message[:120]


class TorchRunner(Runner):
    """``torch.nn.LSTM`` (or the config's cell: nn.GRU, nn.RNN) with its default CPU backend (oneDNN when available).

    Forward with grad, then ``torch.autograd.backward`` from the same upstream gradients the ORT
    ops get (output sequence and last hidden state). Gradients are reset to None between
    iterations (outside the timing), as ``zero_grad()`` does, so every backward allocates them.
    A forward under ``no_grad`` is timed too (phase ``fwd_nograd``).
    """

    name = "torch"
    autocast = False  # TorchAutocastRunner: forward (and so backward) under torch.autocast's bfloat16

    def __init__(self, config: BenchConfig, threads: int) -> None:
        torch = _optional_module("torch")
        if torch is None:
            raise Unavailable("torch not installed")
        self._torch = torch
        torch.set_num_threads(threads)
        dtype = getattr(torch, config.dtype)
        torch.manual_seed(0)
        layer = getattr(torch.nn, CELLS[config.cell].torch_module)
        self._lstm = layer(
            config.input_size,
            config.hidden_size,
            bidirectional=config.direction == "bidirectional",
            dtype=dtype,
            **dict(CELLS[config.cell].torch_kwargs),
        )
        inputs = _lstm_inputs(config)
        gradients = _upstream_gradients(config)
        t, n, h, d = config.seq_length, config.batch_size, config.hidden_size, config.num_directions
        self._x = torch.from_numpy(inputs["X"]).requires_grad_()
        self._h0 = torch.from_numpy(inputs["initial_h"]).requires_grad_()
        states = [self._h0]
        if "initial_c" in inputs:  # the LSTM's (h0, c0); nn.GRU and nn.RNN take h0 alone
            states.append(torch.from_numpy(inputs["initial_c"]).requires_grad_())
        self._state: Any = tuple(states) if len(states) == 2 else self._h0
        # torch's output is [seq_length, batch_size, num_directions*hidden_size]
        self._grad_y = torch.from_numpy(gradients["grad_HAll"].transpose(0, 2, 1, 3).reshape(t, n, d * h).copy())
        self._grad_hn = torch.from_numpy(gradients["grad_Ht"])
        self._leaves = [self._x, *states, *self._lstm.parameters()]
        self.gradient_bytes = sum(leaf.numel() * leaf.element_size() for leaf in self._leaves)
        self._pending: tuple[Any, Any] | None = None
        for _ in range(2):
            self._forward_with_grad()
            self.run_backward_once()

    def _clear_gradients(self) -> None:
        for leaf in self._leaves:
            leaf.grad = None

    def _context(self) -> Any:
        return self._torch.autocast("cpu", dtype=self._torch.bfloat16, enabled=self.autocast)

    def _forward_with_grad(self) -> None:
        with self._context():
            y, state = self._lstm(self._x, self._state)
        self._pending = (y, state[0] if isinstance(state, tuple) else state)

    def _backward(self) -> None:
        assert self._pending is not None
        y, h_n = self._pending
        self._torch.autograd.backward((y, h_n), (self._grad_y, self._grad_hn))
        self._pending = None

    def iteration(self, phases: Phases) -> None:  # noqa: D102
        torch = self._torch
        self._clear_gradients()
        start = time.perf_counter()
        with torch.no_grad(), self._context():
            self._lstm(self._x, self._state)
        end = time.perf_counter()
        phases.setdefault("fwd_nograd", []).append(end - start)
        start = time.perf_counter()
        self._forward_with_grad()
        middle = time.perf_counter()
        self._backward()
        end = time.perf_counter()
        phases.setdefault("fwd", []).append(middle - start)
        phases.setdefault("bwd", []).append(end - middle)

    def prepare_backward(self) -> None:
        """Clears gradients and runs a forward with grad, so ``run_backward_once`` can follow."""
        self._clear_gradients()
        self._forward_with_grad()

    def run_backward_once(self) -> int:  # noqa: D102
        if self._pending is None:
            self.prepare_backward()
        self._backward()
        return self.gradient_bytes


class TorchAutocastRunner(TorchRunner):
    """``torch.nn.LSTM`` under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (issue 33).

    What a PyTorch user on a bf16 CPU runs: oneDNN's bf16 RNN, float32 parameters, the backward in
    the forward's dtypes.
    """

    name = "torch-autocast"
    autocast = True


class GemmLimitRunner(Runner):
    """The GEMM limit as a competitor: each iteration runs every candidate GEMM once.

    It takes part in a config's interleaved rounds like the others, so the limit's rate comes from
    the same minutes, and the same statistic (median over the rounds), as the times it is compared
    with. Phases are the candidates' labels.
    """

    name = LIMIT
    warm_up_each_round = False  # each candidate runs once untimed before it is timed

    def __init__(self, candidates: Sequence[GemmCandidate]) -> None:
        rounded = sorted({c.source.name for c in candidates if c.source.operands != "native"})
        if rounded:
            raise ValueError(f"the GEMM limit takes native-precision GEMMs only, got {rounded}: pass them as bf16 rows")
        # Grouped by BLAS, so that a round switches between thread pools as rarely as it can.
        order = {id(c.source): index for index, c in reversed(list(enumerate(candidates)))}
        self.candidates = sorted(candidates, key=lambda c: order[id(c.source)])
        self._runs = [prepare_gemm(c.source, c.m, c.n, c.k, c.dtype) for c in self.candidates]
        self._last_source: GemmSource | None = None

    def iteration(self, phases: Phases) -> None:  # noqa: D102
        for candidate, run in zip(self.candidates, self._runs, strict=True):
            if self._last_source is not None and candidate.source is not self._last_source:
                time.sleep(SETTLE_SECONDS)  # the threads of the BLAS that ran before spin for a while
            self._last_source = candidate.source
            run()  # untimed: wakes this BLAS's threads and warms the operands, as in the survey
            start = time.perf_counter()
            run()
            phases.setdefault(candidate.label, []).append(time.perf_counter() - start)

    def rates(self, timing: Timing) -> list[tuple[GemmCandidate, float]]:
        """Each candidate with its rate (FLOP/s) from its median time in ``timing``."""
        return [(c, c.flops / statistics.median(timing.phases[c.label])) for c in self.candidates]


def make_runner(
    competitor: str,
    config: BenchConfig,
    threads: int,
    feed: str = "iobinding",
    spinning: bool = True,
    memory_arena: bool = True,
) -> Runner:
    """The runner of ``competitor`` at ``config``; raises :class:`Unavailable` with the reason.

    ``feed``, ``spinning`` and ``memory_arena`` apply to the ORT ops only (see :class:`OrtRunner`).
    """
    if competitor in ("ortlstm", "ortlstm-bf16", "com.microsoft"):
        return OrtRunner(competitor, config, threads, feed=feed, spinning=spinning, memory_arena=memory_arena)
    if competitor == "torch":
        return TorchRunner(config, threads)
    if competitor == "torch-autocast":
        return TorchAutocastRunner(config, threads)
    raise ValueError(f"unknown competitor {competitor!r}; expected one of {COMPETITORS}")


# ---------------------------------------------------------------------------------------------
# Interleaved timing


@dataclasses.dataclass
class Timing:
    """All call times of one competitor at one config."""

    phases: Phases = dataclasses.field(default_factory=dict)
    rounds: int = 0
    iterations_per_round: int = 0
    round_log: list[tuple[float | None, float | None, Phases]] = dataclasses.field(default_factory=list)
    """Per round: the CPU 0 <-> 1 round trip (ns) before and after it, and its calls."""
    states: dict[str, Phases] = dataclasses.field(default_factory=dict)
    """The calls of the rounds that ran wholly in one core state, "near" or "far" (tag_core_states)."""
    state_trips: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """The round trips (ns) measured around those rounds, per state."""

    def median_ms(self, phase: str, state: str | None = None) -> float | None:
        """Median of one phase in milliseconds; ``fwd+bwd`` sums the medians of fwd and bwd.

        With ``state``, over the rounds of that core state only (None when there were none).
        """
        if phase == "fwd+bwd":
            forward, backward = self.median_ms("fwd", state), self.median_ms("bwd", state)
            return None if forward is None or backward is None else forward + backward
        values = (self.phases if state is None else self.states.get(state, {})).get(phase)
        return 1e3 * statistics.median(values) if values else None

    def best_ms(self, phase: str) -> float | None:
        """Fastest call of one phase in milliseconds; ``fwd+bwd`` sums the fastest fwd and bwd."""
        if phase == "fwd+bwd":
            forward, backward = self.best_ms("fwd"), self.best_ms("bwd")
            return None if forward is None or backward is None else forward + backward
        values = self.phases.get(phase)
        return 1e3 * min(values) if values else None

    def spread(self, phase: str) -> float | None:
        """Interquartile range over median of one phase (0.05 = 5 %)."""
        values = self.phases.get(phase)
        if not values or len(values) < 4:
            return None
        quartiles = statistics.quantiles(values, n=4)
        return (quartiles[2] - quartiles[0]) / statistics.median(values)


MIN_ROUND_SECONDS = 0.2
"""A competitor's round repeats its iteration until it lasts at least this long."""
SETTLE_SECONDS = 0.1
"""Pause before each competitor's round: longer than onnxruntime's and libgomp's spin-waits, so
the threads of the competitor that ran before are asleep and do not compete for the cores."""
ROUND_TRIP_PROBE_SECONDS = 0.002
"""Length of the CPU 0 <-> 1 round-trip probe before and after each round (core_round_trip_ns)."""
FAR_FACTOR = 2.0
"""A round ran in the distant-core state when its round trips before and after both exceed this many
times the fastest of the run's rounds, in the nearby state when neither does (tag_core_states)."""
STATES = ("near", "far")
"""The core states of tag_core_states, in the order the ratios table shows them."""
ROUND_WARMUP_BELOW_SECONDS = 1.0
"""Iterations shorter than this get an untimed iteration at the start of every round: the first
call after an idle pause runs measurably slower (tens of ms at M on a 2-vCPU VM: idle cores,
cold caches), which would otherwise land on whichever phase comes first."""


def time_config(
    runners: dict[str, Runner],
    repeats: int,
    min_round_seconds: float,
    max_seconds: float,
    log: Callable[[str], None],
    round_trip: Callable[[], float | None] | None = None,
) -> dict[str, Timing]:
    """Interleaved rounds: each round runs every competitor once, the first one rotating.

    A competitor's round is ``iterations_per_round`` forward+backward iterations, chosen so a round
    lasts at least ``min_round_seconds``. A competitor whose rounds would take longer than
    ``max_seconds`` in total gets fewer rounds (at least 3, or ``repeats`` if lower) and drops out
    of the later ones. Each round starts after a pause of ``SETTLE_SECONDS`` and, for iterations
    shorter than ``ROUND_WARMUP_BELOW_SECONDS``, with one untimed iteration. ``round_trip``
    (default: core_round_trip_ns for ``ROUND_TRIP_PROBE_SECONDS``) is measured before and after
    each round, and tag_core_states sorts the rounds by it.
    """
    probe = round_trip or (lambda: core_round_trip_ns(ROUND_TRIP_PROBE_SECONDS))
    timings: dict[str, Timing] = {}
    rounds_of: dict[str, int] = {}
    round_warmup: dict[str, bool] = {}
    for name, runner in runners.items():
        warm_up: Phases = {}
        # Warm-up: first-run allocations and planning, oneDNN primitive creation. A second,
        # representative iteration sets the round length, unless the first alone took long.
        start = time.perf_counter()
        runner.iteration(warm_up)
        seconds = time.perf_counter() - start
        if seconds < 1.0:
            start = time.perf_counter()
            runner.iteration(warm_up)
            seconds = time.perf_counter() - start
        iterations = max(1, math.ceil(min_round_seconds / max(seconds, 1e-9)))
        rounds_of[name] = min(repeats, max(3, int(max_seconds / (iterations * seconds))))
        timings[name] = Timing(iterations_per_round=iterations)
        round_warmup[name] = runner.warm_up_each_round and seconds < ROUND_WARMUP_BELOW_SECONDS
        if rounds_of[name] < repeats:
            log(f"    {name}: {seconds:.2f} s per iteration, limited to {rounds_of[name]} rounds")

    def run_round(name: str) -> None:
        timing = timings[name]
        before = probe()
        if round_warmup[name]:
            runners[name].iteration({})
        phases: Phases = {}
        for _ in range(timing.iterations_per_round):
            runners[name].iteration(phases)
        time.sleep(SETTLE_SECONDS)  # until the competitor's spinning threads sleep: the probe needs both CPUs
        timing.round_log.append((before, probe(), phases))
        for phase, values in phases.items():
            timing.phases.setdefault(phase, []).extend(values)
        timing.rounds += 1

    run_interleaved_rounds(rounds_of, run_round)
    tag_core_states(list(timings.values()))
    return timings


def tag_core_states(timings: list[Timing]) -> None:
    """Sorts each round's calls into ``Timing.states`` by the round trips before and after it.

    Where a VM's host moves its vCPUs between nearby and distant cores, the configs that hand data
    between cores every step (S, B1) run up to twice as long in the distant state
    (docs/performance.md); these per-state medians show both states of one run side by side. The
    bound is ``FAR_FACTOR`` times the fastest round trip of the given timings' rounds (time_config:
    its config's competitors; main: the whole run's, so that a config that ran wholly in the distant
    state is "far"): "near" when both of a round's round trips are within it, "far" when both
    exceed it, neither when the state changed during the round or the probe could not run. On cores
    that stay put every round is "near".
    """
    trips = [ns for timing in timings for *pair, _ in timing.round_log for ns in pair if ns is not None]
    if not trips:
        return
    bound = FAR_FACTOR * min(trips)
    for timing in timings:
        timing.states, timing.state_trips = {}, {}
        for before, after, phases in timing.round_log:
            if before is None or after is None:
                continue
            state = "near" if max(before, after) <= bound else "far" if min(before, after) > bound else None
            if state is None:
                continue
            into = timing.states.setdefault(state, {})
            for phase, values in phases.items():
                into.setdefault(phase, []).extend(values)
            timing.state_trips.setdefault(state, []).extend((before, after))


def run_interleaved_rounds(rounds_of: dict[str, int], run_round: Callable[[str], None]) -> None:
    """Runs ``rounds_of[name]`` rounds of each competitor, interleaved.

    Round k starts at the k-th competitor (rotating), so none always runs first or after the same
    neighbour; each round follows a ``SETTLE_SECONDS`` pause; a competitor with fewer rounds
    drops out when it has run them. ``bench_training.py`` uses it too.
    """
    names = list(rounds_of)
    for round_index in range(max(rounds_of.values(), default=0)):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if round_index < rounds_of[name]:
                time.sleep(SETTLE_SECONDS)
                run_round(name)


# ---------------------------------------------------------------------------------------------
# Peak memory of the backward, one fresh subprocess per (competitor, config)

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"
# A fixed mmap threshold turns off glibc's adaptive one, so that every large block is mmapped and
# returned to the system when freed: memory freed by an earlier call does not stay resident and
# hide the next call's peak. Applied to every competitor alike.
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "MALLOC_TRIM_THRESHOLD_": str(128 * 1024)}


def _status_kib(field: str) -> int:
    with open(_STATUS) as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in {_STATUS}")


def _reset_peak_rss() -> None:
    """Resets VmHWM to the current VmRSS (Linux >= 4.0: writing 5 to clear_refs)."""
    with open(_CLEAR_REFS, "w") as clear_refs:
        clear_refs.write("5")


def peak_memory_supported() -> str | None:
    """None if VmHWM can be reset here, else the reason it cannot."""
    try:
        _reset_peak_rss()
        before = _status_kib("VmHWM")
        # Fresh pages from the kernel (an mmap, not the heap, which may hold freed memory).
        with mmap.mmap(-1, 64 * 1024 * 1024) as block:
            for offset in range(0, len(block), mmap.PAGESIZE):
                block[offset] = 1
            grown = _status_kib("VmHWM")
        _reset_peak_rss()
        after = _status_kib("VmHWM")
    except OSError as error:
        return f"cannot reset VmHWM: {error}"
    if not (grown - before >= 60 * 1024 and after < grown - 60 * 1024):
        return f"VmHWM reset has no effect (before {before}, grown {grown}, after reset {after} KiB)"
    return None


def memory_probe(competitor: str, config: BenchConfig, threads: int) -> dict[str, float]:
    """Peak extra memory of one backward call, in MiB (run in a fresh process).

    extra = VmHWM during the call - VmRSS just before it - bytes of the gradients the call
    allocates (0 for the ORT ops: their outputs are preallocated through IOBinding). The
    backward runs once before the measurement (warm), so one-time costs (code pages,
    oneDNN primitives, ORT's first-run planning) are not counted; ORT's arena is off, so the
    ORT ops' scratch goes through malloc like the others'. ``cold`` is the first call's value.
    """
    runner = make_runner(competitor, config, threads, memory_arena=False)
    result: dict[str, float] = {}
    for label in ("cold", "warm"):
        if isinstance(runner, TorchRunner):
            runner.prepare_backward()
        gc.collect()
        _reset_peak_rss()
        before = _status_kib("VmRSS")
        allocated = runner.run_backward_once()
        peak = _status_kib("VmHWM")
        result[label] = (peak - before) / 1024.0 - allocated / MIB
    result["outputs"] = getattr(runner, "gradient_bytes", 0) / MIB
    return result


def run_memory_probes(
    competitors: Sequence[str], configs: Sequence[BenchConfig], threads: int, log: Callable[[str], None]
) -> dict[tuple[str, str], dict[str, float] | str]:
    """Peak backward memory per (competitor, config): a result dict, or the reason it is n/a."""
    results: dict[tuple[str, str], dict[str, float] | str] = {}
    environment = {**os.environ, **_MALLOC_ENV}
    for config in configs:
        for competitor in competitors:
            command = [
                sys.executable, str(Path(__file__).resolve()), "--threads", str(threads),
                "--memory-probe", f"{competitor}:{config.name}",
            ]  # fmt: skip
            process = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
            lines = process.stdout.strip().splitlines()
            if process.returncode != 0 or not lines:
                tail = (process.stderr.strip().splitlines() or [f"exit status {process.returncode}"])[-1]
                results[(competitor, config.name)] = f"probe failed: {tail[:160]}"
                continue
            payload = json.loads(lines[-1])
            results[(competitor, config.name)] = payload.get("unavailable") or payload
            if isinstance(results[(competitor, config.name)], dict):
                log(f"  memory {config.name:8} {competitor:14} {payload['warm']:8.1f} MiB (cold {payload['cold']:.1f})")
    return results


# ---------------------------------------------------------------------------------------------
# Other processes: medians hide short disturbances, not a machine that is busy all along


class CpuMonitor:
    """CPU time that other processes use while the benchmark runs.

    /proc/stat's busy time of the whole machine minus this process's own CPU time (and that of its
    finished subprocesses), divided by wall time: the average number of cores taken by others.
    """

    def __init__(self) -> None:
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as stat:
                fields = [int(value) for value in stat.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        own = sum(
            usage.ru_utime + usage.ru_stime
            for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
        )
        busy = (user + nice + system + irq + softirq + steal) / self._ticks
        return time.monotonic(), busy, own

    def mark(self) -> tuple[float, float, float] | None:
        """A point in time to measure from."""
        return self._sample()

    def others_since(self, mark: tuple[float, float, float] | None) -> float | None:
        """Average cores used by other processes since ``mark`` (None if /proc/stat is unreadable)."""
        now = self._sample()
        if mark is None or now is None or now[0] - mark[0] <= 0:
            return None
        return max(0.0, ((now[1] - mark[1]) - (now[2] - mark[2])) / (now[0] - mark[0]))


def wait_until_idle(monitor: CpuMonitor, max_seconds: float, log: Callable[[str], None]) -> None:
    """Waits (up to ``max_seconds``) until other processes use less than 0.1 core over 5 s."""
    deadline = time.monotonic() + max_seconds
    while True:
        mark = monitor.mark()
        time.sleep(5.0)
        others = monitor.others_since(mark)
        if others is None or others < 0.1:
            return
        if time.monotonic() >= deadline:
            log(f"machine still busy ({others:.2f} cores used by other processes); starting anyway")
            return
        log(f"waiting for an idle machine: other processes use {others:.2f} cores")


# ---------------------------------------------------------------------------------------------
# Machine and versions


def _cpu_description() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or "unknown"}
    first = text.split("\n\n")[0]
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    info["model"] = (
        f"{fields.get('model name', 'unknown')} ({fields.get('vendor_id', '?')}, family "
        f"{fields.get('cpu family', '?')}, model {fields.get('model', '?')})"
    )
    info["logical cpus"] = str(text.count("processor\t:"))
    info["MHz (reported)"] = fields.get("cpu MHz", "?")
    info["cache"] = fields.get("cache size", "?")
    simd = [flag for flag in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if flag in flags]
    info["SIMD"] = " ".join(simd) or "none listed"
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()[0].split()
        info["memory"] = f"{int(meminfo[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, IndexError, ValueError):
        pass
    info["kernel"] = platform.release()
    return info


def _git_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def _library_build(library: Path) -> str:
    """The build line libortlstm_ops.so carries (kernels_cpp/register.cc), e.g. its BLAS."""
    marker = b"ortlstm-build: "
    data = library.read_bytes()
    at = data.find(marker)
    if at < 0:
        return "unknown (no build line in the library)"
    return data[at + len(marker) : data.index(b"\0", at)].decode(errors="replace")


def environment_description(threads: int, sources: Sequence[GemmSource]) -> dict[str, str]:
    """Versions, thread settings and backends, for the report header."""
    info = {"python": platform.python_version(), "numpy": np.__version__}
    ort = _optional_module("onnxruntime")
    info["onnxruntime"] = ort.__version__ if ort is not None else "not installed"
    try:
        library = Path(ortlstm.ops.library_path())
        built = datetime.datetime.fromtimestamp(library.stat().st_mtime, datetime.timezone.utc)
        info["ortlstm"] = (
            f"{importlib.metadata.version('ortlstm')}, git {_git_revision()}; {library.name} sha256 "
            f"{hashlib.sha256(library.read_bytes()).hexdigest()[:12]}, built {built:%Y-%m-%d %H:%M} UTC; "
            f"{_library_build(library)}"
        )
    except (ImportError, FileNotFoundError) as error:
        info["ortlstm"] = f"unavailable: {error}"
    try:
        forced = os.environ.get("ORTLSTM_BLAS_BACKEND") or ""
        how = f"forced by ORTLSTM_BLAS_BACKEND={forced}" if forced else "chosen by CPU vendor"
        info["ortlstm GEMM backend"] = f"{ortlstm.ops.blas_backend()} ({how})"
    except (ImportError, FileNotFoundError, ValueError, AttributeError) as error:
        info["ortlstm GEMM backend"] = f"unknown: {error}"
    torch = _optional_module("torch")
    if torch is not None:
        mkldnn = torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
        info["torch"] = f"{torch.__version__} (nn.LSTM CPU backend: {'oneDNN' if mkldnn else 'native'} for float32)"
    else:
        info["torch"] = "not installed"
    info["threads"] = (
        f"{threads}: onnxruntime intra_op_num_threads={threads} (inter_op 1); "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}; "
        + (f"torch.get_num_threads()={torch.get_num_threads()}; " if torch is not None else "")
        + f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )
    info["GEMM rate"] = "best of " + "; ".join(source.name for source in sources)
    return info


# ---------------------------------------------------------------------------------------------
# Report


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align_left: int = 1) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" if i < align_left else "---:" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def core_round_trip_ns(seconds: float = 0.1) -> float | None:
    """The round trip of a cache line between CPUs 0 and 1 in ns (median over ``seconds``), else None.

    The library's OrtLstmCoreRoundTripNs (kernels_cpp/common/core_probe.cc): None with one CPU, where
    CPUs 0 and 1 are not this process's to pin, or with a library that predates it.
    """
    if (os.cpu_count() or 1) < 2:
        return None
    try:
        probe = ctypes.CDLL(ortlstm.ops.library_path()).OrtLstmCoreRoundTripNs
    except (OSError, AttributeError):
        return None
    probe.restype = ctypes.c_double
    probe.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double]
    value = float(probe(0, 1, seconds))
    return value if value > 0 else None


@dataclasses.dataclass
class Results:
    """Everything one run measured."""

    configs: list[BenchConfig]
    timings: dict[tuple[str, str], Timing | str]
    limit_ms: dict[str, dict[str, float]]
    gemm_rows: list[tuple[str, str, str, float]]
    """The survey at the start: (dtype, shape, BLAS, GFLOP/s)."""
    limit_rates: dict[str, list[tuple[str, str, float]]]
    """Per config: each candidate GEMM (BLAS, shape) with its median GFLOP/s over the config's rounds."""
    memory: dict[tuple[str, str], dict[str, float] | str]
    environment: dict[str, str]
    machine: dict[str, str]
    command: str
    date: str
    seconds: float
    other_load: dict[str, float | None]
    """Average cores used by other processes: per config name, and "run" for the whole run."""
    core_round_trip: dict[str, tuple[float | None, float | None]] = dataclasses.field(default_factory=dict)
    """Per config name: CPU 0 <-> 1 round trip (ns) before and after its rounds (core_round_trip_ns)."""

    def median(self, competitor: str, config: str, phase: str, state: str | None = None) -> float | None:
        """Median ms of a phase (or of the GEMM limit), None when the competitor did not run.

        With ``state`` ("near" or "far"), over the competitor's rounds in that core state only.
        """
        if competitor == LIMIT:
            limit = self.limit_ms[config]
            return limit["fwd"] + limit["bwd"] if phase == "fwd+bwd" else limit[phase]
        timing = self.timings.get((competitor, config))
        return timing.median_ms(phase, state) if isinstance(timing, Timing) else None

    def reason(self, competitor: str, config: str) -> str | None:
        """Why a competitor did not run at a config, or None if it did."""
        timing = self.timings.get((competitor, config))
        return timing if isinstance(timing, str) else None

    def memory_mib(self, competitor: str, config: str) -> float | None:
        """Peak extra memory of the warm backward call, None if not measured.

        Negative values (the call freed more than it allocated: torch releasing saved tensors)
        count as 0.
        """
        entry = self.memory.get((competitor, config))
        return max(0.0, entry["warm"]) if isinstance(entry, dict) else None

    def memory_ratio(self, config: str) -> float | None:
        """The ratio of ortlstm's to torch's backward extra memory; None below the resolution."""
        ours, theirs = self.memory_mib("ortlstm", config), self.memory_mib("torch", config)
        if ours is None or theirs is None or max(ours, theirs) < MEMORY_RESOLUTION_MIB:
            return None
        return ours / max(theirs, MEMORY_RESOLUTION_MIB)

    def ratio(
        self, numerator: str, denominator: str, config: str, phase: str = "fwd+bwd", state: str | None = None
    ) -> float | None:
        """Median of ``numerator`` over median of ``denominator`` (competitor names or LIMIT).

        With ``state``, both medians over the rounds in that core state only (tag_core_states).
        """
        top = self.median(numerator, config, phase, state)
        bottom = self.median(denominator, config, phase, state)
        return None if top is None or bottom is None or bottom == 0 else top / bottom


def render_markdown(results: Results) -> str:
    """The report: setup, times, ratios, memory, targets, GEMM rates."""
    gemm_rows = [
        [dtype, shape, source.split(",")[0], f"{rate:.3g}"] for dtype, shape, source, rate in results.gemm_rows
    ]
    sections = [
        _setup_lines(results),
        ["### Time per call (median, ms)", "", *_time_lines(results)],
        ["### Ratios (below 1: ortlstm is faster)", "", *_ratio_lines(results)],
    ]
    if results.memory:
        sections.append(["### Peak extra memory of one backward call (MiB)", "", *_memory_lines(results)])
    sections += [
        ["### Targets", "", *_target_lines(results)],
        ["### GEMM rates measured in this run", "", *_gemm_lines(results, gemm_rows)],
    ]
    return "\n\n".join("\n".join(section) for section in sections) + "\n"


def _gemm_lines(results: Results, survey: list[list[str]]) -> list[str]:
    rows = [
        [name, shape, blas, f"{rate:.3g}"] for name, rated in results.limit_rates.items() for blas, shape, rate in rated
    ]
    return [
        "The limit's rate at each config: the fastest of the survey's best "
        f"{LIMIT_CANDIDATES} GEMMs, each timed once per round in that config's interleaved rounds (median).",
        "",
        *_table(["config", "M x N x K", "BLAS", "GFLOP/s"], rows, 3),
        "",
        "The survey at the start of the run (median of 5 calls each), which picks those GEMMs:",
        "",
        *_table(["dtype", "M x N x K", "BLAS", "GFLOP/s"], survey, 3),
    ]


def _setup_lines(results: Results) -> list[str]:
    lines = [f"Run: {results.date}, `{results.command}`, {results.seconds / 60:.1f} min.", ""]
    lines.append("Machine: " + "; ".join(f"{key} {value}" for key, value in results.machine.items()) + ".")
    lines.append("")
    lines += [f"- {key}: {value}" for key, value in results.environment.items()]
    best = ", ".join(
        f"{name} {max(rate for *_, rate in rated):.0f}" for name, rated in results.limit_rates.items() if rated
    )
    lines.append(f"- the limit's rate per config (best GEMM, median over the config's rounds), GFLOP/s: {best}")
    overall = results.other_load.get("run")
    if overall is not None:
        lines.append(f"- other processes used {overall:.2f} cores on average during the run (per config: ratios table)")
    busy = [name for name, load in results.other_load.items() if load is not None and load >= BUSY_CORES]
    if busy:
        lines.append(
            f"- **warning**: other processes used >= {BUSY_CORES} cores during {', '.join(busy)}: times disturbed"
        )
    return lines


def _time_lines(results: Results) -> list[str]:
    rows = []
    for config in results.configs:
        for competitor in COMPETITORS:
            reason = results.reason(competitor, config.name)
            timing = results.timings.get((competitor, config.name))
            if reason is not None:
                rows.append([config.name, competitor, "n/a", "n/a", "n/a", "n/a", "n/a", "", reason])
            elif isinstance(timing, Timing):
                spread = timing.spread("bwd")
                rows.append([
                    config.name, competitor, _ms(timing.median_ms("fwd")), _ms(timing.median_ms("bwd")),
                    _ms(timing.median_ms("fwd+bwd")), _ms(timing.best_ms("fwd+bwd")),
                    _ms(timing.median_ms("fwd_nograd")), f"{timing.rounds}x{timing.iterations_per_round}",
                    "" if spread is None else f"bwd IQR {100 * spread:.0f}%",
                ])  # fmt: skip
        rows.append([
            config.name, LIMIT, _ms(results.median(LIMIT, config.name, "fwd")),
            _ms(results.median(LIMIT, config.name, "bwd")), _ms(results.median(LIMIT, config.name, "fwd+bwd")),
            "", "", "", f"{(config.forward_flops + config.backward_flops) / 1e9:.2f} GFLOP",
        ])  # fmt: skip
    header = ["config", "competitor", "fwd", "bwd", "fwd+bwd", "fwd+bwd best", "torch fwd no-grad", "rounds x iters",
              "note"]  # fmt: skip
    intro = (
        "fwd: LSTMTraining with its stash / torch forward with grad; bwd: LSTMGrad / torch backward; "
        "fwd+bwd: sum of the two medians; best: sum of the fastest fwd and bwd calls. "
        "torch's forward under no_grad in its own column."
    )
    return [intro, "", *_table(header, rows, align_left=2)]


def _ratio_lines(results: Results) -> list[str]:
    rows = []
    for config in results.configs:
        name = config.name
        cells = [
            results.ratio("ortlstm", "torch", name),
            results.ratio("ortlstm", "torch", name, "fwd"),
            results.ratio("ortlstm", "torch", name, "bwd"),
            results.ratio("ortlstm", LIMIT, name),
            results.ratio("ortlstm", LIMIT, name, "fwd"),
            results.ratio("ortlstm", LIMIT, name, "bwd"),
            results.ratio("ortlstm", "com.microsoft", name),
            results.ratio("com.microsoft", "ortlstm", name),
        ]
        by_state = " / ".join(_ratio_in_state(results, name, s) for s in STATES)
        trips = (results.core_round_trip or {}).get(name, (None, None))
        trip = " / ".join("n/a" if ns is None else f"{ns:.0f}" for ns in trips)
        rows.append([
            f"{name} {config.describe()}", *map(_number, cells), by_state, _number(results.other_load.get(name)), trip
        ])  # fmt: skip
    header = [
        "config (T, N, I, H)", "ortlstm/torch", "fwd", "bwd", "ortlstm/limit", "fwd", "bwd",
        "ortlstm/com.microsoft", "com.microsoft/ortlstm", "com.microsoft/ortlstm, near / far rounds",
        "others' load (cores)", "CPU 0-1 round trip (ns)",
    ]  # fmt: skip
    intro = (
        "fwd+bwd unless the column says fwd or bwd; torch's fwd is its forward with grad. The round trip of a "
        "cache line between CPUs 0 and 1, before / after the config's rounds: where a VM's host moves its vCPUs "
        "between nearby and distant cores it jumps (56 against ~320 ns on the 2-vCPU AMD Zen 4), and the configs "
        "that hand data between cores every step (B1, S) slow down with it (docs/performance.md). It is also "
        "measured before and after each round: near / far rounds are those whose two round trips are both within, "
        f"or both above, {FAR_FACTOR:g}x the run's fastest, each with their median round trip (n/a: no round in "
        "that state; a run that never saw the near state calls its rounds near: read the round trip)."
    )
    return [intro, "", *_table(header, rows)]


def _ratio_in_state(results: Results, config: str, state: str) -> str:
    """com.microsoft/ortlstm over the rounds of one core state, with their median round trip."""
    ratio = results.ratio("com.microsoft", "ortlstm", config, state=state)
    if ratio is None:
        return "n/a"
    trips = [
        ns
        for competitor in ("ortlstm", "com.microsoft")
        for timing in [results.timings.get((competitor, config))]
        if isinstance(timing, Timing)
        for ns in timing.state_trips.get(state, [])
    ]
    return f"{_number(ratio)} ({statistics.median(trips):.0f} ns)"


def _memory_lines(results: Results) -> list[str]:
    rows = []
    for config in results.configs:
        row = [config.name]
        for competitor in COMPETITORS:
            value = results.memory_mib(competitor, config.name)
            row.append("n/a" if value is None else f"{value:.1f}")
        row.append(_number(results.memory_ratio(config.name)))
        gradients = [
            entry["outputs"]
            for (_, name), entry in results.memory.items()
            if name == config.name and isinstance(entry, dict)
        ]
        row.append(f"{gradients[0]:.1f}" if gradients else "n/a")
        rows.append(row)
    intro = (
        "VmHWM during the call minus VmRSS just before it, minus the gradients the call allocates; "
        "second (warm) call, fresh process per cell; negative values shown as 0. The ratio is n/a "
        f"when both are below {MEMORY_RESOLUTION_MIB:g} MiB. The gradient outputs' size is shown for scale."
    )
    return [intro, "", *_table(["config", *COMPETITORS, "ortlstm/torch", "gradients"], rows)]


def _target_lines(results: Results) -> list[str]:
    rows: list[list[str]] = []

    def add(target: str, config: str, value: float | None, bound: float, larger_is_better: bool) -> None:
        met = None if value is None else value >= bound if larger_is_better else value <= bound
        rows.append([target, config, _number(value), "n/a" if met is None else "yes" if met else "**no**"])

    names = [config.name for config in results.configs if config.cell == "lstm"]
    for name in names:
        add(f"ortlstm/torch <= {TARGET_TORCH_RATIO}", name, results.ratio("ortlstm", "torch", name),
            TARGET_TORCH_RATIO, larger_is_better=False)  # fmt: skip
    for name in (name for name in TARGET_LIMIT_CONFIGS if name in names):
        add(f"ortlstm/limit <= {TARGET_LIMIT_RATIO}", name, results.ratio("ortlstm", LIMIT, name),
            TARGET_LIMIT_RATIO, larger_is_better=False)  # fmt: skip
    for name in (name for name in TARGET_MICROSOFT_CONFIGS if name in names):
        speedup = results.ratio("com.microsoft", "ortlstm", name)
        add(f"com.microsoft/ortlstm >= {TARGET_MICROSOFT_SPEEDUP:g}", name, speedup, TARGET_MICROSOFT_SPEEDUP,
            larger_is_better=True)  # fmt: skip
    others = [config for config in results.configs if config.cell != "lstm"]
    for config in others:
        add(f"{CELLS[config.cell].label} ortlstm/torch <= {TARGET_TORCH_RATIO}", config.name,
            results.ratio("ortlstm", "torch", config.name), TARGET_TORCH_RATIO, larger_is_better=False)  # fmt: skip
    for config in (config for config in others if CELLS[config.cell].microsoft is None):
        label = f"com.microsoft {CELLS[config.cell].grad_op}/ortlstm >= {TARGET_CELL_MICROSOFT_SPEEDUP:g}"
        add(label, config.name, results.ratio("com.microsoft", "ortlstm", config.name), TARGET_CELL_MICROSOFT_SPEEDUP,
            larger_is_better=True)  # fmt: skip
    names += [config.name for config in others]
    for name in names if results.memory else ():
        ours, theirs = results.memory_mib("ortlstm", name), results.memory_mib("torch", name)
        if ours is not None and theirs is not None and max(ours, theirs) < MEMORY_RESOLUTION_MIB:
            rows.append(["bwd extra memory ortlstm/torch <= 1", name, f"both < {MEMORY_RESOLUTION_MIB:g} MiB", "yes"])
        else:
            add("bwd extra memory ortlstm/torch <= 1", name, results.memory_ratio(name), 1.0, larger_is_better=False)
    intro = "Times are fwd+bwd medians; com.microsoft/ortlstm is ortlstm's speedup."
    return [intro, "", *_table(["target", "config", "measured", "met"], rows, align_left=2)]


_DEFAULT_HEADER = """# Benchmarks

LSTMTraining + LSTMGrad (ortlstm) against onnxruntime's com.microsoft ops, PyTorch's nn.LSTM and
the GEMM limit, written by `benchmarks/bench_lstm.py --markdown docs/benchmarks.md`. The method and
the meaning of each column are in [benchmarks/README.md](../benchmarks/README.md). A run rewrites
only its own section, between its markers; text outside the markers is kept.
"""


def _markers(section: str) -> tuple[str, str]:
    return (
        f"<!-- BEGIN bench_lstm.py output [{section}]: rewritten by each run, edit outside the markers -->",
        f"<!-- END bench_lstm.py output [{section}] -->",
    )


def write_markdown(path: Path, body: str, section: str) -> None:
    """Writes ``body`` between the markers of ``section`` in ``path`` (appended if they are missing)."""
    begin, end = _markers(section)
    title = "## Results" if section == "main" else f"## Results: {section}"
    block = f"{begin}\n\n{title}\n\n{body.strip()}\n\n{end}"
    text = path.read_text() if path.exists() else _DEFAULT_HEADER
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---------------------------------------------------------------------------------------------
# Main


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--threads", type=int, default=2, help="threads for ORT, BLAS and torch (default 2)")
    parser.add_argument(
        "--configs",
        default=None,
        help=f"comma-separated names from {', '.join(CONFIGS)} (default: all; --quick: {','.join(QUICK_CONFIGS)})",
    )
    parser.add_argument(
        "--cells",
        default="lstm",
        help=f"comma-separated cells from {', '.join(CELLS)}, each at every config (default lstm; see bench_cells.py)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds per config (default 15, quick 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: small configs, few rounds (< 2 minutes)")
    parser.add_argument("--markdown", type=Path, default=None, help="write the report into this markdown file")
    parser.add_argument(
        "--markdown-section",
        default="main",
        metavar="NAME",
        help="the marked section of --markdown that this run rewrites (default main)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every call time and memory result as JSON")
    parser.add_argument(
        "--competitors", default=",".join(COMPETITORS), help=f"comma-separated subset of {', '.join(COMPETITORS)}"
    )
    parser.add_argument(
        "--feed",
        choices=("iobinding", "numpy"),
        default="iobinding",
        help="how the ORT ops get their tensors: preallocated OrtValues (default) or numpy arrays per run",
    )
    parser.add_argument(
        "--ort-spinning",
        choices=("on", "off"),
        default="on",
        help="onnxruntime intra-op spinning for the ORT ops (default on, as in onnxruntime; see benchmarks/README.md)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="timed seconds per competitor and config before it gets fewer rounds",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before starting, wait up to this long for other processes to go quiet (default 0)",
    )
    parser.add_argument(
        "--blas",
        choices=("auto", "mkl", "openblas", "openblas+mkl"),
        default=None,
        help="force ortlstm's GEMM backend (sets ORTLSTM_BLAS_BACKEND; auto unsets it; default: the environment's)",
    )
    parser.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    names = args.configs.split(",") if args.configs else list(QUICK_CONFIGS if args.quick else CONFIGS)
    unknown = [name for name in names if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown config(s) {unknown}; known: {', '.join(CONFIGS)}")
    cells = [cell for cell in args.cells.split(",") if cell]
    unknown = [cell for cell in cells if cell not in CELLS]
    if unknown or not cells:
        parser.error(f"unknown cell(s) {unknown or [args.cells]}; known: {', '.join(CELLS)}")
    args.config_list = [cell_config(CONFIGS[name], cell) for cell in dict.fromkeys(cells) for name in names]
    args.competitor_list = [name for name in args.competitors.split(",") if name]
    unknown = [name for name in args.competitor_list if name not in COMPETITORS]
    if unknown:
        parser.error(f"unknown competitor(s) {unknown}; known: {', '.join(COMPETITORS)}")
    if args.repeats is None:
        args.repeats = 3 if args.quick else 15
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.max_seconds is None:
        args.max_seconds = 4.0 if args.quick else 30.0
    return args


def _run_probe(spec: str, threads: int) -> None:
    competitor, config_name = spec.split(":", 1)
    try:
        result: dict[str, Any] = memory_probe(competitor, config_by_name(config_name), threads)
    except Unavailable as reason:
        result = {"unavailable": str(reason)}
    print(json.dumps(result))


def main() -> None:
    """Runs the benchmark and prints (and optionally writes) the report.

    Reads ``sys.argv``: the script re-executes itself with the same arguments (``_fix_thread_env``).
    """
    args = _parse_args(sys.argv[1:])
    if args.blas is not None:
        # Read by the kernel library when a session first registers it; inherited by the memory probes.
        os.environ.pop("ORTLSTM_BLAS_BACKEND", None)
        if args.blas != "auto":
            os.environ["ORTLSTM_BLAS_BACKEND"] = args.blas
    _fix_thread_env(args.threads)
    if args.memory_probe:
        _run_probe(args.memory_probe, args.threads)
        return

    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    monitor = CpuMonitor()
    if args.wait_idle > 0:
        wait_until_idle(monitor, args.wait_idle, log)
    run_mark = monitor.mark()
    other_load: dict[str, float | None] = {}
    core_round_trip: dict[str, tuple[float | None, float | None]] = {}
    sources = gemm_sources(args.threads)  # sets torch's thread count too
    environment = environment_description(args.threads, sources)
    environment["ORT sessions"] = (
        f"feed {args.feed}, intra-op spinning {args.ort_spinning} (session.intra_op.allow_spinning)"
    )
    machine = _cpu_description()
    for key, value in {**machine, **environment}.items():
        log(f"{key}: {value}")

    log("GEMM rates")
    candidates, gemm_rows = measure_gemm_rates(sources, args.config_list, args.quick, bf16_gemm_sources(args.threads))
    for dtype, shape, source, rate in gemm_rows:
        log(f"  {dtype} {shape:>20}: {rate:6.0f} GFLOP/s  {source.split(',')[0]}")

    timings: dict[tuple[str, str], Timing | str] = {}
    limit_ms: dict[str, dict[str, float]] = {}
    limit_rates: dict[str, list[tuple[str, str, float]]] = {}
    for config in args.config_list:
        log(f"config {config.name} {config.describe()}")
        config_mark = monitor.mark()
        trip_before = core_round_trip_ns()
        limit_runner = GemmLimitRunner(candidates[config.dtype])
        runners: dict[str, Runner] = {LIMIT: limit_runner}
        for competitor in args.competitor_list:
            try:
                runners[competitor] = make_runner(
                    competitor, config, args.threads, feed=args.feed, spinning=args.ort_spinning == "on"
                )
                if getattr(runners[competitor], "separate_sessions", False) and SEPARATE not in environment:
                    environment[SEPARATE] = (
                        "onnxruntime ran the gradient op on forward-only runs (only_execute_path_to_fetches "
                        "ignored), so each ORT op has its own session: one pool per op"
                    )
                    log(f"    {SEPARATE}: {environment[SEPARATE]}")
            except Unavailable as reason:
                timings[(competitor, config.name)] = str(reason)
                log(f"    {competitor}: n/a ({reason})")
        for name, timing in time_config(runners, args.repeats, MIN_ROUND_SECONDS, args.max_seconds, log).items():
            if name == LIMIT:
                rated = limit_runner.rates(timing)
                limit_rates[config.name] = [(c.blas, c.shape, rate / 1e9) for c, rate in rated]
                rate = max(rate for _, rate in rated)
                limit_ms[config.name] = {
                    "fwd": 1e3 * config.forward_flops / rate,
                    "bwd": 1e3 * config.backward_flops / rate,
                }
                continue
            timings[(name, config.name)] = timing
            log(
                f"    {name:14} fwd {_ms(timing.median_ms('fwd')):>8} ms  bwd {_ms(timing.median_ms('bwd')):>8} ms"
                f"  fwd+bwd {_ms(timing.median_ms('fwd+bwd')):>8} ms  ({timing.rounds}x{timing.iterations_per_round})"
            )
        limit = limit_ms[config.name]
        best = max(rate for *_, rate in limit_rates[config.name])
        log(f"    {LIMIT:14} fwd {_ms(limit['fwd']):>8} ms  bwd {_ms(limit['bwd']):>8} ms  (at {best:.0f} GFLOP/s)")
        other_load[config.name] = monitor.others_since(config_mark)
        log(f"    other processes' load: {_number(other_load[config.name])} cores")
        core_round_trip[config.name] = (trip_before, core_round_trip_ns())
        trip = " / ".join("n/a" if ns is None else f"{ns:.0f}" for ns in core_round_trip[config.name])
        log(f"    CPU 0-1 round trip before / after: {trip} ns")
        del runners
        gc.collect()

    # Against the run's fastest round trip, so a config that ran wholly in the distant state is "far".
    tag_core_states([timing for timing in timings.values() if isinstance(timing, Timing)])

    memory: dict[tuple[str, str], dict[str, float] | str] = {}
    if not args.no_memory:
        unsupported = peak_memory_supported()
        if unsupported is None:
            log("peak memory of the backward (fresh process per cell)")
            memory = run_memory_probes(args.competitor_list, args.config_list, args.threads, log)
        else:
            log(f"peak memory not measured: {unsupported}")
            memory = {(c, config.name): unsupported for c in args.competitor_list for config in args.config_list}

    other_load["run"] = monitor.others_since(run_mark)
    # --json only says where raw data went; its (often temporary) path does not belong in the docs.
    shown = [arg for i, arg in enumerate(sys.argv[1:]) if arg != "--json" and (i == 0 or sys.argv[i] != "--json")]
    command = "python benchmarks/bench_lstm.py " + " ".join(shown)
    results = Results(
        configs=args.config_list,
        timings=timings,
        limit_ms=limit_ms,
        gemm_rows=gemm_rows,
        limit_rates=limit_rates,
        memory=memory,
        environment=environment,
        machine=machine,
        command=command.strip(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        seconds=time.perf_counter() - started,
        other_load=other_load,
        core_round_trip=core_round_trip,
    )
    report = render_markdown(results)
    print()
    print(report)
    if args.markdown is not None:
        write_markdown(args.markdown, report, args.markdown_section)
        log(f"wrote {args.markdown}")
    if args.json is not None:
        args.json.write_text(json.dumps(_json_payload(results), indent=1))
        log(f"wrote {args.json}")


def _json_payload(results: Results) -> dict[str, Any]:
    return {
        "date": results.date,
        "command": results.command,
        "machine": results.machine,
        "environment": results.environment,
        "limit_rates_gflops": {
            name: [{"blas": blas, "shape": shape, "gflops": rate} for blas, shape, rate in rated]
            for name, rated in results.limit_rates.items()
        },
        "gemm": [{"dtype": d, "shape": s, "source": b, "gflops": r} for d, s, b, r in results.gemm_rows],
        "configs": [dataclasses.asdict(config) for config in results.configs],
        "limit_ms": results.limit_ms,
        "timings_s": {
            f"{competitor}/{config}": timing.phases if isinstance(timing, Timing) else timing
            for (competitor, config), timing in results.timings.items()
        },
        "other_load_cores": results.other_load,
        "core_round_trip_ns": results.core_round_trip,
        "timings_by_core_state_s": {
            f"{competitor}/{config}": timing.states
            for (competitor, config), timing in results.timings.items()
            if isinstance(timing, Timing)
        },
        "memory_mib": {f"{competitor}/{config}": value for (competitor, config), value in results.memory.items()},
    }


if __name__ == "__main__":
    main()
