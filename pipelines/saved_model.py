"""The trained model of a checkpoint, outside any job: :func:`load_model` rebuilds it from the
checkpoint alone (its stored config and data spec) on the CPU of one process."""

from __future__ import annotations

import json
import warnings

import fsspec
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from shadowsync.datasets import DataSpec
from shadowsync.models.zoo import RecTrain, build_model
from shadowsync.pipelines.checkpoint import (
    CONFIG,
    SPEC,
    join,
    read_rank_file,
    resolve,
    stored_config,
    verify_files,
)
from shadowsync.pipelines.config import RunConfig

__all__ = ["ModelMismatch", "load_model"]


class ModelMismatch(ValueError):
    """A checkpoint's weights do not fit the model its config builds (names the keys)."""



def load_model(path: str) -> tuple[RecTrain, RunConfig]:
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
        CheckpointCorrupt: a file changed since it was written.
        ValueError: no complete checkpoint at ``path``, or one without its config (written
            by an older shadowsync).

    Example::

        model, cfg = load_model("runs/ckpt")
        logits = model.model(batch.dense_features, batch.sparse_features)
    """
    found = resolve(path)
    verify_files(found)
    cfg = stored_config(found)
    if cfg is None:
        raise ValueError(f"{found.path}: no {CONFIG} (written by an older shadowsync): build "
                         "the model yourself and load its weights")
    with fsspec.open(join(found.path, SPEC), "r") as f:
        spec = DataSpec(**json.loads(f.read()))
    model = build_model(cfg.model, spec, torch.device("cpu"))
    wanted = {f"model.{k}": v for k, v in model.state_dict().items()}
    saved = {k: tuple(m.size) for k, m in dcp.FileSystemReader(found.path).read_metadata()
             .state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    # The dense replica is in the per-rank files (rank 0's here), the rest in DCP; checkpoints
    # of older versions hold the dense weights in both, and the per-rank copy wins.
    dense = {f"model.{k}": v for k, v in read_rank_file(found, 0)["dense"].items()}
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
