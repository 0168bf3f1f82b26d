"""The plot command: real runs' records on a step, examples or wall-time axis, short legend
names, non-finite runs marked, and errors that name the file, line or run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import pytest

from shadowsync.pipelines import plot
from shadowsync.pipelines.plot import main, short_names, x_values

matplotlib.use("Agg")


def _run(ne: float, batch: int, t0: float = 1.7e9) -> list[dict[str, Any]]:
    """Two training records, an eval and the summary, as the trainer writes them."""
    return [
        {"step": 100, "loss": 0.6, "ne": ne, "auc": 0.7, "examples_per_s": 1e4,
         "examples": 100.0 * batch * 2, "sync_gap_mean": 9.5, "time": t0 + 10},
        {"step": 200, "loss": 0.5, "ne": ne - 0.05, "auc": 0.75, "examples_per_s": 1.1e4,
         "examples": 200.0 * batch * 2, "sync_gap_mean": 10.5, "time": t0 + 20},
        {"step": 200, "eval_ne": ne - 0.02, "eval_auc": 0.74, "time": t0 + 21},
        {"summary": True, "step": 200, "eval_ne": ne - 0.02, "eval_auc": 0.74,
         "examples_per_s": 1.05e4, "time": t0 + 22},
    ]


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


class _Recorder:
    """Stands in for ``plot_runs`` after the CLI parsed its arguments."""

    def __call__(self, runs: dict[str, Any], out: str, x: str) -> None:
        self.runs, self.out, self.x = runs, out, x


@pytest.mark.slow
def test_plots_runs_and_rejects_bad_records(tmp_path: Path, capsys) -> None:
    a = _write(tmp_path / "runs" / "a", _run(0.9, 512))
    b = _write(tmp_path / "runs" / "b", _run(0.8, 4096))
    for axis in ("step", "examples", "time"):
        out = tmp_path / f"cmp_{axis}.png"
        assert main([str(a), str(b / "metrics.jsonl"), "-o", str(out), "--x", axis]) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n{"step": \n')
    assert main([str(bad), "-o", str(tmp_path / "x.png")]) == 2
    assert f"{bad}: line 2" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_legend_names_are_short_or_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert short_names(["runs/x/shadow", "runs/y/shadow/metrics.jsonl", "runs/ddp"]) == [
        "x/shadow", "y/shadow", "ddp"]
    assert short_names(["/a/b", "/c/d"]) == ["b", "d"]
    a = _write(tmp_path / "a", _run(0.9, 512))
    recorder = _Recorder()
    monkeypatch.setattr(plot, "plot_runs", recorder)
    assert main([f"b512={a}", str(a / "metrics.jsonl"), "--x", "examples"]) == 0
    assert list(recorder.runs) == ["b512", "a"] and recorder.x == "examples"
    assert main([f"same={a}", f"same={a}"]) == 2


def test_examples_axis_puts_batch_sizes_on_one_scale() -> None:
    small, large = _run(0.9, 512), _run(0.8, 4096)
    assert x_values(small, "examples", "s") == {100: 102_400.0, 200: 204_800.0}
    assert x_values(large, "examples", "l") == {100: 819_200.0, 200: 1_638_400.0}
    # TorchRec's count restarts after a resume; the per-step rate does not
    resumed = [*small, {"step": 300, "loss": 0.4, "examples": 100.0 * 1024, "time": 1.7e9 + 99},
               {"step": 400, "loss": 0.4, "examples": 200.0 * 1024, "time": 1.7e9 + 109}]
    assert x_values(resumed, "examples", "r")[400] == 400 * 1024
    assert x_values(small, "time", "s") == {100: 0.0, 200: 10.0}
    with pytest.raises(ValueError, match="old: --x time needs the records' time stamps"):
        x_values([{k: v for k, v in r.items() if k != "time"} for r in small], "time", "old")
    with pytest.raises(ValueError, match="evals: --x examples needs training records"):
        x_values([small[2]], "examples", "evals")


def test_non_finite_runs_are_marked_not_dropped(tmp_path: Path) -> None:
    records = _run(0.9, 512)
    records[1]["ne"] = float("nan")  # json writes NaN, and reads it back
    broken = _write(tmp_path / "broken", records)
    assert plot.first_non_finite(plot.read_run(broken)) == 200
    assert plot.first_non_finite(_run(0.9, 512)) is None
    import matplotlib.pyplot as plt

    drawn: dict[str, Any] = {}

    def keep(fig: Any, *args: Any, **kwargs: Any) -> None:
        drawn["axes"] = fig.axes

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Figure, "savefig", keep)
        mp.setattr(plt, "close", lambda fig: None)
        plot.plot_runs({"ok": _run(0.8, 512), "broken": plot.read_run(broken)}, "unused.png")
    ne_panel, _, _, gap_panel = drawn["axes"]
    labels = ne_panel.get_legend_handles_labels()[1]
    assert labels == ["ok", "broken (non-finite from step 200)"]
    assert [line.get_xdata()[0] for line in ne_panel.lines if line.get_linestyle() == ":"] == [
        200.0]
    assert gap_panel.get_title().startswith("sync gap")
    assert [list(line.get_ydata()) for line in gap_panel.lines][:1] == [[9.5, 10.5]]
