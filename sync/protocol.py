"""The wire protocol of a synchronization round: the one place its bytes are laid out.

A round is one SUM-allreduce, on the synchronizer's own process group, of one flat buffer::

    [ payload of each replica set | stop | pause | chunk seconds | abort flag by group rank ]

in the strategies' wire dtype. The control slots (:class:`Control`) ride in the payloads' own
allreduce, so every rank reads the same values after the same round (:class:`Agreement`):
whether any rank asked to stop (then every rank's thread leaves after this round), the pause
before the next round (each rank proposes ``pause / world``, so the slot holds the mean; ranks
read the same bits and round them the same way), the ranks' mean fastest chunk time (what the
next round's pause between chunks is made of), and which ranks failed (a rank that fails sends
one more round with its flag set, so a peer waiting in that round fails at once instead of at
the group's timeout). Slots are indexed by rank *in the sync group*; errors name global ranks.

The rule this module serves (see :mod:`.runner`): what decides when a rank enters a collective
comes from values every rank holds, and these slots are where such values are made common.

The wire's own states (any thread may read them; the heartbeat asks whether a stalled round
waits in its collective):

=============  ============  =====================================================
state          event         next state
=============  ============  =====================================================
OPEN           ``send``      IN_COLLECTIVE: this rank's part is in the collectives
IN_COLLECTIVE  ``reduced``   OPEN
IN_COLLECTIVE  ``stop``      PEERS_LEFT: the round agreed to stop, peers' threads left
IN_COLLECTIVE  ``abort``     ABORTED: a rank's abort flag was in the round
IN_COLLECTIVE  ``raise``     BROKEN: a collective raised, the group is in doubt
PEERS_LEFT     ``reopen``    OPEN: the runner starts again
OPEN           ``reopen``    OPEN
=============  ============  =====================================================

Only an OPEN wire may carry a round, or this rank's abort round: in every other state its peers
know already, are gone, or cannot be reached.

Also here: :class:`Levels` (replica groups' sum in two levels, fewer copies across hosts), the
flat-buffer helpers (:func:`broadcast_`, :func:`average_`) and :func:`new_sync_group`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from shadowsync.sync.clock import Clock
from shadowsync.sync.errors import CollectiveFailed, PeerAborted
from shadowsync.sync.machine import Machine

__all__ = ["MAX_PAUSE_STEPS", "WIRE", "Agreement", "Control", "Layout", "Levels", "Wire",
           "WireState", "average_", "broadcast_", "check_params", "new_sync_group", "views"]

# The control slots after the payload; the abort flags start at _FLAGS.
_STOP, _PAUSE, _CHUNK, _FLAGS = range(4)
MAX_PAUSE_STEPS = 2**13  # a proposal is capped here: float16 slots hold the sum of any world's


@dataclasses.dataclass(frozen=True)
class Control:
    """This rank's control values for one round.

    Attributes:
        stop: ask every rank to stop after this round.
        pause_steps: this rank's proposal for the steps between this round's landing and the
            next snapshot (capped at :data:`MAX_PAUSE_STEPS`).
        chunk_s: this rank's fastest chunk of its previous round (seconds).
        abort: this rank failed (its abort round).
    """

    stop: bool = False
    pause_steps: float = 0.0
    chunk_s: float = 0.0
    abort: bool = False


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

    def with_lane(self, lane: Agreement) -> Agreement:
        """This agreement with what this rank measured of the round's other wire ``lane``
        added (a lane carries no control values of its own)."""
        return dataclasses.replace(
            self, comm_s=self.comm_s + lane.comm_s, paused_s=self.paused_s + lane.paused_s,
            fastest_chunk_s=min(self.fastest_chunk_s, lane.fastest_chunk_s),
            nbytes=self.nbytes + lane.nbytes)


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


class WireState(enum.Enum):
    OPEN = "open"  # between rounds: a round (or this rank's abort round) may go
    IN_COLLECTIVE = "in collective"  # this rank's part is in the round's collectives
    PEERS_LEFT = "peers left"  # a round agreed to stop: the peers' threads have left
    ABORTED = "aborted"  # a round carried an abort flag: every rank knows of the failure
    BROKEN = "broken"  # a collective raised: the group is in doubt, send nothing more


_W = WireState
WIRE: dict[tuple[WireState, str], WireState] = {
    (_W.OPEN, "send"): _W.IN_COLLECTIVE,
    (_W.IN_COLLECTIVE, "reduced"): _W.OPEN,
    (_W.IN_COLLECTIVE, "stop"): _W.PEERS_LEFT,
    (_W.IN_COLLECTIVE, "abort"): _W.ABORTED,
    (_W.IN_COLLECTIVE, "raise"): _W.BROKEN,
    (_W.PEERS_LEFT, "reopen"): _W.OPEN,
    (_W.OPEN, "reopen"): _W.OPEN,
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a round's buffer holds ahead of its control slots: each replica set's payload
    (``sizes`` elements each, in order), in ``dtype`` on ``device``."""

    sizes: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


@dataclasses.dataclass(frozen=True)
class Levels:
    """``group`` summed in two levels: its ranks are a grid, ``inside`` this rank's row (a
    host's ranks: a replica group's layout group), ``across`` its column (the ranks at its
    index in every row). Each chunk is summed inside, each rank sums its slice across, the
    slices are gathered inside: every rank ends with the same bits, and a row sends
    ``2 (H - 1) / H`` copies across a round for H rows (one ring over W ranks: ``2 (W - 1) / W``).
    """

    group: dist.ProcessGroup
    inside: dist.ProcessGroup
    across: dist.ProcessGroup

    def __post_init__(self) -> None:
        inside, across = dist.get_world_size(self.inside), dist.get_world_size(self.across)
        if inside * across != dist.get_world_size(self.group):
            raise ValueError(f"levels of {inside} ranks inside and {across} across do not make "
                             f"the group's {dist.get_world_size(self.group)} ranks")

    def scatters(self, chunk: Tensor) -> bool:
        """Whether ``chunk`` goes by a reduce-scatter and an all-gather inside (gloo runs them on
        CPU tensors only); else by allreduces, the second of slices each nonzero on one rank."""
        return chunk.is_cpu


class Wire:
    """One round's buffer and its chunked allreduce on ``group``; its state (see the module's
    table) is safe to read from any thread.

    Args:
        layout: the payloads the buffer carries.
        group: the sync group, or :class:`Levels` over it (buffer and chunks zero-padded to rows).
        chunk_bytes: the most bytes one collective carries (None: one collective a round).
        clock: times the allreduce; paces the pauses between chunks.
    """

    def __init__(self, layout: Layout, group: dist.ProcessGroup | Levels,
                 chunk_bytes: int | None, clock: Clock) -> None:
        if chunk_bytes is not None and chunk_bytes < 16:
            raise ValueError(f"chunk_bytes must be >= 16 or None, got {chunk_bytes}")
        self.layout = layout
        self.levels = group if isinstance(group, Levels) else None
        self.group = group.group if isinstance(group, Levels) else group
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        row = 1 if self.levels is None else dist.get_world_size(self.levels.inside)
        self.numel = sum(layout.sizes)
        slots = self.numel + _FLAGS + self.world
        self.buffer = torch.zeros(-(-slots // row) * row, dtype=layout.dtype,
                                  device=layout.device)
        self._slots = slice(self.numel, slots)
        self._chunk_bytes = chunk_bytes
        self._chunk_numel = (self.buffer.numel() if chunk_bytes is None
                             else max(1, chunk_bytes // self.buffer.element_size() // row) * row)
        self._clock = clock
        self._machine = Machine(WIRE, WireState.OPEN)

    @property
    def state(self) -> WireState:
        """Any thread: where the wire is (see the module's table)."""
        return self._machine.state

    def reopen(self) -> None:
        """The runner starts again after a round that agreed to stop."""
        self._machine.move("reopen")

    @property
    def payloads(self) -> list[Tensor]:
        """Each replica set's reduced payload after :meth:`allreduce` (views of the buffer)."""
        return list(self.buffer[: self.numel].split(self.layout.sizes))

    def like(self, dtype: torch.dtype) -> Wire:
        """A wire of the same layout and group in ``dtype`` (the consensus: full precision)."""
        return Wire(dataclasses.replace(self.layout, dtype=dtype), self.levels or self.group,
                    self._chunk_bytes, self._clock)

    def allreduce(self, payloads: Sequence[Tensor] | None, control: Control,
                  pause_between_chunks: Callable[[float], float] | None = None) -> Agreement:
        """SUM-allreduce ``payloads`` (one per replica set, in the layout's order; zeros if
        None) with this rank's ``control`` values. ``pause_between_chunks(seconds)`` sleeps
        after each chunk but the last and returns how long it slept (the caller's clock and
        interruption). Raises :class:`~.errors.PeerAborted` naming the global ranks that
        aborted, :class:`~.errors.CollectiveFailed` if a collective raised.

        Reading the control values synchronizes the calling thread with its current stream;
        in shadow mode that is the sync thread and its side stream, never the training loop.
        """
        n, buf = self.numel, self.buffer
        with record_function("shadowsync.allreduce"):
            if payloads is None:
                buf[:n].zero_()
            else:
                torch.cat([p.reshape(-1) for p in payloads], out=buf[:n])
            slots = [float(control.stop),
                     min(max(control.pause_steps, 0.0), MAX_PAUSE_STEPS) / self.world,
                     control.chunk_s / self.world] + [0.0] * self.world
            slots[_FLAGS + self.rank] = float(control.abort)
            buf[self._slots].copy_(torch.tensor(slots, dtype=buf.dtype))
            began = self._clock.now()
            paused, fastest = 0.0, math.inf
            chunks = buf.split(self._chunk_numel)
            self._machine.move("send")
            for i, chunk in enumerate(chunks):
                sent = self._clock.now()
                try:
                    self._sum(chunk)
                except BaseException as e:
                    self._machine.move("raise")
                    if isinstance(e, Exception):
                        raise CollectiveFailed(f"{type(e).__name__}: {e}") from e
                    raise
                fastest = min(fastest, self._clock.now() - sent)
                if pause_between_chunks is not None and i + 1 < len(chunks):
                    paused += pause_between_chunks(fastest)
            reduced = buf[self._slots].tolist()
            comm_s = self._clock.now() - began - paused
        aborted = [dist.get_global_rank(self.group, r)
                   for r, flag in enumerate(reduced[_FLAGS:]) if flag > 0 and r != self.rank]
        stop = reduced[_STOP] > 0
        self._machine.move("abort" if aborted or control.abort else "stop" if stop else "reduced")
        if aborted:
            raise PeerAborted(f"rank(s) {aborted} failed and aborted synchronization "
                              "(see that rank's error)")
        return Agreement(stop=stop, pause_steps=math.ceil(reduced[_PAUSE] - 1e-3),
                         chunk_s=reduced[_CHUNK], comm_s=comm_s, paused_s=paused,
                         fastest_chunk_s=fastest, nbytes=buf.numel() * buf.element_size())

    def _sum(self, chunk: Tensor) -> None:
        """SUM ``chunk`` over the group in place: one allreduce, or by :class:`Levels`."""
        if self.levels is None:
            dist.all_reduce(chunk, group=self.group)
            return
        inside, across = self.levels.inside, self.levels.across
        slices = chunk.view(dist.get_world_size(inside), -1)
        if self.levels.scatters(chunk):
            part = chunk.new_empty(slices.shape[1])
            dist.reduce_scatter_tensor(part, chunk, group=inside)
            dist.all_reduce(part, group=across)
            dist.all_gather_into_tensor(chunk, part, group=inside)
            return
        mine = dist.get_rank(inside)
        dist.all_reduce(chunk, group=inside)
        dist.all_reduce(slices[mine], group=across)
        slices[:mine].zero_()
        slices[mine + 1:].zero_()
        dist.all_reduce(chunk, group=inside)


def _require_dist() -> None:
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call init_process_group first")


def new_sync_group(backend: str = "gloo", timeout: timedelta = timedelta(minutes=10),
                   socket_ifname: str | None = None,
                   partition: Sequence[Sequence[int]] | None = None) -> dist.ProcessGroup:
    """Create the process group that carries synchronization collectives.

    A group of its own keeps the runner's allreduces from interleaving with the training loop's
    collectives (TorchRec's all-to-alls) on the default group. ``dist.new_group`` is itself
    collective: call this on every rank, in the same order, before any thread starts. ``timeout``
    bounds how long a rank waits in a collective for a peer that died or stopped participating.
    ``partition`` (global ranks, every rank in one part) makes one group per part, on every
    rank, and returns this rank's: the ranks that hold replicas of the same embedding shards.

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
    if socket_ifname is not None and backend != "gloo":
        raise ValueError(f"socket_ifname applies to gloo groups, not {backend!r}")

    def make() -> dist.ProcessGroup:
        if partition is None:
            return dist.new_group(backend=backend, timeout=timeout)
        own, _ = dist.new_subgroups_by_enumeration([list(p) for p in partition],
                                                   timeout=timeout, backend=backend)
        if own is None:
            raise ValueError(f"partition {partition} leaves out rank {dist.get_rank()}")
        return own

    if socket_ifname is None:
        return make()
    # new_group passes no device options to gloo (torch 2.13 ignores pg_options there); the
    # group's constructor reads GLOO_SOCKET_IFNAME, so it is set for that call alone.
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = socket_ifname
    try:
        return make()
    finally:
        if before is None:
            del os.environ["GLOO_SOCKET_IFNAME"]
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before


@torch.no_grad()
def broadcast_(params: Sequence[Tensor], group: dist.ProcessGroup | None = None,
               src: int = 0) -> None:
    """Overwrite every rank's ``params`` with rank ``src``'s (a global rank), in one collective:
    runners assume identical replicas at their first ``start`` (strategies' state is taken
    from the local replica)."""
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
