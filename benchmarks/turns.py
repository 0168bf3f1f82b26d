"""Arms taking turns on one model (``bench_sync --interleave``): :class:`RotatingReplicas`
runs every arm's synchronizer on the same dense parameters in turns of a few steps, and
:func:`run_interleaved` makes one row per timed turn, timed on the slowest rank and on each
host's own (a straggler's peers keep their pace where no collective ties them to it)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv

from shadowsync.benchmarks.rows import bracket_seconds, turn_order
from shadowsync.datasets import build_dataset
from shadowsync.pipelines.build import DistEnv, local_world
from shadowsync.pipelines.callbacks import TrainCallback
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.fault_domain import FaultDomain
from shadowsync.pipelines.loop import Trainer
from shadowsync.sync.config import SyncConfig
from shadowsync.sync.errors import FailureSink
from shadowsync.sync.runner import SyncRunner
from shadowsync.sync.wrapper import LocalReplicas, ShadowSyncReplicas

__all__ = ["RotatingReplicas", "Turn", "run_interleaved", "tx_bytes"]


def tx_bytes() -> int | None:
    """Bytes this host has sent on the interface gloo uses (``GLOO_SOCKET_IFNAME``), from
    sysfs; None where that is not one interface of this network namespace (loopback runs)."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "")
    path = Path("/sys/class/net") / iface / "statistics" / "tx_bytes"
    if not iface or "," in iface or iface == "lo" or not path.exists():
        return None
    return int(path.read_text())


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
    ``block`` steps with all the training loop's own work, the switch itself outside. Every
    turn starts at a barrier of all ranks, untimed: a host that ended its last turn early
    (a fast host beside a straggler, where no collective held it back) does not carry its
    wait for the others into this turn's time. A turn's
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
            return 0, 0, tx_bytes() or 0
        s = self._runner_of(child).stats()
        return s.syncs_applied, s.bytes_reduced, tx_bytes() or 0

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
        dist.barrier()  # every rank starts the turn together (see the class's docstring)
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
    left out. One row per timed turn, with the timed seconds the slowest rank's (and each
    host's slowest, ``host_seconds``, hosts of ``LOCAL_WORLD_SIZE`` ranks) and the bytes on
    the wire summed over hosts; collective. With ``bracket`` the ``none`` arm runs before
    each other turn and once more at the end, and each row carries the examples/s of the
    ``none`` turns beside it (``baseline_examples_per_s``: their mean seconds; each host's
    own, ``host_baseline_seconds``)."""
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
        local = local_world(env.world_size)  # each host's turn: its slowest rank's
        by_host = torch.zeros(env.world_size // local, len(turns), dtype=torch.float64)
        by_host[env.rank // local] = torch.tensor([t.seconds for t in turns], dtype=torch.float64)
        dist.all_reduce(by_host, op=dist.ReduceOp.MAX)
        seconds = by_host.max(0).values
        host_beside = ([bracket_seconds([t.arm for t in turns], h, base) for h in by_host.tolist()]
                       if base is not None else [])
        sent = torch.tensor([t.tx_bytes * (env.local_rank == 0) for t in turns],  # a host once
                            dtype=torch.float64)
        dist.all_reduce(sent)
        on_wire = tx_bytes() is not None
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
        for i, (turn, secs, tx, near) in enumerate(zip(turns, seconds.tolist(), sent.tolist(),
                                                       beside, strict=True)):
            if turn.cycle == 0 or turn.cycle > cycles:  # the warm-up; a closing bracket turn
                continue
            row: dict[str, Any] = {
                "arm": turn.arm, "seed": seed, "repeat": turn.cycle - 1, "interleave": block,
                "examples_per_s": examples / secs, "train_seconds": secs,
                "host_seconds": by_host[:, i].tolist(),
                "eval_auc": math.nan, "eval_ne": math.nan, "eval_calibration": math.nan,
            }
            if base is not None:
                row["baseline_examples_per_s"] = examples / near
                row["host_baseline_seconds"] = [h[i] for h in host_beside]
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
