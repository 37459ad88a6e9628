"""The facts of a loss that ``fit`` and data-parallel training read from its table entry, not from its name.

``register_loss(metric=..., mean=..., lengths=...)`` declares them (``LossDef``); ``Loss.metric``,
``Loss.mean_denominator`` and ``Loss.lengths`` give them for one loss: fit's validation metric
(``fit.evaluation``), the denominator a rank's gradient is weighed by (``distributed.loss_weight``),
and the labels' layout (``fit.arrays``). A loss that declares none is a regression loss: no metric,
a mean over the elements, a target shaped like the prediction.
"""

from __future__ import annotations

from collections.abc import Sequence

METRICS = ("accuracy", "cer")
"""What ``fit`` reports beside the loss on validation data (``LossDef.metric``): ``accuracy``, the argmax over
the class axis against class indices (``ignore_index`` left out); ``cer``, the character error rate of the
prediction's greedy decoding against labels cut to their ``lengths`` (``ortlstm.metrics``)."""
MEANS = ("elements", "class_weights", "samples", "batch")
"""What a ``'mean'`` reduction divides by (``LossDef.mean``), which data-parallel training weighs each rank's
gradient by: ``elements``, the loss's elements (the target broadcast with the prediction); ``class_weights``, the
non-ignored class indices' weights (1 each without ``weight``; the elements for class probabilities);
``samples``, one per entry of the ``lengths`` extra target (ctc_loss divides each sample's loss by its target
length, then averages the samples); ``batch``, the batch's rows (a model output as the loss)."""


def check_facts(
    kind: str,
    class_target: bool,
    extra_targets: Sequence[str],
    metric: str | None,
    mean: str,
    lengths: str | None,
) -> None:
    """Refuses (at ``register_loss``) a metric, mean and lengths that fit and distributed training cannot act on."""
    if metric is not None and metric not in METRICS:
        raise ValueError(f"{kind}: metric must be one of {METRICS} or None, got {metric!r}")
    if mean not in MEANS:
        raise ValueError(f"{kind}: mean must be one of {MEANS}, got {mean!r}")
    if lengths is not None and lengths not in extra_targets:
        raise ValueError(f"{kind}: lengths {lengths!r} is none of its extra_targets {list(extra_targets)}")
    needs = {"accuracy": class_target, "cer": lengths is not None, "class_weights": class_target}
    for fact in (metric, mean):
        if not needs.get(fact or "", True):
            wanted = "class_target=True" if fact != "cer" else "lengths (the labels' per-sample counts)"
            raise ValueError(f"{kind}: {fact} needs {wanted}")
    if mean == "samples" and lengths is None:
        raise ValueError(f"{kind}: mean 'samples' counts the entries of lengths; declare lengths, or mean='batch'")
