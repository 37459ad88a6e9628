"""Tests of the command line, ``ortlstm`` / ``python -m ortlstm``, run as a user runs it.

Every command runs in a subprocess of this interpreter (``sys.executable -m ortlstm``) from a
temporary directory, so the checkout's ``ortlstm/`` directory cannot shadow the installed
package. Covered: ``--version``, ``--help``, ``convert`` (a hand-built model, and the error
path), ``artifacts`` (the install hint without the training build, the four files with it) and
``demo`` (one short epoch, training build only).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from ortlstm.ops import schema, session_options

import ortlstm

HAS_TRAINING = importlib.util.find_spec("onnxruntime.training") is not None
TRAINING_REASON = "needs onnxruntime-training (onnxruntime.training): pip install 'ortlstm[train]'"
needs_training = pytest.mark.skipif(not HAS_TRAINING, reason=TRAINING_REASON)

OPSET = 21
IR_VERSION = 10  # onnxruntime-training 1.19 loads IR <= 10
SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE, HIDDEN_SIZE = 3, 2, 4, 5
COMMAND_TIMEOUT = 300  # seconds; the demo takes about 20


def ortlstm_cli(*args: str | Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m ortlstm ARGS`` with this interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "ortlstm", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def lstm_model(path: Path, rng: np.random.Generator) -> onnx.ModelProto:
    """X -> bidirectional ONNX LSTM (W, R, B initializers) -> Y_h, written to ``path``."""
    weights = {
        "W": 0.5 * rng.standard_normal((2, 4 * HIDDEN_SIZE, INPUT_SIZE)),
        "R": 0.5 * rng.standard_normal((2, 4 * HIDDEN_SIZE, HIDDEN_SIZE)),
        "B": 0.3 * rng.standard_normal((2, 8 * HIDDEN_SIZE)),
    }
    node = helper.make_node(
        "LSTM", ["X", "W", "R", "B"], ["", "Y_h"], name="lstm", hidden_size=HIDDEN_SIZE, direction="bidirectional"
    )
    graph = helper.make_graph(
        [node],
        "lstm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE])],
        [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [2, BATCH_SIZE, HIDDEN_SIZE])],
        [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.save(model, str(path))
    return model


def no_lstm_model(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION), str(path)
    )


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr[-4000:]}"


# ---------------------------------------------------------------------------------------------
# --version, --help, the console script


def test_version(tmp_path: Path) -> None:
    result = ortlstm_cli("--version", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert result.stdout.strip() == f"ortlstm {ortlstm.__version__}"


def test_help_lists_the_commands(tmp_path: Path) -> None:
    result = ortlstm_cli("--help", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert result.stdout.startswith("usage: ortlstm")
    for command in ("demo", "convert", "artifacts"):
        assert re.search(rf"^\s+{command}\s", result.stdout, re.MULTILINE), f"{command} missing:\n{result.stdout}"


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    result = ortlstm_cli(cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert "usage: ortlstm" in result.stderr
    assert "required" in result.stderr


def test_console_script_runs_main() -> None:
    """``ortlstm`` on PATH is the same entry point as ``python -m ortlstm``."""
    scripts = importlib.metadata.entry_points(group="console_scripts", name="ortlstm")
    assert [script.value for script in scripts] == ["ortlstm.__main__:main"]


# ---------------------------------------------------------------------------------------------
# convert


def test_convert_writes_a_model_that_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    original = lstm_model(tmp_path / "in.onnx", rng)
    result = ortlstm_cli("convert", "in.onnx", "out.onnx", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert "out.onnx: 1 LSTM node(s)" in result.stdout

    converted = onnx.load(str(tmp_path / "out.onnx"))
    assert [(node.op_type, node.domain) for node in converted.graph.node] == [
        (schema.LSTM_TRAINING.name, schema.DOMAIN)
    ]
    onnx.checker.check_model(converted, full_check=True)
    x = rng.standard_normal((SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE)).astype(np.float32)
    (expected,) = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x}
    )
    session = ort.InferenceSession(str(tmp_path / "out.onnx"), session_options(), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {"X": x})
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_convert_without_lstm_fails_with_message(tmp_path: Path) -> None:
    no_lstm_model(tmp_path / "in.onnx")
    result = ortlstm_cli("convert", "in.onnx", "out.onnx", cwd=tmp_path)
    assert result.returncode == 1, describe(result)
    assert result.stderr.startswith("ortlstm convert: error: the model has no ONNX LSTM node"), describe(result)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "out.onnx").exists()


def test_convert_missing_input_fails_with_message(tmp_path: Path) -> None:
    result = ortlstm_cli("convert", "missing.onnx", "out.onnx", cwd=tmp_path)
    assert result.returncode == 1, describe(result)
    assert result.stderr.startswith("ortlstm convert: error:"), describe(result)
    assert "missing.onnx" in result.stderr, describe(result)
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# artifacts

# The training environment has no inference-only onnxruntime, so there the command runs with
# onnxruntime.training hidden, the way the inference package lacks it.
_WITHOUT_TRAINING = (
    "import sys; sys.modules['onnxruntime.training'] = None; sys.argv[0] = 'ortlstm'; "
    "from ortlstm.__main__ import main; sys.exit(main())"
)


def test_artifacts_without_training_build_says_what_to_install(tmp_path: Path) -> None:
    lstm_model(tmp_path / "model.onnx", np.random.default_rng(7))
    args = ["artifacts", "model.onnx", "out", "--loss", "MSELoss"]
    if HAS_TRAINING:
        command = [sys.executable, "-c", _WITHOUT_TRAINING, *args]
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    else:
        result = ortlstm_cli(*args, cwd=tmp_path)
    assert result.returncode == 1, describe(result)
    assert result.stderr.startswith("ortlstm artifacts: error:"), describe(result)
    assert "Install the training build" in result.stderr, describe(result)
    assert "pip install 'ortlstm[train]'" in result.stderr, describe(result)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@needs_training
def test_artifacts_writes_the_four_files(tmp_path: Path) -> None:
    lstm_model(tmp_path / "model.onnx", np.random.default_rng(7))
    result = ortlstm_cli("artifacts", "model.onnx", "out", "--loss", "MSELoss", "--optimizer", "SGD", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    names = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")
    assert result.stdout.split() == [str(Path("out") / name) for name in names]
    for name in names:
        assert (tmp_path / "out" / name).exists(), name
    training = onnx.load(str(tmp_path / "out" / "training_model.onnx"))
    assert training.ir_version <= IR_VERSION
    assert sum(node.op_type == schema.LSTM_GRAD.name for node in training.graph.node) == 1


# ---------------------------------------------------------------------------------------------
# demo


@needs_training
def test_demo_one_epoch(tmp_path: Path) -> None:
    """The whole user path at a small size: export, convert, artifacts, train one epoch, plot."""
    pytest.importorskip("torch")  # the training environment also has the demo's scikit-learn and matplotlib
    plot = tmp_path / "curves.png"
    result = ortlstm_cli(
        "demo", "--epochs", "1", "--hidden-size", "16", "--plot", plot, cwd=tmp_path, timeout=COMMAND_TIMEOUT
    )
    assert result.returncode == 0, describe(result)
    match = re.search(r"^held-out accuracy: (\d+\.\d)% \(\d+ s\)$", result.stdout, re.MULTILINE)
    assert match, describe(result)
    assert 0.0 <= float(match[1]) <= 100.0
    assert re.search(r"^epoch  1: train accuracy \d+\.\d%, held-out accuracy \d+\.\d%$", result.stdout, re.MULTILINE)
    assert f"loss and accuracy curves: {plot}" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
