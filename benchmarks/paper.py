"""Reproduces the paper's comparison on real data, side by side, and writes a report.

ShadowSync's claims (Zheng et al., arXiv 2003.03477): background synchronization keeps
throughput near that of no synchronization at all, while model quality (NE) is neutral to better
than its foreground (fixed-rate) counterparts, because it syncs more often at no cost to
training. Each seed is a full pass of every arm (same model, seed and data order for every arm)
on MovieLens-1M; ``--repeats`` reruns arms in rotated order for a median throughput. Two designs:

- ``--design user_split``: 4 ranks, every user's ratings on one rank (``rank_split: user``), so
  each replica trains on its own population and not synchronizing measurably hurts held-out NE;
  the setting where the comparison says something. Also runs ``none`` and ``ddp`` with the IID
  split as controls, and records the windowed training NE of every arm for a plot::

      OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 4 -m shadowsync.benchmarks.paper \\
          --design user_split --out benchmarks/results/quality/user_split

  ``--quick`` checks its direction in a few minutes: 200 steps, one seed, a few arms, into
  ``runs/paper_quick`` unless ``--out`` says otherwise.
- ``--design iid`` (the default; the first report): 2 ranks, global steps dealt round-robin, so
  both replicas see the same population; every arm, ``none`` included, ends within the seed
  spread there::

      .venv/bin/torchrun --nproc_per_node 2 -m shadowsync.benchmarks.paper \\
          --out benchmarks/results/quality/iid

Both write ``report.md`` (tables; goals or verdicts), ``quality_vs_throughput.png`` and
``runs.json`` (every run) into ``--out``; ``user_split`` also ``ne_over_training.png``. Arms:
``none``; ``ddp``; fixed-rate MA, EASGD and BMUF every 1, 10 and 100 steps; shadow MA, EASGD and
BMUF (``iid``: paced to a round every 0.1 s at most and back to back; ``user_split``: paced by
``sync.schedule.max_slowdown=0.05``, the presets' setting); and PyTorch's
``PeriodicModelAverager`` every 10 steps as an outside reference.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torchrec

from shadowsync.benchmarks.bench_sync import aggregate, parse_arm, run_all, table
from shadowsync.benchmarks.report import command_line, markdown_table, or_dash, write_json
from shadowsync.datasets import build_dataset
from shadowsync.pipelines.build import DistEnv, init_distributed
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.loop import Trainer
from shadowsync.sync.config import BMUFConfig, EASGDConfig

PERIODS = (1, 10, 100)
ARMS = [
    "none: sync.strategy.name=none",
    "ddp: sync.strategy.name=ddp",
    *[f"FR-{a.upper()} k={k}: sync.strategy.name={a} sync.schedule.mode=fixed_rate "
      f"sync.schedule.period={k}" for a in ("ma", "easgd", "bmuf") for k in PERIODS],
    *[f"S-{a.upper()}: sync.strategy.name={a} sync.schedule.mode=shadow "
      "sync.schedule.min_interval_s=0.1" for a in ("ma", "easgd", "bmuf")],
    *[f"S-{a.upper()} back to back: sync.strategy.name={a} sync.schedule.mode=shadow "
      "sync.schedule.min_interval_s=0" for a in ("ma", "easgd", "bmuf")],
    "torch PeriodicModelAverager k=10: sync.strategy.name=torch_averager sync.schedule.period=10",
]
# EASGD's center moves by alpha times the sum of the W replicas' offsets, so W * alpha must stay
# below 1 (Zhang et al.'s beta); the default 0.5 is that bound at 2 ranks and diverges at 4.
EASGD_ALPHA = " sync.strategy.alpha=0.2"
USER_SPLIT_ARMS = [
    "none: sync.strategy.name=none",
    "ddp: sync.strategy.name=ddp",
    "none, IID split: sync.strategy.name=none data.options.rank_split=window",
    "ddp, IID split: sync.strategy.name=ddp data.options.rank_split=window",
    *[f"FR-{a.upper()} k={k}: sync.strategy.name={a} sync.schedule.mode=fixed_rate "
      f"sync.schedule.period={k}{EASGD_ALPHA if a == 'easgd' else ''}"
      for a in ("ma", "easgd", "bmuf") for k in PERIODS],
    *[f"S-{a.upper()}: sync.strategy.name={a} sync.schedule.mode=shadow "
      f"sync.schedule.max_slowdown=0.05{EASGD_ALPHA if a == 'easgd' else ''}"
      for a in ("ma", "easgd", "bmuf")],
    "torch PeriodicModelAverager k=10: sync.strategy.name=torch_averager sync.schedule.period=10",
]
QUICK_ARMS = ["none", "ddp", "FR-MA k=10", "S-MA", "S-EASGD", "S-BMUF",
              "torch PeriodicModelAverager k=10"]
LOG_EVERY = 25  # steps between windowed training-NE records (the curves)


class Design(NamedTuple):
    """One experiment: the preset, the ranks it is meant for, and its standard arms."""

    config: str
    ranks: int
    arms: list[str]
    out: Path
    title: str


DESIGNS = {
    "iid": Design("movielens_1m", 2, ARMS, Path("benchmarks/results/quality/iid"),
                  "ShadowSync vs foreground synchronization on MovieLens-1M"),
    "user_split": Design("movielens_user_split", 4, USER_SPLIT_ARMS,
                         Path("benchmarks/results/quality/user_split"),
                         "ShadowSync vs foreground synchronization on MovieLens-1M, "
                         "users sharded across 4 replicas"),
}

USER_SPLIT_DESIGN = """## Design: where synchronization matters

With the IID split (global steps of the time-ordered stream dealt round-robin) every replica
sees the same population, and the replicas share every embedding table, which keeps them
coherent: on 2 ranks `none` ended as good as `ddp` (`benchmarks/results/quality`). Recommendation
logs are often sharded by user (a user's events stay on one shard, for locality and privacy), so
this design deals each user's ratings to one rank by a hash of the user id
(`data.options.rank_split: user`, preset `movielens_user_split`) and uses 4 replicas. A user's
embedding is then trained only through the dense replica of that user's rank, while the item
embeddings take gradients from all four; unsynchronized replicas drift into different
coordinate systems for the same tables. Held-out evaluation is unchanged (the latest 10% of
ratings by time, dealt in windows), so every replica scores users it never trained with; that
is the serving situation (one model answers for all users). The model, optimizer, learning
rates and one pass in time order are the `movielens_1m` preset's; the user split leaves out the
rows beyond the smallest rank's share (the hash's imbalance: 2.6% at batch 512). `none, IID
split` and `ddp, IID split` are the same 4 ranks with the IID split: the control that shows
the split, not the rank count, is what makes synchronization matter.

EASGD runs with `sync.strategy.alpha=0.2`: its center moves by alpha times the sum of the 4
replicas' offsets, so the default 0.5 (alpha times world = 1 at 2 ranks) overshoots at 4; in a
trial run with 0.5, S-EASGD's dense gradients went non-finite at step 76. BMUF keeps its default
block momentum, 1 - 1/world = 0.75.
"""


def run_arm(env: DistEnv, preset: str, overrides: list[str]) -> dict[str, Any]:
    """One training run, its final eval and its windowed training NE; collective."""
    cfg = load_config(preset, overrides)
    with Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name,
                                                        **cfg.data.options)) as trainer:
        dist.barrier()
        summary = trainer.train()
        curve = [[r["step"], r["ne"]] for r in trainer.log.history
                 if "ne" in r and not r.get("summary")]
    return {**summary, "curve": curve}


def run_with_curves(env: DistEnv, preset: str, common: list[str],
                    arms: list[tuple[str, list[str]]], seeds: list[int],
                    repeats: int) -> list[dict[str, Any]]:
    """As ``bench_sync.run_all`` (untimed warm-up, arms rotated per repeat), with the curve of
    each run's windowed training NE."""
    run_arm(env, preset, [*common, *arms[0][1], "train.steps=50", "eval.max_batches=1"])
    rows = []
    for seed in seeds:
        for rep in range(repeats):
            shift = rep % len(arms)
            for name, overrides in arms[shift:] + arms[:shift]:
                summary = run_arm(env, preset, [*common, f"train.seed={seed}", *overrides])
                rows.append({"arm": name, "seed": seed, "repeat": rep, **summary})
                if env.rank == 0:
                    print(f"seed {seed} repeat {rep} {name}: eval NE {summary['eval_ne']:.4f}, "
                          f"{summary['examples_per_s']:,.0f} examples/s", flush=True)
    return rows


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.system()} "
            f"{platform.machine()}, Python {platform.python_version()}, torch "
            f"{torch.__version__}, torchrec {getattr(torchrec, '__version__', '1.8.0')}")


def goals(arms: list[dict[str, Any]]) -> list[str]:
    """The issue's goals, each stated with the measured numbers and met or not."""
    by = {a["arm"]: a for a in arms}
    ddp = by.get("ddp")
    lines = []
    for a in arms:
        if not a["arm"].startswith("S-"):
            continue
        fast = a["ratio_min"] >= 0.95  # the whole spread must clear the goal
        lines.append(f"- {a['arm']} keeps {a['ratio_to_none']:.3f} of none's examples/s "
                     f"(runs {a['ratio_min']:.3f}-{a['ratio_max']:.3f}; goal >= 0.95 on every "
                     f"run): {'met' if fast else 'NOT met'}.")
        if ddp is not None:
            sd = max(ddp["eval_ne_std"], a["eval_ne_std"])
            diff = a["eval_ne"] - ddp["eval_ne"]
            within = not math.isnan(sd) and abs(diff) <= 2 * sd
            lines.append(f"  - NE {a['eval_ne']:.4f} vs ddp {ddp['eval_ne']:.4f} (difference "
                         f"{diff:+.4f}, 2 sd = {2 * sd:.4f}): "
                         f"{'within' if within else 'NOT within'} the seed spread.")
        algo = a["arm"][2:].split()[0]
        twins = [b for b in arms if b["arm"].startswith(f"FR-{algo} ")]
        if twins:
            twin = min(twins, key=lambda b: abs(b["ratio_to_none"] - a["ratio_to_none"]))
            better = a["eval_ne"] <= twin["eval_ne"] + (
                0 if math.isnan(twin["eval_ne_std"]) else twin["eval_ne_std"])
            lines.append(f"  - vs the fixed-rate twin of closest throughput ({twin['arm']}, "
                         f"ratio {twin['ratio_to_none']:.3f}): NE {a['eval_ne']:.4f} vs "
                         f"{twin['eval_ne']:.4f}: {'no worse' if better else 'worse'}.")
    if ddp is not None:
        lines.append(f"- ddp's ratio to none, measured in the same run: "
                     f"{ddp['ratio_to_none']:.3f}.")
    return lines


def plot(arms: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for a in arms:
        kind = a["arm"].split(" ")[0].split("-")[0]
        marker = {"S": "o", "FR": "s"}.get(kind, "^")
        err = None if math.isnan(a["eval_ne_std"]) else a["eval_ne_std"]
        ax.errorbar(a["ratio_to_none"], a["eval_ne"], yerr=err, fmt=marker, capsize=3)
        ax.annotate(a["arm"], (a["ratio_to_none"], a["eval_ne"]), fontsize=7,
                    xytext=(4, 3), textcoords="offset points")
    ax.set_xlabel("examples/s relative to none (same run)")
    ax.set_ylabel("eval NE (lower is better; bars: sd over seeds)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_curves(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    """Windowed training NE against steps, the mean over seeds of each arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 5), sharey=True)
    for ax, algo in zip(axes, ("MA", "EASGD", "BMUF"), strict=True):
        for arm in dict.fromkeys(r["arm"] for r in rows):
            shown = algo in arm or arm in ("none", "ddp") or (algo, arm[:5]) == ("MA", "torch")
            if not shown:
                continue
            curves = [dict(map(tuple, r["curve"])) for r in rows
                      if r["arm"] == arm and r["repeat"] == 0 and r.get("curve")]
            steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if steps:
                ax.plot(steps, [statistics.fmean(c[s] for c in curves) for s in steps],
                        label=arm, lw=2.2 if arm.startswith("S-") else 1.2,
                        ls="--" if arm.startswith("FR-") else "-")
        ax.set_title(f"{algo}: training NE, window of recent examples, all ranks", fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("windowed training NE (mean over seeds)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def seed_values(rows: list[dict[str, Any]], arm: str, key: str) -> list[float]:
    """One value per seed (the first repeat) of ``arm``."""
    return [r[key] for r in rows if r["arm"] == arm and r["repeat"] == 0 and key in r]


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    sd = f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.4f}{sd}"


def compare(rows: list[dict[str, Any]], arm: str, other: str) -> tuple[float, float, str]:
    """``arm``'s mean eval NE minus ``other``'s, the larger of their sds over seeds, and a
    verdict that calls a difference only beyond 3 of those sds (lower NE is better)."""
    a, b = seed_values(rows, arm, "eval_ne"), seed_values(rows, other, "eval_ne")
    diff = statistics.fmean(a) - statistics.fmean(b)
    if min(len(a), len(b)) < 2:
        return diff, math.nan, "one seed, no spread to judge by"
    sd = max(statistics.stdev(a), statistics.stdev(b))
    if abs(diff) <= 3 * sd:
        return diff, sd, f"equal within 3 sd ({abs(diff) / sd:.1f} sd)" if sd else "equal"
    word = "better" if diff < 0 else "worse"
    return diff, sd, f"{word} by {abs(diff) / sd:.1f} sd" if sd else word


def quality_table(summary: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    cells = []
    ddp = seed_values(rows, "ddp", "eval_ne")
    for a in summary:
        ne = seed_values(rows, a["arm"], "eval_ne")
        delta = f"{statistics.fmean(ne) - statistics.fmean(ddp):+.4f}" if ddp and ne else "-"
        cells.append([
            a["arm"], "-" if math.isnan(a["ratio_to_none"]) else  # a job without none
            f"{a['ratio_to_none']:.3f} [{a['ratio_min']:.3f}, {a['ratio_max']:.3f}]",
            or_dash(a["sync_gap_mean"], ".1f"), or_dash(a["sync_gap_max"], ".0f"),
            or_dash(a["syncs"], ".0f"), spread(ne), delta,
            spread(seed_values(rows, a["arm"], "eval_auc")),
            spread(seed_values(rows, a["arm"], "eval_calibration"))])
    return markdown_table(
        ["arm", "ratio to none [min, max]", "sync gap mean", "sync gap max", "syncs",
         "eval NE ± sd", "NE - ddp", "eval AUC ± sd", "calibration ± sd"], cells, "l" + "r" * 8)


def verdicts(summary: list[dict[str, Any]], rows: list[dict[str, Any]],
             hyper: dict[str, str]) -> list[str]:
    """Per strategy: the bar (none vs ddp), then each S-* arm against ddp, against its FR twin
    of closest sync gap (on a log scale) and against every FR period; no difference is called
    inside 3 sd."""
    names = [a["arm"] for a in summary]
    lines = []
    if "none" in names and "ddp" in names:
        diff, _, word = compare(rows, "none", "ddp")
        lines.append(f"- **The bar:** none - ddp = {diff:+.4f} NE: none is {word}.")
    if "none, IID split" in names and "ddp, IID split" in names:
        diff, _, word = compare(rows, "none, IID split", "ddp, IID split")
        lines.append(f"- **Control, IID split on the same ranks:** none - ddp = {diff:+.4f} NE: "
                     f"none is {word}.")
    gap = {a["arm"]: a["sync_gap_mean"] for a in summary}
    for arm in names:
        if not arm.startswith("S-"):
            continue
        algo = arm[2:].split()[0]
        parts = [f"- **{arm}** ({hyper.get(algo, 'defaults')}; sync gap {gap[arm]:.1f} steps): "
                 f"NE {spread(seed_values(rows, arm, 'eval_ne'))}"]
        if "ddp" in names:
            diff, _, word = compare(rows, arm, "ddp")
            parts.append(f"vs ddp {diff:+.4f}, {word}")
        twins = [b for b in names if b.startswith(f"FR-{algo} ")]
        if twins:  # equal sync rate; examples/s from shared cores is too noisy to pair by
            twin = min(twins, key=lambda b: abs(math.log(gap[b] / gap[arm])))
            diff, _, word = compare(rows, arm, twin)
            parts.append(f"vs its FR twin of closest sync gap ({twin}, gap {gap[twin]:.1f}) "
                         f"{diff:+.4f}, {word}")
            parts.append("vs every period: " + ", ".join(
                f"{b.split()[-1]} {compare(rows, arm, b)[0]:+.4f}" for b in twins))
        lines.append("; ".join(parts) + ".")
    for arm in names:
        if arm.startswith(("FR-", "torch")) and "ddp" in names:
            diff, _, word = compare(rows, arm, "ddp")
            lines.append(f"- {arm}: vs ddp {diff:+.4f}, {word}.")
    return lines


def hyper_parameters(config: str, overrides: list[str], world: int,
                     arms: list[tuple[str, list[str]]]) -> dict[str, str]:
    """What each S-* arm's strategy ran with, as the report states it."""
    out = {"MA": "no hyper-parameter"}
    for name, arm in arms:
        strategy = load_config(config, [*overrides, *arm]).sync.strategy
        if name.startswith("S-EASGD") and isinstance(strategy, EASGDConfig):
            out["EASGD"] = f"alpha {strategy.alpha}"
        elif name.startswith("S-BMUF") and isinstance(strategy, BMUFConfig):
            block_momentum = strategy.block_momentum
            momentum = block_momentum if block_momentum is not None else 1 - 1 / world
            out["BMUF"] = (f"block momentum {momentum:.2f}"
                           f"{' = 1 - 1/world' if block_momentum is None else ''}, "
                           f"block lr {strategy.block_lr}")
    return out


def header(args: argparse.Namespace, design: Design, world: int) -> list[str]:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    argv = [a for a in sys.argv[1:] if a != "--report-only"]
    env = "OMP_NUM_THREADS=1 " if world > 2 else ""
    command = env + command_line("shadowsync.benchmarks.paper", argv,
                                 f"torchrun --nproc_per_node {world}")
    dated = (f"- Report rewritten {when} from the runs in `runs.json` "
             "(`python -m shadowsync.benchmarks.paper --report-only`; see git for when they ran)"
             if args.report_only else f"- Date: {when}")
    return [
        f"# {design.title}",
        "",
        dated,
        f"- Command: `{command}`",
        f"- Machine: {machine()}",
        f"- Ranks: {world} (gloo on CPU); config `{args.config or design.config}` "
        f"{' '.join(args.overrides)}; seeds {args.seeds}; {args.repeats} repeat(s) per seed",
    ]


def report(arms: list[dict[str, Any]], args: argparse.Namespace, world: int) -> str:
    design = DESIGNS[args.design]
    return "\n".join([
        *header(args, design, world),
        "- examples/s is the median over runs; the ratio is to `none` in this same job, with the "
        "min-max of each run's ratio to `none`'s run of the same seed and repeat; NE, AUC "
        "and calibration are the exact metrics over the whole eval split after each arm's final "
        "sync, mean (± sd) over seeds.",
        "",
        table(arms),
        "",
        "## Goals",
        "",
        *goals(arms),
        "",
        "![quality vs throughput](quality_vs_throughput.png)",
        "",
    ])


def user_split_report(summary: list[dict[str, Any]], rows: list[dict[str, Any]],
                      args: argparse.Namespace, world: int) -> str:
    design = DESIGNS[args.design]
    arms = args.arm or [parse_arm(a) for a in design.arms]
    hyper = hyper_parameters(args.config or design.config, args.overrides, world, arms)
    return "\n".join([
        *header(args, design, world),
        "- Throughput: the ranks shared 2 CPU cores with other work (runs under `nice -n 19`), "
        "so examples/s and the ratios are indicative only; NE, AUC and calibration do not "
        "depend on speed, except through the sync gap of the shadow arms.",
        "",
        USER_SPLIT_DESIGN,
        "## Results",
        "",
        "Eval NE, AUC and calibration (predicted over observed click rate) are exact over the "
        "whole eval split after each arm's final sync, mean ± sd over seeds; `NE - ddp` is the "
        "difference of the means. The sync gap is the mean number of training steps between "
        "synchronizations applied.",
        "",
        quality_table(summary, rows),
        "",
        "## Verdicts",
        "",
        "A difference is called only where it exceeds 3 times the larger of the two arms' "
        "standard deviations over seeds; otherwise the arms are equal at this resolution.",
        "",
        *verdicts(summary, rows, hyper),
        "",
        "The windowed training NE below is each replica scored on its own users' examples, so "
        "it cannot show what happens when a replica serves the other ranks' users; only the "
        "eval table does.",
        "",
        "![NE over training](ne_over_training.png)",
        "",
        "![quality vs throughput](quality_vs_throughput.png)",
        "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", choices=sorted(DESIGNS), default="iid")
    parser.add_argument("--config", help="preset or YAML file (default: the design's)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default 0 1 2 (--quick: 0)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--arm", type=parse_arm, action="append",
                        help="replace the standard arms (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help="200 steps, a few arms, to check the direction in minutes")
    parser.add_argument("--out", type=Path, help="default: the design's results folder "
                        "(--quick: runs/paper_quick)")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite report.md and the plots from --out's runs.json")
    parser.add_argument("overrides", nargs="*", help="overrides common to every arm")
    args = parser.parse_args()
    design = DESIGNS[args.design]
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    args.out = args.out or (Path("runs/paper_quick") if args.quick else design.out)
    logging.basicConfig(level=logging.WARNING, force=True)
    if args.report_only:
        rows = json.loads((args.out / "runs.json").read_text())
        write(rows, args, design.ranks)
        return 0
    arms = args.arm or [parse_arm(a) for a in design.arms]
    if args.quick:
        arms = [a for a in arms if a[0] in QUICK_ARMS] or arms
    common = ["eval.every_steps=null", "logging.progress_bar=false",
              *(["train.steps=200"] if args.quick else []), *args.overrides]
    env = init_distributed(300.0)
    if env.world_size != design.ranks and env.rank == 0:
        print(f"warning: --design {args.design} is meant for {design.ranks} ranks, running "
              f"on {env.world_size}", flush=True)
    config = args.config or design.config
    if args.design == "iid":
        rows = run_all(env, config, [*common, "train.log_every=100000"], arms, args.seeds,
                       args.repeats)
    else:
        rows = run_with_curves(env, config, [*common, f"train.log_every={LOG_EVERY}"], arms,
                               args.seeds, args.repeats)
    if env.rank == 0:
        write(rows, args, env.world_size)
    dist.destroy_process_group()
    return 0


def write(rows: list[dict[str, Any]], args: argparse.Namespace, world: int) -> None:
    """runs.json, the plots and report.md into ``--out``."""
    args.out.mkdir(parents=True, exist_ok=True)
    summary = aggregate(rows)
    write_json(args.out / "runs.json", rows)
    title = f"{DESIGNS[args.design].title}, {world} CPU ranks"
    plot(summary, args.out / "quality_vs_throughput.png", title)
    if args.design == "iid":
        text = report(summary, args, world)
    else:
        plot_curves(rows, args.out / "ne_over_training.png", title)
        text = user_split_report(summary, rows, args, world)
    (args.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
