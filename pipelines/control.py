"""How the ranks agree during training: :class:`ControlGroup`, one small allreduce of local
facts on a gloo group of its own, and :class:`ControlExchange`, the periodic agreement on it:
whether any rank went non-finite, whose synchronizer failed (degrade it everywhere at once),
and whether to stop (SIGTERM reached a rank); and when the next check falls, from values every
rank holds."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.finite import FiniteWatch, raise_if_non_finite
from shadowsync.sync.wrapper import DDPReplicas, LocalReplicas

__all__ = ["ControlExchange", "ControlGroup"]

logger = logging.getLogger("shadowsync.train")


class ControlGroup:
    """Ranks agree on local facts (SIGTERM seen, synchronizer failed, checkpoint unreadable)
    through one small allreduce on a gloo group of their own.

    Gloo on CPU tensors, even beside NCCL training, so that asking never synchronizes a GPU
    stream; every rank must call :meth:`ranks_raising` at the same point of its loop.
    """

    def __init__(self, timeout_s: float) -> None:
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def exchange(self, values: Sequence[float]) -> torch.Tensor:
        """Collective: every rank's ``values``, as a ``world_size x len(values)`` float64 table
        (exact for integers below 2**53, such as step numbers)."""
        return self.start_exchange(values)()

    def start_exchange(self, values: Sequence[float]) -> Callable[[], torch.Tensor]:
        """Collective, without waiting: :meth:`exchange` in the background; call what it
        returns for the table. Every rank must make its calls on this group in one order."""
        table = torch.zeros(self.world_size, len(values), dtype=torch.float64)
        table[self.rank] = torch.tensor([float(v) for v in values], dtype=table.dtype)
        work = dist.all_reduce(table, group=self.group, async_op=True)

        def result() -> torch.Tensor:
            work.wait()
            return table

        return result

    def failures(self, error: BaseException | None, describe: Callable[[BaseException], str],
                 ) -> list[str]:
        """Collective: ``rank N: <describe(error)>`` for every rank that has an error, in rank
        order (empty when none has); the messages travel only when some rank failed."""
        (bad,) = self.ranks_raising(error is not None)
        if not bad:
            return []
        messages: list[Any] = [None] * self.world_size
        dist.all_gather_object(messages, None if error is None else describe(error),
                               group=self.group)
        return [f"rank {r}: {messages[r]}" for r in bad]

    def ranks_raising(self, *flags: bool) -> list[list[int]]:
        """Collective: for each of this rank's ``flags``, the ranks that raised it."""
        table = self.exchange(flags)
        return [table[:, i].nonzero().flatten().tolist() for i in range(len(flags))]


class ControlExchange:
    """One exchange (:class:`ControlGroup`) carries, per rank: whether SIGTERM reached it
    (its fault domain's stop request), whether its synchronizer failed, the first non-finite
    step of each :attr:`~.finite.FiniteWatch.KINDS`, and its seconds a training step since
    the last check. Every rank reads the same table after the same step, so every decision
    from it (fail, degrade, stop, the next check's step) is the same on every rank.

    Checks fall every ``train.control_every_steps`` steps, or fewer where steps are so fast
    that would be under ``train.control_min_interval_s`` at the slowest rank's pace. A periodic
    check runs in the background, so no step waits on it for the slowest rank: the next one
    acts on it. A checkpoint, an evaluation and the end check at once (:meth:`agree` with
    ``now``), after acting on the one in flight, since they must not start on a rank that
    another has given up on.
    """

    def __init__(self, ctx: RunContext, control: ControlGroup, watch: FiniteWatch,
                 replicas: LocalReplicas | DDPReplicas) -> None:
        """``replicas``: the synchronizer asked whether it failed, and degraded on every rank
        once one has; this rank's pace is timed on ``ctx.clock``."""
        self.ctx, self.control, self.watch, self.replicas = ctx, control, watch, replicas
        self.cfg, self.env = ctx.cfg, ctx.env
        # The periodic exchange in flight: the step it was started after, its table.
        self._pending: tuple[int, Callable[[], torch.Tensor]] | None = None
        self._next = self.cfg.train.control_every_steps  # the step of the next periodic check
        self._clock = (ctx.clock(), 0)  # this rank's pace is timed from: when, step

    def due(self, step: int) -> bool:
        """Whether the periodic check falls on ``step``."""
        return step >= self._next

    def start(self, step: int) -> None:
        """Training starts after ``step``: the first periodic check falls
        ``control_every_steps`` on."""
        self._next = step + self.cfg.train.control_every_steps

    def restart_pace(self, step: int, at: float) -> None:
        """This rank's pace is timed from ``at`` (on the clock) after ``step``:
        where training (re)starts, so that it counts training time only."""
        self._clock = (at, step)

    def check_finite(self, step: int, where: str) -> None:
        """Collective: raises on every rank if the loss, the dense gradients or the dense
        optimizer's state went non-finite on any (see :func:`~.finite.raise_if_non_finite`)."""
        table = self.control.exchange(self.watch.first_steps(step))
        raise_if_non_finite(table, FiniteWatch.KINDS, self.env.rank, where)

    def agree(self, step: int, now: bool = True) -> bool:
        """Collective: fails every rank if any went non-finite; degrades a failed synchronizer
        on every rank at once; says whether SIGTERM reached any rank (then every rank stops
        after this same step). With ``now`` false (the periodic check) the exchange runs in
        the background: this call acts on the one the previous check started."""
        self.ctx.callbacks.check(step, periodic=not now)
        self._next = step + self.cfg.train.control_every_steps  # until paced
        pending, self._pending = self._pending, None
        if pending is not None and self._act(pending[0], step, pending[1]()):
            return True
        # The optimizer's state (a full read of it) only where it must be known: not at every
        # periodic check, since what it finds stays until the next record.
        values = [self.ctx.domain.stop_requested(), self.replicas.failed(),
                  *self.watch.first_steps(step if now else None), self._pace(step)]
        if now:
            return self._act(step, step, self.control.exchange(values))
        self._pending = (step, self.control.start_exchange(values))
        return False

    def _pace(self, step: int) -> float:
        """This rank's seconds a training step since the last check (0: no step since), and
        the clock restarted for the next."""
        since, before = self._clock
        now = self.ctx.clock()
        self._clock = (now, step)
        return (now - since) / (step - before) if step > before else 0.0

    def _act(self, started_after: int, step: int, table: torch.Tensor) -> bool:
        """Acts, after ``step``, on the exchange started after ``started_after``, and sets the
        next periodic check from the slowest rank's pace in it."""
        kinds = len(FiniteWatch.KINDS)
        raise_if_non_finite(table[:, 2:2 + kinds], FiniteWatch.KINDS, self.env.rank,
                            f"at the check after step {started_after}")
        every, floor_s = self.cfg.train.control_every_steps, self.cfg.train.control_min_interval_s
        slowest = float(table[:, -1].max())
        self._next = step + (every if floor_s is None or slowest <= 0
                             else max(every, math.ceil(floor_s / slowest)))
        stop, sync_failed = (table[:, i].nonzero().flatten().tolist() for i in (0, 1))
        if sync_failed:
            self.replicas.degrade(sync_failed)
        if stop and self.env.rank == 0:
            where = (f"checkpointing to {self.cfg.checkpoint.dir}" if self.cfg.checkpoint.dir
                     else "no checkpoint.dir: the work so far is lost")
            logger.warning("SIGTERM reached rank(s) %s: every rank stops after step %d; %s",
                           stop, step, where)
        return bool(stop)
