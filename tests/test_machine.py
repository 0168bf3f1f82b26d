"""The state machines of the synchronizer's layers: each docstring's table is the code's table,
and the hand-off and the wire move along theirs (a world of one, in-process)."""

from __future__ import annotations

import enum

import pytest
import torch
import torch.distributed as dist

from shadowsync.sync import handoff, lifecycle, protocol, wrapper
from shadowsync.sync.clock import ManualClock
from shadowsync.sync.errors import CollectiveFailed
from shadowsync.sync.handoff import HandOff, Slot
from shadowsync.sync.machine import Machine, documented, rows
from shadowsync.sync.protocol import (
    Agreement,
    Control,
    Layout,
    Wire,
    WireState,
)
from shadowsync.sync.round import Job, ReplicaSet, Result
from shadowsync.sync.shadow import ShadowOptions, ShadowSyncRunner
from shadowsync.sync.strategies import ModelAveraging


class Light(enum.Enum):
    RED = "red"
    GREEN = "green"


def test_a_machine_moves_along_its_table_and_refuses_the_rest() -> None:
    machine = Machine({(Light.RED, "go"): Light.GREEN, (Light.GREEN, "stop"): Light.RED},
                      Light.RED)
    assert machine.move("go") is Light.RED and machine.state is Light.GREEN
    assert machine.allows("stop") and not machine.allows("go")
    assert machine.states("go") == [Light.RED] and machine.events(Light.GREEN) == ["stop"]
    with pytest.raises(RuntimeError, match=r"go in state GREEN \(allowed: \['stop'\]\)"):
        machine.move("go")
    with pytest.raises(RuntimeError, match="go in state GREEN"):
        machine.check("go")
    assert machine.state is Light.GREEN  # a refused event moves nothing


@pytest.mark.parametrize("where,table,states", [
    (lifecycle.__doc__, lifecycle.FIXED_RATE, lifecycle.State),
    (handoff.__doc__, handoff.HANDOFF, handoff.Slot),
    (protocol.__doc__, protocol.WIRE, protocol.WireState),
    (wrapper.ShadowSyncReplicas.__doc__, wrapper.PHASES, wrapper.Phase),
], ids=["runner lifecycle", "hand-off", "wire", "wrapper phases"])
def test_each_docstring_table_is_the_code_table(
        where: str | None, table: dict[tuple[enum.Enum, str], enum.Enum],
        states: type[enum.Enum]) -> None:
    assert where is not None
    assert documented(where, states) == rows(table)


def test_the_docstring_reader_reads_alternatives_any_and_continued_rows() -> None:
    doc = """
    ======  =======================  ==============
    state   event                    next state
    ======  =======================  ==============
    RED     ``go`` / ``hurry``       GREEN: goes
    GREEN   ``stop``                 RED, after a
                                     long wait
    any     ``reset``                RED
    ======  =======================  ==============
    """
    assert documented(doc, Light) == {("RED", "go", "GREEN"), ("RED", "hurry", "GREEN"),
                                      ("GREEN", "stop", "RED"), ("RED", "reset", "RED"),
                                      ("GREEN", "reset", "RED")}


# ----------------------------------------------------------------------------- the hand-off
def _result(job: Job, stop: bool = False) -> Result:
    agreement = Agreement(stop=stop, pause_steps=0, chunk_s=0.0, comm_s=0.0, paused_s=0.0,
                          fastest_chunk_s=0.0, nbytes=0)
    return Result([torch.zeros(1)], None, job, agreement)


def test_the_hand_off_moves_a_round_through_its_slots() -> None:
    h = HandOff(ManualClock())
    assert h.slot is Slot.IDLE and h.in_flight is None and h.take() is None
    job = Job(1, stop=False, given_at=0.0)
    h.give(job)
    assert h.slot is Slot.GIVEN and h.unanswered() is job and h.in_flight is job
    with pytest.raises(RuntimeError, match="hand-off invariant broken: give in state GIVEN, "
                                           "with the round of step 1 in flight"):
        h.give(Job(2, stop=False, given_at=0.0))
    assert h.next_job() is job and h.slot is Slot.RUNNING
    with pytest.raises(RuntimeError, match="not the job in flight"):
        h.post(_result(Job(1, stop=False, given_at=0.0)))
    h.post(_result(job))
    assert h.slot is Slot.POSTED and h.unanswered() is None and h.in_flight is job
    taken = h.take()
    assert taken is not None and taken.job is job and h.slot is Slot.IDLE
    last = Job(2, stop=True, given_at=0.0)
    h.give(last)
    assert h.next_job() is last
    h.post(_result(last, stop=True))
    assert h.slot is Slot.LAST
    h.take()
    assert h.slot is Slot.DRAINED  # a round agreed to stop: no job is given again
    with pytest.raises(RuntimeError, match="give in state DRAINED"):
        h.give(Job(3, stop=False, given_at=0.0))


def test_a_failure_stays_the_first_and_a_closed_hand_off_lets_the_thread_go() -> None:
    h = HandOff(ManualClock())
    job = Job(1, stop=False, given_at=0.0)
    h.give(job)
    h.next_job()
    first, later = RuntimeError("first"), RuntimeError("later")
    h.fail(first)
    h.fail(later)
    assert h.slot is Slot.FAILED and h.error is first
    h.post(_result(job))  # a stalled round's late result is dropped
    assert h.slot is Slot.FAILED and h.take() is None and h.next_job() is None
    h.close()
    assert h.slot is Slot.CLOSED and h.next_job() is None and h.error is first
    assert h.sleep(5.0) == 0.0  # closed: a pause between chunks ends at once


def test_waiting_for_a_result_ends_at_the_clock_deadline() -> None:
    clock = ManualClock()
    h = HandOff(clock)
    h.give(Job(1, stop=False, given_at=0.0))
    clock.advance(3.0)
    assert h.wait_result(until=2.0) is None and h.slot is Slot.GIVEN


# ----------------------------------------------------------------------------- the wire
def _wire(group: dist.ProcessGroup) -> Wire:
    return Wire(Layout((3, 2), torch.float32, torch.device("cpu")), group, None, ManualClock())


def test_the_wire_carries_every_payload_and_reads_the_control_slots(
        world1: dist.ProcessGroup) -> None:
    wire = _wire(world1)
    agreement = wire.allreduce([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])],
                               Control(pause_steps=2.5))
    assert [p.tolist() for p in wire.payloads] == [[1.0, 2.0, 3.0], [4.0, 5.0]]
    assert (agreement.stop, agreement.pause_steps) == (False, 3)
    assert agreement.nbytes == (5 + 3 + 1) * 4  # the payloads, 3 slots, 1 abort flag
    assert wire.state is WireState.OPEN
    wire.allreduce(None, Control(stop=True))
    assert wire.state is WireState.PEERS_LEFT
    with pytest.raises(RuntimeError, match="send in state PEERS_LEFT"):
        wire.allreduce(None, Control())  # peers left: nothing more is sent until reopened
    wire.reopen()
    wire.allreduce(None, Control(abort=True))
    assert wire.state is WireState.ABORTED


def test_a_collective_that_raises_breaks_the_wire(world1: dist.ProcessGroup,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    wire = _wire(world1)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("connection closed by peer")

    monkeypatch.setattr(dist, "all_reduce", broken)
    with pytest.raises(CollectiveFailed, match="connection closed by peer"):
        wire.allreduce(None, Control())
    assert wire.state is WireState.BROKEN


def test_a_restarted_runner_reopens_its_wire(world1: dist.ProcessGroup) -> None:
    """A stop round leaves the wire PEERS_LEFT; the next start opens it again, so a round that
    fails before its collective still sends its abort flag (before, a flag set by the stop
    round stayed set until the next round's allreduce, and such a failure told no peer)."""
    runner = ShadowSyncRunner(ReplicaSet([torch.zeros(3)], ModelAveraging()), world1,
                              ShadowOptions(max_staleness=1))
    runner.start()
    runner.step()
    runner.stop(final_sync=False)
    assert runner._round.wire.state is WireState.PEERS_LEFT
    runner.start()
    assert runner._round.wire.state is WireState.OPEN
    runner.stop(final_sync=False)
