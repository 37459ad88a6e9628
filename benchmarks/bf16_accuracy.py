"""The accuracy yardstick of issue 33: torch autocast's bf16 nn.LSTM gradients against float64.

For each configuration (M, L, BI; layout 1 i.e. batch_first; M with sequence lengths through a
packed sequence) the same inputs and weights run nn.LSTM forward and backward three ways: float64
(the reference), float32, and float32 under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (what a
PyTorch user on a bf16 CPU runs: oneDNN's bf16 RNN, float32 parameters). The loss is
``(y.double() * G).sum()`` with a fixed random float64 G, so every output element gets its own gradient.
For each gradient (the input's and each parameter's, torch's names) it records the error against
float64: the relative L2 norm ``||g - g64|| / ||g64||`` and the largest element error over the
largest reference element ``max|g - g64| / max|g64|``.

The result, tests/data/bf16_autocast_accuracy.json, is what the bfloat16 ops are held to without
torch (issue 33: "no larger error than autocast"; tests/test_bf16_accuracy_yardstick.py reads it).
torch's parameters map to the ONNX LSTM's as torch.onnx.export maps them: W = weight_ih with the gate
blocks i, f, g, o reordered to i, o, f, c; R likewise from weight_hh; B = [bias_ih, bias_hh], reordered.
Peepholes: nn.LSTM has none (n/a). Usage, in the train venv (torch):
    python benchmarks/bf16_accuracy.py [--out tests/data/bf16_autocast_accuracy.json] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

CONFIGS = {
    # name: (T, N, I, H, bidirectional, with sequence lengths)
    "M": (64, 32, 256, 256, False, False),
    "L": (128, 64, 512, 512, False, False),
    "BI": (64, 32, 256, 256, True, False),
    "M_sequence_lens": (64, 32, 256, 256, False, True),
}
SEED = 0


def gradients(torch, lstm, x, lengths, weight, dtype, autocast: bool) -> dict:  # noqa: ANN001
    """The input's and parameters' gradients of (y * weight).sum() for a copy of ``lstm`` in ``dtype``."""
    import copy

    module = copy.deepcopy(lstm).to(dtype)
    inputs = x.detach().to(dtype).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if lengths is None:
            y, _ = module(inputs)
        else:
            packed = torch.nn.utils.rnn.pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
            y, _ = torch.nn.utils.rnn.pad_packed_sequence(module(packed)[0], batch_first=True,
                                                          total_length=x.shape[1])
    loss = (y.double() * weight).sum()  # the same float64 G for every run; dL/dy reaches y in y's dtype
    loss.backward()
    out = {"input": inputs.grad.detach().double()}
    out.update({name: p.grad.detach().double() for name, p in module.named_parameters()})
    return out


def errors(torch, got: dict, reference: dict) -> dict:  # noqa: ANN001
    """Relative L2 and max-element errors of each gradient."""
    result = {}
    for name, ref in reference.items():
        diff = got[name] - ref
        result[name] = {
            "rel_l2": float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref)),
            "max_rel": float(diff.abs().max() / ref.abs().max()),
        }
    return result


def main() -> None:
    """Measures every configuration and writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/bf16_autocast_accuracy.json"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    flags = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")][:1]
    cpu_flags = set(flags[0].split(":", 1)[1].split()) if flags else set()
    results: dict = {
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_bf16_flags": sorted(cpu_flags & {"avx512_bf16", "amx_bf16", "amx_tile"}),
        "loss": "(y.double() * G).sum(), G standard normal float64 (seed 0)",
        "layout": 1,
        "configs": {},
    }
    for name in args.configs:
        t, n, i, h, bidirectional, with_lengths = CONFIGS[name]
        torch.manual_seed(SEED)
        lstm = torch.nn.LSTM(i, h, batch_first=True, bidirectional=bidirectional)
        x = torch.randn(n, t, i)
        weight = torch.randn(n, t, h * (2 if bidirectional else 1), dtype=torch.float64)
        lengths = torch.randint(1, t + 1, (n,)) if with_lengths else None
        if lengths is not None:
            lengths[0] = t
        reference = gradients(torch, lstm, x, lengths, weight, torch.float64, autocast=False)
        float32 = gradients(torch, lstm, x, lengths, weight, torch.float32, autocast=False)
        autocast = gradients(torch, lstm, x, lengths, weight, torch.float32, autocast=True)
        results["configs"][name] = {
            "shape": {"T": t, "N": n, "I": i, "H": h, "bidirectional": bidirectional,
                      "sequence_lens": lengths.tolist() if lengths is not None else None},
            "autocast_bf16": errors(torch, autocast, reference),
            "float32": errors(torch, float32, reference),
        }
        worst = max(v["rel_l2"] for v in results["configs"][name]["autocast_bf16"].values())
        print(f"{name}: autocast bf16 worst rel L2 {worst:.3g}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
