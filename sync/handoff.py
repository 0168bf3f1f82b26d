"""The hand-off between the training thread and a shadow runner's sync thread: one condition,
at most one round in flight.

=========  ======================  ==========================================================
state      who moves it on         how
=========  ======================  ==========================================================
idle       training (``give``)     hands over a job: the snapshot is taken, round ``r`` starts
given      sync (``next_job``)     takes the job and runs the round
running    sync (``post``)         posts the round's result
posted     training (``take``)     takes the result (and applies it): idle again
=========  ======================  ==========================================================

Invariant: *job r is given only after result r-1 was taken, and result r is posted only for
job r.* ``give`` and ``post`` check it and raise otherwise (also under ``-O``), so a snapshot
is never taken before the previous delta is applied and no delta is posted twice.

Besides, the sync thread records how it ended (:meth:`HandOff.finish`, with its error if it
failed) and the training thread can close the hand-off (:meth:`HandOff.close`): a thread
waiting for a job then leaves. Every wait is on the one condition, with deadlines read from
the injected clock: nothing polls.
"""

from __future__ import annotations

import dataclasses
import threading

import torch
from torch import Tensor

from shadowsync.sync.clock import Clock
from shadowsync.sync.protocol import Agreement

__all__ = ["HandOff", "Job", "Result"]


@dataclasses.dataclass(frozen=True)
class Job:
    """A round's start: the snapshot of training step ``step`` is in the runner's buffer.

    Attributes:
        step: the training step the snapshot was taken after.
        stop: this rank asks every rank to stop after this round.
        given_at: clock time the job was handed over (the stall deadline counts from it).
    """

    step: int
    stop: bool
    given_at: float


@dataclasses.dataclass(frozen=True)
class Result:
    """A finished round: its delta, its CUDA completion event (None on CPU), its job and what
    the ranks agreed."""

    delta: Tensor
    ready: torch.cuda.Event | None
    job: Job
    agreement: Agreement


class HandOff:
    """See the module docstring. ``clock`` bounds the training thread's waits."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._job: Job | None = None  # given, not yet taken by the thread
        self._flight: Job | None = None  # given, its result not yet taken by training
        self._result: Result | None = None
        self._closed = False
        self._finished = False
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ training thread
    @property
    def in_flight(self) -> Job | None:
        """The job whose result training has not taken yet (None: idle)."""
        with self._cond:
            return self._flight

    def unanswered(self) -> Job | None:
        """Any thread: the job in flight while the sync thread has posted neither its result
        nor a failure (None: idle, or answered)."""
        with self._cond:
            return self._flight if self._result is None and self._error is None else None

    @property
    def error(self) -> BaseException | None:
        """What the sync thread failed with, if it did."""
        with self._cond:
            return self._error

    def give(self, job: Job) -> None:
        """Hands ``job`` to the sync thread; only while idle."""
        with self._cond:
            if self._flight is not None:
                raise RuntimeError(f"hand-off invariant broken: snapshot of step {job.step} "
                                   f"while the round of step {self._flight.step} is in flight")
            self._job = self._flight = job
            self._cond.notify_all()

    def take(self) -> Result | None:
        """The posted result, if any (without waiting); idle again once taken."""
        with self._cond:
            result, self._result = self._result, None
            if result is not None:
                self._flight = None
            return result

    def wait_result(self, until: float | None) -> Result | None:
        """Waits until the result is posted, a failure is recorded, the thread ended, or the
        clock reads ``until``; returns the result (taken) or None."""
        with self._cond:
            while (self._result is None and not self._finished and self._error is None
                   and (until is None or self._clock.now() < until)):
                self._clock.wait(self._cond, until)
        return self.take()

    def wait_finished(self, until: float | None) -> bool:
        """Waits until the sync thread ended or the clock reads ``until``; whether it ended."""
        with self._cond:
            while not self._finished and (until is None or self._clock.now() < until):
                self._clock.wait(self._cond, until)
            return self._finished

    def close(self) -> None:
        """No more jobs: a thread waiting for one (or pausing between chunks) leaves."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ sync thread
    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def next_job(self) -> Job | None:
        """Waits for a job; None once closed."""
        with self._cond:
            while self._job is None and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            job, self._job = self._job, None
            return job

    def post(self, result: Result) -> None:
        """Posts the result of the job in flight."""
        with self._cond:
            if self._flight is not result.job or self._result is not None:
                raise RuntimeError(f"hand-off invariant broken: a result for the snapshot of "
                                   f"step {result.job.step} with "
                                   f"{'a result still posted' if self._result else 'no such job'}")
            self._result = result
            self._cond.notify_all()

    def sleep(self, seconds: float) -> float:
        """Pauses the sync thread for ``seconds`` of the clock, or until closed; returns the
        seconds it paused."""
        began = self._clock.now()
        with self._cond:
            while not self._closed and self._clock.now() < began + seconds:
                self._clock.wait(self._cond, began + seconds)
        return self._clock.now() - began

    def finish(self, error: BaseException | None) -> None:
        """The sync thread ends (with ``error`` if it failed); every waiter wakes."""
        with self._cond:
            self._finished = True
            self._error = self._error or error
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Records a failure (the sync thread's, before it tells its peers; or a stall the
        training thread found), unless one is recorded; every waiter wakes."""
        with self._cond:
            self._error = self._error or error
            self._cond.notify_all()
