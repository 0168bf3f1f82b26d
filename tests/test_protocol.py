"""The synchronizer's protocol on spawned gloo ranks: every combination of schedule options
converges without a hang, failures surface where they happen under both failure policies,
and the regressions of the protocol issue stay fixed.

Every run has a collective on the training side each step (an allreduce on the default
group, as TorchRec's all-to-alls are), so a rank that waits for its synchronizer where a peer
cannot reach the same round would hang here; ``run_ranks`` bounds every test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from shadowsync.sync.clock import MonotonicClock
from shadowsync.sync.config import SyncConfig
from shadowsync.sync.errors import PeerAborted, SyncError
from shadowsync.sync.groups import broadcast_, new_sync_group
from shadowsync.sync.protocol import Control, Layout, Levels, Wire
from shadowsync.sync.round import ReplicaSet
from shadowsync.sync.runner import FixedRateOptions, FixedRateSyncRunner
from shadowsync.sync.shadow import ShadowOptions, ShadowSyncRunner
from shadowsync.sync.strategies import (
    BlockwiseModelUpdateFiltering,
    ElasticAveraging,
    ModelAveraging,
    SyncStrategy,
)
from shadowsync.sync.telemetry import SyncStats
from shadowsync.sync.wrapper import ShadowSyncReplicas
from shadowsync.testing import run_ranks
from tests._sync import (
    Recording,
    flat,
    gather_flat,
    make_model,
    rank_data,
    spread,
    train_step,
    train_until_sync_error,
)

pytestmark = pytest.mark.slow

def local_work(rank: int, step: int) -> None:
    """Work only rank 1 does, every third step: the ranks' step clocks, and so their pacers'
    proposals, differ."""
    if rank == 1 and step % 3 == 0:
        a = torch.randn(96, 96)
        for _ in range(8):
            a = torch.tanh(a @ a)


# ----------------------------------------------------------------------------- the matrix
PACERS: dict[str, dict[str, float]] = {
    "min interval": {"min_interval_s": 0.003},
    "comm share": {"max_comm_share": 0.4},
    "slowdown": {"max_slowdown": 0.1},
}
# back to back, each pacer alone, every pair of pacers and all three (the largest pause wins)
SCHEDULES: dict[str, dict[str, float]] = {
    (" + ".join(names) or "back to back"): {k: v for n in names for k, v in PACERS[n].items()}
    for r in range(len(PACERS) + 1) for names in itertools.combinations(PACERS, r)
}
STALENESS = [None, 1, 2]
CHUNKS = [None, 200]  # bytes: the 449-float model's round in ~10 collectives
STRATEGIES: dict[str, Callable[..., SyncStrategy]] = {
    "ma": ModelAveraging,
    "easgd": functools.partial(ElasticAveraging, 0.4),
    "bmuf": BlockwiseModelUpdateFiltering,
}
WIRES = {"float32": None, "bfloat16": torch.bfloat16, "int8": torch.int8}
MATRIX_STEPS = 40


def combinations() -> list[tuple[str, int | None, int | None, str, str]]:
    """(schedule, staleness, chunk bytes, strategy, wire): every shadow schedule with every
    staleness and chunking, and fixed rate (period 3) with every chunking; each with every
    strategy and wire dtype."""
    shadow = itertools.product(SCHEDULES, STALENESS, CHUNKS, STRATEGIES, WIRES)
    fixed = itertools.product(["fixed rate k=3"], [None], CHUNKS, STRATEGIES, WIRES)
    return [*shadow, *fixed]


def _name(combo: tuple[Any, ...]) -> str:
    schedule, k, chunk, strategy, wire = combo
    return f"{schedule}, K={k}, chunks={chunk}, {strategy}, {wire}"


def _matrix(rank: int, world_size: int, switch_interval: float) -> dict[str, dict[str, Any]]:
    group = new_sync_group(timeout=timedelta(seconds=30))
    data = rank_data(rank, MATRIX_STEPS)
    out: dict[str, dict[str, Any]] = {}
    old = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    try:
        for combo in combinations():
            schedule, k, chunk, strategy, wire = combo
            model = make_model()
            params = list(model.parameters())
            made = STRATEGIES[strategy](wire_dtype=WIRES[wire])
            runner: ShadowSyncRunner | FixedRateSyncRunner
            if schedule.startswith("fixed"):
                runner = FixedRateSyncRunner(ReplicaSet(params, made), group,
                                             FixedRateOptions(period=3, chunk_bytes=chunk))
            else:
                runner = Recording(ReplicaSet(params, made), group, ShadowOptions(
                    max_staleness=k, chunk_bytes=chunk, deadline_s=30.0, **SCHEDULES[schedule]))
            began = time.perf_counter()
            runner.start()
            for step, (x, y) in enumerate(data, start=1):
                train_step(model, x, y)
                local_work(rank, step)
                dist.all_reduce(torch.zeros(1))  # the training side's own collective
                runner.step()
            during = runner.stats()
            runner.stop(final_sync=True)
            final = gather_flat(model)
            out[_name(combo)] = {
                "during": during, "after": runner.stats(),
                "identical": torch.equal(final[0], final[1]),
                "finite": bool(final[0].isfinite().all()),
                "snapshots": getattr(runner, "snapshots", None),
                "seconds": time.perf_counter() - began}
    finally:
        sys.setswitchinterval(old)
    return out


@pytest.mark.parametrize("switch_interval", [1e-5, 5e-3], ids=["hostile switch", "default"])
def test_every_schedule_combination_converges_without_a_hang(switch_interval: float) -> None:
    """Every combination (``combinations()``: 300) on 2 ranks, with a training collective each
    step and rank-local work on one rank: no hang, no failure, replicas bit-identical and
    finite after the final sync, every round applied, both ranks through the same rounds; with
    ``max_staleness`` K no round lands later than K steps after its snapshot, and the
    snapshots are taken at the same steps on both ranks."""
    r0, r1 = run_ranks(functools.partial(_matrix, switch_interval=switch_interval),
                       timeout_s=400, safe_types=[SyncStats])
    assert set(r0) == set(r1) == {_name(c) for c in combinations()}
    for combo in combinations():
        name, (_, k, _, _, _) = _name(combo), combo
        a, b = r0[name], r1[name]
        for run in (a, b):
            assert run["identical"] and run["finite"], name
            after = run["after"]
            assert after.rounds >= 2 and after.syncs_applied == after.rounds, (name, after)
            if k is not None:
                assert after.staleness_max <= k, (name, after)
        assert a["after"].rounds == b["after"].rounds, (name, a["after"], b["after"])
        if k is not None:
            assert a["snapshots"] == b["snapshots"], (name, a["snapshots"], b["snapshots"])


# ----------------------------------------------------------------------------- regressions
def _staleness_with_local_pauses(rank: int, world_size: int) -> dict[str, list[int]]:
    """The protocol issue's defect 1: with ``max_staleness`` a rank waited for a round its
    peer could not reach (the peer's pause was timed on its own clock, and its training
    thread was blocked in the next step's collective). 200 steps of each reproduction."""
    group = new_sync_group(timeout=timedelta(seconds=60))
    out = {}
    for name, pacing in [("comm share 0.1", {"max_comm_share": 0.1}),
                         ("min interval 0.05 s", {"min_interval_s": 0.05})]:
        model = make_model()
        runner = Recording(ReplicaSet(list(model.parameters()), ModelAveraging()), group,
                           ShadowOptions(max_staleness=1, deadline_s=60.0, **pacing))
        runner.start()
        for step, (x, y) in enumerate(rank_data(rank, 200), start=1):
            train_step(model, x, y)
            local_work(rank, step)
            dist.all_reduce(torch.zeros(1))
            runner.step()
        runner.stop(final_sync=True)
        out[name] = runner.snapshots
    return out


def test_max_staleness_with_rank_local_pauses_never_hangs() -> None:
    r0, r1 = run_ranks(_staleness_with_local_pauses, timeout_s=120)
    assert r0 == r1, (r0, r1)  # the same snapshot steps on both ranks
    for snapshots in r0.values():
        assert len(snapshots) >= 3, r0


def _small_sync_group(rank: int, world_size: int) -> str | None:
    """The protocol issue's defect 5: abort flags were indexed by global rank in a buffer
    sized by the sync group. A sync group of ranks 1 and 2 of 3: rank 2 (its second member)
    fails, and rank 1 must learn it, naming rank 2."""
    group = dist.new_group([1, 2], backend="gloo", timeout=timedelta(seconds=30))
    if rank == 0:
        return None

    class FailsOnRank2(ModelAveraging):
        def reduce_input(self, snapshot: Tensor) -> Tensor:
            if rank == 2 and self.rounds == 2:
                raise RuntimeError("injected on rank 2")
            return super().reduce_input(snapshot)

    runner = ShadowSyncRunner(ReplicaSet(list(make_model().parameters()), FailsOnRank2()), group,
                              ShadowOptions(max_staleness=1, deadline_s=20.0))
    runner.start()
    try:
        for _ in range(10):
            runner.step()
    except SyncError as e:
        return str(e)
    finally:
        runner.abandon()
    return "no failure"


def test_abort_flags_name_the_failed_rank_of_a_smaller_sync_group() -> None:
    _, peer, failed = run_ranks(_small_sync_group, world_size=3, timeout_s=90)
    assert failed is not None and failed.startswith("rank 2: synchronization failed: "
                                                    "RuntimeError: injected on rank 2"), failed
    assert peer is not None and peer.startswith("rank 1: synchronization failed: PeerAborted: "
                                                "rank(s) [2] failed"), peer


# ----------------------------------------------------------------------------- failures
@dataclasses.dataclass
class InjectedOptions:
    kind: str = "raise"


class Injected(ModelAveraging):
    """Model averaging that, once ``arm`` is called, fails its next round: raises, or never
    returns (a stalled synchronizer). Built from ``sync.strategy.options`` like any strategy
    of one's own, so every runner a merge makes has one too."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.armed = False

    @classmethod
    def from_config(cls, options: InjectedOptions, wire_dtype: torch.dtype | None) -> Injected:
        return cls(options.kind)

    def arm(self) -> None:
        self.armed = True

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        if self.armed:
            self.armed = False
            if self.kind == "raise":
                raise RuntimeError("injected failure")
            threading.Event().wait()
        return super().reduce_input(snapshot)


PLACES = ["round", "boundary", "checkpoint", "end"]
FAIL_TIMEOUT_S = 1.5
FAIL_STEPS = 40  # training steps; a checkpoint at step 20
MAX_STEPS = 5_000  # a stall in a round is found within the deadline, steps go on till then


def _failure(rank: int, world_size: int, kind: str, place: str,
             policy: str) -> dict[str, Any]:
    """One injected failure on rank 1 at ``place``, under ``policy``; returns what each rank
    saw. The training side's allreduce each step doubles as the trainer's control exchange:
    it carries whether each rank's synchronizer failed (then every rank degrades on that
    step) and whether it raised (the run ends once every rank has, or after the steps)."""
    cfg = SyncConfig.from_dict({
        "strategy": {"name": "tests.test_protocol:Injected", "options": {"kind": kind}},
        # The injection must hit a round that runs: with max_staleness=1 every rank's rounds
        # are at the same steps, so the round in flight at a pause (and the stop round after
        # it) is the same round on every rank. Without it a peer's stop round can meet this
        # rank's round in flight, and no further round runs to fail.
        "schedule": {"max_staleness": None if place == "round" else 1},
        "failure": {"on_failure": policy, "timeout_s": FAIL_TIMEOUT_S,
                    "rejoin_after_steps": 5}})
    wrapper = ShadowSyncReplicas(cfg)
    model = make_model()
    wrapper.wrap(model, SimpleNamespace(process_group=dist.group.WORLD),  # type: ignore[arg-type]
                 torch.device("cpu"))

    def arm() -> None:
        assert wrapper.runner is not None
        wrapper.runner.replicas[0].strategy.arm()  # type: ignore[attr-defined]

    raised: SyncError | None = None
    began = time.perf_counter()

    def attempt(call: Callable[[], object]) -> None:
        nonlocal raised
        if raised is None:
            try:
                call()
            except SyncError as e:
                raised = e
                wrapper.abandon()  # as the trainer does when training fails

    data = rank_data(rank, MAX_STEPS)
    steps = 0
    while True:
        x, y = data[steps]
        train_step(model, x, y)
        attempt(wrapper.after_step)
        steps += 1
        if rank == 1 and steps == 10 and place in ("round", "boundary"):
            arm()
        if steps == FAIL_STEPS // 2:
            if rank == 1 and place == "checkpoint":
                arm()
            attempt(lambda: (wrapper.pause(consensus=True), wrapper.state_dict(),
                             wrapper.resume()))
        flags = torch.tensor([float(wrapper.failed()), float(raised is not None),
                              float(wrapper.stats().get("failures", 0) > 0)])
        table = torch.zeros(world_size, 3)
        table[rank] = flags
        dist.all_reduce(table)
        failed = [r for r in range(world_size) if table[r, 0] > 0]
        if failed and raised is None:
            wrapper.degrade(failed)
        everyone_raised = bool((table[:, 1] > 0).all())
        seen = bool((table[:, 2] > 0).any()) or everyone_raised
        if everyone_raised or (steps >= FAIL_STEPS and (seen or place in ("checkpoint", "end")))\
                or steps >= MAX_STEPS:
            break
    if rank == 1 and place == "end" and raised is None:
        arm()
    attempt(wrapper.finish)
    final = gather_flat(model)
    return {"raised": None if raised is None else str(raised), "steps": steps,
            "failures": wrapper.stats().get("failures", 0.0) if raised is None else None,
            "identical": torch.equal(final[0], final[1]),
            "seconds": time.perf_counter() - began}


def _failures(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    out = {}
    for kind, place, policy in itertools.product(["raise", "stall"], PLACES,
                                                 ["raise", "degrade"]):
        out[f"{kind} at {place}, {policy}"] = _failure(rank, world_size, kind, place, policy)
        dist.barrier()
    return out


def test_a_failure_anywhere_surfaces_as_its_policy_says() -> None:
    """Raise and stall, in a round, at a step boundary (``max_staleness=1``), at a checkpoint
    (the rounds of a pause) and at the end (``finish``): with ``raise`` both ranks raise a
    ``SyncError`` naming themselves, the failing rank its own cause; with ``degrade`` no rank
    raises, every rank counts the failure, and the replicas end identical (merged)."""
    r0, r1 = run_ranks(_failures, timeout_s=400)
    for name in r0:
        a, b = r0[name], r1[name]
        if name.endswith("raise"):
            assert a["raised"] is not None and a["raised"].startswith("rank 0: "), (name, a)
            assert b["raised"] is not None and b["raised"].startswith("rank 1: "), (name, b)
            cause = "injected failure" if name.startswith("raise") else "stalled"
            assert cause in b["raised"], (name, b)
        else:
            for r in (a, b):
                assert r["raised"] is None and r["failures"] >= 1, (name, r)
                assert r["identical"], (name, r)
        for r in (a, b):
            assert r["seconds"] < 10 * FAIL_TIMEOUT_S + 15, (name, r)


# ----------------------------------------------------------------------------- two ranks
PERIOD = 3
FR_STEPS = 20


def fixed_rate_vs_periodic_model_averager(rank: int, world_size: int) -> dict[str, Any]:
    """Same model, data and seeds: FixedRateSyncRunner(MA) next to PeriodicModelAverager."""
    ours, theirs = make_model(), make_model()
    broadcast_(list(ours.parameters()))
    runner = FixedRateSyncRunner(ReplicaSet(list(ours.parameters()), ModelAveraging()),
                                 new_sync_group(), FixedRateOptions(period=PERIOD))
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


def _two_sets(rank: int, world_size: int) -> dict[str, Any]:
    """Two replica sets in one runner's rounds (MA on one model, EASGD on another) beside a
    runner of their own for each, on copies of the same models and data; then the two sets in
    one shadow runner, with its consensus at the stop."""
    models = [make_model(seed) for seed in (1, 2, 1, 2)]
    for m in models:
        broadcast_(list(m.parameters()))
    group = new_sync_group()

    def sets(a: torch.nn.Module, b: torch.nn.Module) -> list[ReplicaSet]:
        return [ReplicaSet(list(a.parameters()), ModelAveraging(), "first"),
                ReplicaSet(list(b.parameters()), ElasticAveraging(alpha=0.4), "second")]

    together = FixedRateSyncRunner(sets(models[0], models[1]), group, FixedRateOptions(period=2))
    apart = [FixedRateSyncRunner(s, group, FixedRateOptions(period=2))
             for s in sets(models[2], models[3])]
    for runner in (together, *apart):
        runner.start()
    for x, y in rank_data(rank, 12):
        for m in models:
            train_step(m, x, y, lr=0.1)
        for runner in (together, *apart):
            runner.step()
    same = [torch.equal(flat(models[i]), flat(models[i + 2])) for i in (0, 1)]
    rounds = together.stats().rounds
    for runner in (together, *apart):
        runner.stop(final_sync=False)
    shadow = ShadowSyncRunner(sets(models[0], models[1]), group, ShadowOptions(max_staleness=1))
    shadow.start()
    for x, y in rank_data(rank, 10):
        train_step(models[0], x, y, lr=0.1)
        train_step(models[1], x, y, lr=0.1)
        shadow.step()
    shadow.stop(final_sync=True)
    return {"same": same, "rounds": rounds, "state": list(shadow.state_dict()["strategies"]),
            "final": [gather_flat(models[0]), gather_flat(models[1])]}


def test_one_round_carries_several_replica_sets() -> None:
    """A round of two replica sets gives each exactly what a round of its own would (bitwise:
    each strategy sees its own payload of the one allreduce), and a consensus leaves both sets
    identical on every rank."""
    for r in run_ranks(_two_sets, timeout_s=60):
        assert r["same"] == [True, True] and r["rounds"] == 6, r
        assert r["state"] == ["first", "second"]
        for replicas in r["final"]:
            assert torch.equal(replicas[0], replicas[1])


def _replica_groups(rank: int, world_size: int) -> dict[str, Any]:
    """Two groups of two ranks ([0, 1], [2, 3]): a dense set on every rank, a shard set on the
    ranks that hold the same shard ([0, 2], [1, 3]), one fixed-rate MA round, then shadow rounds
    and a consensus."""
    group = new_sync_group()
    replicas = new_sync_group(partition=[[0, 2], [1, 3]])
    gen = torch.Generator().manual_seed(100 + rank)
    dense = [torch.randn(5, generator=gen), torch.randn(2, 3, generator=gen)]
    shard = [torch.randn(4, 2, generator=gen)]
    before = [t.double().clone() for t in (*dense, *shard)]

    def sets() -> list[ReplicaSet]:
        return [ReplicaSet(dense, ModelAveraging()),
                ReplicaSet(shard, ModelAveraging(), "shard", group=replicas)]

    runner = FixedRateSyncRunner(sets(), group, FixedRateOptions(period=1))
    runner.start()
    runner.step()
    one_round = [t.double().clone() for t in (*dense, *shard)]
    nbytes = runner.stats().bytes_reduced
    runner.stop(final_sync=False)
    shadow = ShadowSyncRunner(sets(), group, ShadowOptions(max_staleness=1))
    shadow.start()
    for step in range(8):
        with torch.no_grad():
            for t in (*dense, *shard):
                t.add_(0.01 * (rank + 1) * (step + 1))
        dist.all_reduce(torch.zeros(1))  # a training collective each step
        shadow.step()
    shadow.stop(final_sync=True)
    everyone = [[torch.empty_like(t) for _ in range(world_size)] for t in (*dense, *shard)]
    for out, t in zip(everyone, (*dense, *shard), strict=True):
        dist.all_gather(out, t)
    return {"before": before, "one_round": one_round, "bytes": nbytes,
            "final": everyone, "rounds": shadow.stats().rounds}


def test_a_round_carries_a_replica_set_of_a_replica_group() -> None:
    """Embedding shards replicated across groups: one round averages the dense set over every
    rank and the shard set over the ranks that hold it (a float64 reference), in one buffer
    per group; after shadow rounds and a consensus every replica of each is identical bitwise,
    while the two shards stay apart."""
    results = run_ranks(_replica_groups, world_size=4, timeout_s=90, safe_types=[SyncStats])
    dense_mean = [torch.stack([r["before"][i] for r in results]).mean(0) for i in (0, 1)]
    for rank, r in enumerate(results):
        holders = [rank % 2, rank % 2 + 2]
        shard_mean = torch.stack([results[h]["before"][2] for h in holders]).mean(0)
        for got, want in zip(r["one_round"], [*dense_mean, shard_mean], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        # one buffer per wire: payload, 3 control slots and a flag per rank of its group
        assert r["bytes"] == 4 * ((5 + 6 + 3 + 4) + (8 + 3 + 2)), r["bytes"]
        assert r["rounds"] >= 1
    for i, everyone in enumerate(results[0]["final"]):
        if i < 2:  # dense: one replica on every rank
            assert all(torch.equal(everyone[0], t) for t in everyone)
        else:  # the shard: identical where it is held, another shard elsewhere
            assert torch.equal(everyone[0], everyone[2]) and torch.equal(everyone[1], everyone[3])
            assert not torch.equal(everyone[0], everyone[1])


def _levels(rank: int, world_size: int) -> dict[str, Any]:
    """A wire summed in two levels on 2 rows of 2 ([0, 1], [2, 3]) in chunks of 4 elements
    (buffer 7 + 3 + 4 slots, padded to 14), beside the one allreduce; then rank 3's abort
    round through the levels; and a grid that does not make the group."""
    group = new_sync_group()
    inside = new_sync_group(partition=[[0, 1], [2, 3]])
    across = new_sync_group(partition=[[0, 2], [1, 3]])
    levels = Levels(group, inside, across)

    class ByAllreduces(Levels):  # the CUDA route (gloo scatters CPU tensors only), on CPU
        def scatters(self, chunk: Tensor) -> bool:
            return False

    payload = torch.randn(7, generator=torch.Generator().manual_seed(7 + rank))
    layout = Layout((7,), torch.float32, torch.device("cpu"))
    wires = [Wire(layout, g, 20, MonotonicClock())
             for g in (levels, ByAllreduces(group, inside, across), group)]
    agreed = [w.allreduce([payload], Control(pause_steps=2.0 * (rank + 1))) for w in wires]
    sums = [w.payloads[0].clone() for w in wires]
    gathered = [[torch.empty(7) for _ in range(world_size)] for _ in sums[:2]]
    for out, mine in zip(gathered, sums, strict=False):
        dist.all_gather(out, mine)
    try:
        wires[0].allreduce(None, Control(abort=rank == 3))
        aborted = "no abort"
    except PeerAborted as e:
        aborted = str(e)
    try:
        Levels(group, inside, group)
        grid = "accepted"
    except ValueError as e:
        grid = str(e)
    return {"payload": payload.double(), "sums": sums, "gathered": gathered,
            "pause": [a.pause_steps for a in agreed], "nbytes": agreed[0].nbytes,
            "aborted": aborted, "grid": grid}


def test_a_wire_in_two_levels_sums_like_one_allreduce_with_the_same_bits_everywhere() -> None:
    """The sum in levels (inside a host, across by slices, inside again), by a reduce-scatter
    and an all-gather or by allreduces alone (the CUDA route), equals a float64 reference and
    the one allreduce's, chunked and padded, with the same bits on every rank;
    the control slots agree the same values, an abort flag reaches every peer through the
    levels, and a grid that is not the group's is refused."""
    results = run_ranks(_levels, world_size=4, timeout_s=90)
    want = torch.stack([r["payload"] for r in results]).sum(0)
    for rank, r in enumerate(results):
        for got in r["sums"]:
            torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
        for everyone in r["gathered"]:
            assert all(torch.equal(everyone[0], g) for g in everyone), rank
        assert r["pause"] == [5, 5, 5], r["pause"]  # the mean of 2, 4, 6, 8
        assert r["nbytes"] == 4 * 14, r["nbytes"]
        if rank == 3:
            assert r["aborted"] == "no abort"
        else:
            assert r["aborted"].startswith("rank(s) [3] failed"), r["aborted"]
        assert "levels of 2 ranks inside and 4 across do not make the group's 4" in r["grid"]


def _changed_rows(rank: int, world_size: int) -> dict[str, Any]:
    """A set averaged by rows on 3 ranks: each rank changes its own rows (row 1 on every
    rank), one fixed-rate round; then a round in which nothing changed."""
    group = new_sync_group()
    gen = torch.Generator().manual_seed(7)  # the same start on every rank
    table, sums = torch.randn(10, 4, generator=gen), torch.rand(10, generator=gen)
    dense = [torch.randn(3, generator=gen)]
    runner = FixedRateSyncRunner([ReplicaSet(dense, ModelAveraging()),
                                  ReplicaSet([table, sums], ModelAveraging(), "rows",
                                             rows=True)],
                                 group, FixedRateOptions(period=1))
    runner.start()  # identical replicas: what every rank expects
    with torch.no_grad():
        for t in (table, sums):
            for row in (1, 2 + rank, 6 + rank % 2):  # rows 1..7 change somewhere, 8 and 9 not
                t[row] += 0.1 * (rank + 1) + 0.01 * row
    before = [table.double().clone(), sums.double().clone()]
    runner.step()
    first = runner.stats().bytes_reduced
    after = [table.double().clone(), sums.double().clone()]
    runner.step()  # nothing changed: the mask alone crosses
    second = runner.stats().bytes_reduced - first
    runner.stop(final_sync=False)
    return {"before": before, "after": after, "bytes": [first, second]}


def test_a_set_averaged_by_rows_carries_only_the_changed_rows() -> None:
    """One round of a row set equals a float64 reference of the average of the rows any rank
    changed, leaves every other row as it was, and sends those rows alone (plus a byte a
    row); a round in which no row changed sends the byte-a-row mask and nothing else."""
    results = run_ranks(_changed_rows, world_size=3, timeout_s=60)
    changed = sorted({1, 2, 3, 4, 6, 7})
    for r in results:
        for i in (0, 1):
            mean = torch.stack([x["before"][i] for x in results]).mean(0)
            torch.testing.assert_close(r["after"][i][changed], mean[changed], rtol=0, atol=1e-6)
            untouched = [5, 8, 9, 0]
            assert torch.equal(r["after"][i][untouched], r["before"][i][untouched])
        dense_wire = (3 + 3 + 3) * 4
        mask_wire = (20 + 3 + 3) * 1  # a byte a row of both tensors
        rows_wire = (len(changed) * (4 + 1) + 3 + 3) * 4
        assert r["bytes"] == [dense_wire + mask_wire + rows_wire, dense_wire + mask_wire]


SHADOW_STEPS = 150
SHADOW_RUNS: dict[str, tuple[Callable[[], SyncStrategy] | None, dict[str, Any]]] = {
    "no sync": (None, {}),
    "ma": (ModelAveraging, {}),
    "easgd": (functools.partial(ElasticAveraging, alpha=0.4), {}),
    "bmuf": (BlockwiseModelUpdateFiltering, {}),
    "bmuf nesterov": (functools.partial(BlockwiseModelUpdateFiltering, 0.3, nesterov=True), {}),
    "ma bf16": (functools.partial(ModelAveraging, wire_dtype=torch.bfloat16), {}),
    "easgd fp16": (functools.partial(ElasticAveraging, alpha=0.4, wire_dtype=torch.float16), {}),
}


def _shadow(rank: int, world_size: int) -> dict[str, Any]:
    """Train from the same initial replica with each strategy, synchronized in the background
    (unsynchronized for the control), with a training collective each step."""
    group = new_sync_group(timeout=timedelta(seconds=20))
    out = {}
    for name, (make, pacing) in SHADOW_RUNS.items():
        model = make_model()
        runner = None if make is None else ShadowSyncRunner(
            ReplicaSet(list(model.parameters()), make()), group,
            ShadowOptions(deadline_s=20.0, **pacing))
        if runner is not None:
            runner.start()
        for step, (x, y) in enumerate(rank_data(rank, SHADOW_STEPS), start=1):
            train_step(model, x, y)
            local_work(rank, step)
            dist.all_reduce(torch.zeros(1))
            if runner is not None:
                runner.step()
        res: dict[str, Any] = {"spread": spread(gather_flat(model))}
        if runner is not None:
            res["during"] = runner.stats()
            runner.stop(final_sync=True)
            res["after"] = runner.stats()
            final = gather_flat(model)
            res["identical"] = torch.equal(final[0], final[1])
            res["numel"] = final[0].numel()
        out[name] = res
    return out


def test_shadow_runs_sync_in_the_background_and_end_identical() -> None:
    """Each strategy and wire dtype keeps replicas close while training (under a third of the
    unsynchronized drift), applies every round, and ends bit-identical; each round reduces the
    payload, 3 control slots and an abort flag per rank."""
    results = run_ranks(_shadow, timeout_s=120, safe_types=[SyncStats])
    control = results[0]["no sync"]["spread"]
    assert control > 0.5
    for rank, res in enumerate(results):
        for name, (make, _) in SHADOW_RUNS.items():
            if make is None:
                continue
            run, wire = res[name], make().wire_dtype or torch.float32
            during, after = run["during"], run["after"]
            label = f"rank {rank} {name}: {during}"
            assert during.syncs_applied > 0 and during.rounds >= during.syncs_applied, label
            assert 1.0 <= during.gap_mean <= during.gap_max < SHADOW_STEPS, label
            assert during.comm_seconds > 0 and during.rounds_per_s > 0, label
            per_round = run["numel"] + 3 + len(results)
            size = torch.empty(0, dtype=wire).element_size()
            assert after.bytes_reduced == per_round * after.rounds * size, label
            assert after.syncs_applied == after.rounds, label  # stop() drained the last delta
            assert run["spread"] < 0.3 * control, (label, run["spread"], control)
            assert run["identical"], label


class FaultyAveraging(ModelAveraging):
    """Model averaging whose delta raises on round ``fail_round`` (on the rank that sets it)."""

    def __init__(self, fail_round: int | None) -> None:
        super().__init__()
        self.fail_round = fail_round

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        if self.rounds + 1 == self.fail_round:
            raise RuntimeError("injected fault")
        return super().delta(snapshot, reduced)


def _fault(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0's strategy fails in round 3, after that round's allreduce: the abort round
    pairs with rank 1's next round, which fails naming rank 0."""
    model = make_model()
    runner = ShadowSyncRunner(
        ReplicaSet(list(model.parameters()), FaultyAveraging(3 if rank == 0 else None)),
        new_sync_group(timeout=timedelta(seconds=20)),
        ShadowOptions(max_staleness=1, deadline_s=20.0))
    runner.start()
    error, steps = train_until_sync_error(model, runner, rank, 50)
    with pytest.raises(SyncError):
        runner.stop()
    return {"message": str(error), "cause": repr(error.__cause__) if error else None,
            "steps": steps}


def test_a_fault_in_the_thread_surfaces_as_sync_error_on_both_ranks() -> None:
    faulty, peer = run_ranks(_fault, timeout_s=60)
    assert faulty["message"].startswith("rank 0: synchronization failed: RuntimeError: "
                                        "injected fault"), faulty
    assert "injected fault" in faulty["cause"]
    assert peer["message"].startswith("rank 1: synchronization failed: PeerAborted: rank(s) [0] "
                                      "failed"), peer
    # Found within a step or two of the round (with max_staleness=1 each step waits for it).
    assert faulty["steps"] <= 5 and peer["steps"] <= 6, (faulty, peer)


def _non_finite(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0's replica goes NaN at step 10 (as a diverging optimizer would make it)."""
    model = make_model()
    runner = ShadowSyncRunner(ReplicaSet(list(model.parameters()), ModelAveraging()),
                              new_sync_group(timeout=timedelta(seconds=20)),
                              ShadowOptions(max_staleness=1))
    runner.start()

    @torch.no_grad()
    def poison(step: int) -> None:
        if rank == 0 and step == 10:
            next(model.parameters())[0, 0] = math.nan

    error, _ = train_until_sync_error(model, runner, rank, 50, poison)
    with contextlib.suppress(SyncError):
        runner.stop()
    peer_finite = bool(flat(model).isfinite().all()) if rank == 1 else None
    return {"type": type(error).__name__, "message": str(error), "peer_finite": peer_finite}


def test_a_non_finite_replica_fails_on_its_rank_before_peers_average_it() -> None:
    holder, peer = run_ranks(_non_finite, timeout_s=60)
    assert holder["type"] == "NonFiniteError", holder
    assert "rank 0" in holder["message"] and "not finite" in holder["message"], holder
    assert "synchronization round" in holder["message"], holder
    assert peer["type"] == "PeerAborted" and "rank(s) [0] failed" in peer["message"], peer
    assert peer["peer_finite"], "the NaN must not have been averaged into the peer's replica"
