"""Metrics equal a direct float64 computation of NE, AUC and calibration on the same predictions,
whether computed locally, gathered over ranks, or by the training records' windowed metrics."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from shadowsync.pipelines.metrics import auc, binary_metrics, gather_metrics
from shadowsync.testing import run_ranks


def _reference(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Textbook definitions in float64: AUC as the Mann-Whitney statistic (ties count half)."""
    p = [1 / (1 + math.exp(-x)) for x in logits.double().tolist()]
    y = labels.double().tolist()
    n = len(y)
    pairs = list(zip(p, y, strict=True))
    logloss = -sum(yi * math.log(pi) + (1 - yi) * math.log(1 - pi) for pi, yi in pairs) / n
    ctr = sum(y) / n
    entropy = -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))
    pos = [pi for pi, yi in pairs if yi == 1]
    neg = [pi for pi, yi in pairs if yi == 0]
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    return {"auc": wins / (len(pos) * len(neg)), "logloss": logloss, "ne": logloss / entropy,
            "calibration": sum(p) / n / ctr, "ctr": ctr}


def _sample(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, generator=g) * 1.5
    labels = torch.bernoulli(torch.sigmoid(logits + 0.3), generator=g)
    logits[:20] = 0.25  # ties
    return logits, labels


def test_binary_metrics_match_float64_reference() -> None:
    logits, labels = _sample(0, 600)
    got, ref = binary_metrics(logits, labels), _reference(logits, labels)
    for key, value in ref.items():
        assert abs(got[key] - value) < 1e-6, (key, got[key], value)
    assert got["examples"] == 600


def test_auc_is_the_exact_mann_whitney_statistic_with_ties() -> None:
    """Exactly (to the last bit) the share of correctly ordered pairs, ties half, where most
    scores tie (scores on a coarse grid), and NaN where it is undefined."""
    g = torch.Generator().manual_seed(3)
    for n, grid in ((401, 4.0), (1000, 1.0), (64, 1e6)):
        labels = torch.bernoulli(torch.full((n,), 0.4), generator=g)
        scores = ((torch.randn(n, generator=g) + labels) * grid).round() / grid
        pos = [a for a, y in zip(scores.tolist(), labels.tolist(), strict=True) if y == 1]
        neg = [b for b, y in zip(scores.tolist(), labels.tolist(), strict=True) if y == 0]
        twice_wins = sum(2 * (a > b) + (a == b) for a in pos for b in neg)
        assert auc(scores, labels) == twice_wins / (2 * len(pos) * len(neg)), n
        assert auc(scores.double(), labels) == auc(scores, labels)
    assert math.isnan(auc(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0])))
    assert math.isnan(auc(torch.tensor([0.1, math.nan, 0.3]), torch.tensor([1.0, 0.0, 0.0])))


def _batches(seed: int, n: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` examples of :func:`_sample` in batches of ``size`` (the last one shorter)."""
    logits, labels = _sample(seed, n)
    return list(zip(logits.split(size), labels.split(size), strict=True))


def _cat(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def _ranks(rank: int, world_size: int) -> dict[str, Any]:
    from shadowsync.pipelines.metrics import TrainingMetrics

    logits, labels = _sample(10 + rank, 300 + 57 * rank)  # unequal shares
    gathered = gather_metrics(logits, labels)
    # A window of 150 examples a rank; batches of 40, folded in every 3 batches (chunks of
    # 120), so the window's oldest chunk is cut part-way.
    metrics = TrainingMetrics(300, world_size, flush_every=3)
    for lg, lb in zip(logits.split(40), labels.split(40), strict=True):
        metrics.add(lg, lb)
    return {"gathered": gathered, "windowed": metrics.compute()}


@pytest.mark.slow
def test_gathered_and_windowed_metrics_equal_direct_computation_over_all_ranks() -> None:
    results = run_ranks(_ranks, timeout_s=120)
    parts = [_sample(10 + r, 300 + 57 * r) for r in range(2)]
    ref = _reference(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    for r in results:
        assert r["gathered"]["examples"] == 657
        for key, value in ref.items():
            assert abs(r["gathered"][key] - value) < 1e-6, key
    # The window: each rank's last 150 examples; the run-long NE: every example.
    window = _reference(torch.cat([p[0][-150:] for p in parts]),
                        torch.cat([p[1][-150:] for p in parts]))
    windowed = results[0]["windowed"]
    assert set(windowed) == {"ne", "lifetime_ne", "auc", "calibration"}
    for key in ("ne", "auc", "calibration"):
        assert abs(windowed[key] - window[key]) < 1e-6, (key, windowed[key], window[key])
    assert abs(windowed["lifetime_ne"] - ref["ne"]) < 1e-6
    assert abs(window["ne"] - ref["ne"]) > 1e-3  # the window is not the whole run
    assert results[1]["windowed"] == {}  # computed on rank 0, as TorchRec's module does


@pytest.mark.slow
def test_training_metrics_slide_their_window_exactly_and_refuse_bad_arguments() -> None:
    """Computed at any step, the window is the last ``window_examples`` examples (however the
    batches fell into chunks, the window smaller than a chunk included) and the run-long NE
    covers every example, against float64 references."""
    from shadowsync.pipelines.metrics import TrainingMetrics

    batches = _batches(100, 33 * 64 + 17, 64)  # the last batch short
    for window, flush_every in ((2560, 20), (100, 4), (5000, 1)):
        metrics = TrainingMetrics(window, 1, flush_every=flush_every)
        done = 0
        for upto in (7, 20, len(batches)):  # computed at three steps of one run
            for lg, lb in batches[done:upto]:
                metrics.add(lg, lb)
            done = upto
            got = metrics.compute()
            logits, labels = _cat(batches[:upto])
            ref, last = _reference(logits, labels), _reference(logits[-window:], labels[-window:])
            for key in ("ne", "auc", "calibration"):
                assert abs(got[key] - last[key]) < 1e-6, (window, upto, key)
            assert abs(got["lifetime_ne"] - ref["ne"]) < 1e-6, (window, upto)
    for bad in ({"window_examples": 0}, {"flush_every": 0}):
        try:
            TrainingMetrics(**{"window_examples": 10, "world_size": 1, **bad})
            raise AssertionError(f"accepted {bad}")
        except ValueError as e:
            assert "must be positive" in str(e)


def test_background_compute_is_the_compute_of_its_step_while_training_goes_on(
        monkeypatch: Any) -> None:
    """``start_compute`` computes in a thread while training goes on: its result covers exactly
    the batches added before it started (a float64 reference over them) even when later
    batches are folded in meanwhile; they count in the next compute; a failure of the
    background compute is raised to whoever reads it, and by the next ``start_compute``."""
    import threading

    from shadowsync.pipelines.metrics import TrainingMetrics

    batches = _batches(200, 30 * 64, 64)
    release = threading.Event()
    stock_reduce = TrainingMetrics._reduce

    def held(self: TrainingMetrics, *args: Any) -> dict[str, float]:
        assert release.wait(60), "the test never released the compute"
        return stock_reduce(self, *args)

    metrics = TrainingMetrics(12_800, 1, flush_every=4)
    for lg, lb in batches[:10]:
        metrics.add(lg, lb)
    monkeypatch.setattr(TrainingMetrics, "_reduce", held)
    first = metrics.start_compute()
    for lg, lb in batches[10:]:  # five flushes while it runs
        metrics.add(lg, lb)
    assert not first.done() and len(metrics._window) > 1
    release.set()
    got = first.result(timeout=60)
    assert first.done()
    monkeypatch.setattr(TrainingMetrics, "_reduce", stock_reduce)
    total = metrics.compute()
    for computed, upto in ((got, 10), (total, 30)):
        ref = _reference(*_cat(batches[:upto]))
        for key in ("ne", "lifetime_ne", "auc", "calibration"):
            want = ref["ne"] if key == "lifetime_ne" else ref[key]
            assert abs(computed[key] - want) < 1e-6, (upto, key, computed[key])

    def boom(self: TrainingMetrics, *args: Any) -> dict[str, float]:
        raise RuntimeError("peer gone")

    monkeypatch.setattr(TrainingMetrics, "_reduce", boom)
    failed = metrics.start_compute()
    for read in (lambda: failed.result(timeout=60), metrics.start_compute):
        try:
            read()
            raise AssertionError("the background failure was not raised")
        except RuntimeError as e:
            assert "peer gone" in str(e)
