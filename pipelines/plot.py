"""Draws runs' NE, AUC and examples/s over training steps to one PNG, for comparing runs::

    python -m shadowsync.pipelines.plot runs/shadow_ma runs/fixed_rate_ma -o compare.png

Each argument is a run's ``output_dir`` (its ``metrics.jsonl``) or the file itself. Training
curves are TorchRec's windowed metrics; eval points are the exact metrics over the eval split.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PANELS = [("ne", "eval_ne", "normalized entropy"), ("auc", "eval_auc", "AUC"),
          ("examples_per_s", None, "examples/s")]


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


def plot_runs(runs: dict[str, list[dict[str, Any]]], out: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4))
    for ax, (train_key, eval_key, title) in zip(axes, PANELS, strict=True):
        for name, records in runs.items():
            train = [(r["step"], r[train_key]) for r in records
                     if train_key in r and not r.get("summary")]
            if train:
                line, = ax.plot(*zip(*train, strict=True), label=name)
                color = line.get_color()
            else:
                color = None
            if eval_key:
                evals = [(r["step"], r[eval_key]) for r in records if eval_key in r]
                if evals:
                    ax.plot(*zip(*evals, strict=True), "o--", color=color,
                            label=f"{name} (eval)")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shadowsync.pipelines.plot",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run output_dir or metrics.jsonl")
    parser.add_argument("-o", "--out", default="metrics.png", help="PNG to write")
    args = parser.parse_args(argv)
    try:
        runs = {str(p): read_run(p) for p in args.runs}
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plot_runs(runs, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
