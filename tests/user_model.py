"""A model defined outside the package, plugged in by import path
(``model.name: tests.user_model:build``) against the zoo's builder protocol
(``shadowsync.models.zoo``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.datasets import DataSpec


@dataclass
class Options:
    """Read from ``model.options`` (``build``'s annotation says so) and checked like every
    setting."""

    hidden: int = 32


class EmbeddingMLP(nn.Module):
    """An MLP over the dense features and every pooled embedding."""

    def __init__(self, tables: list[EmbeddingBagConfig], dense_in: int, hidden: int,
                 device: torch.device) -> None:
        super().__init__()
        self.tables = EmbeddingBagCollection(tables=tables, device=device)
        self.names = [f for t in tables for f in t.feature_names]
        width = dense_in + sum(t.embedding_dim for t in tables)
        self.mlp = nn.Sequential(nn.Linear(width, hidden, device=device), nn.ReLU(),
                                 nn.Linear(hidden, 1, device=device))

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.tables(sparse).to_dict()  # by name: a sharded collection reorders keys
        return self.mlp(torch.cat([dense, *(pooled[n] for n in self.names)], dim=1))


def build(spec: DataSpec, tables: list[EmbeddingBagConfig], options: Options,
          device: torch.device) -> EmbeddingMLP:
    if options.hidden <= 0:
        raise ValueError(f"model.options.hidden must be positive, got {options.hidden}")
    return EmbeddingMLP(tables, len(spec.dense_names), options.hidden, device)

