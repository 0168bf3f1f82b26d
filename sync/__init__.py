"""Background (ShadowSync) and fixed-rate synchronization of dense replicas.

Stands alone: it needs PyTorch and ``torch.distributed``, never the pipeline, and TorchRec only
for the ``DistributedModelParallel`` wrappers in :mod:`.wrapper`. The settings and the
algorithm registry (:mod:`.config`) import without torch; the rest loads on first use.

========================  ===============================================================
module                    what
========================  ===============================================================
:mod:`.config`            the ``sync.*`` settings, their ranges, the strategy registry
:mod:`.strategies`        MA, EASGD, BMUF: pure tensor math, snapshot -> delta
:mod:`.protocol`          a round's buffer layout, control slots and chunked allreduce
:mod:`.pacing`            the pacers and the agreed pause in steps
:mod:`.handoff`           the training thread / sync thread meeting point
:mod:`.lifecycle`         a runner's states and the calls each allows
:mod:`.telemetry`         counters and :class:`SyncStats`
:mod:`.clock`             the injected clock (:class:`ManualClock` for tests)
:mod:`.runner`            the shadow and fixed-rate runners
:mod:`.wrapper`           the seam to TorchRec's ``DistributedModelParallel``
========================  ===============================================================

Example (plain PyTorch, every rank)::

    from shadowsync.sync import ModelAveraging, ShadowSyncRunner, broadcast_, new_sync_group

    params = list(model.parameters())
    broadcast_(params)                          # replicas start identical
    runner = ShadowSyncRunner(params, ModelAveraging(), new_sync_group("gloo"))
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
    "FixedRateSyncRunner": "runner",
    "ShadowSyncRunner": "runner",
    "SyncError": "runner",
    "SyncRunner": "runner",
    "SyncStats": "runner",
    "broadcast_": "runner",
    "new_sync_group": "runner",
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
