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
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv, ShardingEnv2D

from shadowsync.sync.baselines import (
    DDPReplicas,
    LocalReplicas,
    PeriodicAveragerReplicas,
    ReplicaHooks,
    data_parallel_table_parameters,
    dense_parameters,
    embedding_optimizer_state,
    embedding_shards,
)
from shadowsync.sync.config import SyncConfig
from shadowsync.sync.errors import FailureSink, NonFiniteError, SyncError
from shadowsync.sync.groups import average_, broadcast_
from shadowsync.sync.machine import Machine
from shadowsync.sync.modes import SyncGroups, new_runner, replica_sets, sync_groups
from shadowsync.sync.runner import SyncRunner
from shadowsync.sync.strategies import make_strategy

__all__ = ["PHASES", "DDPReplicas", "LocalReplicas", "PeriodicAveragerReplicas", "Phase",
           "ReplicaHooks", "ShadowSyncReplicas", "build_replica_wrapper",
           "data_parallel_table_parameters", "dense_parameters"]

logger = logging.getLogger(__name__)


def build_replica_wrapper(cfg: SyncConfig, failures: FailureSink | None = None,
                          ) -> LocalReplicas | DDPReplicas:
    """The data-parallel wrapper for ``sync.strategy`` (see
    :data:`~shadowsync.sync.config.ALGORITHMS`): a ShadowSync strategy runs in
    :class:`ShadowSyncReplicas`, which reports its own failures to ``failures``; a baseline
    is its own wrapper.

    Example::

        dmp = DistributedModelParallel(model, device=device,
                                       data_parallel_wrapper=build_replica_wrapper(cfg.sync))
    """
    cfg.validate()
    if cfg.algorithm.strategy:
        return ShadowSyncReplicas.from_config(cfg, failures)
    wrapper: LocalReplicas | DDPReplicas = cfg.algorithm.load().from_config(cfg)
    return wrapper


class Phase(enum.Enum):
    """Where a :class:`ShadowSyncReplicas` is in its lifecycle (see :data:`PHASES`)."""

    UNWRAPPED = "unwrapped"  # built; DistributedModelParallel has not wrapped it yet
    RUNNING = "running"  # the runner synchronizes (in the background or every period steps)
    FAILED = "failed"  # the runner failed on this rank; the ranks have not agreed yet
    DEGRADED = "degraded"  # no runner: every rank trains its own replica until the rejoin
    PAUSED = "paused"  # the runner is stopped (an evaluation or checkpoint reads the model)
    FINISHED = "finished"  # stopped for good, replicas merged
    ABANDONED = "abandoned"  # training failed; the runner was dropped without a collective


_P = Phase
# ``fail`` (a round failed, with degrade) and ``rejoin`` are what ``after_step`` moves on to.
PHASES: dict[tuple[Phase, str], Phase] = {
    (_P.UNWRAPPED, "wrap"): _P.RUNNING,
    (_P.UNWRAPPED, "close"): _P.UNWRAPPED,
    (_P.RUNNING, "after_step"): _P.RUNNING,
    (_P.RUNNING, "fail"): _P.FAILED,
    (_P.RUNNING, "degrade"): _P.DEGRADED,
    (_P.RUNNING, "pause"): _P.PAUSED,
    (_P.RUNNING, "finish"): _P.FINISHED,
    (_P.FAILED, "after_step"): _P.FAILED,
    (_P.FAILED, "degrade"): _P.DEGRADED,
    (_P.FAILED, "pause"): _P.PAUSED,
    (_P.FAILED, "finish"): _P.FINISHED,
    (_P.DEGRADED, "after_step"): _P.DEGRADED,
    (_P.DEGRADED, "rejoin"): _P.RUNNING,
    (_P.DEGRADED, "degrade"): _P.DEGRADED,
    (_P.DEGRADED, "pause"): _P.PAUSED,
    (_P.DEGRADED, "finish"): _P.FINISHED,
    (_P.PAUSED, "pause"): _P.PAUSED,
    (_P.PAUSED, "resume"): _P.RUNNING,
    (_P.PAUSED, "finish"): _P.FINISHED,
    **{(_P.FINISHED, c): _P.FINISHED for c in ("pause", "resume", "finish", "close")},
    **{(p, "abandon"): _P.ABANDONED for p in Phase},
}


class ShadowSyncReplicas(LocalReplicas):
    """Local replicas kept close by a :class:`~shadowsync.sync.runner.SyncRunner`.

    ``sync.schedule.mode: shadow`` runs the strategy on a background thread with its own
    process group (the training loop only adds finished deltas between steps); ``fixed_rate``
    runs the same strategy blocking every ``period`` steps. The runner starts inside
    :meth:`wrap`, right after the broadcast that makes the replicas identical. This rank's own
    failures go to ``failures`` (the trainer's fault domain) as they happen: a failure that
    will stop training (``on_failure: raise``, or a non-finite replica) to its ``claim``, and
    :meth:`own_stall` is registered with its ``watch_sync``.

    **Failures** (``sync.failure.on_failure``), wherever they surface:

    ======================  ===========================  ======================================
    where                   ``raise``                    ``degrade``
    ======================  ===========================  ======================================
    in a round (strategy,   the next ``after_step``      this rank trains its replica on
    collective, a peer's    raises ``SyncError`` naming  (FAILED); at the trainer's next control
    abort) or a stall       the rank; peers get the      exchange every rank degrades on one
    (``timeout_s``)         abort flag and raise too     step; rejoin after
                                                         ``rejoin_after_steps`` on a fresh
                                                         group, replicas averaged
    at a step boundary      the same (the K-th step's    the same
    (``max_staleness``)     wait is bounded by the
                            stall deadline)
    at ``pause`` (a         ``pause`` raises; no         the ranks agree at once (one tiny
    checkpoint, an          checkpoint is written, the   allreduce on the training group),
    evaluation) or          job fails                    degrade on this step and merge on a
    ``finish`` (the end)                                 fresh group (replicas averaged); the
                                                         checkpoint, evaluation or end goes on
    a non-finite replica    ``NonFiniteError`` in        the same: never degraded around (it
    or delta                either mode                  would be averaged into every replica)
    in training itself      the trainer calls            the same
                            :meth:`abandon`: the runner
                            is dropped, its thread
                            leaves
    ======================  ===========================  ======================================

    Lifecycle (:data:`PHASES`, checked against this table by a test); a call a phase does not
    list raises ``RuntimeError``:

    ==========  ==============  ==================================================
    phase       call            next phase
    ==========  ==============  ==================================================
    UNWRAPPED   ``wrap``        RUNNING (DMP wraps it; the runner starts)
    UNWRAPPED   ``close``       UNWRAPPED
    RUNNING     ``after_step``  RUNNING
    RUNNING     ``fail``        FAILED: ``after_step`` met a SyncError (degrade)
    RUNNING     ``degrade``     DEGRADED: a peer failed; the runner is abandoned
    RUNNING     ``pause``       PAUSED: the runner stopped, consensus if asked; on
                                a failure there (degrade) the ranks agree, degrade
                                and merge first
    RUNNING     ``finish``      FINISHED: a pause with consensus
    FAILED      ``after_step``  FAILED: the local replica trains on
    FAILED      ``degrade``     DEGRADED: the runner is abandoned
    FAILED      ``pause``       PAUSED: the ranks agree, degrade and merge
    FAILED      ``finish``      FINISHED: the same, then finished
    DEGRADED    ``after_step``  DEGRADED
    DEGRADED    ``rejoin``      RUNNING: ``after_step`` at the rejoin step merges
    DEGRADED    ``degrade``     DEGRADED: the rejoin step moves on
    DEGRADED    ``pause``       PAUSED: merged first
    DEGRADED    ``finish``      FINISHED: merged first
    PAUSED      ``pause``       PAUSED
    PAUSED      ``resume``      RUNNING: the runner restarts
    PAUSED      ``finish``      FINISHED
    FINISHED    ``pause``       FINISHED
    FINISHED    ``resume``      FINISHED
    FINISHED    ``finish``      FINISHED
    FINISHED    ``close``       FINISHED: its groups are destroyed
    any         ``abandon``     ABANDONED: the runner dropped, no collective
    ==========  ==============  ==================================================

    Example::

        wrapper = ShadowSyncReplicas(SyncConfig.from_dict({"strategy": {"name": "ma"}}))
        dmp = DistributedModelParallel(model, device=device, data_parallel_wrapper=wrapper)
        for batch in data:
            pipeline.progress(batch_iter)
            wrapper.after_step()
        wrapper.finish()          # every rank: stop, final sync, replicas identical
    """

    def __init__(self, cfg: SyncConfig, failures: FailureSink | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.runner: SyncRunner | None = None
        self._phases = Machine(PHASES, Phase.UNWRAPPED, lambda phase, call: (
            f"ShadowSyncReplicas.{call}() in phase {phase.name} "
            f"(allowed in {[p.name for p in self._phases.states(call)]})"))
        self._failures = failures
        self._device = torch.device("cpu")
        self._steps = 0
        self._steps_since_consensus = 0
        self._rejoin_at = 0  # the step of the rejoin, in DEGRADED
        self._failure_count = 0
        self._groups: list[dist.ProcessGroup] = []
        self._partition: list[list[int]] | None = None  # the replica groups, if any
        self._shards: list[torch.Tensor] = []  # this rank's replicated embedding shards
        self._shard_state: list[torch.Tensor] = []  # and their optimizer's state
        if failures is not None:
            failures.watch_sync(self.own_stall)

    @classmethod
    def from_config(cls, cfg: SyncConfig,
                    failures: FailureSink | None = None) -> ShadowSyncReplicas:
        make_strategy(cfg)  # fail on a bad setting before any collective
        return cls(cfg, failures)

    @property
    def phase(self) -> Phase:
        return self._phases.state

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        self._phases.check("wrap")
        self.cfg.check_device(device.type)
        super().wrap(dmp, env, device)
        self._device = device
        if isinstance(env, ShardingEnv2D):  # replica groups: the mesh's columns
            self._partition = env.device_mesh.mesh.T.tolist()
            self._shards, self._shard_state = embedding_shards(dmp), embedding_optimizer_state(dmp)
        groups = self._new_groups()
        # every replica of a shard starts as the first group's
        if self._shards and (replicas := groups.replicas) is not None:
            broadcast_(self._shards + self._shard_state, replicas,
                       src=dist.get_global_rank(replicas, 0))
        self.runner = self._new_runner(groups)
        self.runner.start()
        self._phases.move("wrap")

    def _new_groups(self) -> SyncGroups:
        """Fresh sync groups (collective; :func:`~.modes.sync_groups`)."""
        groups = sync_groups(self.cfg, self._partition)
        self._groups.extend(groups.all())
        return groups

    def _new_runner(self, groups: SyncGroups) -> SyncRunner:
        """The configured runner on ``groups`` (:meth:`_new_groups`), not started."""
        sets = replica_sets(self.cfg, list(self.params.values()), self._shards,
                            self._shard_state, groups)
        return new_runner(self.cfg, sets, groups, None if self._failures is None else self._report)

    def close(self) -> None:
        """Destroys every sync group made (the first, one per merge), after :meth:`finish`."""
        self._phases.move("close")
        for group in self._groups:
            dist.destroy_process_group(group)
        self._groups.clear()

    def _fatal(self, error: SyncError) -> bool:
        """Whether ``error`` stops training: ``on_failure: raise``, or a non-finite replica,
        never degraded around (the model's failure would be averaged into every replica)."""
        return self.cfg.failure.on_failure == "raise" or isinstance(error, NonFiniteError)

    def _report(self, error: SyncError) -> None:
        """The runner's failure hook: what will stop training goes to the fault domain."""
        if self._failures is not None and self._fatal(error):
            self._failures.claim(error)

    def _runner(self) -> SyncRunner:
        if self.runner is None:
            raise RuntimeError("ShadowSyncReplicas used before DistributedModelParallel wrapped it")
        return self.runner

    def _tolerate(self, error: SyncError) -> None:
        """Re-raises ``error`` unless ``degrade`` covers it."""
        if self._fatal(error):
            raise error
        logger.warning("%s; training the local replica (sync.failure.on_failure=degrade)", error)

    def after_step(self) -> None:
        self._phases.check("after_step")
        self._steps += 1
        self._steps_since_consensus += 1
        phase = self.phase
        if phase is Phase.DEGRADED and self._steps >= self._rejoin_at:
            self._merge()
            self._runner().start()
            self._phases.move("rejoin")
            return
        if phase is Phase.RUNNING:
            try:
                self._runner().step()
            except SyncError as e:
                self._tolerate(e)
                self._phases.move("fail")
                return
        self._phases.move("after_step")

    def failed(self) -> bool:
        return self.phase is Phase.FAILED

    def sync_failure(self) -> BaseException | None:
        return None if self.runner is None else self.runner.failure()

    def own_stall(self) -> BaseException | None:
        """Any thread: see :meth:`~.runner.SyncRunner.own_stall`; with ``degrade`` the ranks
        agree on a stall where training finds it instead (None)."""
        runner = self.runner
        if self.cfg.failure.on_failure != "raise" or runner is None \
                or self.phase is not Phase.RUNNING:
            return None
        return runner.own_stall()

    def degrade(self, ranks: list[int]) -> None:
        self._phases.check("degrade")
        if self.phase is not Phase.DEGRADED:
            self._runner().abandon()
            self._failure_count += 1
        self._phases.move("degrade")
        self._rejoin_at = self._steps + self.cfg.failure.rejoin_after_steps
        if self.group is None or dist.get_rank(self.group) == 0:
            logger.warning(
                "synchronization failed on rank(s) %s: every rank trains its own replica and "
                "rejoins in %d steps (sync.failure.rejoin_after_steps) or at the next "
                "checkpoint, evaluation or the end", ranks, self.cfg.failure.rejoin_after_steps)

    def _failed_ranks(self, failed: bool) -> list[int]:
        """Collective on the training group: the ranks whose synchronizer failed."""
        flags = torch.zeros(dist.get_world_size(self.group), device=self._device)
        flags[dist.get_rank(self.group)] = float(failed)
        dist.all_reduce(flags, group=self.group)
        return [r for r, flag in enumerate(flags.tolist()) if flag > 0]

    def _merge(self) -> None:
        """Collective: average the replicas over a fresh group, with a fresh runner (not
        started: strategy state such as BMUF momentum starts over)."""
        groups = self._new_groups()
        average_(list(self.params.values()), groups.world)
        if self._shards and groups.replicas is not None:
            average_(self._shards + self._shard_state, groups.replicas)
        self.runner = self._new_runner(groups)
        self._steps_since_consensus = 0
        logger.info("rank %d: synchronization rejoined on a fresh group with averaged replicas",
                    dist.get_rank())

    def pause(self, consensus: bool) -> None:
        self._phases.check("pause")
        if self.phase in (Phase.PAUSED, Phase.FINISHED):
            self._phases.move("pause")
            return
        if self.phase is not Phase.DEGRADED:
            failed = self.phase is Phase.FAILED
            if not failed:
                try:
                    self._runner().stop(final_sync=False)
                except SyncError as e:
                    self._tolerate(e)
                    failed = True
            if self.cfg.failure.on_failure == "degrade":  # else a failure raised above
                ranks = self._failed_ranks(failed)
                if ranks:
                    self.degrade(ranks)
        if self.phase is Phase.DEGRADED:
            self._merge()
        # A consensus right after another (say a checkpoint at the last step, then
        # finish()) would be a second round on identical replicas; BMUF's still moves them.
        elif consensus and self.cfg.schedule.final_sync and self._steps_since_consensus > 0:
            self._runner().consensus()
            self._steps_since_consensus = 0
        self._phases.move("pause")

    def resume(self) -> None:
        self._phases.check("resume")
        if self.phase is Phase.PAUSED:
            self._runner().start()
        self._phases.move("resume")

    def finish(self) -> None:
        self._phases.check("finish")
        self.pause(consensus=True)
        self._phases.move("finish")

    def abandon(self) -> None:
        if self.runner is not None and self.phase is not Phase.ABANDONED:
            self.runner.abandon()
        self._phases.move("abandon")

    def stats(self) -> dict[str, float]:
        """The runner's telemetry; a statistic not defined yet (NaN: no sync so far, no
        accepted-slowdown pacer) is left out rather than reported as a number."""
        s = dataclasses.asdict(self._runner().stats())
        return {**{k: float(v) for k, v in s.items() if not math.isnan(v)},
                "failures": float(self._failure_count)}

    def state_dict(self) -> dict[str, Any]:
        return self._runner().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._runner().load_state_dict(state)
