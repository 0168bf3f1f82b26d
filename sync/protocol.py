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

Also here: :class:`Levels` (replica groups' sum in two levels, fewer copies across hosts). An
int8 layout's payloads travel as blocks with error feedback (:mod:`.quantized`); its control
slots then go by a float32 allreduce of their own after the payload, never quantized.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from shadowsync.sync.clock import Clock
from shadowsync.sync.errors import CollectiveFailed, PeerAborted
from shadowsync.sync.machine import Machine
from shadowsync.sync.quantized import BLOCK, Int8Sum, encoded_bytes

__all__ = ["MAX_PAUSE_STEPS", "WIRE", "Agreement", "Control", "Layout", "Levels", "Wire",
           "WireState", "check_params", "views"]

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
    (``sizes`` elements each, in order), in ``dtype`` on ``device``; ``int8``: float32
    payloads that travel as int8 blocks with error feedback (:mod:`.quantized`)."""

    sizes: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    int8: bool = False

    def __post_init__(self) -> None:
        if self.int8 and self.dtype != torch.float32:
            raise ValueError(f"an int8 wire carries float32 payloads, not {self.dtype}")


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
        # int8: the payloads in whole blocks of every rank's slice, the slots after them
        unit = self.world * BLOCK if layout.int8 else row
        padded = -(-self.numel // unit) * unit if layout.int8 else self.numel
        slots = padded + _FLAGS + self.world
        self.buffer = torch.zeros(slots if layout.int8 else -(-slots // row) * row,
                                  dtype=layout.dtype, device=layout.device)
        self._slots = slice(padded, slots)
        self._summed = self.buffer[:padded] if layout.int8 else self.buffer
        self.int8 = None if not layout.int8 else Int8Sum(
            padded // row, self.group if self.levels is None else self.levels.across,
            layout.device)
        self._chunk_bytes = chunk_bytes
        each = encoded_bytes(unit) / unit if layout.int8 else self.buffer.element_size()
        self._chunk_numel = (self._summed.numel() if chunk_bytes is None
                             else max(1, int(chunk_bytes / each) // unit) * unit)
        self.nbytes = (encoded_bytes(padded) + 4 * (slots - padded) if layout.int8
                       else self.buffer.numel() * self.buffer.element_size())
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
        return Wire(dataclasses.replace(self.layout, dtype=dtype, int8=False),
                    self.levels or self.group,
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
            paused, fastest, at = 0.0, math.inf, 0
            chunks = self._summed.split(self._chunk_numel) if self._summed.numel() else ()
            self._machine.move("send")
            for i, chunk in enumerate(chunks):
                sent = self._clock.now()
                self._collective(self._sum, chunk, at)
                at += chunk.numel()
                fastest = min(fastest, self._clock.now() - sent)
                if pause_between_chunks is not None and i + 1 < len(chunks):
                    paused += pause_between_chunks(fastest)
            if self.int8 is not None:
                self._collective(dist.all_reduce, buf[self._slots], dist.ReduceOp.SUM,
                                 self.group)
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
                         fastest_chunk_s=fastest, nbytes=self.nbytes)

    def _collective(self, run: Callable[..., None], *args: Any) -> None:
        """``run(*args)``; a collective that raised leaves the wire BROKEN."""
        try:
            run(*args)
        except BaseException as e:
            self._machine.move("raise")
            if isinstance(e, Exception):
                raise CollectiveFailed(f"{type(e).__name__}: {e}") from e
            raise

    def _sum(self, chunk: Tensor, at: int) -> None:
        """SUM ``chunk`` (the buffer's values ``at`` onwards) over the group in place: one
        sum across, or by :class:`Levels` (inside, across by slices, inside)."""
        if self.levels is None:
            self._across(chunk, at)
            return
        inside = self.levels.inside
        row = dist.get_world_size(inside)
        slices = chunk.view(row, -1)
        if self.levels.scatters(chunk):
            part = chunk.new_empty(slices.shape[1])
            dist.reduce_scatter_tensor(part, chunk, group=inside)
            self._across(part, at // row)
            dist.all_gather_single(chunk, part, group=inside)
            return
        mine = dist.get_rank(inside)
        dist.all_reduce(chunk, group=inside)
        self._across(slices[mine], at // row)
        slices[:mine].zero_()
        slices[mine + 1:].zero_()
        dist.all_reduce(chunk, group=inside)

    def _across(self, t: Tensor, at: int) -> None:
        """SUM ``t`` in place across (the group, or its levels' column): an allreduce, or on
        an int8 wire the int8 sum of its values ``at`` onwards."""
        if self.int8 is not None:
            self.int8(t, at)
            return
        dist.all_reduce(t, group=self.group if self.levels is None else self.levels.across)
