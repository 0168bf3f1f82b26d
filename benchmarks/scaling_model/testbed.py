"""The scaling model of the emulated testbed (``cluster.py``, ``frontier.py``): each arm's
step and sync gap on rate-limited links, from constants fitted by :mod:`.fit` (equations:
:data:`TESTBED_DOC`), and the measured points it is held against."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from shadowsync.benchmarks.rows import baseline
from shadowsync.benchmarks.scaling_model.model import (
    Network,
    allreduce_s,
)
from shadowsync.benchmarks.scaling_model.overrides import override_dict
from shadowsync.sync.quantized import BLOCK, encoded_bytes

# ---------------------------------------------------------------------- testbed
# The emulated cluster (benchmarks/cluster.py, benchmarks/frontier.py): the same kind of
# equations, with what that testbed is made of. TESTBED_DOC is the model, predict_testbed the code.
TESTBED_DOC = """\
Testbed mode (``--testbed DIR``): predicts the frontier benchmark's arms on the emulated cluster
from each job's ``none`` arm and its link, with constants fitted on the 2-host jobs only. Per
(hosts N, link), per rank (seconds, bytes)::

    measured  T0 = N * batch / (none's examples/s)     the step without synchronization
                                                         (batch = examples/s * train_seconds
                                                         / (N * steps))
              w  = none's link bytes per host per step   (embedding all-to-alls)
              S  = bytes of one round's allreduce        (sync_bytes_reduced / (rounds + 1))
    link      B  = eta * tbf rate                        what gloo gets of a link
              Bc = B_cpu * N_probe / N                   what the shared cores move per host
              eta, B_cpu: fitted to the 2-host FR arms' allreduce times (blocking rounds: the
              link's own speed while training waits), on links where the token bucket,
              resp. the cores, is the limit; the cluster probe's values where none ran
              L  = the tbf queue's latency limit         (cluster.py)
    derived   beta = min(B, Bc)                          (unlimited: Bc)
              A  = 2 (N-1)/N * S / beta                  ring allreduce; links add no delay
              Ac = 2 (N-1)/N * S / Bc                    the CPU work of moving those bytes
              X  = w / beta,  Tc = T0 - X - D            all-to-all and compute inside T0;
                                                         D: the emulated device wait of a
                                                         step (bench_sync --device-step-ms),
                                                         in which the cores idle
              Q  = min(L, (Sk/N) / B) if B < Bc, else 0  the wait behind one ring chunk in a
                                                         link's FIFO queue (tbf), where the
                                                         link and not the CPU is the limit;
                                                         Sk = min(S, sync.transport.chunk_mb),
                                                         n_k = ceil(S / Sk) collectives a round
    fitted    on the 2-host jobs; CPU work in compute steps Tc, since every host shares the
              same cores and such work stretches with N as Tc does:
              rho    one round's CPU work r = rho Tc     FR arms' ratios
              delta  DDP's own cost delta Tc             ddp's ratio
              lam    the background allreduce's wait     shadow arms' allreduce times
                     for the cores, lam Tc
              phi    CPU work of one collective, phi Tc  (same)
              lam_n  lam of a niced thread               niced arms' allreduce times
                     (sync.transport.thread_nice > 0:
                     it yields the cores to training)
              mu_n   the rest of a niced round's wait    niced back-to-back arms' gaps
                     for the cores, mu_n Tc
              kappa  share of a background round's CPU   shadow arms' ratios and gaps
                     work that training pays
              q      exchanges a step that queue behind  shadow arms' ratios and gaps
                     a round's bytes
              kappa_n  kappa of a niced thread           niced arms' ratios and gaps
    ddp       T = T0 + delta Tc + A                      no overlap with backward (worst case)
    FR-k      T = T0 + m/steps * (r + A)                 m = floor((steps-1)/k) + 1 rounds
              gap = (1 + (m-1) k) / m                    rounds after steps 1, k+1, 2k+1, ...
    shadow    Ab = A (1 + X/T0) + (lam + phi n_k) Tc     the allreduce in the background: it
                                                         shares the link with the all-to-alls
                                                         and waits for the cores (lam_n for a
                                                         niced thread)
              Q  = 0 with the sync traffic in the low    training's packets go first (htb
                   class (sync.transport.socket_ifname)  priority): none queue behind a round
              R  = r + Ab / share (+ mu_n Tc if niced)   a round's duration (max_comm_share
                                                         pauses between chunks)
              back to back: T = T0 + kappa (r + Ac + phi n_k Tc) / g + q Q min(1, Ab / (g T)),
                            g = max(1, R/T + 1/2)        (solved together: a delta waits for
                            the next step boundary, half a step on average; a share
                            Ab / (g T) of the steps run while the link carries a round;
                            kappa_n, lam_n and mu_n for a niced thread)
              max_staleness K: g is capped at K and T >= R / K (the step K after a round's
                            snapshot waits for it)
              C  = g (T - T0)                            what one round costs training
              max_slowdown s: rounds stay back to back while C / (g T0) <= s; otherwise the
                            pacer spaces them g_s = C / (s T0) steps apart (n_b busy steps a
                            round, each costing c = C / (n_b T0), busy share s / c) and
                            T = T0 (1 + s)
              gap as measured = steps / rounds: rounds start at step 1, the second g_1 later
                            (g_1 = g, or g + 3 with a pacer: it waits 3 steps to have a quiet
                            step to compare with), then every g_s; stop() adds one
    turns     (jobs run with --interleave B, every arm on one model in turns of B steps; the
              rows carry ``interleave``): steps = B, the gap is the mean distance between the
              syncs applied within a turn, so FR-k's is k and shadow's is g_s (a turn resumes
              where the arm's last one left off: no first round, no stop round); a round's
              bytes S come from the FR turns (all their rounds fall inside), its allreduce time
              is not recorded
    ratio = T0 / T;  S (and A, Ac) halve with a 16-bit wire dtype (FR and shadow)

Also shown for shadow: the ratio at the *measured* gap, T0 / (T0 + C / gap), which separates
the cost model's error from the pacer's choice of gap.
"""

# The cluster probe (2 hosts, 8 MB gloo allreduce): 119 of 125 MB/s at 1gbit, 23.5 of 25 MB/s
# at 200mbit, and 0.5-0.9 GB/s on unlimited links (CPU-bound); cluster.py's tbf latency.
TESTBED_LINK_EFFICIENCY = 0.95

TESTBED_UNLIMITED_MBPS = 600.0

TESTBED_PROBE_HOSTS = 2

TESTBED_TBF_LATENCY_S = 0.1

TESTBED_FAMILIES = ("ddp", "FR", "shadow")

TESTBED_SCHEDULES = ("runs", "turns")  # separate runs per arm; --interleave turns on one model

PACER_FIRST_QUIET_STEPS = 3  # SlowdownPacer.pause_steps before any quiet step is measured

QUEUED_MAX = 4.0  # search bound of q: a step has a handful of exchanges, not more

_LINK_RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")

_LINK_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def link_rate_name(label: str) -> str:
    """The link of a job label: ``1gbit-bs512`` (a frontier ``--tag`` variant) is ``1gbit``."""
    return label.split("-", 1)[0]


def link_rate_Bps(link: str) -> float | None:
    """The tbf rate a frontier link name stands for, bytes/s; None for ``unlimited``."""
    link = link_rate_name(link)
    if link == "unlimited":
        return None
    m = _LINK_RATE.match(link)
    if m is None:
        raise ValueError(f"link {link!r}: expected unlimited or e.g. 200mbit, 1gbit")
    return float(m.group(1)) * _LINK_UNITS[m.group(2)] / 8


@dataclasses.dataclass(frozen=True)
class TestbedLinks:
    """How the emulated links are described to the model (see TESTBED_DOC). The defaults are
    the cluster probe's (idle hosts); :func:`calibrate_links` refits ``efficiency`` and
    ``unlimited_Bps`` to allreduces timed during training."""

    efficiency: float = TESTBED_LINK_EFFICIENCY
    unlimited_Bps: float = TESTBED_UNLIMITED_MBPS * 1e6
    probe_hosts: int = TESTBED_PROBE_HOSTS
    tbf_latency_s: float = TESTBED_TBF_LATENCY_S

    def cpu_Bps(self, hosts: int) -> float:
        """Bc: what the shared cores move per host, the probe's rate split among the hosts."""
        return self.unlimited_Bps * self.probe_hosts / hosts

    def link_Bps(self, link: str) -> float | None:
        """B: the tbf rate as gloo gets it; None for an unlimited link."""
        rate = link_rate_Bps(link)
        return None if rate is None else self.efficiency * rate

    def bandwidth_Bps(self, link: str, hosts: int) -> float:
        """beta: the link's rate, capped by what the cores move."""
        rate = self.link_Bps(link)
        cpu = self.cpu_Bps(hosts)
        return cpu if rate is None else min(rate, cpu)


@dataclasses.dataclass(frozen=True)
class TestbedArm:
    """A frontier arm: its ``bench_sync`` name and, where the job recorded them, its overrides
    (``frontier.default_arms``)."""

    name: str
    kind: Literal["none", "ddp", "fixed_rate", "shadow"]
    period: int | None = None
    max_slowdown: float | None = None  # shadow: None runs rounds back to back (unpaced)
    max_comm_share: float = 1.0  # shadow: the share of a round's time it may hold the link
    chunk_bytes: float | None = None  # a round's allreduce in collectives of this size
    wire_factor: float = 1.0  # bytes on the wire per float32 byte (bf16, fp16: 0.5)
    thread_nice: int = 0  # shadow: sync.transport.thread_nice, the thread's nice above training's
    max_staleness: int | None = None  # shadow: the step that waits for a round (K)
    low_class: bool = False  # FR and shadow: sync traffic in the links' low class

    @property
    def family(self) -> str:
        return {"fixed_rate": "FR", "shadow": "shadow"}.get(self.kind, self.kind)


_INT8 = encoded_bytes(BLOCK) / (4 * BLOCK)  # int8 blocks with their scales: 0.254

_WIRE_FACTOR = {"float32": 1.0, "bfloat16": 0.5, "float16": 0.5, "int8": _INT8}

_WIRE_TAGS = {" bf16": 0.5, " fp16": 0.5, " int8": _INT8}  # frontier.WIRE_TAGS

_FR_NAME = re.compile(r"^FR k=(\d+)$")

_SHADOW_NAME = re.compile(r"^S (?:(?P<b2b>back to back|b2b)"
                          r"|(?P<link>link )?(?P<share>\d+(?:\.\d+)?)%)(?P<knobs>(?: [sn]\d+)*)$")


def parse_testbed_arm(name: str, overrides: str | None = None,
                      chunk_bytes: float | None = None) -> TestbedArm:
    """The arm a frontier arm name stands for: ``none``, ``ddp``, ``FR k=<k>``, ``S back to
    back`` (or ``S b2b``), ``S <p>%`` (accepted slowdown), ``S link <p>%`` (max_comm_share);
    a shadow name may add `` s<K>`` (max_staleness) and `` n<N>`` (thread_nice), and any
    name a wire-dtype tag (`` bf16``). ``overrides`` (as the job's ``.cmd`` records them, the
    flat ``sync.*`` keys of earlier records read as today's: :func:`override_dict`) take
    precedence over the name, and a ``sync.transport.socket_ifname`` among them puts the sync
    traffic in the low class (frontier's ``--sync-class low``); without them a shadow arm gets
    ``chunk_bytes``. ValueError for anything else, so an arm the model does not know is never
    silently mispredicted."""
    wire, base = 1.0, name
    for tag, factor in _WIRE_TAGS.items():
        if name.endswith(tag):
            wire, base = factor, name.removesuffix(tag)
    if base == "none":
        arm = TestbedArm(name, "none")
    elif base == "ddp":
        arm = TestbedArm(name, "ddp")
    elif m := _FR_NAME.match(base):
        arm = TestbedArm(name, "fixed_rate", period=int(m.group(1)), wire_factor=wire)
    elif m := _SHADOW_NAME.match(base):
        share = None if m["b2b"] else float(m["share"]) / 100
        knobs = {knob[0]: int(knob[1:]) for knob in m["knobs"].split()}
        arm = TestbedArm(name, "shadow", max_slowdown=None if m["link"] else share,
                         max_comm_share=share if m["link"] and share else 1.0,
                         chunk_bytes=chunk_bytes, wire_factor=wire,
                         thread_nice=knobs.get("n", 0), max_staleness=knobs.get("s"))
    else:
        raise ValueError(f"arm {name!r}: not a frontier arm (none, ddp, FR k=<k>, S back to "
                         "back, S b2b, S <p>%, S link <p>%, shadow ones with s<K>, n<N>)")
    if overrides is None:
        return arm
    given = override_dict(overrides.split())

    def number(key: str) -> float | None:
        value = given.get(key)
        return None if value is None or value == "null" else float(value)

    period = number("sync.schedule.period")
    chunk_mb = number("sync.transport.chunk_mb")
    nice = number("sync.transport.thread_nice")
    staleness = number("sync.schedule.max_staleness")
    return dataclasses.replace(
        arm, period=int(period) if period is not None else arm.period,
        max_slowdown=number("sync.schedule.max_slowdown") if "sync.schedule.max_slowdown" in given
        else arm.max_slowdown,
        max_comm_share=number("sync.schedule.max_comm_share") or arm.max_comm_share,
        chunk_bytes=chunk_mb * 2**20 if chunk_mb is not None else None,
        wire_factor=_WIRE_FACTOR[given["sync.transport.wire_dtype"]]
        if "sync.transport.wire_dtype" in given else arm.wire_factor,
        thread_nice=int(nice) if nice is not None else arm.thread_nice,
        max_staleness=(None if staleness is None else int(staleness))
        if "sync.schedule.max_staleness" in given else arm.max_staleness,
        low_class=given.get("sync.transport.socket_ifname", "null") not in ("", "null"))


def _nanmean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclasses.dataclass(frozen=True)
class TestbedMeasured:
    """One arm of one frontier job, reduced the way ``frontier.summarize`` reduces it (ratio: the
    median over repeats of examples/s over the same repeat's ``none``; gap: the runs' mean), plus
    the telemetry the model reads or is checked against (NaN where the arm has none)."""

    runs: int
    batch_size: int  # per rank, from examples/s * train_seconds / (hosts * steps)
    examples_per_s: float
    ratio: float
    ratio_min: float
    ratio_max: float
    gap: float
    steps: int
    round_bytes: float
    comm_per_round_s: float
    wire_bytes_per_step: float
    busy_share: float
    round_cost: float
    interleaved: bool = False  # rows are turns of a --interleave job (TESTBED_DOC, turns)
    device_s: float = 0.0  # D: the emulated device wait of every step (TESTBED_DOC)


def _steps(row: Mapping[str, Any]) -> int:
    """A run's steps, or a turn's (``interleave``) in a turns job."""
    return int(row["step"] if "step" in row else row["interleave"])


def _round_bytes(arm: str, rows: Sequence[Mapping[str, Any]]) -> float:
    """Bytes of one round's allreduce: the final consensus is one more allreduce of a run
    (of the same bytes when the wire dtype is float32, the frontier's default); in turns only
    an FR arm's count is exact (every round it reduced was applied within the turn)."""
    if any("sync_rounds" in r for r in rows):
        return _nanmean([r["sync_bytes_reduced"] / (r["sync_rounds"] + 1) for r in rows
                         if "sync_rounds" in r])
    if not arm.startswith("FR "):
        return math.nan
    return _nanmean([r["sync_bytes_reduced"] / r["sync_syncs_applied"] for r in rows
                     if r.get("sync_syncs_applied")])


def measure_testbed(rows: Sequence[Mapping[str, Any]], hosts: int
                    ) -> dict[str, TestbedMeasured]:
    """Per arm name, the measured point; rows are one ``raw/h<N>_<link>.json``, runs or a
    turns job's turns (:func:`_round_bytes` for a round's size). Each ratio is to what
    ``frontier.py`` compares the row with (:func:`rows.baseline`): the ``none`` turns beside
    a bracketed turn, else ``none``'s run or turn of the same seed and repeat."""
    base = {(r["seed"], r["repeat"]): float(r["examples_per_s"]) for r in rows
            if r["arm"] == "none"}
    if not base:
        raise ValueError("no 'none' run: every ratio is to none of the same repeat")
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        ratios = [float(r["examples_per_s"]) / baseline(r, base) for r in mine]
        allreduces = [r["sync_rounds"] + 1 for r in mine if "sync_rounds" in r]
        synced = [r for r in mine if "sync_rounds" in r]
        out[arm] = TestbedMeasured(
            runs=len(mine),
            batch_size=round(median([r["examples_per_s"] * r["train_seconds"]
                                      / (hosts * _steps(r)) for r in mine])),
            examples_per_s=median([float(r["examples_per_s"]) for r in mine]),
            ratio=median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
            gap=_nanmean([float(r.get("sync_gap_mean", math.nan)) for r in mine]),
            steps=int(median([_steps(r) for r in mine])),
            round_bytes=_round_bytes(arm, mine),
            comm_per_round_s=_nanmean([r["sync_comm_seconds"] / n
                                       for r, n in zip(synced, allreduces, strict=True)]),
            wire_bytes_per_step=_nanmean([float(r.get("wire_bytes", math.nan))
                                          / (hosts * _steps(r)) for r in mine]),
            busy_share=_nanmean([float(r.get("sync_busy_share", math.nan)) for r in mine]),
            round_cost=_nanmean([float(r.get("sync_round_cost", math.nan)) for r in mine]),
            interleaved=all("interleave" in r for r in mine),
            device_s=median([float(r.get("device_step_ms", 0.0)) / 1e3 for r in mine]),
        )
    return out


@dataclasses.dataclass(frozen=True)
class TestbedJob:
    """What the model takes from one (hosts, link) job's measurement, and what it is told about
    the link; everything else about the job's arms is predicted."""

    hosts: int
    link: str
    steps: int
    step_s: float  # T0
    bandwidth_Bps: float  # beta
    round_bytes: float  # S
    a2a_s: float  # X
    cpu_Bps: float  # Bc
    link_Bps: float | None  # B; None for an unlimited link
    tbf_latency_s: float  # L
    interleaved: bool = False  # a turns job: gaps are measured within turns (TESTBED_DOC)
    device_s: float = 0.0  # D

    @property
    def compute_s(self) -> float:
        """Tc: the part of the step that is CPU work (and stretches as the cores are shared):
        neither the all-to-all nor the emulated device wait."""
        return max(self.step_s - self.a2a_s - self.device_s, 0.0)

    @property
    def allreduce_s(self) -> float:
        """A: one ring allreduce of S on links that add no delay."""
        return self.allreduce_of(self.round_bytes)

    def allreduce_of(self, nbytes: float) -> float:
        """A ring allreduce of ``nbytes`` on this job's links."""
        return allreduce_s(nbytes, self.hosts, Network(0.0, self.bandwidth_Bps))

    def transfer_cpu_of(self, nbytes: float) -> float:
        """Ac: the CPU time of moving an allreduce's bytes (the same on a CPU-bound link)."""
        return allreduce_s(nbytes, self.hosts, Network(0.0, self.cpu_Bps))

    def queue_s(self, collective_bytes: float) -> float:
        """Q: how long a message waits behind one collective's bytes in the link's FIFO queue.
        A ring keeps one of its N chunks in flight per host; tbf drops what would wait longer
        than its latency limit, so the wait is capped there. No queue builds where the cores,
        not the token bucket, are the limit (unlimited links, rates above what they move)."""
        if self.link_Bps is None or self.link_Bps >= self.cpu_Bps:
            return 0.0
        return min(self.tbf_latency_s, collective_bytes / self.hosts / self.link_Bps)


def testbed_job(hosts: int, link: str, measured_arms: Mapping[str, TestbedMeasured],
                links: TestbedLinks) -> TestbedJob:
    """The job's inputs: T0 and w from ``none``, S from any arm that synchronized. The batch is
    read from the runs, not given: frontier jobs may override it."""
    none = measured_arms["none"]
    beta = links.bandwidth_Bps(link_rate_name(link), hosts)
    sizes = [m.round_bytes for name, m in measured_arms.items()
             if not math.isnan(m.round_bytes) and not name.endswith(tuple(_WIRE_TAGS))]
    if not sizes:
        raise ValueError(f"{hosts} hosts, {link}: no float32 arm synchronized, so no round "
                         "size")
    size = median(sizes)
    wire = 0.0 if math.isnan(none.wire_bytes_per_step) else none.wire_bytes_per_step
    return TestbedJob(hosts=hosts, link=link, steps=none.steps,
                      step_s=hosts * none.batch_size / none.examples_per_s, bandwidth_Bps=beta,
                      round_bytes=size, a2a_s=wire / beta, cpu_Bps=links.cpu_Bps(hosts),
                      link_Bps=links.link_Bps(link_rate_name(link)),
                      tbf_latency_s=links.tbf_latency_s, interleaved=none.interleaved,
                      device_s=none.device_s)


def calibrate_links(measured: Mapping[tuple[int, str], Mapping[str, TestbedMeasured]],
                    links: TestbedLinks) -> TestbedLinks:
    """``links`` with eta and B_cpu fitted to the FR arms' allreduce times (medians of the
    rates they achieved), each kept where no FR arm ran on a link of its kind. An FR round
    blocks training, so its allreduce time is the link's own, under the load of training
    (the probe times idle hosts). Which links the cores limit depends on B_cpu: classified
    again with the fitted value."""
    for _ in range(2):
        efficiency, cpu = [], []
        for (hosts, link), arms in measured.items():
            rate = link_rate_Bps(link)
            for name, m in arms.items():
                if not name.startswith("FR ") or not m.comm_per_round_s > 0:
                    continue
                achieved = 2 * (hosts - 1) / hosts * m.round_bytes / m.comm_per_round_s
                if rate is not None and links.efficiency * rate < links.cpu_Bps(hosts):
                    efficiency.append(achieved / rate)
                else:
                    cpu.append(achieved * hosts / links.probe_hosts)
        links = dataclasses.replace(
            links, efficiency=median(efficiency) if efficiency else links.efficiency,
            unlimited_Bps=median(cpu) if cpu else links.unlimited_Bps)
    return links


@dataclasses.dataclass(frozen=True)
class TestbedConstants:
    """The fitted constants (TESTBED_DOC): CPU work in compute steps, so that it carries across
    host counts on shared cores. ``kappa`` is the share of a background round's CPU work that
    training pays (0: a core to spare; 1: all of it); ``queued`` (q) the exchanges of a step
    that wait behind a round's bytes in a link's queue."""

    rho: float
    delta: float
    kappa: float
    stretch: float = 0.0  # lam
    queued: float = 0.0  # q
    per_chunk: float = 0.0  # phi
    stretch_niced: float = 0.0  # lam_n: lam for a thread with sync.transport.thread_nice > 0
    wait_niced: float = 0.0  # mu_n: a niced round's wait for the cores outside its allreduce
    kappa_niced: float = 0.0  # kappa_n: kappa for a niced thread


@dataclasses.dataclass(frozen=True)
class TestbedPrediction:
    ratio: float
    gap: float  # as measured over the run's steps; NaN for none and ddp
    step_s: float
    round_cost_s: float  # what one round costs training (FR: r + A; shadow: C); NaN otherwise
    allreduce_s: float  # one round's allreduce (shadow: in the background); NaN for none
    steady_gap: float  # shadow: steps between rounds once the pacer has settled

    def ratio_at_gap(self, job: TestbedJob, gap: float) -> float:
        """The ratio the cost model gives if rounds came every ``gap`` steps."""
        if math.isnan(self.round_cost_s) or not gap > 0:
            return math.nan
        return job.step_s / (job.step_s + self.round_cost_s / gap)


def fr_rounds(steps: int, period: int) -> int:
    """Rounds of a fixed-rate run: after steps 1, k+1, 2k+1, ... (``FixedRateSyncRunner``)."""
    return (steps - 1) // period + 1


def shadow_gap(duration: float, step: float) -> float:
    """Mean steps between applied deltas when rounds of ``duration`` s go back to back.

    A delta waits for the next step boundary after its round ends, and the next round starts
    there. Step and round times jitter (shared cores), so a round ends at a uniformly random
    phase of a step and waits half a step on average: ``R/T + 1/2``, at least one step (one
    round per boundary at most).
    """
    return max(1.0, duration / step + 0.5)


def _back_to_back(t0: float, cpu_cost: float, queue_cost: float, background_s: float,
                  duration: float, staleness: int | None = None) -> tuple[float, float]:
    """(T, g) solving T = T0 + cpu_cost / g + queue_cost * min(1, Ab / (g T)), with
    g = shadow_gap(R, T) capped at ``staleness`` (K), by bisection on
    [T0, T0 + cpu_cost + queue_cost]: the difference is <= 0 at T0 and >= 0 at the top
    (g >= 1, the share <= 1), so a root lies between. Where the cap binds, the step K after a
    round's snapshot waits for it: K steps last at least R, T >= R / K."""

    def gap(step: float) -> float:
        g = shadow_gap(duration, step)
        return g if staleness is None else min(g, staleness)

    def excess(step: float) -> float:
        g = gap(step)
        return step - t0 - cpu_cost / g - queue_cost * min(1.0, background_s / (g * step))

    lo, hi = t0, t0 + cpu_cost + queue_cost
    if hi > lo:
        for _ in range(60):  # to 2^-60 of the interval
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    step = (lo + hi) / 2
    g = gap(step)
    return (step if staleness is None else max(step, duration / staleness)), g


def shadow_rounds(steps: int, first_gap: float, gap: float) -> int:
    """Rounds a shadow run of ``steps`` steps completes: the first starts at step 1, the second
    ``first_gap`` steps later, then one every ``gap`` steps until training ends, and stop()
    runs one more (its stop flag rides in a round's buffer)."""
    started, second = 1, 1 + first_gap
    if second < steps:
        started += math.ceil((steps - second) / gap)
    return started + 1


def chunks(arm: TestbedArm, nbytes: float) -> int:
    """How many collectives one round's allreduce of ``nbytes`` takes."""
    return 1 if arm.chunk_bytes is None else max(1, math.ceil(nbytes / arm.chunk_bytes))


def background_s(job: TestbedJob, arm: TestbedArm, size: float, lam: float, phi: float
                  ) -> float:
    """Ab: a round's allreduce of ``size`` bytes in the background, sharing the link with the
    all-to-alls and waiting ``lam`` (and ``phi`` per collective) compute steps for the cores."""
    return (job.allreduce_of(size) * (1 + job.a2a_s / job.step_s)
            + (lam + phi * chunks(arm, size)) * job.compute_s)


def predict_testbed(arm: TestbedArm, job: TestbedJob, k: TestbedConstants) -> TestbedPrediction:
    """The model's ratio to ``none`` and sync gap of ``arm`` in ``job`` (TESTBED_DOC)."""
    t0, tc = job.step_s, job.compute_s
    size = job.round_bytes * arm.wire_factor
    a = job.allreduce_of(size)
    r = k.rho * tc
    nan = math.nan
    if arm.kind == "none":
        return TestbedPrediction(1.0, nan, t0, nan, nan, nan)
    if arm.kind == "ddp":
        a = job.allreduce_s  # float32 gradients
        step = t0 + k.delta * tc + a
        return TestbedPrediction(t0 / step, nan, step, nan, a, nan)
    if arm.kind == "fixed_rate":
        assert arm.period is not None
        m = fr_rounds(job.steps, arm.period)
        step = t0 + m / job.steps * (r + a)
        gap = arm.period if job.interleaved else (1 + (m - 1) * arm.period) / m
        return TestbedPrediction(t0 / step, gap, step, r + a, a, gap)
    n_chunks = chunks(arm, size)
    kappa, stretch, wait = ((k.kappa_niced, k.stretch_niced, k.wait_niced) if arm.thread_nice
                            else (k.kappa, k.stretch, 0.0))
    background = background_s(job, arm, size, stretch, k.per_chunk)
    queue = 0.0 if arm.low_class else job.queue_s(size / n_chunks)
    cpu = r + job.transfer_cpu_of(size) + k.per_chunk * n_chunks * tc
    duration = r + background / arm.max_comm_share + wait * tc
    step, gap = _back_to_back(t0, kappa * cpu, k.queued * queue, background, duration,
                              arm.max_staleness)
    cost = gap * (step - t0)
    steady, first = gap, gap
    s = arm.max_slowdown
    if s is not None:
        first = gap + PACER_FIRST_QUIET_STEPS
        if cost / (gap * t0) > s:
            step, steady = t0 * (1 + s), cost / (s * t0)
    measured_gap = (steady if job.interleaved
                    else job.steps / shadow_rounds(job.steps, first, steady))
    return TestbedPrediction(t0 / step, measured_gap, step, cost, background, steady)
