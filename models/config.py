"""The architecture settings of the model zoo's DLRMs, importable without torch so that a run's
config is checked (``torchx run`` at submit time) before torch and TorchRec load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig


@dataclass
class DLRMConfig:
    """Architecture of a DLRM; the data set supplies feature names and table sizes.

    Args:
        interaction: ``dot`` (DLRM, arXiv 1906.00091) or ``dcn`` (low-rank DCNv2 cross
            layers, arXiv 2008.13535).
        embedding_dim: width of every table; the bottom MLP's last layer must equal it.
        dense_arch_layer_sizes: bottom MLP.
        over_arch_layer_sizes: top MLP, ending in 1 logit.
        dcn_num_layers / dcn_low_rank_dim: cross layers, only with ``interaction=dcn``.
    """

    interaction: Literal["dot", "dcn"] = "dot"
    embedding_dim: int = 16
    dense_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 16])
    over_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 32, 1])
    dcn_num_layers: int = 2
    dcn_low_rank_dim: int = 8

    def validate(self) -> None:
        if self.interaction not in ("dot", "dcn"):
            raise ValueError(f"model.interaction must be 'dot' or 'dcn', got {self.interaction!r}")
        if self.embedding_dim <= 0:
            raise ValueError(f"model.embedding_dim must be positive, got {self.embedding_dim}")
        if not self.dense_arch_layer_sizes or self.dense_arch_layer_sizes[-1] != self.embedding_dim:
            raise ValueError(
                "model.dense_arch_layer_sizes must end in model.embedding_dim "
                f"({self.embedding_dim}), got {self.dense_arch_layer_sizes}"
            )
        if len(self.over_arch_layer_sizes) < 2 or self.over_arch_layer_sizes[-1] != 1:
            raise ValueError(
                "model.over_arch_layer_sizes needs at least two layers ending in 1, "
                f"got {self.over_arch_layer_sizes}"
            )
        if any(s <= 0 for s in self.dense_arch_layer_sizes + self.over_arch_layer_sizes):
            raise ValueError("model layer sizes must be positive")
        if self.interaction == "dcn" and (self.dcn_num_layers <= 0 or self.dcn_low_rank_dim <= 0):
            raise ValueError("model.dcn_num_layers and model.dcn_low_rank_dim must be positive")

    def embedding_bag_configs(
        self, sparse_names: list[str], num_embeddings: list[int]
    ) -> list[EmbeddingBagConfig]:
        """One table per sparse feature, named ``t_<feature>``."""
        from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

        if len(sparse_names) != len(num_embeddings):
            raise ValueError("one table size per sparse feature is needed")
        for name, n in zip(sparse_names, num_embeddings, strict=True):
            if n <= 0:
                raise ValueError(f"table size of sparse feature {name!r} must be positive, got {n}")
        return [
            EmbeddingBagConfig(
                name=f"t_{name}",
                embedding_dim=self.embedding_dim,
                num_embeddings=n,
                feature_names=[name],
                pooling=PoolingType.SUM,
            )
            for name, n in zip(sparse_names, num_embeddings, strict=True)
        ]
