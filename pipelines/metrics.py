"""Exact CTR metrics over the predictions of all ranks.

Normalized entropy (NE) is the log loss divided by the entropy of the base rate, so 1.0 is a
constant predictor that knows the click rate and lower is better (He et al., "Practical
lessons from predicting clicks on ads at Facebook", ADKDD 2014).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics.functional.classification import binary_auroc


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """AUC, log loss, NE, calibration (predicted / observed click rate) and the click rate."""
    if logits.numel() == 0 or logits.shape != labels.shape:
        raise ValueError(f"need equal non-empty logits/labels, got {logits.shape}/{labels.shape}")
    logits = logits.double()
    labels = labels.double()
    logloss = float(F.binary_cross_entropy_with_logits(logits, labels))
    ctr = float(labels.mean())
    base = -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr)) if 0 < ctr < 1 else float("nan")
    return {
        "auc": float(binary_auroc(logits, labels.long())),
        "logloss": logloss,
        "ne": logloss / base,
        "calibration": float(torch.sigmoid(logits).mean()) / ctr if ctr > 0 else float("nan"),
        "ctr": ctr,
        "examples": float(labels.numel()),
    }


def gather_metrics(
    logits: torch.Tensor, labels: torch.Tensor, group: dist.ProcessGroup | None = None
) -> dict[str, float]:
    """Gathers every rank's predictions (shares may differ in size) and computes the metrics
    once over all of them, so the numbers equal a direct computation on the whole split."""
    if not dist.is_initialized():
        return binary_metrics(logits, labels)
    world = dist.get_world_size(group)
    n = torch.tensor([logits.numel()], dtype=torch.long, device=logits.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    longest = int(max(int(s) for s in sizes))
    both = torch.zeros(2, longest, dtype=torch.float32, device=logits.device)
    both[0, : logits.numel()] = logits.float()
    both[1, : labels.numel()] = labels.float()
    parts = [torch.empty_like(both) for _ in range(world)]
    dist.all_gather(parts, both, group=group)
    pairs = [p[:, : int(s)] for p, s in zip(parts, sizes, strict=True)]
    merged = torch.cat(pairs, dim=1).cpu()
    return binary_metrics(merged[0], merged[1])
