"""The synchronizer's clock, injected: every reading of time and every timed wait goes through
one :class:`Clock`, so a test drives time by hand (:class:`ManualClock`) instead of sleeping.

Time decides no collective here (see :mod:`.runner`): it only measures (pacing, telemetry) and
bounds waits (the stall deadline, the pause between chunks).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


class Clock(Protocol):
    """Seconds from an arbitrary origin, and a timed wait on a condition."""

    def now(self) -> float:
        """The current time in seconds (monotonic)."""
        ...

    def wait(self, cond: threading.Condition, until: float | None) -> None:
        """Waits on ``cond`` (held by the caller) until it is notified or this clock reads
        ``until`` (None: no limit). May return early: callers re-check what they wait for,
        and the time."""
        ...


class MonotonicClock:
    """The real clock: ``time.perf_counter`` and ``Condition.wait``."""

    def now(self) -> float:
        return time.perf_counter()

    def wait(self, cond: threading.Condition, until: float | None) -> None:
        cond.wait(None if until is None else max(until - self.now(), 0.0))


class ManualClock:
    """A clock that moves only when :meth:`advance` is called (tests).

    A timed wait returns when its condition is notified or when :meth:`advance` moves time
    past its end, so code that waits for a deadline is driven without any real sleep.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._waiting: dict[threading.Condition, int] = {}

    def now(self) -> float:
        with self._lock:
            return self._now

    def wait(self, cond: threading.Condition, until: float | None) -> None:
        with self._lock:  # checked and registered at once: no advance() slips in between
            if until is not None and self._now >= until:
                return
            self._waiting[cond] = self._waiting.get(cond, 0) + 1
        try:
            cond.wait()
        finally:
            with self._lock:
                self._waiting[cond] -= 1
                if not self._waiting[cond]:
                    del self._waiting[cond]

    def advance(self, seconds: float) -> None:
        """Moves time on by ``seconds`` and wakes every timed wait, which re-checks."""
        if seconds < 0:
            raise ValueError(f"time moves forward only, got {seconds}")
        with self._lock:
            self._now += seconds
            waiting = list(self._waiting)
        for cond in waiting:
            with cond:
                cond.notify_all()
