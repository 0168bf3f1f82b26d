"""Fault injection on 2 CPU ranks: every fault ends within its bound, with the exit code and the
message it should have, and leaves the last good checkpoint loadable.

Jobs run as real ``torchrun`` (one under ``torchx run``, one with bare ``python -m`` ranks)
subprocesses of ``tests/faulty_train.py``, which monkeypatches one fault into the unchanged
training entry point (see its docstring); bad configurations go through ``main()`` in-process.
Each job carries a marker in its environment, so a test can assert that no process outlived it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.utils.distributed import get_free_port
from torchx.runner import get_runner
from torchx.specs import AppState

from shadowsync.datasets import build_dataset
from shadowsync.pipelines import checkpoint, errors, finite, train
from shadowsync.pipelines import holdout as evaluator_module
from shadowsync.pipelines.callbacks import TrainCallback
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.testing import run_ranks
from shadowsync.torchx_components.train import train as train_component
from tests._dist import SMALL
from tests.faulty_train import _Poisoned

pytestmark = pytest.mark.slow  # every test here runs jobs of spawned ranks

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
JOB_TIMEOUT_S = 150  # a hard stop for any one job; the bounds asserted below are far tighter
EXIT_BOUND_S = 30  # fault (or fault detected) -> every process gone; torchrun's grace is 30 s
_FAULT = re.compile(r"FAULT \S+ rank \d+ at (\d+\.\d+)")


@dataclass
class Job:
    rc: int
    log: str
    wall_s: float
    end: float

    def since_fault(self) -> float:
        """Seconds from the injected fault to the end of the job."""
        m = _FAULT.search(self.log)
        assert m, self.log[-3000:]
        return self.end - float(m.group(1))


def _env(fault: str | None, marker: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "tests"),
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "FAULT_TEST_JOB": marker}
    env.pop("SHADOWSYNC_TEST_FAULT", None)
    if fault is not None:
        env["SHADOWSYNC_TEST_FAULT"] = fault
    return env


def _survivors(marker: str) -> list[int]:
    """Processes whose environment carries this job's marker."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"FAULT_TEST_JOB={marker}".encode() in (
                    proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _wait_all(procs: list[subprocess.Popen[str]], marker: str, timeout_s: float) -> str:
    """Waits for ``procs``; past ``timeout_s`` kills every process of the job and fails."""
    deadline = time.monotonic() + timeout_s
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs.append(out)
    except subprocess.TimeoutExpired:
        for pid in _survivors(marker):
            os.kill(pid, 9)
        pytest.fail(f"job still running after {timeout_s} s")
    assert not _survivors(marker), "processes outlived the job"
    return "\n".join(logs)


def torchrun(overrides: list[str], fault: str | None = None, launcher: bool = False) -> Job:
    """A 2-rank job under torchrun, or with ``launcher`` under ``python -m
    shadowsync.pipelines.launch`` (torchrun with the preemption exit, as the components run)."""
    marker = uuid.uuid4().hex
    run = ([sys.executable, "-m", "shadowsync.pipelines.launch"] if launcher
           else [str(VENV_BIN / "torchrun")])
    cmd = [*run, "--nproc_per_node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "localhost:0", "-m",
           "faulty_train" if fault else "shadowsync.pipelines.train", *SMALL, *overrides]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(fault, marker), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    log = _wait_all([proc], marker, JOB_TIMEOUT_S)
    return Job(proc.returncode, log, time.monotonic() - began, time.time())


def _report(case: str, job: Job, message: str, fault_to_exit: float | None = None) -> None:
    """One row of the table in the README (pytest -s shows it)."""
    react = f"{fault_to_exit:.1f}" if fault_to_exit is not None else "-"
    print(f"\n| {case} | {job.wall_s:.1f} | {react} | {job.rc} | {message} |")


def _assert_loadable(root: Path, step: int) -> None:
    """The newest complete checkpoint is ``step`` and its per-rank files load safely."""
    found = checkpoint.latest(str(root))
    assert found is not None and found.step == step, found
    for rank in range(2):
        local = torch.load(Path(found.path) / f"rank_{rank:05d}.pt", weights_only=True)
        assert local["position"]["step"] == step


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("overrides", "message"), [
    (["sync.strategy.name=allreduce"], "sync.strategy.name: unknown strategy 'allreduce'"),
    (["sync.failure.on_failure=retry"], "sync.failure.on_failure: must be one of"),
    (["sync.algorithm=ma"], "sync.algorithm has moved: use sync.strategy.name"),
    (["sync.transport.backend=nccl"], "sync.transport.backend=nccl cannot carry shadow rounds"),
    (["train.bach_size=4"], "unknown setting train.bach_size"),
    (["train.pg_timeout_s=0"], "train.pg_timeout_s must be positive"),
    (["train.batch_size=0"], "train.batch_size must be positive"),
    (["sharding.types=[row_wise]"], r"sharding.types: \['row_wise'\] need CUDA"),
    (["sharding.types=[data_parallel]", "sharding.compute_kernel=fused"],
     "sharding.compute_kernel=fused.*no feasible plan for 1 ranks on cpu"),
    (["data.options.num_embeddings=0"], "data.options.num_embeddings"),
    (["data.name=criteo_npy", "data.options={directory: /no/such/dir}"],
     "data.options.directory: /no/such/dir: no such directory"),
    (["data.name=imagenet"], "data.name: unknown data set 'imagenet'"),
    (["model.embedding_dim=4"], "must end in model.embedding_dim"),
    (["--config", "/no/such.yaml"], "no such file and no such preset"),
])
def test_bad_config_fails_before_any_process_group(
    overrides: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def no_group(timeout_s: float) -> None:
        raise AssertionError("a process group was started for a bad configuration")

    monkeypatch.setattr(train, "init_distributed", no_group)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    args = SMALL + overrides if "--config" not in overrides else overrides[:2] + SMALL[2:]
    assert train.main(args) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not dist.is_initialized()


@pytest.mark.parametrize("launcher", [False, True], ids=["torchrun", "launcher"])
@pytest.mark.parametrize(("override", "line"), [
    ("sharding.types=[table_row_wise]", "error: sharding.types: ['table_row_wise'] need CUDA"),
    ("train.bach_size=4", "error: unknown setting train.bach_size"),
], ids=["ranks' check", "command line"])
def test_bad_config_fails_fast_in_one_line(override: str, line: str, launcher: bool) -> None:
    """The error is printed once (by local rank 0, or the launcher before any rank starts),
    whichever rank reaches the check first: local rank 0 comes to it a second late, except
    where the launcher checks the command line itself (with a fault the job runs
    ``faulty_train``, whose command line the launcher leaves to the ranks). The launcher exits
    2 with nothing else for a command line it can check, and with two of torchrun's own log
    lines for a check only the ranks make; bare torchrun exits 1 (its agent's exit for any
    failed worker) with its summary, which carries the line and names local rank 0."""
    prechecked = launcher and override.startswith("train.")
    job = torchrun([override], None if prechecked else "rank0:late-check@1", launcher)
    printed = [x for x in job.log.splitlines() if x.startswith("error:")]
    assert len(printed) == 1 and printed[0].startswith(line), job.log
    if launcher:
        assert job.rc == 2 and "Traceback" not in job.log, job.log
        if override.startswith("train."):
            assert job.log.strip().startswith(line) and job.log.strip().count("\n") == 0
    else:
        assert job.rc == 1 and "exitcode  : 2" in job.log
        assert f"traceback : {line}" in job.log and _root_cause(job.log) == 0, job.log
    how = "launcher" if launcher else "torchrun"
    _report(f"bad config ({override}), {how}", job, f"`{line} ...` once; "
            f"{'exit 2, no traceback' if launcher else 'torchrun summary names it'}")


# ---------------------------------------------------------------------------------- rank faults
def test_raising_rank_fails_every_rank_naming_it(tmp_path: Path) -> None:
    job = torchrun([f"checkpoint.dir={tmp_path}", "checkpoint.every_steps=10", "train.steps=60"],
                   fault="rank1:raise@25")
    assert job.rc == 1
    assert "rank 1 failed: RuntimeError: injected failure" in job.log
    assert "rank 0 failed: PeerFailed: rank 1 failed: RuntimeError: injected failure" in job.log
    assert _root_cause(job.log) == 1 and "rank 1 failed: PeerFailed" not in job.log
    assert job.since_fault() < EXIT_BOUND_S
    _assert_loadable(tmp_path, 20)
    _report("rank 1 raises at step 25, torchrun", job, "`rank 1 failed: RuntimeError: ...`; "
            "rank 0 `PeerFailed: rank 1 failed: ...`; Root Cause names rank 1; step 20 "
            "checkpoint loads", job.since_fault())


# The heartbeat of these jobs: a silent peer is named after 5 s (+ beats to notice and post).
HEARTBEAT = ["train.heartbeat_s=0.5", "train.heartbeat_timeout_s=5"]
_ASCTIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


def _said_at(log: str, text: str) -> float:
    """Unix time of the first log line that contains ``text`` (from its logging timestamp)."""
    line = next(ln for ln in log.splitlines() if text in ln)
    m = _ASCTIME.search(line)
    assert m, line
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3


def _torchx(tmp_path: Path, fault: str, overrides: list[str],
            monkeypatch: pytest.MonkeyPatch) -> tuple[AppState, Job]:
    """One ``torchx run -s local_cwd`` job of ``faulty_train``."""
    marker = uuid.uuid4().hex
    env = _env(fault, marker)
    monkeypatch.setenv("PATH", env["PATH"])
    app = train_component(*SMALL[2:], *overrides, config=SMALL[1], m="faulty_train",
                          env={k: env[k] for k in ("OMP_NUM_THREADS", "PYTHONPATH",
                                                   "SHADOWSYNC_TEST_FAULT", "FAULT_TEST_JOB")})
    began = time.monotonic()
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not ((status := runner.status(handle)) and status.is_terminal()):
            if time.monotonic() > deadline:
                runner.cancel(handle)
                pytest.fail(f"torchx job still running after {JOB_TIMEOUT_S} s")
            time.sleep(0.5)
        end = time.time()
        log = "".join(runner.log_lines(handle, "faulty_train", k=0))
    assert not _survivors(marker)
    return status.state, Job(1, log, time.monotonic() - began, end)


def _root_cause(log: str) -> int:
    """The rank torchrun's summary names as the "Root Cause"."""
    m = re.search(r"Root Cause.*?rank\s+: (\d+)", log, re.S)
    assert m, log[-3000:]
    return int(m.group(1))


# Pairwise: each of torchrun and torchx, signal and victim meets each value of the other two
# once (half the jobs of every combination; each job is mostly two ranks' start-up); and the
# launcher, for its console.
@pytest.mark.parametrize(("launcher", "kind", "victim"), [
    ("torchrun", "kill", 0), ("torchrun", "sigstop", 1),
    ("torchx", "kill", 1), ("torchx", "sigstop", 0), ("launcher", "kill", 1)])
def test_a_killed_or_stopped_rank_is_named_by_its_peer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str, kind: str, victim: int,
) -> None:
    """SIGKILL or SIGSTOP of either rank at step 25: the survivor names it (never claims the
    cause with its own broken connection), within a few heartbeats for a kill and the
    heartbeat timeout for a stop, independent of ``train.pg_timeout_s`` (600 s here).
    torchrun's "Root Cause" is the victim (the survivor's error file is stamped after it, and
    a stopped victim's is written by the rank that ends it); the survivor prints one line and
    no traceback, so under the launcher the job prints at most 40 lines after the fault
    (bare torchrun adds its own traceback: 40 lines of its own)."""
    overrides = [f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.every_steps=10",
                 "train.steps=60", *HEARTBEAT]
    fault = f"rank{victim}:{kind}@25"
    if launcher != "torchx":
        job = torchrun(overrides, fault=fault, launcher=launcher == "launcher")
        assert job.rc == 1, job.log[-3000:]
        assert _root_cause(job.log) == victim and "NoneType: None" not in job.log, job.log
        after = job.log[job.log.index("FAULT "):].splitlines()[1:]
        ours = [ln for ln in after if " shadowsync." in ln]
        assert len(ours) == 1, after
        if launcher == "launcher":
            assert len(after) <= 40 and "Traceback" not in job.log, after
        else:  # torchrun's own, of its raise
            assert job.log.count("Traceback") == 1, job.log
    else:
        state, job = _torchx(tmp_path, fault, overrides, monkeypatch)
        assert state == AppState.FAILED, job.log[-3000:]
    peer = 1 - victim
    blame = f"rank {peer} failed: PeerFailed: rank {victim} failed: stopped responding"
    assert blame in job.log, job.log[-3000:]
    assert not re.search(rf"rank {peer} failed: (RuntimeError|SyncError|DistBackendError)",
                         job.log), job.log[-3000:]
    fault_at = float(_FAULT.search(job.log).group(1))  # type: ignore[union-attr]
    named = _said_at(job.log, blame) - fault_at
    assert named < (3.0 if kind == "kill" else 5 + 3.0), named
    assert job.since_fault() < (EXIT_BOUND_S if kind == "kill" else 5 + EXIT_BOUND_S)
    _assert_loadable(tmp_path / "ckpt", 20)
    signal = "SIGKILL" if kind == "kill" else "SIGSTOP"
    _report(f"{signal} to rank {victim} at step 25, {launcher}", job,
            f"rank {peer}: `PeerFailed: rank {victim} failed: stopped responding (no heartbeat"
            f": ...)` after {named:.1f} s; step-20 checkpoint loads", job.since_fault())


def test_stuck_peer_times_out_without_torchrun() -> None:
    """Bare ``python -m`` ranks (no launcher to kill the survivors): a rank whose peer stops
    responding fails after ``train.pg_timeout_s`` instead of waiting forever."""
    marker, port = uuid.uuid4().hex, get_free_port()
    procs = []
    began = time.monotonic()
    for rank in range(2):
        env = {**_env("rank1:stall@10", marker), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "faulty_train", *SMALL, "train.pg_timeout_s=5",
             "train.steps=60"], cwd=REPO, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    try:
        out, _ = procs[0].communicate(timeout=JOB_TIMEOUT_S)
        end = time.time()
    finally:
        procs[1].kill()  # the stalled rank itself never returns
        stalled, _ = procs[1].communicate()
    job = Job(procs[0].returncode, stalled + out, time.monotonic() - began, end)
    assert job.rc == 1, out[-3000:]
    assert job.since_fault() < 5 + EXIT_BOUND_S
    # gloo words it "Timed out waiting 5000ms" or "Application timeout caused pair closure",
    # depending on which of the rank's collectives in flight gives up first
    assert re.search(r"rank 0 failed: .*([Tt]imed out|timeout)", out), out[-3000:]
    assert not _survivors(marker)
    _report("rank 1 stalls at step 10, bare `python -m` ranks, `train.pg_timeout_s=5`", job,
            "rank 0: `rank 0 failed: RuntimeError: Application timeout caused pair closure`, "
            "exit 1",
            job.since_fault())


# ---------------------------------------------------------------------------------- sync faults
SHADOW = ["sync.strategy.name=ma", "sync.schedule.mode=shadow", "sync.failure.timeout_s=3"]


def test_failed_sync_round_stops_the_job() -> None:
    job = torchrun([*SHADOW, "train.steps=400"], fault="rank1:fail-sync@5")
    assert job.rc == 1
    cause = ("rank 1 failed: SyncError: rank 1: synchronization failed: RuntimeError: injected "
             "synchronization failure")
    assert cause in job.log, job.log[-3000:]
    assert f"rank 0 failed: PeerFailed: {cause}" in job.log  # not the abort it received
    assert _root_cause(job.log) == 1 and "rank 1 failed: PeerFailed" not in job.log
    assert job.since_fault() < EXIT_BOUND_S
    _report("sync strategy raises in round 5 (`sync.failure.on_failure=raise`)", job,
            "`rank 1 failed: SyncError: rank 1: synchronization failed: RuntimeError: ...`; "
            "rank 0 `PeerFailed: rank 1 failed: ...`",
            job.since_fault())


def test_every_checkpoint_unreadable_is_reported_once_by_rank_0(
    tmp_path: Path,
) -> None:
    """#46: when every checkpoint's rank-1 file is corrupt, every rank raises the same agreed
    error (naming the files) and either rank used to be blamed, whichever posted first; rank
    0 reports it now, for the job, on the first launch and on the relaunch that finds only
    set-aside checkpoints."""
    common = [f"checkpoint.dir={tmp_path}", "checkpoint.every_steps=10", "checkpoint.keep=null"]
    assert torchrun([*common, "train.steps=20"]).rc == 0
    for step in (10, 20):
        (tmp_path / f"step_{step:08d}" / "rank_00001.pt").write_bytes(b"not a checkpoint")
    culprit = 0
    for launch in (1, 2):  # the corrupt files; then only set-aside folders are left
        job = torchrun([*common, "train.steps=30"])
        assert job.rc == 1 and _root_cause(job.log) == culprit, job.log[-3000:]
        assert re.search(rf"rank {1 - culprit} failed: PeerFailed: rank {culprit} failed: "
                         r"CheckpointUnreadable: no complete checkpoint", job.log), job.log[-3000:]
        assert f"rank {1 - culprit} failed: CheckpointUnreadable" not in job.log
        assert launch == 2 or "rank_00001.pt" in job.log
        _report(f"every checkpoint's rank 1 file corrupt, launch {launch}", job,
                f"`rank {culprit} failed: CheckpointUnreadable: no complete checkpoint ...`; "
                f"rank {1 - culprit} `PeerFailed: rank {culprit} failed: ...`")


@pytest.mark.parametrize("victim", [0, 1])
def test_a_stalled_round_is_blamed_on_the_rank_whose_round_stalled(victim: int) -> None:
    """#46: both ranks' rounds pass the same stall deadline within moments, and the rank
    waiting in the collective for the stalled one's part used to be blamed as often as not.
    It now gives the stalled rank a grace to post first, and names it."""
    job = torchrun([*SHADOW, "train.steps=400"], fault=f"rank{victim}:stall-sync@5")
    peer = 1 - victim
    assert job.rc == 1, job.log[-3000:]
    cause = (rf"rank {victim} failed: SyncError: rank {victim}: synchronization failed: "
             r"RoundStalled: round \d+ stalled: in flight for more than 3.0 s \(snapshot of step "
             r"\d+\): this rank's round did not reach the collective")
    assert re.search(rf"rank {peer} failed: PeerFailed: {cause}", job.log), job.log[-3000:]
    assert _root_cause(job.log) == victim, job.log[-3000:]
    assert f"rank {victim} failed: PeerFailed" not in job.log
    assert job.since_fault() < EXIT_BOUND_S
    _report(f"sync strategy of rank {victim} stalls in round 5 (`raise`)", job,
            f"`rank {victim} failed: SyncError: ... RoundStalled: ... did not reach the "
            f"collective`; rank {peer} `PeerFailed: rank {victim} failed: ...`",
            job.since_fault())


def test_stalled_sync_degrades_and_rejoins(tmp_path: Path) -> None:
    job = torchrun([*SHADOW, "sync.failure.on_failure=degrade",
                    "sync.failure.rejoin_after_steps=20", "train.steps=400",
                    f"checkpoint.dir={tmp_path}"], fault="rank1:stall-sync@5")
    assert job.rc == 0, job.log[-3000:]
    assert re.search(r"round \d+ stalled: in flight for more than 3.0 s", job.log), job.log[-3000:]
    assert re.search(r"synchronization failed on rank\(s\) \[[01, ]+\]: every rank trains its "
                     r"own replica", job.log)
    assert job.log.count("synchronization rejoined on a fresh group") == 2  # both ranks
    assert re.search(r"sync_failures\s+1\n", job.log)  # the summary table
    final = Path(checkpoint.latest(str(tmp_path)).path)  # type: ignore[union-attr]
    dense = [torch.load(final / f"rank_{r:05d}.pt", weights_only=True)["dense"] for r in (0, 1)]
    assert all(torch.equal(dense[0][k], dense[1][k]) for k in dense[0])  # one model again
    _report("sync thread stalls in round 5 (`sync.failure.on_failure=degrade`)", job,
            "warning `round N stalled: in flight for more than 3.0 s`; all ranks degrade on "
            "one step and merge (20 steps later, or at the end if found there); exit 0, "
            "replicas identical at the end")


@pytest.mark.parametrize(("place", "overrides"), [
    ("checkpoint", ["checkpoint.every_steps=20", "checkpoint.keep=null"]),
    ("evaluation", ["eval.every_steps=30"]),
    ("end", []),
])
def test_a_stall_at_a_pause_degrades_and_the_job_goes_on(place: str, overrides: list[str],
                                                          tmp_path: Path) -> None:
    """Defect 3 of the protocol issue: with ``degrade``, a stall found at a checkpoint, an
    evaluation or the end failed the job and wrote no checkpoint. Rank 1's synchronizer
    stalls in the rounds of the first pause; both ranks find it there (the stall deadline),
    agree, degrade on that step and merge on a fresh group; the checkpoint is written (with
    identical replicas), the evaluation is logged, the job ends 0. ``max_staleness=1`` puts
    both ranks' rounds at the same steps, so the stalled round is one every rank waits for."""
    job = torchrun([*SHADOW, "sync.failure.on_failure=degrade", "sync.schedule.max_staleness=1",
                    "train.steps=60", f"checkpoint.dir={tmp_path}", f"output_dir={tmp_path}/out",
                    *overrides], fault="rank1:stall-pause@1")
    assert job.rc == 0, job.log[-3000:]
    assert "FAULT stall-pause rank 1" in job.log
    assert re.search(r"round \d+ stalled: in flight for more than 3.0 s", job.log)
    assert re.search(r"synchronization failed on rank\(s\) \[[01, ]+\]: every rank trains its "
                     r"own replica", job.log)
    assert re.search(r"sync_failures\s+1\n", job.log)  # the summary table
    step = {"checkpoint": 20, "evaluation": 30, "end": 60}[place]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    if place == "evaluation":
        assert any(r["step"] == 30 and "eval_auc" in r for r in records), records
    if place != "evaluation":
        assert any(r.get("checkpoint", "").endswith(f"step_{step:08d}") for r in records), records
        saved = Path(tmp_path) / f"step_{step:08d}"
        dense = [torch.load(saved / f"rank_{r:05d}.pt", weights_only=True)["dense"]
                 for r in (0, 1)]
        assert all(torch.equal(dense[0][k], dense[1][k]) for k in dense[0])  # merged
    _assert_loadable(tmp_path, 60)
    _report(f"sync stalls at the {place} (`degrade`, `max_staleness=1`)", job,
            "both ranks find the stall there, degrade on that step and merge; the "
            f"{'evaluation' if place == 'evaluation' else 'checkpoint'} goes on; exit 0")


def test_a_failure_at_the_end_with_raise_fails_the_job_naming_the_rank(tmp_path: Path) -> None:
    job = torchrun([*SHADOW, "sync.schedule.max_staleness=1", "train.steps=60",
                    "checkpoint.every_steps=20", f"checkpoint.dir={tmp_path}"],
                   fault="rank1:fail-pause@3")  # the third pause: the end
    assert job.rc == 1, job.log[-3000:]
    cause = ("rank 1 failed: SyncError: rank 1: synchronization failed: RuntimeError: injected "
             "synchronization failure")
    assert cause in job.log, job.log[-3000:]
    assert _root_cause(job.log) == 1 and "rank 1 failed: PeerFailed" not in job.log
    _assert_loadable(tmp_path, 40)  # no checkpoint of step 60: the end's pause failed
    _report("sync strategy raises at the end (`raise`)", job,
            "`rank 1 failed: SyncError: ...`; the last checkpoint (step 40) stays the newest; "
            "exit 1", job.since_fault())


def _abandoned(rank: int, world_size: int) -> dict[str, Any]:
    """Training raises on every rank at step 10 (an exception of the training loop itself):
    the synchronizer's thread must end with it, not keep waiting for a snapshot."""
    env = train.init_distributed(60)
    cfg = load_config("synthetic", SMALL[2:] + ["train.steps=40"])
    trainer = train.Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name,
                                                                   **cfg.data.options))
    after_step = trainer.wrapper.after_step

    def failing() -> None:
        after_step()
        if trainer.step + 1 == 10:
            raise RuntimeError("training failed")

    trainer.wrapper.after_step = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="training failed"):
        trainer.train()
    threads = [t for t in threading.enumerate() if t.name.startswith("shadowsync-rank")]
    for t in threads:
        t.join(10.0)
    return {"alive": [t.name for t in threads if t.is_alive()],
            "phase": trainer.wrapper.phase.name}  # type: ignore[union-attr]


def test_a_training_failure_ends_the_sync_thread_with_it() -> None:
    """Defect 5 of the protocol issue: a training exception left the daemon sync thread
    running (the trainer never abandoned the runner)."""
    for result in run_ranks(_abandoned, timeout_s=120):
        assert result == {"alive": [], "phase": "ABANDONED"}, result


# ----------------------------------------------------------------------- the control exchange
def _control_checks(rank: int, world_size: int) -> dict[str, list[float]]:
    """The steps of every periodic check, on clocks that read exactly 1/512 s a step on rank
    0 and 1/128 s on rank 1, with and without a floor in seconds."""
    env = train.init_distributed(60)
    out: dict[str, list[float]] = {}

    class Periodic(TrainCallback):
        """The steps of the periodic checks, and a clock of this rank's pace a step."""

        def __init__(self) -> None:
            self.steps: list[int] = []
            self.done = 0

        def clock(self) -> float:
            return self.done * (1 / 128 if rank == 1 else 1 / 512)

        def on_step_end(self, step: int) -> None:
            self.done = step

        def on_check(self, step: int, periodic: bool) -> None:
            if periodic:
                self.steps.append(step)

    for name, floor in (("floor", "0.25"), ("steps", "null")):
        cfg = load_config("synthetic", SMALL[2:] + [
            "train.steps=300", "train.control_every_steps=5",
            f"train.control_min_interval_s={floor}", "train.log_every=1000"])
        checks = Periodic()
        trainer = train.Trainer(RunContext.of(cfg, env, callbacks=[checks], clock=checks.clock),
                                build_dataset(cfg.data.name, **cfg.data.options))
        summary = trainer.train()
        out[name] = checks.steps
        out[f"{name} seconds"] = [summary["train_seconds"]]
    return out


def test_control_checks_space_out_to_the_floor_alike_on_every_rank() -> None:
    """``train.control_min_interval_s``: the first check after ``control_every_steps``; the
    second, started before the first's table is read, ``control_every_steps`` later; from then
    on, the floor's worth of steps at the slowest rank's pace as each rank's clock reads it
    (0.25 s at 1/128 s a step: 32 steps), on the same steps on every rank. With no floor,
    every 5 steps."""
    r0, r1 = run_ranks(_control_checks, timeout_s=120)
    # training time is on each rank's own clock too
    assert r0.pop("floor seconds") == r0.pop("steps seconds") == [300 / 512]
    assert r1.pop("floor seconds") == r1.pop("steps seconds") == [300 / 128]
    assert r0 == r1, (r0, r1)
    assert r0["steps"] == list(range(5, 301, 5))
    assert r0["floor"] == [5, 10, *range(42, 301, 32)], r0["floor"]


# ---------------------------------------------------------------------------------- preemption
def test_preemption_checkpoints_and_resumes(tmp_path: Path) -> None:
    """SIGTERM at one rank during a checkpoint write; then, with that run's newest checkpoint
    corrupt, at torchrun itself just before an evaluation; then a clean resume: each run
    stops on one step for all ranks, and the next resumes (past the corrupt checkpoint, from
    the one whose write the SIGTERM hit; then with the evaluation the preemption skipped)."""
    common = [f"checkpoint.dir={tmp_path}", "checkpoint.every_steps=10", "train.steps=60",
              "eval.every_steps=50"]

    first = torchrun(common, fault="rank1:sigterm-save@20", launcher=True)
    assert first.rc == 143, first.log[-3000:]  # bare torchrun: 1 (its code for a failed worker)
    assert first.log.rstrip().endswith("preempted: every worker stopped after the same step and "
                                        "checkpointed (exit 143); run the same command to resume "
                                        "from the checkpoint"), first.log[-3000:]
    assert "Traceback" not in first.log
    assert "SIGTERM reached rank(s) [1]: every rank stops after step 30" in first.log
    assert (f"preempted: every rank stopped after step 30; checkpoint {tmp_path}/step_00000030"
            "; run the same command to resume (exit 143)") in first.log
    assert first.since_fault() < EXIT_BOUND_S
    _assert_loadable(tmp_path, 30)
    _report("SIGTERM to rank 1 only, while writing the step-20 checkpoint", first,
            "write completes; `SIGTERM reached rank(s) [1]: every rank stops after step 30`; "
            "checkpoint 30; ranks and the launcher exit 143, one `preempted:` line last",
            first.since_fault())

    # The newest checkpoint corrupt (as a torn copy leaves it): the next run sets it aside and
    # resumes from the one before, the step-20 write that the SIGTERM interrupted. (Not before
    # the run that resumes from 50: from 40 instead, its evaluation at 50 would be a scheduled
    # one, not the skipped one made up.)
    corrupt = tmp_path / "step_00000030" / "rank_00001.pt"
    corrupt.write_bytes(b"not a checkpoint")
    second = torchrun(common, fault="rank0:sigterm-agent@45", launcher=True)
    assert f"checkpoint {tmp_path}/step_00000030 does not load: rank " in second.log
    assert "step_00000030/rank_00001.pt: truncated or extended since it was written" in second.log
    assert re.search(rf"renamed to {tmp_path}/step_00000030.corrupt-\d+", second.log)
    assert f"resumed from {tmp_path}/step_00000020" in second.log
    assert "Received 15 death signal, shutting down workers" in second.log
    assert re.search(r"SIGTERM reached rank\(s\) \[0(, 1)?\]: every rank stops after step 50",
                     second.log)
    assert "eval_ne" not in second.log  # the evaluation of step 50 did not run
    assert second.rc == 143 and second.since_fault() < EXIT_BOUND_S
    assert "preempted: the launcher got SIGTERM" in second.log
    _assert_loadable(tmp_path, 50)
    _report("newest checkpoint corrupt (rank 1's file of step 30)", second,
            "warning `checkpoint .../step_00000030 does not load: rank N: CheckpointCorrupt: "
            ".../rank_00001.pt: truncated or extended since it was written ...`; set aside; "
            "resumes from step 20")
    _report("SIGTERM to torchrun at step 45 (resumed from 20)", second,
            "the launcher forwards it; `SIGTERM reached rank(s) [0, 1]: every rank stops after "
            "step 50`; checkpoint 50; exit 143", second.since_fault())

    third = torchrun([*common, f"output_dir={tmp_path / 'third'}"])
    assert third.rc == 0, third.log[-3000:]
    records = _records(tmp_path / "third")
    assert records[0]["resumed_from"] == f"{tmp_path}/step_00000050", records
    assert records[1]["step"] == 50 and "eval_ne" in records[1], records  # the skipped one
    assert records[-1]["summary"] and records[-1]["step"] == 60, records
    _assert_loadable(tmp_path, 60)


# ---------------------------------------------------------------------------------- non-finite
def _records(out: Path) -> list[dict[str, Any]]:
    """metrics.jsonl as written (json reads NaN and Infinity back as floats)."""
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_non_finite_loss_fails_the_job_naming_step_rank_and_loss(tmp_path: Path) -> None:
    """NaN input on rank 1 at step 25 of the default (shadow MA) job: rank 1 fails at once
    naming the step and the loss; rank 0 (whose embeddings the NaN reached) names rank 1;
    nothing after step 20 is logged, saved or summarized."""
    job = torchrun([f"output_dir={tmp_path / 'out'}", f"checkpoint.dir={tmp_path / 'ckpt'}",
                    "checkpoint.every_steps=10", "train.log_every=10", "train.steps=60"],
                   fault="rank1:nan-loss@25")
    assert job.rc == 1, job.log[-3000:]
    cause = ("rank 1 failed: NonFiniteValue: non-finite loss (NaN or inf) at step 25 on rank 1")
    assert cause in job.log, job.log[-3000:]
    assert f"rank 0 failed: PeerFailed: {cause}" in job.log, job.log[-3000:]
    assert _root_cause(job.log) == 1 and "rank 1 failed: PeerFailed" not in job.log
    assert job.since_fault() < EXIT_BOUND_S
    records = _records(tmp_path / "out")
    assert [r["step"] for r in records if "loss" in r] == [10, 20]
    assert all(math.isfinite(r["loss"]) for r in records if "loss" in r)
    assert not any(r.get("summary") for r in records)
    _assert_loadable(tmp_path / "ckpt", 20)
    _report("NaN loss on rank 1 at step 25 (shadow MA)", job, "`rank 1 failed: NonFiniteValue: "
            "non-finite loss (NaN or inf) at step 25 on rank 1 ...`; rank 0 `PeerFailed: rank 1 "
            "failed: ...`; no summary; step-20 checkpoint loads", job.since_fault())


def _non_finite_in_process(rank: int, world_size: int, out: str) -> dict[str, Any]:
    env = train.init_distributed(60)
    results: dict[str, Any] = {}
    for case, fault, overrides in [
        # Checks every 10 steps whatever the pace, as the test's steps are counted.
        ("loss", ("nan-loss", 25), ["sync.strategy.name=ddp", "train.steps=60",
                                    "train.control_min_interval_s=null"]),
        ("eval", ("nan-eval", 1), ["train.steps=10", "train.log_every=5", f"output_dir={out}"]),
    ]:
        cfg = load_config("synthetic", SMALL[2:] + overrides)
        dataset = _Poisoned(build_dataset(cfg.data.name, **cfg.data.options), 1, fault[0],
                            fault[1])
        trainer = train.Trainer(RunContext.of(cfg, env), dataset)
        trainer.watch.poll = lambda: None  # type: ignore[method-assign]  # as on a GPU
        try:
            trainer.train()
            results[case] = {"error": None, "step": trainer.step}
        except errors.NonFiniteValue as e:
            results[case] = {"error": type(e).__name__, "message": str(e), "step": trainer.step}
    # Finite predictions, metrics that are not (an eval split of one class): fails too.
    trainer = train.Trainer(RunContext.of(load_config("synthetic", SMALL[2:] + ["train.steps=5"]),
                                          env), build_dataset(cfg.data.name, **cfg.data.options))
    exact = evaluator_module.gather_metrics
    evaluator_module.gather_metrics = lambda logits, labels: exact(logits, labels.mul(0))
    try:
        trainer.train()
        results["metrics"] = {"error": None}
    except errors.NonFiniteValue as e:
        results["metrics"] = {"error": type(e).__name__, "message": str(e)}
    finally:
        evaluator_module.gather_metrics = exact
    # A finite gradient too large to square on rank 1 in step 13 (Adagrad's state turns inf;
    # no replica sync, so only there): found before the next record, at step 20.
    trainer = train.Trainer(RunContext.of(load_config("synthetic", SMALL[2:] + [
        "train.steps=30", "train.log_every=10", "optim.dense=adagrad",
        "sync.strategy.name=none"]), env), build_dataset(cfg.data.name, **cfg.data.options))
    step_optimizer = trainer.optimizer.step

    def huge_gradient(*args: Any, **kwargs: Any) -> Any:
        if rank == 1 and trainer.step == 12:  # the step's own count is not advanced yet
            trainer.watch.params[0].grad.view(-1)[0] = 1e30
        return step_optimizer(*args, **kwargs)

    trainer.optimizer.step = huge_gradient  # type: ignore[method-assign]
    try:
        trainer.train()
        results["state"] = {"error": None}
    except errors.NonFiniteValue as e:
        results["state"] = {"error": type(e).__name__, "message": str(e), "step": trainer.step}
    return results


def test_ranks_agree_on_who_went_non_finite_first(tmp_path: Path) -> None:
    """As on GPUs, where the poll lags: the control exchange started after step 30 finds the
    NaN, and every rank raises when it is read, at the next check (step 40).
    DDP spread rank 1's NaN loss of step 25 to rank 0's gradients in the same step; the loss
    is named first, and only rank 1 claims the cause. NaN eval predictions on rank 1 fail the
    final evaluation on every rank, and no summary is written; so do eval metrics that are
    not finite (labels of one class: neither NE nor AUC is defined). A finite gradient that
    turned the optimizer's state inf is found at the next record."""
    r0, r1 = run_ranks(functools.partial(_non_finite_in_process, out=str(tmp_path)),
                       timeout_s=120)
    assert r0["loss"]["step"] == r1["loss"]["step"] == 40
    assert r1["loss"]["error"] == "NonFiniteValue"
    assert r1["loss"]["message"] == (
        "non-finite loss (NaN or inf) at step 25 on rank 1 (seen by rank 0: dense gradients at "
        "step 25, loss at step 26; rank 1: loss and dense gradients at step 25); found at the "
        "check after step 30")
    assert r0["loss"]["error"] == "PeerNonFinite"
    assert r0["loss"]["message"].startswith("rank(s) [1] went non-finite first")
    assert errors.is_consequence(errors.PeerNonFinite("x"))
    assert r1["eval"]["error"] == "NonFiniteValue"
    assert r1["eval"]["message"].startswith(
        "non-finite eval predictions (NaN or inf) at step 10 on rank 1")
    assert r0["eval"]["error"] == "PeerNonFinite"
    records = _records(tmp_path)
    assert [r["step"] for r in records] == [5, 10], records  # training records, no summary
    assert not any(r.get("summary") or any(k.startswith("eval_") for k in r) for r in records)
    for r in (r0, r1):
        assert r["metrics"]["error"] == "NonFiniteValue", r["metrics"]
        assert r["metrics"]["message"].startswith(
            "non-finite eval metrics {'auc': nan, 'ne': nan"), r  # no AUC of one class
        assert "in the evaluation after step 5" in r["metrics"]["message"]
    assert r1["state"] == {"error": "NonFiniteValue", "step": 20, "message": (
        "non-finite dense optimizer state (NaN or inf) at step 20 on rank 1 (seen by rank 1: "
        "dense optimizer state at step 20); found before the log of step 20")}
    assert r0["state"]["error"] == "PeerNonFinite" and r0["state"]["step"] == 20


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_watch_on_cpu_names_the_first_step_of_each_kind(optimizer: str) -> None:
    """On CPU, the watch's one check a step finds a NaN gradient and a NaN loss in their own
    steps; a finite gradient too large to square (1e30), whose optimizer state turns inf and
    would freeze that weight, is found at the next check with a step (also after a restore
    replaced the optimizer's state), and only while no gradient was non-finite. A finite step
    leaves the gradients and the loss exactly as they were."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    model[1].bias.requires_grad_(False)  # a parameter without a gradient
    params = [p for p in model.parameters() if p.requires_grad] + [model[1].bias]
    make = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[optimizer]
    opt = make(params, lr=0.1)
    watch = finite.FiniteWatch(params, torch.device("cpu"), opt)

    def step(n: int, grad: float | None = None, loss_scale: float = 1.0) -> list[int] | None:
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).square().mean() * loss_scale
        loss.backward()
        if grad is not None:
            model[0].weight.grad[1, 2] = grad
        before = ([p.grad.clone() for p in params if p.grad is not None], loss.detach().clone())
        opt.step()
        watch.observe(n, loss)
        if grad is None and loss_scale == 1.0:
            assert all(torch.equal(b, p.grad) for b, p in zip(before[0], params, strict=False))
            assert torch.equal(before[1], loss)
        return watch.poll()

    assert [step(1), step(2), watch.first_steps(2)] == [[0, 0, 0]] * 3
    assert step(3, grad=1e30) == [0, 0, 0]  # a finite gradient, but its square is not
    assert step(4) == [0, 0, 0] and watch.first_steps() == [0, 0, 0]  # no step: not checked
    assert watch.first_steps(4) == [0, 0, 4] and step(5) == [0, 0, 4]
    assert watch.local_message(0, 1) == (
        "non-finite dense optimizer state (NaN or inf) at step 4 on rank 0 (seen by rank 0: "
        "dense optimizer state at step 4)")

    def restore() -> None:  # as from a checkpoint: new state tensors, finite weights
        opt.load_state_dict(make(params, lr=0.1).state_dict())
        model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})

    restore()
    watch = finite.FiniteWatch(params, torch.device("cpu"), opt)
    assert step(6) == [0, 0, 0] and watch.first_steps(6) == [0, 0, 0]
    restore()
    assert step(7, grad=1e30) == [0, 0, 0] and watch.first_steps(7) == [0, 0, 7]
    restore()
    watch = finite.FiniteWatch(params, torch.device("cpu"), opt)
    assert step(8, grad=math.nan) == [0, 8, 0]
    assert step(9, loss_scale=math.inf) == [9, 8, 0]
    assert watch.first_steps(9) == [9, 8, 0]  # the state went NaN from the gradient: not named
    assert watch.local_message(1, 2) == (
        "non-finite dense gradients (NaN or inf) at step 8 on rank 1 (seen by rank 1: dense "
        "gradients at step 8, loss at step 9)")


def test_non_finite_message_orders_by_step_then_kind() -> None:
    kinds = finite.FiniteWatch.KINDS
    assert finite.non_finite_message(torch.zeros(2, 2), kinds) is None
    found = finite.non_finite_message(torch.tensor([[0.0, 7.0], [7.0, 7.0], [9.0, 0.0]]), kinds)
    assert found == ("non-finite loss (NaN or inf) at step 7 on rank 1 (seen by rank 0: dense "
                     "gradients at step 7; rank 1: loss and dense gradients at step 7; rank 2: "
                     "loss at step 9)", [1])
    _, first = finite.non_finite_message(torch.tensor([[3.0, 3.0], [3.0, 0.0]]), kinds)
    assert first == [0, 1]  # a tie: both saw the loss go non-finite in step 3
