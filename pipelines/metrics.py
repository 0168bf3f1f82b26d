"""Exact CTR metrics over the predictions of all ranks.

Normalized entropy (NE) is the log loss divided by the entropy of the base rate, so 1.0 is a
constant predictor that knows the click rate and lower is better (He et al., "Practical
lessons from predicting clicks on ads at Facebook", ADKDD 2014).
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """AUC, log loss, NE, calibration (predicted / observed click rate) and the click rate."""
    if logits.numel() == 0 or logits.shape != labels.shape:
        raise ValueError(f"need equal non-empty logits/labels, got {logits.shape}/{labels.shape}")
    logits = logits.double()
    labels = labels.double()
    logloss = float(F.binary_cross_entropy_with_logits(logits, labels))
    ctr = float(labels.mean())
    base = _entropy(ctr)
    return {
        "auc": auc(logits, labels),
        "logloss": logloss,
        "ne": logloss / base,
        "calibration": float(torch.sigmoid(logits).mean()) / ctr if ctr > 0 else float("nan"),
        "ctr": ctr,
        "examples": float(labels.numel()),
    }


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The exact ROC AUC: the Mann-Whitney statistic, the share of (positive, negative) pairs
    the scores order correctly, ties counting half, which equals the trapezoidal area under
    the ROC curve (what ``torchmetrics``' ``binary_auroc`` computes). NaN without both
    classes or with a NaN score.

    Written here because ``binary_auroc`` and ``torch.sort`` sort on the host over ten times
    slower than NumPy's sort of each class followed by two binary searches of the negatives
    (counts below and up to each positive), and a training record computes one every
    ``log_every`` steps, beside training, on the CPUs training needs.
    """
    x = scores.detach().to("cpu", torch.float64).numpy()  # a no-op for float64 on the host
    positive = labels.detach().cpu().numpy() > 0.5
    pos, neg = np.sort(x.compress(positive)), np.sort(x.compress(~positive))
    if pos.size == 0 or neg.size == 0 or np.isnan(pos[-1]) or np.isnan(neg[-1]):
        return math.nan  # NumPy sorts NaN last
    below = np.searchsorted(neg, pos, side="left").sum(dtype=np.int64)
    up_to = np.searchsorted(neg, pos, side="right").sum(dtype=np.int64)
    return float((below + up_to) / (2 * pos.size * neg.size))


def _entropy(ctr: float) -> float:
    """The entropy of a click rate in nats: NE's denominator (NaN when one class is absent)."""
    return -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr)) if 0 < ctr < 1 else math.nan


def _gather_predictions(logits: torch.Tensor, labels: torch.Tensor,
                        group: dist.ProcessGroup | None, extra: Sequence[float] = (),
                        dst: int | None = None) -> tuple[torch.Tensor | None, list[list[float]]]:
    """Collective, two collectives: every rank's predictions (shares may differ in size) as
    one ``2 x N`` float32 tensor of logits and labels on the host, in rank order, on every
    rank or only on group rank ``dst`` (None elsewhere); and every rank's ``extra`` numbers."""
    world = dist.get_world_size(group)
    mine = torch.tensor([logits.numel(), *extra], dtype=torch.float64, device=logits.device)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine, group=group)
    table = [row.tolist() for row in rows]
    both = torch.zeros(2, int(max(row[0] for row in table)), device=logits.device)
    both[0, : logits.numel()] = logits.float()
    both[1, : labels.numel()] = labels.float()
    parts = [torch.empty_like(both) for _ in range(world)]
    if dst is None:
        dist.all_gather(parts, both, group=group)
    else:
        receives = dist.get_rank(group) == dst
        dist.gather(both, parts if receives else None, group=group, group_dst=dst)
    extras = [row[1:] for row in table]
    if dst is not None and not receives:
        return None, extras
    merged = torch.cat([p[:, : int(row[0])] for p, row in zip(parts, table, strict=True)], 1)
    return merged.cpu(), extras


def gather_metrics(
    logits: torch.Tensor, labels: torch.Tensor, group: dist.ProcessGroup | None = None
) -> dict[str, float]:
    """Gathers every rank's predictions (shares may differ in size) and computes the metrics
    once over all of them, so the numbers equal a direct computation on the whole split."""
    if not dist.is_initialized():
        return binary_metrics(logits, labels)
    merged, _ = _gather_predictions(logits, labels, group)
    assert merged is not None  # gathered on every rank
    return binary_metrics(merged[0], merged[1])


class TrainingMetrics:
    """The metrics of training records: NE, AUC and calibration over a window of recent
    examples (each rank's last ``ceil(window_examples / world_size)``), and NE over every
    example so far, computed exactly in the background.

    TorchRec's ``RecMetricModule`` (which this replaced) reduces each of its 15 metric states
    separately through torchmetrics, a barrier and two all_gathers each: 45 collectives a
    record, which on CPU ranks spread each record's compute over many times its own CPU time,
    competing with training the whole while. Here a compute is two collectives on a group of
    its own: the ranks' counts and run-long sums (one all_gather), then their windows to rank
    0 (one gather), where :func:`binary_metrics` computes the window's metrics in float64;
    other ranks get ``{}``, as from TorchRec's module.

    A step costs one list append (:meth:`add`); every ``flush_every`` batches the kept ones are
    folded into the run-long sums and the window in one go, on their device and without
    reading anything back (no host sync on a GPU). A compute (:meth:`start_compute`) reads a
    snapshot of the window and the sums (tensors never written in place), copied to the host
    in its own thread, so training goes on meanwhile and later batches never wait for it.

    Args:
        window_examples: examples in the window, over all ranks.
        world_size: ranks in ``group``.
        group: the process group the computes use (nothing else should).
        flush_every: batches kept before they are folded in.

    Example::

        metrics = TrainingMetrics(100_000, world, dist.new_group(backend="gloo"))
        metrics.add(logits, labels)  # every step
        future = metrics.start_compute()  # every rank, at the same step
        record = future.result()  # {"ne": ..., "lifetime_ne": ..., "auc": ..., ...} on rank 0
    """

    def __init__(self, window_examples: int, world_size: int,
                 group: dist.ProcessGroup | None = None, flush_every: int = 64) -> None:
        if window_examples <= 0 or flush_every <= 0:
            raise ValueError(f"window_examples and flush_every must be positive, got "
                             f"{window_examples} and {flush_every}")
        self.local_window = math.ceil(window_examples / world_size)
        self.group = group
        self.flush_every = flush_every
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        # Each rank's window: (logits, labels) chunks, oldest first, local_window examples.
        self._window: collections.deque[tuple[torch.Tensor, torch.Tensor]] = collections.deque()
        self._in_window = 0
        # Over the whole run: log loss summed and clicks (float64, on the batches' device),
        # and examples.
        self._sums: torch.Tensor | None = None
        self._examples = 0
        self._computing: Future[dict[str, float]] | None = None

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """One training batch's logits and labels (kept as they are: never modify them)."""
        self._pending.append((logits.detach(), labels))
        if len(self._pending) >= self.flush_every:
            self._flush()

    def _flush(self) -> None:
        """Folds the kept batches into the run-long sums and the window."""
        if not self._pending:
            return
        logits = torch.cat([lg for lg, _ in self._pending]).float()
        labels = torch.cat([lb for _, lb in self._pending]).float()
        self._pending.clear()
        labels64 = labels.double()
        sums = torch.stack([F.binary_cross_entropy_with_logits(
            logits.double(), labels64, reduction="sum"), labels64.sum()])
        # Out of place: a compute's snapshot of the old sums stays as it was.
        self._sums = sums if self._sums is None else self._sums + sums
        self._examples += labels.numel()
        self._window.append((logits, labels))
        self._in_window += labels.numel()
        while self._in_window - self._window[0][1].numel() >= self.local_window:
            self._in_window -= self._window.popleft()[1].numel()
        extra = self._in_window - self.local_window
        if extra > 0:  # the oldest chunk straddles the window's start
            lg, lb = self._window[0]
            self._window[0] = (lg[extra:], lb[extra:])
            self._in_window -= extra

    def start_compute(self) -> Future[dict[str, float]]:
        """Collective: the metrics over every batch added so far, computed in a thread (after
        any compute still running, whose failure is raised here). Every rank calls it at the
        same step."""
        if self._computing is not None:
            self._computing.result()
        self._flush()
        window, sums, examples = list(self._window), self._sums, self._examples
        future: Future[dict[str, float]] = Future()

        def main() -> None:
            try:
                loss, clicks = sums.tolist() if sums is not None else (0.0, 0.0)
                future.set_result(self._reduce(window, [loss, clicks, float(examples)]))
            except BaseException as e:  # handed to whoever reads the result
                future.set_exception(e)

        # A daemon: a compute stuck on a peer that died must not keep this process alive.
        threading.Thread(target=main, name="shadowsync-metrics", daemon=True).start()
        self._computing = future
        return future

    def compute(self) -> dict[str, float]:
        """Collective: :meth:`start_compute`, waited for."""
        return self.start_compute().result()

    def _reduce(self, window: list[tuple[torch.Tensor, torch.Tensor]],
                sums: list[float]) -> dict[str, float]:
        """Collective on :attr:`group`: the metrics of every rank's ``window`` and ``sums``
        (log loss summed, clicks, examples), on group rank 0; ``{}`` elsewhere."""
        logits = torch.cat([lg for lg, _ in window]).cpu() if window else torch.zeros(0)
        labels = torch.cat([lb for _, lb in window]).cpu() if window else torch.zeros(0)
        merged: torch.Tensor | None
        if not dist.is_initialized():
            merged, table = torch.stack([logits, labels]), [sums]
        else:  # gloo, on the host
            merged, table = _gather_predictions(logits, labels, self.group, sums, dst=0)
        if merged is None:
            return {}
        got = binary_metrics(merged[0], merged[1])
        loss, clicks, examples = (sum(row[i] for row in table) for i in range(3))
        return {"ne": got["ne"], "lifetime_ne": loss / examples / _entropy(clicks / examples),
                "auc": got["auc"], "calibration": got["calibration"]}
