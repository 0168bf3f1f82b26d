"""The frontier report's arithmetic on hand-made runs: ratios to the same repeat's ``none``,
spreads, and the dominance test that the network benchmark's claim rests on.

Pure arithmetic: no processes, no network.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from shadowsync.benchmarks import frontier as fr
from shadowsync.benchmarks import rows
from shadowsync.benchmarks import tradeoff as to
from shadowsync.benchmarks.scaling_model import overrides as so


def run(arm: str, repeat: int, eps: float, gap: float | None = None,
        ne: float = 0.9) -> dict[str, Any]:
    row: dict[str, Any] = {"arm": arm, "seed": 0, "repeat": repeat, "examples_per_s": eps,
                           "train_seconds": 10.0, "eval_ne": ne + repeat * 0.01}
    if gap is not None:
        row.update(sync_gap_mean=gap, sync_bytes_reduced=1e6 * 10 / gap)
    return row


# none runs at 1000, 800, 1250 examples/s in its three repeats (a noisy machine): ratios are
# taken per repeat, so an arm that is always 10% slower than none reads 0.9 in each.
ROWS = [
    *[run("none", r, e) for r, e in enumerate([1000, 800, 1250])],
    *[run("FR k=10", r, e, gap=10) for r, e in enumerate([900, 720, 1125])],
    *[run("FR k=2", r, e, gap=2) for r, e in enumerate([500, 400, 625])],
    *[run("S 5%", r, e, gap=4) for r, e in enumerate([950, 768, 1200])],  # 0.95, 0.96, 0.96
    *[run("S back to back", r, e, gap=1.1) for r, e in enumerate([700, 480, 875])],
]


def arms() -> dict[str, dict[str, Any]]:
    return {a["arm"]: a for a in to.summarize(ROWS, world_size=2)}


def test_slowdown_goal_needs_the_whole_spread_and_names_the_nearest_fr() -> None:
    (goal,) = to.slowdown_goal(list(arms().values()))
    assert (goal["arm"], goal["keep"], goal["fr"]) == ("S 5%", 0.95, "FR k=10")
    assert goal["kept"] and goal["less_often"] == pytest.approx(10 / 4)
    slow = [{**r, "examples_per_s": r["examples_per_s"] * 0.99} if r["arm"] == "S 5%" and
            r["repeat"] == 0 else r for r in ROWS]  # one repeat at 0.9405 < 0.95
    (missed,) = to.slowdown_goal(to.summarize(slow, world_size=2))
    assert not missed["kept"]
    assert ("| S 5% | 0.95 | 0.960 [0.941, 0.960] | **no** | - | 4.0 | FR k=10 (0.900, 10.0) "
            "| 2.5 |") in to.slowdown_table([missed])
    # The pacer's own reckoning of its loss: busy share times round cost, over the runs.
    paced = [{**r, "sync_busy_share": 0.5, "sync_round_cost": 0.06 + 0.02 * r["repeat"]}
             if r["arm"] == "S 5%" else r for r in ROWS]
    (goal,) = to.slowdown_goal(to.summarize(paced, world_size=2))
    assert goal["reckoned"] == pytest.approx(0.04)
    assert "| yes | 4.0% | 4.0 |" in to.slowdown_table([goal])
    # Over many jobs: each median's loss against its budget and against the reckoning (0.04
    # and 0.06 lost where 0.05 was asked and 0.04 and 0.05 reckoned), beside the A/A scatter.
    dearer = {**goal, "ratio": {**goal["ratio"], "median": 0.94}, "reckoned": 0.05}
    aa = [{"arm": "none A/A", "ratio": {"median": m}} for m in (0.99, 1.01)]
    line = to.budget_line([goal, dearer], aa)
    assert ("(2 arms): the loss of its median against its budget +0.0 ± 1.0 points (mean ± sd "
            "over the arms; 1 within it), and against the loss its pacer reckoned +0.5 ± 0.5 "
            "points; the A/A arms' medians scatter by 1.0 points (sd over 2 jobs)") in line
    assert to.budget_line([], aa) == ""


def test_slowdown_budgets_come_from_the_recorded_overrides() -> None:
    lines = ["  arm none: sync.strategy.name=none",
             "  arm FR k=10: sync.strategy.name=ma sync.schedule.mode=fixed_rate "
             "sync.schedule.period=10",
             "  arm S 5%: sync.strategy.name=ma sync.schedule.max_slowdown=0.2 "
             "sync.transport.socket_ifname=veth0:sync",
             "  arm S back to back: sync.strategy.name=ma sync.schedule.max_slowdown=null"]
    budgets = to.slowdown_budgets(so.arm_overrides(["python benchmarks/frontier.py", *lines]))
    assert budgets == {"S 5%": 0.2}  # what the arm ran with, whatever its label says
    # jobs recorded before the sync section was split name its flat keys
    old = ["  arm none: sync.algorithm=none",
           "  arm S 5%: sync.algorithm=ma sync.max_slowdown=0.2 sync.socket_ifname=veth0:sync",
           "  arm S back to back: sync.algorithm=ma sync.max_slowdown=null"]
    assert to.slowdown_budgets(so.arm_overrides(old)) == budgets
    (goal,) = to.slowdown_goal(list(arms().values()), budgets)
    assert goal["keep"] == pytest.approx(0.8)
    assert to.slowdown_goal(list(arms().values()), {}) == []  # no arm had a budget


def test_ratios_are_to_the_same_repeats_none() -> None:
    a = arms()
    assert a["FR k=10"]["ratio"] == pytest.approx({"median": 0.9, "min": 0.9, "max": 0.9})
    assert a["S 5%"]["ratio"] == pytest.approx({"median": 0.96, "min": 0.95, "max": 0.96})
    assert a["S back to back"]["ratio"]["min"] == pytest.approx(0.6)
    assert a["none"]["sync_per_example"] == 0.0
    # 1e6 * 10 / 4 bytes reduced per rank, ring factor 2 (W - 1) = 2, over eps * 10 s examples
    assert a["S 5%"]["sync_per_example"] == pytest.approx(
        sum(2.5e6 * 2 / (e * 10) for e in [950, 768, 1200]) / 3)
    # quality comes from each seed's first repeat only (one seed here: no spread)
    assert a["FR k=10"]["ne"] == pytest.approx(0.9) and math.isnan(a["FR k=10"]["ne_sd"])


def test_dominance_needs_the_whole_spread_and_a_smaller_gap() -> None:
    d = {row["fr"]: row for row in to.dominance(list(arms().values()))}
    # S 5% is faster in every repeat than FR k=10's best and syncs 2.5x as often.
    assert d["FR k=10"]["strict"] == ["S 5%"]
    # Against FR k=2 (ratio 0.5, gap 2) both shadow arms are faster; only back to back has a
    # gap <= 2.
    assert d["FR k=2"]["strict"] == ["S back to back"]


def test_paired_dominance_compares_runs_of_the_same_repeat() -> None:
    """The machine slowed down in repeat 1 (none 1000 -> 700): ratios to none spread the FR arm
    over [0.8, 1.14] and hide that the shadow arm was faster in every repeat."""
    rows = [*[run("none", r, e) for r, e in enumerate([1000, 700])],
            *[run("FR k=5", r, e, gap=5) for r, e in enumerate([800, 800])],
            *[run("S b2b n10", r, e, gap=4) for r, e in enumerate([880, 840])],
            *[run("S b2b", r, e, gap=2) for r, e in enumerate([900, 790])]]
    d = {row["fr"]: row for row in to.dominance(to.summarize(rows, world_size=2))}
    assert d["FR k=5"]["paired"] == pytest.approx({"S b2b n10": 1.05})  # min(1.1, 1.05)
    assert d["FR k=5"]["strict"] == []  # 0.88 < 1.14
    assert "S b2b n10 (1.05)" in to.dominance_table(list(d.values()))


def test_dominance_fails_when_spreads_overlap() -> None:
    rows = [*ROWS, *[run("FR k=5", r, e, gap=5) for r, e in enumerate([940, 780, 1200])]]
    d = {row["fr"]: row for row in to.dominance(to.summarize(rows, world_size=2))}
    # FR k=5's best repeat (0.975) beats S 5%'s worst (0.95): not beyond the spread, although
    # S 5%'s median (0.96) equals FR k=5's median (0.96).
    assert d["FR k=5"]["strict"] == []
    assert d["FR k=5"]["median"] == ["S 5%"]


def test_dominance_compares_arms_that_send_the_same_bytes() -> None:
    """A bfloat16 shadow arm sends half the bytes of a float32 FR arm: it is judged only
    against FR arms in bfloat16."""
    rows = [*ROWS, *[run("S 5% bf16", r, e, gap=3) for r, e in enumerate([990, 790, 1240])],
            *[run("FR k=10 bf16", r, e, gap=10) for r, e in enumerate([950, 760, 1190])]]
    d = {row["fr"]: row for row in to.dominance(to.summarize(rows, world_size=2))}
    assert d["FR k=10"]["strict"] == ["S 5%"]
    assert d["FR k=10 bf16"]["strict"] == ["S 5% bf16"]
    arms = fr.default_arms("ma", [5], ["5%: sync.schedule.max_slowdown=0.05"],
                           ["float32", "bfloat16"], "sync.transport.chunk_mb=1")
    assert [a.split(":")[0] for a in arms] == [
        "none", "ddp", "FR k=5", "S 5%", "FR k=5 bf16", "S 5% bf16"]
    assert arms[-1].split() == ["S", "5%", "bf16:", "sync.strategy.name=ma",
                                "sync.schedule.mode=shadow", "sync.schedule.max_slowdown=0.05",
                                "sync.transport.chunk_mb=1", "sync.transport.wire_dtype=bfloat16"]
    # Sync traffic in the low class: FR and shadow arms bind the sync group to the sync address.
    arms = fr.default_arms("ma", [5], ["b2b: sync.schedule.max_slowdown=null"],
                           sync_common="sync.transport.socket_ifname=veth0:sync")
    assert arms[:2] == ["none: sync.strategy.name=none", "ddp: sync.strategy.name=ddp"]
    assert all(a.endswith("sync.transport.wire_dtype=float32 "
                          "sync.transport.socket_ifname=veth0:sync") for a in arms[2:]), arms


def test_chunks_are_sized_by_link_time() -> None:
    assert fr.chunk_override("200mbit", 2.5) == "sync.transport.chunk_mb=0.0596"  # 62.5 kB
    assert fr.chunk_override("1gbit", 2.5) == "sync.transport.chunk_mb=0.298"
    assert fr.chunk_override("unlimited", 2.5) == ""
    assert fr.chunk_override("1gbit", 0) == ""


def test_an_aa_arm_is_reported_as_the_spread_between_identical_arms() -> None:
    arms_aa = fr.default_arms("ma", [5], ["b2b: sync.schedule.max_slowdown=null"], aa=True)
    assert arms_aa[-1] == f"{to.AA_ARM}: sync.strategy.name=none"
    assert to.AA_ARM not in "".join(
        fr.default_arms("ma", [5], ["b2b: sync.schedule.max_slowdown=null"]))
    again = [run(to.AA_ARM, r, e) for r, e in enumerate([1030, 760, 1250])]
    summary = to.summarize([*ROWS, *again], world_size=2)
    assert to.aa_line(summary).startswith(
        "A/A: a second `none` arm read 1.000 [0.950, 1.030] of the first")
    assert to.aa_line(list(arms().values())) == ""
    # it is neither an FR point nor a shadow arm
    assert all(to.AA_ARM not in (d["fr"], *d["strict"], *d["median"])
               for d in to.dominance(summary))


@pytest.mark.slow
def test_an_interleaved_job_has_no_ddp_arm_and_says_what_its_repeats_are(
        tmp_path: Path) -> None:
    arms = fr.default_arms("ma", [5], ["b2b: sync.schedule.max_slowdown=null"], ddp=False)
    assert [a.split(":")[0] for a in arms] == ["none", "FR k=5", "S b2b"]
    (tmp_path / "raw").mkdir()
    turns = [{**r, "interleave": 100, "eval_ne": math.nan} for r in ROWS]
    (tmp_path / "raw" / "h2_1gbit-t.json").write_text(json.dumps(turns))
    (tmp_path / "raw" / "h2_1gbit.json").write_text(json.dumps(ROWS))
    text = to.report(tmp_path, ["1gbit", "1gbit-t"])
    separate, interleaved = text.split("### 2 hosts, links ")[1:]
    assert "Interleaved" not in separate
    assert "Interleaved (`--interleave 100`): the arms took turns of 100 steps" in interleaved
    # the same ratios either way, and no NE where one model served every arm
    assert "| S 5% | 950 | 0.960 [0.950, 0.960] | 4.0 |" in interleaved
    assert interleaved.split("| S 5% |")[1].split("\n")[0].endswith("| - |")


def test_bracketed_turns_are_compared_with_the_none_turns_beside_them(tmp_path: Path) -> None:
    """``--bracket``: each turn carries the examples/s of the ``none`` turns beside it; its
    ratio is to that, not to the cycle's ``none`` turn (here slower by half), and paired
    dominance compares those ratios."""
    # none runs a turn before each other turn: two a cycle here, no eval (one model)
    rows = [{**run("none", r, 500, ne=math.nan), "baseline_examples_per_s": 500.0,
             "interleave": 100} for r in (0, 0, 1, 1)]
    rows += [{**run("FR k=5", r, e, gap=5), "baseline_examples_per_s": b, "interleave": 100}
             for r, (e, b) in enumerate([(800, 1000), (810, 900)])]
    rows += [{**run("S b2b", r, e, gap=2), "baseline_examples_per_s": b, "interleave": 100}
             for r, (e, b) in enumerate([(950, 1000), (760, 800)])]
    a = {s["arm"]: s for s in to.summarize(rows, world_size=2)}
    assert a["none"]["runs"] == 4 and math.isnan(a["none"]["ne"])
    assert math.isnan(a["none"]["ne_sd"])
    assert a["FR k=5"]["ratio"] == pytest.approx({"median": 0.85, "min": 0.8, "max": 0.9})
    assert a["S b2b"]["ratio"] == pytest.approx({"median": 0.95, "min": 0.95, "max": 0.95})
    (d,) = to.dominance(list(a.values()))
    assert d["paired"] == pytest.approx({"S b2b": 0.95 / 0.9}) and d["strict"] == ["S b2b"]
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "h2_1gbit.json").write_text(json.dumps(rows))
    assert ("a `none` turn ran before every other turn (`--bracket`), and each turn is "
            "compared with the mean of the `none` turns just before and after it"
            in to.report(tmp_path, ["1gbit"]))


def test_a_traced_job_shows_where_each_arms_cost_lands(tmp_path: Path) -> None:
    """``--trace``: each step against the ``none`` pace beside its turn (here 1 s a step: 5
    steps of 1,000 examples at 1,000 examples/s), by kind. A round that slows the step it is
    in flight by 20% and the next by 10%, and a quiet step after it by 5%: the arm loses 7%
    of its step rate, 6 points on busy steps and 1 on quiet ones, which the pacer, setting
    busy steps against the quiet steps beside them, would not see."""
    busy = [False, True, True, False, False, True, True, True, False, False, False, True]
    assert rows.step_kinds(busy) == ["before any", "busy 1", "busy 2", "quiet 1", "quiet 2",
                                 "busy 1", "busy 2", "busy 3+", "quiet 1", "quiet 2",
                                 "quiet 3+", "busy 1"]
    steps = [1.0, 1.2, 1.1, 1.0, 1.05]
    turn = {"arm": "S 5%", "seed": 0, "repeat": 0, "interleave": 5, "examples_per_s": 5000 / 5.35,
            "train_seconds": 5.35, "baseline_examples_per_s": 1000.0, "step_seconds": steps,
            "step_busy": [False, True, True, False, False]}
    got = rows.footprint([turn, {**turn, "repeat": 1}, run("none", 0, 1000)])  # untraced: left out
    assert set(got) == {"S 5%"}
    s = got["S 5%"]
    assert s["all"] == pytest.approx((0.07, 10, 0.07))
    assert s["busy 1"] == pytest.approx((0.2, 2, 0.04))
    assert s["busy 2"] == pytest.approx((0.1, 2, 0.02))
    assert s["quiet 1"] == pytest.approx((0.0, 2, 0.0), abs=1e-12)
    assert s["quiet 2"] == pytest.approx((0.05, 2, 0.01))
    assert s["before any"] == pytest.approx((0.0, 2, 0.0), abs=1e-12)
    table = to.footprint_table([turn])
    assert ("| S 5% | +7.0% | +6.0% | +1.0% | +20.0% (1) | +10.0% (1) | - | +0.0% (1) | "
            "+5.0% (1) | - | +0.0% (1) |") in table
    assert to.footprint_table(ROWS) == ""  # nothing traced: no table
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "h2_1gbit.json").write_text(json.dumps([
        {**run("none", 0, 1000), "baseline_examples_per_s": 1000.0, "interleave": 5},
        turn]))
    assert "Where the cost lands (`--trace`)" in to.report(tmp_path, ["1gbit"])


def test_no_cost_names_the_most_frequent_sync_that_keeps_98_percent(tmp_path: Path) -> None:
    """The paper's claim as a floor: per wire dtype, the smallest mean gap each kind reaches at
    >= 0.98 of ``none``, on the arm's worst repeat and on its median."""
    rows = [
        *[run("none", r, 1000) for r in range(3)],
        *[run("FR k=5", r, e, gap=5) for r, e in enumerate([900, 910, 920])],
        *[run("FR k=20", r, e, gap=20) for r, e in enumerate([975, 985, 990])],
        *[run("S b2b", r, e, gap=1.5) for r, e in enumerate([970, 985, 990])],
        *[run("S 5%", r, e, gap=6) for r, e in enumerate([981, 990, 995])],
        *[run("S b2b bf16", r, e, gap=1.2) for r, e in enumerate([990, 995, 999])],
    ]
    by_wire = {r["wire"]: r for r in to.no_cost(to.summarize(rows, world_size=2))}
    f32, bf16 = by_wire["float32"], by_wire["bf16"]
    assert f32["S_min"]["arm"] == "S 5%" and f32["S_median"]["arm"] == "S b2b"
    assert f32["FR_min"] is None and f32["FR_median"]["arm"] == "FR k=20"
    assert bf16["S_min"]["arm"] == "S b2b bf16" and bf16["FR_median"] is None
    table = to.no_cost_table(list(by_wire.values()))
    assert ("| float32 | S 5% (gap 6.0) | S b2b (gap 1.5) | **none** | FR k=20 (gap 20.0) |"
            in table)
    # the report says what a job's device wait was, and where there was none, nothing
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "h2_10gbit.json").write_text(
        json.dumps([{**r, "device_step_ms": 50.0} for r in rows]))
    (tmp_path / "raw" / "h2_1gbit.json").write_text(json.dumps(rows))
    emulated, plain = to.report(tmp_path, ["10gbit", "1gbit"]).split("### 2 hosts, links ")[1:]
    assert "(`--device-step-ms 50`): after every step each rank's training thread waited " \
        "50 ms" in emulated
    assert "device-step-ms" not in plain and "S b2b (gap 1.5)" in plain


def test_a_straggler_job_reports_each_hosts_pace_against_its_own_none(tmp_path: Path) -> None:
    """With one device wait a host, the report names both waits and gives each host's
    examples/s and its ratio to its own ``none`` turns: host 1 (the straggler) sets the job's
    turn, host 0 keeps 0.9 and 0.8 of its own pace in the shadow turns."""
    def turn(arm: str, repeat: int, host_s: list[float], near: list[float]) -> dict[str, Any]:
        return {**run(arm, repeat, 4000 / max(host_s)), "train_seconds": max(host_s),
                "host_seconds": host_s, "host_baseline_seconds": near,
                "baseline_examples_per_s": 4000 / max(near), "interleave": 10,
                "device_step_ms": 100.0, "device_step_ms_by_host": [100.0, 150.0]}

    rows = [turn("none", 0, [2.0, 3.0], [2.0, 3.0]), turn("S", 0, [2.0 / 0.9, 3.0], [2.0, 3.0]),
            turn("none", 1, [2.0, 3.0], [2.0, 3.0]), turn("S", 1, [2.5, 3.0], [2.0, 3.0])]
    one_host = {**rows[0], "host_seconds": [3.0], "host_baseline_seconds": [3.0]}
    assert to.host_table([one_host]) == ""
    table = to.host_table(rows)
    # host 0: 2000 examples a turn (4000 over 2 hosts) in 2.0 s; S in 2.22 s and 2.5 s
    assert "| none | 1,000 | 1.000 [1.000, 1.000] | 667 | 1.000 [1.000, 1.000] |" in table
    assert "| S | 850 | 0.850 [0.800, 0.900] | 667 | 1.000 [1.000, 1.000] |" in table
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "h2_1gbit-straggler.json").write_text(json.dumps(rows))
    text = to.report(tmp_path, ["1gbit-straggler"])
    assert "(`--device-step-ms 100 150`): after every step each rank's training thread " \
        "waited 100/150 ms (host 0, host 1, ...: a straggler)" in text
    assert "Each host's own pace" in text
