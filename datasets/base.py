"""The data interface every data set implements, and the registry configs choose from.

All data sets yield TorchRec's :class:`~torchrec.datasets.utils.Batch` (dense features,
a :class:`~torchrec.sparse.jagged_tensor.KeyedJaggedTensor`, labels), so the model,
the train pipeline and the metrics never depend on where examples come from.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torchrec.datasets.utils import Batch

from shadowsync.registry import Registry


@dataclass(frozen=True)
class DataSpec:
    """The schema a model is built from: feature names and one table size per sparse feature."""

    dense_names: list[str]
    sparse_names: list[str]
    num_embeddings: list[int]

    def __post_init__(self) -> None:
        if len(self.sparse_names) != len(self.num_embeddings):
            raise ValueError("DataSpec needs one table size per sparse feature")


class RecDataset(abc.ABC):
    """A source of CTR batches with disjoint per-rank shares.

    :meth:`batches` reads one pass of a split (``train`` or ``eval``); each rank reads its own
    share, the shares of all ranks together cover the split, and every rank gets the same
    number of batches (TorchRec's all-to-alls run in lock-step).
    """

    spec: DataSpec

    @abc.abstractmethod
    def batches(
        self, split: str, batch_size: int, rank: int, world_size: int, epoch: int = 0
    ) -> Iterator[Batch]: ...

    def train_batches(
        self, batch_size: int, rank: int, world_size: int, epoch: int = 0
    ) -> Iterator[Batch]:
        return self.batches("train", batch_size, rank, world_size, epoch)

    def eval_batches(self, batch_size: int, rank: int, world_size: int) -> Iterator[Batch]:
        return self.batches("eval", batch_size, rank, world_size)

    def describe(self) -> str:
        s = self.spec
        return (
            f"{type(self).__name__}: {len(s.dense_names)} dense, {len(s.sparse_names)} sparse "
            f"features, {sum(s.num_embeddings):,} embedding rows"
        )


# The values of ``data.name``, each with the factory its ``data.options`` are passed to.
DATASETS: Registry[Callable[..., RecDataset]] = Registry("data.name", "data set")


def register_dataset(name: str) -> Callable[[Callable[..., RecDataset]], Callable[..., RecDataset]]:
    """Class decorator: ``DATASETS.register(name, cls)`` where the data set is defined."""
    return functools.partial(DATASETS.register, name)


def build_dataset(name: str, **options: Any) -> RecDataset:
    """Builds the registered data set ``name`` with its options (``data.options`` in configs)."""
    factory = DATASETS.get(name)
    try:
        return factory(**options)
    except TypeError as e:
        raise ValueError(f"data.options for {name!r}: {e}") from e
