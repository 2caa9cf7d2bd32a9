"""The shared-memory node's turn in C (``_lane.ShmNode``: poll, peek, spin, arm, disarm over
the ``ShmPath`` of every link) does what ``transports.shm.Node``'s Python methods do.

Two links (ranks 0 and 1, one segment, ``test_shm_path``'s set-up) stand for the links of
one process.  Random states are set up twice, alike (``test_shm_path``'s, and: a message of
a rank to itself waiting, a link stopped or closing, its poll failing); the same sequence
of sends and node steps runs on one through the Python steps (the links' and the node's)
and on the other through the C lane's, and every result, the whole segment (doorbells
included), and what the links were asked (``check_finished``, ``_failed``) are compared.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm._engine import lane as _lane
from asynccomm.transports import shm
from asynccomm.transports._shm_ring import ARMED
from asynccomm.transports.shm import Node

from .test_shm_path import STATES, observe, pair
from .test_shm_path import pytestmark as pytestmark  # the C lane built and configured

LANE: Any = _lane.LANE
OPS = st.lists(st.sampled_from(["send", "send", "poll", "peek", "spin", "arm", "disarm"]),
               min_size=1, max_size=8)
NODE_STATES = st.fixed_dictionaries({
    "link": STATES,
    "local": st.booleans(),  # a message of rank 1 to itself waits
    "stopped": st.sampled_from([False, False, False, True]),
    "closing": st.booleans(),
    "fails": st.sampled_from([False, False, False, True]),  # rank 1's poll raises
    "ops": OPS,
})


def run_node(state: dict[str, Any], native: bool) -> tuple[Any, ...]:
    segment, links, fake = pair(state["link"], native)
    asked: list[tuple[Any, ...]] = []
    for link in links:
        def finished(rank: int = link.rank) -> bool:
            asked.append(("check_finished", rank))
            return False

        def failed(exc: Exception, rank: int = link.rank) -> None:
            asked.append(("failed", rank, repr(exc)))

        link.check_finished = finished  # type: ignore[method-assign]
        link._failed = failed  # type: ignore[method-assign]
    channels = links[1].channels
    if state["local"]:
        channels._local.append(b"to itself")

    def rest() -> bool:  # what the poll does after the rings (its own tests are elsewhere)
        if not channels._local:  # (the C steps call it only then)
            return False
        asked.append(("rest", len(channels._local)))
        if state["fails"]:
            raise ValueError("a record that is not of the wire")
        channels._local.clear()
        return True

    channels._poll_rest = rest  # type: ignore[method-assign]
    channels.stopped = state["stopped"]
    channels.closing = state["closing"]
    node = Node.__new__(Node)  # (the Python steps: only its links)
    node._links = links
    turn = LANE.ShmNode([link.path for link in links], fake) if native else None
    results: list[object] = []
    try:
        for op in state["ops"]:
            if op == "send":
                results.append(links[0].send_now(1, 5, np.ones(1), 8, 1, "<f8"))
            elif turn is not None:
                results.append(turn.spin(shm.BURST, False) if op == "spin"
                               else getattr(turn, op)())
            elif op == "spin":
                results.append(any(node._peek() for _ in range(shm.BURST)))
            else:
                results.append(getattr(node, f"_{op}")())
            results.append(segment.words.load(segment.bell(1)))
        return observe(segment, links, fake, results), asked
    finally:
        for link in links:
            link.channels.close()


@settings(max_examples=80, derandomize=True, database=None, deadline=None)
@given(state=NODE_STATES)
def test_the_c_turn_does_what_the_python_steps_do(state: dict[str, Any]) -> None:
    assert run_node(state, True) == run_node(state, False)


def base_state() -> dict[str, Any]:
    return {"start": 1 << 19, "used": 0, "credit": 1 << 15, "closed": False, "broken": False,
            "dead": False, "queued": 0, "armed": False, "want": False, "sends": []}


def test_arming_finds_a_record_published_before_it_and_stays_awake() -> None:
    """The receiver's half of the armed-doorbell protocol (``test_shm_protocol``'s model):
    arm (the bell), then look at every ring again; a record there means stay awake (the
    bell cleared); none means sleep with the bell armed, for a sender to see."""
    segment, links, fake = pair(base_state(), True)
    turn = LANE.ShmNode([link.path for link in links], fake)
    bell = segment.bell(1)
    try:
        assert turn.arm() is False
        assert segment.words.load(bell) == ARMED
        turn.disarm()
        assert segment.words.load(bell) == 0
        assert links[0].send_now(1, 5, np.ones(1), 8, 1, "<f8") is True
        assert turn.peek() is True and turn.spin(3, True) is True
        assert turn.arm() is True
        assert segment.words.load(bell) == 0
        assert turn.poll() is True and turn.peek() is False
        assert turn.spin(3, True) is False
    finally:
        for link in links:
            link.channels.close()


def test_an_error_that_is_not_an_exception_goes_up() -> None:
    segment, links, fake = pair(base_state(), True)
    turn = LANE.ShmNode([link.path for link in links], fake)

    def interrupted() -> bool:
        raise KeyboardInterrupt

    links[1].channels._local.append(b"x")
    links[1].channels._poll_rest = interrupted  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            turn.poll()
    finally:
        for link in links:
            link.channels.close()


@pytest.mark.parametrize("waiting", ["no", "yes", "woken"])
async def test_a_kick_in_c_does_what_the_python_kick_does(waiting: str) -> None:
    """``kick``: poll now; the poll task, if it waits, is woken (once)."""
    seen = []
    for native in (True, False):
        node = Node(f"test-kick-{native}", 0, 2)
        try:
            if native:
                node.accelerate(LANE)
                assert node.kick.__qualname__ == "ShmNode.kick"
            if waiting != "no":
                node._waiter = asyncio.get_running_loop().create_future()
                if waiting == "woken":
                    node._waiter.set_result(None)
            node.kick()
            node.kick()
            seen.append((node._kicked, node._waiter is None or node._waiter.done()))
        finally:
            node.sock.close()
    assert seen[0] == seen[1] == (True, True)


def test_the_turn_takes_only_the_c_steps_of_links() -> None:
    with pytest.raises(TypeError, match="ShmPath"):
        LANE.ShmNode([object()], None)


async def test_a_node_runs_its_turn_in_c_while_every_link_has_its_steps_in_c() -> None:
    node = Node("test-native-turn", 0, 2)
    node._task = asyncio.get_running_loop().create_future()  # type: ignore[assignment]
    segment, links, _ = pair(base_state(), True)
    others = pair(base_state(), False)[1]
    python = others[0]
    try:
        node.add(links[0])
        assert node._native is None  # (until a link of this node is ``accelerate``d)
        node.accelerate(LANE)
        node.add(others[1])
        node.remove(others[1])
        assert node._native is node._lane_node is not None
        node.add(python)
        assert node._native is None  # a link with Python steps: the Python turn
        node.add(links[1])
        node.remove(python)
        assert node._native is not None and node._paths == [link.path for link in links]
        node.remove(links[0])
        assert node._paths == [links[1].path] and node._native is not None
    finally:
        node._task = None
        node.sock.close()
        for link in (*links, *others):
            link.channels.close()
