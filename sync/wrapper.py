"""Dense-replica wrappers for TorchRec's ``DistributedModelParallel``.

TorchRec shards the embedding tables model-parallel and hands every parameter it did not shard
(the dense part, and tables sharded ``data_parallel``) to a ``DataParallelWrapper``. The wrappers
here are that seam: :class:`LocalReplicas` leaves each rank its own replica (the ``none``
baseline), :class:`DDPReplicas` is TorchRec's default DDP (the ``ddp`` baseline), and the
ShadowSync wrapper adds a background synchronizer on top of :class:`LocalReplicas`. The training
loop talks to all of them through the same small hooks (``after_step``, ``finish``, ``stats``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torchrec.distributed.model_parallel import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
    get_unwrapped_module,
)
from torchrec.distributed.types import ShardingEnv

from shadowsync.sync.config import ALGORITHMS, SyncConfig
from shadowsync.sync.runner import (
    FixedRateSyncRunner,
    NonFiniteError,
    ShadowSyncRunner,
    SyncError,
    SyncRunner,
    average_,
    new_sync_group,
)
from shadowsync.sync.strategies import SyncStrategy

logger = logging.getLogger(__name__)


def dense_parameters(dmp: nn.Module) -> dict[str, nn.Parameter]:
    """Every parameter TorchRec did not shard (the dense replica), by name in the unwrapped
    module. Tables sharded ``data_parallel`` are not among them: see
    :func:`data_parallel_table_parameters`."""
    module = get_unwrapped_module(dmp)
    sharded = set(DistributedModelParallel._sharded_parameter_names(module))
    return {n: p for n, p in module.named_parameters() if n not in sharded and p.requires_grad}


def data_parallel_table_parameters(dmp: DistributedModelParallel) -> dict[str, nn.Parameter]:
    """Weights of the tables the plan shards ``data_parallel``.

    TorchRec 1.8 counts them as sharded and wraps their lookup in its own DDP, so their
    gradients are allreduced inside backward and the replicas stay identical whatever the dense
    wrapper does; but no fused optimizer steps them (``apply_optimizer_in_backward`` does not
    reach them), so without an explicit optimizer they never train.
    """
    params = dict(get_unwrapped_module(dmp).named_parameters())
    out = {}
    for path, module_plan in dmp.plan.plan.items():
        for table, ps in module_plan.items():
            if ps.sharding_type == "data_parallel":
                name = f"{path}.embedding_bags.{table}.weight"
                if name not in params:
                    raise RuntimeError(f"data-parallel table {table}: no parameter {name}")
                out[name] = params[name]
    return out


class ReplicaHooks:
    """What the training loop calls on every wrapper; the baselines do nothing here."""

    # Called with a synchronizer failure that will stop training (``sync.on_failure=raise``,
    # or a non-finite replica), from the thread that found it; set by the trainer.
    failure_hook: Callable[[BaseException], None] | None = None

    def after_step(self) -> None:
        """Called between steps (after the optimizer step, before the next forward)."""

    def pause(self, consensus: bool) -> None:
        """Called before evaluation, checkpointing or restoring: replicas must hold still.

        With ``consensus`` the replicas end identical (the model evaluated or saved is one
        model, and an interrupted run resumes exactly where an uninterrupted one would be).
        """

    def resume(self) -> None:
        """Called after :meth:`pause`."""

    def finish(self) -> None:
        """Called once at the end of training, on every rank."""

    def failed(self) -> bool:
        """Whether synchronization failed on this rank and waits for :meth:`degrade`."""
        return False

    def degrade(self, ranks: list[int]) -> None:
        """Called on every rank at the same step once the ranks agree that synchronization
        failed on ``ranks``."""
        del ranks

    def stats(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    def close(self) -> None:
        """Destroys the process groups this wrapper made (after :meth:`finish`, every rank)."""

    def sync_failure(self) -> BaseException | None:
        """The synchronizer's recorded failure on this rank, if any (see
        :meth:`~.runner.SyncRunner.failure`)."""
        return None

    @classmethod
    def from_config(cls, cfg: SyncConfig) -> ReplicaHooks:
        """The wrapper for ``cfg`` (a baseline reads none of it)."""
        del cfg
        return cls()


class LocalReplicas(DataParallelWrapper, ReplicaHooks):
    """Each rank keeps its own dense replica; they start identical by one broadcast from rank 0.

    The module is left unwrapped (no DDP), so tracing by TorchRec's train pipeline and
    ``state_dict`` keep working, and nothing couples the ranks' backward passes.
    """

    def __init__(self) -> None:
        self.params: dict[str, nn.Parameter] = {}
        self.group: dist.ProcessGroup | None = None

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        self.params = dense_parameters(dmp)
        self.group = env.process_group
        with torch.no_grad():
            for p in self.params.values():
                dist.broadcast(p.data, src=0, group=self.group)


class DDPReplicas(DefaultDataParallelWrapper, ReplicaHooks):
    """TorchRec's default: DDP allreduces dense gradients inside every backward pass."""


class PeriodicAveragerReplicas(LocalReplicas):
    """PyTorch's own ``PeriodicModelAverager`` (local SGD, Lin et al., arXiv 1808.07217) on the
    local replicas: an outside reference for the fixed-rate MA arm, run by PyTorch's code.

    It averages in the training thread on the default group every ``period`` steps and has no
    final consensus of its own, so evaluation and checkpoints see the ranks' own replicas.
    """

    def __init__(self, period: int) -> None:
        super().__init__()
        self.period = period
        self.averager: PeriodicModelAverager | None = None

    @classmethod
    def from_config(cls, cfg: SyncConfig) -> PeriodicAveragerReplicas:
        return cls(cfg.period)

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        super().wrap(dmp, env, device)
        self.averager = PeriodicModelAverager(
            period=self.period, warmup_steps=0, process_group=self.group
        )

    def after_step(self) -> None:
        if self.averager is None:
            raise RuntimeError("PeriodicAveragerReplicas used before DMP wrapped it")
        self.averager.average_parameters(list(self.params.values()))

    def stats(self) -> dict[str, float]:
        step = self.averager.step if self.averager is not None else 0
        return {"steps": float(step), "syncs_applied": float(-(-step // self.period))}


def make_strategy(cfg: SyncConfig) -> SyncStrategy:
    """The ShadowSync strategy registered as ``sync.algorithm``, with its settings."""
    entry = ALGORITHMS.get(cfg.algorithm)
    if not entry.strategy:
        raise ValueError(f"sync.algorithm: {cfg.algorithm!r} is not a ShadowSync strategy")
    strategy: SyncStrategy = entry.load().from_config(cfg)
    return strategy


def build_replica_wrapper(cfg: SyncConfig) -> LocalReplicas | DDPReplicas:
    """The data-parallel wrapper for ``sync.algorithm`` (see
    :data:`~shadowsync.sync.config.ALGORITHMS`): a ShadowSync strategy runs in
    :class:`ShadowSyncReplicas`, a baseline is its own wrapper.

    Example::

        dmp = DistributedModelParallel(model, device=device,
                                       data_parallel_wrapper=build_replica_wrapper(cfg.sync))
    """
    cfg.validate()
    entry = ALGORITHMS.get(cfg.algorithm)
    if entry.strategy:
        return ShadowSyncReplicas.from_config(cfg)
    wrapper: LocalReplicas | DDPReplicas = entry.load().from_config(cfg)
    return wrapper


class Phase(enum.Enum):
    """Where a :class:`ShadowSyncReplicas` is in its lifecycle (see its transition table)."""

    UNWRAPPED = "unwrapped"  # built; DistributedModelParallel has not wrapped it yet
    RUNNING = "running"  # the runner synchronizes (in the background or every period steps)
    FAILED = "failed"  # the runner failed on this rank; the ranks have not agreed yet
    DEGRADED = "degraded"  # no runner: every rank trains its own replica until the rejoin
    PAUSED = "paused"  # the runner is stopped (an evaluation or checkpoint reads the model)
    FINISHED = "finished"  # stopped for good, with the final consensus


class ShadowSyncReplicas(LocalReplicas):
    """Local replicas kept close by a :class:`~shadowsync.sync.runner.SyncRunner`.

    ``mode: shadow`` runs the strategy on a background thread with its own process group (the
    training loop only adds finished deltas between steps); ``mode: fixed_rate`` runs the same
    strategy blocking every ``period`` steps. The runner starts inside :meth:`wrap`, right
    after the broadcast that makes the replicas identical.

    Failures (``sync.on_failure``): with ``raise`` a :class:`~.runner.SyncError` from a step
    ends training. With ``degrade`` this rank keeps training its replica and reports
    :meth:`failed`; once the ranks agree (the trainer's control exchange), :meth:`degrade`
    drops the runner on every rank at the same step, and ``sync.rejoin_after_steps`` steps
    later, or at the next :meth:`pause` if sooner, the ranks average their replicas on a fresh
    group and start a fresh runner (strategy state such as BMUF momentum starts over). A
    failure while pausing (the stop round or the final consensus) always raises: the ranks
    may disagree on whether that round happened. A NaN/inf replica always raises.

    Lifecycle (:class:`Phase`); a call not listed for a phase raises ``RuntimeError``:

    ==========  ==================================  ==========================================
    phase       call                                next phase
    ==========  ==================================  ==========================================
    UNWRAPPED   ``wrap`` (DMP)                      RUNNING
    RUNNING     ``after_step``                      RUNNING; FAILED on a SyncError (degrade)
    RUNNING     ``degrade`` (a peer failed)         DEGRADED (runner abandoned)
    RUNNING     ``pause``                           PAUSED (runner stopped, consensus if asked)
    RUNNING     ``finish``                          FINISHED (stopped with consensus)
    FAILED      ``after_step``                      FAILED (the local replica trains on)
    FAILED      ``degrade``                         DEGRADED (runner abandoned)
    FAILED      ``pause`` / ``finish``              raises the runner's SyncError
    DEGRADED    ``after_step``                      DEGRADED; RUNNING at the rejoin step
    DEGRADED    ``degrade``                         DEGRADED (the rejoin step moves on)
    DEGRADED    ``pause`` / ``finish``              rejoin, then PAUSED / FINISHED
    PAUSED      ``pause``                           PAUSED
    PAUSED      ``resume``                          RUNNING (runner restarted)
    PAUSED      ``finish``                          FINISHED
    FINISHED    ``pause`` / ``resume`` / ``finish``  FINISHED
    FINISHED    ``close``                           FINISHED (its groups destroyed)
    ==========  ==================================  ==========================================

    Example::

        wrapper = ShadowSyncReplicas(SyncConfig(algorithm="ma", mode="shadow"))
        dmp = DistributedModelParallel(model, device=device, data_parallel_wrapper=wrapper)
        for batch in data:
            pipeline.progress(batch_iter)
            wrapper.after_step()
        wrapper.finish()          # every rank: stop, final sync, replicas identical
    """

    def __init__(self, cfg: SyncConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.runner: SyncRunner | None = None
        self.phase = Phase.UNWRAPPED
        self._backend = "gloo"
        self._steps = 0
        self._steps_since_consensus = 0
        self._rejoin_at = 0  # the step of the rejoin, in DEGRADED
        self._failures = 0
        self._groups: list[dist.ProcessGroup] = []

    @classmethod
    def from_config(cls, cfg: SyncConfig) -> ShadowSyncReplicas:
        make_strategy(cfg)  # fail on a bad setting before any collective
        return cls(cfg)

    def _expect(self, call: str, *phases: Phase) -> None:
        if self.phase not in phases:
            raise RuntimeError(f"ShadowSyncReplicas.{call}() in phase {self.phase.name} "
                               f"(allowed in {[p.name for p in phases]})")

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        self._expect("wrap", Phase.UNWRAPPED)
        super().wrap(dmp, env, device)
        self._backend = self.cfg.backend if device.type == "cuda" else "gloo"
        self._start_runner(self._new_group())

    def _new_group(self) -> dist.ProcessGroup:
        group = new_sync_group(self._backend, timedelta(seconds=self.cfg.timeout_s),
                               self.cfg.socket_ifname)
        self._groups.append(group)
        return group

    def close(self) -> None:
        """Destroys every sync group made (the first, and one per rejoin); after :meth:`finish`
        on every rank: the runner is stopped, so none of them is in use."""
        self._expect("close", Phase.FINISHED, Phase.UNWRAPPED)
        for group in self._groups:
            dist.destroy_process_group(group)
        self._groups.clear()

    def _start_runner(self, group: dist.ProcessGroup) -> None:
        cfg = self.cfg
        params = list(self.params.values())
        chunk = None if cfg.chunk_mb is None else max(16, int(cfg.chunk_mb * 2**20))
        if cfg.mode == "fixed_rate":
            self.runner = FixedRateSyncRunner(params, make_strategy(cfg), group, period=cfg.period,
                                              chunk_bytes=chunk)
        else:
            self.runner = ShadowSyncRunner(
                params,
                make_strategy(cfg),
                group,
                min_interval_s=cfg.min_interval_s,
                max_comm_share=cfg.max_comm_share if cfg.max_comm_share is not None else 1.0,
                max_slowdown=cfg.max_slowdown,
                slowdown_window=cfg.slowdown_window,
                chunk_bytes=chunk,
                deadline_s=cfg.timeout_s,
                thread_nice=cfg.thread_nice,
                max_staleness=cfg.max_staleness,
            )
        self.runner.on_failure = self._report
        self.runner.start()
        self.phase = Phase.RUNNING

    def _report(self, error: SyncError) -> None:
        if self.failure_hook is not None and (self.cfg.on_failure == "raise"
                                              or isinstance(error, NonFiniteError)):
            self.failure_hook(error)

    def _runner(self) -> SyncRunner:
        if self.runner is None:
            raise RuntimeError("ShadowSyncReplicas used before DistributedModelParallel wrapped it")
        return self.runner

    def after_step(self) -> None:
        self._expect("after_step", Phase.RUNNING, Phase.FAILED, Phase.DEGRADED)
        self._steps += 1
        self._steps_since_consensus += 1
        if self.phase is Phase.DEGRADED:
            if self._steps >= self._rejoin_at:
                self._rejoin()
            return
        if self.phase is Phase.FAILED:
            return
        try:
            self._runner().step()
        except SyncError as e:
            # A NaN/inf replica is the model's failure, not the synchronizer's: degrading
            # around it would average it into every replica at the rejoin.
            if self.cfg.on_failure == "raise" or isinstance(e, NonFiniteError):
                raise
            self.phase = Phase.FAILED
            logger.warning("%s; training the local replica (sync.on_failure=degrade)", e)

    def failed(self) -> bool:
        return self.phase is Phase.FAILED

    def sync_failure(self) -> BaseException | None:
        return None if self.runner is None else self.runner.failure()

    def degrade(self, ranks: list[int]) -> None:
        self._expect("degrade", Phase.RUNNING, Phase.FAILED, Phase.DEGRADED)
        if self.phase is not Phase.DEGRADED:
            self._runner().abandon()
            self._failures += 1
        self.phase = Phase.DEGRADED
        self._rejoin_at = self._steps + self.cfg.rejoin_after_steps
        if self.group is None or dist.get_rank(self.group) == 0:
            logger.warning(
                "synchronization failed on rank(s) %s: every rank trains its own replica and "
                "rejoins in %d steps (sync.rejoin_after_steps) or at the next checkpoint or "
                "evaluation", ranks, self.cfg.rejoin_after_steps)

    def _rejoin(self) -> None:
        """Collective: average the replicas over a fresh group and start a fresh runner."""
        group = self._new_group()
        average_(list(self.params.values()), group)
        self._steps_since_consensus = 0
        self._start_runner(group)
        logger.info("rank %d: synchronization rejoined on a fresh group with averaged replicas",
                    dist.get_rank())

    def pause(self, consensus: bool) -> None:
        if self.phase is Phase.DEGRADED:
            self._rejoin()
        if self.phase not in (Phase.RUNNING, Phase.FAILED):
            self._runner()  # raises before DMP wrapped it; else already still
            return
        # A consensus right after another (say a checkpoint at the last step, then finish())
        # would be a second strategy round on identical replicas; BMUF's would still move them.
        consensus = consensus and self.cfg.final_sync and self._steps_since_consensus > 0
        self._runner().stop(final_sync=consensus)
        self.phase = Phase.PAUSED
        if consensus:
            self._steps_since_consensus = 0

    def resume(self) -> None:
        self._expect("resume", Phase.PAUSED, Phase.FINISHED)
        if self.phase is Phase.PAUSED:
            self._runner().start()
            self.phase = Phase.RUNNING

    def finish(self) -> None:
        self.pause(consensus=True)
        self.phase = Phase.FINISHED

    def stats(self) -> dict[str, float]:
        """The runner's telemetry; a statistic not defined yet (NaN: no sync so far, no
        accepted-slowdown pacer) is left out rather than reported as a number."""
        s = dataclasses.asdict(self._runner().stats())
        return {**{k: float(v) for k, v in s.items() if not math.isnan(v)},
                "failures": float(self._failures)}

    def state_dict(self) -> dict[str, Any]:
        return self._runner().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._runner().load_state_dict(state)
