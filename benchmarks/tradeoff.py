"""Reading the frontier (:mod:`.frontier`): each arm's examples/s as a ratio to ``none``
against its sync gap, which arm dominates which in every cycle, the most frequent sync each
kind keeps at no cost, the accepted-slowdown goals, and ``report.md`` with its tables and
plots."""

from __future__ import annotations

import json
import math
import re
import shlex
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shadowsync.benchmarks.report import markdown_table, median_spread, or_dash, spread
from shadowsync.benchmarks.rows import (
    STEP_KINDS,
    baseline,
    first_per_seed,
    footprint,
    mean_of,
    stdev_of,
)
from shadowsync.benchmarks.scaling_model.overrides import arm_overrides, override_dict

WIRE_TAGS = {"float32": "", "bfloat16": " bf16", "float16": " fp16", "int8": " int8"}

AA_ARM = "none A/A"  # a second none arm (--aa): what two identical arms read apart


def wire_tag(arm: str) -> str:
    """The wire-dtype suffix of an arm's name ('' for float32)."""
    return next((t for t in WIRE_TAGS.values() if t and arm.endswith(t)), "")


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
    records them (:func:`.scaling_model.overrides.arm_overrides`; the last one given wins, as in the
    config, and the flat ``sync.max_slowdown`` of earlier records counts as well:
    :func:`.scaling_model.overrides.override_dict`); arms without one are left out."""
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


def device_line(ms: float | Sequence[float]) -> str:
    """What a job's device wait was (a paragraph: one value, or one a host), or '' without
    one."""
    waits = [ms] if isinstance(ms, int | float) else list(ms)
    if not any(waits):
        return ""
    flag, each = " ".join(f"{w:g}" for w in waits), "/".join(f"{w:g}" for w in waits)
    whose = "" if len(waits) == 1 else " (host 0, host 1, ...: a straggler)"
    return (f"Emulated GPU trainers (`--device-step-ms {flag}`): after every step each rank's "
            f"training thread waited {each} ms{whose} holding neither a core nor the GIL, as a "
            "host thread waits on its device (`bench_sync.py`'s `DeviceWait` says what that "
            "models and what it does not).\n\n")


def host_table(rows: list[dict[str, Any]]) -> str:
    """Each host's own pace in a bracketed job (a paragraph with a table), or '' where the
    rows lack it: per arm and host, examples/s (median over cycles) and its ratio to that
    host's own ``none`` turns beside it, median [min, max]. With one host slower than the
    other (a straggler), what the fast one keeps of its pace alone."""
    timed = [r for r in rows if r.get("host_baseline_seconds")]
    if not timed or len(timed[0]["host_seconds"]) < 2:
        return ""
    hosts = range(len(timed[0]["host_seconds"]))
    table_rows = []
    for arm in dict.fromkeys(r["arm"] for r in timed):
        mine = [r for r in timed if r["arm"] == arm]
        cells: list[object] = [arm]
        for h in hosts:
            # a host's examples: the job's per turn over its hosts
            rate = [r["examples_per_s"] * r["train_seconds"] / len(hosts) / r["host_seconds"][h]
                    for r in mine]
            ratio = [r["host_baseline_seconds"][h] / r["host_seconds"][h] for r in mine]
            cells += [f"{statistics.median(rate):,.0f}", median_spread(ratio)]
        table_rows.append(cells)
    header = ["arm"] + [f"host {h} {what}" for h in hosts
                        for what in ("examples/s", "ratio to its none")]
    return ("Each host's own pace (its slowest rank's turn), against its own `none` turns "
            "beside it:\n\n" + markdown_table(header, table_rows, "l" + "r" * (2 * len(hosts)))
            + "\n\n")


def interleave_line(block: int | None, bracketed: bool = False) -> str:
    """What an interleaved job's rows are (a paragraph), or '' for separate runs."""
    if block is None:
        return ""
    compared = ("a `none` turn ran before every other turn (`--bracket`), and each turn is "
                "compared with the mean of the `none` turns just before and after it"
                if bracketed else
                "each turn is compared with `none`'s turn of the same cycle, seconds apart")
    return (f"Interleaved (`--interleave {block}`): the arms took turns of {block} steps on one "
            "model in one process (`turns.py`'s `RotatingReplicas`); a repeat is one cycle "
            f"of turns, and {compared}. One model, so no eval NE per arm.\n\n")


def report(out: Path, links: Sequence[str]) -> str:
    """``report.md`` and one plot per link from every raw file under ``out``."""
    sections = []
    by_link: dict[str, dict[int, list[dict[str, Any]]]] = {}
    commands: dict[tuple[str, int], str] = {}
    turns: dict[tuple[str, int], int | None] = {}  # --interleave's turn length, if any
    bracketed: dict[tuple[str, int], bool] = {}
    device_ms: dict[tuple[str, int], float | list[float]] = {}
    per_host: dict[tuple[str, int], str] = {}
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
        device_ms[(link, hosts)] = (rows[0].get("device_step_ms_by_host",
                                                rows[0].get("device_step_ms", 0.0))
                                    if rows else 0.0)
        per_host[(link, hosts)] = host_table(rows)
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
                            + per_host[(link, hosts)]
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
