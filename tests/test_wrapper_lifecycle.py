"""Every transition of ``ShadowSyncReplicas``' lifecycle (the table in its docstring), driven
call by call on a world of one, with a strategy that fails on demand."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from shadowsync.sync.config import SyncConfig
from shadowsync.sync.runner import SyncError
from shadowsync.sync.strategies import ModelAveraging
from shadowsync.sync.wrapper import Phase, ShadowSyncReplicas
from tests._dist import run_ranks


class _Flaky(ModelAveraging):
    """Model averaging that raises in its next round while ``fail`` is set."""

    fail = False

    def reduce_input(self, snapshot: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("injected")
        return super().reduce_input(snapshot)


class _Slow(ModelAveraging):
    """Model averaging whose rounds take at least 20 ms."""

    def reduce_input(self, snapshot: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return super().reduce_input(snapshot)


def _wrapped(mode: str, algorithm: str = "tests.test_wrapper_lifecycle:_Flaky",
             **settings: Any) -> ShadowSyncReplicas:
    cfg = SyncConfig(algorithm=algorithm, mode=mode,  # type: ignore[arg-type]
                     period=1, on_failure="degrade", rejoin_after_steps=2, timeout_s=10,
                     **settings)
    wrapper = ShadowSyncReplicas.from_config(cfg)
    assert wrapper.phase is Phase.UNWRAPPED
    env = SimpleNamespace(process_group=dist.group.WORLD)
    wrapper.wrap(torch.nn.Linear(4, 1), env, torch.device("cpu"))  # type: ignore[arg-type]
    return wrapper


def _fail(w: ShadowSyncReplicas, fail: bool) -> None:
    w.runner.strategy.fail = fail  # type: ignore[union-attr, attr-defined]


def _lifecycle(rank: int, world_size: int) -> list[str]:
    del rank, world_size
    seen: list[str] = []

    def mark(w: ShadowSyncReplicas, label: str) -> None:
        seen.append(f"{label}:{w.phase.name}")

    w = _wrapped("fixed_rate")
    mark(w, "wrap")
    w.after_step()
    mark(w, "step")
    w.pause(consensus=True)
    mark(w, "pause")
    w.pause(consensus=False)
    mark(w, "pause again")
    w.resume()
    mark(w, "resume")
    _fail(w, True)
    w.after_step()  # the round fails: this rank trains on alone
    mark(w, "failing step")
    assert w.failed()
    w.after_step()
    mark(w, "step while failed")
    w.degrade([0])  # the rejoin starts a fresh strategy
    mark(w, "degrade")
    assert not w.failed()
    w.degrade([0])
    mark(w, "degrade again")
    w.after_step()
    mark(w, "step while degraded")
    w.after_step()  # the rejoin step
    mark(w, "rejoin")
    w.degrade([0])
    mark(w, "degrade from running")
    w.pause(consensus=True)  # rejoins first
    mark(w, "pause while degraded")
    w.finish()
    mark(w, "finish from paused")
    w.resume()
    w.pause(consensus=True)
    w.finish()
    mark(w, "after finish")
    assert w.stats()["failures"] == 2.0, w.stats()
    groups = list(w._groups)
    assert len(groups) == 3  # the first, and one per rejoin
    w.close()
    for group in groups:  # destroyed: no longer a group this process knows
        with pytest.raises((RuntimeError, ValueError)):
            dist.get_rank(group)

    w = _wrapped("shadow")
    w.after_step()
    w.finish()
    mark(w, "finish from running")

    w = _wrapped("fixed_rate")
    w.degrade([0])
    w.finish()  # rejoins first
    mark(w, "finish while degraded")

    w = _wrapped("fixed_rate")
    _fail(w, True)
    w.after_step()
    try:
        w.pause(consensus=True)
        seen.append("pause while failed: returned")
    except SyncError:
        seen.append("pause while failed: SyncError")

    fresh = ShadowSyncReplicas(SyncConfig(algorithm="ma"))
    for call in (fresh.after_step, fresh.resume, lambda: fresh.degrade([0])):
        try:
            call()
            seen.append("unwrapped call: returned")
        except RuntimeError as e:
            seen.append(f"unwrapped call: {e}")
    w = _wrapped("fixed_rate")
    try:
        w.resume()
        seen.append("resume while running: returned")
    except RuntimeError as e:
        seen.append(f"resume while running: {e}")
    w.finish()
    # The shadow settings reach the runner: 20 ms rounds beside instant steps would land
    # tens of steps stale; sync.max_staleness=1 makes each step wait for the round in flight.
    w = _wrapped("shadow", "tests.test_wrapper_lifecycle:_Slow", max_staleness=1)
    for _ in range(20):
        w.after_step()
    stats = w.stats()
    w.finish()
    seen.append(f"staleness bound 1: max {stats['staleness_max']:g}, "
                f"waited {stats['wait_seconds'] > 0.01 * (stats['syncs_applied'] - 1)}")
    return seen


def test_every_transition_of_the_lifecycle() -> None:
    (seen,) = run_ranks(_lifecycle, world_size=1, timeout_s=120)
    assert seen[:19] == [
        "wrap:RUNNING", "step:RUNNING", "pause:PAUSED", "pause again:PAUSED", "resume:RUNNING",
        "failing step:FAILED", "step while failed:FAILED", "degrade:DEGRADED",
        "degrade again:DEGRADED", "step while degraded:DEGRADED", "rejoin:RUNNING",
        "degrade from running:DEGRADED", "pause while degraded:PAUSED",
        "finish from paused:FINISHED", "after finish:FINISHED", "finish from running:FINISHED",
        "finish while degraded:FINISHED", "pause while failed: SyncError",
        "unwrapped call: ShadowSyncReplicas.after_step() in phase UNWRAPPED (allowed in "
        "['RUNNING', 'FAILED', 'DEGRADED'])",
    ], seen
    assert seen[19].startswith("unwrapped call: ShadowSyncReplicas.resume() in phase UNWRAPPED")
    assert seen[20].startswith("unwrapped call: ShadowSyncReplicas.degrade() in phase UNWRAPPED")
    assert seen[21].startswith("resume while running: ShadowSyncReplicas.resume() in phase "
                               "RUNNING"), seen
    assert seen[22] == "staleness bound 1: max 1, waited True", seen


@pytest.mark.parametrize("phase", list(Phase))
def test_the_docstring_table_covers_every_phase(phase: Any) -> None:
    assert f"    {phase.name}" in (ShadowSyncReplicas.__doc__ or "")
