"""A state machine: an enum of states and the one table of the events each state allows.

Every layer of the synchronizer that has states keeps them in one of these: the wrapper's
phases (:mod:`.wrapper`), a runner's lifecycle (:mod:`.lifecycle`), the hand-off between its
two threads (:mod:`.handoff`) and the wire its rounds travel on (:mod:`.protocol`). Each layer's
docstring shows its table; :func:`documented` reads such a table back, so a test holds the
docstring to the code.

The state is read and moved under a lock of its own, so any thread may read it.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

__all__ = ["Machine", "documented", "rows"]

S = TypeVar("S", bound=enum.Enum)


class Machine(Generic[S]):
    """The state of one object, moved only along ``table``.

    Args:
        table: ``(state, event) -> next state``; an event a state does not list is refused.
        start: the first state.
        refused: the message of the ``RuntimeError`` a refused event raises, from the state
            and the event (default: both, and the events the state allows).
    """

    def __init__(self, table: Mapping[tuple[S, str], S], start: S,
                 refused: Callable[[S, str], str] | None = None) -> None:
        self.table = table
        self._state = start
        self._refused = refused or (lambda state, event: (
            f"{event} in state {state.name} (allowed: {self.events(state)})"))
        self._lock = threading.Lock()

    @property
    def state(self) -> S:
        with self._lock:
            return self._state

    def events(self, state: S) -> list[str]:
        """The events ``state`` allows, sorted."""
        return sorted(e for s, e in self.table if s is state)

    def states(self, event: str) -> list[S]:
        """The states that allow ``event``, in the enum's order."""
        return [s for s in type(self._state) if (s, event) in self.table]

    def allows(self, event: str) -> bool:
        with self._lock:
            return (self._state, event) in self.table

    def check(self, event: str) -> None:
        """Raises ``RuntimeError`` (the ``refused`` message) if the state does not allow
        ``event``; moves nothing."""
        state = self.state
        if (state, event) not in self.table:
            raise RuntimeError(self._refused(state, event))

    def move(self, event: str) -> S:
        """Moves to the state ``event`` leads to and returns the state it left; refused
        events raise as :meth:`check` does."""
        with self._lock:
            left = self._state
            if (left, event) in self.table:
                self._state = self.table[(left, event)]
                return left
        raise RuntimeError(self._refused(left, event))


def rows(table: Mapping[tuple[S, str], S]) -> set[tuple[str, str, str]]:
    """``table`` as ``(state name, event, next state name)`` rows."""
    return {(s.name, e, n.name) for (s, e), n in table.items()}


_CODE = re.compile(r"``([^`]+)``")


def documented(doc: str, states: type[enum.Enum]) -> set[tuple[str, str, str]]:
    """The rows of the first reStructuredText table in ``doc`` whose first column holds
    state names, as :func:`rows` gives them.

    A row's first column is a state, ``A / B`` several or ``any`` all of ``states``; its
    second the events, each as inline code (two back quotes either side), several separated
    by ``/``; its third starts with the next state's name (the rest of the cell is
    explanation). A line whose first column is blank continues the row above.
    """
    names = [s.name for s in states]
    lines = doc.expandtabs().splitlines()
    out: set[tuple[str, str, str]] = set()
    for i, line in enumerate(lines):
        if not re.fullmatch(r"\s*=+(\s+=+){2,}\s*", line):
            continue
        bounds = [m.span() for m in re.finditer(r"=+", line)]
        cells: list[list[str]] = []
        for body in lines[i + 1:]:
            if re.fullmatch(r"\s*=+(\s+=+){2,}\s*", body):
                if cells and cells[0][0].split(" / ")[0] in names + ["any"]:
                    break  # the table's end
                cells = []  # the header's rule: the rows follow
                continue
            if not body.strip():
                break
            parts = [body[a:(bounds[k + 1][0] if k + 1 < len(bounds) else None)].strip()
                     for k, (a, _) in enumerate(bounds)]
            if parts[0]:
                cells.append(parts)
            elif cells:
                cells[-1] = [f"{old} {new}".strip() for old, new in zip(cells[-1], parts,
                                                                        strict=True)]
        for state, events, after in ((c[0], c[1], c[2]) for c in cells):
            targets = names if state == "any" else state.split(" / ")
            if not all(t in names for t in targets):
                continue
            next_state = re.split(r"[^A-Z_]", after, maxsplit=1)[0]
            for t in targets:
                out.update((t, e, next_state) for e in _CODE.findall(events))
        if out:
            return out
    return out
