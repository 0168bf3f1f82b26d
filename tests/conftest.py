"""Fixtures shared by the test files."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from shadowsync.sync.groups import new_sync_group


@pytest.fixture
def world1() -> Iterator[dist.ProcessGroup]:
    """A gloo world of one in this process, and its sync group."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield new_sync_group(timeout=timedelta(seconds=30))
    finally:
        dist.destroy_process_group()
