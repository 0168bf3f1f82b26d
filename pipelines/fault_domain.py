"""One fault domain per training process: every failure found once, blamed right, reported once.

:class:`FaultDomain` is the one place a rank's failures meet; the trainer owns it and the
synchronizer reports to it (:meth:`FaultDomain.claim`, its failure hook).

=====================  ===================================================================
step                   how
=====================  ===================================================================
detect                 an exception in training (a collective's error or timeout
                       included: ``train.pg_timeout_s``) reaches :meth:`~FaultDomain.fail`;
                       the synchronizer's own failure reaches :meth:`~FaultDomain.claim`
                       from its thread; a peer killed, stopped or hung is found by the
                       :class:`Heartbeat`, whose thread also posts this rank's own
                       synchronizer stall (:meth:`~FaultDomain.watch_sync`), which
                       training may not live to find; SIGTERM is a stop request
                       (:meth:`~FaultDomain.stop_requested`), not a failure
decide                 the first cause wins: the job's store keeps the first failure posted
                       (its message, rank and time). A rank whose error says a peer failed
                       first (:func:`~.errors.is_consequence`) never posts; a rank about to
                       post asks the heartbeat whether every peer still lives and names
                       the one that does not. A rank never names itself as its own peer.
                       A rank whose synchronization round stalled while it waited in the
                       round's collective (:func:`~.errors.waits_on_a_peer`) first gives
                       the peer it waits on, which passes the same deadline, a grace to post.
                       A failure raised alike on every rank after an agreement (a checkpoint
                       that does not load) is posted by rank 0 only, for the job
                       (:func:`agreed_culprit`)
tell                   the post, and the heartbeat's ``silent`` key, which every rank's
                       heartbeat reads within a beat
report                 one console line ``rank N failed: ...``; the traceback only of a
                       rank's own failure; torchrun's error file with the message, stamped
                       so that torchrun's "Root Cause" (the earliest, in whole seconds) is
                       the rank that failed first: the cause at its post's second, each
                       consequence a second later
=====================  ===================================================================

Ending processes is the launcher's job, with one exception
(:meth:`~.heartbeat.Heartbeat._end_silent`): a peer on this host that stopped beating is sent
SIGKILL by the rank that found it, after that rank wrote the peer's error file for it. A
stopped process ignores SIGTERM, and the launcher would wait its grace (30 s) before its own
SIGKILL, blaming whichever rank exited first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from types import FrameType

import torch.distributed as dist

from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.errors import PeerFailed, causes, is_consequence, waits_on_a_peer
from shadowsync.pipelines.heartbeat import Heartbeat
from shadowsync.pipelines.job_store import (
    STORE_TIMEOUT_S,
    FirstFailure,
    failure_message,
    job_store,
    post_first,
    report,
    silent_message,
    this_rank,
)

__all__ = ["FaultDomain", "agreed_culprit"]

logger = logging.getLogger("shadowsync.train")

_REPEAT_S = 5.0  # a SIGTERM this soon after the first is the same stop request
_PEER_GRACE_S = 2.0  # and a beat: a round stalled in its collective lets its peer post first


def agreed_culprit(exc: BaseException) -> int | None:
    """For a failure the ranks agreed on and raise alike, the rank that reports it for the
    job, rank 0 (the others wait for its post): a checkpoint that does not load
    (:class:`~.checkpoint.CheckpointUnreadable`, whose message names each failing file and
    the rank that read it). None for a failure of a rank's own."""
    agreed = any(isinstance(e, checkpoint.CheckpointUnreadable) for e in causes(exc))
    return 0 if agreed else None


def _peer_posts(store: dist.Store, exc: BaseException, grace_s: float) -> bool:
    """Whether the job's first failure is posted, after ``grace_s`` where ``exc`` says this
    rank waited for a peer in a synchronization round (:func:`~.errors.waits_on_a_peer`):
    the peer it waited on passes the same deadline within moments and posts its own cause
    (its heartbeat does, within a beat, if its training sits in a collective)."""
    if waits_on_a_peer(exc):
        with contextlib.suppress(RuntimeError):  # no post within the grace
            store.wait(["first"], timedelta(seconds=grace_s))
    return store.check(["first"])


class FaultDomain:
    """Detects, decides, tells and reports this rank's failures (see the module's table).

    Example::

        domain = FaultDomain()
        domain.install_sigterm_handler()
        ...                                          # init_process_group
        domain.start_heartbeat(interval_s=1.0, timeout_s=30.0)
        try:
            train(domain)                            # polls domain.stop_requested()
        except FAILURES as e:
            sys.exit(domain.fail(e))                 # one line, the error file; 1
        domain.finish()
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: tells a repeated SIGTERM from a later one."""
        self._clock = clock
        self._stop_signal: int | None = None
        self._stop_at = 0.0
        self.heartbeat: Heartbeat | None = None
        self._stall_probes: list[Callable[[], BaseException | None]] = []
        self._probes_lock = threading.Lock()

    # ------------------------------------------------------------------------------ SIGTERM
    def install_sigterm_handler(self) -> None:
        """Turns SIGTERM (Slurm, Kubernetes, and torchrun passing on its own) into a stop
        request. A SIGTERM within ``_REPEAT_S`` of the first is the same request (Slurm signals
        every process of a job step, and torchrun then passes its own on: each rank gets two
        within milliseconds); a later one kills at once.

        The grace the sender gives (torchrun's ``--shutdown_timeout``, Kubernetes'
        ``terminationGracePeriodSeconds``, Slurm's ``KillWait``; 30 s by default for all three)
        must cover one training step, the final synchronization and one checkpoint write.
        """
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        del frame
        now = self._clock()
        if self._stop_signal is None:
            self._stop_signal, self._stop_at = signum, now
        elif now - self._stop_at > _REPEAT_S:  # a later, deliberate one: die now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def stop_requested(self) -> bool:
        """Whether SIGTERM reached this process (after :meth:`install_sigterm_handler`)."""
        return self._stop_signal is not None

    # ---------------------------------------------------------------------------- heartbeat
    def start_heartbeat(self, interval_s: float, timeout_s: float) -> None:
        """After ``init_process_group``: watch the peers (nothing in a world of one)."""
        if dist.get_world_size() > 1:
            self.heartbeat = Heartbeat(interval_s, timeout_s, self.own_stall)
            self.heartbeat.start()

    def _grace_s(self) -> float:
        return _PEER_GRACE_S + (self.heartbeat.interval_s if self.heartbeat is not None else 0)

    def watch_sync(self, own_stall: Callable[[], BaseException | None]) -> None:
        """Has the heartbeat's thread post this rank's synchronizer stall (``own_stall()``,
        see :meth:`~shadowsync.sync.runner.SyncRunner.own_stall`) as the job's first failure
        within a beat of its deadline, which training may never find itself (the
        :class:`~shadowsync.sync.errors.FailureSink` a synchronizer is built with)."""
        with self._probes_lock:
            self._stall_probes.append(own_stall)

    def own_stall(self) -> BaseException | None:
        """Any thread: the first stall a watched synchronizer reports, or None."""
        with self._probes_lock:
            probes = list(self._stall_probes)
        return next((stall for probe in probes if (stall := probe()) is not None), None)

    def finish(self) -> None:
        """A clean end: peers stop watching this rank."""
        beat, self.heartbeat = self.heartbeat, None
        if beat is not None:
            beat.stop()

    # ------------------------------------------------------------------------------ decide
    def claim(self, exc: BaseException) -> None:
        """Posts ``exc`` as the job's first failure where it happens (the synchronizer's
        thread calls it for its own failures), before peers learn of it and break off. A
        failure that a killed or stopped peer caused names that peer."""
        store = job_store("failure")
        try:
            if store is None or _peer_posts(store, exc, self._grace_s()):
                return
            message, blamed = self._cause(exc, "its synchronizer")
            post_first(store, message, this_rank() if blamed is None else blamed)
        except RuntimeError:
            pass  # no store: torchrun's summary is left to name the rank

    def attribute(self, exc: BaseException) -> BaseException:
        """``exc`` if this rank failed first; else a :class:`~.errors.PeerFailed` naming the
        rank that did (the first post; a peer the heartbeat finds silent)."""
        if self.heartbeat is not None:
            self.heartbeat.mark_failing()  # alive and reporting: never taken for silent
        store = job_store("failure")
        if store is None:
            return exc
        rank = str(this_rank())
        culprit = agreed_culprit(exc)
        try:
            if not is_consequence(exc) and culprit in (None, this_rank()) \
                    and not _peer_posts(store, exc, self._grace_s()):
                first, blamed = self._cause(exc, "it")
                if post_first(store, first, this_rank() if blamed is None else blamed):
                    return PeerFailed(first) if blamed is not None else exc
            store.wait(["first"], timedelta(seconds=STORE_TIMEOUT_S))
            first = store.get("first").decode()
            if store.get("first_rank").decode() == rank:  # this rank's synchronizer or its
                # heartbeat posted it, maybe for a stall that left training in a collective
                return exc if first == failure_message(exc) else FirstFailure(first)
        except RuntimeError:  # no post in time, or the store went away with its host
            return exc
        if culprit is not None:  # the same error here: no need to say it twice
            return PeerFailed(first)
        return PeerFailed(f"{first} (then here: {type(exc).__name__}: {exc})")

    def _cause(self, exc: BaseException, who: str) -> tuple[str, int | None]:
        """What this rank posts as the first failure for ``exc``, and the rank it blames
        (None: this one): a peer the heartbeat finds silent, else ``exc`` itself."""
        silent = self.heartbeat.silent_peers() if self.heartbeat is not None else []
        if not silent:
            return failure_message(exc), None
        return silent_message(silent, f"found by rank {this_rank()} when {who} failed with "
                                       f"{type(exc).__name__}: {exc}"), silent[0]

    # ------------------------------------------------------------------------------ report
    def fail(self, exc: BaseException) -> int:
        """Reports ``exc`` once (see the module's table) and returns the exit code, 1."""
        cause = self.attribute(exc)
        message = failure_message(cause)
        logger.error(message)
        own = not is_consequence(cause)
        if own:
            traceback.print_exception(cause)
        report(message, consequence=not own)
        return 1
