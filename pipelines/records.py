"""Metric keys renamed since records were saved, so readers of committed results
(``metrics.jsonl``, benchmark ``runs.json`` and ``raw/*.json``) see one set of names.

Pure Python on purpose: the plot command and the report scripts import it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# old key -> current key (the trainer prefixes ``sync_`` to the runner's stats, whose gap
# fields were once called ``sync_gap_*`` themselves)
RENAMED = {"sync_sync_gap_mean": "sync_gap_mean", "sync_sync_gap_max": "sync_gap_max"}


def current_keys(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with each old key under its current name, in the same order."""
    return {RENAMED.get(k, k): v for k, v in record.items()}
