"""Instrumentation of the training loop: what a benchmark or a test observes of the trainer's
schedule, without patching it (as torchtitan's and Lightning's callbacks).

A :class:`TrainCallback` subclass overrides the hooks it needs; the trainer calls them through
one :class:`Callbacks`. Hooks run in the training thread of every rank and must not enter a
collective (ranks need not hold the same callbacks), nor change what the trainer computes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING

import torch
from torch.profiler import record_function

if TYPE_CHECKING:
    from shadowsync.pipelines.loop import Trainer

__all__ = ["Callbacks", "TrainCallback"]


class TrainCallback:
    """Base class: every hook does nothing. Steps are counted as done (``step`` 1 after the
    first training step)."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first step of :meth:`Trainer.train` (after any resume)."""

    def on_step_end(self, step: int) -> None:
        """After training step ``step``: its optimizer step, the synchronizer's hook and
        the step's metrics are done; its record, check or checkpoint (if due) are not."""

    def on_record(self, step: int, computing: Future[dict[str, float]]) -> None:
        """The training record after ``step`` started; its metrics reduce in the background
        and ``computing`` holds them once done."""

    def on_check(self, step: int, periodic: bool) -> None:
        """A control exchange after ``step`` starts: ``periodic`` when it runs in the
        background (``train.control_every_steps``), else one the ranks wait for (before a
        checkpoint, an evaluation or the end)."""

    def on_phase(self, name: str, seconds: float) -> None:
        """A labelled phase of a training step (``shadowsync.train.*``) took ``seconds`` of
        wall time. Overriding it makes the trainer time its phases; otherwise it does not."""


class _Phase:
    """Times one phase for the callbacks that asked, under a profiler label if one records."""

    __slots__ = ("_began", "_clock", "_label", "_name", "_timers")

    def __init__(self, name: str, timers: Sequence[TrainCallback],
                 clock: Callable[[], float]) -> None:
        self._name, self._timers, self._clock = name, timers, clock
        self._label = record_function(name) if torch.autograd._profiler_enabled() else None
        self._began = 0.0

    def __enter__(self) -> None:
        if self._label is not None:
            self._label.__enter__()
        self._began = self._clock()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        seconds = self._clock() - self._began
        if self._label is not None:
            self._label.__exit__(exc_type, exc, tb)
        for callback in self._timers:
            callback.on_phase(self._name, seconds)


class Callbacks:
    """The trainer's callbacks, called in order; phases are timed on ``clock``."""

    _NONE = contextlib.nullcontext()

    def __init__(self, callbacks: Sequence[TrainCallback] = (),
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._all, self._clock = list(callbacks), clock
        self._timers = [c for c in self._all
                        if type(c).on_phase is not TrainCallback.on_phase]

    def phase(self, name: str) -> contextlib.AbstractContextManager[object]:
        """A labelled phase: timed for :meth:`TrainCallback.on_phase` where one is overridden,
        a profiler label while a profiler records, else nothing at all (entering a label
        dispatches an op even with no profiler on, a measurable share of a small CPU step)."""
        if not self._timers and not torch.autograd._profiler_enabled():
            return self._NONE
        return _Phase(name, self._timers, self._clock)

    def train_start(self, trainer: Trainer) -> None:
        for c in self._all:
            c.on_train_start(trainer)

    def step_end(self, step: int) -> None:
        for c in self._all:
            c.on_step_end(step)

    def record(self, step: int, computing: Future[dict[str, float]]) -> None:
        for c in self._all:
            c.on_record(step, computing)

    def check(self, step: int, periodic: bool) -> None:
        for c in self._all:
            c.on_check(step, periodic)
