"""Input throughput, side by side with TorchRec's readers doing the same work.

Writes a synthetic Criteo TSV day (``write_criteo_tsv``) and converts it to npy
(``criteo_preprocess``), then times, in interleaved rounds so that a busy machine slows
every reader alike, two pairs that produce the same batches (dense float32
``log(1 + max(x, 0))``, a KJT of ids modulo the table sizes, float labels):

- TSV: TorchRec's ``CriteoIterDataPipe`` (its own per-value casting) batched into ``Batch``es
  with our transforms, against ``criteo_tsv`` (with and without pyarrow's threads);
- npy: TorchRec's ``InMemoryBinaryCriteoIterDataPipe(mmap_mode=True)`` against ``criteo_npy``
  on the same files, ``--npy-passes`` passes of each per round, the two alternating pass by
  pass, each timed by the median of its passes in the round (a pass takes milliseconds, so
  one preemption would otherwise decide the round), and also by the CPU time of the thread
  both run in, which time spent waiting for a core does not count. ``criteo_npy`` does a
  little more: its batches own their memory (dense features and float labels copied out of
  the maps), TorchRec's alias the read-only maps (int labels).

Prints the median rows/s of each reader with the range over rounds, and per-round speed
ratios (ours / TorchRec's) with their range; a claim holds only if the whole range does.
The line index and the TSV -> npy conversion are timed once. Also timed per round: how long
the first and the last of 4 ranks wait for their first ``criteo_tsv`` batch when the day is
gzip (the last one decompresses and drops the three shares before its own) and when it is
not (it seeks), with gzip's decompression rate.

    python -m shadowsync.benchmarks.bench_data --rows 200000 --rounds 5
"""

from __future__ import annotations

import argparse
import functools
import gzip
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
from torchrec.datasets.criteo import (
    DEFAULT_CAT_NAMES,
    DEFAULT_INT_NAMES,
    DEFAULT_LABEL_NAME,
    CriteoIterDataPipe,
    InMemoryBinaryCriteoIterDataPipe,
)
from torchrec.datasets.utils import Batch

from shadowsync.benchmarks.report import markdown_table
from shadowsync.datasets import CriteoNpy, CriteoTSV, SyntheticCriteo, write_criteo_tsv
from shadowsync.datasets.batching import make_batch
from shadowsync.datasets.criteo_npy import npy_paths
from shadowsync.datasets.criteo_preprocess import preprocess
from shadowsync.datasets.criteo_tsv import dense_transform, hash_ids


def torchrec_tsv_batches(path: str, batch_size: int, num_embeddings: int) -> Iterator[Batch]:
    """TorchRec's TSV reader taken to our output: its rows (label and dense cast to int, ids
    as strings, empty as 0 / ""), ``batch_size`` at a time, through our transforms."""
    sizes = np.full(len(DEFAULT_CAT_NAMES), num_embeddings, dtype=np.int64)
    rows: list[dict[str, int | str]] = []
    for row in CriteoIterDataPipe([path]):
        rows.append(row)
        if len(rows) == batch_size:
            dense = np.array([[r[n] for n in DEFAULT_INT_NAMES] for r in rows], dtype=np.int64)
            ids = np.array(
                [[int(str(r[n] or "0"), 16) for n in DEFAULT_CAT_NAMES] for r in rows],
                dtype=np.int64
            )
            labels = np.array([r[DEFAULT_LABEL_NAME] for r in rows], dtype=np.float32)
            yield make_batch(
                dense_transform(dense), labels, DEFAULT_CAT_NAMES, hash_ids(ids, sizes)
            )
            rows = []


def count_rows(batches: Iterable[Batch]) -> int:
    return sum(len(b.labels) for b in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the timed TSV day")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--num-embeddings", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved runs of every reader")
    parser.add_argument(
        "--npy-passes", type=int, default=20, help="alternating passes of each npy reader a round"
    )
    args = parser.parse_args()
    b, n_emb = args.batch_size, args.num_embeddings
    with tempfile.TemporaryDirectory() as tmp:
        day0, day1, out = f"{tmp}/day_0", f"{tmp}/day_1", f"{tmp}/npy"
        synthetic = SyntheticCriteo(num_embeddings=n_emb)
        write_criteo_tsv(synthetic, day0, args.rows, missing=0.05)
        write_criteo_tsv(synthetic, day1, 10_000, split="eval")
        once: list[tuple[str, int, float]] = []
        start = time.perf_counter()
        ours = CriteoTSV(day0, n_emb, eval_paths=day1, index_cache_dir=None)
        once.append(
            ("criteo_tsv line index (once per file)", args.rows, time.perf_counter() - start)
        )
        single = CriteoTSV(day0, n_emb, eval_paths=day1, use_threads=False, index_cache_dir=None)
        start = time.perf_counter()
        preprocess([day0, day1], out, n_emb)
        once.append(
            ("criteo_preprocess TSV -> npy", args.rows + 10_000, time.perf_counter() - start)
        )
        npy = CriteoNpy(out)
        dense, sparse, labels = (
            [p] for p in npy_paths(out, "day_0")
        )  # the training day, as TorchRec is given it

        theirs_npy = InMemoryBinaryCriteoIterDataPipe(  # built once, like ours
            "train", dense, sparse, labels, b, 0, 1, drop_last=True, mmap_mode=True
        )
        readers: dict[str, Callable[[], Iterable[Batch]]] = {
            "TorchRec CriteoIterDataPipe -> Batch": lambda: torchrec_tsv_batches(day0, b, n_emb),
            "criteo_tsv": lambda: ours.train_batches(b, 0, 1),
            "criteo_tsv, use_threads=False": lambda: single.train_batches(b, 0, 1),
        }
        npy_readers: dict[str, Callable[[], Iterable[Batch]]] = {
            "TorchRec InMemoryBinaryCriteoIterDataPipe (mmap)": lambda: theirs_npy,
            "criteo_npy (mmap)": lambda: npy.train_batches(b, 0, 1),
        }
        with open(day0, "rb") as src, gzip.open(f"{day0}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        zipped = CriteoTSV(f"{day0}.gz", n_emb, eval_paths=day1, index_cache_dir=None)
        def first_batch(ds: CriteoTSV, rank: int) -> object:
            return next(iter(ds.train_batches(b, rank, 4)))

        starts: dict[str, Callable[[], object]] = {
            f"{kind}, rank {rank} of 4": functools.partial(first_batch, ds, rank)
            for kind, ds in (("plain", ours), ("gzip", zipped))
            for rank in (0, 3)
        }
        rows: dict[str, int] = {}
        seconds: dict[str, list[float]] = {name: [] for name in [*readers, *npy_readers, *starts]}
        cpu: dict[str, list[float]] = {name: [] for name in npy_readers}
        inflate: list[float] = []
        for _ in range(args.rounds):
            for name, run in readers.items():
                start = time.perf_counter()
                rows[name] = count_rows(run())
                seconds[name].append(time.perf_counter() - start)
            passes: dict[str, list[tuple[float, float]]] = {name: [] for name in npy_readers}
            for i in range(args.npy_passes):
                for name in list(npy_readers)[:: 1 if i % 2 else -1]:
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    rows[name] = count_rows(npy_readers[name]())
                    passes[name].append(
                        (time.perf_counter() - start, time.thread_time() - start_cpu)
                    )
            for name, times in passes.items():
                seconds[name].append(statistics.median(t for t, _ in times))
                cpu[name].append(statistics.median(c for _, c in times))
            for name, first in starts.items():
                start = time.perf_counter()
                first()
                seconds[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            with gzip.open(f"{day0}.gz", "rb") as f:
                size = sum(len(chunk) for chunk in iter(lambda: f.read(16 << 20), b""))
            inflate.append(size / (time.perf_counter() - start))

    print(f"\n{args.rows:,} rows, batch size {b}, {args.rounds} interleaved rounds\n")
    rates = {name: [rows[name] / t for t in seconds[name]] for name in [*readers, *npy_readers]}
    print(markdown_table(
        ["reader", "rows", "rows/s (median)", "rows/s (min - max)"],
        [*([name, f"{rows[name]:,}", f"{statistics.median(r):,.0f}",
            f"{min(r):,.0f} - {max(r):,.0f}"] for name, r in rates.items()),
         *([name, f"{n:,}", f"{n / t:,.0f}", "(one run)"] for name, n, t in once)], "lrrr"))
    print("\n" + markdown_table(
        ["criteo_tsv, first batch of a rank (4 ranks)", "seconds (median)", "min - max"],
        [[name, f"{statistics.median(seconds[name]):.2f}",
          f"{min(seconds[name]):.2f} - {max(seconds[name]):.2f}"] for name in starts], "lrr"))
    print(
        f"\ngzip decompression: {statistics.median(inflate) / 1e6:.0f} MB/s of text "
        f"({min(inflate) / 1e6:.0f} - {max(inflate) / 1e6:.0f})"
    )
    npy_pair = ("criteo_npy (mmap)", "TorchRec InMemoryBinaryCriteoIterDataPipe (mmap)")
    pairs = [
        ("criteo_tsv", "TorchRec CriteoIterDataPipe -> Batch", "", seconds),
        ("criteo_tsv, use_threads=False", "TorchRec CriteoIterDataPipe -> Batch", "", seconds),
        (*npy_pair, "", seconds),
        (*npy_pair, ", CPU time", cpu),
    ]
    cells = []
    for a, theirs, measure, timing in pairs:
        ratios = [
            (rows[a] / ta) / (rows[theirs] / tb)
            for ta, tb in zip(timing[a], timing[theirs], strict=True)
        ]
        cells.append([f"{a} / {theirs}{measure}", f"{statistics.median(ratios):.2f}x",
                      f"{min(ratios):.2f}x - {max(ratios):.2f}x"])
    print("\n" + markdown_table(["ours / TorchRec's, per round", "median", "min - max"], cells,
                                "lrr"))


if __name__ == "__main__":
    main()
