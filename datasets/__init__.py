"""Input layer: every data set yields TorchRec ``Batch`` objects and registers under a name.

Registered: ``synthetic``, ``criteo_tsv``, ``criteo_npy``, ``movielens_1m``.
"""

from shadowsync.datasets.base import (
    DATASETS,
    DataSpec,
    RecDataset,
    build_dataset,
    register_dataset,
)
from shadowsync.datasets.criteo_npy import CriteoNpy
from shadowsync.datasets.criteo_tsv import CriteoFormatError, CriteoTSV
from shadowsync.datasets.movielens import MovieLens1M
from shadowsync.datasets.synthetic import SyntheticCriteo, write_criteo_tsv

__all__ = [
    "DATASETS",
    "CriteoFormatError",
    "CriteoNpy",
    "CriteoTSV",
    "DataSpec",
    "MovieLens1M",
    "RecDataset",
    "SyntheticCriteo",
    "build_dataset",
    "register_dataset",
    "write_criteo_tsv",
]
