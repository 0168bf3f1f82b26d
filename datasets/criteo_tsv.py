"""Criteo click logs read straight from their TSV files (Kaggle ``train.txt``, Terabyte
``day_0 .. day_23``, plain or ``.gz``), streamed in blocks and parsed column-wise by pyarrow.

Row format: ``label <TAB> 13 integers <TAB> 26 hex ids``; empty fields are allowed except the
label. Dense values become ``log(1 + max(x, 0))``; an id becomes ``int(hex, 16) %
num_embeddings[f]`` (an empty id is 0, as in TorchRec's ``BinaryCriteoUtils.tsv_to_npys``).

Sharding: the files of a split form one sequence of lines. Every file is indexed once (line
count, and byte offsets of a line start every ``block_size`` bytes) so that rank ``r`` seeks
straight to its contiguous share of ``N // (B * W) * B`` lines (``.gz`` files are decompressed
and discarded up to it). The index is cached in memory and, for local files, in
``index_cache_dir`` keyed by path, size and modification time. Batch ``k`` of a rank is made
of lines ``[k * B, (k + 1) * B)`` of its share: with ``on_bad_row="skip"`` a batch that held
bad rows is shorter, but every rank still yields the same number of batches.

Bad input (wrong field count, non-integer dense value, non-hex id, label not 0/1, an empty
or truncated line, an empty file) raises :class:`CriteoFormatError` naming the file and the
1-based line; a missing or unreadable file raises ``OSError`` naming it.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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
from shadowsync.datasets.batching import batches_per_rank, logger, make_batch, report_pass

NUM_COLUMNS = 1 + INT_FEATURE_COUNT + CAT_FEATURE_COUNT
COLUMN_NAMES = [DEFAULT_LABEL_NAME, *DEFAULT_INT_NAMES, *DEFAULT_CAT_NAMES]
DEFAULT_BLOCK_SIZE = 16 << 20
DEFAULT_NUM_EMBEDDINGS = 100_000
DEFAULT_INDEX_CACHE = "~/.cache/shadowsync/criteo_tsv"
_INDEX_VERSION = 1
_DENSE_RE = r"^-?[0-9]{1,18}$"
_HEX_RE = re.compile(r"[0-9a-fA-F]{0,8}")

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
    def concat(parts: list[ParsedRows]) -> ParsedRows:
        return ParsedRows(
            dense=np.concatenate([p.dense for p in parts]),
            raw_ids=np.concatenate([p.raw_ids for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            lines=np.concatenate([p.lines for p in parts]),
            end_line=parts[-1].end_line,
            bad_rows=sum(p.bad_rows for p in parts),
        )

    def take(self, rows: slice) -> ParsedRows:
        """Some of the rows; ``end_line`` stays, so a remainder still knows what it covers."""
        return ParsedRows(
            self.dense[rows],
            self.raw_ids[rows],
            self.labels[rows],
            self.lines[rows],
            self.end_line,
            0,
        )


def open_binary(path: str) -> IO[bytes]:
    """Opens a local or remote (iopath) file for reading, decompressing ``.gz``."""
    try:
        f = path_manager.open(path, "rb")
    except OSError as e:
        raise OSError(f"{path}: cannot open for reading: {e}") from e
    return gzip.GzipFile(fileobj=f) if path.endswith(".gz") else f  # type: ignore[return-value]


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


def _cached_index(path: str, block_size: int, cache_dir: str | None) -> FileIndex:
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
) -> Iterator[tuple[int, bytes]]:
    """``(first line, bytes)`` of runs of whole lines ``[start, stop)`` of one file."""
    cp_line, offset = max(cp for cp in index.checkpoints if cp[0] <= start)
    with open_binary(index.path) as f:
        f.seek(offset)
        line, buf = cp_line, b""
        while line < stop:
            chunk = _read(f, block_size, index.path, line)
            if not chunk and not buf:
                raise OSError(f"{index.path}: ended at line {line}, its index says {stop} lines")
            buf += chunk
            if line < start:  # skip to the first line of the share
                cut = _nth_newline_end(buf, start - line)
                line, buf = line + buf.count(b"\n", 0, cut), buf[cut:]
                continue
            cut = buf.rfind(b"\n") + 1 if chunk else len(buf)
            if cut == 0:
                continue  # a line longer than the block: read on
            n = buf.count(b"\n", 0, cut) + (buf[cut - 1 : cut] != b"\n")
            if line + n > stop:
                cut, n = _nth_newline_end(buf, stop - line), stop - line
            yield line, buf[:cut]
            line, buf = line + n, buf[cut:]


def _hex8_values(chars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[m, 8]`` ASCII hex digits to uint32 values (as int64), and a per-row bad mask.

    SWAR, no per-byte lookup: the 8 bytes of a value are one big-endian uint64; a digit's
    nibble is ``(c & 0xF) + 9 * (c >> 6 & 1)``, then the nibbles fold pairwise in 3 steps.
    """
    lower = chars | np.uint8(0x20)  # digits keep their code, letters become lower case
    ok = ((lower - np.uint8(48)) < 10) | ((lower - np.uint8(97)) < 6)
    bad = ~ok.all(axis=1) if not ok.all() else np.zeros(len(chars), dtype=bool)
    x = np.ascontiguousarray(chars).view(">u8").reshape(-1).astype(np.uint64)
    x = (x & np.uint64(0x0F0F0F0F0F0F0F0F)) + (
        x >> np.uint64(6) & np.uint64(0x0101010101010101)
    ) * np.uint64(9)
    x = ((x >> np.uint64(4)) | x) & np.uint64(0x00FF00FF00FF00FF)
    x = ((x >> np.uint64(8)) | x) & np.uint64(0x0000FFFF0000FFFF)
    x = ((x >> np.uint64(16)) | x) & np.uint64(0xFFFFFFFF)
    return x.astype(np.int64), bad


def _decode_hex(ids: pa.StringArray) -> tuple[np.ndarray, np.ndarray]:
    """Hex strings of at most 8 digits to uint32 values (as int64), and a bad-value mask.

    Criteo's ids are all 8 digits or empty: then the bytes of the non-empty values lie back
    to back and are decoded in place. Otherwise each value is first right-aligned into 8
    characters padded with ``0`` (an empty value is 0).
    """
    n = len(ids)
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * ids.offset)
    lengths = np.diff(offsets)
    values, bad = np.zeros(n, dtype=np.int64), lengths > 8
    if n == 0 or offsets[-1] == offsets[0]:
        return values, bad
    data = np.frombuffer(ids.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    full = lengths == 8
    if (full | (lengths == 0)).all():
        rows: np.ndarray | slice = full
        chars = data.reshape(-1, 8)
    else:
        rows = slice(None)
        cols = np.arange(8)
        present = cols >= 8 - lengths[:, None]
        where = offsets[:-1, None] - offsets[0] + lengths[:, None] - 8 + cols
        chars = np.full((n, 8), ord("0"), dtype=np.uint8)
        chars[present] = data[where[present]]
    values[rows], row_bad = _hex8_values(chars)
    bad[rows] |= row_bad
    return values, bad


def _decode_ids(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The 26 id columns as raw values ``[n, 26]`` and a per-row bad mask, chunk by chunk."""
    raw = np.empty((CAT_FEATURE_COUNT, table.num_rows), dtype=np.int64)
    bad = np.zeros(table.num_rows, dtype=bool)
    for j, name in enumerate(DEFAULT_CAT_NAMES):
        pos = 0
        for chunk in table.column(name).chunks:
            values, chunk_bad = _decode_hex(chunk)
            raw[j, pos : pos + len(chunk)] = values
            bad[pos : pos + len(chunk)] |= chunk_bad
            pos += len(chunk)
    return raw.T, bad


def explain_line(text: str) -> str:
    """Why one line is not a Criteo row (the slow path, only for error messages)."""
    fields = text.rstrip("\r").split("\t")
    if len(fields) != NUM_COLUMNS:
        return f"expected {NUM_COLUMNS} tab-separated fields, got {len(fields)}"
    if fields[0] not in ("0", "1"):
        return f"label must be 0 or 1, got {fields[0]!r}"
    for name, value in zip(DEFAULT_INT_NAMES, fields[1 : 1 + INT_FEATURE_COUNT], strict=True):
        if value and not re.fullmatch(_DENSE_RE, value):
            return f"{name} must be an integer, got {value!r}"
    for name, value in zip(DEFAULT_CAT_NAMES, fields[1 + INT_FEATURE_COUNT :], strict=True):
        if not _HEX_RE.fullmatch(value):
            return f"{name} must be a hex id of at most 8 digits, got {value!r}"
    return "malformed row"


def _parse_table(block: bytes, typed: bool, use_threads: bool) -> tuple[pa.Table, list[int]]:
    """pyarrow parse of whole lines; returns the table and the 0-based lines it rejected."""
    rejected: list[int | None] = []

    def on_invalid(row: pa_csv.InvalidRow) -> str:
        rejected.append(None if row.number is None else row.number - 1)
        return "skip"

    types = {c: pa.string() for c in DEFAULT_CAT_NAMES}
    for c in COLUMN_NAMES[: 1 + INT_FEATURE_COUNT]:
        types[c] = pa.int64() if typed else pa.string()
    table = pa_csv.read_csv(
        pa.py_buffer(block),
        read_options=pa_csv.ReadOptions(column_names=COLUMN_NAMES, use_threads=use_threads),
        parse_options=pa_csv.ParseOptions(
            delimiter="\t",
            quote_char=False,
            ignore_empty_lines=False,
            invalid_row_handler=on_invalid,
        ),
        convert_options=pa_csv.ConvertOptions(column_types=types, strings_can_be_null=False),
    )
    if None in rejected:  # threaded parsing does not number rows: parse serially to locate
        return _parse_table(block, typed, use_threads=False)
    return table, [r for r in rejected if r is not None]


def _int_columns(table: pa.Table, typed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Label and dense columns as ``[n, 14]`` int64 (empty is 0, label -1), and a bad mask."""
    n = table.num_rows
    values = np.empty((n, 1 + INT_FEATURE_COUNT), dtype=np.int64)
    bad = np.zeros(n, dtype=bool)
    for j, name in enumerate(COLUMN_NAMES[: 1 + INT_FEATURE_COUNT]):
        col = table.column(name)
        if not typed:
            is_int = pc.match_substring_regex(col, _DENSE_RE)
            ok = pc.or_(is_int, pc.equal(col, "")) if j else is_int
            bad |= ~ok.to_numpy()
            col = pc.cast(pc.if_else(is_int, col, pa.scalar(None, pa.string())), pa.int64())
        values[:, j] = pc.fill_null(col, -1 if j == 0 else 0).to_numpy()
    bad |= (values[:, 0] != 0) & (values[:, 0] != 1)
    return values, bad


def parse_block(
    block: bytes, first_line: int, path: str, on_bad_row: OnBadRow, use_threads: bool = True
) -> ParsedRows:
    """Parses whole lines; bad rows raise (naming file and line) or are dropped and counted."""
    num_lines = block.count(b"\n") + (not block.endswith(b"\n"))
    try:
        typed = True
        table, rejected = _parse_table(block, typed, use_threads)
    except pa.ArrowInvalid:  # a value pyarrow cannot convert: validate the strings ourselves
        typed = False
        table, rejected = _parse_table(block, typed, use_threads)
    if table.num_rows + len(rejected) != num_lines:  # pyarrow also ends lines at a lone CR
        raise CriteoFormatError(
            f"{path}: lines {first_line + 1}-{first_line + num_lines}: pyarrow saw "
            f"{table.num_rows + len(rejected)} rows in {num_lines} lines (a stray carriage return?)"
        )
    lines = np.delete(np.arange(num_lines, dtype=np.int64), rejected)
    ints, bad = _int_columns(table, typed)
    raw_ids, bad_ids = _decode_ids(table)
    bad |= bad_ids
    bad_lines = np.sort(np.concatenate([np.asarray(rejected, np.int64), lines[bad]]))
    if len(bad_lines) and on_bad_row == "raise":
        line = int(bad_lines[0])
        start = _nth_newline_end(block, line)
        text = block[start : _nth_newline_end(block, line + 1)].rstrip(b"\n")
        reason = "empty line" if not text.strip() else explain_line(text.decode(errors="replace"))
        raise CriteoFormatError(
            f"{path}: line {first_line + line + 1}: {reason} "
            "(on_bad_row='skip', or --on-bad-row skip, skips and counts such rows)"
        )
    keep = ~bad
    return ParsedRows(
        dense=dense_transform(ints[keep, 1:]),
        raw_ids=raw_ids[keep],
        labels=ints[keep, 0].astype(np.float32),
        lines=lines[keep] + first_line,
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
        block_size: bytes read and parsed at a time (bounds memory).
        use_threads: let pyarrow parse a block on several threads.
        index_cache_dir: where the line index of local files is kept; ``None`` keeps it only
            in memory.

    ``stats[split]`` counts, over all passes and ranks of this object: ``bad_rows`` skipped,
    ``batches`` yielded, ``unread_tail_rows`` (the last partial global batch, per pass) and
    ``empty_files`` skipped.
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
    ) -> None:
        if on_bad_row not in ("raise", "skip"):
            raise ValueError(
                f"data.options.on_bad_row must be 'raise' or 'skip', got {on_bad_row!r}"
            )
        if block_size < 1024:
            raise ValueError(f"data.options.block_size must be >= 1024 bytes, got {block_size}")
        if eval_paths is not None and eval_fraction is not None:
            raise ValueError("data.options: give eval_paths or eval_fraction, not both")
        fraction = 0.1 if eval_fraction is None else eval_fraction
        if eval_paths is None and not 0.0 < fraction < 1.0:
            raise ValueError(f"data.options.eval_fraction must be in (0, 1), got {fraction}")
        self.spec = criteo_spec(num_embeddings)
        self.on_bad_row: OnBadRow = on_bad_row
        self.block_size = block_size
        self.use_threads = use_threads
        self._sizes = np.asarray(self.spec.num_embeddings, dtype=np.int64)

        self.stats: dict[str, Counter[str]] = {"train": Counter(), "eval": Counter()}

        def indexed(files: str | list[str], field: str, split: str) -> list[FileIndex]:
            out = [
                _cached_index(p, block_size, index_cache_dir) for p in expand_paths(files, field)
            ]
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
        # Streaming: every epoch reads the files in the same order.
        per_rank, unread = batches_per_rank(self.num_rows(split), batch_size, rank, world_size)
        first = rank * per_rank * batch_size  # the rank's share: lines [first, last) of the split
        last = first + per_rank * batch_size
        pending: list[ParsedRows] = []
        done, bad, base = 0, 0, 0
        for span in self._splits[split]:
            lo, hi = max(first - base, 0), min(last - base, span.stop - span.start)
            offset = base - first - span.start  # file line -> line of the rank's share
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
                bad += rows.bad_rows
                pending.append(rows)
                complete = rows.end_line // batch_size
                if complete > done:
                    merged = ParsedRows.concat(pending)
                    cuts = np.searchsorted(
                        merged.lines, np.arange(done + 1, complete + 1) * batch_size
                    )
                    begin = 0
                    for cut in cuts:
                        yield self._to_batch(merged.take(slice(begin, cut)))
                        begin = int(cut)
                    pending = [merged.take(slice(begin, None))]
                    done = complete
        self.stats[split].update(bad_rows=bad, batches=done, unread_tail_rows=unread)
        report_pass(self.name, split, rank, done, bad, unread)

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
def _criteo_tsv(**options: object) -> CriteoTSV:
    return CriteoTSV(**options)  # type: ignore[arg-type]
