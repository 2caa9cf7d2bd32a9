"""The armed doorbell of the shared-memory link loses no wake-up: every interleaving of the
atomic steps of two senders and one receiver, in a model of the protocol
(``transports/_shm_ring.py``), explored exhaustively.

The model's steps are the code's, each one atomic access (all sequentially consistent):

- a sender (``Channels.send`` then ``Channels.ring``): store its ring's ``tail``; load the
  receiver's bell word; if ``ARMED``, CAS it to 0, and if that won, send one datagram;
- the receiver (``Node._run``): poll each ring (load its ``tail``, consume); arm (CAS 0 ->
  ``ARMED``, ``Channels.arm``); load each ``tail`` again; if one has a record, disarm and
  poll; else sleep until a datagram comes, read them all, disarm, and poll.

A lost wake-up is a state where the receiver sleeps with no datagram on its way and every
sender is done, yet a record waits.  Two broken variants (the receiver does not look again
after arming; a sender looks at the bell before publishing) must be caught, so the test
can fail.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass, replace

SENDERS = 2


@dataclass(frozen=True)
class State:
    tails: tuple[int, ...] = (0,) * SENDERS  # records published, per sender's ring
    heads: tuple[int, ...] = (0,) * SENDERS  # records consumed
    bell: int = 0  # ARMED or not
    datagrams: int = 0  # sent, not read yet
    senders: tuple[int, ...] = (0,) * SENDERS  # each sender's next step
    seen: tuple[int, ...] = (0,) * SENDERS  # what each sender loaded from the bell
    receiver: str = "poll0"
    found: bool = False  # the receiver's look after arming found a record


@dataclass(frozen=True)
class Variant:
    look_again: bool = True  # the receiver loads the tails again after arming
    publish_first: bool = True  # a sender stores its tail before it loads the bell


def _set(t: tuple[int, ...], i: int, v: int) -> tuple[int, ...]:
    return (*t[:i], v, *t[i + 1:])


def sender_step(s: State, i: int, v: Variant) -> State | None:
    """Sender ``i``'s next atomic step (None: it is done)."""
    pc = s.senders[i]
    order = ["publish", "load", "cas", "datagram"] if v.publish_first else \
        ["load", "publish", "cas", "datagram"]
    if pc >= len(order):
        return None
    step, nxt = order[pc], _set(s.senders, i, pc + 1)
    if step == "publish":
        return replace(s, tails=_set(s.tails, i, 1), senders=nxt)
    if step == "load":
        return replace(s, seen=_set(s.seen, i, s.bell), senders=nxt)
    if step == "cas":
        if not s.seen[i]:
            return replace(s, senders=_set(s.senders, i, 99))  # not armed: done
        if s.bell:  # CAS ARMED -> 0 won: this sender sends the datagram
            return replace(s, bell=0, senders=nxt)
        return replace(s, senders=_set(s.senders, i, 99))  # another sender won
    return replace(s, datagrams=s.datagrams + 1, senders=_set(s.senders, i, 99))


def receiver_step(s: State, v: Variant) -> State | None:
    """The receiver's next atomic step (None: it sleeps and nothing can wake it)."""
    pc = s.receiver
    if pc.startswith("poll"):
        i = int(pc[4:])
        heads = _set(s.heads, i, s.tails[i])  # load the tail, consume up to it
        nxt = f"poll{i + 1}" if i + 1 < SENDERS else "arm"
        return replace(s, heads=heads, receiver=nxt)
    if pc == "arm":
        bell = 1 if s.bell == 0 else s.bell  # CAS 0 -> ARMED
        return replace(s, bell=bell, found=False,
                       receiver="look0" if v.look_again else "sleep")
    if pc.startswith("look"):
        i = int(pc[4:])
        found = s.found or s.tails[i] != s.heads[i]
        nxt = f"look{i + 1}" if i + 1 < SENDERS else ("disarm" if found else "sleep")
        return replace(s, found=found, receiver=nxt)
    if pc == "sleep":
        if not s.datagrams:
            return None
        return replace(s, datagrams=0, receiver="disarm")  # woken: read them all
    assert pc == "disarm"
    return replace(s, bell=0, receiver="poll0")


def lost_wakeup(s: State) -> bool:
    return (s.receiver == "sleep" and not s.datagrams and all(p == 99 for p in s.senders)
            and s.tails != s.heads)


def explore(v: Variant) -> tuple[int, list[State] | None]:
    """Every state reachable by any interleaving (depth first, each state once): how
    many there are, and the steps to a lost wake-up if there is one."""
    start = State()
    parents: dict[State, State | None] = {start: None}
    stack = [start]
    while stack:
        s = stack.pop()
        if lost_wakeup(s):
            path = [s]
            while (p := parents[path[-1]]) is not None:
                path.append(p)
            return len(parents), path[::-1]
        nexts = [sender_step(s, i, v) for i in range(SENDERS)] + [receiver_step(s, v)]
        for n in nexts:
            if n is not None and n not in parents:
                parents[n] = s
                stack.append(n)
    return len(parents), None


def test_no_interleaving_loses_a_wakeup() -> None:
    states, lost = explore(Variant())
    assert lost is None, "\n".join(map(str, lost or []))
    assert states > 200  # the exploration did interleave the three


def test_the_explorer_catches_a_receiver_that_does_not_look_again_after_arming() -> None:
    _, lost = explore(Variant(look_again=False))
    assert lost is not None and lost_wakeup(lost[-1])


def test_the_explorer_catches_a_sender_that_looks_at_the_bell_before_publishing() -> None:
    _, lost = explore(Variant(publish_first=False))
    assert lost is not None and lost_wakeup(lost[-1])


def test_an_error_of_its_own_goes_up_as_itself_without_mpi4py() -> None:
    """The shared-memory link runs the MPI link's handlers, which translate MPI's errors:
    without mpi4py imported, an error of its own must still go up as itself (not as an
    AttributeError of the missing MPI module)."""
    program = textwrap.dedent("""
        import sys, types
        from asynccomm.transports.shm import ShmTransport
        assert "mpi4py" not in sys.modules
        link = object.__new__(ShmTransport)
        link.rank, link._broken = 0, None
        link.wire = types.SimpleNamespace(closed_by=set(), ask_dump=lambda: b"?")
        def fail(dest, raw):
            raise RuntimeError("the ring is gone")
        link._send = fail
        try:
            link.ask_dump(1)
        except RuntimeError as exc:
            print("RuntimeError", exc)
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.stdout.strip() == "RuntimeError the ring is gone", out.stderr[-2000:]
