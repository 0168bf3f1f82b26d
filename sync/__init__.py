"""Background (ShadowSync) and fixed-rate synchronization of dense replicas."""

from shadowsync.sync.strategies import (
    BlockwiseModelUpdateFiltering,
    ElasticAveraging,
    ModelAveraging,
    SyncStrategy,
)

__all__ = [
    "BlockwiseModelUpdateFiltering",
    "ElasticAveraging",
    "ModelAveraging",
    "SyncStrategy",
]
