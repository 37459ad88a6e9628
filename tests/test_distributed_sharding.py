"""The data split of data-parallel training (ortlstm.distributed), which needs no MPI: shards and epochs."""

from __future__ import annotations

import numpy as np
import pytest

from ortlstm.distributed import epoch_batches, shard


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
