"""A real Slurm on this machine, for trying ``torchx run -s slurm`` end to end: one node (this
host, all its CPUs) or two emulated ones, with accounting (``sacct``, which torchx reads job
states with) through slurmdbd and a MariaDB of its own. Needs root; the guide is
``docs/launching.md`` (*Try it on a real Slurm on one machine*).

Everything lives in one temporary folder (configs, the munge key and socket, MariaDB's data,
every daemon's state, logs and pid files) that ``SLURM_CONF`` points Slurm's daemons and
commands at: nothing under ``/etc`` is read or written, no system service is started, and the
ports are free ones picked at start. The daemons start in order (munged, MariaDB, slurmdbd,
slurmctld, slurmd), each a child of this process in a session of its own; on every exit (an
exception, Ctrl-C, SIGTERM) the jobs still known to Slurm are cancelled, every daemon is
stopped by its pid (SIGTERM, SIGKILL after a grace), so are the ``slurmstepd`` and job
processes left behind (found by the lab's ``SLURM_CONF`` in their environment), and the folder
is removed. Missing Debian packages are installed first (:mod:`.slurm_setup`)::

    with lab_slurm() as lab:              # lab_slurm(hosts=2): two nodes in the testbed's
        os.environ.update(lab.env)        # namespaces, links at LINK_RATE
        subprocess.run(["sinfo"], check=True)

    python -m shadowsync.benchmarks.slurm_lab up [--hosts 2] [--rate 1gbit]

Exit code 2 with one ``error:`` line when the machine cannot run it (not root, no apt-get, a
daemon that does not come up: its log's last lines follow) or ``--rate`` is malformed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING

from torch.distributed.elastic.utils.distributed import get_free_port

from shadowsync.benchmarks.slurm_setup import (
    CLIENTS,
    CLUSTER,
    DB_NAME,
    PARTITION,
    LabUnavailable,
    conf_field,
    ensure_packages,
    kill_pids,
    leftover_pids,
    missing_packages,
    running,
    slurm_conf,
    slurmdbd_conf,
    this_node_line,
    unavailable_reason,
    which,
    write_file,
)

if TYPE_CHECKING:  # imported where the nodes are namespaces (hosts > 1)
    from shadowsync.benchmarks.cluster import Cluster

_STOP_GRACE_S = 15.0

_LOG_TAIL_LINES = 30

# Each emulated node's link, both directions (``tc`` syntax, as the testbed's ``--rate``): a
# datacenter-like speed at which a test-size job's traffic costs well under a second.
LINK_RATE = "1gbit"


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(text[-lines:])


@dataclasses.dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path  # its own log file (or its captured stdout/stderr)
    output: IO[bytes]

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclasses.dataclass(frozen=True)
class SlurmLab:
    """A running lab Slurm. ``env`` is what a process needs to use it (``SLURM_CONF``);
    :meth:`environ` is this process's environment with it. ``testbed`` is the
    ``benchmarks/cluster.py`` testbed whose host namespaces the nodes run in (node ``i`` on
    host ``i``), or ``None`` for the one node on this host."""

    root: Path
    env: dict[str, str]
    node: str  # the first node (the only one unless ``hosts`` > 1)
    nodes: tuple[str, ...]
    partition: str
    cpus: int
    memory_mb: int
    ports: dict[str, int]
    pids: dict[str, int]  # daemon name -> pid, filled as they start
    testbed: Cluster | None = None

    @property
    def conf(self) -> Path:
        return Path(self.env["SLURM_CONF"])

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), **self.env}

    def run(self, *argv: str, check: bool = True,
            timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Runs a Slurm command (``sinfo``, ``squeue``, ...) against the lab."""
        return subprocess.run(list(argv), env=self.environ(), capture_output=True, text=True,
                              check=check, timeout=timeout)

    def jobs(self) -> list[str]:
        """Ids of the jobs ``squeue`` knows (pending, running, completing)."""
        out = self.run("squeue", "--noheader", "--format=%A").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def node_states(self) -> list[str]:
        """``sinfo``'s state of each node (``idle``, ``alloc``, ...)."""
        out = self.run("sinfo", "--noheader", "--Node", "--format=%t", check=False).stdout
        return out.split()

    def traffic(self) -> dict[str, tuple[int, int]]:
        """Bytes each node's interface has sent and received, ``node -> (tx, rx)``, since the
        testbed was built (:meth:`Cluster.traffic`): what crossed the emulated network, every
        job's and the daemons' traffic together. Raises ``ValueError`` on a one-node lab, whose
        node has no interface of its own."""
        if self.testbed is None:
            raise ValueError("a one-node lab has no network of its own (use hosts > 1)")
        return {node: self.testbed.traffic(i) for i, node in enumerate(self.nodes)}

    def wait_jobs_gone(self, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.jobs():
                return True
            time.sleep(0.5)
        return False


class _Stack:
    """The daemons started so far, stopped in reverse order by pid."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.daemons: list[_Daemon] = []

    def start(self, name: str, argv: Sequence[str], log: Path | None = None) -> _Daemon:
        output_path = self.root / f"{name}.out"
        output = open(output_path, "wb")  # noqa: SIM115 (closed in stop)
        proc = subprocess.Popen(list(argv), env=self.env, stdin=subprocess.DEVNULL,
                                stdout=output, stderr=subprocess.STDOUT, cwd=self.root,
                                start_new_session=True)  # Ctrl-C in a terminal is ours to pass
        daemon = _Daemon(name, proc, log or output_path, output)
        self.daemons.append(daemon)
        return daemon

    def wait_for(self, daemon: _Daemon, ready: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not daemon.alive():
                raise LabUnavailable(
                    f"{daemon.name} exited with code {daemon.proc.returncode} while starting; "
                    f"{daemon.log}:\n{_tail(daemon.log)}\n"
                    f"{_tail(self.root / (daemon.name + '.out'))}")
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if ready():
                    return
            time.sleep(0.2)
        raise LabUnavailable(f"{daemon.name} not ready after {timeout_s:.0f}s; "
                             f"{daemon.log}:\n{_tail(daemon.log)}")

    def stop(self) -> list[str]:
        """Stops every daemon, newest first: SIGTERM, then SIGKILL after a grace. Returns a line
        per daemon that needed SIGKILL."""
        killed = []
        for daemon in reversed(self.daemons):
            if daemon.alive():
                with contextlib.suppress(ProcessLookupError):
                    daemon.proc.send_signal(signal.SIGTERM)
                try:
                    daemon.proc.wait(timeout=_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    killed.append(f"{daemon.name} (pid {daemon.proc.pid}) ignored SIGTERM")
                    with contextlib.suppress(ProcessLookupError):
                        daemon.proc.kill()
                    daemon.proc.wait(timeout=_STOP_GRACE_S)
            daemon.output.close()
        self.daemons.clear()
        return killed


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM raises ``SystemExit(143)`` and SIGINT ``KeyboardInterrupt`` (even where it was
    inherited ignored, as by a shell's background job) so that the caller's ``finally`` runs;
    only in the main thread, where handlers can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """While tearing down, a second Ctrl-C or SIGTERM must not cut the teardown short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _start(stack: _Stack, root: Path, *, kill_wait_s: int, log: Callable[[str], None],
           net: Cluster | None) -> SlurmLab:
    """Starts the daemons; with ``net`` (a testbed of ``benchmarks/cluster.py``, up), each
    node's slurmd runs in a host namespace of its own and the head's daemons (MariaDB,
    slurmdbd, slurmctld) in host 0's, where wrappers on ``PATH`` run the client commands."""
    host = socket.gethostname().split(".")[0]

    def inside(i: int) -> list[str]:
        """The prefix that runs a daemon on host ``i``: its network namespace, its hosts file
        (that names every host) and its hostname (the node's name: torchrun's c10d
        rendezvous hosts the store on the node whose hostname the endpoint names), in mount
        and UTS namespaces of its own. Not ``ip netns exec``, which mounts a /sys without
        /sys/fs/cgroup, and slurmd needs that."""
        if net is None:
            return []
        ns = net.host_ns(i)
        hosts_file = Path("/etc/netns") / ns / "hosts"
        script = (f"hostname {shlex.quote(ns)} && "
                  f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts && "
                  f'exec nsenter --net=/run/netns/{shlex.quote(ns)} "$@"')
        return ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script,
                "sh"]

    ports = {name: get_free_port() for name in ("slurmctld", "slurmd", "slurmdbd", "mariadb")}
    if len(set(ports.values())) < len(ports):
        ports = {name: get_free_port() for name in ports}
    node_line = this_node_line()
    hardware = " ".join(f for f in node_line.split() if not f.startswith("NodeName="))
    cpus = int(conf_field(node_line, "CPUs"))
    memory_mb = int(conf_field(node_line, "RealMemory"))
    if net is None:
        nodes = [(conf_field(node_line, "NodeName"), "127.0.0.1")]
    else:
        nodes = [(net.host_ns(i), net.address(i)) for i in range(net.hosts)]
    ctld_addr = nodes[0][1]
    if net is not None:  # the head's daemons run on host 0, named as it
        host = nodes[0][0]
    env = {"SLURM_CONF": str(root / "slurm.conf")}
    if net is not None:  # the client commands reach slurmctld and slurmdbd from host 0
        bin_dir = root / "bin"
        bin_dir.mkdir()
        for tool in CLIENTS:
            if real := which(tool):
                write_file(bin_dir / tool, f'#!/bin/sh\nexec ip netns exec {net.host_ns(0)} '
                                       f'{real} "$@"\n', mode=0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"

    # munge: key and socket in the lab; munged wants the socket's folder reachable by all
    munge_dir = root / "munge"
    munge_dir.mkdir(mode=0o755)
    munge_dir.chmod(0o755)
    key = root / "munge.key"
    subprocess.run([which("mungekey") or "mungekey", "-c", "-k", str(key)], check=True,
                   capture_output=True, timeout=30)
    munge_socket = munge_dir / "munge.socket"
    munged = stack.start("munged", [
        which("munged") or "munged", "-F", f"--key-file={key}", f"--socket={munge_socket}",
        f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
        f"--seed-file={root}/munged.seed"], log=root / "munged.log")
    stack.wait_for(munged, munge_socket.exists, 20)
    log(f"munged    pid {munged.proc.pid}")

    # MariaDB: its own data directory, socket and port (127.0.0.1 only)
    datadir = root / "mariadb"
    mysql_socket = root / "mariadb.sock"
    install = subprocess.run(
        [which("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
         f"--datadir={datadir}", "--user=root", "--auth-root-authentication-method=socket",
         "--skip-test-db"], capture_output=True, text=True, timeout=120)
    if install.returncode != 0:
        raise LabUnavailable(f"mariadb-install-db failed: {install.stdout[-2000:]}"
                             f"{install.stderr[-2000:]}")
    mariadbd = stack.start("mariadbd", [*inside(0),
        which("mariadbd") or "mariadbd", "--no-defaults", f"--datadir={datadir}",
        f"--socket={mysql_socket}", f"--pid-file={root}/mariadbd.pid", f"--port={ports['mariadb']}",
        "--bind-address=127.0.0.1", "--user=root", "--skip-name-resolve",
        f"--log-error={root}/mariadbd.log", "--innodb-buffer-pool-size=64M",
        "--innodb-log-file-size=16M", "--innodb-lock-wait-timeout=900", "--skip-log-bin"],
        log=root / "mariadbd.log")
    client = [which("mariadb") or "mariadb", "--no-defaults", f"--socket={mysql_socket}",
              "-uroot"]

    def _db_ready() -> bool:
        return subprocess.run([*client, "-e", "SELECT 1"], capture_output=True,
                              timeout=10).returncode == 0

    stack.wait_for(mariadbd, _db_ready, 60)
    password = secrets.token_hex(12)
    grants = "".join(
        f"CREATE USER 'slurm'@'{h}' IDENTIFIED BY '{password}';"
        f"GRANT ALL ON {DB_NAME}.* TO 'slurm'@'{h}';" for h in ("127.0.0.1", "localhost"))
    subprocess.run([*client, "-e", f"CREATE DATABASE {DB_NAME};{grants}FLUSH PRIVILEGES;"],
                   check=True, capture_output=True, timeout=30)
    log(f"mariadbd  pid {mariadbd.proc.pid} (127.0.0.1:{ports['mariadb']}, {mysql_socket})")

    # Slurm: SLURM_CONF names slurm.conf; slurmdbd reads slurmdbd.conf beside it
    (root / "ctld-state").mkdir()
    for name, _addr in nodes:
        (root / f"slurmd-spool-{name}").mkdir()
    write_file(root / "plugstack.conf", "")
    write_file(root / "slurm.conf", slurm_conf(root, host=host, ctld_addr=ctld_addr, nodes=nodes,
                                            hardware=hardware, ports=ports,
                                            munge_socket=munge_socket, kill_wait_s=kill_wait_s))
    write_file(root / "slurmdbd.conf", slurmdbd_conf(root, host=host, ports=ports,
                                                  munge_socket=munge_socket,
                                                  db_password=password), mode=0o600)
    lab = SlurmLab(root=root, env=env, node=nodes[0][0], nodes=tuple(n for n, _ in nodes),
                   partition=PARTITION, cpus=cpus, memory_mb=memory_mb, ports=ports, pids={},
                   testbed=net)
    lab.pids.update(munged=munged.proc.pid, mariadbd=mariadbd.proc.pid)

    def _listening(port: int) -> Callable[[], bool]:
        def ready() -> bool:
            if net is not None:  # 127.0.0.1 of host 0
                return subprocess.run([*inside(0), "bash", "-c", f"</dev/tcp/127.0.0.1/{port}"],
                                      capture_output=True, timeout=10).returncode == 0
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        return ready

    slurmdbd = stack.start("slurmdbd", [*inside(0), which("slurmdbd") or "slurmdbd", "-D"],
                           log=root / "slurmdbd.log")
    stack.wait_for(slurmdbd, _listening(ports["slurmdbd"]), 60)
    added = lab.run("sacctmgr", "--immediate", "add", "cluster", CLUSTER,
                    check=False)
    if added.returncode != 0:
        raise LabUnavailable(f"sacctmgr add cluster {CLUSTER} failed: {added.stdout}"
                             f"{added.stderr}; slurmdbd.log:\n{_tail(root / 'slurmdbd.log')}")
    lab.pids["slurmdbd"] = slurmdbd.proc.pid
    log(f"slurmdbd  pid {slurmdbd.proc.pid} (127.0.0.1:{ports['slurmdbd']})")

    slurmctld = stack.start("slurmctld", [*inside(0), which("slurmctld") or "slurmctld", "-D",
                                          "-i"], log=root / "slurmctld.log")
    stack.wait_for(slurmctld, lambda: lab.run("scontrol", "ping", check=False).returncode == 0
                   and "UP" in lab.run("scontrol", "ping", check=False).stdout, 60)
    lab.pids["slurmctld"] = slurmctld.proc.pid
    log(f"slurmctld pid {slurmctld.proc.pid} ({ctld_addr}:{ports['slurmctld']})")

    slurmds = []
    for i, (name, _addr) in enumerate(nodes):
        daemon = f"slurmd-{name}" if net is not None else "slurmd"
        slurmds.append(stack.start(daemon, [*inside(i), which("slurmd") or "slurmd", "-D",
                                            "-N", name], log=root / f"slurmd-{name}.log"))
        lab.pids[daemon] = slurmds[-1].proc.pid
    for slurmd in slurmds:
        stack.wait_for(slurmd, lambda: lab.node_states() == ["idle"] * len(nodes), 60)
    for slurmd, (name, addr) in zip(slurmds, nodes, strict=True):
        log(f"slurmd    pid {slurmd.proc.pid} (node {name} at {addr}: {cpus} CPUs, "
            f"{memory_mb} MB, idle)")
    return lab


def _teardown(stack: _Stack, root: Path, lab: SlurmLab | None,
              log: Callable[[str], None]) -> None:
    conf = root / "slurm.conf"
    if lab is not None and any(d.name == "slurmctld" and d.alive() for d in stack.daemons):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if jobs := lab.jobs():
                log(f"cancelling jobs {' '.join(jobs)}")
                lab.run("scancel", *jobs, check=False)
                lab.wait_jobs_gone(timeout_s=20)
    steps = leftover_pids(conf)
    for line in stack.stop():
        log(line)
    if leftovers := sorted(set(steps) | set(leftover_pids(conf))):
        log(f"stopping leftover job processes {leftovers}")
        kill_pids(leftovers)
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def lab_slurm(*, hosts: int = 1, rate: str | None = LINK_RATE, install: bool = True,
              kill_wait_s: int = 30, keep_on_error: bool = False,
              log: Callable[[str], None] | None = None) -> Iterator[SlurmLab]:
    """Brings the lab Slurm up (installing missing packages when ``install``), yields it with
    its node idle, and takes everything down again on the way out, whatever the way out.

    ``kill_wait_s`` is Slurm's ``KillWait``: how long ``scancel`` (and ``torchx cancel``)
    waits between SIGTERM and SIGKILL, the time a job has to checkpoint. ``keep_on_error``
    leaves the folder (logs, configs) in place when bringing it up fails, for a look.
    ``log`` receives one line per daemon started. Raises :class:`LabUnavailable` when this
    machine cannot run it.

    ``hosts`` > 1 emulates that many nodes, each slurmd in a host namespace of a
    ``benchmarks/cluster.py`` testbed (``198.18.0.<i+1>``, hostnames ``ssc-slurm<pid>-h<i>``,
    each link limited to ``rate`` both ways, ``tc`` syntax; ``None`` for no limit; unused with
    one node), with the head's daemons in host 0's; client commands go through wrappers that
    ``env["PATH"]`` puts first. Every node claims all of this machine's CPUs. Jobs across
    nodes need ``GLOO_SOCKET_IFNAME=veth0`` (and ``NCCL_SOCKET_IFNAME``) in their
    environment. The testbed is removed with the lab. A malformed ``rate`` raises
    ``ClusterError`` before anything starts.
    """
    say = log or (lambda _line: None)
    if install:
        ensure_packages()
    elif missing := missing_packages():
        raise LabUnavailable(f"packages missing: {missing}")
    if (reason := unavailable_reason()) is not None:
        raise LabUnavailable(reason)
    net: Cluster | None = None
    if hosts > 1:
        from shadowsync.benchmarks import cluster, netns

        if (reason := netns.unavailable_reason()) is not None:
            raise LabUnavailable(f"no namespaces for {hosts} nodes: {reason}")
        net = cluster.Cluster(hosts=hosts, rate=rate, name=f"slurm{os.getpid()}")
    root = Path(tempfile.mkdtemp(prefix="slurm-lab-"))
    root.chmod(0o711)  # munged checks that its socket's folders can be traversed by all
    stack = _Stack(root, {**os.environ, "SLURM_CONF": str(root / "slurm.conf")})
    lab: SlurmLab | None = None
    failed = False
    try:
        with _signals_raise():
            try:
                if net is not None:
                    net.up()
                    say(f"testbed   {net.describe()}: {', '.join(map(net.host_ns, range(hosts)))}")
                lab = _start(stack, root, kill_wait_s=kill_wait_s, log=say, net=net)
            except BaseException:
                failed = True
                raise
            yield lab
    finally:
        with _signals_ignored():
            try:
                if failed and keep_on_error:
                    stack.stop()
                    say(f"kept {root} for a look")
                else:
                    _teardown(stack, root, lab, say)
            finally:
                if net is not None:
                    net.down()


def _up(args: argparse.Namespace) -> int:
    with lab_slurm(hosts=args.hosts, rate=args.rate, install=not args.no_install,
                   kill_wait_s=args.kill_wait,
                   keep_on_error=args.keep_on_error,
                   log=lambda line: print(line, flush=True)) as lab:
        nodes = len(lab.nodes)
        print(f"\nSlurm is up: nodes {','.join(lab.nodes)}, partition {lab.partition}. In "
              "another shell, from the repository root:\n", flush=True)
        for key, value in lab.env.items():
            print(f"    export {key}={value}")
        job = ("-j 1x2" if nodes == 1 else
               f"-j {nodes}x1 --env GLOO_SOCKET_IFNAME=veth0,OMP_NUM_THREADS=1")
        print("    export PATH=$PWD/.venv/bin:$PATH\n"
              "    sinfo\n"
              f"    torchx run -s slurm --wait --log torchx_components/train.py:train {job} "
              f"--cpu {lab.cpus} --memMB {min(8000, lab.memory_mb // 2)} --config movielens_1m "
              "train.steps=100 'output_dir=runs/slurm/${app_id}'\n"
              f"\nCtrl-C here stops every daemon and removes {lab.root}"
              f"{' and the namespaces' if nodes > 1 else ''}.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while not (gone := [n for n, pid in lab.pids.items() if not running(pid)]):
                time.sleep(1)
            print(f"error: {', '.join(gone)} exited; stopping the lab", file=sys.stderr,
                  flush=True)
            return 1
    return 0


def _check(args: argparse.Namespace) -> int:
    """Up, one ``srun`` and one ``sbatch`` job seen by ``sacct``, down."""
    start = time.monotonic()
    with lab_slurm(hosts=args.hosts, rate=args.rate, install=not args.no_install,
                   log=lambda line: print(line, flush=True)) as lab:
        print(f"up in {time.monotonic() - start:.1f}s", flush=True)
        nodes = str(len(lab.nodes))
        print(lab.run("srun", "-N", nodes, "-n", nodes, "bash", "-c",
                      "echo $SLURMD_NODENAME $(hostname -I 2>/dev/null || true)",
                      timeout=60).stdout.strip(), flush=True)
        job = lab.run("sbatch", "--parsable", f"--chdir={lab.root}", "--wrap", "true").stdout
        job = job.strip()
        lab.wait_jobs_gone(timeout_s=60)
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline and state != "COMPLETED":
            out = lab.run("sacct", "--noheader", "--parsable2", "-X", "-j", job,
                          "--format=State").stdout
            state = out.strip()
            time.sleep(0.5)
        print(f"job {job}: {state or 'not in sacct'}", flush=True)
    print(f"down after {time.monotonic() - start:.1f}s", flush=True)
    return 0 if state == "COMPLETED" else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shadowsync.benchmarks.slurm_lab",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="bring a one-node Slurm up; Ctrl-C takes it down")
    up.add_argument("--kill-wait", type=int, default=30,
                    help="Slurm's KillWait: seconds between scancel's SIGTERM and SIGKILL")
    up.add_argument("--keep-on-error", action="store_true",
                    help="keep the lab folder (logs, configs) when a daemon does not come up")
    check = sub.add_parser("check", help="up, run a job through srun and sbatch, down")
    for p in (up, check):
        p.add_argument("--no-install", action="store_true",
                       help="fail instead of installing missing packages with apt-get")
        p.add_argument("--hosts", type=int, default=1,
                       help="nodes; above 1 each slurmd runs in a network namespace of its own "
                            "(benchmarks/cluster.py's testbed)")
        p.add_argument("--rate", default=LINK_RATE,
                       help="with --hosts above 1, each node's link rate, both ways: 200mbit, "
                            "1gbit, unlimited (default: %(default)s)")
    args = parser.parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {"up": _up, "check": _check}
    from shadowsync.benchmarks.netns import ClusterError

    try:
        return handlers[args.command](args)
    except (LabUnavailable, ClusterError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
