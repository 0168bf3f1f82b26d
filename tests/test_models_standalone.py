"""``shadowsync.models`` stands alone: the zoo builds and runs every registered model with
``shadowsync.pipelines`` unimportable (pipelines import models, never the reverse)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.test_sync_standalone import REPO, blocking

pytestmark = pytest.mark.slow  # a subprocess

_ZOO = """
import json, torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from shadowsync.datasets import DataSpec
from shadowsync.models import MODELS, RecTrain, build_model
from shadowsync.models.zoo import sparse_modules

spec = DataSpec(dense_names=["d0", "d1", "d2"], sparse_names=["s0", "s1"], num_embeddings=[7, 5])
batch = Batch(
    dense_features=torch.randn(4, 3),
    sparse_features=KeyedJaggedTensor.from_lengths_sync(
        keys=["s0", "s1"], values=torch.tensor([0, 6, 3, 1, 2, 4, 0, 4, 1]),
        lengths=torch.tensor([1, 2, 1, 0, 1, 1, 2, 1])),
    labels=torch.tensor([0, 1, 1, 0]),
)
built = {}
for name in MODELS.names():
    model = build_model(MODELS.get(name)(), spec, torch.device("cpu"), seed=0)
    assert isinstance(model, RecTrain), name
    loss, (_, logits, _) = model(batch)
    built[name] = {"loss": loss.item(), "logits": list(logits.shape),
                   "tables": sum(len(m.embedding_bag_configs()) for m in sparse_modules(model))}
loaded = sorted(m for m in sys.modules if m.startswith("shadowsync.pipelines"))
print(json.dumps({"built": built, "pipelines": loaded}))
"""


def test_the_zoo_builds_every_model_without_the_pipeline() -> None:
    code = blocking("shadowsync.pipelines") + textwrap.dedent(_ZOO)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["pipelines"] == []
    assert set(result["built"]) == {"autoint", "dcn", "deepfm", "dlrm", "dlrm_projection",
                                    "wide_deep"}
    for name, model in result["built"].items():
        assert model["logits"] == [4], name
        assert model["tables"] >= 2, name  # one per sparse feature at least
        assert 0 < model["loss"] < 10, name  # a finite BCE of a fresh model
