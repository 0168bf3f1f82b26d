"""Atomic, resumable checkpoints of a sharded TorchRec run.

Layout of one checkpoint, under any path fsspec can reach (local, ``s3://``, ``gs://``...)::

    <dir>/step_00001200/
        .metadata, __0_0.distcp, ...   torch.distributed.checkpoint: sharded embedding tables and
                                       their fused optimizer state (each rank writes its shards)
        rank_00000.pt ...              per rank, torch.save: this rank's dense replica and dense
                                       optimizer state (replicas may differ between syncs), the
                                       synchronizer's state, step and data position, RNG state
        config.yaml, data_spec.json    rank 0: the run's resolved config and the data set's
                                       features and table sizes, so the model is rebuilt from
                                       the checkpoint alone (:func:`~.saved_model.load_model`)
        COMPLETE                       written by rank 0 last, after every rank finished:
                                       JSON with the step, the world size and the size and
                                       SHA-256 of every other file of the checkpoint

A checkpoint without ``COMPLETE`` (a crash while saving) is never picked: :func:`latest` returns
the newest complete one, so the previous checkpoint stays usable. A complete one is verified
before anything is read from it (:func:`verify`): a file changed, truncated or deleted since it
was written raises :class:`CheckpointCorrupt` naming it, so corrupt bytes never reach a model.
Per-rank files load with ``torch.load(..., weights_only=True)``: nothing but tensors and plain
containers is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from shadowsync.pipelines.config import RunConfig, config_from_text

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step_(\d{8})$")
MARKER = "COMPLETE"
QUARANTINE = ".corrupt"
_SET_ASIDE = re.compile(r"step_\d{8}" + re.escape(QUARANTINE) + r"-\d+$")
CONFIG = "config.yaml"
SPEC = "data_spec.json"


class CheckpointCorrupt(RuntimeError):
    """A file of a complete checkpoint is missing, truncated or changed since it was written
    (the message names the file)."""


class CheckpointUnreadable(RuntimeError):
    """A complete checkpoint did not verify or load on some rank; raised on every rank (the
    message names each failing rank's file and reason)."""


class CheckpointWriteFailed(RuntimeError):
    """Writing a checkpoint failed on some rank (disk full, permissions...); names the rank."""


class CheckpointMismatch(ValueError):
    """A complete checkpoint of a job that this one cannot continue (another world size)."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    step: int


def _fs_and_path(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def join(root: str, *parts: str) -> str:
    """``root`` and ``parts`` as one path (URLs too: fsspec's separator)."""
    return "/".join([root.rstrip("/"), *parts])


def step_dir(root: str, step: int) -> str:
    return join(root, f"step_{step:08d}")


def complete_step(path: str) -> int | None:
    """The step of the checkpoint directory ``path`` if it is complete, else None."""
    m = _STEP_DIR.search(path.rstrip("/"))
    fs, local = _fs_and_path(path)
    return int(m.group(1)) if m and fs.exists(join(local, MARKER)) else None


def _entries(root: str) -> list[str]:
    """What ``root`` holds (nothing when it does not exist yet)."""
    fs, path = _fs_and_path(root)
    return fs.ls(path, detail=False) if fs.exists(path) else []


def complete_steps(root: str) -> list[int]:
    """Steps of the checkpoints under ``root`` that have their ``COMPLETE`` marker, ascending."""
    return sorted(s for e in _entries(root) if (s := complete_step(e)) is not None)


def latest(root: str, before: int | None = None) -> CheckpointInfo | None:
    """The newest complete checkpoint under ``root`` (with a step below ``before``, if given:
    the fallback when the newest does not load), or None."""
    steps = [s for s in complete_steps(root) if before is None or s < before]
    return CheckpointInfo(path=step_dir(root, steps[-1]), step=steps[-1]) if steps else None


def _digest(path: str) -> dict[str, Any]:
    """Size and SHA-256 of one file (read once more, in 1 MiB pieces)."""
    sha, size = hashlib.sha256(), 0
    with fsspec.open(path, "rb") as f:
        while piece := f.read(1 << 20):
            sha.update(piece)
            size += len(piece)
    return {"bytes": size, "sha256": sha.hexdigest()}


def _share(names: list[str], rank: int, world: int) -> list[str]:
    """The files this rank digests or verifies: every rank reads about 1/world of the bytes."""
    return sorted(names)[rank::world]


def save(
    root: str,
    step: int,
    sharded: dict[str, Any],
    local: dict[str, Any],
    keep: int | None = None,
    texts: dict[str, str] | None = None,
) -> str:
    """Writes one checkpoint collectively (every rank calls this with its own state).

    After every rank wrote its files, the ranks digest a share of them each and rank 0 writes
    the digests into the ``COMPLETE`` marker, last.

    Args:
        sharded: state dicts of TorchRec modules (ShardedTensors): saved once, by shard owner.
        local: this rank's own state (tensors and plain containers), saved to its own file.
        keep: after the marker, rank 0 deletes all but the newest ``keep`` complete checkpoints
            (None: keeps all). Older folders that a crash left without their marker go either
            way.
        texts: files rank 0 writes beside them, by name (the run's config), covered by the
            marker's digests like the rest.
    """
    target = step_dir(root, step)
    rank, world = dist.get_rank(), dist.get_world_size()
    fs, path = _fs_and_path(target)
    if rank == 0:
        if fs.exists(path):  # a stale partial write of the same step: start clean
            fs.rm(path, recursive=True)
        fs.makedirs(path, exist_ok=True)
    dist.barrier()
    try:
        dcp.save(sharded, checkpoint_id=target)
    except CheckpointException as e:  # a BaseException: make it a failure the loop reports
        raise CheckpointWriteFailed(f"{target}: {describe(e)}") from None
    with fsspec.open(join(target, f"rank_{rank:05d}.pt"), "wb") as f:
        torch.save(local, f)
    if rank == 0:
        for name, text in (texts or {}).items():
            with fsspec.open(join(target, name), "w") as f:
                f.write(text)
    dist.barrier()
    names: list[Any] = [sorted(_name(e) for e in fs.ls(path, detail=False)) if rank == 0
                        else None]
    dist.broadcast_object_list(names, src=0)
    mine = {n: _digest(join(target, n)) for n in _share(names[0], rank, world)}
    digests: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(mine, digests if rank == 0 else None, dst=0)
    if rank == 0:
        files = {n: d for part in digests for n, d in sorted(part.items())}
        with fsspec.open(join(target, MARKER), "w") as f:
            f.write(json.dumps({"step": step, "world_size": world, "time": time.time(),
                                "files": files}))
        _prune(root, keep, step)
    dist.barrier()
    return target


def _name(entry: str) -> str:
    return entry.rstrip("/").rsplit("/", 1)[-1]


def _prune(root: str, keep: int | None, newest: int) -> None:
    fs, path = _fs_and_path(root)
    for step in complete_steps(root)[:-keep] if keep is not None else []:
        fs.rm(_fs_and_path(step_dir(root, step))[1], recursive=True)
    for entry in fs.ls(path, detail=False):  # folders of writes that a crash cut short
        m = _STEP_DIR.search(entry.rstrip("/"))
        if m and int(m.group(1)) < newest and complete_step(entry) is None:
            logger.warning("removing %s: a checkpoint write that never completed (no %s marker)",
                           entry, MARKER)
            fs.rm(entry, recursive=True)


def resolve(path: str) -> CheckpointInfo:
    """The complete checkpoint at ``path``, or the newest complete one under it.

    Raises:
        ValueError: there is none.
    """
    step = complete_step(path)
    if step is not None:
        return CheckpointInfo(path=path.rstrip("/"), step=step)
    found = latest(path)
    if found is None:
        raise ValueError(f"{path}: no complete checkpoint there")
    return found


def incomplete(root: str) -> list[str]:
    """Checkpoint folders under ``root`` without their ``COMPLETE`` marker (interrupted writes),
    which :func:`latest` skips."""
    return sorted(e for e in _entries(root)
                  if _STEP_DIR.search(e.rstrip("/")) and complete_step(e) is None)


def set_aside(root: str) -> list[str]:
    """Checkpoint folders under ``root`` that :func:`quarantine` renamed aside, oldest step
    first: proof that ``root`` held checkpoints of this run."""
    return sorted(e for e in _entries(root) if _SET_ASIDE.search(e.rstrip("/")))


def _marker(ckpt: CheckpointInfo) -> dict[str, Any]:
    try:
        with fsspec.open(join(ckpt.path, MARKER), "r") as f:
            meta = json.loads(f.read())
        if not {"step", "world_size"} <= meta.keys():
            raise KeyError("step or world_size")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointCorrupt(f"{join(ckpt.path, MARKER)}: unreadable marker "
                                f"({type(e).__name__}: {e})") from e
    return meta


def verify(ckpt: CheckpointInfo) -> None:
    """This rank's share of the integrity check of a complete checkpoint; every rank calls it
    and must learn of any rank's failure before the collective :func:`load` (the trainer
    agrees on it through its control group).

    Raises:
        CheckpointCorrupt: the marker is unreadable, or a file it lists is missing or has
            another size or SHA-256 than when it was written (the message names the file).
        CheckpointMismatch: the checkpoint was written by a job of another world size.
    """
    meta = _marker(ckpt)
    world = dist.get_world_size()
    if meta["world_size"] != world:
        raise CheckpointMismatch(
            f"checkpoint {ckpt.path} was written by {meta['world_size']} ranks; this job has "
            f"{world}: resume with the same number of ranks"
        )
    _verify_digests(ckpt, meta, dist.get_rank(), world)


def verify_files(ckpt: CheckpointInfo) -> None:
    """The whole integrity check of :func:`verify` in this one process, without a process
    group (for reading a checkpoint outside a job); raises :class:`CheckpointCorrupt`."""
    _verify_digests(ckpt, _marker(ckpt), 0, 1)


def _verify_digests(ckpt: CheckpointInfo, meta: dict[str, Any], rank: int, world: int) -> None:
    files = meta.get("files")
    if files is None:
        logger.warning("%s was written without digests (by an older shadowsync): not verified",
                       ckpt.path)
        return
    fs, _ = _fs_and_path(ckpt.path)
    for name in _share(list(files), rank, world):
        path = join(ckpt.path, name)
        if not fs.exists(_fs_and_path(path)[1]):
            raise CheckpointCorrupt(f"{path}: missing (listed in {MARKER})")
        found, expected = _digest(path), files[name]
        if found != expected:
            what = ("truncated or extended" if found["bytes"] != expected["bytes"]
                    else "content changed")
            raise CheckpointCorrupt(
                f"{path}: {what} since it was written ({found['bytes']} bytes, sha256 "
                f"{found['sha256'][:12]}...; written: {expected['bytes']} bytes, sha256 "
                f"{expected['sha256'][:12]}...)")


def load(ckpt: CheckpointInfo, sharded: dict[str, Any]) -> dict[str, Any]:
    """Loads ``sharded`` in place (reshards to this job's plan) and returns this rank's state.

    Collective. Call :func:`verify` first on every rank; the checkpoint must come from a job of
    the same world size (replicas and synchronizer state are per rank). A file that still does
    not read raises :class:`CheckpointCorrupt` naming it.
    """
    try:
        dcp.load(sharded, checkpoint_id=ckpt.path)
    except CheckpointException as e:  # a BaseException: never let it pass as a crash
        raise CheckpointCorrupt(f"{ckpt.path}: sharded state unreadable: {describe(e)}") from None
    return read_rank_file(ckpt, dist.get_rank())


def read_rank_file(ckpt: CheckpointInfo, rank: int) -> dict[str, Any]:
    """The state ``rank`` saved on its own (``torch.load(..., weights_only=True)``); raises
    :class:`CheckpointCorrupt` naming the file if it does not read."""
    path = join(ckpt.path, f"rank_{rank:05d}.pt")
    try:
        with fsspec.open(path, "rb") as f:
            return torch.load(f, weights_only=True)
    except Exception as e:  # any unpickling or I/O error: name the file
        raise CheckpointCorrupt(f"{path}: unreadable ({type(e).__name__})") from None


def stored_config(ckpt: CheckpointInfo, overrides: list[str] | None = None) -> RunConfig | None:
    """The run's config the checkpoint holds (``config.yaml``), with ``overrides`` on top, read
    through fsspec like the rest of the checkpoint (so a remote one's too); None when it holds
    none (written by an older shadowsync), for the caller to say what to use instead."""
    where = join(ckpt.path, CONFIG)
    try:
        with fsspec.open(where, "r") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return config_from_text(text, where, overrides)


def describe(exc: BaseException) -> str:
    """One line per failing rank of a ``CheckpointException`` (DCP's message is a traceback
    per rank), else the exception's first line; torch.load's advice to retry with
    ``weights_only=False`` is never passed on."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"rank {r}: {describe(e)}" for r, (e, _) in exc.failures.items())
    first = (str(exc).strip().splitlines() or [""])[0]
    if "weights_only" in str(exc) or "Weights only load failed" in first:
        first = "not a file torch.load may unpickle safely"
    return f"{type(exc).__name__}: {first[:300]}"


def quarantine(ckpt: CheckpointInfo) -> str | None:
    """Renames a checkpoint that failed to load to ``step_N.corrupt-<time>`` (kept to inspect,
    never picked or pruned again); returns the new path, or None if the rename failed."""
    fs, path = _fs_and_path(ckpt.path)
    target = f"{path.rstrip('/')}{QUARANTINE}-{int(time.time())}"
    try:
        fs.mv(path, target, recursive=True)
    except OSError as e:
        logger.warning("could not rename %s aside: %s", ckpt.path, e)
        return None
    return target
