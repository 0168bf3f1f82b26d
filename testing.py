"""Helpers for testing code that runs on several ranks, like :mod:`torch.testing` for tensors.

:func:`run_ranks` spawns a small gloo world on 127.0.0.1 with a hard timeout. Each rank runs
``fn(rank, world_size)`` in a fresh process with the default process group already initialized.
The processes fork from a ``forkserver`` that imported the training stack once (torch, TorchRec,
torchmetrics: seconds of CPU per process, which with ``spawn`` every rank of every world paid
again; where TorchRec is missing the server starts without it); as with ``spawn``, no state of
the calling process is inherited. Results travel back through ``torch.save`` bytes (not shared
memory, which dies with the sender); exceptions travel back as formatted tracebacks. A rank that
hangs, or dies without reporting, fails the call after ``timeout_s`` instead of hanging it:
every child still alive then is killed.

Example::

    from shadowsync.testing import run_ranks

    def _sum(rank: int, world_size: int) -> float:  # module level: it must pickle
        t = torch.tensor([float(rank)])
        torch.distributed.all_reduce(t)
        return t.item()

    assert run_ranks(_sum, world_size=2) == [1.0, 1.0]
"""

from __future__ import annotations

import io
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.elastic.utils.distributed import get_free_port

__all__ = ["run_ranks", "wait_for_app"]

_EXIT_GRACE_S = 10.0
_PRELOAD = ["shadowsync.pipelines.train"]


def _child(rank: int, world_size: int, port: int, pg_timeout_s: float,
           fn: Callable[[int, int], Any], results: Any) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)  # 2 ranks + 2 sync threads on 2 cores
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=pg_timeout_s))
        buf = io.BytesIO()
        torch.save(fn(rank, world_size), buf)
        results.put((rank, True, buf.getvalue()))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[[int, int], Any], *, world_size: int = 2, timeout_s: float = 60.0,
              pg_timeout_s: float = 30.0, safe_types: Sequence[type] = ()) -> list[Any]:
    """Run ``fn(rank, world_size)`` on ``world_size`` gloo ranks; return results by rank.

    ``fn`` must be picklable (module level, or a ``functools.partial`` of one). Raises
    ``AssertionError`` with every failing rank's traceback, or ``TimeoutError`` naming the ranks
    that did not report within ``timeout_s`` seconds. Results load with ``weights_only=True``;
    ``safe_types`` lists the classes (say ``SyncStats``) they may contain besides tensors and
    plain containers.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # read when the server starts: the first world
    results = ctx.Queue()
    port = get_free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, pg_timeout_s, fn, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    reported: dict[int, tuple[bool, Any]] = {}
    try:
        while len(reported) < world_size and time.monotonic() < deadline:
            try:
                rank, ok, payload = results.get(timeout=0.1)
                reported[rank] = (ok, payload)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in reported and p.exitcode]
                if dead:
                    raise AssertionError(f"ranks {dead} died without reporting (exit codes "
                                         f"{[procs[r].exitcode for r in dead]})") from None
        for p in procs:
            p.join(max(0.0, min(_EXIT_GRACE_S, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    missing = sorted(set(range(world_size)) - set(reported))
    if missing:
        raise TimeoutError(f"ranks {missing} did not finish within {timeout_s} s")
    failures = {r: payload for r, (ok, payload) in sorted(reported.items()) if not ok}
    if failures:
        raise AssertionError("\n".join(f"--- rank {r} failed:\n{tb}" for r, tb in failures.items()))
    # weights_only even for our own children: results are tensors, plain containers and the
    # classes the caller allows (``safe_types``), nothing else is unpickled.
    with torch.serialization.safe_globals(list(safe_types)):
        return [torch.load(io.BytesIO(reported[r][1]), weights_only=True)
                for r in range(world_size)]


def wait_for_app(runner: Any, handle: str, timeout_s: float) -> Any:
    """Polls a torchx app (``runner``: a ``torchx.runner.Runner``) to a terminal state and
    returns its ``AppStatus``; one still running after ``timeout_s`` is cancelled and raises
    ``AssertionError``. A scheduler may not know a job for a moment after submitting it: no
    status yet counts as running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = runner.status(handle)
        if status is not None and status.is_terminal():
            return status
        time.sleep(0.5)
    runner.cancel(handle)
    raise AssertionError(f"{handle} still running after {timeout_s} s")
