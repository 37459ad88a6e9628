"""Tests of the command line, ``ortlstm`` / ``python -m ortlstm``, run as a user runs it.

Every command runs in a subprocess of this interpreter (``sys.executable -m ortlstm``) from a
temporary directory. Covered: ``--version``, ``--help``, ``convert`` (a hand-built model, and the error
path), ``train-step`` and ``export`` (the plain-onnxruntime training directory, trained by the
Trainer and exported; their errors), ``artifacts`` (the install hint without the training build,
the four files with it) and ``demo`` (one short epoch: the torch-free default, and
``--runtime onnxruntime-training`` in the training build).
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

import ortlstm
from ortlstm.ops import schema, session_options

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
    for command in ("demo", "demo-chars", "convert", "train-step", "export", "artifacts"):
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
# One vocabulary, torch's: --loss cross_entropy, --optimizer adamw, --lr. The old spellings still
# parse, each with a deprecation message on stderr; --help shows only the new ones.

# (argv with old spellings, the parsed values, the deprecation messages)
OLD_SPELLINGS = [
    (["train-step", "m.onnx", "d", "--loss", "bce", "--optimizer", "sgd"], {"loss": "binary_cross_entropy"},
     ["--loss bce is deprecated; use --loss binary_cross_entropy"]),
    (["train-step", "m.onnx", "d", "--loss", "bce_with_logits", "--optimizer", "adamw"],
     {"loss": "binary_cross_entropy_with_logits"},
     ["--loss bce_with_logits is deprecated; use --loss binary_cross_entropy_with_logits"]),
    (["artifacts", "m.onnx", "d", "--loss", "CrossEntropyLoss", "--optimizer", "AdamW"],
     {"loss": "cross_entropy", "optimizer": "adamw"},
     ["--loss CrossEntropyLoss is deprecated; use --loss cross_entropy",
      "--optimizer AdamW is deprecated; use --optimizer adamw"]),
    (["artifacts", "m.onnx", "d", "--loss", "MSELoss", "--optimizer", "SGD"], {"loss": "mse_loss", "optimizer": "sgd"},
     ["--loss MSELoss is deprecated; use --loss mse_loss", "--optimizer SGD is deprecated; use --optimizer sgd"]),
    (["artifacts", "m.onnx", "d", "--loss", "BCEWithLogitsLoss", "--optimizer", "sgd"],
     {"loss": "binary_cross_entropy_with_logits"},
     ["--loss BCEWithLogitsLoss is deprecated; use --loss binary_cross_entropy_with_logits"]),
    (["artifacts", "m.onnx", "d", "--loss", "L1Loss", "--optimizer", "adamw"], {"loss": "l1_loss"},
     ["--loss L1Loss is deprecated; use --loss l1_loss"]),
    (["demo", "--learning-rate", "0.02"], {"lr": 0.02}, ["--learning-rate is deprecated; use --lr"]),
    (["demo-chars", "--learning-rate", "0.001"], {"lr": 0.001}, ["--learning-rate is deprecated; use --lr"]),
    # --out is what a command writes, in every command; --output the model output the loss reads.
    (["demo", "--output", "m.onnx"], {"out": Path("m.onnx")}, ["--output is deprecated; use --out"]),
    (["demo-chars", "--output", "c.onnx"], {"out": Path("c.onnx")}, ["--output is deprecated; use --out"]),
    (["demo-ocr", "--output", "o.onnx"], {"out": Path("o.onnx")}, ["--output is deprecated; use --out"]),
]  # fmt: skip
NEW_SPELLINGS = [
    (["train-step", "m.onnx", "d", "--loss", "binary_cross_entropy", "--optimizer", "sgd", "--lr", "0.1"],
     {"loss": "binary_cross_entropy", "optimizer": "sgd", "lr": 0.1}),
    (["artifacts", "m.onnx", "d", "--loss", "mse_loss", "--optimizer", "sgd"],
     {"loss": "mse_loss", "optimizer": "sgd"}),
    (["artifacts", "m.onnx", "--out", "d", "--loss", "cross_entropy", "--optimizer", "adamw"],
     {"loss": "cross_entropy", "optimizer": "adamw", "out": Path("d")}),
    (["demo", "--lr", "0.02"], {"lr": 0.02}),
    (["demo", "--out", "m.onnx"], {"out": Path("m.onnx")}),
    (["demo"], {"out": Path("ortlstm_demo.onnx")}),
    (["demo-ocr", "--out", "o.onnx"], {"out": Path("o.onnx")}),
    (["fit", "m.onnx", "--out", "t.onnx", "--output", "logits"], {"out": Path("t.onnx"), "output": "logits"}),
    (["train-step", "m.onnx", "--out", "d", "--loss", "mse_loss", "--optimizer", "sgd", "--output", "y"],
     {"out": Path("d"), "output": "y"}),
    (["convert", "a.onnx", "--out", "b.onnx"], {"input": Path("a.onnx"), "out": Path("b.onnx")}),
    (["export", "d", "--out", "t.onnx"], {"directory": Path("d"), "out": Path("t.onnx")}),
    (["demo"], {"lr": 0.01}),
    (["demo-chars", "--lr", "0.001"], {"lr": 0.001}),
    (["demo-chars"], {"lr": 0.005}),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "parsed", "messages"), OLD_SPELLINGS, ids=[" ".join(row[0]) for row in OLD_SPELLINGS])
def test_old_spellings_parse_with_a_deprecation_message(
    argv: list[str], parsed: dict[str, object], messages: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from ortlstm.__main__ import _parser

    args = _parser().parse_args(argv)
    assert {name: getattr(args, name) for name in parsed} == parsed
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"ortlstm {argv[0]}: warning: {message}" for message in messages]
    assert not captured.out


@pytest.mark.parametrize(("argv", "parsed"), NEW_SPELLINGS, ids=[" ".join(row[0]) for row in NEW_SPELLINGS])
def test_torch_names_parse_without_a_message(
    argv: list[str], parsed: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    from ortlstm.__main__ import _parser

    args = _parser().parse_args(argv)
    assert {name: getattr(args, name) for name in parsed} == parsed
    assert capsys.readouterr().err == ""


def test_train_step_takes_every_loss_of_the_table() -> None:
    from ortlstm.__main__ import _parser
    from ortlstm.graphs import losses

    parser = _parser()
    for kind in losses.KINDS:
        assert parser.parse_args(["train-step", "m", "d", "--loss", kind, "--optimizer", "sgd"]).loss == kind


def test_train_step_takes_every_optimizer_of_the_table() -> None:
    from ortlstm.__main__ import _parser, _trainer_arguments
    from ortlstm.graphs import optimizers

    parser = _parser()
    for name, cls in optimizers.OPTIMIZERS.items():
        args = parser.parse_args(["train-step", "m", "d", "--loss", "mse_loss", "--optimizer", name.lower()])
        assert type(_trainer_arguments(args)["optimizer"]) is cls


@pytest.mark.parametrize(
    ("command", "shown", "hidden"),
    [
        ("train-step", ["cross_entropy", "soft_margin_loss", "binary_cross_entropy_with_logits", "adamw", "--lr"],
         ["bce,", "bce_with_logits", "AdamW"]),
        ("artifacts", ["{cross_entropy,mse_loss,binary_cross_entropy_with_logits,l1_loss}", "{adamw,sgd}"],
         ["CrossEntropyLoss", "MSELoss", "AdamW"]),
        ("demo", ["--lr LR"], ["--learning-rate"]),
        ("demo-chars", ["--lr LR"], ["--learning-rate"]),
    ],
)  # fmt: skip
def test_help_shows_torch_names_only(command: str, shown: list[str], hidden: list[str], tmp_path: Path) -> None:
    result = ortlstm_cli(command, "--help", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    text = " ".join(result.stdout.split())  # argparse wraps long choice lists
    for name in shown:
        assert name in text, f"{name} missing from {command} --help:\n{result.stdout}"
    for name in hidden:
        assert name not in text, f"{name} in {command} --help:\n{result.stdout}"


# ---------------------------------------------------------------------------------------------
# convert


def test_convert_writes_a_model_that_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    original = lstm_model(tmp_path / "in.onnx", rng)
    result = ortlstm_cli("convert", "in.onnx", "--out", "out.onnx", cwd=tmp_path)
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
# train-step and export


def test_train_step_writes_a_directory_the_trainer_trains_and_export_writes(tmp_path: Path) -> None:
    from ortlstm.training import Trainer

    rng = np.random.default_rng(7)
    lstm_model(tmp_path / "model.onnx", rng)
    result = ortlstm_cli(
        "train-step", "model.onnx", "--out", "run", "--loss", "mse_loss", "--optimizer", "adamw", "--lr", "0.05",
        "--weight-decay", "0", "--requires-grad", "W", "R", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    assert "trains 2 parameters" in result.stdout, describe(result)
    assert re.search(r"\n  W +float32 \[2, 20, 4\] +160\n", result.stdout), describe(result)
    assert "frozen (constants): B" in result.stdout, describe(result)
    assert "batch feeds: X, target; AdamW lr 0.05" in result.stdout, describe(result)
    assert "export: ortlstm export run --out OUT.onnx" in result.stdout, describe(result)
    names = ("train_step", "eval", "gradients", "apply", "model")
    for name in names:
        assert (tmp_path / "run" / f"{name}.onnx").is_file(), name
    assert (tmp_path / "run" / "state.safetensors").is_file()

    trainer = Trainer.open(tmp_path / "run", threads=1)
    assert trainer.spec.optimizer.weight_decay == 0.0
    x = rng.standard_normal((SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE)).astype(np.float32)
    target = np.zeros((2, BATCH_SIZE, HIDDEN_SIZE), np.float32)
    first = trainer.step(x, target=target)
    for _ in range(3):
        last = trainer.step(x, target=target)
    assert last < first
    trainer.save(tmp_path / "run" / "state.safetensors")

    result = ortlstm_cli("export", "run", "--out", "trained.onnx", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert result.stdout.startswith("trained.onnx: the original model with the trained parameters")
    trained = onnx.load(str(tmp_path / "trained.onnx"))
    assert [node.op_type for node in trained.graph.node] == ["LSTM"]
    (actual,) = ort.InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x}
    )
    _, expected = trainer.evaluate(x, target=target, outputs=["Y_h"])
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    weights = {init.name: numpy_helper.to_array(init) for init in trained.graph.initializer}
    np.testing.assert_array_equal(weights["W"], trainer.parameters["W"])


def test_train_step_takes_frozen_fixed_shapes_and_fixed_inputs(tmp_path: Path) -> None:
    """--frozen (a glob), --fixed-shape and --fixed-input reach the Trainer and its saved spec."""
    from ortlstm.training import Trainer

    lstm_model(tmp_path / "model.onnx", np.random.default_rng(7))
    result = ortlstm_cli(
        "train-step", "model.onnx", "run", "--loss", "mse_loss", "--optimizer", "sgd", "--frozen", "[WB]",
        "--fixed-shape", f"X=?,{BATCH_SIZE},?", "--clip-grad-norm", "1", "--clip-norm-type", "inf", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    assert "trains 1 parameters" in result.stdout, describe(result)
    assert "frozen (constants): W, B" in result.stdout, describe(result)
    spec = Trainer.open(tmp_path / "run", threads=1).spec
    assert spec.requires_grad == ("R",)
    assert spec.frozen == ("[WB]",)
    assert spec.fixed_shapes == {"X": (None, BATCH_SIZE, None)}
    assert spec.clip_norm_type == float("inf")


def test_train_step_takes_clip_grad_value_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """--clip-grad-value reaches the saved spec; a value <= 0 fails naming the option and the value."""
    from ortlstm.training import Trainer

    lstm_model(tmp_path / "model.onnx", np.random.default_rng(7))
    common = ["train-step", "model.onnx", "--loss", "mse_loss", "--optimizer", "sgd"]
    result = ortlstm_cli(*common[:2], "run", *common[2:], "--clip-grad-value", "0.25", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert Trainer.open(tmp_path / "run", threads=1).spec.clip_grad_value == 0.25
    result = ortlstm_cli(*common[:2], "bad", *common[2:], "--clip-grad-value", "-1", cwd=tmp_path)
    assert result.returncode != 0
    assert "clip_grad_value must be a finite number > 0, got -1.0" in result.stderr, describe(result)


RUN_TIME_ONLY = {"lr", "threads", "nonfinite"}
"""Trainer keywords a training directory does not record (given to ``Trainer.open``), so not train-step's."""


def test_train_step_reaches_every_trainer_option_a_directory_records() -> None:
    """Every Trainer keyword that TrainingSpec saves or builds the graphs from has a train-step option.

    A new Trainer option the spec records fails here until train-step passes it (test_fit checks fit).
    """
    import dataclasses
    import inspect

    from ortlstm.__main__ import _parser, _trainer_arguments
    from ortlstm.training import Trainer, TrainingSpec

    keywords = set(inspect.signature(Trainer.__init__).parameters) - {"self", "model"}
    fields = dataclasses.fields(TrainingSpec)
    roles = {field.metadata["role"].keyword or field.name: field.metadata["role"] for field in fields}
    assert set(roles) == keywords
    recorded = {keyword for keyword, role in roles.items() if role.saved is not None or role.build is not None}
    assert recorded == keywords - RUN_TIME_ONLY
    args = _parser().parse_args(["train-step", "m.onnx", "d", "--loss", "mse_loss", "--optimizer", "sgd"])
    reached = set(_trainer_arguments(args))
    assert sorted(recorded - reached) == []
    assert reached == recorded


def test_train_step_records_param_groups_stateful_and_optimizer_options(tmp_path: Path) -> None:
    """--param-groups, --stateful, --optimizer-option and --ir-version reach training.json and Trainer.open."""
    import json

    from ortlstm.graphs import optimizers
    from ortlstm.training import MANIFEST_FILE, Trainer

    lstm_model(tmp_path / "model.onnx", np.random.default_rng(7))
    result = ortlstm_cli(
        "train-step", "model.onnx", "run", "--loss", "mse_loss", "--optimizer", "sgd", "--lr", "0.1",
        "--param-groups", '[{"params": ["B"], "weight_decay": 0, "lr_scale": 0.5}]', "--weight-decay", "0.01",
        "--optimizer-option", "momentum=0.9", "--stateful", "--ir-version", "9", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    saved = json.loads((tmp_path / "run" / MANIFEST_FILE).read_text())["spec"]
    assert saved["stateful"] is True, saved
    assert saved["ir_version"] == 9, saved
    assert [group["params"] for group in saved["param_groups"]] == [["B"]], saved
    assert onnx.load(str(tmp_path / "run" / "train_step.onnx")).ir_version == 9
    spec = Trainer.open(tmp_path / "run", threads=1).spec
    assert spec.stateful is True
    assert spec.param_groups == (optimizers.ParamGroup(params=("B",), weight_decay=0.0, lr_scale=0.5),)
    assert spec.optimizer.momentum == 0.9
    assert spec.optimizer.weight_decay == 0.01
    assert spec.ir_version == 9


@pytest.mark.parametrize(("flag", "name"), [("rmsprop", "RMSprop"), ("adagrad", "Adagrad"), ("nadam", "NAdam")])
def test_train_step_takes_standard_ops_optimizers(tmp_path: Path, flag: str, name: str) -> None:
    from ortlstm.training import Trainer

    rng = np.random.default_rng(7)
    lstm_model(tmp_path / "model.onnx", rng)
    result = ortlstm_cli(
        "train-step", "model.onnx", "run", "--loss", "mse_loss", "--optimizer", flag, "--lr", "0.01", cwd=tmp_path
    )
    assert result.returncode == 0, describe(result)
    assert f"{name} lr 0.01" in result.stdout, describe(result)
    trainer = Trainer.open(tmp_path / "run", threads=1)
    assert type(trainer.spec.optimizer).__name__ == name
    x = rng.standard_normal((SEQ_LENGTH, BATCH_SIZE, INPUT_SIZE)).astype(np.float32)
    target = np.zeros((2, BATCH_SIZE, HIDDEN_SIZE), np.float32)
    first = trainer.step(x, target=target)
    for _ in range(3):
        last = trainer.step(x, target=target)
    assert last < first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--requires-grad", "W", "Q"], r"requires_grad: 'Q' matches no parameter of the model.*: W, R, B\. "),
        (["--output", "Y"], r"output 'Y' is not an output of the model; its outputs are \['Y_h'\]"),
        (["--lr", "-1"], r"Invalid learning rate: -1.0"),
        (["--frozen", "encoder.*"], r"frozen: 'encoder\.\*' matches no parameter of the model"),
        (["--fixed-shape", "Q=?,2"], r"fixed_shapes: .*Q"),
        (["--fixed-input", "sr=16000"], r"fixed_inputs: \['sr'\] are not inputs of the model; its inputs are \['X'\]"),
    ],
    ids=[
        "unknown_parameter",
        "unknown_output",
        "negative_lr",
        "unknown_frozen",
        "unknown_fixed_shape",
        "unknown_fixed",
    ],
)
def test_train_step_errors_say_what_is_wrong(tmp_path: Path, args: list[str], message: str) -> None:
    lstm_model(tmp_path / "model.onnx", np.random.default_rng(7))
    result = ortlstm_cli(
        "train-step", "model.onnx", "run", "--loss", "mse_loss", "--optimizer", "sgd", *args, cwd=tmp_path
    )
    assert result.returncode == 1, describe(result)
    assert result.stderr.startswith("ortlstm train-step: error:"), describe(result)
    assert re.search(message, result.stderr), describe(result)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_train_step_refuses_to_overwrite_and_export_needs_a_directory(tmp_path: Path) -> None:
    lstm_model(tmp_path / "model.onnx", np.random.default_rng(7))
    args = ["train-step", "model.onnx", "run", "--loss", "mse_loss", "--optimizer", "sgd"]
    assert ortlstm_cli(*args, cwd=tmp_path).returncode == 0
    result = ortlstm_cli(*args, cwd=tmp_path)
    assert result.returncode == 1, describe(result)
    assert "run already holds training models (training.json); choose another directory" in result.stderr

    result = ortlstm_cli(
        "train-step", "missing.onnx", "other", "--loss", "mse_loss", "--optimizer", "sgd", cwd=tmp_path
    )
    assert result.returncode == 1, describe(result)
    assert "no model file 'missing.onnx'" in result.stderr, describe(result)

    (tmp_path / "empty").mkdir()
    result = ortlstm_cli("export", "empty", "out.onnx", cwd=tmp_path)
    assert result.returncode == 1, describe(result)
    assert "'empty' holds no model.onnx: is it a directory written by `ortlstm train-step`?" in result.stderr
    result = ortlstm_cli("export", "run", "out.onnx", "--checkpoint", "nothing.safetensors", cwd=tmp_path)
    assert result.returncode == 1, describe(result)
    assert "no checkpoint file 'nothing.safetensors'" in result.stderr, describe(result)
    assert not (tmp_path / "out.onnx").exists()


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
    args = ["artifacts", "model.onnx", "--out", "out", "--loss", "mse_loss", "--optimizer", "sgd"]
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
    result = ortlstm_cli("artifacts", "model.onnx", "out", "--loss", "mse_loss", "--optimizer", "sgd", cwd=tmp_path)
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


# A finder that refuses torch (sys.modules['torch'] = None would break scipy, which probes it).
_WITHOUT_TORCH = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torch':
            raise ModuleNotFoundError(f'{name} is blocked by the test')
sys.meta_path.insert(0, NoTorch())
sys.argv[0] = 'ortlstm'
from ortlstm.__main__ import main
status = main()
assert 'torch' not in sys.modules
sys.exit(status)
"""


def test_demo_one_epoch(tmp_path: Path) -> None:
    """The torch-free default: build, train one epoch with the Trainer, export, check, plot."""
    for module in ("sklearn", "matplotlib", "tqdm"):
        pytest.importorskip(module, reason="the demo's dependencies: pip install 'ortlstm[demo]'")
    plot, model = tmp_path / "curves.png", tmp_path / "trained.onnx"
    # torch made unimportable: the default path must never need it, even where it is installed.
    command = [
        sys.executable, "-c", _WITHOUT_TORCH,
        "demo", "--epochs", "1", "--hidden-size", "16", "--plot", str(plot), "--out", str(model),
    ]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    assert result.returncode == 0, describe(result)
    assert "with the ortlstm Trainer" in result.stdout
    match = re.search(r"^held-out accuracy: (\d+\.\d)% \(\d+ s\)$", result.stdout, re.MULTILINE)
    assert match, describe(result)
    assert re.search(r"^epoch  1: train accuracy \d+\.\d%, held-out accuracy \d+\.\d%$", result.stdout, re.MULTILINE)
    plain = re.search(rf"^trained model: {re.escape(str(model))}; onnxruntime without ortlstm: held-out accuracy "
                      r"(\d+\.\d)%$", result.stdout, re.MULTILINE)  # fmt: skip
    assert plain, describe(result)
    assert abs(float(plain[1]) - float(match[1])) <= 0.3
    assert f"loss and accuracy curves: {plot}" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trained = onnx.load(str(model))
    assert {node.op_type for node in trained.graph.node} == {"Transpose", "LSTM", "Flatten", "Gemm"}


def test_demo_chars_trains_statefully_and_samples(tmp_path: Path) -> None:
    """The character-LM demo at a tiny size: stateful TBPTT steps, held-out loss, two samples."""
    pytest.importorskip("tqdm", reason="the demo's dependencies: pip install 'ortlstm[demo]'")
    result = ortlstm_cli(
        "demo-chars", "--steps", "12", "--hidden-size", "16", "--seq-length", "8", "--streams", "4",
        "--out", "chars.onnx", cwd=tmp_path, timeout=COMMAND_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    assert "stateful truncated BPTT" in result.stdout
    assert re.search(r"^step   12: loss \d+\.\d{3} \(\d+\.\d\d bits per character\)$", result.stdout, re.MULTILINE)
    assert re.search(r"^held-out loss: \d+\.\d{3}", result.stdout, re.MULTILINE), describe(result)
    samples = re.findall(r"^--- sample \(temperature 0\.7\):\n(.+)", result.stdout, re.MULTILINE)
    assert [sample[:4] for sample in samples] == ["The ", "def "], describe(result)
    assert onnx.load(str(tmp_path / "chars.onnx")).graph.node[1].op_type == "LSTM"


@needs_training
def test_demo_training_runtime_one_epoch(tmp_path: Path) -> None:
    """The older path at a small size: torch export, convert, artifacts, one epoch, plot."""
    pytest.importorskip("torch")  # the training environment also has the demo's scikit-learn and matplotlib
    plot = tmp_path / "curves.png"
    result = ortlstm_cli(
        "demo", "--runtime", "onnxruntime-training", "--epochs", "1", "--hidden-size", "16", "--plot", plot,
        cwd=tmp_path, timeout=COMMAND_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    assert "torch.onnx.export" in result.stdout
    match = re.search(r"^held-out accuracy: (\d+\.\d)% \(\d+ s\)$", result.stdout, re.MULTILINE)
    assert match, describe(result)
    assert 0.0 <= float(match[1]) <= 100.0
    assert re.search(r"^epoch  1: train accuracy \d+\.\d%, held-out accuracy \d+\.\d%$", result.stdout, re.MULTILINE)
    assert "onnxruntime without ortlstm" not in result.stdout
    assert f"loss and accuracy curves: {plot}" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
