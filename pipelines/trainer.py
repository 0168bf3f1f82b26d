"""The train/eval loop: TorchRec's pipeline, the dense synchronizer's lifecycle, metrics and
checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from tqdm import tqdm

from shadowsync.datasets import RecDataset
from shadowsync.pipelines import checkpoint, faults
from shadowsync.pipelines.build import (
    DistEnv,
    build_optimizer,
    build_sharded_model,
)
from shadowsync.pipelines.collector import StepCollector
from shadowsync.pipelines.config import RunConfig, dump_config
from shadowsync.pipelines.console import ConsoleLog, planned_steps
from shadowsync.pipelines.fault_domain import FaultDomain
from shadowsync.pipelines.metrics import TrainingMetrics, gather_metrics
from shadowsync.pipelines.position import DataPosition
from shadowsync.sync.runner import SyncError
from shadowsync.sync.wrapper import (
    DDPReplicas,
    LocalReplicas,
    build_replica_wrapper,
    dense_parameters,
)

logger = logging.getLogger("shadowsync.train")
_FRESH_ON_PURPOSE = ("to train from step 0 on purpose, run with checkpoint.resume=false "
                     "(or move those folders out of checkpoint.dir)")


def _phase(name: str) -> contextlib.AbstractContextManager[object]:
    """``record_function(name)`` while a profiler records, else nothing: entering a label
    dispatches an op even when no profiler is on, and this loop enters several a step, a
    measurable share of a small CPU step (``benchmarks/bench_loop.py``)."""
    return record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


class Trainer:
    """Trains on TorchRec's ``TrainPipelineSparseDist`` and evaluates, checkpoints and resumes.

    The dense synchronizer (the replica wrapper) sees the loop at four points: ``after_step``
    between steps (ShadowSync adds a finished delta there), ``pause``/``resume`` around every
    evaluation and checkpoint (with the final sync, so the model evaluated or saved is one
    model), and ``finish`` at the end.

    Every ``train.log_every`` steps a training record (loss, examples/s, the synchronizer's
    counters, NE, AUC and calibration over a window of recent examples, NE over the run) is
    started; its metrics reduce over the ranks in the background
    (:class:`~.metrics.TrainingMetrics`) and the record is logged as
    soon as they are done, or before the next record of any kind, so records stay in order.

    Every ``train.control_every_steps`` steps, or fewer where steps are so fast that would be
    under ``train.control_min_interval_s`` (each check carries every rank's seconds a step
    since the last, and all ranks derive the next check's step from the same table), the
    ranks agree (:class:`~.faults.Control`) on
    whether to degrade a failed synchronizer and whether to stop: once SIGTERM reached any rank
    (see :meth:`~.fault_domain.FaultDomain.install_sigterm_handler`), every rank stops after
    the same step, finishes the synchronizer, writes a checkpoint and returns a summary with
    ``preempted: True`` (no final evaluation).

    A run that goes non-finite fails (:class:`~.faults.NonFiniteValue`, naming the step, the
    rank and what): every step queues a check of the loss and the dense gradients on the
    device (:class:`~.faults.FiniteWatch`) and polls its result without waiting. A rank whose
    loss went non-finite fails at once (its peers stop with ``PeerFailed`` naming it); what
    the poll has not shown yet (on GPUs it lags a step or more) and non-finite gradients are
    compared across ranks in the control exchange and before every log record, checkpoint,
    evaluation and the end, where every rank raises and the earliest (step, then loss before
    gradients) is named; so is a dense optimizer state turned inf by a gradient too large to
    square, found at the next log record, checkpoint, evaluation or the end. Evaluation checks
    its predictions on every rank and its metrics. Nothing non-finite is logged, checkpointed
    or summarized.

    Example::

        env = init_distributed(cfg.train.pg_timeout_s)
        trainer = Trainer(cfg, env, build_dataset(cfg.data.name, **cfg.data.options))
        trainer.maybe_resume()
        summary = trainer.train()
    """

    def __init__(self, cfg: RunConfig, env: DistEnv, dataset: RecDataset,
                 wrapper: LocalReplicas | DDPReplicas | None = None,
                 domain: FaultDomain | None = None) -> None:
        """``wrapper``: the data-parallel wrapper to train with instead of the one ``sync.*``
        names (``build_replica_wrapper(cfg.sync)``), e.g. a benchmark's. ``domain``: the
        process's fault domain, which the synchronizer reports to and whose stop requests the
        ranks agree on (a new one, without a SIGTERM handler, by default)."""
        self.cfg = cfg
        self.env = env
        self.dataset = dataset
        self.domain = FaultDomain() if domain is None else domain
        self.wrapper = build_replica_wrapper(cfg.sync) if wrapper is None else wrapper
        self.wrapper.failure_hook = self.domain.claim
        self.dmp, self.plan = build_sharded_model(cfg, dataset.spec, env, self.wrapper)
        self.optimizer = build_optimizer(cfg, self.dmp)
        self.pipeline = TrainPipelineSparseDist(self.dmp, self.optimizer, env.device)
        self.control = faults.Control(cfg.train.pg_timeout_s)
        self.watch = faults.FiniteWatch(list(dense_parameters(self.dmp).values()), env.device,
                                        self.optimizer)
        # Gloo, like the synchronizer's group: the metrics reduce from a thread of their own,
        # where NCCL beside the training loop's communicator is not safe.
        self._metrics_group = dist.new_group(
            backend="gloo", timeout=timedelta(seconds=cfg.train.pg_timeout_s))
        self.metrics = TrainingMetrics(cfg.logging.window_examples, env.world_size,
                                       self._metrics_group)
        # The training record whose metrics are being computed in the background.
        self._record_pending: tuple[dict[str, Any], Future[dict[str, float]]] | None = None
        self.console = ConsoleLog(planned_steps(cfg.train.steps, cfg.train.epochs, dataset,
                                                cfg.train.batch_size, env.world_size))
        self.position = DataPosition()
        self.collector = StepCollector(cfg.train.gc_every_steps)
        self.last_saved = -1
        self.last_eval = 0  # the step of the last evaluation
        self._last_record = (time.perf_counter(), 0)  # when, and after which step
        # The periodic control exchange in flight: the step it was started after, its table.
        self._control_pending: tuple[int, Callable[[], torch.Tensor]] | None = None
        # The step of the next periodic check, and where this rank's pace is timed from (when,
        # after which step).
        self._next_control = cfg.train.control_every_steps
        self._control_clock = (time.perf_counter(), 0)
        self.history: list[dict[str, Any]] = []
        self.out_dir = Path(cfg.output_dir) if cfg.output_dir else None
        if self.out_dir is not None and env.rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)

    @property
    def step(self) -> int:
        """Training steps done (see :attr:`position`)."""
        return self.position.step

    def close(self) -> None:
        """Destroys the process groups this trainer made (the synchronizer's and the control
        group); every rank, after :meth:`train` returned. After a failure, leave them: a
        destroy could wait on a peer that is gone (the process exits instead)."""
        self.wrapper.close()
        dist.destroy_process_group(self.control.group)
        dist.destroy_process_group(self._metrics_group)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()

    # ------------------------------------------------------------------ records
    def _log(self, record: dict[str, Any]) -> None:
        """Rank 0 prints a line a person reads and appends the record, with its Unix ``time``,
        to ``metrics.jsonl``; a training record still computing is logged first (waiting for
        it), so records stay in step order."""
        self._finish_train_record()
        self.history.append(record)
        if self.env.rank == 0:
            line = self.console.line(record)
            if line is not None:
                logger.info(line)
            if self.out_dir is not None:
                with open(self.out_dir / "metrics.jsonl", "a") as f:
                    f.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")

    def _start_train_record(self, loss: float) -> None:
        """Collective: the training record of this step. Its metrics reduce over all ranks in
        the background (:meth:`~.metrics.TrainingMetrics.start_compute`) and
        :meth:`_finish_train_record` logs the record once that is done. Examples/s is over the
        steps since the previous record, ``examples`` counts from step 0."""
        self._finish_train_record()
        computing = self.metrics.start_compute()
        per_step = self.cfg.train.batch_size * self.env.world_size
        now = time.perf_counter()
        since, steps_before = self._last_record
        self._last_record = (now, self.step)
        record: dict[str, Any] = {"step": self.step, "loss": loss,
                                  "examples_per_s": (self.step - steps_before) * per_step
                                  / max(now - since, 1e-9),
                                  "examples": self.step * per_step}
        record.update({f"sync_{k}": v for k, v in self.wrapper.stats().items()})
        self._record_pending = (record, computing)

    def _finish_train_record(self, wait: bool = True) -> dict[str, Any] | None:
        """Logs the training record whose metrics were computing, once they are (waiting for
        them if ``wait``; otherwise only if done); returns it, or None if none was logged.
        Raises what the computation raised."""
        if self._record_pending is None or not (wait or self._record_pending[1].done()):
            return None
        (record, computing), self._record_pending = self._record_pending, None
        computed = computing.result()
        record = {**record, **computed}
        self._log(record)
        return record

    # ------------------------------------------------------------------ eval
    def evaluate(self) -> dict[str, float]:
        """Exact metrics over the whole eval split: every rank's predictions, gathered."""
        self.wrapper.pause(consensus=True)
        self.dmp.eval()
        batches: Iterator[Batch] = self.dataset.eval_batches(
            self.cfg.eval.batch_size, self.env.rank, self.env.world_size
        )
        if self.cfg.eval.max_batches is not None:
            batches = itertools.islice(batches, self.cfg.eval.max_batches)
        logits, labels = [], []
        with torch.no_grad():
            while True:
                try:
                    _, out_logits, out_labels = self.pipeline.progress(batches)
                except StopIteration:
                    break
                logits.append(out_logits.float())
                labels.append(out_labels.float())
        self.dmp.train()
        self.wrapper.resume()
        self.last_eval = self.step
        empty = torch.empty(0, device=self.env.device)
        local = torch.cat(logits) if logits else empty
        finite = bool(torch.isfinite(local).all())
        where = f"in the evaluation after step {self.step}"
        faults.raise_if_non_finite(self.control.exchange([0 if finite else max(self.step, 1)]),
                                   ["eval predictions"], self.env.rank, where)
        metrics = gather_metrics(local, torch.cat(labels) if labels else empty)
        bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
        if bad:  # the same on every rank: computed from every rank's (finite) predictions
            raise faults.NonFiniteValue(
                f"non-finite eval metrics {bad} {where}, from finite predictions of every rank "
                f"(eval click rate {metrics['ctr']}, {metrics['examples']:.0f} examples)")
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def _sharded_state(self) -> dict[str, Any]:
        """What DCP saves and loads: the model without its dense replica (which every rank
        keeps in its own file, since replicas may differ between syncs) and the fused
        embedding optimizer's state; each tensor is saved once."""
        dense = dense_parameters(self.dmp)
        return {"model": {k: v for k, v in self.dmp.state_dict().items() if k not in dense},
                "sparse_optimizer": self.dmp.fused_optimizer.state_dict()}

    def _local_state(self) -> dict[str, Any]:
        optimizers = {name: opt.state_dict() for name, opt in self.optimizer.optimizers
                      if name != "sparse"}
        return {
            **self.position.state_dict(),
            "dense": {n: p.detach().clone() for n, p in dense_parameters(self.dmp).items()},
            "optimizers": optimizers,
            "sync": self.wrapper.state_dict(),
            "rng": torch.get_rng_state(),
            **({"cuda_rng": torch.cuda.get_rng_state(self.env.device)}
               if self.env.device.type == "cuda" else {}),
            "last_eval": self.last_eval,
        }

    def _model_files(self) -> dict[str, str]:
        """What rebuilds the model from a checkpoint alone (:func:`checkpoint.load_model`)."""
        return {checkpoint.CONFIG: dump_config(self.cfg),
                checkpoint.SPEC: json.dumps(dataclasses.asdict(self.dataset.spec))}

    def save_checkpoint(self) -> None:
        """Collective; the synchronizer is paused with the final sync while the state is read."""
        root = self.cfg.checkpoint.dir
        if root is None or self.last_saved == self.step:
            return
        self.wrapper.pause(consensus=True)
        path = checkpoint.save(root, self.step, self._sharded_state(), self._local_state(),
                               keep=self.cfg.checkpoint.keep, texts=self._model_files())
        self.wrapper.resume()
        self.last_saved = self.step
        self._log({"step": self.step, "checkpoint": path})

    def maybe_resume(self) -> bool:
        """Restores the newest complete checkpoint in ``checkpoint.dir`` that loads on every
        rank, if resuming is on.

        A complete checkpoint that does not verify or load (a file changed, truncated or
        deleted) is renamed aside (``step_N.corrupt-<time>``, kept to inspect) with a warning
        naming the file, and the next older one is tried: losing some steps beats losing the
        run, and the previous checkpoint is kept for this (``checkpoint.keep`` >= 2). With none
        loadable, raises naming the newest. Folders of interrupted writes are named and skipped.

        Never a silent fresh start: while ``dir`` holds checkpoints set aside and none that
        loads, every launch raises naming them, until the user starts from step 0 on purpose
        (``checkpoint.resume=false``, which names them in a warning) or moves them away.
        """
        root = self.cfg.checkpoint.dir
        if root is None:
            return False
        if not self.cfg.checkpoint.resume:
            if self.env.rank == 0 and (aside := checkpoint.set_aside(root)):
                logger.warning("starting from step 0 (checkpoint.resume=false); %s holds "
                               "checkpoints set aside as unreadable: %s", root, ", ".join(aside))
            return False
        found = checkpoint.latest(root)
        if self.env.rank == 0:
            for path in checkpoint.incomplete(root):
                logger.warning("skipping %s: no %s marker (its write was interrupted)", path,
                               checkpoint.MARKER)
        newest = found
        while found is not None:
            try:
                self.restore(found)
                return True
            except checkpoint.CheckpointUnreadable as e:
                if self.env.rank == 0:
                    moved = checkpoint.quarantine(found)
                    logger.warning("%s; %s; trying an older checkpoint", e,
                                   f"renamed to {moved}" if moved else "left in place")
            found = checkpoint.latest(root, before=found.step)
        aside = checkpoint.set_aside(root)
        if newest is None and not aside:
            return False
        raise checkpoint.CheckpointUnreadable(
            f"no complete checkpoint in {root} loads on every rank"
            + (f" (newest: {newest.path})" if newest else "")
            + (f"; set aside as unreadable: {', '.join(aside)}" if aside else "")
            + f"; {_FRESH_ON_PURPOSE}")

    def _agree_readable(self, found: checkpoint.CheckpointInfo,
                        error: Exception | None) -> None:
        """Collective: raises :class:`~.checkpoint.CheckpointUnreadable` on every rank, naming
        each failing rank's file and reason, if any rank failed to verify or read its part."""
        failed = self.control.failures(error, checkpoint.describe)
        if failed:
            raise checkpoint.CheckpointUnreadable(
                f"checkpoint {found.path} does not load: " + "; ".join(failed)) from error

    def restore(self, found: checkpoint.CheckpointInfo) -> None:
        """Loads a checkpoint into this trainer: model, optimizers, synchronizer, position.

        Every rank first verifies its share of the checkpoint's digests; any failure there
        raises :class:`~.checkpoint.CheckpointUnreadable` on every rank before anything is
        read. A file that still fails to read raises it too, before any state but the
        embedding tables changed. Raises :class:`~.checkpoint.CheckpointMismatch` at once (no
        fallback: older ones are no different) for a checkpoint of another world size.
        """
        self.wrapper.pause(consensus=False)
        error: Exception | None = None
        try:
            checkpoint.verify(found)
        except checkpoint.CheckpointMismatch:  # the same on every rank: no older one fits
            raise
        except Exception as e:  # corrupt or unreadable; all ranks learn of it just below
            error = e
        self._agree_readable(found, error)
        sharded = self._sharded_state()
        try:
            local = checkpoint.load(found, sharded)
        except Exception as e:
            error = e
        self._agree_readable(found, error)
        dense = dense_parameters(self.dmp)
        missing, unexpected = self.dmp.load_state_dict(sharded["model"], strict=False)
        if not set(missing) <= set(dense) or unexpected:  # the dense replica comes from local
            raise checkpoint.CheckpointMismatch(
                f"checkpoint {found.path} does not fit this model: missing "
                f"{sorted(set(missing) - set(dense))[:5]}, unexpected {sorted(unexpected)[:5]}")
        self.dmp.fused_optimizer.load_state_dict(sharded["sparse_optimizer"])
        with torch.no_grad():
            for name, p in dense.items():
                p.copy_(local["dense"][name])
        for name, opt in self.optimizer.optimizers:
            if name != "sparse":
                opt.load_state_dict(local["optimizers"][name])
        self.wrapper.load_state_dict(local["sync"])
        torch.set_rng_state(local["rng"])
        if "cuda_rng" in local and self.env.device.type == "cuda":
            torch.cuda.set_rng_state(local["cuda_rng"], self.env.device)
        self.position.load_state_dict(local)
        self.last_saved = self.step
        self.last_eval = int(local.get("last_eval", self.step))  # older checkpoints: done
        self.wrapper.resume()
        self._log({"step": self.step, "resumed_from": found.path})

    # ------------------------------------------------------------------ train
    def _segments(self) -> Iterator[Iterator[Batch]]:
        """The training stream from the current data position, cut where evaluations fall (the
        pipeline drains at each cut) and where the step budget ends."""
        budget, every = self.cfg.train.steps, self.cfg.eval.every_steps
        while self.position.epoch < self.cfg.train.epochs:
            stream = self.position.batches(self.dataset, self.cfg.train.batch_size,
                                           self.env.rank, self.env.world_size)
            while True:
                limits = [x for x in (
                    None if budget is None else budget - self.step,
                    None if every is None else every - self.step % every,
                ) if x is not None]
                if limits and min(limits) <= 0:
                    return
                segment = itertools.islice(stream, min(limits)) if limits else stream
                first = next(segment, None)
                if first is None:
                    break
                yield itertools.chain([first], segment)
            self.position.next_epoch()

    def _check_finite(self, where: str) -> None:
        """Collective: raises on every rank if the loss, the dense gradients or the dense
        optimizer's state went non-finite on any (see :func:`~.faults.raise_if_non_finite`)."""
        table = self.control.exchange(self.watch.first_steps(self.step))
        faults.raise_if_non_finite(table, faults.FiniteWatch.KINDS, self.env.rank, where)

    def _agree_to_stop(self, now: bool = True) -> bool:
        """Collective: fails every rank if any went non-finite; degrades a failed synchronizer
        on every rank at once, and says whether SIGTERM reached any rank (then every rank stops
        after this same step). One exchange carries all of it.

        With ``now`` false (the periodic check) the exchange runs in the background, so no
        step waits on it for the slowest rank: this call acts on the exchange the previous
        check started, and starts the next. A checkpoint, an evaluation and the end call with
        ``now`` (after acting on the one in flight), since they must not start on a rank that
        another has given up on.
        """
        self._next_control = self.step + self.cfg.train.control_every_steps  # until paced
        pending, self._control_pending = self._control_pending, None
        if pending is not None:
            started_after, result = pending
            if self._act_on_control(started_after, result()):
                return True
        # The optimizer's state (a full read of it) only where it must be known: not at every
        # periodic check, since what it finds stays until the next record.
        values = [self.domain.stop_requested(), self.wrapper.failed(),
                  *self.watch.first_steps(self.step if now else None), self._pace()]
        if now:
            return self._act_on_control(self.step, self.control.exchange(values))
        self._control_pending = (self.step, self.control.start_exchange(values))
        return False

    def _pace(self) -> float:
        """This rank's seconds a training step since the last check (0: no step since), and
        the clock restarted for the next."""
        since, before = self._control_clock
        now = time.perf_counter()
        self._control_clock = (now, self.step)
        return (now - since) / (self.step - before) if self.step > before else 0.0

    def _act_on_control(self, step: int, table: torch.Tensor) -> bool:
        """Acts on the control exchange made after ``step`` (see :meth:`_agree_to_stop`), and
        sets the next periodic check from the slowest rank's pace in it: the same step on
        every rank, since every rank reads the same table at the same step."""
        kinds = len(faults.FiniteWatch.KINDS)
        faults.raise_if_non_finite(table[:, 2:2 + kinds], faults.FiniteWatch.KINDS,
                                   self.env.rank, f"at the check after step {step}")
        every, floor_s = self.cfg.train.control_every_steps, self.cfg.train.control_min_interval_s
        slowest = float(table[:, -1].max())
        self._next_control = self.step + (every if floor_s is None or slowest <= 0
                                          else max(every, math.ceil(floor_s / slowest)))
        stop, sync_failed = (table[:, i].nonzero().flatten().tolist() for i in (0, 1))
        if sync_failed:
            self.wrapper.degrade(sync_failed)
        if stop and self.env.rank == 0:
            where = (f"checkpointing to {self.cfg.checkpoint.dir}" if self.cfg.checkpoint.dir
                     else "no checkpoint.dir: the work so far is lost")
            logger.warning("SIGTERM reached rank(s) %s: every rank stops after step %d; %s",
                           stop, self.step, where)
        return bool(stop)

    def _evaluate_if_due(self) -> None:
        """Evaluates and logs if ``eval.every_steps`` falls on this step and it was not done."""
        every = self.cfg.eval.every_steps
        if every and self.step % every == 0 and self.last_eval < self.step:
            metrics = self.evaluate()
            self._log({"step": self.step, **{f"eval_{k}": v for k, v in metrics.items()}})
            self.collector.collect_all()

    def train(self) -> dict[str, Any]:
        """Trains to ``train.steps`` (or the epochs' end) or until preempted; every rank.

        Raises :class:`~.faults.NonFiniteValue` if the run went non-finite. When another
        error ends training first (say the synchronizer found a non-finite replica) on a rank
        whose own loss or dense gradients had gone non-finite, that is what this rank reports,
        with the error as its cause. Likewise a failure of this rank's own synchronizer is
        reported rather than what it caused (a training collective broken when the peers that
        learned of it left). Whatever ends training early, the synchronizer is abandoned first
        (no collective), so its thread does not outlive training.
        """
        try:
            try:
                with self.collector:
                    return self._train()
            except BaseException:
                self.wrapper.abandon()
                raise
        except faults.NonFiniteValue:
            raise
        except Exception as e:
            seen = self.watch.local_message(self.env.rank, self.env.world_size)
            if seen is None:
                own = self.wrapper.sync_failure()
                if own is None or isinstance(e, SyncError) or faults.is_consequence(own):
                    raise
                raise own from e
            cls = faults.PeerNonFinite if faults.is_consequence(e) else faults.NonFiniteValue
            raise cls(f"{seen}; found on this rank when training failed with "
                      f"{type(e).__name__}: {e}") from e

    def _train(self) -> dict[str, Any]:
        cfg = self.cfg
        every_ckpt = cfg.checkpoint.every_steps
        show_bar = self.env.rank == 0 and cfg.logging.progress_bar and sys.stderr.isatty()
        bar = tqdm(total=self.console.total_steps, initial=self.step, disable=not show_bar,
                   unit="step", dynamic_ncols=True)
        self.console.start(self.step, progress_lines=not show_bar)
        self._last_record = (time.perf_counter(), self.step)
        self._next_control = self.step + cfg.train.control_every_steps
        self.dmp.train()
        train_time = 0.0
        steps_timed = 0
        losses: list[torch.Tensor] = []  # since the last record, summed there: no op a step
        preempted = False
        self._evaluate_if_due()  # resumed from a preemption that stopped before it
        segments = self._segments()
        while True:
            t_seg = time.perf_counter()  # before its first batch is read: that is training
            segment = next(segments, None)
            if segment is None:
                break
            self._control_clock = (t_seg, self.step)  # paces count training time only
            while True:
                try:
                    loss, logits, labels = self.pipeline.progress(segment)
                except StopIteration:
                    break
                with _phase("shadowsync.train.watch"):
                    self.watch.observe(self.step + 1, loss)
                    seen = self.watch.poll()
                if seen is not None and seen[0]:  # this rank's loss: fail now (peers learn it
                    # from the job's failure report); gradients wait for the exchange, where
                    # the loss that made them non-finite (DDP spreads it) is named first
                    raise faults.NonFiniteValue(
                        f"{self.watch.local_message(self.env.rank, self.env.world_size, seen)}"
                        "; found on this rank at once")
                with _phase("shadowsync.train.after_step"):
                    self.wrapper.after_step()
                self.position.advance()
                steps_timed += 1
                with _phase("shadowsync.train.metrics"):
                    self.metrics.add(logits, labels)
                    losses.append(loss.detach())
                with _phase("shadowsync.train.gc"):
                    self.collector.after_step(self.step)
                bar.update(1)
                if self.step % cfg.train.log_every == 0:
                    with _phase("shadowsync.train.log"):
                        self._check_finite(f"before the log of step {self.step}")
                        self._start_train_record(float(torch.stack(losses).mean()))
                    losses.clear()
                record = self._finish_train_record(wait=False)
                if record is not None:
                    bar.set_postfix(loss=f"{record['loss']:.4f}", ne=f"{record.get('ne', 0):.4f}",
                                    ex_s=f"{record['examples_per_s']:,.0f}")
                ckpt_due = every_ckpt is not None and self.step % every_ckpt == 0
                # Agree before anything that pauses the synchronizer, so no rank pauses a
                # runner that another rank has given up on.
                if ckpt_due or self.step >= self._next_control:
                    with _phase("shadowsync.train.control"):
                        preempted = self._agree_to_stop(now=ckpt_due)
                    if preempted:
                        break
                if ckpt_due:
                    train_time += time.perf_counter() - t_seg
                    self.save_checkpoint()
                    t_seg = time.perf_counter()
                    self._control_clock = (t_seg, self.step)
            self._finish_train_record()  # logged before what may fail the evaluation or end
            preempted = preempted or self._agree_to_stop()  # an evaluation or the end follows
            train_time += time.perf_counter() - t_seg
            if preempted:
                break
            self._evaluate_if_due()
        bar.close()
        self.wrapper.finish()
        self.save_checkpoint()
        final = {} if preempted else self.evaluate()
        examples = cfg.train.batch_size * self.env.world_size * steps_timed
        summary = {
            "step": self.step,
            **({"preempted": True} if preempted else {}),
            "examples_per_s": examples / max(train_time, 1e-9),
            "train_seconds": train_time,
            **{f"eval_{k}": v for k, v in final.items()},
            **{f"sync_{k}": v for k, v in self.wrapper.stats().items()},
        }
        self._log({"summary": True, **summary})
        return summary
