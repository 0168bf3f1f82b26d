"""The job's key-value store (torchrun's agent store, or rank 0's), reached afresh by a rank
that cannot trust its process groups: where the job's first failure is posted (its message,
rank and time) and torchrun's error file is stamped from it."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.console import leave_error

__all__ = ["FirstFailure", "failure_message", "first_time", "job_store", "post_first", "report",
           "silent_message", "this_rank"]

STORE_TIMEOUT_S = 3.0


def this_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


class FirstFailure(RuntimeError):
    """This rank's failure as another of its threads posted it (its whole message)."""


def failure_message(exc: BaseException, rank: int | None = None) -> str:
    if isinstance(exc, FirstFailure):
        return str(exc)
    what = (checkpoint.describe(exc) if isinstance(exc, CheckpointException)
            else f"{type(exc).__name__}: {exc}")
    return f"rank {this_rank() if rank is None else rank} failed: {what}"


def job_store(kind: str, timeout_s: float = STORE_TIMEOUT_S) -> dist.Store | None:
    """The job's store under ``kind`` (``failure``, ``heartbeat``) for this launch attempt;
    None when unreachable."""
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=timeout_s))
    except (KeyError, ValueError, RuntimeError):
        return None
    attempt = (f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
               f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    return dist.PrefixStore(f"shadowsync/{kind}/{attempt}/", store)


def post_first(store: dist.Store, message: str, rank: int) -> bool:
    """Posts ``message`` as the job's first failure, that of ``rank``, unless one was."""
    if store.add("count", 1) != 1:
        return False
    store.set("first_time", repr(time.time()))
    store.set("first_rank", str(rank))
    store.set("first", message)
    return True


def first_time(store: dist.Store | None) -> float | None:
    """When the job's first failure was posted (Unix time), if it was."""
    try:
        if store is not None and store.check(["first_time"]):
            return float(store.get("first_time").decode())
    except (RuntimeError, ValueError):
        pass
    return None


def silent_message(ranks: list[int], how: str) -> str:
    who = ", ".join(map(str, ranks))
    return (f"rank {who} failed: stopped responding (no heartbeat: killed, stopped or hung; "
            f"{how})")


def report(message: str, *, consequence: bool, error_file: str | None = None) -> None:
    """Writes ``message`` to torchrun's error file (this process's, or ``error_file``), stamped
    at the second of the job's first failure, a second later for a ``consequence``."""
    first = first_time(job_store("failure"))
    stamp = int(first if first is not None else time.time()) + int(consequence)
    leave_error(message, 1, timestamp=stamp, error_file=error_file)
