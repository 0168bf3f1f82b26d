"""Config loading: presets, dotted overrides, and errors that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shadowsync.pipelines.config import PRESET_DIR, load_config, save_config


def test_overrides_are_typed_and_applied() -> None:
    cfg = load_config("synthetic", [
        "sync.algorithm=bmuf", "sync.mode=fixed_rate", "sync.period=10", "train.batch_size=4096",
        "model.embedding_dim=8", "model.dense_arch_layer_sizes=[32, 8]", "sync.block_momentum=null",
        "sync.alpha=1",
    ])
    assert cfg.sync.algorithm == "bmuf" and cfg.sync.mode == "fixed_rate"
    assert cfg.sync.period == 10 and cfg.train.batch_size == 4096
    assert cfg.model.dense_arch_layer_sizes == [32, 8]
    assert cfg.sync.block_momentum is None
    assert isinstance(cfg.sync.alpha, float)


@pytest.mark.parametrize(("override", "message"), [
    ("sync.algorithm=allreduce", "sync.algorithm: must be one of"),
    ("train.batch_size=big", "train.batch_size: expected int"),
    ("train.bach_size=4", "unknown setting train.bach_size"),
    ("trainer.steps=4", "unknown setting trainer"),
    ("train.batch_size=0", "train.batch_size must be positive"),
    ("sync.alpha=1.5", r"sync.alpha must be in \(0, 1\]"),
    ("sharding.types=[row_wise, bogus]", r"sharding.types\[1\]: must be one of"),
    ("train.steps=true", "train.steps"),
    ("model.embedding_dim=8", "must end in model.embedding_dim"),
    ("syncalgorithm", "expected key.sub=value"),
])
def test_bad_settings_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def test_every_preset_loads_and_round_trips(tmp_path: Path) -> None:
    presets = sorted(PRESET_DIR.glob("*.yaml"))
    assert presets, "no presets shipped"
    for preset in presets:
        cfg = load_config(preset)
        save_config(cfg, tmp_path / "c.yaml")
        assert load_config(tmp_path / "c.yaml") == cfg, preset.name
    with pytest.raises(ValueError, match="no such preset"):
        load_config("does_not_exist")


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    evil = tmp_path / "evil.yaml"
    evil.write_text("output_dir: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(yaml.YAMLError):
        load_config(evil)


def test_base_presets_inherit_and_cycles_are_refused(tmp_path: Path) -> None:
    cfg = load_config("bmuf_fixed_rate")
    assert (cfg.sync.algorithm, cfg.sync.mode, cfg.sync.period) == ("bmuf", "fixed_rate", 10)
    assert cfg.data.name == "movielens_1m" and cfg.model.over_arch_layer_sizes == [128, 64, 1]
    child = tmp_path / "child.yaml"
    child.write_text("base: movielens_1m\ndata:\n  name: synthetic\n  options: {seed: 3}\n")
    merged = load_config(child)
    assert merged.data.options == {"seed": 3}  # options are replaced, never mixed across sets
    assert merged.sync.algorithm == "ma"
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"base: {loop}\n")
    with pytest.raises(ValueError, match="cycle"):
        load_config(loop)
