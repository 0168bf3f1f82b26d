"""Every zoo model on the same job, one after another in one torchrun job: parameters (dense,
sparse), examples/s and eval NE/AUC, as a Markdown table on rank 0. Run on 2 CPU ranks::

    nice -n 10 .venv/bin/torchrun --nproc_per_node 2 -m shadowsync.benchmarks.bench_models \\
        --steps 300 dlrm=movielens_1m dlrm_dcn dlrm_projection deepfm wide_deep dcn autoint

Each argument is a preset (``label=preset`` to name its row); ``--steps`` cuts every run
short, with the final evaluation over the whole eval split. Overrides after ``--`` apply to
every run.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from shadowsync.benchmarks.report import markdown_table, write_json
from shadowsync.datasets import DataSpec, build_dataset
from shadowsync.models.config import ModelConfig
from shadowsync.models.zoo import build_model, sparse_modules
from shadowsync.pipelines.build import init_distributed
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.loop import Trainer


def parameter_counts(cfg: ModelConfig, spec: DataSpec) -> tuple[int, int]:
    """Dense and sparse (embedding table) parameters of the unsharded model, counted on
    ``meta`` (no memory)."""
    model = build_model(cfg, spec, torch.device("meta"))
    sparse = sum(p.numel() for c in sparse_modules(model) for p in c.parameters())
    return sum(p.numel() for p in model.parameters()) - sparse, sparse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="+", help="preset, or label=preset")
    parser.add_argument("--steps", type=int, default=300, help="training steps per model")
    parser.add_argument("--json", help="rank 0 writes the rows here too")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, default=[],
                        help="-- key=value ... for every run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, force=True)
    common = [o for o in args.overrides if o != "--"] + [
        f"train.steps={args.steps}", "eval.every_steps=null", "logging.progress_bar=false",
        "output_dir=null", "checkpoint.dir=null"]
    env = None
    rows = []
    for item in args.presets:
        label, _, preset = item.rpartition("=")
        cfg = load_config(preset, common)
        env = env or init_distributed(cfg.train.pg_timeout_s)
        dataset = build_dataset(cfg.data.name, **cfg.data.options)
        dense, sparse = parameter_counts(cfg.model, dataset.spec)
        summary = Trainer(RunContext.of(cfg, env), dataset).train()
        rows.append({"model": label or preset, "preset": preset, "dense_params": dense,
                     "sparse_params": sparse, "examples_per_s": summary["examples_per_s"],
                     "eval_ne": summary["eval_ne"], "eval_auc": summary["eval_auc"],
                     "steps": summary["step"]})
    if env is not None and env.rank == 0:
        print(markdown_table(
            ["model", "preset", "dense params", "sparse params", "examples/s", "eval NE",
             "eval AUC"],
            [[r["model"], f"`{r['preset']}`", f"{r['dense_params']:,}", f"{r['sparse_params']:,}",
              f"{r['examples_per_s']:,.0f}", f"{r['eval_ne']:.4f}", f"{r['eval_auc']:.4f}"]
             for r in rows], "llrrrrr"))
        if args.json:
            write_json(Path(args.json), rows)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
