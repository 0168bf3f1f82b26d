"""The floor under every paired throughput comparison on this machine: an A/A of fixed work.

Every ratio in the frontier and the loop benchmark compares turns of training. Two identical
arms (the A/A line of those reports) still read a few percent apart, and no change to the
trainer or the synchronizer can narrow what the machine itself adds. This measures that part
alone. Each of ``--ranks`` gloo ranks (one thread each, as ``torchrun --nproc_per_node 1``
with ``OMP_NUM_THREADS=1``) runs steps of identical work, a single-thread matmul loop sized to
``--step-ms`` on the first rank, followed by a one-float allreduce that couples the ranks the
way a step's collectives do (a step takes the slowest rank's time). The steps come in turns
of ``--block``, ordered and read exactly as ``bench_sync.py --interleave --bracket`` reads its
``none A/A`` arm: a ``none`` turn before each A/A turn and one at the end, each A/A turn's
ratio its bracketing ``none`` turns' mean seconds over its own. Run it as the frontier runs
(``nice -n -10``, nothing else on the machine)::

    nice -n -10 .venv/bin/python -m shadowsync.benchmarks.rig_noise --repeats 24 \\
        --out benchmarks/results/rig_noise/block100.json

Prints the A/A ratio, median [min, max] over the cycles, and per-turn speed's spread.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shadowsync.benchmarks.report import command_line, write_json
from shadowsync.benchmarks.rows import bracket_seconds, turn_order
from shadowsync.testing import run_ranks

ARMS = ["none", "none A/A"]


def units_per_step(step_ms: float, size: int, probes: int = 50) -> int:
    """How many single-thread ``size`` x ``size`` matmuls make a step of about ``step_ms`` on
    this rank now (a median of probes)."""
    a = torch.randn(size, size)
    times = []
    for _ in range(probes):
        start = time.perf_counter()
        torch.mm(a, a)
        times.append(time.perf_counter() - start)
    return max(1, round(step_ms / 1e3 / statistics.median(times)))


def _rank(rank: int, world_size: int, step_ms: float, size: int, block: int,
          cycles: int) -> list[tuple[str, float]]:
    """The ``(arm, seconds)`` of every timed turn, in order (a warm-up cycle left out)."""
    torch.set_num_threads(1)
    n = torch.tensor([units_per_step(step_ms, size) if rank == 0 else 0])
    dist.broadcast(n, 0)
    units = int(n)
    a = torch.randn(size, size)
    flag = torch.zeros(1)
    warm_up = len(turn_order(ARMS, 0, "none"))
    order = [t for c in range(cycles + 1) for t in turn_order(ARMS, c, "none")] + ["none"]
    turns = []
    for i, arm in enumerate(order):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(block):
            for _ in range(units):
                torch.mm(a, a)
            dist.all_reduce(flag)
        seconds = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank's, as bench_sync
        if i >= warm_up:  # the first cycle's turns
            turns.append((arm, float(seconds)))
    return turns


def aa_ratios(turns: list[tuple[str, float]]) -> list[float]:
    """Each A/A turn's speed over that of the ``none`` turns beside it, in order."""
    arms = [a for a, _ in turns]
    seconds = [s for _, s in turns]
    beside = bracket_seconds(arms, seconds, "none")
    return [b / s for a, s, b in zip(arms, seconds, beside, strict=True) if a == "none A/A"]


def summary(turns: list[tuple[str, float]]) -> dict[str, Any]:
    """The A/A ratios' median, min and max, and every turn's seconds relative to the median."""
    ratios = aa_ratios(turns)
    seconds = [s for _, s in turns]
    mid = statistics.median(seconds)
    return {"aa_ratios": ratios, "aa_median": statistics.median(ratios),
            "aa_min": min(ratios), "aa_max": max(ratios),
            "turn_seconds": seconds, "turn_speed_min": mid / max(seconds),
            "turn_speed_max": mid / min(seconds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=25.0,
                        help="one step's work (the frontier's batch-128 steps take 20-40 ms)")
    parser.add_argument("--size", type=int, default=256, help="the matmul's side")
    parser.add_argument("--block", type=int, default=100, help="steps per turn")
    parser.add_argument("--repeats", type=int, default=24, help="timed cycles (A/A turns)")
    parser.add_argument("--out", type=Path, help="write the turns and the summary as JSON")
    args = parser.parse_args()
    for name in ("ranks", "block", "repeats", "size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.step_ms <= 0:
        parser.error("--step-ms must be > 0")
    fn = functools.partial(_rank, step_ms=args.step_ms, size=args.size, block=args.block,
                           cycles=args.repeats)
    turns_run = 2 * (args.repeats + 1) + 1
    budget = 60 + 3 * turns_run * args.block * args.step_ms / 1e3
    turns = run_ranks(fn, world_size=args.ranks, timeout_s=budget, pg_timeout_s=budget)[0]
    result = {"command": command_line("shadowsync.benchmarks.rig_noise"),
              "args": {k: str(v) for k, v in vars(args).items()}, **summary(turns)}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, result, newline=True)
    print(f"A/A of fixed work, {args.ranks} ranks, turns of {args.block} steps of "
          f"{args.step_ms:g} ms, {len(result['aa_ratios'])} cycles: "
          f"{result['aa_median']:.3f} [{result['aa_min']:.3f}, {result['aa_max']:.3f}]; "
          f"turn speeds {result['turn_speed_min']:.3f}-{result['turn_speed_max']:.3f} of "
          "their median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
