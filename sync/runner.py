"""Runners that drive a :class:`~.strategies.SyncStrategy` over the dense replicas.

Both runners share one round (snapshot -> ``reduce_input`` -> SUM-allreduce with the control
slots of :mod:`.protocol` -> ``delta``), one lifecycle (:mod:`.lifecycle`) and one telemetry:

* :class:`ShadowSyncRunner` runs rounds on a background thread and its own process group while
  training continues, as in ShadowSync (Zheng et al., arXiv:2003.03477, Sec. 3): the training
  loop only copies a snapshot and adds finished deltas between steps (:mod:`.handoff`).
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
collective) records it, calls ``on_failure`` (not for a peer's abort) and, unless its peers
know already, sends one more round with its abort flag so that they fail in the round they
wait in. The training thread raises it as :class:`SyncError` at its next call. A round in
flight longer than ``deadline_s`` is a stall, raised the same way. :meth:`SyncRunner.abandon`
drops a runner without a collective.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from shadowsync.sync.base import SyncRunner
from shadowsync.sync.clock import Clock
from shadowsync.sync.config import check
from shadowsync.sync.handoff import HandOff, Job, Result
from shadowsync.sync.lifecycle import FIXED_RATE
from shadowsync.sync.pacing import CommShare, Interval, Pacer, Pacing, RoundTimes, SlowdownPacer
from shadowsync.sync.protocol import (
    NonFiniteError,
    PeerAborted,
    RoundStalled,
    SyncError,
    average_,
    broadcast_,
    new_sync_group,
)
from shadowsync.sync.strategies import SyncStrategy
from shadowsync.sync.telemetry import SyncStats

__all__ = ["FixedRateSyncRunner", "NonFiniteError", "PeerAborted", "ShadowSyncRunner",
           "SlowdownPacer", "SyncError", "SyncRunner", "SyncStats", "average_", "broadcast_",
           "new_sync_group"]


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

    def __init__(self, params: Sequence[Tensor], strategy: SyncStrategy,
                 group: dist.ProcessGroup,
                 *, period: int, chunk_bytes: int | None = None,
                 clock: Clock | None = None) -> None:
        if isinstance(period, bool) or not isinstance(period, int):
            raise ValueError(f"period must be an int, got {period!r}")
        check("period", period)
        super().__init__(params, strategy, group, chunk_bytes=chunk_bytes, clock=clock,
                         table=FIXED_RATE)
        self._period = period

    def step(self) -> None:
        self._move("step")
        steps = self._telemetry.counters.steps = self._telemetry.counters.steps + 1
        self._step_busy = not (steps - 1) % self._period
        if not self._step_busy:
            return
        self._copy_live_to_snapshot()
        job = Job(steps, stop=False, given_at=self._clock.now())
        try:
            delta, agreement = self._round(job)
        except Exception as exc:
            error = self._record_failure(exc)
            self._tell(exc)
            raise error  # noqa: B904 (its __cause__ is exc)
        self._apply(Result(delta, None, job, agreement), steps)

    def stop(self, final_sync: bool = True) -> None:
        self._move("stop")
        self._telemetry.stopped()
        if final_sync:
            self.consensus()


class ShadowSyncRunner(SyncRunner):
    """ShadowSync: rounds run on a background thread while training continues.

    Zheng et al., "ShadowSync: Performing Synchronization in the Background for Highly Scalable
    Distributed Training", arXiv:2003.03477. The thread owns communication and strategy math; the
    training loop owns the parameters and the schedule. One round ``r`` (CUDA; on CPU there are
    no streams and copies are synchronous):

    ======  ===================  ===============  ==========================================
    stage   thread               CUDA stream      work and ordering
    ======  ===================  ===============  ==========================================
    apply   training (step())    main             take round ``r-1``'s result; main waits its
                                                  event; add the delta to the live params
    copy    training (step())    side             at the scheduled step: side waits main;
                                                  live -> snapshot; main waits side; give the
                                                  job (:mod:`.handoff`)
    train   training             main             steps continue; no sync work at all
    reduce  sync thread          side             ``reduce_input(snapshot)`` + control slots;
                                                  SUM-allreduce on the sync group
    agree   sync thread          side (host sync) read stop, pause, abort flags; only this
                                                  thread blocks
    delta   sync thread          side             ``delta(snapshot, reduced)``; record event;
                                                  post the result
    ======  ===================  ===============  ==========================================

    **Schedule.** A round *lands* at the step that applies it, or, with ``max_staleness`` K,
    at its snapshot step + K (the same step on every rank; the K-th step waits for the round
    if it is not done, ``shadowsync.wait``). The next snapshot is taken at the first step at
    least the agreed pause after the landing step (0: the landing step itself, which then
    applies one round and starts the next): with K, rounds start every K + pause steps
    at the same steps on every rank, each hidden behind K steps of training; without, training
    never waits. The pause is the ranks' mean proposal from their pacers (:mod:`.pacing`):
    ``min_interval_s``, ``max_comm_share`` (with chunks, part of it between the chunks) and
    ``max_slowdown`` (cost window ``slowdown_window``); none: back to back, so one boundary
    applies a round and starts the next. A snapshot is taken only when a round starts, so
    training pays one copy per round.

    **Stopping.** :meth:`stop` lets the round in flight finish and applies it; unless that
    round already agreed to stop (a peer's stop request), it runs one more round with its own
    request, and every rank's thread leaves after the same round. The stop round's pause
    carries over: after the next :meth:`start`, the first snapshot waits for it, so stopping
    (say for a checkpoint) buys no unpaced round. With ``final_sync`` the strategy's consensus
    follows. ``state_dict`` and ``load_state_dict`` only while stopped.

    **Failures.** See the module docstring; ``deadline_s`` bounds how long a round may stay in
    flight (a pause never counts) in :meth:`step`, in the K-th step's wait and in :meth:`stop`.
    ``thread_nice`` raises the thread's nice value (Linux: per thread). ``pacers`` adds pacing
    rules of one's own (:class:`~.pacing.Pacer`); ``clock`` replaces the real clock (tests:
    :class:`~.clock.ManualClock`).

    Example::

        group = new_sync_group()
        broadcast_(list(model.parameters()))
        runner = ShadowSyncRunner(list(model.parameters()), ModelAveraging(), group,
                                  max_slowdown=0.05)
        runner.start()
        for x, y in data:
            loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()
            runner.step()
        runner.stop(final_sync=True)
    """

    def __init__(self, params: Sequence[Tensor], strategy: SyncStrategy,
                 group: dist.ProcessGroup,
                 *, min_interval_s: float = 0.0, max_comm_share: float = 1.0,
                 max_slowdown: float | None = None, slowdown_window: int = 128,
                 deadline_s: float | None = None, chunk_bytes: int | None = None,
                 thread_nice: int = 0, max_staleness: int | None = None,
                 pacers: Sequence[Pacer] = (), clock: Clock | None = None) -> None:
        check("slowdown_window", slowdown_window)
        check("thread_nice", thread_nice)
        check("max_staleness", max_staleness)
        check("timeout_s", deadline_s, "deadline_s")
        rules = list(pacers)
        if min_interval_s:
            rules.append(Interval(min_interval_s))
        check("max_comm_share", max_comm_share)
        if max_comm_share < 1:
            rules.append(CommShare(max_comm_share))
        if max_slowdown is not None:
            rules.append(SlowdownPacer(max_slowdown, cost_window=slowdown_window))
        check("min_interval_s", min_interval_s)
        super().__init__(params, strategy, group, chunk_bytes=chunk_bytes, clock=clock)
        self._pacing = Pacing(rules)
        self._deadline_s = deadline_s
        self._thread_nice = thread_nice
        self._max_staleness = max_staleness
        self._wait_seconds = 0.0
        if self._device.type == "cuda":
            self._stream = torch.cuda.Stream(self._device)
        self._handoff = HandOff(self._clock)
        self._thread: threading.Thread | None = None
        self._last_round: RoundTimes | None = None  # sync thread: for the next proposal
        self._chunk_s = (0.0, 0.0)  # sync thread: (own fastest chunk, agreed) of last round
        self._step_began: float | None = None
        self._step_began_round = False
        # A round agreed to stop (this rank's stop round, or a peer's that met a round of
        # this rank's): the thread has left, and no round starts until the next start().
        self._agreed_stop = False

    @property
    def _pacer(self) -> SlowdownPacer | None:
        return self._pacing.slowdown

    def _mode_stats(self) -> dict[str, float]:
        stats = {} if self._max_staleness is None else {"wait_seconds": self._wait_seconds}
        pacer = self._pacing.slowdown
        if pacer is not None:
            stats.update(round_cost=pacer.round_cost(), busy_share=pacer.busy_share(),
                         round_steps=pacer.round_steps())
        return stats

    def start(self) -> None:
        super().start()
        self._handoff = HandOff(self._clock)
        self._step_began = None
        self._agreed_stop = False
        self._pacing.interrupt()
        self._thread = threading.Thread(target=self._thread_main, daemon=True,
                                        name=f"shadowsync-rank{self._rank}")
        self._thread.start()

    def step(self) -> None:
        """Step boundary: apply a finished round (with ``max_staleness``, wait for it at its
        K-th step), then take a snapshot if one is due. Raises :class:`SyncError` if the thread
        failed, a peer aborted, or a round stayed in flight past ``deadline_s``."""
        self._move("step")
        self._raise_if_failed()
        counters = self._telemetry.counters
        step = counters.steps = counters.steps + 1
        now = self._clock.now()
        if self._step_began is not None:
            self._pacing.observe(now - self._step_began, self._step_busy, self._step_began_round)
        self._step_began = now
        busy = self._land(step, wait=False) is not None
        self._step_began_round = (not self._agreed_stop and self._handoff.in_flight is None
                                  and step >= counters.next_snapshot)
        if self._step_began_round:
            self._give(step, stop=False)
        self._step_busy = busy or self._handoff.in_flight is not None

    def stop(self, final_sync: bool = True) -> None:
        self._move("stop")
        try:
            step = self._telemetry.counters.steps
            self._land(step, wait=True)
            if not self._agreed_stop:
                self._give(step, stop=True)
                self._land(step, wait=True)
            if not self._handoff.wait_finished(self._deadline(self._clock.now())):
                raise TimeoutError(f"the sync thread did not leave after the stop round "
                                   f"within {self._deadline_s} s")
            self._raise_if_failed()
        except Exception as exc:
            raise self._record_failure(exc)  # noqa: B904 (the first failure, with its cause)
        self._telemetry.stopped()
        self._thread = None
        self._pacing.interrupt()
        if final_sync:
            self.consensus()

    def abandon(self) -> None:
        """See :meth:`SyncRunner.abandon`. A thread waiting for a job leaves at once; one
        inside a collective leaves when its group's timeout expires; one stuck elsewhere (a
        stalled strategy) is left behind, a daemon holding nothing training needs."""
        self._handoff.close()
        super().abandon()
        self._thread = None

    # ------------------------------------------------------------------ training-thread side
    def _deadline(self, since: float) -> float | None:
        return None if self._deadline_s is None else since + self._deadline_s

    def _raise_if_failed(self) -> None:
        error = self._handoff.error
        if error is not None:
            raise self._record_failure(error)  # noqa: B904 (its __cause__ is error)

    def _land(self, step: int, wait: bool) -> Result | None:
        """Applies the round in flight if it is done, waiting for it if ``wait`` or at its
        K-th step, and schedules the next snapshot; returns it (None: nothing applied).
        Raises if the thread failed or the round stayed in flight past the deadline."""
        job = self._handoff.in_flight
        if job is None:
            return None
        result = self._handoff.take()
        k = self._max_staleness
        must = wait or (k is not None and step - job.step >= k)
        deadline = self._deadline(job.given_at)
        if result is None and must:
            began = self._clock.now()
            with record_function("shadowsync.wait"):
                result = self._handoff.wait_result(deadline)
            if not wait:
                self._wait_seconds += self._clock.now() - began
        if result is None:
            self._raise_if_failed()
            if must or (deadline is not None and self._clock.now() > deadline):
                self._handoff.fail(self._stalled(job, self._wire.in_collective))
                self._raise_if_failed()
            return None
        self._apply(result, step)
        landed = step if k is None else job.step + k
        self._telemetry.counters.next_snapshot = landed + result.agreement.pause_steps
        self._agreed_stop = result.agreement.stop
        return result

    def _stalled(self, job: Job, in_collective: bool) -> RoundStalled:
        return RoundStalled(
            f"round {self._telemetry.counters.rounds + 1} stalled: in flight for more than "
            f"{self._deadline_s} s (snapshot of step {job.step})", in_collective)

    def own_stall(self) -> SyncError | None:
        """Any thread, changing nothing: this rank's round in flight, if it stayed past
        ``deadline_s`` short of its collective (a stall of this rank's own), as training
        would raise it at its next call; else None. Training may never make that call: it
        can sit in a collective with a peer that found its round waiting for this one's and
        stopped."""
        job = self._handoff.unanswered()
        deadline = None if job is None else self._deadline(job.given_at)
        if job is None or deadline is None or self._clock.now() <= deadline \
                or self._wire.in_collective:
            return None
        return self._as_sync_error(self._stalled(job, in_collective=False))

    def _give(self, step: int, stop: bool) -> None:
        with record_function("shadowsync.snapshot"):
            self._copy_live_to_snapshot()
        self._handoff.give(Job(step, stop, self._clock.now()))

    # ------------------------------------------------------------------ sync-thread side
    def _thread_main(self) -> None:
        error: BaseException | None = None
        handoff = self._handoff  # this thread's, even if a restart makes a new one
        try:
            if self._thread_nice:
                # Linux schedules threads one by one: this lowers the sync thread alone.
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               os.getpriority(os.PRIO_PROCESS, 0) + self._thread_nice)
            with self._thread_streams():
                try:
                    self._serve(handoff)
                except BaseException as exc:  # the abort round runs on the side stream too
                    error = exc
                    handoff.fail(exc)
                    self._tell(exc, closed=handoff.closed)
        except BaseException as exc:  # the nice value or the stream itself
            error = error or exc
        finally:
            handoff.finish(error)

    def _thread_streams(self) -> contextlib.AbstractContextManager[object]:
        """The side stream (and its device) as the thread's current ones; nothing on CPU."""
        stack = contextlib.ExitStack()
        if self._stream is not None:
            stack.enter_context(torch.cuda.device(self._device))
            stack.enter_context(torch.cuda.stream(self._stream))
        return stack

    def _serve(self, handoff: HandOff) -> None:
        """Runs a round per job until a round agrees to stop or the hand-off closes."""
        comm_share = self._pacing.comm_share
        while (job := handoff.next_job()) is not None:
            began = self._clock.now()
            own_chunk, agreed_chunk = self._chunk_s
            between = None if comm_share is None else functools.partial(
                _pause_between_chunks, handoff, comm_share.between_chunks(agreed_chunk))
            delta, agreement = self._round(job, self._pacing.pause_steps(self._last_round),
                                           own_chunk, between)
            self._last_round = RoundTimes(self._clock.now() - began, agreement.paused_s)
            self._chunk_s = (agreement.fastest_chunk_s, agreement.chunk_s)
            ready = self._stream.record_event() if self._stream is not None else None
            handoff.post(Result(delta, ready, job, agreement))
            if agreement.stop:
                return


def _pause_between_chunks(handoff: HandOff, seconds: float, _fastest_s: float) -> float:
    """Leaves the link to training's traffic for ``seconds`` (the ranks' agreed chunk time
    times ``1 / max_comm_share - 1``) after a chunk; returns the seconds paused."""
    return handoff.sleep(seconds)
