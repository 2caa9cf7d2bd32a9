"""``Communicator.summary()`` and ``records()`` on every world: the flight recorder's totals
(measured), plus the cluster model's figures where there is one."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..sim.records import OpRecord, RankSummary, summarize
from .flight import DONE_C, KIND_NAMES

if TYPE_CHECKING:
    from .engine import DeviceEngine

__all__ = ["measured_records", "rank_summary"]


def rank_summary(engine: DeviceEngine) -> RankSummary:
    """The engine's rank's totals (see ``Communicator.summary``)."""
    ops, peers = engine.flight.totals()
    wait = sum(p.wait_time for p in peers)
    copy = sum(p.copy_time for p in peers)
    if engine.records is not None:
        modelled = summarize(engine.rank, engine.records,
                             link_busy=engine.link.busy_time(engine.rank))
        return dataclasses.replace(modelled, ops=ops, wait_time=wait, copy_time=copy,
                                   peers=tuple(peers))
    return RankSummary(
        rank=engine.rank, bytes_sent=sum(p.bytes_sent for p in peers),
        bytes_received=sum(p.bytes_received for p in peers),
        messages=sum(p.sends + p.recvs for p in peers), link_busy=0.0, compute_time=0.0,
        comm_time=wait + copy, hidden=0.0, hidden_fraction=0.0,
        span=engine.now() - engine.flight.origin, ops=ops, wait_time=wait, copy_time=copy,
        peers=tuple(peers), modelled=False)


def measured_records(engine: DeviceEngine) -> list[OpRecord]:
    """Records of the flight recorder's finished sends, recvs and computes (seconds since
    the world opened)."""
    origin = engine.flight.origin
    out = []
    for kind, peer, tag, nbytes, _sid, how, t_post, _t_match, t_fin in engine.flight.entries():
        if how != DONE_C or kind == 2:  # finished sends, recvs and computes, not probes
            continue
        start = (t_post if t_post >= 0 else t_fin) - origin
        out.append(OpRecord(rank=engine.rank, kind=KIND_NAMES[kind], peer=peer, tag=max(tag, 0),
                            nbytes=max(nbytes, 0), chunks=1, start=start,
                            end=max(t_fin - origin, start), mode="measured"))
    return out
