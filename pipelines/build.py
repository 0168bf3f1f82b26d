"""Builds a sharded run of any zoo model: the process group, the model under
DistributedModelParallel with a planned sharding, and its optimizers. The training loop lives
in :mod:`.trainer`."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.utils.distributed import get_free_port
from torchrec.distributed.model_parallel import DistributedModelParallel, get_unwrapped_module
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from shadowsync.datasets import DataSpec
from shadowsync.models.init import require_initializable, reset_dense_from_seed_
from shadowsync.models.zoo import build_model, sparse_modules
from shadowsync.pipelines.config import ROW_WISE_FAMILY, RunConfig, ShardingType
from shadowsync.pipelines.layout import ReplicaGroups, remap_plan
from shadowsync.pipelines.layout import sharding_env as sharding_env_2d
from shadowsync.sync.wrapper import (
    DDPReplicas,
    LocalReplicas,
    data_parallel_table_parameters,
    dense_parameters,
)

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
CPU_SHARDING_TYPES: tuple[ShardingType, ...] = (
    "table_wise", "column_wise", "table_column_wise", "data_parallel")
# With replica groups: not data_parallel (TorchRec's DDP of those tables spans every rank, a
# per-step collective across groups), not table_column_wise nor grid_shard (TorchRec 1.8
# cannot describe a rank's empty shard of them under ShardingEnv2D).
REPLICA_GROUP_TYPES: tuple[ShardingType, ...] = (
    "table_wise", "column_wise", "row_wise", "table_row_wise")


class _DropMessages(logging.Filter):
    """Drops the log records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


# Logged on every rank by TorchRec and torch about their own calls, with nothing a caller can
# change; each is dropped by the exact start of its message, on the logger that logs it.
_LOG_NOISE = {
    # once per data_parallel table: such tables take no caching params (this job sets none)
    "torchrec.distributed.utils": _DropMessages(
        "Sharding Type is data_parallel, caching params will be ignored"),
    # the planner's plan check (on the root logger): data_parallel tables have no sharding spec
    "": _DropMessages("Sharding spec not found for "),
    # TorchRec's modules call torch.fx's is_fx_tracing(), which torch deprecates
    "torch.fx._symbolic_trace": _DropMessages("is_fx_tracing will return true"),
}


def quiet_third_party_warnings() -> None:
    """Silences third-party warnings this job has checked and cannot act on (idempotent)."""
    for name, drop in _LOG_NOISE.items():
        logging.getLogger(name).addFilter(drop)
    # fbgemm registers its dense (data_parallel) lookup for the CPU/CUDA keys only, and the
    # kernel records its own autograd Function, so torch's fallback adds nothing but a hook
    # that warns in backward: the tables' gradients equal an unsharded model's
    # (tests/test_data_parallel.py).
    warnings.filterwarnings(
        "ignore", category=UserWarning,
        message="fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not "
                "registered")
    # TorchRec itself builds the DistributedDataParallel of data_parallel tables this way.
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message="`broadcast_buffers` is deprecated",
                            module=r"torchrec\.distributed\.")
    # TorchRec 1.8's sharded tables hold ShardedTensors, which torch's checkpoint reader warns
    # about on every load.
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message="Please use DTensor instead and we are deprecating "
                                    "ShardedTensor")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def local_device() -> tuple[torch.device, str]:
    """This rank's device and backend: ``cuda:LOCAL_RANK`` with NCCL if there is a GPU, else CPU
    with gloo. Needs no process group, so a run can be checked against it before one starts."""
    if torch.cuda.is_available():
        return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"), "nccl"
    return torch.device("cpu"), "gloo"


def init_distributed(timeout_s: float) -> DistEnv:
    """Joins the job torchrun (or torchx) started; alone, starts a world of one on loopback.

    ``timeout_s`` bounds every collective of the default group: a rank waiting for a dead or
    stuck peer fails after it instead of hanging.
    """
    if "RANK" not in os.environ and not dist.is_initialized():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(get_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device, backend = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def sharding_constraints(cfg: RunConfig, tables: list[str], device: torch.device,
                         replicated: bool = False) -> dict[str, Any]:
    """The planner's constraints from ``sharding``, for every table of the model
    (``replicated``: in replica groups, see :data:`REPLICA_GROUP_TYPES`)."""
    types = list(cfg.sharding.types)
    if replicated:
        bad = [t for t in types if t not in REPLICA_GROUP_TYPES]
        if bad:
            raise ValueError(f"sharding.types: {bad} cannot shard inside replica groups "
                             f"(sharding.group_size); choose from {list(REPLICA_GROUP_TYPES)}")
        types = types or [t for t in REPLICA_GROUP_TYPES
                          if device.type == "cuda" or t not in ROW_WISE_FAMILY]
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
        name: ParameterConstraints(
            sharding_types=types or None,
            compute_kernels=kernels,
            min_partition=cfg.sharding.min_partition,
        )
        for name in tables
    }


def local_world(world_size: int) -> int:
    """Ranks a host: the launcher's ``LOCAL_WORLD_SIZE``, else all ``world_size`` on one."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def _meta_model_and_planner(
    cfg: RunConfig, spec: DataSpec, groups: ReplicaGroups, device: torch.device,
    local_world_size: int | None = None,
) -> tuple[nn.Module, EmbeddingShardingPlanner]:
    """The model on ``meta`` with its embedding optimizer fused into backward, and a planner
    for one group of ``groups`` on ``device``, ``local_world_size`` ranks per host (default:
    ``LOCAL_WORLD_SIZE``, else all on one host).

    Raises :class:`~shadowsync.models.init.NotInitializable` naming any module that
    DistributedModelParallel could materialize but not initialize.
    """
    quiet_third_party_warnings()
    model = build_model(cfg.model, spec, torch.device("meta"))
    require_initializable(model)
    collections = sparse_modules(model)
    sparse = _SPARSE_OPTIMIZERS[cfg.optim.sparse]
    apply_optimizer_in_backward(
        sparse,
        [p for c in collections for p in c.parameters()],
        _optimizer_kwargs(sparse, cfg.optim.sparse_lr, cfg.optim.eps),
    )
    # sparse_modules() returns nn.Modules, whose __getattr__ types methods as Tensor | Module
    tables = [t.name for c in collections for t in c.embedding_bag_configs()]  # type: ignore[operator]
    if local_world_size is None:
        local_world_size = local_world(groups.world)
    # TorchRec's own constructors: a Topology built directly, or the planner's default
    # HeuristicalStorageReservation, each log a deprecation warning on every rank.
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=groups.size,
                      local_world_size=min(local_world_size, groups.size)),
        kernel_config=KernelConfig(compute_device=device.type),
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=cfg.train.batch_size,
        # the planner's default margin; the dense part (<= 8 MB in every preset) needs no
        # estimate of its own
        storage_reservation=FixedPercentageStorageReservation(0.15),
        constraints=sharding_constraints(cfg, tables, device, replicated=not groups.whole),
    )
    return model, planner


def replica_groups(cfg: RunConfig, world_size: int,
                   local_world_size: int | None = None) -> ReplicaGroups:
    """The layout of ``sharding.group_size`` for ``world_size`` ranks, ``local_world_size`` a
    host (default: ``LOCAL_WORLD_SIZE``, else all on one host); raises a one-line
    ``ValueError`` for a layout the job cannot run."""
    if local_world_size is None:
        local_world_size = local_world(world_size)
    groups = ReplicaGroups.of(cfg.sharding.group_size, world_size, local_world_size)
    if groups.whole:
        return groups
    layout = f"sharding.group_size={groups.size} ({groups.count} groups of {world_size} ranks)"
    if not (cfg.sync.algorithm.strategy or cfg.sync.strategy.name == "none"):
        raise ValueError(f"{layout} needs a ShadowSync strategy (or none) to keep the groups' "
                         f"replicas in step, not sync.strategy={cfg.sync.strategy.name}")
    return groups


def check_sharding(cfg: RunConfig, spec: DataSpec, world_size: int,
                   device: torch.device, local_world_size: int | None = None) -> None:
    """Plans the sharding once without any process group, so that an impossible setting fails
    before ranks meet (or before a job is submitted), as a ``ValueError`` naming the
    ``sharding`` settings; checks the layout of replica groups and the synchronizer's backend
    against ``device`` too."""
    cfg.sync.check_device(device.type)
    groups = replica_groups(cfg, world_size, local_world_size)
    model, planner = _meta_model_and_planner(cfg, spec, groups, device, local_world_size)
    try:
        planner.plan(model, get_default_sharders())
    except RuntimeError as e:  # TorchRec's planner reports infeasible constraints this way
        raise ValueError(
            f"sharding.types={list(cfg.sharding.types)}, sharding.compute_kernel="
            f"{cfg.sharding.compute_kernel}, sharding.min_partition={cfg.sharding.min_partition}"
            f": no feasible plan for {groups.size} ranks on {device.type}: {e}"
        ) from e


def build_sharded_model(
    cfg: RunConfig, spec: DataSpec, env: DistEnv, wrapper: LocalReplicas | DDPReplicas
) -> tuple[DistributedModelParallel, ShardingPlan]:
    """Builds the model on ``meta``, plans its sharding and lets DMP materialize each rank's part.

    The embedding optimizer is fused into backward. The dense part is initialized from
    ``train.seed`` alone, before ``wrapper`` gets the replicas: every rank holds the same values
    as ``build_model(cfg.model, spec, "cpu", seed=train.seed)``, whatever the plan and world
    size. With replica groups (:mod:`.layout`) every group gets the plan of one group, on its
    own ranks, and its tables start as the first group's.
    """
    torch.manual_seed(cfg.train.seed)
    groups = replica_groups(cfg, env.world_size)
    model, planner = _meta_model_and_planner(cfg, spec, groups, env.device)
    sharders = get_default_sharders()
    sharding_env: ShardingEnv | None = None
    if groups.whole:
        plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    else:  # plan() is deterministic: every rank plans the same (collective_plan broadcasts
        # from global rank 0, which is in one group only)
        plan = remap_plan(planner.plan(model, sharders), groups.shard_ranks(env.rank)[0],
                          env.device, local_world(env.world_size))
        sharding_env = sharding_env_2d(groups, env.device)
    dmp = DistributedModelParallel(
        module=model,
        env=sharding_env,
        device=env.device,
        plan=plan,
        sharders=sharders,
        data_parallel_wrapper=wrapper,
        init_data_parallel=False,  # the wrapper takes the replicas once they are initialized
    )
    reset_dense_from_seed_(get_unwrapped_module(dmp), cfg.train.seed)
    dmp.init_data_parallel()
    return dmp, plan


def _optimizer_kwargs(cls: type[torch.optim.Optimizer], lr: float, eps: float) -> dict[str, Any]:
    return {"lr": lr} if cls is torch.optim.SGD else {"lr": lr, "eps": eps}


def _keyed(
    params: dict[str, nn.Parameter], cls: type[torch.optim.Optimizer], lr: float, eps: float
) -> KeyedOptimizerWrapper:
    kwargs = _optimizer_kwargs(cls, lr, eps)
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
        for table, ps in module_plan.items()
    }
