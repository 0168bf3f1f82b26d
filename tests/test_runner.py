"""Runners on CPU/gloo: a world of one in-process, and two spawned ranks on 127.0.0.1.

Two-rank scenarios are grouped so that each spawn (about 3 s of interpreter start-up on two cores)
checks several things. Per-step sleeps stand in for a real training step: they make the training
loop slower than a round, as it is in practice, and leave the two cores to the sync threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _dist import run_ranks
from torch import Tensor, nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from shadowsync.sync.runner import (
    FixedRateSyncRunner,
    ShadowSyncRunner,
    SlowdownPacer,
    SyncError,
    SyncStats,
    broadcast_,
    new_sync_group,
)
from shadowsync.sync.strategies import (
    BlockwiseModelUpdateFiltering,
    ElasticAveraging,
    ModelAveraging,
    SyncStrategy,
)

IN_DIM = 8
LR = 0.01


# ----------------------------------------------------------------------------- helpers
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


def train_step(model: nn.Module, x: Tensor, y: Tensor, lr: float = LR) -> None:
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
                           ) -> tuple[SyncError | None, float]:
    """Train with ``runner`` until a step raises SyncError (or ``steps`` pass); returns the
    error and when it was raised. ``before_step(step)`` runs before each runner step."""
    error: SyncError | None = None
    for step, (x, y) in enumerate(rank_data(rank, steps), start=1):
        train_step(model, x, y)
        before_step(step)
        try:
            runner.step()
        except SyncError as exc:
            error = exc
            break
        time.sleep(STEP_SLEEP_S)
    return error, time.time()


# ----------------------------------------------------------------------------- world of one
@pytest.fixture
def world1() -> Iterator[dist.ProcessGroup]:
    """A gloo world of one in this process, and its sync group."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield new_sync_group(timeout=timedelta(seconds=30))
    finally:
        dist.destroy_process_group()


def params_of(model: nn.Module) -> list[Tensor]:
    return list(model.parameters())


def test_rejects_bad_arguments(world1: dist.ProcessGroup) -> None:
    ps = params_of(make_model())
    ma = ModelAveraging()
    cases: list[tuple[Callable[[], object], type[Exception], str]] = [
        (lambda: ShadowSyncRunner([], ma, world1), ValueError, "empty"),
        (lambda: ShadowSyncRunner([ps[0], ps[0]], ma, world1), ValueError, "twice"),
        (lambda: ShadowSyncRunner([ps[0], ps[1].double()], ma, world1), ValueError, "dtype"),
        (lambda: ShadowSyncRunner([torch.zeros(2, dtype=torch.long)], ma, world1), ValueError,
         "floating"),
        (lambda: ShadowSyncRunner(ps, object(), world1), TypeError, "SyncStrategy"),  # type: ignore[arg-type]
        (lambda: ShadowSyncRunner(ps, ma, None), TypeError, "new_sync_group"),  # type: ignore[arg-type]
        (lambda: ShadowSyncRunner(ps, ma, world1, max_comm_share=0.0), ValueError,
         "max_comm_share"),
        (lambda: ShadowSyncRunner(ps, ma, world1, min_interval_s=-1.0), ValueError,
         "min_interval_s"),
        (lambda: ShadowSyncRunner(ps, ma, world1, min_interval_s=1.0, deadline_s=0.5),
         ValueError, "deadline_s"),
        (lambda: FixedRateSyncRunner(ps, ma, world1, period=0), ValueError, "period"),
        (lambda: FixedRateSyncRunner(ps, ma, world1, period=1, chunk_bytes=8), ValueError,
         "chunk_bytes"),
        (lambda: new_sync_group(timeout=timedelta(0)), ValueError, "timeout"),
        (lambda: new_sync_group("nccl", socket_ifname="lo"), ValueError, "gloo"),
        (lambda: ShadowSyncRunner(ps, ma, world1, thread_nice=20), ValueError, "thread_nice"),
        (lambda: ShadowSyncRunner(ps, ma, world1, max_staleness=0), ValueError,
         "max_staleness"),
        (lambda: ShadowSyncRunner(ps, ma, world1, max_slowdown=0.05, slowdown_window=0),
         ValueError, "slowdown_window"),
    ]
    for make, exc, match in cases:
        with pytest.raises(exc, match=match):
            make()
    paced = ShadowSyncRunner(ps, ma, world1, max_slowdown=0.05, slowdown_window=64)
    assert paced._pacer is not None and paced._pacer.cost_window == 64
    runner = ShadowSyncRunner(ps, ma, world1)
    with pytest.raises(RuntimeError, match="not started"):
        runner.step()
    runner.start()
    with pytest.raises(RuntimeError, match="twice"):
        runner.start()
    with pytest.raises(RuntimeError, match="consistent"):
        runner.state_dict()
    with pytest.raises(RuntimeError, match="consistent"):
        runner.load_state_dict({})
    runner.stop()


def test_thread_nice_lowers_the_sync_thread_alone(world1: dist.ProcessGroup) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    runner = ShadowSyncRunner(params_of(make_model()), ModelAveraging(), world1, thread_nice=7)
    runner.start()
    thread = next(t for t in threading.enumerate() if t.name.startswith("shadowsync-"))
    deadline = time.perf_counter() + 5.0
    assert thread.native_id is not None
    while (os.getpriority(os.PRIO_PROCESS, thread.native_id) != min(base + 7, 19)
           and time.perf_counter() < deadline):
        runner.step()  # the thread lowers itself as it starts
    assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == min(base + 7, 19)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    runner.stop()


def test_a_pause_cut_short_by_stop_is_finished_after_start(world1: dist.ProcessGroup) -> None:
    """Rounds at most one a second: a stop right after the first round ends its pause with the
    stop round, and the next start waits out the rest of that second before its first
    round."""

    def step_while(cond: Callable[[], bool], limit_s: float) -> float:
        began = time.perf_counter()
        while cond() and time.perf_counter() - began < limit_s:
            runner.step()
            time.sleep(0.005)
        return time.perf_counter() - began

    runner = ShadowSyncRunner(params_of(make_model()), ModelAveraging(), world1,
                              min_interval_s=1.0)
    runner.start()
    step_while(lambda: runner.stats().syncs_applied < 1, 5.0)
    runner.stop(final_sync=False)  # cuts the pause short, with the stop round
    rounds = runner.stats().rounds
    runner.start()
    step_while(lambda: True, 0.4)
    assert runner.stats().rounds == rounds  # still inside the carried pause
    waited = step_while(lambda: runner.stats().rounds == rounds, 5.0)
    assert runner.stats().rounds > rounds and waited < 1.0
    runner.stop(final_sync=False)


def test_socket_ifname_binds_the_sync_group_and_restores_the_environment(
        world1: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "before")
    group = new_sync_group(timeout=timedelta(seconds=30), socket_ifname="lo")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "before"
    x = torch.ones(3)
    dist.all_reduce(x, group=group)
    assert x.tolist() == [1.0, 1.0, 1.0]
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    with pytest.raises(RuntimeError):  # gloo's own error names the interface
        new_sync_group(timeout=timedelta(seconds=30), socket_ifname="no-such-if0")
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_fixed_rate_schedule_follows_periodic_model_averager(world1: dist.ProcessGroup) -> None:
    model = make_model()
    runner = FixedRateSyncRunner(params_of(model), ModelAveraging(), world1, period=3)
    runner.start()
    for _ in range(7):
        runner.step()
    s = runner.stats()
    assert (s.steps, s.rounds, s.syncs_applied) == (7, 3, 3)  # after steps 1, 4, 7
    assert (s.gap_max, s.staleness_max, s.staleness_mean) == (3, 0, 0.0)
    resumed = FixedRateSyncRunner(params_of(model), ModelAveraging(), world1, period=3)
    resumed.start()
    resumed.load_state_dict(runner.state_dict())  # allowed while running: no thread
    for _ in range(3):
        resumed.step()
    assert (resumed.stats().steps, resumed.stats().rounds) == (10, 4)  # schedule carried on
    for r in (runner, resumed):
        r.stop(final_sync=False)


def test_state_dict_round_trip_and_restart(world1: dist.ProcessGroup) -> None:
    model = make_model()
    runner = ShadowSyncRunner(params_of(model), ElasticAveraging(0.5), world1)
    data = rank_data(0, 60)
    runner.start()
    for x, y in data[:30]:
        train_step(model, x, y)
        runner.step()
    runner.stop(final_sync=False)
    sd = runner.state_dict()
    assert sd["counters"]["steps"] == 30 and sd["counters"]["rounds"] >= 1
    resumed = ShadowSyncRunner(params_of(model), ElasticAveraging(0.5), world1)
    resumed.load_state_dict(sd)
    assert torch.equal(resumed.strategy.state_dict()["center"], sd["strategy"]["center"])
    for r in (runner, resumed):  # a restarted runner and a resumed one both carry on
        r.start()
        for x, y in data[30:]:
            train_step(model, x, y)
            r.step()
        r.stop(final_sync=True)
        assert r.stats().steps == 60
        assert r.stats().rounds > sd["counters"]["rounds"]


class SlowAveraging(ModelAveraging):
    """Model averaging whose rounds take at least ``busy_s`` seconds."""

    def __init__(self, busy_s: float) -> None:
        super().__init__()
        self.busy_s = busy_s

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        time.sleep(self.busy_s)
        return super().reduce_input(snapshot)


@pytest.mark.parametrize("busy_s,pacing,period_s", [
    (0.0, {"min_interval_s": 0.1}, 0.1),
    (0.02, {"max_comm_share": 0.25}, 0.08),  # 0.02 s busy, then 0.06 s asleep
])
def test_pacing_bounds_the_round_rate(world1: dist.ProcessGroup, busy_s: float,
                                      pacing: dict[str, float], period_s: float) -> None:
    runner = ShadowSyncRunner(params_of(make_model()), SlowAveraging(busy_s), world1, **pacing)
    runner.start()
    began = time.perf_counter()
    while time.perf_counter() - began < 0.5:
        runner.step()
        time.sleep(0.001)
    rounds = runner.stats().rounds
    runner.stop(final_sync=False)
    assert 2 <= rounds <= 0.5 / period_s + 1


def test_max_staleness_makes_the_boundary_wait_for_the_round(
        world1: dist.ProcessGroup) -> None:
    """Rounds of 30 ms beside 1 ms steps: unbounded, a sync lands dozens of steps after its
    snapshot; with ``max_staleness`` K, the K-th boundary after a snapshot waits for its round,
    so no sync is older than K steps, and with K = 1 every later step applies one."""

    def run(**bound: int) -> SyncStats:
        runner = ShadowSyncRunner(params_of(make_model()), SlowAveraging(0.03), world1, **bound)
        runner.start()
        for _ in range(40):
            runner.step()
            time.sleep(0.001)
        stats = runner.stats()
        runner.stop(final_sync=False)
        return stats

    free, k3, k1 = run(), run(max_staleness=3), run(max_staleness=1)
    assert free.staleness_max > 10 and math.isnan(free.wait_seconds), free
    assert k3.staleness_max == 3 and 0.02 * (k3.syncs_applied - 1) < k3.wait_seconds, k3
    assert (k1.staleness_max, k1.staleness_mean) == (1, 1.0), k1
    assert k1.syncs_applied >= 40 - 3 and k1.gap_max <= 3, k1  # the first snapshot may lag
    assert 0.025 * (k1.syncs_applied - 1) < k1.wait_seconds, k1


class StallingStrategy(ModelAveraging):
    """Blocks inside a round until released, then fails: a stalled synchronizer."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        self.release.wait()
        raise RuntimeError("released")


def test_deadline_turns_a_stall_into_sync_error(world1: dist.ProcessGroup) -> None:
    strategy = StallingStrategy()
    runner = ShadowSyncRunner(params_of(make_model()), strategy, world1, deadline_s=0.3)
    runner.start()
    began = time.perf_counter()
    with pytest.raises(SyncError, match="rank 0.*no synchronization round completed"):
        while time.perf_counter() - began < 5.0:
            runner.step()
            time.sleep(0.01)
    assert time.perf_counter() - began < 3.0
    with pytest.raises(SyncError):
        runner.stop()
    strategy.release.set()  # the thread then fails and exits before the group is destroyed
    for thread in threading.enumerate():
        if thread.name.startswith("shadowsync-"):
            thread.join(5.0)
            assert not thread.is_alive()


# ----------------------------------------------------------------------------- two ranks
PERIOD = 3
FR_STEPS = 20


def fixed_rate_vs_periodic_model_averager(rank: int, world_size: int) -> dict[str, Any]:
    """Same model, data and seeds: FixedRateSyncRunner(MA) next to PeriodicModelAverager."""
    ours, theirs = make_model(), make_model()
    broadcast_(params_of(ours))
    runner = FixedRateSyncRunner(params_of(ours), ModelAveraging(), new_sync_group(),
                                 period=PERIOD)
    averager = PeriodicModelAverager(period=PERIOD, warmup_steps=0)
    runner.start()
    max_diff, spreads = 0.0, []
    for x, y in rank_data(rank, FR_STEPS):
        train_step(ours, x, y, lr=0.1)
        runner.step()
        train_step(theirs, x, y, lr=0.1)
        averager.average_parameters(theirs.parameters())
        max_diff = max(max_diff, (flat(ours) - flat(theirs)).abs().max().item())
        spreads.append(spread(gather_flat(ours)))
    stats = runner.stats()
    runner.stop(final_sync=True)
    return {"max_diff": max_diff, "spreads": spreads, "final": gather_flat(ours),
            "rounds": stats.rounds}


def test_fixed_rate_ma_matches_periodic_model_averager() -> None:
    results = run_ranks(fixed_rate_vs_periodic_model_averager, timeout_s=60)
    for r in results:
        assert r["max_diff"] < 1e-6
        assert r["rounds"] == math.ceil(FR_STEPS / PERIOD)
    spreads = results[0]["spreads"]
    # Replicas agree right after each round (steps 1, 4, 7, ...) and drift apart in between,
    # so the comparison above really exercised the alignment of the schedules.
    synced = [spreads[i] for i in range(0, FR_STEPS, PERIOD)]
    drifted = [spreads[i] for i in range(FR_STEPS) if i % PERIOD]
    assert max(synced) < 1e-6 < min(drifted)
    final = results[0]["final"]
    assert torch.equal(final[0], final[1])


SHADOW_STEPS = 150
STEP_SLEEP_S = 0.002
@dataclasses.dataclass(frozen=True)
class Run:
    """One shadow training run. ``lockstep`` adds a per-step collective on the default group,
    as TorchRec's sparse all-to-alls do; without it rank 1 runs 3x slower than rank 0."""

    name: str
    make: Callable[[], SyncStrategy] | None
    pacing: dict[str, float] = dataclasses.field(default_factory=dict)
    lockstep: bool = True
    max_spread: float = 0.3  # of the unsynchronized control's, at the end of training


CONTROL = Run("no_sync", None)
SHADOW_RUNS = [
    Run("ma", ModelAveraging),
    Run("easgd", functools.partial(ElasticAveraging, alpha=0.4)),
    Run("bmuf", BlockwiseModelUpdateFiltering),
    Run("bmuf_nesterov", functools.partial(BlockwiseModelUpdateFiltering, 0.3, nesterov=True)),
    Run("ma_paced", ModelAveraging, {"min_interval_s": 0.01, "max_comm_share": 0.8}),
    Run("ma_uneven", ModelAveraging, lockstep=False),
    Run("ma_bf16", functools.partial(ModelAveraging, wire_dtype=torch.bfloat16)),
    Run("easgd_fp16", functools.partial(ElasticAveraging, alpha=0.4, wire_dtype=torch.float16)),
    Run("ma_slowdown", ModelAveraging, {"max_slowdown": 0.05}, max_spread=0.6),  # rarer rounds
    Run("bmuf_chunked", BlockwiseModelUpdateFiltering, {"chunk_bytes": 256}),  # 3 collectives
    Run("ma_chunks_paced", ModelAveraging, {"chunk_bytes": 256, "max_comm_share": 0.5},
        max_spread=0.6),  # half the link time: rarer rounds by design
    Run("ma_stale1", ModelAveraging, {"max_staleness": 1}),  # both ranks wait, none hangs
]


def train_run(rank: int, group: dist.ProcessGroup, run: Run) -> dict[str, Any]:
    """Train from the same initial replica; synchronize unless ``run.make`` is None."""
    model = make_model()
    runner = None if run.make is None else ShadowSyncRunner(
        params_of(model), run.make(), group, deadline_s=20.0, **run.pacing)
    pause = STEP_SLEEP_S * (1 if run.lockstep or rank == 0 else 3)
    began = time.perf_counter()
    if runner is not None:
        runner.start()
    for x, y in rank_data(rank, SHADOW_STEPS):
        train_step(model, x, y)
        if run.lockstep:
            dist.all_reduce(torch.zeros(1))
        if runner is not None:
            runner.step()
        time.sleep(pause)
    out: dict[str, Any] = {"spread": spread(gather_flat(model))}
    if runner is not None:
        out["during"] = runner.stats()
        runner.stop(final_sync=True)
        out["after"] = runner.stats()
        final = gather_flat(model)
        out["identical"] = torch.equal(final[0], final[1])
        out["finite"] = bool(final[0].isfinite().all())
        out["numel"] = final[0].numel()
        wire = run.make().wire_dtype or torch.float32
        out["wire_bytes"] = torch.empty(0, dtype=wire).element_size()
    out["seconds"] = time.perf_counter() - began
    return out


def shadow_runs(rank: int, world_size: int) -> dict[str, Any]:
    group = new_sync_group(timeout=timedelta(seconds=20))
    return {run.name: train_run(rank, group, run) for run in [CONTROL, *SHADOW_RUNS]}


def test_shadow_runs_sync_in_the_background_and_end_identical() -> None:
    results = run_ranks(shadow_runs, timeout_s=90, safe_types=[SyncStats])
    control = results[0][CONTROL.name]["spread"]
    assert control > 0.5
    for rank, res in enumerate(results):
        for spec in SHADOW_RUNS:
            run = res[spec.name]
            during, after = run["during"], run["after"]
            label = f"rank {rank} {spec.name}: {during}"
            assert during.syncs_applied > 0 and during.rounds >= during.syncs_applied, label
            assert 1.0 <= during.gap_mean <= during.gap_max < SHADOW_STEPS, label
            assert 0 <= during.staleness_mean <= during.staleness_max, label
            assert during.comm_seconds > 0 and during.rounds_per_s > 0, label
            # every round reduces numel + 2 + world size wire values (payload, stop, quiet
            # seconds, abort by rank); the final consensus as many float32 values
            per_round = run["numel"] + 2 + len(results)
            assert after.bytes_reduced == per_round * (after.rounds * run["wire_bytes"] + 4), label
            assert after.syncs_applied == after.rounds, label  # stop() drained the last delta
            if spec.lockstep:
                assert run["spread"] < spec.max_spread * control, (label, run["spread"], control)
            assert run["identical"] and run["finite"], label
            assert run["seconds"] < 15.0, label
    for res in results:
        assert res["ma_stale1"]["during"].staleness_max == 1, res["ma_stale1"]
    paced = results[0]["ma_paced"]["during"]
    assert paced.rounds_per_s < 1 / 0.01 + 5  # min_interval_s caps the round rate


class FaultyAveraging(ModelAveraging):
    """Model averaging whose delta raises on one round (on the rank that sets ``fail_round``)."""

    def __init__(self, fail_round: int | None) -> None:
        super().__init__()
        self.fail_round = fail_round
        self.failed_at: float | None = None

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        if self.rounds + 1 == self.fail_round:
            self.failed_at = time.time()
            raise RuntimeError("injected fault")
        return super().delta(snapshot, reduced)


def fault_run(rank: int, world_size: int) -> dict[str, Any]:
    model = make_model()
    strategy = FaultyAveraging(fail_round=3 if rank == 0 else None)
    runner = ShadowSyncRunner(params_of(model), strategy, new_sync_group(
        timeout=timedelta(seconds=20)))
    runner.start()
    error, raised_at = train_until_sync_error(model, runner, rank, 3000)
    with pytest.raises(SyncError):
        runner.stop()
    return {"message": str(error), "cause": repr(error.__cause__) if error else None,
            "raised_at": raised_at, "failed_at": strategy.failed_at,
            "stopped_in": time.time() - raised_at}


def test_fault_in_thread_surfaces_as_sync_error_on_both_ranks() -> None:
    faulty, peer = run_ranks(fault_run, timeout_s=60)
    assert faulty["failed_at"] is not None
    assert "rank 0" in faulty["message"] and "injected fault" in faulty["message"]
    assert "injected fault" in faulty["cause"]
    assert "rank 1" in peer["message"] and "aborted" in peer["message"]
    for r in (faulty, peer):
        # The abort round, not the 20 s group timeout; generous for a loaded 2-core machine.
        assert r["raised_at"] - faulty["failed_at"] < 5.0, r
        assert r["stopped_in"] < 3.0, r



# ----------------------------------------------------------------------------- hand-off
class CountingStrategy(ModelAveraging):
    """Every round's delta adds exactly 1 to every parameter, and each snapshot is recorded.

    With nothing else moving the parameters, snapshot ``r`` (1-based) must read ``r - 1``: it
    was taken after the ``r - 1`` earlier deltas were applied. A snapshot taken before the
    previous delta landed reads one less; a lost delta leaves ``syncs_applied < rounds``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        self.seen.append(snapshot[0].item())
        self.rounds += 1
        return torch.ones_like(snapshot)


def hammer(rank: int, world_size: int, rounds: int = 1_000, budget_s: float = 8.0,
           **bound: int) -> dict[str, Any]:
    """Tight step loop against the sync thread with a tiny switch interval (the thread is
    preempted between any two bytecodes, which is where a two-read hand-off breaks), until
    ``rounds`` rounds or ``budget_s``: tens of thousands of steps. The hand-off this replaced
    failed within a few thousand steps here."""
    import sys

    params = [torch.zeros(4)]
    strategy = CountingStrategy()
    runner = ShadowSyncRunner(params, strategy, new_sync_group(timeout=timedelta(seconds=20)),
                              deadline_s=10.0, **bound)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        runner.start()
        began, done = time.perf_counter(), 0
        while runner.stats().rounds < rounds and time.perf_counter() - began < budget_s:
            for _ in range(1_000):
                runner.step()
            done += 1_000
        runner.stop(final_sync=False)
    finally:
        sys.setswitchinterval(old)
    s = runner.stats()
    return {"steps": done, "rounds": s.rounds, "applied": s.syncs_applied,
            "staleness_max": s.staleness_max,
            "in_order": strategy.seen == [float(i) for i in range(len(strategy.seen))],
            "first_bad": next((i for i, v in enumerate(strategy.seen) if v != i), None),
            "value": params[0][0].item()}


def check_hammer(res: dict[str, Any], min_steps: int = 20_000) -> None:
    assert res["steps"] >= min_steps and res["rounds"] >= 300, res
    assert res["rounds"] == res["applied"] == res["value"], res
    assert res["in_order"], res


def test_handoff_never_snapshots_before_the_previous_delta(world1: dist.ProcessGroup) -> None:
    check_hammer(hammer(0, 1))


def test_handoff_holds_with_every_step_awaiting_its_round(world1: dist.ProcessGroup) -> None:
    """With ``max_staleness=1`` each boundary waits for the round, applies it and serves the
    next snapshot, which the thread asked for with the delta: a request renewed after that
    boundary served it would leave the next boundary waiting for a round that never starts."""
    res = hammer(0, 1, max_staleness=1)
    check_hammer(res, min_steps=1_000)
    assert res["staleness_max"] == 1, res


def test_handoff_holds_on_two_ranks() -> None:
    for res in run_ranks(hammer, timeout_s=60):
        check_hammer(res)


# ----------------------------------------------------------------------------- failures
class FailingRunner(ShadowSyncRunner):
    """Raises in one stage of the sync thread's loop, in round ``fail_round``."""

    def __init__(self, *args: Any, stage: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stage = stage
        self.failed_at: float | None = None

    def _maybe_fail(self, stage: str) -> None:
        if stage == self.stage and self._counters.rounds >= 3:
            self.failed_at = time.time()
            raise RuntimeError(f"injected fault in {stage}")

    def _pause_s(self, began: float, ended: float, quiet_s: float) -> float:
        self._maybe_fail("pace")
        return super()._pause_s(began, ended, quiet_s)

    def _post(self, done: Any, ask: bool) -> None:
        self._maybe_fail("post")
        super()._post(done, ask)

    def _record_ready(self) -> Any:
        self._maybe_fail("event")
        return super()._record_ready()

    def _request_snapshot(self, asked: bool = False) -> bool:
        self._maybe_fail("ask")
        return super()._request_snapshot(asked)


STAGES = ["pace", "post", "event", "ask"]


def stage_failures(rank: int, world_size: int) -> dict[str, Any]:
    """For each stage, rank 1 fails there; both ranks must raise soon, naming rank 1."""
    out = {}
    for stage in STAGES:
        model = make_model()
        runner = FailingRunner(params_of(model), ModelAveraging(),
                               new_sync_group(timeout=timedelta(seconds=30)),
                               stage=stage if rank == 1 else None, min_interval_s=0.005)
        runner.start()
        error, raised_at = train_until_sync_error(model, runner, rank, 5000)
        with contextlib.suppress(SyncError):
            runner.stop()
        out[stage] = {"message": str(error), "raised_at": raised_at,
                      "failed_at": runner.failed_at}
        dist.barrier()
    return out


def test_a_failure_anywhere_on_the_thread_reaches_peers() -> None:
    peer, faulty = run_ranks(stage_failures, timeout_s=90)
    for stage in STAGES:
        f, p = faulty[stage], peer[stage]
        assert f["failed_at"] is not None, stage
        assert "rank 1" in f["message"] and f"injected fault in {stage}" in f["message"], f
        assert "rank 0" in p["message"] and "rank(s) [1] failed" in p["message"], (stage, p)
        for r in (f, p):  # the abort round, not the 30 s group timeout
            assert r["raised_at"] - f["failed_at"] < 5.0, (stage, r)


def nonfinite_run(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0's replica goes NaN at step 40 (as a diverging optimizer would make it)."""
    model = make_model()
    runner = ShadowSyncRunner(params_of(model), ModelAveraging(),
                              new_sync_group(timeout=timedelta(seconds=20)))
    runner.start()

    @torch.no_grad()
    def poison(step: int) -> None:
        if rank == 0 and step == 40:
            next(model.parameters())[0, 0] = math.nan

    error, _ = train_until_sync_error(model, runner, rank, 3000, poison)
    with contextlib.suppress(SyncError):
        runner.stop()
    peer_finite = bool(flat(model).isfinite().all()) if rank == 1 else None
    return {"type": type(error).__name__, "message": str(error), "peer_finite": peer_finite}


def test_a_non_finite_replica_fails_on_its_rank_before_peers_average_it() -> None:
    holder, peer = run_ranks(nonfinite_run, timeout_s=60)
    assert holder["type"] == "NonFiniteError", holder
    assert "rank 0" in holder["message"] and "not finite" in holder["message"], holder
    assert "synchronization round" in holder["message"], holder
    assert peer["type"] == "PeerAborted" and "rank(s) [0] failed" in peer["message"], peer
    assert peer["peer_finite"], "the NaN must not have been averaged into the peer's replica"


# ----------------------------------------------------------------------------- pacing
def test_slowdown_pacer_spaces_rounds_by_what_one_costs() -> None:
    """Busy steps 1.5x as long as quiet ones: a round that keeps 2 steps busy costs a whole
    step, so a 5% budget allows one round every 20 steps, and that round is followed by 18
    quiet ones."""
    pacer = SlowdownPacer(0.05)
    assert math.isnan(pacer.round_gap())  # nothing measured yet
    assert pacer.quiet_seconds() == 0.0  # ... so back to back
    for _ in range(10):
        pacer.observe(0.010, busy=False)
    pacer.observe(0.015, busy=True, began_round=True)
    pacer.observe(0.015, busy=True)
    assert pacer.round_steps() == pytest.approx(1.0)
    assert pacer.round_gap() == pytest.approx(20)
    assert pacer.quiet_seconds() == pytest.approx(18 * 0.010)
    with pytest.raises(ValueError, match="a step that began a round is busy"):
        pacer.observe(0.010, busy=False, began_round=True)
    # A round that costs less than the budget runs back to back (each step begins one), but
    # every explore_every-th round leaves 3 quiet steps so the quiet step time stays measured.
    cheap = SlowdownPacer(0.05, explore_every=4)
    for _ in range(5):
        cheap.observe(0.010, busy=False)
    for _ in range(5):
        cheap.observe(0.0102, busy=True, began_round=True)
    assert cheap.round_steps() == pytest.approx(0.02)
    waits = [cheap.quiet_seconds() for _ in range(8)]
    assert waits == [0, 0, 0, pytest.approx(0.03), 0, 0, 0, pytest.approx(0.03)]
    # Most of a round's cost on two of its 8 busy steps (the snapshot copy, a burst): a median
    # would call the round nearly free (2% a step) and run back to back; the mean sees the 52%
    # a step that the step rate loses, 4.12 steps a round, and budgets for it.
    tail = SlowdownPacer(0.05)
    steps = [(0.010, False, False)] * 8 + [(0.0102, True, True)] + [(0.0102, True, False)] * 5
    for seconds, busy, began in steps + [(0.030, True, False)] * 2:
        tail.observe(seconds, busy, began)
    assert tail.round_cost() == pytest.approx((6 * 0.0102 + 2 * 0.030) / 8 / 0.010 - 1)
    assert tail.round_steps() == pytest.approx(8 * tail.round_cost())
    assert tail.round_gap() == pytest.approx(8 * tail.round_cost() / 0.05)
    with pytest.raises(ValueError, match="max_slowdown"):
        SlowdownPacer(1.0)
    with pytest.raises(ValueError, match="cost_window must be >= 1, got 0"):
        SlowdownPacer(0.05, cost_window=0)


def test_slowdown_pacer_costs_a_round_however_many_steps_it_spans() -> None:
    """A lone round keeps two steps busy, +10% and +0% (the snapshot copy, then the apply):
    5% a busy step, within a 6% budget, so a pacer that costs busy steps would run rounds back
    to back. Back to back each step begins a round and loses the 10% a round costs. Costed per
    round (0.1 steps) the budget allows one every 0.1 / 0.06 steps, and a round that kept one
    step busy is followed by the other 0.667 of a step, quiet."""
    pacer = SlowdownPacer(0.06, explore_every=1000)
    for _ in range(3):
        pacer.observe(0.010, busy=False)
    for _ in range(4):
        pacer.quiet_seconds()
        for seconds, busy, began in [(0.011, True, True), (0.010, True, False)] + [
                (0.010, False, False)] * 3:
            pacer.observe(seconds, busy, began)
    assert pacer.round_cost() == pytest.approx(0.05)
    assert pacer.round_steps() == pytest.approx(0.1)
    assert pacer.round_gap() == pytest.approx(0.1 / 0.06)
    pacer.quiet_seconds()
    pacer.observe(0.011, busy=True, began_round=True)  # a round that kept one step busy
    assert pacer.quiet_seconds() == pytest.approx((0.1 / 0.06 - 1) * 0.010)


def test_slowdown_pacer_compares_each_round_with_the_quiet_steps_beside_it() -> None:
    """After a pause the machine runs at 10 ms a quiet step where it ran 15 before, and rounds
    make a step 20% slower (12 ms). Recent means would set 12 ms busy against quiet steps
    still mostly from before and call the round free (back to back); each busy run against the
    quiet runs on either side of it reads 0.2 a step, 0.6 a round of 3 busy steps, which a 5%
    budget turns into one round every 12 steps."""
    pacer = SlowdownPacer(0.05)
    for _ in range(32):
        pacer.observe(0.015, busy=False)
    pacer.interrupt()
    for _ in range(3):
        pacer.observe(0.010, busy=False)
    round_of_3 = [(0.012, True, True)] + [(0.012, True, False)] * 2 + [(0.010, False, False)] * 3
    for _ in range(4):
        for seconds, busy, began in round_of_3:
            pacer.observe(seconds, busy, began)
    window_cost = sum(pacer._busy) / len(pacer._busy) / (sum(pacer._quiet) / len(pacer._quiet))
    assert window_cost < 1  # what recent means alone would have read: cheaper than free
    assert pacer.round_cost() == pytest.approx(0.2)
    assert pacer.round_steps() == pytest.approx(0.6)
    assert pacer.round_gap() == pytest.approx(12)
    # A pause breaks the runs: the busy run after it is not set against the quiet run before.
    pacer.interrupt()
    for seconds, busy, began in [(0.050, True, True)] * 3 + [(0.010, False, False)] * 3:
        pacer.observe(seconds, busy, began)
    assert pacer.round_cost() == pytest.approx(0.2)
    # Only the last cost_window (128) busy steps' worth of runs counts: dearer rounds replace
    # it. It holds 43 runs of 3 (without the oldest, 126 would be too few), and the 0.2 runs
    # leave it one by one (each round brackets the run before it).
    for rounds, cost in [(43, 0.3 - 0.1 / 43), (1, 0.3)]:
        for _ in range(rounds):
            for seconds, busy, began in [(0.013, True, True)] + [(0.013, True, False)] * 2 + [
                    (0.010, False, False)] * 3:
                pacer.observe(seconds, busy, began)
        assert pacer.round_cost() == pytest.approx(cost)
        assert pacer.round_steps() == pytest.approx(3 * cost)


def test_slowdown_pacer_raises_the_cost_for_its_noise() -> None:
    """Rounds of 3 busy steps that cost 0.3 and 0.9 steps by turns read 0.6 on average. The
    pacer budgets against 0.6 + se**2 / 0.6 (``se``: the ratio estimator's standard error over
    the runs, float64 reference), which makes the expected loss the budget; rounds that cost
    -0.3 and 0.6 read 0.15, within one ``se`` of free, and get ``se`` itself: a 5% budget
    would otherwise run them nearly back to back."""

    def paced(busy: list[float]) -> tuple[SlowdownPacer, float, float]:
        pacer = SlowdownPacer(0.05)
        for _ in range(3):
            pacer.observe(0.010, busy=False)
        for step in busy:
            for seconds, is_busy, began in [(step, True, True)] + [(step, True, False)] * 2 + [
                    (0.010, False, False)] * 3:
                pacer.observe(seconds, is_busy, began)
        pacer.observe(busy[0], busy=True)  # ends the last quiet run: the last round bracketed
        # Each run: 3 busy steps against 3 steps at the 10 ms beside it, in steps, one round
        # each; Python floats.
        excess, n = [3 * (step - 0.010) / 0.010 for step in busy], len(busy)
        cost = sum(excess) / n
        se = math.sqrt(n / (n - 1) * sum((e - cost) ** 2 for e in excess)) / n
        assert pacer.round_steps() == pytest.approx(cost)  # reported: no margin
        return pacer, cost, se

    pacer, cost, se = paced([0.011, 0.013, 0.011, 0.013])
    assert (cost, se) == (pytest.approx(0.6), pytest.approx(0.1732, abs=1e-4))
    assert pacer.round_gap() == pytest.approx((cost + se**2 / cost) / 0.05)
    pacer, cost, se = paced([0.009, 0.012, 0.009, 0.012])
    assert (cost, se) == (pytest.approx(0.15), pytest.approx(0.2598, abs=1e-4))
    assert pacer.round_gap() == pytest.approx((cost + se) / 0.05)
    # One run alone has no spread to measure: no margin.
    single = SlowdownPacer(0.05)
    for seconds, busy, began in [(0.010, False, False)] * 3 + [(0.013, True, True)] * 3 + [
            (0.010, False, False)] * 3 + [(0.013, True, True)]:
        single.observe(seconds, busy, began)
    assert len(single._bracketed) == 1
    assert single.round_gap() == pytest.approx(0.3 / 0.05)


def test_slowdown_pacer_makes_up_quiet_steps_a_pause_did_not_hold() -> None:
    """A pause is set in seconds, and the step that applies a round's delta (busy) falls inside
    it: here every pause holds one quiet step fewer than it lasts. Rounds of 3 busy steps 1.1x
    as long as quiet ones cost 0.3 steps, so a 5% budget allows one every 6 steps (3 quiet
    after each); uncorrected the pause holds 2 and the busy share sits at 0.6, 20% over."""

    def busy_share(pacer: SlowdownPacer, rounds: int) -> float:
        busy = quiet = 0
        for _ in range(rounds):
            held = max(0, round(pacer.quiet_seconds() / 0.010) - 1)
            for seconds, is_busy, began in [(0.011, True, True)] + [(0.011, True, False)] * 2 + [
                    (0.010, False, False)] * held:
                pacer.observe(seconds, is_busy, began)
            busy, quiet = busy + 3, quiet + held
        return busy / (busy + quiet)

    pacer = SlowdownPacer(0.05, explore_every=1000)
    for _ in range(32):
        pacer.observe(0.010, busy=False)
    busy_share(pacer, 20)  # settles
    assert pacer.round_gap() == pytest.approx(6)
    assert busy_share(pacer, 50) == pytest.approx(0.5, abs=0.02)
    assert pacer._shortfall == pytest.approx(1.0, abs=0.3)


class ContendedAveraging(ModelAveraging):
    """Model averaging whose rounds spend ``busy_s`` in a reduction that sets ``contending``
    meanwhile: the test's training steps run 3x slower while it is set, as they do while gloo's
    copies and reductions share the cores. (An explicit slowdown, not a spin holding the GIL, so
    the contention does not depend on the interpreter's switch interval.)"""

    def __init__(self, busy_s: float) -> None:
        super().__init__()
        self.busy_s = busy_s
        self.contending = threading.Event()

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        self.contending.set()
        time.sleep(self.busy_s)
        self.contending.clear()
        return super().reduce_input(snapshot)


def test_accepted_slowdown_spaces_rounds_by_their_measured_cost(
        world1: dist.ProcessGroup) -> None:
    def run(**pacing: float) -> SyncStats:
        algorithm = ContendedAveraging(0.02)
        runner = ShadowSyncRunner(params_of(make_model()), algorithm, world1, **pacing)
        runner.start()
        began = time.perf_counter()
        while time.perf_counter() - began < 1.5:
            runner.step()
            time.sleep(0.006 if algorithm.contending.is_set() else 0.002)  # a training step
        runner.stop(final_sync=False)
        return runner.stats()

    free, budgeted = run(), run(max_slowdown=0.05)
    assert budgeted.rounds >= 3, budgeted
    # A busy step waits for up to a whole round: it costs far more than the 5% budget ...
    assert budgeted.round_cost > 0.5, budgeted
    assert budgeted.round_steps > budgeted.round_cost, budgeted  # a round spans busy steps
    # ... so the pacer keeps busy steps to about 0.05 / cost of all (the budget), and the rounds
    # space out against back to back.
    assert budgeted.busy_share < 2 * 0.05 / budgeted.round_cost + 0.05, budgeted
    assert budgeted.rounds < 0.5 * free.rounds, (free, budgeted)
    assert budgeted.gap_mean > 2 * free.gap_mean, (free, budgeted)
