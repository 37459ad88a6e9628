"""The one table of a Trainer's options (issue 34): the builder's rows and the Trainer's own.

``OPTIONS`` is every keyword of ``Trainer`` (its signature's order) with its type, default, help
text, surfaces and whether a run saves it; the rows that reach the train-step builder are
``ortlstm.graphs.options.BUILDER_OPTIONS``' (written once, there, a layer below). From this table
derive: the Trainer's signature defaults (``DEFAULTS``), ``TrainingSpec``'s field defaults, the
run-time keywords of the constructors that reopen a run (``run_time_values``), ``fit``'s options
(``fit.TRAINER_OPTIONS``) and the command line's defaults and help texts (``cli.common``).
tests/test_option_defaults.py fails when one of them says otherwise.

Adding an option: its row here (or in ``graphs/options.py`` when the builder takes it), its field in
``TrainingSpec`` with its role, its keyword in ``Trainer.__init__`` (and in ``open`` /
``from_checkpoint`` when run-time), its ``add_argument`` on the command line; every default and help
text is read from the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ortlstm.graphs.options import (
    BUILDER_OPTIONS,
    FIT,
    REOPEN,
    SPEC,
    TRAIN_STEP,
    TRAINER,
    Option,
    by_name,
    defaults,
    option,
)

_TRAINER_ONLY: Final = (
    option(
        "stateful",
        "bool",
        False,
        "truncated BPTT: batch k is rows k*B..(k+1)*B-1 in order, row i continues row i of the batch "
        "before; the LSTM/GRU/RNN state carries over and is reset each epoch (no shuffle)",
        (SPEC, TRAINER, FIT, TRAIN_STEP),
    ),
    option(
        "lr", "LearningRate | None", None, "learning rate (default: torch's)", (SPEC, TRAINER, REOPEN, FIT),
        run_time=True,
    ),
    option("threads", "int | None", None, "onnxruntime intra-op threads", (SPEC, TRAINER, REOPEN, FIT), run_time=True),
    option(
        "nonfinite",
        "str",
        "raise",
        "a NaN or inf loss or gradient: raise (stop) or skip the update (counted per epoch)",
        (SPEC, TRAINER, REOPEN, FIT),
        run_time=True,
    ),
)

OPTIONS: Final[tuple[Option, ...]] = (
    *(each for each in BUILDER_OPTIONS if TRAINER in each.surfaces),
    *_TRAINER_ONLY,
)
"""Every keyword of ``Trainer(model, ...)``: the builder's rows that the Trainer has, then its own."""

BY_NAME: Final[Mapping[str, Option]] = by_name(OPTIONS)
"""``OPTIONS`` by keyword."""

DEFAULTS: Final[Mapping[str, Any]] = defaults(OPTIONS)
"""The Trainer's keyword defaults: ``clip_norm_type: float = DEFAULTS["clip_norm_type"]``."""

RUN_TIME: Final[tuple[str, ...]] = tuple(each.name for each in OPTIONS if each.run_time)
"""The run-time options: not saved with a run, given again to each constructor that reopens one."""


def run_time_values(scope: Mapping[str, Any]) -> dict[str, Any]:
    """The run-time options out of a constructor's ``locals()``, by name: no constructor lists them by hand."""
    return {name: scope[name] for name in RUN_TIME}
