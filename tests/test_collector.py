"""The step collector: Python's automatic collector off while training, the young
generations collected exactly at the multiples of ``every_steps``, cycles freed there and the
collector's state restored afterwards."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from shadowsync.pipelines.collector import StepCollector
from tests._gc import collections


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_collects_young_generations_at_multiples_only() -> None:
    assert gc.isenabled()
    by_step: dict[int, list[int]] = {}
    with collections() as seen, StepCollector(every_steps=3) as collector:
        assert not gc.isenabled()
        assert seen == [2]  # everything once, on entering
        for step in range(1, 10):
            before = len(seen)
            for _ in range(2000):  # far past the automatic threshold
                _Node()
            collector.after_step(step)
            by_step[step] = seen[before:]
    assert gc.isenabled()
    assert by_step == {s: [1] if s % 3 == 0 else [] for s in range(1, 10)}


def test_cycles_wait_for_the_next_collection_step() -> None:
    with StepCollector(every_steps=2) as collector:
        ref = weakref.ref(_Node())
        collector.after_step(1)
        assert ref() is not None  # automatic collection is off, and step 1 is not due
        collector.after_step(2)
        assert ref() is None


def test_none_leaves_pythons_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[tuple[Any, ...]] = []
    monkeypatch.setattr(gc, "collect", lambda *args: called.append(args))
    with StepCollector(every_steps=None) as collector:
        assert gc.isenabled()
        for step in range(1, 5):
            collector.after_step(step)
        collector.collect_all()
    assert called == []
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with StepCollector(every_steps=5):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_every_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every_steps must be positive or None, got 0"):
        StepCollector(0)
