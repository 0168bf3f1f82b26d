"""Wide & Deep (Cheng et al., arXiv 1606.07792) over TorchRec's embedding modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.models.config import WideDeepConfig
from shadowsync.models.dlrm import SparseArch

if TYPE_CHECKING:
    from shadowsync.datasets import DataSpec

__all__ = ["WIDE_DIM", "WideArch", "WideDeep", "build_wide_deep", "wide_tables"]

# FBGEMM's fused embedding kernels take widths divisible by 4 only; a weight per id held as the
# mean of 4 numbers is the same linear model, and the mean (not the sum) keeps the embedding
# optimizer's step per id that of one weight (the sum would move the logit 4 times as far per
# step).
WIDE_DIM = 4


def wide_tables(tables: list[EmbeddingBagConfig]) -> list[EmbeddingBagConfig]:
    """One table per deep table (``w_<feature>`` for ``t_<feature>``) holding the wide part's
    weight of every id (the mean of :data:`WIDE_DIM` numbers), sharded like the others."""
    return [EmbeddingBagConfig(name=f"w_{t.name.removeprefix('t_')}", embedding_dim=WIDE_DIM,
                               num_embeddings=t.num_embeddings, feature_names=t.feature_names,
                               pooling=t.pooling)
            for t in tables]


class WideArch(nn.Module):
    """The wide part: a linear model over the dense features and every sparse id (the ids'
    weights live in embedding tables, :func:`wide_tables`, so TorchRec shards them)."""

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection, dense_in_features: int,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        self.dense = nn.Linear(dense_in_features, 1, device=device)

    def forward(self, dense_features: torch.Tensor,
                sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        ids = self.embedding_bag_collection(sparse_features).values()  # any key order
        return self.dense(dense_features) + ids.sum(dim=1, keepdim=True) / WIDE_DIM


class WideDeep(nn.Module):
    """Wide & Deep (Cheng et al., arXiv 1606.07792): the logit is a linear model's (wide) plus
    an MLP's over the dense features and the embeddings (deep), trained jointly.

    The paper's wide part also takes hand-made cross-product features; here it takes the raw
    features (a data set may add crosses as sparse features).

    Args:
        embedding_bag_collection: the deep tables, all of one width.
        wide_embedding_bag_collection: the wide weights of the same features
            (:func:`wide_tables`).
        dense_in_features: dense input features.
        deep_layer_sizes: the deep MLP; a linear layer to the logit follows.
        dense_device: where the dense layers live (``meta`` to defer allocation).

    Example::

        model = WideDeep(EmbeddingBagCollection(tables=tables),
                         EmbeddingBagCollection(tables=wide_tables(tables)), 13, [128, 64])
        logits = model(batch.dense_features, batch.sparse_features)  # B x 1
    """

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection,
                 wide_embedding_bag_collection: EmbeddingBagCollection, dense_in_features: int,
                 deep_layer_sizes: list[int], dense_device: torch.device | None = None) -> None:
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        self.wide_arch = WideArch(wide_embedding_bag_collection, dense_in_features, dense_device)
        in_features = dense_in_features + self.sparse_arch.F * self.sparse_arch.D
        self.deep_arch = nn.Sequential(
            MLP(in_features, deep_layer_sizes, bias=True, activation="relu", device=dense_device),
            nn.Linear(deep_layer_sizes[-1], 1, device=dense_device),
        )

    def forward(self, dense_features: torch.Tensor,
                sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        embedded = self.sparse_arch(sparse_features).flatten(1)
        deep = self.deep_arch(torch.cat((dense_features, embedded), dim=1))
        return deep + self.wide_arch(dense_features, sparse_features)


def build_wide_deep(spec: DataSpec, tables: list[EmbeddingBagConfig], options: WideDeepConfig,
                    device: torch.device) -> WideDeep:
    """The zoo's builder of ``model.name: wide_deep``."""
    return WideDeep(EmbeddingBagCollection(tables=tables, device=device),
                    EmbeddingBagCollection(tables=wide_tables(tables), device=device),
                    len(spec.dense_names), options.deep_layer_sizes, dense_device=device)
