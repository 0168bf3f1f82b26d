"""Helpers of the synchronizer's tests: a small model, per-rank data with a shared target,
plain SGD, replica comparisons, and a runner that records its snapshot steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from shadowsync.sync.errors import SyncError
from shadowsync.sync.shadow import ShadowSyncRunner

IN_DIM = 8


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_DIM, 16), nn.Tanh(), nn.Linear(16, 1))


def rank_data(rank: int, steps: int, batch: int = 16) -> list[tuple[Tensor, Tensor]]:
    """A shared regression target plus a per-rank part: unsynchronized replicas drift apart."""
    w = torch.randn(IN_DIM, 1, generator=torch.Generator().manual_seed(99))
    g = torch.Generator().manual_seed(100 + rank)
    w = w + 0.5 * torch.randn(IN_DIM, 1, generator=g)
    xs = [torch.randn(batch, IN_DIM, generator=g) for _ in range(steps)]
    return [(x, x @ w) for x in xs]


def train_step(model: nn.Module, x: Tensor, y: Tensor, lr: float = 0.01) -> None:
    """Plain SGD by hand: ``torch.optim`` would import dynamo (~3 s) in every spawned rank."""
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


def flat(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gather_flat(model: nn.Module) -> list[Tensor]:
    """Every rank's flattened replica (collective on the default group)."""
    mine = flat(model)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return out


def spread(replicas: list[Tensor]) -> float:
    return (replicas[0] - replicas[1]).norm().item()


def train_until_sync_error(model: nn.Module, runner: Any, rank: int, steps: int,
                           before_step: Callable[[int], None] = lambda step: None
                           ) -> tuple[SyncError | None, int]:
    """Trains with ``runner`` until a step raises ``SyncError`` or ``steps`` pass; the error
    and the step it was raised at. ``before_step(step)`` runs before each runner step."""
    for step, (x, y) in enumerate(rank_data(rank, steps), start=1):
        train_step(model, x, y)
        before_step(step)
        try:
            runner.step()
        except SyncError as e:
            return e, step
    return None, steps


class Recording(ShadowSyncRunner):
    """Records the step of every snapshot it hands to the sync thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.snapshots: list[int] = []

    def _give(self, step: int, stop: bool) -> None:
        self.snapshots.append(step)
        super()._give(step, stop)
