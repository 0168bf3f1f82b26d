"""What rank 0 prints while training: one line a person reads per metrics record.

The records themselves, every digit and a timestamp, go to ``output_dir/metrics.jsonl``; the
console gets them rounded (``step 400/879 | loss 0.5321 | NE 0.8712 | AUC 0.7468 | 98,765
ex/s | sync gap 11.3 | ETA 0:00:41``). Progress lines are left out while a terminal progress
bar shows the same numbers.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shadowsync.datasets import RecDataset


def planned_steps(steps: int | None, epochs: int, dataset: RecDataset, batch_size: int,
                  world_size: int) -> int | None:
    """The steps a run will take: ``train.steps``, capped by ``epochs`` passes where the data
    set knows its size (the file-backed ones count rows; a pass is ``rows // (B * W)`` steps).
    None when neither says."""
    num_rows = getattr(dataset, "num_rows", None)
    per_epoch = None if num_rows is None else num_rows("train") // (batch_size * world_size)
    if per_epoch is None:
        return steps
    return epochs * per_epoch if steps is None else min(steps, epochs * per_epoch)


def rounded(value: Any, digits: int = 4) -> str:
    """A number as a person reads it: ``98,765`` from 1,000 up and for whole numbers, else
    ``digits`` decimals; anything else as ``str``."""
    if isinstance(value, bool) or not isinstance(value, float | int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1000 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class ConsoleLog:
    """Turns records into lines; :meth:`start` marks where this process's training begins, so
    that the ETA comes from the step rate it measures (evaluations included)."""

    def __init__(self, total_steps: int | None) -> None:
        self.total_steps = total_steps
        self.progress_lines = True
        self._start: tuple[int, float] | None = None

    def start(self, step: int, progress_lines: bool) -> None:
        self._start = (step, time.monotonic())
        self.progress_lines = progress_lines

    def _eta(self, step: int) -> str | None:
        if self._start is None or self.total_steps is None or step <= self._start[0]:
            return None
        first, t0 = self._start
        rate = (step - first) / max(time.monotonic() - t0, 1e-9)
        return _duration(max(self.total_steps - step, 0) / rate)

    def line(self, record: dict[str, Any]) -> str | None:
        """The line for ``record``; None for the summary (printed as a table) and, while a
        progress bar shows, for training progress."""
        if record.get("summary"):
            return None
        step = record.get("step")
        if "loss" in record:
            return self._progress(record) if self.progress_lines else None
        evals = {k[len("eval_"):]: v for k, v in record.items() if k.startswith("eval_")}
        if evals:
            parts = [f"AUC {rounded(evals.get('auc'))}", f"NE {rounded(evals.get('ne'))}",
                     f"calibration {rounded(evals.get('calibration'), 3)}",
                     f"{rounded(evals.get('examples'))} examples"]
            return f"eval after step {step}: " + ", ".join(parts)
        rest = ", ".join(f"{k.replace('_', ' ')} {rounded(v)}" for k, v in record.items()
                         if k != "step")
        return f"step {step}: {rest}"

    def _progress(self, record: dict[str, Any]) -> str:
        step = record["step"]
        parts = [f"step {step}" + (f"/{self.total_steps}" if self.total_steps else ""),
                 f"loss {rounded(record['loss'])}"]
        for key, name in (("ne", "NE"), ("auc", "AUC")):
            if key in record:
                parts.append(f"{name} {rounded(record[key])}")
        if "examples_per_s" in record:
            parts.append(f"{record['examples_per_s']:,.0f} ex/s")
        if "sync_gap_mean" in record:
            parts.append(f"sync gap {record['sync_gap_mean']:.1f}")
        eta = self._eta(step)
        if eta is not None:
            parts.append(f"ETA {eta}")
        return " | ".join(parts)


LOG_DIR_ENV = "SHADOWSYNC_LOG_DIR"
"""Set by :mod:`.launch` under torchx's ``local_cwd``: the folder holding the replica's
``stdout.log`` and ``stderr.log``, which torchx tells only the launcher."""


def logs(environ: Mapping[str, str]) -> str | None:
    """How to read this job's logs later, from what torchx gives every role: the replica's
    folder under ``local_cwd`` (its ``torchx log`` works only inside the ``torchx run`` that
    started the job), else ``torchx log`` on the app handle torchx puts in ``TORCHX_JOB_ID``
    (``scheduler://session/app_id``). None when torchx did not start the job."""
    folder = environ.get(LOG_DIR_ENV)
    if folder:
        return f"{folder} (stdout.log, stderr.log)"
    handle = environ.get("TORCHX_JOB_ID")
    if not handle or handle.startswith("local_cwd://"):
        return None
    scheduler, _, rest = handle.partition("://")
    session, _, app_id = rest.rpartition("/")
    if scheduler == "kubernetes" and ":" not in app_id:
        # torchx 0.7.0 gives pods the job's name, while its handles are namespace:name
        handle = f"{scheduler}://{session}/<namespace>:{app_id}"
    return f"torchx log {handle}"


def locations(output_dir: str | None, history: list[dict[str, Any]], last_step: int,
              environ: Mapping[str, str]) -> dict[str, str]:
    """Where a run's results are, for the end of its summary: the steps the summary covers
    after a resume, ``output_dir`` and its metrics file, the newest checkpoint, and the logs
    (see :func:`logs`)."""
    where = {}
    resumed = next((r for r in history if "resumed_from" in r), None)
    if resumed is not None:
        where["steps"] = (f"{resumed['step'] + 1}..{last_step} (this process; resumed from "
                          f"{resumed['resumed_from']})")
    if output_dir:
        where["output_dir"] = output_dir
        where["metrics"] = str(Path(output_dir) / "metrics.jsonl")
    saved = [r["checkpoint"] for r in history if "checkpoint" in r]
    if saved:
        where["checkpoint"] = saved[-1]
    elif resumed is not None:
        where["checkpoint"] = resumed["resumed_from"]
    log_hint = logs(environ)
    if log_hint is not None:
        where["logs"] = log_hint
    return where


def leave_error(line: str, code: int, *, timestamp: int | None = None,
                error_file: str | None = None) -> None:
    """Leaves ``line`` and ``code`` in the error file torchrun (or torchx) gave this process,
    ``TORCHELASTIC_ERROR_FILE`` (or in ``error_file``), in torchelastic's shape: their
    summaries then show the line (torchx as the job's ``structured_error_msg``) instead of no
    traceback. ``timestamp`` (whole seconds, default now) is what torchrun orders failures by
    for its "Root Cause"."""
    error_file = error_file or os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        stamp = int(time.time()) if timestamp is None else timestamp
        reply = {"message": line, "errorCode": code, "extraInfo": {"timestamp": str(stamp)}}
        with open(error_file, "w") as f:
            json.dump({"message": reply}, f)
