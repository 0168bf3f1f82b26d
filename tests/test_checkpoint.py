"""Checkpoint and resume: an interrupted 2-rank run ends exactly where an uninterrupted one does
(``none``, fixed-rate); in shadow mode, resume restores exactly what the checkpoint holds;
incomplete checkpoints are never picked."""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import logging
import math
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import ShardedTensor

from shadowsync.datasets import build_dataset
from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.config import dump_config, load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.evaluate import evaluate_checkpoint
from shadowsync.pipelines.train import Trainer, init_distributed
from shadowsync.sync.wrapper import dense_parameters
from shadowsync.testing import run_ranks
from tests.test_train import SMALL


def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    out = {f"dense.{n}": p.detach().clone() for n, p in dense_parameters(trainer.dmp).items()}
    for name, value in trainer.dmp.state_dict().items():
        if isinstance(value, ShardedTensor):
            for i, shard in enumerate(value.local_shards()):
                out[f"{name}.{i}"] = shard.tensor.detach().clone()
    return out


@dataclass
class World:
    root: Path
    results: dict[str, list[dict[str, Any]]]  # by check, then by rank


def _every_check(rank: int, world_size: int, root: str) -> dict[str, Any]:
    """Every 2-rank check of this module, one after another in one spawned world: starting
    one costs each rank seconds of imports. Each check has its own folder under ``root``;
    the corruption matrix runs last (it leaves a log handler on ``shadowsync``)."""
    out = {str(algorithm): _run(rank, world_size, f"{root}/resume{i}", algorithm)
           for i, algorithm in enumerate(RESUMED)}
    out["shadow"] = _shadow_resume(rank, world_size, f"{root}/shadow")
    out["corruption"] = _corruption_matrix(rank, world_size, f"{root}/corruption")
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("ckpt")
    by_rank = run_ranks(functools.partial(_every_check, root=str(root)), timeout_s=280)
    return World(root, {check: [r[check] for r in by_rank] for check in by_rank[0]})


def _run(rank: int, world_size: int, root: str, algorithm: list[str]) -> dict[str, Any]:
    env = init_distributed(60)
    common = SMALL + algorithm + ["checkpoint.every_steps=24", "train.log_every=12"]

    def trainer(steps: int, ckpt_dir: str) -> Trainer:
        cfg = load_config("synthetic", common + [f"train.steps={steps}",
                                                 f"checkpoint.dir={ckpt_dir}"])
        return Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name, **cfg.data.options))

    straight = trainer(48, f"{root}/straight")
    assert not straight.maybe_resume()  # nothing to resume from yet
    full = straight.train()
    interrupted = trainer(24, f"{root}/interrupted")
    interrupted.train()
    _write_old_layout(f"{root}/interrupted", f"{root}/legacy", rank)
    legacy = trainer(48, f"{root}/legacy")
    assert legacy.maybe_resume()
    at_legacy_resume = _state(legacy)
    after_legacy = legacy.train()
    resumed = trainer(48, f"{root}/interrupted")
    assert resumed.maybe_resume()
    assert resumed.step == 24
    at_resume = _state(resumed)
    after = resumed.train()
    cfg = load_config("synthetic", common + [f"checkpoint.dir={root}/straight"])
    evaluated = evaluate_checkpoint(cfg, checkpoint.resolve(f"{root}/straight"), env,
                                    build_dataset(cfg.data.name, **cfg.data.options))
    return {"evaluated": evaluated, "full": full, "after": after, "straight": _state(straight),
            "resumed": _state(resumed), "saved": _state(interrupted), "at_resume": at_resume,
            "at_legacy_resume": at_legacy_resume, "after_legacy": after_legacy}


def _write_old_layout(root: str, copy_to: str, rank: int) -> None:
    """A copy of ``root``'s checkpoints whose rank files use the layout of the versions before
    each part had its own key (flat: the position's keys, ``rng``, ``last_eval``; the
    synchronizer's single ``strategy``), their digests in the marker made anew."""
    if rank == 0:
        shutil.copytree(root, copy_to)
    dist.barrier()
    step = Path(copy_to) / "step_00000024"
    path = step / f"rank_{rank:05d}.pt"
    new = torch.load(path, weights_only=True)
    sync = dict(new["sync"])
    if "strategies" in sync:
        (strategy,) = sync.pop("strategies").values()
        sync["strategy"] = strategy
    old = {**new["position"], "dense": new["dense"], "optimizers": new["optimizers"],
           "sync": sync, "rng": new["rng"]["cpu"], "last_eval": new["evaluation"]["last_step"]}
    torch.save(old, path)
    dist.barrier()
    if rank == 0:
        marker = json.loads((step / checkpoint.MARKER).read_text())
        for name in (f"rank_{r:05d}.pt" for r in range(dist.get_world_size())):
            data = (step / name).read_bytes()
            marker["files"][name] = {"bytes": len(data),
                                     "sha256": hashlib.sha256(data).hexdigest()}
        (step / checkpoint.MARKER).write_text(json.dumps(marker))
    dist.barrier()


RESUMED = [["sync.strategy.name=bmuf", "sync.schedule.mode=fixed_rate", "sync.schedule.period=5"],
           ["sync.strategy.name=none"]]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", RESUMED)
def test_resume_equals_uninterrupted_run(world: World, algorithm: list[str]) -> None:
    root, results = world.root / f"resume{RESUMED.index(algorithm)}", world.results[str(algorithm)]
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
            # A checkpoint in the old layout restores the same state, and the run continues
            # exactly as from the new one.
            torch.testing.assert_close(r["at_legacy_resume"][name], value, rtol=0, atol=0,
                                       msg=name)
        for key in ("eval_auc", "eval_ne", "step"):
            assert r["after_legacy"][key] == r["after"][key], key
        assert any(not torch.equal(r["resumed"][k], v) for k, v in r["at_resume"].items())
    if algorithm == ["sync.strategy.name=none"]:
        # Each rank got its own replica back, not rank 0's copy.
        dense = [k for k in results[0]["saved"] if k.startswith("dense.")]
        assert any(not torch.equal(results[0]["saved"][k], results[1]["saved"][k])
                   for k in dense)
    kept = sorted(p.name for p in (root / "straight").iterdir())
    assert kept == ["step_00000024", "step_00000048"]


def _assert_equal(a: Any, b: Any, what: str) -> None:
    """Bit-equal nested containers of tensors and numbers."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), what
        for k in a:
            _assert_equal(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(x, y, f"{what}[{i}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=f"{what}: {a} vs {b}")
    else:
        assert a == b, (what, a, b)


def _destroyed(group: dist.ProcessGroup) -> bool:
    try:
        dist.get_rank(group)
    except (RuntimeError, ValueError):
        return True
    return False


def _shadow_resume(rank: int, world_size: int, root: str) -> dict[str, Any]:
    env = init_distributed(60)
    common = SMALL + ["sync.strategy.name=bmuf", "sync.schedule.mode=shadow",
                      "checkpoint.every_steps=24", f"checkpoint.dir={root}"]

    def trainer(steps: int) -> Trainer:
        cfg = load_config("synthetic", common + [f"train.steps={steps}"])
        return Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name, **cfg.data.options))

    first = trainer(24)
    first.train()
    saved = _state(first)  # embedding shards as saved (nothing trained after the checkpoint)
    resumed = trainer(48)
    restored: dict[str, Any] = {}
    start = resumed.wrapper.resume

    def resume() -> None:  # the synchronizer is stopped here: its state can be read
        restored["sync"] = copy.deepcopy(resumed.wrapper.state_dict())
        start()

    resumed.wrapper.resume = resume  # type: ignore[method-assign]
    assert resumed.maybe_resume()
    resumed.wrapper.resume = start  # type: ignore[method-assign]
    at_resume = _state(resumed)
    position = (resumed.step, resumed.position.epoch, resumed.position.epoch_step)
    next_batch = next(next(resumed._segments()))
    stream = resumed.dataset.train_batches(resumed.cfg.train.batch_size, rank, world_size, 0)
    expected_batch = next(itertools.islice(stream, 24, None))
    optimizers = copy.deepcopy({name: opt.state_dict() for name, opt
                                in resumed.optimizer.optimizers if name != "sparse"})
    rng = torch.get_rng_state()
    with resumed:  # closes: the groups it made are destroyed
        summary = resumed.train()
        groups = [resumed._control.group, *resumed.wrapper._groups]  # type: ignore[union-attr]
    return {"closed": [_destroyed(g) for g in groups], "saved": saved, "at_resume": at_resume,
            "position": position, "rng": rng,
            "sync": restored["sync"], "optimizers": optimizers, "summary": summary,
            "next_batch": (next_batch.dense_features, next_batch.labels),
            "expected_batch": (expected_batch.dense_features, expected_batch.labels),
            "end": _state(resumed)}


@pytest.mark.slow
def test_shadow_resume_restores_the_checkpoint_exactly(world: World) -> None:
    """Shadow rounds run when threads get to them, so no two shadow runs, interrupted or not,
    are bit-identical. What resume promises there, on 2 ranks: the checkpoint holds one model
    (the final sync ran before the save), and a resumed run starts from exactly that model on
    every rank, the same data position, the same strategy state (BMUF's global model and
    momentum, the counters), each rank's dense optimizer state and RNG, and the embedding
    tables as saved; then it trains on and ends with identical replicas."""
    results = world.results["shadow"]
    ckpt = world.root / "shadow" / "step_00000024"
    files = [torch.load(ckpt / f"rank_{r:05d}.pt", weights_only=True) for r in (0, 1)]
    _assert_equal(files[0]["dense"], files[1]["dense"], "the checkpoint's consensus")
    in_dcp = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    assert not {f"model.{k}" for k in files[0]["dense"]} & set(in_dcp)  # each tensor once
    assert any(k.startswith("model.") for k in in_dcp)  # the tables are there
    _assert_equal(files[0]["sync"]["strategies"], files[1]["sync"]["strategies"], "strategies")
    assert files[0]["sync"]["counters"]["rounds"] > 0, files[0]["sync"]  # rounds ran
    for rank, (r, local) in enumerate(zip(results, files, strict=True)):
        for name, value in local["dense"].items():  # the consensus, on every rank
            torch.testing.assert_close(r["at_resume"][f"dense.{name}"], value, rtol=0, atol=0,
                                       msg=f"rank {rank}: {name}")
        for name, value in r["saved"].items():
            if not name.startswith("dense."):  # the embedding shards as saved
                torch.testing.assert_close(r["at_resume"][name], value, rtol=0, atol=0,
                                           msg=f"rank {rank}: {name}")
        position = local["position"]
        assert r["position"] == (24, 0, 24) == (position["step"], position["epoch"],
                                                position["epoch_step"])
        _assert_equal(r["next_batch"], r["expected_batch"], f"rank {rank}: batch 25")
        _assert_equal(r["sync"], local["sync"], f"rank {rank}: synchronizer state")
        _assert_equal(r["optimizers"], local["optimizers"], f"rank {rank}: dense optimizer")
        _assert_equal(r["rng"], local["rng"]["cpu"], f"rank {rank}: RNG")
        assert r["closed"] == [True, True], r["closed"]  # control and sync groups destroyed
        summary = r["summary"]
        assert summary["step"] == 48 and summary["sync_steps"] == 48, summary
        assert summary["sync_rounds"] >= local["sync"]["counters"]["rounds"], summary
        assert math.isfinite(summary["eval_ne"]), summary
    dense = [k for k in results[0]["end"] if k.startswith("dense.")]
    for name in dense:  # trained on, and ended as one model again
        torch.testing.assert_close(results[0]["end"][name], results[1]["end"][name], rtol=0,
                                   atol=0, msg=name)
    assert any(not torch.equal(results[0]["end"][k], results[0]["at_resume"][k]) for k in dense)


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
    assert checkpoint.incomplete(root) == [str(tmp_path / "step_00000030")]


def test_stored_config_reads_any_fsspec_path_with_overrides() -> None:
    """The config a checkpoint holds is read where its weights are (here fsspec's in-memory
    file system, no local path), overrides applied as to a preset; none stored: None."""
    fs = fsspec.filesystem("memory")
    ckpt = checkpoint.CheckpointInfo("memory://run/step_00000012", 12)
    assert checkpoint.stored_config(ckpt) is None
    cfg = load_config("synthetic", ["model.name=deepfm", "train.steps=12"])
    fs.pipe(f"/run/step_00000012/{checkpoint.CONFIG}", dump_config(cfg).encode())
    try:
        assert checkpoint.stored_config(ckpt) == cfg
        again = checkpoint.stored_config(ckpt, ["eval.batch_size=7", "model.name=dcn"])
        assert again is not None and again.eval.batch_size == 7 and again.model.name == "dcn"
        assert again.train == cfg.train
    finally:
        fs.rm("/run", recursive=True)


def test_interrupted_writes_go_at_the_next_checkpoint(tmp_path: Path) -> None:
    for step, complete in [(10, True), (20, False), (30, True), (40, False)]:
        d = tmp_path / f"step_{step:08d}"
        d.mkdir()
        if complete:
            (d / checkpoint.MARKER).write_text("{}")
    checkpoint._prune(str(tmp_path), None, newest=30)  # rank 0, after writing step 30
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_00000010", "step_00000030", "step_00000040"]  # 40: written again, clean, later
    checkpoint._prune(str(tmp_path), 1, newest=30)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000030", "step_00000040"]


# ------------------------------------------------------------------------------ corruption
_KINDS = ("truncate", "garbage_start", "garbage_middle", "garbage_end", "delete")


def _corrupt(path: Path, kind: str) -> None:
    """Damages one file the way disks, copies and people do; the bytes always change."""
    if kind == "delete":
        path.unlink()
        return
    data = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(data[: len(data) // 2])
        return
    n = max(1, min(4096, len(data) // 4))
    at = {"garbage_start": 0, "garbage_middle": (len(data) - n) // 2,
          "garbage_end": len(data) - n}[kind]
    rng = random.Random(f"{path.name}/{kind}")
    junk = bytes(b ^ rng.randrange(1, 256) for b in data[at:at + n])
    path.write_bytes(data[:at] + junk + data[at + n:])


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _corruption_matrix(rank: int, world_size: int, root: str) -> dict[str, Any]:
    env = init_distributed(60)
    pristine = Path(root) / "pristine"
    cfg = load_config("synthetic", SMALL + ["train.steps=8", "checkpoint.every_steps=4",
                                            "checkpoint.keep=5", f"checkpoint.dir={pristine}"])
    trainer = Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name, **cfg.data.options))
    trainer.train()  # checkpoints of steps 4 and 8
    trainer.restore(checkpoint.latest(str(pristine), before=8))  # type: ignore[arg-type]
    reference = _state(trainer)
    lines = _Lines()
    logging.getLogger("shadowsync").addHandler(lines)
    names = sorted(p.name for p in (pristine / "step_00000008").iterdir())
    cases = [(name, kind, False) for name in names for kind in _KINDS]
    # Markers written without digests (older versions): DCP's own errors must fall back too.
    cases += [("__1_0.distcp", "garbage_start", True), (".metadata", "truncate", True)]
    outcomes: dict[str, Any] = {"names": names}
    for i, (name, kind, legacy) in enumerate(cases):
        case = Path(root) / f"case{i}"
        if rank == 0:
            shutil.copytree(pristine, case)
            newest = case / "step_00000008"
            if legacy:
                marker = json.loads((newest / checkpoint.MARKER).read_text())
                del marker["files"]
                (newest / checkpoint.MARKER).write_text(json.dumps(marker))
            _corrupt(newest / name, kind)
        dist.barrier()
        trainer.cfg.checkpoint.dir = str(case)
        trainer.position.load_state_dict({"step": -1, "epoch": 0, "epoch_step": 0})
        lines.lines.clear()
        resumed = trainer.maybe_resume()
        state = _state(trainer)
        outcomes[f"{name}/{kind}/{legacy}"] = {
            "resumed": resumed, "step": trainer.step, "log": list(lines.lines),
            "same": all(torch.equal(state[k], v) for k, v in reference.items()),
            "left": sorted(p.name for p in case.iterdir()),
        }
        dist.barrier()
    both = Path(root) / "both"  # every checkpoint corrupt: a failure naming the newest
    if rank == 0:
        shutil.copytree(pristine, both)
        for step in (4, 8):
            _corrupt(both / f"step_{step:08d}" / "rank_00001.pt", "garbage_middle")
    dist.barrier()
    trainer.cfg.checkpoint.dir = str(both)
    for launch in ("both", "relaunch"):  # the relaunch finds only the folders set aside
        try:
            trainer.maybe_resume()
            outcomes[launch] = "resumed"
        except checkpoint.CheckpointUnreadable as e:
            outcomes[launch] = str(e)
        dist.barrier()
    lines.lines.clear()
    trainer.cfg.checkpoint.resume = False
    outcomes["fresh"] = {"resumed": trainer.maybe_resume(), "log": list(lines.lines)}
    return outcomes


@pytest.mark.slow
def test_every_corruption_of_every_file_falls_back(world: World) -> None:
    """Each file of the newest checkpoint (DCP's ``.metadata`` and shard files, the per-rank
    files, the marker) truncated, overwritten at its start, middle or end, or deleted: both
    ranks agree it does not load, name the file, set it aside and resume from the previous
    checkpoint with exactly its state; none loads silently. With every checkpoint corrupt,
    resuming fails naming the newest, and so does every later launch, naming the folders set
    aside, until ``checkpoint.resume=false``."""
    results = world.results["corruption"]
    names = results[0]["names"]
    assert {".metadata", "rank_00000.pt", "rank_00001.pt", checkpoint.MARKER} <= set(names)
    assert sum(n.endswith(".distcp") for n in names) == 2, names
    cases = [k for k in results[0] if "/" in k]
    assert len(cases) == len(names) * len(_KINDS) + 2
    for rank, r in enumerate(results):
        for case in cases:
            out = r[case]
            name, kind, legacy = case.split("/")
            what = f"rank {rank}, {case}: {out}"
            assert out["resumed"] and out["step"] == 4 and out["same"], what
            if rank:
                continue
            log = "\n".join(out["log"])
            assert "weights_only" not in log, what
            if name == checkpoint.MARKER and kind == "delete":  # an interrupted write
                assert "step_00000008: no COMPLETE marker" in log, what
                assert "step_00000008" in out["left"], what
                continue
            assert "step_00000008 does not load" in log, what
            assert re.search(r"renamed to \S+step_00000008\.corrupt-\d+", log), what
            assert not any(n == "step_00000008" for n in out["left"]), what
            if legacy == "False":
                assert f"step_00000008/{name}: " in log, what
        assert "no complete checkpoint" in r["both"] and "step_00000008" in r["both"], r["both"]
        # Never a silent fresh start: the same launch again fails naming what was set aside,
        # until checkpoint.resume=false starts from step 0 on purpose, with a warning.
        relaunch = r["relaunch"]
        assert re.search(r"set aside as unreadable: \S+step_00000004\.corrupt-\d+, "
                         r"\S+step_00000008\.corrupt-\d+", relaunch), relaunch
        assert "checkpoint.resume=false" in relaunch and "checkpoint.resume=false" in r["both"]
        assert r["fresh"]["resumed"] is False, r["fresh"]
    warning = "\n".join(results[0]["fresh"]["log"])
    assert "starting from step 0 (checkpoint.resume=false)" in warning, warning
    assert "step_00000004.corrupt-" in warning and "step_00000008.corrupt-" in warning, warning
