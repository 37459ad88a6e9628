"""What data-parallel training (ortlstm.distributed) computes without MPI: shards, epochs, the loss weights.

The weights are checked in one process against the loss itself: the gradients of the shards,
scaled by ``loss_weight`` and summed, are the gradient of the whole batch, for each loss's mean.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_trainer import CLASSES, batches, classifier

from ortlstm.distributed import epoch_batches, loss_weight, shard
from ortlstm.graphs import losses, optimizers
from ortlstm.training import Trainer


def test_shard_splits_every_sample_once_in_order() -> None:
    for total in (0, 1, 5, 7, 8):
        for size in (1, 2, 3):
            parts = [shard(total, rank, size) for rank in range(size)]
            assert [i for part in parts for i in range(total)[part]] == list(range(total))
            assert max(len(range(total)[p]) for p in parts) - min(len(range(total)[p]) for p in parts) <= 1
    with pytest.raises(ValueError, match=r"shard\(\): rank must be in \[0, size=2\), got 2"):
        shard(4, 2, 2)


def test_epoch_batches_hold_every_sample_once_whatever_the_ranks() -> None:
    batches = epoch_batches(10, 4, epoch=3, seed=7)
    assert [len(batch) for batch in batches] == [4, 4, 2]
    assert sorted(np.concatenate(batches).tolist()) == list(range(10))
    again = epoch_batches(10, 4, epoch=3, seed=7)  # another rank, or a resumed run
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    assert not np.array_equal(np.concatenate(batches), np.concatenate(epoch_batches(10, 4, epoch=4, seed=7)))
    for size in (1, 2, 3):  # the ranks' shards of each batch are that batch, in order
        for batch in batches:
            assert (
                np.concatenate([batch[shard(len(batch), rank, size)] for rank in range(size)]).tolist()
                == batch.tolist()
            )


def test_epoch_batches_in_order_and_dropping_the_last() -> None:
    assert [batch.tolist() for batch in epoch_batches(5, 2, epoch=0, shuffle=False)] == [[0, 1], [2, 3], [4]]
    assert [len(batch) for batch in epoch_batches(5, 2, epoch=0, drop_last=True)] == [2, 2]
    with pytest.raises(ValueError, match=r"epoch_batches\(\): batch_size must be >= 1, got 0"):
        epoch_batches(5, 0, epoch=0)


def _float_target(rows: int, rng: np.random.Generator) -> np.ndarray:
    return rng.random((rows, CLASSES), dtype=np.float32)


# (id, loss, target maker): each loss whose 'mean' divides by a different count.
WEIGHT_CASES = [
    ("cross_entropy", losses.Loss.cross_entropy(), None),
    (
        "cross_entropy_weight_ignore",
        losses.Loss.cross_entropy(weight=np.array([1, 3, 0.5], np.float32), ignore_index=1),
        None,
    ),
    ("cross_entropy_smoothing", losses.Loss.cross_entropy(label_smoothing=0.2, ignore_index=0), None),
    ("nll_loss_weight", losses.Loss.nll_loss(weight=np.array([2, 1, 0.25], np.float32)), None),
    ("mse_loss", losses.Loss.mse_loss(), _float_target),
    ("l1_loss", losses.Loss.l1_loss(), _float_target),
    ("smooth_l1_loss", losses.Loss.smooth_l1_loss(beta=0.5), _float_target),
    ("huber_loss", losses.Loss.huber_loss(), _float_target),
    ("binary_cross_entropy_with_logits", losses.Loss.binary_cross_entropy_with_logits(), _float_target),
    ("soft_margin_loss", losses.Loss.soft_margin_loss(), _float_target),
    ("kl_div_mean", losses.Loss.kl_div(), _float_target),
    ("kl_div_batchmean", losses.Loss.kl_div(reduction="batchmean"), _float_target),
    ("mse_loss_sum", losses.Loss.mse_loss(reduction="sum"), _float_target),
]


@pytest.mark.parametrize(("loss", "make_target"), [case[1:] for case in WEIGHT_CASES], ids=[c[0] for c in WEIGHT_CASES])
@pytest.mark.parametrize("ranks", [2, 3])
def test_shard_gradients_weighted_by_loss_weight_are_the_global_gradient(
    loss: losses.Loss, make_target: object, ranks: int, rng: np.random.Generator
) -> None:
    """The rule DistributedTrainer scales by, checked in one process: sum_r w_r/W * grad_r = grad(global)."""
    ((x, labels),) = batches(1, size=7, seed=3)
    labels[:3] = [1, 1, 1]  # with ignore_index=1, rank 0's shard of 3 ranks is all ignored (weight 0)
    target = labels if make_target is None else make_target(len(x), rng)  # type: ignore[operator]
    subject = Trainer(classifier(), loss=loss, optimizer=optimizers.SGD(lr=0.1), threads=1)
    subject.accumulate(x, target=target)
    expected = {name: value.copy() for name, value in subject.accumulated_gradients.items()}
    subject.zero_grad()
    parts = [shard(len(x), rank, ranks) for rank in range(ranks)]
    weights = [loss_weight(loss, target[part], len(x[part]), {}) for part in parts]
    mean = loss.reduction not in ("sum", "none")
    total = {name: np.zeros_like(value) for name, value in expected.items()}
    for part, weight in zip(parts, weights, strict=True):
        if weight == 0:
            continue
        subject.accumulate(x[part], target=target[part])
        for name, value in subject.accumulated_gradients.items():
            total[name] += value * np.float32(weight / sum(weights) if mean else 1.0)
        subject.zero_grad()
    for name, value in expected.items():
        np.testing.assert_allclose(total[name], value, rtol=1e-5, atol=1e-7, err_msg=f"{loss.kind}: {name}")


def test_a_stateful_trainer_is_refused_before_mpi_is_needed() -> None:
    from ortlstm.distributed import DistributedTrainer

    stateful = Trainer(classifier(), loss=losses.Loss.cross_entropy(), optimizer=optimizers.SGD(lr=0.1), stateful=True)
    with pytest.raises(ValueError, match=r"a stateful Trainer carries LSTM state per batch row.*stateful=False"):
        DistributedTrainer(stateful)
