"""Fitting the testbed model's constants on some jobs and checking its predictions on the
others (:func:`fit_testbed`, :func:`testbed_rows`)."""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shadowsync.benchmarks.scaling_model.overrides import arm_overrides
from shadowsync.benchmarks.scaling_model.testbed import (
    QUEUED_MAX,
    TESTBED_FAMILIES,
    TESTBED_SCHEDULES,
    TestbedArm,
    TestbedConstants,
    TestbedJob,
    TestbedLinks,
    TestbedMeasured,
    background_s,
    calibrate_links,
    chunks,
    fr_rounds,
    link_rate_name,
    measure_testbed,
    median,
    parse_testbed_arm,
    predict_testbed,
    testbed_job,
)


def load_testbed(directory: Path) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """Every ``raw/h<N>_<link>[-<tag>].json`` under a frontier output directory (or the raw
    one), keyed by (N, ``<link>[-<tag>]``)."""
    raw = directory / "raw" if (directory / "raw").is_dir() else directory
    jobs = {}
    for path in sorted(raw.glob("h*_*.json")):
        hosts, link = path.stem.split("_", 1)
        jobs[int(hosts[1:]), link] = json.loads(path.read_text())
    return jobs


def load_arm_overrides(directory: Path) -> dict[tuple[int, str], dict[str, str]]:
    """Per job, its arms' overrides as ``frontier.py`` records them beside the runs
    (``<job>.cmd``: the command, then one ``  arm <name>: <overrides>`` line per arm); jobs
    recorded before those lines existed are left out."""
    raw = directory / "raw" if (directory / "raw").is_dir() else directory
    out = {}
    for path in sorted(raw.glob("h*_*.cmd")):
        hosts, link = path.stem.split("_", 1)
        if arms := arm_overrides(path.read_text().splitlines()):
            out[int(hosts[1:]), link] = arms
    return out


def _weighted_ls(a: Sequence[float], b: Sequence[float]) -> float:
    """The x >= 0 minimizing sum (a_i + b_i x)^2 (0 with no points)."""
    den = sum(v * v for v in b)
    return max(0.0, -sum(u * v for u, v in zip(a, b, strict=True)) / den) if den else 0.0


def _nonneg_ls2(a: Sequence[float], b: Sequence[float], c: Sequence[float]
                ) -> tuple[float, float]:
    """The (x, y) >= 0 minimizing sum (a_i + b_i x + c_i y)^2: the unconstrained solution if it
    is non-negative and well-posed, else the better of the two one-variable fits."""
    def loss(x: float, y: float) -> float:
        return sum((u + v * x + w * y) ** 2 for u, v, w in zip(a, b, c, strict=True))

    def dot(u: Sequence[float], v: Sequence[float]) -> float:
        return sum(x * y for x, y in zip(u, v, strict=True))

    bb, cc, bc, ab, ac = dot(b, b), dot(c, c), dot(b, c), dot(a, b), dot(a, c)
    det = bb * cc - bc * bc
    if det > 1e-12 * max(bb * cc, 1e-300):
        x, y = (-ab * cc + ac * bc) / det, (-ac * bb + ab * bc) / det
        if x >= 0 and y >= 0:
            return x, y
    return min(((_weighted_ls(a, b), 0.0), (0.0, _weighted_ls(a, c))), key=lambda xy: loss(*xy))


def _golden(loss: Callable[[float], float], lo: float, hi: float, iterations: int = 40
            ) -> float:
    """The minimum of a unimodal ``loss`` on [lo, hi] by golden-section search."""
    for _ in range(iterations):
        m1, m2 = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        lo, hi = (lo, m2) if loss(m1) <= loss(m2) else (m1, hi)
    return (lo + hi) / 2


Fitted = list[tuple[TestbedArm, TestbedJob, TestbedMeasured]]


def fit_testbed(points: Fitted) -> TestbedConstants:
    """The constants from measured points (pass the 2-host ones only).

    rho from the FR arms, delta from ddp, lam and phi from the shadow arms' measured allreduce
    times: least squares on relative errors, the quantities being linear in them (lam and phi
    are told apart only where the arms' chunk counts differ; else phi is 0); lam_n likewise
    from the arms whose thread is niced, with that phi (lam from the others), and mu_n from
    those arms' back-to-back gaps (the round lasts (gap - 1/2) steps). Then
    kappa and q from the unniced shadow arms' ratios and gaps together, on a grid refined by
    coordinate search (neither is linear in them), and kappa_n from the niced ones' with
    those. The gaps weigh in because a paced arm's
    ratio is the pacer's target whatever a round costs; its gap is where the cost shows.
    """
    a_fr, b_fr, a_ddp, b_ddp, a_bg, b_bg, c_bg = [], [], [], [], [], [], []
    niced: Fitted = []
    for arm, job, m in points:
        measured_step = job.step_s / m.ratio
        size = job.round_bytes * arm.wire_factor
        if arm.kind == "fixed_rate":
            assert arm.period is not None
            q = fr_rounds(job.steps, arm.period) / job.steps
            a_fr.append((job.step_s + q * job.allreduce_of(size) - measured_step)
                        / measured_step)
            b_fr.append(q * job.compute_s / measured_step)
        elif arm.kind == "ddp":
            a_ddp.append((job.step_s + job.allreduce_s - measured_step) / measured_step)
            b_ddp.append(job.compute_s / measured_step)
        elif arm.kind == "shadow" and m.comm_per_round_s > 0 and arm.thread_nice:
            niced.append((arm, job, m))
        elif arm.kind == "shadow" and m.comm_per_round_s > 0:
            shared = background_s(job, arm, size, 0.0, 0.0)
            a_bg.append((shared - m.comm_per_round_s) / m.comm_per_round_s)
            b_bg.append(job.compute_s / m.comm_per_round_s)
            c_bg.append(chunks(arm, size) * job.compute_s / m.comm_per_round_s)
    rho, delta = _weighted_ls(a_fr, b_fr), _weighted_ls(a_ddp, b_ddp)
    stretch, per_chunk = _nonneg_ls2(a_bg, b_bg, c_bg)
    a_n, b_n = [], []
    for arm, job, m in niced:  # with phi as the unniced arms give it
        shared = background_s(job, arm, job.round_bytes * arm.wire_factor, 0.0, per_chunk)
        a_n.append((shared - m.comm_per_round_s) / m.comm_per_round_s)
        b_n.append(job.compute_s / m.comm_per_round_s)
    stretch_niced = _weighted_ls(a_n, b_n)
    a_w, b_w = [], []
    for arm, job, m in niced:  # unpaced back-to-back rounds: R = (gap - 1/2) T
        if arm.max_slowdown is None and arm.max_staleness is None and m.gap > 1.5:
            background = background_s(job, arm, job.round_bytes * arm.wire_factor,
                                       stretch_niced, per_chunk)
            duration = (m.gap - 0.5) * job.step_s / m.ratio
            a_w.append((rho * job.compute_s + background / arm.max_comm_share - duration)
                       / duration)
            b_w.append(job.compute_s / duration)
    wait_niced = _weighted_ls(a_w, b_w)
    shadow = [(arm, job, m) for arm, job, m in points if arm.kind == "shadow"]

    def loss(kappa: float, queued: float, kappa_niced: float, niced_only: bool) -> float:
        k = TestbedConstants(rho, delta, kappa, stretch, queued, per_chunk, stretch_niced,
                             wait_niced, kappa_niced)
        total = 0.0
        for arm, job, m in shadow:
            if bool(arm.thread_nice) != niced_only:
                continue
            p = predict_testbed(arm, job, k)
            total += (p.ratio / m.ratio - 1) ** 2
            if m.gap > 0:
                total += math.log(p.gap / m.gap) ** 2
        return total

    kappa = queued = 0.0
    if any(not arm.thread_nice for arm, _, _ in shadow):
        grid = [(i / 10, j / 4) for i in range(11) for j in range(int(QUEUED_MAX * 4) + 1)]
        kappa, queued = min(grid, key=lambda kq: loss(kq[0], kq[1], 0.0, False))
        for _ in range(3):  # coordinate search around the best grid point
            kappa = _golden(functools.partial(loss, queued=queued, kappa_niced=0.0,
                                              niced_only=False),
                            max(0.0, kappa - 0.1), min(1.0, kappa + 0.1))
            queued = _golden(functools.partial(loss, kappa, kappa_niced=0.0, niced_only=False),
                             max(0.0, queued - 0.25), min(QUEUED_MAX, queued + 0.25))
    kappa_niced = 0.0
    if niced:  # then the niced arms' own share, with the link's constants as fitted above
        kappa_niced = min((i / 10 for i in range(11)), key=lambda x: loss(kappa, queued, x, True))
        kappa_niced = _golden(lambda x: loss(kappa, queued, x, True),
                              max(0.0, kappa_niced - 0.1), min(1.0, kappa_niced + 0.1))
    return TestbedConstants(rho, delta, kappa, stretch, queued, per_chunk, stretch_niced,
                            wait_niced, kappa_niced)


def _rel(predicted: float, measured: float) -> float:
    return predicted / measured - 1 if measured and not math.isnan(measured) else math.nan


IN_SAMPLE, LINK_HELD_OUT, OTHER_HOSTS = "in sample", "link held out", "other host count"

TESTBED_ROLES = (IN_SAMPLE, LINK_HELD_OUT, OTHER_HOSTS)


def known_arm(name: str, overrides: Mapping[str, str] | None, chunk_bytes: float | None
         ) -> TestbedArm | None:
    """The arm of a job's run name, from its recorded overrides when there are some (else
    ``chunk_bytes`` for shadow arms); None for one the model does not know."""
    try:
        return parse_testbed_arm(name, None if overrides is None else overrides.get(name, ""),
                                 chunk_bytes)
    except ValueError:
        return None


JobChunks = Mapping[tuple[int, str], float]  # per job: shadow chunk bytes where not recorded


def _points(measured: Mapping[tuple[int, str], Mapping[str, TestbedMeasured]],
            links: TestbedLinks, overrides: Mapping[tuple[int, str], Mapping[str, str]],
            chunk_bytes: JobChunks) -> Fitted:
    """(arm, job, measurement) for every known arm but ``none`` of the given jobs."""
    points = []
    for (hosts, link), arms in sorted(measured.items()):
        job = testbed_job(hosts, link, arms, links)
        for name, m in arms.items():
            arm = known_arm(name, overrides.get((hosts, link)), chunk_bytes.get((hosts, link)))
            if arm is not None and arm.kind != "none":
                points.append((arm, job, m))
    return points


def testbed_rows(jobs: Mapping[tuple[int, str], Sequence[Mapping[str, Any]]], fit_hosts: int,
                 links: TestbedLinks,
                 overrides: Mapping[tuple[int, str], Mapping[str, str]] | None = None,
                 chunk_bytes: JobChunks | None = None
                 ) -> tuple[TestbedLinks, TestbedConstants, list[dict[str, Any]]]:
    """The links and constants fitted on every ``fit_hosts`` job, and one row per (job, arm but
    ``none``, role), each role an honest use of a fit:

    * in sample: fitted on every ``fit_hosts`` job, checked on those same jobs;
    * link held out: each ``fit_hosts`` job predicted from links and constants fitted on the
      jobs of the other links (``1gbit-qos`` and ``1gbit`` are one link), where there are some;
    * other host count: every other job, predicted from the fit on all ``fit_hosts`` jobs:
      the extrapolation the model is for.
    """
    recorded, chunk_bytes = overrides or {}, chunk_bytes or {}
    measured = {(hosts, link): measure_testbed(rows, hosts)
                for (hosts, link), rows in sorted(jobs.items())}
    fit_keys = [key for key in measured if key[0] == fit_hosts]
    if not fit_keys:
        raise ValueError(f"no {fit_hosts}-host job to fit the constants on")

    @functools.cache
    def fit(keys: tuple[tuple[int, str], ...]) -> tuple[TestbedLinks, TestbedConstants]:
        subset = {key: measured[key] for key in keys}
        calibrated = calibrate_links(subset, links)
        return calibrated, fit_testbed(_points(subset, calibrated, recorded, chunk_bytes))

    full = fit(tuple(fit_keys))
    out = []
    for key in measured:
        if key[0] != fit_hosts:
            roles = [(OTHER_HOSTS, full)]
        else:
            roles = [(IN_SAMPLE, full)]
            others = tuple(k for k in fit_keys
                           if link_rate_name(k[1]) != link_rate_name(key[1]))
            if others:
                roles.append((LINK_HELD_OUT, fit(others)))
        for role, (calibrated, k) in roles:
            out += [_testbed_row(arm, job, m, role, k)
                    for arm, job, m in _points({key: measured[key]}, calibrated, recorded,
                                               chunk_bytes)]
    return full[0], full[1], out


def _testbed_row(arm: TestbedArm, job: TestbedJob, m: TestbedMeasured, role: str,
                 k: TestbedConstants) -> dict[str, Any]:
    """Predicted vs measured for one arm of one job under one role's constants."""
    p = predict_testbed(arm, job, k)
    at_gap = p.ratio_at_gap(job, m.gap) if arm.kind == "shadow" else math.nan
    return {
        "hosts": job.hosts, "link": job.link, "arm": arm.name, "family": arm.family,
        "role": role, "schedule": "turns" if job.interleaved else "runs",
        "ratio_measured": m.ratio, "ratio_min": m.ratio_min, "ratio_max": m.ratio_max,
        "ratio_predicted": p.ratio, "ratio_error": _rel(p.ratio, m.ratio),
        "gap_measured": m.gap, "gap_predicted": p.gap, "gap_error": _rel(p.gap, m.gap),
        "ratio_at_measured_gap": at_gap, "at_gap_error": _rel(at_gap, m.ratio),
        "allreduce_measured_s": m.comm_per_round_s, "allreduce_predicted_s": p.allreduce_s,
        "runs": m.runs,
        # rounding aside: one repeat makes min = max = the measurement
        "in_spread": m.ratio_min * (1 - 1e-9) <= p.ratio <= m.ratio_max * (1 + 1e-9),
    }


def testbed_summary(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Median and max |relative error| of ratio, gap and (shadow) the ratio at the measured
    gap, per role, arm family and schedule (separate runs, or turns on one model, whose
    ratios are measured seconds apart); and how many predicted ratios fall in the measured
    spread."""
    out = []
    for role, family, schedule in itertools.product(TESTBED_ROLES, TESTBED_FAMILIES,
                                                    TESTBED_SCHEDULES):
        mine = [r for r in rows if r["role"] == role and r["family"] == family
                and r.get("schedule", "runs") == schedule]
        if not mine:
            continue
        entry: dict[str, Any] = {"role": role, "family": family, "schedule": schedule,
                                 "points": len(mine),
                                 "in_spread": sum(bool(r["in_spread"]) for r in mine)}
        for what in ("ratio", "gap", "at_gap"):
            errors = [abs(r[f"{what}_error"]) for r in mine
                      if not math.isnan(r[f"{what}_error"])]
            entry[f"{what}_median"] = median(errors) if errors else math.nan
            entry[f"{what}_max"] = max(errors) if errors else math.nan
        out.append(entry)
    return out
