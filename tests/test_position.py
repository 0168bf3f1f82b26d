"""The data position: what moves it, what a checkpoint keeps of it, where a resumed run reads."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.datasets import DataSpec, RecDataset
from shadowsync.pipelines.position import DataPosition


class _Numbered(RecDataset):
    """Four batches per epoch; batch i of epoch e has the single label 10 * e + i."""

    spec = DataSpec([], ["f"], [1])

    def batches(self, split: str, batch_size: int, rank: int, world_size: int,
                epoch: int = 0) -> Iterator[Batch]:
        for i in range(4):
            yield Batch(dense_features=torch.zeros(1, 0),
                        sparse_features=KeyedJaggedTensor.empty(),
                        labels=torch.tensor([10 * epoch + i]))


def _labels(position: DataPosition) -> list[int]:
    return [int(b.labels) for b in position.batches(_Numbered(), 1, 0, 1)]


def test_advance_and_next_epoch_move_the_position_together() -> None:
    position = DataPosition()
    for _ in range(3):
        position.advance()
    assert (position.step, position.epoch, position.epoch_step) == (3, 0, 3)
    position.next_epoch()
    position.advance()
    assert (position.step, position.epoch, position.epoch_step) == (4, 1, 1)


def test_batches_start_at_the_first_batch_not_trained_on() -> None:
    position = DataPosition(step=6, epoch=1, epoch_step=2)
    assert _labels(position) == [12, 13]
    position.next_epoch()
    assert _labels(position) == [20, 21, 22, 23]


def test_state_dict_round_trips_through_a_checkpoints_per_rank_state() -> None:
    saved = DataPosition(step=7, epoch=1, epoch_step=3)
    local = {**saved.state_dict(), "dense": {}, "last_eval": 5}  # the trainer's keys beside it
    assert set(local) >= {"step", "epoch", "epoch_step"}  # the keys older checkpoints have
    resumed = DataPosition()
    resumed.load_state_dict(local)
    assert resumed == saved
    assert _labels(resumed) == [13]
