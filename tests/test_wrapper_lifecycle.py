"""Every transition of ``ShadowSyncReplicas``' lifecycle (the table in its docstring), driven
call by call on a world of one, with a strategy that fails on demand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from shadowsync.sync.config import SyncConfig
from shadowsync.sync.errors import SyncError
from shadowsync.sync.strategies import ModelAveraging
from shadowsync.sync.wrapper import Phase, ShadowSyncReplicas
from shadowsync.testing import run_ranks


class _Flaky(ModelAveraging):
    """Model averaging that raises in its next round while ``fail`` is set."""

    fail = False

    def reduce_input(self, snapshot: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("injected")
        return super().reduce_input(snapshot)


def _wrapped(mode: str, algorithm: str = "tests.test_wrapper_lifecycle:_Flaky",
             on_failure: str = "degrade", **schedule: Any) -> ShadowSyncReplicas:
    cfg = SyncConfig.from_dict({
        "strategy": {"name": algorithm},
        "schedule": {"mode": mode, "period": 1, **schedule},
        "failure": {"on_failure": on_failure, "rejoin_after_steps": 2, "timeout_s": 10}})
    wrapper = ShadowSyncReplicas.from_config(cfg)
    assert wrapper.phase is Phase.UNWRAPPED
    env = SimpleNamespace(process_group=dist.group.WORLD)
    wrapper.wrap(torch.nn.Linear(4, 1), env, torch.device("cpu"))  # type: ignore[arg-type]
    return wrapper


def _fail(w: ShadowSyncReplicas, fail: bool) -> None:
    w.runner.replicas[0].strategy.fail = fail  # type: ignore[union-attr, attr-defined]


def _lifecycle(rank: int, world_size: int) -> list[str]:
    del rank, world_size
    seen: list[str] = []

    def mark(w: ShadowSyncReplicas, label: str) -> None:
        seen.append(f"{label}:{w.phase.name}")

    def attempt(label: str, call: Any) -> None:
        try:
            call()
            seen.append(f"{label}: returned")
        except (RuntimeError, SyncError) as e:
            seen.append(f"{label}: {type(e).__name__}: {e}")

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
    assert len(groups) == 3  # the first, and one per merge
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

    # A failure found at a pause: with degrade, the ranks agree on it there and merge.
    w = _wrapped("fixed_rate")
    _fail(w, True)
    w.after_step()
    w.pause(consensus=True)
    mark(w, "pause while failed")
    assert w.stats()["failures"] == 1.0 and len(w._groups) == 2
    w.finish()
    w = _wrapped("shadow")
    w.after_step()
    _fail(w, True)  # the stop round fails
    w.finish()
    mark(w, "a failure in the stop round at finish (degrade)")
    assert w.stats()["failures"] == 1.0
    w = _wrapped("shadow", on_failure="raise")
    w.after_step()
    _fail(w, True)
    attempt("a failure in the stop round at finish (raise)", w.finish)

    w = _wrapped("shadow")
    w.after_step()
    w.abandon()
    mark(w, "abandon")
    attempt("after_step after abandon", w.after_step)

    fresh = ShadowSyncReplicas(SyncConfig.from_dict({"strategy": {"name": "ma"}}))
    for label, call in (("after_step", fresh.after_step), ("resume", fresh.resume),
                        ("degrade", lambda: fresh.degrade([0]))):
        attempt(f"unwrapped {label}", call)
    w = _wrapped("fixed_rate")
    attempt("resume while running", w.resume)
    w.finish()
    # The shadow settings reach the runner: with sync.schedule.max_staleness=1 every step waits
    # for the round its predecessor started, so each lands exactly one step after its snapshot.
    w = _wrapped("shadow", max_staleness=1)
    for _ in range(20):
        w.after_step()
    stats = w.stats()
    w.finish()
    seen.append(f"staleness bound 1: {stats['syncs_applied']:g} syncs in 20 steps, "
                f"staleness {stats['staleness_mean']:g} to {stats['staleness_max']:g}")
    return seen


@pytest.mark.slow
def test_every_transition_of_the_lifecycle() -> None:
    (seen,) = run_ranks(_lifecycle, world_size=1, timeout_s=120)
    assert seen[:22] == [
        "wrap:RUNNING", "step:RUNNING", "pause:PAUSED", "pause again:PAUSED", "resume:RUNNING",
        "failing step:FAILED", "step while failed:FAILED", "degrade:DEGRADED",
        "degrade again:DEGRADED", "step while degraded:DEGRADED", "rejoin:RUNNING",
        "degrade from running:DEGRADED", "pause while degraded:PAUSED",
        "finish from paused:FINISHED", "after finish:FINISHED", "finish from running:FINISHED",
        "finish while degraded:FINISHED", "pause while failed:PAUSED",
        "a failure in the stop round at finish (degrade):FINISHED",
        "a failure in the stop round at finish (raise): SyncError: rank 0: synchronization "
        "failed: RuntimeError: injected",
        "abandon:ABANDONED",
        "after_step after abandon: RuntimeError: ShadowSyncReplicas.after_step() in phase "
        "ABANDONED (allowed in ['RUNNING', 'FAILED', 'DEGRADED'])",
    ], seen
    assert seen[22] == ("unwrapped after_step: RuntimeError: ShadowSyncReplicas.after_step() "
                        "in phase UNWRAPPED (allowed in ['RUNNING', 'FAILED', 'DEGRADED'])"), seen
    assert seen[23].startswith("unwrapped resume: RuntimeError: ShadowSyncReplicas.resume() in "
                               "phase UNWRAPPED")
    assert seen[24].startswith("unwrapped degrade: RuntimeError: ShadowSyncReplicas.degrade() "
                               "in phase UNWRAPPED")
    assert seen[25].startswith("resume while running: RuntimeError: ShadowSyncReplicas.resume() "
                               "in phase RUNNING"), seen
    assert seen[26] == "staleness bound 1: 19 syncs in 20 steps, staleness 1 to 1", seen


@pytest.mark.parametrize("phase", list(Phase))
def test_the_docstring_table_covers_every_phase(phase: Any) -> None:
    assert f"    {phase.name}" in (ShadowSyncReplicas.__doc__ or "")
