"""Input throughput: our Criteo TSV reader against TorchRec's, and the npy loader alone.

Writes a synthetic Criteo TSV day (``write_criteo_tsv``), then times, on that same file:
TorchRec's ``CriteoIterDataPipe`` (rows parsed into Python dicts, no batching), our
``criteo_tsv`` (parsed, transformed, hashed and batched into TorchRec ``Batch``es; the line
index is timed apart), the TSV -> npy conversion, and ``criteo_npy`` batches. Each reader
runs ``--repeat`` times and its best time counts. Prints a Markdown table.

    python benchmarks/bench_data.py --rows 500000 --repeat 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterable

from torchrec.datasets.criteo import CriteoIterDataPipe

from shadowsync.datasets import CriteoNpy, CriteoTSV, SyntheticCriteo, write_criteo_tsv
from shadowsync.datasets.criteo_preprocess import preprocess


def timed(
    run: Callable[[], Iterable[object]], count: Callable[[object], int], repeat: int
) -> tuple[int, float]:
    """Rows produced by iterating ``run()`` and the best seconds of ``repeat`` runs (the
    machine is shared, so the fastest run is the least disturbed one)."""
    best, rows = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        rows = sum(count(item) for item in run())
        best = min(best, time.perf_counter() - start)
    return rows, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500_000, help="rows of the timed TSV day")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--num-embeddings", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader; the best counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        day0, day1 = f"{tmp}/day_0", f"{tmp}/day_1"
        synthetic = SyntheticCriteo(num_embeddings=args.num_embeddings)
        write_criteo_tsv(synthetic, day0, args.rows, missing=0.05)
        write_criteo_tsv(synthetic, day1, 10_000, split="eval")

        def batch_rows(batch: object) -> int:
            return len(batch.labels)  # type: ignore[attr-defined]

        results: list[tuple[str, int, float]] = []
        start = time.perf_counter()
        ours = CriteoTSV(day0, args.num_embeddings, eval_paths=day1, index_cache_dir=None)
        results.append(
            ("criteo_tsv line index (once per file)", args.rows, time.perf_counter() - start)
        )
        theirs = timed(lambda: CriteoIterDataPipe([day0]), lambda _: 1, args.repeat)
        results.append(("TorchRec CriteoIterDataPipe (rows, no batching)", *theirs))
        results.append(
            (
                "criteo_tsv batches",
                *timed(lambda: ours.train_batches(args.batch_size, 0, 1), batch_rows, args.repeat),
            )
        )
        single = CriteoTSV(
            day0, args.num_embeddings, eval_paths=day1, use_threads=False, index_cache_dir=None
        )
        results.append(
            (
                "criteo_tsv batches, use_threads=False",
                *timed(
                    lambda: single.train_batches(args.batch_size, 0, 1), batch_rows, args.repeat
                ),
            )
        )
        start = time.perf_counter()
        preprocess([day0, day1], f"{tmp}/npy", args.num_embeddings)
        results.append(
            ("criteo_preprocess TSV -> npy", args.rows + 10_000, time.perf_counter() - start)
        )
        npy = CriteoNpy(f"{tmp}/npy")
        results.append(
            (
                "criteo_npy batches (memory-mapped)",
                *timed(lambda: npy.train_batches(args.batch_size, 0, 1), batch_rows, args.repeat),
            )
        )

    base = theirs[0] / theirs[1]
    print(f"\n{args.rows:,} rows, batch size {args.batch_size}\n")
    print("| reader | rows | seconds | rows/s | vs TorchRec TSV |")
    print("|---|---:|---:|---:|---:|")
    for name, rows, seconds in results:
        rate = rows / seconds
        print(f"| {name} | {rows:,} | {seconds:.2f} | {rate:,.0f} | {rate / base:.1f}x |")


if __name__ == "__main__":
    main()
