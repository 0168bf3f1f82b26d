"""How a training process meets faults: preemption by SIGTERM, ranks that must agree on stopping
or degrading, and failures reported with the rank that had them.

Exit codes of ``python -m shadowsync.pipelines.train``:

====  ==============================================================================
code  meaning
====  ==============================================================================
0     trained to the end
1     this rank failed (its log says ``rank N failed: ...``; torchrun's summary names the
      first failing rank), including a run that went non-finite (:class:`NonFiniteValue`:
      the step, the rank that saw it first and what: loss, dense gradients, eval predictions
      or eval metrics)
2     bad configuration or data set, found before any process group started
143   preempted: SIGTERM reached some rank, every rank stopped after the same step and the
      checkpoint of that step was written; relaunch with ``checkpoint.resume=true`` (the
      default) to continue. 143 (128 + SIGTERM) and not 0, so that torchrun, torchx and
      schedulers never take a preempted job for a finished one.
====  ==============================================================================
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from shadowsync.pipelines import checkpoint
from shadowsync.sync.runner import PeerAborted

__all__ = ["FAILURES", "PREEMPTED_EXIT_CODE", "Control", "FiniteWatch", "Heartbeat",
           "NonFiniteValue", "PeerFailed", "PeerNonFinite", "attribute_failure", "claim_failure",
           "failure_message", "install_sigterm_handler",
           "is_consequence", "non_finite_message", "raise_if_non_finite", "stop_requested"]

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
# What a rank's failure may be: PyTorch's CheckpointException derives from BaseException.
FAILURES: tuple[type[BaseException], ...] = (Exception, CheckpointException)
_STORE_TIMEOUT_S = 3.0
_stop_signal: int | None = None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Only records the request: the training loop stops at a step boundary all ranks agree
    on. A second SIGTERM kills at once (the default action is back in place)."""
    global _stop_signal
    del frame
    _stop_signal = signum
    signal.signal(signum, signal.SIG_DFL)


def install_sigterm_handler() -> None:
    """Turns SIGTERM (Slurm, Kubernetes, and torchrun passing on its own) into a stop request.

    The grace the sender gives (torchrun's ``--shutdown_timeout``, Kubernetes'
    ``terminationGracePeriodSeconds``, Slurm's ``KillWait``; 30 s by default for all three)
    must cover one training step, the final synchronization and one checkpoint write.
    """
    signal.signal(signal.SIGTERM, _on_sigterm)


def stop_requested() -> bool:
    """Whether SIGTERM reached this process (only after :func:`install_sigterm_handler`)."""
    return _stop_signal is not None


class PeerFailed(RuntimeError):
    """This rank stopped because another rank failed first (the message names it)."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def failure_message(exc: BaseException) -> str:
    what = (checkpoint.describe(exc) if isinstance(exc, CheckpointException)
            else f"{type(exc).__name__}: {exc}")
    return f"rank {_rank()} failed: {what}"


def _job_store(kind: str, timeout_s: float = _STORE_TIMEOUT_S) -> dist.Store | None:
    """The job's key-value store (torchrun's agent store, or rank 0's), reached afresh: a
    failing rank cannot trust its process groups. None when unreachable."""
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=timeout_s))
    except (KeyError, ValueError, RuntimeError):
        return None
    attempt = (f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
               f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    return dist.PrefixStore(f"shadowsync/{kind}/{attempt}/", store)


def _claim(store: dist.Store, message: str, rank: int | None = None) -> bool:
    """Posts ``message`` as the job's first failure, that of ``rank`` (default: this one),
    unless one was posted."""
    if store.add("count", 1) != 1:
        return False
    store.set("first_rank", str(_rank() if rank is None else rank))
    store.set("first", message)
    return True


def claim_failure(exc: BaseException) -> None:
    """Posts ``exc`` as the job's first failure where it happens (the synchronizer's thread
    calls it for its own failures), before peers learn of it and break off: a peer that then
    fails reports it, even while this rank's training thread is still in a collective. A
    failure that a killed or stopped peer caused (its collective broke) names that peer, as in
    :func:`attribute_failure`."""
    store = _job_store("failure")
    try:
        if store is None or store.check(["first"]):
            return
        _claim(store, *_cause(exc, "its synchronizer"))
    except RuntimeError:
        pass  # no store: torchrun's summary is left to name the rank


def is_consequence(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says that another rank failed first. A chain of
    causes that loops back is followed once round."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (PeerAborted, PeerNonFinite, PeerFailed)):
            return True
        seen.add(id(exc))
        exc = exc.__cause__
    return False


def attribute_failure(exc: BaseException) -> BaseException:
    """``exc`` if this rank failed first; else a :class:`PeerFailed` naming the rank that did.

    The first failing rank posts its message in the job's store before it exits, so a peer
    that fails next (its collective broke when that rank left) reports the cause, not the
    symptom. torchrun's "Root Cause" picks the earliest error file by the second, which is
    often the peer's: this keeps it right. A rank whose error already says a peer failed
    (:class:`~shadowsync.sync.runner.PeerAborted`) never posts; it waits for the peer's post.
    A rank killed or stopped outright posts nothing: before claiming the cause, a rank asks
    the :class:`Heartbeat` whether every peer still lives, and names the one that does not.
    """
    if _heartbeat is not None:
        _heartbeat.mark_failing()  # alive and reporting: peers must not take this rank for silent
    store = _job_store("failure")
    if store is None:
        return exc
    try:
        if store.check(["first_rank"]) and store.get("first_rank").decode() == str(_rank()):
            return exc  # this rank posted it already (see claim_failure)
        if not is_consequence(exc) and not store.check(["first"]):
            first, blamed = _cause(exc, "it")
            if _claim(store, first, blamed):
                return PeerFailed(first) if blamed is not None else exc
        store.wait(["first"], timedelta(seconds=_STORE_TIMEOUT_S))
        first = store.get("first").decode()
    except RuntimeError:  # no post in time, or the store went away with the rank hosting it
        return exc
    return PeerFailed(f"{first} (then here: {type(exc).__name__}: {exc})")


def _cause(exc: BaseException, who: str) -> tuple[str, int | None]:
    """What this rank posts as the first failure for ``exc``, and the rank it blames (None:
    this one): a peer the heartbeat finds silent, whose death ``exc`` then only shows, else
    ``exc`` itself."""
    silent = _heartbeat.silent_peers() if _heartbeat is not None else []
    if not silent:
        return failure_message(exc), None
    return _silent_message(silent, f"found by rank {_rank()} when {who} failed with "
                                   f"{type(exc).__name__}: {exc}"), silent[0]


def _silent_message(ranks: list[int], how: str) -> str:
    who = ", ".join(map(str, ranks))
    return (f"rank {who} failed: stopped responding (no heartbeat: killed, stopped or hung; "
            f"{how})")


_heartbeat: Heartbeat | None = None


def _beats(store: dist.Store, rank: int) -> int:
    """``rank``'s heartbeat counter."""
    return int(store.add(f"alive/{rank}", 0))


def _finished(store: dist.Store, rank: int) -> bool:
    """Whether ``rank`` said it stops beating on purpose (done, or failing and reporting)."""
    return bool(store.check([f"done/{rank}"]))


class Heartbeat:
    """Finds a peer process that died or stopped, in seconds, without waiting for a collective
    to time out, and names it.

    A daemon thread adds 1 to this rank's counter in the job's store every ``interval_s`` and
    watches the next rank's counter (a ring: the store serves O(world size) requests a beat).
    A peer whose counter has not moved for ``timeout_s`` and that has not said it finished
    (killed, stopped by SIGSTOP, or its interpreter hung) makes this rank post ``rank P
    failed: stopped responding ...`` as the job's first failure, write it to torchrun's error
    file and exit 1 at once (its training thread may sit in a collective with that peer until
    ``train.pg_timeout_s``); every other rank's thread sees the post within a beat and does
    the same. The rank that found the silent peer kills it if it runs on the same host (a
    stopped process ignores SIGTERM, and torchrun would wait its 30 s grace before SIGKILL);
    so the job ends within ``timeout_s`` plus about two beats (on another host the launcher
    kills the silent process after its grace).

    When a rank's training thread fails, :func:`attribute_failure` uses :meth:`silent_peers`
    (about three beats) to blame a peer that was killed rather than claim the cause itself, and
    first marks its own rank as failing, so that no peer takes it for silent once it exits; the
    synchronizer's thread does the same check for its own failures (:func:`claim_failure`).
    Without torchrun the store lives in rank 0's process: a store silent for ``timeout_s``
    then names rank 0. A training thread hung in a live process is the collective timeout's
    to catch.

    Example::

        Heartbeat.start(interval_s=1.0, timeout_s=30.0)   # after init_process_group
        ...                                               # train
        Heartbeat.stop()                                  # a clean end: peers stop watching
    """

    def __init__(self, interval_s: float, timeout_s: float) -> None:
        """``timeout_s`` >= 3 ``interval_s`` > 0 (``train.heartbeat_*``, checked with the
        config)."""
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        store = _job_store("heartbeat", timeout_s=max(2 * interval_s, 1.0))
        if store is None:
            raise RuntimeError("heartbeat: the job's store (MASTER_ADDR:MASTER_PORT) is "
                               "unreachable")
        self.store = store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shadowsync-heartbeat",
                                        daemon=True)

    @classmethod
    def start(cls, interval_s: float, timeout_s: float) -> Heartbeat | None:
        """Starts this process's heartbeat (the one :func:`attribute_failure` asks); None in a
        world of one."""
        global _heartbeat
        if dist.get_world_size() == 1:
            return None
        _heartbeat = cls(interval_s, timeout_s)
        _heartbeat.store.set(f"pid/{_heartbeat.rank}", f"{socket.gethostname()} {os.getpid()}")
        _heartbeat.store.add(f"alive/{_heartbeat.rank}", 1)
        _heartbeat._thread.start()
        return _heartbeat

    @staticmethod
    def stop() -> None:
        """Says this rank finished (peers stop watching it) and stops the thread."""
        global _heartbeat
        beat, _heartbeat = _heartbeat, None
        if beat is None:
            return
        beat._stop.set()
        beat._thread.join()
        try:
            beat.store.set(f"done/{beat.rank}", "1")
        except RuntimeError:
            pass  # the store is gone: so is the job

    def mark_failing(self) -> None:
        """Tells peers that this rank stops on a failure it reports itself (it may exit before
        their check), so they never report it as silent."""
        store = _job_store("heartbeat")  # its own connection: the beat's thread has one
        try:
            if store is not None:
                store.set(f"done/{self.rank}", "failing")
        except RuntimeError:
            pass  # the store is gone: so is the job

    def silent_peers(self) -> list[int]:
        """The peers whose counter does not move within three beats and that did not finish
        (empty when the store cannot be reached: no one to blame)."""
        peers = [r for r in range(self.world_size) if r != self.rank]
        store = _job_store("heartbeat")  # its own connection: any thread may ask
        if store is None:
            return []
        try:
            seen = {r: _beats(store, r) for r in peers}
            deadline = time.monotonic() + 3 * self.interval_s
            while peers and time.monotonic() < deadline:
                time.sleep(self.interval_s / 4)
                peers = [r for r in peers
                         if _beats(store, r) == seen[r] and not _finished(store, r)]
        except RuntimeError:
            return []
        return peers

    def _run(self) -> None:
        peer = (self.rank + 1) % self.world_size
        seen, moved = -1, time.monotonic()
        reached = moved
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            try:
                self.store.add(f"alive/{self.rank}", 1)
                count = _beats(self.store, peer)
                if self.store.check(["silent"]):
                    self._die(self.store.get("silent").decode())
                if count != seen or _finished(self.store, peer):
                    seen, moved = count, now
                reached = now
            except RuntimeError:  # the store did not answer
                if now - reached > self.timeout_s:
                    self._die(self._store_lost(now - reached))
                continue
            if now - moved > self.timeout_s:
                message = _silent_message([peer], f"found by rank {self.rank}: its heartbeat "
                                          f"stopped {now - moved:.0f} s ago")
                self.store.set("silent", message)
                failures = _job_store("failure")
                if failures is not None:
                    _claim(failures, message, peer)
                self._kill_if_local(peer)
                self._die(message)

    def _kill_if_local(self, rank: int) -> None:
        """SIGKILL to ``rank``'s process if it runs on this host (it is silent, so no longer
        part of the job)."""
        try:
            host, pid = self.store.get(f"pid/{rank}").decode().split()
            if host == socket.gethostname():
                os.kill(int(pid), signal.SIGKILL)
        except (RuntimeError, ValueError, OSError):
            pass  # gone already, or elsewhere: the launcher's to end

    def _store_lost(self, silent_s: float) -> str:
        if "TORCHELASTIC_RUN_ID" in os.environ:
            return (f"the job's store (torchrun's agent) has not answered for {silent_s:.0f} s "
                    f"(found by rank {self.rank})")
        return _silent_message([0], f"its process hosts the job's store, which has not "
                                    f"answered rank {self.rank} for {silent_s:.0f} s")

    def _die(self, message: str) -> NoReturn:
        """Ends this process now: its training thread may be stuck with the silent peer."""
        exc = PeerFailed(message)
        logger.error(failure_message(exc))
        ErrorHandler().record_exception(exc)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


class Control:
    """Ranks agree on local facts (SIGTERM seen, synchronizer failed, checkpoint unreadable)
    through one small allreduce on a gloo group of their own.

    Gloo on CPU tensors, even beside NCCL training, so that asking never synchronizes a GPU
    stream; every rank must call :meth:`ranks_raising` at the same point of its loop.
    """

    def __init__(self, timeout_s: float) -> None:
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def exchange(self, values: Sequence[float]) -> torch.Tensor:
        """Collective: every rank's ``values``, as a ``world_size x len(values)`` float64 table
        (exact for integers below 2**53, such as step numbers)."""
        return self.start_exchange(values)()

    def start_exchange(self, values: Sequence[float]) -> Callable[[], torch.Tensor]:
        """Collective, without waiting: :meth:`exchange` in the background; call what it
        returns for the table. Every rank must make its calls on this group in one order."""
        table = torch.zeros(self.world_size, len(values), dtype=torch.float64)
        table[self.rank] = torch.tensor([float(v) for v in values], dtype=table.dtype)
        work = dist.all_reduce(table, group=self.group, async_op=True)

        def result() -> torch.Tensor:
            work.wait()
            return table

        return result

    def failures(self, error: BaseException | None, describe: Callable[[BaseException], str],
                 ) -> list[str]:
        """Collective: ``rank N: <describe(error)>`` for every rank that has an error, in rank
        order (empty when none has); the messages travel only when some rank failed."""
        (bad,) = self.ranks_raising(error is not None)
        if not bad:
            return []
        messages: list[Any] = [None] * self.world_size
        dist.all_gather_object(messages, None if error is None else describe(error),
                               group=self.group)
        return [f"rank {r}: {messages[r]}" for r in bad]

    def ranks_raising(self, *flags: bool) -> list[list[int]]:
        """Collective: for each of this rank's ``flags``, the ranks that raised it."""
        table = self.exchange(flags)
        return [table[:, i].nonzero().flatten().tolist() for i in range(len(flags))]


# ---------------------------------------------------------------------------------- non-finite
class NonFiniteValue(RuntimeError):
    """The run went non-finite: a loss, dense gradients, eval predictions or eval metrics held
    NaN or inf. The message names the step, the rank that saw it first and what; raised by
    that rank (every rank, for eval metrics computed from all ranks' predictions)."""


class PeerNonFinite(NonFiniteValue):
    """This rank stops because another rank saw a non-finite value first (a consequence:
    :func:`attribute_failure` reports that rank's error)."""


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
