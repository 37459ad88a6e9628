"""Command-line entry point (``ortlstm`` or ``python -m ortlstm``)."""

from __future__ import annotations

import sys

import ortlstm

_USAGE = """\
usage: ortlstm [-h] [--version]

LSTM training ops for ONNX Runtime. No subcommands yet.

options:
  -h, --help  show this message and exit
  --version   print the version and exit
"""


def main(argv: list[str] | None = None) -> int:
    """Runs the command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The process exit status.
    """
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        print(f"ortlstm {ortlstm.__version__}")
        return 0
    if args in ([], ["-h"], ["--help"]):
        print(_USAGE, end="")
        return 0
    print(_USAGE, end="", file=sys.stderr)
    print(f"ortlstm: error: unrecognized arguments: {' '.join(args)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
