"""What the benchmark scripts write, in one form: Markdown tables, number cells, JSON files and
the command line that reproduces a run.

Pure Python (no torch), so report-only paths and tests import it cheaply. Every helper returns
exactly the text the scripts wrote by hand before, so reports rebuilt from committed runs read
the same.
"""

from __future__ import annotations

import json
import math
import shlex
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_RULES = {"l": "---", "r": "---:"}


def table_row(cells: Iterable[object]) -> str:
    """One Markdown table line: ``| a | b |``."""
    return "| " + " | ".join(map(str, cells)) + " |"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]],
                   align: str | None = None) -> str:
    """A Markdown table: the header line, the alignment line, one line per row, joined by
    newlines (none at the end). ``align`` has one letter a column, ``l`` (``---``) or ``r``
    (``---:``); without it every column is left-aligned. Cells are written with ``str``."""
    align = align if align is not None else "l" * len(header)
    if len(align) != len(header) or set(align) - set(_RULES):
        raise ValueError(f"align {align!r}: one of l, r per column of {list(header)}")
    rule = "|" + "".join(_RULES[a] + "|" for a in align)
    return "\n".join([table_row(header), rule, *(table_row(row) for row in rows)])


def or_dash(x: float, spec: str) -> str:
    """``x`` formatted with ``spec`` (``format(x, spec)``), or ``-`` if it is NaN."""
    return "-" if math.isnan(x) else format(x, spec)


def spread(median: float, low: float, high: float, digits: int = 3) -> str:
    """``median [low, high]`` with ``digits`` decimals each."""
    return f"{median:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def median_spread(values: Sequence[float], digits: int = 3) -> str:
    """The median of ``values`` and their range, as :func:`spread` writes them."""
    return spread(statistics.median(values), min(values), max(values), digits)


def write_json(path: Path, value: Any, *, newline: bool = False) -> None:
    """``value`` as JSON with an indent of 1 into ``path``; ``newline`` ends the file with one
    (run records keep the form their committed files have: ``runs.json`` and ``--json`` files
    without, summaries such as ``calibration.json`` with)."""
    path.write_text(json.dumps(value, indent=1) + ("\n" if newline else ""))


def command_line(module: str, argv: Sequence[str] | None = None, launcher: str = "python"
                 ) -> str:
    """How to run this benchmark again: ``<launcher> -m <module> <argv>``, ``argv`` being this
    process's arguments unless given (``sys.argv[0]`` under ``-m`` is a file path, which says
    neither how it was started nor where)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return f"{launcher} -m {module}" + (f" {shlex.join(args)}" if args else "")
