"""The runner of ``sync.schedule.mode`` and the replica sets it synchronizes, built from a
:class:`~.config.SyncConfig`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist
from torch import Tensor

from shadowsync.sync.config import SyncConfig
from shadowsync.sync.groups import new_sync_group
from shadowsync.sync.protocol import Levels
from shadowsync.sync.round import ReplicaSet
from shadowsync.sync.rows import by_rows
from shadowsync.sync.runner import FixedRateOptions, FixedRateSyncRunner, OnFailure, SyncRunner
from shadowsync.sync.shadow import ShadowOptions, ShadowSyncRunner
from shadowsync.sync.strategies import ModelAveraging, make_strategy

__all__ = ["SyncGroups", "new_runner", "replica_sets", "sync_groups"]


@dataclasses.dataclass(frozen=True)
class SyncGroups:
    """A runner's process groups: ``world`` over every rank; with replica groups this rank's
    ``replicas`` (the ranks that hold its shards) and, with ``sync.transport.two_level``, its
    ``layout`` group (a host's ranks), over which the dense round sums in two levels."""

    world: dist.ProcessGroup
    replicas: dist.ProcessGroup | None = None
    layout: dist.ProcessGroup | None = None

    @property
    def dense(self) -> dist.ProcessGroup | Levels:
        """What the dense round sums over (:class:`~.protocol.Levels` with a layout group)."""
        if self.layout is None or self.replicas is None:
            return self.world
        return Levels(self.world, self.layout, self.replicas)

    def all(self) -> list[dist.ProcessGroup]:
        return [g for g in (self.world, self.replicas, self.layout) if g is not None]


def sync_groups(cfg: SyncConfig, partition: Sequence[Sequence[int]] | None) -> SyncGroups:
    """Collective, on every rank in the same order: fresh :class:`SyncGroups` (``partition``:
    the replica groups, the ranks that hold the same shards, one part each; a layout group is
    the parts' members at one index)."""
    t = cfg.transport
    make = functools.partial(new_sync_group, t.backend, timedelta(seconds=cfg.failure.timeout_s),
                             t.socket_ifname)
    if not partition:
        return SyncGroups(make())
    rows = [list(r) for r in zip(*partition, strict=True)]
    return SyncGroups(make(), make(partition=partition),
                      make(partition=rows) if t.two_level else None)


def replica_sets(cfg: SyncConfig, dense: list[Tensor], shards: list[Tensor],
                 shard_state: list[Tensor], groups: SyncGroups) -> list[ReplicaSet]:
    """What a runner of ``cfg`` on ``groups`` (:func:`sync_groups`) synchronizes: the
    ``dense`` replica over every rank and, with replica groups, this rank's
    embedding ``shards`` by the same strategy and their optimizer's ``shard_state`` by model
    averaging whatever the strategy (per-row statistics, not parameters: averaged as
    TorchRec's DMPCollection syncs them, so the replicas' step sizes agree). A model-averaged
    set of at least :data:`~.rows.WHOLE_BELOW_BYTES` goes by its changed rows."""
    strategy = make_strategy(cfg)
    sets = [ReplicaSet(dense, strategy)]
    if (group := groups.replicas) is not None:
        if shards:
            ours = make_strategy(cfg)
            sets.append(ReplicaSet(shards, ours, "embedding", group, by_rows(ours, shards)))
        if shard_state:
            averaging = ModelAveraging()  # in the state's own dtype: it goes by rows if large
            if not by_rows(averaging, shard_state):
                averaging = ModelAveraging(strategy.wire_dtype)  # whole, on the shards' wire
            sets.append(ReplicaSet(shard_state, averaging, "embedding optimizer state", group,
                                   by_rows(averaging, shard_state)))
    return sets


def new_runner(cfg: SyncConfig, replicas: list[ReplicaSet], groups: SyncGroups,
               on_failure: OnFailure | None) -> SyncRunner:
    """A runner of ``cfg``'s mode over ``replicas`` on ``groups`` (:func:`sync_groups`), its
    dense round over :attr:`SyncGroups.dense`, not started."""
    group = groups.dense
    schedule = cfg.schedule
    if schedule.mode == "fixed_rate":
        return FixedRateSyncRunner(replicas, group, FixedRateOptions(
            period=schedule.period, chunk_bytes=cfg.chunk_bytes), on_failure)
    return ShadowSyncRunner(replicas, group, ShadowOptions(
        min_interval_s=schedule.min_interval_s,
        max_comm_share=schedule.max_comm_share or 1.0,
        max_slowdown=schedule.max_slowdown,
        slowdown_window=schedule.slowdown_window,
        deadline_s=cfg.failure.timeout_s,
        chunk_bytes=cfg.chunk_bytes,
        thread_nice=cfg.transport.thread_nice,
        max_staleness=schedule.max_staleness,
    ), on_failure)
