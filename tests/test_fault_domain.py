"""Who reports a failure: the pure decisions of the fault domain (the jobs are in
``test_faults.py``)."""

from __future__ import annotations

import os
import signal

from shadowsync.pipelines.checkpoint import CheckpointUnreadable
from shadowsync.pipelines.errors import PeerFailed, is_consequence, waits_on_a_peer
from shadowsync.pipelines.fault_domain import FaultDomain, agreed_culprit
from shadowsync.pipelines.job_store import FirstFailure, failure_message
from shadowsync.sync.errors import CollectiveFailed, RoundStalled, SyncError


def _caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


def test_an_agreed_checkpoint_failure_is_reported_by_rank_0_for_the_job() -> None:
    assert agreed_culprit(CheckpointUnreadable("rank 1: rank_00001.pt: truncated")) == 0
    assert agreed_culprit(_caused(RuntimeError("y"), CheckpointUnreadable("x"))) == 0
    assert agreed_culprit(RuntimeError("a rank's own")) is None


def test_a_round_that_waited_on_a_peer_is_told_from_one_that_stalled_itself() -> None:
    waited = RoundStalled("round 3 stalled", in_collective=True)
    stalled = RoundStalled("round 3 stalled", in_collective=False)
    assert str(waited).endswith("waiting in the collective for a peer's part")
    assert str(stalled).endswith("this rank's round did not reach the collective")
    assert waits_on_a_peer(_caused(SyncError("rank 0: synchronization failed"), waited))
    assert not waits_on_a_peer(_caused(SyncError("rank 1: synchronization failed"), stalled))
    assert waits_on_a_peer(CollectiveFailed("RuntimeError: Timed out waiting 3000ms"))
    assert not waits_on_a_peer(RuntimeError("injected"))
    assert not is_consequence(waited)  # it still posts, after the grace, if no one else does


def test_a_failure_posted_by_another_thread_of_this_rank_is_reported_as_posted() -> None:
    posted = "rank 0 failed: SyncError: rank 0: synchronization failed: RoundStalled: ..."
    assert failure_message(FirstFailure(posted), 0) == posted
    assert failure_message(PeerFailed("rank 1 failed: x"), 0) == \
        "rank 0 failed: PeerFailed: rank 1 failed: x"


def test_a_sigterm_repeated_within_seconds_is_the_same_stop_request() -> None:
    """Slurm signals every process of a step and torchrun passes its own on: a rank gets two
    SIGTERMs within milliseconds, and the second used to kill it before its checkpoint."""
    now = [100.0]
    domain = FaultDomain(clock=lambda: now[0])
    before = signal.getsignal(signal.SIGTERM)
    try:
        domain.install_sigterm_handler()
        os.kill(os.getpid(), signal.SIGTERM)
        now[0] += 4.9
        os.kill(os.getpid(), signal.SIGTERM)  # still the handler's: this process lives on
        assert domain.stop_requested()
        assert signal.getsignal(signal.SIGTERM) == domain._on_sigterm
    finally:
        signal.signal(signal.SIGTERM, before)
