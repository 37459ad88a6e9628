"""Command line (also ``python -m ortlstm``).

Commands: ``demo``, ``demo-chars``, ``demo-ocr``, ``convert``, ``train-step``, ``fit``, ``export``, ``artifacts``.
Each one's parser and handler live in ``ortlstm.cli``; this module assembles them.
"""

from __future__ import annotations

import argparse
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
    try:
        return run(args)
    except (ImportError, ValueError, FileNotFoundError) as error:
        print(f"ortlstm {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
