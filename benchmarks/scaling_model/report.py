"""The scaling model's reports (``scaling.md``, ``testbed_fit.md``, their plots) and its command
line (``python -m shadowsync.benchmarks.scaling_model``)."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shadowsync.benchmarks import scaling_model
from shadowsync.benchmarks.report import command_line, markdown_table, or_dash
from shadowsync.benchmarks.scaling_model.fit import (
    IN_SAMPLE,
    LINK_HELD_OUT,
    OTHER_HOSTS,
    JobChunks,
    known_arm,
    load_arm_overrides,
    load_testbed,
    testbed_rows,
    testbed_summary,
)
from shadowsync.benchmarks.scaling_model.model import (
    DEFAULT_PERIOD,
    MODEL_BANNER,
    RESULTS,
    STRATEGIES,
    TRAINERS,
    Arm,
    Constants,
    Network,
    Point,
    allreduce_s,
    arms,
    constants,
    loopback,
    measured,
    predict,
    with_dense_bytes,
    with_step,
)
from shadowsync.benchmarks.scaling_model.testbed import (
    TESTBED_DOC,
    TESTBED_LINK_EFFICIENCY,
    TESTBED_PROBE_HOSTS,
    TESTBED_UNLIMITED_MBPS,
    TestbedLinks,
    link_rate_Bps,
    measure_testbed,
    median,
)


# ---------------------------------------------------------------------- report
def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:,.2f}M" if x >= 1e6 else f"{x / 1e3:,.1f}k"


def _fmt_gap(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:g}"


def scaling_table(k: Constants, net: Network, period: int) -> str:
    """examples/s (ratio to none) per arm and N, then the shadow arms' sync gap."""
    arm_list = arms(period)
    rates = []
    for n in TRAINERS:
        none = predict(Arm("none"), n, k, net).examples_per_s
        cells = []
        for arm in arm_list:
            rate = predict(arm, n, k, net).examples_per_s
            cells.append(_fmt_rate(rate) if arm.kind == "none"
                         else f"{_fmt_rate(rate)} ({rate / none:.2f})")
        rates.append([n, *cells])
    shadow = [a for a in arm_list if a.kind == "shadow"]
    gaps = []
    for n in TRAINERS:
        round_ms = (k.round_local_s["ma"] + allreduce_s(k.dense_bytes, n, net)) * 1e3
        step_ms = predict(shadow[0], n, k, net).step_s * 1e3
        gaps.append([n, *(_fmt_gap(predict(a, n, k, net).sync_gap) for a in shadow),
                     f"{round_ms:.3f}", f"{step_ms:.2f}"])
    return "\n".join([
        f"Examples/s (ratio to none), {net.describe()}:", "",
        markdown_table(["N", *(a.name for a in arm_list)], rates, "r" * (1 + len(arm_list))),
        "", f"Sync gap (steps between applied syncs), {net.describe()}; fixed-rate arms: "
        f"k = {period} at every N:", "",
        markdown_table(["N", *(a.name for a in shadow), "ma round, ms", "shadow ma step, ms"],
                       gaps, "r" * (len(shadow) + 3))])


def check_rows(preset: Mapping[str, Any], net: Network) -> list[dict[str, Any]]:
    """Predicted vs measured at every measured world size (1 and 2), per arm."""
    k = constants(preset)
    fitted = {"none", "ddp", *(Arm("shadow", s).name for s in STRATEGIES)}
    rows = []
    for n, by_arm in sorted(measured(preset).items()):
        none_predicted = predict(Arm("none"), n, k, net).examples_per_s
        for arm in arms():
            if arm.name not in by_arm:
                continue
            p, m = predict(arm, n, k, net), by_arm[arm.name]
            rows.append({
                "ratio_measured": m.examples_per_s / by_arm["none"].examples_per_s,
                "ratio_predicted": p.examples_per_s / none_predicted,
                "n": n, "arm": arm.name,
                "role": "fit (defines a constant)" if n == 1 and arm.name in fitted
                        else "prediction",
                "measured": m.examples_per_s, "predicted": p.examples_per_s,
                "error": p.examples_per_s / m.examples_per_s - 1,
                "gap_measured": m.sync_gap, "gap_predicted": p.sync_gap,
            })
    return rows


def check_table(rows: Sequence[Mapping[str, Any]]) -> str:
    return markdown_table(
        ["N", "arm", "role", "measured ex/s", "predicted ex/s", "error",
         "measured ratio to none", "predicted ratio", "measured gap", "predicted gap"],
        [[r["n"], r["arm"], r["role"], f"{r['measured']:,.0f}", f"{r['predicted']:,.0f}",
          f"{r['error']:+.0%}", f"{r['ratio_measured']:.3f}", f"{r['ratio_predicted']:.3f}",
          or_dash(r["gap_measured"], ".2f"), _fmt_gap(r["gap_predicted"])] for r in rows],
        "rllrrrrrrr")


def constants_table(k: Constants) -> str:
    rows = [
        ("t1, one rank's step alone", f"{k.step_s * 1e3:.3f} ms"),
        ("S, dense bytes per replica", f"{k.dense_bytes:,.0f}"),
        ("V, sparse all-to-all bytes per trainer, each way", f"{k.a2a_bytes:,.0f}"),
        ("d, DDP's cost at N = 1", f"{k.ddp_overhead_s * 1e3:.3f} ms"),
        *((f"r, local work of one {s} round", f"{k.round_local_s[s] * 1e3:.3f} ms")
          for s in STRATEGIES),
        *((f"c, contention of shadow {s}", f"{k.contention[s]:.3f}") for s in STRATEGIES),
    ]
    return markdown_table(["constant", "value"], rows, "lr")


def plot(path: Path, k: Constants, nets: Sequence[Network], period: int,
         points: Mapping[int, Mapping[str, Point]], title: str) -> None:
    """Throughput and sync gap against N, log-log; measured points as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rate, ax_gap) = plt.subplots(1, 2, figsize=(13, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for j, net in enumerate(nets):
        style = styles[j % len(styles)]
        for i, arm in enumerate(arms(period)):
            rate = [predict(arm, n, k, net).examples_per_s for n in TRAINERS]
            label = f"{arm.name}, {net.bandwidth_Bps * 8 / 1e9:g} Gbit/s"
            ax_rate.plot(TRAINERS, rate, style, color=colors[i % len(colors)], label=label)
            if arm.kind != "none" and arm.kind != "ddp":
                gap = [predict(arm, n, k, net).sync_gap for n in TRAINERS]
                ax_gap.plot(TRAINERS, gap, style, color=colors[i % len(colors)], label=label)
    for i, arm in enumerate(arms(period)):
        ns = [n for n in sorted(points) if arm.name in points[n]]
        ax_rate.plot(ns, [points[n][arm.name].examples_per_s for n in ns], "o",
                     color=colors[i % len(colors)])
        if arm.kind not in ("none", "ddp"):
            ax_gap.plot(ns, [points[n][arm.name].sync_gap for n in ns], "o",
                        color=colors[i % len(colors)])
    ax_rate.set(xscale="log", yscale="log", xlabel="trainers N", ylabel="examples/s",
                title="throughput (model; dots: measured)")
    ax_gap.set(xscale="log", yscale="log", xlabel="trainers N",
               ylabel="steps between applied syncs", title="sync gap (model; dots: measured)")
    for ax in (ax_rate, ax_gap):
        ax.grid(True, which="both", alpha=0.3)
    ax_rate.legend(fontsize=6, ncol=2)
    fig.suptitle(f"MODEL, not measurement: {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(calibration: Mapping[str, Any], preset_name: str, k: Constants,
           nets: Sequence[Network], period: int, changed: str) -> str:
    """The whole Markdown report; ``changed`` says which constants the command line replaced."""
    fit = calibration["allreduce_fit"]
    parts = [
        f"# Scaling model: {preset_name}, 1 to {TRAINERS[-1]:,} trainers", "", MODEL_BANNER, "",
        f"Generated {datetime.date.today().isoformat()} by "
        f"`{command_line('shadowsync.benchmarks.scaling_model')}`.", "",
        "Equations: see the docstring of `benchmarks/scaling_model.py`. Calibration: "
        f"{calibration['date']}, {calibration['machine']['description']}; code "
        f"{calibration['code']['commit'] or calibration['code']['path']}; command "
        f"`{calibration['command']}`.", "",
        constants_table(k), "",
        f"Loopback gloo allreduce on 2 ranks, fitted to alpha + S/beta: alpha = "
        f"{fit['latency_s'] * 1e6:.1f} us per ring step, beta = "
        f"{fit['bandwidth_Bps'] * 8 / 1e9:.2f} Gbit/s (used only for the check below). "
        + changed, "",
    ]
    for net in nets:
        parts += [f"## {net.describe()}", "", scaling_table(k, net, period), ""]
    parts += ["## Check: predicted vs measured at N = 1 and 2 (loopback network)", "",
              "Measured: medians over repeats of `bench_sync.py` on this machine (2 shared CPU "
              "cores; the spread between repeats is in the calibration file). N = 1 points "
              "marked *fit* define t1, d and c, so their error is 0 by construction unless d "
              "or c was clipped at 0 (the arm measured faster than `none`: noise).", ""]
    for name, p in calibration["presets"].items():
        parts += [f"### {name}", "", check_table(check_rows(p, loopback(calibration))), "",
                  colocation_note(p, loopback(calibration)), ""]
    parts += ["## Check on rate-limited links", "",
              "The loopback check above cannot show what a network costs. The emulated "
              "cluster can: `python -m shadowsync.benchmarks.scaling_model --testbed "
              "benchmarks/results/frontier` predicts every arm of the frontier benchmark "
              "(`benchmarks/frontier.py`) from its `none` arm and the link rate, with constants "
              "fitted on 2 hosts, and states the error per arm family, out of sample "
              "(`testbed_fit.md`).", ""]
    return "\n".join(parts)


def colocation_note(preset: Mapping[str, Any], net: Network) -> str:
    """Why the absolute N = 2 error is large here: the 2 ranks share one machine's cores."""
    points, k = measured(preset), constants(preset)
    batch = k.batch_size
    alone = batch / points[1]["none"].examples_per_s
    shared = 2 * batch / points[2]["none"].examples_per_s
    model = predict(Arm("none"), 2, k, net).step_s
    return (f"Per-rank step of `none`: {alone * 1e3:.2f} ms alone, {shared * 1e3:.2f} ms with "
            f"2 ranks; the model's 2-rank step is {model * 1e3:.2f} ms (loopback all-to-all "
            f"included). The model assumes one host per trainer, while here both ranks (and "
            f"other jobs) share 2 cores, a slowdown it has no term for: read the ratio columns "
            f"at N = 2, which cancel it.")


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:+.1%}"


def _abs_pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.1%}"


def _num(x: float, digits: int = 3) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def _none_spread(rows: Sequence[Mapping[str, Any]]) -> float:
    """(max - min) / median of ``none``'s examples/s over repeats: the job's noise floor."""
    rates = [float(r["examples_per_s"]) for r in rows if r["arm"] == "none"]
    return (max(rates) - min(rates)) / median(rates)


def _headline_role(hosts: int, fit_hosts: int, roles: set[str]) -> str:
    """The role a job's table shows: the most out-of-sample prediction it has."""
    if hosts != fit_hosts:
        return OTHER_HOSTS
    return LINK_HELD_OUT if LINK_HELD_OUT in roles else IN_SAMPLE


def testbed_report(jobs: Mapping[tuple[int, str], Sequence[Mapping[str, Any]]],
                   directory: Path, fit_hosts: int, links: TestbedLinks, command: str,
                   overrides: Mapping[tuple[int, str], Mapping[str, str]] | None = None,
                   chunk_bytes: JobChunks | None = None) -> str:
    """``testbed_fit.md``: inputs, fitted constants, the error summary per role and family, then
    predicted vs measured per job (its most out-of-sample prediction)."""
    calibrated, k, rows = testbed_rows(jobs, fit_hosts, links, overrides, chunk_bytes)
    recorded, chunk_bytes = overrides or {}, chunk_bytes or {}
    unknown = sorted({r["arm"] for key, runs in jobs.items() for r in runs
                      if known_arm(r["arm"], recorded.get(key), chunk_bytes.get(key)) is None})
    guessed = [f"h{h}_{link}" + (f" (shadow in {chunk_bytes[h, link] / 2**20:g} MiB chunks)"
                                 if (h, link) in chunk_bytes else " (shadow unchunked)")
               for h, link in sorted(jobs) if (h, link) not in recorded]
    batches = sorted({measure_testbed(r, h)["none"].batch_size for (h, _), r in jobs.items()})
    files = ", ".join(f"`h{h}_{link}.json` ({len(r)} runs)"
                      for (h, link), r in sorted(jobs.items()))
    parts = [
        "# Scaling model against the emulated cluster (frontier testbed)", "",
        f"Generated {datetime.date.today().isoformat()} by `{command}` from `{directory}/raw`: "
        f"{files}.", "",
        "Measured inputs per job: `none`'s examples/s (T0), its bytes on the link (the "
        "all-to-alls), the bytes of one round (S), the batch per rank "
        f"({', '.join(map(str, batches))}). Given: each link's tbf rate, the tbf queue's "
        f"latency limit {links.tbf_latency_s:g} s (cluster.py). Fitted on the {fit_hosts}-host "
        "jobs: the links' two numbers and the constants below. Predicted: every other "
        "arm's ratio to `none` and its sync gap, and the allreduce times. The pacer's own "
        "telemetry (round cost, busy share) is not an input.", "",
        "Roles: *in sample*: constants fitted on every "
        f"{fit_hosts}-host job, checked on them. *link held out*: each {fit_hosts}-host job "
        "predicted from constants fitted on the other links' jobs (every job of its link "
        "rate, whatever its tag, left out). *other host count*: jobs "
        f"with another number of hosts, predicted from all {fit_hosts}-host jobs (the "
        "extrapolation the model is for).", "",
        "Arms as each job's `.cmd` records their overrides"
        + (f"; from their names for the jobs recorded before arms were listed: "
           f"{', '.join(guessed)} (--chunk-mb)" if guessed else "")
        + "." + (f" Not modelled, left out: {', '.join(unknown)}." if unknown else ""), "",
        "```", TESTBED_DOC.rstrip(), "```", "",
        f"Constants fitted on every {fit_hosts}-host job (the held-out predictions refit "
        "without their link):", "",
        markdown_table(["constant", "value", "fitted on"], [
            ["eta, share of a tbf rate gloo gets", f"{calibrated.efficiency:.3f}",
             "FR arms' allreduce times on token-bucket-limited links "
             f"(probe: {links.efficiency:g})"],
            [f"B_cpu, what the cores move per host at {links.probe_hosts} hosts",
             f"{calibrated.unlimited_Bps / 1e6:.0f} MB/s", "FR arms' allreduce times on "
             f"CPU-limited links (probe: {links.unlimited_Bps / 1e6:g} MB/s)"],
            ["rho, one round's CPU work, compute steps", f"{k.rho:.3f}", "FR arms' ratios"],
            ["delta, DDP's own cost, compute steps", f"{k.delta:.3f}", "ddp's ratio"],
            ["lam, background allreduce's wait for the cores, compute steps",
             f"{k.stretch:.3f}", "shadow arms' allreduce times"],
            ["phi, the same per collective of a chunked round, compute steps",
             f"{k.per_chunk:.4f}", "shadow arms' allreduce times"],
            ["lam_n, the same for a niced thread (sync.transport.thread_nice > 0), compute "
             "steps", f"{k.stretch_niced:.3f}", "niced shadow arms' allreduce times"],
            ["mu_n, a niced round's other wait for the cores, compute steps",
             f"{k.wait_niced:.3f}", "niced back-to-back arms' gaps"],
            ["kappa, share of a round's CPU work training pays", f"{k.kappa:.3f}",
             "shadow arms' ratios and gaps"],
            ["q, exchanges a step that queue behind a round", f"{k.queued:.3f}",
             "shadow arms' ratios and gaps"],
            ["kappa_n, the same as kappa for a niced thread", f"{k.kappa_niced:.3f}",
             "niced shadow arms' ratios and gaps"]], "lrl"), "",
        "## Summary: |relative error| per role, arm family and schedule", "",
        "*in spread*: predicted ratios inside the measured [min, max] over repeats. *at gap*: "
        "the shadow ratio the cost model gives at the measured gap. *runs*: jobs whose arms "
        "ran one after another; *turns*: jobs run with `--interleave`, every arm in turns on "
        "one model, each turn's ratio to the `none` turn of its cycle (a repeat is a cycle), "
        "or with `--bracket` to the `none` turns beside it.",
        "",
        markdown_table(
            ["role", "family", "schedule", "points", "ratio: median", "ratio: max",
             "in spread", "gap: median", "gap: max", "at gap: median", "at gap: max"],
            [[s["role"], s["family"], s["schedule"], s["points"],
              *(_abs_pct(s[key]) for key in ("ratio_median", "ratio_max")),
              f"{s['in_spread']}/{s['points']}",
              *(_abs_pct(s[key]) for key in ("gap_median", "gap_max", "at_gap_median",
                                             "at_gap_max"))]
             for s in testbed_summary(rows)], "lllrrrrrrrr"),
    ]
    parts += ["", "FR gaps follow from k and the step count, so their error is ~0 by "
              "construction; the shadow gaps are the model's."]
    if all(h == fit_hosts for h, _ in jobs):
        parts += ["", f"**No job with another host count yet**: every error above is within "
                  f"{fit_hosts} hosts; the extrapolation across host counts is unchecked."]
    parts += [""]
    for (hosts, link) in sorted({(r["hosts"], r["link"]) for r in rows},
                                key=lambda hl: (hl[0], -(link_rate_Bps(hl[1]) or math.inf), hl[1])):
        mine = [r for r in rows if (r["hosts"], r["link"]) == (hosts, link)]
        role = _headline_role(hosts, fit_hosts, {r["role"] for r in mine})
        parts += [
            f"## {hosts} hosts, {link}: {role}", "",
            f"`none`'s examples/s over repeats spread by "
            f"{_none_spread(jobs[hosts, link]):.0%} of its median.", "",
            markdown_table(
                ["arm", "ratio measured [min, max]", "predicted", "error", "gap measured",
                 "predicted", "error", "ratio at measured gap",
                 "allreduce s measured / predicted"],
                [[r["arm"],
                  f"{r['ratio_measured']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]",
                  f"{r['ratio_predicted']:.3f}", _pct(r["ratio_error"]),
                  _num(r["gap_measured"], 2), _num(r["gap_predicted"], 2), _pct(r["gap_error"]),
                  _num(r["ratio_at_measured_gap"]),
                  f"{_num(r['allreduce_measured_s'])} / {_num(r['allreduce_predicted_s'])}"]
                 for r in mine if r["role"] == role], "lrrrrrrrr"), ""]
    return "\n".join(parts)


def testbed_main(args: argparse.Namespace) -> int:
    """``--testbed``: write ``testbed_fit.md`` into ``--out``."""
    jobs = load_testbed(args.testbed)
    if not jobs:
        print(f"error: no raw/h<N>_<link>.json under {args.testbed}", file=sys.stderr)
        return 2
    links = TestbedLinks(args.link_efficiency, args.unlimited_MBps * 1e6)
    chunk = {}
    for spec in args.chunk_mb or []:
        name, _, mib = spec.rpartition("=")
        keys = [key for key in jobs if not name or f"h{key[0]}_{key[1]}" == name]
        if not keys:
            print(f"error: --chunk-mb {spec}: no job {name}", file=sys.stderr)
            return 2
        chunk.update({key: float(mib) * 2**20 for key in keys if name or key not in chunk})
    text = testbed_report(jobs, args.testbed, args.fit_hosts, links,
                          command_line("shadowsync.benchmarks.scaling_model"),
                          load_arm_overrides(args.testbed),
                          chunk)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "testbed_fit.md").write_text(text + "\n")
    print(text)
    print(f"\nwrote {args.out / 'testbed_fit.md'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m shadowsync.benchmarks.scaling_model",
                                     description=(scaling_model.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calibration", type=Path, default=RESULTS / "calibration.json")
    parser.add_argument("--preset", default="movielens_1m",
                        help="which calibrated model the tables and plot are for")
    parser.add_argument("--bandwidth-gbps", type=float, nargs="+", default=[10.0, 100.0],
                        help="per-trainer network bandwidth(s), Gbit/s")
    parser.add_argument("--latency-us", type=float, default=20.0,
                        help="per-message latency alpha, microseconds")
    parser.add_argument("--allreduce", choices=["ring", "tree"], default="ring")
    parser.add_argument("--period", type=int, default=DEFAULT_PERIOD, help="fixed-rate k")
    parser.add_argument("--contention", type=float,
                        help="shadow contention c for every strategy (default: measured; "
                             "about 0 for GPU trainers with their own NIC)")
    parser.add_argument("--dense-mb", type=float,
                        help="what-if: a dense part of this many MiB instead of the measured one")
    parser.add_argument("--step-ms", type=float,
                        help="what-if: one trainer's step alone takes this long (a GPU "
                             "trainer's), instead of the measured t1")
    parser.add_argument("--out", type=Path, default=RESULTS)
    testbed = parser.add_argument_group(
        "testbed", "predict the frontier benchmark's arms on the emulated cluster instead "
        "(writes testbed_fit.md; see TESTBED_DOC in scaling_model/testbed.py)")
    testbed.add_argument("--testbed", type=Path, metavar="DIR",
                         help="frontier.py's --out directory (its raw/h<N>_<link>.json)")
    testbed.add_argument("--chunk-mb", nargs="+", metavar="[JOB=]MIB",
                         help="shadow arms' sync.transport.chunk_mb for jobs whose .cmd does "
                              "not list their arms' overrides: h2_200mbit=0.0625 for one job, "
                              "a bare number for the others")
    testbed.add_argument("--fit-hosts", type=int, default=2,
                         help="fit the constants on these jobs; the others are out of sample")
    testbed.add_argument("--link-efficiency", type=float, default=TESTBED_LINK_EFFICIENCY,
                         help="share of a tbf rate a gloo allreduce gets (cluster probe)")
    testbed.add_argument("--unlimited-MBps", type=float, default=TESTBED_UNLIMITED_MBPS,
                         help=f"gloo bandwidth of an unlimited link at {TESTBED_PROBE_HOSTS} "
                              "hosts, MB/s (cluster probe)")
    args = parser.parse_args()
    if args.testbed is not None:
        return testbed_main(args)
    calibration = json.loads(args.calibration.read_text())
    nets = [Network.of(g, args.latency_us, args.allreduce) for g in args.bandwidth_gbps]
    preset = calibration["presets"][args.preset]
    k = constants(preset, args.contention)
    changed = "" if args.contention is None else (
        f"Contention set to c = {args.contention:g} (--contention), not measured. ")
    if args.dense_mb is not None:
        k = with_dense_bytes(k, args.dense_mb * 2**20)
        changed += (f"What-if: dense part set to {args.dense_mb:g} MiB (--dense-mb), one round's "
                    "local work scaled with it. ")
    if args.step_ms is not None:
        k = with_step(k, args.step_ms / 1e3)
        changed += (f"What-if: a trainer's step alone set to {args.step_ms:g} ms (--step-ms); "
                    "examples/s then use the preset's batch, so read the ratios.")
    text = report(calibration, args.preset, k, nets, args.period, changed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.md").write_text(text + "\n")
    plot(args.out / "scaling.png", k, nets, args.period, measured(preset),
         f"{args.preset}, {args.latency_us:g} us, {args.allreduce} allreduce; "
         "line style = bandwidth")
    print(text)
    print(f"\nwrote {args.out / 'scaling.md'} and {args.out / 'scaling.png'} (a model)")
    return 0

