"""Test-only entry point: ``python -m faulty_train`` (with ``tests/`` on PYTHONPATH) is
``python -m shadowsync.pipelines.train`` with one fault injected by monkeypatching.

The fault comes from ``SHADOWSYNC_TEST_FAULT=rank<R>:<kind>@<N>``, read here and nowhere in the
package, so production code carries no fault hooks. Kinds, on rank ``R``:

=================  ============================================================================
``raise``          raise ``RuntimeError`` after training step ``N``
``kill``           SIGKILL itself after step ``N``
``stall``          sleep forever after step ``N`` (the training thread stops responding)
``sigstop``        SIGSTOP to itself after step ``N`` (the whole process stops, as a hung host)
``sigterm``        SIGTERM to itself after step ``N`` (preemption seen by this rank only)
``sigterm-agent``  SIGTERM to its parent, the torchrun agent, after step ``N`` (as Slurm or
                   Kubernetes do; torchrun passes it on to every rank)
``sigterm-save``   SIGTERM to itself while writing the checkpoint of step ``N``
``fail-sync``      the synchronization strategy raises in round ``N``
``stall-sync``     the synchronization strategy never returns from round ``N``
``fail-pause``     the strategy raises in the next round once the ``N``-th pause (checkpoint,
                   evaluation, the end) has begun
``stall-pause``    the strategy never returns from that round
``nan-loss``       the ``N``-th training batch of the epoch has NaN dense features, so the loss
                   of training step ``N`` is NaN
``nan-eval``       the ``N``-th evaluation batch has NaN dense features (NaN predictions)
``late-check``     reach the config check ``N`` s after the other ranks (before any process
                   group, so it announces itself by ``RANK``)
=================  ============================================================================

Each injection prints ``FAULT <kind> rank <R> at <unix time>`` first, so tests can time the
reaction.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchrec.datasets.utils import Batch

from shadowsync.pipelines import train
from shadowsync.pipelines.loop import Trainer
from shadowsync.sync.strategies import ModelAveraging
from shadowsync.sync.wrapper import ShadowSyncReplicas

_SPEC = re.compile(r"rank(\d+):([a-z-]+)@(\d+)$")


def _announce(kind: str, rank: int | None = None) -> None:
    rank = dist.get_rank() if rank is None else rank
    print(f"FAULT {kind} rank {rank} at {time.time():.3f}", flush=True)


def _act(kind: str) -> None:
    _announce(kind)
    if kind == "raise":
        raise RuntimeError("injected failure")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stall":
        threading.Event().wait()
    if kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
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
            if self.ctx.env.rank == rank and self.step + 1 == step:
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


def _failing_rounds(kind: str, due: Callable[[], bool]) -> None:
    """Makes the strategy's round fail (``fail-*``: raise) or stall (``stall-*``: never
    return) on the call where ``due()`` says so."""
    reduce_input: Callable[..., Any] = ModelAveraging.reduce_input

    def patched(self: ModelAveraging, snapshot: Any) -> Any:
        if due():
            _announce(kind)
            if kind.startswith("fail-"):
                raise RuntimeError("injected synchronization failure")
            threading.Event().wait()
        return reduce_input(self, snapshot)

    ModelAveraging.reduce_input = patched  # type: ignore[method-assign]


def _in_pause(rank: int, n: int, kind: str) -> None:
    """From the ``n``-th call of the wrapper's ``pause`` on, rank ``rank``'s next round (the
    one in flight, or the stop round) fails or stalls."""
    pause = ShadowSyncReplicas.pause
    pauses, armed = [0], [False]

    def paused(self: ShadowSyncReplicas, consensus: bool) -> None:
        pauses[0] += 1
        armed[0] = armed[0] or (dist.get_rank() == rank and pauses[0] == n)
        pause(self, consensus)

    def due() -> bool:
        fire, armed[0] = armed[0], False
        return fire

    ShadowSyncReplicas.pause = paused  # type: ignore[method-assign]
    _failing_rounds(kind, due)


def _in_sync_round(rank: int, round_: int, kind: str) -> None:
    calls = [0]

    def due() -> bool:
        calls[0] += 1
        return dist.get_rank() == rank and calls[0] == round_

    _failing_rounds(kind, due)


class _Poisoned:
    """A data set whose ``n``-th training or evaluation batch on ``rank`` has NaN dense
    features; everything else is the wrapped data set's."""

    def __init__(self, dataset: Any, rank: int, kind: str, n: int) -> None:
        self._dataset, self._rank, self._kind, self._n = dataset, rank, kind, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dataset, name)

    def _poison(self, batches: Iterator[Batch], rank: int, kind: str) -> Iterator[Batch]:
        for i, batch in enumerate(batches, 1):
            if rank == self._rank and kind == self._kind and i == self._n:
                _announce(kind)
                batch = dataclasses.replace(
                    batch, dense_features=torch.full_like(batch.dense_features, float("nan")))
            yield batch

    def train_batches(self, batch_size: int, rank: int, world_size: int,
                      *args: Any, **kwargs: Any) -> Iterator[Batch]:
        return self._poison(self._dataset.train_batches(batch_size, rank, world_size, *args,
                                                        **kwargs), rank, "nan-loss")

    def eval_batches(self, batch_size: int, rank: int, world_size: int,
                     *args: Any, **kwargs: Any) -> Iterator[Batch]:
        return self._poison(self._dataset.eval_batches(batch_size, rank, world_size, *args,
                                                       **kwargs), rank, "nan-eval")


def _nan_data(rank: int, n: int, kind: str) -> None:
    init = Trainer.__init__

    def patched(self: Trainer, ctx: Any, dataset: Any, *args: Any) -> None:
        init(self, ctx, _Poisoned(dataset, rank, kind, n), *args)

    Trainer.__init__ = patched  # type: ignore[method-assign]


def _late_check(rank: int, seconds: int) -> None:
    parse = train.parse_args

    def patched(argv: list[str] | None = None) -> Any:
        if int(os.environ.get("RANK", "0")) == rank:
            _announce("late-check", rank)
            time.sleep(seconds)  # the injected lateness itself
        return parse(argv)

    train.parse_args = patched


def install(spec: str) -> None:
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"SHADOWSYNC_TEST_FAULT={spec!r}: expected rank<R>:<kind>@<N>")
    rank, kind, n = int(m.group(1)), m.group(2), int(m.group(3))
    if kind in ("fail-sync", "stall-sync"):
        _in_sync_round(rank, n, kind)
    elif kind in ("fail-pause", "stall-pause"):
        _in_pause(rank, n, kind)
    elif kind == "sigterm-save":
        _during_save(rank, n)
    elif kind in ("nan-loss", "nan-eval"):
        _nan_data(rank, n, kind)
    elif kind == "late-check":
        _late_check(rank, n)
    elif kind in ("raise", "kill", "stall", "sigstop", "sigterm", "sigterm-agent"):
        _after_step(rank, n, kind)
    else:
        raise ValueError(f"SHADOWSYNC_TEST_FAULT: unknown fault {kind!r}")


if __name__ == "__main__":
    install(os.environ["SHADOWSYNC_TEST_FAULT"])
    train.cli()
