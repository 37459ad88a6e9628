"""``ortlstm demo-chars`` end to end on a short run: stateful truncated BPTT over streams of text.

Checks: the loss falls below the uniform distribution's (log of the vocabulary size) within a few
dozen windows, the held-out loss is measured, the exported model (standard ops only) samples text
in onnxruntime without the ortlstm library, starting with each prompt, and the command prints it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ortlstm import char_lm
from ortlstm.__main__ import main


def test_a_short_run_learns_and_the_exported_model_samples(tmp_path: Path) -> None:
    output = tmp_path / "chars.onnx"
    result = char_lm.run_char_lm(
        steps=40, seq_length=16, streams=8, hidden_size=32, embedding_size=8, learning_rate=0.02, output=output
    )
    uniform = math.log(len(char_lm.VOCABULARY))
    assert len(result.train_losses) == 40
    assert result.train_losses[0] == pytest.approx(uniform, abs=0.3)  # torch-style init: near uniform
    assert np.mean(result.train_losses[-10:]) < uniform - 1.0
    assert result.validation_loss < uniform - 1.0
    assert [text[:4] for text in result.samples] == ["The ", "def "]
    assert all(len(text) == 4 + 160 and set(text) <= set(char_lm.VOCABULARY) for text in result.samples)
    assert result.model == output
    assert output.is_file()


def test_the_command_prints_the_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "chars.onnx"
    args = ["demo-chars", "--steps", "3", "--seq-length", "8", "--streams", "4", "--hidden-size", "8"]
    assert main([*args, "--out", str(output)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("--- sample") == 2
    assert f"trained model: {output}" in printed
