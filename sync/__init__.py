"""Background (ShadowSync) and fixed-rate synchronization of dense replicas.

Stands alone: it needs PyTorch and ``torch.distributed``, never the pipeline, and TorchRec only
for the ``DistributedModelParallel`` wrappers in :mod:`.wrapper`. The settings and the
algorithm registry (:mod:`.config`) import without torch; the rest loads on first use.

========================  ===============================================================
module                    what
========================  ===============================================================
:mod:`.config`            the ``sync.*`` settings, their ranges, the strategy registry
:mod:`.strategies`        MA, EASGD, BMUF: pure tensor math, snapshot -> delta
:mod:`.round`             one round, read in one place: snapshot, reduce input, allreduce
                          with the control slots, delta, apply; the replica sets it carries
:mod:`.protocol`          a round's buffer layout, control slots, chunked allreduce, wire
:mod:`.runner`            what both runners share, and the fixed-rate runner
:mod:`.shadow`            the shadow runner: its thread, schedule and stop
:mod:`.handoff`           the training thread / sync thread meeting point
:mod:`.pacing`            the pacers and the agreed pause in steps
:mod:`.lifecycle`         a runner's states and the calls each allows
:mod:`.machine`           the state machine every layer's states are kept in
:mod:`.errors`            the synchronizer's exceptions and the failure sink
:mod:`.telemetry`         counters and :class:`SyncStats`
:mod:`.clock`             the injected clock (:class:`ManualClock` for tests)
:mod:`.wrapper`           the seam to TorchRec's ``DistributedModelParallel``
========================  ===============================================================

Example (plain PyTorch, every rank)::

    from shadowsync.sync import (ModelAveraging, ReplicaSet, ShadowSyncRunner, broadcast_,
                                 new_sync_group)

    params = list(model.parameters())
    broadcast_(params)                          # replicas start identical
    runner = ShadowSyncRunner(ReplicaSet(params, ModelAveraging()), new_sync_group("gloo"))
    runner.start()
    for x, y in batches:
        loss_fn(model(x), y).backward(); optimizer.step(); optimizer.zero_grad()
        runner.step()                           # adds a finished round's delta
    runner.stop()                               # final sync: identical replicas
"""

from typing import Any

from shadowsync.sync.config import ALGORITHMS, Algorithm, SyncConfig

_LAZY = {
    "ManualClock": "clock",
    "SyncError": "errors",
    "FixedRateOptions": "runner",
    "FixedRateSyncRunner": "runner",
    "SyncRunner": "runner",
    "ShadowOptions": "shadow",
    "ShadowSyncRunner": "shadow",
    "ReplicaSet": "round",
    "SyncStats": "telemetry",
    "average_": "groups",
    "broadcast_": "groups",
    "new_sync_group": "groups",
    "BlockwiseModelUpdateFiltering": "strategies",
    "ElasticAveraging": "strategies",
    "ModelAveraging": "strategies",
    "SyncStrategy": "strategies",
}

__all__ = ["ALGORITHMS", "Algorithm", "SyncConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"shadowsync.sync.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
