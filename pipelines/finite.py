"""Runs that go non-finite: :class:`FiniteWatch` remembers the first step at which the loss, the
dense gradients or the dense optimizer's state went non-finite, and the ranks compare what
each saw (:func:`raise_if_non_finite`), so the job's failure names the first."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shadowsync.pipelines.errors import NonFiniteValue, PeerNonFinite

__all__ = ["FiniteWatch", "non_finite_message", "raise_if_non_finite"]


class FiniteWatch:
    """Remembers the first step at which the loss or the dense gradients went non-finite, and
    reads it back without ever making the host wait for a device; and whether the dense
    optimizer's state went non-finite from gradients that were not.

    On a GPU :meth:`observe` queues one fused norm over the gradients and the loss
    (``_foreach_norm``; NaN and inf propagate, and so does a gradient too large to square in
    float32, |g| > 1.8e19) and four small ops that record the step on the device; :meth:`poll`
    returns those of an earlier step, copied to pinned memory asynchronously and read once the
    copy's event has completed. On CPU there is no device to wait for, and a step's own time is
    what counts: one op, PyTorch's GradScaler check ``_amp_foreach_non_finite_check_and_unscale_``
    (with scale 1, which leaves every value as it is), tests the gradients and the loss for
    NaN and inf in one pass, and one flag is read; only when it is set is each tensor looked
    at. On CPU ``_foreach_norm`` is a loop of one norm op a tensor, several times the cost on
    small models (``benchmarks/bench_loop.py``).

    A finite gradient too large to square turns Adagrad's or Adam's state inf, and then that
    weight never moves again. Inf stays inf there, so :meth:`first_steps` with a step (which
    the loop passes before every log record, checkpoint, evaluation and the end) checks the
    optimizer's state of each parameter, while no gradient was non-finite, and records that
    step for it: the failure is found at the next such point, not in its step. It is a full
    read of the state, too much for every step or control exchange at large dense sizes.

    Args:
        params: the dense parameters, whose gradients are checked.
        device: where they live.
        optimizer: the optimizer that steps them, whose state of each (the tensors shaped
            like the parameter: Adagrad's sum, Adam's moments, SGD's momentum) is checked.
    """

    KINDS = ("loss", "dense gradients", "dense optimizer state")

    def __init__(self, params: Sequence[torch.Tensor], device: torch.device,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        self.params = list(params)
        self.optimizer = optimizer
        self._none = torch.zeros(1, device=device)  # stands in for a gradient not computed
        # The first non-finite step of each gradient, then of the loss (0: none yet).
        self._first = torch.zeros(len(self.params) + 1, dtype=torch.long, device=device)
        self._state_first = 0  # the check that found the optimizer's state non-finite
        self._async = device.type == "cuda"
        # Pinned, so that the copy from the GPU is asynchronous.
        self._host = torch.empty(len(self.params) + 1, dtype=torch.long,
                                 pin_memory=self._async)
        self._copied: torch.cuda.Event | None = None
        self._seen = [0] * len(self.KINDS)  # on CPU: what _first says, kept beside it
        # The GradScaler check's flag (set when it finds NaN or inf) and its scale, 1.
        self._flag = torch.zeros(1, device=device)
        self._one = torch.ones(1, device=device)

    def _any_non_finite(self, tensors: list[torch.Tensor]) -> bool:
        """One fused pass (values left as they are); reads its flag, so on a GPU it waits."""
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, self._flag, self._one)
        if not self._flag.item():
            return False
        self._flag.zero_()
        return True

    @torch.no_grad()
    def observe(self, step: int, loss: torch.Tensor) -> None:
        """Records ``step`` for what is non-finite now, unless it was already recorded."""
        tensors = [self._none if p.grad is None else p.grad for p in self.params]
        tensors.append(loss)  # as it is: no_grad (the CPU check writes values back unchanged)
        if self._async:
            norms = torch.stack(torch._foreach_norm(tensors, 2))
            bad = norms.isfinite().logical_not_()
            self._first.masked_fill_(bad.logical_and_(self._first == 0), step)
            return
        if not self._any_non_finite(tensors):
            return
        for i, t in enumerate(tensors):
            if not self._first[i] and not bool(torch.isfinite(t).all()):
                self._first[i] = step
        self._seen = self._kinds(self._first.tolist())

    def _kinds(self, first: list[int]) -> list[int]:
        grads = [s for s in first[:-1] if s > 0]
        return [first[-1], min(grads) if grads else 0, self._state_first]

    def poll(self) -> list[int] | None:
        """Per kind, the first non-finite step known now without waiting (0: none yet), or
        None while a GPU copy is still in flight. Never blocks."""
        if not self._async:
            return list(self._seen)
        if self._copied is not None and not self._copied.query():
            return None
        seen = self._kinds(self._host.tolist()) if self._copied is not None else None
        self._host.copy_(self._first, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return seen

    @torch.no_grad()
    def first_steps(self, step: int | None = None) -> list[int]:
        """Per kind, the first step it was non-finite (0: never). Waits for the device. With
        ``step``, the optimizer's state is checked first (while no gradient was non-finite,
        since those make it so as well), and ``step`` recorded for it if it is not finite."""
        first = self._kinds(self._first.tolist())
        if step is None or first[1] or self._state_first or self.optimizer is None:
            return first
        ids = {id(p) for p in self.params}
        states = [t for p, kept in self.optimizer.state.items() if id(p) in ids
                  for t in kept.values()
                  if isinstance(t, torch.Tensor) and t.is_floating_point() and t.shape == p.shape]
        if states and self._any_non_finite(states):
            self._state_first = self._seen[2] = first[2] = step
        return first

    def local_message(self, rank: int, world_size: int,
                      steps: Sequence[int] | None = None) -> str | None:
        """What this rank alone saw (``steps``, or :meth:`first_steps`), or None."""
        table = torch.zeros(world_size, len(self.KINDS), dtype=torch.float64)
        table[rank] = torch.tensor(list(steps if steps is not None else self.first_steps()),
                                   dtype=table.dtype)
        found = non_finite_message(table, self.KINDS)
        return None if found is None else found[0]


def non_finite_message(table: torch.Tensor, kinds: Sequence[str]) -> tuple[str, list[int]] | None:
    """From a ``ranks x kinds`` table of first non-finite steps (0: none), a message naming
    the earliest step, what and the rank that saw it then, followed by every rank's own first
    steps; and the ranks that saw it first (ties: the same step and kind). None if all are 0.

    Within a step the kinds are ordered as given (the loss precedes the gradients computed
    from it), so a NaN loss on one rank is named before the gradients DDP spread from it.
    """
    events = sorted((int(step), k, r) for r, row in enumerate(table.tolist())
                    for k, step in enumerate(row) if step > 0)
    if not events:
        return None
    step0, kind0, _ = events[0]
    first = [r for s, k, r in events if (s, k) == (step0, kind0)]
    per_rank: dict[int, dict[int, list[str]]] = {}
    for s, k, r in events:
        per_rank.setdefault(r, {}).setdefault(s, []).append(kinds[k])
    seen = "; ".join(
        f"rank {r}: " + ", ".join(f"{' and '.join(ks)} at step {s}" for s, ks in steps.items())
        for r, steps in sorted(per_rank.items()))
    ranks = " and ".join(f"rank {r}" for r in first)
    return (f"non-finite {kinds[kind0]} (NaN or inf) at step {step0} on {ranks} "
            f"(seen by {seen})", first)


def raise_if_non_finite(table: torch.Tensor, kinds: Sequence[str], rank: int,
                        where: str) -> None:
    """Raises on every rank if ``table`` (see :func:`non_finite_message`) records anything:
    :class:`NonFiniteValue` on the rank(s) that saw it first, :class:`PeerNonFinite` on the
    others, so that the job's failure names the first one. ``where`` says when it was found."""
    found = non_finite_message(table, kinds)
    if found is None:
        return
    message, first = found
    if rank in first:
        raise NonFiniteValue(f"{message}; found {where}")
    raise PeerNonFinite(f"rank(s) {first} went non-finite first (see that rank's error); "
                        f"found {where}")
