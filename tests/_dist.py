"""Test-only settings shared by the test files: :data:`SMALL`, the synthetic job at test size.
(Spawning gloo worlds is :mod:`shadowsync.testing`'s.)"""

from __future__ import annotations

__all__ = ["SMALL"]

# The synthetic job at test size (26 tables of 1,000 rows, batches of 128, 2 eval batches), for
# every test that launches the real training CLI.
SMALL = [
    "--config", "synthetic",
    "data.options.num_embeddings=1000",
    "train.batch_size=128",
    "model.embedding_dim=8",
    "model.dense_arch_layer_sizes=[16,8]",
    "eval.batch_size=1024",
    "eval.max_batches=2",
    "eval.every_steps=null",
    "train.log_every=1000",
]
