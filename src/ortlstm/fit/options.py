"""Fit's options: the Trainer's keywords (``TRAINER_OPTIONS``), ``--config`` files, parameter groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx

from ortlstm.graphs import losses, optimizers
from ortlstm.graphs.model_files import load_model_file
from ortlstm.graphs.options import FIT
from ortlstm.training import Trainer
from ortlstm.training.options import DEFAULTS, OPTIONS

CONFIG_SUFFIXES = (".json", ".toml")

TRAINER_OPTIONS: dict[str, str] = {each.name: each.command_line for each in OPTIONS if FIT in each.surfaces}
"""Every keyword of ``Trainer(...)`` but the model -> the option of ``ortlstm fit`` that sets it.

Read off the one table of options (``ortlstm.training.options.OPTIONS``: the rows with the ``fit``
surface). ``loss`` comes with --loss-option, ``optimizer`` with --weight-decay and --optimizer-option,
and ``lr`` is the optimizer's (with --schedule each update's lr is given to ``step(lr=...)``). An option
is ``--NAME`` on the command line (``_`` written ``-``) and ``NAME`` in ``--config``; tests/test_fit.py
checks this table against the Trainer's signature, so a new Trainer option fails there until fit reaches it.
"""


def read_config(path: str | Path) -> dict[str, Any]:
    """The options of a ``--config`` file: a JSON object, or a TOML table (Python >= 3.11's tomllib).

    Raises:
        FileNotFoundError: No such file.
        ValueError: Another suffix, or a file that is not one object of options.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--config: no file {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise ValueError(f"--config {path}: expected a .json or .toml file, got {suffix or 'no suffix'!r}")
    try:
        if suffix == ".toml":
            import tomllib

            config = tomllib.loads(path.read_text())
        else:
            config = json.loads(path.read_text())
    except ModuleNotFoundError:
        raise ValueError(f"--config {path}: reading TOML needs Python >= 3.11 (tomllib); write it as JSON") from None
    except ValueError as error:
        raise ValueError(f"--config {path}: not valid {suffix[1:].upper()} ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f'--config {path}: expected an object of options, e.g. {{"epochs": 10}}, got {config!r}')
    return config


def param_groups_from_json(groups: Any) -> tuple[optimizers.ParamGroup, ...]:
    """``ParamGroup``s from JSON: ``[{"params": ["lstm.bias"], "weight_decay": 0.0}, ...]``.

    Raises:
        ValueError: Not a list of objects, a group without params, or a key ParamGroup does not have.
    """
    if groups is None:
        return ()
    try:
        return optimizers.as_param_groups(groups, "--param-groups")
    except TypeError as error:
        raise ValueError(str(error)) from None


def build_trainer(
    model: str | Path,
    *,
    loss: losses.Loss,
    optimizer: optimizers.Optimizer,
    threads: int | None = DEFAULTS["threads"],
    **options: Any,
) -> tuple[Trainer, onnx.ModelProto]:
    """The Trainer of ``model`` (a path) and the model as loaded (for ``data_specs``).

    Args:
        model: The model file.
        loss: The Trainer's.
        optimizer: The Trainer's.
        threads: The Trainer's.
        **options: Any other keyword of ``Trainer`` (``TRAINER_OPTIONS``).

    Raises:
        FileNotFoundError: No model file.
        ValueError: Not an ONNX model, or its external data missing (``load_model_file``).
    """
    unknown = sorted(set(options) - set(TRAINER_OPTIONS))
    if unknown:
        raise TypeError(f"build_trainer: {unknown} are not Trainer options; they are {sorted(TRAINER_OPTIONS)}")
    loaded = load_model_file(model)
    return Trainer(loaded, loss=loss, optimizer=optimizer, threads=threads, **options), loaded
