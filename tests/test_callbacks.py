"""The trainer's instrumentation: hooks called in order, phases timed only when asked."""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from typing import Any

import pytest
import torch

from shadowsync.pipelines.callbacks import Callbacks, TrainCallback


class _Log(TrainCallback):
    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name, self.calls = name, calls

    def on_step_end(self, step: int) -> None:
        self.calls.append((self.name, "step", step))

    def on_record(self, step: int, computing: Future[dict[str, float]]) -> None:
        self.calls.append((self.name, "record", step, computing))

    def on_check(self, step: int, periodic: bool) -> None:
        self.calls.append((self.name, "check", step, periodic))


class _Timer(TrainCallback):
    def __init__(self) -> None:
        self.phases: list[tuple[str, float]] = []

    def on_phase(self, name: str, seconds: float) -> None:
        self.phases.append((name, seconds))


def test_hooks_reach_every_callback_in_order() -> None:
    calls: list[tuple[Any, ...]] = []
    callbacks = Callbacks([_Log("a", calls), TrainCallback(), _Log("b", calls)])
    done: Future[dict[str, float]] = Future()
    callbacks.step_end(3)
    callbacks.record(3, done)
    callbacks.check(5, periodic=True)
    assert calls == [("a", "step", 3), ("b", "step", 3), ("a", "record", 3, done),
                     ("b", "record", 3, done), ("a", "check", 5, True), ("b", "check", 5, True)]


def test_phases_are_not_timed_unless_a_callback_asks() -> None:
    """No timer and no profiler: one shared no-op context, no clock read."""
    def no_clock() -> float:
        raise AssertionError("the clock was read")

    callbacks = Callbacks([_Log("a", [])], clock=no_clock)
    assert callbacks.phase("x") is callbacks.phase("y")
    with callbacks.phase("x"):
        pass


def test_phases_are_timed_on_the_injected_clock_even_when_they_raise() -> None:
    clock = itertools.count(10.0, 0.25).__next__
    timer = _Timer()
    callbacks = Callbacks([timer, _Log("a", [])], clock=clock)
    with callbacks.phase("shadowsync.train.watch"):
        pass
    with pytest.raises(ValueError), callbacks.phase("shadowsync.train.log"):
        raise ValueError("inside")
    assert timer.phases == [("shadowsync.train.watch", 0.25), ("shadowsync.train.log", 0.25)]


def test_a_phase_is_a_profiler_label_while_one_records() -> None:
    with torch.profiler.profile() as prof, Callbacks().phase("shadowsync.train.gc"):
        torch.ones(2).add_(1)
    assert "shadowsync.train.gc" in {e.name for e in prof.events()}
