"""Every option of the train-step builder, with its default, written once (issue 34).

Why a table: a default written per surface drifts apart without any test noticing (before this,
``clip_norm_type=2.0`` was written 7 times and ``target="target"`` 4). Each option is one row
here; the builder's keyword defaults (``build_training_models``), ``clip_settings`` and the
Trainer's rows above it (``ortlstm.training.options``, which adds the Trainer's own options and
is the table ``TrainingSpec``, ``Trainer``, ``fit`` and the command line read) take their values
from it, and tests/test_option_defaults.py fails when a surface says otherwise.

Standard library and ``graphs.convert`` (``MAX_IR_VERSION``) only: every layer above reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ortlstm.graphs.convert import MAX_IR_VERSION

BUILDER: Final = "build_training_models"
SPEC: Final = "TrainingSpec"
TRAINER: Final = "Trainer"
REOPEN: Final = "Trainer.open, Trainer.from_checkpoint"
FIT: Final = "fit"
TRAIN_STEP: Final = "train-step"
SURFACES: Final = (BUILDER, SPEC, TRAINER, REOPEN, FIT, TRAIN_STEP)
"""Where an option can appear: the builder's keywords, the spec's fields, the Trainer's keywords, the keywords
of the constructors that reopen a run (the run-time options only), ``ortlstm fit`` (and its --config), and
``ortlstm train-step``."""


class _Required:
    """The default of an option every caller must give (``loss``, ``optimizer``)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: its keyword, type, default, help text, surfaces and whether a run saves it.

    Attributes:
        name: Its keyword in ``Trainer`` and the builder (``TrainingSpec``'s field may be named
            otherwise: its role's ``keyword`` says so).
        type: Its annotation as the Trainer's signature writes it (module prefixes aside).
        default: Its default, in the form the Trainer and the builder take (``REQUIRED``: none).
        help: Its help text on the command line (``--NAME``); empty where it has none there.
        surfaces: Where it appears (``SURFACES``).
        run_time: A run-time option: neither saved with a run nor compared on load, given again to
            every constructor that reopens one (``REOPEN``). The others are saved with the run.
        cli: Its name on the command line and in fit's ``--config`` (``_`` written ``-`` there), when
            not ``name``.
    """

    name: str
    type: str
    default: Any
    help: str
    surfaces: frozenset[str]
    run_time: bool = False
    cli: str | None = None

    @property
    def required(self) -> bool:
        """No default: every caller gives it."""
        return self.default is REQUIRED

    @property
    def command_line(self) -> str:
        """Its name in fit's ``--config`` and ``fit.TRAINER_OPTIONS`` (``--`` + this with ``-`` on the command line)."""
        return self.cli or self.name


def option(
    name: str,
    type: str,
    default: Any,
    help: str,
    surfaces: Iterable[str],
    *,
    run_time: bool = False,
    cli: str | None = None,
) -> Option:
    """A row of the table (its surfaces as a set, checked against ``SURFACES``).

    Raises:
        ValueError: A surface that is not one of ``SURFACES``.
    """
    unknown = sorted(set(surfaces) - set(SURFACES))
    if unknown:
        raise ValueError(f"option {name}: unknown surfaces {unknown}; expected some of {list(SURFACES)}")
    return Option(name, type, default, help, frozenset(surfaces), run_time, cli)


EVERYWHERE: Final = (BUILDER, SPEC, TRAINER, FIT, TRAIN_STEP)
"""The surfaces of a saved option that reaches the builder (most of them)."""

BUILDER_OPTIONS: Final[tuple[Option, ...]] = (
    option("loss", "losses.Loss", REQUIRED, "a torch.nn.functional loss, or output: the model output is the loss",
           EVERYWHERE),
    option("optimizer", "optimizers.Optimizer", REQUIRED, "a torch.optim optimizer, in lower case", EVERYWHERE),
    option(
        "requires_grad",
        "Sequence[str] | None",
        None,
        "parameters to train, named as --frozen names them; default: what torch trains (a torch export's "
        "parameters; without metadata, float tensors of rank >= 1)",
        EVERYWHERE,
    ),
    option(
        "frozen",
        "Sequence[str]",
        (),
        "parameters not to train: names, globs ('FeatureExtraction.*') or module prefixes, torch names too",
        EVERYWHERE,
    ),
    option("output", "str | None", None, "the model output the loss reads (default: its only output)", EVERYWHERE),
    option("target", "str", "target", "name of the target input", EVERYWHERE),
    option("extra_outputs", "Sequence[str]", (), "model outputs each step returns", EVERYWHERE),
    option(
        "param_groups",
        "Sequence[optimizers.ParamGroup]",
        (),
        'parameter groups, e.g. \'[{"params": ["lstm.B"], "weight_decay": 0}]\' (ParamGroup\'s fields; '
        "a group's lr as lr_scale)",
        EVERYWHERE,
    ),
    option(
        "clip_grad_norm",
        "float | None",
        None,
        "scale the gradients to a total norm of at most MAX_NORM (torch's clip_grad_norm_)",
        EVERYWHERE,
    ),
    option("clip_norm_type", "float", 2.0, "2 or inf", EVERYWHERE),
    option(
        "clip_grad_value",
        "float | None",
        None,
        "clamp every gradient element to [-VALUE, VALUE] (torch's clip_grad_value_); not with --clip-grad-norm",
        EVERYWHERE,
    ),
    option(
        "fixed_inputs",
        "Mapping[str, np.ndarray] | None",
        None,
        "fix an input for training (e.g. sr=16000; a list as 1,2,3): the If nodes it decides keep one branch",
        EVERYWHERE,
        cli="fixed_input",
    ),
    option(
        "fixed_shapes",
        "Mapping[str, Sequence[int | str | None]] | None",
        None,
        "fix an input's shape for training, one entry per axis, '?' keeps an axis (e.g. input=?,576)",
        EVERYWHERE,
        cli="fixed_shape",
    ),
    option("ir_version", "int", MAX_IR_VERSION, "the training models' IR version", EVERYWHERE),
    option("nonfinite_check", "bool", True, "", (BUILDER,)),
    option("kernel_gradients", "bool | None", None, "", (BUILDER,)),
    option(
        "precision",
        "str",
        "32-true",
        "bf16-mixed: the LSTM/GRU/RNN/Conv GEMMs on bfloat16 operands with float32 accumulation, weights "
        "and optimizer state (torch.autocast's bf16 on the CPU)",
        EVERYWHERE,
    ),
)
"""The builder's options, in its signature's order (the Trainer's rows among them say so in ``surfaces``)."""


def defaults(options: Iterable[Option]) -> dict[str, Any]:
    """Each option's default by name (the required ones left out)."""
    return {each.name: each.default for each in options if not each.required}


def by_name(options: Iterable[Option]) -> Mapping[str, Option]:
    """The rows by name."""
    return {each.name: each for each in options}


BUILDER_DEFAULTS: Final[Mapping[str, Any]] = defaults(BUILDER_OPTIONS)
"""``build_training_models``' keyword defaults: ``target: str = BUILDER_DEFAULTS["target"]``."""
