"""Typed run configuration: YAML presets plus dotted command-line overrides.

Every setting lives in one dataclass tree, so an unknown key or a wrong type fails before any
process group starts, with the dotted name of the offending setting::

    python -m shadowsync.pipelines.train --config pipelines/configs/synthetic.yaml \\
        sync.strategy.name=ma sync.schedule.mode=shadow train.batch_size=4096
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import fsspec
import yaml

from shadowsync.models.config import DLRMConfig, ModelConfig
from shadowsync.sections import POSITIVE, Range, check_range, read_section
from shadowsync.sync.config import SyncConfig, migrate, strategy_algorithms

ShardingType = Literal["table_wise", "column_wise", "table_column_wise", "data_parallel",
                       "row_wise", "table_row_wise", "grid_shard"]
ROW_WISE_FAMILY = ("row_wise", "table_row_wise", "grid_shard")
PRESET_DIR = Path(__file__).parent / "configs"
DEFAULT_PRESET = "movielens_1m"  # the README's main job: what evaluate and the components use
logger = logging.getLogger("shadowsync.config")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-3`` and ``1e5`` as floats too: YAML 1.1's float rule,
    which PyYAML follows, wants a dot and a signed exponent and left them strings."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def _parse_yaml(text: str, where: str) -> Any:
    """``text`` through the safe loader; a YAML error becomes one ``ValueError`` naming
    ``where`` (a file, an override) and the line and column."""
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f": line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        context = getattr(e, "context", None)
        started = getattr(e, "context_mark", None)
        if context and started is not None:
            context += f" from line {started.line + 1}"  # say, an unclosed [
        problem = getattr(e, "problem", None) or str(e)
        raise ValueError(f"{where}{at}: {problem}" + (f" ({context})" if context else "")) from e


@dataclass
class DataConfig:
    """Which registered data set (``shadowsync.datasets``) and its options."""

    name: str = "synthetic"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardingConfig:
    """Sharding types the planner may choose from (empty: all that the device supports).

    ``min_partition`` is the narrowest column-wise shard (TorchRec's default is 128 columns, so
    narrower tables are not split unless it is lowered). ``group_size`` shards the tables
    inside groups of that many contiguous ranks (``local``: a host's), the groups replicas
    of each other, synchronized by ``sync`` (see :mod:`.layout`); null: one group of every
    rank.
    """

    types: list[ShardingType] = field(default_factory=list)
    compute_kernel: Literal["fused", "dense", "auto"] = "auto"
    min_partition: int | None = None
    group_size: int | Literal["local"] | None = None


@dataclass
class OptimConfig:
    """Dense optimizer (stepped by the loop) and the embedding optimizer fused into backward."""

    dense: Literal["adagrad", "adam", "sgd"] = "adagrad"
    dense_lr: float = 0.02
    sparse: Literal["rowwise_adagrad", "adagrad", "sgd"] = "rowwise_adagrad"
    sparse_lr: float = 0.05
    eps: float = 1e-8


@dataclass
class TrainConfig:
    """The training loop.

    ``pg_timeout_s`` bounds every collective of training (TorchRec's all-to-alls, metrics,
    checkpoints): a rank that waits longer for a dead or stuck peer fails instead of hanging.
    It must cover the slowest gap between ranks, such as a checkpoint write. Every
    ``control_every_steps`` steps, or fewer where that is under ``control_min_interval_s``
    seconds of training (the slowest rank's pace since the last check; null: none), the
    ranks agree on stopping (SIGTERM reached any rank) and on degrading a failed
    synchronizer, in one tiny allreduce on a gloo group of its own that runs in the
    background and is acted on at the next such check (so a stop takes effect within two
    intervals), and always, waiting for it, before a checkpoint, an evaluation and the end.
    Each exchange costs the training thread a fraction of a millisecond on CPU: on fast steps
    the floor keeps it rare, while a stop still lands within a second or so.

    Every rank beats every ``heartbeat_s`` in the job's store; a peer process silent for
    ``heartbeat_timeout_s`` (killed, stopped, hung) ends the job naming it, however long
    ``pg_timeout_s`` is (see :class:`~shadowsync.pipelines.fault_domain.Heartbeat`).

    Python's automatic garbage collector is off while training: every ``gc_every_steps``
    steps every rank collects the young generations at the same step, so that no rank's
    collection pauses its peers at a random step (None keeps Python's own collector; see
    :class:`~shadowsync.pipelines.collector.StepCollector`).
    """

    batch_size: int = 512
    steps: int | None = None
    epochs: int = 1
    seed: int = 0
    log_every: int = 100
    pg_timeout_s: float = 600.0
    control_every_steps: int = 10
    control_min_interval_s: float | None = 0.5
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 30.0
    gc_every_steps: int | None = 50


@dataclass
class EvalConfig:
    batch_size: int = 4096
    every_steps: int | None = None
    max_batches: int | None = None


@dataclass
class CheckpointConfig:
    """Where and how often to checkpoint (any path fsspec reaches); ``resume`` picks the newest
    complete checkpoint in ``dir`` at start."""

    dir: str | None = None
    every_steps: int | None = None
    keep: int | None = 2
    resume: bool = True


@dataclass
class LoggingConfig:
    """Training records' NE, AUC and calibration over a window of the ``window_examples`` most
    recent examples of all ranks (:class:`~shadowsync.pipelines.metrics.TrainingMetrics`).
    ``tensorboard``: rank 0 also writes every numeric value of every record as TensorBoard
    scalars (``train/``, ``eval/``, ``sync/``) in ``output_dir/tensorboard`` (needs
    ``output_dir`` and the ``tensorboard`` extra)."""

    window_examples: int = 100_000
    progress_bar: bool = True
    tensorboard: bool = False


# The valid range of each numeric setting that has one (the synchronizer's are in sync.config).
_RANGES: dict[str, Range] = {key: POSITIVE for key in (
    "train.batch_size", "train.epochs", "train.log_every", "eval.batch_size",
    "train.control_every_steps", "train.steps", "eval.every_steps", "eval.max_batches",
    "sharding.min_partition", "checkpoint.every_steps", "train.gc_every_steps",
    "checkpoint.keep", "logging.window_examples", "train.control_min_interval_s",
    "optim.dense_lr", "optim.sparse_lr", "train.pg_timeout_s")}


@dataclass
class RunConfig:
    """The whole run; ``output_dir`` receives the resolved config and the metrics."""

    model: ModelConfig = field(default_factory=DLRMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    output_dir: str | None = None

    def validate(self) -> None:
        """Checks that need several fields at once; types were checked while building."""
        self.model.validate()
        for key, valid in _RANGES.items():
            section, _, name = key.partition(".")
            check_range(key, getattr(getattr(self, section), name), valid)
        group_size = self.sharding.group_size
        if isinstance(group_size, int) and group_size < 1:
            raise ValueError(f"sharding.group_size: expected a positive number of ranks or "
                             f"'local', got {group_size}")
        if self.checkpoint.every_steps is not None and self.checkpoint.dir is None:
            raise ValueError("checkpoint.every_steps needs checkpoint.dir")
        if self.logging.tensorboard and self.output_dir is None:
            raise ValueError("logging.tensorboard writes beside metrics.jsonl: set output_dir")
        if self.logging.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ValueError("logging.tensorboard needs the tensorboard package: pip install "
                             "'shadowsync[tensorboard]' (scripts/install.sh installs it)")
        if not 0 < 3 * self.train.heartbeat_s <= self.train.heartbeat_timeout_s:
            t = self.train
            raise ValueError(f"train.heartbeat_timeout_s ({t.heartbeat_timeout_s}) must be at "
                             f"least 3 x train.heartbeat_s ({t.heartbeat_s}), both positive")
        self.sync.validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _renamed(section: Any, value: Any) -> bool:
    """Whether setting ``name`` to ``value`` in ``section`` picks another model or data set,
    whose other keys (options of the old one) no longer apply."""
    return isinstance(section, dict) and "name" in section and section["name"] != value


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ValueError(f"override {dotted}: {p} is not a section")
        node = child
    if leaf == "name" and _renamed(node, value):
        node.clear()
    node[leaf] = value


def resolve_preset(path: str | Path) -> Path:
    """A YAML file, or the name of a preset in ``pipelines/configs`` (``synthetic``)."""
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    preset = PRESET_DIR / f"{path}.yaml"
    if preset.is_file():
        return preset
    known = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    raise ValueError(f"config {str(path)!r}: no such file and no such preset (presets: {known})")


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and "name" in value and _renamed(out.get(key), value["name"]):
            out[key] = value  # another model or data set: the base's options do not apply
        elif isinstance(value, dict) and isinstance(out.get(key), dict) and key != "options":
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_tree(path: str | Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML file as a tree, with its ``base:`` preset (if any) merged underneath it.

    ``data.options`` is replaced, not merged: options belong to one data set.
    """
    resolved = resolve_preset(path)
    if resolved in seen:
        raise ValueError(f"{resolved}: 'base' presets form a cycle")
    loaded = _parse_yaml(resolved.read_text(), str(resolved))
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{resolved}: the top level must be a mapping")
    base = loaded.pop("base", None)
    if base is None:
        return loaded
    if not isinstance(base, str):
        raise ValueError(f"{resolved}: base must name a preset or file, got {base!r}")
    return _merge(_read_tree(base, (*seen, resolved)), loaded)


def _warn_ignored(cfg: RunConfig, keys: list[str]) -> None:
    """Logs each ``sync`` override that sets a value the chosen algorithm and mode never read
    (on rank 0 only: every rank loads the config). A warning, not an error: benchmarks give
    one set of overrides to arms of every algorithm."""
    if os.environ.get("RANK", "0") != "0":
        return
    ignored, default = cfg.sync.ignored(), SyncConfig()
    chosen = f"sync.strategy.name={cfg.sync.strategy.name}"
    if cfg.sync.strategy.name in strategy_algorithms():
        chosen += f" sync.schedule.mode={cfg.sync.schedule.mode}"
    for key in keys:
        top, _, name = key.partition(".")
        part, _, leaf = name.partition(".")
        if top != "sync" or name not in ignored:
            continue
        value = getattr(getattr(cfg.sync, part), leaf)
        if value != getattr(getattr(default, part), leaf):
            logger.warning("%s=%s does nothing with %s; it acts with %s", key, value, chosen,
                           ignored[name])


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Reads a YAML file or preset (PyYAML's safe loader; ``base: <preset>`` inherits one),
    applies ``key.sub=value`` overrides (values parsed as YAML: ``4096``, ``1e-3``, ``null``,
    ``[a, b]``), validates the result and warns about overrides that change nothing.

    An override of a section's ``name`` (``model.name=deepfm``) that picks another model or
    data set drops the preset's other keys of that section, and is applied before the other
    overrides, which then set the new one's options."""
    return _config_from_tree({} if path is None else _read_tree(path), overrides)


def _config_from_tree(tree: dict[str, Any], overrides: list[str] | None) -> RunConfig:
    """One way overrides apply, whether the YAML came from a file or a checkpoint."""
    keys = []
    names_first = sorted(overrides or [], key=lambda o: o.partition("=")[0].strip()
                         .rpartition(".")[2] != "name")
    for item in names_first:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: expected key.sub=value")
        keys.append(key.strip())
        _set_dotted(tree, keys[-1], _parse_yaml(raw, f"override {item!r}") if raw.strip() else "")
    cfg = read_section(RunConfig, tree, "")
    cfg.validate()
    _warn_ignored(cfg, keys)
    return cfg


def parse_args(argv: list[str] | None = None) -> RunConfig:
    """The training command line (``[--config F] [k=v ...]``) as a validated config."""
    parser = argparse.ArgumentParser(
        prog="python -m shadowsync.pipelines.train",
        description="Distributed DLRM training: TorchRec model-parallel embeddings, dense "
                    "replicas kept in step by a pluggable wrapper.")
    parser.add_argument("--config", help="YAML preset (see pipelines/configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sync.strategy.name=ma")
    args = parser.parse_args(argv)
    return load_config(args.config, args.overrides)


def check_writable(url: str, key: str) -> None:
    """Checks that a job can create or write the folder ``url``, without creating it: an entry
    is made and removed in ``url``, or where it does not exist yet, in the nearest folder above
    it that does. The part from a ``${...}`` macro on (torchx expands them at launch) is not
    checked; remote URLs are left to the first write.

    Raises:
        OSError: naming ``key`` and the path.
    """
    fs, path = fsspec.core.url_to_fs(url)
    if "file" not in fs.protocol:
        return
    existing = Path(path.split("${", 1)[0] or ".")
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is not a folder")
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=existing))
    except OSError as e:
        raise OSError(f"{key}: {url} is not writable ({e.strerror or e})") from None


def check_folders(cfg: RunConfig) -> None:
    """``output_dir`` and ``checkpoint.dir`` can be written (:func:`check_writable`)."""
    for key, url in (("output_dir", cfg.output_dir), ("checkpoint.dir", cfg.checkpoint.dir)):
        if url is not None:
            check_writable(url, key)


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML, which :func:`load_config` and :func:`config_from_text`
    read back to an equal config."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(dump_config(cfg))


def config_from_text(text: str, where: str, overrides: list[str] | None = None) -> RunConfig:
    """A resolved config's YAML (:func:`dump_config`; a checkpoint's ``config.yaml``) with
    ``overrides`` on top (as :func:`load_config`), validated; errors in the YAML name
    ``where``."""
    tree = _parse_yaml(text, where)
    if not isinstance(tree, dict):
        raise ValueError(f"{where}: the top level must be a mapping")
    if isinstance(tree.get("sync"), dict):  # stored by an earlier version: flat sync keys
        tree["sync"] = migrate(tree["sync"])
    return _config_from_tree(tree, overrides)
