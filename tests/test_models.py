"""The model zoo: every architecture against TorchRec's where TorchRec has it, built on ``meta``,
materialized by DistributedModelParallel on 2 ranks, trained with shadow sync, checkpointed and
loaded back on one process; a user's model by import path; the planted-signal data source."""

from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.models.dlrm import DLRM as TorchRecDLRM
from torchrec.models.dlrm import DLRM_DCN as TorchRecDLRM_DCN
from torchrec.models.dlrm import DLRM_Projection as TorchRecDLRM_Projection
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shadowsync.datasets import SyntheticCriteo, build_dataset
from shadowsync.models import (
    DCN,
    DLRM,
    DLRM_DCN,
    AutoInt,
    DCNConfig,
    DeepFM,
    DeepFMConfig,
    DLRMConfig,
    DLRMProjectionConfig,
    WideDeep,
    build_model,
)
from shadowsync.models import MODELS as ZOO
from shadowsync.models.init import NotInitializable, require_initializable
from shadowsync.models.wide_deep import WIDE_DIM
from shadowsync.models.zoo import sparse_modules
from shadowsync.pipelines import build, checkpoint, saved_model
from shadowsync.pipelines.config import load_config
from shadowsync.pipelines.context import RunContext
from shadowsync.pipelines.evaluate import checkpoint_config, evaluate_checkpoint
from shadowsync.pipelines.metrics import gather_metrics
from shadowsync.pipelines.train import Trainer, init_distributed
from shadowsync.sync.wrapper import dense_parameters
from shadowsync.testing import run_ranks
from shadowsync.torchx_components.train import evaluate as evaluate_component
from tests.test_train import SMALL

DATA = [o for o in SMALL if not o.startswith("model.")]
# Every zoo architecture (and a user's, by import path), small: overrides on `synthetic`.
MODELS: dict[str, list[str]] = {
    "dlrm": ["model.name=dlrm", "model.interaction=dot"],
    "dlrm_dcn": ["model.name=dlrm", "model.interaction=dcn"],
    "dlrm_projection": ["model.name=dlrm_projection",
                        "model.interaction_branch1_layer_sizes=[32, 32]",
                        "model.interaction_branch2_layer_sizes=[32, 24]"],
    "deepfm": ["model.name=deepfm", "model.hidden_layer_size=32",
               "model.deep_fm_dimension=16"],
    "wide_deep": ["model.name=wide_deep", "model.deep_layer_sizes=[64, 32]"],
    "dcn": ["model.name=dcn", "model.num_layers=2", "model.low_rank_dim=8",
            "model.deep_layer_sizes=[64, 32]"],
    "autoint": ["model.name=autoint", "model.attention_dim=8",
                "model.over_arch_layer_sizes=[32, 1]"],
    "user": [],  # all in its preset, USER_PRESET
}
USER_PRESET = str(Path(__file__).with_name("user_model.yaml"))
_DENSE_SIZES = ["model.dense_arch_layer_sizes=[32, 8]"]
for _name in ("dlrm", "dlrm_dcn", "dlrm_projection", "autoint"):
    MODELS[_name] += _DENSE_SIZES
for _name in ("dlrm", "dlrm_dcn", "dlrm_projection"):
    MODELS[_name] += ["model.over_arch_layer_sizes=[32, 16, 1]"]


def _config(model: str, *extra: str) -> Any:
    if model == "user":
        return load_config(USER_PRESET, [*DATA, *extra])
    return load_config("synthetic", [*DATA, "model.embedding_dim=8", *MODELS[model], *extra])


def test_every_registered_architecture_is_exercised() -> None:
    assert {_config(m).model.name for m in MODELS} == {*ZOO.names(), "tests.user_model:build"}


def _spec() -> Any:
    return SyntheticCriteo(num_embeddings=50, multi_hot=3, num_train_examples=64).spec


@pytest.mark.parametrize("model", list(MODELS))
def test_each_builds_on_cpu_and_meta_and_scores_a_batch(model: str) -> None:
    cfg = _config(model).model
    ds = SyntheticCriteo(num_embeddings=50, multi_hot=3, num_train_examples=64)
    built = build_model(cfg, ds.spec, torch.device("cpu"), seed=0)
    batch = next(ds.train_batches(32, 0, 1))
    loss, (_, logits, labels) = built(batch)
    assert logits.shape == (32,) and torch.isfinite(loss) and loss.requires_grad
    meta = build_model(cfg, ds.spec, torch.device("meta"))
    require_initializable(meta)  # DistributedModelParallel can initialize every module
    assert {n: p.shape for n, p in meta.named_parameters()} == {
        n: p.shape for n, p in built.named_parameters()}


def test_options_are_checked_naming_the_key() -> None:
    cases = {
        "model.name=dlrmm": "model.name: unknown model 'dlrmm'",
        "model.interaction=dot": "unknown setting model.interaction; known under model",
        "model.low_rank_dim=0": "model.low_rank_dim must be positive",
        "model.structure=crossed": "model.structure: must be one of",
        "model.deep_layer_sizes=[]": "model.deep_layer_sizes needs at least 1",
    }
    for override, message in cases.items():
        extra = [] if override.startswith("model.name") else ["model.name=dcn"]
        with pytest.raises(ValueError, match=message):
            load_config("synthetic", [*extra, override])
    with pytest.raises(ValueError, match="model.attention_dim .15. must be a multiple"):
        load_config("synthetic", ["model.name=autoint", "model.attention_dim=15"])
    with pytest.raises(ValueError, match="end in a multiple of model.embedding_dim"):
        load_config("synthetic", ["model.name=dlrm_projection",
                                  "model.interaction_branch1_layer_sizes=[32, 20]"])
    with pytest.raises(ValueError, match="model.options.hiden; known under model.options"):
        load_config(USER_PRESET, ["model.options.hiden=3"])
    with pytest.raises(ValueError, match="model.options.hidden: expected int"):
        load_config(USER_PRESET, ["model.options.hidden=wide"])
    with pytest.raises(ValueError, match="model.name: cannot import 'tests.user_model:nope'"):
        load_config("synthetic", ["model.name=tests.user_model:nope"])
    # another model in a preset on top of a base starts its section afresh
    assert load_config("dlrm_dcn").model == DLRMConfig(
        interaction="dcn", dense_arch_layer_sizes=[64, 16], over_arch_layer_sizes=[128, 64, 1])
    assert isinstance(load_config("deepfm").model, DeepFMConfig)


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_logits_match_torchrec_with_same_weights(interaction: str) -> None:
    torch.manual_seed(0)
    ds = SyntheticCriteo(num_embeddings=50, multi_hot=3, num_train_examples=64)
    cfg = DLRMConfig(interaction=interaction, embedding_dim=8, dense_arch_layer_sizes=[16, 8],
                     over_arch_layer_sizes=[16, 8, 1], dcn_num_layers=2, dcn_low_rank_dim=4)
    ours = build_model(cfg, ds.spec, torch.device("cpu")).model
    assert isinstance(ours, DLRM_DCN if interaction == "dcn" else DLRM)
    ebc = EmbeddingBagCollection(
        tables=cfg.embedding_bag_configs(ds.spec.sparse_names, ds.spec.num_embeddings)
    )
    if interaction == "dcn":
        ref = TorchRecDLRM_DCN(ebc, 13, [16, 8], [16, 8, 1], dcn_num_layers=2, dcn_low_rank_dim=4)
    else:
        ref = TorchRecDLRM(ebc, 13, [16, 8], [16, 8, 1])
    ref.load_state_dict(ours.state_dict(), strict=True)
    batch = next(ds.train_batches(32, 0, 1))
    a = ours(batch.dense_features, batch.sparse_features)
    b = ref(batch.dense_features, batch.sparse_features)
    assert a.shape == (32, 1)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # Not trivially equal: another model's weights give other logits.
    torch.manual_seed(1)
    other = build_model(cfg, ds.spec, torch.device("cpu")).model
    assert (other(batch.dense_features, batch.sparse_features) - b).abs().max() > 1e-3


def test_deepfm_and_projection_state_dicts_move_to_and_from_torchrec() -> None:
    ds = SyntheticCriteo(num_embeddings=50, multi_hot=3, num_train_examples=64)
    batch = next(ds.train_batches(32, 0, 1))
    x = (batch.dense_features, batch.sparse_features)
    tables = DeepFMConfig(embedding_dim=8).embedding_bag_configs(ds.spec.sparse_names,
                                                                 ds.spec.num_embeddings)
    cpu = torch.device("cpu")
    ours = build_model(DeepFMConfig(embedding_dim=8, hidden_layer_size=16, deep_fm_dimension=4),
                       ds.spec, cpu, seed=0).model
    assert isinstance(ours, DeepFM)
    theirs = SimpleDeepFMNN(13, EmbeddingBagCollection(tables=tables), 16, 4)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(torch.sigmoid(ours(*x)), theirs(*x), atol=1e-6, rtol=0)
    torch.manual_seed(5)
    theirs = SimpleDeepFMNN(13, EmbeddingBagCollection(tables=tables), 16, 4)
    ours.load_state_dict(theirs.state_dict(), strict=True)  # and back
    torch.testing.assert_close(torch.sigmoid(ours(*x)), theirs(*x), atol=1e-6, rtol=0)

    cfg = DLRMProjectionConfig(embedding_dim=8, dense_arch_layer_sizes=[16, 8],
                               over_arch_layer_sizes=[16, 1],
                               interaction_branch1_layer_sizes=[16, 16],
                               interaction_branch2_layer_sizes=[24])
    ours = build_model(cfg, ds.spec, cpu, seed=0).model
    theirs = TorchRecDLRM_Projection(EmbeddingBagCollection(tables=tables), 13, [16, 8], [16, 1],
                                     [16, 16], [24])
    theirs.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(ours(*x), theirs(*x), atol=1e-6, rtol=0)


def test_dcn_structures_and_autoint_differ_where_they_should() -> None:
    """``parallel`` reads the input in both branches, ``stacked`` feeds cross into deep: the
    logit layer's width says which was built; AutoInt attends over F+1 fields."""
    spec = _spec()
    width = 13 + 26 * 8
    stacked = build_model(DCNConfig(embedding_dim=8, deep_layer_sizes=[32]), spec,
                          torch.device("cpu")).model
    parallel = build_model(DCNConfig(embedding_dim=8, deep_layer_sizes=[32],
                                     structure="parallel"), spec, torch.device("cpu")).model
    assert isinstance(stacked, DCN) and stacked.logit.in_features == 32
    assert parallel.logit.in_features == 32 + width
    autoint = build_model(_config("autoint").model, spec, torch.device("cpu")).model
    assert isinstance(autoint, AutoInt)
    assert autoint.over_arch.model[0]._mlp[0]._linear.in_features == 27 * 8
    wide = build_model(_config("wide_deep").model, spec, torch.device("cpu")).model
    assert isinstance(wide, WideDeep)
    wide_tables = wide.wide_arch.embedding_bag_collection.embedding_bag_configs()
    assert [t.embedding_dim for t in wide_tables] == [WIDE_DIM] * 26


def test_config_rejects_mismatched_widths() -> None:
    with pytest.raises(ValueError, match="dense_arch_layer_sizes must end in"):
        DLRMConfig(embedding_dim=8, dense_arch_layer_sizes=[16, 4]).validate()
    with pytest.raises(ValueError, match="over_arch_layer_sizes"):
        DLRMConfig(over_arch_layer_sizes=[4]).validate()
    with pytest.raises(ValueError, match="table size of sparse feature 'a'"):
        DLRMConfig().embedding_bag_configs(["a"], [0])


@pytest.mark.slow
def test_synthetic_is_deterministic_disjoint_and_has_signal() -> None:
    ds = SyntheticCriteo(num_embeddings=1000, num_train_examples=10 * 64, num_eval_examples=8192,
                         multi_hot=[1] * 22 + [4] * 4)
    r0 = list(ds.train_batches(64, 0, 2))
    r1 = list(ds.train_batches(64, 1, 2))
    assert len(r0) == len(r1) == 5
    again = next(ds.train_batches(64, 0, 2))
    torch.testing.assert_close(again.dense_features, r0[0].dense_features)
    # Ranks read different rows; a world of one reads both ranks' batches, interleaved.
    assert not torch.equal(r0[0].dense_features, r1[0].dense_features)
    solo = list(ds.train_batches(64, 0, 1))
    torch.testing.assert_close(solo[1].dense_features, r1[0].dense_features)
    kjt = r0[0].sparse_features
    assert kjt.keys() == ds.spec.sparse_names
    lengths = kjt.lengths().view(26, 64)
    assert lengths[:22].eq(1).all() and lengths[22:].max() > 1 and lengths[22:].max() <= 4
    assert int(kjt.values().max()) < 1000
    auc = ds.planted_auc(batch_size=1024)
    assert 0.8 < auc < 0.95, auc


# ---------------------------------------------------------------------------------- init on meta
class _Scale(nn.Module):
    """A toy module holding a parameter and no reset_parameters()."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_guard_names_a_meta_module_it_cannot_initialize() -> None:
    meta = torch.device("meta")
    require_initializable(nn.Sequential(nn.Linear(4, 4, device=meta)))  # Linear can
    require_initializable(nn.Sequential(_Scale(torch.device("cpu"))))  # initialized already
    with pytest.raises(NotInitializable, match=r"^1 \(_Scale\): holds parameters on meta"):
        require_initializable(nn.Sequential(nn.Linear(4, 4, device=meta), _Scale(meta)))
    with pytest.raises(NotInitializable, match=r"^0 \(ParameterList\)"):
        require_initializable(nn.Sequential(nn.ParameterList([torch.empty(2, device=meta)])))
    buffered = nn.Module()
    buffered.register_buffer("index", torch.arange(3, device=meta))
    with pytest.raises(NotInitializable, match=r"^0 \(Module\): holds a buffer on meta"):
        require_initializable(nn.Sequential(buffered))


@pytest.mark.parametrize("model", list(MODELS))
def test_the_build_fails_naming_a_module_it_could_not_initialize(
    model: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The build path itself (``check_sharding``, run before any process group, and
    ``build_sharded_model``) refuses a model with such a module; every zoo model passes."""
    cfg = _config(model)
    spec = build_dataset(cfg.data.name, **cfg.data.options).spec
    build.check_sharding(cfg, spec, 2, torch.device("cpu"))
    real = build.build_model

    def with_toy(*args: Any, **kwargs: Any) -> nn.Module:
        built = real(*args, **kwargs)
        built.model.scale = _Scale(torch.device("meta"))
        return built

    monkeypatch.setattr(build, "build_model", with_toy)
    with pytest.raises(NotInitializable, match=r"model\.scale \(_Scale\)"):
        build.check_sharding(cfg, spec, 2, torch.device("cpu"))




# Steps each model trains: enough for every model to clear the bars below on the held-out split
# (NE < 0.95, AUC > 0.65) with room for noise, too few for the slowest learners (DLRM and
# AutoInt) to clear them at a third of the pace.
STEPS = 60


def _train_every_model(rank: int, world_size: int, root: str) -> dict[str, Any]:
    env = init_distributed(60)
    out: dict[str, Any] = {}
    for model in MODELS:
        cfg = _config(model, f"train.steps={STEPS}", "train.seed=3",
                      f"checkpoint.dir={root}/{model}")
        dataset = build_dataset(cfg.data.name, **cfg.data.options)
        # meta -> planned, sharded, materialized by DMP
        trainer = Trainer(RunContext.of(cfg, env), dataset)
        start = {n: p.detach().clone() for n, p in dense_parameters(trainer.dmp).items()}
        summary = trainer.train()
        end = {n: p.detach().clone() for n, p in dense_parameters(trainer.dmp).items()}
        found = checkpoint.resolve(f"{root}/{model}")
        evaluated = evaluate_checkpoint(cfg, found, env, dataset)  # the evaluate CLI's path
        out[model] = {"start": start, "end": end, "summary": summary, "evaluated": evaluated}
    for model, sync in OTHER_SYNCS.items():
        cfg = _config(model, f"train.steps={STEPS}", "train.seed=3", *sync)
        trainer = Trainer(RunContext.of(cfg, env), build_dataset(cfg.data.name, **cfg.data.options))
        summary = trainer.train()
        end = {n: p.detach().clone() for n, p in dense_parameters(trainer.dmp).items()}
        out[f"{model} {sync[0]}"] = {"end": end, "summary": summary}
    return out


# The other dense synchronizers, each on a model other than DLRM.
OTHER_SYNCS = {
    "deepfm": ["sync.strategy.name=ddp"],
    "wide_deep": ["sync.strategy.name=bmuf", "sync.schedule.mode=fixed_rate",
                  "sync.schedule.period=5"],
    "user": ["sync.strategy.name=easgd", "sync.schedule.mode=shadow"],
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("zoo")
    return root, run_ranks(functools.partial(_train_every_model, root=str(root)), timeout_s=900)


@pytest.mark.slow
def test_every_model_is_initialized_through_sharding_and_learns_with_shadow_sync(
    trained: tuple[Path, list[dict[str, Any]]],
) -> None:
    """Each model, built on ``meta`` and materialized by DistributedModelParallel on 2 ranks,
    starts with exactly the dense parameters the same model gets built on CPU with the same
    seed, trains with S-MA (rounds applied, replicas identical after the final sync), and
    beats the constant predictor (NE 1) on held-out data."""
    _, results = trained
    for model in MODELS:
        cfg = _config(model, "train.seed=3")
        spec = build_dataset(cfg.data.name, **cfg.data.options).spec
        cpu = build_model(cfg.model, spec, torch.device("cpu"), seed=3)
        sharded_tables = {n for c in sparse_modules(cpu) for n, _ in c.named_parameters()}
        reference = dict(cpu.named_parameters())
        for rank, result in enumerate(results):
            start = result[model]["start"]
            assert start and all(n in reference for n in start), (model, rank)
            assert len(start) + len(sharded_tables) == len(reference), (model, rank)
            for name, value in start.items():
                torch.testing.assert_close(value, reference[name].detach(), rtol=0, atol=0,
                                           msg=f"{model}, rank {rank}: {name}")
            summary = result[model]["summary"]
            assert summary["sync_syncs_applied"] > 0, (model, summary)
            assert summary["eval_ne"] < 0.95, (model, summary)
            assert summary["eval_auc"] > 0.65, (model, summary)
        for name, value in results[0][model]["end"].items():
            assert torch.equal(value, results[1][model]["end"][name]), (model, name)
            assert not torch.equal(value, results[0][model]["start"][name]), (model, name)
    # Not vacuous: the seed matters.
    other = build_model(cfg.model, spec, torch.device("cpu"), seed=4)
    assert not torch.equal(dict(other.named_parameters())[name], reference[name])


@pytest.mark.slow
def test_every_dense_synchronizer_keeps_zoo_models_in_step(
    trained: tuple[Path, list[dict[str, Any]]],
) -> None:
    """DDP, fixed-rate BMUF and shadow EASGD on DeepFM, Wide & Deep and the user's model:
    the replicas end identical (the final sync) and the model learns."""
    _, results = trained
    for model, sync in OTHER_SYNCS.items():
        run = f"{model} {sync[0]}"
        ends = [r[run]["end"] for r in results]
        assert ends[0].keys() == ends[1].keys() and ends[0], run
        for name in ends[0]:
            assert torch.equal(ends[0][name], ends[1][name]), (run, name)
        for rank, result in enumerate(results):
            summary = result[run]["summary"]
            assert summary["eval_ne"] < 0.95 and summary["eval_auc"] > 0.65, (run, rank, summary)


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_load_gives_the_evaluate_clis_scores_on_one_process(
    model: str, trained: tuple[Path, list[dict[str, Any]]],
) -> None:
    """``load_model`` rebuilds the trained model from the checkpoint alone (its stored config) on
    one process without a process group; its metrics over every eval row equal those of the
    evaluate CLI's 2-rank path to 1e-6."""
    root, results = trained
    loaded, cfg = saved_model.load_model(f"{root}/{model}")
    assert cfg == _config(model, f"train.steps={STEPS}", "train.seed=3",
                          f"checkpoint.dir={root}/{model}")
    # what the evaluate CLI and component run without --config
    assert checkpoint_config(checkpoint.resolve(f"{root}/{model}"), None, []) == cfg
    dataset = build_dataset(cfg.data.name, **cfg.data.options)
    logits, labels = [], []
    with torch.no_grad():
        for batch in dataset.eval_batches(cfg.eval.batch_size, 0, 1):
            logits.append(loaded.model(batch.dense_features, batch.sparse_features).squeeze(-1))
            labels.append(batch.labels.float())
    ours = gather_metrics(torch.cat(logits), torch.cat(labels))
    evaluated = results[0][model]["evaluated"]
    assert ours["examples"] == evaluated["examples"] > 0
    for key in ("ne", "auc"):
        assert math.isclose(ours[key], evaluated[key], abs_tol=1e-6), (model, key, ours, evaluated)
    assert evaluated["ne"] == results[0][model]["summary"]["eval_ne"]


@pytest.mark.slow
def test_load_refuses_weights_another_config_builds(
    trained: tuple[Path, list[dict[str, Any]]], tmp_path: Path,
) -> None:
    """A checkpoint whose config no longer matches its weights (the file edited and its
    digests redone, so only the mismatch is left) fails naming the keys that differ."""
    root, _ = trained
    found = checkpoint.resolve(f"{root}/dcn")
    copy = tmp_path / Path(found.path).name
    shutil.copytree(found.path, copy)
    config = copy / checkpoint.CONFIG
    config.write_text(config.read_text().replace("low_rank_dim: 8", "low_rank_dim: 4"))
    marker = json.loads((copy / checkpoint.MARKER).read_text())
    marker["files"][checkpoint.CONFIG] = checkpoint._digest(str(config))
    (copy / checkpoint.MARKER).write_text(json.dumps(marker))
    with pytest.raises(saved_model.ModelMismatch,
                       match=r"model.name=dcn.*shapes: .*crossnet\.W_kernels"):
        saved_model.load_model(str(copy))
    # the torchx evaluate component checks the stored config before submitting
    with pytest.raises(ValueError) as caught:
        evaluate_component("train.bach_size=1", checkpoint=str(copy), check="config")
    assert caught.value.code == 2  # type: ignore[attr-defined]
    config.write_text(config.read_text() + "\n")  # digests now disagree: refused as corrupt
    with pytest.raises(checkpoint.CheckpointCorrupt, match="config.yaml: truncated or extended"):
        saved_model.load_model(str(copy))
    config.unlink()  # an older checkpoint: nothing to build from, said so
    found = checkpoint.CheckpointInfo(str(copy), found.step)
    with pytest.raises(ValueError, match="holds no config.yaml .* pass --config"):
        checkpoint_config(found, None, [])
