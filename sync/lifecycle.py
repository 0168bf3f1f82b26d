"""A runner's lifecycle: its states and the one table of the calls each state allows.

==========  ======================================  =========================================
state       call                                    next state
==========  ======================================  =========================================
NEW         ``start``                               RUNNING
NEW         ``state_dict`` / ``load_state_dict``    NEW
RUNNING     ``step``                                RUNNING
RUNNING     ``stop``                                STOPPED
RUNNING     ``state_dict`` / ``load_state_dict``    RUNNING (fixed rate only: no thread)
RUNNING     ``fail`` (a failure is recorded)        FAILED
STOPPED     ``start``                               RUNNING
STOPPED     ``state_dict`` / ``load_state_dict``    STOPPED
STOPPED     ``consensus``                           STOPPED
STOPPED     ``fail``                                FAILED
FAILED      ``step`` / ``stop`` / ``consensus``     FAILED (each raises the recorded failure)
any         ``abandon``                             ABANDONED
==========  ======================================  =========================================

Any other call raises ``RuntimeError`` naming the state, the call and what the state allows.
Only the training thread moves the state; the sync thread records a failure in the hand-off,
and the next call on the training thread turns it into FAILED.
"""

from __future__ import annotations

import enum

from shadowsync.sync.machine import Machine

__all__ = ["FIXED_RATE", "SHADOW", "State", "lifecycle"]


class State(enum.Enum):
    NEW = "new"  # built, never started
    RUNNING = "running"  # synchronizing
    STOPPED = "stopped"  # stopped on every rank after the same round; may start again
    FAILED = "failed"  # this rank's synchronization failed (or a peer told it so)
    ABANDONED = "abandoned"  # dropped without a collective; nothing more may be called


_S = State
SHADOW: dict[tuple[State, str], State] = {
    (_S.NEW, "start"): _S.RUNNING,
    (_S.NEW, "state_dict"): _S.NEW,
    (_S.NEW, "load_state_dict"): _S.NEW,
    (_S.RUNNING, "step"): _S.RUNNING,
    (_S.RUNNING, "stop"): _S.STOPPED,
    (_S.RUNNING, "fail"): _S.FAILED,
    (_S.STOPPED, "start"): _S.RUNNING,
    (_S.STOPPED, "state_dict"): _S.STOPPED,
    (_S.STOPPED, "load_state_dict"): _S.STOPPED,
    (_S.STOPPED, "consensus"): _S.STOPPED,
    (_S.STOPPED, "fail"): _S.FAILED,
    (_S.FAILED, "step"): _S.FAILED,
    (_S.FAILED, "stop"): _S.FAILED,
    (_S.FAILED, "consensus"): _S.FAILED,
    **{(s, "abandon"): _S.ABANDONED for s in State},
}
FIXED_RATE: dict[tuple[State, str], State] = {
    **SHADOW,
    (_S.RUNNING, "state_dict"): _S.RUNNING,
    (_S.RUNNING, "load_state_dict"): _S.RUNNING,
}

_HINTS = {
    State.NEW: "; call start() first",
    State.RUNNING: ("; the sync thread is running, so the state would not be consistent across "
                    "ranks: stop(final_sync=False), checkpoint or restore, start()"),
    State.STOPPED: "; call start() first",
}


def lifecycle(table: dict[tuple[State, str], State]) -> Machine[State]:
    """A runner's lifecycle along ``table``, from NEW; a refused call raises ``RuntimeError``
    naming the state, the call and what the state allows."""

    def refused(state: State, call: str) -> str:
        allowed = sorted(c for s, c in table if s is state)
        return (f"{call}() on a runner that is {state.value} (allowed: {allowed})"
                f"{_HINTS.get(state, '')}")

    return Machine(table, State.NEW, refused)
