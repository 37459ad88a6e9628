"""Times ortlstm's RNNTraining + RNNGrad against torch's nn.RNN, forward + backward, tanh and relu.

At bench_lstm.py's shapes (T, N, I, H), float32, one layer fed grad_HAll (HAll is the loss's only
input, as a layer inside a stack sees it). There is no com.microsoft RNN training op. Repetitions
are interleaved round-robin (bench_gru.py's loop); medians and the ratios to ortlstm are printed.
Run it with the training environment to have torch:

    .venvs/train/bin/python benchmarks/bench_rnn.py --threads 1 --configs S M

This script only measures; it never builds or changes the kernels.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from bench_gru import CONFIGS, interleaved
from onnx import TensorProto, helper

import ortlstm.ops
from ortlstm.ops import schema

ACTIVATIONS = {"tanh": "Tanh", "relu": "Relu"}
"""torch's nonlinearity -> ONNX RNN's activation."""


def _pair_model(direction: str, hidden: int, activation: str) -> bytes:
    """RNNTraining then RNNGrad of its outputs (grad_HAll fed): the f+b of one layer."""
    d = 2 if direction == "bidirectional" else 1
    attributes = {"hidden_size": hidden, "direction": direction, "activations": [activation] * d}
    attributes = ortlstm.ops.lstm_attributes(**attributes)
    forward_inputs = ["X", "W", "R", "B"]
    forward = helper.make_node("RNNTraining", forward_inputs, ["HAll", "Ht"], domain=schema.DOMAIN, **attributes)
    grad_inputs = ["X", "W", "R", "B", "", "", "HAll", "grad_HAll"]
    grad_outputs = list(schema.output_names(schema.RNN_GRAD))[:4]  # dX, dW, dR, dB
    grad = helper.make_node("RNNGrad", grad_inputs, grad_outputs, domain=schema.DOMAIN, **attributes)
    graph = helper.make_graph(
        [forward, grad],
        "rnn_pair",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in [*forward_inputs, "grad_HAll"]],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in grad.output],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(schema.DOMAIN, 1)], ir_version=10
    )
    return model.SerializeToString()


def _feeds(config: tuple[int, int, int, int, str]) -> dict[str, np.ndarray]:
    steps, batch, inputs, hidden, direction = config
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(hidden)  # torch's init: activations stay in range, relu does not blow up
    return {
        "X": rng.standard_normal((steps, batch, inputs)).astype(np.float32),
        "W": (rng.uniform(-scale, scale, (d, hidden, inputs))).astype(np.float32),
        "R": (rng.uniform(-scale, scale, (d, hidden, hidden))).astype(np.float32),
        "B": (rng.uniform(-scale, scale, (d, 2 * hidden))).astype(np.float32),
        "grad_HAll": rng.standard_normal((steps, d, batch, hidden)).astype(np.float32),
    }


def _ort_runner(config: tuple[int, int, int, int, str], nonlinearity: str, threads: int) -> Callable[[], None]:
    options = ortlstm.ops.session_options()
    options.intra_op_num_threads = threads
    model = _pair_model(config[4], config[3], ACTIVATIONS[nonlinearity])
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = _feeds(config)
    return lambda: session.run(None, feeds)


def _torch_runner(config: tuple[int, int, int, int, str], nonlinearity: str, threads: int) -> Callable[[], None] | str:
    if importlib.util.find_spec("torch") is None:
        return "n/a (torch not installed)"
    import torch

    torch.set_num_threads(threads)
    steps, batch, inputs, hidden, direction = config
    rnn = torch.nn.RNN(inputs, hidden, nonlinearity=nonlinearity, bidirectional=direction == "bidirectional")
    feeds = _feeds(config)
    x = torch.from_numpy(feeds["X"]).requires_grad_(True)
    upstream = torch.from_numpy(feeds["grad_HAll"]).permute(0, 2, 1, 3).reshape(steps, batch, -1)

    def run() -> None:
        y, _ = rnn(x)
        y.backward(upstream)

    return run


def main() -> None:
    """Times the configs and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["S", "M", "B1", "M-bidir"], choices=sorted(CONFIGS))
    parser.add_argument("--nonlinearity", nargs="+", default=["tanh", "relu"], choices=sorted(ACTIVATIONS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"CPU: {platform.processor() or platform.machine()}, threads {args.threads}, onnxruntime {ort.__version__}")
    for name in args.configs:
        for nonlinearity in args.nonlinearity:
            config = CONFIGS[name]
            runners = {
                "ortlstm": _ort_runner(config, nonlinearity, args.threads),
                "torch": _torch_runner(config, nonlinearity, args.threads),
            }
            print(f"{name} {nonlinearity} {config}: " + interleaved(runners, args.rounds))


if __name__ == "__main__":
    main()
