"""How the synchronizer fails: its exceptions, and the sink its own failures are reported to.

=======================  ====================================================================
exception                raised when
=======================  ====================================================================
:class:`SyncError`       synchronization failed on this rank; the training loop sees every
                         failure as one (its ``__cause__`` is what happened)
:class:`PeerAborted`     another rank failed and said so in a round (its abort flag): a
                         consequence, which that rank reports
:class:`NonFiniteError`  a replica's snapshot or a round's delta held NaN or inf
:class:`RoundStalled`    a round stayed in flight past the deadline (``in_collective``: while
                         this rank waited in the collective for a peer's part)
:class:`CollectiveFailed`  a round's collective raised (a timeout, a broken connection)
=======================  ====================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["CollectiveFailed", "FailureSink", "NonFiniteError", "PeerAborted", "RoundStalled",
           "SyncError"]


class SyncError(RuntimeError):
    """Synchronization failed on this rank (or a peer aborted); the message names the rank."""


class PeerAborted(SyncError):
    """Another rank's synchronization failed and told this one so (the abort flag): a
    consequence, not a cause; that rank reports the cause."""


class NonFiniteError(SyncError):
    """A replica (its snapshot) or a round's delta held NaN or inf; names the round."""


class CollectiveFailed(RuntimeError):
    """A round's collective raised (the group's timeout while a peer's part never came, or a
    broken connection): likely a peer's failure, which that peer reports."""


class RoundStalled(TimeoutError):
    """A round stayed in flight past the synchronizer's deadline. ``in_collective``: this
    rank's part was in the round's collective, waiting for a peer's (a peer stalled first, or
    is slower than the deadline); else its own round never reached the collective."""

    def __init__(self, message: str, in_collective: bool) -> None:
        where = ("waiting in the collective for a peer's part" if in_collective
                 else "this rank's round did not reach the collective")
        super().__init__(f"{message}: {where}")
        self.in_collective = in_collective


class FailureSink(Protocol):
    """Where a synchronizer reports this rank's own failures as they happen (the trainer's
    fault domain), passed to it at construction.

    ``claim`` is called once, from the thread that found the failure, before any peer learns
    of it; ``watch_sync`` registers a probe that any thread may call, which returns this
    rank's stall that training may never find itself (see
    :meth:`~.runner.SyncRunner.own_stall`), or None.
    """

    def claim(self, exc: BaseException) -> None: ...

    def watch_sync(self, own_stall: Callable[[], BaseException | None]) -> None: ...
