"""The launcher's exit: 143 and one line after a clean preemption, torchrun's own otherwise."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from shadowsync.pipelines import launch


def _failed(*codes: int) -> ChildFailedError:
    return ChildFailedError("train", {rank: ProcessFailure(rank, 100 + rank, code, "")
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


@pytest.mark.parametrize("codes", [(143, 1), (1, 1), (-15, -15), (-9, 1)])
def test_any_other_failure_is_torchrun_s(codes: tuple[int, ...],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def run(args: Any) -> None:
        raise _failed(*codes)

    monkeypatch.setattr(launch, "run", run)
    with pytest.raises(ChildFailedError):
        launch.main(["-m", "shadowsync.pipelines.train"])
