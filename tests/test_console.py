"""Rank 0's console lines: rounded progress with an ETA, eval and checkpoint events, and where
a finished run's results are."""

from __future__ import annotations

import pytest

from shadowsync.pipelines import console
from shadowsync.pipelines.console import LOG_DIR_ENV, ConsoleLog, locations, logs, planned_steps

RECORD = {"step": 400, "loss": 0.532149, "ne": 0.871234567, "lifetime_ne": 0.9, "auc": 0.746812,
          "calibration": 1.01, "examples_per_s": 98765.4321, "examples": 409600.0,
          "sync_gap_mean": 11.2857, "sync_syncs_applied": 35.0}


def test_progress_line_is_rounded_and_counts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 140.0])  # 300 steps in 40 s: 479 steps to go take 64 s
    monkeypatch.setattr(console.time, "monotonic", lambda: next(clock))
    log = ConsoleLog(total_steps=879)
    log.start(100, progress_lines=True)
    assert log.line(RECORD) == ("step 400/879 | loss 0.5321 | NE 0.8712 | AUC 0.7468 | "
                                "98,765 ex/s | sync gap 11.3 | ETA 0:01:04")


def test_without_a_known_total_or_metrics_the_line_says_what_it_knows() -> None:
    log = ConsoleLog(total_steps=None)
    log.start(0, progress_lines=True)
    assert log.line({"step": 10, "loss": 0.7}) == "step 10 | loss 0.7000"


def test_events_print_and_progress_waits_for_the_bar() -> None:
    log = ConsoleLog(total_steps=100)
    log.start(0, progress_lines=False)  # a terminal progress bar shows progress
    assert log.line(RECORD) is None
    assert log.line({"step": 300, "eval_auc": 0.76234, "eval_ne": 0.83871, "eval_logloss": 0.5,
                     "eval_calibration": 1.0512, "eval_examples": 100021.0}) == (
        "eval after step 300: AUC 0.7623, NE 0.8387, calibration 1.051, 100,021 examples")
    assert log.line({"step": 20, "checkpoint": "/ck/step_00000020"}) == (
        "step 20: checkpoint /ck/step_00000020")
    assert log.line({"summary": True, "step": 100, "examples_per_s": 1.0}) is None


class _Rows:
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def num_rows(self, split: str) -> int:
        assert split == "train"
        return self.rows


def test_planned_steps_from_the_budget_and_the_data() -> None:
    # MovieLens' 900,189 training rows at 512 x 2 ranks: 879 steps a pass
    assert planned_steps(None, 1, _Rows(900_189), 512, 2) == 879  # type: ignore[arg-type]
    assert planned_steps(None, 3, _Rows(900_189), 512, 2) == 3 * 879  # type: ignore[arg-type]
    assert planned_steps(500, 1, _Rows(900_189), 512, 2) == 500  # type: ignore[arg-type]
    assert planned_steps(5000, 1, _Rows(900_189), 512, 2) == 879  # type: ignore[arg-type]
    assert planned_steps(40, 1, object(), 512, 2) == 40  # type: ignore[arg-type]
    assert planned_steps(None, 1, object(), 512, 2) is None  # type: ignore[arg-type]


def test_locations_name_the_resumed_range_and_the_newest_checkpoint() -> None:
    history = [{"step": 300, "resumed_from": "ck/step_00000300"}, RECORD,
               {"step": 600, "checkpoint": "ck/step_00000600"},
               {"step": 879, "checkpoint": "ck/step_00000879"}]
    assert locations("runs/a", history, 879, {"TORCHX_JOB_ID": "slurm://torchx/4242"}) == {
        "steps": "301..879 (this process; resumed from ck/step_00000300)",
        "output_dir": "runs/a",
        "metrics": "runs/a/metrics.jsonl",
        "checkpoint": "ck/step_00000879",
        "logs": "torchx log slurm://torchx/4242",
    }
    assert locations(None, [RECORD], 400, {}) == {}
    assert locations(None, history[:2], 400, {})["checkpoint"] == "ck/step_00000300"


@pytest.mark.parametrize(("environ", "expected"), [
    ({LOG_DIR_ENV: "runs/torchx/torchx/train-x1/train/0",
      "TORCHX_JOB_ID": "local_cwd://torchx/train-x1"},
     "runs/torchx/torchx/train-x1/train/0 (stdout.log, stderr.log)"),
    # torchx log reaches a local_cwd job only from the torchx run that started it
    ({"TORCHX_JOB_ID": "local_cwd://torchx/train-x1"}, None),
    ({"TORCHX_JOB_ID": "slurm://torchx/4242"}, "torchx log slurm://torchx/4242"),
    ({"TORCHX_JOB_ID": "kubernetes://torchx/train-x1"},
     "torchx log kubernetes://torchx/<namespace>:train-x1"),
    ({"TORCHX_JOB_ID": "kubernetes://torchx/ml:train-x1"},
     "torchx log kubernetes://torchx/ml:train-x1"),
    ({}, None),  # not started by torchx
])
def test_logs_name_the_folder_or_the_torchx_log_command(environ: dict[str, str],
                                                        expected: str | None) -> None:
    assert logs(environ) == expected
