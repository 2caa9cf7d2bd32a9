"""The flight recorder: the last N ops of each rank, always on, and summaries on every world."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asynccomm as ac

KEYS = {"rank", "op", "peer", "tag", "nbytes", "stream", "state", "post", "match", "finish"}
#: Bounds each wait for a message in these tests.
LIMIT = 10.0


def _exchange(n: int, nbytes: int = 8):  # type: ignore[no-untyped-def]
    async def main(comm: ac.Communicator) -> list[dict[str, Any]]:
        buf = np.zeros(nbytes // 8)
        for i in range(n):
            if comm.rank == 0:
                await comm.send(buf, 1, tag=i % 3)
            else:
                await comm.recv(buf, 0, tag=i % 3)
        return comm.flight_record()
    return main


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_every_op_is_recorded_with_its_times(loop: str) -> None:
    sender, receiver = ac.run(_exchange(5), 2, loop=loop)
    assert [d["op"] for d in sender] == ["send"] * 5
    assert [d["op"] for d in receiver] == ["recv"] * 5
    for d in sender + receiver:
        assert set(d) == KEYS
        assert d["state"] == "done" and d["nbytes"] == 8 and d["stream"] == 0
        assert 0 <= d["post"] <= d["finish"]
    assert [d["tag"] for d in receiver] == [0, 1, 2, 0, 1]
    assert all(d["peer"] == 1 for d in sender) and all(d["peer"] == 0 for d in receiver)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_recv_into_a_larger_buffer_records_what_arrived(loop: str) -> None:
    async def main(comm: ac.Communicator) -> tuple[list[dict[str, Any]], ac.sim.RankSummary]:
        if comm.rank == 0:
            for tag in range(4):
                await comm.send(np.ones(2), 1, tag)
            await comm.recv(np.zeros(1), 1, 9)
            return [], comm.summary()
        await comm.recv(np.zeros(2), 0, 0)  # tag 0 arrived: 1 to 3 are staged here too
        room = np.zeros(1000)
        await comm.irecv(room, 0, 1)  # each way a staged message is taken at once
        await comm.recv(room, 0, 2)
        await comm.irecv(room, 0, 3, count=1000)
        await comm.send(np.zeros(1), 0, 9)
        return comm.flight_record(), comm.summary()

    _, (record, summary) = ac.run(main, 2, loop=loop)
    assert [(d["tag"], d["nbytes"]) for d in record if d["op"] == "recv"] == [
        (0, 16), (1, 16), (2, 16), (3, 16)]
    assert summary.bytes_received == 4 * 16


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_wildcard_recv_records_who_sent_what(loop: str) -> None:
    async def main(comm: ac.Communicator) -> tuple[list[dict[str, Any]], ac.sim.RankSummary]:
        if comm.rank:
            await comm.send(np.ones(comm.rank), 0, 10 + comm.rank)
            await comm.recv(np.zeros(1), 0, 9)  # rank 0 has posted its next recvs
            await comm.send(np.ones(comm.rank), 0, 20 + comm.rank)
            return [], comm.summary()
        got = np.zeros(4)
        await comm.recv(got, 1, 11)
        await comm.probe(2, 12, timeout=LIMIT)  # rank 2's first message waits here
        first = await comm.recv(got, ac.ANY_SOURCE, ac.ANY_TAG)  # taken at once
        late = [comm.irecv(np.zeros(4), ac.ANY_SOURCE, ac.ANY_TAG) for _ in range(2)]
        for peer in (1, 2):
            await comm.send(np.zeros(1), peer, 9)
        await ac.wait_all(late)  # each completed by an arriving message
        assert (first.source, first.tag) == (2, 12)
        return comm.flight_record(), comm.summary()

    (record, summary), *_ = ac.run(main, 3, loop=loop)
    recvs = [(d["peer"], d["tag"], d["nbytes"]) for d in record if d["op"] == "recv"]
    assert recvs[:2] == [(1, 11, 8), (2, 12, 16)]
    assert sorted(recvs[2:]) == [(1, 21, 8), (2, 22, 16)]
    per_peer = {p.peer: (p.recvs, p.bytes_received) for p in summary.peers}
    assert per_peer == {1: (2, 16), 2: (2, 32)}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("posted_first", [True, False])
def test_a_large_copy_on_the_fast_lane_counts_as_copy_time(loop: str,
                                                           posted_first: bool) -> None:
    """A payload of 256 KiB copied where the recv meets it: from match to finish is the
    copy (the summary's copy_time), as on the general path."""
    async def main(comm: ac.Communicator) -> ac.sim.RankSummary:
        big = np.ones(32 << 10)  # 256 KiB: over the eager limit, under a thread's copy
        if comm.rank == 0:
            if not posted_first:
                await comm.recv(np.zeros(1), 1, 9)
            await comm.send(big, 1, 1)
            return comm.summary()
        if not posted_first:
            await comm.send(np.zeros(1), 0, 9)
            await comm.probe(0, 1, timeout=LIMIT)  # it waits here: the recv takes it
        await comm.recv(big, 0, 1)
        return comm.summary()

    _, summary = ac.run(main, 2, loop=loop)
    assert summary.bytes_received == 256 << 10
    assert summary.copy_time > 0


def test_the_record_keeps_the_last_n_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCOMM_FLIGHT", "100")
    sender, receiver = ac.run(_exchange(1000), 2)
    assert len(sender) == len(receiver) == 100
    assert [d["tag"] for d in sender[-3:]] == [997 % 3, 998 % 3, 999 % 3]


def test_a_bad_flight_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCOMM_FLIGHT", "many")
    with pytest.raises(ValueError, match="ASYNCCOMM_FLIGHT"):
        ac.run(_exchange(1), 2)


def test_outcomes_and_pending_ops_on_the_virtual_clock() -> None:
    async def main(comm: ac.Communicator) -> list[dict[str, Any]]:
        if comm.rank == 1:
            await comm.compute(seconds=10)  # stays open meanwhile
            return []
        with pytest.raises(ac.CommTimeoutError):
            await comm.recv(np.zeros(1), 1, tag=1, timeout=2.0)
        req = comm.irecv(np.zeros(1), 1, tag=2)
        req.cancel()
        pending = comm.irecv(np.zeros(1), 1, tag=3)
        record = comm.flight_record()
        pending.cancel()
        return record

    record = ac.run(main, 2, clock="virtual")[0]
    assert [(d["tag"], d["state"]) for d in record] == [
        (1, "timed out"), (2, "cancelled"), (3, "posted")]
    assert record[0]["post"] == 0.0 and record[0]["finish"] == 2.0  # model seconds
    assert record[2]["finish"] is None


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_summary_and_records_on_a_plain_world(loop: str) -> None:
    async def main(comm: ac.Communicator) -> tuple[ac.sim.RankSummary, list[ac.sim.OpRecord]]:
        big = np.zeros(ac.EAGER_LIMIT)  # 8x the limit: rendezvous
        if comm.rank == 0:
            await comm.send(big, 1)
            await comm.send(np.zeros(1), 1)
        else:
            req = comm.irecv(big, 0)
            await req
            assert req.record is not None and req.record.mode == "measured"
            await comm.recv(np.zeros(1), 0)
        return comm.summary(), comm.records()

    (s0, r0), (s1, r1) = ac.run(main, 2, loop=loop)
    assert s0.bytes_sent == s1.bytes_received == ac.EAGER_LIMIT * 8 + 8
    assert s0.messages == s1.messages == 2 and s1.ops == 2
    assert s1.wait_time >= 0 and s1.copy_time > 0 and not s1.modelled
    assert [r.kind for r in r0] == ["send", "send"] and [r.nbytes for r in r1] == [
        ac.EAGER_LIMIT * 8, 8]


def test_summary_on_a_cluster_world_keeps_the_modelled_figures() -> None:
    async def main(comm: ac.Communicator) -> ac.sim.RankSummary:
        buf = np.zeros(1 << 20, np.uint8)
        if comm.rank == 0:
            await comm.send(buf, 1)
        else:
            await comm.recv(buf, 0)
        return comm.summary()

    s0, s1 = ac.run(main, 2, cluster=ac.Cluster.preset("roce100g"))
    assert s0.modelled and s0.link_busy > 0 and s0.bytes_sent == 1 << 20
    assert s1.peers[0].recvs == 1 and s1.copy_time > 0


async def test_flight_record_inside_open_world() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        c0.isend(np.arange(4.0), 1, tag=7)
        out = np.zeros(4)
        await asyncio.wait_for(c1.recv(out, 0, 7), 5)
        assert c1.flight_record()[-1]["tag"] == 7
        assert c0.flight_record()[-1]["op"] == "send"
