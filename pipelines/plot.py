"""Draws runs' NE, AUC, examples/s and sync gap to one PNG, for comparing runs::

    python -m shadowsync.pipelines.plot runs/shadow_ma runs/fixed_rate_ma -o compare.png
    python -m shadowsync.pipelines.plot b512=runs/a b4096=runs/b --x examples -o cmp.png

Each argument is a run's ``output_dir`` (its ``metrics.jsonl``) or the file itself, optionally
``LABEL=PATH``; otherwise the legend shows the shortest part of the path that tells the runs
apart. ``--x examples`` (steps times the examples a step takes) compares runs of different batch
sizes or world sizes, ``--x time`` the wall time since a run's first record. Training curves are
the records' windowed metrics, eval points the exact metrics over the eval split. Non-finite
values are left out of the curves, and a dotted line marks a run's first one, at the step the
legend names.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

# (training key, eval key, title)
PANELS = [("ne", "eval_ne", "normalized entropy"), ("auc", "eval_auc", "AUC"),
          ("examples_per_s", None, "examples/s"),
          ("sync_gap_mean", None, "sync gap (steps between applied syncs)")]
X_AXES = {"step": "step", "examples": "training examples", "time": "wall time (s)"}


def read_run(path: str | Path) -> list[dict[str, Any]]:
    """The records of one run; a bad line is an error naming the file and line."""
    file = Path(path)
    if file.is_dir():
        file = file / "metrics.jsonl"
    records = []
    with open(file) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}: line {number}: not JSON ({e.msg})") from e
    if not records:
        raise ValueError(f"{file}: no records")
    return records


def short_names(paths: list[str]) -> list[str]:
    """For each path, its fewest trailing parts (``metrics.jsonl`` dropped) that no other run
    shares: ``runs/a/shadow``, ``runs/b/shadow``, ``runs/ddp`` give ``a/shadow``, ``b/shadow``,
    ``ddp``."""
    parts = [Path(p).parts[:-1] if Path(p).name == "metrics.jsonl" else Path(p).parts
             for p in paths]

    def tail(i: int, depth: int) -> str:
        return str(Path(*parts[i][-depth:]))

    names = []
    for i, own in enumerate(parts):
        depth = next((d for d in range(1, len(own)) if all(
            tail(i, d) != tail(j, d) for j in range(len(parts)) if j != i)), len(own))
        names.append(tail(i, depth))
    return names


def x_values(records: list[dict[str, Any]], axis: str, name: str) -> dict[int, float]:
    """Each logged step's position on ``axis``, for one run; a run without what the axis
    needs is an error naming it."""
    steps = sorted({r["step"] for r in records if "step" in r})
    if axis == "step":
        return {s: float(s) for s in steps}
    if axis == "time":
        stamped: dict[int, float] = {}
        for r in records:  # a step's first record: a resumed run logs its step again
            if "step" in r and "time" in r:
                stamped.setdefault(r["step"], r["time"])
        if not stamped:
            raise ValueError(f"{name}: --x time needs the records' time stamps; this run has "
                             "none (written before metrics.jsonl carried them)")
        start = min(r["time"] for r in records if "time" in r)
        return {s: t - start for s, t in stamped.items()}
    counted = sorted((r["step"], r["examples"]) for r in records
                     if "loss" in r and r.get("examples"))
    if not counted:
        raise ValueError(f"{name}: --x examples needs training records with 'examples'")
    # examples per step, from consecutive records (TorchRec's count restarts at a resume)
    rates = [(e2 - e1) / (s2 - s1) for (s1, e1), (s2, e2) in itertools.pairwise(counted)
             if s2 > s1 and e2 > e1] or [counted[0][1] / counted[0][0]]
    per_step = statistics.median(rates)
    return {s: s * per_step for s in steps}


def first_non_finite(records: list[dict[str, Any]]) -> int | None:
    """The first step where a plotted value is NaN or infinite, if any."""
    keys = {k for train, ev, _ in PANELS for k in (train, ev) if k}
    bad = [r["step"] for r in records if "step" in r and any(
        isinstance(r.get(k), float) and not math.isfinite(r[k]) for k in keys)]
    return min(bad) if bad else None


def plot_runs(runs: dict[str, list[dict[str, Any]]], out: str | Path, x: str = "step") -> None:
    """One panel per metric, every run in each; ``x`` is a key of :data:`X_AXES`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    positions = {name: x_values(records, x, name) for name, records in runs.items()}
    broken = {name: first_non_finite(records) for name, records in runs.items()}
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (train_key, eval_key, title) in zip(axes.flat, PANELS, strict=True):
        for name, records in runs.items():
            at, bad = positions[name], broken[name]
            label = name if bad is None else f"{name} (non-finite from step {bad})"
            color = None
            for key, style in ((train_key, "-"), (eval_key, "o--")):
                points = [(at[r["step"]], r[key]) for r in records if key and key in r
                          and r["step"] in at and math.isfinite(r[key])
                          and (key != train_key or not r.get("summary"))]
                if points:  # eval points share the training curve's color and legend entry
                    line, = ax.plot(*zip(*points, strict=True), style, color=color,
                                    label=label if color is None else None)
                    color = line.get_color()
            if bad is not None and color is not None:
                ax.axvline(at[bad], color=color, linestyle=":", linewidth=2)
        ax.set_title(title)
        ax.set_xlabel(X_AXES[x])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shadowsync.pipelines.plot",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run output_dir or metrics.jsonl, or LABEL=PATH")
    parser.add_argument("-o", "--out", default="metrics.png", help="PNG to write")
    parser.add_argument("--x", choices=list(X_AXES), default="step",
                        help="x axis: step, training examples, or wall time")
    args = parser.parse_args(argv)
    labelled = [arg.partition("=") for arg in args.runs]
    paths = [path if sep else label for label, sep, path in labelled]
    auto = iter(short_names([label for label, sep, _ in labelled if not sep]))
    names = [label if sep else next(auto) for label, sep, _ in labelled]
    if len(set(names)) != len(names):
        print(f"error: two runs have one label: {names}", file=sys.stderr)
        return 2
    try:
        runs = {name: read_run(path) for name, path in zip(names, paths, strict=True)}
        plot_runs(runs, args.out, args.x)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
