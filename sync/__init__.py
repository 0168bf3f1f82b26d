"""Background (ShadowSync) and fixed-rate synchronization of dense replicas."""

from shadowsync.sync.runner import (
    FixedRateSyncRunner,
    ShadowSyncRunner,
    SyncError,
    SyncRunner,
    SyncStats,
    broadcast_,
    new_sync_group,
)
from shadowsync.sync.strategies import (
    BlockwiseModelUpdateFiltering,
    ElasticAveraging,
    ModelAveraging,
    SyncStrategy,
)

__all__ = [
    "BlockwiseModelUpdateFiltering",
    "ElasticAveraging",
    "FixedRateSyncRunner",
    "ModelAveraging",
    "ShadowSyncRunner",
    "SyncError",
    "SyncRunner",
    "SyncStats",
    "SyncStrategy",
    "broadcast_",
    "new_sync_group",
]
