"""The trainer's checkpoints: what a checkpoint holds of a run, and the ranks' agreement on
which one loads (files, digests and formats are :mod:`.checkpoint`'s)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import torch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.keyed import CombinedOptimizer

from shadowsync.datasets import RecDataset
from shadowsync.pipelines import checkpoint, faults
from shadowsync.pipelines.build import DistEnv
from shadowsync.pipelines.config import RunConfig, dump_config
from shadowsync.pipelines.evaluator import Evaluator
from shadowsync.pipelines.position import DataPosition
from shadowsync.sync.wrapper import DDPReplicas, LocalReplicas, dense_parameters

logger = logging.getLogger("shadowsync.train")
_FRESH_ON_PURPOSE = ("to train from step 0 on purpose, run with checkpoint.resume=false "
                     "(or move those folders out of checkpoint.dir)")


class Checkpointer:
    """Saves and restores a run under ``checkpoint.*``: the sharded model and the fused
    embedding optimizer through DCP (each tensor once), and per rank its dense replica (replicas
    may differ between syncs), dense optimizers, synchronizer state, RNG, data position and
    last evaluation; the config and data spec beside them, so :func:`~.checkpoint.load_model`
    rebuilds the model from a checkpoint alone.

    Every call is collective. The synchronizer is paused with the final sync while a state is
    read, so the state saved is one model's.

    Args:
        log: records each checkpoint written and each resume.
    """

    def __init__(self, cfg: RunConfig, env: DistEnv, dataset: RecDataset,
                 dmp: DistributedModelParallel, optimizer: CombinedOptimizer,
                 wrapper: LocalReplicas | DDPReplicas, position: DataPosition,
                 evaluator: Evaluator, control: faults.Control,
                 log: Callable[[dict[str, Any]], None]) -> None:
        self.cfg, self.env, self.dataset, self.dmp = cfg, env, dataset, dmp
        self.optimizer, self.wrapper, self.position = optimizer, wrapper, position
        self.evaluator, self.control, self._log = evaluator, control, log
        self.last_saved = -1

    def due(self, step: int) -> bool:
        """Whether ``checkpoint.every_steps`` falls on ``step``."""
        every = self.cfg.checkpoint.every_steps
        return every is not None and step % every == 0

    # ------------------------------------------------------------------ what a checkpoint holds
    def _sharded_state(self) -> dict[str, Any]:
        """What DCP saves and loads: the model without its dense replica and the fused
        embedding optimizer's state."""
        dense = dense_parameters(self.dmp)
        return {"model": {k: v for k, v in self.dmp.state_dict().items() if k not in dense},
                "sparse_optimizer": self.dmp.fused_optimizer.state_dict()}

    def _local_state(self) -> dict[str, Any]:
        optimizers = {name: opt.state_dict() for name, opt in self.optimizer.optimizers
                      if name != "sparse"}
        return {
            **self.position.state_dict(),
            "dense": {n: p.detach().clone() for n, p in dense_parameters(self.dmp).items()},
            "optimizers": optimizers,
            "sync": self.wrapper.state_dict(),
            "rng": torch.get_rng_state(),
            **({"cuda_rng": torch.cuda.get_rng_state(self.env.device)}
               if self.env.device.type == "cuda" else {}),
            "last_eval": self.evaluator.last_step,
        }

    def _model_files(self) -> dict[str, str]:
        return {checkpoint.CONFIG: dump_config(self.cfg),
                checkpoint.SPEC: json.dumps(dataclasses.asdict(self.dataset.spec))}

    # ------------------------------------------------------------------ save
    def save(self) -> None:
        """Writes a checkpoint of the current step, unless there is no ``checkpoint.dir`` or
        this step's is written."""
        root, step = self.cfg.checkpoint.dir, self.position.step
        if root is None or self.last_saved == step:
            return
        self.wrapper.pause(consensus=True)
        path = checkpoint.save(root, step, self._sharded_state(), self._local_state(),
                               keep=self.cfg.checkpoint.keep, texts=self._model_files())
        self.wrapper.resume()
        self.last_saved = step
        self._log({"step": step, "checkpoint": path})

    # ------------------------------------------------------------------ resume
    def maybe_resume(self) -> bool:
        """Restores the newest complete checkpoint in ``checkpoint.dir`` that loads on every
        rank, if resuming is on.

        A complete checkpoint that does not verify or load (a file changed, truncated or
        deleted) is renamed aside (``step_N.corrupt-<time>``, kept to inspect) with a warning
        naming the file, and the next older one is tried: losing some steps beats losing the
        run, and the previous checkpoint is kept for this (``checkpoint.keep`` >= 2). With none
        loadable, raises naming the newest. Folders of interrupted writes are named and skipped.

        Never a silent fresh start: while ``dir`` holds checkpoints set aside and none that
        loads, every launch raises naming them, until the user starts from step 0 on purpose
        (``checkpoint.resume=false``, which names them in a warning) or moves them away.
        """
        root = self.cfg.checkpoint.dir
        if root is None:
            return False
        if not self.cfg.checkpoint.resume:
            if self.env.rank == 0 and (aside := checkpoint.set_aside(root)):
                logger.warning("starting from step 0 (checkpoint.resume=false); %s holds "
                               "checkpoints set aside as unreadable: %s", root, ", ".join(aside))
            return False
        found = checkpoint.latest(root)
        if self.env.rank == 0:
            for path in checkpoint.incomplete(root):
                logger.warning("skipping %s: no %s marker (its write was interrupted)", path,
                               checkpoint.MARKER)
        newest = found
        while found is not None:
            try:
                self.restore(found)
                return True
            except checkpoint.CheckpointUnreadable as e:
                if self.env.rank == 0:
                    moved = checkpoint.quarantine(found)
                    logger.warning("%s; %s; trying an older checkpoint", e,
                                   f"renamed to {moved}" if moved else "left in place")
            found = checkpoint.latest(root, before=found.step)
        aside = checkpoint.set_aside(root)
        if newest is None and not aside:
            return False
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
        """Loads a checkpoint: model, optimizers, synchronizer, position, last evaluation.

        Every rank first verifies its share of the checkpoint's digests; any failure there
        raises :class:`~.checkpoint.CheckpointUnreadable` on every rank before anything is
        read. A file that still fails to read raises it too, before any state but the
        embedding tables changed. Raises :class:`~.checkpoint.CheckpointMismatch` at once (no
        fallback: older ones are no different) for a checkpoint of another world size.
        """
        self.wrapper.pause(consensus=False)
        error: Exception | None = None
        try:
            checkpoint.verify(found)
        except checkpoint.CheckpointMismatch:  # the same on every rank: no older one fits
            raise
        except Exception as e:  # corrupt or unreadable; all ranks learn of it just below
            error = e
        self._agree_readable(found, error)
        sharded = self._sharded_state()
        try:
            local = checkpoint.load(found, sharded)
        except Exception as e:
            error = e
        self._agree_readable(found, error)
        dense = dense_parameters(self.dmp)
        missing, unexpected = self.dmp.load_state_dict(sharded["model"], strict=False)
        if not set(missing) <= set(dense) or unexpected:  # the dense replica comes from local
            raise checkpoint.CheckpointMismatch(
                f"checkpoint {found.path} does not fit this model: missing "
                f"{sorted(set(missing) - set(dense))[:5]}, unexpected {sorted(unexpected)[:5]}")
        self.dmp.fused_optimizer.load_state_dict(sharded["sparse_optimizer"])
        with torch.no_grad():
            for name, p in dense.items():
                p.copy_(local["dense"][name])
        for name, opt in self.optimizer.optimizers:
            if name != "sparse":
                opt.load_state_dict(local["optimizers"][name])
        self.wrapper.load_state_dict(local["sync"])
        torch.set_rng_state(local["rng"])
        if "cuda_rng" in local and self.env.device.type == "cuda":
            torch.cuda.set_rng_state(local["cuda_rng"], self.env.device)
        self.position.load_state_dict(local)
        self.last_saved = self.position.step
        # older checkpoints have no last_eval: their step's evaluation was done
        self.evaluator.last_step = int(local.get("last_eval", self.position.step))
        self.wrapper.resume()
        self._log({"step": self.position.step, "resumed_from": found.path})
