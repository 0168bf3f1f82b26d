"""Pacing of shadow rounds: how many quiet training steps follow a round before the next one.

Each rank's pacers *propose* a pause, in training steps, in the buffer of the round it will
follow (:class:`~.protocol.Wire`); every rank reads the same mean back, and the next round's
snapshot is taken that many steps after the step the round landed at (0: at that step). So a
pause is agreed in-band and counted in steps, never in one rank's seconds: a rank's clock
only feeds its proposal. A proposal is made before its round's
allreduce, so the pacers that work in seconds use what this rank measured of its rounds so far
(:class:`RoundTimes` of the last one) and its recent step time.

=====================  =================================================================
pacer                  proposal
=====================  =================================================================
:class:`Interval`      rounds start ``min_interval_s`` apart: the interval less the last
                       round's duration, in steps
:class:`CommShare`     rounds take at most ``max_comm_share`` of the time: the last round's
                       busy time times ``1 / share - 1``, less what it paused between chunks
:class:`SlowdownPacer` training keeps ``1 - max_slowdown`` of its step rate: quiet steps from
                       what a round costs the steps it touches, measured online
=====================  =================================================================

:class:`Pacing` takes the largest proposal and keeps the step clock that turns seconds into
steps.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import threading
from collections.abc import Sequence

from shadowsync.sync.config import check

__all__ = ["CommShare", "Interval", "Pacer", "Pacing", "RoundTimes", "SlowdownPacer"]

_EXPLORE = 4.0  # a pause that leaves three quiet steps between a landing and a snapshot


@dataclasses.dataclass(frozen=True)
class RoundTimes:
    """What this rank measured of its last completed round.

    Attributes:
        duration_s: from receiving the snapshot to posting the delta.
        paused_s: the part of it spent pausing between chunks.
    """

    duration_s: float
    paused_s: float = 0.0

    @property
    def busy_s(self) -> float:
        return self.duration_s - self.paused_s


class Pacer:
    """One pacing rule (a base class to extend). The training thread reports every step
    (:meth:`observe`); the sync thread asks for this rank's proposal as it fills a round's
    buffer (:meth:`pause_steps`)."""

    def observe(self, seconds: float, busy: bool, began_round: bool) -> None:
        """One training step's wall time, whether a round touched it, and whether it began
        one (took its snapshot)."""

    def interrupt(self) -> None:
        """Training stops being observed for a while (the runner stopped)."""

    def pause_steps(self, last: RoundTimes | None, step_s: float) -> float:
        """This rank's proposal for the quiet steps after the round being filled; ``last`` is
        the previous round (None before any), ``step_s`` the recent mean step time (NaN
        before any)."""
        raise NotImplementedError


class Interval(Pacer):
    """Round starts at least ``min_interval_s`` apart."""

    def __init__(self, min_interval_s: float) -> None:
        check("min_interval_s", min_interval_s)
        self.min_interval_s = min_interval_s

    def pause_steps(self, last: RoundTimes | None, step_s: float) -> float:
        if not step_s > 0:
            return 0.0
        took = 0.0 if last is None else last.duration_s
        return max(0.0, self.min_interval_s - took) / step_s


class CommShare(Pacer):
    """Rounds busy at most ``max_comm_share`` of the time. With chunks, part of the pause is
    taken between them (:meth:`between_chunks`), and the pause after the round is less that."""

    def __init__(self, max_comm_share: float) -> None:
        check("max_comm_share", max_comm_share)
        self.factor = 1 / max_comm_share - 1

    def pause_steps(self, last: RoundTimes | None, step_s: float) -> float:
        if last is None or not step_s > 0:
            return 0.0
        return max(0.0, last.busy_s * self.factor - last.paused_s) / step_s

    def between_chunks(self, chunk_s: float) -> float:
        """Seconds to leave the link to training after a chunk that took ``chunk_s`` (the
        ranks' agreed mean fastest chunk)."""
        return chunk_s * self.factor


class SlowdownPacer(Pacer):
    """Finds online how often a shadow round may start for training to lose at most
    ``max_slowdown`` of its step rate.

    The training loop reports each step's wall time, whether a round touched it (the step
    applied a delta, took a snapshot, or ran while a round was in flight) and whether it began
    one. Each run of *busy* steps is compared with the runs of *quiet* steps just before and
    after it: its excess over the quiet pace beside it, in steps at that pace, over the rounds
    that began in it, is ``C``, what one round costs training in steps. Beside, not overall: a
    machine's speed drifts, and where most steps are busy the recent quiet steps go back far
    enough to carry that drift into ``C``. Until a busy run has quiet steps on both sides, the
    means of the recent ``window`` steps of each kind, times the busy steps per round so far,
    stand in.

    Per round, not per busy step: a round's work (the snapshot copy, the reduction, its socket
    I/O, the delta) is the same however many steps it spans, so one round every ``G`` steps
    costs ``C / G`` of the step rate, and the pacer keeps ``G >= C / max_slowdown``.

    ``C`` is first raised for its noise: noise that puts the estimate low overspends by more
    than noise that puts it as far high underspends (the loss is convex in ``1 / C``). With
    ``se`` the ratio estimator's standard error over the bracketed runs, the loss averages
    ``max_slowdown (1 + se**2 / C**2)`` to second order, so ``C`` is raised by ``se**2 / C``;
    where ``C`` is within one ``se`` of zero, by ``se``. The margin shrinks as the runs agree
    and as there are more of them, so ``cost_window`` holds more busy steps than ``window``.

    A round that kept ``n_b`` steps busy (its snapshot step to its landing step) is followed by
    a pause of ``G - n_b + 1`` steps, so the next snapshot comes ``G`` steps after its own;
    rounds go back to back while ``G <= n_b``, and every ``explore_every`` rounds three quiet
    steps are made anyway, so the quiet pace stays measured. Means, not medians: the
    step rate is set by the mean step time, and much of a round's cost lands on one of its
    steps (the one that copies the snapshot), which a median would discard.

    Args:
        max_slowdown: accepted loss of step rate, in (0, 1): 0.05 keeps >= 95% of it.
        window: steps of each kind whose mean stands in until runs are bracketed.
        explore_every: rounds between forced quiet steps when rounds go back to back.
        cost_window: busy steps' worth of bracketed runs the round cost is estimated from.
    """

    def __init__(self, max_slowdown: float, window: int = 32, explore_every: int = 16,
                 cost_window: int = 128) -> None:
        check("max_slowdown", max_slowdown)
        check("slowdown_window", cost_window, "cost_window")
        for name, value in [("window", window), ("explore_every", explore_every)]:
            if value < 1:
                raise ValueError(f"SlowdownPacer {name} must be >= 1, got {value}")
        self.max_slowdown = max_slowdown
        self.explore_every = explore_every
        self.cost_window = cost_window
        self._quiet: collections.deque[float] = collections.deque(maxlen=window)
        self._busy: collections.deque[float] = collections.deque(maxlen=window)
        self._busy_steps_this_round = 0
        self._busy_total = self._quiet_total = self._began_total = 0
        self._rounds = 0
        # The run of steps of one kind in progress, as (busy, seconds, steps, rounds begun).
        self._run: tuple[bool, float, int, int] | None = None
        self._quiet_before: float | None = None  # mean step of the last quiet run
        # The busy run awaiting its after: (seconds, steps, rounds begun, quiet pace before).
        self._pending: tuple[float, int, int, float] | None = None
        # Bracketed busy runs: (busy seconds, what they would have taken at the quiet pace
        # beside them, busy steps, rounds begun).
        self._bracketed: collections.deque[tuple[float, float, int, int]] = collections.deque()
        self._bracketed_steps = 0  # busy steps in _bracketed
        self._lock = threading.Lock()  # observe() and the thread's reads run concurrently

    def observe(self, seconds: float, busy: bool, began_round: bool = False) -> None:
        if began_round and not busy:
            raise ValueError("a step that began a round is busy")
        with self._lock:
            (self._busy if busy else self._quiet).append(seconds)
            if self._run is not None and self._run[0] != busy:
                self._close_run(*self._run)
            kind, total, steps, began = self._run or (busy, 0.0, 0, 0)
            self._run = (kind, total + seconds, steps + 1, began + began_round)
            self._began_total += began_round
            if busy:
                self._busy_steps_this_round += 1
                self._busy_total += 1
            else:
                self._quiet_total += 1

    def _close_run(self, busy: bool, total: float, steps: int, began: int) -> None:
        """Ends the run in progress: a busy run waits for the quiet run after it; a quiet run
        brackets the busy run before it (lock held)."""
        self._run = None
        if busy:
            if self._quiet_before is not None:
                self._pending = (total, steps, began, self._quiet_before)
            return
        after = total / steps
        if self._pending is not None:
            busy_total, busy_steps, busy_began, before = self._pending
            self._pending = None
            self._bracketed.append((busy_total, busy_steps * (before + after) / 2, busy_steps,
                                    busy_began))
            self._bracketed_steps += busy_steps
            while self._bracketed_steps - self._bracketed[0][2] >= self.cost_window:
                self._bracketed_steps -= self._bracketed.popleft()[2]
        self._quiet_before = after

    def interrupt(self) -> None:
        """Training stops being observed for a while (a stop): the runs on either side of it
        do not bracket each other, but a quiet run in progress was measured in full, so it
        still brackets the busy run before it. (Else, where one round falls between two
        stops, as in turns of a benchmark, no round would ever be bracketed.)"""
        with self._lock:
            if self._run is not None and not self._run[0]:
                self._close_run(*self._run)
            self._run = self._pending = self._quiet_before = None

    def round_cost(self) -> float:
        """What a round in flight costs a training step, ``t_busy / t_quiet - 1``, over the
        recent bracketed busy runs (the recent means of each kind before any); NaN before both
        kinds are measured."""
        with self._lock:
            if self._bracketed:
                return (sum(b for b, _, _, _ in self._bracketed)
                        / sum(q for _, q, _, _ in self._bracketed) - 1.0)
            return self._window_cost()

    def _window_cost(self) -> float:
        """``t_busy / t_quiet - 1`` from the recent means of each kind; NaN before both are
        measured (lock held)."""
        if not self._quiet or not self._busy:
            return math.nan
        return statistics.fmean(self._busy) / statistics.fmean(self._quiet) - 1.0

    def round_steps(self) -> float:
        """``C``, what a round costs training in steps at the quiet pace (NaN before both kinds
        and a round are measured)."""
        return self._round_steps(margin=False)

    def _round_steps(self, margin: bool) -> float:
        """``C``, with ``margin`` raised for its noise (no margin with fewer than two runs)."""
        with self._lock:
            # Each run's excess in steps at the quiet pace beside it, and its rounds.
            runs = [(steps * (b - q) / q, n) for b, q, steps, n in self._bracketed]
            rounds = sum(n for _, n in runs)
            if rounds:
                cost = sum(e for e, _ in runs) / rounds
                if not margin or len(runs) < 2:
                    return cost
                squares = sum((e - cost * n) ** 2 for e, n in runs)
                se = math.sqrt(len(runs) / (len(runs) - 1) * squares) / rounds
                return cost + (se * se / cost if cost > se else se)
            if not self._began_total:
                return math.nan
            return self._window_cost() * self._busy_total / self._began_total

    def busy_share(self) -> float:
        """The share of all observed steps that were busy; NaN before any."""
        with self._lock:
            total = self._busy_total + self._quiet_total
            return self._busy_total / total if total else math.nan

    def round_gap(self) -> float:
        """The fewest steps from one round's start to the next that keep the budget: ``C``
        raised for its noise, over ``max_slowdown`` (NaN before any measurement)."""
        return self._round_steps(margin=True) / self.max_slowdown

    def pause_steps(self, last: RoundTimes | None = None, step_s: float = math.nan) -> float:
        """Steps from the landing of the round being filled to the next snapshot: the round
        gap less the busy steps the previous round caused, less one (the landing step is one
        of them); room for three quiet steps before any is measured, and every
        ``explore_every`` rounds."""
        del last, step_s
        gap = self.round_gap()
        with self._lock:
            self._rounds += 1
            busy_steps, self._busy_steps_this_round = max(self._busy_steps_this_round, 1), 0
            if not self._quiet:  # no quiet step measured yet: make room for a few
                return _EXPLORE
            pause = gap - busy_steps + 1 if gap > busy_steps else 0.0  # False while NaN
        if pause < _EXPLORE - 1 and self._rounds % self.explore_every == 0:
            pause = _EXPLORE  # keep the quiet pace measured even when rounds go back to back
        return pause


class Pacing:
    """The shadow runner's pacers, and the step clock that turns their seconds into steps.

    Args:
        pacers: the rules; the proposal is the largest of theirs (none: back to back).
        window: steps whose mean time is the step time.
    """

    def __init__(self, pacers: Sequence[Pacer], window: int = 32) -> None:
        self.pacers = list(pacers)
        self._steps: collections.deque[float] = collections.deque(maxlen=window)
        self._lock = threading.Lock()
        self.comm_share = next((p for p in self.pacers if isinstance(p, CommShare)), None)
        self.slowdown = next((p for p in self.pacers if isinstance(p, SlowdownPacer)), None)

    def observe(self, seconds: float, busy: bool, began_round: bool) -> None:
        """One training step (training thread)."""
        with self._lock:
            self._steps.append(seconds)
        for pacer in self.pacers:
            pacer.observe(seconds, busy, began_round)

    def interrupt(self) -> None:
        for pacer in self.pacers:
            pacer.interrupt()

    def step_s(self) -> float:
        """The recent mean step time (NaN before any step)."""
        with self._lock:
            return statistics.fmean(self._steps) if self._steps else math.nan

    def pause_steps(self, last: RoundTimes | None) -> float:
        """This rank's proposal for the round being filled (sync thread)."""
        step_s = self.step_s()
        return max((p.pause_steps(last, step_s) for p in self.pacers), default=0.0)
