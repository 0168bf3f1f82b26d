"""The runner of ``sync.schedule.mode``, built from a :class:`~.config.SyncConfig`."""

from __future__ import annotations

import torch.distributed as dist

from shadowsync.sync.config import SyncConfig
from shadowsync.sync.round import ReplicaSet
from shadowsync.sync.runner import FixedRateOptions, FixedRateSyncRunner, OnFailure, SyncRunner
from shadowsync.sync.shadow import ShadowOptions, ShadowSyncRunner

__all__ = ["new_runner"]


def new_runner(cfg: SyncConfig, replicas: list[ReplicaSet], group: dist.ProcessGroup,
               on_failure: OnFailure | None) -> SyncRunner:
    """A runner of ``cfg``'s mode over ``replicas`` on ``group``, not started."""
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
