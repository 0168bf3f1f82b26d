"""The benchmark reports' arithmetic: each arm's spread of ratios to ``none`` (run against
``none``'s run of the same seed and repeat), and goals judged on the whole spread."""

from __future__ import annotations

import itertools
import math
import os
import time
from typing import Any

import pytest
import torch.distributed as dist

from shadowsync.benchmarks import bench_loop, bench_sync, paper, rig_noise, slurm_layouts, turns
from shadowsync.benchmarks import rows as bench_rows
from shadowsync.testing import run_ranks


def _row(arm: str, seed: int, ex_s: float) -> dict[str, float | str | int]:
    return {"arm": arm, "seed": seed, "repeat": 0, "examples_per_s": ex_s, "eval_ne": 0.8,
            "eval_auc": 0.7, "eval_calibration": 1.0, "train_seconds": 1.0}


def test_ratio_spread_pairs_each_run_with_nones_run_and_goals_use_it() -> None:
    bench = bench_sync
    rows = [_row("none", 0, 100.0), _row("none", 1, 200.0), _row("none", 2, 100.0),
            _row("S-MA", 0, 99.0), _row("S-MA", 1, 180.0), _row("S-MA", 2, 98.0)]
    arms = {a["arm"]: a for a in bench.aggregate(rows)}
    s = arms["S-MA"]
    assert s["ratio_to_none"] == 99.0 / 100.0  # medians: 99 over 100
    assert (s["ratio_min"], s["ratio_max"]) == (0.9, 0.99)  # 180/200, 99/100
    assert "[0.900, 0.990]" in bench.table(list(arms.values()))
    (line,) = [g for g in paper.goals(list(arms.values())) if g.startswith("- S-MA keeps")]
    assert "0.990" in line and line.endswith("NOT met."), line  # the median clears, a run not


def test_the_slurm_layouts_table_gives_each_jobs_nodes_traffic_and_a_steps_share() -> None:
    def job(steps: int, sync: float, tx: int) -> dict[str, Any]:
        return {"arm": "replica groups, shadow MA", "state": "SUCCEEDED", "step": steps,
                "sync_rounds": 7.0, "sync_bytes_reduced": sync,
                "nodes": {"h0": {"tx": tx, "rx": 2_900_000}, "h1": {"tx": tx, "rx": 3_050_000}}}

    table = slurm_layouts.table([job(40, 2.5e6, 3_100_000), job(200, 6.5e6, 4_700_000)])
    assert "| arm | state | steps | sync rounds | sync MB (rank 0) | h0 MB sent / received | " \
        "h1 MB sent / received |" in table
    assert "| replica groups, shadow MA | SUCCEEDED | 40 | 7 | 2.50 | 3.10 / 2.90 | " \
        "3.10 / 3.05 |" in table
    # per step beyond the 40: 4.0 MB of rounds and 1.6 MB sent over 160 steps
    assert "| replica groups, shadow MA | 40 -> 200 | 25.0 | 10.0 | 10.0 |" in table
    assert "What a step adds" not in slurm_layouts.table([job(40, 2.5e6, 3_100_000)])


def test_loop_phase_table_shows_each_phase_and_what_no_phase_holds() -> None:
    bench = bench_loop
    rows = [{"arm": "ours none", "repeat": r, "own_ms_per_step": own,
             "phase_ms": {"shadowsync.train.watch": w, "shadowsync.train.control": 0.05}}
            for r, (own, w) in enumerate([(0.40, 0.15), (0.30, 0.10), (0.35, 0.20)])]
    rows.append({"arm": "reference local", "repeat": 0, "own_ms_per_step": 0.01})
    text = bench.phase_table(rows)
    assert "| phase (wall ms a step) | ours none |" in text  # no column for arms without
    assert "| `shadowsync.train.watch` | 0.150 [0.100, 0.200] |" in text
    # own time less the phases: 0.20, 0.15, 0.10
    assert "| `outside every phase` | 0.150 [0.100, 0.200] |" in text


def test_ablation_rows_and_table() -> None:
    """``bench_loop --ablate``: a row's ratio and how much slower TorchRec's steps ran inside
    ours (each side's time less its own); the table gives each variant, in first-run order."""
    bench = bench_loop
    ref = {"examples_per_s": 100.0, "own_ms_per_step": 0.01, "ms_per_step": 10.01}
    ours = {"examples_per_s": 95.0, "own_ms_per_step": 0.3, "ms_per_step": 10.5}
    row = bench.ablation_row("heartbeat off", 2, ref, ours)
    assert row["variant"] == "heartbeat off" and row["repeat"] == 2
    assert row["ratio"] == pytest.approx(0.95) and row["inside"] == pytest.approx(1.02)
    rows = [{"variant": v, "repeat": r, "ratio": x, "own_ms_per_step": 0.2 + x / 10,
             "inside": 2 - x} for r in range(3)
            for v, x in (("all on", 0.90 + r / 100), ("A/A", 1.0 - r / 100))]
    text = bench.ablation_table(rows)
    lines = text.splitlines()
    assert lines[2].startswith("| all on | 0.910 [0.900, 0.920] | 0.291 [0.290, 0.292] | "
                               "1.090 [1.080, 1.100] |"), text
    assert lines[3].startswith("| A/A | 0.990 [0.980, 1.000] |"), text


def _job_store_env() -> None:
    """Our job's heartbeat reaches the job's store where torchrun says it is: rank 0's here."""
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    os.environ.update(MASTER_ADDR=store.host, MASTER_PORT=str(store.port))


def _ablations(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    from shadowsync.pipelines.build import init_distributed
    from shadowsync.pipelines.callbacks import TrainCallback
    from shadowsync.pipelines.loop import Trainer
    from tests._dist import SMALL

    bench = bench_loop
    env = init_distributed(60)
    _job_store_env()
    seen: dict[str, Any] = {}

    class Count(TrainCallback):
        def on_train_start(self, trainer: Trainer) -> None:
            assert trainer.ctx.domain.heartbeat is not None
            seen["heartbeat_s"] = trainer.ctx.domain.heartbeat.interval_s

        def on_step_end(self, step: int) -> None:
            seen["steps"] = seen.get("steps", 0) + 1

        def on_record(self, step: int, computing: Any) -> None:
            seen["records"] = seen.get("records", 0) + 1

        def on_check(self, step: int, periodic: bool) -> None:
            seen["periodic"] = seen.get("periodic", 0) + periodic

    out = {}
    for name in bench.ABLATIONS:
        seen.clear()
        (row,) = bench.ablate("none", "synthetic", 20, 10, [
            *SMALL[2:], "train.log_every=10", "train.control_min_interval_s=null"],
            env, 0, [name], callbacks=[Count()])
        out[name] = {**seen, **row}
    return out


@pytest.mark.slow
def test_ablation_turns_off_one_feature_of_ours_per_variant() -> None:
    """``bench_loop --ablate``: each variant runs our loop with exactly its feature off (20
    steps; records every 10 steps, control checks every 10 with no floor, a beat a second)
    against TorchRec's loop, as the trainer's callbacks count them."""
    for result in run_ranks(_ablations, timeout_s=240):
        on = result["all on"]
        assert on["steps"] == 20 and on["records"] == 2 and on["periodic"] >= 2, on
        assert on["heartbeat_s"] == 1.0
        assert "records" not in result["records off"], result["records off"]
        assert not result["control off"].get("periodic"), result["control off"]
        assert result["heartbeat off"]["heartbeat_s"] == 1e6, result["heartbeat off"]
        for name, row in result.items():  # every other feature stays on
            assert row["steps"] == 20, (name, row)
            assert name == "records off" or row["records"] == 2, (name, row)
            # 20 tiny steps bound no speed ratio, only its sign; the row's arithmetic is
            # checked exactly in test_ablation_rows_and_table
            assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("ratio", "inside")), row


def test_verdicts_call_a_difference_only_beyond_three_sd() -> None:
    bench = bench_sync
    ne = {"none": [0.900, 0.902, 0.898], "ddp": [0.840, 0.842, 0.838],
          "FR-MA k=10": [0.842, 0.846, 0.838], "S-MA": [0.846, 0.848, 0.844]}
    gaps = {"FR-MA k=1": 1.0, "FR-MA k=10": 9.8, "S-MA": 4.0}
    ne["FR-MA k=1"] = ne["ddp"]
    rows = [{**_row(arm, seed, 100.0), "eval_ne": v, "sync_gap_mean": gaps.get(arm, 1.0)}
            for arm, values in ne.items() for seed, v in enumerate(values)]
    assert paper.compare(rows, "none", "ddp")[2] == "worse by 30.0 sd"
    # S-MA - ddp = 0.006 = 3 sd exactly: not beyond the bar; FR-MA's sd is the larger one there
    assert paper.compare(rows, "S-MA", "ddp")[2] == "equal within 3 sd (3.0 sd)"
    assert paper.compare(rows, "S-MA", "FR-MA k=10")[2] == "equal within 3 sd (1.0 sd)"
    lines = paper.verdicts(bench.aggregate(rows), rows, {"MA": "no hyper-parameter"})
    assert lines[0] == "- **The bar:** none - ddp = +0.0600 NE: none is worse by 30.0 sd."
    (s_ma,) = [line for line in lines if line.startswith("- **S-MA**")]
    assert "vs its FR twin of closest sync gap (FR-MA k=10, gap 9.8)" in s_ma  # 4 is nearer 1


def test_arms_rotate_across_seeds_and_repeats(monkeypatch: object) -> None:
    """No arm always runs first: with one repeat of several seeds (the quality runs) the order
    still rotates, so ``none`` is not always measured first in a pass."""
    bench = bench_sync
    order: list[str] = []
    device = [bench.DeviceWait(1.0)]  # every run, the warm-up too, waits on the device

    def fake_run_arm(env: object, preset: str, overrides: list[str],
                     callbacks: list[object]) -> dict[str, float]:
        assert callbacks is device
        warm_up = "train.steps=50" in overrides
        order.append("warm-up" if warm_up else next(o for o in overrides if o.startswith("arm=")))
        return {"examples_per_s": 1.0, "eval_auc": 0.5}

    monkeypatch.setattr(bench, "run_arm", fake_run_arm)  # type: ignore[attr-defined]
    arms = [(name, [f"arm={name}"]) for name in ("none", "ddp", "S")]
    env = type("Env", (), {"rank": 1})()
    rows = bench.run_all(env, "synthetic", [], arms, seeds=[0, 1, 2], repeats=1,
                         callbacks=device)
    assert order[0] == "warm-up" and len(order) == 10
    firsts = [order[1 + 3 * i] for i in range(3)]
    assert firsts == ["arm=none", "arm=ddp", "arm=S"], order
    assert [(r["seed"], r["arm"]) for r in rows][:4] == [(0, "none"), (0, "ddp"), (0, "S"),
                                                        (1, "ddp")]


def _interleaved_pair(rank: int, world_size: int) -> dict[str, Any]:
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from shadowsync.pipelines.build import init_distributed
    from tests._dist import SMALL

    bench = bench_loop
    env = init_distributed(60)
    _job_store_env()
    with pytest.raises(ValueError, match="not a multiple of --interleave"):
        bench.interleaved(("reference local", "ours none"), "synthetic", 25, 10, [], env)
    order: list[int] = []  # the pipeline of each training-mode progress call
    fed: list[int] = []  # and the batches it was given
    stepped: list[bool] = []  # and whether it took a step (else: StopIteration)
    progress = TrainPipelineSparseDist.progress

    def spy(self: TrainPipelineSparseDist, batches: Any) -> Any:
        if not self._model.training:
            return progress(self, batches)
        order.append(id(self))
        fed.append(id(batches))
        stepped.append(False)
        got = progress(self, batches)
        stepped[-1] = True
        return got

    TrainPipelineSparseDist.progress = spy
    try:
        by_arm = bench.interleaved(("reference local", "ours none"), "synthetic", 40, 10,
                                   [*SMALL[2:], "train.log_every=10"], env, phases=True)
        runs = [len(list(g)) for _, g in itertools.groupby(order)]
        pipelines = len(set(order))
        order.clear()
        aa = bench.interleaved(("A/A reference local", "A/A local"), "synthetic", 40, 10,
                               SMALL[2:], env)
        aa_runs = [len(list(g)) for _, g in itertools.groupby(order)]
        order.clear()
        single = bench.interleaved(("A/A reference local", "A/A local"), "synthetic", 6, 1,
                                   SMALL[2:], env)
        single_order = list(order)
        order.clear()
        fed.clear()
        one = bench.interleaved(("reference local", "ours none"), "synthetic", 40, 10,
                                [*SMALL[2:], "train.log_every=10"], env, one_model=True)
        one_fed, one_pipelines = list(fed), len(set(order))
        with pytest.raises(ValueError, match="--defer 10 must be .* under train.log_every"):
            bench.interleaved(("reference local", "ours none"), "synthetic", 20, 1,
                              [*SMALL[2:], "train.log_every=10"], env, defer=10)
        order.clear()
        stepped.clear()
        # 24 steps over epochs of 10 (128 x 2 ranks x 10 = 2,560 examples), records every 10
        bench.interleaved(("reference local", "ours none"), "synthetic", 24, 1,
                          [*SMALL[2:], "train.log_every=10",
                           "data.options.num_train_examples=2560"], env, defer=3)
        ref_id = order[0]
        calls = "".join(("R" if p == ref_id else "O") if s else ("r" if p == ref_id else "o")
                        for p, s in zip(order, stepped, strict=True))
    finally:
        TrainPipelineSparseDist.progress = progress
    return {"arms": by_arm, "runs": runs, "pipelines": pipelines, "aa": aa, "aa runs": aa_runs,
            "single": single, "single order": single_order,
            "one": one, "one pipelines": one_pipelines,
            "one runs": [len(list(g)) for _, g in itertools.groupby(one_fed)],
            "deferred calls": calls}


@pytest.mark.slow
def test_interleaved_pair_times_each_loop_apart() -> None:
    """``bench_loop --interleave``: the reference takes its blocks of steps right before ours'
    steps 10, 20, 30 and 40 (ours' last call is the one that finds no batch), and each side is
    timed apart: each side's own time stays under its step time. No ratio of the two rates is
    bounded: on runs this short it swings past 2x between identical loops."""
    for result in run_ranks(_interleaved_pair, timeout_s=180):
        assert result["pipelines"] == 2
        assert result["runs"] == [9, 10, 10, 10, 10, 10, 10, 10, 2], result["runs"]
        ref, ours = result["arms"]["reference local"], result["arms"]["ours none"]
        assert ours["examples_per_s"] > 0 and ref["examples_per_s"] > 0, result
        assert 0 <= ours["own_ms_per_step"] < ours["ms_per_step"], ours
        assert 0 <= ref["own_ms_per_step"] < ref["ms_per_step"], ref
        assert ours["wait_ms"] >= 0
        # --phases: each labelled phase of ours ran every step (log: every 10th) outside
        # TorchRec's pipeline, so together they fit in ours' own time; the reference has none
        phases = ours["phase_ms"]
        assert {"shadowsync.train.watch", "shadowsync.train.metrics", "shadowsync.train.log",
                "shadowsync.train.control"} <= set(phases), phases
        assert all(v > 0 for v in phases.values()), phases
        assert sum(phases.values()) <= ours["own_ms_per_step"], (phases, ours)
        assert "phase_ms" not in ref
        # A/A: TorchRec's loop in ours' place takes the same turns (its last call finds no
        # batch too), timed the same way
        assert result["aa runs"] == result["runs"], result["aa runs"]
        ref, again = result["aa"]["A/A reference local"], result["aa"]["A/A local"]
        assert again["examples_per_s"] > 0 and ref["examples_per_s"] > 0, result["aa"]
        # --interleave 1: one step of the reference before each of ours', alternating
        # pipelines step by step (ours' last call, which finds no batch, follows its sixth)
        seq = result["single order"]
        ref_id = seq[0]
        assert [p == ref_id for p in seq] == [True, False] * 6 + [False], seq
        assert all(math.isfinite(arm["examples_per_s"]) and arm["examples_per_s"] > 0
                   for arm in result["single"].values()), result["single"]  # 6 steps: no bound
        # --one-model: the blocks run on ours' own pipeline, fed their own batches, a step
        # earlier (before ours' steps 9, 19, 29, 39): ours' batches run dry before its last step
        assert result["one pipelines"] == 1
        assert result["one runs"] == [8, 10, 10, 10, 10, 10, 10, 10, 3], result["one runs"]
        ref, ours = result["one"]["reference local"], result["one"]["ours none"]
        assert ours["examples_per_s"] > 0 and ref["examples_per_s"] > 0, result["one"]
        assert 0 <= ours["own_ms_per_step"] < ours["ms_per_step"], ours
        # --defer 3 over epochs of 10 steps, each side's pipeline draining at its epochs' ends
        # (r, o: a call that found no batch): the reference's steps due in the 3 calls of ours
        # after each record (steps 10 and 20) run together after them, the last turn's before
        # ours' call 24 (nothing is put off past it); 24 steps on each side
        calls = result["deferred calls"]
        assert calls == ("RO" * 10 + "oOO" + "rRRRR" + "O" + "RO" * 6 + "rRO" + "oO" + "RRR"
                         + "OOOo"), calls
        assert calls.count("R") == calls.count("O") == 24


def test_rotating_replicas_refuses_arms_that_cannot_take_turns() -> None:
    from shadowsync.sync.config import SyncConfig

    bench = turns
    with pytest.raises(ValueError, match="sync.schedule.period=3 does not divide the turn of 10"):
        bench.RotatingReplicas({"FR k=3": SyncConfig.from_dict(
            {"strategy": {"name": "ma"}, "schedule": {"mode": "fixed_rate", "period": 3}})}, 10)
    with pytest.raises(ValueError, match="sync.strategy.name=ddp is not a ShadowSync strategy"):
        bench.RotatingReplicas({"ddp": SyncConfig.from_dict({"strategy": {"name": "ddp"}})},
                               10)
    with pytest.raises(ValueError, match="needs sync.failure.on_failure=raise"):
        bench.RotatingReplicas({"S": SyncConfig.from_dict(
            {"strategy": {"name": "ma"}, "failure": {"on_failure": "degrade"}})}, 10)


def test_bracketed_turns_put_the_baseline_beside_every_other_turn() -> None:
    from shadowsync.sync.config import SyncConfig

    bench = turns
    fr = SyncConfig.from_dict({"strategy": {"name": "ma"},
                               "schedule": {"mode": "fixed_rate", "period": 5}})
    arms = {"none": None, "FR": fr, "S": SyncConfig.from_dict({"strategy": {"name": "ma"}}),
            "A/A": None}
    plain, bracketed = bench.RotatingReplicas(arms, 10), bench.RotatingReplicas(arms, 10, "none")
    assert plain.order(1) == ["FR", "S", "A/A", "none"] and plain.turns_per_cycle == 4
    assert bracketed.order(0) == ["none", "FR", "none", "S", "none", "A/A"]
    assert bracketed.order(1) == ["none", "S", "none", "A/A", "none", "FR"]
    assert bracketed.turns_per_cycle == 6
    with pytest.raises(ValueError, match="bracket arm 'base' must be one of at least two"):
        bench.RotatingReplicas(arms, 10, "base")
    with pytest.raises(ValueError, match="bracket arm 'none' must be one of at least two"):
        bench.RotatingReplicas({"none": None}, 10, "none")
    # each turn: the mean seconds of the nearest none turns on either side
    order = ["none", "FR", "none", "S", "S", "none", "FR"]
    got = bench_rows.bracket_seconds(order, [1.0, 9.0, 3.0, 9.0, 9.0, 5.0, 9.0], "none")
    assert got[:6] == [1.0, 2.0, 3.0, 4.0, 4.0, 5.0] and math.isnan(got[6])


DEVICE_MS = 20.0


def test_device_wait_waits_its_time_after_every_step_and_checks_it() -> None:
    waited: list[float] = []
    device = bench_sync.DeviceWait(37.5, waited.append)
    for step in (1, 2, 3):
        device.on_step_end(step)
    assert waited == [0.0375] * 3
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number of ms >= 0"):
            bench_sync.DeviceWait(bad)


def _interleaved_arms(rank: int, world_size: int) -> dict[str, Any]:
    from shadowsync.pipelines.build import init_distributed
    from tests._dist import SMALL

    bench = turns
    made: list[Any] = []

    class Spy(bench.RotatingReplicas):  # type: ignore[name-defined, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    bench.RotatingReplicas = Spy
    env = init_distributed(60)
    arms = [("none", ["sync.strategy.name=none"]),
            ("FR k=5", ["sync.strategy.name=ma", "sync.schedule.mode=fixed_rate",
                        "sync.schedule.period=5"]),
            ("S s1", ["sync.strategy.name=ma", "sync.schedule.mode=shadow",
                      "sync.schedule.max_slowdown=null", "sync.schedule.max_staleness=1"])]
    common = [*SMALL[2:], "eval.max_batches=1"]
    rows = bench.run_interleaved(env, "synthetic", common, arms, seeds=[0], cycles=2, block=10)
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)  # the emulated device step itself

    os.environ["LOCAL_WORLD_SIZE"] = "1"  # as if each rank were a host of its own
    bracketed = bench.run_interleaved(env, "synthetic", common, arms, seeds=[0], cycles=1,
                                      block=10, bracket=True, trace=True,
                                      callbacks=[bench_sync.DeviceWait(DEVICE_MS, wait)])
    wrapper, again = made
    return {"rows": rows,
            "order": [(t.arm, t.cycle) for t in wrapper.turns if t.done],
            "begun": [(t.arm, t.cycle) for t in wrapper.turns if not t.done],
            "steps": {n: c.runner.stats().steps for n, c in wrapper.children.items()},
            "phases": {n: c.phase.name for n, c in wrapper.children.items()},
            "bracketed": bracketed, "waits": waits,
            "bracket order": [(t.arm, t.cycle) for t in again.turns if t.done],
            "bracket steps": {n: c.runner.stats().steps for n, c in again.children.items()}}


@pytest.mark.slow
def test_interleaved_arms_take_turns_on_one_model() -> None:
    """``bench_sync --interleave``: each arm's runner steps only in its own turns (10 steps in
    each of 3 cycles), the cycles rotate the order, a fixed-rate turn holds exactly its
    rounds, and the warm-up cycle is left out of the rows; with ``--bracket``, ``none`` runs
    beside every other turn and each row carries its examples/s there, and with ``--trace``
    each step's seconds and whether synchronization touched it."""
    bench = bench_sync
    for result in run_ranks(_interleaved_arms, timeout_s=180):
        assert result["order"] == [("none", 0), ("FR k=5", 0), ("S s1", 0),
                                   ("FR k=5", 1), ("S s1", 1), ("none", 1),
                                   ("S s1", 2), ("none", 2), ("FR k=5", 2)]
        assert result["begun"] == [("none", 3)]  # after the last step: holds none, no row
        assert result["steps"] == {"FR k=5": 30, "S s1": 30}, result["steps"]
        assert result["phases"] == {"FR k=5": "FINISHED", "S s1": "FINISHED"}
        rows = result["rows"]
        assert [(r["arm"], r["repeat"]) for r in rows] == [
            ("FR k=5", 0), ("S s1", 0), ("none", 0), ("S s1", 1), ("none", 1), ("FR k=5", 1)]
        for r in rows:
            assert r["interleave"] == 10 and r["examples_per_s"] > 0
            if r["arm"] == "none":
                assert "sync_syncs_applied" not in r
            elif r["arm"] == "FR k=5":
                assert (r["sync_syncs_applied"], r["sync_gap_mean"]) == (2, 5.0)
            else:  # each round awaited a step after its snapshot: a sync every step after
                # the first (its round lands a step later), and one in flight at the end
                assert (r["sync_syncs_applied"], r["sync_gap_mean"]) == (9, 1.0), r
                assert r["sync_bytes_reduced"] > 0
            assert "baseline_examples_per_s" not in r
        # --bracket: none before every other turn and once more at the end; each timed turn
        # carries the examples/s of the none turns beside it (their mean seconds)
        assert result["bracket order"] == [
            ("none", 0), ("FR k=5", 0), ("none", 0), ("S s1", 0),
            ("none", 1), ("S s1", 1), ("none", 1), ("FR k=5", 1), ("none", 2)]
        assert result["bracket steps"] == {"FR k=5": 20, "S s1": 20}
        rows = result["bracketed"]
        assert [r["arm"] for r in rows] == ["none", "S s1", "none", "FR k=5"]
        for r in result["rows"]:  # one host (LOCAL_WORLD_SIZE unset): its turn is the job's
            assert r["host_seconds"] == [r["train_seconds"]]
        for r in rows:  # two hosts: the job's turn is its slower host's
            assert len(r["host_seconds"]) == 2 and max(r["host_seconds"]) == r["train_seconds"]
            assert len(r["host_baseline_seconds"]) == 2
        # --device-step-ms: one wait after every training step of the run (9 turns of 10),
        # inside the step as the turns time it
        assert result["waits"] == [DEVICE_MS / 1e3] * 90
        examples = 10 * 128 * 2  # block x SMALL's batch x ranks
        before, after = rows[0]["train_seconds"], rows[2]["train_seconds"]
        assert rows[1]["baseline_examples_per_s"] == pytest.approx(
            examples / ((before + after) / 2))
        assert rows[0]["baseline_examples_per_s"] == pytest.approx(rows[0]["examples_per_s"])
        assert rows[3]["baseline_examples_per_s"] > 0  # its after: the closing none turn
        # --trace: a fixed-rate round blocks the step after steps 1 and 6 (the runner's own
        # count goes on across turns: 11, 16); the staleness-1 arm's rounds run from its
        # first snapshot on, awaited at every step after, so every step is touched from then
        for r in rows:
            assert len(r["step_seconds"]) == 10 and min(r["step_seconds"]) >= DEVICE_MS / 1e3
            # the ranks' mean step: the steps add up to no more than the slowest rank's turn
            assert 0.5 * r["train_seconds"] < sum(r["step_seconds"]) <= r["train_seconds"]
        none, shadow, _, fixed = (r["step_busy"] for r in rows)
        assert none == [False] * 10
        assert fixed == [False, True, False, False, False, False, True, False, False, False]
        first = shadow.index(True)
        assert 1 <= first and shadow == [False] * first + [True] * (10 - first), shadow
        arms = {a["arm"]: a for a in bench.aggregate(rows)}
        ratio = rows[1]["examples_per_s"] / rows[1]["baseline_examples_per_s"]
        assert arms["S s1"]["ratio_to_none"] == pytest.approx(ratio)
        assert arms["none"]["ratio_to_none"] == 1.0 and arms["none"]["runs"] == 2
        assert "| S s1 |" in bench.table(list(arms.values()))


def _rig_turns(rank: int, world_size: int) -> list[tuple[str, float]]:
    return rig_noise._rank(rank, world_size, step_ms=1.0, size=16, block=3, cycles=2)


@pytest.mark.slow
def test_rig_noise_reads_fixed_work_as_bench_sync_reads_an_aa_arm() -> None:
    rig = rig_noise
    turns = [("none", 1.0), ("none A/A", 4.0), ("none", 3.0), ("none A/A", 2.0), ("none", 1.0)]
    assert rig.aa_ratios(turns) == [0.5, 1.0]
    got = rig.summary(turns)
    assert (got["aa_median"], got["aa_min"], got["aa_max"]) == (0.75, 0.5, 1.0)
    assert (got["turn_speed_min"], got["turn_speed_max"]) == (0.5, 2.0)  # median 2 s
    # 2 ranks: a warm-up cycle left out, then none / A/A turns and a closing none, each the
    # slowest rank's seconds, so both ranks hold the same list
    by_rank = run_ranks(_rig_turns, timeout_s=60)
    assert by_rank[0] == by_rank[1]
    assert [a for a, _ in by_rank[0]] == ["none", "none A/A", "none", "none A/A", "none"]
    assert all(s > 0 for _, s in by_rank[0])
    assert len(rig.aa_ratios(by_rank[0])) == 2
