"""Evaluates a checkpoint on the eval split: ``torchrun --nproc_per_node 2 -m
shadowsync.pipelines.evaluate --checkpoint runs/ckpt [--config movielens_1m] [k=v ...]``.

``--checkpoint`` is a checkpoint directory (``.../step_00001200``) or a root holding several
(the newest complete one is used). The model, data set and the rest come from the run's config
stored in the checkpoint (``config.yaml``), with the overrides on top; ``--config`` replaces
it (checkpoints written before it was stored need one). The job must have the world size that
wrote it. Metrics are exact over all ranks' predictions; rank 0 prints them and, with
``output_dir``, writes ``eval.json`` there.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import torch.distributed as dist

from shadowsync.datasets import RecDataset, build_dataset
from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.build import DistEnv, init_distributed
from shadowsync.pipelines.config import RunConfig, load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.loop import Trainer


def checkpoint_config(found: checkpoint.CheckpointInfo, config: str | None,
                      overrides: list[str]) -> RunConfig:
    """``config`` (a preset or YAML) if given, else the config stored in the checkpoint, with
    ``overrides`` on top.

    Raises:
        ValueError: no ``config`` and the checkpoint holds none (an older one).
    """
    if config is not None:
        return load_config(config, overrides)
    stored = checkpoint.stored_config(found, overrides)
    if stored is None:
        raise ValueError(f"--checkpoint {found.path} holds no {checkpoint.CONFIG} (written by an "
                         "older shadowsync): pass --config")
    return stored


def evaluate_checkpoint(
    cfg: RunConfig, found: checkpoint.CheckpointInfo, env: DistEnv, dataset: RecDataset
) -> dict[str, Any]:
    """Collective: restores ``found`` into a fresh trainer and evaluates it."""
    trainer = Trainer(RunContext.of(cfg, env), dataset)
    trainer.restore(found)
    trainer.wrapper.finish()
    metrics = {"checkpoint": found.path, "step": found.step, **trainer.evaluate()}
    if env.rank == 0 and trainer.log.out_dir is not None:
        (trainer.log.out_dir / "eval.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shadowsync.pipelines.evaluate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory or root")
    parser.add_argument("--config", default=None,
                        help="preset or YAML of the run (default: the checkpoint's own)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.batch_size=8192")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, force=True)
    try:
        found = checkpoint.resolve(args.checkpoint)
        cfg = checkpoint_config(found, args.config, args.overrides)
        dataset = build_dataset(cfg.data.name, **cfg.data.options)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = init_distributed(cfg.train.pg_timeout_s)
    try:
        metrics = evaluate_checkpoint(cfg, found, env, dataset)
        if env.rank == 0:
            print(json.dumps(metrics, indent=1))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
