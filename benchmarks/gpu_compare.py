"""The synchronizers side by side on one GPU: examples/s, sync gap and eval AUC, plain torch.

Where TorchRec's wheels are missing (the lent GPU machine has torch but no torchrec/fbgemm),
two gloo ranks share one GPU and train a DLRM-like model -- ``nn.EmbeddingBag`` tables kept on
every rank (TorchRec's data_parallel sharding), bottom and top MLPs, dot interaction -- on a
synthetic stream whose labels come from a planted logistic model, once per arm: none, ddp,
fixed-rate MA k=10, shadow MA, EASGD and BMUF. The synchronizers are the project's own runners
(``shadowsync.sync``, CUDA side stream, sync group on gloo as configured by default), over all
parameters, tables included::

    python -m shadowsync.benchmarks.gpu_compare     # prints "skipped: no CUDA" without a GPU
    python -m shadowsync.benchmarks.gpu_compare --device cpu --steps 50 --batch-size 256

Where ``import torchrec`` works too, it first runs ``bench_sync.py`` (the full TorchRec Trainer
path) under torchrun, one rank per GPU (NCCL cannot give two ranks one GPU; 2 gloo ranks on
CPU), and prints its table. The plain-torch table comes last. Sized for under 8 minutes on one
H200 with the defaults. In a bare copy of the repository (no install), ``scripts/bare.sh``
makes it importable: ``scripts/bare.sh python3 -m shadowsync.benchmarks.gpu_compare``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import math
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from shadowsync.benchmarks.report import markdown_table, or_dash
from shadowsync.sync import (
    BlockwiseModelUpdateFiltering,
    ElasticAveraging,
    FixedRateOptions,
    FixedRateSyncRunner,
    ModelAveraging,
    ReplicaSet,
    ShadowOptions,
    ShadowSyncRunner,
    SyncRunner,
    SyncStrategy,
    broadcast_,
    new_sync_group,
)
from shadowsync.testing import run_ranks

NUM_DENSE, NUM_SPARSE = 13, 26
WARMUP_STEPS = 20  # untimed, per arm: allocator and cuBLAS warm-up, the runner's first rounds


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    kind: str  # none | ddp | fixed_rate | shadow
    make: type[SyncStrategy] | functools.partial[SyncStrategy] | None = None


ARMS = [
    Arm("none", "none"),
    Arm("ddp", "ddp"),
    Arm("fixed-rate ma k=10", "fixed_rate", ModelAveraging),
    Arm("shadow ma", "shadow", ModelAveraging),
    Arm("shadow easgd", "shadow", functools.partial(ElasticAveraging, alpha=0.5)),
    Arm("shadow bmuf", "shadow", BlockwiseModelUpdateFiltering),  # momentum 1 - 1/W
]
PERIOD = 10


@dataclasses.dataclass(frozen=True)
class Settings:
    device: str
    steps: int
    batch_size: int
    rows: int
    dim: int
    eval_examples: int


class PlantedData:
    """Batches computed from ``(split, rank, step)`` alone, on the device; labels are Bernoulli
    draws from a planted logistic model, so its own AUC is the ceiling and 0.5 is chance.

    Logit: ``dense @ w + sum_f s_f * e_f[id_f] + 0.5 * dense_0 * e_0[id_0] - 1``, strong ``s_f``
    for 8 sparse features, weak for 8, none for 10; ids follow a power law (hot head)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        g = torch.Generator().manual_seed(1234)
        self.rows, self.device = rows, device
        self.w = (torch.randn(NUM_DENSE, generator=g) * 0.3).to(device)
        strength = torch.tensor([1.0] * 8 + [0.3] * 8 + [0.0] * 10)
        self.effects = (torch.randn(NUM_SPARSE, rows, generator=g) * strength[:, None]).to(device)

    def batch(self, split: int, rank: int, step: int, size: int) -> tuple[Tensor, Tensor, Tensor]:
        g = torch.Generator(self.device).manual_seed(((split * 1009 + rank) * 1_000_003) + step)
        dense = torch.randn(size, NUM_DENSE, generator=g, device=self.device)
        u = torch.rand(size, NUM_SPARSE, generator=g, device=self.device)
        ids = (u.pow(3) * self.rows).long().clamp_(max=self.rows - 1)
        labels = torch.bernoulli(torch.sigmoid(self.logit(dense, ids)), generator=g)
        return dense, ids, labels

    def logit(self, dense: Tensor, ids: Tensor) -> Tensor:
        feature = torch.arange(NUM_SPARSE, device=self.device)
        eff = self.effects[feature, ids]  # (batch, features)
        return dense @ self.w + eff.sum(1) + 0.5 * dense[:, 0] * eff[:, 0] - 1.0


def mlp(sizes: list[int], last_relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRMLike(nn.Module):
    """DLRM (Naumov et al., arXiv:1906.00091) with plain ``nn.EmbeddingBag`` tables."""

    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum")
                                    for _ in range(NUM_SPARSE))
        self.bottom = mlp([NUM_DENSE, 256, 64, dim])
        n = NUM_SPARSE + 1
        self.top = mlp([dim + n * (n - 1) // 2, 1024, 1024, 512, 1], last_relu=False)
        self.pairs = torch.triu_indices(n, n, offset=1)

    def forward(self, dense: Tensor, ids: Tensor) -> Tensor:
        x = self.bottom(dense)
        sparse = [t(ids[:, f : f + 1]) for f, t in enumerate(self.tables)]
        z = torch.stack([x, *sparse], 1)  # (batch, features + 1, dim)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], 1)).squeeze(1)


def auc(scores: Tensor, labels: Tensor) -> float:
    """Mann-Whitney AUC (scores are continuous, so ties are negligible)."""
    ranks = torch.empty_like(scores, dtype=torch.float64)
    ranks[scores.argsort()] = torch.arange(1, len(scores) + 1, dtype=torch.float64,
                                           device=scores.device)
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def evaluate(model: nn.Module, data: PlantedData, rank: int, world: int, s: Settings
             ) -> tuple[float, float]:
    """(model AUC, planted AUC) over the eval split; each rank scores its share with its own
    replica (they differ only for ``none``), as TorchRec's Trainer does."""
    share = s.eval_examples // world
    dense, ids, labels = data.batch(2, rank, 0, share)
    with torch.no_grad():
        mine = torch.stack([model(dense, ids), data.logit(dense, ids), labels]).cpu()
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    every = torch.cat(parts, 1)
    return auc(every[0], every[2]), auc(every[1], every[2])


def run_arm(arm: Arm, rank: int, world: int, device: torch.device, data: PlantedData,
            group: dist.ProcessGroup, s: Settings) -> dict[str, Any]:
    torch.manual_seed(0)
    model = DLRMLike(s.rows, s.dim).to(device)
    params = list(model.parameters())
    broadcast_(params)
    optimizer = torch.optim.Adagrad([
        {"params": model.tables.parameters(), "lr": 0.05},
        {"params": [*model.bottom.parameters(), *model.top.parameters()], "lr": 0.02}])
    net: nn.Module = model
    runner: SyncRunner | None = None
    if arm.kind == "ddp":
        net = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda"
                                      else None)
    elif arm.make is not None:
        runner = (FixedRateSyncRunner(ReplicaSet(params, arm.make()), group,
                                      FixedRateOptions(period=PERIOD))
                  if arm.kind == "fixed_rate" else
                  ShadowSyncRunner(ReplicaSet(params, arm.make()), group,
                                   ShadowOptions(deadline_s=120.0)))
        runner.start()
    loss_fn = nn.BCEWithLogitsLoss()
    start = 0.0
    for step in range(WARMUP_STEPS + s.steps):
        if step == WARMUP_STEPS:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier()
            start = time.perf_counter()
        dense, ids, labels = data.batch(1, rank, step, s.batch_size)
        loss = loss_fn(net(dense, ids), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if runner is not None:
            runner.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    row: dict[str, Any] = {"arm": arm.name, "seconds": seconds, "sync_gap": math.nan,
                           "syncs": 0, "dense_mb": sum(p.numel() for p in params) * 4 / 2**20}
    if runner is not None:
        runner.stop(final_sync=True)
        stats = runner.stats()
        row.update(sync_gap=stats.gap_mean, syncs=stats.syncs_applied)
    row["auc"], row["planted_auc"] = evaluate(model, data, rank, world, s)
    return row


def rank_main(rank: int, world: int, s: Settings) -> list[dict[str, Any]]:
    device = torch.device(s.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    group = new_sync_group()  # every rank, before any thread
    data = PlantedData(s.rows, device)
    run_arm(Arm("warmup", "none"), rank, world, device, data, group,
            dataclasses.replace(s, steps=min(s.steps, 50)))
    rows = []
    for arm in ARMS:  # an arm that fails on every rank alike (say, DDP here) costs only its row
        try:
            rows.append(run_arm(arm, rank, world, device, data, group, s))
        except Exception as e:
            rows.append({"arm": arm.name, "error": f"{type(e).__name__}: {e}"[:300]})
    return rows


def table(per_rank: list[list[dict[str, Any]]], s: Settings, world: int) -> str:
    """One row per arm; examples/s counts both ranks over the slower rank's time."""
    rows, errors = [], []
    for by_rank in zip(*per_rank, strict=True):
        failed = [f"rank {i}: {x['error']}" for i, x in enumerate(by_rank) if "error" in x]
        if failed:
            errors.append(f"{by_rank[0]['arm']} failed: " + "; ".join(failed))
            continue
        r = dict(by_rank[0])
        r["examples_per_s"] = world * s.steps * s.batch_size / max(x["seconds"] for x in by_rank)
        rows.append(r)
    if not rows:
        return "every arm failed:\n" + "\n".join(errors)
    none = rows[0]["examples_per_s"] if rows[0]["arm"] == "none" else math.nan
    cells = [[r["arm"], f"{r['examples_per_s']:,.0f}", f"{r['examples_per_s'] / none:.3f}",
              or_dash(r["sync_gap"], ".1f"), r["syncs"], f"{r['auc']:.4f}"] for r in rows]
    return ("\n".join(errors) + "\n\n" if errors else "") + (
        f"{world} gloo ranks sharing {s.device}, {s.steps} timed steps per arm (after "
        f"{WARMUP_STEPS}), batch {s.batch_size} per rank, {rows[0]['dense_mb']:.1f} MB of "
        f"parameters synchronized, planted-model AUC {rows[0]['planted_auc']:.4f}\n\n"
        + markdown_table(["arm", "examples/s", "ratio to none", "sync gap mean", "syncs",
                          "eval AUC"], cells, "lrrrrr"))


def torchrec_table(device: str, steps: int, timeout_s: float) -> str:
    """``bench_sync.py`` (TorchRec Trainer) under torchrun; its table, or why there is none."""
    nproc = torch.cuda.device_count() if device == "cuda" else 2
    # The ranks import shadowsync as this process did: installed, or through the PYTHONPATH
    # (or working directory) they inherit.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "shadowsync.benchmarks.bench_sync",
           "--steps", str(steps), "eval.max_batches=4"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"TorchRec path: no result within {timeout_s:.0f} s"
    if done.returncode != 0:
        return f"TorchRec path failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
    start = done.stdout.find(f"{nproc} ranks on")  # bench_sync's summary; else its tail
    return ("TorchRec Trainer path (bench_sync.py, synthetic preset):\n"
            + done.stdout[start if start >= 0 else -3000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a dry run of the same logic where there is no GPU")
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per arm")
    parser.add_argument("--batch-size", type=int, default=4096, help="per rank")
    parser.add_argument("--rows", type=int, default=4000, help="rows per embedding table")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--eval-examples", type=int, default=262144)
    parser.add_argument("--torchrec-steps", type=int, default=600,
                        help="steps per arm of the TorchRec path; 0 skips it")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="for the plain-torch run")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 0
    started = time.perf_counter()
    if args.torchrec_steps and importlib.util.find_spec("torchrec") is not None:
        print(torchrec_table(args.device, args.torchrec_steps, timeout_s=150.0), flush=True)
        print()
    else:
        print("TorchRec path skipped: torchrec is not importable here (or --torchrec-steps 0)")
    s = Settings(args.device, args.steps, args.batch_size, args.rows, args.dim,
                 args.eval_examples)
    per_rank = run_ranks(functools.partial(rank_main, s=s), world_size=2,
                         timeout_s=args.timeout_s, pg_timeout_s=120)
    print(f"\n{time.perf_counter() - started:.0f} s in all; "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU dry run'}, "
          f"torch {torch.__version__}\n")
    print(table(per_rank, s, world=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
