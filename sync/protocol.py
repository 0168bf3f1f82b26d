"""The wire protocol of a synchronization round: the one place its bytes are laid out.

A round is one SUM-allreduce, on the synchronizer's own process group, of one flat buffer::

    [ payload (numel) | stop | pause | chunk seconds | abort flag by group rank (world) ]

in the strategy's wire dtype. The control slots ride in the payload's own allreduce, so every
rank reads the same values after the same round: whether any rank asked to stop (then every
rank's thread leaves after this round), the pause before the next round (each rank proposes
``pause / world``, so the slot holds the mean; ranks read the same bits and round them the
same way), the ranks' mean fastest chunk time (what the next round's pause between chunks is
made of), and which ranks failed (a rank that fails sends one more round with its flag set,
so a peer waiting in that round fails at once instead of at the group's timeout). Slots are
indexed by rank *in the sync group*; errors name global ranks.

The rule this module serves (see :mod:`.runner`): what decides when a rank enters a collective
comes from values every rank holds, and these slots are where such values are made common.

Also here: the flat-buffer helpers (:func:`broadcast_`, :func:`average_`) and
:func:`new_sync_group`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from shadowsync.sync.clock import Clock

__all__ = ["MAX_PAUSE_STEPS", "Agreement", "CollectiveFailed", "NonFiniteError", "PeerAborted",
           "RoundStalled", "SyncError", "Wire", "average_", "broadcast_", "check_params",
           "new_sync_group", "views"]

# The control slots after the payload; the abort flags start at _FLAGS.
_STOP, _PAUSE, _CHUNK, _FLAGS = range(4)
MAX_PAUSE_STEPS = 2**13  # a proposal is capped here: float16 slots hold the sum of any world's


class SyncError(RuntimeError):
    """Synchronization failed on this rank (or a peer aborted); the message names the rank."""


class PeerAborted(SyncError):
    """Another rank's synchronization failed and told this one so (the abort flag): a
    consequence, not a cause; that rank reports the cause."""


class CollectiveFailed(RuntimeError):
    """A round's collective raised (the group's timeout while a peer's part never came, or a
    broken connection): likely a peer's failure, which that peer reports."""


class RoundStalled(TimeoutError):
    """A round stayed in flight past the synchronizer's deadline. ``in_collective``: this
    rank's part was in the round's collective, waiting for a peer's (a peer stalled first, or
    is slower than the deadline); else its own round never reached the collective."""

    def __init__(self, message: str, in_collective: bool) -> None:
        where = ("waiting in the collective for a peer's part" if in_collective
                 else "this rank's round did not reach the collective")
        super().__init__(f"{message}: {where}")
        self.in_collective = in_collective


class NonFiniteError(SyncError):
    """A replica (its snapshot) or a round's delta held NaN or inf; names the round."""


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What the ranks agreed in one round, and what this rank measured of it.

    Attributes:
        stop: some rank asked to stop; every rank's thread leaves after this round.
        pause_steps: steps every rank waits, after this round lands, before the next snapshot.
        chunk_s: the ranks' mean fastest chunk transfer of their previous round (seconds).
        comm_s: this rank's seconds in the allreduce (its pauses between chunks excluded).
        paused_s: this rank's seconds paused between chunks.
        fastest_chunk_s: this rank's fastest chunk of this round (seconds).
        nbytes: bytes handed to the allreduce.
    """

    stop: bool
    pause_steps: int
    chunk_s: float
    comm_s: float
    paused_s: float
    fastest_chunk_s: float
    nbytes: int


def check_params(params: Sequence[Tensor]) -> list[Tensor]:
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


def views(flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    """Views of ``flat`` shaped like ``params``, in order."""
    return [chunk.view_as(p) for chunk, p in zip(flat.split([p.numel() for p in params]),
                                                 params, strict=True)]


class Wire:
    """One round's buffer and its chunked allreduce on ``group``.

    Args:
        numel: payload elements (the flat dense parameters).
        dtype: the buffer's dtype (the strategy's wire dtype, or the parameters').
        device: where the buffer lives.
        group: the synchronizer's process group.
        chunk_bytes: the most bytes one collective carries (None: one collective a round).
        clock: times the allreduce; paces the pauses between chunks.
    """

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device,
                 group: dist.ProcessGroup, chunk_bytes: int | None, clock: Clock) -> None:
        if chunk_bytes is not None and chunk_bytes < 16:
            raise ValueError(f"chunk_bytes must be >= 16 or None, got {chunk_bytes}")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.numel = numel
        self.buffer = torch.empty(numel + _FLAGS + self.world, dtype=dtype, device=device)
        self._chunk_numel = (self.buffer.numel() if chunk_bytes is None
                             else max(1, chunk_bytes // self.buffer.element_size()))
        self._clock = clock
        self.broken = False  # a collective raised: the group is in doubt, send nothing more
        # In a round's collectives (set by the thread that runs rounds, read by training when
        # a round stalls): waiting there is waiting for a peer's part.
        self.in_collective = False

    @property
    def payload(self) -> Tensor:
        """The reduced payload after :meth:`allreduce` (a view of the buffer)."""
        return self.buffer[: self.numel]

    def like(self, dtype: torch.dtype) -> Wire:
        """A wire of the same layout and group in ``dtype`` (the consensus: full precision)."""
        chunk = None if self._chunk_numel == self.buffer.numel() else (
            self._chunk_numel * self.buffer.element_size())
        return Wire(self.numel, dtype, self.buffer.device, self.group, chunk, self._clock)

    def allreduce(self, payload: Tensor | None, *, stop: bool = False, pause_steps: float = 0.0,
                  chunk_s: float = 0.0, abort: bool = False,
                  pause_between_chunks: Callable[[float], float] | None = None) -> Agreement:
        """SUM-allreduce ``payload`` (zeros if None) with this rank's control values: its stop
        request, its proposed pause (steps, capped at :data:`MAX_PAUSE_STEPS`), its fastest
        chunk of the previous round, its abort flag. ``pause_between_chunks(seconds)`` sleeps
        after each chunk but the last and returns how long it slept (the caller's clock and
        interruption). Raises :class:`PeerAborted` naming the global ranks that aborted.

        Reading the control values synchronizes the calling thread with its current stream;
        in shadow mode that is the sync thread and its side stream, never the training loop.
        """
        n, buf = self.numel, self.buffer
        with record_function("shadowsync.allreduce"):
            if payload is None:
                buf[:n].zero_()
            else:
                buf[:n].copy_(payload)
            control = [float(stop), min(max(pause_steps, 0.0), MAX_PAUSE_STEPS) / self.world,
                       chunk_s / self.world] + [0.0] * self.world
            control[_FLAGS + self.rank] = float(abort)
            buf[n:].copy_(torch.tensor(control, dtype=buf.dtype))
            began = self._clock.now()
            paused, fastest = 0.0, math.inf
            chunks = buf.split(self._chunk_numel)
            self.in_collective = True
            try:
                for i, chunk in enumerate(chunks):
                    sent = self._clock.now()
                    try:
                        dist.all_reduce(chunk, op=dist.ReduceOp.SUM, group=self.group)
                    except Exception as e:
                        self.broken = True
                        raise CollectiveFailed(f"{type(e).__name__}: {e}") from e
                    except BaseException:
                        self.broken = True
                        raise
                    fastest = min(fastest, self._clock.now() - sent)
                    if pause_between_chunks is not None and i + 1 < len(chunks):
                        paused += pause_between_chunks(fastest)
                reduced = buf[n:].tolist()
            finally:
                self.in_collective = False
            comm_s = self._clock.now() - began - paused
        aborted = [dist.get_global_rank(self.group, r)
                   for r, flag in enumerate(reduced[_FLAGS:]) if flag > 0 and r != self.rank]
        if aborted:
            raise PeerAborted(f"rank(s) {aborted} failed and aborted synchronization "
                              "(see that rank's error)")
        return Agreement(stop=reduced[_STOP] > 0, pause_steps=math.ceil(reduced[_PAUSE] - 1e-3),
                         chunk_s=reduced[_CHUNK], comm_s=comm_s, paused_s=paused,
                         fastest_chunk_s=fastest, nbytes=buf.numel() * buf.element_size())


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

    Use ``gloo`` (it reduces CUDA tensors too, staging them through host memory) for a shadow
    runner: NCCL documents that issuing operations from several threads to independent
    communicators on the same device is not safe (NCCL user guide, "Thread Safety"), and a
    shadow round is exactly that.

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

    Runners assume identical replicas at their first ``start`` (the strategies' center and
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
    params = check_params(params)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    collective(flat)
    torch._foreach_copy_(params, views(flat, params))
