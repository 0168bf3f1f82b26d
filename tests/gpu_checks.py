"""The GPU checks of the runners' CUDA stream path, run by ``tests/test_gpu.py``: on a GPU
(``pytest -m gpu tests/test_gpu.py``) and, as a CPU dry run of the same logic at small sizes,
in CI.

Two gloo ranks share one GPU (or use one each). Plain torch only: no TorchRec or fbgemm, so it
runs wherever torch sees a GPU. Each check runs in a world of its own (a crash or a hang costs
that check alone, within its timeout) and returns a table of its cases. On CPU the checks that
mean something without a GPU are held to their verdict; the CUDA-only ones (``fence``,
``audit``, ``memory``) run their logic at small size, and only that it ran is checked.

"Training" is a fixed per-rank drift added to the parameters every step, behind a few large
matmuls on the main stream, so the host runs ahead of the GPU and a missing stream fence shows.

**equivalence.** The CPU-vs-CUDA cases: fixed-rate and shadow model averaging (MA), shadow
EASGD, fixed-rate and shadow BMUF with Nesterov block momentum, each on ``cpu`` and ``cuda``;
then shadow MA over wire dtypes (float32, bfloat16, float16) x chunking (one collective, or
``chunk_bytes`` that splits a round into 4 float32 / 2 half collectives) x ``max_staleness``
(None, 1, 2) on ``cuda`` alone. Shadow rounds land at timing-dependent steps, so the checks are
invariants that hold whatever the schedule:

* MA conserves the replicas' sum: the deltas of one round add up to zero over the ranks, so
  after the final sync every replica is ``x0 + (sum of all drifts + D) / W``, where ``D`` is the
  sum over ranks and rounds of the deltas actually produced (each rank's strategy adds them up
  on the side stream). That holds to float32 rounding (``ATOL``) with any wire dtype: it proves
  the runner applied every delta once, to the replica it was computed for.
* ``D`` itself is the wire rounding; it must stay within the bound round-to-nearest gives it:
  ``|D| <= (W + 1) u sum_rounds sum_ranks |s_k - ref|`` elementwise (``u``: the wire dtype's
  unit roundoff, ``eps / 2``; ``s_k - ref`` what rank ``k`` sends, its snapshot less the shared
  reference, or the snapshot itself uncompressed; ``W + 1`` roundings: each contribution, the
  ``W - 1`` partial sums, one spare for the float32 steps), plus ``ATOL``. So the plain
  ``x = x0 + sum of drifts / W`` is then checked with the tolerance
  ``ATOL + max(bound) / W`` derived from the dtype (a few 1e-3 for bfloat16, some 1e-4 for
  float16; a float32 wire stays at ``ATOL``).
* every snapshot sees a completed step: each step sets a stamp parameter to -1 before the
  matmuls and to the step number after them; a snapshot taken mid-step reads -1.
* EASGD conserves ``sum_k x_k + c``; fixed-rate BMUF and MA are deterministic, so the ``cuda``
  replica must match the ``cpu`` one; with ``max_staleness`` K no round lands more than K steps
  after its snapshot; with the final sync the replicas end bit-identical.

**cycles.** Shadow BMUF-NBM with a bfloat16 wire trains 4 segments with 3 stop / state_dict /
start cycles between them: after each ``stop(final_sync=False)`` the state goes through
``torch.save``/``torch.load`` into a fresh runner (``load_state_dict``) over freshly cloned
parameters, and training resumes. Proves: the state round-trips exactly, it is bit-identical
across ranks when stopped, the step counter continues (steps add up to 4 segments), rounds keep
coming after every restart, and the final replicas are identical and finite.

**fence.** A strategy whose round ``r`` delta is the constant ``r``, made slowly on the side
stream: inside ``delta`` it fills a scratch tensor of the delta's size with a sentinel, frees it
(so the delta most likely gets that block back, sentinel inside), sleeps the side stream
(``torch.cuda._sleep``) and only then fills the delta. Between steps the main stream sleeps a
little and churns allocations of the delta's size. After every step the replica must equal
``1 + 2 + ... + k`` everywhere (``k`` the deltas applied so far; checked on the device, no host
sync): a delta read before it was written (a missing event wait) shows the sentinel, a delta
applied twice, out of order or lost shows a wrong prefix sum. A spy on ``Tensor.record_stream``
checks that every applied delta was recorded on the main stream. What this proves, and what
not: today the sync thread's finite check on each delta synchronizes the side stream before the
result is posted, and the next snapshot makes the side stream wait for the main stream, so
neither the event wait nor ``record_stream`` is load-bearing; the test keeps them honest should
either host synchronization go (it reports how many deltas were applied while their stream was
still busy: 0 today). Main-stream churn cannot take the delta's block in any case (the caching
allocator reuses a block only on the stream it was allocated on); the side-stream churn can.

**audit.** ``torch.profiler.profile(activities=[CPU, CUDA])`` over shadow MA steps, then: no
``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, synchronous
``cudaMemcpy`` or host read of a device value (``aten::item``, ``aten::_local_scalar_dense``)
inside any ``shadowsync.apply`` or ``shadowsync.snapshot`` range of the training thread. Method:
the ranges are ``record_function`` events of the training thread (the profiler records ops on
the thread that entered it only); CUDA runtime calls come from CUPTI for every thread of the
process, so a call counts for a range only if it is issued by the training thread (its
``device_resource_id`` is that thread's id: the native id, the pthread id CUPTI reports, or the
id of calls linked to the thread's own ops; the ``thread`` field is no use, kineto gives
unlinked calls the id of the thread that stops the profiler) and its time interval lies inside
the range's. The sync thread's deliberate synchronizations (reading the control slots) are thus
excluded. So that the audit cannot pass blind, at least 90% of the ranges must show their own
``cudaStreamWaitEvent`` (the fences both ranges issue), and the number of apply ranges must
equal the deltas applied while profiling.

**failure.** On 2 gloo ranks with CUDA tensors: (a) rank 1's strategy raises in round 3; rank
1's ``step`` must raise ``SyncError`` (not ``PeerAborted``) and rank 0's a ``PeerAborted`` naming
rank 1, both within ``FAILURE_LIMIT_S`` of the injected failure (``time.monotonic`` is one clock
for every process of a Linux machine), with ``failure()`` returning the raised error; (b) rank 1
makes its replica non-finite; it must raise ``NonFiniteError`` before any peer averages the
replica in, and rank 0 a ``PeerAborted`` naming rank 1 with its own replica still finite.

**memory.** Shadow MA with ``max_staleness=1`` (one round a step) for 2,000 rounds on a 4 MiB
replica: after 100 warm-up rounds the runner is stopped and ``memory_allocated`` read
(baseline), the peak is reset; the peak of rounds 101-200 is the early peak, that of rounds
201-2,000 the late peak, and after the last stop ``memory_allocated`` is read again. PASS if the
late peak exceeds the early peak by at most two deltas (``PEAK_MARGIN_DELTAS`` x the replica's
bytes: what may be in flight at the moment of a peak) and the final allocation exceeds the
baseline by at most ``LEAK_MARGIN_BYTES`` (64 KiB: a leak of one 512-byte block a round would
leave 950 KiB).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import io
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from shadowsync.sync import (
    BlockwiseModelUpdateFiltering,
    ElasticAveraging,
    FixedRateOptions,
    FixedRateSyncRunner,
    ModelAveraging,
    ReplicaSet,
    ShadowOptions,
    ShadowSyncRunner,
    SyncRunner,
    SyncStrategy,
    broadcast_,
    new_sync_group,
)
from shadowsync.sync.errors import NonFiniteError, PeerAborted, SyncError
from shadowsync.testing import run_ranks

PERIOD = 4  # fixed-rate period (steps)
ATOL = 1e-4  # float32 accumulation over a run
WORLD = 2
SLEEP_HZ = 1.5e9  # GPU clock assumed to turn seconds into torch.cuda._sleep cycles (H100 ~1.7 GHz)
SENTINEL = 1.0e6
FAILURE_LIMIT_S = 5.0
PEAK_MARGIN_DELTAS = 2
LEAK_MARGIN_BYTES = 64 << 10
BLIND_SHARE = 0.1  # the audit may miss a range's own fence in at most this share of ranges
BUDGET_S = 540.0  # all checks together, inside one 10-minute call of a lent GPU machine
RANGES = ("shadowsync.apply", "shadowsync.snapshot")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each check runs: the GPU run, or the CPU dry run."""

    shapes: tuple[tuple[int, ...], ...]  # the replica; the last, (1,), is the stamp
    busy_dim: int  # main-stream matmuls per step, of this size (0: none)
    steps: int  # steps per equivalence case
    cycle_steps: int  # steps per segment of the cycles check
    fence_numel: int
    fence_steps: int
    fence_sleep_s: float  # side-stream sleep in each delta
    main_sleep_s: float  # main-stream sleep each step
    audit_steps: int
    memory_numel: int
    memory_rounds: tuple[int, int, int]  # warm-up, end of the early window, total

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


GPU_SIZES = Sizes(shapes=((512, 512), (4096,), (1,)), busy_dim=4096, steps=120, cycle_steps=40,
                  fence_numel=1 << 20, fence_steps=300, fence_sleep_s=0.02, main_sleep_s=0.001,
                  audit_steps=60, memory_numel=1 << 20, memory_rounds=(100, 200, 2000))
CPU_SIZES = Sizes(shapes=((48, 48), (256,), (1,)), busy_dim=0, steps=40, cycle_steps=15,
                  fence_numel=4096, fence_steps=60, fence_sleep_s=0.0, main_sleep_s=0.0,
                  audit_steps=30, memory_numel=4096, memory_rounds=(20, 40, 120))


# ---------------------------------------------------------------------------- rank-side helpers
class Rows:
    """What a rank reports: measures (``ok`` when ``value <= limit``), case stats (rank 0),
    notes (printed under the check's line).

    Plain containers only: results travel through ``torch.load(weights_only=True)``. A measure
    every rank computes alike (from gathered values) is kept from rank 0 only."""

    def __init__(self, rank: int, check: str) -> None:
        self.rank = rank
        self.check = check
        self.measures: list[dict[str, Any]] = []
        self.cases: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def add(self, case: str, device: str, what: str, value: float, limit: float = 0.0,
            *, per_rank: bool = False) -> None:
        if per_rank or self.rank == 0:
            self.measures.append({"case": case, "device": device,
                                  "rank": str(self.rank) if per_rank else "*", "what": what,
                                  "value": float(value), "limit": float(limit)})

    def case(self, case: str, device: str, runner: SyncRunner) -> None:
        if self.rank == 0:
            s = runner.stats()
            self.cases.append({"case": case, "device": device, "rounds": s.rounds,
                               "syncs": s.syncs_applied, "stale": s.staleness_max})

    def note(self, text: str) -> None:
        self.notes.append(text)

    def result(self) -> dict[str, Any]:
        return {"measures": self.measures, "cases": self.cases, "notes": self.notes}


def rank_device(kind: str, rank: int) -> torch.device:
    if kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def sync_group() -> dist.ProcessGroup:
    return new_sync_group(timeout=timedelta(seconds=60))


def gather(t: Tensor) -> list[Tensor]:
    """Every rank's copy of ``t`` (on CPU), over the default group."""
    mine = t.detach().cpu().contiguous()
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return out


def gather_floats(values: Sequence[float]) -> list[list[float]]:
    """Every rank's ``values`` (same length everywhere)."""
    return [t.tolist() for t in gather(torch.tensor(values, dtype=torch.float64))]


def tensor_sum(tensors: Iterable[Tensor]) -> Tensor:
    """The elementwise sum of ``tensors``, added in their order (as ``sum`` would)."""
    return functools.reduce(torch.add, tensors)


def flat(params: Sequence[Tensor]) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params]).cpu()


def make_params(shapes: Iterable[tuple[int, ...]], device: torch.device) -> list[Tensor]:
    """The same random replica on every rank."""
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g).to(device) for s in shapes]
    broadcast_(params)
    return params


def make_drifts(rank: int, shapes: Sequence[tuple[int, ...]], steps: int,
                device: torch.device) -> list[list[Tensor]]:
    """Per-rank drift of every parameter but the stamp, for each step."""
    g = torch.Generator().manual_seed(1 + rank)
    return [[torch.randn(s, generator=g).mul_(0.01).to(device) for s in shapes[:-1]]
            for _ in range(steps)]


class Busy:
    """Matmuls on the main stream (CUDA only), so that the host runs ahead of the GPU."""

    def __init__(self, dim: int, device: torch.device) -> None:
        self.x = (torch.randn(dim, dim, device=device) if dim and device.type == "cuda"
                  else None)

    def __call__(self, n: int = 3) -> None:
        if self.x is not None:
            for _ in range(n):
                self.x = torch.tanh(self.x @ self.x / self.x.shape[0])


def sleep_gpu(seconds: float) -> None:
    """Spin the current CUDA stream for about ``seconds`` (nothing on CPU or for 0)."""
    if seconds > 0 and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda._sleep(int(seconds * SLEEP_HZ))


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


# ---------------------------------------------------------------------------- strategies
class AccountedAveraging(ModelAveraging):
    """Model averaging that records, for the checks: the stamp each snapshot carries (a host
    sync, on the sync thread), the sum of the deltas it produced (``applied``) and its share of
    the wire-rounding bound (``own_bound``, ``u |s - ref|`` summed over rounds)."""

    def __init__(self, wire_dtype: torch.dtype | None = None) -> None:
        super().__init__(wire_dtype)
        self.stamps: list[float] = []
        self.applied = torch.empty(0)
        self.own_bound = torch.empty(0)

    def _init_state(self, params: Tensor) -> None:
        super()._init_state(params)
        self.applied = torch.zeros_like(params)
        self.own_bound = torch.zeros_like(params)

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        self.stamps.append(snapshot[-1].item())
        return super().reduce_input(snapshot)

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        sent = snapshot - self.reference if self.compressed else snapshot  # before ref moves
        self.own_bound.add_(sent.abs(), alpha=unit_roundoff(reduced.dtype))
        d = super().delta(snapshot, reduced)
        self.applied.add_(d)
        return d


class SlowConstantDelta(SyncStrategy):
    """Round ``r``'s delta is the constant ``r``, filled on the side stream after a sleep, in
    memory that most likely held a sentinel (see the fence check)."""

    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.sleep_s = sleep_s
        self.on_default_stream = 0
        self.done: torch.cuda.Event | None = None
        self.pointers: list[int] = []  # of the deltas made (CUDA)

    def _init_state(self, params: Tensor) -> None:
        del params

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        self._check(snapshot, "snapshot")
        return snapshot

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        self._check(reduced, "reduced")
        self.rounds += 1
        scratch = torch.full_like(snapshot, SENTINEL)  # side-stream churn
        del scratch
        if snapshot.is_cuda:
            stream = torch.cuda.current_stream()
            self.on_default_stream += stream == torch.cuda.default_stream()
            sleep_gpu(self.sleep_s)
        out = torch.full_like(snapshot, float(self.rounds))
        if snapshot.is_cuda:
            self.done = torch.cuda.Event()
            self.done.record()
            self.pointers.append(out.data_ptr())
        return out


class FailingAveraging(ModelAveraging):
    """Model averaging whose ``delta`` raises on ``fail_rank`` in round ``fail_round``."""

    def __init__(self, fail_rank: int, fail_round: int) -> None:
        super().__init__()
        self.fail_rank = fail_rank
        self.fail_round = fail_round
        self.failed_at = math.nan

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        if dist.get_rank() == self.fail_rank and self.rounds + 1 == self.fail_round:
            self.failed_at = time.monotonic()
            raise RuntimeError(f"injected failure in round {self.fail_round}")
        return super().delta(snapshot, reduced)


# ---------------------------------------------------------------------------- 1. equivalence
@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shadow: bool
    make: Callable[[], SyncStrategy]
    final_sync: bool = True
    compare: bool = False  # deterministic: the cuda replica must match the cpu one
    chunk_bytes: int | None = None
    max_staleness: int | None = None


BASE_CASES = [
    Case("fixed-rate MA", False, AccountedAveraging, compare=True),
    Case("shadow MA", True, AccountedAveraging),
    Case("shadow EASGD", True, functools.partial(ElasticAveraging, alpha=0.3), final_sync=False),
    Case("fixed-rate BMUF-NBM", False,
         functools.partial(BlockwiseModelUpdateFiltering, 0.5, nesterov=True), compare=True),
    Case("shadow BMUF-NBM", True,
         functools.partial(BlockwiseModelUpdateFiltering, 0.5, nesterov=True)),
]
WIRES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16,
                                        "fp16": torch.float16}


def ma_variants(numel: int, world: int) -> list[Case]:
    """Shadow MA over wire dtypes x chunking x max_staleness."""
    slots = numel + 3 + world  # payload and control slots (see protocol.Wire)
    chunk_bytes = -(-slots // 4) * 4  # a quarter of the float32 buffer (in bytes)
    cases = []
    for wire_name, wire in WIRES.items():
        size = 4 if wire is None else torch.finfo(wire).bits // 8
        for chunk in (None, chunk_bytes):
            n = 1 if chunk is None else -(-slots // (chunk // size))
            for k in (None, 1, 2):
                cases.append(Case(f"shadow MA {wire_name} {n}ch K={k}", True,
                                  functools.partial(AccountedAveraging, wire_dtype=wire),
                                  chunk_bytes=chunk, max_staleness=k))
    return cases


def run_case(rank: int, device: torch.device, case: Case, group: dist.ProcessGroup,
             sizes: Sizes, rows: Rows) -> Tensor:
    """One run of ``case``; adds its measures to ``rows``; returns this rank's final replica."""
    world = dist.get_world_size()
    params = make_params(sizes.shapes, device)
    x0 = flat(params)
    drifts = make_drifts(rank, sizes.shapes, sizes.steps, device)
    busy = Busy(sizes.busy_dim, device)
    strategy = case.make()
    runner: SyncRunner = (
        ShadowSyncRunner(ReplicaSet(params, strategy), group, ShadowOptions(
            deadline_s=60.0, chunk_bytes=case.chunk_bytes, max_staleness=case.max_staleness))
        if case.shadow else
        FixedRateSyncRunner(ReplicaSet(params, strategy), group, FixedRateOptions(
            period=PERIOD, chunk_bytes=case.chunk_bytes)))
    runner.start()
    for step in range(1, sizes.steps + 1):
        params[-1].fill_(-1.0)
        busy()
        params[-1].fill_(float(step))
        torch._foreach_add_(params[:-1], drifts[step - 1])
        dist.all_reduce(torch.zeros(1))  # lockstep, like TorchRec's per-step all-to-all
        runner.step()
    runner.stop(final_sync=case.final_sync)
    final = flat(params)
    total_drift = tensor_sum(gather(tensor_sum(torch.cat([d.reshape(-1) for d in ds]).cpu()
                                     for ds in drifts)))
    replicas = gather(final)
    body = slice(0, -1)  # everything but the stamp
    dev, name = device.type, case.name
    if isinstance(strategy, AccountedAveraging):
        applied = tensor_sum(gather(strategy.applied))[body]
        bound = (world + 1) * tensor_sum(gather(strategy.own_bound))[body]
        exact = x0[body] + (total_drift + applied) / world
        rows.add(name, dev, "x = x0 + (sum drift + D)/W",
                 (final[body] - exact).abs().max().item(), ATOL)
        rows.add(name, dev, "|D| <= wire bound (elementwise)",
                 (applied.abs() - bound).max().item(), ATOL)
        rows.add(name, dev, "x = x0 + sum drift/W",
                 (final[body] - x0[body] - total_drift / world).abs().max().item(),
                 ATOL + bound.max().item() / world)
        torn = [s for s in strategy.stamps if s < 1]
        rows.add(name, dev, "snapshots taken mid-step", len(torn), per_rank=True)
    if isinstance(strategy, ElasticAveraging):
        conserved = tensor_sum(replicas)[body] + strategy.center.cpu()[body]
        expected = (world + 1) * x0[body] + total_drift
        rows.add(name, dev, "sum x + c conserved", (conserved - expected).abs().max().item(),
                 ATOL)
    if case.final_sync:
        rows.add(name, dev, "replicas bit-identical",
                 float(not all(torch.equal(replicas[0], r) for r in replicas)))
    stats = runner.stats()
    if case.max_staleness is not None:
        rows.add(name, dev, "max staleness - K", stats.staleness_max - case.max_staleness,
                 per_rank=True)
    rows.add(name, dev, "no delta applied", float(stats.syncs_applied == 0), per_rank=True)
    rows.add(name, dev, "finite", float(not bool(final.isfinite().all())), per_rank=True)
    rows.case(name, dev, runner)
    return final


def check_equivalence(rank: int, world_size: int, *, kind: str, sizes: Sizes) -> dict[str, Any]:
    rows = Rows(rank, "equivalence")
    device = rank_device(kind, rank)
    group = sync_group()
    devices = [torch.device("cpu")] + ([device] if kind == "cuda" else [])
    finals: dict[tuple[str, str], Tensor] = {}
    for dev in devices:
        for case in BASE_CASES:
            finals[case.name, dev.type] = run_case(rank, dev, case, group, sizes, rows)
            if case.compare and dev.type == "cuda":
                diff = (finals[case.name, "cuda"] - finals[case.name, "cpu"]).abs().max()
                rows.add(case.name, "cuda", "cuda == cpu", diff.item(), ATOL, per_rank=True)
    for case in ma_variants(sizes.numel, world_size):
        run_case(rank, device, case, group, sizes, rows)
    return rows.result()


# ---------------------------------------------------------------------------- 2. cycles
def check_cycles(rank: int, world_size: int, *, kind: str, sizes: Sizes) -> dict[str, Any]:
    rows = Rows(rank, "cycles")
    device = rank_device(kind, rank)
    group = sync_group()
    dev = device.type
    params = make_params(sizes.shapes, device)
    busy = Busy(sizes.busy_dim, device)
    g = torch.Generator().manual_seed(1 + rank)
    segments = 4
    state: dict[str, Any] | None = None
    last_rounds = 0
    runner: ShadowSyncRunner | None = None
    for segment in range(segments):
        case = f"segment {segment + 1}"
        strategy = BlockwiseModelUpdateFiltering(0.5, nesterov=True, wire_dtype=torch.bfloat16)
        runner = ShadowSyncRunner(ReplicaSet(params, strategy), group,
                                  ShadowOptions(deadline_s=60.0))
        if state is not None:
            runner.load_state_dict(state)
            back = runner.state_dict()  # allowed while NEW: what the fresh runner now holds
            diff = max((back["strategies"]["dense"][k].cpu() - v.cpu()).abs().max().item()
                       for k, v in state["strategies"]["dense"].items() if isinstance(v, Tensor))
            rounds = (back["strategies"]["dense"]["rounds"], state["strategies"]["dense"]["rounds"])
            same = back["counters"] == state["counters"] and rounds[0] == rounds[1]
            rows.add(case, dev, "state_dict round-trips", diff + float(not same), per_rank=True)
        runner.start()
        for _ in range(sizes.cycle_steps):
            busy()
            drift = [torch.randn(s, generator=g).mul_(0.01).to(device) for s in sizes.shapes]
            torch._foreach_add_(params, drift)
            dist.all_reduce(torch.zeros(1))
            runner.step()
        last = segment == segments - 1
        runner.stop(final_sync=last)
        if last:
            break
        buf = io.BytesIO()
        torch.save(runner.state_dict(), buf)  # a checkpoint, through bytes
        buf.seek(0)
        state = torch.load(buf, weights_only=True, map_location=device)
        counters, strat = state["counters"], state["strategies"]["dense"]
        rows.add(case, dev, "steps counted", abs(counters["steps"]
                                                 - (segment + 1) * sizes.cycle_steps),
                 per_rank=True)
        rows.add(case, dev, "rounds continue", float(not (counters["rounds"] > last_rounds
                                                          and strat["rounds"]
                                                          == counters["rounds"])),
                 per_rank=True)
        last_rounds = counters["rounds"]
        for name in ("global_model", "momentum"):
            copies = gather(strat[name])
            rows.add(case, dev, f"{name} identical across ranks",
                     max((c - copies[0]).abs().max().item() for c in copies))
        rows.case(case, dev, runner)
        params = [p.detach().clone() for p in params]  # restored into a fresh model
    assert runner is not None
    final = flat(params)
    replicas = gather(final)
    case = f"segment {segments}"
    rows.case(case, dev, runner)
    rows.add(case, dev, "replicas bit-identical",
             float(not all(torch.equal(replicas[0], r) for r in replicas)))
    rows.add(case, dev, "finite", float(not bool(final.isfinite().all())), per_rank=True)
    rows.add(case, dev, "total steps", abs(runner.stats().steps - segments * sizes.cycle_steps),
             per_rank=True)
    rows.add(case, dev, "rounds continue", float(not runner.stats().rounds > last_rounds),
             per_rank=True)
    return rows.result()


# ---------------------------------------------------------------------------- 3. fence
def check_fence(rank: int, world_size: int, *, kind: str, sizes: Sizes) -> dict[str, Any]:
    rows = Rows(rank, "fence")
    device = rank_device(kind, rank)
    group = sync_group()
    dev, case = device.type, "slow constant deltas"
    cuda = device.type == "cuda"
    params = [torch.zeros(sizes.fence_numel, device=device)]
    broadcast_(params)
    strategy = SlowConstantDelta(sizes.fence_sleep_s)
    main = torch.cuda.current_stream(device) if cuda else None
    recorded: list[tuple[int, int]] = []  # (data_ptr, stream id) of each record_stream call
    original = torch.Tensor.record_stream
    own = "record_stream" in vars(torch.Tensor)  # else inherited from the C base class

    def spy(self: Tensor, stream: Any) -> None:
        recorded.append((self.data_ptr(), int(stream.stream_id)))
        original(self, stream)

    torch.Tensor.record_stream = spy  # type: ignore[method-assign, assignment]
    wrong = torch.zeros(sizes.fence_steps, device=device)
    while_busy = 0
    try:
        runner = ShadowSyncRunner(ReplicaSet(params, strategy), group,
                                  ShadowOptions(deadline_s=60.0))
        runner.start()
        for step in range(sizes.fence_steps):
            for _ in range(2):  # main-stream churn of the delta's size
                junk = torch.full((sizes.fence_numel,), -SENTINEL, device=device)
                del junk
            sleep_gpu(sizes.main_sleep_s)
            done = strategy.done
            side_busy = done is not None and not done.query()
            before = runner.syncs_applied
            runner.step()
            k = runner.syncs_applied
            while_busy += side_busy and k > before
            wrong[step] = (params[0] != k * (k + 1) / 2).sum()  # on the device: no host sync
            time.sleep(0.001)
        runner.stop(final_sync=False)
    finally:
        if own:
            torch.Tensor.record_stream = original  # type: ignore[method-assign]
        else:
            del torch.Tensor.record_stream
    k = runner.syncs_applied
    bad_steps = (wrong > 0).nonzero().flatten().tolist()
    rows.add(case, dev, "wrong elements over all steps", wrong.sum().item(), per_rank=True)
    if bad_steps:
        rows.note(f"rank {rank}: first wrong values after step {bad_steps[0] + 1}")
    rows.add(case, dev, "final == 1 + ... + k", (params[0] - k * (k + 1) / 2).abs().max().item(),
             per_rank=True)
    rows.add(case, dev, "deltas applied >= 10", max(0, 10 - k), per_rank=True)
    expected_calls = k if cuda else 0
    main_id = int(main.stream_id) if main is not None else -1
    made, seen = (collections.Counter(strategy.pointers),
                  collections.Counter(ptr for ptr, _ in recorded))
    rows.add(case, dev, "record_stream(main) per delta",
             abs(len(recorded) - expected_calls) + sum(s != main_id for _, s in recorded)
             + (made - seen).total() + (seen - made).total(), per_rank=True)
    rows.add(case, dev, "deltas made on the default stream", strategy.on_default_stream,
             per_rank=True)
    rows.note(f"rank {rank}: {k} deltas, {while_busy} applied while their stream was busy")
    rows.case(case, dev, runner)
    return rows.result()


# ---------------------------------------------------------------------------- 4. audit
_RUNTIME = re.compile(r"^cu(da)?[A-Z]")
_SYNC_CALL = re.compile(r"^cu(da)?(Stream|Device|Event|Ctx)?Synchronize|^cudaMemcpy(2D|3D)?$")
_SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
_EDGE_US = 5.0  # clock skew allowed between CUPTI's and the profiler's timestamps (presence only)


def thread_ids() -> set[int]:
    """The ids the current thread's CUDA runtime calls may carry in a kineto trace."""
    ident = threading.get_ident() & 0xFFFFFFFF
    return {threading.get_native_id(), ident, ident - (1 << 32) if ident >= 1 << 31 else ident}


def audit_events(events: Sequence[Any], rids: set[int]) -> dict[str, Any]:
    """The synchronizations inside the ``shadowsync.apply``/``.snapshot`` ranges (see the
    module docstring); ``rids`` are the ids the training thread's runtime calls may carry."""
    cpu = torch.autograd.DeviceType.CPU
    ranges: dict[str, list[Any]] = {name: [] for name in RANGES}
    ops: list[Any] = []
    calls: list[Any] = []
    for e in events:
        if e.device_type != cpu:
            continue
        if e.name in ranges:
            ranges[e.name].append(e)
        elif _RUNTIME.match(e.name):
            calls.append(e)
        else:
            ops.append(e)
    threads = {r.thread for rs in ranges.values() for r in rs}
    # Calls linked to the training thread's own ops carry whatever id kineto gives that thread.
    rids = rids | {c.device_resource_id for c in calls
                   if getattr(c, "linked_correlation_id", 0) > 0 and c.thread in threads}
    mine = sorted((c for c in calls if c.device_resource_id in rids),
                  key=lambda c: c.time_range.start)
    ops = sorted((o for o in ops if o.thread in threads), key=lambda o: o.time_range.start)

    def inside(items: list[Any], starts: list[float], r: Any, edge: float) -> list[Any]:
        lo, hi = r.time_range.start - edge, r.time_range.end + edge
        out = []
        for i in range(bisect.bisect_left(starts, lo), len(items)):
            if starts[i] > hi:
                break
            if items[i].time_range.end <= hi and items[i] is not r:
                out.append(items[i])
        return out

    call_starts = [c.time_range.start for c in mine]
    op_starts = [o.time_range.start for o in ops]
    seen = collections.Counter(c.device_resource_id for c in calls).most_common(4)
    out: dict[str, Any] = {"threads": len(threads), "calls": len(mine), "bad": [],
                           "rids": sorted(rids), "seen": seen}
    for name, rs in ranges.items():
        fenced = record_streams = 0
        for r in rs:
            within = inside(mine, call_starts, r, 0.0) + inside(ops, op_starts, r, 0.0)
            out["bad"] += [f"{e.name} in {name}" for e in within
                           if _SYNC_CALL.match(e.name) or e.name in _SYNC_OPS]
            near = inside(mine, call_starts, r, _EDGE_US)
            fenced += any(c.name.startswith("cudaStreamWaitEvent") for c in near)
            record_streams += any(o.name == "aten::record_stream"
                                  for o in inside(ops, op_starts, r, 0.0))
        out[name] = {"ranges": len(rs), "fenced": fenced, "record_stream": record_streams}
    return out


def check_audit(rank: int, world_size: int, *, kind: str, sizes: Sizes) -> dict[str, Any]:
    rows = Rows(rank, "audit")
    device = rank_device(kind, rank)
    group = sync_group()
    dev, case = device.type, "shadow MA, profiled"
    cuda = device.type == "cuda"
    params = make_params(sizes.shapes, device)
    drifts = make_drifts(rank, sizes.shapes, 1, device)[0]
    busy = Busy(sizes.busy_dim, device)
    runner = ShadowSyncRunner(ReplicaSet(params, ModelAveraging()), group,
                              ShadowOptions(deadline_s=60.0))
    runner.start()

    def train() -> None:
        busy(1)
        torch._foreach_add_(params[:-1], drifts)
        dist.all_reduce(torch.zeros(1))
        runner.step()

    for _ in range(5):
        train()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    before = runner.syncs_applied
    with profile(activities=activities) as prof:
        for _ in range(sizes.audit_steps):
            train()
    applied = runner.syncs_applied - before
    runner.stop(final_sync=True)
    found = audit_events(list(prof.events()), thread_ids())
    apply, snap = found["shadowsync.apply"], found["shadowsync.snapshot"]
    rows.add(case, dev, "synchronizations inside the ranges", len(found["bad"]), per_rank=True)
    for text in sorted(set(found["bad"]))[:5]:
        rows.note(f"rank {rank}: {text} (x{found['bad'].count(text)})")
    rows.add(case, dev, "apply ranges != deltas applied", abs(apply["ranges"] - applied),
             per_rank=True)
    rows.add(case, dev, "no snapshot range", float(snap["ranges"] == 0), per_rank=True)
    if cuda:  # not blind: the runtime calls the ranges themselves issue are seen in them
        for name, r in (("apply", apply), ("snapshot", snap)):
            rows.add(case, dev, f"{name} ranges without their cudaStreamWaitEvent",
                     1 - r["fenced"] / max(r["ranges"], 1), BLIND_SHARE, per_rank=True)
    rows.note(f"rank {rank}: {apply['ranges']} apply ranges ({apply['fenced']} fenced, "
              f"{apply['record_stream']} with aten::record_stream), {snap['ranges']} snapshot "
              f"ranges ({snap['fenced']} fenced); {found['calls']} runtime calls of the "
              f"training thread")
    if cuda:  # what to look at if the audit went blind
        rows.note(f"rank {rank}: training thread ids {found['rids']}; runtime calls by id "
                  f"(id, calls) {found['seen']}")
    rows.case(case, dev, runner)
    return rows.result()


# ---------------------------------------------------------------------------- 5. failure
def until_error(runner: ShadowSyncRunner, params: list[Tensor], budget_s: float,
                before_step: Callable[[int], None]) -> tuple[SyncError | None, float]:
    """Steps until ``step`` raises (no lockstep collective: a rank that raised stops
    stepping); the error and when it surfaced (None, and the time, after ``budget_s``)."""
    began = time.monotonic()
    step = 0
    while time.monotonic() - began < budget_s:
        step += 1
        torch._foreach_add_(params, 1e-3)
        before_step(step)
        try:
            runner.step()
        except SyncError as exc:
            return exc, time.monotonic()
        time.sleep(0.002)
    return None, time.monotonic()


def check_failure(rank: int, world_size: int, *, kind: str, sizes: Sizes) -> dict[str, Any]:
    rows = Rows(rank, "failure")
    device = rank_device(kind, rank)
    dev = device.type
    failing = 1
    budget_s = 4 * FAILURE_LIMIT_S

    # (a) rank 1's strategy raises in round 3
    case = "strategy raises on rank 1"
    params = make_params(sizes.shapes, device)
    strategy = FailingAveraging(failing, fail_round=3)
    runner = ShadowSyncRunner(ReplicaSet(params, strategy), sync_group(),
                              ShadowOptions(deadline_s=30.0))
    runner.start()
    error, raised_at = until_error(runner, params, budget_s, lambda step: None)
    failed_at = max((v[0] for v in gather_floats([strategy.failed_at]) if not math.isnan(v[0])),
                    default=math.nan)
    describe(rows, case, dev, error, raised_at - failed_at, failing, runner)
    runner.abandon()

    # (b) rank 1's replica goes non-finite
    case = "non-finite replica on rank 1"
    params = make_params(sizes.shapes, device)
    runner = ShadowSyncRunner(ReplicaSet(params, ModelAveraging()), sync_group(),
                              ShadowOptions(deadline_s=30.0))
    runner.start()
    poisoned = [math.nan]

    def poison(step: int) -> None:
        if rank == failing and step == 5:
            params[0].view(-1)[0] = math.nan
            poisoned[0] = time.monotonic()

    error, raised_at = until_error(runner, params, budget_s, poison)
    poisoned_at = max((v[0] for v in gather_floats(poisoned) if not math.isnan(v[0])),
                      default=math.nan)
    describe(rows, case, dev, error, raised_at - poisoned_at, failing, runner)
    if rank == failing:
        rows.add(case, dev, "NonFiniteError", float(not isinstance(error, NonFiniteError)),
                 per_rank=True)
    else:
        rows.add(case, dev, "peer replica finite", float(not bool(flat(params).isfinite().all())),
                 per_rank=True)
    runner.abandon()
    return rows.result()


def describe(rows: Rows, case: str, dev: str, error: SyncError | None, latency_s: float,
             failing: int, runner: ShadowSyncRunner) -> None:
    """The measures both failure cases share."""
    rank = rows.rank
    rows.add(case, dev, "no SyncError raised", float(error is None), per_rank=True)
    rows.add(case, dev, "seconds to raise", latency_s, FAILURE_LIMIT_S, per_rank=True)
    if rank == failing:
        rows.add(case, dev, "own error is not PeerAborted", float(isinstance(error, PeerAborted)),
                 per_rank=True)
    else:
        names = isinstance(error, PeerAborted) and f"rank(s) [{failing}]" in str(error)
        rows.add(case, dev, f"PeerAborted naming rank {failing}", float(not names),
                 per_rank=True)
    rows.add(case, dev, "failure() is the raised error",
             float(error is None or runner.failure() is not error), per_rank=True)
    rows.note(f"rank {rank}, {case}: {type(error).__name__}: {error}")
    rows.case(case, dev, runner)


# ---------------------------------------------------------------------------- 6. memory
def check_memory(rank: int, world_size: int, *, kind: str, sizes: Sizes) -> dict[str, Any]:
    rows = Rows(rank, "memory")
    device = rank_device(kind, rank)
    group = sync_group()
    cuda = device.type == "cuda"
    dev = device.type
    warm, early, total = sizes.memory_rounds
    case = f"shadow MA K=1, {total} rounds"
    half = sizes.memory_numel // 2
    params = make_params([(half,), (sizes.memory_numel - half,)], device)
    drift = [torch.full_like(p, 1e-4) for p in params]
    runner = ShadowSyncRunner(ReplicaSet(params, ModelAveraging()), group,
                              ShadowOptions(deadline_s=60.0, max_staleness=1))

    def settle() -> int:
        if cuda:
            torch.cuda.synchronize(device)
            return torch.cuda.memory_allocated(device)
        return 0

    def peak(reset: bool = False) -> int:
        value = torch.cuda.max_memory_allocated(device) if cuda else 0
        if cuda and reset:
            torch.cuda.reset_peak_memory_stats(device)
        return value

    # With max_staleness=1 step s lands round s - 1 and starts round s: rounds follow steps on
    # every rank, so the loops run on step counts (no rank can wait for a round its peer
    # already stopped).
    def run(until: int) -> None:
        while runner.stats().steps < until:
            torch._foreach_add_(params, drift)
            runner.step()

    runner.start()
    run(warm)
    runner.stop(final_sync=False)
    baseline = settle()
    peak(reset=True)
    runner.start()
    run(early)
    early_peak = peak(reset=True)
    run(total)
    late_peak = peak()
    runner.stop(final_sync=False)
    end = settle()
    delta_bytes = sizes.memory_numel * params[0].element_size()
    if cuda:
        rows.add(case, dev, "late peak - early peak (bytes)", late_peak - early_peak,
                 PEAK_MARGIN_DELTAS * delta_bytes, per_rank=True)
        rows.add(case, dev, "allocated after - before (bytes)", end - baseline,
                 LEAK_MARGIN_BYTES, per_rank=True)
        rows.note(f"rank {rank}: baseline {baseline / 2**20:.2f} MiB, early peak "
                  f"{early_peak / 2**20:.2f} MiB, late peak {late_peak / 2**20:.2f} MiB, end "
                  f"{end / 2**20:.2f} MiB")
    stats = runner.stats()
    rows.add(case, dev, f"rounds < {total}", max(0, total - stats.rounds), per_rank=True)
    rows.add(case, dev, "finite", float(not bool(flat(params).isfinite().all())), per_rank=True)
    rows.case(case, dev, runner)
    return rows.result()


# ---------------------------------------------------------------------------- driver
@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    run: Callable[..., dict[str, Any]]
    timeout_s: float
    cuda_only: bool


CHECKS = [
    Check("equivalence", check_equivalence, 240.0, cuda_only=False),
    Check("cycles", check_cycles, 90.0, cuda_only=False),
    Check("fence", check_fence, 90.0, cuda_only=True),
    Check("audit", check_audit, 120.0, cuda_only=True),
    Check("failure", check_failure, 90.0, cuda_only=False),
    Check("memory", check_memory, 180.0, cuda_only=True),
]


@dataclasses.dataclass
class Outcome:
    check: Check
    status: str  # PASS, FAIL or SKIP
    reason: str
    seconds: float
    measures: list[dict[str, Any]]
    cases: list[dict[str, Any]]


def ok(m: dict[str, Any]) -> bool:
    return bool(m["value"] <= m["limit"])  # NaN fails


def where(m: dict[str, Any]) -> str:
    rank = "" if m["rank"] == "*" else f", rank {m['rank']}"
    return f"{m['case']} [{m['device']}{rank}]"


def run_check(check: Check, kind: str, sizes: Sizes, timeout_s: float) -> Outcome:
    began = time.monotonic()
    fn = functools.partial(check.run, kind=kind, sizes=sizes)
    try:
        results = run_ranks(fn, world_size=WORLD, timeout_s=timeout_s, pg_timeout_s=60)
    except Exception as exc:  # a rank's traceback, or a timeout: the check failed
        text = str(exc).strip()
        last = text.splitlines()[-1] if text else type(exc).__name__
        print(f"--- {check.name}: {type(exc).__name__}\n{text}", flush=True)
        return Outcome(check, "FAIL", last, time.monotonic() - began, [], [])
    measures = [m for r in results for m in r["measures"]]
    cases = [c for r in results for c in r["cases"]]
    for note in (n for r in results for n in r["notes"]):
        print(f"    {check.name}: {note}", flush=True)
    seconds = time.monotonic() - began
    failed = [m for m in measures if not ok(m)]
    if failed:
        m = failed[0]
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        reason = (f"{where(m)}: {m['what']} = {m['value']:.3g} > {m['limit']:.3g}{more}")
        return Outcome(check, "FAIL", reason, seconds, measures, cases)
    summary = f"{len(measures)} measures, {len({(c['case'], c['device']) for c in cases})} cases"
    if kind == "cpu" and check.cuda_only:
        return Outcome(check, "SKIP", f"CUDA only; its logic ran on cpu ({summary})", seconds,
                       measures, cases)
    return Outcome(check, "PASS", summary, seconds, measures, cases)


def table(outcomes: Sequence[Outcome]) -> str:
    """One row per check, case and device: the case's telemetry and its worst measure."""
    head = (f"| {'check':<11} | {'case':<28} | {'dev':<4} | {'rounds':>6} | {'syncs':>5} | "
            f"{'stale':>5} | {'ok':>5} | {'worst measure':<40} | {'value':>9} | {'limit':>9} |")
    lines = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
    for o in outcomes:
        if not o.measures:
            lines.append(f"| {o.check.name:<11} | {o.status + ': ' + o.reason:<.115} |")
            continue
        keys = list(dict.fromkeys((m["case"], m["device"]) for m in o.measures))
        stats = {(c["case"], c["device"]): c for c in o.cases}
        for key in keys:
            ms = [m for m in o.measures if (m["case"], m["device"]) == key]
            worst = max(ms, key=lambda m: (not ok(m), m["value"] / m["limit"] if m["limit"] > 0
                                           else math.inf if m["value"] > 0 else 0.0))
            c = stats.get(key, {"rounds": "", "syncs": "", "stale": ""})
            what = worst["what"] + ("" if worst["rank"] == "*" else f" (r{worst['rank']})")
            lines.append(
                f"| {o.check.name:<11} | {key[0]:<28.28} | {key[1]:<4} | {c['rounds']:>6} | "
                f"{c['syncs']:>5} | {c['stale']:>5} | {sum(map(ok, ms)):>2}/{len(ms):<2} | "
                f"{what:<40.40} | {worst['value']:>9.2e} | {worst['limit']:>9.2e} |")
    return "\n".join(lines)
