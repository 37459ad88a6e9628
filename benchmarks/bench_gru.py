"""Times ortlstm's GRUTraining + GRUGrad against torch's nn.GRU and com.microsoft's GRU ops, forward + backward.

At bench_lstm.py's shapes (T, N, I, H), linear_before_reset=1 (what torch exports), float32.
Repetitions are interleaved round-robin over the competitors, so that drift in clock speed or
background load hits all alike; medians and the ratios to ortlstm are printed. Competitors that
are not installed (torch, onnxruntime-training) or refuse a config are ``n/a``. Run it with the
training environment to have all three:

    .venvs/train/bin/python benchmarks/bench_gru.py --threads 1 --configs S M

This script only measures; it never builds or changes the kernels.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import ortlstm.ops
from ortlstm.ops import schema

CONFIGS = {
    "S": (16, 8, 64, 64, "forward"),
    "M": (64, 32, 256, 256, "forward"),
    "L": (128, 64, 512, 512, "forward"),
    "B1": (256, 1, 128, 128, "forward"),
    "M-bidir": (64, 32, 256, 256, "bidirectional"),
}
"""bench_lstm.py's configs: (seq_length, batch_size, input_size, hidden_size, direction)."""


def _pair_model(domain: str, direction: str, hidden: int) -> bytes:
    """GRUTraining then GRUGrad of its outputs (grad_HAll fed), in ``domain``: the f+b of one layer."""
    attributes = {"hidden_size": hidden, "linear_before_reset": 1, "direction": direction}
    forward_inputs = ["X", "W", "R", "B"]
    forward = helper.make_node("GRUTraining", forward_inputs, ["HAll", "Ht", "ZRH"], domain=domain, **attributes)
    grad_inputs = ["X", "W", "R", "B", "", "", "HAll", "ZRH", "grad_HAll"]
    grad_outputs = list(schema.output_names(schema.GRU_GRAD))[:4]  # dX, dW, dR, dB
    grad = helper.make_node("GRUGrad", grad_inputs, grad_outputs, domain=domain, **attributes)
    graph = helper.make_graph(
        [forward, grad],
        "gru_pair",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in [*forward_inputs, "grad_HAll"]],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in grad.output],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
        ir_version=10,
    )
    return model.SerializeToString()


def _feeds(config: tuple[int, int, int, int, str]) -> dict[str, np.ndarray]:
    steps, batch, inputs, hidden, direction = config
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(hidden)
    return {
        "X": rng.standard_normal((steps, batch, inputs)).astype(np.float32),
        "W": (rng.uniform(-scale, scale, (d, 3 * hidden, inputs))).astype(np.float32),
        "R": (rng.uniform(-scale, scale, (d, 3 * hidden, hidden))).astype(np.float32),
        "B": (rng.uniform(-scale, scale, (d, 6 * hidden))).astype(np.float32),
        "grad_HAll": rng.standard_normal((steps, d, batch, hidden)).astype(np.float32),
    }


def _ort_runner(domain: str, config: tuple[int, int, int, int, str], threads: int) -> Callable[[], None] | str:
    options = ortlstm.ops.session_options() if domain == schema.DOMAIN else ort.SessionOptions()
    options.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(
            _pair_model(domain, config[4], config[3]), options, providers=["CPUExecutionProvider"]
        )
        feeds = _feeds(config)
        session.run(None, feeds)
    except Exception as error:  # onnxruntime raises its own types; the reason is reported
        return f"n/a ({str(error).splitlines()[0][:80]})"
    return lambda: session.run(None, feeds)


def _torch_runner(config: tuple[int, int, int, int, str], threads: int) -> Callable[[], None] | str:
    if importlib.util.find_spec("torch") is None:
        return "n/a (torch not installed)"
    import torch

    torch.set_num_threads(threads)
    steps, batch, inputs, hidden, direction = config
    gru = torch.nn.GRU(inputs, hidden, bidirectional=direction == "bidirectional")
    feeds = _feeds(config)
    x = torch.from_numpy(feeds["X"]).requires_grad_(True)
    upstream = torch.from_numpy(feeds["grad_HAll"]).permute(0, 2, 1, 3).reshape(steps, batch, -1)

    def run() -> None:
        y, _ = gru(x)
        y.backward(upstream)

    return run


def main() -> None:
    """The command line: times the chosen configs and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["S", "M", "B1", "M-bidir"], choices=sorted(CONFIGS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"CPU: {platform.processor() or platform.machine()}, threads {args.threads}, onnxruntime {ort.__version__}")
    for name in args.configs:
        config = CONFIGS[name]
        runners = {
            "ortlstm": _ort_runner(schema.DOMAIN, config, args.threads),
            "com.microsoft": _ort_runner("com.microsoft", config, args.threads),
            "torch": _torch_runner(config, args.threads),
        }
        print(f"{name} {config}: " + interleaved(runners, args.rounds))


def interleaved(runners: dict[str, Callable[[], None] | str], rounds: int) -> str:
    """Times the callable runners round-robin (one warm-up call each); their medians and ratios to ortlstm."""
    times: dict[str, list[float]] = {key: [] for key, runner in runners.items() if callable(runner)}
    for key in times:  # warm up: first-call allocations and thread start-up are not timed
        runners[key]()  # type: ignore[operator]
    for round_index in range(rounds):
        order = list(times)
        order = order[round_index % len(order) :] + order[: round_index % len(order)]
        for key in order:
            start = time.perf_counter()
            runners[key]()  # type: ignore[operator]
            times[key].append(time.perf_counter() - start)
    medians = {key: statistics.median(values) for key, values in times.items()}
    base = medians.get("ortlstm")
    cells = []
    for key, runner in runners.items():
        if key in medians:
            ratio = f" ({medians[key] / base:.2f}x ortlstm)" if base and key != "ortlstm" else ""
            cells.append(f"{key} {medians[key] * 1e3:.2f} ms{ratio}")
        else:
            cells.append(f"{key} {runner}")
    return "; ".join(cells)


if __name__ == "__main__":
    main()
