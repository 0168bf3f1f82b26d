"""Distributed DLRM training: TorchRec model-parallel embeddings, dense replicas kept in step by
a pluggable wrapper (``ddp``, ``none`` or a ShadowSync strategy).

Run with ``torchrun --nproc_per_node 2 -m shadowsync.pipelines.train [--config F] [k=v ...]``;
without torchrun it runs as a world of one. GPUs are used when present (NCCL, ``cuda:LOCAL_RANK``),
otherwise CPU with gloo.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from shadowsync.datasets import DataSpec, RecDataset, build_dataset
from shadowsync.models import build_dlrm
from shadowsync.pipelines.config import ROW_WISE_FAMILY, RunConfig, load_config, save_config
from shadowsync.pipelines.metrics import gather_metrics
from shadowsync.sync.wrapper import (
    DDPReplicas,
    LocalReplicas,
    ReplicaHooks,
    data_parallel_table_parameters,
    dense_parameters,
)

logger = logging.getLogger("shadowsync.train")

_SPARSE_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "rowwise_adagrad": RowWiseAdagrad,
    "adagrad": torch.optim.Adagrad,
    "sgd": torch.optim.SGD,
}
_DENSE_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
}
CPU_SHARDING_TYPES = ("table_wise", "column_wise", "table_column_wise", "data_parallel")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(timeout_s: float) -> DistEnv:
    """Joins the job torchrun (or torchx) started; alone, starts a world of one on loopback."""
    if "RANK" not in os.environ and not dist.is_initialized():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device, backend = torch.device(f"cuda:{local_rank}"), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def make_replica_wrapper(cfg: RunConfig) -> LocalReplicas | DDPReplicas:
    """The ``sync.algorithm`` setting: ``ddp``, ``none`` or a ShadowSync strategy."""
    algorithm = cfg.sync.algorithm
    if algorithm == "ddp":
        return DDPReplicas()
    if algorithm == "none":
        return LocalReplicas()
    from shadowsync.sync.wrapper import ShadowSyncReplicas

    return ShadowSyncReplicas.from_config(cfg.sync)


def _constraints(cfg: RunConfig, spec: DataSpec, device: torch.device) -> dict[str, Any]:
    types = list(cfg.sharding.types)
    if device.type == "cpu":
        bad = [t for t in types if t in ROW_WISE_FAMILY]
        if bad:
            raise ValueError(
                f"sharding.types: {bad} need CUDA (TorchRec offers the row-wise family only on "
                f"GPUs); on CPU choose from {list(CPU_SHARDING_TYPES)}"
            )
        types = types or list(CPU_SHARDING_TYPES)
    kernels = None if cfg.sharding.compute_kernel == "auto" else [cfg.sharding.compute_kernel]
    return {
        f"t_{name}": ParameterConstraints(
            sharding_types=types or None,
            compute_kernels=kernels,
            min_partition=cfg.sharding.min_partition,
        )
        for name in spec.sparse_names
    }


def build_sharded_model(
    cfg: RunConfig, spec: DataSpec, env: DistEnv, wrapper: LocalReplicas | DDPReplicas
) -> tuple[DistributedModelParallel, ShardingPlan]:
    """Builds the model on ``meta``, plans its sharding and lets DMP materialize each rank's part.

    The embedding optimizer is fused into backward; the dense replicas go to ``wrapper``.
    """
    torch.manual_seed(cfg.train.seed)
    model = build_dlrm(
        cfg.model, len(spec.dense_names), spec.sparse_names, spec.num_embeddings,
        torch.device("meta"),
    )
    sparse_kwargs: dict[str, Any] = {"lr": cfg.optim.sparse_lr}
    if cfg.optim.sparse != "sgd":
        sparse_kwargs["eps"] = cfg.optim.eps
    apply_optimizer_in_backward(
        _SPARSE_OPTIMIZERS[cfg.optim.sparse],
        model.model.sparse_arch.embedding_bag_collection.parameters(),
        sparse_kwargs,
    )
    topology = Topology(
        world_size=env.world_size,
        compute_device=env.device.type,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size)),
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=cfg.train.batch_size,
        constraints=_constraints(cfg, spec, env.device),
    )
    sharders = get_default_sharders()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(
        module=model,
        device=env.device,
        plan=plan,
        sharders=sharders,
        data_parallel_wrapper=wrapper,
    )
    return dmp, plan


def _keyed(
    params: dict[str, nn.Parameter], cls: type[torch.optim.Optimizer], lr: float, eps: float
) -> KeyedOptimizerWrapper:
    kwargs: dict[str, Any] = {"lr": lr} if cls is torch.optim.SGD else {"lr": lr, "eps": eps}
    return KeyedOptimizerWrapper(params, lambda ps: cls(ps, **kwargs))


def build_optimizer(cfg: RunConfig, dmp: DistributedModelParallel) -> CombinedOptimizer:
    """The fused embedding optimizer (applied in backward), the dense optimizer, and the
    embedding optimizer again, unfused, for tables sharded ``data_parallel``."""
    o = cfg.optim
    parts: list[tuple[str, Any]] = [
        ("sparse", dmp.fused_optimizer),
        ("dense", _keyed(dense_parameters(dmp), _DENSE_OPTIMIZERS[o.dense], o.dense_lr, o.eps)),
    ]
    dp_tables = data_parallel_table_parameters(dmp)
    if dp_tables:
        parts.append(
            ("dp_tables", _keyed(dp_tables, _SPARSE_OPTIMIZERS[o.sparse], o.sparse_lr, o.eps))
        )
    return CombinedOptimizer(parts)


def plan_ranks(plan: ShardingPlan) -> dict[str, tuple[str, list[int]]]:
    """Each table's sharding type and the ranks that hold it (from the plan)."""
    return {
        table: (ps.sharding_type, sorted(set(ps.ranks or [])))
        for module_plan in plan.plan.values()
        for table, ps in module_plan.items()  # type: ignore[union-attr]
    }


class Trainer:
    """Runs the train loop on TorchRec's ``TrainPipelineSparseDist`` and evaluates.

    Between steps the replica wrapper's ``after_step`` runs (ShadowSync applies a ready delta
    there); evaluation pauses it, and ``finish`` ends synchronization before the last eval.
    """

    def __init__(self, cfg: RunConfig, env: DistEnv, dataset: RecDataset) -> None:
        self.cfg = cfg
        self.env = env
        self.dataset = dataset
        self.wrapper = make_replica_wrapper(cfg)
        self.dmp, self.plan = build_sharded_model(cfg, dataset.spec, env, self.wrapper)
        self.optimizer = build_optimizer(cfg, self.dmp)
        self.pipeline = TrainPipelineSparseDist(self.dmp, self.optimizer, env.device)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.out_dir = Path(cfg.output_dir) if cfg.output_dir else None

    @property
    def hooks(self) -> ReplicaHooks:
        return self.wrapper

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.env.rank == 0:
            logger.info(json.dumps(record))
            if self.out_dir is not None:
                with open(self.out_dir / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")

    def evaluate(self) -> dict[str, float]:
        """Exact metrics over the whole eval split (all ranks' predictions gathered)."""
        self.hooks.pause()
        self.dmp.eval()
        batches = self.dataset.eval_batches(
            self.cfg.eval.batch_size, self.env.rank, self.env.world_size
        )
        if self.cfg.eval.max_batches is not None:
            batches = itertools.islice(batches, self.cfg.eval.max_batches)
        logits, labels = [], []
        with torch.no_grad():
            while True:
                try:
                    _, out_logits, out_labels = self.pipeline.progress(batches)
                except StopIteration:
                    break
                logits.append(out_logits.float())
                labels.append(out_labels.float())
        self.dmp.train()
        self.hooks.resume()
        empty = torch.empty(0, device=self.env.device)
        return gather_metrics(torch.cat(logits) if logits else empty,
                              torch.cat(labels) if labels else empty)

    def _segments(self) -> Iterator[Iterator[Batch]]:
        """The training stream cut where evaluations fall (the pipeline drains at each cut)."""
        budget = self.cfg.train.steps
        every = self.cfg.eval.every_steps
        for epoch in range(self.cfg.train.epochs):
            stream = self.dataset.train_batches(
                self.cfg.train.batch_size, self.env.rank, self.env.world_size, epoch
            )
            while True:
                remaining = None if budget is None else budget - self.step
                if remaining is not None and remaining <= 0:
                    return
                cut = every - self.step % every if every else None
                length = min(x for x in (remaining, cut) if x is not None) if (
                    remaining or cut) else None
                segment = itertools.islice(stream, length) if length else stream
                peek = next(segment, None)
                if peek is None:
                    break
                yield itertools.chain([peek], segment)

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        examples_per_step = cfg.train.batch_size * self.env.world_size
        self.dmp.train()
        t_start = time.perf_counter()
        t_window, step_window = t_start, 0
        train_time = 0.0
        loss_sum, loss_n = torch.zeros((), device=self.env.device), 0
        for segment in self._segments():
            t_seg = time.perf_counter()
            while True:
                try:
                    loss, _, _ = self.pipeline.progress(segment)
                except StopIteration:
                    break
                self.hooks.after_step()
                self.step += 1
                loss_sum += loss.detach()
                loss_n += 1
                if self.step % cfg.train.log_every == 0:
                    now = time.perf_counter()
                    self._log({
                        "step": self.step,
                        "loss": float(loss_sum) / loss_n,
                        "examples_per_s": examples_per_step * (self.step - step_window)
                        / (now - t_window),
                        **{f"sync_{k}": v for k, v in self.hooks.stats().items()},
                    })
                    t_window, step_window = now, self.step
                    loss_sum.zero_()
                    loss_n = 0
            train_time += time.perf_counter() - t_seg
            if cfg.eval.every_steps and self.step % cfg.eval.every_steps == 0:
                metrics = self.evaluate()
                self._log({"step": self.step, **{f"eval_{k}": v for k, v in metrics.items()}})
        self.hooks.finish()
        final = self.evaluate()
        summary = {
            "step": self.step,
            "examples_per_s": examples_per_step * self.step / max(train_time, 1e-9),
            "train_seconds": train_time,
            **{f"eval_{k}": v for k, v in final.items()},
            **{f"sync_{k}": v for k, v in self.hooks.stats().items()},
        }
        self._log({"summary": True, **summary})
        return summary


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
