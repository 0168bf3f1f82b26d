"""The throughput / sync-frequency frontier of background and foreground synchronization, on an
emulated cluster whose links cost something.

Why: ShadowSync's claim is that synchronizing in the background buys more synchronization per
unit of lost throughput than synchronizing in the foreground. Both sides of that trade are
measured here in one job per network: every arm trains the same model (``dlrm_reference``: the
dense sizes of TorchRec's DLRM reference, ~2M dense parameters) on the same data, one after the
other in the same processes (``bench_sync.py``), on ``N`` emulated hosts (``cluster.py``), each
with its own rate-limited link. Per arm: examples/s as a ratio to ``none`` (no synchronization)
of the same repeat, with median and min-max over repeats; the mean sync gap (training steps
between applied synchronizations); bytes on the wire per example. The fixed-rate arms (FR-k,
blocking every k steps) trace one curve, the shadow arms (back to back with each round awaited
a step after its snapshot, back to back with the sync thread at three priorities, and the 5%
accepted-slowdown pacer) another; a plot per link shows both, and a table checks each
accepted-slowdown arm against the throughput it was asked to keep.
By default both send their rounds in the links' low traffic class (``--sync-class low``), the
way a datacenter network serves bulk traffic after training's. Needs root (network
namespaces)::

    sudo .venv/bin/python -m shadowsync.benchmarks.frontier --hosts 2 4 \\
        --links unlimited 10gbit 1gbit 200mbit --repeats 3 --out benchmarks/results/frontier
    .venv/bin/python -m shadowsync.benchmarks.frontier --report-only \\
        --out benchmarks/results/frontier

``--interleave B`` measures the arms in turns of ``B`` steps on one model instead (``bench_sync
--interleave``): separate runs each build a model and a data stream, and on shared cores two
identical runs of one job can read further apart than the arms differ; turns on one model put
the machine's drift on every arm alike (``--aa`` shows what is left). A repeat is then one cycle
of turns; there is no ``ddp`` arm (DDP is built into the model) and no per-arm eval NE (one
model). With ``--bracket`` a ``none`` turn runs before every other turn and each turn is
compared with the ``none`` turns beside it, not with ``none``'s turn a cycle away: on 2 shared
cores the machine's speed wanders over tens of seconds (turns a few seconds apart read more
alike than turns a cycle apart), and the nearer baseline leaves that part out; changes faster
than a turn stay. It doubles a job's turns. With ``--trace`` as well, every step is timed and
marked where synchronization touched it, and the report splits each arm's loss by kind of step
(the step a round is in flight, the one its delta lands in, the quiet steps after): whether a
round's cost lands where the accepted-slowdown pacer measures it.

Each (hosts, link) job writes ``raw/h<N>_<link>.json`` (every run, as ``bench_sync --json``
writes it) as soon as it ends, so a sweep can be stopped and resumed (``--skip-done``); the
report (``report.md``, ``frontier_<link>.png``) is rebuilt from whatever raw files exist.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shadowsync.benchmarks.cluster import (
    SYNC_IF,
    Cluster,
    ClusterError,
    Interrupted,
    parse_rate,
)
from shadowsync.benchmarks.report import command_line, markdown_table, or_dash, spread
from shadowsync.benchmarks.rows import (
    STEP_KINDS,
    baseline,
    first_per_seed,
    footprint,
    mean_of,
    stdev_of,
)
from shadowsync.benchmarks.scaling_model import arm_overrides, override_dict

ROOT = Path(__file__).resolve().parents[1]
FR_PERIODS = (1, 2, 5, 10, 20, 50)
# Shadow settings, from the most frequent synchronization to the cheapest: back to back with
# every round awaited one step after its snapshot ("s1": a sync every step, each round hidden
# behind one step of training), back to back with the sync thread at the training threads'
# priority, then lowered by 10 and 19 nice levels ("n10", "n19": rounds use the CPU time
# training leaves, so they take longer and cost less), and the accepted-slowdown pacer at 5%
# with the thread at nice 10.
SHADOW = ("b2b s1: sync.schedule.max_slowdown=null sync.schedule.max_staleness=1",
          "b2b: sync.schedule.max_slowdown=null",
          "b2b n10: sync.schedule.max_slowdown=null sync.transport.thread_nice=10",
          "b2b n19: sync.schedule.max_slowdown=null sync.transport.thread_nice=19",
          "5% n10: sync.schedule.max_slowdown=0.05 sync.transport.thread_nice=10")
# With --sync-class same (one FIFO per link) every shadow arm sends its round in chunks of
# CHUNK_MS of link time (sync.transport.chunk_mb from the link's rate): a whole-buffer burst
# would queue each embedding all-to-all behind it, while much smaller chunks pay a
# collective's fixed cost too often on a fast link. In the low class training's packets go first
# anyway, so rounds go whole; unlimited links get no chunks either.
CHUNK_MS = 2.5
SHADOW_COMMON = ""


def chunk_override(link: str, chunk_ms: float) -> str:
    """``sync.transport.chunk_mb=...`` worth ``chunk_ms`` of ``link``'s rate ('' if unlimited
    or 0)."""
    bits = parse_rate(link)
    if bits is None or chunk_ms <= 0:
        return ""
    return f"sync.transport.chunk_mb={bits / 8 * chunk_ms / 1e3 / 2**20:.4g}"


WIRE_TAGS = {"float32": "", "bfloat16": " bf16", "float16": " fp16"}


AA_ARM = "none A/A"  # a second none arm (--aa): what two identical arms read apart


def default_arms(algorithm: str, periods: Sequence[int], shadow: Sequence[str],
                 wires: Sequence[str] = ("float32",), shadow_common: str = "",
                 sync_common: str = "", aa: bool = False, ddp: bool = True) -> list[str]:
    """``bench_sync --arm`` specs: none, ddp (unless not ``ddp``), then for each wire dtype FR-k
    for each period and a shadow arm for each ``"label: overrides"`` in ``shadow`` (FR and
    shadow of one wire dtype send the same bytes a round); ``sync_common`` goes to every FR and
    shadow arm. ``aa`` adds :data:`AA_ARM` last, so that the rotation puts it elsewhere than
    ``none``."""
    arms = ["none: sync.strategy.name=none", *(["ddp: sync.strategy.name=ddp"] if ddp else [])]
    for wire in wires:
        tag = WIRE_TAGS[wire]
        opt = f" sync.transport.wire_dtype={wire}" + (f" {sync_common}" if sync_common else "")
        arms += [f"FR k={k}{tag}: sync.strategy.name={algorithm} sync.schedule.mode=fixed_rate "
                 f"sync.schedule.period={k}{opt}" for k in periods]
        for spec in shadow:
            label, _, overrides = spec.partition(":")
            arms.append(f"S {label.strip()}{tag}: sync.strategy.name={algorithm} "
                        f"sync.schedule.mode=shadow {overrides.strip()} {shadow_common}{opt}")
    return arms + ([f"{AA_ARM}: sync.strategy.name=none"] if aa else [])


def wire_tag(arm: str) -> str:
    """The wire-dtype suffix of an arm's name ('' for float32)."""
    return next((t for t in WIRE_TAGS.values() if t and arm.endswith(t)), "")


def job_name(hosts: int, link: str, tag: str = "") -> str:
    """``h<hosts>_<link>``, plus ``-<tag>`` for a variant (another batch size, say), which the
    report shows as a link of its own."""
    return f"h{hosts}_{link}" + (f"-{tag}" if tag else "")


def run_job(out: Path, hosts: int, link: str, args: argparse.Namespace, command: str) -> int:
    """One bench_sync job over every arm on ``hosts`` hosts linked at ``link``; the sweep's
    command is kept beside its runs (``<job>.cmd``) for the report."""
    name = job_name(hosts, link, args.tag)
    raw = out / "raw" / f"{name}.json"
    argv = ["-m", "shadowsync.benchmarks.bench_sync", "--config", args.config,
            "--steps", str(args.steps), "--repeats", str(args.repeats),
            "--seeds", *map(str, args.seeds),
            *(["--interleave", str(args.interleave)] if args.interleave else []),
            *(["--bracket"] if args.bracket else []),
            *(["--trace"] if args.trace else []),
            *(["--device-step-ms", f"{args.device_step_ms:g}"] if args.device_step_ms else []),
            "--json", str(raw.resolve()),
            *[f"--arm={a}" for a in default_arms(
                args.algorithm, args.periods, args.shadow, args.wires,
                f"{chunk_override(link, args.chunk_ms)} {args.shadow_common}".strip(),
                f"sync.transport.socket_ifname={SYNC_IF}" if args.sync_class == "low" else "",
                aa=args.aa, ddp=not args.interleave)],
            *args.overrides]
    arms = [a.removeprefix("--arm=") for a in argv if a.startswith("--arm=")]
    (out / "raw" / f"{name}.cmd").write_text(command + "\n" + "".join(f"  arm {a}\n"
                                                                      for a in arms))
    log = (out / "raw" / f"{name}.log").open("w")

    def on_line(host: int, line: str) -> None:
        log.write(f"[h{host}] {line}\n")
        if host == 0 and ("examples/s" in line or line.startswith("|")):
            print(f"  {name}: {line}", flush=True)

    began = time.perf_counter()
    with log, Cluster(hosts=hosts, rate=link, name=f"frontier{hosts}",
                      sync_class=args.sync_class) as cluster:
        rc = cluster.launch(argv, on_line=on_line, timeout_s=args.job_timeout_s,
                            pin_cpus=args.pin_cpus)
    print(f"{name}: exit {rc} after {time.perf_counter() - began:.0f} s", flush=True)
    return rc


# ----------------------------------------------------------------------------- analysis
def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(rows: list[dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
    """Per arm: ratio to the same repeat's ``none``, or to the ``none`` turns beside each turn
    (``bench_sync --bracket``), as median, min and max; mean sync gap, bytes on the wire per
    example, eval NE over seeds; with an accepted-slowdown pacer, the loss it reckoned it
    caused (its busy share times its round cost, averaged over the runs)."""
    base = {(r["seed"], r["repeat"]): r["examples_per_s"] for r in rows if r["arm"] == "none"}
    out = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        ratios = [r["examples_per_s"] / baseline(r, base) for r in mine]
        gaps = [r["sync_gap_mean"] for r in mine if "sync_gap_mean" in r
                and not math.isnan(r["sync_gap_mean"])]
        examples = [r["examples_per_s"] * r["train_seconds"] for r in mine]
        wire = [r["wire_bytes"] / e for r, e in zip(mine, examples, strict=True)
                if "wire_bytes" in r]
        # Sync payload on the wire: a ring allreduce sends 2 (W - 1) / W of the buffer per rank.
        sync = [r["sync_bytes_reduced"] * 2 * (world_size - 1) / e
                for r, e in zip(mine, examples, strict=True) if "sync_bytes_reduced" in r]
        per_seed = first_per_seed(mine)  # eval NE is NaN in turns (one model)
        reckoned = [r["sync_busy_share"] * r["sync_round_cost"] for r in mine
                    if not math.isnan(r.get("sync_busy_share", math.nan))
                    and not math.isnan(r.get("sync_round_cost", math.nan))]
        out.append({
            "arm": arm,
            "runs": len(mine),
            "examples_per_s": statistics.median(r["examples_per_s"] for r in mine),
            "by_run": {(r["seed"], r["repeat"]): q for r, q in zip(mine, ratios, strict=True)},
            "ratio": _spread(ratios),
            "gap": statistics.fmean(gaps) if gaps else math.nan,
            "wire_per_example": statistics.fmean(wire) if wire else math.nan,
            "sync_per_example": statistics.fmean(sync) if sync else 0.0,
            "ne": mean_of(per_seed, "eval_ne"),
            "ne_sd": stdev_of(per_seed, "eval_ne"),
            "reckoned": statistics.fmean(reckoned) if reckoned else math.nan,
        })
    return out


def paired_min(shadow: dict[str, Any], fr: dict[str, Any]) -> float:
    """The smallest ``shadow / fr`` ratio to ``none`` over the runs both made (same seed and
    repeat, minutes apart in one job); NaN if none. Against one ``none`` run per repeat that is
    their examples/s's ratio: the machine's speed drifts between repeats (on shared cores,
    ``none``'s own runs differ), which a ratio to that run carries into every arm, and two arms
    of the same repeat share most of it. Bracketed turns (``bench_sync --bracket``) each have
    their own baseline, taken seconds away, so there each arm's ratio is already paired."""
    both = shadow["by_run"].keys() & fr["by_run"].keys()
    return min((shadow["by_run"][k] / fr["by_run"][k] for k in both), default=math.nan)


def dominance(arms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each FR point: the shadow arms of the same wire dtype (equal bytes a round) that reach
    at least its examples/s with at most its mean sync gap, judged three ways: paired (in every
    repeat, as :func:`paired_min`), on the whole spread of ratios to ``none`` (shadow's worst
    repeat against FR's best), and on medians."""
    rows = []
    for fr in (a for a in arms if a["arm"].startswith("FR ")):
        shadow = [a for a in arms if a["arm"].startswith("S ")
                  and wire_tag(a["arm"]) == wire_tag(fr["arm"]) and a["gap"] <= fr["gap"]]
        paired = {s["arm"]: paired_min(s, fr) for s in shadow}
        rows.append({
            "fr": fr["arm"],
            "paired": {arm: m for arm, m in paired.items() if m >= 1.0},
            "strict": [s["arm"] for s in shadow if s["ratio"]["min"] >= fr["ratio"]["max"]],
            "median": [s["arm"] for s in shadow
                       if s["ratio"]["median"] >= fr["ratio"]["median"]],
        })
    return rows


# "Frequent synchronization at almost no throughput cost" (the paper's claim), as a floor.
NO_COST = 0.98


def no_cost(arms: list[dict[str, Any]], keep: float = NO_COST) -> list[dict[str, Any]]:
    """Per wire dtype: the smallest mean sync gap that shadow and FR each reach while keeping
    ``keep`` of ``none``'s examples/s, on the whole spread of ratios (the arm's worst repeat)
    and on the median; None where no arm of the kind keeps it."""
    rows = []
    for tag in dict.fromkeys(wire_tag(a["arm"]) for a in arms
                             if a["arm"].startswith(("S ", "FR "))):
        row: dict[str, Any] = {"wire": tag.strip() or "float32"}
        for kind in ("S ", "FR "):
            mine = [a for a in arms if a["arm"].startswith(kind) and wire_tag(a["arm"]) == tag
                    and not math.isnan(a["gap"])]
            for how in ("min", "median"):
                kept = [a for a in mine if a["ratio"][how] >= keep]
                row[f"{kind.strip()}_{how}"] = min(kept, key=lambda a: a["gap"], default=None)
        rows.append(row)
    return rows


def no_cost_table(rows: list[dict[str, Any]], keep: float = NO_COST) -> str:
    def cell(a: dict[str, Any] | None) -> str:
        return "**none**" if a is None else f"{a['arm']} (gap {a['gap']:.1f})"

    return markdown_table(
        ["wire", f"shadow, whole spread >= {keep}", f"shadow, median >= {keep}",
         f"FR, whole spread >= {keep}", f"FR, median >= {keep}"],
        [[r["wire"], cell(r["S_min"]), cell(r["S_median"]), cell(r["FR_min"]),
          cell(r["FR_median"])] for r in rows], "lllll")


def slowdown_budgets(arms: Mapping[str, str]) -> dict[str, float]:
    """Each arm's ``sync.schedule.max_slowdown`` from its overrides as the job's ``.cmd``
    records them (:func:`scaling_model.arm_overrides`; the last one given wins, as in the
    config, and the flat ``sync.max_slowdown`` of earlier records counts as well:
    :func:`scaling_model.override_dict`); arms without one are left out."""
    budgets = {}
    for name, overrides in arms.items():
        given = override_dict(shlex.split(overrides))
        if given.get("sync.schedule.max_slowdown", "null") != "null":
            budgets[name] = float(given["sync.schedule.max_slowdown"])
    return budgets


def slowdown_goal(arms: list[dict[str, Any]], budgets: Mapping[str, float] | None = None
                  ) -> list[dict[str, Any]]:
    """For each accepted-slowdown arm: its ratio to ``none`` against the ``1 - p`` it was
    asked to keep (met only when its whole spread clears it), the loss the pacer reckoned it
    caused (:func:`summarize`), its mean sync gap, and the FR
    arm of the same wire dtype with the closest median throughput, with how many times less
    often that FR arm synchronizes. ``budgets`` (:func:`slowdown_budgets`) gives each arm's
    ``p`` as its job ran it; without them ``p`` is read from labels ``S <p>%...``."""
    rows = []
    for a in arms:
        if budgets is not None:
            budget = budgets.get(a["arm"])
        else:
            match = re.match(r"S (\d+(?:\.\d+)?)%", a["arm"])
            budget = float(match.group(1)) / 100 if match else None
        fr = [f for f in arms if f["arm"].startswith("FR ")
              and wire_tag(f["arm"]) == wire_tag(a["arm"])]
        if budget is None or not fr:
            continue
        keep = 1 - budget
        near = min(fr, key=lambda f: abs(f["ratio"]["median"] - a["ratio"]["median"]))
        rows.append({"arm": a["arm"], "keep": keep, "ratio": a["ratio"], "gap": a["gap"],
                     "kept": a["ratio"]["min"] >= keep, "reckoned": a["reckoned"],
                     "fr": near["arm"],
                     "fr_ratio": near["ratio"]["median"], "fr_gap": near["gap"],
                     "less_often": near["gap"] / a["gap"]})
    return rows


def slowdown_table(rows: list[dict[str, Any]]) -> str:
    return markdown_table(
        ["accepted-slowdown arm", "asked to keep", "ratio to none, median [min, max]",
         "whole spread kept", "loss the pacer reckoned", "mean sync gap",
         "FR of closest throughput (its ratio, gap)", "FR syncs this many times less often"],
        [[g["arm"], f"{g['keep']:.2f}", _ratio(g["ratio"]), "yes" if g["kept"] else "**no**",
          or_dash(g["reckoned"], ".1%"), _f(g["gap"], 1),
          f"{g['fr']} ({g['fr_ratio']:.3f}, {_f(g['fr_gap'], 1)})", _f(g["less_often"], 1)]
         for g in rows], "lrrlrrlr")


def footprint_table(rows: list[dict[str, Any]]) -> str:
    """Where each traced arm's cost lands (:func:`rows.footprint`); empty without traces."""
    arms = footprint(rows)
    if not arms:
        return ""
    lines = []
    for arm, kinds in arms.items():
        busy = sum(share for k, (_, _, share) in kinds.items() if k.startswith("busy"))
        cells = [f"{kinds[k][0]:+.1%} ({kinds[k][1]})" if k in kinds else "-"
                 for k in STEP_KINDS]
        lines.append([arm, f"{kinds['all'][0]:+.1%}", f"{busy:+.1%}",
                      f"{kinds['all'][0] - busy:+.1%}", *cells])
    body = markdown_table(["arm", "loss of step rate", "on busy steps", "on quiet steps",
                           *STEP_KINDS], lines, "l" + "r" * (3 + len(STEP_KINDS)))
    return ("Where the cost lands (`--trace`): each kind of step's mean excess over the `none` "
            "pace beside its turn (how many steps); *busy k*: the k-th step of a run that "
            "synchronization touched (a snapshot, a delta, a round in flight or, for FR, the "
            "blocking round); *quiet k*: k steps after the last of them; the two sums: each "
            "kind's share of the loss.\n\n" + body + "\n\n")


def _f(x: float, digits: int = 3) -> str:
    return or_dash(x, f",.{digits}f")


def _ratio(r: Mapping[str, float]) -> str:
    """A ratio's ``{"median", "min", "max"}`` as ``median [min, max]``."""
    return spread(r["median"], r["min"], r["max"])


def table(arms: list[dict[str, Any]]) -> str:
    cells = []
    for a in arms:
        ne = _f(a["ne"], 4) + ("" if math.isnan(a["ne_sd"]) else f" ± {a['ne_sd']:.4f}")
        cells.append([a["arm"], f"{a['examples_per_s']:,.0f}", _ratio(a["ratio"]),
                      _f(a["gap"], 1), _f(a["wire_per_example"], 0),
                      _f(a["sync_per_example"], 0), ne])
    return markdown_table(["arm", "examples/s", "ratio to none, median [min, max]",
                           "mean sync gap", "link bytes/example", "sync bytes/example",
                           "eval NE"], cells, "lrrrrrr")


def dominance_table(rows: list[dict[str, Any]]) -> str:
    cells = []
    for d in rows:
        paired = ", ".join(f"{arm} ({m:.2f})" for arm, m in d["paired"].items())
        cells.append([d["fr"], paired or "**none**", ", ".join(d["strict"]) or "**none**",
                      ", ".join(d["median"]) or "**none**"])
    return markdown_table(["FR point", "shadow arms at >= its examples/s and <= its gap: in "
                           "every repeat (least shadow/FR)", "whole spread of ratios to none",
                           "medians"], cells)


def plot(link: str, jobs: dict[int, list[dict[str, Any]]], path: Path) -> None:
    """Throughput ratio against mean sync gap: the FR curve and the shadow curve per host
    count, DDP as a point at gap 1 (it synchronizes gradients every step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {2: "o", 4: "s", 8: "^"}
    curves = [(prefix, tag, color, f"{label}{tag}")
              for tag in WIRE_TAGS.values()
              for prefix, color, label in (
                  ("FR ", "tab:blue" if not tag else "tab:cyan", "fixed rate (FR-k)"),
                  ("S ", "tab:red" if not tag else "tab:orange", "shadow (accepted slowdown)"))]
    for hosts, arms in sorted(jobs.items()):
        for prefix, tag, color, label in curves:
            pts = sorted((a for a in arms if a["arm"].startswith(prefix)
                          and wire_tag(a["arm"]) == tag), key=lambda a: a["gap"])
            if not pts:
                continue
            xs = [a["gap"] for a in pts]
            ys = [a["ratio"]["median"] for a in pts]
            err = [[y - a["ratio"]["min"] for y, a in zip(ys, pts, strict=True)],
                   [a["ratio"]["max"] - y for y, a in zip(ys, pts, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, color=color, marker=markers.get(hosts, "o"),
                        linestyle="-" if hosts == 2 else "--", capsize=3,
                        label=f"{label}, {hosts} hosts")
            for a in pts:
                ax.annotate(a["arm"].split(" ", 1)[1], (a["gap"], a["ratio"]["median"]),
                            fontsize=6, textcoords="offset points", xytext=(3, 3))
        ddp = [a for a in arms if a["arm"] == "ddp"]
        if ddp:
            ax.scatter([1.0], [ddp[0]["ratio"]["median"]], color="black",
                       marker=markers.get(hosts, "o"), label=f"DDP, {hosts} hosts")
    ax.set_xscale("log")
    ax.set_xlabel("mean sync gap (training steps between applied syncs; lower is better)")
    ax.set_ylabel("examples/s / none's (higher is better)")
    ax.set_title(f"Throughput vs synchronization frequency, links {link}")
    ax.axhline(1.0, color="gray", linewidth=0.5)
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def aa_line(arms: list[dict[str, Any]]) -> str:
    """What the job's A/A arm read against ``none`` (a paragraph), or '' without one."""
    aa = next((a for a in arms if a["arm"] == AA_ARM), None)
    if aa is None:
        return ""
    r = aa["ratio"]
    return (f"A/A: a second `none` arm read {r['median']:.3f} [{r['min']:.3f}, {r['max']:.3f}] "
            "of the first, repeat by repeat: two identical arms differ by this much in this "
            "job.\n\n")


def budget_line(goals: list[dict[str, Any]], aa: list[dict[str, Any]]) -> str:
    """Accepted-slowdown arms of many jobs at once (a paragraph; '' without one): how far
    each median's loss (``1 - ratio``) fell from its budget and from what the pacer reckoned,
    as mean and standard deviation over the arms, beside the scatter of the A/A arms' medians,
    which no pacer can go below. One job cannot tell whether a pacer keeps its budget (its
    spread is the rig's); many jobs can, on average."""
    if not goals:
        return ""

    def mean_sd(values: list[float]) -> str:
        sd = statistics.pstdev(values) if len(values) > 1 else math.nan
        return f"{100 * statistics.fmean(values):+.1f} ± {_f(100 * sd, 1)} points"

    loss = [1 - g["ratio"]["median"] for g in goals]
    over = [x - (1 - g["keep"]) for x, g in zip(loss, goals, strict=True)]
    reckoned = [x - g["reckoned"] for x, g in zip(loss, goals, strict=True)
                if not math.isnan(g["reckoned"])]
    text = (f"Every accepted-slowdown arm of the bracketed jobs below at once ({len(goals)} "
            f"arms): the loss of its median against its budget {mean_sd(over)} (mean ± sd "
            f"over the arms; {sum(x <= 0 for x in over)} within it)")
    if reckoned:
        text += f", and against the loss its pacer reckoned {mean_sd(reckoned)}"
    if len(aa) > 1:
        scatter = statistics.pstdev([1 - a["ratio"]["median"] for a in aa])
        text += (f"; the A/A arms' medians scatter by {100 * scatter:.1f} points (sd over "
                 f"{len(aa)} jobs)")
    return text + ". Jobs ran different revisions of the pacer (FINDINGS says which).\n\n"


def device_line(ms: float) -> str:
    """What a job's device wait was (a paragraph), or '' without one."""
    if not ms:
        return ""
    return (f"Emulated GPU trainers (`--device-step-ms {ms:g}`): after every step each rank's "
            f"training thread waited {ms:g} ms holding neither a core nor the GIL, as a host "
            "thread waits on its device (`bench_sync.py`'s `DeviceWait` says what that models "
            "and what it does not).\n\n")


def interleave_line(block: int | None, bracketed: bool = False) -> str:
    """What an interleaved job's rows are (a paragraph), or '' for separate runs."""
    if block is None:
        return ""
    compared = ("a `none` turn ran before every other turn (`--bracket`), and each turn is "
                "compared with the mean of the `none` turns just before and after it"
                if bracketed else
                "each turn is compared with `none`'s turn of the same cycle, seconds apart")
    return (f"Interleaved (`--interleave {block}`): the arms took turns of {block} steps on one "
            "model in one process (`bench_sync.py`'s `RotatingReplicas`); a repeat is one cycle "
            f"of turns, and {compared}. One model, so no eval NE per arm.\n\n")


def report(out: Path, links: Sequence[str]) -> str:
    """``report.md`` and one plot per link from every raw file under ``out``."""
    sections = []
    by_link: dict[str, dict[int, list[dict[str, Any]]]] = {}
    commands: dict[tuple[str, int], str] = {}
    turns: dict[tuple[str, int], int | None] = {}  # --interleave's turn length, if any
    bracketed: dict[tuple[str, int], bool] = {}
    device_ms: dict[tuple[str, int], float] = {}
    footprints: dict[tuple[str, int], str] = {}
    goals: list[dict[str, Any]] = []
    aas: list[dict[str, Any]] = []
    for raw in sorted((out / "raw").glob("h*_*.json")):
        hosts_s, link = raw.stem.split("_", 1)
        hosts = int(hosts_s[1:])
        rows = json.loads(raw.read_text())
        arms = summarize(rows, hosts)
        by_link.setdefault(link, {})[hosts] = arms
        turns[(link, hosts)] = rows[0].get("interleave") if rows else None
        bracketed[(link, hosts)] = any("baseline_examples_per_s" in r for r in rows)
        device_ms[(link, hosts)] = rows[0].get("device_step_ms", 0.0) if rows else 0.0
        footprints[(link, hosts)] = footprint_table(rows)
        cmd = raw.with_suffix(".cmd")
        commands[(link, hosts)] = cmd.read_text() if cmd.exists() else "(not recorded)\n"
    order = [link for link in links if link in by_link] + sorted(set(by_link) - set(links))
    for link in order:
        plot(link, by_link[link], out / f"frontier_{link}.png")
        for hosts, arms in sorted(by_link[link].items()):
            command, *arm_lines = commands[(link, hosts)].splitlines()
            recorded = arm_overrides(arm_lines)
            arm_list = "".join(f"- `{name}: {o}`\n" for name, o in recorded.items())
            goal = slowdown_goal(arms, slowdown_budgets(recorded) if recorded else None)
            if bracketed[(link, hosts)]:  # one way of measuring, so one scatter
                goals += goal
                aas += [a for a in arms if a["arm"] == AA_ARM]
            sections.append(f"### {hosts} hosts, links {link}\n\n"
                            f"Command: `{command}`\n\n"
                            + device_line(device_ms[(link, hosts)])
                            + interleave_line(turns[(link, hosts)], bracketed[(link, hosts)])
                            + f"{table(arms)}\n\n"
                            + aa_line(arms)
                            + f"{dominance_table(dominance(arms))}\n\n"
                            + f"The most frequent synchronization at >= {NO_COST} of `none`'s "
                            f"examples/s:\n\n{no_cost_table(no_cost(arms))}\n\n"
                            + (f"{slowdown_table(goal)}\n\n" if goal else "")
                            + footprints[(link, hosts)]
                            + (f"<details><summary>arms</summary>\n\n{arm_list}\n</details>\n"
                               if arm_list else ""))
        sections.append(f"![frontier at {link}](frontier_{link}.png)\n")
    text = ("# Frontier: throughput against sync frequency on emulated links\n\n"
            "Links tagged `-qos` carry the FR and shadow arms' sync traffic in a low traffic "
            "class (`--sync-class low`: each link serves it after training's packets); the "
            "others are one FIFO per link, where shadow rounds go in chunks. `n10`/`n19`: the "
            "shadow thread at `sync.transport.thread_nice` 10/19; `s<K>`: "
            "`sync.schedule.max_staleness=K` (each round awaited K steps after its snapshot). "
            "Each job's command (its batch size among its overrides) and every arm's "
            "overrides are under it; \"in every repeat\" compares runs of the same repeat, "
            "minutes apart in one job.\n\n" + budget_line(goals, aas) + "\n".join(sections))
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--links", nargs="+", default=["unlimited", "10gbit", "1gbit",
                                                       "200mbit"])
    parser.add_argument("--config", default="dlrm_reference")
    parser.add_argument("--algorithm", default="ma", choices=["ma", "easgd", "bmuf"])
    parser.add_argument("--periods", type=int, nargs="+", default=list(FR_PERIODS))
    parser.add_argument("--shadow", nargs="+", default=list(SHADOW),
                        help="shadow arms as 'label: overrides', e.g. 'b2b n10: "
                             "sync.schedule.max_slowdown=null sync.transport.thread_nice=10'")
    parser.add_argument("--shadow-common", default=SHADOW_COMMON,
                        help="overrides every shadow arm gets")
    parser.add_argument("--chunk-ms", type=float, default=None,
                        help="shadow rounds in chunks of this much link time (0: no chunks; "
                             f"default {CHUNK_MS} with --sync-class same, else 0)")
    parser.add_argument("--wires", nargs="+", default=["float32"], choices=list(WIRE_TAGS),
                        help="wire dtypes of the FR and shadow arms (each gets both curves)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3,
                        help="repeats of each arm; with --interleave, timed cycles of turns")
    parser.add_argument("--interleave", type=int, metavar="B",
                        help="arms take turns of B steps on one model (bench_sync "
                             "--interleave; no ddp arm, --steps unused); B must be a multiple "
                             "of every FR period")
    parser.add_argument("--bracket", action="store_true",
                        help="with --interleave: a none turn before every other turn, each "
                             "turn compared with the none turns beside it (bench_sync "
                             "--bracket)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--job-timeout-s", type=float, default=3600.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/frontier")
    parser.add_argument("--skip-done", action="store_true",
                        help="skip (hosts, link) jobs whose raw JSON exists")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--tag", default="", help="suffix of this sweep's job names")
    parser.add_argument("--pin-cpus", action="store_true",
                        help="run host i on CPU i mod n (see Cluster.launch)")
    parser.add_argument("--aa", action="store_true",
                        help=f"add a second none arm ({AA_ARM!r}): the spread between "
                             "identical arms")
    parser.add_argument("--sync-class", choices=("same", "low"), default="low",
                        help="low (default): the FR and shadow arms' sync traffic in a low "
                             "traffic class on every link (cluster.py --sync-class); same: one "
                             "FIFO per link")
    parser.add_argument("--trace", action="store_true",
                        help="with --interleave --bracket: time every step and mark the ones "
                             "synchronization touched (bench_sync --trace); the report then "
                             "shows where each arm's cost lands")
    parser.add_argument("--device-step-ms", type=float, default=0.0, metavar="D",
                        help="emulated GPU trainers: every step of every arm waits D ms "
                             "without a core or the GIL (bench_sync --device-step-ms)")
    parser.add_argument("overrides", nargs="*", help="overrides common to every arm")
    args = parser.parse_args(argv)
    if args.bracket and not args.interleave:
        parser.error("--bracket needs --interleave")
    if args.trace and not args.bracket:
        parser.error("--trace needs --interleave --bracket (steps are set against none's pace)")
    if args.device_step_ms < 0 or not math.isfinite(args.device_step_ms):
        parser.error(f"--device-step-ms must be >= 0, got {args.device_step_ms}")
    if args.chunk_ms is None:
        args.chunk_ms = CHUNK_MS if args.sync_class == "same" else 0.0
    (args.out / "raw").mkdir(parents=True, exist_ok=True)
    command = command_line("shadowsync.benchmarks.frontier", argv)
    if not args.report_only:
        for hosts in args.hosts:
            for link in args.links:
                name = job_name(hosts, link, args.tag)
                if args.skip_done and (args.out / "raw" / f"{name}.json").exists():
                    continue
                try:
                    rc = run_job(args.out, hosts, link, args, command)
                except ClusterError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return 2
                except Interrupted as exc:
                    print(f"frontier: {exc} received; cluster removed, finished jobs kept",
                          file=sys.stderr)
                    return 128 + exc.signum
                if rc != 0:
                    print(f"error: job {name} failed (exit {rc}); its log is "
                          f"{args.out / 'raw' / name}.log", file=sys.stderr)
                    return 1
    print(report(args.out, args.links))
    return 0


if __name__ == "__main__":
    sys.exit(main())
