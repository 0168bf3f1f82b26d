"""Model averaging of the rows that changed: a round of an embedding replica set that carries
only the rows some replica changed since the last round, not whole tables.

Each rank keeps ``expected``: what its live rows hold after the last round landed, if training
did not touch them since (the snapshot plus the delta, the same float operation as the apply).
A round, on the set's replica group of W ranks:

1. ``changed = any(snapshot != expected)`` per row (this rank's rows that training moved);
2. SUM-allreduce of ``changed`` as one byte a row (W <= 255): the union, the same on every
   rank, so every rank sends the same rows in the same order;
3. SUM-allreduce of the union's rows of the snapshot (none: no collective);
4. ``delta = mean - snapshot`` on the union's rows, 0 elsewhere; ``expected = snapshot + delta``.

A row no replica changed since the last round already holds the last round's mean on every
rank (to the rounding of ``x + (mean - x)``), so averaging it again would change nothing: the
round is model averaging of the whole set at the cost of the changed rows plus one byte a row
(``1 / (4 d)`` of a float32 table of width d). Only model averaging has this fixed point
(EASGD's center and BMUF's momentum move rows nobody changed), so only its sets go by rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from shadowsync.sync.clock import Clock
from shadowsync.sync.protocol import Agreement, Control, Layout, Wire, WireState, views
from shadowsync.sync.strategies import ModelAveraging, SyncStrategy

__all__ = ["WHOLE_BELOW_BYTES", "RowExchange", "by_rows", "can_go_by_rows", "changed_rows",
           "row_delta"]

# A set smaller than this goes whole: the mask's extra collective costs a round trip or two
# (gloo's allreduce, ~0.1-0.3 ms on a LAN), about what 64 KiB take on a 1-3 Gbit/s link, so
# below it sending the rows saves less than the mask costs.
WHOLE_BELOW_BYTES = 64 * 1024


def _rows(flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    """``flat`` as one (rows, width) matrix per tensor of ``params`` (a 1-D tensor: width 1)."""
    return [v.reshape(p.shape[0], -1) for v, p in zip(views(flat, params), params, strict=True)]


def changed_rows(snapshot: Tensor, expected: Tensor, params: Sequence[Tensor]) -> Tensor:
    """One byte per row of ``params`` (in order): 1 where ``snapshot`` and ``expected``
    differ anywhere in the row."""
    pairs = zip(_rows(snapshot, params), _rows(expected, params), strict=True)
    return torch.cat([(s != e).any(dim=1) for s, e in pairs]).to(torch.uint8)


def row_delta(snapshot: Tensor, union: Tensor, summed: Tensor, world: int,
              params: Sequence[Tensor]) -> Tensor:
    """The round's delta for ``snapshot``: ``summed / world - snapshot`` on the rows ``union``
    marks (``summed``: their SUM over the replicas, in order), 0 elsewhere."""
    delta = torch.zeros_like(snapshot)
    at = 0
    masks = union.split([p.shape[0] for p in params])
    for d, s, mask in zip(_rows(delta, params), _rows(snapshot, params), masks, strict=True):
        n = int(mask.sum()) * s.shape[1]
        d[mask] = summed[at:at + n].view(-1, s.shape[1]).div(world) - s[mask]
        at += n
    return delta


class RowExchange:
    """Stages 2-4 of a round for one replica set averaged by its changed rows (see the
    module), on ``group``: one byte-a-row collective, then one of the union's rows.

    Args:
        params: the set's live tensors, each (rows, ...) with its rows first.
        group: the set's replica group (a sync group).
        chunk_bytes: the most bytes one collective carries (None: one a collective).
        clock: times the collectives.
    """

    def __init__(self, params: Sequence[Tensor], group: dist.ProcessGroup,
                 chunk_bytes: int | None, clock: Clock) -> None:
        self.params = list(params)
        if any(p.dim() == 0 for p in self.params):
            raise ValueError("a set averaged by rows needs tensors of rows")
        self.group = group
        rows = sum(p.shape[0] for p in self.params)
        device = self.params[0].device
        self._mask = Wire(Layout((rows,), torch.uint8, device), group, chunk_bytes, clock)
        if self._mask.world > 255:
            raise ValueError(f"a byte a row counts at most 255 replicas, got {self._mask.world}")
        self._rows_wire: Wire | None = None  # the union's rows, a wire a round
        self._chunk_bytes = chunk_bytes
        self.clock = clock
        self.expected = torch.empty(0)
        self.union_rows = 0  # rows in the last round's union

    @property
    def world(self) -> int:
        return self._mask.world

    @property
    def state(self) -> WireState:
        """The collective this rank is in, if any (IN_COLLECTIVE), else the mask wire's."""
        wires = [self._mask] + ([self._rows_wire] if self._rows_wire is not None else [])
        states = [w.state for w in wires]
        return WireState.IN_COLLECTIVE if WireState.IN_COLLECTIVE in states else states[0]

    def reopen(self) -> None:
        self._mask.reopen()

    def init(self, snapshot: Tensor) -> None:
        """The replicas are identical: ``snapshot`` is what every rank expects."""
        self.expected = snapshot.detach().clone()

    def landed(self, model: Tensor) -> None:
        """Every replica now holds ``model`` (a consensus)."""
        self.expected.copy_(model)

    def changed(self, snapshot: Tensor) -> Tensor:
        """Stage 2: this rank's changed rows (the round's own part, computed before any of
        its collectives, so that a failure here leaves every peer waiting in the first)."""
        return changed_rows(snapshot, self.expected, self.params)

    def exchange(self, snapshot: Tensor, changed: Tensor,
                 pause_between_chunks: Callable[[float], float] | None = None,
                 ) -> tuple[Tensor, Agreement]:
        """Stages 3-4: this round's delta for ``snapshot`` (whose rows :meth:`changed`
        marked) and what this rank measured of its collectives. Raises what a collective
        raised (:class:`~.errors.CollectiveFailed`)."""
        agreed = self._mask.allreduce([changed], Control(), pause_between_chunks)
        union = self._mask.payloads[0] > 0
        self.union_rows = int(union.sum())
        picked = [s[m] for s, m in zip(_rows(snapshot, self.params),
                                       union.split([p.shape[0] for p in self.params]),
                                       strict=True)]
        values = torch.cat([p.reshape(-1) for p in picked])
        summed = values
        if values.numel():
            if self._rows_wire is None or self._rows_wire.numel != values.numel():
                self._rows_wire = Wire(Layout((values.numel(),), values.dtype, values.device),
                                       self.group, self._chunk_bytes, self.clock)
            agreed = agreed.with_lane(self._rows_wire.allreduce([values], Control(),
                                                                pause_between_chunks))
            summed = self._rows_wire.payloads[0]
        delta = row_delta(snapshot, union, summed, self.world, self.params)
        self.expected = snapshot + delta
        return delta, agreed


def can_go_by_rows(strategy: SyncStrategy, params: Sequence[Tensor]) -> bool:
    """Whether ``strategy`` leaves a row nobody changed as it is: model averaging, in the
    parameters' own dtype, of tensors of rows."""
    return (type(strategy) is ModelAveraging and strategy.wire_dtype in (None, params[0].dtype)
            and all(p.dim() >= 1 for p in params))


def by_rows(strategy: SyncStrategy, params: Sequence[Tensor]) -> bool:
    """Whether a set of ``params`` averaged by ``strategy`` goes by its changed rows
    (:func:`can_go_by_rows`, and at least :data:`WHOLE_BELOW_BYTES`) rather than whole."""
    nbytes = sum(p.numel() * p.element_size() for p in params)
    return nbytes >= WHOLE_BELOW_BYTES and can_go_by_rows(strategy, params)
