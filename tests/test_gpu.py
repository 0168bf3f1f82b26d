"""The runners' CUDA stream path: every check of ``tests/gpu_checks.py`` on a GPU, and its CPU
dry run. On a machine with CUDA: ``pytest -m gpu tests/test_gpu.py -s`` (each check prints its
table of cases; ``scripts/gpu_tests.sh`` is that command for a bare copy of the repository).
Without CUDA the GPU runs skip, and the dry runs (slow tier) keep the checks from rotting: CI
has no GPU."""

from __future__ import annotations

import time

import pytest
import torch

from tests.gpu_checks import BUDGET_S, CHECKS, CPU_SIZES, GPU_SIZES, Check, run_check, table

_BEGAN = time.monotonic()  # the checks share one budget, as one call of a lent GPU machine

KINDS = [
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA: the GPU checks need a GPU")]),
    pytest.param("cpu", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_gpu_check(check: Check, kind: str) -> None:
    """On CUDA every measure of the check is within its limit; on CPU the checks that mean
    something there are too, and the CUDA-only ones run their logic without failing."""
    left = BUDGET_S - (time.monotonic() - _BEGAN)
    if left < 10:
        pytest.fail("not run: the GPU checks' time budget is spent")
    outcome = run_check(check, kind, GPU_SIZES if kind == "cuda" else CPU_SIZES,
                        min(check.timeout_s, left))
    print(table([outcome]))
    expected = "SKIP" if kind == "cpu" and check.cuda_only else "PASS"
    assert outcome.status == expected, outcome.reason
