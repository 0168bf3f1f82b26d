"""Row arithmetic shared by the benchmark scripts: the turn order of interleaved arms, the
baseline each run or turn is compared with, and means over runs.

Pure Python with no torch, so that ``frontier.py --report-only`` and other report builders
regenerate from committed JSON without loading the training stack.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any


def turn_order(arms: list[str], cycle: int, bracket: str | None = None) -> list[str]:
    """The turns of cycle ``cycle``: ``arms`` rotated by ``cycle``, and with a ``bracket`` arm,
    that one before each of the others."""
    names = [n for n in arms if n != bracket]
    shift = cycle % len(names)
    rotated = names[shift:] + names[:shift]
    if bracket is None:
        return rotated
    return [turn for name in rotated for turn in (bracket, name)]


def bracket_seconds(arms: list[str], seconds: list[float], bracket: str) -> list[float]:
    """For each turn in the order run, the mean of the seconds of the nearest ``bracket``
    turns before and after it (a ``bracket`` turn's own seconds; NaN without one on each
    side)."""
    at = [i for i, arm in enumerate(arms) if arm == bracket]
    out = []
    for i, arm in enumerate(arms):
        before = [j for j in at if j < i]
        after = [j for j in at if j > i]
        if arm == bracket:
            out.append(seconds[i])
        elif before and after:
            out.append((seconds[before[-1]] + seconds[after[0]]) / 2)
        else:
            out.append(math.nan)
    return out


def _values(runs: list[dict[str, Any]], key: str) -> list[float]:
    """``key`` of the runs that have it, NaN left out (a turn has no eval of its own)."""
    return [r[key] for r in runs if key in r and not math.isnan(r[key])]


def mean_of(runs: list[dict[str, Any]], key: str) -> float:
    """The mean of ``key`` over ``runs`` (:func:`_values`; NaN with none)."""
    values = _values(runs, key)
    return statistics.fmean(values) if values else math.nan


def stdev_of(runs: list[dict[str, Any]], key: str) -> float:
    """The sample standard deviation of ``key`` over ``runs`` (:func:`_values`; NaN under
    two)."""
    values = _values(runs, key)
    return statistics.stdev(values) if len(values) > 1 else math.nan


def first_per_seed(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each seed's first run of its first repeat: one evaluation per seed (bracketed turns
    give ``none`` several turns a cycle)."""
    first: dict[int, dict[str, Any]] = {}
    for r in runs:
        if r["repeat"] == 0:
            first.setdefault(r["seed"], r)
    return list(first.values())


def baseline(row: Mapping[str, Any], nones: Mapping[tuple[int, int], float]) -> float:
    """The examples/s ``row`` is compared with: the ``none`` turns beside it where it was
    bracketed (``--bracket``), else ``none``'s run of the same seed and repeat (``nones``;
    NaN without one)."""
    if "baseline_examples_per_s" in row:
        return float(row["baseline_examples_per_s"])
    return nones.get((row["seed"], row["repeat"]), math.nan)


# The kinds of step a traced turn is split into (footprint): the steps synchronization
# touched, by their place in a run of such steps, and the steps it did not, by how far they
# follow the last one.
STEP_KINDS = ("busy 1", "busy 2", "busy 3+", "quiet 1", "quiet 2", "quiet 3+", "before any")


def step_kinds(busy: list[bool]) -> list[str]:
    """Each step's kind (:data:`STEP_KINDS`): ``busy k``, the k-th of a run of steps
    synchronization touched; ``quiet k``, k steps after the last of them; ``before any``,
    untouched before the turn's first."""
    kinds, run, since = [], 0, None
    for b in busy:
        if b:
            run, since = run + 1, 0
            kinds.append(f"busy {run}" if run < 3 else "busy 3+")
        else:
            run = 0
            since = None if since is None else since + 1
            kinds.append("before any" if since is None else
                         f"quiet {since}" if since < 3 else "quiet 3+")
    return kinds


def footprint(rows: list[dict[str, Any]]) -> dict[str, dict[str, tuple[float, int, float]]]:
    """Where synchronization's cost lands, from traced, bracketed turns (``bench_sync
    --trace --bracket``): per arm and kind of step (:func:`step_kinds`), the mean excess of
    its steps over the ``none`` pace beside their turn, how many steps, and their share of
    the arm's loss (excess summed over all the arm's steps). ``all``: every step, whose
    excess is the arm's loss of step rate (``1 / ratio - 1`` with the turns weighted alike).
    The accepted-slowdown pacer sets busy steps against the quiet ones beside them, so a
    cost that lands on quiet steps is one it cannot see."""
    excess: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if "step_seconds" not in r or "baseline_examples_per_s" not in r:
            continue
        pace = (r["train_seconds"] * r["examples_per_s"] / r["baseline_examples_per_s"]
                / len(r["step_seconds"]))
        mine = excess.setdefault(r["arm"], {})
        for seconds, kind in zip(r["step_seconds"], step_kinds(r["step_busy"]), strict=True):
            for key in (kind, "all"):
                mine.setdefault(key, []).append(seconds / pace - 1)
    out = {}
    for arm, kinds in excess.items():
        n = len(kinds["all"])
        out[arm] = {k: (statistics.fmean(v), len(v), sum(v) / n)
                    for k, v in kinds.items()}
    return out
