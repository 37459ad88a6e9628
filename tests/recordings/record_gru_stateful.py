"""Records truncated BPTT in PyTorch (GRU, GRU+LSTM, RNN) for tests/test_gru_stateful.py to replay without torch.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_gru_stateful.py

Each case: a recurrent net (a 2-layer ``nn.GRU``; a bidirectional ``nn.GRU`` feeding an ``nn.LSTM``,
batch_first; a 2-layer relu ``nn.RNN``, batch_first) with a Linear head on every step's output, exported
by torch.onnx.export's default (dynamo, optimize=True; the RNN by TorchScript, as dynamo unrolls it into
ops whose state no node carries) without an initial state, then trained in torch on consecutive chunks as torch users
write truncated BPTT: each chunk starts from the last chunk's final states, ``detach()``-ed, and the
state is dropped (``None``: zeros) before step ``RESET_BEFORE`` as at an epoch's start. Written in
record_gru.py's format (model, config, batch/<step>/<input>, losses, param/<onnx name> after every
step) plus ``state/<step>/<k>``: the k-th carried state after each step (each recurrent layer in graph
order; a GRU its h, an LSTM its h then c; [num_directions, batch, hidden]).

Seeded; an unchanged recording is left as it is (``write_unless_unchanged``).
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from record_gru import _zrh, export, initializer_pairs, random_batches  # noqa: E402
from record_training import write_unless_unchanged  # noqa: E402

SEED = 20261128
STEPS, RESET_BEFORE = 5, 3
BATCH, LENGTH, FEATURES, HIDDEN, OUTPUTS = 3, 4, 3, 4, 2
OUTPUT_DIR = HERE / "gru_stateful"

CASES: list[dict[str, Any]] = [
    {"name": "gru2", "batch_first": False, "optimizer": {"name": "SGD", "kwargs": {"lr": 0.3, "momentum": 0.9}}},
    {"name": "bigru_lstm", "batch_first": True, "optimizer": {"name": "Adam", "kwargs": {"lr": 0.02}}},
    {
        "name": "rnn2",
        "batch_first": True,
        "optimizer": {"name": "SGD", "kwargs": {"lr": 0.1, "momentum": 0.9}},
        "exporter": "torchscript",  # dynamo unrolls nn.RNN: no RNN node whose state could be carried
    },
]


class Net(torch.nn.Module):
    """``gru2``: a 2-layer GRU; ``bigru_lstm``: a bidirectional GRU, then an LSTM; ``rnn2``: a 2-layer relu RNN.

    A Linear head on each step.
    """

    def __init__(self, name: str, batch_first: bool) -> None:
        super().__init__()
        if name == "gru2":
            self.rnns = torch.nn.ModuleList([torch.nn.GRU(FEATURES, HIDDEN, num_layers=2, batch_first=batch_first)])
        elif name == "rnn2":
            rnn = torch.nn.RNN(FEATURES, HIDDEN, num_layers=2, nonlinearity="relu", batch_first=batch_first)
            self.rnns = torch.nn.ModuleList([rnn])
        else:
            self.rnns = torch.nn.ModuleList(
                [
                    torch.nn.GRU(FEATURES, HIDDEN, bidirectional=True, batch_first=batch_first),
                    torch.nn.LSTM(2 * HIDDEN, HIDDEN, batch_first=batch_first),
                ]
            )
        self.head = torch.nn.Linear(HIDDEN, OUTPUTS)
        self.final: list[Any] = []

    def forward(self, x: torch.Tensor, states: list[Any] | None = None) -> torch.Tensor:
        self.final = []
        for index, rnn in enumerate(self.rnns):
            x, final = rnn(x, None if states is None else states[index])
            self.final.append(final)
        return self.head(x)


def _ifgo_to_iofc(stacked: np.ndarray) -> np.ndarray:
    """torch's LSTM gate order i, f, g, o -> ONNX LSTM's i, o, f, c (first axis)."""
    i, f, g, o = np.split(stacked, 4)
    return np.concatenate([i, o, f, g])


def _same(stacked: np.ndarray) -> np.ndarray:
    """nn.RNN's weights are ONNX RNN's as they are (one gate)."""
    return stacked


def onnx_values(net: Net) -> dict[str, tuple[np.ndarray, str]]:
    """Every tensor the export may hold for the torch parameters: each one, ONNX-layout W, R, B of each layer."""
    params = {name: value.detach().numpy() for name, value in net.named_parameters()}
    values = {name: (value, name) for name, value in params.items()}
    for index, rnn in enumerate(net.rnns):
        order = _zrh if isinstance(rnn, torch.nn.GRU) else _ifgo_to_iofc if isinstance(rnn, torch.nn.LSTM) else _same
        suffixes = ("", "_reverse") if rnn.bidirectional else ("",)
        for layer in range(rnn.num_layers):
            key = f"rnns.{index}.{{}}_l{layer}{{}}"
            for kind, onnx_name in (("weight_ih", "W"), ("weight_hh", "R")):
                names = [key.format(kind, suffix) for suffix in suffixes]
                values[f"{onnx_name}{index}.{layer}"] = (np.stack([order(params[n]) for n in names]), ", ".join(names))
            biases = [(key.format("bias_ih", suffix), key.format("bias_hh", suffix)) for suffix in suffixes]
            values[f"B{index}.{layer}"] = (
                np.stack([np.concatenate([order(params[i]), order(params[h])]) for i, h in biases]),
                ", ".join(name for pair in biases for name in pair),
            )
    values["head.weight^T"] = (params["head.weight"].T.copy(), "head.weight")
    return values


def carried(net: Net) -> list[np.ndarray]:
    """The final states in the order the test reads them: each layer's h (an LSTM's h, c), [D, N, H] each."""
    states = []
    for rnn, final in zip(net.rnns, net.final, strict=True):
        parts = final if isinstance(final, tuple) else (final,)
        directions = 2 if rnn.bidirectional else 1
        for layer in range(rnn.num_layers):
            states.extend(part[layer * directions : (layer + 1) * directions].detach().numpy().copy() for part in parts)
    return states


def record(case: dict[str, Any]) -> tuple[str, dict[str, np.ndarray]]:
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    net = Net(case["name"], case["batch_first"])
    shape = (BATCH, LENGTH) if case["batch_first"] else (LENGTH, BATCH)
    batches = random_batches(rng, shape, FEATURES, OUTPUTS, STEPS)
    model = export(net, torch.from_numpy(batches[0]["x"]), case.get("exporter", "dynamo"))  # type: ignore[arg-type]
    values = onnx_values(net)
    pairs = initializer_pairs(model, values)
    optimizer = getattr(torch.optim, case["optimizer"]["name"])(net.parameters(), **case["optimizer"]["kwargs"])
    arrays: dict[str, np.ndarray] = {"model": np.frombuffer(model.SerializeToString(), dtype=np.uint8)}
    losses, trajectories = [], {name: [] for name in pairs}
    states = None
    for step, batch in enumerate(batches):
        for key, value in batch.items():
            arrays[f"batch/{step}/{key}"] = value
        if step == RESET_BEFORE:
            states = None  # a new epoch: the trainer's reset_state()
        optimizer.zero_grad()
        prediction = net(torch.from_numpy(batch["x"]), states)
        loss = torch.nn.functional.mse_loss(prediction, torch.from_numpy(batch["target"]))
        loss.backward()
        optimizer.step()
        states = [
            tuple(part.detach() for part in final) if isinstance(final, tuple) else final.detach()
            for final in net.final
        ]
        losses.append(loss.item())
        for index, state in enumerate(carried(net)):
            arrays[f"state/{step}/{index}"] = state
        now = onnx_values(net)
        for name, key in pairs.items():
            trajectories[name].append(now[key][0].copy())
    arrays["losses"] = np.asarray(losses, dtype=np.float64)
    for name, trajectory in trajectories.items():
        arrays[f"param/{name}"] = np.stack(trajectory)
    name = f"{case['name']}-{'batch_first' if case['batch_first'] else 'seq_first'}-{case['optimizer']['name']}"
    config = {
        "scenario": case["name"],
        "optimizer": case["optimizer"],
        "loss": "mse",
        "steps": STEPS,
        "reset_before": RESET_BEFORE,
        "trainable": sorted(pairs),
        "parameters": len(list(net.parameters())),
        "sources": {name: values[key][1] for name, key in pairs.items()},
        "states": len(carried(net)),
        "torch": torch.__version__,
    }
    arrays["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    return name, arrays


def main() -> None:
    OUTPUT_DIR.mkdir(exist_ok=True)
    for case in CASES:
        name, arrays = record(case)
        write_unless_unchanged(OUTPUT_DIR / f"{name}.npz", arrays)


if __name__ == "__main__":
    main()
