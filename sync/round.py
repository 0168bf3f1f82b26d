"""One synchronization round, read in one place.

A round synchronizes one or more :class:`ReplicaSet` s: the dense replica over every rank and,
with replica groups, this rank's embedding shards over the ranks that hold the same shards
(a set's own ``group``). Sets that share a group travel in one buffer (a *wire*); the first
wire (the runner's group) carries the control slots, and every rank sends its wires in the
same order in every round, so each collective meets the same peers. Both runners run the same
:class:`Round`; they differ only in which thread runs each stage:

======  =======================================  ============  ==============  ===============
stage   what                                     method        shadow thread   fixed rate
======  =======================================  ============  ==============  ===============
1       every set's live tensors -> snapshot     ``snapshot``  training        training
2       each strategy's ``reduce_input``         ``exchange``  sync            training
3       a SUM-allreduce per wire: the first      ``exchange``  sync            training
        with the control slots (:mod:`.protocol`)
4       each strategy's ``delta``                ``exchange``  sync            training
2-4     a set that goes by rows: its changed     ``exchange``  sync            training
        rows at 2, then its own two collectives
        after the wires (:mod:`.rows`)
5       hand back the :class:`Result`            (runner)      sync -> train   (returned)
6       add each delta to its live tensors       ``apply``     training        training
======  =======================================  ============  ==============  ===============

On CUDA, stages 1 to 4 run on the synchronizer's side stream (stage 1 fenced both ways with the
main stream) and stage 6 waits for the event stage 4 recorded; on CPU there are no streams.
A replica or a delta that is not finite raises on the rank that holds it, before any peer
averages it in (stages 2 and 4). What the thread, pacing, hand-off and telemetry add is
outside the round: the :class:`Job` and the control values it is given, where its result goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from shadowsync.sync.clock import Clock
from shadowsync.sync.errors import NonFiniteError
from shadowsync.sync.protocol import (
    Agreement,
    Control,
    Layout,
    Levels,
    Wire,
    WireState,
    check_params,
    views,
)
from shadowsync.sync.rows import RowExchange, can_go_by_rows
from shadowsync.sync.strategies import SyncStrategy
from shadowsync.sync.telemetry import Telemetry

__all__ = ["Job", "ReplicaSet", "Result", "Round"]


@dataclasses.dataclass(frozen=True)
class Job:
    """A round's start: the snapshot of training step ``step`` is in every set's buffer.

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
    """A finished round: each set's delta, in order, the CUDA completion event (None on
    CPU), its job and what the ranks agreed."""

    deltas: list[Tensor]
    ready: torch.cuda.Event | None
    job: Job
    agreement: Agreement


class ReplicaSet:
    """One kind of replica a round synchronizes: the live tensors, their snapshot (one flat
    buffer) and the strategy that averages them.

    Args:
        params: the live tensors, of one dtype and device, never repeated.
        strategy: the algorithm (pure tensor math, see :mod:`.strategies`).
        name: what errors call it (``the dense replica is not finite ...``).
        group: the ranks that hold replicas of these tensors (None: the runner's group, every
            rank); a group of its own is a sync group like the runner's, made on every rank
            in the same order (:func:`~.groups.new_sync_group`).
        rows: average by the rows that changed (:mod:`.rows`; model averaging only), not
            as a payload of the group's wire.
    """

    def __init__(self, params: Sequence[Tensor], strategy: SyncStrategy,
                 name: str = "dense", group: dist.ProcessGroup | None = None,
                 rows: bool = False) -> None:
        if not isinstance(strategy, SyncStrategy):
            raise TypeError(f"strategy must be a SyncStrategy, got {type(strategy).__name__}")
        self.params = check_params(params)
        self.strategy = strategy
        self.name = name
        self.group = group
        first = self.params[0]
        if rows and not can_go_by_rows(strategy, self.params):
            raise ValueError(f"the {name} set: only model averaging in the parameters' own "
                             f"dtype goes by rows, not {type(strategy).__name__} "
                             f"(wire dtype {strategy.wire_dtype})")
        self.rows = rows
        self.snapshot = torch.empty(sum(p.numel() for p in self.params), dtype=first.dtype,
                                    device=first.device)
        self.views = views(self.snapshot, self.params)
        self.initialized = False

    @property
    def wire_dtype(self) -> torch.dtype:
        return self.strategy.wire_dtype or self.snapshot.dtype

    def overwrite(self, flat: Tensor) -> None:
        """Every live tensor from ``flat`` (the consensus: the same bits on every rank)."""
        torch._foreach_copy_(self.params, views(flat, self.params))


class Round:
    """The stages of the module's table over ``replicas``, on ``wires``.

    Args:
        replicas: the sets a round carries, each a payload of its group's wire in turn.
        wires: one per group, in the order every rank sends them (:meth:`of` makes them); the
            first is the runner's group and carries the control slots.
        telemetry: counts each round's bytes, time and its landing.
        stream: the side stream stages 1-4 run on (CUDA), or None.
        rows: the exchanges of the sets that go by rows, in the sets' order.
    """

    def __init__(self, replicas: Sequence[ReplicaSet], wires: Sequence[Wire],
                 telemetry: Telemetry, stream: torch.cuda.Stream | None = None,
                 rows: Sequence[RowExchange] = ()) -> None:
        self.replicas = list(replicas)
        self.wires = list(wires)
        main = self.wires[0].group
        self._lanes = [[i for i, r in enumerate(self.replicas)
                        if not r.rows and (r.group or main) is w.group] for w in self.wires]
        self._rows = dict(zip([i for i, r in enumerate(self.replicas) if r.rows], rows,
                              strict=True))
        for wire, lane in zip(self.wires, self._lanes, strict=True):
            sizes = tuple(self.replicas[i].snapshot.numel() for i in lane)
            if sizes != wire.layout.sizes:
                raise ValueError(f"a wire's layout {wire.layout.sizes} does not fit its replica "
                                 f"sets {sizes}")
        if sum(map(len, self._lanes)) + len(self._rows) != len(self.replicas):
            raise ValueError("every replica set's group needs a wire of its own")
        self.stream = stream
        self._telemetry = telemetry

    @property
    def wire(self) -> Wire:
        """The wire with the control slots (the runner's group)."""
        return self.wires[0]

    @property
    def in_collective(self) -> bool:
        """Any thread: whether this rank's part of the round is in one of its collectives."""
        return any(w.state is WireState.IN_COLLECTIVE for w in self._collectives())

    def reopen(self) -> None:
        """The runner starts again (see :meth:`.protocol.Wire.reopen`)."""
        for w in self._collectives():
            w.reopen()

    def _collectives(self) -> list[Wire | RowExchange]:
        return [*self.wires, *self._rows.values()]

    @staticmethod
    def layout(replicas: Sequence[ReplicaSet]) -> Layout:
        """The wire layout ``replicas`` need (one wire dtype for all of them)."""
        dtypes = {r.wire_dtype for r in replicas}
        if len(dtypes) != 1:
            raise ValueError(f"the replica sets of one round travel in one wire dtype, got "
                             f"{sorted(map(str, dtypes))}")
        first, wire = replicas[0].snapshot, dtypes.pop()
        int8 = wire == torch.int8  # float payloads, quantized as they travel
        return Layout(tuple(r.snapshot.numel() for r in replicas), first.dtype if int8 else wire,
                      first.device, int8)

    @classmethod
    def of(cls, replicas: Sequence[ReplicaSet], group: dist.ProcessGroup | Levels,
           chunk_bytes: int | None, clock: Clock, telemetry: Telemetry,
           stream: torch.cuda.Stream | None = None) -> Round:
        """The round of ``replicas``: its wires (``group``'s first, summed in its levels if
        it has them, then each set's own group in the order the sets name them, the same on
        every rank) and an exchange for each set that goes by rows."""
        whole = [r for r in replicas if not r.rows]
        groups: list[dist.ProcessGroup | Levels] = [group]
        for r in whole:
            if r.group is not None and all(r.group is not g for g in groups):
                groups.append(r.group)
        wires = []
        for g in groups:
            lane = [r for r in whole if (r.group or group) is g]
            layout = (Round.layout(lane) if lane else
                      dataclasses.replace(Round.layout(replicas), sizes=()))
            wires.append(Wire(layout, g, chunk_bytes, clock))
        rows = [RowExchange(r.params, r.group or wires[0].group, chunk_bytes, clock)
                for r in replicas if r.rows]
        return cls(replicas, wires, telemetry, stream, rows)

    # ------------------------------------------------------------------ 1. snapshot
    @torch.no_grad()
    def snapshot(self) -> None:
        """Training thread: every set's live tensors into its snapshot; on the side stream (if
        any), fenced both ways: the side stream waits for the main stream's pending work on
        the tensors, and the main stream waits for the copy before the next optimizer step can
        overwrite them."""
        if self.stream is None:
            for r in self.replicas:
                torch._foreach_copy_(r.views, r.params)
            return
        main = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            for r in self.replicas:
                torch._foreach_copy_(r.views, r.params)
        main.wait_stream(self.stream)

    def init(self) -> None:
        """Binds each strategy, once, to its set's (identical) live tensors."""
        pending = [r for r in self.replicas if not r.initialized]
        if pending:
            self.snapshot()
        worlds = {i: w.world for w, lane in zip(self.wires, self._lanes, strict=True)
                  for i in lane} | {i: x.world for i, x in self._rows.items()}
        for i, r in enumerate(self.replicas):
            if not r.initialized:
                r.strategy.init(r.snapshot, worlds[i])
                if i in self._rows:
                    self._rows[i].init(r.snapshot)
                r.initialized = True

    def restored(self) -> None:
        """The live tensors were restored (identical on every rank): the sets that go by
        rows expect them."""
        if self._rows:
            self.snapshot()
        for i, x in self._rows.items():
            x.init(self.replicas[i].snapshot)

    # ------------------------------------------------------------------ 2-4. exchange
    def exchange(self, job: Job, control: Control,
                 pause_between_chunks: Callable[[float], float] | None = None) -> Result:
        """The thread that runs rounds: stages 2-4 on the snapshots of ``job``; returns the
        result to hand back. Raises what a strategy, the collective or a finite check raised."""
        for r in self.replicas:
            self._check_finite(r.snapshot, f"the {r.name} replica", job.step)
        with record_function("shadowsync.reduce_input"):
            payloads = {i: self.replicas[i].strategy.reduce_input(self.replicas[i].snapshot)
                        for lane in self._lanes for i in lane}
            changed = {i: x.changed(self.replicas[i].snapshot) for i, x in self._rows.items()}
        agreement = self.wire.allreduce([payloads[i] for i in self._lanes[0]], control,
                                        pause_between_chunks)
        reduced = dict(zip(self._lanes[0], self.wire.payloads, strict=True))
        for wire, lane in zip(self.wires[1:], self._lanes[1:], strict=True):
            lane_agreed = wire.allreduce([payloads[i] for i in lane], Control(),
                                         pause_between_chunks)
            agreement = agreement.with_lane(lane_agreed)
            reduced.update(zip(lane, wire.payloads, strict=True))
        by_rows = {}
        for i, exchange in self._rows.items():
            by_rows[i], lane_agreed = exchange.exchange(self.replicas[i].snapshot, changed[i],
                                                        pause_between_chunks)
            agreement = agreement.with_lane(lane_agreed)
        self._telemetry.reduced(agreement)
        with record_function("shadowsync.delta"):
            deltas = [by_rows[i] if i in by_rows else r.strategy.delta(r.snapshot, reduced[i])
                      for i, r in enumerate(self.replicas)]
        for r, delta in zip(self.replicas, deltas, strict=True):
            self._check_finite(delta, f"the {r.name} delta", job.step)
        self._telemetry.round_done()
        ready = self.stream.record_event() if self.stream is not None else None
        return Result(deltas, ready, job, agreement)

    # ------------------------------------------------------------------ 6. apply
    @torch.no_grad()
    def apply(self, result: Result, step: int) -> None:
        """Training thread, between steps: adds each finished delta to its live tensors."""
        with record_function("shadowsync.apply"):
            if result.ready is not None:
                main = torch.cuda.current_stream(result.deltas[0].device)
                main.wait_event(result.ready)
            for r, delta in zip(self.replicas, result.deltas, strict=True):
                if result.ready is not None:
                    delta.record_stream(main)
                torch._foreach_add_(r.params, views(delta, r.params))
        self._telemetry.applied(step, result.job.step)

    # ------------------------------------------------------------------ the consensus
    @torch.no_grad()
    def consensus(self, step: int) -> None:
        """Collective, once stopped on every rank: overwrites every set with its strategy's
        consensus, computed from one full-precision allreduce alone, so every rank ends with
        the same bits."""
        with record_function("shadowsync.consensus"):
            self.snapshot()
            lanes = [(lane, wire.like(self.replicas[0].snapshot.dtype))
                     for lane, wire in zip(self._lanes, self.wires, strict=True)]
            lanes += [([i], Wire(Round.layout([self.replicas[i]]), x.group, None, x.clock))
                      for i, x in self._rows.items()]
            for lane, full in lanes:
                sets = [self.replicas[i] for i in lane]
                full.allreduce([r.strategy.consensus_input(r.snapshot) for r in sets], Control())
                for i, r, reduced in zip(lane, sets, full.payloads, strict=True):
                    model = r.strategy.consensus(reduced)
                    self._check_finite(model, f"the {r.name} consensus model", step)
                    r.overwrite(model)
                    if i in self._rows:
                        self._rows[i].landed(model)

    def _check_finite(self, t: Tensor, what: str, step: int) -> None:
        """Raises :class:`~.errors.NonFiniteError` if ``t`` holds NaN or inf (one fused
        reduction, read on the thread that runs the round)."""
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteError(
                f"rank {torch.distributed.get_rank()}: {what} is not finite in synchronization "
                f"round {self._telemetry.counters.rounds + 1} (snapshot of step {step})")
