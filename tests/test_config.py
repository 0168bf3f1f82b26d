"""Config loading: presets, dotted overrides, and errors that name the setting."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from shadowsync.pipelines.config import PRESET_DIR, load_config, save_config


def test_overrides_are_typed_and_applied() -> None:
    cfg = load_config("synthetic", [
        "sync.algorithm=bmuf", "sync.mode=fixed_rate", "sync.period=10", "train.batch_size=4096",
        "model.embedding_dim=8", "model.dense_arch_layer_sizes=[32, 8]", "sync.block_momentum=null",
        "sync.block_lr=1",
    ])
    assert cfg.sync.algorithm == "bmuf" and cfg.sync.mode == "fixed_rate"
    assert cfg.sync.period == 10 and cfg.train.batch_size == 4096
    assert cfg.model.dense_arch_layer_sizes == [32, 8]
    assert cfg.sync.block_momentum is None
    assert isinstance(cfg.sync.block_lr, float)


@pytest.mark.parametrize(("override", "message"), [
    ("sync.algorithm=allreduce", "sync.algorithm: unknown algorithm 'allreduce'; known: "),
    ("sync.algorithm=pma", "sync.algorithm: 'pma' was renamed; use 'torch_averager'"),
    ("train.batch_size=big", "train.batch_size: expected int"),
    ("train.bach_size=4", "unknown setting train.bach_size"),
    ("trainer.steps=4", "unknown setting trainer"),
    ("train.batch_size=0", "train.batch_size must be positive"),
    ("train.gc_every_steps=0", "train.gc_every_steps must be positive"),
    ("sync.alpha=1.5", r"sync.alpha must be in \(0, 1\]"),
    ("sync.thread_nice=20", r"sync.thread_nice must be in \[0, 19\]"),
    ("sync.max_staleness=0", "sync.max_staleness must be >= 1, got 0"),
    ("sync.slowdown_window=0", "sync.slowdown_window must be >= 1, got 0"),
    ("sharding.types=[row_wise, bogus]", r"sharding.types\[1\]: must be one of"),
    ("train.steps=true", "train.steps"),
    ("model.embedding_dim=8", "must end in model.embedding_dim"),
    ("syncalgorithm", "expected key.sub=value"),
])
def test_bad_settings_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def test_socket_ifname_needs_a_gloo_sync_group() -> None:
    with pytest.raises(ValueError, match="sync.socket_ifname binds a gloo group"):
        load_config(None, ["sync.backend=nccl", "sync.socket_ifname=eth1"])


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
    evil.write_text(f"output_dir: !!python/object/apply:os.system ['touch {tmp_path}/pwned']\n")
    with pytest.raises(ValueError, match=f"{evil}: line 1, column 13: could not determine a "
                                         "constructor for the tag") as caught:
        load_config(evil)
    assert isinstance(caught.value.__cause__, yaml.constructor.ConstructorError)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(("text", "message"), [
    ("train:\n  batch_size: 512\n  steps 3\n  epochs: 1\n",
     r"line 4, column 3: could not find expected ':' \(while scanning a simple key from line 3\)"),
    ("model:\n  dense_arch_layer_sizes: [64, 16\ntrain: {}\n",
     r"line 3, column 6: expected ',' or '\]', but got ':' \(while parsing a flow sequence from "
     r"line 2\)"),
])
def test_yaml_syntax_errors_name_the_file_and_line(tmp_path: Path, text: str,
                                                   message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=f"^{bad}: {message}$"):
        load_config(bad)
    with pytest.raises(ValueError, match=r"^override 'train.batch_size=\[1,': line 1"):
        load_config("synthetic", ["train.batch_size=[1,"])


def test_numbers_as_people_type_them() -> None:
    cfg = load_config("synthetic", ["optim.dense_lr=1e-3", "optim.sparse_lr=5E-2",
                                    "optim.eps=1.5e-10", "train.steps=2e3",
                                    "logging.window_examples=1_000_000", "sync.max_slowdown=.25"])
    assert (cfg.optim.dense_lr, cfg.optim.sparse_lr, cfg.optim.eps) == (1e-3, 5e-2, 1.5e-10)
    assert cfg.train.steps == 2000 and isinstance(cfg.train.steps, int)
    assert cfg.logging.window_examples == 1_000_000 and cfg.sync.max_slowdown == 0.25
    with pytest.raises(ValueError, match="train.steps: .*2.5"):
        load_config("synthetic", ["train.steps=2.5"])
    # strings that only look like numbers stay what their field says
    with pytest.raises(ValueError, match="output_dir: 1000.0 does not fit str"):
        load_config("synthetic", ["output_dir=1e3"])
    assert load_config("synthetic", ["output_dir='1e3'"]).output_dir == "1e3"
    assert load_config("synthetic", ["sync.socket_ifname=eth0:sync"]).sync.socket_ifname == \
        "eth0:sync"


@pytest.mark.parametrize(("overrides", "warned"), [
    (["sync.period=10"], "sync.period=10 does nothing with sync.algorithm=ma sync.mode=shadow; "
                         "it acts with sync.mode=fixed_rate or sync.algorithm=torch_averager"),
    (["sync.algorithm=ddp", "sync.min_interval_s=0.5"],
     "sync.min_interval_s=0.5 does nothing with sync.algorithm=ddp; it acts with "
     "sync.algorithm ma, easgd or bmuf"),
    (["sync.mode=fixed_rate", "sync.period=5", "sync.max_slowdown=0.2"],
     "sync.max_slowdown=0.2 does nothing with sync.algorithm=ma sync.mode=fixed_rate; it acts "
     "with sync.mode=shadow"),
    (["sync.mode=fixed_rate", "sync.max_staleness=1"], "sync.max_staleness=1 does nothing"),
    (["sync.max_slowdown=null", "sync.slowdown_window=64"],
     "sync.slowdown_window=64 does nothing with sync.algorithm=ma sync.mode=shadow; it acts "
     "with sync.max_slowdown set"),
    (["sync.algorithm=bmuf", "sync.alpha=0.9"], "sync.alpha=0.9 does nothing"),
    (["sync.algorithm=easgd", "sync.nesterov=true"], "sync.nesterov=True does nothing"),
])
def test_overrides_that_do_nothing_are_pointed_out(
    overrides: list[str], warned: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with caplog.at_level(logging.WARNING, "shadowsync.config"):
        load_config("synthetic", overrides)
    assert [r.getMessage() for r in caplog.records if warned in r.getMessage()], caplog.text
    caplog.clear()
    monkeypatch.setenv("RANK", "1")  # once per job: rank 0 says it
    with caplog.at_level(logging.WARNING, "shadowsync.config"):
        load_config("synthetic", overrides)
    assert not caplog.records


def test_overrides_that_act_or_only_restate_a_default_are_quiet(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with caplog.at_level(logging.WARNING, "shadowsync.config"):
        load_config("ma_fixed_rate", ["sync.period=20"])
        load_config("synthetic", ["sync.algorithm=torch_averager", "sync.period=4"])
        load_config("synthetic", ["sync.algorithm=easgd", "sync.alpha=0.3"])
        # bench_sync gives every arm the same overrides; switching pacing off is no request
        load_config("synthetic", ["sync.algorithm=none", "sync.max_slowdown=null"])
        load_config("bmuf_fixed_rate")  # a preset's inherited max_slowdown is not typed
    assert not caplog.records, caplog.text


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
