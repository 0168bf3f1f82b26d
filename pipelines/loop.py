"""The train/eval loop (:class:`Trainer`): TorchRec's pipeline, the dense synchronizer's
lifecycle, and the parts that record, evaluate, checkpoint and agree, composed on the
schedule of a step."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from shadowsync.datasets import RecDataset
from shadowsync.pipelines import checkpoint
from shadowsync.pipelines.build import build_optimizer, build_sharded_model
from shadowsync.pipelines.collector import StepCollector
from shadowsync.pipelines.config import RunConfig, dump_config
from shadowsync.pipelines.console import ConsoleLog, planned_steps
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.control import ControlExchange, ControlGroup
from shadowsync.pipelines.errors import NonFiniteValue, PeerNonFinite, is_consequence
from shadowsync.pipelines.finite import FiniteWatch
from shadowsync.pipelines.holdout import Evaluator
from shadowsync.pipelines.logbook import Logbook
from shadowsync.pipelines.metrics import TrainingMetrics
from shadowsync.pipelines.position import DataPosition
from shadowsync.pipelines.run_state import (
    Checkpointer,
    CheckpointParts,
    DenseOptimizers,
    DenseReplica,
    RNGState,
    ShardedState,
)
from shadowsync.sync.errors import SyncError
from shadowsync.sync.wrapper import (
    DDPReplicas,
    LocalReplicas,
    build_replica_wrapper,
    dense_parameters,
)

__all__ = ["Trainer"]


class _Stopwatch:
    """Training seconds: the sum of the intervals from :meth:`start` to :meth:`stop`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.seconds = 0.0
        self.started = 0.0
        self._clock = clock

    def start(self) -> None:
        self.started = self._clock()

    def stop(self) -> None:
        self.seconds += self._clock() - self.started


class Trainer:
    """Trains on TorchRec's ``TrainPipelineSparseDist``, and evaluates, checkpoints and resumes.

    Composed of parts, each in its own module and built from the run's context
    (:class:`~.context.RunContext`): :class:`~.logbook.Logbook` (records, console,
    ``metrics.jsonl``), :class:`~.holdout.Evaluator`, :class:`~.run_state.Checkpointer` (what
    a checkpoint holds, asked of the parts that own it, and the ranks' agreement on which
    loads) and :class:`~.control.ControlExchange` (non-finite values, a failed synchronizer,
    stops). The dense synchronizer (the replica wrapper) sees the loop at four points:
    ``after_step`` between steps, ``pause``/``resume`` around every evaluation and checkpoint
    (with the final sync, so the model evaluated or saved is one model), and ``finish`` at the
    end.

    The schedule of a step, after ``TrainPipelineSparseDist.progress`` ran it (forward,
    backward, optimizer step; the next batch's input distribution already started):

    ==========================  ==============================================  ==========
    what                        when                                            collective
    ==========================  ==============================================  ==========
    finite watch                every step: this step's check queued, an        no
                                earlier one polled; a non-finite loss fails
    ``wrapper.after_step``      every step (ShadowSync adds a finished delta)    no
    metrics, collector          every step                                      no
    training record             ``train.log_every``: a finite check, then the   yes
                                metrics reduce in the background
    control check               ``train.control_every_steps`` (paced, in the    yes
                                background), and at once before a checkpoint
    checkpoint                  ``checkpoint.every_steps``                      yes
    ==========================  ==============================================  ==========

    The training stream is cut where evaluations fall and where ``train.steps`` ends; at each
    cut the pending record is logged and the ranks check at once, then evaluate if due. At the
    end the synchronizer finishes, a checkpoint is written and the model evaluated. Once
    SIGTERM reached any rank (:meth:`~.fault_domain.FaultDomain.install_sigterm_handler`),
    every rank stops after the same step, finishes the synchronizer, writes a checkpoint and
    returns a summary with ``preempted: True`` (no final evaluation).

    A run that goes non-finite fails (:class:`~.errors.NonFiniteValue`, naming the step, the
    rank and what): a rank whose own loss went non-finite fails at once (its peers stop with
    ``PeerFailed`` naming it); what the poll has not shown yet (on GPUs it lags a step or more),
    non-finite gradients and a dense optimizer state turned inf are compared across ranks at
    the next control check, record, checkpoint, evaluation or the end, where every rank raises
    and the earliest (step, then loss before gradients) is named. Nothing non-finite is
    logged, checkpointed or summarized.

    Args:
        ctx: the run: its settings, its place in the job, fault domain, callbacks and clock.
        dataset: what it trains and evaluates on.
        wrapper: the data-parallel wrapper to train with instead of the one ``sync.*`` names
            (``build_replica_wrapper(cfg.sync, ctx.domain)``), e.g. a benchmark's.

    Example::

        env = init_distributed(cfg.train.pg_timeout_s)
        trainer = Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name,
                                                                 **cfg.data.options))
        trainer.maybe_resume()
        summary = trainer.train()
    """

    def __init__(self, ctx: RunContext, dataset: RecDataset,
                 wrapper: LocalReplicas | DDPReplicas | None = None) -> None:
        cfg, env = ctx.cfg, ctx.env
        self.ctx, self.dataset = ctx, dataset
        self.wrapper = (build_replica_wrapper(cfg.sync, ctx.domain) if wrapper is None
                        else wrapper)
        self.dmp, self.plan = build_sharded_model(cfg, dataset.spec, env, self.wrapper)
        self.optimizer = build_optimizer(cfg, self.dmp)
        self.pipeline = TrainPipelineSparseDist(self.dmp, self.optimizer, env.device)
        self.position = DataPosition()
        self.collector = StepCollector(cfg.train.gc_every_steps)
        self.watch = FiniteWatch(list(dense_parameters(self.dmp).values()), env.device,
                                 self.optimizer)
        self._control = ControlGroup(cfg.train.pg_timeout_s)
        # Gloo, like the synchronizer's group: the metrics reduce from a thread of their own,
        # where NCCL beside the training loop's communicator is not safe.
        self._metrics_group = dist.new_group(
            backend="gloo", timeout=timedelta(seconds=cfg.train.pg_timeout_s))
        metrics = TrainingMetrics(cfg.logging.window_examples, env.world_size,
                                  self._metrics_group)
        console = ConsoleLog(planned_steps(cfg.train.steps, cfg.train.epochs, dataset,
                                           cfg.train.batch_size, env.world_size))
        self.log = Logbook(ctx, console, metrics, self.wrapper.stats)
        self.evaluator = Evaluator(ctx, dataset, self.dmp, self.pipeline, self._control)
        self.checkpoints = Checkpointer(ctx, CheckpointParts(
            sharded=ShardedState(self.dmp),
            local={"dense": DenseReplica(self.dmp), "optimizers": DenseOptimizers(self.optimizer),
                   "sync": self.wrapper, "rng": RNGState(env.device), "position": self.position,
                   "evaluation": self.evaluator},
            files={checkpoint.CONFIG: dump_config(cfg),
                   checkpoint.SPEC: json.dumps(dataclasses.asdict(dataset.spec))},
        ), self.wrapper, self._control)
        self.control = ControlExchange(ctx, self._control, self.watch, self.wrapper)

    @property
    def cfg(self) -> RunConfig:
        return self.ctx.cfg

    @property
    def step(self) -> int:
        """Training steps done (see :attr:`position`)."""
        return self.position.step

    def close(self) -> None:
        """Destroys the process groups this trainer made (the synchronizer's, the control and
        the metrics group); every rank, after :meth:`train` returned. After a failure, leave
        them: a destroy could wait on a peer that is gone (the process exits instead)."""
        self.wrapper.close()
        dist.destroy_process_group(self._control.group)
        dist.destroy_process_group(self._metrics_group)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()

    def maybe_resume(self) -> bool:
        """Collective: restores the newest checkpoint that loads on every rank, if any
        (:meth:`~.run_state.Checkpointer.maybe_resume`); whether one was."""
        found = self.checkpoints.maybe_resume()
        if found is not None:
            self.log.log({"step": self.step, "resumed_from": found.path})
        return found is not None

    def restore(self, found: checkpoint.CheckpointInfo) -> None:
        """Collective: restores ``found`` (:meth:`~.run_state.Checkpointer.restore`)."""
        self.checkpoints.restore(found)
        self.log.log({"step": self.step, "resumed_from": found.path})

    def _save(self) -> None:
        """Collective: the checkpoint of this step, unless written or there is no
        ``checkpoint.dir``."""
        path = self.checkpoints.save(self.step)
        if path is not None:
            self.log.log({"step": self.step, "checkpoint": path})

    def evaluate(self) -> dict[str, float]:
        """Collective: the model of this step on the eval split, the replicas held still
        (paused with the final sync) meanwhile (:meth:`~.holdout.Evaluator.evaluate`)."""
        with self._held(consensus=True):
            return self.evaluator.evaluate(self.step)

    @contextlib.contextmanager
    def _held(self, consensus: bool) -> Iterator[None]:
        """The replicas hold still (one model, with ``consensus``) while what is inside runs;
        they resume after it, unless it raised (training then ends)."""
        self.wrapper.pause(consensus)
        yield
        self.wrapper.resume()

    def train(self) -> dict[str, Any]:
        """Trains to ``train.steps`` (or the epochs' end) or until preempted; every rank.

        Raises :class:`~.errors.NonFiniteValue` if the run went non-finite. When another
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
        except NonFiniteValue:
            raise
        except Exception as e:
            seen = self.watch.local_message(self.ctx.env.rank, self.ctx.env.world_size)
            if seen is None:
                own = self.wrapper.sync_failure()
                if own is None or isinstance(e, SyncError) or is_consequence(own):
                    raise
                raise own from e
            cls = PeerNonFinite if is_consequence(e) else NonFiniteValue
            raise cls(f"{seen}; found on this rank when training failed with "
                      f"{type(e).__name__}: {e}") from e

    # ------------------------------------------------------------------ the schedule
    def _train(self) -> dict[str, Any]:
        """Trains from the current position on the schedule of the class docstring's table;
        returns the summary."""
        first_step, clock, preempted = self.step, _Stopwatch(self.ctx.clock), False
        self.log.open(self.step)
        self.control.start(self.step)
        self.dmp.train()
        self.ctx.callbacks.train_start(self)
        self._evaluate_if_due()  # resumed from a preemption that stopped before it
        segments = self._segments()
        while not preempted:
            clock.start()  # before the segment's first batch is read: that is training
            segment = next(segments, None)
            if segment is None:
                break
            self.control.restart_pace(self.step, clock.started)
            preempted = self._train_segment(segment, clock)
            self.log.finish()  # logged before what may fail the evaluation or the end
            preempted = preempted or self.control.agree(self.step)  # an evaluation or the end
            clock.stop()
            if not preempted:
                self._evaluate_if_due()
        return self._end(preempted, clock.seconds, self.step - first_step)

    def _train_segment(self, segment: Iterator[Batch], clock: _Stopwatch) -> bool:
        """Trains on ``segment`` step by step; True once the ranks agreed to stop."""
        for loss, logits, labels in self._progress(segment):
            self._after_step(loss, logits, labels)
            checkpoint_due = self.checkpoints.due(self.step)
            # Agree before anything that pauses the synchronizer, so no rank pauses a runner
            # that another rank has given up on.
            if checkpoint_due or self.control.due(self.step):
                with self.ctx.callbacks.phase("shadowsync.train.control"):
                    if self.control.agree(self.step, now=checkpoint_due):
                        return True
            if checkpoint_due:
                clock.stop()
                self._save()
                clock.start()
                self.control.restart_pace(self.step, clock.started)
        return False

    def _progress(self, segment: Iterator[Batch],
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """TorchRec's pipeline, a training step at a time, until ``segment`` runs out."""
        while True:
            try:
                yield self.pipeline.progress(segment)
            except StopIteration:
                return

    def _after_step(self, loss: torch.Tensor, logits: torch.Tensor,
                    labels: torch.Tensor) -> None:
        """What follows a training step, up to its record: the rows of the table above the
        control check."""
        phase = self.ctx.callbacks.phase
        with phase("shadowsync.train.watch"):
            self.watch.observe(self.step + 1, loss)
            seen = self.watch.poll()
        if seen is not None and seen[0]:  # this rank's loss: fail now (peers learn it from the
            # job's failure report); gradients wait for the exchange, where the loss that made
            # them non-finite (DDP spreads it) is named first
            raise NonFiniteValue(
                f"{self.watch.local_message(self.ctx.env.rank, self.ctx.env.world_size, seen)}"
                "; found on this rank at once")
        with phase("shadowsync.train.after_step"):
            self.wrapper.after_step()
        self.position.advance()
        with phase("shadowsync.train.metrics"):
            self.log.add(loss, logits, labels)
        with phase("shadowsync.train.gc"):
            self.collector.after_step(self.step)
        self.ctx.callbacks.step_end(self.step)
        if self.step % self.cfg.train.log_every == 0:
            with phase("shadowsync.train.log"):
                self.control.check_finite(self.step, f"before the log of step {self.step}")
                self.log.start(self.step)
        self.log.poll()

    def _segments(self) -> Iterator[Iterator[Batch]]:
        """The training stream from the current data position, cut where evaluations fall (the
        pipeline drains at each cut) and where the step budget ends."""
        budget, every = self.cfg.train.steps, self.cfg.eval.every_steps
        while self.position.epoch < self.cfg.train.epochs:
            stream = self.position.batches(self.dataset, self.cfg.train.batch_size,
                                           self.ctx.env.rank, self.ctx.env.world_size)
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

    def _evaluate_if_due(self) -> None:
        """Evaluates and logs if ``eval.every_steps`` falls on this step and it was not done."""
        if self.evaluator.due(self.step):
            metrics = self.evaluate()
            self.log.log({"step": self.step, **{f"eval_{k}": v for k, v in metrics.items()}})
            self.collector.collect_all()

    def _end(self, preempted: bool, train_s: float, steps: int) -> dict[str, Any]:
        """The synchronizer's final sync, a last checkpoint, the final evaluation (not after a
        stop) and the summary of the ``steps`` trained in ``train_s`` seconds."""
        self.wrapper.finish()
        self._save()
        final = {} if preempted else self.evaluate()
        examples = self.cfg.train.batch_size * self.ctx.env.world_size * steps
        summary = {
            "step": self.step,
            **({"preempted": True} if preempted else {}),
            "examples_per_s": examples / max(train_s, 1e-9),
            "train_seconds": train_s,
            **{f"eval_{k}": v for k, v in final.items()},
            **{f"sync_{k}": v for k, v in self.wrapper.stats().items()},
        }
        self.log.log({"summary": True, **summary})
        self.log.close()
        return summary
