"""``shadowsync.sync`` stands alone: its config imports without torch, and ShadowSync runs on a
plain PyTorch model over ``torch.distributed`` with the pipeline and TorchRec unimportable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.utils.distributed import get_free_port

REPO = Path(__file__).resolve().parents[1]


def blocking(*packages: str) -> str:
    """Code that makes importing ``packages`` (and their submodules) fail in the interpreter
    that runs it, so a test shows what a package imports without them."""
    return textwrap.dedent(f"""
        import importlib.abc, sys

        class _Blocked(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if any(name == p or name.startswith(p + ".") for p in {packages!r}):
                    raise ImportError(f"{{name}} is blocked in this test")
                return None

        sys.meta_path.insert(0, _Blocked())
    """)


_BLOCK = blocking("torchrec", "shadowsync.pipelines")

# The README's example of ShadowSync on a plain PyTorch model, as each rank runs it.
_EXAMPLE = """
import torch, torch.distributed as dist
from shadowsync.sync import (ModelAveraging, ReplicaSet, ShadowSyncRunner, broadcast_,
                             new_sync_group)

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())  # different data and initial weights on each rank
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
params = list(model.parameters())
broadcast_(params)
runner = ShadowSyncRunner(ReplicaSet(params, ModelAveraging()), new_sync_group("gloo"))
runner.start()
for _ in range(300):
    x = torch.randn(32, 8)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward(); optimizer.step(); optimizer.zero_grad()
    runner.step()
runner.stop()
stats = runner.stats()
loaded = [m for m in sys.modules if m.startswith(("torchrec", "shadowsync.pipelines"))]
print(json.dumps({"rounds": stats.rounds, "loss": loss.item(), "blocked": loaded,
                  "params": [p.detach().flatten().tolist() for p in params]}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_config_imports_without_torch() -> None:
    code = _BLOCK + textwrap.dedent("""
        from shadowsync.sync.config import ALGORITHMS, SyncConfig
        cfg = SyncConfig.from_dict({"strategy": {"name": "bmuf"},
                                    "schedule": {"mode": "fixed_rate", "period": 4}})
        cfg.validate()
        assert "torch" not in sys.modules, "shadowsync.sync.config imported torch"
        print(ALGORITHMS.names())
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['bmuf', 'ddp', 'easgd', 'ma', 'none', 'torch_averager']"


@pytest.mark.slow
def test_shadow_sync_on_a_plain_pytorch_model() -> None:
    port = get_free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-c", "import json\n" + _BLOCK + _EXAMPLE], cwd=REPO,
        env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        assert r["blocked"] == [], r["blocked"]
        assert r["rounds"] >= 5, r["rounds"]  # synchronized in the background, many times
        assert r["loss"] < 1.0, r["loss"]  # and learned (the target's variance is 8)
    assert results[0]["params"] == results[1]["params"]  # the final sync: one model


def test_a_strategy_of_ones_own_by_import_path() -> None:
    """``sync.strategy.name: module:Class`` with ``options`` of its own, read into the dataclass
    its ``from_config`` annotates them with and checked like any setting."""
    from shadowsync.sync.config import SyncConfig
    from shadowsync.sync.strategies import ElasticAveraging, ModelAveraging, make_strategy

    def config(name: str, **options: object) -> SyncConfig:
        return SyncConfig.from_dict({"strategy": {"name": name, "options": options},
                                     "transport": {"wire_dtype": "bfloat16"}})

    cfg = config("shadowsync.sync.strategies:ElasticAveraging", alpha=0.3)
    cfg.validate()
    strategy = make_strategy(cfg)
    assert isinstance(strategy, ElasticAveraging) and strategy.alpha == 0.3
    assert strategy.wire_dtype is torch.bfloat16
    with pytest.raises(ValueError, match=r"sync.strategy.options.alpha must be in \(0, 1\]"):
        config("shadowsync.sync.strategies:ElasticAveraging", alpha=2.0).validate()
    with pytest.raises(ValueError, match="unknown setting sync.strategy.options.beta"):
        config("shadowsync.sync.strategies:ElasticAveraging", beta=0.3).validate()
    assert isinstance(make_strategy(config("shadowsync.sync.strategies:ModelAveraging")),
                      ModelAveraging)
    with pytest.raises(ValueError, match="sync.strategy.options: 'shadowsync.sync.strategies:"
                                         "ModelAveraging' takes no options"):
        config("shadowsync.sync.strategies:ModelAveraging", alpha=0.3).validate()
    with pytest.raises(ValueError, match="sync.strategy.name: cannot import 'no_such.mod:Avg'"):
        config("no_such.mod:Avg").validate()
    with pytest.raises(ValueError, match="sync.strategy.name: unknown strategy 'no-colon'"):
        config("no-colon").validate()
