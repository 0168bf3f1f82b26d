"""Our training job against TorchRec's own loop, side by side in one job.

Both sides get the same model, sharding plan, optimizers, seed, batch size and batches, with
TorchRec's ``DefaultDataParallelWrapper`` (DDP) or the dense part unwrapped, and both are timed
from the first batch pulled to the last step done::

    reference ddp   TorchRec's loop, DDP            <->  ours ddp   (sync.strategy.name=ddp)
    reference local TorchRec's loop, no DDP         <->  ours none  (sync.strategy.name=none)

Each run also reports the loop's own time per step (its wall time less the time inside
``TrainPipelineSparseDist.progress``, the same work on both sides). ``--interleave B`` runs each
pair in one job in blocks of ``B`` steps (``--defer K``: blocks due within ``K`` steps of a
record run after it), ``--aa`` adds an A/A pair of two TorchRec loops, ``--one-model`` runs the
reference's blocks on ours' pipeline, ``--phases`` times each labelled phase of ours,
``--ablate ARM`` turns one feature of ours off at a time (:data:`ABLATIONS`) and ``--profile
DIR`` writes traces. What each option measures, and why, is in ``docs/benchmarks.md`` (*Our
loop against TorchRec's*)::

    .venv/bin/torchrun --nproc_per_node 2 -m shadowsync.benchmarks.bench_loop \\
        --config movielens_1m --steps 800 --repeats 6 --interleave 1 --aa
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import re
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from shadowsync.benchmarks.report import markdown_table, median_spread, write_json
from shadowsync.datasets import RecDataset, build_dataset
from shadowsync.pipelines import train
from shadowsync.pipelines.build import (
    DistEnv,
    build_optimizer,
    build_sharded_model,
    init_distributed,
)
from shadowsync.pipelines.callbacks import TrainCallback
from shadowsync.pipelines.config import RunConfig, load_config
from shadowsync.sync.wrapper import LocalReplicas

PAIRS = {"ours ddp": "reference ddp", "ours none": "reference local"}
ARMS = ["reference ddp", "ours ddp", "reference local", "ours none"]
# --aa: TorchRec's loop in ours' place, against a reference built before it (A/A)
AA = {"A/A ddp": "A/A reference ddp", "A/A local": "A/A reference local"}
# --ablate: ours with one feature off, by the overrides that turn it off.
ABLATIONS: dict[str, list[str]] = {
    "all on": [],
    "records off": ["train.log_every=1000000000"],
    "control off": ["train.control_every_steps=1000000000"],
    "heartbeat off": ["train.heartbeat_s=1000000", "train.heartbeat_timeout_s=3000000"],
}


def _config(preset: str, arm: str, steps: int, overrides: list[str]) -> RunConfig:
    algorithm = "ddp" if arm.endswith("ddp") else "none"
    # as many epochs as steps: ``train.steps`` ends the run, over as many passes as it takes
    return load_config(preset, [*overrides, f"sync.strategy.name={algorithm}",
                                f"train.steps={steps}", f"train.epochs={steps}",
                                "eval.every_steps=null",
                                "checkpoint.dir=null", "logging.progress_bar=false"])


@contextlib.contextmanager
def pipeline_time() -> Iterator[list[float]]:
    """Seconds spent inside ``TrainPipelineSparseDist.progress`` on training batches while in
    the block (not our final evaluation's, which is outside the timed loop): the rest of a
    loop's time is the loop's own (what the pipeline does is the same on both sides)."""
    spent = [0.0]
    progress = TrainPipelineSparseDist.progress

    def timed(self: TrainPipelineSparseDist, batches: Iterator[Any]) -> Any:
        if not self._model.training:
            return progress(self, batches)
        began = time.perf_counter()
        try:
            return progress(self, batches)
        finally:
            spent[0] += time.perf_counter() - began

    TrainPipelineSparseDist.progress = timed
    try:
        yield spent
    finally:
        TrainPipelineSparseDist.progress = progress


class PhaseTimes(TrainCallback):
    """Wall seconds in each labelled phase of our loop (:meth:`TrainCallback.on_phase`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)

    def on_phase(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds


class _Records(TrainCallback):
    """Our training records' metrics computing in the background, and when each started (in
    calls of ours to ``progress``)."""

    def __init__(self, calls: list[int]) -> None:
        self.computing: Future[dict[str, float]] | None = None
        self.at: int | None = None
        self._calls = calls

    def on_record(self, step: int, computing: Future[dict[str, float]]) -> None:
        self.computing, self.at = computing, self._calls[0]


def ablate(arm: str, preset: str, steps: int, block: int, overrides: list[str], env: DistEnv,
           repeat: int, variants: list[str] | None = None, one_model: bool = False,
           defer: int = 0, callbacks: Sequence[TrainCallback] = ()) -> list[dict[str, Any]]:
    """``--ablate``: ours ``arm`` (``ddp`` or ``none``) against its reference in one
    :func:`interleaved` job per variant of :data:`ABLATIONS` (``variants``: all), in an order
    that turns around every other repeat. Per variant: ours' ratio to the reference, its own
    ms a step, and TorchRec's steps inside ours against inside the reference (``inside``).
    ``callbacks``: ours' trainer's, in every variant."""
    pair = (PAIRS[f"ours {arm}"], f"ours {arm}")
    names = variants or list(ABLATIONS)
    rows = []
    for name in names[::-1 if repeat % 2 else 1]:
        got = interleaved(pair, preset, steps, block, [*overrides, *ABLATIONS[name]], env,
                          one_model=one_model, defer=defer, callbacks=callbacks)
        rows.append(ablation_row(name, repeat, got[pair[0]], got[pair[1]]))
    return rows


def ablation_row(name: str, repeat: int, ref: dict[str, float], ours: dict[str, float],
                 ) -> dict[str, Any]:
    """One variant's row from an :func:`interleaved` pair's figures (see :func:`ablate`)."""
    return {"variant": name, "repeat": repeat,
            "ratio": ours["examples_per_s"] / ref["examples_per_s"],
            "own_ms_per_step": ours["own_ms_per_step"],
            "inside": (ours["ms_per_step"] - ours["own_ms_per_step"])
            / (ref["ms_per_step"] - ref["own_ms_per_step"])}


def ablation_table(rows: list[dict[str, Any]]) -> str:
    """Per variant of ``--ablate`` (and the A/A pair, if run): the ratio, ours' own ms a
    step and TorchRec's steps inside ours against inside the reference, median [min, max]."""
    cells = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        cells.append([name, *(median_spread([r[k] for r in mine])
                              for k in ("ratio", "own_ms_per_step", "inside"))])
    return markdown_table(["ours", "ratio to its reference", "own ms/step",
                           "TorchRec's steps inside ours / inside the reference"], cells, "lrrr")


def reference(cfg: RunConfig, env: DistEnv) -> tuple[TrainPipelineSparseDist, Epochs]:
    """TorchRec's DLRM example set-up: its pipeline, in training mode, and its ``train.steps``
    batches."""
    dataset = build_dataset(cfg.data.name, **cfg.data.options)
    wrapper = DefaultDataParallelWrapper() if cfg.sync.strategy.name == "ddp" else LocalReplicas()
    dmp, _ = build_sharded_model(cfg, dataset.spec, env, wrapper)
    pipeline = TrainPipelineSparseDist(dmp, build_optimizer(cfg, dmp), env.device)
    dmp.train()
    return pipeline, Epochs(cfg, env, dataset)


class Epochs:
    """The reference's ``train.steps`` batches, as ours gets them: epoch after epoch, each a
    fresh iterator (TorchRec's DLRM example makes one an epoch, so its pipeline drains at each
    epoch's end, as ours does)."""

    def __init__(self, cfg: RunConfig, env: DistEnv, dataset: RecDataset | None = None) -> None:
        assert cfg.train.steps is not None
        self._dataset = (dataset if dataset is not None
                         else build_dataset(cfg.data.name, **cfg.data.options))
        self._cfg, self._env = cfg, env
        self._left, self._epoch = cfg.train.steps, -1
        self.current: Iterator[Any] = iter(())
        self.next_epoch()

    def next_epoch(self) -> bool:
        """Moves :attr:`current` to the next epoch's batches; False once all are taken."""
        if self._left <= 0:
            return False
        self._epoch += 1
        self.current = self._taken(self._dataset.train_batches(
            self._cfg.train.batch_size, self._env.rank, self._env.world_size, self._epoch))
        return True

    def _taken(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            if self._left <= 0:
                return
            self._left -= 1
            yield batch


def reference_steps(pipeline: TrainPipelineSparseDist, batches: Epochs,
                    steps: int | None) -> int:
    """TorchRec's DLRM example loop, epoch after epoch: up to ``steps`` steps (all batches if
    None); returns how many it took."""
    done = 0
    while steps is None or done < steps:
        try:
            pipeline.progress(batches.current)
        except StopIteration:
            if not batches.next_epoch():
                break
            continue
        done += 1
    return done


def reference_loop(cfg: RunConfig, env: DistEnv) -> float:
    """TorchRec's DLRM example loop for ``train.steps`` steps; returns examples/s."""
    pipeline, batches = reference(cfg, env)
    dist.barrier()
    began = time.perf_counter()
    done = reference_steps(pipeline, batches, None)
    seconds = time.perf_counter() - began
    if done != cfg.train.steps:
        raise RuntimeError(f"the reference loop ran {done} steps, not {cfg.train.steps}: too "
                           "few batches")
    return cfg.train.batch_size * env.world_size * done / seconds


def our_loop(cfg: RunConfig, env: DistEnv) -> float:
    """Our training job as ``python -m shadowsync.pipelines.train`` runs it (heartbeat,
    console, metrics, control exchange, summary) for ``train.steps`` steps; returns its
    examples/s, timed as the reference's. Its summary table is not printed."""
    dataset = build_dataset(cfg.data.name, **cfg.data.options)
    dist.barrier()
    with contextlib.redirect_stdout(io.StringIO()):
        summary = train.run(cfg, dataset)
    if summary["step"] != cfg.train.steps:
        raise RuntimeError(f"our loop ran {summary['step']} steps, not {cfg.train.steps}")
    return float(summary["examples_per_s"])


def order(rep: int) -> list[str]:
    """The arms of repeat ``rep``: each of ours right before or after its reference (the
    machine's speed drifts over minutes on shared cores), which pair first and which of a
    pair first alternating over repeats, so neither side is always first."""
    pairs = [("reference ddp", "ours ddp"), ("reference local", "ours none")]
    if rep % 2:
        pairs.reverse()
    flip = (rep // 2) % 2 == 1
    return [arm for pair in pairs for arm in (pair[::-1] if flip else pair)]


def run(arm: str, preset: str, steps: int, overrides: list[str], env: DistEnv,
        ) -> dict[str, float]:
    """One run: examples/s, and the loop's own milliseconds per step (outside the pipeline)."""
    cfg = _config(preset, arm, steps, overrides)
    with pipeline_time() as inside:
        rate = (reference_loop if arm.startswith("reference") else our_loop)(cfg, env)
    seconds = steps * cfg.train.batch_size * env.world_size / rate
    return {"examples_per_s": rate, "own_ms_per_step": (seconds - inside[0]) * 1e3 / steps,
            "ms_per_step": seconds * 1e3 / steps}


def interleaved(pair: tuple[str, str], preset: str, steps: int, block: int,
                overrides: list[str], env: DistEnv, phases: bool = False,
                one_model: bool = False, defer: int = 0,
                callbacks: Sequence[TrainCallback] = ()) -> dict[str, dict[str, Any]]:
    """One job of ours with the reference's blocks between its steps (``--interleave``);
    per arm of ``pair`` (reference, ours), the figures of :func:`run`, and ours' wait for its
    metrics compute before blocks (``wait_ms``, counted in ours' time); with ``phases``, ours'
    milliseconds a step in each labelled phase of its loop (``phase_ms``, :class:`PhaseTimes`).
    ``callbacks``: more of ours' trainer's.

    With ``one_model`` (``--one-model``) the reference's blocks run TorchRec's loop on ours'
    own pipeline (its model, optimizers and in-flight batches), fed the reference's batches,
    instead of on a model built beside it: the two sides then differ only by the loop around
    ``progress``, not also by two builds of the model.

    With ``defer`` (``--defer K``) the blocks due in the ``K`` steps of ours after each record
    starts are put off and run, with the one due next, right after them: the record's compute
    then runs beside ours' steps, as in training, and not before a block. What it costs ours'
    steps is ours'; a wait still left when the blocks run is counted as ours' too. The rule is
    by step count, as every rank must take the same blocks (their collectives pair up).
    """
    if steps % block:
        raise ValueError(f"--steps {steps} is not a multiple of --interleave {block}")
    cfg = _config(preset, pair[0], steps, overrides)  # ours' differs only in sync.strategy.name
    if not 0 <= defer < cfg.train.log_every:
        raise ValueError(f"--defer {defer} must be at least 0 and under train.log_every")
    ref_pipeline: TrainPipelineSparseDist | None
    if one_model:
        ref_pipeline, ref_batches = None, Epochs(cfg, env)
    else:
        ref_pipeline, ref_batches = reference(cfg, env)
    in_block = [False]
    progress = TrainPipelineSparseDist.progress
    calls = [0]
    records, times, owed = _Records(calls), PhaseTimes(), [0]  # owed: blocks put off
    spent = {"reference": 0.0, "reference inside": 0.0, "ours inside": 0.0, "wait": 0.0,
             "first": 0.0}

    def timed(self: TrainPipelineSparseDist, batches: Iterator[Any]) -> Any:
        if not self._model.training:
            return progress(self, batches)
        began = time.perf_counter()
        if self is ref_pipeline or in_block[0]:
            try:
                return progress(self, batches)
            finally:
                spent["reference inside"] += time.perf_counter() - began
        calls[0] += 1
        # before ours' call calls[0] (a step, or at an epoch's end the call that finds no
        # batch); on one model a call earlier: ours' batches run dry one step before its
        # last, and TorchRec's pipeline cannot take new ones once it drained
        due = calls[0] + one_model
        deferred = records.at is not None and due <= records.at + defer
        if due % block == 0 and deferred and due + block <= steps:
            owed[0] += 1
        elif due % block == 0 and due <= steps:
            if records.computing is not None and not records.computing.done():
                records.computing.exception()  # waits; a failure is raised by ours when it reads
                spent["wait"] += time.perf_counter() - began
            began_block = time.perf_counter()
            in_block[0] = True
            try:
                done = reference_steps(ref_pipeline or self, ref_batches, block * (owed[0] + 1))
            finally:
                in_block[0] = False
            if done != block * (owed[0] + 1):
                raise RuntimeError("the reference ran out of batches")
            spent["reference"] += time.perf_counter() - began_block
            owed[0] = 0
            began = time.perf_counter()
        try:
            return progress(self, batches)
        finally:
            took = time.perf_counter() - began
            spent["ours inside"] += took
            if calls[0] == 1:
                spent["first"] = took

    TrainPipelineSparseDist.progress = timed
    examples = steps * cfg.train.batch_size * env.world_size
    try:
        if pair[1] in AA:  # a second TorchRec loop in ours' place
            seconds = examples / reference_loop(_config(preset, pair[1], steps, overrides), env)
        else:
            dataset = build_dataset(cfg.data.name, **cfg.data.options)
            dist.barrier()
            with contextlib.redirect_stdout(io.StringIO()):
                summary = train.run(_config(preset, pair[1], steps, overrides), dataset,
                                    callbacks=[records, *([times] if phases else []),
                                               *callbacks])
            if summary["step"] != steps:
                raise RuntimeError(f"our loop ran {summary['step']} steps, not {steps}")
            seconds = summary["train_seconds"]
    finally:
        TrainPipelineSparseDist.progress = progress
    ours_s = seconds - spent["reference"]
    ours_steps = steps
    if one_model:  # the blocks share ours' pipeline, set up in ours' first step: leave it out
        ours_s -= spent["first"]
        spent["ours inside"] -= spent["first"]
        ours_steps -= 1
    return {
        pair[0]: {"examples_per_s": examples / spent["reference"],
                  "own_ms_per_step": (spent["reference"] - spent["reference inside"])
                  * 1e3 / steps, "ms_per_step": spent["reference"] * 1e3 / steps},
        pair[1]: {"examples_per_s": examples * ours_steps / steps / ours_s,
                  "own_ms_per_step": (ours_s - spent["ours inside"]) * 1e3 / ours_steps,
                  "ms_per_step": ours_s * 1e3 / ours_steps, "wait_ms": spent["wait"] * 1e3,
                  **({"phase_ms": {k: v * 1e3 / ours_steps for k, v in times.seconds.items()}}
                     if phases else {})},
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Per arm: median examples/s; ours against its reference run by run (same repeat); the
    loop's own time per step outside TorchRec's pipeline, and its share of the step."""
    by = {(r["arm"], r["repeat"]): r for r in rows}
    repeats = sorted({r["repeat"] for r in rows})
    cells = []
    pairs = {**PAIRS, **AA}
    for arm in [*ARMS, *(a for a in AA if (a, repeats[0]) in by)]:
        mine = [by[arm, r] for r in repeats]
        ratio = (median_spread([by[arm, r]["examples_per_s"]
                                / by[pairs[arm], r]["examples_per_s"] for r in repeats])
                 if arm in pairs else "-")
        share = statistics.median(m["own_ms_per_step"] / m["ms_per_step"] for m in mine)
        cells.append([arm, f"{statistics.median(m['examples_per_s'] for m in mine):,.0f}",
                      ratio, median_spread([m["own_ms_per_step"] for m in mine]),
                      f"{share:.1%}"])
    return markdown_table(["arm", "examples/s", "ratio to its reference, median [min, max]",
                           "own ms/step, median [min, max]", "own share of the step"],
                          cells, "lrrrr")


def phase_table(rows: list[dict[str, Any]]) -> str:
    """Per arm of ours: milliseconds a step in each labelled phase (``--phases``), and what
    of its own time no phase holds, median [min, max] over repeats."""
    ours = [a for a in PAIRS if any(r["arm"] == a and r.get("phase_ms") for r in rows)]
    labels = sorted({k for r in rows for k in r.get("phase_ms", {})})
    lines = []
    for label in [*labels, "outside every phase"]:
        cells = []
        for arm in ours:
            mine = [r for r in rows if r["arm"] == arm]
            values = [r["own_ms_per_step"] - sum(r["phase_ms"].values())
                      if label == "outside every phase"
                      else r["phase_ms"].get(label, 0.0) for r in mine]
            cells.append(median_spread(values) if values else "-")
        lines.append([f"`{label}`", *cells])
    return markdown_table(["phase (wall ms a step)", *ours], lines, "l" + "r" * len(ours))


def profile(preset: str, steps: int, overrides: list[str], env: DistEnv, out: Path) -> str:
    """Each loop once under ``torch.profiler`` (CPU); a table of CPU time per step by label."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    per_arm: dict[str, dict[str, float]] = {}
    for arm in ARMS:
        run(arm, preset, 50, overrides, env)  # warm-up
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            run(arm, preset, steps, overrides, env)
        if env.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(out / f"{arm.replace(' ', '_')}.json"))
        totals: dict[str, float] = collections.defaultdict(float)
        for e in prof.key_averages():
            if e.key.startswith(("## ", "shadowsync.")):  # TorchRec numbers some by batch
                totals[re.sub(r" \d+ ##$", " ##", e.key)] += e.cpu_time_total / steps / 1e3
        per_arm[arm] = totals
    labels = sorted({k for t in per_arm.values() for k in t},
                    key=lambda k: -max(t.get(k, 0.0) for t in per_arm.values()))
    # TorchRec's 20 largest, and every phase of our loop however small
    shown = labels[:20] + [k for k in labels[20:] if k.startswith("shadowsync.")]
    return markdown_table(["label (CPU ms per step, inclusive)", *ARMS],
                          [[f"`{k}`", *(f"{per_arm[a][k]:.3f}" if k in per_arm[a] else "-"
                                        for a in ARMS)] for k in shown], "l" + "r" * len(ARMS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="movielens_1m", help="preset or YAML file")
    parser.add_argument("--steps", type=int, default=600, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each arm, rotated")
    parser.add_argument("--json", type=Path, help="also write every run as JSON here (rank 0)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="profile each loop once instead; traces go to DIR")
    parser.add_argument("--interleave", type=int, metavar="B",
                        help="run each pair in one job, in alternating blocks of B steps")
    parser.add_argument("--aa", action="store_true",
                        help="with --interleave, also run TorchRec's loop in ours' place "
                             "(A/A): the spread of a ratio between identical loops")
    parser.add_argument("--phases", action="store_true",
                        help="with --interleave, also time each labelled phase of our loop")
    parser.add_argument("--one-model", action="store_true",
                        help="with --interleave, run the reference's blocks on ours' own "
                             "pipeline and model instead of on a second build")
    parser.add_argument("--ablate", choices=["ddp", "none"],
                        help="with --interleave, run that pair once per feature of ours "
                             "turned off instead")
    parser.add_argument("--defer", type=int, default=0, metavar="K",
                        help="with --interleave, put off the blocks due in the K steps after "
                             "each record of ours and run them right after (default 0)")
    parser.add_argument("overrides", nargs="*", help="overrides for every arm")
    args = parser.parse_args()
    if (args.aa or args.phases or args.ablate or args.one_model or args.defer) \
            and not args.interleave:
        parser.error("--aa, --phases, --ablate, --one-model and --defer need --interleave")
    if args.ablate and args.phases:
        parser.error("--phases times our phases in the pairs, not in --ablate's variants")
    logging.basicConfig(level=logging.WARNING, force=True)
    env = init_distributed(300.0)
    if args.profile:
        text = profile(args.config, args.steps, args.overrides, env, args.profile)
        if env.rank == 0:
            print(text)
        dist.destroy_process_group()
        return 0
    run(ARMS[1], args.config, 50, args.overrides, env)  # untimed: one-time costs of a process
    if args.ablate:
        return _ablate_main(args, env)
    rows: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        if args.interleave:
            pairs = [(p[a], a) for p in (PAIRS, AA if args.aa else {}) for a in p]
            pairs = pairs[::-1 if rep % 2 else 1]
            runs = [arm_row for pair in pairs for arm_row in interleaved(
                pair, args.config, args.steps, args.interleave, args.overrides, env,
                args.phases, args.one_model, args.defer).items()]
        else:
            runs = [(arm, run(arm, args.config, args.steps, args.overrides, env))
                    for arm in order(rep)]
        for arm, row in runs:
            rows.append({"arm": arm, "repeat": rep, **row})
            if env.rank == 0:
                wait = f", waited {row['wait_ms']:.1f} ms" if "wait_ms" in row else ""
                print(f"repeat {rep} {arm}: {row['examples_per_s']:,.0f} examples/s, own "
                      f"{row['own_ms_per_step']:.3f} of {row['ms_per_step']:.2f} ms/step{wait}",
                      flush=True)
    if env.rank == 0:
        print(f"\n{env.world_size} ranks on {env.device}, config {args.config} "
              f"{' '.join(args.overrides)}; {args.steps} steps, {args.repeats} repeats\n")
        print(table(rows))
        if args.phases:
            print("\n" + phase_table(rows))
        if args.json:
            write_json(args.json, rows)
    dist.destroy_process_group()
    return 0


def _ablate_main(args: argparse.Namespace, env: DistEnv) -> int:
    """``--ablate``: every repeat runs each variant, then the A/A pair with ``--aa``."""
    aa = {"ddp": "A/A ddp", "none": "A/A local"}[args.ablate]
    rows: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        got = ablate(args.ablate, args.config, args.steps, args.interleave, args.overrides, env,
                     rep, one_model=args.one_model, defer=args.defer)
        if args.aa:
            pair = interleaved((AA[aa], aa), args.config, args.steps, args.interleave,
                               args.overrides, env, one_model=args.one_model,
                               defer=args.defer)
            got.append(ablation_row("A/A", rep, pair[AA[aa]], pair[aa]))
        rows += got
        if env.rank == 0:
            for r in got:
                print(f"repeat {rep} {r['variant']}: ratio {r['ratio']:.3f}, own "
                      f"{r['own_ms_per_step']:.3f} ms/step, inside {r['inside']:.3f}",
                      flush=True)
    if env.rank == 0:
        print(f"\nours {args.ablate} against TorchRec's loop, one feature of ours off at a "
              f"time; config {args.config} {' '.join(args.overrides)}; {args.steps} steps, "
              f"{args.repeats} repeats\n")
        print(ablation_table(rows))
        if args.json:
            write_json(args.json, rows)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
