"""The model zoo: DLRM-style CTR models whose embeddings TorchRec shards.

``DLRMConfig`` imports without torch; the models load torch and TorchRec on first use, so a
run's config can be checked (``pipelines.config``) in a second, before they load.
"""

from typing import Any

from shadowsync.models.config import DLRMConfig

__all__ = ["DLRM", "DLRM_DCN", "DLRMConfig", "DLRMTrain", "build_dlrm"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shadowsync.models import dlrm

        return getattr(dlrm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
