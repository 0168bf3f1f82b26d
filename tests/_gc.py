"""What Python's garbage collector did inside a block."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def collections() -> Iterator[list[int]]:
    """The generation of every collection that finishes inside the block, in order; -1 for
    one that ran while Python's automatic collector was on (so possibly not asked for)."""
    seen: list[int] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            seen.append(-1 if gc.isenabled() else info["generation"])

    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)
