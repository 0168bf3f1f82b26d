"""The model zoo: CTR models whose embeddings TorchRec shards, picked by ``model.name``.

The configs (:mod:`.config`) import without torch; the models load torch and TorchRec on first
use, so a run's config can be checked (``pipelines.config``) in a second, before they load.
"""

from typing import Any

from shadowsync.models.config import (
    MODELS,
    AutoIntConfig,
    CustomModelConfig,
    DCNConfig,
    DeepFMConfig,
    DLRMConfig,
    DLRMProjectionConfig,
    ModelConfig,
    WideDeepConfig,
)

_LAZY = {
    "DLRM": "dlrm", "DLRM_DCN": "dlrm", "DLRM_Projection": "dlrm", "DeepFM": "deepfm",
    "WideDeep": "wide_deep", "DCN": "dcn", "AutoInt": "autoint", "RecTrain": "zoo",
    "build_model": "zoo",
}

__all__ = ["MODELS", "AutoIntConfig", "CustomModelConfig", "DCNConfig", "DLRMConfig",
           "DLRMProjectionConfig", "DeepFMConfig", "ModelConfig", "WideDeepConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"shadowsync.models.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
