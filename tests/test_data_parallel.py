"""Tables sharded ``data_parallel`` get the gradients of an unsharded model.

fbgemm warns in backward that its dense lookup has no autograd kernel and "may lead to silently
incorrect behavior"; the job silences that warning, so this test shows it is harmless here: the
sharded lookup (the path that warns) gives, after TorchRec's allreduce, the gradient of the mean
loss over every rank's batch in a plain ``EmbeddingBagCollection`` holding the same weights.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from shadowsync.datasets import build_dataset
from shadowsync.models import build_model
from shadowsync.pipelines.build import (
    build_sharded_model,
    init_distributed,
    plan_ranks,
)
from shadowsync.pipelines.config import RunConfig, load_config
from shadowsync.sync.wrapper import build_replica_wrapper, data_parallel_table_parameters
from shadowsync.testing import run_ranks

pytestmark = pytest.mark.slow  # spawns ranks

FBGEMM_WARNING = "fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel"
OVERRIDES = [
    "data.options.num_embeddings=500",
    "train.batch_size=64",
    "model.embedding_dim=8",
    "model.dense_arch_layer_sizes=[16, 8]",
    "sharding.types=[data_parallel]",
    "sharding.compute_kernel=dense",
    "sync.strategy.name=none",
]


def _config() -> RunConfig:
    return load_config("synthetic", OVERRIDES)


def _sharded_grads(rank: int, world_size: int) -> dict[str, Any]:
    env = init_distributed(60)
    cfg = _config()
    dataset = build_dataset(cfg.data.name, **cfg.data.options)
    dmp, plan = build_sharded_model(cfg, dataset.spec, env, build_replica_wrapper(cfg.sync))
    tables = data_parallel_table_parameters(dmp)
    weights = {name: p.detach().clone() for name, p in tables.items()}
    batch = next(iter(dataset.train_batches(cfg.train.batch_size, rank, world_size)))
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")  # the warning the job silences must come up here
        dmp(batch)[0].backward()
    grads = {name: p.grad.clone() for name, p in tables.items()}
    with warnings.catch_warnings(record=True) as quiet:  # the job's filters, as installed
        dmp(batch)[0].backward()
    return {
        "plan": {kind for kind, _ in plan_ranks(plan).values()},
        "weights": weights,
        "grads": grads,
        "shown": [str(w.message) for w in shown],
        "quiet": [str(w.message) for w in quiet],
    }


def test_data_parallel_table_gradients_match_an_unsharded_model() -> None:
    results = run_ranks(_sharded_grads, timeout_s=180)
    cfg = _config()
    dataset = build_dataset(cfg.data.name, **cfg.data.options)
    spec = dataset.spec
    reference = build_model(cfg.model, spec, torch.device("cpu"), seed=cfg.train.seed)
    params = dict(reference.named_parameters())
    first = results[0]
    assert first["plan"] == {"data_parallel"}
    assert len(first["grads"]) == len(spec.sparse_names)
    with torch.no_grad():
        for name, weight in first["weights"].items():
            params[name].copy_(weight)
    losses = [reference(next(iter(dataset.train_batches(cfg.train.batch_size, r, 2))))[0]
              for r in range(2)]
    (sum(losses) / 2).backward()
    for result in results:
        assert any(FBGEMM_WARNING in m for m in result["shown"]), result["shown"]
        assert not any(FBGEMM_WARNING in m for m in result["quiet"]), result["quiet"]
        for name, grad in result["grads"].items():
            expected = params[name].grad
            assert expected is not None and expected.abs().max() > 0, name
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-9, msg=name)
