"""Command line (also ``python -m ortlstm``).

Commands: ``demo``, ``demo-chars``, ``demo-ocr``, ``convert``, ``train-step``, ``fit``, ``export``, ``artifacts``.
Each one's parser and handler live in ``ortlstm.cli``; this module assembles them, and is the one
place where a command's errors become argparse's ``ortlstm CMD: error: ...`` line (exit status 1;
2 for a usage error or an option out of range), never a traceback (``ORTLSTM_TRACEBACK=1`` shows it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import ortlstm
from ortlstm.cli import demos, fit, models

# Names tests import from here, where they were defined before ortlstm.cli.
from ortlstm.cli.common import trainer_arguments as _trainer_arguments  # noqa: F401
from ortlstm.cli.fit import add_fit_arguments as _add_fit_arguments  # noqa: F401
from ortlstm.cli.fit import fit_options as _fit_options  # noqa: F401
from ortlstm.cli.fit import fit_trainer_arguments as _fit_trainer_arguments  # noqa: F401

_COMMANDS: dict[str, tuple[Callable[[Any], None], Callable[[argparse.Namespace], int]]] = {
    "demo": (demos.add_demo, demos.demo_command),
    "demo-chars": (demos.add_demo_chars, demos.demo_chars_command),
    "demo-ocr": (demos.add_demo_ocr, demos.demo_ocr_command),
    "convert": (models.add_convert, models.convert_command),
    "train-step": (models.add_train_step, models.train_step_command),
    "fit": (fit.add_fit, fit.fit_command),
    "export": (models.add_export, models.export_command),
    "artifacts": (models.add_artifacts, models.artifacts_command),
}
"""Each sub-command, in --help's order -> (adds its parser to the sub-parsers, runs it)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortlstm", description="LSTM training ops for ONNX Runtime.")
    parser.add_argument("--version", action="version", version=f"ortlstm {ortlstm.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_parser, _ in _COMMANDS.values():
        add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The process exit status.
    """
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    _, run = _COMMANDS[args.command]
    out_of_range = _out_of_range(args)
    if out_of_range is not None:
        print(f"ortlstm {args.command}: error: {out_of_range}", file=sys.stderr)
        return 2
    try:
        return run(args)
    except KeyboardInterrupt:
        print(f"ortlstm {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if os.environ.get(TRACEBACK_VARIABLE):
            raise
        print(f"ortlstm {args.command}: error: {error_line(error)}", file=sys.stderr)
        return 1


_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    **{
        dest: (lambda value: value >= 1, "an integer >= 1")
        for dest in ("epochs", "batch_size", "hidden_size", "steps", "seq_length", "streams", "held_out", "eval_every")
    },
    "threads": (lambda value: value >= 0, "an integer >= 0 (0: onnxruntime's default)"),
    "temperature": (lambda value: value > 0, "a number > 0"),
    "clean_fraction": (lambda value: 0 <= value <= 1, "a number from 0 to 1"),
}
"""The sizes and counts of any sub-command that has them -> (accepts the value, what it must be); refused
before the command runs, rather than as a division by zero or an empty run later."""


def _out_of_range(args: argparse.Namespace) -> str | None:
    """The message for the first option of ``_RANGES`` whose value is out of range, else None."""
    for dest, (accepts, expected) in _RANGES.items():
        value = getattr(args, dest, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not accepts(value):
            return f"argument --{dest.replace('_', '-')}: expected {expected}, got {value}"
    return None


TRACEBACK_VARIABLE = "ORTLSTM_TRACEBACK"
"""Set (to anything) in the environment, a command's error shows Python's traceback instead of one line."""

_EXPECTED_ERRORS = (ValueError, TypeError, OSError, ImportError, FloatingPointError, RuntimeError)
"""What ortlstm raises for a user's mistake or a run that failed (every message says what to do); see
``error_line`` for the others."""


def error_line(error: BaseException) -> str:
    """The one line after ``ortlstm CMD: error:`` for an exception a command raised.

    The package's own errors (``ValueError``, ``TypeError``, ``FileNotFoundError``, ``ImportError``,
    ``NonFiniteStepError``, ``DivergenceError``, ...) carry their message; an OS error of a path
    reads ``PATH: reason``; any other exception (a protobuf or onnxruntime error that escaped)
    is named by its type, with how to see the traceback. The lines of a long message are joined.
    """
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    else:
        text = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    if not isinstance(error, _EXPECTED_ERRORS):
        text = (
            f"{type(error).__module__}.{type(error).__qualname__}: {text} (unexpected here: set "
            f"{TRACEBACK_VARIABLE}=1 to see where it came from, and please report it)"
        )
    return text


if __name__ == "__main__":
    sys.exit(main())
