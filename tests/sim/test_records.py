"""Records and summaries: interval union and intersection, hidden fraction, the table."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm.sim import OpRecord, RankSummary, format_table, summarize


def rec(kind: str, start: float, end: float, nbytes: int = 0, rank: int = 0,
        peer: int = 1) -> OpRecord:
    return OpRecord(rank=rank, kind=kind, peer=peer, tag=0, nbytes=nbytes, chunks=1,
                    start=start, end=end, mode="compute" if kind == "compute" else "sync")


@pytest.mark.parametrize(("records", "expected"), [
    pytest.param([], {"messages": 0, "comm_time": 0, "compute_time": 0, "hidden": 0,
                      "hidden_fraction": 0, "span": 0}, id="nothing"),
    pytest.param([rec("send", 0, 2, 100), rec("send", 1, 3, 50)],
                 {"bytes_sent": 150, "messages": 2, "comm_time": 3, "compute_time": 0,
                  "hidden": 0, "hidden_fraction": 0, "span": 3},
                 id="overlapping-sends-count-once"),
    pytest.param([rec("send", 0, 4), rec("compute", 1, 2), rec("compute", 3, 6)],
                 {"comm_time": 4, "compute_time": 4, "hidden": 2, "hidden_fraction": 0.5,
                  "span": 6}, id="half-hidden"),
    pytest.param([rec("recv", 0, 1, 8), rec("send", 1, 2, 16), rec("compute", 0, 2)],
                 {"bytes_sent": 16, "bytes_received": 8, "comm_time": 2, "hidden": 2,
                  "hidden_fraction": 1}, id="touching-intervals-all-hidden"),
    pytest.param([rec("compute", 0, 3), rec("compute", 1, 2)],
                 {"messages": 0, "compute_time": 3, "hidden": 0, "hidden_fraction": 0,
                  "span": 3}, id="compute-only-nested"),
    pytest.param([rec("send", 5, 6), rec("send", 0, 1), rec("compute", 0.5, 5.5)],
                 {"comm_time": 2, "hidden": 1, "hidden_fraction": 0.5, "span": 6},
                 id="unsorted-input"),
    pytest.param([rec("send", 0, 10, rank=1), rec("compute", 0, 10, rank=2),
                  rec("recv", 2, 3, 4)],
                 {"messages": 1, "bytes_received": 4, "comm_time": 1, "hidden": 0, "span": 1},
                 id="other-ranks-ignored"),
    pytest.param([rec("send", 1, 1, 4), rec("compute", 0, 2)],
                 {"messages": 1, "comm_time": 0, "hidden": 0, "hidden_fraction": 0, "span": 2},
                 id="instant-send"),
])
def test_summarize(records: list[OpRecord], expected: dict[str, float]) -> None:
    summary = summarize(0, records, link_busy=0.25)
    assert summary.rank == 0 and summary.link_busy == 0.25
    for field, value in expected.items():
        assert getattr(summary, field) == pytest.approx(value), field


def test_summarize_takes_any_iterable() -> None:
    summary = summarize(0, (rec("send", 0, 1, 10) for _ in range(3)))
    assert (summary.messages, summary.bytes_sent, summary.comm_time) == (3, 30, 1.0)


def _cells(intervals: list[tuple[int, int]]) -> set[int]:
    return {t for start, end in intervals for t in range(start, end)}


spans = st.tuples(st.integers(0, 40), st.integers(0, 10)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=200, deadline=None)
@given(comm=st.lists(spans, max_size=12), compute=st.lists(spans, max_size=12))
def test_union_and_intersection_match_a_brute_force_count(
        comm: list[tuple[int, int]], compute: list[tuple[int, int]]) -> None:
    """Integer intervals: the measure of a union is the number of unit cells it covers."""
    records = [rec("send", s, e) for s, e in comm] + [rec("compute", s, e) for s, e in compute]
    summary = summarize(0, records)
    comm_cells, compute_cells = _cells(comm), _cells(compute)
    assert summary.comm_time == len(comm_cells)
    assert summary.compute_time == len(compute_cells)
    assert summary.hidden == len(comm_cells & compute_cells)
    assert 0.0 <= summary.hidden_fraction <= 1.0
    if not compute:
        assert summary.hidden_fraction == 0.0


def test_record_properties() -> None:
    r = rec("send", 1.0, 1.5, 1_000_000)
    assert (r.duration, r.bandwidth) == (0.5, 2_000_000.0)
    assert rec("send", 2.0, 2.0, 10).bandwidth == 0.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "put"}, "kind must be one of send, recv, compute; got 'put'"),
    ({"start": 2.0, "end": 1.0}, "end (1.0) is before start (2.0)"),
    ({"nbytes": -1}, "nbytes must be >= 0, got -1"),
])
def test_record_validation(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"rank": 0, "kind": "send", "peer": 1, "tag": 0, "nbytes": 1,
                                 "chunks": 1, "start": 0.0, "end": 1.0, "mode": "sync"}
    fields.update(kwargs)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        OpRecord(**fields)  # type: ignore[arg-type]


def test_format_table() -> None:
    rows = [
        RankSummary(rank=0, bytes_sent=12_500_000, bytes_received=0, messages=3,
                    link_busy=1.5e-3, compute_time=2.0, comm_time=0.0015, hidden=0.00075,
                    hidden_fraction=0.5, span=2.25),
        RankSummary(rank=11, bytes_sent=0, bytes_received=512, messages=1, link_busy=0.0,
                    compute_time=0.0, comm_time=4e-7, hidden=0.0, hidden_fraction=0.0,
                    span=4e-7),
    ]
    lines = format_table(rows).splitlines()
    assert len(lines) == 4
    assert lines[0].split() == ["rank", "sent", "received", "msgs", "link", "busy", "compute",
                                "comm", "hidden", "hidden", "%", "span"]
    assert set(lines[1]) == {"-", " "}
    assert lines[2].split() == ["0", "12.50", "MB", "0", "B", "3", "1.500", "ms", "2.000", "s",
                                "1.500", "ms", "750.000", "us", "50.0", "2.250", "s"]
    assert lines[3].split() == ["11", "0", "B", "512", "B", "1", "0", "0", "400", "ns", "0",
                                "0.0", "400", "ns"]
    assert len({len(line) for line in lines}) == 1  # columns aligned
    assert format_table([]).splitlines()[0].startswith("rank")
