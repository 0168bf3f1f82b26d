"""Runners that drive a :class:`~.round.Round` over replica sets: what both share
(:class:`SyncRunner`), and the fixed-rate runner; the shadow runner is in :mod:`.shadow`.

* :class:`~.shadow.ShadowSyncRunner` runs rounds on a background thread and its own process
  group while training continues, as in ShadowSync (Zheng et al., arXiv:2003.03477, Sec. 3):
  the training loop only copies a snapshot and adds finished deltas between steps.
* :class:`FixedRateSyncRunner` runs the same round blocking on the training thread every
  ``period`` steps: the paper's FR-* baselines, and local SGD / post-local SGD model averaging
  (Lin et al., arXiv:1808.07217) when the strategy is model averaging.

**The rule.** Whatever decides when a rank enters a collective or takes a snapshot is computed
from values every rank holds: the step counter, the settings, and what the reduced buffer of
a round said (stop, the agreed pause in steps); never from one rank's clock. Where training
waits for a round (``max_staleness``, ``stop``), the round's snapshot was taken at a step every
rank agreed on, so every peer's thread can reach that round without its training thread,
which may be blocked in training's own collectives. Without ``max_staleness`` training never
waits, and a rank's next snapshot is the agreed pause after the step that applied its last
round, which may be a step apart from a peer's: only the sync threads then wait for each
other, inside the allreduce. Clocks (injected, :mod:`.clock`) only measure and bound waits:
the stall deadline counts the time a round is in flight, never a pause.

Facts these rely on: gloo collectives release the GIL; a thread must never write live
parameters while autograd runs (it fails with "modified by an inplace operation" and takes the
peer down), so the thread only posts deltas.

**Failures.** A rank whose round fails (the strategy, a non-finite replica or delta, the
collective) records it, calls ``on_failure`` (not for a peer's abort) and, while its wire is
open (:mod:`.protocol`: peers neither told, gone nor unreachable), sends one more round with
its abort flag so that they fail in the round they wait in. The training thread raises it as
:class:`~.errors.SyncError` at its next call. A round in flight longer than ``deadline_s`` is a
stall, raised the same way. :meth:`SyncRunner.abandon` drops a runner without a collective.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from shadowsync.sync.clock import Clock, MonotonicClock
from shadowsync.sync.config import check
from shadowsync.sync.errors import PeerAborted, SyncError
from shadowsync.sync.lifecycle import FIXED_RATE, SHADOW, State, lifecycle
from shadowsync.sync.protocol import Control, Levels, Wire, WireState
from shadowsync.sync.round import Job, ReplicaSet, Round
from shadowsync.sync.telemetry import SyncStats, Telemetry

__all__ = ["FixedRateOptions", "FixedRateSyncRunner", "Replicas", "SyncRunner"]

Replicas = ReplicaSet | Sequence[ReplicaSet]
OnFailure = Callable[[SyncError], None]


class SyncRunner(abc.ABC):
    """Owns the replica sets, their round, its wire and the sync group.

    Lifecycle (every call collective across ranks unless noted; see :mod:`.lifecycle`)::

        group = new_sync_group()            # every rank, before any thread starts
        broadcast_(params)                  # replicas identical
        runner = ShadowSyncRunner(ReplicaSet(params, strategy), group)  # or FixedRateSyncRunner
        runner.start()
        for batch in data:
            loss = ...; loss.backward(); optimizer.step()
            runner.step()                   # may apply a delta / take a snapshot
        runner.stop(final_sync=True)        # replicas end bit-identical

    Args:
        replicas: one replica set, or several that travel in the same rounds.
        group: the synchronizer's process group (:func:`~.groups.new_sync_group`), or
            :class:`~.protocol.Levels` over it (the dense round's sum in two levels).
        chunk_bytes: splits each allreduce into collectives of at most that many bytes.
        clock: what rounds are timed on (default: the real clock).
        on_failure: called once with this rank's own failure (not a peer's abort), from
            whichever thread found it, before peers are told (the trainer reports it to the
            job from there).
    """

    TABLE: ClassVar[dict[tuple[State, str], State]] = SHADOW
    SIDE_STREAM: ClassVar[bool] = False  # rounds run on a CUDA stream of their own

    def __init__(self, replicas: Replicas, group: dist.ProcessGroup | Levels,
                 chunk_bytes: int | None, clock: Clock | None,
                 on_failure: OnFailure | None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group "
                               "first")
        if not isinstance(group, dist.ProcessGroup | Levels):
            raise TypeError(f"group must be a ProcessGroup (see new_sync_group()) or Levels, "
                            f"got {type(group).__name__}")
        sets = [replicas] if isinstance(replicas, ReplicaSet) else list(replicas)
        if not sets or not all(isinstance(r, ReplicaSet) for r in sets):
            raise TypeError("replicas must be a ReplicaSet or a non-empty list of them")
        self._rank = dist.get_rank()
        self._clock: Clock = clock or MonotonicClock()
        self._telemetry = Telemetry(self._clock)
        device = sets[0].snapshot.device
        stream = (torch.cuda.Stream(device) if self.SIDE_STREAM and device.type == "cuda"
                  else None)
        self._round = Round.of(sets, group, chunk_bytes, self._clock, self._telemetry, stream)
        self._lifecycle = lifecycle(self.TABLE)
        self._failure: SyncError | None = None
        self._on_failure = on_failure
        self._step_busy = False  # synchronization touched the step in progress

    # ------------------------------------------------------------------ public API
    @property
    def replicas(self) -> list[ReplicaSet]:
        """The replica sets (their strategies' state is consistent across ranks only while
        stopped)."""
        return self._round.replicas

    @property
    def state(self) -> State:
        return self._lifecycle.state

    @property
    def step_busy(self) -> bool:
        """Whether synchronization touches the training step in progress: it began with a
        blocking round (fixed rate), or with a round's snapshot or delta, or a round is in
        flight (shadow)."""
        return self._step_busy

    @property
    def syncs_applied(self) -> int:
        """Deltas added to the live replica so far (training thread; cheap)."""
        return self._telemetry.counters.syncs_applied

    def start(self) -> None:
        """Begin synchronizing; replicas must be identical (see :func:`~.groups.broadcast_`)
        the first time: the first start (or ``load_state_dict``) takes the strategies' state
        from the live replicas, later ones resume with it."""
        self._move("start")
        self._round.init()
        self._round.reopen()
        self._step_busy = False
        self._telemetry.started()

    @abc.abstractmethod
    def step(self) -> None:
        """Call once per training step, after ``optimizer.step()``, on every rank."""

    @abc.abstractmethod
    def stop(self, final_sync: bool = True) -> None:
        """Stop synchronizing on every rank; with ``final_sync`` replicas end bit-identical."""

    def abandon(self) -> None:
        """Local: stop using this runner without a collective, after it failed on some rank
        or training failed. It cannot be used again; its group is left to time out."""
        self._telemetry.stopped()
        self._lifecycle.move("abandon")

    def consensus(self) -> None:
        """Collective, once stopped on every rank: overwrite every replica with its strategy's
        consensus model (see each strategy), computed from the reduced buffer alone, so every
        rank ends with the same bits. ``stop(final_sync=True)`` is ``stop`` and this."""
        self._move("consensus")
        try:
            self._round.consensus(self._telemetry.counters.steps)
        except Exception as exc:
            raise self._record_failure(exc)  # noqa: B904 (its __cause__ is exc)

    def failure(self) -> SyncError | None:
        """The failure this runner recorded (its own, or a peer's abort), as :meth:`step`
        raises it; None while it has not failed."""
        return self._failure

    def own_stall(self) -> SyncError | None:
        """Any thread: a stall of this rank's own round that training may not find (see
        :meth:`~.shadow.ShadowSyncRunner.own_stall`); None where rounds run in training's
        own thread."""
        return None

    def stats(self) -> SyncStats:
        """Telemetry of this rank so far."""
        return self._telemetry.stats(self._mode_stats())

    def _mode_stats(self) -> dict[str, float]:
        """Telemetry only some runners have."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Each set's strategy state, by set name, plus the counters (the step counter and the
        next snapshot's step schedule rounds). Consistent across ranks whenever the lifecycle
        allows the call."""
        self._move("state_dict")
        self._round.init()
        return {"strategies": {r.name: r.strategy.state_dict() for r in self.replicas},
                "counters": self._telemetry.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (or an older one's single ``strategy``), after
        the replicas themselves have been restored."""
        self._move("load_state_dict")
        self._round.init()
        states = state_dict.get("strategies") or {self.replicas[0].name: state_dict["strategy"]}
        if set(states) != {r.name for r in self.replicas}:
            raise KeyError(f"synchronizer state for {sorted(states)}, this runner has "
                           f"{[r.name for r in self.replicas]}")
        for r in self.replicas:
            r.strategy.load_state_dict(states[r.name])
        self._round.restored()
        self._telemetry.load_state_dict(state_dict["counters"])

    # ------------------------------------------------------------------ failures
    def _move(self, call: str) -> None:
        """Moves the lifecycle; in FAILED, a call it allows raises the recorded failure."""
        if self._lifecycle.state is State.FAILED and self._lifecycle.allows(call):
            assert self._failure is not None
            raise self._failure
        self._lifecycle.move(call)

    def _as_sync_error(self, exc: BaseException) -> SyncError:
        """``exc`` as the training loop sees it: a SyncError naming this rank, of the same
        subclass when ``exc`` is one (a peer's abort, a non-finite replica)."""
        cls = type(exc) if isinstance(exc, SyncError) else SyncError
        error = cls(f"rank {self._rank}: synchronization failed: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error

    def _record_failure(self, exc: BaseException) -> SyncError:
        """Training thread: FAILED, with ``exc`` as :meth:`_as_sync_error` (the first failure
        stays the one raised, with its own cause: raise it as it is, never ``from`` a later
        exception, which could make its chain of causes a loop)."""
        if self._failure is None:
            self._failure = self._as_sync_error(exc)
        self._telemetry.stopped()
        if self._lifecycle.allows("fail"):
            self._lifecycle.move("fail")
        return self._failure

    def _tell(self, exc: BaseException, closed: bool = False) -> None:
        """Make sure this rank's failure is reported (``on_failure``) and that peers learn of
        it: one round with this rank's abort flag while the wire is open (not after a peer's
        abort, a round that agreed to stop, a collective that raised) and the runner was not
        abandoned (``closed``). On the thread that runs rounds."""
        error = self._as_sync_error(exc)
        if self._on_failure is not None and not isinstance(exc, PeerAborted):
            try:  # before the peers learn of it, so that their report can name this one
                self._on_failure(error)
            except Exception as hook_error:
                error.add_note(f"(the failure hook failed too: {hook_error!r})")
        wire: Wire = self._round.wire
        if closed or wire.state is not WireState.OPEN:
            return
        with contextlib.suppress(BaseException):  # peers then hit the group's timeout
            wire.allreduce(None, Control(abort=True))


@dataclasses.dataclass(frozen=True)
class FixedRateOptions:
    """How a :class:`FixedRateSyncRunner` runs: a round every ``period`` steps, allreduces
    split into collectives of at most ``chunk_bytes``, timed on ``clock``."""

    period: int = 1
    chunk_bytes: int | None = None
    clock: Clock | None = None

    def __post_init__(self) -> None:
        if isinstance(self.period, bool) or not isinstance(self.period, int):
            raise ValueError(f"period must be an int, got {self.period!r}")
        check("period", self.period)


class FixedRateSyncRunner(SyncRunner):
    """Blocking synchronization every ``period`` training steps (the paper's FR-* baselines).

    The round runs on the training thread and its delta is added at once (no staleness).
    Rounds follow steps ``1, period + 1, 2 * period + 1, ...`` of the runner's lifetime,
    checkpoints included: the schedule of ``torch.distributed.algorithms.model_averaging.
    averagers.PeriodicModelAverager(period, warmup_steps=0)``; with
    :class:`~.strategies.ModelAveraging` the two give the same replicas (up to the rounding of
    ``x + (mean - x)`` versus ``mean``). State is rank-consistent after any step, so
    ``state_dict`` and ``load_state_dict`` may be called while running.
    """

    TABLE = FIXED_RATE

    def __init__(self, replicas: Replicas, group: dist.ProcessGroup | Levels,
                 options: FixedRateOptions = FixedRateOptions(),
                 on_failure: OnFailure | None = None) -> None:
        super().__init__(replicas, group, options.chunk_bytes, options.clock, on_failure)
        self._period = options.period

    def step(self) -> None:
        self._move("step")
        steps = self._telemetry.counters.steps = self._telemetry.counters.steps + 1
        self._step_busy = not (steps - 1) % self._period
        if not self._step_busy:
            return
        self._round.snapshot()
        job = Job(steps, stop=False, given_at=self._clock.now())
        try:
            result = self._round.exchange(job, Control())
        except Exception as exc:
            error = self._record_failure(exc)
            self._tell(exc)
            raise error  # noqa: B904 (its __cause__ is exc)
        self._round.apply(result, steps)

    def stop(self, final_sync: bool = True) -> None:
        self._move("stop")
        self._telemetry.stopped()
        if final_sync:
            self.consensus()
