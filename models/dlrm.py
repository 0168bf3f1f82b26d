"""DLRM, DLRM-DCNv2 and DLRM with projection over TorchRec's sharding-ready embedding modules.

The dense path (bottom MLP, interaction, top MLP) is what ShadowSync keeps in step across
replicas; the sparse path is an :class:`~torchrec.EmbeddingBagCollection` that TorchRec shards
model-parallel. Module and parameter names follow ``torchrec.models.dlrm`` so a state dict
moves between the two unchanged (``tests/test_models.py`` holds them to 1e-6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torchrec.models.dlrm import DLRM_Projection
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.models.config import DLRMConfig, DLRMProjectionConfig

if TYPE_CHECKING:
    from shadowsync.datasets import DataSpec

__all__ = ["DLRM", "DLRM_DCN", "DLRM_Projection", "LowRankCrossNet", "build_dlrm",
           "build_dlrm_projection"]


class SparseArch(nn.Module):
    """Pooled embedding lookups, returned as ``B x F x D`` in the order of the table configs.

    A sharded collection may return its ``KeyedTensor`` in another key order, so features
    are gathered by name, never by position.
    """

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = embedding_bag_collection.embedding_bag_configs()
        if not configs:
            raise ValueError("DLRM needs at least one embedding table")
        dims = {c.embedding_dim for c in configs}
        if len(dims) != 1:
            raise ValueError(f"all tables must share one embedding_dim, got {sorted(dims)}")
        self.D: int = configs[0].embedding_dim
        self.feature_names: list[str] = [f for c in configs for f in c.feature_names]
        self.F: int = len(self.feature_names)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features).to_dict()
        return torch.cat([pooled[n] for n in self.feature_names], dim=1).reshape(-1, self.F, self.D)


class DenseArch(nn.Module):
    """Bottom MLP: projects the dense features into the embedding space."""

    def __init__(
        self, in_features: int, layer_sizes: list[int], device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.model = MLP(in_features, layer_sizes, bias=True, activation="relu", device=device)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class DotInteraction(nn.Module):
    """DLRM's interaction: the dense vector and every pairwise dot product of the F+1 vectors."""

    triu_indices: torch.Tensor

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.register_buffer(
            "triu_indices", torch.triu_indices(self.F + 1, self.F + 1, offset=1), persistent=False
        )

    def output_size(self, embedding_dim: int) -> int:
        return embedding_dim + (self.F + 1) * self.F // 2

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        combined = torch.cat((dense.unsqueeze(1), sparse), dim=1)
        gram = torch.bmm(combined, combined.transpose(1, 2))
        return torch.cat((dense, gram[:, self.triu_indices[0], self.triu_indices[1]]), dim=1)


class _XavierNormalList(nn.ParameterList):
    """Kernels of a cross layer; can initialize itself (DistributedModelParallel calls
    ``reset_parameters()`` on every module that held parameters on ``meta``)."""

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for p in self:
                nn.init.xavier_normal_(p)


class _ZerosList(nn.ParameterList):
    """Biases of a cross layer; initialize to zero (see :class:`_XavierNormalList`)."""

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for p in self:
                nn.init.zeros_(p)


class LowRankCrossNet(nn.Module):
    """TorchRec's ``LowRankCrossNet`` (DCNv2's low-rank cross layers), buildable on ``meta``.

    ``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l``. Same parameter names, shapes, forward and
    initialization (Xavier-normal ``W_kernels`` then ``V_kernels``, zero ``bias``, drawn in
    TorchRec's order) as ``torchrec.modules.crossnet.LowRankCrossNet``, whose parameter lists
    have no ``reset_parameters()`` and so stay uninitialized when DistributedModelParallel
    materializes them from ``meta``; here every list initializes itself.
    """

    def __init__(self, in_features: int, num_layers: int, low_rank: int = 1,
                 device: torch.device | None = None) -> None:
        super().__init__()
        if low_rank < 1 or num_layers < 1:
            raise ValueError(f"low_rank and num_layers must be >= 1, got {low_rank}, {num_layers}")
        self._num_layers = num_layers
        self.W_kernels = _XavierNormalList(
            [nn.Parameter(torch.empty(in_features, low_rank, device=device))
             for _ in range(num_layers)])
        self.V_kernels = _XavierNormalList(
            [nn.Parameter(torch.empty(low_rank, in_features, device=device))
             for _ in range(num_layers)])
        self.bias = _ZerosList(
            [nn.Parameter(torch.empty(in_features, device=device)) for _ in range(num_layers)])
        for part in (self.W_kernels, self.V_kernels, self.bias):
            part.reset_parameters()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x_0 = x_l = features
        for layer in range(self._num_layers):
            x_l_v = nn.functional.linear(x_l, self.V_kernels[layer])
            x_l_w = nn.functional.linear(x_l_v, self.W_kernels[layer])
            x_l = x_0 * (x_l_w + self.bias[layer]) + x_l
        return x_l


class CrossInteraction(nn.Module):
    """DCNv2's interaction: low-rank cross layers over the concatenated F+1 vectors."""

    def __init__(self, num_sparse_features: int, crossnet: nn.Module) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.crossnet = crossnet

    def output_size(self, embedding_dim: int) -> int:
        return (self.F + 1) * embedding_dim

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        combined = torch.cat((dense.unsqueeze(1), sparse), dim=1)
        return self.crossnet(combined.reshape(dense.shape[0], -1))


class OverArch(nn.Module):
    """Top MLP; the last layer is linear (it produces the logit)."""

    def __init__(
        self, in_features: int, layer_sizes: list[int], device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.model = nn.Sequential(
            MLP(in_features, layer_sizes[:-1], bias=True, activation="relu", device=device),
            nn.Linear(layer_sizes[-2], layer_sizes[-1], bias=True, device=device),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class DLRM(nn.Module):
    """Deep Learning Recommendation Model (Naumov et al., arXiv 1906.00091).

    Args:
        embedding_bag_collection: the tables (sharded by TorchRec later); all of one width.
        dense_in_features: number of dense input features.
        dense_arch_layer_sizes: bottom MLP, ending in the embedding width.
        over_arch_layer_sizes: top MLP, ending in 1.
        dense_device: where the dense layers live (``meta`` to defer allocation).

    Example::

        ebc = EmbeddingBagCollection(tables=cfg.embedding_bag_configs(names, sizes))
        model = DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[64, 16],
                     over_arch_layer_sizes=[64, 1])
        logits = model(batch.dense_features, batch.sparse_features)  # B x 1
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        dense_device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        if dense_arch_layer_sizes[-1] != self.sparse_arch.D:
            raise ValueError(
                f"the dense arch must end in the embedding width {self.sparse_arch.D}, "
                f"got {dense_arch_layer_sizes}"
            )
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes, dense_device)
        self.inter_arch = self._interaction(dense_device)
        self.over_arch = OverArch(
            self.inter_arch.output_size(self.sparse_arch.D), over_arch_layer_sizes, dense_device
        )

    def _interaction(self, device: torch.device | None) -> DotInteraction | CrossInteraction:
        return DotInteraction(self.sparse_arch.F)

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        dense = self.dense_arch(dense_features)
        sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(dense, sparse))


class DLRM_DCN(DLRM):  # noqa: N801 - the name users know from torchrec.models.dlrm
    """DLRM with DCNv2 low-rank cross layers as interaction (Wang et al., arXiv 2008.13535).

    Args:
        dcn_num_layers: number of cross layers.
        dcn_low_rank_dim: rank of each cross layer's weight.
        (the rest as :class:`DLRM`)
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        dcn_num_layers: int,
        dcn_low_rank_dim: int,
        dense_device: torch.device | None = None,
    ) -> None:
        self._dcn = (dcn_num_layers, dcn_low_rank_dim)
        super().__init__(
            embedding_bag_collection,
            dense_in_features,
            dense_arch_layer_sizes,
            over_arch_layer_sizes,
            dense_device,
        )

    def _interaction(self, device: torch.device | None) -> DotInteraction | CrossInteraction:
        num_layers, low_rank = self._dcn
        crossnet = LowRankCrossNet(
            in_features=(self.sparse_arch.F + 1) * self.sparse_arch.D,
            num_layers=num_layers,
            low_rank=low_rank,
            device=device,
        )
        return CrossInteraction(self.sparse_arch.F, crossnet)


def build_dlrm(
    spec: DataSpec, tables: list[EmbeddingBagConfig], options: DLRMConfig, device: torch.device
) -> DLRM:
    """The zoo's builder (:func:`~shadowsync.models.zoo.build_model`) of ``model.name: dlrm``:
    DLRM (``interaction: dot``) or DLRM-DCNv2 (``dcn``)."""
    ebc = EmbeddingBagCollection(tables=tables, device=device)
    dense = (ebc, len(spec.dense_names), options.dense_arch_layer_sizes,
             options.over_arch_layer_sizes)
    if options.interaction == "dcn":
        return DLRM_DCN(*dense, options.dcn_num_layers, options.dcn_low_rank_dim,
                        dense_device=device)
    return DLRM(*dense, dense_device=device)


def build_dlrm_projection(
    spec: DataSpec, tables: list[EmbeddingBagConfig], options: DLRMProjectionConfig,
    device: torch.device,
) -> DLRM_Projection:
    """The zoo's builder of ``model.name: dlrm_projection``: TorchRec's own ``DLRM_Projection``
    (arXiv 1906.00091, the dot interaction between two projections of the F+1 vectors), used
    as it is: every module it holds can initialize itself after materialization."""
    return DLRM_Projection(
        EmbeddingBagCollection(tables=tables, device=device),
        len(spec.dense_names),
        options.dense_arch_layer_sizes,
        options.over_arch_layer_sizes,
        options.interaction_branch1_layer_sizes,
        options.interaction_branch2_layer_sizes,
        dense_device=device,
    )
