"""The hand-off between the training thread and a shadow runner's sync thread: one condition,
at most one round in flight, and its states in one table.

========  =============  =============================================================
state     event          next state
========  =============  =============================================================
IDLE      ``give``       GIVEN: training took the snapshot and hands the job over
GIVEN     ``next_job``   RUNNING: the sync thread runs the round
RUNNING   ``post``       POSTED: the sync thread posts the result
RUNNING   ``post_last``  LAST: the result of a round that agreed to stop; the thread leaves
POSTED    ``take``       IDLE: training applies the result
LAST      ``take``       DRAINED: training applies it; no job is given again
IDLE      ``fail``       FAILED
GIVEN     ``fail``       FAILED: a stall (training) or a failure before the round (sync)
RUNNING   ``fail``       FAILED: the round failed (sync) or stalled (training)
POSTED    ``fail``       FAILED: a stall found just before the result came
LAST      ``fail``       FAILED
FAILED    ``fail``       FAILED: the first failure is the one kept
FAILED    ``post``       FAILED: a stalled round's late result is dropped
FAILED    ``post_last``  FAILED
any       ``close``      CLOSED: training abandoned the runner; a waiting thread leaves
CLOSED    ``fail``       CLOSED
CLOSED    ``post``       CLOSED
CLOSED    ``post_last``  CLOSED
========  =============  =============================================================

Invariant: *job r is given only after result r-1 was taken, and result r is posted only for
job r*, which the table enforces (any other event raises, also under ``-O``): a snapshot is
never taken before the previous delta is applied and no delta is posted twice. Every wait is
on the one condition, with deadlines read from the injected clock: nothing polls.
"""

from __future__ import annotations

import enum
import threading

from shadowsync.sync.clock import Clock
from shadowsync.sync.machine import Machine
from shadowsync.sync.round import Job, Result

__all__ = ["HANDOFF", "HandOff", "Slot"]


class Slot(enum.Enum):
    IDLE = "idle"  # no round in flight: the sync thread waits for a job
    GIVEN = "given"  # a job waits for the sync thread
    RUNNING = "running"  # the sync thread runs the round
    POSTED = "posted"  # its result waits for training
    LAST = "last"  # the result of a round that agreed to stop waits for training
    DRAINED = "drained"  # that result was taken: the thread left, no job is given again
    FAILED = "failed"  # a failure is recorded (the sync thread's, or a stall training found)
    CLOSED = "closed"  # the runner was abandoned


_S = Slot
HANDOFF: dict[tuple[Slot, str], Slot] = {
    (_S.IDLE, "give"): _S.GIVEN,
    (_S.GIVEN, "next_job"): _S.RUNNING,
    (_S.RUNNING, "post"): _S.POSTED,
    (_S.RUNNING, "post_last"): _S.LAST,
    (_S.POSTED, "take"): _S.IDLE,
    (_S.LAST, "take"): _S.DRAINED,
    **{(s, "fail"): _S.FAILED for s in (_S.IDLE, _S.GIVEN, _S.RUNNING, _S.POSTED, _S.LAST,
                                        _S.FAILED)},
    (_S.FAILED, "post"): _S.FAILED,
    (_S.FAILED, "post_last"): _S.FAILED,
    **{(s, "close"): _S.CLOSED for s in Slot},
    **{(_S.CLOSED, e): _S.CLOSED for e in ("fail", "post", "post_last")},
}
_IN_FLIGHT = (Slot.GIVEN, Slot.RUNNING, Slot.POSTED, Slot.LAST)


class HandOff:
    """See the module docstring. ``clock`` bounds the training thread's waits."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._job: Job | None = None  # the job in flight
        self._result: Result | None = None
        self._error: BaseException | None = None
        self._slot = Machine(HANDOFF, Slot.IDLE, self._broken)

    def _broken(self, slot: Slot, event: str) -> str:
        flight = f"the round of step {self._job.step}" if self._job is not None else "no round"
        return f"hand-off invariant broken: {event} in state {slot.name}, with {flight} in flight"

    @property
    def slot(self) -> Slot:
        """Any thread: where the hand-off is (see the module's table)."""
        return self._slot.state

    # ------------------------------------------------------------------ training thread
    @property
    def in_flight(self) -> Job | None:
        """The job whose result training has not taken yet (None: idle)."""
        with self._cond:
            return self._job if self._slot.state in _IN_FLIGHT else None

    def unanswered(self) -> Job | None:
        """Any thread: the job in flight while the sync thread has posted neither its result
        nor a failure (None: idle, or answered)."""
        with self._cond:
            return self._job if self._slot.state in (Slot.GIVEN, Slot.RUNNING) else None

    @property
    def error(self) -> BaseException | None:
        """The failure recorded first, if any."""
        with self._cond:
            return self._error

    def give(self, job: Job) -> None:
        """Hands ``job`` to the sync thread; only while idle."""
        with self._cond:
            self._slot.move("give")
            self._job = job
            self._cond.notify_all()

    def take(self) -> Result | None:
        """The posted result, if any (without waiting); taken, it leaves the slot."""
        with self._cond:
            if self._slot.state not in (Slot.POSTED, Slot.LAST):
                return None
            self._slot.move("take")
            result, self._result = self._result, None
            return result

    def wait_result(self, until: float | None) -> Result | None:
        """Waits until the result is posted, a failure is recorded, or the clock reads
        ``until``; returns the result (taken) or None."""
        with self._cond:
            while (self._slot.state in (Slot.GIVEN, Slot.RUNNING)
                   and (until is None or self._clock.now() < until)):
                self._clock.wait(self._cond, until)
        return self.take()

    def close(self) -> None:
        """No more jobs: a thread waiting for one (or pausing between chunks) leaves."""
        with self._cond:
            self._slot.move("close")
            self._cond.notify_all()

    # ------------------------------------------------------------------ sync thread
    def next_job(self) -> Job | None:
        """Waits for the next job (training takes the last result first); None once closed or
        failed."""
        with self._cond:
            while self._slot.state in (Slot.IDLE, Slot.POSTED):
                self._cond.wait()
            if self._slot.state is not Slot.GIVEN:
                return None
            self._slot.move("next_job")
            return self._job

    def post(self, result: Result) -> None:
        """Posts the result of the job in flight (the last one if its round agreed to stop)."""
        with self._cond:
            if result.job is not self._job:
                raise RuntimeError(f"hand-off invariant broken: a result for the snapshot of "
                                   f"step {result.job.step}, which is not the job in flight")
            self._slot.move("post_last" if result.agreement.stop else "post")
            if self._slot.state in (Slot.POSTED, Slot.LAST):
                self._result = result
            self._cond.notify_all()

    def sleep(self, seconds: float) -> float:
        """Pauses the sync thread for ``seconds`` of the clock, or until closed; returns the
        seconds it paused."""
        began = self._clock.now()
        with self._cond:
            while self._slot.state is not Slot.CLOSED and self._clock.now() < began + seconds:
                self._clock.wait(self._cond, began + seconds)
        return self._clock.now() - began

    def fail(self, error: BaseException) -> None:
        """Records a failure (the sync thread's, before it tells its peers; or a stall the
        training thread found), unless one is recorded; every waiter wakes."""
        with self._cond:
            self._slot.move("fail")
            self._error = self._error or error
            self._cond.notify_all()
