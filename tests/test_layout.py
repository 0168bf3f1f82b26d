"""Replica groups (``sharding.group_size``): the layout's checks, and 4 gloo ranks in 2 groups
of 2 whose embedding shards and dense replicas the synchronizer keeps in step."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from shadowsync.datasets import build_dataset
from shadowsync.pipelines.build import check_sharding
from shadowsync.pipelines.callbacks import TrainCallback
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.layout import ReplicaGroups
from shadowsync.pipelines.train import Trainer, init_distributed, plan_ranks
from shadowsync.sync import rows
from shadowsync.sync.wrapper import dense_parameters, embedding_shards
from shadowsync.testing import run_ranks
from tests.test_train import SMALL

STEPS = 24
TINY = [o for o in SMALL if not o.startswith("data.options.num_train_examples")] + [
    f"data.options.num_train_examples={STEPS * 256 * 4}", "data.options.num_eval_examples=4096",
    "eval.batch_size=512", "sharding.group_size=2", "sharding.types=[table_wise]"]


def test_group_sizes_that_divide_the_job_make_contiguous_groups() -> None:
    groups = ReplicaGroups.of(2, 4, 2)
    assert (groups.count, groups.whole) == (2, False)
    assert groups.shard_ranks(3) == [2, 3] and groups.replica_ranks(3) == [1, 3]
    assert groups.replica_partition == [[0, 2], [1, 3]]
    assert ReplicaGroups.of("local", 8, 4).size == 4
    assert ReplicaGroups.of(None, 4, 2).whole and ReplicaGroups.of(4, 4, 4).whole


@pytest.mark.parametrize(("size", "world", "local", "message"), [
    (3, 4, 4, "sharding.group_size=3 must divide the job's 4 ranks"),
    (8, 4, 4, "sharding.group_size=8 must divide the job's 4 ranks"),
    ("local", 6, 4, "sharding.group_size=4 ('local': 4 ranks a host) must divide the job's 6"),
    (0, 4, 4, "sharding.group_size: expected a positive number of ranks or 'local', got 0"),
])
def test_a_layout_that_does_not_divide_the_job_is_refused_in_one_line(
        size: int | str, world: int, local: int, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        ReplicaGroups.of(size, world, local)


@pytest.mark.parametrize(("overrides", "message"), [
    (["sync.strategy.name=ddp"], "needs a ShadowSync strategy .or none. to keep the groups' "
                                 "replicas in step, not sync.strategy=ddp"),
    (["sync.strategy.name=ma", "sharding.types=[data_parallel]"],
     r"sharding.types: \['data_parallel'\] cannot shard inside replica groups"),
    (["sync.strategy.name=ma", "sharding.types=[table_column_wise]"],
     r"sharding.types: \['table_column_wise'\] cannot shard inside replica groups"),
    (["sharding.group_size=3"], "must divide the job's 4 ranks"),
])
def test_check_sharding_refuses_what_replica_groups_cannot_run(overrides: list[str],
                                                               message: str) -> None:
    cfg = load_config("synthetic", SMALL + ["sharding.group_size=2", *overrides])
    spec = build_dataset(cfg.data.name, **cfg.data.options).spec
    with pytest.raises(ValueError, match=message):
        check_sharding(cfg, spec, 4, torch.device("cpu"), 2)


def test_config_refuses_a_group_size_below_one() -> None:
    with pytest.raises(ValueError, match="sharding.group_size: expected a positive"):
        load_config("synthetic", ["sharding.group_size=0"])


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


class _EveryThirdStep(TrainCallback):
    """This rank's dense replica and embedding shards after every third step."""

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_train_start(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def on_step_end(self, step: int) -> None:
        assert self.trainer is not None
        if step % 3 == 0:
            dmp = self.trainer.dmp
            self.seen.append((_flat(list(dense_parameters(dmp).values())),
                              _flat(embedding_shards(dmp))))


def _train(rank: int, world_size: int, overrides: list[str]) -> dict[str, Any]:
    env = init_distributed(60)
    cfg = load_config("synthetic", TINY + overrides)
    every_step = _EveryThirdStep()
    trainer = Trainer(RunContext.of(cfg, env, callbacks=[every_step]),
                      build_dataset(cfg.data.name, **cfg.data.options))
    first_shards = [w.clone() for w in embedding_shards(trainer.dmp)]
    summary = trainer.train()
    dense = torch.cat([p.detach().flatten() for p in dense_parameters(trainer.dmp).values()])
    shards = torch.cat([w.detach().flatten() for w in embedding_shards(trainer.dmp)])
    return {"summary": summary, "dense": dense, "shards": shards, "plan": plan_ranks(trainer.plan),
            "seen": every_step.seen,
            "moved": float((shards - torch.cat([w.flatten() for w in first_shards])).abs().max())}


FIXED_RATE_1 = ["sync.strategy.name=ma", "sync.schedule.mode=fixed_rate",
                "sync.schedule.period=1"]


@pytest.mark.parametrize("overrides", [
    FIXED_RATE_1,
    [*FIXED_RATE_1, "sync.transport.two_level=false"],
    [*FIXED_RATE_1, "sync.transport.wire_dtype=int8"],
    ["sync.strategy.name=easgd", "sync.strategy.alpha=0.2", "sync.schedule.mode=shadow"],
], ids=["fixed rate k=1", "fixed rate k=1, one ring", "fixed rate k=1, int8", "shadow easgd"])
def test_two_groups_of_two_shard_inside_a_group_and_end_identical(overrides: list[str]) -> None:
    """Each group holds every table once (on its own ranks); training moves the shards; at the
    end (the synchronizer's consensus) every replica of every shard and of the dense part is
    identical bitwise, and the model learned the planted signal; on an int8 wire too (the
    shards and their optimizer state go whole, quantized, the dense part in two levels)."""
    results = run_ranks(functools.partial(_train, overrides=overrides), world_size=4, timeout_s=240)
    plans = [r["plan"] for r in results]
    for rank, plan in enumerate(plans):
        group = [0, 1] if rank < 2 else [2, 3]
        assert all(set(ranks) <= set(group) for _, ranks in plan.values()), plan
        assert {r for _, ranks in plan.values() for r in ranks} == set(group)
    for r in results:
        assert torch.equal(r["dense"], results[0]["dense"])
        assert r["moved"] > 0
    assert torch.equal(results[0]["shards"], results[2]["shards"])
    assert torch.equal(results[1]["shards"], results[3]["shards"])
    assert results[0]["summary"]["eval_auc"] > 0.6, results[0]["summary"]
    seen = list(zip(*(r["seen"] for r in results), strict=True))
    assert len(seen) == STEPS // 3
    # After a round, replica x holds x + (mean - x): the mean up to float32 rounding.
    close = functools.partial(torch.testing.assert_close, rtol=1e-6, atol=1e-6)
    if "sync.schedule.period=1" in overrides:  # a round after every step: identical after each
        for at in seen:
            for rank in (1, 2, 3):
                close(at[rank][0], at[0][0])
            close(at[2][1], at[0][1])
            close(at[3][1], at[1][1])
    else:  # in the background: replicas apart while training
        assert any(not torch.allclose(at[0][1], at[2][1], rtol=1e-4, atol=1e-4) for at in seen)


def test_without_synchronization_the_groups_replicas_drift_apart() -> None:
    """The control: with ``sync.strategy=none`` each group trains alone, so the replicas of a
    shard (and the dense replicas) end apart."""
    results = run_ranks(functools.partial(_train, overrides=["sync.strategy.name=none"]),
                        world_size=4, timeout_s=240)
    assert not torch.equal(results[0]["shards"], results[2]["shards"])
    assert not torch.equal(results[0]["dense"], results[1]["dense"])


def _failing_embedding_round(rank: int, world_size: int, on_failure: str) -> dict[str, Any]:
    """Rank 2's embedding round raises in its third round (the dense set's rounds run)."""
    env = init_distributed(60)
    cfg = load_config("synthetic", TINY + [
        "sync.strategy.name=ma", "sync.schedule.mode=shadow", "sync.schedule.max_staleness=1",
        "sync.failure.timeout_s=10", f"sync.failure.on_failure={on_failure}",
        "sync.failure.rejoin_after_steps=4", "train.control_every_steps=2"])
    trainer = Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name, **cfg.data.options))
    runner = trainer.wrapper.runner  # type: ignore[attr-defined]
    embedding = [r for r in runner.replicas if r.name == "embedding"]
    assert len(embedding) == 1 and embedding[0].rows  # model averaging goes by rows
    if rank == 2:
        calls, changed = [0], rows.changed_rows

        def failing(*args: Any) -> torch.Tensor:
            calls[0] += 1
            if calls[0] == 5:  # the shards' exchange of the third round
                raise RuntimeError("injected embedding round failure")
            return changed(*args)

        rows.changed_rows = failing  # type: ignore[assignment]
    try:
        summary = trainer.train()
    except Exception as e:  # noqa: BLE001 (what each rank raised is the result)
        # stay until every rank has its error: a rank that left would close its sockets
        # under a peer still waiting for its abort round
        store = dist.distributed_c10d._get_default_store()
        store.set(f"failed {rank}", "1")
        store.wait([f"failed {r}" for r in range(world_size)], timedelta(seconds=60))
        return {"raised": f"{type(e).__name__}: {e}"}
    shards = torch.cat([w.detach().flatten() for w in embedding_shards(trainer.dmp)])
    dense = torch.cat([p.detach().flatten() for p in dense_parameters(trainer.dmp).values()])
    return {"summary": summary, "shards": shards, "dense": dense}


def test_a_failed_embedding_round_ends_every_rank_naming_the_failing_one() -> None:
    """``on_failure: raise``: every rank stops with an error (none hangs); the failing rank's
    names it and its cause, the others learned of it from its abort flag."""
    results = run_ranks(functools.partial(_failing_embedding_round, on_failure="raise"),
                        world_size=4, timeout_s=240)
    assert all("raised" in r for r in results), results
    assert "rank 2: synchronization failed: RuntimeError: injected embedding round failure" \
        in results[2]["raised"], results[2]
    for rank in (0, 1, 3):
        assert "rank(s) [2] failed and aborted synchronization" in results[rank]["raised"], \
            results[rank]


def test_a_failed_embedding_round_degrades_and_rejoins() -> None:
    """``on_failure: degrade``: the ranks train apart, rejoin with averaged replicas (dense
    and shards) and end identical."""
    results = run_ranks(functools.partial(_failing_embedding_round, on_failure="degrade"),
                        world_size=4, timeout_s=240)
    assert all("summary" in r for r in results), results
    assert all(r["summary"]["sync_failures"] == 1 for r in results), results[0]["summary"]
    for r in results:
        assert torch.equal(r["dense"], results[0]["dense"])
    assert torch.equal(results[0]["shards"], results[2]["shards"])
    assert torch.equal(results[1]["shards"], results[3]["shards"])


def _resume(rank: int, world_size: int, root: str) -> dict[str, Any]:
    env = init_distributed(60)
    common = TINY + FIXED_RATE_1[:2] + ["sync.schedule.period=5", "checkpoint.every_steps=12",
                                        "eval.every_steps=12"]

    def trainer(steps: int, ckpt_dir: str) -> Trainer:
        cfg = load_config("synthetic", common + [f"train.steps={steps}",
                                                 f"checkpoint.dir={ckpt_dir}"])
        return Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name, **cfg.data.options))

    def state(t: Trainer) -> list[torch.Tensor]:
        return [_flat(list(dense_parameters(t.dmp).values())), _flat(embedding_shards(t.dmp))]

    straight = trainer(24, f"{root}/straight")
    full = straight.train()
    first = trainer(12, f"{root}/interrupted")
    before = first.train()
    saved = state(first)
    resumed = trainer(24, f"{root}/interrupted")
    assert resumed.maybe_resume()
    at_resume = state(resumed)
    after = resumed.train()
    return {"full": full, "before": before, "after": after, "saved": saved,
            "at_resume": at_resume, "straight": state(straight), "resumed": state(resumed)}


def test_a_checkpoint_of_replica_groups_resumes_exactly(tmp_path: Any) -> None:
    """Each shard is written once (DCP saves a replicated shard from one replica), the same
    layout resumes it exactly, and training goes on as if uninterrupted."""
    results = run_ranks(functools.partial(_resume, root=str(tmp_path)), world_size=4,
                        timeout_s=240)
    for r in results:
        for got, want in zip(r["at_resume"], r["saved"], strict=True):
            assert torch.equal(got, want)
        for got, want in zip(r["resumed"], r["straight"], strict=True):
            assert torch.equal(got, want)
        for key in ("eval_auc", "eval_ne", "step"):
            assert r["after"][key] == r["full"][key], key
    step = tmp_path / "interrupted" / "step_00000012"
    table_bytes = 26 * 2000 * 8 * 4
    written = sum(f.stat().st_size for f in step.glob("*.distcp"))
    assert table_bytes <= written < 1.2 * table_bytes, (written, table_bytes)
