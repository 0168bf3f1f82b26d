"""ShadowSync: rounds run on a background thread while training continues.

Zheng et al., "ShadowSync: Performing Synchronization in the Background for Highly Scalable
Distributed Training", arXiv:2003.03477. The thread owns communication and strategy math; the
training loop owns the parameters and the schedule. The round itself is :mod:`.round`'s; this
module decides which thread runs each of its stages and when a round starts:

==============  ==========  ===================================================================
where           thread      what
==============  ==========  ===================================================================
``step``        training    land the round in flight if done (at its K-th step: wait for it):
                            ``Round.apply``; then, if the schedule says so, ``Round.snapshot``
                            and ``HandOff.give``
``_serve``      sync        ``HandOff.next_job``; ``Round.exchange`` with this rank's control
                            values (the pacers' proposal); ``HandOff.post``
``stop``        training    land the round in flight, give one with the stop request unless a
                            round agreed to stop already, land it; the thread has then left
==============  ==========  ===================================================================

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

**Stopping.** :meth:`ShadowSyncRunner.stop` lets the round in flight finish and applies it;
unless that round already agreed to stop (a peer's stop request: the hand-off is DRAINED), it
runs one more round with its own request, and every rank's thread leaves after the same
round. The stop round's pause carries over: after the next ``start``, the first snapshot waits
for it, so stopping (say for a checkpoint) buys no unpaced round. With ``final_sync`` the
strategies' consensus follows. ``state_dict`` and ``load_state_dict`` only while stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.profiler import record_function

from shadowsync.sync.clock import Clock
from shadowsync.sync.config import check
from shadowsync.sync.errors import RoundStalled, SyncError
from shadowsync.sync.handoff import HandOff, Slot
from shadowsync.sync.pacing import CommShare, Interval, Pacer, Pacing, RoundTimes, SlowdownPacer
from shadowsync.sync.protocol import Control, Levels
from shadowsync.sync.round import Job, Result
from shadowsync.sync.runner import OnFailure, Replicas, SyncRunner

__all__ = ["ShadowOptions", "ShadowSyncRunner"]


@dataclasses.dataclass(frozen=True)
class ShadowOptions:
    """How a :class:`ShadowSyncRunner` paces and bounds its rounds (see the module docstring).

    Attributes:
        min_interval_s: round starts at least this far apart.
        max_comm_share: rounds busy at most this share of the time.
        max_slowdown: training keeps ``1 - max_slowdown`` of its step rate (None: no such
            pacer), its round cost measured over ``slowdown_window`` busy steps.
        deadline_s: how long a round may stay in flight (a pause never counts) in ``step``,
            in the K-th step's wait and in ``stop``; None: no bound.
        chunk_bytes: the most bytes one collective of a round carries.
        thread_nice: raises the sync thread's nice value (Linux: per thread).
        max_staleness: K, every round lands at most K steps after its snapshot.
        pacers: pacing rules of one's own (:class:`~.pacing.Pacer`).
        clock: replaces the real clock (tests: :class:`~.clock.ManualClock`).
    """

    min_interval_s: float = 0.0
    max_comm_share: float = 1.0
    max_slowdown: float | None = None
    slowdown_window: int = 128
    deadline_s: float | None = None
    chunk_bytes: int | None = None
    thread_nice: int = 0
    max_staleness: int | None = None
    pacers: Sequence[Pacer] = ()
    clock: Clock | None = None

    def __post_init__(self) -> None:
        check("slowdown_window", self.slowdown_window)
        check("thread_nice", self.thread_nice)
        check("max_staleness", self.max_staleness)
        check("timeout_s", self.deadline_s, "deadline_s")
        check("max_comm_share", self.max_comm_share)
        check("min_interval_s", self.min_interval_s)
        if self.max_slowdown is not None:
            check("max_slowdown", self.max_slowdown)

    def pacing(self) -> Pacing:
        """The pacing these options ask for: the given pacers and one per setting."""
        rules = list(self.pacers)
        if self.min_interval_s:
            rules.append(Interval(self.min_interval_s))
        if self.max_comm_share < 1:
            rules.append(CommShare(self.max_comm_share))
        if self.max_slowdown is not None:
            rules.append(SlowdownPacer(self.max_slowdown, cost_window=self.slowdown_window))
        return Pacing(rules)


class ShadowSyncRunner(SyncRunner):
    """Rounds on a background thread while training continues (see the module docstring).

    Example::

        group = new_sync_group()
        broadcast_(list(model.parameters()))
        runner = ShadowSyncRunner(ReplicaSet(list(model.parameters()), ModelAveraging()),
                                  group, ShadowOptions(max_slowdown=0.05))
        runner.start()
        for x, y in data:
            loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()
            runner.step()
        runner.stop(final_sync=True)
    """

    SIDE_STREAM = True

    def __init__(self, replicas: Replicas, group: dist.ProcessGroup | Levels,
                 options: ShadowOptions = ShadowOptions(),
                 on_failure: OnFailure | None = None) -> None:
        super().__init__(replicas, group, options.chunk_bytes, options.clock, on_failure)
        self._options = options
        self._pacing = options.pacing()
        self._wait_seconds = 0.0
        self._handoff = HandOff(self._clock)
        self._thread: threading.Thread | None = None
        self._last_round: RoundTimes | None = None  # sync thread: for the next proposal
        self._chunk_s = (0.0, 0.0)  # sync thread: (own fastest chunk, agreed) of last round
        self._step_began: float | None = None
        self._step_began_round = False

    def _mode_stats(self) -> dict[str, float]:
        stats = ({} if self._options.max_staleness is None
                 else {"wait_seconds": self._wait_seconds})
        pacer = self._pacing.slowdown
        if pacer is not None:
            stats.update(round_cost=pacer.round_cost(), busy_share=pacer.busy_share(),
                         round_steps=pacer.round_steps())
        return stats

    def start(self) -> None:
        super().start()
        self._handoff = HandOff(self._clock)
        self._step_began = None
        self._pacing.interrupt()
        self._thread = threading.Thread(target=self._thread_main, args=(self._handoff,),
                                        daemon=True, name=f"shadowsync-rank{self._rank}")
        self._thread.start()

    def step(self) -> None:
        """Step boundary: apply a finished round (with ``max_staleness``, wait for it at its
        K-th step), then take a snapshot if one is due. Raises :class:`~.errors.SyncError` if
        the thread failed, a peer aborted, or a round stayed in flight past ``deadline_s``."""
        self._move("step")
        self._raise_if_failed()
        counters = self._telemetry.counters
        step = counters.steps = counters.steps + 1
        now = self._clock.now()
        if self._step_began is not None:
            self._pacing.observe(now - self._step_began, self._step_busy, self._step_began_round)
        self._step_began = now
        busy = self._land(step, wait=False) is not None
        self._step_began_round = (self._handoff.slot is Slot.IDLE
                                  and step >= counters.next_snapshot)
        if self._step_began_round:
            self._give(step, stop=False)
        self._step_busy = busy or self._handoff.in_flight is not None

    def stop(self, final_sync: bool = True) -> None:
        self._move("stop")
        try:
            self._raise_if_failed()  # a thread that failed between rounds takes no stop round
            step = self._telemetry.counters.steps
            self._land(step, wait=True)
            if self._handoff.slot is not Slot.DRAINED:
                self._give(step, stop=True)
                self._land(step, wait=True)
            self._raise_if_failed()
        except Exception as exc:
            raise self._record_failure(exc)  # noqa: B904 (the first failure, with its cause)
        assert self._thread is not None
        self._thread.join()  # it posted the last round: nothing is left for it to do
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

    def own_stall(self) -> SyncError | None:
        """Any thread, changing nothing: this rank's round in flight, if it stayed past
        ``deadline_s`` short of its collective (a stall of this rank's own), as training
        would raise it at its next call; else None. Training may never make that call: it
        can sit in a collective with a peer that found its round waiting for this one's and
        stopped."""
        job = self._handoff.unanswered()
        deadline = None if job is None else self._deadline(job.given_at)
        if job is None or deadline is None or self._clock.now() <= deadline \
                or self._round.in_collective:
            return None
        return self._as_sync_error(self._stalled(job, in_collective=False))

    # ------------------------------------------------------------------ training-thread side
    def _deadline(self, since: float) -> float | None:
        deadline_s = self._options.deadline_s
        return None if deadline_s is None else since + deadline_s

    def _raise_if_failed(self) -> None:
        error = self._handoff.error
        if error is not None:
            raise self._record_failure(error)  # noqa: B904 (its __cause__ is error)

    def _give(self, step: int, stop: bool) -> None:
        """Round stage 1 and the hand-over: the snapshot, then the job."""
        with record_function("shadowsync.snapshot"):
            self._round.snapshot()
        self._handoff.give(Job(step, stop, self._clock.now()))

    def _land(self, step: int, wait: bool) -> Result | None:
        """Round stage 6 for the round in flight, if it is done, waiting for it if ``wait``
        or at its K-th step, and schedules the next snapshot; returns it (None: nothing
        applied). Raises if the thread failed or the round stayed in flight past the
        deadline."""
        job = self._handoff.in_flight
        if job is None:
            return None
        result = self._handoff.take()
        k = self._options.max_staleness
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
                in_collective = self._round.in_collective
                self._handoff.fail(self._stalled(job, in_collective))
                self._raise_if_failed()
            return None
        self._round.apply(result, step)
        landed = step if k is None else job.step + k
        self._telemetry.counters.next_snapshot = landed + result.agreement.pause_steps
        return result

    def _stalled(self, job: Job, in_collective: bool) -> RoundStalled:
        return RoundStalled(
            f"round {self._telemetry.counters.rounds + 1} stalled: in flight for more than "
            f"{self._options.deadline_s} s (snapshot of step {job.step})", in_collective)

    # ------------------------------------------------------------------ sync-thread side
    def _thread_main(self, handoff: HandOff) -> None:
        """The sync thread: ``handoff`` is its own, even if a restart makes a new one."""
        try:
            if self._options.thread_nice:
                # Linux schedules threads one by one: this lowers the sync thread alone.
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               os.getpriority(os.PRIO_PROCESS, 0) + self._options.thread_nice)
            with self._thread_streams():
                try:
                    self._serve(handoff)
                except BaseException as exc:  # the abort round runs on the side stream too
                    handoff.fail(exc)
                    self._tell(exc, closed=handoff.slot is Slot.CLOSED)
        except BaseException as exc:  # the nice value or the stream itself
            handoff.fail(exc)

    def _thread_streams(self) -> contextlib.AbstractContextManager[object]:
        """The side stream (and its device) as the thread's current ones; nothing on CPU."""
        stack = contextlib.ExitStack()
        stream = self._round.stream
        if stream is not None:
            stack.enter_context(torch.cuda.device(stream.device))
            stack.enter_context(torch.cuda.stream(stream))
        return stack

    def _serve(self, handoff: HandOff) -> None:
        """Round stages 2-5, a round per job, until a round agrees to stop or the hand-off
        closes: the control values are this rank's stop request, its pacers' proposal and its
        fastest chunk of the last round."""
        comm_share = self._pacing.comm_share
        while (job := handoff.next_job()) is not None:
            began = self._clock.now()
            own_chunk, agreed_chunk = self._chunk_s
            between = None if comm_share is None else functools.partial(
                _pause_between_chunks, handoff, comm_share.between_chunks(agreed_chunk))
            control = Control(stop=job.stop, pause_steps=self._pacing.pause_steps(self._last_round),
                              chunk_s=own_chunk)
            result = self._round.exchange(job, control, between)
            agreement = result.agreement
            self._last_round = RoundTimes(self._clock.now() - began, agreement.paused_s)
            self._chunk_s = (agreement.fastest_chunk_s, agreement.chunk_s)
            handoff.post(result)
            if agreement.stop:
                return


def _pause_between_chunks(handoff: HandOff, seconds: float, _fastest_s: float) -> float:
    """Leaves the link to training's traffic for ``seconds`` (the ranks' agreed chunk time
    times ``1 / max_comm_share - 1``) after a chunk; returns the seconds paused."""
    return handoff.sleep(seconds)
