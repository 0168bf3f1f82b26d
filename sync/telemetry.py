"""A runner's counters and the telemetry made of them (:class:`SyncStats`).

The counters are written by both threads of a shadow runner (rounds and bytes by the sync
thread, steps and applied syncs by the training thread) under one lock; the step counter and
the next snapshot's step are also what rounds are scheduled on, so they travel in checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

from shadowsync.sync.clock import Clock
from shadowsync.sync.protocol import Agreement

__all__ = ["Counters", "SyncStats", "Telemetry"]


@dataclasses.dataclass(frozen=True)
class SyncStats:
    """Per-rank synchronization telemetry.

    Attributes:
        steps: training steps seen by the runner's ``step``.
        rounds: strategy rounds completed (the final consensus is not a round).
        syncs_applied: deltas added to the live replica.
        gap_mean: mean training steps between consecutive applied syncs (the first gap
            counts from the first step); NaN before any sync.
        gap_max: largest such gap; 0 before any sync.
        staleness_mean: mean training steps between a round's snapshot and the application of
            its delta (0 for fixed-rate); NaN before any sync.
        staleness_max: largest such staleness.
        comm_seconds: seconds spent in allreduces, waiting for peers included (pauses between
            chunks excluded).
        bytes_reduced: bytes handed to allreduce (control slots included, the consensus not);
            a ring allreduce sends about ``2 (W - 1) / W`` times this per rank.
        wall_seconds: seconds the runner has been started (summed over start/stop cycles).
        rounds_per_s: ``rounds / wall_seconds``.
        round_cost: what a round in flight costs a training step, ``t_busy / t_quiet - 1``, as
            measured by the accepted-slowdown pacer (NaN without ``max_slowdown``).
        busy_share: the share of training steps a round touched, per that pacer (NaN without).
        round_steps: what one round costs training, in steps at the quiet pace, per that pacer
            (it keeps one round per ``round_steps / max_slowdown`` steps; NaN without).
        wait_seconds: seconds training waited at step boundaries for a round to finish, which
            only a shadow runner with ``max_staleness`` does (NaN without).
    """

    steps: int
    rounds: int
    syncs_applied: int
    gap_mean: float
    gap_max: int
    staleness_mean: float
    staleness_max: int
    comm_seconds: float
    bytes_reduced: int
    wall_seconds: float
    rounds_per_s: float
    round_cost: float = math.nan
    busy_share: float = math.nan
    round_steps: float = math.nan
    wait_seconds: float = math.nan


@dataclasses.dataclass
class Counters:
    """What a runner counts; ``next_snapshot`` is the first step a new round may start at."""

    steps: int = 0
    rounds: int = 0
    syncs_applied: int = 0
    last_apply_step: int = 0
    gap_sum: int = 0
    gap_max: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    comm_seconds: float = 0.0
    bytes_reduced: int = 0
    wall_seconds: float = 0.0
    next_snapshot: int = 0


class Telemetry:
    """The counters, their lock, and the wall time the runner has been started."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.counters = Counters()
        self._since: float | None = None  # started at, while started

    def started(self) -> None:
        self._since = self._clock.now()

    def stopped(self) -> None:
        """The runner stopped, failed or was abandoned (once per start)."""
        if self._since is not None:
            with self._lock:
                self.counters.wall_seconds += self._clock.now() - self._since
            self._since = None

    def reduced(self, agreement: Agreement) -> None:
        with self._lock:
            self.counters.comm_seconds += agreement.comm_s
            self.counters.bytes_reduced += agreement.nbytes

    def round_done(self) -> None:
        with self._lock:
            self.counters.rounds += 1

    def applied(self, step: int, snapshot_step: int) -> None:
        """A round whose snapshot was of ``snapshot_step`` was applied at ``step``."""
        c = self.counters
        with self._lock:
            gap, staleness = step - c.last_apply_step, step - snapshot_step
            c.syncs_applied += 1
            c.last_apply_step = step
            c.gap_sum += gap
            c.gap_max = max(c.gap_max, gap)
            c.staleness_sum += staleness
            c.staleness_max = max(c.staleness_max, staleness)

    def _wall(self) -> float:
        """Wall seconds so far (lock held)."""
        running = 0.0 if self._since is None else self._clock.now() - self._since
        return self.counters.wall_seconds + running

    def stats(self, extra: dict[str, float]) -> SyncStats:
        with self._lock:
            c = dataclasses.replace(self.counters)
            wall = self._wall()
        applied = c.syncs_applied
        return SyncStats(
            steps=c.steps, rounds=c.rounds, syncs_applied=applied,
            gap_mean=c.gap_sum / applied if applied else math.nan, gap_max=c.gap_max,
            staleness_mean=c.staleness_sum / applied if applied else math.nan,
            staleness_max=c.staleness_max, comm_seconds=c.comm_seconds,
            bytes_reduced=c.bytes_reduced, wall_seconds=wall,
            rounds_per_s=c.rounds / wall if wall > 0 else 0.0, **extra)

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {**dataclasses.asdict(self.counters), "wall_seconds": self._wall()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.counters = Counters(**state)
            if self._since is not None:
                self._since = self._clock.now()
