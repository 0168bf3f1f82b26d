"""Where training stands in the data: the one owner of the step count and the epoch position."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torchrec.datasets.utils import Batch

from shadowsync.datasets import RecDataset


@dataclass
class DataPosition:
    """Training steps done (``step``), the current ``epoch`` and the batches of it done
    (``epoch_step``).

    Only :meth:`advance` (a step finished) and :meth:`next_epoch` (the epoch's stream ran out)
    move it, so what a checkpoint stores (:meth:`state_dict`) and the batch a resumed run
    reads next (:meth:`batches`) cannot drift apart.
    """

    step: int = 0
    epoch: int = 0
    epoch_step: int = 0

    def advance(self) -> None:
        self.step += 1
        self.epoch_step += 1

    def next_epoch(self) -> None:
        self.epoch += 1
        self.epoch_step = 0

    def batches(self, dataset: RecDataset, batch_size: int, rank: int,
                world_size: int) -> Iterator[Batch]:
        """This rank's training batches of the current epoch, from the first not trained on."""
        return itertools.islice(dataset.train_batches(batch_size, rank, world_size, self.epoch),
                                self.epoch_step, None)

    def state_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Takes the position from a checkpoint's per-rank state (its other keys are the
        trainer's)."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, int(state[f.name]))
