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
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from shadowsync.benchmarks.cluster import Cluster, Interrupted, Links
from shadowsync.benchmarks.netns import SYNC_IF, ClusterError, parse_rate
from shadowsync.benchmarks.report import command_line
from shadowsync.benchmarks.tradeoff import AA_ARM, WIRE_TAGS, report

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


def job_name(hosts: int, link: str, tag: str = "") -> str:
    """``h<hosts>_<link>``, plus ``-<tag>`` for a variant (another batch size, say), which the
    report shows as a link of its own."""
    return f"h{hosts}_{link}" + (f"-{tag}" if tag else "")


def run_job(out: Path, hosts: int, link: str, args: argparse.Namespace, command: str) -> int:
    """One bench_sync job over every arm on ``hosts`` hosts linked at ``link``; the sweep's
    command is kept beside its runs (``<job>.cmd``) for the report."""
    name = job_name(hosts, link, args.tag)
    raw = out / "raw" / f"{name}.json"
    argv = [*(["--nproc_per_node", str(args.ranks_per_host)] if args.ranks_per_host > 1 else []),
            "-m", "shadowsync.benchmarks.bench_sync", "--config", args.config,
            "--steps", str(args.steps), "--repeats", str(args.repeats),
            "--seeds", *map(str, args.seeds),
            *(["--interleave", str(args.interleave)] if args.interleave else []),
            *(["--bracket"] if args.bracket else []),
            *(["--trace"] if args.trace else []),
            *(["--device-step-ms", *(f"{d:g}" for d in args.device_step_ms)]
              if any(args.device_step_ms) else []),
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
                      links=Links(sync_class=args.sync_class)) as cluster:
        rc = cluster.launch(argv, on_line=on_line, timeout_s=args.job_timeout_s,
                            pin_cpus=args.pin_cpus)
    print(f"{name}: exit {rc} after {time.perf_counter() - began:.0f} s", flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--ranks-per-host", type=int, default=1, metavar="R",
                        help="ranks on each host, sharing its link (with "
                             "sharding.group_size=local: a replica group a host)")
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
    parser.add_argument("--device-step-ms", type=float, nargs="+", default=[0.0], metavar="D",
                        help="emulated GPU trainers: every step of every arm waits D ms "
                             "without a core or the GIL (bench_sync --device-step-ms); one D "
                             "per host makes a straggler")
    parser.add_argument("overrides", nargs="*", help="overrides common to every arm")
    args = parser.parse_args(argv)
    if args.bracket and not args.interleave:
        parser.error("--bracket needs --interleave")
    if args.trace and not args.bracket:
        parser.error("--trace needs --interleave --bracket (steps are set against none's pace)")
    if args.ranks_per_host < 1:
        parser.error(f"--ranks-per-host must be >= 1, got {args.ranks_per_host}")
    if not all(d >= 0 and math.isfinite(d) for d in args.device_step_ms):
        parser.error(f"--device-step-ms must be >= 0, got {args.device_step_ms}")
    if len(args.device_step_ms) > 1 and [len(args.device_step_ms)] != args.hosts:
        parser.error(f"--device-step-ms: one D per host needs --hosts {len(args.device_step_ms)}")
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
