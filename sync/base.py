"""The machinery both runners share (:class:`SyncRunner`): the live parameters and the
snapshot, the wire (:mod:`.protocol`), one round of the strategy, applying a delta, the final
consensus, failures and how peers learn of them, the lifecycle (:mod:`.lifecycle`) and the
telemetry (:mod:`.telemetry`). The runners themselves, and the rule they keep, are in
:mod:`.runner`.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from shadowsync.sync.clock import Clock, MonotonicClock
from shadowsync.sync.handoff import Job, Result
from shadowsync.sync.lifecycle import SHADOW, Lifecycle, State
from shadowsync.sync.protocol import (
    Agreement,
    NonFiniteError,
    PeerAborted,
    SyncError,
    Wire,
    check_params,
    views,
)
from shadowsync.sync.strategies import SyncStrategy
from shadowsync.sync.telemetry import SyncStats, Telemetry

__all__ = ["SyncRunner"]


class SyncRunner(abc.ABC):
    """Owns the live dense parameters, the flat buffers, the strategy and the sync group.

    Lifecycle (every call collective across ranks unless noted; see :mod:`.lifecycle`)::

        group = new_sync_group()            # every rank, before any thread starts
        broadcast_(params)                  # replicas identical
        runner = ShadowSyncRunner(params, strategy, group)   # or FixedRateSyncRunner
        runner.start()
        for batch in data:
            loss = ...; loss.backward(); optimizer.step()
            runner.step()                   # may apply a delta / take a snapshot
        runner.stop(final_sync=True)        # replicas end bit-identical

    ``chunk_bytes`` splits each allreduce into collectives of at most that many bytes.
    """

    def __init__(self, params: Sequence[Tensor], strategy: SyncStrategy,
                 group: dist.ProcessGroup,
                 *, chunk_bytes: int | None = None, clock: Clock | None = None,
                 table: dict[tuple[State, str], State] = SHADOW) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group "
                               "first")
        if not isinstance(strategy, SyncStrategy):
            raise TypeError(f"strategy must be a SyncStrategy, got {type(strategy).__name__}")
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a ProcessGroup (see new_sync_group()), "
                            f"got {type(group).__name__}")
        self._params = check_params(params)
        self._strategy = strategy
        self._rank = dist.get_rank()
        self._clock: Clock = clock or MonotonicClock()
        self._device = self._params[0].device
        numel = sum(p.numel() for p in self._params)
        dtype = self._params[0].dtype
        self._snapshot = torch.empty(numel, dtype=dtype, device=self._device)
        self._snapshot_views = views(self._snapshot, self._params)
        self._wire = Wire(numel, strategy.wire_dtype or dtype, self._device, group, chunk_bytes,
                          self._clock)
        self._lifecycle = Lifecycle(table)
        self._telemetry = Telemetry(self._clock)
        self._stream: torch.cuda.Stream | None = None
        self._strategy_ready = False
        self._failure: SyncError | None = None
        self._peers_gone = False  # a round agreed to stop: peers left, no abort reaches them
        self._step_busy = False  # synchronization touched the step in progress
        # Called once with this rank's own failure (not a peer's abort), from whichever thread
        # found it, before peers are told: the trainer reports it to the job from there.
        self.on_failure: Callable[[SyncError], None] | None = None

    # ------------------------------------------------------------------ public API
    @property
    def strategy(self) -> SyncStrategy:
        """The strategy (its state is only consistent across ranks while stopped)."""
        return self._strategy

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
        """Begin synchronizing; replicas must be identical (see :func:`broadcast_`) the first
        time: the first start (or ``load_state_dict``) takes the strategy's state from the live
        replica, later ones resume with it."""
        self._move("start")
        self._init_strategy()
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
        """Collective, once stopped on every rank: overwrite every replica with the strategy's
        consensus model (see each strategy), computed from the reduced buffer alone, so every
        rank ends with the same bits. ``stop(final_sync=True)`` is ``stop`` and this."""
        self._move("consensus")
        with record_function("shadowsync.consensus"), torch.no_grad():
            self._copy_live_to_snapshot()
            wire = self._wire.like(self._snapshot.dtype)  # full precision: the kept model
            try:
                wire.allreduce(self._strategy.consensus_input(self._snapshot))
                model = self._strategy.consensus(wire.payload)
                self._check_finite(model, "the consensus model", self._telemetry.counters.steps)
            except Exception as exc:
                raise self._record_failure(exc)  # noqa: B904 (its __cause__ is exc)
            torch._foreach_copy_(self._params, views(model, self._params))

    def failure(self) -> SyncError | None:
        """The failure this runner recorded (its own, or a peer's abort), as :meth:`step`
        raises it; None while it has not failed."""
        return self._failure

    def own_stall(self) -> SyncError | None:
        """Any thread: a stall of this rank's own round that training may not find (see
        :meth:`~.runner.ShadowSyncRunner.own_stall`); None where rounds run in training's
        own thread."""
        return None

    def stats(self) -> SyncStats:
        """Telemetry of this rank so far."""
        return self._telemetry.stats(self._mode_stats())

    def _mode_stats(self) -> dict[str, float]:
        """Telemetry only some runners have."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Strategy state plus the counters (the step counter and the next snapshot's step
        schedule rounds). Consistent across ranks whenever the lifecycle allows the call."""
        self._move("state_dict")
        self._init_strategy()
        return {"strategy": self._strategy.state_dict(), "counters": self._telemetry.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output, after the replica itself has been restored."""
        self._move("load_state_dict")
        self._init_strategy()
        self._strategy.load_state_dict(state_dict["strategy"])
        self._telemetry.load_state_dict(state_dict["counters"])

    # ------------------------------------------------------------------ shared machinery
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

    def _init_strategy(self) -> None:
        if not self._strategy_ready:
            self._copy_live_to_snapshot()
            self._strategy.init(self._snapshot, self._wire.world)
            self._strategy_ready = True

    @torch.no_grad()
    def _copy_live_to_snapshot(self) -> None:
        """Snapshot the live replica; on the side stream (if any), fenced both ways: the side
        stream waits for the main stream's pending work on the parameters, and the main stream
        waits for the copy before the next optimizer step can overwrite them."""
        if self._stream is None:
            torch._foreach_copy_(self._snapshot_views, self._params)
            return
        main = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(main)
        with torch.cuda.stream(self._stream):
            torch._foreach_copy_(self._snapshot_views, self._params)
        main.wait_stream(self._stream)

    def _check_finite(self, t: Tensor, what: str, step: int) -> None:
        """Raise :class:`NonFiniteError` if ``t`` holds NaN or inf (one fused reduction, read
        on the thread that runs the round)."""
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteError(
                f"rank {self._rank}: {what} is not finite in synchronization round "
                f"{self._telemetry.counters.rounds + 1} (snapshot of step {step})")

    def _round(self, job: Job, pause_steps: float = 0.0, chunk_s: float = 0.0,
               between: Callable[[float], float] | None = None) -> tuple[Tensor, Agreement]:
        """One strategy round on the snapshot; the delta and what the ranks agreed. A replica
        or delta that is not finite raises on the rank that holds it, before its peers average
        it in. The caller hands any exception to :meth:`_tell` (and records it)."""
        self._check_finite(self._snapshot, "the dense replica", job.step)
        with record_function("shadowsync.reduce_input"):
            payload = self._strategy.reduce_input(self._snapshot)
        agreement = self._wire.allreduce(payload, stop=job.stop, pause_steps=pause_steps,
                                         chunk_s=chunk_s, pause_between_chunks=between)
        self._peers_gone = agreement.stop
        self._telemetry.reduced(agreement)
        with record_function("shadowsync.delta"):
            delta = self._strategy.delta(self._snapshot, self._wire.payload)
        self._check_finite(delta, "the delta", job.step)
        self._telemetry.round_done()
        return delta, agreement

    def _tell(self, exc: BaseException, closed: bool = False) -> None:
        """Make sure this rank's failure is reported (``on_failure``) and that peers learn of
        it: one round with this rank's abort flag, unless peers know already (a peer's abort),
        are gone (a round agreed to stop), cannot be reached (the collective failed) or the
        runner was abandoned (``closed``). On the thread that runs rounds."""
        error = self._as_sync_error(exc)
        if self.on_failure is not None and not isinstance(exc, PeerAborted):
            try:  # before the peers learn of it, so that their report can name this one
                self.on_failure(error)
            except Exception as hook_error:
                error.add_note(f"(the failure hook failed too: {hook_error!r})")
        if isinstance(exc, PeerAborted) or self._peers_gone or self._wire.broken or closed:
            return
        self._peers_gone = True
        with contextlib.suppress(BaseException):  # peers then hit the group's timeout
            self._wire.allreduce(None, abort=True)

    @torch.no_grad()
    def _apply(self, result: Result, step: int) -> None:
        """Add a finished delta to the live replica (training thread, between steps)."""
        with record_function("shadowsync.apply"):
            if result.ready is not None:
                main = torch.cuda.current_stream(self._device)
                main.wait_event(result.ready)
                result.delta.record_stream(main)
            torch._foreach_add_(self._params, views(result.delta, self._params))
        self._telemetry.applied(step, result.job.step)
