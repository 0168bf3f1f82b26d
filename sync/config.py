"""The synchronizer's settings (``sync.*``), their valid ranges and the registry of strategies.

Imports neither torch nor the pipeline: a config is checked (at ``torchx run`` time, say) before
anything heavy loads, and ``shadowsync.sync`` stands on its own. The ``sync`` section has four
parts, each a dataclass read and checked on its own (an unknown key fails naming it):

=====================  ==========================================================================
``sync.strategy``      which algorithm (``name``) and that algorithm's own options, as ``model``
                       has them: ``alpha`` for ``easgd``; a strategy of one's own by import path
                       with ``options`` of its own
``sync.schedule``      when rounds run: ``mode``, ``period``, pacing, ``max_staleness``,
                       ``final_sync``
``sync.transport``     how rounds travel: ``backend``, ``wire_dtype``, ``chunk_mb``,
                       ``socket_ifname``, ``thread_nice``
``sync.failure``       what a failed or stalled synchronizer does: ``on_failure``, ``timeout_s``,
                       ``rejoin_after_steps``
=====================  ==========================================================================

The flat keys of earlier versions (``sync.algorithm``, ``sync.mode``, ...) fail with one line
naming their new place (:data:`MOVED`); configs stored by earlier versions (a checkpoint's
``config.yaml``) are read through :func:`migrate`.

Example::

    ALGORITHMS.register("my_avg", Algorithm("my_pkg.sync:MyAveraging", strategy=True))
    cfg = SyncConfig.from_dict({"strategy": {"name": "my_avg"}, "schedule": {"mode": "shadow"}})
    cfg.validate()
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from shadowsync.registry import Registry, import_path
from shadowsync.sections import Range, check_fields, check_range, read_section

__all__ = ["ALGORITHMS", "MOVED", "RANGES", "Algorithm", "BMUFConfig", "CustomStrategyConfig",
           "EASGDConfig", "FailureConfig", "ScheduleConfig", "StrategyConfig", "SyncConfig",
           "TransportConfig", "check", "migrate", "strategy_algorithms"]


# Every range of a synchronizer setting, written once: the config checks them with the setting's
# dotted name, the strategy and runner constructors with their argument's.
RANGES: dict[str, Range] = {
    "period": Range(1),
    "alpha": Range(0, 1, (False, True)),
    "block_momentum": Range(0, 1, (True, False)),
    "block_lr": Range(0, closed=(False, True)),
    "min_interval_s": Range(0),
    "max_comm_share": Range(0, 1, (False, True)),
    "max_slowdown": Range(0, 1, (False, False)),
    "slowdown_window": Range(1),
    "chunk_mb": Range(0, closed=(False, True)),
    "timeout_s": Range(0, closed=(False, True)),
    "rejoin_after_steps": Range(1),
    "thread_nice": Range(0, 19),
    "max_staleness": Range(1),
}


def check(name: str, value: float | None, key: str | None = None) -> None:
    """Raises ``ValueError`` naming ``key`` (default ``name``) if ``value`` is outside
    ``RANGES[name]``; None (a setting left unset) passes."""
    check_range(key or name, value, RANGES[name])


# ---------------------------------------------------------------------------- sync.strategy
@dataclass
class StrategyConfig:
    """``sync.strategy``: ``name`` picks the algorithm (see :data:`ALGORITHMS`); the section's
    other keys are that algorithm's options (a subclass per algorithm that has any)."""

    name: str = "none"

    def validate(self, prefix: str = "sync.strategy") -> None:
        """Raises ``ValueError`` naming ``prefix.<key>`` of the first bad option."""
        check_fields(self, prefix, RANGES)

    def strategy_options(self) -> Any:
        """What the strategy's ``from_config`` receives: this config, for the built-ins."""
        return self

    @staticmethod
    def config_class(raw: dict[str, Any], key: str) -> type[StrategyConfig]:
        """The options class the ``name`` in the raw section asks for."""
        name = raw.get("name", StrategyConfig.name)
        if not isinstance(name, str):
            raise ValueError(f"{key}.name: expected a string, got {name!r}")
        return ALGORITHMS.get(name).options


@dataclass
class EASGDConfig(StrategyConfig):
    """Elastic averaging: ``alpha`` is the elastic pull (see ``ElasticAveraging``)."""

    name: str = "easgd"
    alpha: float = 0.5


@dataclass
class BMUFConfig(StrategyConfig):
    """Blockwise model-update filtering: block momentum (None: ``1 - 1 / world``), block
    learning rate and Nesterov (see ``BlockwiseModelUpdateFiltering``)."""

    name: str = "bmuf"
    block_momentum: float | None = None
    block_lr: float = 1.0
    nesterov: bool = False


@dataclass
class CustomStrategyConfig(StrategyConfig):
    """A user's own ``SyncStrategy`` subclass: ``name`` is its import path, ``module:Class``.

    ``options`` are read into the dataclass that the class's ``from_config`` annotates its
    ``options`` parameter with, and checked like every other setting (errors name
    ``sync.strategy.options.<key>``); without such an annotation it gets the plain mapping.
    Validating imports the class, so a wrong path fails before training.
    """

    options: dict[str, Any] = field(default_factory=dict)

    def strategy_options(self) -> Any:
        target = import_path(self.name, ALGORITHMS.key)
        try:
            hints = typing.get_type_hints(target.from_config)
        except (AttributeError, NameError, TypeError) as e:
            raise ValueError(f"sync.strategy.name: {self.name!r} has no from_config whose "
                             f"annotations resolve ({type(e).__name__}: {e})") from e
        options_class = hints.get("options")
        if not (isinstance(options_class, type) and dataclasses.is_dataclass(options_class)):
            base = import_path("shadowsync.sync.strategies:SyncStrategy", ALGORITHMS.key)
            if self.options and target.from_config.__func__ is base.from_config.__func__:
                raise ValueError(f"sync.strategy.options: {self.name!r} takes no options (its "
                                 f"from_config is SyncStrategy's), got {sorted(self.options)}")
            return self.options
        options = read_section(options_class, self.options, "sync.strategy.options")
        if isinstance(options, StrategyConfig):
            options.validate("sync.strategy.options")
        return options

    def validate(self, prefix: str = "sync.strategy") -> None:
        del prefix
        self.strategy_options()


@dataclass(frozen=True)
class Algorithm:
    """A registered ``sync.strategy.name``.

    Args:
        target: ``"module:attr"`` of its implementation, imported on first use: a
            ``SyncStrategy`` subclass when ``strategy`` (run by the ShadowSync runner, in
            shadow or fixed-rate mode), else a replica wrapper class for TorchRec's
            ``DistributedModelParallel`` (a baseline). Either has ``from_config``.
        strategy: whether it is a ShadowSync strategy.
        options: the ``sync.strategy`` section it is read into.
        schedule: for a baseline, the ``sync.schedule`` settings it reads.
    """

    target: str
    strategy: bool
    options: type[StrategyConfig] = StrategyConfig
    schedule: tuple[str, ...] = ()

    def load(self) -> Any:
        return import_path(self.target, ALGORITHMS.key)


# The values of ``sync.strategy.name``; an unregistered ``"module:Class"`` names a
# ``SyncStrategy`` subclass of the user's own (imported when the config is validated).
ALGORITHMS: Registry[Algorithm] = Registry(
    "sync.strategy.name", "strategy",
    by_path=lambda path: Algorithm(path, strategy=True, options=CustomStrategyConfig))


def strategy_algorithms() -> list[str]:
    """The registered ShadowSync strategies (the names ``sync.schedule.mode`` applies to), in
    the order they were registered."""
    return [n for n, a in ALGORITHMS.items() if a.strategy]


# ---------------------------------------------------------------------- the other sections
@dataclass
class ScheduleConfig:
    """``sync.schedule``: when rounds run.

    ``mode: shadow`` runs rounds on a background thread while training goes on (back to back
    by default); ``mode: fixed_rate`` runs the same round blocking every ``period`` steps.

    Pacing of shadow rounds, each a pause after a round, agreed by every rank in the round's
    own allreduce and counted in training steps from the step that applies the round:
    ``min_interval_s`` between round starts; ``max_comm_share`` of the time spent in rounds
    (with ``sync.transport.chunk_mb`` its pause is also spread between the chunks);
    ``max_slowdown``, the share of the training step rate the user accepts to lose (0.05:
    keep >= 95%), measured online from what a round in flight costs the steps it touches over
    the last ``slowdown_window`` such steps. ``max_staleness`` K makes every round land at
    most K steps after its snapshot: rounds then start every K steps (plus any pause) at the
    same steps on every rank, and the K-th step waits for whatever of a round K steps of
    training did not hide. ``final_sync``: replicas end identical at every evaluation,
    checkpoint and the end (the strategy's consensus).
    """

    mode: Literal["shadow", "fixed_rate"] = "shadow"
    period: int = 1
    min_interval_s: float = 0.0
    max_comm_share: float | None = None
    max_slowdown: float | None = None
    slowdown_window: int = 128
    max_staleness: int | None = None
    final_sync: bool = True


@dataclass
class TransportConfig:
    """``sync.transport``: how rounds travel.

    ``backend`` carries the synchronizer's own process group: ``gloo`` (it reduces CUDA
    tensors too, through host memory); ``nccl`` only in fixed-rate mode and on GPUs, since the
    shadow thread's NCCL collectives beside training's on one device have no safe order.
    ``wire_dtype`` sends each round's payload in bfloat16 or float16 (differences to a
    rank-identical reference; half the bytes), or int8 (blocks of 256 values with a float32
    scale and error feedback; 0.254 of float32's bytes; the control slots stay float32).
    ``chunk_mb`` splits each round's allreduce into collectives of at most that size, so a
    round never queues more than one chunk ahead of the embedding all-to-alls on a shared
    link. ``socket_ifname`` sends the synchronizer's gloo traffic from that interface or
    address alias, which a network can put in a lower traffic class. ``thread_nice`` raises
    the shadow thread's nice value (Linux: per thread), so a round's CPU work yields to
    training on cores training keeps busy. ``two_level`` (replica groups only) sums a dense
    round inside each group first, so a host's ranks send one dense copy across between them
    (2 hosts); off, one allreduce over every rank: fewer collectives a round, 1.5 copies
    across for 2 hosts of 2 ranks.
    """

    backend: Literal["gloo", "nccl"] = "gloo"
    wire_dtype: Literal["float32", "bfloat16", "float16", "int8"] = "float32"
    chunk_mb: float | None = None
    socket_ifname: str | None = None
    thread_nice: int = 0
    two_level: bool = True


@dataclass
class FailureConfig:
    """``sync.failure``: what a failed or stalled synchronizer does.

    ``timeout_s`` bounds one collective on the synchronizer's group and how long a round may
    stay in flight before it counts as stalled (an agreed pause between rounds never counts).
    ``on_failure: raise`` stops the job with an error naming the rank; ``degrade`` lets every
    rank train its own replica (all switch on one step) and rejoin after
    ``rejoin_after_steps`` steps, or at the next checkpoint, evaluation or end if sooner, on a
    fresh group with the replicas averaged. A non-finite replica or delta always raises.
    """

    on_failure: Literal["raise", "degrade"] = "raise"
    timeout_s: float = 300.0
    rejoin_after_steps: int = 200


# Where each flat key of earlier versions went.
MOVED: dict[str, str] = {
    "algorithm": "strategy.name",
    **{k: f"strategy.{k}" for k in ("alpha", "block_momentum", "block_lr", "nesterov")},
    **{f.name: f"schedule.{f.name}" for f in dataclasses.fields(ScheduleConfig)},
    **{f.name: f"transport.{f.name}" for f in dataclasses.fields(TransportConfig)},
    **{f.name: f"failure.{f.name}" for f in dataclasses.fields(FailureConfig)},
}

# Which settings only one mode reads.
_FIXED_RATE_ONLY = ("schedule.period",)
_SHADOW_ONLY = ("schedule.min_interval_s", "schedule.max_comm_share", "schedule.max_slowdown",
                "schedule.slowdown_window", "schedule.max_staleness", "transport.thread_nice")


@dataclass
class SyncConfig:
    """How dense replicas are kept in step: ``sync.strategy`` ``ma``, ``easgd`` and ``bmuf`` are
    ShadowSync strategies, run as ``sync.schedule`` says; ``none`` and ``ddp`` are the
    baselines, ``torch_averager`` PyTorch's own ``PeriodicModelAverager`` every
    ``sync.schedule.period`` steps (an outside reference)."""

    MOVED: ClassVar[dict[str, str]] = {k: f"sync.{v}" for k, v in MOVED.items()}

    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    failure: FailureConfig = field(default_factory=FailureConfig)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SyncConfig:
        """The ``sync`` section from a plain mapping (as YAML gives it), checked key by key."""
        cfg: SyncConfig = read_section(cls, raw, "sync")
        return cfg

    @property
    def algorithm(self) -> Algorithm:
        """The registry entry of ``strategy.name``."""
        return ALGORITHMS.get(self.strategy.name)

    @property
    def chunk_bytes(self) -> int | None:
        """``transport.chunk_mb`` in bytes (at least 16), or None."""
        mb = self.transport.chunk_mb
        return None if mb is None else max(16, int(mb * 2**20))

    def validate(self) -> None:
        """Raises ``ValueError`` naming the ``sync.*`` setting that is out of range, a strategy
        that is not registered, or a combination that cannot run."""
        algorithm = self.algorithm
        self.strategy.validate()
        for name in ("schedule", "transport", "failure"):
            check_fields(getattr(self, name), f"sync.{name}", RANGES)
        t = self.transport
        if t.socket_ifname is not None and t.backend != "gloo":
            raise ValueError("sync.transport.socket_ifname binds a gloo group: it needs "
                             f"sync.transport.backend=gloo, got {t.backend!r}")
        if algorithm.strategy and self.schedule.mode == "shadow" and t.backend != "gloo":
            raise ValueError(
                f"sync.transport.backend={t.backend} cannot carry shadow rounds (a thread's "
                "NCCL collectives beside training's on one device have no safe order): use "
                "sync.transport.backend=gloo, which reduces CUDA tensors too")

    def check_device(self, device_type: str) -> None:
        """Raises ``ValueError`` if the transport cannot run where training does (NCCL off
        CUDA); checked before launch and again where a wrapper is wrapped."""
        if self.transport.backend == "nccl" and device_type != "cuda":
            raise ValueError(f"sync.transport.backend=nccl needs CUDA; this job trains on "
                             f"{device_type}: use sync.transport.backend=gloo")

    def ignored(self) -> dict[str, str]:
        """The settings (``section.key``) that do nothing under this strategy and mode, each
        with where it would act, so that an override that changes nothing can be pointed out.
        A strategy's own options are never here: they exist only under that strategy."""
        algorithm = self.algorithm
        every = [f"{s}.{f.name}" for s in ("schedule", "transport", "failure")
                 for f in dataclasses.fields(getattr(self, s))]
        if not algorithm.strategy:
            strategies = strategy_algorithms()
            names = f"{', '.join(strategies[:-1])} or {strategies[-1]}"
            return {k: f"sync.strategy.name {names}" for k in every
                    if k.partition(".")[2] not in algorithm.schedule}
        if self.schedule.mode == "fixed_rate":
            return dict.fromkeys(_SHADOW_ONLY, "sync.schedule.mode=shadow")
        readers = [n for n, a in sorted(ALGORITHMS.items()) if "period" in a.schedule]
        where = dict.fromkeys(_FIXED_RATE_ONLY, " or ".join(
            ["sync.schedule.mode=fixed_rate"] + [f"sync.strategy.name={n}" for n in readers]))
        if self.schedule.max_slowdown is None:
            where["schedule.slowdown_window"] = "sync.schedule.max_slowdown set"
        return where


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A ``sync`` section as stored by an earlier version (flat keys) in today's shape; one
    already in today's shape is returned as it is. A strategy option the named strategy does
    not have (earlier versions stored every option whatever the algorithm, and the algorithm
    ignored the others) is dropped."""
    flat = {k: v for k, v in raw.items() if k in MOVED}
    if not flat:
        return raw
    out: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v
                           for k, v in raw.items() if k not in MOVED}
    name = flat.get("algorithm", StrategyConfig.name)
    own = {f.name for f in dataclasses.fields(ALGORITHMS.get(name).options)}
    for key, value in flat.items():
        section, _, leaf = MOVED[key].partition(".")
        if section == "strategy" and leaf not in own:
            continue
        out.setdefault(section, {})[leaf] = value
    return out


ALGORITHMS.register("none", Algorithm("shadowsync.sync.wrapper:LocalReplicas", strategy=False))
ALGORITHMS.register("ddp", Algorithm("shadowsync.sync.wrapper:DDPReplicas", strategy=False))
ALGORITHMS.register("torch_averager", Algorithm(
    "shadowsync.sync.wrapper:PeriodicAveragerReplicas", strategy=False, schedule=("period",)))
ALGORITHMS.rename("pma", "torch_averager")
ALGORITHMS.register("ma", Algorithm("shadowsync.sync.strategies:ModelAveraging", strategy=True))
ALGORITHMS.register("easgd", Algorithm("shadowsync.sync.strategies:ElasticAveraging",
                                       strategy=True, options=EASGDConfig))
ALGORITHMS.register("bmuf", Algorithm("shadowsync.sync.strategies:BlockwiseModelUpdateFiltering",
                                      strategy=True, options=BMUFConfig))
