"""What a checkpoint holds of a run, asked of the parts that own it, and the ranks' agreement
on which checkpoint loads (files, digests and formats are :mod:`.checkpoint`'s)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.keyed import CombinedOptimizer

from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.control import ControlGroup
from shadowsync.sync.wrapper import DDPReplicas, LocalReplicas, dense_parameters

__all__ = ["CheckpointParts", "Checkpointer", "DenseOptimizers", "DenseReplica", "RNGState",
           "ShardedState", "by_part"]

logger = logging.getLogger("shadowsync.train")
_FRESH_ON_PURPOSE = ("to train from step 0 on purpose, run with checkpoint.resume=false "
                     "(or move those folders out of checkpoint.dir)")


# ---------------------------------------------------------------------------- the parts' states
class ShardedState:
    """The sharded model without its dense replica, and the fused embedding optimizer's state:
    what DCP saves and loads (each tensor once, by the rank that holds it; resharded on load)."""

    def __init__(self, dmp: DistributedModelParallel) -> None:
        self.dmp = dmp

    def state_dict(self) -> dict[str, Any]:
        dense = dense_parameters(self.dmp)
        return {"model": {k: v for k, v in self.dmp.state_dict().items() if k not in dense},
                "sparse_optimizer": self.dmp.fused_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises :class:`~.checkpoint.CheckpointMismatch` for tables this model does not have
        (or lacks); the dense replica comes from each rank's own state."""
        dense = dense_parameters(self.dmp)
        missing, unexpected = self.dmp.load_state_dict(state["model"], strict=False)
        if not set(missing) <= set(dense) or unexpected:
            raise checkpoint.CheckpointMismatch(
                f"does not fit this model: missing {sorted(set(missing) - set(dense))[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}")
        self.dmp.fused_optimizer.load_state_dict(state["sparse_optimizer"])


class DenseReplica:
    """This rank's dense replica (replicas may differ between syncs)."""

    def __init__(self, dmp: DistributedModelParallel) -> None:
        self.dmp = dmp

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in dense_parameters(self.dmp).items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, p in dense_parameters(self.dmp).items():
            p.copy_(state[name])


class DenseOptimizers:
    """The state of every optimizer but the fused embedding one (DCP holds that), by name."""

    def __init__(self, optimizer: CombinedOptimizer) -> None:
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizer.optimizers
                if name != "sparse"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, opt in self.optimizer.optimizers:
            if name != "sparse":
                opt.load_state_dict(state[name])


class RNGState:
    """Torch's random number generators of this process: the CPU's, and ``device``'s on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, torch.Tensor]:
        cuda = ({"cuda": torch.cuda.get_rng_state(self.device)}
                if self.device.type == "cuda" else {})
        return {"cpu": torch.get_rng_state(), **cuda}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["cpu"])
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)


def by_part(local: dict[str, Any]) -> dict[str, Any]:
    """A rank file's state by part name. Files written before each part had a key of its own
    are read in the layout they used: the position's keys, ``rng`` and ``cuda_rng`` at the top
    level, and ``last_eval`` (missing in the oldest, whose step's evaluation was done)."""
    if "position" in local:
        return local
    cuda = {"cuda": local["cuda_rng"]} if "cuda_rng" in local else {}
    return {"position": {k: local[k] for k in ("step", "epoch", "epoch_step")},
            "dense": local["dense"], "optimizers": local["optimizers"], "sync": local["sync"],
            "rng": {"cpu": local["rng"], **cuda},
            "evaluation": {"last_step": local.get("last_eval", local["step"])}}


@dataclasses.dataclass(frozen=True)
class CheckpointParts:
    """What a checkpoint holds: ``sharded`` through DCP; per rank, each of ``local``'s parts'
    own state under its name (``torch.distributed.checkpoint``'s ``Stateful``: adding a part
    adds an entry here, nothing to the checkpointer); ``files`` beside them, written by rank 0
    (the config and data spec, so :func:`~.saved_model.load_model` rebuilds the model from a
    checkpoint alone)."""

    sharded: ShardedState
    local: Mapping[str, Stateful]
    files: Mapping[str, str]


# ------------------------------------------------------------------------------ the checkpointer
class Checkpointer:
    """Saves and restores a run under ``checkpoint.*``. Every call is collective. The
    synchronizer (``replicas``) is paused while a state is read or written, with the final
    sync when saving, so the state saved is one model's.

    Args:
        ctx: the run (``checkpoint.*``, this rank).
        parts: what a checkpoint holds.
        replicas: held still around every save and restore.
        control: where the ranks agree whether a checkpoint loads.
    """

    def __init__(self, ctx: RunContext, parts: CheckpointParts,
                 replicas: LocalReplicas | DDPReplicas, control: ControlGroup) -> None:
        self.ctx, self.parts, self.replicas, self.control = ctx, parts, replicas, control
        self.last_saved = -1

    def due(self, step: int) -> bool:
        """Whether ``checkpoint.every_steps`` falls on ``step``."""
        every = self.ctx.cfg.checkpoint.every_steps
        return every is not None and step % every == 0

    def save(self, step: int) -> str | None:
        """Writes the checkpoint of ``step`` and returns its path, unless there is no
        ``checkpoint.dir`` or this step's is written (None)."""
        cfg = self.ctx.cfg.checkpoint
        if cfg.dir is None or self.last_saved == step:
            return None
        self.replicas.pause(consensus=True)
        local = {name: part.state_dict() for name, part in self.parts.local.items()}
        path = checkpoint.save(cfg.dir, step, self.parts.sharded.state_dict(), local,
                               keep=cfg.keep, texts=dict(self.parts.files))
        self.replicas.resume()
        self.last_saved = step
        return path

    def maybe_resume(self) -> checkpoint.CheckpointInfo | None:
        """Restores the newest complete checkpoint in ``checkpoint.dir`` that loads on every
        rank, if resuming is on; returns it (None: none was restored).

        A complete checkpoint that does not verify or load (a file changed, truncated or
        deleted) is renamed aside (``step_N.corrupt-<time>``, kept to inspect) with a warning
        naming the file, and the next older one is tried: losing some steps beats losing the
        run, and the previous checkpoint is kept for this (``checkpoint.keep`` >= 2). With none
        loadable, raises naming the newest. Folders of interrupted writes are named and skipped.

        Never a silent fresh start: while ``dir`` holds checkpoints set aside and none that
        loads, every launch raises naming them, until the user starts from step 0 on purpose
        (``checkpoint.resume=false``, which names them in a warning) or moves them away.
        """
        cfg, rank0 = self.ctx.cfg.checkpoint, self.ctx.env.rank == 0
        root = cfg.dir
        if root is None:
            return None
        if not cfg.resume:
            if rank0 and (aside := checkpoint.set_aside(root)):
                logger.warning("starting from step 0 (checkpoint.resume=false); %s holds "
                               "checkpoints set aside as unreadable: %s", root, ", ".join(aside))
            return None
        found = newest = checkpoint.latest(root)
        if rank0:
            for path in checkpoint.incomplete(root):
                logger.warning("skipping %s: no %s marker (its write was interrupted)", path,
                               checkpoint.MARKER)
        while found is not None:
            try:
                self.restore(found)
                return found
            except checkpoint.CheckpointUnreadable as e:
                if rank0:
                    moved = checkpoint.quarantine(found)
                    logger.warning("%s; %s; trying an older checkpoint", e,
                                   f"renamed to {moved}" if moved else "left in place")
            found = checkpoint.latest(root, before=found.step)
        aside = checkpoint.set_aside(root)
        if newest is None and not aside:
            return None
        raise checkpoint.CheckpointUnreadable(
            f"no complete checkpoint in {root} loads on every rank"
            + (f" (newest: {newest.path})" if newest else "")
            + (f"; set aside as unreadable: {', '.join(aside)}" if aside else "")
            + f"; {_FRESH_ON_PURPOSE}")

    def _agree_readable(self, found: checkpoint.CheckpointInfo,
                        error: Exception | None) -> None:
        """Raises :class:`~.checkpoint.CheckpointUnreadable` on every rank, naming each failing
        rank's file and reason, if any rank failed to verify or read its part."""
        failed = self.control.failures(error, checkpoint.describe)
        if failed:
            raise checkpoint.CheckpointUnreadable(
                f"checkpoint {found.path} does not load: " + "; ".join(failed)) from error

    def restore(self, found: checkpoint.CheckpointInfo) -> None:
        """Loads a checkpoint into every part.

        Every rank first verifies its share of the checkpoint's digests; any failure there
        raises :class:`~.checkpoint.CheckpointUnreadable` on every rank before anything is
        read. A file that still fails to read raises it too, before any state but the
        embedding tables changed. Raises :class:`~.checkpoint.CheckpointMismatch` at once (no
        fallback: older ones are no different) for a checkpoint of another world size or
        model.
        """
        self.replicas.pause(consensus=False)
        error: Exception | None = None
        try:
            checkpoint.verify(found)
        except checkpoint.CheckpointMismatch:  # the same on every rank: no older one fits
            raise
        except Exception as e:  # corrupt or unreadable; all ranks learn of it just below
            error = e
        self._agree_readable(found, error)
        sharded = self.parts.sharded.state_dict()
        try:
            local = by_part(checkpoint.load(found, sharded))
        except Exception as e:
            error = e
        self._agree_readable(found, error)
        try:
            self.parts.sharded.load_state_dict(sharded)
        except checkpoint.CheckpointMismatch as e:
            raise checkpoint.CheckpointMismatch(f"checkpoint {found.path} {e}") from None
        for name, part in self.parts.local.items():
            part.load_state_dict(local[name])
        self.last_saved = found.step
        self.replicas.resume()
