"""The life of an operation, as a table (h11's ``_state.py``): its kinds, its states, and
the only moves between them.

How it works
------------
Rule 1 (forward only).  An op is ``QUEUED`` on its stream, ``POSTED`` (its descriptor is
in a matcher or on its way: it can still be withdrawn), ``ACTIVE`` (matched: its data is
moving and it can no longer be withdrawn), and ends ``DONE`` (finished, with a result or an
error) or ``CANCELLED`` (withdrawn before it matched).  Nothing leaves an end state.
Rule 2 (shortcuts).  An op may finish as it is posted (``QUEUED -> DONE``: an eager send,
a recv whose message was waiting) or be refused or withdrawn before it is posted
(``QUEUED -> DONE``/``CANCELLED``), and a posted op may fail or be withdrawn
(``POSTED -> DONE``/``CANCELLED``).
Rule 3 (one guard).  Every change of state goes through ``check``, which raises
``InvalidTransition`` for a move the table does not allow.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["ACTIVE", "CANCELLED", "DONE", "NEXT", "POSTED", "QUEUED", "InvalidTransition",
           "Kind", "State", "check"]


class Kind(enum.Enum):
    """What an operation does."""

    SEND = "send"
    RECV = "recv"
    PROBE = "probe"
    COMPUTE = "compute"


class State(enum.IntEnum):
    """Where an operation is in its life (ordered: an op only moves forward)."""

    QUEUED = 0
    POSTED = 1
    ACTIVE = 2
    DONE = 3
    CANCELLED = 4


QUEUED: Final = State.QUEUED
POSTED: Final = State.POSTED
ACTIVE: Final = State.ACTIVE
DONE: Final = State.DONE
CANCELLED: Final = State.CANCELLED

#: The states each state may move to.
NEXT: Final[tuple[frozenset[State], ...]] = (
    frozenset({POSTED, DONE, CANCELLED}),  # QUEUED
    frozenset({ACTIVE, DONE, CANCELLED}),  # POSTED
    frozenset({DONE}),  # ACTIVE
    frozenset(),  # DONE
    frozenset(),  # CANCELLED
)


class InvalidTransition(RuntimeError):
    """An operation was moved between states the table does not join: a bug in asynccomm,
    not in the program using it."""


def check(old: State, new: State) -> None:
    """Raise ``InvalidTransition`` unless ``old -> new`` is in the table."""
    if new not in NEXT[old]:
        raise InvalidTransition(f"an operation cannot go from {old.name} to {new.name}")
