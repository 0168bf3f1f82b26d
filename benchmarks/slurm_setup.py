"""What the Slurm lab (:mod:`.slurm_lab`) needs around its daemons: Debian's packages
(installed when missing, no system service started), the configuration files it writes into
its own folder (``slurm.conf``, ``slurmdbd.conf``), and finding and stopping by pid the
processes its jobs leave behind."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# Debian package -> what must be present for it to count as installed (programs, or glob
# patterns of files). slurm-wlm brings slurmctld, slurmd and the client commands; slurmdbd
# depends on slurm-wlm-mysql-plugin.
PACKAGES: dict[str, tuple[str, ...]] = {
    "munge": ("munged", "mungekey", "munge"),
    "mariadb-server": ("mariadbd", "mariadb-install-db", "mariadb"),
    "slurmdbd": ("slurmdbd", "/usr/lib/*/slurm-wlm/accounting_storage_mysql.so"),
    "slurm-wlm": ("slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "sacct", "sacctmgr",
                  "scancel", "scontrol", "srun"),
}

_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin"])

_POLICY_RC_D = Path("/usr/sbin/policy-rc.d")

CLUSTER = "lab"

PARTITION = "lab"

DB_NAME = "slurm_acct_db"

# Client commands that get a wrapper into host 0's namespace when the nodes are namespaces.
CLIENTS = ("sbatch", "srun", "salloc", "squeue", "scancel", "sinfo", "scontrol", "sacct",
           "sacctmgr", "sstat")


class LabUnavailable(RuntimeError):
    """This machine cannot run the lab (not root, packages missing and not installable, a
    daemon that did not come up); the message says why."""


def which(program: str) -> str | None:
    return shutil.which(program, path=_SEARCH_PATH)


def missing_packages() -> list[str]:
    """The packages of :data:`PACKAGES` that are not (completely) installed."""
    missing = []
    for package, needs in PACKAGES.items():
        for need in needs:
            found = glob.glob(need) if need.startswith("/") else which(need)
            if not found:
                missing.append(package)
                break
    return missing


def unavailable_reason() -> str | None:
    """Why :func:`lab_slurm` cannot run here, or ``None`` when it can (possibly after
    installing the packages)."""
    if os.geteuid() != 0:
        return "the Slurm lab needs root (its daemons run as root and run jobs as any user)"
    if missing_packages() and not which("apt-get"):
        return f"packages {missing_packages()} are missing and there is no apt-get to install them"
    if not Path("/proc/self/environ").exists():
        return "no /proc (the lab finds leftover job processes through it)"
    return None


def ensure_packages(*, quiet: bool = True) -> None:
    """Installs the missing :data:`PACKAGES` with ``apt-get install -y
    --no-install-recommends`` (``apt-get update`` first when that fails once), with no system
    service started by their install scripts. Does nothing when all are present."""
    missing = missing_packages()
    if not missing:
        return
    if (reason := unavailable_reason()) is not None:
        raise LabUnavailable(reason)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    out = subprocess.DEVNULL if quiet else None
    ours = not _POLICY_RC_D.exists()
    if ours:  # the Debian way to keep invoke-rc.d from starting what gets installed
        _POLICY_RC_D.write_text("#!/bin/sh\n# slurm_lab: no services during install\nexit 101\n")
        _POLICY_RC_D.chmod(0o755)
    try:
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
        if subprocess.run(cmd, env=env, stdout=out, stderr=out).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, stdout=out, stderr=out, check=True)
            subprocess.run(cmd, env=env, stdout=out, stderr=out, check=True)
    except subprocess.CalledProcessError as e:
        raise LabUnavailable(f"apt-get failed installing {missing} (exit {e.returncode})") from e
    finally:
        if ours:
            _POLICY_RC_D.unlink(missing_ok=True)
    if still := missing_packages():
        raise LabUnavailable(f"still missing after apt-get install: {still}")


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def slurm_conf(root: Path, *, host: str, ctld_addr: str, nodes: Sequence[tuple[str, str]],
                hardware: str, ports: Mapping[str, int], munge_socket: Path,
                kill_wait_s: int) -> str:
    node_lines = "\n".join(f"NodeName={name} NodeAddr={addr} {hardware} State=UNKNOWN"
                           for name, addr in nodes)
    return f"""\
# written by shadowsync.benchmarks.slurm_lab; removed with the lab
ClusterName={CLUSTER}
SlurmctldHost={host}({ctld_addr})
SlurmctldPort={ports['slurmctld']}
SlurmdPort={ports['slurmd']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/ctld-state
SlurmdSpoolDir={root}/slurmd-spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={root}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# heterogeneous jobs (torchx's multi-node jobs: one group per node) need the backfill scheduler
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
MpiDefault=none
ReturnToService=2
KillWait={kill_wait_s}
InactiveLimit=0
MinJobAge=300
SlurmdTimeout=60
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports['slurmdbd']}
AccountingStoragePass={munge_socket}
{node_lines}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def slurmdbd_conf(root: Path, *, host: str, ports: Mapping[str, int], munge_socket: Path,
                   db_password: str) -> str:
    return f"""\
# written by shadowsync.benchmarks.slurm_lab; removed with the lab
DbdHost={host}
DbdAddr=127.0.0.1
DbdPort={ports['slurmdbd']}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
PidFile={root}/slurmdbd.pid
LogFile={root}/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports['mariadb']}
StorageUser=slurm
StoragePass={db_password}
StorageLoc={DB_NAME}
"""


def this_node_line() -> str:
    """This host's hardware as slurmd sees it (``slurmd -C``'s ``NodeName=... RealMemory=N``)."""
    out = subprocess.run([which("slurmd") or "slurmd", "-C"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("NodeName=")), None)
    if line is None:
        raise LabUnavailable(f"slurmd -C printed no NodeName line: {out!r}")
    return line.strip()


def conf_field(node_line: str, key: str) -> str:
    return next(f.split("=", 1)[1] for f in node_line.split() if f.startswith(key + "="))


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def leftover_pids(conf: Path) -> list[int]:
    """Processes of the lab's jobs that outlived slurmd: ``slurmstepd``\\s and job processes
    (``SLURM_JOB_ID`` set) whose environment names this lab's ``SLURM_CONF``; a shell that only
    exported ``SLURM_CONF`` is not one of them."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        env = environ_of(pid)
        if env.get("SLURM_CONF") != str(conf):
            continue
        if command_name(pid).startswith("slurmstepd") or "SLURM_JOB_ID" in env:
            pids.append(pid)
    return pids


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_pids(pids: Sequence[int], grace_s: float = 5.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
