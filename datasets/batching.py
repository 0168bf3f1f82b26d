"""What every file-backed data set shares: turning arrays into a TorchRec ``Batch``, and
deciding which rows each rank reads so that all ranks step in lock-step.

Sharding rule (all data sets but ``synthetic``), :func:`plan_steps`: a split of ``N`` rows
read with batch size ``B`` by ``W`` ranks gives every rank ``N // (B * W)`` full batches. In
training, the remaining ``N % (B * W)`` rows (the last partial global batch) are not read in
that pass; the count is kept in the data set's ``stats`` and logged. Evaluation reads them
too, as TorchRec's ``InMemoryBinaryCriteoIterDataPipe(drop_last=False)`` does: one more step
whose rows are spread over the ranks (sizes differ by at most one), and when there are fewer
of them than ranks the last full step joins them (then each rank's last batch has ``B`` or
``B + 1`` rows). Every row is scored at every world size; a split with fewer rows than ranks
is an error.
"""

from __future__ import annotations

import abc
import functools
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.datasets.base import RecDataset

logger = logging.getLogger("shadowsync.datasets")


@dataclass(frozen=True)
class StepPlan:
    """Lock-step batches of a split: ``full_steps`` steps of ``batch_size`` rows on every rank,
    then, when ``last`` is not empty, one step of ``last[r]`` rows on rank ``r``. Global step
    ``k`` covers the split's rows in order, rank ``r`` taking the ``r``-th piece."""

    batch_size: int
    full_steps: int
    last: tuple[int, ...]
    unread: int

    def sizes(self, rank: int) -> np.ndarray:
        """Rows of each batch of rank ``rank``."""
        sizes = np.full(self.full_steps + bool(self.last), self.batch_size, dtype=np.int64)
        if self.last:
            sizes[-1] = self.last[rank]
        return sizes

    def window_starts(self, rank: int, world_size: int) -> np.ndarray:
        """First split row of each batch of ``rank`` when global steps are dealt round-robin."""
        step = self.batch_size * world_size
        starts = np.arange(self.full_steps, dtype=np.int64) * step + rank * self.batch_size
        if self.last:
            starts = np.append(starts, self.full_steps * step + sum(self.last[:rank]))
        return starts

    def share_start(self, rank: int) -> int:
        """First split row of ``rank`` when every rank reads one contiguous share."""
        return rank * self.full_steps * self.batch_size + sum(self.last[:rank])


def plan_steps(
    num_rows: int, batch_size: int, rank: int, world_size: int, read_tail: bool
) -> StepPlan:
    """The lock-step batches of a split (see the module docstring); ``read_tail`` for eval."""
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    full, tail = divmod(num_rows, batch_size * world_size)
    if not read_tail or tail == 0:
        return StepPlan(batch_size, full, (), tail)
    if tail < world_size:
        if full == 0:
            raise ValueError(
                f"the split has {num_rows} rows, fewer than the {world_size} ranks that must "
                "each score at least one"
            )
        full, tail = full - 1, tail + batch_size * world_size  # the last full step joins
    base, extra = divmod(tail, world_size)
    return StepPlan(batch_size, full, tuple(base + (r < extra) for r in range(world_size)), 0)


class WindowedDataset(RecDataset):
    """A data set whose splits can be read at any row (arrays in memory or memory-mapped).

    Every pass deals the global steps of :func:`plan_steps` to ranks round-robin (rank ``r``
    reads the ``r``-th window of each), as TorchRec's ``InMemoryBinaryCriteoIterDataPipe`` does.
    With ``shuffle``, training permutes the ``B``-row windows per ``(seed, epoch)`` (rows inside
    a window stay together, which keeps reads sequential on memory-mapped files); evaluation is
    always in order.
    ``stats[split]`` counts ``batches`` and ``unread_tail_rows`` over all passes and ranks.
    """

    name: str
    shuffle: bool
    seed: int
    stats: dict[str, Counter[str]]

    @abc.abstractmethod
    def num_rows(self, split: str) -> int:
        """Rows of ``split`` (``train`` or ``eval``)."""

    @abc.abstractmethod
    def fetch(self, split: str, start: int, stop: int) -> Batch:
        """Rows ``[start, stop)`` of ``split`` as one batch."""

    def _pass(
        self, split: str, batch_size: int, rank: int, world_size: int, seed: int | None
    ) -> Iterator[Batch]:
        num_rows = self.num_rows(split)
        plan = plan_steps(num_rows, batch_size, rank, world_size, read_tail=split == "eval")
        if seed is None:
            starts = plan.window_starts(rank, world_size)
        else:  # training only, so every step is a full one
            order = np.random.default_rng(seed).permutation(num_rows // batch_size)
            starts = order[: plan.full_steps * world_size][rank::world_size] * batch_size
        for start, size in zip(starts.tolist(), plan.sizes(rank).tolist(), strict=True):
            yield self.fetch(split, start, start + size)
        self.stats[split].update(batches=len(starts), unread_tail_rows=plan.unread)
        report_pass(self.name, split, rank, len(starts), 0, plan.unread)

    def batches(
        self, split: str, batch_size: int, rank: int, world_size: int, epoch: int = 0
    ) -> Iterator[Batch]:
        if split == "eval":
            return self._pass("eval", batch_size, rank, world_size, None)
        seed = self.seed * 1_000_003 + epoch if self.shuffle else None
        return self._pass(split, batch_size, rank, world_size, seed)


def make_batch(
    dense: np.ndarray,
    labels: np.ndarray,
    keys: list[str],
    one_hot: np.ndarray,
    multi_hot: list[np.ndarray] | None = None,
) -> Batch:
    """A TorchRec ``Batch`` from row-major arrays.

    ``one_hot`` is ``[B, F1]`` (one id per row and feature, the first ``F1`` keys); int32 ids
    stay int32 (as TorchRec's npy reader gives them), others become int64. Each array of
    ``multi_hot`` is ``[B, k]`` padded with ``-1`` (one bag per row, the remaining keys).
    """
    bags = multi_hot or []
    if len(keys) != one_hot.shape[1] + len(bags):
        raise ValueError(f"{len(keys)} keys for {one_hot.shape[1] + len(bags)} sparse features")
    n = dense.shape[0]
    ids = np.ascontiguousarray(one_hot.T).reshape(-1)
    values = [ids if ids.dtype == np.int32 else ids.astype(np.int64, copy=False)]
    bag_lengths = []
    per_key = [n] * one_hot.shape[1]
    for bag in bags:
        values.append(bag[bag >= 0].astype(np.int64, copy=False))
        bag_lengths.append((bag >= 0).sum(axis=1, dtype=np.int32))
        per_key.append(len(values[-1]))
    lengths, offsets = _one_hot_layout(one_hot.size)
    if bags:  # the KJT then computes its offsets when they are needed
        lengths = torch.cat([lengths, torch.from_numpy(np.concatenate(bag_lengths))])
    # Sizes per key are known here, so the KJT need not recompute them from the lengths.
    kjt = KeyedJaggedTensor(
        keys=keys,
        values=torch.from_numpy(values[0] if not bags else np.concatenate(values)),
        lengths=lengths,
        offsets=None if bags else offsets,
        stride=n,
        length_per_key=per_key,
        offset_per_key=list(accumulate(per_key, initial=0)),
    )
    return Batch(
        dense_features=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
        sparse_features=kjt,
        labels=torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32).reshape(n)),
    )


@functools.lru_cache(maxsize=16)
def _one_hot_layout(num_ids: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lengths (all 1) and offsets of ``num_ids`` one-hot ids, made once per size and shared by
    every batch of that size (never written), as TorchRec's npy reader shares its own: a batch
    allocates and fills none of them."""
    return torch.ones(num_ids, dtype=torch.int32), torch.arange(num_ids + 1, dtype=torch.int32)


def report_pass(
    name: str, split: str, rank: int, batches: int, bad_rows: int, unread_rows: int
) -> None:
    """Logs the end of a pass; skipped rows and the unread tail are warnings, never silent."""
    msg = f"{name} {split} pass on rank {rank}: {batches} batches"
    if bad_rows:
        logger.warning("%s; skipped %d bad rows (on_bad_row='skip')", msg, bad_rows)
    if unread_rows and rank == 0:
        logger.warning(
            "%s; %d rows of the last partial global batch were not read (all ranks)",
            msg,
            unread_rows,
        )
