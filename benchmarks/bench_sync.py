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

``--interleave B`` runs the arms in turns of ``B`` steps on one model instead (see
:class:`RotatingReplicas`): each turn is one row, its ``repeat`` the cycle of turns it belongs
to, its ratio to ``none``'s turn of the same cycle. Separate runs each build a model and a data
stream, and on shared cores two identical runs can read far apart; turns on one model in one
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
import dataclasses
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv

from shadowsync.benchmarks.report import markdown_table, or_dash, spread, write_json
from shadowsync.benchmarks.rows import (
    baseline,
    bracket_seconds,
    first_per_seed,
    mean_of,
    stdev_of,
    turn_order,
)
from shadowsync.datasets import build_dataset
from shadowsync.pipelines.build import DistEnv, init_distributed
from shadowsync.pipelines.callbacks import TrainCallback
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.fault_domain import FaultDomain
from shadowsync.pipelines.loop import Trainer
from shadowsync.sync.config import SyncConfig
from shadowsync.sync.errors import FailureSink
from shadowsync.sync.runner import SyncRunner
from shadowsync.sync.wrapper import LocalReplicas, ShadowSyncReplicas

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


def _tx_bytes() -> int | None:
    """Bytes this host has sent on the interface gloo uses (``GLOO_SOCKET_IFNAME``), from
    sysfs; None where that is not one interface of this network namespace (loopback runs)."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "")
    path = Path("/sys/class/net") / iface / "statistics" / "tx_bytes"
    if not iface or "," in iface or iface == "lo" or not path.exists():
        return None
    return int(path.read_text())


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
    before = _tx_bytes()
    summary = trainer.train()
    after = _tx_bytes()
    if before is not None and after is not None:
        sent = torch.tensor([after - before], dtype=torch.float64)
        dist.all_reduce(sent)
        summary["wire_bytes"] = float(sent.item())
    return summary


@dataclasses.dataclass
class Turn:
    """One arm's turn of :attr:`RotatingReplicas.block` steps, as this rank saw it."""

    arm: str
    cycle: int
    seconds: float = 0.0
    bytes_reduced: int = 0
    tx_bytes: int = 0
    done: bool = False  # all its steps ran (training can end inside a turn)
    # the accepted-slowdown pacer's estimates at the turn's end (NaN without one)
    round_cost: float = math.nan
    busy_share: float = math.nan
    round_steps: float = math.nan
    applied_at: list[int] = dataclasses.field(default_factory=list)  # steps 1..block
    # with a trace: each step's seconds, and whether synchronization touched it
    step_seconds: list[float] = dataclasses.field(default_factory=list)
    step_busy: list[bool] = dataclasses.field(default_factory=list)

    @property
    def syncs_applied(self) -> int:
        return len(self.applied_at)

    def gap(self) -> float:
        """Mean steps between consecutive syncs applied within the turn (NaN under two).

        Not ``block / syncs``: a turn's first round lands a round after its first step, and
        the round in flight at its end is not counted, which would charge every turn a
        round's worth of gap that a continuous run does not have."""
        a = self.applied_at
        return (a[-1] - a[0]) / (len(a) - 1) if len(a) > 1 else math.nan


class RotatingReplicas(LocalReplicas):
    """Every arm's synchronizer on one model, taking turns of ``block`` steps.

    Each arm with a synchronizer (a :class:`~shadowsync.sync.config.SyncConfig`; ``None`` for
    no synchronization) gets a :class:`~shadowsync.sync.wrapper.ShadowSyncReplicas` of its
    own (its own runner, process group and pacer state) on the same dense parameters, paused
    as soon as it is wrapped. A turn resumes it, runs ``block`` steps and pauses it without
    consensus (the runner's stop round; a pacing pause that cuts short is finished in the
    arm's next turn, as in one continuous run); cycle ``c`` runs the arms in their order
    rotated by ``c``, so every arm follows every other. With a ``bracket`` arm (the baseline,
    ``none``), that arm runs before each of the others instead, so each turn has a baseline
    turn beside it on either side (the next cycle's first, or a closing one, after the last).

    A turn is timed from the ``after_step`` that begins it to the one that ends it: exactly
    ``block`` steps with all the training loop's own work, the switch itself outside. A turn's
    syncs are those applied within it, and its sync gap the mean distance between them
    (:meth:`Turn.gap`). A round still in flight at its end counts nowhere: the part of it that
    ran within the turn slowed the turn, and the pause finishes the rest in the switch, untimed
    (at most one round a turn, in the arm's favour). A fixed-rate arm's ``period`` must divide
    ``block``, so every turn holds the same rounds.

    With ``trace``, each turn also keeps every step's seconds and whether synchronization
    touched it (:attr:`~shadowsync.sync.runner.SyncRunner.step_busy`), each step timed from
    one ``after_step`` to the next on the runner's own step clock (a step's boundary work,
    the snapshot copy, the delta or a blocking round, counts in the step it begins): where
    in the steps around a round its cost lands (:func:`rows.footprint`).

    Example::

        wrapper = RotatingReplicas({"none": None, "FR k=10": fr_cfg, "S": shadow_cfg}, 100)
        trainer = Trainer(cfg, env, dataset, wrapper=wrapper)
        trainer.train()
        wrapper.turns  # one Turn per arm and cycle, in the order they ran
    """

    def __init__(self, arms: dict[str, SyncConfig | None], block: int,
                 bracket: str | None = None, trace: bool = False,
                 failures: FailureSink | None = None) -> None:
        super().__init__()
        if not arms:
            raise ValueError("RotatingReplicas needs at least one arm")
        if block < 1:
            raise ValueError(f"block must be >= 1 step, got {block}")
        if bracket is not None and (bracket not in arms or len(arms) < 2):
            raise ValueError(f"bracket arm {bracket!r} must be one of at least two arms, "
                             f"got {list(arms)}")
        for name, cfg in arms.items():
            if cfg is None:
                continue
            if not cfg.algorithm.strategy:
                raise ValueError(f"arm {name!r}: sync.strategy.name={cfg.strategy.name} is not a "
                                 "ShadowSync strategy, so it cannot take turns on one model")
            period = cfg.schedule.period
            if cfg.schedule.mode == "fixed_rate" and block % period:
                raise ValueError(f"arm {name!r}: sync.schedule.period={period} does not divide "
                                 f"the turn of {block} steps")
            if cfg.failure.on_failure != "raise":
                raise ValueError(f"arm {name!r}: taking turns needs sync.failure.on_failure=raise")
        self.arms = arms
        self.block = block
        self.bracket = bracket
        self.trace = trace
        self.failures = failures
        self.children: dict[str, ShadowSyncReplicas] = {}
        self.turns: list[Turn] = []
        self._steps = 0
        self._active: ShadowSyncReplicas | None = None
        self._applied = 0  # the active runner's syncs_applied after the last step
        self._step_began = 0.0  # the last after_step, or the turn's start (trace)

    def order(self, cycle: int) -> list[str]:
        """The arms in the order cycle ``cycle`` runs them (:func:`turn_order`)."""
        return turn_order(list(self.arms), cycle, self.bracket)

    @property
    def turns_per_cycle(self) -> int:
        return len(self.order(0))

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv,
             device: torch.device) -> None:
        super().wrap(dmp, env, device)
        for name, cfg in self.arms.items():
            if cfg is not None:
                child = ShadowSyncReplicas.from_config(cfg, self.failures)
                child.wrap(dmp, env, device)
                child.pause(consensus=False)
                self.children[name] = child
        self._begin(0)

    def _counters(self, child: ShadowSyncReplicas | None) -> tuple[int, int, int]:
        if child is None:
            return 0, 0, _tx_bytes() or 0
        s = self._runner_of(child).stats()
        return s.syncs_applied, s.bytes_reduced, _tx_bytes() or 0

    @staticmethod
    def _runner_of(child: ShadowSyncReplicas) -> SyncRunner:
        if child.runner is None:
            raise RuntimeError("RotatingReplicas used before DistributedModelParallel wrapped it")
        return child.runner

    def _begin(self, turn: int) -> None:
        cycle, at = divmod(turn, self.turns_per_cycle)
        name = self.order(cycle)[at]
        self._active = self.children.get(name)
        applied, reduced, tx = self._counters(self._active)
        self._applied = applied
        self.turns.append(Turn(name, cycle, -time.perf_counter(), -reduced, -tx))
        if self._active is not None:
            self._active.resume()
        self._step_began = time.perf_counter()
        self.turns[-1].seconds = -self._step_began

    def _end(self) -> None:
        ended = time.perf_counter()
        turn = self.turns[-1]
        _, reduced, tx = self._counters(self._active)
        turn.seconds += ended
        turn.bytes_reduced += reduced
        turn.tx_bytes += tx
        turn.done = True
        if self._active is not None:
            stats = self._runner_of(self._active).stats()
            turn.round_cost, turn.busy_share = stats.round_cost, stats.busy_share
            turn.round_steps = stats.round_steps
            self._active.pause(consensus=False)

    def after_step(self) -> None:
        self._steps += 1
        if self.trace:
            now, turn = time.perf_counter(), self.turns[-1]
            turn.step_seconds.append(now - self._step_began)
            turn.step_busy.append(self._active is not None
                                  and self._runner_of(self._active).step_busy)
            self._step_began = now
        if self._active is not None:
            self._active.after_step()
            applied = self._runner_of(self._active).syncs_applied
            if applied > self._applied:
                self.turns[-1].applied_at.append((self._steps - 1) % self.block + 1)
                self._applied = applied
        if self._steps % self.block == 0:
            self._end()
            self._begin(self._steps // self.block)

    def pause(self, consensus: bool) -> None:
        if self._active is not None:
            self._active.pause(consensus)

    def resume(self) -> None:
        if self._active is not None:
            self._active.resume()

    def finish(self) -> None:
        """Ends every arm's runner, the one whose turn it is with its final consensus."""
        if self._active is not None:
            self._active.finish()
        for child in self.children.values():
            child.finish()

    def close(self) -> None:
        for child in self.children.values():
            child.close()

    def sync_failure(self) -> BaseException | None:
        return next((e for c in self.children.values() if (e := c.sync_failure()) is not None),
                    None)


def run_interleaved(
    env: DistEnv,
    preset: str,
    common: list[str],
    arms: list[tuple[str, list[str]]],
    seeds: list[int],
    cycles: int,
    block: int,
    bracket: bool = False,
    trace: bool = False,
    callbacks: Sequence[TrainCallback] = (),
) -> list[dict[str, Any]]:
    """For each seed, one training run in which the arms take turns of ``block`` steps
    (:class:`RotatingReplicas`) for ``cycles + 1`` cycles; the first cycle is a warm-up and
    left out. One row per timed turn, with the timed seconds the slowest rank's and the bytes
    on the wire summed over hosts; collective. With ``bracket`` the ``none`` arm runs before
    each other turn and once more at the end, and each row carries the examples/s of the
    ``none`` turns beside it (``baseline_examples_per_s``: their mean seconds)."""
    syncs: dict[str, SyncConfig | None] = {}
    for name, overrides in arms:
        arm = load_config(preset, [*common, *overrides]).sync
        algorithm = arm.strategy.name
        if algorithm != "none" and not arm.algorithm.strategy:
            raise SystemExit(f"arm {name!r}: sync.strategy.name={algorithm} cannot take turns "
                             "(only ShadowSync strategies and none)")
        syncs[name] = None if algorithm == "none" else arm
    if bracket and ("none" not in syncs or syncs["none"] is not None):
        raise SystemExit("--bracket needs an arm named 'none' with sync.strategy.name=none")
    base = "none" if bracket else None
    per_cycle = len(turn_order(list(syncs), 0, base))
    steps = ((cycles + 1) * per_cycle + int(bracket)) * block  # bracket: a closing none turn
    rows = []
    for seed in seeds:
        # epochs: as many as the turns need (the step budget ends the run)
        cfg = load_config(preset, [*common, f"train.seed={seed}", "sync.strategy.name=none",
                                   f"train.steps={steps}", f"train.log_every={steps + 1}",
                                   f"train.epochs={steps}"])
        domain = FaultDomain()
        wrapper = RotatingReplicas(syncs, block, base, trace, domain)
        with Trainer(RunContext.of(cfg, env, domain=domain, callbacks=callbacks),
                     build_dataset(cfg.data.name, **cfg.data.options), wrapper) as trainer:
            summary = trainer.train()
        turns = [t for t in wrapper.turns if t.done]
        if len(turns) != steps // block:
            raise RuntimeError(f"training ended after {summary['step']} of {steps} steps")
        seconds = torch.tensor([t.seconds for t in turns], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        sent = torch.tensor([t.tx_bytes * (env.local_rank == 0) for t in turns],  # a host once
                            dtype=torch.float64)
        dist.all_reduce(sent)
        on_wire = _tx_bytes() is not None
        examples = block * cfg.train.batch_size * env.world_size
        beside = (bracket_seconds([t.arm for t in turns], seconds.tolist(), base)
                  if base is not None else [math.nan] * len(turns))
        if trace:
            # Each step's seconds as the ranks' mean: the ranks' steps jitter against each
            # other, so per-step maxima would sum to more than a turn took. Busy where any
            # rank's was.
            step_seconds = torch.tensor([t.step_seconds for t in turns], dtype=torch.float64)
            dist.all_reduce(step_seconds)
            step_busy = torch.tensor([t.step_busy for t in turns], dtype=torch.float64)
            dist.all_reduce(step_busy, op=dist.ReduceOp.MAX)
            for turn, secs, busy in zip(turns, (step_seconds / env.world_size).tolist(),
                                        step_busy.tolist(), strict=True):
                turn.step_seconds, turn.step_busy = secs, [b > 0 for b in busy]
        for turn, secs, tx, near in zip(turns, seconds.tolist(), sent.tolist(), beside,
                                        strict=True):
            if turn.cycle == 0 or turn.cycle > cycles:  # the warm-up; a closing bracket turn
                continue
            row: dict[str, Any] = {
                "arm": turn.arm, "seed": seed, "repeat": turn.cycle - 1, "interleave": block,
                "examples_per_s": examples / secs, "train_seconds": secs,
                "eval_auc": math.nan, "eval_ne": math.nan, "eval_calibration": math.nan,
            }
            if base is not None:
                row["baseline_examples_per_s"] = examples / near
            if turn.arm in wrapper.children:
                row.update(sync_syncs_applied=turn.syncs_applied,
                           sync_bytes_reduced=turn.bytes_reduced,
                           sync_round_cost=turn.round_cost, sync_busy_share=turn.busy_share,
                           sync_round_steps=turn.round_steps,
                           sync_gap_mean=turn.gap())
            if on_wire:
                row["wire_bytes"] = tx
            if trace:
                row.update(step_seconds=turn.step_seconds, step_busy=turn.step_busy)
            rows.append(row)
        if env.rank == 0:
            print(f"seed {seed}: {cycles} cycles of {per_cycle} turns of {block} steps; the "
                  f"model after the final consensus: AUC {summary['eval_auc']:.4f}, "
                  f"NE {summary['eval_ne']:.4f}", flush=True)
    return rows


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
    parser.add_argument("--device-step-ms", type=float, default=0.0, metavar="D",
                        help="emulate a GPU trainer: every arm's training thread waits D ms "
                             "after each step without holding a core or the GIL (DeviceWait)")
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
    try:
        callbacks = [DeviceWait(args.device_step_ms)] if args.device_step_ms else []
    except ValueError as e:
        parser.error(f"--device-step-ms: {e}")
    env = init_distributed(300.0)
    if args.interleave:
        rows = run_interleaved(env, args.config, common, arms, args.seeds, args.repeats,
                               args.interleave, args.bracket, args.trace, callbacks)
    else:
        rows = run_all(env, args.config, common, arms, args.seeds, args.repeats, callbacks)
    for row in rows:
        row["device_step_ms"] = args.device_step_ms
    if env.rank == 0:
        runs = (f"turns of {args.interleave} steps{', bracketed' if args.bracket else ''}, "
                f"{args.repeats} timed cycle(s)"
                if args.interleave else
                f"steps {args.steps or 'from config'}, {args.repeats} repeat(s)")
        device = (f", a device wait of {args.device_step_ms:g} ms a step"
                  if args.device_step_ms else "")
        print(f"\n{env.world_size} ranks on {env.device}, config {args.config} "
              f"{' '.join(args.overrides)}; {runs}, seeds {args.seeds}{device}\n")
        if args.json:  # before the table: a long job's runs outlive a failure to report them
            write_json(args.json, rows)
        print(table(aggregate(rows)))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
