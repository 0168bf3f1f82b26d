"""Runners that drive a :class:`~.strategies.SyncStrategy` over the dense replicas.

Two runners share one round function (snapshot -> ``reduce_input`` -> SUM-allreduce -> ``delta``):

* :class:`ShadowSyncRunner` runs rounds back to back (or paced) on a background thread and its own
  process group while training continues, as in ShadowSync (Zheng et al., arXiv:2003.03477,
  Sec. 3): the training loop only copies a snapshot and adds finished deltas between steps.
* :class:`FixedRateSyncRunner` runs the same round blocking on the training thread every
  ``period`` steps: the paper's FR-* baselines, and local SGD / post-local SGD model averaging
  (Lin et al., arXiv:1808.07217) when the strategy is model averaging.

Facts these rely on: gloo collectives release the GIL; a thread must never write live parameters
while autograd runs (it fails with "modified by an inplace operation" and takes the peer down),
so the thread only posts deltas; and the stop request travels inside the reduced buffer so every
rank leaves on the same round.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import dataclasses
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from shadowsync.sync.config import check
from shadowsync.sync.strategies import SyncStrategy

__all__ = [
    "FixedRateSyncRunner",
    "NonFiniteError",
    "PeerAborted",
    "ShadowSyncRunner",
    "SlowdownPacer",
    "SyncError",
    "SyncRunner",
    "SyncStats",
    "average_",
    "broadcast_",
    "new_sync_group",
]

logger = logging.getLogger(__name__)

_CONTROL = 2  # [stop, quiet seconds] after the payload, then the abort flags by rank
_POLL_S = 0.002  # how often stop() services snapshot requests while the thread winds down


class SyncError(RuntimeError):
    """Synchronization failed on this rank (or a peer aborted); the message names the rank."""


class PeerAborted(SyncError):
    """Another rank's synchronization failed and told this one so (the abort flag): a
    consequence, not a cause; that rank reports the cause."""


class NonFiniteError(SyncError):
    """A replica (its snapshot) or a round's delta held NaN or inf; names the round."""


@dataclasses.dataclass(frozen=True)
class SyncStats:
    """Per-rank synchronization telemetry.

    Attributes:
        steps: training steps seen by :meth:`SyncRunner.step`.
        rounds: strategy rounds completed (the final consensus is not a round).
        syncs_applied: deltas added to the live replica.
        gap_mean: mean training steps between consecutive applied syncs (the first gap
            counts from the first step); NaN before any sync.
        gap_max: largest such gap; 0 before any sync.
        staleness_mean: mean training steps between a round's snapshot and the application of its
            delta (0 for fixed-rate); NaN before any sync.
        staleness_max: largest such staleness.
        comm_seconds: wall seconds spent in allreduces, waiting for peers included.
        bytes_reduced: payload bytes handed to allreduce (flags and consensus included); a ring
            allreduce sends about ``2 (W - 1) / W`` times this per rank.
        wall_seconds: seconds the runner has been started (summed over start/stop cycles).
        rounds_per_s: ``rounds / wall_seconds``.
        round_cost: what a round in flight costs a training step, ``t_busy / t_quiet - 1``, as
            measured by the accepted-slowdown pacer against the quiet steps beside each round
            (NaN without ``max_slowdown``).
        busy_share: the share of training steps a round touched, per that pacer (NaN without).
        round_steps: what one round costs training, in steps at the quiet pace, per that pacer
            (it keeps one round per ``round_steps / max_slowdown`` steps; NaN without).
        wait_seconds: seconds training waited at step boundaries for a round to finish, which
            only a shadow runner with ``max_staleness`` does (NaN without).
    """

    steps: int
    rounds: int
    syncs_applied: int
    gap_mean: float
    gap_max: int
    staleness_mean: float
    staleness_max: int
    comm_seconds: float
    bytes_reduced: int
    wall_seconds: float
    rounds_per_s: float
    round_cost: float = math.nan
    busy_share: float = math.nan
    round_steps: float = math.nan
    wait_seconds: float = math.nan


@dataclasses.dataclass
class _Counters:
    steps: int = 0
    rounds: int = 0
    syncs_applied: int = 0
    last_apply_step: int = 0
    gap_sum: int = 0
    gap_max: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    comm_seconds: float = 0.0
    bytes_reduced: int = 0
    wall_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class _Control:
    """What the ranks agreed in one allreduce: stop after it, and the pause before the next."""

    stop: bool
    quiet_s: float


@dataclasses.dataclass(frozen=True)
class _Delta:
    """A finished round: the delta, its CUDA completion event (None on CPU), its snapshot step."""

    delta: Tensor
    ready: torch.cuda.Event | None
    snapshot_step: int


def _check_params(params: Sequence[Tensor]) -> list[Tensor]:
    """Validate that ``params`` can share one flat buffer: same dtype and device, no repeats."""
    params = list(params)
    if not params:
        raise ValueError("params is empty: there are no dense parameters to synchronize")
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"params[{i}] is a {type(p).__name__}, not a Tensor")
        if p.is_sparse or not p.is_floating_point():
            raise ValueError(f"params[{i}] must be a dense floating-point tensor, got "
                             f"{p.dtype} (sparse={p.is_sparse})")
        if (p.dtype, p.device) != (params[0].dtype, params[0].device):
            raise ValueError(f"params[{i}] is {p.dtype} on {p.device} but params[0] is "
                             f"{params[0].dtype} on {params[0].device}: one flat buffer needs one "
                             "dtype and device; group parameters into one runner per dtype")
    if len({id(p) for p in params}) != len(params):
        raise ValueError("params contains the same tensor twice; its delta would apply twice")
    return params


def _require_dist() -> None:
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call init_process_group first")


def new_sync_group(backend: str = "gloo", timeout: timedelta = timedelta(minutes=10),
                   socket_ifname: str | None = None) -> dist.ProcessGroup:
    """Create the process group that carries synchronization collectives.

    A group of its own keeps the runner's allreduces from interleaving with the training loop's
    collectives (TorchRec's all-to-alls) on the default group. ``dist.new_group`` is itself
    collective: call this on every rank, in the same order, before any thread starts. ``timeout``
    bounds how long a rank waits in a collective for a peer that died or stopped participating.

    Prefer ``gloo`` (it reduces CUDA tensors too, staging them through host memory) when the
    training loop itself uses NCCL: NCCL documents that issuing operations from several threads
    to independent communicators on the same device is not safe (NCCL user guide, "Thread
    Safety" / "Using multiple NCCL communicators concurrently"), and a shadow round is exactly
    that.

    ``socket_ifname`` (gloo only) binds the group to that network interface instead of
    ``GLOO_SOCKET_IFNAME``'s: synchronization traffic then leaves from an address of its own,
    which a network can put in a lower traffic class than the embedding all-to-alls (or on a
    second NIC). An address alias (``ip addr add ... label eth0:sync``) counts as an interface.
    """
    _require_dist()
    if timeout <= timedelta(0):
        raise ValueError(f"timeout must be positive, got {timeout}")
    if socket_ifname is None:
        return dist.new_group(backend=backend, timeout=timeout)
    if backend != "gloo":
        raise ValueError(f"socket_ifname applies to gloo groups, not {backend!r}")
    # new_group passes no device options to gloo (torch 2.13 ignores pg_options there); the
    # group's constructor reads GLOO_SOCKET_IFNAME, so it is set for that call alone.
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = socket_ifname
    try:
        return dist.new_group(backend=backend, timeout=timeout)
    finally:
        if before is None:
            del os.environ["GLOO_SOCKET_IFNAME"]
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before


@torch.no_grad()
def broadcast_(params: Sequence[Tensor], group: dist.ProcessGroup | None = None,
               src: int = 0) -> None:
    """Overwrite every rank's ``params`` with rank ``src``'s (a global rank), in one collective.

    Runners assume identical replicas at :meth:`SyncRunner.start` (the strategies' center and
    global model are taken from the local replica); this establishes it.
    """
    _overwrite(params, lambda flat: dist.broadcast(flat, src=src, group=group))


@torch.no_grad()
def average_(params: Sequence[Tensor], group: dist.ProcessGroup | None = None) -> None:
    """Overwrite every rank's ``params`` with their mean over ``group``, in one collective:
    replicas that trained apart (a degraded synchronizer) become one again."""
    _overwrite(params, lambda flat: (dist.all_reduce(flat, group=group),
                                     flat.div_(dist.get_world_size(group))))


def _overwrite(params: Sequence[Tensor], collective: Callable[[Tensor], object]) -> None:
    """Run ``collective`` in place on the parameters flattened into one buffer; copy back."""
    _require_dist()
    params = _check_params(params)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    collective(flat)
    torch._foreach_copy_(params, _views(flat, params))


def _views(flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    """Views of ``flat`` shaped like ``params``, in order."""
    return [chunk.view_as(p) for chunk, p in zip(flat.split([p.numel() for p in params]),
                                                 params, strict=True)]


class SyncRunner(abc.ABC):
    """Owns the live dense parameters, the flat buffers, the strategy and the sync group.

    Shared by both runners: flattening, the round function, the abort protocol, applying deltas,
    the final consensus, telemetry and state. ``chunk_bytes`` splits each allreduce into
    collectives of at most that many bytes: a round then never puts more than one chunk at a
    time in front of the training loop's own traffic (TorchRec's all-to-alls) on a shared link.
    The reduced buffer is ``[payload (numel), stop, quiet seconds, abort by rank]``: the control
    values ride in the same allreduce as the payload, so every rank learns of a stop request, a
    peer's failure or the agreed pause on the same round and nobody is left blocked in a
    collective.

    Lifecycle (every call collective across ranks unless noted)::

        group = new_sync_group()            # every rank, before any thread starts
        broadcast_(params)                  # replicas identical
        runner = ShadowSyncRunner(params, strategy, group)   # or FixedRateSyncRunner
        runner.start()
        for batch in data:
            loss = ...; loss.backward(); optimizer.step()
            runner.step()                   # local: may apply a delta / take a snapshot
        runner.stop(final_sync=True)        # replicas end bit-identical
    """

    def __init__(self, params: Sequence[Tensor], strategy: SyncStrategy,
                 group: dist.ProcessGroup, *, chunk_bytes: int | None = None) -> None:
        _require_dist()
        if chunk_bytes is not None and chunk_bytes < 16:
            raise ValueError(f"chunk_bytes must be >= 16 or None, got {chunk_bytes}")
        if not isinstance(strategy, SyncStrategy):
            raise TypeError(f"strategy must be a SyncStrategy, got {type(strategy).__name__}")
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a ProcessGroup (see new_sync_group()), "
                            f"got {type(group).__name__}")
        self._params = _check_params(params)
        self._strategy = strategy
        self._group = group
        self._rank = dist.get_rank()
        self._world_size = dist.get_world_size(group)
        self._device = self._params[0].device
        self._numel = sum(p.numel() for p in self._params)
        dtype = self._params[0].dtype
        self._snapshot = torch.empty(self._numel, dtype=dtype, device=self._device)
        self._snapshot_views = _views(self._snapshot, self._params)
        # The reduced buffer: [payload (numel, in the strategy's wire dtype), stop, quiet seconds,
        # abort by rank (world size)]. The control values ride in the payload's allreduce, so
        # every rank learns of a stop request, of which peer failed, and of the agreed pause
        # before the next round on the same round, and nobody is left blocked.
        self._comm = torch.empty(self._numel + _CONTROL + self._world_size,
                                 dtype=strategy.wire_dtype or dtype, device=self._device)
        self._reduced = self._comm[: self._numel]
        self._chunk_numel = (self._comm.numel() if chunk_bytes is None
                             else max(1, chunk_bytes // self._comm.element_size()))
        self._peers_told = False  # an abort round was spent, or peers cannot be reached
        # Seconds paused per second of synchronization work (shadow's max_comm_share: between
        # chunks and after the round), and how long the last round paused between chunks.
        self._comm_pause = 0.0
        self._paused_in_round = 0.0
        self._snapshot_step = 0  # the training step the snapshot was taken at
        self._stream: torch.cuda.Stream | None = None
        self._strategy_ready = False
        self._running = False
        self._started_at = 0.0
        self._error: BaseException | None = None
        # Called once with this rank's own failure (not a peer's abort), from whichever thread
        # found it, before peers are told: the trainer reports it to the job from there.
        self.on_failure: Callable[[SyncError], None] | None = None
        self._lock = threading.Lock()
        self._counters = _Counters()
        self._step_busy = False  # synchronization touched the step in progress

    # ------------------------------------------------------------------ public API
    @property
    def strategy(self) -> SyncStrategy:
        """The strategy (its state is only consistent across ranks while stopped)."""
        return self._strategy

    def start(self) -> None:
        """Begin synchronizing; replicas must be identical (see :func:`broadcast_`) the first time.

        The first :meth:`start` (or :meth:`load_state_dict`) initializes the strategy from the
        live replica; later ones (after :meth:`stop`) resume with the current strategy state.
        """
        if self._running:
            raise RuntimeError("start() called twice without stop()")
        if self._error is not None:
            raise RuntimeError("this runner failed earlier; create a new one") from self._error
        self._init_strategy()
        self._peers_told = False
        self._running = True
        self._step_busy = False
        self._started_at = time.perf_counter()

    @abc.abstractmethod
    def step(self) -> None:
        """Call once per training step, after ``optimizer.step()``, on every rank."""

    @abc.abstractmethod
    def stop(self, final_sync: bool = True) -> None:
        """Stop synchronizing on every rank; with ``final_sync`` replicas end bit-identical."""

    def abandon(self) -> None:
        """Local: stop using this runner without a collective, after it failed on some rank
        (:meth:`stop` needs every rank for one more round; a failed peer has none). The runner
        cannot be started again; its group is left to time out."""
        with self._lock:
            self._error = self._error or SyncError(f"rank {self._rank}: runner abandoned")
        if self._running:
            self._mark_stopped()

    @property
    def step_busy(self) -> bool:
        """Whether synchronization touches the training step in progress (since the last
        :meth:`step`): it began with a blocking round (fixed rate), or with a round's snapshot
        or delta, or a round is in flight (shadow). What the accepted-slowdown pacer times, and
        what a per-step trace marks."""
        return self._step_busy

    @property
    def syncs_applied(self) -> int:
        """Deltas added to the live replica so far (training thread; cheap enough to read
        every step, unlike :meth:`stats`)."""
        return self._counters.syncs_applied

    def stats(self) -> SyncStats:
        """Telemetry of this rank so far."""
        with self._lock:
            c = dataclasses.replace(self._counters)
        wall = c.wall_seconds + (time.perf_counter() - self._started_at if self._running else 0.0)
        applied = c.syncs_applied
        return SyncStats(
            steps=c.steps,
            rounds=c.rounds,
            syncs_applied=applied,
            gap_mean=c.gap_sum / applied if applied else math.nan,
            gap_max=c.gap_max,
            staleness_mean=c.staleness_sum / applied if applied else math.nan,
            staleness_max=c.staleness_max,
            comm_seconds=c.comm_seconds,
            bytes_reduced=c.bytes_reduced,
            wall_seconds=wall,
            rounds_per_s=c.rounds / wall if wall > 0 else 0.0,
            **self._mode_stats(),
        )

    def _mode_stats(self) -> dict[str, float]:
        """Telemetry only some runners have: the pacer's and the staleness bound's (see
        :class:`ShadowSyncRunner`)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Strategy state plus the telemetry counters (rank-consistent; see subclasses for when).

        The step counter matters beyond telemetry: fixed-rate rounds are scheduled on it.
        """
        self._init_strategy()
        counters = dataclasses.asdict(self._counters)
        counters["wall_seconds"] = self.stats().wall_seconds
        return {"strategy": self._strategy.state_dict(), "counters": counters}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output, after the replica itself has been restored."""
        self._init_strategy()
        self._strategy.load_state_dict(state_dict["strategy"])
        self._counters = _Counters(**state_dict["counters"])
        if self._running:
            self._started_at = time.perf_counter()

    # ------------------------------------------------------------------ shared machinery
    def _init_strategy(self) -> None:
        if not self._strategy_ready:
            self._copy_live_to_snapshot()
            self._strategy.init(self._snapshot, self._world_size)
            self._strategy_ready = True

    def _require_running(self, what: str) -> None:
        if not self._running:
            raise RuntimeError(f"{what} called on a runner that is not started")

    def failure(self) -> SyncError | None:
        """The failure this runner recorded (its own, or a peer's abort), as :meth:`step` would
        raise it; None while it has not failed."""
        return None if self._error is None else self._sync_error(self._error)

    def _raise_failure(self) -> None:
        """Raise the recorded failure, if any, as a SyncError naming this rank."""
        err = self._error
        if err is not None:
            raise self._sync_error(err) from err

    def _sync_error(self, err: BaseException) -> SyncError:
        """``err`` as raised to the training loop: a SyncError naming this rank, of the same
        subclass when ``err`` is one (a peer's abort, a non-finite replica)."""
        cls = type(err) if isinstance(err, SyncError) else SyncError
        return cls(f"rank {self._rank}: synchronization failed: {type(err).__name__}: {err}")

    @torch.no_grad()
    def _copy_live_to_snapshot(self) -> None:
        """Snapshot the live replica; on the runner's side stream (if any), fenced both ways.

        The side stream waits for the main stream's pending work on the parameters, and the main
        stream waits for the copy before it can overwrite them in the next optimizer step.
        """
        self._snapshot_step = self._counters.steps
        if self._stream is None:
            torch._foreach_copy_(self._snapshot_views, self._params)
            return
        main = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(main)
        with torch.cuda.stream(self._stream):
            torch._foreach_copy_(self._snapshot_views, self._params)
        main.wait_stream(self._stream)

    def _allreduce(self, comm: Tensor, payload: Tensor | None, *, stop: bool = False,
                   quiet_s: float = 0.0, abort: bool = False, paced: bool = False) -> _Control:
        """SUM-allreduce ``payload`` (zeros if None) and the control values through ``comm``:
        whether any rank asked to stop, and the ranks' mean ``quiet_s`` (each rank's proposal
        for the pause before the next round). Raises :class:`PeerAborted` naming the ranks that
        aborted.

        Reading the flags synchronizes the calling thread with its current stream; in shadow mode
        that is the sync thread and its side stream, never the training loop.
        """
        n = self._numel
        with record_function("shadowsync.allreduce"):
            if payload is None:
                comm[:n].zero_()
            else:
                comm[:n].copy_(payload)
            comm[n:].zero_()
            comm[n].fill_(float(stop))
            comm[n + 1].fill_(quiet_s)
            if abort:
                comm[n + _CONTROL + self._rank].fill_(1.0)
            began = time.perf_counter()
            paused, fastest = 0.0, math.inf
            chunks = comm.split(self._chunk_numel)
            try:
                for i, chunk in enumerate(chunks):
                    sent = time.perf_counter()
                    dist.all_reduce(chunk, op=dist.ReduceOp.SUM, group=self._group)
                    if paced and self._comm_pause > 0 and i + 1 < len(chunks):
                        # Leave the link to training's own traffic for a while: the round's
                        # share of link time stays max_comm_share within the round too. The
                        # fastest chunk so far is the transfer time; a slower one also waited
                        # for a peer's pause, and pausing on that would feed back.
                        fastest = min(fastest, time.perf_counter() - sent)
                        pause = fastest * self._comm_pause
                        time.sleep(pause)
                        paused += pause
            except BaseException:
                self._peers_told = True  # the group itself is in doubt: no abort round
                raise
            control = comm[n:].tolist()
            elapsed = time.perf_counter() - began - paused
            if paced:
                self._paused_in_round = paused
        with self._lock:
            self._counters.comm_seconds += elapsed
            self._counters.bytes_reduced += comm.numel() * comm.element_size()
        aborted = [r for r, flag in enumerate(control[_CONTROL:]) if flag > 0 and r != self._rank]
        if aborted:
            self._peers_told = True  # every rank saw the same flags in this round
            raise PeerAborted(f"rank(s) {aborted} failed and aborted synchronization round "
                              f"{self._counters.rounds + 1} (see that rank's error)")
        return _Control(stop=control[0] > 0, quiet_s=control[1] / self._world_size)

    def _fail(self, exc: BaseException) -> None:
        """Record a failure of this rank's synchronization and make sure peers learn of it.

        Every failure path (strategy math, pacing, posting, a non-finite replica) ends here, so
        a peer waiting in its current or next round gets an abort flag and fails fast instead of
        waiting for the group's timeout. Peers are not told when they already know (a peer's
        abort, a stop round every rank has left) or cannot be (the collective itself failed).
        """
        with self._lock:
            self._error = self._error or exc
        if self.on_failure is not None and not isinstance(exc, PeerAborted):
            try:  # before the peers learn of it, so that their report can name this one
                self.on_failure(self._sync_error(exc))
            except Exception:
                logger.warning("rank %d: the failure hook failed", self._rank, exc_info=True)
        if not self._peers_told:
            self._peers_told = True
            try:
                self._allreduce(self._comm, None, abort=True)
            except BaseException:  # the group may be broken already; peers hit its timeout
                logger.warning("rank %d: could not notify peers of the failure", self._rank,
                               exc_info=True)

    def _check_finite(self, t: Tensor, what: str) -> None:
        """Raise :class:`NonFiniteError` if ``t`` holds NaN or inf (one fused reduction, read
        on the thread that runs the round)."""
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteError(
                f"rank {self._rank}: {what} is not finite in synchronization round "
                f"{self._counters.rounds + 1} (snapshot of step {self._snapshot_step})")

    def _round(self, request_stop: bool = False, quiet_s: float = 0.0
               ) -> tuple[Tensor, _Control]:
        """One strategy round on the snapshot, with this rank's stop request and proposed pause;
        returns the delta and what the ranks agreed.

        The caller hands any exception to :meth:`_fail`. A replica or delta that is not finite
        raises :class:`NonFiniteError` on the rank that holds it, before its peers average it in.
        """
        self._check_finite(self._snapshot, "the dense replica")
        with record_function("shadowsync.reduce_input"):
            payload = self._strategy.reduce_input(self._snapshot)
        control = self._allreduce(self._comm, payload, stop=request_stop, quiet_s=quiet_s,
                                  paced=True)
        if control.stop:
            self._peers_told = True  # every rank leaves after this round
        with record_function("shadowsync.delta"):
            delta = self._strategy.delta(self._snapshot, self._reduced)
        self._check_finite(delta, "the delta")
        with self._lock:
            self._counters.rounds += 1
        return delta, control

    @torch.no_grad()
    def _apply(self, done: _Delta) -> None:
        """Add a finished delta to the live replica (training thread, between steps)."""
        with record_function("shadowsync.apply"):
            if done.ready is not None:
                main = torch.cuda.current_stream(self._device)
                main.wait_event(done.ready)
                done.delta.record_stream(main)
            torch._foreach_add_(self._params, _views(done.delta, self._params))
        c = self._counters
        with self._lock:
            gap, staleness = c.steps - c.last_apply_step, c.steps - done.snapshot_step
            c.syncs_applied += 1
            c.last_apply_step = c.steps
            c.gap_sum += gap
            c.gap_max = max(c.gap_max, gap)
            c.staleness_sum += staleness
            c.staleness_max = max(c.staleness_max, staleness)

    @torch.no_grad()
    def _consensus(self) -> None:
        """Blocking: overwrite every replica with the strategy's consensus model.

        Overwriting (not adding a delta) is what makes replicas bit-identical: the consensus is a
        function of the reduced buffer alone, and every rank receives the same reduced bits.
        """
        with record_function("shadowsync.consensus"):
            self._copy_live_to_snapshot()
            # Full precision whatever the wire dtype: the consensus is the model that is kept.
            comm = torch.empty(self._comm.numel(), dtype=self._snapshot.dtype,
                               device=self._device)
            self._allreduce(comm, self._strategy.consensus_input(self._snapshot))
            model = self._strategy.consensus(comm[: self._numel])
            self._check_finite(model, "the consensus model")
            torch._foreach_copy_(self._params, _views(model, self._params))

    def _mark_stopped(self) -> None:
        with self._lock:
            self._counters.wall_seconds += time.perf_counter() - self._started_at
        self._running = False


class FixedRateSyncRunner(SyncRunner):
    """Blocking synchronization every ``period`` training steps (the paper's FR-* baselines).

    The round runs on the training thread and its delta is added at once, so there is no
    staleness. Rounds follow after steps ``1, period + 1, 2 * period + 1, ...`` (counted over the
    runner's lifetime, checkpoints included): exactly the schedule of
    ``torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager(period,
    warmup_steps=0)``, whose counter averages when ``step % period == 0`` *before* incrementing.
    With :class:`~.strategies.ModelAveraging` the two produce the same replicas (up to the
    rounding of ``x + (mean - x)`` versus ``mean``).

    Every rank must call :meth:`SyncRunner.step` the same number of times. State is
    rank-consistent after any step, so :meth:`SyncRunner.state_dict` and ``load_state_dict`` may
    be called while running.
    """

    def __init__(self, params: Sequence[Tensor], strategy: SyncStrategy,
                 group: dist.ProcessGroup, *, period: int, chunk_bytes: int | None = None
                 ) -> None:
        if isinstance(period, bool) or not isinstance(period, int):
            raise ValueError(f"period must be an int, got {period!r}")
        check("period", period)
        super().__init__(params, strategy, group, chunk_bytes=chunk_bytes)
        self._period = period

    def step(self) -> None:
        self._require_running("step()")
        self._raise_failure()
        c = self._counters
        c.steps += 1
        self._step_busy = not (c.steps - 1) % self._period
        if not self._step_busy:
            return
        self._copy_live_to_snapshot()
        try:
            delta, _ = self._round()
        except Exception as exc:
            self._fail(exc)
            raise self._sync_error(exc) from exc
        self._apply(_Delta(delta, None, c.steps))

    def stop(self, final_sync: bool = True) -> None:
        self._require_running("stop()")
        self._mark_stopped()
        self._raise_failure()
        if final_sync:
            self._consensus()


class SlowdownPacer:
    """Finds online how often a shadow round may start for training to lose at most
    ``max_slowdown`` of its step rate (the accepted-slowdown pacing of
    :class:`ShadowSyncRunner`).

    The training loop reports each step's wall time, whether a round touched it (the step
    applied a delta, took a snapshot, or ran while a round was in flight) and whether it began
    one (took its snapshot). Each run of *busy* steps is compared with the runs of *quiet* steps
    just before and after it: its excess over the quiet pace beside it, in steps at that pace,
    over the rounds that began in it, is what a round costs training, ``C`` steps' worth of
    time. Beside, not overall: a machine's speed drifts, and where most steps are busy the
    recent quiet steps go back far enough to carry that drift into ``C``; estimates too low
    overspend by more than estimates too high underspend (on emulated 1 Gbit/s hosts a 12%
    budget read costs from -0.03 to 0.25 turn to turn against recent means, and lost 15%).
    Until a busy run has quiet steps on both sides, the means of the recent ``window`` steps of
    each kind, times the busy steps per round so far, stand in.

    Per round, not per busy step: a round's work (the snapshot copy, the reduction, its socket
    I/O, the delta) is the same however many steps it spans, so one round every ``G`` steps
    costs ``C / G`` of the step rate, and the runner keeps ``G >= C / max_slowdown``. A cost per
    busy step would change with the rounds' spacing: on emulated 1 Gbit/s hosts a lone round
    spanned two busy steps (+14% and +2%) while back-to-back rounds, one a step, cost each of
    them +12%, so a per-step cost read from lone rounds let rounds go back to back at twice the
    budget.

    ``C`` is first raised for its noise: for the same convexity, noise that puts the estimate
    low overspends by more than noise that puts it as far high underspends (on emulated
    10 Gbit/s hosts one 4% budget read costs of 0.01 to 0.21 turn to turn and lost 8%). With
    ``se`` the ratio estimator's standard error over the bracketed runs, the loss averages
    ``max_slowdown (1 + se**2 / C**2)`` to second order, so ``C`` is raised by ``se**2 / C``;
    where ``C`` is within one ``se`` of zero (nothing tells a cheap round from a free one), by
    ``se``. The margin shrinks as the runs agree and as there are more of them, so
    ``cost_window`` holds more busy steps than ``window``: a round's cost drifts far less than
    the machine's pace, which the bracketing follows instead.

    A round that kept ``n_b`` steps busy is followed by ``G - n_b`` quiet steps. The pause is
    set in seconds, and some of it is not quiet (the step that applies the round's delta is
    busy, and it falls inside the pause): so the quiet steps a pause actually held are counted,
    and a shortfall against its target is added to the next pauses (integral control), or the
    rounds would come more often than ``G`` (on emulated 1 Gbit/s hosts the busy share ran at
    ~0.7 where ~0.55 was set). Rounds go back to back while ``G`` is no more than the steps a
    round keeps busy: one a step where a round costs less than the budget. Every
    ``explore_every`` rounds a few quiet steps are forced, so the quiet pace stays current even
    then. Means, not medians: the step rate is set by the mean step time, and much of a round's
    cost lands on one of its steps (the one that copies the snapshot), which a median would
    discard; on emulated 1 Gbit/s hosts the median-based pacer overshot a 5% budget.

    Args:
        max_slowdown: accepted loss of step rate, in (0, 1): 0.05 keeps >= 95% of it.
        window: steps of each kind whose mean is used (the quiet step time that converts a
            pause into seconds, and the round cost until runs are bracketed).
        explore_every: rounds between forced quiet windows when rounds are free enough to go
            back to back.
        cost_window: busy steps' worth of bracketed runs the round cost is estimated from.
    """

    def __init__(self, max_slowdown: float, window: int = 32, explore_every: int = 16,
                 cost_window: int = 128) -> None:
        check("max_slowdown", max_slowdown)
        check("slowdown_window", cost_window, "cost_window")
        for name, value in [("window", window), ("explore_every", explore_every)]:
            if value < 1:
                raise ValueError(f"SlowdownPacer {name} must be >= 1, got {value}")
        self.max_slowdown = max_slowdown
        self.explore_every = explore_every
        self.cost_window = cost_window
        self._quiet: collections.deque[float] = collections.deque(maxlen=window)
        self._busy: collections.deque[float] = collections.deque(maxlen=window)
        self._busy_steps_this_round = self._quiet_steps_this_round = 0
        self._busy_total = self._quiet_total = self._began_total = 0
        self._rounds = 0
        self._target: float | None = None  # quiet steps the last budgeted pause was to hold
        # The run of steps of one kind in progress, as (busy, seconds, steps, rounds begun).
        self._run: tuple[bool, float, int, int] | None = None
        self._quiet_before: float | None = None  # mean step of the last quiet run
        # The busy run awaiting its after: (seconds, steps, rounds begun, quiet pace before).
        self._pending: tuple[float, int, int, float] | None = None
        # Bracketed busy runs: (busy seconds, what they would have taken at the quiet pace
        # beside them, busy steps, rounds begun).
        self._bracketed: collections.deque[tuple[float, float, int, int]] = collections.deque()
        self._bracketed_steps = 0  # busy steps in _bracketed
        self._shortfall = 0.0  # quiet steps added to each budgeted pause
        self._lock = threading.Lock()  # observe() and the thread's reads run concurrently

    def observe(self, seconds: float, busy: bool, began_round: bool = False) -> None:
        """One training step's wall time, whether a round touched it, and whether it began
        one, i.e. took a round's snapshot (training thread)."""
        if began_round and not busy:
            raise ValueError("a step that began a round is busy")
        with self._lock:
            (self._busy if busy else self._quiet).append(seconds)
            if self._run is not None and self._run[0] != busy:
                self._close_run(*self._run)
            kind, total, steps, began = self._run or (busy, 0.0, 0, 0)
            self._run = (kind, total + seconds, steps + 1, began + began_round)
            self._began_total += began_round
            if busy:
                self._busy_steps_this_round += 1
                self._busy_total += 1
            else:
                self._quiet_steps_this_round += 1
                self._quiet_total += 1

    def _close_run(self, busy: bool, total: float, steps: int, began: int) -> None:
        """Ends the run in progress: a busy run waits for the quiet run after it; a quiet run
        brackets the busy run before it (lock held)."""
        self._run = None
        if busy:
            if self._quiet_before is not None:
                self._pending = (total, steps, began, self._quiet_before)
            return
        after = total / steps
        if self._pending is not None:
            busy_total, busy_steps, busy_began, before = self._pending
            self._pending = None
            self._bracketed.append((busy_total, busy_steps * (before + after) / 2, busy_steps,
                                    busy_began))
            self._bracketed_steps += busy_steps
            while self._bracketed_steps - self._bracketed[0][2] >= self.cost_window:
                self._bracketed_steps -= self._bracketed.popleft()[2]
        self._quiet_before = after

    def interrupt(self) -> None:
        """Training stops being observed for a while (a pause): the runs on either side of it
        do not bracket each other."""
        with self._lock:
            self._run = self._pending = self._quiet_before = None

    def round_cost(self) -> float:
        """What a round in flight costs a training step, ``t_busy / t_quiet - 1``, over the
        recent bracketed busy runs (the recent means of each kind before any); NaN before both
        kinds are measured."""
        with self._lock:
            if self._bracketed:
                return (sum(b for b, _, _, _ in self._bracketed)
                        / sum(q for _, q, _, _ in self._bracketed) - 1.0)
            return self._window_cost()

    def _window_cost(self) -> float:
        """``t_busy / t_quiet - 1`` from the recent means of each kind; NaN before both are
        measured (lock held)."""
        if not self._quiet or not self._busy:
            return math.nan
        return statistics.fmean(self._busy) / statistics.fmean(self._quiet) - 1.0

    def round_steps(self) -> float:
        """What a round costs training, ``C``, in steps at the quiet pace: the recent bracketed
        busy runs' excess over the rounds that began in them (before any, the recent means of
        each kind times the busy steps per round so far); NaN before both kinds and a round
        are measured."""
        return self._round_steps(margin=False)

    def _round_steps(self, margin: bool) -> float:
        """``C``, with ``margin`` raised for its noise: by ``se**2 / C``, or by ``se`` where
        ``C <= se`` (``se``: the ratio estimator's standard error over the bracketed runs, from
        residuals ``e - C n`` of each run's excess ``e`` and rounds ``n``; no margin with fewer
        than two runs)."""
        with self._lock:
            # Each run's excess in steps at the quiet pace beside it, and its rounds.
            runs = [(steps * (b - q) / q, n) for b, q, steps, n in self._bracketed]
            rounds = sum(n for _, n in runs)
            if rounds:
                cost = sum(e for e, _ in runs) / rounds
                if not margin or len(runs) < 2:
                    return cost
                squares = sum((e - cost * n) ** 2 for e, n in runs)
                se = math.sqrt(len(runs) / (len(runs) - 1) * squares) / rounds
                return cost + (se * se / cost if cost > se else se)
            if not self._began_total:
                return math.nan
            return self._window_cost() * self._busy_total / self._began_total

    def busy_share(self) -> float:
        """The share of all observed steps that were busy; NaN before any."""
        with self._lock:
            total = self._busy_total + self._quiet_total
            return self._busy_total / total if total else math.nan

    def round_gap(self) -> float:
        """The fewest steps from one round's start to the next that keep the budget: ``C``
        raised for its noise, over ``max_slowdown`` (NaN before any measurement)."""
        return self._round_steps(margin=True) / self.max_slowdown

    def quiet_seconds(self) -> float:
        """Called once per round as it starts (sync thread): this rank's proposal for the pause
        after it, from the busy steps the previous round caused and the current round gap."""
        gap = self.round_gap()
        with self._lock:
            self._rounds += 1
            busy_steps, self._busy_steps_this_round = max(self._busy_steps_this_round, 1), 0
            quiet_seen, self._quiet_steps_this_round = self._quiet_steps_this_round, 0
            if self._target is not None:  # half the last pause's shortfall, each round
                self._shortfall = min(max(0.0, self._shortfall
                                          + 0.5 * (self._target - quiet_seen)),
                                      float(self._quiet.maxlen or 0))
            self._target = None
            if not self._quiet:  # no quiet step measured yet: make room for a few
                return 3 * statistics.fmean(self._busy) if self._busy else 0.0
            t_quiet = statistics.fmean(self._quiet)
            explore = self._rounds % self.explore_every == 0
            quiet_steps = 0.0
            if gap > busy_steps:  # False while NaN: back to back until measured
                self._target = gap - busy_steps
                quiet_steps = self._target + self._shortfall
        if quiet_steps < 2 and explore:
            quiet_steps = 3.0  # keep t_q measured even when rounds go back to back
        return quiet_steps * t_quiet


class ShadowSyncRunner(SyncRunner):
    """ShadowSync: rounds run on a background thread while training continues.

    Zheng et al., "ShadowSync: Performing Synchronization in the Background for Highly Scalable
    Distributed Training", arXiv:2003.03477. The thread owns communication and strategy math; the
    training loop owns the parameters. Schedule of one round ``r`` (CUDA; on CPU there are no
    streams and copies are synchronous):

    ======  ===================  ===============  ==========================================
    stage   thread               CUDA stream      work and ordering
    ======  ===================  ===============  ==========================================
    ask     sync thread          --               request snapshot ``r`` (after posting delta
                                                  ``r-1``, under the hand-off lock); wait
    apply   training (step())    main             take the posted delta and the request in one
                                                  critical section; main waits delta
                                                  ``r-1``'s event; add it to the live params
    copy    training (step())    side             side waits main; live -> snapshot; main
                                                  waits side (next optimizer step must not
                                                  overwrite params mid-copy); notify thread
    train   training             main             steps continue; no sync work at all
    reduce  sync thread          side             ``reduce_input(snapshot)`` + flags into the
                                                  flat buffer; SUM-allreduce on the sync group
    flags   sync thread          side (host sync) read [stop, abort by rank]; only this thread
                                                  blocks
    delta   sync thread          side             ``delta(snapshot, reduced)``; record event;
                                                  post it (at most one posted at a time)
    pace    sync thread          --               stay quiet (see Pacing); then round ``r+1``
    ======  ===================  ===============  ==========================================

    Hand-off invariant: *snapshot r is taken after delta r-1 was added to the live replica, and
    delta r is posted only after delta r-1 was taken.* It holds by construction: the thread
    posts delta ``r-1`` before it requests snapshot ``r``, both under the hand-off lock, and a
    step boundary reads the posted delta and the request in one critical section and applies
    the delta before copying. So a boundary that sees request ``r`` also sees delta ``r-1``
    (or an earlier boundary took it), and delta ``r`` cannot be posted before snapshot ``r``
    was copied, by which time delta ``r-1`` was taken. A violation raises, also under ``-O``.

    A snapshot is taken only when the thread asks for one, so training pays one O(parameters)
    copy per round, not per step. The thread never writes live parameters.

    Pacing: round ``r+1`` starts no earlier than ``min_interval_s`` after round ``r`` started, no
    earlier than ``busy * (1 / max_comm_share - 1)`` after it ended (``busy``: the round's time from
    snapshot to posted delta), and, with ``max_slowdown``, after as many quiet training steps as
    :class:`SlowdownPacer` finds keep the step rate within that budget (its ``cost_window`` is
    ``slowdown_window``). Each rank proposes that pause in the round's buffer and all take the mean,
    so the ranks start their next round together. With ``chunk_bytes`` the ``max_comm_share`` pause
    is spread between the chunks (each chunk's transfer time times ``1 / max_comm_share - 1``), so a
    round never holds a shared link for more than one chunk at a time and training's own traffic
    gets through in between. The defaults run rounds back to back. ``thread_nice`` raises the
    thread's nice value: on cores that training keeps busy, a round's CPU work (copies, reduction,
    socket I/O) then runs in the time training leaves, and rounds take longer instead of slowing
    steps, as ``socket_ifname`` of :func:`new_sync_group` does for the link. A round whose next
    round may start at once is posted together with the next snapshot request, so a boundary can
    apply one round and start the next. A pause that :meth:`stop` cut short is finished after the
    next :meth:`start` before the first round, so stopping (say for a checkpoint) does not buy an
    unpaced round.

    Bounded staleness: with ``max_staleness`` ``K``, a boundary ``K`` steps after a round's
    snapshot waits until that round's delta is posted (``shadowsync.wait``), so no sync is
    older than ``K`` steps when it lands and the gap between syncs is at most ``K`` (plus any
    pacing pause). Training then waits only for the part of a round that ``K`` steps of
    training did not hide, unlike a fixed-rate round, which it waits for whole; ``K = 1`` with
    back-to-back rounds synchronizes every step (the stale-synchronous bound of Ho et al.,
    "More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server",
    NeurIPS 2013, on ShadowSync's snapshot/delta hand-off).

    Stopping: :meth:`stop` raises the stop flag in the next round's buffer; every rank's thread
    leaves after that same round (a rank that is still training simply stops receiving syncs).
    ``stop`` services snapshot requests itself, applies the last delta, and with ``final_sync``
    performs the strategy's consensus (see each strategy) so replicas end bit-identical.

    Failures: an exception anywhere on the thread (strategy math, a non-finite replica or
    delta, pacing, posting) is re-raised by the next :meth:`step` (or :meth:`stop`) as
    :class:`SyncError`, and peers get an abort flag naming this rank in the round they wait in
    (or their next), so they fail on their next ``step()`` too; a dead peer surfaces as the
    group's timeout. With ``deadline_s``, ``step()`` also raises when no round has completed for
    that long.

    :meth:`SyncRunner.state_dict` is only rank-consistent while stopped (each rank's thread is at
    a different point of its round), so it and ``load_state_dict`` raise while running:
    ``stop(final_sync=False)``, checkpoint or restore, ``start()``.

    Example::

        group = new_sync_group()
        broadcast_(list(model.parameters()))
        runner = ShadowSyncRunner(list(model.parameters()), ModelAveraging(), group,
                                  max_slowdown=0.05)
        runner.start()
        for x, y in data:
            loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()
            runner.step()
        runner.stop(final_sync=True)
    """

    def __init__(self, params: Sequence[Tensor], strategy: SyncStrategy,
                 group: dist.ProcessGroup, *, min_interval_s: float = 0.0,
                 max_comm_share: float = 1.0, max_slowdown: float | None = None,
                 slowdown_window: int = 128, deadline_s: float | None = None,
                 chunk_bytes: int | None = None, thread_nice: int = 0,
                 max_staleness: int | None = None) -> None:
        check("min_interval_s", min_interval_s)
        check("slowdown_window", slowdown_window)
        check("thread_nice", thread_nice)
        check("max_staleness", max_staleness)
        check("max_comm_share", max_comm_share)
        if deadline_s is not None and not deadline_s > min_interval_s:
            raise ValueError(f"deadline_s must be > min_interval_s ({min_interval_s}), "
                             f"got {deadline_s}")
        self._pacer = (SlowdownPacer(max_slowdown, cost_window=slowdown_window)
                       if max_slowdown is not None else None)
        super().__init__(params, strategy, group, chunk_bytes=chunk_bytes)
        self._comm_pause = 1 / max_comm_share - 1
        self._min_interval_s = min_interval_s
        self._deadline_s = deadline_s
        self._thread_nice = thread_nice
        self._max_staleness = max_staleness
        self._wait_seconds = 0.0
        if self._device.type == "cuda":
            self._stream = torch.cuda.Stream(self._device)
        self._thread: threading.Thread | None = None
        # Hand-off state, guarded by self._handoff (its lock is self._lock).
        self._handoff = threading.Condition(self._lock)
        self._posted: _Delta | None = None
        self._want_snapshot = False
        self._stop_requested = threading.Event()
        self._wake = threading.Event()
        self._last_progress = 0.0
        self._abandoned = threading.Event()
        self._carried_pause = 0.0  # seconds of a pause that stop() cut short (thread side)
        # Training-thread side of the step clock (accepted-slowdown pacing).
        self._round_open = False  # a snapshot was taken and its delta not yet applied
        self._step_began: float | None = None
        self._step_began_round = False  # the step in progress took a round's snapshot

    def _mode_stats(self) -> dict[str, float]:
        stats = {} if self._max_staleness is None else {"wait_seconds": self._wait_seconds}
        if self._pacer is not None:
            stats.update(round_cost=self._pacer.round_cost(), busy_share=self._pacer.busy_share(),
                         round_steps=self._pacer.round_steps())
        return stats

    def start(self) -> None:
        super().start()
        for event in (self._stop_requested, self._wake):
            event.clear()
        self._want_snapshot = False
        self._step_began = None
        if self._pacer is not None:
            self._pacer.interrupt()
        self._last_progress = time.perf_counter()
        self._thread = threading.Thread(target=self._thread_main, daemon=True,
                                        name=f"shadowsync-rank{self._rank}")
        self._thread.start()

    def step(self) -> None:
        """Step boundary: apply a finished delta, then take a snapshot if the thread wants one.

        With ``max_staleness``, first waits for the round in flight if its snapshot is that many
        steps old. Raises :class:`SyncError` if the thread failed, a peer aborted, or
        ``deadline_s`` passed without a completed round.
        """
        self._require_running("step()")
        self._check_health()
        self._counters.steps += 1
        if (self._max_staleness is not None and self._round_open
                and self._counters.steps - self._snapshot_step >= self._max_staleness):
            self._await_delta()
        if self._pacer is not None:
            now = time.perf_counter()
            if self._step_began is not None:
                self._pacer.observe(now - self._step_began, self._step_busy,
                                    self._step_began_round)
            self._step_began = now
        self._step_busy = self._apply_then_snapshot() or self._round_open
        self._step_began_round = self._snapshot_step == self._counters.steps

    def stop(self, final_sync: bool = True) -> None:
        self._require_running("stop()")
        thread = self._thread
        if thread is None:
            raise RuntimeError("stop(): the runner has no sync thread")
        self._stop_requested.set()
        self._wake.set()
        try:
            while thread.is_alive():
                self._check_health()
                self._apply_then_snapshot()
                thread.join(_POLL_S)
            self._raise_failure()
        finally:
            self._mark_stopped()
        self._thread = None
        self._apply_then_snapshot()  # the last round's delta, if the loop above missed it
        if final_sync:
            self._consensus()

    def abandon(self) -> None:
        """See :meth:`SyncRunner.abandon`. A thread waiting for a snapshot leaves at once; one
        inside a collective leaves when its group's timeout expires; one stuck elsewhere (a
        stalled strategy) is left behind, a daemon holding nothing the training loop needs."""
        self._abandoned.set()
        with self._handoff:
            self._handoff.notify_all()
        self._wake.set()
        super().abandon()
        self._thread = None

    def state_dict(self) -> dict[str, Any]:
        self._require_stopped("state_dict()")
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._require_stopped("load_state_dict()")
        super().load_state_dict(state_dict)

    def _require_stopped(self, what: str) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{what} while the sync thread runs would not be consistent across "
                               "ranks: stop(final_sync=False), checkpoint or restore, start()")

    # ------------------------------------------------------------------ training-thread side
    def _check_health(self) -> None:
        """Raise SyncError if the thread failed, or (with deadline_s) stalled."""
        thread = self._thread
        if (self._error is None and self._deadline_s is not None and thread is not None
                and thread.is_alive()
                and time.perf_counter() - self._last_progress > self._deadline_s):
            with self._lock:
                self._error = self._error or TimeoutError(
                    f"no synchronization round completed in {self._deadline_s} s "
                    f"(round {self._counters.rounds + 1} stalled)")
        self._raise_failure()

    def _await_delta(self) -> None:
        """Block until the round in flight posts its delta; raise if the thread fails or
        stalls (``deadline_s``) meanwhile."""
        began = time.perf_counter()
        with record_function("shadowsync.wait"):
            while True:
                with self._handoff:
                    if self._posted is not None:
                        break
                    self._handoff.wait(_POLL_S)
                self._check_health()
        self._wait_seconds += time.perf_counter() - began

    def _apply_then_snapshot(self) -> bool:
        """Apply the posted delta, then serve a snapshot request; True if either happened.

        Both are read in one critical section (see the hand-off invariant in the class
        docstring), and the delta is applied before the copy.
        """
        with self._handoff:
            done, self._posted = self._posted, None
            serve = self._want_snapshot
        if done is not None:
            self._apply(done)
            self._round_open = False
        if serve:
            with record_function("shadowsync.snapshot"):
                self._copy_live_to_snapshot()
            self._round_open = True
            with self._handoff:
                self._want_snapshot = False
                self._handoff.notify_all()
        return done is not None or serve

    # ------------------------------------------------------------------ sync-thread side
    def _thread_main(self) -> None:
        try:
            if self._thread_nice:
                # Linux schedules threads one by one: this lowers the sync thread alone.
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               os.getpriority(os.PRIO_PROCESS, 0) + self._thread_nice)
            with self._thread_streams():
                self._loop()
        except BaseException as exc:  # handed to the training loop by step()/stop()
            self._fail(exc)

    def _thread_streams(self) -> contextlib.ExitStack:
        """The side stream (and its device) as the thread's current ones; nothing on CPU."""
        stack = contextlib.ExitStack()
        if self._stream is not None:
            stack.enter_context(torch.cuda.device(self._device))
            stack.enter_context(torch.cuda.stream(self._stream))
        return stack

    def _loop(self) -> None:
        asked = False
        carried, self._carried_pause = self._carried_pause, 0.0
        if carried > 0:
            self._wait_out(carried)
        while self._request_snapshot(asked):
            began = time.perf_counter()
            # Each rank proposes its pause from its own step clock; all take the mean, so the
            # ranks' next rounds start together instead of one waiting for the other inside
            # the allreduce.
            proposal = self._pacer.quiet_seconds() if self._pacer is not None else 0.0
            delta, control = self._round(self._stop_requested.is_set(), proposal)
            ended = self._last_progress = time.perf_counter()
            pause = self._pause_s(began, ended, control.quiet_s)
            asked = not control.stop and pause <= 0
            self._post(_Delta(delta, self._record_ready(), self._snapshot_step), ask=asked)
            if control.stop:
                return
            if pause > 0:
                self._wait_out(pause)

    def _wait_out(self, pause: float) -> None:
        """Sleep ``pause`` seconds; if a stop cuts it short, keep the rest for the next start."""
        until = time.perf_counter() + pause
        if self._wake.wait(pause) and self._stop_requested.is_set():
            self._carried_pause = max(0.0, until - time.perf_counter())

    def _request_snapshot(self, asked: bool = False) -> bool:
        """Ask the training loop for a snapshot and wait for it; False if abandoned. ``asked``:
        the request went out with the previous round's delta (and may be served already)."""
        with self._handoff:
            self._want_snapshot = self._want_snapshot or not asked
            while self._want_snapshot and not self._abandoned.is_set():
                self._handoff.wait()
        return not self._abandoned.is_set()

    def _record_ready(self) -> torch.cuda.Event | None:
        """The side stream's event that the delta is computed (None on CPU)."""
        return self._stream.record_event() if self._stream is not None else None

    def _post(self, done: _Delta, ask: bool) -> None:
        """Post a finished round; with ``ask``, request the next snapshot in the same critical
        section (the next round may start at once), so one boundary serves both."""
        with self._handoff:
            if self._posted is not None:
                raise RuntimeError("hand-off invariant broken: a delta was posted before the "
                                   "previous one was applied")
            self._posted = done
            self._want_snapshot = ask
            self._handoff.notify_all()

    def _pause_s(self, began: float, ended: float, quiet_s: float) -> float:
        """Seconds until the next round may start (<= 0: now); ``quiet_s`` is the ranks'
        agreed pause. The ``max_comm_share`` pause already taken between chunks counts towards
        this one."""
        paused = self._paused_in_round
        busy = ended - began - paused
        resume = max(began + self._min_interval_s,
                     ended + busy * self._comm_pause - paused,
                     ended + quiet_s)
        return resume - time.perf_counter()
