"""Training through torchx's own Slurm scheduler on a real Slurm (``benchmarks/slurm_lab.py``:
munged, MariaDB, slurmdbd, slurmctld and slurmd on this machine, one node): a shadow-mode
``-j 1x2`` job to SUCCEEDED with both ranks' lines in its logs, a config error refused at
submission (exit 2, no job), a job signalled like a preemption checkpointing and its
resubmission resuming from that step, and a ``-j 2x1`` job across two emulated nodes (each
slurmd in a network namespace of ``benchmarks/cluster.py``'s testbed, on links of
``slurm_lab.LINK_RATE``) whose traffic both nodes' interfaces carry.

Needs root and the Debian packages (installed with apt-get when missing); skipped otherwise.
One lab serves the module and is taken down after it; the two-node test has a lab of its own.
After each lab, a check that none of its daemons, job processes or namespaces is left. Each
test prints one summary line (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torchx.runner import Runner, get_runner
from torchx.schedulers.api import Stream
from torchx.specs import AppState, AppStatus

from shadowsync.benchmarks import slurm_lab, slurm_setup
from shadowsync.testing import wait_for_app
from shadowsync.torchx_components.train import train
from tests._dist import SMALL

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent  # srun --export=ALL hands PATH (python) to the job
COMPONENT = str(REPO / "torchx_components" / "train.py") + ":train"
CONFIG = SMALL[SMALL.index("--config") + 1]
OVERRIDES = [a for a in SMALL if a not in ("--config", CONFIG)]
JOB_TIMEOUT_S = 120
# c10d's INFO lines come from every rank's C++ side (to stderr, which torchrun --tee prefixes
# with the local rank): rank 1 logs nothing of its own in a healthy run.
EVERY_RANK_LOGS = {"TORCH_CPP_LOG_LEVEL": "INFO"}


def _skip_reason() -> str | None:
    reason = slurm_setup.unavailable_reason()
    if reason is not None:
        return reason
    try:
        slurm_setup.ensure_packages()
    except (slurm_setup.LabUnavailable, OSError) as e:
        return f"cannot install the Slurm lab's packages: {e}"
    return None


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_lab.SlurmLab]:
    """The lab Slurm, with this process's PATH (the venv first) and SLURM_CONF set for sbatch,
    and its working directory in a folder of its own, where sbatch leaves the jobs'
    ``slurm-<id>-train-0.out/.err`` and torchx's Slurm scheduler reads them back."""
    if (reason := _skip_reason()) is not None:
        print(f"skipping the Slurm tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("slurm_jobs")
    start = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        with slurm_lab.lab_slurm(install=False) as running:
            print(f"lab Slurm up in {time.monotonic() - start:.1f}s: node {running.node}, "
                  f"{running.cpus} CPUs", flush=True)
            for key, value in running.env.items():
                mp.setenv(key, value)
            mp.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
            mp.chdir(workdir)
            yield running
        _assert_nothing_left(running)


def _assert_nothing_left(lab: slurm_lab.SlurmLab) -> None:
    """After the lab's teardown: none of its daemons alive, no process of its jobs, its folder
    gone, and none of its testbed's namespaces in ``ip netns list``."""
    from shadowsync.benchmarks import netns

    assert not [f"{name} ({pid})" for name, pid in lab.pids.items()
                if Path(f"/proc/{pid}").exists()]
    assert slurm_setup.leftover_pids(lab.conf) == []
    assert not lab.root.exists()
    if lab.testbed is not None:
        own = f"{netns.PREFIX}-{lab.testbed.name}-"
        assert not [ns for ns in netns.list_namespaces() if ns.startswith(own)]


def _wait(runner: Runner, handle: str, timeout_s: float = JOB_TIMEOUT_S) -> AppStatus:
    return wait_for_app(runner, handle, timeout_s)  # type: ignore[no-any-return]


def _log(runner: Runner, handle: str, stream: Stream) -> str:
    return "".join(f"{line}\n" for line in runner.log_lines(handle, "train", k=0, streams=stream))


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _sacct_state(lab: slurm_lab.SlurmLab, job_id: str) -> str:
    """Slurm's own state of the job's allocation(s) (``COMPLETED``, ``FAILED``...), one per
    heterogeneous component, for the summary lines."""
    return ",".join(lab.run("sacct", "--noheader", "--parsable2", "-X", "-j", job_id,
                            "--format=State").stdout.split())


def _submit(runner: Runner, *overrides: str, env: dict[str, str] | None = None) -> str:
    app = train(*OVERRIDES, *overrides, config=CONFIG, j="1x2", cpu=2, memMB=4000, env=env)
    return runner.run(app, "slurm", cfg={})


def test_two_ranks_train_to_succeeded_with_their_logs(lab: slurm_lab.SlurmLab,
                                                      tmp_path: Path) -> None:
    start = time.monotonic()
    with get_runner() as runner:
        handle = _submit(runner, "train.steps=40", "sync.schedule.mode=shadow",
                         f"output_dir={tmp_path}/${{app_id}}", env=EVERY_RANK_LOGS)
        status = _wait(runner, handle)
        out, err = _log(runner, handle, Stream.STDOUT), _log(runner, handle, Stream.STDERR)
    wall = time.monotonic() - start
    job_id = handle.rsplit("/", 1)[-1]
    assert status.state == AppState.SUCCEEDED, (out + err)[-4000:]
    summary = _records(tmp_path / job_id / "metrics.jsonl")[-1]
    print(f"1x2 job {job_id}: {status.state.name} (sacct {_sacct_state(lab, job_id)}), "
          f"step {summary['step']}, {summary['sync_rounds']:.0f} sync rounds, {wall:.1f}s")
    assert summary.get("summary") is True and summary["step"] == 40, summary
    assert summary["sync_rounds"] > 0  # the shadow synchronizer ran
    for rank in (0, 1):
        assert re.search(rf"^\[{rank}\]:", out + err, re.M), f"rank {rank}:\n{err[-3000:]}"
    assert re.search(rf"^\[0\]:logs +torchx log slurm://torchx/{job_id}$", out, re.M), out[-3000:]


def test_a_config_error_is_refused_before_submission(lab: slurm_lab.SlurmLab) -> None:
    before = lab.run("sacct", "--noheader", "-X", "--format=JobID", "-S", "now-1hour").stdout
    proc = subprocess.run(
        [str(VENV_BIN / "torchx"), "run", "-s", "slurm", COMPONENT, "-j", "1x2", "--cpu", "2",
         "--memMB", "4000", "--config", CONFIG, *OVERRIDES, "train.bach_size=4"],
        capture_output=True, text=True, timeout=120)
    error = re.search(r"^error: unknown setting train\.bach_size.*$", proc.stderr, re.M)
    queued = lab.jobs()
    print(f"config error: torchx run exit {proc.returncode}, "
          f"{error.group(0) if error else 'no error line'!r}, jobs in squeue {queued}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert error is not None, proc.stderr
    assert "slurm://" not in proc.stdout
    assert queued == []
    after = lab.run("sacct", "--noheader", "-X", "--format=JobID", "-S", "now-1hour").stdout
    assert after == before


def test_a_signalled_job_checkpoints_and_the_resubmitted_job_resumes(
        lab: slurm_lab.SlurmLab, tmp_path: Path) -> None:
    """``scancel --signal=TERM`` signals the job's steps as a preemption does (plain
    ``scancel``, which ``torchx cancel`` runs, also kills the batch script: see the docs)."""
    ckpt = tmp_path / "ckpt"
    args = ["train.log_every=10", f"checkpoint.dir={ckpt}"]
    with get_runner() as runner:
        start = time.monotonic()
        first = _submit(runner, *args, "train.steps=100000", f"output_dir={tmp_path}/first")
        first_id = first.rsplit("/", 1)[-1]
        out_file = Path(f"slurm-{first_id}-train-0.out")
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:  # training, not still starting
            if out_file.exists() and re.search(r" step 20/", out_file.read_text()):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"job {first_id} logged no step 20 in {JOB_TIMEOUT_S}s")
        lab.run("scancel", "--signal=TERM", first_id)
        stopped = _wait(runner, first)
        first_wall = time.monotonic() - start
        out = _log(runner, first, Stream.STDOUT)
        assert stopped.state == AppState.FAILED  # torchx has no preempted state (exit 143)
        line = re.search(r"^\[0\]:preempted: every rank stopped after step (\d+); "
                         r"checkpoint (\S+); run the same command to resume \(exit 143\)$",
                         out, re.M)
        assert line is not None, out[-4000:]
        step, checkpoint = int(line.group(1)), line.group(2)
        assert Path(checkpoint) == ckpt / f"step_{step:08d}" and Path(checkpoint).is_dir()

        start = time.monotonic()
        second = _submit(runner, *args, f"train.steps={step + 20}",
                         f"output_dir={tmp_path}/second")
        second_id = second.rsplit("/", 1)[-1]
        status = _wait(runner, second)
        second_wall = time.monotonic() - start
        assert status.state == AppState.SUCCEEDED, _log(runner, second, Stream.STDOUT)[-4000:]
    records = _records(tmp_path / "second" / "metrics.jsonl")
    print(f"1x2 job {first_id}: {stopped.state.name} (sacct {_sacct_state(lab, first_id)}) "
          f"after scancel --signal=TERM, checkpoint at step {step}, {first_wall:.1f}s; "
          f"resubmitted job {second_id}: {status.state.name} "
          f"(sacct {_sacct_state(lab, second_id)}), resumed at step {records[0]['step']}, "
          f"ended at step {records[-1]['step']}, {second_wall:.1f}s")
    assert records[0] == {"step": step, "resumed_from": checkpoint, "time": records[0]["time"]}
    assert records[-1]["summary"] is True and records[-1]["step"] == step + 20


def test_two_nodes_in_namespaces_train_to_succeeded(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """``-j 2x1`` on a lab of two nodes, each slurmd in a host namespace of
    ``benchmarks/cluster.py``'s testbed: torchx's heterogeneous job puts one group on each,
    the two torchruns meet through c10d rendezvous at the first node's hostname, and the
    job's traffic crosses both nodes' rate-limited interfaces."""
    from shadowsync.benchmarks import netns

    if (reason := _skip_reason() or netns.unavailable_reason()) is not None:
        pytest.skip(reason)
    start = time.monotonic()
    with slurm_lab.lab_slurm(hosts=2, install=False) as lab2:
        up_s = time.monotonic() - start
        for key, value in lab2.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.chdir(tmp_path)
        app = train(*OVERRIDES, "train.steps=40", f"output_dir={tmp_path}/${{app_id}}",
                    config=CONFIG, j="2x1", cpu=2, memMB=4000,
                    env={"GLOO_SOCKET_IFNAME": netns.HOST_IF, "OMP_NUM_THREADS": "1"})
        before = lab2.traffic()
        start = time.monotonic()
        with get_runner() as runner:
            handle = runner.run(app, "slurm", cfg={})
            status = _wait(runner, handle)
            out = _log(runner, handle, Stream.STDOUT)
        wall = time.monotonic() - start
        moved = {node: (tx - before[node][0], rx - before[node][1])
                 for node, (tx, rx) in lab2.traffic().items()}
        job_id = handle.rsplit("/", 1)[-1]
        placed = lab2.run("sacct", "--noheader", "--parsable2", "-X", "-j", job_id,
                          "--format=NodeList").stdout.split()
        state = _sacct_state(lab2, job_id)
    _assert_nothing_left(lab2)
    assert status.state == AppState.SUCCEEDED, out[-4000:]
    summary = _records(tmp_path / job_id / "metrics.jsonl")[-1]
    # The floor: with two ranks, each must receive the other's whole buffer (its sum needs
    # every element of it) in each allreduce, whatever gloo's algorithm, so each node's
    # interface sends and receives at least the bytes the synchronizer handed to allreduce.
    # TorchRec's all-to-alls, the dense broadcast at start, the final consensus, rendezvous
    # and Slurm's own messages only add to that.
    floor = int(summary["sync_bytes_reduced"])
    print(f"2x1 job {job_id}: {status.state.name} (sacct {state}) on {','.join(placed)}, "
          f"step {summary['step']}, {summary['sync_rounds']:.0f} sync rounds, {wall:.1f}s "
          f"(lab up in {up_s:.1f}s, links {slurm_lab.LINK_RATE}); "
          + ", ".join(f"{node} sent {tx / 1e6:.2f} MB, received {rx / 1e6:.2f} MB"
                      for node, (tx, rx) in moved.items())
          + f" (floor {floor / 1e6:.2f} MB each way)")
    assert sorted(placed) == list(lab2.nodes), placed
    assert summary.get("summary") is True and summary["step"] == 40, summary
    assert summary["sync_rounds"] > 0 and floor > 0, summary
    assert all(tx >= floor and rx >= floor for tx, rx in moved.values()), (moved, floor)
