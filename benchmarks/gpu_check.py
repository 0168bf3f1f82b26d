"""Check the runners' CUDA stream path against the CPU path, where a GPU exists.

Two gloo ranks share one GPU (or use one each) and run the same cases on ``cpu`` and on
``cuda``. Plain torch only: no TorchRec or fbgemm, so it runs wherever torch sees a GPU::

    python benchmarks/gpu_check.py          # prints "skipped: no CUDA" and exits 0 without one

"Training" is a fixed per-rank drift added to the parameters every step, behind a few large
matmuls on the main stream, so the host runs ahead of the GPU and a missing stream fence shows.
That makes the results checkable although shadow rounds land at timing-dependent steps:

* model averaging conserves the replicas' sum, so after the final sync every replica equals
  ``x0 + sum of all drifts / W`` whatever the schedule (shadow and fixed-rate alike);
* EASGD conserves ``sum_k x_k + c`` (workers give what the center takes);
* fixed-rate BMUF is deterministic, so ``cuda`` must match ``cpu``;
* every snapshot must see a completed step: each step sets a stamp parameter to -1 before the
  matmuls and to the step number after them, and the snapshots' stamps are recorded (deltas
  shift a stamp by ``mean(snapshot stamps) - own snapshot stamp``, which keeps it >= 1; only
  a snapshot taken mid-step reads -1).

Prints one table row per case and device, last; exits 1 if any check fails.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import _bootstrap  # noqa: F401 (makes a bare checkout importable; must come first)
import torch
import torch.distributed as dist
from _dist import run_ranks
from torch import Tensor

from shadowsync.sync import (
    BlockwiseModelUpdateFiltering,
    ElasticAveraging,
    FixedRateSyncRunner,
    ModelAveraging,
    ShadowSyncRunner,
    SyncRunner,
    SyncStrategy,
    broadcast_,
    new_sync_group,
)

STEPS = 120
PERIOD = 4
SHAPES = [(512, 512), (4096,), (1,)]  # the last is the stamp
BUSY_DIM = 4096
ATOL = 1e-4


class StampedAveraging(ModelAveraging):
    """Model averaging that records the stamp each snapshot carries (host sync: checks only)."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        self.stamps.append(snapshot[-1].item())
        return super().reduce_input(snapshot)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shadow: bool
    make: Callable[[], SyncStrategy]
    final_sync: bool = True


CASES = [
    Case("fixed-rate MA", False, StampedAveraging),
    Case("shadow MA", True, StampedAveraging),
    Case("shadow EASGD", True, functools.partial(ElasticAveraging, alpha=0.3), final_sync=False),
    Case("fixed-rate BMUF-NBM", False,
         functools.partial(BlockwiseModelUpdateFiltering, 0.5, nesterov=True)),
    Case("shadow BMUF-NBM", True,
         functools.partial(BlockwiseModelUpdateFiltering, 0.5, nesterov=True)),
]


def gather(t: Tensor) -> list[Tensor]:
    """Every rank's copy of ``t`` (on CPU), over the default group."""
    mine = t.detach().cpu()
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return out


def run_case(rank: int, device: torch.device, case: Case, group: dist.ProcessGroup
             ) -> tuple[dict[str, Any], Tensor]:
    """One run; returns its table row and this rank's final flat replica (on CPU)."""
    world = dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g).to(device) for s in SHAPES]
    broadcast_(params)
    x0 = torch.cat([p.reshape(-1) for p in params]).cpu()
    g = torch.Generator().manual_seed(1 + rank)
    drifts = [[torch.randn(s, generator=g).mul_(0.01).to(device) for s in SHAPES[:-1]]
              for _ in range(STEPS)]
    busy = torch.randn(BUSY_DIM, BUSY_DIM, device=device) if device.type == "cuda" else None
    strategy = case.make()
    runner: SyncRunner = (ShadowSyncRunner(params, strategy, group, deadline_s=60.0)
                          if case.shadow else
                          FixedRateSyncRunner(params, strategy, group, period=PERIOD))
    runner.start()
    for step in range(1, STEPS + 1):
        params[-1].fill_(-1.0)
        if busy is not None:
            for _ in range(3):
                busy = torch.tanh(busy @ busy / BUSY_DIM)
        params[-1].fill_(float(step))
        torch._foreach_add_(params[:-1], drifts[step - 1])
        dist.all_reduce(torch.zeros(1))  # lockstep, like TorchRec's per-step all-to-all
        runner.step()
    runner.stop(final_sync=case.final_sync)
    final = torch.cat([p.reshape(-1) for p in params]).cpu()
    total_drift = sum(gather(sum(torch.cat([d.reshape(-1) for d in ds]).cpu()
                                 for ds in drifts)))
    replicas = gather(final)
    checks: list[tuple[str, float]] = []
    body = slice(0, -1)  # everything but the stamp
    if isinstance(strategy, ModelAveraging):
        expected = x0[body] + total_drift / world
        checks.append(("x = x0 + sum(drift)/W", (final[body] - expected).abs().max().item()))
    if isinstance(strategy, StampedAveraging):
        torn = [s for s in strategy.stamps if s < 1]
        checks.append(("no snapshot mid-step", float(len(torn))))
    if isinstance(strategy, ElasticAveraging):
        conserved = sum(replicas)[body] + strategy.center.cpu()[body]
        expected = (world + 1) * x0[body] + total_drift
        checks.append(("sum x + c conserved", (conserved - expected).abs().max().item()))
    if case.final_sync:
        checks.append(("replicas bit-identical",
                       float(not all(torch.equal(replicas[0], r) for r in replicas))))
    checks.append(("finite", float(not bool(final.isfinite().all()))))
    s = runner.stats()
    row = {"case": case.name, "device": device.type, "rounds": s.rounds,
           "syncs": s.syncs_applied, "gap": s.gap_mean, "staleness": s.staleness_mean,
           "checks": checks}
    return row, final


def check_rank(rank: int, world_size: int) -> list[dict[str, Any]]:
    cuda = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(cuda)
    group = new_sync_group()
    rows, finals = [], {}
    for device in (torch.device("cpu"), cuda):
        for case in CASES:
            row, finals[case.name, device.type] = run_case(rank, device, case, group)
            if not case.shadow and device.type == "cuda":
                diff = (finals[case.name, "cuda"] - finals[case.name, "cpu"]).abs().max()
                row["checks"].append(("cuda == cpu", diff.item()))
            rows.append(row)
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 0
    rows = run_ranks(check_rank, world_size=2, timeout_s=500, pg_timeout_s=120)[0]
    header = (f"| {'case':<20} | {'device':<6} | {'rounds':>6} | {'syncs':>5} | {'gap':>5} "
              f"| {'stale':>5} | {'check':<26} | {'value':>9} | ok |")
    lines = [header, "|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|"]
    ok_all = True
    for row in rows:
        for i, (name, value) in enumerate(row["checks"]):
            ok = value <= ATOL
            ok_all &= ok
            lead = (f"| {row['case']:<20} | {row['device']:<6} | {row['rounds']:>6} | "
                    f"{row['syncs']:>5} | {row['gap']:>5.2f} | {row['staleness']:>5.2f} "
                    if i == 0 else f"| {'':<20} | {'':<6} | {'':>6} | {'':>5} | {'':>5} | "
                    f"{'':>5} ")
            lines.append(f"{lead}| {name:<26} | {value:>9.2e} | {'ok' if ok else 'NO':<2} |")
    print("\n".join(lines))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
