"""Atomic, resumable checkpoints of a sharded TorchRec run.

Layout of one checkpoint, under any path fsspec can reach (local, ``s3://``, ``gs://``...)::

    <dir>/step_00001200/
        .metadata, __0_0.distcp, ...   torch.distributed.checkpoint: sharded embedding tables and
                                       their fused optimizer state (each rank writes its shards)
        rank_00000.pt ...              per rank, torch.save: this rank's dense replica and dense
                                       optimizer state (replicas may differ between syncs), the
                                       synchronizer's state, step and data position, RNG state
        COMPLETE                       written by rank 0 last, after every rank finished

A checkpoint without ``COMPLETE`` (a crash while saving) is never picked: :func:`latest` returns
the newest complete one, so the previous checkpoint stays usable. Per-rank files load with
``torch.load(..., weights_only=True)``: nothing but tensors and plain containers is unpickled.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

_STEP_DIR = re.compile(r"step_(\d{8})$")
MARKER = "COMPLETE"


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    step: int


def _fs_and_path(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def step_dir(root: str, step: int) -> str:
    return _join(root, f"step_{step:08d}")


def complete_step(path: str) -> int | None:
    """The step of the checkpoint directory ``path`` if it is complete, else None."""
    m = _STEP_DIR.search(path.rstrip("/"))
    fs, local = _fs_and_path(path)
    return int(m.group(1)) if m and fs.exists(_join(local, MARKER)) else None


def complete_steps(root: str) -> list[int]:
    """Steps of the checkpoints under ``root`` that have their ``COMPLETE`` marker, ascending."""
    fs, path = _fs_and_path(root)
    if not fs.exists(path):
        return []
    return sorted(s for e in fs.ls(path, detail=False) if (s := complete_step(e)) is not None)


def latest(root: str, before: int | None = None) -> CheckpointInfo | None:
    """The newest complete checkpoint under ``root`` (with a step below ``before``, if given:
    the fallback when the newest does not load), or None."""
    steps = [s for s in complete_steps(root) if before is None or s < before]
    return CheckpointInfo(path=step_dir(root, steps[-1]), step=steps[-1]) if steps else None


def save(
    root: str,
    step: int,
    sharded: dict[str, Any],
    local: dict[str, Any],
    keep: int | None = None,
) -> str:
    """Writes one checkpoint collectively (every rank calls this with its own state).

    Args:
        sharded: state dicts of TorchRec modules (ShardedTensors): saved once, by shard owner.
        local: this rank's own state (tensors and plain containers), saved to its own file.
        keep: after the marker, rank 0 deletes all but the newest ``keep`` complete checkpoints.
    """
    target = step_dir(root, step)
    rank = dist.get_rank()
    fs, path = _fs_and_path(target)
    if rank == 0:
        if fs.exists(path):  # a stale partial write of the same step: start clean
            fs.rm(path, recursive=True)
        fs.makedirs(path, exist_ok=True)
    dist.barrier()
    dcp.save(sharded, checkpoint_id=target)
    with fsspec.open(_join(target, f"rank_{rank:05d}.pt"), "wb") as f:
        torch.save(local, f)
    dist.barrier()
    if rank == 0:
        with fsspec.open(_join(target, MARKER), "w") as f:
            f.write(json.dumps({"step": step, "world_size": dist.get_world_size(),
                                "time": time.time()}))
        if keep is not None:
            _prune(root, keep)
    dist.barrier()
    return target


def _prune(root: str, keep: int) -> None:
    fs, _ = _fs_and_path(root)
    for step in complete_steps(root)[:-keep]:
        fs.rm(_fs_and_path(step_dir(root, step))[1], recursive=True)


def load(ckpt: CheckpointInfo, sharded: dict[str, Any]) -> dict[str, Any]:
    """Loads ``sharded`` in place (reshards to this job's plan) and returns this rank's state.

    The checkpoint must come from a job of the same world size: replicas and synchronizer
    state are per rank.
    """
    fs, path = _fs_and_path(ckpt.path)
    with fs.open(_join(path, MARKER), "r") as f:
        meta = json.loads(f.read())
    world = dist.get_world_size()
    if meta["world_size"] != world:
        raise ValueError(
            f"checkpoint {ckpt.path} was written by {meta['world_size']} ranks; this job has "
            f"{world}: resume with the same number of ranks"
        )
    dcp.load(sharded, checkpoint_id=ckpt.path)
    with fsspec.open(_join(ckpt.path, f"rank_{dist.get_rank():05d}.pt"), "rb") as f:
        return torch.load(f, weights_only=True)
