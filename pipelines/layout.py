"""Replica groups: the embedding tables sharded inside groups of contiguous ranks (a host's), the
groups replicas of each other.

With ``sharding.group_size`` = G on W ranks there are W / G groups ``[0 .. G-1], [G .. 2G-1],
...``. TorchRec's planner plans one group (G ranks); every group gets that plan, moved to its
own ranks, so TorchRec's all-to-alls stay inside a group. Rank ``g * G + i`` holds the shards
of group rank ``i``; the ranks that hold the same shards (``i, G + i, 2G + i, ...``) are a
*replica group*, and the synchronizer averages their shards in its rounds, as it averages the
dense replicas over every rank. This is TorchRec's 2D sparse parallelism with
``use_inter_host_allreduce=True`` (``DMPCollection``), built from its pieces
(``ShardingEnv2D`` over a ``DeviceMesh`` of ``("replicate", "shard")``), which run on CPU
too; DMPCollection itself needs CUDA and averages in the foreground.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.distributed as dist
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.remote_device import _remote_device
from torchrec.distributed.types import ShardingEnv2D, ShardingPlan

__all__ = ["ReplicaGroups", "remap_plan", "sharding_env"]


@dataclasses.dataclass(frozen=True)
class ReplicaGroups:
    """``world`` ranks in groups of ``size`` contiguous ranks (``size == world``: one group,
    TorchRec's usual layout)."""

    world: int
    size: int

    @classmethod
    def of(cls, group_size: int | str | None, world: int, local_world: int) -> ReplicaGroups:
        """The layout ``sharding.group_size`` asks for (None: one group; ``local``: a host's
        ranks, ``local_world`` of them); raises a one-line ``ValueError`` naming the setting
        if it does not divide ``world``."""
        size = world if group_size is None else local_world if group_size == "local" \
            else group_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"sharding.group_size: expected a positive number of ranks or "
                             f"'local', got {group_size!r}")
        if size > world or world % size:
            what = f"{size} ('local': {local_world} ranks a host)" if group_size == "local" \
                else str(size)
            raise ValueError(f"sharding.group_size={what} must divide the job's {world} ranks "
                             f"(groups of contiguous ranks, at most the whole job)")
        return cls(world, size)

    @property
    def count(self) -> int:
        return self.world // self.size

    @property
    def whole(self) -> bool:
        """One group: every rank shards the tables together, nothing is replicated."""
        return self.size == self.world

    def shard_ranks(self, rank: int) -> list[int]:
        """The group ``rank`` shards the tables with."""
        first = rank - rank % self.size
        return list(range(first, first + self.size))

    def replica_ranks(self, rank: int) -> list[int]:
        """The ranks that hold the same shards as ``rank``, one per group."""
        return list(range(rank % self.size, self.world, self.size))

    @property
    def replica_partition(self) -> list[list[int]]:
        """Every replica group, in order (the synchronizer makes one sync group for each)."""
        return [self.replica_ranks(i) for i in range(self.size)]


def remap_plan(plan: ShardingPlan, first_rank: int, device: torch.device,
               local_world: int) -> ShardingPlan:
    """A copy of ``plan`` (made for one group's ranks ``0 .. G-1``) placed on the group that
    starts at global rank ``first_rank``: every shard's ranks and placement moved there, as
    ``DMPCollection._remap_sharding_plan`` does with ``use_inter_host_allreduce=True``. The
    placement names a device index on CUDA only (``rank:N/cpu``): TorchRec's own
    ``cpu:<index>`` fails its ShardedTensor device check on CPU."""
    plan = copy.deepcopy(plan)
    for module_plan in plan.plan.values():
        for ps in module_plan.values():
            ps.ranks = [first_rank + r for r in ps.ranks]
            spec = ps.sharding_spec
            if isinstance(spec, EnumerableShardingSpec):
                for shard in spec.shards:
                    placed = None if shard.placement is None else shard.placement.rank()
                    assert placed is not None, f"a shard of {ps} has no rank"
                    rank = first_rank + placed
                    where = (f"cuda:{rank % local_world}" if device.type == "cuda"
                             else device.type)
                    shard.placement = _remote_device(f"rank:{rank}/{where}")
    return plan


def sharding_env(groups: ReplicaGroups, device: torch.device) -> ShardingEnv2D:
    """TorchRec's sharding environment for ``groups`` (collective: every rank makes every
    group of the mesh)."""
    matrix = [groups.shard_ranks(g * groups.size) for g in range(groups.count)]
    mesh = DeviceMesh(device.type, matrix, mesh_dim_names=("replicate", "shard"))
    return ShardingEnv2D(
        sharding_pg=mesh.get_group("shard"), replica_pg=mesh.get_group("replicate"),
        global_pg=dist.GroupMember.WORLD,
        device_mesh=mesh, use_inter_host_allreduce=True)
