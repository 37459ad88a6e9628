"""What the sub-commands share: torch's vocabulary, old spellings with a deprecation message, the Trainer's options.

The Trainer's options are defined once, here (``add_training_options``, ``add_trainer_extras``),
and turned into ``Trainer`` keywords once (``trainer_arguments``): ``fit`` and ``train-step``
both use them, ``fit`` with the run-time options (--nonfinite, --threads) too.

One vocabulary, torch's: --loss takes torch.nn.functional's names (the loss table,
ortlstm.graphs.losses.KINDS), --optimizer torch.optim's in lower case (the optimizer table,
ortlstm.graphs.optimizers.OPTIMIZERS), --lr the learning rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# Old spellings, still accepted with a deprecation message on stderr: old -> new.
_OLD_TRAIN_LOSSES = {
    "bce": "binary_cross_entropy",
    "bce_with_logits": "binary_cross_entropy_with_logits",
    # torch.nn's class names (artifacts' old spelling, and what a torch user writes first)
    **{
        "CrossEntropyLoss": "cross_entropy",
        "NLLLoss": "nll_loss",
        "MSELoss": "mse_loss",
        "L1Loss": "l1_loss",
        "SmoothL1Loss": "smooth_l1_loss",
        "HuberLoss": "huber_loss",
        "KLDivLoss": "kl_div",
        "BCELoss": "binary_cross_entropy",
        "BCEWithLogitsLoss": "binary_cross_entropy_with_logits",
        "SoftMarginLoss": "soft_margin_loss",
        "CTCLoss": "ctc_loss",
    },
}


def _train_optimizers() -> dict[str, str]:
    """``--optimizer`` of train-step and fit: command-line name -> torch.optim class name, from the table."""
    from ortlstm.graphs import optimizers

    return {name.lower(): name for name in optimizers.OPTIMIZERS}


def _deprecation(prog: str, old: str, new: str) -> None:
    print(f"{prog}: warning: {old} is deprecated; use {new}", file=sys.stderr)


def renamed_values(prog: str, option: str, renamed: Mapping[str, str]) -> Callable[[str], str]:
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


def add_lr(parser: argparse.ArgumentParser, default: float) -> None:
    """``--lr`` (torch's name), and the old ``--learning-rate``."""
    parser.add_argument("--lr", type=float, default=default, help="learning rate")
    parser.add_argument("--learning-rate", dest="lr", type=float, action=_RenamedOption, new="--lr")


def add_out(
    parser: argparse.ArgumentParser, help: str, *, default: Path | None = None, positional: bool = False
) -> None:
    """``--out``: what a command writes (a model, a directory), one word in every command.

    ``--output`` is the model output the loss reads (fit, train-step); the demos' old ``--output``
    for their trained model still works, with a deprecation message. With ``positional``, the
    command's older form ``COMMAND INPUT OUT`` still works too: ``output_path`` reads either.
    """
    parser.add_argument("--out", type=Path, default=default, metavar="PATH", help=help)
    if positional:
        # Its own dest: train-step's --output is the model output the loss reads.
        parser.add_argument(
            "out_positional", type=Path, nargs="?", default=None, metavar="OUT", help="the same as --out"
        )
    else:
        parser.add_argument("--output", dest="out", type=Path, action=_RenamedOption, new="--out")


def add_quantize(parser: argparse.ArgumentParser) -> None:
    """``--quantize dynamic``: the trained model exported as int8 (``Trainer.export(..., quantize=...)``)."""
    from ortlstm.graphs.prepare.dequantize import QUANTIZE_CHOICES

    parser.add_argument(
        "--quantize",
        choices=QUANTIZE_CHOICES,
        default=None,
        help="write the trained model as int8 again, as onnxruntime.quantization.quantize_dynamic does "
        "(what ships int8 models such as ddddocr's); default: float32",
    )


def output_path(args: argparse.Namespace) -> Path:
    """What ``add_out(..., positional=True)`` read: ``--out PATH`` or the positional ``OUT``.

    Raises:
        ValueError: Neither is given, or both and they differ.
    """
    if args.out is not None and args.out_positional is not None and args.out != args.out_positional:
        raise ValueError(f"two outputs, {args.out_positional} and --out {args.out}: give one")
    out = args.out if args.out is not None else args.out_positional
    if out is None:
        raise ValueError("where to write is missing: pass --out PATH")
    return Path(out)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Appends ``(default: VALUE)`` to the help of each option that has a default, as users expect of --help.

    argparse's ArgumentDefaultsHelpFormatter shows nothing for an option without help text, and
    ``fit`` hides its defaults from the parser (so that ``--config`` can fill them in): the values
    are written into the help texts here, once, when the parser is built. Flags (store_true),
    hidden old spellings and defaults of None (the help says what absent means) are left alone.
    """
    for action in parser._actions:  # argparse lists a parser's actions nowhere public
        default = action.default
        if (
            action.help == argparse.SUPPRESS
            or default in (None, argparse.SUPPRESS)
            or default == []
            or isinstance(action, (argparse._StoreConstAction, argparse._HelpAction, argparse._VersionAction))
            or (not action.option_strings and action.nargs not in ("?", "*"))
            or "(default: " in (action.help or "")
        ):
            continue
        shown = str(default).replace("%", "%%")
        action.help = f"{action.help} (default: {shown})" if action.help else f"(default: {shown})"


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


def option_argument(name: str) -> dict[str, Any]:
    """``add_argument``'s ``default`` and ``help`` for the Trainer option ``name``, read off the one table.

    The table (``ortlstm.training.options.OPTIONS``) holds each option's default and help text once;
    a tuple default is argparse's list (what ``nargs`` and ``append`` give), None stays None (an
    ``append`` option then starts its own list), a required option has none.
    """
    from ortlstm.training.options import BY_NAME

    row = BY_NAME[name]
    default = None if row.required else list(row.default) if isinstance(row.default, tuple) else row.default
    return {"default": default, "help": row.help}


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """The Trainer's options, shared by ``train-step`` and ``fit``: loss, optimizer, what is trained, fixed inputs."""
    from ortlstm.graphs import losses

    parser.add_argument(
        "--loss",
        choices=losses.KINDS,
        type=renamed_values(parser.prog, "--loss", _OLD_TRAIN_LOSSES),
        required=True,
        **option_argument("loss"),
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
    optimizers = _train_optimizers()
    parser.add_argument(
        "--optimizer",
        choices=tuple(optimizers),
        type=renamed_values(parser.prog, "--optimizer", {torch: name for name, torch in optimizers.items()}),
        required=True,
        **option_argument("optimizer"),
    )
    parser.add_argument("--lr", type=float, **option_argument("lr"))
    parser.add_argument("--learning-rate", dest="lr", type=float, action=_RenamedOption, new="--lr")
    parser.add_argument("--weight-decay", type=float, default=None, help="default: torch's")
    parser.add_argument("--clip-grad-norm", type=float, metavar="MAX_NORM", **option_argument("clip_grad_norm"))
    parser.add_argument("--clip-norm-type", type=float, metavar="P", **option_argument("clip_norm_type"))
    parser.add_argument("--clip-grad-value", type=float, metavar="VALUE", **option_argument("clip_grad_value"))
    parser.add_argument("--requires-grad", nargs="+", metavar="NAME", **option_argument("requires_grad"))
    parser.add_argument("--frozen", nargs="+", metavar="PATTERN", **option_argument("frozen"))
    parser.add_argument("--output", metavar="NAME", **option_argument("output"))
    parser.add_argument("--target", metavar="NAME", **option_argument("target"))
    parser.add_argument(
        "--fixed-input", action="append", type=_named_value, metavar="NAME=VALUE", **option_argument("fixed_inputs")
    )
    parser.add_argument(
        "--fixed-shape", action="append", type=_named_dims, metavar="NAME=DIMS", **option_argument("fixed_shapes")
    )


def json_value(text: str) -> Any:
    """A JSON value of ``--param-groups`` or ``--schedule``."""
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected JSON, e.g. \'[{{"params": ["lstm.B"]}}]\', got {text!r}') from None


def json_option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of ``--optimizer-option``: VALUE as JSON (``betas=[0.9,0.99]``), else as text."""
    name, _, value = text.partition("=")
    if not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. momentum=0.9 or betas=[0.9,0.99]), got {text!r}")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def add_trainer_extras(parser: argparse.ArgumentParser, *, run_time: bool) -> None:
    """The Trainer's options beyond ``add_training_options``: optimizer options, groups, extra outputs, stateful, IR.

    Args:
        parser: ``fit``'s or ``train-step``'s parser.
        run_time: Also --nonfinite, which a training directory does not record (``fit``'s, not ``train-step``'s).
    """
    from ortlstm.training import NONFINITE_MODES

    parser.add_argument(
        "--optimizer-option",
        action="append",
        default=[],
        type=json_option,
        metavar="NAME=VALUE",
        help="a torch.optim hyperparameter (e.g. momentum=0.9, betas=[0.9,0.99], amsgrad=true); repeat for several",
    )
    parser.add_argument("--param-groups", type=json_value, metavar="JSON", **option_argument("param_groups"))
    parser.add_argument("--extra-outputs", nargs="+", metavar="NAME", **option_argument("extra_outputs"))
    parser.add_argument("--stateful", action=argparse.BooleanOptionalAction, **option_argument("stateful"))
    if run_time:
        parser.add_argument("--nonfinite", choices=NONFINITE_MODES, **option_argument("nonfinite"))
    parser.add_argument("--ir-version", type=int, **option_argument("ir_version"))
    add_precision(parser)


def add_precision(parser: argparse.ArgumentParser) -> None:
    """``--precision`` (Lightning's names): ``fit``, ``train-step`` and the demos."""
    from ortlstm.graphs.precision import PRECISIONS

    parser.add_argument("--precision", choices=tuple(PRECISIONS), **option_argument("precision"))


def trainer_arguments(args: argparse.Namespace, *, run_time: bool = False) -> dict[str, Any]:
    """``Trainer`` keywords from the options ``add_training_options`` and ``add_trainer_extras`` added.

    Args:
        args: The parsed options.
        run_time: Also the run-time options but ``lr`` (``fit``'s --threads, --nonfinite: ``RUN_TIME``).
    """
    from ortlstm.fit import param_groups_from_json
    from ortlstm.graphs import losses, optimizers
    from ortlstm.training.options import RUN_TIME

    hyperparameters = {
        name: value for name, value in (("lr", args.lr), ("weight_decay", args.weight_decay)) if value is not None
    }
    optimizer = optimizers.optimizer_from_torch(_train_optimizers()[args.optimizer], **hyperparameters)
    if args.optimizer_option:
        current = {field.name: getattr(optimizer, field.name) for field in dataclasses.fields(optimizer)}
        optimizer = optimizers.optimizer_from_torch(optimizer.torch_name, **{**current, **dict(args.optimizer_option)})
    keywords = {
        "loss": losses.Loss(args.loss, **_loss_options(args.loss, args.loss_option)),  # type: ignore[arg-type]
        "optimizer": optimizer,
        "requires_grad": args.requires_grad,
        "frozen": args.frozen,
        "output": args.output,
        "target": args.target,
        "extra_outputs": tuple(args.extra_outputs),
        "param_groups": param_groups_from_json(args.param_groups),
        "clip_grad_norm": args.clip_grad_norm,
        "clip_norm_type": args.clip_norm_type,
        "clip_grad_value": args.clip_grad_value,
        "fixed_inputs": dict(args.fixed_input or ()) or None,
        "fixed_shapes": dict(args.fixed_shape or ()) or None,
        "stateful": args.stateful,
        "ir_version": args.ir_version,
        "precision": args.precision,
    }
    if run_time:  # the optimizer's lr is --lr's; fit gives the Trainer's lr per update (fit_trainer_arguments)
        keywords.update({name: getattr(args, name) for name in RUN_TIME if name != "lr"})
    return keywords
