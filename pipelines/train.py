"""Distributed DLRM training: TorchRec model-parallel embeddings, dense replicas kept in step by
a pluggable wrapper (``ddp``, ``none`` or a ShadowSync strategy).

Run with ``torchrun --nproc_per_node 2 -m shadowsync.pipelines.train [--config F] [k=v ...]``;
without torchrun it runs as a world of one. GPUs are used when present (NCCL, ``cuda:LOCAL_RANK``),
otherwise CPU with gloo.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from shadowsync.datasets import build_dataset
from shadowsync.pipelines.build import DistEnv, init_distributed, plan_ranks
from shadowsync.pipelines.config import RunConfig, load_config, save_config
from shadowsync.pipelines.trainer import Trainer

__all__ = ["DistEnv", "Trainer", "init_distributed", "main", "plan_ranks", "run"]

logger = logging.getLogger("shadowsync.train")


def _summary_table(summary: dict[str, Any]) -> str:
    rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in summary.items()
            if k != "summary"]
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"{'metric':<{width}}  value", f"{'-' * width}  -----"] +
                     [f"{k:<{width}}  {v}" for k, v in rows])


def run(cfg: RunConfig) -> dict[str, Any]:
    """Trains with ``cfg`` in the current process group; returns the final summary."""
    env = init_distributed(cfg.sync.timeout_s)
    dataset = build_dataset(cfg.data.name, **cfg.data.options)
    if env.rank == 0:
        logger.info("%s; world %d on %s (%s)", dataset.describe(), env.world_size, env.device,
                    env.backend)
        if cfg.output_dir:
            Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
            save_config(cfg, Path(cfg.output_dir) / "config.yaml")
    trainer = Trainer(cfg, env, dataset)
    if env.rank == 0:
        logger.info("sharding plan:\n%s", trainer.plan)
    trainer.maybe_resume()
    summary = trainer.train()
    if env.rank == 0:
        print(_summary_table(summary), flush=True)
    return summary


def parse_args(argv: list[str] | None = None) -> RunConfig:
    parser = argparse.ArgumentParser(
        prog="python -m shadowsync.pipelines.train", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", help="YAML preset (see pipelines/configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sync.algorithm=ma")
    args = parser.parse_args(argv)
    return load_config(args.config, args.overrides)


def main(argv: list[str] | None = None) -> int:
    # TorchRec logs every pipeline refill at INFO on every rank; keep ours, quiet theirs.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stdout, force=True)
    logging.getLogger("shadowsync").setLevel(logging.INFO)
    try:
        cfg = parse_args(argv)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        run(cfg)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
