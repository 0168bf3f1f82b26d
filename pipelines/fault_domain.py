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
                       first (:func:`~.faults.is_consequence`) never posts; a rank about to
                       post asks the heartbeat whether every peer still lives and names
                       the one that does not. A rank never names itself as its own peer.
                       A rank whose synchronization round stalled while it waited in the
                       round's collective (:func:`~.faults.waits_on_a_peer`) first gives
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

Ending processes is the launcher's job, with one exception, here (:meth:`Heartbeat._end_silent`):
a peer on this host that stopped beating is sent SIGKILL by the rank that found it, after
that rank wrote the peer's error file for it. A stopped process ignores SIGTERM, and the
launcher would wait its grace (30 s) before its own SIGKILL, blaming whichever rank exited
first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import NoReturn

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.console import leave_error
from shadowsync.pipelines.faults import PeerFailed, causes, is_consequence, waits_on_a_peer

__all__ = ["FaultDomain", "Heartbeat"]

logger = logging.getLogger("shadowsync.train")

_STORE_TIMEOUT_S = 3.0
_REPEAT_S = 5.0  # a SIGTERM this soon after the first is the same stop request
_PEER_GRACE_S = 2.0  # and a beat: a round stalled in its collective lets its peer post first


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


class FirstFailure(RuntimeError):
    """This rank's failure as another of its threads posted it (its whole message)."""


def failure_message(exc: BaseException, rank: int | None = None) -> str:
    if isinstance(exc, FirstFailure):
        return str(exc)
    what = (checkpoint.describe(exc) if isinstance(exc, CheckpointException)
            else f"{type(exc).__name__}: {exc}")
    return f"rank {_rank() if rank is None else rank} failed: {what}"


def _job_store(kind: str, timeout_s: float = _STORE_TIMEOUT_S) -> dist.Store | None:
    """The job's key-value store (torchrun's agent store, or rank 0's), reached afresh: a
    failing rank cannot trust its process groups. None when unreachable."""
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=timeout_s))
    except (KeyError, ValueError, RuntimeError):
        return None
    attempt = (f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
               f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    return dist.PrefixStore(f"shadowsync/{kind}/{attempt}/", store)


def _post(store: dist.Store, message: str, rank: int) -> bool:
    """Posts ``message`` as the job's first failure, that of ``rank``, unless one was."""
    if store.add("count", 1) != 1:
        return False
    store.set("first_time", repr(time.time()))
    store.set("first_rank", str(rank))
    store.set("first", message)
    return True


def _first_time(store: dist.Store | None) -> float | None:
    try:
        if store is not None and store.check(["first_time"]):
            return float(store.get("first_time").decode())
    except (RuntimeError, ValueError):
        pass
    return None


def agreed_culprit(exc: BaseException) -> int | None:
    """For a failure the ranks agreed on and raise alike, the rank that reports it for the
    job, rank 0 (the others wait for its post): a checkpoint that does not load
    (:class:`~.checkpoint.CheckpointUnreadable`, whose message names each failing file and
    the rank that read it). None for a failure of a rank's own."""
    agreed = any(isinstance(e, checkpoint.CheckpointUnreadable) for e in causes(exc))
    return 0 if agreed else None


def _peer_posts(store: dist.Store, exc: BaseException, grace_s: float) -> bool:
    """Whether the job's first failure is posted, after ``grace_s`` where ``exc`` says this
    rank waited for a peer in a synchronization round (:func:`~.faults.waits_on_a_peer`):
    the peer it waited on passes the same deadline within moments and posts its own cause
    (its heartbeat does, within a beat, if its training sits in a collective)."""
    if waits_on_a_peer(exc):
        with contextlib.suppress(RuntimeError):  # no post within the grace
            store.wait(["first"], timedelta(seconds=grace_s))
    return store.check(["first"])


def _silent_message(ranks: list[int], how: str) -> str:
    who = ", ".join(map(str, ranks))
    return (f"rank {who} failed: stopped responding (no heartbeat: killed, stopped or hung; "
            f"{how})")


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
        self._own_stall: Callable[[], BaseException | None] | None = None

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
            self.heartbeat = Heartbeat(interval_s, timeout_s)
            self.heartbeat.own_stall = self._own_stall
            self.heartbeat.start()

    def _grace_s(self) -> float:
        return _PEER_GRACE_S + (self.heartbeat.interval_s if self.heartbeat is not None else 0)

    def watch_sync(self, own_stall: Callable[[], BaseException | None]) -> None:
        """Has the heartbeat's thread post this rank's synchronizer stall (``own_stall()``,
        see :meth:`~shadowsync.sync.runner.SyncRunner.own_stall`) as the job's first failure
        within a beat of its deadline, which training may never find itself."""
        self._own_stall = own_stall
        if self.heartbeat is not None:
            self.heartbeat.own_stall = own_stall

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
        store = _job_store("failure")
        try:
            if store is None or _peer_posts(store, exc, self._grace_s()):
                return
            message, blamed = self._cause(exc, "its synchronizer")
            _post(store, message, _rank() if blamed is None else blamed)
        except RuntimeError:
            pass  # no store: torchrun's summary is left to name the rank

    def attribute(self, exc: BaseException) -> BaseException:
        """``exc`` if this rank failed first; else a :class:`~.faults.PeerFailed` naming the
        rank that did (the first post; a peer the heartbeat finds silent)."""
        if self.heartbeat is not None:
            self.heartbeat.mark_failing()  # alive and reporting: never taken for silent
        store = _job_store("failure")
        if store is None:
            return exc
        rank = str(_rank())
        culprit = agreed_culprit(exc)
        try:
            if not is_consequence(exc) and culprit in (None, _rank()) \
                    and not _peer_posts(store, exc, self._grace_s()):
                first, blamed = self._cause(exc, "it")
                if _post(store, first, _rank() if blamed is None else blamed):
                    return PeerFailed(first) if blamed is not None else exc
            store.wait(["first"], timedelta(seconds=_STORE_TIMEOUT_S))
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
        return _silent_message(silent, f"found by rank {_rank()} when {who} failed with "
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


def report(message: str, *, consequence: bool, error_file: str | None = None) -> None:
    """Writes ``message`` to torchrun's error file (this process's, or ``error_file``), stamped
    at the second of the job's first failure, a second later for a ``consequence``."""
    first = _first_time(_job_store("failure"))
    stamp = int(first if first is not None else time.time()) + int(consequence)
    leave_error(message, 1, timestamp=stamp, error_file=error_file)


class Heartbeat:
    """Finds a peer process that died or stopped, in seconds, without waiting for a collective
    to time out, and names it.

    A daemon thread adds 1 to this rank's counter in the job's store every ``interval_s`` and
    watches the next rank's counter (a ring: the store serves O(world size) requests a beat).
    A peer whose counter has not moved for ``timeout_s`` and that has not said it finished
    (killed, stopped by SIGSTOP, or its interpreter hung) makes this rank post ``rank P
    failed: stopped responding ...`` as the job's first failure, end that peer if it runs on
    this host (:meth:`_end_silent`), and exit 1 at once (its training thread may sit in a
    collective with that peer until ``train.pg_timeout_s``); every other rank's thread sees
    the post within a beat and does the same. So the job ends within ``timeout_s`` plus about
    two beats (on another host the launcher ends the silent process after its grace).

    When a rank's training thread fails, :meth:`FaultDomain.attribute` uses
    :meth:`silent_peers` (about three beats) to blame a peer that was killed rather than claim
    the cause itself, and first marks its own rank as failing, so that no peer takes it for
    silent once it exits. Without torchrun the store lives in rank 0's process: a store silent
    for ``timeout_s`` then names rank 0. A training thread hung in a live process is the
    collective timeout's to catch.
    """

    def __init__(self, interval_s: float, timeout_s: float) -> None:
        """``timeout_s`` >= 3 ``interval_s`` > 0 (``train.heartbeat_*``, checked with the
        config)."""
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        store = _job_store("heartbeat", timeout_s=max(2 * interval_s, 1.0))
        if store is None:
            raise RuntimeError("heartbeat: the job's store (MASTER_ADDR:MASTER_PORT) is "
                               "unreachable")
        self.store = store
        # Asked every beat for this rank's own synchronizer stall (FaultDomain.watch_sync).
        self.own_stall: Callable[[], BaseException | None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shadowsync-heartbeat",
                                        daemon=True)

    def start(self) -> None:
        whereabouts = {"host": socket.gethostname(), "pid": os.getpid(),
                       "error_file": os.environ.get("TORCHELASTIC_ERROR_FILE")}
        self.store.set(f"process/{self.rank}", json.dumps(whereabouts))
        self.store.add(f"alive/{self.rank}", 1)
        self._thread.start()

    def stop(self) -> None:
        """Says this rank finished (peers stop watching it) and stops the thread."""
        self._stop.set()
        self._thread.join()
        try:
            self.store.set(f"done/{self.rank}", "1")
        except RuntimeError:
            pass  # the store is gone: so is the job

    def mark_failing(self) -> None:
        """Tells peers that this rank stops on a failure it reports itself (it may exit before
        their check), so they never report it as silent."""
        store = _job_store("heartbeat")  # its own connection: the beat's thread has one
        try:
            if store is not None:
                store.set(f"done/{self.rank}", "failing")
        except RuntimeError:
            pass  # the store is gone: so is the job

    def silent_peers(self) -> list[int]:
        """The peers whose counter does not move within three beats and that did not finish
        (empty when the store cannot be reached: no one to blame)."""
        peers = [r for r in range(self.world_size) if r != self.rank]
        store = _job_store("heartbeat")  # its own connection: any thread may ask
        if store is None:
            return []
        try:
            seen = {r: _beats(store, r) for r in peers}
            deadline = time.monotonic() + 3 * self.interval_s
            while peers and time.monotonic() < deadline:
                time.sleep(self.interval_s / 4)
                peers = [r for r in peers
                         if _beats(store, r) == seen[r] and not _finished(store, r)]
        except RuntimeError:
            return []
        return peers

    def _run(self) -> None:
        peer = (self.rank + 1) % self.world_size
        seen, moved = -1, time.monotonic()
        reached = moved
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            try:
                self.store.add(f"alive/{self.rank}", 1)
                self._post_own_stall()
                count = _beats(self.store, peer)
                if self.store.check(["silent"]):
                    self._die(self.store.get("silent").decode())
                if count != seen or _finished(self.store, peer):
                    seen, moved = count, now
                reached = now
            except RuntimeError:  # the store did not answer
                if now - reached > self.timeout_s:
                    self._die(self._store_lost(now - reached))
                continue
            if now - moved > self.timeout_s:
                message = _silent_message([peer], f"found by rank {self.rank}: its heartbeat "
                                          f"stopped {now - moved:.0f} s ago")
                self.store.set("silent", message)
                failures = _job_store("failure")
                if failures is not None:
                    _post(failures, message, peer)
                self._end_silent(peer, message)
                self._die(message)

    def _post_own_stall(self) -> None:
        """Posts this rank's synchronizer stall, once, unless a failure was posted first."""
        stall = self.own_stall() if self.own_stall is not None else None
        if stall is None:
            return
        self.own_stall = None
        failures = _job_store("failure")
        if failures is not None and not failures.check(["first"]):
            _post(failures, failure_message(stall, self.rank), self.rank)

    def _end_silent(self, rank: int, message: str) -> None:
        """The one place this package ends a process: ``rank``, silent and on this host, gets
        ``message`` in its error file (so torchrun's summary blames it, not the rank that
        exits first) and SIGKILL (a stopped process ignores SIGTERM)."""
        try:
            found = json.loads(self.store.get(f"process/{rank}").decode())
            if found["host"] != socket.gethostname():
                return  # elsewhere: the launcher's to end
            if found["error_file"]:
                report(message, consequence=False, error_file=found["error_file"])
            os.kill(int(found["pid"]), signal.SIGKILL)
        except (RuntimeError, ValueError, KeyError, OSError):
            pass  # gone already

    def _store_lost(self, silent_s: float) -> str:
        if "TORCHELASTIC_RUN_ID" in os.environ:
            return (f"the job's store (torchrun's agent) has not answered for {silent_s:.0f} s "
                    f"(found by rank {self.rank})")
        return _silent_message([0], f"its process hosts the job's store, which has not "
                                    f"answered rank {self.rank} for {silent_s:.0f} s")

    def _die(self, message: str) -> NoReturn:
        """Ends this process now: its training thread may be stuck with the silent peer."""
        line = failure_message(PeerFailed(message), self.rank)
        logger.error(line)
        report(line, consequence=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _beats(store: dist.Store, rank: int) -> int:
    """``rank``'s heartbeat counter."""
    return int(store.add(f"alive/{rank}", 0))


def _finished(store: dist.Store, rank: int) -> bool:
    """Whether ``rank`` said it stops beating on purpose (done, or failing and reporting)."""
    return bool(store.check([f"done/{rank}"]))
