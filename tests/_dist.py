"""Test-only settings shared by the test files: :data:`SMALL`, the synthetic job at test size.

``run_ranks`` and ``free_port`` live in :mod:`shadowsync.testing`; they are re-exported here for
the files that still import them from this module.
"""

from __future__ import annotations

from shadowsync.testing import free_port, run_ranks

__all__ = ["SMALL", "free_port", "run_ranks"]

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
