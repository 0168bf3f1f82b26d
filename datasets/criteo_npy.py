"""Criteo in TorchRec's per-day ``.npy`` layout, memory-mapped (nothing is loaded whole).

Splits follow TorchRec's ``InMemoryBinaryCriteoIterDataPipe``: every day but the last is
training; the last day is cut in halves, the first ``ceil(n / 2)`` rows ``val`` and the rest
``test`` (``eval_stage`` picks which one :meth:`eval_batches` reads). Batches are windows of
consecutive rows dealt to ranks round-robin, the evaluation tail included, as TorchRec's reader
with ``drop_last=False`` deals them (:class:`~shadowsync.datasets.batching.WindowedDataset`);
``shuffle`` permutes the training windows per ``(seed, epoch)``.

Files written by ``python -m shadowsync.datasets.criteo_preprocess`` carry ``meta.json`` with
their table sizes, and their ids are already reduced modulo them. Files made by TorchRec's own
``npy_preproc_criteo`` (raw int64 ids, no ``meta.json``) load too when ``num_embeddings`` is
given: their ids are then taken modulo the table sizes at read time; their dense values are
``log(x - min + 2)`` with the file's own minimum, not our ``log(1 + max(x, 0))``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
from torchrec.datasets.utils import Batch

from shadowsync.datasets.base import register_dataset
from shadowsync.datasets.batching import WindowedDataset, make_batch
from shadowsync.datasets.criteo_tsv import (
    CAT_FEATURE_COUNT,
    INT_FEATURE_COUNT,
    criteo_spec,
    natural_key,
)

META_FILE = "meta.json"
_BLOCK_ROWS = 256  # 26 KB of int32 ids on each side of a transposing copy


def npy_paths(directory: str, day: str) -> tuple[str, str, str]:
    """Dense, sparse and labels file of one day, named as TorchRec names them."""
    dense, sparse, labels = (
        os.path.join(directory, f"{day}_{kind}.npy") for kind in ("dense", "sparse", "labels")
    )
    return dense, sparse, labels


@dataclass(frozen=True)
class _Segment:
    """Rows ``[lo, hi)`` of one day, placed at row ``start`` of a split."""

    arrays: tuple[np.ndarray, np.ndarray, np.ndarray]  # dense, sparse, labels
    lo: int
    hi: int
    start: int


class CriteoNpy(WindowedDataset):
    """Criteo days as ``day_N_{dense,sparse,labels}.npy`` (13 dense, 26 sparse features).

    Args:
        directory: where the ``.npy`` files are.
        days: day names in order (``["day_0", "day_1"]``); default: every ``*_dense.npy``
            in ``directory``, in natural order. At least two (training days + the eval day).
        num_embeddings: table sizes (one int or 26); default: those in ``meta.json``, which
            a different value may not contradict.
        eval_stage: ``val`` (first half of the last day, default) or ``test`` (second half).
        shuffle: permute batch windows every epoch (training only), seeded by ``seed``.
    """

    name = "criteo_npy"

    def __init__(
        self,
        directory: str,
        days: list[str] | None = None,
        num_embeddings: int | list[int] | None = None,
        eval_stage: str = "val",
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        if eval_stage not in ("val", "test"):
            raise ValueError(f"data.options.eval_stage must be 'val' or 'test', got {eval_stage!r}")
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"data.options.directory: {directory}: no such directory")
        meta_path = os.path.join(directory, META_FILE)
        stored: int | list[int] | None = None
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                stored = json.load(f)["num_embeddings"]
        sizes = stored if num_embeddings is None else num_embeddings
        if sizes is None:
            raise ValueError(
                f"data.options.num_embeddings is needed: {directory} has no {META_FILE}"
            )
        self.spec = criteo_spec(sizes)
        if stored is not None and self.spec.num_embeddings != criteo_spec(stored).num_embeddings:
            raise ValueError(
                f"data.options.num_embeddings contradicts {meta_path} (ids were reduced modulo "
                "those sizes); rerun criteo_preprocess with --num-embeddings to change them"
            )
        if days is None:
            days = sorted(
                (
                    f.removesuffix("_dense.npy")
                    for f in os.listdir(directory)
                    if f.endswith("_dense.npy")
                ),
                key=natural_key,
            )
        if len(days) < 2:
            raise ValueError(
                f"data.options.days: need at least 2 days (training + eval) in {directory}, "
                f"got {days}"
            )
        arrays = [self._open(directory, day) for day in days]
        last = len(arrays[-1][0])
        half = (last + 1) // 2
        self._splits = {
            "train": _segments([(a, 0, len(a[0])) for a in arrays[:-1]]),
            "eval": _segments(
                [(arrays[-1], 0, half) if eval_stage == "val" else (arrays[-1], half, last)]
            ),
        }
        self._sizes = np.asarray(self.spec.num_embeddings, dtype=np.int64)
        self._id_type = np.result_type(*(a[1] for a in arrays))
        # criteo_preprocess stored ids already modulo these sizes (meta.json says which).
        self._reduce = stored is None
        self.shuffle = shuffle
        self.seed = seed
        self.stats: dict[str, Counter[str]] = {"train": Counter(), "eval": Counter()}

    @staticmethod
    def _open(directory: str, day: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        arrays = []
        for path in npy_paths(directory, day):
            try:
                # A plain view of the map: slicing a np.memmap costs more per batch than
                # slicing the ndarray it maps.
                arrays.append(np.load(path, mmap_mode="r").view(np.ndarray))
            except (OSError, ValueError) as e:
                raise OSError(f"{path}: cannot read as .npy: {e}") from e
        dense, sparse, labels = arrays
        rows = {len(dense), len(sparse), len(labels)}
        if len(rows) != 1 or dense.shape[1:] != (13,) or sparse.shape[1:] != (26,):
            raise ValueError(
                f"{directory}/{day}_*.npy: expected dense [n, 13], sparse [n, 26], labels [n, 1]; "
                f"got {dense.shape}, {sparse.shape}, {labels.shape}"
            )
        return dense, sparse, labels

    def num_rows(self, split: str) -> int:
        last = self._splits[split][-1]
        return last.start + last.hi - last.lo

    def fetch(self, split: str, start: int, stop: int) -> Batch:
        """Rows ``[start, stop)`` (may span days), copied once out of the maps, so a batch
        owns its memory (TorchRec's reader hands out views of read-only maps): ids straight
        into the feature-major layout the KJT keeps, in the files' int type (int32 from
        ``criteo_preprocess``, as TorchRec's reader gives them)."""
        n = stop - start
        dense = np.empty((n, INT_FEATURE_COUNT), dtype=np.float32)
        ids = np.empty((CAT_FEATURE_COUNT, n), dtype=self._id_type)
        labels = np.empty(n, dtype=np.float32)
        for seg in self._splits[split]:
            lo, hi = max(start - seg.start, 0), min(stop - seg.start, seg.hi - seg.lo)
            if lo < hi:
                out = slice(seg.start + lo - start, seg.start + hi - start)
                rows = slice(seg.lo + lo, seg.lo + hi)
                dense[out] = seg.arrays[0][rows]
                _transpose_into(ids[:, out], seg.arrays[1][rows])
                labels[out] = seg.arrays[2][rows, 0]
        if self._reduce:
            ids %= self._sizes[:, None]
        return make_batch(dense, labels, self.spec.sparse_names, ids.T)


def _transpose_into(out: np.ndarray, rows: np.ndarray) -> None:
    """``out[:] = rows.T`` in blocks of ``_BLOCK_ROWS`` rows, each small enough to stay in L1
    cache, in place of numpy's transposing copy of the whole batch at once."""
    for lo in range(0, len(rows), _BLOCK_ROWS):
        out[:, lo : lo + _BLOCK_ROWS] = rows[lo : lo + _BLOCK_ROWS].T


def _segments(
    parts: list[tuple[tuple[np.ndarray, np.ndarray, np.ndarray], int, int]],
) -> list[_Segment]:
    segments, start = [], 0
    for arrays, lo, hi in parts:
        segments.append(_Segment(arrays, lo, hi, start))
        start += hi - lo
    return segments


@register_dataset("criteo_npy")
def _criteo_npy(**options: Any) -> CriteoNpy:
    return CriteoNpy(**options)
