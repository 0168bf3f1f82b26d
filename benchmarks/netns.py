"""The emulated cluster's plumbing (:mod:`.cluster`): the names, addresses and rates of its
hosts and links, the ``ip``/``tc`` calls, and finding and removing clusters' namespaces."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

PREFIX = "ssc"

HOST_IF = "veth0"

SYNC_IF = f"{HOST_IF}:sync"  # address alias that the low traffic class matches

# `ip netns exec NS` bind-mounts /etc/netns/NS/<file> over /etc/<file>: each host gets a hosts
# file that names every host, so c10d's reverse lookups of peers succeed (no "hostname of the
# client socket cannot be retrieved" warnings) without DNS, which no namespace can reach.
ETC_NETNS = Path("/etc/netns")

MAX_HOSTS = 254

SUBNET = "198.18.0"  # inside 198.18.0.0/15 (RFC 2544, benchmarking); one /24 per cluster

SYNC_SUBNET = "198.18.1"  # the hosts' second addresses, under --sync-class low

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)$", re.I)

_SIZE = re.compile(r"^(\d+)(b|k|kb|m|mb)?$", re.I)

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
               "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9}

_SIZE_UNITS = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2}

_UNLIMITED = ("unlimited", "none", "")

# tbf's queue: up to this much waiting time before drops (TCP backs off; the rate holds).
TBF_LATENCY = "100ms"


class ClusterError(RuntimeError):
    """The cluster cannot be built or used here; the message is one line for the user."""


def parse_rate(text: str | None) -> int | None:
    """``tc``-style rate (``200mbit``, ``1gbit``, ``125mbps``) to bits/s; ``None`` for
    ``unlimited``. Parsed here, not handed to ``tc`` verbatim, so a typo fails before any
    namespace exists and the burst can be sized from the rate."""
    if text is None or text.strip().lower() in _UNLIMITED:
        return None
    m = _RATE.match(text.strip())
    if not m:
        raise ClusterError(f"rate {text!r}: expected e.g. 200mbit, 1gbit, 125mbps or unlimited")
    bits = int(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()])
    if bits < 8000:
        raise ClusterError(f"rate {text!r}: below 8kbit")
    return bits


def parse_size(text: str | None) -> int | None:
    """``tc``-style size (``256kb``, ``1mb``, ``65536``) to bytes; ``None`` stays ``None``."""
    if text is None:
        return None
    m = _SIZE.match(text.strip())
    if not m:
        raise ClusterError(f"size {text!r}: expected e.g. 64kb, 1mb or a byte count")
    return int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()]


def format_rate(bits: int | None) -> str:
    if bits is None:
        return "unlimited"
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits}bit"


def default_burst(rate_bits: int) -> int:
    """Bucket depth for a rate: 2 ms worth of bytes, at least 32 KiB. A bucket smaller than one
    timer tick's worth of traffic caps the rate below the setting; a much deeper one lets whole
    messages through at memory speed (1 Gbit/s -> 250 KB)."""
    return max(32 * 1024, rate_bits // 8 // 500)


def run_command(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """One ``ip``/``tc`` command (an argument list, never a shell string)."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}")
        raise ClusterError(f"{' '.join(cmd)}: {detail.splitlines()[0]}")
    return proc


def check_environment() -> None:
    """Raises :class:`ClusterError` unless this process can build clusters: root, ``ip`` and
    ``tc`` on ``PATH``, and a kernel with network namespaces."""
    if os.geteuid() != 0:
        raise ClusterError("network namespaces, veths and tc need root: run as root (or sudo)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterError(f"'{tool}' not found on PATH: install iproute2")
    if not Path("/proc/self/ns/net").exists():
        raise ClusterError("this kernel has no network namespaces (/proc/self/ns/net missing)")


def unavailable_reason() -> str | None:
    """Why clusters cannot run here (one line), or ``None`` when they can: the environment check
    plus a namespace actually created and deleted (containers may forbid it even to root)."""
    try:
        check_environment()
        probe_ns = f"{PREFIX}-check{os.getpid()}-sw"
        run_command(["ip", "netns", "add", probe_ns])
        try:
            run_command(["ip", "-n", probe_ns, "link", "set", "lo", "up"])
        finally:
            run_command(["ip", "netns", "del", probe_ns], check=False)
    except ClusterError as e:
        return str(e)
    return None


def list_namespaces() -> list[str]:
    """Every network namespace name that ``ip netns`` knows, ours or not."""
    out = run_command(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cluster_namespaces(name: str) -> list[str]:
    """The namespaces of cluster ``name`` (hosts in order, the switch last): exactly
    ``ssc-<name>-sw`` and ``ssc-<name>-h<i>``, so cluster ``a`` never matches ``a-b``'s."""
    own = re.compile(rf"^{PREFIX}-{re.escape(name)}-(sw|h(\d+))$")
    hosts: list[tuple[int, str]] = []
    switch: list[str] = []
    for ns in list_namespaces():
        m = own.match(ns)
        if m and m.group(2) is not None:
            hosts.append((int(m.group(2)), ns))
        elif m:
            switch.append(ns)
    return [ns for _, ns in sorted(hosts)] + switch


def list_clusters() -> dict[str, int]:
    """Cluster name -> number of hosts, for every cluster this tool left up."""
    pattern = re.compile(rf"^{PREFIX}-(.+)-(sw|h\d+)$")
    found: dict[str, int] = {}
    for ns in list_namespaces():
        m = pattern.match(ns)
        if m:
            found[m.group(1)] = found.get(m.group(1), 0) + (m.group(2) != "sw")
    return found


def kill_namespace_pids(ns: str) -> None:
    """SIGKILL whatever still runs in namespace ``ns`` (only what was launched into it)."""
    proc = run_command(["ip", "netns", "pids", ns], check=False)
    for token in proc.stdout.split():
        if token.isdigit() and int(token) != os.getpid():
            try:
                os.kill(int(token), signal.SIGKILL)
            except ProcessLookupError:
                pass


def down(name: str) -> list[str]:
    """Removes cluster ``name``: kills what runs in its hosts, deletes its namespaces (their
    veths, bridge and ``ifb`` go with them) and their ``/etc/netns`` files. Touches no other
    namespace; returns the ones removed. Safe to call when nothing is up."""
    removed = []
    for ns in cluster_namespaces(name):
        kill_namespace_pids(ns)
        run_command(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    own = re.compile(rf"^{PREFIX}-{re.escape(name)}-(sw|h\d+)$")
    if ETC_NETNS.is_dir():
        for d in ETC_NETNS.iterdir():
            if own.match(d.name):
                shutil.rmtree(d, ignore_errors=True)
        try:
            ETC_NETNS.rmdir()  # only when empty: other clusters' files stay
        except OSError:
            pass
    return removed
