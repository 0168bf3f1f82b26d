"""A Criteo-shaped synthetic stream whose labels come from a planted model.

Training on it is meaningful with no download: the labels are Bernoulli draws from a known
logistic model over the dense features and per-id effects of the sparse features, so the
planted model's own AUC (:meth:`SyntheticCriteo.planted_auc`) is the ceiling a learner can
approach, and 0.5 is chance. Every batch is generated from ``(seed, split, batch index)``
alone: nothing is stored, any size costs the same memory, and rank ``r`` of ``W`` reads the
global batches ``r, r + W, r + 2W, ...`` (disjoint shares that together cover the split).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from pyarrow import csv as pa_csv
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.datasets.base import DataSpec, RecDataset, register_dataset

NUM_DENSE = 13
NUM_SPARSE = 26
_SPLITS = {"train": 1, "eval": 2}


def _hash_uniform(ids: torch.Tensor, salt: int) -> torch.Tensor:
    """A fixed pseudo-random effect in [-1, 1) per (id, salt), computed, never stored.

    Integer mixing kept below 2**62 so int64 never overflows (ids < 2**31).
    """
    h = (ids * 0x2C1B3C6D + (salt * 0x297A2D39 + 0x165667B1)) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    return h.to(torch.float32) * (2.0 / 2**32) - 1.0


class SyntheticCriteo(RecDataset):
    """13 dense and 26 sparse features (``int_0..12``, ``cat_0..25``, as in Criteo).

    The planted logit is ``dense @ w + sum_f s_f * mean(u_f(ids_f)) + c * dense_0 * u_0(ids_0)
    + b``: strong sparse features ``cat_0..7``, weak ``cat_8..15``, pure noise ``cat_16..25``
    and one dense x sparse interaction. Ids follow a power law (hot head, long tail), as in
    real click logs. ``multi_hot`` gives each feature's maximum bag length (multi-hot bags
    are averaged in the planted model).

    Args:
        num_embeddings: table size per sparse feature (one int for all, or 26 ints).
        num_train_examples / num_eval_examples: size of each split (rounded down to batches).
        multi_hot: maximum ids per bag, one int for all or 26 ints; 1 is one-hot.
        skew: power-law exponent of the id distribution (1 is uniform).
        seed: selects both the planted model and the samples.
    """

    def __init__(
        self,
        num_embeddings: int | list[int] = 5000,
        num_train_examples: int = 2_000_000,
        num_eval_examples: int = 65_536,
        multi_hot: int | list[int] = 1,
        skew: float = 3.0,
        seed: int = 0,
    ) -> None:
        sizes = (
            num_embeddings if isinstance(num_embeddings, list) else [num_embeddings] * NUM_SPARSE
        )
        hots = multi_hot if isinstance(multi_hot, list) else [multi_hot] * NUM_SPARSE
        if len(sizes) != NUM_SPARSE or any(not 0 < n < 2**31 for n in sizes):
            raise ValueError(f"data.options.num_embeddings: need {NUM_SPARSE} sizes in [1, 2**31)")
        if len(hots) != NUM_SPARSE or any(h < 1 for h in hots):
            raise ValueError(f"data.options.multi_hot: need {NUM_SPARSE} bag lengths >= 1")
        if num_train_examples <= 0 or num_eval_examples <= 0:
            raise ValueError("data.options.num_train_examples/num_eval_examples must be positive")
        if skew < 1.0:
            raise ValueError(f"data.options.skew must be >= 1, got {skew}")
        self.spec = DataSpec(
            dense_names=[f"int_{i}" for i in range(NUM_DENSE)],
            sparse_names=[f"cat_{i}" for i in range(NUM_SPARSE)],
            num_embeddings=list(sizes),
        )
        self.multi_hot = list(hots)
        self.num_examples = {"train": num_train_examples, "eval": num_eval_examples}
        self.skew = skew
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        self._w_dense = torch.randn(NUM_DENSE, generator=g) * (0.6 / NUM_DENSE**0.5)
        strength = [1.0] * 8 + [0.4] * 8 + [0.0] * (NUM_SPARSE - 16)
        self._strength = torch.tensor(strength)
        self._cross = 0.8
        self._bias = -1.0

    def _generate(
        self, split: str, index: int, batch_size: int
    ) -> tuple[Batch, torch.Tensor]:
        """Global batch ``index`` of ``split``, and its planted logits."""
        g = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + _SPLITS[split]) * 2_147_483_647 + index
        )
        dense = torch.randn(batch_size, NUM_DENSE, generator=g)
        logit = dense @ self._w_dense + self._bias
        lengths, values = [], []
        for f, (n, hot) in enumerate(zip(self.spec.num_embeddings, self.multi_hot, strict=True)):
            lens = torch.randint(1, hot + 1, (batch_size,), generator=g)
            u = torch.rand(int(lens.sum()), generator=g, dtype=torch.float64)
            ids = (u.pow(self.skew) * n).long().clamp_(max=n - 1)
            effect = _hash_uniform(ids, salt=self.seed * 131 + f)
            owner = torch.repeat_interleave(torch.arange(batch_size), lens)
            bag = torch.zeros(batch_size).index_add_(0, owner, effect) / lens
            logit += self._strength[f] * bag
            if f == 0:
                logit += self._cross * dense[:, 0] * bag
            lengths.append(lens)
            values.append(ids)
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self.spec.sparse_names, values=torch.cat(values), lengths=torch.cat(lengths)
        )
        return Batch(dense_features=dense, sparse_features=kjt, labels=labels), logit

    def batches(
        self, split: str, batch_size: int, rank: int, world_size: int, epoch: int = 0
    ) -> Iterator[Batch]:
        # Every epoch is the same stream: the planted data set is fixed, like a file on disk.
        if batch_size <= 0:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        # Whole rounds of world_size batches only, so every rank takes the same number of
        # steps (the pipeline's all-to-alls run in lock-step); the remainder is never read.
        num_batches = self.num_examples[split] // batch_size // world_size * world_size
        for index in range(rank, num_batches, world_size):
            yield self._generate(split, index, batch_size)[0]

    def planted_logits(self, split: str, index: int, batch_size: int) -> torch.Tensor:
        """The ground-truth logits of one global batch (for tests and reports)."""
        return self._generate(split, index, batch_size)[1]

    def planted_auc(self, batch_size: int = 4096) -> float:
        """AUC of the planted model itself on the eval split: the ceiling for any learner."""
        from torchmetrics.functional.classification import binary_auroc

        scores, labels = [], []
        for index in range(self.num_examples["eval"] // batch_size):
            batch, logit = self._generate("eval", index, batch_size)
            scores.append(logit)
            labels.append(batch.labels)
        return float(binary_auroc(torch.cat(scores), torch.cat(labels).long()))


@register_dataset("synthetic")
def _synthetic(**options: Any) -> SyntheticCriteo:
    return SyntheticCriteo(**options)


_BAD_ROWS = (
    b"1\t2\t3",  # too few fields
    b"0" + b"\tx" + b"\t1" * 12 + b"\t0a1b2c3d" * 26,  # non-integer dense value
    b"1" + b"\t1" * 13 + b"\tnothex!!" + b"\t0a1b2c3d" * 25,  # non-hex id
)
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _hex8(values: np.ndarray) -> pa.Array:
    """uint32 values as 8-digit lowercase hex strings, vectorized."""
    shifts = np.arange(28, -4, -4, dtype=np.uint64)
    digits = _HEX_DIGITS[(values.astype(np.uint64)[:, None] >> shifts) & 0xF]
    return pa.array(np.ascontiguousarray(digits).view("S8").reshape(-1)).cast(pa.string())


def write_criteo_tsv(
    ds: SyntheticCriteo,
    path: str,
    num_rows: int,
    split: str = "train",
    missing: float = 0.0,
    bad_row_every: int = 0,
    chunk_rows: int = 65_536,
) -> int:
    """Writes ``num_rows`` of ``ds`` as a Criteo TSV file (gzip if ``path`` ends in ``.gz``).

    Why: tests and benchmarks need real-format files of any size. Dense value ``x`` is written
    as ``round(expm1(max(x + 3, 0)))``, which the parser's ``log1p`` maps back to ~``x + 3``; id
    ``i`` of a table of size ``n`` as the 8-hex-digit ``i + n * k`` with a random ``k``, so
    the parser with the same ``num_embeddings`` recovers ``i``. A ``missing`` fraction of the
    dense and sparse fields is left empty. Every ``bad_row_every``-th line (1-based) is replaced
    by a malformed one (cycling through three kinds). Returns the number of bad lines written.
    """
    if num_rows <= 0:
        raise ValueError(f"num_rows must be positive, got {num_rows}")
    if any(h != 1 for h in ds.multi_hot):
        raise ValueError("Criteo rows are one-hot: build the data set with multi_hot=1")
    if not 0.0 <= missing < 1.0:
        raise ValueError(f"missing must be in [0, 1), got {missing}")
    rng = np.random.default_rng(ds.seed)
    sizes = np.asarray(ds.spec.num_embeddings, dtype=np.int64)
    opener = gzip.open if path.endswith(".gz") else open
    bad_written, written = 0, 0
    with opener(path, "wb") as out:
        for index in range(-(-num_rows // chunk_rows)):
            n = min(chunk_rows, num_rows - written)
            batch = ds._generate(split, index, chunk_rows)[0]
            dense = batch.dense_features[:n].numpy()
            raw_dense = np.round(np.expm1(np.maximum(dense + 3.0, 0.0)))
            ids = batch.sparse_features.values().numpy().reshape(NUM_SPARSE, chunk_rows)[:, :n]
            spread = rng.integers(0, ((2**32 - sizes) // sizes)[:, None], size=(NUM_SPARSE, n))
            columns = [pa.array(batch.labels[:n].numpy().astype(np.int64))]
            for j in range(NUM_DENSE):
                blank = rng.random(n) < missing
                columns.append(pa.array(raw_dense[:, j].astype(np.int64), mask=blank))
            for f in range(NUM_SPARSE):
                hexes = _hex8(ids[f] + sizes[f] * spread[f])
                blank = pa.array(rng.random(n) < missing)
                columns.append(pc.if_else(blank, pa.scalar(None, pa.string()), hexes))
            table = pa.table(columns, names=[str(i) for i in range(len(columns))])
            sink = pa.BufferOutputStream()
            pa_csv.write_csv(
                table,
                sink,
                pa_csv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none"),
            )
            text = sink.getvalue().to_pybytes()
            if bad_row_every:
                lines = text.split(b"\n")
                for i in range((-written - 1) % bad_row_every, n, bad_row_every):
                    lines[i] = _BAD_ROWS[bad_written % len(_BAD_ROWS)]
                    bad_written += 1
                text = b"\n".join(lines)
            out.write(text)
            written += n
    return bad_written
