"""Command line: ``ortlstm demo``, ``ortlstm convert``, ``ortlstm artifacts`` (also ``python -m ortlstm``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ortlstm

_LOSSES = ("CrossEntropyLoss", "MSELoss", "BCEWithLogitsLoss", "L1Loss")
_OPTIMIZERS = ("AdamW", "SGD")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortlstm", description="LSTM training ops for ONNX Runtime.")
    parser.add_argument("--version", action="version", version=f"ortlstm {ortlstm.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="train a bidirectional LSTM digit classifier in ONNX Runtime, end to end",
        description="Builds a bidirectional LSTM classifier in PyTorch, exports it with torch.onnx.export, "
        "converts it with ortlstm and trains it with onnxruntime-training on scikit-learn's handwritten digits "
        "(each image read row by row as an 8-step sequence). Prints the held-out accuracy and writes a plot.",
    )
    demo.add_argument("--epochs", type=int, default=12)
    demo.add_argument("--batch-size", type=int, default=32)
    demo.add_argument("--hidden-size", type=int, default=64)
    demo.add_argument("--learning-rate", type=float, default=0.01)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    demo.add_argument("--plot", type=Path, default=Path("ortlstm_demo.png"), help="PNG of loss and accuracy")

    convert = commands.add_parser("convert", help="rewrite a model's ONNX LSTM nodes into ortlstm LSTMTraining")
    convert.add_argument("input", type=Path)
    convert.add_argument("output", type=Path)

    artifacts = commands.add_parser("artifacts", help="generate onnxruntime-training artifacts for a model")
    artifacts.add_argument("model", type=Path)
    artifacts.add_argument("directory", type=Path)
    artifacts.add_argument("--requires-grad", nargs="+", default=None, metavar="NAME", help="default: all floats")
    artifacts.add_argument("--frozen", nargs="+", default=[], metavar="NAME")
    artifacts.add_argument("--loss", choices=_LOSSES, default="CrossEntropyLoss")
    artifacts.add_argument("--optimizer", choices=_OPTIMIZERS, default="AdamW")
    return parser


def _demo(args: argparse.Namespace) -> int:
    from ortlstm.demo import run_demo

    result = run_demo(
        epochs=args.epochs,
        batch_size=args.batch_size,
        hidden_size=args.hidden_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
        plot=args.plot,
        threads=args.threads,
    )
    print(f"held-out accuracy: {result.test_accuracy:.1%} ({result.seconds:.0f} s)")
    if result.plot is not None:
        print(f"loss and accuracy curves: {result.plot}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    import onnx

    from ortlstm.graphs import convert

    converted = convert(onnx.load(str(args.input)))
    onnx.save(converted, str(args.output))
    count = sum(node.op_type == "LSTMTraining" for node in converted.graph.node)
    print(f"{args.output}: {count} LSTM node(s) in the main graph now run as ortlstm.LSTMTraining")
    return 0


def _artifacts(args: argparse.Namespace) -> int:
    import onnx

    from ortlstm.graphs import generate_artifacts
    from ortlstm.graphs.gradient import import_training_runtime

    import_training_runtime()
    from onnxruntime.training import artifacts as ort_artifacts

    result = generate_artifacts(
        onnx.load(str(args.model)),
        requires_grad=args.requires_grad,
        frozen_params=args.frozen,
        loss=getattr(ort_artifacts.LossType, args.loss),
        optimizer=getattr(ort_artifacts.OptimType, args.optimizer),
        artifact_directory=args.directory,
    )
    for path in (result.training_model, result.eval_model, result.optimizer_model, result.checkpoint):
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs the command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The process exit status.
    """
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    handlers = {"demo": _demo, "convert": _convert, "artifacts": _artifacts}
    try:
        return handlers[args.command](args)
    except (ImportError, ValueError, FileNotFoundError) as error:
        print(f"ortlstm {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
