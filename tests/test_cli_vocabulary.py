"""One vocabulary across the sub-commands: descriptions and shown defaults, --out, artifacts' defaults as fit's.

Every sub-command's --help has a description and shows each default (fit's too, though its parser
hides them for --config); what a command writes is --out (the older positional OUT still works);
``artifacts`` needs --loss and --optimizer as fit does and trains what the Trainer trains by
default, checked against the Trainer's own choice (and, in the training build, against the
trainable parameters of the artifacts onnxruntime-training writes). Commands run as in
test_cli.py: subprocesses from a temporary directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from test_cli import describe, lstm_model, needs_training, ortlstm_cli


def sub_parsers() -> dict[str, argparse.ArgumentParser]:
    from ortlstm.__main__ import _parser

    (commands,) = [action for action in _parser()._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(commands.choices)


def defaults_of(name: str, parser: argparse.ArgumentParser) -> dict[str, object]:
    """Each option's default; fit's from a parser of its options alone (its own hides them, for --config)."""
    if name == "fit":
        from ortlstm.cli.fit import add_fit_arguments

        parser = argparse.ArgumentParser()
        add_fit_arguments(parser)
    defaults: dict[str, object] = {}
    for action in parser._actions:
        defaults.setdefault(action.dest, action.default)  # the option's, not an old spelling's of the same dest
    return defaults


def test_every_sub_command_has_a_description_and_its_help_shows_each_default() -> None:
    from ortlstm.__main__ import _COMMANDS

    parsers = sub_parsers()
    assert sorted(parsers) == sorted(_COMMANDS)
    for name, parser in parsers.items():
        help_text = " ".join(parser.format_help().split()).replace("- ", "-")  # argparse wraps after a hyphen
        description = " ".join((parser.description or "").split())
        assert len(description) > 80, f"{name}: no description"
        assert description in help_text, name
        defaults = defaults_of(name, parser)
        shown = 0
        for action in parser._actions:
            default = defaults[action.dest]
            flag = isinstance(action, (argparse._StoreConstAction, argparse._HelpAction))
            if action.help == argparse.SUPPRESS or flag or default is None or default == []:
                continue
            option = action.option_strings[0] if action.option_strings else action.dest
            words = " ".join((action.help or "").replace("%%", "%").split())
            expected = "(default: 1/3)" if option == "--start-factor" else f"(default: {default})"
            assert expected in words, f"{name} {option}: {action.help!r}"
            assert words.replace("- ", "-") in help_text, f"{name} {option}"
            shown += 1
        assert shown >= {"demo": 9, "fit": 12, "train-step": 3}.get(name, 0), name
    # Not vacuous: what a user reads.
    assert "--epochs EPOCHS passes over the training digits (default: 12)" in " ".join(
        parsers["demo"].format_help().split()
    )
    assert "--gamma GAMMA step: StepLR's gamma (default: 0.1)" in " ".join(parsers["fit"].format_help().split())


def test_artifacts_needs_a_loss_and_an_optimizer_as_fit_does(tmp_path: Path) -> None:
    result = ortlstm_cli("artifacts", "model.onnx", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert "error: the following arguments are required: --loss, --optimizer" in result.stderr, describe(result)


def test_a_command_writes_to_out_or_the_older_positional_and_says_what_is_missing(tmp_path: Path) -> None:
    lstm_model(tmp_path / "in.onnx", np.random.default_rng(7))
    result = ortlstm_cli("convert", "in.onnx", cwd=tmp_path)
    assert result.returncode == 1, describe(result)
    assert result.stderr == "ortlstm convert: error: where to write is missing: pass --out PATH\n", describe(result)
    result = ortlstm_cli("convert", "in.onnx", "a.onnx", "--out", "b.onnx", cwd=tmp_path)
    assert result.returncode == 1, describe(result)
    assert result.stderr == "ortlstm convert: error: two outputs, a.onnx and --out b.onnx: give one\n"
    assert not (tmp_path / "a.onnx").exists() and not (tmp_path / "b.onnx").exists()
    result = ortlstm_cli("convert", "in.onnx", "a.onnx", "--out", "a.onnx", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert (tmp_path / "a.onnx").is_file()


@pytest.mark.filterwarnings("ignore:torch parameters \\['extra.bias'\\] are not in the export")
def test_artifacts_trains_what_the_trainer_trains_by_default() -> None:
    """A torch export's parameters, never its buffers (the old default, every float, trained bn.running_var)."""
    from test_default_parameters import dynamo_like_model

    from ortlstm.cli.models import artifact_parameters
    from ortlstm.graphs import losses, optimizers
    from ortlstm.training import Trainer

    model = dynamo_like_model()

    def trained_by_the_trainer(**options: object) -> list[str]:
        loss, optimizer = losses.Loss.mse_loss(), optimizers.SGD(lr=0.1)
        trainer = Trainer(model, loss=loss, optimizer=optimizer, **options)  # type: ignore[arg-type]
        return sorted(trainer.signature.params)

    requires_grad, frozen = artifact_parameters(model, None, [])
    assert sorted(requires_grad or []) == trained_by_the_trainer() and frozen == []
    assert "bn.running_var" not in (requires_grad or [])
    float_initializers = [init.name for init in model.graph.initializer if init.data_type == TensorProto.FLOAT]
    assert "bn.running_var" in float_initializers
    # --frozen as fit reads it: a torch module prefix freezes the initializers folded from its parameters.
    requires_grad, frozen = artifact_parameters(model, None, ["lstm"])
    assert sorted(requires_grad or []) == trained_by_the_trainer(frozen=["lstm"])
    assert frozen == ["val_3", "val_4", "val_5"]
    assert artifact_parameters(model, ["val_9"], []) == (["val_9"], [])
    with pytest.raises(
        ValueError, match=r"frozen: 'decoder' matches no parameter of the model. Its parameters are: lstm.weight_ih_l0"
    ):
        artifact_parameters(model, None, ["decoder"])
    # Without the metadata: generate_artifacts' own default (float initializers of rank >= 1).
    assert artifact_parameters(dynamo_like_model(with_metadata=False), None, ["bn.weight"]) == (None, ["bn.weight"])


@needs_training
def test_artifacts_of_a_torch_export_trains_its_parameters_not_its_buffers(tmp_path: Path) -> None:
    from onnxruntime.training.api import CheckpointState
    from test_default_parameters import dynamo_like_model

    onnx.save(dynamo_like_model(), str(tmp_path / "model.onnx"))
    result = ortlstm_cli(
        "artifacts", "model.onnx", "--out", "out", "--loss", "mse_loss", "--optimizer", "sgd", "--frozen", "head",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    training = onnx.load(str(tmp_path / "out" / "training_model.onnx"))
    suffix = "_grad.accumulation.buffer"
    trained = sorted(value.name.removesuffix(suffix) for value in training.graph.input if value.name.endswith(suffix))
    assert trained == ["bn.bias", "bn.weight", "val_3", "val_4", "val_5"]  # head.* frozen, bn.running_var a buffer
    state = CheckpointState.load_checkpoint(str(tmp_path / "out" / "checkpoint"))
    assert not state.parameters["val_9"].requires_grad
    with pytest.raises(KeyError, match=r"bn\.running_var"):
        state.parameters["bn.running_var"]
