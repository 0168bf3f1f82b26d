"""Evaluation on the held-out (eval) split during training: exact metrics over the whole
split, every rank's predictions gathered, checked for non-finite values on every rank."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import torch
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from shadowsync.datasets import RecDataset
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.control import ControlGroup
from shadowsync.pipelines.errors import NonFiniteValue
from shadowsync.pipelines.finite import raise_if_non_finite
from shadowsync.pipelines.metrics import gather_metrics


class Evaluator:
    """Evaluates the trained model on ``eval.*``'s schedule (:meth:`due`), on the training
    pipeline (it drains first: the training stream is cut where evaluations fall).

    The caller holds the replicas still (paused with the final sync), so every rank evaluates
    one model. :attr:`last_step` is the step of the last evaluation, its checkpoint state (a
    resumed run does not evaluate a step twice).

    Args:
        ctx: the run (``eval.*``, this rank's place in the world).
        dataset: whose eval split is read.
        dmp: the model, put in eval mode while evaluating.
        pipeline: the training pipeline, which runs the eval batches.
        control: where the ranks agree that every prediction is finite.
    """

    def __init__(self, ctx: RunContext, dataset: RecDataset, dmp: DistributedModelParallel,
                 pipeline: TrainPipelineSparseDist, control: ControlGroup) -> None:
        self.cfg, self.env, self.dataset, self.dmp = ctx.cfg, ctx.env, dataset, dmp
        self.pipeline, self.control = pipeline, control
        self.last_step = 0

    def due(self, step: int) -> bool:
        """Whether ``eval.every_steps`` falls on ``step`` and it was not evaluated yet."""
        every = self.cfg.eval.every_steps
        return every is not None and every > 0 and step % every == 0 and self.last_step < step

    def evaluate(self, step: int) -> dict[str, float]:
        """Collective: exact metrics over the whole eval split after training step ``step``.
        Raises :class:`~.errors.NonFiniteValue` on every rank if any rank's predictions, or the
        metrics, are not finite."""
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
        self.last_step = step
        empty = torch.empty(0, device=self.env.device)
        local = torch.cat(logits) if logits else empty
        finite = bool(torch.isfinite(local).all())
        where = f"in the evaluation after step {step}"
        raise_if_non_finite(self.control.exchange([0 if finite else max(step, 1)]),
                            ["eval predictions"], self.env.rank, where)
        metrics = gather_metrics(local, torch.cat(labels) if labels else empty)
        bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
        if bad:  # the same on every rank: computed from every rank's (finite) predictions
            raise NonFiniteValue(
                f"non-finite eval metrics {bad} {where}, from finite predictions of every rank "
                f"(eval click rate {metrics['ctr']}, {metrics['examples']:.0f} examples)")
        return metrics

    def state_dict(self) -> dict[str, int]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.last_step = int(state["last_step"])
