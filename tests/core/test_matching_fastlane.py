"""The fast lane's questions to the matcher give the full rules' answers.

The engine's fast lane asks ``claim_posted`` what an arriving message meets and
``waiting`` what a new recv would take, and falls back to ``deliver`` / ``post_recv`` when
told to (False, or a misfit).  Random programs of recvs (exact and wildcard, some too small
or of another dtype) and arrivals run on two matchers: one the fast lane's way, one only
by the full rules.  Every step must match the same descriptors, and the two must end in
the same state.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm._core.matching import Matcher, RecvRejected
from asynccomm._types import ANY_SOURCE, ANY_TAG

from .helpers import F4, I4, Envelope, RecvDescriptor

SOURCES = (0, 1, ANY_SOURCE)
TAGS = (0, 1, ANY_TAG)
SIZES = (0, 8, 16, 64)
CAPACITIES = (0, 8, 16, 64)

recvs = st.tuples(st.just("recv"), st.sampled_from(SOURCES), st.sampled_from(TAGS),
                  st.sampled_from(CAPACITIES), st.sampled_from((F4, I4)))
takes = st.tuples(st.just("take"), st.sampled_from(SOURCES), st.sampled_from(TAGS),
                  st.sampled_from(CAPACITIES), st.sampled_from((F4, I4)))
arrivals = st.tuples(st.just("arrive"), st.sampled_from((0, 1)), st.sampled_from((0, 1)),
                     st.sampled_from(SIZES), st.sampled_from((F4, I4)))
programs = st.lists(st.one_of(recvs, takes, arrivals), min_size=1, max_size=40)


def _name(d: Any) -> object:
    return None if d is None else d.handle


def _rejections(m: Matcher) -> list[tuple[object, object]]:
    out = []
    while (event := m.next_event()) is not None:
        assert isinstance(event, RecvRejected)
        out.append((_name(event.recv), _name(event.envelope), event.reason))
    return out


@settings(max_examples=300, deadline=None)
@given(program=programs)
def test_the_fast_lane_meets_what_the_full_rules_meet(program: list[tuple[Any, ...]]) -> None:
    fast, full = Matcher(), Matcher()
    for i, (op, source, tag, size, dtype) in enumerate(program):
        if op == "arrive":
            env_fast, env_full = (Envelope(source, tag, size, size // 4, dtype, i)
                                  for _ in range(2))
            want = _name(full.deliver(env_full))
            claimed = fast.claim_posted(source, tag, size, dtype)
            if claimed is False:  # the full rules decide
                assert _name(fast.deliver(env_fast)) == want
            elif claimed is None:  # no recv names it: it waits
                fast.enqueue(env_fast)
                assert want is None
            else:
                assert _name(claimed) == want
        else:
            recv_fast, recv_full = (RecvDescriptor(source, tag, size, dtype, i)
                                    for _ in range(2))
            want = _name(full.post_recv(recv_full))
            waiting = fast.waiting(source, tag) if op == "take" else None
            if waiting is not None and waiting.dtype == dtype and waiting.nbytes <= size:
                fast.take(waiting)  # what take_now does with what fits
                assert _name(waiting) == want
            else:
                assert _name(fast.post_recv(recv_fast)) == want
        assert _rejections(fast) == _rejections(full)
        assert fast.statistics() == full.statistics()
    assert [_name(d) for d in fast.posted_recvs()] == [_name(d) for d in full.posted_recvs()]
    assert [_name(d) for d in fast.unexpected()] == [_name(d) for d in full.unexpected()]
