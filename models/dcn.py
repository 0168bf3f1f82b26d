"""DCNv2 on its own (Wang et al., arXiv 2008.13535) over TorchRec's embedding modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.models.config import DCNConfig
from shadowsync.models.dlrm import LowRankCrossNet, SparseArch

if TYPE_CHECKING:
    from shadowsync.datasets import DataSpec

__all__ = ["DCN", "build_dcn"]


class DCN(nn.Module):
    """DCNv2 (Wang et al., arXiv 2008.13535): low-rank cross layers and a deep MLP over the
    dense features and all embeddings, ``stacked`` (the MLP reads the cross layers' output) or
    ``parallel`` (both read the input; their outputs are concatenated), then a linear logit.

    The cross layers are the zoo's :class:`~shadowsync.models.dlrm.LowRankCrossNet` (TorchRec's,
    made buildable on ``meta``).

    Args:
        embedding_bag_collection: the tables, all of one width.
        dense_in_features: dense input features.
        num_layers / low_rank_dim: the cross layers.
        deep_layer_sizes: the deep MLP.
        structure: ``stacked`` or ``parallel``.
        dense_device: where the dense layers live (``meta`` to defer allocation).

    Example::

        model = DCN(ebc, 13, num_layers=3, low_rank_dim=16, deep_layer_sizes=[128, 64])
        logits = model(batch.dense_features, batch.sparse_features)  # B x 1
    """

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection, dense_in_features: int,
                 num_layers: int, low_rank_dim: int, deep_layer_sizes: list[int],
                 structure: str = "stacked", dense_device: torch.device | None = None) -> None:
        super().__init__()
        if structure not in ("stacked", "parallel"):
            raise ValueError(f"structure must be 'stacked' or 'parallel', got {structure!r}")
        self.stacked = structure == "stacked"
        self.sparse_arch = SparseArch(embedding_bag_collection)
        in_features = dense_in_features + self.sparse_arch.F * self.sparse_arch.D
        self.crossnet = LowRankCrossNet(in_features, num_layers, low_rank_dim, dense_device)
        self.deep = MLP(in_features, deep_layer_sizes, bias=True, activation="relu",
                        device=dense_device)
        out_features = deep_layer_sizes[-1] + (0 if self.stacked else in_features)
        self.logit = nn.Linear(out_features, 1, device=dense_device)

    def forward(self, dense_features: torch.Tensor,
                sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        x_0 = torch.cat((dense_features, self.sparse_arch(sparse_features).flatten(1)), dim=1)
        crossed = self.crossnet(x_0)
        if self.stacked:
            return self.logit(self.deep(crossed))
        return self.logit(torch.cat((crossed, self.deep(x_0)), dim=1))


def build_dcn(spec: DataSpec, tables: list[EmbeddingBagConfig], options: DCNConfig,
              device: torch.device) -> DCN:
    """The zoo's builder of ``model.name: dcn``."""
    return DCN(EmbeddingBagCollection(tables=tables, device=device), len(spec.dense_names),
               options.num_layers, options.low_rank_dim, options.deep_layer_sizes,
               options.structure, dense_device=device)
