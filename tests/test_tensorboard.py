"""``logging.tensorboard``: every numeric value of every record, as TensorBoard scalars."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.logbook import board_scalars
from shadowsync.testing import run_ranks
from tests._dist import SMALL


def test_record_keys_become_grouped_tags() -> None:
    record = {"step": 20, "loss": 0.5, "examples_per_s": 1e4, "ne": 0.9, "sync_gap_mean": 2.5,
              "sync_rounds": 7, "eval_auc": 0.7, "checkpoint": "ck/step_20", "preempted": True}
    assert board_scalars(record) == {
        "train/loss": 0.5, "train/examples_per_s": 1e4, "train/ne": 0.9, "sync/gap_mean": 2.5,
        "sync/rounds": 7.0, "eval/auc": 0.7}


def test_tensorboard_needs_an_output_dir() -> None:
    with pytest.raises(ValueError, match="logging.tensorboard .*set output_dir"):
        load_config("synthetic", ["logging.tensorboard=true"])


def _train(rank: int, world_size: int, out: str) -> None:
    from shadowsync.datasets import build_dataset
    from shadowsync.pipelines.train import Trainer, init_distributed

    cfg = load_config("synthetic", [*SMALL[2:], "train.steps=20", "train.log_every=5",
                                    "eval.every_steps=10", "sync.strategy.name=ma",
                                    "sync.schedule.mode=shadow", "logging.tensorboard=true",
                                    f"output_dir={out}"])
    with Trainer(RunContext.of(cfg, init_distributed(60)), build_dataset(cfg.data.name,
                                                          **cfg.data.options)) as trainer:
        trainer.train()


@pytest.mark.slow
def test_a_run_writes_what_metrics_jsonl_holds(tmp_path: Path) -> None:
    """A 2-rank shadow run: rank 0's events hold, per tag, exactly the steps and values of
    ``metrics.jsonl`` (float32, as TensorBoard stores them); rank 1 writes none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_ranks(functools.partial(_train, out=str(tmp_path)), timeout_s=180)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if not record.get("summary"):
            for tag, value in board_scalars(record).items():
                if tag != "train/time":
                    expected.setdefault(tag, []).append((record["step"], value))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    got: dict[str, Any] = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
                           for tag in events.Tags()["scalars"]}
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    for tag, points in expected.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag
    assert [s for s, _ in got["train/loss"]] == [5, 10, 15, 20]
    assert [s for s, _ in got["eval/auc"]] == [10, 20]
    assert "sync/gap_mean" in got
