"""Finding a peer process that died, stopped or hung, in seconds, by a heartbeat in the job's
store (:class:`Heartbeat`)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

import torch.distributed as dist

from shadowsync.pipelines.errors import PeerFailed
from shadowsync.pipelines.job_store import (
    failure_message,
    job_store,
    post_first,
    report,
    silent_message,
)

__all__ = ["Heartbeat"]

logger = logging.getLogger("shadowsync.train")


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

    def __init__(self, interval_s: float, timeout_s: float,
                 own_stall: Callable[[], BaseException | None]) -> None:
        """``timeout_s`` >= 3 ``interval_s`` > 0 (``train.heartbeat_*``, checked with the
        config); ``own_stall``, asked every beat, returns this rank's synchronizer stall (see
        :meth:`~.fault_domain.FaultDomain.watch_sync`), posted once."""
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        store = job_store("heartbeat", timeout_s=max(2 * interval_s, 1.0))
        if store is None:
            raise RuntimeError("heartbeat: the job's store (MASTER_ADDR:MASTER_PORT) is "
                               "unreachable")
        self.store = store
        self._own_stall = own_stall
        self._stall_posted = False
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
        store = job_store("heartbeat")  # its own connection: the beat's thread has one
        try:
            if store is not None:
                store.set(f"done/{self.rank}", "failing")
        except RuntimeError:
            pass  # the store is gone: so is the job

    def silent_peers(self) -> list[int]:
        """The peers whose counter does not move within three beats and that did not finish
        (empty when the store cannot be reached: no one to blame)."""
        peers = [r for r in range(self.world_size) if r != self.rank]
        store = job_store("heartbeat")  # its own connection: any thread may ask
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
                message = silent_message([peer], f"found by rank {self.rank}: its heartbeat "
                                          f"stopped {now - moved:.0f} s ago")
                self.store.set("silent", message)
                failures = job_store("failure")
                if failures is not None:
                    post_first(failures, message, peer)
                self._end_silent(peer, message)
                self._die(message)

    def _post_own_stall(self) -> None:
        """Posts this rank's synchronizer stall, once, unless a failure was posted first."""
        stall = None if self._stall_posted else self._own_stall()
        if stall is None:
            return
        self._stall_posted = True
        failures = job_store("failure")
        if failures is not None and not failures.check(["first"]):
            post_first(failures, failure_message(stall, self.rank), self.rank)

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
        return silent_message([0], f"its process hosts the job's store, which has not "
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
