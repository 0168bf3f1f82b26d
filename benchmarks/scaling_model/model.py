"""The analytic scaling model: throughput and sync gap of each arm for N trainers from measured
constants (the equations are the package's docstring)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

TRAINERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)

STRATEGIES = ("ma", "easgd", "bmuf")

DEFAULT_PERIOD = 10

RESULTS = Path(__file__).resolve().parent / "results" / "scaling_model"

MODEL_BANNER = ("**This is a model, not a measurement**: constants measured on one machine "
                "(1 and 2 ranks) extrapolated with the equations below.")


@dataclasses.dataclass(frozen=True)
class Arm:
    """One synchronization arm, named as ``bench_sync.py`` names it."""

    kind: Literal["none", "ddp", "fixed_rate", "shadow"]
    strategy: str | None = None
    period: int = DEFAULT_PERIOD

    @property
    def name(self) -> str:
        if self.kind == "fixed_rate":
            return f"fixed-rate {self.strategy} k={self.period}"
        if self.kind == "shadow":
            return f"shadow {self.strategy}"
        return self.kind

    @property
    def overrides(self) -> str:
        """The config overrides that run this arm (``bench_sync.py --arm``)."""
        if self.kind in ("none", "ddp"):
            return f"sync.strategy.name={self.kind}"
        mode = f"sync.schedule.mode={self.kind}"
        period = f" sync.schedule.period={self.period}" if self.kind == "fixed_rate" else ""
        return f"sync.strategy.name={self.strategy} {mode}{period}"


def arms(period: int = DEFAULT_PERIOD) -> list[Arm]:
    """none, ddp, then fixed-rate and shadow for every strategy."""
    return [Arm("none"), Arm("ddp"),
            *(Arm("fixed_rate", s, period) for s in STRATEGIES),
            *(Arm("shadow", s) for s in STRATEGIES)]


@dataclasses.dataclass(frozen=True)
class Network:
    """Per-message latency ``alpha`` (s) and per-trainer bandwidth ``beta`` (bytes/s)."""

    latency_s: float
    bandwidth_Bps: float
    allreduce: Literal["ring", "tree"] = "ring"

    @classmethod
    def of(cls, gbps: float, latency_us: float,
           allreduce: Literal["ring", "tree"] = "ring") -> Network:
        return cls(latency_us * 1e-6, gbps * 1e9 / 8, allreduce)

    def describe(self) -> str:
        return (f"{self.bandwidth_Bps * 8 / 1e9:g} Gbit/s, {self.latency_s * 1e6:g} us latency, "
                f"{self.allreduce} allreduce")


def allreduce_s(nbytes: float, n: int, net: Network) -> float:
    """Time of one allreduce of ``nbytes`` over ``n`` trainers (see the module docstring)."""
    if n == 1:
        return 0.0
    if net.allreduce == "tree":
        return 2 * nbytes / net.bandwidth_Bps + 2 * math.ceil(math.log2(n)) * net.latency_s
    return 2 * (n - 1) / n * nbytes / net.bandwidth_Bps + 2 * (n - 1) * net.latency_s


def all_to_all_s(nbytes: float, n: int, net: Network) -> float:
    """Both sparse all-to-alls of one step, ``nbytes`` each per trainer (0 without sharding)."""
    if n == 1 or nbytes == 0:
        return 0.0
    return 2 * ((n - 1) / n * nbytes / net.bandwidth_Bps + (n - 1) * net.latency_s)


@dataclasses.dataclass(frozen=True)
class Constants:
    """What the model needs of one model/preset; see :func:`constants` for how it is measured."""

    batch_size: int
    step_s: float
    dense_bytes: float
    a2a_bytes: float
    ddp_overhead_s: float
    round_local_s: Mapping[str, float]
    contention: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Prediction:
    step_s: float
    examples_per_s: float
    sync_gap: float  # NaN for arms that keep no separate replicas (none, ddp)


def predict(arm: Arm, n: int, k: Constants, net: Network) -> Prediction:
    """The model's step time, examples/s and sync gap of ``arm`` on ``n`` trainers."""
    base = k.step_s + all_to_all_s(k.a2a_bytes, n, net)
    gap = math.nan
    if arm.kind == "none":
        step = base
    elif arm.kind == "ddp":
        step = base + k.ddp_overhead_s + allreduce_s(k.dense_bytes, n, net)
    else:
        assert arm.strategy is not None
        round_s = k.round_local_s[arm.strategy] + allreduce_s(k.dense_bytes, n, net)
        if arm.kind == "fixed_rate":
            step = base + round_s / arm.period
            gap = float(arm.period)
        else:
            step = base * (1 + k.contention[arm.strategy])
            gap = float(max(1, math.ceil(round_s / step)))
    return Prediction(step, n * k.batch_size / step, gap)


# ---------------------------------------------------------------------- calibration file
@dataclasses.dataclass(frozen=True)
class Point:
    """A measured point: medians over repeats of ``bench_sync.py``."""

    examples_per_s: float
    sync_gap: float


def measured(preset: Mapping[str, Any]) -> dict[int, dict[str, Point]]:
    """``{world size: {arm name: Point}}`` from a preset's entry in the calibration file."""
    return {int(n): {name: Point(p["examples_per_s"], p.get("sync_gap_mean", math.nan))
                     for name, p in by_arm.items()}
            for n, by_arm in preset["measured"].items()}


def constants(preset: Mapping[str, Any], contention: float | None = None) -> Constants:
    """The model's constants from the measured N = 1 points and micro-measurements.

    ``t1`` is the ``none`` arm's step alone; DDP's overhead ``d`` and the shadow contention ``c``
    are what their N = 1 steps add to it (clipped at 0: noise can make them negative), since at
    N = 1 no byte crosses a network. ``contention`` replaces the measured ``c`` of every
    strategy (for GPU trainers, where the thread does not take the trainer's cores).
    """
    batch = int(preset["batch_size"])
    one = measured(preset)[1]

    def step(name: str) -> float:
        return batch / one[name].examples_per_s

    t1 = step("none")
    return Constants(
        batch_size=batch,
        step_s=t1,
        dense_bytes=float(preset["dense_bytes"]),
        a2a_bytes=float(preset["a2a_bytes"]),
        ddp_overhead_s=max(0.0, step("ddp") - t1),
        round_local_s=dict(preset["round_local_s"]),
        contention={s: contention if contention is not None
                    else max(0.0, step(Arm("shadow", s).name) / t1 - 1) for s in STRATEGIES},
    )


def with_dense_bytes(k: Constants, nbytes: float) -> Constants:
    """``k`` for a dense part of ``nbytes`` (what-if): one round's local work scales with it."""
    scale = nbytes / k.dense_bytes
    return dataclasses.replace(k, dense_bytes=nbytes, round_local_s={
        s: r * scale for s, r in k.round_local_s.items()})


def with_step(k: Constants, seconds: float) -> Constants:
    """``k`` for a step of ``seconds`` alone (what-if: a GPU trainer's step, most of it
    device time): DDP's overhead and a round's local work stay as measured."""
    if not seconds > 0:
        raise ValueError(f"a step must last > 0 s, got {seconds}")
    return dataclasses.replace(k, step_s=seconds)


def loopback(calibration: Mapping[str, Any]) -> Network:
    """The measured loopback network (2 ranks), to predict the measured points with."""
    fit = calibration["allreduce_fit"]
    return Network(fit["latency_s"], fit["bandwidth_Bps"])
