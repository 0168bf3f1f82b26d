"""Config loading: presets, dotted overrides, and errors that name the setting."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
import yaml

from shadowsync.datasets import SyntheticCriteo
from shadowsync.pipelines.build import check_sharding
from shadowsync.pipelines.config import (
    PRESET_DIR,
    check_writable,
    config_from_text,
    load_config,
    save_config,
)
from shadowsync.sync.config import BMUFConfig, EASGDConfig, migrate


def test_overrides_are_typed_and_applied() -> None:
    cfg = load_config("synthetic", [
        "sync.strategy.name=bmuf", "sync.schedule.mode=fixed_rate", "sync.schedule.period=10",
        "train.batch_size=4096", "model.embedding_dim=8", "model.dense_arch_layer_sizes=[32, 8]",
        "sync.strategy.block_momentum=null", "sync.strategy.block_lr=1",
    ])
    assert cfg.sync.strategy.name == "bmuf" and cfg.sync.schedule.mode == "fixed_rate"
    assert cfg.sync.schedule.period == 10 and cfg.train.batch_size == 4096
    assert cfg.model.dense_arch_layer_sizes == [32, 8]
    assert isinstance(cfg.sync.strategy, BMUFConfig)
    assert cfg.sync.strategy.block_momentum is None
    assert isinstance(cfg.sync.strategy.block_lr, float)


@pytest.mark.parametrize(("override", "message"), [
    ("sync.strategy.name=allreduce",
     "sync.strategy.name: unknown strategy 'allreduce'; known: "),
    ("sync.strategy.name=pma", "sync.strategy.name: 'pma' was renamed; use 'torch_averager'"),
    ("train.batch_size=big", "train.batch_size: expected int"),
    ("train.bach_size=4", "unknown setting train.bach_size"),
    ("trainer.steps=4", "unknown setting trainer"),
    ("train.batch_size=0", "train.batch_size must be positive"),
    ("train.gc_every_steps=0", "train.gc_every_steps must be positive"),
    ("sync.transport.thread_nice=20", r"sync.transport.thread_nice must be in \[0, 19\]"),
    ("sync.schedule.max_staleness=0", "sync.schedule.max_staleness must be >= 1, got 0"),
    ("sync.schedule.slowdown_window=0", "sync.schedule.slowdown_window must be >= 1, got 0"),
    ("sync.failure.timeout_s=0", r"sync.failure.timeout_s must be > 0, got 0"),
    ("sync.strategy.alpha=0.3", r"unknown setting sync.strategy.alpha; known under "
                                r"sync.strategy: \['name'\]"),  # ma has no options
    ("sharding.types=[row_wise, bogus]", r"sharding.types\[1\]: must be one of"),
    ("train.steps=true", "train.steps"),
    ("model.embedding_dim=8", "must end in model.embedding_dim"),
    ("syncalgorithm", "expected key.sub=value"),
])
def test_bad_settings_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def test_strategy_options_are_checked_under_their_strategy() -> None:
    with pytest.raises(ValueError, match=r"sync.strategy.alpha must be in \(0, 1\]"):
        load_config(None, ["sync.strategy.name=easgd", "sync.strategy.alpha=1.5"])
    with pytest.raises(ValueError, match=r"sync.strategy.block_momentum must be in \[0, 1\)"):
        load_config(None, ["sync.strategy.name=bmuf", "sync.strategy.block_momentum=1"])
    # A preset's strategy section is dropped when an override names another strategy.
    cfg = load_config("easgd_shadow", ["sync.strategy.name=bmuf", "sync.strategy.nesterov=true"])
    assert cfg.sync.strategy == BMUFConfig(nesterov=True)


@pytest.mark.parametrize("old,new", [
    ("sync.algorithm=ma", "sync.strategy.name"),
    ("sync.mode=shadow", "sync.schedule.mode"),
    ("sync.period=10", "sync.schedule.period"),
    ("sync.alpha=0.3", "sync.strategy.alpha"),
    ("sync.max_staleness=1", "sync.schedule.max_staleness"),
    ("sync.wire_dtype=bfloat16", "sync.transport.wire_dtype"),
    ("sync.thread_nice=10", "sync.transport.thread_nice"),
    ("sync.on_failure=degrade", "sync.failure.on_failure"),
    ("sync.timeout_s=3", "sync.failure.timeout_s"),
])
def test_the_flat_keys_of_earlier_versions_name_their_new_place(old: str, new: str) -> None:
    with pytest.raises(ValueError, match=f"^{old.partition('=')[0]} has moved: use {new}$"):
        load_config("synthetic", [old])


def test_a_config_stored_by_an_earlier_version_still_reads() -> None:
    """A checkpoint's ``config.yaml`` from before the sections: flat keys, every option of
    every strategy (the unused ones dropped)."""
    old = {"algorithm": "easgd", "mode": "fixed_rate", "period": 5, "alpha": 0.25,
           "block_momentum": None, "block_lr": 1.0, "nesterov": False, "min_interval_s": 0.0,
           "wire_dtype": "bfloat16", "timeout_s": 30.0, "on_failure": "degrade"}
    text = yaml.safe_dump({"sync": old})
    cfg = config_from_text(text, "old/config.yaml")
    assert cfg.sync.strategy == EASGDConfig(alpha=0.25)
    assert (cfg.sync.schedule.mode, cfg.sync.schedule.period) == ("fixed_rate", 5)
    assert cfg.sync.transport.wire_dtype == "bfloat16"
    assert (cfg.sync.failure.timeout_s, cfg.sync.failure.on_failure) == (30.0, "degrade")
    assert migrate(cfg.to_dict()["sync"]) == cfg.to_dict()["sync"]  # today's shape: as is


def test_socket_ifname_needs_a_gloo_sync_group() -> None:
    with pytest.raises(ValueError, match="sync.transport.socket_ifname binds a gloo group"):
        load_config(None, ["sync.schedule.mode=fixed_rate", "sync.transport.backend=nccl",
                           "sync.transport.socket_ifname=eth1"])


def test_shadow_mode_refuses_nccl_naming_gloo() -> None:
    """Defect 4 of the protocol issue: ``sync.backend=nccl`` in shadow mode was accepted, and on
    CPU silently ran gloo while the saved config said nccl."""
    with pytest.raises(ValueError, match="sync.transport.backend=nccl cannot carry shadow "
                                         "rounds .*: use sync.transport.backend=gloo"):
        load_config("synthetic", ["sync.transport.backend=nccl"])
    fixed = load_config("synthetic", ["sync.schedule.mode=fixed_rate",
                                      "sync.transport.backend=nccl"])
    assert fixed.sync.transport.backend == "nccl"  # allowed there, and never replaced:
    with pytest.raises(ValueError, match="sync.transport.backend=nccl needs CUDA; this job "
                                         "trains on cpu: use sync.transport.backend=gloo"):
        check_sharding(fixed, SyntheticCriteo().spec, 2, torch.device("cpu"))


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
                                    "logging.window_examples=1_000_000",
                                    "sync.schedule.max_slowdown=.25"])
    assert (cfg.optim.dense_lr, cfg.optim.sparse_lr, cfg.optim.eps) == (1e-3, 5e-2, 1.5e-10)
    assert cfg.train.steps == 2000 and isinstance(cfg.train.steps, int)
    assert cfg.logging.window_examples == 1_000_000 and cfg.sync.schedule.max_slowdown == 0.25
    with pytest.raises(ValueError, match="train.steps: .*2.5"):
        load_config("synthetic", ["train.steps=2.5"])
    # strings that only look like numbers stay what their field says
    with pytest.raises(ValueError, match="output_dir: 1000.0 does not fit str"):
        load_config("synthetic", ["output_dir=1e3"])
    assert load_config("synthetic", ["output_dir='1e3'"]).output_dir == "1e3"
    cfg = load_config("synthetic", ["sync.transport.socket_ifname=eth0:sync"])
    assert cfg.sync.transport.socket_ifname == "eth0:sync"


@pytest.mark.parametrize(("overrides", "warned"), [
    (["sync.schedule.period=10"],
     "sync.schedule.period=10 does nothing with sync.strategy.name=ma sync.schedule.mode=shadow; "
     "it acts with sync.schedule.mode=fixed_rate or sync.strategy.name=torch_averager"),
    (["sync.strategy.name=ddp", "sync.schedule.min_interval_s=0.5"],
     "sync.schedule.min_interval_s=0.5 does nothing with sync.strategy.name=ddp; it acts with "
     "sync.strategy.name ma, easgd or bmuf"),
    (["sync.schedule.mode=fixed_rate", "sync.schedule.period=5", "sync.schedule.max_slowdown=0.2"],
     "sync.schedule.max_slowdown=0.2 does nothing with sync.strategy.name=ma "
     "sync.schedule.mode=fixed_rate; it acts with sync.schedule.mode=shadow"),
    (["sync.schedule.mode=fixed_rate", "sync.schedule.max_staleness=1"],
     "sync.schedule.max_staleness=1 does nothing"),
    (["sync.schedule.mode=fixed_rate", "sync.transport.thread_nice=5"],
     "sync.transport.thread_nice=5 does nothing"),
    (["sync.schedule.max_slowdown=null", "sync.schedule.slowdown_window=64"],
     "sync.schedule.slowdown_window=64 does nothing with sync.strategy.name=ma "
     "sync.schedule.mode=shadow; it acts with sync.schedule.max_slowdown set"),
    (["sync.strategy.name=none", "sync.failure.on_failure=degrade"],
     "sync.failure.on_failure=degrade does nothing with sync.strategy.name=none"),
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
        load_config("ma_fixed_rate", ["sync.schedule.period=20"])
        load_config("synthetic", ["sync.strategy.name=torch_averager", "sync.schedule.period=4"])
        load_config("synthetic", ["sync.strategy.name=easgd", "sync.strategy.alpha=0.3"])
        # bench_sync gives every arm the same overrides; switching pacing off is no request
        load_config("synthetic", ["sync.strategy.name=none", "sync.schedule.max_slowdown=null"])
        load_config("bmuf_fixed_rate")  # a preset's inherited max_slowdown is not typed
    assert not caplog.records, caplog.text


def test_base_presets_inherit_and_cycles_are_refused(tmp_path: Path) -> None:
    cfg = load_config("bmuf_fixed_rate")
    assert (cfg.sync.strategy.name, cfg.sync.schedule.mode, cfg.sync.schedule.period) == (
        "bmuf", "fixed_rate", 10)
    assert cfg.data.name == "movielens_1m" and cfg.model.over_arch_layer_sizes == [128, 64, 1]
    child = tmp_path / "child.yaml"
    child.write_text("base: movielens_1m\ndata:\n  name: synthetic\n  options: {seed: 3}\n")
    merged = load_config(child)
    assert merged.data.options == {"seed": 3}  # options are replaced, never mixed across sets
    assert merged.sync.strategy.name == "ma"
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"base: {loop}\n")
    with pytest.raises(ValueError, match="cycle"):
        load_config(loop)


def test_folders_are_checked_for_writing_without_being_made(tmp_path: Path) -> None:
    """An existing folder, one to be made below it, and one under a torchx macro pass, and none
    of them is created; a file in the way, and a place that takes no entries (/proc, even for
    root), fail naming the key and the path."""
    (tmp_path / "run").mkdir()
    for url in (tmp_path / "run", tmp_path / "a" / "b", f"{tmp_path}/runs/${{app_id}}/ckpt",
                f"file://{tmp_path}/c"):
        check_writable(str(url), "output_dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert not any((tmp_path / "run").iterdir())  # the probe is gone
    (tmp_path / "file").write_text("")
    bad = {f"{tmp_path}/file/sub": "is not a folder", "/proc/shadowsync_out": "No such file"}
    for url, reason in bad.items():
        with pytest.raises(OSError, match=f"^checkpoint.dir: {re.escape(url)} is not writable "
                                          f"\\(.*{reason}"):
            check_writable(url, "checkpoint.dir")
    check_writable("memory://run", "output_dir")  # not a local path: left to the first write

