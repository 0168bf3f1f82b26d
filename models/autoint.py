"""AutoInt (Song et al., arXiv 1810.11921) over TorchRec's embedding modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.models.config import AutoIntConfig
from shadowsync.models.dlrm import DenseArch, OverArch, SparseArch

if TYPE_CHECKING:
    from shadowsync.datasets import DataSpec

__all__ = ["AutoInt", "InteractingLayer", "build_autoint"]


class InteractingLayer(nn.Module):
    """AutoInt's interacting layer: multi-head self-attention over the fields with a residual
    projection, ``ReLU(attention(x) + W_res x)``.

    Written with ``nn.Linear`` and ``scaled_dot_product_attention`` rather than
    ``nn.MultiheadAttention`` (and TorchRec's experimental transformer DLRM built on it):
    ``MultiheadAttention`` holds parameters and has no ``reset_parameters()``, so
    DistributedModelParallel would leave them uninitialized after building on ``meta``.

    Args:
        in_features / out_features: each field's width before and after.
        num_heads: attention heads (``out_features`` is split among them).
        device: where the layers live.
    """

    def __init__(self, in_features: int, out_features: int, num_heads: int,
                 device: torch.device | None = None) -> None:
        super().__init__()
        if out_features % num_heads:
            raise ValueError(f"out_features ({out_features}) must be a multiple of num_heads "
                             f"({num_heads})")
        self.num_heads = num_heads
        self.query, self.key, self.value, self.residual = (
            nn.Linear(in_features, out_features, bias=False, device=device) for _ in range(4))

    def forward(self, fields: torch.Tensor) -> torch.Tensor:
        b, n, _ = fields.shape

        def heads(x: torch.Tensor) -> torch.Tensor:  # B x N x H*d -> B x H x N x d
            return x.view(b, n, self.num_heads, -1).transpose(1, 2)

        attended = nn.functional.scaled_dot_product_attention(
            heads(self.query(fields)), heads(self.key(fields)), heads(self.value(fields)))
        attended = attended.transpose(1, 2).reshape(b, n, -1)
        return torch.relu(attended + self.residual(fields))


class AutoInt(nn.Module):
    """AutoInt (Song et al., arXiv 1810.11921): stacked multi-head self-attention layers learn
    feature interactions over the fields (the embeddings, and the dense features projected to
    one more field), and an MLP over all attended fields gives the logit.

    Args:
        embedding_bag_collection: the tables, all of one width D.
        dense_in_features: dense input features.
        dense_arch_layer_sizes: MLP making the dense features a field; ends in D.
        num_layers / num_heads / attention_dim: the interacting layers.
        over_arch_layer_sizes: top MLP, ending in 1.
        dense_device: where the dense layers live (``meta`` to defer allocation).

    Example::

        model = AutoInt(ebc, 13, [64, 16], num_layers=2, num_heads=2, attention_dim=16,
                        over_arch_layer_sizes=[64, 1])
        logits = model(batch.dense_features, batch.sparse_features)  # B x 1
    """

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection, dense_in_features: int,
                 dense_arch_layer_sizes: list[int], num_layers: int, num_heads: int,
                 attention_dim: int, over_arch_layer_sizes: list[int],
                 dense_device: torch.device | None = None) -> None:
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes, dense_device)
        widths = [self.sparse_arch.D] + [attention_dim] * num_layers
        self.inter_arch = nn.Sequential(*(
            InteractingLayer(i, o, num_heads, dense_device)
            for i, o in zip(widths, widths[1:], strict=False)))
        self.over_arch = OverArch((self.sparse_arch.F + 1) * attention_dim,
                                  over_arch_layer_sizes, dense_device)

    def forward(self, dense_features: torch.Tensor,
                sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        fields = torch.cat((self.dense_arch(dense_features).unsqueeze(1),
                            self.sparse_arch(sparse_features)), dim=1)
        return self.over_arch(self.inter_arch(fields).flatten(1))


def build_autoint(spec: DataSpec, tables: list[EmbeddingBagConfig], options: AutoIntConfig,
                  device: torch.device) -> AutoInt:
    """The zoo's builder of ``model.name: autoint``."""
    return AutoInt(EmbeddingBagCollection(tables=tables, device=device), len(spec.dense_names),
                   options.dense_arch_layer_sizes, options.num_layers, options.num_heads,
                   options.attention_dim, options.over_arch_layer_sizes, dense_device=device)
