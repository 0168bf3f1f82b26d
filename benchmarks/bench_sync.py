"""Side-by-side throughput and quality of the dense synchronizers, in one job.

Every arm trains the same model on the same data with the same seed, one after another in the
same processes and process group, so each ratio to ``none`` (no synchronization at all) is
measured under the same conditions. With ``--repeats`` the arms run again in rotated order and
examples/s is the median (2 shared CPU cores are noisy); with ``--seeds`` each seed is a full
pass of every arm, and NE/AUC are reported as mean and spread over seeds. Run on 2 CPU ranks::

    .venv/bin/torchrun --nproc_per_node 2 -m shadowsync.benchmarks.bench_sync --config synthetic
    .venv/bin/torchrun --nproc_per_node 2 -m shadowsync.benchmarks.bench_sync \\
        --config movielens_1m \\
        --steps 0 --repeats 2 --seeds 0 1 2 --json out.json \\
        --arm "none: sync.strategy.name=none" \\
        --arm "shadow ma: sync.strategy.name=ma sync.schedule.mode=shadow"

Prints a Markdown table on rank 0: examples/s and its ratio to ``none``, mean and max sync
gap (training steps between applied syncs), syncs applied, seconds in communication, and the
final eval AUC, NE and calibration (after each arm's final sync, over the whole eval split).

``--interleave B`` runs the arms in turns of ``B`` steps on one model instead
(:class:`~.turns.RotatingReplicas`): each turn is one row, its ``repeat`` the cycle of turns it
belongs to, its ratio to ``none``'s turn of the same cycle. Separate runs each build a model and
a data stream, and on shared cores two identical runs can read far apart; turns on one model in one
process put the machine's drift on every arm alike. Only arms of a ShadowSync strategy and
``none`` can take turns (DDP is built into the model), and there is no per-arm evaluation
(one model). ``--bracket`` (with ``--interleave``) also runs ``none`` between every two other
turns and compares each turn with the ``none`` turns just before and after it (its row's
``baseline_examples_per_s``): the machine's speed on 2 shared cores wanders over tens of
seconds, and a ``none`` turn a cycle away carries more of that than one beside it::

    .venv/bin/torchrun --nproc_per_node 2 -m shadowsync.benchmarks.bench_sync \\
        --config synthetic --interleave 100 --repeats 8 --arm "none: sync.strategy.name=none" \\
        --arm "S: sync.strategy.name=ma sync.schedule.mode=shadow" \\
        --arm "FR k=10: sync.strategy.name=ma sync.schedule.mode=fixed_rate sync.schedule.period=10"
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shadowsync.benchmarks.report import markdown_table, or_dash, spread, write_json
from shadowsync.benchmarks.rows import baseline, first_per_seed, mean_of, stdev_of
from shadowsync.benchmarks.turns import run_interleaved, tx_bytes
from shadowsync.datasets import build_dataset
from shadowsync.pipelines.build import DistEnv, init_distributed, local_world
from shadowsync.pipelines.callbacks import TrainCallback
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.loop import Trainer

DEFAULT_ARMS = [
    "none: sync.strategy.name=none",
    "ddp: sync.strategy.name=ddp",
    "fixed-rate ma k=10: sync.strategy.name=ma sync.schedule.mode=fixed_rate "
    "sync.schedule.period=10",
    "shadow ma: sync.strategy.name=ma sync.schedule.mode=shadow",
    "shadow easgd: sync.strategy.name=easgd sync.schedule.mode=shadow",
    "shadow bmuf: sync.strategy.name=bmuf sync.schedule.mode=shadow",
]


def parse_arm(spec: str) -> tuple[str, list[str]]:
    name, sep, overrides = spec.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"arm {spec!r}: expected 'name: key=value ...'")
    return name.strip(), overrides.split()


class DeviceWait(TrainCallback):
    """A GPU trainer's host, emulated on CPU: after every training step the training thread
    waits ``ms`` milliseconds holding neither a core nor the GIL, as a host thread blocked on
    a CUDA event (``cudaEventBlockingSync``) while the device computes the step.

    What it models: a host CPU idle for most of each step, which a background round can use
    (on this 2-core rig every step otherwise keeps both cores busy, unlike a GPU trainer's
    host or the many-core Hogwild trainers of ShadowSync, arXiv 2003.03477, where a sync
    thread takes a small share). A fixed-rate round still adds to the step, as it would sit
    in the stream after the step's kernels. What it does not model: device memory bandwidth
    or compute taken by the round (NCCL's kernels occupy SMs the step wants), host-device
    copies over PCIe, a host wait that spins (CUDA's default scheduling can hold a core while
    it waits), or device time that overlaps the host's own launch work (here the wait
    follows the whole CPU step).
    """

    def __init__(self, ms: float, wait: Callable[[float], None] = time.sleep) -> None:
        if not (ms >= 0 and math.isfinite(ms)):
            raise ValueError(f"device step must be a finite number of ms >= 0, got {ms}")
        self.seconds = ms / 1e3
        self._wait = wait

    def on_step_end(self, step: int) -> None:
        self._wait(self.seconds)


def run_arm(env: DistEnv, preset: str, overrides: list[str],
            callbacks: Sequence[TrainCallback] = ()) -> dict[str, Any]:
    """One full training run and final eval; collective. On an emulated cluster (see
    ``cluster.py``) also the bytes every host put on its link, summed over hosts (embedding
    all-to-alls, synchronization and the final evaluation's gathers)."""
    cfg = load_config(preset, overrides)
    trainer = Trainer(RunContext.of(cfg, env, callbacks=callbacks), build_dataset(cfg.data.name,
                                                                                  **cfg.data.options))
    dist.barrier()
    before = tx_bytes()
    summary = trainer.train()
    after = tx_bytes()
    if before is not None and after is not None:
        # a host's counter once: its ranks share its interface
        sent = torch.tensor([(after - before) * (env.local_rank == 0)], dtype=torch.float64)
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
    callbacks: Sequence[TrainCallback] = (),
) -> list[dict[str, Any]]:
    """Every arm, for every seed, ``repeats`` times in rotated order (so no arm always runs
    first or last: the rotation goes on across seeds, so one repeat of several seeds rotates
    too); one row per run. An untimed warm-up run comes first: the first training in
    a process pays one-time costs (imports, allocator, thread pools) that would otherwise land
    on whichever arm runs first, usually the ``none`` baseline."""
    _, overrides = arms[0]
    run_arm(env, preset, [*common, *overrides, "train.steps=50", "eval.max_batches=1"],
            callbacks)
    rows = []
    for i, seed in enumerate(seeds):
        for rep in range(repeats):
            shift = (i * repeats + rep) % len(arms)
            for name, overrides in arms[shift:] + arms[:shift]:
                summary = run_arm(env, preset, [*common, f"train.seed={seed}", *overrides],
                                  callbacks)
                rows.append({"arm": name, "seed": seed, "repeat": rep, **summary})
                if env.rank == 0:
                    print(f"seed {seed} repeat {rep} {name}: "
                          f"{summary['examples_per_s']:,.0f} examples/s, "
                          f"AUC {summary['eval_auc']:.4f}", flush=True)
    return rows


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm, in first-seen order: median examples/s and its ratio to ``none``'s median, sync
    telemetry averaged, quality as mean and standard deviation over seeds."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    out = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        per_seed = first_per_seed(mine)
        out.append({
            "arm": arm,
            "runs": len(mine),
            "examples_per_s": statistics.median(r["examples_per_s"] for r in mine),
            "sync_gap_mean": mean_of(mine, "sync_gap_mean"),
            "sync_gap_max": max((r.get("sync_gap_max", math.nan) for r in mine),
                                default=math.nan),
            "syncs": mean_of(mine, "sync_syncs_applied"),
            "comm_seconds": mean_of(mine, "sync_comm_seconds"),
            "train_seconds": mean_of(mine, "train_seconds"),
            "eval_auc": mean_of(per_seed, "eval_auc"),
            "eval_ne": mean_of(per_seed, "eval_ne"),
            "eval_ne_std": stdev_of(per_seed, "eval_ne"),
            "eval_calibration": mean_of(per_seed, "eval_calibration"),
        })
    base = [a["examples_per_s"] for a in out if a["arm"] == "none"]
    # Each run against none's run of the same seed and repeat (same job, same position in the
    # rotation), or the none turns beside it (--bracket): the spread a goal must clear as a
    # whole.
    nones = {(r["seed"], r["repeat"]): r["examples_per_s"] for r in rows if r["arm"] == "none"}
    bracketed = any("baseline_examples_per_s" in r for r in rows)
    for a in out:
        ratios = [r["examples_per_s"] / b for r in rows
                  if r["arm"] == a["arm"] and not math.isnan(b := baseline(r, nones))]
        if bracketed:  # medians of examples/s over turns minutes apart would carry the drift
            a["ratio_to_none"] = statistics.median(ratios) if ratios else math.nan
        else:
            a["ratio_to_none"] = a["examples_per_s"] / base[0] if base else math.nan
        a["ratio_min"] = min(ratios, default=math.nan)
        a["ratio_max"] = max(ratios, default=math.nan)
    return out


def _f(x: float, digits: int = 1) -> str:
    return or_dash(x, f",.{digits}f")


def table(arms: list[dict[str, Any]]) -> str:
    rows = []
    for a in arms:
        ne = _f(a["eval_ne"], 4) + ("" if math.isnan(a["eval_ne_std"])
                                    else f" ± {a['eval_ne_std']:.4f}")
        rows.append([a["arm"], f"{a['examples_per_s']:,.0f}",
                     spread(a["ratio_to_none"], a["ratio_min"], a["ratio_max"]),
                     _f(a["sync_gap_mean"]), _f(a["sync_gap_max"], 0), _f(a["syncs"], 0),
                     _f(a["comm_seconds"]), _f(a["eval_auc"], 4), ne,
                     _f(a["eval_calibration"], 3)])
    return markdown_table(
        ["arm", "examples/s", "ratio to none [min, max over runs]", "sync gap mean",
         "sync gap max", "syncs", "comm s", "eval AUC", "eval NE (± sd over seeds)",
         "calibration"], rows, "l" + "r" * 9)


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
    parser.add_argument("--interleave", type=int, metavar="B",
                        help="arms take turns of B steps on one model, --repeats timed cycles "
                             "after a warm-up cycle (--steps is then unused)")
    parser.add_argument("--bracket", action="store_true",
                        help="with --interleave: a none turn before every other turn, each "
                             "turn compared with the none turns beside it")
    parser.add_argument("--trace", action="store_true",
                        help="with --interleave: keep every step's seconds and whether "
                             "synchronization touched it in each turn's row")
    parser.add_argument("--device-step-ms", type=float, nargs="+", default=[0.0], metavar="D",
                        help="emulate a GPU trainer: every arm's training thread waits D ms "
                             "after each step without holding a core or the GIL (DeviceWait); "
                             "one D per host (hosts of LOCAL_WORLD_SIZE ranks, in rank order) "
                             "makes a straggler")
    parser.add_argument("overrides", nargs="*", help="overrides common to every arm")
    args = parser.parse_args()
    for flag in ("bracket", "trace"):
        if getattr(args, flag) and not args.interleave:
            parser.error(f"--{flag} needs --interleave")
    logging.basicConfig(level=logging.WARNING, force=True)
    arms = args.arm or [parse_arm(a) for a in DEFAULT_ARMS]
    common = ["eval.every_steps=null", "logging.progress_bar=false", *args.overrides]
    if args.steps:
        common = [f"train.steps={args.steps}", f"train.log_every={args.steps + 1}", *common]
    env = init_distributed(300.0)
    waits = args.device_step_ms
    local = local_world(env.world_size)
    hosts = env.world_size // local
    if len(waits) not in (1, hosts):
        parser.error(f"--device-step-ms: one value or one per host ({hosts}), got {len(waits)}")
    try:
        ms = waits[env.rank // local if len(waits) > 1 else 0]
        callbacks = [DeviceWait(ms)] if ms else []
    except ValueError as e:
        parser.error(f"--device-step-ms: {e}")
    if args.interleave:
        rows = run_interleaved(env, args.config, common, arms, args.seeds, args.repeats,
                               args.interleave, args.bracket, args.trace, callbacks)
    else:
        rows = run_all(env, args.config, common, arms, args.seeds, args.repeats, callbacks)
    for row in rows:
        row["device_step_ms"] = waits[0]
        if len(waits) > 1:
            row["device_step_ms_by_host"] = waits
    if env.rank == 0:
        runs = (f"turns of {args.interleave} steps{', bracketed' if args.bracket else ''}, "
                f"{args.repeats} timed cycle(s)"
                if args.interleave else
                f"steps {args.steps or 'from config'}, {args.repeats} repeat(s)")
        device = (f", a device wait of {'/'.join(f'{w:g}' for w in waits)} ms a step"
                  if any(waits) else "")
        print(f"\n{env.world_size} ranks on {env.device}, config {args.config} "
              f"{' '.join(args.overrides)}; {runs}, seeds {args.seeds}{device}\n")
        if args.json:  # before the table: a long job's runs outlive a failure to report them
            write_json(args.json, rows)
        print(table(aggregate(rows)))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
