"""The synchronizer's settings, their valid ranges and the registry of ``sync.algorithm`` values.

Imports neither torch nor the pipeline: a config is checked (at ``torchx run`` time, say) before
anything heavy loads, and ``shadowsync.sync`` stands on its own. Each algorithm is registered
in :data:`ALGORITHMS` by the import path of what implements it, loaded on first use.

Example::

    ALGORITHMS.register("my_avg", Algorithm("my_pkg.sync:MyAveraging", strategy=True))
    cfg = SyncConfig(algorithm="my_avg", mode="shadow")
    cfg.validate()
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from shadowsync.registry import Registry, import_path

__all__ = ["ALGORITHMS", "RANGES", "Algorithm", "SyncConfig", "check", "strategy_algorithms"]


@dataclass(frozen=True)
class Interval:
    """A range of valid values; ``closed`` says which ends belong to it."""

    low: float
    high: float = math.inf
    closed: tuple[bool, bool] = (True, True)

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>=' if self.closed[0] else '>'} {self.low:g}"
        return (f"in {'[' if self.closed[0] else '('}{self.low:g}, {self.high:g}"
                f"{']' if self.closed[1] else ')'}")

    def __contains__(self, value: float) -> bool:
        above = value >= self.low if self.closed[0] else value > self.low
        below = value <= self.high if self.closed[1] else value < self.high
        return above and below


# Every range of a synchronizer setting, written once: the config checks them with the setting's
# dotted name, the strategy and runner constructors with their argument's.
RANGES: dict[str, Interval] = {
    "period": Interval(1),
    "alpha": Interval(0, 1, (False, True)),
    "block_momentum": Interval(0, 1, (True, False)),
    "block_lr": Interval(0, closed=(False, True)),
    "min_interval_s": Interval(0),
    "max_comm_share": Interval(0, 1, (False, True)),
    "max_slowdown": Interval(0, 1, (False, False)),
    "slowdown_window": Interval(1),
    "chunk_mb": Interval(0, closed=(False, True)),
    "timeout_s": Interval(0, closed=(False, True)),
    "rejoin_after_steps": Interval(1),
    "thread_nice": Interval(0, 19),
    "max_staleness": Interval(1),
}


def check(name: str, value: float | None, key: str | None = None) -> None:
    """Raises ``ValueError`` naming ``key`` (default ``name``) if ``value`` is outside
    ``RANGES[name]``; None (a setting left unset) passes."""
    if value is not None and value not in RANGES[name]:
        raise ValueError(f"{key or name} must be {RANGES[name]}, got {value}")


@dataclass(frozen=True)
class Algorithm:
    """A registered ``sync.algorithm``.

    Args:
        target: ``"module:attr"`` of its implementation, imported on first use: a
            :class:`~shadowsync.sync.strategies.SyncStrategy` subclass when ``strategy`` (run by
            the ShadowSync runner, in shadow or fixed-rate mode), else a replica wrapper class
            for TorchRec's ``DistributedModelParallel`` (a baseline). Either has
            ``from_config(SyncConfig)``.
        strategy: whether it is a ShadowSync strategy.
        reads: the settings it alone reads (beyond those of every strategy or wrapper).
    """

    target: str
    strategy: bool
    reads: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.reads) - {f.name for f in dataclasses.fields(SyncConfig)}
        if unknown:
            raise ValueError(f"sync algorithm {self.target!r} reads unknown settings "
                             f"{sorted(unknown)}")

    def load(self) -> Any:
        return import_path(self.target, ALGORITHMS.key)


# The values of ``sync.algorithm``; an unregistered ``"module:Class"`` names a
# :class:`~shadowsync.sync.strategies.SyncStrategy` subclass of the user's own (imported when
# the synchronizer is built).
ALGORITHMS: Registry[Algorithm] = Registry(
    "sync.algorithm", "algorithm", by_path=lambda path: Algorithm(path, strategy=True))


def strategy_algorithms() -> list[str]:
    """The registered ShadowSync strategies (the algorithms ``sync.mode`` applies to), in the
    order they were registered."""
    return [n for n, a in ALGORITHMS.items() if a.strategy]


# Settings of every strategy run by the ShadowSync runner, and which of them each mode reads.
_FIXED_RATE_ONLY = ("period",)
_SHADOW_ONLY = ("min_interval_s", "max_comm_share", "max_slowdown", "slowdown_window",
                "thread_nice", "max_staleness")


@dataclass
class SyncConfig:
    """How dense replicas are kept in step (``ddp`` and ``none`` are the baselines).

    ``ma``, ``easgd`` and ``bmuf`` are ShadowSync strategies, run in the background
    (``mode: shadow``) or blocking every ``period`` steps (``mode: fixed_rate``).
    ``torch_averager`` is PyTorch's own ``PeriodicModelAverager`` every ``period`` steps, an
    outside reference.
    ``backend`` carries the synchronizer's own process group. It defaults to gloo on GPUs too:
    NCCL does not promise that collectives issued from two threads on two communicators of one
    device make progress, and the shadow thread does exactly that beside training's NCCL.

    ``timeout_s`` bounds one synchronization collective on that group and, in shadow mode, how
    long training runs without a completed round before the synchronizer counts as stalled.
    ``on_failure`` says what a failed or stalled synchronizer does: ``raise`` stops the job with
    an error naming the rank; ``degrade`` lets every rank train its own replica (all ranks switch
    on the same step) and rejoin after ``rejoin_after_steps`` steps, or at the next checkpoint,
    evaluation or end of training if sooner, on a fresh group with the replicas averaged.

    Pacing of shadow rounds: ``max_slowdown`` is the share of the training step rate the user
    accepts to lose to synchronization (0.05: keep >= 95%); the runner measures what a round in
    flight costs a step and spaces rounds to stay within it, so the sync gap adapts to the
    link, the CPU and the model; it estimates that cost from the last ``slowdown_window`` steps
    a round touched (longer: steadier, so a smaller margin for noise and more frequent rounds;
    shorter: follows a change in the round's cost sooner). ``min_interval_s`` and
    ``max_comm_share`` are fixed floors on the spacing (with ``chunk_mb``, ``max_comm_share``'s
    pause is taken between the chunks).
    ``wire_dtype`` sends each round's payload in bfloat16 or float16 (differences
    to a rank-identical reference; half the bytes), shadow and fixed-rate alike. ``chunk_mb``
    splits each round's allreduce into collectives of at most that size, so a round never
    queues more than one chunk ahead of the embedding all-to-alls on a shared link.
    ``socket_ifname`` sends the synchronizer's gloo traffic from that interface (or address
    alias) rather than ``GLOO_SOCKET_IFNAME``'s, so the network can give it a lower traffic
    class than training's collectives. ``thread_nice`` raises the shadow thread's nice
    value (Linux: per thread) so that its CPU work, the round's copies, reduction and socket
    I/O, yields to training on cores that training keeps busy: the CPU counterpart of a low
    traffic class. ``max_staleness`` bounds how many steps a round may stay in flight: at that
    step training waits for it, so every sync lands at most that many steps after its snapshot
    (``1``: a sync every step, each round hidden behind one step of training).
    """

    algorithm: str = "none"
    mode: Literal["shadow", "fixed_rate"] = "shadow"
    period: int = 1
    alpha: float = 0.5
    block_momentum: float | None = None
    block_lr: float = 1.0
    nesterov: bool = False
    min_interval_s: float = 0.0
    max_comm_share: float | None = None
    max_slowdown: float | None = None
    slowdown_window: int = 128
    wire_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    chunk_mb: float | None = None
    final_sync: bool = True
    timeout_s: float = 300.0
    backend: Literal["gloo", "nccl"] = "gloo"
    on_failure: Literal["raise", "degrade"] = "raise"
    rejoin_after_steps: int = 200
    socket_ifname: str | None = None
    thread_nice: int = 0
    max_staleness: int | None = None

    def validate(self) -> None:
        """Raises ``ValueError`` naming the ``sync.*`` setting that is out of range or an
        algorithm that is not registered."""
        ALGORITHMS.get(self.algorithm)
        for name in RANGES:
            check(name, getattr(self, name), f"sync.{name}")
        if self.socket_ifname is not None and self.backend != "gloo":
            raise ValueError("sync.socket_ifname binds a gloo group: it needs sync.backend=gloo, "
                             f"got {self.backend!r}")

    def ignored(self) -> dict[str, str]:
        """The settings that do nothing under this ``algorithm`` and ``mode``, each with where
        it would act, so that an override that changes nothing can be pointed out."""
        chosen = ALGORITHMS.get(self.algorithm)
        strategies = strategy_algorithms()
        if not chosen.strategy:
            names = f"{', '.join(strategies[:-1])} or {strategies[-1]}"
            return {f.name: f"sync.algorithm {names}" for f in dataclasses.fields(self)
                    if f.name != "algorithm" and f.name not in chosen.reads}
        where: dict[str, str] = {}
        for name in strategies if self.algorithm in ALGORITHMS else []:  # own: may read any
            for setting in ALGORITHMS.get(name).reads:
                if setting not in chosen.reads:
                    where[setting] = f"sync.algorithm={name}"
        if self.mode == "shadow":
            readers = [n for n, a in sorted(ALGORITHMS.items()) if "period" in a.reads]
            where.update(dict.fromkeys(_FIXED_RATE_ONLY, " or ".join(
                ["sync.mode=fixed_rate"] + [f"sync.algorithm={n}" for n in readers])))
            if self.max_slowdown is None:
                where["slowdown_window"] = "sync.max_slowdown set"
        else:
            where.update(dict.fromkeys(_SHADOW_ONLY, "sync.mode=shadow"))
        return where


ALGORITHMS.register("none", Algorithm("shadowsync.sync.wrapper:LocalReplicas", strategy=False))
ALGORITHMS.register("ddp", Algorithm("shadowsync.sync.wrapper:DDPReplicas", strategy=False))
ALGORITHMS.register("torch_averager", Algorithm(
    "shadowsync.sync.wrapper:PeriodicAveragerReplicas", strategy=False, reads=("period",)))
ALGORITHMS.rename("pma", "torch_averager")
ALGORITHMS.register("ma", Algorithm("shadowsync.sync.strategies:ModelAveraging", strategy=True))
ALGORITHMS.register("easgd", Algorithm("shadowsync.sync.strategies:ElasticAveraging",
                                       strategy=True, reads=("alpha",)))
ALGORITHMS.register("bmuf", Algorithm("shadowsync.sync.strategies:BlockwiseModelUpdateFiltering",
                                      strategy=True, reads=("block_momentum", "block_lr",
                                                            "nesterov")))
