"""The scaling model's equations on hand-checked numbers, and its reading of a calibration file.

Pure arithmetic: no processes, no measurement.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling_model.py"
_spec = importlib.util.spec_from_file_location("scaling_model", _PATH)
assert _spec is not None and _spec.loader is not None
sm = importlib.util.module_from_spec(_spec)
sys.modules["scaling_model"] = sm  # dataclasses look their module up by name
_spec.loader.exec_module(sm)

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
    rows = {(r["n"], r["arm"]): r for r in sm.check_rows(cal["presets"]["p"],
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
        assert sync.algorithm == (arm.strategy or arm.kind)
        if arm.strategy is not None:
            assert sync.mode == arm.kind
        if arm.kind == "fixed_rate":
            assert sync.period == 7
    assert [a.name for a in sm.arms()][:3] == ["none", "ddp", "fixed-rate ma k=10"]


def test_with_dense_bytes_scales_the_round() -> None:
    big = sm.with_dense_bytes(K, 1e8)
    assert big.dense_bytes == 1e8
    assert big.round_local_s == pytest.approx({"ma": 1e-2, "easgd": 2e-2, "bmuf": 3e-2})
    assert big.step_s == K.step_s and big.contention == K.contention
