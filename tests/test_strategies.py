"""Strategies against independent float64 references of their equations.

The strategies are pure, so several ranks are simulated in one process: the allreduce is the sum
of every rank's ``reduce_input``. Between rounds the replicas drift (local training), and they
also drift between snapshot and apply (ShadowSync's in-flight round), which is what the delta
semantics must preserve. The references are plain Python loops over floats, written from the
papers' equations rather than from the implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor

from shadowsync.sync.strategies import (
    BlockwiseModelUpdateFiltering,
    ElasticAveraging,
    ModelAveraging,
    SyncStrategy,
)

WORLD = 2
NUMEL = 9
ROUNDS = 6

Vec = list[float]


@dataclass
class Drift:
    """Pre-drawn local progress: before each snapshot and between snapshot and apply."""

    before: list[list[Tensor]]  # [round][rank]
    in_flight: list[list[Tensor]]
    init: Tensor = field(default_factory=lambda: torch.empty(0))


def make_drift(rounds: int, seed: int = 0, still: int = 0) -> Drift:
    """Random drift for ``rounds`` rounds, of which the last ``still`` have none."""
    g = torch.Generator().manual_seed(seed)

    def draw() -> list[list[Tensor]]:
        return [[torch.randn(NUMEL, generator=g, dtype=torch.float64) * (0.1 * (r < rounds - still))
                 for _ in range(WORLD)] for r in range(rounds)]

    return Drift(before=draw(), in_flight=draw(),
                 init=torch.randn(NUMEL, generator=g, dtype=torch.float64))


def sum_over_ranks(inputs: list[Tensor]) -> Tensor:
    """The simulated SUM-allreduce."""
    return torch.stack(inputs).sum(0)


def assert_matches(actual: Tensor, expected: Vec, tol: float) -> None:
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64),
                               rtol=tol, atol=tol)


def simulate(strategies: list[SyncStrategy], replicas: list[Tensor], drift: Drift,
             rounds: range) -> None:
    """Run ``rounds`` rounds in place on ``replicas`` (one strategy per simulated rank)."""
    for r in rounds:
        for x, d in zip(replicas, drift.before[r], strict=True):
            x += d.to(x.dtype)
        snapshots = [x.clone() for x in replicas]
        reduced = sum_over_ranks([s.reduce_input(x) for s, x in zip(strategies, snapshots,
                                                                     strict=True)])
        for x, d in zip(replicas, drift.in_flight[r], strict=True):
            x += d.to(x.dtype)
        for s, x, snap in zip(strategies, replicas, snapshots, strict=True):
            x += s.delta(snap, reduced.clone())


def start(make: Callable[[], SyncStrategy], dtype: torch.dtype, drift: Drift
          ) -> tuple[list[SyncStrategy], list[Tensor]]:
    strategies = [make() for _ in range(WORLD)]
    replicas = [drift.init.to(dtype).clone() for _ in range(WORLD)]
    for s, x in zip(strategies, replicas, strict=True):
        s.init(x, WORLD)
    return strategies, replicas


# ----------------------------------------------------------------------------- references
def mean_of(snaps: list[Vec]) -> Vec:
    return [sum(s[i] for s in snaps) / len(snaps) for i in range(NUMEL)]


def exact(v: float) -> float:
    return v


def rounding_to(wire: torch.dtype) -> Callable[[float], float]:
    """Round a float64 value to ``wire`` (what crosses the network), as a float again."""
    return lambda v: torch.tensor(v, dtype=torch.float64).to(wire).item()


def reference(drift: Drift, rounds: int, algo: str, q: Callable[[float], float] = exact,
              **hp: float) -> tuple[list[Vec], dict]:
    """Float64 loops of MA / EASGD / BMUF with delta semantics; returns replicas and state.

    ``q`` rounds what is sent and what the SUM-allreduce returns (the wire dtype); with it, MA
    sends differences to a reference ``ref`` (its previous target), the others their own
    differences (EASGD's ``alpha (x - c)``, BMUF's ``g - x``)."""
    init = drift.init.tolist()
    xs = [list(init) for _ in range(WORLD)]
    state: dict[str, Vec] = {"c": list(init), "g": list(init), "m": [0.0] * NUMEL,
                             "ref": list(init)}

    def wire_sum(sent: list[Vec]) -> Vec:
        return [q(sum(v[i] for v in sent)) for i in range(NUMEL)]

    for r in range(rounds):
        for k in range(WORLD):
            xs[k] = [a + b for a, b in zip(xs[k], drift.before[r][k].tolist(), strict=True)]
        snaps = [list(x) for x in xs]
        for k in range(WORLD):
            xs[k] = [a + b for a, b in zip(xs[k], drift.in_flight[r][k].tolist(), strict=True)]
        if algo == "ma" and q is not exact:
            ref = state["ref"]
            total = wire_sum([[q(s[i] - ref[i]) for i in range(NUMEL)] for s in snaps])
            state["ref"] = ref = [ref[i] + total[i] / WORLD for i in range(NUMEL)]
            deltas = [[ref[i] - s[i] for i in range(NUMEL)] for s in snaps]
        elif algo == "ma":
            mean = mean_of(snaps)
            deltas = [[mean[i] - s[i] for i in range(NUMEL)] for s in snaps]
        elif algo == "easgd":
            c = state["c"]
            d = [[q(hp["alpha"] * (s[i] - c[i])) for i in range(NUMEL)] for s in snaps]
            total = wire_sum(d)
            state["c"] = [c[i] + total[i] for i in range(NUMEL)]
            deltas = [[-v for v in dk] for dk in d]
        else:
            bm, lr = hp["block_momentum"], hp["block_lr"]
            g, m = state["g"], state["m"]
            total = wire_sum([[q(g[i] - s[i]) for i in range(NUMEL)] for s in snaps])
            m = [bm * m[i] + lr * total[i] / WORLD for i in range(NUMEL)]
            g = [g[i] - m[i] for i in range(NUMEL)]
            if hp.get("nesterov"):
                g = [g[i] - bm * m[i] for i in range(NUMEL)]
            state["g"], state["m"] = g, m
            deltas = [[g[i] - s[i] for i in range(NUMEL)] for s in snaps]
        for k in range(WORLD):
            xs[k] = [xs[k][i] + deltas[k][i] for i in range(NUMEL)]
    return xs, state


CASES: dict[str, tuple[Callable[[], SyncStrategy], str, dict[str, float]]] = {
    "ma": (ModelAveraging, "ma", {}),
    "easgd": (lambda: ElasticAveraging(alpha=0.3), "easgd", {"alpha": 0.3}),
    "bmuf": (BlockwiseModelUpdateFiltering, "bmuf",
             {"block_momentum": 1 - 1 / WORLD, "block_lr": 1.0}),
    "bmuf_nesterov": (lambda: BlockwiseModelUpdateFiltering(0.7, block_lr=0.8, nesterov=True),
                      "bmuf", {"block_momentum": 0.7, "block_lr": 0.8, "nesterov": 1.0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_matches_float64_reference(case: str, dtype: torch.dtype, tol: float) -> None:
    make, algo, hp = CASES[case]
    drift = make_drift(ROUNDS)
    strategies, replicas = start(make, dtype, drift)
    simulate(strategies, replicas, drift, range(ROUNDS))
    ref_xs, ref_state = reference(drift, ROUNDS, algo, **hp)
    for x, ref in zip(replicas, ref_xs, strict=True):
        assert x.dtype == dtype
        assert_matches(x, ref, tol)
    for s in strategies:
        assert s.rounds == ROUNDS
        if isinstance(s, ElasticAveraging):
            assert_matches(s.center, ref_state["c"], tol)
        if isinstance(s, BlockwiseModelUpdateFiltering):
            assert_matches(s.global_model, ref_state["g"], tol)
            assert_matches(s.momentum, ref_state["m"], tol)


WIRE_CASES: dict[str, Callable[[torch.dtype], SyncStrategy]] = {
    "ma": lambda wire: ModelAveraging(wire_dtype=wire),
    "easgd": lambda wire: ElasticAveraging(alpha=0.3, wire_dtype=wire),
    "bmuf": lambda wire: BlockwiseModelUpdateFiltering(wire_dtype=wire),
    "bmuf_nesterov": lambda wire: BlockwiseModelUpdateFiltering(0.7, block_lr=0.8,
                                                                nesterov=True, wire_dtype=wire),
}


def simulate_wire(strategies: list[SyncStrategy], replicas: list[Tensor], drift: Drift,
                  rounds: range, wire: torch.dtype) -> None:
    """:func:`simulate` with the SUM-allreduce done in the wire dtype, as gloo does it."""
    for r in rounds:
        for x, d in zip(replicas, drift.before[r], strict=True):
            x += d.to(x.dtype)
        snapshots = [x.clone() for x in replicas]
        sent = [s.reduce_input(x) for s, x in zip(strategies, snapshots, strict=True)]
        assert all(t.dtype == wire for t in sent)
        reduced = torch.stack(sent).double().sum(0).to(wire)
        for x, d in zip(replicas, drift.in_flight[r], strict=True):
            x += d.to(x.dtype)
        for s, x, snap in zip(strategies, replicas, snapshots, strict=True):
            x += s.delta(snap, reduced.clone())


@pytest.mark.parametrize("case", sorted(WIRE_CASES))
@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16])
def test_wire_dtype_matches_float64_reference(case: str, wire: torch.dtype) -> None:
    """Payloads in a narrow dtype: the equations with rounding exactly where the bytes travel
    (float64 parameters, so rounding on the wire is the only one)."""
    _, algo, hp = CASES[case]
    drift = make_drift(ROUNDS, seed=4)
    strategies, replicas = start(lambda: WIRE_CASES[case](wire), torch.float64, drift)
    simulate_wire(strategies, replicas, drift, range(ROUNDS), wire)
    ref_xs, ref_state = reference(drift, ROUNDS, algo, q=rounding_to(wire), **hp)
    for x, ref in zip(replicas, ref_xs, strict=True):
        assert_matches(x, ref, 1e-12)
    states = [s.state_dict() for s in strategies]
    for key, value in states[0].items():  # references stay bit-identical across ranks
        if isinstance(value, Tensor):
            assert torch.equal(value, states[1][key]), key
    if algo == "ma":
        assert_matches(strategies[0].reference, ref_state["ref"], 1e-12)
    if algo == "easgd":
        assert_matches(strategies[0].center, ref_state["c"], 1e-12)


@pytest.mark.parametrize("case", sorted(WIRE_CASES))
def test_an_int8_wire_takes_float32_differences_to_a_rank_identical_reference(case: str) -> None:
    """On an int8 wire the strategy's math stays in float32: its payload is not rounded (the
    wire quantizes it, :mod:`shadowsync.sync.quantized`) and is a difference to state every
    rank holds, so it is 0 for a replica at that state."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    strategy = WIRE_CASES[case](torch.int8)
    strategy.init(x, 2)
    assert strategy.compressed
    sent = strategy.reduce_input(x.clone())
    assert sent.dtype == torch.float32 and torch.equal(sent, torch.zeros(64))
    moved = x + torch.linspace(-1e-6, 1.0, 64)  # steps no int8 block keeps, before the wire
    unrounded = {"ma": moved - x, "easgd": (moved - x).mul_(0.3), "bmuf": x - moved,
                 "bmuf_nesterov": x - moved}
    assert torch.equal(strategy.reduce_input(moved), unrounded[case])


def test_wire_rounding_does_not_accumulate() -> None:
    """Model averaging in bfloat16 stays within one round's rounding of exact averaging over
    many rounds: each round pulls replicas to the new reference exactly, so an error is never
    carried into the next round's difference."""
    rounds = 60
    drift = make_drift(rounds, seed=5)
    exact_s, exact_x = start(ModelAveraging, torch.float64, drift)
    wire_s, wire_x = start(lambda: ModelAveraging(wire_dtype=torch.bfloat16), torch.float64,
                           drift)
    worst = 0.0
    for r in range(rounds):
        simulate(exact_s, exact_x, drift, range(r, r + 1))
        simulate_wire(wire_s, wire_x, drift, range(r, r + 1), torch.bfloat16)
        worst = max(worst, max((a - b).abs().max().item()
                               for a, b in zip(exact_x, wire_x, strict=True)))
    # |x - ref| is about 0.1 * sqrt(rounds) here; one bfloat16 rounding of it is < 2^-8 of it.
    spread = max((x - wire_s[0].reference).abs().max().item() for x in wire_x)
    assert 0 < worst < 4 * 2**-8 * max(spread, 0.5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_identical_across_ranks_and_round_trips(case: str) -> None:
    """Center / global model / momentum stay bit-identical across ranks, and a state_dict
    saved mid-run and loaded into fresh strategies continues bit-identically."""
    make, _, _ = CASES[case]
    drift = make_drift(ROUNDS, seed=1)
    straight, straight_x = start(make, torch.float32, drift)
    simulate(straight, straight_x, drift, range(ROUNDS))
    first, first_x = start(make, torch.float32, drift)
    simulate(first, first_x, drift, range(ROUNDS // 2))
    saved = [s.state_dict() for s in first]
    resumed, _ = start(make, torch.float32, drift)
    for s, sd in zip(resumed, saved, strict=True):
        s.load_state_dict(sd)
    simulate(resumed, first_x, drift, range(ROUNDS // 2, ROUNDS))
    for a, b in zip(straight_x, first_x, strict=True):
        assert torch.equal(a, b)
    states = [s.state_dict() for s in straight]
    assert states[0].keys() == states[1].keys() == resumed[0].state_dict().keys()
    for key, value in states[0].items():
        if isinstance(value, Tensor):
            assert torch.equal(value, states[1][key]), key
            assert torch.equal(value, resumed[0].state_dict()[key]), key
        else:
            assert value == states[1][key] == resumed[0].state_dict()[key]


@pytest.mark.parametrize("case", sorted(CASES))
def test_consensus_is_identical_everywhere(case: str) -> None:
    make, algo, hp = CASES[case]
    drift = make_drift(ROUNDS + 1, seed=2, still=1)
    strategies, replicas = start(make, torch.float64, drift)
    simulate(strategies, replicas, drift, range(ROUNDS))
    reduced = sum_over_ranks([s.consensus_input(x)
                              for s, x in zip(strategies, replicas, strict=True)])
    finals = [s.consensus(reduced.clone()) for s in strategies]
    assert torch.equal(finals[0], finals[1])
    if algo == "bmuf":
        # BMUF ends on one more of its own rounds, taken on the current replicas (no drift).
        expected = reference(drift, ROUNDS + 1, algo, **hp)[1]["g"]
    else:
        expected = torch.stack(replicas).mean(0).tolist()
    assert_matches(finals[0], expected, 1e-12)
    if algo == "easgd":
        assert torch.equal(strategies[0].center, finals[0])


def test_bmuf_without_momentum_is_model_averaging() -> None:
    drift = make_drift(ROUNDS, seed=3)
    bmuf, bmuf_x = start(lambda: BlockwiseModelUpdateFiltering(0.0), torch.float64, drift)
    ma, ma_x = start(ModelAveraging, torch.float64, drift)
    simulate(bmuf, bmuf_x, drift, range(ROUNDS))
    simulate(ma, ma_x, drift, range(ROUNDS))
    for a, b in zip(bmuf_x, ma_x, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_bmuf_block_momentum_defaults_to_one_minus_one_over_world() -> None:
    s = BlockwiseModelUpdateFiltering()
    s.init(torch.zeros(3), world_size=4)
    assert s.block_momentum == 0.75
    assert BlockwiseModelUpdateFiltering(0.5).block_momentum == 0.0  # resolved only in init


@pytest.mark.parametrize("make,match", [
    (lambda: ElasticAveraging(alpha=0.0), "alpha"),
    (lambda: ElasticAveraging(alpha=1.5), "alpha"),
    (lambda: BlockwiseModelUpdateFiltering(block_momentum=1.0), "block_momentum"),
    (lambda: BlockwiseModelUpdateFiltering(block_lr=0.0), "block_lr"),
    (lambda: ModelAveraging(wire_dtype=torch.int16), "wire_dtype"),
])
def test_rejects_bad_hyperparameters(make: Callable[[], SyncStrategy], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_rejects_bad_inputs() -> None:
    s = ModelAveraging()
    with pytest.raises(RuntimeError, match="init"):
        s.reduce_input(torch.zeros(3))
    with pytest.raises(ValueError, match="1-D"):
        s.init(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="floating"):
        s.init(torch.zeros(3, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="world_size"):
        s.init(torch.zeros(3), 0)
    s.init(torch.zeros(3), 2)
    with pytest.raises(ValueError, match="shape"):
        s.delta(torch.zeros(3), torch.zeros(4))
    # EASGD's center moves by W * alpha of its gap to the mean: past it above 1 (diverges)
    with pytest.raises(ValueError,
                       match=r"beta = replicas \* alpha = 2 .* sync.strategy.alpha <= 0.25"):
        ElasticAveraging(0.5).init(torch.zeros(3), 4)
    e = ElasticAveraging(0.5)
    e.init(torch.zeros(3), 2)  # beta = 1: the center lands on the mean
    with pytest.raises(KeyError, match="center"):
        e.load_state_dict({"rounds": 1})
    with pytest.raises(ValueError, match="shape"):
        e.load_state_dict({"rounds": 1, "center": torch.zeros(4)})
