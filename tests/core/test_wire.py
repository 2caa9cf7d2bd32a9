"""The wire protocol between processes, without MPI: two ``Wire`` endpoints joined by FIFO
channels that a test delivers message by message, in any interleaving (h11's
``ConnectionPair`` idea)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm._core import wire as w
from asynccomm._core.wire import (
    HEADER,
    Wire,
    charge,
    decode_dtype,
    encode_dtype,
    split_shape,
    with_shape,
)

DT = encode_dtype("|u1")


def eager(wire: Wire, dest: int, nbytes: int) -> bool:
    """Whether a message of ``nbytes`` goes eagerly (its credit then taken)."""
    return wire.eager_header(dest, 0, nbytes, nbytes, DT) is not None


@dataclass
class Pair:
    """Rank 0 and rank 1, and the messages in flight each way."""

    grant: int = 1 << 16
    inline_max: int = w.INLINE_MAX
    a: Wire = field(init=False)
    b: Wire = field(init=False)
    to_b: deque[bytes] = field(default_factory=deque)
    to_a: deque[bytes] = field(default_factory=deque)
    events: list[tuple[int, object]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.a = Wire(0, 2, inline_max=self.inline_max, credits=[self.grant] * 2,
                      grant=self.grant)
        self.b = Wire(1, 2, inline_max=self.inline_max, credits=[self.grant] * 2,
                      grant=self.grant)

    def wire(self, rank: int) -> Wire:
        return self.a if rank == 0 else self.b

    def post(self, src: int, out: list[tuple[int, bytes]]) -> None:
        for dest, msg in out:
            if dest != src:  # a rank's messages to itself are not modelled here
                (self.to_b if dest == 1 else self.to_a).append(msg)

    def deliver(self, dest: int) -> object:
        """Deliver the next message in flight to ``dest``; return its event."""
        queue = self.to_b if dest == 1 else self.to_a
        raw = queue.popleft()
        kind, dlen, src, tag, nbytes, count, ident, dfield = HEADER.unpack_from(raw)
        dtype = decode_dtype(dfield, dlen) if kind in (w.EAGER, w.RTS) else ""
        payload = raw[HEADER.size:] if kind in (w.CLOSE, w.DUMP) else b""
        event, out = self.wire(dest).receive(kind, src, tag, nbytes, count, ident, dtype,
                                             payload, w.data_tag_of(raw))
        self.post(dest, out)
        self.events.append((dest, event))
        return event

    def flush(self) -> list[tuple[int, object]]:
        start = len(self.events)
        while self.to_a or self.to_b:
            self.deliver(1 if self.to_b else 0)
        return self.events[start:]


def test_header_round_trips_and_keeps_payloads_aligned() -> None:
    assert HEADER.size % 8 == 0
    fields = (w.RTS, 3, 5, 2**31 - 1, 2**40, 2**37, 12345, b"<f8")
    kind, dlen, src, tag, nbytes, count, ident, dfield = HEADER.unpack(HEADER.pack(*fields))
    assert (kind, dlen, src, tag, nbytes, count, ident) == fields[:7]
    assert decode_dtype(dfield, dlen) == "<f8"


def test_message_kinds_are_distinct_and_named() -> None:
    kinds = [w.EAGER, w.RTS, w.CTS, w.WITHDRAW, w.WITHDRAWN, w.CREDIT, w.CLOSE, w.FIN,
             w.DUMP_ASK, w.DUMP, w.FT]
    assert len(set(kinds)) == len(kinds) and set(w.KIND_NAMES) == set(kinds)


@pytest.mark.parametrize("dtype", ["|u1", "<f4", "<c16", "|b1", ">i8", "<M8[ns]", "|S10"])
def test_every_travelling_dtype_name_fits_the_header(dtype: str) -> None:
    name = np.dtype(dtype).str
    field_ = encode_dtype(name)
    padded = HEADER.unpack(HEADER.pack(1, len(field_), 0, 0, 0, 0, 0, field_))[7]
    assert decode_dtype(padded, len(field_)) == name


def test_a_dtype_name_too_long_for_the_header_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than 48 bytes"):
        encode_dtype("<" + "x" * 50)


@pytest.mark.parametrize("shape", [None, (), (3, 4), (0, 5), (2, 1, 7, 1), (1 << 40, 3)])
def test_shapes_travel_in_the_dtype_field(shape: tuple[int, ...] | None) -> None:
    text = with_shape("<f8", shape)
    field_ = encode_dtype(text)
    padded = HEADER.unpack(HEADER.pack(1, len(field_), 0, 0, 0, 0, 0, field_))[7]
    back = decode_dtype(padded, len(field_))
    assert (split_shape(back) if ";" in back else (back, None)) == ("<f8", shape)


def test_a_shape_too_long_for_the_header_travels_flat() -> None:
    assert with_shape("<f8", (10**9,) * 6) == "<f8"


# -- eager and credit ----------------------------------------------------------------------------


def test_eager_takes_credit_and_falls_back_to_rendezvous_without_it() -> None:
    pair = Pair(grant=3 * charge(100))
    assert [eager(pair.a, 1, 100) for _ in range(4)] == [True, True, True, False]
    assert pair.a.credit[1] == 0
    assert not eager(pair.a, 1, w.INLINE_MAX + 1)  # too large for eager, whatever the credit


@settings(max_examples=200, deadline=None)
@given(nbytes=st.integers(0, 2 * w.INLINE_MAX), credit=st.integers(0, 3 * w.INLINE_MAX))
def test_eager_header_takes_the_charge_and_packs_the_header(nbytes: int, credit: int) -> None:
    one = Wire(0, 2, inline_max=w.INLINE_MAX, credits=[credit, credit], grant=1 << 30)
    header = one.eager_header(1, 9, nbytes, nbytes, DT)
    if nbytes <= w.INLINE_MAX and charge(nbytes) <= credit:
        assert header == HEADER.pack(w.EAGER, len(DT), 0, 9, nbytes, nbytes, 0, DT)
        assert one.credit == [credit, credit - charge(nbytes)]
    else:
        assert header is None
        assert one.credit == [credit, credit]
    one.consumed(1, nbytes)
    assert one._owed == [0, charge(nbytes)]


def test_even_empty_messages_cost_credit() -> None:
    pair = Pair(grant=10 * charge(0))
    assert sum(eager(pair.a, 1, 0) for _ in range(1000)) == 10


def test_consumed_messages_return_their_credit_in_batches() -> None:
    pair = Pair(grant=8 * charge(8))
    for _ in range(8):
        assert eager(pair.a, 1, 8)
    assert not eager(pair.a, 1, 8)
    out = [pair.b.consumed(0, 8) for _ in range(8)]
    sent = [msg for msg in out if msg is not None]
    assert len(sent) == 4  # a quarter of the grant at a time
    pair.post(1, [(0, msg) for msg in sent])
    pair.flush()
    assert pair.a.credit[1] == 8 * charge(8)


# -- rendezvous and withdrawal ----------------------------------------------------------------


def announce(pair: Pair, nbytes: int = 1 << 20, *, early: bool = False) -> int:
    ident, msg = pair.a.announce(1, 7, nbytes, nbytes, DT, early=early)
    pair.post(0, [(1, msg)])
    return ident


def test_an_early_announcement_names_its_data_tag_and_the_match_uses_it() -> None:
    pair = Pair()
    ident = announce(pair, early=True)
    data_tag = pair.a.early[ident]
    assert data_tag > pair.a.data_tag_ub // 2  # the senders' half of the tag space
    assert w.data_tag_of(pair.to_b[0]) == data_tag
    (_, event), = pair.flush()
    assert event == w.Announced(0, 7, 1 << 20, 1 << 20, "|u1", ident)
    assert pair.b.early_in == {(0, ident): (data_tag, 1 << 20)}
    tag, cts = pair.b.clear_to_send(0, ident)
    assert tag == data_tag and not pair.b.early_in
    assert pair.b.clear_to_send(0, 99)[0] <= pair.b.data_tag_ub // 2  # (the receiver's half)
    pair.post(1, [(0, cts)])
    assert pair.flush() == [(0, w.ClearToSend(1, ident, tag))]
    assert pair.a.early == {} and pair.a.early_tags == set()  # answered: the tag is free


def test_an_early_message_withdrawn_or_dropped_unmatched_is_drained() -> None:
    pair = Pair()
    first, second, third = (announce(pair, early=True) for _ in range(3))
    tags = dict(pair.a.early)
    pair.flush()
    verdict, ask = pair.a.withdraw(first)
    assert verdict == w.ASKED
    pair.post(0, [(1, ask)])  # type: ignore[list-item]
    assert pair.flush() == [(1, w.WithdrawRequested(0, first, tags[first], 1 << 20)),
                            (0, w.WithdrawAnswered(1, first))]
    # The receiver closes: what it drops unmatched it drains, and so what lands later.
    assert pair.b.drop_early() == [(0, tags[second], 1 << 20), (0, tags[third], 1 << 20)]
    pair.post(1, pair.b.close("has closed its communicator"))
    fourth = announce(pair, 1 << 19, early=True)
    late = pair.a.early[fourth]
    pair.flush()
    assert (1, w.Drain(0, late, 1 << 19)) in pair.events
    assert pair.a.early == {} and pair.a.early_tags == set()  # every message answered


def test_an_early_data_tag_is_not_reused_until_its_message_is_answered() -> None:
    pair = Pair()
    pair.a.data_tag_ub = 9  # the senders' half: 5..9
    idents = [announce(pair, early=True) for _ in range(5)]
    assert sorted(pair.a.early.values()) == [5, 6, 7, 8, 9]
    # Every early tag held: the next goes as any other (its data on the CTS's tag).
    plain, rts = pair.a.announce(1, 7, 1 << 20, 1 << 20, DT, early=True)
    assert plain not in pair.a.early and w.data_tag_of(rts) == 0
    assert sorted(pair.a.early.values()) == [5, 6, 7, 8, 9]
    pair.post(0, [(1, rts)])
    pair.flush()
    tag, cts = pair.b.clear_to_send(0, idents[2])
    pair.post(1, [(0, cts)])
    pair.flush()
    assert pair.a.early[announce(pair, early=True)] == tag


def test_rendezvous_clear_to_send_names_the_data_tag() -> None:
    pair = Pair()
    ident = announce(pair)
    (_, event), = pair.flush()
    assert event == w.Announced(0, 7, 1 << 20, 1 << 20, "|u1", ident)
    tag, cts = pair.b.clear_to_send(0, ident)
    pair.post(1, [(0, cts)])
    assert pair.flush() == [(0, w.ClearToSend(1, ident, tag))]
    assert pair.a.state_of(ident) == "settled"


def test_a_withdrawal_before_the_match_wins() -> None:
    pair = Pair()
    ident = announce(pair)
    pair.deliver(1)
    verdict, msg = pair.a.withdraw(ident)
    assert verdict == w.ASKED and pair.a.state_of(ident) == "withdrawing"
    pair.post(0, [(1, msg)])  # type: ignore[list-item]
    events = pair.flush()
    assert events == [(1, w.WithdrawRequested(0, ident)), (0, w.WithdrawAnswered(1, ident))]
    assert not pair.b.unmatched


def test_a_withdrawal_that_crosses_the_clear_to_send_loses_and_the_send_completes() -> None:
    pair = Pair()
    ident = announce(pair)
    pair.deliver(1)
    tag, cts = pair.b.clear_to_send(0, ident)  # the receiver commits ...
    pair.post(1, [(0, cts)])
    verdict, msg = pair.a.withdraw(ident)  # ... while the sender asks for it back
    assert verdict == w.ASKED
    pair.post(0, [(1, msg)])  # type: ignore[list-item]
    events = pair.flush()
    assert (0, w.ClearToSend(1, ident, tag)) in events
    assert not any(isinstance(e, w.WithdrawAnswered | w.WithdrawRequested) for _, e in events)


def test_plain_cancel_does_not_ask_and_reports_too_late() -> None:
    pair = Pair()
    ident = announce(pair)
    assert pair.a.withdraw(ident, ask=False) == (w.TOO_LATE, None)
    assert pair.a.state_of(ident) == "announced"


def test_withdrawing_from_a_closed_receiver_is_immediate() -> None:
    pair = Pair()
    ident = announce(pair)
    pair.deliver(1)
    pair.post(1, pair.b.close("has closed its communicator"))
    pair.flush()
    assert pair.a.withdraw(ident) == (w.TOO_LATE, None)  # its CLOSE already failed it


def test_a_close_fails_announced_messages_and_ends_withdrawals() -> None:
    pair = Pair()
    first, second = announce(pair), announce(pair)
    pair.flush()
    verdict, msg = pair.a.withdraw(second)
    pair.post(1, pair.b.close("failed with ValueError: boom"))  # crosses the WITHDRAW
    pair.post(0, [(1, msg)])  # type: ignore[list-item]
    events = pair.flush()
    closed = [e for _, e in events if isinstance(e, w.PeerClosed)]
    assert closed == [w.PeerClosed(1, "failed with ValueError: boom", (first,), (second,))]
    assert not any(isinstance(e, w.WithdrawAnswered) for _, e in events)


def test_closing_ends_with_fin_both_ways() -> None:
    pair = Pair()
    pair.post(0, pair.a.close("done"))
    pair.flush()
    assert not pair.a.finished and not pair.b.finished
    pair.post(1, pair.b.close("done"))
    pair.flush()
    # Each rank's CLOSE to itself is not modelled by Pair: deliver it by hand.
    for rank in (0, 1):
        wire = pair.wire(rank)
        wire.receive(w.CLOSE, rank, 0, 0, 0, 0, "", b"done")
        wire.receive(w.FIN, rank, 0, 0, 0, 0, "", b"")
    assert pair.a.finished and pair.b.finished


# -- every interleaving ------------------------------------------------------------------------


ACTIONS = st.lists(st.sampled_from(["announce", "early", "eager", "withdraw", "match", "to_a",
                                    "to_b", "consume"]), max_size=60)


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(actions=ACTIONS, picks=st.lists(st.integers(0, 50), min_size=60, max_size=60))
def test_every_message_ends_once_and_both_sides_agree(actions: list[str],
                                                      picks: list[int]) -> None:
    """Sends, withdrawals, matches and deliveries in any order: each announced message ends
    exactly once, as delivered (``ClearToSend`` at the sender, committed at the receiver)
    or withdrawn (answered at the sender, dropped at the receiver), never both; an early
    one's data is received once, on its tag (matched) or drained (withdrawn), and no two
    unanswered early messages share a data tag; and credit never lets the receiver stage
    more than it granted."""
    pair = Pair(grant=4 * charge(64))
    announced: list[int] = []
    at_b: list[int] = []  # announcements rank 1 has seen and not matched
    committed: set[int] = set()
    early: dict[int, int] = {}  # early messages' data tags
    taken: dict[int, list[int]] = {}  # the tags their data was received (or drained) on
    staged = 0
    for action, pick in zip(actions, picks, strict=False):
        if action in ("announce", "early"):
            announced.append(announce(pair, early=action == "early"))
            if action == "early":
                early[announced[-1]] = pair.a.early[announced[-1]]
        elif action == "eager" and (header := pair.a.eager_header(1, 7, 64, 64, DT)):
            pair.post(0, [(1, header + bytes(64))])
        elif action == "withdraw" and announced:
            verdict, msg = pair.a.withdraw(announced[pick % len(announced)])
            if msg is not None:
                pair.post(0, [(1, msg)])
        elif action == "match" and at_b:
            ident = at_b.pop(pick % len(at_b))
            committed.add(ident)
            tag, cts = pair.b.clear_to_send(0, ident)
            if ident in early:
                taken.setdefault(ident, []).append(tag)
            pair.post(1, [(0, cts)])
        elif action == "consume" and staged:
            staged -= 1
            credit = pair.b.consumed(0, 64)
            if credit is not None:
                pair.post(1, [(0, credit)])
        elif action in ("to_a", "to_b") and (pair.to_a if action == "to_a" else pair.to_b):
            event = pair.deliver(0 if action == "to_a" else 1)
            if isinstance(event, w.Announced):
                at_b.append(event.ident)
            elif isinstance(event, w.WithdrawRequested):
                at_b.remove(event.ident)
                if event.data_tag:
                    taken.setdefault(event.ident, []).append(event.data_tag)
            elif isinstance(event, w.Eager):
                staged += 1
                assert staged * charge(64) <= pair.grant
        live = list(pair.a.early.values())
        assert len(set(live)) == len(live) and set(live) == pair.a.early_tags
    for rank, event in pair.flush():
        if rank == 1 and isinstance(event, w.Announced):
            at_b.append(event.ident)
        elif rank == 1 and isinstance(event, w.WithdrawRequested):
            at_b.remove(event.ident)
            if event.data_tag:
                taken.setdefault(event.ident, []).append(event.data_tag)
    ends: dict[int, list[str]] = {}
    for rank, event in pair.events:
        if rank == 0 and isinstance(event, w.ClearToSend):
            ends.setdefault(event.ident, []).append("delivered")
        elif rank == 0 and isinstance(event, w.WithdrawAnswered):
            ends.setdefault(event.ident, []).append("withdrawn")
    for ident in announced:
        state = pair.a.state_of(ident)
        if ident in committed:
            assert ends.get(ident) == ["delivered"], (ident, ends.get(ident))
        elif state == "settled":
            assert ends.get(ident) == ["withdrawn"], (ident, ends.get(ident))
        else:  # still waiting for a match (or for its withdrawal to be answered)
            assert ident not in ends and ident in at_b
        if ident in early:  # its data: received once on its tag, or not yet
            assert taken.get(ident, []) == ([early[ident]] if ident not in at_b else [])
        else:
            assert ident not in taken


def test_backoff_spins_after_activity_then_doubles_to_its_cap() -> None:
    from asynccomm.transports._mpi_lib import Backoff

    backoff = Backoff(tmax=1e-3, spin=5e-3)
    backoff.reset(now=10.0)
    assert [backoff.delay(now) for now in (10.0, 10.001, 10.0049)] == [0.0, 0.0, 0.0]
    delays = [backoff.delay(now=10.006) for _ in range(14)]
    assert delays[0] == 0.0
    assert delays[1] == pytest.approx(1e-3 / 1024)
    assert all(b == pytest.approx(2 * a) or b == pytest.approx(1e-3)
               for a, b in zip(delays[1:], delays[2:], strict=False))
    assert delays[-1] == pytest.approx(1e-3) and max(delays) <= 1e-3


def test_a_hang_report_asks_a_peer_and_gets_its_text_without_touching_other_state() -> None:
    pair = Pair()
    pair.post(0, [(1, pair.a.ask_dump())])
    assert pair.deliver(1) == w.DumpAsked(0)
    text = "rank 1: 1 pending op(s)\n  pending  recv src=0 tag=2 \u00b5"
    pair.post(1, [(0, pair.b.dump(text))])
    assert pair.deliver(0) == w.Dumped(1, text)
    assert pair.a.credit == pair.b.credit and not pair.a.closed_by and not pair.b.closed_by
    long = pair.b.dump("x" * (w.INLINE_MAX + 10))
    assert len(long) == HEADER.size + w.INLINE_MAX  # cut to what travels inline
