"""Side-by-side throughput and quality of the dense synchronizers, in one job.

Every arm trains the same model on the same data with the same seed, one after another in the
same processes and process group, so each ratio to ``none`` (no synchronization at all) is
measured under the same conditions. With ``--repeats`` the arms run again in rotated order and
examples/s is the median (2 shared CPU cores are noisy); with ``--seeds`` each seed is a full
pass of every arm, and NE/AUC are reported as mean and spread over seeds. Run on 2 CPU ranks::

    .venv/bin/torchrun --nproc_per_node 2 benchmarks/bench_sync.py --config synthetic
    .venv/bin/torchrun --nproc_per_node 2 benchmarks/bench_sync.py --config movielens_1m \\
        --steps 0 --repeats 2 --seeds 0 1 2 --json out.json \\
        --arm "none: sync.algorithm=none" --arm "shadow ma: sync.algorithm=ma sync.mode=shadow"

Prints a Markdown table on rank 0: examples/s and its ratio to ``none``, mean and max sync
gap (training steps between applied syncs), syncs applied, seconds in communication, and the
final eval AUC, NE and calibration (after each arm's final sync, over the whole eval split).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shadowsync.datasets import build_dataset
from shadowsync.pipelines.build import DistEnv, init_distributed
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.trainer import Trainer

DEFAULT_ARMS = [
    "none: sync.algorithm=none",
    "ddp: sync.algorithm=ddp",
    "fixed-rate ma k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10",
    "shadow ma: sync.algorithm=ma sync.mode=shadow",
    "shadow easgd: sync.algorithm=easgd sync.mode=shadow",
    "shadow bmuf: sync.algorithm=bmuf sync.mode=shadow",
]


def parse_arm(spec: str) -> tuple[str, list[str]]:
    name, sep, overrides = spec.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"arm {spec!r}: expected 'name: key=value ...'")
    return name.strip(), overrides.split()


def _tx_bytes() -> int | None:
    """Bytes this host has sent on the interface gloo uses (``GLOO_SOCKET_IFNAME``), from
    sysfs; None where that is not one interface of this network namespace (loopback runs)."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "")
    path = Path("/sys/class/net") / iface / "statistics" / "tx_bytes"
    if not iface or "," in iface or iface == "lo" or not path.exists():
        return None
    return int(path.read_text())


def run_arm(env: DistEnv, preset: str, overrides: list[str]) -> dict[str, Any]:
    """One full training run and final eval; collective. On an emulated cluster (see
    ``cluster.py``) also the bytes every host put on its link, summed over hosts (embedding
    all-to-alls, synchronization and the final evaluation's gathers)."""
    cfg = load_config(preset, overrides)
    trainer = Trainer(cfg, env, build_dataset(cfg.data.name, **cfg.data.options))
    dist.barrier()
    before = _tx_bytes()
    summary = trainer.train()
    after = _tx_bytes()
    if before is not None and after is not None:
        sent = torch.tensor([after - before], dtype=torch.float64)
        dist.all_reduce(sent)
        summary["wire_bytes"] = float(sent.item())
    return summary


def run_all(
    env: DistEnv,
    preset: str,
    common: list[str],
    arms: list[tuple[str, list[str]]],
    seeds: list[int],
    repeats: int,
) -> list[dict[str, Any]]:
    """Every arm, for every seed, ``repeats`` times in rotated order (so no arm always runs
    first or last: the rotation goes on across seeds, so one repeat of several seeds rotates
    too); one row per run. An untimed warm-up run comes first: the first training in
    a process pays one-time costs (imports, allocator, thread pools) that would otherwise land
    on whichever arm runs first, usually the ``none`` baseline."""
    _, overrides = arms[0]
    run_arm(env, preset, [*common, *overrides, "train.steps=50", "eval.max_batches=1"])
    rows = []
    for i, seed in enumerate(seeds):
        for rep in range(repeats):
            shift = (i * repeats + rep) % len(arms)
            for name, overrides in arms[shift:] + arms[:shift]:
                summary = run_arm(env, preset, [*common, f"train.seed={seed}", *overrides])
                rows.append({"arm": name, "seed": seed, "repeat": rep, **summary})
                if env.rank == 0:
                    print(f"seed {seed} repeat {rep} {name}: "
                          f"{summary['examples_per_s']:,.0f} examples/s, "
                          f"AUC {summary['eval_auc']:.4f}", flush=True)
    return rows


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if key in r and not math.isnan(r[key])]
    return statistics.fmean(values) if values else math.nan


def _stdev(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs]
    return statistics.stdev(values) if len(values) > 1 else math.nan


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm, in first-seen order: median examples/s and its ratio to ``none``'s median, sync
    telemetry averaged, quality as mean and standard deviation over seeds."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    out = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        per_seed = [r for r in mine if r["repeat"] == 0]
        out.append({
            "arm": arm,
            "runs": len(mine),
            "examples_per_s": statistics.median(r["examples_per_s"] for r in mine),
            "sync_gap_mean": _mean(mine, "sync_gap_mean"),
            "sync_gap_max": max((r.get("sync_gap_max", math.nan) for r in mine),
                                default=math.nan),
            "syncs": _mean(mine, "sync_syncs_applied"),
            "comm_seconds": _mean(mine, "sync_comm_seconds"),
            "train_seconds": _mean(mine, "train_seconds"),
            "eval_auc": _mean(per_seed, "eval_auc"),
            "eval_ne": _mean(per_seed, "eval_ne"),
            "eval_ne_std": _stdev(per_seed, "eval_ne"),
            "eval_calibration": _mean(per_seed, "eval_calibration"),
        })
    base = [a["examples_per_s"] for a in out if a["arm"] == "none"]
    # Each run against none's run of the same seed and repeat (same job, same position in the
    # rotation): the spread a goal must clear as a whole.
    nones = {(r["seed"], r["repeat"]): r["examples_per_s"] for r in rows if r["arm"] == "none"}
    for a in out:
        a["ratio_to_none"] = a["examples_per_s"] / base[0] if base else math.nan
        ratios = [r["examples_per_s"] / nones[r["seed"], r["repeat"]] for r in rows
                  if r["arm"] == a["arm"] and (r["seed"], r["repeat"]) in nones]
        a["ratio_min"] = min(ratios, default=math.nan)
        a["ratio_max"] = max(ratios, default=math.nan)
    return out


def _f(x: float, digits: int = 1) -> str:
    return "-" if math.isnan(x) else f"{x:,.{digits}f}"


def table(arms: list[dict[str, Any]]) -> str:
    lines = [
        "| arm | examples/s | ratio to none [min, max over runs] | sync gap mean | "
        "sync gap max | syncs | "
        "comm s | eval AUC | eval NE (± sd over seeds) | calibration |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in arms:
        ne = _f(a["eval_ne"], 4) + ("" if math.isnan(a["eval_ne_std"])
                                    else f" ± {a['eval_ne_std']:.4f}")
        lines.append(
            f"| {a['arm']} | {a['examples_per_s']:,.0f} | {a['ratio_to_none']:.3f} "
            f"[{a['ratio_min']:.3f}, {a['ratio_max']:.3f}] | "
            f"{_f(a['sync_gap_mean'])} | {_f(a['sync_gap_max'], 0)} | {_f(a['syncs'], 0)} | "
            f"{_f(a['comm_seconds'])} | {a['eval_auc']:.4f} | {ne} | "
            f"{a['eval_calibration']:.3f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="synthetic", help="preset or YAML file")
    parser.add_argument("--steps", type=int, default=1500,
                        help="training steps per arm (0: the config's own, e.g. one pass)")
    parser.add_argument("--arm", type=parse_arm, action="append",
                        help="'name: overrides'; repeatable (default: the standard arms)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="train.seed values")
    parser.add_argument("--repeats", type=int, default=1, help="runs per arm and seed")
    parser.add_argument("--json", type=Path, help="also write every run as JSON here (rank 0)")
    parser.add_argument("overrides", nargs="*", help="overrides common to every arm")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, force=True)
    arms = args.arm or [parse_arm(a) for a in DEFAULT_ARMS]
    common = ["eval.every_steps=null", "logging.progress_bar=false", *args.overrides]
    if args.steps:
        common = [f"train.steps={args.steps}", f"train.log_every={args.steps + 1}", *common]
    env = init_distributed(300.0)
    rows = run_all(env, args.config, common, arms, args.seeds, args.repeats)
    if env.rank == 0:
        print(f"\n{env.world_size} ranks on {env.device}, config {args.config} "
              f"{' '.join(args.overrides)}; steps {args.steps or 'from config'}, seeds "
              f"{args.seeds}, {args.repeats} repeat(s)\n")
        print(table(aggregate(rows)))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
