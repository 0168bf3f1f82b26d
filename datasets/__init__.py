"""Input layer: every data set yields TorchRec ``Batch`` objects and registers under a name."""

from shadowsync.datasets.base import (
    DataSpec,
    RecDataset,
    build_dataset,
    register_dataset,
    registered_datasets,
)
from shadowsync.datasets.synthetic import SyntheticCriteo

__all__ = [
    "DataSpec",
    "RecDataset",
    "SyntheticCriteo",
    "build_dataset",
    "register_dataset",
    "registered_datasets",
]
