"""Converts Criteo TSV files to TorchRec's per-day ``.npy`` layout, in bounded memory.

For each input ``<dir>/day_N[.gz]`` (or ``train.txt``) it writes ``day_N_dense.npy`` (float32
``[n, 13]``, already ``log(1 + max(x, 0))`` as TorchRec stores it), ``day_N_sparse.npy``
(int32 ``[n, 26]``, ids already modulo the table sizes) and ``day_N_labels.npy`` (int32
``[n, 1]``), so :class:`torchrec.datasets.criteo.InMemoryBinaryCriteoIterDataPipe` reads them
as they are; ``meta.json`` records the table sizes and row counts for ``criteo_npy``.

Usage::

    python -m shadowsync.datasets.criteo_preprocess --out /data/criteo_npy \\
        --num-embeddings 1000000 /data/criteo/day_{0..23}.gz
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from shadowsync.datasets.batching import logger
from shadowsync.datasets.criteo_npy import META_FILE, npy_paths
from shadowsync.datasets.criteo_tsv import (
    CAT_FEATURE_COUNT,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_NUM_EMBEDDINGS,
    INT_FEATURE_COUNT,
    CriteoFormatError,
    OnBadRow,
    criteo_spec,
    hash_ids,
    index_file,
    iter_rows,
    natural_key,
)

_SUFFIXES = (".gz", ".txt", ".tsv")
_COPY_ROWS = 1 << 20


def day_name(path: str) -> str:
    """``/x/day_3.gz`` -> ``day_3``; ``train.txt`` -> ``train`` (TorchRec's output names)."""
    name = os.path.basename(path)
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def convert_file(
    path: str,
    out_dir: str,
    num_embeddings: list[int],
    on_bad_row: OnBadRow = "raise",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, int]:
    """One TSV file to three ``.npy`` files, block by block through memory maps.

    Files are written under a temporary name and renamed at the end, so an interrupted run
    never leaves a file that looks complete. Returns ``{"rows": .., "bad_rows": ..}``.
    """
    index = index_file(path, block_size)
    if index.num_lines == 0 and on_bad_row == "raise":
        raise CriteoFormatError(f"{path}: line 1: the file is empty")
    sizes = np.asarray(num_embeddings, dtype=np.int64)
    final = npy_paths(out_dir, day_name(path))
    tmp = [f"{p}.tmp" for p in final]
    shapes = [(INT_FEATURE_COUNT,), (CAT_FEATURE_COUNT,), (1,)]
    dtypes = [np.float32, np.int32, np.int32]
    arrays = [
        np.lib.format.open_memmap(p, mode="w+", dtype=dt, shape=(index.num_lines, *shape))
        for p, dt, shape in zip(tmp, dtypes, shapes, strict=True)
    ]
    try:
        rows, bad = 0, 0
        for parsed in iter_rows(index, 0, index.num_lines, on_bad_row, block_size):
            n = len(parsed.labels)
            arrays[0][rows : rows + n] = parsed.dense
            arrays[1][rows : rows + n] = hash_ids(parsed.raw_ids, sizes)
            arrays[2][rows : rows + n, 0] = parsed.labels
            rows, bad = rows + n, bad + parsed.bad_rows
        for src, dst, arr in zip(tmp, final, arrays, strict=True):
            arr.flush()
            if rows == index.num_lines:
                os.replace(src, dst)
                continue
            # Rows were skipped: copy the filled prefix into a file of the exact size.
            exact = np.lib.format.open_memmap(
                f"{src}.exact", "w+", arr.dtype, (rows, *arr.shape[1:])
            )
            for lo in range(0, rows, _COPY_ROWS):
                exact[lo : lo + _COPY_ROWS] = arr[lo : min(lo + _COPY_ROWS, rows)]
            exact.flush()
            os.replace(f"{src}.exact", dst)
    finally:
        for leftover in (name for src in tmp for name in (src, f"{src}.exact")):
            if os.path.exists(leftover):
                os.remove(leftover)
    if bad:
        logger.warning("%s: skipped %d bad rows (on_bad_row='skip')", path, bad)
    return {"rows": rows, "bad_rows": bad}


def preprocess(
    paths: Sequence[str],
    out_dir: str,
    num_embeddings: int | list[int],
    on_bad_row: OnBadRow = "raise",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, Any]:
    """Converts ``paths`` (natural order) and writes ``meta.json``; returns its content."""
    sizes = criteo_spec(num_embeddings).num_embeddings
    os.makedirs(out_dir, exist_ok=True)
    days = {}
    for path in sorted(paths, key=natural_key):
        days[day_name(path)] = {
            "source": path,
            **convert_file(path, out_dir, sizes, on_bad_row, block_size),
        }
        logger.info("%s -> %s: %d rows", path, out_dir, days[day_name(path)]["rows"])
    if len(days) != len(paths):
        raise ValueError("two input files map to the same day name")
    meta = {"num_embeddings": sizes, "dense": "log1p(max(x, 0))", "days": days}
    with open(os.path.join(out_dir, META_FILE), "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="Criteo TSV files (day_N, train.txt, .gz)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--num-embeddings",
        default=str(DEFAULT_NUM_EMBEDDINGS),
        help="table size for all 26 features, or 26 comma-separated sizes (default %(default)s)",
    )
    parser.add_argument("--on-bad-row", choices=("raise", "skip"), default="raise")
    parser.add_argument(
        "--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="bytes per block"
    )
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.num_embeddings.split(",")]
        meta = preprocess(
            args.inputs,
            args.out,
            sizes[0] if len(sizes) == 1 else sizes,
            args.on_bad_row,
            args.block_size,
        )
    except (OSError, ValueError) as e:  # bad input: say what and where, without a traceback
        parser.exit(1, f"criteo_preprocess: error: {e}\n")
    for day, info in meta["days"].items():
        print(f"{day}: {info['rows']} rows, {info['bad_rows']} bad rows skipped")


if __name__ == "__main__":
    main(sys.argv[1:])
