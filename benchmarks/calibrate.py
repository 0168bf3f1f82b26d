"""Measure the scaling model's constants (:mod:`.scaling_model`) here, with the real code.

    python -m shadowsync.benchmarks.calibrate \\
        --out benchmarks/results/scaling_model/calibration.json

1. Gloo allreduce time against size (4 KB .. 64 MB) on 2 ranks over loopback, fitted to
   ``a + S / beta`` (weighted to relative error); ``a = 2 alpha`` (a 2-rank ring).
2. Per preset, ``--repeats`` times each: ``bench_sync.py`` under torchrun on 1 rank and on 2
   ranks, every arm of the model (after a warm-up arm: the first arm of a process pays
   one-time costs), eval cut to ``eval.max_batches=2`` (only speed is needed). The medians are
   the measured points; N = 1 gives one rank's step alone.
3. Per preset: dense bytes from the runners' ``bytes_reduced`` per allreduce, sparse all-to-all
   bytes from the data spec, and one round's local work (snapshot copy, the strategy's real
   ``reduce_input``/``delta``, apply) timed on one thread for each strategy.

The machine is shared: every number is a median over repeats, and the raw runs are kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torchrec

import shadowsync
from shadowsync.benchmarks.report import command_line, write_json
from shadowsync.benchmarks.scaling_model.model import RESULTS, STRATEGIES, arms
from shadowsync.datasets import build_dataset
from shadowsync.pipelines.config import load_config
from shadowsync.sync.strategies import make_strategy
from shadowsync.testing import run_ranks

_HERE = Path(__file__).resolve().parent

SIZES = [4096 * 4**i for i in range(8)]  # 4 KB .. 64 MB
FLAGS_BYTES = 8  # the runner's [stop, abort] floats ride in every allreduce


def _allreduce_sweep(rank: int, world_size: int) -> list[tuple[int, float]]:
    """Median seconds of one allreduce per size; ranks aligned by a barrier before each."""
    out = []
    for size in SIZES:
        t = torch.zeros(size // 4)
        reps = max(15, min(200, 2**26 // size))
        times = []
        for i in range(reps + 2):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            if i >= 2:
                times.append(time.perf_counter() - start)
        out.append((size, statistics.median(times)))
    return out


def fit_allreduce(points: list[tuple[int, float]]) -> dict[str, Any]:
    """``t = a + S / beta`` minimizing relative error; ring at N = 2 is ``S/beta + 2 alpha``."""
    size = np.array([p[0] for p in points], dtype=float)
    secs = np.array([p[1] for p in points])
    (a, inv_beta), *_ = np.linalg.lstsq(np.stack([1 / secs, size / secs], 1),
                                        np.ones_like(secs), rcond=None)
    return {"latency_s": float(a) / 2, "bandwidth_Bps": 1 / float(inv_beta),
            "points": [[int(s), float(t)] for s, t in points],
            "fit_relative_error": [float((a + s * inv_beta) / t - 1) for s, t in points]}


def bench(preset: str, nproc: int, steps: int) -> list[dict[str, Any]]:
    """One ``bench_sync.py`` run under torchrun; its JSON rows (warm-up arm dropped)."""
    specs = ["warmup: sync.strategy.name=none",
             *(f"{a.name}: {a.overrides}" for a in arms())]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", "-m", "shadowsync.benchmarks.bench_sync",
               "--config", preset,
               "--steps", str(steps), "--json", str(out),
               *(x for a in specs for x in ("--arm", a)), "eval.max_batches=2"]
        # One intra-op thread on 1 rank too (torchrun sets it only for several): N = 1 must be
        # one trainer's share of the machine, as each rank has at N = 2.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed:\n{done.stdout[-3000:]}"
                               f"{done.stderr[-6000:]}")
        return [r for r in json.loads(out.read_text()) if r["arm"] != "warmup"]


def round_local_s(preset: str, dense_bytes: int, reps: int = 300) -> dict[str, float]:
    """Median seconds of one round's local work per strategy, as the runner does it."""
    torch.set_num_threads(1)  # as each torchrun rank runs
    live = torch.randn(dense_bytes // 4)
    out = {}
    for name in STRATEGIES:
        strategy = make_strategy(load_config(preset, [f"sync.strategy.name={name}"]).sync)
        strategy.init(live.clone(), world_size=2)
        snapshot, comm = torch.empty_like(live), torch.empty(live.numel() + 2)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            snapshot.copy_(live)
            comm[: live.numel()].copy_(strategy.reduce_input(snapshot))
            comm[: live.numel()].mul_(2)  # stands in for the other rank's contribution
            live.add_(strategy.delta(snapshot, comm[: live.numel()]))
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times[reps // 10:])
    return out


def _dense_bytes(rows: list[dict[str, Any]]) -> int:
    """Payload bytes per allreduce (final consensus counted), flags removed; checked per arm."""
    sizes = {round(r["sync_bytes_reduced"] / (r["sync_rounds"] + 1)) - FLAGS_BYTES
             for r in rows if r.get("sync_rounds")}
    if len(sizes) != 1:
        raise RuntimeError(f"arms disagree on the dense size: {sorted(sizes)}")
    return sizes.pop()


def summarize(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Median examples/s and sync gap per arm over repeated runs, with the raw values."""
    by_arm: dict[str, dict[str, Any]] = {}
    for run in runs:
        for r in run:
            entry = by_arm.setdefault(r["arm"], {"runs_examples_per_s": [], "runs_sync_gap": []})
            entry["runs_examples_per_s"].append(r["examples_per_s"])
            entry["runs_sync_gap"].append(r.get("sync_gap_mean", float("nan")))
    for entry in by_arm.values():
        entry["examples_per_s"] = statistics.median(entry["runs_examples_per_s"])
        gaps = [g for g in entry["runs_sync_gap"] if g == g]
        entry["sync_gap_mean"] = statistics.median(gaps) if gaps else float("nan")
    return by_arm


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                 platform.processor())
    return {"description": f"{model}, {os.cpu_count()} cores (shared with other jobs), "
                           f"torch {torch.__version__}, torchrec {torchrec.__version__}, gloo "
                           "over loopback",
            "platform": platform.platform(), "python": platform.python_version()}


def code_version() -> dict[str, Any]:
    root = Path(shadowsync.__file__).resolve().parent
    if root != _HERE.parent:
        raise SystemExit(f"`import shadowsync` gives {root}, not this checkout ({_HERE.parent}): "
                         "bench_sync.py would measure other code; fix PYTHONPATH")
    git = ["git", "-C", str(root)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    return {"path": str(root), "commit": commit.stdout.strip() or None,
            "modified_files": dirty.stdout.split("\n")[:-1] if commit.returncode == 0 else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "calibration.json")
    parser.add_argument("--presets", nargs="+", default=["movielens_1m", "synthetic"])
    parser.add_argument("--steps", type=int, default=600, help="training steps per arm")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    result: dict[str, Any] = {
        "note": "Measured constants for benchmarks/scaling_model (a model built on them).",
        "date": started.isoformat(timespec="seconds"),
        "command": command_line("shadowsync.benchmarks.calibrate"),
        "machine": machine(), "code": code_version(), "load_average_start": os.getloadavg(),
    }
    print("allreduce sweep on 2 ranks ...", flush=True)
    result["allreduce_fit"] = fit_allreduce(
        run_ranks(_allreduce_sweep, world_size=2, timeout_s=600, pg_timeout_s=120)[0])
    runs: dict[tuple[str, int], list[list[dict[str, Any]]]] = {}
    for rep in range(args.repeats):  # interleaved, so a burst of load spreads over presets
        for preset in args.presets:
            for nproc in (1, 2):
                print(f"repeat {rep + 1}/{args.repeats}: {preset} on {nproc} rank(s) ...",
                      flush=True)
                runs.setdefault((preset, nproc), []).append(bench(preset, nproc, args.steps))
    result["presets"] = {}
    for preset in args.presets:
        cfg = load_config(preset)
        spec = build_dataset(cfg.data.name, **cfg.data.options).spec
        all_rows = [r for n in (1, 2) for run in runs[preset, n] for r in run]
        dense = _dense_bytes(all_rows)
        result["presets"][preset] = {
            "batch_size": cfg.train.batch_size,
            "dense_bytes": dense,
            "a2a_bytes": cfg.train.batch_size * len(spec.sparse_names)
                         * cfg.model.embedding_dim * 4,
            "steps_per_arm": args.steps,
            "round_local_s": round_local_s(preset, dense),
            "measured": {str(n): summarize(runs[preset, n]) for n in (1, 2)},
        }
    result["load_average_end"] = os.getloadavg()
    result["elapsed_s"] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result, newline=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
