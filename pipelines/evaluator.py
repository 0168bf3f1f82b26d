"""Evaluation during training: exact metrics over the whole eval split, every rank's
predictions gathered, checked for non-finite values on every rank."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import torch
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from shadowsync.datasets import RecDataset
from shadowsync.pipelines import faults
from shadowsync.pipelines.build import DistEnv
from shadowsync.pipelines.config import RunConfig
from shadowsync.pipelines.metrics import gather_metrics
from shadowsync.sync.wrapper import DDPReplicas, LocalReplicas


class Evaluator:
    """Evaluates the trained model on ``eval.*``'s schedule (:meth:`due`), on the training
    pipeline (it drains first: the training stream is cut where evaluations fall).

    The synchronizer is paused with the final sync around it, so every rank evaluates one
    model. :attr:`last_step` is the step of the last evaluation (a checkpoint keeps it, so a
    resumed run does not evaluate a step twice).
    """

    def __init__(self, cfg: RunConfig, env: DistEnv, dataset: RecDataset,
                 dmp: DistributedModelParallel, pipeline: TrainPipelineSparseDist,
                 wrapper: LocalReplicas | DDPReplicas, control: faults.Control) -> None:
        self.cfg, self.env, self.dataset, self.dmp = cfg, env, dataset, dmp
        self.pipeline, self.wrapper, self.control = pipeline, wrapper, control
        self.last_step = 0

    def due(self, step: int) -> bool:
        """Whether ``eval.every_steps`` falls on ``step`` and it was not evaluated yet."""
        every = self.cfg.eval.every_steps
        return every is not None and every > 0 and step % every == 0 and self.last_step < step

    def evaluate(self, step: int) -> dict[str, float]:
        """Collective: exact metrics over the whole eval split after training step ``step``.
        Raises :class:`~.faults.NonFiniteValue` on every rank if any rank's predictions, or the
        metrics, are not finite."""
        self.wrapper.pause(consensus=True)
        self.dmp.eval()
        batches: Iterator[Batch] = self.dataset.eval_batches(
            self.cfg.eval.batch_size, self.env.rank, self.env.world_size)
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
        self.last_step = step
        empty = torch.empty(0, device=self.env.device)
        local = torch.cat(logits) if logits else empty
        finite = bool(torch.isfinite(local).all())
        where = f"in the evaluation after step {step}"
        faults.raise_if_non_finite(self.control.exchange([0 if finite else max(step, 1)]),
                                   ["eval predictions"], self.env.rank, where)
        metrics = gather_metrics(local, torch.cat(labels) if labels else empty)
        bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
        if bad:  # the same on every rank: computed from every rank's (finite) predictions
            raise faults.NonFiniteValue(
                f"non-finite eval metrics {bad} {where}, from finite predictions of every rank "
                f"(eval click rate {metrics['ctr']}, {metrics['examples']:.0f} examples)")
        return metrics
