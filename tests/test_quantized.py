"""int8 rounds with error feedback (:mod:`shadowsync.sync.quantized`): the blocks' math alone,
then wires on 2, 3 and 4 gloo ranks against float64 references of one round and of 50 rounds
with the residuals carried, a constant signal averaged to float rounding (and not without the
feedback), the control slots, chunks and the sum in two levels."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from shadowsync.sync.clock import MonotonicClock
from shadowsync.sync.errors import PeerAborted
from shadowsync.sync.groups import new_sync_group
from shadowsync.sync.protocol import Control, Layout, Levels, Wire
from shadowsync.sync.quantized import BLOCK, decode, encode, encoded_bytes
from shadowsync.sync.strategies import ModelAveraging
from shadowsync.testing import run_ranks

CPU = torch.device("cpu")
SIZES = (700, 333)  # two payloads, 1033 values: padded to whole blocks of every rank's slice
CHUNK_BYTES = 1100  # 1536 values a wire: chunks of 1024 and 512 on 2 ranks, 768 and 768 on 3


def int8_layout(sizes: tuple[int, ...] = SIZES) -> Layout:
    return Layout(sizes, torch.float32, CPU, int8=True)


# ----------------------------------------------------------------------------- the blocks
def test_a_block_decodes_within_half_its_step_and_non_finite_stays_non_finite() -> None:
    g = torch.Generator().manual_seed(0)
    v = torch.randn(3, 4 * BLOCK, generator=g) * torch.logspace(-6, 2, 4 * BLOCK)
    encoded = encode(v)
    assert encoded.dtype == torch.int8 and encoded.shape == (3, encoded_bytes(4 * BLOCK))
    assert encoded_bytes(4 * BLOCK) == 4 * BLOCK + 4 * 4
    step = v.view(3, 4, BLOCK).abs().amax(2, keepdim=True) / 127
    dropped = (v - decode(encoded)).view(3, 4, BLOCK).abs()
    assert bool((dropped <= step / 2 * (1 + 1e-6)).all())
    assert torch.equal(decode(encode(torch.zeros(1, BLOCK))), torch.zeros(1, BLOCK))
    bad = v.clone()
    bad[0, 5], bad[1, BLOCK + 7] = float("nan"), float("inf")
    out = decode(encode(bad))
    assert not bool(out[0, :BLOCK].isfinite().any()) and not bool(
        out[1, BLOCK:2 * BLOCK].isfinite().any())
    assert torch.equal(out[2], decode(encoded)[2])  # other blocks are as they were
    with pytest.raises(ValueError, match="blocks of 256"):
        encode(torch.zeros(1, BLOCK + 4))


def test_an_int8_wire_carries_float32_payloads_only() -> None:
    with pytest.raises(ValueError, match="float32 payloads, not torch.float64"):
        Layout((4,), torch.float64, CPU, int8=True)


# ----------------------------------------------------------------------------- references
def reference_blocks(v: Tensor) -> tuple[Tensor, float]:
    """``v`` (float64, whole blocks) encoded and decoded in float64, and how near a rounding
    tie its closest value came (in steps)."""
    blocks = v.view(-1, BLOCK)
    step = blocks.abs().amax(1, keepdim=True) / 127
    ratio = torch.where(step > 0, blocks / torch.where(step > 0, step, 1.0), 0.0)
    margin = float(((ratio - ratio.floor()) - 0.5).abs().min())
    return (ratio.round() * step).view(-1), margin


def reference_round(xs: list[Tensor], chunk: int) -> tuple[Tensor, float]:
    """One int8 round from zero residuals, in float64: each rank's payload (a padded buffer)
    encoded, each chunk's slices summed by their owners and encoded again; and the nearest
    tie any encoding came to."""
    world = len(xs)
    sent = [reference_blocks(x) for x in xs]
    total = torch.stack([d for d, _ in sent]).sum(0)
    out = torch.empty_like(total)
    margins = [m for _, m in sent]
    for at in range(0, total.numel(), chunk):
        piece = total[at:at + chunk]
        for j, owned in enumerate(piece.view(world, -1)):
            decoded, margin = reference_blocks(owned.clone())
            out[at + j * owned.numel():at + (j + 1) * owned.numel()] = decoded
            margins.append(margin)
    return out, min(margins)


def buffer_order(owned: list[Tensor], chunk: int) -> Tensor:
    """The owners' residuals (rank j: its slice of each chunk, in turn) in the buffer's order."""
    world, per = len(owned), owned[0].numel()
    out = torch.empty(world * per, dtype=owned[0].dtype)
    for at in range(0, world * per, chunk):
        m = min(chunk, world * per - at) // world
        for j, mine in enumerate(owned):
            out[at + j * m:at + (j + 1) * m] = mine[at // world:at // world + m]
    return out


# ----------------------------------------------------------------------------- on ranks
def payload(rank: int, round_: int, n: int) -> Tensor:
    """A round's payload: mostly small values with a few large ones in each block, so that
    many fall below their block's step and only error feedback sends them."""
    g = torch.Generator().manual_seed(1000 * round_ + rank)
    x = 1e-3 * torch.randn(n, generator=g)
    x[torch.randperm(n, generator=g)[: n // 64]] += torch.randn(n // 64, generator=g)
    return x


def _rounds(rank: int, world_size: int) -> dict[str, Any]:
    """50 rounds of an int8 wire in chunks, each rank's payloads and residuals recorded; an
    abort round after them."""
    group = new_sync_group()
    wire = Wire(int8_layout(), group, CHUNK_BYTES, MonotonicClock())
    assert wire.int8 is not None
    n = sum(SIZES)
    record: dict[str, Any] = {"chunk": wire._chunk_numel, "padded": wire.int8.residual.numel(),
                              "x": [], "out": [], "residual": [], "owned": [], "pause": []}
    for t in range(50):
        x = payload(rank, t, n)
        agreed = wire.allreduce(list(x.split(SIZES)), Control(pause_steps=2.0 * (rank + 1)))
        record["x"].append(x)
        record["out"].append(torch.cat(wire.payloads).clone())
        record["residual"].append(wire.int8.residual.clone())
        record["owned"].append(wire.int8.owned.clone())
        record["pause"].append(agreed.pause_steps)
    record["nbytes"] = agreed.nbytes
    gathered = [torch.empty(n) for _ in range(world_size)]
    dist.all_gather(gathered, record["out"][-1])
    record["identical"] = all(torch.equal(gathered[0], g) for g in gathered)
    try:
        wire.allreduce(None, Control(abort=rank == world_size - 1))
        record["aborted"] = "no abort"
    except PeerAborted as e:
        record["aborted"] = str(e)
    return record


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_int8_rounds_match_a_float64_reference_with_the_residuals_carried(world: int) -> None:
    """One round equals a float64 implementation of the scheme; each of 50 rounds satisfies
    error feedback's equation ``out = sum_k (x_k + r_k - r'_k) + s - s'`` in float64 with
    the residuals the ranks carried, each residual within half its block's step; the ranks
    end each round with the same bits; the control slots are exact, in float32 (the mean
    pause), and an abort flag reaches every peer; the bytes are the encoding's."""
    results = run_ranks(_rounds, world_size=world, timeout_s=120)
    n, chunk, padded = sum(SIZES), results[0]["chunk"], results[0]["padded"]
    assert padded % (world * BLOCK) == 0 and padded - n < world * BLOCK
    assert chunk % (world * BLOCK) == 0 and -(-padded // chunk) >= 2  # several chunks

    def pad(x: Tensor) -> Tensor:
        return torch.cat([x.double(), torch.zeros(padded - n, dtype=torch.float64)])

    want, margin = reference_round([pad(r["x"][0]) for r in results], chunk)
    assert margin > 1e-4, "the data came too near a rounding tie for a float64 reference"
    for r in results:
        torch.testing.assert_close(pad(r["out"][0]), want, rtol=0, atol=1e-6)
    zeros = torch.zeros(padded, dtype=torch.float64)
    r_old, s_old = [zeros] * world, zeros
    for t in range(50):
        r_new = [r["residual"][t].double() for r in results]
        s_new = buffer_order([r["owned"][t].double() for r in results], chunk)
        expected = sum(pad(r["x"][t]) + a - b for r, a, b in zip(results, r_old, r_new,
                                                                  strict=True)) + s_old - s_new
        for r in results:
            assert torch.equal(r["out"][t], results[0]["out"][t]), t
            torch.testing.assert_close(pad(r["out"][t]), expected, rtol=0, atol=2e-6)
        for r, before, after in zip(results, r_old, r_new, strict=True):
            v = (pad(r["x"][t]) + before).view(-1, BLOCK)
            half_step = v.abs().amax(1, keepdim=True) / 254 * (1 + 1e-5) + 1e-12
            assert bool((after.view(-1, BLOCK).abs() <= half_step).all()), t
        assert float(s_new.abs().max()) < 0.05  # half a step of the sums' blocks
        r_old, s_old = r_new, s_new
    assert float(sum(r.abs().max() for r in r_old)) > 0  # the feedback was used
    mean_pause = sum(2.0 * (k + 1) for k in range(world)) / world
    assert all(p == -(-mean_pause // 1) for r in results for p in r["pause"])
    assert all(r["identical"] for r in results)
    assert results[0]["nbytes"] == encoded_bytes(padded) + 4 * (3 + world)
    for rank, r in enumerate(results):
        want_abort = "no abort" if rank == world - 1 else f"rank(s) [{world - 1}] failed"
        assert r["aborted"].startswith(want_abort), r["aborted"]


def _constant(rank: int, world_size: int, feedback: bool) -> list[float]:
    """Identical replicas, each rank's moved once by its own constant signal, then model
    averaged by int8 rounds without training: each round's distance from the true mean."""
    group = new_sync_group()
    n = 4 * BLOCK
    x0 = torch.randn(n, generator=torch.Generator().manual_seed(5))
    signals = [payload(k, 0, n) for k in range(world_size)]
    target = x0.double() + torch.stack(signals).double().mean(0)
    strategy = ModelAveraging(wire_dtype=torch.int8)
    strategy.init(x0, world_size)
    wire = Wire(int8_layout((n,)), group, None, MonotonicClock())
    assert wire.int8 is not None
    x = x0 + signals[rank]
    errors = []
    for _ in range(12):
        if not feedback:
            wire.int8.residual.zero_()
            wire.int8.owned.zero_()
        wire.allreduce([strategy.reduce_input(x)], Control())
        x = x + strategy.delta(x, wire.payloads[0])
        errors.append(float((x.double() - target).abs().max()))
    return errors


@pytest.mark.slow
def test_a_constant_signal_averages_to_float_rounding_only_with_error_feedback() -> None:
    """Replicas moved by constant signals (most values below their block's step) and then
    averaged converge to their mean within float32 rounding in 12 int8 rounds; with the
    residuals dropped after every round they stay a round's rounding away."""
    with_feedback = run_ranks(functools.partial(_constant, feedback=True), world_size=3,
                              timeout_s=90)
    without = run_ranks(functools.partial(_constant, feedback=False), world_size=3,
                        timeout_s=90)
    ulp = torch.finfo(torch.float32).eps * 4  # |x| < 4 here
    for kept, dropped in zip(with_feedback, without, strict=True):
        assert kept[0] == dropped[0] > 100 * ulp  # the first round is the same round
        assert kept[-1] <= 4 * ulp, kept
        assert dropped[-1] > 100 * ulp, dropped


def _levels(rank: int, world_size: int) -> dict[str, Any]:
    """An int8 wire summed in two levels on 2 rows of 2, by both routes, 5 rounds."""
    group = new_sync_group()
    inside = new_sync_group(partition=[[0, 1], [2, 3]])
    across = new_sync_group(partition=[[0, 2], [1, 3]])

    class ByAllreduces(Levels):  # the CUDA route, on CPU
        def scatters(self, chunk: Tensor) -> bool:
            return False

    wires = [Wire(int8_layout(), g, CHUNK_BYTES, MonotonicClock())
             for g in (Levels(group, inside, across), ByAllreduces(group, inside, across))]
    n = sum(SIZES)
    xs, outs = [], []
    for t in range(5):
        x = payload(rank, t, n)
        xs.append(x)
        outs.append([])
        for w in wires:
            w.allreduce(list(x.split(SIZES)), Control(stop=t == 4 and rank == 2))
            outs[-1].append(torch.cat(w.payloads).clone())
    stopped = [w.state.value for w in wires]
    return {"x": xs, "out": outs, "stopped": stopped}


@pytest.mark.slow
def test_int8_rounds_in_two_levels_agree_by_both_routes_with_the_same_bits_everywhere() -> None:
    """The int8 sum across hosts inside the two-level sum: both routes give the same bits on
    every rank and round, within the rounds' quantization of the float64 sum, and a stop
    slot set on one rank stops every wire."""
    results = run_ranks(_levels, world_size=4, timeout_s=120)
    for t in range(5):
        first = results[0]["out"][t][0]
        want = sum(r["x"][t].double() for r in results)
        for r in results:
            assert all(torch.equal(first, o) for o in r["out"][t]), t
        assert float((first.double() - want).abs().max()) < 0.05  # a few half-steps
    assert all(r["stopped"] == ["peers left", "peers left"] for r in results)
