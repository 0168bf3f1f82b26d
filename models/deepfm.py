"""DeepFM (Guo et al., arXiv 1703.04247) from TorchRec's ``SimpleDeepFMNN``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shadowsync.models.config import DeepFMConfig

if TYPE_CHECKING:
    from shadowsync.datasets import DataSpec

__all__ = ["DeepFM", "build_deepfm"]


class DeepFM(SimpleDeepFMNN):
    """DeepFM (Guo et al., arXiv 1703.04247): a factorization machine and a deep network over
    the same embeddings, as TorchRec's ``SimpleDeepFMNN``, returning the logit.

    TorchRec's model ends in a sigmoid; the trainer's loss takes logits (BCE with logits, the
    numerically stable form), so the sigmoid is dropped and nothing else changes: parameter
    names are TorchRec's, and a state dict moves between the two (TorchRec's output is the
    sigmoid of this one's, tested).

    Args:
        num_dense_features: dense input features.
        embedding_bag_collection: the tables, all of one width.
        hidden_layer_size: hidden width of the dense features' MLP.
        deep_fm_dimension: output width of the deep component.

    Example::

        model = DeepFM(13, ebc, hidden_layer_size=64, deep_fm_dimension=32)
        logits = model(batch.dense_features, batch.sparse_features)  # B x 1
    """

    def __init__(self, num_dense_features: int, embedding_bag_collection: EmbeddingBagCollection,
                 hidden_layer_size: int, deep_fm_dimension: int) -> None:
        super().__init__(num_dense_features, embedding_bag_collection, hidden_layer_size,
                         deep_fm_dimension)
        self.over_arch.model = self.over_arch.model[:-1]  # keeps the Linear, named "0"


def build_deepfm(spec: DataSpec, tables: list[EmbeddingBagConfig], options: DeepFMConfig,
                 device: torch.device) -> DeepFM:
    """The zoo's builder of ``model.name: deepfm``. ``SimpleDeepFMNN`` takes no device, so
    its layers are made under ``device`` as the default device (``meta`` defers them)."""
    ebc = EmbeddingBagCollection(tables=tables, device=device)
    with torch.device(device):
        return DeepFM(len(spec.dense_names), ebc, options.hidden_layer_size,
                      options.deep_fm_dimension)
