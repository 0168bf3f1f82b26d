"""Test-only entry point: ``python -m faulty_train`` (with ``tests/`` on PYTHONPATH) is
``python -m shadowsync.pipelines.train`` with one fault injected by monkeypatching.

The fault comes from ``SHADOWSYNC_TEST_FAULT=rank<R>:<kind>@<N>``, read here and nowhere in the
package, so production code carries no fault hooks. Kinds, on rank ``R``:

=================  ============================================================================
``raise``          raise ``RuntimeError`` after training step ``N``
``kill``           SIGKILL itself after step ``N``
``stall``          sleep forever after step ``N`` (the training thread stops responding)
``sigterm``        SIGTERM to itself after step ``N`` (preemption seen by this rank only)
``sigterm-agent``  SIGTERM to its parent, the torchrun agent, after step ``N`` (as Slurm or
                   Kubernetes do; torchrun passes it on to every rank)
``sigterm-save``   SIGTERM to itself while writing the checkpoint of step ``N``
``fail-sync``      the synchronization strategy raises in round ``N``
``stall-sync``     the synchronization strategy never returns from round ``N``
=================  ============================================================================

Each injection prints ``FAULT <kind> rank <R> at <unix time>`` first, so tests can time the
reaction.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from shadowsync.pipelines import train
from shadowsync.pipelines.trainer import Trainer
from shadowsync.sync.strategies import ModelAveraging

_SPEC = re.compile(r"rank(\d+):([a-z-]+)@(\d+)$")


def _announce(kind: str) -> None:
    print(f"FAULT {kind} rank {dist.get_rank()} at {time.time():.3f}", flush=True)


def _act(kind: str) -> None:
    _announce(kind)
    if kind == "raise":
        raise RuntimeError("injected failure")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stall":
        threading.Event().wait()
    if kind == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    if kind == "sigterm-agent":
        os.kill(os.getppid(), signal.SIGTERM)


def _after_step(rank: int, step: int, kind: str) -> None:
    """Wraps each trainer's ``wrapper.after_step`` (called once per training step)."""
    init = Trainer.__init__

    def patched(self: Trainer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        hook = self.wrapper.after_step

        def after_step() -> None:
            hook()
            if self.env.rank == rank and self.step + 1 == step:
                _act(kind)

        self.wrapper.after_step = after_step  # type: ignore[method-assign]

    Trainer.__init__ = patched  # type: ignore[method-assign]


def _during_save(rank: int, step: int) -> None:
    save = dcp.save

    def patched(state: Any, *, checkpoint_id: str, **kwargs: Any) -> Any:
        if dist.get_rank() == rank and checkpoint_id.endswith(f"step_{step:08d}"):
            _act("sigterm")
            time.sleep(0.5)  # still inside the write when the handler has run
        return save(state, checkpoint_id=checkpoint_id, **kwargs)

    dcp.save = patched


def _in_sync_round(rank: int, round_: int, kind: str) -> None:
    reduce_input: Callable[..., Any] = ModelAveraging.reduce_input
    calls = [0]

    def patched(self: ModelAveraging, snapshot: Any) -> Any:
        calls[0] += 1
        if dist.get_rank() == rank and calls[0] == round_:
            _announce(kind)
            if kind == "fail-sync":
                raise RuntimeError("injected synchronization failure")
            threading.Event().wait()
        return reduce_input(self, snapshot)

    ModelAveraging.reduce_input = patched  # type: ignore[method-assign]


def install(spec: str) -> None:
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"SHADOWSYNC_TEST_FAULT={spec!r}: expected rank<R>:<kind>@<N>")
    rank, kind, n = int(m.group(1)), m.group(2), int(m.group(3))
    if kind in ("fail-sync", "stall-sync"):
        _in_sync_round(rank, n, kind)
    elif kind == "sigterm-save":
        _during_save(rank, n)
    elif kind in ("raise", "kill", "stall", "sigterm", "sigterm-agent"):
        _after_step(rank, n, kind)
    else:
        raise ValueError(f"SHADOWSYNC_TEST_FAULT: unknown fault {kind!r}")


if __name__ == "__main__":
    install(os.environ["SHADOWSYNC_TEST_FAULT"])
    train.cli()
