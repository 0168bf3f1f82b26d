"""What a training process's failures are: the exceptions that say who failed, and how a run
ends. Where a failure is found, decided and reported is :mod:`.fault_domain`; runs that go
non-finite are found by :mod:`.finite`.

Exit codes of ``python -m shadowsync.pipelines.train``:

====  ==============================================================================
code  meaning
====  ==============================================================================
0     trained to the end
1     this rank failed (its log says ``rank N failed: ...``; torchrun's summary names the
      first failing rank), including a run that went non-finite (:class:`NonFiniteValue`:
      the step, the rank that saw it first and what: loss, dense gradients, eval predictions
      or eval metrics)
2     bad configuration or data set, found before any process group started
143   preempted: SIGTERM reached some rank, every rank stopped after the same step and the
      checkpoint of that step was written; relaunch with ``checkpoint.resume=true`` (the
      default) to continue. 143 (128 + SIGTERM) and not 0, so that torchrun, torchx and
      schedulers never take a preempted job for a finished one.
====  ==============================================================================
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

from torch.distributed.checkpoint.api import CheckpointException

from shadowsync.sync.errors import CollectiveFailed, PeerAborted, RoundStalled

__all__ = ["FAILURES", "PREEMPTED_EXIT_CODE", "NonFiniteValue", "PeerFailed", "PeerNonFinite",
           "causes", "is_consequence", "waits_on_a_peer"]

PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
# What a rank's failure may be: PyTorch's CheckpointException derives from BaseException.
FAILURES: tuple[type[BaseException], ...] = (Exception, CheckpointException)


class PeerFailed(RuntimeError):
    """This rank stopped because another rank failed first (the message names it)."""


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and what caused it; a chain of causes that loops back is followed once round."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        yield exc
        seen.add(id(exc))
        exc = exc.__cause__


def is_consequence(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says that another rank failed first."""
    return any(isinstance(e, (PeerAborted, PeerNonFinite, PeerFailed)) for e in causes(exc))


def waits_on_a_peer(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is a synchronization round that failed in its
    collective (:class:`~shadowsync.sync.errors.CollectiveFailed`) or stalled while this
    rank waited there for a peer's part: the cause is likely a peer's, which finds its own
    stall at about the same deadline."""
    return any(isinstance(e, CollectiveFailed) or (isinstance(e, RoundStalled)
                                                   and e.in_collective) for e in causes(exc))


class NonFiniteValue(RuntimeError):
    """The run went non-finite: a loss, dense gradients, eval predictions or eval metrics held
    NaN or inf. The message names the step, the rank that saw it first and what; raised by
    that rank (every rank, for eval metrics computed from all ranks' predictions)."""


class PeerNonFinite(NonFiniteValue):
    """This rank stops because another rank saw a non-finite value first (a consequence:
    :meth:`~.fault_domain.FaultDomain.attribute` reports that rank's error)."""
