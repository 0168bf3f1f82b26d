"""The GPU check's CPU dry run: every check whose logic runs without CUDA passes at small
sizes, and without CUDA the default run says it skipped. CI has no GPU; this keeps the script
a lent GPU machine runs from rotting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shadowsync.benchmarks.gpu_check", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_every_check_passes_its_cpu_dry_run() -> None:
    run = _gpu_check("--device", "cpu")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    status = {line.split()[1].rstrip(":"): line.split()[0] for line in run.stdout.splitlines()
              if line.startswith(("PASS ", "SKIP ", "FAIL "))}
    # the CUDA-only checks run their logic on CPU, and only their verdict waits for a GPU
    assert status == {"equivalence": "PASS", "cycles": "PASS", "fence": "SKIP",
                      "audit": "SKIP", "failure": "PASS", "memory": "SKIP"}, run.stdout
    assert "cpu: 6/6 checks without failure" in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real check")
def test_without_cuda_the_default_run_skips() -> None:
    run = _gpu_check()
    assert (run.returncode, run.stdout.strip()) == (0, "skipped: no CUDA"), run.stderr
