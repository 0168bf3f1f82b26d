"""A MODEL, not a measurement: throughput and sync gap of each arm for 1 to 1,000 trainers.

We have one machine; this is how we plan beyond it. Constants measured here by ``calibrate.py``
(one rank's step time, dense bytes, one round's local work, a loopback allreduce fit, the
measured 1- and 2-rank points) are extrapolated to N trainers on a stated network::

    python benchmarks/calibrate.py --out benchmarks/results/calibration.json   # measures
    python benchmarks/scaling_model.py --bandwidth-gbps 10 100 --latency-us 20  # predicts

writes ``scaling.md`` (tables, and predicted vs measured at N = 1 and 2) and ``scaling.png``.
Every number for N > 2 is a prediction. Equations (seconds, bytes; beta in bytes/s)::

    allreduce, ring    A(S, N) = 2 (N-1)/N * S/beta + 2 (N-1) alpha        (0 at N = 1)
    allreduce, tree    A(S, N) = 2 S/beta + 2 ceil(log2 N) alpha  (--allreduce tree: pipelined
                                 reduce then broadcast on a binary tree)
    all-to-all         X(V, N) = 2 [(N-1)/N * V/beta + (N-1) alpha]   (pairwise exchange, twice a
                                 step: pooled embeddings forward, their gradients backward;
                                 TorchRec's pipeline overlaps the input dist; V = batch * sparse
                                 features * dim * 4; the same for every arm)
    base step          T0 = t1 + X(V, N)           t1: one rank's step alone (measured)
    none               T = T0
    ddp                T = T0 + d + A(S, N)        no overlap of the gradient allreduce with
                                                   backward (worst case); d: DDP's own cost
                                                   at N = 1 (measured)
    fixed-rate, k      T = T0 + (r + A(S, N)) / k  blocking round every k steps; gap = k
    shadow             T = T0 (1 + c)              c: the background thread's contention for
                                                   the trainer's CPU (measured at N = 1; ~0 on
                                                   GPU trainers with their own NIC: --contention)
                       R = r + A(S, N)             one round: local work r (snapshot copy,
                                                   strategy math, apply; measured) + allreduce
                       gap = max(1, ceil(R / T))   a round starts at a step boundary with its
                                                   snapshot; its delta waits for the first
                                                   boundary after it ends, where the next
                                                   snapshot is taken
    examples/s = N * batch / T

Not modelled: stragglers, network contention between the two kinds of collectives, and
compute that changes with N (the per-rank batch is fixed).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

TRAINERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
STRATEGIES = ("ma", "easgd", "bmuf")
DEFAULT_PERIOD = 10
RESULTS = Path(__file__).resolve().parent / "results"
MODEL_BANNER = ("**This is a model, not a measurement**: constants measured on one machine "
                "(1 and 2 ranks) extrapolated with the equations below.")


@dataclasses.dataclass(frozen=True)
class Arm:
    """One synchronization arm, named as ``bench_sync.py`` names it."""

    kind: Literal["none", "ddp", "fixed_rate", "shadow"]
    strategy: str | None = None
    period: int = DEFAULT_PERIOD

    @property
    def name(self) -> str:
        if self.kind == "fixed_rate":
            return f"fixed-rate {self.strategy} k={self.period}"
        if self.kind == "shadow":
            return f"shadow {self.strategy}"
        return self.kind

    @property
    def overrides(self) -> str:
        """The config overrides that run this arm (``bench_sync.py --arm``)."""
        if self.kind in ("none", "ddp"):
            return f"sync.algorithm={self.kind}"
        mode = f"sync.mode={self.kind}"
        period = f" sync.period={self.period}" if self.kind == "fixed_rate" else ""
        return f"sync.algorithm={self.strategy} {mode}{period}"


def arms(period: int = DEFAULT_PERIOD) -> list[Arm]:
    """none, ddp, then fixed-rate and shadow for every strategy."""
    return [Arm("none"), Arm("ddp"),
            *(Arm("fixed_rate", s, period) for s in STRATEGIES),
            *(Arm("shadow", s) for s in STRATEGIES)]


@dataclasses.dataclass(frozen=True)
class Network:
    """Per-message latency ``alpha`` (s) and per-trainer bandwidth ``beta`` (bytes/s)."""

    latency_s: float
    bandwidth_Bps: float
    allreduce: Literal["ring", "tree"] = "ring"

    @classmethod
    def of(cls, gbps: float, latency_us: float,
           allreduce: Literal["ring", "tree"] = "ring") -> Network:
        return cls(latency_us * 1e-6, gbps * 1e9 / 8, allreduce)

    def describe(self) -> str:
        return (f"{self.bandwidth_Bps * 8 / 1e9:g} Gbit/s, {self.latency_s * 1e6:g} us latency, "
                f"{self.allreduce} allreduce")


def allreduce_s(nbytes: float, n: int, net: Network) -> float:
    """Time of one allreduce of ``nbytes`` over ``n`` trainers (see the module docstring)."""
    if n == 1:
        return 0.0
    if net.allreduce == "tree":
        return 2 * nbytes / net.bandwidth_Bps + 2 * math.ceil(math.log2(n)) * net.latency_s
    return 2 * (n - 1) / n * nbytes / net.bandwidth_Bps + 2 * (n - 1) * net.latency_s


def all_to_all_s(nbytes: float, n: int, net: Network) -> float:
    """Both sparse all-to-alls of one step, ``nbytes`` each per trainer (0 without sharding)."""
    if n == 1 or nbytes == 0:
        return 0.0
    return 2 * ((n - 1) / n * nbytes / net.bandwidth_Bps + (n - 1) * net.latency_s)


@dataclasses.dataclass(frozen=True)
class Constants:
    """What the model needs of one model/preset; see :func:`constants` for how it is measured."""

    batch_size: int
    step_s: float
    dense_bytes: float
    a2a_bytes: float
    ddp_overhead_s: float
    round_local_s: Mapping[str, float]
    contention: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Prediction:
    step_s: float
    examples_per_s: float
    sync_gap: float  # NaN for arms that keep no separate replicas (none, ddp)


def predict(arm: Arm, n: int, k: Constants, net: Network) -> Prediction:
    """The model's step time, examples/s and sync gap of ``arm`` on ``n`` trainers."""
    base = k.step_s + all_to_all_s(k.a2a_bytes, n, net)
    gap = math.nan
    if arm.kind == "none":
        step = base
    elif arm.kind == "ddp":
        step = base + k.ddp_overhead_s + allreduce_s(k.dense_bytes, n, net)
    else:
        assert arm.strategy is not None
        round_s = k.round_local_s[arm.strategy] + allreduce_s(k.dense_bytes, n, net)
        if arm.kind == "fixed_rate":
            step = base + round_s / arm.period
            gap = float(arm.period)
        else:
            step = base * (1 + k.contention[arm.strategy])
            gap = float(max(1, math.ceil(round_s / step)))
    return Prediction(step, n * k.batch_size / step, gap)


# ---------------------------------------------------------------------- calibration file
@dataclasses.dataclass(frozen=True)
class Point:
    """A measured point: medians over repeats of ``bench_sync.py``."""

    examples_per_s: float
    sync_gap: float


def measured(preset: Mapping[str, Any]) -> dict[int, dict[str, Point]]:
    """``{world size: {arm name: Point}}`` from a preset's entry in the calibration file."""
    return {int(n): {name: Point(p["examples_per_s"], p.get("sync_gap_mean", math.nan))
                     for name, p in by_arm.items()}
            for n, by_arm in preset["measured"].items()}


def constants(preset: Mapping[str, Any], contention: float | None = None) -> Constants:
    """The model's constants from the measured N = 1 points and micro-measurements.

    ``t1`` is the ``none`` arm's step alone; DDP's overhead ``d`` and the shadow contention ``c``
    are what their N = 1 steps add to it (clipped at 0: noise can make them negative), since at
    N = 1 no byte crosses a network. ``contention`` replaces the measured ``c`` of every
    strategy (for GPU trainers, where the thread does not take the trainer's cores).
    """
    batch = int(preset["batch_size"])
    one = measured(preset)[1]

    def step(name: str) -> float:
        return batch / one[name].examples_per_s

    t1 = step("none")
    return Constants(
        batch_size=batch,
        step_s=t1,
        dense_bytes=float(preset["dense_bytes"]),
        a2a_bytes=float(preset["a2a_bytes"]),
        ddp_overhead_s=max(0.0, step("ddp") - t1),
        round_local_s=dict(preset["round_local_s"]),
        contention={s: contention if contention is not None
                    else max(0.0, step(Arm("shadow", s).name) / t1 - 1) for s in STRATEGIES},
    )


def with_dense_bytes(k: Constants, nbytes: float) -> Constants:
    """``k`` for a dense part of ``nbytes`` (what-if): one round's local work scales with it."""
    scale = nbytes / k.dense_bytes
    return dataclasses.replace(k, dense_bytes=nbytes, round_local_s={
        s: r * scale for s, r in k.round_local_s.items()})


def loopback(calibration: Mapping[str, Any]) -> Network:
    """The measured loopback network (2 ranks), to predict the measured points with."""
    fit = calibration["allreduce_fit"]
    return Network(fit["latency_s"], fit["bandwidth_Bps"])


# ---------------------------------------------------------------------- report
def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:,.2f}M" if x >= 1e6 else f"{x / 1e3:,.1f}k"


def _fmt_gap(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:g}"


def scaling_table(k: Constants, net: Network, period: int) -> str:
    """examples/s (ratio to none) per arm and N, then the shadow arms' sync gap."""
    arm_list = arms(period)
    head = "| N | " + " | ".join(a.name for a in arm_list) + " |"
    lines = [f"Examples/s (ratio to none), {net.describe()}:", "", head,
             "|---:|" + "---:|" * len(arm_list)]
    for n in TRAINERS:
        none = predict(Arm("none"), n, k, net).examples_per_s
        cells = []
        for arm in arm_list:
            rate = predict(arm, n, k, net).examples_per_s
            cells.append(_fmt_rate(rate) if arm.kind == "none"
                         else f"{_fmt_rate(rate)} ({rate / none:.2f})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    shadow = [a for a in arm_list if a.kind == "shadow"]
    lines += ["", f"Sync gap (steps between applied syncs), {net.describe()}; fixed-rate arms: "
              f"k = {period} at every N:", "",
              "| N | " + " | ".join(a.name for a in shadow)
              + " | ma round, ms | shadow ma step, ms |",
              "|---:|" + "---:|" * (len(shadow) + 2)]
    for n in TRAINERS:
        gaps = [_fmt_gap(predict(a, n, k, net).sync_gap) for a in shadow]
        round_ms = (k.round_local_s["ma"] + allreduce_s(k.dense_bytes, n, net)) * 1e3
        step_ms = predict(shadow[0], n, k, net).step_s * 1e3
        lines.append(f"| {n} | " + " | ".join(gaps) + f" | {round_ms:.3f} | {step_ms:.2f} |")
    return "\n".join(lines)


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
    lines = ["| N | arm | role | measured ex/s | predicted ex/s | error | measured ratio to "
             "none | predicted ratio | measured gap | predicted gap |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gm = "-" if math.isnan(r["gap_measured"]) else f"{r['gap_measured']:.2f}"
        lines.append(f"| {r['n']} | {r['arm']} | {r['role']} | {r['measured']:,.0f} | "
                     f"{r['predicted']:,.0f} | {r['error']:+.0%} | {r['ratio_measured']:.3f} | "
                     f"{r['ratio_predicted']:.3f} | {gm} | {_fmt_gap(r['gap_predicted'])} |")
    return "\n".join(lines)


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
    return "\n".join(["| constant | value |", "|---|---:|",
                      *(f"| {a} | {b} |" for a, b in rows)])


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
        f"Generated {datetime.date.today().isoformat()} by `python "
        f"{shlex.join(sys.argv)}`.", "",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    calibration = json.loads(args.calibration.read_text())
    nets = [Network.of(g, args.latency_us, args.allreduce) for g in args.bandwidth_gbps]
    preset = calibration["presets"][args.preset]
    k = constants(preset, args.contention)
    changed = "" if args.contention is None else (
        f"Contention set to c = {args.contention:g} (--contention), not measured. ")
    if args.dense_mb is not None:
        k = with_dense_bytes(k, args.dense_mb * 2**20)
        changed += (f"What-if: dense part set to {args.dense_mb:g} MiB (--dense-mb), one round's "
                    "local work scaled with it.")
    text = report(calibration, args.preset, k, nets, args.period, changed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.md").write_text(text + "\n")
    plot(args.out / "scaling.png", k, nets, args.period, measured(preset),
         f"{args.preset}, {args.latency_us:g} us, {args.allreduce} allreduce; "
         "line style = bandwidth")
    print(text)
    print(f"\nwrote {args.out / 'scaling.md'} and {args.out / 'scaling.png'} (a model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
