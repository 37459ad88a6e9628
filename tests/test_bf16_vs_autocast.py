"""The bfloat16 LSTM ops' gradient error against float64, next to torch autocast's (issue 33).

tests/data/bf16_autocast_accuracy.json (benchmarks/bf16_accuracy.py) records autocast's nn.LSTM
gradient errors against float64 on torch-seeded inputs, which cannot be drawn again without torch.
So the ops run the same configurations (shapes, layout 1, sequence lengths) on inputs drawn as torch
draws them, from NumPy seeds: X and the loss weight G standard normal, W, R, B uniform in
+-1/sqrt(H) (nn.LSTM's init), lengths uniform in [1, T] with the first full; the loss is
sum(HAll * G), so grad_HAll = G. The gradients of LSTMTraining + LSTMGrad with "bfloat16" are
compared with the same ops in float64 (relative L2 norm and largest element error over the largest
reference element, autocast's two metrics) and must be no larger than autocast's on the same
gradient (torch's names: input = dX, weight_ih = dW, weight_hh = dR, bias_ih/bias_hh = dB's halves;
_reverse = direction 1). L (128, 64, 512, 512) takes seconds in float64 on two cores: it is left to
benchmarks/bf16_accuracy.py's table (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import op_runner
import pytest
from test_bf16_accuracy_yardstick import _record

_ROWS = ("M", "BI", "M_sequence_lens")


def _gradients(config: str, dtype: type) -> tuple[dict[str, np.ndarray], int]:
    shape = _record()["configs"][config]["shape"]
    T, N, I, H = shape["T"], shape["N"], shape["I"], shape["H"]  # noqa: E741 (the op's dimension names)
    D = 2 if shape["bidirectional"] else 1
    rng = np.random.default_rng(0)
    bound = 1.0 / np.sqrt(H)
    inputs = {
        "X": rng.standard_normal((N, T, I)),
        "W": rng.uniform(-bound, bound, (D, 4 * H, I)),
        "R": rng.uniform(-bound, bound, (D, 4 * H, H)),
        "B": rng.uniform(-bound, bound, (D, 8 * H)),
        "sequence_lens": None,
    }
    if shape["sequence_lens"] is not None:
        lengths = rng.integers(1, T + 1, N).astype(np.int32)
        lengths[0] = T
        inputs["sequence_lens"] = lengths
    inputs = {k: v if v is None or k == "sequence_lens" else v.astype(np.float32) for k, v in inputs.items()}
    grad_hall = rng.standard_normal((N, T, D, H))
    precision = {"matmul_precision": "bfloat16"} if dtype == np.float32 else {}
    attributes = {"hidden_size": H, "layout": 1, "direction": "bidirectional" if D == 2 else "forward", **precision}
    forward = op_runner.run("LSTMTraining", inputs, attributes, dtype=dtype, outputs=["HAll", "CAll", "IOFC"])
    grads = op_runner.run("LSTMGrad", {**inputs, **forward, "grad_HAll": grad_hall}, attributes, dtype=dtype,
                          outputs=["dX", "dW", "dR", "dB"])
    return {name: value.astype(np.float64) for name, value in grads.items()}, H


def _torch_named(grads: dict[str, np.ndarray], hidden: int) -> dict[str, np.ndarray]:
    named = {"input": grads["dX"]}
    for d in range(grads["dW"].shape[0]):
        suffix = "_reverse" if d == 1 else ""
        named["weight_ih_l0" + suffix] = grads["dW"][d]
        named["weight_hh_l0" + suffix] = grads["dR"][d]
        named["bias_ih_l0" + suffix] = grads["dB"][d, : 4 * hidden]
        named["bias_hh_l0" + suffix] = grads["dB"][d, 4 * hidden :]
    return named


def errors(config: str) -> dict[str, dict[str, float]]:
    """The bf16 ops' error per gradient (torch's names) against the float64 ops at ``config``."""
    bf16, hidden = _gradients(config, np.float32)
    exact, _ = _gradients(config, np.float64)
    result = {}
    for name, ref in _torch_named(exact, hidden).items():
        diff = _torch_named(bf16, hidden)[name] - ref
        result[name] = {
            "rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(ref)),
            "max_rel": float(np.abs(diff).max() / np.abs(ref).max()),
        }
    return result


@pytest.mark.parametrize("config", _ROWS)
def test_bf16_gradient_error_is_no_larger_than_autocast(config: str) -> None:
    autocast = _record()["configs"][config]["autocast_bf16"]
    ours = errors(config)
    assert set(ours) == set(autocast)
    for name, metrics in ours.items():
        for metric, value in metrics.items():
            assert value <= autocast[name][metric], f"{config} {name} {metric}: {value:.3g} > autocast's"
            assert value > 1e-4, f"{config} {name} {metric}: {value:.3g}, float32-sized, not bfloat16"
