"""The ``sync.*`` overrides each arm of a job ran with, as its ``.cmd`` file recorded them, read
in today's keys (the flat keys of earlier versions moved: :data:`~shadowsync.sync.config.MOVED`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shadowsync.sync.config import MOVED


def current_override_key(key: str) -> str:
    """A recorded override's key as today's config names it: a flat ``sync.<key>`` of earlier
    versions (``shadowsync.sync.config.MOVED``) becomes ``sync.<section>.<key>``
    (``sync.thread_nice`` -> ``sync.transport.thread_nice``); any other key is returned as is.
    Results recorded before the ``sync`` section was split keep being read."""
    section, _, leaf = key.partition(".")
    return f"sync.{MOVED[leaf]}" if section == "sync" and leaf in MOVED else key


def override_dict(items: Iterable[str]) -> dict[str, str]:
    """``key=value`` items (as a job's ``.cmd`` records an arm's overrides) as a mapping with
    today's keys (:func:`current_override_key`); the last one given wins, as in the config, and
    items without ``=`` are skipped."""
    return {current_override_key(key): value
            for key, _, value in (item.partition("=") for item in items if "=" in item)}


def arm_overrides(lines: Sequence[str]) -> dict[str, str]:
    """Each arm's overrides from the ``  arm <name>: <overrides>`` lines of a job's ``.cmd``
    (other lines are skipped), in their order."""
    arms = {}
    for line in lines:
        if line.startswith("  arm "):
            name, _, overrides = line.removeprefix("  arm ").partition(":")
            arms[name.strip()] = overrides.strip()
    return arms
