"""Each loss's facts in its table entry (metric, 'mean' denominator, labels' lengths), and that fit reads them.

The 'mean' denominator each entry declares (``Loss.mean_denominator``, which
``distributed.loss_weight`` counts) is checked against torch: for every recorded torch call
pair of tests/recordings/losses.npz that differs only in ``reduction``, torch's ``'sum'`` over
its ``'mean'`` is the denominator; ctc_loss's ``'mean'`` (tests/recordings/ctc.npz) is its
``'none'`` losses over their target lengths, summed, over the samples. A new loss is in the
table walk below by being registered: one without a torch recording of mean and sum fails here.
No package module outside graphs/losses/ (and the CLI's tables of spellings) names a loss.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import numpy as np
import pytest

from ortlstm.distributed import loss_weight
from ortlstm.graphs import losses
from ortlstm.graphs.emit.emitter import GraphEmitter

RECORDINGS = pathlib.Path(__file__).resolve().parent / "recordings"
SOURCES = pathlib.Path(__file__).resolve().parents[1] / "src" / "ortlstm"
_LOSSES = np.load(RECORDINGS / "losses.npz")
_CASES: list[dict[str, Any]] = json.loads(str(_LOSSES["configs"]))["cases"]


def _loss_value(case: dict[str, Any]) -> float:
    return float(_LOSSES["float64/loss"][case["loss_offset"]])


def _pairs() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(mean case, sum case) of the same kind, data and other arguments; torch's mean read a denominator.

    Left out: calls whose every target is ignored (torch's mean is 0/0, NaN: no denominator to read).
    """
    by_call = {(case["kind"], case["data"], json.dumps({**case["kwargs"], "reduction": None})): {} for case in _CASES}
    for case in _CASES:
        key = (case["kind"], case["data"], json.dumps({**case["kwargs"], "reduction": None}))
        by_call[key][case["kwargs"]["reduction"]] = case
    pairs = [(calls["mean"], calls["sum"]) for calls in by_call.values() if "mean" in calls and "sum" in calls]
    return [pair for pair in pairs if np.isfinite(_loss_value(pair[0])) and _loss_value(pair[0]) != 0.0]


PAIRS = _pairs()


@pytest.mark.parametrize(("mean", "summed"), PAIRS, ids=[mean["name"] for mean, _ in PAIRS])
def test_mean_denominator_is_torchs_sum_over_its_mean(mean: dict[str, Any], summed: dict[str, Any]) -> None:
    prediction = _LOSSES[f"{mean['data']}/float64/input"]
    target = _LOSSES[f"{mean['data']}/float64/target"]
    mean_value, sum_value = _loss_value(mean), _loss_value(summed)
    spec = losses.Loss(mean["kind"], **mean["kwargs"])
    if losses.LOSSES[spec.kind].class_target and target.dtype.kind == "f":
        # class probabilities of a loss declared on class indices: the weight counts the classes too, a
        # factor common to every rank (only the ratio between ranks matters), not torch's denominator
        classes = prediction.shape[1 if prediction.ndim > 1 else 0]  # a [C] prediction: one unbatched sample
        spec = losses.Loss(mean["kind"], **mean["kwargs"], class_probabilities=True)
    else:
        classes = 1
    weight = loss_weight(spec, target, prediction.shape[0] if prediction.ndim else 1, {}, prediction.shape)
    np.testing.assert_allclose(weight, sum_value / mean_value * classes, rtol=1e-9)


def test_ctc_mean_divides_by_the_samples_of_its_lengths() -> None:
    data = np.load(RECORDINGS / "ctc.npz")
    spec = losses.Loss.ctc_loss()
    assert spec.mean_denominator == "samples" and spec.lengths == "target_lengths"
    for case in ("random_padded", "random_concatenated"):
        lengths = data[f"{case}/target_lengths"]
        per_sample = data[f"{case}/float64/loss_none"] / np.maximum(lengths, 1)
        weight = loss_weight(spec, data[f"{case}/targets"], 0, {"target_lengths": lengths})
        np.testing.assert_allclose(per_sample.sum() / weight, data[f"{case}/float64/loss_mean"], rtol=1e-12)


def test_every_loss_declares_facts_fit_and_distributed_can_act_on() -> None:
    recorded = {mean["kind"] for mean, _ in PAIRS}
    for kind, entry in losses.LOSSES.items():
        assert entry.metric in (*losses.METRICS, None), kind
        assert entry.mean in losses.MEANS, kind
        if entry.metric == "accuracy":
            assert entry.class_target, kind
        if entry.lengths is not None:
            assert entry.lengths in [extra.name for extra in entry.extra_targets], kind
        # the denominator is checked against torch above: a recorded mean/sum pair, or ctc's own test
        checked = kind in recorded or entry.mean == "samples" or not entry.needs_target
        assert checked, f"{kind}: record torch's mean and sum of it in tests/recordings/record_torch.py"
    assert losses.Loss.cross_entropy().metric == "accuracy"
    assert losses.Loss.cross_entropy(class_probabilities=True).metric is None  # no argmax against probabilities
    assert losses.Loss.ctc_loss().metric == "cer"
    assert losses.Loss.mse_loss().metric is None
    assert losses.Loss.kl_div(reduction="batchmean").mean_denominator == "batch"
    assert losses.Loss.output().mean_denominator == "batch"
    assert losses.Loss.nll_loss(reduction="sum").mean_denominator is None


def _package_files() -> list[pathlib.Path]:
    """Every package module outside graphs/losses/ and the CLI's tables of names (old spellings, LossType)."""
    graphs = SOURCES.parents[1] / "graphs"
    files = [path for path in SOURCES.rglob("*.py") if path.relative_to(SOURCES).parts[0] not in CLI_AND_LINKS]
    return files + [path for path in graphs.rglob("*.py") if "losses" not in path.relative_to(graphs).parts]


CLI_AND_LINKS = ("cli", "graphs", "ops")
"""cli/ maps torch.nn's class names and onnxruntime-training's LossType names to kinds (a table of
spellings, not a decision); graphs/ and ops/ may be links to the checkout's own folders here."""


def test_no_module_outside_the_loss_package_names_a_loss() -> None:
    """fit, distributed training, the Trainer and the graph builders act on the declared facts, never on a name."""
    names = [kind for kind in losses.LOSSES if kind != "output"]  # "output" is a word of its own
    literal = re.compile("[\"'](" + "|".join(names) + ")[\"']")
    by_kind = re.compile(r"\.kind\s*(==|!=|\bin\b)")
    files = _package_files()
    assert SOURCES / "fit" / "evaluation.py" in files and SOURCES / "distributed.py" in files
    found = [
        f"{path}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if literal.search(line) or (by_kind.search(line) and "loss" in line)
    ]
    assert not found, "\n".join(found)


def test_register_loss_refuses_facts_that_disagree() -> None:
    def labels_loss(emitter: GraphEmitter, input: str, target: str, reduction: str = "mean") -> str:
        return input

    with pytest.raises(ValueError, match=r"labels_loss: metric must be one of \('accuracy', 'cer'\) or None"):
        losses.register_loss(metric="f1")(labels_loss)
    with pytest.raises(ValueError, match=r"labels_loss: mean must be one of \('elements', 'class_weights'"):
        losses.register_loss(mean="tokens")(labels_loss)
    with pytest.raises(ValueError, match="labels_loss: accuracy needs class_target=True"):
        losses.register_loss(metric="accuracy")(labels_loss)
    with pytest.raises(ValueError, match="labels_loss: class_weights needs class_target=True"):
        losses.register_loss(mean="class_weights")(labels_loss)
    with pytest.raises(ValueError, match=r"labels_loss: cer needs lengths \(the labels' per-sample counts\)"):
        losses.register_loss(metric="cer")(labels_loss)
    with pytest.raises(ValueError, match="labels_loss: mean 'samples' counts the entries of lengths"):
        losses.register_loss(mean="samples")(labels_loss)
    with pytest.raises(ValueError, match=r"labels_loss: lengths 'target_lengths' is none of its extra_targets \[\]"):
        losses.register_loss(lengths="target_lengths")(labels_loss)
    assert "labels_loss" not in losses.LOSSES
