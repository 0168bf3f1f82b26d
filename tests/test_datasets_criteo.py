"""Criteo TSV parsing, bad input, rank shares, and TSV -> npy -> loader equivalence."""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe
from torchrec.datasets.utils import Batch

from shadowsync.datasets import (
    CriteoFormatError,
    CriteoNpy,
    CriteoTSV,
    SyntheticCriteo,
    build_dataset,
    write_criteo_tsv,
)
from shadowsync.datasets.criteo_npy import npy_paths
from shadowsync.datasets.criteo_preprocess import main as preprocess_main

HEX = "0a1b2c3d"


def row(label: str = "1", dense: list[str] | None = None, cats: list[str] | None = None) -> str:
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [HEX] * 26
    return "\t".join([label, *dense, *cats])


def write(path: Path, lines: list[str], end: str = "\n") -> str:
    path.write_text("\n".join(lines) + end)
    return str(path)


def read_all(ds: CriteoTSV, split: str = "train", batch_size: int = 1) -> list[Batch]:
    return list(
        ds.train_batches(batch_size, 0, 1)
        if split == "train"
        else ds.eval_batches(batch_size, 0, 1)
    )


def tsv(paths: str | list[str], **options: object) -> CriteoTSV:
    options.setdefault("index_cache_dir", None)
    return CriteoTSV(paths, **options)  # type: ignore[arg-type]


def row_keys(batches: list[Batch]) -> list[tuple[int, ...]]:
    """One tuple of (label, ids...) per row: rows written by the synthetic writer are unique."""
    keys = []
    for b in batches:
        ids = b.sparse_features.values().view(26, -1).T
        keys += [tuple(r) for r in torch.cat([b.labels[:, None].long(), ids], 1).tolist()]
    return keys


def assert_same(a: list[Batch], b: list[Batch]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.dense_features, y.dense_features)
        assert torch.equal(x.labels, y.labels)
        assert x.sparse_features.keys() == y.sparse_features.keys()
        assert torch.equal(x.sparse_features.values(), y.sparse_features.values())
        assert torch.equal(x.sparse_features.lengths(), y.sparse_features.lengths())


def test_parses_values_empties_and_hashing(tmp_path: Path) -> None:
    dense = ["", "-5", "0", "1", "1000"] + ["7"] * 8
    cats = ["", "ffffffff", "A", "00000010"] + [HEX] * 22
    path = write(tmp_path / "day_0", [row("0", dense, cats), row()], end="")  # no final newline
    ds = tsv(path, num_embeddings=1000, eval_fraction=0.5)
    (b,) = read_all(ds)
    expected = np.log1p(np.maximum([0, -5, 0, 1, 1000] + [7] * 8, 0)).astype(np.float32)
    assert torch.equal(b.dense_features[0], torch.from_numpy(expected))
    assert b.labels.tolist() == [0.0]
    ids = b.sparse_features.values().tolist()
    assert ids[:4] == [0, 0xFFFFFFFF % 1000, 10, 16] and ids[4] == int(HEX, 16) % 1000
    assert b.sparse_features.keys() == [f"cat_{i}" for i in range(26)]
    assert b.dense_features.dtype == torch.float32 and b.labels.dtype == torch.float32
    (e,) = read_all(ds, "eval")  # the unterminated last line is a row
    assert e.labels.tolist() == [1.0]


BAD_ROWS = {
    "too few fields": ("\t".join(["1"] * 12), "expected 40 tab-separated fields, got 12"),
    "too many fields": (row() + "\t1", "expected 40 tab-separated fields, got 41"),
    "non-numeric dense": (row(dense=["abc"] + ["1"] * 12), "int_0 must be an integer, got 'abc'"),
    "float dense": (row(dense=["1"] * 12 + ["1.5"]), "int_12 must be an integer, got '1.5'"),
    "non-hex id": (row(cats=[HEX] * 25 + ["zz"]), "cat_25 must be a hex id of at most 8 digits"),
    "long id": (row(cats=["123456789"] + [HEX] * 25), "cat_0 must be a hex id of at most 8 digits"),
    "bad label": (row(label="2"), "label must be 0 or 1, got '2'"),
    "empty label": (row(label=""), "label must be 0 or 1, got ''"),
    "empty line": ("", "empty line"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_bad_row_raises_with_file_and_line_or_is_skipped_and_counted(
    tmp_path: Path, kind: str
) -> None:
    text, message = BAD_ROWS[kind]
    path = write(tmp_path / "day_0", [row(), row(), text, row()])
    with pytest.raises(CriteoFormatError, match=f"{path}: line 3: {message}"):
        read_all(tsv(path, eval_fraction=0.25))
    ds = tsv(path, eval_fraction=0.25, on_bad_row="skip")
    assert sum(len(b.labels) for b in read_all(ds, batch_size=3)) == 2
    assert ds.bad_rows == 1 and ds.stats["train"]["bad_rows"] == 1


def test_truncated_last_line(tmp_path: Path) -> None:
    path = str(tmp_path / "day_0.gz")
    with gzip.open(path, "wt") as f:
        f.write("\n".join([row()] * 3 + [row()[:50]]))
    with pytest.raises(CriteoFormatError, match=f"{path}: line 4: expected 40"):
        read_all(tsv(path, eval_paths=path))
    ds = tsv(path, eval_paths=path, on_bad_row="skip")
    assert [len(b.labels) for b in read_all(ds, "eval", batch_size=2)] == [2, 1]
    assert ds.stats["eval"]["bad_rows"] == 1


def test_bad_row_deep_in_a_threaded_block_is_located(tmp_path: Path) -> None:
    path = str(tmp_path / "day_0")
    write_criteo_tsv(SyntheticCriteo(num_embeddings=100), path, 30_000, bad_row_every=25_001)
    with pytest.raises(CriteoFormatError, match=f"{path}: line 25001: expected 40 .* got 3"):
        read_all(tsv(path, eval_fraction=0.1, use_threads=True), batch_size=1024)


def test_missing_unreadable_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data.options.paths: .*nope: no such file"):
        tsv(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="matches no file"):
        tsv(str(tmp_path / "day_*"))
    with pytest.raises(OSError, match=f"{tmp_path}: cannot open"):
        tsv(str(tmp_path))  # a directory cannot be read as a file
    corrupt = tmp_path / "day_1.gz"
    corrupt.write_bytes(gzip.compress(("\n".join([row()] * 100)).encode())[:-30] + b"junk" * 8)
    with pytest.raises(OSError, match=f"{corrupt}: read failed near line"):
        tsv(str(corrupt))
    empty = write(tmp_path / "day_2", [], end="")
    with pytest.raises(CriteoFormatError, match=f"{empty}: line 1: the file is empty"):
        tsv(empty, eval_paths=empty)
    good = write(tmp_path / "day_3", [row()] * 4)
    ds = tsv([empty, good], eval_paths=good, on_bad_row="skip")
    assert ds.stats["train"]["empty_files"] == 1 and ds.num_rows("train") == 4


def test_options_are_validated_naming_the_field(tmp_path: Path) -> None:
    path = write(tmp_path / "day_0", [row()] * 4)
    with pytest.raises(ValueError, match="data.options.num_embeddings"):
        tsv(path, num_embeddings=[10] * 3)
    with pytest.raises(ValueError, match="data.options.on_bad_row"):
        tsv(path, on_bad_row="ignore")
    with pytest.raises(ValueError, match="data.options.eval_fraction"):
        tsv(path, eval_fraction=1.5)
    with pytest.raises(ValueError, match="data.options for 'criteo_tsv'"):
        build_dataset("criteo_tsv", paths=path, colour="blue")


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three synthetic days of different sizes (one gzipped), some fields empty."""
    root = tmp_path_factory.mktemp("criteo")
    paths = [str(root / "day_0"), str(root / "day_1.gz"), str(root / "day_2")]
    for seed, (path, rows) in enumerate(zip(paths, (3001, 2500, 1203), strict=True)):
        ds = SyntheticCriteo(num_embeddings=2**31 - 1, seed=seed)  # a seed per day: unique rows
        write_criteo_tsv(ds, path, rows, missing=0.05, chunk_rows=1000)
    return paths


def test_tsv_ranks_read_disjoint_complete_shares(days: list[str], tmp_path: Path) -> None:
    bad = str(tmp_path / "day_3")
    write_criteo_tsv(SyntheticCriteo(2**31 - 1, seed=9), bad, 2000, bad_row_every=97)
    paths = [*days, bad]
    ds = tsv(paths, num_embeddings=2**31 - 1, eval_fraction=0.3, on_bad_row="skip", block_size=4096)
    assert ds.num_rows("train") + ds.num_rows("eval") == 3001 + 2500 + 1203 + 2000
    for split in ("train", "eval"):
        size = ds.num_rows(split)
        every = row_keys(read_all(ds, split, batch_size=128 * 2))
        shares = []
        for rank in (0, 1):
            it = (
                ds.train_batches(128, rank, 2)
                if split == "train"
                else ds.eval_batches(128, rank, 2)
            )
            batches = list(it)
            assert len(batches) == size // 256  # lock-step: same count on every rank
            shares.append(row_keys(batches))
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == sorted(every)
        assert len(set(every)) == len(every)  # rows are unique, so "exactly once" is checked
        assert ds.stats[split]["unread_tail_rows"] == 3 * (size % 256)  # 3 passes counted


def test_index_cache_is_reused(days: list[str], tmp_path: Path) -> None:
    a = tsv(days, index_cache_dir=str(tmp_path))
    assert len(os.listdir(tmp_path)) == 3
    b = tsv(days, index_cache_dir=str(tmp_path))
    assert a._splits == b._splits


def test_tsv_to_npy_to_loader_gives_the_same_batches(days: list[str], tmp_path: Path) -> None:
    out = str(tmp_path / "npy")
    preprocess_main(["--out", out, "--num-embeddings", "1000", "--block-size", "8192", *days])
    labels = np.load(npy_paths(out, "day_0")[2])
    assert labels.dtype == np.int32 and labels.shape == (3001, 1)
    npy = build_dataset("criteo_npy", directory=out)
    assert isinstance(npy, CriteoNpy) and npy.spec.num_embeddings == [1000] * 26
    direct = tsv(days[:2], num_embeddings=1000, eval_paths=days[2])
    assert_same(list(npy.train_batches(100, 0, 1)), read_all(direct, batch_size=100))
    # Two ranks take the global windows round-robin: rank r's k-th is the (2k + r)-th.
    whole = read_all(direct, batch_size=100)
    for rank in (0, 1):
        assert_same(list(npy.train_batches(100, rank, 2)), whole[rank : len(whole) // 2 * 2 : 2])
    val = list(npy.eval_batches(100, 0, 1))  # val: the first ceil(n / 2) rows of the last day
    assert npy.num_rows("eval") == math.ceil(1203 / 2)
    assert sum(len(b.labels) for b in val) == npy.num_rows("eval")  # a short last batch too
    assert_same(val[:-1], read_all(direct, "eval", batch_size=100)[: len(val) - 1])


def test_preprocess_skips_bad_rows_into_exact_files(tmp_path: Path) -> None:
    path, out = str(tmp_path / "day_0"), str(tmp_path / "npy")
    write_criteo_tsv(SyntheticCriteo(num_embeddings=1000), path, 2000, bad_row_every=97)
    with pytest.raises(SystemExit):
        preprocess_main(["--out", out, path])
    assert os.listdir(out) == []  # nothing half-written is left behind
    preprocess_main(["--out", out, "--on-bad-row", "skip", "--num-embeddings", "1000", path])
    dense, sparse, labels = (np.load(p) for p in npy_paths(out, "day_0"))
    assert len(dense) == len(sparse) == len(labels) == 2000 - 2000 // 97
    rows = read_all(
        tsv(path, eval_paths=path, on_bad_row="skip", num_embeddings=1000), "eval", 2000
    )
    (whole,) = rows
    assert np.array_equal(dense, whole.dense_features.numpy())
    assert np.array_equal(labels[:, 0], whole.labels.numpy())
    assert np.array_equal(sparse.T.reshape(-1), whole.sparse_features.values().numpy())


def test_npy_files_load_in_torchrec_and_shares(days: list[str], tmp_path: Path) -> None:
    out = str(tmp_path / "npy")
    preprocess_main(["--out", out, "--num-embeddings", "5000", "--on-bad-row", "skip", *days])
    ours = CriteoNpy(out)
    theirs = InMemoryBinaryCriteoIterDataPipe(
        "train",
        *(list(p) for p in zip(*(npy_paths(out, d) for d in ("day_0", "day_1")), strict=True)),
        batch_size=64,
        rank=0,
        world_size=1,
        drop_last=True,
        mmap_mode=True,
    )
    for a, b in zip(ours.train_batches(64, 0, 1), theirs, strict=True):
        assert torch.equal(a.dense_features, b.dense_features)
        assert torch.equal(a.labels, b.labels.float())
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values().long())
    in_order = row_keys(list(ours.train_batches(64, 0, 1)))
    assert sorted(
        row_keys(list(ours.train_batches(32, 0, 2))) + row_keys(list(ours.train_batches(32, 1, 2)))
    ) == sorted(in_order)
    everything = set(row_keys(list(ours.train_batches(1, 0, 1))))
    shuffled = CriteoNpy(out, shuffle=True, seed=1)
    for epoch in (0, 1):
        shares = [row_keys(list(shuffled.train_batches(32, r, 2, epoch))) for r in (0, 1)]
        assert len(shares[0]) == len(shares[1]) == (3001 + 2500) // 64 * 32
        assert not set(shares[0]) & set(shares[1]) and set(shares[0] + shares[1]) <= everything
    assert row_keys(list(shuffled.train_batches(32, 0, 2, 0))) != row_keys(
        list(shuffled.train_batches(32, 0, 2, 1))
    )
    with pytest.raises(ValueError, match="data.options.num_embeddings contradicts"):
        CriteoNpy(out, num_embeddings=10)
