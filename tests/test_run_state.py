"""What a checkpoint holds, by part: rank files of every layout read by part name."""

from __future__ import annotations

import torch

from shadowsync.pipelines.run_state import by_part


def test_a_rank_file_of_the_old_flat_layout_is_read_by_part() -> None:
    rng, cuda = torch.get_rng_state(), torch.zeros(3, dtype=torch.uint8)
    old = {"step": 7, "epoch": 1, "epoch_step": 3, "dense": {"w": torch.ones(2)},
           "optimizers": {"dense": {}}, "sync": {"strategy": {"rounds": 2}},
           "rng": rng, "cuda_rng": cuda, "last_eval": 5}
    parts = by_part(old)
    assert parts["position"] == {"step": 7, "epoch": 1, "epoch_step": 3}
    assert parts["rng"]["cpu"] is rng and parts["rng"]["cuda"] is cuda
    assert parts["evaluation"] == {"last_step": 5}
    assert parts["sync"] is old["sync"] and parts["dense"] is old["dense"]
    oldest = {k: v for k, v in old.items() if k not in ("last_eval", "cuda_rng")}
    assert by_part(oldest)["evaluation"] == {"last_step": 7}  # that step was evaluated
    assert "cuda" not in by_part(oldest)["rng"]
    assert by_part(parts) is parts  # today's layout, as it is
