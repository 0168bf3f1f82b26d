"""The model zoo against TorchRec's reference DLRM, and the planted-signal data source."""

from __future__ import annotations

import pytest
import torch
from torchrec.models.dlrm import DLRM as TorchRecDLRM
from torchrec.models.dlrm import DLRM_DCN as TorchRecDLRM_DCN
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shadowsync.datasets import SyntheticCriteo
from shadowsync.models import DLRM, DLRM_DCN, DLRMConfig, build_dlrm


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_logits_match_torchrec_with_same_weights(interaction: str) -> None:
    torch.manual_seed(0)
    ds = SyntheticCriteo(num_embeddings=50, multi_hot=3, num_train_examples=64)
    cfg = DLRMConfig(interaction=interaction, embedding_dim=8, dense_arch_layer_sizes=[16, 8],
                     over_arch_layer_sizes=[16, 8, 1], dcn_num_layers=2, dcn_low_rank_dim=4)
    ours = build_dlrm(cfg, 13, ds.spec.sparse_names, ds.spec.num_embeddings,
                      torch.device("cpu")).model
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
    other = build_dlrm(cfg, 13, ds.spec.sparse_names, ds.spec.num_embeddings,
                       torch.device("cpu")).model
    assert (other(batch.dense_features, batch.sparse_features) - b).abs().max() > 1e-3


def test_config_rejects_mismatched_widths() -> None:
    with pytest.raises(ValueError, match="dense_arch_layer_sizes must end in"):
        DLRMConfig(embedding_dim=8, dense_arch_layer_sizes=[16, 4]).validate()
    with pytest.raises(ValueError, match="over_arch_layer_sizes"):
        DLRMConfig(over_arch_layer_sizes=[4]).validate()
    with pytest.raises(ValueError, match="table size of sparse feature 'a'"):
        DLRMConfig().embedding_bag_configs(["a"], [0])


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
