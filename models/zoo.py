"""The model zoo's registry, and what a model must be to train here (the builder protocol).

``model.name`` in a run's config picks a builder: a built-in one (:data:`MODELS`) or a
user's own, named by import path (``model.name: my_package.my_module:build``). A builder is
called as ``builder(spec, tables, options, device)`` with

- ``spec``: the data set's :class:`~shadowsync.datasets.DataSpec` (dense and sparse feature
  names, table sizes);
- ``tables``: one ``EmbeddingBagConfig`` per sparse feature, ``t_<feature>``,
  ``model.embedding_dim`` wide (the builder may add tables of its own);
- ``options``: the built-in model's config, or for a user's model ``model.options`` (read into
  the builder's ``Options`` dataclass when it has one, else a mapping);
- ``device``: where to build; ``meta`` for training, where DistributedModelParallel
  materializes every rank's part.

It returns an ``nn.Module`` whose ``forward(dense_features, sparse_features)`` takes a
TorchRec ``Batch``'s two inputs (``B x dense`` floats and a ``KeyedJaggedTensor``) and returns
``B x 1`` logits. Its embedding tables live in ``EmbeddingBagCollection`` modules (TorchRec
shards them; the ``KeyedTensor`` they return may be in any key order once sharded, so read it
by name); everything else is the dense part, which every rank replicates and the dense
synchronizer keeps in step. Every module holding dense parameters needs a
``reset_parameters()`` and no buffer may be built on ``meta``
(:func:`~shadowsync.models.init.require_initializable` checks both and names the module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shadowsync.models.config import ModelConfig, import_builder
from shadowsync.models.init import is_sparse, require_initializable, reset_dense_from_seed_

if TYPE_CHECKING:
    from shadowsync.datasets import DataSpec

__all__ = ["RecTrain", "build_model", "sparse_modules"]

class RecTrain(nn.Module):
    """Adds the loss to a zoo model, in the ``(loss, (loss, logits, labels))`` form TorchRec's
    pipelines expect; the model is ``.model`` (its state dict keys start with ``model.``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(
        self, batch: Batch
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = self.loss_fn(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())


def sparse_modules(model: nn.Module) -> list[nn.Module]:
    """The embedding collections of ``model`` (sharded or not), outermost only."""
    found: list[nn.Module] = []

    def walk(module: nn.Module) -> None:
        if is_sparse(module):
            found.append(module)
            return
        for child in module.children():
            walk(child)

    walk(model)
    return found


def build_model(cfg: ModelConfig, spec: DataSpec, device: torch.device,
                seed: int | None = None) -> RecTrain:
    """Builds the model ``cfg.name`` names for the data set ``spec`` on ``device``.

    With ``seed``, the dense part is initialized from it alone
    (:func:`~shadowsync.models.init.reset_dense_from_seed_`): the values the training job's
    DistributedModelParallel build holds with ``train.seed=seed``, on every rank. On ``meta``
    nothing is initialized; the training job does it after materializing.

    Args:
        cfg: the ``model`` section of a run's config.
        spec: the data set's features and table sizes.
        device: where to build (``meta`` defers allocation).
        seed: initializes the dense part (not on ``meta``).

    Raises:
        TypeError: the builder broke the protocol (no module, no embedding tables, tables
            outside an ``EmbeddingBagCollection``).

    Example::

        cfg = load_config("movielens_1m", ["model.name=deepfm"])
        model = build_model(cfg.model, dataset.spec, torch.device("cpu"), seed=0)
        loss, (_, logits, labels) = model(batch)
    """
    cfg.validate()
    tables = cfg.embedding_bag_configs(spec.sparse_names, spec.num_embeddings)
    builder = import_builder(cfg.builder_path())
    model = builder(spec, tables, cfg.builder_options(), device)
    where = f"model.name={cfg.name}"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{where}: the builder returned {type(model).__name__}, not a module")
    collections = sparse_modules(model)
    if not collections:
        raise TypeError(f"{where}: the model has no embedding tables (EmbeddingBagCollection)")
    if any(not isinstance(c, EmbeddingBagCollection) for c in collections):
        raise TypeError(f"{where}: tables must live in an EmbeddingBagCollection")
    if device.type == "meta":
        require_initializable(model)
    elif seed is not None:
        reset_dense_from_seed_(model, seed)
    return RecTrain(model)
