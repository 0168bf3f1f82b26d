"""The baselines' replica wrappers and the hooks every wrapper has (see :mod:`.wrapper`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.tensor import DTensor
from torchrec.distributed.model_parallel import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
    get_unwrapped_module,
)
from torchrec.distributed.shards_wrapper import LocalShardsWrapper
from torchrec.distributed.types import ShardingEnv

from shadowsync.sync.config import SyncConfig

__all__ = ["DDPReplicas", "LocalReplicas", "PeriodicAveragerReplicas", "ReplicaHooks",
           "embedding_optimizer_state", "embedding_shards",
           "data_parallel_table_parameters", "dense_parameters"]


def dense_parameters(dmp: nn.Module) -> dict[str, nn.Parameter]:
    """Every parameter TorchRec did not shard (the dense replica), by name in the unwrapped
    module. Tables sharded ``data_parallel`` are not among them: see
    :func:`data_parallel_table_parameters`."""
    module = get_unwrapped_module(dmp)
    sharded = set(DistributedModelParallel._sharded_parameter_names(module))
    return {n: p for n, p in module.named_parameters() if n not in sharded and p.requires_grad}


def _local_parts(value: object) -> list[Tensor]:
    """This rank's parts of a sharded ``DTensor`` or ``ShardedTensor`` (views of the
    kernel's tensors), none of anything else."""
    if isinstance(value, DTensor):  # a LocalShardsWrapper of this rank's shards
        local = value.to_local()
        parts = local.local_shards() if isinstance(local, LocalShardsWrapper) else [local]
    elif isinstance(value, ShardedTensor):
        parts = [s.tensor for s in value.local_shards()]
    else:
        return []
    return [t for t in parts if t.numel() > 0]


def embedding_shards(dmp: nn.Module) -> list[Tensor]:
    """This rank's shards of the tables TorchRec sharded (not ``data_parallel``), in the
    module's order: views of the weights the kernels read and update in place."""
    module = get_unwrapped_module(dmp)
    sharded = set(DistributedModelParallel._sharded_parameter_names(module))
    return [t for name, value in module.state_dict().items() if name in sharded
            for t in _local_parts(value)]


def embedding_optimizer_state(dmp: DistributedModelParallel) -> list[Tensor]:
    """This rank's shards of the fused embedding optimizer's state (row-wise Adagrad's
    per-row sums, ...), in the optimizer's order: views of the kernels' own tensors."""
    state = dmp.fused_optimizer.state_dict()["state"]
    return [t for per_param in state.values() for value in per_param.values()
            for t in _local_parts(value)]


def data_parallel_table_parameters(dmp: DistributedModelParallel) -> dict[str, nn.Parameter]:
    """Weights of the tables the plan shards ``data_parallel``.

    TorchRec 1.8 counts them as sharded and wraps their lookup in its own DDP, so their
    gradients are allreduced inside backward and the replicas stay identical whatever the dense
    wrapper does; but no fused optimizer steps them (``apply_optimizer_in_backward`` does not
    reach them), so without an explicit optimizer they never train.
    """
    params = dict(get_unwrapped_module(dmp).named_parameters())
    out = {}
    for path, module_plan in dmp.plan.plan.items():
        for table, ps in module_plan.items():
            if ps.sharding_type == "data_parallel":
                name = f"{path}.embedding_bags.{table}.weight"
                if name not in params:
                    raise RuntimeError(f"data-parallel table {table}: no parameter {name}")
                out[name] = params[name]
    return out


class ReplicaHooks:
    """What the training loop calls on every wrapper; the baselines do nothing here."""

    def after_step(self) -> None:
        """Called between steps (after the optimizer step, before the next forward)."""

    def pause(self, consensus: bool) -> None:
        """Called before evaluation, checkpointing or restoring: replicas must hold still.

        With ``consensus`` the replicas end identical (the model evaluated or saved is one
        model, and an interrupted run resumes exactly where an uninterrupted one would be).
        """

    def resume(self) -> None:
        """Called after :meth:`pause`."""

    def finish(self) -> None:
        """Called once at the end of training, on every rank."""

    def failed(self) -> bool:
        """Whether synchronization failed on this rank and waits for :meth:`degrade`."""
        return False

    def degrade(self, ranks: list[int]) -> None:
        """Called on every rank at the same step once the ranks agree that synchronization
        failed on ``ranks``."""
        del ranks

    def stats(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    def close(self) -> None:
        """Destroys the process groups this wrapper made (after :meth:`finish`, every rank)."""

    def abandon(self) -> None:
        """Local: training failed; drop any synchronizer without a collective (its thread
        leaves), so nothing of it outlives the failure."""

    def sync_failure(self) -> BaseException | None:
        """The synchronizer's recorded failure on this rank, if any (see
        :meth:`~.runner.SyncRunner.failure`)."""
        return None

    def own_stall(self) -> BaseException | None:
        """Any thread: a stall of this rank's own synchronizer that fails the job (see
        :meth:`~.runner.SyncRunner.own_stall`), or None."""
        return None

    @classmethod
    def from_config(cls, cfg: SyncConfig) -> ReplicaHooks:
        """The wrapper for ``cfg`` (a baseline reads none of it)."""
        del cfg
        return cls()


class LocalReplicas(DataParallelWrapper, ReplicaHooks):
    """Each rank keeps its own dense replica; they start identical by one broadcast from rank 0.

    The module is left unwrapped (no DDP), so tracing by TorchRec's train pipeline and
    ``state_dict`` keep working, and nothing couples the ranks' backward passes.
    """

    def __init__(self) -> None:
        self.params: dict[str, nn.Parameter] = {}
        self.group: dist.ProcessGroup | None = None

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        self.params = dense_parameters(dmp)
        self.group = env.process_group
        with torch.no_grad():
            for p in self.params.values():
                dist.broadcast(p.data, src=0, group=self.group)


class DDPReplicas(DefaultDataParallelWrapper, ReplicaHooks):
    """TorchRec's default: DDP allreduces dense gradients inside every backward pass."""


class PeriodicAveragerReplicas(LocalReplicas):
    """PyTorch's own ``PeriodicModelAverager`` (local SGD, Lin et al., arXiv 1808.07217) on the
    local replicas: an outside reference for the fixed-rate MA arm, run by PyTorch's code.

    It averages in the training thread on the default group every ``period`` steps and has no
    final consensus of its own, so evaluation and checkpoints see the ranks' own replicas.
    """

    def __init__(self, period: int) -> None:
        super().__init__()
        self.period = period
        self.averager: PeriodicModelAverager | None = None

    @classmethod
    def from_config(cls, cfg: SyncConfig) -> PeriodicAveragerReplicas:
        return cls(cfg.schedule.period)

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        super().wrap(dmp, env, device)
        self.averager = PeriodicModelAverager(
            period=self.period, warmup_steps=0, process_group=self.group
        )

    def after_step(self) -> None:
        if self.averager is None:
            raise RuntimeError("PeriodicAveragerReplicas used before DMP wrapped it")
        self.averager.average_parameters(list(self.params.values()))

    def stats(self) -> dict[str, float]:
        step = self.averager.step if self.averager is not None else 0
        return {"steps": float(step), "syncs_applied": float(-(-step // self.period))}
