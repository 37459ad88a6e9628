"""The recorded accuracy yardstick of issue 33 (benchmarks/bf16_accuracy.py, torch in the train venv).

tests/data/bf16_autocast_accuracy.json holds, per configuration (M, L, BI, M with sequence lengths;
layout 1), the error against float64 of torch autocast's bf16 nn.LSTM gradients and of float32's.
The bfloat16 LSTM ops are held to it without torch in test_bf16_vs_autocast.py; this checks that
the record is complete and says what it should: autocast's errors are bfloat16-sized (well above
float32's, at most a few 2^-8), on every gradient.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "bf16_autocast_accuracy.json"
CONFIGS = ("M", "L", "BI", "M_sequence_lens")


def _record() -> dict:
    return json.loads(DATA.read_text())


def autocast_error(config: str, gradient: str, metric: str = "rel_l2") -> float:
    """Autocast's error on ``gradient`` (torch's name, or "input") at ``config``: what a bf16 op must not exceed."""
    return float(_record()["configs"][config]["autocast_bf16"][gradient][metric])


@pytest.mark.parametrize("config", CONFIGS)
def test_record_is_complete_and_bfloat16_sized(config: str) -> None:
    entry = _record()["configs"][config]
    names = {"input", "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"}
    if entry["shape"]["bidirectional"]:
        names |= {name + "_reverse" for name in names - {"input"}}
    assert set(entry["autocast_bf16"]) == names == set(entry["float32"])
    assert (entry["shape"]["sequence_lens"] is not None) == config.endswith("sequence_lens")
    for name in names:
        bf16, f32 = entry["autocast_bf16"][name]["rel_l2"], entry["float32"][name]["rel_l2"]
        assert 10 * f32 < bf16 < 16 * 2.0**-8, (name, bf16, f32)
        assert autocast_error(config, name) == bf16
