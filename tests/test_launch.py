"""The launcher's exit: 143 and one line after a clean preemption, 2 and one line for a bad
configuration, 1 and torchrun's summary otherwise."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from shadowsync.pipelines import launch
from shadowsync.pipelines.console import LOG_DIR_ENV


def _failed(*codes: int, error_file: str = "") -> ChildFailedError:
    return ChildFailedError("train", {rank: ProcessFailure(rank, 100 + rank, code, error_file)
                                      for rank, code in enumerate(codes)})


@pytest.mark.parametrize(("outcome", "expected"), [
    (None, 0),
    (_failed(143, 143), 143),
    (_failed(-15, 143), 143),  # torchrun stopped rank 0 after rank 1 exited 143
    (SignalException("got 15", signal.SIGTERM), 143),
    (SignalException("got 2", signal.SIGINT), 130),
])
def test_preemption_exits_143(outcome: BaseException | None, expected: int,
                              monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[Any] = []

    def run(args: Any) -> None:
        seen.append(args)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(launch, "run", run)
    assert launch.main(["--nproc_per_node", "2", "-m", "shadowsync.pipelines.train"]) == expected
    assert seen[0].nproc_per_node == "2" and seen[0].module  # torchrun's own parser
    err = capsys.readouterr().err
    assert (err.count("preempted:") == 1) == (outcome is not None), err


@pytest.mark.parametrize("codes", [(143, 1), (1, 1), (-15, -15), (-9, 1), (2, 1)])
def test_any_other_failure_is_torchrun_s_summary_and_exit_1(
    codes: tuple[int, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    failed = _failed(*codes)

    def run(args: Any) -> None:
        raise failed

    monkeypatch.setattr(launch, "run", run)
    assert launch.main(["-m", "shadowsync.pipelines.train"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == failed.format_msg().strip() and "Traceback" not in err


def _reply(path: Path) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(path.read_text())["message"]
    return message


@pytest.mark.parametrize(("outcome", "expected"), [
    (_failed(-15, 143), "preempted: every worker stopped after the same step"),
    (SignalException("got 15", signal.SIGTERM), "preempted: the launcher got SIGTERM"),
])
def test_preemption_is_the_reply_torchx_reads(outcome: BaseException, expected: str,
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """torchx's local_cwd shows the launcher's error file as the job's structured_error_msg."""
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))

    def run(args: Any) -> None:
        raise outcome

    monkeypatch.setattr(launch, "run", run)
    assert launch.main(["-m", "shadowsync.pipelines.train"]) == 143
    reply = _reply(tmp_path / "error.json")
    assert reply["message"].startswith(expected) and reply["errorCode"] == 143
    assert reply["message"].endswith("run the same command to resume from the checkpoint")


def test_a_failed_rank_s_error_is_the_reply(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """As torchrun's own main: the first failed rank's error file becomes the launcher's."""
    rank_file = tmp_path / "rank_1.json"
    rank_file.write_text(json.dumps({"message": {
        "message": "RuntimeError: rank 1 gave up",
        "extraInfo": {"py_callstack": "...", "timestamp": "1"}}}))
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))

    def run(args: Any) -> None:
        raise ChildFailedError("train", {1: ProcessFailure(1, 101, 1, str(rank_file))})

    monkeypatch.setattr(launch, "run", run)
    assert launch.main(["-m", "shadowsync.pipelines.train"]) == 1
    reply = _reply(tmp_path / "error.json")
    assert reply["message"] == "RuntimeError: rank 1 gave up" and reply["errorCode"] == 1


@pytest.mark.parametrize(("override", "message"), [
    ("train.bach_size=4", "error: unknown setting train.bach_size"),
    ("output_dir=/proc/shadowsync_out", "error: output_dir: /proc/shadowsync_out is not writable"),
])
def test_a_bad_config_exits_2_in_one_line_before_any_rank(
    override: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))

    def run(args: Any) -> None:
        raise AssertionError("ranks were started for a bad configuration")

    monkeypatch.setattr(launch, "run", run)
    argv = ["--nproc_per_node", "2", "-m", "shadowsync.pipelines.train", "--config", "synthetic"]
    assert launch.main([*argv, override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    reply = _reply(tmp_path / "error.json")
    assert reply["message"] == err.strip() and reply["errorCode"] == 2


@pytest.mark.parametrize("codes", [(2, 2), (2, -15), (-9, 2)])
def test_ranks_that_refuse_their_config_end_the_launch_with_2(
    codes: tuple[int, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A check only the ranks make (the data set, the sharding plan) fails on every rank with
    exit 2 (torchrun stops the others); the launch ends with 2 and no traceback, leaving the
    rank's line (which local rank 0 printed) as the reply."""
    rank_file = tmp_path / "rank.json"
    line = "error: sharding.types: ['table_row_wise'] need CUDA"
    rank_file.write_text(json.dumps({"message": {
        "message": line, "errorCode": 2, "extraInfo": {"timestamp": "1"}}}))
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))

    def run(args: Any) -> None:
        raise _failed(*codes, error_file=str(rank_file))

    monkeypatch.setattr(launch, "run", run)
    assert launch.main(["-m", "shadowsync.pipelines.train"]) == 2
    assert capsys.readouterr().err == ""
    reply = _reply(tmp_path / "error.json")
    assert reply["message"] == line and reply["errorCode"] == 2


@pytest.mark.parametrize(("job", "named"), [
    ("local_cwd://torchx/train-x1", True),
    ("slurm://torchx/4242", False),  # torchx log reads Slurm's own files
    ("", False),
])
def test_the_local_log_folder_is_passed_to_the_workers(job: str, named: bool) -> None:
    environ = {"TORCHELASTIC_ERROR_FILE": "/logs/torchx/train-x1/train/0/error.json",
               "TORCHX_JOB_ID": job}
    launch.name_log_dir(environ)
    assert environ.get(LOG_DIR_ENV) == ("/logs/torchx/train-x1/train/0" if named else None)
