"""The synchronizer's settings, their valid ranges and the registry of ``sync.algorithm`` values.

Imports neither torch nor the pipeline: a config is checked (at ``torchx run`` time, say) before
anything heavy loads, and ``shadowsync.sync`` stands on its own. Each algorithm is registered
by the import path of what implements it, loaded on first use.

Example::

    register_algorithm("my_avg", "my_pkg.sync:MyAveraging", strategy=True)  # a SyncStrategy
    cfg = SyncConfig(algorithm="my_avg", mode="shadow")
    cfg.validate()
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["RANGES", "Algorithm", "SyncConfig", "algorithm", "check", "register_algorithm",
           "registered_algorithms", "strategy_algorithms"]


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
    "chunk_mb": Interval(0, closed=(False, True)),
    "timeout_s": Interval(0, closed=(False, True)),
    "rejoin_after_steps": Interval(1),
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

    def load(self) -> Any:
        module, _, attr = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"sync.algorithm: cannot import {self.target!r} "
                             f"({type(e).__name__}: {e})") from e


_ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(name: str, target: str, *, strategy: bool,
                       reads: tuple[str, ...] = ()) -> None:
    """Makes ``sync.algorithm: name`` build ``target`` (see :class:`Algorithm`)."""
    if name in _ALGORITHMS:
        raise ValueError(f"sync algorithm {name!r} is registered twice")
    unknown = set(reads) - {f.name for f in dataclasses.fields(SyncConfig)}
    if unknown:
        raise ValueError(f"sync algorithm {name!r} reads unknown settings {sorted(unknown)}")
    _ALGORITHMS[name] = Algorithm(target, strategy, reads)


def registered_algorithms() -> list[str]:
    return sorted(_ALGORITHMS)


def strategy_algorithms() -> list[str]:
    """The registered ShadowSync strategies (the algorithms ``sync.mode`` applies to), in the
    order they were registered."""
    return [n for n, a in _ALGORITHMS.items() if a.strategy]


def algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; a ``"module:Class"`` path names a
    :class:`~shadowsync.sync.strategies.SyncStrategy` subclass of the user's own (imported when
    the synchronizer is built)."""
    if name in _ALGORITHMS:
        return _ALGORITHMS[name]
    module, _, attr = name.partition(":")
    if module and attr.isidentifier():
        return Algorithm(name, strategy=True)
    raise ValueError(f"sync.algorithm: must be one of {registered_algorithms()} or "
                     f"'module:StrategyClass', got {name!r}")


# Settings of every strategy run by the ShadowSync runner, and which of them each mode reads.
_FIXED_RATE_ONLY = ("period",)
_SHADOW_ONLY = ("min_interval_s", "max_comm_share", "max_slowdown")


@dataclass
class SyncConfig:
    """How dense replicas are kept in step (``ddp`` and ``none`` are the baselines).

    ``ma``, ``easgd`` and ``bmuf`` are ShadowSync strategies, run in the background
    (``mode: shadow``) or blocking every ``period`` steps (``mode: fixed_rate``). ``pma`` is
    PyTorch's own ``PeriodicModelAverager`` every ``period`` steps, an outside reference.
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
    link, the CPU and the model. ``min_interval_s`` and ``max_comm_share`` are fixed floors on
    the spacing (with ``chunk_mb``, ``max_comm_share``'s pause is taken between the chunks).
    ``wire_dtype`` sends each round's payload in bfloat16 or float16 (differences
    to a rank-identical reference; half the bytes), shadow and fixed-rate alike. ``chunk_mb``
    splits each round's allreduce into collectives of at most that size, so a round never
    queues more than one chunk ahead of the embedding all-to-alls on a shared link.
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
    wire_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    chunk_mb: float | None = None
    final_sync: bool = True
    timeout_s: float = 300.0
    backend: Literal["gloo", "nccl"] = "gloo"
    on_failure: Literal["raise", "degrade"] = "raise"
    rejoin_after_steps: int = 200

    def validate(self) -> None:
        """Raises ``ValueError`` naming the ``sync.*`` setting that is out of range or an
        algorithm that is not registered."""
        algorithm(self.algorithm)
        for name in RANGES:
            check(name, getattr(self, name), f"sync.{name}")

    def ignored(self) -> dict[str, str]:
        """The settings that do nothing under this ``algorithm`` and ``mode``, each with where
        it would act, so that an override that changes nothing can be pointed out."""
        chosen = algorithm(self.algorithm)
        strategies = strategy_algorithms()
        if not chosen.strategy:
            names = f"{', '.join(strategies[:-1])} or {strategies[-1]}"
            return {f.name: f"sync.algorithm {names}" for f in dataclasses.fields(self)
                    if f.name != "algorithm" and f.name not in chosen.reads}
        where: dict[str, str] = {}
        for name in strategies if self.algorithm in _ALGORITHMS else []:  # own: may read any
            for setting in _ALGORITHMS[name].reads:
                if setting not in chosen.reads:
                    where[setting] = f"sync.algorithm={name}"
        if self.mode == "shadow":
            readers = [n for n, a in sorted(_ALGORITHMS.items()) if "period" in a.reads]
            where.update(dict.fromkeys(_FIXED_RATE_ONLY, " or ".join(
                ["sync.mode=fixed_rate"] + [f"sync.algorithm={n}" for n in readers])))
        else:
            where.update(dict.fromkeys(_SHADOW_ONLY, "sync.mode=shadow"))
        return where


register_algorithm("none", "shadowsync.sync.wrapper:LocalReplicas", strategy=False)
register_algorithm("ddp", "shadowsync.sync.wrapper:DDPReplicas", strategy=False)
register_algorithm("pma", "shadowsync.sync.wrapper:PeriodicAveragerReplicas", strategy=False,
                   reads=("period",))
register_algorithm("ma", "shadowsync.sync.strategies:ModelAveraging", strategy=True)
register_algorithm("easgd", "shadowsync.sync.strategies:ElasticAveraging", strategy=True,
                   reads=("alpha",))
register_algorithm("bmuf", "shadowsync.sync.strategies:BlockwiseModelUpdateFiltering",
                   strategy=True, reads=("block_momentum", "block_lr", "nesterov"))
