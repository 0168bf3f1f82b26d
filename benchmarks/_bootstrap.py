"""Lets the GPU scripts run from a bare checkout (the device machine gets a copy of the repo, no
install): the repo root is the ``shadowsync`` package whatever the directory is called, and
``tests/`` holds the process-spawning helper they share with the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("shadowsync") is None:
    _spec = importlib.util.spec_from_file_location(
        "shadowsync", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    assert _spec is not None and _spec.loader is not None
    sys.modules["shadowsync"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["shadowsync"])
sys.path.insert(0, str(ROOT / "tests"))
