"""Replica groups on a real Slurm: ``-j 2x2`` jobs through torchx's Slurm scheduler on the lab's
two emulated nodes (:func:`~.slurm_lab.lab_slurm` with ``hosts=2``: each slurmd in a network
namespace of its own, links of ``--rate``), one job per arm, and what crossed each node's
link during it (the interfaces' counters, :meth:`~.slurm_lab.SlurmLab.traffic`).

The arms (:data:`ARMS`): TorchRec's layout (one group of the 4 ranks, whose embedding
all-to-alls cross the nodes every step), replica groups (``sharding.group_size=local``: a group
a node), and replica groups without synchronization (nothing but the job's start, its final
evaluation and Slurm's own messages crosses). Each arm runs at two lengths (``--steps``), so
that what a step adds (the all-to-alls, the rounds) stands apart from what a job pays once
(start-up, the first group's tables broadcast to the others, the final consensus and
evaluation). Each job must end SUCCEEDED. Needs root::

    sudo .venv/bin/python -m shadowsync.benchmarks.slurm_layouts \\
        --out benchmarks/results/replica_groups/slurm

Writes ``runs.json`` and ``report.md`` under ``--out`` and prints the table. Exit code 2 with
one ``error:`` line where the lab cannot run, 1 if a job did not succeed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shadowsync.benchmarks.report import command_line, markdown_table, write_json
from shadowsync.testing import wait_for_app

ARMS = {
    "one group (TorchRec's layout), shadow MA": [],
    "replica groups, shadow MA": ["sharding.group_size=local"],
    "replica groups, no synchronization": ["sharding.group_size=local",
                                           "sync.strategy.name=none"],
}
JOB_TIMEOUT_S = 600.0


def run_jobs(config: str, overrides: list[str], steps: list[int], rate: str, install: bool,
             ) -> list[dict[str, Any]]:
    """Every arm's job at each of ``steps`` on a fresh two-node lab (missing Debian packages
    installed first when ``install``), one after another; a row per job."""
    from torchx.runner import get_runner

    from shadowsync.benchmarks import netns, slurm_lab
    from shadowsync.torchx_components.train import train

    rows = []
    with tempfile.TemporaryDirectory(prefix="slurm-layouts-") as work, \
            slurm_lab.lab_slurm(hosts=2, rate=rate, install=install) as lab:
        os.environ.update(lab.env)
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        os.chdir(work)  # sbatch leaves the jobs' logs here, where torchx reads them
        for arm, extra, n in [(a, e, n) for a, e in ARMS.items() for n in steps]:
            app = train(*overrides, *extra, f"train.steps={n}", f"output_dir={work}/${{app_id}}",
                        config=config,
                        j="2x2", cpu=2, memMB=4000,
                        env={"GLOO_SOCKET_IFNAME": netns.HOST_IF, "OMP_NUM_THREADS": "1"})
            before = lab.traffic()
            began = time.monotonic()
            with get_runner() as runner:
                handle = runner.run(app, "slurm", cfg={})
                status = wait_for_app(runner, handle, JOB_TIMEOUT_S)
            wall = time.monotonic() - began
            after = lab.traffic()
            job = handle.rsplit("/", 1)[-1]
            metrics = Path(work) / job / "metrics.jsonl"
            summary = (json.loads(metrics.read_text().splitlines()[-1])
                       if metrics.exists() else {})
            rows.append({
                "arm": arm, "overrides": extra, "job": job, "state": status.state.name,
                "wall_s": wall, "step": summary.get("step"),
                "sync_rounds": summary.get("sync_rounds", 0),
                "sync_bytes_reduced": summary.get("sync_bytes_reduced", 0),
                "eval_ne": summary.get("eval_ne"),
                "nodes": {node: {"tx": after[node][0] - tx, "rx": after[node][1] - rx}
                          for node, (tx, rx) in before.items()},
            })
            print(f"{arm}, {n} steps: job {job} {status.state.name} in {wall:.0f} s", flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Per job: its state, steps, rounds, the bytes rank 0's synchronizer handed to its
    rounds' collectives, and what each node sent and received; then per arm, what each step
    beyond its shorter job's added."""
    nodes = list(rows[0]["nodes"]) if rows else []

    def mb(x: float) -> str:
        return f"{x / 1e6:.2f}"

    jobs = [[r["arm"], r["state"], r["step"], f"{r['sync_rounds']:.0f}",
             mb(r["sync_bytes_reduced"]),
             *(f"{mb(r['nodes'][n]['tx'])} / {mb(r['nodes'][n]['rx'])}" for n in nodes)]
            for r in rows]
    text = markdown_table(["arm", "state", "steps", "sync rounds", "sync MB (rank 0)",
                           *(f"{n} MB sent / received" for n in nodes)], jobs,
                          "llrrr" + "r" * len(nodes))
    slopes = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        lengths = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["step"])
        if len(lengths) < 2:
            continue
        short, long = lengths[0], lengths[-1]
        d = (long["step"] - short["step"]) * 1e3  # kB a step
        sync = (long["sync_bytes_reduced"] - short["sync_bytes_reduced"]) / d
        slopes.append([arm, f"{short['step']} -> {long['step']}", f"{sync:.1f}",
                       *(f"{(long['nodes'][n]['tx'] - short['nodes'][n]['tx']) / d:.1f}"
                         for n in nodes)])
    if slopes:
        text += ("\n\nWhat a step adds (the longer job less the shorter, per step beyond it):"
                 "\n\n" + markdown_table(["arm", "steps", "sync kB a step (rank 0)",
                                           *(f"{n} kB sent a step" for n in nodes)], slopes,
                                          "lrr" + "r" * len(nodes)))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="movielens_1m")
    parser.add_argument("--rate", default="1gbit", help="each node's link, both ways")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-install", action="store_true",
                        help="fail instead of installing missing packages with apt-get")
    parser.add_argument("--steps", type=int, nargs="+", default=[40, 200],
                        help="each arm's job lengths (train.steps)")
    parser.add_argument("overrides", nargs="*",
                        default=["eval.every_steps=null", "eval.max_batches=1",
                                 "logging.progress_bar=false"],
                        help="overrides every job gets")
    args = parser.parse_args(argv)
    from shadowsync.benchmarks.netns import ClusterError
    from shadowsync.benchmarks.slurm_setup import LabUnavailable

    out = args.out.resolve()
    try:
        rows = run_jobs(args.config, args.overrides, args.steps, args.rate, not args.no_install)
    except (LabUnavailable, ClusterError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "runs.json", rows)
    text = (f"Command: `{command_line('shadowsync.benchmarks.slurm_layouts', argv)}`\n\n"
            f"`-j 2x2`, config `{args.config}` {' '.join(args.overrides)}, steps "
            f"{' and '.join(map(str, args.steps))}, links "
            f"{args.rate}:\n\n{table(rows)}\n")
    (out / "report.md").write_text(text)
    print(text)
    return 0 if all(r["state"] == "SUCCEEDED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
