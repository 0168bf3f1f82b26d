"""What every file-backed data set shares: turning arrays into a TorchRec ``Batch``, and
deciding which rows each rank reads so that all ranks step in lock-step.

Sharding rule (all data sets but ``synthetic``): a split of ``N`` rows read with batch size
``B`` by ``W`` ranks gives every rank ``N // (B * W)`` full batches. In training, the remaining
``N % (B * W)`` rows (the last partial global batch) are not read in that pass; the count is
returned by :func:`batches_per_rank`, kept in the data set's ``stats`` and logged. Evaluation
reads them too, as one shorter last batch per rank (:func:`tail_share`).
"""

from __future__ import annotations

import abc
import logging
from collections import Counter
from collections.abc import Iterator

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.datasets.base import RecDataset

logger = logging.getLogger("shadowsync.datasets")


def batches_per_rank(num_rows: int, batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Full batches per rank and the rows of the last partial global batch left unread."""
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    per_rank = num_rows // (batch_size * world_size)
    return per_rank, num_rows - per_rank * batch_size * world_size


def tail_share(first: int, rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous part of ``rows`` rows starting at ``first``, as even as can be."""
    base, extra = divmod(rows, world_size)
    lo = first + rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def window_starts(
    num_rows: int, batch_size: int, rank: int, world_size: int, seed: int | None
) -> tuple[np.ndarray, int]:
    """First rows of the batch-sized windows rank ``rank`` reads, and the rows left unread.

    The split is cut into windows of ``batch_size`` consecutive rows; global step ``k`` reads
    windows ``k * W .. k * W + W - 1`` (rank ``r`` takes the ``r``-th), so without a seed the
    global stream keeps the split's order, as TorchRec's ``InMemoryBinaryCriteoIterDataPipe``
    does. A seed permutes the windows (rows inside a window stay together, which keeps reads
    sequential on memory-mapped files).
    """
    per_rank, unread = batches_per_rank(num_rows, batch_size, rank, world_size)
    windows = num_rows // batch_size
    order = np.random.default_rng(seed).permutation(windows) if seed is not None else None
    chosen = (np.arange(windows) if order is None else order)[: per_rank * world_size]
    return chosen[rank::world_size].astype(np.int64) * batch_size, unread


class WindowedDataset(RecDataset):
    """A data set whose splits can be read at any row (arrays in memory or memory-mapped).

    Every pass deals batch windows to ranks with :func:`window_starts`; training windows are
    permuted per ``(seed, epoch)`` when ``shuffle`` is set, evaluation is always in order.
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
        self, split: str, batch_size: int, rank: int, world_size: int, seed: int | None,
        tail: bool = False,
    ) -> Iterator[Batch]:
        num_rows = self.num_rows(split)
        starts, unread = window_starts(num_rows, batch_size, rank, world_size, seed)
        for start in starts.tolist():
            yield self.fetch(split, start, start + batch_size)
        batches = len(starts)
        if tail and unread >= world_size:
            # One more, shorter batch per rank (sizes differ by at most one row), so that
            # evaluation scores every row; every rank still takes the same number of steps.
            lo, hi = tail_share(num_rows - unread, unread, rank, world_size)
            yield self.fetch(split, lo, hi)
            batches += 1
            unread = 0
        self.stats[split].update(batches=batches, unread_tail_rows=unread)
        report_pass(self.name, split, rank, batches, 0, unread)

    def batches(
        self, split: str, batch_size: int, rank: int, world_size: int, epoch: int = 0
    ) -> Iterator[Batch]:
        if split == "eval":
            return self._pass("eval", batch_size, rank, world_size, None, tail=True)
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

    ``one_hot`` is ``[B, F1]`` (one id per row and feature, the first ``F1`` keys); each array
    of ``multi_hot`` is ``[B, k]`` padded with ``-1`` (one bag per row, the remaining keys).
    """
    bags = multi_hot or []
    if len(keys) != one_hot.shape[1] + len(bags):
        raise ValueError(f"{len(keys)} keys for {one_hot.shape[1] + len(bags)} sparse features")
    n = dense.shape[0]
    values = [np.ascontiguousarray(one_hot.T).reshape(-1).astype(np.int64, copy=False)]
    lengths = [np.ones(one_hot.size, dtype=np.int32)]
    per_key = [n] * one_hot.shape[1]
    for bag in bags:
        values.append(bag[bag >= 0].astype(np.int64, copy=False))
        lengths.append((bag >= 0).sum(axis=1, dtype=np.int32))
        per_key.append(len(values[-1]))
    # Sizes per key are known here, so the KJT need not recompute them from the lengths.
    kjt = KeyedJaggedTensor(
        keys=keys,
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths)),
        stride=n,
        length_per_key=per_key,
        offset_per_key=np.concatenate([[0], np.cumsum(per_key)]).tolist(),
    )
    return Batch(
        dense_features=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
        sparse_features=kjt,
        labels=torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32).reshape(n)),
    )


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
