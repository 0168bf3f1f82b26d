"""Criteo TSV parsing, bad input, rank shares, and TSV -> npy -> loader equivalence."""

from __future__ import annotations

import functools
import gzip
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

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
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.train import Trainer, init_distributed, plan_ranks
from shadowsync.sync.wrapper import dense_parameters
from shadowsync.testing import run_ranks

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


DENSE_HINT = r"must be empty or a decimal integer \(optional '-', then 1 to 18 digits\)"
ID_HINT = r"must be empty or 1 to 8 hex digits \(0-9, a-f, A-F\)"
LATIN1 = row(dense=["caf\xe9"] + ["1"] * 12).encode("latin-1")
BAD_ROWS: dict[str, tuple[str | bytes, str]] = {
    "too few fields": ("\t".join(["1"] * 12), "expected 40 tab-separated fields, got 12"),
    "too many fields": (row() + "\t1", "expected 40 tab-separated fields, got 41"),
    "non-numeric dense": (row(dense=["abc"] + ["1"] * 12), f"int_0 {DENSE_HINT}, got 'abc'"),
    "float dense": (row(dense=["1"] * 12 + ["1.5"]), f"int_12 {DENSE_HINT}, got '1.5'"),
    "hex dense": (row(dense=["0x10"] + ["1"] * 12), f"int_0 {DENSE_HINT}, got '0x10'"),
    "spaced dense": (row(dense=[" 5"] + ["1"] * 12), f"int_0 {DENSE_HINT}, got ' 5'"),
    "plus dense": (row(dense=["+5"] + ["1"] * 12), rf"int_0 {DENSE_HINT}, got '\+5'"),
    "NA dense": (row(dense=["1", "NA"] + ["1"] * 11), f"int_1 {DENSE_HINT}, got 'NA'"),
    "nan dense": (row(dense=["1", "nan"] + ["1"] * 11), f"int_1 {DENSE_HINT}, got 'nan'"),
    "minus only": (row(dense=["-"] + ["1"] * 12), f"int_0 {DENSE_HINT}, got '-'"),
    "20-digit dense": (
        row(dense=["9" * 20] + ["1"] * 12),
        "int_0 has 20 digits, more than the 18 that always fit the int64 it is read as: got "
        f"'{'9' * 20}'",
    ),
    "non-hex id": (row(cats=[HEX] * 25 + ["zz"]), f"cat_25 {ID_HINT}, got 'zz'"),
    "long id": (row(cats=["123456789"] + [HEX] * 25), f"cat_0 {ID_HINT}, got '123456789'"),
    "control byte id": (
        row(cats=["0a1b2c3\x15"] + [HEX] * 25),
        rf"cat_0 {ID_HINT}, got '0a1b2c3\\x15'",
    ),
    "bad label": (row(label="2"), "label must be 0 or 1, got '2'"),
    "empty label": (row(label=""), "label must be 0 or 1, got ''"),
    "00 label": (row(label="00"), "label must be 0 or 1, got '00'"),
    "-0 label": (row(label="-0"), "label must be 0 or 1, got '-0'"),
    "0x1 label": (row(label="0x1"), "label must be 0 or 1, got '0x1'"),
    "empty line": ("", "empty line"),
    "all tabs": ("\t" * 39, "label must be 0 or 1, got ''"),
    "latin-1 byte": (LATIN1, rf"int_0 {DENSE_HINT}, got b'caf\\xe9'"),
    "latin-1 byte, 3 fields": (b"1\tcaf\xe9\t2", "expected 40 tab-separated fields, got 3"),
    "lone CR": (row()[:30] + "\r" + row()[30:], "a carriage return inside the line"),
}


def write_bytes(path: Path, lines: list[str | bytes]) -> str:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return str(path)


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
@pytest.mark.parametrize("neighbour", ["good", "bad"])
def test_bad_row_raises_with_file_and_line_or_is_skipped_and_counted(
    tmp_path: Path, kind: str, neighbour: str
) -> None:
    """Every kind is caught the same way whether its block holds only good rows or also
    another bad one (pyarrow once took a different path for such blocks)."""
    text, message = BAD_ROWS[kind]
    other = row() if neighbour == "good" else row(dense=["abc"] * 13)
    path = write_bytes(tmp_path / "day_0", [row("0"), text, row("1"), other, row("1")])
    with pytest.raises(CriteoFormatError, match=f"^{path}: line 2: {message}"):
        read_all(tsv(path, eval_fraction=0.2))
    ds = tsv(path, eval_fraction=0.2, on_bad_row="skip")
    (batch,) = read_all(ds, batch_size=4)
    assert batch.labels.tolist() == ([0.0, 1.0, 1.0] if neighbour == "good" else [0.0, 1.0])
    assert ds.bad_rows == ds.stats["train"]["bad_rows"] == (1 if neighbour == "good" else 2)


ACCEPTED_DENSE = {"": 0, "-0": 0, "007": 7, "-5": -5, "9" * 18: 10**18 - 1, "12": 12}


@pytest.mark.parametrize("neighbour", ["good", "bad"])
def test_accepted_values_do_not_depend_on_their_neighbours(tmp_path: Path, neighbour: str) -> None:
    values = list(ACCEPTED_DENSE)
    dense = values + ["1"] * (13 - len(values))
    cats = ["", "a", "0A1b2C3d", "ffffffff", "00000010"] + [HEX] * 21
    other = row() if neighbour == "good" else row(label="00")
    path = write_bytes(tmp_path / "day_0", [row("1", dense, cats), other, row()])
    ds = tsv(path, num_embeddings=2**31 - 1, eval_fraction=0.34, on_bad_row="skip")
    batch = read_all(ds, batch_size=2)[0]
    raw = np.array([*ACCEPTED_DENSE.values()] + [1] * (13 - len(values)))
    assert torch.equal(
        batch.dense_features[0], torch.from_numpy(np.log1p(np.maximum(raw, 0))).float()
    )
    ids = batch.sparse_features.values().view(26, -1)[:, 0].tolist()
    assert ids[:5] == [0, 10, 0x0A1B2C3D, 0xFFFFFFFF % (2**31 - 1), 16]


def test_skip_mode_never_yields_an_empty_batch(tmp_path: Path) -> None:
    bad = row(label="2")
    path = write_bytes(tmp_path / "day_0", [row(), bad, row(), row(), bad, row(), row(), row()])
    ds = tsv(path, eval_paths=path, on_bad_row="skip")
    assert [len(b.labels) for b in read_all(ds, batch_size=2)] == [1, 2, 1, 2]
    assert ds.stats["train"] == {"bad_rows": 2, "batches": 4, "unread_tail_rows": 0}
    path = write_bytes(tmp_path / "day_1", [row(), row(), bad, bad, row(), row()])
    ds = tsv(path, eval_paths=path, on_bad_row="skip")
    with pytest.raises(
        CriteoFormatError,
        match=f"^{path}: line 3: this line and the rest of the train batch 1 it starts are all "
        "bad, so the batch would be empty",
    ):
        read_all(ds, batch_size=2)
    assert [len(b.labels) for b in read_all(ds, batch_size=3)] == [2, 2]


def test_cr_only_and_over_long_lines(tmp_path: Path) -> None:
    """A CR-only file is one line: short, it holds carriage returns; longer than a block, it is
    dropped as it is read, never held whole."""
    short = tmp_path / "day_0"
    short.write_bytes(("\r".join([row()] * 3) + "\r").encode())
    with pytest.raises(CriteoFormatError, match=f"^{short}: line 1: a carriage return inside"):
        read_all(tsv(str(short), eval_paths=str(short)))
    long = tmp_path / "day_1"
    long.write_bytes(
        f"{row('0')}\n".encode()
        + ("\r".join([row()] * 40) + "\r").encode()
        + f"\n{row('0')}".encode()
    )
    with pytest.raises(
        CriteoFormatError, match=f"^{long}: line 2: longer than block_size \\(4096 bytes; CR-only"
    ):
        read_all(tsv(str(long), eval_paths=str(long), block_size=4096))
    ds = tsv([str(short), str(long)], eval_paths=str(short), on_bad_row="skip", block_size=4096)
    assert [len(b.labels) for b in read_all(ds, batch_size=2)] == [1, 1]  # lines 1-2, 3-4
    assert ds.stats["train"]["bad_rows"] == 2
    tail = tmp_path / "day_2"  # an over-long last line without a newline
    tail.write_bytes(f"{row('0')}\n".encode() + b"1" * 10_000)
    ds = tsv(str(tail), eval_paths=str(tail), on_bad_row="skip", block_size=4096)
    assert [b.labels.tolist() for b in read_all(ds, batch_size=2)] == [[0.0]]


def test_gzip_is_recognised_by_content(tmp_path: Path) -> None:
    lines = [row("1"), row("0"), row("1")]
    plain = write(tmp_path / "day_0", lines)
    hidden = tmp_path / "day_1"  # gzip, though not named .gz
    hidden.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    named = write(tmp_path / "day_2.gz", lines)  # plain text, though named .gz
    expected = read_all(tsv(plain, eval_paths=plain), batch_size=3)
    for path in (str(hidden), named):
        assert_same(read_all(tsv(path, eval_paths=path), batch_size=3), expected)


def test_truncated_last_line(tmp_path: Path) -> None:
    path = str(tmp_path / "day_0.gz")
    with gzip.open(path, "wt") as f:
        f.write("\n".join([row()] * 3 + [row()[:50]]))
    with pytest.raises(CriteoFormatError, match=f"{path}: line 4: expected 40"):
        read_all(tsv(path, eval_paths=path))
    ds = tsv(path, eval_paths=path, on_bad_row="skip")
    assert [len(b.labels) for b in read_all(ds, "eval", batch_size=2)] == [2, 1]
    assert ds.stats["eval"]["bad_rows"] == 1


@pytest.mark.slow
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


@pytest.fixture(scope="module")
def npy_dir(days: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("npy"))
    preprocess_main(["--out", out, "--num-embeddings", "1000", *days])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_tsv_ranks_read_disjoint_complete_shares(
    days: list[str], tmp_path: Path, world: int
) -> None:
    bad = str(tmp_path / "day_3")
    write_criteo_tsv(SyntheticCriteo(2**31 - 1, seed=9), bad, 2000, bad_row_every=97)
    paths = [*days, bad]
    ds = tsv(paths, num_embeddings=2**31 - 1, eval_fraction=0.3, on_bad_row="skip", block_size=4096)
    assert ds.num_rows("train") + ds.num_rows("eval") == 3001 + 2500 + 1203 + 2000
    for split in ("train", "eval"):
        size = ds.num_rows(split)
        every = row_keys(read_all(ds, split, batch_size=128 * world))  # one rank, in order
        read = [list(ds.batches(split, 128, rank, world)) for rank in range(world)]
        assert {len(b) for b in read} == {size // (128 * world) + (split == "eval")}  # lock-step
        shares = [row_keys(b) for b in read]
        assert sum(shares, []) == every  # contiguous shares, in order, each row once
        assert len(set(every)) == len(every)  # rows are unique, so "exactly once" is checked
    # every read of the train split (one rank alone, then each rank) leaves the same tail
    assert ds.stats["train"]["unread_tail_rows"] == (1 + world) * (
        ds.num_rows("train") % (128 * world)
    )
    assert ds.stats["eval"]["unread_tail_rows"] == 0  # evaluation reads every line


EVAL_TAILS = {  # 3001 rows: batch size -> world size -> (full steps, the last step's rows)
    100: {1: (30, [1]), 2: (14, [101, 100]), 3: (9, [101, 100, 100])},
    64: {1: (46, [57]), 2: (23, [29, 28]), 3: (15, [41, 40, 40])},
}


@pytest.mark.parametrize("batch_size", sorted(EVAL_TAILS))
@pytest.mark.parametrize("world", [1, 2, 3])
def test_tsv_eval_scores_every_row_at_any_world_size(
    days: list[str], batch_size: int, world: int
) -> None:
    ds = tsv(days[1], num_embeddings=2**31 - 1, eval_paths=days[0])
    full, last = EVAL_TAILS[batch_size][world]
    shares = []
    for rank in range(world):
        batches = list(ds.eval_batches(batch_size, rank, world))
        assert [len(b.labels) for b in batches] == [batch_size] * full + [last[rank]]
        shares += row_keys(batches)
    assert shares == row_keys(read_all(ds, "eval", batch_size=3001))
    assert ds.stats["eval"]["unread_tail_rows"] == 0


def test_eval_with_fewer_rows_than_ranks_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "day_0", [row()] * 2)
    ds = tsv(path, eval_paths=path)
    with pytest.raises(ValueError, match="the split has 2 rows, fewer than the 3 ranks"):
        list(ds.eval_batches(1, 0, 3))


def test_shuffle_buffer_is_seeded_bounded_and_off_by_default(days: list[str]) -> None:
    plain = tsv(days, num_embeddings=2**31 - 1, eval_paths=days[2])
    mixed = tsv(days, num_embeddings=2**31 - 1, eval_paths=days[2], shuffle_buffer=500, seed=3)
    for rank in (0, 1):
        in_order = list(plain.train_batches(64, rank, 2))
        share = slice(rank * 52 * 64, (rank + 1) * 52 * 64)  # 6704 // 128 = 52 batches each
        assert row_keys(in_order) == row_keys(read_all(plain, batch_size=128))[share]
        shuffled = list(mixed.train_batches(64, rank, 2))
        assert [len(b.labels) for b in shuffled] == [64] * 52  # 6704 rows // 128
        before, after = row_keys(in_order), row_keys(shuffled)
        assert sorted(before) == sorted(after) and before != after
        # A row is drawn from the buffer at most buffer + batch rows before its place.
        place = {key: i for i, key in enumerate(before)}
        moved = [place[key] - i for i, key in enumerate(after)]
        assert max(moved) < 500 + 64 and max(moved) > 64  # across batches, within the bound
        again = list(mixed.train_batches(64, rank, 2))  # a replay (resume) finds the same
        assert row_keys(again) == after
        assert row_keys(list(mixed.train_batches(64, rank, 2, epoch=1))) != after
    reseeded = tsv(days, num_embeddings=2**31 - 1, eval_paths=days[2], shuffle_buffer=500, seed=4)
    assert row_keys(list(reseeded.train_batches(64, 0, 2))) != row_keys(
        list(mixed.train_batches(64, 0, 2))
    )
    assert row_keys(list(mixed.eval_batches(64, 0, 1))) == row_keys(read_all(plain, "eval", 64))
    with pytest.raises(ValueError, match="data.options.shuffle_buffer must be >= 0"):
        tsv(days, shuffle_buffer=-1)


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
    assert [len(b.labels) for b in val] == [100] * 6 + [2]  # a short last batch too
    assert_same(val[:-1], read_all(direct, "eval", batch_size=100)[: len(val) - 1])


def torchrec_npy(
    out: str,
    stage: str,
    days: list[str],
    batch_size: int,
    rank: int,
    world: int,
    drop_last: bool = False,
) -> InMemoryBinaryCriteoIterDataPipe:
    """TorchRec's own reader of npy days."""
    dense, sparse, labels = (list(p) for p in zip(*(npy_paths(out, d) for d in days), strict=True))
    return InMemoryBinaryCriteoIterDataPipe(
        stage, dense, sparse, labels, batch_size, rank, world, drop_last=drop_last, mmap_mode=True
    )


def assert_same_as_torchrec(ours: list[Batch], theirs: InMemoryBinaryCriteoIterDataPipe) -> None:
    theirs_list = list(theirs)
    assert len(ours) == len(theirs_list)
    for a, b in zip(ours, theirs_list, strict=True):
        assert torch.equal(a.dense_features, b.dense_features)
        assert torch.equal(a.labels, b.labels.float())
        assert a.sparse_features.values().dtype == b.sparse_features.values().dtype
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())


@pytest.mark.parametrize("batch_size", [64, 100])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_npy_eval_is_torchrecs_batch_for_batch_and_scores_every_row(
    npy_dir: str, batch_size: int, world: int
) -> None:
    """The test half of the last day (601 rows): at batch size 100 a 1-row tail (fewer rows
    than ranks, so the last full step joins it), at 64 tails of 25 and 89 rows."""
    npy = CriteoNpy(npy_dir, eval_stage="test")
    shares = []
    for rank in range(world):
        ours = list(npy.eval_batches(batch_size, rank, world))
        assert_same_as_torchrec(
            ours, torchrec_npy(npy_dir, "test", ["day_2"], batch_size, rank, world)
        )
        shares += row_keys(ours)
    assert sorted(shares) == sorted(row_keys(list(npy.eval_batches(601, 0, 1))))
    assert len(shares) == 601


@pytest.mark.slow
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
    for world in (1, 2, 3):  # training drops the last partial global batch, as drop_last does
        for rank in range(world):
            theirs = torchrec_npy(out, "train", ["day_0", "day_1"], 64, rank, world, drop_last=True)
            assert_same_as_torchrec(list(ours.train_batches(64, rank, world)), theirs)
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
    os.remove(os.path.join(out, "meta.json"))  # as TorchRec's own files: ids reduced when read
    (first, *_) = CriteoNpy(out, num_embeddings=7).train_batches(64, 0, 1)
    stored = np.load(npy_paths(out, "day_0")[1])[:64]
    assert first.sparse_features.values().tolist() == (stored.T.reshape(-1) % 7).tolist()


def test_npy_batches_own_their_memory(npy_dir: str) -> None:
    """A write to a batch reaches neither the files nor another batch of the same rows."""
    npy = CriteoNpy(npy_dir)
    first, second = next(iter(npy.train_batches(64, 0, 1))), next(iter(npy.train_batches(64, 0, 1)))
    stored = np.load(npy_paths(npy_dir, "day_0")[0])[:64]
    first.dense_features += 1.0
    first.sparse_features.values().zero_()
    first.labels.fill_(7.0)
    again = next(iter(CriteoNpy(npy_dir).train_batches(64, 0, 1)))
    for batch in (second, again):
        assert np.array_equal(batch.dense_features.numpy(), stored)
        assert batch.sparse_features.values().dtype == torch.int32  # the files' type, as TorchRec
        assert int(batch.sparse_features.values().count_nonzero()) > 0
        assert set(batch.labels.tolist()) <= {0.0, 1.0}


class _WideIds(CriteoNpy):
    """criteo_npy with ids widened to int64: what its int32 ids must train exactly as."""

    def fetch(self, split: str, start: int, stop: int) -> Batch:
        batch = super().fetch(split, start, stop)
        kjt = batch.sparse_features
        wide = KeyedJaggedTensor(
            kjt.keys(), kjt.values().long(), lengths=kjt.lengths(), stride=kjt.stride()
        )
        return Batch(batch.dense_features, wide, batch.labels)


def _train_npy(rank: int, world_size: int, directory: str) -> list[dict[str, Any]]:
    env = init_distributed(60)
    out = []
    for kind, kernel in (("column_wise", "fused"), ("data_parallel", "dense")):
        for reader in (CriteoNpy, _WideIds):
            cfg = load_config("synthetic", [
                "data.name=criteo_npy", f"data.options={{directory: {directory}}}",
                "train.batch_size=64", "train.steps=30", "eval.batch_size=100",
                "eval.every_steps=null", "train.log_every=1000", "sync.strategy.name=ddp",
                f"sharding.types=[{kind}]", f"sharding.compute_kernel={kernel}",
                "sharding.min_partition=8",
            ])
            trainer = Trainer(RunContext.of(cfg, env), reader(directory))
            summary = trainer.train()
            dense = torch.cat([p.flatten() for p in dense_parameters(trainer.dmp).values()])
            plan = plan_ranks(trainer.plan)
            out.append({"summary": summary, "dense": dense.detach(), "plan": plan})
    return out


@pytest.mark.slow
def test_npy_int32_ids_train_on_every_cpu_sharding_as_int64_ids(npy_dir: str) -> None:
    """TorchRec's sharded embeddings on CPU (fused tables split by column, whose ids travel in
    all-to-alls, and data-parallel ones) take the files' int32 ids and train exactly as with
    int64 ids."""
    results = run_ranks(functools.partial(_train_npy, directory=npy_dir), timeout_s=300)
    for i, kind in enumerate(("column_wise", "column_wise", "data_parallel", "data_parallel")):
        assert {k for k, _ in results[0][i]["plan"].values()} == {kind}
    for narrow, wide in zip(results[0][::2], results[0][1::2], strict=True):
        assert narrow["summary"]["step"] == 30
        assert narrow["summary"]["eval_examples"] == math.ceil(1203 / 2)  # every val row
        assert torch.equal(narrow["dense"], wide["dense"])
        assert narrow["summary"]["eval_ne"] == wide["summary"]["eval_ne"]

