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

import json
import warnings
from typing import TYPE_CHECKING

import fsspec
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shadowsync.models.config import ModelConfig, import_builder
from shadowsync.models.init import is_sparse, require_initializable, reset_dense_from_seed_

if TYPE_CHECKING:
    from shadowsync.datasets import DataSpec
    from shadowsync.pipelines.config import RunConfig

__all__ = ["ModelMismatch", "RecTrain", "build_model", "load", "sparse_modules"]

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


class ModelMismatch(ValueError):
    """A checkpoint's weights do not fit the model its config builds (names the keys)."""


def _read_text(url: str) -> str:
    with fsspec.open(url, "r") as f:
        return f.read()


def _checkpoint_config(path: str) -> tuple[RunConfig, DataSpec]:
    from shadowsync.datasets import DataSpec
    from shadowsync.pipelines import checkpoint
    from shadowsync.pipelines.config import config_from_text

    where = f"{path}/{checkpoint.CONFIG}"
    try:
        text, spec = _read_text(where), json.loads(_read_text(f"{path}/{checkpoint.SPEC}"))
    except FileNotFoundError as e:
        raise ValueError(f"{path}: no {checkpoint.CONFIG} and {checkpoint.SPEC} (written by an "
                         "older shadowsync): build the model yourself and load its weights") from e
    return config_from_text(text, where), DataSpec(**spec)


def load(path: str) -> tuple[RecTrain, RunConfig]:
    """The trained model of a checkpoint, unsharded, on the CPU of this one process (no
    process group), in eval mode, with the run's config.

    ``path`` is a checkpoint folder (``.../step_00001200``) or a root holding several (the
    newest complete one is used). The checkpoint is verified against its digests first; the
    model is built from the config stored in it (``config.yaml``, ``data_spec.json``) and
    its tables and rank 0's dense replica are loaded.

    Args:
        path: a local checkpoint folder or root.

    Returns:
        The model (``RecTrain``; the architecture is ``.model``) and the run's config.

    Raises:
        ModelMismatch: the config builds a model whose parameters or shapes differ from the
            checkpoint's weights (names the keys).
        ~shadowsync.pipelines.checkpoint.CheckpointCorrupt: a file changed since it was written.

    Example::

        model, cfg = load("runs/ckpt")
        logits = model.model(batch.dense_features, batch.sparse_features)
    """
    from shadowsync.pipelines import checkpoint

    found = checkpoint.resolve(path)
    checkpoint.verify_files(found)
    cfg, spec = _checkpoint_config(found.path)
    model = build_model(cfg.model, spec, torch.device("cpu"))
    wanted = {f"model.{k}": v for k, v in model.state_dict().items()}
    saved = {k: tuple(m.size) for k, m in dcp.FileSystemReader(found.path).read_metadata()
             .state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    # The dense replica is in the per-rank files (rank 0's here), the rest in DCP; checkpoints
    # of older versions hold the dense weights in both, and the per-rank copy wins.
    dense = {f"model.{k}": v for k, v in checkpoint.read_rank_file(found, 0)["dense"].items()}
    saved.update({k: tuple(v.shape) for k, v in dense.items()})
    missing = sorted(set(wanted) - set(saved))
    unexpected = sorted(k for k in saved if k.startswith("model.") and k not in wanted)
    shapes = [f"{k} {saved[k]} in the checkpoint, {tuple(v.shape)} built"
              for k, v in wanted.items() if k in saved and saved[k] != v.shape]
    if missing or unexpected or shapes:
        problems = [f"{label}: {keys[:5]}{' ...' if len(keys) > 5 else ''}" for label, keys in
                    (("missing", missing), ("unexpected", unexpected), ("shapes", shapes))
                    if keys]
        raise ModelMismatch(f"{found.path}: its weights do not fit the model its config builds "
                            f"(model.name={cfg.model.name}); " + "; ".join(problems))
    state = {k: v for k, v in wanted.items() if k not in dense}
    with warnings.catch_warnings():  # one process on purpose: DCP's note that it assumes so
        warnings.filterwarnings("ignore", message="torch.distributed is disabled",
                                category=UserWarning)
        dcp.load(state, checkpoint_id=found.path, no_dist=True)
    state.update(dense)
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()}, strict=True)
    return model.eval(), cfg
