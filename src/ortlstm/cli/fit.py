"""``ortlstm fit``: its options (every one also from --config FILE.json or .toml), merged and checked, and the run."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from ortlstm.cli.common import (
    add_quantize,
    add_trainer_extras,
    add_training_options,
    json_option,
    json_value,
    option_argument,
    show_defaults,
    trainer_arguments,
)

_FIT_REQUIRED = {
    "model": "MODEL",
    "data": "--data",
    "loss": "--loss",
    "optimizer": "--optimizer",
    "epochs": "--epochs",
    "batch_size": "--batch-size",
}
"""The options ``fit`` needs (on the command line or in --config): dest -> how a message names it."""


def _named_axis(text: str) -> tuple[str, int]:
    """``NAME=AXIS`` of ``--batch-axis``."""
    name, _, axis = text.partition("=")
    try:
        return name, int(axis)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=AXIS, e.g. target=1; got {text!r}") from None


def _schedule_value(text: str) -> Any:
    """``--schedule``: a name, or a JSON object of the schedule's fields."""
    from ortlstm.fit import SCHEDULES

    if text.lstrip().startswith("{"):
        return json_value(text)
    if text not in SCHEDULES:
        raise argparse.ArgumentTypeError(
            f'expected one of {", ".join(SCHEDULES)} or a JSON object such as \'{{"kind": "cosine", '
            f'"eta_min": 1e-5}}\', got {text!r}'
        )
    return text


class _ConfigParser(argparse.ArgumentParser):
    """Reads ``--config``'s options as if given on the command line; a bad one raises ValueError naming the file."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"{self.prog}: {message}")


def add_fit(commands: Any) -> None:
    """The parser of ``fit``: its options default to absent, so that ``fit_options`` can merge --config."""
    fit = commands.add_parser(
        "fit",
        help="train a model from data files: shuffled epochs, validation, checkpoints, resume, export, plot",
        description="Trains MODEL with the ortlstm Trainer on named arrays (a .npz or .safetensors file, a folder "
        "of NAME.npy, or a folder of shards: the model's inputs by name, the loss's target as 'target', ctc_loss's "
        "target_lengths and optionally input_lengths), checked before training starts. Each epoch visits every "
        "sample once in a seeded shuffled order (the last batch keeps what is left), validates on --val, prints "
        "one line and writes --checkpoint atomically; --resume continues bitwise where a run stopped (Ctrl-C "
        "saves the last update). The batch axis of an array is 0 unless the model declares its input with a dim "
        "named batch/N elsewhere (the same dim name places it in the target); --batch-axis NAME=AXIS sets it. "
        "Every option may come from --config FILE.json (or .toml): an object of option names without the dashes "
        '(e.g. {"epochs": 10, "param_groups": [...]}); the command line overrides it.',
    )
    add_fit_arguments(fit)
    show_defaults(fit)  # into the help texts: the parser's own defaults are hidden next
    # Options not given on the command line are left out, so that --config's values can fill them in.
    for action in fit._actions:  # argparse lists a parser's actions nowhere public
        if action.option_strings and action.dest != "help":
            action.default = argparse.SUPPRESS


def add_fit_arguments(fit: argparse.ArgumentParser) -> None:
    """Every option of ``fit``, none required here: ``fit_options`` checks them after --config is merged."""
    fit.add_argument("model", type=Path, nargs="?", help="the model (.onnx); required, here or in --config")
    fit.add_argument("--config", type=Path, default=None, help="a .json or .toml file of options (see above)")
    fit.add_argument(
        "--data",
        type=Path,
        default=None,
        help="the training arrays (.npz, .safetensors, a folder of NAME.npy, or a folder of shards: "
        "train-00000.npz, ... (np.savez), .safetensors files, or subfolders of NAME.npy, memory-mapped); required",
    )
    fit.add_argument("--val", type=Path, default=None, help="validation arrays, same names")
    add_training_options(fit)
    add_trainer_extras(fit, run_time=True)
    _add_run_options(fit)
    _add_schedule_options(fit)
    for action in fit._actions:
        action.required = False


def _add_run_options(fit: argparse.ArgumentParser) -> None:
    """How ``fit`` runs: epochs, batches, shuffling, the files it writes, resume, the batch axes."""
    fit.add_argument("--epochs", type=int, default=None, help="required")
    fit.add_argument("--batch-size", type=int, default=None, help="required")
    fit.add_argument("--seed", type=int, default=0, help="seeds the shuffling")
    fit.add_argument(
        "--shuffle",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="shuffle the samples each epoch (default: yes; --stateful: no)",
    )
    fit.add_argument(
        "--out", type=Path, default=None, metavar="PATH", help="the trained model (standard ONNX ops)"
    )
    add_quantize(fit)
    fit.add_argument("--checkpoint", type=Path, default=None, help="saved after each epoch and on Ctrl-C")
    fit.add_argument(
        "--resume", action=argparse.BooleanOptionalAction, default=False, help="continue the run in --checkpoint"
    )
    fit.add_argument("--threads", type=int, **option_argument("threads"))
    fit.add_argument("--plot", type=Path, default=None, help="PNG of the curves (needs matplotlib)")
    fit.add_argument(
        "--accumulate",
        type=int,
        default=1,
        metavar="K",
        help="K micro-batches of --batch-size per update, one gradient all-reduce per update: the update of a "
        "K times larger batch in the memory of one micro-batch",
    )
    fit.add_argument(
        "--distributed",
        choices=("auto", "off"),
        default="auto",
        help="auto: started by mpirun/srun as one of several processes, train data-parallel over MPI (each rank "
        "reads its rows of every batch; rank 0 prints and writes the files); off: this process alone",
    )
    fit.add_argument(
        "--batch-axis",
        action="append",
        default=[],
        type=_named_axis,
        metavar="NAME=AXIS",
        help="the axis of array NAME that stacks the samples (default: see above)",
    )


def _add_schedule_options(fit: argparse.ArgumentParser) -> None:
    """The learning-rate schedule of ``fit`` (``ortlstm.fit.Schedule``'s fields)."""
    from ortlstm.fit import SCHEDULE_UNITS, SCHEDULES

    fit.add_argument(
        "--schedule",
        type=_schedule_value,
        default="constant",
        metavar="|".join(SCHEDULES) + "|JSON",
        help="learning-rate schedule (torch's), or a JSON object of its fields, e.g. "
        '\'{"kind": "linear-warmup", "warmup": 100, "eta_min": 1e-5}\'',
    )
    fit.add_argument(
        "--schedule-unit",
        choices=SCHEDULE_UNITS,
        default="update",
        help="step the schedule after every update or every epoch",
    )
    fit.add_argument("--step-size", type=int, default=None, help="step: StepLR's step_size (schedule units)")
    fit.add_argument("--gamma", type=float, default=0.1, help="step: StepLR's gamma")
    fit.add_argument("--t-max", type=int, default=None, help="cosine: T_max (default: the run's length)")
    fit.add_argument("--eta-min", type=float, default=0.0, help="cosine: eta_min")
    fit.add_argument("--warmup", type=int, default=0, help="linear-warmup: LinearLR's total_iters")
    fit.add_argument(
        "--start-factor", type=float, default=1.0 / 3.0, help="linear-warmup: LinearLR's start_factor (default: 1/3)"
    )


def fit_options(args: argparse.Namespace) -> argparse.Namespace:
    """Every option of ``fit``: the command line's, else --config's, else the default; the required ones checked."""
    from ortlstm.fit import read_config

    def parser(prog: str) -> argparse.ArgumentParser:
        built = _ConfigParser(prog=prog)
        add_fit_arguments(built)
        return built

    defaults = vars(parser("ortlstm fit").parse_args([]))
    given = {name: value for name, value in vars(args).items() if name in defaults}
    if given.get("model") is None:  # a positional keeps its default (None): an absent model is not given
        given.pop("model", None)
    from_config: dict[str, Any] = {}
    if given.get("config") is not None:
        where = f"--config {given['config']}"
        config_parser = parser(where)
        for action in config_parser._actions:  # only the options the file sets
            if action.option_strings:
                action.default = argparse.SUPPRESS
        argv = _config_argv(read_config(given["config"]), config_parser, where)
        from_config = vars(config_parser.parse_args(argv))
        if from_config.get("model") is None:
            from_config.pop("model", None)
    options = argparse.Namespace(**{**defaults, **from_config, **given})
    missing = [flag for name, flag in _FIT_REQUIRED.items() if getattr(options, name) is None]
    if missing:
        raise ValueError(f"{', '.join(missing)} required (on the command line, or in --config FILE.json)")
    return options


def _config_argv(config: Mapping[str, Any], parser: argparse.ArgumentParser, where: str) -> list[str]:
    """--config's options written as the command line would give them (so that they are parsed alike)."""
    actions: dict[str, argparse.Action] = {}
    for each in parser._actions:
        actions.setdefault(each.dest, each)
    argv: list[str] = []
    for key, value in config.items():
        name = key.replace("-", "_")
        action = actions.get(name)
        if action is None or name in ("help", "config"):
            known = sorted(dest for dest in actions if dest not in ("help", "config"))
            raise ValueError(f"{where}: unknown option {key!r}; the options are {', '.join(known)}")
        if not action.option_strings:  # the model
            argv.insert(0, str(value))
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif action.nargs in ("+", "*"):
            argv += [flag, *(map(_config_text, value if isinstance(value, list) else [value]))]
        elif isinstance(action, argparse._AppendAction):  # NAME=VALUE options: an object, or a list of texts
            items = value.items() if isinstance(value, dict) else [(None, item) for item in value]
            for item_name, item in items:
                text = json.dumps(item) if action.type is json_option else _config_text(item)
                argv += [flag, text if item_name is None else f"{item_name}={text}"]
        elif action.type in (json_value, _schedule_value) and not isinstance(value, str):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, _config_text(value)]
    return argv


def _config_text(value: Any) -> str:
    """A config value as the command line writes it: true/false, ``?`` for null, lists comma-separated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "?"
    if isinstance(value, list):
        return ",".join(_config_text(item) for item in value)
    return str(value)


def fit_trainer_arguments(options: argparse.Namespace) -> dict[str, Any]:
    """``Trainer`` keywords from fit's options: every one of ``ortlstm.fit.TRAINER_OPTIONS``."""
    from ortlstm.fit import TRAINER_OPTIONS
    from ortlstm.training.options import DEFAULTS

    keywords = trainer_arguments(options, run_time=True)
    keywords["lr"] = DEFAULTS["lr"]  # None: the optimizer's; fit gives each update its lr from --schedule
    unwired = sorted(set(TRAINER_OPTIONS) - set(keywords))
    if unwired:
        raise RuntimeError(f"ortlstm fit does not pass the Trainer option(s) {unwired}: wire them here")
    return keywords


def _other_rank(distributed: str) -> bool:
    """Whether this process is a rank other than 0 of an mpirun/srun launch that fit trains over."""
    from ortlstm.fit.parallel import launched_rank, launched_world

    world = launched_world()
    return distributed == "auto" and world is not None and world[0] > 1 and launched_rank() not in (None, 0)


def fit_command(args: argparse.Namespace) -> int:
    """``ortlstm fit``: reads the data, builds the trainer, runs ``ortlstm.fit.fit``; 130 after Ctrl-C."""
    from ortlstm.fit import Schedule, build_trainer, fit, read_arrays

    options = fit_options(args)
    data = read_arrays(options.data)
    val = read_arrays(options.val) if options.val is not None else None
    trainer, model = build_trainer(options.model, **fit_trainer_arguments(options))
    schedule = Schedule.from_options(
        trainer.spec.optimizer.lr,
        options.schedule,
        unit=options.schedule_unit,
        step_size=options.step_size,
        gamma=options.gamma,
        t_max=options.t_max,
        eta_min=options.eta_min,
        warmup=options.warmup,
        start_factor=options.start_factor,
    )
    try:
        result = fit(
            trainer,
            data,
            model=model,
            epochs=options.epochs,
            batch_size=options.batch_size,
            val=val,
            seed=options.seed,
            shuffle=options.shuffle,
            schedule=schedule,
            checkpoint=options.checkpoint,
            resume=options.resume,
            batch_axes=dict(options.batch_axis),
            out=options.out,
            plot=options.plot,
            quantize=options.quantize,
            log=lambda line: print(line, flush=True),
            data_name=str(options.data),
            val_name=str(options.val),
            warn=lambda message: print(f"ortlstm fit: warning: {message}", file=sys.stderr, flush=True),
            distributed=options.distributed,
            accumulate=options.accumulate,
        )
    except KeyboardInterrupt:
        return 130
    except Exception:
        if _other_rank(options.distributed):
            return 1  # every rank raised it alike (a rank's own error aborts the job): rank 0 prints it once
        raise
    if _other_rank(options.distributed):
        return 0
    if result.out is not None:
        print(f"trained model: {result.out}")
    if result.plot is not None:
        print(f"curves: {result.plot}")
    return 0
