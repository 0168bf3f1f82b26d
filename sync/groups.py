"""The synchronizer's process groups and the whole-buffer collectives around rounds:
:func:`new_sync_group` (a group of its own, or one per replica group), :func:`broadcast_` (the
replicas start identical) and :func:`average_` (replicas that trained apart become one)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from shadowsync.sync.protocol import check_params, views

__all__ = ["average_", "broadcast_", "new_sync_group"]


def _require_dist() -> None:
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call init_process_group first")


def new_sync_group(backend: str = "gloo", timeout: timedelta = timedelta(minutes=10),
                   socket_ifname: str | None = None,
                   partition: Sequence[Sequence[int]] | None = None) -> dist.ProcessGroup:
    """Create the process group that carries synchronization collectives.

    A group of its own keeps the runner's allreduces from interleaving with the training loop's
    collectives (TorchRec's all-to-alls) on the default group. ``dist.new_group`` is itself
    collective: call this on every rank, in the same order, before any thread starts. ``timeout``
    bounds how long a rank waits in a collective for a peer that died or stopped participating.
    ``partition`` (global ranks, every rank in one part) makes one group per part, on every
    rank, and returns this rank's: the ranks that hold replicas of the same embedding shards.

    Use ``gloo`` (it reduces CUDA tensors too, staging them through host memory) for a shadow
    runner: NCCL documents that issuing operations from several threads to independent
    communicators on the same device is not safe (NCCL user guide, "Thread Safety"), and a
    shadow round is exactly that.

    ``socket_ifname`` (gloo only) binds the group to that network interface instead of
    ``GLOO_SOCKET_IFNAME``'s: synchronization traffic then leaves from an address of its own,
    which a network can put in a lower traffic class than the embedding all-to-alls (or on a
    second NIC). An address alias (``ip addr add ... label eth0:sync``) counts as an interface.
    """
    _require_dist()
    if timeout <= timedelta(0):
        raise ValueError(f"timeout must be positive, got {timeout}")
    if socket_ifname is not None and backend != "gloo":
        raise ValueError(f"socket_ifname applies to gloo groups, not {backend!r}")

    def make() -> dist.ProcessGroup:
        if partition is None:
            return dist.new_group(backend=backend, timeout=timeout)
        own, _ = dist.new_subgroups_by_enumeration([list(p) for p in partition],
                                                   timeout=timeout, backend=backend)
        if own is None:
            raise ValueError(f"partition {partition} leaves out rank {dist.get_rank()}")
        return own

    if socket_ifname is None:
        return make()
    # new_group passes no device options to gloo (torch 2.13 ignores pg_options there); the
    # group's constructor reads GLOO_SOCKET_IFNAME, so it is set for that call alone.
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = socket_ifname
    try:
        return make()
    finally:
        if before is None:
            del os.environ["GLOO_SOCKET_IFNAME"]
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before


@torch.no_grad()
def broadcast_(params: Sequence[Tensor], group: dist.ProcessGroup | None = None,
               src: int = 0) -> None:
    """Overwrite every rank's ``params`` with rank ``src``'s (a global rank), in one collective:
    runners assume identical replicas at their first ``start`` (strategies' state is taken
    from the local replica)."""
    _overwrite(params, lambda flat: dist.broadcast(flat, src=src, group=group))


@torch.no_grad()
def average_(params: Sequence[Tensor], group: dist.ProcessGroup | None = None) -> None:
    """Overwrite every rank's ``params`` with their mean over ``group``, in one collective:
    replicas that trained apart (a degraded synchronizer) become one again."""
    _overwrite(params, lambda flat: (dist.all_reduce(flat, group=group),
                                     flat.div_(dist.get_world_size(group))))


def _overwrite(params: Sequence[Tensor], collective: Callable[[Tensor], object]) -> None:
    """Run ``collective`` in place on the parameters flattened into one buffer; copy back."""
    _require_dist()
    params = check_params(params)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    collective(flat)
    torch._foreach_copy_(params, views(flat, params))
