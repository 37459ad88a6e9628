"""Times the CTC loss, forward and forward + backward: ortlstm's CTCLoss/CTCLossGrad against PyTorch.

Competitors, one process, the same log_probs, targets and lengths, the same thread count:

- **ortlstm**: one onnxruntime session per config running CTCLoss, the 'mean' reduction in
  standard ops and, for forward + backward, CTCLossGrad seeded with that reduction's gradient
  (the graph tests/test_ctc.py checks against torch); fed and answered with OrtValues, so no
  tensor is copied to or from numpy;
- **torch**: ``F.ctc_loss(log_probs, ..., reduction='mean')`` and ``.backward()`` on CPU
  (``torch.set_num_threads``), the gradient with respect to log_probs.

Rounds are interleaved (the first competitor alternating); medians of per-call times are reported
with the ratio ortlstm / torch (below 1: ortlstm is faster), and the CPU. Runs in the training
environment, which has torch and an onnxruntime that loads the library:

    .venvs/train/bin/python benchmarks/bench_ctc.py

Without torch only ortlstm is timed. It only measures; it never builds the kernels.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import pathlib
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import ortlstm.ops
from ortlstm.ops import schema


@dataclasses.dataclass(frozen=True)
class Config:
    """One size: T steps, N samples, C classes (blank included), S padded target width."""

    name: str
    T: int
    N: int
    C: int
    S: int


CONFIGS = (
    Config("chinese_charset", 100, 32, 6000, 25),
    Config("small_charset", 50, 64, 100, 20),
)


def _inputs(config: Config, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(config.T, config.N, config.C)).astype(np.float32)
    log_probs = logits - np.log(np.exp(logits).sum(axis=2, keepdims=True))
    target_lengths = rng.integers(config.S // 2, config.S + 1, size=config.N)
    targets = rng.integers(1, config.C, size=(config.N, config.S))
    return {
        "log_probs": log_probs.astype(np.float32),
        "targets": targets.astype(np.int64),
        "input_lengths": np.full(config.N, config.T, np.int64),
        "target_lengths": target_lengths.astype(np.int64),
    }


def _session(backward: bool, threads: int) -> ort.InferenceSession:
    """CTCLoss, ReduceMean(loss / Max(target_lengths, 1)) and, with ``backward``, CTCLossGrad."""
    ports = {name: name for name in ("log_probs", "targets", "input_lengths", "target_lengths")}
    nodes = [
        ortlstm.ops.make_node("CTCLoss", ports, {"loss": "loss", "log_alpha": "log_alpha" if backward else ""}),
        helper.make_node("Cast", ["target_lengths"], ["lengths_float"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.FLOAT, [], [1])),
        helper.make_node("Max", ["lengths_float", "one"], ["divisor"]),
        helper.make_node("Div", ["loss", "divisor"], ["per_label"]),
        helper.make_node("ReduceMean", ["per_label"], ["objective"], keepdims=0),
    ]
    outputs = [helper.make_tensor_value_info("objective", TensorProto.FLOAT, [])]
    if backward:
        nodes += [
            helper.make_node("Shape", ["loss"], ["batch"]),
            helper.make_node("Cast", ["batch"], ["batch_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["divisor", "batch_float"], ["scaled_divisor"]),
            helper.make_node("Reciprocal", ["scaled_divisor"], ["grad_loss"]),
            ortlstm.ops.make_node(
                "CTCLossGrad",
                {**ports, "grad_loss": "grad_loss", "loss": "loss", "log_alpha": "log_alpha"},
                {"grad_log_probs": "grad_log_probs"},
            ),
        ]
        outputs.append(helper.make_tensor_value_info("grad_log_probs", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "ctc",
        [
            helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, None),
            *(helper.make_tensor_value_info(name, TensorProto.INT64, None) for name in list(ports)[1:]),
        ],
        outputs,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION)],
        ir_version=10,
    )
    options = ortlstm.ops.session_options(intra_op_num_threads=threads, inter_op_num_threads=1)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _ortlstm_call(inputs: dict[str, np.ndarray], backward: bool, threads: int) -> Callable[[], object]:
    session = _session(backward, threads)
    # OrtValues in and out: no copy of log_probs or its gradient (77 MB each at C = 6000) between numpy and
    # onnxruntime, which a train step, where both stay inside the graph, does not pay either.
    feeds = {name: ort.OrtValue.ortvalue_from_numpy(value) for name, value in inputs.items()}
    return lambda: session.run_with_ort_values(None, feeds)


def _torch_call(inputs: dict[str, np.ndarray], backward: bool, threads: int) -> Callable[[], object] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    log_probs = torch.from_numpy(inputs["log_probs"]).requires_grad_(backward)
    targets, input_lengths, target_lengths = (
        torch.from_numpy(inputs[name]) for name in ("targets", "input_lengths", "target_lengths")
    )

    def call() -> object:
        with torch.set_grad_enabled(backward):
            loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction="mean")
            if backward:
                loss.backward()
                log_probs.grad = None
            return loss.item()

    return call


def _time(call: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _cpu() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    """Runs every config and prints a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds per config")
    parser.add_argument("--calls", type=int, default=5, help="timed calls per competitor and round")
    args = parser.parse_args()
    versions = f"onnxruntime {ort.__version__}"
    if importlib.util.find_spec("torch") is not None:
        import torch

        versions += f", torch {torch.__version__}"
    print(f"CPU: {_cpu()}; threads: {args.threads}; {versions}; medians of {args.rounds}x{args.calls} calls\n")
    print("| config (T, N, C, S) | pass | ortlstm ms | torch ms | ortlstm / torch |")
    print("|---|---|---|---|---|")
    for config in CONFIGS:
        inputs = _inputs(config)
        for backward in (False, True):
            calls = {
                "ortlstm": _ortlstm_call(inputs, backward, args.threads),
                "torch": _torch_call(inputs, backward, args.threads),
            }
            present = {name: call for name, call in calls.items() if call is not None}
            for call in present.values():  # warm-up: sessions, arenas, torch's first dispatch
                _time(call, 2)
            times: dict[str, list[float]] = {name: [] for name in present}
            for round_index in range(args.rounds):
                order = list(present) if round_index % 2 == 0 else list(reversed(present))
                for name in order:
                    times[name] += _time(present[name], args.calls)
            medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
            torch_ms = medians.get("torch")
            ratio = f"{medians['ortlstm'] / torch_ms:.2f}" if torch_ms else "n/a"
            torch_text = f"{torch_ms:.2f}" if torch_ms else "n/a"
            sizes = f"{config.name} ({config.T}, {config.N}, {config.C}, {config.S})"
            stage = "forward + backward" if backward else "forward"
            print(f"| {sizes} | {stage} | {medians['ortlstm']:.2f} | {torch_text} | {ratio} |")


if __name__ == "__main__":
    main()
