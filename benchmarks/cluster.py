"""An emulated multi-host cluster on one Linux machine (:class:`Cluster`): network namespaces
as hosts, a bridge as the switch, ``tc`` rate limits as the links (rates only: the kernel has
no ``netem``), so a job started here pays for its traffic the way it would between machines.
Addresses and namespaces are :mod:`.netns`'s; the probe's worker is :mod:`.link_probe`. Needs
root; the guide is ``docs/network-testbed.md``::

    python -m shadowsync.benchmarks.cluster run --hosts 2 --rate 1gbit -- \\
        -m shadowsync.pipelines.train --config synthetic train.steps=20
    python -m shadowsync.benchmarks.cluster probe --hosts 2 --rate 200mbit --sizes 1 8 32
    python -m shadowsync.benchmarks.cluster up --name lab --hosts 4 --rate 1gbit
    python -m shadowsync.benchmarks.cluster down --name lab

``run`` launches ``torchrun --nnodes N --nproc_per_node 1 --node_rank i`` on every host (static
rendezvous on host 0), prefixes each output line with ``[h<i>]``, stops every host as soon as
one fails, exits with the worst exit code, and removes the cluster on every exit (a signal
included). Exit code 2 with a one-line ``error:`` when the machine cannot run it (not root, no
``ip``/``tc``, no namespaces).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from shadowsync.benchmarks import link_probe
from shadowsync.benchmarks.netns import (
    ETC_NETNS,
    HOST_IF,
    MAX_HOSTS,
    NAME_PATTERN,
    PREFIX,
    SUBNET,
    SYNC_IF,
    SYNC_SUBNET,
    TBF_LATENCY,
    ClusterError,
    check_environment,
    default_burst,
    down,
    format_rate,
    kill_namespace_pids,
    list_clusters,
    parse_rate,
    parse_size,
    run_command,
)

ROOT = Path(__file__).resolve().parents[1]

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

LineSink = Callable[[int, str], None]


@dataclasses.dataclass(frozen=True)
class Links:
    """How a cluster's links differ from one ``rate`` both ways.

    Attributes:
        up_rate: host-to-switch rate, overriding ``rate`` for that direction.
        down_rate: switch-to-host rate, overriding ``rate`` for that direction.
        burst: token bucket depth (``"256kb"``); default :func:`.netns.default_burst` of each
            rate.
        shared_rate: one limit that all traffic through the switch shares (every host's
            packets, both directions, through one bucket): an oversubscribed uplink or
            backplane. ``None`` for a non-blocking switch.
        sync_class: ``"low"`` adds each host's address on :data:`.netns.SYNC_IF` and serves
            its packets after everything else on every rate-limited link (a strict-priority
            scheduler that lends the low class whatever the high one leaves); ``"same"``
            (default): one FIFO per link, every flow equal.
    """

    up_rate: str | None = None
    down_rate: str | None = None
    burst: str | None = None
    shared_rate: str | None = None
    sync_class: str = "same"


class Cluster:
    """``hosts`` emulated machines on one switch, each on its own rate-limited link.

    Why: to run the real multi-node launch (one ``torchrun`` per host, static rendezvous, gloo
    over a NIC) against a network of a chosen speed, and to sweep that speed from a benchmark
    driver. Building replaces any cluster of the same ``name``; leaving the ``with`` block (an
    exception included) removes it.

    Args:
        hosts: number of hosts (namespaces), 1 to 254.
        rate: per-host link rate in both directions, ``tc`` syntax (``"1gbit"``, ``"200mbit"``);
            ``None`` or ``"unlimited"`` for no limit (no qdisc at all).
        name: cluster name; namespaces are ``ssc-<name>-h<i>`` and ``ssc-<name>-sw``.
        links: directions, bursts, a shared limit and traffic classes (:class:`Links`).

    Example::

        with Cluster(hosts=2, rate="200mbit", name="sweep") as c:
            print(link_probe.probe(c, [8])[0].algbw_MBps)  # ~24 MB/s
            rc = c.launch(["-m", "shadowsync.pipelines.train", "--config", "synthetic",
                           "train.steps=20"])
    """

    def __init__(self, hosts: int = 2, rate: str | None = None, *, name: str = "default",
                 links: Links = Links()) -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ClusterError(f"hosts={hosts}: must be 1..{MAX_HOSTS}")
        if not NAME_PATTERN.match(name):
            raise ClusterError(f"name {name!r}: letters, digits, '_', '.', '-' (32 at most)")
        self.hosts = hosts
        self.name = name
        self.up_bits = parse_rate(links.up_rate if links.up_rate is not None else rate)
        self.down_bits = parse_rate(links.down_rate if links.down_rate is not None else rate)
        self.shared_bits = parse_rate(links.shared_rate)
        self.burst_bytes = parse_size(links.burst)
        if links.sync_class not in ("same", "low"):
            raise ClusterError(f"sync_class {links.sync_class!r}: must be 'same' or 'low'")
        self.sync_class = links.sync_class
        self._is_up = False
        self._previous_handlers: dict[int, Any] = {}

    # -- names -------------------------------------------------------------------------------
    @property
    def switch_ns(self) -> str:
        return f"{PREFIX}-{self.name}-sw"

    def host_ns(self, i: int) -> str:
        """Namespace of host ``i``: ``ip netns exec <this> CMD`` runs CMD on that host."""
        return f"{PREFIX}-{self.name}-h{i}"

    def address(self, i: int) -> str:
        """IPv4 address of host ``i`` (``198.18.0.<i+1>``)."""
        return f"{SUBNET}.{i + 1}"

    def sync_address(self, i: int) -> str:
        """Host ``i``'s address on :data:`SYNC_IF` (with ``sync_class="low"``)."""
        return f"{SYNC_SUBNET}.{i + 1}"

    def describe(self) -> str:
        """One line: hosts, link rates and the shared limit."""
        up, dn = format_rate(self.up_bits), format_rate(self.down_bits)
        link = up if up == dn else f"up {up} / down {dn}"
        shared = f", shared {format_rate(self.shared_bits)}" if self.shared_bits else ""
        low = ", sync traffic in a low class" if self.sync_class == "low" else ""
        return f"cluster {self.name!r}: {self.hosts} hosts, links {link}{shared}{low}"

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self) -> Cluster:
        """Builds the cluster (after removing any of the same name); returns ``self``. On a
        failure midway, removes what was built and raises :class:`ClusterError`."""
        check_environment()
        down(self.name)
        self._is_up = True
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        sw = self.switch_ns
        run_command(["ip", "netns", "add", sw])
        run_command(["ip", "-n", sw, "link", "set", "lo", "up"])
        run_command(["ip", "-n", sw, "link", "add", "br0", "type", "bridge", "forward_delay", "0"])
        run_command(["ip", "-n", sw, "link", "set", "br0", "addrgenmode", "none"])
        run_command(["ip", "-n", sw, "link", "set", "br0", "up"])
        if self.shared_bits is not None:
            run_command(["ip", "-n", sw, "link", "add", "ifb0", "type", "ifb"])
            run_command(["ip", "-n", sw, "link", "set", "ifb0", "up"])
            self._limit(sw, "ifb0", self.shared_bits)
        for i in range(self.hosts):
            ns, port = self.host_ns(i), f"p{i}"
            run_command(["ip", "netns", "add", ns])
            run_command(["ip", "-n", ns, "link", "set", "lo", "up"])
            # Both ends are created where they live: nothing ever appears in the root namespace.
            run_command(["ip", "-n", sw, "link", "add", port, "type", "veth",
                         "peer", "name", HOST_IF, "netns", ns])
            for where, dev in ((sw, port), (ns, HOST_IF)):
                # No IPv6 link-local address: gloo must find exactly one address on veth0.
                run_command(["ip", "-n", where, "link", "set", dev, "addrgenmode", "none"])
            run_command(["ip", "-n", sw, "link", "set", port, "master", "br0"])
            run_command(["ip", "-n", sw, "link", "set", port, "up"])
            run_command(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", HOST_IF])
            if self.sync_class == "low":
                run_command(["ip", "-n", ns, "addr", "add", f"{self.sync_address(i)}/24", "dev",
                             HOST_IF, "label", SYNC_IF])
            run_command(["ip", "-n", ns, "link", "set", HOST_IF, "up"])
            self._write_hosts_file(i)
            self._limit(ns, HOST_IF, self.up_bits)
            self._limit(sw, port, self.down_bits)
            if self.shared_bits is not None:
                # Everything the host sends into the switch detours through ifb0's bucket.
                run_command(["tc", "-n", sw, "qdisc", "add", "dev", port, "ingress"])
                run_command(["tc", "-n", sw, "filter", "add", "dev", port, "parent", "ffff:",
                             "protocol", "all", "u32", "match", "u32", "0", "0",
                             "action", "mirred", "egress", "redirect", "dev", "ifb0"])

    def _write_hosts_file(self, i: int) -> None:
        """The machine's /etc/hosts plus one line per host, for host ``i``'s namespace. Best
        effort: without it (a read-only /etc) c10d only logs warnings."""
        try:
            base = Path("/etc/hosts").read_text()
        except OSError:
            base = "127.0.0.1 localhost\n"
        # The v4-mapped form too: c10d's store listens on a dual-stack socket, so that is how
        # it sees its peers.
        lines = [f"{prefix}{self.address(j)} {self.host_ns(j)}"
                 for prefix in ("", "::ffff:") for j in range(self.hosts)]
        try:
            d = ETC_NETNS / self.host_ns(i)
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text(base.rstrip("\n") + "\n" + "\n".join(lines) + "\n")
        except OSError:
            pass

    def _limit(self, ns: str, dev: str, bits: int | None) -> None:
        if bits is None:
            return
        burst = self.burst_bytes if self.burst_bytes is not None else default_burst(bits)
        if self.sync_class == "same":
            run_command(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                         "rate", f"{bits}bit", "burst", str(burst), "latency", TBF_LATENCY])
            return
        # htb: the link's rate shared by two classes. Training's (1:10, the default) is assured
        # all but 1% of it and goes first; sync's (1:20, packets from the sync subnet) is
        # assured 1% and borrows whatever training leaves. Each class has its own queue, so a
        # training packet waits behind at most one sync packet, never behind a whole round.
        tc = ["tc", "-n", ns]
        low = bits // 100
        run_command([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default",
                     "10"])
        run_command([*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                     "rate", f"{bits}bit", "ceil", f"{bits}bit", "burst", str(burst),
                     "cburst", str(burst)])
        for leaf, rate, prio in (("1:10", bits - low, "0"), ("1:20", low, "1")):
            run_command([*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", leaf, "htb",
                         "rate", f"{rate}bit", "ceil", f"{bits}bit", "burst", str(burst),
                         "cburst", str(burst), "prio", prio])
        run_command([*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
                     "1",
                     "u32", "match", "ip", "src", f"{SYNC_SUBNET}.0/24", "flowid", "1:20"])

    def down(self) -> None:
        """Removes this cluster (see :func:`down`); idempotent."""
        down(self.name)
        self._is_up = False

    def __enter__(self) -> Cluster:
        """Builds the cluster; inside the block (on the main thread) SIGINT, SIGTERM and SIGHUP
        raise :class:`Interrupted`, so a driver that is stopped or killed politely still leaves
        through ``__exit__`` and removes every namespace (Python's default for SIGTERM would
        exit without it)."""
        self._previous_handlers = {}
        if threading.current_thread() is threading.main_thread():
            self._previous_handlers = {s: signal.signal(s, _on_signal) for s in _SIGNALS}
        return self.up()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.down()
        finally:
            for s, handler in self._previous_handlers.items():
                signal.signal(s, handler)

    def traffic(self, i: int) -> tuple[int, int]:
        """Bytes host ``i``'s NIC has sent and received since it was built: proof that a job's
        traffic crossed the emulated links, and its volume."""
        out = run_command(["ip", "-n", self.host_ns(i), "-j", "-s", "link", "show", HOST_IF]).stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])

    # -- running jobs ------------------------------------------------------------------------
    def _free_port(self) -> int:
        """A port free on host 0 now. Asked inside its namespace: each launch gets a port no
        earlier launch's lingering sockets hold."""
        code = (f"import socket; s = socket.socket(); s.bind(('{self.address(0)}', 0)); "
                "print(s.getsockname()[1])")
        out = run_command(["ip", "netns", "exec", self.host_ns(0), sys.executable, "-c",
                           code]).stdout
        return int(out.strip())

    def torchrun_argv(self, i: int, port: int, argv: Sequence[str]) -> list[str]:
        """The full command line for host ``i``: ``ip netns exec`` into it, then the venv's
        torchrun (next to ``sys.executable``, so no ``PATH`` set-up) with a static launch."""
        torchrun = str(Path(sys.executable).parent / "torchrun")
        return ["ip", "netns", "exec", self.host_ns(i), torchrun,
                f"--nnodes={self.hosts}", "--nproc_per_node=1", f"--node_rank={i}",
                f"--master_addr={self.address(0)}", f"--master_port={port}", *argv]

    def launch(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        on_line: LineSink | None = None,
        grace_s: float = 5.0,
        pin_cpus: bool = False,
    ) -> int:
        """Runs one job across all hosts: ``torchrun`` with one node per host; returns the
        worst exit code (signals as ``128 + n``; 124 on timeout).

        When a host's process fails, the others are stopped at once (SIGTERM to their
        torchrun, SIGKILL to anything left in the host after ``grace_s``): a rank blocked in a
        collective with a dead peer would otherwise wait out the process group's timeout. Their
        codes then do not count; the failing hosts' do.

        Whatever still runs in a host once its torchrun has ended is killed: workers run in
        sessions of their own, and one that outlived its agent would hold the output open.

        Args:
            argv: what follows torchrun's own options: ``["script.py", ...]``,
                ``["-m", "module", ...]`` or ``["--no-python", "prog", ...]``. torchrun
                options before the script override these (``["--nproc_per_node", "2", ...]``
                for two ranks per host sharing its link).
            env: extra environment, over ``OMP_NUM_THREADS=1``, ``GLOO_SOCKET_IFNAME=veth0``
                (also ``NCCL_SOCKET_IFNAME``) and ``PYTHONUNBUFFERED=1``, which are set here
                (torchrun leaves OMP alone with one process per node).
            timeout_s: stop every host after this long.
            on_line: called as ``on_line(host, line)`` for each output line (stdout and stderr
                merged); default prints ``[h<host>] line``.
            grace_s: seconds between SIGTERM and SIGKILL when stopping hosts.
            pin_cpus: run host ``i`` (its torchrun, workers and their threads) on CPU
                ``i mod n`` of the ``n`` this process may use, as a real host has CPUs of its
                own: unpinned, the kernel moves one host's synchronizer thread onto the CPU
                another host's trainer needs, a cost no real cluster has. With more hosts
                than CPUs, hosts share CPUs round robin.
        """
        if not self._is_up:
            raise ClusterError(f"cluster {self.name!r} is not up: use up() or a with block")
        torchrun = Path(sys.executable).parent / "torchrun"
        if not torchrun.exists():
            raise ClusterError(f"no torchrun next to {sys.executable}: install torch there")
        sink = on_line or _print_line
        port = self._free_port()
        penv = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": HOST_IF,
                "NCCL_SOCKET_IFNAME": HOST_IF, "PYTHONUNBUFFERED": "1", **(env or {})}
        cpus = sorted(os.sched_getaffinity(0))
        procs: list[subprocess.Popen[bytes]] = []
        readers: list[threading.Thread] = []
        stopped: set[int] = set()
        timed_out = False
        try:
            for i in range(self.hosts):
                proc = subprocess.Popen(
                    self.torchrun_argv(i, port, argv), cwd=ROOT, env=penv,
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: our Ctrl-C is ours to forward
                    preexec_fn=(functools.partial(os.sched_setaffinity, 0,
                                                  {cpus[i % len(cpus)]})
                                if pin_cpus else None))
                procs.append(proc)
                reader = threading.Thread(target=_pump, args=(proc, i, sink), daemon=True)
                reader.start()
                readers.append(reader)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while [p.poll() for p in procs].count(None):  # poll each: any() would stop early
                failed = [i for i, p in enumerate(procs)
                          if p.returncode not in (None, 0) and i not in stopped]
                if failed:
                    if on_line is None:
                        exits = ", ".join(f"h{i} exit {procs[i].returncode}" for i in failed)
                        print(f"cluster: {exits}: stopping the other hosts", file=sys.stderr,
                              flush=True)
                    self._stop(procs, stopped, grace_s)
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    self._stop(procs, stopped, grace_s)
                    break
                time.sleep(0.05)
        finally:
            self._stop(procs, stopped, grace_s)
            for i in range(len(procs)):
                kill_namespace_pids(self.host_ns(i))
            for reader in readers:
                reader.join(timeout=5)
        if timed_out:
            return 124
        codes = [_exit_code(p.returncode) for i, p in enumerate(procs) if i not in stopped]
        return max(codes, default=1)

    def _stop(self, procs: list[subprocess.Popen[bytes]], stopped: set[int],
              grace_s: float) -> None:
        """SIGTERM every host still running (torchrun passes it to its workers), then SIGKILL
        whatever is left in those hosts after ``grace_s``."""
        running = [i for i, p in enumerate(procs) if p.poll() is None]
        for i in running:
            stopped.add(i)
            try:
                os.killpg(procs[i].pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(procs[i].poll() is None for i in running):
            time.sleep(0.05)
        for i in running:
            if procs[i].poll() is None:
                kill_namespace_pids(self.host_ns(i))
                procs[i].wait()


def _exit_code(rc: int | None) -> int:
    if rc is None:
        return 1
    return 128 - rc if rc < 0 else rc


_print_lock = threading.Lock()


def _print_line(host: int, line: str) -> None:
    with _print_lock:
        sys.stdout.write(f"[h{host}] {line}\n")
        sys.stdout.flush()


def _pump(proc: subprocess.Popen[bytes], host: int, sink: LineSink) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        sink(host, raw.decode(errors="replace").rstrip("\r\n"))
    proc.stdout.close()


# -- command line -----------------------------------------------------------------------------
class Interrupted(Exception):
    """A stop signal arrived while a cluster was in use; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Later signals are ignored: teardown must not be cut short by a second Ctrl-C.
    for s in _SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signum)


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="default",
                        help="cluster name: namespaces ssc-NAME-h<i>, ssc-NAME-sw (default: "
                             "%(default)s)")
    parser.add_argument("--hosts", type=int, default=2, help="hosts (default: %(default)s)")
    parser.add_argument("--rate", default=None,
                        help="per-host link rate, both directions: 200mbit, 1gbit, unlimited "
                             "(default: unlimited)")
    parser.add_argument("--up-rate", default=None, help="host-to-switch rate (overrides --rate)")
    parser.add_argument("--down-rate", default=None,
                        help="switch-to-host rate (overrides --rate)")
    parser.add_argument("--burst", default=None,
                        help="token bucket depth, e.g. 256kb (default: 2 ms of the rate, "
                             ">= 32kb)")
    parser.add_argument("--shared-rate", default=None,
                        help="one limit all hosts' traffic through the switch shares "
                             "(an oversubscribed uplink; default: none)")
    parser.add_argument("--sync-class", choices=("same", "low"), default="same",
                        help=f"low: a second address per host on {SYNC_IF}, whose traffic "
                             "every link serves after the rest (pass sync.transport.socket_ifname="
                             f"{SYNC_IF} to the job); same: one FIFO per link (default)")


def _make(args: argparse.Namespace) -> Cluster:
    return Cluster(args.hosts, args.rate, name=args.name, links=Links(
        up_rate=args.up_rate, down_rate=args.down_rate, burst=args.burst,
        shared_rate=args.shared_rate, sync_class=args.sync_class))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shadowsync.benchmarks.cluster",
        description="Emulated multi-host cluster: network namespaces on rate-limited links "
                    "(needs root).",
        epilog="run: python -m shadowsync.benchmarks.cluster run --hosts 2 --rate 1gbit -- "
               "-m shadowsync.pipelines.train --config synthetic train.steps=20")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="build a cluster and leave it up")
    _cluster_args(p)
    p = sub.add_parser("down", help="remove a cluster (only its own namespaces)")
    p.add_argument("--name", default="default")
    sub.add_parser("list", help="clusters that are up")
    p = sub.add_parser("run", help="build, run CMD on every host under torchrun, remove",
                       usage="%(prog)s [options] -- CMD...")
    _cluster_args(p)
    p.add_argument("--timeout", type=float, default=None, help="stop every host after S seconds")
    p.add_argument("--pin-cpus", action="store_true",
                   help="run host i on CPU i mod n, as real hosts have CPUs of their own")
    p = sub.add_parser("probe", help="build, time gloo allreduces across the hosts, remove")
    _cluster_args(p)
    p.add_argument("--sizes", type=float, nargs="+", default=[1.0, 8.0, 32.0],
                   help="allreduce sizes in MB (default: 1 8 32)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--contend-mb", type=float, default=None,
                   help="time each allreduce beside back-to-back allreduces of this size on "
                        "a second group (from the sync address with --sync-class low): what "
                        "background sync traffic costs training's collectives")
    p.add_argument("--json", action="store_true", help="one JSON object per size")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    if args.cmd == "run" and not command:
        print("error: run needs a command after --, e.g. -- -m shadowsync.pipelines.train",
              file=sys.stderr)
        return 2
    if command and args.cmd != "run":
        print(f"error: {args.cmd} takes no command after --", file=sys.stderr)
        return 2
    previous = {s: signal.signal(s, _on_signal) for s in _SIGNALS}
    try:
        if args.cmd == "list":
            check_environment()
            for name, hosts in sorted(list_clusters().items()):
                print(f"{name}\t{hosts} hosts")
            return 0
        if args.cmd == "down":
            check_environment()
            removed = down(args.name)
            print(f"removed {len(removed)} namespaces of cluster {args.name!r}")
            return 0
        cluster = _make(args)
        if args.cmd == "up":
            cluster.up()
            print(cluster.describe())
            for i in range(cluster.hosts):
                print(f"  h{i}: {cluster.address(i)} on {HOST_IF}: "
                      f"ip netns exec {cluster.host_ns(i)} CMD")
            print(f"remove with: python -m shadowsync.benchmarks.cluster down "
                  f"--name {cluster.name}")
            return 0
        with cluster:
            print(f"# {cluster.describe()}", file=sys.stderr, flush=True)
            if args.cmd == "run":
                return cluster.launch(command, timeout_s=args.timeout, pin_cpus=args.pin_cpus)
            results = link_probe.probe(cluster, args.sizes, args.repeats,
                                       contend_mb=args.contend_mb)
        for r in results:
            if args.json:
                print(json.dumps({"size_mb": r.size_mb, "seconds": r.seconds, "hosts": r.hosts,
                                  "algbw_MBps": r.algbw_MBps, "busbw_MBps": r.busbw_MBps}))
        if not args.json:
            print(f"{'size MB':>8}  {'time ms':>9}  {'algbw MB/s':>10}  {'busbw MB/s':>10}")
            for r in results:
                print(f"{r.size_mb:>8g}  {r.seconds * 1e3:>9.1f}  {r.algbw_MBps:>10.1f}  "
                      f"{r.busbw_MBps:>10.1f}")
        return 0
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"cluster: {e} received, cluster removed", file=sys.stderr)
        return 128 + e.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
