"""The model zoo: DLRM-style CTR models whose embeddings TorchRec shards."""

from shadowsync.models.dlrm import DLRM, DLRM_DCN, DLRMConfig, DLRMTrain, build_dlrm

__all__ = ["DLRM", "DLRM_DCN", "DLRMConfig", "DLRMTrain", "build_dlrm"]
