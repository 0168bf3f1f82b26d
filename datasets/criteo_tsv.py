"""Criteo click logs read straight from their TSV files (Kaggle ``train.txt``, Terabyte
``day_0 .. day_23``, plain or gzip), streamed in blocks and parsed column-wise by pyarrow.

Row format: ``label <TAB> 13 integers <TAB> 26 hex ids``, one row per ``\\n``-terminated line
(``\\r\\n`` too). pyarrow only splits the fields, as raw bytes; every value is then checked by
one rule per column (:data:`COLUMN_RULES`), the same for every block and for the error
messages, so whether a row is kept never depends on its neighbours:

- label: exactly ``0`` or ``1``;
- dense: empty (read as 0), or an optional ``-`` and 1 to 18 ASCII digits (``-0`` and leading
  zeros are fine; no ``+``, spaces, ``0x``, exponents, ``NA``); more digits could overflow the
  int64 it is read as. Values become ``log(1 + max(x, 0))``;
- id: empty (read as 0, as TorchRec's ``BinaryCriteoUtils.tsv_to_npys`` does) or 1 to 8 of
  ``0-9 a-f A-F``; it becomes ``int(hex, 16) % num_embeddings[f]``.

A line is also bad when it has other than 40 tab-separated fields, holds a carriage return not
followed by ``\\n`` (pyarrow would end a row there; a file with CR-only line endings is one such
line), or is longer than ``block_size`` bytes (it is skipped without being held in memory).
Gzip is recognised by content, whatever the file's name.

Sharding: the files of a split form one sequence of lines, cut into lock-step batches by
:func:`~shadowsync.datasets.batching.plan_steps`. Every file is indexed once (line count, and
byte offsets of a line start every ``block_size`` bytes) so that each rank seeks straight to
its own contiguous share of the lines (gzip is decompressed and discarded up to it; unlike
``criteo_npy``, whose ranks take global steps round-robin). The index is cached in memory
and, for local files, in ``index_cache_dir`` keyed by path, size and modification time.

Bad input raises :class:`CriteoFormatError` naming the file and the 1-based line; with
``on_bad_row="skip"`` bad rows are dropped and counted instead (a batch that held some is
shorter; one whose lines are all bad is still an error, as a batch needs a row). A missing or
unreadable file raises ``OSError`` naming it.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import hashlib
import json
import os
import re
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

import numpy as np
import pyarrow as pa
from iopath.common.file_io import PathManager
from pyarrow import csv as pa_csv
from torchrec.datasets.criteo import (
    CAT_FEATURE_COUNT,
    DEFAULT_CAT_NAMES,
    DEFAULT_INT_NAMES,
    DEFAULT_LABEL_NAME,
    INT_FEATURE_COUNT,
)
from torchrec.datasets.utils import Batch

from shadowsync.datasets.base import DataSpec, RecDataset, register_dataset
from shadowsync.datasets.batching import logger, make_batch, plan_steps, report_pass

NUM_COLUMNS = 1 + INT_FEATURE_COUNT + CAT_FEATURE_COUNT
COLUMN_NAMES = [DEFAULT_LABEL_NAME, *DEFAULT_INT_NAMES, *DEFAULT_CAT_NAMES]
DEFAULT_BLOCK_SIZE = 16 << 20
DEFAULT_NUM_EMBEDDINGS = 100_000
DEFAULT_INDEX_CACHE = "~/.cache/shadowsync/criteo_tsv"
MAX_DENSE_DIGITS = 18  # 10**18 - 1 < 2**63: any such value fits int64
_INDEX_VERSION = 1
_GZIP_MAGIC = b"\x1f\x8b"
_POW10 = 10 ** np.arange(MAX_DENSE_DIGITS + 1, dtype=np.int64)
_SKIP_HINT = "(on_bad_row='skip', or --on-bad-row skip, skips and counts such rows)"

OnBadRow = Literal["raise", "skip"]
path_manager = PathManager()


class CriteoFormatError(ValueError):
    """A malformed Criteo row or file; the message names the file and the 1-based line."""


def dense_transform(raw: np.ndarray) -> np.ndarray:
    """``log(1 + max(x, 0))`` as float32: the scale DLRM's bottom MLP is trained on."""
    return np.log1p(np.maximum(raw, 0).astype(np.float32))


def hash_ids(raw: np.ndarray, num_embeddings: np.ndarray) -> np.ndarray:
    """Raw 32-bit ids ``[n, 26]`` to table rows: modulo each feature's table size."""
    return raw % num_embeddings


# ---------------------------------------------------------------------------- column rules
# Each rule reads a column of byte strings as ``offsets`` (n + 1, from 0) into ``data`` and
# returns the values (int64, 0 where bad) and a bad-row mask. Blocks and error messages use
# the same rules, so a value is accepted or rejected the same way wherever it appears.

Rule = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _first_bytes(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """The first byte of every value (0 for an empty one)."""
    if len(data) == 0:
        return np.zeros(len(offsets) - 1, dtype=np.uint8)
    first = data[np.minimum(offsets[:-1], len(data) - 1)]
    return np.where(np.diff(offsets) > 0, first, 0).astype(np.uint8)


def label_rule(offsets: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exactly ``0`` or ``1``."""
    value = _first_bytes(offsets, data).astype(np.int64) - ord("0")
    bad = (np.diff(offsets) != 1) | ((value != 0) & (value != 1))
    return np.where(bad, 0, value), bad


def dense_rule(offsets: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empty (0), or an optional ``-`` and 1 to :data:`MAX_DENSE_DIGITS` ASCII digits.

    Parsed in numpy from the bytes: each digit is weighted by its power of ten and the
    weights summed per value through a running sum (int64 wrap-around cancels in the
    differences, as every accepted value fits int64).
    """
    n, lengths = len(offsets) - 1, np.diff(offsets)
    digit = data - np.uint8(ord("0"))
    is_digit = digit < 10
    neg = _first_bytes(offsets, data) == ord("-")
    non_digits = np.concatenate([[0], np.cumsum(~is_digit)])
    num_digits = lengths - neg
    bad = (non_digits[offsets[1:]] - non_digits[offsets[:-1]] != neg) | (
        (lengths > 0) & ((num_digits < 1) | (num_digits > MAX_DENSE_DIGITS))
    )
    place = np.repeat(offsets[1:], lengths) - np.arange(len(data)) - 1  # 0 for the last digit
    weights = np.where(is_digit, digit * _POW10[np.minimum(place, MAX_DENSE_DIGITS)], 0)
    sums = np.concatenate([[0], np.cumsum(weights)])
    magnitude = sums[offsets[1:]] - sums[offsets[:-1]]
    values = np.where(neg, -magnitude, magnitude) if n else np.zeros(0, dtype=np.int64)
    return np.where(bad, 0, values), bad


def _hex8_values(chars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[m, 8]`` ASCII hex digits to uint32 values (as int64), and a per-row bad mask.

    SWAR, no per-byte lookup: the 8 bytes of a value are one big-endian uint64; a digit's
    nibble is ``(c & 0xF) + 9 * (c >> 6 & 1)``, then the nibbles fold pairwise in 3 steps.
    The nibble formula is only right for ``0-9 a-f A-F``, which the mask checks first.
    """
    lower = chars | np.uint8(0x20)  # letters become lower case (digits keep their code)
    ok = ((chars - np.uint8(ord("0"))) < 10) | ((lower - np.uint8(ord("a"))) < 6)
    bad = np.ascontiguousarray(ok).view(np.uint64)[:, 0] != np.uint64(0x0101010101010101)
    x = np.ascontiguousarray(chars).view(">u8").reshape(-1).astype(np.uint64)
    x = (x & np.uint64(0x0F0F0F0F0F0F0F0F)) + (
        x >> np.uint64(6) & np.uint64(0x0101010101010101)
    ) * np.uint64(9)
    x = ((x >> np.uint64(4)) | x) & np.uint64(0x00FF00FF00FF00FF)
    x = ((x >> np.uint64(8)) | x) & np.uint64(0x0000FFFF0000FFFF)
    x = ((x >> np.uint64(16)) | x) & np.uint64(0xFFFFFFFF)
    return x.astype(np.int64), bad


def id_rule(offsets: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empty (0), or 1 to 8 of ``0-9 a-f A-F`` read as hex.

    Criteo's ids are all 8 digits or empty: then the bytes of the non-empty values lie back
    to back and are decoded in place. Otherwise each value is first right-aligned into 8
    characters padded with ``0``.
    """
    n, lengths = len(offsets) - 1, np.diff(offsets)
    values, bad = np.zeros(n, dtype=np.int64), lengths > 8
    if len(data) == 0:
        return values, bad
    full = lengths == 8
    if (full | (lengths == 0)).all():
        rows: np.ndarray | slice = full
        chars = data.reshape(-1, 8)
    else:
        rows = slice(None)
        cols = np.arange(8)
        present = cols >= 8 - np.minimum(lengths, 8)[:, None]
        where = offsets[:-1, None] + lengths[:, None] - 8 + cols
        chars = np.full((n, 8), ord("0"), dtype=np.uint8)
        chars[present] = data[where[present]]
    values[rows], row_bad = _hex8_values(chars)
    bad[rows] |= row_bad
    values[bad] = 0
    return values, bad


COLUMN_RULES: dict[str, Rule] = {
    DEFAULT_LABEL_NAME: label_rule,
    **dict.fromkeys(DEFAULT_INT_NAMES, dense_rule),
    **dict.fromkeys(DEFAULT_CAT_NAMES, id_rule),
}
_EXPECTED: dict[Callable[..., Any], str] = {
    label_rule: "must be 0 or 1",
    dense_rule: "must be empty or a decimal integer "
    f"(optional '-', then 1 to {MAX_DENSE_DIGITS} digits)",
    id_rule: "must be empty or 1 to 8 hex digits (0-9, a-f, A-F)",
}


def _show(value: bytes) -> str:
    """A value for an error message: as text when it is ASCII, else as bytes."""
    return repr(value.decode()) if value.isascii() else repr(value)


def explain_line(text: bytes) -> str:
    """Why one line (without its ``\\n``) is not a Criteo row, by the same column rules."""
    if text in (b"", b"\r"):
        return "empty line"
    if b"\r" in text.removesuffix(b"\r"):
        return "a carriage return inside the line (CR-only line endings?)"
    fields = text.removesuffix(b"\r").split(b"\t")
    if len(fields) != NUM_COLUMNS:
        return f"expected {NUM_COLUMNS} tab-separated fields, got {len(fields)}"
    for name, value in zip(COLUMN_NAMES, fields, strict=True):
        rule = COLUMN_RULES[name]
        if rule(np.array([0, len(value)]), np.frombuffer(value, dtype=np.uint8))[1][0]:
            digits = len(value.removeprefix(b"-"))
            if rule is dense_rule and value.lstrip(b"-").isdigit() and digits > 18:
                return (
                    f"{name} has {digits} digits, more than the {MAX_DENSE_DIGITS} that "
                    f"always fit the int64 it is read as: got {_show(value)}"
                )
            return f"{name} {_EXPECTED[rule]}, got {_show(value)}"
    return "malformed row"


def _binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (from 0) and bytes of a pyarrow binary array, without copying the bytes."""
    n = len(array)
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1, 4 * array.offset).astype(np.int64)
    if data_buf is None or offsets[-1] == offsets[0]:
        return offsets - offsets[0], np.zeros(0, dtype=np.uint8)
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], data


def _apply_rules(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """All 40 columns through their rules: values ``[n, 40]`` int64 and a per-row bad mask."""
    values = np.empty((NUM_COLUMNS, table.num_rows), dtype=np.int64)
    bad = np.zeros(table.num_rows, dtype=bool)
    for j, name in enumerate(COLUMN_NAMES):
        pos = 0
        for chunk in table.column(name).chunks:
            chunk_values, chunk_bad = COLUMN_RULES[name](*_binary_parts(chunk))
            values[j, pos : pos + len(chunk)] = chunk_values
            bad[pos : pos + len(chunk)] |= chunk_bad
            pos += len(chunk)
    return values.T, bad


# ---------------------------------------------------------------------------- files and lines
@dataclass(frozen=True)
class FileIndex:
    """Line count of one file and where lines start (``(line, byte offset)`` checkpoints)."""

    path: str
    num_lines: int
    checkpoints: tuple[tuple[int, int], ...]


@dataclass
class ParsedRows:
    """Good rows of a run of lines: dense already transformed, ids still raw (uint32 range)."""

    dense: np.ndarray
    raw_ids: np.ndarray
    labels: np.ndarray
    lines: np.ndarray  # 0-based line number in the file of every row
    end_line: int  # the first line not covered
    bad_rows: int

    @staticmethod
    def empty(end_line: int, bad_rows: int) -> ParsedRows:
        return ParsedRows(
            np.zeros((0, INT_FEATURE_COUNT), dtype=np.float32),
            np.zeros((0, CAT_FEATURE_COUNT), dtype=np.int64),
            np.zeros(0, dtype=np.float32),
            np.zeros(0, dtype=np.int64),
            end_line,
            bad_rows,
        )

    @staticmethod
    def concat(parts: list[ParsedRows]) -> ParsedRows:
        return ParsedRows(
            dense=np.concatenate([p.dense for p in parts]),
            raw_ids=np.concatenate([p.raw_ids for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            lines=np.concatenate([p.lines for p in parts]),
            end_line=parts[-1].end_line,
            bad_rows=sum(p.bad_rows for p in parts),
        )

    def take(self, rows: slice | np.ndarray) -> ParsedRows:
        """Some of the rows; ``end_line`` stays, so a remainder still knows what it covers."""
        return ParsedRows(
            self.dense[rows],
            self.raw_ids[rows],
            self.labels[rows],
            self.lines[rows],
            self.end_line,
            0,
        )


@contextlib.contextmanager
def open_binary(path: str) -> Iterator[IO[bytes]]:
    """Opens a local or remote (iopath) file for reading, decompressing gzip content."""
    try:
        raw = path_manager.open(path, "rb")
    except OSError as e:
        raise OSError(f"{path}: cannot open for reading: {e}") from e
    with raw:
        magic = _read(raw, 2, path, 0)
        raw.seek(0)
        if magic != _GZIP_MAGIC:
            yield raw
            return
        with gzip.GzipFile(fileobj=raw) as unzipped:
            yield unzipped  # type: ignore[misc]  # GzipFile is a binary IO; typeshed says IO[bytes] only via BufferedIOBase


def _read(f: IO[bytes], size: int, path: str, line: int) -> bytes:
    try:
        return f.read(size)
    except (OSError, EOFError, zlib.error) as e:
        raise OSError(f"{path}: read failed near line {line + 1}: {e}") from e


def index_file(path: str, block_size: int = DEFAULT_BLOCK_SIZE) -> FileIndex:
    """Counts lines (a final line without newline counts) and notes a line start per block."""
    lines, line_start, checkpoints = 0, 0, [(0, 0)]
    pos, last = 0, b"\n"
    with open_binary(path) as f:
        while chunk := _read(f, block_size, path, lines):
            if checkpoints[-1][1] != line_start:
                checkpoints.append((lines, line_start))
            lines += chunk.count(b"\n")
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                line_start = pos + nl + 1
            pos += len(chunk)
            last = chunk[-1:]
    return FileIndex(path, lines + (last != b"\n"), tuple(checkpoints))


def cached_index(path: str, block_size: int, cache_dir: str | None) -> FileIndex:
    """:func:`index_file`, remembered on disk for local files (keyed by size and mtime)."""
    if cache_dir is None or not os.path.isfile(path):
        return index_file(path, block_size)
    st = os.stat(path)
    key = f"{_INDEX_VERSION}|{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    cache = os.path.join(
        os.path.expanduser(cache_dir), hashlib.sha1(key.encode()).hexdigest() + ".json"
    )
    if os.path.exists(cache):
        with open(cache) as f:
            saved = json.load(f)
        return FileIndex(path, saved["num_lines"], tuple(map(tuple, saved["checkpoints"])))
    index = index_file(path, block_size)
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    tmp = f"{cache}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"num_lines": index.num_lines, "checkpoints": index.checkpoints}, f)
    os.replace(tmp, cache)
    return index


def _nth_newline_end(buf: bytes, n: int) -> int:
    """Offset just past the ``n``-th (1-based) newline of ``buf``; ``len(buf)`` if fewer."""
    if n <= 0:
        return 0
    ends = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)
    return int(ends[n - 1]) + 1 if n <= len(ends) else len(buf)


def iter_line_blocks(
    index: FileIndex, start: int, stop: int, block_size: int
) -> Iterator[tuple[int, bytes | None]]:
    """``(first line, bytes)`` of runs of whole lines ``[start, stop)`` of one file.

    A line longer than ``block_size`` bytes comes as ``(line, None)``, and its bytes are read
    and dropped, never held whole: memory stays within two blocks whatever the file holds.
    """
    cp_line, offset = max(cp for cp in index.checkpoints if cp[0] <= start)
    with open_binary(index.path) as f:
        f.seek(offset)
        line, buf, dropping = cp_line, b"", False
        while line < stop:
            chunk = _read(f, block_size, index.path, line)
            if not chunk and not buf:
                raise OSError(f"{index.path}: ended at line {line}, its index says {stop} lines")
            if dropping:  # the rest of an over-long line
                nl = chunk.find(b"\n")
                dropping = nl < 0 and bool(chunk)
                buf = chunk[nl + 1 :] if nl >= 0 else b""
                continue
            buf += chunk
            if line < start:  # skip to the first line of the share
                cut = _nth_newline_end(buf, start - line)
                line, buf = line + buf.count(b"\n", 0, cut), buf[cut:]
                continue
            nl = buf.find(b"\n")
            if nl > block_size or (nl < 0 and len(buf) > block_size):
                yield line, None
                line, buf, dropping = line + 1, buf[nl + 1 :] if nl >= 0 else b"", nl < 0
                continue
            cut = buf.rfind(b"\n") + 1 if chunk else len(buf)
            if cut == 0:
                continue  # the line goes on in the next chunk
            n = buf.count(b"\n", 0, cut) + (buf[cut - 1 : cut] != b"\n")
            if line + n > stop:
                cut, n = _nth_newline_end(buf, stop - line), stop - line
            yield line, buf[:cut]
            line, buf = line + n, buf[cut:]


def _line_bounds(arr: np.ndarray) -> np.ndarray:
    """Byte offsets where each line of a block starts, and the block's end."""
    bounds = np.concatenate([[0], np.flatnonzero(arr == 10) + 1])
    return bounds if bounds[-1] == len(arr) else np.append(bounds, len(arr))


def _lone_cr_lines(arr: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Lines holding a carriage return not followed by ``\\n`` (pyarrow ends a row there)."""
    cr = np.flatnonzero(arr == 13)
    lone = cr[(cr + 1 < len(arr)) & (arr[np.minimum(cr + 1, len(arr) - 1)] != 10)]
    return np.unique(np.searchsorted(bounds, lone, side="right") - 1)


_SCHEMA = pa.schema([(name, pa.binary()) for name in COLUMN_NAMES])


def _split_fields(block: bytes, use_threads: bool) -> pa.Table:
    """pyarrow's split of lines of exactly 40 fields into byte-string columns (no decoding,
    so any byte reaches the column rules)."""
    if not block:
        return _SCHEMA.empty_table()
    return pa_csv.read_csv(
        pa.py_buffer(block),
        read_options=pa_csv.ReadOptions(column_names=COLUMN_NAMES, use_threads=use_threads),
        parse_options=pa_csv.ParseOptions(
            delimiter="\t", quote_char=False, ignore_empty_lines=False
        ),
        convert_options=pa_csv.ConvertOptions(
            column_types=dict(zip(_SCHEMA.names, _SCHEMA.types, strict=True)),
            strings_can_be_null=False,
        ),
    )


def parse_block(
    block: bytes, first_line: int, path: str, on_bad_row: OnBadRow, use_threads: bool = True
) -> ParsedRows:
    """Parses whole lines; bad rows raise (naming file and line) or are dropped and counted.

    Lines pyarrow would misread (a lone carriage return ends a row there) or reject (a field
    count other than 40) are set aside first, so it sees one row per remaining line. Field
    counts are only counted per line when pyarrow finds a wrong one.
    """
    arr = np.frombuffer(block, dtype=np.uint8)
    bounds = _line_bounds(arr)
    num_lines = len(bounds) - 1
    set_aside = np.zeros(num_lines, dtype=bool)
    if b"\r" in block:
        set_aside[_lone_cr_lines(arr, bounds)] = True
    table = None
    if not set_aside.any():
        with contextlib.suppress(pa.ArrowInvalid):  # "expected 40 columns, got ..."
            table = _split_fields(block, use_threads)
    if table is None:
        tabs = np.add.reduceat(arr == 9, bounds[:-1], dtype=np.int64)
        set_aside |= tabs != NUM_COLUMNS - 1
        table = _split_fields(arr[np.repeat(~set_aside, np.diff(bounds))].tobytes(), use_threads)
    table = table.combine_chunks()  # one rule call per column
    rows = np.flatnonzero(~set_aside)
    if table.num_rows != len(rows):  # pyarrow ends rows only at the line ends left: never
        raise CriteoFormatError(
            f"{path}: lines {first_line + 1}-{first_line + num_lines}: pyarrow saw "
            f"{table.num_rows} rows in {len(rows)} lines"
        )
    values, bad = _apply_rules(table)
    bad_lines = np.sort(np.concatenate([np.flatnonzero(set_aside), rows[bad]]))
    if len(bad_lines) and on_bad_row == "raise":
        line = int(bad_lines[0])
        text = arr[bounds[line] : bounds[line + 1]].tobytes().removesuffix(b"\n")
        raise CriteoFormatError(
            f"{path}: line {first_line + line + 1}: {explain_line(text)} {_SKIP_HINT}"
        )
    keep = ~bad
    return ParsedRows(
        dense=dense_transform(values[keep, 1 : 1 + INT_FEATURE_COUNT]),
        raw_ids=values[keep, 1 + INT_FEATURE_COUNT :],
        labels=values[keep, 0].astype(np.float32),
        lines=rows[keep] + first_line,
        end_line=first_line + num_lines,
        bad_rows=len(bad_lines),
    )


def iter_rows(
    index: FileIndex,
    start: int,
    stop: int,
    on_bad_row: OnBadRow,
    block_size: int = DEFAULT_BLOCK_SIZE,
    use_threads: bool = True,
) -> Iterator[ParsedRows]:
    """Parsed rows of lines ``[start, stop)`` of one file, one block at a time."""
    for first, block in iter_line_blocks(index, start, stop, block_size):
        if block is None:
            if on_bad_row == "raise":
                raise CriteoFormatError(
                    f"{index.path}: line {first + 1}: longer than block_size ({block_size} "
                    f"bytes; CR-only line endings, or not a text file?) {_SKIP_HINT}"
                )
            yield ParsedRows.empty(first + 1, 1)
            continue
        yield parse_block(block, first, index.path, on_bad_row, use_threads)


def expand_paths(paths: str | list[str], field: str) -> list[str]:
    """Files and glob patterns, in natural order (``day_2`` before ``day_10``)."""
    items = [paths] if isinstance(paths, str) else list(paths)
    if not items:
        raise ValueError(f"{field}: no files given")
    out: list[str] = []
    for item in items:
        if glob.has_magic(item):
            matches = glob.glob(os.path.expanduser(item))
            if not matches:
                raise FileNotFoundError(f"{field}: pattern {item!r} matches no file")
            out += sorted(matches, key=natural_key)
        else:
            out.append(item)
    for path in out:
        if not path_manager.exists(path):
            raise FileNotFoundError(f"{field}: {path}: no such file")
    return out


def natural_key(path: str) -> list[str | int]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


# ---------------------------------------------------------------------------- shuffling
class _RowPool:
    """Rows held by the shuffle buffer, in arrays that grow by doubling; a draw takes rows at
    random and fills their slots with the last rows, so it costs the rows drawn, not the pool."""

    def __init__(self) -> None:
        self.size = 0
        self.arrays: list[np.ndarray] = []

    def add(self, rows: ParsedRows) -> None:
        parts = [rows.dense, rows.raw_ids, rows.labels, rows.lines]
        n = len(rows.labels)
        if not self.arrays or self.size + n > len(self.arrays[0]):
            grown = 2 * (self.size + n)
            old = self.arrays or [p[:0] for p in parts]
            self.arrays = [np.empty((grown, *p.shape[1:]), p.dtype) for p in parts]
            for a, kept in zip(self.arrays, old, strict=True):
                a[: self.size] = kept[: self.size]
        for a, p in zip(self.arrays, parts, strict=True):
            a[self.size : self.size + n] = p
        self.size += n

    def draw(self, n: int, rng: np.random.Generator, end_line: int) -> ParsedRows:
        picked = rng.choice(self.size, size=n, replace=False)
        dense, raw_ids, labels, lines = (a[picked] for a in self.arrays)
        tail = self.size - n
        movers = np.ones(n, dtype=bool)
        movers[picked[picked >= tail] - tail] = False
        holes = picked[picked < tail]
        for a in self.arrays:
            a[holes] = a[tail + np.flatnonzero(movers)]
        self.size = tail
        return ParsedRows(dense, raw_ids, labels, lines, end_line=end_line, bad_rows=0)


def shuffle_rows(
    batches: Iterator[ParsedRows], buffer_rows: int, rng: np.random.Generator
) -> Iterator[ParsedRows]:
    """The same number of batches of the same sizes, their rows drawn at random from a
    buffer of about ``buffer_rows`` upcoming rows (as ``tf.data``'s shuffle buffer): memory is
    bounded, and the output depends only on the input and ``rng``'s seed, so a replay of the
    pass with the same seed yields the same batches (how a resumed run finds its place)."""
    pool, sizes = _RowPool(), deque[int]()
    end_line = 0
    for rows in batches:
        pool.add(rows)
        sizes.append(len(rows.labels))
        end_line = rows.end_line
        while pool.size > buffer_rows:
            yield pool.draw(sizes.popleft(), rng, end_line)
    while sizes:
        yield pool.draw(sizes.popleft(), rng, end_line)


# ---------------------------------------------------------------------------- the data set
@dataclass(frozen=True)
class _Span:
    """Lines ``[start, stop)`` of one file."""

    index: FileIndex
    start: int
    stop: int


class CriteoTSV(RecDataset):
    """Criteo TSV files as a streaming data set (13 dense, 26 sparse features).

    Args:
        paths: training files (local paths or iopath URIs) or local glob patterns, read in
            natural order (``day_2`` before ``day_10``).
        num_embeddings: table size per sparse feature (one int, or 26 ints).
        eval_paths: files for evaluation; if omitted, the last ``eval_fraction`` of the lines
            of ``paths`` is evaluation (Criteo logs are time-ordered, so eval is the latest).
        eval_fraction: see ``eval_paths`` (default 0.1 when ``eval_paths`` is not given).
        on_bad_row: ``raise`` (default) or ``skip`` (skip and count; see :attr:`stats`).
        block_size: bytes read and parsed at a time (bounds memory; longer lines are bad).
        use_threads: let pyarrow parse a block on several threads.
        index_cache_dir: where the line index of local files is kept; ``None`` keeps it only
            in memory.
        shuffle_buffer: rows of the training stream held back and drawn from at random
            (:func:`shuffle_rows`); 0, the default, keeps the files' (time) order. Evaluation
            is never shuffled.
        seed: seeds the shuffle, with the epoch and the rank.

    ``stats[split]`` counts, over all passes and ranks of this object: ``bad_rows`` skipped,
    ``batches`` yielded, ``unread_tail_rows`` (the last partial global batch of a training
    pass) and ``empty_files`` skipped.
    """

    name = "criteo_tsv"

    def __init__(
        self,
        paths: str | list[str],
        num_embeddings: int | list[int] = DEFAULT_NUM_EMBEDDINGS,
        eval_paths: str | list[str] | None = None,
        eval_fraction: float | None = None,
        on_bad_row: OnBadRow = "raise",
        block_size: int = DEFAULT_BLOCK_SIZE,
        use_threads: bool = True,
        index_cache_dir: str | None = DEFAULT_INDEX_CACHE,
        shuffle_buffer: int = 0,
        seed: int = 0,
    ) -> None:
        if on_bad_row not in ("raise", "skip"):
            raise ValueError(
                f"data.options.on_bad_row must be 'raise' or 'skip', got {on_bad_row!r}"
            )
        if block_size < 1024:
            raise ValueError(f"data.options.block_size must be >= 1024 bytes, got {block_size}")
        if shuffle_buffer < 0:
            raise ValueError(f"data.options.shuffle_buffer must be >= 0, got {shuffle_buffer}")
        if eval_paths is not None and eval_fraction is not None:
            raise ValueError("data.options: give eval_paths or eval_fraction, not both")
        fraction = 0.1 if eval_fraction is None else eval_fraction
        if eval_paths is None and not 0.0 < fraction < 1.0:
            raise ValueError(f"data.options.eval_fraction must be in (0, 1), got {fraction}")
        self.spec = criteo_spec(num_embeddings)
        self.on_bad_row: OnBadRow = on_bad_row
        self.block_size = block_size
        self.use_threads = use_threads
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self._sizes = np.asarray(self.spec.num_embeddings, dtype=np.int64)

        self.stats: dict[str, Counter[str]] = {"train": Counter(), "eval": Counter()}

        def indexed(files: str | list[str], field: str, split: str) -> list[FileIndex]:
            out = [cached_index(p, block_size, index_cache_dir) for p in expand_paths(files, field)]
            for ix in out:
                if ix.num_lines == 0:
                    if on_bad_row == "raise":
                        raise CriteoFormatError(f"{ix.path}: line 1: the file is empty")
                    logger.warning("%s: the file is empty; skipped (on_bad_row='skip')", ix.path)
                    self.stats[split]["empty_files"] += 1
            return out

        train = indexed(paths, "data.options.paths", "train")
        if eval_paths is not None:
            evals = indexed(eval_paths, "data.options.eval_paths", "eval")
            self._splits = {"train": _spans(train), "eval": _spans(evals)}
        else:
            total = sum(ix.num_lines for ix in train)
            cut = total - round(total * fraction)
            self._splits = {"train": _spans(train, 0, cut), "eval": _spans(train, cut, total)}

    @property
    def bad_rows(self) -> int:
        """Rows skipped so far (``on_bad_row='skip'``), over all passes and ranks."""
        return sum(s["bad_rows"] for s in self.stats.values())

    def num_rows(self, split: str) -> int:
        """Lines of ``split`` (bad ones included)."""
        return sum(s.stop - s.start for s in self._splits[split])

    def batches(
        self, split: str, batch_size: int, rank: int, world_size: int, epoch: int = 0
    ) -> Iterator[Batch]:
        plan = plan_steps(self.num_rows(split), batch_size, rank, world_size, split == "eval")
        sizes = plan.sizes(rank)
        tally: Counter[str] = Counter()
        stream = self._windows(split, plan.share_start(rank), sizes, tally)
        if split == "train" and self.shuffle_buffer:
            rng = np.random.default_rng([self.seed, epoch, rank])
            stream = shuffle_rows(stream, self.shuffle_buffer, rng)
        for rows in stream:
            yield self._to_batch(rows)
        self.stats[split].update(batches=len(sizes), unread_tail_rows=plan.unread, **tally)
        report_pass(self.name, split, rank, len(sizes), tally["bad_rows"], plan.unread)

    def _windows(
        self, split: str, first: int, sizes: np.ndarray, tally: Counter[str]
    ) -> Iterator[ParsedRows]:
        """Good rows of each batch window (split lines ``first + cumsum(sizes)`` bound them),
        bad rows counted in ``tally``; a window with no good row is an error."""
        ends = first + np.cumsum(sizes)
        last = int(ends[-1]) if len(ends) else first
        pending: list[ParsedRows] = []
        done, base = 0, 0
        for span in self._splits[split]:
            lo, hi = max(first - base, 0), min(last - base, span.stop - span.start)
            offset = base - span.start  # file line -> split line
            base += span.stop - span.start
            if lo >= hi:
                continue
            for rows in iter_rows(
                span.index,
                span.start + lo,
                span.start + hi,
                self.on_bad_row,
                self.block_size,
                self.use_threads,
            ):
                rows.lines += offset
                rows.end_line += offset
                tally["bad_rows"] += rows.bad_rows
                pending.append(rows)
                complete = int(np.searchsorted(ends, rows.end_line, side="right"))
                if complete == done:
                    continue
                merged = ParsedRows.concat(pending)
                cuts = np.searchsorted(merged.lines, ends[done:complete])
                begin = 0
                for k, cut in enumerate(cuts.tolist(), start=done):
                    if cut == begin:
                        raise CriteoFormatError(self._all_bad(split, int(ends[k] - sizes[k]), k))
                    yield merged.take(slice(begin, cut))
                    begin = cut
                pending = [merged.take(slice(begin, None))]
                done = complete

    def _all_bad(self, split: str, line: int, batch: int) -> str:
        """The error for a batch window whose lines are all bad (a step needs a row)."""
        base = 0
        for span in self._splits[split]:
            if line < base + span.stop - span.start:
                where = f"{span.index.path}: line {span.start + line - base + 1}"
                break
            base += span.stop - span.start
        return (
            f"{where}: this line and the rest of the {split} batch {batch} it starts are all "
            "bad, so the batch would be empty (every rank takes the same steps, each needs a "
            "row); fix the file, or use a larger batch size"
        )

    def _to_batch(self, rows: ParsedRows) -> Batch:
        ids = hash_ids(rows.raw_ids, self._sizes)
        return make_batch(rows.dense, rows.labels, self.spec.sparse_names, ids)


def _spans(files: list[FileIndex], start: int = 0, stop: int | None = None) -> list[_Span]:
    """Lines ``[start, stop)`` of the concatenation of ``files``, as per-file spans."""
    spans, base = [], 0
    end = sum(ix.num_lines for ix in files) if stop is None else stop
    for ix in files:
        lo, hi = max(start - base, 0), min(end - base, ix.num_lines)
        if lo < hi:
            spans.append(_Span(ix, lo, hi))
        base += ix.num_lines
    return spans


def criteo_spec(num_embeddings: int | list[int]) -> DataSpec:
    """Criteo's schema (TorchRec's feature names) with validated table sizes."""
    sizes = (
        num_embeddings if isinstance(num_embeddings, list) else [num_embeddings] * CAT_FEATURE_COUNT
    )
    if len(sizes) != CAT_FEATURE_COUNT or any(
        not isinstance(n, int) or not 0 < n < 2**31 for n in sizes
    ):
        raise ValueError(
            f"data.options.num_embeddings: need one int or {CAT_FEATURE_COUNT} ints in [1, 2**31)"
        )
    return DataSpec(list(DEFAULT_INT_NAMES), list(DEFAULT_CAT_NAMES), list(sizes))


@register_dataset("criteo_tsv")
def _criteo_tsv(**options: Any) -> CriteoTSV:
    return CriteoTSV(**options)
