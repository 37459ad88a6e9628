"""Losses appended to a model in standard ONNX ops, with torch.nn.functional's formulas and defaults.

One function per loss, beside its torch formula, in a module per family (``FAMILIES``:
class-index losses in ``classification``, element-wise ones in ``regression``, ``divergence``
and ``binary``, ctc_loss in ``sequence``, a model output as the loss in ``output``), each registered in one table
(``LOSSES``, see ``base``; ``KINDS`` lists its names) that the train-step builder, the Trainer
and the command line read.

``Loss`` describes one (``Loss.cross_entropy(label_smoothing=0.1)``, ``Loss.output()``, ...);
``add_loss(emitter, spec, prediction, target)`` emits it and returns the loss value's name (a
loss that reads more than one target, ctc_loss, also takes ``{name: value}`` of its
``Loss.extra_targets``);
``check_target`` refuses a target of the wrong element type or shape before anything is built
(``target_facts`` says what a train step's target may be, ``check_target_type`` refuses another
type, ``target_size_warning`` is torch's warning for a target that broadcasts),
``check_target_values`` target values torch refuses; ``gradient_seed`` says where the backward
starts. Each loss function also works on its own: ``cross_entropy(emitter, input, target, ...)``
with torch's arguments (after the emitter) and defaults. A new loss is one registered function in
the family module it belongs to (see ``register_loss``), plus its test rows; its table entry also
declares what ``fit`` and distributed training read (``METRICS``, ``MEANS``: ``facts``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ortlstm.graphs.losses.base import (
    BROADCASTS,
    INDEX_TYPES,
    KL_DIV_REDUCTIONS,
    LOSSES,
    REDUCTIONS,
    ExtraTarget,
    Loss,
    LossDef,
    TargetFacts,
    add_loss,
    check_target,
    check_target_type,
    check_target_values,
    gradient_seed,
    register_loss,
    target_facts,
    target_size_warning,
)
from ortlstm.graphs.losses.facts import MEANS, METRICS

FAMILIES = ("classification", "regression", "divergence", "binary", "sequence", "output")
"""The modules that register the losses, imported in this order: the table's (the CLI lists it)."""
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")

KINDS: tuple[str, ...] = tuple(LOSSES)
"""Every registered loss: torch.nn.functional's names, then ``"output"`` (a model output as the loss)."""


def __getattr__(name: str) -> Callable[..., str]:
    """``losses.cross_entropy`` and every other registered loss function, with torch's arguments."""
    entry = LOSSES.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return entry.function


def __dir__() -> list[str]:
    return sorted({*globals(), *LOSSES})


__all__ = [
    "BROADCASTS",
    "FAMILIES",
    "INDEX_TYPES",
    "KINDS",
    "KL_DIV_REDUCTIONS",
    "LOSSES",
    "MEANS",
    "METRICS",
    "REDUCTIONS",
    "ExtraTarget",
    "Loss",
    "LossDef",
    "TargetFacts",
    "add_loss",
    "check_target",
    "check_target_type",
    "check_target_values",
    "gradient_seed",
    "register_loss",
    "target_facts",
    "target_size_warning",
]
