"""Side-by-side throughput and quality of the dense synchronizers, in one job.

Every arm trains the same model on the same data and seed, one after another in the same
processes and process group, so the ratio to ``none`` (no synchronization at all) is measured
under the same conditions. Run on 2 CPU ranks::

    .venv/bin/torchrun --nproc_per_node 2 benchmarks/bench_sync.py
    .venv/bin/torchrun --nproc_per_node 2 benchmarks/bench_sync.py --steps 2000 \\
        --arm "shadow-ma-paced: sync.algorithm=ma sync.min_interval_s=0.05"

Prints a Markdown table on rank 0: examples/s and its ratio to ``none``, mean and max sync
gap (training steps between applied syncs), syncs applied, seconds in communication, and the
final eval AUC and NE (after each arm's final sync, over the whole eval split).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shadowsync.datasets import build_dataset
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.train import Trainer, init_distributed

DEFAULT_ARMS = [
    "none: sync.algorithm=none",
    "ddp: sync.algorithm=ddp",
    "fixed-rate ma k=10: sync.algorithm=ma sync.mode=fixed_rate sync.period=10",
    "shadow ma: sync.algorithm=ma sync.mode=shadow",
    "shadow easgd: sync.algorithm=easgd sync.mode=shadow",
    "shadow bmuf: sync.algorithm=bmuf sync.mode=shadow",
    "none (again): sync.algorithm=none",
]


def _arm(spec: str) -> tuple[str, list[str]]:
    name, sep, overrides = spec.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"arm {spec!r}: expected 'name: key=value ...'")
    return name.strip(), overrides.split()


def run_arm(
    env: Any, preset: str, common: list[str], overrides: list[str]
) -> dict[str, Any]:
    cfg = load_config(preset, common + overrides)
    dataset = build_dataset(cfg.data.name, **cfg.data.options)
    trainer = Trainer(cfg, env, dataset)
    dist.barrier()
    summary = trainer.train()
    return summary


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}f}"


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    base = [s["examples_per_s"] for name, s in rows if name.startswith("none")]
    ref = sum(base) / len(base) if base else float("nan")
    lines = [
        "| arm | examples/s | ratio to none | sync gap mean | sync gap max | syncs | "
        "comm s | eval AUC | eval NE |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in rows:
        lines.append(
            f"| {name} | {s['examples_per_s']:,.0f} | {s['examples_per_s'] / ref:.3f} | "
            f"{_fmt(s.get('sync_sync_gap_mean', float('nan')))} | "
            f"{_fmt(s.get('sync_sync_gap_max', float('nan')), 0)} | "
            f"{_fmt(s.get('sync_syncs_applied', float('nan')), 0)} | "
            f"{_fmt(s.get('sync_comm_seconds', float('nan')))} | "
            f"{s['eval_auc']:.4f} | {s['eval_ne']:.4f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="synthetic", help="preset or YAML file")
    parser.add_argument("--steps", type=int, default=1500, help="training steps per arm")
    parser.add_argument("--arm", type=_arm, action="append",
                        help="'name: overrides'; repeatable (default: the standard arms)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here (rank 0)")
    parser.add_argument("overrides", nargs="*", help="overrides common to every arm")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, force=True)
    arms = args.arm or [_arm(a) for a in DEFAULT_ARMS]
    common = [f"train.steps={args.steps}", "eval.every_steps=null",
              f"train.log_every={args.steps + 1}", *args.overrides]
    env = init_distributed(300.0)
    torch.manual_seed(0)
    rows = []
    for name, overrides in arms:
        summary = run_arm(env, args.config, common, overrides)
        rows.append((name, summary))
        if env.rank == 0:
            print(f"{name}: {summary['examples_per_s']:,.0f} examples/s, "
                  f"AUC {summary['eval_auc']:.4f}", flush=True)
    if env.rank == 0:
        print(f"\n{env.world_size} ranks on {env.device}, {args.steps} steps per arm, "
              f"config {args.config} {' '.join(args.overrides)}\n")
        print(table(rows))
        if args.json:
            args.json.write_text(json.dumps([{"arm": n, **s} for n, s in rows], indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
