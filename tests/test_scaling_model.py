"""The scaling model's equations on hand-checked numbers, and its reading of a calibration file.

Pure arithmetic: no processes, no measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import pytest

from shadowsync.benchmarks.scaling_model import fit as sf
from shadowsync.benchmarks.scaling_model import model as sm
from shadowsync.benchmarks.scaling_model import overrides as so
from shadowsync.benchmarks.scaling_model import report as sr
from shadowsync.benchmarks.scaling_model import testbed as tb

NET = sm.Network(latency_s=1e-5, bandwidth_Bps=1e9)  # 10 us, 8 Gbit/s
K = sm.Constants(batch_size=100, step_s=0.01, dense_bytes=1e6, a2a_bytes=4e5,
                 ddp_overhead_s=0.0, round_local_s={"ma": 1e-4, "easgd": 2e-4, "bmuf": 3e-4},
                 contention={"ma": 0.25, "easgd": 0.25, "bmuf": 0.25})
SHADOW_MA = sm.Arm("shadow", "ma")
NONE = sm.Arm("none")


def test_ring_allreduce_closed_form() -> None:
    assert sm.allreduce_s(1e6, 1, NET) == 0.0
    # N = 2: 2 * 1/2 * 1 ms + 2 * 10 us
    assert sm.allreduce_s(1e6, 2, NET) == pytest.approx(1.02e-3, rel=1e-12)
    # N = 4: 2 * 3/4 * 1 ms + 6 * 10 us
    assert sm.allreduce_s(1e6, 4, NET) == pytest.approx(1.56e-3, rel=1e-12)
    # bandwidth term bounded by 2 S / beta, latency term linear in N
    assert sm.allreduce_s(1e6, 1000, NET) == pytest.approx(2 * 999 / 1000 * 1e-3 + 2 * 999e-5)


def test_tree_allreduce_and_all_to_all_closed_form() -> None:
    tree = dataclasses.replace(NET, allreduce="tree")
    assert sm.allreduce_s(1e6, 8, tree) == pytest.approx(2e-3 + 6e-5, rel=1e-12)
    assert sm.allreduce_s(1e6, 1000, tree) == pytest.approx(2e-3 + 20e-5, rel=1e-12)
    # two exchanges of 3/4 * 0.4 ms + 3 latencies
    assert sm.all_to_all_s(4e5, 4, NET) == pytest.approx(6.6e-4, rel=1e-12)
    assert sm.all_to_all_s(4e5, 1, NET) == 0.0
    assert sm.all_to_all_s(0, 64, NET) == 0.0  # nothing sharded: no exchange


def test_network_units() -> None:
    net = sm.Network.of(gbps=10, latency_us=20)
    assert net.bandwidth_Bps == pytest.approx(1.25e9)
    assert net.latency_s == pytest.approx(2e-5)


def test_none_is_compute_plus_all_to_all() -> None:
    p = sm.predict(NONE, 4, K, NET)
    assert p.step_s == pytest.approx(0.01 + 6.6e-4)
    assert p.examples_per_s == pytest.approx(4 * 100 / (0.01 + 6.6e-4))
    assert math.isnan(p.sync_gap)


def test_shadow_linear_in_n_with_constant_contention() -> None:
    dense_only = dataclasses.replace(K, a2a_bytes=0.0)
    per_trainer = 100 / (0.01 * 1.25)
    for n in sm.TRAINERS:
        rate = sm.predict(SHADOW_MA, n, dense_only, NET).examples_per_s
        assert rate == pytest.approx(n * per_trainer, rel=1e-12)
    for n in sm.TRAINERS:  # with the all-to-all, still exactly 1/(1+c) of none
        ratio = (sm.predict(SHADOW_MA, n, K, NET).examples_per_s
                 / sm.predict(NONE, n, K, NET).examples_per_s)
        assert ratio == pytest.approx(1 / 1.25, rel=1e-12)


def test_fixed_rate_cost_and_limit() -> None:
    n = 16
    none = sm.predict(NONE, n, K, NET).step_s
    k1 = sm.predict(sm.Arm("fixed_rate", "ma", 1), n, K, NET)
    assert k1.step_s == pytest.approx(none + 1e-4 + sm.allreduce_s(1e6, n, NET), rel=1e-12)
    assert k1.sync_gap == 1
    steps = [sm.predict(sm.Arm("fixed_rate", "ma", k), n, K, NET).step_s
             for k in (1, 10, 100, 10**9)]
    assert steps == sorted(steps, reverse=True)
    assert steps[-1] == pytest.approx(none, rel=1e-9)
    assert sm.predict(sm.Arm("fixed_rate", "bmuf", 7), n, K, NET).sync_gap == 7


def test_ddp_below_none_beyond_one_trainer() -> None:
    assert sm.predict(sm.Arm("ddp"), 1, K, NET).examples_per_s == pytest.approx(
        sm.predict(NONE, 1, K, NET).examples_per_s)
    for n in sm.TRAINERS[1:]:
        assert (sm.predict(sm.Arm("ddp"), n, K, NET).examples_per_s
                < sm.predict(NONE, n, K, NET).examples_per_s)
    with_overhead = dataclasses.replace(K, ddp_overhead_s=1e-3)
    assert sm.predict(sm.Arm("ddp"), 1, with_overhead, NET).step_s == pytest.approx(0.011)


def test_sync_gap_is_rounds_over_steps_and_grows_with_n() -> None:
    # 1 ms step, no contention or all-to-all: gap = ceil(round / step)
    fast = dataclasses.replace(K, step_s=1e-3, a2a_bytes=0.0, contention=dict.fromkeys(
        sm.STRATEGIES, 0.0))
    round_s = 1e-4 + sm.allreduce_s(1e6, 8, NET)  # 1.75 ms + 140 us + 100 us
    assert sm.predict(SHADOW_MA, 8, fast, NET).sync_gap == math.ceil(round_s / 1e-3) == 2
    assert sm.predict(SHADOW_MA, 1, fast, NET).sync_gap == 1  # never below one step
    gaps = [sm.predict(SHADOW_MA, n, fast, NET).sync_gap for n in sm.TRAINERS]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]
    assert gaps[-1] == math.ceil((1e-4 + sm.allreduce_s(1e6, 1000, NET)) / 1e-3) == 23


def _calibration() -> dict:
    def arm(rate: float, gap: float = math.nan) -> dict:
        return {"examples_per_s": rate, "sync_gap_mean": gap}

    one = {"none": arm(10_000), "ddp": arm(8_000), "fixed-rate ma k=10": arm(9_900, 9.8),
           "shadow ma": arm(8_000, 1.0), "shadow easgd": arm(10_500, 1.0),
           "shadow bmuf": arm(5_000, 1.0)}
    two = {"none": arm(18_000), "shadow ma": arm(15_000, 1.0)}
    return {"allreduce_fit": {"latency_s": 1e-5, "bandwidth_Bps": 1e9},
            "presets": {"p": {"batch_size": 100, "dense_bytes": 1e6, "a2a_bytes": 4e5,
                              "round_local_s": {"ma": 1e-4, "easgd": 1e-4, "bmuf": 1e-4},
                              "measured": {"1": one, "2": two}}}}


def test_constants_from_the_one_rank_points() -> None:
    k = sm.constants(_calibration()["presets"]["p"])
    assert k.step_s == pytest.approx(0.01)  # 100 examples at 10k/s
    assert k.ddp_overhead_s == pytest.approx(0.0025)
    assert k.contention == pytest.approx({"ma": 0.25, "easgd": 0.0, "bmuf": 1.0})  # clipped
    assert sm.constants(_calibration()["presets"]["p"], contention=0.0).contention == {
        "ma": 0.0, "easgd": 0.0, "bmuf": 0.0}


def test_check_rows_errors_and_roles() -> None:
    cal = _calibration()
    rows = {(r["n"], r["arm"]): r for r in sr.check_rows(cal["presets"]["p"],
                                                         sm.loopback(cal))}
    assert rows[1, "none"]["error"] == pytest.approx(0.0)
    assert rows[1, "none"]["role"].startswith("fit")
    assert rows[1, "fixed-rate ma k=10"]["role"] == "prediction"
    # N = 2 none: 2 * 100 / (10 ms + 2 (1/2 * 0.4 ms + 10 us)) = 19,230.8/s vs 18,000 measured
    predicted = 200 / (0.01 + 2 * (0.5 * 4e-4 + 1e-5))
    assert rows[2, "none"]["predicted"] == pytest.approx(predicted)
    assert rows[2, "none"]["error"] == pytest.approx(predicted / 18_000 - 1)
    assert rows[2, "shadow ma"]["gap_predicted"] == 1
    assert rows[2, "shadow ma"]["ratio_measured"] == pytest.approx(15_000 / 18_000)
    assert rows[2, "shadow ma"]["ratio_predicted"] == pytest.approx(1 / 1.25)
    assert (2, "ddp") not in rows  # only measured arms are checked


def test_arm_overrides_select_the_arm() -> None:
    from shadowsync.pipelines.config import load_config

    for arm in sm.arms(period=7):
        sync = load_config("movielens_1m", arm.overrides.split()).sync
        assert sync.strategy.name == (arm.strategy or arm.kind)
        if arm.strategy is not None:
            assert sync.schedule.mode == arm.kind
        if arm.kind == "fixed_rate":
            assert sync.schedule.period == 7
    assert [a.name for a in sm.arms()][:3] == ["none", "ddp", "fixed-rate ma k=10"]


def test_with_dense_bytes_scales_the_round() -> None:
    big = sm.with_dense_bytes(K, 1e8)
    assert big.dense_bytes == 1e8
    assert big.round_local_s == pytest.approx({"ma": 1e-2, "easgd": 2e-2, "bmuf": 3e-2})
    assert big.step_s == K.step_s and big.contention == K.contention


def test_with_step_sets_the_step_alone_and_the_gap_follows() -> None:
    """A GPU trainer's longer step: the same round hides behind fewer steps."""
    net = sm.Network.of(10, 20)
    big = sm.with_dense_bytes(K, 1e8)  # a round: 2 * 63/64 * 0.08 s + 20 us * 126 + 0.01 s
    slow = sm.with_step(big, 0.09)
    assert slow.step_s == 0.09 and slow.round_local_s == big.round_local_s
    fast, long = (sm.predict(sm.Arm("shadow", "ma"), 64, k, net) for k in (big, slow))
    round_s = 2 * 63 / 64 * 0.08 + 126 * 20e-6 + 0.01
    assert long.step_s == pytest.approx((0.09 + sm.all_to_all_s(4e5, 64, net)) * 1.25)
    assert long.sync_gap == math.ceil(round_s / long.step_s) == 2
    assert fast.sync_gap == math.ceil(round_s / fast.step_s) > 10
    with pytest.raises(ValueError, match="must last > 0 s"):
        sm.with_step(K, 0.0)


# ------------------------------------------------------------------ testbed mode (frontier jobs)
LINKS = tb.TestbedLinks(efficiency=0.95, unlimited_Bps=6e8, probe_hosts=2, tbf_latency_s=0.1)
TB_ARMS = ["none", "ddp", "FR k=1", "FR k=2", "FR k=10", "FR k=50", "S back to back", "S 20%",
           "S 5%", "S 2%"]
TRUE = tb.TestbedConstants(rho=0.4, delta=0.15, kappa=0.6, stretch=0.5, queued=1.5)


def _job(t0: float = 0.1, hosts: int = 2, link: str = "1gbit", w: float = 1e6,
         s: float = 1e7, steps: int = 100) -> tb.TestbedJob:
    beta = LINKS.bandwidth_Bps(link, hosts)
    return tb.TestbedJob(hosts=hosts, link=link, steps=steps, step_s=t0, bandwidth_Bps=beta,
                         round_bytes=s, a2a_s=w / beta, cpu_Bps=LINKS.cpu_Bps(hosts),
                         link_Bps=LINKS.link_Bps(link), tbf_latency_s=LINKS.tbf_latency_s)


def _rows(job: tb.TestbedJob, k: tb.TestbedConstants, arms: list[str] = TB_ARMS,
          batch: int = 512, none_by_repeat: tuple[float, ...] = (1.0,)) -> list[dict]:
    """bench_sync rows whose arms run exactly as the model predicts; ``none_by_repeat`` scales
    each repeat's speed (the same factor for every arm of a repeat, as a slow repeat does)."""
    rows = []
    for rep, speed in enumerate(none_by_repeat):
        for name in arms:
            arm = tb.parse_testbed_arm(name)
            p = tb.predict_testbed(arm, job, k)
            rate = job.hosts * batch / p.step_s * speed
            row = {"arm": name, "seed": 0, "repeat": rep, "step": job.steps,
                   "examples_per_s": rate, "train_seconds": job.steps * p.step_s / speed}
            if name == "none":
                row["wire_bytes"] = job.a2a_s * job.bandwidth_Bps * job.hosts * job.steps
            if arm.kind in ("fixed_rate", "shadow"):
                rounds = job.steps / p.gap
                row.update(sync_rounds=rounds, sync_gap_mean=p.gap,
                           sync_bytes_reduced=job.round_bytes * (rounds + 1),
                           sync_comm_seconds=p.allreduce_s * (rounds + 1))
            rows.append(row)
    return rows


def test_link_rates_bandwidth_and_queue() -> None:
    assert tb.link_rate_Bps("1gbit") == pytest.approx(1.25e8)
    assert tb.link_rate_Bps("200mbit") == pytest.approx(2.5e7)
    assert tb.link_rate_Bps("unlimited") is None
    with pytest.raises(ValueError, match="link"):
        tb.link_rate_Bps("fast")
    assert LINKS.bandwidth_Bps("1gbit", 2) == pytest.approx(0.95 * 1.25e8)
    assert LINKS.bandwidth_Bps("1gbit", 4) == pytest.approx(0.95 * 1.25e8)  # below the CPU cap
    assert LINKS.bandwidth_Bps("unlimited", 2) == pytest.approx(6e8)
    assert LINKS.bandwidth_Bps("unlimited", 4) == pytest.approx(3e8)  # the cores are shared
    assert LINKS.bandwidth_Bps("10gbit", 2) == pytest.approx(6e8)  # tbf above what CPUs move
    assert LINKS.cpu_Bps(4) == pytest.approx(3e8)
    assert tb.link_rate_Bps("1gbit-bs512") == pytest.approx(1.25e8)  # a --tag variant
    # one ring chunk (S/N) ahead in the queue, capped by tbf's latency limit
    assert _job(link="1gbit").queue_s(8e6) == pytest.approx(4e6 / (0.95 * 1.25e8))
    assert _job(link="1gbit", hosts=4).queue_s(8e6) == pytest.approx(2e6 / (0.95 * 1.25e8))
    assert _job(link="200mbit").queue_s(8e6) == pytest.approx(0.1)
    assert _job(link="200mbit").queue_s(65536) == pytest.approx(32768 / (0.95 * 2.5e7))
    assert _job(link="10gbit").queue_s(8e6) == 0.0  # the cores are the limit: no queue
    assert _job(link="unlimited").queue_s(8e6) == 0.0


def test_parse_testbed_arm() -> None:
    assert tb.parse_testbed_arm("FR k=20") == tb.TestbedArm("FR k=20", "fixed_rate", period=20)
    assert tb.parse_testbed_arm("S 5%").max_slowdown == pytest.approx(0.05)
    back = tb.parse_testbed_arm("S back to back")
    assert back.kind == "shadow" and back.max_slowdown is None and back.family == "shadow"
    assert tb.parse_testbed_arm("ddp").family == "ddp"
    assert tb.parse_testbed_arm("FR k=1").family == "FR"
    with pytest.raises(ValueError, match="not a frontier arm"):
        tb.parse_testbed_arm("shadow ma")


def test_measure_pairs_each_run_with_its_repeats_none() -> None:
    rows = [
        {"arm": "none", "seed": 0, "repeat": 0, "step": 100, "examples_per_s": 1000.0,
         "train_seconds": 51.2, "wire_bytes": 8e8},
        {"arm": "none", "seed": 0, "repeat": 1, "step": 100, "examples_per_s": 2000.0,
         "train_seconds": 25.6, "wire_bytes": 8e8},
        {"arm": "S 5%", "seed": 0, "repeat": 0, "step": 100, "examples_per_s": 900.0,
         "train_seconds": 400 * 128 / 900, "sync_rounds": 9, "sync_bytes_reduced": 1e8,
         "sync_comm_seconds": 2.0,
         "sync_gap_mean": 10.0, "sync_busy_share": 0.2, "sync_round_cost": 0.25},
        {"arm": "S 5%", "seed": 0, "repeat": 1, "step": 100, "examples_per_s": 1700.0,
         "train_seconds": 400 * 128 / 1700, "sync_rounds": 19, "sync_bytes_reduced": 2e8,
         "sync_comm_seconds": 3.0,
         "sync_gap_mean": 5.0, "sync_round_cost": math.nan},
    ]
    m = tb.measure_testbed(rows, hosts=4)
    # paired: 900/1000 and 1700/2000; unpaired medians would give 1300/1500
    assert m["S 5%"].ratio == pytest.approx((0.9 + 0.85) / 2)
    assert (m["S 5%"].ratio_min, m["S 5%"].ratio_max) == pytest.approx((0.85, 0.9))
    assert m["S 5%"].gap == pytest.approx(7.5)
    assert m["S 5%"].round_bytes == pytest.approx(1e7)  # the consensus is one more allreduce
    assert m["S 5%"].comm_per_round_s == pytest.approx((0.2 + 0.15) / 2)
    assert m["S 5%"].busy_share == pytest.approx(0.2)  # a missing key is left out
    assert m["S 5%"].round_cost == pytest.approx(0.25)  # so is NaN
    assert m["none"].wire_bytes_per_step == pytest.approx(8e8 / (4 * 100))
    assert (m["none"].batch_size, m["S 5%"].batch_size) == (128, 128)  # 4 hosts, 100 steps
    assert math.isnan(m["none"].gap) and math.isnan(m["none"].round_bytes)
    with pytest.raises(ValueError, match="none"):
        tb.measure_testbed(rows[2:], hosts=4)
    # bracketed turns (frontier --bracket): each against the none turns beside it
    moved = [{**r, "baseline_examples_per_s": 1800.0} if r["arm"] == "S 5%" else r
             for r in rows]
    assert tb.measure_testbed(moved, hosts=4)["S 5%"].ratio == pytest.approx(
        (900 + 1700) / 2 / 1800)


def test_turns_jobs_count_a_turns_steps_bytes_and_gaps() -> None:
    """A --interleave job's rows are turns of B steps, without a run's counters: an FR turn's
    bytes over its syncs are one round's, and gaps are measured within turns."""
    rows = [
        {"arm": "none", "seed": 0, "repeat": 0, "interleave": 100, "examples_per_s": 1000.0,
         "train_seconds": 25.6, "wire_bytes": 8e8},
        {"arm": "FR k=10", "seed": 0, "repeat": 0, "interleave": 100, "examples_per_s": 800.0,
         "train_seconds": 32.0, "sync_syncs_applied": 10, "sync_bytes_reduced": 1e8,
         "sync_gap_mean": 10.0},
        {"arm": "S 5%", "seed": 0, "repeat": 0, "interleave": 100, "examples_per_s": 950.0,
         "train_seconds": 25.6 / 0.95, "sync_syncs_applied": 20, "sync_bytes_reduced": 2.1e8,
         "sync_gap_mean": 5.0},
    ]
    m = tb.measure_testbed(rows, hosts=2)
    assert m["none"].interleaved and m["none"].steps == 100
    assert (m["none"].batch_size, m["S 5%"].batch_size) == (128, 128)
    assert m["none"].wire_bytes_per_step == pytest.approx(8e8 / (2 * 100))
    assert m["FR k=10"].round_bytes == pytest.approx(1e7)
    assert math.isnan(m["S 5%"].round_bytes)  # its bytes hold the round cut off at its end
    assert math.isnan(m["FR k=10"].comm_per_round_s)  # turns do not time allreduces
    assert m["S 5%"].ratio == pytest.approx(0.95)
    runs, turns = _job(), dataclasses.replace(_job(), interleaved=True)
    fr = [tb.predict_testbed(tb.parse_testbed_arm("FR k=10"), j, TRUE) for j in (runs, turns)]
    assert (fr[0].gap, fr[1].gap) == pytest.approx((9.1, 10.0))  # no first round at step 1
    assert fr[0].ratio == fr[1].ratio  # 100 steps hold 10 rounds either way
    s5 = [tb.predict_testbed(tb.parse_testbed_arm("S 5%"), j, TRUE) for j in (runs, turns)]
    assert s5[1].gap == s5[1].steady_gap > s5[0].gap  # no first round, no stop round
    assert s5[0].ratio == s5[1].ratio


def test_a_device_wait_is_neither_compute_nor_all_to_all() -> None:
    """With ``--device-step-ms``, the rows say how long each step waited for the emulated
    device: that part of T0 is idle cores, so the CPU work scaled by Tc leaves it out."""
    rows = [{"arm": a, "seed": 0, "repeat": 0, "interleave": 100, "examples_per_s": e,
             "train_seconds": 25.6 * 1000 / e, "wire_bytes": 8e8, "device_step_ms": 60.0}
            for a, e in (("none", 1000.0), ("FR k=10", 900.0))]
    m = tb.measure_testbed(rows, hosts=2)
    assert m["none"].device_s == pytest.approx(0.06)
    assert tb.measure_testbed([{k: v for k, v in r.items() if k != "device_step_ms"}
                               for r in rows], hosts=2)["none"].device_s == 0.0
    plain = _job()
    waiting = dataclasses.replace(plain, device_s=0.05)
    assert waiting.compute_s == pytest.approx(plain.compute_s - 0.05)
    fr = tb.parse_testbed_arm("FR k=10")
    k = tb.TestbedConstants(rho=0.5, delta=0.0, kappa=0.0)
    # the FR round's CPU work r = rho Tc shrinks by rho D; its allreduce does not
    less = (tb.predict_testbed(fr, plain, k).step_s - tb.predict_testbed(fr, waiting, k).step_s)
    assert less == pytest.approx(10 / 100 * 0.5 * 0.05)


def test_fixed_rate_rounds_and_gap_follow_the_runner_schedule() -> None:
    assert [tb.fr_rounds(100, k) for k in (1, 2, 3, 10, 50, 200)] == [100, 50, 34, 10, 2, 1]
    k = tb.TestbedConstants(rho=0.0, delta=0.0, kappa=0.0)
    gaps = {p: tb.predict_testbed(tb.parse_testbed_arm(f"FR k={p}"), _job(), k).gap
            for p in (1, 2, 10)}
    assert gaps == pytest.approx({1: 1.0, 2: 1.98, 10: 9.1})  # the first round after step 1


def test_shadow_rounds_over_a_finite_run() -> None:
    assert tb.shadow_rounds(100, 1.0, 1.0) == 100  # starts at steps 1..99, then stop's round
    assert tb.shadow_rounds(100, 5.0, 40.0) == 5  # starts at 1, 6, 46, 86; stop's round
    assert tb.shadow_rounds(100, 200.0, 200.0) == 2  # one round in training, stop's round
    assert tb.shadow_rounds(100, 2.5, 2.5) == 41  # starts at 1, 3.5, ..., 98.5; stop's round


def test_predict_testbed_on_hand_numbers() -> None:
    # T0 = 0.1 s, beta = 1e8 B/s, S = 1e7 B, w = 1e6 B, cores move 1e9 B/s:
    # A = 0.1 s, Ac = 0.01 s, X = 0.01 s, Tc = 0.09 s
    job = tb.TestbedJob(hosts=2, link="x", steps=100, step_s=0.1, bandwidth_Bps=1e8,
                        round_bytes=1e7, a2a_s=0.01, cpu_Bps=1e9, link_Bps=1e8,
                        tbf_latency_s=0.1)
    assert job.allreduce_s == pytest.approx(0.1) and job.compute_s == pytest.approx(0.09)
    assert job.transfer_cpu_of(1e7) == pytest.approx(0.01)
    k = tb.TestbedConstants(rho=0.5, delta=0.1, kappa=0.5, stretch=1 / 9)  # r = 0.045 s

    def arm(name: str) -> tb.TestbedPrediction:
        return tb.predict_testbed(tb.parse_testbed_arm(name), job, k)

    assert arm("none").ratio == 1.0
    assert arm("ddp").step_s == pytest.approx(0.1 + 0.009 + 0.1)
    assert arm("FR k=10").step_s == pytest.approx(0.1 + 10 / 100 * (0.045 + 0.1))
    assert arm("FR k=10").ratio == pytest.approx(0.1 / 0.1145)
    # shadow: Ab = 0.1 * 1.1 + 0.01 = 0.12, R = 0.165, kappa (r + Ac) = 0.0275, no queue
    # (q = 0); with g = R/T + 1/2, T = T0 + 0.0275 / g is 0.5 T^2 + 0.0875 T - 0.0165 = 0
    t = -0.0875 + math.sqrt(0.0875**2 + 4 * 0.5 * 0.0165)
    g = 0.165 / t + 0.5
    back = arm("S back to back")
    assert back.allreduce_s == pytest.approx(0.12)
    assert back.step_s == pytest.approx(t, rel=1e-9)
    assert back.steady_gap == pytest.approx(g, rel=1e-9)
    assert back.round_cost_s == pytest.approx(0.0275)
    assert back.gap == pytest.approx(100 / 52)  # starts at 1, 1 + g, ... (51), stop's round
    assert 0.05 < 0.0275 / (g * 0.1) < 0.2  # its slowdown: within 20%, over 5%
    within = arm("S 20%")
    assert within.step_s == back.step_s and within.steady_gap == back.steady_gap
    assert within.gap == pytest.approx(100 / 51)  # the pacer's 3 quiet steps after round 1
    paced = arm("S 5%")
    assert paced.ratio == pytest.approx(1 / 1.05)
    assert paced.steady_gap == pytest.approx(0.0275 / (0.05 * 0.1))  # 5.5
    assert paced.gap == pytest.approx(100 / 20)  # starts at 1, 4 + g, then every 5.5 steps
    assert back.ratio_at_gap(job, 6.5) == pytest.approx(0.1 / (0.1 + 0.0275 / 6.5))
    assert math.isnan(arm("ddp").ratio_at_gap(job, 3.0))


def test_shadow_queue_term_on_hand_numbers() -> None:
    """A round short against the step (g = 1) on a queueing link: T = T0 + kappa (r + Ac) +
    q Q Ab / T."""
    job = tb.TestbedJob(hosts=2, link="x", steps=100, step_s=0.1, bandwidth_Bps=1e8,
                        round_bytes=1e6, a2a_s=0.0, cpu_Bps=1e9, link_Bps=1e7,
                        tbf_latency_s=0.1)
    assert job.queue_s(1e6) == pytest.approx(0.05)
    k = tb.TestbedConstants(rho=0.1, delta=0.0, kappa=1.0, queued=2.0)  # r = 0.01 s
    back = tb.predict_testbed(tb.parse_testbed_arm("S back to back"), job, k)
    # Ab = A = 0.01, Ac = 0.001: T^2 - 0.111 T - 2 * 0.05 * 0.01 = 0
    assert back.step_s == pytest.approx((0.111 + math.sqrt(0.111**2 + 0.004)) / 2, rel=1e-9)
    assert back.steady_gap == 1.0
    no_queue = tb.predict_testbed(tb.parse_testbed_arm("S back to back"),
                                  dataclasses.replace(job, link_Bps=None), k)
    assert no_queue.step_s == pytest.approx(0.111)


def test_back_to_back_solves_its_equation_everywhere() -> None:
    for t0 in (0.01, 0.1):
        for cpu_share in (0.0, 0.3, 1.0):
            for queue in (0.0, 0.05):
                for duration in (0.001, 0.05, 0.1, 0.5, 3.0):
                    cpu, background = cpu_share * duration, duration / 2
                    step, gap = tb._back_to_back(t0, cpu, queue, background, duration)
                    assert gap >= 1
                    assert gap == pytest.approx(tb.shadow_gap(duration, step), rel=1e-9)
                    share = min(1.0, background / (gap * step))
                    assert step == pytest.approx(t0 + cpu / gap + queue * share, rel=1e-9)


def _fr_point(comm_s: float, size: float = 8e6) -> tb.TestbedMeasured:
    nan = math.nan
    return tb.TestbedMeasured(runs=1, batch_size=128, examples_per_s=1.0, ratio=1.0,
                              ratio_min=1.0, ratio_max=1.0, gap=1.0, steps=100,
                              round_bytes=size, comm_per_round_s=comm_s,
                              wire_bytes_per_step=nan, busy_share=nan, round_cost=nan)


def test_links_calibrated_on_fixed_rate_allreduce_times() -> None:
    measured = {
        (2, "1gbit"): {"FR k=1": _fr_point(0.08), "S 5%": _fr_point(1.0)},
        (4, "unlimited"): {"FR k=2": _fr_point(0.048)},  # 1.5 * 8e6 B in 0.048 s per host
        (2, "10gbit"): {"FR k=1": _fr_point(0.02), "none": _fr_point(math.nan)},
    }
    cal = tb.calibrate_links(measured, LINKS)
    assert cal.efficiency == pytest.approx(8e6 / 0.08 / 1.25e8)  # 0.8; shadow arms not used
    # per host at 2 hosts: 2.5e8 * 4/2 from the 4-host job, 4e8 from 10gbit (the cores limit)
    assert cal.unlimited_Bps == pytest.approx((5e8 + 4e8) / 2)
    assert (cal.probe_hosts, cal.tbf_latency_s) == (LINKS.probe_hosts, LINKS.tbf_latency_s)
    only_tbf = tb.calibrate_links({(2, "1gbit"): measured[2, "1gbit"]}, LINKS)
    assert only_tbf.unlimited_Bps == LINKS.unlimited_Bps  # nothing to fit it on: the probe's


@pytest.mark.slow
def test_fit_recovers_the_constants_and_predicts_other_host_counts() -> None:
    links = dataclasses.replace(LINKS, efficiency=0.8, unlimited_Bps=3.5e8)  # not the probe's
    jobs = {}
    for hosts, t0 in ((2, 0.08), (4, 0.16)):  # 4 hosts on the same cores: twice the step
        for link in ("unlimited", "1gbit", "200mbit"):
            beta = links.bandwidth_Bps(link, hosts)
            job = tb.TestbedJob(hosts=hosts, link=link, steps=100, step_s=t0,
                                bandwidth_Bps=beta, round_bytes=8e6, a2a_s=7e5 / beta,
                                cpu_Bps=links.cpu_Bps(hosts), link_Bps=links.link_Bps(link),
                                tbf_latency_s=links.tbf_latency_s)
            jobs[hosts, link] = _rows(job, TRUE, batch=128, none_by_repeat=(1.0, 0.9, 1.1))
    cal, k, rows = sf.testbed_rows(jobs, fit_hosts=2, links=LINKS)
    assert (cal.efficiency, cal.unlimited_Bps) == pytest.approx((0.8, 3.5e8))
    assert (k.rho, k.delta, k.stretch) == pytest.approx((0.4, 0.15, 0.5), abs=1e-6)
    assert (k.kappa, k.queued) == pytest.approx((0.6, 1.5), abs=0.01)
    assert {r["role"] for r in rows if r["hosts"] == 4} == {sf.OTHER_HOSTS}
    assert {r["role"] for r in rows if r["hosts"] == 2} == {sf.IN_SAMPLE, sf.LINK_HELD_OUT}
    assert len(rows) == 3 * 9 + 3 * 9 * 2  # 9 arms but none; 2-host jobs in two roles
    for r in rows:
        if (r["link"], r["role"]) == ("unlimited", sf.LINK_HELD_OUT):
            continue  # the only CPU-limited link: held out, B_cpu falls back to the probe's
        assert r["ratio_error"] == pytest.approx(0.0, abs=2e-3), r
        if r["family"] != "ddp":
            assert r["gap_error"] == pytest.approx(0.0, abs=2e-2), r
        if r["family"] == "shadow":
            assert r["allreduce_predicted_s"] == pytest.approx(r["allreduce_measured_s"],
                                                               rel=1e-6)
    summary = sf.testbed_summary(rows)
    assert [(s["role"], s["family"]) for s in summary] == [
        (role, f) for role in sf.TESTBED_ROLES for f in tb.TESTBED_FAMILIES]
    assert all(s["ratio_max"] < 2e-3 for s in summary if s["role"] != sf.LINK_HELD_OUT)


@pytest.mark.slow
def test_a_held_out_link_is_predicted_without_its_own_data() -> None:
    """Two 2-host links whose rounds cost differently: each held-out prediction uses only the
    other link's cost, so it misses by more than the fit on both does."""
    cheap = dataclasses.replace(TRUE, rho=0.2)
    dear = dataclasses.replace(TRUE, rho=0.8)
    jobs = {(2, "1gbit"): _rows(_job(link="1gbit"), cheap),
            (2, "200mbit"): _rows(_job(link="200mbit"), dear)}
    _, _, rows = sf.testbed_rows(jobs, fit_hosts=2, links=LINKS)

    def fr_errors(link: str, role: str) -> list[float]:
        return [r["ratio_error"] for r in rows
                if (r["link"], r["role"], r["family"]) == (link, role, "FR")]

    held, fitted = fr_errors("1gbit", sf.LINK_HELD_OUT), fr_errors("1gbit", sf.IN_SAMPLE)
    assert all(h < f < 0 for h, f in zip(held, fitted, strict=True))  # predicted too slow
    held, fitted = fr_errors("200mbit", sf.LINK_HELD_OUT), fr_errors("200mbit", sf.IN_SAMPLE)
    assert all(h > f > 0 for h, f in zip(held, fitted, strict=True))  # predicted too fast


def test_testbed_summary_reports_absolute_errors() -> None:
    def row(family: str, ratio_error: float, gap_error: float, inside: bool = False) -> dict:
        return {"role": sf.OTHER_HOSTS, "family": family, "ratio_error": ratio_error,
                "gap_error": gap_error, "at_gap_error": math.nan, "in_spread": inside}

    summary = sf.testbed_summary([row("FR", -0.3, 0.0), row("FR", 0.1, 0.0, inside=True),
                                  row("FR", 0.2, math.nan), row("ddp", 0.05, math.nan)])
    fr = next(s for s in summary if s["family"] == "FR")
    assert (fr["points"], fr["in_spread"]) == (3, 1)
    assert (fr["ratio_median"], fr["ratio_max"]) == pytest.approx((0.2, 0.3))
    assert (fr["gap_median"], fr["gap_max"]) == (0.0, 0.0)
    assert math.isnan(fr["at_gap_median"])
    ddp = next(s for s in summary if s["family"] == "ddp")
    assert math.isnan(ddp["gap_median"])


def test_a_slower_cluster_is_seen_as_error() -> None:
    """Measured runs slower than the model: the errors say so, out of sample too."""
    slow = dataclasses.replace(TRUE, rho=0.8)
    jobs = {(2, "1gbit"): _rows(_job(hosts=2), TRUE),
            (4, "1gbit"): _rows(_job(hosts=4, t0=0.2), slow)}
    _, _, rows = sf.testbed_rows(jobs, fit_hosts=2, links=LINKS)
    fr4 = [r for r in rows if r["hosts"] == 4 and r["family"] == "FR"]
    assert all(r["ratio_error"] > 0.001 for r in fr4)  # the model predicts them too fast


def test_testbed_report_from_raw_files(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    saved = {hosts: _rows(_job(hosts=hosts, t0=0.04 * hosts, link="200mbit"), TRUE)
             for hosts in (2, 4)}
    for hosts, rows in saved.items():
        (tmp_path / "raw" / f"h{hosts}_200mbit.json").write_text(json.dumps(rows))
    (tmp_path / "raw" / "h2_200mbit.log").write_text("not a job")
    jobs = sf.load_testbed(tmp_path)
    assert sorted(jobs) == [(2, "200mbit"), (4, "200mbit")]
    assert jobs[4, "200mbit"] == saved[4]
    text = sr.testbed_report(jobs, tmp_path, 2, LINKS, "cmd")
    assert "the batch per rank (512)" in text
    assert "## 2 hosts, 200mbit: in sample" in text  # one 2-host link: nothing to hold out
    assert "## 4 hosts, 200mbit: other host count" in text
    assert "| other host count | shadow | runs | 4 |" in text
    assert "No job with another host count" not in text
    with pytest.raises(ValueError, match="no 3-host job"):
        sf.testbed_rows(jobs, fit_hosts=3, links=LINKS)


def test_arms_from_recorded_overrides_and_names() -> None:
    link = tb.parse_testbed_arm("S link 50%")
    assert (link.kind, link.max_slowdown, link.max_comm_share) == ("shadow", None, 0.5)
    assert tb.parse_testbed_arm("FR k=5 bf16").wire_factor == 0.5
    assert tb.parse_testbed_arm("S 5%", chunk_bytes=65536).chunk_bytes == 65536
    assert tb.parse_testbed_arm("FR k=5", chunk_bytes=65536).chunk_bytes is None  # shadow only
    recorded = tb.parse_testbed_arm(
        "S 20%", "sync.strategy.name=ma sync.schedule.mode=shadow sync.schedule.max_slowdown=0.2 "
        "sync.transport.chunk_mb=0.25 sync.transport.wire_dtype=bfloat16", chunk_bytes=65536)
    assert (recorded.max_slowdown, recorded.chunk_bytes, recorded.wire_factor) == (
        0.2, 0.25 * 2**20, 0.5)  # the recorded chunk, not the fallback
    unchunked = tb.parse_testbed_arm("S back to back", "sync.schedule.mode=shadow "
                                     "sync.schedule.max_slowdown=null", chunk_bytes=65536)
    assert unchunked.max_slowdown is None and unchunked.chunk_bytes is None
    # jobs recorded before the sync section was split name its flat keys: read the same
    assert tb.parse_testbed_arm(
        "S 20%", "sync.algorithm=ma sync.mode=shadow sync.max_slowdown=0.2 sync.chunk_mb=0.25 "
        "sync.wire_dtype=bfloat16", chunk_bytes=65536) == recorded
    assert tb.parse_testbed_arm("S back to back", "sync.mode=shadow sync.max_slowdown=null",
                                chunk_bytes=65536) == unchunked
    assert tb.chunks(recorded, 8e6) == math.ceil(8e6 / 2**18)
    assert tb.chunks(unchunked, 8e6) == 1


def test_chunks_share_and_wire_dtype_in_the_prediction() -> None:
    job = _job(link="200mbit", t0=0.1, w=0.0, s=8e6)
    k = dataclasses.replace(TRUE, per_chunk=0.01)
    whole = tb.predict_testbed(tb.parse_testbed_arm("S back to back"), job, k)
    chunked = tb.predict_testbed(tb.parse_testbed_arm("S back to back", chunk_bytes=2**20), job, k)
    # 8 collectives of 1 MiB: phi * 8 Tc more in the background, one MiB queued at most
    assert chunked.allreduce_s - whole.allreduce_s == pytest.approx(0.01 * 7 * 0.1)
    assert job.queue_s(2**20) < job.queue_s(8e6)
    # training pays kappa of the collectives' CPU work (no queue here to tell them apart)
    arm, quiet = tb.parse_testbed_arm("S back to back", chunk_bytes=2**20), dataclasses.replace(
        job, link_Bps=None)
    with_phi = tb.predict_testbed(arm, quiet, k).round_cost_s
    without = tb.predict_testbed(arm, quiet, dataclasses.replace(k, per_chunk=0.0)).round_cost_s
    assert with_phi - without == pytest.approx(k.kappa * 0.01 * 8 * 0.1)
    half = tb.predict_testbed(tb.parse_testbed_arm("S link 50%"), job, k)
    assert half.allreduce_s == whole.allreduce_s  # the pauses are not transfer time
    assert half.steady_gap > whole.steady_gap  # but the round lasts longer
    fr, fr16 = (tb.predict_testbed(tb.parse_testbed_arm(n), job, k) for n in ("FR k=1",
                                                                               "FR k=1 bf16"))
    assert fr16.allreduce_s == pytest.approx(fr.allreduce_s / 2)


def test_arm_overrides_read_from_the_jobs_cmd_files(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "h2_1gbit.cmd").write_text(
        "python benchmarks/frontier.py --hosts 2\n"
        "  arm none: sync.strategy.name=none\n"
        "  arm S 5%: sync.strategy.name=ma sync.schedule.mode=shadow "
        "sync.schedule.max_slowdown=0.05 sync.transport.chunk_mb=0.298\n")
    (raw / "h2_200mbit.cmd").write_text("python benchmarks/frontier.py --hosts 2\n")  # older
    assert sf.load_arm_overrides(tmp_path) == {(2, "1gbit"): {
        "none": "sync.strategy.name=none",
        "S 5%": "sync.strategy.name=ma sync.schedule.mode=shadow "
                "sync.schedule.max_slowdown=0.05 sync.transport.chunk_mb=0.298"}}


def test_report_leaves_out_arms_it_does_not_know(tmp_path: Path) -> None:
    rows = _rows(_job(), TRUE)
    rows += [dict(r, arm="S mystery") for r in rows if r["arm"] == "S 5%"]
    text = sr.testbed_report({(2, "1gbit"): rows}, tmp_path, 2, LINKS, "cmd",
                             chunk_bytes={(2, "1gbit"): 2**16})
    assert "Not modelled, left out: S mystery." in text
    assert "**No job with another host count yet**" in text
    assert "listed: h2_1gbit (shadow in 0.0625 MiB chunks) (--chunk-mb)" in text
    assert "| S mystery |" not in text


@pytest.mark.slow
def test_testbed_command_line_chunk_fallbacks(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "raw").mkdir()
    for link in ("1gbit", "200mbit"):
        (tmp_path / "raw" / f"h2_{link}.json").write_text(json.dumps(_rows(_job(link=link),
                                                                           TRUE)))

    def run(*chunks: str) -> int:
        args = argparse.Namespace(testbed=tmp_path, fit_hosts=2, link_efficiency=0.95,
                                  unlimited_MBps=600.0, chunk_mb=list(chunks), out=tmp_path)
        return sr.testbed_main(args)

    assert run("h2_1gbit=0.0625", "0.5") == 0
    text = (tmp_path / "testbed_fit.md").read_text()
    assert "h2_1gbit (shadow in 0.0625 MiB chunks), h2_200mbit (shadow in 0.5 MiB chunks)" in text
    assert run("h4_1gbit=1") == 2
    assert "no job h4_1gbit" in capsys.readouterr().err


def test_arms_with_staleness_nice_and_traffic_class() -> None:
    arm = tb.parse_testbed_arm("S b2b n10 s4")
    assert (arm.kind, arm.max_slowdown, arm.thread_nice, arm.max_staleness, arm.low_class) == (
        "shadow", None, 10, 4, False)
    assert tb.parse_testbed_arm("S 5% n19").thread_nice == 19
    assert tb.parse_testbed_arm("S b2b") == dataclasses.replace(
        tb.parse_testbed_arm("S back to back"), name="S b2b")
    recorded = tb.parse_testbed_arm(
        "S b2b s1", "sync.schedule.mode=shadow sync.schedule.max_slowdown=null "
        "sync.schedule.max_staleness=null sync.transport.thread_nice=5 "
        "sync.transport.socket_ifname=veth0:sync")
    assert (recorded.max_staleness, recorded.thread_nice, recorded.low_class) == (None, 5, True)
    assert tb.parse_testbed_arm("FR k=2", "sync.schedule.period=2 "
                                "sync.transport.socket_ifname=veth0:sync").low_class
    assert not tb.parse_testbed_arm("FR k=2", "sync.schedule.period=2").low_class
    # the flat keys of earlier records (sync.max_staleness, sync.thread_nice, ...) read the same
    assert tb.parse_testbed_arm(
        "S b2b s1", "sync.mode=shadow sync.max_slowdown=null sync.max_staleness=null "
        "sync.thread_nice=5 sync.socket_ifname=veth0:sync") == recorded
    old_fr = tb.parse_testbed_arm("FR k=2", "sync.period=3 sync.socket_ifname=veth0:sync")
    assert (old_fr.period, old_fr.low_class) == (3, True)
    assert so.current_override_key("sync.thread_nice") == "sync.transport.thread_nice"
    assert so.current_override_key("sync.algorithm") == "sync.strategy.name"
    for key in ("sync.schedule.max_staleness", "train.steps", "sync.strategy.options.x"):
        assert so.current_override_key(key) == key
    with pytest.raises(ValueError, match="not a frontier arm"):
        tb.parse_testbed_arm("S b2b x3")


def test_staleness_class_and_nice_on_hand_numbers() -> None:
    """The job of test_shadow_queue_term_on_hand_numbers; then the bound K: a round lasting
    longer than K steps makes the K-th step wait for it."""
    job = tb.TestbedJob(hosts=2, link="x", steps=100, step_s=0.1, bandwidth_Bps=1e8,
                        round_bytes=1e6, a2a_s=0.0, cpu_Bps=1e9, link_Bps=1e7,
                        tbf_latency_s=0.1)
    k = tb.TestbedConstants(rho=0.1, delta=0.0, kappa=1.0, queued=2.0)

    def predict(name: str, overrides: str | None = None,
                constants: tb.TestbedConstants = k) -> tb.TestbedPrediction:
        return tb.predict_testbed(tb.parse_testbed_arm(name, overrides), job, constants)

    low = predict("S b2b", "sync.schedule.max_slowdown=null "
                  "sync.transport.socket_ifname=veth0:sync")
    assert low.step_s == pytest.approx(0.111)  # no queue behind a round in the low class
    assert predict("S b2b").step_s > 0.111
    # a long round: S = 1e8 B, A = 1 s, Ac = 0.1 s, r = 0.01 s, R = 1.01 s, Tc = T0 = 0.1 s
    big = dataclasses.replace(job, round_bytes=1e8, link_Bps=None)
    free = tb.predict_testbed(tb.parse_testbed_arm("S b2b"), big, k)
    assert free.steady_gap > 4  # unbounded: rounds span many steps
    for bound in (1, 2, 4):
        p = tb.predict_testbed(tb.parse_testbed_arm(f"S b2b s{bound}"), big, k)
        assert p.steady_gap == bound
        assert p.step_s == pytest.approx(1.01 / bound)  # the wait, not the CPU cost, binds
    loose = tb.predict_testbed(tb.parse_testbed_arm("S b2b s50"), big, k)
    assert (loose.step_s, loose.steady_gap) == (free.step_s, free.steady_gap)  # never binds
    # a niced thread: kappa_n, lam_n and mu_n instead of kappa and lam
    niced_k = dataclasses.replace(k, kappa=0.0, stretch=0.0, kappa_niced=0.5,
                                  stretch_niced=1.0, wait_niced=2.0)
    plain = tb.predict_testbed(tb.parse_testbed_arm("S b2b"), big, niced_k)
    assert plain.step_s == pytest.approx(0.1)  # kappa = 0: free
    niced = tb.predict_testbed(tb.parse_testbed_arm("S b2b n10"), big, niced_k)
    assert niced.allreduce_s == pytest.approx(1.0 + 1.0 * 0.1)  # A + lam_n Tc
    duration = 0.01 + 1.1 + 2.0 * 0.1  # r + Ab + mu_n Tc
    assert niced.steady_gap == pytest.approx(duration / niced.step_s + 0.5)
    assert niced.step_s == pytest.approx(0.1 + 0.5 * (0.01 + 0.1) / niced.steady_gap)


@pytest.mark.slow
def test_fit_recovers_the_niced_thread_constants() -> None:
    true = dataclasses.replace(TRUE, stretch_niced=0.8, wait_niced=1.5, kappa_niced=0.25)
    arms = [*TB_ARMS, "S b2b n10", "S b2b n19", "S 5% n10"]
    jobs = {(2, link): _rows(_job(link=link, t0=0.08, s=8e6, w=7e5), true, arms, batch=128)
            for link in ("unlimited", "1gbit", "200mbit")}
    _, k, rows = sf.testbed_rows(jobs, fit_hosts=2, links=LINKS)
    assert (k.kappa, k.queued, k.stretch) == pytest.approx((0.6, 1.5, 0.5), abs=0.01)
    assert k.stretch_niced == pytest.approx(0.8, rel=1e-6)  # from allreduce times: exact
    # mu_n from gaps as measured (rounds over a finite run), kappa_n from ratios and gaps
    assert k.wait_niced == pytest.approx(1.5, rel=0.15)
    assert k.kappa_niced == pytest.approx(0.25, abs=0.05)
    niced = [r for r in rows if r["role"] == sf.IN_SAMPLE and " n1" in r["arm"]]
    assert len(niced) == 9 and all(abs(r["ratio_error"]) < 0.02 for r in niced)


@pytest.mark.slow
def test_link_held_out_leaves_out_every_job_of_that_link() -> None:
    jobs = {(2, "1gbit"): _rows(_job(link="1gbit"), TRUE),
            (2, "1gbit-qos"): _rows(_job(link="1gbit"), TRUE)}
    _, _, rows = sf.testbed_rows(jobs, fit_hosts=2, links=LINKS)
    assert {r["role"] for r in rows} == {sf.IN_SAMPLE}  # one link: nothing to hold out
    jobs[2, "200mbit"] = _rows(_job(link="200mbit"), TRUE)
    _, _, rows = sf.testbed_rows(jobs, fit_hosts=2, links=LINKS)
    assert {r["link"] for r in rows if r["role"] == sf.LINK_HELD_OUT} == {
        "1gbit", "1gbit-qos", "200mbit"}
