"""Checkpoint and resume: an interrupted 2-rank run ends exactly where an uninterrupted one does;
incomplete checkpoints are never picked."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

from shadowsync.datasets import build_dataset
from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.evaluate import evaluate_checkpoint, find_checkpoint
from shadowsync.pipelines.train import Trainer, init_distributed
from shadowsync.sync.wrapper import dense_parameters
from tests._dist import run_ranks
from tests.test_train import SMALL


def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    out = {f"dense.{n}": p.detach().clone() for n, p in dense_parameters(trainer.dmp).items()}
    for name, value in trainer.dmp.state_dict().items():
        if isinstance(value, ShardedTensor):
            for i, shard in enumerate(value.local_shards()):
                out[f"{name}.{i}"] = shard.tensor.detach().clone()
    return out


def _run(rank: int, world_size: int, root: str, algorithm: list[str]) -> dict[str, Any]:
    env = init_distributed(60)
    common = SMALL + algorithm + ["checkpoint.every_steps=24", "train.log_every=12"]

    def trainer(steps: int, ckpt_dir: str) -> Trainer:
        cfg = load_config("synthetic", common + [f"train.steps={steps}",
                                                 f"checkpoint.dir={ckpt_dir}"])
        return Trainer(cfg, env, build_dataset(cfg.data.name, **cfg.data.options))

    straight = trainer(48, f"{root}/straight")
    assert not straight.maybe_resume()  # nothing to resume from yet
    full = straight.train()
    interrupted = trainer(24, f"{root}/interrupted")
    interrupted.train()
    resumed = trainer(48, f"{root}/interrupted")
    assert resumed.maybe_resume()
    assert resumed.step == 24
    at_resume = _state(resumed)
    after = resumed.train()
    cfg = load_config("synthetic", common + [f"checkpoint.dir={root}/straight"])
    evaluated = evaluate_checkpoint(cfg, find_checkpoint(f"{root}/straight"), env,
                                    build_dataset(cfg.data.name, **cfg.data.options))
    return {"evaluated": evaluated, "full": full, "after": after, "straight": _state(straight),
            "resumed": _state(resumed), "saved": _state(interrupted), "at_resume": at_resume}


@pytest.mark.parametrize("algorithm", [
    ["sync.algorithm=bmuf", "sync.mode=fixed_rate", "sync.period=5"],
    ["sync.algorithm=none"],
])
def test_resume_equals_uninterrupted_run(tmp_path: Path, algorithm: list[str]) -> None:
    results = run_ranks(functools.partial(_run, root=str(tmp_path), algorithm=algorithm),
                        timeout_s=240)
    for r in results:
        assert r["straight"].keys() == r["resumed"].keys()
        assert any(k.endswith(".0") for k in r["straight"]), "no embedding shards compared"
        for name, value in r["straight"].items():
            torch.testing.assert_close(r["resumed"][name], value, rtol=0, atol=0, msg=name)
        for key in ("eval_auc", "eval_ne", "eval_logloss", "eval_calibration", "step"):
            assert r["after"][key] == r["full"][key], key
        # The evaluate CLI's path scores the saved model exactly as training's last eval did.
        assert r["evaluated"]["step"] == 48
        for key in ("auc", "ne", "logloss", "calibration"):
            assert r["evaluated"][key] == r["full"][f"eval_{key}"], key
        # The restore is exact, and training went on from it.
        for name, value in r["saved"].items():
            torch.testing.assert_close(r["at_resume"][name], value, rtol=0, atol=0, msg=name)
        assert any(not torch.equal(r["resumed"][k], v) for k, v in r["at_resume"].items())
    if algorithm == ["sync.algorithm=none"]:
        # Each rank got its own replica back, not rank 0's copy.
        dense = [k for k in results[0]["saved"] if k.startswith("dense.")]
        assert any(not torch.equal(results[0]["saved"][k], results[1]["saved"][k])
                   for k in dense)
    kept = sorted(p.name for p in (tmp_path / "straight").iterdir())
    assert kept == ["step_00000024", "step_00000048"]


def test_latest_ignores_incomplete_and_foreign_entries(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert checkpoint.latest(root + "/missing") is None
    for step, complete in [(10, True), (20, True), (30, False)]:
        d = tmp_path / f"step_{step:08d}"
        d.mkdir()
        (d / "rank_00000.pt").write_bytes(b"half-written")
        if complete:
            (d / checkpoint.MARKER).write_text("{}")
    (tmp_path / "notes").mkdir()
    found = checkpoint.latest(root)
    assert found is not None and found.step == 20
    assert found.path.endswith("step_00000020")
