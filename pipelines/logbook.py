"""The run's records: training records (loss, examples/s, the synchronizer's counters, and
metrics reduced over the ranks in the background), evaluation, checkpoint and summary records,
in step order; rank 0 prints them and appends them to ``metrics.jsonl``; the progress bar."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

from shadowsync.pipelines.console import ConsoleLog
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.metrics import TrainingMetrics

logger = logging.getLogger("shadowsync.train")


def board_scalars(record: dict[str, Any]) -> dict[str, float]:
    """A record's numeric values under TensorBoard tags: ``eval/auc`` for ``eval_auc``,
    ``sync/gap_mean`` for ``sync_gap_mean``, ``train/loss`` for the rest of a training record;
    ``step``, and what is not a number (a checkpoint's path), are left out."""
    tags = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        group, _, name = key.partition("_")
        tags[f"{group}/{name}" if group in ("eval", "sync") else f"train/{key}"] = float(value)
    return tags


class Logbook:
    """Every record of a run, in step order (:attr:`history` on every rank).

    Every ``train.log_every`` steps :meth:`start` begins a training record; its metrics reduce
    over the ranks in the background (:meth:`~.metrics.TrainingMetrics.start_compute`, a
    collective) and the record is logged as soon as they are done (:meth:`poll`), or before the
    next record of any kind (:meth:`log` waits for it), so records stay in order.

    Args:
        ctx: the run (``output_dir``, ``train.batch_size``, ``logging.*``; its callbacks are
            told of each training record started; examples/s is timed on its clock, while
            ``metrics.jsonl``'s ``time`` stays the Unix time).
        console: turns records into the lines rank 0 prints.
        metrics: the window and run metrics the training records reduce.
        stats: the synchronizer's counters, added to each training record as ``sync_*``.
    """

    def __init__(self, ctx: RunContext, console: ConsoleLog, metrics: TrainingMetrics,
                 stats: Callable[[], dict[str, Any]]) -> None:
        cfg, env, clock = ctx.cfg, ctx.env, ctx.clock
        self.cfg, self.env, self.console, self.metrics = cfg, env, console, metrics
        self._clock = clock
        self._stats, self._callbacks = stats, ctx.callbacks
        self.history: list[dict[str, Any]] = []
        self.out_dir = Path(cfg.output_dir) if cfg.output_dir else None
        if self.out_dir is not None and env.rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        # The training record whose metrics are being computed in the background.
        self._pending: tuple[dict[str, Any], Future[dict[str, float]]] | None = None
        self._since = (clock(), 0)  # the last training record: when, which step
        self._losses: list[torch.Tensor] = []  # since the last record, summed there
        self._bar: tqdm[Any] | None = None
        self._board: SummaryWriter | None = None
        if cfg.logging.tensorboard and env.rank == 0 and self.out_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # the optional extra

            self._board = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))

    def open(self, step: int) -> None:
        """Training (re)starts after ``step``: the progress bar (rank 0, on a terminal, if
        ``logging.progress_bar``) or progress lines, and examples/s timed from now."""
        show_bar = (self.env.rank == 0 and self.cfg.logging.progress_bar
                    and sys.stderr.isatty())
        self._bar = tqdm(total=self.console.total_steps, initial=step, disable=not show_bar,
                         unit="step", dynamic_ncols=True)
        self.console.start(step, progress_lines=not show_bar)
        self._since = (self._clock(), step)

    def close(self) -> None:
        """Closes the progress bar and the TensorBoard writer (after the last record)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._board is not None:
            self._board.close()
            self._board = None

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """A training step's outputs, for the next training record (no host sync)."""
        self.metrics.add(logits, labels)
        self._losses.append(loss.detach())
        if self._bar is not None:
            self._bar.update(1)

    def log(self, record: dict[str, Any]) -> None:
        """Rank 0 prints a line a person reads and appends the record, with its Unix ``time``,
        to ``metrics.jsonl``; a training record still computing is logged first (waiting for
        it), so records stay in step order."""
        self.finish()
        self.history.append(record)
        if self.env.rank == 0:
            line = self.console.line(record)
            if line is not None:
                logger.info(line)
            if self.out_dir is not None:
                with open(self.out_dir / "metrics.jsonl", "a") as f:
                    f.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")
            if self._board is not None and not record.get("summary"):
                for tag, value in board_scalars(record).items():
                    self._board.add_scalar(tag, value, record["step"])
                self._board.flush()

    def start(self, step: int) -> None:
        """Collective: the training record of ``step``, over the losses since the last one.
        Examples/s is over the steps since the previous record, ``examples`` counts from
        step 0."""
        self.finish()
        computing = self.metrics.start_compute()
        self._callbacks.record(step, computing)
        loss = float(torch.stack(self._losses).mean())
        self._losses.clear()
        per_step = self.cfg.train.batch_size * self.env.world_size
        now = self._clock()
        since, steps_before = self._since
        self._since = (now, step)
        record: dict[str, Any] = {"step": step, "loss": loss,
                                  "examples_per_s": (step - steps_before) * per_step
                                  / max(now - since, 1e-9),
                                  "examples": step * per_step}
        record.update({f"sync_{k}": v for k, v in self._stats().items()})
        self._pending = (record, computing)

    def poll(self) -> None:
        """Logs the training record computing, if its metrics are done (never waits)."""
        record = self.finish(wait=False)
        if record is not None and self._bar is not None:
            self._bar.set_postfix(loss=f"{record['loss']:.4f}", ne=f"{record.get('ne', 0):.4f}",
                                  ex_s=f"{record['examples_per_s']:,.0f}")

    def finish(self, wait: bool = True) -> dict[str, Any] | None:
        """Logs the training record whose metrics were computing, once they are (waiting for
        them if ``wait``; otherwise only if done); returns it, or None if none was logged.
        Raises what the computation raised."""
        if self._pending is None or not (wait or self._pending[1].done()):
            return None
        (record, computing), self._pending = self._pending, None
        record = {**record, **computing.result()}
        self.log(record)
        return record
