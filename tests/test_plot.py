"""The plot command draws real runs' records and names the file and line of a bad record."""

from __future__ import annotations

import json
from pathlib import Path

from shadowsync.pipelines.plot import main


def _write(path: Path, records: list[dict]) -> None:
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_plots_two_runs_and_rejects_bad_records(tmp_path: Path, capsys) -> None:
    for name, ne in [("a", 0.9), ("b", 0.8)]:
        _write(tmp_path / name, [
            {"step": 100, "loss": 0.6, "ne": ne, "auc": 0.7, "examples_per_s": 1e4},
            {"step": 200, "loss": 0.5, "ne": ne - 0.05, "auc": 0.75, "examples_per_s": 1.1e4},
            {"step": 200, "eval_ne": ne - 0.02, "eval_auc": 0.74},
            {"summary": True, "step": 200, "eval_ne": ne - 0.02, "eval_auc": 0.74,
             "examples_per_s": 1.05e4},
        ])
    out = tmp_path / "cmp.png"
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n{"step": \n')
    assert main([str(bad), "-o", str(tmp_path / "x.png")]) == 2
    assert f"{bad}: line 2" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
