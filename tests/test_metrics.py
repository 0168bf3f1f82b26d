"""Metrics equal a direct float64 computation of NE, AUC and calibration on the same predictions,
whether computed locally, gathered over ranks, or by TorchRec's metric module."""

from __future__ import annotations

import math
from typing import Any

import torch

from shadowsync.pipelines.metrics import binary_metrics, gather_metrics
from tests._dist import run_ranks


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


def _ranks(rank: int, world_size: int) -> dict[str, Any]:
    from torchrec.metrics.metric_module import RecMetricModule, generate_metric_module
    from torchrec.metrics.metrics_config import MetricsConfig, RecMetricDef, RecMetricEnum

    from shadowsync.pipelines.trainer import _TASK

    logits, labels = _sample(10 + rank, 300 + 57 * rank)  # unequal shares
    gathered = gather_metrics(logits, labels)
    module = generate_metric_module(
        RecMetricModule,
        MetricsConfig(rec_tasks=[_TASK], rec_metrics={
            RecMetricEnum.NE: RecMetricDef(rec_tasks=[_TASK], window_size=10_000)}),
        batch_size=len(labels), world_size=world_size, my_rank=rank, state_metrics_mapping={},
        device=torch.device("cpu"),
    )
    module.update({"prediction": torch.sigmoid(logits), "label": labels,
                   "weight": torch.ones_like(labels)})
    computed = module.compute()  # collective; the result lands on rank 0
    torchrec_ne = float(computed["ne-ctr|lifetime_ne"]) if rank == 0 else None
    return {"gathered": gathered, "torchrec_ne": torchrec_ne}


def test_gathered_and_torchrec_metrics_equal_direct_computation_over_all_ranks() -> None:
    results = run_ranks(_ranks, timeout_s=120)
    parts = [_sample(10 + r, 300 + 57 * r) for r in range(2)]
    ref = _reference(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    for r in results:
        assert r["gathered"]["examples"] == 657
        for key, value in ref.items():
            assert abs(r["gathered"][key] - value) < 1e-6, key
    assert abs(results[0]["torchrec_ne"] - ref["ne"]) < 1e-4  # TorchRec reduces in float32


def test_trainer_feeds_torchrecs_metrics_in_chunks_without_changing_them() -> None:
    """The trainer's metric module feeds TorchRec's metrics in chunks (cheaper per step); computed
    at any step, every metric equals TorchRec's module fed batch by batch, and a float64
    reference over every example so far (the window covering all of them)."""
    import torch.distributed as dist
    from torchrec.metrics.metric_module import RecMetricModule, generate_metric_module
    from torchrec.metrics.metrics_config import MetricsConfig, RecMetricDef, RecMetricEnum

    from shadowsync.pipelines.build import DistEnv
    from shadowsync.pipelines.config import load_config
    from shadowsync.pipelines.trainer import _TASK, train_metric_module

    cfg = load_config("movielens_1m", ["train.batch_size=64", "logging.window_examples=2560"])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cpu = torch.device("cpu")
        chunked = train_metric_module(cfg, DistEnv(0, 1, 0, cpu, "gloo"))
        assert chunked.flush_every == 2560 // (2 * 64)  # half the window
        stock = generate_metric_module(
            RecMetricModule,
            MetricsConfig(rec_tasks=[_TASK], rec_metrics={
                m: RecMetricDef(rec_tasks=[_TASK], window_size=2560)
                for m in (RecMetricEnum.NE, RecMetricEnum.AUC, RecMetricEnum.CALIBRATION)}),
            batch_size=64, world_size=1, my_rank=0, state_metrics_mapping={},
            device=cpu)
        # Not a multiple of 20 batches; no ties (TorchRec's AUC does not count them half).
        batches = [(logits + 1e-3 * torch.arange(64), labels)
                   for logits, labels in (_sample(100 + i, 64) for i in range(33))]
        for logits, labels in batches:
            chunked.add(logits, labels)
            stock.update({"prediction": torch.sigmoid(logits), "label": labels,
                          "weight": torch.ones_like(labels)})
        assert len(chunked._pending) == 33 - 20  # buffered since the last flush
        got, want = chunked.compute(), stock.compute()
    finally:
        dist.destroy_process_group()
    ref = _reference(torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]))
    for key, value in {"ne-ctr|lifetime_ne": ref["ne"], "ne-ctr|window_ne": ref["ne"],
                       "auc-ctr|window_auc": ref["auc"],
                       "calibration-ctr|window_calibration": ref["calibration"]}.items():
        assert abs(float(got[key]) - float(want[key])) < 1e-5, (key, got[key], want[key])
        assert abs(float(got[key]) - value) < 1e-4, (key, float(got[key]), value)


def test_background_compute_is_the_compute_of_its_step_and_holds_later_batches_back(
        monkeypatch: Any) -> None:
    """``start_compute`` runs TorchRec's reduction in a thread while training goes on: its result
    covers exactly the batches added before it started (a float64 reference over them), the
    batches added meanwhile are held back from TorchRec's state (updating it under a running
    compute would race) and reach it once the compute is done; a failure of the background
    compute is raised to whoever reads it."""
    import threading

    import torch.distributed as dist
    from torchrec.metrics.metric_module import RecMetricModule

    from shadowsync.pipelines.build import DistEnv
    from shadowsync.pipelines.config import load_config
    from shadowsync.pipelines.trainer import train_metric_module

    cfg = load_config("movielens_1m", ["train.batch_size=64", "logging.window_examples=12800"])
    batches = [(logits + 1e-3 * torch.arange(64), labels)
               for logits, labels in (_sample(200 + i, 64) for i in range(30))]
    release = threading.Event()
    stock_compute = RecMetricModule.compute

    def held(self: RecMetricModule) -> Any:
        assert release.wait(60), "the test never released the compute"
        return stock_compute(self)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        module = train_metric_module(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "gloo"),
                                     dist.new_group(backend="gloo"))
        assert module.flush_every == 64  # 12,800 // (2 * 64) = 100, at most 64
        module.flush_every = 4
        for logits, labels in batches[:10]:
            module.add(logits, labels)
        monkeypatch.setattr(RecMetricModule, "compute", held)
        first = module.start_compute()
        for logits, labels in batches[10:]:  # more than flush_every: all held back
            module.add(logits, labels)
        assert module.computing() and len(module._pending) == 20
        release.set()
        got = first.result(timeout=60)
        assert not module.computing()
        monkeypatch.setattr(RecMetricModule, "compute", stock_compute)
        total = module.compute()  # feeds the held-back batches first

        def boom(self: RecMetricModule) -> Any:
            raise RuntimeError("peer gone")

        monkeypatch.setattr(RecMetricModule, "compute", boom)
        failed = module.start_compute()
        try:
            failed.result(timeout=60)
            raise AssertionError("the background failure was not raised")
        except RuntimeError as e:
            assert "peer gone" in str(e)
    finally:
        dist.destroy_process_group()
    for computed, upto in ((got, 10), (total, 30)):
        ref = _reference(torch.cat([b[0] for b in batches[:upto]]),
                         torch.cat([b[1] for b in batches[:upto]]))
        for key, value in {"ne-ctr|lifetime_ne": ref["ne"], "ne-ctr|window_ne": ref["ne"],
                           "auc-ctr|window_auc": ref["auc"],
                           "calibration-ctr|window_calibration": ref["calibration"]}.items():
            assert abs(float(computed[key]) - value) < 1e-4, (upto, key, float(computed[key]))
