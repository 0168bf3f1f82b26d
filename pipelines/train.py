"""Distributed DLRM training: TorchRec model-parallel embeddings, dense replicas kept in step by
a pluggable wrapper (``ddp``, ``none`` or a ShadowSync strategy).

Run with ``torchrun --nproc_per_node 2 -m shadowsync.pipelines.train [--config F] [k=v ...]``;
without torchrun it runs as a world of one. GPUs are used when present (NCCL, ``cuda:LOCAL_RANK``),
otherwise CPU with gloo.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from shadowsync.datasets import RecDataset, build_dataset
from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.build import (
    DistEnv,
    check_sharding,
    init_distributed,
    local_device,
    plan_ranks,
)
from shadowsync.pipelines.callbacks import TrainCallback
from shadowsync.pipelines.config import RunConfig, check_folders, parse_args, save_config
from shadowsync.pipelines.console import leave_error, locations, rounded
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.errors import FAILURES, PREEMPTED_EXIT_CODE
from shadowsync.pipelines.fault_domain import FaultDomain
from shadowsync.pipelines.loop import Trainer

__all__ = ["DistEnv", "Trainer", "init_distributed", "main", "plan_ranks", "prepare", "run"]

logger = logging.getLogger("shadowsync.train")


def _summary_table(summary: dict[str, Any]) -> str:
    rows = [(k, rounded(v)) for k, v in summary.items() if k != "summary"]
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"{'metric':<{width}}  value", f"{'-' * width}  -----"] +
                     [f"{k:<{width}}  {v}" for k, v in rows])


def prepare(cfg: RunConfig) -> RecDataset:
    """Everything that can be checked before ranks meet: the data set (its files, table sizes)
    and a sharding plan for this launch's world size and device. Raises ``ValueError`` or
    ``OSError`` naming the setting; no process group exists yet, so nothing is left waiting."""
    check_folders(cfg)
    dataset = build_dataset(cfg.data.name, **cfg.data.options)
    check_sharding(cfg, dataset.spec, int(os.environ.get("WORLD_SIZE", "1")), local_device()[0])
    return dataset


def run(cfg: RunConfig, dataset: RecDataset, domain: FaultDomain | None = None,
        callbacks: Sequence[TrainCallback] = ()) -> dict[str, Any]:
    """Trains with ``cfg`` in a new process group; returns the final summary. ``domain``: the
    process's fault domain (a new one, without a SIGTERM handler, by default); ``callbacks``:
    the trainer's instrumentation (:class:`~.callbacks.TrainCallback`)."""
    domain = FaultDomain() if domain is None else domain
    env = init_distributed(cfg.train.pg_timeout_s)
    domain.start_heartbeat(cfg.train.heartbeat_s, cfg.train.heartbeat_timeout_s)
    if env.rank == 0:
        logger.info("%s; world %d on %s (%s)", dataset.describe(), env.world_size, env.device,
                    env.backend)
        if cfg.output_dir:
            Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
            save_config(cfg, Path(cfg.output_dir) / "config.yaml")
    with Trainer(RunContext.of(cfg, env, domain, callbacks), dataset) as trainer:
        if env.rank == 0:
            logger.info("sharding plan:\n%s", trainer.plan)
        trainer.maybe_resume()
        summary = trainer.train()
    domain.finish()
    if env.rank == 0:
        where = locations(cfg.output_dir, trainer.log.history, summary["step"], os.environ)
        print(_summary_table({**summary, **where}), flush=True)
    return summary


# How long a rank other than local rank 0 waits, after a failed config check, to be stopped.
_CONFIG_WAIT_S = 10.0


def _bad_config(line: str, wait_s: float = _CONFIG_WAIT_S) -> int:
    """Exit 2 for a configuration the ranks refuse, with ``line`` printed once per node.

    Every rank of a node makes the same check, so every rank fails it. Local rank 0 prints
    ``line``, leaves it in torchrun's error file and exits 2. Under torchrun the other ranks
    wait up to ``wait_s`` for the SIGTERM torchrun sends once local rank 0 has exited; so
    torchrun's summary (and the launcher's single line) always name local rank 0, however
    the ranks raced to their checks. One that is not stopped in time (its local rank 0
    passed the check) leaves the line and exits 2 itself.
    """
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(line, file=sys.stderr, flush=True)
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        time.sleep(wait_s)  # SIGTERM's default action ends this process here
    leave_error(line, 2)
    return 2


@record
def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 1 failed (reported by the :class:`~.fault_domain.FaultDomain`: one
    ``rank N failed: ...`` line and torchrun's error file), 2 bad configuration, 143 preempted
    (see :mod:`.errors`). ``@record`` reports anything else that escapes."""
    # TorchRec logs every pipeline refill at INFO on every rank; keep ours, quiet theirs.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stdout, force=True)
    logging.getLogger("shadowsync").setLevel(logging.INFO)
    try:
        cfg = parse_args(argv)
        dataset = prepare(cfg)
    except (ValueError, OSError) as e:
        return _bad_config(f"error: {e}")
    domain = FaultDomain()
    domain.install_sigterm_handler()
    try:
        summary = run(cfg, dataset, domain)
    except FAILURES as e:  # no destroy_process_group(): it could wait on a peer gone
        return domain.fail(e)
    dist.destroy_process_group()
    if not summary.get("preempted"):
        return 0
    if int(os.environ.get("RANK", "0")) == 0:
        saved = checkpoint.latest(cfg.checkpoint.dir) if cfg.checkpoint.dir else None
        where = (f"checkpoint {saved.path}; run the same command to resume" if saved else
                 "no checkpoint.dir, so the work is lost")
        print(f"preempted: every rank stopped after step {summary['step']}; {where} "
              f"(exit {PREEMPTED_EXIT_CODE})", flush=True)
    return PREEMPTED_EXIT_CODE


def cli() -> NoReturn:
    """The process entry point: exits with :func:`main`'s code, at once on a failure.

    After a failure a synchronizer thread may still sit in a collective with a dead peer, and
    interpreter teardown could wait for it; the fault domain already reported it.
    """
    code = main()
    if code == 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.exit(code)


if __name__ == "__main__":
    cli()
