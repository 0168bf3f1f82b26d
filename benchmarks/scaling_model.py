"""A MODEL, not a measurement: throughput and sync gap of each arm for 1 to 1,000 trainers.

We have one machine; this is how we plan beyond it. Constants measured here by ``calibrate.py``
(one rank's step time, dense bytes, one round's local work, a loopback allreduce fit, the
measured 1- and 2-rank points) are extrapolated to N trainers on a stated network::

    python benchmarks/calibrate.py --out benchmarks/results/scaling_model/calibration.json
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

``--testbed benchmarks/results/frontier`` instead checks the model against the emulated cluster
(``cluster.py``, ``frontier.py``): constants fitted on 2 hosts, predictions for 4, written to
``testbed_fit.md``; its equations are ``TESTBED_DOC`` below.

Not modelled: stragglers, network contention between the two kinds of collectives, and
compute that changes with N (the per-rank batch is fixed).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import itertools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from shadowsync.benchmarks.report import command_line, markdown_table, or_dash
from shadowsync.benchmarks.rows import baseline
from shadowsync.sync.config import MOVED

TRAINERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
STRATEGIES = ("ma", "easgd", "bmuf")
DEFAULT_PERIOD = 10
RESULTS = Path(__file__).resolve().parent / "results" / "scaling_model"
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
            return f"sync.strategy.name={self.kind}"
        mode = f"sync.schedule.mode={self.kind}"
        period = f" sync.schedule.period={self.period}" if self.kind == "fixed_rate" else ""
        return f"sync.strategy.name={self.strategy} {mode}{period}"


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


def with_step(k: Constants, seconds: float) -> Constants:
    """``k`` for a step of ``seconds`` alone (what-if: a GPU trainer's step, most of it
    device time): DDP's overhead and a round's local work stay as measured."""
    if not seconds > 0:
        raise ValueError(f"a step must last > 0 s, got {seconds}")
    return dataclasses.replace(k, step_s=seconds)


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


# ---------------------------------------------------------------------- testbed
# The emulated cluster (benchmarks/cluster.py, benchmarks/frontier.py): the same kind of
# equations, with what that testbed is made of. TESTBED_DOC is the model, predict_testbed the code.
TESTBED_DOC = """\
Testbed mode (``--testbed DIR``): predicts the frontier benchmark's arms on the emulated cluster
from each job's ``none`` arm and its link, with constants fitted on the 2-host jobs only. Per
(hosts N, link), per rank (seconds, bytes)::

    measured  T0 = N * batch / (none's examples/s)     the step without synchronization
                                                         (batch = examples/s * train_seconds
                                                         / (N * steps))
              w  = none's link bytes per host per step   (embedding all-to-alls)
              S  = bytes of one round's allreduce        (sync_bytes_reduced / (rounds + 1))
    link      B  = eta * tbf rate                        what gloo gets of a link
              Bc = B_cpu * N_probe / N                   what the shared cores move per host
              eta, B_cpu: fitted to the 2-host FR arms' allreduce times (blocking rounds: the
              link's own speed while training waits), on links where the token bucket,
              resp. the cores, is the limit; the cluster probe's values where none ran
              L  = the tbf queue's latency limit         (cluster.py)
    derived   beta = min(B, Bc)                          (unlimited: Bc)
              A  = 2 (N-1)/N * S / beta                  ring allreduce; links add no delay
              Ac = 2 (N-1)/N * S / Bc                    the CPU work of moving those bytes
              X  = w / beta,  Tc = T0 - X - D            all-to-all and compute inside T0;
                                                         D: the emulated device wait of a
                                                         step (bench_sync --device-step-ms),
                                                         in which the cores idle
              Q  = min(L, (Sk/N) / B) if B < Bc, else 0  the wait behind one ring chunk in a
                                                         link's FIFO queue (tbf), where the
                                                         link and not the CPU is the limit;
                                                         Sk = min(S, sync.transport.chunk_mb),
                                                         n_k = ceil(S / Sk) collectives a round
    fitted    on the 2-host jobs; CPU work in compute steps Tc, since every host shares the
              same cores and such work stretches with N as Tc does:
              rho    one round's CPU work r = rho Tc     FR arms' ratios
              delta  DDP's own cost delta Tc             ddp's ratio
              lam    the background allreduce's wait     shadow arms' allreduce times
                     for the cores, lam Tc
              phi    CPU work of one collective, phi Tc  (same)
              lam_n  lam of a niced thread               niced arms' allreduce times
                     (sync.transport.thread_nice > 0:
                     it yields the cores to training)
              mu_n   the rest of a niced round's wait    niced back-to-back arms' gaps
                     for the cores, mu_n Tc
              kappa  share of a background round's CPU   shadow arms' ratios and gaps
                     work that training pays
              q      exchanges a step that queue behind  shadow arms' ratios and gaps
                     a round's bytes
              kappa_n  kappa of a niced thread           niced arms' ratios and gaps
    ddp       T = T0 + delta Tc + A                      no overlap with backward (worst case)
    FR-k      T = T0 + m/steps * (r + A)                 m = floor((steps-1)/k) + 1 rounds
              gap = (1 + (m-1) k) / m                    rounds after steps 1, k+1, 2k+1, ...
    shadow    Ab = A (1 + X/T0) + (lam + phi n_k) Tc     the allreduce in the background: it
                                                         shares the link with the all-to-alls
                                                         and waits for the cores (lam_n for a
                                                         niced thread)
              Q  = 0 with the sync traffic in the low    training's packets go first (htb
                   class (sync.transport.socket_ifname)  priority): none queue behind a round
              R  = r + Ab / share (+ mu_n Tc if niced)   a round's duration (max_comm_share
                                                         pauses between chunks)
              back to back: T = T0 + kappa (r + Ac + phi n_k Tc) / g + q Q min(1, Ab / (g T)),
                            g = max(1, R/T + 1/2)        (solved together: a delta waits for
                            the next step boundary, half a step on average; a share
                            Ab / (g T) of the steps run while the link carries a round;
                            kappa_n, lam_n and mu_n for a niced thread)
              max_staleness K: g is capped at K and T >= R / K (the step K after a round's
                            snapshot waits for it)
              C  = g (T - T0)                            what one round costs training
              max_slowdown s: rounds stay back to back while C / (g T0) <= s; otherwise the
                            pacer spaces them g_s = C / (s T0) steps apart (n_b busy steps a
                            round, each costing c = C / (n_b T0), busy share s / c) and
                            T = T0 (1 + s)
              gap as measured = steps / rounds: rounds start at step 1, the second g_1 later
                            (g_1 = g, or g + 3 with a pacer: it waits 3 steps to have a quiet
                            step to compare with), then every g_s; stop() adds one
    turns     (jobs run with --interleave B, every arm on one model in turns of B steps; the
              rows carry ``interleave``): steps = B, the gap is the mean distance between the
              syncs applied within a turn, so FR-k's is k and shadow's is g_s (a turn resumes
              where the arm's last one left off: no first round, no stop round); a round's
              bytes S come from the FR turns (all their rounds fall inside), its allreduce time
              is not recorded
    ratio = T0 / T;  S (and A, Ac) halve with a 16-bit wire dtype (FR and shadow)

Also shown for shadow: the ratio at the *measured* gap, T0 / (T0 + C / gap), which separates
the cost model's error from the pacer's choice of gap.
"""

# The cluster probe (2 hosts, 8 MB gloo allreduce): 119 of 125 MB/s at 1gbit, 23.5 of 25 MB/s
# at 200mbit, and 0.5-0.9 GB/s on unlimited links (CPU-bound); cluster.py's tbf latency.
TESTBED_LINK_EFFICIENCY = 0.95
TESTBED_UNLIMITED_MBPS = 600.0
TESTBED_PROBE_HOSTS = 2
TESTBED_TBF_LATENCY_S = 0.1
TESTBED_FAMILIES = ("ddp", "FR", "shadow")
TESTBED_SCHEDULES = ("runs", "turns")  # separate runs per arm; --interleave turns on one model
PACER_FIRST_QUIET_STEPS = 3  # SlowdownPacer.pause_steps before any quiet step is measured
QUEUED_MAX = 4.0  # search bound of q: a step has a handful of exchanges, not more
_LINK_RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
_LINK_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def _link_rate_name(label: str) -> str:
    """The link of a job label: ``1gbit-bs512`` (a frontier ``--tag`` variant) is ``1gbit``."""
    return label.split("-", 1)[0]


def link_rate_Bps(link: str) -> float | None:
    """The tbf rate a frontier link name stands for, bytes/s; None for ``unlimited``."""
    link = _link_rate_name(link)
    if link == "unlimited":
        return None
    m = _LINK_RATE.match(link)
    if m is None:
        raise ValueError(f"link {link!r}: expected unlimited or e.g. 200mbit, 1gbit")
    return float(m.group(1)) * _LINK_UNITS[m.group(2)] / 8


@dataclasses.dataclass(frozen=True)
class TestbedLinks:
    """How the emulated links are described to the model (see TESTBED_DOC). The defaults are
    the cluster probe's (idle hosts); :func:`calibrate_links` refits ``efficiency`` and
    ``unlimited_Bps`` to allreduces timed during training."""

    efficiency: float = TESTBED_LINK_EFFICIENCY
    unlimited_Bps: float = TESTBED_UNLIMITED_MBPS * 1e6
    probe_hosts: int = TESTBED_PROBE_HOSTS
    tbf_latency_s: float = TESTBED_TBF_LATENCY_S

    def cpu_Bps(self, hosts: int) -> float:
        """Bc: what the shared cores move per host, the probe's rate split among the hosts."""
        return self.unlimited_Bps * self.probe_hosts / hosts

    def link_Bps(self, link: str) -> float | None:
        """B: the tbf rate as gloo gets it; None for an unlimited link."""
        rate = link_rate_Bps(link)
        return None if rate is None else self.efficiency * rate

    def bandwidth_Bps(self, link: str, hosts: int) -> float:
        """beta: the link's rate, capped by what the cores move."""
        rate = self.link_Bps(link)
        cpu = self.cpu_Bps(hosts)
        return cpu if rate is None else min(rate, cpu)



@dataclasses.dataclass(frozen=True)
class TestbedArm:
    """A frontier arm: its ``bench_sync`` name and, where the job recorded them, its overrides
    (``frontier.default_arms``)."""

    name: str
    kind: Literal["none", "ddp", "fixed_rate", "shadow"]
    period: int | None = None
    max_slowdown: float | None = None  # shadow: None runs rounds back to back (unpaced)
    max_comm_share: float = 1.0  # shadow: the share of a round's time it may hold the link
    chunk_bytes: float | None = None  # a round's allreduce in collectives of this size
    wire_factor: float = 1.0  # bytes on the wire per float32 byte (0.5 for bf16, fp16)
    thread_nice: int = 0  # shadow: sync.transport.thread_nice, the thread's nice above training's
    max_staleness: int | None = None  # shadow: the step that waits for a round (K)
    low_class: bool = False  # FR and shadow: sync traffic in the links' low class

    @property
    def family(self) -> str:
        return {"fixed_rate": "FR", "shadow": "shadow"}.get(self.kind, self.kind)


_WIRE_FACTOR = {"float32": 1.0, "bfloat16": 0.5, "float16": 0.5}
_WIRE_TAGS = {" bf16": 0.5, " fp16": 0.5}  # frontier.WIRE_TAGS
_FR_NAME = re.compile(r"^FR k=(\d+)$")
_SHADOW_NAME = re.compile(r"^S (?:(?P<b2b>back to back|b2b)"
                          r"|(?P<link>link )?(?P<share>\d+(?:\.\d+)?)%)(?P<knobs>(?: [sn]\d+)*)$")


def parse_testbed_arm(name: str, overrides: str | None = None,
                      chunk_bytes: float | None = None) -> TestbedArm:
    """The arm a frontier arm name stands for: ``none``, ``ddp``, ``FR k=<k>``, ``S back to
    back`` (or ``S b2b``), ``S <p>%`` (accepted slowdown), ``S link <p>%`` (max_comm_share);
    a shadow name may add `` s<K>`` (max_staleness) and `` n<N>`` (thread_nice), and any
    name a wire-dtype tag (`` bf16``). ``overrides`` (as the job's ``.cmd`` records them, the
    flat ``sync.*`` keys of earlier records read as today's: :func:`override_dict`) take
    precedence over the name, and a ``sync.transport.socket_ifname`` among them puts the sync
    traffic in the low class (frontier's ``--sync-class low``); without them a shadow arm gets
    ``chunk_bytes``. ValueError for anything else, so an arm the model does not know is never
    silently mispredicted."""
    wire, base = 1.0, name
    for tag, factor in _WIRE_TAGS.items():
        if name.endswith(tag):
            wire, base = factor, name.removesuffix(tag)
    if base == "none":
        arm = TestbedArm(name, "none")
    elif base == "ddp":
        arm = TestbedArm(name, "ddp")
    elif m := _FR_NAME.match(base):
        arm = TestbedArm(name, "fixed_rate", period=int(m.group(1)), wire_factor=wire)
    elif m := _SHADOW_NAME.match(base):
        share = None if m["b2b"] else float(m["share"]) / 100
        knobs = {knob[0]: int(knob[1:]) for knob in m["knobs"].split()}
        arm = TestbedArm(name, "shadow", max_slowdown=None if m["link"] else share,
                         max_comm_share=share if m["link"] and share else 1.0,
                         chunk_bytes=chunk_bytes, wire_factor=wire,
                         thread_nice=knobs.get("n", 0), max_staleness=knobs.get("s"))
    else:
        raise ValueError(f"arm {name!r}: not a frontier arm (none, ddp, FR k=<k>, S back to "
                         "back, S b2b, S <p>%, S link <p>%, shadow ones with s<K>, n<N>)")
    if overrides is None:
        return arm
    given = override_dict(overrides.split())

    def number(key: str) -> float | None:
        value = given.get(key)
        return None if value is None or value == "null" else float(value)

    period = number("sync.schedule.period")
    chunk_mb = number("sync.transport.chunk_mb")
    nice = number("sync.transport.thread_nice")
    staleness = number("sync.schedule.max_staleness")
    return dataclasses.replace(
        arm, period=int(period) if period is not None else arm.period,
        max_slowdown=number("sync.schedule.max_slowdown") if "sync.schedule.max_slowdown" in given
        else arm.max_slowdown,
        max_comm_share=number("sync.schedule.max_comm_share") or arm.max_comm_share,
        chunk_bytes=chunk_mb * 2**20 if chunk_mb is not None else None,
        wire_factor=_WIRE_FACTOR[given["sync.transport.wire_dtype"]]
        if "sync.transport.wire_dtype" in given else arm.wire_factor,
        thread_nice=int(nice) if nice is not None else arm.thread_nice,
        max_staleness=(None if staleness is None else int(staleness))
        if "sync.schedule.max_staleness" in given else arm.max_staleness,
        low_class=given.get("sync.transport.socket_ifname", "null") not in ("", "null"))


def _nanmean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclasses.dataclass(frozen=True)
class TestbedMeasured:
    """One arm of one frontier job, reduced the way ``frontier.summarize`` reduces it (ratio: the
    median over repeats of examples/s over the same repeat's ``none``; gap: the runs' mean), plus
    the telemetry the model reads or is checked against (NaN where the arm has none)."""

    runs: int
    batch_size: int  # per rank, from examples/s * train_seconds / (hosts * steps)
    examples_per_s: float
    ratio: float
    ratio_min: float
    ratio_max: float
    gap: float
    steps: int
    round_bytes: float
    comm_per_round_s: float
    wire_bytes_per_step: float
    busy_share: float
    round_cost: float
    interleaved: bool = False  # rows are turns of a --interleave job (TESTBED_DOC, turns)
    device_s: float = 0.0  # D: the emulated device wait of every step (TESTBED_DOC)


def _steps(row: Mapping[str, Any]) -> int:
    """A run's steps, or a turn's (``interleave``) in a turns job."""
    return int(row["step"] if "step" in row else row["interleave"])


def _round_bytes(arm: str, rows: Sequence[Mapping[str, Any]]) -> float:
    """Bytes of one round's allreduce: the final consensus is one more allreduce of a run
    (of the same bytes when the wire dtype is float32, the frontier's default); in turns only
    an FR arm's count is exact (every round it reduced was applied within the turn)."""
    if any("sync_rounds" in r for r in rows):
        return _nanmean([r["sync_bytes_reduced"] / (r["sync_rounds"] + 1) for r in rows
                         if "sync_rounds" in r])
    if not arm.startswith("FR "):
        return math.nan
    return _nanmean([r["sync_bytes_reduced"] / r["sync_syncs_applied"] for r in rows
                     if r.get("sync_syncs_applied")])


def measure_testbed(rows: Sequence[Mapping[str, Any]], hosts: int
                    ) -> dict[str, TestbedMeasured]:
    """Per arm name, the measured point; rows are one ``raw/h<N>_<link>.json``, runs or a
    turns job's turns (:func:`_round_bytes` for a round's size). Each ratio is to what
    ``frontier.py`` compares the row with (:func:`rows.baseline`): the ``none`` turns beside
    a bracketed turn, else ``none``'s run or turn of the same seed and repeat."""
    base = {(r["seed"], r["repeat"]): float(r["examples_per_s"]) for r in rows
            if r["arm"] == "none"}
    if not base:
        raise ValueError("no 'none' run: every ratio is to none of the same repeat")
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        ratios = [float(r["examples_per_s"]) / baseline(r, base) for r in mine]
        allreduces = [r["sync_rounds"] + 1 for r in mine if "sync_rounds" in r]
        synced = [r for r in mine if "sync_rounds" in r]
        out[arm] = TestbedMeasured(
            runs=len(mine),
            batch_size=round(_median([r["examples_per_s"] * r["train_seconds"]
                                      / (hosts * _steps(r)) for r in mine])),
            examples_per_s=_median([float(r["examples_per_s"]) for r in mine]),
            ratio=_median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
            gap=_nanmean([float(r.get("sync_gap_mean", math.nan)) for r in mine]),
            steps=int(_median([_steps(r) for r in mine])),
            round_bytes=_round_bytes(arm, mine),
            comm_per_round_s=_nanmean([r["sync_comm_seconds"] / n
                                       for r, n in zip(synced, allreduces, strict=True)]),
            wire_bytes_per_step=_nanmean([float(r.get("wire_bytes", math.nan))
                                          / (hosts * _steps(r)) for r in mine]),
            busy_share=_nanmean([float(r.get("sync_busy_share", math.nan)) for r in mine]),
            round_cost=_nanmean([float(r.get("sync_round_cost", math.nan)) for r in mine]),
            interleaved=all("interleave" in r for r in mine),
            device_s=_median([float(r.get("device_step_ms", 0.0)) / 1e3 for r in mine]),
        )
    return out


@dataclasses.dataclass(frozen=True)
class TestbedJob:
    """What the model takes from one (hosts, link) job's measurement, and what it is told about
    the link; everything else about the job's arms is predicted."""

    hosts: int
    link: str
    steps: int
    step_s: float  # T0
    bandwidth_Bps: float  # beta
    round_bytes: float  # S
    a2a_s: float  # X
    cpu_Bps: float  # Bc
    link_Bps: float | None  # B; None for an unlimited link
    tbf_latency_s: float  # L
    interleaved: bool = False  # a turns job: gaps are measured within turns (TESTBED_DOC)
    device_s: float = 0.0  # D

    @property
    def compute_s(self) -> float:
        """Tc: the part of the step that is CPU work (and stretches as the cores are shared):
        neither the all-to-all nor the emulated device wait."""
        return max(self.step_s - self.a2a_s - self.device_s, 0.0)

    @property
    def allreduce_s(self) -> float:
        """A: one ring allreduce of S on links that add no delay."""
        return self.allreduce_of(self.round_bytes)

    def allreduce_of(self, nbytes: float) -> float:
        """A ring allreduce of ``nbytes`` on this job's links."""
        return allreduce_s(nbytes, self.hosts, Network(0.0, self.bandwidth_Bps))

    def transfer_cpu_of(self, nbytes: float) -> float:
        """Ac: the CPU time of moving an allreduce's bytes (the same on a CPU-bound link)."""
        return allreduce_s(nbytes, self.hosts, Network(0.0, self.cpu_Bps))

    def queue_s(self, collective_bytes: float) -> float:
        """Q: how long a message waits behind one collective's bytes in the link's FIFO queue.
        A ring keeps one of its N chunks in flight per host; tbf drops what would wait longer
        than its latency limit, so the wait is capped there. No queue builds where the cores,
        not the token bucket, are the limit (unlimited links, rates above what they move)."""
        if self.link_Bps is None or self.link_Bps >= self.cpu_Bps:
            return 0.0
        return min(self.tbf_latency_s, collective_bytes / self.hosts / self.link_Bps)


def testbed_job(hosts: int, link: str, measured_arms: Mapping[str, TestbedMeasured],
                links: TestbedLinks) -> TestbedJob:
    """The job's inputs: T0 and w from ``none``, S from any arm that synchronized. The batch is
    read from the runs, not given: frontier jobs may override it."""
    none = measured_arms["none"]
    beta = links.bandwidth_Bps(_link_rate_name(link), hosts)
    sizes = [m.round_bytes for name, m in measured_arms.items()
             if not math.isnan(m.round_bytes) and not name.endswith(tuple(_WIRE_TAGS))]
    if not sizes:
        raise ValueError(f"{hosts} hosts, {link}: no float32 arm synchronized, so no round "
                         "size")
    size = _median(sizes)
    wire = 0.0 if math.isnan(none.wire_bytes_per_step) else none.wire_bytes_per_step
    return TestbedJob(hosts=hosts, link=link, steps=none.steps,
                      step_s=hosts * none.batch_size / none.examples_per_s, bandwidth_Bps=beta,
                      round_bytes=size, a2a_s=wire / beta, cpu_Bps=links.cpu_Bps(hosts),
                      link_Bps=links.link_Bps(_link_rate_name(link)),
                      tbf_latency_s=links.tbf_latency_s, interleaved=none.interleaved,
                      device_s=none.device_s)


def calibrate_links(measured: Mapping[tuple[int, str], Mapping[str, TestbedMeasured]],
                    links: TestbedLinks) -> TestbedLinks:
    """``links`` with eta and B_cpu fitted to the FR arms' allreduce times (medians of the
    rates they achieved), each kept where no FR arm ran on a link of its kind. An FR round
    blocks training, so its allreduce time is the link's own, under the load of training
    (the probe times idle hosts). Which links the cores limit depends on B_cpu: classified
    again with the fitted value."""
    for _ in range(2):
        efficiency, cpu = [], []
        for (hosts, link), arms in measured.items():
            rate = link_rate_Bps(link)
            for name, m in arms.items():
                if not name.startswith("FR ") or not m.comm_per_round_s > 0:
                    continue
                achieved = 2 * (hosts - 1) / hosts * m.round_bytes / m.comm_per_round_s
                if rate is not None and links.efficiency * rate < links.cpu_Bps(hosts):
                    efficiency.append(achieved / rate)
                else:
                    cpu.append(achieved * hosts / links.probe_hosts)
        links = dataclasses.replace(
            links, efficiency=_median(efficiency) if efficiency else links.efficiency,
            unlimited_Bps=_median(cpu) if cpu else links.unlimited_Bps)
    return links


@dataclasses.dataclass(frozen=True)
class TestbedConstants:
    """The fitted constants (TESTBED_DOC): CPU work in compute steps, so that it carries across
    host counts on shared cores. ``kappa`` is the share of a background round's CPU work that
    training pays (0: a core to spare; 1: all of it); ``queued`` (q) the exchanges of a step
    that wait behind a round's bytes in a link's queue."""

    rho: float
    delta: float
    kappa: float
    stretch: float = 0.0  # lam
    queued: float = 0.0  # q
    per_chunk: float = 0.0  # phi
    stretch_niced: float = 0.0  # lam_n: lam for a thread with sync.transport.thread_nice > 0
    wait_niced: float = 0.0  # mu_n: a niced round's wait for the cores outside its allreduce
    kappa_niced: float = 0.0  # kappa_n: kappa for a niced thread


@dataclasses.dataclass(frozen=True)
class TestbedPrediction:
    ratio: float
    gap: float  # as measured over the run's steps; NaN for none and ddp
    step_s: float
    round_cost_s: float  # what one round costs training (FR: r + A; shadow: C); NaN otherwise
    allreduce_s: float  # one round's allreduce (shadow: in the background); NaN for none
    steady_gap: float  # shadow: steps between rounds once the pacer has settled

    def ratio_at_gap(self, job: TestbedJob, gap: float) -> float:
        """The ratio the cost model gives if rounds came every ``gap`` steps."""
        if math.isnan(self.round_cost_s) or not gap > 0:
            return math.nan
        return job.step_s / (job.step_s + self.round_cost_s / gap)


def fr_rounds(steps: int, period: int) -> int:
    """Rounds of a fixed-rate run: after steps 1, k+1, 2k+1, ... (``FixedRateSyncRunner``)."""
    return (steps - 1) // period + 1


def shadow_gap(duration: float, step: float) -> float:
    """Mean steps between applied deltas when rounds of ``duration`` s go back to back.

    A delta waits for the next step boundary after its round ends, and the next round starts
    there. Step and round times jitter (shared cores), so a round ends at a uniformly random
    phase of a step and waits half a step on average: ``R/T + 1/2``, at least one step (one
    round per boundary at most).
    """
    return max(1.0, duration / step + 0.5)


def _back_to_back(t0: float, cpu_cost: float, queue_cost: float, background_s: float,
                  duration: float, staleness: int | None = None) -> tuple[float, float]:
    """(T, g) solving T = T0 + cpu_cost / g + queue_cost * min(1, Ab / (g T)), with
    g = shadow_gap(R, T) capped at ``staleness`` (K), by bisection on
    [T0, T0 + cpu_cost + queue_cost]: the difference is <= 0 at T0 and >= 0 at the top
    (g >= 1, the share <= 1), so a root lies between. Where the cap binds, the step K after a
    round's snapshot waits for it: K steps last at least R, T >= R / K."""

    def gap(step: float) -> float:
        g = shadow_gap(duration, step)
        return g if staleness is None else min(g, staleness)

    def excess(step: float) -> float:
        g = gap(step)
        return step - t0 - cpu_cost / g - queue_cost * min(1.0, background_s / (g * step))

    lo, hi = t0, t0 + cpu_cost + queue_cost
    if hi > lo:
        for _ in range(60):  # to 2^-60 of the interval
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    step = (lo + hi) / 2
    g = gap(step)
    return (step if staleness is None else max(step, duration / staleness)), g


def shadow_rounds(steps: int, first_gap: float, gap: float) -> int:
    """Rounds a shadow run of ``steps`` steps completes: the first starts at step 1, the second
    ``first_gap`` steps later, then one every ``gap`` steps until training ends, and stop()
    runs one more (its stop flag rides in a round's buffer)."""
    started, second = 1, 1 + first_gap
    if second < steps:
        started += math.ceil((steps - second) / gap)
    return started + 1


def chunks(arm: TestbedArm, nbytes: float) -> int:
    """How many collectives one round's allreduce of ``nbytes`` takes."""
    return 1 if arm.chunk_bytes is None else max(1, math.ceil(nbytes / arm.chunk_bytes))


def _background_s(job: TestbedJob, arm: TestbedArm, size: float, lam: float, phi: float
                  ) -> float:
    """Ab: a round's allreduce of ``size`` bytes in the background, sharing the link with the
    all-to-alls and waiting ``lam`` (and ``phi`` per collective) compute steps for the cores."""
    return (job.allreduce_of(size) * (1 + job.a2a_s / job.step_s)
            + (lam + phi * chunks(arm, size)) * job.compute_s)


def predict_testbed(arm: TestbedArm, job: TestbedJob, k: TestbedConstants) -> TestbedPrediction:
    """The model's ratio to ``none`` and sync gap of ``arm`` in ``job`` (TESTBED_DOC)."""
    t0, tc = job.step_s, job.compute_s
    size = job.round_bytes * arm.wire_factor
    a = job.allreduce_of(size)
    r = k.rho * tc
    nan = math.nan
    if arm.kind == "none":
        return TestbedPrediction(1.0, nan, t0, nan, nan, nan)
    if arm.kind == "ddp":
        a = job.allreduce_s  # float32 gradients
        step = t0 + k.delta * tc + a
        return TestbedPrediction(t0 / step, nan, step, nan, a, nan)
    if arm.kind == "fixed_rate":
        assert arm.period is not None
        m = fr_rounds(job.steps, arm.period)
        step = t0 + m / job.steps * (r + a)
        gap = arm.period if job.interleaved else (1 + (m - 1) * arm.period) / m
        return TestbedPrediction(t0 / step, gap, step, r + a, a, gap)
    n_chunks = chunks(arm, size)
    kappa, stretch, wait = ((k.kappa_niced, k.stretch_niced, k.wait_niced) if arm.thread_nice
                            else (k.kappa, k.stretch, 0.0))
    background = _background_s(job, arm, size, stretch, k.per_chunk)
    queue = 0.0 if arm.low_class else job.queue_s(size / n_chunks)
    cpu = r + job.transfer_cpu_of(size) + k.per_chunk * n_chunks * tc
    duration = r + background / arm.max_comm_share + wait * tc
    step, gap = _back_to_back(t0, kappa * cpu, k.queued * queue, background, duration,
                              arm.max_staleness)
    cost = gap * (step - t0)
    steady, first = gap, gap
    s = arm.max_slowdown
    if s is not None:
        first = gap + PACER_FIRST_QUIET_STEPS
        if cost / (gap * t0) > s:
            step, steady = t0 * (1 + s), cost / (s * t0)
    measured_gap = (steady if job.interleaved
                    else job.steps / shadow_rounds(job.steps, first, steady))
    return TestbedPrediction(t0 / step, measured_gap, step, cost, background, steady)


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


def current_override_key(key: str) -> str:
    """A recorded override's key as today's config names it: a flat ``sync.<key>`` of earlier
    versions (``shadowsync.sync.config.MOVED``) becomes ``sync.<section>.<key>``
    (``sync.thread_nice`` -> ``sync.transport.thread_nice``); any other key is returned as is.
    Results recorded before the ``sync`` section was split keep being read."""
    section, _, leaf = key.partition(".")
    return f"sync.{MOVED[leaf]}" if section == "sync" and leaf in MOVED else key


def override_dict(items: Iterable[str]) -> dict[str, str]:
    """``key=value`` items (as a job's ``.cmd`` records an arm's overrides) as a mapping with
    today's keys (:func:`current_override_key`); the last one given wins, as in the config, and
    items without ``=`` are skipped."""
    return {current_override_key(key): value
            for key, _, value in (item.partition("=") for item in items if "=" in item)}


def arm_overrides(lines: Sequence[str]) -> dict[str, str]:
    """Each arm's overrides from the ``  arm <name>: <overrides>`` lines of a job's ``.cmd``
    (other lines are skipped), in their order."""
    arms = {}
    for line in lines:
        if line.startswith("  arm "):
            name, _, overrides = line.removeprefix("  arm ").partition(":")
            arms[name.strip()] = overrides.strip()
    return arms


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
            shared = _background_s(job, arm, size, 0.0, 0.0)
            a_bg.append((shared - m.comm_per_round_s) / m.comm_per_round_s)
            b_bg.append(job.compute_s / m.comm_per_round_s)
            c_bg.append(chunks(arm, size) * job.compute_s / m.comm_per_round_s)
    rho, delta = _weighted_ls(a_fr, b_fr), _weighted_ls(a_ddp, b_ddp)
    stretch, per_chunk = _nonneg_ls2(a_bg, b_bg, c_bg)
    a_n, b_n = [], []
    for arm, job, m in niced:  # with phi as the unniced arms give it
        shared = _background_s(job, arm, job.round_bytes * arm.wire_factor, 0.0, per_chunk)
        a_n.append((shared - m.comm_per_round_s) / m.comm_per_round_s)
        b_n.append(job.compute_s / m.comm_per_round_s)
    stretch_niced = _weighted_ls(a_n, b_n)
    a_w, b_w = [], []
    for arm, job, m in niced:  # unpaced back-to-back rounds: R = (gap - 1/2) T
        if arm.max_slowdown is None and arm.max_staleness is None and m.gap > 1.5:
            background = _background_s(job, arm, job.round_bytes * arm.wire_factor,
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


def _arm(name: str, overrides: Mapping[str, str] | None, chunk_bytes: float | None
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
            arm = _arm(name, overrides.get((hosts, link)), chunk_bytes.get((hosts, link)))
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
                           if _link_rate_name(k[1]) != _link_rate_name(key[1]))
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
            entry[f"{what}_median"] = _median(errors) if errors else math.nan
            entry[f"{what}_max"] = max(errors) if errors else math.nan
        out.append(entry)
    return out


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:+.1%}"


def _abs_pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.1%}"


def _num(x: float, digits: int = 3) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def _none_spread(rows: Sequence[Mapping[str, Any]]) -> float:
    """(max - min) / median of ``none``'s examples/s over repeats: the job's noise floor."""
    rates = [float(r["examples_per_s"]) for r in rows if r["arm"] == "none"]
    return (max(rates) - min(rates)) / _median(rates)


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
                      if _arm(r["arm"], recorded.get(key), chunk_bytes.get(key)) is None})
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
    parser.add_argument("--step-ms", type=float,
                        help="what-if: one trainer's step alone takes this long (a GPU "
                             "trainer's), instead of the measured t1")
    parser.add_argument("--out", type=Path, default=RESULTS)
    testbed = parser.add_argument_group(
        "testbed", "predict the frontier benchmark's arms on the emulated cluster instead "
        "(writes testbed_fit.md; see TESTBED_DOC in this file)")
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


if __name__ == "__main__":
    sys.exit(main())
