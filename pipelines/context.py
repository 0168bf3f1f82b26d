"""What every part of a run is built from: its settings, its place in the job, its clock, its
instrumentation and its fault domain (torchtitan passes its managers to the constructors that
need them the same way)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from shadowsync.pipelines.build import DistEnv
from shadowsync.pipelines.callbacks import Callbacks, TrainCallback
from shadowsync.pipelines.config import RunConfig
from shadowsync.pipelines.fault_domain import FaultDomain

__all__ = ["RunContext"]


@dataclasses.dataclass(frozen=True)
class RunContext:
    """A run's context, shared by the trainer and its parts.

    Attributes:
        cfg: the run's settings.
        env: this process's rank, world and device.
        domain: the process's fault domain: the synchronizer reports to it, the ranks agree on
            its stop requests.
        callbacks: the instrumentation (:class:`~.callbacks.TrainCallback`), timed on
            ``clock``.
        clock: seconds, what the run is timed with (training time and examples/s, the pace
            that spaces the control checks, phases).
    """

    cfg: RunConfig
    env: DistEnv
    domain: FaultDomain
    callbacks: Callbacks
    clock: Callable[[], float]

    @classmethod
    def of(cls, cfg: RunConfig, env: DistEnv, domain: FaultDomain | None = None,
           callbacks: Sequence[TrainCallback] = (),
           clock: Callable[[], float] = time.perf_counter) -> RunContext:
        """The context of ``cfg`` on ``env``: a new fault domain (without a SIGTERM handler)
        unless one is given, and ``callbacks`` timed on ``clock``."""
        return cls(cfg, env, FaultDomain() if domain is None else domain,
                   Callbacks(callbacks, clock), clock)
