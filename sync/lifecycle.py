"""A runner's lifecycle: an explicit state and the one table of the calls each state allows.

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

__all__ = ["FIXED_RATE", "SHADOW", "Lifecycle", "State"]


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


class Lifecycle:
    """The state of one runner, moved only along ``table``."""

    def __init__(self, table: dict[tuple[State, str], State]) -> None:
        self.table = table
        self.state = State.NEW

    def allows(self, call: str) -> bool:
        return (self.state, call) in self.table

    def move(self, call: str) -> State:
        """Moves to the state ``call`` leads to; ``RuntimeError`` if the state does not allow
        it. Returns the state it left."""
        left = self.state
        if (left, call) not in self.table:
            allowed = sorted(c for s, c in self.table if s is left)
            hint = {
                State.NEW: "; call start() first",
                State.RUNNING: ("; the sync thread is running, so the state would not be "
                                "consistent across ranks: stop(final_sync=False), checkpoint or "
                                "restore, start()"),
                State.STOPPED: "; call start() first",
            }.get(left, "")
            raise RuntimeError(f"{call}() on a runner that is {left.value} "
                               f"(allowed: {allowed}){hint}")
        self.state = self.table[(left, call)]
        return left
