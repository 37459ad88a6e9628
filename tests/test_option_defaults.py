"""Every option's default in one place (issue 34): each surface agrees with the table.

The table is ``ortlstm.training.options.OPTIONS`` (the builder's rows in ``ortlstm.graphs.options``).
Each surface is read as a user meets it, not through the table: the builder's, the Trainer's and the
reopening constructors' signatures (``inspect``), ``TrainingSpec``'s dataclass fields, and the
Trainer keywords that ``train-step`` and ``fit`` give when no option is on the command line. A
surface whose default disagrees with the table fails here, naming the option and both values.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.options import BUILDER, BUILDER_OPTIONS, FIT, REOPEN, SPEC, SURFACES, TRAIN_STEP, TRAINER, Option
from ortlstm.graphs.train_step import build_training_models
from ortlstm.training import Trainer, TrainingSpec
from ortlstm.training.options import BY_NAME, DEFAULTS, OPTIONS, RUN_TIME

SPEC_JSON_BEFORE_TABLE = Path(__file__).resolve().parent / "data" / "spec_json_before_option_table.json"
"""``TrainingSpec(loss=Loss.cross_entropy(), optimizer=AdamW(lr=1e-3), requires_grad=<the classifier's>).to_json()``
written by the code before the table (commit 10ca524): the saved form must not change."""


def _loss_and_optimizer() -> dict[str, Any]:
    return {"loss": losses.Loss.cross_entropy(), "optimizer": optimizers.AdamW(lr=1e-3)}


def _annotation(text: Any) -> str:
    """An annotation without module prefixes (``optimizers_module.ParamGroup`` and ``optimizers.ParamGroup`` alike)."""
    return re.sub(r"\b[A-Za-z_]\w*\.", "", str(text))


def _same(left: Any, right: Any) -> bool:
    """Equal values of the same type (2 and 2.0 differ: argparse and JSON show them differently)."""
    return type(left) is type(right) and left == right


def signature_disagreements(function: Callable[..., Any], rows: Iterable[Option], *, types: bool = True) -> list[str]:
    """How ``function``'s keyword-only parameters differ from ``rows``: names, defaults, annotations."""
    parameters = {
        name: parameter
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    rows = list(rows)
    found = [f"{name}: in the signature, not in the table" for name in parameters if name not in {r.name for r in rows}]
    for row in rows:
        parameter = parameters.get(row.name)
        if parameter is None:
            found.append(f"{row.name}: in the table, not in the signature")
            continue
        default = parameter.default
        if row.required != (default is inspect.Parameter.empty):
            found.append(f"{row.name}: required in one only (table {row.default!r}, signature {default!r})")
        elif not row.required and not _same(default, row.default):
            found.append(f"{row.name}: table default {row.default!r}, signature default {default!r}")
        if types and _annotation(parameter.annotation) != _annotation(row.type):
            found.append(f"{row.name}: table type {row.type!r}, signature annotation {parameter.annotation!r}")
    return found


def _on(surface: str, rows: Iterable[Option] = OPTIONS) -> list[Option]:
    return [row for row in rows if surface in row.surfaces]


# ---- the comparison can fail ----------------------------------------------------------------------------------


def test_a_signature_that_disagrees_with_the_table_is_reported() -> None:
    def wrong(*, clip_norm_type: float = 2, target: str = "labels", precision: int = 0, extra: bool = False) -> None:
        """2 (an int), another target, another type, a keyword the table lacks, and three rows missing."""

    rows = [BY_NAME[name] for name in ("clip_norm_type", "target", "precision", "loss")]
    found = signature_disagreements(wrong, rows)
    assert found == [
        "extra: in the signature, not in the table",
        "clip_norm_type: table default 2.0, signature default 2",
        "target: table default 'target', signature default 'labels'",
        "precision: table default '32-true', signature default 0",
        "precision: table type 'str', signature annotation 'int'",
        "loss: in the table, not in the signature",
    ]


def test_the_table_is_well_formed() -> None:
    names = [row.name for row in OPTIONS]
    assert len(names) == len(set(names))
    assert all(row.surfaces <= set(SURFACES) for row in OPTIONS)
    assert [row.name for row in OPTIONS if row.run_time] == list(RUN_TIME) == ["lr", "threads", "nonfinite"]
    assert all(REOPEN in row.surfaces for row in OPTIONS if row.run_time)
    assert all(row.help for row in OPTIONS if FIT in row.surfaces or TRAIN_STEP in row.surfaces)
    # The values issue 34 counted as written many times, now once.
    assert DEFAULTS["clip_norm_type"] == 2.0
    assert DEFAULTS["target"] == "target"
    assert DEFAULTS["precision"] == "32-true"


# ---- each surface against the table -------------------------------------------------------------------------


def test_the_builder_signature_equals_the_table() -> None:
    assert signature_disagreements(build_training_models, _on(BUILDER, BUILDER_OPTIONS)) == []
    assert _on(BUILDER, OPTIONS) == _on(TRAINER, _on(BUILDER, BUILDER_OPTIONS))  # the Trainer's rows are the builder's


def test_the_clipping_helpers_take_the_table_s_norm_type() -> None:
    """torch's clip_grad_norm_ norm_type, the one fact behind ``clip_norm_type``, in the helpers the builder calls."""
    from ortlstm.graphs.optimizers.clip import ClipGradNorm, clip_grad_norm, clip_settings

    assert _same(ClipGradNorm(1.0).norm_type, DEFAULTS["clip_norm_type"])
    assert _same(inspect.signature(clip_grad_norm).parameters["norm_type"].default, DEFAULTS["clip_norm_type"])
    settings = inspect.signature(clip_settings).parameters
    for name in ("clip_norm_type", "clip_grad_value"):
        assert _same(settings[name].default, DEFAULTS[name]), name


def test_the_trainer_signature_equals_the_table() -> None:
    assert signature_disagreements(Trainer.__init__, _on(TRAINER)) == []


def test_the_constructors_that_reopen_a_run_take_every_run_time_option_with_its_default() -> None:
    run_time = _on(REOPEN)
    assert [row.name for row in run_time] == list(RUN_TIME)
    assert signature_disagreements(Trainer.open, run_time) == []
    assert signature_disagreements(Trainer.from_checkpoint, run_time) == []
    imported = inspect.signature(Trainer.from_onnxruntime_training_checkpoint).parameters
    for name in ("lr", "threads"):  # the rest through **options
        assert _same(imported[name].default, DEFAULTS[name]), name


def test_the_spec_fields_equal_the_table() -> None:
    """Each field's default is the table's in the spec's form; run-time rows are neither saved nor built."""
    fields = {field.metadata["role"].keyword or field.name: field for field in dataclasses.fields(TrainingSpec)}
    assert sorted(fields) == sorted(row.name for row in _on(SPEC))
    from_table = TrainingSpec.from_options(**_loss_and_optimizer(), **DEFAULTS)  # the table's defaults, spec form
    for keyword, field in fields.items():
        row, role = BY_NAME[keyword], field.metadata["role"]
        assert row.run_time == (role.saved is None and role.build is None), keyword
        if row.required:
            assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING, keyword
            continue
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        assert _same(default, getattr(from_table, field.name)), f"{keyword}: field {default!r}, table {row.default!r}"


def _spec_differences(keywords: Mapping[str, Any]) -> list[str]:
    """Where a spec from ``keywords`` differs from the table's defaults (fixed_inputs too: compare=False)."""
    given = TrainingSpec.from_options(**keywords)
    expected = TrainingSpec.from_options(**_loss_and_optimizer(), **DEFAULTS)
    found = []
    for field in dataclasses.fields(TrainingSpec):
        if field.name in ("loss", "optimizer"):
            continue
        mine, table = getattr(given, field.name), getattr(expected, field.name)
        if field.name == "fixed_inputs" and mine == {} == table:
            continue
        if not _same(mine, table):
            found.append(f"{field.name}: command line {mine!r}, table {table!r}")
    return found


def test_train_step_gives_the_trainer_the_table_defaults() -> None:
    from ortlstm.__main__ import _parser, _trainer_arguments

    args = _parser().parse_args(["train-step", "m.onnx", "--loss", "cross_entropy", "--optimizer", "adamw"])
    keywords = _trainer_arguments(args)
    assert sorted(keywords) == sorted(row.name for row in _on(TRAIN_STEP))  # no run-time option: none is saved
    assert _spec_differences({**keywords, **_loss_and_optimizer()}) == []


def test_fit_gives_the_trainer_the_table_defaults() -> None:
    from ortlstm.__main__ import _fit_options, _fit_trainer_arguments, _parser

    argv = ["fit", "m.onnx", "--data", "d.npz", "--loss", "cross_entropy", "--optimizer", "adamw"]
    options = _fit_options(_parser().parse_args([*argv, "--epochs", "1", "--batch-size", "2"]))
    keywords = _fit_trainer_arguments(options)
    assert sorted(keywords) == sorted(row.name for row in _on(FIT))
    assert _spec_differences({**keywords, **_loss_and_optimizer()}) == []


@pytest.mark.parametrize("command", ["fit", "train-step"])
def test_the_command_line_help_texts_are_the_table_s(command: str) -> None:
    from ortlstm.__main__ import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions: dict[str, argparse.Action] = {}
    for action in commands.choices[command]._actions:
        actions.setdefault(action.dest, action)  # not an old spelling's hidden one
    for row in _on(FIT if command == "fit" else TRAIN_STEP):
        action = actions[row.command_line]
        assert action.help is not None and action.help.startswith(row.help), row.name
        shown = action.help[len(row.help) :]
        assert shown in ("", f" (default: {row.default})"), f"{row.name}: {shown!r}"


# ---- behaviour unchanged ----------------------------------------------------------------------------------------


def test_the_saved_spec_json_is_the_one_before_the_table() -> None:
    """A checkpoint of before loads: the JSON of a default spec is byte for byte what the code before wrote."""
    saved = SPEC_JSON_BEFORE_TABLE.read_text()
    data = json.loads(saved)
    spec = TrainingSpec(**_loss_and_optimizer(), requires_grad=tuple(data["requires_grad"]))
    assert json.dumps(spec.to_json(), sort_keys=True) == saved
    loaded = TrainingSpec.from_json(data)
    assert loaded.to_json() == data
    assert spec.differences(loaded) == []  # what a load compares
    assert (loaded.clip_norm_type, loaded.target, loaded.precision) == (2.0, "target", "32-true")


def test_the_constructors_that_reopen_a_run_pass_every_run_time_option_on(tmp_path: Path) -> None:
    """``run_time_values(locals())`` gives the spec what the caller passed, and the modes are still checked."""
    from test_trainer import classifier

    model = classifier()
    trainer = Trainer(model, **_loss_and_optimizer(), threads=1)
    checkpoint = trainer.save(tmp_path / "run.safetensors")
    trainer.write(tmp_path / "run")
    given = {"lr": 0.25, "threads": 1, "nonfinite": "skip"}
    assert sorted(given) == sorted(RUN_TIME)
    for reopened in (Trainer.from_checkpoint(model, checkpoint, **given), Trainer.open(tmp_path / "run", **given)):
        assert {name: getattr(reopened.spec, name) for name in RUN_TIME} == given
        assert reopened.nonfinite == "skip"
        assert reopened.learning_rate() == 0.25
    with pytest.raises(ValueError, match="nonfinite: expected one of 'raise', 'skip', got 'maybe'"):
        Trainer.open(tmp_path / "run", nonfinite="maybe")
    with pytest.raises(ValueError, match="nonfinite: expected one of 'raise', 'skip', got 'maybe'"):
        Trainer.from_checkpoint(model, checkpoint, nonfinite="maybe")
